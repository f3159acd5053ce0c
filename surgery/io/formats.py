"""The two containers of weights as data: one :class:`Format` per :class:`~surgery.model.enums.Container`,
carrying what used to be decided by ``if format == "safetensors"`` branches (file and shard names, the
index, how headers are read, how arrays and byte ranges are found, how a file is written and read back,
what the dtype labels can say).

``FORMATS[ckpt.format]`` (or :func:`format_of`) gives a checkpoint's; ``convert`` and ``merge`` pick the
target's from their :class:`~surgery.model.enums.Container`.

Sources: the file names are those ``save_pretrained`` writes (PaddleFormers 1.2 / PaddleNLP 2.8.1:
``model.safetensors``, ``model-00001-of-00002.safetensors`` with ``model.safetensors.index.json``;
``model_state.pdparams``, ``model_state-00001-of-00002.pdparams`` with ``model_state.pdparams.index.json``).
PaddleFormers writes the safetensors index even for one shard; a single ``model_state.pdparams`` has
none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..model.enums import Container
from ..model.tensor import TensorInfo
from . import pdparams, readback, safetensors_io
from .safetensors_io import Source

if TYPE_CHECKING:
    import numpy as np
else:
    from ..model.lazy import numpy as np

# PaddleFormers' and PaddleNLP's ``save_pretrained(max_shard_size="10GB")``; "GB" is 10**9 bytes there
# (``convert_file_size_to_int``), "GiB" 2**30.
DEFAULT_MAX_SHARD_SIZE = 10 * 10**9


@dataclass(frozen=True)
class Header:
    """One weight file's header, whichever the container: the tensors in file order, and what else the
    file holds (``metadata``: a safetensors ``__metadata__``; ``extras`` and ``np_module``: a
    ``.pdparams``'s non-tensor entries and the numpy module its arrays were pickled with)."""

    tensors: list[TensorInfo]
    metadata: dict[str, str] | None = None
    extras: dict[str, Any] | None = None
    np_module: str | None = None


def _st_header(path: Path, rel: str, blob: tuple[int, int, bytes] | None = None) -> Header:
    infos, meta = safetensors_io.read_header(path, rel, blob)
    return Header(infos, metadata=meta)


def _pd_header(path: Path, rel: str, blob: tuple[int, int, bytes] | None = None) -> Header:
    infos, extras, module = pdparams.read_header(path, rel)
    return Header(infos, extras=extras, np_module=module)


def _st_source(path: Path, t: TensorInfo) -> Source:
    return Source(path, t.offset, t.nbytes)


@dataclass(frozen=True)
class Format:
    """What one container decides.

    Attributes:
        container: which container this is (a ``str`` enum: ``"safetensors"`` / ``"pdparams"``).
        ext: the weight files' extension (``.safetensors``).
        stem: the stem of the whole-model file and of shards (``model``, ``model_state``).
        single: the whole-model file of an unsharded checkpoint (``model.safetensors``).
        index: the index file (``model.safetensors.index.json``).
        index_for_one: whether ``save_pretrained`` writes an index for a single shard (safetensors does:
            ``model-00001-of-00001.safetensors`` + index; a ``.pdparams`` is then ``model_state.pdparams``).
        bf16_bits: U16 / uint16 tensors always hold bfloat16 bits (a ``.pdparams``: numpy has no bf16, so
            paddle pickles it as uint16); for safetensors the config decides (``Checkpoint.bf16_as_u16``).
        bf16_label: the container has a ``BF16`` dtype label, so rewritten U16 tensors holding bf16 bits
            can be relabelled (a ``.pdparams`` stores numpy names: ``BF16`` is written as ``uint16``).
        has_metadata: the files carry a ``__metadata__`` string map (layout evidence ``format: np/pt``, a
            ``{dropped: kept}`` record of tied copies).
        read_header: ``(path, rel, blob=None) -> Header``: one file's header, no tensor data (``blob``: a
            safetensors header already fetched, :func:`~surgery.io.safetensors_io.fetch_headers`).
        read_array: ``(path, t) -> ndarray``: one tensor's raw stored array (bf16 as uint16 bits).
        source: ``(path, t) -> Source``: where the stored bytes of ``t`` are, for a byte-range copy.
        write_file: the container's writer, in its own signature (for the writer):
            :func:`surgery.io.safetensors_io.write_file` ``(path, rows of (name, label, shape, Source),
            metadata)`` or :func:`surgery.io.pdparams.write_file` ``(path, rows of (name, numpy name,
            shape, Source, storage, fortran), extras)``.
        check_file: the read-back of a written file, in its own signature:
            :func:`surgery.io.readback.check_safetensors` ``(path, planned, metadata)`` or
            :func:`surgery.io.readback.check_pdparams` ``(path, planned)``.
    """

    container: Container
    ext: str
    stem: str
    index_for_one: bool
    bf16_bits: bool
    bf16_label: bool
    has_metadata: bool
    read_header: Callable[..., Header]
    read_array: Callable[[Path, TensorInfo], np.ndarray]
    source: Callable[[Path, TensorInfo], Source]
    write_file: Callable[..., Any]
    check_file: Callable[..., None]

    @property
    def single(self) -> str:
        return f"{self.stem}{self.ext}"

    @property
    def index(self) -> str:
        return f"{self.stem}{self.ext}.index.json"

    def shard_name(self, k: int, n: int) -> str:
        """Shard ``k`` of ``n`` (1-based): ``model-00001-of-00002.safetensors``."""
        return f"{self.stem}-{k:05d}-of-{n:05d}{self.ext}"

    def shard_names(self, n: int) -> list[str]:
        """The weight file names ``save_pretrained`` gives ``n`` shards (one ``.pdparams`` is
        :attr:`single`; one safetensors shard keeps its ``-of-00001`` name, beside an index)."""
        if n == 1 and not self.index_for_one:
            return [self.single]
        return [self.shard_name(k, n) for k in range(1, n + 1)]

    def index_name(self, n: int) -> str | None:
        """The index file name for ``n`` shards, or None when none is written."""
        return self.index if n > 1 or self.index_for_one else None

    def row_dtype(self, t: TensorInfo) -> np.dtype:
        """The little-endian numpy dtype of ``t``'s stored elements (a ``.pdparams`` records numpy names;
        a safetensors label maps to its storage dtype)."""
        return np.dtype(t.dtype).newbyteorder("<") if not self.bf16_label else t.storage_dtype


SAFETENSORS = Format(
    container=Container.SAFETENSORS,
    ext=".safetensors",
    stem="model",
    index_for_one=True,
    bf16_bits=False,
    bf16_label=True,
    has_metadata=True,
    read_header=_st_header,
    read_array=safetensors_io.read_array,
    source=_st_source,
    write_file=safetensors_io.write_file,
    check_file=readback.check_safetensors,
)
PDPARAMS = Format(
    container=Container.PDPARAMS,
    ext=".pdparams",
    stem="model_state",
    index_for_one=False,
    bf16_bits=True,
    bf16_label=False,
    has_metadata=False,
    read_header=_pd_header,
    read_array=pdparams.read_array,
    source=pdparams.raw_bytes_source,
    write_file=pdparams.write_file,
    check_file=readback.check_pdparams,
)
FORMATS: dict[Container, Format] = {f.container: f for f in (SAFETENSORS, PDPARAMS)}
"""Each container's :class:`Format`."""


def format_of(container: Container | str) -> Format:
    """The :class:`Format` of ``container`` (a :class:`~surgery.model.enums.Container` or its string).

    Raises:
        ValueError: not a container.
    """
    return FORMATS[Container(container)]


def other(fmt: Format) -> Format:
    """The other container's :class:`Format` (weights of it beside a checkpoint are left out)."""
    return PDPARAMS if fmt is SAFETENSORS else SAFETENSORS
