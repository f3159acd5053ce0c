"""The pieces of a flex checkpoint's global tensors and how one is assembled from them (``merge`` of a
flex checkpoint): boxes of slices in global coordinates, the :class:`Assembled` recipe and its data.

Apart from :mod:`surgery.plan.merge_flex` (the planner, which checks coverage and agreement and builds
these; the boxes themselves, :func:`flat_boxes` and :class:`Piece`, are :mod:`surgery.io.flex_cover`'s,
shared with ``inspect``) so that :mod:`surgery.plan.recipes` can make an :class:`Assembled` recipe's data
without importing the planner (the import-layer test forbids the cycle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..io import pdparams, stores
from ..io.flex_cover import Piece
from ..io.safetensors_io import Source
from ..model.errors import CheckpointError
from ..model.tensor import TensorInfo

Array = npt.NDArray[Any]


def piece_array(path: Path, p: Piece, info: TensorInfo) -> Array:
    """The stored values of piece ``p`` shaped as its box (stored dtype; memory-mapped where possible)."""
    a = pdparams.read_array(path, info)
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
        if not _read_rows_into(out, p, path, info):
            out[tuple(slice(a, b) for a, b in zip(*p.box, strict=True))] = piece_array(path, p, info)
    return out


def _read_rows_into(out: Array, p: Piece, path: Path, info: TensorInfo) -> bool:
    """Read piece ``p`` straight into its rows of ``out`` (one ``readinto`` from the file, no array of its
    own: 2x faster than reading it then copying it, measured in bench/RESULTS.md) where it is a
    whole block of rows (every axis but the first whole) stored as one C-ordered byte range of a local
    file in ``out``'s dtype; False, nothing read, for any other piece (:func:`assemble` copies it).

    Raises:
        CheckpointError: the file ends before the piece (as :func:`pdparams.read_array` says it).
        OSError: the read fails (as :func:`store.read_range` raises it).
    """
    if (
        out.ndim < 1
        or p.slice.flat is not None
        or info.fortran
        or info.pieces is not None
        or info.inline is not None
        or not stores.is_local(path)
        or np.dtype(info.dtype).newbyteorder("<") != out.dtype
        or p.box[0][1:] != (0,) * (out.ndim - 1)
        or p.box[1][1:] != out.shape[1:]
    ):
        return False
    row = out.nbytes // out.shape[0] if out.shape[0] else 0
    start, n = p.box[0][0] * row, (p.box[1][0] - p.box[0][0]) * row
    if n != info.nbytes:
        return False
    view = out.reshape(-1).view(np.uint8).data[start : start + n]
    with open(path, "rb") as f:
        f.seek(info.offset)
        if f.readinto(view) != n:
            fix = "re-download or re-export the file"
            raise CheckpointError(f"array {info.name!r} is truncated", path, fix)
    return True


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
    parts = [pdparams.raw_bytes_source(r.folder / p.slice.file, infos[p.slice.file]) for p in ordered]
    return parts[0] if len(parts) == 1 else Source(parts=parts)
