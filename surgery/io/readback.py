"""Read back every weight file of an output before it is renamed into place.

What was meant to be written (names in order, dtype labels, shapes, the safetensors ``__metadata__``) is
compared with what a reader sees in the temporary folder:

* ``.safetensors`` files are opened with the ``safetensors`` library's own ``safe_open`` (the reference
  reader: it refuses duplicate names, holes or overlaps between tensors, a span that does not match the
  shape and dtype, and bytes after the last tensor), so an output tietool writes is one that library loads;
* ``.pdparams`` files are walked by tietool's strict opcode reader (:func:`pdparams.read_header`), the
  one that refuses anything a weights pickle should not hold, so an output never fails tietool's own
  checks on the next run;
* the index (``weight_map``, ``metadata.total_size``) must equal what the shard headers hold.

Only headers are read (the data was streamed from byte ranges checked when they were planned), so this
costs milliseconds even for a 100 GB checkpoint.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from ..model.errors import CheckpointError, OutputError
from ..model.tensor import DTYPES, NP_TO_ST
from . import flex, pdparams, safetensors_io


@dataclass(frozen=True, slots=True)  # slots: one per output tensor, millions in a hostile header
class Planned:
    """One tensor as it was meant to be written.

    Attributes:
        name: state-dict name.
        dtype: the safetensors label (``F32``, ``BF16``...) or the numpy name a ``.pdparams`` stores
            (``float32``, ``uint16``); both are normalised before comparing.
        shape: e.g. ``(vocab_size, hidden_size)``.
        nbytes: size of the data in bytes (what ``total_size`` counts).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def _pdparams_label(dtype: str) -> str:
    """The label a ``.pdparams`` reader reports for ``dtype`` (bf16 is stored as ``uint16`` there)."""
    np_name = (DTYPES[dtype].np_name or dtype) if dtype in DTYPES else dtype
    return NP_TO_ST.get(np_name, np_name)


def _mismatch(path: Path, what: str) -> OutputError:
    return OutputError(
        f"the written file does not read back as planned ({what}); nothing was written",
        path,
        "this is a bug in tietool or a failing disk: please report it with TIETOOL_DEBUG=1",
    )


def _check_same(path: Path, planned: Sequence[Planned], seen: list[tuple[str, str, tuple[int, ...]]]) -> None:
    """``seen`` (name, dtype, shape) holds exactly the tensors of ``planned``, in any order. Names are
    unique on both sides (a dict's keys; a reader refuses a repeated name), so both are sorted by name and
    compared pairwise: no second set of per-tensor tuples is built unless they differ."""
    mine = sorted(planned, key=operator.attrgetter("name"))
    theirs = sorted(seen, key=operator.itemgetter(0))
    pairs = zip(mine, theirs, strict=False)
    if len(mine) == len(theirs) and all(
        s[0] == p.name and s[1] == p.dtype and tuple(s[2]) == tuple(p.shape) for p, s in pairs
    ):
        return
    del mine, theirs, pairs
    want = [(p.name, p.dtype, tuple(p.shape)) for p in planned]
    missing = sorted({w[0] for w in want} - {s[0] for s in seen})
    extra = sorted({s[0] for s in seen} - {w[0] for w in want})
    seen_set = set(seen)
    changed = sorted(w[0] for w in want if w not in seen_set and w[0] not in missing)
    raise _mismatch(path, f"missing {missing}, unexpected {extra}, dtype/shape differs {changed}")


def check_safetensors(path: Path, planned: Sequence[Planned], metadata: dict[str, str] | None) -> None:
    """Open ``path`` with ``safetensors.safe_open`` and compare names, dtypes, shapes and metadata.

    Raises:
        OutputError: the library refuses the file, or it holds other tensors or metadata than planned.
    """
    from safetensors import safe_open  # the reference reader; imported only when a file is written

    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8).ljust(8, b"\0"))[0]
    if length > SAFE_OPEN_HEADER:
        _check_large(path, planned, metadata, length)
        return
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata()
            seen = []
            for name in f.keys():
                s = f.get_slice(name)
                seen.append((name, str(s.get_dtype()), tuple(s.get_shape())))
    except OutputError:
        raise
    except Exception as e:  # noqa: BLE001 - the library's own refusal, whatever its class
        raise _mismatch(path, f"safetensors refuses it: {e}") from None
    _check_same(path, planned, seen)
    if (meta or None) != ({str(k): str(v) for k, v in metadata.items()} if metadata else None):
        raise _mismatch(path, f"__metadata__ {meta!r}, planned {metadata!r}")


# Headers up to this size are read back by ``safe_open`` itself (~1.4 kB of memory per tensor: ~200 MB
# here, ~140 k tensors; every real checkpoint's header is under 2 MB); a larger one by :func:`_check_large`.
SAFE_OPEN_HEADER = 8 << 20
_PIECE = 1 << 20  # bytes of a large header compared at a time


