"""Reads of stored tensors in bounded memory (``verify``'s comparisons, ``inspect``'s untrained-row scan):
at most a few chunks of about :data:`CHUNK_BYTES` are held at once, whatever the tensor's size.

Rows are read with :meth:`Checkpoint.iter_rows` (one reused buffer per tensor). A ``[hidden, vocab]`` head
compared with a ``[vocab, hidden]`` embedding is read in column blocks through a memory map that is closed
after each block, so the pages it touched leave the process's resident set. Tensors whose bytes are not one
contiguous C-order range (Fortran-order or inline pickle payloads, ``paddle.save`` pieces) are small or rare
and are loaded whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

from ..io.checkpoint import Checkpoint
from ..model.tensor import bf16_bits_to_f32, f32_to_bf16_bits, require_array

if TYPE_CHECKING:
    import numpy as np
else:
    from ..model.lazy import numpy as np

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


def same_bytes(
    A: Checkpoint, B: Checkpoint, name: str, b_name: str | None = None, skip: frozenset[int] = frozenset()
) -> bool:
    """Tensor ``name`` of ``A`` and ``b_name`` (default ``name``) of ``B`` have the same shape and the same
    stored bytes; the rows (axis 0) in ``skip`` are not compared (rows a report says were set). Memory: two
    chunks."""
    b_name = b_name or name
    ta, tb = A.tensors[name], B.tensors[b_name]
    if ta.shape != tb.shape or ta.nbytes != tb.nbytes:
        return False
    if ta.nbytes == 0:  # nothing stored: nothing to read (a header of 400 k empty tensors: 800 k opens)
        return True
    if ta.st_dtype.packed or tb.st_dtype.packed:  # F4 / F6: no array of elements; compare the bytes
        return ta.st_dtype == tb.st_dtype and all(
            x == y for x, y in zip(_byte_chunks(A, name), _byte_chunks(B, b_name), strict=True)
        )
    n = _rows_per_chunk(_row_bytes(A, name))
    start = 0
    for x, y in zip(_rows(A, name, n), _rows(B, b_name, n), strict=True):
        m = len(x) if x.ndim else 0
        if skip and x.ndim:
            keep = [j for j in range(m) if start + j not in skip]
            x, y = x[keep], y[keep]
        start += m
        if not np.array_equal(_bits(x), _bits(y)):
            return False
    return True


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
    A: Checkpoint,
    B: Checkpoint,
    name: str,
    axis: int,
    skip: frozenset[int] = frozenset(),
    upto: int | None = None,
) -> bool:
    """The entries ``name`` has in both checkpoints along ``axis`` (0: rows; 1: columns; the other axes
    equal) are bit-identical, read in row chunks; the indices in ``skip`` along ``axis`` (the rows of tokens
    ``add-tokens`` added into slack rows), and those from ``upto`` on (rows a trim removed and a grow made
    anew), are not compared."""
    ta, tb = A.tensors[name], B.tensors[name]
    common = min(ta.shape[axis], tb.shape[axis], *([upto] if upto is not None else []))
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


def rows_differing(
    A: Checkpoint, B: Checkpoint, name: str, skip: frozenset[int], first: int = 5
) -> list[int]:
    """The first ``first`` row ids (axis 0) of the part ``name`` has in both checkpoints whose stored bits
    differ, the ids in ``skip`` left out; read in row chunks as :func:`common_part_equal` reads them."""
    common = min(A.tensors[name].shape[0], B.tensors[name].shape[0])
    n = _rows_per_chunk(_row_bytes(A, name), _row_bytes(B, name))
    out: list[int] = []
    start = 0
    for x, y in zip(_rows(A, name, n, common), _rows(B, name, n, common), strict=True):
        rows = range(len(x)) if x.ndim else range(0)
        out += [
            start + j for j in rows if start + j not in skip and not np.array_equal(_bits(x[j]), _bits(y[j]))
        ]
        start += len(rows)
        if len(out) >= first:
            break
    return out[:first]


def _column_block(ck: Checkpoint, name: str, start: int, stop: int) -> np.ndarray:
    """Columns ``start:stop`` of 2-D tensor ``name`` (a copy), through a memory map closed on return."""
    t = ck.tensors[name]
    require_array(t, ck.path / t.file)
    if t.fortran or t.inline is not None or t.pieces is not None or t.offset < 0 or not ck.local:
        return np.array(ck.load(name)[:, start:stop])
    dt = ck.fmt.row_dtype(t)
    mm = np.memmap(ck.path / t.file, dtype=dt, mode="r", offset=t.offset, shape=tuple(t.shape))
    block = np.array(mm[:, start:stop])
    del mm  # the last reference: unmapped now, so the pages it touched leave the resident set
    return block


def transposed_equal(
    X: Checkpoint,
    name: str,
    E: Checkpoint,
    emb: str,
    scale: float | None = None,
    rtol: float = 1e-2,
    skip: frozenset[int] = frozenset(),
) -> bool:
    """``X[name]`` (``[hidden, vocab]``) equals ``E[emb]`` (``[vocab, hidden]``) transposed: the same bits,
    or, with ``scale``, ``X ≈ E.T × scale`` within ``rtol`` (T5's materialised tied head); the vocabulary
    entries in ``skip`` (rows of ``E``, columns of ``X``) are not compared."""
    tx, te = X.tensors[name], E.tensors[emb]
    if len(tx.shape) != 2 or tuple(tx.shape[::-1]) != tuple(te.shape):
        return False
    itemsize = tx.nbytes // max(1, tx.numel)
    # columns per block: a chunk's worth, but at least a page (4 KiB) of each row of X, so that the pages
    # the map reads are not read again for the next block
    n = max(_rows_per_chunk(_row_bytes(E, emb), tx.shape[0] * itemsize), 4096 // max(1, itemsize))
    start = 0
    for e in _rows(E, emb, n):
        m = e.shape[0]
        x = _column_block(X, name, start, start + m).T
        if skip:
            keep = [j for j in range(m) if start + j not in skip]
            x, e = x[keep], e[keep]
        start += m
        if scale is None:
            if not np.array_equal(_bits(x), _bits(e)):
                return False
        elif not np.allclose(_decode(X, name, x), _decode(E, emb, e) * np.float32(scale), rtol=rtol, atol=0):
            return False
    return True


def common_entries_equal(
    X: Checkpoint,
    name: str,
    E: Checkpoint,
    emb: str,
    skip: frozenset[int] = frozenset(),
    scale: float | None = None,
) -> bool:
    """The vocabulary entries both ``X[name]`` and the embedding ``E[emb]`` (``[vocab, hidden]``) hold (the
    first ``min`` of their entry counts: one of them was resized) are bit-identical, ``X`` as stored
    (``[vocab', hidden]``) or transposed (a ``[hidden, vocab']`` head); the ids in ``skip`` (rows a report
    set) are not compared. With ``scale``, ``X`` holds the embedding times ``scale`` as ``untie`` writes a
    T5 head (:func:`scaled_as_written`), bit for bit. A different hidden size, dtype width or number of
    axes: False. Memory: two chunks (a column block of ``X`` when transposed)."""
    tx, te = X.tensors[name], E.tensors[emb]
    if len(tx.shape) != 2 or len(te.shape) != 2 or tx.nbytes * te.numel != te.nbytes * tx.numel:
        return False
    hidden = te.shape[1]
    common = min(tx.shape[0], te.shape[0])
    if tx.shape[1] == hidden and _prefix_rows_equal(X, name, E, emb, common, skip, scale):
        return True
    return tx.shape[0] == hidden and _prefix_columns_equal(
        X, name, E, emb, min(tx.shape[1], te.shape[0]), skip, scale
    )


def scaled_as_written(E: Checkpoint, emb: str, e: np.ndarray, scale: float | None) -> np.ndarray:
    """Rows ``e`` of ``E[emb]`` (as stored) times ``scale`` in float32, rounded back to the stored dtype
    (bf16 bits by :func:`~surgery.model.tensor.f32_to_bf16_bits`): the bits ``untie`` writes for a T5
    head (:func:`surgery.plan.recipes._copy_of`). ``scale`` None: ``e`` itself."""
    if scale is None:
        return e
    x = _decode(E, emb, e) * np.float32(scale)
    return f32_to_bf16_bits(x) if E.logical_dtype(E.tensors[emb]) == "bfloat16" else x.astype(e.dtype)


def _prefix_rows_equal(
    X: Checkpoint, name: str, E: Checkpoint, emb: str, common: int, skip, scale: float | None = None
) -> bool:
    """Rows ``0:common`` of ``X[name]`` and ``E[emb]`` (same row width; times ``scale`` when given)
    bit-identical, ``skip`` left out."""
    n = _rows_per_chunk(_row_bytes(X, name), _row_bytes(E, emb))
    start = 0
    for x, e in zip(_rows(X, name, n, common), _rows(E, emb, n, common), strict=True):
        m = len(x)
        e = scaled_as_written(E, emb, e, scale)
        if skip:
            keep = [j for j in range(m) if start + j not in skip]
            x, e = x[keep], e[keep]
        start += m
        if not np.array_equal(_bits(x), _bits(e)):
            return False
    return True


def _prefix_columns_equal(
    X: Checkpoint, name: str, E: Checkpoint, emb: str, common: int, skip, scale: float | None = None
) -> bool:
    """Columns ``0:common`` of ``X[name]`` (``[hidden, vocab']``) equal rows ``0:common`` of ``E[emb]``
    transposed (times ``scale`` when given), bit for bit, ``skip`` left out; ``X`` read in column blocks
    (:func:`_column_block`)."""
    itemsize = X.tensors[name].nbytes // max(1, X.tensors[name].numel)
    n = max(
        _rows_per_chunk(_row_bytes(E, emb), X.tensors[name].shape[0] * itemsize), 4096 // max(1, itemsize)
    )
    start = 0
    for e in _rows(E, emb, n, common):
        m = e.shape[0]
        e = scaled_as_written(E, emb, e, scale)
        x = _column_block(X, name, start, start + m).T
        if skip:
            keep = [j for j in range(m) if start + j not in skip]
            x, e = x[keep], e[keep]
        start += m
        if not np.array_equal(_bits(x), _bits(e)):
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


# a row whose L2 norm is below LOW_NORM × the median norm of the non-zero rows looks untrained
LOW_NORM = 1e-3
FIRST_IDS = 10  # ids listed per kind of untrained row
_SEED = 20  # of the digest's multipliers (fixed: digests are only compared within one run)


def _weights(k: int) -> np.ndarray:
    """Two rows of ``k`` odd 64-bit multipliers (fixed): the digest of a row is two wrapping dot products."""
    rng = np.random.default_rng(_SEED)
    return rng.integers(1, 2**63, size=(2, k), dtype=np.uint64) | np.uint64(1)


ROW_SCAN: ContextVar[RowScan | None] = ContextVar("ROW_SCAN", default=None)
"""The :class:`RowScan` that :func:`surgery.inspect.compare.compare` fills from the embedding chunks it reads
(set by inspect around its detection, so that the untrained-row scan reads no byte twice)."""


class RowScan:
    """Per-row facts of a ``[vocab, hidden]`` table, gathered from the chunks some reader already holds
    (:func:`untrained_rows`, or inspect's head comparison, so the rows are read once): the float32 L2 norm,
    whether every element is 0, and a 128-bit digest of the stored bytes (two wrapping dot products with
    fixed odd multipliers; rows with equal digests count as identical). Memory: 25 bytes a row. Chunks of
    disjoint rows may be added from two threads; a row added twice gets the same values."""

    def __init__(self, rows: int = 0, name: str | None = None):
        self._w: np.ndarray | None = None
        self._alloc(rows, name)

    def _alloc(self, rows: int, name: str | None) -> None:
        self.name, self.rows = name, rows
        self.norms = np.zeros(rows, np.float32)
        self.zero = np.zeros(rows, bool)
        self.digest = np.zeros((rows, 2), np.uint64)
        self.seen = np.zeros(rows, bool)

    def bind(self, name: str, rows: int) -> bool:
        """Make an unbound scan (no ``name``) the scan of table ``name`` of ``rows`` rows; True when it is
        (now or already) that table's."""
        if self.name is None:
            self._alloc(rows, name)
        return self.name == name and self.rows == rows

    def add(self, start: int, raw: np.ndarray, values: np.ndarray) -> None:
        """Rows ``start:start + len(raw)``: ``raw`` as stored, ``values`` the same rows as float32."""
        n = len(raw)
        if not n:
            return
        x = values.reshape(n, -1)
        self.norms[start : start + n] = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
        self.zero[start : start + n] = ~x.any(axis=1)
        b = np.ascontiguousarray(raw).reshape(n, -1).view(np.uint8)
        if b.shape[1] % 8:
            b = np.pad(b, ((0, 0), (0, 8 - b.shape[1] % 8)))
        u = b.view(np.uint64)
        if self._w is None or self._w.shape[1] != u.shape[1]:
            self._w = _weights(u.shape[1])
        w = self._w
        with np.errstate(over="ignore"):
            self.digest[start : start + n, 0] = (u * w[0]).sum(axis=1, dtype=np.uint64)
            self.digest[start : start + n, 1] = (u * w[1]).sum(axis=1, dtype=np.uint64)
        self.seen[start : start + n] = True

    @property
    def complete(self) -> bool:
        """Every row was added."""
        return bool(self.seen.all())

    def _duplicates(self) -> list[tuple[int, int]]:
        """``(row, earlier row with the same digest)`` for every non-zero row that repeats one."""
        ids = np.flatnonzero(~self.zero)
        if not ids.size:
            return []
        _, first, inverse = np.unique(self.digest[ids], axis=0, return_index=True, return_inverse=True)
        owner = ids[first][inverse.reshape(-1)]
        return [(int(i), int(j)) for i, j in zip(ids, owner, strict=True) if i != j]

    def summary(self, name: str, split: int | None = None, pad: int | None = None) -> dict:
        """The dict of :func:`untrained_rows` (every row must have been added)."""
        is_zero = self.zero
        pad_row = pad is not None and 0 <= pad < self.rows and bool(is_zero[pad])
        if pad_row:
            is_zero = is_zero.copy()
            is_zero[pad] = False
        zero = np.flatnonzero(is_zero)
        live = ~self.zero
        ok = self.norms[live & np.isfinite(self.norms)]
        median = float(np.median(ok)) if ok.size else 0.0
        low = np.flatnonzero(live & (self.norms < LOW_NORM * median)) if median > 0 else np.zeros(0, int)
        dup = self._duplicates()
        out: dict = {
            "tensor": name,
            "rows": self.rows,
            "zero": {"count": int(zero.size), "first": [int(i) for i in zero[:FIRST_IDS]]},
            "duplicate": {"count": len(dup), "first": [{"id": i, "same_as": j} for i, j in dup[:FIRST_IDS]]},
            "low_norm": {"count": int(low.size), "first": [int(i) for i in low[:FIRST_IDS]]},
            "median_norm": median,
            "low_norm_factor": LOW_NORM,
            "rule": f"L2 norm < {LOW_NORM:g} × the median norm of the non-zero rows",
        }
        if pad_row:
            out["pad_row"] = pad
        if split is not None:
            beyond = {int(i) for i in zero if i >= split} | {i for i, _ in dup if i >= split}
            beyond |= {int(i) for i in low if i >= split}
            out["tokenizer_size"] = split
            out["beyond_tokenizer"] = len(beyond)
        return out


def zero_rows(ck: Checkpoint, name: str, ids) -> list[int]:
    """The ids among ``ids`` whose row of the table ``name`` (axis 0, ``[vocab, hidden]``) is all zero in
    its stored values (every element 0: a row never trained, as Llama-3 base ships its chat tokens); one row
    read at a time. Ids beyond the rows are skipped."""
    rows = ck.tensors[name].shape[0]
    return [i for i in ids if 0 <= i < rows and not np.asarray(next(ck.iter_rows(name, 1, i, i + 1))).any()]


def untrained_rows(
    ck: Checkpoint, name: str, split: int | None = None, scan: RowScan | None = None, pad: int | None = None
) -> dict:
    """Rows of the 2-D table ``name`` (``[vocab, hidden]``) that look untrained, from ``scan`` when it holds
    every row already (inspect's head comparison read them), else read here in chunks of about
    :data:`CHUNK_BYTES` (memory: one chunk and 25 bytes a row).

    Returns ``{"tensor", "rows", "zero", "duplicate", "low_norm", "median_norm", "low_norm_factor",
    "rule"}``: ``zero`` (every element 0) and ``low_norm`` (L2 norm below ``LOW_NORM`` × the median norm of
    the non-zero rows, zero rows excluded) are ``{"count", "first"}`` (the first :data:`FIRST_IDS` ids);
    ``duplicate`` (a non-zero row whose stored bytes equal an earlier row's, by :class:`RowScan`'s digest)
    is ``{"count", "first": [{"id", "same_as"}]}``. Norms are computed in float32 (bf16 decoded by bit
    shift); a NaN norm counts as neither. With ``split`` (the tokenizer's length), ``beyond_tokenizer``
    counts the rows of any kind at ids ``>= split`` (slack rows). ``pad`` (config.json's ``pad_token_id``):
    that row, when all zero, is the pad row (``nn.Embedding(padding_idx=...)`` keeps it zero by design),
    left out of ``zero`` and named as ``pad_row``.
    """
    t = ck.tensors[name]
    rows = t.shape[0] if len(t.shape) == 2 else 0
    if scan is None or scan.name != name or scan.rows != rows or not scan.complete:
        scan = RowScan(rows, name)
        start = 0
        for chunk in _rows(ck, name, _rows_per_chunk(_row_bytes(ck, name))) if rows else ():
            scan.add(start, chunk, _decode(ck, name, chunk))
            start += len(chunk)
    return scan.summary(name, split, pad)
