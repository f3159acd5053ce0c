"""``surgery/plan/transplant_rows.py``: the entries of a ``transplant`` made from an input table, against
numpy on the same arrays (float32 and bfloat16 bits): kept entries are the stored bits, a subword entry the
float64 mean of its ids as float32 (rounded once to bf16), a mean entry the mean of every entry (summed in
blocks: bit for bit ``mean(axis=0, dtype=float64)`` below one block), zeros; rows, columns and a bias."""

from __future__ import annotations

import numpy as np
import pytest

from tietool.surgery.model.tensor import bf16_bits_to_f32, f32_to_bf16_bits
from tietool.surgery.plan import transplant_rows as tr

ROWS = (3, (0, 1), tr.MEAN, tr.ZEROS, (), 0, (2, 2, 5))


def _f32(x):
    return np.asarray(x, np.float32)


def _numpy_rows(x: np.ndarray) -> np.ndarray:
    """The entries of :data:`ROWS` from the float32 table ``x``, in numpy."""
    return np.stack(
        [
            x[3],
            x[[0, 1]].mean(axis=0, dtype=np.float64),
            x.mean(axis=0, dtype=np.float64),
            np.zeros(x.shape[1:]),
            np.zeros(x.shape[1:]),
            x[0],
            x[[2, 2, 5]].mean(axis=0, dtype=np.float64),
        ]
    ).astype(np.float32)


def test_float32_entries_equal_numpy_bit_for_bit():
    x = np.random.default_rng(0).standard_normal((9, 5)).astype(np.float32)
    got = tr.made_block(x, ROWS, _f32, lambda v: v.astype(np.float32), tr.mean_entry(x, _f32))
    assert np.array_equal(got.view(np.uint32), _numpy_rows(x).view(np.uint32))


def test_bfloat16_kept_entries_are_the_stored_bits_and_made_ones_rounded_once():
    bits = f32_to_bf16_bits(np.random.default_rng(1).standard_normal((9, 4)).astype(np.float32))
    got = tr.made_block(bits, ROWS, bf16_bits_to_f32, f32_to_bf16_bits, tr.mean_entry(bits, bf16_bits_to_f32))
    assert got.dtype == np.uint16
    assert np.array_equal(got[[0, 5]], bits[[3, 0]])
    assert np.array_equal(got, f32_to_bf16_bits(_numpy_rows(bf16_bits_to_f32(bits))))


def test_the_mean_is_summed_in_blocks(monkeypatch):
    x = np.random.default_rng(2).standard_normal((10, 3)).astype(np.float32)
    monkeypatch.setattr(tr, "BLOCK", 4)
    blocks = sum(x[s : s + 4].sum(axis=0, dtype=np.float64) for s in (0, 4, 8))
    assert np.array_equal(tr.mean_entry(x, _f32), (blocks / 10).astype(np.float32))


@pytest.mark.parametrize(("shape", "axis"), [((9, 5), 0), ((5, 9), 1), ((9,), -1), ((1, 9), -1)])
def test_rows_columns_and_bias(tmp_path, shape, axis):
    """:func:`transplant_rows_data` on a safetensors tensor laid out along each vocabulary axis."""
    from safetensors.numpy import save_file

    from tietool.surgery.io.checkpoint import Checkpoint
    from tietool.surgery.io.safetensors_io import Source

    def _read(p: Source) -> np.ndarray:
        with open(p.path, "rb") as f:
            f.seek(p.offset)
            return np.frombuffer(f.read(p.nbytes), np.float32)

    a = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    save_file({"t": a, "w": np.zeros((2, 2), np.float32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"model_type": "llama", "vocab_size": 9}')
    ckpt = Checkpoint.open(tmp_path)
    got = tr.transplant_rows_data(tr.TransplantRows("t", axis, ROWS), ckpt)
    if isinstance(got, Source):  # rows: kept runs as byte ranges of the file, made rows as arrays
        assert axis % len(shape) == 0 and any(p.path is not None for p in got.parts)
        got = np.concatenate(
            [np.asarray(p.array).ravel() if p.array is not None else _read(p) for p in got.parts]
        )
        got = got.reshape((-1, *shape[1:]))
    want = np.moveaxis(_numpy_rows(np.moveaxis(a, axis, 0)), 0, axis % a.ndim)
    assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
