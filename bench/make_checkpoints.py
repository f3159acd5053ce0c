#!/usr/bin/env python3
"""Build the benchmark checkpoints of issue 4: PaddleFormers 1.2 Llama folders, bf16, tied with the
duplicate ``lm_head.weight`` PaddleFormers writes, sharded so the embedding and the head each sit in a shard
of their own.

    python bench/make_checkpoints.py              # both: bench/_work/ckpt_2l (~1.23 GB), ckpt_60l (~6.5 GB)
    python bench/make_checkpoints.py --layers 2   # only one
    python bench/make_checkpoints.py --check      # also load ckpt_2l with PaddleFormers (needs paddleformers)

Shapes are those of a 3B Llama: vocab 128256, hidden 2048, intermediate 5632, 16 heads, 4 KV heads (head_dim
128). Data are random bf16 bits (N(0, 0.02) in float32, truncated to bf16), made in chunks by numpy, and
written by the streaming safetensors writer below, so memory stays at one chunk (~100 MB) whatever the
checkpoint size. Norm weights are 1.0. ``lm_head.weight`` is byte-identical to ``model.embed_tokens.weight``
(its bytes are copied from the embedding shard).

Nothing here imports tietool (``surgery``/``cli``): the checkpoints are an independent input.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

VOCAB, HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 128256, 2048, 5632, 16, 4, 128
LAYERS_PER_SHARD = 16  # 16 × 90 MB ≈ 1.44 GB per layer shard
CHUNK_ELEMS = 8 << 20  # 8 Mi elements: 32 MB float32 (+32 MB shifted) while generating, 16 MB of bf16 bits
WORK = Path(__file__).resolve().parent / "_work"
BF16_ONE = 0x3F80


def config(layers: int) -> dict:
    """config.json with the keys of /work/shared/fixtures/cases/pf_llama_tied_bf16/config.json."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": HEADS,
        "num_hidden_layers": layers,
        "num_key_value_heads": KV_HEADS,
        "pad_token_id": 0,
        "paddleformers_version": "1.2.0",
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
    }


