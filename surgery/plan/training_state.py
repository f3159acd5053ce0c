"""``--keep-training-state`` of ``resize`` / ``add-tokens``: the optimizer state resized with the vocabulary.

A training run saves the optimizer beside the weights so that it can resume. PaddleNLP 2.8 / PaddleFormers
1.2's Trainer writes ``optimizer.pdopt`` with ``paddle.save(optimizer.state_dict())``: a pickle of
``{accumulator name: ndarray, "LR_Scheduler": {...}, "StructuredToParameterName@@": {...}}`` whose
accumulator names are ``<parameter name>_<accumulator>_<n>`` (``embedding_0.w_0_moment1_0``; with master
weights ``embedding_0.w_0_fp32_master_0_moment1_0``); the parameter name of each tensor is in the model's
own ``StructuredToParameterName@@`` (``model.embed_tokens.weight`` → ``embedding_0.w_0``). Paddle's
``Optimizer.set_state_dict`` assigns every accumulator by that name, so a moment left at the old shape
fails (or pairs rows wrongly) when training resumes from the resized model.

For every parameter the plan changes the shape of (the vocabulary tables), each element-wise accumulator
(:data:`RESIZED`: AdamW's ``moment1``, ``moment2``, ``moment2_max``) gets the same new rows (or columns)
as the weight, all zero (a new token's statistics start from nothing, as a new parameter's do), or loses
the trimmed ones; slack rows that ``add-tokens`` gives to new tokens without growing (:func:`slack_rows`)
get their accumulator entries reset to zero and their master weights set to the new values in the same
way (the statistics of whatever trained those rows before are not the new token's); ``beta1_pow_acc`` /
``beta2_pow_acc`` (one value per parameter) and every other tensor are kept bit for bit. Proven by
``tests/oracles/test_training_state.py``: Paddle loads the rewritten file into AdamW
of the resized model (``set_state_dict``) and trains one more step.

Files of no parameter (``scheduler.pdparams``, ``trainer_state.json``, ``rng_state*``, ``scaler.pdparams``)
are carried unchanged. Any other optimizer file (sharded or unified-checkpoint ``optimizer-*.safetensors``,
``master_weights*``, rank-tagged ``optimizer.tp00.pdopt``, PaddleFormers flex ``optimizer_state/`` +
``master_weight/`` beside whole-model weights, a ``.pdopt`` of master weights) is refused by name (exit 5)
before anything is written. A PaddleFormers Trainer flex ``checkpoint-N/`` itself (no whole weights) is
not planned here: :mod:`surgery.plan.flex_edit` resizes its three flex folders
(:mod:`surgery.plan.flex_state`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ..io import pdparams, surface
from ..model.errors import Opt, RefusedError
from ..model.tensor import TensorInfo
from .plan import OptimizerEdit, OutTensor, Plan, Resized
from .recipes import EditedBias, EditedTable

PDOPT = "optimizer.pdopt"
# training-state files that hold no per-parameter tensor: valid for the resized model as they are
SHAPE_FREE = re.compile(r"^(scheduler\.(pdparams|pt)|trainer_state\.json|rng_state.*|scaler\.(pdparams|pt))$")
# PaddleFormers 1.2 flex checkpoint folders of the optimizer (trainer.py _save_flex_optimizer_state)
FLEX_FOLDERS = ("optimizer_state", "master_weight")
# Paddle AdamW / Adam accumulators (paddle/optimizer/adamw.py: _moment1_acc_str, ...): resized element-wise
RESIZED = ("moment1", "moment2", "moment2_max")
KEPT = ("beta1_pow_acc", "beta2_pow_acc")
_ACC_RE = re.compile(
    rf"^(?P<param>.+?)(?P<master>_fp32_master_0)?_(?P<acc>{'|'.join(RESIZED + KEPT)})_(?P<n>\d+)$"
)


def _fix() -> str:
    return (
        f"run without {Opt('keep_training_state', True)} (the optimizer state is left out; training restarts "
        "its statistics), or edit the checkpoint the training library saves whole and let it rebuild it"
    )


def _refuse(ck_path: Any, rel: str, why: str) -> RefusedError:
    return RefusedError(f"{Opt('keep_training_state', True)}: {rel} {why}", ck_path / rel, _fix())


def slack_rows(nt: OutTensor, old: tuple[int, ...]) -> tuple[int, tuple[int, int]] | None:
    """``(axis, (lo, hi))``: the entries below ``old``'s size on ``axis`` that the plan's tensor ``nt``
    (shaped ``old`` before) gives to new tokens (``add-tokens`` over slack rows: an
    :class:`~surgery.plan.recipes.EditedTable` or :class:`~surgery.plan.recipes.EditedBias` starting below
    the old size); None: no old entry gets a new value."""
    r = nt.recipe
    if isinstance(r, EditedTable):
        axis, start, count = r.axis, r.start, len(r.tokens.specs)
    elif isinstance(r, EditedBias):
        axis, start, count = len(old) - 1, r.start, len(r.specs)
    else:
        return None
    if axis >= len(old) or start >= old[axis] or count == 0:
        return None
    return axis, (start, min(start + count, old[axis]))


def resized_params(plan: Plan) -> list[Resized]:
    """The parameters whose shape ``plan`` changes, with their parameter names.

    Raises:
        RefusedError: a changed tensor changes more than one axis, or has no parameter name (no
            ``StructuredToParameterName@@`` entry: a safetensors checkpoint, whose optimizer keys cannot
            be tied to its tensors); the plan adds or drops a tensor (its optimizer state cannot be made).
    """
    ck = plan.ckpt
    s2p: dict[str, str] = {}
    for ex in ck.extras.values():
        m = ex.get("StructuredToParameterName@@")
        if isinstance(m, dict):
            s2p.update({k: v for k, v in m.items() if isinstance(k, str) and isinstance(v, str)})
    kept = {s2p.get(n) for n in ck.tensors if n not in plan.drop}
    # a dropped tensor whose parameter another tensor keeps (a tied checkpoint's duplicate head) is no loss
    lost = [t.name for t in plan.add] + [n for n in plan.drop if s2p.get(n) is None or s2p[n] not in kept]
    if lost:
        raise _refuse(
            ck.path, "", f"cannot follow a plan that adds or drops parameters ({', '.join(lost[:3])})"
        )
    out = []
    for name, nt in plan.replace.items():
        old = tuple(ck.tensors[name].shape)
        slack = slack_rows(nt, old)
        axes = [i for i, (a, b) in enumerate(zip(old, nt.shape, strict=False)) if a != b]
        if not axes and slack is None:
            continue
        axes = axes or ([slack[0]] if slack is not None else [])
        if len(old) != len(nt.shape) or len(axes) != 1 or (slack is not None and slack[0] != axes[0]):
            raise _refuse(ck.path, ck.tensors[name].file, f"{name} changes {list(old)} → {list(nt.shape)}")
        if name not in s2p:
            raise _refuse(
                ck.path,
                ck.tensors[name].file,
                f"names no parameter for {name} (no StructuredToParameterName@@ entry), so the optimizer's "
                "accumulators of it cannot be found",
            )
        reset = slack[1] if slack is not None else None
        out.append(Resized(name, s2p[name], axes[0], old[axes[0]], nt.shape[axes[0]], reset))
    return out


def reset_note(resized: list[Resized]) -> str | None:
    """The note that says which slack rows' optimizer state was reset (None: no row was)."""
    done = [f"{r.name} rows {r.reset[0]}..{r.reset[1] - 1}" for r in resized if r.reset is not None]
    if not done:
        return None
    return (
        f"{Opt('keep_training_state', True)}: the optimizer moments of the slack rows new tokens took were "
        f"reset to zero and their master weights (if any) set to the new values ({'; '.join(done)}): "
        "they held the statistics of what trained those rows before"
    )


