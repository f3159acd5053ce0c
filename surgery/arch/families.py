"""The family table: which tensors are the input embedding, the LM head and its bias, per model family,
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
library itself wrote and asserted these facts (PaddleFormers 1.2: ``tests/oracles/test_families.py::
test_loader_facts``; HF transformers 5.3, reading PaddleFormers' HF-layout exports:
``tests/oracles/test_hf_loader.py::test_hf_loader_facts``; model types PaddleFormers does not export, on
checkpoints transformers' own ``save_pretrained`` wrote:
``tests/oracles/test_hf_loader.py::test_hf_native_loader_facts``). Under :data:`PROVABLE_LOADERS` a write
relies on a fact only where it is proven (``Family.trusted``); elsewhere tie/resize keep the head, untie
writes it and refuses to guess its layout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from ..model.enums import Layout, Loader, TiedScale
from .rows import CONTAINERS, FamilyRow, LoaderFacts, ProofKey, TokenRule, TokenTable, matches

# Loaders whose safetensors reader takes bfloat16 only as the U16 label their own save_pretrained writes:
# PaddleNLP 2.8.1 fails on a BF16 header ("Cannot interpret '2' as a data type";
# tests/oracles/test_pnlp_loaders.py::test_pnlp_writes_load[*-resize-up-bf16]), so U16 stays U16 for them.
U16_BFLOAT16_ONLY: tuple[str, ...] = (Loader.PADDLENLP_28.value,)

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


# Extra vocabulary tables (role TensorRole.EXTRA_TABLE), as regular expressions matched against the end of a
# tensor name (any family).
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


# The bias of a head named by ``--head`` (a name no family row lists): the same module's bias beside its
# weight, ``[vocab]`` or ``[1, vocab]`` (checked against the head's rows), added to the logits, so it moves
# with the head's rows. ``(weight suffix, bias suffix)``, the first that matches. Sources: paddle.nn.Linear
# (``weight`` / ``bias``); PaddleNLP 2.8.1 UnifiedTransformerLMHead (PLATO, unified_transformer/modeling.py:
# ``logits = matmul(h, decoder_weight, transpose_y=True) + decoder_bias``) and BERT's ``decoder_weight`` /
# ``decoder_bias``; tests/oracles/test_vocab_bias.py resizes a PaddleNLP-written PLATO and loads it.
HEAD_BIAS_OF: tuple[tuple[str, str], ...] = (("decoder_weight", "decoder_bias"), ("weight", "bias"))


def head_bias_names(head: str) -> tuple[str, ...]:
    """The names the bias of a head named ``head`` may have (:data:`HEAD_BIAS_OF`): ``lm_head.decoder_bias``
    for ``lm_head.decoder_weight``, ``lm_head.bias`` for ``lm_head.weight``; empty for another name."""
    for weight, bias in HEAD_BIAS_OF:
        if head.endswith(weight):
            return (head[: -len(weight)] + bias,)
    return ()


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


# A model_type two layouts share: the family is told by the names the files hold (``{model_type: [(family,
# suffixes any of which marks it)]}``), never by the model type alone. THUDM's ChatGLM2/3 and GLM-4 remote
# code says ``chatglm`` like ChatGLM v1 but stores transformer.embedding.word_embeddings and a separate
# head transformer.output_layer (zai-org/ChatGLM3#1072); v1 stores transformer.word_embeddings and
# lm_head.
NAME_LAYOUTS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "chatglm": [("chatglm_v2", ("output_layer.weight", "embedding.word_embeddings.weight"))],
}


def model_type_by_names(model_type: str | None, names: Iterable[str]) -> str | None:
    """``model_type``, or the model type of the family whose names the files hold (:data:`NAME_LAYOUTS`)."""
    for family, marks in NAME_LAYOUTS.get(model_type or "", []):
        if any(matches(n, m) for n in names for m in marks):
            row = next(r for r in FAMILIES if r.family == family)
            return row.model_types[0]
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


VH, HV = Layout.VOCAB_HIDDEN, Layout.HIDDEN_VOCAB
_PF_LIKE = LoaderFacts(VH, reties=True)
# PaddleFormers 1.2 models that never build a missing head from the embedding: tie keeps the head
_PF_NO_RETIE = LoaderFacts(VH, reties=False)
# PaddleFormers 1.2 loaders (paddleformers and hf names alike) per container, for model_loaders
_PF_RETIE_WARNS = replace(_PF_LIKE, warns_missing_head=True)
_PDPARAMS_NO_RETIE: dict[str, LoaderFacts] = {
    "paddleformers/pdparams": _PF_NO_RETIE,
    "hf/pdparams": _PF_NO_RETIE,
}
_NEVER_RETIE: dict[str, LoaderFacts] = {"paddleformers": _PF_NO_RETIE, "hf": _PF_NO_RETIE}
# PaddleFormers 1.2 does not re-tie a missing head, HF transformers 5.3 does (its tie_weights honours
# tie_word_embeddings): tests/oracles/test_hf_loader.py::test_hf_loader_facts. transformers reads no
# .pdparams: that hf row mirrors PaddleFormers' (and is unproven)
_PF_NEVER_HF_RETIES: dict[str, LoaderFacts] = {
    **_NEVER_RETIE,
    "hf": _PF_LIKE,
    "hf/pdparams": _PF_NO_RETIE,
}
_PDPARAMS_RETIE_WARNS: dict[str, LoaderFacts] = {
    "paddleformers/pdparams": _PF_RETIE_WARNS,
    "hf/pdparams": _PF_RETIE_WARNS,
}
# GLM-OCR's legacy .pdparams save writes its head as a Paddle Linear weight [hidden, vocab]
_GLM_OCR_PDPARAMS: dict[str, LoaderFacts] = {
    "paddleformers/pdparams": LoaderFacts(HV, reties=False),
    "hf/pdparams": LoaderFacts(HV, reties=False),
}
_PNLP_LINEAR_HEAD_NO_RETIE = LoaderFacts(HV, reties=False)
_PNLP_LINEAR_HEAD_RETIE = LoaderFacts(HV, reties=True)
_PNLP_EMBED_HEAD = LoaderFacts(VH, reties=True)
# an embedding-shaped head the loader never rebuilds from the embedding (PaddleNLP 2.8.1 RW/Falcon, BART);
# also the unproven other loaders of CodeGen / GPT-J / QWen (HF's [out, in] Linear head, kept)
_OWN_HEAD_NO_RETIE = LoaderFacts(VH, reties=False)
# PaddleNLP GPT/BERT/ERNIE: a dropped head loads tied (identical logits) but is logged as newly initialized
_PNLP_EMBED_HEAD_WARNS = replace(_PNLP_EMBED_HEAD, warns_missing_head=True)
_PNLP_ALWAYS_TIED_WARNS = replace(_PNLP_EMBED_HEAD_WARNS, always_tied=True)

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
#   tied_scale:  logits of the tied head are multiplied by this (T5: d_model ** -0.5)
#   head_under_model: the head sits in the model's top module (ChatGLM2/3 transformer.output_layer)
# (the fields are those of rows.FamilyRow; a field left out has its default: nothing special)
FAMILIES: tuple[FamilyRow, ...] = (
    FamilyRow(  # Llama and its descendants with the same names
        family="llama",
        model_types=(
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
        ),
        embedding=("embed_tokens.weight", "tok_embeddings.weight"),
        head=("lm_head.weight", "output.weight"),
        bias=("lm_head.bias",),
        loaders={
            "paddleformers": _PF_LIKE,
            "hf": _PF_LIKE,
            "paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE,
            "paddlenlp-3": _PNLP_LINEAR_HEAD_RETIE,
        },
        # PaddleFormers 1.2 (tests/oracles/test_families.py::test_loader_facts): Phi3 does not rebuild a
        # missing head from safetensors ("lm_head.weight should be assigned before!"); GptOss and DeepSeek-V3
        # ignore tie_word_embeddings altogether (no tie_weights), so a dropped head is lost. HF transformers
        # 5.3 re-ties all three, and GLM-4-MoE (tests/oracles/test_hf_loader.py::test_hf_loader_facts).
        # tests/oracles/test_families.py::test_loader_facts: Qwen2-MoE / Qwen3-MoE as Qwen2 (a random head
        # from .pdparams); Qwen3-Next, GLM-4-MoE, GLM-OCR and GLM-4.5V-MoE never rebuild a missing head
        # (safetensors: "lm_head.weight should be assigned before!"; .pdparams: random); Qwen3-VL and
        # Qwen2.5-VL re-tie from .pdparams but log the head as newly initialized; so do Qwen2 and Qwen3 (the
        # logits are bit for bit those of the tied model: an earlier reading of that warning as "random
        # head" was wrong).
        model_loaders={
            "qwen2": _PDPARAMS_RETIE_WARNS,
            "qwen3": _PDPARAMS_RETIE_WARNS,
            "qwen2_moe": _PDPARAMS_NO_RETIE,
            "qwen3_moe": _PDPARAMS_NO_RETIE,
            "phi3": {"paddleformers": _PF_NO_RETIE, "hf": _PF_LIKE, **_PDPARAMS_RETIE_WARNS},  # HF: re-ties
            "gpt_oss": _PF_NEVER_HF_RETIES,
            "deepseek_v3": _PF_NEVER_HF_RETIES,
            "qwen3_next": _NEVER_RETIE,
            "glm4_moe": _PF_NEVER_HF_RETIES,
            "glm_ocr": {**_NEVER_RETIE, **_GLM_OCR_PDPARAMS},
            "glm4v_moe": _NEVER_RETIE,
            "qwen3_vl": _PDPARAMS_RETIE_WARNS,
            "qwen2_5_vl": _PDPARAMS_RETIE_WARNS,
        },
    ),
    FamilyRow(  # Gemma: Llama names, tied by default. PaddleFormers 1.2's Gemma3ForCausalLM always loads
        # lm_head from model.embed_tokens.weight (its AOA config) when it reads safetensors, whatever
        # tie_word_embeddings says: an untied head is ignored. Its legacy .pdparams loader reads
        # lm_head.weight as stored, and re-ties a dropped one while logging it as newly initialized
        # (tests/oracles/test_families.py::test_loader_facts).
        family="gemma",
        model_types=("gemma", "gemma2", "gemma3", "gemma3_text"),
        embedding=("embed_tokens.weight",),
        head=("lm_head.weight",),
        tie_default={"*": True},
        loaders={
            "paddleformers": replace(_PF_LIKE, always_tied=True),
            "paddleformers/pdparams": _PF_RETIE_WARNS,
            "hf": _PF_LIKE,
            "hf/pdparams": _PF_RETIE_WARNS,
            "paddlenlp-2.8": _PNLP_EMBED_HEAD,
            "paddlenlp-3": _PNLP_EMBED_HEAD,
        },
    ),
    FamilyRow(  # OPT: PaddleNLP's OPTLMHead holds decoder_weight [vocab, hidden] and is never tied (L14)
        family="opt",
        model_types=("opt",),
        embedding=("embed_tokens.weight", "embeddings.word_embeddings.weight"),
        head=("lm_head.weight", "lm_head.decoder_weight"),
        tie_default={"*": True},
        loaders={
            "paddleformers": _PF_LIKE,
            "hf": _PF_LIKE,
            "paddlenlp-2.8": LoaderFacts(VH, reties=False),
            "paddlenlp-3": LoaderFacts(VH, reties=False),
        },
    ),
    FamilyRow(  # GPT (PaddleNLP gpt.embeddings.word_embeddings; HF GPT-2 transformer.wte). PaddleNLP 2.8.1's
        # GPTForCausalLM builds its head from the word embedding whatever tie_word_embeddings says
        # (tests/oracles/test_pnlp_loaders.py): an lm_head.weight in the file is ignored, and a dropped one is
        # reported as "newly initialized" although it loads tied with identical logits.
        family="gpt",
        model_types=("gpt", "gpt2", "gpt-cpm", "gpt_neo"),
        embedding=("embeddings.word_embeddings.weight", "wte.weight"),
        head=("lm_head.weight", "lm_head.decoder_weight"),
        tie_default={"*": True},
        loaders={
            "paddlenlp-2.8": _PNLP_ALWAYS_TIED_WARNS,
            "paddlenlp-3": _PNLP_ALWAYS_TIED_WARNS,
            "*": _PNLP_EMBED_HEAD,
        },
    ),
    FamilyRow(  # CodeGen: transformer.wte + its own biased nn.Linear head, lm_head.weight [hidden, vocab] in
        # PaddleNLP 2.8.1 and lm_head.bias [vocab]. PaddleNLP never builds it from the embedding (no
        # tie_weights call): a checkpoint without lm_head.weight loads a random head, and a head in the file
        # is used whatever tie_word_embeddings says (tests/oracles/test_pnlp_loaders.py). Other loaders:
        # unproven, kept.
        family="codegen",
        model_types=("codegen",),
        embedding=("wte.weight",),
        head=("lm_head.weight",),
        bias=("lm_head.bias",),
        loaders={"paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE, "*": _OWN_HEAD_NO_RETIE},
    ),
    FamilyRow(  # GPT-J: the names and the head of CodeGen (a biased nn.Linear, lm_head.weight [hidden, vocab]
        # + lm_head.bias in PaddleNLP 2.8.1, never re-tied; tests/oracles/test_pnlp_loaders.py, .pdparams:
        # PaddleNLP 2.8.1 cannot read back the safetensors its own save_pretrained writes for GPT-J)
        family="gptj",
        model_types=("gptj",),
        embedding=("wte.weight",),
        head=("lm_head.weight",),
        bias=("lm_head.bias",),
        loaders={"paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE, "*": _OWN_HEAD_NO_RETIE},
    ),
    FamilyRow(  # QWen v1 (PaddleNLP qwen.wte, QWenLMHead lm_head.weight [hidden, vocab]); never re-tied by
        # PaddleNLP 2.8.1 (tests/oracles/test_pnlp_loaders.py). HF's remote-code QWen: unproven, kept.
        family="qwen",
        model_types=("qwen",),
        embedding=("wte.weight",),
        head=("lm_head.weight",),
        loaders={"paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE, "*": _OWN_HEAD_NO_RETIE},
    ),
    FamilyRow(  # BERT / ERNIE / RoBERTa masked LM: the decoder is [vocab, hidden] with transpose_y, bias
        # aliased
        family="bert",
        model_types=(
            "bert",
            "ernie",
            "roberta",
            "ernie_m",
            "electra",
            "tinybert",
            "ppminilm",
            "nezha",
            "xlm-roberta",
        ),
        embedding=("embeddings.word_embeddings.weight",),
        head=(
            "cls.predictions.decoder.weight",
            "cls.predictions.decoder_weight",
            "lm_head.decoder.weight",
            "lm_head.decoder_weight",
        ),
        bias=(
            "cls.predictions.bias",
            "cls.predictions.decoder.bias",
            "cls.predictions.decoder_bias",
            "lm_head.bias",
            "lm_head.decoder.bias",
            "lm_head.decoder_bias",
        ),
        tie_default={"*": True},
        loaders={
            "paddlenlp-2.8": _PNLP_EMBED_HEAD_WARNS,
            "paddlenlp-3": _PNLP_EMBED_HEAD_WARNS,
            "*": _PNLP_EMBED_HEAD,
        },
    ),
    FamilyRow(  # T5: shared = encoder.embed_tokens = decoder.embed_tokens; the tied head is shared, logits
        # scaled
        family="t5",
        model_types=("t5", "mt5", "umt5"),
        embedding=("shared.weight",),
        aliases=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"),
        head=("lm_head.weight",),
        tie_default={"*": True},
        loaders={
            "*": _PNLP_EMBED_HEAD,
            "paddlenlp-2.8": _PNLP_LINEAR_HEAD_RETIE,
            "paddlenlp-3": _PNLP_LINEAR_HEAD_RETIE,
        },
        tied_scale=TiedScale.RSQRT_D_MODEL,
    ),
    FamilyRow(  # BART / mBART / M2M100 / Pegasus: shared table, head lm_head(.weight|_weight),
        # final_logits_bias [1, V]
        family="bart",
        model_types=(
            "bart",
            "mbart",
            "m2m_100",
            "pegasus",
            "marian",
            "blenderbot",
            "codegen2",
            "unified_transformer",
        ),
        embedding=("shared.weight", "embed_tokens.weight"),
        aliases=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"),
        head=("lm_head.weight", "lm_head_weight"),
        bias=("final_logits_bias",),
        # PaddleNLP's BART keeps lm_head_weight as a parameter of its own: 2.8.1 loads a checkpoint without
        # it with a random head (tests/oracles/test_pnlp_loaders.py)
        tie_default={"paddlenlp-2.8": False, "paddlenlp-3": False, "*": True},
        loaders={"*": _PNLP_EMBED_HEAD, "paddlenlp-2.8": _OWN_HEAD_NO_RETIE},
    ),
    FamilyRow(  # XLNet
        family="xlnet",
        model_types=("xlnet",),
        embedding=("word_embedding.weight",),
        head=("lm_loss.weight",),
        bias=("lm_loss.bias",),
        tie_default={"*": True},
        loaders={"*": _PNLP_EMBED_HEAD},
    ),
    FamilyRow(  # ChatGLM v1: PaddleNLP 2.8.1's ChatGLMForCausalLM uses the word embedding itself as lm_head,
        # whatever tie_word_embeddings says: a head in the file is ignored
        # (tests/oracles/test_pnlp_loaders.py)
        family="chatglm",
        model_types=("chatglm",),
        embedding=("word_embeddings.weight",),
        head=("lm_head.weight",),
        tie_default={"*": True},
        loaders={"*": _PNLP_EMBED_HEAD, "paddlenlp-2.8": replace(_PNLP_EMBED_HEAD, always_tied=True)},
    ),
    FamilyRow(  # ChatGLM v2/v3: transformer.embedding.word_embeddings + a separate output_layer
        family="chatglm_v2",
        model_types=("chatglm_v2", "chatglm2", "chatglm3"),
        head_under_model=True,
        embedding=("word_embeddings.weight",),
        head=("output_layer.weight", "lm_head.weight"),
        loaders={
            "paddleformers": _PF_LIKE,
            "hf": _PF_LIKE,
            "paddlenlp-2.8": _PNLP_LINEAR_HEAD_NO_RETIE,
            "paddlenlp-3": _PNLP_LINEAR_HEAD_NO_RETIE,
        },
    ),
    FamilyRow(  # Falcon: transformer.word_embeddings + lm_head, tied by default (HF FalconConfig). PaddleNLP
        # 2.8.1's RWForCausalLM (model_type RefinedWeb) holds lm_head.weight [vocab, hidden] and never calls
        # tie_weights: a checkpoint without it loads a random head (tests/oracles/test_pnlp_loaders.py)
        family="falcon",
        model_types=("falcon", "RefinedWeb", "RefinedWebModel"),
        embedding=("word_embeddings.weight",),
        head=("lm_head.weight",),
        tie_default={"*": True},
        loaders={"*": _PF_LIKE, "paddlenlp-2.8": _OWN_HEAD_NO_RETIE},
    ),
    FamilyRow(  # Bloom: word_embeddings; PaddleNLP writes only the embedding. PaddleNLP 2.8.1's
        # BloomForCausalLM always builds its head from the word embedding: an lm_head.weight in the file is
        # reported unused.
        family="bloom",
        model_types=("bloom",),
        embedding=("word_embeddings.weight",),
        head=("lm_head.weight",),
        tie_default={"*": True},
        loaders={
            "paddlenlp-2.8": replace(_PNLP_EMBED_HEAD, always_tied=True),
            "paddlenlp-3": replace(_PNLP_EMBED_HEAD, always_tied=True),
            "*": _PNLP_EMBED_HEAD,
        },
    ),
)

# Used when model_type is not in the table: the common names, then a shape search (detect.py says so).
FALLBACK = FamilyRow(
    family="unknown",
    model_types=(),
    embedding=(
        "embed_tokens.weight",
        "word_embeddings.weight",
        "wte.weight",
        "shared.weight",
        "tok_embeddings.weight",
        "word_embedding.weight",
    ),
    aliases=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"),
    head=(
        "lm_head.weight",
        "output.weight",
        "lm_head_weight",
        "output_layer.weight",
        "embed_out.weight",
        "lm_head.decoder_weight",
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder_weight",
        "lm_loss.weight",
    ),
    bias=(
        "lm_head.bias",
        "final_logits_bias",
        "cls.predictions.bias",
        "cls.predictions.decoder_bias",
        "cls.predictions.decoder.bias",
        "lm_loss.bias",
    ),
    loaders={"*": _PF_LIKE},
)


# ============================================================================ proofs of the loader facts
# PaddleFormers 1.2: tests/oracles/test_families.py::test_loader_facts builds each model type with
# PaddleFormers itself (support/family_builder.py), saves it in both containers, loads variants back (head
# dropped with the flag tied; an independent head with the flag untied; the head equal to the embedding) and
# asserts the row's facts (reties, always_tied, head layout in the file, head bias). The same test checks that
# the "hf" rows of these model types mirror them (except Gemma3 from safetensors, whose hf row is HF
# transformers' reading: it honours tie_word_embeddings, so "untie --loader hf" is the way out of
# PaddleFormers' always-tied one).
_PF_FACTS_TEST = "tests/oracles/test_families.py::test_loader_facts[{model_type}-{container}]"
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
# Families whose untied model, under HF transformers 5.3, keeps the encoder/decoder embedding copies (the
# row's ``aliases``) apart from the shared table: an untied checkpoint without them loads them random
# ("missing": model.encoder/decoder.embed_tokens.weight), so untie writes them as copies of the embedding
# (tests/oracles/test_hf_loader.py::test_hf_native_outputs_load[bart], [m2m_100]). T5 is not one: transformers
# 5.3 always ties them.
HF_UNTIED_KEEPS_ALIASES_APART: frozenset[str] = frozenset({"bart", "m2m_100"})
# (model type, container) whose hf row is HF transformers' own reading, not a mirror of PaddleFormers'
# (tests/oracles/test_hf_loader.py proves it): transformers honours tie_word_embeddings where PaddleFormers
# 1.2 always ties (Gemma3) or never re-ties (Phi3, GptOss, DeepSeek-V3, GLM-4-MoE)
HF_NOT_PF: frozenset[tuple[str, str]] = frozenset(
    (mt, "safetensors") for mt in ("gemma3_text", "phi3", "gpt_oss", "deepseek_v3", "glm4_moe")
)
_PF_PROOFS: dict[ProofKey, str] = {
    ProofKey(mt, "paddleformers", c): _PF_FACTS_TEST.format(model_type=mt, container=c)
    for mt, containers in _PF_PROVEN.items()
    for c in containers
}
# PaddleNLP 2.8.1 (on paddle 2.6.2): tests/oracles/test_pnlp_loaders.py::test_pnlp_loader_facts builds each
# model type with PaddleNLP itself in its own venv, saves it in both containers and asserts the row's facts.
_PNLP_FACTS_TEST = "tests/oracles/test_pnlp_loaders.py::test_pnlp_loader_facts"
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
# HF transformers 5.3 (torch 2.13 CPU, its own venv: tests/tools/hf_venv.sh):
# tests/oracles/test_hf_loader.py::test_hf_loader_facts loads PaddleFormers 1.2's HF-layout exports of each
# model type (tied, untied, head dropped) in AutoModelForCausalLM and asserts the hf row's facts (the exports'
# logits checked against PaddleFormers'); its other tests load tietool's outputs of them. Not proven:
# Qwen3-Next (transformers does not read the export's expert names) and the vision-language wrappers (no
# AutoModelForCausalLM class); transformers reads no .pdparams.
_HF_FACTS_TEST = "tests/oracles/test_hf_loader.py::test_hf_loader_facts[{model_type}]"
_HF_PROVEN: tuple[str, ...] = (
    "llama",
    "qwen2",
    "qwen3",
    "ernie4_5",
    "gemma3_text",
    "phi3",
    "gpt_oss",
    "deepseek_v3",
    "qwen2_moe",
    "qwen3_moe",
    "glm4_moe",
)
# model types PaddleFormers 1.2 does not export (or whose export transformers cannot load: Qwen3-VL), proven
# on checkpoints transformers' own save_pretrained wrote (tiny configs, tests/support/hf_build.py; wrappers
# through AutoModelForImageTextToText): tied save (no head written), untied, untied with the head equal
_HF_NATIVE_FACTS_TEST = "tests/oracles/test_hf_loader.py::test_hf_native_loader_facts[{model_type}]"
_HF_NATIVE_PROVEN: tuple[str, ...] = (
    "gpt2",
    "t5",
    "bart",
    "m2m_100",
    "llava",
    "falcon",
    "mistral3",
    "qwen3_vl",
)
# model types PaddleFormers 1.2 has no class for, whose HF-named .pdparams only transformers reads, once
# ``tietool convert --to safetensors`` has changed the container (names and bytes kept; transformers reads no
# .pdparams): the default loader of such a folder is hf (surgery.inspect.detect.infer_loader), its facts
# proven by converting transformers' own saves to .pdparams, editing them under the default loader and
# loading the outputs converted back (tests/oracles/test_hf_loader.py::test_hf_pdparams_route[...])
_HF_PDPARAMS_TEST = "tests/oracles/test_hf_loader.py::test_hf_pdparams_route[{model_type}]"
HF_PDPARAMS_PROVEN: tuple[str, ...] = ("gpt2", "bart", "m2m_100")
_HF_PROOFS: dict[ProofKey, str] = {
    **{ProofKey(mt, "hf", "safetensors"): _HF_FACTS_TEST.format(model_type=mt) for mt in _HF_PROVEN},
    **{
        ProofKey(mt, "hf", "safetensors"): _HF_NATIVE_FACTS_TEST.format(model_type=mt)
        for mt in _HF_NATIVE_PROVEN
    },
    **{ProofKey(mt, "hf", "pdparams"): _HF_PDPARAMS_TEST.format(model_type=mt) for mt in HF_PDPARAMS_PROVEN},
}
PROOFS: Mapping[ProofKey, str] = MappingProxyType({**_PF_PROOFS, **_PNLP_PROOFS, **_HF_PROOFS})
"""``(model_type, loader, container)`` → pytest node id of the test that loaded a library-written checkpoint
of that model type in that container and asserted the table's facts for it. A write relies on a loader fact
(drop a head the loader re-ties, refuse untie where it always ties, the layout of a head it writes) only
where the triple is here (``Family.proven``); elsewhere it does what is right under every loader."""
