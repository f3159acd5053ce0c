"""``verify ORIGINAL FINAL`` across two-step chains that end in ``tie --keep head``, ``tie --keep embedding``
or ``untie`` after a write that changed vocabulary rows (``resize`` growing or trimming, ``fix-untrained``):

* after a resize, ``tie --keep head`` makes the embedding the resized head: its entries in common with the
  input's head are the head's, bit for bit (as stored, or transposed from a PaddleNLP ``[hidden, vocab]``
  head);
* after a resize, ``tie --keep embedding`` on a PaddleNLP Llama keeps a ``[hidden, vocab]`` head equal to the
  resized embedding;
* after a resize of a tied PaddleFormers checkpoint (its duplicate head dropped, a safetensors tie entry
  written), ``untie`` keeps that entry;
* after fix-untrained, ``tie --keep head`` puts the head's fixed rows (the mean of the head's trained rows)
  in the embedding; before it, fix-untrained reads its rule on the one table the tie kept;
* a second fix-untrained that finds no untrained row leaves the first one's rows explained;
* a trim, then a grow: the rows from the fewest on are new in the output (a report chain whose rows do not
  follow run to run explains none of them);
* fix-untrained after a resize or add-tokens reads its rule and mean on the grown folder (the output with
  the rows it set taken back from the input);
* two runs that set rows (rename-tokens with each init after each, fix-untrained then a rename of one of
  the rows it set): each row checked against the run that set it last, on the folder that run read;
* add-tokens, then a resize trim of every token it added, on a PaddleNLP WordPiece tokenizer: the empty
  ``added_tokens.json`` and ``added_tokens_decoder`` it leaves list no token.

Right chains exit 0 with every tensor compared; one flipped element in the affected tensor is exit 7
naming it.

Inputs: ``sample_checkpoints/pnlp_llama_untied`` (PaddleNLP 2.8.1, ``[hidden, vocab]`` head),
``tests/data/fixtures/cases/pf_llama_untied_fp32`` (PaddleFormers 1.2, ``[vocab, hidden]`` head),
``tests/data/fixtures/cases/pnlp_llama_tied``, ``sample_checkpoints/pf_llama_tied_fp32`` (tied, duplicate
head), ``tests/data/cases/e04_llama3_base_untrained_chat_tokens`` (untrained rows 264..269),
``tests/data/cases/e09_special_flag_of_existing_tool_call`` (untied; row 82 of its head has no
entry above 1e-16, its embedding's has: untrained by unsloth's rule in the head alone).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import paths
from support.resize_support import run_cli
from test_verify_writes import _flip

from tietool import verify
from tietool.surgery.inspect import chunked
from tietool.surgery.io.checkpoint import Checkpoint

REPO = paths.REPO
FIX = REPO / "tests/data/fixtures/cases"
SAMPLES = REPO / "sample_checkpoints"
E04 = REPO / "tests/data/cases/e04_llama3_base_untrained_chat_tokens/ckpt"
E09 = REPO / "tests/data/cases/e09_special_flag_of_existing_tool_call/ckpt"
GROW = ["resize", "--vocab", "130", "--seed", "0"]
TRIM = ["resize", "--vocab", "60", "--force"]
KEEP_HEAD = ["tie", "--keep", "head"]
KEEP_EMB = ["tie", "--keep", "embedding"]


def _chain(src: Path, tmp: Path, steps: list[list[str]]) -> Path:
    """Run ``steps`` (each a command without its input and ``--out``), each on the previous output."""
    cur = src
    for k, step in enumerate(steps):
        out = tmp / f"s{k}"
        r = run_cli([step[0], str(cur), *step[1:], "--out", str(out), "-q"])
        assert r.returncode == 0, (step, r.stdout[-2000:], r.stderr[-2000:])
        cur = out
    return cur


# name: (input, steps, the tensor a forged element is flipped in, the flat element index flipped)
CHAINS = {
    "pnlp-resize-grow,tie-keep-head": (
        SAMPLES / "pnlp_llama_untied",
        [GROW, KEEP_HEAD],
        "llama.embed_tokens.weight",
        5,
    ),
    "pnlp-resize-trim,tie-keep-head": (
        SAMPLES / "pnlp_llama_untied",
        [TRIM, KEEP_HEAD],
        "llama.embed_tokens.weight",
        5,
    ),
    "pf-resize-grow,tie-keep-head": (
        FIX / "pf_llama_untied_fp32",
        [GROW, KEEP_HEAD],
        "model.embed_tokens.weight",
        5,
    ),
    "pf-resize-trim,tie-keep-head": (
        FIX / "pf_llama_untied_fp32",
        [TRIM, KEEP_HEAD],
        "model.embed_tokens.weight",
        5,
    ),
    "pnlp-resize-grow,tie-keep-embedding": (
        SAMPLES / "pnlp_llama_untied",
        [GROW, KEEP_EMB],
        "lm_head.weight",
        5,
    ),
    "pnlp-tied-resize-trim,tie-keep-head": (
        FIX / "pnlp_llama_tied",
        [TRIM, KEEP_HEAD],
        "llama.embed_tokens.weight",
        5,
    ),
    "pnlp-tied-resize-trim,tie-keep-embedding": (
        FIX / "pnlp_llama_tied",
        [TRIM, KEEP_EMB],
        "lm_head.weight",
        5,
    ),
    "pf-tied-resize-grow,untie": (
        SAMPLES / "pf_llama_tied_fp32",
        [GROW, ["untie"]],
        "lm_head.weight",
        5,
    ),
    "pf-tied-resize-trim,untie": (
        SAMPLES / "pf_llama_tied_fp32",
        [TRIM, ["untie"]],
        "lm_head.weight",
        5,
    ),
    # a trim, then a grow: the rows from the trim's 60 on are new in the output, though both ends hold 100
    "pnlp-resize-trim,resize-grow": (
        SAMPLES / "pnlp_llama_untied",
        [TRIM, ["resize", "--vocab", "130", "--seed", "1"]],
        "llama.embed_tokens.weight",
        5,
    ),
    "pf-resize-trim,resize-back": (
        FIX / "pf_llama_untied_fp32",
        [TRIM, ["resize", "--vocab", "100", "--seed", "1"]],
        "lm_head.weight",
        5,
    ),
    # hidden 8: element 264 * 8 + 1 is in the first fixed row
    "fix-untrained,tie-keep-head": (E04, [["fix-untrained"], KEEP_HEAD], "model.embed_tokens.weight", 2113),
    # a tie before the fix: its rule read the one table the tie kept (the head); id 82 untrained there
    "tie-keep-head,fix-untrained": (
        E09,
        [KEEP_HEAD, ["fix-untrained"]],
        "model.embed_tokens.weight",
        82 * 8 + 1,
    ),
    # a second fix-untrained that finds every row trained (sets none) leaves the first one's rows explained
    "fix-untrained,fix-untrained": (
        E04,
        [["fix-untrained"], ["fix-untrained"]],
        "model.embed_tokens.weight",
        2113,
    ),
    # fix-untrained last after a resize / add-tokens: its rule and mean read the grown folder's rows
    "resize-grow,fix-untrained": (
        E04,
        [["resize", "--vocab", "300", "--seed", "0"], ["fix-untrained"]],
        "model.embed_tokens.weight",
        2113,
    ),
    "add-tokens,fix-untrained": (
        E04,
        [["add-tokens", "<zz>", "<yy>", "--seed", "0"], ["fix-untrained"]],
        "lm_head.weight",
        2113,
    ),
    "fix-untrained-subtokens,tie-keep-head": (
        E04,
        [["fix-untrained", "--init", "subtokens"], KEEP_HEAD],
        "model.embed_tokens.weight",
        2113,
    ),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_verifies(tmp_path: Path, name: str) -> None:
    src, steps, _, _ = CHAINS[name]
    out = _chain(src, tmp_path, steps)
    res = verify(src, out)
    assert res.exit_code == 0, res.unexplained
    compared = res.identical + len(res.resized) + len(res.changed) + len(res.added)
    assert compared == len(Checkpoint.open(out).tensors)


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_forged_element_named(tmp_path: Path, name: str) -> None:
    """One flipped bit in the tensor the chain's last step set: exit 7 naming it."""
    src, steps, target, element = CHAINS[name]
    out = _chain(src, tmp_path, steps)
    _flip(out, target, element=element)
    res = verify(src, out)
    assert res.exit_code == 7
    assert any(u.startswith(target) or f" of {target} " in u for u in res.unexplained), res.unexplained


