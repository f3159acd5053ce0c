"""The proving test of :data:`surgery.io.tokenizer_loaders.PRUNE_FACTS`: every (pruned format, loader) fact
is asserted on ``prune`` outputs of real tokenizers, loaded by the real library.

Inputs: the trained tokenizers of ``tests/data/tokenizers`` (byte-level BPE ``tokenizer.json``, GPT-2
``vocab.json`` + ``merges.txt``, SentencePiece BPE and Unigram models, a SentencePiece BPE with the
``tokenizer.json`` transformers converts from it, WordPiece ``vocab.txt``), the folders PaddleNLP 2.8.1's
``save_pretrained`` wrote (``tests/data/pnlp_tokenizers``: ``sentencepiece.bpe.model``, GPT ``vocab.json``,
ERNIE ``vocab.txt``), and two built here from them with ``tokenizers``: a Unigram ``tokenizer.json`` (the
pieces and scores of ``sp_unigram``'s model) and a WordPiece ``tokenizer.json``.

The keep-list of each folder: the ids every library gives the corpus lines (:data:`LINES`), the tokens BPE
passes through to make them, the byte / control / unknown pieces and the special tokens; the folder is
pruned as ``prune`` prunes it (:func:`surgery.io.tokenizer_prune.prune_tokenizer_edit`). Each library then
loads both folders (``tokenizers`` and ``sentencepiece`` here, transformers 5.3 and PaddleFormers 1.2 in one
subprocess, PaddleNLP 2.8.1 in its venv, marked ``pnlp``):

* ``KEEPS_ENCODING``: every folder of the format whose input the library loads (with the files' length)
  encodes the lines to the old
  encoding's ids renumbered, and counts the removed tokens as gone; at least one such folder exists.
* ``NOT_A_READER``: the library fails on every input folder of the format, or loads it with another
  length than the files' (another vocabulary).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import paths, pnlp_support
from support import tokmodel_support as ts

from tietool.surgery.io.tokenizer import vocabulary
from tietool.surgery.io.tokenizer_loaders import (
    PRUNE_FACTS,
    PRUNE_PROOFS,
    PruneFact,
    PruneOutcome,
)
from tietool.surgery.io.tokenizer_loaders import PrunedFormat as F
from tietool.surgery.io.tokenizer_loaders import TokenizerLoader as L
from tietool.surgery.io.tokenizer_prune import alphabet_ids, corpus_ids, prune_tokenizer_edit

DATA = paths.DATA
TOK, PNLP_TOK = DATA / "tokenizers", DATA / "pnlp_tokenizers"
LINES = [ln for ln in (TOK / "corpus.txt").read_text(encoding="utf-8").splitlines() if ln.strip()][:12]
SP_FILES = ("tokenizer.model", "sentencepiece.bpe.model")
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _unigram_json(dst: Path) -> Path:
    """A Unigram ``tokenizer.json`` of ``sp_unigram``'s pieces and scores (``tokenizers``' Unigram, Llama-2's
    Metaspace pre-tokenizer), its three specials as special added tokens, read as a
    ``PreTrainedTokenizerFast``."""
    import sentencepiece as spm
    import tokenizers as tk

    sp = spm.SentencePieceProcessor(model_file=str(TOK / "sp_unigram" / "tokenizer.model"))
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tok = tk.Tokenizer(tk.models.Unigram(vocab, unk_id=sp.unk_id(), byte_fallback=False))
    tok.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = tk.decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    dst.mkdir(parents=True)
    tok.save(str(dst / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>"}
    (dst / "tokenizer_config.json").write_text(json.dumps(dict(cfg, eos_token="</s>"), indent=2))
    return dst


def _wordpiece_json(dst: Path) -> Path:
    """A WordPiece ``tokenizer.json`` (BertWordPieceTokenizer of ``wordpiece/vocab.txt``, lower-cased)."""
    from tokenizers import BertWordPieceTokenizer

    dst.mkdir(parents=True)
    for n in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(TOK / "wordpiece" / n, dst / n)
    BertWordPieceTokenizer(str(TOK / "wordpiece" / "vocab.txt"), lowercase=True).save(
        str(dst / "tokenizer.json")
    )
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    (dst / "tokenizer_config.json").write_text(json.dumps(dict(cfg, tokenizer_class="BertTokenizerFast")))
    return dst


BUILD = {
    "bytelevel_bpe": lambda d: _copy(TOK / "bytelevel_bpe", d),
    "sp_bpe_with_json": lambda d: _copy(TOK / "sp_bpe_with_json", d),
    "unigram_json": _unigram_json,
    "wordpiece_json": _wordpiece_json,
    "wordpiece": lambda d: _copy(TOK / "wordpiece", d),
    "ernie_wordpiece": lambda d: _copy(PNLP_TOK / "ernie_wordpiece", d),
    "gpt2_bpe": lambda d: _copy(TOK / "gpt2_bpe", d),
    "pnlp_gpt_bpe": lambda d: _copy(PNLP_TOK / "gpt_bpe", d),
    "sp_bpe": lambda d: _copy(TOK / "sp_bpe", d),
    "pnlp_llama_sp": lambda d: _copy(PNLP_TOK / "llama_sp", d),
    "sp_unigram": lambda d: _copy(TOK / "sp_unigram", d),
}
SOURCES: dict[F, tuple[str, ...]] = {
    F.BPE_JSON: ("bytelevel_bpe", "sp_bpe_with_json"),
    F.UNIGRAM_JSON: ("unigram_json",),
    F.WORDPIECE_JSON: ("wordpiece_json",),
    F.WORDPIECE_TXT: ("wordpiece", "ernie_wordpiece"),
    F.GPT2_BPE: ("gpt2_bpe", "pnlp_gpt_bpe"),
    F.SP_BPE: ("sp_bpe", "pnlp_llama_sp", "sp_bpe_with_json"),
    F.SP_UNIGRAM: ("sp_unigram",),
}


def _here(folder: Path) -> dict[str, dict]:
    """``tokenizers`` (tokenizer.json) and ``sentencepiece`` (the model file) on ``folder``: per library
    ``{"ok", "len", "strings"}``."""
    import sentencepiece as spm
    import tokenizers as tk

    out: dict[str, dict] = {}
    if (folder / "tokenizer.json").is_file():
        tok = tk.Tokenizer.from_file(str(folder / "tokenizer.json"))
        enc = [tok.encode(s, add_special_tokens=False).ids for s in LINES]
        out["tokenizers"] = {"ok": True, "len": tok.get_vocab_size(with_added_tokens=True), "strings": enc}
    else:
        out["tokenizers"] = {"ok": False, "error": "no tokenizer.json"}
    name = next((n for n in SP_FILES if (folder / n).is_file()), None)
    if name is None:
        out["sentencepiece"] = {"ok": False, "error": "no SentencePiece model"}
    else:
        sp = spm.SentencePieceProcessor(model_file=str(folder / name))
        out["sentencepiece"] = {"ok": True, "len": sp.get_piece_size(), "strings": sp.encode(LINES)}
    return out


def _vocab_txt_encode(folder: Path) -> list[list[int]]:
    from tokenizers import BertWordPieceTokenizer

    lower = json.loads((folder / "tokenizer_config.json").read_text()).get("do_lower_case", True)
    tok = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=lower)
    return [tok.encode(s, add_special_tokens=False).ids for s in LINES]


def _specials(folder: Path) -> set[int]:
    """The ids of the tokens the config files name and of every added / bracketed special token."""
    by_str = {s: i for i, s in sorted(vocabulary(folder).items(), reverse=True)}
    ids: set[int] = set()
    for n in ("tokenizer_config.json", "special_tokens_map.json"):
        if (folder / n).is_file():
            cfg = json.loads((folder / n).read_text(encoding="utf-8"))
            for key in NAMED:
                v = cfg.get(key)
                v = v.get("content") if isinstance(v, dict) else v
                if v in by_str:
                    ids.add(by_str[v])
            ids |= {int(k) for k in cfg.get("added_tokens_decoder") or {}}
    if (folder / "tokenizer.json").is_file():
        ids |= {a["id"] for a in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    if (folder / "added_tokens.json").is_file():
        ids |= set(json.loads((folder / "added_tokens.json").read_text()).values())
    return ids | {i for s, i in by_str.items() if s.startswith("[") and s.endswith("]")}


@pytest.fixture(scope="module")
def pruned(tmp_path_factory) -> dict[str, dict]:
    """Per folder: input, output, keep-list, and each library's loads of both."""
    root = tmp_path_factory.mktemp("prunetok")
    out = {name: {"input": make(root / name / "in")} for name, make in BUILD.items()}
    jobs = [{"folder": str(x["input"]), "strings": LINES, "corpus": []} for x in out.values()]
    for x, r in zip(out.values(), ts.tokenizer_loads(jobs, root / "old"), strict=True):
        x["old"] = {"transformers": r["hf"], "paddleformers": r["pf"], **_here(x["input"])}
        used = {i for r in x["old"].values() if r.get("ok") for enc in r["strings"] for i in enc}
        if (
            x["input"] / "vocab.txt"
        ).is_file():  # what PaddleNLP's WordPiece gives too (greedy longest match)
            used |= {i for enc in _vocab_txt_encode(x["input"]) for i in enc}
        else:
            used |= set(corpus_ids(x["input"], "\n".join(LINES)))
        keep = sorted(used | _specials(x["input"]) | set(alphabet_ids(x["input"])))
        outp = _copy(x["input"], x["input"].parent / "out")
        if outp.parent.name == "sp_unigram":  # prune refuses the model where
            for n in ("tokenizer_config.json", "special_tokens_map.json"):  # transformers / PaddleFormers
                (outp / n).unlink()  # read it (they split apart): the output is sentencepiece's alone
        edit = prune_tokenizer_edit(outp, keep, LINES)
        assert edit is not None
        for n, blob in edit.files.items():
            (outp / n).write_bytes(blob)
        x.update(output=outp, keep=keep)
    jobs = [{"folder": str(x["output"]), "strings": LINES, "corpus": []} for x in out.values()]
    for x, r in zip(out.values(), ts.tokenizer_loads(jobs, root / "new"), strict=True):
        x["new"] = {"transformers": r["hf"], "paddleformers": r["pf"], **_here(x["output"])}
    return out


