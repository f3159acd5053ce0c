"""The ``optimizer.pdopt`` that ``--keep-training-state`` resizes (:class:`~surgery.plan.plan.OptimizerEdit`,
planned by :mod:`surgery.plan.training_state`), written as ``paddle.save`` wrote the input and read back
before the output is published.

Untouched tensors are streamed as byte ranges of the input, one resized tensor is in memory at a time. The
file is then walked by the strict opcode reader with its optimizer allow-list
(:func:`surgery.io.readback.check_optimizer`): every accumulator and master weight as planned (names,
dtypes, the new shapes), or the run stops with nothing published.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..io import pdparams
from ..io.readback import Planned, check_optimizer
from ..io.safetensors_io import Source
from ..model.tensor import TensorInfo, bf16_bits_to_f32
from ..plan.plan import OptimizerEdit, Resized
from ..plan.training_state import resized_array, span


def write_pdopt(ck_path: Path, edit: OptimizerEdit, dst: Path, out: Path) -> list[str]:
    """Write ``edit`` to ``dst`` as ``paddle.save`` wrote the input (untouched tensors streamed as byte
    ranges, one resized tensor in memory at a time) and read it back. A resized master weight keeps its
    old entries bit for bit and takes the new ones (grown and reset slack entries) from the resized weight
    in ``out`` (the output folder, its weights written), decoded to float32 (bf16 bits shifted, never
    rounded). Returns the resized names.

    Raises:
        OSError: the write fails. OutputError: the file does not read back as planned.
    """
    src = ck_path / edit.rel

    def rows(entries: tuple[tuple[TensorInfo, Resized | None], ...], master: bool) -> Iterator[pdparams.Row]:
        for t, r in entries:
            if r is None:
                yield t.name, t.dtype, t.shape, pdparams.raw_bytes_source(src, t), None, t.fortran
                continue
            a = resized_array(np.asarray(pdparams.read_array(src, t)), r)
            if master and r.fresh():
                weight = _output_weight(out, r.name)
                for lo, hi in r.fresh():
                    a[span(r, lo, hi, a.ndim)] = weight[span(r, lo, hi, a.ndim)].astype(a.dtype)
            yield t.name, t.dtype, a.shape, Source(array=np.ascontiguousarray(a)), None, False

    pdparams.write_optimizer_file(
        dst, rows(edit.entries, False), rows(edit.master, True), edit.names, edit.extras, edit.np_module
    )
    check_optimizer(dst, _planned(edit.entries), _planned(edit.master))
    return edit.resized


def _planned(entries: tuple[tuple[TensorInfo, Resized | None], ...]) -> list[Planned]:
    """The tensors of ``entries`` as :func:`write_pdopt` writes them: a resized one with ``r.new``
    entries on its axis."""
    out = []
    for t, r in entries:
        shape = list(t.shape)
        if r is not None:
            shape[r.axis] = r.new
        out.append(Planned(t.name, t.dtype, tuple(shape), 0))
    return out


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
