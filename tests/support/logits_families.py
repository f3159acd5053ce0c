"""Tiny PaddleFormers 1.2 checkpoints of every causal-LM family it ships, for ``test_verify_logits.py``.

:mod:`support.family_builder` builds eight families; this adds the others PaddleFormers 1.2 ships (its
``transformers/`` folder and its auto tables ``MAPPING_NAMES`` / ``CONFIG_MAPPING_NAMES``) without changing
that module: :data:`EXTRA` holds their tiny configs, and :func:`build_all` runs the same builder script with
``family_builder.FAMILIES`` extended by them (EXTRA's entry wins where the builder has the family too: what
``test_verify_logits.py`` expects of a family, e.g. that PaddleFormers cannot read back its own safetensors
of it, was seen with these configs). Every checkpoint is still ``paddle.seed(s); Model(Config(**cfg))``
saved by the library's own ``save_pretrained``.

Not here, because PaddleFormers 1.2 cannot build them without paddlefleet (not on PyPI) or triton:
MiniMax-M2, Qwen3-VL-MoE, Qwen3.5 / Qwen3.5-MoE (their modeling modules import paddlefleet), Kimi-K2,
DeepSeek-V4 and GLM-MoE-DSA (only a fleet ``*Provider`` class: no ``from_config``), DeepSeek-V3.2
(``deepseek_v3_2_provider``), PaddleOCR-VL (triton). ERNIE 4.5 VL MoE was not tried (its MoE layer calls the
GPU-only kernel that stops ERNIE 4.5 MoE).

Sizes as the builder's: hidden 32, 1-2 layers, vocabulary 61; the vision towers of the vision-language
wrappers are one block of hidden 16. Facts seen while building them (PaddleFormers 1.2.0, paddle 3.3.1, CPU):

* Qwen2-MoE, Qwen3-MoE, GLM-4-MoE: the ``*Deprecated`` classes (the others need paddlefleet); GLM-4-MoE's
  modeling module subclasses ``GPTModelProvider.transform_rules``, so the placeholder ``gpt_provider``
  module needs that class attribute (:func:`_stub_gpt_provider`).
* Qwen3-VL: ``Qwen3VLForConditionalGeneration`` is the fleet class (imports paddlefleet); its non-fleet twin
  is ``Qwen3VLForConditionalGenerationDeprecated``.
* Qwen2.5-VL and GLM-4.5V (``glm4v_moe``): the default safetensors save writes names its own loader does not
  read back (Qwen2.5-VL: ``model.layers.*`` weights beside ``model.language_model.layers.*`` biases; GLM-4.5V
  with one kv head: ``k_proj.weight0``), so ``from_pretrained`` raises "... should be assigned before!";
  the legacy ``.pdparams`` save loads. GLM-4.5V with two kv heads does not save at all (an AOA split
  assertion), hence one kv head. Its partial rotary (0.5 of head_dim 16) needs ``mrope_section`` summing to 4.
* ERNIE 4.5 MoE builds and saves, but its forward needs the GPU-only kernel ``expand_modality_expert_id``.
* Every vision-language wrapper (Qwen2.5-VL, Qwen3-VL, GLM-4.5V, GLM-OCR) runs a forward on text-only
  input ids (no pixels) and gives logits ``[batch, seq, vocab]``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

if __name__ == "__main__":  # run as the builder script: tests/ on the path, as pytest has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import family_builder as fb  # noqa: E402

_C = dict(fb._COMMON)
_SPECIAL = {"image_token_id": 58, "video_token_id": 59}  # ids the logits batch must avoid (verify does)


def _vision(**kw) -> dict:
    return {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_heads": 2,
        "out_hidden_size": fb.HIDDEN,
        "patch_size": 2,
        "temporal_patch_size": 1,
        "spatial_merge_size": 1,
        **kw,
    }


_MOE = {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 24}
_GLM_MOE = {
    "n_routed_experts": 2,
    "n_shared_experts": 1,
    "num_experts_per_tok": 1,
    "moe_intermediate_size": 24,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
}


def _family(config: str, model: str, kwargs: dict, seed: int) -> dict:
    return {"config": config, "model": model, "kwargs": kwargs, "seed": seed, "dtype": "float32"}


EXTRA: dict[str, dict] = {
    "qwen2_moe": _family(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLMDeprecated",
        {
            **_C,
            "intermediate_size": 48,
            "num_hidden_layers": 1,
            **_MOE,
            "shared_expert_intermediate_size": 24,
        },
        2201,
    ),
    "qwen3_moe": _family(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLMDeprecated",
        {**_C, "intermediate_size": 48, "num_hidden_layers": 1, "head_dim": 16, **_MOE},
        2202,
    ),
    "qwen3_next": _family(
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {
            **_C,
            "intermediate_size": 48,
            "num_hidden_layers": 2,  # one linear-attention layer, one full-attention layer
            "full_attention_interval": 2,
            "head_dim": 16,
            **_MOE,
            "shared_expert_intermediate_size": 24,
            "linear_num_value_heads": 2,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
        },
        2203,
    ),
    "ernie4_5_moe": _family(
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        {
            **_C,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "moe_num_experts": 2,
            "moe_k": 1,
            "moe_intermediate_size": 24,
            "moe_layer_start_index": 1,
        },
        2204,
    ),
    "glm4_moe": _family(
        "Glm4MoeConfig",
        "Glm4MoeForCausalLMDeprecated",
        {**_C, "intermediate_size": 48, "num_hidden_layers": 2, "head_dim": 16, **_GLM_MOE},
        2205,
    ),
    "qwen2_5_vl": _family(
        "Qwen2_5_VLConfig",
        "Qwen2_5_VLForConditionalGeneration",
        {
            "text_config": {
                **_C,
                "intermediate_size": 48,
                "num_hidden_layers": 1,
                "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
            },
            "vision_config": _vision(fullatt_block_indexes=[0], window_size=4),
            **_SPECIAL,
            "vision_start_token_id": 57,
        },
        2206,
    ),
    "qwen3_vl": _family(
        "Qwen3VLConfig",
        "Qwen3VLForConditionalGenerationDeprecated",
        {
            "text_config": {
                **_C,
                "intermediate_size": 48,
                "num_hidden_layers": 1,
                "head_dim": 16,
                "rope_scaling": {
                    "rope_type": "default",
                    "mrope_section": [2, 3, 3],
                    "mrope_interleaved": True,
                },
            },
            "vision_config": _vision(deepstack_visual_indexes=[0], num_position_embeddings=16),
            **_SPECIAL,
            "vision_start_token_id": 57,
        },
        2207,
    ),
    "glm4v_moe": _family(
        "Glm4vMoeConfig",
        "Glm4vMoeForConditionalGeneration",
        {
            "text_config": {
                **_C,
                "intermediate_size": 48,
                "num_hidden_layers": 2,
                "head_dim": 16,
                "num_key_value_heads": 1,
                **_GLM_MOE,
                "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2]},
            },
            "vision_config": _vision(image_size=8),
            **_SPECIAL,
            "image_start_token_id": 57,
        },
        2208,
    ),
    "glm_ocr": _family(
        "GlmOcrConfig",
        "GlmOcrForConditionalGeneration",
        {
            "text_config": {
                **_C,
                "intermediate_size": 48,
                "num_hidden_layers": 1,
                "head_dim": 16,
                "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]},
            },
            "vision_config": _vision(image_size=8),
            **_SPECIAL,
            "image_start_token_id": 57,
        },
        2209,
    ),
}
FAMILIES = {**fb.FAMILIES, **EXTRA}  # EXTRA's configs win: the tests' expectations are about these


def _stub_gpt_provider() -> None:
    """The builder's placeholder ``gpt_provider``, with the ``transform_rules`` class attribute GLM-4-MoE's
    modeling module reads at import."""
    import importlib.util
    import types

    if importlib.util.find_spec("paddlefleet") is not None:
        return

    @dataclasses.dataclass
    class GPTModelProvider:
        transform_rules = {}  # noqa: RUF012 - a class attribute, as the real one has

    mod = types.ModuleType("paddleformers.transformers.gpt_provider")
    mod.__dict__["GPTModelProvider"] = GPTModelProvider
    sys.modules["paddleformers.transformers.gpt_provider"] = mod


def build_all(variants: list[fb.Variant], root: Path, timeout: float = 900):
    """:func:`support.family_builder.build_all` over :data:`FAMILIES` (this file runs the builder)."""
    script = fb.__file__
    fb.__file__ = __file__  # build_all runs ``python <fb.__file__> PLAN OUT``: this module's main
    try:
        return fb.build_all(variants, root, timeout)
    finally:
        fb.__file__ = script


if __name__ == "__main__":
    fb.FAMILIES.update(EXTRA)
    fb._stub_gpt_provider = _stub_gpt_provider
    sys.exit(fb._main(sys.argv[1], sys.argv[2]))
