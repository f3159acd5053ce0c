"""The pieces of a flex checkpoint's global tensors and how one is assembled from them (``merge`` of a
flex checkpoint): boxes of slices in global coordinates, the :class:`Assembled` recipe and its data.

Apart from :mod:`surgery.plan.merge_flex` (the planner, which checks coverage and agreement and builds
these) so that :mod:`surgery.plan.recipes` can make an :class:`Assembled` recipe's data without importing
the planner (the import-layer test forbids the cycle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..io import pdparams_io
from ..io.flex import FlexSlice
from ..io.safetensors_io import Source
from ..model.tensor import TensorInfo

Array = npt.NDArray[Any]
Box = tuple[tuple[int, ...], tuple[int, ...]]  # (start, stop) per axis, in global coordinates


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


def piece_array(path: Path, p: Piece, info: TensorInfo) -> Array:
    """The stored values of piece ``p`` shaped as its box (stored dtype; memory-mapped where possible)."""
    a = pdparams_io.read_array(path, info)
    shape = tuple(b - c for c, b in zip(*p.box, strict=True))
    if p.slice.flat is None:
        return a
    return a.reshape(-1)[p.pos : p.pos + math.prod(shape)].reshape(shape)


@dataclass(frozen=True)
class Assembled:
    """A global tensor of a flex checkpoint (``merge``): an array of ``shape`` in the stored numpy
    ``dtype`` (bf16 as ``uint16``) filled from ``pieces`` (:class:`Piece`, each a
    box of a slice in a ``.distcp`` file of ``folder``; ``infos``: each file's header of the tensor's key),
    by :func:`assemble`."""

    folder: Path
    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[Any, ...]
    infos: tuple[tuple[str, TensorInfo], ...]


def assemble(r: Assembled) -> Array:
    """The global tensor of :class:`Assembled` ``r``: an array of its global shape in the stored dtype,
    every piece copied into its box (bits unchanged)."""
    infos = dict(r.infos)
    if len(r.pieces) == 1 and r.pieces[0].slice.flat is None:  # one whole block: its stored array
        p = r.pieces[0]
        return np.ascontiguousarray(piece_array(r.folder / p.slice.file, p, infos[p.slice.file]))
    out = np.empty(r.shape, dtype=np.dtype(r.dtype))
    for p in r.pieces:
        path = r.folder / p.slice.file
        info = infos[p.slice.file]
        out[tuple(slice(a, b) for a, b in zip(*p.box, strict=True))] = piece_array(path, p, info)
    return out


def assembled_data(r: Assembled) -> Array | Source:
    """The data of :class:`Assembled` ``r`` for the writer: where its pieces are whole blocks that span
    every axis but the first (a single slice, row shards, a 1-D tensor's shards) their stored bytes one
    after another by byte range (:class:`Source`: nothing loaded, as ``merge`` joins rank files on axis 0);
    else the array :func:`assemble` fills."""
    infos = dict(r.infos)
    full = all(
        p.slice.flat is None
        and not infos[p.slice.file].fortran
        and p.box[0][1:] == (0,) * (len(r.shape) - 1)
        and p.box[1][1:] == r.shape[1:]
        for p in r.pieces
    )
    if not full or not r.shape:
        return assemble(r)
    ordered = sorted(r.pieces, key=lambda p: p.box[0][0])
    parts = [pdparams_io.raw_bytes_source(r.folder / p.slice.file, infos[p.slice.file]) for p in ordered]
    return parts[0] if len(parts) == 1 else Source(parts=parts)
