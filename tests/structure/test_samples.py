"""The rank-file and Trainer samples of ``sample_checkpoints/`` are what the test data proves, and merge back.

``tests/data/tools/make_samples.py`` writes them with the generators of the test data; these tests tie each
sample to the proven fixture it shares bytes with (so a regenerated sample cannot drift from what the merge
and resume tests proved), and merge the rank files back to the library's own whole state dict bit for bit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from support import paths

import tietool
from tietool.surgery.io import pdparams

ROOT = paths.REPO
SAMPLES = ROOT / "sample_checkpoints"
DATA = ROOT / "tests" / "data"
EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(.*)$")


def _arrays(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    infos, _, _ = pdparams.read_header(path, path.name)
    return {
        t.name: (t.dtype, t.shape, np.ascontiguousarray(pdparams.read_array(path, t)).tobytes())
        for t in infos
    }


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tp_sample_is_the_proven_fixture_and_merges_to_the_original(tmp_path):
    """pf_llama_tp2 holds make_tp_ranks' llama_fp32/tp2 bytes; merged, every tensor equals the state dict
    PaddleFormers' save_pretrained wrote (``original/``) bit for bit."""
    sample = SAMPLES / "pf_llama_tp2"
    assert _files(sample) == _files(DATA / "tp_ranks" / "llama_fp32" / "tp2")
    tietool.merge(sample, tmp_path / "m")
    merged = _arrays(tmp_path / "m" / "model_state.pdparams")
    original = _arrays(DATA / "tp_ranks" / "llama_fp32" / "original" / "model_state.pdparams")
    assert merged == original
    assert json.loads((tmp_path / "m" / "config.json").read_text()).get("tensor_parallel_degree", 1) == 1


def test_ep_sample_ranks_hold_half_the_experts_and_merge_to_their_union(tmp_path):
    """Rank r holds experts 2r, 2r+1 (global ids) of every MoE layer and the same other tensors; the merge
    gives every expert of the config's 4 once, each tensor bit for bit as its rank holds it."""
    sample = SAMPLES / "pf_qwen3_moe_ep2"
    ranks = [_arrays(sample / f"model_state.moe_sharding0{r}.pdparams") for r in range(2)]
    union: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for r, rank in enumerate(ranks):
        ids = {int(m.group(2)) for k in rank if (m := EXPERT.match(k))}
        assert ids == {2 * r, 2 * r + 1}
        for k, v in rank.items():
            assert union.setdefault(k, v) == v, k
    assert json.loads((sample / "config.json").read_text())["num_local_experts"] == 4
    tietool.merge(sample, tmp_path / "m")
    assert _arrays(tmp_path / "m" / "model_state.pdparams") == union
    assert {int(m.group(2)) for k in union if (m := EXPERT.match(k))} == {0, 1, 2, 3}


def test_trainer_sample_is_the_proven_trainer_run():
    """pf_llama_trainer's checkpoint-2 is the 1-rank Trainer fixture's (every file but training_args.bin,
    which held the run's path and time), plus base/config.json; base/ is the fixture's base/."""
    sample, fixture = SAMPLES / "pf_llama_trainer", DATA / "flex" / "trainer_1rank"
    got, want = _files(sample / "checkpoint-2"), _files(fixture / "checkpoint-2")
    assert got.pop("config.json") == (fixture / "base" / "config.json").read_bytes()
    assert {k: v for k, v in got.items() if k != "training_args.bin"} == {
        k: v for k, v in want.items() if k != "training_args.bin"
    }
    assert set(got) == set(want)
    base = _files(fixture / "base")
    base.pop("saved_signal_0")
    assert _files(sample / "base") == base