@pytest.fixture(scope="module")
def pnlp(pruned, tmp_path_factory) -> dict[str, dict]:
    """PaddleNLP 2.8.1 ``AutoTokenizer`` on every input and output folder: ``{folder: {"ok", "len",
    "strings"}}``."""
    pnlp_support.require()
    folders = [str(x[k]) for x in pruned.values() for k in ("input", "output")]
    jobs = [{"op": "encode", "dir": f, "texts": LINES} for f in folders]
    res = pnlp_support.run_jobs(jobs, tmp_path_factory.mktemp("pnlp"))
    return {f: dict(r, strings=r.get("ids")) for f, r in zip(folders, res, strict=True)}


def _load(fact: PruneFact, x: dict, which: str, request) -> dict:
    if fact.loader is L.PADDLENLP_28:
        return request.getfixturevalue("pnlp")[str(x["input" if which == "old" else "output"])]
    return x[which][fact.loader.value]


def _reads(got: dict, folder: Path) -> bool:
    """Whether a library loaded ``folder`` as its tokenizer: with as many tokens as the files name (a
    library that falls back to another vocabulary, e.g. transformers on a ``sentencepiece.bpe.model``
    folder, loads a handful)."""
    return bool(got.get("ok")) and got["len"] == len(vocabulary(folder))


