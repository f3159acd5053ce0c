"""``verify`` expects what the planners write, computed by the planners' own rules, not a rule of its own:

* a ``prune`` (or ``transplant``) of a folder whose ``vocab_size`` is stale (17 rows, config 16) sets
  every vocabulary-size key as :func:`tietool.surgery.plan.resize.vocab_size_sets` says (the kept count,
  the stale key and its ``model_config.json`` copy too), and a forged key is still named;
* bfloat16 bits labelled ``U16`` are written ``BF16`` by every edit
  (:func:`tietool.surgery.plan.plan.written_dtype`); a prune output so labelled verifies, one left (or
  put back) at ``U16`` is named;

Inputs: ``tests/data/cases/`` (copied from the shared case set: b09, b17).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from support import paths

import tietool
from tietool import verify
from tietool.surgery.io.checkpoint import Checkpoint

REPO = paths.REPO
CASES = REPO / "tests/data/cases"
SAMPLES = REPO / "sample_checkpoints"
KEEP = [0, 1, 3, 4, 6, 7, 9, 10, 12, 13, 15]  # the ids not ≡ 2 (mod 3) below 16


def _prune(src: Path, out: Path) -> Path:
    tietool.prune(src, KEEP, out, keep_special=True)
    return out


def test_prune_of_a_stale_vocab_size_verifies(tmp_path):
    src = CASES / "b09_paddle_gpt_stale_vocab_size_init_args/ckpt"
    out = _prune(src, tmp_path / "p")
    cfg = json.loads((out / "model_config.json").read_text())
    assert cfg["init_args"][0]["vocab_size"] == len(KEEP)  # what the planner wrote
    res = verify(src, out)
    assert res.exit_code == 0, res.unexplained
    keys = {(c["file"], c["key"]): (c["before"], c["after"]) for c in res.config}
    assert keys == {
        ("config.json", "vocab_size"): (16, 11),
        ("model_config.json", "init_args.0.vocab_size"): (16, 11),
    }


def test_prune_of_a_stale_vocab_size_forged_key_named(tmp_path):
    src = CASES / "b09_paddle_gpt_stale_vocab_size_init_args/ckpt"
    out = _prune(src, tmp_path / "p")
    p = out / "model_config.json"
    cfg = json.loads(p.read_text())
    cfg["init_args"][0]["vocab_size"] = 12
    p.write_text(json.dumps(cfg))
    res = verify(src, out)
    assert res.exit_code == 7
    assert res.unexplained == [
        "model_config.json: init_args.0.vocab_size is 12 (input 16); the prune makes it 11"
    ]


def test_prune_of_a_stale_vocab_size_config_json_alone(tmp_path):
    src = CASES / "b09_paddle_gpt_stale_vocab_size/ckpt"
    res = verify(src, _prune(src, tmp_path / "p"))
    assert res.exit_code == 0, res.unexplained


def test_prune_of_bf16_labelled_u16_verifies(tmp_path):
    src = CASES / "b17_bf16_labelled_u16_safetensors/ckpt"
    out = _prune(src, tmp_path / "p")
    labels = {n: t.dtype for n, t in Checkpoint.open(out).tensors.items()}
    assert set(labels.values()) == {"BF16"}  # the planner relabels every U16 tensor
    res = verify(src, out)
    assert res.exit_code == 0, res.unexplained


def _relabel(folder: Path, name: str, dtype: str) -> None:
    """Set the safetensors header's dtype label of ``name`` (the bytes unchanged)."""
    for f in folder.glob("*.safetensors"):
        raw = f.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8 : 8 + n])
        if name in header:
            header[name]["dtype"] = dtype
            h = json.dumps(header).encode()
            h += b" " * (-len(h) % 8)
            f.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n :])


def test_prune_output_left_at_u16_named(tmp_path):
    """The label rule is the planners', not any U16/BF16 swap: a tensor put back at U16 is named."""
    src = CASES / "b17_bf16_labelled_u16_safetensors/ckpt"
    out = _prune(src, tmp_path / "p")
    _relabel(out, "model.norm.weight", "U16")
    res = verify(src, out)
    assert res.exit_code == 7
    assert len(res.unexplained) == 1
    assert res.unexplained[0].startswith("model.norm.weight: dtype U16 → U16; prune writes BF16")
