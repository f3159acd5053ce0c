"""The tokenizer files of a folder, read for an edit (:mod:`surgery.io.tokenizer_edit`): every file parsed
and checked (:mod:`surgery.io.tokenizer_check`) before a library is handed it, a tiktoken file or a custom
tokenizer class refused, the model file's own tokens and the added tokens every file names, and a splitter
that encodes as the folder's tokenizer does.

Libraries (``tokenizers``, ``sentencepiece``) are imported lazily (the ``tokenizer`` extra); a folder that
needs one that is missing gets a :class:`TietoolError` saying ``pip install ".[tokenizer]"`` (in the clone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model.errors import CheckpointError, RefusedError, TietoolError
from ..model.extras import install_extra
from ..model.tokens import AddedToken
from . import store
from .regular import JSON_LIMIT, parse_shared, read_bounded
from .tokenizer import quiet_stderr, sp_names, tiktoken_files
from .tokenizer_check import (
    check_added_ids,
    check_sp_model,
    check_tokenizer_json,
    check_vocab_json,
    check_wordpiece_unk,
    read_text,
)

SP_NAMES = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "sentencepiece.model")

EXTRA = install_extra("tokenizer")
CONFIG, ADDED_JSON, SPECIAL_MAP = "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json"


def import_lib(name: str) -> Any:
    """Import ``name`` (``tokenizers``, ``sentencepiece``, ``sentencepiece.sentencepiece_model_pb2``)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise TietoolError(
            f"editing the tokenizer needs {name.split('.')[0]} (the tokenizer extra)", None, EXTRA
        ) from e


@dataclass
class TokenizerFolder:
    """The tokenizer files of a folder as read (texts, parsed JSON, the model file's protobuf)."""

    root: Any
    tokenizer_json: str | None = None
    tj: dict = field(default_factory=dict)  # tokenizer.json parsed
    tj_native: bool | None = None  # tokenizers' to_str(pretty=True) reproduces the file (tokenizers wrote
    # it); None: not asked (scan_folder's ``native``)
    json_tok: Any = None  # tokenizer.json as a tokenizers.Tokenizer
    sp_name: str | None = None
    sp_model: Any = None  # sentencepiece ModelProto
    sp_proc: Any = None  # the SentencePieceProcessor of sp_model (checked: tokenizer_check.check_sp_model)
    vocab_txt: list[str] | None = None
    vocab_json: dict | None = None  # with merges.txt beside it
    json_files: dict[str, Any] = field(default_factory=dict)  # CONFIG / ADDED_JSON / SPECIAL_MAP
    base: dict[str, int] = field(default_factory=dict)  # the model file's own tokens
    base_size: int = 0
    added: dict[int, AddedToken] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return max([self.base_size, *(i + 1 for i in self.added)])

    def ids(self) -> dict[str, int]:
        """Every token as one string -> its id (added tokens win, as loaders match them first)."""
        return {**self.base, **{t.content: i for i, t in self.added.items()}}


def _read_json(path: Path, shared: bool = False) -> Any:
    """A JSON tokenizer file's value; ``shared``: the caller never modifies it, so it may be the value the
    detection parsed (:func:`~surgery.io.regular.parse_shared`; a file the strict parser refuses, such as
    one with a repeated key, is parsed as ``json.loads`` does)."""
    text = read_text(path, path.name)
    if shared:
        try:
            return parse_shared(text.encode("utf-8"), path)
        except CheckpointError:
            pass
    try:
        return json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{path.name} is not valid JSON ({e})", path, "save the tokenizer again") from e


def _refuse_unsupported(root: Path, config: Any) -> None:
    """Refuse a tiktoken file or a custom tokenizer class (``auto_map``): tietool cannot edit them."""
    tik = tiktoken_files(root)
    if tik:
        raise RefusedError(
            f"{tik[0]} is a tiktoken rank file, which tietool cannot edit; nothing was written",
            root / tik[0],
            "add the tokens with the tokenizer's own code, then resize the model with tietool resize",
        )
    if isinstance(config, dict) and isinstance(config.get("auto_map"), dict):
        cls = config.get("tokenizer_class") or "a custom class"
        raise RefusedError(
            f"tokenizer_config.json names a custom tokenizer class ({cls}, auto_map) that tietool cannot "
            "edit; nothing was written",
            root / CONFIG,
            "add the tokens with that class's own code, then resize the model with tietool resize",
        )


