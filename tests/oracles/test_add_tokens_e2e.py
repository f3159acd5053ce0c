"""End-to-end oracles of ``tietool add-tokens`` (issue 20) on tiny PaddleFormers checkpoints written by the
library, each with a real trained tokenizer beside it (``tests/data/tokenizers``;
:mod:`support.tokmodel_support`).

Every run is ``tietool add-tokens IN TOKEN... --out OUT`` through the CLI (in process). Judged, each against
an oracle computed here:

* rows: every old row / column (ids outside the new ids) bit-identical to the input's, in every vocabulary
  tensor (embedding, head in its layout, bias, MTP copies); the new rows as the init says, computed with numpy
  from the input's files (``subtokens``: the mean of the rows of the ids the *input's* tokenizer splits the
  string into, by its own library: :func:`_split`; ``zeros``; ``copy:TOKEN``: that token's row; ``mean``: HF
  ``mean_resizing``, whose draw has covariance 1e-9 x the rows', i.e. the mean of the old rows);
  ``len(tokenizer) <= rows``; config ``vocab_size`` = rows;
* (slow) HF transformers 5.x and PaddleFormers 1.2 ``AutoTokenizer.from_pretrained(out)`` encode every new
  string to exactly its new id, the shipped corpus tokenizes as before, ``len`` = the old length + new tokens;
  (slow, pnlp) so do PaddleNLP 2.8.1's own tokenizers on every output whose input they read (one process);
* (slow) the output loads in PaddleFormers ``from_pretrained`` and its logits on the old ids equal the
  input's (both computed in this run).

Edge cases of the issue: a token already present; a prefix of another new token; a batch larger than the
slack; slack exactly used up; ``--pad-to-multiple-of`` with ``tensor_parallel_degree`` in config; bf16; a
``[hidden, vocab]`` head (the PaddleNLP fixture); a head bias; DeepSeek-V3 MTP tables; tokenizer.json and
tokenizer.model together; a folder with no tokenizer file (refused).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import casecheck, pnlp_support
from support import family_builder as fb
from support import fixture_support as fs
from support import resize_support as rs
from support import tokmodel_support as ts

if importlib.util.find_spec("tietool.surgery.plan.add_tokens") is None:
    pytest.skip(
        "add-tokens (surgery/plan/add_tokens.py, helper addplan) is not merged yet", allow_module_level=True
    )
if ts.tokenizer_dir("bytelevel_bpe") is None:
    pytest.skip("tests/data/tokenizers (helper tokedit) is not merged yet", allow_module_level=True)

V = ts.TokVariant
TIED = V("llama", "tied", "safetensors", "float32", "bytelevel_bpe")
SLACK = V("llama", "untied", "safetensors", "float32", "bytelevel_bpe", slack=5)
BF16 = V("llama", "tied", "safetensors", "bfloat16", "sp_bpe_with_json", slack=3)
LEGACY = V("llama", "untied", "pdparams", "float32", "sp_unigram")
BIAS = V("llama", "untied", "safetensors", "float32", "bytelevel_bpe", slack=2, bias=True)
MTP = V("deepseek_v3", "untied", "safetensors", "float32", "bytelevel_bpe")
WORDPIECE = V("llama", "tied", "safetensors", "float32", "wordpiece", slack=4)
GPT2 = V("llama", "untied", "safetensors", "float32", "gpt2_bpe")
TP = V("llama", "tied", "safetensors", "float32", "bytelevel_bpe", tp=3)
VARIANTS = [TIED, SLACK, BF16, LEGACY, BIAS, MTP, WORDPIECE, GPT2, TP]

CHAT = ["<tool_call>", "</tool_call>", "<|im_sep|>"]  # special, none in any trained tokenizer
WORDS = ["tietoolery", "Paddleformers", "vocabularies"]  # ordinary words, split by every tokenizer
SEVEN = ["<a1>", "<a2>", "<a3>", "<a4>", "<a5>", "<a6>", "<a7>"]


@dataclasses.dataclass(frozen=True)
class Case:
    """One ``add-tokens`` run: the input, the strings, the options, and whether PaddleFormers loads it."""

    key: str
    src: str  # a variant's name, or "pnlp_llama_untied" (the [hidden, vocab] fixture with a tokenizer)
    tokens: tuple[str, ...]
    extra: tuple[str, ...] = ()
    load: bool = True


def _case(key, variant, tokens, *extra, load=True) -> Case:
    name = variant if isinstance(variant, str) else variant.name
    return Case(key, name, tuple(tokens), tuple(map(str, extra)), load)


CASES = [
    _case("tied-special", TIED, CHAT, "--special"),
    _case("tied-mean", TIED, WORDS, "--init", "mean", "--seed", 1),
    _case("tied-present", TIED, ["<|im_start|>", "<think2>", "<think>"], "--special"),  # 2 added ones there
    _case("tied-present-base", TIED, ["a", "<think3>"]),  # a base-vocabulary token there
    _case("slack-larger", SLACK, SEVEN, "--special"),  # 7 > 5 slack rows
    _case("slack-exact", SLACK, SEVEN[:5], "--special", "--init", "zeros"),  # slack used up
    _case("slack-prefix", SLACK, ["<tool", "<tool_call>"], "--special", "--init", "copy:<|endoftext|>"),
    _case("bf16-both-files", BF16, CHAT, "--special"),
    _case("bf16-words", BF16, WORDS),
    _case("legacy-words", LEGACY, WORDS),
    _case("legacy-trained-mean", LEGACY, CHAT, "--special", "--init", "trained-mean", "--seed", 3),
    _case("bias", BIAS, WORDS + CHAT, "--pad-to-multiple-of", 8),
    _case("mtp", MTP, CHAT, "--special"),
    _case("wordpiece", WORDPIECE, WORDS),
    _case("gpt2", GPT2, CHAT, "--special"),
    _case(
        "hidden-vocab", "pnlp_llama_untied", WORDS, load=False
    ),  # PaddleNLP's layout: no PaddleFormers load
]
BY_KEY = {c.key: c for c in CASES}


# ---------------------------------------------------------------------------------------------- fixtures
def _small_tokenizer(dst: Path) -> Path:
    """A BPE tokenizer of at most 90 tokens (the PaddleNLP fixture has 100 rows), trained here with
    ``tokenizers`` on the ASCII lines of the shipped corpus and saved by transformers' ``save_pretrained``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    lines = [ln for ln in ts.corpus_lines() if ln.isascii()]
    trainer = trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(dst))
    return dst


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict[str, dict]:
    """Every variant built once (one subprocess), and the PaddleNLP ``[hidden, vocab]`` fixture with a small
    tokenizer; name -> entry (``path``, ``rows``, ``tokens``)."""
    root = tmp_path_factory.mktemp("tokmodel")
    out = {v.name: e for v, e in ts.build(VARIANTS, root / "built").items()}
    pn = fs.copy_checkpoint(rs.CASES_DIR / "pnlp_llama_untied", root / "pnlp_llama_untied")
    tok = _small_tokenizer(root / "small_tok")
    for f in tok.iterdir():
        shutil.copy2(f, pn / f.name)
    n = len(ts.hf_tokenizer(pn))
    out["pnlp_llama_untied"] = {"ok": True, "error": None, "path": pn, "rows": 100, "tokens": n}
    return out


