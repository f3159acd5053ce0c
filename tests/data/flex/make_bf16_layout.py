"""A bf16 model's flex checkpoint with master weights, saved by the PaddleFormers 1.2 Trainer's save methods.

Run: ``python make_bf16_layout.py OUT`` (called by ``make_flex.py``). The CPU cannot train in bf16 (no bf16
``adamw`` kernel: "kernel `adamw` is not registered ... bfloat16"; AMP O2 on CPU is a no-op that leaves
fp32 weights and an empty ``master_weight/``), so no Trainer run writes master weights here. Instead:

1. ``LlamaForCausalLM`` (the config of ``make_trainer.py``) cast to bf16, ``paddle.optimizer.AdamW(
   multi_precision=True)``; one ``step()`` with bf16 gradients creates the accumulators and the fp32 master
   weights, then fails in the kernel (caught);
2. the accumulators (moments, beta pows) and the master weights get deterministic values (master = the
   bf16 weight in fp32 plus a small offset, as after training they differ in the low bits; moments
   ``rng / 64``), with ``paddle.assign``;
3. ``Trainer._save_flex_model_state(OUT/checkpoint-1)`` and ``Trainer._save_flex_optimizer_state(...)``, the
   two methods ``Trainer._save_checkpoint`` calls, write ``model_state/``, ``optimizer_state/`` and
   ``master_weight/`` (+ ``saved_signal_0``).

Then the load_state_dict oracles of the three folders (``oracle*.npz``/``.json``) in a fresh process.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_trainer as mt  # noqa: E402


def _fill(opt: object) -> None:
    """Deterministic values for every accumulator and master weight (paddle.assign, in place)."""
    import numpy as np
    import paddle

    rng = np.random.default_rng(7)
    for kind in sorted(opt._accumulators):  # type: ignore[attr-defined]
        for pname in sorted(opt._accumulators[kind]):  # type: ignore[attr-defined]
            acc = opt._accumulators[kind][pname]  # type: ignore[attr-defined]
            vals = (rng.integers(1, 64, size=acc.shape) / 64.0).astype(np.float32)
            paddle.assign(paddle.to_tensor(vals).astype(acc.dtype), acc)
    for pname in sorted(opt._master_weights):  # type: ignore[attr-defined]
        mw = opt._master_weights[pname]  # type: ignore[attr-defined]
        offset = (rng.integers(-4, 5, size=mw.shape) / 4096.0).astype(np.float32)
        paddle.assign(mw + paddle.to_tensor(offset), mw)


def build(out: Path) -> None:
    """Steps 1-3 of the module docstring."""
    mt._stub_datasets()
    import numpy as np
    import paddle
    from paddleformers.trainer import Trainer, TrainingArguments
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    paddle.set_device("cpu")
    paddle.seed(5)
    model = LlamaForCausalLM(LlamaConfig(**mt.CFG))
    model.to(dtype="bfloat16")
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), multi_precision=True)
    rng = np.random.default_rng(3)
    for p in model.parameters():
        g = paddle.to_tensor((rng.integers(-8, 8, size=p.shape) / 64).astype(np.float32)).astype("bfloat16")
        p._set_grad_ivar(g)
    try:
        opt.step()
    except RuntimeError as e:
        if "adamw" not in str(e):
            raise
    _fill(opt)
    args = TrainingArguments(output_dir=str(out), report_to="none", device="cpu", amp_master_grad=False)
    trainer = Trainer(model=model, args=args, optimizers=(opt, None))
    ck = out / "checkpoint-1"
    trainer._save_flex_model_state(str(ck))
    trainer._save_flex_optimizer_state(str(ck))


def oracles(out: Path) -> None:
    import make_flex

    ck = out / "checkpoint-1"
    for sub, stem in (
        ("model_state", "oracle"),
        ("optimizer_state", "oracle_optimizer"),
        ("master_weight", "oracle_master_weight"),
    ):
        make_flex.write_oracle(ck / sub, dest=out / stem)


def main() -> None:
    if sys.argv[1] == "--build":
        build(Path(sys.argv[2]))
    elif sys.argv[1] == "--oracle":
        oracles(Path(sys.argv[2]))
    else:
        # --no-oracle: make_flex.py makes every folder's oracles in one process
        make(Path(sys.argv[1]), oracle="--no-oracle" not in sys.argv[2:])


def make(out: Path, oracle: bool = True) -> None:
    """Write ``out`` (replacing it): :func:`build` in a fresh process, then (``oracle``) :func:`oracles` in
    another; both fork from ``support.preload`` servers (``make_flex``'s)."""
    import make_flex

    preload = make_flex.preload

    shutil.rmtree(out, ignore_errors=True)
    steps = (("--build", preload.PADDLEFORMERS), ("--oracle", make_flex.PADDLE))
    for step, libs in steps if oracle else steps[:1]:
        cmd = [sys.executable, __file__, step, str(out)]
        preload.run(cmd, libs=libs, env=make_flex.ENV, check=True, capture_output=True)


if __name__ == "__main__":
    main()
