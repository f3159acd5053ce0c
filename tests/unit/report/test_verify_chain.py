"""``verify ORIGINAL FINAL`` across a chain of writes (issue 21, a loose end of issue 20): each write from a
folder that has a ``tietool-report.json`` carries that report's edits forward in its own report's
``history`` (:func:`tietool.surgery.report.history`), and verify applies the chain in order
(:func:`tietool.surgery.report.token_claims`), so the tokens added by earlier runs are explained; a row or
token no run made still is not (exit 7).

The checkpoint is the PaddleFormers Llama sample with a real tokenizer (304 tokens, 320 rows).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file
from support import paths
from support.resize_support import run_cli

SRC = paths.SAMPLES / "pf_llama_with_tokenizer"
EMB = "model.embed_tokens.weight"
WEIGHTS = "model-00001-of-00001.safetensors"

# each step: the command and its arguments after the checkpoint (--out or in place: the test decides)
CHAINS = {
    "add_then_resize": [["add-tokens", "<aa_tok>"], ["resize", "--vocab", "384"]],
    "resize_then_add": [["resize", "--vocab", "384"], ["add-tokens", "<aa_tok>"]],
    "add_trim_add": [
        ["add-tokens", "<aa_tok>"],
        ["resize", "--vocab", "304", "--force"],
        ["add-tokens", "<bb>"],
    ],
    "three_adds": [["add-tokens", "<aa_tok>"], ["add-tokens", "<bb>"], ["add-tokens", "<cc>", "--special"]],
}


def _run_chain(tmp: Path, steps: list[list[str]], in_place: bool) -> tuple[Path, Path]:
    """The original (an untouched copy) and the folder after every step, written in place or each to a new
    folder from the last one."""
    orig = tmp / "orig"
    shutil.copytree(SRC, orig)
    ck = tmp / "ck0"
    shutil.copytree(SRC, ck)
    for k, (cmd, *args) in enumerate(steps, 1):
        where = [] if in_place else ["--out", str(tmp / f"ck{k}")]
        run = run_cli([cmd, str(ck), *args, *where, *(["--no-backup"] if in_place else []), "-q"])
        assert run.rc == 0, (cmd, args, run.stdout, run.stderr)
        ck = ck if in_place else tmp / f"ck{k}"
    return orig, ck


@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "out"])
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_verify_original_against_the_end_of_a_chain(tmp_path, chain, in_place):
    """Every chain verifies against the original (exit 0); the final report's history names the earlier
    runs in order, and verify's tokenizer section lists every token still added (one trimmed by resize and
    not re-added is not)."""
    steps = CHAINS[chain]
    orig, ck = _run_chain(tmp_path, steps, in_place)
    rep = json.loads((ck / "tietool-report.json").read_text())
    assert [h["operation"] for h in rep["history"]] == [s[0] for s in steps[:-1]]
    assert "history" not in rep["history"][-1]  # flattened, not nested
    run = run_cli(["verify", str(orig), str(ck), "--json"])
    assert run.rc == 0, run.stdout
    doc = json.loads(run.stdout)
    got = {(t["content"], t["id"]) for t in doc["tokenizer"]["added"]}
    want = {
        "add_then_resize": {("<aa_tok>", 304)},
        "resize_then_add": {("<aa_tok>", 304)},
        "add_trim_add": {("<bb>", 304)},
        "three_adds": {("<aa_tok>", 304), ("<bb>", 305), ("<cc>", 306)},
    }[chain]
    assert got == want


def _set_row(folder: Path, name: str, row: int, value: float) -> None:
    """Overwrite one row of tensor ``name`` in the folder's one safetensors file (a new file, not the
    hard-linked one: the chain's earlier folders keep theirs)."""
    f = folder / WEIGHTS
    t = load_file(f)
    t[name] = t[name].copy()
    t[name][row] = value
    f.unlink()
    save_file(t, f)  # the sample's file has no metadata either


def test_a_wrong_row_after_a_chain_is_still_unexplained(tmp_path):
    """A chain explains the rows of the tokens it added, not another: row 5 (an original token) changed
    after two in-place add-tokens is unexplained (exit 7, naming the embedding); a row of a token the chain
    added may differ (it was initialised by add-tokens), so changing row 304 is explained."""
    orig, ck = _run_chain(tmp_path, CHAINS["three_adds"][:2], in_place=True)
    _set_row(ck, EMB, 304, 0.5)
    assert run_cli(["verify", str(orig), str(ck)]).rc == 0
    _set_row(ck, EMB, 5, 0.5)
    run = run_cli(["verify", str(orig), str(ck)])
    assert run.rc == 7 and EMB in run.stdout, run.stdout


