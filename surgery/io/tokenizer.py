"""The tokenizer files of a checkpoint folder: each with its own length, what they say together
(:func:`tokenizer_set`: ``len(tokenizer)``, the added tokens, where the files contradict each other), how
many rows the tokenizer needs (:func:`tokenizer_info`), the strings of given token ids and the special ids
the configs name.

JSON and text files (``tokenizer.json``'s ``model.vocab`` and ``added_tokens``, ``vocab.txt``,
``vocab.json``, ``added_tokens.json``, ``tokenizer_config.json``'s ``added_tokens_decoder``,
``special_tokens_map.json``, ``*.tiktoken``) are read with json alone; SentencePiece ``*.model`` files with
``sentencepiece`` (the ``tokenizer`` extra, imported lazily: without it the file is listed, not parsed).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model.errors import CheckpointError
from ..model.extras import install_extra
from ..model.tokens import AddedToken, TokenizerFile, TokenizerFormat, TokenizerSet
from . import store
from .regular import JSON_LIMIT, folder_files_key, load_json, memoized, read_bounded


@dataclass(frozen=True)
class TokenizerInfo:
    """``size`` = highest token id + 1 over every file read (None when no tokenizer file was found);
    ``sources``: the files that named ids; ``unreadable``: those that could not be parsed; ``files``: the
    whole :class:`TokenizerSet` (:func:`tokenizer_set`)."""

    size: int | None
    sources: tuple[str, ...] = field(default=())
    unreadable: tuple[str, ...] = field(default=())
    files: TokenizerSet = field(default_factory=TokenizerSet)


def _load(folder: Path, name: str) -> Any:
    """A tokenizer or config JSON file of ``folder``, parsed strictly (:func:`surgery.io.regular.load_json`);
    None when it is missing or not valid JSON (Checkpoint.open has already refused one that is not a
    regular file or cannot be read; a remote folder's file is read here the first time). Every caller here
    only reads the value: it may be shared (:func:`surgery.io.regular.parsed_once`)."""
    try:
        return load_json(folder / name, name, shared=True)
    except (CheckpointError, OSError):
        return None


def _vocab_lines(folder: Path) -> list[str] | None:
    """The lines of ``vocab.txt`` (bounded as a JSON file is), or None when missing or not UTF-8."""
    try:
        blob = read_bounded(folder / "vocab.txt", JSON_LIMIT, "vocab.txt")
        return list(io.TextIOWrapper(io.BytesIO(blob), encoding="utf-8"))  # lines as open() reads them
    except (CheckpointError, OSError, UnicodeDecodeError):
        return None


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """File descriptor 2 pointed at ``/dev/null`` for the duration: what a tokenizer library's C++ code logs
    (``sentencepiece`` writes its checks' messages to stderr itself, then raises) never reaches the
    terminal; the exception it raises is what tietool reports. Python's ``sys.stderr`` is flushed first."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 (an embedding host): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


# ------------------------------------------------------------------ the tokenizer file set

SP_NAMES = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "sentencepiece.model", "spm.model")
EXTRA_HINT = f"needs the tokenizer extra: {install_extra('tokenizer')}"
_VOCAB_FORMATS = (
    TokenizerFormat.TOKENIZER_JSON,
    TokenizerFormat.SENTENCEPIECE,
    TokenizerFormat.WORDPIECE,
    TokenizerFormat.GPT2_BPE,
    TokenizerFormat.TIKTOKEN,
)


@dataclass
class _Read:
    """One file as read: its :class:`TokenizerFile` and, where it names strings, ``{id: string}`` maps
    (``tokenizer.json`` gives two: ``model.vocab`` and ``added_tokens``), and the added tokens it lists."""

    file: TokenizerFile
    maps: dict[str, dict[int, str]] = field(default_factory=dict)
    added: list[AddedToken] = field(default_factory=list)
    clashes: list[str] = field(default_factory=list)
    extent: int = 0  # ids the file declares beyond those it names (a Unigram vocabulary's length)


def _id_map(pairs, where: str, clashes: list[str]) -> dict[int, str]:
    """``{id: string}`` of ``(string, id)`` pairs; an id given two strings is named in ``clashes``."""
    out: dict[int, str] = {}
    for s, i in pairs:
        if isinstance(i, bool) or not isinstance(i, int) or not isinstance(s, str) or i < 0:
            continue
        if i in out and out[i] != s:
            clashes.append(f"{where}: id {i} is both {out[i]!r} and {s!r}")
        out.setdefault(i, s)
    return out


def _length(r: _Read) -> int | None:
    """Highest id the file names + 1 (or the length it declares, when larger); None when it names none."""
    ids = [max(m) + 1 for m in r.maps.values() if m] + ([r.extent] if r.extent else [])
    return max(ids) if ids else None


def _flag(t: dict, key: str, default: bool) -> bool:
    v = t.get(key, default)
    return v if isinstance(v, bool) else default


def _added_token(t: dict, i: int) -> AddedToken | None:
    """An ``added_tokens`` / ``added_tokens_decoder`` entry as :class:`AddedToken` (None when malformed)."""
    c = t.get("content")
    if not isinstance(c, str):
        return None
    special = _flag(t, "special", False)
    return AddedToken(
        c,
        i,
        special,
        _flag(t, "normalized", not special),
        _flag(t, "lstrip", False),
        _flag(t, "rstrip", False),
        _flag(t, "single_word", False),
    )


def _id_key(k: object) -> bool:
    """An ``added_tokens_decoder`` key that is a token id: ASCII digits, at most 18 (as
    :func:`check_tokenizer_config` requires; ``"²"`` is a digit to ``str.isdigit`` but not to ``int``)."""
    return isinstance(k, str) and k.isdigit() and k.isascii() and len(k) <= 18


def _read_tokenizer_json(data: dict, r: _Read) -> None:
    """tokenizer.json's ``model.vocab`` (a ``{token: id}`` dict, or Unigram's ``[[piece, score], ...]``)
    and its ``added_tokens``."""
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        r.maps["tokenizer.json model.vocab"] = _id_map(vocab.items(), "tokenizer.json", r.clashes)
    elif isinstance(vocab, list):
        pairs = ((p[0], i) for i, p in enumerate(vocab) if isinstance(p, list) and p)
        r.maps["tokenizer.json model.vocab"] = _id_map(pairs, "tokenizer.json", r.clashes)
        r.extent = len(vocab)
    added = data.get("added_tokens")
    if isinstance(added, list):
        ok = [t for t in added if isinstance(t, dict) and isinstance(t.get("id"), int)]
        r.added = [a for t in ok if (a := _added_token(t, t["id"])) is not None]
        pairs = ((t.get("content"), t["id"]) for t in ok)
        r.maps["tokenizer.json added_tokens"] = _id_map(pairs, "tokenizer.json added_tokens", r.clashes)


def _sp_pieces(blob: bytes) -> list[str]:
    """The pieces of a SentencePiece model protobuf, by id, read by ``sentencepiece`` itself (its
    processor: the size it reports is ``get_piece_size()``, what every loader counts).

    Raises:
        ImportError: ``sentencepiece`` is not installed.
        ValueError / RuntimeError: the bytes are not a SentencePiece model.
    """
    import sentencepiece as spm  # the tokenizer extra, imported only here

    with quiet_stderr():
        sp = spm.SentencePieceProcessor(model_proto=blob)
    n = sp.get_piece_size()
    return list(sp.id_to_piece(list(range(n)))) if n else []


_TIKTOKEN_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2} \d+\r?")


