"""verify explains what tie/untie/resize do to the whole vocabulary surface, and nothing more: a square head
resized in the hidden-vocab layout, multi-token-prediction copies of the tables, an embedding restored from
the head that stored it alone. Each positive case has a tampered twin that verify must reject (exit 7)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support import cli_runner, paths

from tietool.surgery.io.checkpoint import Checkpoint

CASES = paths.BUG_CASES_DIR


def _cli(*args: str) -> cli_runner.CliRun:
    return cli_runner.run_cli(args, cwd=os.getcwd(), timeout=120)


def _flip_first_byte(ckpt: Path, name: str) -> None:
    """Change the first stored byte of tensor ``name`` (row 0, column 0: inside any common part)."""
    t = Checkpoint.open(ckpt).tensors[name]
    path = ckpt / t.file
    data = bytearray(path.read_bytes())
    # a small .pdparams payload is stored inline (offset -1): find its bytes in the file
    at = t.offset if t.offset >= 0 else data.find(t.inline or b"\xff" * 9)
    assert at >= 0, f"{name}: payload not found"
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


RUNS = [
    # (case, command, tensor whose common part is tampered in the twin)
    (
        "b16_square_head_transposed",
        ["resize", "--vocab", "15", "--layout", "hidden-vocab", "--seed", "1"],
        "lm_head.weight",
    ),
    (
        "b16_square_head_transposed",
        ["resize", "--vocab", "5", "--force", "--layout", "hidden-vocab"],
        "lm_head.weight",
    ),
    (
        "c01_deepseek_mtp_embed_head_copies",
        ["resize", "--vocab", "31", "--seed", "1"],
        "model.layers.1.shared_head.head.weight",
    ),
    (
        "c01_deepseek_mtp_embed_head_copies",
        ["resize", "--vocab", "21", "--force"],
        "model.layers.1.embed_tokens.weight",
    ),
    ("c06_embedding_dropped_head_kept", ["untie"], "transformer.word_embeddings.weight"),
    ("c06_embedding_dropped_head_kept", ["tie", "--keep", "head"], "transformer.word_embeddings.weight"),
]


@pytest.mark.parametrize(
    "case, command, tampered", RUNS, ids=[f"{r[0][:3]}-{' '.join(r[1][:3])}" for r in RUNS]
)
def test_verify_explains_the_surface_and_catches_tampering(tmp_path, case, command, tampered):
    inp = tmp_path / "in"
    shutil.copytree(CASES / case / "ckpt", inp)
    out = tmp_path / "out"
    r = _cli(command[0], str(inp), *command[1:], "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    v = _cli("verify", str(inp), str(out))
    assert v.returncode == 0, v.stdout + v.stderr
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    _flip_first_byte(bad, tampered)
    v = _cli("verify", str(inp), str(bad))
    assert v.returncode == 7, v.stdout + v.stderr
    assert tampered in v.stdout
