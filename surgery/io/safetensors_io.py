"""safetensors: header parse and a streamed writer.

Why not ``safetensors.safe_open`` / ``save_file``: the numpy binding has no bfloat16 (Paddle checkpoints
are mostly bf16, and we must copy bf16 *bits*, never values), it cannot hand out the byte range of a
tensor (we copy unchanged tensors by range, without decoding), and ``save_file`` needs every tensor in
memory at once (a 100 GB checkpoint). The format is tiny (8-byte length, JSON header, raw data), so we
read and write it here, with the same validation rules as the reference implementation.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import math
import operator
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..model.errors import CheckpointError
from ..model.tensor import DTYPES, DType, TensorInfo, map_array, require_array
from . import regular, store

if TYPE_CHECKING:
    import numpy as np
else:
    from ..model.lazy import numpy as np

# The rules of the safetensors library (0.8, ``safetensors/src/tensor.rs``: ``read_metadata``,
# ``Metadata::validate``, serde's ``HashMetadata`` / ``TensorInfo`` / ``Dtype``), each checked against the
# installed library as the oracle in ``tests/unit/io/test_safetensors_rules.py``:
MAX_HEADER = 100_000_000  # MAX_HEADER_SIZE: bytes, decimal (not 100 MiB)
HEADER_DEPTH = (
    127  # serde_json's recursion limit of 128 as the library meets it: 127 levels parse, 128 do not
)
U64_MAX = 2**64 - 1  # shapes and offsets are ``usize``: a larger integer is a float to serde, refused
_ENTRY_KEYS = ("dtype", "shape", "data_offsets")
_FIX = "the file is damaged or not safetensors; re-download or re-export it"
_LIB = "which the safetensors library refuses"


def _header_pairs(pairs: list[tuple[str, Any]]) -> Any:
    """The JSON parser's object hook for a header. An object of exactly the three entry fields, in the order
    every writer uses, becomes its :class:`TensorInfo` at once when it is valid (:func:`_quick_info`; the
    name, file and absolute offset are filled in by :func:`read_header`), else the tuple ``(dtype, shape,
    data_offsets)`` (JSON itself never yields a tuple), checked with its name later: a header of millions of
    entries then holds no dict or list per entry. Any other object is a dict; a repeated key is refused
    (``regular.unique_pairs``)."""
    if len(pairs) == 3:
        a, b, c = pairs
        if a[0] == "dtype" and b[0] == "shape" and c[0] == "data_offsets":
            return _quick_info(a[1], b[1], c[1]) or (a[1], b[1], c[1])
    return regular.unique_pairs(pairs)


def _quick_info(dtype: Any, shape: Any, offsets: Any) -> TensorInfo | None:
    """The :class:`TensorInfo` of a valid entry (``offset`` relative to the data, no name), or None when any
    rule of :func:`_tensor_info` fails (which then names the rule)."""
    dt = DTYPES.get(dtype) if type(dtype) is str else None
    if dt is None or type(shape) is not list or type(offsets) is not list or len(offsets) != 2:
        return None
    numel = 1
    for d in shape:
        if type(d) is not int or d < 0:
            return None
        numel *= d
        if numel > U64_MAX:
            return None
    begin, end = offsets
    if type(begin) is not int or type(end) is not int or not 0 <= begin <= end:
        return None
    bits = numel * dt.bits
    if bits > U64_MAX or bits % 8 or end - begin != bits >> 3:
        return None
    key = tuple(shape)
    if len(_SHAPES) > 4096:
        _SHAPES.clear()
    return TensorInfo("", dt.st, _SHAPES.setdefault(key, key), "", begin, end - begin)


_SHAPES: dict[tuple, tuple] = {}  # equal shapes share one tuple (a header of 1.6 M entries has a few dozen)
# the slots' setters, for the objects _quick_info makes before their name is known
_SET_NAME, _SET_FILE, _SET_OFFSET = (vars(TensorInfo)[f].__set__ for f in ("name", "file", "offset"))


def _header_int(text: str) -> int | float:
    """The JSON parser's integer hook where a header holds ``-0`` or integers of 20 digits and more: serde
    reads ``-0`` and integers beyond 64 bits as floats (refused where a shape or offset needs an integer,
    allowed in fields the library ignores) and refuses one beyond the float range anywhere."""
    if text == "-0":
        return -0.0
    v = int(text)
    if -(2**63) <= v <= U64_MAX:
        return v
    f = float(text)
    if not math.isfinite(f):
        raise ValueError(f"number {text[:20]}... out of range")
    return f


_DIGITS_AS_0 = bytes.maketrans(b"123456789", b"000000000")
_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def read_header(
    path: Path, rel: str, blob: tuple[int, int, bytes] | None = None
) -> tuple[list[TensorInfo], dict[str, str] | None]:
    """Parse and validate a safetensors header as the safetensors library does; reads no tensor data.

    The rules (``safetensors/src/tensor.rs`` 0.8, each checked against the library in
    ``tests/unit/io/test_safetensors_rules.py``): the 8-byte length at most 100,000,000 and within the file;
    UTF-8 JSON (leading and trailing whitespace allowed, nesting at most 127 levels, no lone surrogate escape,
    no number out of the float range); an object whose ``__metadata__`` is null or a string → string map and
    whose every other value is a tensor entry: ``dtype`` one of the format's labels, ``shape`` a list of
    integers in ``[0, 2**64)`` (not strings, floats, ``-0`` or booleans), ``data_offsets`` two such integers
    (as an object, or as the list ``[dtype, shape, offsets]``, as serde also reads a struct); in offset
    order the entries tile the data from byte 0 to the end of the file exactly (no hole, overlap or
    trailing byte), and each covers ``shape × dtype bits / 8`` bytes, a whole number, the element count
    computed without overflowing 64 bits. Where tietool is stricter than the library: a key repeated in any
    object is refused (the format forbids it; the library keeps the last tensor of a repeated name).

    Args:
        path: the file.
        rel: its name relative to the checkpoint folder (stored in each ``TensorInfo.file``).
        blob: the header already fetched (:func:`fetch_headers`), else it is read here.

    Returns:
        ``(tensors in data order, __metadata__ or None)``.

    Raises:
        CheckpointError: exit 3, naming the file and the rule broken.
    """
    size, data_start, raw = blob if blob is not None else _read_header_blob(path)
    text, int_hook, surrogates = _decode(raw, path)
    del raw, blob  # the text alone from here on: a 100 MB header is not held twice
    with _gc_paused():  # millions of new objects: the cyclic GC would rescan them all, again and again
        header, meta = _parse_header(text, path, int_hook, surrogates)
        del text
        out = [_named(name, h, rel, data_start, path) for name, h in header.items()]
        del header
    out.sort(key=_DATA_ORDER)
    _check_tiling(out, data_start, size, path)
    return out, meta


def _named(name: str, h: Any, rel: str, data_start: int, path: Any) -> TensorInfo:
    """The :class:`TensorInfo` of entry ``name: h``: one :func:`_quick_info` made while parsing, given its
    name, file and absolute offset (it is not yet shared with anyone), or :func:`_tensor_info`'s."""
    if type(h) is TensorInfo:
        _SET_NAME(h, name)
        _SET_FILE(h, rel)
        _SET_OFFSET(h, data_start + h.offset)
        return h
    return _tensor_info(name, h, rel, data_start, path)


