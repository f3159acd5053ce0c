"""Conversions (``tietool convert``): which tensors of a model type are Linear weights and how its names,
fused projections and config keys change between conventions.

Which tensors of a family are nn.Linear weights (they are transposed between Paddle's [in, out] and the
HF/PaddleFormers [out, in] layout) and which sizes of the config their two axes are (the layout is proven
from the shape against them), which are copied as they are, how fused projections split, and which config
keys change. Sources: PaddleNLP 2.8.1 ``llama/modeling.py`` (``llama.`` names, ``qkv_proj`` /
``gate_up_fused_proj`` when ``fuse_attention_qkv`` / ``fuse_attention_ffn``), PaddleFormers 1.2.0
``conversion_utils.py`` (``split_param_func``: qkv grouped per kv head), PaddleFormers 1.2.0
``ernie4_5{,_moe}/modeling.py`` (its Paddle-layout ``qkv_proj`` is reshaped ``[kv, (q/kv + 2) x head_dim]``,
grouped per kv head, ``up_gate_proj`` is ``[gate | up]``; ``_gen_inv_aoa_config``: the HF names, every
Linear incl. the router ``mlp.gate`` and ``mtp_linear_proj.N`` transposed), ERNIE's own
``tools/paddle2torch`` converter (ERNIEKit / ``*-Paddle`` releases: ``ernie.`` names, ``qkv_proj`` is
``[q | k | v]`` along the output axis, ``up_gate_proj`` is ``[gate | up]``, ``ernie.`` -> ``model.``) and
the fixtures ``pnlp_llama_untied`` / ``pf_llama_untied_legacy_pdparams`` / ``pf_llama_untied_fp32``.
Only model types PaddleFormers 1.2 has a class for are listed; PaddleFormers 1.2 has no Mistral, GPT,
BERT or T5 (``PADDLEFORMERS_LACKS``). A name component that is a number (layer, expert, MTP depth) is
written ``N`` in the suffixes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .rows import ConfigKeys, ConversionRow, FusedSpec, Naming, Size, Split

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
_LLAMA_BIASES: tuple[str, ...] = (
    *[f"self_attn.{p}_proj.bias" for p in "qkvo"],
    *[f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")],
)
_LLAMA_PLAIN: tuple[str, ...] = (
    "embed_tokens.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "norm.weight",
    *_LLAMA_BIASES,
)


def _qkv(split: Split, module: str = "self_attn.qkv_proj") -> dict[str, FusedSpec]:
    return {
        f"{module}.{w}": FusedSpec(tuple(f"self_attn.{p}_proj.{w}" for p in "qkv"), split, (S.HIDDEN, S.QKV))
        for w in ("weight", "bias")
    }


def _gate_up(suffix: str, out_prefix: str, dims: tuple[Size, Size]) -> dict[str, FusedSpec]:
    return {
        f"{suffix}.{w}": FusedSpec(
            tuple(f"{out_prefix}{p}_proj.{w}" for p in ("gate", "up")), Split.HALVES, dims
        )
        for w in ("weight", "bias")
    }


_LLAMA_FUSED = {**_qkv(Split.QKV_GROUPED), **_gate_up("mlp.gate_up_fused_proj", "mlp.", (S.HIDDEN, S.INTER2))}
# PaddleFormers 1.2's own Paddle layout (legacy save) of Qwen2/Qwen3 (the Deprecated classes): qkv_proj
# grouped per kv head, up_gate_proj gate | up (its AOA fused_qkv / fused_ffn); converted bit for bit to its
# HF export in tests/oracles/test_convert.py::test_paddleformers_legacy_fused_qwen_converts_to_its_hf_export
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
    fused: dict[Naming, Mapping[str, FusedSpec]] = (
        {Naming.PADDLENLP: _LLAMA_FUSED} if paddlenlp_prefix else {}
    )
    if pf_fused:
        fused[Naming.HF] = _PF_FUSED
    return ConversionRow(
        prefixes=prefixes,
        head="lm_head.weight",
        linear=_LLAMA_LINEAR,
        plain=(*_LLAMA_PLAIN, *extra_plain),
        fused=fused,
        paddlenlp_own_head=own_head,
        paddlenlp_28=paddlenlp_prefix == "llama",  # 2.8.1 has llama/ and qwen/ (v1), no qwen2/ or qwen3/
        # PaddleNLP 2.8.1 llama/modeling.py builds every Linear with bias_attr=False; a PaddleFormers Llama
        # with attention_bias / mlp_bias holds them (tests/oracles/test_convert_sweep.py)
        paddlenlp_lacks=_LLAMA_BIASES if paddlenlp_prefix == "llama" else (),
    )


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


_ERNIE_MOE_LINEAR: dict[str, tuple[Size, Size]] = {
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
_ERNIE_MOE_PLAIN: tuple[str, ...] = (
    "mlp.moe_statics.e_score_correction_bias",
    "mtp_emb_norm.N.weight",
    "mtp_hidden_norm.N.weight",
    "mtp_linear_proj.N.bias",
)


def _ernie(moe: bool) -> ConversionRow:
    """ERNIE 4.5 (dense or MoE with MTP): PaddleFormers names ``model.``, ERNIEKit names ``ernie.``; no
    PaddleNLP 2.x naming (PaddleNLP 2.8 has no ERNIE 4.5)."""
    row = _llama_like(None)
    return replace(
        row,
        prefixes={Naming.HF: "model", Naming.KIT: "ernie"},
        fused={
            Naming.KIT: _ernie_fused(Split.QKV_CONCAT, moe),
            Naming.HF: _ernie_fused(Split.QKV_GROUPED, moe),
        },
        linear={**row.linear, **(_ERNIE_MOE_LINEAR if moe else {})},
        plain=(*row.plain, *(_ERNIE_MOE_PLAIN if moe else ())),
    )


# Gemma 3 (text) in PaddleFormers 1.2 (gemma3_text/modeling.py): Llama's names plus four norms per layer and
# q/k norms; its in-memory model (what the Trainer's flex checkpoint holds) fuses qkv_proj (grouped per kv
# head) and up_gate_proj (gate | up) by the same AOA macros as Qwen2 (_gen_aoa_config: fused_qkv,
# fused_ffn), every Linear [in, out]; the head is [vocab, hidden] (tied: the embedding itself). Proven by
# tests/oracles/test_flex_families.py (a real Trainer checkpoint merged, loaded by a plain from_pretrained
# with the trained model's logits) and the case e06 (unfused names, transposed).
_GEMMA3_PLAIN = (
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "pre_feedforward_layernorm.weight",
    "post_feedforward_layernorm.weight",
)

# Qwen2-MoE in PaddleFormers 1.2 (qwen2_moe/modeling.py, the non-fleet classes): Qwen2's attention (qkv_proj
# grouped per kv head, with bias), per expert and for the shared expert an up_gate_proj (gate | up, fused_ffn)
# and a down_proj; the router mlp.gate [hidden, num_experts] and the shared expert's gate [hidden, 1] are
# Linear weights too (transpose_weight_keys "gate", "shared_expert_gate"; _gen_aoa_config transposes them).
# Proven by tests/oracles/test_flex_families.py (a real Trainer checkpoint merged, a plain from_pretrained of
# the output gives the trained model's logits).
_QWEN2_MOE_LINEAR: dict[str, tuple[Size, Size]] = {
    "mlp.gate.weight": (S.HIDDEN, S.NUM_EXPERTS),
    "mlp.experts.N.gate_proj.weight": (S.HIDDEN, S.MOE_INTER),
    "mlp.experts.N.up_proj.weight": (S.HIDDEN, S.MOE_INTER),
    "mlp.experts.N.down_proj.weight": (S.MOE_INTER, S.HIDDEN),
    "mlp.shared_expert.gate_proj.weight": (S.HIDDEN, S.SHARED_EXPERT_INTER),
    "mlp.shared_expert.up_proj.weight": (S.HIDDEN, S.SHARED_EXPERT_INTER),
    "mlp.shared_expert.down_proj.weight": (S.SHARED_EXPERT_INTER, S.HIDDEN),
    "mlp.shared_expert_gate.weight": (S.HIDDEN, S.ONE),
}
_QWEN2_MOE_FUSED = {
    **_PF_FUSED,
    **_gate_up("mlp.experts.N.up_gate_proj", "mlp.experts.N.", (S.HIDDEN, S.MOE_INTER2)),
    **_gate_up("mlp.shared_expert.up_gate_proj", "mlp.shared_expert.", (S.HIDDEN, S.SHARED_EXPERT_INTER2)),
}


def _qwen2_moe() -> ConversionRow:
    row = _llama_like(None, pf_fused=True)
    return replace(row, linear={**row.linear, **_QWEN2_MOE_LINEAR}, fused={Naming.HF: _QWEN2_MOE_FUSED})


# Qwen3-MoE in PaddleFormers 1.2 (qwen3_moe/modeling.py, the non-fleet classes): Qwen3's attention (q/k norms,
# qkv_proj grouped per kv head), routed experts as Qwen2-MoE's, no shared expert; the router mlp.gate is a
# Linear (transpose_weight_keys "gate"). Proven by tests/oracles/test_flex_families.py as Qwen2-MoE.
_QWEN3_MOE_LINEAR = {k: v for k, v in _QWEN2_MOE_LINEAR.items() if "shared_expert" not in k}
_QWEN3_MOE_FUSED = {k: v for k, v in _QWEN2_MOE_FUSED.items() if "shared_expert" not in k}


def _qwen3_moe() -> ConversionRow:
    row = _llama_like(None, ("self_attn.q_norm.weight", "self_attn.k_norm.weight"), pf_fused=True)
    return replace(row, linear={**row.linear, **_QWEN3_MOE_LINEAR}, fused={Naming.HF: _QWEN3_MOE_FUSED})


# GLM-4-MoE in PaddleFormers 1.2 (glm4_moe/modeling.py, the non-fleet classes): Llama's attention (qkv_proj
# grouped per kv head, optional q/k norms), the first_k_dense_replace layers dense (up_gate_proj gate | up),
# the others routed experts and shared_experts (plural) fused alike; the router mlp.gate.weight is NOT a
# Linear here: [n_routed_experts, hidden] in memory and in the HF files alike (_gen_aoa_config maps it
# without ^T), copied as stored with its e_score_correction_bias. MTP layers (num_nextn_predict_layers)
# are not listed: a checkpoint with them is refused by name. Proven by tests/oracles/test_flex_families.py.
_GLM4_MOE_LINEAR: dict[str, tuple[Size, Size]] = {
    "mlp.experts.N.gate_proj.weight": (S.HIDDEN, S.MOE_INTER),
    "mlp.experts.N.up_proj.weight": (S.HIDDEN, S.MOE_INTER),
    "mlp.experts.N.down_proj.weight": (S.MOE_INTER, S.HIDDEN),
    "mlp.shared_experts.gate_proj.weight": (S.HIDDEN, S.N_SHARED_INTER),
    "mlp.shared_experts.up_proj.weight": (S.HIDDEN, S.N_SHARED_INTER),
    "mlp.shared_experts.down_proj.weight": (S.N_SHARED_INTER, S.HIDDEN),
}
_GLM4_MOE_FUSED = {
    **_PF_FUSED,
    **_gate_up("mlp.experts.N.up_gate_proj", "mlp.experts.N.", (S.HIDDEN, S.MOE_INTER2)),
    **_gate_up("mlp.shared_experts.up_gate_proj", "mlp.shared_experts.", (S.HIDDEN, S.N_SHARED_INTER2)),
}
_GLM4_MOE_PLAIN = (
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate.weight",
    "mlp.gate.e_score_correction_bias",
)


def _glm4_moe() -> ConversionRow:
    row = _llama_like(None, _GLM4_MOE_PLAIN, pf_fused=True)
    return replace(row, linear={**row.linear, **_GLM4_MOE_LINEAR}, fused={Naming.HF: _GLM4_MOE_FUSED})


# DeepSeek-V3 in PaddleFormers 1.2 (deepseek_v3/modeling.py): multi-head latent attention (q_a_proj /
# q_b_proj, or q_proj without q_lora_rank; kv_a_proj_with_mqa / kv_b_proj; o_proj from heads x v_head_dim),
# the first_k_dense_replace layers dense, the others routed experts and shared_experts, all unfused (its
# _gen_aoa_config transposes each: transpose_weight_keys), the router mlp.gate [hidden, n_routed_experts]
# a Linear; q_a_layernorm, kv_a_layernorm and the correction bias copied. MTP layers (eh_proj, ...) are not
# listed: refused by name. Proven by tests/oracles/test_flex_families.py.
_DEEPSEEK_V3_LINEAR: dict[str, tuple[Size, Size]] = {
    "self_attn.q_proj.weight": (S.HIDDEN, S.MLA_Q),
    "self_attn.q_a_proj.weight": (S.HIDDEN, S.Q_LORA),
    "self_attn.q_b_proj.weight": (S.Q_LORA, S.MLA_Q),
    "self_attn.kv_a_proj_with_mqa.weight": (S.HIDDEN, S.KV_LORA_ROPE),
    "self_attn.kv_b_proj.weight": (S.KV_LORA, S.MLA_KV),
    "self_attn.o_proj.weight": (S.MLA_O, S.HIDDEN),
    "mlp.gate_proj.weight": (S.HIDDEN, S.INTER),
    "mlp.up_proj.weight": (S.HIDDEN, S.INTER),
    "mlp.down_proj.weight": (S.INTER, S.HIDDEN),
    "mlp.gate.weight": (S.HIDDEN, S.N_ROUTED),
    **_GLM4_MOE_LINEAR,
}
_DEEPSEEK_V3_PLAIN = (
    "embed_tokens.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "norm.weight",
    "self_attn.q_a_layernorm.weight",
    "self_attn.kv_a_layernorm.weight",
    "mlp.gate.e_score_correction_bias",
)


def _deepseek_v3() -> ConversionRow:
    row = _llama_like(None)
    return replace(row, linear=_DEEPSEEK_V3_LINEAR, plain=_DEEPSEEK_V3_PLAIN, fused={})


# Qwen3-Next in PaddleFormers 1.2 (qwen3_next/modeling.py): full-attention layers with a gated query
# (q_proj [2 x heads x head_dim, hidden] in HF: query | gate per head), fused qkv_proj by paddle's fused_qkv
# macro (q cut into heads, k and v into kv heads, grouped per kv head); linear-attention layers whose
# in_proj_qkvz, in_proj_ba and out_proj are Linear weights (transpose_weight_keys) and whose conv1d, A_log,
# dt_bias and norm are copied; Qwen2-MoE's experts, shared expert and gates. Proven by
# tests/oracles/test_flex_families.py.
_QWEN3_NEXT_LINEAR: dict[str, tuple[Size, Size]] = {
    "self_attn.q_proj.weight": (S.HIDDEN, S.Q_GATED),
    "self_attn.k_proj.weight": (S.HIDDEN, S.KV),
    "self_attn.v_proj.weight": (S.HIDDEN, S.KV),
    "self_attn.o_proj.weight": (S.Q, S.HIDDEN),
    "linear_attn.in_proj_qkvz.weight": (S.HIDDEN, S.LINEAR_QKVZ),
    "linear_attn.in_proj_ba.weight": (S.HIDDEN, S.LINEAR_BA),
    "linear_attn.out_proj.weight": (S.LINEAR_V, S.HIDDEN),
    **_QWEN2_MOE_LINEAR,
}
_QWEN3_NEXT_FUSED = {
    **{k: v for k, v in _QWEN2_MOE_FUSED.items() if "qkv_proj" not in k},
    "self_attn.qkv_proj.weight": FusedSpec(
        tuple(f"self_attn.{p}_proj.weight" for p in "qkv"), Split.QKV_GROUPED_GATED, (S.HIDDEN, S.QKV_GATED)
    ),
    "self_attn.qkv_proj.bias": FusedSpec(
        tuple(f"self_attn.{p}_proj.bias" for p in "qkv"), Split.QKV_GROUPED_GATED, (S.HIDDEN, S.QKV_GATED)
    ),
}
_QWEN3_NEXT_PLAIN = (
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "linear_attn.conv1d.weight",
    "linear_attn.A_log",
    "linear_attn.dt_bias",
    "linear_attn.norm.weight",
)


def _qwen3_next() -> ConversionRow:
    row = _llama_like(None, _QWEN3_NEXT_PLAIN)
    return replace(row, linear=_QWEN3_NEXT_LINEAR, fused={Naming.HF: _QWEN3_NEXT_FUSED})


# model_type -> row
CONVERSIONS: Mapping[str, ConversionRow] = {
    "llama": _llama_like("llama", own_head=True),
    "qwen2": _llama_like("qwen2", pf_fused=True),
    "qwen3": _llama_like("qwen3", ("self_attn.q_norm.weight", "self_attn.k_norm.weight"), pf_fused=True),
    # PaddleNLP 2.x has no ERNIE 4.5: ERNIEKit (ernie.*) and PaddleFormers (model.*) namings only
    "ernie4_5": _ernie(moe=False),
    "ernie4_5_moe": _ernie(moe=True),
    "gemma3_text": _llama_like(None, _GEMMA3_PLAIN, pf_fused=True),
    "qwen2_moe": _qwen2_moe(),
    "qwen3_moe": _qwen3_moe(),
    "glm4_moe": _glm4_moe(),
    "deepseek_v3": _deepseek_v3(),
    "qwen3_next": _qwen3_next(),
}

_FAMILIES_TEST = "tests/oracles/test_flex_families.py::test_plain_from_pretrained_gives_the_trained_logits"
FLEX_MERGE_PROOFS: Mapping[str, str] = {
    "llama": "tests/oracles/test_flex.py::test_real_trainer_checkpoint_merged_loads_with_the_trained_logits",
    **{
        mt: f"{_FAMILIES_TEST}[{mt}]"
        for mt in ("deepseek_v3", "gemma3_text", "glm4_moe", "qwen2_moe", "qwen3_moe", "qwen3_next")
    },
}
"""model_type → the test that merged a real PaddleFormers 1.2 Trainer flex checkpoint of it with the CLI and
loaded the output with a plain ``from_pretrained``, getting the trained model's logits. The other rows
(qwen2, qwen3, ernie4_5, ernie4_5_moe) are proven by ``convert`` from PaddleFormers' own legacy Paddle-layout
save (the same in-memory layout the Trainer holds) to its HF export (``tests/oracles/test_convert.py``)."""

# model_type -> the test proving it: the class's own export of a tied model writes no ``lm_head.weight``
# (``_gen_inv_aoa_config`` maps ``lm_head.weight -> _``: Gemma 3 always, its loader taking the head from
# ``model.embed_tokens.weight``), and a merged tied Trainer checkpoint written the same way (the duplicate
# head the Trainer holds dropped) loads with a plain ``from_pretrained`` with the trained logits. Qwen2/3,
# their MoE and ERNIE 4.5 exports drop it too (read from PaddleFormers 1.2's source; measured for Qwen3 by
# ``save_pretrained``), but no tied Trainer checkpoint of theirs proves the merge: their merge keeps the head.
TIED_HEAD_NOT_EXPORTED: Mapping[str, str] = {
    "gemma3_text": "tests/oracles/test_flex_families.py::test_tied_merge_is_the_librarys_export[gemma3_text]",
}

# the Linear weights of every row, for a model type without a row of its own: only their shapes are read (to
# tell whether a checkpoint tietool does not convert is in the HF layout), never converted
# a suffix several rows list with other sizes (q_proj: Llama's heads x head_dim, DeepSeek-V3's latent
# attention, Qwen3-Next's gated query) takes the first row's (Llama's), as before those rows were added
ANY_LINEAR: Mapping[str, tuple[Size, Size]] = {
    k: v for r in reversed(list(CONVERSIONS.values())) for k, v in r.linear.items()
}

# model families (FAMILIES "family") and model types PaddleFormers 1.2 has no model class for (no folder in
# paddleformers/transformers/): how messages name them
PADDLEFORMERS_LACKS: Mapping[str, str] = {
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
CONFIG_KEYS: Mapping[str, ConfigKeys] = {
    "paddleformers": ConfigKeys(
        rename={"dtype": "torch_dtype"},
        drop=("source", "paddlenlp_version"),
        unfuse=("fuse_attention_qkv", "fuse_attention_ffn"),
        set={"paddleformers_version": "1.2.0"},
        # PaddleNLP's rope scaling has no PaddleFormers spelling tietool knows
        refuse_set=("rope_scaling_type",),
    ),
    "paddlenlp": ConfigKeys(
        rename={"torch_dtype": "dtype"},
        drop=("source", "paddleformers_version"),
        unfuse=("fuse_attention_qkv", "fuse_attention_ffn"),
        set={"paddlenlp_version": None},
        refuse_set=("rope_scaling",),
    ),
}
