"""The architecture table: which tensors are the input embedding, the LM head and its bias, per model family,
and what each loader does with them. Adding a model is adding a row; no other module knows model names.

Names are matched as dotted *suffixes*: ``"embed_tokens.weight"`` matches ``model.embed_tokens.weight``
(PaddleFormers / HF), ``llama.embed_tokens.weight`` (PaddleNLP) and
``model.language_model.embed_tokens.weight`` (vision-language wrappers). ``head`` names are matched the
same way. Sources: PaddleNLP 2.8.1 and PaddleFormers 1.2.0 ``modeling.py`` of each family, and the fixtures
in ``shared/fixtures`` (see its README, "Loader checks").

Loader facts, per loader:

* ``layout``: the layout the loader expects for a head it reads from the file — ``vocab-hidden`` is
  ``[vocab_size, hidden_size]`` (an embedding-shaped head, used with ``transpose_y``), ``hidden-vocab`` is
  ``[hidden_size, vocab_size]`` (a Paddle ``nn.Linear`` weight, ``[in_features, out_features]``).
* ``reties``: a checkpoint without the head loads with the head tied to the embedding when the config says
  tied. False means the loader builds a random head instead (PaddleNLP 2.8 Llama/Mixtral/OPT), so ``tie``
  must keep the head in the file.
* ``always_tied``: the loader ties the head to the embedding whatever the config says, so an untied head
  in the file is ignored (``untie`` refuses).
* ``warns_missing_head``: the loader logs a dropped head as "newly initialized" although it loads it tied
  to the embedding with identical logits (PaddleNLP 2.8.1 GPT/BERT/ERNIE); ``tie`` says so, so that the
  warning does not scare the user into undoing it.
* ``tie_default``: the config class's default for ``tie_word_embeddings``; PaddleNLP leaves the key out of
  config.json when it equals the default.

A loader's facts may differ by container (a ``loaders`` key ``"paddleformers/pdparams"`` is PaddleFormers
reading a legacy ``.pdparams`` with ``load_checkpoint_format="legacy"``; it wins over ``"paddleformers"``)
and by model type within a family (``model_loaders``: ``{model_type: {loader key: facts}}``, consulted
first). Those facts were checked by loading tie/untie outputs of real PaddleFormers 1.2 checkpoints of each
model type in both containers (``tests/test_families.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import TypedDict, TypeVar

from .errors import UsageError

# Loaders tietool knows. "hf" is the HF-transformers naming (model.*, transformer.*) that PaddleFormers reads.
LOADERS = ("paddleformers", "paddlenlp-2.8", "paddlenlp-3", "hf")

# first name component of PaddleNLP-era checkpoints (PaddleFormers and HF use model./transformer.)
PADDLENLP_PREFIXES = (
    "llama",
    "qwen",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "mixtral",
    "gpt",
    "ernie",
    "bert",
    "t5",
    "bart",
    "chatglm",
    "chatglm_v2",
    "bloom",
    "opt",
    "baichuan",
    "gemma",
    "mistral",
    "deepseek_v2",
    "deepseek_v3",
    "yuan",
    "roberta",
)


class VocabRole(str, Enum):
    """What one tensor of the vocabulary surface is (every tensor with a vocabulary axis has one role)."""

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


# Extra vocabulary tables, as regular expressions matched against the end of a tensor name (any family).
# A name matching one of these is never the main embedding or head, whatever the file order: DeepSeek-V3
# multi-token-prediction layers hold their own embed_tokens and shared_head.head (copies of the main pair,
# model.layers.<num_hidden_layers + k>.*); Gemma-3n holds a per-layer token table.
EXTRA_TABLES: tuple[str, ...] = (
    r"layers\.\d+\.embed_tokens\.weight",
    r"layers\.\d+\.shared_head\.head\.weight",
    r"mtp\.(?:.*\.)?embed_tokens\.weight",
    r"mtp\.(?:.*\.)?(?:lm_)?head\.weight",
    r"embed_tokens_per_layer\.weight",
)


class TokenRule(str, Enum):
    """How a token-indexed table follows a resize of the vocabulary it is indexed by (or keyed to)."""

    CYCLE_ROWS = "new rows repeat existing rows"  # row V + j = row j mod V: every value stays one in use
    NEW_FALSE = "new entries false/zero"  # a membership mask: a new token is not a member
    KEEP_IDS = "kept; its values are token ids"  # indexed by another vocabulary; ids must stay < the rows


@dataclass(frozen=True)
class TokenTable:
    """A token-indexed integer or boolean tensor whose meaning is known (one row of :data:`TOKEN_TABLES`).

    Attributes:
        pattern: regular expression matched against the end of a tensor name (after a dot or at the start).
        kind: ``int`` (any integer dtype) or ``bool``.
        ndim: its number of axes.
        indexed_by: ``vocab``: axis 0 counts the embedding's vocabulary (it is resized with it);
            ``other``: axis 0 counts another vocabulary the config names (``draft_vocab_size``): it is kept.
        rule: how a resize treats it (:class:`TokenRule`).
        bound: config keys (at the language model's level or the top), the first present of which bounds
            its values (``n_routed_experts``); empty: no bound checked.
        what: what it is, in words.
        source: where the fact comes from.
    """

    pattern: str
    kind: str
    ndim: int
    indexed_by: str
    rule: TokenRule
    bound: tuple[str, ...]
    what: str
    source: str


# Integer/boolean tensors indexed by token id (or holding token ids), with the rule a resize follows. A
# tensor of this kind that no row matches (by name, dtype and number of axes) makes resize refuse naming it.
TOKEN_TABLES: tuple[TokenTable, ...] = (
    TokenTable(
        r"tid2eid",
        "int",
        2,
        "vocab",
        TokenRule.CYCLE_ROWS,
        ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"),
        "hash-routing table: the experts of each token id",
        "DeepSeek-V4 inference/model.py Gate of the first num_hash_layers layers: tid2eid[input_ids] "
        "(vllm-project/vllm#50844: a table left at the old rows is read out of bounds for new ids)",
    ),
    TokenTable(
        r"t2d",
        "bool",
        1,
        "vocab",
        TokenRule.NEW_FALSE,
        (),
        "EAGLE-3 target→draft mask: whether a target token id is in the draft vocabulary",
        "SpecForge / sglang llama_eagle3 (sgl-project/SpecForge#139): t2d [vocab_size], True count = "
        "draft_vocab_size",
    ),
    TokenTable(
        r"d2t",
        "int",
        1,
        "other",
        TokenRule.KEEP_IDS,
        (),
        "EAGLE-3 draft→target offsets: target id = draft id + d2t[draft id]",
        "SpecForge / sglang llama_eagle3 (sgl-project/SpecForge#139): d2t [draft_vocab_size]",
    ),
)


def token_table(name: str, kind: str, ndim: int) -> TokenTable | None:
    """The :data:`TOKEN_TABLES` row for a tensor ``name`` of dtype kind ``kind`` (``int``/``bool``) and
    ``ndim`` axes, or None."""
    return next(
        (
            r
            for r in TOKEN_TABLES
            if r.kind == kind and r.ndim == ndim and re.search(r"(?:^|\.)" + r.pattern + "$", name)
        ),
        None,
    )


# Config blocks of a language model (its vocabulary is the text vocabulary), at any nesting.
TEXT_BLOCKS: tuple[str, ...] = ("text_config", "llm_config", "language_config")

# A model_type two layouts share: the family is told by the names the files hold (``{model_type: [(family,
# suffixes any of which marks it)]}``), never by the model type alone. THUDM's ChatGLM2/3 and GLM-4 remote
# code says ``chatglm`` like ChatGLM v1 but stores transformer.embedding.word_embeddings and a separate
# head transformer.output_layer (zai-org/ChatGLM3#1072); v1 stores transformer.word_embeddings and
# lm_head.
NAME_LAYOUTS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "chatglm": [("chatglm_v2", ("output_layer.weight", "embedding.word_embeddings.weight"))],
}


# Families whose LM head sits inside the model's top module, beside the embedding, rather than at the top
# level: ChatGLM2/3 and GLM-4 ``transformer.output_layer`` (THUDM modeling_chatglm.py, PaddleNLP
# ``chatglm_v2.output_layer``). A head untie writes gets the embedding's first name component there.
HEAD_UNDER_MODEL: tuple[str, ...] = ("chatglm_v2",)


def model_type_by_names(model_type: str | None, names) -> str | None:
    """``model_type``, or the model type of the family whose names the files hold (:data:`NAME_LAYOUTS`)."""
    for family, marks in NAME_LAYOUTS.get(model_type or "", []):
        if any(matches(n, m) for n in names for m in marks):
            row = next(r for r in FAMILIES if r["family"] == family)
            return row["model_types"][0]
    return model_type


def is_listed_extra(name: str) -> bool:
    """``name`` matches one of :data:`EXTRA_TABLES`."""
    return any(re.search(r"(?:^|\.)" + p + "$", name) for p in EXTRA_TABLES)


def is_extra_table(name: str) -> bool:
    """``name`` is an extra vocabulary table (:data:`EXTRA_TABLES`) or lies inside a numbered block
    (``...layers.3.``): a copy inside a layer, never the model's own table."""
    if is_listed_extra(name):
        return True
    return any(part.isdigit() for part in name.split(".")[:-2])


def depth(name: str) -> int:
    """Module depth of a tensor: the number of dotted components before the parameter name."""
    return name.count(".")


class _LoaderFactsRequired(TypedDict):
    layout: str  # "vocab-hidden" or "hidden-vocab"
    reties: bool


class LoaderFacts(_LoaderFactsRequired, total=False):
    """One loader's facts for a family (see the module docstring)."""

    always_tied: bool
    warns_missing_head: bool


class _FamilyRowRequired(TypedDict):
    family: str
    model_types: list[str]
    embedding: list[str]
    aliases: list[str]
    head: list[str]
    bias: list[str]
    tie_default: dict[str, bool]
    loaders: dict[str, LoaderFacts]


class FamilyRow(_FamilyRowRequired, total=False):
    """One row of ``FAMILIES`` (keys described above the table)."""

    tied_logit_scale: str
    model_loaders: dict[str, dict[str, LoaderFacts]]


_PF_LIKE: LoaderFacts = {"layout": "vocab-hidden", "reties": True}
# PaddleFormers 1.2 models that never build a missing head from the embedding: tie keeps the head
_PF_NO_RETIE: LoaderFacts = {"layout": "vocab-hidden", "reties": False}
_PNLP_LINEAR_HEAD_NO_RETIE: LoaderFacts = {"layout": "hidden-vocab", "reties": False}
_PNLP_LINEAR_HEAD_RETIE: LoaderFacts = {"layout": "hidden-vocab", "reties": True}
_PNLP_EMBED_HEAD: LoaderFacts = {"layout": "vocab-hidden", "reties": True}
# PaddleNLP GPT/BERT/ERNIE: a dropped head loads tied (identical logits) but is logged as newly initialized
_PNLP_EMBED_HEAD_WARNS: LoaderFacts = {**_PNLP_EMBED_HEAD, "warns_missing_head": True}
_PNLP_ALWAYS_TIED_WARNS: LoaderFacts = {**_PNLP_EMBED_HEAD_WARNS, "always_tied": True}

# Every family's rows. Keys:
#   model_types: config.json model_type values (also text_config.model_type)
#   embedding:   suffixes of the input embedding, in order of preference ([vocab_size, hidden_size])
#   aliases:     suffixes of other names for the same table (encoder/decoder copies)
#   head:        suffixes of the LM head weight
#   bias:        suffixes of the LM head bias ([vocab] or [1, vocab]); the first present is "the" bias,
#                the others present are its aliases
#   tie_default: per loader (missing loader -> "*")
#   loaders:     per loader: layout and reties (missing loader -> "*"); "LOADER/CONTAINER" (container:
#                pdparams or safetensors) wins over "LOADER"
#   model_loaders: {model_type: loaders} for the model types of a family whose loaders differ
#   tied_logit_scale: logits of the tied head are multiplied by this (T5: d_model ** -0.5)
FAMILIES: list[FamilyRow] = [
    {  # Llama and its descendants with the same names
        "family": "llama",
        "model_types": [
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "qwen2_moe",
            "qwen3_moe",
            "mixtral",
            "ernie4_5",
            "ernie4_5_moe",
            "phi3",
            "gpt_oss",
            "deepseek_v2",
            "deepseek_v3",
            "baichuan",
            "yuan",
            "qwen3_vl",
            "qwen3_vl_text",
            "qwen2_vl",
            "qwen2_5_vl",
            "mistral3",
            "llava",
            "internlm",
            "internlm2",
            "glm4",
        ],
        "embedding": ["embed_tokens.weight", "tok_embeddings.weight"],
        "aliases": [],
        "head": ["lm_head.weight", "output.weight"],
        "bias": ["lm_head.bias"],
        "tie_default": {"*": False},
        "loaders": {
            "paddleformers": _PF_LIKE,
            "hf": _PF_LIKE,
            "paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE,
            "paddlenlp-3": _PNLP_LINEAR_HEAD_RETIE,
        },
        # PaddleFormers 1.2, checked by loading outputs (tests/test_families.py): Qwen2/Qwen3 re-tie a dropped
        # head from safetensors but not from a legacy .pdparams (newly initialized, random logits); Phi3
        # never rebuilds a missing head ("lm_head.weight should be assigned before!" / random); GptOss and
        # DeepSeek-V3 ignore tie_word_embeddings altogether (no tie_weights), so a dropped head is lost.
        "model_loaders": {
            "qwen2": {"paddleformers/pdparams": _PF_NO_RETIE, "hf/pdparams": _PF_NO_RETIE},
            "qwen3": {"paddleformers/pdparams": _PF_NO_RETIE, "hf/pdparams": _PF_NO_RETIE},
            "phi3": {"paddleformers": _PF_NO_RETIE, "hf": _PF_NO_RETIE},
            "gpt_oss": {"paddleformers": _PF_NO_RETIE, "hf": _PF_NO_RETIE},
            "deepseek_v3": {"paddleformers": _PF_NO_RETIE, "hf": _PF_NO_RETIE},
        },
    },
    {  # Gemma: Llama names, tied by default. PaddleFormers 1.2's Gemma3ForCausalLM always loads lm_head
        # from model.embed_tokens.weight (its AOA config) when it reads safetensors, whatever
        # tie_word_embeddings says: an untied head is ignored. Its legacy .pdparams loader reads
        # lm_head.weight as stored and does not re-tie a dropped one (checked in tests/test_families.py).
        "family": "gemma",
        "model_types": ["gemma", "gemma2", "gemma3", "gemma3_text"],
        "embedding": ["embed_tokens.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {
            "paddleformers": {**_PF_LIKE, "always_tied": True},
            "paddleformers/pdparams": _PF_NO_RETIE,
            "hf": _PF_LIKE,
            "hf/pdparams": _PF_NO_RETIE,
            "paddlenlp-2.8": _PNLP_EMBED_HEAD,
            "paddlenlp-3": _PNLP_EMBED_HEAD,
        },
    },
    {  # OPT: PaddleNLP's OPTLMHead holds decoder_weight [vocab, hidden] and is never tied (L14)
        "family": "opt",
        "model_types": ["opt"],
        "embedding": ["embed_tokens.weight", "embeddings.word_embeddings.weight"],
        "aliases": [],
        "head": ["lm_head.weight", "lm_head.decoder_weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {
            "paddleformers": _PF_LIKE,
            "hf": _PF_LIKE,
            "paddlenlp-2.8": {"layout": "vocab-hidden", "reties": False},
            "paddlenlp-3": {"layout": "vocab-hidden", "reties": False},
        },
    },
    {  # GPT (PaddleNLP gpt.embeddings.word_embeddings; HF GPT-2 transformer.wte). PaddleNLP 2.8.1's
        # GPTForCausalLM builds its head from the word embedding whatever tie_word_embeddings says (checked
        # on the pnlp_gpt fixture): an lm_head.weight in the file is ignored, and a dropped one is reported
        # as "newly initialized" although it loads tied with identical logits.
        "family": "gpt",
        "model_types": ["gpt", "gpt2", "gpt-cpm", "gpt_neo", "codegen"],
        "embedding": ["embeddings.word_embeddings.weight", "wte.weight"],
        "aliases": [],
        "head": ["lm_head.weight", "lm_head.decoder_weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {
            "paddlenlp-2.8": _PNLP_ALWAYS_TIED_WARNS,
            "paddlenlp-3": _PNLP_ALWAYS_TIED_WARNS,
            "*": _PNLP_EMBED_HEAD,
        },
    },
    {  # BERT / ERNIE / RoBERTa masked LM: the decoder is [vocab, hidden] with transpose_y, bias aliased
        "family": "bert",
        "model_types": [
            "bert",
            "ernie",
            "roberta",
            "ernie_m",
            "electra",
            "tinybert",
            "ppminilm",
            "nezha",
            "xlm-roberta",
        ],
        "embedding": ["embeddings.word_embeddings.weight"],
        "aliases": [],
        "head": [
            "cls.predictions.decoder.weight",
            "cls.predictions.decoder_weight",
            "lm_head.decoder.weight",
            "lm_head.decoder_weight",
        ],
        "bias": [
            "cls.predictions.bias",
            "cls.predictions.decoder.bias",
            "cls.predictions.decoder_bias",
            "lm_head.bias",
            "lm_head.decoder.bias",
            "lm_head.decoder_bias",
        ],
        "tie_default": {"*": True},
        "loaders": {
            "paddlenlp-2.8": _PNLP_EMBED_HEAD_WARNS,
            "paddlenlp-3": _PNLP_EMBED_HEAD_WARNS,
            "*": _PNLP_EMBED_HEAD,
        },
    },
    {  # T5: shared = encoder.embed_tokens = decoder.embed_tokens; the tied head is shared, logits scaled
        "family": "t5",
        "model_types": ["t5", "mt5", "umt5"],
        "embedding": ["shared.weight"],
        "aliases": ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {
            "*": _PNLP_EMBED_HEAD,
            "paddlenlp-2.8": _PNLP_LINEAR_HEAD_RETIE,
            "paddlenlp-3": _PNLP_LINEAR_HEAD_RETIE,
        },
        "tied_logit_scale": "d_model ** -0.5",
    },
    {  # BART / mBART / M2M100 / Pegasus: shared table, head lm_head(.weight|_weight),
        # final_logits_bias [1, V]
        "family": "bart",
        "model_types": [
            "bart",
            "mbart",
            "m2m_100",
            "pegasus",
            "marian",
            "blenderbot",
            "codegen2",
            "unified_transformer",
        ],
        "embedding": ["shared.weight", "embed_tokens.weight"],
        "aliases": ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"],
        "head": ["lm_head.weight", "lm_head_weight"],
        "bias": ["final_logits_bias"],
        # PaddleNLP's BART keeps lm_head_weight as a parameter of its own (initialised from the embedding)
        "tie_default": {"paddlenlp-2.8": False, "paddlenlp-3": False, "*": True},
        "loaders": {"*": _PNLP_EMBED_HEAD},
    },
    {  # XLNet
        "family": "xlnet",
        "model_types": ["xlnet"],
        "embedding": ["word_embedding.weight"],
        "aliases": [],
        "head": ["lm_loss.weight"],
        "bias": ["lm_loss.bias"],
        "tie_default": {"*": True},
        "loaders": {"*": _PNLP_EMBED_HEAD},
    },
    {  # ChatGLM v1: PaddleNLP's ChatGLMForConditionalGeneration uses the word embedding itself as lm_head
        "family": "chatglm",
        "model_types": ["chatglm"],
        "embedding": ["word_embeddings.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {"*": _PNLP_EMBED_HEAD},
    },
    {  # ChatGLM v2/v3: transformer.embedding.word_embeddings + a separate output_layer
        "family": "chatglm_v2",
        "model_types": ["chatglm_v2", "chatglm2", "chatglm3"],
        "embedding": ["word_embeddings.weight"],
        "aliases": [],
        "head": ["output_layer.weight", "lm_head.weight"],
        "bias": [],
        "tie_default": {"*": False},
        "loaders": {
            "paddleformers": _PF_LIKE,
            "hf": _PF_LIKE,
            "paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE,
            "paddlenlp-3": _PNLP_LINEAR_HEAD_NO_RETIE,
        },
    },
    {  # Falcon: transformer.word_embeddings + lm_head, tied by default (HF FalconConfig)
        "family": "falcon",
        "model_types": ["falcon", "RefinedWeb", "RefinedWebModel"],
        "embedding": ["word_embeddings.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {"*": _PF_LIKE},
    },
    {  # Bloom: word_embeddings; PaddleNLP writes only the embedding. PaddleNLP 2.8.1's BloomForCausalLM
        # always builds its head from the word embedding: an lm_head.weight in the file is reported unused.
        "family": "bloom",
        "model_types": ["bloom"],
        "embedding": ["word_embeddings.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {
            "paddlenlp-2.8": {**_PNLP_EMBED_HEAD, "always_tied": True},
            "paddlenlp-3": {**_PNLP_EMBED_HEAD, "always_tied": True},
            "*": _PNLP_EMBED_HEAD,
        },
    },
]

# Used when model_type is not in the table: the common names, then a shape search (detect.py says so).
FALLBACK: FamilyRow = {
    "family": "unknown",
    "model_types": [],
    "embedding": [
        "embed_tokens.weight",
        "word_embeddings.weight",
        "wte.weight",
        "shared.weight",
        "tok_embeddings.weight",
        "word_embedding.weight",
    ],
    "aliases": ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"],
    "head": [
        "lm_head.weight",
        "output.weight",
        "lm_head_weight",
        "output_layer.weight",
        "embed_out.weight",
        "lm_head.decoder_weight",
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder_weight",
        "lm_loss.weight",
    ],
    "bias": [
        "lm_head.bias",
        "final_logits_bias",
        "cls.predictions.bias",
        "cls.predictions.decoder_bias",
        "cls.predictions.decoder.bias",
        "lm_loss.bias",
    ],
    "tie_default": {"*": False},
    "loaders": {"*": _PF_LIKE},
}


# ============================================================================ tensor parallelism (merge)
# How each tensor of a family is split across tensor-parallel ranks, as the libraries' own
# ``_get_tensor_parallel_mappings`` split it (PaddleNLP 2.8 ``llama/modeling.py`` and ``qwen2/modeling.py``,
# PaddleFormers ``phi3`` and ``ernie4_5``; the split/merge helpers are PaddleFormers 1.2
# ``conversion_utils.py`` ``normal_fuse_split_tp`` / ``naive_fuse_split_tp``). Every tensor is in Paddle's
# layout (a Linear weight is ``[in, out]``): rank files are written by PaddleNLP / PaddleFormers' legacy
# ``.pdparams`` save. ``tietool merge`` (:mod:`surgery.merge`) reads only this table.


class TPSplit(str, Enum):
    """How one tensor is cut across the tensor-parallel ranks (and so how ``merge`` joins it)."""

    VOCAB = "vocab"  # VocabParallelEmbedding: vocabulary rows (axis 0)
    HEAD = "head"  # LM head: its vocabulary axis, from the shapes ([hidden, vocab] → 1, [vocab, hidden] → 0)
    COLUMN = "column"  # ColumnParallelLinear weight/bias: the output axis (last), is_column=True
    ROW = "row"  # RowParallelLinear weight: the input axis (0), is_column=False
    REPLICATED = "replicated"  # norms, RowParallelLinear biases: the same on every rank
    FUSED_2 = "fused-2"  # is_naive_2fuse: rank r holds [gate_r, up_r]; merged [gate_0..gate_n, up_0..up_n]
    FUSED_3 = "fused-3"  # is_naive_3fuse: rank r holds [q_r, k_r, v_r] (q is kv_groups/(kv_groups+2))


@dataclass(frozen=True)
class TPRule:
    """One tensor's tensor-parallel split and its whole shape in config terms.

    ``shape`` names config quantities: ``V`` vocab_size, ``H`` hidden_size, ``I`` intermediate_size,
    ``2I`` twice it, ``Q`` num_attention_heads × head_dim, ``KV`` num_key_value_heads × head_dim, ``QKV``
    ``Q + 2 KV``, ``D`` head_dim. A HEAD's shape is ``("V", "H")`` in either order.
    """

    split: TPSplit
    shape: tuple[str, ...]


def _tp(split: TPSplit, *shape: str) -> TPRule:
    return TPRule(split, shape)


_C, _R, _REP = TPSplit.COLUMN, TPSplit.ROW, TPSplit.REPLICATED
# PaddleNLP Llama / Qwen2 (``llama.``, ``qwen2.``) and PaddleFormers (``model.``) names, matched as suffixes.
# A fused qkv_proj is split as a plain column: its layout is grouped per kv head ([q × groups, k, v] per kv
# head, PaddleFormers ``fuse_param_func(is_qkv=True)``), so a column block is whole kv groups (PaddleNLP Llama
# ``fuse_attention_qkv``; PaddleFormers 1.2 Qwen2 ``qkv_proj`` colwise, which asserts kv_heads % tp == 0).
_LLAMA_LIKE_TP: dict[str, TPRule] = {
    "embed_tokens.weight": _tp(TPSplit.VOCAB, "V", "H"),
    "lm_head.weight": _tp(TPSplit.HEAD, "V", "H"),
    "self_attn.q_proj.weight": _tp(_C, "H", "Q"),
    "self_attn.k_proj.weight": _tp(_C, "H", "KV"),  # replicated when kv_heads % tp != 0 (PaddleNLP)
    "self_attn.v_proj.weight": _tp(_C, "H", "KV"),
    "self_attn.q_proj.bias": _tp(_C, "Q"),
    "self_attn.k_proj.bias": _tp(_C, "KV"),
    "self_attn.v_proj.bias": _tp(_C, "KV"),
    "self_attn.qkv_proj.weight": _tp(_C, "H", "QKV"),
    "self_attn.qkv_proj.bias": _tp(_C, "QKV"),
    "self_attn.o_proj.weight": _tp(_R, "Q", "H"),
    "self_attn.o_proj.bias": _tp(_REP, "H"),
    "self_attn.q_norm.weight": _tp(_REP, "D"),
    "self_attn.k_norm.weight": _tp(_REP, "D"),
    "self_attn.rotary_emb.inv_freq": _tp(_REP, "D/2"),
    "mlp.gate_proj.weight": _tp(_C, "H", "I"),
    "mlp.up_proj.weight": _tp(_C, "H", "I"),
    "mlp.gate_up_fused_proj.weight": _tp(TPSplit.FUSED_2, "H", "2I"),  # PaddleNLP fuse_attention_ffn
    "mlp.up_gate_proj.weight": _tp(TPSplit.FUSED_2, "H", "2I"),  # PaddleFormers / ERNIE 4.5
    "mlp.up_gate_proj.bias": _tp(TPSplit.FUSED_2, "2I"),
    "mlp.down_proj.weight": _tp(_R, "I", "H"),
    "mlp.down_proj.bias": _tp(_REP, "H"),
    "input_layernorm.weight": _tp(_REP, "H"),
    "post_attention_layernorm.weight": _tp(_REP, "H"),
    "norm.weight": _tp(_REP, "H"),
}
# PaddleFormers Phi3: qkv_proj is [q, k, v] (not grouped), split by is_naive_3fuse with num_kv_groups.
_PHI3_TP: dict[str, TPRule] = {
    **{k: v for k, v in _LLAMA_LIKE_TP.items() if "qkv_proj" not in k},
    "self_attn.qkv_proj.weight": _tp(TPSplit.FUSED_3, "H", "QKV"),
    "mlp.gate_up_proj.weight": _tp(TPSplit.FUSED_2, "H", "2I"),
}
TENSOR_PARALLEL: dict[str, dict[str, TPRule]] = {
    "llama": _LLAMA_LIKE_TP,
    "mistral": _LLAMA_LIKE_TP,
    "qwen2": _LLAMA_LIKE_TP,
    "qwen3": _LLAMA_LIKE_TP,
    "phi3": _PHI3_TP,
}
"""model_type → {name suffix → :class:`TPRule`}: the one place ``merge`` learns how tensors were split."""

# config keys a tensor-parallel / pipeline-parallel run writes, and their value in a merged checkpoint
PARALLEL_CONFIG_KEYS: dict[str, int] = {
    "tensor_parallel_degree": 1,
    "tensor_parallel_rank": 0,
    "tensor_model_parallel_size": 1,
    "pipeline_parallel_degree": 1,
    "pipeline_model_parallel_size": 1,
}


# the config.json keys each size a TPRule shape names is computed from (merge names the missing ones)
TP_DIM_KEYS: dict[str, tuple[str, ...]] = {
    "V": ("vocab_size",),
    "H": ("hidden_size",),
    "I": ("intermediate_size",),
    "2I": ("intermediate_size",),
    "D": ("hidden_size", "num_attention_heads"),
    "D/2": ("hidden_size", "num_attention_heads"),
    "Q": ("hidden_size", "num_attention_heads"),
    "KV": ("hidden_size", "num_attention_heads"),
    "QKV": ("hidden_size", "num_attention_heads"),
    "GROUPS": ("num_attention_heads",),
}


def tp_rule(model_type: str | None, name: str) -> TPRule | None:
    """The :class:`TPRule` of tensor ``name`` (longest matching suffix) for ``model_type``, or None when
    the family or the name is not in :data:`TENSOR_PARALLEL`."""
    table = TENSOR_PARALLEL.get(model_type or "", {})
    hits = [s for s in table if matches(name, s)]
    return table[max(hits, key=len)] if hits else None


@dataclass(frozen=True)
class Family:
    """One row of the table, resolved for one checkpoint's model_type and loader."""

    name: str
    model_type: str | None
    loader: str
    embedding: tuple[str, ...]
    aliases: tuple[str, ...]
    head: tuple[str, ...]
    bias: tuple[str, ...]
    tie_default: bool
    head_layout: str
    reties: bool
    tied_logit_scale: str | None = None
    always_tied: bool = False
    warns_missing_head: bool = False
    known: bool = True
    notes: tuple[str, ...] = field(default=())


_T = TypeVar("_T")


def _per_loader(
    table: dict[str, _T], loader: str, model_type: str | None, container: str | None = None
) -> _T:
    """The entry of ``table`` for ``model_type`` (when it has one), else for ``loader/container``, else for
    ``loader``, else ``"*"``.

    Raises:
        UsageError: ``loader`` is not one of ``LOADERS`` (every row covers each of those).
    """
    if model_type and model_type in table:
        return table[model_type]
    if container and f"{loader}/{container}" in table:
        return table[f"{loader}/{container}"]
    if loader in table:
        return table[loader]
    if "*" in table:
        return table["*"]
    raise UsageError(f"unknown loader {loader!r}", fix=f"use one of {', '.join(LOADERS)}")


def lookup(model_type: str | None, loader: str, container: str | None = None) -> Family:
    """The table row for ``model_type`` (or the fallback row), with the facts of ``loader`` resolved.

    Args:
        model_type: config.json ``model_type`` (or ``text_config.model_type``); None if absent.
        loader: one of ``LOADERS``.
        container: ``safetensors`` or ``pdparams`` (a loader may read the two differently); None: any.
    """
    row = next((r for r in FAMILIES if model_type in r["model_types"]), None)
    known = row is not None
    row = row or FALLBACK
    own = row.get("model_loaders", {}).get(model_type or "", {})
    key = next((k for k in (f"{loader}/{container}", loader) if k in own), None)
    facts = own[key] if key else _per_loader(row["loaders"], loader, None, container)
    return Family(
        name=row["family"],
        model_type=model_type,
        loader=loader,
        embedding=tuple(row["embedding"]),
        aliases=tuple(row["aliases"]),
        head=tuple(row["head"]),
        bias=tuple(row["bias"]),
        tie_default=bool(_per_loader(row["tie_default"], loader, model_type)),
        head_layout=facts["layout"],
        reties=facts["reties"],
        tied_logit_scale=row.get("tied_logit_scale"),
        always_tied=bool(facts.get("always_tied", False)),
        warns_missing_head=bool(facts.get("warns_missing_head", False)),
        known=known,
    )


def matches(name: str, suffix: str) -> bool:
    """``name`` is ``suffix`` or ends with ``"." + suffix``."""
    return name == suffix or name.endswith("." + suffix)


# ============================================================================ conversions (tietool convert)
# Which tensors of a family are nn.Linear weights (they are transposed between Paddle's [in, out] and the
# HF/PaddleFormers [out, in] layout), which are copied as they are, how PaddleNLP 2.x fused projections
# split, and which config keys change. Sources: PaddleNLP 2.8.1 ``llama/modeling.py`` (``llama.`` names,
# ``qkv_proj`` / ``gate_up_fused_proj`` when ``fuse_attention_qkv`` / ``fuse_attention_ffn``), PaddleFormers
# 1.2.0 ``conversion_utils.py`` (``split_param_func``: qkv grouped per kv head) and the fixtures
# ``pnlp_llama_untied`` / ``pf_llama_untied_legacy_pdparams`` / ``pf_llama_untied_fp32``.
# Only model types PaddleFormers 1.2 has a class for are listed; PaddleFormers 1.2 has no Mistral, GPT,
# BERT or T5 (``PADDLEFORMERS_LACKS``).


class FusedSpec(TypedDict):
    """A PaddleNLP fused projection: its parts (suffixes, same module) and how its output axis splits.

    ``split``: ``"qkv"`` — ``num_attention_heads + 2 * num_key_value_heads`` head-sized chunks grouped per
    kv head ``[q × (heads / kv_heads), k, v] × kv_heads`` (PaddleFormers ``split_param_func(is_qkv=True)``);
    ``"halves"`` — ``[gate, up]`` in two equal halves.
    """

    parts: list[str]
    split: str


class ConversionRow(TypedDict):
    """One row of ``CONVERSIONS``.

    Keys:
        paddlenlp_prefix: first name component of PaddleNLP 2.x checkpoints (``llama``), None when tietool
            knows no PaddleNLP naming of the model type (conversion to PaddleNLP then refuses).
        hf_prefix: first name component of PaddleFormers / HF checkpoints (``model``).
        head: the LM head weight (top level, no prefix): ``[hidden, vocab]`` in PaddleNLP,
            ``[vocab, hidden]`` in PaddleFormers (legacy ``.pdparams`` and safetensors alike).
        linear: suffixes of ``nn.Linear`` weights inside the model body.
        in_hidden: the Linear weights whose in_features is hidden_size (their shape tells the layout).
        plain: suffixes of every other tensor (embeddings, norms, biases): copied byte for byte.
        fused: PaddleNLP fused projection suffix → :class:`FusedSpec` (weights and biases).
        paddlenlp_own_head: PaddleNLP 2.8 builds a head of its own whatever ``tie_word_embeddings`` says
            (fixtures README L11), so a PaddleFormers output of a checkpoint with a head is untied.
    """

    paddlenlp_prefix: str | None
    hf_prefix: str
    head: str
    linear: list[str]
    in_hidden: list[str]
    plain: list[str]
    fused: dict[str, FusedSpec]
    paddlenlp_own_head: bool


_LLAMA_LINEAR = [
    f"{m}.{p}_proj.weight" for m, ps in (("self_attn", "qkvo"), ("mlp", ("gate", "up", "down"))) for p in ps
]
_LLAMA_PLAIN = [
    "embed_tokens.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "norm.weight",
    *[f"self_attn.{p}_proj.bias" for p in "qkvo"],
    *[f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")],
]
_LLAMA_FUSED: dict[str, FusedSpec] = {
    **{
        f"self_attn.qkv_proj.{w}": {"parts": [f"self_attn.{p}_proj.{w}" for p in "qkv"], "split": "qkv"}
        for w in ("weight", "bias")
    },
    **{
        f"mlp.gate_up_fused_proj.{w}": {
            "parts": [f"mlp.{p}_proj.{w}" for p in ("gate", "up")],
            "split": "halves",
        }
        for w in ("weight", "bias")
    },
}


def _llama_like(
    paddlenlp_prefix: str | None, extra_plain: tuple[str, ...] = (), own_head: bool = False
) -> ConversionRow:
    row: ConversionRow = {
        "paddlenlp_prefix": paddlenlp_prefix,
        "hf_prefix": "model",
        "head": "lm_head.weight",
        "linear": list(_LLAMA_LINEAR),
        "in_hidden": [f"self_attn.{p}_proj.weight" for p in "qkv"]
        + ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
        "plain": [*_LLAMA_PLAIN, *extra_plain],
        "fused": dict(_LLAMA_FUSED),
        "paddlenlp_own_head": own_head,
    }
    return row


# model_type -> row
CONVERSIONS: dict[str, ConversionRow] = {
    "llama": _llama_like("llama", own_head=True),
    "qwen2": _llama_like("qwen2"),
    "qwen3": _llama_like("qwen3", ("self_attn.q_norm.weight", "self_attn.k_norm.weight")),
    # PaddleNLP 2.x has no ERNIE 4.5: PaddleFormers legacy .pdparams <-> safetensors only
    "ernie4_5": _llama_like(None),
}

# model families (FAMILIES "family") and model types PaddleFormers 1.2 has no model class for (no folder in
# paddleformers/transformers/): how messages name them
PADDLEFORMERS_LACKS: dict[str, str] = {
    "mistral": "Mistral",
    "mixtral": "Mixtral",
    "baichuan": "Baichuan",
    "gpt": "GPT",
    "bert": "BERT/ERNIE 1-3 masked LM",
    "t5": "T5",
    "bart": "BART",
    "opt": "OPT",
    "bloom": "Bloom",
    "chatglm": "ChatGLM",
    "chatglm_v2": "ChatGLM2/3",
    "xlnet": "XLNet",
}


# config.json keys per target convention: renamed (as PaddleFormers' save_pretrained writes ``torch_dtype``
# for HF output, PaddleNLP ``dtype``), dropped (``source: paddle`` marks PaddleFormers' Paddle layout), set
# false (fused projections are written unfused).
class ConfigKeys(TypedDict):
    """config.json edits of one target: ``rename`` old → new key, ``drop`` keys, ``unfuse`` keys set false,
    ``refuse_set``: keys whose non-null value tietool cannot translate (it refuses)."""

    rename: dict[str, str]
    drop: list[str]
    unfuse: list[str]
    refuse_set: list[str]


CONFIG_KEYS: dict[str, ConfigKeys] = {
    "paddleformers": {
        "rename": {"dtype": "torch_dtype"},
        "drop": ["source"],
        "unfuse": ["fuse_attention_qkv", "fuse_attention_ffn"],
        # PaddleNLP's rope scaling has no PaddleFormers spelling tietool knows
        "refuse_set": ["rope_scaling_type"],
    },
    "paddlenlp": {
        "rename": {"torch_dtype": "dtype"},
        "drop": ["source"],
        "unfuse": ["fuse_attention_qkv", "fuse_attention_ffn"],
        "refuse_set": ["rope_scaling"],
    },
}
