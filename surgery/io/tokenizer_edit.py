"""Edits of every tokenizer file of a folder, computed before anything is written: add tokens, remove added
ones.

:func:`add_tokens_edit` and :func:`remove_tokens_edit` return a :class:`~surgery.model.tokens.TokenEdit`
whose ``files`` are the new bytes of each file they change; the caller writes them (beside the model's rows).
The files and the libraries that edit them:

* ``tokenizer.json``: the ``tokenizers`` library (``Tokenizer.from_str``, ``add_tokens`` /
  ``add_special_tokens`` set the ``AddedToken`` flags, as transformers' fast ``add_tokens`` calls them);
  written with ``to_str(pretty=True)``, which reproduces a file ``tokenizers`` wrote byte for byte (checked on
  the test tokenizers); any other file keeps its JSON and only ``added_tokens`` is replaced.
* SentencePiece ``*.model``: ``sentencepiece_model_pb2.ModelProto`` (sentencepiece_model.proto): new pieces
  appended as ``USER_DEFINED`` (``CONTROL`` for special tokens), score 0, in HF-style folders; a folder that
  keeps its added tokens outside the model (PaddleNLP's, :func:`_outside`) keeps it unchanged.
* ``vocab.txt`` (WordPiece) and ``vocab.json`` + ``merges.txt`` are never extended (only cut by a trim): the
  slow tokenizers that read them (PaddleNLP 2.8.1's above all) take added tokens from ``added_tokens.json``,
  created and listed in id order (:func:`_lists_added_json`).
* ``tokenizer_config.json`` (``added_tokens_decoder``, ``additional_special_tokens`` /
  ``extra_special_tokens``), ``added_tokens.json``, ``special_tokens_map.json``: JSON, key order and indent
  kept.

What each library then does with the new tokens is data with its proving tests:
:mod:`surgery.io.tokenizer_loaders`.

Libraries are imported lazily (the ``tokenizer`` extra); a folder that needs one that is missing gets a
:class:`TietoolError` saying ``pip install ".[tokenizer]"``.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from ..model.errors import Opt, RefusedError, TietoolError, UsageError
from ..model.tokens import AddedToken, NewToken, TokenEdit, TokenizerFormat
from . import surface
from .tokenizer_check import MAX_TOKEN_CHARS
from .tokenizer_folder import (
    ADDED_JSON,
    CONFIG,
    SPECIAL_MAP,
    TokenizerFolder,
    import_lib,
    json_tokenizer,
    scan_folder,
    splitter,
    text_lines,
    tokenizer_from_str,
)
from .tokenizer_loaders import AddedTokensIn, control_piece_warning, unseen_by

# ------------------------------------------------------------------ add


def _plan_tokens(
    f: TokenizerFolder, strings, special: bool
) -> tuple[list[NewToken], list[AddedToken], list[str]]:
    """The NewToken of each string (in order), the existing tokens to mark special, and the warnings (a
    string stored lower-cased, an added plain token marked special)."""
    ids, split = f.ids(), splitter(f)
    out: list[NewToken] = []
    marks: list[AddedToken] = []
    warnings: list[str] = []
    next_id = f.length
    for asked in strings:
        if not isinstance(asked, str) or asked == "":
            raise TietoolError(f"a token to add must be a non-empty string, not {asked!r}", f.root)
        _refuse_unencodable(f, asked)
        s = _matched_form(f, asked, special)
        if s != asked:
            warnings.append(
                f"{asked!r} is added as {s!r}: the tokenizer lower-cases text before matching "
                f"(do_lower_case), so {asked!r} and {s!r} both encode as the token"
            )
        if s in ids:
            i = ids[s]
            had = f.added.get(i)
            _refuse_spelling(f, s, i, had, split)
            marked = {m.id for m in marks}
            if special and i < f.length and (had is None or not had.special) and i not in marked:
                marks.append(replace(had, special=True) if had else AddedToken(s, i, True, False))
                if had is not None:
                    warnings.append(_flag_changed(had))
            first = next((t for t in out if t.id == i), None)  # given twice: as the first time
            out.append(NewToken(s, i, first.special if first else special or bool(had and had.special), True))
            continue
        out.append(NewToken(s, next_id, special, False, tuple(split(asked))))
        ids[s] = next_id
        next_id += 1
    return out, marks, warnings


def _format_of(f: TokenizerFolder) -> tuple[TokenizerFormat, AddedTokensIn]:
    """The folder's vocabulary format (its first model file) and where its added tokens go."""
    fmt = (
        TokenizerFormat.TOKENIZER_JSON
        if f.tokenizer_json is not None
        else TokenizerFormat.SENTENCEPIECE
        if f.sp_model is not None
        else TokenizerFormat.WORDPIECE
        if f.vocab_txt is not None
        else TokenizerFormat.GPT2_BPE
    )
    return fmt, AddedTokensIn.ADDED_JSON if _outside(f) else AddedTokensIn.MODEL_FILE