# ------------------------------------------------------------------ add-tokens, then a trim of all of them

# ERNIE 3 (PaddleNLP 2.8.1 WordPiece, vocab.txt): add-tokens writes the tokens into added_tokens.json and
# tokenizer_config.json's added_tokens_decoder; a trim of all of them leaves both lists empty
E01 = REPO / "tests/data/cases/e01_ernie3_wordpiece_lowercase_add_tokens/ckpt"
E01_EMB = "ernie.embeddings.word_embeddings.weight"


def _added_then_trimmed(tmp: Path) -> Path:
    out = _chain(
        E01, tmp, [["add-tokens", "<zz>", "<yy>", "--seed", "0"], ["resize", "--vocab", "24", "--force"]]
    )
    assert json.loads((out / "added_tokens.json").read_text()) == {}
    assert json.loads((out / "tokenizer_config.json").read_text())["added_tokens_decoder"] == {}
    assert not (E01 / "added_tokens.json").exists()
    return out


def test_add_tokens_then_trim_of_all_verifies(tmp_path: Path) -> None:
    out = _added_then_trimmed(tmp_path)
    res = verify(E01, out)
    assert res.exit_code == 0, res.unexplained
    assert res.identical == len(Checkpoint.open(out).tensors)


def test_add_tokens_then_trim_of_all_forged_element_named(tmp_path: Path) -> None:
    out = _added_then_trimmed(tmp_path)
    _flip(out, E01_EMB, element=7)
    res = verify(E01, out)
    assert res.exit_code == 7
    assert any(u.startswith(E01_EMB) for u in res.unexplained), res.unexplained


