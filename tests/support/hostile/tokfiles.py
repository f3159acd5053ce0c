"""Hostile tokenizer files (issue 29, items 1 and 2): each built from a real trained tokenizer of
``tests/data/tokenizers`` copied beside the safetensors fixture, then broken in one way.

Kinds:

* ``tok-sp``: a SentencePiece model (``sp_bpe``, ``sp_unigram``) mutated through its protobuf
  (``sentencepiece_model_pb2``): an empty, duplicate, NUL-holding or 1 MB piece, a NaN score, no or two
  ``unk``, a garbage or oversized ``precompiled_charsmap``, no pieces at all. ``add-tokens`` hands the model
  to ``sentencepiece``: exit 3 naming ``tokenizer.model`` (it was exit 70 with the library's log on stderr);
  ``inspect`` lists the file as unreadable and ``resize`` (a growth) needs no tokenizer: exit 0.
* ``tok-json``: ``tokenizer.json`` with a vocabulary id of 2*10^9 (tokenizers aborted the process), an
  added-token id of 10^9 / 2^32-1 / 10^12 / 10^18 (4 GB allocated), an added token of 30,000 / 100,000
  characters (add-tokens hung), bytes that are not UTF-8: add-tokens exit 3 naming the file and the limit,
  resize exit 3 for the ids (the rows they need cannot be told), inspect exit 0.
* ``tok-added``: ``added_tokens.json`` and ``added_tokens_decoder`` with an added-token id of 10^9 /
  10^12 / 10^18: add-tokens and resize exit 3 naming the file and the limit (inspect too for a decoder key
  of 19 digits, which is no token id).
* ``tok-text``: ``vocab.txt`` / ``merges.txt`` not UTF-8, a ``vocab.json`` id of 2*10^9 or -5 (tokenizers'
  BPE raised its own TypeError: exit 70), a WordPiece vocabulary without ``[UNK]`` (and
  no ``unk_token`` in the configs: WordPiece's default): add-tokens exit 3 naming the file.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from support import adversarial_support as av
from support.hostile import Hostile
from support.paths import DATA

TOKENIZERS = DATA / "tokenizers"
COMMANDS = ("inspect", "resize", "add-tokens")
EXTRA = {"add-tokens": ("zqx",), "resize": ("--vocab", "512")}  # the last --vocab counts


ROWS = 320  # rows for every tokenizer here (234 to 304 tokens) and the one add-tokens adds


def _grow(ckpt: Path) -> None:
    """The fixture's tied embedding and head given :data:`ROWS` rows (its 100 repeated), config and index
    updated: add-tokens then reaches the tokenizer edit, not the refusal of a tokenizer beyond the rows."""
    p = ckpt / av.ST_ONE_FILE
    tensors = av.st_tensors(p)
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        dt, shape, raw = tensors[k]
        rows = np.resize(np.frombuffer(raw, np.float32).reshape(shape), (ROWS, shape[1]))
        tensors[k] = (dt, [ROWS, shape[1]], rows.tobytes())
    av.st_write_tensors(p, tensors, {"format": "pt"})
    for name, key, value in (
        ("config.json", "vocab_size", ROWS),
        (av.ST_INDEX, "metadata", {"total_size": sum(len(t[2]) for t in tensors.values())}),
    ):
        d = json.loads((ckpt / name).read_text())
        d[key] = value
        (ckpt / name).write_text(json.dumps(d, indent=2))


def _with(tok: str, edit: Callable[[Path], None]) -> Callable[[Path], Path]:
    """A build: the safetensors fixture (:func:`_grow`) with the tokenizer ``tok``'s files beside it, then
    ``edit(ckpt)``."""

    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
        _grow(ckpt)
        for p in (TOKENIZERS / tok).iterdir():
            shutil.copy(p, ckpt / p.name)
        edit(ckpt)
        return ckpt

    return build


# ------------------------------------------------------------------------------------------------ tok-sp
def _sp(fn: Callable) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        from sentencepiece import sentencepiece_model_pb2 as pb

        m = pb.ModelProto()
        m.ParseFromString((ckpt / "tokenizer.model").read_bytes())
        fn(m)
        (ckpt / "tokenizer.model").write_bytes(m.SerializeToString())

    return edit


def _set(i: int, **kw) -> Callable:
    def fn(m) -> None:
        for k, v in kw.items():
            setattr(m.pieces[i], k, v)

    return fn


def _dup(m) -> None:
    m.pieces[10].piece = m.pieces[11].piece


def _charsmap(blob: bytes) -> Callable:
    def fn(m) -> None:
        m.normalizer_spec.precompiled_charsmap = blob

    return fn


SP_MUTANTS: list[tuple[str, Callable, str]] = [
    ("empty-piece", _set(10, piece=""), "piece 10 is empty"),
    ("dup-piece", _dup, "pieces 10 and 11"),
    ("nul-piece", _set(10, piece="a\0b"), "NUL"),
    ("1mb-piece", _set(10, piece="x" * 1_000_000), "1000000 characters"),
    ("nan-score", _set(10, score=math.nan), "score nan"),
    ("no-unk", _set(0, type=1), "0 unknown"),
    ("two-unk", _set(5, type=2), "2 unknown"),
    ("garbage-charsmap", _charsmap(b"garbage!" * 3), "sentencepiece"),
    ("oversized-charsmap", _charsmap(b"\xff\xff\xff\x7f" + b"\0" * 64), "sentencepiece"),
    ("no-pieces", lambda m: m.ClearField("pieces"), "no pieces"),
]

SP_CASES = [
    Hostile(
        f"tok-sp-{tok}-{name}",
        "tok-sp",
        _with(tok, _sp(fn)),
        {"add-tokens": 3, "*": 0},
        COMMANDS,
        names=("tokenizer.model", says),
        extra=EXTRA,
    )
    for tok in ("sp_bpe", "sp_unigram")
    for name, fn, says in SP_MUTANTS
]


# ------------------------------------------------------------------------------------------------ tok-json
def _tj(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        d = json.loads((ckpt / "tokenizer.json").read_text())
        fn(d)
        (ckpt / "tokenizer.json").write_text(json.dumps(d))

    return edit


def _vocab_id(n: int) -> Callable[[dict], None]:
    return lambda d: d["model"]["vocab"].__setitem__("zz", n)


def _added(n: int, content: str = "<big>") -> Callable[[dict], None]:
    entry = {"content": content, "single_word": False, "lstrip": False, "rstrip": False}
    return lambda d: d["added_tokens"].append({"id": n, **entry, "normalized": True, "special": False})


def _not_utf8(name: str, old: bytes, new: bytes) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        blob = (ckpt / name).read_bytes()
        assert old in blob, (name, old)
        (ckpt / name).write_bytes(blob.replace(old, new, 1))

    return edit


BIG_IDS = [("1e9", 10**9), ("2p32", 2**32 - 1), ("1e12", 10**12), ("1e18", 10**18)]
JSON_CASES = [
    Hostile(
        "tok-json-vocab-id-2e9",
        "tok-json",
        _with("bytelevel_bpe", _tj(_vocab_id(2_000_000_000))),
        {"inspect": 0, "*": 3},
        COMMANDS,
        names=("tokenizer.json", "2000000000"),
        extra=EXTRA,
    ),
    *[
        Hostile(
            f"tok-json-added-id-{k}",
            "tok-json",
            _with("bytelevel_bpe", _tj(_added(n))),
            {"inspect": 0, "*": 3},
            COMMANDS,
            names=("tokenizer.json", str(n)),
            extra=EXTRA,
        )
        for k, n in BIG_IDS
    ],
    *[
        Hostile(
            f"tok-json-added-{n}-chars",
            "tok-json",
            _with("bytelevel_bpe", _tj(_added(304, "y" * n))),
            {"add-tokens": 3, "*": 0},
            COMMANDS,
            names=("tokenizer.json", f"{n} characters", "10000"),
            extra=EXTRA,
        )
        for n in (30_000, 100_000)
    ],
    Hostile(
        "tok-json-not-utf8",
        "tok-json",
        _with("bytelevel_bpe", _not_utf8("tokenizer.json", b'"<|endoftext|>"', b'"<|end\xff|>"')),
        {"add-tokens": 3, "*": 0},
        COMMANDS,
        names=("tokenizer.json", "not UTF-8"),
        extra=EXTRA,
    ),
]


# ------------------------------------------------------------------------------------------------ tok-added
def _added_json(n: int) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        (ckpt / "added_tokens.json").write_text(json.dumps({"<big>": n}))

    return edit


def _decoder(n: int) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        d = json.loads((ckpt / "tokenizer_config.json").read_text())
        d["added_tokens_decoder"][str(n)] = {"content": "<big>", "special": True}
        (ckpt / "tokenizer_config.json").write_text(json.dumps(d))

    return edit


ADDED_CASES = [
    Hostile(
        f"tok-added-{where}-{k}",
        "tok-added",
        _with(tok, build(n)),
        {"inspect": 3 if len(str(n)) > 18 and where == "decoder" else 0, "*": 3},
        COMMANDS,
        names=(name, str(n)),
        extra=EXTRA,
    )
    for where, tok, build, name in (
        ("json", "wordpiece", _added_json, "added_tokens.json"),
        ("decoder", "sp_bpe", _decoder, "tokenizer_config.json"),
    )
    for k, n in (BIG_IDS[0], BIG_IDS[2], BIG_IDS[3])
]


# ------------------------------------------------------------------------------------------------ tok-text
def _no_unk(ckpt: Path) -> None:
    p = ckpt / "vocab.txt"
    p.write_text(p.read_text().replace("[UNK]\n", "[UMK]\n"))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # no unk_token: WordPiece's default
        c = json.loads((ckpt / name).read_text())
        c.pop("added_tokens_decoder", None)
        c.pop("unk_token", None)
        (ckpt / name).write_text(json.dumps(c))


def _append(name: str, blob: bytes) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        with open(ckpt / name, "ab") as f:
            f.write(blob)

    return edit


TEXT_CASES = [
    Hostile(
        "tok-text-vocab-txt-not-utf8",
        "tok-text",
        _with("wordpiece", _append("vocab.txt", b"\xff\xfe\n")),
        {"add-tokens": 3, "*": 0},
        COMMANDS,
        names=("vocab.txt", "not UTF-8"),
        extra=EXTRA,
    ),
    Hostile(
        "tok-text-merges-not-utf8",
        "tok-text",
        _with("gpt2_bpe", _append("merges.txt", b"\xff \xfe\n")),
        {"add-tokens": 3, "*": 0},
        COMMANDS,
        names=("merges.txt", "not UTF-8"),
        extra=EXTRA,
    ),
    Hostile(
        "tok-text-wordpiece-no-unk",
        "tok-text",
        _with("wordpiece", _no_unk),
        {"add-tokens": 3, "*": 0},
        COMMANDS,
        names=("vocab.txt", "[UNK]"),
        extra=EXTRA,
    ),
]


def _vocab_json(n: object) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        d = json.loads((ckpt / "vocab.json").read_text())
        d["zz"] = n
        (ckpt / "vocab.json").write_text(json.dumps(d))

    return edit


VOCAB_JSON_CASES = [
    Hostile(
        f"tok-text-vocab-json-id-{k}",
        "tok-text",
        _with("gpt2_bpe", _vocab_json(n)),
        {"add-tokens": 3, "resize": 3 if k == "2e9" else 0, "*": 0},
        COMMANDS,
        names=("vocab.json", str(n)),
        extra=EXTRA,
    )
    for k, n in (("2e9", 2_000_000_000), ("negative", -5))
]

CASES: list[Hostile] = SP_CASES + JSON_CASES + ADDED_CASES + TEXT_CASES + VOCAB_JSON_CASES