def _unseen_warnings(f: TokenizerFolder) -> list[str]:
    """One warning per library that reads such a folder but not its new tokens
    (:func:`surgery.io.tokenizer_loaders.unseen_by`, each fact with its proving test)."""
    fmt, where = _format_of(f)
    model = f.sp_name if fmt is TokenizerFormat.SENTENCEPIECE else fmt.value
    return [
        f"the {fact.loader.value} library does not see the new tokens: {model} is kept unchanged and the "
        f"tokens are in {where.value} ({fact.why}); load the folder with its tokenizer class (PaddleNLP "
        "2.8.1 / transformers AutoTokenizer), not the model file alone"
        for fact in unseen_by(fmt, where)
    ]


def _flag_changed(had: AddedToken) -> str:
    """The warning for an existing plain added token that ``special`` marks special."""
    return (
        f"{had.content!r} (id {had.id}) was not special and is now marked special (its special flag "
        "changed): decode(skip_special_tokens=True) drops it from now on, so parsers that read it from "
        "decoded text (tool-call parsers of serving engines) no longer see it; leave it out of a special "
        "batch to keep it plain"
    )


def _matched_form(f: TokenizerFolder, s: str, special: bool) -> str:
    """The form of a plain token ``s`` that loaders can match: its lower-cased form when the tokenizer
    lower-cases text before matching added tokens (WordPiece with ``do_lower_case``, a lower-casing
    normalizer), else ``s``. PaddleNLP 2.8.1's ``add_tokens`` stores such a token lower-cased and lower-cases
    the text before its trie (tokenizer_utils ``_add_tokens`` / ``tokenize``); transformers and PaddleFormers
    match normalized added tokens in the normalized text, so only the lower-cased content ever matches.
    Special tokens are matched on the raw text: kept as given, and so is a string that already is one of the
    folder's special tokens (``[CLS]`` named by ``cls_token``, a special added token): loaders match it
    before lower-casing, so it is the existing token, not a new lower-cased one.

    Raises:
        RefusedError: the normalizer changes the lower-cased form further (accents stripped), so the
            loaders would match different strings.
    """
    if special or s == s.lower() or (f.tokenizer_json is None and f.sp_model is not None):
        return s
    if s in _named_specials(f) or any(t.special and t.content == s for t in f.added.values()):
        return s
    if any(not t.normalized and t.content in s for t in f.added.values()):
        return s  # holds a raw-matched token: refused as never produced (_refuse_shadowed)
    norm = getattr(json_tokenizer(f), "normalizer", None)
    if norm is None or norm.normalize_str(s) != norm.normalize_str(s.lower()):
        return s  # the tokenizer keeps case
    low = s.lower()
    if norm.normalize_str(low) != low:
        raise RefusedError(
            f"{s!r} cannot be added so that every loader matches it: the tokenizer lower-cases text and "
            f"normalizes it further before matching ({s!r} becomes {norm.normalize_str(s)!r} in "
            f"transformers, {low!r} in PaddleNLP 2.8.1, which only lower-cases)",
            f.root,
            f"add the normalized form {norm.normalize_str(s)!r} if PaddleNLP is not used, or leave it out",
        )
    return low


