"""The ``optimizer.pdopt`` that ``--keep-training-state`` resizes (:class:`~surgery.plan.plan.OptimizerEdit`,
planned by :mod:`surgery.plan.training_state`), written as ``paddle.save`` wrote the input and read back
before the output is published.

Untouched tensors are streamed as byte ranges of the input, one resized tensor is in memory at a time. The
file is then walked by the strict opcode reader with its optimizer allow-list
(:func:`surgery.io.readback.check_optimizer`): every accumulator and master weight as planned (names,
dtypes, the new shapes), or the run stops with nothing published.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..io import pdparams
from ..io.formats import MASTER, PDOPT, PickleMeta, Row
from ..io.made import Made
from ..io.readback import Planned
from ..model.tensor import TensorInfo, bf16_bits_to_f32
from ..plan.plan import OptimizerEdit, Resized
from ..plan.training_state import resized_array, span


def write_pdopt(ck_path: Path, edit: OptimizerEdit, dst: Path, out: Path) -> list[str]:
    """Write ``edit`` to ``dst`` as ``paddle.save`` wrote the input (untouched tensors streamed as byte
    ranges, each resized one a :class:`~surgery.io.made.Made`: in memory only while it is written) by
    :data:`~surgery.io.formats.PDOPT`, and read it back by the same format. A resized master weight keeps
    its old entries bit for bit and takes the new ones (grown and reset slack entries) from the resized
    weight in ``out`` (the output folder, its weights written), decoded to float32 (bf16 bits shifted,
    never rounded). Returns the resized names.

    Raises:
        OSError: the write fails. OutputError: the file does not read back as planned.
    """
    src = ck_path / edit.rel
    rows = _rows(src, edit.entries, "", out) + _rows(src, edit.master, MASTER, out)
    meta = PickleMeta(edit.extras, edit.np_module, edit.names)
    PDOPT.write(dst, rows, meta)
    PDOPT.check(dst, _planned(edit.entries, "") + _planned(edit.master, MASTER), meta)
    return edit.resized


def _rows(
    src: Path, entries: tuple[tuple[TensorInfo, Resized | None], ...], prefix: str, out: Path
) -> list[Row]:
    """The rows of ``entries`` (master weights named ``prefix + key``): a kept tensor by byte range of
    ``src``, a resized one made when written (:func:`_resized`)."""
    rows = []
    for t, r in entries:
        if r is None:
            rows.append(
                Row(prefix + t.name, t.dtype, t.shape, pdparams.raw_bytes_source(src, t), None, t.fortran)
            )
            continue
        shape = _new_shape(t, r)
        made = Made.call(partial(_resized, src, t, r, out if prefix else None), shape, np.dtype(t.dtype))
        rows.append(Row(prefix + t.name, t.dtype, shape, made))
    return rows


def _resized(src: Path, t: TensorInfo, r: Resized, out: Path | None) -> np.ndarray[Any, Any]:
    """Tensor ``t`` of ``src`` resized by ``r`` (C order); a master weight's (``out`` given) new entries
    the fp32 of the output's resized weight."""
    a = resized_array(np.asarray(pdparams.read_array(src, t)), r)
    if out is not None and r.fresh():
        weight = _output_weight(out, r.name)
        for lo, hi in r.fresh():
            a[span(r, lo, hi, a.ndim)] = weight[span(r, lo, hi, a.ndim)].astype(a.dtype)
    return np.ascontiguousarray(a)


def _new_shape(t: TensorInfo, r: Resized) -> tuple[int, ...]:
    shape = list(t.shape)
    shape[r.axis] = r.new
    return tuple(shape)


def _planned(entries: tuple[tuple[TensorInfo, Resized | None], ...], prefix: str) -> list[Planned]:
    """The tensors of ``entries`` as :func:`write_pdopt` writes them (named ``prefix + key``): a resized one
    with ``r.new`` entries on its axis."""
    return [
        Planned(prefix + t.name, t.dtype, t.shape if r is None else _new_shape(t, r), 0) for t, r in entries
    ]


def _output_weight(out: Path, name: str) -> np.ndarray[Any, Any]:
    """Tensor ``name`` of the written output's ``.pdparams`` files, as float32 (bf16 bits shifted).

    Raises:
        AssertionError: the output holds no such tensor (the plan resized it: a bug).
    """
    for f in sorted(out.glob("*.pdparams")):
        infos, _, _ = pdparams.read_header(f, f.name)
        for t in infos:
            if t.name == name:
                a = np.asarray(pdparams.read_array(f, t))
                return bf16_bits_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)
    raise AssertionError(f"internal: {name} is not in the output")
