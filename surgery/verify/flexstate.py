"""``verify`` of a PaddleFormers Trainer flex checkpoint (``checkpoint-N/``: ``model_state/``,
``optimizer_state/`` [, ``master_weight/``]) against the one ``resize`` / ``add-tokens
--keep-training-state`` made of it (:mod:`surgery.plan.flex_edit`).

The weights are compared as any two checkpoints are (:mod:`surgery.verify.tensors`), on the merged views of
both (:func:`surgery.plan.flex_edit.open_view`: every tensor assembled from the slices its ``.metadata``
places, coverage and replicas checked as ``merge`` checks them). The optimizer state is compared tensor by
tensor in the same way, each key against its rule (:mod:`surgery.verify.training`): the Trainer stores a
weight's moments as ``<weight>.moment1_0`` / ``.moment2_0`` (``.moment2_max_0``), its beta pows as
``<weight>.beta1_pow_acc_0`` / ``.beta2_pow_acc_0``, its master weight as ``master_weight/<weight>.w_0``
(a tied model's under the head's name: the head's stored duplicate moves as the embedding does). The files
at the checkpoint's root (scheduler, rng and trainer state, tokenizer) are compared as for any checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..io import flex, surface, tree
from ..io.checkpoint import REPORT_NAME
from ..plan import flex_edit
from ..plan.flex_state import KEPT, MASTER, MOMENTS, full_tensor
from .result import VerifyResult
from .training import Move, as_f32, check_entry, summarize

FOLDERS = ("model_state", "optimizer_state", "master_weight")


def is_pair(a_path: Any, b_path: Any) -> bool:
    """Both paths are local Trainer flex checkpoints (``model_state/`` and ``optimizer_state/``)."""
    return flex_edit.is_trainer_checkpoint(a_path) and flex_edit.is_trainer_checkpoint(b_path)


def open_views(a_path: Any, b_path: Any) -> tuple[Any, Any, Path]:
    """The merged views of both checkpoints (:func:`surgery.plan.flex_edit.open_view`), their root files
    listed as a checkpoint's (``other_files``, ``training_state``; the three flex folders left out), and
    the folder of the config.json the input's view was read from.

    Raises:
        CheckpointError, RefusedError: as :func:`surgery.plan.merge_flex.plan_flex` (no config.json
            found: the fix names where to copy it).
    """
    fa, A = flex_edit.open_view(Path(str(a_path)))
    _, B = flex_edit.open_view(Path(str(b_path)))
    for ck in (A, B):
        _list_root(ck)
    return A, B, fa.config_file.parent


def _list_root(ck: Any) -> None:
    """The view's ``other_files`` and ``training_state``: every file below the root outside the flex
    folders, the report and config.json, split as :class:`~surgery.io.checkpoint.Checkpoint` splits them."""
    rels, _ = tree.walk(ck.path)
    ck.other_files, ck.training_state = [], []
    for rel in rels:
        if rel.split("/", 1)[0] in FOLDERS or rel in (REPORT_NAME,):
            continue
        if surface.TRAINING_STATE.match(rel.rsplit("/", 1)[-1]):
            ck.training_state.append(rel)
        else:
            ck.other_files.append(rel)


def compare_state(res: VerifyResult, A: Any, B: Any, mv: dict[str, Move]) -> None:
    """``optimizer_state/`` and ``master_weight/`` of the output against the input's, key by key, each
    tensor assembled from its slices: the same keys, shapes as the rules give; moments resized with their
    weight (new and fresh entries zero), master weights resized (those entries the float32 of the output's
    weight), beta pows and the state of unmoved weights bit-identical."""
    for sub in FOLDERS[1:]:
        pa, pb = A.path / sub, B.path / sub
        if not pa.is_dir() and not pb.is_dir():
            continue
        if not pa.is_dir() or not pb.is_dir():
            res.unexplained.append(f"{sub}/ is only in {'the input' if pa.is_dir() else 'the output'}")
            continue
        ca, cb = _open(pa), _open(pb)
        for key in sorted(set(cb.tensors) - set(ca.tensors)):
            res.unexplained.append(f"{sub}/{key} is in the output, not in the input")
        for key in sorted(ca.tensors):
            if key not in cb.tensors:
                res.unexplained.append(f"{sub}/{key} is not in the output")
                continue
            weight, _, acc = key.rpartition(".")
            m = mv.get(weight)
            master = _weight(B, weight) if sub == "master_weight" and acc == MASTER and m else None
            rule_acc = acc.removesuffix("_0") if acc in MOMENTS else acc
            if m is not None and acc not in (*MOMENTS, *KEPT, MASTER):
                res.unexplained.append(f"{sub}/{key}: state of {weight} of a kind verify does not know")
                continue
            if acc in KEPT or (sub == "master_weight" and acc != MASTER):
                m = None
            check_entry(res, f"{sub}/", key, full_tensor(ca, key), full_tensor(cb, key), m, master, rule_acc)
    if res.training_state:
        summarize(res)


def _open(state: Path) -> flex.FlexCheckpoint:
    return flex.open_flex(flex.FlexFolder(state.parent, state, ()))


def _weight(B: Any, name: str) -> Any:
    """The output's weight ``name`` as float32 (assembled from its slices), read when asked."""

    def get() -> np.ndarray[Any, Any]:
        t = B.tensors[name]
        return as_f32(np.asarray(B.load(name)), B.logical_dtype(t) == "bfloat16")

    return get