def _mapped(keep: list[int], encs: list[list[int]]) -> list[list[int]]:
    new_id = {o: n for n, o in enumerate(keep)}
    return [[new_id[i] for i in enc] for enc in encs]


def _param(fact: PruneFact):
    marks = [pytest.mark.pnlp] if fact.loader is L.PADDLENLP_28 else []
    return pytest.param(fact, id=fact.key, marks=marks)


@pytest.mark.parametrize("fact", [_param(f) for f in PRUNE_FACTS])
def test_prune_loader_fact(fact: PruneFact, pruned, request):
    """The fact holds on every folder of its format (the module docstring); PRUNE_PROOFS names this test."""
    assert PRUNE_PROOFS[fact.key] == paths.node_id(request)
    group = [pruned[n] for n in SOURCES[fact.fmt]]
    if fact.outcome is PruneOutcome.NOT_A_READER:
        for x in group:
            assert not _reads(_load(fact, x, "old", request), x["input"]), x["input"]
        return
    if fact.outcome is PruneOutcome.SEGMENTS_APART:  # it reads the input, and splits it otherwise
        for x in group:
            got, sp = _load(fact, x, "old", request), x["old"]["sentencepiece"]
            assert _reads(got, x["input"]) and sp.get("ok"), x["input"]
            assert got["strings"] != sp["strings"], x["input"]
        return
    readers = [x for x in group if _reads(_load(fact, x, "old", request), x["input"])]
    assert readers, f"{fact.loader} loads none of {SOURCES[fact.fmt]}"
    for x in readers:
        old, new = _load(fact, x, "old", request), _load(fact, x, "new", request)
        assert new.get("ok"), (x["output"], new.get("error"))
        assert len(x["keep"]) < old["len"]
        assert new["strings"] == _mapped(x["keep"], old["strings"]), x["input"]
        removed = len(vocabulary(x["input"])) - len(x["keep"])
        assert new["len"] == old["len"] - removed, (x["input"], old["len"], new["len"], removed)


def test_every_prune_fact_has_sources_and_a_unique_key():
    assert len({f.key for f in PRUNE_FACTS}) == len(PRUNE_FACTS)
    assert all(f.fmt in SOURCES for f in PRUNE_FACTS)
