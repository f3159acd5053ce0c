"""``verify`` recomputes the rows a ``resize`` or ``add-tokens`` run made, planning the run again on the
input from its report's fields (:mod:`tietool.surgery.verify.made`), and checks them bit for bit: a
sub-token row, the seeded ``mean`` draws of add-tokens (a report whose seed was changed no longer explains
them), the seeded new rows of a resize. In a chain of several runs a note says they were not recomputed.
Inputs: ``sample_checkpoints/pf_llama_with_tokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path

from support import paths

import tietool
from tietool import verify
from tietool.surgery.io.checkpoint import Checkpoint

REPO = paths.REPO
SAMPLES = REPO / "sample_checkpoints"


TOK = SAMPLES / "pf_llama_with_tokenizer"  # 304 tokens, 320 rows, untied fp32 [320, 16]


def _flip(folder: Path, name: str, element: int) -> None:
    """Flip one bit of one element of tensor ``name`` in its safetensors file."""
    t = Checkpoint.open(folder).tensors[name]
    p = folder / t.file
    data = bytearray(p.read_bytes())
    data[t.offset + element * (t.nbytes // t.numel) + 2] ^= 0x10
    p.write_bytes(bytes(data))


def test_subtoken_row_of_add_tokens_flipped_is_named(tmp_path):
    out = tmp_path / "a"
    tietool.add_tokens(TOK, ["<q1>"], out, special=True, seed=0)
    res = verify(TOK, out)
    assert res.exit_code == 0, res.unexplained
    assert (
        "the rows add-tokens (init subtokens, seed 0) made were recomputed from the input by its planner and "
        "match bit for bit: 1 in lm_head.weight, 1 in model.embed_tokens.weight"
    ) in res.notes
    _flip(out, "lm_head.weight", 304 * 16 + 3)
    res = verify(TOK, out)
    assert res.exit_code == 7
    assert res.unexplained == [
        "lm_head.weight: row 304 is not what the report's add-tokens (init subtokens, seed 0) makes of the "
        "input (recomputed by its planner, compared bit for bit)"
    ]


def test_seeded_mean_rows_of_add_tokens_are_recomputed(tmp_path):
    """``--init mean`` draws from N(mu, 1e-9 C) with the report's seed: recomputed, and a report whose seed
    was changed no longer explains the rows."""
    out = tmp_path / "a"
    tietool.add_tokens(TOK, ["<q1>", "<q2>"], out, init="mean", seed=3)
    assert verify(TOK, out).exit_code == 0
    p = out / "tietool-report.json"
    rep = json.loads(p.read_text())
    rep["add_tokens"]["seed"] = 4
    p.write_text(json.dumps(rep))
    res = verify(TOK, out)
    assert res.exit_code == 7
    assert {u.split(":")[0] for u in res.unexplained} == {"lm_head.weight", "model.embed_tokens.weight"}


def test_seeded_new_rows_of_resize_are_recomputed(tmp_path):
    out = tmp_path / "r"
    tietool.resize(TOK, 330, out, seed=0)
    res = verify(TOK, out)
    assert res.exit_code == 0, res.unexplained
    _flip(out, "model.embed_tokens.weight", 325 * 16)
    res = verify(TOK, out)
    assert res.unexplained == [
        "model.embed_tokens.weight: rows 320..329 are not what the report's resize (init mean, seed 0) makes "
        "of the input (recomputed by its planner, compared bit for bit)"
    ]


def test_rows_made_in_a_chain_are_said_not_recomputed(tmp_path):
    a, r = tmp_path / "a", tmp_path / "r"
    tietool.add_tokens(TOK, ["<q1>"], a, special=True, seed=0)
    tietool.resize(a, 336, r, seed=0)
    res = verify(TOK, r)
    assert res.exit_code == 0, res.unexplained
    assert (
        "the rows add-tokens and resize made are not recomputed in a chain of 2 runs (only their place and "
        "count are checked): verify each run on its own to check them bit for bit"
    ) in res.notes
