#!/usr/bin/env python3
"""Make tests/data/tp_ranks/: tiny real PaddleFormers checkpoints and their tensor-parallel rank files.

usage: python tests/data/tools/make_tp_ranks.py [OUT_DIR]     (default: tests/data/tp_ranks)

Needs paddle and paddleformers 1.2 (the tests do not: they read the committed output). For each variant a
tiny model is built by PaddleFormers 1.2 (random init, fixed seed) and saved by its own ``save_pretrained``
in the legacy ``.pdparams`` format (Paddle layout: Linear weights ``[in, out]``); that state dict is
``<variant>/original/model_state.pdparams``. Each ``<variant>/tp<N>/`` holds ``model_state.tp0R.pdparams``
for R < N (as PaddleNLP / PaddleFormers name unmerged rank files), written by ``paddle.save`` from slices
made by PaddleFormers' own ``split_or_merge_func(is_split=True, ...)`` with the arguments PaddleNLP's
``_get_tensor_parallel_mappings`` passes for that tensor (``SPLIT`` below: is_column, is_naive_2fuse,
is_naive_3fuse + num_kv_groups; tensors it does not list are copied whole to every rank). ``tp2pp2/`` also
splits the layers over two pipeline ranks (``model_state.tp0R_pp0P.pdparams``, the single model's names,
as PaddleNLP's ``PipelinePretrainedModel.state_dict`` saves them).

Variants (vocab 48, hidden 16, intermediate 24, 2 layers, untied):

* ``llama_fp32`` / ``llama_bf16``: PaddleFormers ``LlamaForCausalLM``, GQA (4 heads, 2 kv heads): separate
  q/k/v and gate/up; at tp 4, k/v are not split (PaddleNLP Llama: kv_heads % tp != 0).
* ``llama_fused_fp32``: the same model (4 heads, 4 kv heads) renamed to PaddleNLP's ``llama.`` names with
  q/k/v fused into ``qkv_proj`` and gate/up into ``gate_up_fused_proj`` by PaddleFormers'
  ``fuse_param_func`` (``fuse_attention_qkv`` / ``fuse_attention_ffn``), head ``[hidden, vocab]`` (PaddleNLP's
  Linear head); qkv split as a plain column, gate-up by ``is_naive_2fuse``.
* ``qwen2_fused_fp32``: PaddleFormers ``Qwen2ForCausalLMDeprecated`` (8 heads, 4 kv heads): ``qkv_proj``
  weight and bias (grouped per kv head) split as a plain column, ``up_gate_proj`` by ``is_naive_2fuse``.
* ``qwen2_bf16``: that Qwen2 model in bf16 with qkv and up-gate split back into q/k/v (with biases) and
  gate/up by PaddleFormers' ``split_param_func`` (PaddleNLP Qwen2's unfused layout).
* ``phi3_fp32``: PaddleFormers ``Phi3ForCausalLM`` (4 heads, 2 kv heads): ``qkv_proj`` ``[q, k, v]`` split by
  ``is_naive_3fuse`` with ``num_kv_groups`` 2, ``gate_up_proj`` by ``is_naive_2fuse``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import types
from functools import partial
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Qwen2ForCausalLM needs paddlefleet (not on PyPI); the Deprecated class needs only this placeholder
_mod = types.ModuleType("paddleformers.transformers.gpt_provider")


@dataclasses.dataclass
class GPTModelProvider:
    pass


_mod.GPTModelProvider = GPTModelProvider  # type: ignore[attr-defined]
sys.modules["paddleformers.transformers.gpt_provider"] = _mod

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddleformers.transformers as T  # noqa: E402
from paddleformers.transformers.conversion_utils import (  # noqa: E402
    fuse_param_func,
    split_or_merge_func,
    split_param_func,
)

SIZES = dict(
    vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2, tie_word_embeddings=False
)


def split_args(name: str, cfg: dict, tp: int, head_rows: bool) -> dict | None:
    """The keyword arguments PaddleNLP's ``_get_tensor_parallel_mappings`` gives ``fn`` for ``name``
    (None: not in the mapping, copied whole to every rank)."""
    kv_split = cfg["num_key_value_heads"] % tp == 0
    fused3 = cfg.get("model_type") == "phi3"
    table = {
        "embed_tokens.weight": dict(is_column=False),
        "lm_head.weight": dict(is_column=not head_rows),
        "self_attn.q_proj.weight": dict(is_column=True),
        "self_attn.q_proj.bias": dict(is_column=True),
        "self_attn.k_proj.weight": dict(is_column=True) if kv_split else None,
        "self_attn.v_proj.weight": dict(is_column=True) if kv_split else None,
        "self_attn.k_proj.bias": dict(is_column=True) if kv_split else None,
        "self_attn.v_proj.bias": dict(is_column=True) if kv_split else None,
        "self_attn.qkv_proj.weight": dict(
            is_column=True,
            **(
                dict(
                    is_naive_3fuse=True,
                    num_kv_groups=cfg["num_attention_heads"] // cfg["num_key_value_heads"],
                )
                if fused3
                else {}
            ),
        ),
        "self_attn.qkv_proj.bias": dict(is_column=True),
        "self_attn.o_proj.weight": dict(is_column=False),
        "mlp.gate_proj.weight": dict(is_column=True),
        "mlp.up_proj.weight": dict(is_column=True),
        "mlp.gate_up_fused_proj.weight": dict(is_column=True, is_naive_2fuse=True),
        "mlp.up_gate_proj.weight": dict(is_column=True, is_naive_2fuse=True),
        "mlp.gate_up_proj.weight": dict(is_column=True, is_naive_2fuse=True),
        "mlp.down_proj.weight": dict(is_column=False),
    }
    for suffix, args in table.items():
        if name == suffix or name.endswith("." + suffix):
            return args
    return None


def split_state(sd: dict, cfg: dict, tp: int, head_rows: bool) -> list[dict]:
    """``tp`` rank state dicts of ``sd`` (numpy arrays), each tensor cut by PaddleFormers' split func."""
    fn = split_or_merge_func(is_split=True, tensor_model_parallel_size=tp, tensor_parallel_rank=None)
    ranks: list[dict] = [{} for _ in range(tp)]
    for name, arr in sd.items():
        args = split_args(name, cfg, tp, head_rows)
        pieces = [arr] * tp if args is None else partial(fn, **args)(arr)
        assert len(pieces) == tp, name
        for r in range(tp):
            ranks[r][name] = np.ascontiguousarray(pieces[r])
    return ranks


