"""``--keep-training-state`` for a PaddleFormers 1.2 Trainer flex checkpoint (``checkpoint-N/`` with
``model_state/``, ``optimizer_state/``, ``master_weight/``): what each of the three flex folders becomes
when the vocabulary tensors get new weights.

Given the new full weights of the tensors a plan resizes (their rows computed by ``resize`` /
``add-tokens``), :func:`state_rewrites` gives, per flex folder, the tensors to replace
(:func:`surgery.io.flex_write.rewrite_folder` writes them, every other file and tensor unchanged):

- ``model_state/<name>``: the new weight;
- ``optimizer_state/<name>.moment1_0`` / ``.moment2_0`` (and ``.moment2_max_0`` if saved): old entries bit
  for bit, new ones (and slack entries new tokens take) zero, trimmed ones dropped
  (:func:`surgery.plan.training_state.resized_array`, as for ``optimizer.pdopt``); ``.beta1_pow_acc_0`` /
  ``.beta2_pow_acc_0`` kept (one value per parameter);
- ``master_weight/<name>.w_0`` (the Trainer splits ``optimizer.sharded_state_dict()`` on that suffix;
  ``tests/data/flex/README.md``): old entries bit for bit, new ones (and reset slack entries) the fp32 value
  of the new weight rows (bf16 bits shifted, exact).

A tied model's embedding and the duplicate head the Trainer stores beside it are one parameter: both weights
are rewritten, its moments and master weight where the Trainer stored them (under the head's name).

Names are the Trainer's ``model.state_dict()`` names (measured in ``tests/data/flex``). Slices of any layout
(rows, columns, flattened sharding-v2 ranges) are assembled as ``merge`` assembles them
(:func:`surgery.plan.merge_flex.check_tensor`, coverage checked). Used by ``resize`` / ``add-tokens
--keep-training-state`` of a Trainer checkpoint (:mod:`surgery.plan.flex_edit`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..io import flex
from ..io.flex_write import Replacement
from ..io.made import Made
from ..model.errors import Opt, RefusedError
from ..model.tensor import bf16_bits_to_f32
from .flex_pieces import Assembled, assemble, piece_array
from .merge_flex import check_tensor
from .plan import Resized
from .training_state import RESIZED, resized_array, span, zero_reset

MOMENTS = tuple(f"{a}_0" for a in RESIZED)  # moment1_0, moment2_0, moment2_max_0
REQUIRED = MOMENTS[:2]
KEPT = ("beta1_pow_acc_0", "beta2_pow_acc_0")
MASTER = "w_0"
New = dict[str, tuple[str, Replacement]]  # key -> (paddle dtype name, full array or Made, storage dtype)
F32 = np.dtype(np.float32)


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


def _resized_shape(r: Resized, old: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(r.new if i == r.axis else n for i, n in enumerate(old))


def _moment(ck: flex.FlexCheckpoint, key: str, r: Resized) -> np.ndarray[Any, Any]:
    """The resized entry ``key``, as :func:`resized_array` of it assembled whole; grown: its slices copied
    straight into the zeroed result (peak: the result and one slice), trimmed: assembled, then cut."""
    t = ck.tensors[key]
    if r.new <= r.old:
        return resized_array(full_tensor(ck, key), r)
    headers = {s.file: flex.data_headers(ck, s.file) for s in t.slices}
    out = np.zeros(_resized_shape(r, t.shape), dtype=np.dtype(t.storage_dtype))
    for p in check_tensor(ck, t, headers):
        box = tuple(slice(a, b) for a, b in zip(*p.box, strict=True))
        out[box] = piece_array(ck.folder.state / p.slice.file, p, headers[p.slice.file][p.slice.key])
    zero_reset(out, r)
    return out


def _optimizer(ck: flex.FlexCheckpoint, r: Resized, old: tuple[int, ...]) -> New:
    """The moments of ``r`` as :class:`~surgery.io.made.Made` replacements, checked from the metadata
    alone (refused: a missing required moment, one of another shape or dtype, an accumulator of an
    unknown kind)."""
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
        out[key] = (t.dtype, Made.call(partial(_moment, ck, key, r), _resized_shape(r, old), F32))
    return out


def _new_rows(weight: Replacement, r: Resized) -> list[np.ndarray[Any, Any]]:
    """The entries of the new weight in each range of ``r.fresh()`` (on ``r.axis``) as float32 (bf16 bits
    shifted, exact); the whole weight, if computed here, dropped on return."""
    w = weight.as_array() if isinstance(weight, Made) else weight
    rows = [np.array(w[span(r, lo, hi, w.ndim)]) for lo, hi in r.fresh()]
    return [bf16_bits_to_f32(x) if x.dtype == np.uint16 else x.astype(np.float32) for x in rows]


def _master_array(ck: flex.FlexCheckpoint, key: str, r: Resized, weight: Replacement) -> np.ndarray[Any, Any]:
    """The resized master weight ``key``: old entries bit for bit, new ones (grown, reset slack entries)
    the fp32 of the new weight's (peak: the new rows, the old master assembled and the result)."""
    rows = _new_rows(weight, r) if r.fresh() else []
    a = _moment(ck, key, r)
    for (lo, hi), x in zip(r.fresh(), rows, strict=True):
        a[span(r, lo, hi, a.ndim)] = x
    return a


