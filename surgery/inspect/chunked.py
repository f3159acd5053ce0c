"""Comparisons of stored tensors in bounded memory (``verify``): at most a few chunks of about
:data:`CHUNK_BYTES` are held at once, whatever the tensor's size.

Rows are read with :meth:`Checkpoint.iter_rows` (one reused buffer per tensor). A ``[hidden, vocab]`` head
compared with a ``[vocab, hidden]`` embedding is read in column blocks through a memory map that is closed
after each block, so the pages it touched leave the process's resident set. Tensors whose bytes are not one
contiguous C-order range (Fortran-order or inline pickle payloads, ``paddle.save`` pieces) are small or rare
and are loaded whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..io.checkpoint import Checkpoint
from ..model.tensor import bf16_bits_to_f32, require_array

CHUNK_BYTES = 4 << 20  # per chunk: large enough that per-chunk Python cost vanishes, small next to 200 MB


def _rows_per_chunk(*row_bytes: int) -> int:
    return max(1, CHUNK_BYTES // max(1, *row_bytes))


def _row_bytes(ck: Checkpoint, name: str) -> int:
    t = ck.tensors[name]
    return t.nbytes // t.shape[0] if t.shape and t.shape[0] else t.nbytes


def _rows(ck: Checkpoint, name: str, chunk_rows: int, stop: int | None = None) -> Iterator[np.ndarray]:
    """Rows ``0:stop`` of ``name`` in chunks (a 0-d tensor: itself once)."""
    t = ck.tensors[name]
    if not t.shape:
        yield ck.load(name)
        return
    yield from ck.iter_rows(name, chunk_rows, 0, stop)


def _decode(ck: Checkpoint, name: str, a: np.ndarray) -> np.ndarray:
    """A stored chunk of ``name`` as float32 (bf16 bits by shift, never by value cast)."""
    if ck.logical_dtype(ck.tensors[name]) == "bfloat16":
        return bf16_bits_to_f32(a)
    return a.astype(np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def same_bytes(A: Checkpoint, B: Checkpoint, name: str, b_name: str | None = None) -> bool:
    """Tensor ``name`` of ``A`` and ``b_name`` (default ``name``) of ``B`` have the same shape and the same
    stored bytes. Memory: two chunks."""
    b_name = b_name or name
    ta, tb = A.tensors[name], B.tensors[b_name]
    if ta.shape != tb.shape or ta.nbytes != tb.nbytes:
        return False
    if ta.st_dtype.packed or tb.st_dtype.packed:  # F4 / F6: no array of elements; compare the bytes
        return ta.st_dtype == tb.st_dtype and all(
            x == y for x, y in zip(_byte_chunks(A, name), _byte_chunks(B, b_name), strict=True)
        )
    n = _rows_per_chunk(_row_bytes(A, name))
    return all(
        np.array_equal(_bits(x), _bits(y))
        for x, y in zip(_rows(A, name, n), _rows(B, b_name, n), strict=True)
    )


def _byte_chunks(ck: Checkpoint, name: str) -> Iterator[bytes]:
    """The stored bytes of safetensors tensor ``name`` in pieces of :data:`CHUNK_BYTES`."""
    t = ck.tensors[name]
    for pos in range(0, t.nbytes, CHUNK_BYTES):
        yield ck.store.read_range(t.file, t.offset + pos, min(CHUNK_BYTES, t.nbytes - pos))


def max_abs_diff(A: Checkpoint, B: Checkpoint, name: str) -> float:
    """max |A[name] - B[name]| in float32 over tensors of one shape (0.0 for an empty tensor; NaN for a
    dtype tietool does not decode, float8/float4/float6/complex: their bytes differ, by how much is not
    computed)."""
    if not (A.tensors[name].st_dtype.decodable and B.tensors[name].st_dtype.decodable):
        return float("nan")
    n = _rows_per_chunk(_row_bytes(A, name), _row_bytes(B, name))
    m = 0.0
    for x, y in zip(_rows(A, name, n), _rows(B, name, n), strict=True):
        if x.size:
            m = max(m, _max_diff(_decode(A, name, x), _decode(B, name, y)))
    return m


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| where equal values (the same infinity, NaN against NaN) count 0 and a NaN against a
    number counts inf (``inf - inf`` is NaN, and ``max`` would skip it silently)."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a - b)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return float(np.max(np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))))


def common_part_equal(
    A: Checkpoint, B: Checkpoint, name: str, axis: int, skip: frozenset[int] = frozenset()
) -> bool:
    """The entries ``name`` has in both checkpoints along ``axis`` (0: rows; 1: columns; the other axes
    equal) are bit-identical, read in row chunks; the indices in ``skip`` along ``axis`` (the rows of tokens
    ``add-tokens`` added into slack rows) are not compared."""
    ta, tb = A.tensors[name], B.tensors[name]
    common = min(ta.shape[axis], tb.shape[axis])
    n = _rows_per_chunk(_row_bytes(A, name), _row_bytes(B, name))
    stop = common if axis == 0 else None
    cols = np.array([c for c in range(common) if c not in skip], dtype=np.intp) if axis == 1 else None
    start = 0
    for x, y in zip(_rows(A, name, n, stop), _rows(B, name, n, stop), strict=True):
        m = len(x) if x.ndim else 0
        if cols is not None:
            x, y = x[:, :common], y[:, :common]
            if skip:
                x, y = x[:, cols], y[:, cols]
        elif skip and x.ndim:
            keep = [j for j in range(m) if start + j not in skip]
            x, y = x[keep], y[keep]
        start += m
        if not np.array_equal(_bits(x), _bits(y)):
            return False
    return True


def _column_block(ck: Checkpoint, name: str, start: int, stop: int) -> np.ndarray:
    """Columns ``start:stop`` of 2-D tensor ``name`` (a copy), through a memory map closed on return."""
    t = ck.tensors[name]
    require_array(t, ck.path / t.file)
    if t.fortran or t.inline is not None or t.pieces is not None or t.offset < 0 or not ck.store.on_disk:
        return np.array(ck.load(name)[:, start:stop])
    dt = ck.fmt.row_dtype(t)
    mm = np.memmap(ck.path / t.file, dtype=dt, mode="r", offset=t.offset, shape=tuple(t.shape))
    block = np.array(mm[:, start:stop])
    del mm  # the last reference: unmapped now, so the pages it touched leave the resident set
    return block


def transposed_equal(
    X: Checkpoint, name: str, E: Checkpoint, emb: str, scale: float | None = None, rtol: float = 1e-2
) -> bool:
    """``X[name]`` (``[hidden, vocab]``) equals ``E[emb]`` (``[vocab, hidden]``) transposed: the same bits,
    or, with ``scale``, ``X ≈ E.T × scale`` within ``rtol`` (T5's materialised tied head)."""
    tx, te = X.tensors[name], E.tensors[emb]
    if len(tx.shape) != 2 or tuple(tx.shape[::-1]) != tuple(te.shape):
        return False
    itemsize = tx.nbytes // max(1, tx.numel)
    # columns per block: a chunk's worth, but at least a page (4 KiB) of each row of X, so that the pages
    # the map reads are not read again for the next block
    n = max(_rows_per_chunk(_row_bytes(E, emb), tx.shape[0] * itemsize), 4096 // max(1, itemsize))
    start = 0
    for e in _rows(E, emb, n):
        x = _column_block(X, name, start, start + e.shape[0]).T
        start += e.shape[0]
        if scale is None:
            if not np.array_equal(_bits(x), _bits(e)):
                return False
        elif not np.allclose(_decode(X, name, x), _decode(E, emb, e) * np.float32(scale), rtol=rtol, atol=0):
            return False
    return True


def scaled_equal(X: Checkpoint, name: str, E: Checkpoint, emb: str, scale: float, rtol: float = 1e-2) -> bool:
    """``X[name] ≈ E[emb] × scale`` within ``rtol``, same shape, in row chunks."""
    if X.tensors[name].shape != E.tensors[emb].shape:
        return False
    n = _rows_per_chunk(_row_bytes(X, name), _row_bytes(E, emb))
    return all(
        np.allclose(_decode(X, name, x), _decode(E, emb, e) * np.float32(scale), rtol=rtol, atol=0)
        for x, e in zip(_rows(X, name, n), _rows(E, emb, n), strict=True)
    )


LOW_NORM = (
    1e-3  # a row whose L2 norm is below LOW_NORM × the median norm of the non-zero rows looks untrained
)
FIRST_IDS = 10  # ids listed per kind of untrained row


def untrained_rows(ck: Checkpoint, name: str, split: int | None = None) -> dict:
    """Rows of the 2-D table ``name`` (``[vocab, hidden]``) that look untrained, read in chunks of about
    :data:`CHUNK_BYTES` (memory: one chunk, a norm and an 8-byte digest per row).

    Returns ``{"tensor", "rows", "zero", "duplicate", "low_norm", "rule"}``: ``zero`` (every element 0) and
    ``low_norm`` (L2 norm below ``LOW_NORM`` × the median norm of the non-zero rows, zero rows excluded)
    are ``{"count", "first"}`` (the first :data:`FIRST_IDS` ids); ``duplicate`` (a non-zero row whose stored
    bytes equal an earlier row's) is ``{"count", "first": [{"id", "same_as"}]}``. Norms are computed in
    float32 (bf16 decoded by bit shift); a NaN norm counts as neither. With ``split`` (the tokenizer's
    length), ``beyond_tokenizer`` counts the rows of any kind at ids ``>= split`` (slack rows).
    """
    import hashlib

    t = ck.tensors[name]
    rows = t.shape[0] if len(t.shape) == 2 else 0
    norms = np.empty(rows, dtype=np.float32)
    zero: list[int] = []
    dup: list[tuple[int, int]] = []
    seen: dict[bytes, int] = {}
    start = 0
    for chunk in _rows(ck, name, _rows_per_chunk(_row_bytes(ck, name))) if rows else ():
        x = _decode(ck, name, chunk)
        n = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64)).astype(np.float32)
        norms[start : start + len(n)] = n
        raw, live = np.ascontiguousarray(chunk), x.any(axis=1)
        for j in range(len(n)):
            i = start + j
            if not live[j]:
                zero.append(i)
                continue
            key = hashlib.blake2b(raw[j].tobytes(), digest_size=8).digest()
            if key in seen:
                dup.append((i, seen[key]))
            else:
                seen[key] = i
        start += len(n)
    return _untrained_summary(name, rows, norms, zero, dup, split)


