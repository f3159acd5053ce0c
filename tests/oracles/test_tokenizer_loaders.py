"""The proving test of :data:`surgery.io.tokenizer_loaders.FACTS`: every (tokenizer format, where the added
tokens go, loader) fact is asserted on ``add-tokens`` outputs of real tokenizers, loaded by the real library.

Inputs: the trained tokenizers of ``tests/data/tokenizers`` (HF-style folders), the folders PaddleNLP 2.8.1's
own ``save_pretrained`` wrote (``tests/data/pnlp_tokenizers``: LlamaTokenizer, ErnieTokenizer, GPTTokenizer)
and the tokenizer files of the cases e01 (ERNIE, lower-casing vocab.txt), e08 (PaddleNLP GPT) and e05 (GLM-4's
tiktoken ``tokenizer.model``). Each gets two edits, written as ``add-tokens`` writes them
(:func:`surgery.io.tokenizer_edit.add_tokens_edit`'s files): plain tokens (one with capitals) and special
ones. The libraries run once each over every folder: ``tokenizers`` and ``sentencepiece`` here, transformers
5.3 and PaddleFormers 1.2 in one subprocess (:func:`support.tokmodel_support.tokenizer_loads`), PaddleNLP
2.8.1 in one subprocess of its venv (:func:`support.pnlp_support.run_jobs`, marked ``pnlp``).

Outcomes, as the table states them:

* ``ENCODES``: every folder whose *input* the library loads with the tokenizer's length (a reader of the
  folder) has every new token encoded, alone, as exactly its id, and inside ``and X then`` with its id;
  at least one such folder exists.
* ``PIECE``: ``sentencepiece`` on the model file: a plain token's text encodes as [``▁``, id] or [id], a
  special token is a CONTROL piece at its id that text never produces.
* ``IGNORES``: the model file is byte-identical to the input's, the library does not know the token, and
  the edit's warnings name the library.
* ``NOT_A_READER``: the library fails on the *input* folder, or loads it with another length.
* ``REFUSED``: add-tokens refuses every such folder naming the format.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import paths, pnlp_support
from support import tokmodel_support as ts
from support.paths import BUG_CASES_DIR

from tietool.surgery.io.tokenizer import tokenizer_set
from tietool.surgery.io.tokenizer_edit import add_tokens_edit
from tietool.surgery.io.tokenizer_loaders import FACTS, PROOFS, AddedTokensIn, Outcome, TokenizerFact
from tietool.surgery.io.tokenizer_loaders import TokenizerLoader as L
from tietool.surgery.model.errors import RefusedError
from tietool.surgery.model.tokens import TokenizerFormat as F

DATA = paths.DATA
TOK, PNLP_TOK = DATA / "tokenizers", DATA / "pnlp_tokenizers"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "sentencepiece.bpe.model",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "qwen.tiktoken",
)
# (format, where) -> the input folders of that kind
SOURCES: dict[tuple[F, AddedTokensIn], tuple[Path, ...]] = {
    (F.TOKENIZER_JSON, AddedTokensIn.MODEL_FILE): (
        TOK / "bytelevel_bpe",
        TOK / "bytelevel_bpe+vocab.json",  # built by _with_vocab_json: a Qwen2 folder holds both
        TOK / "sp_bpe_with_json",
    ),
    (F.SENTENCEPIECE, AddedTokensIn.MODEL_FILE): (
        TOK / "sp_bpe",
        TOK / "sp_unigram",
        TOK / "sp_bpe_with_json",
    ),
    (F.SENTENCEPIECE, AddedTokensIn.ADDED_JSON): (PNLP_TOK / "llama_sp",),
    (F.WORDPIECE, AddedTokensIn.ADDED_JSON): (
        TOK / "wordpiece",
        TOK / "wordpiece+tokenizer.json",  # built by _with_tokenizer_json: transformers 4.x saves both files
        PNLP_TOK / "ernie_wordpiece",
        BUG_CASES_DIR / "e01_ernie3_wordpiece_lowercase_add_tokens" / "ckpt",
    ),
    (F.GPT2_BPE, AddedTokensIn.ADDED_JSON): (
        TOK / "gpt2_bpe",
        PNLP_TOK / "gpt_bpe",
        BUG_CASES_DIR / "e08_paddlenlp_gpt_added_tokens_file" / "ckpt",
    ),
    (F.TIKTOKEN, AddedTokensIn.NONE): (
        TOK / "tiktoken",
        BUG_CASES_DIR / "e05_glm4_tiktoken_tokenizer_model" / "ckpt",
    ),
}
EDITS = {
    "plain": (["<tt_plain>", "tietoolery", "COVID"], False),  # in no input; COVID lower-cased where text is
    "special": (["<tool_call>", "<|x_sep|>"], True),
}


@dataclass
class Output:
    """One edited copy: the strings asked for, the ids the edit gave them, the edit's warnings."""

    source: Path
    input: Path
    folder: Path
    asked: list[str]
    ids: list[int]
    special: bool
    warnings: tuple[str, ...]
    length_before: int


