"""Command-line details a daily user meets: errors as JSON with ``--json``, ``--version``, integer options
with their range, and ``resize --pad-to-multiple-of`` without ``--vocab``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import cli_runner, paths

from tietool import __version__
from tietool.surgery.io.checkpoint import Checkpoint

FIX = paths.CASES_DIR


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
# Ctrl-C as a terminal delivers it: a child inherits SIGINT ignored from a parent run in the background
# (`pytest &` in a script), and an ignored SIGINT stays ignored (the tool's run and Python leave it so)
signal.signal(signal.SIGINT, signal.default_int_handler)
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


# -------------------------------------------------------------------------------------------- help and words
COMMANDS = ["inspect", "tie", "untie", "resize", "add-tokens", "merge", "verify", "convert"]
REPO = paths.REPO
CASES = paths.BUG_CASES_DIR


def _help(*command: str) -> str:
    r = _cli(*command, "--help")
    assert r.returncode == 0, r.stderr
    return r.stdout


def _options(text: str) -> dict[str, str]:
    """``{--flag: metavar}`` of the options of a help text that take a value (a flag alone: "")."""
    import re

    found = {}
    for m in re.finditer(r"^  (?:-\w, )?(--[\w-]+)(?: / --[\w-]+)?(?: (\S+))?", text, re.M):
        found[m.group(1)] = m.group(2) or ""
    return found


@pytest.mark.parametrize("command", COMMANDS)
def test_metavars_read_as_users_write_them(command):
    """No Python type (``<int>``, ``<list[str]>``, ``<str>``) and no ``{CKPT}``: arguments by their name,
    values as ``N`` / ``DIR`` / ``FILE`` / ``SIZE`` / ``NAME`` / ``ROWS`` or ``[choice|choice]``."""
    import re

    text = _help(command)
    usage = text.splitlines()[0]
    assert "{" not in usage and "<" not in usage, usage
    assert not re.search(r"<[a-z\[\]|, -]+>", text.replace("CKPT.tietool-backup-<time>", "")), text
    for flag, metavar in _options(text).items():
        assert metavar in ("", "N", "DIR", "FILE", "SIZE", "NAME", "ROWS") or re.fullmatch(
            r"\[[\w:|.-]+\]", metavar
        ), (command, flag, metavar)


def test_one_spelling_per_option_across_commands():
    """An option several commands take shows the same metavar in each (``--pad-to-multiple-of N``, not
    ``N`` in one and ``M`` in another)."""
    seen: dict[str, set[str]] = {}
    for command in COMMANDS:
        for flag, metavar in _options(_help(command)).items():
            seen.setdefault(flag, set()).add(metavar)
    assert {f: m for f, m in seen.items() if len(m) > 1 and f != "--init"} == {}
    assert seen["--pad-to-multiple-of"] == {"N"} and seen["--out"] == {"DIR"} and seen["--seed"] == {"N"}


def test_merge_out_is_marked_required(tmp_path):
    text = _help("merge")
    assert "[required]" in text.split("--out DIR", 1)[1].split("--max-shard-size", 1)[0], text
    r = _cli("merge", tmp_path)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "tietool: error: Missing option '--out' / '-o' — e.g. --out DIR (a new folder)\n"


def _examples(text: str) -> list[list[str]]:
    """The command lines of a help's Examples section (``\\`` continues a line; ``#`` starts a comment)."""
    import shlex

    body = text.split("Examples:", 1)[1]
    lines, cur = [], ""
    for raw in body.splitlines():
        ln = raw.strip()
        if not ln:
            continue
        cur = f"{cur} {ln}".strip()
        if cur.endswith("\\"):
            cur = cur[:-1]
            continue
        lines.append(shlex.split(cur, comments=True))
        cur = ""
    return lines


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["tietool", *COMMANDS])
def test_every_help_has_examples_that_run(command, tmp_path):
    """``tietool --help`` and each command's ``--help`` end with examples on ``sample_checkpoints/``, and
    each runs as written, in order, from a folder that has the samples (exit 0), the samples untouched."""
    examples = _examples(_help(*command))
    assert len(examples) >= 2 and all(argv[0] == "tietool" for argv in examples), examples
    (tmp_path / "sample_checkpoints").symlink_to(REPO / "sample_checkpoints")
    before = {p.name: p.stat().st_mtime_ns for p in (REPO / "sample_checkpoints").rglob("*")}
    for argv in examples:
        if argv[1:] == ["COMMAND", "--help"]:
            continue
        r = cli_runner.run_cli(argv[1:], cwd=tmp_path, timeout=120)
        assert r.returncode == 0, (argv, r.stderr)
    assert {p.name: p.stat().st_mtime_ns for p in (REPO / "sample_checkpoints").rglob("*")} == before


def test_human_numbers():
    from tietool.cli import numbers

    assert numbers.count(5808) == "5,808"
    assert numbers.count(494_032_768) == "494,032,768 (494 M)"
    assert numbers.count(1_235_814_400) == "1,235,814,400 (1.24 B)"
    assert numbers.count(-2_000_000) == "-2,000,000 (-2 M)"
    assert [numbers.percent(p) for p in (27.548, 18740.176, 0.0, 6.6, 0.004, -1.5)] == [
        "27.55",
        "18740.18",
        "0",
        "6.6",
        "0",
        "-1.5",
    ]