def numpy_state(model) -> dict:
    """The model's state dict as numpy arrays in save order (bf16 as its uint16 bits, as paddle.save)."""
    out = {}
    for k, v in model.state_dict().items():
        a = v.numpy()
        assert (v.dtype == paddle.bfloat16) == (a.dtype == np.uint16), (k, v.dtype, a.dtype)
        out[k] = a
    return out


def save(sd: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    paddle.save(sd, str(path))


def write_variant(root: Path, name: str, sd: dict, cfg: dict, head_rows: bool) -> None:
    """original/ (the unsplit state dict), tp2/, tp4/ and tp2pp2/ for one variant."""
    d = root / name
    shutil.rmtree(d, ignore_errors=True)
    save(sd, d / "original" / "model_state.pdparams")
    (d / "original" / "config.json").write_text(json.dumps(cfg, indent=2))
    for tp in (2, 4):
        for r, rank in enumerate(split_state(sd, cfg, tp, head_rows)):
            save(rank, d / f"tp{tp}" / f"model_state.tp{r:02d}.pdparams")
        rank_cfg = dict(cfg, tensor_parallel_degree=tp) if tp == 4 else cfg
        (d / f"tp{tp}" / "config.json").write_text(json.dumps(rank_cfg, indent=2))
    for r, rank in enumerate(split_state(sd, cfg, 2, head_rows)):
        stage0 = {k: v for k, v in rank.items() if "embed_tokens" in k or ".layers.0." in k}
        stage1 = {k: v for k, v in rank.items() if k not in stage0}
        save(stage0, d / "tp2pp2" / f"model_state.tp{r:02d}_pp00.pdparams")
        save(stage1, d / "tp2pp2" / f"model_state.tp{r:02d}_pp01.pdparams")
    (d / "tp2pp2" / "config.json").write_text(json.dumps(cfg, indent=2))


def pf_model(cls_name: str, cfg_name: str, dtype: str = "float32", **kw):
    """A PaddleFormers model saved by its own save_pretrained (legacy .pdparams), and its config."""
    paddle.seed(1234)
    config = getattr(T, cfg_name)(**SIZES, **kw)
    model = getattr(T, cls_name)(config)
    if dtype != "float32":  # built in float32 (the Config's dtype does not reach the parameters), then cast
        model = model.to(dtype=dtype)
        model.config.dtype = dtype
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, save_checkpoint_format="legacy", save_to_hf=False)
        cfg = json.loads(Path(tmp, "config.json").read_text())
    return model, cfg