@dataclasses.dataclass
class Result:
    case: Case
    run: rs.Run
    entry: dict  # the input's built entry
    before: list[list[int]]  # the split of each string by the input's tokenizer (:func:`_split`)


def _split(folder: Path, s: str) -> list[int]:
    """The ids the folder's tokenizer splits ``s`` into, by the library of its own format: ``tokenizers`` on
    tokenizer.json, ``sentencepiece`` on a lone tokenizer.model (HF transformers 5 converts a unigram model
    to ``tokenizers``' Unigram, which segments some words differently: "tietoolery" in sp_unigram), HF
    transformers on vocab.txt / vocab.json + merges.txt; special tokens not added."""
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return list(
            Tokenizer.from_file(str(folder / "tokenizer.json")).encode(s, add_special_tokens=False).ids
        )
    if (folder / "tokenizer.model").is_file():
        import sentencepiece

        return list(
            sentencepiece.SentencePieceProcessor(model_file=str(folder / "tokenizer.model")).encode(s)
        )
    return list(ts.hf_tokenizer(folder).encode(s, add_special_tokens=False))


@pytest.fixture(scope="session")
def results(built, tmp_path_factory) -> dict[str, Result]:
    root = tmp_path_factory.mktemp("add-tokens")
    out = {}
    for c in CASES:
        e = built[c.src]
        assert e["ok"], f"{c.src} was not built: {e['error']}"
        work = root / c.key
        work.mkdir()
        inp = fs.copy_checkpoint(e["path"], work / "in")
        before = [_split(inp, s) for s in c.tokens]
        run = rs.run_on(inp, work / "out", "add-tokens", [*c.tokens, *c.extra])
        out[c.key] = Result(c, run, e, before)
    return out


