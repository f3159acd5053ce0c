"""``verify INPUT FINAL`` after every pair of writes (tie, untie, resize grow / trim, add-tokens, prune,
fix-untrained, rename-tokens, convert) on two small inputs: each chain whose second write runs verifies
(exit 0), and one flipped element of the final embedding's row 0 (a row no write of the matrix sets) is
exit 7 naming it. A second write that is refused says why on one line and does not exit 7. Rows set from
a mean (fix-untrained, rename-tokens with a mean init) and then pruned are recomputed from the input, and
one flipped element of such a row the prune kept is exit 7 naming it (:data:`SET_THEN_PRUNE`).

Also, one by one: ``untie`` then ``resize`` of a T5 (one shared table; untie writes the head as the table
times ``d_model ** -0.5``), and the note verify gives for a head that ``tie --keep head`` dropped after a
resize (its values went into the embedding; none were discarded).

Inputs: ``sample_checkpoints/pf_llama_with_tokenizer`` (untied PaddleFormers Llama, 320 rows, a byte-level
BPE of 304 tokens) given two reserved special tokens at ids 304, 305 with zero rows (``add-tokens --init
zeros``: fix-untrained finds them untrained, rename-tokens renames them); ``tests/data/fixtures/cases/
pnlp_t5`` (PaddleNLP 2.8.1 T5, ``t5.shared.weight`` shared by encoder, decoder and the tied head; no
tokenizer, so the token writes are left out).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from support import paths
from support.resize_support import run_cli
from test_verify_writes import _flip

from tietool import verify
from tietool.surgery.inspect.detect import detect
from tietool.surgery.io.checkpoint import Checkpoint

REPO = paths.REPO
SAMPLE = REPO / "sample_checkpoints/pf_llama_with_tokenizer"
T5 = REPO / "tests/data/fixtures/cases/pnlp_t5"
SLOTS = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]


def _ops(rows: int, slot: int, keep: Path) -> dict[str, list[str]]:
    """Each write of the matrix (command and options, without input and ``--out``) on a folder of
    ``rows`` rows; a rename renames id ``slot``."""
    return {
        "tie-keep-head": ["tie", "--keep", "head"],
        "tie-keep-embedding": ["tie", "--keep", "embedding"],
        "untie": ["untie"],
        "grow": ["resize", "--vocab", str(rows + 16), "--seed", "0"],
        "trim": ["resize", "--vocab", str(rows - 8), "--force"],
        "add-tokens": ["add-tokens", "<zz>", "<yy>", "--seed", "0"],
        "prune": ["prune", "--keep-ids", str(keep), "--keep-special"],
        "fix": ["fix-untrained"],
        "fix-subtokens": ["fix-untrained", "--init", "subtokens"],
        "rename": ["rename-tokens", f"{slot}=<r_{slot}>"],
        "rename-mean": ["rename-tokens", f"{slot}=<m_{slot}>", "--init", "trained-mean"],
        "rename-subtokens": ["rename-tokens", f"{slot}=<s_{slot}>", "--init", "subtokens"],
        "convert-paddlenlp": ["convert", "--to", "paddlenlp"],
        "convert-safetensors": ["convert", "--to", "safetensors"],
    }


T5_OPS = ["tie-keep-head", "untie", "grow", "trim", "fix", "convert-safetensors"]
INPUTS = {"llama": (320, list(_ops(0, 0, Path()))), "t5": (128, T5_OPS)}


# rows set from the mean of rows a later prune dropped: the set rows (ids 304, 305 → 284, 285) recomputed
SET_THEN_PRUNE = {(a, "prune") for a in ("fix", "fix-subtokens", "rename-mean", "rename-subtokens")}


def _run(op: list[str], src: Path, out: Path):
    return run_cli([op[0], str(src), *op[1:], "--out", str(out), "-q"])


@pytest.fixture(scope="module")
def firsts(tmp_path_factory) -> dict[str, tuple[Path, dict[str, Path]]]:
    """Each input (the Llama sample with its two reserved slots) and each write's output on it."""
    tmp = tmp_path_factory.mktemp("pairs")
    keep = tmp / "keep.json"
    keep.write_text(json.dumps(list(range(280))))
    llama = tmp / "llama"
    r = _run(["add-tokens", *SLOTS, "--special", "--init", "zeros"], SAMPLE, llama)
    assert r.returncode == 0, r.stderr[-2000:]
    out = {}
    for name, src in (("llama", llama), ("t5", T5)):
        rows, names = INPUTS[name]
        made = {}
        for op in names:
            d = tmp / f"{name}-out" / op
            r = _run(_ops(rows, 304, keep)[op], src, d)
            if r.returncode == 0:
                made[op] = d
        out[name] = (src, made)
    return out


def _pairs():
    for name, (_, names) in INPUTS.items():
        for a, b in itertools.product(names, names):
            yield pytest.param(name, a, b, id=f"{name}:{a},{b}")


def _embedding(folder: Path) -> str:
    return detect(Checkpoint.open(folder), compare_values=False).embedding.name


