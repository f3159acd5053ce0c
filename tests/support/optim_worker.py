"""Real optimizer state written by Paddle, and Paddle resuming from it
(``tests/oracles/test_training_state.py``).

``python optim_worker.py build OUT``: a tiny PaddleFormers 1.2 Llama (fp32, untied head in ``[vocab,
hidden]``), AdamW with a cosine learning-rate schedule, one training step; the model saved with the legacy
save (``model_state.pdparams`` with ``StructuredToParameterName@@``) and the optimizer with
``paddle.save(optimizer.state_dict(), "optimizer.pdopt")``, as the Trainer saves a checkpoint (``fp32/``).
Also ``tied/`` (``tie_word_embeddings=True``; the saved duplicate head maps to the embedding's parameter)
and ``bf16/``: the same model in bfloat16 with ``multi_precision`` AdamW, its accumulators and fp32 master
weights created (``_create_accumulators``: CPU has no bf16 matmul to train a step), saved the same way.

``python optim_worker.py resume JOBS.json RESULTS.json``: for each ``[folder, bf16]``, the model loaded with
``from_pretrained`` (legacy), AdamW of the same schedule, ``set_state_dict(paddle.load(optimizer.pdopt))``
and one more step on ids that include the new rows; the result (ok, error, accumulator shapes, loss).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

VOCAB = 61
IDS = [[1, 2, 3, 4, 5, 60]]  # on resume the last id is the model's last row (a new one when grown)


def run(*args: str, timeout: float = 600) -> None:
    """Run this script in a subprocess (CPU, no GPU) with ``args``; raises with its stderr on failure."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    from support import preload  # the parent side only: this file also runs as a script

    cp = preload.run(
        [sys.executable, __file__, *args],
        libs=preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if cp.returncode != 0:
        raise RuntimeError(f"optim_worker {args[0]} failed (exit {cp.returncode}):\n{cp.stderr[-3000:]}")


def _model(dtype: str = "float32", tied: bool = False):
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tied, fuse_rms_norm=False,
    )  # fmt: skip
    m = LlamaForCausalLM(cfg)
    if dtype != "float32":
        m.to(dtype=dtype)
    return m


def _optimizer(model, multi_precision: bool = False):
    import paddle

    sched = paddle.optimizer.lr.CosineAnnealingDecay(1e-3, T_max=10)
    return paddle.optimizer.AdamW(
        learning_rate=sched, parameters=model.parameters(), multi_precision=multi_precision
    ), sched


def _step(model, opt, sched, ids) -> float:
    import paddle

    x = paddle.to_tensor(ids)
    out = model(input_ids=x, labels=x)
    loss = out[0] if isinstance(out, (tuple, list)) else out.loss
    loss.backward()
    opt.step()
    opt.clear_grad()
    sched.step()
    return float(loss)


def _build(root: Path) -> None:
    import paddle

    paddle.seed(21)
    model = _model()
    opt, sched = _optimizer(model)
    _step(model, opt, sched, [IDS[0][:5]])
    kw = {"save_checkpoint_format": "legacy", "save_to_hf": False, "safe_serialization": False}
    model.save_pretrained(str(root / "fp32"), **kw)
    paddle.save(opt.state_dict(), str(root / "fp32" / "optimizer.pdopt"))
    paddle.seed(21)
    with paddle.utils.unique_name.guard():
        _build_bf16(root, kw)
    paddle.seed(21)
    with paddle.utils.unique_name.guard():  # tied: the saved duplicate head maps to the embedding's parameter
        model = _model(tied=True)
        opt, sched = _optimizer(model)
        _step(model, opt, sched, [IDS[0][:5]])
        model.save_pretrained(str(root / "tied"), **kw)
        paddle.save(opt.state_dict(), str(root / "tied" / "optimizer.pdopt"))


def _build_bf16(root: Path, kw: dict) -> None:
    import paddle

    model = _model("bfloat16")
    opt, sched = _optimizer(model, multi_precision=True)
    opt._create_accumulators(paddle.static.default_main_program().global_block(), model.parameters())
    model.save_pretrained(str(root / "bf16"), **kw)
    paddle.save(opt.state_dict(), str(root / "bf16" / "optimizer.pdopt"))


def _resume(folder: Path, bf16: bool) -> dict:
    """Paddle's resume from ``folder``; ``bf16``: the model in bfloat16 with multi_precision AdamW, whose
    state is loaded and checked (master weights too) but no step is run (CPU has no bf16 matmul)."""
    import paddle
    from paddleformers.transformers import LlamaForCausalLM

    kw = {"dtype": "bfloat16"} if bf16 else {}
    model = LlamaForCausalLM.from_pretrained(
        str(folder), load_checkpoint_format="legacy", convert_from_hf=False, **kw
    )
    model.train()
    opt, sched = _optimizer(model, multi_precision=bf16)
    opt._create_accumulators(paddle.static.default_main_program().global_block(), model.parameters())
    opt.set_state_dict(paddle.load(str(folder / "optimizer.pdopt")))
    shapes = {}
    for acc, per in opt._accumulators.items():
        for pname, var in per.items():
            shapes[f"{pname}:{acc}"] = list(var.shape)
    params = {p.name: list(p.shape) for p in model.parameters()}
    master = {k: list(v.shape) for k, v in getattr(opt, "_master_weights", {}).items()}
    bad = [
        k
        for k, s in shapes.items()
        if "moment" in k and s != params[k.split(":")[0].split("_fp32_master")[0]]
    ]
    bad += [k for k, s in master.items() if s != params[k]]
    if bf16:
        error = f"not shaped as their parameters: {bad}" if bad else None if master else "no master weights"
        return {"ok": error is None, "error": error, "shapes": shapes, "params": params, "master": master}
    loss = _step(model, opt, sched, [IDS[0][:-1] + [model.config.vocab_size - 1]])  # the last row too
    return {"ok": not bad, "error": f"accumulators not shaped as their parameters: {bad}" if bad else None,
            "loss": loss, "shapes": shapes, "params": params}  # fmt: skip


def _main(argv: list[str]) -> int:
    import paddle

    paddle.set_device("cpu")
    logging.disable(logging.WARNING)
    if argv[0] == "build":
        with contextlib.redirect_stdout(io.StringIO()):
            _build(Path(argv[1]))
        return 0
    jobs, results = json.loads(Path(argv[1]).read_text()), {}
    for folder, bf16 in jobs:
        try:
            # a fresh name space: each model's parameters named as in a new process (embedding_0.w_0, ...)
            with contextlib.redirect_stdout(io.StringIO()), paddle.utils.unique_name.guard():
                results[folder] = _resume(Path(folder), bf16)
        except Exception as e:  # noqa: BLE001  (reported per folder; the test says what failed)
            results[folder] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
    Path(argv[2]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
