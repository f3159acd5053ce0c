"""Checks of tokenizer files before a tokenizer library is handed them (:mod:`surgery.io.tokenizer_edit`).

``tokenizers`` and ``sentencepiece`` are native code: on some inputs they allocate a table to the highest id
a file names (``tokenizers`` 0.22.2 aborts the process, ``memory allocation of 4294967296 bytes failed``, on
a ``model.vocab`` id of 2*10^9), take time quadratic in a token's length (``AddedVocabulary``), or raise
their own errors after logging to the process's stderr (``sentencepiece`` 0.2.x: ``piece must not be
empty``, ``unk is not defined``, ``Trie data size exceeds the input blob size``). Every check here raises
:class:`CheckpointError` (exit 3) naming the file, what is wrong and the limit broken, before the library
runs; what the library still rejects is caught and reported the same way, its log silenced
(:func:`surgery.io.tokenizer.quiet_stderr`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..model.errors import CheckpointError
from .regular import JSON_LIMIT, read_bounded
from .tokenizer import GAP_LIMIT, quiet_stderr

# the longest token add-tokens writes, in characters: tokenizers' AddedVocabulary is quadratic in a token's
# length (tokenizers 0.22.2, the sample's tokenizer.json, one token of 'y' * n: n = 10,000 takes 0.39 s to add
# and 0.29 s more on every Tokenizer.from_file; n = 100,000 takes 32.6 s to add and 28.7 s on every load).
# The tokens of the input's own files are held to it too (a 30,000-character added token hung add-tokens).
MAX_TOKEN_CHARS = 10_000

_RESAVE = "save the tokenizer again with save_pretrained (or restore the file from the model's release)"


def _shown(s: str) -> str:
    return repr(s if len(s) <= 40 else s[:40] + "...")


def read_text(path: Any, name: str) -> str:
    """The text of a tokenizer file, which must be UTF-8 (every loader reads them so).

    Raises:
        CheckpointError: the file is not UTF-8 (naming the byte offset).
    """
    blob = read_bounded(path, JSON_LIMIT, name)
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{name} is not UTF-8 text (byte {e.start}: {e.reason})", path, _RESAVE
        ) from None


def _check_id(name: str, where: str, i: Any, limit: int, path: Any) -> None:
    name = f"{name} {where}" if where else name
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise CheckpointError(f"{name} has the id {str(i)[:40]!r}, not a token id", path, _RESAVE)
    if i >= limit + GAP_LIMIT:
        raise CheckpointError(
            f"{name} has the id {i}, beyond its own {limit} tokens + {GAP_LIMIT} unnamed ids (a "
            "higher one would make the tokenizer library allocate a table to it)",
            path,
            _RESAVE,
        )


def _check_token(name: str, where: str, s: Any, path: Any) -> None:
    name = f"{name} {where}" if where else name
    if not isinstance(s, str):
        raise CheckpointError(f"{name} has a token that is not a string", path, _RESAVE)
    if len(s) > MAX_TOKEN_CHARS:
        raise CheckpointError(
            f"{name} has the token {_shown(s)} of {len(s)} characters, more than tietool reads "
            f"({MAX_TOKEN_CHARS}: tokenizers takes time quadratic in a token's length)",
            path,
            _RESAVE,
        )


def check_tokenizer_json(data: Any, path: Any) -> None:
    """tokenizer.json's ``model.vocab`` (a ``{token: id}`` dict or Unigram's ``[[piece, score], ...]``) and
    ``added_tokens``: every id an int below the file's own size (``len(model.vocab) + len(added_tokens)``),
    (plus :data:`surgery.io.tokenizer.GAP_LIMIT` unnamed ids: a smaller gap is refused by name later), every
    token a string of at most :data:`MAX_TOKEN_CHARS` characters.

    Raises:
        CheckpointError: naming tokenizer.json, the part, the id or token and the limit.
    """
    name = "tokenizer.json"
    if not isinstance(data, dict):
        raise CheckpointError(f"{name} is not a JSON object", path, _RESAVE)
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    added = data.get("added_tokens")
    added = added if isinstance(added, list) else []
    size = (len(vocab) if isinstance(vocab, (dict, list)) else 0) + len(added)
    if isinstance(vocab, dict):
        for s, i in vocab.items():
            _check_token(name, "model.vocab", s, path)
            _check_id(name, "model.vocab", i, size, path)
    elif isinstance(vocab, list):
        for p in vocab:
            if isinstance(p, list) and p:
                _check_token(name, "model.vocab", p[0], path)
    for t in added:
        if not isinstance(t, dict):
            raise CheckpointError(f"{name} added_tokens has an entry that is not an object", path, _RESAVE)
        _check_token(name, "added_tokens", t.get("content"), path)
        _check_id(name, "added_tokens", t.get("id"), size, path)


def check_vocab_json(data: Any, path: Any) -> None:
    """``vocab.json`` (beside ``merges.txt``): a ``{token: id}`` object whose ids are ints below its own
    size plus :data:`surgery.io.tokenizer.GAP_LIMIT`, tokens of at most :data:`MAX_TOKEN_CHARS` characters
    (``tokenizers``' BPE refuses a negative id with an error of its own, and sizes by the highest).

    Raises:
        CheckpointError: naming vocab.json, the id or token and the limit.
    """
    if not isinstance(data, dict):
        raise CheckpointError("vocab.json is not a JSON object", path, _RESAVE)
    for s, i in data.items():
        _check_token("vocab.json", "", s, path)
        _check_id("vocab.json", "", i, len(data), path)


def check_added_ids(name: str, tokens: Iterable[tuple[int, str]], base: int, path: Any) -> None:
    """The added tokens one file lists (``added_tokens.json``, ``added_tokens_decoder``): ids below
    ``base + len(tokens)`` (a contiguous tokenizer numbers them from the base vocabulary on, so no real one
    goes past: ``len(tokenizer) + count``) plus :data:`surgery.io.tokenizer.GAP_LIMIT` unnamed ids (a smaller
    gap is refused by name later, listing its ids), contents of at most :data:`MAX_TOKEN_CHARS` characters.

    Raises:
        CheckpointError: naming the file, the id or token and the limit.
    """
    tokens = list(tokens)
    limit = base + len(tokens) + GAP_LIMIT
    for i, s in tokens:
        _check_token(name, "", s, path)
        if i >= limit:
            raise CheckpointError(
                f"{name} has the added-token id {i}, beyond {limit} (the {base} base tokens + its "
                f"{len(tokens)} entries + {GAP_LIMIT} unnamed ids: a higher one would size the tables by it)",
                path,
                _RESAVE,
            )


def _sp_problem(m: Any) -> str | None:
    """What is wrong with a SentencePiece ``ModelProto`` before ``sentencepiece`` reads it (its own
    checks, done here with a clear message), or None."""
    pieces = m.pieces
    if not pieces:
        return "has no pieces"
    seen: dict[str, int] = {}
    unk = 0
    for i, p in enumerate(pieces):
        s = p.piece
        if not isinstance(s, str):  # protobuf gives the bytes of a proto2 string that is not UTF-8
            return f"piece {i} is not UTF-8 text"
        if s == "":
            return f"piece {i} is empty"
        if "\0" in s:
            return f"piece {i} {_shown(s)} holds a NUL character"
        if len(s) > MAX_TOKEN_CHARS:
            return f"piece {i} has {len(s)} characters, more than tietool reads ({MAX_TOKEN_CHARS})"
        if s in seen:
            return f"pieces {seen[s]} and {i} are both {_shown(s)}"
        seen[s] = i
        if not math.isfinite(p.score):
            return f"piece {i} {_shown(s)} has the score {p.score}"
        unk += p.type == p.UNKNOWN
    return None if unk == 1 else f"has {unk} unknown (unk) pieces, not one"


def check_sp_model(m: Any, name: str, path: Any) -> Any:
    """Check a parsed SentencePiece model (:func:`_sp_problem`), then load it with ``sentencepiece``
    (its log silenced) and return the ``SentencePieceProcessor``.

    Raises:
        CheckpointError: naming the file and the problem (sentencepiece's own message when it refuses).
    """
    problem = _sp_problem(m)
    if problem is None:
        import sentencepiece as spm  # the tokenizer extra (the caller imported it already)

        try:
            with quiet_stderr():
                return spm.SentencePieceProcessor(model_proto=m.SerializeToString())
        except Exception as e:  # noqa: BLE001 - sentencepiece raises RuntimeError / OSError / ValueError
            problem = f"is refused by sentencepiece ({str(e).replace('INTERNAL: ', '').strip()[:200]})"
    raise CheckpointError(f"{name} {problem}", path, _RESAVE)


def check_wordpiece_unk(vocab: dict[str, int], unk: str, path: Any) -> None:
    """A WordPiece ``vocab.txt`` must hold its unknown token (``tokenizer_config.json``'s ``unk_token``,
    ``[UNK]`` by default): tokenizers' WordPiece fails on the first word it cannot split without it.

    Raises:
        CheckpointError: naming vocab.txt and the token.
    """
    if unk not in vocab:
        raise CheckpointError(
            f"vocab.txt has no line {_shown(unk)}, the unknown token (tokenizer_config.json unk_token) every "
            "WordPiece loader needs",
            path,
            "add the unknown token to vocab.txt, or set unk_token to a token it has",
        )
