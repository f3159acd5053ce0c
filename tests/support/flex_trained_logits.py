#!/usr/bin/env python3
"""Logits of the model a PaddleFormers 1.2 Trainer flex checkpoint holds, as the run trained it.

usage: python flex_trained_logits.py MODEL_STATE_DIR CONFIG_JSON MODEL_CLASS INPUT_IDS.npy OUT.npy

Builds ``MODEL_CLASS`` from ``CONFIG_JSON`` (the caller sets ``tie_word_embeddings`` as the run trained: an
untied head is a parameter of its own), reads the flex folder with ``paddle.distributed.load_state_dict``
(the Trainer's own resume path; every tensor in the in-memory layout it was saved in, Linear ``[in, out]``)
and sets the model's parameters from it: by name, or, where the model fuses what the folder holds apart
(Qwen3's ``qkv_proj`` from q/k/v, ``up_gate_proj`` from gate/up), fused as the model's own forward splits them
(``qkv`` per kv head ``[q × groups, k, v]``, ``chunk(2)`` gives ``[gate, up]``). Writes its logits on the ids
(float32). The oracle of a merge's output: that output loaded
with a plain ``from_pretrained`` must give these logits. Prints one JSON line
``{"ok": bool, "error": str|None, "missing": [state dict keys the folder lacks], "shape": [...]}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from pathlib import Path


def main() -> int:
    state_dir, config_json, cls_name, ids_path, out_path = sys.argv[1:6]
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import family_builder

    family_builder._stub_gpt_provider()
    import numpy as np
    import paddle
    import paddleformers.transformers as T

    paddle.set_device("cpu")
    logging.disable(logging.WARNING)
    res: dict = {"ok": False, "error": None, "missing": []}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            cfg = T.AutoConfig.from_pretrained(str(Path(config_json).parent))
            cfg.fuse_rms_norm = False
            model = getattr(T, cls_name)(cfg)
            model.eval()
            sd = model.state_dict()
            flex = _targets(paddle, cfg, sd)
            paddle.distributed.load_state_dict(flex, state_dir)
        res["missing"] = [k for k, v in flex.items() if not v.numpy().any()]
        for k, v in sd.items():
            v.set_value(_value(paddle, cfg, k, flex))
        ids = paddle.to_tensor(np.load(ids_path), dtype="int64")
        with paddle.no_grad():
            out = model(input_ids=ids)
        lg = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
        arr = lg.astype("float32").numpy()
        np.save(out_path, arr)
        res.update(ok=True, shape=list(arr.shape))
    except Exception as e:  # noqa: BLE001 - reported as the JSON line
        res["error"] = f"{type(e).__name__}: {str(e)[:400]}"
    print(json.dumps(res))
    return 0 if res["ok"] else 1


_QKV, _UPGATE = "self_attn.qkv_proj.weight", "mlp.up_gate_proj.weight"


def _targets(paddle, cfg, sd: dict) -> dict:
    """Zeros of the shapes the flex folder holds: each model tensor by its name, a fused one as its parts."""
    out = {}
    for k, v in sd.items():
        shape = list(v.shape)
        if k.endswith(_QKV):
            pre, kv, d = k[: -len(_QKV)], cfg.num_key_value_heads, cfg.head_dim
            q = shape[1] - 2 * kv * d
            parts = {"q_proj": q, "k_proj": kv * d, "v_proj": kv * d}
            out.update(
                {f"{pre}self_attn.{p}.weight": paddle.zeros([shape[0], n], v.dtype) for p, n in parts.items()}
            )
        elif k.endswith(_UPGATE):
            pre = k[: -len(_UPGATE)]
            for p in ("gate_proj", "up_proj"):
                out[f"{pre}mlp.{p}.weight"] = paddle.zeros([shape[0], shape[1] // 2], v.dtype)
        else:
            out[k] = paddle.zeros(shape, v.dtype)
    return out


def _value(paddle, cfg, k: str, flex: dict):
    """The model tensor ``k`` from the flex tensors (fused as the model's forward splits it)."""
    if k.endswith(_QKV):
        pre, kv, d = k[: -len(_QKV)], cfg.num_key_value_heads, cfg.head_dim
        q, kk, v = (flex[f"{pre}self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj"))
        h = q.shape[0]
        per = [q.reshape([h, kv, -1]), kk.reshape([h, kv, d]), v.reshape([h, kv, d])]
        return paddle.concat(per, axis=-1).reshape([h, -1])
    if k.endswith(_UPGATE):
        pre = k[: -len(_UPGATE)]
        return paddle.concat([flex[f"{pre}mlp.gate_proj.weight"], flex[f"{pre}mlp.up_proj.weight"]], axis=-1)
    return flex[k]


if __name__ == "__main__":
    sys.exit(main())
