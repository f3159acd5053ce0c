"""Tokenizer facts as values: the files a folder's tokenizer is made of, what they say, and an edit of them.

Pure data (the model layer): :mod:`surgery.io.tokenizer` reads these from a folder with json alone (and
``sentencepiece`` for ``*.model`` files when the ``tokenizer`` extra is installed);
:mod:`surgery.io.tokenizer_edit` computes a :class:`TokenEdit` with the ``tokenizers`` / ``sentencepiece``
libraries; :mod:`surgery.plan.add_tokens` and :mod:`surgery.plan.resize` turn it into rows of the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .enums import StrEnum


class TokenizerFormat(StrEnum):
    """One way a folder stores its vocabulary (a folder may hold several, which must agree).

    ``TOKENIZER_JSON``: HF fast tokenizer ``tokenizer.json`` (BPE, byte-level BPE, Unigram, WordPiece).
    ``SENTENCEPIECE``: a SentencePiece ``*.model`` protobuf (Llama-2, ERNIE, T5 style).
    ``WORDPIECE``: ``vocab.txt``, one token a line (BERT, ERNIE 3).
    ``GPT2_BPE``: ``vocab.json`` + ``merges.txt`` (GPT-2, Qwen2 slow tokenizer).
    ``TIKTOKEN``: ``*.tiktoken`` / ``qwen.tiktoken`` rank files (read-only for tietool: refused by name).
    ``ADDED``: the files that only list added or special tokens (``tokenizer_config.json``
    ``added_tokens_decoder``, ``added_tokens.json``, ``special_tokens_map.json``).
    """

    TOKENIZER_JSON = "tokenizer.json"
    SENTENCEPIECE = "sentencepiece"
    WORDPIECE = "vocab.txt"
    GPT2_BPE = "vocab.json+merges.txt"
    TIKTOKEN = "tiktoken"
    ADDED = "added-token files"


@dataclass(frozen=True)
class AddedToken:
    """One added token as `tokenizers`' ``AddedToken`` describes it (and ``added_tokens_decoder`` stores it).

    Attributes:
        content: the string.
        id: its token id (a row of the embedding).
        special: never split, skipped by ``decode(skip_special_tokens=True)``.
        normalized / lstrip / rstrip / single_word: as ``tokenizers.AddedToken`` (``normalized`` defaults
            to ``not special`` there).
    """

    content: str
    id: int
    special: bool = False
    normalized: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False


@dataclass(frozen=True)
class TokenizerFile:
    """One tokenizer file of a folder and what it says on its own.

    Attributes:
        name: file name relative to the folder (``tokenizer.json``, ``tokenizer.model``, ...).
        format: the format it belongs to.
        length: tokens it defines (highest id it names + 1); None when it names no id or was not parsed.
        note: why it was not parsed (``needs the tokenizer extra``, ``not valid JSON``), else "".
    """

    name: str
    format: TokenizerFormat
    length: int | None
    note: str = ""


@dataclass(frozen=True)
class TokenizerSet:
    """What the tokenizer files of one folder say together.

    Attributes:
        files: every tokenizer file found, in a fixed order.
        length: ``len(tokenizer)`` as a loader sees it (base vocabulary plus added tokens: highest id + 1
            over every file that was parsed); None when no file names an id.
        base: the base vocabulary's size (the model file's own pieces), when a model file was parsed.
        added: the added tokens, by id.
        disagreements: one line per pair of files that contradict each other (different lengths, one id
            with two strings): a stale ``tokenizer.model`` beside an edited ``tokenizer.json``.
        needs_extra: files that could only be read (or edited) with the ``tokenizer`` extra installed.
        unsupported: files of a format tietool cannot edit (tiktoken, a custom tokenizer class), by name.
        gaps: ids between the base vocabulary and the last added token that no file names: tokenizers,
            transformers and PaddleFormers renumber the added tokens after a gap on load.
        beyond: the files that name a token id no real tokenizer numbers (beyond the ids the files name
            plus :data:`surgery.io.tokenizer.GAP_LIMIT`), each with its ``note`` naming the id and the limit;
            they are counted in no length.
    """

    files: tuple[TokenizerFile, ...] = ()
    length: int | None = None
    base: int | None = None
    added: tuple[AddedToken, ...] = ()
    disagreements: tuple[str, ...] = ()
    needs_extra: tuple[str, ...] = ()
    unsupported: tuple[str, ...] = ()
    gaps: tuple[int, ...] = ()
    beyond: tuple[TokenizerFile, ...] = ()


@dataclass(frozen=True)
class NewToken:
    """One string asked for by ``add-tokens``.

    Attributes:
        content: the string.
        id: its id after the edit (a new id, or the id it already had).
        special: added (or marked) special.
        existed: the tokenizer already had it as one token: nothing was added for it.
        subtoken_ids: the ids the tokenizer *before* the edit splits the string into (the ``subtokens``
            init averages their rows); empty when ``existed``.
    """

    content: str
    id: int
    special: bool
    existed: bool
    subtoken_ids: tuple[int, ...] = ()


def _frozen(files: Mapping[str, bytes]) -> Mapping[str, bytes]:
    return MappingProxyType(dict(files))


@dataclass(frozen=True)
class TokenEdit:
    """An edit of every tokenizer file of a folder, computed before anything is written.

    Attributes:
        length_before: ``len(tokenizer)`` before the edit.
        length_after: ``len(tokenizer)`` after it; the ids ``length_before..length_after-1`` are the new
            tokens, contiguous (tokenizer libraries renumber a gap on load).
        tokens: the strings asked for, in the order given (added, or already present).
        removed: added tokens the edit removes (a trim below them), by id.
        files: the new bytes of every tokenizer file the edit changes, by name relative to the folder;
            files not named keep their bytes.
        warnings: what the edit did that the user did not spell out (a token stored lower-cased, an
            existing token's special flag changed, a loader that does not see the new tokens), one line each.
        dropped: tokenizer files of the folder the output does not hold (a transplanted tokenizer that has
            no such file), by name relative to the folder.
    """

    length_before: int
    length_after: int
    tokens: tuple[NewToken, ...] = ()
    removed: tuple[AddedToken, ...] = ()
    files: Mapping[str, bytes] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", _frozen(self.files))

    @property
    def added(self) -> tuple[NewToken, ...]:
        """The tokens that got a new id (``existed`` False), by id."""
        return tuple(sorted((t for t in self.tokens if not t.existed), key=lambda t: t.id))