def _decode(raw: bytes, path: Any) -> tuple[str, Callable[[str], Any] | None, bool]:
    """The header text, the integer hook it needs (:func:`_header_int` when it holds ``-0`` or a run of 20
    digits, else None: the plain parser is faster) and whether it may hold a lone surrogate escape.

    Raises:
        CheckpointError: not UTF-8.
    """
    hook = _header_int if b"-0" in raw or b"0" * 20 in raw.translate(_DIGITS_AS_0) else None
    surrogates = b"\\u" in raw and _LONE_SURROGATE.search(raw) is not None
    try:
        return raw.decode("utf-8"), hook, surrogates
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"the safetensors header is not valid utf-8 text ({str(e)[:120]}), {_LIB}", path, _FIX
        ) from None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (a header's objects hold no cycles; reference counting frees
    them): parsing 1.6 M entries took 13 s with it and 4 s without (CPython 3.11)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_DATA_ORDER = operator.attrgetter("offset", "nbytes")  # the library sorts by (begin, end): empty tensors
# come before a tensor that begins at their offset


def fetch_headers(paths: list[Any]) -> dict[str, tuple[int, int, bytes]]:
    """The headers of remote safetensors files ``paths`` in two rounds of concurrent range requests (every
    8-byte length, then every header): ``str(path)`` → ``(file size, data offset, header bytes)``, as
    :func:`_read_header_blob` returns them.

    Raises:
        CheckpointError: a file too short for the length, a length over the file size or 100 MB, a failed
            request.
    """
    sizes = [store.size(p) for p in paths]
    lengths = store.read_ranges(paths, [0] * len(paths), [min(8, n) for n in sizes])
    ends = [8 + _header_length(raw, size, p) for p, size, raw in zip(paths, sizes, lengths, strict=True)]
    blobs = store.read_ranges(paths, [8] * len(paths), ends)
    return {str(p): (size, end, b) for p, size, end, b in zip(paths, sizes, ends, blobs, strict=True)}


