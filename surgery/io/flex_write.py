"""Write a flex checkpoint's ``.metadata`` (``paddle.distributed.save_state_dict``'s index) without paddle.

Format code is justified here: no library writes Paddle's ``.metadata`` records without importing paddle
(``pickle`` itself would import ``paddle.distributed.flex_checkpoint.dcp.metadata`` to name the classes),
and tietool never imports paddle outside tests. So the three records are emitted by
:class:`~surgery.io.pdparams.Emitter` (the opcode emitter of tietool's ``.pdparams`` writer, which also
writes the ``.distcp`` files: they are ``paddle.save`` pickles of ``{key: ndarray}``) exactly as paddle's
pickle writes them (``tests/data/flex/README.md``, "What the ``.metadata`` pickle names"): protocol 4,
``STACK_GLOBAL`` of ``Metadata`` / ``LocalTensorMetadata`` / ``LocalTensorIndex`` from
:data:`~surgery.io.flex.MODULE`, ``EMPTY_TUPLE NEWOBJ``, then the field dict and ``BUILD``, fields in the
dataclasses' order. Proven by ``tests/oracles/test_flex_write.py``: tietool's reader reads back what it wrote,
and paddle's own ``load_state_dict`` fills full-size tensors from a written folder bit for bit (fp32, bf16,
row slices, flattened slices).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import pdparams, readback, tree
from .flex import MODULE, FlexSlice, FlexTensor
from .formats import PDPARAMS, FileFormat, PickleMeta, Row, Written
from .made import Made
from .pdparams import Emitter
from .readback import Planned
from .safetensors_io import Source


@dataclass(frozen=True)
class _Rec:
    """One record to emit: paddle's class name and its fields in order."""

    cls: str
    fields: tuple[tuple[str, Any], ...]


class _RecordEmitter(Emitter):
    """:class:`Emitter` that also writes :class:`_Rec` values (as dict keys too)."""

    def other(self, v: Any) -> None:  # Emitter.obj tries its exact types first; a _Rec is none of them
        if not isinstance(v, _Rec):
            super().other(v)
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


def whole(name: str, dtype: str, shape: tuple[int, ...], file: str) -> FlexTensor:
    """A :class:`FlexTensor` stored whole: one slice, offset 0, not flattened, key ``name``, in ``file``.

    Paddle's ``load_state_dict`` reshards any saved layout to the layout asked for (``get_rank_to_files``
    lets every rank read every file; only its local fast path, ``check_resumable_locally``, wants each
    rank's slices in ``<rank>_0.distcp``, and it falls back to resharding otherwise), so a whole slice
    loads into any target layout.
    """
    return FlexTensor(name, shape, dtype, (FlexSlice(file, name, (0,) * len(shape), shape),))


Replacement = np.ndarray | Made
"""A replaced tensor's new value: its full array (storage dtype), or a :class:`~surgery.io.made.Made`
computing it when it is written (:meth:`Made.call <surgery.io.made.Made.call>`)."""


def _source(a: Replacement) -> Source:
    return a if isinstance(a, Made) else Source(array=np.ascontiguousarray(a))


def _write_metadata(path: Path, entries: Iterable[Row], metadata: dict[str, FlexTensor]) -> int:
    """:func:`write_metadata` in the signature of every :class:`~surgery.io.formats.FileFormat`: a
    ``.metadata`` holds no tensor data, only the records of ``metadata``."""
    assert not list(entries), "internal: a flex .metadata holds records, not tensors"
    write_metadata(path, metadata)
    return 0


def _check_metadata(path: Path, planned: Sequence[Planned], metadata: dict[str, FlexTensor]) -> None:
    readback.check_flex_metadata(path, metadata)


FLEX_METADATA = FileFormat(write=_write_metadata, check=_check_metadata)
"""A flex ``.metadata``: no entries, its metadata the records (key → :class:`FlexTensor`) of its folder."""