def _master(ck: flex.FlexCheckpoint, r: Resized, old: tuple[int, ...], weight: Replacement) -> New:
    key = f"{r.name}.{MASTER}"
    if key not in ck.tensors:
        return {}
    _entry(ck, key, r, old)
    return {
        key: ("float32", Made.call(partial(_master_array, ck, key, r, weight), _resized_shape(r, old), F32))
    }


def _resize_of(
    root: Path, t: flex.FlexTensor, w: Replacement, slack: Mapping[str, tuple[int, tuple[int, int]]]
) -> Resized:
    """How weight ``t`` becomes ``w``: one axis resized, and/or the slack entries ``slack[name]`` (axis,
    range) given new values.

    Raises:
        RefusedError: ``w`` of another dtype or rank, changing more than one axis, or keeping the shape
            with no slack entries named (new values whose optimizer state cannot be told apart here).
    """
    name = t.name
    if np.dtype(t.storage_dtype) != w.dtype or len(t.shape) != w.ndim:
        raise _refuse(root / "model_state", f"{name} is not a {w.dtype} tensor of rank {w.ndim} there")
    axes = [i for i, (a, b) in enumerate(zip(t.shape, w.shape, strict=True)) if a != b]
    axis, reset = slack.get(name, (None, None))
    if not axes and axis is not None:
        axes = [axis]
    if len(axes) != 1 or (axis is not None and axis != axes[0]):
        change = f"changes {list(t.shape)} → {list(w.shape)}"
        if not axes:
            change = (
                f"keeps its shape {list(t.shape)} but gets new values outside new or slack rows "
                "(which optimizer state to reset cannot be told)"
            )
        raise _refuse(root / "model_state", f"{name} {change}")
    return Resized(name, name, axes[0], t.shape[axes[0]], w.shape[axes[0]], reset)


def _owner(opt: flex.FlexCheckpoint, name: str, shared: Collection[str]) -> bool:
    """Whether ``name``'s optimizer state is stored under its own name: False for one of ``shared`` (the
    names of one tied parameter: the Trainer saves its state once, under one of them) that has no entry
    while another of them has; True otherwise (then its moments are required)."""
    if name not in shared or any(k.startswith(name + ".") for k in opt.tensors):
        return True
    return not any(k.startswith(n + ".") for n in shared for k in opt.tensors)


def state_rewrites(
    root: Path,
    weights: Mapping[str, Replacement],
    slack: Mapping[str, tuple[int, tuple[int, int]]] | None = None,
    shared: Collection[str] = (),
) -> dict[str, New]:
    """Per flex folder of Trainer checkpoint ``root`` (``model_state``, ``optimizer_state``,
    ``master_weight``), the tensors to replace so the checkpoint holds ``weights`` (name -> the new full
    weight in its stored dtype, bf16 as uint16, or a :class:`~surgery.io.made.Made` computing it; each
    differing from the
    saved one on one axis only, or in the slack entries ``slack[name]`` = ``(axis, (lo, hi))`` that new
    tokens take: their moments reset to zero, their master weights the fp32 of the new values).

    ``shared``: the names of one tied parameter (a tied model's embedding and the duplicate head the
    Trainer stores beside it, given equal new weights): the Trainer saves that parameter's optimizer state
    once, under one of the names (the head's, measured on ``tests/data/flex/trainer_tied``); each name's
    weight is rewritten, the state where it is stored.

    Decided from the ``.metadata`` records alone (names, global shapes, dtypes): no tensor data is read
    here. Every moment and master weight is a :class:`~surgery.io.made.Made` (assembled and resized when
    :func:`surgery.io.flex_write.rewrite_folder` writes it, one at a time); a weight is passed on as given.

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
        if t is None:
            raise _refuse(root / "model_state", f"{name} is not a {w.dtype} tensor of rank {w.ndim} there")
        r = _resize_of(root, t, w, slack or {})
        out["model_state"][name] = (t.dtype, w if isinstance(w, Made) else np.ascontiguousarray(w))
        if not _owner(opt, name, shared):
            continue
        out["optimizer_state"].update(_optimizer(opt, r, t.shape))
        got = _master(master, r, t.shape, w) if master is not None else {}
        if not got and t.dtype != "float32":
            raise _refuse(root, f"has no master weight {name}.{MASTER} for the {t.dtype} weight {name}")
        out["master_weight"].update(got)
    return out
