"""Tensor by tensor comparison of two checkpoints in bounded memory: each tensor read once in row chunks
of :data:`DIFF_CHUNK` bytes (two chunks held, or one whole tensor of a merged view), ``B``'s read in a
worker thread while ``A``'s is read; bit-identical chunks told by a comparison at memory speed (in two
threads) and skipped; only the rows of a chunk whose bits differ are decoded and measured.

Measures, for a tensor in both checkpoints (decoded to float64: bf16 by bit shift, float16/float32 and
integers exactly): ``max_abs_diff`` (max |B − A|; equal values, the same infinity and NaN against NaN
count 0, a NaN against a number counts inf), ``relative_norm`` (‖B − A‖₂ / ‖A‖₂ over the part both hold;
inf when ‖A‖ is 0 and they differ) and, for a vocabulary tensor, the token ids whose row (column of a
``[hidden, vocab]`` head, element of a bias) differs, rows only one side holds included. ‖A‖ is
accumulated (:func:`square_sum`) from every chunk read once the tensor is known to differ, and from the
identical chunks before its first difference in a second read of those chunks of ``A``.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..inspect.chunked import CHUNK_BYTES, same_bytes
from ..io.checkpoint import Checkpoint
from ..model.tensor import TensorInfo, bf16_bits_to_f32

RANGES_SHOWN = 1000  # row ranges listed per tensor (the count is always exact)
DIFF_CHUNK = 4 * CHUNK_BYTES  # 16 MiB a chunk: a quarter of the per-chunk Python cost of 4 MiB
_SAMPLES = 8  # rows read for a rename candidate's fingerprint


@dataclass
class Rows:
    """Token ids (indices along a vocabulary axis) whose entries differ, as half-open ranges."""

    axis: int
    count: int = 0
    ranges: list[list[int]] = field(default_factory=list)
    common: int = 0  # entries both tensors hold along the axis

    def add(self, ids: np.ndarray) -> None:
        """Add sorted ids, each larger than every id added before."""
        for i in ids.tolist():
            if self.ranges and self.ranges[-1][1] == i:
                self.ranges[-1][1] = i + 1
            else:
                self.ranges.append([i, i + 1])
        self.count += int(ids.size)

    def add_span(self, start: int, stop: int) -> None:
        """Add every id of ``start:stop`` (rows only one side holds)."""
        if stop > start:
            self.add(np.arange(start, stop))

    def as_dict(self) -> dict:
        shown = self.ranges[:RANGES_SHOWN]
        return {
            "axis": self.axis,
            "count": self.count,
            "ranges": shown,
            "ranges_truncated": len(self.ranges) > len(shown),
            "common": self.common,
        }


@dataclass
class Measure:
    """What :func:`compare` found for one tensor (``identical``: every stored bit equal)."""

    identical: bool
    max_abs_diff: float | None = None
    relative_norm: float | None = None
    rows: Rows | None = None
    note: str | None = None


def _row_bytes(t: TensorInfo) -> int:
    return t.nbytes // t.shape[0] if t.shape and t.shape[0] else max(1, t.nbytes)


def _chunk_rows(*infos: TensorInfo) -> int:
    return max(1, DIFF_CHUNK // max(1, *(_row_bytes(t) for t in infos)))


def _chunks(ck: Checkpoint, name: str, n: int, start: int = 0, stop: int | None = None):
    """Rows ``start:stop`` of ``name`` in chunks of ``n`` rows (a 0-d tensor: itself once): mapped from
    the file where the tensor is one byte range of a local file (:func:`_mapped`), else read
    (:meth:`Checkpoint.iter_rows`)."""
    t = ck.tensors[name]
    if not t.shape:
        yield ck.load(name)
        return
    simple = not (t.fortran or t.inline is not None or t.pieces is not None or t.nbytes == 0)
    path = ck.path / t.file if simple and ck.local and t.file else None
    if path is not None and path.is_file() and t.offset + t.nbytes <= path.stat().st_size:
        yield from _mapped(path, t, ck.fmt.row_dtype(t), n, start, t.shape[0] if stop is None else stop)
        return
    yield from ck.iter_rows(name, n, start, stop)


def _mapped(path: Path, t: TensorInfo, dt: Any, n: int, start: int, stop: int) -> Iterator[np.ndarray]:
    """Rows ``start:stop`` of the C-ordered tensor ``t`` stored at ``t.offset`` of ``path``, ``n`` rows a
    chunk, each an array over a read-only memory map of its bytes alone (unmapped when the array is
    dropped): the page cache is compared in place, with no copy into a buffer (a third of the CPU time
    of reading it, measured by bench/diff.py), and no more than a chunk is mapped at a time."""
    rows = t.shape[0]
    row_bytes = t.nbytes // rows
    shape = tuple(t.shape[1:])
    item = np.dtype(dt).itemsize
    with open(path, "rb") as f:
        for s in range(start, stop, n):
            k = min(n, stop - s)
            off, length = t.offset + s * row_bytes, k * row_bytes
            base = off - off % mmap.ALLOCATIONGRANULARITY
            mm = mmap.mmap(f.fileno(), off + length - base, offset=base, access=mmap.ACCESS_READ)
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_WILLNEED)
            yield np.frombuffer(mm, dtype=dt, count=length // item, offset=off - base).reshape((k, *shape))


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` as the widest unsigned integers that divide them (u64 compares 8 bytes a step)."""
    b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    for w in (8, 4, 2):
        if b.size % w == 0:
            return b.view(f"<u{w}")
    return b


