"""Independent reader of PaddleFormers Trainer flex checkpoints for :mod:`support.casecheck`.

A flex checkpoint (``checkpoint-N/`` with ``model_state/``, ``optimizer_state/``, ``master_weight/``) is read
as ``paddle.distributed.load_state_dict`` fills a state dict: each global tensor assembled from its slices.
Each folder holds ``*.metadata`` pickles of paddle's ``Metadata`` (``state_dict_metadata``: tensor key ->
``[LocalTensorMetadata]`` with the global shape and dtype; ``storage_metadata``: ``LocalTensorIndex``
(key, global offset, local shape, flattened range) -> ``.distcp`` file) and ``<rank>_<id>.distcp`` pickles of
``{key: ndarray}`` (paddle ``dcp/metadata.py``, ``dcp/load_state_dict.py``).

Like :mod:`support.casecheck`, it does not import the code under test: its own restricted unpickler
resolves numpy's array globals and paddle's three metadata classes (as plain records), nothing else. The
tensors of ``model_state/`` keep their names, those of ``optimizer_state/`` and ``master_weight/`` are
``optimizer_state/NAME`` and ``master_weight/NAME``; labels are paddle's dtype names (``float32``,
``bfloat16``, stored as uint16 bits).
"""

from __future__ import annotations

import io
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np

STATE_DIRS = ("model_state", "optimizer_state", "master_weight")
_META_MODULE = "paddle.distributed.flex_checkpoint.dcp.metadata"
_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "float64": np.float64,
    "int64": np.int64,
    "int32": np.int32,
    "uint8": np.uint8,
    "bool": np.bool_,
}


class FlexReadError(Exception):
    """A flex checkpoint could not be read (a forbidden pickle global, a slice that does not fit...)."""


class _Record:
    """A stand-in for paddle's metadata dataclasses: its pickled fields, nothing run."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def _unpickler(data: bytes, allowed: dict[tuple[str, str], Any]) -> pickle.Unpickler:
    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in allowed:
                return allowed[(module, name)]
            if module == _META_MODULE and name in ("Metadata", "LocalTensorMetadata", "LocalTensorIndex"):
                return type(name, (_Record,), {})
            raise pickle.UnpicklingError(f"forbidden global {module}.{name} in a flex checkpoint pickle")

    return Restricted(io.BytesIO(data))


def is_flex(folder: Path) -> bool:
    """``folder`` is a flex checkpoint: a ``checkpoint-N/`` with ``model_state/*.metadata``, or such a
    state folder itself."""
    return any((folder / "model_state").glob("*.metadata")) or any(folder.glob("*.metadata"))


def _load(path: Path, allowed: dict[tuple[str, str], Any]) -> Any:
    try:
        return _unpickler(path.read_bytes(), allowed).load()
    except Exception as exc:  # any unpickling problem is a read error
        raise FlexReadError(f"{path.name}: cannot unpickle: {type(exc).__name__}: {exc}") from exc


def _fill(out: np.ndarray, arr: np.ndarray, offset: tuple, shape: tuple, flat: Any) -> None:
    """Write the slice ``arr`` (``shape`` at ``offset``; ``flat``: its range of the box's flattened
    elements, or None) into ``out``."""
    box = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
    if flat is None:
        out[box] = arr.reshape(shape)
        return
    region = out[box].copy().reshape(-1)
    start, stop = int(flat[0]), int(flat[1])
    region[start:stop] = arr.reshape(-1)
    out[box] = region.reshape(shape)


def read_state_folder(folder: Path, allowed: dict[tuple[str, str], Any]) -> dict[str, tuple[str, np.ndarray]]:
    """One state folder's global tensors: key -> (paddle dtype name, assembled array in storage dtype)."""
    sdm: dict[str, Any] = {}
    storage: dict[Any, str] = {}
    for meta in sorted(folder.glob("*.metadata")):
        m = _load(meta, allowed)
        sdm.update(getattr(m, "state_dict_metadata", None) or {})
        storage.update(getattr(m, "storage_metadata", None) or {})
    files: dict[str, dict] = {}
    out: dict[str, tuple[str, np.ndarray]] = {}
    for key, metas in sdm.items():
        first = metas[0]
        dtype = str(first.dtype)
        if dtype not in _DTYPES:
            raise FlexReadError(f"{folder.name}: {key}: dtype {dtype} is not one this checker reads")
        out[key] = (dtype, np.zeros(tuple(first.global_shape), _DTYPES[dtype]))
    covered = {k: 0 for k in out}
    for idx, file in storage.items():
        key = idx.tensor_key
        if file not in files:
            d = _load(folder / file, allowed)
            files[file] = d if isinstance(d, dict) else {}
        arr = files[file].get(key)
        if not isinstance(arr, np.ndarray) or key not in out:
            raise FlexReadError(f"{folder.name}/{file}: no array {key!r} as the metadata says")
        shape = tuple(idx.local_shape) if getattr(idx, "local_shape", None) else arr.shape
        flat = getattr(idx, "flattened_range", None) if getattr(idx, "is_flattened", False) else None
        _fill(out[key][1], arr, tuple(idx.global_offset), shape, flat)
        covered[key] += arr.size
    short = [k for k, n in covered.items() if n < math.prod(out[k][1].shape)]
    if short:
        raise FlexReadError(f"{folder.name}: the slices of {short[0]!r} do not cover it")
    return out