def is_tiktoken(blob: bytes) -> bool:
    """Whether ``blob`` is a tiktoken BPE rank file: non-empty lines ``<base64 bytes> <rank>`` and nothing
    else (GLM-4's ``tokenizer.model``, Kimi's ``tiktoken.model``, Qwen-1's ``qwen.tiktoken``: tiktoken's
    ``load_tiktoken_bpe`` format). A SentencePiece protobuf never is one (its first byte is a field tag)."""
    lines = [line for line in blob.split(b"\n") if line.strip()]
    return bool(lines) and all(_TIKTOKEN_LINE.fullmatch(line) for line in lines)


def _read_sentencepiece(folder: Path, name: str) -> _Read:
    """A SentencePiece ``*.model`` file: its pieces (:func:`_sp_pieces`), or a note why not; a tiktoken
    rank file under a ``.model`` name (GLM-4's ``tokenizer.model``) is read as tiktoken."""
    fmt = TokenizerFormat.SENTENCEPIECE
    try:
        blob = read_bounded(folder / name, JSON_LIMIT, name)
    except (CheckpointError, OSError):
        return _Read(TokenizerFile(name, fmt, None, "could not be read"))
    if is_tiktoken(blob):
        return _read_lines_file(folder, name, TokenizerFormat.TIKTOKEN)
    try:
        pieces = _sp_pieces(blob)
    except ImportError:
        return _Read(TokenizerFile(name, fmt, None, EXTRA_HINT))
    except (RuntimeError, ValueError, TypeError, OSError):
        return _Read(TokenizerFile(name, fmt, None, "not a SentencePiece model"))
    r = _Read(TokenizerFile(name, fmt, len(pieces)))
    r.maps[name] = _id_map(((p, i) for i, p in enumerate(pieces)), name, r.clashes)
    return r


