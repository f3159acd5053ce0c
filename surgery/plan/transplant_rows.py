"""Entries of a vocabulary tensor laid out in a donor tokenizer's id order (``transplant``): the recipe
:class:`TransplantRows` and its data, :func:`transplant_rows_data`.

Each new entry is one of: the input's entry at an old id (its bytes, bit for bit), the mean of the input's
entries at some old ids (mergekit-tokensurgeon's ``subword`` method with ``SubwordMethod.MEAN``:
``mergekit/tokensurgeon/subword.py``, ``subword_approximate``, github.com/arcee-ai/mergekit at a6e40288), the
mean of every input entry (its ``mean`` method: ``orig_embed.mean(dim=0)``, ``mergekit/scripts/
tokensurgeon.py`` ``compute_new_embeddings``), zeros (its ``zero``) or a combination of the input's entries
at some old ids with given coefficients (its ``omp``: :class:`OmpRow`, the coefficients from
:mod:`surgery.plan.transplant_omp`). tietool sums in float64 and rounds the float32 result to the stored
dtype once (mergekit adds in the tensor's own dtype, or a float32 ``bmm`` for ``omp``).

Nothing here imports the planner: :mod:`surgery.plan.recipes` makes :class:`TransplantRows` with
:func:`transplant_rows_data` (the import-layer test forbids the cycle).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..io.checkpoint import Checkpoint
from ..io.safetensors_io import Source
from ..model.tensor import TensorInfo, bf16_bits_to_f32, dtype_refusal, f32_to_bf16_bits

Array = npt.NDArray[Any]

MEAN = -1
"""A new entry that is the mean of every input entry."""
ZEROS = -2
"""A new entry of zeros."""


@dataclass(frozen=True)
class OmpRow:
    """A new entry ``sum(coef[p] * entry[ids[p]])``: the input's entries at the old ids ``ids`` weighted by
    ``coef`` (float32 values), added in float64 in this order (:func:`omp_values`)."""

    ids: tuple[int, ...]
    coef: tuple[float, ...]


RowSource = int | tuple[int, ...] | OmpRow
"""How one new entry is made: an old id ``>= 0`` (kept, bit for bit), a tuple of old ids (the mean of their
entries; an empty tuple is zeros, as mergekit leaves a token whose text splits into nothing), an
:class:`OmpRow`, :data:`MEAN` or :data:`ZEROS`."""

BLOCK = 8192  # new entries made at a time; input entries decoded at a time for the mean


@dataclass(frozen=True)
class TransplantRows:
    """Tensor ``name`` with one entry per element of ``rows`` along ``axis`` (0: rows of an embedding or
    ``[vocab, hidden]`` head; 1: columns of a ``[hidden, vocab]`` head; ``-1``: the last axis of a head bias
    ``[V]`` / ``[1, V]``), each made as its :data:`RowSource` says."""

    name: str
    axis: int
    rows: tuple[RowSource, ...]


def _decode(ckpt: Checkpoint, t: TensorInfo, a: Array) -> Array:
    if not t.st_dtype.decodable:  # the plan refuses this first (surgery.plan.plan.check_dtypes)
        raise dtype_refusal(t, ckpt.path, "decode its values")
    return bf16_bits_to_f32(a) if ckpt.logical_dtype(t) == "bfloat16" else a.astype(np.float32)


def _encode(ckpt: Checkpoint, t: TensorInfo, x: Array) -> Array:
    if ckpt.logical_dtype(t) == "bfloat16":
        return f32_to_bf16_bits(x)
    return x.astype(t.storage_dtype)


def mean_entry(entries: Array, decode: Any) -> Array:
    """The mean (float32) of every entry of ``entries`` (``[V, ...]`` stored), summed in float64 over
    blocks of :data:`BLOCK` entries, each block decoded by ``decode``."""
    total = np.zeros(entries.shape[1:], np.float64)
    for s in range(0, entries.shape[0], BLOCK):
        total += decode(np.asarray(entries[s : s + BLOCK])).sum(axis=0, dtype=np.float64)
    return (total / max(1, entries.shape[0])).astype(np.float32)


def made_block(
    entries: Array, rows: tuple[RowSource, ...], decode: Any, encode: Any, mean: Array | None
) -> Array:
    """The new entries ``rows`` (``[len(rows), ...]``, stored dtype) from the input's ``entries``
    (``[V, ...]`` stored): kept ones copied as stored bits, the others computed in float32 and encoded."""
    out = np.empty((len(rows),) + entries.shape[1:], entries.dtype)
    kept = [(j, r) for j, r in enumerate(rows) if isinstance(r, int) and r >= 0]
    if kept:
        at, old = zip(*kept, strict=True)
        out[list(at)] = np.take(entries, np.asarray(old, dtype=np.int64), axis=0)
    made = [j for j, r in enumerate(rows) if not (isinstance(r, int) and r >= 0)]
    if made:
        x = np.zeros((len(made),) + entries.shape[1:], np.float32)
        sub = [(k, r) for k, j in enumerate(made) if isinstance(r := rows[j], tuple) and r]
        for group in _groups(sub, max(1, GATHER_ELEMENTS // max(1, int(np.prod(entries.shape[1:]))))):
            x[[k for k, _ in group]] = subword_means(entries, [r for _, r in group], decode)
        omp = [(k, r) for k, j in enumerate(made) if isinstance(r := rows[j], OmpRow)]
        step = max(
            1, GATHER_ELEMENTS // max(1, int(np.prod(entries.shape[1:])) * (len(omp[0][1].ids) if omp else 1))
        )
        for s in range(0, len(omp), step):
            x[[k for k, _ in omp[s : s + step]]] = omp_values(
                entries, [r for _, r in omp[s : s + step]], decode
            )
        at_mean = [k for k, j in enumerate(made) if rows[j] == MEAN]
        if at_mean:
            assert mean is not None, "internal: a mean entry without the mean"
            x[at_mean] = mean
        out[made] = encode(x)
    return out


GATHER_ELEMENTS = 1 << 21  # entries' elements gathered at a time for the subword means (16 MB in float64)


def _groups(
    sub: list[tuple[int, tuple[int, ...]]], limit: int
) -> Iterator[list[tuple[int, tuple[int, ...]]]]:
    """``sub`` cut into consecutive groups of at most ``limit`` ids in all (at least one entry each)."""
    group: list[tuple[int, tuple[int, ...]]] = []
    n = 0
    for item in sub:
        if group and n + len(item[1]) > limit:
            yield group
            group, n = [], 0
        group.append(item)
        n += len(item[1])
    if group:
        yield group


def subword_means(entries: Array, ids: list[tuple[int, ...]], decode: Any) -> Array:
    """The mean (float32) of the entries of each tuple of ``ids``: the decoded entries added in float64 in
    the tuple's order and divided by its length, as ``x[list(t)].mean(axis=0, dtype=np.float64)`` makes it
    (the same additions, bit for bit)."""
    flat = np.fromiter((i for t in ids for i in t), dtype=np.int64)
    lens = np.array([len(t) for t in ids], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    vals: Array = np.asarray(decode(np.asarray(entries[flat])), dtype=np.float64)
    sums = vals[starts]  # a copy: the first entry of each tuple
    for p in range(1, int(lens.max())):  # then the p-th of each tuple that has one, in order
        longer = lens > p
        sums[longer] += vals[starts[longer] + p]
    out: Array = (sums / lens.reshape((-1,) + (1,) * (vals.ndim - 1))).astype(np.float32)
    return out


def omp_values(entries: Array, rows: list[OmpRow], decode: Any) -> Array:
    """The entries (float32) of :class:`OmpRow` ``rows``: for each, the decoded entries at its ids (float64)
    times its coefficients, added in its order starting from the first product, rounded to float32 once (as
    a loop ``s = c[0] * x[0]; s += c[p] * x[p]`` makes it, bit for bit)."""
    flat = np.fromiter((i for r in rows for i in r.ids), dtype=np.int64)
    w = np.fromiter((c for r in rows for c in r.coef), dtype=np.float64)
    lens = np.array([len(r.ids) for r in rows], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    vals: Array = np.asarray(decode(np.asarray(entries[flat])), dtype=np.float64)
    vals *= w.reshape((-1,) + (1,) * (vals.ndim - 1))
    sums = vals[starts]
    for p in range(1, int(lens.max())):
        longer = lens > p
        sums[longer] += vals[starts[longer] + p]
    out: Array = sums.astype(np.float32)
    return out


def _blocks(n: int) -> Iterator[tuple[int, int]]:
    for s in range(0, n, BLOCK):
        yield s, min(n, s + BLOCK)


def _kept(r: RowSource) -> bool:
    return isinstance(r, int) and r >= 0


MAKE_BYTES = 4 << 20
"""Stored bytes of made rows :func:`_streamed` computes at a time (their float32 and the encoder's uint64
temporaries are 2-4x that: a few tens of MB)."""


def _streamed(r: TransplantRows, src: Source, row_bytes: int, make: Any) -> Source:
    """The rows of :class:`TransplantRows` as parts: each run of kept rows whose old ids follow each other
    a byte range of the input ``src`` (``row_bytes`` a row), each run of made rows a slice of the made rows,
    which ``make(rows)`` computes :data:`MAKE_BYTES` of stored rows at a time across runs (a call per
    block, not per run: a donor interleaves kept and made tokens in thousands of short runs)."""
    runs: list[tuple[int, int, int]] = []  # rows j:k, the old id of a kept run's first row (-1: made)
    rows, j = r.rows, 0
    while j < len(rows):
        x, k = rows[j], j + 1
        if isinstance(x, int) and x >= 0:
            while k < len(rows) and rows[k] == x + (k - j):
                k += 1
        else:
            while k < len(rows) and not _kept(rows[k]):
                k += 1
        runs.append((j, k, x if isinstance(x, int) and x >= 0 else -1))
        j = k
    to_make = tuple(x for j, k, old in runs if old < 0 for x in rows[j:k])
    step = max(1, min(BLOCK, MAKE_BYTES // max(1, row_bytes)))
    made = [make(to_make[s : s + step]) for s in range(0, len(to_make), step)]
    parts: list[Source] = []
    at = 0  # made rows used so far
    for j, k, old in runs:
        if old >= 0:
            parts.append(Source(src.path, src.offset + old * row_bytes, (k - j) * row_bytes))
            continue
        while j < k:  # a run may straddle two blocks
            b, o = divmod(at, step)
            n = min(k - j, step - o)
            parts.append(Source(array=made[b][o : o + n]))
            at, j = at + n, j + n
    return Source(parts=parts)


def transplant_rows_data(r: TransplantRows, ckpt: Checkpoint) -> Array | Source:
    """The data of :class:`TransplantRows`. Rows of a C-ordered tensor stored as one range: the kept rows
    are byte ranges of the input (streamed, never decoded), only the made rows arrays. Otherwise (columns,
    a bias, Fortran order) the output filled in blocks of :data:`BLOCK` new entries. The input is read
    through :meth:`Checkpoint.load` (a memory map for large tensors); memory: the made entries (at most the
    output) and one block.

    Raises:
        RefusedError: a dtype tietool cannot decode, when an entry is computed.
        OSError: reading the input fails.
    """
    t = ckpt.tensors[r.name]
    a = np.asarray(ckpt.load(r.name))  # a view of the map, for a large tensor: no copy
    axis = r.axis % a.ndim
    entries = np.moveaxis(a, axis, 0)

    def dec(x: Array) -> Array:
        return _decode(ckpt, t, x)

    def enc(x: Array) -> Array:
        return _encode(ckpt, t, x)

    mean = mean_entry(entries, dec) if MEAN in r.rows else None
    src = ckpt.source(r.name)
    if axis == 0 and not t.fortran and src.path is not None and src.parts is None and src.array is None:
        size = t.nbytes // t.shape[0] if t.shape[0] else 0
        return _streamed(r, src, size, lambda rows: made_block(entries, rows, dec, enc, mean))
    shape = list(a.shape)
    shape[axis] = len(r.rows)
    out = np.empty(shape, a.dtype)
    view = np.moveaxis(out, axis, 0)
    for s, e in _blocks(len(r.rows)):
        view[s:e] = made_block(entries, r.rows[s:e], dec, enc, mean)
    return out
