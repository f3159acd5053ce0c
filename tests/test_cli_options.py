"""Command-line details a daily user meets: errors as JSON with ``--json``, ``--version``, integer options
with their range, and ``resize --pad-to-multiple-of`` without ``--vocab``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli_runner

from tietool import __version__
from tietool.surgery.io.checkpoint import Checkpoint

FIX = Path(__file__).resolve().parent / "data" / "fixtures" / "cases"


def _cli(*args: object) -> cli_runner.CliRun:
    return cli_runner.run_cli(args, cwd=os.getcwd(), timeout=120)


@pytest.mark.parametrize(
    "args, code, kind",
    [
        (["inspect", "{tmp}/missing", "--json"], 3, "CheckpointError"),
        (["tie", FIX / "pf_llama_untied_fp32", "--out", "{tmp}/o", "--json"], 5, "ValuesDifferError"),
        (
            ["resize", FIX / "pf_llama_untied_fp32", "--out", "{tmp}/o", "--vocab", "0", "--json"],
            2,
            "UsageError",
        ),
        (["resize", FIX / "pf_llama_untied_fp32", "--out", "{tmp}/o", "--json"], 2, "UsageError"),
    ],
    ids=["missing-folder", "values-differ", "vocab-out-of-range", "no-size-given"],
)
def test_json_errors_are_an_object_on_stdout(tmp_path, args, code, kind):
    r = _cli(*[str(a).replace("{tmp}", str(tmp_path)) for a in args])
    assert r.returncode == code
    doc = json.loads(r.stdout)  # parses: `... --json | python -m json.tool` works
    assert doc["exit_code"] == code and doc["error"]["type"] == kind
    assert doc["error"]["message"] and not doc["error"]["message"].startswith("tietool")
    # the one line on stderr is still there, and says the same
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("tietool: error: ")
    assert not (tmp_path / "o").exists()


def test_errors_without_json_leave_stdout_empty(tmp_path):
    r = _cli("inspect", tmp_path / "missing")
    assert r.returncode == 3 and r.stdout == ""


def test_version():
    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tietool {__version__}"


def test_pad_to_multiple_of_alone_rounds_the_current_rows_up(tmp_path):
    """As HF ``resize_token_embeddings(None, pad_to_multiple_of=64)``: 100 rows → 128."""
    out = tmp_path / "o"
    r = _cli("resize", FIX / "pf_llama_untied_fp32", "--out", out, "--pad-to-multiple-of", 64, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["resize"]["rows_before"] == 100 and rep["resize"]["rows_after"] == 128
    ck = Checkpoint.open(out)
    assert ck.config["vocab_size"] == 128
    assert ck.tensors["model.embed_tokens.weight"].shape[0] == 128


@pytest.mark.parametrize("opt, value", [("--vocab", "1.5"), ("--vocab", "-3"), ("--pad-to-multiple-of", "0")])
def test_integer_options_name_the_option_and_an_example(tmp_path, opt, value):
    args = ["resize", FIX / "pf_llama_untied_fp32", "--out", tmp_path / "o", opt, value]
    if opt != "--vocab":
        args += ["--vocab", "128"]
    r = _cli(*args)
    assert r.returncode == 2
    assert opt in r.stderr and f"e.g. {opt} " in r.stderr and r.stderr.count("\n") == 1


def test_inspect_several_folders_a_row_each_and_a_json_list(tmp_path):
    a, b = FIX / "pf_llama_tied_fp32", FIX / "pnlp_llama_untied"
    r = _cli("inspect", a, tmp_path / "missing", b, "--json")
    assert r.returncode == 3  # the first failure's code; the others are still inspected
    docs = json.loads(r.stdout)
    assert [d["path"] for d in docs] == [str(a), str(tmp_path / "missing"), str(b)]
    assert docs[0]["head"]["layout"] == "vocab-hidden" and docs[2]["head"]["layout"] == "hidden-vocab"
    assert docs[1]["exit_code"] == 3 and docs[1]["error"]["type"] == "CheckpointError"
    single = json.loads(_cli("inspect", a, "--json").stdout)
    assert docs[0] == single  # a row is the same inspection as the folder alone
    r = subprocess.run(  # relative names, so that no cell of the table is folded
        [sys.executable, "-m", "tietool", "inspect", a.name, b.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=FIX,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert r.returncode == 0
    rows = [ln for ln in r.stdout.splitlines() if a.name in ln or b.name in ln]
    assert len(rows) == 2 and "values exact" in rows[0] and "values different" in rows[1]


def test_json_is_strict_when_the_head_holds_inf(tmp_path):
    """A non-finite max |difference| is written as a string: strict JSON parsers (JSON.parse) refuse the
    ``Infinity`` that json.dumps would write."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    ck = tmp_path / "ck"
    ck.mkdir()
    for f in (FIX / "pf_llama_untied_fp32").iterdir():
        (ck / f.name).write_bytes(f.read_bytes())
    (st,) = ck.glob("*.safetensors")
    t = load_file(st)
    t["lm_head.weight"][3, 0] = np.inf
    save_file(t, st, metadata={"format": "pt"})
    r = _cli("inspect", ck, "--json")
    assert r.returncode == 0, r.stderr

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    doc = json.loads(r.stdout, parse_constant=refuse)
    assert doc["tie"]["values"] == "different" and doc["tie"]["max_abs_diff"] == "inf"


