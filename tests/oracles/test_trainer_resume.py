"""The real PaddleFormers 1.2 Trainer resuming flex checkpoints (``tests/support/trainer_resume.py``).

Facts recorded in ``tests/data/flex/README.md`` ("Resuming"): an unchanged checkpoint loads exactly its
oracles; a checkpoint grown by Paddle itself resumes into a vocab-256 model with the grown values; the stale
vocab-250 checkpoint in a vocab-256 model loads WITHOUT an error (paddle only logs a warning,
``flex_checkpoint/dcp/load_state_dict.py:568``): rows 0..249 from the checkpoint, rows 250.. keep the
model's own values, their moments zero.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.support.paths import DATA
from tests.support.trainer_resume import ResumeRun, grow_checkpoint, resume

pytestmark = pytest.mark.slow

T1 = DATA / "flex" / "trainer_1rank"
T2 = DATA / "flex" / "trainer_2rank"
VOCAB_NAMES = ("model.embed_tokens.weight", "lm_head.weight")


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_resume_unchanged_grown_and_stale(tmp_path: Path) -> None:
    ck, model_dir = grow_checkpoint(T1 / "checkpoint-2", T1 / "base", tmp_path / "g", 256)
    old = T1 / "checkpoint-2"
    runs = [ResumeRun(old, T1 / "base"), ResumeRun(ck, model_dir), ResumeRun(old, model_dir)]
    same, grown, stale, two = resume([*runs, ResumeRun(T2 / "checkpoint-2", T1 / "base")])
    model, optim = _npz(T1 / "oracle.npz"), _npz(T1 / "oracle_optimizer.npz")
    # the harness: the unchanged checkpoint loads exactly its oracles and runs step 3
    assert same.ok, same.error
    assert len(same.losses) == 1 and np.isfinite(same.losses[0])
    assert same.model.keys() == model.keys() and same.optimizer.keys() == optim.keys()
    for k in model:
        np.testing.assert_array_equal(same.model[k], model[k], err_msg=k)
    for k in optim:
        np.testing.assert_array_equal(same.optimizer[k], optim[k], err_msg=k)
    # the 2-rank save (files 0_0 + 1_0, sharding stage 1 v1) resumes on 1 rank: its oracles exactly
    assert two.ok, two.error
    for part, oracle in (
        (two.model, _npz(T2 / "oracle.npz")),
        (two.optimizer, _npz(T2 / "oracle_optimizer.npz")),
    ):
        assert part.keys() == oracle.keys()
        for k in oracle:
            np.testing.assert_array_equal(part[k], oracle[k], err_msg=k)
    # grown by paddle: the grown rows load (mean weight rows, zero moment rows), the rest bit for bit
    assert grown.ok, grown.error
    for k in model:
        want = model[k]
        if k in VOCAB_NAMES:
            want = np.concatenate([want, np.broadcast_to(want.mean(0), (6, want.shape[1]))]).astype(
                want.dtype
            )
        np.testing.assert_array_equal(grown.model[k], want, err_msg=k)
    for k in optim:
        want = optim[k]
        if k.rsplit(".", 1)[0] in VOCAB_NAMES and ".moment" in k:
            want = np.concatenate([want, np.zeros((6, want.shape[1]), want.dtype)])
        np.testing.assert_array_equal(grown.optimizer[k], want, err_msg=k)
    # stale: no error; rows :250 from the checkpoint, rows 250: the model's own, moments zero there
    assert stale.ok, stale.error
    own = load_file(str(next(model_dir.glob("*.safetensors"))))
    for k in VOCAB_NAMES:
        np.testing.assert_array_equal(stale.model[k][:250], model[k])
        np.testing.assert_array_equal(stale.model[k][250:], own[k][250:])
        for m in ("moment1_0", "moment2_0"):
            np.testing.assert_array_equal(stale.optimizer[f"{k}.{m}"][:250], optim[f"{k}.{m}"])
            assert not stale.optimizer[f"{k}.{m}"][250:].any()


def test_resize_token_embeddings_leaves_the_untied_head() -> None:
    """PaddleFormers 1.2 ``resize_token_embeddings`` grows only the input embedding of an untied Llama (the
    head stays [250, 16] while config.vocab_size becomes 256): the load works, the first step fails."""
    [r] = resume([ResumeRun(T1 / "checkpoint-2", T1 / "base", vocab_size=256)])
    assert not r.ok and "vocab_size should not be splited: 250, 256" in r.error
    assert r.model["model.embed_tokens.weight"].shape == (256, 16)
    assert r.model["lm_head.weight"].shape == (250, 16)


def test_two_rank_resume_fails_on_cpu() -> None:
    """paddle 3.3.1: a 2-rank (gloo) flex resume cannot run on CPU: ``Trainer._load_flex_checkpoint``
    (trainer.py:1354) -> ``dist.load_state_dict`` -> ``reshard_comm.py:229`` calls ``Tensor.cuda()``."""
    [r] = resume([ResumeRun(T2 / "checkpoint-2", T1 / "base")], ranks=2)
    assert not r.ok and r.error == "ValueError: No available device found."
