"""Assemble a whole new checkpoint from a list of output tensors: the writer of ``convert`` and ``merge``.

``tie``/``untie``/``resize`` edit a checkpoint and keep its files (:mod:`.write`); ``convert`` and ``merge``
make one whose names, layouts, container or shards differ from every input file, so nothing can be kept
by file. This module lays the tensors out in shards as the libraries' ``save_pretrained`` does, streams
each tensor from its source (one tensor in memory at a time at most), writes the index, ``config.json``
and the carried files into a temporary folder beside the output, reads every weight file back with the
reference readers (:mod:`.readback`), and renames the folder into place only when it is complete.

Shard naming, as the writers our users load from:

* safetensors: ``model-00001-of-0000N.safetensors`` and ``model.safetensors.index.json``, always (as
  PaddleFormers 1.2's ``save_pretrained`` does, even for one shard);
* ``.pdparams``: ``model_state.pdparams`` when everything fits in one shard, else
  ``model_state-00001-of-0000N.pdparams`` and ``model_state.pdparams.index.json`` (as PaddleNLP 2.x's
  ``save_pretrained``).

Shards are filled greedily in the given tensor order, a new shard starting when the next tensor would
take the current one past ``max_shard_size`` (PaddleFormers' ``shard_checkpoint``); a tensor larger than
the limit gets a shard of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..io import pdparams_io, safetensors_io
from ..io.readback import (
    Planned,
    PlannedView,
    check_index_data,
    check_json_file,
    check_pdparams,
    check_safetensors,
)
from ..io.safetensors_io import Source
from ..model.enums import Container
from ..model.errors import Opt, UsageError
from ..model.tensor import DTYPES, pdparams_name
from .copy import copy_file, write_reporting
from .publish import JSON_STYLE, publish, write_json

# PaddleFormers' and PaddleNLP's ``save_pretrained(max_shard_size="10GB")``; "GB" is 10**9 bytes there
# (``convert_file_size_to_int``), "GiB" 2**30.
DEFAULT_MAX_SHARD_SIZE = 10 * 10**9

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_size(text: str | int) -> int:
    """``"10GB"`` → 10_000_000_000, ``"500MiB"`` → 524_288_000, ``"1024"``/``1024`` → 1024 bytes, as
    PaddleFormers' ``convert_file_size_to_int`` (decimal ``KB/MB/GB``, binary ``KiB/MiB/GiB``).

    Raises:
        UsageError: not a positive size.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if m is None or m.group(2) not in _UNITS or float(m.group(1)) * _UNITS[m.group(2)] < 1:
        raise UsageError(
            f"{Opt('max_shard_size', text)} is not a size",
            None,
            f"give bytes or a size: {Opt('max_shard_size', '10GB')}, {Opt('max_shard_size', '500MiB')}",
        )
    return int(float(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True, slots=True)  # slots: one per output tensor, millions in a hostile header
class OutTensor:
    """One tensor of the checkpoint being assembled.

    Attributes:
        name: its state-dict name in the output.
        dtype: the safetensors label of its logical dtype (``"F32"``, ``"BF16"``, ...); a ``.pdparams``
            output stores bf16 as numpy ``uint16`` (as PaddleNLP does), the bits unchanged.
        shape: its shape in the output, e.g. ``(vocab_size, hidden_size)``.
        source: called once, when the tensor is written, for its bytes in C order (a byte range of an
            input, or an array built then: a transpose, a concatenation). The array is dropped right
            after, so at most one built tensor is in memory at a time.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: Callable[[], Source]

    @property
    def nbytes(self) -> int:
        """Bytes of data: ``prod(shape) × bits / 8`` (packed sub-byte dtypes included)."""
        n = 1
        for d in self.shape:
            n *= d
        return DTYPES[self.dtype].nbytes(n)


class _Lazy(Source):
    """A :class:`Source` of known size whose bytes are produced only when written (then released)."""

    __slots__ = ("make",)

    def __init__(self, t: OutTensor):
        super().__init__(nbytes=t.nbytes)
        self.nbytes = t.nbytes
        self.make = t.source

    def write_to(self, f) -> None:
        src = self.make()
        if src.nbytes != self.nbytes:
            raise ValueError(f"a source gave {src.nbytes} bytes, {self.nbytes} were planned")
        src.write_to(f)


def shard_names(container: Container, n: int) -> list[str]:
    """The weight file names of ``n`` shards (see the module docstring)."""
    if container is Container.PDPARAMS:
        if n == 1:
            return ["model_state.pdparams"]
        return [f"model_state-{k:05d}-of-{n:05d}.pdparams" for k in range(1, n + 1)]
    return [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]


def index_name(container: Container, n: int) -> str | None:
    """The index file name, or None when the container writes no index for ``n`` shards."""
    if container is Container.PDPARAMS:
        return None if n == 1 else "model_state.pdparams.index.json"
    return "model.safetensors.index.json"


def plan_shards(tensors: Sequence[OutTensor], max_shard_size: int) -> list[list[OutTensor]]:
    """Split ``tensors`` (in order) into shards of at most ``max_shard_size`` bytes each, greedily, as
    PaddleFormers' ``shard_checkpoint``; a larger tensor gets a shard of its own. Never empty."""
    shards: list[list[OutTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


@dataclass(frozen=True)
class Layout:
    """Where each tensor goes: ``files`` (output file name → its tensors) and the index name."""

    files: dict[str, list[OutTensor]]
    index: str | None

    @property
    def weight_map(self) -> dict[str, str]:
        return {t.name: f for f, ts in self.files.items() for t in ts}

    @property
    def total_size(self) -> int:
        return sum(t.nbytes for ts in self.files.values() for t in ts)


def layout(tensors: Sequence[OutTensor], container: Container, max_shard_size: int) -> Layout:
    """The output files of ``tensors``.

    Raises:
        UsageError: no tensor, or two tensors with one name.
    """
    names = [t.name for t in tensors]
    if not names or len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UsageError(f"the output would hold {dup or 'no tensor'} twice or none", None, "report this bug")
    shards = plan_shards(tensors, max_shard_size)
    files = dict(zip(shard_names(container, len(shards)), shards, strict=True))
    return Layout(files, index_name(container, len(shards)))


def assemble(
    out: str | Path,
    tensors: Sequence[OutTensor],
    container: Container,
    config: dict,
    *,
    carry: Sequence[tuple[Path, str]] = (),
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    st_metadata: dict[str, str] | None = None,
    pdparams_extras: dict[str, Any] | None = None,
    report: Callable[[dict], dict] | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict:
    """Write a checkpoint holding exactly ``tensors`` to ``out``, atomically.

    Args:
        out: the output folder (must not exist, or be empty). Checked by the caller against its inputs
            (:func:`surgery.write.writer.check_output_path`).
        tensors: the output tensors in the order they are laid out.
        container: safetensors or ``.pdparams``.
        config: written as ``config.json``.
        carry: ``(source file, relative name in the output)`` copied unchanged (generation config,
            tokenizer files).
        max_shard_size: bytes per shard at most (one larger tensor excepted).
        st_metadata: each safetensors file's ``__metadata__`` (PaddleFormers 1.2 writes
            ``{"format": "pt"}``; pass what the readers of the output expect), or None.
        pdparams_extras: non-tensor entries of each ``.pdparams`` file; ``StructuredToParameterName@@`` is
            restricted to the file's own tensors.
        report: given the written-file facts, returns the report written as ``tietool-report.json``.
        progress: called with (output file name, bytes) as tensor bytes are written.

    Returns:
        the report (or the facts: ``weight_files``, ``index``, ``total_size``, ``carried``).

    Raises:
        UsageError: no tensors or duplicate names.
        OutputError: the output cannot be written or does not read back; nothing is left behind.
    """
    lay = layout(tensors, container, max_shard_size)
    return publish(
        Path(out),
        lambda tmp: _write_all(tmp, lay, container, config, carry, st_metadata, pdparams_extras, progress),
        report,
    )


def _write_all(
    tmp: Path,
    lay: Layout,
    container: Container,
    config: dict,
    carry: Sequence[tuple[Path, str]],
    st_metadata: dict[str, str] | None,
    extras: dict[str, Any] | None,
    progress: Callable[[str, int], None] | None,
) -> dict:
    """Write the weight files, the index, config.json and the carried files into ``tmp``; read back."""
    for fname, ts in lay.files.items():
        _write_file(tmp / fname, ts, container, st_metadata, extras, progress)
    index = {"metadata": {"total_size": lay.total_size}, "weight_map": lay.weight_map}
    if lay.index is not None:
        write_json(tmp / lay.index, index)
    shards: dict[str, Sequence[Planned]] = {f: PlannedView(ts, _planned) for f, ts in lay.files.items()}
    for fname, planned in shards.items():
        if container is Container.SAFETENSORS:
            check_safetensors(tmp / fname, planned, st_metadata)
        else:
            check_pdparams(tmp / fname, planned)
    if lay.index is not None:
        # the file holds the index written (compared as encoded, never parsed into a second dict), and
        # that index names exactly the planned tensors
        check_json_file(tmp / lay.index, index, JSON_STYLE)
        check_index_data(tmp / lay.index, index, shards)
    write_json(tmp / "config.json", config)
    for src, rel in carry:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        copy_file(src, tmp / rel)
    return {
        "weight_files": list(lay.files),
        "index": lay.index,
        "total_size": lay.total_size,
        "carried": [rel for _, rel in carry],
    }


def _planned(t: OutTensor) -> Planned:
    return Planned(t.name, t.dtype, t.shape, t.nbytes)


def _write_file(
    path: Path,
    ts: list[OutTensor],
    container: Container,
    st_metadata: dict[str, str] | None,
    extras: dict[str, Any] | None,
    progress: Callable[[str, int], None] | None,
) -> None:
    """One weight file of ``ts``, each tensor's bytes produced only when it is written."""
    if container is Container.SAFETENSORS:
        safetensors_io.write_file(path, _rows(ts, path.name, progress), st_metadata)
        return
    rows: list[tuple[str, str, tuple[int, ...], Source, object, bool]] = [
        (t.name, pdparams_name(t.dtype), t.shape, src, None, False)
        for t, src in _sources(ts, path.name, progress)
    ]
    pdparams_io.write_file(path, rows, _file_extras(extras, {t.name for t in ts}))


def _sources(ts: list[OutTensor], fname: str, progress) -> Iterator[tuple[OutTensor, Source]]:
    for t in ts:
        yield t, (_Lazy(t) if progress is None else _Progressing(t, fname, progress))


def _rows(ts: list[OutTensor], fname: str, progress) -> Iterator[tuple[str, str, tuple[int, ...], Source]]:
    for t, src in _sources(ts, fname, progress):
        yield t.name, t.dtype, t.shape, src


class _Progressing(_Lazy):
    """:class:`_Lazy` that tells ``progress(file, bytes)`` once its tensor is written."""

    __slots__ = ("fname", "progress")

    def __init__(self, t: OutTensor, fname: str, progress: Callable[[str, int], None]):
        super().__init__(t)
        self.fname, self.progress = fname, progress

    def write_to(self, f) -> None:
        src = self.make()
        if src.nbytes != self.nbytes:
            raise ValueError(f"a source gave {src.nbytes} bytes, {self.nbytes} were planned")
        write_reporting(src, f, lambda n: self.progress(self.fname, n))


def _file_extras(extras: dict[str, Any] | None, names: set[str]) -> dict[str, Any]:
    """``extras`` for one ``.pdparams`` file: ``StructuredToParameterName@@`` keeps its own tensors."""
    if not extras:
        return {}
    out = dict(extras)
    s2p = out.get("StructuredToParameterName@@")
    if isinstance(s2p, dict):
        out["StructuredToParameterName@@"] = {k: v for k, v in s2p.items() if k in names}
    return out
