"""The real PaddleFormers 1.2 Trainer resuming from a flex checkpoint: the oracle that an output resumes.

``resume(runs)`` runs every :class:`ResumeRun` in ONE subprocess (1 rank, CPU): the model
``from_pretrained(model_dir)`` (then ``resize_token_embeddings(vocab_size)`` when given), the
``TrainingArguments`` of ``tests/data/flex/make_trainer.py`` with ``max_steps`` = the checkpoint's
global_step + ``steps`` and ``load_checkpoint_format="flex_checkpoint"``, and
``trainer.train(resume_from_checkpoint=checkpoint)``. A callback captures, at ``on_train_begin`` (after
``Trainer._load_flex_checkpoint``, before the first new step), the state the Trainer LOADED:
``model.state_dict()`` and ``optimizer.sharded_state_dict(model.sharded_state_dict())`` (the flex names
``<name>.moment1_0`` ... and ``<name>.w_0``), as numpy (bf16 as its uint16 bits); ``on_log`` the losses.

The checkpoint is copied to a temporary folder first (the Trainer writes ``checkpoint-<max_steps>``
beside it and may rotate old ones). Run by hand: ``python trainer_resume.py --worker JOBS.json OUT``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

FLEX = Path(__file__).resolve().parents[1] / "data" / "flex"


@dataclasses.dataclass(frozen=True)
class ResumeRun:
    """One resume: ``checkpoint`` (a Trainer ``checkpoint-N/``), the model folder, the new vocab or None."""

    checkpoint: Path
    model_dir: Path
    vocab_size: int | None = None
    steps: int = 1


@dataclasses.dataclass
class ResumeResult:
    """What one resume did: ``ok``, else ``error`` (the exception's last line); the LOADED state (name ->
    numpy: ``model`` from ``model.state_dict()``, ``optimizer`` under flex names, masters ``<name>.w_0``
    included), and the ``losses`` of the new steps."""

    ok: bool
    error: str
    model: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    losses: list[float]


def resume(runs: list[ResumeRun], ranks: int = 1, timeout: float = 900) -> list[ResumeResult]:
    """Run ``runs`` in one subprocess of this file (``ranks`` = 2: two plain gloo processes, as
    ``make_trainer.py``; data parallel + sharding stage 1 v1); one :class:`ResumeResult` per run, in order.
    With 2 ranks the optimizer state is the union of both ranks' (each holds its own parameters').

    Raises RuntimeError (with the worker's stderr tail) when the worker itself dies; a failing resume is a
    result with ``ok=False``, not an exception."""
    with tempfile.TemporaryDirectory(prefix="tt_resume_") as tmp:
        jobs = []
        for i, r in enumerate(runs):
            # copies: the Trainer writes beside the checkpoint, and from_pretrained under fleet writes
            # flex-ckpt.auto_generated.metadata into the model folder
            ck, model_dir = Path(tmp) / f"run{i}" / r.checkpoint.name, Path(tmp) / f"model{i}"
            shutil.copytree(r.checkpoint, ck)
            shutil.copytree(r.model_dir, model_dir)
            jobs.append({**dataclasses.asdict(r), "checkpoint": str(ck), "model_dir": str(model_dir)})
        (Path(tmp) / "jobs.json").write_text(json.dumps(jobs))
        cmd = [sys.executable, __file__, "--worker", str(Path(tmp) / "jobs.json"), tmp]
        if ranks == 1:
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
            from support import preload  # the parent side only: this file also runs as a script

            cp = preload.run(
                cmd,
                libs=preload.PADDLEFORMERS,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            if cp.returncode != 0:
                raise RuntimeError(
                    f"trainer_resume worker failed (exit {cp.returncode}):\n{cp.stderr[-3000:]}"
                )
        else:
            sys.path.insert(0, str(FLEX))
            import make_flex

            try:
                make_flex.run_ranks_cmd(cmd, ranks, libs=make_flex.preload.PADDLEFORMERS)
            except SystemExit as e:
                raise RuntimeError(str(e)) from None
        return [_read_result(Path(tmp) / f"r{i}", ranks) for i in range(len(runs))]


def grow_checkpoint(checkpoint: Path, base: Path, out: Path, vocab: int) -> tuple[Path, Path]:
    """A checkpoint and a model grown to ``vocab`` rows BY PADDLE ITSELF (a subprocess of this file).

    ``out/<checkpoint.name>/``: each of model_state/, optimizer_state/, master_weight/ filled by
    ``paddle.distributed.load_state_dict`` into full-size zeros, every tensor whose dim 0 is the old vocab
    (the model's ``[vocab, hidden]`` embedding and head, their ``.moment1_0``/``.moment2_0``, their
    ``.w_0``) grown to ``vocab`` rows (new weight rows = the mean row, new moment rows zero), and written
    back with ``paddle.distributed.save_state_dict`` (one process: one whole slice per tensor); the side
    files copied. ``out/model/``: ``base`` with those grown weights at ``vocab_size=vocab``
    (``save_pretrained``). Returns ``(checkpoint, model_dir)``."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, __file__, "--grow", str(checkpoint), str(base), str(out), str(vocab)]
    from support import preload  # the parent side only: this file also runs as a script

    cp = preload.run(
        cmd,
        libs=preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if cp.returncode != 0:
        raise RuntimeError(f"trainer_resume --grow failed (exit {cp.returncode}):\n{cp.stderr[-3000:]}")
    return out / checkpoint.name, out / "model"


def _read_result(stem: Path, ranks: int) -> ResumeResult:
    """Rank 0's result; the optimizer state is the union over the ranks (checked equal where shared)."""
    meta = json.loads(Path(f"{stem}_rank0.json").read_text())
    arrays: dict[str, dict[str, np.ndarray]] = {"model": {}, "optimizer": {}}
    for rank in range(ranks):
        for part in arrays:
            f = Path(f"{stem}_rank{rank}_{part}.npz")
            if not f.exists():
                continue
            with np.load(f) as z:
                for k in z.files:
                    if k in arrays[part] and not np.array_equal(arrays[part][k], z[k]):
                        raise RuntimeError(f"{k} differs between ranks")
                    arrays[part][k] = z[k]
    return ResumeResult(meta["ok"], meta["error"], arrays["model"], arrays["optimizer"], meta["losses"])


# ----- the worker (runs in the subprocess; imports paddle) -----


def _numpy(t: object) -> np.ndarray:
    """A paddle tensor as numpy; bf16 as its uint16 bits."""
    import paddle

    assert isinstance(t, paddle.Tensor)
    if t.dtype == paddle.bfloat16:
        return t.view(paddle.uint16).numpy() if hasattr(t, "view") else t.numpy()
    return t.numpy()


def _capture_callback(store: dict) -> object:
    """A TrainerCallback that saves the loaded state at train begin and the losses of each log."""
    from paddleformers.trainer import TrainerCallback

    class Capture(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):  # type: ignore[no-untyped-def]
            store["model"] = {k: _numpy(v) for k, v in model.state_dict().items()}
            osd = optimizer.sharded_state_dict(model.sharded_state_dict())
            store["optimizer"] = {k: _numpy(v.local_tensor) for k, v in osd.items()}

        def on_log(self, args, state, control, logs=None, **kw):  # type: ignore[no-untyped-def]
            if logs and "loss" in logs:
                store["losses"].append(float(logs["loss"]))

    return Capture()


def _global_step(ck: Path) -> int:
    """The step of ``checkpoint-N`` (its name; the trainer_state.bin pickle is never opened here)."""
    return int(ck.name.rsplit("-", 1)[1])


def _load_model(model_dir: Path, ranks: int) -> object:
    """``from_pretrained(model_dir)``; on 2 ranks the config's model with the safetensors set by
    ``set_state_dict``: 1.2's ``from_pretrained`` in a gloo job loads through flex ``load_state_dict``, whose
    ``reshard_comm.py:229`` calls ``Tensor.cuda()`` ("ValueError: No available device found." on CPU)."""
    import paddle
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM
    from safetensors.numpy import load_file

    if ranks == 1:
        return LlamaForCausalLM.from_pretrained(str(model_dir))
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(str(model_dir)))
    weights: dict = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update({k: paddle.to_tensor(v) for k, v in load_file(str(f)).items()})
    model.set_state_dict(weights)
    return model


def _one(job: dict, out_dir: Path, store: dict) -> None:
    """Resume one job in this process (see the module docstring)."""
    sys.path.insert(0, str(FLEX))
    import make_trainer
    import paddle
    from paddleformers.trainer import Trainer, TrainingArguments
    from paddleformers.transformers import AutoTokenizer

    ck = Path(job["checkpoint"])
    ranks = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    extra = {"split_param": False, "max_grad_norm": 0.0} if ranks > 1 else {}  # as make_trainer.py
    paddle.seed(5)
    model = _load_model(Path(job["model_dir"]), ranks)
    if job["vocab_size"] is not None:
        model.resize_token_embeddings(job["vocab_size"])
    tok = AutoTokenizer.from_pretrained(str(make_trainer.TOKENIZER))
    args = TrainingArguments(
        output_dir=str(ck.parent), max_steps=_global_step(ck) + job["steps"], save_steps=10_000,
        save_strategy="no", logging_steps=1, per_device_train_batch_size=4, learning_rate=1e-2, seed=5,
        save_checkpoint_format="flex_checkpoint", load_checkpoint_format="flex_checkpoint",
        report_to="none", device="cpu", dataloader_num_workers=0, amp_master_grad=False, **extra,
    )  # fmt: skip

    def collate(rows: list[dict]) -> dict:
        return {k: paddle.to_tensor([r[k] for r in rows], dtype="int64") for k in ("input_ids", "labels")}

    trainer = Trainer(model=model, args=args, train_dataset=make_trainer._Data(), tokenizer=tok,
                      data_collator=collate, callbacks=[_capture_callback(store)])  # fmt: skip
    trainer.train(resume_from_checkpoint=str(ck))


def _grow_folder(src: Path, dst: Path, old: int, vocab: int) -> dict:
    """load_state_dict ``src`` into zeros, grow the ``old``-row tensors, save_state_dict into ``dst``."""
    import paddle

    sys.path.insert(0, str(FLEX))
    import make_flex

    sd = {n: paddle.zeros(s, dtype=d) for n, (s, d) in make_flex.metadata_shapes(src).items()}
    if sd:
        paddle.distributed.load_state_dict(sd, str(src))
    for n, t in list(sd.items()):
        if t.ndim == 2 and t.shape[0] == old:
            a = t.numpy()
            new = np.zeros((vocab - old, a.shape[1]), a.dtype)
            if "moment" not in n:
                new[:] = a.mean(0)
            sd[n] = paddle.to_tensor(np.concatenate([a, new]))
    dst.mkdir(parents=True)
    paddle.distributed.save_state_dict(sd, str(dst))
    return sd


def _grow(checkpoint: Path, base: Path, out: Path, vocab: int) -> None:
    """The ``--grow`` worker (see :func:`grow_checkpoint`)."""
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    old = json.loads((base / "config.json").read_text())["vocab_size"]
    ck = out / checkpoint.name
    folders = ("model_state", "optimizer_state", "master_weight")
    shutil.copytree(checkpoint, ck, ignore=shutil.ignore_patterns(*folders))
    model_sd = {}
    for sub in folders:
        grown = _grow_folder(checkpoint / sub, ck / sub, old, vocab)
        model_sd = grown if sub == "model_state" else model_sd
    config = LlamaConfig.from_pretrained(str(base))
    config.vocab_size = vocab
    model = LlamaForCausalLM(config)
    model.set_state_dict(model_sd)
    model.save_pretrained(str(out / "model"))


def _init_fleet() -> None:
    """``Trainer._load_flex_checkpoint`` calls ``dist.fleet.get_hybrid_communicate_group()`` unconditionally
    (trainer.py:1146); on 1 rank the Trainer never initialises fleet, so a 1-rank flex resume fails with
    ``AttributeError: 'Fleet' object has no attribute '_hcg'``. A 1-rank hybrid group (all sizes 1) is what
    a launched single-GPU run has."""
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)


def _worker(jobs_file: Path, out_dir: Path) -> None:
    sys.path.insert(0, str(FLEX))
    import make_trainer

    make_trainer._stub_datasets()
    import paddle

    paddle.set_device("cpu")
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    if "PADDLE_TRAINERS_NUM" not in os.environ:
        _init_fleet()
    for i, job in enumerate(json.loads(jobs_file.read_text())):
        store: dict = {"model": {}, "optimizer": {}, "losses": []}
        ok, error = True, ""
        try:
            _one(job, out_dir, store)
        except Exception as e:  # noqa: BLE001 - the result records any failure of the Trainer
            traceback.print_exc()  # to the worker's stderr, for a human reading a failure
            ok, error = False, (f"{type(e).__name__}: {e}".strip().splitlines() or [""])[-1]
        stem = out_dir / f"r{i}_rank{rank}"
        for part in ("model", "optimizer"):
            np.savez(f"{stem}_{part}.npz", **store[part])
        meta = {"ok": ok, "error": error, "losses": store["losses"]}
        Path(f"{stem}.json").write_text(json.dumps(meta))


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        _worker(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "--grow":
        _grow(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