def _vocab_of(tok_folder: Path) -> dict[str, int]:
    return ts.hf_tokenizer(tok_folder).get_vocab()


def expected_ids(r: Result) -> dict[str, int]:
    """Each string's id as the issue says: the id it has as one token, else the next one from the
    tokenizer's length, in the order given (computed from the input's tokenizer)."""
    vocab = _vocab_of(r.run.inp)
    nxt, ids = r.entry["tokens"], {}
    for s in r.case.tokens:
        if s in vocab:
            ids[s] = vocab[s]
        elif s not in ids:
            ids[s], nxt = nxt, nxt + 1
    return ids


# ---------------------------------------------------------------------------------------------- helpers
def _roles(ck: casecheck.Checkpoint) -> list[tuple[str, int]]:
    """(name, vocabulary axis) of every vocabulary tensor stored: the embedding, the head (its axis by its
    shape against config.json's hidden_size; no test model is square), the bias, the MTP copies."""
    hidden = json.loads((Path(ck.folder) / "config.json").read_text())["hidden_size"]
    out = []
    for n, t in ck.tensors.items():
        if n.endswith(("embed_tokens.weight", "lm_head.weight", "shared_head.head.weight")):
            out.append((n, 0 if t.shape[1] == hidden or "embed" in n else 1))
        elif n == "lm_head.bias":
            out.append((n, len(t.shape) - 1))
    return out


def _kept_roles(ck_in: casecheck.Checkpoint, ck: casecheck.Checkpoint) -> list[tuple[str, int]]:
    """The input's vocabulary tensors the output must hold: all but a redundant tied head (config tied, head
    byte-equal to the embedding), which tietool drops as resize does (the loader re-ties it: the logits
    test loads it)."""
    out = []
    for n, axis in _roles(ck_in):
        redundant = (
            n == "lm_head.weight"
            and (ck.config or {}).get("tie_word_embeddings") is True
            and ck_in.tensors[n].raw == ck_in.tensors["model.embed_tokens.weight"].raw
        )
        if not (redundant and n not in ck.tensors):
            out.append((n, axis))
    return out


def _rows(ck: casecheck.Checkpoint, name: str, axis: int) -> np.ndarray:
    return rs.decoded_rows(ck, ck.tensors[name], axis)


def _cast(x: np.ndarray, label: str) -> np.ndarray:
    """float64 values as the tensor's dtype stores them (bf16: round to nearest even), back in float64."""
    if label in ("BF16", "bfloat16"):
        return rs.bf16_to_f32(rs.f32_to_bf16_rne(x.astype(np.float32))).astype(np.float64)
    return x.astype(np.float32).astype(np.float64)


