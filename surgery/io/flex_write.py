"""Write a flex checkpoint's ``.metadata`` (``paddle.distributed.save_state_dict``'s index) without paddle.

Format code is justified here: no library writes Paddle's ``.metadata`` records without importing paddle
(``pickle`` itself would import ``paddle.distributed.flex_checkpoint.dcp.metadata`` to name the classes),
and tietool never imports paddle outside tests. So the three records are emitted by
:class:`~surgery.io.pdparams_io.Emitter` (the opcode emitter of tietool's ``.pdparams`` writer, which also
writes the ``.distcp`` files: they are ``paddle.save`` pickles of ``{key: ndarray}``) exactly as paddle's
pickle writes them (``tests/data/flex/README.md``, "What the ``.metadata`` pickle names"): protocol 4,
``STACK_GLOBAL`` of ``Metadata`` / ``LocalTensorMetadata`` / ``LocalTensorIndex`` from
:data:`~surgery.io.flex.MODULE`, ``EMPTY_TUPLE NEWOBJ``, then the field dict and ``BUILD``, fields in the
dataclasses' order. Proven by ``tests/test_flex_write.py``: tietool's reader reads back what it wrote, and
paddle's own ``load_state_dict`` fills full-size tensors from a written folder bit for bit (fp32, bf16,
row slices, flattened slices).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .flex import MODULE, FlexTensor
from .pdparams_io import Emitter


@dataclass(frozen=True)
class _Rec:
    """One record to emit: paddle's class name and its fields in order."""

    cls: str
    fields: tuple[tuple[str, Any], ...]


class _RecordEmitter(Emitter):
    """:class:`Emitter` that also writes :class:`_Rec` values (as dict keys too)."""

    def obj(self, v: Any) -> None:
        if not isinstance(v, _Rec):
            super().obj(v)
            return
        self.glob(MODULE, v.cls)
        self.w(b")\x81")  # EMPTY_TUPLE NEWOBJ: cls.__new__(cls)
        self.memoize()
        self.w(b"}(")
        for k, x in v.fields:
            self.string(k)
            self.obj(x)
        self.w(b"ub")  # SETITEMS BUILD: the instance's __dict__ from the field dict


def _records(tensors: dict[str, FlexTensor]) -> _Rec:
    """The ``Metadata`` record of ``tensors``: one ``LocalTensorMetadata`` and one ``LocalTensorIndex``
    per slice, ``flat_mapping`` ``{key: (key,)}`` (as a flat state dict saves)."""
    sdm: dict[str, list[_Rec]] = {}
    stm: dict[_Rec, str] = {}
    for t in tensors.values():
        for s in t.slices:
            flat = s.flat is not None
            sdm.setdefault(t.name, []).append(
                _Rec(
                    "LocalTensorMetadata",
                    (
                        ("global_offset", s.offset),
                        ("local_shape", s.shape),
                        ("dtype", t.dtype),
                        ("global_shape", t.shape),
                        ("is_flattened", flat),
                        ("flattened_range", s.flat),
                    ),
                )
            )
            index = (
                ("tensor_key", s.key),
                ("global_offset", s.offset),
                ("is_flattened", flat),
                ("flattened_range", s.flat),
                ("replica_id", s.replica),
                ("local_shape", s.shape),
            )
            stm[_Rec("LocalTensorIndex", index)] = s.file
    fields = (
        ("state_dict_metadata", sdm),
        ("storage_metadata", stm),
        ("flat_mapping", {k: (k,) for k in tensors}),
    )
    return _Rec("Metadata", fields)


def write_metadata(path: Path, tensors: dict[str, FlexTensor]) -> None:
    """Write ``path`` as the ``.metadata`` that ``paddle.distributed.save_state_dict`` writes for
    ``tensors`` (global shape, paddle dtype name such as ``"float32"`` / ``"bfloat16"``, and for every slice
    its file, key, ``global_offset``, ``local_shape``, flattened range and replica id).

    The file is fsynced. Nothing is imported from paddle; the records are emitted as opcodes (module
    docstring). Raises ``TypeError`` for a field value the emitter cannot write (never for a
    :class:`FlexTensor` read by :func:`surgery.io.flex.read_metadata`).
    """
    with open(path, "wb") as f:
        e = _RecordEmitter(f, "numpy.core.multiarray")
        e.w(b"\x80\x04")
        e.obj(_records(tensors))
        e.w(b".")
        f.flush()
        os.fsync(f.fileno())
