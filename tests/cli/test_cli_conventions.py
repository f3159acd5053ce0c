"""The conventions every command follows (as ``hf``, the gguf scripts and argparse tools do): ``--quiet``
prints only the result line and ``--json`` is for machines, on every command; merge prints a compact table
(``--verbose`` for a line per tensor); shell completion is on (``--install-completion``,
``--show-completion``, the ``_TIETOOL_COMPLETE`` protocol) under both ``tietool`` and ``python -m tietool``;
one spelling per option across commands; the app's description names every command.

Each run is on a shipped sample (``sample_checkpoints/``) and asserts the exact output and exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import typer
from support import cli_runner, paths

from tietool.cli.app import app

REPO = paths.REPO
S = REPO / "sample_checkpoints"


def _cli(*args: object, env: dict | None = None) -> cli_runner.CliRun:
    return cli_runner.run_cli(args, cwd=os.getcwd(), env=env, timeout=120)


def _commands() -> dict:
    group = typer.main.get_command(app)
    ctx = group.make_context("tietool", [], resilient_parsing=True)
    return {n: group.get_command(ctx, n) for n in group.list_commands(ctx)}  # type: ignore[attr-defined]


def _options(cmd) -> dict[str, object]:
    return {o: p for p in cmd.params for o in p.opts if o.startswith("--")}


# ---------------------------------------------------------------------------------------- --quiet / --json
def test_every_command_has_quiet_and_json():
    missing = [
        f"{name} {flag}"
        for name, cmd in _commands().items()
        for flag in ("--quiet", "--json")
        if flag not in _options(cmd)
    ]
    assert not missing, missing
    for name, cmd in _commands().items():
        assert _options(cmd)["--quiet"].opts == ["--quiet", "-q"], name


def test_quiet_tie_and_verify_print_the_result_line(tmp_path):
    out = tmp_path / "tied"
    r = _cli("tie", S / "pf_llama_tied_fp32", "--out", out, "-q")
    assert (r.rc, r.stderr) == (0, "")
    # 100 rows x 16 fp32: the duplicate head, 1,600 parameters, 6400 bytes of 23232 + the index
    assert r.stdout == (
        f"tie: {S / 'pf_llama_tied_fp32'} → {out}: saved 1,600 parameters, 6400 bytes (6.2 KiB) (27.55%)\n"
    )
    r = _cli("verify", S / "pf_llama_tied_fp32", out, "-q")
    assert (r.rc, r.stderr) == (0, "")
    assert (
        r.stdout == "verdict: every difference is explained by the operations tietool-report.json records\n"
    )


def test_quiet_verify_of_an_unexplained_difference(tmp_path):
    """Exit 7: the verdict line on stdout, the reason on stderr pointing at the full listing."""
    r = _cli("verify", S / "pf_llama_tied_fp32", S / "pnlp_gpt", "-q")
    assert r.rc == 7
    assert r.stdout == "verdict: differences that tietool's operations do not explain\n"
    assert r.stderr.endswith("(run without --quiet to list them)\n") and r.stderr.count("\n") == 1, r.stderr


def test_quiet_inspect_one_line_per_checkpoint(tmp_path):
    a, b = S / "pf_llama_tied_fp32", S / "pnlp_gpt"
    r = _cli("inspect", a, "-q")
    line_a = (
        f"{a}: llama (llama), vocab rows 100, hidden 16, head layout vocab-hidden; tied by config; head in "
        "files; values exact; tying saves 6400 bytes (6.2 KiB)"
    )
    # stdout: the line; what the library notes goes to stderr (the pad row, zero by design)
    assert (r.rc, r.stdout) == (0, line_a + "\n")
    assert r.stderr == (
        "note: row 0 of model.embed_tokens.weight is all zero: the pad row (pad_token_id 0), zero by design "
        "(padding_idx)\n"
    )
    r = _cli("inspect", a, b, tmp_path / "nope", "-q")
    assert r.rc == 3
    assert r.stdout.splitlines() == [
        line_a,
        f"{b}: gpt (gpt), vocab rows 96, hidden 16, head layout vocab-hidden; tied by config; head in files; "
        "values exact; tying saves 6144 bytes (6.0 KiB)",
        f"{tmp_path / 'nope'}: error (exit 3): no such folder",
    ]
    r = _cli("inspect", S / "pf_llama_trainer" / "checkpoint-2", "-q")
    assert r.rc == 0 and r.stdout == (
        f"{S / 'pf_llama_trainer' / 'checkpoint-2'}: flex checkpoint (llama), 1 rank(s), 21 tensors: "
        "merge it first, vocab rows 250, hidden 16, head layout vocab-hidden; untied by config; head in "
        "files; values different\n"
    )


def test_quiet_inspect_of_a_flex_gap_is_one_line_and_its_error():
    """``inspect -q`` of a flex checkpoint with a gap: the result line on stdout, then on stderr the one
    error line (it names the first problem; the problem lines of the full report are not repeated; a
    warning of another kind, overlapping slices, still printed); exit 3."""
    hostile = REPO / "tests" / "data" / "flex" / "hostile"
    for name, warned in (("gap_missing_slice", False), ("overlap_offsets", True)):
        r = _cli("inspect", hostile / name, "-q")
        lines = r.stderr.splitlines()
        assert r.rc == 3 and r.stdout.count("\n") == 1 and "with a gap" in r.stdout, r.describe()
        assert lines[-1].startswith("tietool: error: ") and "no slice of" in lines[-1], r.describe()
        assert not any(x.startswith("problem:") for x in lines), r.describe()
        assert [x.startswith("warning:") for x in lines[:-1]] == ([True] if warned else []), r.describe()
        assert "listed above" not in r.stderr, r.describe()


def test_quiet_convert_and_resize(tmp_path):
    src, out = S / "pnlp_llama_untied", tmp_path / "pf"
    r = _cli("convert", src, "--to", "paddleformers", "--out", out, "-q")
    assert r.rc == 0 and r.stderr == (
        "note: Linear weights are [in, out]: proven by the shapes of 3 of them against config.json "
        "(e.g. llama.layers.0.mlp.gate_proj.weight), 4 square ones taken as their siblings\n"
    )
    assert r.stdout == (
        f"convert: {src} → {out}: PaddleNLP 2.x (pdparams) → PaddleFormers/HF safetensors (safetensors), "
        "12 tensors, 23232 bytes (22.7 KiB)\n"
    )
    r = _cli("resize", S / "pnlp_gpt", "--vocab", "200", "--init", "zeros", "--out", tmp_path / "r", "-q")
    # +104 rows x 16 in the embedding, the duplicate head of the tied config (96 x 16) dropped (notes say why)
    notes = r.stderr.splitlines()
    assert r.rc == 0 and len(notes) == 2 and all(n.startswith("note: ") for n in notes), r.stderr
    assert "lm_head.weight dropped instead of resized" in notes[1]
    assert r.stdout == (
        f"resize: {S / 'pnlp_gpt'} → {tmp_path / 'r'}: added 128 parameters, 512 bytes (2.02%); "
        "rows 96 → 200\n"
    )


def test_quiet_add_tokens_and_random_resize(tmp_path):
    src = S / "pf_llama_with_tokenizer"
    r = _cli("add-tokens", src, "<tool_call>", "</tool_call>", "--special", "--out", tmp_path / "chat", "-q")
    assert (r.rc, r.stderr) == (0, "note: 2 slack row(s) 304..305 taken\n")
    # the sample's tokenizer has fewer tokens than rows: the two tokens take slack rows, no row is added
    assert r.stdout == (
        f"add-tokens: {src} → {tmp_path / 'chat'}: saved 0 parameters, 0 bytes (0%); 2 token(s) added, "
        "rows 320 → 320\n"
    )
    r = _cli(
        "resize", S / "pnlp_llama_untied", "--vocab", "112", "--seed", "7", "--out", tmp_path / "g", "-q"
    )
    assert r.rc == 0 and r.stdout.endswith("; rows 100 → 112, seed 7\n"), r.stdout


def test_json_wins_over_quiet(tmp_path):
    r = _cli("tie", S / "pf_llama_tied_fp32", "--out", tmp_path / "t", "-q", "--json")
    assert r.rc == 0 and json.loads(r.stdout)["operation"] == "tie"


# --------------------------------------------------------------------------------------------- merge output
def test_merge_prints_a_compact_table(tmp_path):
    out = tmp_path / "m"
    r = _cli("merge", S / "pf_llama_tp2", "--out", out)
    assert (r.rc, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    assert lines[0] == "21 tensors merged"
    rows = {ln.split("│")[1].strip(): int(ln.split("│")[2]) for ln in lines if ln.startswith("│")}
    # Llama, 2 layers: q/k/v/gate/up split by column, o/down by row, the norms replicated
    assert rows == {
        "vocab on axis 0": 1,
        "column on axis 1": 10,
        "row on axis 0": 4,
        "replicated": 5,
        "head on axis 0": 1,
    }
    assert lines[-1] == (
        f"merged 2 rank files (2 tensor-parallel x 1 pipeline) into {out}: 21 tensors in model_state.pdparams"
    )
    assert len(lines) < 15  # not a line per tensor


def test_merge_verbose_and_quiet(tmp_path):
    r = _cli("merge", S / "pf_llama_tp2", "--out", tmp_path / "v", "--verbose")
    per_tensor = [ln for ln in r.stdout.splitlines() if ln.startswith("  ")]
    assert r.rc == 0 and len(per_tensor) == 21
    assert per_tensor[0] == "  model.embed_tokens.weight: vocab on axis 0 -> F32 [48, 16]"
    r = _cli("merge", S / "pf_qwen3_moe_ep2", "--out", tmp_path / "q", "-q")
    assert (r.rc, r.stderr) == (0, "")
    assert r.stdout == (
        f"merged 2 rank files (2 expert-parallel, numbered global) into {tmp_path / 'q'}: 18 tensors in "
        "model_state.pdparams\n"
    )


# --------------------------------------------------------------------------------------------- completion
def test_completion_protocol_completes_commands_and_options():
    env = {"_TIETOOL_COMPLETE": "complete_bash", "COMP_WORDS": "tietool me", "COMP_CWORD": "1"}
    r = _cli(env=env)
    assert (r.rc, r.stdout.split()) == (0, ["merge"])
    env.update(COMP_WORDS="tietool resize --pad", COMP_CWORD="2")
    r = _cli(env=env)
    assert (r.rc, r.stdout.split()) == (0, ["--pad-to-multiple-of"])


def test_show_and_install_completion(tmp_path):
    """The shell named (Typer's test switch turns shellingham's detection off): the script keys on
    the name ``tietool`` also under ``python -m tietool``; ``--install-completion`` writes it and sources
    it from ~/.bashrc."""
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "SHELL": "/bin/bash",
        "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1",
    }
    show = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m tietool --show-completion bash"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert show.returncode == 0, show.stderr
    assert "complete -o default -F _tietool_completion tietool" in show.stdout
    assert "_TIETOOL_COMPLETE=complete_bash" in show.stdout
    inst = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m tietool --install-completion bash"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert inst.returncode == 0, inst.stderr
    script = tmp_path / ".bash_completions" / "tietool.sh"
    assert (
        script.read_text() == show.stdout.rstrip("\n") + "\n" or "_tietool_completion" in script.read_text()
    )
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()


# ---------------------------------------------------------------------------------------------- spelling
def test_one_spelling_per_option():
    """An option of the same name has the same short flag and metavar in every command that has it
    (``--pad-to-multiple-of N``, ``--out/-o DIR``, ``--seed N``, ``--max-shard-size SIZE``); ``--layout`` and
    ``--init`` name their choices, which differ by command."""
    seen: dict[str, set[tuple]] = {}
    for cmd in _commands().values():
        for p in cmd.params:
            if p.param_type_name != "option" or p.is_flag:
                continue
            long = next(o for o in p.opts if o.startswith("--"))
            if long in ("--layout", "--init"):
                continue
            seen.setdefault(long, set()).add((tuple(sorted(p.opts)), p.metavar))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}
    assert seen["--pad-to-multiple-of"] == {(("--pad-to-multiple-of",), "N")}
    assert seen["--out"] == {(("--out", "-o"), "DIR")}


def test_merge_out_is_marked_required():
    r = _cli("merge", "-h")
    flat = " ".join(r.stdout.split())
    assert r.rc == 0 and "-o, --out DIR output folder (must not exist or be empty) [required]" in flat
    r = _cli("merge", S / "pf_llama_tp2")
    assert r.rc == 2 and "--out" in r.stderr


def test_app_description_names_every_command():
    r = _cli("-h")
    words = " ".join(r.stdout.split("Options:")[0].split()).lower()
    for name in _commands():
        assert name.replace("-", " ") in words.replace("-", " "), name


def test_every_help_names_its_docs_page():
    """Each ``--help`` names its guide (a page of the clone's ``docs/``) and the CLI reference, before the
    Examples."""
    for name in ["", *_commands()]:
        r = _cli(*([name] if name else []), "-h")
        docs = r.stdout.split("Docs: ", 1)[1].split("\n", 1)[0]
        page, ref = docs.split("; every option: ")
        assert (REPO / page).is_file() and (REPO / ref).is_file(), docs
        assert r.stdout.index("Docs: ") < r.stdout.index("Examples:"), name