def _refuse_unencodable(f: TokenizerFolder, s: str) -> None:
    """Refuse a token that is not valid Unicode text: a lone surrogate (``'\\udcff'``: what Python makes of
    a byte that is not UTF-8 in a command-line argument) cannot be written as UTF-8, so no tokenizer file can
    hold it; ``tokenizers`` refuses it in ``add_tokens`` (``UnicodeEncodeError: surrogates not allowed``,
    measured with tokenizers 0.22 on the sample's tokenizer.json), and encoding it crashed tietool with a
    ``TypeError``.

    A token longer than :data:`MAX_TOKEN_CHARS` is refused too (it would make every load of the tokenizer
    slow).

    Raises:
        UsageError: naming the token (truncated to 40 characters) and the surrogate's position or the limit.
    """
    shown = s if len(s) <= 40 else s[:40] + "..."
    if len(s) > MAX_TOKEN_CHARS:
        raise UsageError(
            f"the token {shown!r} has {len(s)} characters, more than add-tokens writes ({MAX_TOKEN_CHARS}): "
            "tokenizers takes time quadratic in a token's length to add it, and again on every load",
            f.root,
            f"give tokens of at most {MAX_TOKEN_CHARS} characters",
        )
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(
            f"the token {shown!r} is not valid Unicode text: character {e.start} is a lone surrogate "
            f"({s[e.start]!r}), which no UTF-8 tokenizer file can hold",
            f.root,
            "give the token as UTF-8 text (an argument or a UTF-8 token file, not another encoding)",
        ) from None


def _refuse_spelling(f: TokenizerFolder, s: str, i: int, had: AddedToken | None, split) -> None:
    """Refuse ``s`` when it is the vocabulary's spelling of base token ``i`` but the tokenizer does not encode
    the text ``s`` as ``[i]``: a byte-level BPE piece (``'é'`` is byte 0xE9's piece, the text encodes as its
    two UTF-8 bytes; ``'Ġ'``), a WordPiece ``##`` continuation, a piece without its ``▁`` in the
    tokenizer.json of a SentencePiece model.
    It is no token of that text, and it cannot get a new id either: ``tokenizers`` gives an added token the
    model's id of the same string (``token_to_id``), so the text would encode as piece ``i`` (marked special,
    every ``é`` of ordinary text would: it decodes as a lone byte, '\ufffd'). Added tokens, the special tokens
    the configs name are tokens as they are; so is every piece of a SentencePiece model without
    tokenizer.json, whose own encoder never gives a piece for its spelling.

    Raises:
        RefusedError: naming the string, its id and the ids the tokenizer splits the text into.
    """
    if i >= f.length or had is not None or s in _named_specials(f):  # new in this batch, or an added token
        return
    if f.tokenizer_json is None and f.sp_model is not None:
        return  # sentencepiece encodes no piece's spelling as that piece ('▁' is escaped): left as before
    got = list(split(s))
    if got != [i]:
        raise RefusedError(
            f"{s!r} is the vocabulary's spelling of token {i}, but the tokenizer encodes the text {s!r} as "
            f"{got}: it is not one token of that text, and tokenizers would map a new token {s!r} to id {i}",
            f.root,
            f"leave {s!r} out (add the text as part of a longer token), or edit the tokenizer with its own "
            "library",
        )


