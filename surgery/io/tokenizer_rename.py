"""Reuse reserved tokens: give a reserved or unused token's id a new string, in every tokenizer file of a
folder, without new ids (``rename-tokens``).

:func:`rename_tokens_edit` returns a :class:`~surgery.model.tokens.TokenEdit` of the same length whose
``files`` are the new bytes of each file it changes. Per file: ``tokenizer.json`` (its ``added_tokens``
entry, the model's vocabulary entry; an entry added when the slot was only in the vocabulary),
SentencePiece ``*.model`` (the piece, typed ``CONTROL`` when special, else ``USER_DEFINED``), ``vocab.txt``
(the line), ``vocab.json``, ``tokenizer_config.json`` (``added_tokens_decoder``; the special-token lists),
``added_tokens.json``, ``special_tokens_map.json``. What each library then does is data with its proving
test: :data:`RENAME_FACTS`. The slots it takes are those whose string is a reserved token by
:data:`RESERVED` (the patterns unsloth-zoo's ``POSSIBLE_RESERVED_TOKENS`` lists, and ERNIE/BERT's
``[unusedN]``); an id beyond the tokenizer (a slack row) is add-tokens' to give.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..model.errors import Opt, RefusedError, TietoolError, UsageError
from ..model.extras import install_extra
from ..model.tokens import NewToken, TokenEdit, TokenizerFormat
from .regular import JSON_LIMIT, read_bounded
from .tokenizer import tiktoken_files, tokenizer_set, vocabulary
from .tokenizer_check import MAX_TOKEN_CHARS
from .tokenizer_loaders import TokenizerLoader, control_piece_warning

RESERVED = (
    r"<\|reserved_special_token_\d+\|>",  # Llama-3
    r"<\|reserved_\d+\|>",
    r"\[unused\d+\]",  # BERT, ERNIE 1.0/3.0 vocab.txt
    r"<unused\d+>",  # Gemma, PaliGemma
    r"<\|placeholder\d+\|>",  # Phi-3
    r"\[control_\d+\]",  # Mistral
    r"<SPECIAL_\d+>",  # Pixtral
    r"\|<EXTRA_TOKENS_\d+>\|",  # Molmo
)
"""The strings of reserved/unused slots a model ships untrained (unsloth-zoo ``tokenizer_utils
.POSSIBLE_RESERVED_TOKENS`` and the vocab.txt ``[unusedN]`` lines of BERT/ERNIE)."""

_F, _L = TokenizerFormat, TokenizerLoader
_PROOF = "tests/oracles/test_rename_tokens.py::test_rename_fact"
RENAME_FACTS: Mapping[tuple[TokenizerFormat, TokenizerLoader], str] = {
    (f, ld): f"{_PROOF}[{f.value}-{ld.value}]"
    for f, ld in (
        (_F.TOKENIZER_JSON, _L.TOKENIZERS),
        (_F.TOKENIZER_JSON, _L.TRANSFORMERS),
        (_F.TOKENIZER_JSON, _L.PADDLEFORMERS),
        (_F.SENTENCEPIECE, _L.SENTENCEPIECE),
        (_F.SENTENCEPIECE, _L.TRANSFORMERS),
        (_F.SENTENCEPIECE, _L.PADDLEFORMERS),
        (_F.SENTENCEPIECE, _L.PADDLENLP_28),
        (_F.WORDPIECE, _L.TRANSFORMERS),
        (_F.WORDPIECE, _L.PADDLEFORMERS),
        (_F.WORDPIECE, _L.PADDLENLP_28),
        (_F.GPT2_BPE, _L.TRANSFORMERS),
        (_F.GPT2_BPE, _L.PADDLEFORMERS),
        (_F.GPT2_BPE, _L.PADDLENLP_28),
    )
}
"""(format, loader) → the pytest node id that proved it: the loader encodes a renamed slot's new string to
its id (alone and inside text) and no longer yields the old string; a pair absent here is not claimed."""

_JSON_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_SP = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "sentencepiece.model")


def is_reserved(s: str) -> bool:
    """Whether ``s`` is the string of a reserved slot (:data:`RESERVED`)."""
    return any(re.fullmatch(p, s) for p in RESERVED)


def parse_renames(items: list[str]) -> dict[int, str]:
    """``["128002=<think>", "128003=</think>"]`` → ``{128002: "<think>", 128003: "</think>"}``.

    Raises:
        UsageError: an item that is not ``ID=STRING``, an id or a string twice (two ids of one string:
            ``tokenizers`` then keeps one and leaves the other id without a token), an empty or over-long
            string, a string with a lone surrogate (a non-UTF-8 byte of an argument: no file can hold it).
    """
    out: dict[int, str] = {}
    for item in items:
        i, sep, s = item.partition("=")
        if not sep or not i.strip().isdigit() or not s:
            raise UsageError(f"{item!r} is not ID=TOKEN", fix="e.g. 128002=<think>")
        if int(i) in out:
            raise UsageError(f"id {int(i)} is given twice", fix="give each id once")
        if len(s) > MAX_TOKEN_CHARS:
            raise UsageError(
                f"token {s[:40]!r}… is longer than {MAX_TOKEN_CHARS} characters", fix="shorten it"
            )
        if s in out.values():
            raise UsageError(
                f"token {s!r} is given twice (ids {_id_of(out, s)} and {int(i)})", fix="give each token once"
            )
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise UsageError(
                f"token {s[:40]!r} is not valid Unicode text: character {e.start} is a lone surrogate, which "
                "no UTF-8 tokenizer file can hold",
                fix="give the token as UTF-8 text",
            ) from None
        out[int(i)] = s
    if not out:
        raise UsageError("rename-tokens needs at least one ID=TOKEN", fix="e.g. 128002=<think>")
    return out


def _id_of(renames: dict[int, str], s: str) -> int:
    return next(i for i, t in renames.items() if t == s)


def _load(path: Path) -> Any:
    return json.loads(read_bounded(path, JSON_LIMIT))


def _dump(original: str, data: Any) -> bytes:
    """``data`` as JSON with the original file's indent (2 when it cannot be told), a final newline if the
    original had one."""
    m = re.search(r"\n( +)\S", original)
    text = json.dumps(data, indent=len(m.group(1)) if m else 2, ensure_ascii=False)
    return (text + ("\n" if original.endswith("\n") else "")).encode()


def _check(folder: Path, renames: dict[int, str]) -> dict[int, str]:
    """``{id: old string}`` of the slots, each checked: named by the files, a reserved string, not a
    special token the configs name (bos/eos/pad...), the new string not a token already.

    Raises:
        RefusedError: naming the id and why, or a folder whose files disagree.
    """
    tik = tiktoken_files(folder)
    if tik:
        raise RefusedError(
            f"rename-tokens refused: {tik[0]} is a tiktoken rank file, which tietool cannot edit; nothing "
            "was written",
            folder / tik[0],
            "rename the tokens with the tokenizer's own code",
        )
    ts = tokenizer_set(folder)
    if ts.disagreements or ts.unsupported:
        why = (ts.disagreements or [f"{', '.join(ts.unsupported)} cannot be edited"])[0]
        raise RefusedError(f"rename-tokens refused: {why}", folder, "save the tokenizer again, then rename")
    vocab = vocabulary(folder)
    if not vocab:
        raise RefusedError(
            "rename-tokens refused: the checkpoint has no tokenizer files to rename tokens in",
            folder,
            "copy the model's tokenizer files into the folder, then rename",
        )
    have = {s: i for i, s in vocab.items()}
    named = _named_tokens(folder)
    old: dict[int, str] = {}
    for i, new in renames.items():
        s = vocab.get(i)
        fix = "pick a reserved slot (<|reserved_special_token_N|>, [unusedN], ...); add-tokens gives new ids"
        if s is None:
            raise RefusedError(f"rename-tokens refused: id {i} is not a token of the tokenizer", folder, fix)
        if not is_reserved(s) or s in named:
            raise RefusedError(
                f"rename-tokens refused: id {i} is {s!r}, not a reserved slot (text may use it)", folder, fix
            )
        if new in have and have[new] != i:
            raise RefusedError(
                f"rename-tokens refused: {new!r} already is token {have[new]}", folder, "use that id"
            )
        old[i] = s
    return old


def _named_tokens(folder: Path) -> set[str]:
    """The strings tokenizer_config.json / special_tokens_map.json name as bos/eos/unk/pad/... tokens."""
    out: set[str] = set()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        p = folder / name
        data = _load(p) if p.is_file() else None
        for k, v in (data or {}).items() if isinstance(data, dict) else ():
            v = v.get("content") if isinstance(v, dict) else v
            if k.endswith("_token") and isinstance(v, str):
                out.add(v)
    return out


def rename_tokens_edit(folder: Path, renames: dict[int, str], special: bool = False) -> TokenEdit:
    """The edit that gives each id of ``renames`` its new string in every tokenizer file of ``folder``
    (module docstring); ``special``: the tokens become special (never split; ``CONTROL`` pieces).

    Raises:
        RefusedError: a slot that is not reserved (:func:`_check`), a vocab.json / tokenizer.json whose
            merges use the old string, a plain token in a vocab.txt slot (word-piece splitting would never
            produce it: ``--special``), a folder whose files disagree.
    """
    if not renames:
        n = tokenizer_set(folder).length or 0
        return TokenEdit(n, n)
    old = _check(folder, renames)
    files: dict[str, bytes] = {}
    for name in ("tokenizer.json", "vocab.json"):
        if (folder / name).is_file():
            files[name] = _json_model(folder / name, old, renames, special)
    sp = next((folder / n for n in _SP if (folder / n).is_file()), None)
    if sp is not None:
        files[sp.name] = _sp_model(sp, old, renames, special)
    if (folder / "vocab.txt").is_file():
        files["vocab.txt"] = _vocab_txt(folder / "vocab.txt", old, renames, special)
    for name in _JSON_FILES:
        if (folder / name).is_file():
            files[name] = _json_lists(folder / name, old, renames, special)
    originals = {n: (folder / n).read_bytes() for n in files}
    files = {n: b for n, b in files.items() if b != originals[n]}
    n = tokenizer_set(folder).length or 0
    tokens = tuple(NewToken(renames[i], i, special, False) for i in sorted(renames))
    control = [renames[i] for i in sorted(renames)] if special and sp is not None and sp.name in files else []
    warning = control_piece_warning(sp.name if sp is not None else "", control)
    return TokenEdit(n, n, tokens, (), files, (warning,) if warning else ())


def _json_model(path: Path, old: dict[int, str], new: dict[int, str], special: bool) -> bytes:
    """tokenizer.json (``added_tokens`` and ``model.vocab``) or vocab.json (the vocabulary itself)."""
    text = path.read_text(encoding="utf-8")
    data = _load(path)
    model = data.get("model", {}) if path.name == "tokenizer.json" else {"vocab": data}
    _refuse_merged(path, model, old)
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        renamed = {new[v] if v in old and old[v] == k else k: v for k, v in vocab.items()}
        vocab.clear()
        vocab.update(renamed)
    elif isinstance(vocab, list):
        for i, s in old.items():
            if i < len(vocab) and isinstance(vocab[i], list) and vocab[i][0] == s:
                vocab[i][0] = new[i]
    if path.name == "tokenizer.json":
        _added_entries(data, old, new, special)
    return _dump(text, data)


def _refuse_merged(path: Path, model: dict, old: dict[int, str]) -> None:
    """Refuse a BPE model whose merges use a slot's string (renaming it would change how text merges)."""
    merges = model.get("merges")
    if path.name == "vocab.json":
        m = path.parent / "merges.txt"
        merges = m.read_text(encoding="utf-8").splitlines() if m.is_file() else []
    parts = {p for mg in merges or [] for p in (mg.split(" ") if isinstance(mg, str) else mg)}
    used = sorted(s for s in old.values() if s in parts)
    if used:
        raise RefusedError(
            f"rename-tokens refused: {path.name}'s merges use {used[0]!r}", path, "pick another reserved slot"
        )