def bits_equal(x: np.ndarray, y: np.ndarray) -> bool:
    """``x`` and ``y`` hold the same bytes; from 1 MiB on, the first half compared in the worker thread
    while this one compares the second (numpy releases the GIL)."""
    if x.nbytes != y.nbytes:
        return False
    bx, by = _bytes_of(x), _bytes_of(y)
    if x.nbytes < 1 << 20:
        return bool(np.array_equal(bx, by))
    h = bx.size // 2
    first = _pool().submit(np.array_equal, bx[:h], by[:h])
    second = bool(np.array_equal(bx[h:], by[h:]))
    return bool(first.result()) and second


def _elem_bits(a: np.ndarray) -> np.ndarray:
    """``a``'s elements as unsigned integers of their size (comparable bit for bit), shape ``a.shape``;
    16-byte elements as pairs of u8 (shape + (2,))."""
    a = np.ascontiguousarray(a)
    size = a.dtype.itemsize
    if size in (1, 2, 4, 8):
        return a.view(f"<u{size}")
    return a.view(np.uint64).reshape(*a.shape, -1)


def square_sum(
    ck: Checkpoint, t: TensorInfo, a: np.ndarray, scratch: list[np.ndarray] | None = None
) -> float:
    """Σ a² of a stored chunk, for ‖A‖ over chunks that did not differ: floating point values by float32
    dot products (float64 for float64), bf16 decoded by shift into float32 (exact) a block of
    :data:`_SQ_BLOCK` elements at a time (the block stays in the CPU cache between the shift and the dot:
    half the time of decoding the chunk at once), the blocks' sums added in float64 (relative error
    ~1e-7); integers in float64. From 1 MiB on, the first half is summed in the worker thread.
    ``scratch``: unused (kept for callers)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    if ck.logical_dtype(t) == "bfloat16":
        if flat.nbytes < 1 << 20:
            return _bf16_dot(flat)
        h = flat.size // 2
        first = _pool().submit(_bf16_dot, flat[:h])
        second = _bf16_dot(flat[h:])
        return first.result() + second
    if flat.dtype.kind == "f" and flat.dtype.itemsize <= 4:
        f = flat.astype(np.float32, copy=False)
    else:
        f = flat.astype(np.float64, copy=False)
    if f.nbytes < 1 << 20:
        return _dot(f)
    h = f.size // 2
    first = _pool().submit(_dot, f[:h])
    second = _dot(f[h:])
    return first.result() + second


_SQ_BLOCK = 1 << 18  # bf16 elements decoded at a time by square_sum (a 1 MiB float32 block)


def _bf16_dot(bits: np.ndarray) -> float:
    """Σ v² of bf16 values given as their ``uint16`` bits, decoded block by block into float32."""
    buf = np.empty(min(bits.size, _SQ_BLOCK), np.uint32)
    total = 0.0
    for s in range(0, bits.size, _SQ_BLOCK):
        seg = bits[s : s + _SQ_BLOCK]
        out = buf[: seg.size]
        np.left_shift(seg, 16, out=out, dtype=np.uint32)
        total += _dot(out.view(np.float32))
    return total


def _dot(f: np.ndarray) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.dot(f, f))


def _decode(ck: Checkpoint, t: TensorInfo, a: np.ndarray) -> np.ndarray:
    """A stored chunk as float64 (bf16 bits by shift)."""
    if ck.logical_dtype(t) == "bfloat16":
        return bf16_bits_to_f32(a).astype(np.float64)
    return a.astype(np.float64)


class _Acc:
    """Running max |Δ| and ‖Δ‖² (float64, over the rows that differ) and ‖A‖² (:func:`square_sum`)."""

    def __init__(self) -> None:
        self.max, self.sq_diff, self.sq_a = 0.0, 0.0, 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        """Add decoded elements; equal values (NaN against NaN too) count 0, a NaN against a number inf."""
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(b - a).reshape(-1)
            same = ((a == b) | (np.isnan(a) & np.isnan(b))).reshape(-1)
            d = np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))
            if d.size:
                self.max = max(self.max, float(d.max()))
                self.sq_diff += float(np.dot(d, d))

    def relative(self) -> float:
        if self.sq_diff == 0:
            return 0.0
        return float(np.sqrt(self.sq_diff) / np.sqrt(self.sq_a)) if self.sq_a > 0 else float("inf")


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(1, thread_name_prefix="tietool-diff")
    return _POOL


def _pairs(p: _Pair, n: int, stop: int | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Chunks of ``n`` rows of both tensors, side by side: ``B``'s chunk read in a worker thread while
    ``A``'s is read here (the reads and numpy release the GIL: two cores read at once). Each chunk is valid
    until the next pair is asked for."""
    it_a, it_b = _chunks(p.A, p.a, n, 0, stop), _chunks(p.B, p.b, n, 0, stop)
    end = object()
    while True:
        fut = _pool().submit(next, it_b, end)
        try:
            x = next(it_a, end)
        finally:
            y = fut.result()
        if x is end or y is end:
            if x is not y:
                raise ValueError(f"{p.a}: the two sides yield a different number of chunks")
            return
        yield x, y  # type: ignore[misc]


