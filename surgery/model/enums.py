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
    """The library that will load the output (its facts are in :mod:`surgery.arch.families`)."""

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


class Container(str, Enum):
    """The file format of the weights."""

    SAFETENSORS = "safetensors"
    PDPARAMS = "pdparams"