def scan_folder(folder: Any, native: bool = True) -> TokenizerFolder:
    """Read every tokenizer file of ``folder``; refuse what cannot be edited or a folder with no vocabulary.
    ``native``: tell whether ``tokenizers`` wrote tokenizer.json (``tj_native``; a ``to_str`` of it, which
    only an edit of the file needs).

    Raises:
        RefusedError: a tiktoken file, a custom class, or no tokenizer.json / *.model / vocab.txt /
            vocab.json+merges.txt ("nothing to add the token to").
        CheckpointError: a file that is not valid JSON / protobuf.
    """
    root = store.path_of(folder)  # a Path, or a UPath of a URL (the methods both share)
    f = TokenizerFolder(root)
    for name in (CONFIG, ADDED_JSON, SPECIAL_MAP):
        if (root / name).is_file():
            f.json_files[name] = _read_json(root / name)
    _refuse_unsupported(root, f.json_files.get(CONFIG))
    if (root / "tokenizer.json").is_file():
        text = read_text(root / "tokenizer.json", "tokenizer.json")
        f.tj = _read_json(root / "tokenizer.json", shared=True)  # read, never modified
        check_tokenizer_json(f.tj, root / "tokenizer.json")  # before the library allocates by its ids
        f.tokenizer_json, f.json_tok = text, tokenizer_from_str(text)  # the library must read it first
        if native:
            f.tj_native = f.json_tok.to_str(pretty=True) == text.rstrip("\n")
    f.sp_name = next((n for n in SP_NAMES if (root / n).is_file()), None)
    if f.sp_name:
        _read_sp(f)
    if (root / "vocab.txt").is_file():
        f.vocab_txt = text_lines(read_text(root / "vocab.txt", "vocab.txt"))
    if (root / "vocab.json").is_file() and (root / "merges.txt").is_file():
        f.vocab_json = _read_json(root / "vocab.json")
        check_vocab_json(f.vocab_json, root / "vocab.json")
    if f.tokenizer_json is None and f.sp_model is None and f.vocab_txt is None and f.vocab_json is None:
        other = sp_names(root)  # a model inspect reads (vocab_file, spm.model) that is not edited here
        if other:
            raise RefusedError(
                f"{other[0]} is a SentencePiece model under a name add-tokens does not edit "
                f"({', '.join(SP_NAMES)}): which tokenizer class reads {other[0]} cannot be told "
                "(transformers 5.3 and PaddleFormers 1.2 skip it for a Llama tokenizer: 3 tokens)",
                root / other[0],
                "add the tokens with the tokenizer's own library, then resize the model with tietool resize",
            )
        raise RefusedError(
            "the folder has no tokenizer vocabulary (tokenizer.json, *.model, vocab.txt or vocab.json + "
            "merges.txt): nothing to add the token to",
            root,
            "copy the tokenizer files of the model into the folder",
        )
    try:
        _read_vocab(f)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(
            f"the tokenizer files have an unexpected structure ({type(e).__name__}: {e})",
            root,
            "save the tokenizer again with save_pretrained",
        ) from e
    return f


def _read_sp(f: TokenizerFolder) -> None:
    """Parse the SentencePiece model ``f.sp_name`` and load it (:func:`check_sp_model`).

    Raises:
        CheckpointError: not a SentencePiece model protobuf, or one sentencepiece would refuse.
    """
    path = f.root / (f.sp_name or "")
    f.sp_model = import_lib("sentencepiece.sentencepiece_model_pb2").ModelProto()
    blob = read_bounded(path, JSON_LIMIT, f.sp_name)
    try:
        f.sp_model.ParseFromString(blob)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError (and RuntimeError of its C++ parser)
        raise CheckpointError(
            f"{f.sp_name} is not a SentencePiece model", path, "restore the file from the model's release"
        ) from e
    f.sp_proc = check_sp_model(f.sp_model, f.sp_name or "", path)


