"""Run the real PaddleFormers 1.2 Trainer for 2 steps on a tiny model of one family on CPU and keep its
flex checkpoint, the config the run started from and the trained model's logits (the merge oracle).

Run: ``python make_trainer_families.py FAMILY OUT`` (FAMILY one of :data:`FAMILIES`). Writes, as
``make_trainer.py`` does for Llama:

* ``OUT/config.json``: ``save_pretrained`` of the model before training (the run's model_name_or_path; the
  flex checkpoint has no config.json, and ``tietool merge`` takes it from the folder above checkpoint-N/);
* ``OUT/checkpoint-2/``: ``model_state/`` exactly as the Trainer's ``_save_checkpoint`` left it (the
  optimizer and master-weight folders, the rng/scheduler/args pickles are not kept: merge leaves them out
  and they would triple the size); ``trainer_state.json`` is not written by 1.2, so nothing else;
* ``OUT/input_ids.npy`` [2, 8] int64 and ``OUT/logits.npy`` [2, 8, vocab] fp32: the trained model's logits
  (``model.eval()``, no grad) on those ids: what a plain ``from_pretrained`` of the merged folder must give;
* ``OUT/state_dict_names.json``: the trained model's state-dict names and shapes (the Paddle layout).

The same data and arguments as ``make_trainer.py`` (fp32, AdamW, lr 1e-2, batch 4, seed 5).
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
import types
import typing
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOCAB = 250
_BASE = {
    "vocab_size": VOCAB,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
}
# family -> (config class, model class, config keys): the smallest model of the family the Trainer runs
FAMILIES: dict[str, tuple[str, str, dict]] = {
    # tied, head_dim given apart, one kv head (qkv_proj grouped per kv head), sliding + full attention
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            **_BASE,
            "intermediate_size": 32,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
            "tie_word_embeddings": True,
        },
    ),
    # untied, 4 routed experts + a shared expert with its gate, qkv bias
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLMDeprecated",
        {
            **_BASE,
            "intermediate_size": 32,
            "moe_intermediate_size": 8,
            "shared_expert_intermediate_size": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "tie_word_embeddings": False,
            "fuse_rms_norm": False,  # CPU has no fused_rms_norm_ext kernel
        },
    ),
    # untied, 4 routed experts (no shared expert), q/k norms, no qkv bias
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLMDeprecated",
        {
            **_BASE,
            "intermediate_size": 32,
            "moe_intermediate_size": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "head_dim": 8,
            "tie_word_embeddings": False,
            "fuse_rms_norm": False,
        },
    ),
    # untied, layer 0 dense (first_k_dense_replace), layer 1 MoE: 4 routed experts, a shared expert, a
    # router [experts, hidden] with its e_score_correction_bias; the Deprecated class (the fleet one needs
    # paddlefleet)
    "glm4_moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLMDeprecated",
        {
            **_BASE,
            "intermediate_size": 32,
            "moe_intermediate_size": 8,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "head_dim": 8,
            "tie_word_embeddings": False,
            "fuse_rms_norm": False,
        },
    ),
    # untied, layer 0 linear attention (gated delta net: in_proj_qkvz, in_proj_ba, conv1d, out_proj), layer
    # 1 gated full attention (q twice as wide: query | gate), both MoE with a shared expert and its gate
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {
            **_BASE,
            "num_attention_heads": 4,  # 2 kv heads: the fused qkv_proj has two groups to tell apart
            "num_key_value_heads": 2,
            "intermediate_size": 32,
            "moe_intermediate_size": 8,
            "shared_expert_intermediate_size": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "head_dim": 8,
            "linear_num_value_heads": 2,
            "linear_num_key_heads": 1,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "tie_word_embeddings": False,
            "fuse_rms_norm": False,
        },
    ),
    # untied, multi-head latent attention (q_a/q_b, kv_a_proj_with_mqa/kv_b, their norms), layer 0 dense,
    # layer 1 MoE (4 routed + 1 shared expert, unfused gate/up, router [hidden, experts] + correction
    # bias); its attention reads rope_parameters["factor"] (1.0: no scaling)
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            **_BASE,
            "num_key_value_heads": 2,
            "intermediate_size": 32,
            "moe_intermediate_size": 8,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "n_group": 1,  # the router's group-limited top-k divides by it (None fails)
            "topk_group": 1,
            "q_lora_rank": 8,
            "kv_lora_rank": 8,
            "qk_nope_head_dim": 4,
            "qk_rope_head_dim": 4,
            "v_head_dim": 6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "factor": 1.0},
            "tie_word_embeddings": False,
            "fuse_rms_norm": False,
        },
    ),
}


def _stubs() -> None:
    """Stand-ins that let PaddleFormers 1.2 import on this CPU venv (nothing they stand for runs):
    ``datasets`` (``make_trainer._stub_datasets``), without ``paddlefleet``
    ``paddleformers.transformers.gpt_provider`` (the Qwen2 family's modeling imports its dataclass
    ``GPTModelProvider``), without ``paddlefleet_ops`` that module (the MoE families import
    ``is_deep_ep_available`` for GPU expert dispatch); tests/data/tools/pf_logits.py does the same."""
    sys.path.insert(0, str(HERE))
    import make_trainer

    make_trainer._stub_datasets()
    if importlib.util.find_spec("paddlefleet") is None:
        mod = types.ModuleType("paddleformers.transformers.gpt_provider")

        @dataclasses.dataclass
        class GPTModelProvider:
            transform_rules: typing.ClassVar[dict] = {}  # GLM-4-MoE's provider extends it

        mod.GPTModelProvider = GPTModelProvider  # type: ignore[attr-defined]
        sys.modules["paddleformers.transformers.gpt_provider"] = mod
    if "paddlefleet_ops" not in sys.modules and importlib.util.find_spec("paddlefleet_ops") is None:
        # GPU expert dispatch, never run on CPU
        ops = types.ModuleType("paddlefleet_ops")
        ops.__spec__ = importlib.machinery.ModuleSpec("paddlefleet_ops", None)
        ops.is_deep_ep_available = lambda: False  # type: ignore[attr-defined]
        sys.modules["paddlefleet_ops"] = ops


def train(family: str, out: Path) -> None:
    """Two optimizer steps of the real Trainer; the trained model's logits and names written."""
    _stubs()
    import make_trainer
    import numpy as np
    import paddle
    import paddleformers.transformers as T
    from paddleformers.trainer import Trainer, TrainingArguments

    cfg_cls, model_cls, keys = FAMILIES[family]
    paddle.set_device("cpu")
    paddle.seed(5)
    model = getattr(T, model_cls)(getattr(T, cfg_cls)(**keys))
    model.save_pretrained(str(out / "base"))
    args = TrainingArguments(
        output_dir=str(out / "run"),
        max_steps=2,
        save_steps=2,
        save_strategy="steps",
        logging_steps=1,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        seed=5,
        save_checkpoint_format="flex_checkpoint",
        report_to="none",
        device="cpu",
        dataloader_num_workers=0,
        amp_master_grad=False,
    )

    def collate(rows: list[dict]) -> dict:
        return {k: paddle.to_tensor([r[k] for r in rows], dtype="int64") for k in ("input_ids", "labels")}

    Trainer(model=model, args=args, train_dataset=make_trainer._Data(), data_collator=collate).train()
    names = {k: list(v.shape) for k, v in model.state_dict().items()}
    (out / "state_dict_names.json").write_text(json.dumps(names, indent=1) + "\n")
    ids = np.array(make_trainer.IDS, dtype=np.int64)
    np.save(out / "input_ids.npy", ids)
    model.eval()
    with paddle.no_grad():
        res = model(input_ids=paddle.to_tensor(ids))
        logits = res[0] if isinstance(res, tuple) else res.logits
    np.save(out / "logits.npy", logits.astype("float32").numpy())


def keep(out: Path) -> None:
    """What the fixture keeps: config.json of the base, checkpoint-2/model_state, the oracles."""
    shutil.copy(out / "base" / "config.json", out / "config.json")
    ck = out / "checkpoint-2"
    ck.mkdir()
    shutil.copytree(out / "run" / "checkpoint-2" / "model_state", ck / "model_state")
    shutil.rmtree(out / "run")
    shutil.rmtree(out / "base")


def main() -> None:
    """``FAMILY OUT``: train in a subprocess (a fresh paddle), then keep what the fixture holds."""
    if sys.argv[1] == "--worker":
        train(sys.argv[2], Path(sys.argv[3]))
        return
    family, out = sys.argv[1], Path(sys.argv[2])
    if family not in FAMILIES:
        sys.exit(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    subprocess.run([sys.executable, __file__, "--worker", family, str(out)], check=True)
    keep(out)


if __name__ == "__main__":
    main()