def _untrained_summary(
    name: str, rows: int, norms: np.ndarray, zero: list[int], dup: list, split: int | None
) -> dict:
    """The dict of :func:`untrained_rows` from the per-row norms, the zero rows and the duplicate pairs."""
    nonzero = np.ones(rows, dtype=bool)
    nonzero[zero] = False
    live = norms[nonzero & np.isfinite(norms)]
    median = float(np.median(live)) if live.size else 0.0
    low = np.flatnonzero(nonzero & (norms < LOW_NORM * median)) if median > 0 else np.array([], dtype=int)
    out = {
        "tensor": name,
        "rows": rows,
        "zero": {"count": len(zero), "first": zero[:FIRST_IDS]},
        "duplicate": {"count": len(dup), "first": [{"id": i, "same_as": j} for i, j in dup[:FIRST_IDS]]},
        "low_norm": {"count": int(low.size), "first": [int(i) for i in low[:FIRST_IDS]]},
        "median_norm": median,
        "low_norm_factor": LOW_NORM,
        "rule": f"L2 norm < {LOW_NORM:g} × the median norm of the non-zero rows",
    }
    if split is not None:
        ids = {*zero, *(i for i, _ in dup), *(int(i) for i in low)}
        out["tokenizer_size"] = split
        out["beyond_tokenizer"] = sum(1 for i in ids if i >= split)
    return out