def test_inspect_prints_human_numbers():
    r = _cli("inspect", REPO / "sample_checkpoints" / "pf_llama_tied_fp32")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith(
        ": safetensors, 1 weight file(s), 12 tensors, 5,808 parameters, 23232 bytes (22.7 KiB)"
    )
    assert "tying would save 1,600 parameters, 6400 bytes (6.2 KiB) (27.55% of the checkpoint)" in lines


@pytest.mark.parametrize("init, seeded", [("zeros", False), ("mean", True), ("normal", True)])
def test_seed_printed_only_for_random_inits(init, seeded, tmp_path):
    """``--init zeros`` draws nothing: no seed in the rows line; mean and normal draw, and say the seed."""
    src = REPO / "sample_checkpoints" / "pnlp_llama_untied"
    r = _cli("resize", src, "--vocab", 112, "--init", init, "--seed", 7, "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    rows = next(ln for ln in r.stdout.splitlines() if ln.startswith("rows "))
    want = f"rows 100 → 112 (+12 / -0), new rows: init {init}"
    assert rows == want + (", seed 7 (--seed 7 reproduces them)" if seeded else "")


@pytest.mark.parametrize("init, seeded", [("zeros", False), ("subtokens", False), ("mean", True)])
def test_add_tokens_seed_only_for_random_inits(init, seeded, tmp_path):
    src = REPO / "sample_checkpoints" / "pf_llama_with_tokenizer"
    r = _cli("add-tokens", src, "hello", "--init", init, "--seed", 3, "--dry-run")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("tokenizer 304"))
    want = "tokenizer 304 → 305 tokens; rows 320 → 320 (1 slack row(s) used)"
    assert line == want + ("; seed 3 (--seed 3 reproduces the rows)" if seeded else "")


def test_pad_row_named_not_untrained():
    """The row at config.json's pad_token_id, all zero by design (padding_idx), is named as the pad row and
    not counted as untrained (text and JSON)."""
    src = REPO / "sample_checkpoints" / "pf_llama_with_tokenizer"
    r = _cli("inspect", src)
    assert r.returncode == 0, r.stderr
    assert "untrained" not in r.stdout
    assert (
        "note: row 300 of model.embed_tokens.weight is all zero: the pad row (pad_token_id 300), zero by "
        "design (padding_idx)"
    ) in r.stdout.splitlines()
    doc = json.loads(_cli("inspect", src, "--json").stdout)
    assert doc["untrained_rows"]["pad_row"] == 300 and doc["untrained_rows"]["zero"]["count"] == 0
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["pad_token_id"] == 300


def test_pad_row_beside_untrained_rows(tmp_path):
    """Other all-zero rows are still untrained; the pad row is named beside them and not counted."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    src = REPO / "sample_checkpoints" / "pf_llama_tied_fp32"
    dst = tmp_path / "m"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    shard = dst / "model-00001-of-00001.safetensors"
    t = load_file(shard)
    emb = t["model.embed_tokens.weight"].copy()
    emb[[5, 7]] = 0
    t["model.embed_tokens.weight"] = emb
    t["lm_head.weight"] = emb.copy()
    save_file(t, shard, metadata={"format": "np"})
    assert not np.any(emb[0])
    r = _cli("inspect", dst)
    assert r.returncode == 0, r.stderr
    assert (
        "note: rows of model.embed_tokens.weight that look untrained (100 rows): 2 all-zero (ids 5, 7) "
        "(row 0 of model.embed_tokens.weight is all zero: the pad row (pad_token_id 0), zero by design "
        "(padding_idx), not counted)"
    ) in r.stdout.splitlines()


def test_drift_view_only_under_a_tied_config_or_asked():
    """An untied config's head is its own: no drift view and no ``tie --keep`` hint; ``--drift`` shows
    it. A tied config whose head drifted shows it unasked, with the hint."""
    untied = REPO / "sample_checkpoints" / "pnlp_llama_untied"
    r = _cli("inspect", untied)
    assert r.returncode == 0, r.stderr
    assert "drift:" not in r.stdout and "--keep" not in r.stdout and "|Δ|" not in r.stdout
    assert (
        "tying would save 0 parameters, 0 bytes (0% of the checkpoint): the config says untied and the head "
        "differs from the embedding: a head of its own, which tying would lose"
    ) in r.stdout.splitlines()
    asked = _cli("inspect", untied, "--drift")
    assert asked.returncode == 0
    assert (
        "drift: 100 of 100 rows differ; max |Δ| 0.0896, mean |Δ| 0.0223 over all 1600 elements (equal ones "
        "included)"
    ) in asked.stdout.splitlines()
    tied = _cli("inspect", CASES / "b06_tied_config_head_drifted" / "ckpt")
    assert tied.returncode == 0, tied.stderr
    assert any(ln.startswith("drift: 4 of 20 rows differ;") for ln in tied.stdout.splitlines())
    assert "(tie --keep embedding or --keep head would drop it)" in tied.stdout


def test_flex_inspect_names_the_commands_that_take_it():
    r = _cli("inspect", paths.FLEX / "trainer_2rank" / "checkpoint-2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == (
        "note: tietool merge takes a flex checkpoint into a new folder (PaddleFormers safetensors, which "
        "every command takes); resize and add-tokens take a Trainer checkpoint-N/ as it is with "
        "--keep-training-state (its optimizer state resized too); tie, untie, convert and verify refuse it"
    )
    assert "every other command refuses" not in r.stdout
