"""``verify ORIGINAL FINAL`` across chains with a ``convert`` or ``merge`` in them: the original carried
through the chain's convert and merge runs (rebuilt from headers, :mod:`tietool.surgery.verify.chain`),
then compared with the final output as the chain's other runs explain. Right chains exit 0 with every
tensor compared; one flipped element anywhere in the final output, a forged config key, exit 7 naming it.

Inputs: ``tests/data/fixtures/cases/`` (PaddleNLP and PaddleFormers conventions), ``tests/data/tp_ranks``
(rank files), ``sample_checkpoints/pf_llama_trainer`` (a Trainer flex checkpoint with a tokenizer).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import paths
from support.resize_support import run_cli
from test_verify_writes import _flip

from tietool import verify
from tietool.surgery.io.checkpoint import Checkpoint

REPO = paths.REPO
FIX = REPO / "tests/data/fixtures/cases"
TP = REPO / "tests/data/tp_ranks"
TRAINER = REPO / "sample_checkpoints/pf_llama_trainer"


def _run(*cmd: str) -> None:
    r = run_cli(list(cmd))
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])


def _chain(src: Path, tmp: Path, steps: list[list[str]]) -> Path:
    """Run ``steps`` (each a command without its input and ``--out``), each on the previous output."""
    cur = src
    for k, step in enumerate(steps):
        out = tmp / f"s{k}"
        _run(step[0], str(cur), *step[1:], "--out", str(out))
        cur = out
    return cur


def _trainer(tmp: Path) -> Path:
    dst = tmp / "trainer" / "checkpoint-2"
    shutil.copytree(TRAINER / "checkpoint-2", dst)
    shutil.copy2(TRAINER / "base" / "config.json", dst / "config.json")
    return dst


CHAINS = {
    "tie-keep-embedding,convert": (
        lambda tmp: FIX / "pnlp_llama_untied",
        [["tie", "--keep", "embedding"], ["convert", "--to", "paddleformers"]],
    ),
    "convert,resize,untie": (
        lambda tmp: FIX / "pnlp_llama_tied",
        [["convert", "--to", "paddleformers"], ["resize", "--vocab", "300", "--seed", "0"], ["untie"]],
    ),
    "merge,resize": (
        lambda tmp: TP / "llama_fp32" / "tp2",
        [["merge"], ["resize", "--vocab", "300", "--seed", "1"]],
    ),
    "merge-flex,resize,add-tokens,convert": (
        _trainer,
        [
            ["merge"],
            ["resize", "--vocab", "260", "--seed", "0"],
            ["add-tokens", "<zz>", "<yy>", "--seed", "0"],
            ["convert", "--to", "paddlenlp"],
        ],
    ),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_with_convert_or_merge_verifies(tmp_path: Path, name: str) -> None:
    make_src, steps = CHAINS[name]
    src = make_src(tmp_path)
    out = _chain(src, tmp_path, steps)
    res = verify(src, out)
    assert res.exit_code == 0, res.unexplained
    compared = res.identical + len(res.resized) + len(res.changed) + len(res.added)
    assert compared == len(Checkpoint.open(out).tensors)


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_forged_element_named(tmp_path: Path, name: str) -> None:
    """One flipped bit in a tensor no operation of the chain changes: exit 7 naming it."""
    make_src, steps = CHAINS[name]
    src = make_src(tmp_path)
    out = _chain(src, tmp_path, steps)
    ck = Checkpoint.open(out)
    target = next(n for n in ck.tensors if "layers.0" in n and "norm" not in n)
    _flip(out, target, element=5)
    res = verify(src, out)
    assert res.exit_code == 7
    assert any(u.startswith(f"{target} changed") for u in res.unexplained), res.unexplained


def test_chain_forged_config_key_named(tmp_path: Path) -> None:
    src = FIX / "pnlp_llama_untied"
    out = _chain(src, tmp_path, [["tie", "--keep", "embedding"], ["convert", "--to", "paddleformers"]])
    cfg = json.loads((out / "config.json").read_text())
    cfg["rms_norm_eps"] = 0.5
    (out / "config.json").write_text(json.dumps(cfg))
    res = verify(src, out)
    assert res.exit_code == 7
    assert any("rms_norm_eps" in u for u in res.unexplained), res.unexplained


def test_chain_through_convert_from_another_folder_is_not_composed(tmp_path: Path) -> None:
    """A folder that is not the chain's original (a sibling checkpoint): the convert is not replayed on it;
    the tensors that differ are named."""
    src = FIX / "pnlp_llama_untied"
    out = _chain(src, tmp_path, [["tie", "--keep", "embedding"], ["convert", "--to", "paddleformers"]])
    other = tmp_path / "other"
    _run("resize", str(src), "--vocab", "300", "--seed", "0", "--out", str(other))
    res = verify(other, out)
    assert res.exit_code == 7