def to_paddlenlp_fused(sd: dict, cfg: dict) -> dict:
    """PaddleFormers Llama names → PaddleNLP's ``llama.`` names, q/k/v and gate/up fused by PaddleFormers'
    ``fuse_param_func`` (PaddleNLP's fuse_attention_qkv / fuse_attention_ffn layout), head [hidden, vocab]."""
    fuse = fuse_param_func()
    out = {}
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for k, v in sd.items():
        name = "llama." + k[len("model.") :] if k.startswith("model.") else k
        if name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            continue
        if name.endswith("q_proj.weight"):
            p = k[: -len("q_proj.weight")]
            qkv = [sd[p + x + "_proj.weight"] for x in "qkv"]
            out[name.replace("q_proj", "qkv_proj")] = fuse(
                qkv, is_qkv=True, num_heads=heads, num_key_value_heads=kv
            )
        elif name.endswith("gate_proj.weight"):
            p = k[: -len("gate_proj.weight")]
            out[name.replace("gate_proj", "gate_up_fused_proj")] = fuse(
                [sd[p + "gate_proj.weight"], sd[p + "up_proj.weight"]]
            )
        elif name == "lm_head.weight":
            out[name] = np.ascontiguousarray(v.T)
        else:
            out[name] = v
    return out


def to_unfused(sd: dict, cfg: dict) -> dict:
    """PaddleFormers Qwen2's fused qkv_proj / up_gate_proj split by PaddleFormers' ``split_param_func``."""
    split = split_param_func()
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = {}
    for k, v in sd.items():
        if "qkv_proj" in k:
            q, kk, vv = split(v, split_nums=3, is_qkv=True, num_heads=heads, num_key_value_heads=kv)
            for part, a in zip("qkv", (q, kk, vv), strict=True):
                out[k.replace("qkv_proj", f"{part}_proj")] = np.ascontiguousarray(a)
        elif "up_gate_proj" in k:
            gate, up = split(v, split_nums=2)
            out[k.replace("up_gate_proj", "gate_proj")] = np.ascontiguousarray(gate)
            out[k.replace("up_gate_proj", "up_proj")] = np.ascontiguousarray(up)
        else:
            out[k] = v
    return out


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "tp_ranks"
    paddle.set_device("cpu")
    gqa = dict(num_attention_heads=4, num_key_value_heads=2)
    m, cfg = pf_model("LlamaForCausalLM", "LlamaConfig", **gqa)
    write_variant(root, "llama_fp32", numpy_state(m), cfg, head_rows=True)
    m, cfg = pf_model("LlamaForCausalLM", "LlamaConfig", "bfloat16", **gqa)
    write_variant(root, "llama_bf16", numpy_state(m), cfg, head_rows=True)
    m, cfg = pf_model("LlamaForCausalLM", "LlamaConfig", num_attention_heads=4, num_key_value_heads=4)
    fused_cfg = dict(cfg, fuse_attention_qkv=True, fuse_attention_ffn=True)
    write_variant(
        root, "llama_fused_fp32", to_paddlenlp_fused(numpy_state(m), cfg), fused_cfg, head_rows=False
    )
    qwen = dict(num_attention_heads=8, num_key_value_heads=4)
    m, cfg = pf_model("Qwen2ForCausalLMDeprecated", "Qwen2Config", **qwen)
    write_variant(root, "qwen2_fused_fp32", numpy_state(m), cfg, head_rows=True)
    m, cfg = pf_model("Qwen2ForCausalLMDeprecated", "Qwen2Config", "bfloat16", **qwen)
    write_variant(root, "qwen2_bf16", to_unfused(numpy_state(m), cfg), cfg, head_rows=True)
    m, cfg = pf_model("Phi3ForCausalLM", "Phi3Config", **gqa)
    write_variant(root, "phi3_fp32", numpy_state(m), cfg, head_rows=True)
    print(f"wrote {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