def plan_training_state(plan: Plan) -> dict[str, OptimizerEdit]:
    """The rewrites ``--keep-training-state`` makes to the training state of ``plan``'s checkpoint: one
    :class:`OptimizerEdit` per optimizer file, by its path in the folder ({} when no shape changes: the
    state still fits and is copied as it is).

    Raises:
        RefusedError: a training-state file tietool cannot resize (named, with the format), a remote
            checkpoint, or as :func:`resized_params` and :func:`plan_pdopt`. Nothing is written.
    """
    ck = plan.ckpt
    if not plan.changed:
        return {}
    resized = resized_params(plan)
    if not resized:
        return {}
    note = reset_note(resized)
    if note is not None:
        plan.notes.append(note)
    flex = sorted(
        {f.split("/", 1)[0] for f in ck.other_files if f.split("/", 1)[0] in FLEX_FOLDERS}
        | {f.split("/", 1)[0] for f in ck.training_state if surface.TRAINER_FLEX_STATE.match(f)}
    )
    if flex:
        what = "the weights" if flex[0] == "model_state" else "optimizer state"
        raise _refuse(
            ck.path,
            flex[0] + "/",
            f"is PaddleFormers flex-checkpoint {what} (.distcp slices) beside whole-model weights: tietool "
            "resizes a flex checkpoint-N/ as a whole only (one without the whole weights)",
        )
    edits = {}
    for rel in ck.training_state:
        base = rel.rsplit("/", 1)[-1]
        if SHAPE_FREE.match(base):
            continue
        if rel != PDOPT:
            raise _refuse(ck.path, rel, f"is {_format_of(base)}: tietool does not resize it")
        if not ck.local:
            raise _refuse(ck.path, rel, "is in object storage; tietool rewrites optimizer state locally only")
        edits[rel] = plan_pdopt(ck.path, rel, resized)
    return edits


