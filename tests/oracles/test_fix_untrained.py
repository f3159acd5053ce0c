"""``fix-untrained`` against unsloth's ``fix_untrained_tokens`` on the same matrices.

The oracle (:func:`unsloth_fix`) is unsloth's function reimplemented here in numpy from its source:
unsloth-zoo ``unsloth_zoo/tokenizer_utils.py`` ``fix_untrained_tokens`` (github.com/unslothai/unsloth-zoo,
read at commit 0802de02aa5137c2ead2e892d3d622737a0317ab; unsloth imports it from there): entries
``0..min(E rows, H rows)-1``; untrained = ``amax(E row) <= eps`` and (``amax(H row) <= eps``, or the H row,
as float32 rounded to 3 decimals, repeated among the E-untrained ids); the bos/eos/unk/sep/pad/cls/mask ids
removed; ``mean = (sum of all rows - sum of the untrained rows) / n_trained`` in float32, for E and H
apart, set into the untrained rows (its dataset-frequency scaling left out: tietool sees no training data).
A second, plainer computation (float64 mean of the rows not untrained, rounded to the stored dtype) must
equal the written rows bit for bit. Every other row, tensor and file stays bit-identical, and PaddleFormers
1.2 loads the output with the input's logits at every id that was not fixed.

Checkpoints: e04 (tests/data/cases: a Llama-3-style base written by PaddleFormers 1.2, untied, bf16, the
chat and reserved rows 264..269 all zero in the embedding and the head), variants of it, and the
PaddleFormers fixture pf_llama_tied_fp32 with rows zeroed by the test.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support import casecheck
from support.fixture_support import logits_mismatch
from support.hostile.history import copy_row
from support.paths import BUG_CASES_DIR, CASES_DIR
from support.resize_support import run_cli

E04 = BUG_CASES_DIR / "e04_llama3_base_untrained_chat_tokens" / "ckpt"
EMB, HEAD = "model.embed_tokens.weight", "lm_head.weight"
PEMB = "llama.embed_tokens.weight"  # PaddleNLP 2.8.1 Llama
SPECIAL = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def unsloth_fix(E: np.ndarray, H: np.ndarray, special: list[int], eps: float = 1e-16):
    """unsloth's ``fix_untrained_tokens`` on float32 matrices ``E``, ``H`` ``[vocab, hidden]`` (see the
    module docstring): ``(untrained ids, mean of E, mean of H)``."""
    n = min(E.shape[0], H.shape[0])
    E, H = E[:n], H[:n]
    u1 = E.max(axis=1) <= eps
    u2 = H.max(axis=1) <= eps
    where1 = np.flatnonzero(u1)
    bad = [np.round(H[i].astype(np.float32), 3).tobytes() for i in where1]
    repeated = {k for k, c in Counter(bad).items() if c >= 2}
    u2[[i for i, k in zip(where1, bad, strict=True) if k in repeated]] = True
    untrained = u1 & u2
    for i in special:
        if i < n:
            untrained[i] = False
    where = np.flatnonzero(untrained)
    n_trained = n - len(where)
    mean_e = (E.sum(axis=0, dtype=np.float32) - E[where].sum(axis=0, dtype=np.float32)) / n_trained
    mean_h = (H.sum(axis=0, dtype=np.float32) - H[where].sum(axis=0, dtype=np.float32)) / n_trained
    return [int(i) for i in where], mean_e, mean_h


def _special(folder: Path) -> list[int]:
    cfg = json.loads((folder / "config.json").read_text())
    return [cfg[f"{s}_token_id"] for s in SPECIAL if isinstance(cfg.get(f"{s}_token_id"), int)]


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bf16 bits, round to nearest even (independent of tietool's encoder)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def _set_rows(st: Path, name: str, rows: list[int], value: bytes | None = None) -> None:
    """Rows ``rows`` of tensor ``name`` in the safetensors file ``st`` set to zero bytes (or ``value``)."""
    data = bytearray(st.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    t = json.loads(data[8 : 8 + n])[name]
    begin, end = (8 + n + o for o in t["data_offsets"])
    size = (end - begin) // t["shape"][0]
    for r in rows:
        data[begin + r * size : begin + (r + 1) * size] = value or bytes(size)
    st.unlink()
    st.write_bytes(bytes(data))


def _run(ck: Path, out: Path, *extra: str):
    run = run_cli(["fix-untrained", str(ck), "--out", str(out), "-q", *extra])
    assert run.rc == 0, (run.stdout, run.stderr)
    return json.loads((out / "tietool-report.json").read_text())


def _check_against_oracle(ck: Path, out: Path, rep: dict) -> list[int]:
    """The report's ids are the oracle's; the written rows are its means (within float32 summation order
    and one rounding to the stored dtype) and equal the plain float64 mean bit for bit; every other row,
    tensor and file is bit-identical. Returns the ids."""
    a, b = casecheck.read_checkpoint(ck), casecheck.read_checkpoint(out)
    E, H = (a.decode(a.tensors[n]).astype(np.float32) for n in (EMB, HEAD))
    ids, mean_e, mean_h = unsloth_fix(E, H, _special(ck))
    assert ids and rep["fix_untrained"]["ids"] == ids
    for name, X, mean in ((EMB, E, mean_e), (HEAD, H, mean_h)):
        ta, tb = a.tensors[name], b.tensors[name]
        xa, xb = ta.byte_view(), tb.byte_view()
        keep = np.setdiff1d(np.arange(xa.shape[0]), ids)
        assert np.array_equal(xa[keep], xb[keep]), f"{name}: a row that was not fixed changed"
        got = b.decode(tb)[ids]
        np.testing.assert_allclose(got, np.broadcast_to(mean, got.shape), rtol=2**-8, atol=1e-30)
        trained = np.setdiff1d(np.arange(X.shape[0]), ids)
        plain = X[trained].astype(np.float64).mean(axis=0).astype(np.float32)
        want = _bf16(plain) if a.is_bf16(ta) else plain.astype(ta.storage)
        rows = xb[ids].reshape(len(ids), -1)
        assert (rows == np.frombuffer(want.tobytes(), np.uint8)).all(), name
        norm = float(np.linalg.norm(plain.astype(np.float64)))
        assert rep["fix_untrained"]["mean_norm"][name] == pytest.approx(norm, rel=1e-6)
    for name in set(a.tensors) - {EMB, HEAD}:
        assert a.tensors[name].raw == b.tensors[name].raw, name
    for f in ck.iterdir():  # the index is written again by the writer: the same JSON
        if f.name.endswith(".index.json"):
            assert json.loads((out / f.name).read_text()) == json.loads(f.read_text())
        elif not f.name.endswith(".safetensors"):
            assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    return ids


def test_e04_chat_and_reserved_rows_as_unsloth_sets_them(tmp_path):
    """e04: the ids unsloth finds (264..269: the reserved and chat tokens, all zero in both tables) are
    the ones set; each table gets its own trained mean; nothing else changes."""
    ck = shutil.copytree(E04, tmp_path / "ck")
    rep = _run(ck, tmp_path / "out")
    assert _check_against_oracle(ck, tmp_path / "out", rep) == [264, 265, 266, 267, 268, 269]
    tokens = {t["id"]: t["content"] for t in rep["fix_untrained"]["tokens"]}
    assert tokens[269] == "<|eot_id|>" and tokens[266] == "<|start_header_id|>"


def test_repeated_head_rows_count_as_untrained(tmp_path):
    """unsloth's second head test: rows 264 and 265 of the head hold the same non-zero row (trained row
    10 copied into both: Llama 3.1 ships its untrained head rows so) and are untrained; row 266's head row
    is a unique non-zero row (row 11) and is left alone. The oracle agrees."""
    ck = shutil.copytree(E04, tmp_path / "ck")
    st = ck / "model.safetensors"
    for dst in (264, 265):
        copy_row(st, HEAD, 10, dst)
    copy_row(st, HEAD, 11, 266)
    rep = _run(ck, tmp_path / "out")
    assert _check_against_oracle(ck, tmp_path / "out", rep) == [264, 265, 267, 268, 269]


def test_special_ids_are_kept_and_said(tmp_path):
    """e04 with config.json's eos_token_id pointing at the zero row 269 and pad_token_id at 268: both kept
    as they are (unsloth never fixes bos/eos/unk/sep/pad/cls/mask), the report and the notes say why (the
    pad row zero by design)."""
    ck = shutil.copytree(E04, tmp_path / "ck")
    cfg = json.loads((ck / "config.json").read_text())
    cfg.update(eos_token_id=269, pad_token_id=268)
    (ck / "config.json").write_text(json.dumps(cfg))
    rep = _run(ck, tmp_path / "out")
    assert _check_against_oracle(ck, tmp_path / "out", rep) == [264, 265, 266, 267]
    kept = {k["id"]: k["why"] for k in rep["fix_untrained"]["kept_special"]}
    assert set(kept) == {268, 269} and "zero by design" in kept[268]
    assert any("row 268" in n and "pad" in n for n in rep["notes"])


def test_ids_restrict_and_refuse_trained_rows(tmp_path):
    """``--ids`` sets only those rows (the mean still leaves out every untrained row); an id whose row is
    trained is refused (exit 2, naming it), nothing written."""
    ck = shutil.copytree(E04, tmp_path / "ck")
    rep = _run(ck, tmp_path / "out", "--ids", "266,269")
    assert rep["fix_untrained"]["ids"] == [266, 269]
    a, b = casecheck.read_checkpoint(ck), casecheck.read_checkpoint(tmp_path / "out")
    xa, xb = a.tensors[EMB].byte_view(), b.tensors[EMB].byte_view()
    assert np.array_equal(xa[[264, 265, 267, 268]], xb[[264, 265, 267, 268]])
    _run(ck, tmp_path / "all")  # the same mean as when every untrained row is set
    every = casecheck.read_checkpoint(tmp_path / "all").tensors[EMB].byte_view()
    assert np.array_equal(xb[[266, 269]], every[[266, 269]]) and xb[[266, 269]].any()
    run = run_cli(["fix-untrained", str(ck), "--ids", "262", "--out", str(tmp_path / "bad")])
    assert run.rc == 2 and "262" in run.stderr and "trained" in run.stderr
    assert not (tmp_path / "bad").exists()


def test_dry_run_and_in_place(tmp_path):
    """``--dry-run --json`` writes nothing and lists the ids; in place rewrites the folder (a backup kept)
    with the same bytes as ``--out``."""
    ck = shutil.copytree(E04, tmp_path / "ck")
    before = casecheck.snapshot_tree(ck)
    run = run_cli(["fix-untrained", str(ck), "--dry-run", "--json"])
    assert run.rc == 0 and json.loads(run.stdout)["fix_untrained"]["ids"] == [264, 265, 266, 267, 268, 269]
    assert casecheck.snapshot_tree(ck) == before
    _run(ck, tmp_path / "out")
    run = run_cli(["fix-untrained", str(ck), "-q"])
    assert run.rc == 0, run.stderr
    got = (ck / "model.safetensors").read_bytes()
    assert got == (tmp_path / "out" / "model.safetensors").read_bytes()
    assert list(tmp_path.glob("ck.tietool-backup-*"))


@pytest.fixture
def tied_zeroed(tmp_path) -> tuple[Path, list[int]]:
    """pf_llama_tied_fp32 (PaddleFormers 1.2, tied, the head stored too) with rows 0 (pad_token_id), 45,
    60 and 99 zeroed in the embedding and the head (they stay equal)."""
    ck = shutil.copytree(CASES_DIR / "pf_llama_tied_fp32", tmp_path / "tied")
    st = next(ck.glob("*.safetensors"))
    for name in (EMB, HEAD):
        _set_rows(st, name, [0, 45, 60, 99])
    return ck, [45, 60, 99]


def test_tied_one_mean_and_the_pad_row_kept(tied_zeroed, tmp_path):
    """A tied model: the embedding and the head stay equal (one mean), the pad row 0 stays zero."""
    ck, ids = tied_zeroed
    rep = _run(ck, tmp_path / "out")
    assert _check_against_oracle(ck, tmp_path / "out", rep) == ids
    b = casecheck.read_checkpoint(tmp_path / "out")
    assert b.tensors[EMB].raw == b.tensors[HEAD].raw
    assert not b.tensors[EMB].byte_view()[0].any()
    assert [k["id"] for k in rep["fix_untrained"]["kept_special"]] == [0]


@pytest.mark.slow
def test_output_loads_with_the_same_logits_at_other_ids(tied_zeroed, tmp_path, live_logits):
    """PaddleFormers 1.2 loads the output; its logits at every id not fixed equal the input's bit for bit
    (the batch holds none of the fixed ids: its hidden states are unchanged), and differ at the fixed
    ids (the head rows were zero: logit 0)."""
    ck, ids = tied_zeroed
    out = tmp_path / "out"
    _run(ck, out)
    want = live_logits.reference(ck, "LlamaForCausalLM").result()
    got = live_logits.submit(out, "LlamaForCausalLM").result()
    assert want["logits"] is not None and got["logits"] is not None, (want, got)
    keep = np.setdiff1d(np.arange(want["logits"].shape[-1]), ids)
    assert logits_mismatch(got["logits"][..., keep], want["logits"][..., keep]) is None
    assert not np.any(want["logits"][..., ids]) and np.all(got["logits"][..., ids] != 0)


def test_verify_explains_a_real_fix_and_doubts_forged_ones(tmp_path):
    """``verify`` explains the fix-untrained output (exit 0: the rows its report lists are untrained in
    the input by the rule and hold the trained mean); a report that also lists the trained row 262, or an
    output whose fixed row 266 holds another value (row 10's) than the mean, is unverifiable (exit 7)."""
    ck = shutil.copytree(E04, tmp_path / "ck")
    out = tmp_path / "out"
    _run(ck, out)
    run = run_cli(["verify", str(ck), str(out)])
    assert run.rc == 0 and "set as its report says" in run.stdout, run.stdout
    forged = shutil.copytree(out, tmp_path / "forged")
    p = forged / "tietool-report.json"
    rep = json.loads(p.read_text())
    rep["fix_untrained"]["ids"] = [262, *rep["fix_untrained"]["ids"]]
    p.write_text(json.dumps(rep))
    copy_row(forged / "model.safetensors", EMB, 264, 262)
    copy_row(forged / "model.safetensors", HEAD, 264, 262)
    run = run_cli(["verify", str(ck), str(forged)])
    assert run.rc == 7 and "262" in run.stdout and "unverifiable" in run.stdout, run.stdout
    tampered = shutil.copytree(out, tmp_path / "tampered")
    copy_row(tampered / "model.safetensors", EMB, 10, 266)
    run = run_cli(["verify", str(ck), str(tampered)])
    assert run.rc == 7 and "unverifiable" in run.stdout, run.stdout


def test_paddlenlp_hidden_vocab_head(tmp_path):
    """A PaddleNLP 2.8.1 Llama (``model_state.pdparams``, head ``[hidden, vocab]``) grown by ``resize
    --init zeros`` to 112 rows (rows and head columns 100..111 zero): fix-untrained sets the embedding rows
    and the head columns 100..111 as the oracle says (the head read as its transpose); every other entry and
    tensor bit-identical."""
    src = CASES_DIR / "pnlp_llama_untied"
    grown = tmp_path / "grown"
    run = run_cli(["resize", str(src), "--vocab", "112", "--init", "zeros", "--out", str(grown), "-q"])
    assert run.rc == 0, run.stderr
    out = tmp_path / "out"
    rep = _run(grown, out)
    a, b = casecheck.read_checkpoint(grown), casecheck.read_checkpoint(out)
    E, Ht = a.decode(a.tensors[PEMB]).astype(np.float32), a.decode(a.tensors[HEAD]).astype(np.float32)
    ids, mean_e, mean_h = unsloth_fix(E, np.ascontiguousarray(Ht.T), _special(grown))
    assert ids == list(range(100, 112)) and rep["fix_untrained"]["ids"] == ids
    got_e, got_h = b.decode(b.tensors[PEMB]).astype(np.float32), b.decode(b.tensors[HEAD]).astype(np.float32)
    # unsloth sums in float32: the same mean within its rounding (the values are ~1e-3, sums cancel)
    np.testing.assert_allclose(got_e[ids], np.broadcast_to(mean_e, got_e[ids].shape), rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(got_h[:, ids].T, np.broadcast_to(mean_h, got_h[:, ids].T.shape), atol=1e-8)
    for got, X in ((got_e[ids], E), (got_h[:, ids].T, Ht.T)):  # the float64 mean, bit for bit
        assert np.array_equal(
            got, np.broadcast_to(X[:100].astype(np.float64).mean(axis=0).astype(np.float32), got.shape)
        )
    assert np.array_equal(got_e[:100], E[:100]) and np.array_equal(got_h[:, :100], Ht[:, :100])
    for name in set(a.tensors) - {PEMB, HEAD}:
        assert a.tensors[name].raw == b.tensors[name].raw, name


@pytest.mark.pnlp
def test_paddlenlp_loads_the_output(tmp_path):
    """PaddleNLP 2.8.1 loads the fix-untrained output of the grown pnlp_llama_untied: its logits at every
    id not fixed equal the input's bit for bit, its head (the ``[hidden, vocab]`` parameter it multiplies
    with) holds the set columns."""
    from support import pnlp_support

    pnlp_support.require()
    grown = tmp_path / "grown"
    run = run_cli(
        ["resize", str(CASES_DIR / "pnlp_llama_untied"), "--vocab", "112", "--init", "zeros"]
        + ["--out", str(grown), "-q"]
    )
    assert run.rc == 0, run.stderr
    _run(grown, tmp_path / "out")
    jobs = [
        {"op": "load", "family": "llama", "dir": str(d), "npz": str(tmp_path / f"{d.name}.npz")}
        for d in (grown, tmp_path / "out")
    ]
    results = pnlp_support.run_jobs(jobs, tmp_path / "pnlp")
    assert all(r["ok"] for r in results), results
    a, b = (np.load(j["npz"]) for j in jobs)
    keep = np.arange(100)
    assert logits_mismatch(b["logits"][..., keep], a["logits"][..., keep]) is None
    assert not np.any(a["head"][:, 100:]) and np.all(b["head"][:, 100:] != 0)


def test_refuses_when_every_row_is_untrained(tmp_path):
    """b04's bf16 Qwen2 (16 rows, every value of each row negative: by unsloth's ``amax(row) <= 1e-16`` every
    row is untrained, so there is no trained row to take the mean of): exit 5 naming the embedding, nothing
    written, the input untouched (before: exit 70, ``ValueError: every entry is untrained``)."""
    src = BUG_CASES_DIR / "b04_qwen2_tied_no_head_bf16" / "ckpt"
    ck = casecheck.read_checkpoint(src)
    emb = ck.decode(ck.tensors["model.embed_tokens.weight"])
    assert (emb.max(axis=1) <= 1e-16).all()  # the premise: every row untrained by the rule
    snap = casecheck.snapshot_tree(src)
    for extra in ([], ["--dry-run"]):
        run = run_cli(["fix-untrained", str(src), "--out", str(tmp_path / "o"), *extra])
        assert run.rc == 5, run.stderr
        assert "model.embed_tokens.weight" in run.stderr and "every" in run.stderr, run.stderr
        assert not (tmp_path / "o").exists()
    assert casecheck.snapshot_tree(src) == snap


def test_subtokens_init_is_the_mean_of_the_split_rows(tmp_path):
    """``--init subtokens`` on e04: each fixed row is the float64 mean (float32, bf16 nearest even) of the
    input's rows of the ids ``tokenizers`` splits its text into with the untrained tokens taken out of
    ``tokenizer.json`` (recomputed here from the file); the embedding's and the head's apart; every other
    row bit-identical. The report says each row's init and source ids."""
    import tokenizers

    out = tmp_path / "o"
    rep = _run(E04, out, "--init", "subtokens")["fix_untrained"]
    ids = rep["ids"]
    tj = json.loads((E04 / "tokenizer.json").read_text(encoding="utf-8"))
    text = {a["id"]: a["content"] for a in tj["added_tokens"]}
    tj["added_tokens"] = [a for a in tj["added_tokens"] if a["id"] not in ids]
    tok = tokenizers.Tokenizer.from_str(json.dumps(tj))
    split = {i: tok.encode(text[i], add_special_tokens=False).ids for i in ids}
    assert all(split[i] and max(split[i]) < 262 for i in ids)
    assert {t["id"]: (t["init"], t["source_ids"]) for t in rep["tokens"]} == {
        i: ("subtokens", split[i]) for i in ids
    }
    a, b = casecheck.read_checkpoint(E04), casecheck.read_checkpoint(out)
    for name in (EMB, HEAD):
        X = a.decode(a.tensors[name]).astype(np.float32)
        xa, xb = a.tensors[name].byte_view(), b.tensors[name].byte_view()
        keep = np.setdiff1d(np.arange(xa.shape[0]), ids)
        assert np.array_equal(xa[keep], xb[keep])
        for i in ids:
            want = _bf16(X[split[i]].astype(np.float64).mean(axis=0).astype(np.float32))
            assert xb[i].tobytes() == want.tobytes(), (name, i)
    assert run_cli(["verify", str(E04), str(out)]).rc == 0


def test_subtokens_falls_back_to_the_trained_mean_without_a_tokenizer(tied_zeroed, tmp_path):
    """No tokenizer files to split with: ``--init subtokens`` gives every row the trained mean (the same
    bytes as ``--init trained-mean``), each token's report entry and a note saying why."""
    ck, ids = tied_zeroed
    rep = _run(ck, tmp_path / "sub", "--init", "subtokens")["fix_untrained"]
    _run(ck, tmp_path / "mean")
    assert [(t["id"], t["init"], t["source_ids"]) for t in rep["tokens"]] == [
        (i, "trained-mean", []) for i in ids
    ]
    assert all("no tokenizer.json or SentencePiece model" in t["fallback"] for t in rep["tokens"])
    a, b = (next((tmp_path / d).glob("*.safetensors")).read_bytes() for d in ("sub", "mean"))
    assert a == b
    run = run_cli(["fix-untrained", str(ck), "--init", "subtokens", "--dry-run"])
    assert run.rc == 0 and "the trained mean, not subtokens" in run.stdout + run.stderr