def _axis_ids(differ: np.ndarray, axis: int) -> np.ndarray:
    """Indices along ``axis`` of a chunk's element mask where any element differs."""
    if differ.ndim == 0:
        return np.flatnonzero(np.atleast_1d(differ))
    other = tuple(k for k in range(differ.ndim) if k != axis)
    return np.flatnonzero(differ.any(axis=other) if other else differ)


@dataclass
class _Pair:
    A: Checkpoint
    B: Checkpoint
    a: str
    b: str

    @property
    def ta(self) -> TensorInfo:
        return self.A.tensors[self.a]

    @property
    def tb(self) -> TensorInfo:
        return self.B.tensors[self.b]


def compare(A: Checkpoint, B: Checkpoint, name: str, axis: int | None) -> Measure:
    """Compare tensor ``name`` of ``A`` and ``B``; ``axis``: its vocabulary axis (rows differing are
    listed along it), or None.

    Same shape: every element; a shape that differs only along ``axis``: the part both hold, the entries
    beyond counted as differing rows; any other shape change: not compared (``note`` says so). A dtype
    tietool does not decode (float8, float4, float6, complex) is compared bit for bit only
    (``max_abs_diff`` None). Memory: two chunks, or the whole tensor of a merged view.
    """
    p = _Pair(A, B, name, name)
    ta, tb = p.ta, p.tb
    if ta.shape != tb.shape:
        return _compare_resized(p, axis)
    same_dtype = A.logical_dtype(ta) == B.logical_dtype(tb)
    decodable = ta.st_dtype.decodable and tb.st_dtype.decodable
    if ta.st_dtype.packed or tb.st_dtype.packed or not (same_dtype or decodable):
        equal = same_dtype and same_bytes(A, B, name)
        return Measure(equal, note=None if equal else "values of this dtype are not decoded: bytes differ")
    ax = None if axis is None else axis % max(1, len(ta.shape))
    rows = Rows(ax, common=ta.shape[ax]) if ax is not None and ta.shape else None
    return _walk(p, rows, same_dtype, decodable, None)