def _new_ids(r: Result) -> list[int]:
    ids = expected_ids(r)
    return sorted(i for i in set(ids.values()) if i >= r.entry["tokens"])


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("key", [c.key for c in CASES])
def test_rows_shape_and_config(results, key):
    """Rows = the old rows where the slack suffices, else the new length (rounded up to
    ``--pad-to-multiple-of``); never fewer; config vocab_size follows; len(tokenizer) <= rows."""
    r = results[key]
    run = r.run.ok()
    L_before, R = r.entry["tokens"], r.entry["rows"]
    L_after = L_before + len(_new_ids(r))
    want = max(R, L_after)
    if "--pad-to-multiple-of" in r.case.extra and want > R:
        m = int(r.case.extra[r.case.extra.index("--pad-to-multiple-of") + 1])
        want = -(-want // m) * m
    ck = run.ckpt()
    for n, axis in _roles(ck):
        assert ck.tensors[n].shape[axis] == want, (
            f"{n} {ck.tensors[n].shape}: expected {want} vocabulary rows"
        )
    assert run.config()["vocab_size"] == want
    assert len(ts.hf_tokenizer(run.out)) == L_after <= want


@pytest.mark.parametrize("key", [c.key for c in CASES])
def test_old_rows_bit_identical(results, key):
    """Every row (column of a [hidden, vocab] head, entry of a bias) outside the new ids keeps its bytes;
    every tensor that carries no vocabulary keeps its bytes."""
    r = results[key]
    ck_in, ck = rs.read(r.run.inp), r.run.ckpt()
    new = set(_new_ids(r))
    vocab = dict(_roles(ck_in))
    for n, axis in _kept_roles(ck_in, ck):
        assert n in ck.tensors, f"{n} missing from the output"
        a, b = rs.vocab_major(ck_in.tensors[n], axis), rs.vocab_major(ck.tensors[n], axis)
        keep = [i for i in range(a.shape[0]) if i not in new]
        assert ck.tensors[n].label == ck_in.tensors[n].label, f"{n}: dtype changed"
        assert np.array_equal(a[keep], b[keep]), f"{n}: old rows changed"
    for n, t in ck_in.tensors.items():
        if n not in vocab:
            assert ck.tensors[n].raw == t.raw, f"{n} (no vocabulary axis) changed"


def _init_of(case: Case) -> str:
    return case.extra[case.extra.index("--init") + 1] if "--init" in case.extra else "subtokens"


@pytest.mark.parametrize("key", [c.key for c in CASES])
def test_new_rows_as_init_says(results, key):
    """The new rows of every vocabulary tensor, computed here from the input's files: subtokens = the mean
    of the rows the input's tokenizer splits the string into (head on its own rows, bias on its entries);
    zeros; copy:TOKEN = that token's row; mean / trained-mean = the mean of the old (trained) rows within
    the tiny spread of HF's mean_resizing draw. A table that is a copy of the embedding stays a copy."""
    r = results[key]
    ck_in, ck = rs.read(r.run.inp), r.run.ckpt()
    ids, init = expected_ids(r), _init_of(r.case)
    L = r.entry["tokens"]
    for n, axis in _kept_roles(ck_in, ck):
        old, got = _rows(ck_in, n, axis), _rows(ck, n, axis)
        label = ck.tensors[n].label
        for s, want_ids in zip(r.case.tokens, r.before, strict=True):
            i = ids[s]
            if i < L:
                continue  # already present: its row is judged by test_old_rows_bit_identical
            if init == "subtokens":
                want = _cast(old[want_ids].mean(axis=0), label)
            elif init == "zeros":
                want = np.zeros_like(got[i])
            elif init.startswith("copy:"):
                want = old[_vocab_of(r.run.inp)[init[5:]]]
            else:  # mean, trained-mean: HF mean_resizing's draw is the mean within 1e-9 x covariance
                base = old[:L]
                if init == "trained-mean":  # unsloth's rule; here it drops the pad row PF leaves zero
                    base = base[np.any(base != 0, axis=-1)] if base.ndim > 1 else base
                # HF mean_resizing draws N(mean, 1e-9 x covariance): within 6 sigma of the mean per value
                want, sigma = base.mean(axis=0), np.sqrt(1e-9) * base.std(axis=0)
                tol = 6 * sigma + 1e-12 + (2.0**-7 * np.abs(want) if "BF" in label else 0)
                assert np.all(np.abs(got[i] - want) <= tol), f"{n} row {i} ({s!r}, {init}) is not the mean"
                continue
            tol = 2.0**-7 * np.abs(want).max() + 1e-30 if label in ("BF16", "bfloat16") else 1e-6
            assert np.allclose(got[i], want, rtol=0, atol=tol), (
                f"{n} row {i} ({s!r}, {init} of {want_ids}): max |delta| {np.abs(got[i] - want).max():.3g}"
            )


def test_mtp_copies_stay_copies(results):
    """DeepSeek-V3's MTP embedding and head (copies of the main ones) are still copies after the edit."""
    ck = results["mtp"].run.ckpt()
    pairs = [(n, m) for n in ck.tensors for m in ("model.embed_tokens.weight", "lm_head.weight")]
    pairs = [(n, m) for n, m in pairs if n.startswith("model.layers.2.") and n.rsplit(".", 2)[-2] in m]
    assert pairs, f"no MTP copies in {ck.names_summary()}"
    for n, m in pairs:
        assert ck.tensors[n].raw == ck.tensors[m].raw, f"{n} is no longer a copy of {m}"


def test_already_present_reported(results):
    """A string the tokenizer has as one token gets no new id: the report lists it with its id."""
    for key, present in (("tied-present", ["<|im_start|>", "<think>"]), ("tied-present-base", ["a"])):
        r = results[key]
        tokens = {t["content"]: t for t in r.run.report()["add_tokens"]["tokens"]}
        vocab = _vocab_of(r.run.inp)
        for s in present:
            assert tokens[s]["existed"] is True and tokens[s]["id"] == vocab[s], f"{key}: {s!r} {tokens[s]}"
        assert len(_new_ids(r)) == 1, f"{key}: one new token expected"


def test_tp_degree_pad(built, tmp_path):
    """``--pad-to-multiple-of 8`` with ``tensor_parallel_degree`` 3 in config.json: the rows a multiple of 24
    (8 and 3), or refused exactly as the folder is for every command (config tp > 1 reads as rank files),
    with nothing written."""
    e = built[TP.name]
    inp = fs.copy_checkpoint(e["path"], tmp_path / "in")
    inspect = rs.run_cli(["inspect", inp])
    run = rs.run_on(inp, tmp_path / "out", "add-tokens", [*CHAT, "--special", "--pad-to-multiple-of", "8"])
    if inspect.returncode != 0:
        assert run.rc == inspect.returncode, run.describe()
        assert not (tmp_path / "out").exists() and run.input_before == run.input_after
        return
    rows = run.ok().ckpt().tensors["model.embed_tokens.weight"].shape[0]
    assert rows % 24 == 0 and rows >= e["tokens"] + 3


def test_no_tokenizer_files_refused(built, tmp_path):
    """A folder with weights and config but no tokenizer file: nothing to add the token to; refused, one
    line naming the cause, nothing written, input untouched."""
    src = built[TIED.name]["path"]
    inp = tmp_path / "in"
    inp.mkdir()
    for f in src.iterdir():
        if f.suffix in (".safetensors",) or f.name in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, inp / f.name)
    run = rs.run_on(inp, tmp_path / "out", "add-tokens", ["<tool_call>"])
    assert run.rc not in (0, None), run.describe()
    assert "tokenizer" in run.stderr.lower(), run.describe()
    assert not (tmp_path / "out").exists() and run.input_before == run.input_after


