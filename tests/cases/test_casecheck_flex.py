"""Self-test of casecheck's flex-checkpoint reader (``tests/data/cases/README.md``: a folder with no weight
file that is a flex checkpoint is read assembled as ``paddle.distributed.load_state_dict`` fills it): against
the oracles paddle itself made for ``tests/data/flex`` (2 rank files, bf16 weights with fp32 masters,
flattened sharding-v2 slices)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from support import casecheck as cc
from support import paths

FLEX = paths.FLEX


@pytest.mark.parametrize(
    ("folder", "ckpt"),
    [("trainer_2rank", "checkpoint-2"), ("trainer_bf16_layout", "checkpoint-1"), ("flat2", None)],
)
def test_flex_checkpoint_read_as_paddle_loads_it(folder: str, ckpt: str | None, tmp_path: Path) -> None:
    """casecheck's flex reader against the oracles paddle's own ``load_state_dict`` made (rank files, bf16,
    flattened sharding-v2 slices): every tensor bit for bit, the optimizer folders under their prefix."""
    if ckpt is None:  # a bare flex folder: laid out as a checkpoint's model_state/
        shutil.copytree(FLEX / folder, tmp_path / "model_state", ignore=shutil.ignore_patterns("oracle*"))
        root, oracles = tmp_path, {"model_state": FLEX / folder / "oracle.npz"}
    else:
        root = FLEX / folder / ckpt
        oracles = {
            "model_state": FLEX / folder / "oracle.npz",
            "optimizer_state": FLEX / folder / "oracle_optimizer.npz",
            "master_weight": FLEX / folder / "oracle_master_weight.npz",
        }
    got = cc.read_checkpoint(root)
    assert not got.problems, got.problems
    want = {}
    for sub, f in oracles.items():
        with np.load(f) as z:
            want.update({(k if sub == "model_state" else f"{sub}/{k}"): z[k] for k in z.files})
    assert sorted(got.tensors) == sorted(want)
    for k, w in want.items():
        t = got.tensors[k]
        assert t.shape == w.shape and t.raw == w.tobytes(), k
