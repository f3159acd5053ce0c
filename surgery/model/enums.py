"""The options of the operations as enums (one copy, shared by the library and the CLI).

This module imports nothing heavy (no numpy), so the CLI can build its ``--help`` from it.
"""

from __future__ import annotations

from enum import Enum


class Layout(str, Enum):
    """The LM head's layout: ``[vocab_size, hidden_size]`` or ``[hidden_size, vocab_size]`` (a Paddle
    ``nn.Linear`` weight ``[in_features, out_features]``). ``AUTO``: told from the shapes and the loader."""

    AUTO = "auto"
    VOCAB_HIDDEN = "vocab-hidden"
    HIDDEN_VOCAB = "hidden-vocab"


class Keep(str, Enum):
    """``tie`` of a head that differs from the embedding: whose values the tied table takes."""

    EMBEDDING = "embedding"
    HEAD = "head"


class Init(str, Enum):
    """Values of new rows: the mean of the old rows (HF ``mean_resizing``), zeros, or
    normal(0, ``initializer_range``)."""

    MEAN = "mean"
    ZEROS = "zeros"
    NORMAL = "normal"


class Loader(str, Enum):
    """The library that will load the output (its facts are in :mod:`surgery.arch`)."""

    PADDLEFORMERS = "paddleformers"
    PADDLENLP_28 = "paddlenlp-2.8"
    PADDLENLP_3 = "paddlenlp-3"
    HF = "hf"


class Target(str, Enum):
    """What ``convert`` writes: PaddleFormers/HF safetensors (HF names, Linear ``[out, in]``), PaddleNLP 2.x
    ``.pdparams`` (``llama.`` names, Linear ``[in, out]``, head ``[hidden, vocab]``), or the same names and
    layouts in another container."""

    PADDLEFORMERS = "paddleformers"
    PADDLENLP = "paddlenlp"
    SAFETENSORS = "safetensors"
    PDPARAMS = "pdparams"


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