def test_a_token_no_run_reported_is_still_unexplained(tmp_path):
    """The history explains the tokens the runs reported, nothing else: a token written into the final
    tokenizer.json by hand after the chain is unexplained (exit 7, naming it)."""
    orig, ck = _run_chain(tmp_path, CHAINS["three_adds"][:2], in_place=True)
    p = ck / "tokenizer.json"
    tok = json.loads(p.read_text())
    tok["added_tokens"].append({**tok["added_tokens"][-1], "id": 306, "content": "<zz>"})
    p.unlink()
    p.write_text(json.dumps(tok))
    run = run_cli(["verify", str(orig), str(ck)])
    assert run.rc == 7 and "'<zz>'" in run.stdout, run.stdout


def test_a_forged_history_entry_cannot_hide_a_changed_original_token(tmp_path):
    """History entries only add explanations of ids the input does not have: an entry claiming id 5 was
    added does not explain an original token's row changing (row 5 of the embedding), exit 7."""
    orig, ck = _run_chain(tmp_path, CHAINS["three_adds"][:2], in_place=True)
    p = ck / "tietool-report.json"
    rep = json.loads(p.read_text())
    rep["history"].append({"operation": "add-tokens", "add_tokens": {"tokens": [{"content": "x", "id": 5}]}})
    p.unlink()
    p.write_text(json.dumps(rep))
    _set_row(ck, EMB, 5, 0.5)
    run = run_cli(["verify", str(orig), str(ck)])
    assert run.rc == 7, run.stdout


def _forge(ck: Path, history: list[dict], last_rows_before: int | None = None) -> None:
    """Replace the report's history by ``history`` (a new file: the chain's earlier folders keep theirs);
    ``last_rows_before`` also rewrites the last run's own ``rows_before``, so that the rows follow on."""
    p = ck / "tietool-report.json"
    rep = json.loads(p.read_text())
    rep["history"] = history
    if last_rows_before is not None:
        rep["add_tokens"]["rows_before"] = last_rows_before
    p.unlink()
    p.write_text(json.dumps(rep))


def _drop_base_token(ck: Path, i: int) -> str:
    """Remove id ``i`` of tokenizer.json's base vocabulary by hand; its string."""
    p = ck / "tokenizer.json"
    tok = json.loads(p.read_text())
    s = next(k for k, v in tok["model"]["vocab"].items() if v == i)
    del tok["model"]["vocab"][s]
    p.unlink()
    p.write_text(json.dumps(tok))
    return s


def _trim(i: int, s: str, rows_before: int | None = 320, rows_after: int | None = 299) -> dict:
    """A history entry of a resize that says it removed token ``s`` (id ``i``)."""
    sec: dict = {"tokens_removed": [{"id": i, "content": s}]}
    sec.update({k: v for k, v in (("rows_before", rows_before), ("rows_after", rows_after)) if v is not None})
    return {"tool": "tietool 0.1.0", "operation": "resize", "resize": sec}


@pytest.mark.parametrize(
    "forgery",
    ["bare_claim", "rows_follow_on", "rows_break", "trim_above_the_id"],
)
def test_a_forged_history_cannot_explain_a_lost_base_token(tmp_path, forgery):
    """A history entry claiming an earlier resize removed a base-vocabulary token (id 299 of 300) does not
    explain the output losing it: tietool removes only added tokens, and a trim only ids at or beyond its
    rows, each run starting from the rows the previous one ended with. Whether the forgery says nothing of
    the rows, makes them follow on (resize 320 -> 299, then add-tokens from 299), breaks them, or trims above
    the id, verify names the token and calls the report unverifiable (exit 7)."""
    orig, ck = _run_chain(tmp_path, CHAINS["three_adds"][:1], in_place=True)
    s = _drop_base_token(ck, 299)
    entry, last = {
        "bare_claim": (_trim(299, s, None, None), None),
        "rows_follow_on": (_trim(299, s), 299),
        "rows_break": (_trim(299, s, 320, 299), None),
        "trim_above_the_id": (_trim(299, s, 320, 300), 300),
    }[forgery]
    _forge(ck, [entry], last)
    run = run_cli(["verify", str(orig), str(ck)])
    assert run.rc == 7, run.stdout
    line = next(x for x in run.stdout.splitlines() if f"{s!r} (id 299)" in x)
    assert "history entry 1 (resize) says it was removed" in line and "unverifiable" in line, line
    why = {
        "bare_claim": "records its rows_after",
        "rows_follow_on": "base vocabulary",
        "rows_break": "starts from 320 rows after a run that ended with 299",
        "trim_above_the_id": "removes only ids from 300",
    }[forgery]
    assert why in line, line


