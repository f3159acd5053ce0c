"""The vocabulary of tietool as enums: the options of the operations (one copy, shared by the library and
the CLI), and the facts that travel between the layers (a head's layout, how its values compare with the
embedding, the container of the weights, the operation, how the embedding was found).

The fact enums are :class:`StrEnum` (Python 3.11's ``enum.StrEnum``, here for 3.10): each member *is* its
string (``HeadLayout.VOCAB_HIDDEN == "vocab-hidden"``, ``f"{m}"`` and ``json.dumps`` give the value), so
``inspect --json``, the report and every message keep today's strings exactly.

This module imports nothing heavy (no numpy), so the CLI can build its ``--help`` from it.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A ``str`` enum whose ``str()`` and ``format()`` are its value (as Python 3.11's ``enum.StrEnum``):
    ``f"{HeadLayout.VOCAB_HIDDEN}"`` is ``vocab-hidden``, never ``HeadLayout.VOCAB_HIDDEN``. ``repr`` stays
    the enum's (:func:`~surgery.model.errors.api_wording` words a member by its value)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Layout(StrEnum):
    """The LM head's layout: ``[vocab_size, hidden_size]`` or ``[hidden_size, vocab_size]`` (a Paddle
    ``nn.Linear`` weight ``[in_features, out_features]``). ``AUTO``: told from the shapes and the loader."""

    AUTO = "auto"
    VOCAB_HIDDEN = "vocab-hidden"
    HIDDEN_VOCAB = "hidden-vocab"


class Keep(StrEnum):
    """``tie`` of a head that differs from the embedding: whose values the tied table takes."""

    EMBEDDING = "embedding"
    HEAD = "head"


class Init(StrEnum):
    """Values of new rows: the mean of the old rows (HF ``mean_resizing``), zeros, or
    normal(0, ``initializer_range``)."""

    MEAN = "mean"
    ZEROS = "zeros"
    NORMAL = "normal"


class TransplantInit(StrEnum):
    """How ``transplant`` makes the row of a donor token the old vocabulary lacks (mergekit-tokensurgeon's
    methods of the same names)."""

    SUBWORD = "subword"  # the mean of the old rows of the pieces the old tokenizer splits its text into
    MEAN = "mean"  # the mean of every old row
    ZEROS = "zeros"
    OMP = "omp"  # orthogonal matching pursuit over the shared tokens in the donor model (needs its weights)


class TokenInit(StrEnum):
    """Values of the row of a token ``add-tokens`` adds (:func:`surgery.plan.add_tokens.plan_add_tokens`).

    ``SUBTOKENS``: the mean of the rows of the ids the tokenizer before the edit splits the string into
    (the recipe of most fine-tuning guides). ``MEAN``: HF ``mean_resizing`` over every row (as ``resize
    --init mean``). ``TRAINED_MEAN``: the same over the rows of trained tokens only (unsloth's
    ``mean_of_trained_tokens`` rule). ``ZEROS``. ``COPY``: the row of one token (``copy:TOKEN``).
    """

    SUBTOKENS = "subtokens"
    MEAN = "mean"
    TRAINED_MEAN = "trained-mean"
    ZEROS = "zeros"
    COPY = "copy"


class Loader(StrEnum):
    """The library that will load the output (its facts are in :mod:`surgery.arch`)."""

    PADDLEFORMERS = "paddleformers"
    PADDLENLP_28 = "paddlenlp-2.8"
    PADDLENLP_3 = "paddlenlp-3"
    HF = "hf"


class Target(StrEnum):
    """What ``convert`` writes: PaddleFormers/HF safetensors (HF names, Linear ``[out, in]``), PaddleNLP 2.x
    ``.pdparams`` (``llama.`` names, Linear ``[in, out]``, head ``[hidden, vocab]``), or the same names and
    layouts in another container."""

    PADDLEFORMERS = "paddleformers"
    PADDLENLP = "paddlenlp"
    SAFETENSORS = "safetensors"
    PDPARAMS = "pdparams"


class HeadLayout(StrEnum):
    """How a stored LM head lies: ``[vocab_size, hidden_size]`` (PaddleFormers 1.x, BERT/ERNIE, HF) or
    ``[hidden_size, vocab_size]`` (a Paddle ``nn.Linear`` weight ``[in, out]``: PaddleNLP Llama, Mixtral,
    Qwen). ``AMBIGUOUS``: a square head (``vocab_size == hidden_size``) whose shape cannot tell, and no
    layout was given (:func:`~surgery.inspect.detect.detect`)."""

    VOCAB_HIDDEN = "vocab-hidden"
    HIDDEN_VOCAB = "hidden-vocab"
    AMBIGUOUS = "ambiguous"


LAYOUTS: tuple[HeadLayout, HeadLayout] = (HeadLayout.VOCAB_HIDDEN, HeadLayout.HIDDEN_VOCAB)
"""The two layouts a head can be written in (``AMBIGUOUS`` is no layout)."""


class TieState(StrEnum):
    """How the LM head's values compare with the input embedding's (``Comparison.values``; the third way
    of the tie state, after the config flag and the head's presence in the files)."""

    EXACT = "exact"
    """The same bytes, as stored (or one storage: ``Comparison.storage_shared``)."""
    TRANSPOSED = "transposed"
    """A ``[hidden, vocab]`` head equal to the embedding's transpose."""
    SCALED = "scaled"
    """The head equals the embedding × ``d_model ** -0.5`` (T5's tied head, materialised)."""
    DIFFERENT = "different"
    """Other values, or a shape that cannot be compared."""
    ABSENT = "absent"
    """No head in the files."""
    SHARED = "shared"
    """No head in the files, and the head *is* the embedding (T5's shared table)."""
    NO_EMBEDDING = "no_embedding"
    """The embedding is missing; the head holds the only table."""
    UNKNOWN = "unknown"
    """Not compared (``compare_values=False``: inspect without the value comparison)."""


class ValueCompare(StrEnum):
    """How far :func:`~surgery.inspect.detect.detect` reads the head and embedding values."""

    NONE = "none"
    """Not read: only a storage shared in the file is told."""
    FULL = "full"
    """Every row, with the drift of a difference."""
    FIRST_DIFFERENCE = "first-difference"
    """Up to the first differing chunk (equal or not, no magnitude)."""


EQUAL_STATES: tuple[TieState, TieState] = (TieState.EXACT, TieState.TRANSPOSED)
"""The states of a head that equals the embedding as a table (as stored, or transposed)."""


class Container(StrEnum):
    """The file format of the weights (a checkpoint's, or the one ``convert`` / ``merge`` writes)."""

    SAFETENSORS = "safetensors"
    PDPARAMS = "pdparams"


class Operation(StrEnum):
    """The operations of tietool (the commands of the CLI and the functions of :mod:`tietool`)."""

    INSPECT = "inspect"
    TIE = "tie"
    UNTIE = "untie"
    RESIZE = "resize"
    ADD_TOKENS = "add-tokens"
    FIX_UNTRAINED = "fix-untrained"
    RENAME_TOKENS = "rename-tokens"
    PRUNE = "prune"
    TRANSPLANT = "transplant"
    VERIFY = "verify"
    CONVERT = "convert"
    MERGE = "merge"


class FoundBy(StrEnum):
    """How the input embedding was found (``inspect --json``'s ``embedding.found_by``)."""

    NAMED = "named by the caller"
    TABLE = "the family's preferred name"
    OTHER_NAME = "another known name"
    SHAPE = "its shape"
    MISSING = "missing"


class TensorRole(str, Enum):
    """What a tensor is to the vocabulary, in the one vocabulary every architecture table uses (gguf-py's
    ``MODEL_TENSOR``): ``FAMILIES`` names the input embedding, LM head and bias suffixes per family,
    ``TENSOR_PARALLEL`` and ``CONVERSIONS`` say which of their suffixes is the embedding and which the head,
    and detection files every tensor of the vocabulary surface under one role (every tensor with a
    vocabulary axis has one). The values are the words ``inspect`` prints."""

    INPUT_EMBEDDING = "input embedding"
    LM_HEAD = "LM head"
    HEAD_BIAS = "head bias"
    EMBEDDING_ALIAS = "embedding alias"  # another name for the input embedding's table (encoder/decoder)
    HEAD_ALIAS = "head alias"  # another name for the head's storage
    EXTRA_TABLE = "extra vocabulary table"  # MTP embed/head copies, per-layer token tables
    TOKEN_TABLE = "token-indexed table"  # integer/bool, one entry per token id (TOKEN_TABLES rule)
    TOKEN_ID_MAP = "token-id map"  # values are token ids of the vocabulary (TOKEN_TABLES rule)
    OTHER_VOCABULARY = "table of another vocabulary"  # sized by another config vocabulary (draft, talker)
    BY_SHAPE = "vocab-shaped tensor"  # no known name or rule; found by an axis of the vocabulary's size


class TiedScale(str, Enum):
    """What a family's loader multiplies the tied head (the embedding) by for the logits: nothing, or
    ``d_model ** -0.5`` (T5 / mT5 / UMT5: ``sequence_output * (d_model ** -0.5)`` before the tied
    ``lm_head``, PaddleNLP 2.8.1 ``t5/modeling.py``). The value is the factor as messages print it."""

    NONE = "none"
    RSQRT_D_MODEL = "d_model ** -0.5"
