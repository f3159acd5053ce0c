"""Report fields: the resize report states the requested size, the multiple and the padded size; the report of
every writing operation's dry run has the common fields."""

from __future__ import annotations

import json
import os

import pytest
from support import cli_runner, paths

SAMPLE = paths.SAMPLES / "pf_llama_tied_fp32"


@pytest.mark.parametrize(
    "vocab, multiple, rows", [(101, 8, 104), (13, 8, 16), (104, 8, 104), (120, None, 120)]
)
def test_requested_multiple_and_padded_size(tmp_path, vocab, multiple, rows):
    out = tmp_path / "out"
    args = ["resize", str(SAMPLE), "--vocab", str(vocab), "--out", str(out), "--seed", "1", "-q"]
    args += ["--force"] if vocab < 100 else []
    args += ["--pad-to-multiple-of", str(multiple)] if multiple else []
    r = cli_runner.run_cli(args, cwd=os.getcwd(), timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "tietool-report.json").read_text())["resize"]
    assert (rep["rows_requested"], rep["pad_to_multiple_of"], rep["rows_after"]) == (vocab, multiple, rows)
    said = f"requested {vocab} padded to a multiple of {multiple}"
    assert (said in r.stdout) == (rows != vocab), r.stdout
    assert json.loads((out / "config.json").read_text())["vocab_size"] == rows


SAMPLES = SAMPLE.parent
COMMON = (
    "tool",
    "version",
    "operation",
    "input",
    "output",
    "dry_run",
    "changed",
    "before",
    "after",
    "config_changes",
    "left_out",
    "notes",
    "warnings",
)
DRY_RUNS = {
    "tie": ["tie", "pf_llama_tied_fp32"],
    "untie": ["untie", "pf_llama_tied_fp32"],
    "resize": ["resize", "pf_llama_tied_fp32", "--vocab", "104", "--seed", "1"],
    "add-tokens": ["add-tokens", "pf_llama_with_tokenizer", "<tool_x>", "--seed", "1"],
    "convert": ["convert", "pf_llama_tied_fp32", "--to", "paddlenlp"],
    "merge ranks": ["merge", "pf_llama_tp2"],
    "merge flex": ["merge", "pf_llama_trainer/checkpoint-2"],
    "flex edit": ["resize", "pf_llama_trainer/checkpoint-2", "--vocab", "256", "--keep-training-state"],
}


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_every_dry_run_report_has_the_common_fields(tmp_path, name):
    """The JSON report of every writing operation's dry run answers the same questions (its own keys
    kept), with the tool's version and the input and output as given."""
    op, ckpt, *rest = DRY_RUNS[name]
    out = tmp_path / "out"
    args = [op, str(SAMPLES / ckpt), *rest, "--out", str(out), "--dry-run", "--json"]
    r = cli_runner.run_cli(args, cwd=os.getcwd(), timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [k for k in COMMON if k not in rep] == []
    assert rep["dry_run"] is True and rep["operation"] == op and rep["output"] == str(out)
    assert rep["tool"] == f"tietool {rep['version']}" and not out.exists()
    assert rep["before"]["parameters"] > 0 and rep["after"]["bytes"] > 0
