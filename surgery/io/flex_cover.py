"""Coverage of a flex checkpoint's global tensors, from its ``.metadata`` alone (:mod:`surgery.io.flex`):
the boxes its slices fill in global coordinates, the elements no slice holds (a gap), the slices that share
elements (overlaps) and the stored copies of one slice (replicas). Nothing of a ``.distcp`` is read.

``merge`` (:mod:`surgery.plan.merge_flex`) checks every tensor with :func:`coverage` before it compares the
shared elements' values; ``inspect`` reports the same facts (:func:`inspection`). Coverage is decided on a
grid of the slices' own boundaries (one cell per distinct block of elements), so it costs nothing like the
tensor's size.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..model.errors import CheckpointError
from . import flex
from .flex import FlexCheckpoint, FlexSlice, FlexTensor

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (start, stop) per axis, in global coordinates
MAX_PIECES = 1 << 16
"""The most boxes one tensor's slices may make (a slice is one box, a flattened one at most 2 × axes - 1),
and the most pairs of them that may share elements: far above any real save (a slice per rank, no partial
overlap), low enough that a crafted .metadata cannot make checking slow."""
GRID_CELLS = 1 << 24
"""The most cells the coverage grid of one tensor may have (16 M bools): only needed where slices overlap
or leave a gap; a metadata whose slices would need more is refused (no real save comes near)."""
MAX_COMPARISONS = 1 << 21
"""The most pairs of boxes the overlap sweep of one tensor may compare (2 M: a few seconds). The sweep
runs along the axis where the fewest boxes are open at once (counted first, in ``n log n``): disjoint
slices cost about ``n``; boxes laid out to be open together on every axis without sharing elements are
checked on the coverage grid instead (:data:`GRID_CELLS`), and refused where neither fits."""
_CHUNK = 1 << 20  # grid cells looked at per step when counting holes: bounded memory on any grid
FIX = (
    "re-copy the flex checkpoint from the training run (its .metadata and .distcp files are written together)"
)


def flat_boxes(shape: tuple[int, ...], start: int, stop: int) -> list[tuple[Box, int]]:
    """The blocks of elements ``[start, stop)`` of a C-ordered array of ``shape`` covers, as boxes of
    local coordinates, each with the flat index of its first element (each box is a contiguous run of the
    flat range: the stored 1-D slice ``[pos - start : pos - start + volume]`` reshaped to the box).

    As paddle's ``minimal_nd_slice`` finds them (``load_state_dict``'s unflattening): a partial first row,
    the whole rows, a partial last row, recursively on the remaining axes.
    """
    if start >= stop:
        return []
    if len(shape) <= 1:
        return [(((start,), (stop,)), start)] if shape else [(((), ()), 0)]
    stride = math.prod(shape[1:])
    out: list[tuple[Box, int]] = []
    row, s = divmod(start, stride)
    if s:
        end = min(stop - row * stride, stride)
        out += [
            ((((row, *a)), (row + 1, *b)), row * stride + p) for (a, b), p in flat_boxes(shape[1:], s, end)
        ]
        row += 1
    first = row * stride
    if first >= stop:
        return out
    full = (stop - first) // stride
    if full:
        out.append((((row, *[0] * (len(shape) - 1)), (row + full, *shape[1:])), first))
    tail = stop - (row + full) * stride
    if tail > 0:
        r = row + full
        out += [(((r, *a), (r + 1, *b)), r * stride + p) for (a, b), p in flat_boxes(shape[1:], 0, tail)]
    return out


@dataclass(frozen=True)
class Piece:
    """One contiguous box of a slice: global ``box``, and where its elements are in the slice's stored
    array (``pos``: flat index into it)."""

    slice: FlexSlice
    box: Box
    pos: int


def pieces(s: FlexSlice) -> list[Piece]:
    """The boxes of slice ``s`` in global coordinates (one for a whole block, a few for a flattened one)."""
    if s.flat is None:
        stop = tuple(o + n for o, n in zip(s.offset, s.shape, strict=True))
        return [Piece(s, (s.offset, stop), 0)]
    out = []
    for (a, b), p in flat_boxes(s.shape, s.flat[0], s.flat[1]):
        g = (
            tuple(o + x for o, x in zip(s.offset, a, strict=True)),
            tuple(o + x for o, x in zip(s.offset, b, strict=True)),
        )
        out.append(Piece(s, g, p - s.flat[0]))
    return out


def volume(box: Box) -> int:
    """Elements in ``box``."""
    return math.prod(b - a for a, b in zip(*box, strict=True))


def intersect(x: Box, y: Box) -> Box | None:
    """The box ``x`` and ``y`` share, or None."""
    lo = tuple(max(a, c) for a, c in zip(x[0], y[0], strict=True))
    hi = tuple(min(b, d) for b, d in zip(x[1], y[1], strict=True))
    return (lo, hi) if all(a < b for a, b in zip(lo, hi, strict=True)) else None


def _grid(shape: tuple[int, ...], boxes: list[Box]) -> tuple[list[list[int]], Any]:
    cuts = [sorted({0, n, *(b[0][k] for b in boxes), *(b[1][k] for b in boxes)}) for k, n in enumerate(shape)]
    if math.prod(len(c) - 1 for c in cuts) > GRID_CELLS:
        raise ValueError("too many distinct slice boundaries")
    where = [{x: i for i, x in enumerate(c)} for c in cuts]
    grid = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    painted = 0
    for lo, hi in boxes:
        cell = tuple(slice(w[a], w[b]) for w, a, b in zip(where, lo, hi, strict=True))
        painted += math.prod(s.stop - s.start for s in cell)
        if painted > 4 * GRID_CELLS:  # boxes over boxes: the work, not the grid, would be too much
            raise ValueError("the slices cover one another too often")
        grid[cell] = True
    return cuts, grid


def gap(shape: tuple[int, ...], boxes: list[Box]) -> tuple[int, ...] | None:
    """The first element of ``shape`` no box covers (None: every one is), on the grid of the boxes' own
    boundaries (cells: the distinct blocks; the tensor's size never matters).

    Raises:
        ValueError: the grid would have more than :data:`GRID_CELLS` cells.
    """
    return uncovered(shape, boxes)[1]


def uncovered(shape: tuple[int, ...], boxes: list[Box]) -> tuple[int, tuple[int, ...] | None]:
    """How many elements of ``shape`` no box covers (an exact Python int), and the first of them (None:
    every element is covered), on the grid of :func:`gap`.

    Raises:
        ValueError: the grid would have more than :data:`GRID_CELLS` cells.
    """
    if math.prod(shape) == 0:
        return 0, None
    cuts, grid = _grid(shape, boxes)
    if grid.all():
        return 0, None
    if not grid.ndim:
        return 1, ()
    holes = ~grid
    first = tuple(
        cuts[k][int(i)] for k, i in enumerate(np.unravel_index(int(np.argmax(holes.reshape(-1))), grid.shape))
    )
    small = math.prod(shape) < 2**63  # int64 sums cannot overflow; else Python ints
    lengths = [np.diff(np.array(c, dtype=np.int64 if small else object)) for c in cuts]
    rest = math.prod(grid.shape[1:])
    step = max(1, _CHUNK // rest)
    count = 0
    for at in range(0, grid.shape[0], step):  # blocks of about _CHUNK cells: bounded memory on any grid
        block = holes[at : at + step].astype(lengths[0].dtype)
        for k in range(grid.ndim - 1, 0, -1):  # each cell weighted by its volume, axis by axis
            block = block @ lengths[k]
        count += int(block @ lengths[0][at : at + step])
    return count, first


def _open_pairs(out: list[Piece], ax: int) -> int:
    """How many pairs of pieces a sweep along axis ``ax`` compares: for each piece, the earlier ones (by
    start) still open at its start; ``n log n`` (two sorted lists and a bisection per piece)."""
    starts = sorted(p.box[0][ax] for p in out)
    ends = sorted(p.box[1][ax] for p in out)
    # pieces starting at or before x, minus those ended by x, minus the piece itself
    return sum(bisect_right(starts, x) - bisect_right(ends, x) - 1 for x in starts)


def sweep_axis(out: list[Piece]) -> tuple[int, int]:
    """The axis along which the overlap sweep compares the fewest pairs, and that number (rows for row
    shards and flattened slices, columns for column shards: about ``n``)."""
    nd = len(out[0].box[0])
    return min(((k, _open_pairs(out, k)) for k in range(nd)), key=lambda x: x[1])


def overlaps(out: list[Piece]) -> Iterator[tuple[Piece, Piece, Box]]:
    """Every pair of pieces that share elements, with the shared box: a sweep along the axis where the
    fewest pieces are open together (:func:`sweep_axis`), so that disjoint slices cost about ``n log n``,
    not ``n²``. The caller bounds the work by :func:`sweep_axis`'s count (:data:`MAX_COMPARISONS`)."""
    if not out or not out[0].box[0]:
        for i, p in enumerate(out):  # 0-d: every piece is the one element
            for q in out[i + 1 :]:
                yield p, q, p.box
        return
    ax = sweep_axis(out)[0]
    active: list[Piece] = []
    for p in sorted(out, key=lambda x: x.box[0][ax]):
        active = [q for q in active if q.box[1][ax] > p.box[0][ax]]
        for q in active:
            sub = intersect(q.box, p.box)
            if sub is not None:
                yield q, p, sub
        active.append(p)


@dataclass(frozen=True)
class Coverage:
    """What the slices of one global tensor cover, from the metadata alone.

    Attributes:
        pieces: the boxes of its distinct slices (a replica of an earlier slice left out).
        replicas: ``(first, copy)`` for every further stored copy of a slice (same offset, shape, range).
        shared: every pair of pieces of distinct slices that share elements, with the shared box.
        missing: elements no slice holds (an exact int); ``first_missing`` the first of them, or None.
        held: elements the distinct slices hold, shared ones counted each time.
    """

    pieces: tuple[Piece, ...]
    replicas: tuple[tuple[FlexSlice, FlexSlice], ...]
    shared: tuple[tuple[Piece, Piece, Box], ...]
    missing: int
    first_missing: tuple[int, ...] | None
    held: int

    @property
    def copies(self) -> int:
        """The most stored copies of one slice (1: none is stored twice)."""
        n: dict[FlexSlice, int] = {}
        for first, _ in self.replicas:
            n[first] = n.get(first, 1) + 1
        return max(n.values(), default=1)


def _too_many(t: FlexTensor, what: str, where: Path) -> CheckpointError:
    return CheckpointError(
        f"{t.name!r}: {what}, more than tietool checks", where, "the .metadata is damaged or crafted; " + FIX
    )


def coverage(t: FlexTensor, where: Path) -> Coverage:
    """The :class:`Coverage` of ``t`` (its slices' boxes, replicas, shared elements and gap).

    Raises:
        CheckpointError: naming ``where`` (the ``.metadata``), when the slices make more than
            :data:`MAX_PIECES` boxes or sharing pairs, or a coverage grid above :data:`GRID_CELLS`.
    """
    seen: dict[tuple[Any, ...], FlexSlice] = {}
    out: list[Piece] = []
    replicas = []
    for s in t.slices:
        k = (s.offset, s.shape, s.flat)
        if k in seen:  # a replica of an earlier slice: not a piece of its own
            replicas.append((seen[k], s))
            continue
        seen[k] = s
        out += pieces(s)
    if len(out) > MAX_PIECES:
        raise _too_many(t, f"{len(out):,} slices", where)
    if len(out) == 1 and volume(out[0].box) == t.numel:  # one slice, the whole tensor (most tensors)
        return Coverage(tuple(out), tuple(replicas), (), 0, None, t.numel)
    shared = _shared(t, out, where)
    held = sum(volume(p.box) for p in out)
    if not shared and held == t.numel:  # disjoint boxes inside the tensor holding all its elements
        return Coverage(tuple(out), tuple(replicas), (), 0, None, held)
    try:
        missing, first = uncovered(t.shape, [p.box for p in out])
    except ValueError:
        raise _too_many(t, f"the {len(out):,} slices overlap in too many places to check", where) from None
    return Coverage(tuple(out), tuple(replicas), tuple(shared), missing, first, held)


def _shared(t: FlexTensor, out: list[Piece], where: Path) -> list[tuple[Piece, Piece, Box]]:
    """The pairs of pieces of ``t`` that share elements (:func:`overlaps`), the work bounded: a sweep of
    at most :data:`MAX_COMPARISONS` comparisons, else the coverage grid proves the pieces disjoint
    (:func:`_disjoint`).

    Raises:
        CheckpointError: over :data:`MAX_PIECES` sharing pairs, or pieces that neither the sweep nor the
            grid can check within their limits.
    """
    work = sweep_axis(out)[1] if out and out[0].box[0] else len(out) ** 2 // 2
    if work > MAX_COMPARISONS:
        try:
            if _disjoint(t.shape, [p.box for p in out]):
                return []
        except ValueError:
            pass
        raise _too_many(
            t,
            f"its {len(out):,} slices overlap on every axis: pairing them needs {work:,} comparisons (over "
            f"{MAX_COMPARISONS:,})",
            where,
        )
    shared = []
    for pair in overlaps(out):
        shared.append(pair)
        if len(shared) > MAX_PIECES:
            raise _too_many(t, f"over {MAX_PIECES:,} pairs of slices share elements", where)
    return shared


def _disjoint(shape: tuple[int, ...], boxes: list[Box]) -> bool:
    """No two ``boxes`` share an element, decided on the grid of their boundaries (:func:`gap`'s): each box
    marks its cells after finding none marked, so the work is the grid's cells, once.

    Raises:
        ValueError: the grid would have more than :data:`GRID_CELLS` cells.
    """
    cuts = [sorted({0, n, *(b[0][k] for b in boxes), *(b[1][k] for b in boxes)}) for k, n in enumerate(shape)]
    if math.prod(len(c) - 1 for c in cuts) > GRID_CELLS:
        raise ValueError("too many distinct slice boundaries")
    where = [{x: i for i, x in enumerate(c)} for c in cuts]
    grid = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    for lo, hi in boxes:
        cell = grid[tuple(slice(w[a], w[b]) for w, a, b in zip(where, lo, hi, strict=True))]
        if cell.any():
            return False
        cell[...] = True
    return True


def gap_message(t: FlexTensor, cov: Coverage) -> str:
    """The one line that names a gap of ``t`` (``cov.first_missing`` set): the tensor, its first element no
    slice holds and how many there are."""
    return (
        f"no slice of {t.name!r} {list(t.shape)} holds element {list(cov.first_missing or ())}: "
        f"{cov.missing:,} of its {t.numel:,} elements are in no slice (a gap; the slices hold {cov.held:,}"
        f"{', some twice' if cov.shared else ''}): a rank's file or slice is missing"
    )


def _where(s: FlexSlice) -> dict[str, Any]:
    out: dict[str, Any] = {"file": s.file, "offset": list(s.offset), "shape": list(s.shape)}
    if s.flat is not None:
        out["flattened_range"] = list(s.flat)
    return out


def described(t: FlexTensor, cov: Coverage, limit: int = 10) -> dict[str, Any]:
    """``inspect --json``'s ``coverage`` of one tensor: ``state`` (``covered`` or ``gap``), ``missing``
    elements and the ``first_missing``, ``copies`` (the most stored copies of one slice), ``overlaps`` (pairs
    of distinct slices that share elements), ``shared_elements`` and the first ``limit`` pairs."""
    return {
        "state": "gap" if cov.first_missing is not None else "covered",
        "missing": cov.missing,
        "first_missing": None if cov.first_missing is None else list(cov.first_missing),
        "copies": cov.copies,
        "overlaps": len(cov.shared),
        "shared_elements": sum(volume(sub) for _, _, sub in cov.shared),
        "overlapping": [
            {"slices": [_where(p.slice), _where(q.slice)], "shared": [list(sub[0]), list(sub[1])]}
            for p, q, sub in cov.shared[:limit]
        ],
    }


def inspection(ck: FlexCheckpoint) -> dict[str, Any]:
    """What ``tietool inspect`` shows of a flex checkpoint: :func:`surgery.io.flex.summary` (its structure),
    each tensor with its ``coverage`` (:func:`described`), ``problems`` (one line per tensor with a gap:
    :func:`gap_message`, the line ``merge`` refuses it with), ``warnings`` (slices that share elements
    without being copies of one slice: ``merge`` compares their values and refuses a disagreement),
    ``notes`` (stored copies), and ``exit_code``: 3 (a bad checkpoint, as ``merge`` says) with a problem,
    else 0; ``fix`` with a problem. The ``.metadata`` alone: no ``.distcp`` is read.

    Raises:
        CheckpointError: as :func:`coverage` (crafted slices too many to check).
    """
    info = flex.summary(ck)
    where = ck.path_of(ck.metadata)
    problems: list[str] = []
    warnings: list[str] = []
    copied: list[str] = []
    for entry in info["tensors"]:
        t = ck.tensors[entry["name"]]
        cov = coverage(t, where)
        entry["coverage"] = described(t, cov)
        if cov.first_missing is not None:
            problems.append(gap_message(t, cov))
        if cov.shared:
            warnings.append(
                f"{len(cov.shared)} pair(s) of slices of {t.name!r} share elements without being copies of "
                "one slice (paddle writes no such save): merge compares their values and refuses a "
                "disagreement"
            )
        if cov.replicas:
            copied.append(t.name)
    notes = []
    if copied:
        notes.append(
            f"{len(copied)} tensor(s) stored more than once (save_replicas=True: {', '.join(copied[:5])}"
            f"{', ...' if len(copied) > 5 else ''}): merge writes one copy after checking they are equal"
        )
    info.update(problems=problems, warnings=warnings, notes=notes, exit_code=3 if problems else 0)
    if problems:
        info["fix"] = FIX
    return info
