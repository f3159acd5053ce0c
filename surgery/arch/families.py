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
first).

Proofs: :data:`PROOFS` maps ``(model_type, loader, container)`` to the test that loaded checkpoints the
library itself wrote and asserted these facts (PaddleFormers 1.2: ``tests/test_families.py::
test_loader_facts``). Under :data:`PROVABLE_LOADERS` a write relies on a fact only where it is proven
(``Family.trusted``); elsewhere tie/resize keep the head, untie writes it and refuses to guess its layout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import NamedTuple, TypedDict, TypeVar

from ..model.errors import UsageError

# Loaders tietool knows. "hf" is the HF-transformers naming (model.*, transformer.*) that PaddleFormers reads.
LOADERS = ("paddleformers", "paddlenlp-2.8", "paddlenlp-3", "hf")

# Loaders whose safetensors reader takes bfloat16 only as the U16 label their own save_pretrained writes:
# PaddleNLP 2.8.1 fails on a BF16 header ("Cannot interpret '2' as a data type";
# tests/test_pnlp_loaders.py::test_pnlp_writes_load[*-resize-up-bf16]), so U16 stays U16 for them.
U16_BFLOAT16_ONLY: tuple[str, ...] = ("paddlenlp-2.8",)
# The containers a loader may read differently (``Checkpoint.format``).
CONTAINERS = ("safetensors", "pdparams")

# The loaders whose facts the tests can prove by loading (PaddleFormers 1.2 is in the test environment,
# PaddleNLP 2.8.1 in its own venv): under these a write relies on a fact only where PROOFS holds it. "hf"
# (HF transformers' reading, which needs torch) and "paddlenlp-3" have no library here; their rows are the
# facts read from those libraries' source, and writes use them as the table states them.
PROVABLE_LOADERS = ("paddleformers", "paddlenlp-2.8")

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
    """``name`` matches one of :data:`EXTRA_TABLES` (one compiled pattern: detection asks this of every
    tensor for every name it looks for, and a header may hold millions)."""
    return _EXTRA_RE.search(name) is not None