# ---------------------------------------------------------------------------------------------- slow
@pytest.fixture(scope="session")
def tokenizer_results(results, tmp_path_factory) -> dict[str, dict]:
    """HF transformers and PaddleFormers AutoTokenizer on every output and input (one subprocess)."""
    corpus = ts.corpus_lines()
    jobs, keys = [], []
    for k, r in results.items():
        if r.run.rc != 0:
            continue
        for which, folder in (("out", r.run.out), ("in", r.run.inp)):
            jobs.append({"folder": str(folder), "strings": list(r.case.tokens), "corpus": corpus})
            keys.append((k, which))
    got = ts.tokenizer_loads(jobs, tmp_path_factory.mktemp("tokloads"))
    out: dict[str, dict] = {}
    for (k, which), g in zip(keys, got, strict=True):
        out.setdefault(k, {})[which] = g
    return out


@pytest.mark.slow
@pytest.mark.parametrize("lib", ["hf", "pf"])
@pytest.mark.parametrize("key", [c.key for c in CASES])
def test_tokenizers_encode_new_ids(results, tokenizer_results, key, lib):
    """``AutoTokenizer.from_pretrained(out)`` of HF transformers 5.x and PaddleFormers 1.2: each new string
    is exactly its id, alone and inside a sentence (never split), ``len`` = old length + new tokens, the
    corpus tokenizes as the input's did."""
    r = results[key]
    r.run.ok()
    res = tokenizer_results[key]
    out, inp = res["out"][lib], res["in"][lib]
    assert inp["ok"], f"{lib} cannot load the input's tokenizer: {inp['error']}"
    assert out["ok"], f"{lib} cannot load the output's tokenizer: {out['error']}"
    ids = expected_ids(r)
    for s, enc, inside in zip(r.case.tokens, out["strings"], out["inside"], strict=True):
        assert enc == [ids[s]], f"{lib}: {s!r} encodes to {enc}, expected [{ids[s]}]"
        assert ids[s] in inside, f"{lib}: {s!r} is split inside a sentence: {inside}"
    assert out["len"] == inp["len"] + len(_new_ids(r))
    changed = [s for s in r.case.tokens if ids[s] >= r.entry["tokens"] or "--special" in r.case.extra]
    assert not [s for s in changed for ln in ts.corpus_lines() if s in ln], "the corpus holds a test token"
    assert out["corpus"] == inp["corpus"], f"{lib}: ordinary text tokenizes differently after the edit"


