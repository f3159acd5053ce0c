"""Entries of a vocabulary tensor kept by id, in the order given (``prune``): the recipe :class:`KeptRows`
and its data, :func:`kept_rows_data`.

Nothing here imports the planner: :mod:`surgery.plan.recipes` makes :class:`KeptRows` with
:func:`kept_rows_data` (the import-layer test forbids the cycle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..io.checkpoint import Checkpoint
from ..io.safetensors_io import Source

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class KeptRows:
    """Tensor ``name`` with only its entries ``ids`` (old ids, in new-id order) along ``axis`` (0: rows of
    an embedding or ``[vocab, hidden]`` head or a token table; 1: columns of a ``[hidden, vocab]`` head;
    ``-1``: the last axis of a head bias ``[V]`` / ``[1, V]``). Every kept entry is its input bytes."""

    name: str
    axis: int
    ids: tuple[int, ...]


def runs(ids: tuple[int, ...]) -> list[tuple[int, int]]:
    """``(start, stop)`` of the runs of consecutive ids in ``ids`` (``(0, 1, 2, 5, 6)`` → ``[(0, 3),
    (5, 7)]``): each run is one byte range of a row-major tensor."""
    out: list[tuple[int, int]] = []
    for i in ids:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def kept_rows_data(r: KeptRows, ckpt: Checkpoint) -> Array | Source:
    """The data of :class:`KeptRows`: byte ranges of the input, one per run of consecutive ids, for rows of
    a C-ordered tensor stored as one range (streamed, never decoded); else the tensor through memory,
    entries taken with ``numpy.take`` (elements moved, never computed with)."""
    t = ckpt.tensors[r.name]
    src = ckpt.source(r.name)
    if r.axis == 0 and not t.fortran and src.path is not None and src.parts is None and src.array is None:
        size = t.nbytes // t.shape[0] if t.shape[0] else 0
        return Source(parts=[Source(src.path, src.offset + a * size, (b - a) * size) for a, b in runs(r.ids)])
    a = np.asarray(ckpt.load(r.name))
    return np.ascontiguousarray(np.take(a, np.asarray(r.ids, dtype=np.int64), axis=r.axis))