def _walk(p: _Pair, rows: Rows | None, same_dtype: bool, decodable: bool, common: int | None) -> Measure:
    """The chunk loop of :func:`compare` (``common``: entries compared along ``rows.axis`` when the
    shapes differ there)."""
    n = _chunk_rows(p.ta, p.tb)
    acc, differs, start = _Acc(), False, 0
    equal_spans: list[tuple[int, int]] = []
    scratch: list[np.ndarray] = []
    stop = common if rows is not None and rows.axis == 0 and common is not None else None
    cut = None
    if common is not None and rows is not None and rows.axis:
        cut = tuple(slice(None) if k != rows.axis else slice(0, common) for k in range(len(p.ta.shape)))
    for x, y in _pairs(p, n, stop):
        m = len(x) if x.ndim else 1
        if cut is not None:
            x, y = x[cut], y[cut]
        if same_dtype and bits_equal(x, y):
            if differs and decodable:  # the tensor differs already: ‖A‖ of this chunk now, while it is here
                acc.sq_a += square_sum(p.A, p.ta, x, scratch)
            else:
                equal_spans.append((start, start + m))
        else:
            differs = True
            _differing(p, x, y, same_dtype, decodable, acc, scratch)
            if rows is not None:
                mask = _mask(p, x, y, same_dtype)
                ids = _axis_ids(mask, rows.axis)
                rows.add(ids + start if rows.axis == 0 else ids)
        start += m
    x = y = None  # type: ignore[assignment]  # the last chunks' buffers freed before a second read
    if differs and decodable:
        for s, e in equal_spans:  # ‖A‖ of the identical chunks before the first difference: read again
            for x in _chunks(p.A, p.a, n, s, e):
                acc.sq_a += square_sum(p.A, p.ta, x if cut is None else x[cut], scratch)
    if rows is not None and rows.axis != 0 and rows.ranges:
        _merge_ranges(rows)
    out = Measure(not differs, rows=rows)
    if differs and decodable:
        out.max_abs_diff, out.relative_norm = acc.max, acc.relative()
    return out


def _mask(p: _Pair, x: np.ndarray, y: np.ndarray, same_dtype: bool) -> np.ndarray:
    """Where the elements of two chunks differ: bit for bit (same dtype), else by value."""
    if same_dtype:
        bx, by = _elem_bits(x), _elem_bits(y)
        return bx != by if bx.ndim == x.ndim else (bx != by).any(axis=-1)
    a, b = _decode(p.A, p.ta, x), _decode(p.B, p.tb, y)
    with np.errstate(invalid="ignore"):
        return ~((a == b) | (np.isnan(a) & np.isnan(b)))


def _differing(
    p: _Pair, x: np.ndarray, y: np.ndarray, same_dtype: bool, decodable: bool, acc: _Acc, scratch: list
) -> None:
    """Measure a chunk pair that is not bit-identical: ‖A‖² of the whole chunk, max |Δ| and ‖Δ‖² (float64)
    of its rows (axis 0) that differ only (a dtype change: every row)."""
    if not decodable:
        return
    acc.sq_a += square_sum(p.A, p.ta, x, scratch)
    if same_dtype and x.ndim:
        bx, by = _elem_bits(x), _elem_bits(y)
        diff = bx != by
        r = np.flatnonzero(diff.reshape(len(x), -1).any(axis=1)) if diff.size else np.zeros(0, np.intp)
        x, y = x[r], y[r]
    acc.add(_decode(p.A, p.ta, x), _decode(p.B, p.tb, y))


def _merge_ranges(rows: Rows) -> None:
    """Column ids are added chunk after chunk, each chunk naming every differing column again: make them
    one sorted set."""
    ids = sorted({i for a, b in rows.ranges for i in range(a, b)})
    rows.ranges, rows.count = [], 0
    rows.add(np.array(ids, dtype=np.int64))


