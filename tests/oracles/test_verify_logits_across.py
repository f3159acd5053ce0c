"""``verify --logits`` across libraries: a PaddleNLP checkpoint's logits run by PaddleNLP 2.8.1 (the Python
``PNLP_PYTHON`` names: paddle 2.6.2 cannot share tietool's venv), the output's by the library meant to read
it (PaddleFormers after ``convert --to paddleformers``; PaddleNLP again for a PaddleNLP output), on the
same ids. Right outputs agree (exit 0), a forged weight makes them differ (exit 7), and without
``PNLP_PYTHON`` the logits are not compared (exit 8, the cause named).

``logits_with="hf"`` (``--logits-with hf``): the output run by HF transformers 5.3 on CPU torch (the venv of
``tests/tools/hf_venv.sh``, ``$HF_PYTHON``): a PaddleNLP fixture converted to PaddleFormers gives, in
transformers, the logits PaddleNLP 2.8.1 gives the input (within 2e-5: torch and Paddle sum in another
order); a PaddleFormers fixture's tie output likewise against PaddleFormers; a forged weight is exit 7; an
output no test proves transformers loads (a ``.pdparams``) and a machine without the HF venv are exit 8
naming the cause. The HF tests skip without ``HF_PYTHON`` unless ``TIETOOL_REQUIRE_HF`` is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import hf_logits, paths, pnlp_support
from support.resize_support import run_cli

from tietool import verify
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.verify import logits_pool

REPO = paths.REPO
SRC = REPO / "tests/data/fixtures/cases/pnlp_llama_untied"
PF_SRC = REPO / "tests/data/fixtures/cases/pf_llama_untied_fp32"


@pytest.fixture(scope="module", autouse=True)
def _reused_processes():
    """The file's verify runs share one process per library (:mod:`surgery.verify.logits_pool`: a verdict
    of failure still comes from a fresh process)."""
    with logits_pool.reuse_processes():
        yield


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


@pytest.fixture
def hf(monkeypatch):
    """``HF_PYTHON`` set to a usable HF venv, or the test skipped (failed under ``TIETOOL_REQUIRE_HF``)."""
    python = hf_logits.python()
    why = hf_logits.available(python) if python else "HF_PYTHON is not set (source tests/tools/hf_venv.sh)"
    if why is not None:
        if os.environ.get("TIETOOL_REQUIRE_HF"):  # .ci/run: a proof that does not run is a failure
            pytest.fail(f"TIETOOL_REQUIRE_HF is set but the HF venv is unusable: {why}")
        pytest.skip(f"no HF transformers venv: {why}")
    monkeypatch.setenv("HF_PYTHON", python)


@pytest.mark.slow
@pytest.mark.pnlp
def test_paddleformers_convert_output_runs_in_hf(tmp_path: Path, pnlp, hf) -> None:
    """A PaddleNLP Llama converted to PaddleFormers: its logits in transformers equal PaddleNLP's of the
    input within 2e-5."""
    out = tmp_path / "pf"
    _ok(["convert", str(SRC), "--to", "paddleformers", "--out", str(out)])
    res = verify(SRC, out, logits_with="hf")
    assert res.exit_code == 0, (res.unexplained, res.logits)
    lg = res.logits
    assert lg["compared"] and lg["max_abs_diff"] <= 2e-5 and lg["tolerance"] == 2e-5
    assert lg["libraries"] == "HF transformers (the output) and PaddleNLP 2.8.1 (the input)"
    assert lg["model_class"] == "LlamaForCausalLM"


@pytest.mark.slow
def test_forged_weight_differs_in_hf(tmp_path: Path, hf) -> None:
    """A PaddleFormers fixture's tie --keep embedding output run in transformers agrees with the input in
    PaddleFormers only when the head is the embedding: the output as written agrees (exit 0), one with 16
    exponent bits flipped in a layer's weight differs (exit 7, the logits and the tensor named)."""
    out = tmp_path / "t"
    _ok(["tie", str(PF_SRC), "--keep", "embedding", "--out", str(out)])
    ref = tmp_path / "ref"
    _ok(["tie", str(PF_SRC), "--keep", "embedding", "--out", str(ref)])
    res = verify(out, ref, logits_with="hf")
    if res.logits.get("cause") == "no_paddle":
        pytest.skip("paddle / PaddleFormers not installed: the input runs in PaddleFormers")
    assert res.exit_code == 0, (res.unexplained, res.logits)
    assert res.logits["libraries"] == "HF transformers (the output) and PaddleFormers (the input)"
    name = "model.layers.0.mlp.down_proj.weight"
    t = Checkpoint.open(ref).tensors[name]
    p = ref / t.file
    data = bytearray(p.read_bytes())
    for k in range(16):
        data[t.offset + 4 * k + 3] ^= 0x20
    p.write_bytes(bytes(data))
    res = verify(out, ref, logits_with="hf")
    assert res.exit_code == 7
    assert res.logits["compared"] and res.logits["ok"] is False, res.logits
    assert any(u.startswith("logits differ") for u in res.unexplained), res.unexplained
    assert any(name in u for u in res.unexplained), res.unexplained


def test_hf_without_its_venv_not_compared(tmp_path: Path, monkeypatch) -> None:
    """No HF venv named or found: exit 8 naming HF_PYTHON (nothing run)."""
    monkeypatch.delenv("HF_PYTHON", raising=False)
    monkeypatch.setenv("HF_VENV", str(tmp_path / "no-venv"))
    out = tmp_path / "t"
    _ok(["tie", str(PF_SRC), "--keep", "embedding", "--out", str(out)])
    res = verify(PF_SRC, out, logits_with="hf")
    if res.logits.get("cause") == "no_paddle":
        pytest.skip("paddle / PaddleFormers not installed: the check before this one")
    assert res.exit_code == 8
    assert res.logits["cause"] == "no_hf" and "HF_PYTHON" in res.logits["error"]


def test_hf_refused_for_an_output_transformers_is_not_proven_to_load(tmp_path: Path) -> None:
    """A ``.pdparams`` output (convert --to paddlenlp): exit 8, the cause named before anything runs; an
    unknown library is a usage error."""
    out = tmp_path / "n"
    _ok(["convert", str(PF_SRC), "--to", "paddlenlp", "--out", str(out)])
    res = verify(PF_SRC, out, logits_with="hf")
    assert res.exit_code == 8
    assert res.logits["cause"] == "hf_unproven" and "pdparams" in res.logits["error"], res.logits
    r = run_cli(["verify", str(PF_SRC), str(out), "--logits-with", "torch"])
    assert r.returncode == 2, (r.stdout, r.stderr)
