"""``resize`` / ``add-tokens --keep-training-state`` of a PaddleFormers 1.2 Trainer flex checkpoint
(``checkpoint-N/`` with ``model_state/`` + ``optimizer_state/`` [+ ``master_weight/``]): the output is the
same kind of checkpoint, resumable by the Trainer (issue 21).

The edit is planned by the ordinary planners (:func:`surgery.plan.resize.plan_resize`,
:func:`surgery.plan.add_tokens.plan_add_tokens`) on the merged view of the checkpoint
(:class:`surgery.plan.merge_flex.FlexView`, config.json found as ``merge`` finds it; the layout decided by
detection from shapes and config, an ambiguous one refused as for any checkpoint). The new vocabulary
weights of that plan are made whole, and :func:`surgery.plan.flex_state.state_rewrites` gives what the
three flex folders become (moments: new rows zero; master weights: the new rows' fp32 values); every
refusal (a missing moment, an unknown accumulator, a plan that adds or drops tensors) is raised while
planning, before anything is written. :func:`surgery.write.flex_edit.write_flex_edit` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..io import flex
from ..io.safetensors_io import Source
from ..model.errors import Opt, RefusedError
from . import recipes
from .flex_state import New, state_rewrites
from .merge_flex import FlexPlan, FlexView, flex_view, plan_flex
from .plan import Plan


@dataclass
class FlexEdit:
    """A planned edit of a Trainer flex checkpoint (nothing written yet).

    Attributes:
        plan: the plan on the merged view (its ``ckpt`` the :class:`FlexView`, ``config_set`` and
            ``tokenizer`` as for any checkpoint).
        flex: the merge plan of the checkpoint (its original config, where config.json was found).
        rewrites: per flex folder (``model_state`` ...), key -> (paddle dtype name, new full array).
    """

    plan: Plan
    flex: FlexPlan
    rewrites: dict[str, New]

    @property
    def ckpt(self) -> Any:
        return self.plan.ckpt

    @property
    def changed(self) -> bool:
        return self.plan.changed

    @property
    def root(self) -> Path:
        return self.flex.ck.folder.root

    @property
    def output_bytes(self) -> int:
        return sum(a.nbytes for new in self.rewrites.values() for _, a in new.values())


def is_trainer_checkpoint(path: Any) -> bool:
    """``path`` is a local Trainer flex checkpoint: ``model_state/`` (``.distcp`` + ``.metadata``) and
    ``optimizer_state/`` beside it."""
    try:
        folder = flex.find(Path(path))
    except TypeError:
        return False
    return folder is not None and folder.state.name == "model_state" and "optimizer_state" in folder.others


def open_view(src: Path) -> tuple[FlexPlan, Any]:
    """The merge plan of checkpoint ``src`` and its merged view (what the planners take).

    Raises:
        CheckpointError, UnsafePickleError, RefusedError: as :func:`plan_flex` (no config.json found, ...).
    """
    fp = plan_flex(src)
    return fp, flex_view(fp)


def _refuse(root: Path, why: str) -> RefusedError:
    return RefusedError(
        f"{Opt('keep_training_state', True)}: {why}",
        root,
        "merge the checkpoint first (tietool merge) and edit the merged model; training then restarts its "
        "optimizer statistics",
    )


def new_weights(plan: Plan) -> dict[str, np.ndarray[Any, Any]]:
    """The new full weight (stored dtype, bf16 as uint16) of every tensor ``plan`` changes the shape of.

    Raises:
        RefusedError: the plan adds or drops tensors, or changes a tensor's values without changing its
            shape (rows of slack taken by new tokens: their optimizer state cannot be told apart here).
    """
    root = plan.ckpt.path
    if plan.add or plan.drop:
        names = [t.name for t in plan.add] + list(plan.drop)
        raise _refuse(
            root,
            f"the plan adds or drops tensors ({', '.join(names[:3])}), which a flex "
            "checkpoint's optimizer state cannot follow",
        )
    memo: dict[Any, Any] = {}
    out = {}
    for name, nt in plan.replace.items():
        if tuple(nt.shape) == tuple(plan.ckpt.tensors[name].shape):
            raise _refuse(
                root,
                f"{name} keeps its shape {list(nt.shape)} but gets new values (rows of slack "
                "used); the optimizer state of those rows cannot be reset in a flex checkpoint",
            )
        view = plan.ckpt
        assert isinstance(view, FlexView), "internal: a flex edit is planned on a FlexView"
        out[name] = _array(recipes.make(nt.recipe, view, memo), view.recipes[name].dtype, nt.shape)
        memo.clear()  # one new table at a time in the memo (the result is kept)
    return out


def _array(data: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """``data`` (an array, or a :class:`Source` of byte ranges and arrays) as one array of ``shape``."""
    if not isinstance(data, Source):
        return np.ascontiguousarray(data)
    return np.frombuffer(b"".join(_bytes(data)), dtype=dtype).reshape(shape).copy()


def _bytes(s: Source) -> list[bytes]:
    """The bytes of ``s``: its parts in order, a byte range read from its file, or its array's bytes."""
    if s.parts is not None:
        return [b for p in s.parts for b in _bytes(p)]
    if s.array is not None:
        return [np.ascontiguousarray(s.array).tobytes()]
    assert s.path is not None, "internal: a Source with no data"
    with open(s.path, "rb") as f:
        f.seek(s.offset)
        return [f.read(s.nbytes)]


def plan_flex_edit(fp: FlexPlan, plan: Plan) -> FlexEdit:
    """The edit of the Trainer checkpoint of ``fp`` that ``plan`` (made on its view) describes.

    Raises:
        RefusedError: as :func:`new_weights` and :func:`surgery.plan.flex_state.state_rewrites`.
    """
    weights = new_weights(plan) if plan.changed else {}
    rewrites = state_rewrites(fp.ck.folder.root, weights) if weights else {}
    return FlexEdit(plan, fp, rewrites)