def _compare_resized(p: _Pair, axis: int | None) -> Measure:
    """Shapes that differ: along the vocabulary axis only, the common part compared and the entries only
    one side holds counted as differing rows; otherwise not compared."""
    sa, sb = p.ta.shape, p.tb.shape
    ax = None if axis is None or not sa else axis % len(sa)
    if ax is None or len(sa) != len(sb) or any(sa[k] != sb[k] for k in range(len(sa)) if k != ax):
        return Measure(False, note="the shape changed: values not compared")
    same_dtype = p.A.logical_dtype(p.ta) == p.B.logical_dtype(p.tb)
    decodable = p.ta.st_dtype.decodable and p.tb.st_dtype.decodable
    if p.ta.st_dtype.packed or p.tb.st_dtype.packed or not (same_dtype or decodable):
        return Measure(False, note="the shape changed; values of this dtype are not decoded")
    common = min(sa[ax], sb[ax])
    rows = Rows(ax, common=common)
    m = _walk(p, rows, same_dtype, decodable, common)
    rows.add_span(common, max(sa[ax], sb[ax]))
    m.identical = False
    if m.max_abs_diff is None and decodable:
        m.max_abs_diff, m.relative_norm = 0.0, 0.0
    return m


# ------------------------------------------------------------------ renames


def fingerprint(ck: Checkpoint, name: str) -> tuple:
    """A cheap key of ``name``'s content: its shape, logical dtype and the digest of up to
    :data:`_SAMPLES` rows spread over it (equal tensors have equal keys; :func:`renames` confirms a match
    by every byte)."""
    t = ck.tensors[name]
    h = hashlib.blake2b(digest_size=16)
    if not t.shape or t.shape[0] == 0 or t.nbytes == 0:
        h.update(np.ascontiguousarray(ck.load(name)).tobytes() if t.nbytes else b"")
    else:
        picks = sorted({int(i) for i in np.linspace(0, t.shape[0] - 1, min(_SAMPLES, t.shape[0]))})
        for i in picks:
            h.update(np.ascontiguousarray(next(iter(ck.iter_rows(name, 1, i, i + 1)))).tobytes())
    return (tuple(t.shape), ck.logical_dtype(t), t.nbytes, h.digest())


def renames(A: Checkpoint, B: Checkpoint, removed: list[str], added: list[str]) -> list[tuple[str, str]]:
    """Pairs ``(name in A, name in B)`` among tensors only ``A`` has (``removed``) and only ``B`` has
    (``added``) with the same shape, logical dtype and bytes: matched by :func:`fingerprint` (only tensors
    whose shape and dtype some tensor of the other side shares are read), confirmed by comparing every byte
    (:func:`surgery.inspect.chunked.same_bytes`). Each tensor is in at most one pair; names pair in
    sorted order."""

    def key(ck: Checkpoint, n: str) -> tuple:
        t = ck.tensors[n]
        return (tuple(t.shape), ck.logical_dtype(t), t.nbytes)

    shared = {key(A, n) for n in removed} & {key(B, n) for n in added}
    if not shared:
        return []
    by_print: dict[tuple, list[str]] = {}
    for n in sorted(added):
        if key(B, n) in shared:
            by_print.setdefault(fingerprint(B, n), []).append(n)
    out = []
    for n in sorted(removed):
        if key(A, n) not in shared:
            continue
        cands = by_print.get(fingerprint(A, n), [])
        hit = next((c for c in cands if _same_across(A, B, n, c)), None)
        if hit is not None:
            cands.remove(hit)
            out.append((n, hit))
    return out


def _same_across(A: Checkpoint, B: Checkpoint, a: str, b: str) -> bool:
    """Tensor ``a`` of ``A`` and ``b`` of ``B`` hold the same bytes (in chunks)."""
    return bool(same_bytes(A, B, a, b))


def header(ck: Checkpoint, t: TensorInfo) -> dict[str, Any]:
    """A tensor's header as ``diff`` lists it: name, logical dtype, stored label, shape and where its bytes
    are (``file``, ``offset``, ``nbytes``; a merged view's tensors have no file: None)."""
    return {
        "name": t.name,
        "dtype": ck.logical_dtype(t),
        "stored_dtype": t.dtype,
        "shape": list(t.shape),
        "file": t.file or None,
        "offset": t.offset if t.file and t.offset >= 0 else None,
        "nbytes": t.nbytes,
    }