def layer_tensors(i: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"model.layers.{i}."
    return [
        (p + "input_layernorm.weight", (HIDDEN,)),
        (p + "mlp.down_proj.weight", (HIDDEN, INTER)),
        (p + "mlp.gate_proj.weight", (INTER, HIDDEN)),
        (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
        (p + "post_attention_layernorm.weight", (HIDDEN,)),
        (p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
        (p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM)),
        (p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)),
        (p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
    ]


def shard_plan(layers: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Embedding alone, the layers in groups of LAYERS_PER_SHARD (model.norm with the last group), head
    alone."""
    shards = [[("model.embed_tokens.weight", (VOCAB, HIDDEN))]]
    for start in range(0, layers, LAYERS_PER_SHARD):
        group = []
        for i in range(start, min(layers, start + LAYERS_PER_SHARD)):
            group += layer_tensors(i)
        shards.append(group)
    shards[-1].append(("model.norm.weight", (HIDDEN,)))
    shards.append([("lm_head.weight", (VOCAB, HIDDEN))])
    return shards


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def random_bf16_chunks(n: int, rng: np.random.Generator):
    """``n`` bf16 values as little-endian uint16 bits, in chunks of at most CHUNK_ELEMS."""
    left = n
    while left:
        k = min(left, CHUNK_ELEMS)
        x = rng.standard_normal(k, dtype=np.float32)
        x *= np.float32(0.02)
        yield (x.view(np.uint32) >> 16).astype("<u2")
        left -= k


def write_safetensors(path: Path, tensors, data_for) -> int:
    """Streaming safetensors writer: header (sorted names, 8-byte aligned), then each tensor's bytes.

    ``data_for(name, shape)`` yields bytes-like chunks whose total is the tensor's size. Returns data bytes.
    """
    tensors = sorted(tensors)
    header, pos = {}, 0
    for name, shape in tensors:
        nb = numel(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [pos, pos + nb]}
        pos += nb
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in tensors:
            want, got = numel(shape) * 2, 0
            for chunk in data_for(name, shape):
                mv = memoryview(chunk).cast("B")
                f.write(mv)
                got += len(mv)
            if got != want:
                raise AssertionError(f"{name}: wrote {got} bytes, expected {want}")
    return pos


def tensor_range(path: Path, name: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    b, e = h[name]["data_offsets"]
    return 8 + n + b, e - b


def copy_bytes(src: Path, offset: int, nbytes: int, chunk: int = 64 << 20):
    with open(src, "rb") as f:
        f.seek(offset)
        while nbytes:
            buf = f.read(min(chunk, nbytes))
            if not buf:
                raise AssertionError("short read")
            nbytes -= len(buf)
            yield buf


def build(layers: int, out: Path, seed: int = 0) -> Path:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    shards = shard_plan(layers)
    n = len(shards)
    names = [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    emb_file = tmp / names[0]

    def data_for(name, shape):
        if name.endswith("norm.weight"):
            yield np.full(numel(shape), BF16_ONE, dtype="<u2")
        elif name == "lm_head.weight":  # the duplicate PaddleFormers writes: the embedding's bytes
            yield from copy_bytes(emb_file, *tensor_range(emb_file, "model.embed_tokens.weight"))
        else:
            yield from random_bf16_chunks(numel(shape), rng)

    weight_map, total = {}, 0
    for fname, tensors in zip(names, shards, strict=True):  # one name per shard
        total += write_safetensors(tmp / fname, tensors, data_for)
        for t, _ in tensors:
            weight_map[t] = fname
        print(f"  {out.name}/{fname}: {(tmp / fname).stat().st_size / 1e9:.3f} GB", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=4) + "\n")
    (tmp / "config.json").write_text(json.dumps(config(layers), indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


TINY = {"VOCAB": 1280, "HIDDEN": 64, "INTER": 160, "HEADS": 4, "KV_HEADS": 2, "HEAD_DIM": 16}


def build_tiny(layers: int, out: Path, seed: int = 0) -> Path:
    """``build`` with the shapes scaled down (:data:`TINY`: vocab 1280, hidden 64; a few hundred KB), for the
    harness's ``--size tiny`` (``tests/structure/test_bench_cases.py``): the same names, sharding, dtype
    labels and duplicate head, so every case runs the same code paths in a second."""
    g = globals()
    saved = {k: g[k] for k in TINY}
    g.update(TINY)
    try:
        return build(layers, out, seed)
    finally:
        g.update(saved)


def check_paddleformers(path: Path) -> int:
    """Load ``path`` with PaddleFormers' LlamaForCausalLM (bf16, CPU); print missing/unexpected keys."""
    import contextlib
    import io
    import logging

    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import paddle
    from paddleformers.transformers import LlamaForCausalLM

    paddle.set_device("cpu")
    log = io.StringIO()
    h = logging.StreamHandler(log)
    for lname in ("PaddleFormers", "paddle.distributed.fleet.utils.log_util", ""):
        logging.getLogger(lname).addHandler(h)
    before = set(os.listdir(path))
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        m = LlamaForCausalLM.from_pretrained(str(path), dtype="bfloat16")
    lines = [
        ln
        for ln in log.getvalue().splitlines()
        if any(
            w in ln
            for w in (
                "Unexpected keys",
                "Missing keys",
                "newly initialized",
                "should be assigned",
                "not used",
                "were not initialized",
            )
        )
    ]
    emb = m.get_input_embeddings().weight
    head = m.get_output_embeddings().weight if m.get_output_embeddings() is not None else None
    print(
        f"loaded {type(m).__name__}: embedding {list(emb.shape)} {emb.dtype}; head "
        f"{None if head is None else list(head.shape)}; tied (same tensor): "
        f"{head is not None and head is emb or (head is not None and head.data_ptr() == emb.data_ptr())}"
    )
    for ln in lines:
        print("  log:", ln.strip()[:300])
    new = set(os.listdir(path)) - before
    if new:
        print("  from_pretrained wrote into the folder (removed again):", sorted(new))
        for n in new:
            if n == "flex-ckpt.auto_generated.metadata":
                os.unlink(os.path.join(path, n))
    bad = [
        ln
        for ln in lines
        if ("Missing keys" in ln or "newly initialized" in ln or "were not initialized" in ln)
        or ("Unexpected keys" in ln and "lm_head.weight" not in ln)
    ]
    print("PaddleFormers load:", "OK (only the known unexpected lm_head.weight)" if not bad else "PROBLEMS")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, action="append", help="2 and/or 60 (default: both)")
    ap.add_argument("--out-dir", type=Path, default=WORK)
    ap.add_argument("--force", action="store_true", help="rebuild even when the folder exists")
    ap.add_argument("--check", action="store_true", help="load the 2-layer checkpoint with PaddleFormers")
    a = ap.parse_args()
    for layers in a.layers or [2, 60]:
        out = a.out_dir / f"ckpt_{layers}l"
        if out.is_dir() and (out / "config.json").is_file() and not a.force:
            print(f"{out} exists (use --force to rebuild)")
            continue
        print(f"building {out} ({layers} layers)", flush=True)
        build(layers, out)
        size = sum(p.stat().st_size for p in out.iterdir())
        print(f"  total {size / 1e9:.3f} GB", flush=True)
    if a.check:
        return check_paddleformers(a.out_dir / "ckpt_2l")
    return 0


if __name__ == "__main__":
    sys.exit(main())