@pytest.mark.parametrize(
    ("rel", "key", "value"),
    [
        ("added_tokens.json", "<zz>", 24),
        ("tokenizer_config.json", "added_tokens_decoder", {"24": {"content": "<zz>", "special": False}}),
        ("tokenizer_config.json", "model_max_length", 7),
    ],
)
def test_add_tokens_then_trim_of_all_forged_trace_named(tmp_path: Path, rel: str, key: str, value) -> None:
    """A trace that still lists a token, or another key changed, is a difference: exit 7 naming the file."""
    out = _added_then_trimmed(tmp_path)
    p = out / rel
    data = json.loads(p.read_text())
    data[key] = value
    p.write_text(json.dumps(data))
    res = verify(E01, out)
    assert res.exit_code == 7
    assert any(u.startswith(rel) for u in res.unexplained), res.unexplained


# ------------------------------------------------------------------ two runs that rename slots or set rows

SAMPLE = SAMPLES / "pf_llama_with_tokenizer"  # untied Llama, hidden 16, a byte-level BPE of 304 tokens
SLOTS = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]
RENAMES = {
    "rename-trained-mean,rename": [
        ["rename-tokens", "304=<think_x>", "--init", "trained-mean"],
        ["rename-tokens", "305=<think_y>"],
    ],
    # a mean-setting run last after another that set other rows: its mean is over that run's output
    "rename-trained-mean,fix-untrained": [
        ["rename-tokens", "304=<think_x>", "--init", "trained-mean"],
        ["fix-untrained"],
    ],
    "rename-subtokens,fix-untrained": [
        ["rename-tokens", "305=<think_y>", "--init", "subtokens"],
        ["fix-untrained"],
    ],
    "rename,rename-trained-mean": [
        ["rename-tokens", "305=<think_y>"],
        ["rename-tokens", "304=<think_x>", "--init", "trained-mean"],
    ],
    # two runs that set rows, each with its own init: each run's rows checked as that run made them
    "rename-subtokens,rename-trained-mean": [
        ["rename-tokens", "304=<think_x>", "--init", "subtokens"],
        ["rename-tokens", "305=<think_y>", "--init", "trained-mean"],
    ],
    "rename-trained-mean,rename-subtokens": [
        ["rename-tokens", "304=<think_x>", "--init", "trained-mean"],
        ["rename-tokens", "305=<think_y>", "--init", "subtokens"],
    ],
    "rename-trained-mean,rename-trained-mean": [
        ["rename-tokens", "304=<think_x>", "--init", "trained-mean"],
        ["rename-tokens", "305=<think_y>", "--init", "trained-mean"],
    ],
    "rename-subtokens,rename-subtokens": [
        ["rename-tokens", "304=<think_x>", "--init", "subtokens"],
        ["rename-tokens", "305=<think_y>", "--init", "subtokens"],
    ],
    # fix-untrained sets both zero slots; the rename then sets one of them again, with another init
    "fix-untrained,rename-subtokens": [
        ["fix-untrained"],
        ["rename-tokens", "305=<think_y>", "--init", "subtokens"],
    ],
    "fix-untrained-subtokens,rename-trained-mean": [
        ["fix-untrained", "--init", "subtokens"],
        ["rename-tokens", "305=<think_y>", "--init", "trained-mean"],
    ],
}