def text_lines(text: str) -> list[str]:
    """The lines of a text read with universal newlines (``\n``, ``\r\n``, ``\r``), as ``open().readlines()``
    gives them to transformers' ``load_vocab``; not ``str.splitlines``, which also breaks at ``\x0b``,
    ``\x0c``, ``\x1c``-``\x1e``, ``\x85``, ``\u2028``, ``\u2029`` inside a token and shifts every later id."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def tokenizer_from_str(text: str) -> Any:
    """``tokenizers.Tokenizer.from_str(text)``; a file the library rejects is a CheckpointError."""
    tk = import_lib("tokenizers")
    try:
        with quiet_stderr():
            return tk.Tokenizer.from_str(text)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException as e:  # noqa: BLE001 - tokenizers raises Exception, a Rust panic PanicException
        raise CheckpointError(
            f"tokenizer.json cannot be read by tokenizers ({str(e)[:200]})",
            "tokenizer.json",
            "save the tokenizer again with save_pretrained",
        ) from e


def _base_of(f: TokenizerFolder) -> dict[str, int]:
    """The model file's own tokens (the first of tokenizer.json, *.model, vocab.txt, vocab.json)."""
    if f.tokenizer_json is not None:
        vocab = f.tj.get("model", {}).get("vocab")
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            return {p[0]: i for i, p in reversed(list(enumerate(vocab)))}
        return dict(vocab or {})
    if f.sp_model is not None:
        return {p.piece: i for i, p in reversed(list(enumerate(f.sp_model.pieces)))}
    if f.vocab_txt is not None:
        return {t: i for i, t in reversed(list(enumerate(f.vocab_txt)))}
    return dict(f.vocab_json or {})


def added_token(t: dict, i: int) -> AddedToken:
    """An AddedToken from a tokenizer.json ``added_tokens`` / ``added_tokens_decoder`` entry."""
    flags = (bool(t.get(k)) for k in ("special", "normalized", "lstrip", "rstrip", "single_word"))
    special, normalized, lstrip, rstrip, single = flags
    normalized = normalized if "normalized" in t else True
    return AddedToken(t["content"], i, special, normalized, lstrip, rstrip, single)


def _added_sources(f: TokenizerFolder) -> list[tuple[str, dict[int, AddedToken]]]:
    """The added tokens each file names, most specific first (tokenizer.json, the config's
    ``added_tokens_decoder``, added_tokens.json)."""
    tj = f.tj
    dec = (f.json_files.get(CONFIG) or {}).get("added_tokens_decoder") or {}
    return [
        (
            "tokenizer.json",
            {int(t["id"]): added_token(t, int(t["id"])) for t in tj.get("added_tokens") or ()},
        ),
        (CONFIG, {int(i): added_token(t, int(i)) for i, t in dec.items() if isinstance(t, dict)}),
        (
            ADDED_JSON,
            {int(i): AddedToken(c, int(i)) for c, i in (f.json_files.get(ADDED_JSON) or {}).items()},
        ),
    ]


def _read_vocab(f: TokenizerFolder) -> None:
    """Fill ``f.base`` / ``f.base_size`` / ``f.added`` from every file (the union, as loaders merge them).

    An added token of ``tokenizer.json`` whose id is in the model's vocabulary (Llama's ``<unk>``, a special
    mark on a base token) stays a base token with that flag.

    Raises:
        CheckpointError: two files give one id different strings, or the model files disagree.
        RefusedError: ids between the base vocabulary and the last added token that no file names.
    """
    f.base = _base_of(f)
    f.base_size = max(f.base.values(), default=-1) + 1
    _check_bases(f)
    seen: dict[int, str] = {}
    for name, tokens in _added_sources(f):
        if name != "tokenizer.json":  # its ids are checked against its own size (check_tokenizer_json)
            check_added_ids(name, ((i, t.content) for i, t in tokens.items()), f.base_size, f.root / name)
        for i, t in tokens.items():
            if i in f.added and f.added[i].content != t.content:
                raise CheckpointError(
                    f"{name} gives id {i} the string {t.content!r}, {seen[i]} gives it "
                    f"{f.added[i].content!r}: the tokenizer files disagree",
                    f.root / name,
                    "save the tokenizer again with save_pretrained, or delete the stale file",
                )
            f.added.setdefault(i, t)
            seen.setdefault(i, name)
    missing = [i for i in range(f.base_size, f.length) if i not in f.added]
    if missing:
        raise RefusedError(
            f"tokenizer ids {missing[0]}..{missing[-1]} are named by no tokenizer file (a gap that loaders "
            "renumber)",
            f.root,
            "save the tokenizer again with save_pretrained so its ids are contiguous",
        )


