"""Run the real PaddleFormers 1.2 Trainer for 2 steps on a tiny Llama on CPU and keep its flex checkpoint.

Run: ``python make_trainer.py OUT [RANKS] [--tied] [--no-oracle]`` (called by ``make_flex.py``, which makes
the oracles of all its folders in one process: ``--no-oracle``). ``--tied``: the same Llama
with ``tie_word_embeddings`` true and ``vocab_size`` :data:`TIED_VOCAB` (6 slack rows beyond the
tokenizer's 250 ids), 1 rank (``trainer_tied/``). Writes ``OUT/checkpoint-2/`` exactly as
the Trainer left it (``save_checkpoint_format="flex_checkpoint"``, the 1.2 default), ``OUT/base/`` (the
model before training, as ``save_pretrained`` writes it: the run's model_name_or_path), what
``trainer.save_model(OUT)`` writes at the end, and the oracles (see README.md):
``oracle*.npz``/``.json`` (``paddle.distributed.load_state_dict`` of model_state/, optimizer_state/,
master_weight/ into full-size zeros), ``state_dict_names.json``, ``input_ids.npy`` + ``logits.npy``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

VOCAB = 250  # tests/data/tokenizers/sp_unigram has 250 ids
TOKENIZER = Path(__file__).resolve().parents[1] / "tokenizers" / "sp_unigram"
IDS = [[1, 5, 7, 9, 3, 11, 2, 17], [4, 4, 8, 30, 31, 12, 6, 39]]
CFG = {
    "vocab_size": VOCAB,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "fuse_rms_norm": False,
}
TIED_VOCAB = 256  # tied variant: rows 250..255 are slack (no token of sp_unigram uses them)
TIED = {**CFG, "vocab_size": TIED_VOCAB, "tie_word_embeddings": True}


class _Data:
    """A fixed map-style dataset of 8 sequences of 8 ids (labels = input ids)."""

    def __init__(self) -> None:
        import numpy as np

        rng = np.random.default_rng(21)
        self.rows = rng.integers(3, VOCAB, size=(8, 8)).tolist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _stub_datasets() -> None:
    """The venv's pyarrow needs numpy 2 (paddle 3.3.1 runs on numpy 1.26): ``import datasets`` fails, and
    trainer.py imports it only for ``isinstance(x, datasets.Dataset)`` checks. A stand-in module with two
    empty classes lets the Trainer import; our dataset is a plain map-style one."""
    import importlib.machinery
    import types

    mod = types.ModuleType("datasets")
    mod.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    mod.Dataset = type("Dataset", (), {})  # type: ignore[attr-defined]
    mod.IterableDataset = type("IterableDataset", (), {})  # type: ignore[attr-defined]
    sys.modules.setdefault("datasets", mod)


def train(out: Path, ranks: int, tied: bool = False) -> object:
    """Two optimizer steps of the real Trainer on this rank; returns the trained model.

    With 2 ranks the Trainer's default is data parallel + sharding stage 1 over both. Two settings differ
    from the defaults there, for CPU: ``split_param=False`` (sharding v2 asserts ``amp_master_grad``, which
    needs bf16/fp16 AMP: no bf16 matmul on CPU) and ``max_grad_norm=0`` (with a clip, 1.2.0's
    ``_wrap_distributed_optimizer`` fails: ``'AdamW' object has no attribute '_inner_opt'``)."""
    _stub_datasets()
    import paddle
    from paddleformers.trainer import Trainer, TrainingArguments
    from paddleformers.transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    paddle.set_device("cpu")
    paddle.seed(5)
    model = LlamaForCausalLM(LlamaConfig(**(TIED if tied else CFG)))
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    if ranks == 1:
        # The folder a run starts from (model_name_or_path): the flex checkpoint has no config.json.
        model.save_pretrained(str(out / "base"))
        tok.save_pretrained(str(out / "base"))
    extra = {"split_param": False, "max_grad_norm": 0.0} if ranks > 1 else {}
    args = TrainingArguments(
        output_dir=str(out),
        logging_dir=str(out / "runs"),  # the default adds the time and host name: bytes differ per run
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
        **extra,
    )

    def collate(rows: list[dict]) -> dict:
        return {k: paddle.to_tensor([r[k] for r in rows], dtype="int64") for k in ("input_ids", "labels")}

    trainer = Trainer(model=model, args=args, train_dataset=_Data(), tokenizer=tok, data_collator=collate)
    trainer.train()
    # what a finished run exports; in the flex format: model_state/ + tokenizer, no config.json
    trainer.save_model(str(out))
    return model


def write_oracles(out: Path) -> None:
    """The load_state_dict oracles of the three flex folders (one process)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_flex

    ck = out / "checkpoint-2"
    for sub, stem in (
        ("model_state", "oracle"),
        ("optimizer_state", "oracle_optimizer"),
        ("master_weight", "oracle_master_weight"),
    ):
        folder = ck / sub
        if folder.is_dir() and any(folder.glob("*.metadata")):
            make_flex.write_oracle(folder, dest=out / stem)


def write_logits(out: Path, model: object) -> None:
    """The trained model's state-dict names and its logits on the fixed batch."""
    import numpy as np
    import paddle

    names = {k: list(v.shape) for k, v in model.state_dict().items()}
    (out / "state_dict_names.json").write_text(json.dumps(names, indent=1) + "\n")
    ids = np.array(IDS, dtype=np.int64)
    np.save(out / "input_ids.npy", ids)
    model.eval()
    with paddle.no_grad():
        res = model(paddle.to_tensor(ids))
        logits = res[0] if isinstance(res, tuple) else res.logits
    np.save(out / "logits.npy", logits.astype("float32").numpy())


def main() -> None:
    """``OUT [RANKS]``: train (in RANKS processes), then the oracles in a fresh process."""
    if sys.argv[1] == "--worker":
        import paddle

        out, ranks = Path(sys.argv[2]), int(sys.argv[3])
        model = train(out, ranks, "--tied" in sys.argv[4:])
        if paddle.distributed.get_rank() == 0:
            write_logits(out, model)
        return
    if sys.argv[1] == "--oracle":
        write_oracles(Path(sys.argv[2]))
        return
    args = [a for a in sys.argv[1:] if a not in ("--tied", "--no-oracle")]
    ranks = int(args[1]) if len(args) > 1 else 1
    make(Path(args[0]), ranks, tied="--tied" in sys.argv, oracle="--no-oracle" not in sys.argv)


def make(out: Path, ranks: int, tied: bool = False, oracle: bool = True) -> None:
    """Write ``out`` (replacing it): :func:`train` in ``ranks`` processes, then (``oracle``) the oracles in a
    fresh one; the processes fork from ``support.preload`` servers (``make_flex.run_ranks_cmd``)."""
    shutil.rmtree(out, ignore_errors=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_flex

    preload = make_flex.preload

    worker = [sys.executable, __file__, "--worker", str(out), str(ranks)] + (["--tied"] if tied else [])
    if ranks == 1:
        preload.run(worker, libs=preload.PADDLEFORMERS, env=make_flex.ENV, check=True, capture_output=True)
    else:
        make_flex.run_ranks_cmd(worker, ranks, libs=preload.PADDLEFORMERS)
    if oracle:  # make_flex.py makes every folder's oracles in one process
        cmd = [sys.executable, __file__, "--oracle", str(out)]
        preload.run(cmd, libs=make_flex.PADDLE, env=make_flex.ENV, check=True, capture_output=True)


if __name__ == "__main__":
    main()
