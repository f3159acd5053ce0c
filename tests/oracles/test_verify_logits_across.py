"""``verify --logits`` across libraries: a PaddleNLP checkpoint's logits run by PaddleNLP 2.8.1 (the Python
``PNLP_PYTHON`` names: paddle 2.6.2 cannot share tietool's venv), the output's by the library meant to read
it (PaddleFormers after ``convert --to paddleformers``; PaddleNLP again for a PaddleNLP output), on the
same ids. Right outputs agree (exit 0), a forged weight makes them differ (exit 7), and without
``PNLP_PYTHON`` the logits are not compared (exit 8, the cause named).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import paths, pnlp_support
from support.resize_support import run_cli

from tietool import verify
from tietool.surgery.io.checkpoint import Checkpoint

REPO = paths.REPO
SRC = REPO / "tests/data/fixtures/cases/pnlp_llama_untied"


def _ok(cmd: list[str]) -> None:
    r = run_cli(cmd)
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])


@pytest.fixture
def pnlp(monkeypatch):
    pnlp_support.require()
    monkeypatch.setenv("PNLP_PYTHON", pnlp_support.PNLP_PYTHON)


@pytest.mark.slow
@pytest.mark.pnlp
def test_convert_to_paddleformers_logits_agree(tmp_path: Path, pnlp) -> None:
    out = tmp_path / "pf"
    _ok(["convert", str(SRC), "--to", "paddleformers", "--out", str(out)])
    res = verify(SRC, out, logits=True)
    assert res.exit_code == 0, (res.unexplained, res.logits)
    lg = res.logits
    assert lg["compared"] and lg["max_abs_diff"] <= 1e-5
    assert lg["libraries"] == "PaddleFormers (the output) and PaddleNLP 2.8.1 (the input)"
    assert lg["model_class"] == "LlamaForCausalLM"


@pytest.mark.slow
@pytest.mark.pnlp
def test_paddlenlp_output_runs_in_paddlenlp(tmp_path: Path, pnlp) -> None:
    out = tmp_path / "r"
    _ok(["resize", str(SRC), "--vocab", "120", "--seed", "0", "--out", str(out)])
    res = verify(SRC, out, logits=True)
    assert res.exit_code == 0, (res.unexplained, res.logits)
    assert res.logits["libraries"] == "PaddleNLP 2.8.1" and res.logits["max_abs_diff"] <= 1e-5


@pytest.mark.slow
@pytest.mark.pnlp
def test_forged_converted_weight_makes_logits_differ(tmp_path: Path, pnlp) -> None:
    out = tmp_path / "pf"
    _ok(["convert", str(SRC), "--to", "paddleformers", "--out", str(out)])
    name = "model.layers.0.mlp.down_proj.weight"
    t = Checkpoint.open(out).tensors[name]
    assert t.dtype == "F32"
    p = out / t.file
    data = bytearray(p.read_bytes())
    for k in range(16):  # an exponent bit of 16 elements: a change the logits show
        data[t.offset + 4 * k + 3] ^= 0x20
    p.write_bytes(bytes(data))
    res = verify(SRC, out, logits=True)
    assert res.exit_code == 7
    assert res.logits["compared"] and res.logits["ok"] is False and res.logits["max_abs_diff"] > 1e-5
    assert any(u.startswith("logits differ") for u in res.unexplained), res.unexplained
    assert any(name in u for u in res.unexplained), res.unexplained


def test_without_pnlp_python_not_compared(tmp_path: Path, monkeypatch) -> None:
    """No PaddleNLP Python named: exit 8 with the cause and the variable to set (nothing run)."""
    monkeypatch.delenv("PNLP_PYTHON", raising=False)
    out = tmp_path / "r"
    _ok(["resize", str(SRC), "--vocab", "120", "--seed", "0", "--out", str(out)])
    res = verify(SRC, out, logits=True)
    if res.logits.get("cause") == "no_paddle":
        pytest.skip("paddle / PaddleFormers not installed: the check before this one")
    assert res.exit_code == 8
    assert res.logits["cause"] == "paddlenlp" and "PNLP_PYTHON" in res.logits["error"]