def _header_length(raw: bytes, size: int, path: Any) -> int:
    """The header length the first 8 bytes ``raw`` of a ``size``-byte file declare.

    Raises:
        CheckpointError: fewer than 8 bytes, a length over 100,000,000 bytes or beyond the file.
    """
    if len(raw) < 8:
        raise CheckpointError(f"truncated safetensors file ({size} bytes, no header)", path, _FIX)
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER:
        raise CheckpointError(
            f"safetensors header length {n:,} is over the library's limit of {MAX_HEADER:,} bytes, {_LIB}",
            path,
            _FIX,
        )
    if n + 8 > size:
        raise CheckpointError(
            f"safetensors header length {n:,} exceeds the file size ({size:,} bytes)", path, _FIX
        )
    return n


def _read_header_blob(path: Any) -> tuple[int, int, bytes]:
    """Read the header bytes of a safetensors file (after the 8-byte length); a local file is opened with
    :func:`regular.open_regular` (a FIFO, device or folder is refused by name, never read).

    Returns:
        ``(file size, offset of the data (8 + the header length), header bytes)``.

    Raises:
        CheckpointError: not a regular file, a file too short for the length, a length over the file size or
            100,000,000 bytes, or a file that cannot be read.
    """
    if store.is_remote(path):
        size = store.size(path)
        n = _header_length(store.read_range(path, 0, 8), size, path)
        return size, 8 + n, store.read_range(path, 8, n)
    with regular.open_regular(path, "the safetensors file") as f:
        try:
            size = os.fstat(f.fileno()).st_size
            n = _header_length(f.read(8), size, path)
            blob = f.read(n)
        except OSError as e:
            raise CheckpointError(f"cannot read: {e.strerror}", path, "check the file") from None
    if len(blob) != n:
        raise CheckpointError("the safetensors file ended while its header was read", path, _FIX)
    return size, 8 + n, blob