@pytest.mark.parametrize(("name", "a", "b"), list(_pairs()))
def test_pair_verifies(firsts, tmp_path: Path, name: str, a: str, b: str) -> None:
    src, made = firsts[name]
    if a not in made:
        pytest.skip(f"{a} does not run on {name}")
    rows = INPUTS[name][0] + (16 if a == "grow" else -8 if a == "trim" else 0)
    keep = made[a].parent.parent / "keep.json"
    out = tmp_path / "out"
    r = _run(_ops(rows, 305, keep)[b], made[a], out)
    if r.returncode != 0:  # refused: one line saying why, never exit 7
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("tietool: error:")]
        assert r.returncode not in (7, None) and len(errors) == 1, r.stderr[-2000:]
        return
    res = verify(src, out)
    assert res.exit_code == 0, res.unexplained
    emb = _embedding(out)
    _flip(out, emb, element=1)
    forged = verify(src, out)
    assert forged.exit_code == 7
    assert any(emb in u for u in forged.unexplained), forged.unexplained
    if (a, b) in SET_THEN_PRUNE:  # and in a set row the prune kept: old id 304 (fixed or renamed), now 284
        _flip(out, emb, element=1)  # row 0 back
        assert verify(src, out).exit_code == 0
        hidden = Checkpoint.open(out).tensors[emb].shape[1]
        _flip(out, emb, element=284 * hidden + 3)
        forged = verify(src, out)
        assert forged.exit_code == 7
        assert any(emb in u for u in forged.unexplained), forged.unexplained


# ------------------------------------------------------------------ untie, then resize, of a T5


def _untied_resized(tmp: Path, vocab: int) -> Path:
    u, r = tmp / "u", tmp / "r"
    assert _run(["untie"], T5, u).returncode == 0
    assert _run(["resize", "--vocab", str(vocab), "--seed", "0"], u, r).returncode == 0
    return r


@pytest.mark.parametrize("vocab", [130, 136])
def test_t5_untie_then_resize_verifies(tmp_path: Path, vocab: int) -> None:
    """The head untie wrote is the shared table × 0.25 (d_model 16) in the entries both have, bit for bit
    (float32 product, as the writer rounds it); the resize's new columns are new."""
    import numpy as np

    out = _untied_resized(tmp_path, vocab)
    res = verify(T5, out)
    assert res.exit_code == 0, res.unexplained
    (head,) = res.added
    assert head["name"] == "lm_head.weight" and head["shape"] == [16, vocab]
    assert "× 0.25" in head["why"]
    emb = Checkpoint.open(T5).load("t5.shared.weight")
    got = Checkpoint.open(out).load("lm_head.weight")
    n = min(vocab, 128)
    assert np.array_equal(got[:, :n], (emb[:n] * np.float32(0.25)).T)


@pytest.mark.parametrize("element", [5, 16 * 130 - 140])  # column 5 of row 0; column 118 of the last row
def test_t5_untie_then_resize_forged_head_named(tmp_path: Path, element: int) -> None:
    out = _untied_resized(tmp_path, 130)
    _flip(out, "lm_head.weight", element=element)
    res = verify(T5, out)
    assert res.exit_code == 7
    assert any(u.startswith("lm_head.weight was added") for u in res.unexplained), res.unexplained


def test_t5_unscaled_head_is_unexplained(tmp_path: Path) -> None:
    """A head holding the shared table unscaled (logits 4× too large) is not what untie writes: exit 7."""
    import numpy as np

    out = _untied_resized(tmp_path, 130)
    ck = Checkpoint.open(out)
    t = ck.tensors["lm_head.weight"]
    head = np.array(ck.load("lm_head.weight"))
    head[:, :128] = Checkpoint.open(T5).load("t5.shared.weight").T
    data = bytearray((out / t.file).read_bytes())
    data[t.offset : t.offset + t.nbytes] = np.ascontiguousarray(head).tobytes()
    (out / t.file).write_bytes(bytes(data))
    res = verify(T5, out)
    assert res.exit_code == 7
    assert any(u.startswith("lm_head.weight was added") for u in res.unexplained), res.unexplained


# ------------------------------------------------------------------ the note after tie --keep head

PF = REPO / "tests/data/fixtures/cases/pf_llama_untied_fp32"


def _resized_then_tied(tmp: Path, keep: str) -> Path:
    g, t = tmp / "g", tmp / "t"
    assert _run(["resize", "--vocab", "130", "--seed", "0"], PF, g).returncode == 0
    assert _run(["tie", "--keep", keep], g, t).returncode == 0
    return t


def test_keep_head_after_resize_says_the_head_went_into_the_embedding(tmp_path: Path) -> None:
    out = _resized_then_tied(tmp_path, "head")
    res = verify(PF, out)
    assert res.exit_code == 0, res.unexplained
    (d,) = res.dropped
    assert d["name"] == "lm_head.weight" and not d["discarded_by_tie"]
    assert d["why"].startswith("its values went into the embedding model.embed_tokens.weight: tie ")
    assert not any("discard" in n for n in res.notes), res.notes
    r = run_cli(["verify", str(PF), str(out)])
    assert r.returncode == 0
    assert "dropped lm_head.weight [100, 16] (its values went into the embedding" in r.stdout
    assert "--keep embedding" not in r.stdout + r.stderr


def test_keep_embedding_after_resize_says_the_head_was_discarded(tmp_path: Path) -> None:
    out = _resized_then_tied(tmp_path, "embedding")
    res = verify(PF, out)
    assert res.exit_code == 0, res.unexplained
    (d,) = res.dropped
    assert d["discarded_by_tie"] and "why" not in d
    assert any("discards the head's" in n for n in res.notes), res.notes


def test_keep_head_after_resize_forged_embedding_named(tmp_path: Path) -> None:
    """One flipped bit in a common row of the embedding: it no longer holds the head's values."""
    out = _resized_then_tied(tmp_path, "head")
    _flip(out, "model.embed_tokens.weight", element=16 * 50 + 3)
    res = verify(PF, out)
    assert res.exit_code == 7
    assert any(u.startswith("model.embed_tokens.weight") for u in res.unexplained), res.unexplained
