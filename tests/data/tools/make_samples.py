#!/usr/bin/env python3
"""Make the rank-file and Trainer samples of ``sample_checkpoints/`` with the libraries' own code.

usage: python tests/data/tools/make_samples.py [OUT_DIR]     (default: sample_checkpoints)

Needs paddle 3.3.1 and paddleformers 1.2 (``/work/main/.venv``; the tests do not: they read the committed
output). Deterministic: fixed seeds, and the Trainer run uses a relative output path, so two runs give the
same bytes. Writes three folders (each replaced whole), reusing the generators of the test data:

* ``pf_llama_tp2/``: the tensor-parallel rank files ``model_state.tp00.pdparams`` / ``tp01`` and
  ``config.json`` of a tiny PaddleFormers ``LlamaForCausalLM`` (vocab 48, hidden 16, 2 layers, 4 heads,
  2 kv heads, untied), built and cut exactly as ``make_tp_ranks.py`` does for
  ``tests/data/tp_ranks/llama_fp32/tp2`` (PaddleFormers' ``split_or_merge_func(is_split=True)``, saved by
  ``paddle.save``).
* ``pf_qwen3_moe_ep2/``: the expert-parallel rank files ``model_state.moe_sharding00.pdparams`` / ``01``
  and ``config.json`` of the tiny PaddleFormers Qwen3-MoE of 4 experts that ``tests/support/moe_builder.py``
  builds and saves with ``save_pretrained``; its state dict is cut as
  ``tests/oracles/test_merge_experts.py``'s ``cut`` does (rank r holds experts 2r, 2r+1 of every MoE layer,
  numbered globally; every other tensor on both ranks), each rank saved by ``paddle.save``.
* ``pf_llama_trainer/``: ``checkpoint-2/`` as the real PaddleFormers 1.2 ``Trainer`` leaves it after 2
  steps on CPU (``tests/data/flex/make_trainer.py``: flex ``model_state/``, ``optimizer_state/``,
  ``master_weight/``, rng, scheduler, tokenizer), plus ``config.json`` copied from ``base/`` as the
  README's recipe says (the flex save has none); and ``base/``, the model the run started from as
  ``save_pretrained`` wrote it (``saved_signal_0`` removed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path[:0] = [str(HERE), str(REPO / "tests" / "support"), str(REPO / "tests" / "data" / "flex")]


def tp_sample(out: Path) -> None:
    """``out/pf_llama_tp2``: make_tp_ranks' llama_fp32 model cut into 2 tensor-parallel ranks."""
    import make_tp_ranks as mtr

    d = out / "pf_llama_tp2"
    shutil.rmtree(d, ignore_errors=True)
    model, cfg = mtr.pf_model("LlamaForCausalLM", "LlamaConfig", num_attention_heads=4, num_key_value_heads=2)
    for r, rank in enumerate(mtr.split_state(mtr.numpy_state(model), cfg, 2, head_rows=True)):
        mtr.save(rank, d / f"model_state.tp{r:02d}.pdparams")
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def ep_sample(out: Path, tmp: Path) -> None:
    """``out/pf_qwen3_moe_ep2``: moe_builder's Qwen3-MoE (4 experts) cut into 2 expert-parallel ranks."""
    import moe_builder
    import numpy as np
    import paddle

    src = moe_builder.build(tmp / "moe")["qwen3_moe"]
    sd = {k: v.numpy() for k, v in paddle.load(str(src / "model_state.pdparams"), return_numpy=False).items()}
    d = out / "pf_qwen3_moe_ep2"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    shutil.copy(src / "config.json", d / "config.json")
    marker = ".mlp.experts."
    for r in range(2):
        own = {}
        for name, a in sd.items():
            if marker in name:
                expert = int(name.split(marker, 1)[1].split(".", 1)[0])
                if expert // 2 != r:
                    continue
            own[name] = np.ascontiguousarray(a)
        paddle.save(own, str(d / f"model_state.moe_sharding{r:02d}.pdparams"))


def trainer_sample(out: Path, tmp: Path) -> None:
    """``out/pf_llama_trainer``: make_trainer.py's 1-rank run (relative output path: deterministic bytes)."""
    subprocess.run(
        [sys.executable, str(REPO / "tests/data/flex/make_trainer.py"), "run", "1"], cwd=tmp, check=True
    )
    run = tmp / "run"
    d = out / "pf_llama_trainer"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    shutil.copytree(run / "checkpoint-2", d / "checkpoint-2")
    shutil.copytree(run / "base", d / "base")
    (d / "base" / "saved_signal_0").unlink(missing_ok=True)
    shutil.copy(run / "base" / "config.json", d / "checkpoint-2" / "config.json")


def main() -> int:
    out = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO / "sample_checkpoints"
    import paddle

    paddle.set_device("cpu")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        tp_sample(out)
        ep_sample(out, tmp)
        trainer_sample(out, tmp)
    print(f"wrote {out}/pf_llama_tp2, pf_qwen3_moe_ep2, pf_llama_trainer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