def test_a_real_trim_of_an_added_token_still_verifies(tmp_path):
    """The checks of a removal claim pass a real one: resize --force to 303 rows removes the input's added
    token '<think>' (id 303); verify ORIGINAL OUT exits 0 and lists it as removed. The same report claiming
    a base token too (id 299, dropped by hand) is refused for that token only."""
    orig = tmp_path / "orig"
    shutil.copytree(SRC, orig)
    ck = tmp_path / "ck"
    assert run_cli(["resize", str(orig), "--vocab", "303", "--force", "--out", str(ck), "-q"]).rc == 0
    run = run_cli(["verify", str(orig), str(ck), "--json"])
    assert run.rc == 0, run.stdout
    assert json.loads(run.stdout)["tokenizer"]["removed"] == [{"content": "<think>", "id": 303}]
    rep = json.loads((ck / "tietool-report.json").read_text())
    s = _drop_base_token(ck, 299)
    rep["resize"]["tokens_removed"].append({"id": 299, "content": s})
    (ck / "tietool-report.json").unlink()
    (ck / "tietool-report.json").write_text(json.dumps(rep))
    run = run_cli(["verify", str(orig), str(ck)])
    assert run.rc == 7 and "the last run (resize) says it was removed" in run.stdout, run.stdout
    assert "'<think>' (id 303)" not in run.stdout, run.stdout


def test_a_forged_trim_of_an_added_token_must_match_the_rows(tmp_path):
    """An added token of the input ('<think>', id 303) removed by hand, with a report claiming a resize to
    303 rows removed it: the output's embedding still has 320 rows, so the chain does not describe it
    (exit 7, unverifiable, naming both row counts). The real trim (resize --vocab 303 --force) verifies."""
    orig = tmp_path / "orig"
    shutil.copytree(SRC, orig)
    ck = tmp_path / "ck"
    shutil.copytree(SRC, ck)
    for name, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "added_tokens_decoder")):
        p = ck / name
        data = json.loads(p.read_text())
        if isinstance(data[key], list):
            data[key] = [t for t in data[key] if t["id"] != 303]
        else:
            data[key].pop("303")
        p.unlink()
        p.write_text(json.dumps(data))
    rep = {"tool": "tietool 0.1.0", "operation": "resize"}
    rep["resize"] = {
        "rows_before": 320,
        "rows_after": 303,
        "tokens_removed": [{"id": 303, "content": "<think>"}],
    }
    (ck / "tietool-report.json").write_text(json.dumps(rep))
    run = run_cli(["verify", str(orig), str(ck)])
    assert run.rc == 7, run.stdout
    line = next(x for x in run.stdout.splitlines() if "'<think>' (id 303)" in x)
    assert "runs end with 303 rows, the output's embedding has 320" in line and "unverifiable" in line, line


def test_tie_keep_head_after_add_tokens_verifies_and_a_changed_row_does_not(tmp_path):
    """add-tokens then ``tie --keep head``: the embedding took the head's values and the head was dropped;
    against the original, the embedding equals the original head in every row but the added tokens' (set
    by add-tokens), so verify exits 0 and names the dropped head as equal to the embedding. An original
    token's row changed afterwards is still unexplained (exit 7, naming the embedding)."""
    orig, ck = _run_chain(tmp_path, [["add-tokens", "<aa_tok>", "<bb>"], ["tie", "--keep", "head"]], False)
    run = run_cli(["verify", str(orig), str(ck), "--json"])
    assert run.rc == 0, run.stdout
    doc = json.loads(run.stdout)
    assert [d["equals_embedding"] for d in doc["dropped"]] == [True]
    head = load_file(orig / WEIGHTS)["lm_head.weight"]
    emb = load_file(ck / WEIGHTS)[EMB]
    assert (emb[:304] == head[:304]).all() and not (emb[304:306] == head[304:306]).all()
    _set_row(ck, EMB, 5, 0.5)
    run = run_cli(["verify", str(orig), str(ck)])
    assert run.rc == 7 and EMB in run.stdout, run.stdout