def _reserved(tmp: Path) -> Path:
    """The sample with two reserved special tokens at ids 304, 305, rows zero (its report: add-tokens)."""
    out = tmp / "reserved"
    r = run_cli(["add-tokens", str(SAMPLE), *SLOTS, "--special", "--init", "zeros", "--out", str(out), "-q"])
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.mark.parametrize("name", list(RENAMES))
def test_two_renames_verify(tmp_path: Path, name: str) -> None:
    """Every rename-tokens run of the chain explains its slots, and each run's set rows are checked on the
    folder it read."""
    src = _reserved(tmp_path)
    out = _chain(src, tmp_path, RENAMES[name])
    res = verify(src, out)
    assert res.exit_code == 0, res.unexplained
    assert res.tokenizer is not None
    want = {304, 305} if name.count("rename") == 2 else {304} if "304" in str(RENAMES[name]) else {305}
    assert {r["id"] for r in res.tokenizer["renamed"]} == want


@pytest.mark.parametrize("name", list(RENAMES))
def test_two_renames_forged_element_named(tmp_path: Path, name: str) -> None:
    src = _reserved(tmp_path)
    out = _chain(src, tmp_path, RENAMES[name])
    _flip(out, "model.embed_tokens.weight", element=304 * 16 + 3)
    res = verify(src, out)
    assert res.exit_code == 7
    assert any("model.embed_tokens.weight" in u for u in res.unexplained), res.unexplained


@pytest.mark.parametrize("name", list(RENAMES))
def test_two_renames_forged_second_row_named(tmp_path: Path, name: str) -> None:
    """One flipped bit in row 305 of the head (set by one of the runs, or kept by both): exit 7."""
    src = _reserved(tmp_path)
    out = _chain(src, tmp_path, RENAMES[name])
    _flip(out, "lm_head.weight", element=305 * 16 + 7)
    res = verify(src, out)
    assert res.exit_code == 7
    assert any("lm_head.weight" in u for u in res.unexplained), res.unexplained


@pytest.mark.parametrize("name", [n for n in CHAINS if "tie-keep-head" in n and n.startswith("p")])
def test_tiny_chunks_give_the_same_verdict(tmp_path: Path, monkeypatch, name: str) -> None:
    """The common entries of a resized embedding and the input's head compared in chunks of one row
    (column blocks of a ``[hidden, vocab]`` head) give the verdict whole reads give, forged or not."""
    src, steps, target, element = CHAINS[name]
    out = _chain(src, tmp_path, steps)
    whole = verify(src, out).as_dict()
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 7)
    assert verify(src, out).as_dict() == whole
    _flip(out, target, element=element)
    assert verify(src, out).exit_code == 7


def test_trim_then_grow_with_broken_rows_chain_is_named(tmp_path: Path) -> None:
    """A history whose trim ends at other rows than the grow starts from explains no new row: exit 7."""
    src, steps, _, _ = CHAINS["pf-resize-trim,resize-back"]
    out = _chain(src, tmp_path, steps)
    p = out / "tietool-report.json"
    rep = json.loads(p.read_text())
    rep["history"][-1]["resize"]["rows_after"] = 10
    p.unlink()
    p.write_text(json.dumps(rep))
    res = verify(src, out)
    assert res.exit_code == 7
    assert any(u.startswith("model.embed_tokens.weight changed") for u in res.unexplained), res.unexplained
