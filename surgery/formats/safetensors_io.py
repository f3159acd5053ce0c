"""safetensors: header parse and a streamed writer.

Why not ``safetensors.safe_open`` / ``save_file``: the numpy binding has no bfloat16 (Paddle checkpoints
are mostly bf16, and we must copy bf16 *bits*, never values), it cannot hand out the byte range of a
tensor (we copy unchanged tensors by range, without decoding), and ``save_file`` needs every tensor in
memory at once (a 100 GB checkpoint). The format is tiny (8-byte length, JSON header, raw data), so we
read and write it here, with the same validation rules as the reference implementation.
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from itertools import pairwise
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .. import store
from ..errors import CheckpointError
from .tensor import DTYPES, TensorInfo, map_array, require_array

# the reference implementation refuses headers over 100 MB
MAX_HEADER = 100 * 1024 * 1024


_FIX = "the file is damaged or not safetensors; re-download or re-export it"


def read_header(
    path: Path, rel: str, blob: tuple[int, int, bytes] | None = None
) -> tuple[list[TensorInfo], dict[str, str] | None]:
    """Parse a safetensors header; reads no tensor data.

    Args:
        path: the file.
        rel: its name relative to the checkpoint folder (stored in each ``TensorInfo.file``).
        blob: the header already fetched (:func:`fetch_headers`), else it is read here.

    Returns:
        ``(tensors in data order, __metadata__ or None)``.

    Raises:
        CheckpointError: truncated file, header larger than the file or 100 MB, invalid JSON, unknown
            dtype, offsets outside the file, overlapping tensors, or a size that is not shape × itemsize.
    """
    size, data_start, raw = blob if blob is not None else _read_header_blob(path)
    header, meta = _parse_header(raw, path)
    out = [_tensor_info(name, h, rel, data_start, size - data_start, path) for name, h in header.items()]
    out.sort(key=lambda t: t.offset)
    for a, b in pairwise(out):  # neighbours in data order
        if b.offset < a.offset + a.nbytes:
            raise CheckpointError(f"tensors {a.name!r} and {b.name!r} overlap", path, _FIX)
    _check_covered(out, data_start, size, path)
    return out, meta


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
    ends = []
    for p, size, raw in zip(paths, sizes, lengths, strict=True):
        if len(raw) < 8:
            raise CheckpointError(f"truncated safetensors file ({size} bytes, no header)", p, _FIX)
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or n + 8 > size:
            raise CheckpointError(
                f"safetensors header length {n} exceeds the file size ({size} bytes) or 100 MB", p, _FIX
            )
        ends.append(8 + n)
    blobs = store.read_ranges(paths, [8] * len(paths), ends)
    return {str(p): (size, end, b) for p, size, end, b in zip(paths, sizes, ends, blobs, strict=True)}


def _read_header_blob(path: Path) -> tuple[int, int, bytes]:
    """Read the header bytes of a safetensors file (after the 8-byte length).

    Returns:
        ``(file size, offset of the data (8 + the header length), header bytes)``.

    Raises:
        CheckpointError: a file too short for the length, a length over the file size or 100 MB, a folder,
            or a file that cannot be read.
    """
    try:
        size = store.size(path)
        raw = store.read_range(path, 0, 8)  # remote: two range requests, the length and then the header
        if len(raw) < 8:
            raise CheckpointError(f"truncated safetensors file ({size} bytes, no header)", path, _FIX)
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or n + 8 > size:
            raise CheckpointError(
                f"safetensors header length {n} exceeds the file size ({size} bytes) or 100 MB",
                path,
                _FIX,
            )
        blob = store.read_range(path, 8, n)
    except IsADirectoryError:
        raise CheckpointError(
            "is a folder, expected a safetensors file", path, "remove or rename it"
        ) from None
    except PermissionError as e:
        raise CheckpointError(f"cannot read: {e.strerror}", path, "check its permissions") from None
    return size, 8 + n, blob


def _parse_header(blob: bytes, path: Path) -> tuple[dict, dict[str, str] | None]:
    """Decode the header JSON of ``path``.

    Returns:
        ``(tensor entries by name, __metadata__ or None)``.

    Raises:
        CheckpointError: not UTF-8 JSON, not an object, or a ``__metadata__`` that is not str → str.
    """
    try:
        header = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(
            f"safetensors header is not valid JSON ({e.__class__.__name__})", path, _FIX
        ) from None
    if not isinstance(header, dict):
        raise CheckpointError("safetensors header is not a JSON object", path, _FIX)
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError("safetensors __metadata__ must map strings to strings", path, _FIX)
    return header, meta


def _tensor_info(name: str, h: Any, rel: str, data_start: int, data_len: int, path: Path) -> TensorInfo:
    """The :class:`TensorInfo` of header entry ``name: h`` (offsets made absolute with ``data_start``).

    Raises:
        CheckpointError: a malformed entry, an unknown dtype, a negative dimension, a range outside the
            ``data_len`` data bytes, or a byte count that is not shape × itemsize.
    """
    try:
        dtype, shape, (begin, end) = h["dtype"], [int(d) for d in h["shape"]], h["data_offsets"]
        begin, end = int(begin), int(end)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise CheckpointError(f"tensor {name!r} has a malformed header entry", path, _FIX) from None
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(
            f"tensor {name!r} has dtype {dtype!r}, which the safetensors format does not define "
            f"(it defines {', '.join(DTYPES)})",
            path,
            "if a newer safetensors release added it, tietool does not read it yet (please report it); "
            "otherwise the header is damaged: re-export the file",
        )
    if any(d < 0 for d in shape):
        raise CheckpointError(f"tensor {name!r} has a negative dimension {shape}", path, _FIX)
    numel = math.prod(shape)  # Python ints: no overflow on absurd shapes
    if not (0 <= begin <= end <= data_len):
        raise CheckpointError(
            f"tensor {name!r} data [{begin}, {end}) lies outside the file's {data_len} data bytes "
            "(truncated?)",
            path,
            _FIX,
        )
    try:
        need = DTYPES[dtype].nbytes(numel)
    except ValueError:  # a packed dtype whose elements do not end on a byte boundary: the library refuses it
        raise CheckpointError(
            f"tensor {name!r} is {dtype} {shape}: {numel} elements of {DTYPES[dtype].bits} bits do not fill "
            "whole bytes, which the safetensors library refuses",
            path,
            _FIX,
        ) from None
    if end - begin != need:
        raise CheckpointError(
            f"tensor {name!r} has {end - begin} bytes but shape {shape} × {dtype} needs {need}",
            path,
            _FIX,
        )
    return TensorInfo(name, dtype, tuple(shape), rel, data_start + begin, end - begin)


def _check_covered(tensors: list[TensorInfo], data_start: int, size: int, path: Path) -> None:
    """The tensors must cover the data bytes exactly, as the ``safetensors`` library requires ("file not
    fully covered"): a hole or bytes after the last tensor make a file that library refuses to open, so
    neither tietool nor a loader should take it as a checkpoint (and copying it would pass the damage on).

    Raises:
        CheckpointError: naming the uncovered byte range.
    """
    pos = data_start
    for t in tensors:  # in data order, no overlaps
        if t.offset != pos:
            break
        pos += t.nbytes
    if pos != size:
        nxt = [t.offset for t in tensors if t.offset > pos]
        end = nxt[0] if nxt else size
        raise CheckpointError(
            f"bytes {pos - data_start}..{end - data_start} of the data belong to no tensor "
            f"({'a hole between tensors' if nxt else 'bytes after the last tensor'}); the safetensors "
            "library refuses such a file",
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
        """The first ``nbytes`` of a range or flat array source."""
        if self.array is not None:
            return Source(array=np.ascontiguousarray(self.array).reshape(-1).view(np.uint8)[:nbytes])
        return Source(self.path, self.offset, nbytes)

    def write_to(self, f: BinaryIO) -> None:
        """Append the bytes to ``f``: ranges by :func:`copy_range`, arrays without an extra copy."""
        if self.parts is not None:
            for p in self.parts:
                p.write_to(f)
        elif self.array is not None:
            a = np.ascontiguousarray(self.array)
            if a.size:
                f.write(a.reshape(-1).data.cast("B"))  # the array's buffer as bytes, no copy
        elif self.path is None:
            raise ValueError("a Source needs a path, an array or parts")
        else:
            copy_range(f, self.path, self.offset, self.nbytes)


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
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    pos = 0
    for name, dtype, shape, src in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + src.nbytes]}
        pos += src.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, _, src in tensors:
            src.write_to(f)
        f.flush()
        os.fsync(f.fileno())
    return pos
