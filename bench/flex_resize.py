"""The input of the harness's ``flex/resize-state`` case (``bench/cases.py``): ``tietool resize --vocab V+8
--keep-training-state --out`` of a Trainer flex checkpoint with its optimizer state, beside ``cp -r`` of it
(issue 21, flexmem: goal peak RSS ≤ 2 × the largest vocabulary tensor, a fp32 moment, + 150 MB).

The input is a ``checkpoint-N/`` folder whose ``model_state/`` ``make_flex.py --paddle-layout`` wrote with
real Paddle (4 ranks, row shards, config.json in its parent). ``--make`` adds what the Trainer saves beside
it: ``optimizer_state/`` (a fp32 ``.moment1_0`` and ``.moment2_0`` of every tensor, sliced as the weight is,
and its ``.beta1_pow_acc_0`` / ``.beta2_pow_acc_0``, shape [1]) and ``master_weight/`` (a fp32 ``.w_0`` of
every tensor, sliced as the weight is). **These two folders are written by tietool**
(:mod:`tietool.surgery.io.flex_write`: ``.distcp`` by the ``.pdparams`` writer, ``.metadata`` by
``write_metadata``), **not by paddle**; the format is proven by ``tests/oracles/test_flex_write.py``, whose
paddle oracle (``paddle.distributed.load_state_dict``) reads such folders bit for bit. The values are a
pattern (moment1 = 1e-3 × the tensor's index, moment2 = its square, master = 1/(index+1)), one slice in memory
at a time. The benchmark model stores a duplicate ``lm_head.weight`` under ``tie_word_embeddings: true``, a
tie that resize keeps by dropping the duplicate (which a flex checkpoint's optimizer state cannot follow:
refused); ``--make`` therefore sets ``tie_word_embeddings: false`` in the config.json beside the
checkpoint, so the embedding and the head are resized each with its moments and master weight.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tietool.surgery.io import flex, flex_write, pdparams  # noqa: E402
from tietool.surgery.io.flex import FlexSlice, FlexTensor  # noqa: E402
from tietool.surgery.io.safetensors_io import Source  # noqa: E402

MB = 1 << 20
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def _slices(t: FlexTensor, key: str) -> tuple[FlexSlice, ...]:
    return tuple(FlexSlice(s.file, key, s.offset, s.shape) for s in t.slices)


class _Pattern(Source):
    """A fp32 slice of constant value ``v``, made when written (one slice in memory at a time)."""

    __slots__ = ("shape", "v")

    def __init__(self, shape: tuple[int, ...], v: float):
        super().__init__()
        self.shape, self.v = shape, v
        self.nbytes = int(np.prod(shape)) * 4

    def write_to(self, f) -> None:
        Source(array=np.full(self.shape, self.v, np.float32)).write_to(f)


def _write(folder: Path, meta: str, tensors: dict[str, FlexTensor], value) -> None:
    """``folder`` as a flex folder of ``tensors`` (fp32), each slice the value ``value(key)``."""
    folder.mkdir()
    files: dict[str, list[pdparams.Row]] = {}
    for t in tensors.values():
        for s in t.slices:
            src = _Pattern(s.shape, value(t.name))
            files.setdefault(s.file, []).append((s.key, "float32", s.shape, src, None, False))
    for file, rows in sorted(files.items()):
        pdparams.write_file(folder / file, rows, {})
    flex_write.write_metadata(folder / meta, tensors)


def make(ckpt: Path) -> None:
    """Add ``optimizer_state/`` and ``master_weight/`` (written by tietool, module docstring) to ``ckpt``."""
    model = flex.open_flex(flex.FlexFolder(ckpt, ckpt / "model_state", ()))
    opt: dict[str, FlexTensor] = {}
    master: dict[str, FlexTensor] = {}
    index: dict[str, float] = {}
    for i, (name, t) in enumerate(sorted(model.tensors.items())):
        for m, v in (("moment1_0", 1e-3 * (i + 1)), ("moment2_0", (1e-3 * (i + 1)) ** 2)):
            key = f"{name}.{m}"
            opt[key] = FlexTensor(key, t.shape, "float32", _slices(t, key))
            index[key] = v
        for b in ("beta1_pow_acc_0", "beta2_pow_acc_0"):
            key = f"{name}.{b}"
            opt[key] = FlexTensor(key, (1,), "float32", (FlexSlice("0_0.distcp", key, (0,), (1,)),))
            index[key] = 0.9 if b.startswith("beta1") else 0.999
        key = f"{name}.w_0"
        master[key] = FlexTensor(key, t.shape, "float32", _slices(t, key))
        index[key] = 1.0 / (i + 1)
    config = ckpt.parent / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tie_word_embeddings": False}, indent=2))
    _write(ckpt / "optimizer_state", model.metadata, opt, index.__getitem__)
    _write(ckpt / "master_weight", model.metadata, master, index.__getitem__)
