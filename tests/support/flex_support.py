"""Helpers for the flex-checkpoint tests: copies of the Paddle-written fixtures (``tests/data/flex``), and
``.metadata`` pickles written here (not by paddle) to make gaps, overlaps and replicas.

:func:`write_metadata` pickles stand-ins of paddle's three record classes under paddle's own module and
class names (``paddle.distributed.flex_checkpoint.dcp.metadata``): the same opcodes paddle writes (NEWOBJ of
the class with no arguments, BUILD from the field dict), without importing paddle. Paddle is never
imported.
"""

from __future__ import annotations

import io
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

from tietool.surgery.io import flex

DATA = Path(__file__).resolve().parents[1] / "data" / "flex"
FOLDERS = ("single", "ranks2", "flat2", "mesh2x2")


@dataclass(frozen=True)
class LocalTensorMetadata:
    global_offset: tuple
    local_shape: tuple
    dtype: str
    global_shape: tuple | None = None
    is_flattened: bool = False
    flattened_range: tuple | None = None


@dataclass(frozen=True)
class LocalTensorIndex:
    tensor_key: str
    global_offset: tuple
    is_flattened: bool = False
    flattened_range: tuple | None = None
    replica_id: int | None = None
    local_shape: tuple | None = None


@dataclass
class Metadata:
    state_dict_metadata: dict | None = None
    storage_metadata: dict | None = None
    flat_mapping: dict | None = None


for _cls in (LocalTensorMetadata, LocalTensorIndex, Metadata):
    _cls.__module__ = flex.MODULE


def write_metadata(path: Path, tensors: dict[str, flex.FlexTensor]) -> None:
    """Write ``path`` as paddle's ``save_state_dict`` would for ``tensors`` (one LocalTensorMetadata and one
    LocalTensorIndex per slice)."""
    sdm: dict[str, list[LocalTensorMetadata]] = {}
    stm: dict[LocalTensorIndex, str] = {}
    for t in tensors.values():
        for s in t.slices:
            fr = s.flat
            sdm.setdefault(t.name, []).append(
                LocalTensorMetadata(s.offset, s.shape, t.dtype, t.shape, fr is not None, fr)
            )
            stm[LocalTensorIndex(s.key, s.offset, fr is not None, fr, s.replica, s.shape)] = s.file
    meta = Metadata(sdm, stm, {k: (k,) for k in tensors})
    buf = io.BytesIO()
    _Pickler(buf, protocol=4).dump(meta)
    path.write_bytes(buf.getvalue())


class _Pickler(pickle._Pickler):  # type: ignore[name-defined]  # the pure-Python pickler
    """Names the stand-in classes by paddle's module and class names (STACK_GLOBAL, as paddle's pickles
    do) without importing that module (``pickle`` would import paddle to check the class is there)."""

    def save_global(self, obj, name=None):
        if getattr(obj, "__module__", None) != flex.MODULE:
            return super().save_global(obj, name)
        self.save(flex.MODULE)
        self.save(obj.__qualname__)
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)
        return None


def copy_folder(name: str, dst: Path, config: dict | None = None) -> Path:
    """A writable copy of fixture folder ``name`` (its files only, no oracle) with a ``config.json``."""
    import json

    dst.mkdir(parents=True)
    for p in (DATA / name).iterdir():
        if not p.name.startswith("oracle"):
            shutil.copy2(p, dst / p.name)
    (dst / "config.json").write_text(json.dumps(config if config is not None else {"architectures": []}))
    return dst


def read(folder: Path) -> dict[str, flex.FlexTensor]:
    return flex.read_metadata(next(folder.glob("*.metadata")))