def add_tokens_edit(folder: Any, strings, special: bool = False) -> TokenEdit:
    """Add ``strings`` to every tokenizer file of ``folder`` (ids contiguous from ``len(tokenizer)``).

    A string that is already one token (base vocabulary or added) is not added again (``existed``, its id);
    ``special=True`` marks it special in tokenizer.json and the config files (a base piece of a
    SentencePiece model stays NORMAL: CONTROL would stop ordinary text from producing it). ``subtoken_ids``
    are the ids the tokenizer before the edit splits the string into (no special tokens added). The ids and
    flags are those of transformers' ``add_tokens`` / ``add_special_tokens`` (fast tokenizers call
    ``tokenizers``' functions of those names; non-special tokens ``normalized=True``, special ones False).

    Raises:
        RefusedError: tiktoken files, a custom tokenizer class, no vocabulary file, an id gap, a
            special-token attribute (``pad_token``...) naming a string no file has (loaders add it at load).
        TietoolError: a missing library (``pip install ".[tokenizer]"``), an empty string.
    """
    f = scan_folder(folder)
    strings = list(strings)
    known = f.ids()
    unknown = [(s, k) for s, k in _named_specials(f).items() if s not in known and s not in strings]
    if unknown:
        s, k = unknown[0]
        raise RefusedError(
            f"{k} is {s!r}, which no tokenizer file has: loaders add it at load, at an id the new tokens "
            "would also take",
            f.root,
            f"add {s!r} too (first, with special=True), or set {k} to a token the tokenizer has",
        )
    tokens, marks, warnings = _plan_tokens(f, strings, special)
    new = [AddedToken(t.content, t.id, t.special, not t.special) for t in tokens if not t.existed]
    _refuse_shadowed(f, new + marks)
    files = _edit_files(f, new + marks, ())
    if new:
        warnings += _unseen_warnings(f)
    control = [t.content for t in new if t.special] if f.sp_name in files else []
    warnings += [w for w in [control_piece_warning(f.sp_name or "", control)] if w]
    return TokenEdit(f.length, f.length + len(new), tuple(tokens), (), files, tuple(warnings))


# ------------------------------------------------------------------ remove


def remove_tokens_edit(folder: Any, length: int, floor: int = 0) -> TokenEdit:
    """Drop every added token with id >= ``length`` from every tokenizer file of ``folder``. ``floor``: rows
    the caller needs anyway (ids the configs name), so that a refusal's "keep at least" is enough.

    Raises:
        RefusedError: a base-vocabulary token (the model file's own) has an id >= ``length``; a token to
            drop is named by a special-token attribute (``eos_token``...: loaders add it back); or the
            folder cannot be edited (see :func:`add_tokens_edit`).
    """
    f = scan_folder(folder)
    base_cut = sorted(i for t, i in f.base.items() if i >= length and i not in f.added)
    if base_cut:
        # an added token a file also holds as a piece or line (tietool's own *.model / vocab.txt edits) is
        # removable: neither named as base nor counted in the rows to keep
        by_id = {i: t for t, i in f.base.items()}
        names = surface.few([f"{i} {by_id[i]!r}" for i in base_cut], 3)
        need = max(i for i in by_id if i not in f.added) + 1
        raise RefusedError(
            f"ids {names} belong to the tokenizer's base vocabulary ({need} tokens), which "
            f"tietool cannot remove; a model of {length} rows cannot serve this tokenizer",
            f.root,
            f"keep at least {max(need, floor)} rows, or cut the tokenizer with the rows: tietool prune",
        )
    gone = tuple(t for i, t in sorted(f.added.items()) if i >= length)
    _refuse_named(f, gone, floor)
    files = _edit_files(f, [], tuple(t.id for t in gone)) if gone else {}
    return TokenEdit(f.length, min(f.length, length), (), gone, files)


def _named_specials(f: TokenizerFolder) -> dict[str, str]:
    """``{token string: "file key"}`` of the special-token attributes the config files set (``eos_token``,
    ``pad_token``, ... and a dict ``extra_special_tokens``), whose strings loaders add back if missing."""
    out: dict[str, str] = {}
    for name in (CONFIG, SPECIAL_MAP):
        data = f.json_files.get(name)
        if not isinstance(data, dict):
            continue
        extra = data.get("extra_special_tokens")
        items = list(data.items()) + (list(extra.items()) if isinstance(extra, dict) else [])
        for k, v in items:
            content = v.get("content") if isinstance(v, dict) else v
            if isinstance(k, str) and k.endswith("_token") and isinstance(content, str):
                out.setdefault(content, f"{name} {k}")
    return out


