"""How a folder's tokenizer splits the text of some of its own tokens when those tokens are taken out of it
(``fix-untrained --init subtokens``): :func:`splits_without`.

The tokens are taken out of a copy in memory, the ids of every other token unchanged: from
``tokenizer.json`` their ``added_tokens`` entries, and in its model their vocabulary entry renamed to a
string no text contains (a BPE's merges making or using it dropped); in a SentencePiece model their pieces
made ``UNUSED`` (never produced by encoding). The text of a token is its string as the tokenizer decodes it
(``tokenizers`` ``decode``; a SentencePiece piece with ``▁`` as a space). Other formats (``vocab.txt``,
``vocab.json``) give no split: the caller falls back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .regular import JSON_LIMIT, read_bounded
from .tokenizer import sp_names
from .tokenizer_folder import import_lib

UNKNOWN, UNUSED = 2, 5  # sentencepiece_model.proto SentencePiece.Type
GONE = "\ufffe{}\ufffe"  # a vocabulary string no text contains (U+FFFE is a noncharacter)


def splits_without(folder: Path, ids: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """``{id: the ids the folder's tokenizer splits the id's text into without the tokens ids}`` for each
    of ``ids`` (``add_special_tokens=False``); ``{}`` when the folder has neither ``tokenizer.json`` nor a
    SentencePiece model.

    Raises:
        TietoolError: ``tokenizers`` / ``sentencepiece`` missing (the ``tokenizer`` extra).
    """
    root = Path(folder)
    if (root / "tokenizer.json").is_file():
        return _json_splits(root / "tokenizer.json", set(ids))
    for name in sp_names(root):
        if (root / name).is_file():
            return _sp_splits(root / name, set(ids))
    return {}


def _json_splits(path: Path, ids: set[int]) -> dict[int, tuple[int, ...]]:
    tk = import_lib("tokenizers")
    text = read_bounded(path, JSON_LIMIT).decode("utf-8")
    old = tk.Tokenizer.from_str(text)
    texts = {i: old.decode([i], skip_special_tokens=False) for i in sorted(ids)}
    tj: dict[str, Any] = json.loads(text)
    tj["added_tokens"] = [a for a in tj.get("added_tokens") or [] if a.get("id") not in ids]
    _drop_from_model(tj.get("model") or {}, ids)
    new = tk.Tokenizer.from_str(json.dumps(tj))
    enc = new.encode_batch([texts[i] for i in texts], add_special_tokens=False) if texts else []
    return {i: tuple(e.ids) if texts[i] else () for i, e in zip(texts, enc, strict=True)}


def _drop_from_model(model: dict[str, Any], ids: set[int]) -> None:
    """Rename the tokens ``ids`` of a ``tokenizer.json`` model to strings no text contains (their ids kept);
    a BPE's merges making or using them dropped."""
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [piece, score] at each id
        for i in ids:
            if i < len(vocab):
                vocab[i] = [GONE.format(i), vocab[i][1]]
        return
    if not isinstance(vocab, dict):
        return
    gone = {t for t, i in vocab.items() if i in ids}
    model["vocab"] = {(GONE.format(i) if t in gone else t): i for t, i in vocab.items()}
    if model.get("type") == "BPE":
        p = model.get("continuing_subword_prefix") or ""

        def keeps(m: Any) -> bool:
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            made = a + (b[len(p) :] if p and b.startswith(p) else b)
            return not ({a, b, made} & gone)

        model["merges"] = [m for m in model.get("merges") or [] if keeps(m)]


def _sp_splits(path: Path, ids: set[int]) -> dict[int, tuple[int, ...]]:
    pb = import_lib("sentencepiece.sentencepiece_model_pb2")
    spm = import_lib("sentencepiece")
    m = pb.ModelProto()
    m.ParseFromString(path.read_bytes())
    texts = {
        i: m.pieces[i].piece.replace("▁", " ")
        for i in sorted(ids)
        if i < len(m.pieces) and m.pieces[i].type != UNKNOWN  # the unknown piece must stay
    }
    for i in texts:
        m.pieces[i].type = UNUSED
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    enc = sp.encode([texts[i] for i in texts]) if texts else []
    return {i: tuple(e) if texts[i].strip() else () for i, e in zip(texts, enc, strict=True)}