def _check_large(
    path: Path, planned: Sequence[Planned], metadata: dict[str, str] | None, length: int
) -> None:
    """The read-back of a header over :data:`SAFE_OPEN_HEADER` (a hostile 93 MB header of 1.6 M tensors:
    ``safe_open`` alone would take 2.2 GB) without a per-tensor object: the header bytes on disk must equal
    the header serialised from ``planned`` in its order (:func:`safetensors_io.header_bytes`, which
    :func:`safetensors_io.write_file` wrote), and the file must end where its last tensor does. What
    ``safe_open`` checks beyond that holds by that construction and is checked here on ``planned``: the
    names are distinct, each span is ``shape × dtype bits / 8`` bytes, the spans tile the data from 0.

    Raises:
        OutputError: the file or ``planned`` break one of those rules.
    """
    names = sorted(p.name for p in planned)
    if any(a == b for a, b in zip(names, names[1:], strict=False)):
        raise _mismatch(path, "a tensor name is planned twice")
    del names
    for p in planned:
        dt = DTYPES.get(p.dtype)
        if dt is None or p.nbytes * 8 != math.prod(p.shape) * dt.bits:
            raise _mismatch(path, f"{p.name}: {p.nbytes} bytes for {p.dtype} {list(p.shape)}")
    rows = ((p.name, p.dtype, p.shape, p.nbytes) for p in planned)
    want, total = safetensors_io.header_bytes(rows, metadata)
    with open(path, "rb") as f:
        f.seek(8)
        same = (
            len(want) == length
            and all(  # piece by piece: the header is not held twice
                f.read(min(_PIECE, length - i)) == want[i : i + _PIECE] for i in range(0, length, _PIECE)
            )
        )
        size = os.fstat(f.fileno()).st_size
    del want
    if not same:  # a file copied whole keeps its input's header: parse it, as tietool read the input
        _check_parsed(path, planned, metadata)
    elif size != 8 + length + total:
        raise _mismatch(path, f"{size} bytes, planned {8 + length + total}")


def _check_parsed(path: Path, planned: Sequence[Planned], metadata: dict[str, str] | None) -> None:
    """Parse ``path``'s header with :func:`safetensors_io.read_header` (the library's rules) and compare
    names, dtypes, shapes and metadata with ``planned``.

    Raises:
        OutputError: the header breaks a rule, or holds other tensors or metadata than planned.
    """
    try:
        infos, meta = safetensors_io.read_header(path, path.name)
    except CheckpointError as e:
        raise _mismatch(path, f"its header breaks a rule of the format: {e.message}") from None
    _check_same(path, planned, [(t.name, t.dtype, t.shape) for t in infos])
    if (meta or None) != ({str(k): str(v) for k, v in metadata.items()} if metadata else None):
        raise _mismatch(path, f"__metadata__ {meta!r}, planned {metadata!r}")


def check_pdparams(path: Path, planned: Sequence[Planned]) -> None:
    """Walk ``path`` with the strict opcode reader and compare names, dtypes and shapes.

    Raises:
        OutputError: the reader refuses the file, or it holds other tensors than planned.
    """
    try:
        tensors, _extras, _module = pdparams.read_header(path, path.name)
    except Exception as e:  # noqa: BLE001 - tietool's own refusal of the file it just wrote
        raise _mismatch(path, f"the pickle reader refuses it: {e}") from None
    seen = [(t.name, _pdparams_label(t.dtype), tuple(t.shape)) for t in tensors]
    want = [Planned(p.name, _pdparams_label(p.dtype), p.shape, p.nbytes) for p in planned]
    _check_same(path, want, seen)


def check_index(path: Path, shards: dict[str, Sequence[Planned]]) -> None:
    """The index at ``path`` names exactly the tensors of ``shards`` (file → tensors), each in its file,
    and ``metadata.total_size`` is their byte total.

    Raises:
        OutputError: the index disagrees with the shards.
    """
    check_index_data(path, json.loads(path.read_text(encoding="utf-8")), shards)


def check_index_data(path: Path, index: Any, shards: dict[str, Sequence[Planned]]) -> None:
    """:func:`check_index` of ``index`` as parsed (or as written, when :func:`check_json_file` proves the
    file holds it), compared entry by entry (no second name → file dict).

    Raises:
        OutputError: the index disagrees with the shards.
    """
    wm = index.get("weight_map") if isinstance(index, dict) else None
    count = sum(len(ps) for ps in shards.values())  # names are distinct: then equal length and entries
    if (
        not isinstance(wm, dict)
        or len(wm) != count
        or any(wm.get(p.name) != f for f, ps in shards.items() for p in ps)
    ):
        raise _mismatch(path, "weight_map differs from the shards' contents")
    total = sum(p.nbytes for ps in shards.values() for p in ps)
    if (index.get("metadata") or {}).get("total_size") != total:
        raise _mismatch(path, f"metadata.total_size is not {total}")


