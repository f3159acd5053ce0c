"""``resize`` / ``add-tokens --keep-training-state`` of a PaddleFormers 1.2 Trainer flex checkpoint
(``checkpoint-N/`` with ``model_state/`` + ``optimizer_state/`` [+ ``master_weight/``]): the output is the
same kind of checkpoint, resumable by the Trainer.

The edit is planned by the ordinary planners (:func:`surgery.plan.resize.plan_resize`,
:func:`surgery.plan.add_tokens.plan_add_tokens`) on the merged view of the checkpoint
(:class:`surgery.plan.merge_flex.FlexView`, config.json found as ``merge`` finds it; the layout decided by
detection from shapes and config, an ambiguous one refused as for any checkpoint). The new vocabulary
weights of that plan (as :class:`~surgery.io.made.Made` tensors: computed when written, one tensor in
memory at a time), and :func:`surgery.plan.flex_state.state_rewrites` gives what the three flex folders
become (moments: new rows, and slack rows new tokens take, zero; master weights: their fp32 values; a tied
model's embedding and stored duplicate head both rewritten, the parameter's state where the Trainer stored
it, under the head's name); every
refusal (a missing moment, an unknown accumulator, a plan that adds or drops tensors) is raised while
planning from the ``.metadata`` records alone (a ``--dry-run`` reads no tensor data), before anything is
written. The plan's layout is then :class:`~surgery.plan.plan.FlexFolders`;
:func:`surgery.write.flex_edit.write_flex_edit` writes it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..io import flex
from ..io.made import Made
from ..io.safetensors_io import Source
from ..model.errors import Opt, RefusedError
from . import recipes
from .flex_state import state_rewrites
from .merge_flex import FlexPlan, FlexView, flex_view, plan_flex
from .plan import FlexFolders, Plan, Resized
from .training_state import reset_note, slack_rows


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


def new_weights(plan: Plan) -> dict[str, Made]:
    """The new full weight of every tensor ``plan`` changes (its shape, or the slack rows new tokens take),
    as a :class:`~surgery.io.made.Made` (shape and stored dtype, bf16 as uint16, known now; the array
    computed by the plan's recipe when it is written, nothing read here).

    Raises:
        RefusedError: the plan adds or drops tensors (a flex edit keeps every name the Trainer resumes:
            the planners keep a tied model's stored duplicate head on a :class:`FlexView`).
    """
    root = plan.ckpt.path
    if plan.add or plan.drop:
        names = [t.name for t in plan.add] + list(plan.drop)
        raise _refuse(
            root,
            f"the plan adds or drops tensors ({', '.join(names[:3])}), which a flex "
            "checkpoint's optimizer state cannot follow",
        )
    view = plan.ckpt
    assert isinstance(view, FlexView), "internal: a flex edit is planned on a FlexView"
    out = {}
    for name, nt in plan.replace.items():
        dtype = np.dtype(view.recipes[name].dtype)
        made = partial(_made, view, nt.recipe, dtype, tuple(nt.shape), {})
        out[name] = Made.call(made, tuple(nt.shape), dtype)
    return out


SMALL = 64 << 20
"""Sub-results of a weight's recipe up to this size (its new rows) are kept between the two times it is
made (for the master weight's new rows, then for ``model_state``): the mean init is computed once."""


def _made(
    view: FlexView, recipe: Any, dtype: np.dtype[Any], shape: tuple[int, ...], kept: dict[Any, Any]
) -> np.ndarray[Any, Any]:
    """The array of ``recipe`` made on ``view`` (its sub-recipes once; the small ones kept in ``kept`` for
    the next call), the view's assembled tensor dropped after, so that only the result stays in memory."""
    memo = dict(kept)
    try:
        return _array(recipes.make(recipe, view, memo), dtype, shape)
    finally:
        kept.update({k: v for k, v in memo.items() if isinstance(v, np.ndarray) and v.nbytes <= SMALL})
        memo.clear()
        view.forget()


def _array(data: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """``data`` (an array, or a :class:`Source` of byte ranges and arrays) as one array of ``shape``, the
    bytes of a :class:`Source` copied straight into it (no intermediate copies)."""
    if not isinstance(data, Source):
        return np.ascontiguousarray(data)
    out = np.empty(shape, dtype=dtype)
    buf = out.reshape(-1).view(np.uint8).data
    end = _fill(data, buf, 0)
    assert end == len(buf), f"internal: {end} bytes for a {list(shape)} {dtype} tensor"
    return out


def _fill(s: Source, buf: memoryview, pos: int) -> int:
    """Copy the bytes of ``s`` (its parts in order, a byte range of its file, or its array) into ``buf``
    from ``pos``; returns the position after them."""
    if s.parts is not None:
        for p in s.parts:
            pos = _fill(p, buf, pos)
        return pos
    if s.array is not None:
        b = np.ascontiguousarray(s.array).reshape(-1).view(np.uint8)
        buf[pos : pos + b.size] = b.data
        return pos + b.size
    assert s.path is not None, "internal: a Source with no data"
    with open(s.path, "rb") as f:
        f.seek(s.offset)
        got = f.readinto(buf[pos : pos + s.nbytes])
    assert got == s.nbytes, f"internal: {s.path} ended at {got} of {s.nbytes} bytes"
    return pos + s.nbytes


def slack(plan: Plan) -> dict[str, tuple[int, tuple[int, int]]]:
    """Per tensor of ``plan`` whose slack rows new tokens take (``add-tokens`` without growing, or before
    growing), ``(axis, (lo, hi))`` (:func:`surgery.plan.training_state.slack_rows`)."""
    out = {}
    for name, nt in plan.replace.items():
        got = slack_rows(nt, tuple(plan.ckpt.tensors[name].shape))
        if got is not None:
            out[name] = got
    return out


def shared_names(plan: Plan) -> list[str]:
    """The names of ``plan`` that are one tied parameter: with the config tied, the embedding and every
    tensor given the embedding's very recipe (the stored duplicate head of a tied model, which the
    planners keep on a :class:`FlexView`); [] for an untied model."""
    det = plan.det
    emb = plan.replace.get(det.embedding.name)
    if not det.tie.tied or emb is None:
        return []
    return [n for n, nt in plan.replace.items() if nt.recipe == emb.recipe and nt.shape == emb.shape]


def plan_flex_edit(fp: FlexPlan, plan: Plan) -> Plan:
    """``plan`` (made on the view of the Trainer checkpoint of ``fp``) with the layout that edits the
    checkpoint's flex folders (:class:`~surgery.plan.plan.FlexFolders`): the tensors it changes, their
    moments and master weights (a tied parameter's where the Trainer stored them: :func:`shared_names`;
    slack rows new tokens take reset, said in the plan's notes); ``plan.section`` is ``fp``.

    Raises:
        RefusedError: as :func:`new_weights` and :func:`surgery.plan.flex_state.state_rewrites`.
    """
    weights = new_weights(plan) if plan.changed else {}
    rows = slack(plan)
    root = fp.ck.folder.root
    rewrites = state_rewrites(root, weights, rows, shared_names(plan)) if weights else {}
    resets = [Resized(n, n, a, 0, 0, r) for n, (a, r) in rows.items() if n in weights]
    moments = rewrites.get("optimizer_state", {})
    note = reset_note([r for r in resets if any(k.startswith(r.name + ".") for k in moments)])
    if note is not None:
        plan.notes.append(note)
    if isinstance(plan.ckpt, FlexView):
        plan.ckpt.forget()  # what detection assembled: the writer makes each tensor when it writes it
    plan.layout = FlexFolders(root, fp.config, fp.config_file, rewrites)
    plan.section = fp
    return plan
