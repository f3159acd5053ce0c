"""Helpers for the flex-checkpoint tests: copies of the Paddle-written fixtures (``tests/data/flex``), and
``.metadata`` pickles written by tietool's own writer (``surgery/io/flex_write.py``, not by paddle) to make
gaps, overlaps and replicas. Paddle is never imported.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tietool.surgery.io import flex, flex_write

DATA = Path(__file__).resolve().parents[1] / "data" / "flex"
FOLDERS = ("single", "ranks2", "ranks2_replicas", "flat2", "mesh2x2")


def write_metadata(path: Path, tensors: dict[str, flex.FlexTensor]) -> None:
    """Write ``path`` as paddle's ``save_state_dict`` would for ``tensors`` (the library's writer,
    :func:`tietool.surgery.io.flex_write.write_metadata`, proven against paddle in ``test_flex_write.py``)."""
    flex_write.write_metadata(path, tensors)


def copy_folder(name: str, dst: Path, config: dict | None = None) -> Path:
    """A writable copy of fixture folder ``name`` (its files only, no oracle) with a ``config.json``."""
    import json

    dst.mkdir(parents=True)
    for p in (DATA / name).iterdir():
        if not p.name.startswith("oracle"):
            shutil.copy2(p, dst / p.name)
    (dst / "config.json").write_text(json.dumps(config if config is not None else {"architectures": []}))
    return dst


def read(folder: Path) -> dict[str, flex.FlexTensor]:
    return flex.read_metadata(next(folder.glob("*.metadata")))


LLAMA = {
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "tie_word_embeddings": False,
    "paddleformers_version": "1.2.0",
}


def llama_state(seed: int = 0) -> dict:
    """A tiny PaddleFormers Llama state dict in its in-memory layout (Linear weights ``[in, out]``, the head
    ``[vocab, hidden]``), float32, with the names ``model.state_dict()`` gives."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h, i, v, kv = 8, 16, 32, 4
    shapes = {
        "model.embed_tokens.weight": (v, h),
        "model.layers.0.self_attn.q_proj.weight": (h, h),
        "model.layers.0.self_attn.k_proj.weight": (h, kv),
        "model.layers.0.self_attn.v_proj.weight": (h, kv),
        "model.layers.0.self_attn.o_proj.weight": (h, h),
        "model.layers.0.mlp.gate_proj.weight": (h, i),
        "model.layers.0.mlp.up_proj.weight": (h, i),
        "model.layers.0.mlp.down_proj.weight": (i, h),
        "model.layers.0.input_layernorm.weight": (h,),
        "model.layers.0.post_attention_layernorm.weight": (h,),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def write_flex(folder: Path, state: dict, ranks: int = 2) -> None:
    """``state`` as a flex folder of ``ranks`` ``.distcp`` files (written by tietool's own ``.pdparams``
    writer: the same pickle ``paddle.save`` writes), every 2-D tensor cut by rows (axis 0), the others kept
    whole in rank 0's file, and the ``.metadata`` (:func:`write_metadata`)."""
    from tietool.surgery.io import pdparams
    from tietool.surgery.io.safetensors_io import Source

    folder.mkdir(parents=True, exist_ok=True)
    files: dict[int, list] = {r: [] for r in range(ranks)}
    tensors: dict[str, flex.FlexTensor] = {}
    for name, a in state.items():
        cuts = (
            [(0, a.shape[0])]
            if a.ndim < 2
            else [(r * a.shape[0] // ranks, (r + 1) * a.shape[0] // ranks) for r in range(ranks)]
        )
        slices = []
        for r, (lo, hi) in enumerate(cuts):
            part = a[lo:hi]
            files[r].append((name, part.dtype.name, part.shape, Source(array=part), None, False))
            off = (lo,) + (0,) * (a.ndim - 1)
            slices.append(flex.FlexSlice(f"{r}_0.distcp", name, off, part.shape))
        tensors[name] = flex.FlexTensor(name, a.shape, "float32", tuple(slices))
    for r, ts in files.items():
        pdparams.write_file(folder / f"{r}_0.distcp", ts, {})
    write_metadata(folder / "0.metadata", tensors)