_EXTRA_RE = re.compile(r"(?:^|\.)(?:" + "|".join(f"(?:{p})" for p in EXTRA_TABLES) + ")$")


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
# PaddleFormers 1.2 loaders (paddleformers and hf names alike) per container, for model_loaders
_PF_RETIE_WARNS: LoaderFacts = {**_PF_LIKE, "warns_missing_head": True}
_PDPARAMS_NO_RETIE: dict[str, LoaderFacts] = {
    "paddleformers/pdparams": _PF_NO_RETIE,
    "hf/pdparams": _PF_NO_RETIE,
}
_NEVER_RETIE: dict[str, LoaderFacts] = {"paddleformers": _PF_NO_RETIE, "hf": _PF_NO_RETIE}
_PDPARAMS_RETIE_WARNS: dict[str, LoaderFacts] = {
    "paddleformers/pdparams": _PF_RETIE_WARNS,
    "hf/pdparams": _PF_RETIE_WARNS,
}
# GLM-OCR's legacy .pdparams save writes its head as a Paddle Linear weight [hidden, vocab]
_GLM_OCR_PDPARAMS: dict[str, LoaderFacts] = {
    "paddleformers/pdparams": {"layout": "hidden-vocab", "reties": False},
    "hf/pdparams": {"layout": "hidden-vocab", "reties": False},
}
_PNLP_LINEAR_HEAD_NO_RETIE: LoaderFacts = {"layout": "hidden-vocab", "reties": False}
_PNLP_LINEAR_HEAD_RETIE: LoaderFacts = {"layout": "hidden-vocab", "reties": True}
_PNLP_EMBED_HEAD: LoaderFacts = {"layout": "vocab-hidden", "reties": True}
# an embedding-shaped head the loader never rebuilds from the embedding (PaddleNLP 2.8.1 RW/Falcon, BART);
# also the unproven other loaders of CodeGen / GPT-J / QWen (HF's [out, in] Linear head, kept)
_OWN_HEAD_NO_RETIE: LoaderFacts = {"layout": "vocab-hidden", "reties": False}
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
            "qwen3_next",
            "glm4_moe",
            "glm_ocr",
            "glm4v_moe",
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
        # PaddleFormers 1.2 (tests/test_families.py::test_loader_facts): Phi3 does not rebuild a missing head
        # from safetensors ("lm_head.weight should be assigned before!"); GptOss and DeepSeek-V3 ignore
        # tie_word_embeddings altogether (no tie_weights), so a dropped head is lost.
        # Issue 17 (tests/test_families.py::test_loader_facts): Qwen2-MoE / Qwen3-MoE as Qwen2 (a random head
        # from .pdparams); Qwen3-Next, GLM-4-MoE, GLM-OCR and GLM-4.5V-MoE never rebuild a missing head
        # (safetensors: "lm_head.weight should be assigned before!"; .pdparams: random); Qwen3-VL and
        # Qwen2.5-VL re-tie from .pdparams but log the head as newly initialized; so do Qwen2 and Qwen3 (the
        # logits are bit for bit those of the tied model: an earlier reading of that warning as "random
        # head" was wrong).
        "model_loaders": {
            "qwen2": _PDPARAMS_RETIE_WARNS,
            "qwen3": _PDPARAMS_RETIE_WARNS,
            "qwen2_moe": _PDPARAMS_NO_RETIE,
            "qwen3_moe": _PDPARAMS_NO_RETIE,
            "phi3": {"paddleformers": _PF_NO_RETIE, "hf": _PF_NO_RETIE, **_PDPARAMS_RETIE_WARNS},
            "gpt_oss": _NEVER_RETIE,
            "deepseek_v3": _NEVER_RETIE,
            "qwen3_next": _NEVER_RETIE,
            "glm4_moe": _NEVER_RETIE,
            "glm_ocr": {**_NEVER_RETIE, **_GLM_OCR_PDPARAMS},
            "glm4v_moe": _NEVER_RETIE,
            "qwen3_vl": _PDPARAMS_RETIE_WARNS,
            "qwen2_5_vl": _PDPARAMS_RETIE_WARNS,
        },
    },
    {  # Gemma: Llama names, tied by default. PaddleFormers 1.2's Gemma3ForCausalLM always loads lm_head
        # from model.embed_tokens.weight (its AOA config) when it reads safetensors, whatever
        # tie_word_embeddings says: an untied head is ignored. Its legacy .pdparams loader reads
        # lm_head.weight as stored, and re-ties a dropped one while logging it as newly initialized
        # (tests/test_families.py::test_loader_facts).
        "family": "gemma",
        "model_types": ["gemma", "gemma2", "gemma3", "gemma3_text"],
        "embedding": ["embed_tokens.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {
            "paddleformers": {**_PF_LIKE, "always_tied": True},
            "paddleformers/pdparams": _PF_RETIE_WARNS,
            "hf": _PF_LIKE,
            "hf/pdparams": _PF_RETIE_WARNS,
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
        # GPTForCausalLM builds its head from the word embedding whatever tie_word_embeddings says
        # (tests/test_pnlp_loaders.py): an lm_head.weight in the file is ignored, and a dropped one is
        # reported as "newly initialized" although it loads tied with identical logits.
        "family": "gpt",
        "model_types": ["gpt", "gpt2", "gpt-cpm", "gpt_neo"],
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
    {  # CodeGen: transformer.wte + its own biased nn.Linear head, lm_head.weight [hidden, vocab] in PaddleNLP
        # 2.8.1 and lm_head.bias [vocab]. PaddleNLP never builds it from the embedding (no tie_weights
        # call): a checkpoint without lm_head.weight loads a random head, and a head in the file is used
        # whatever tie_word_embeddings says (tests/test_pnlp_loaders.py). Other loaders: unproven, kept.
        "family": "codegen",
        "model_types": ["codegen"],
        "embedding": ["wte.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": ["lm_head.bias"],
        "tie_default": {"*": False},
        "loaders": {"paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE, "*": _OWN_HEAD_NO_RETIE},
    },
    {  # GPT-J: the names and the head of CodeGen (a biased nn.Linear, lm_head.weight [hidden, vocab] +
        # lm_head.bias in PaddleNLP 2.8.1, never re-tied; tests/test_pnlp_loaders.py, .pdparams: PaddleNLP
        # 2.8.1 cannot read back the safetensors its own save_pretrained writes for GPT-J)
        "family": "gptj",
        "model_types": ["gptj"],
        "embedding": ["wte.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": ["lm_head.bias"],
        "tie_default": {"*": False},
        "loaders": {"paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE, "*": _OWN_HEAD_NO_RETIE},
    },
    {  # QWen v1 (PaddleNLP qwen.wte, QWenLMHead lm_head.weight [hidden, vocab]); never re-tied by PaddleNLP
        # 2.8.1 (tests/test_pnlp_loaders.py). HF's remote-code QWen: unproven, kept.
        "family": "qwen",
        "model_types": ["qwen"],
        "embedding": ["wte.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": False},
        "loaders": {"paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE, "*": _OWN_HEAD_NO_RETIE},
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
        # PaddleNLP's BART keeps lm_head_weight as a parameter of its own: 2.8.1 loads a checkpoint without
        # it with a random head (tests/test_pnlp_loaders.py)
        "tie_default": {"paddlenlp-2.8": False, "paddlenlp-3": False, "*": True},
        "loaders": {"*": _PNLP_EMBED_HEAD, "paddlenlp-2.8": _OWN_HEAD_NO_RETIE},
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
    {  # ChatGLM v1: PaddleNLP 2.8.1's ChatGLMForCausalLM uses the word embedding itself as lm_head, whatever
        # tie_word_embeddings says: a head in the file is ignored (tests/test_pnlp_loaders.py)
        "family": "chatglm",
        "model_types": ["chatglm"],
        "embedding": ["word_embeddings.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {"*": _PNLP_EMBED_HEAD, "paddlenlp-2.8": {**_PNLP_EMBED_HEAD, "always_tied": True}},
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
    {  # Falcon: transformer.word_embeddings + lm_head, tied by default (HF FalconConfig). PaddleNLP 2.8.1's
        # RWForCausalLM (model_type RefinedWeb) holds lm_head.weight [vocab, hidden] and never calls
        # tie_weights: a checkpoint without it loads a random head (tests/test_pnlp_loaders.py)
        "family": "falcon",
        "model_types": ["falcon", "RefinedWeb", "RefinedWebModel"],
        "embedding": ["word_embeddings.weight"],
        "aliases": [],
        "head": ["lm_head.weight"],
        "bias": [],
        "tie_default": {"*": True},
        "loaders": {"*": _PF_LIKE, "paddlenlp-2.8": _OWN_HEAD_NO_RETIE},
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


# ============================================================================ proofs of the loader facts
class ProofKey(NamedTuple):
    """What a proof covers: one model type (config.json ``model_type``, as detection resolves it), one loader
    (:data:`LOADERS`), one container (:data:`CONTAINERS`)."""

    model_type: str
    loader: str
    container: str


# PaddleFormers 1.2: tests/test_families.py::test_loader_facts builds each model type with PaddleFormers
# itself (support/family_builder.py), saves it in both containers, loads variants back (head dropped with
# the flag tied; an independent head with the flag untied; the head equal to the embedding) and asserts
# the row's facts (reties, always_tied, head layout in the file, head bias). The same test checks that the
# "hf" rows of these model types mirror them (except Gemma3 from safetensors, whose hf row is HF
# transformers' reading: it honours tie_word_embeddings, so "untie --loader hf" is the way out of
# PaddleFormers' always-tied one).
_PF_FACTS_TEST = "tests/test_families.py::test_loader_facts[{model_type}-{container}]"
_BOTH = CONTAINERS
# model type -> the containers its facts are proven in. PaddleFormers 1.2 cannot read back its own
# safetensors save of Qwen2.5-VL and GLM-4.5V-MoE ("...self_attn.qkv_proj.bias / k_proj.weight should be
# assigned before!"), so only their .pdparams facts are proven.
_PF_PROVEN: dict[str, tuple[str, ...]] = {
    "llama": _BOTH,
    "qwen2": _BOTH,
    "qwen3": _BOTH,
    "ernie4_5": _BOTH,
    "gemma3_text": _BOTH,
    "gpt_oss": _BOTH,
    "phi3": _BOTH,
    "deepseek_v3": _BOTH,
    "qwen2_moe": _BOTH,
    "qwen3_moe": _BOTH,
    "qwen3_next": _BOTH,
    "glm4_moe": _BOTH,
    "glm_ocr": _BOTH,
    "qwen3_vl": _BOTH,
    "qwen2_5_vl": ("pdparams",),
    "glm4v_moe": ("pdparams",),
}
HF_NOT_PF: frozenset[tuple[str, str]] = frozenset({("gemma3_text", "safetensors")})
_PF_PROOFS: dict[ProofKey, str] = {
    ProofKey(mt, "paddleformers", c): _PF_FACTS_TEST.format(model_type=mt, container=c)
    for mt, containers in _PF_PROVEN.items()
    for c in containers
}
# PaddleNLP 2.8.1 (on paddle 2.6.2): tests/test_pnlp_loaders.py::test_pnlp_loader_facts builds each
# model type with PaddleNLP itself in its own venv, saves it in both containers and asserts the row's facts.
_PNLP_FACTS_TEST = "tests/test_pnlp_loaders.py::test_pnlp_loader_facts"
# PaddleNLP 2.8.1 (on paddle 2.6.2): model_type -> (the test's family id, the containers proven).
# GPT-J .pdparams only: PaddleNLP 2.8.1 cannot load the safetensors its own save_pretrained writes for it.
_PNLP_PROVEN: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama": ("llama", ("safetensors", "pdparams")),
    "mixtral": ("mixtral", ("safetensors", "pdparams")),
    "qwen": ("qwen", ("safetensors", "pdparams")),
    "gptj": ("gptj", ("pdparams",)),
    "codegen": ("codegen", ("safetensors", "pdparams")),
    "RefinedWeb": ("rw", ("safetensors", "pdparams")),
    "chatglm_v2": ("chatglm_v2", ("safetensors", "pdparams")),
    "chatglm": ("chatglm", ("safetensors", "pdparams")),
    "bloom": ("bloom", ("safetensors", "pdparams")),
    "gpt": ("gpt", ("safetensors", "pdparams")),
    "opt": ("opt", ("safetensors", "pdparams")),
    "bert": ("bert", ("safetensors", "pdparams")),
    "ernie": ("ernie", ("safetensors", "pdparams")),
    "t5": ("t5", ("safetensors", "pdparams")),
    "bart": ("bart", ("safetensors", "pdparams")),
}
_PNLP_PROOFS: dict[ProofKey, str] = {
    ProofKey(model_type, "paddlenlp-2.8", container): f"{_PNLP_FACTS_TEST}[{test_id}-{container}]"
    for model_type, (test_id, containers) in _PNLP_PROVEN.items()
    for container in containers
}
PROOFS: Mapping[ProofKey, str] = MappingProxyType({**_PF_PROOFS, **_PNLP_PROOFS})
"""``(model_type, loader, container)`` → pytest node id of the test that loaded a library-written checkpoint
of that model type in that container and asserted the table's facts for it. A write relies on a loader fact
(drop a head the loader re-ties, refuse untie where it always ties, the layout of a head it writes) only
where the triple is here (``Family.proven``); elsewhere it does what is right under every loader."""


# ============================================================================ tensor parallelism (merge)
# How each tensor of a family is split across tensor-parallel ranks, as the libraries' own
# ``_get_tensor_parallel_mappings`` split it (PaddleNLP 2.8 ``llama/modeling.py`` and ``qwen2/modeling.py``,
# PaddleFormers ``phi3`` and ``ernie4_5``; the split/merge helpers are PaddleFormers 1.2
# ``conversion_utils.py`` ``normal_fuse_split_tp`` / ``naive_fuse_split_tp``). Every tensor is in Paddle's
# layout (a Linear weight is ``[in, out]``): rank files are written by PaddleNLP / PaddleFormers' legacy
# ``.pdparams`` save. ``tietool merge`` (:mod:`surgery.plan.merge`) reads only this table.


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
    container: str | None = None
    proof: str | None = None

    @property
    def proven(self) -> bool:
        """:data:`PROOFS` holds ``(model_type, loader, container)``: a test loaded a checkpoint the library
        wrote of this model type in this container and asserted this row's loader facts."""
        return self.proof is not None

    @property
    def trusted(self) -> bool:
        """A write may rely on this row's loader facts: proven (:data:`PROOFS`), or the model type has a row
        of its own and the loader is not one the tests can load with (:data:`PROVABLE_LOADERS`). A model
        type the table does not know (the fallback row) is never trusted, under any loader."""
        return self.proven or (self.known and self.loader not in PROVABLE_LOADERS)

    @property
    def may_drop_head(self) -> bool:
        """A write may drop a duplicate head (and embedding copies): the loader re-ties a missing head, and
        that is proven (``trusted``). Unproven, a head is kept equal to the embedding (right under every
        loader)."""
        return self.reties and self.trusted

    @property
    def refuses_untie(self) -> bool:
        """``untie`` is refused: the loader always takes the head from the embedding, and that is proven.
        Unproven, untie writes the head (an ignored head does no harm)."""
        return self.always_tied and self.trusted

    @property
    def head_layout_proven(self) -> bool:
        """The layout of a head tietool writes (``head_layout``) may come from the table: it is proven."""
        return self.trusted

    def proven_loaders(self) -> tuple[str, ...]:
        """The loaders whose facts are proven for this model type and container (:data:`PROOFS`)."""
        return proven_loaders(self.model_type, self.container)


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


def proven_loaders(model_type: str | None, container: str | None) -> tuple[str, ...]:
    """The loaders (in :data:`LOADERS` order) whose facts :data:`PROOFS` holds a proof of for
    ``model_type`` read from ``container``; empty when either is None."""
    return tuple(ld for ld in LOADERS if ProofKey(model_type or "", ld, container or "") in PROOFS)


def lookup(model_type: str | None, loader: str, container: str | None = None) -> Family:
    """The table row for ``model_type`` (or the fallback row), with the facts of ``loader`` resolved, and
    the proof of those facts (:data:`PROOFS`; ``Family.proven``).

    Args:
        model_type: config.json ``model_type`` (or ``text_config.model_type``); None if absent.
        loader: one of ``LOADERS``.
        container: ``safetensors`` or ``pdparams`` (a loader may read the two differently); None: any
            (then nothing is proven: a proof is per container).
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
        container=container,
        proof=PROOFS.get(ProofKey(model_type or "", loader, container or "")),
    )


def matches(name: str, suffix: str) -> bool:
    """``name`` is ``suffix`` or ends with ``"." + suffix``."""
    return name == suffix or name.endswith("." + suffix)


# ============================================================================ conversions (tietool convert)
# Which tensors of a family are nn.Linear weights (they are transposed between Paddle's [in, out] and the
# HF/PaddleFormers [out, in] layout) and which sizes of the config their two axes are (the layout is proven
# from the shape against them), which are copied as they are, how fused projections split, and which config
# keys change. Sources: PaddleNLP 2.8.1 ``llama/modeling.py`` (``llama.`` names, ``qkv_proj`` /
# ``gate_up_fused_proj`` when ``fuse_attention_qkv`` / ``fuse_attention_ffn``), PaddleFormers 1.2.0
# ``conversion_utils.py`` (``split_param_func``: qkv grouped per kv head), PaddleFormers 1.2.0
# ``ernie4_5{,_moe}/modeling.py`` (its Paddle-layout ``qkv_proj`` is reshaped ``[kv, (q/kv + 2) x head_dim]``,
# grouped per kv head, ``up_gate_proj`` is ``[gate | up]``; ``_gen_inv_aoa_config``: the HF names, every
# Linear incl. the router ``mlp.gate`` and ``mtp_linear_proj.N`` transposed), ERNIE's own
# ``tools/paddle2torch`` converter (ERNIEKit / ``*-Paddle`` releases: ``ernie.`` names, ``qkv_proj`` is
# ``[q | k | v]`` along the output axis, ``up_gate_proj`` is ``[gate | up]``, ``ernie.`` -> ``model.``) and
# the fixtures ``pnlp_llama_untied`` / ``pf_llama_untied_legacy_pdparams`` / ``pf_llama_untied_fp32``.
# Only model types PaddleFormers 1.2 has a class for are listed; PaddleFormers 1.2 has no Mistral, GPT,
# BERT or T5 (``PADDLEFORMERS_LACKS``). A name component that is a number (layer, expert, MTP depth) is
# written ``N`` in the suffixes.


class Size(str, Enum):
    """A size of the model that a Linear weight's axis has, read from config.json
    (``surgery.inspect.layout``)."""

    HIDDEN = "hidden_size"
    HIDDEN2 = "2 x hidden_size"
    Q = "num_attention_heads x head_dim"
    KV = "num_key_value_heads x head_dim"
    QKV = "(num_attention_heads + 2 x num_key_value_heads) x head_dim"
    INTER = "intermediate_size"
    INTER2 = "2 x intermediate_size"
    MOE_INTER = "moe_intermediate_size"
    MOE_INTER2 = "2 x moe_intermediate_size"
    SHARED_INTER = "moe_intermediate_size x moe_num_shared_experts"
    SHARED_INTER2 = "2 x moe_intermediate_size x moe_num_shared_experts"
    EXPERTS = "moe_num_experts"
    VOCAB = "vocab_size"


class Split(str, Enum):
    """How a fused projection's output axis splits into its parts."""

    QKV_GROUPED = "q, k, v grouped per kv head"  # [q x (heads / kv_heads), k, v] x kv_heads
    QKV_CONCAT = "q | k | v"  # heads, then kv heads, then kv heads (ERNIE's paddle2torch)
    HALVES = "gate | up"


class Naming(str, Enum):
    """The name prefix convention of a checkpoint's body tensors."""

    PADDLENLP = "paddlenlp"  # llama., qwen2., ... (PaddleNLP 2.x)
    KIT = "kit"  # ernie. (ERNIEKit, the ERNIE 4.5 *-Paddle releases)
    HF = "hf"  # model. (PaddleFormers, HF)


class FusedSpec(TypedDict):
    """A fused projection: its parts (suffixes, same module), how its output axis splits, and the sizes of
    its two axes in ``[in, out]`` order (a weight; a bias is ``[out]``)."""

    parts: list[str]
    split: Split
    dims: tuple[Size, Size]


class ConversionRow(TypedDict):
    """One row of ``CONVERSIONS``.

    Keys:
        prefixes: first name component of each naming the model type is stored with (``Naming.PADDLENLP``
            absent: tietool knows no PaddleNLP naming of it, conversion to PaddleNLP refuses).
        head: the LM head weight (top level, no prefix): ``[hidden, vocab]`` in PaddleNLP (and ERNIEKit,
            untied), ``[vocab, hidden]`` in PaddleFormers (legacy ``.pdparams`` and safetensors alike).
        linear: suffixes of ``nn.Linear`` weights inside the model body, with the sizes of their axes in
            Paddle's ``[in, out]`` order (the shape proves the layout).
        plain: suffixes of every other tensor (embeddings, norms, biases, statistics): copied byte for byte.
        fused: naming → fused projection suffix → :class:`FusedSpec` (weights and biases); a naming not
            listed has no fused tensors.
        paddlenlp_own_head: PaddleNLP 2.8 builds a head of its own whatever ``tie_word_embeddings`` says
            (fixtures README L11), so a PaddleFormers output of a checkpoint with a head is untied.
        paddlenlp_28: PaddleNLP 2.8.1 has a model class of the type (``paddlenlp/transformers/<type>``),
            so a PaddleNLP output says ``paddlenlp_version: null`` as 2.8.1 writes it; else (Qwen2, Qwen3:
            PaddleNLP 3 only) no version key is written, and tietool takes PaddleNLP 3 as the loader.
    """

    prefixes: dict[Naming, str]
    head: str
    linear: dict[str, tuple[Size, Size]]
    plain: list[str]
    fused: dict[Naming, dict[str, FusedSpec]]
    paddlenlp_own_head: bool
    paddlenlp_28: bool


S = Size
_LLAMA_LINEAR: dict[str, tuple[Size, Size]] = {
    "self_attn.q_proj.weight": (S.HIDDEN, S.Q),
    "self_attn.k_proj.weight": (S.HIDDEN, S.KV),
    "self_attn.v_proj.weight": (S.HIDDEN, S.KV),
    "self_attn.o_proj.weight": (S.Q, S.HIDDEN),
    "mlp.gate_proj.weight": (S.HIDDEN, S.INTER),
    "mlp.up_proj.weight": (S.HIDDEN, S.INTER),
    "mlp.down_proj.weight": (S.INTER, S.HIDDEN),
}
_LLAMA_PLAIN = [
    "embed_tokens.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "norm.weight",
    *[f"self_attn.{p}_proj.bias" for p in "qkvo"],
    *[f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")],
]


def _qkv(split: Split, module: str = "self_attn.qkv_proj") -> dict[str, FusedSpec]:
    return {
        f"{module}.{w}": {
            "parts": [f"self_attn.{p}_proj.{w}" for p in "qkv"],
            "split": split,
            "dims": (S.HIDDEN, S.QKV),
        }
        for w in ("weight", "bias")
    }


def _gate_up(suffix: str, out_prefix: str, dims: tuple[Size, Size]) -> dict[str, FusedSpec]:
    return {
        f"{suffix}.{w}": {
            "parts": [f"{out_prefix}{p}_proj.{w}" for p in ("gate", "up")],
            "split": Split.HALVES,
            "dims": dims,
        }
        for w in ("weight", "bias")
    }


_LLAMA_FUSED = {**_qkv(Split.QKV_GROUPED), **_gate_up("mlp.gate_up_fused_proj", "mlp.", (S.HIDDEN, S.INTER2))}
# PaddleFormers 1.2's own Paddle layout (legacy save) of Qwen2/Qwen3 (the Deprecated classes): qkv_proj
# grouped per kv head, up_gate_proj gate | up (its AOA fused_qkv / fused_ffn); converted bit for bit to its
# HF export in tests/test_convert.py::test_paddleformers_legacy_fused_qwen_converts_to_its_hf_export
_PF_FUSED = {**_qkv(Split.QKV_GROUPED), **_gate_up("mlp.up_gate_proj", "mlp.", (S.HIDDEN, S.INTER2))}


def _llama_like(
    paddlenlp_prefix: str | None,
    extra_plain: tuple[str, ...] = (),
    own_head: bool = False,
    pf_fused: bool = False,
) -> ConversionRow:
    prefixes = {Naming.HF: "model"}
    if paddlenlp_prefix:
        prefixes[Naming.PADDLENLP] = paddlenlp_prefix
    fused: dict[Naming, dict[str, FusedSpec]] = (
        {Naming.PADDLENLP: dict(_LLAMA_FUSED)} if paddlenlp_prefix else {}
    )
    if pf_fused:
        fused[Naming.HF] = dict(_PF_FUSED)
    return {
        "prefixes": prefixes,
        "head": "lm_head.weight",
        "linear": dict(_LLAMA_LINEAR),
        "plain": [*_LLAMA_PLAIN, *extra_plain],
        "fused": fused,
        "paddlenlp_own_head": own_head,
        "paddlenlp_28": paddlenlp_prefix == "llama",  # 2.8.1 has llama/ and qwen/ (v1), no qwen2/ or qwen3/
    }


def _ernie_fused(split: Split, moe: bool) -> dict[str, FusedSpec]:
    """ERNIE 4.5's fused projections in ``split`` (ERNIEKit q | k | v, PaddleFormers grouped), dense MLPs
    (main layers and the MTP blocks) and, for MoE, experts and shared experts."""
    fused = {**_qkv(split), **_gate_up("mlp.up_gate_proj", "mlp.", (S.HIDDEN, S.INTER2))}
    if moe:
        fused.update(_gate_up("mlp.experts.N.up_gate_proj", "mlp.experts.N.", (S.HIDDEN, S.MOE_INTER2)))
        fused.update(
            _gate_up("mlp.shared_experts.up_gate_proj", "mlp.shared_experts.", (S.HIDDEN, S.SHARED_INTER2))
        )
    return fused


def _ernie(moe: bool) -> ConversionRow:
    """ERNIE 4.5 (dense or MoE with MTP): PaddleFormers names ``model.``, ERNIEKit names ``ernie.``; no
    PaddleNLP 2.x naming (PaddleNLP 2.8 has no ERNIE 4.5)."""
    row = _llama_like(None)
    row["prefixes"] = {Naming.HF: "model", Naming.KIT: "ernie"}
    row["fused"] = {
        Naming.KIT: _ernie_fused(Split.QKV_CONCAT, moe),
        Naming.HF: _ernie_fused(Split.QKV_GROUPED, moe),
    }
    if moe:
        row["linear"].update(
            {
                # the router is a Linear (ERNIE's paddle2torch transposes it, so does PF's inverse AOA)
                "mlp.gate.weight": (S.HIDDEN, S.EXPERTS),
                "mlp.experts.N.gate_proj.weight": (S.HIDDEN, S.MOE_INTER),
                "mlp.experts.N.up_proj.weight": (S.HIDDEN, S.MOE_INTER),
                "mlp.experts.N.down_proj.weight": (S.MOE_INTER, S.HIDDEN),
                "mlp.shared_experts.gate_proj.weight": (S.HIDDEN, S.SHARED_INTER),
                "mlp.shared_experts.up_proj.weight": (S.HIDDEN, S.SHARED_INTER),
                "mlp.shared_experts.down_proj.weight": (S.SHARED_INTER, S.HIDDEN),
                "mtp_linear_proj.N.weight": (S.HIDDEN2, S.HIDDEN),  # [embedding | hidden] -> hidden
            }
        )
        row["plain"] += [
            "mlp.moe_statics.e_score_correction_bias",
            "mtp_emb_norm.N.weight",
            "mtp_hidden_norm.N.weight",
            "mtp_linear_proj.N.bias",
        ]
    return row


# model_type -> row
CONVERSIONS: dict[str, ConversionRow] = {
    "llama": _llama_like("llama", own_head=True),
    "qwen2": _llama_like("qwen2", pf_fused=True),
    "qwen3": _llama_like("qwen3", ("self_attn.q_norm.weight", "self_attn.k_norm.weight"), pf_fused=True),
    # PaddleNLP 2.x has no ERNIE 4.5: ERNIEKit (ernie.*) and PaddleFormers (model.*) namings only
    "ernie4_5": _ernie(moe=False),
    "ernie4_5_moe": _ernie(moe=True),
}

# the Linear weights of every row, for a model type without a row of its own: only their shapes are read (to
# tell whether a checkpoint tietool does not convert is in the HF layout), never converted
ANY_LINEAR: dict[str, tuple[Size, Size]] = {
    k: v for r in CONVERSIONS.values() for k, v in r["linear"].items()
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
# for HF output, PaddleNLP ``dtype``), dropped (``source: paddle`` marks PaddleFormers' Paddle layout; the
# other library's version key would make tietool's next command pick that library as the loader), set false
# (fused projections are written unfused), set (the target library's version key, as its save_pretrained
# writes it: PaddleFormers 1.2.0 ``"paddleformers_version": "1.2.0"``, PaddleNLP 2.8.1
# ``"paddlenlp_version": null``; fixtures ``pf_llama_untied_fp32`` / ``pnlp_llama_untied`` config.json).
class ConfigKeys(TypedDict):
    """config.json edits of one target: ``rename`` old → new key, ``drop`` keys, ``unfuse`` keys set false,
    ``set`` keys to these values, ``refuse_set``: keys whose non-null value tietool cannot translate (it
    refuses)."""

    rename: dict[str, str]
    drop: list[str]
    unfuse: list[str]
    set: dict[str, str | None]
    refuse_set: list[str]


CONFIG_KEYS: dict[str, ConfigKeys] = {
    "paddleformers": {
        "rename": {"dtype": "torch_dtype"},
        "drop": ["source", "paddlenlp_version"],
        "unfuse": ["fuse_attention_qkv", "fuse_attention_ffn"],
        "set": {"paddleformers_version": "1.2.0"},
        # PaddleNLP's rope scaling has no PaddleFormers spelling tietool knows
        "refuse_set": ["rope_scaling_type"],
    },
    "paddlenlp": {
        "rename": {"torch_dtype": "dtype"},
        "drop": ["source", "paddleformers_version"],
        "unfuse": ["fuse_attention_qkv", "fuse_attention_ffn"],
        "set": {"paddlenlp_version": None},
        "refuse_set": ["rope_scaling"],
    },
}