def _refuse_named(f: TokenizerFolder, gone: tuple[AddedToken, ...], floor: int = 0) -> None:
    """Refuse removing a token a special-token attribute names: transformers 5.3 and PaddleFormers 1.2 add
    such a string back at load, at the next id (measured: eos ``<|endoftext|>`` cut from a 304-token
    tokenizer came back as id 300 of a 301-token tokenizer), beyond the rows."""
    named = _named_specials(f)
    hit = next((t for t in gone if t.content in named), None)
    if hit is not None:
        raise RefusedError(
            f"token {hit.id} {hit.content!r} is {named[hit.content]}: loaders would add it back beyond "
            "the rows",
            f.root,
            f"keep at least {max(hit.id + 1, floor)} rows, or set {named[hit.content]} to another token "
            "first",
        )


# ------------------------------------------------------------------ the files


def _edit_files(f: TokenizerFolder, add: list[AddedToken], drop: tuple[int, ...]) -> dict[str, bytes]:
    """New bytes of every file that changes: ``add`` (new tokens and special marks) or ``drop`` (ids)."""
    out: dict[str, bytes] = {}
    outside = _outside(f)
    if f.tokenizer_json is not None:
        out["tokenizer.json"] = _edit_tokenizer_json(f, add, drop).encode("utf-8")
    if f.sp_model is not None and f.sp_name and (drop or not outside):
        out[f.sp_name] = _edit_sp_model(f, add, drop)
    if f.vocab_txt is not None:
        edited_vocab = _edit_vocab_txt(f, add, drop)  # its refusals apply; lines are only ever cut
        if drop:
            out["vocab.txt"] = edited_vocab
    files = dict(f.json_files)
    if _lists_added_json(f) and add and ADDED_JSON not in files:
        files[ADDED_JSON] = {}
    for name, data in files.items():
        edited = _EDITORS[name](data, add, drop, f)
        if edited is not None:
            path = f.root / name
            out[name] = _dump_like(path.read_text(encoding="utf-8") if path.is_file() else "{}\n", edited)
    old = {n: (f.root / n).read_bytes() if (f.root / n).is_file() else None for n in out}
    return {n: b for n, b in out.items() if b != old[n]}


def _edit_tokenizer_json(f: TokenizerFolder, add: list[AddedToken], drop: tuple[int, ...]) -> str:
    """tokenizer.json with ``add`` added through ``tokenizers`` (new tokens get the next ids, marks keep
    theirs) and the added tokens of ``drop`` removed (JSON: ``tokenizers`` has no remove)."""
    tk = import_lib("tokenizers")
    text = f.tokenizer_json or ""
    tok = tokenizer_from_str(text)  # a fresh one: f.json_tok also holds the config's added tokens
    for t in add:
        fn = tok.add_special_tokens if t.special else tok.add_tokens
        # a new token has the flags these functions give a string (normalized = not special); a token
        # marked special keeps its normalized flag, as transformers' add_special_tokens keeps it (flipping it
        # would move the token to tokenizers' first, raw-text pass, ahead of longer normalized tokens)
        fn([tk.AddedToken(t.content, special=t.special, normalized=t.normalized)])
        got = tok.token_to_id(t.content)
        if got != t.id:  # tokenizer.json lacks tokens the other files hold (added_tokens.json's, say)
            raise RefusedError(
                f"tokenizer.json gives the new token {t.content!r} id {got} where the other tokenizer files "
                f"make it {t.id}: the files disagree on the tokens they hold; nothing was written",
                f.root / "tokenizer.json",
                "make the files agree first: AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR) writes "
                "every token into every file",
            )
    _refuse_unreachable(f, tok, [t for t in add if t.id >= f.length])
    tail = text[len(text.rstrip("\n")) :]
    assert f.tj_native is not None, "internal: an edit needs scan_folder(native=True)"
    if f.tj_native and not drop:  # a file tokenizers wrote: it writes the edit
        return tok.to_str(pretty=True) + tail
    data = dict(f.tj)  # only the top-level added_tokens is replaced
    data["added_tokens"] = [e for e in json.loads(tok.to_str())["added_tokens"] if e["id"] not in drop]
    if f.tj_native:
        return tk.Tokenizer.from_str(json.dumps(data)).to_str(pretty=True) + tail
    return _dump_like(text, data).decode("utf-8")  # any other writer: only added_tokens changes


