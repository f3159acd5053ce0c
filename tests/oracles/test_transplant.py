"""``transplant``: the shipped sample ``pf_llama_with_tokenizer`` (PaddleFormers 1.2, untied, byte-level BPE,
304 tokens in 320 rows) given the real tokenizers of ``tests/data/tokenizers`` as donors, judged by the
libraries.

Recomputed here, independently of tietool: which donor token strings the old vocabulary has (``tokenizers``'
``get_vocab`` of the old ``tokenizer.json``; the donor's vocabulary from ``vocab.json``, ``sentencepiece``
or ``tokenizers``), each such row bit for bit in the embedding and the head; every other row as ``--init``
says, in numpy: ``subword`` the float64 mean (as float32) of the old rows of the ids the old
``tokenizers.Tokenizer`` gives the donor token's text (:func:`_donor_decode`), ``mean`` the mean of every
old row, ``zeros``. The output's tokenizer, loaded by transformers' and PaddleFormers' ``AutoTokenizer``,
encodes text to the donor's ids; PaddleFormers 1.2 loads the output and its logits on a batch of shared
tokens equal the input's at the mapped ids within 1e-5 (``slow``). ``verify`` explains every output (exit
0) and names a forged row and a forged report row (exit 7). Refusals: a tiktoken donor, a model without
tokenizer files, a donor that is not a folder, ``--init omp`` without a donor model; dry run and in place;
a tied model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import casecheck, paths, preload
from support import tokmodel_support as ts
from support.fixture_support import logits_mismatch
from support.paths import CASES_DIR
from support.resize_support import run_cli

REPO = paths.REPO
DATA = REPO / "tests" / "data"
TOK = DATA / "tokenizers"
SAMPLE = REPO / "sample_checkpoints" / "pf_llama_with_tokenizer"
PF_LOGITS = DATA / "tools" / "pf_logits.py"
LINES = [ln for ln in (TOK / "corpus.txt").read_text(encoding="utf-8").splitlines() if ln.strip()][:8]
EMB, HEAD = "model.embed_tokens.weight", "lm_head.weight"
DONORS = ("gpt2_bpe", "sp_bpe", "sp_bpe_with_json", "wordpiece")


def _arr(t) -> np.ndarray:
    """A float32 tensor of :func:`casecheck.read_checkpoint` as an array."""
    return np.frombuffer(t.raw, dtype=np.float32).reshape(t.shape)


def _old_tokenizer():
    import tokenizers

    return tokenizers.Tokenizer.from_file(str(SAMPLE / "tokenizer.json"))


def _donor_vocab(name: str) -> list[str]:
    """The donor's token at every id, read with the donor's own library / file format."""
    d = TOK / name
    by_id: dict[int, str] = {}
    if (d / "tokenizer.json").is_file():
        import tokenizers

        by_id = {
            i: s for s, i in tokenizers.Tokenizer.from_file(str(d / "tokenizer.json")).get_vocab().items()
        }
    elif (d / "tokenizer.model").is_file():
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
        by_id = {i: sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    elif (d / "vocab.json").is_file():
        by_id = {i: s for s, i in json.loads((d / "vocab.json").read_text(encoding="utf-8")).items()}
    else:
        lines = (d / "vocab.txt").read_text(encoding="utf-8").split("\n")
        by_id = dict(enumerate(lines[:-1] if lines[-1] == "" else lines))
    if (d / "added_tokens.json").is_file():
        by_id.update({i: s for s, i in json.loads((d / "added_tokens.json").read_text()).items()})
    return [by_id[i] for i in range(len(by_id))]


def _donor_decode(name: str):
    """``text(id)`` of a donor token, with the donor's own library: an added / special token its content;
    a SentencePiece piece (``sp_bpe``, ``sp_bpe_with_json``) with ``▁`` read as a space (mergekit's
    ``unnormalize_token``, ``mergekit/tokenizer/normalization.py``: a word-start piece is a leading space);
    any other token ``decode([id])``."""
    d = TOK / name
    added: dict[int, str] = {}
    if (d / "added_tokens.json").is_file():
        added = {i: s for s, i in json.loads((d / "added_tokens.json").read_text()).items()}
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    added.update({int(i): t["content"] for i, t in (cfg.get("added_tokens_decoder") or {}).items()})
    if (d / "tokenizer.model").is_file():
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
        return lambda i: added[i] if i in added else sp.id_to_piece(i).replace("\u2581", " ")
    import tokenizers

    if (d / "vocab.json").is_file():
        bpe = tokenizers.models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt"))
        tok = tokenizers.Tokenizer(bpe)
        tok.decoder = tokenizers.decoders.ByteLevel()
    else:
        tok = tokenizers.Tokenizer(tokenizers.models.WordPiece.from_file(str(d / "vocab.txt")))
        tok.decoder = tokenizers.decoders.WordPiece()
    return lambda i: added[i] if i in added else tok.decode([i], skip_special_tokens=False)


def _transplant(donor: str, out: Path, *extra: str) -> dict:
    run = run_cli(
        ["transplant", str(SAMPLE), "--tokenizer", str(TOK / donor), "--out", str(out), "--json", *extra]
    )
    assert run.rc == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[tuple[str, str], dict]:
    root = tmp_path_factory.mktemp("transplant")
    got = {}
    for donor in DONORS:
        for init in ("subword", "mean", "zeros"):
            out = root / f"{donor}-{init}"
            got[donor, init] = {"out": out, "report": _transplant(donor, out, "--init", init)}
    return got


def _expected(donor: str, init: str, table: np.ndarray) -> tuple[np.ndarray, dict[int, int]]:
    """The new table (float32, as the sample stores it) and ``{new id: old id}`` of the shared tokens."""
    old = _old_tokenizer()
    old_vocab = old.get_vocab(with_added_tokens=True)
    tokens, decode = _donor_vocab(donor), _donor_decode(donor)
    out = np.zeros((len(tokens), table.shape[1]), np.float32)
    kept: dict[int, int] = {}
    for j, s in enumerate(tokens):
        if s in old_vocab:
            kept[j] = old_vocab[s]
            out[j] = table[old_vocab[s]]
        elif init == "subword":
            ids = old.encode(decode(j), add_special_tokens=False).ids
            if ids:
                out[j] = table[ids].mean(axis=0, dtype=np.float64)
        elif init == "mean":
            out[j] = table.mean(axis=0, dtype=np.float64)
    return out, kept


@pytest.mark.parametrize("init", ["subword", "mean", "zeros"])
@pytest.mark.parametrize("donor", DONORS)
def test_rows_kept_bit_for_bit_and_made_as_numpy_makes_them(outputs, donor, init):
    """Embedding and head: each shared token's row is the old row bit for bit; every other row is the
    numpy recomputation of ``--init``; the other tensors are bit-identical; config sizes follow."""
    a, b = casecheck.read_checkpoint(SAMPLE), casecheck.read_checkpoint(outputs[donor, init]["out"])
    for n in (EMB, HEAD):
        want, kept = _expected(donor, init, _arr(a.tensors[n]))
        got = _arr(b.tensors[n])
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), n
        old = a.tensors[n].byte_view()
        assert all(np.array_equal(b.tensors[n].byte_view()[j], old[i]) for j, i in kept.items())
    assert kept, "the donor shares no token with the sample: the bit-exact claim would be vacuous"
    others = set(a.tensors) - {EMB, HEAD}
    assert others == set(b.tensors) - {EMB, HEAD} and all(
        a.tensors[n].raw == b.tensors[n].raw for n in others
    )
    cfg = json.loads((outputs[donor, init]["out"] / "config.json").read_text())
    assert cfg["vocab_size"] == len(_donor_vocab(donor))
    made = outputs[donor, init]["report"]["transplant"]["made"]
    assert {j: int(m.split()[1]) for j, m in enumerate(made) if m.startswith("kept ")} == kept
    assert all(m.split(" ")[0] == ("kept" if j in kept else init) for j, m in enumerate(made))
    assert outputs[donor, init]["report"]["transplant"]["tokens"] == _donor_vocab(donor)


def test_the_report_names_each_rows_subword_pieces(outputs):
    made = outputs["sp_bpe", "subword"]["report"]["transplant"]["made"]
    old, decode = _old_tokenizer(), _donor_decode("sp_bpe")
    sub = {j: [int(i) for i in m.split()[1:]] for j, m in enumerate(made) if m.startswith("subword")}
    assert len(sub) > 100
    assert all(ids == old.encode(decode(j), add_special_tokens=False).ids for j, ids in sub.items())


def test_the_output_tokenizer_is_the_donors(outputs, tmp_path):
    """transformers 5.3 and PaddleFormers 1.2 ``AutoTokenizer`` load each output as they load its donor
    (the same ids for the corpus lines); the old tokenizer.json is not left beside a donor without one;
    config token ids are the donor's (its roles), or null where it has none."""
    jobs = []
    for donor in ("gpt2_bpe", "sp_bpe_with_json"):
        for folder in (TOK / donor, outputs[donor, "subword"]["out"]):
            jobs.append({"folder": str(folder), "strings": LINES, "corpus": []})
    loads = ts.tokenizer_loads(jobs, tmp_path / "loads")
    for k in range(0, len(jobs), 2):
        for lib in ("hf", "pf"):
            want, got = loads[k][lib], loads[k + 1][lib]
            assert want["ok"] and got["ok"], (want.get("error"), got.get("error"))
            assert got["strings"] == want["strings"] and got["len"] == want["len"]
    gpt2 = outputs["gpt2_bpe", "subword"]["out"]
    assert not (gpt2 / "tokenizer.json").exists() and (gpt2 / "merges.txt").is_file()
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (gpt2 / f).read_bytes() == (TOK / "gpt2_bpe" / f).read_bytes()
    cfg = json.loads((gpt2 / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (0, 0, 300)
    cfg = json.loads((outputs["sp_bpe", "subword"]["out"] / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, None)


@pytest.mark.slow
def test_logits_of_shared_tokens_equal_the_inputs_at_the_mapped_ids(outputs, tmp_path):
    """PaddleFormers 1.2 loads the gpt2_bpe output (300 of its 301 tokens shared); its logits on a batch of
    shared tokens equal the input's logits on the same tokens' old ids, at the mapped columns, within 1e-5
    (verify --logits' bound). Not bit for bit: the rows are bit-exact (tested above) and so are the hidden
    states, but the head's matmul over 301 instead of 320 columns, each at another position, is tiled
    differently (measured: 46 of 4,800 values 1-2 ulp apart, max 3.6e-07)."""
    made = outputs["gpt2_bpe", "subword"]["report"]["transplant"]["made"]
    kept = {j: int(m.split()[1]) for j, m in enumerate(made) if m.startswith("kept ")}
    new = np.array([sorted(kept)[5:13], sorted(kept)[40:48]], dtype=np.int64)
    np.save(tmp_path / "new.npy", new)
    np.save(tmp_path / "old.npy", np.vectorize(kept.__getitem__)(new).astype(np.int64))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    got = {}
    for tag, ck in (("old", SAMPLE), ("new", outputs["gpt2_bpe", "subword"]["out"])):
        cp = preload.run(
            [
                sys.executable,
                str(PF_LOGITS),
                str(ck),
                "LlamaForCausalLM",
                str(tmp_path / f"{tag}.npy"),
                str(tmp_path / f"{tag}-l.npy"),
            ],
            libs=preload.PADDLEFORMERS,
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=900,
        )
        assert (tmp_path / f"{tag}-l.npy").is_file(), cp.stdout[-2000:] + cp.stderr[-2000:]
        got[tag] = np.load(tmp_path / f"{tag}-l.npy")
    cols = sorted(kept)
    assert got["new"].shape[-1] == len(made)
    assert logits_mismatch(got["new"][..., cols], got["old"][..., [kept[j] for j in cols]], atol=1e-5) is None


# ------------------------------------------------------------------------------------------------ verify


def _flip(folder: Path, name: str, element: int) -> None:
    """Flip the lowest bit of element ``element`` of tensor ``name`` in ``folder``'s safetensors file."""
    for f in sorted(folder.glob("*.safetensors")):
        raw = bytearray(f.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        head = json.loads(raw[8 : 8 + n])
        if name in head:
            raw[8 + n + head[name]["data_offsets"][0] + element * 4] ^= 1
            f.write_bytes(bytes(raw))
            return
    raise AssertionError(f"{name} not found in {folder}")


@pytest.mark.parametrize("init", ["subword", "mean", "zeros"])
@pytest.mark.parametrize("donor", DONORS)
def test_verify_explains_each_output(outputs, donor, init):
    run = run_cli(["verify", str(SAMPLE), str(outputs[donor, init]["out"]), "--json"])
    assert run.rc == 0, run.stdout + run.stderr
    res = json.loads(run.stdout)
    assert {r["name"] for r in res["resized"]} == {EMB, HEAD}
    assert res["identical_tensors"] == len(casecheck.read_checkpoint(SAMPLE).tensors) - 2


@pytest.mark.parametrize(("donor", "init", "j"), [("sp_bpe", "subword", None), ("gpt2_bpe", "mean", 300)])
def test_verify_names_a_forged_row(outputs, tmp_path, donor, init, j):
    """A bit flipped in a kept row, or in a made row, is exit 7 naming the tensor and the entry."""
    made = outputs[donor, init]["report"]["transplant"]["made"]
    j = j if j is not None else next(k for k, m in enumerate(made) if m.startswith("kept "))
    out = tmp_path / "forged"
    shutil.copytree(outputs[donor, init]["out"], out)
    _flip(out, HEAD, j * 16 + 3)
    run = run_cli(["verify", str(SAMPLE), str(out)])
    assert run.rc == 7 and f"{HEAD}: entry {j} is not what the report says" in run.stdout + run.stderr


def test_verify_names_a_forged_report_row(outputs, tmp_path):
    """A report row that claims a kept row from another old id is exit 7: the entry and the token string
    both contradict it."""
    out = tmp_path / "forged"
    shutil.copytree(outputs["gpt2_bpe", "subword"]["out"], out)
    rep = json.loads((out / "tietool-report.json").read_text())
    kind, old = rep["transplant"]["made"][5].split()
    rep["transplant"]["made"][5] = f"{kind} {int(old) + 1}"
    (out / "tietool-report.json").write_text(json.dumps(rep))
    run = run_cli(["verify", str(SAMPLE), str(out)])
    text = run.stdout + run.stderr
    assert run.rc == 7 and "entry 5 is not what the report says" in text and "id 5 keeps old id" in text


# ------------------------------------------------------------------------------------------------ edges


def test_refusals_leave_the_input_untouched(tmp_path):
    before = casecheck.snapshot_tree(SAMPLE)
    run = run_cli(
        ["transplant", str(SAMPLE), "--tokenizer", str(TOK / "tiktoken"), "--out", str(tmp_path / "o")]
    )
    assert run.rc == 5 and "the donor tokenizer cannot be read" in run.stderr and "tiktoken" in run.stderr
    run = run_cli(
        ["transplant", str(SAMPLE), "--tokenizer", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]
    )
    assert run.rc == 2 and "is not a folder" in run.stderr
    run = run_cli(["transplant", str(SAMPLE), "--tokenizer", str(TOK / "sp_bpe"), "--init", "omp"])
    assert run.rc == 2
    bare = CASES_DIR / "pf_llama_tied_fp32"  # no tokenizer files
    run = run_cli(["transplant", str(bare), "--tokenizer", str(TOK / "sp_bpe"), "--out", str(tmp_path / "o")])
    assert run.rc == 5 and "the model's tokenizer cannot be read" in run.stderr
    assert not (tmp_path / "o").exists() and casecheck.snapshot_tree(SAMPLE) == before


def test_dry_run_writes_nothing_and_in_place_rewrites(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(SAMPLE, work)
    before = casecheck.snapshot_tree(work)
    run = run_cli(["transplant", str(work), "--tokenizer", str(TOK / "sp_bpe"), "--dry-run", "--json"])
    assert run.rc == 0 and json.loads(run.stdout)["transplant"]["rows_after"] == 250
    assert casecheck.snapshot_tree(work) == before
    run = run_cli(["transplant", str(work), "--tokenizer", str(TOK / "sp_bpe")])
    assert run.rc == 0, run.stderr
    assert "250 donor tokens" in run.stdout + run.stderr
    assert not (work / "tokenizer.json").exists() and (work / "tokenizer.model").is_file()
    assert _arr(casecheck.read_checkpoint(work).tensors[EMB]).shape == (250, 16)


def test_tied_model_stays_tied(tmp_path):
    """pf_llama_tied_fp32 (tied, its head stored too, 100 rows, no tokenizer) resized to the sample's 320
    rows and given the sample's tokenizer, then a donor: the head still written equals the embedding, the
    model stays tied, and verify explains it."""
    work = tmp_path / "tied"
    run = run_cli(
        ["resize", str(CASES_DIR / "pf_llama_tied_fp32"), "--vocab", "320", "--seed", "0", "--out", str(work)]
    )
    assert run.rc == 0, run.stderr
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(SAMPLE / f, work / f)
    (work / "tietool-report.json").unlink()
    run = run_cli(
        ["transplant", str(work), "--tokenizer", str(TOK / "gpt2_bpe"), "--out", str(tmp_path / "o")]
    )
    assert run.rc == 0, run.stderr
    a, b = casecheck.read_checkpoint(work), casecheck.read_checkpoint(tmp_path / "o")
    want, _ = _expected("gpt2_bpe", "subword", _arr(a.tensors[EMB]))
    assert np.array_equal(_arr(b.tensors[EMB]).view(np.uint32), want.view(np.uint32))
    if HEAD in b.tensors:
        assert b.tensors[HEAD].raw == b.tensors[EMB].raw
    assert json.loads((tmp_path / "o" / "config.json").read_text())["tie_word_embeddings"] is True
    run = run_cli(["verify", str(work), str(tmp_path / "o")])
    assert run.rc == 0, run.stdout + run.stderr