class PlannedView(Sequence[Planned]):
    """The :class:`Planned` tensor of each of ``items``, made by ``make`` when it is read: an output of
    millions of tensors holds its own records once, not a second list of :class:`Planned`."""

    __slots__ = ("_items", "_make")

    def __init__(self, items: Sequence[Any], make: Callable[[Any], Planned]) -> None:
        self._items, self._make = items, make

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> Planned: ...
    @overload
    def __getitem__(self, i: slice) -> list[Planned]: ...
    def __getitem__(self, i: int | slice) -> Planned | list[Planned]:
        if isinstance(i, slice):
            return [self._make(x) for x in self._items[i]]
        return self._make(self._items[i])

    def __iter__(self) -> Iterator[Planned]:
        return (self._make(x) for x in self._items)


def check_json_file(path: Path, data: Any, style: dict[str, Any]) -> None:
    """The file at ``path`` is byte for byte ``json.dump(data, **style)`` and a newline (as tietool writes
    an index), compared while encoding: an index of millions of entries is never parsed back into a second
    dict of new strings (~300 MB for 1.6 M entries).

    Raises:
        OutputError: the file holds anything else (another entry, size, order or a truncation).
    """
    chunks = json.JSONEncoder(**style).iterencode(data)
    with open(path, "rb") as f:
        buf: list[bytes] = []
        held = 0
        for chunk in itertools.chain(chunks, ["\n"]):
            b = chunk.encode("utf-8")
            buf.append(b)
            held += len(b)
            if held >= 1 << 20:
                if f.read(held) != b"".join(buf):
                    raise _mismatch(path, "it is not the index planned from the shards")
                buf, held = [], 0
        if f.read(held) != b"".join(buf) or f.read(1):
            raise _mismatch(path, "it is not the index planned from the shards")


def check_bytes(path: Path, data: bytes) -> None:
    """The file at ``path`` holds exactly ``data`` (a file edit written whole: tokenizer files, a config).

    Raises:
        OutputError: it holds anything else (a short write, a changed byte).
    """
    try:
        with open(path, "rb") as f:
            got = f.read(len(data) + 1)
    except OSError as e:
        raise _mismatch(path, f"it cannot be read: {e.strerror}") from None
    if got != data:
        raise _mismatch(path, f"it holds {len(got)} bytes that are not the {len(data)} written")


def check_optimizer(path: Path, tensors: Sequence[Planned], master: Sequence[Planned]) -> None:
    """Walk the ``optimizer.pdopt`` at ``path`` with the strict opcode reader (its allow-list for optimizer
    files) and compare its accumulators and its ``master_weights`` (names in order, dtypes, shapes) with
    ``tensors`` and ``master``.

    Raises:
        OutputError: the reader refuses the file, or it holds other tensors than planned.
    """
    try:
        head = pdparams.read_optimizer_header(path, path.name)
    except Exception as e:  # noqa: BLE001 - tietool's own refusal of the file it just wrote
        raise _mismatch(path, f"the pickle reader refuses it: {e}") from None
    for got, want in ((head.tensors, tensors), (head.master, master)):
        seen = [(t.name, _pdparams_label(t.dtype), tuple(t.shape)) for t in got]
        _check_same(path, [Planned(p.name, _pdparams_label(p.dtype), p.shape, p.nbytes) for p in want], seen)


def check_flex_metadata(path: Path, tensors: dict[str, Any]) -> None:
    """Read the flex ``.metadata`` at ``path`` with tietool's reader (:func:`surgery.io.flex.read_metadata`,
    every field checked) and compare every tensor record (global shape, dtype, each slice's file, key,
    offset, shape, flattening, replica) with ``tensors`` (key → :class:`~surgery.io.flex.FlexTensor`).

    Raises:
        OutputError: the reader refuses the file, or it holds other records than planned.
    """
    try:
        got = flex.read_metadata(path)
    except Exception as e:  # noqa: BLE001 - tietool's own refusal of the file it just wrote
        raise _mismatch(path, f"the reader refuses it: {e}") from None
    if got != tensors:
        differ = sorted(k for k in set(got) | set(tensors) if got.get(k) != tensors.get(k))
        raise _mismatch(path, f"the records of {differ[:5]} differ")


def check_size(path: Path, size: int, planned: int) -> None:
    """A whole-file copy at ``path`` holds ``size`` bytes, as its source's ``planned``.

    Raises:
        OutputError: it holds another number (a short or long copy).
    """
    if size != planned:
        raise _mismatch(path, f"the copy holds {size} bytes, its source {planned}")
