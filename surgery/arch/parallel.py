"""Tensor parallelism (``tietool merge``): how each tensor of a model type is split across ranks.

How each tensor of a family is split across tensor-parallel ranks, as the libraries' own
``_get_tensor_parallel_mappings`` split it (PaddleNLP 2.8 ``llama/modeling.py`` and ``qwen2/modeling.py``,
PaddleFormers ``phi3`` and ``ernie4_5``; the split/merge helpers are PaddleFormers 1.2
``conversion_utils.py`` ``normal_fuse_split_tp`` / ``naive_fuse_split_tp``). Every tensor is in Paddle's
layout (a Linear weight is ``[in, out]``): rank files are written by PaddleNLP / PaddleFormers' legacy
``.pdparams`` save. ``tietool merge`` (:mod:`surgery.plan.merge`) reads only this table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..model.enums import TensorRole
from .rows import TPRule, TPSplit, matches


def _tp(split: TPSplit, *shape: str, role: TensorRole | None = None) -> TPRule:
    return TPRule(split, shape, role)


_C, _R, _REP = TPSplit.COLUMN, TPSplit.ROW, TPSplit.REPLICATED
# PaddleNLP Llama / Qwen2 (``llama.``, ``qwen2.``) and PaddleFormers (``model.``) names, matched as suffixes.
# A fused qkv_proj is split as a plain column: its layout is grouped per kv head ([q × groups, k, v] per kv
# head, PaddleFormers ``fuse_param_func(is_qkv=True)``), so a column block is whole kv groups (PaddleNLP Llama
# ``fuse_attention_qkv``; PaddleFormers 1.2 Qwen2 ``qkv_proj`` colwise, which asserts kv_heads % tp == 0).
_LLAMA_LIKE_TP: dict[str, TPRule] = {
    "embed_tokens.weight": _tp(TPSplit.VOCAB, "V", "H", role=TensorRole.INPUT_EMBEDDING),
    "lm_head.weight": _tp(TPSplit.HEAD, "V", "H", role=TensorRole.LM_HEAD),
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
TENSOR_PARALLEL: Mapping[str, Mapping[str, TPRule]] = {
    "llama": _LLAMA_LIKE_TP,
    "mistral": _LLAMA_LIKE_TP,
    "qwen2": _LLAMA_LIKE_TP,
    "qwen3": _LLAMA_LIKE_TP,
    "phi3": _PHI3_TP,
}
"""model_type → {name suffix → :class:`TPRule`}: the one place ``merge`` learns how tensors were split."""

# config keys a tensor-parallel / pipeline-parallel run writes, and their value in a merged checkpoint
PARALLEL_CONFIG_KEYS: Mapping[str, int] = {
    "tensor_parallel_degree": 1,
    "tensor_parallel_rank": 0,
    "tensor_model_parallel_size": 1,
    "pipeline_parallel_degree": 1,
    "pipeline_model_parallel_size": 1,
    "expert_model_parallel_size": 1,
}


# Expert parallelism (``tietool merge`` of ``moe_sharding00`` / ``moe00`` rank files: plan/merge_experts.py).
_EP_TEST = "tests/oracles/test_merge_experts.py::test_real_moe_rank_files_merge_back_bit_for_bit[{}]"


@dataclass(frozen=True)
class ExpertCount:
    """Where a model type's config.json gives its number of routed experts, and the proof.

    Attributes:
        keys: the config keys (dotted inside a nested text config, ``text_config.n_routed_experts``); any
            one of them gives the count, several present must agree.
        proof: the pytest node id of the test that built the model type with the library, saved it with the
            library's own save, cut the state dict into expert-parallel rank files as the library's
            expert-parallel save does (rank r holds the r-th block of E/ep experts, numbered globally or
            locally) and merged them back bit for bit, the count read from these keys.
        library: the library whose configuration class writes the keys.
    """

    keys: tuple[str, ...]
    proof: str
    library: str = "PaddleFormers 1.2"


EXPERT_COUNTS: Mapping[str, ExpertCount] = {
    # Qwen3-MoE's save_pretrained writes num_local_experts too (its attribute_map alias of num_experts);
    # the Trainer's config of tests/data/cases/d06 has num_experts
    "qwen3_moe": ExpertCount(("num_experts", "num_local_experts"), _EP_TEST.format("qwen3_moe")),
    "qwen2_moe": ExpertCount(("num_experts",), _EP_TEST.format("qwen2_moe")),
    "qwen3_next": ExpertCount(("num_experts",), _EP_TEST.format("qwen3_next")),
    "deepseek_v3": ExpertCount(("n_routed_experts",), _EP_TEST.format("deepseek_v3")),
    "glm4_moe": ExpertCount(("n_routed_experts",), _EP_TEST.format("glm4_moe")),
    "glm4v_moe": ExpertCount(("text_config.n_routed_experts",), _EP_TEST.format("glm4v_moe")),
    # ERNIE-4.5's own key (an int; a list is the multimodal model's text/vision experts); also the
    # PaddleFormers-written rank files of tests/data/cases/e10
    "ernie4_5_moe": ExpertCount(("moe_num_experts",), _EP_TEST.format("ernie4_5_moe")),
    # PaddleNLP 2.8.1's Mixtral (mixtral. names, block_sparse_moe.experts.<id>.w1/w2/w3): its modeling keeps
    # every expert on every rank (no moe_group), so its moe00.. files are the replicated case
    "mixtral": ExpertCount(("num_local_experts",), _EP_TEST.format("mixtral"), "PaddleNLP 2.8.1"),
}
"""model_type → :class:`ExpertCount`: the config.json keys of its number of routed experts (the count the
ranks' expert ids add up to), each row with the test that merged real rank files of that model type. Read
from PaddleFormers 1.2's ``transformers/*/configuration.py`` and PaddleNLP 2.8.1's; model types that ship a
count but are not here (their experts stacked in one tensor, ``gpt_oss`` / ``qwen3_vl_moe``, or never built
and cut by a test: ``deepseek_v32``, ``deepseek_v4``, ``glm_moe_dsa``, ``kimi_k2``, ``minimax_m2``,
``qwen3_5_moe``, ``ernie4_5_moe_vl``) are refused naming the keys below."""
EXPERT_COUNT_KEYS: Mapping[str, tuple[str, ...]] = {mt: row.keys for mt, row in EXPERT_COUNTS.items()}
"""model_type → the keys of :data:`EXPERT_COUNTS` (the lookup merge makes)."""
SHIPPED_EXPERT_COUNT_KEYS: tuple[str, ...] = (
    "moe_num_experts",  # PaddleFormers ernie4_5_moe, ernie4_5_moe_vl
    "n_routed_experts",  # deepseek_v3/v32/v4, glm4_moe, glm4v_moe, glm_moe_dsa, kimi_k2, minimax_m2
    "num_experts",  # qwen2_moe, qwen3_moe, qwen3_next, qwen3_5(_moe), qwen3_vl_moe, gpt_oss (attribute)
    "num_local_experts",  # gpt_oss's argument, qwen3_moe's alias; PaddleNLP 2.8.1 mixtral
)
"""Every config key of a number of routed experts that PaddleFormers 1.2's and PaddleNLP 2.8.1's
configuration classes define (a refusal for an unproven model type names the ones its config has)."""
# the tensor of one expert: <module>.experts.<id>.<rest> (PaddleFormers 1.2 Qwen2/Qwen3-MoE and DeepSeek-V3
# MoE layers, ``self.experts = nn.LayerList(...)``); shared experts (``shared_experts.``, ``shared_expert.``)
# do not match: they are replicated on every rank
EXPERT_NAME_RE = re.compile(r"^(?P<module>(?:.*\.)?experts)\.(?P<id>\d+)\.(?P<rest>.+)$")

# the config.json keys each size a TPRule shape names is computed from (merge names the missing ones)
TP_DIM_KEYS: Mapping[str, tuple[str, ...]] = {
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