@pytest.mark.parametrize("out", ["f/o", "f/a/b"])
def test_out_under_a_file_names_the_file(tmp_path, out):
    """--out below a path that is a file: mkdir says only "File exists" / "Not a directory" of the parent
    (the message read "f: cannot create the output's parent folder: File exists — check the path"); the
    line names the file, says why, and nothing is written (exit 6)."""
    (tmp_path / "f").write_text("not a folder")
    r = _cli("tie", FIX / "pf_llama_tied_fp32", "--out", tmp_path / out)
    assert r.returncode == 6 and r.stdout == "", r.stderr
    assert r.stderr == (
        f"tietool: error: {tmp_path / 'f'}: is a file, so the output cannot be created inside it; nothing "
        "was written — choose an --out whose parent is a folder\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.parametrize("args", [["untie"], ["resize", "--vocab", "120"]])
def test_layout_contradicting_the_head_names_the_checkpoint(tmp_path, args):
    """--layout against a head whose shape says the other layout: the line named no file (it began
    "tietool: error: untie refused: ..."); it names the checkpoint, as every error does."""
    ck = FIX / "pf_llama_untied_fp32"
    r = _cli(args[0], ck, *args[1:], "--layout", "hidden-vocab", "--out", tmp_path / "o")
    assert r.returncode == 2 and not (tmp_path / "o").exists()
    want = f"tietool: error: {ck}: {args[0]} refused: the layout hidden-vocab contradicts the head"
    assert r.stderr.startswith(want), r.stderr
    assert r.stderr.rstrip().endswith("pass --layout vocab-hidden, or leave --layout out"), r.stderr


# A SIGTERM (or Ctrl-C) that lands while Typer builds the commands or parses the arguments, before any work
# (the breaker campaign of issue 18 hit both windows with a timed SIGTERM 0.5-0.8 s after start): the
# first was a raw KeyboardInterrupt traceback (killed by SIGINT), the second a silent exit 130 (Typer's
# Exit(130)) instead of SIGTERM's 143 and the one "interrupted" line.
_SIGNAL_AT = """
import os, signal, sys
import typer.core, typer.main
from tietool.cli import app as A
where, sig = sys.argv[1], getattr(signal, sys.argv[2])
if where == "build":
    real = typer.main.get_command
    def hook(*a, **k):
        os.kill(os.getpid(), sig)
        return real(*a, **k)
    typer.main.get_command = hook
else:
    ctx = typer.core.TyperCommand.context_class  # Click's Context (Typer vendors Click)
    real = ctx.__init__
    def hook(self, *a, **k):
        os.kill(os.getpid(), sig)
        return real(self, *a, **k)
    ctx.__init__ = hook
sys.argv = ["tietool", "inspect", sys.argv[3]]
A.main()
"""


@pytest.mark.parametrize("where", ["build", "parse"])
@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_before_any_work_is_one_line_and_its_code(where, sig, code):
    r = subprocess.run(
        [sys.executable, "-c", _SIGNAL_AT, where, sig, FIX / "pf_llama_untied_fp32"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["tietool: interrupted; nothing was written"], r.stderr


@pytest.mark.parametrize("command", [[], ["inspect"], ["resize"], ["add-tokens"], ["merge"], ["verify"]])
def test_dash_h_is_help(command):
    """``-h`` prints the same help as ``--help`` (the argparse and ``hf`` convention), exit 0."""
    short, long = _cli(*command, "-h"), _cli(*command, "--help")
    assert (short.rc, long.rc) == (0, 0), short.stderr
    assert short.stdout == long.stdout and "Usage:" in short.stdout