@pytest.fixture(scope="session")
def logits(results, tmp_path_factory) -> dict:
    jobs = {}
    for k, r in results.items():
        if not r.case.load or r.run.rc != 0:
            continue
        v = next(v for v in VARIANTS if v.name == r.case.src)
        kw = tuple(v.load_kwargs.items())
        jobs[k] = (fb.LogitsJob(r.run.out, v.model_class, kw), fb.LogitsJob(r.run.inp, v.model_class, kw))
    flat = sorted({j for pair in jobs.values() for j in pair}, key=str)
    res = fb.logits_batches(flat, tmp_path_factory.mktemp("tok-logits"))
    return {k: (res[a], res[b]) for k, (a, b) in jobs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("key", [c.key for c in CASES if c.load])
def test_loads_and_old_logits_unchanged(results, logits, key):
    """The output loads in PaddleFormers 1.2 (no missing or newly initialised key) and gives logits of width
    rows whose first len(tokenizer before) columns equal the input's within 1e-5 (both computed in this
    run)."""
    r = results[key]
    r.run.ok()
    out, inp = logits[key]
    assert inp["ok"], f"the input does not load: {inp['error']}"
    assert out["ok"], f"the output does not load in PaddleFormers: {out['error']}"
    bad = [w for w in out["warnings"] if any(p in w for p in ("Missing keys", "newly initialized"))]
    assert not bad, f"load warnings: {bad}"
    rows = r.run.ckpt().tensors["model.embed_tokens.weight"].shape[0]
    assert out["logits"].shape[-1] == rows
    L = r.entry["tokens"]
    ref = inp["logits"][..., :L]
    diff = fs.logits_mismatch(out["logits"][..., :L], ref, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
    assert diff is None, f"logits on the old ids differ from the input's: {diff}"


@pytest.mark.parametrize("key", ["bf16-both-files", "bf16-words"])
def test_both_files_agree(results, key):
    """A folder with tokenizer.json and tokenizer.model: both edited, and they agree: the SentencePiece
    model's piece of each new string is its id (``CONTROL`` for special, ``USER_DEFINED`` otherwise),
    the model has as many pieces as the loader counts tokens, tokenizer.json gives the same id."""
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import Tokenizer

    r = results[key]
    out = r.run.ok().out
    sp = sentencepiece.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    proto = pb.ModelProto()
    proto.ParseFromString((out / "tokenizer.model").read_bytes())
    tj = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids, special = expected_ids(r), "--special" in r.case.extra
    assert sp.get_piece_size() == len(ts.hf_tokenizer(out))
    for s in r.case.tokens:
        i = ids[s]
        assert sp.piece_to_id(s) == i and tj.token_to_id(s) == i, f"{s!r}: model {sp.piece_to_id(s)}, json"
        kind = proto.pieces[i].type
        want = pb.ModelProto.SentencePiece.CONTROL if special else pb.ModelProto.SentencePiece.USER_DEFINED
        assert kind == want, f"{s!r}: piece type {kind}, expected {want}"


@pytest.fixture(scope="session")
def pnlp_results(results, tmp_path_factory) -> dict[str, dict]:
    """PaddleNLP 2.8.1's AutoTokenizer on every output and input (one process of its venv, the ``encode``
    job of :mod:`support.pnlp_worker`): ``{key: {"in": result, "out": result}}``."""
    pnlp_support.require()
    jobs, keys = [], []
    for k, r in results.items():
        if r.run.rc != 0:
            continue
        texts = [*r.case.tokens, *(f"and {s} then" for s in r.case.tokens)]
        for which, folder in (("out", r.run.out), ("in", r.run.inp)):
            jobs.append({"op": "encode", "dir": str(folder), "texts": texts})
            keys.append((k, which))
    got = pnlp_support.run_jobs(jobs, tmp_path_factory.mktemp("pnlp-tok"))
    out: dict[str, dict] = {}
    for (k, which), g in zip(keys, got, strict=True):
        out.setdefault(k, {})[which] = g
    return out


@pytest.mark.slow
@pytest.mark.pnlp
def test_paddlenlp_encodes_new_ids(results, pnlp_results):
    """PaddleNLP 2.8.1's own tokenizers on every add-tokens output whose input they load with the input's
    length (its readers: the WordPiece variant's BertTokenizer; the others name classes PaddleNLP 2.8.1 does
    not have, facts of surgery/io/tokenizer_loaders.py): each new string is exactly its id, alone, and
    inside a sentence; ``len`` = the old length + the new tokens."""
    readers = []
    for key, res in pnlp_results.items():
        r, inp, out = results[key], res["in"], res["out"]
        if not (inp["ok"] and inp["len"] == r.entry["tokens"]):
            continue
        readers.append(key)
        assert out["ok"], f"PaddleNLP cannot load the output of {key}: {out.get('error')}"
        ids, n = expected_ids(r), len(r.case.tokens)
        assert out["ids"][:n] == [[ids[s]] for s in r.case.tokens], (key, out["ids"][:n])
        assert all(ids[s] in enc for s, enc in zip(r.case.tokens, out["ids"][n:], strict=True)), key
        assert out["len"] == inp["len"] + len(_new_ids(r))
    assert "wordpiece" in readers, readers