def _read_lines_file(folder: Path, name: str, fmt: TokenizerFormat) -> _Read:
    """``vocab.txt`` (line i is token i, as ``load_vocab`` reads it) or a ``*.tiktoken`` rank file
    (``base64 rank`` a line: its length is the highest rank + 1; its byte strings name no token here)."""
    try:
        blob = read_bounded(folder / name, JSON_LIMIT, name)
        lines = list(io.TextIOWrapper(io.BytesIO(blob), encoding="utf-8"))  # lines as open() reads them
    except (CheckpointError, OSError, UnicodeDecodeError):
        return _Read(TokenizerFile(name, fmt, None, "could not be read"))
    if fmt is TokenizerFormat.WORDPIECE:
        r = _Read(TokenizerFile(name, fmt, len(lines)))
        r.maps[name] = {i: line.rstrip("\r\n") for i, line in enumerate(lines)}
        return r
    ranks = [int(p[1]) for line in lines if len(p := line.split()) == 2 and _id_key(p[1])]
    return _Read(TokenizerFile(name, fmt, max(ranks) + 1 if ranks else None))


def _read_json_file(folder: Path, name: str, fmt: TokenizerFormat) -> _Read | None:
    """A JSON tokenizer file: tokenizer.json, vocab.json, added_tokens.json, tokenizer_config.json
    (``added_tokens_decoder``; None when it has none), special_tokens_map.json (names strings, no ids)."""
    data = _load(folder, name)
    if data is None:
        return _Read(TokenizerFile(name, fmt, None, "not valid JSON"))
    if not isinstance(data, dict):
        return _Read(TokenizerFile(name, fmt, None, "not a JSON object"))
    r = _Read(TokenizerFile(name, fmt, None))
    if name == "tokenizer.json":
        _read_tokenizer_json(data, r)
    elif name in ("vocab.json", "added_tokens.json"):
        r.maps[name] = _id_map(data.items(), name, r.clashes)
    elif name == "tokenizer_config.json":
        dec = data.get("added_tokens_decoder")
        if not isinstance(dec, dict):
            return None
        ok = {int(i): t for i, t in dec.items() if _id_key(i) and isinstance(t, dict)}
        r.added = [a for i, t in sorted(ok.items()) if (a := _added_token(t, i)) is not None]
        r.maps[name] = _id_map(((a.content, a.id) for a in r.added), name, r.clashes)
    r.file = TokenizerFile(name, fmt, _length(r))
    return r