def _check_bases(f: TokenizerFolder) -> None:
    """Every model file beside tokenizer.json (*.model pieces, vocab.txt lines, vocab.json) names its ids as
    tokenizer.json's vocabulary does (the ones beyond may be added tokens): a stale file is refused."""
    if f.tokenizer_json is None:
        return
    by_id = {i: t for t, i in f.base.items()}
    others: list[tuple[str, dict[int, str]]] = []
    if f.sp_model is not None:
        others.append((f.sp_name or "tokenizer.model", {i: p.piece for i, p in enumerate(f.sp_model.pieces)}))
    if f.vocab_txt is not None:
        others.append(("vocab.txt", dict(enumerate(f.vocab_txt))))
    if f.vocab_json is not None:
        others.append(("vocab.json", {int(i): t for t, i in f.vocab_json.items()}))
    for name, theirs in others:
        bad = next((i for i in sorted(theirs) if i < f.base_size and theirs[i] != by_id.get(i)), None)
        if bad is None and len(theirs) >= f.base_size:
            continue
        where = (
            f"id {bad} is {theirs[bad]!r} there, {by_id.get(bad)!r} in tokenizer.json"
            if bad is not None
            else (f"{len(theirs)} tokens there, {f.base_size} in tokenizer.json")
        )
        raise CheckpointError(
            f"{name} and tokenizer.json disagree ({where}): one of them is stale",
            f.root / name,
            "save the tokenizer again with save_pretrained, or delete the stale file",
        )


# ------------------------------------------------------------------ the current tokenizer's splits


def json_tokenizer(f: TokenizerFolder) -> Any:
    """A ``tokenizers.Tokenizer`` that splits as the folder's tokenizer does (with its added tokens)."""
    tk = import_lib("tokenizers")
    if f.json_tok is not None:
        tok = f.json_tok
    elif f.vocab_txt is not None:
        unk = (f.json_files.get(CONFIG) or {}).get("unk_token") or "[UNK]"
        unk = unk.get("content", "[UNK]") if isinstance(unk, dict) else str(unk)
        check_wordpiece_unk(_base_of(f), unk, f.root / "vocab.txt")
        tok = tk.Tokenizer(tk.models.WordPiece(_base_of(f), unk_token=unk))
        lower = (f.json_files.get(CONFIG) or {}).get("do_lower_case", True)
        tok.normalizer = tk.normalizers.BertNormalizer(lowercase=bool(lower))
        tok.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    else:
        merges = read_text(f.root / "merges.txt", "merges.txt").splitlines()
        pairs = [tuple(m.split(" ")) for m in merges if m and not m.startswith("#version")]
        tok = tk.Tokenizer(tk.models.BPE(dict(f.vocab_json or {}), pairs))
        prefix = bool((f.json_files.get(CONFIG) or {}).get("add_prefix_space", False))
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    known = tok.get_vocab(with_added_tokens=True)
    for t in sorted(f.added.values(), key=lambda t: t.id):
        if t.content not in known:
            add = tok.add_special_tokens if t.special else tok.add_tokens
            add([tk.AddedToken(t.content, special=t.special, normalized=t.normalized)])
    return tok


def splitter(f: TokenizerFolder):
    """``encode(text) -> ids`` of the tokenizer before the edit, without special tokens: tokenizers for
    tokenizer.json / vocab.txt / vocab.json, else the SentencePiece processor."""
    if f.tokenizer_json is None and f.sp_model is not None:
        sp = f.sp_proc
        return lambda s: list(sp.encode(s))
    tok = json_tokenizer(f)
    return lambda s: list(tok.encode(s, add_special_tokens=False).ids)
