"""``verify`` of an output without its ``tietool-report.json``: no operation is recorded, so only a pair
with no difference at all passes (its verdict line cites no report); any difference is exit 7, the
missing report named first with the fix. Inputs: ``sample_checkpoints/``.
"""

from __future__ import annotations

import shutil

from support import paths

import tietool
from tietool import verify

REPO = paths.REPO
SAMPLES = REPO / "sample_checkpoints"


def test_output_without_its_report_does_not_verify(tmp_path):
    src, out = SAMPLES / "pf_llama_tied_fp32", tmp_path / "r"
    tietool.resize(src, 108, out, seed=0)
    assert verify(src, out).exit_code == 0
    (out / "tietool-report.json").unlink()
    res = verify(src, out)
    assert res.exit_code == 7
    assert res.report is False
    assert res.unexplained[0].startswith(
        f"{out} has no tietool-report.json: no operation is recorded to explain its 3 difference(s)"
    )


def test_identical_copy_without_a_report_verifies(tmp_path):
    src, out = SAMPLES / "pf_llama_tied_fp32", tmp_path / "copy"
    shutil.copytree(src, out)
    res = verify(src, out)
    assert (res.exit_code, res.unexplained, res.report) == (0, [], False)


def test_verdict_line_without_a_report_cites_none(tmp_path):
    from support.resize_support import run_cli

    src, out = SAMPLES / "pf_llama_tied_fp32", tmp_path / "copy"
    shutil.copytree(src, out)
    r = run_cli(["verify", str(src), str(out), "-q"])
    assert (r.returncode, r.stdout) == (
        0,
        "verdict: no difference (the output has no tietool-report.json, and needs none)\n",
    )


def test_output_with_an_unreadable_report_does_not_verify(tmp_path):
    src, out = SAMPLES / "pf_llama_tied_fp32", tmp_path / "r"
    tietool.resize(src, 108, out, seed=0)
    (out / "tietool-report.json").write_text("{")
    res = verify(src, out)
    assert res.exit_code == 7
    assert res.unexplained[0].startswith(f"{out} has an unreadable tietool-report.json: no operation")