def _refuse_shadowed(f: TokenizerFolder, tokens: list[AddedToken]) -> None:
    """Refuse a new normalized (plain) token that holds a raw-matched added token (``normalized: false``,
    special ones as a rule) inside it: loaders match those first, on the raw text, so it is never produced
    (any format: vocab.json + merges.txt, SentencePiece, vocab.txt; tokenizer.json is also checked by
    encoding, :func:`_refuse_unreachable`). Measured: ``<|endoftext|>x`` (GPT-2 files),
    ``<s>x`` (a SentencePiece model), ``[CLS]x`` (vocab.txt) encoded as [0, 88], [1, 117], [2, 138] in
    transformers 5.3 and PaddleFormers 1.2.

    Raises:
        RefusedError: naming the token and the token inside it.
    """
    raw = [t.content for t in [*f.added.values(), *tokens] if not t.normalized]
    for t in tokens:
        inner = next((r for r in raw if t.normalized and r != t.content and r in t.content), None)
        if inner is not None:
            raise RefusedError(
                f"{t.content!r} would never be produced: it holds the token {inner!r}, which loaders match "
                "first (on the raw text)",
                f.root,
                f"add it with {Opt('special', True)} (special tokens are matched first, the longest one "
                "winning), or leave it out",
            )


def _refuse_unreachable(f: TokenizerFolder, tok: Any, new: list[AddedToken]) -> None:
    """Refuse a new token that the edited tokenizer.json (``tok``, through ``tokenizers``, what transformers'
    fast tokenizers run) does not encode as its own id: it would take a row and never be produced. Measured:
    a plain ``<|im_start|>user`` beside the special ``<|im_start|>`` (matched first, on
    the raw text) encoded as [301, 84, 82, 263] in transformers 5.3 and PaddleFormers 1.2.

    Raises:
        RefusedError: naming the token and what its text encodes as.
    """
    for t in new:
        got = list(tok.encode(t.content, add_special_tokens=False).ids)
        if got != [t.id]:
            raise RefusedError(
                f"{t.content!r} would never be produced: with it added, the tokenizer still encodes the text "
                f"{t.content!r} as {got}, not as its id {t.id}",
                f.root / "tokenizer.json",
                f"add it with {Opt('special', True)} (special tokens are matched first, on the raw text), or "
                "leave it out",
            )


def _edit_sp_model(f: TokenizerFolder, add: list[AddedToken], drop: tuple[int, ...]) -> bytes:
    """The SentencePiece model with new pieces appended (``USER_DEFINED``, ``CONTROL`` when special, score
    0) up to the tokenizer's length (added tokens it lacks are appended first, so ids agree), or cut."""
    pb = import_lib("sentencepiece.sentencepiece_model_pb2")
    m = pb.ModelProto()
    m.CopyFrom(f.sp_model)
    kind = pb.ModelProto.SentencePiece
    if drop:
        keep = min(drop)
        if len(m.pieces) > keep:
            del m.pieces[keep:]
        return m.SerializeToString()
    if len(m.pieces) > f.length:
        raise RefusedError(
            f"{f.sp_name} has {len(m.pieces)} pieces but the tokenizer {f.length} tokens (a stale file)",
            f.root / (f.sp_name or "tokenizer.model"),
            "save the tokenizer again with save_pretrained so its files agree",
        )
    fill = [f.added[i] for i in range(len(m.pieces), f.length)]
    for t in fill + [t for t in add if t.id >= f.length]:
        p = m.pieces.add()
        p.piece, p.score = t.content, 0.0
        p.type = kind.CONTROL if t.special else kind.USER_DEFINED
    return m.SerializeToString()


