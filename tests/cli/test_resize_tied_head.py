"""``tietool resize`` of a tied checkpoint that stores a redundant head (issue 10).

PaddleFormers 1.2 writes ``lm_head.weight`` even when ``tie_word_embeddings`` is true. Where the loader
re-ties a missing head, resize drops that head (as ``tie`` does) instead of resizing it, and the report
says why; ``verify`` explains the drop. Where the loader does not re-tie (PaddleNLP 2.8 Llama loads a
random head), the head stays and is resized with the embedding.

The tool runs as ``python -m tietool`` in a subprocess on a copy of its input; outputs are read with the
independent reader in ``support.casecheck`` (nothing here imports ``tietool``). The logits of the dropped-head
outputs are checked in ``test_resize.py`` (``test_logits_match_oracle``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import resize_support as rs
from support.fixture_support import read_pdparams_raw

TIED = ["pf_llama_tied_fp32", "pf_llama_tied_bf16", "pf_llama_tied_sharded"]
GROW = 12


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, rs.Run]:
    root = tmp_path_factory.mktemp("tied-head")
    out = {}
    for case in TIED:
        f = rs.Fixture(case)
        out[case] = rs.run_resize(f.src, root / case, ["--vocab", f.V + GROW, "--init", "zeros", "--json"])
    return out


@pytest.mark.parametrize("case", TIED)
def test_redundant_head_dropped_with_reason(runs, case):
    """The head is absent from the output (and from a sharded output's index); the report lists it as
    dropped with a reason, and a note says the loader rebuilds it from the resized embedding; the config
    stays tied; the embedding has the new rows."""
    f = rs.Fixture(case)
    run = runs[case].ok()
    out = run.ckpt()
    assert f.head not in out.tensors, f"{f.head} kept: {sorted(out.tensors)}"
    for idx in run.out.glob("*.index.json"):
        assert f.head not in json.loads(idx.read_text())["weight_map"], f"{f.head} still in {idx.name}"
    assert out.tensors[f.embedding].shape[0] == f.V + GROW
    rep = run.report()
    dropped = {d["name"]: d["reason"] for d in rep["dropped"]}
    assert set(dropped) == {f.head}, rep["dropped"]
    assert f.embedding in dropped[f.head] and "re-ties" in dropped[f.head], dropped
    notes = [n for n in rep["notes"] if f.head in n and "rebuilds it from the resized embedding" in n]
    assert notes, rep["notes"]
    assert run.config()["tie_word_embeddings"] is True
    assert [x["name"] for x in rep["resized"]] == [f.embedding]


def test_text_output_says_so(tmp_path):
    """Without --json the printed report names the dropped head and why."""
    f = rs.Fixture("pf_llama_tied_fp32")
    run = rs.run_resize(f.src, tmp_path / "w", ["--vocab", f.V + GROW, "--init", "zeros"]).ok()
    assert f.head in run.stdout and "rebuilds it from the resized embedding" in run.stdout, run.stdout


@pytest.mark.parametrize("case", TIED)
def test_verify_explains_the_drop(runs, case):
    """``verify`` exits 0: the dropped head equalled the input's embedding and the output is tied."""
    run = runs[case].ok()
    cp = rs.run_cli(["verify", str(run.inp), str(run.out)])
    assert cp.returncode == 0, cp.stdout + cp.stderr


def _tied_pnlp_llama_with_equal_head(dst: Path) -> Path:
    """The b16 PaddleNLP Llama case (head ``[hidden, vocab]`` equal to the embedding transposed) with
    ``tie_word_embeddings`` true: a tied checkpoint whose redundant head the PaddleNLP 2.8 loader needs."""
    src = rs.copy_checkpoint(rs.BUG_CASES_DIR / "b16_paddlenlp_head_hidden_vocab_equal" / "ckpt", dst)
    rs.edit_json(src / "config.json", lambda c: c.__setitem__("tie_word_embeddings", True))
    state = read_pdparams_raw(src / "model_state.pdparams")
    emb, head = state["llama.embed_tokens.weight"], state["lm_head.weight"]
    assert head.shape == emb.T.shape and np.array_equal(head, emb.T), "b16 no longer stores an equal head"
    return src


def test_head_kept_where_the_loader_does_not_retie(tmp_path):
    """PaddleNLP 2.8 Llama loads a random head when the file lacks it: resize keeps the tied head and
    resizes it (columns of ``[hidden, vocab]``), equal to the new embedding transposed, and drops nothing;
    verify exits 0."""
    src = _tied_pnlp_llama_with_equal_head(tmp_path / "src")
    run = rs.run_resize(
        src,
        tmp_path / "w",
        ["--vocab", 20, "--init", "mean", "--seed", 0, "--loader", "paddlenlp-2.8", "--json"],
    ).ok()
    rep = run.report()
    assert rep["dropped"] == [], rep["dropped"]
    state = read_pdparams_raw(run.out / "model_state.pdparams")
    emb, head = state["llama.embed_tokens.weight"], state["lm_head.weight"]
    assert emb.shape == (20, 8) and head.shape == (8, 20), (emb.shape, head.shape)
    assert np.array_equal(head, emb.T), "the kept head no longer equals the resized embedding"
    assert {x["name"] for x in rep["resized"]} == {"llama.embed_tokens.weight", "lm_head.weight"}
    cp = rs.run_cli(["verify", str(run.inp), str(run.out)])
    assert cp.returncode == 0, cp.stdout + cp.stderr
