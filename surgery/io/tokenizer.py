"""How many rows the tokenizer in a checkpoint folder needs (highest token id + 1), and the strings of given
token ids.

Reads (without any tokenizer library) ``tokenizer.json`` (``model.vocab`` and ``added_tokens``),
``vocab.txt`` (one token a line), ``vocab.json``, ``added_tokens.json`` and ``tokenizer_config.json``
(``added_tokens_decoder``). SentencePiece ``*.model`` files are not parsed; ``sources`` says what was read.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model.errors import CheckpointError
from . import store
from .regular import JSON_LIMIT, load_json, read_bounded


@dataclass(frozen=True)
class TokenizerInfo:
    """``size`` = highest token id + 1 over every file read (None when no tokenizer file was found)."""

    size: int | None
    sources: tuple[str, ...] = field(default=())
    unreadable: tuple[str, ...] = field(default=())


def _load(folder: Path, name: str) -> Any:
    """A tokenizer or config JSON file of ``folder``, parsed strictly (:func:`surgery.io.regular.load_json`);
    None when it is missing or not valid JSON (Checkpoint.open has already refused one that is not a
    regular file or cannot be read; a remote folder's file is read here the first time)."""
    try:
        return load_json(folder / name, name)
    except (CheckpointError, OSError):
        return None


def _vocab_lines(folder: Path) -> list[str] | None:
    """The lines of ``vocab.txt`` (bounded as a JSON file is), or None when missing or not UTF-8."""
    try:
        blob = read_bounded(folder / "vocab.txt", JSON_LIMIT, "vocab.txt")
        return list(io.TextIOWrapper(io.BytesIO(blob), encoding="utf-8"))  # lines as open() reads them
    except (CheckpointError, OSError, UnicodeDecodeError):
        return None


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
        if not (folder / name).is_file():
            return None
        data = _load(folder, name)
        if data is None:
            bad.append(name)
        return data

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
    if (folder / "vocab.txt").is_file():
        lines = _vocab_lines(folder)
        if lines is None:
            bad.append("vocab.txt")
        else:
            sources.append("vocab.txt")
            ids.append(len(lines) - 1)
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


# ------------------------------------------------------------------ token strings


def _token_sources(folder: Path):
    """``{id: token}`` mappings of the tokenizer files of ``folder``, most specific first: tokenizer.json's
    ``added_tokens`` and ``model.vocab`` (a ``{token: id}`` dict, or Unigram's ``[[piece, score], ...]``),
    vocab.json, vocab.txt (line i is token i), added_tokens.json, tokenizer_config.json's
    ``added_tokens_decoder``. Each is read only when the one before left ids unnamed."""

    def load(name: str):
        return _load(folder, name)

    tj = load("tokenizer.json")
    if isinstance(tj, dict):
        added = tj.get("added_tokens")
        if isinstance(added, list):
            yield {t.get("id"): t.get("content") for t in added if isinstance(t, dict)}
        vocab = tj.get("model", {}).get("vocab") if isinstance(tj.get("model"), dict) else None
        if isinstance(vocab, dict):
            yield {i: t for t, i in vocab.items()}
        elif isinstance(vocab, list):
            yield {i: p[0] for i, p in enumerate(vocab) if isinstance(p, list) and p}
    vj = load("vocab.json")
    if isinstance(vj, dict):
        yield {i: t for t, i in vj.items()}
    lines = _vocab_lines(folder)
    if lines is not None:
        yield {i: line.rstrip("\r\n") for i, line in enumerate(lines)}
    at = load("added_tokens.json")
    if isinstance(at, dict):
        yield {i: t for t, i in at.items()}
    tc = load("tokenizer_config.json")
    dec = tc.get("added_tokens_decoder") if isinstance(tc, dict) else None
    if isinstance(dec, dict):
        yield {int(i): t.get("content") for i, t in dec.items() if str(i).isdigit() and isinstance(t, dict)}


def token_strings(folder: Path, ids) -> dict[int, str]:
    """The token strings of ``ids`` that the tokenizer files of ``folder`` name (see :func:`_token_sources`;
    the first file naming an id wins), read with json alone (no tokenizer library). Ids no file names are
    left out; missing or unreadable files give ``{}``, never an error."""
    want: set[int] = set(ids)
    out: dict[int, str] = {}
    try:
        for mapping in _token_sources(store.path_of(folder)):
            for i in want - out.keys():
                t = mapping.get(i)
                if isinstance(t, str):
                    out[i] = t
            if out.keys() >= want:
                break
    except (AttributeError, TypeError, ValueError, KeyError, RecursionError, OSError):
        pass
    return out


# ------------------------------------------------------------------ special token ids

# keys that hold token ids: eos_token_id, pad_token_id, decoder_start_token_id, image_token_index,
# eos_token_ids (lists too), vision_start_token_id, ...
_ID_KEY = re.compile(r"token_(?:id|ids|index|idx)$")
ID_FILES = ("config.json", "generation_config.json", "tokenizer_config.json")


@dataclass(frozen=True)
class SpecialTokenId:
    """One token id a configuration file names: ``file`` (``config.json``...), ``key`` (dotted, e.g.
    ``text_config.eos_token_id``; ``eos_token`` when a tokenizer_config token string was resolved to its
    id) and the ``id``."""

    file: str
    key: str
    id: int

    def __str__(self) -> str:
        return f"{self.file} {self.key} = {self.id}"


def _id_values(v) -> list[int]:
    vals = v if isinstance(v, list) else [v]
    return [x for x in vals if isinstance(x, int) and not isinstance(x, bool) and x >= 0]


def _ids_in(data: dict, file: str, prefix: str = "") -> list[SpecialTokenId]:
    out: list[SpecialTokenId] = []
    for k, v in data.items():
        if not isinstance(k, str):
            continue
        if isinstance(v, dict) and not prefix:  # nested configs (text_config, ...), one level
            out += _ids_in(v, file, f"{k}.")
        elif _ID_KEY.search(k):
            out += [SpecialTokenId(file, prefix + k, i) for i in _id_values(v)]
    return out


def _resolved_token_strings(tc: dict) -> list[SpecialTokenId]:
    """tokenizer_config.json ``bos_token``/``eos_token``/... strings resolved through its
    ``added_tokens_decoder`` (``{"id": {"content": ...}}``)."""
    dec = tc.get("added_tokens_decoder")
    if not isinstance(dec, dict):
        return []
    by_content = {
        t.get("content"): int(i) for i, t in dec.items() if isinstance(t, dict) and str(i).isdigit()
    }
    out = []
    for k, v in tc.items():
        if not (isinstance(k, str) and k.endswith("_token")):
            continue
        content = v.get("content") if isinstance(v, dict) else v
        if isinstance(content, str) and content in by_content:
            out.append(SpecialTokenId("tokenizer_config.json", k, by_content[content]))
    return out


def _token_problem(v: Any) -> str | None:
    """Why ``v`` is not a value of a tokenizer_config.json ``*_token`` key (a string, null, an AddedToken
    object whose ``content`` is a string, as transformers/PaddleFormers write them, or true/false: the
    ``add_bos_token``/``add_eos_token`` flags end in ``_token`` too); None when it is one."""
    if v is None or isinstance(v, (str, bool)):
        return None
    if isinstance(v, dict):
        c = v.get("content")
        return None if isinstance(c, str) else "an object whose content is not a string"
    return "a list" if isinstance(v, list) else f"the number {v!r}" if isinstance(v, (int, float)) else "odd"


def check_tokenizer_config(data: Any, path: Any) -> None:
    """Refuse a tokenizer_config.json whose values tietool reads have the wrong type: each ``*_token``
    (``bos_token``, ``eos_token``, ...; :func:`_token_problem`) and each ``added_tokens_decoder`` entry
    (a decimal id → an object with a string ``content``). Not an object at all, or absent: nothing to check.

    Raises:
        CheckpointError: naming the file and the key.
    """
    if not isinstance(data, dict):
        return
    fix = "fix the value in tokenizer_config.json (save the tokenizer again with save_pretrained)"
    for k, v in data.items():
        problem = _token_problem(v) if k.endswith("_token") else None
        if problem:
            raise CheckpointError(
                f"tokenizer_config.json {k} is {problem}, expected a token string", path, fix
            )
    dec = data.get("added_tokens_decoder")
    if dec is None:
        return
    if not isinstance(dec, dict):
        raise CheckpointError("tokenizer_config.json added_tokens_decoder is not an object", path, fix)
    for i, t in dec.items():
        if not (i.isdigit() and i.isascii() and len(i) <= 18):
            raise CheckpointError(
                f"tokenizer_config.json added_tokens_decoder key {i[:40]!r} is not a token id", path, fix
            )
        problem = _token_problem(t) if isinstance(t, dict) else "not an object"
        if problem:
            raise CheckpointError(f"tokenizer_config.json added_tokens_decoder {i} is {problem}", path, fix)


def special_token_ids(folder: Path) -> tuple[SpecialTokenId, ...]:
    """Every token id named in the checkpoint's config.json, generation_config.json and
    tokenizer_config.json (``*_token_id``/``*_token_ids``/``*_token_index`` keys, at the top level and in
    nested configs; tokenizer_config token strings resolved through ``added_tokens_decoder``). A file that
    is missing or unreadable contributes nothing (its problems are reported elsewhere)."""
    out: list[SpecialTokenId] = []
    for name in ID_FILES:
        data = _load(folder, name)
        if name == "tokenizer_config.json":
            check_tokenizer_config(data, folder / name)
        if isinstance(data, dict):
            out += _ids_in(data, name)
            if name == "tokenizer_config.json":
                out += _resolved_token_strings(data)
    return tuple(dict.fromkeys(out))
