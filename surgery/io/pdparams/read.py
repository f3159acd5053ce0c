"""Reading Paddle pickles: the tensor headers of a ``.pdparams`` (:func:`read_header`, including
``paddle.save``'s split tables) or an ``.pdopt`` (:func:`read_optimizer_header`), from the walk of
:mod:`.unpickle` (no payload read), and a tensor's bytes or array (:func:`raw_bytes_source`,
:func:`read_array`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...model.errors import CheckpointError
from ...model.tensor import TensorInfo, map_array
from .. import store
from ..safetensors_io import Source
from .allowlist import OPTIMIZER, PickledArray, show_value
from .unpickle import refuse, walk

if TYPE_CHECKING:
    import numpy as np
else:
    from ...model.lazy import numpy as np

NON_TENSOR_KEYS = ("StructuredToParameterName@@",)
SPLIT_TABLE = "UnpackBigParamInfor@@"  # paddle.save (protocol < 4): NAME -> {OriginShape, slices}


def read_header(path: Path, rel: str) -> tuple[list[TensorInfo], dict[str, Any], str]:
    """Tensor headers of a ``.pdparams`` file, without loading array data.

    Returns:
        ``(tensors in file order, non-tensor entries such as StructuredToParameterName@@, numpy module
        name the file's arrays were pickled with)``. Names bound to one array share ``TensorInfo.storage``.

    Raises:
        UnsafePickleError, CheckpointError: see :func:`walk`.
    """
    top, _ = walk(path)
    tensors: list[TensorInfo] = []
    extras: dict[str, Any] = {}
    module = "numpy.core.multiarray"
    for name, v in top.items():
        if not isinstance(name, str):
            raise refuse(path, f"a top-level key is {show_value(name)}, not a tensor name")
        if isinstance(v, PickledArray):
            module = v.module
            tensors.append(_tensor_info(path, rel, name, v))
        else:  # plain values, checked by the walk (depth, no cycle, size at every reference)
            extras[name] = v
    if SPLIT_TABLE in extras:
        tensors = _join_split(path, tensors, extras.pop(SPLIT_TABLE))
    return tensors, extras, module


def _tensor_info(path: Path, rel: str, name: str, v: PickledArray) -> TensorInfo:
    """The header of array stub ``v`` stored under ``name`` in file ``rel``.

    Raises:
        CheckpointError: the stub is not a weights array (its BUILD state), or has no data.
    """
    if v.error:
        raise refuse(path, f"tensor {show_value(name, 200)}: {v.error}")
    if v.data is None or v.dtype is None or v.shape is None:  # never BUILT with its state
        raise refuse(path, f"tensor {show_value(name, 200)} has no data")
    if isinstance(v.data, bytes):  # small payload, read during the walk
        off, n, inline = -1, len(v.data), v.data
    else:
        off, n, inline = v.data.offset, v.data.length, None
    return TensorInfo(
        name, v.dtype.name, v.shape, rel, off, n, storage=(rel, id(v)), fortran=v.fortran, inline=inline
    )


@dataclass
class OptimizerHeader:
    """The headers of an ``optimizer.pdopt`` (:func:`read_optimizer_header`).

    Attributes:
        tensors: the top-level accumulators, in file order.
        master: the ``master_weights`` arrays, keyed by parameter name (``TensorInfo.name`` is the key).
        names: key → Tensor name, for tensors pickled as ``tuple((name, array))`` (master weights are named
            ``<param>_fp32_master_0``); empty for a plain state dict.
        extras: the other entries (``LR_Scheduler``, ``StructuredToParameterName@@``), in file order; the
            position of ``master_weights`` among them is kept as ``{"master_weights": None}``.
        np_module: the numpy module the arrays were pickled with.
    """

    tensors: list[TensorInfo]
    master: list[TensorInfo]
    names: dict[str, str]
    extras: dict[str, Any]
    np_module: str


def read_optimizer_header(path: Path, rel: str) -> OptimizerHeader:
    """Headers of a Paddle ``optimizer.pdopt`` (``paddle.save(optimizer.state_dict())``) without loading
    or executing anything: the walker with :data:`OPTIMIZER`.

    Raises:
        UnsafePickleError, CheckpointError: as :func:`walk`; a ``master_weights`` that is not a dict of
            arrays.
    """
    top, _ = walk(path, OPTIMIZER)
    out = OptimizerHeader([], [], {}, {}, "numpy.core.multiarray")
    for key, v in top.items():
        if not isinstance(key, str):
            raise refuse(path, f"a top-level key is {show_value(key)}, not a tensor name")
        if isinstance(v, PickledArray):
            out.tensors.append(_tensor_info(path, rel, key, v))
            out.np_module = v.module
            if v.name is not None:
                out.names[key] = v.name
        elif key == "master_weights" and isinstance(v, dict):
            for pname, m in v.items():
                if not isinstance(pname, str) or not isinstance(m, PickledArray):
                    raise refuse(path, f"master_weights entry {show_value(pname)} is not a named array")
                out.master.append(_tensor_info(path, rel, pname, m))
                if m.name is not None:
                    out.names["master_weights/" + pname] = m.name
            out.extras[key] = None
        elif isinstance(v, dict) and any(isinstance(x, PickledArray) for x in v.values()):
            raise refuse(path, f"entry {show_value(key)} holds arrays, and only master_weights may")
        else:
            out.extras[key] = v
    return out


def _join_split(path: Path, tensors: list[TensorInfo], table: Any) -> list[TensorInfo]:
    """Join the ``NAME@@.k`` pieces of each parameter ``paddle.save`` split (arrays over 1 GiB, pickle
    protocol < 4) into NAME with the table's ``OriginShape``, as ``paddle.load`` does, by byte range: the
    joined tensor lists its pieces (:attr:`TensorInfo.pieces`), nothing is decoded. NAME takes the place of
    its first piece; a key NAME stored beside the pieces is replaced, as ``paddle.load`` replaces it."""
    what = f"{SPLIT_TABLE} (paddle.save's table of parameters split into pieces)"
    if not isinstance(table, dict):
        raise refuse(path, f"{what} is not a dict")
    by_name = {t.name: t for t in tensors}
    joined: dict[str, TensorInfo] = {}
    first_piece: dict[str, str] = {}
    for name, info in table.items():
        slices = info.get("slices") if isinstance(info, dict) else None
        shape = info.get("OriginShape") if isinstance(info, dict) else None
        if not isinstance(name, str) or not isinstance(slices, list) or not slices:
            raise refuse(path, f"{what}: entry {show_value(name)} has no list of slices")
        if not all(type(x) is str for x in slices):
            raise refuse(path, f"{what}: the slices of {show_value(name)} are not all names")
        if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
            raise refuse(path, f"{what}: entry {show_value(name)} has no OriginShape")
        missing = [s for s in slices if s not in by_name]
        if missing:
            raise refuse(
                path, f"{what}: piece {show_value(missing[0])} of {show_value(name)} is not in the file"
            )
        parts = [by_name[s] for s in slices]
        if len({p.dtype for p in parts}) != 1:
            raise refuse(path, f"{what}: the pieces of {name!r} have different dtypes")
        nbytes = sum(p.nbytes for p in parts)
        if nbytes != math.prod(shape) * np.dtype(parts[0].dtype).itemsize:
            raise refuse(
                path, f"{what}: the pieces of {name!r} hold {nbytes} bytes, not shape {tuple(shape)}"
            )
        pieces = tuple(p.inline if p.inline is not None else (p.offset, p.nbytes) for p in parts)
        inline = (
            b"".join(x for x in pieces if isinstance(x, bytes))
            if all(p.inline is not None for p in parts)
            else None
        )
        joined[name] = TensorInfo(
            name,
            parts[0].dtype,
            tuple(shape),
            parts[0].file,
            -1 if inline is not None else parts[0].offset,
            nbytes,
            storage=(parts[0].file, "split", name),
            inline=inline,
            pieces=None if inline is not None else pieces,
        )
        first_piece[slices[0]] = name
    drop = {s for info in table.values() for s in info["slices"]} | set(joined)
    out: list[TensorInfo] = []
    for t in tensors:
        if t.name in first_piece:
            out.append(joined[first_piece[t.name]])
        elif t.name not in drop:
            out.append(t)
    return out


def raw_bytes_source(path: Path, t: TensorInfo) -> Source:
    """A :class:`Source` for the stored bytes of ``t`` (in the order stored, C or Fortran)."""
    if t.pieces is not None:
        return Source(
            parts=[
                Source(array=np.frombuffer(x, dtype=np.uint8)) if isinstance(x, bytes) else Source(path, *x)
                for x in t.pieces
            ]
        )
    if t.inline is not None:
        return Source(array=np.frombuffer(t.inline, dtype=np.uint8))
    return Source(path, t.offset, t.nbytes)


def read_array(path: Path, t: TensorInfo) -> np.ndarray:
    """Load one array (raw storage dtype, e.g. bf16 as ``uint16``), reading only its payload."""
    dt = np.dtype(t.dtype).newbyteorder("<")
    if t.pieces is not None:
        buf = b"".join(_read_range(path, x, t.name) if isinstance(x, tuple) else x for x in t.pieces)
    elif t.inline is not None:
        buf = t.inline
    else:
        m = map_array(path, t.offset, t.nbytes, dt, t.shape, t.fortran)
        if m is not None:
            return m
        buf = store.read_range(path, t.offset, t.nbytes)
        if len(buf) != t.nbytes:
            raise CheckpointError(f"array {t.name!r} is truncated", path, "re-download or re-export the file")
    return np.frombuffer(buf, dtype=dt).reshape(t.shape, order="F" if t.fortran else "C")


def _read_range(path: Path, rng: tuple[int, int], name: str) -> bytes:
    buf = store.read_range(path, rng[0], rng[1])
    if len(buf) != rng[1]:
        raise CheckpointError(f"array {name!r} is truncated", path, "re-download or re-export the file")
    return buf