_JSON_FILES = (
    ("vocab.json", TokenizerFormat.GPT2_BPE),
    ("vocab.txt", TokenizerFormat.WORDPIECE),
    ("added_tokens.json", TokenizerFormat.ADDED),
    ("tokenizer_config.json", TokenizerFormat.ADDED),
    ("special_tokens_map.json", TokenizerFormat.ADDED),
)


def _safe_name(v: object) -> bool:
    return isinstance(v, str) and bool(v) and "/" not in v and "\\" not in v and v not in (".", "..")


def sp_names(folder: Path) -> list[str]:
    """SentencePiece files of ``folder``: the one tokenizer_config.json names (``vocab_file``, a plain file
    name ending in ``.model``), then the usual names (:data:`SP_NAMES`)."""
    tc = _load(folder, "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else None
    vf = tc.get("vocab_file") if isinstance(tc, dict) else None
    named = [vf] if isinstance(vf, str) and _safe_name(vf) and vf.endswith(".model") else []
    return [n for n in dict.fromkeys([*named, *SP_NAMES]) if (folder / n).is_file()]


TIKTOKEN_NAMES = ("tiktoken.model",)
"""tiktoken rank files under another suffix than ``.tiktoken`` (Kimi's ``tiktoken.model``)."""


def _tiktoken_names(folder: Path) -> list[str]:
    """``*.tiktoken`` files of ``folder`` and :data:`TIKTOKEN_NAMES` (none when the folder cannot be
    listed, as a remote one)."""
    try:
        return sorted(
            p.name
            for p in folder.iterdir()
            if (p.name.endswith(".tiktoken") or p.name in TIKTOKEN_NAMES) and p.is_file()
        )
    except (AttributeError, OSError, NotImplementedError, TypeError):
        return []


def tiktoken_files(folder: Path) -> list[str]:
    """The tiktoken rank files of ``folder``: ``*.tiktoken``, :data:`TIKTOKEN_NAMES`, and a SentencePiece
    name (:func:`sp_names`) whose bytes are a rank file (GLM-4's ``tokenizer.model``, :func:`is_tiktoken`);
    sorted, none when the folder cannot be listed."""
    named = []
    for n in sp_names(folder):
        try:
            if is_tiktoken((folder / n).read_bytes()):
                named.append(n)
        except OSError:
            continue
    return sorted({*_tiktoken_names(folder), *named})


def _read_all(folder: Path) -> list[_Read]:
    """Every tokenizer file of ``folder`` read, in a fixed order: tokenizer.json, SentencePiece models,
    vocab.json, vocab.txt, added_tokens.json, tokenizer_config.json (with ``added_tokens_decoder``),
    special_tokens_map.json, ``*.tiktoken``."""
    out: list[_Read] = []
    if (folder / "tokenizer.json").is_file():
        out += [r for r in [_read_json_file(folder, "tokenizer.json", TokenizerFormat.TOKENIZER_JSON)] if r]
    out += [_read_sentencepiece(folder, n) for n in sp_names(folder)]
    for name, fmt in _JSON_FILES:
        if not (folder / name).is_file():
            continue
        r = (
            _read_lines_file(folder, name, fmt)
            if fmt is TokenizerFormat.WORDPIECE
            else _read_json_file(folder, name, fmt)
        )
        out += [r] if r is not None else []
    out += [_read_lines_file(folder, n, TokenizerFormat.TIKTOKEN) for n in _tiktoken_names(folder)]
    return out


_SHOWN = 3  # disagreeing ids named in one line


def _map_disagreements(reads: list[_Read]) -> list[str]:
    """One line per pair of ``{id: string}`` maps (of two files, or two parts of tokenizer.json) that give
    one id two strings: how many ids, and the first few."""
    maps = [(k, m) for r in reads for k, m in r.maps.items() if m]
    out: list[str] = []
    for i, (ka, ma) in enumerate(maps):
        for kb, mb in maps[i + 1 :]:
            small, big = (ma, mb) if len(ma) <= len(mb) else (mb, ma)
            bad = sorted(t for t in small if t in big and ma[t] != mb[t])
            if bad:
                shown = "; ".join(f"id {t} is {ma[t]!r} in {ka}, {mb[t]!r} in {kb}" for t in bad[:_SHOWN])
                more = f" and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
                out.append(f"{ka} and {kb} disagree on {len(bad)} id(s): {shown}{more}")
    return out


def _length_disagreements(reads: list[_Read]) -> list[str]:
    """The vocabulary files (tokenizer.json, SentencePiece, vocab.txt, vocab.json, tiktoken) must define
    the same number of tokens once the added-token files' ids (added_tokens.json, tokenizer_config.json's
    ``added_tokens_decoder``, which every loader adds on top) are counted: one line naming them when not."""
    extra = [r.file.length for r in reads if r.file.format is TokenizerFormat.ADDED and r.file.length]
    floor = max(extra, default=0)
    eff = {
        r.file.name: max(r.file.length, floor)
        for r in reads
        if r.file.format in _VOCAB_FORMATS and r.file.length is not None
    }
    if len(set(eff.values())) <= 1:
        return []
    with_added = " (counting the added-token files' ids)" if floor else ""
    return [
        "the tokenizer files define different numbers of tokens"
        + with_added
        + ": "
        + ", ".join(f"{n} {v}" for n, v in eff.items())
    ]


def _decoder_disagreements(reads: list[_Read]) -> list[str]:
    """tokenizer.json's ``added_tokens`` and tokenizer_config.json's ``added_tokens_decoder`` list the same
    tokens at the same ids (transformers and PaddleFormers write both; a slow tokenizer reads only the
    decoder), when both files have them."""
    by = {r.file.name: {(a.id, a.content) for a in r.added} for r in reads}
    tj, tc = by.get("tokenizer.json"), by.get("tokenizer_config.json")
    if tj is None or tc is None:
        return []
    out = []
    for have, lack, what in ((tj, tc, "added_tokens"), (tc, tj, "added_tokens_decoder")):
        miss = sorted(have - lack)
        if miss:
            names = ", ".join(f"{c!r} (id {i})" for i, c in miss[:_SHOWN])
            more = f" and {len(miss) - _SHOWN} more" if len(miss) > _SHOWN else ""
            src, dst = (
                ("tokenizer.json", "tokenizer_config.json")
                if what == "added_tokens"
                else (
                    "tokenizer_config.json",
                    "tokenizer.json",
                )
            )
            out.append(f"{src} {what} has {names}{more}, which {dst} does not list")
    return out


def _base(reads: list[_Read]) -> int | None:
    """The base vocabulary's size: tokenizer.json's ``model.vocab``, else the first other vocabulary
    file's."""
    for r in reads:
        m = r.maps.get("tokenizer.json model.vocab")
        if m is not None:
            return max(max(m) + 1 if m else 0, r.extent) or None
    for r in reads:
        if r.file.format in _VOCAB_FORMATS and r.file.format is not TokenizerFormat.TOKENIZER_JSON:
            if r.file.length is not None:
                return r.file.length
    return None


def _added(reads: list[_Read]) -> tuple[AddedToken, ...]:
    """Added tokens by id: tokenizer.json's (with their flags), then tokenizer_config.json's decoder, then
    added_tokens.json's (which records no flags); the first file naming an id wins."""
    out: dict[int, AddedToken] = {}
    for r in reads:
        for a in r.added:
            out.setdefault(a.id, a)
        if r.file.name == "added_tokens.json":
            for i, c in r.maps.get("added_tokens.json", {}).items():
                out.setdefault(i, AddedToken(c, i))
    return tuple(out[i] for i in sorted(out))


GAP_LIMIT = 65_536
"""Token ids that no file names, at most, beyond the ids the files name: a file naming a higher id (an
added-token id of 10^9 or 10^18, a vocabulary id of 2*10^9) numbers no real tokenizer (every loader would
allocate a table to that id: tokenizers 0.22 aborts the process on a vocabulary id of 2*10^9) and is read as
unreadable, with a note naming the id and this limit."""


def _bound_ids(reads: list[_Read]) -> tuple[TokenizerFile, ...]:
    """Make unreadable (a note naming the id and the limit, no ids) every file naming an id of at least
    ``len(named ids) + the largest declared extent +`` :data:`GAP_LIMIT`; returns those files."""
    named = {i for r in reads for m in r.maps.values() for i in m}
    limit = len(named) + max((r.extent for r in reads), default=0) + GAP_LIMIT
    out: list[TokenizerFile] = []
    for r in reads:
        top = max((i for m in r.maps.values() for i in m), default=-1)
        if top >= limit:
            note = (
                f"names token id {top}, beyond the {limit} ids a tokenizer of {len(named)} named tokens can "
                f"number (at most {GAP_LIMIT} unnamed)"
            )
            r.file = TokenizerFile(r.file.name, r.file.format, None, note)
            r.maps, r.added, r.extent = {}, [], 0
            out.append(r.file)
    return tuple(out)


def tokenizer_set(folder: Path) -> TokenizerSet:
    """Every tokenizer file of ``folder`` with its own length, and what they say together.

    Reads tokenizer.json, SentencePiece ``*.model`` files (with ``sentencepiece``, the ``tokenizer``
    extra; without it the file's ``note`` says so and it is listed in ``needs_extra``), vocab.json,
    vocab.txt, added_tokens.json, tokenizer_config.json (``added_tokens_decoder``), special_tokens_map.json
    and ``*.tiktoken`` files (listed in ``unsupported``). ``length`` is the highest id any parsed file names
    + 1, which is ``len(tokenizer)`` of transformers and PaddleFormers for a consistent folder (tested on
    real trained tokenizers: tests/unit/io/test_tokenizer_read.py). A file that is not valid JSON or not a
    SentencePiece model, or names an id beyond :data:`GAP_LIMIT` unnamed ones, gets a ``note`` and no
    length; this never raises on a bad file.

    ``disagreements``: an id given two strings (within a file or by two files: a stale ``tokenizer.model``
    beside an edited ``tokenizer.json``), vocabulary files of different lengths once the added-token files
    are counted, tokenizer.json's added tokens and tokenizer_config.json's ``added_tokens_decoder`` not
    listing the same tokens. ``gaps``: ids from the base vocabulary's size to ``length - 1`` that no file
    names (tokenizers 0.22, transformers 5.3 and PaddleFormers 1.2 give the tokens after them lower ids).
    Within :func:`surgery.io.regular.parsed_once`, read once per folder and state of its files.
    """
    root = store.path_of(folder)
    key = folder_files_key(root)
    return memoized(("tokenizer_set", key) if key else None, lambda: _tokenizer_set(root))


def _tokenizer_set(folder: Path) -> TokenizerSet:
    reads = _read_all(folder)
    beyond = _bound_ids(reads)
    files = tuple(r.file for r in reads)
    lengths = [f.length for f in files if f.length is not None]
    clashes = [c for r in reads for c in r.clashes]
    base, length = _base(reads), max(lengths) if lengths else None
    named = {i for r in reads for m in r.maps.values() for i in m}
    return TokenizerSet(
        files=files,
        length=length,
        base=base,
        added=_added(reads),
        disagreements=tuple(
            clashes + _map_disagreements(reads) + _length_disagreements(reads) + _decoder_disagreements(reads)
        ),
        needs_extra=tuple(f.name for f in files if f.note == EXTRA_HINT),
        unsupported=tuple(f.name for f in files if f.format is TokenizerFormat.TIKTOKEN)
        + _custom_class(folder),
        gaps=tuple(i for i in range(base, length) if i not in named) if base and length else (),
        beyond=beyond,
    )


def _custom_class(folder: Path) -> tuple[str, ...]:
    """``("tokenizer_config.json",)`` when it names a custom tokenizer class (``auto_map`` with an
    ``AutoTokenizer`` entry: code shipped with the checkpoint, which tietool neither runs nor edits)."""
    if not (folder / "tokenizer_config.json").is_file():
        return ()
    tc = _load(folder, "tokenizer_config.json")
    am = tc.get("auto_map") if isinstance(tc, dict) else None
    return ("tokenizer_config.json",) if isinstance(am, dict) and am.get("AutoTokenizer") else ()


def vocabulary(folder: Path) -> dict[int, str]:
    """``{id: token}`` for every id the tokenizer files of ``folder`` name (tokenizer.json's added tokens
    and vocabulary first, then SentencePiece pieces, vocab.json, vocab.txt, added_tokens.json,
    tokenizer_config.json's decoder: the first file naming an id wins). ``{}`` when there are none."""
    out: dict[int, str] = {}
    reads = _read_all(store.path_of(folder))
    _bound_ids(reads)
    for r in reads:
        for m in r.maps.values():
            for i, s in m.items():
                out.setdefault(i, s)
    return out


def vocabulary_maps(folder: Path) -> tuple[dict[str, dict[int, str]], list[str]]:
    """Each ``{id: token}`` map the tokenizer files of ``folder`` hold, by where it was read
    (``tokenizer.json model.vocab``, ``vocab.txt``, ``added_tokens.json``...: the files
    :func:`vocabulary` merges, kept apart), and the lines naming an id given two strings in one map."""
    reads = _read_all(store.path_of(folder))
    maps = {k: dict(m) for r in reads for k, m in r.maps.items()}
    return maps, [c for r in reads for c in r.clashes]


def tokenizer_info(folder: Path) -> TokenizerInfo:
    """Highest token id + 1 found in the tokenizer files of ``folder`` (:func:`tokenizer_set`'s
    ``length``), the files that named ids (``sources``) and those that could not be read; never raises on a
    bad file (an unexpected structure makes the files count as unreadable)."""
    try:
        ts = tokenizer_set(folder)
    except (AttributeError, TypeError, ValueError, KeyError, RecursionError, OSError):
        return TokenizerInfo(None, (), ("tokenizer files (unexpected structure)",))
    sources = tuple(
        f.name
        for f in ts.files
        if not f.note
        and f.name != "special_tokens_map.json"
        and (f.length is not None or f.name == "tokenizer.json")
    )
    unreadable = tuple(f.name for f in ts.files if f.note and f.note != EXTRA_HINT)
    return TokenizerInfo(ts.length, sources, unreadable, ts)


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


def special_token_ids(folder: Path, config_dir: Path | None = None) -> tuple[SpecialTokenId, ...]:
    """Every token id named in the checkpoint's config.json, generation_config.json and
    tokenizer_config.json (``*_token_id``/``*_token_ids``/``*_token_index`` keys, at the top level and in
    nested configs; tokenizer_config token strings resolved through ``added_tokens_decoder``). A file that
    is missing or unreadable contributes nothing (its problems are reported elsewhere); one missing from
    ``folder`` is read from ``config_dir`` when given (a Trainer ``checkpoint-N/`` whose config.json is in
    the folder above, whose files ``tietool merge`` carries into its output)."""
    out: list[SpecialTokenId] = []
    for name in ID_FILES:
        data = _load(folder, name)
        if data is None and config_dir is not None:
            folder_of = config_dir
            data = _load(config_dir, name)
        else:
            folder_of = folder
        if name == "tokenizer_config.json":
            check_tokenizer_config(data, folder_of / name)
        if isinstance(data, dict):
            out += _ids_in(data, name)
            if name == "tokenizer_config.json":
                out += _resolved_token_strings(data)
    return tuple(dict.fromkeys(out))