def _format_of(base: str) -> str:
    """What an optimizer file is, by its name (for the refusal)."""
    if base.endswith(".safetensors") or base.endswith(".index.json"):
        return "a unified-checkpoint optimizer / master-weights file"
    if base.startswith("master_weights"):
        return "a master-weights file"
    if base.endswith(".pdopt"):
        return "a rank's or shard's optimizer file (not the whole model's optimizer.pdopt)"
    return "an optimizer file of a format tietool does not know"


def plan_pdopt(ck_path: Path, rel: str, resized: list[Resized]) -> OptimizerEdit:
    """The rewrite of ``optimizer.pdopt``: every accumulator of a resized parameter (:data:`RESIZED`, shape
    equal to the parameter's) and its master weight resized, the rest copied (headers only are read here,
    by the opcode walker: nothing is unpickled).

    Raises:
        UnsafePickleError, CheckpointError: the file is not a Paddle optimizer pickle (named).
        RefusedError: an accumulator or master weight of a resized parameter of another shape or dtype, or
            of a kind tietool does not know (named).
    """
    head = pdparams.read_optimizer_header(ck_path / rel, rel)
    by_param = {r.param: r for r in resized}
    entries: list[tuple[TensorInfo, Resized | None]] = []
    for t in head.tensors:
        m = _ACC_RE.match(t.name)
        r = by_param.get(m["param"]) if m else None
        owner = next((p for p in by_param if t.name.startswith(p + "_")), None)
        if r is None and owner is not None:
            raise _refuse(
                ck_path, rel, f"holds {t.name}, an accumulator of {by_param[owner].name} of an unknown kind"
            )
        if r is None or (m is not None and m["acc"] in KEPT):
            entries.append((t, None))
            continue
        entries.append((t, _checked(ck_path, rel, t, r)))
    master = tuple(
        (t, _checked(ck_path, rel, t, by_param[t.name]) if t.name in by_param else None) for t in head.master
    )
    return OptimizerEdit(rel, tuple(entries), master, head.names, head.extras, head.np_module)


def _checked(ck_path: Path, rel: str, t: TensorInfo, r: Resized) -> Resized:
    """``r``, once ``t`` is shaped as its parameter (before the resize) and a float.

    Raises:
        RefusedError: naming ``t``, its dtype and shape.
    """
    want = list(t.shape)
    if len(want) > r.axis:
        want[r.axis] = r.old
    if len(t.shape) <= r.axis or list(t.shape) != want or t.dtype not in ("float32", "float16", "uint16"):
        raise _refuse(ck_path, rel, f"holds {t.name} {t.dtype} {list(t.shape)}, not shaped as {r.name}")
    return r


def resized_array(a: np.ndarray[Any, Any], r: Resized) -> np.ndarray[Any, Any]:
    """Accumulator ``a`` with ``r.new`` entries on ``r.axis``: the first ``min(old, new)`` kept bit for bit
    except the reset slack entries (``r.reset``), which are zero as the new ones are (bits 0 also for bf16
    stored as uint16). One new array (C-ordered), filled in place: peak memory ``a`` and the result."""
    shape = list(a.shape)
    shape[r.axis] = r.new
    out = np.zeros(shape, dtype=a.dtype)
    kept = tuple(slice(0, min(r.old, r.new)) if i == r.axis else slice(None) for i in range(a.ndim))
    out[kept] = a[kept]
    zero_reset(out, r)
    return out


def span(r: Resized, lo: int, hi: int, ndim: int) -> tuple[slice, ...]:
    """The index of entries ``lo..hi-1`` on ``r.axis`` of an array of ``ndim`` dimensions."""
    return tuple(slice(lo, hi) if i == r.axis else slice(None) for i in range(ndim))


def zero_reset(a: np.ndarray[Any, Any], r: Resized) -> None:
    """Zero the reset slack entries ``r.reset`` of ``a`` (the resized accumulator), in place."""
    if r.reset is not None:
        a[span(r, *r.reset, a.ndim)] = 0
