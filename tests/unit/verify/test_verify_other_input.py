"""``verify A B`` where B's ``tietool-report.json`` records a ``merge`` / ``convert`` of another folder (the
rank files a merge read, checked against the model before it was split): the report cannot be checked
against A, so the two are compared as checkpoints. No difference at all passes (exit 0, a note and a verdict
line that say the report was not checked); any difference is exit 7 with the report's line first; an A
that is not one checkpoint (no weights) gets the report's line alone. Before, every such pair was exit 7
with "0 tensors bit-identical" although no tensor had been compared.

Inputs: ``tests/data/tp_ranks/`` (``original/`` and its ``tp2/`` rank files, cut by PaddleFormers' own
split functions; README there).
"""

from __future__ import annotations

from support import paths
from support.resize_support import run_cli

import tietool
from tietool import verify

TP = paths.REPO / "tests/data/tp_ranks"


def _merged(tmp_path, variant: str = "llama_fp32"):
    out = tmp_path / "merged"
    tietool.merge(TP / variant / "tp2", out)
    return out


def test_the_model_before_the_split_verifies_against_the_merge(tmp_path):
    out = _merged(tmp_path)
    res = verify(TP / "llama_fp32" / "original", out)
    assert (res.exit_code, res.unexplained, res.report_checked) == (0, [], False)
    assert res.identical == 21 and res.differences == 0
    assert any("records a merge of" in n and "the report was not checked" in n for n in res.notes), res.notes
    assert verify(TP / "llama_fp32" / "tp2", out).report_checked is True  # its own input: checked


def test_its_verdict_line_says_the_report_was_not_checked(tmp_path):
    out = _merged(tmp_path)
    r = run_cli(["verify", str(TP / "llama_fp32" / "original"), str(out), "-q"])
    assert (r.returncode, r.stdout) == (
        0,
        "verdict: no difference (the output's tietool-report.json records another input's run: "
        "not checked)\n",
    )


def test_another_model_is_unexplained_with_the_report_first(tmp_path):
    out = _merged(tmp_path)
    res = verify(TP / "llama_bf16" / "original", out)  # same names and shapes, other values and dtype
    assert res.exit_code == 7 and res.report_checked is False
    assert res.unexplained[0].startswith("tietool-report.json records a merge of ")
    assert res.unexplained[0].endswith("the report is unverifiable")
    assert len(res.unexplained) > 1 and res.differences > 0


def test_an_input_that_is_no_checkpoint_gets_the_report_line_alone(tmp_path):
    out = _merged(tmp_path)
    bare = tmp_path / "bare"  # a config.json and no weights: neither rank files nor one checkpoint
    bare.mkdir()
    (bare / "config.json").write_bytes((TP / "llama_fp32" / "original" / "config.json").read_bytes())
    res = verify(bare, out)
    assert res.exit_code == 7 and res.identical == 0
    assert len(res.unexplained) == 1, res.unexplained
    src = TP / "llama_fp32" / "tp2"
    want = f"tietool-report.json records a merge of {src}; {bare} cannot be its input (a merge of it is "
    want += "refused: "
    assert res.unexplained[0].startswith(want), res.unexplained


def test_a_file_only_the_output_holds_is_unexplained(tmp_path):
    out = _merged(tmp_path)
    (out / "notes.txt").write_text("not in the model before the split\n")
    res = verify(TP / "llama_fp32" / "original", out)
    assert res.exit_code == 7 and res.differences == 0
    assert res.unexplained[0].startswith("tietool-report.json records a merge of ")
    assert any("notes.txt" in u for u in res.unexplained[1:]), res.unexplained