def _with_tokenizer_json(dst: Path) -> Path:
    """The WordPiece folder plus the tokenizer.json of the same vocabulary (``tokenizers``' WordPiece with
    BERT's lower-casing normalizer and pre-tokenizer, the specials as special added tokens at their ids), as
    a transformers 4.x BERT folder holds both; transformers then reads tokenizer.json, PaddleNLP vocab.txt."""
    import tokenizers

    dst.mkdir(parents=True)
    for f in (TOK / "wordpiece").iterdir():
        shutil.copy2(f, dst / f.name)
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordPiece.from_file(str(dst / "vocab.txt"), unk_token="[UNK]")
    )
    tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.decoder = tokenizers.decoders.WordPiece()
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.save(str(dst / "tokenizer.json"))
    return dst


def _with_vocab_json(dst: Path) -> Path:
    """The byte-level BPE folder plus the vocab.json + merges.txt of its model (``tokenizers``'
    ``model.save``), as a Qwen2 folder carries them."""
    import tokenizers

    shutil.copytree(TOK / "bytelevel_bpe", dst)
    tokenizers.Tokenizer.from_file(str(dst / "tokenizer.json")).model.save(str(dst))
    return dst


def _copy_tokenizer(src: Path, dst: Path) -> Path:
    if src.name == "wordpiece+tokenizer.json":
        return _with_tokenizer_json(dst)
    if src.name == "bytelevel_bpe+vocab.json":
        return _with_vocab_json(dst)
    dst.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[tuple[F, AddedTokensIn], list[Output]]:
    """Every editable source, copied and edited twice (plain, special) as add-tokens writes the files."""
    root = tmp_path_factory.mktemp("tokloaders")
    out: dict[tuple[F, AddedTokensIn], list[Output]] = {}
    for kind, sources in SOURCES.items():
        if kind[1] is AddedTokensIn.NONE:
            continue
        for n, src in enumerate(sources):
            inp = _copy_tokenizer(src, root / f"{kind[0].value}-{kind[1].value}-{n}" / "in")
            for edit_name, (strings, special) in EDITS.items():
                folder = _copy_tokenizer(src, inp.parent / edit_name)
                edit = add_tokens_edit(folder, strings, special=special)
                for name, blob in edit.files.items():
                    (folder / name).write_bytes(blob)
                ids = [t.id for t in edit.tokens]
                assert [t.existed for t in edit.tokens] == [False] * len(strings), src
                warnings = edit.warnings
                out.setdefault(kind, []).append(
                    Output(src, inp, folder, strings, ids, special, warnings, edit.length_before)
                )
    return out


def _all(outputs) -> list[Output]:
    return [o for group in outputs.values() for o in group]


@pytest.fixture(scope="module")
def hf_pf(outputs, tmp_path_factory) -> dict[str, dict]:
    """transformers 5.3 and PaddleFormers 1.2 ``AutoTokenizer`` of every input and output folder (one
    subprocess): ``{folder: {"hf": ..., "pf": ...}}``."""
    folders = {str(o.input): o.asked for o in _all(outputs)} | {str(o.folder): o.asked for o in _all(outputs)}
    jobs = [{"folder": f, "strings": asked, "corpus": []} for f, asked in folders.items()]
    loads = ts.tokenizer_loads(jobs, tmp_path_factory.mktemp("hfpf"))
    return dict(zip(folders, loads, strict=True))


@pytest.fixture(scope="module")
def pnlp(outputs, tmp_path_factory) -> dict[str, dict]:
    """PaddleNLP 2.8.1 ``AutoTokenizer`` of every input and output folder (one process of its venv):
    ``{folder: {"ok", "len", "strings", "inside"}}``."""
    pnlp_support.require()
    folders = {str(o.input): o.asked for o in _all(outputs)} | {str(o.folder): o.asked for o in _all(outputs)}
    jobs = [
        {"op": "encode", "dir": f, "texts": [*asked, *(f"and {s} then" for s in asked)]}
        for f, asked in folders.items()
    ]
    results = pnlp_support.run_jobs(jobs, tmp_path_factory.mktemp("pnlp"))
    out = {}
    for (f, asked), r in zip(folders.items(), results, strict=True):
        if r["ok"]:
            n = len(asked)
            r = {"ok": True, "len": r["len"], "strings": r["ids"][:n], "inside": r["ids"][n:]}
        out[f] = r
    return out


def _sp_processor(folder: Path):
    import sentencepiece as spm

    name = next(n for n in ("tokenizer.model", "sentencepiece.bpe.model") if (folder / n).is_file())
    return spm.SentencePieceProcessor(model_file=str(folder / name)), name


def _load(fact: TokenizerFact, folder: Path, hf_pf, request) -> dict:
    """``{"ok", "len", "strings", "inside"}`` of ``folder`` under the fact's loader (tokenizers here)."""
    if fact.loader is L.TOKENIZERS:
        import tokenizers

        if not (folder / "tokenizer.json").is_file():
            return {"ok": False, "error": "no tokenizer.json"}
        tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        asked = _asked_for(folder, request)
        enc = [tok.encode(s, add_special_tokens=False).ids for s in asked]
        inside = [tok.encode(f"and {s} then", add_special_tokens=False).ids for s in asked]
        return {
            "ok": True,
            "len": tok.get_vocab_size(with_added_tokens=True),
            "strings": enc,
            "inside": inside,
        }
    if fact.loader is L.PADDLENLP_28:
        return request.getfixturevalue("pnlp")[str(folder)]
    return hf_pf[str(folder)]["hf" if fact.loader is L.TRANSFORMERS else "pf"]


def _asked_for(folder: Path, request) -> list[str]:
    for o in _all(request.getfixturevalue("outputs")):
        if folder in (o.folder, o.input):
            return o.asked
    raise AssertionError(folder)


def _readers(fact: TokenizerFact, group: list[Output], hf_pf, request) -> list[Output]:
    """The outputs whose input the loader loads with the tokenizer's own length (tietool's reading)."""
    out = []
    for o in group:
        got = _load(fact, o.input, hf_pf, request)
        if got.get("ok") and got["len"] == tokenizer_set(o.input).length:
            out.append(o)
    return out


def _check_encodes(fact, group, hf_pf, request) -> None:
    readers = _readers(fact, group, hf_pf, request)
    assert readers, f"{fact.loader} loads none of {sorted({str(o.source) for o in group})}"
    for o in readers:
        got = _load(fact, o.folder, hf_pf, request)
        assert got.get("ok"), (o.folder, got.get("error"))
        assert got["strings"] == [[i] for i in o.ids], (o.source, o.asked, got["strings"])
        assert all(i in ids for i, ids in zip(o.ids, got["inside"], strict=True)), (o.source, got["inside"])
        assert got["len"] == o.length_before + len(o.ids)


def _check_piece(group: list[Output]) -> None:
    for o in group:
        sp, _ = _sp_processor(o.folder)
        prefix = sp.piece_to_id("▁")
        for s, i in zip(o.asked, o.ids, strict=True):
            assert sp.piece_to_id(s) == i
            if o.special:
                assert sp.is_control(i) and i not in sp.encode(s)
            else:
                assert sp.encode(s) in ([prefix, i], [i]), (o.source, s, sp.encode(s))


def _check_ignores(fact, group: list[Output]) -> None:
    for o in group:
        sp, name = _sp_processor(o.folder)
        assert (o.folder / name).read_bytes() == (o.input / name).read_bytes()
        assert all(sp.piece_to_id(s) == sp.unk_id() for s in o.asked)
        assert any(
            w.startswith(f"the {fact.loader.value} library does not see the new tokens") for w in o.warnings
        )


def _check_not_a_reader(fact, group: list[Output], hf_pf, request) -> None:
    for o in group:
        got = _load(fact, o.input, hf_pf, request)
        assert not got.get("ok") or got["len"] != tokenizer_set(o.input).length, (o.source, got.get("len"))


def _check_refused(fmt: F, where: AddedTokensIn, tmp_path: Path) -> None:
    for n, src in enumerate(SOURCES[(fmt, where)]):
        folder = _copy_tokenizer(src, tmp_path / str(n))
        for strings, special in EDITS.values():
            with pytest.raises(RefusedError, match="tiktoken"):
                add_tokens_edit(folder, strings, special=special)


def _param(fact: TokenizerFact):
    marks = [pytest.mark.pnlp] if fact.loader is L.PADDLENLP_28 else []
    return pytest.param(fact, id=fact.key, marks=marks)


@pytest.mark.parametrize("fact", [_param(f) for f in FACTS])
def test_tokenizer_loader_fact(fact: TokenizerFact, outputs, hf_pf, request, tmp_path):
    """The fact holds on every folder of its kind (see the module docstring), and PROOFS names this test."""
    assert PROOFS[fact.key] == paths.node_id(request)
    kind = (fact.fmt, fact.where)
    if fact.outcome is Outcome.REFUSED:
        _check_refused(fact.fmt, fact.where, tmp_path)
        return
    group = outputs[kind]
    if fact.outcome is Outcome.ENCODES:
        _check_encodes(fact, group, hf_pf, request)
    elif fact.outcome is Outcome.PIECE:
        _check_piece(group)
    elif fact.outcome is Outcome.IGNORES:
        _check_ignores(fact, group)
    else:
        _check_not_a_reader(fact, group, hf_pf, request)


def test_every_fact_has_sources_and_a_unique_key():
    """Each fact's kind has input folders here, and no two facts share a key."""
    assert len({f.key for f in FACTS}) == len(FACTS)
    assert all((f.fmt, f.where) in SOURCES for f in FACTS)
