"""``--keep-training-state`` for a PaddleFormers 1.2 Trainer flex checkpoint (``checkpoint-N/`` with
``model_state/``, ``optimizer_state/``, ``master_weight/``): what each of the three flex folders becomes
when the vocabulary tensors get new weights (issue 21).

Given the new full weights of the tensors a plan resizes (their rows computed by ``resize`` /
``add-tokens``), :func:`state_rewrites` gives, per flex folder, the tensors to replace
(:func:`surgery.io.flex_write.rewrite_folder` writes them, every other file and tensor unchanged):

- ``model_state/<name>``: the new weight;
- ``optimizer_state/<name>.moment1_0`` / ``.moment2_0`` (and ``.moment2_max_0`` if saved): old entries bit
  for bit, new ones zero, trimmed ones dropped (:func:`surgery.plan.training_state.resized_array`, as for
  ``optimizer.pdopt``); ``.beta1_pow_acc_0`` / ``.beta2_pow_acc_0`` kept (one value per parameter);
- ``master_weight/<name>.w_0`` (the Trainer splits ``optimizer.sharded_state_dict()`` on that suffix;
  ``tests/data/flex/README.md``): old entries bit for bit, new ones the fp32 value of the new weight rows
  (bf16 bits shifted, exact).

Names are the Trainer's ``model.state_dict()`` names (measured in ``tests/data/flex``). Slices of any layout
(rows, columns, flattened sharding-v2 ranges) are assembled as ``merge`` assembles them
(:func:`surgery.plan.merge_flex.check_tensor`, coverage checked). Used by ``resize`` / ``add-tokens
--keep-training-state`` of a Trainer checkpoint (:mod:`surgery.plan.flex_edit`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..io import flex
from ..model.errors import Opt, RefusedError
from ..model.tensor import bf16_bits_to_f32
from .flex_pieces import Assembled, assemble
from .merge_flex import check_tensor
from .plan import Resized
from .training_state import RESIZED, resized_array

MOMENTS = tuple(f"{a}_0" for a in RESIZED)  # moment1_0, moment2_0, moment2_max_0
REQUIRED = MOMENTS[:2]
KEPT = ("beta1_pow_acc_0", "beta2_pow_acc_0")
MASTER = "w_0"
New = dict[str, tuple[str, np.ndarray[Any, Any]]]  # key -> (paddle dtype name, full array, storage dtype)


def _refuse(where: Path, why: str) -> RefusedError:
    return RefusedError(
        f"{Opt('keep_training_state', True)}: {why}",
        where,
        f"run without {Opt('keep_training_state', True)} and merge the checkpoint first (tietool merge)",
    )


def _open(state: Path) -> flex.FlexCheckpoint:
    return flex.open_flex(flex.FlexFolder(state.parent, state, ()))


def full_tensor(ck: flex.FlexCheckpoint, key: str) -> np.ndarray[Any, Any]:
    """Tensor ``key`` of flex checkpoint ``ck`` assembled whole (stored dtype, bf16 as uint16), coverage
    and replicas checked as ``merge`` checks them (raises what :func:`check_tensor` raises)."""
    t = ck.tensors[key]
    headers = {s.file: flex.data_headers(ck, s.file) for s in t.slices}
    ps = check_tensor(ck, t, headers)
    infos = tuple(sorted({p.slice.file: headers[p.slice.file][p.slice.key] for p in ps}.items()))
    return assemble(Assembled(ck.folder.state, t.shape, t.storage_dtype, tuple(ps), infos))


def _entry(ck: flex.FlexCheckpoint, key: str, r: Resized, old: tuple[int, ...]) -> flex.FlexTensor:
    """The entry ``key`` of a resized parameter, checked shaped as the weight was (before the resize)."""
    t = ck.tensors[key]
    if t.shape != old or t.dtype != "float32":
        raise _refuse(
            ck.folder.state, f"{key} is {t.dtype} {list(t.shape)}, not float32 {list(old)} as {r.name}"
        )
    return t


def _optimizer(ck: flex.FlexCheckpoint, r: Resized, old: tuple[int, ...]) -> New:
    known = {f"{r.name}.{s}" for s in (*MOMENTS, *KEPT)}
    stray = [k for k in ck.tensors if k.startswith(r.name + ".") and k not in known]
    if stray:
        raise _refuse(ck.folder.state, f"holds {stray[0]}, optimizer state of {r.name} of an unknown kind")
    out: New = {}
    for s in MOMENTS:
        key = f"{r.name}.{s}"
        if key not in ck.tensors:
            if s in REQUIRED:
                raise _refuse(ck.folder.state, f"has no {key} (the optimizer state of {r.name})")
            continue
        t = _entry(ck, key, r, old)
        out[key] = (t.dtype, resized_array(full_tensor(ck, key), r))
    return out


def _master(ck: flex.FlexCheckpoint, r: Resized, old: tuple[int, ...], weight: np.ndarray[Any, Any]) -> New:
    key = f"{r.name}.{MASTER}"
    if key not in ck.tensors:
        return {}
    _entry(ck, key, r, old)
    a = resized_array(full_tensor(ck, key), r)
    if r.new > r.old:
        rows = np.take(weight, np.arange(r.old, r.new), axis=r.axis)
        rows = bf16_bits_to_f32(rows) if rows.dtype == np.uint16 else rows.astype(np.float32)
        a = np.concatenate([np.take(a, np.arange(r.old), axis=r.axis), rows], axis=r.axis)
    return {key: ("float32", np.ascontiguousarray(a))}


def state_rewrites(root: Path, weights: dict[str, np.ndarray[Any, Any]]) -> dict[str, New]:
    """Per flex folder of Trainer checkpoint ``root`` (``model_state``, ``optimizer_state``,
    ``master_weight``), the tensors to replace so the checkpoint holds ``weights`` (name -> the new full
    weight in its stored dtype, bf16 as uint16; each differing from the saved one on one axis only).

    Raises:
        RefusedError: a weight not in ``model_state`` or of another dtype or rank, one changing more than one
            axis; ``optimizer_state/`` missing, or missing a moment of a changed weight, or holding one of
            another shape or dtype, or state of an unknown kind (named); a bf16 weight without master
            weights. CheckpointError, UnsafePickleError: as :func:`surgery.io.flex.open_flex`.
    """
    model = _open(root / "model_state")
    if not (root / "optimizer_state").is_dir():
        raise _refuse(root, "has no optimizer_state/ beside model_state/")
    opt = _open(root / "optimizer_state")
    master = _open(root / "master_weight") if (root / "master_weight").is_dir() else None
    out: dict[str, New] = {"model_state": {}, "optimizer_state": {}, "master_weight": {}}
    for name, w in weights.items():
        t = model.tensors.get(name)
        if t is None or np.dtype(t.storage_dtype) != w.dtype or len(t.shape) != w.ndim:
            raise _refuse(root / "model_state", f"{name} is not a {w.dtype} tensor of rank {w.ndim} there")
        axes = [i for i, (a, b) in enumerate(zip(t.shape, w.shape, strict=True)) if a != b]
        if len(axes) != 1:
            raise _refuse(root / "model_state", f"{name} changes {list(t.shape)} → {list(w.shape)}")
        r = Resized(name, name, axes[0], t.shape[axes[0]], w.shape[axes[0]])
        out["model_state"][name] = (t.dtype, np.ascontiguousarray(w))
        out["optimizer_state"].update(_optimizer(opt, r, t.shape))
        got = _master(master, r, t.shape, w) if master is not None else {}
        if not got and t.dtype != "float32":
            raise _refuse(root, f"has no master weight {name}.{MASTER} for the {t.dtype} weight {name}")
        out["master_weight"].update(got)
    return out
