"""Rows a model never trained, found and set as unsloth's ``fix_untrained_tokens`` does (``fix-untrained``).

The rule (unsloth_zoo ``tokenizer_utils.fix_untrained_tokens``, github.com/unslothai/unsloth-zoo, read at
commit 0802de02; unsloth re-exports it): over the first ``min(embedding rows, head rows)`` entries, an entry
is untrained when its embedding row's largest value is ≤ ``eps`` = 1e-16 (``amax(row) <= eps``: all-zero
rows, and rows of no positive value) **and** its head row is too, or its head row, rounded to 3 decimals in
float32, is shared by another entry the embedding finds untrained (Llama 3.1 ships such head rows); the ids
of the tokenizer's bos/eos/unk/sep/pad/cls/mask tokens are never untrained. Each untrained entry is set to
the mean of the entries that are not untrained: ``(sum of all entries - sum of the untrained) / (entries -
untrained)``, the embedding's and the head's separately. unsloth then scales each row by how often the
training data uses the token (rows the data never uses set to zero); tietool sees no training data, so it
sets the mean itself (``mean_of_trained_tokens``'s value, the rule unsloth applied before that scaling).

Nothing here imports the planner: :mod:`surgery.plan.recipes` makes :class:`MeanRows` with
:func:`mean_rows_data` (the import-layer test forbids the cycle).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..io.checkpoint import Checkpoint
from ..io.safetensors_io import Source
from ..model.tensor import TensorInfo, bf16_bits_to_f32, dtype_refusal, f32_to_bf16_bits

Array = npt.NDArray[Any]

EPS = 1e-16
"""unsloth's ``eps``: an entry whose largest value is at most this is untrained."""

KEPT_SPECIAL = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
"""The ``<name>_token`` ids unsloth never counts as untrained (the pad row is zero by design)."""

CHUNK_ENTRIES = 8192  # entries decoded at a time


@dataclass(frozen=True)
class Table:
    """A vocabulary table read entry by entry: tensor ``name`` with its entries along ``axis`` (0: rows of
    ``[vocab, hidden]``; 1: columns of a ``[hidden, vocab]`` head)."""

    name: str
    axis: int = 0


@dataclass(frozen=True)
class MeanRows:
    """Tensor ``name`` with its entries ``ids`` along ``axis`` set to the mean (float64 sum, float32 value,
    rounded to the stored dtype) of its entries ``0..pool-1`` that are not in ``untrained``; every other
    entry kept bit-exact (byte ranges of the input for a C-ordered tensor stored as one range).

    ``sources`` (``fix-untrained --init subtokens``): per id of ``ids``, in order, the ids whose entries'
    mean it gets instead (:func:`subtoken_row`); an empty tuple keeps the trained mean. Empty: every id
    gets the trained mean."""

    name: str
    axis: int
    ids: tuple[int, ...]
    untrained: tuple[int, ...]
    pool: int
    sources: tuple[tuple[int, ...], ...] = ()


def _decode(ckpt: Checkpoint, t: TensorInfo, a: Array) -> Array:
    if not t.st_dtype.decodable:  # the plan refuses this first (surgery.plan.plan.check_dtypes)
        raise dtype_refusal(t, ckpt.path, "decode its values")
    return bf16_bits_to_f32(a) if ckpt.logical_dtype(t) == "bfloat16" else a.astype(np.float32)


def _encode(ckpt: Checkpoint, t: TensorInfo, x: Array) -> Array:
    if ckpt.logical_dtype(t) == "bfloat16":
        return f32_to_bf16_bits(x)
    return x.astype(t.storage_dtype)


def entries(ckpt: Checkpoint, table: Table, count: int) -> Iterator[tuple[int, Array]]:
    """``(start, block)``: entries ``0..count-1`` of ``table`` as float32 blocks ``[n, hidden]``. Rows are
    read in chunks (memory: one chunk); the columns of a ``[hidden, vocab]`` head through memory (the
    tensor once)."""
    t = ckpt.tensors[table.name]
    if table.axis == 1:
        a = ckpt.load(table.name)
        for s in range(0, count, CHUNK_ENTRIES):
            yield s, _decode(ckpt, t, np.ascontiguousarray(a[:, s : min(count, s + CHUNK_ENTRIES)].T))
        return
    start = 0
    for chunk in ckpt.iter_rows(table.name, CHUNK_ENTRIES, 0, count):
        yield start, _decode(ckpt, t, chunk)
        start += len(chunk)


def small_entries(ckpt: Checkpoint, table: Table, count: int, eps: float = EPS) -> Array:
    """Whether each of entries ``0..count-1`` has no value above ``eps`` (bool ``[count]``; unsloth's
    ``torch.amax(matrix, axis=1) <= eps``)."""
    out = np.zeros(count, bool)
    for s, x in entries(ckpt, table, count):
        out[s : s + len(x)] = x.max(axis=1, initial=-np.inf) <= eps
    return out