def _edit_vocab_txt(f: TokenizerFolder, add: list[AddedToken], drop: tuple[int, ...]) -> bytes:
    """vocab.txt with new tokens appended (one a line; added tokens it lacks first, so ids agree), or cut."""
    lines = list(f.vocab_txt or [])
    if drop:
        lines = lines[: min(drop)]
    elif len(lines) > f.length:
        raise RefusedError(
            f"vocab.txt has {len(lines)} lines but the tokenizer {f.length} tokens (a stale file)",
            f.root / "vocab.txt",
            "save the tokenizer again with save_pretrained so its files agree",
        )
    else:
        lines += [f.added[i].content for i in range(len(lines), f.length)]
        new = [t.content for t in add if t.id >= f.length]
        bad = next((t for t in new if text_lines(t) != [t] or t != t.rstrip() or "\r" in t), None)
        if bad is not None:
            raise RefusedError(
                f"{bad!r} cannot be a line of vocab.txt: transformers and PaddleFormers read vocab.txt a "
                "line a token and drop trailing whitespace, so a line break or trailing space would move it "
                "and every later id",
                f.root / "vocab.txt",
                "leave it out, or add it without line breaks or trailing whitespace",
            )
        lines += new
    return "".join(line + "\n" for line in lines).encode("utf-8")


def _decoder_entry(t: AddedToken) -> dict:
    """An ``added_tokens_decoder`` value as transformers 4.x writes it (keys sorted)."""
    return {
        "content": t.content,
        "lstrip": t.lstrip,
        "normalized": t.normalized,
        "rstrip": t.rstrip,
        "single_word": t.single_word,
        "special": t.special,
    }


def _edit_config(data: Any, add: list[AddedToken], drop: tuple[int, ...], f: TokenizerFolder) -> Any:
    """tokenizer_config.json: ``added_tokens_decoder`` entries (created when the folder has no
    tokenizer.json to hold them), special ones appended to ``additional_special_tokens`` /
    ``extra_special_tokens`` lists when present; dropped ids removed from both."""
    if not isinstance(data, dict):
        return None
    data = json.loads(json.dumps(data))
    dec = data.get("added_tokens_decoder")
    if dec is None and f.tokenizer_json is None and add:
        dec = data.setdefault("added_tokens_decoder", {})
    gone = {f.added[i].content for i in drop if i in f.added}
    if isinstance(dec, dict):
        for t in add:
            dec[str(t.id)] = _decoder_entry(t)
        for i in drop:
            dec.pop(str(i), None)
        data["added_tokens_decoder"] = dict(sorted(dec.items(), key=lambda kv: int(kv[0])))
    specials = [t.content for t in add if t.special]
    if specials and _lists_added_json(f) and SPECIAL_MAP not in f.json_files:
        # PaddleNLP 2.8.1 adds an added_tokens.json token as special only when a special-token list names it
        data.setdefault("additional_special_tokens", [])
    _edit_special_lists(data, specials, gone)
    return data


def _edit_special_lists(data: dict, specials: list[str], gone: set[str]) -> None:
    for key in ("additional_special_tokens", "extra_special_tokens"):
        cur = data.get(key)
        if isinstance(cur, list):
            names = [x.get("content") if isinstance(x, dict) else x for x in cur]
            kept = [x for x, n in zip(cur, names, strict=True) if n not in gone]
            data[key] = kept + [s for s in specials if s not in names]
            if not data[key] and len(kept) < len(
                cur
            ):  # a removal that empties the list: no list (the same to loaders)
                del data[key]


