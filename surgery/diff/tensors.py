"""Tensor by tensor comparison of two checkpoints in bounded memory: each tensor read once in row chunks
of about :data:`surgery.inspect.chunked.CHUNK_BYTES` (two chunks held, or one whole tensor of a merged
view), bit-identical chunks told by one ``memcmp``-speed comparison and skipped; only chunks whose bits
differ are decoded and measured.

Measures, for a tensor in both checkpoints (decoded to float64: bf16 by bit shift, float16/float32 and
integers exactly): ``max_abs_diff`` (max |B − A|; equal values, the same infinity and NaN against NaN
count 0, a NaN against a number counts inf), ``relative_norm`` (‖B − A‖₂ / ‖A‖₂ over the part both hold;
inf when ‖A‖ is 0 and they differ) and, for a vocabulary tensor, the token ids whose row (column of a
``[hidden, vocab]`` head, element of a bias) differs, rows only one side holds included. ‖A‖ is
accumulated from the differing chunks as they are read, and from the identical ones in a second read of
``A`` only when the tensor turned out to differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..inspect.chunked import CHUNK_BYTES, same_bytes
from ..io.checkpoint import Checkpoint
from ..model.tensor import TensorInfo, bf16_bits_to_f32

RANGES_SHOWN = 1000  # row ranges listed per tensor (the count is always exact)
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
    return max(1, CHUNK_BYTES // max(1, *(_row_bytes(t) for t in infos)))


def _chunks(ck: Checkpoint, name: str, n: int, start: int = 0, stop: int | None = None):
    """Rows ``start:stop`` of ``name`` in chunks of ``n`` rows (a 0-d tensor: itself once)."""
    if not ck.tensors[name].shape:
        yield ck.load(name)
        return
    yield from ck.iter_rows(name, n, start, stop)


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` as the widest unsigned integers that divide them (u64 compares 8 bytes a step)."""
    b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    for w in (8, 4, 2):
        if b.size % w == 0:
            return b.view(f"<u{w}")
    return b


def bits_equal(x: np.ndarray, y: np.ndarray) -> bool:
    """``x`` and ``y`` hold the same bytes."""
    return x.nbytes == y.nbytes and bool(np.array_equal(_bytes_of(x), _bytes_of(y)))


def _elem_bits(a: np.ndarray) -> np.ndarray:
    """``a``'s elements as unsigned integers of their size (comparable bit for bit), shape ``a.shape``;
    16-byte elements as pairs of u8 (shape + (2,))."""
    a = np.ascontiguousarray(a)
    size = a.dtype.itemsize
    if size in (1, 2, 4, 8):
        return a.view(f"<u{size}")
    return a.view(np.uint64).reshape(*a.shape, -1)


def _decode(ck: Checkpoint, t: TensorInfo, a: np.ndarray) -> np.ndarray:
    """A stored chunk as float64 (bf16 bits by shift)."""
    if ck.logical_dtype(t) == "bfloat16":
        return bf16_bits_to_f32(a).astype(np.float64)
    return a.astype(np.float64)


class _Acc:
    """Running max |Δ|, ‖Δ‖² and ‖A‖² over differing chunks."""

    def __init__(self) -> None:
        self.max, self.sq_diff, self.sq_a = 0.0, 0.0, 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Add decoded chunks; returns where the values differ (NaN against NaN equal)."""
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(b - a)
            same = (a == b) | (np.isnan(a) & np.isnan(b))
            d = np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))
            if d.size:
                self.max = max(self.max, float(d.max()))
                self.sq_diff += float(np.einsum("i,i->", d.reshape(-1), d.reshape(-1)))
            self.norm_of(a)
        return ~same

    def norm_of(self, a: np.ndarray) -> None:
        with np.errstate(invalid="ignore", over="ignore"):
            flat = a.reshape(-1)
            self.sq_a += float(np.einsum("i,i->", flat, flat))

    def relative(self) -> float:
        if self.sq_diff == 0:
            return 0.0
        return float(np.sqrt(self.sq_diff) / np.sqrt(self.sq_a)) if self.sq_a > 0 else float("inf")


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
    ta, tb = p.ta, p.tb
    n = _chunk_rows(ta, tb)
    acc, differs, start = _Acc(), False, 0
    equal_spans: list[tuple[int, int]] = []
    stop = common if rows is not None and rows.axis == 0 and common is not None else None
    for x, y in zip(_chunks(p.A, p.a, n, 0, stop), _chunks(p.B, p.b, n, 0, stop), strict=True):
        m = len(x) if x.ndim else 1
        if common is not None and rows is not None and rows.axis:
            cut = tuple(slice(None) if k != rows.axis else slice(0, common) for k in range(x.ndim))
            x, y = x[cut], y[cut]
        if same_dtype and bits_equal(x, y):
            equal_spans.append((start, start + m))
            start += m
            continue
        differs = True
        mask = None
        if decodable:
            mask = acc.add(_decode(p.A, ta, x), _decode(p.B, tb, y))
        if same_dtype:
            bx, by = _elem_bits(x), _elem_bits(y)
            mask = bx != by if bx.ndim == x.ndim else (bx != by).any(axis=-1)
        if rows is not None and mask is not None:
            ids = _axis_ids(mask, rows.axis)
            rows.add(ids + start if rows.axis == 0 else ids)
        start += m
    if differs and decodable:
        for s, e in equal_spans:  # ‖A‖ of the identical chunks: a second read of A, only now
            for x in _chunks(p.A, p.a, n, s, e):
                if common is not None and rows is not None and rows.axis:
                    x = x[tuple(slice(None) if k != rows.axis else slice(0, common) for k in range(x.ndim))]
                acc.norm_of(_decode(p.A, ta, x))
    if rows is not None and rows.axis != 0 and rows.ranges:
        _merge_ranges(rows)
    out = Measure(not differs, rows=rows)
    if differs and decodable:
        out.max_abs_diff, out.relative_norm = acc.max, acc.relative()
    return out


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