def shared_rounded(ckpt: Checkpoint, table: Table, count: int, ids: Array) -> Array:
    """The ids among ``ids`` whose entry of ``table``, rounded to 3 decimals in float32, equals the rounded
    entry of another id among ``ids`` (unsloth's repeated-head-row check), sorted."""
    ids = np.asarray(ids, dtype=np.int64)
    groups: dict[bytes, list[int]] = defaultdict(list)
    for s, x in entries(ckpt, table, count):
        for i in ids[(ids >= s) & (ids < s + len(x))]:
            groups[np.round(x[i - s], 3).tobytes()].append(int(i))
    return np.array(sorted(i for g in groups.values() if len(g) >= 2 for i in g), dtype=np.int64)


def find_untrained(
    ckpt: Checkpoint, emb: Table, head: Table | None, count: int, kept: set[int], eps: float = EPS
) -> list[int]:
    """unsloth's untrained entries among ``0..count-1`` (the module docstring): small in ``emb`` and (small
    in ``head`` or its rounded head entry repeated among those small in ``emb``); ids in ``kept`` never.
    ``head`` None: one tensor (tied), the embedding's test alone."""
    small = small_entries(ckpt, emb, count, eps)
    if head is not None:
        in_head = small_entries(ckpt, head, count, eps)
        in_head[shared_rounded(ckpt, head, count, np.flatnonzero(small))] = True
        small &= in_head
    return [int(i) for i in np.flatnonzero(small) if int(i) not in kept]


def trained_mean(ckpt: Checkpoint, table: Table, pool: int, untrained: tuple[int, ...]) -> Array:
    """The mean ``[hidden]`` (float32; summed in float64) of entries ``0..pool-1`` of ``table`` not in
    ``untrained``.

    Raises:
        ValueError: every entry is untrained (no mean).
    """
    skip = np.zeros(pool, bool)
    skip[list(untrained)] = True
    if skip.all():
        raise ValueError("every entry is untrained")
    total: Array | None = None
    for s, x in entries(ckpt, table, pool):
        part = x[~skip[s : s + len(x)]].sum(axis=0, dtype=np.float64)
        total = part if total is None else total + part
    assert total is not None
    return (total / int((~skip).sum())).astype(np.float32)


def mean_row(ckpt: Checkpoint, table: Table, pool: int, untrained: tuple[int, ...]) -> Array:
    """:func:`trained_mean` as the row ``[1, hidden]`` that is written: in the stored dtype (bf16 as
    ``uint16`` bits, rounded to nearest even)."""
    t = ckpt.tensors[table.name]
    return _encode(ckpt, t, trained_mean(ckpt, table, pool, untrained)[None, :])


def subtoken_row(ckpt: Checkpoint, table: Table, ids: list[int]) -> Array:
    """The row ``[1, hidden]`` add-tokens' ``subtokens`` init writes for a string that splits into ``ids``:
    the float64 mean of their decoded entries, as float32, in the stored dtype
    (:func:`surgery.plan.recipes.token_rows`)."""
    t = ckpt.tensors[table.name]
    x = _decode(ckpt, t, stored_entries(ckpt, table, ids))
    return _encode(ckpt, t, x.mean(axis=0, dtype=np.float64).astype(np.float32)[None, :])


def stored_entries(ckpt: Checkpoint, table: Table, ids: list[int]) -> Array:
    """Entries ``ids`` of ``table`` as stored, ``[len(ids), hidden]`` (rows read one at a time; a
    ``[hidden, vocab]`` head through memory)."""
    if table.axis == 1:
        return np.ascontiguousarray(ckpt.load(table.name)[:, ids].T)
    return np.stack([np.array(next(ckpt.iter_rows(table.name, 1, i, i + 1)))[0] for i in ids])


def mean_rows_data(r: MeanRows, ckpt: Checkpoint) -> Array | Source:
    """The data of :class:`MeanRows`: byte ranges of the input between the set rows for a C-ordered tensor
    stored as one range, else the tensor through memory."""
    t = ckpt.tensors[r.name]
    table = Table(r.name, r.axis)
    mean = mean_row(ckpt, table, r.pool, r.untrained)
    srcs = r.sources or tuple(() for _ in r.ids)
    rows = {i: subtoken_row(ckpt, table, list(s)) if s else mean for i, s in zip(r.ids, srcs, strict=True)}
    src = ckpt.source(r.name)
    if r.axis == 0 and not t.fortran and src.path is not None and src.parts is None and src.array is None:
        size = t.nbytes // t.shape[0]
        parts, at = [], 0
        for i in sorted(r.ids):
            parts += [Source(src.path, src.offset + at * size, (i - at) * size), Source(array=rows[i])]
            at = i + 1
        parts.append(Source(src.path, src.offset + at * size, (t.shape[0] - at) * size))
        return Source(parts=parts)
    a = np.array(ckpt.load(r.name))
    for i, row in rows.items():
        if r.axis == 1:
            a[:, i] = row[0]
        else:
            a[i] = row[0]
    return np.ascontiguousarray(a)