def _added_entries(data: dict, old: dict[int, str], new: dict[int, str], special: bool) -> None:
    """tokenizer.json ``added_tokens``: each slot's entry renamed and flagged, or added (by id order)."""
    added = data.setdefault("added_tokens", [])
    seen = set()
    for t in added:
        if t.get("id") in old:
            t.update(content=new[t["id"]], special=special, normalized=not special)
            seen.add(t["id"])
    for i in sorted(set(old) - seen):
        added.append(
            {
                "id": i,
                "content": new[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": not special,
                "special": special,
            }
        )
    added.sort(key=lambda t: t.get("id", 0))


def _sp_model(path: Path, old: dict[int, str], new: dict[int, str], special: bool) -> bytes:
    """The SentencePiece model with each slot's piece renamed and typed CONTROL (special) or
    USER_DEFINED."""
    try:
        pb: Any = importlib.import_module("sentencepiece.sentencepiece_model_pb2")
    except ImportError:
        raise TietoolError(
            f"{path.name} needs the sentencepiece library", path, install_extra("tokenizer")
        ) from None
    m = pb.ModelProto()
    m.ParseFromString(path.read_bytes())
    kind = pb.ModelProto.SentencePiece.CONTROL if special else pb.ModelProto.SentencePiece.USER_DEFINED
    for i, s in old.items():
        if i < len(m.pieces) and m.pieces[i].piece == s:
            m.pieces[i].piece = new[i]
            m.pieces[i].type = kind
    return bytes(m.SerializeToString())


def _vocab_txt(path: Path, old: dict[int, str], new: dict[int, str], special: bool) -> bytes:
    """vocab.txt with each slot's line renamed (a special token only: text is word-piece split before
    the vocabulary is looked up, so only a never-split special token reaches its line)."""
    raw = path.read_bytes()
    lines = raw.decode("utf-8").split("\n")
    bad = next((t for t in new.values() if t != t.rstrip() or len(t.splitlines()) != 1), None)
    if bad is not None:
        raise RefusedError(
            f"rename-tokens refused: {bad!r} cannot be a line of vocab.txt: transformers and PaddleFormers "
            "read vocab.txt a line a token and drop trailing whitespace, so a line break or trailing space "
            "would move it and every later id",
            path,
            "give the token without line breaks or trailing whitespace",
        )
    for i, s in old.items():
        if i < len(lines) and lines[i].rstrip("\r") == s:
            if not special:
                raise RefusedError(
                    f"rename-tokens refused: {s!r} is a line of vocab.txt; a plain token there is never "
                    "produced from text (the tokenizer splits it into word pieces first)",
                    path,
                    f"rename it as a special token ({Opt('special')})",
                )
            lines[i] = new[i] + ("\r" if lines[i].endswith("\r") else "")
    return "\n".join(lines).encode("utf-8")


def _json_lists(path: Path, old: dict[int, str], new: dict[int, str], special: bool) -> bytes:
    """tokenizer_config.json (``added_tokens_decoder``, special lists), special_tokens_map.json,
    added_tokens.json: each old string replaced; a special token listed in ``additional_special_tokens``
    (appended where missing, so slow tokenizers never split it)."""
    text = path.read_text(encoding="utf-8")
    data = _load(path)
    if not isinstance(data, dict):
        return text.encode()
    by_old = {s: new[i] for i, s in old.items()}
    if path.name == "added_tokens.json":
        data = {by_old.get(k, k): v for k, v in data.items()}
        return _dump(text, data)
    dec = data.get("added_tokens_decoder")
    if isinstance(dec, dict):
        for i in old:
            entry = dec.get(str(i))
            if isinstance(entry, dict):
                entry.update(content=new[i], special=special, normalized=not special)
            elif path.name == "tokenizer_config.json":
                dec[str(i)] = _decoder_entry(new[i], special)
        data["added_tokens_decoder"] = dict(sorted(dec.items(), key=lambda kv: int(kv[0])))
    for key in ("additional_special_tokens", "extra_special_tokens"):
        lst = data.get(key)
        if isinstance(lst, list):
            data[key] = [by_old.get(x, x) if isinstance(x, str) else x for x in lst]
    if special:
        lst = data.get("additional_special_tokens")
        lst = lst if isinstance(lst, list) else []
        data["additional_special_tokens"] = lst + [s for s in by_old.values() if s not in lst]
    return _dump(text, data)


def _decoder_entry(content: str, special: bool) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": not special,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }
