"""Property: a mutant of a SentencePiece model or of a ``tokenizer.json`` is read, edited or refused with a
``TietoolError``, never anything else, and never kills the interpreter.

Mutants are structure-aware (hypothesis draws 1-4 edits). A SentencePiece model of the trained ``sp_bpe`` /
``sp_unigram`` tokenizers (``tests/data/tokenizers``) is edited through its protobuf
(``sentencepiece_model_pb2``): a piece emptied, duplicated, given a NUL, made long, a score NaN or infinite,
a piece type changed, pieces deleted, the ``precompiled_charsmap`` replaced by bytes, a byte of the
serialized model flipped. The ``bytelevel_bpe`` ``tokenizer.json`` is edited as JSON: an id made huge,
negative, a string or a float, a token made long or not a string, an entry or key deleted, the model type
changed, a byte replaced by one that is not UTF-8. In process, each goes through :func:`tokenizer_set`
(what inspect and resize read) and :func:`add_tokens_edit`; anything but a :class:`TietoolError` escaping
would be exit 70. Ten of each run through the CLI in a child process (``add-tokens`` on the safetensors
fixture with the mutant beside it): no exit 70, no signal (a native abort), no run over 10 s.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sentencepiece import sentencepiece_model_pb2 as pb
from support import adversarial_support as av
from support.paths import DATA

from tietool.surgery.io.tokenizer import tokenizer_set
from tietool.surgery.io.tokenizer_edit import add_tokens_edit
from tietool.surgery.model.errors import TietoolError

TOK = DATA / "tokenizers"
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CLI = settings(SETTINGS, max_examples=10)

SP_OPS = ("empty", "dup", "nul", "long", "nan", "inf", "type", "delete", "charsmap", "flip")
TJ_OPS = ("vocab_id", "added_id", "long", "not_str", "delete", "model_type", "not_utf8")
BIG = st.sampled_from([-1, 2**31, 2**32 - 1, 2_000_000_000, 10**9, 10**12, 10**18, 2**63, 10**30])


@st.composite
def sp_mutant(draw) -> tuple[str, bytes]:
    """(tokenizer name, the mutated ``tokenizer.model`` bytes)."""
    name = draw(st.sampled_from(["sp_bpe", "sp_unigram"]))
    m = pb.ModelProto()
    m.ParseFromString((TOK / name / "tokenizer.model").read_bytes())
    flips: list[tuple[int, int]] = []
    for op in draw(st.lists(st.sampled_from(SP_OPS), min_size=1, max_size=4)):
        n = len(m.pieces)
        i = draw(st.integers(0, max(n - 1, 0)))
        if op == "charsmap":
            m.normalizer_spec.precompiled_charsmap = draw(st.binary(max_size=64))
        elif op == "flip":
            flips.append((draw(st.integers(0, 10**6)), draw(st.integers(1, 255))))
        elif n == 0:
            continue
        elif op == "delete":
            del m.pieces[i : i + draw(st.integers(1, n))]
        elif op == "type":
            m.pieces[i].type = draw(st.integers(1, 6))
        elif op in ("nan", "inf"):
            m.pieces[i].score = math.nan if op == "nan" else -math.inf
        else:
            other = m.pieces[(i + 1) % n].piece
            m.pieces[i].piece = {"empty": "", "dup": other, "nul": "a\0", "long": "x" * 20_000}[op]
    blob = bytearray(m.SerializeToString())
    for at, x in flips:
        if blob:
            blob[at % len(blob)] ^= x
    return name, bytes(blob)


def _set_path(d: dict, draw, value) -> None:
    vocab, added = d.get("model", {}).get("vocab", {}), d.get("added_tokens", [])
    if draw(st.booleans()) and added:
        added[draw(st.integers(0, len(added) - 1))]["id"] = value
    elif isinstance(vocab, dict) and vocab:
        vocab[draw(st.sampled_from(sorted(vocab)))] = value


@st.composite
def tj_mutant(draw) -> bytes:
    """The mutated ``tokenizer.json`` bytes of ``bytelevel_bpe``."""
    d = json.loads((TOK / "bytelevel_bpe" / "tokenizer.json").read_text())
    not_utf8 = False
    for op in draw(st.lists(st.sampled_from(TJ_OPS), min_size=1, max_size=4)):
        added = d.setdefault("added_tokens", [])
        if op == "vocab_id" and isinstance(d.get("model"), dict):
            d["model"].setdefault("vocab", {})["zz"] = draw(BIG)
        elif op == "added_id":
            _set_path(d, draw, draw(st.one_of(BIG, st.just("7"), st.just(3.5), st.none())))
        elif op == "long":
            n = draw(st.sampled_from([10_001, 30_000, 100_000]))
            added.append({"id": 304, "content": "y" * n, "special": False, "normalized": True})
        elif op == "not_str" and added:
            added[draw(st.integers(0, len(added) - 1))]["content"] = draw(st.sampled_from([None, 5, [], {}]))
        elif op == "delete":
            key = draw(st.sampled_from(["model", "added_tokens", "normalizer", "pre_tokenizer", "decoder"]))
            d.pop(key, None)
        elif op == "model_type" and isinstance(d.get("model"), dict):
            d["model"]["type"] = draw(st.sampled_from(["WordPiece", "Unigram", "WordLevel", "Nope", 5]))
        elif op == "not_utf8":
            not_utf8 = True
    blob = json.dumps(d).encode()
    return blob.replace(b"<|endoftext|>", b"<|end\xff|>", 1) if not_utf8 else blob


def _folder(tmp: Path, name: str, file: str, blob: bytes) -> Path:
    folder = tmp / "tok"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(TOK / name, folder)
    (folder / file).write_bytes(blob)
    return folder


def _through_library(folder: Path) -> None:
    """tokenizer_set never raises; add_tokens_edit returns or raises TietoolError (anything else fails)."""
    tokenizer_set(folder)
    try:
        add_tokens_edit(folder, ["zqx", "<new_tok>"])
    except TietoolError:
        pass


@SETTINGS
@given(mutant=sp_mutant())
def test_sentencepiece_mutants_in_process(tmp_path: Path, mutant: tuple[str, bytes]) -> None:
    name, blob = mutant
    _through_library(_folder(tmp_path, name, "tokenizer.model", blob))


@SETTINGS
@given(blob=tj_mutant())
def test_tokenizer_json_mutants_in_process(tmp_path: Path, blob: bytes) -> None:
    _through_library(_folder(tmp_path, "bytelevel_bpe", "tokenizer.json", blob))


def _cli(tmp: Path, name: str, file: str, blob: bytes) -> None:
    ckpt = tmp / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(tmp / "out", ignore_errors=True)
    av.copy_case(av.ST_ONE, ckpt)
    for p in (TOK / name).iterdir():
        shutil.copy(p, ckpt / p.name)
    (ckpt / file).write_bytes(blob)
    run = av.run_cli(
        ["add-tokens", ckpt, "zqx", "--out", tmp / "out", "--quiet"], timeout=10, subprocess=True
    )
    assert run.rc is not None, "hung: no exit within 10 s\n" + run.describe()
    assert run.rc >= 0, f"killed by signal {-run.rc}\n" + run.describe()
    assert run.rc != 70, run.describe()
    assert run.rc == 0 or av.check_no_crash(run) == [], run.describe()


@pytest.mark.slow
@CLI
@given(mutant=sp_mutant())
def test_sentencepiece_mutants_cli(tmp_path: Path, mutant: tuple[str, bytes]) -> None:
    _cli(tmp_path, mutant[0], "tokenizer.model", mutant[1])


@pytest.mark.slow
@CLI
@given(blob=tj_mutant())
def test_tokenizer_json_mutants_cli(tmp_path: Path, blob: bytes) -> None:
    _cli(tmp_path, "bytelevel_bpe", "tokenizer.json", blob)
