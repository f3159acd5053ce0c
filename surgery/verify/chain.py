"""``verify`` of a chain of writes with a ``convert`` or ``merge`` in it (``tie`` → ``convert``, ``merge`` →
``resize`` → ``add-tokens``), against the chain's original input.

A convert renames, transposes and splits tensors; a merge assembles rank slices: neither changes a value.
The other operations (tie, untie, resize, add-tokens) act on the vocabulary tensors by role, whatever their
names and layout. So the chain is checked as: the input carried through the chain's convert and merge runs
alone, in order, each rebuilt from the previous one's headers by the same planners
(:func:`surgery.verify.rebuilt.rebuild`: nothing written, tensors made on demand: :class:`RebuiltView`), then
compared with the output tensor by tensor as any two checkpoints are (:mod:`surgery.verify.tensors`), the
chain's other runs explaining the vocabulary differences as they do for a chain without a convert.

Config files, safetensors ``__metadata__``, carried files and tokenizers are compared with the original
input's (the chain's ``config_changes`` and target formats explain what convert and merge changed there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..io.checkpoint import Checkpoint, array_rows
from ..model.enums import Container, Target
from ..model.tensor import DTYPES, TensorInfo
from ..plan import convert as convert_plan
from ..plan.plan import OutTensor
from ..report import chain_since, convert_report, history
from .rebuilt import BIG, Rebuilt, expected, rebuild

REWRITES = ("convert", "merge")


@dataclass
class RebuiltView(Checkpoint):
    """The output of a rebuilt ``convert`` / ``merge`` (:class:`~surgery.verify.rebuilt.Rebuilt`) as a
    :class:`~surgery.io.checkpoint.Checkpoint` that is never written: its tensors' headers those the run
    writes, their data made on demand from the source (the last one kept)."""

    rebuilt: Rebuilt | None = None
    made: dict[str, OutTensor] = field(default_factory=dict)
    _last: tuple[str, np.ndarray[Any, Any]] | None = field(default=None, repr=False, compare=False)

    def load(self, name: str) -> np.ndarray[Any, Any]:
        """Tensor ``name`` as the run writes it (stored dtype; bf16 as ``uint16`` bits)."""
        if self._last is None or self._last[0] != name:
            self._last = None
            assert self.rebuilt is not None
            t = self.made[name]
            a = expected(self.rebuilt, t)
            st = DTYPES.get(t.dtype)
            if a.dtype == np.uint8 and st is not None and np.dtype(st.storage) != np.uint8:
                a = a.view(np.dtype(st.storage))
            self._last = (name, a.reshape(tuple(t.shape)))
        return self._last[1]

    def iter_rows(self, name: str, chunk_rows: int, start: int = 0, stop: int | None = None) -> Any:
        """Rows ``start:stop`` of the made tensor in chunks of ``chunk_rows`` (views, no copy)."""
        yield from array_rows(self.load(name), chunk_rows, start, stop)


def _view(rb: Rebuilt, like: Checkpoint | None, path: Path) -> RebuiltView:
    """The rebuilt output as a view at ``path`` (the original input's folder: its report chain and
    tokenizer are read there), its files those of ``like`` (the original input, when it opens whole)."""
    tensors = {}
    container = rb.new.container
    for t in rb.new.tensors:
        st = DTYPES.get(t.dtype)
        n = math.prod(t.shape)
        nbytes = st.nbytes(n) if st is not None else 0
        # labelled as the run's container stores it (a .pdparams: the numpy name, bf16 as uint16)
        label = st.np_name if st is not None and st.np_name and container is Container.PDPARAMS else t.dtype
        tensors[t.name] = TensorInfo(t.name, label, tuple(t.shape), "", -1, nbytes)
    v = RebuiltView(path, dict(rb.new.config), container, False, None, None, [], tensors)
    v.rebuilt, v.made = rb, {t.name: t for t in rb.new.tensors}
    if like is not None:
        v.other_files, v.st_metadata, v.training_state = list(like.other_files), like.st_metadata, []
    else:
        v.other_files = [rel for _, rel in rb.new.carry]
    return v


def applies(a_path: Any, b_path: Any) -> bool:
    """The output's report chain since the input (:func:`surgery.report.chain_since`) holds a ``convert``
    or ``merge`` run and more than that one run, and starts where the input's own chain ends (the input is
    the chain's original, not a folder beside it)."""
    a, b = Path(str(a_path)), Path(str(b_path))
    chain = chain_since(b, a)
    full, own = history(b), history(a)
    starts_here = full[: len(own)] == own and len(full) - len(own) == len(chain)
    return starts_here and len(chain) > 1 and any(e.get("operation") in REWRITES for e in chain)


def carried(a_path: Any, b_path: Any) -> RebuiltView:
    """The input carried through the convert and merge runs of the output's chain (in order), as a view.

    Raises:
        TietoolError, ValueError: a run that does not plan on what the chain made before it (a merge
            after another run: its input was rank files, not a checkpoint the chain made), as
            :func:`surgery.verify.rebuilt.rebuild`.
    """
    src = Path(str(a_path))
    like: Checkpoint | None = None
    ck: Checkpoint | None = None
    for run in chain_since(Path(str(b_path)), src):
        op = run.get("operation")
        if op == "merge":
            if ck is not None:
                raise ValueError("a merge after another run of the chain")
            ck = _view(rebuild(src, {**run, "operation": "merge"}), None, src)
        elif op == "convert":
            if ck is None:
                like = ck = Checkpoint.open(src)
            to = Target(run.get("to"))
            cp = convert_plan.check_dtypes(convert_plan.plan_convert(ck, to))
            rb = Rebuilt(
                convert_plan.output_plan(cp, BIG).reshard,
                ck,
                f"convert to {to.value}",
                convert_report(cp, to, "", None),
            )
            ck = _view(rb, like, src)
    assert isinstance(ck, RebuiltView)
    return ck
