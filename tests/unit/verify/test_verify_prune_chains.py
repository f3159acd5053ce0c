"""``verify ORIGINAL FINAL`` across chains with a ``prune``, ``fix-untrained`` or ``rename-tokens`` in them,
and every write carrying its input's report ``history`` (with the sections verify reads: ``prune.id_map``,
``fix_untrained``, ``rename_tokens``).

A prune in a longer chain: the original pruned to the ids that reach the output, then compared with it
(:mod:`tietool.surgery.verify.pruned`); the token claims of runs before a prune renumbered through its
``id_map``. Right chains exit 0; one flipped element, a renamed key, a forged ``id_map`` in the history exit
7 naming it; rows set by fix-untrained / rename-tokens before a prune are recomputed from the original.

Inputs: ``sample_checkpoints/pf_llama_with_tokenizer`` (PaddleFormers 1.2 Llama, untied, 320 rows, a
byte-level BPE of 304 tokens), ``tests/data/cases/e04_llama3_base_untrained_chat_tokens`` (untrained rows).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import paths
from support.resize_support import run_cli
from test_verify_writes import _flip, _rename_key

from tietool import verify
from tietool.surgery.io.checkpoint import Checkpoint

REPO = paths.REPO
SAMPLE = REPO / "sample_checkpoints" / "pf_llama_with_tokenizer"
E04 = REPO / "tests/data/cases/e04_llama3_base_untrained_chat_tokens/ckpt"
SLOTS = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]
EMB, HEAD = "model.embed_tokens.weight", "lm_head.weight"
# every id but 289..299 (tokens no kept token is merged from, nor a byte token) and the slack 306..319
KEEP = [i for i in range(306) if not 289 <= i <= 299]
KEEP2 = [i for i in range(len(KEEP)) if not 284 <= i <= 288]  # a second prune, in the first one's ids


def _ok(*cmd: str) -> None:
    r = run_cli(list(cmd))
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])


def _chain(src: Path, tmp: Path, steps: list[list[str]]) -> Path:
    """Run ``steps`` (each a command without its input and ``--out``), each on the previous output."""
    tmp.mkdir(parents=True, exist_ok=True)
    keep = tmp / "keep.txt"
    keep.write_text("\n".join(map(str, KEEP)))
    (tmp / "keep2.txt").write_text("\n".join(map(str, KEEP2)))
    cur = src
    for k, step in enumerate(steps):
        out = tmp / f"s{k}"
        args = [
            str(tmp / {"KEEP": "keep.txt", "KEEP2": "keep2.txt"}[a]) if a.startswith("KEEP") else a
            for a in step[1:]
        ]
        _ok(step[0], str(cur), *args, "--out", str(out), "-q")
        cur = out
    return cur


@pytest.fixture
def reserved(tmp_path) -> Path:
    """The sample with two reserved special tokens at ids 304, 305, rows zero (its report: add-tokens)."""
    out = tmp_path / "reserved"
    _ok("add-tokens", str(SAMPLE), *SLOTS, "--special", "--init", "zeros", "--out", str(out), "-q")
    return out


PRUNE = ["prune", "--keep-ids", "KEEP", "--keep-special"]
CHAINS = {
    "add-tokens,prune,resize": [
        ["add-tokens", "<zz>", "<yy>", "--seed", "0"],
        PRUNE,
        ["resize", "--vocab", "310"],
    ],
    "prune,tie-keep-embedding": [PRUNE, ["tie", "--keep", "embedding"]],
    "prune,convert": [PRUNE, ["convert", "--to", "paddlenlp"]],
    "prune,rename-tokens-trained-mean": [PRUNE, ["rename-tokens", "293=<think_x>", "--init", "trained-mean"]],
    "rename-tokens,prune,add-tokens": [["rename-tokens", "304=<think_x>"], PRUNE, ["add-tokens", "<qq>"]],
    "prune,prune": [PRUNE, ["prune", "--keep-ids", "KEEP2", "--keep-special"]],
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_with_a_prune_verifies(reserved, tmp_path, name):
    final = _chain(reserved, tmp_path, CHAINS[name])
    res = verify(reserved, final)
    assert res.exit_code == 0, res.unexplained
    assert any("pruned to the" in n for n in res.notes), res.notes
    assert res.identical >= 9  # the tensors no run touches were compared, bit for bit


def test_chain_of_two_prunes_keeps_the_composed_ids(reserved, tmp_path):
    """Two prunes: the second's keep-list read in the first's ids; the original ids reaching the output
    are the composition, and the embedding's rows are the original's at those ids, bit for bit."""
    final = _chain(reserved, tmp_path, CHAINS["prune,prune"])
    first = {o: n for n, o in enumerate(KEEP)}
    survivors = [o for o in KEEP if first[o] in set(KEEP2)]
    a, b = Checkpoint.open(reserved).load(EMB), Checkpoint.open(final).load(EMB)
    assert b.shape[0] == len(survivors) and np.array_equal(a[survivors], b)
    res = verify(reserved, final)
    assert res.exit_code == 0, res.unexplained
    assert any(f"pruned to the {len(survivors)} of its 320 ids" in n for n in res.notes), res.notes


@pytest.mark.parametrize(
    ("name", "tensor", "element"),
    [
        ("add-tokens,prune,resize", EMB, 5 * 16),  # row 5: an original token's row
        ("add-tokens,prune,resize", "model.layers.0.mlp.down_proj.weight", 0),
        ("prune,tie-keep-embedding", EMB, 290 * 16),  # row 290: the original's 301 after the prune
        ("prune,convert", "llama.embed_tokens.weight", 3),
    ],
)
def test_a_flipped_element_after_a_prune_is_named(reserved, tmp_path, name, tensor, element):
    final = _chain(reserved, tmp_path, CHAINS[name])
    _flip(final, tensor, element)
    res = verify(reserved, final)
    assert res.exit_code == 7
    assert any(tensor in u for u in res.unexplained), res.unexplained


def test_a_renamed_key_after_a_prune_is_named(reserved, tmp_path):
    final = _chain(reserved, tmp_path, CHAINS["prune,tie-keep-embedding"])
    _rename_key(final, "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weights")
    res = verify(reserved, final)
    assert res.exit_code == 7
    assert any("model.layers.0.mlp.up_proj.weight" in u for u in res.unexplained), res.unexplained


def test_a_forged_id_map_in_the_history_is_unverifiable(reserved, tmp_path):
    """The prune's id_map in the final report's history with two ids swapped (order broken): exit 7, the
    report named unverifiable; an id_map that keeps the order but names another id is caught by the rows."""
    final = _chain(reserved, tmp_path, CHAINS["prune,tie-keep-embedding"])
    p = final / "tietool-report.json"
    good = json.loads(p.read_text())
    rep = json.loads(p.read_text())
    m = next(e for e in rep["history"] if e["operation"] == "prune")["prune"]["id_map"]
    m["1"], m["2"] = m["2"], m["1"]
    p.write_text(json.dumps(rep))
    res = verify(reserved, final)
    assert res.exit_code == 7
    assert any("prune maps id 1 to 2" in u and "unverifiable" in u for u in res.unexplained), res.unexplained
    rep = json.loads(json.dumps(good))
    m = next(e for e in rep["history"] if e["operation"] == "prune")["prune"]["id_map"]
    m["289"] = m.pop("288")  # keeps 289 in 288's place: the rows from there on are not the original's
    p.write_text(json.dumps(rep))
    res = verify(reserved, final)
    assert res.exit_code == 7, res.unexplained


FIX_SUB = ["fix-untrained", "--init", "subtokens"]
RENAME_MEAN = ["rename-tokens", "305=<think_x>", "--init", "trained-mean"]
RENAME_AFTER = ["rename-tokens", "294=<think_x>", "--init", "trained-mean"]  # 305 after the prune
SET_PRUNE = {
    "rename-mean,prune": [["rename-tokens", "304=<think_x>", "--init", "trained-mean"], PRUNE],
    "fix,prune,resize": [["fix-untrained"], PRUNE, ["resize", "--vocab", "310", "--seed", "0"]],
    "fix-subtokens,rename-mean,prune": [FIX_SUB, RENAME_MEAN, PRUNE],
    "fix,prune,rename-mean": [
        ["fix-untrained"],
        PRUNE,
        ["rename-tokens", "294=<think_x>", "--init", "trained-mean"],
    ],
}
NEW_ID = {o: n for n, o in enumerate(KEEP)}  # 304 → 293, 305 → 294


@pytest.mark.parametrize("name", list(SET_PRUNE))
def test_rows_set_before_a_prune_verify(reserved, tmp_path, name):
    """Rows set from a mean (fix-untrained, rename-tokens --init trained-mean / subtokens) before a prune
    were computed from rows the prune dropped: verify recomputes them from the input (in a chain of two
    set-runs, the second on the first's rows; a set-run after the prune on the kept rows the first set) and
    finds each at its new id. The output's rows 293, 294 are the rows the set-runs wrote at 304, 305 (the
    last folder before the prune), bit for bit, but one a later rename set again."""
    steps = SET_PRUNE[name]
    final = _chain(reserved, tmp_path, steps)
    k = next(j for j, s in enumerate(steps) if s[0] == "prune")
    kept = [304] if name.endswith("rename-mean") else [304, 305]
    for t in (EMB, HEAD):
        before, after = Checkpoint.open(tmp_path / f"s{k - 1}").load(t), Checkpoint.open(final).load(t)
        assert np.array_equal(before[kept], after[[NEW_ID[i] for i in kept]])
        assert not np.array_equal(before[kept], Checkpoint.open(reserved).load(t)[kept])  # they were set
    res = verify(reserved, final)
    assert res.exit_code == 0, res.unexplained
    if name.endswith("resize"):  # the set rows in the common part of the resized tables
        assert {r["name"] for r in res.resized if r["common_part_identical"]} == {EMB, HEAD}, res.resized
    else:
        last = 293 if name == "rename-mean,prune" else 294
        assert {r["name"] for r in res.changed if r["why"].startswith(f"rows 293..{last} set")} == {EMB, HEAD}


@pytest.mark.parametrize("name", list(SET_PRUNE))
@pytest.mark.parametrize(("old", "tensor"), [(304, EMB), (305, HEAD)])
def test_a_flipped_set_row_kept_by_the_prune_is_named(reserved, tmp_path, name, old, tensor):
    final = _chain(reserved, tmp_path, SET_PRUNE[name])
    if name == "rename-mean,prune" and old == 305:
        old = 304  # the one row it set
    _flip(final, tensor, NEW_ID[old] * 16 + 7)
    res = verify(reserved, final)
    assert res.exit_code == 7
    assert any(tensor in u for u in res.unexplained), res.unexplained


def test_a_set_row_the_prune_dropped_is_gone(reserved, tmp_path):
    """fix-untrained sets 304 and 305; a prune that keeps 304 and drops 305: the one kept row checked."""
    keep = tmp_path / "keep305.txt"
    keep.write_text("\n".join(map(str, range(305))))
    final = _chain(reserved, tmp_path, [["fix-untrained"], ["prune", "--keep-ids", str(keep)]])
    assert Checkpoint.open(final).tensors[EMB].shape[0] == 305
    res = verify(reserved, final)
    assert res.exit_code == 0, res.unexplained
    (row,) = [c for c in res.changed if c["name"] == EMB]
    assert "row 304 " in row["why"] or "rows 304" in row["why"], row
    _flip(final, EMB, 304 * 16)
    assert verify(reserved, final).exit_code == 7


def test_rows_set_after_a_resize_before_a_prune_are_named(reserved, tmp_path):
    """resize (new random rows), fix-untrained (its mean over them), prune (dropping them): verify does not
    rebuild the rows the fix read: exit 7 naming why (each step verifies alone)."""
    steps = [["resize", "--vocab", "330", "--seed", "0"], ["fix-untrained"], PRUNE]
    final = _chain(reserved, tmp_path, steps)
    res = verify(reserved, final)
    assert res.exit_code == 7
    assert res.unexplained[0].startswith(
        "the output's report chain sets rows by fix-untrained before a prune (a resize before it)"
    ), res.unexplained
    assert verify(reserved, tmp_path / "s1").exit_code == 0
    assert verify(tmp_path / "s1", final).exit_code == 0


@pytest.mark.parametrize(
    "steps",
    [
        [["fix-untrained"], ["tie", "--keep", "embedding"]],
        [["fix-untrained"], ["resize", "--vocab", "300", "--seed", "0"]],
        [["tie", "--keep", "embedding"], ["fix-untrained"]],
    ],
    ids=["fix-untrained,tie", "fix-untrained,resize", "tie,fix-untrained"],
)
def test_fix_untrained_in_a_chain_verifies(tmp_path, steps):
    final = _chain(E04, tmp_path, steps)
    res = verify(E04, final)
    assert res.exit_code == 0, res.unexplained
    assert any("set as its report says" in c.get("why", "") for c in res.changed) or any(
        r["common_part_identical"] for r in res.resized
    )


def test_fix_untrained_rows_forged_in_a_chain_are_named(tmp_path):
    """fix-untrained then resize, row 266 (a fixed row) overwritten in the output: exit 7."""
    final = _chain(E04, tmp_path, [["fix-untrained"], ["resize", "--vocab", "300", "--seed", "0"]])
    _flip(final, EMB, 266 * 8)
    res = verify(E04, final)
    assert res.exit_code == 7
    assert any(EMB in u for u in res.unexplained), res.unexplained


WRITES = {
    "tie": ["tie", "--keep", "embedding"],
    "resize": ["resize", "--vocab", "330", "--seed", "0"],
    "add-tokens": ["add-tokens", "<qq>"],
    "convert": ["convert", "--to", "paddlenlp"],
    "prune": PRUNE,
    "fix-untrained": ["fix-untrained"],
    "rename-tokens": ["rename-tokens", "304=<think_x>"],
}
SECTIONS = {"prune": "prune", "fix-untrained": "fix_untrained", "rename-tokens": "rename_tokens"}


@pytest.mark.parametrize("op", list(WRITES))
def test_every_write_carries_the_history(reserved, tmp_path, op):
    """Each write of an add-tokens output, then a tie of that (an untie where it is tied): its report's
    history holds the add-tokens run (and the write's own run, with its section, in the next one's);
    verify of the original and the end exits 0."""
    out = _chain(reserved, tmp_path, [WRITES[op]])
    rep = json.loads((out / "tietool-report.json").read_text())
    assert [e["operation"] for e in rep["history"]] == ["add-tokens"]
    nxt = _chain(out, tmp_path / "next", [["untie"] if op == "tie" else ["tie", "--keep", "embedding"]])
    rep = json.loads((nxt / "tietool-report.json").read_text())
    assert [e["operation"] for e in rep["history"]] == ["add-tokens", op]
    if op in SECTIONS:
        assert isinstance(rep["history"][-1][SECTIONS[op]], dict)
    res = verify(reserved, nxt)
    assert res.exit_code == 0, res.unexplained