def _parse_header(
    text: str, path: Any, int_hook: Callable[[str], Any] | None, surrogates: bool
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """Parse the header JSON of ``path`` strictly (:func:`regular.parse_json` with the library's nesting
    limit and number rules; ``int_hook``, ``surrogates`` from :func:`_decode`).

    Returns:
        ``(tensor entries by name, __metadata__ or None)``.

    Raises:
        CheckpointError: not JSON, not an object, a lone surrogate escape, or a ``__metadata__`` that is not
            null or str → str.
    """
    # nesting: the parser's own recursion limit refuses the deepest (RecursionError), and _check_nesting
    # the rest, on the few values that are not entries (scanning 100 MB of text for it took seconds)
    header = regular.parse_json(
        text, path, "the safetensors header", len(text), pairs_hook=_header_pairs, int_hook=int_hook
    )
    if not isinstance(header, dict):
        raise CheckpointError(f"the safetensors header is not a JSON object, {_LIB}", path, _FIX)
    _check_nesting(header, path)
    if surrogates:
        try:
            json.dumps([*header.items()], ensure_ascii=False, default=lambda _: None).encode("utf-8")
        except UnicodeEncodeError:
            raise CheckpointError(
                f"the safetensors header has a lone surrogate escape (\\ud800-\\udfff), {_LIB}", path, _FIX
            ) from None
    meta = header.pop("__metadata__", None)
    if type(meta) is tuple:  # a metadata map whose keys happen to be the three entry fields
        meta = dict(zip(_ENTRY_KEYS, meta, strict=True))
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(
            f"the safetensors __metadata__ is not a map of strings to strings, {_LIB}", path, _FIX
        )
    return header, meta


_NESTS = (dict, list, tuple, TensorInfo)


def _check_nesting(header: dict[str, Any], path: Any) -> None:
    """The header nests at most :data:`HEADER_DEPTH` levels (the header object is level 1; an entry made
    by :func:`_header_pairs` is at most 3). Iterative: the values may nest hundreds of levels.

    Raises:
        CheckpointError: nested deeper, as the library's parser refuses it.
    """
    todo = [(v, 2) for v in header.values() if type(v) is not TensorInfo]
    while todo:
        v, level = todo.pop()
        if level > HEADER_DEPTH:
            raise CheckpointError(
                f"the safetensors header is nested more than {HEADER_DEPTH} levels deep, {_LIB}", path, _FIX
            )
        if isinstance(v, dict):
            todo += [(x, level + 1) for x in v.values() if isinstance(x, _NESTS)]
        elif isinstance(v, list | tuple):
            todo += [(x, level + 1) for x in v if isinstance(x, _NESTS)]
        elif type(v) is TensorInfo and level + 1 > HEADER_DEPTH:  # its shape list was one level deeper
            todo.append(([], level + 1))


def _entry_fields(name: str, h: Any, path: Any) -> tuple[Any, Any, Any]:
    """``(dtype, shape, data_offsets)`` of header entry ``name: h`` that :func:`_header_pairs` left as it
    was: an object with the fields in another order or beside unknown fields (which the library ignores),
    or the list of the three (serde reads a struct from a sequence too).

    Raises:
        CheckpointError: not an object or list of the three fields, naming the rule.
    """
    if isinstance(h, dict) and all(k in h for k in _ENTRY_KEYS):
        return h["dtype"], h["shape"], h["data_offsets"]
    if isinstance(h, list) and len(h) == 3:
        return h[0], h[1], h[2]
    raise CheckpointError(
        f"tensor {name!r}: a header entry must be an object with dtype, shape and data_offsets, {_LIB}",
        path,
        _FIX,
    )


def _dtype(name: str, dtype: Any, path: Any) -> DType:
    """The :class:`DType` of label ``dtype`` (a string, or ``{"F32": null}``, as serde reads a unit variant).

    Raises:
        CheckpointError: a label the format does not define, or not a string.
    """
    if isinstance(dtype, dict) and len(dtype) == 1 and next(iter(dtype.values())) is None:
        dtype = next(iter(dtype))
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise CheckpointError(
        f"tensor {name!r} has dtype {str(dtype)[:40]!r}, not a safetensors dtype ({', '.join(DTYPES)})",
        path,
        "a dtype newer than tietool is not read yet (please report it); else the header is damaged: "
        "re-export the file",
    )


def _tensor_info(name: str, h: Any, rel: str, data_start: int, path: Any) -> TensorInfo:
    """The :class:`TensorInfo` of header entry ``name: h`` (offsets made absolute with ``data_start``), for
    the entries :func:`_quick_info` could not make, so that the broken rule is named. Integers beyond 64
    bits are floats here (:func:`_header_int`), so an ``int`` is in range once it is not negative.

    Raises:
        CheckpointError: a malformed entry (:func:`_entry_fields`), an unknown dtype, a shape that is not a
            list of non-negative integers, offsets that are not two, an end before the begin, an element
            or bit count that overflows 64 bits, a packed dtype that does not end on a byte, or a byte count
            that is not shape × dtype bits / 8; each naming the rule.
    """
    dtype, shape, offsets = h if type(h) is tuple else _entry_fields(name, h, path)
    dt = DTYPES.get(dtype) if type(dtype) is str else None
    if dt is None:
        dt = _dtype(name, dtype, path)
    if type(shape) is not list:
        raise _bad_shape(name, shape, path)
    numel = 1
    for d in shape:  # in order, as the library's checked_mul fold: an overflow on the way is refused
        if type(d) is not int or d < 0:
            raise _bad_shape(name, shape, path)
        numel *= d
        if numel > U64_MAX:
            raise _too_big(name, shape, "element count", path)
    if type(offsets) is not list or len(offsets) != 2:
        raise _bad_offsets(name, offsets, path)
    begin, end = offsets
    if type(begin) is not int or type(end) is not int or begin < 0 or end < 0:
        raise _bad_offsets(name, offsets, path)
    if end < begin:
        raise CheckpointError(
            f"tensor {name!r} ends (byte {end}) before it begins ({begin}), {_LIB}", path, _FIX
        )
    bits = numel * dt.bits
    if bits > U64_MAX:
        raise _too_big(name, shape, "size in bits", path)
    if bits % 8 or end - begin != bits >> 3:
        need = f"{bits // 8}" if bits % 8 == 0 else f"{numel} × {dt.bits} bits, not whole bytes"
        raise CheckpointError(
            f"tensor {name!r} has {end - begin} bytes but shape {shape} × {dt.st} needs {need}, {_LIB}",
            path,
            _FIX,
        )
    key = tuple(shape)
    return TensorInfo(name, dt.st, key, rel, data_start + begin, end - begin)


def _bad_shape(name: str, shape: Any, path: Any) -> CheckpointError:
    return CheckpointError(
        f"tensor {name!r} has shape {str(shape)[:60]}: a shape must be a list of integers in [0, 2**64), "
        f"not strings, floats, booleans or negative numbers, {_LIB}",
        path,
        _FIX,
    )


def _bad_offsets(name: str, offsets: Any, path: Any) -> CheckpointError:
    return CheckpointError(
        f"tensor {name!r} has data_offsets {str(offsets)[:60]}: they must be two integers in "
        f"[0, 2**64), {_LIB}",
        path,
        _FIX,
    )


def _too_big(name: str, shape: list, what: str, path: Any) -> CheckpointError:
    return CheckpointError(
        f"tensor {name!r} has shape {shape[:8]}, whose {what} overflows 64 bits, {_LIB}", path, _FIX
    )


def _check_tiling(tensors: list[TensorInfo], data_start: int, size: int, path: Any) -> None:
    """In data order the tensors must tile the data bytes exactly, as the library requires ("invalid
    offset": each begins where the previous ended, the first at 0; "file not fully covered": the last ends
    at the end of the file). A hole, an overlap or bytes after the last tensor make a file that library
    refuses to open, so neither tietool nor a loader should take it as a checkpoint (and copying it would
    pass the damage on).

    Raises:
        CheckpointError: naming the first tensor out of place, a file shorter than its header says
            (truncated: both sizes), or the uncovered bytes at the end.
    """
    pos = data_start
    for t in tensors:
        if t.offset != pos:
            what = "overlaps the one before it" if t.offset < pos else "leaves a hole before it"
            raise CheckpointError(
                f"tensor {t.name!r} begins at data byte {t.offset - data_start}, not {pos - data_start} "
                f"where the tensor before it ends: it {what}, {_LIB}",
                path,
                "re-export the checkpoint, or load and save it again with the safetensors library",
            )
        pos += t.nbytes
    if pos > size:
        raise CheckpointError(
            f"truncated: the file is {size:,} bytes, its header says {pos:,} ({pos - size:,} bytes missing "
            "at the end: a save or a copy cut short)",
            path,
            "copy or download the file again; if a save is still being written, wait for the save to finish "
            "or use the previous checkpoint-N",
        )
    if pos != size:
        raise CheckpointError(
            f"bytes {pos - data_start}..{size - data_start} of the data belong to no tensor (bytes after the "
            f"last tensor), {_LIB}",
            path,
            "re-export the checkpoint, or load and save it again with the safetensors library",
        )


def read_array(path: Path, t: TensorInfo) -> np.ndarray:
    """One tensor's raw storage (bf16 as ``uint16`` bits) from ``path``; reads only its bytes (large
    tensors are memory-mapped read-only, see :func:`map_array`).

    Raises:
        RefusedError: a packed sub-byte dtype (``F4``, ``F6_*``): no array holds its elements.
        CheckpointError: the file ends before the tensor's bytes.
    """
    require_array(t, path)
    m = map_array(path, t.offset, t.nbytes, t.storage_dtype, t.shape)
    if m is not None:
        return m
    buf = store.read_range(path, t.offset, t.nbytes)  # remote: one range request
    if len(buf) != t.nbytes:
        raise CheckpointError(f"tensor {t.name!r} is truncated", path, "re-download or re-export the file")
    return np.frombuffer(buf, dtype=t.storage_dtype).reshape(t.shape)


class Source:
    """Where a tensor's bytes come from when writing: a byte range of an input file, an array, or a
    concatenation of those (``parts``: e.g. the old rows by range, then the new rows from memory)."""

    __slots__ = ("path", "offset", "nbytes", "array", "parts")

    def __init__(
        self,
        path: Path | None = None,
        offset: int = 0,
        nbytes: int = 0,
        array: np.ndarray | None = None,
        parts: list[Source] | None = None,
    ):
        self.path, self.offset, self.nbytes, self.array, self.parts = path, offset, nbytes, array, parts
        if array is not None:
            self.nbytes = array.nbytes
        if parts is not None:
            self.nbytes = sum(p.nbytes for p in parts)

    def prefix(self, nbytes: int) -> Source:
        """The first ``nbytes`` of a range, flat array or concatenated source (parts: the leading ones
        whole, the last one cut)."""
        if self.parts is not None:
            head: list[Source] = []
            for p in self.parts:
                if nbytes <= 0:
                    break
                head.append(p if p.nbytes <= nbytes else p.prefix(nbytes))
                nbytes -= head[-1].nbytes
            return Source(parts=head)
        if self.array is not None:
            return Source(array=np.ascontiguousarray(self.array).reshape(-1).view(np.uint8)[:nbytes])
        return Source(self.path, self.offset, nbytes)

    @property
    def small_range(self) -> bool:
        """A local file's range shorter than :data:`SMALL_RANGE` (copied by :func:`_write_small_ranges`)."""
        return (
            self.parts is None
            and self.array is None
            and self.path is not None
            and 0 < self.nbytes < SMALL_RANGE
            and not store.is_remote(self.path)
        )

    def write_to(self, f: BinaryIO) -> None:
        """Append the bytes to ``f``: ranges by :func:`copy_range` (a run of small ranges of one file by
        :func:`_write_small_ranges`), arrays without an extra copy."""
        if self.parts is not None:
            at = 0
            with contextlib.ExitStack() as opened:
                files: dict[Any, int] = {}  # the input files of small ranges, each opened once

                def fd_of(path: Any) -> int:
                    if path not in files:
                        files[path] = opened.enter_context(open(path, "rb")).fileno()
                    return files[path]

                while at < len(self.parts):
                    if self.parts[at].small_range:
                        at = _write_small_ranges(self.parts, at, f, fd_of)
                    else:
                        self.parts[at].write_to(f)
                        at += 1
        elif self.array is not None:
            a = np.ascontiguousarray(self.array)
            if a.size:
                f.write(a.reshape(-1).data.cast("B"))  # the array's buffer as bytes, no copy
        elif self.path is None:
            raise ValueError("a Source needs a path, an array or parts")
        else:
            copy_range(f, self.path, self.offset, self.nbytes)


SMALL_RANGE = 1 << 20
"""Ranges shorter than this (a few rows each, as a keep-list or a token map cuts a vocabulary table) are read
and written from user space: ``copy_file_range`` costs ~80 µs a call, an ``open`` per range more."""


def _write_small_ranges(parts: list[Source], at: int, dst: BinaryIO, fd_of: Callable[[Any], int]) -> int:
    """Append ``parts[at]`` and the small ranges of the same file that follow it (each
    :attr:`Source.small_range`) to ``dst`` by ``pread`` of ``fd_of(path)`` (the file opened once for all
    the parts); the index after the last one written.

    Raises:
        CheckpointError: the input ends before a range's end.
    """
    path = parts[at].path
    fd = fd_of(path)
    while at < len(parts) and parts[at].small_range and parts[at].path == path:
        p = parts[at]
        buf = os.pread(fd, p.nbytes, p.offset)
        if len(buf) != p.nbytes:
            raise CheckpointError("input ended early while copying", path, "the file is truncated")
        dst.write(buf)
        at += 1
    return at


def copy_range(
    dst: BinaryIO,
    src_path: Path,
    offset: int,
    nbytes: int,
    chunk: int = 64 << 20,
    cancelled: Callable[[], bool] | None = None,
    advance: Callable[[int], None] | None = None,
) -> None:
    """Append ``nbytes`` of ``src_path`` starting at ``offset`` to ``dst``, in bounded memory.

    Uses ``os.copy_file_range`` (a kernel copy, no user-space buffer) where the platform has it, and
    falls back to chunked reads where it does not (other file systems, other OSes).

    Args:
        cancelled: polled between kernel calls of at most 256 MiB; when it returns True the copy stops
            early (the caller is abandoning the output).
        advance: called with the number of bytes copied after each step (for a progress bar).

    Raises:
        CheckpointError: the input ends before ``offset + nbytes``.
    """
    if nbytes == 0:
        return  # an empty tensor: nothing to copy (a header may hold millions; no open per tensor)
    dst.flush()
    if store.is_remote(src_path):
        _copy_remote_range(dst, src_path, offset, nbytes, cancelled, advance)
        return
    pos, left = offset, nbytes
    step = 1 << 30 if cancelled is None and advance is None else 256 << 20
    with open(src_path, "rb") as src:
        if hasattr(os, "copy_file_range"):
            try:
                while left:
                    if cancelled is not None and cancelled():
                        return
                    n = os.copy_file_range(src.fileno(), dst.fileno(), min(left, step), pos)
                    if n == 0:
                        break
                    pos += n
                    left -= n
                    if advance is not None:
                        advance(n)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
            dst.seek(0, os.SEEK_END)
        src.seek(pos)
        while left:
            if cancelled is not None and cancelled():
                return
            buf = src.read(min(chunk, left))
            if not buf:
                raise CheckpointError("input ended early while copying", src_path, "the file is truncated")
            dst.write(buf)
            left -= len(buf)
            if advance is not None:
                advance(len(buf))


def _copy_remote_range(
    dst: BinaryIO,
    src: Any,
    offset: int,
    nbytes: int,
    cancelled: Callable[[], bool] | None,
    advance: Callable[[int], None] | None,
) -> None:
    """:func:`copy_range` from a remote file: range requests of ``store.STREAM_CHUNK`` bytes, each written
    before the next is fetched (memory: one chunk).

    Raises:
        CheckpointError: the object ends before ``offset + nbytes``, or a request failed (naming it).
    """
    pos, left = offset, nbytes
    while left:
        if cancelled is not None and cancelled():
            return
        buf = store.read_range(src, pos, min(store.STREAM_CHUNK, left))
        if not buf:
            raise CheckpointError("input ended early while copying", str(src), "the file is truncated")
        dst.write(buf)
        pos += len(buf)
        left -= len(buf)
        if advance is not None:
            advance(len(buf))


def _header_blob(
    tensors: list[tuple[str, str, tuple[int, ...], Source]], metadata: dict | None
) -> tuple[bytearray, int]:
    """The header :func:`write_file` writes (:func:`header_bytes` of each tensor's source size).

    Returns:
        ``(header bytes, bytes of tensor data)``.
    """
    return header_bytes(((n, d, s, src.nbytes) for n, d, s, src in tensors), metadata)


def header_bytes(
    tensors: Iterable[tuple[str, str, tuple[int, ...], int]], metadata: dict | None
) -> tuple[bytearray, int]:
    """The header of tensors ``(name, dtype label, shape, nbytes)`` laid out in this order from byte 0:
    byte for byte ``json.dumps(header, separators=(",", ":"))`` padded with spaces to a multiple of 8 (data
    8-byte aligned, as the reference writer does), built entry by entry into one buffer (a dict per entry
    costs ~400 bytes: 640 MB for a header of 1.6 M tensors). The writer and the read-back of a large header
    (:func:`surgery.io.readback.check_safetensors`) both use it.

    Returns:
        ``(header bytes, bytes of tensor data)``.
    """
    out = bytearray(b"{")
    if metadata:
        meta = {str(k): str(v) for k, v in metadata.items()}
        out += b'"__metadata__":' + json.dumps(meta, separators=(",", ":")).encode() + b","
    pos = 0
    for name, dtype, shape, nbytes in tensors:
        end = pos + nbytes
        out += (
            f'{_json_str(name)}:{{"dtype":{_json_str(dtype)},"shape":[{",".join(map(str, shape))}],'
            f'"data_offsets":[{pos},{end}]}},'
        ).encode()
        pos = end
    if len(out) > 1:
        out[-1:] = b"}"
    else:
        out += b"}"
    out += b" " * (-len(out) % 8)
    return out, pos


_json_str = json.encoder.encode_basestring_ascii  # as json.dumps quotes keys (ensure_ascii)


def write_file(
    path: Path, tensors: Iterable[tuple[str, str, tuple[int, ...], Source]], metadata: dict | None
) -> int:
    """Write a safetensors file, streaming each tensor's bytes from its :class:`Source`.

    Args:
        path: output file.
        tensors: ``(name, dtype label, shape, source)`` in the order the data should be laid out.
        metadata: ``__metadata__`` (str → str) or None.

    Returns:
        bytes of tensor data written (what an index's ``total_size`` counts).
    """
    tensors = list(tensors)
    blob, pos = _header_blob(tensors, metadata)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, _, src in tensors:
            src.write_to(f)
        f.flush()
        os.fsync(f.fileno())
    return pos


def write_rows(
    path: Path,
    header: Iterable[tuple[str, str, tuple[int, ...], int]],
    sources: Iterable[tuple[int, Source]],
    metadata: dict | None,
) -> int:
    """:func:`write_file` without a list of sources: the header from ``header`` (``(name, dtype label,
    shape, nbytes)`` in data order), then each tensor's bytes from ``sources`` (``(planned nbytes,
    source)`` in the same order), each source made only when its bytes are written. A checkpoint of
    millions of tensors then never holds a :class:`Source` per tensor at once.

    Returns:
        bytes of tensor data written.

    Raises:
        AssertionError: a source holds another size than its header entry (a bug). OSError: the write.
    """
    blob, pos = header_bytes(header, metadata)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        del blob
        written = 0
        for nbytes, src in sources:
            if src.nbytes != nbytes:
                raise AssertionError(f"internal: a source of {src.nbytes} bytes for {nbytes} planned")
            src.write_to(f)
            written += nbytes
        if written != pos:
            raise AssertionError(f"internal: {written} bytes of tensors written, the header plans {pos}")
        f.flush()
        os.fsync(f.fileno())
    return pos
