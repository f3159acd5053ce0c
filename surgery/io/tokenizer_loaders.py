"""What each tokenizer library makes of the tokens ``add-tokens`` writes, per tokenizer format: data, each
fact with the test that proved it (as :data:`surgery.arch.PROOFS` does for the model loaders).

A fact is keyed by the tokenizer format of the folder (:class:`~surgery.model.tokens.TokenizerFormat`),
where the folder keeps its added tokens (:class:`AddedTokensIn`: in the model file / tokenizer.json, or
outside it in ``added_tokens.json`` + ``added_tokens_decoder``, :mod:`surgery.io.tokenizer_edit` decides
which) and the library that loads it (:class:`TokenizerLoader`). Its :class:`Outcome` says what that
library does with the new tokens of tietool's output; :data:`PROOFS` names the test that ran the library on
``add-tokens`` outputs of real tokenizers (``tests/data/tokenizers``, the PaddleNLP-written folders of
``tests/data/pnlp_tokenizers`` and the ``e01``/``e08`` cases) and asserted it:
``tests/oracles/test_tokenizer_loaders.py::test_tokenizer_loader_fact``.

``prune`` has its own table, :data:`PRUNE_FACTS`, keyed by the pruned format (:class:`PrunedFormat`, the
vocabulary file and its model) and the loader: whether the library encodes kept text of a pruned real
tokenizer to the old encoding's ids renumbered (:data:`PRUNE_PROOFS`:
``tests/oracles/test_prune_tokenizers.py::test_prune_loader_fact``). A format no loader is proven for is
refused by name.

Measured with tokenizers 0.22.2, sentencepiece 0.2.3, transformers 5.3.0, PaddleFormers 1.2.0 and PaddleNLP
2.8.1 (paddle 2.6.2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..model.enums import StrEnum
from ..model.errors import Opt
from ..model.tokens import TokenizerFormat


class TokenizerLoader(StrEnum):
    """A library that loads a tokenizer folder (the ``encodes`` loaders of the cases, and PaddleFormers)."""

    TOKENIZERS = "tokenizers"  # tokenizers.Tokenizer.from_file(tokenizer.json)
    SENTENCEPIECE = "sentencepiece"  # SentencePieceProcessor of the *.model file alone
    TRANSFORMERS = "transformers"  # transformers 5.3 AutoTokenizer.from_pretrained
    PADDLEFORMERS = "paddleformers"  # PaddleFormers 1.2 AutoTokenizer.from_pretrained
    PADDLENLP_28 = "paddlenlp-2.8"  # PaddleNLP 2.8.1 AutoTokenizer.from_pretrained (its own slow tokenizers)


class AddedTokensIn(StrEnum):
    """Where a folder keeps its added tokens, so where ``add-tokens`` writes new ones.

    ``MODEL_FILE``: in ``tokenizer.json``'s ``added_tokens``, or appended to the SentencePiece model as pieces
    (``USER_DEFINED``, ``CONTROL`` when special), with ``added_tokens_decoder``: HF-style folders.
    ``ADDED_JSON``: the model file (``vocab.txt``, ``vocab.json`` + ``merges.txt``, a SentencePiece model of a
    folder without ``added_tokens_decoder``) unchanged; the tokens in ``added_tokens.json`` in id order and in
    ``added_tokens_decoder``, as the slow tokenizers' ``save_pretrained`` (PaddleNLP 2.8.1, transformers 4.x)
    writes them.
    ``NONE``: the format cannot be edited (tiktoken): add-tokens refuses it by name.
    """

    MODEL_FILE = "model file"
    ADDED_JSON = "added_tokens.json"
    NONE = "not edited"


class Outcome(StrEnum):
    """What a library does with the new tokens of an ``add-tokens`` output."""

    ENCODES = "encodes each new token (alone and inside text) as its id"
    PIECE = (
        "produces a new plain token's id after SentencePiece's own '▁' piece; a special (CONTROL) piece is "
        "never produced from text (the caller inserts its id, as for <s>)"
    )
    IGNORES = "loads the folder without the new tokens (said on the terminal)"
    NOT_A_READER = "does not load this format (the input already fails or loads another vocabulary)"
    REFUSED = "add-tokens refuses the format, naming it"


@dataclass(frozen=True)
class TokenizerFact:
    """One measured fact: ``loader`` on an ``add-tokens`` output of ``fmt`` whose tokens are in ``where``."""

    fmt: TokenizerFormat
    where: AddedTokensIn
    loader: TokenizerLoader
    outcome: Outcome
    why: str = ""

    @property
    def key(self) -> str:
        """The fact's id in its proving test's parameters: ``<format>-<where>-<loader>``."""
        return f"{self.fmt.value}-{self.where.value}-{self.loader.value}"


_F, _W, _L, _O = TokenizerFormat, AddedTokensIn, TokenizerLoader, Outcome
_PNLP_NO_FAST = "PaddleNLP 2.8.1 has no tokenizer that reads tokenizer.json (its classes are slow ones)"
_TF_NO_PNLP_SP = "transformers' LlamaTokenizer reads tokenizer.model, not PaddleNLP's sentencepiece.bpe.model"
_PNLP_SP_NAME = "PaddleNLP 2.8.1's LlamaTokenizer reads sentencepiece.bpe.model, not tokenizer.model"

FACTS: tuple[TokenizerFact, ...] = (
    # tokenizer.json (byte-level BPE; a SentencePiece model converted, tokenizer.model beside it)
    TokenizerFact(_F.TOKENIZER_JSON, _W.MODEL_FILE, _L.TOKENIZERS, _O.ENCODES),
    TokenizerFact(_F.TOKENIZER_JSON, _W.MODEL_FILE, _L.TRANSFORMERS, _O.ENCODES),
    TokenizerFact(_F.TOKENIZER_JSON, _W.MODEL_FILE, _L.PADDLEFORMERS, _O.ENCODES),
    TokenizerFact(_F.TOKENIZER_JSON, _W.MODEL_FILE, _L.PADDLENLP_28, _O.NOT_A_READER, _PNLP_NO_FAST),
    # SentencePiece models of HF-style folders: pieces appended
    TokenizerFact(_F.SENTENCEPIECE, _W.MODEL_FILE, _L.SENTENCEPIECE, _O.PIECE),
    TokenizerFact(_F.SENTENCEPIECE, _W.MODEL_FILE, _L.TRANSFORMERS, _O.ENCODES),
    TokenizerFact(_F.SENTENCEPIECE, _W.MODEL_FILE, _L.PADDLEFORMERS, _O.ENCODES),
    TokenizerFact(_F.SENTENCEPIECE, _W.MODEL_FILE, _L.PADDLENLP_28, _O.NOT_A_READER, _PNLP_SP_NAME),
    # SentencePiece folders PaddleNLP 2.8.1 wrote (sentencepiece.bpe.model, no added_tokens_decoder)
    TokenizerFact(
        _F.SENTENCEPIECE,
        _W.ADDED_JSON,
        _L.SENTENCEPIECE,
        _O.IGNORES,
        "the model file is kept: PaddleNLP 2.8.1 refuses an added_tokens.json id the model already counts",
    ),
    TokenizerFact(_F.SENTENCEPIECE, _W.ADDED_JSON, _L.TRANSFORMERS, _O.NOT_A_READER, _TF_NO_PNLP_SP),
    TokenizerFact(_F.SENTENCEPIECE, _W.ADDED_JSON, _L.PADDLEFORMERS, _O.NOT_A_READER, _TF_NO_PNLP_SP),
    TokenizerFact(_F.SENTENCEPIECE, _W.ADDED_JSON, _L.PADDLENLP_28, _O.ENCODES),
    # WordPiece vocab.txt (BERT, ERNIE 1.0/3.0; lower-casing: plain tokens stored lower-cased)
    TokenizerFact(_F.WORDPIECE, _W.ADDED_JSON, _L.TRANSFORMERS, _O.ENCODES),
    TokenizerFact(_F.WORDPIECE, _W.ADDED_JSON, _L.PADDLEFORMERS, _O.ENCODES),
    TokenizerFact(_F.WORDPIECE, _W.ADDED_JSON, _L.PADDLENLP_28, _O.ENCODES),
    # GPT-2 style vocab.json + merges.txt (GPT-2, OPT, Bloom slow tokenizers; PaddleNLP's GPTTokenizer)
    TokenizerFact(_F.GPT2_BPE, _W.ADDED_JSON, _L.TRANSFORMERS, _O.ENCODES),
    TokenizerFact(_F.GPT2_BPE, _W.ADDED_JSON, _L.PADDLEFORMERS, _O.ENCODES),
    TokenizerFact(_F.GPT2_BPE, _W.ADDED_JSON, _L.PADDLENLP_28, _O.ENCODES),
    # tiktoken rank files (Qwen-1 qwen.tiktoken, GLM-4 tokenizer.model, Kimi tiktoken.model)
    TokenizerFact(_F.TIKTOKEN, _W.NONE, _L.TRANSFORMERS, _O.REFUSED, "custom tokenizer code only"),
)
"""Every (format, where, loader) fact measured; a pair absent here is not claimed."""

PROOF_TEST = "tests/oracles/test_tokenizer_loaders.py::test_tokenizer_loader_fact"
PROOFS: Mapping[str, str] = MappingProxyType({f.key: f"{PROOF_TEST}[{f.key}]" for f in FACTS})
"""Fact key (:attr:`TokenizerFact.key`) → the pytest node id of the test that proved it."""


def facts_for(fmt: TokenizerFormat, where: AddedTokensIn) -> tuple[TokenizerFact, ...]:
    """The facts of an output of ``fmt`` whose added tokens are in ``where``, in table order."""
    return tuple(f for f in FACTS if f.fmt is fmt and f.where is where)


def unseen_by(fmt: TokenizerFormat, where: AddedTokensIn) -> tuple[TokenizerFact, ...]:
    """The libraries that read such a folder but not its new tokens (:attr:`Outcome.IGNORES`): add-tokens
    says so on the terminal, naming them."""
    return tuple(f for f in facts_for(fmt, where) if f.outcome is Outcome.IGNORES)


def control_piece_warning(model: str, tokens: Sequence[str]) -> str | None:
    """The terminal warning for special ``tokens`` written into the SentencePiece model ``model`` as
    ``CONTROL`` pieces (:attr:`Outcome.PIECE`: the ``sentencepiece`` library alone never produces a
    control piece from text, as it never produces ``<s>``; transformers, PaddleFormers and ``tokenizers``
    encode them through ``added_tokens_decoder``, ``FACTS``); None when there are none."""
    if not tokens:
        return None
    more = f" and {len(tokens) - 3} more" if len(tokens) > 3 else ""
    shown = ", ".join(repr(t) for t in tokens[:3]) + more
    return (
        f"{shown} {'is a CONTROL piece' if len(tokens) == 1 else 'are CONTROL pieces'} of {model} (special): "
        "the sentencepiece library reading the model file alone never produces a control piece from text "
        "(as for <s>), transformers, PaddleFormers and tokenizers encode it to its id; with sentencepiece "
        f"alone insert the id yourself, or add the token without {Opt('special', True)} to have it encoded "
        "from text"
    )


# ------------------------------------------------------------------------------------------ prune


class PrunedFormat(StrEnum):
    """A vocabulary file ``prune`` cuts to a keep-list (:mod:`surgery.io.tokenizer_prune`), by its model."""

    BPE_JSON = "tokenizer.json-BPE"  # tokenizer.json, BPE model (byte-level, or a SentencePiece conversion)
    UNIGRAM_JSON = "tokenizer.json-Unigram"  # tokenizer.json, Unigram model (pieces with scores)
    WORDPIECE_JSON = "tokenizer.json-WordPiece"
    WORDPIECE_TXT = "vocab.txt"
    GPT2_BPE = "vocab.json+merges.txt"
    SP_BPE = "sentencepiece-BPE"  # a SentencePiece *.model of model_type BPE
    SP_UNIGRAM = "sentencepiece-Unigram"  # a SentencePiece *.model of model_type UNIGRAM


class PruneOutcome(StrEnum):
    """What a library makes of a ``prune`` output of a format."""

    KEEPS_ENCODING = "encodes kept text to the old encoding's ids renumbered, and counts the kept tokens"
    NOT_A_READER = "does not load this format (the input already fails)"
    SEGMENTS_APART = (
        "reads the model through its own conversion and splits text otherwise than sentencepiece (the input "
        "already does): a keep-list from sentencepiece's encoding drops pieces its split needs"
    )


@dataclass(frozen=True)
class PruneFact:
    """One measured fact: ``loader`` on ``prune`` outputs of real tokenizers of format ``fmt``."""

    fmt: PrunedFormat
    loader: TokenizerLoader
    outcome: PruneOutcome
    why: str = ""

    @property
    def key(self) -> str:
        """The fact's id in its proving test's parameters: ``<format>-<loader>``."""
        return f"{self.fmt.value}-{self.loader.value}"


_P, _K, _N = PrunedFormat, PruneOutcome.KEEPS_ENCODING, PruneOutcome.NOT_A_READER
_A = PruneOutcome.SEGMENTS_APART
_SP_AS_BPE = "LlamaTokenizer builds BPE merges from a Unigram model's piece scores: 'he' split as h + e"
_NO_JSON = "reads no tokenizer.json"

PRUNE_FACTS: tuple[PruneFact, ...] = (
    PruneFact(_P.BPE_JSON, _L.TOKENIZERS, _K),
    PruneFact(_P.BPE_JSON, _L.TRANSFORMERS, _K),
    PruneFact(_P.BPE_JSON, _L.PADDLEFORMERS, _K),
    PruneFact(_P.BPE_JSON, _L.PADDLENLP_28, _N, _PNLP_NO_FAST),
    PruneFact(_P.UNIGRAM_JSON, _L.TOKENIZERS, _K),
    PruneFact(_P.UNIGRAM_JSON, _L.TRANSFORMERS, _K),
    PruneFact(_P.UNIGRAM_JSON, _L.PADDLEFORMERS, _K),
    PruneFact(_P.UNIGRAM_JSON, _L.PADDLENLP_28, _N, _PNLP_NO_FAST),
    PruneFact(_P.WORDPIECE_JSON, _L.TOKENIZERS, _K),
    PruneFact(_P.WORDPIECE_JSON, _L.TRANSFORMERS, _K),
    PruneFact(_P.WORDPIECE_JSON, _L.PADDLEFORMERS, _K),
    PruneFact(_P.WORDPIECE_TXT, _L.TRANSFORMERS, _K),
    PruneFact(_P.WORDPIECE_TXT, _L.PADDLEFORMERS, _K),
    PruneFact(_P.WORDPIECE_TXT, _L.PADDLENLP_28, _K),
    PruneFact(_P.GPT2_BPE, _L.TRANSFORMERS, _K),
    PruneFact(_P.GPT2_BPE, _L.PADDLEFORMERS, _K),
    PruneFact(_P.GPT2_BPE, _L.PADDLENLP_28, _K),
    PruneFact(_P.SP_BPE, _L.SENTENCEPIECE, _K),
    PruneFact(_P.SP_BPE, _L.TRANSFORMERS, _K),
    PruneFact(_P.SP_BPE, _L.PADDLEFORMERS, _K),
    PruneFact(_P.SP_BPE, _L.PADDLENLP_28, _K),
    PruneFact(_P.SP_UNIGRAM, _L.SENTENCEPIECE, _K),
    PruneFact(_P.SP_UNIGRAM, _L.TRANSFORMERS, _A, _SP_AS_BPE),
    PruneFact(_P.SP_UNIGRAM, _L.PADDLEFORMERS, _A, _SP_AS_BPE),
    PruneFact(_P.SP_UNIGRAM, _L.PADDLENLP_28, _N, _PNLP_SP_NAME),
)
"""Every (pruned format, loader) fact measured; a pair absent here is not claimed."""

PRUNE_PROOF_TEST = "tests/oracles/test_prune_tokenizers.py::test_prune_loader_fact"
PRUNE_PROOFS: Mapping[str, str] = MappingProxyType(
    {f.key: f"{PRUNE_PROOF_TEST}[{f.key}]" for f in PRUNE_FACTS}
)
"""Prune fact key (:attr:`PruneFact.key`) → the pytest node id of the test that proved it."""


def prune_apart(fmt: PrunedFormat) -> tuple[TokenizerLoader, ...]:
    """The loaders that read a ``fmt`` model by their own conversion and split text otherwise than the
    library tietool prunes and checks it with (:attr:`PruneOutcome.SEGMENTS_APART`): a folder they load
    that file from (no ``tokenizer.json`` beside it) cannot be pruned consistently for them."""
    return tuple(f.loader for f in PRUNE_FACTS if f.fmt is fmt and f.outcome is PruneOutcome.SEGMENTS_APART)


def prune_proven(fmt: PrunedFormat) -> tuple[TokenizerLoader, ...]:
    """The loaders proven to encode a ``prune`` output of ``fmt`` as the old encoding renumbered (empty: the
    format's pruning is unproven, and ``prune`` refuses it)."""
    return tuple(f.loader for f in PRUNE_FACTS if f.fmt is fmt and f.outcome is PruneOutcome.KEEPS_ENCODING)
