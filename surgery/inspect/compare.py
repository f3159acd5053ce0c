"""Head vs embedding values, compared in row chunks in bounded memory: :func:`compare` (bits, then values as
float32, a transposed or scaled head), the :class:`~surgery.inspect.detection.Drift` of a difference
(:func:`drift_of`) and a storage shared in the file (:func:`shared_storage`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..io.checkpoint import Checkpoint
from ..model.enums import HeadLayout, TieState
from ..model.tensor import bf16_bits_to_f32, f32_to_bf16_bits
from . import chunked
from .detection import DRIFT_EDGES, DRIFT_TOP, Comparison, Drift

if TYPE_CHECKING:
    import numpy as np
else:
    from ..model.lazy import numpy as np


def shared_storage(ckpt: Checkpoint, emb: str, head: str) -> Comparison | None:
    """``exact`` with ``storage_shared`` when the file stores head and embedding as one array (a
    ``.pdparams`` memo alias), told from the file structure without reading values; else None."""
    e_st, h_st = ckpt.tensors[emb].storage, ckpt.tensors[head].storage
    return (
        Comparison(TieState.EXACT, 0.0, 0, storage_shared=True) if e_st is not None and e_st == h_st else None
    )


def _bits_dtype(storage: np.dtype) -> np.dtype | None:
    """The unsigned integer dtype that views ``storage`` as raw bits (None for an unusual item size)."""
    return np.dtype(f"<u{storage.itemsize}") if storage.itemsize in (1, 2, 4, 8) else None


def _chunk_difference(
    a: np.ndarray, b: np.ndarray, e_bf: bool, h_bf: bool, scale: float | None
) -> tuple[np.ndarray, float]:
    """Per-row max |diff| (float32, one value per row of the chunk) and the float64 sum of |diff| of one
    embedding chunk ``a`` and head chunk ``b`` ``[rows, hidden]``, as float32 (NaN equals NaN; another NaN
    difference is infinite); the embedding is scaled first when ``scale`` is set."""
    fa = bf16_bits_to_f32(a) if e_bf else a.astype(np.float32)
    fb = bf16_bits_to_f32(b) if h_bf else b.astype(np.float32)
    if scale is not None:  # the embedding times the scale, rounded to the head's dtype as untie writes it
        fa = fa * np.float32(scale)
        fa = bf16_bits_to_f32(f32_to_bf16_bits(fa)) if h_bf else fa.astype(b.dtype).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.subtract(fa, fb)
        np.abs(d, out=d)
    if not d.size:
        return np.zeros(d.shape[:1], np.float32), 0.0
    if d.dtype == np.float32:  # no NaN in |diff| (a row max is NaN iff its row has one): d as it is
        flat = d.reshape(d.shape[0], -1)
        row_max = flat.max(axis=1)
        if not np.isnan(row_max).any():
            return row_max, float(flat.sum(dtype=np.float64))
    d = np.where(np.isnan(fa) & np.isnan(fb), 0.0, np.where(np.isnan(d), np.inf, d)).astype(
        np.float32, copy=False
    )
    d = d.reshape(d.shape[0], -1)
    return d.max(axis=1), float(d.sum(dtype=np.float64))


def drift_of(row_max: np.ndarray, total: float, hidden: int) -> Drift:
    """The :class:`Drift` of per-row max |Δ| ``row_max`` (float32 ``[V]``) and the float64 sum ``total`` of
    |Δ| over all ``V × hidden`` elements."""
    V = int(row_max.shape[0])
    differing = np.flatnonzero(row_max > 0)
    vals = row_max[differing]
    if differing.size > DRIFT_TOP:  # the rows at or above the k-th largest value (ties kept), then sorted
        kth = np.partition(vals, -DRIFT_TOP)[-DRIFT_TOP]
        keep = vals >= kth
        differing, vals = differing[keep], vals[keep]
    order = np.lexsort((differing, -vals))[:DRIFT_TOP]
    positive = row_max[row_max > 0]
    bins = 1 + np.searchsorted(np.asarray(DRIFT_EDGES, np.float64), positive.astype(np.float64), "left")
    hist = np.bincount(bins, minlength=len(DRIFT_EDGES) + 2)
    hist[0] = V - positive.size
    return Drift(
        rows=V,
        elements=V * hidden,
        differing_rows=int(positive.size),
        max_abs_diff=float(row_max.max()) if V else 0.0,
        mean_abs_diff=total / (V * hidden) if V * hidden else 0.0,
        top_rows=tuple((int(differing[i]), float(vals[i])) for i in order),
        histogram=tuple(int(c) for c in hist),
    )


def _head_row_chunks(
    ckpt: Checkpoint, head: str, hT: np.ndarray | None, chunk_rows: int, start: int, stop: int
) -> Iterator[np.ndarray]:
    """The head's rows ``start:stop`` in chunks of ``chunk_rows``: gathered from ``hT`` (the transpose of a
    ``hidden-vocab`` head) when given, else read as stored."""
    if hT is None:
        return ckpt.iter_rows(head, chunk_rows, start, stop)
    return (np.ascontiguousarray(hT[s : min(s + chunk_rows, stop)]) for s in range(start, stop, chunk_rows))


HALVES_BYTES = 64 << 20
"""A table of this many bytes or more is compared in two halves in two threads (:func:`_in_halves`)."""
CHUNK_BYTES = 1 << 20
"""The size of the row chunks :func:`compare` reads (see there)."""


def _in_halves(part: Callable[[int, int], float], n: int, nbytes: int) -> float:
    """``part`` over rows 0:n, in two halves in two threads for a table of :data:`HALVES_BYTES` or more
    (reads and numpy release the GIL, so a multi-GB pair compares ~2x faster): the sum of the parts."""
    if nbytes >= HALVES_BYTES:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            parts = list(pool.map(lambda r: part(*r), [(0, n // 2), (n // 2, n)]))
    else:
        parts = [part(0, n)]
    return sum(parts)


def _without_reading(ckpt: Checkpoint, emb: str, head: str, layout: str) -> Comparison | None:
    """The :class:`Comparison` of a pair told without reading values row by row: one storage
    (:func:`shared_storage`), shapes that differ (``different``), a dtype numpy cannot decode (compared
    by bytes, :func:`_compare_undecodable`); None when the rows must be read."""
    shared = shared_storage(ckpt, emb, head)
    if shared is not None:
        return shared
    e_info, h_info = ckpt.tensors[emb], ckpt.tensors[head]
    eshape = tuple(e_info.shape)
    hshape = tuple(h_info.shape[::-1]) if layout == HeadLayout.HIDDEN_VOCAB else tuple(h_info.shape)
    if len(eshape) != 2 or hshape != eshape:
        return Comparison(TieState.DIFFERENT)
    if not (e_info.st_dtype.decodable and h_info.st_dtype.decodable):
        return _compare_undecodable(ckpt, emb, head, layout)
    return None


def _reading(
    ckpt: Checkpoint, emb: str, head: str, layout: str, chunk_bytes: int | None, scale: float | None
) -> tuple[bool, bool, Any, np.ndarray | None, int]:
    """How :func:`compare` reads a pair of one shape: whether each is bf16, the unsigned dtype whose bits
    tell two chunks equal (None when only values can: other storage dtypes, bf16 against not, a scale), the
    head's transpose (a mapped array; None unless ``hidden-vocab``) and the rows per chunk."""
    e_info, h_info = ckpt.tensors[emb], ckpt.tensors[head]
    e_bf = ckpt.logical_dtype(e_info) == "bfloat16"
    h_bf = ckpt.logical_dtype(h_info) == "bfloat16"
    bit_equal = e_info.storage_dtype == h_info.storage_dtype and e_bf == h_bf and scale is None
    bits = _bits_dtype(e_info.storage_dtype) if bit_equal else None
    hT = ckpt.load(head).T if layout == HeadLayout.HIDDEN_VOCAB else None  # columns of the stored head
    row_bytes = max(1, e_info.nbytes // max(1, e_info.shape[0]))
    # a transposed head is gathered column by column from a mapping: larger chunks amortize the strides
    chunk_rows = max(1, ((chunk_bytes or CHUNK_BYTES) * (8 if hT is not None else 1)) // row_bytes)
    return e_bf, h_bf, bits, hT, chunk_rows


def compare(
    ckpt: Checkpoint,
    emb: str,
    head: str,
    layout: str,
    chunk_bytes: int | None = None,
    scale: float | None = None,
    first_difference: bool = False,
) -> Comparison:
    """Compare head and embedding values in row chunks (memory: a chunk of each, 4 bytes a row for its max).

    Chunks of about ``chunk_bytes`` (default :data:`CHUNK_BYTES`, 1 MiB; at least one row): still in the CPU
    cache when compared (2-3x faster than 32 MiB chunks on a 525 MB table), large enough for Python.

    A ``hidden-vocab`` head ``[hidden, vocab]`` is compared as its transpose. Identical bits → ``exact``
    (``transposed`` for a transposed head); equal values in another dtype or ``-0.0`` vs ``0.0`` count as
    equal too. Otherwise ``different`` with the float32 max |difference|, the number of differing rows and
    how the difference is spread over the rows (:class:`Drift`).

    With ``first_difference`` (for a caller that asks only "equal or not"), the reading stops at the first
    chunk with a differing value (in either half): ``different`` then has no magnitude (``max_abs_diff``,
    ``differing_rows`` and ``drift`` None). An equal pair is read whole either way, with the same verdict.
    """
    settled = _without_reading(ckpt, emb, head, layout)
    if settled is not None:
        return settled
    e_info = ckpt.tensors[emb]
    eshape = tuple(e_info.shape)
    e_bf, h_bf, bits, hT, chunk_rows = _reading(ckpt, emb, head, layout, chunk_bytes, scale)
    row_max = np.zeros(eshape[0], np.float32)  # per-row max |diff|; each half writes its own rows
    scan = chunked.ROW_SCAN.get()  # inspect's untrained-row scan, fed from the chunks read here
    scan = scan if scan is not None and scan.bind(emb, eshape[0]) else None
    found = threading.Event() if first_difference else None  # set by the half that met a difference

    def part(start: int, stop: int) -> float:
        """Fill ``row_max[start:stop]``; the sum of |diff| over those rows (0.0 when bit-identical)."""
        h_chunks = _head_row_chunks(ckpt, head, hT, chunk_rows, start, stop)
        total, at, bits_ = 0.0, start, bits
        # the same rows of two tables of one shape, in the same chunks
        for a, b in zip(ckpt.iter_rows(emb, chunk_rows, start, stop), h_chunks, strict=True):
            if found is not None and found.is_set():
                break
            n, at = len(a), at + len(a)
            if scan is not None:
                scan.add(at - n, a, bf16_bits_to_f32(a) if e_bf else a.astype(np.float32))
            if bits_ is not None and np.array_equal(a.view(bits_), b.view(bits_)):  # bits (-0.0, NaN)
                continue
            bits_ = None
            row_max[at - n : at], chunk_sum = _chunk_difference(a, b, e_bf, h_bf, scale)
            total += chunk_sum
            if found is not None and bool((row_max[at - n : at] > 0).any()):
                found.set()
                break
        return total

    total = _in_halves(part, eshape[0], e_info.nbytes)
    if found is not None and found.is_set():
        return Comparison(TieState.DIFFERENT)
    return _verdict(drift_of(row_max, total, eshape[1]), scale, hT)


def _verdict(drift: Drift, scale: float | None, hT: np.ndarray | None) -> Comparison:
    """The :class:`Comparison` of a compared pair: no differing row → ``scaled`` / ``transposed`` (a
    ``[hidden, vocab]`` head, ``hT`` its transpose) / ``exact``; else ``different`` with its drift."""
    if drift.differing_rows == 0:
        return Comparison(
            TieState.SCALED
            if scale is not None
            else TieState.TRANSPOSED
            if hT is not None
            else TieState.EXACT,
            0.0,
            0,
        )
    return Comparison(TieState.DIFFERENT, drift.max_abs_diff, drift.differing_rows, drift=drift)


def _compare_undecodable(ckpt: Checkpoint, emb: str, head: str, layout: str) -> Comparison:
    """:func:`compare` of tables in a dtype tietool does not decode (float8, float4, complex): the same label
    and bytes (as stored) is ``exact``; anything else ``different``, with no magnitude (never computed from
    bits read as integers)."""
    e, h = ckpt.tensors[emb], ckpt.tensors[head]
    same = (
        layout == HeadLayout.VOCAB_HIDDEN and e.dtype == h.dtype and chunked.same_bytes(ckpt, ckpt, emb, head)
    )
    return Comparison(TieState.EXACT, 0.0, 0) if same else Comparison(TieState.DIFFERENT)