def _edit_added_json(data: Any, add: list[AddedToken], drop: tuple[int, ...], f: TokenizerFolder) -> Any:
    """added_tokens.json ``{content: id}``: new tokens added (the ids beyond the base vocabulary). In a
    folder whose added tokens live outside the model file (:func:`_outside`), every added token beyond the
    model file's own tokens is listed, in id order: PaddleNLP 2.8.1 reads added tokens only from this file,
    in id order, each id having to be the tokenizer's length so far (tokenizer_utils_base
    ``from_pretrained``: "Non-consecutive added token")."""
    if not isinstance(data, dict):
        return None
    data = {k: v for k, v in data.items() if v not in set(drop)}
    listed = _lists_added_json(f)
    if listed and not drop:
        data.update({t.content: i for i, t in f.added.items() if i >= f.base_size})
    data.update({t.content: t.id for t in add if t.id >= f.length})
    return dict(sorted(data.items(), key=lambda kv: (kv[1], kv[0]))) if listed else data


def _outside(f: TokenizerFolder) -> bool:
    """Whether the folder keeps its added tokens outside its model file, in ``added_tokens.json`` (and
    ``added_tokens_decoder``), as the slow tokenizers' ``save_pretrained`` of PaddleNLP 2.8.1 (and
    transformers 4.x) writes them: ``vocab.txt`` and ``vocab.json`` + ``merges.txt`` always (a line of
    vocab.txt is split like text by a punctuation-splitting WordPiece, so ``<think>`` never matches it in
    PaddleNLP 2.8.1; PaddleNLP refuses an added_tokens.json id that the model file already counts); a
    SentencePiece model without tokenizer.json when the config has no ``added_tokens_decoder`` (PaddleNLP's
    own folders) or the model already lacks the added tokens. Never with tokenizer.json (it holds them)."""
    if f.tokenizer_json is not None:
        return False
    if f.vocab_txt is not None or f.vocab_json is not None:
        return True
    if f.sp_model is None:
        return False
    config = f.json_files.get(CONFIG)
    decoder = isinstance(config, dict) and isinstance(config.get("added_tokens_decoder"), dict)
    return not decoder or len(f.sp_model.pieces) < f.length


def _lists_added_json(f: TokenizerFolder) -> bool:
    """Whether ``added_tokens.json`` must list every added token (created when missing): a folder that keeps
    them outside its model file (:func:`_outside`), or one with ``vocab.txt`` / ``vocab.json`` beside a
    tokenizer.json (transformers 4.x saves both): PaddleNLP 2.8.1's slow tokenizers read those files and take
    added tokens only from added_tokens.json (a BERT folder's ``<think>`` split into 9 pieces otherwise)."""
    return _outside(f) or f.vocab_txt is not None or f.vocab_json is not None


def _edit_special_map(data: Any, add: list[AddedToken], drop: tuple[int, ...], f: TokenizerFolder) -> Any:
    """special_tokens_map.json: special tokens appended to ``additional_special_tokens`` (created)."""
    if not isinstance(data, dict):
        return None
    data = json.loads(json.dumps(data))
    specials = [t.content for t in add if t.special]
    if specials and not isinstance(data.get("additional_special_tokens"), list):
        data["additional_special_tokens"] = []
    _edit_special_lists(data, specials, {f.added[i].content for i in drop if i in f.added})
    return data


_EDITORS = {CONFIG: _edit_config, ADDED_JSON: _edit_added_json, SPECIAL_MAP: _edit_special_map}


def _dump_like(original: str, data: Any) -> bytes:
    """``data`` as JSON in the style of ``original``: its indent (or compact separators), ASCII escapes or
    not, final newline."""
    m = re.search(r"\n( +|\t)\S", original)
    indent = m.group(1) if m else None
    ascii_only = "\\u" in original and original.isascii()
    compact = indent is None and '": ' not in original and '", ' not in original
    seps = (",", ":") if compact else None
    text = json.dumps(data, indent=indent, ensure_ascii=ascii_only, separators=seps)
    return (text + ("\n" if original.endswith("\n") else "")).encode("utf-8")
