"""The resize report states the requested size, the multiple and the padded size (issue 10)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import cli_runner

SAMPLE = Path(__file__).resolve().parents[1] / "sample_checkpoints" / "pf_llama_tied_fp32"


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
