"""``verify`` reads tensors in bounded chunks (:mod:`tietool.surgery.inspect.chunked`). With chunks of a few
bytes
(every tensor split in many pieces, every chunk boundary exercised) its verdict and every figure equal the
verdict with the default chunks, on outputs of every operation (including ``[hidden, vocab]`` heads compared
by column blocks and T5's scaled head), and a single flipped byte in the last row of a tensor is still
found."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import paths

import tietool
from tietool.surgery.inspect import chunked
from tietool.surgery.io.checkpoint import Checkpoint

FIX = paths.CASES_DIR

RUNS = [
    ("pf_llama_tied_fp32", "tie", {}),
    ("pf_llama_tied_bf16", "untie", {}),
    ("pf_llama_untied_sharded", "resize", {"vocab_size": 171, "seed": 1}),
    ("pnlp_llama_untied", "resize", {"vocab_size": 90, "force": True}),  # [hidden, vocab] head, trimmed
    ("pnlp_llama_tied", "untie", {}),  # writes a [hidden, vocab] head: compared by column blocks
    ("pnlp_t5", "untie", {}),  # the head is the embedding × d_model ** -0.5
    ("pnlp_bert_mlm", "resize", {"vocab_size": 140, "seed": 2}),  # head bias entries
    ("pf_llama_untied_legacy_pdparams", "resize", {"vocab_size": 120, "seed": 3}),
]


def _run(name: str, op: str, kw: dict, out: Path) -> None:
    fn = getattr(tietool, op)
    if op == "resize":
        fn(FIX / name, kw.pop("vocab_size"), out, **kw)
    else:
        fn(FIX / name, out, **kw)


@pytest.mark.parametrize("name, op, kw", RUNS, ids=[f"{r[0]}-{r[1]}" for r in RUNS])
def test_tiny_chunks_give_the_same_verdict(tmp_path, monkeypatch, name, op, kw):
    out = tmp_path / "out"
    _run(name, op, dict(kw), out)
    whole = tietool.verify(FIX / name, out).as_dict()
    assert whole["explained"], whole["unexplained"]
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 7)  # one row per chunk, at most
    assert tietool.verify(FIX / name, out).as_dict() == whole


def _flip_last_byte(ckpt: Path, name: str) -> None:
    t = Checkpoint.open(ckpt).tensors[name]
    p = ckpt / t.file
    data = bytearray(p.read_bytes())
    at = t.offset + t.nbytes - 1
    data[at] ^= 0x01
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("chunk", [7, 4 << 20])
@pytest.mark.parametrize(
    "name, tensor",
    [
        ("pf_llama_untied_fp32", "model.layers.0.mlp.down_proj.weight"),
        ("pf_llama_untied_fp32", "lm_head.weight"),
        ("pnlp_llama_untied", "lm_head.weight"),
    ],
)
def test_one_flipped_byte_in_the_last_row_is_found(tmp_path, monkeypatch, chunk, name, tensor):
    monkeypatch.setattr(chunked, "CHUNK_BYTES", chunk)
    out = tmp_path / "copy"
    tietool.resize(FIX / name, Checkpoint.open(FIX / name).config["vocab_size"] + 3, out, seed=0)
    assert tietool.verify(FIX / name, out).explained
    copy = tmp_path / "in"
    copy.mkdir()
    for f in (FIX / name).iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    _flip_last_byte(copy, tensor)
    res = tietool.verify(copy, out)
    assert not res.explained and any(tensor in u for u in res.unexplained), res.unexplained


def test_column_blocks_equal_the_transpose(monkeypatch):
    """``transposed_equal`` reads a ``[hidden, vocab]`` head in column blocks; with blocks of one page the
    blocks still cover every column once."""
    ck = Checkpoint.open(FIX / "pnlp_llama_untied")
    head = ck.load("lm_head.weight")
    v = head.shape[1]
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 7)
    got = np.concatenate(
        [chunked._column_block(ck, "lm_head.weight", s, min(s + 13, v)) for s in range(0, v, 13)], axis=1
    )
    assert got.tobytes() == head.tobytes()
