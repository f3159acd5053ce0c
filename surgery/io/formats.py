"""The formats of the files tietool writes, as data, each written and read back through one signature:

* :class:`FileFormat`: ``write(path, entries, metadata) -> int`` and ``check(path, planned, metadata)``,
  the same for every file of tensors: :data:`SAFETENSORS`, :data:`PDPARAMS` (also a flex ``.distcp``: a
  ``paddle.save`` pickle of ``{key: ndarray}``), :data:`PDOPT` (an ``optimizer.pdopt``) and a flex
  ``.metadata`` (:data:`surgery.io.flex_write.FLEX_METADATA`). ``entries`` are :class:`Row` values in data
  order (their bytes streamed from their :class:`~surgery.io.safetensors_io.Source`, a
  :class:`~surgery.io.made.Made` one made only then); ``planned`` the
  :class:`~surgery.io.readback.Planned` tensors the read-back expects; ``metadata`` what the file holds
  besides its tensors (the format's own kind, named on each). The layout of a file is computed before
  anything is streamed (safetensors' ``prepare`` then ``serialize``), so a writer never branches on the
  container: it asks the format.
* :class:`Format`: one per weights :class:`~surgery.model.enums.Container`, a :class:`FileFormat` that
  also carries what used to be decided by ``if format == "safetensors"`` branches (file and shard names,
  the index, how headers are read, how arrays and byte ranges are found, what the dtype labels can say).

``FORMATS[ckpt.format]`` (or :func:`format_of`) gives a checkpoint's; ``convert`` and ``merge`` pick the
target's from their :class:`~surgery.model.enums.Container`.

Sources: the file names are those ``save_pretrained`` writes (PaddleFormers 1.2 / PaddleNLP 2.8.1:
``model.safetensors``, ``model-00001-of-00002.safetensors`` with ``model.safetensors.index.json``;
``model_state.pdparams``, ``model_state-00001-of-00002.pdparams`` with ``model_state.pdparams.index.json``).
PaddleFormers writes the safetensors index even for one shard; a single ``model_state.pdparams`` has
none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from ..model.enums import Container
from ..model.tensor import TensorInfo, pdparams_name
from . import pdparams, readback, safetensors_io
from .readback import Planned
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


class Row(NamedTuple):
    """One tensor of a file to write, in data order (a tuple: one per tensor, millions in a hostile header).

    Attributes:
        name: the key (an optimizer file's master weights ``"master_weights/" + key``: :data:`MASTER`).
        dtype: the file's own dtype name: a safetensors label (``BF16``), or the numpy name a pickle stores
            (``uint16``; :meth:`Format.file_dtype` gives it).
        shape: as written.
        source: where its bytes come from; its ``nbytes`` is known before they are made.
        storage: a pickle's storage key: rows with one non-None key are one array, written once (aliases).
        fortran: the bytes are in Fortran order (a pickle records it).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: Source
    storage: object = None
    fortran: bool = False


class Rows(Sequence[Row]):
    """The :class:`Row` of each of ``items``, made by ``row`` each time it is read: a file of millions of
    tensors never holds a row (nor a source) per tensor at once, and a format that reads its entries twice
    (safetensors: the header, then the bytes) makes each row's source twice, its bytes once."""

    __slots__ = ("_items", "_row")

    def __init__(self, items: Sequence[Any], row: Callable[[Any], Row]) -> None:
        self._items, self._row = items, row

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> Row: ...
    @overload
    def __getitem__(self, i: slice) -> list[Row]: ...
    def __getitem__(self, i: int | slice) -> Row | list[Row]:
        if isinstance(i, slice):
            return [self._row(x) for x in self._items[i]]
        return self._row(self._items[i])

    def __iter__(self) -> Iterator[Row]:
        return (self._row(x) for x in self._items)


@dataclass(frozen=True)
class PickleMeta:
    """What a Paddle pickle (``.pdparams``, ``.distcp``, ``.pdopt``) holds besides its tensors.

    Attributes:
        extras: its non-tensor entries, written after the arrays in order (``StructuredToParameterName@@``;
            an optimizer's ``LR_Scheduler``, and ``master_weights`` as None: the master rows go there).
        np_module: the module of numpy's ``_reconstruct`` the arrays are pickled with.
        names: an optimizer file's keys written as ``paddle.save`` writes a Tensor, ``(name, array)``.
    """

    extras: dict[str, Any] = field(default_factory=dict)
    np_module: str = "numpy.core.multiarray"
    names: dict[str, str] = field(default_factory=dict)


MASTER = "master_weights/"
"""The prefix of an optimizer file's master weights among its :class:`Row` and planned names."""


@dataclass(frozen=True)
class FileFormat:
    """How one kind of file is written and read back, in one signature for every format.

    Attributes:
        write: ``(path, entries, metadata) -> int``: write ``path`` from ``entries`` (:class:`Row` in data
            order) and ``metadata`` (the format's kind: a safetensors ``__metadata__`` dict or None, a
            :class:`PickleMeta`, a flex ``.metadata``'s records); returns the bytes of tensor data written.
            Fsynced. Raises OSError (the write) and AssertionError (a source of another size than planned).
        check: ``(path, planned, metadata)``: read ``path`` back with the reference reader and compare it
            with ``planned`` (:class:`~surgery.io.readback.Planned`, in any order) and ``metadata``. Raises
            OutputError when it does not read back as planned (:mod:`surgery.io.readback`).
    """

    write: Callable[[Path, Iterable[Row], Any], int]
    check: Callable[[Path, Sequence[Planned], Any], None]


@dataclass(frozen=True)
class Written:
    """A file a write published, for its read-back: its name in the output folder, its format, the tensors
    planned in it and its metadata (as given to :attr:`FileFormat.write`)."""

    name: str
    format: FileFormat
    planned: Sequence[Planned]
    metadata: Any = None

    def check(self, folder: Path) -> None:
        """Read ``folder / name`` back (:attr:`FileFormat.check`). Raises OutputError."""
        self.format.check(folder / self.name, self.planned, self.metadata)


def _st_write(path: Path, entries: Iterable[Row], metadata: dict[str, str] | None) -> int:
    """:func:`surgery.io.safetensors_io.write_rows`: the header from every entry first (a sequence is
    read twice, each row's source made only when its bytes are written), then the bytes."""
    rows = entries if isinstance(entries, Sequence) else list(entries)
    header = ((r.name, r.dtype, r.shape, r.source.nbytes) for r in rows)
    return safetensors_io.write_rows(path, header, ((r.source.nbytes, r.source) for r in rows), metadata)


def _st_check(path: Path, planned: Sequence[Planned], metadata: dict[str, str] | None) -> None:
    readback.check_safetensors(path, planned, metadata)


def _pd_write(path: Path, entries: Iterable[Row], metadata: PickleMeta) -> int:
    """:func:`surgery.io.pdparams.write_file` with the extras and numpy module of ``metadata``."""
    return pdparams.write_file(path, entries, metadata.extras, metadata.np_module)


def _pd_check(path: Path, planned: Sequence[Planned], metadata: PickleMeta | None) -> None:
    readback.check_pdparams(path, planned)


def _pdopt_write(path: Path, entries: Iterable[Row], metadata: PickleMeta) -> int:
    """:func:`surgery.io.pdparams.write_optimizer_file`: the accumulators, then the extras with the master
    weights (the rows named :data:`MASTER` ``+ key``) in ``master_weights``."""
    rows = list(entries)  # their sources make their bytes only when written
    tensors = [r for r in rows if not r.name.startswith(MASTER)]
    master = [r._replace(name=r.name[len(MASTER) :]) for r in rows if r.name.startswith(MASTER)]
    pdparams.write_optimizer_file(path, tensors, master, metadata.names, metadata.extras, metadata.np_module)
    return sum(r.source.nbytes for r in rows)


def _pdopt_check(path: Path, planned: Sequence[Planned], metadata: PickleMeta | None) -> None:
    """:func:`surgery.io.readback.check_optimizer` of the accumulators and the master weights (the planned
    names :data:`MASTER` ``+ key``)."""
    acc = [p for p in planned if not p.name.startswith(MASTER)]
    master = [
        Planned(p.name[len(MASTER) :], p.dtype, p.shape, p.nbytes)
        for p in planned
        if p.name.startswith(MASTER)
    ]
    readback.check_optimizer(path, acc, master)


PDOPT = FileFormat(write=_pdopt_write, check=_pdopt_check)
"""An ``optimizer.pdopt`` as ``paddle.save`` writes it; metadata a :class:`PickleMeta` (with ``names``)."""


@dataclass(frozen=True)
class Format(FileFormat):
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
        write, check: as every :class:`FileFormat`; ``metadata`` is the file's ``__metadata__`` (a dict or
            None) for safetensors, a :class:`PickleMeta` for a ``.pdparams``.
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

    def file_dtype(self, label: str) -> str:
        """The dtype name a :class:`Row` of this container gives for a safetensors label or numpy name
        ``label``: the label itself, or the numpy name a ``.pdparams`` stores (``BF16`` → ``uint16``).

        Raises:
            ValueError: a dtype a ``.pdparams`` cannot hold (plans refuse it by name first).
        """
        return label if self.bf16_label else pdparams_name(label)

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
    write=_st_write,
    check=_st_check,
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
    write=_pd_write,
    check=_pd_check,
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