def _rewrite_file(src: Path, dst: Path, drop: set[str], add: list[tuple[str, Replacement]]) -> Written:
    """``src`` (a ``.distcp``) as ``dst`` without the keys ``drop``, with ``add`` (key, array in storage
    dtype or a :class:`~surgery.io.made.Made`, computed as it is streamed) in the place of the first
    dropped key (or at the end); the other entries' payload bytes are copied from ``src`` unchanged, the
    non-tensor entries kept; ``StructuredToParameterName@@`` loses the dropped keys and names each added
    key (its old name, else itself): ``paddle.load`` makes a Tensor of every key that table names and fails
    on a named key the file lacks (measured). Written by :data:`~surgery.io.formats.PDPARAMS` (a
    ``.distcp`` is a ``paddle.save`` pickle); returns the file as written, for its read-back."""
    infos, extras, module = pdparams.read_header(src, src.name)
    new = [Row(k, np.dtype(a.dtype).name, tuple(a.shape), _source(a)) for k, a in add]
    rows: list[Row] = []
    for t in infos:
        if t.name in drop:
            rows.extend(new)
            new = []
            continue
        rows.append(Row(t.name, t.dtype, t.shape, pdparams.raw_bytes_source(src, t), t.storage, t.fortran))
    rows.extend(new)
    table = extras.get(pdparams.NON_TENSOR_KEYS[0])
    if isinstance(table, dict):  # paddle.load looks up every key it names: dropped keys leave it
        kept = {k: v for k, v in table.items() if k not in drop}
        extras[pdparams.NON_TENSOR_KEYS[0]] = {**kept, **{k: table.get(k, k) for k, _ in add}}
    meta = PickleMeta(extras, module)
    PDPARAMS.write(dst, rows, meta)
    return Written(
        dst.name, PDPARAMS, [Planned(r.name, r.dtype, tuple(r.shape), r.source.nbytes) for r in rows], meta
    )


@dataclass(frozen=True)
class FolderRewrite:
    """What :func:`rewrite_folder` wrote: the read-back's plan of the folder.

    Attributes:
        tensors: the folder's tensors as its new ``.metadata`` records them.
        metadata: the ``.metadata`` file's name.
        rewritten: each rewritten ``.distcp`` file's name → its tensors as written, in order.
        placed: every other file's name → how it was placed (:func:`surgery.io.tree.place_kept`).
        written: every file written (the rewritten ``.distcp`` files, then the ``.metadata``), each read
            back by its format (:meth:`~surgery.io.formats.Written.check`).
    """

    tensors: dict[str, FlexTensor]
    metadata: str
    rewritten: dict[str, list[Planned]]
    placed: dict[str, tree.Placed]
    written: list[Written]


def rewrite_folder(
    src: Path,
    dst: Path,
    metadata: str,
    tensors: dict[str, FlexTensor],
    new: dict[str, tuple[str, Replacement]],
) -> FolderRewrite:
    """Write flex folder ``src`` (read as ``tensors``, its index file ``metadata``) into the empty folder
    ``dst`` with the tensors of ``new`` (key -> (paddle dtype name, full array in storage dtype: bf16 as
    uint16, or a :class:`~surgery.io.made.Made` computing it)) replaced, each written whole (:func:`whole`)
    into the file of its first old slice. A :class:`~surgery.io.made.Made` is computed while its bytes are
    streamed and dropped after: peak memory is what the largest one needs, not the sum.

    A ``.distcp`` that holds a slice of a replaced tensor is rewritten by :func:`_rewrite_file`; every
    other file of ``src`` is kept by :func:`surgery.io.tree.place_kept` (hard-linked; a symbolic link by
    its rule; copied across file systems). The ``.metadata`` is rewritten with the replaced tensors'
    records only changed (:data:`FLEX_METADATA`). Nothing is read back here: the caller checks each of
    :attr:`FolderRewrite.written` (:mod:`surgery.write.flex_edit`).
    Raises ``KeyError`` for a key of ``new`` that ``tensors`` lacks (callers check first).
    """
    out = dict(tensors)
    drop: dict[str, set[str]] = {}
    add: dict[str, list[tuple[str, Replacement]]] = {}
    for key, (dtype, a) in new.items():
        old = tensors[key]
        for s in old.slices:
            drop.setdefault(s.file, set()).add(s.key)
        file = old.slices[0].file
        add.setdefault(file, []).append((key, a))
        out[key] = whole(key, dtype, tuple(a.shape), file)
    done = FolderRewrite(out, metadata, {}, {}, [])
    files = [p for p in sorted(src.iterdir()) if p.name != metadata and p.is_file()]
    kept = {p.name for p in files if p.name not in drop}
    for p in files:
        if p.name in drop:
            done.written.append(_rewrite_file(p, dst / p.name, drop[p.name], add.get(p.name, [])))
            done.rewritten[p.name] = list(done.written[-1].planned)
            continue
        placed = done.placed[p.name] = tree.place_kept(p, dst / p.name, src, kept, True)
        if placed is tree.Placed.COPY:
            shutil.copy2(p, dst / p.name)
    FLEX_METADATA.write(dst / metadata, (), out)
    done.written.append(Written(metadata, FLEX_METADATA, (), out))
    return done
