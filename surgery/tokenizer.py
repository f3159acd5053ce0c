"""How many rows the tokenizer in a checkpoint folder needs: highest token id + 1.

Reads (without any tokenizer library) ``tokenizer.json`` (``model.vocab`` and ``added_tokens``),
``vocab.txt`` (one token a line), ``vocab.json``, ``added_tokens.json`` and ``tokenizer_config.json``
(``added_tokens_decoder``). SentencePiece ``*.model`` files are not parsed; ``sources`` says what was read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class TokenizerInfo:
    """``size`` = highest token id + 1 over every file read (None when no tokenizer file was found)."""

    size: int | None
    sources: tuple[str, ...] = field(default=())
    unreadable: tuple[str, ...] = field(default=())


def _ids(obj) -> list[int]:
    return [int(v) for v in obj if isinstance(v, int) or (isinstance(v, str) and v.isdigit())]


def tokenizer_info(folder: Path) -> TokenizerInfo:
    """Highest token id + 1 found in the tokenizer files of ``folder``; never raises on a bad file (an
    unexpected structure makes that file count as unreadable)."""
    try:
        return _tokenizer_info(folder)
    except (AttributeError, TypeError, ValueError, KeyError, RecursionError, OSError):
        return TokenizerInfo(None, (), ("tokenizer files (unexpected structure)",))


def _tokenizer_info(folder: Path) -> TokenizerInfo:
    ids: list[int] = []
    sources: list[str] = []
    bad: list[str] = []

    def load(name: str):
        p = folder / name
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            bad.append(name)
            return None

    tj = load("tokenizer.json")
    if isinstance(tj, dict):
        sources.append("tokenizer.json")
        model = tj.get("model")
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if isinstance(vocab, dict):
            ids += _ids(vocab.values())
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            ids.append(len(vocab) - 1)
        added = tj.get("added_tokens")
        if isinstance(added, list):
            ids += _ids(t.get("id") for t in added if isinstance(t, dict))
    vj = load("vocab.json")
    if isinstance(vj, dict):
        sources.append("vocab.json")
        ids += _ids(vj.values())
    vt = folder / "vocab.txt"
    if vt.is_file():
        try:
            n = sum(1 for _ in vt.open(encoding="utf-8"))
            sources.append("vocab.txt")
            ids.append(n - 1)
        except (OSError, UnicodeDecodeError):
            bad.append("vocab.txt")
    at = load("added_tokens.json")
    if isinstance(at, dict):
        sources.append("added_tokens.json")
        ids += _ids(at.values())
    tc = load("tokenizer_config.json")
    if isinstance(tc, dict) and isinstance(tc.get("added_tokens_decoder"), dict):
        sources.append("tokenizer_config.json")
        ids += _ids(tc["added_tokens_decoder"].keys())
    size = max(ids) + 1 if ids else None
    return TokenizerInfo(size, tuple(sources), tuple(bad))
