"""Self-tests for casecheck: the checker must pass good outputs and fail bad ones.

These tests build tiny checkpoints in tmp_path (hand-written safetensors
headers, pickled pdparams) and never run the tool.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from support import casecheck as cc
from support import paths, preload

# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------

ST_LABELS = {
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("uint16"): "U16",
    np.dtype("int64"): "I64",
}


def write_safetensors(
    path: Path, tensors: dict, labels: dict | None = None, metadata: dict | None = None
) -> int:
    """Write a safetensors file with our own header writer.

    ``tensors`` maps names to numpy arrays; ``labels`` overrides the dtype
    label per name (e.g. ``BF16`` for uint16 bit patterns); ``metadata`` is
    the header's ``__metadata__`` (default ``{"format": "np"}``, ``{}`` for
    none). Returns the number of data bytes written.
    """
    labels = labels or {}
    meta = {"format": "np"} if metadata is None else metadata
    header: dict = {"__metadata__": meta} if meta else {}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        label = labels.get(name, ST_LABELS[arr.dtype])
        header[name] = {"dtype": label, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return offset


def write_pdparams(path: Path, tensors: dict) -> None:
    """Pickle a state dict the way paddle.save does (protocol 4, name map included)."""
    state = dict(tensors)
    state["StructuredToParameterName@@"] = {k: f"param_{i}" for i, k in enumerate(tensors)}
    with open(path, "wb") as fh:
        pickle.dump(state, fh, protocol=4)


def write_config(folder: Path, **values) -> None:
    """Write config.json with the given keys."""
    (folder / "config.json").write_text(json.dumps(values))


def write_sharded_safetensors(
    folder: Path,
    shards: list[dict],
    total_size: int | None = None,
    extra_map: dict | None = None,
    drop_from_map: tuple = (),
) -> int:
    """Write ``model-0000k-of-0000N.safetensors`` shards and their index.

    Returns the real total byte size. ``total_size`` overrides the size written
    in the index, ``extra_map`` adds (possibly wrong) entries, ``drop_from_map``
    leaves names out of the weight_map.
    """
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    real = 0
    for k, shard in enumerate(shards, start=1):
        filename = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        real += write_safetensors(folder / filename, shard)
        for name in shard:
            if name not in drop_from_map:
                weight_map[name] = filename
    weight_map.update(extra_map or {})
    index = {"metadata": {"total_size": real if total_size is None else total_size}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return real


def embedding(rows: int = 6, cols: int = 4, dtype=np.float32) -> np.ndarray:
    """Rows ``i + 0.01*j + 0.5``, as in the case generator."""
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return (i + 0.01 * j + 0.5).astype(dtype)


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def ctx_for(
    out: Path | None, inp: Path | None = None, message: str = "", snapshot=None, original: Path | None = None
) -> cc.CheckContext:
    """A CheckContext over the given folders."""
    return cc.CheckContext(
        out=out, input_dir=inp, original_dir=original or inp, message=message, input_snapshot=snapshot
    )


def passes(check: dict, ctx: cc.CheckContext) -> bool:
    """Run a check on a fresh copy of the context state (no cached checkpoints)."""
    fresh = cc.CheckContext(
        out=ctx.out,
        input_dir=ctx.input_dir,
        original_dir=ctx.original_dir,
        message=ctx.message,
        input_snapshot=ctx.input_snapshot,
    )
    result = cc.run_check(check, fresh)
    return result is None


def fails_with(check: dict, ctx: cc.CheckContext, *fragments: str) -> str:
    """Assert the check fails and its reason mentions every fragment."""
    result = cc.run_check(
        check,
        cc.CheckContext(
            out=ctx.out,
            input_dir=ctx.input_dir,
            original_dir=ctx.original_dir,
            message=ctx.message,
            input_snapshot=ctx.input_snapshot,
        ),
    )
    assert result is not None, f"{check} unexpectedly passed"
    for fragment in fragments:
        assert fragment.lower() in result.lower(), f"{fragment!r} not in failure: {result}"
    return result


@pytest.fixture
def st_pair(tmp_path: Path):
    """Input and output single-file safetensors folders with an embedding and a head."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir(), out.mkdir()
    emb = embedding()
    write_safetensors(inp / "model.safetensors", {"emb": emb, "norm": np.ones(4, np.float32)})
    write_config(inp, tie_word_embeddings=True, vocab_size=6)
    return inp, out, emb


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def test_read_safetensors_header_and_bytes(tmp_path: Path):
    emb = embedding()
    bits = to_bf16_bits(emb)
    write_safetensors(tmp_path / "model.safetensors", {"a": emb, "b": bits}, labels={"b": "BF16"})
    ckpt = cc.read_checkpoint(tmp_path)
    assert ckpt.problems == []
    assert ckpt.tensors["a"].label == "F32" and ckpt.tensors["a"].shape == (6, 4)
    assert ckpt.tensors["a"].raw == emb.tobytes()
    assert ckpt.tensors["b"].label == "BF16" and ckpt.tensors["b"].raw == bits.tobytes()


def test_read_safetensors_rejects_bad_offsets(tmp_path: Path):
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 12)
    ckpt = cc.read_checkpoint(tmp_path)
    assert "x" not in ckpt.tensors
    assert any("spans 12 bytes" in p for p in ckpt.problems)


def write_raw_safetensors(path: Path, header_json: str, data: bytes) -> None:
    """A safetensors file from a literal header text (which may name a tensor twice) and data block."""
    text = header_json.encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def f32x2(start: int, end: int) -> str:
    """Header entry of an F32 [2] tensor at the given data offsets."""
    return f'{{"dtype": "F32", "shape": [2], "data_offsets": [{start}, {end}]}}'


@pytest.mark.parametrize(
    "header,size,fragment",
    [
        (f'{{"a": {f32x2(0, 8)}, "b": {f32x2(12, 20)}}}', 20, "a hole"),
        (f'{{"a": {f32x2(0, 8)}, "b": {f32x2(4, 12)}}}', 12, "an overlap"),
        (f'{{"a": {f32x2(8, 16)}}}', 16, "a hole"),
        (f'{{"a": {f32x2(0, 8)}, "b": {f32x2(8, 16)}}}', 20, "4 byte(s) after the last tensor"),
        (f'{{"a": {f32x2(0, 8)}, "a": {f32x2(8, 16)}}}', 16, "appears twice"),
    ],
    ids=["hole", "overlap", "hole-at-start", "trailing-bytes", "duplicate-name"],
)
def test_read_safetensors_refuses_what_the_library_refuses(tmp_path: Path, header, size, fragment):
    """Holes, overlaps, bytes after the last tensor, a name twice: the safetensors library refuses such a
    file, so the checker cannot read it, and every tensor check on that output fails (even the ones that
    look for an absence)."""
    out = tmp_path / "out"
    out.mkdir()
    write_raw_safetensors(out / "model.safetensors", header, b"\0" * size)
    ckpt = cc.read_checkpoint(out)
    assert ckpt.tensors == {}
    assert any(fragment in p for p in ckpt.problems), ckpt.problems
    ctx = ctx_for(out)
    for check in (
        {"out_has_tensor": "a"},
        {"out_lacks_tensor": "zzz"},
        {"no_tensor_with_shape": [7]},
        {"tensor_shape": ["a", [2]]},
        {"rows_zero": ["a", 0, 2]},
    ):
        fails_with(check, ctx, "cannot be read", fragment)


def test_read_safetensors_tiled_data_block_passes(tmp_path: Path):
    """Tensors that tile the data block exactly in any header order, zero-size ones included, read fine."""
    empty = '{"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}'
    header = f'{{"b": {f32x2(8, 16)}, "e": {empty}, "a": {f32x2(0, 8)}}}'
    write_raw_safetensors(tmp_path / "model.safetensors", header, bytes(range(16)))
    ckpt = cc.read_checkpoint(tmp_path)
    assert ckpt.problems == []
    assert ckpt.tensors["a"].raw == bytes(range(8)) and ckpt.tensors["b"].raw == bytes(range(8, 16))


def test_read_prefers_the_indexed_file_over_a_stray_one(tmp_path: Path):
    """A name held by a file the index lists and by an unlisted file is read from the listed file, whatever
    the file order."""
    emb = embedding()
    write_sharded_safetensors(tmp_path, [{"emb": emb}, {"head": emb}])
    # sorts after the shards: read last
    write_safetensors(tmp_path / "model.safetensors", {"emb": emb + 7, "head": emb + 7})
    # a stray shard-named file that sorts first
    write_safetensors(tmp_path / "model-00000-of-00002.safetensors", {"head": emb + 9})
    ckpt = cc.read_checkpoint(tmp_path)
    assert ckpt.tensors["emb"].source == "model-00001-of-00002.safetensors"
    assert ckpt.tensors["head"].source == "model-00002-of-00002.safetensors"
    assert ckpt.tensors["head"].raw == emb.tobytes()
    assert ckpt.problems == []
    # two listed files (or two unlisted ones) holding one name is still a problem
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["x"] = "model-00000-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert any("stored twice" in p for p in cc.read_checkpoint(tmp_path).problems)


def _split_state(emb: np.ndarray, head: np.ndarray) -> OrderedDict:
    """A state dict as paddle.save writes arrays over its size limit: flat pieces plus the table."""
    state: OrderedDict = OrderedDict(norm=np.ones(4, np.float32))
    table = {}
    for name, arr in (("emb", emb), ("head", head)):
        flat = arr.reshape(-1)
        half = flat.size // 2
        state[f"{name}@@.0"], state[f"{name}@@.1"] = flat[:half].copy(), flat[half:].copy()
        table[name] = {"OriginShape": tuple(arr.shape), "slices": [f"{name}@@.0", f"{name}@@.1"]}
    state["UnpackBigParamInfor@@"] = table
    return state


def test_read_pdparams_joins_split_parameters(tmp_path: Path):
    """A protocol-2 pickle (array bytes through _codecs.encode) with paddle.save's split pieces reads as
    paddle.load returns it: the pieces joined under their name with the original shape, and gone."""
    emb, head = embedding(), np.ascontiguousarray(embedding().T)
    state = _split_state(emb, head)
    state["emb"] = np.zeros(3, np.float32)  # a key NAME stored beside the pieces is replaced
    with open(tmp_path / "model_state.pdparams", "wb") as fh:
        pickle.dump(state, fh, protocol=2)
    ckpt = cc.read_checkpoint(tmp_path)
    assert ckpt.problems == []
    assert set(ckpt.tensors) == {"norm", "emb", "head"}
    assert ckpt.tensors["emb"].shape == (6, 4) and ckpt.tensors["emb"].raw == emb.tobytes()
    assert ckpt.tensors["head"].shape == (4, 6) and ckpt.tensors["head"].raw == head.tobytes()
    assert passes({"no_tensor_with_shape": [12]}, ctx_for(tmp_path))


def test_read_pdparams_split_table_naming_a_missing_piece(tmp_path: Path):
    state = _split_state(embedding(), embedding())
    del state["head@@.1"]
    with open(tmp_path / "model_state.pdparams", "wb") as fh:
        pickle.dump(state, fh, protocol=4)
    ckpt = cc.read_checkpoint(tmp_path)
    assert ckpt.tensors == {}
    assert any("UnpackBigParamInfor@@" in p and "head" in p for p in ckpt.problems), ckpt.problems


def test_read_pdparams_ignores_non_arrays_and_keeps_aliases(tmp_path: Path):
    emb = embedding()
    bias = np.arange(6, dtype=np.float32)
    write_pdparams(tmp_path / "model_state.pdparams", {"emb": emb, "head": emb, "bias": bias})
    ckpt = cc.read_checkpoint(tmp_path)
    assert set(ckpt.tensors) == {"emb", "head", "bias"}
    assert ckpt.tensors["emb"].label == "float32"
    assert ckpt.tensors["head"].raw == emb.tobytes()


def test_read_pdparams_transposed_array_is_c_order(tmp_path: Path):
    arr = embedding().T  # a non-contiguous view
    write_pdparams(tmp_path / "model_state.pdparams", {"h": arr})
    tensor = cc.read_checkpoint(tmp_path).tensors["h"]
    assert tensor.shape == (4, 6) and tensor.raw == np.ascontiguousarray(arr).tobytes()


def test_read_pdparams_refuses_foreign_globals(tmp_path: Path):
    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())

    with open(tmp_path / "model_state.pdparams", "wb") as fh:
        pickle.dump({"w": Evil()}, fh, protocol=4)
    ckpt = cc.read_checkpoint(tmp_path)
    assert ckpt.tensors == {}
    assert any("forbidden global" in p for p in ckpt.problems)


def test_read_pdparams_ordered_dict(tmp_path: Path):
    with open(tmp_path / "model_state.pdparams", "wb") as fh:
        pickle.dump(OrderedDict(w=np.zeros(3, np.float16)), fh, protocol=4)
    assert cc.read_checkpoint(tmp_path).tensors["w"].label == "float16"


def test_read_sharded_pdparams_with_index(tmp_path: Path):
    write_pdparams(tmp_path / "model_state-00001-of-00002.pdparams", {"emb": embedding()})
    write_pdparams(tmp_path / "model_state-00002-of-00002.pdparams", {"norm": np.ones(4, np.float32)})
    index = {
        "metadata": {"total_size": 6 * 4 * 4 + 16},
        "weight_map": {
            "emb": "model_state-00001-of-00002.pdparams",
            "norm": "model_state-00002-of-00002.pdparams",
        },
    }
    (tmp_path / "model_state.pdparams.index.json").write_text(json.dumps(index))
    ckpt = cc.read_checkpoint(tmp_path)
    assert set(ckpt.tensors) == {"emb", "norm"}
    assert cc.run_check({"index_matches_shards": True}, ctx_for(tmp_path)) is None
    index["metadata"]["total_size"] = 1
    (tmp_path / "model_state.pdparams.index.json").write_text(json.dumps(index))
    fails_with({"index_matches_shards": True}, ctx_for(tmp_path), "total_size is 1")


def test_missing_shard_is_a_problem_not_a_crash(tmp_path: Path):
    write_sharded_safetensors(
        tmp_path, [{"a": embedding()}], extra_map={"b": "model-00002-of-00002.safetensors"}
    )
    ckpt = cc.read_checkpoint(tmp_path)
    assert "a" in ckpt.tensors
    assert any("model-00002-of-00002.safetensors" in p for p in ckpt.problems)


def test_bf16_decoding_is_bit_shifting(tmp_path: Path):
    bits = np.array([0x3F80, 0xC000, 0x3F00, 0x0000], dtype=np.uint16)  # 1, -2, 0.5, 0
    write_safetensors(tmp_path / "model.safetensors", {"x": bits, "y": bits}, labels={"x": "BF16"})
    ckpt = cc.read_checkpoint(tmp_path)
    assert ckpt.decode(ckpt.tensors["x"]).tolist() == [1.0, -2.0, 0.5, 0.0]
    # U16 without a bfloat16 config is just integers
    assert ckpt.decode(ckpt.tensors["y"]).tolist() == [0x3F80, 0xC000, 0x3F00, 0.0]
    for cfg in (
        {"torch_dtype": "bfloat16"},
        {"dtype": "bfloat16"},
        {"text_config": {"torch_dtype": "bfloat16"}},
    ):
        write_config(tmp_path, **cfg)
        ckpt = cc.read_checkpoint(tmp_path)
        assert ckpt.decode(ckpt.tensors["y"]).tolist() == [1.0, -2.0, 0.5, 0.0], cfg


def test_f16_decoding(tmp_path: Path):
    write_safetensors(tmp_path / "model.safetensors", {"h": np.array([0.5, -3.0], np.float16)})
    ckpt = cc.read_checkpoint(tmp_path)
    assert ckpt.decode(ckpt.tensors["h"]).tolist() == [0.5, -3.0]


# ---------------------------------------------------------------------------
# Tensor checks
# ---------------------------------------------------------------------------


def test_tensor_equals_input_passes_and_fails_on_one_byte(st_pair):
    inp, out, emb = st_pair
    write_safetensors(out / "model.safetensors", {"emb": emb, "head": emb})
    ctx = ctx_for(out, inp)
    assert passes({"tensor_equals_input": ["head", "emb", "same"]}, ctx)
    raw = bytearray(emb.tobytes())
    raw[37] ^= 0x01  # flip one bit of one element
    changed = np.frombuffer(bytes(raw), dtype=np.float32).reshape(emb.shape)
    write_safetensors(out / "model.safetensors", {"emb": emb, "head": changed})
    fails_with({"tensor_equals_input": ["head", "emb", "same"]}, ctx, "1 element(s) differ", "[2, 1]")


def test_tensor_equals_input_transposed(st_pair):
    inp, out, emb = st_pair
    write_safetensors(out / "model.safetensors", {"head": np.ascontiguousarray(emb.T)})
    ctx = ctx_for(out, inp)
    assert passes({"tensor_equals_input": ["head", "emb", "transposed"]}, ctx)
    fails_with({"tensor_equals_input": ["head", "emb", "same"]}, ctx, "expected shape [6, 4]")


def test_square_transpose_is_detected(tmp_path: Path):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir(), out.mkdir()
    sq = embedding(4, 4)
    write_pdparams(inp / "model_state.pdparams", {"emb": sq})
    write_pdparams(out / "model_state.pdparams", {"head": sq})  # untransposed copy
    ctx = ctx_for(out, inp)
    assert passes({"tensor_equals_input": ["head", "emb", "same"]}, ctx)
    fails_with({"tensor_equals_input": ["head", "emb", "transposed"]}, ctx, "untransposed")


def test_bitwise_ignores_label_but_not_bytes(tmp_path: Path):
    """A U16 input and a BF16 output with identical bits are bitwise equal."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir(), out.mkdir()
    bits = to_bf16_bits(embedding())
    write_safetensors(inp / "model.safetensors", {"emb": bits}, labels={"emb": "U16"})
    write_safetensors(out / "model.safetensors", {"head": bits}, labels={"head": "BF16"})
    ctx = ctx_for(out, inp)
    assert passes({"tensor_equals_input": ["head", "emb", "same"]}, ctx)
    assert passes({"tensor_dtype": ["head", "BF16"]}, ctx)
    fails_with({"tensor_dtype": ["head", "U16"]}, ctx, "'BF16'")
    # a value cast (bits -> float32 numbers) is not bitwise equal
    write_safetensors(out / "model.safetensors", {"head": bits.astype(np.float32)})
    fails_with({"tensor_equals_input": ["head", "emb", "same"]}, ctx, "element sizes differ")


def test_tensor_equals_original(tmp_path: Path):
    orig, mid, out = tmp_path / "orig", tmp_path / "mid", tmp_path / "out"
    for d in (orig, mid, out):
        d.mkdir()
    emb = embedding()
    write_pdparams(orig / "model_state.pdparams", {"emb": emb, "head": emb + 1})
    write_pdparams(mid / "model_state.pdparams", {"emb": emb})
    write_pdparams(out / "model_state.pdparams", {"emb": emb, "head": emb})
    ctx = cc.CheckContext(out=out, input_dir=mid, original_dir=orig)
    assert cc.run_check({"tensor_equals_original": ["emb", "emb", "same"]}, ctx) is None
    assert cc.run_check({"tensor_equals_original": ["head", "head", "same"]}, ctx) is not None


def test_tensor_shape_and_presence(st_pair):
    inp, out, emb = st_pair
    write_safetensors(out / "model.safetensors", {"emb": emb})
    ctx = ctx_for(out, inp)
    assert passes({"tensor_shape": ["emb", [6, 4]]}, ctx)
    fails_with({"tensor_shape": ["emb", [4, 6]]}, ctx, "[6, 4]", "[4, 6]")
    assert passes({"out_has_tensor": "emb"}, ctx)
    fails_with({"out_has_tensor": "head"}, ctx, "no tensor 'head'", "emb")
    assert passes({"out_lacks_tensor": "head"}, ctx)
    fails_with({"out_lacks_tensor": "emb"}, ctx, "still holds")


def test_out_lacks_tensor_fails_on_stale_index_entry(tmp_path: Path):
    write_sharded_safetensors(
        tmp_path, [{"emb": embedding()}], extra_map={"lm_head.weight": "model-00001-of-00001.safetensors"}
    )
    fails_with({"out_lacks_tensor": "lm_head.weight"}, ctx_for(tmp_path), "stale")


def test_out_lacks_file(st_pair):
    inp, out, emb = st_pair
    ctx = ctx_for(out, inp)
    write_safetensors(out / "model.safetensors", {"emb": emb})
    assert passes({"out_lacks_file": "model-00001-of-00001.safetensors"}, ctx)
    fails_with({"out_lacks_file": "model.safetensors"}, ctx, "holds model.safetensors", "file of")
    (out / "sub").mkdir()
    fails_with({"out_lacks_file": "sub"}, ctx, "a folder")
    fails_with({"out_lacks_file": "x"}, ctx_for(out.parent / "absent", inp), "does not exist")


def test_no_tensor_with_shape(tmp_path: Path):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir(), out.mkdir()
    write_pdparams(inp / "model_state.pdparams", {"emb": embedding(6, 4)})
    grown = embedding(8, 4)
    write_sharded_safetensors(out, [{"emb": grown}, {"head": np.ascontiguousarray(grown.T)}])
    ctx = ctx_for(out, inp)
    assert passes({"no_tensor_with_shape": [6, 4]}, ctx)
    assert passes({"no_tensor_with_shape": [4, 6]}, ctx)
    fails_with({"no_tensor_with_shape": [8, 4]}, ctx, "1 output tensor(s)", "emb")
    fails_with({"no_tensor_with_shape": [4, 8]}, ctx, "head")
    # a stale copy at the old size in an unlisted file counts, though the listed file wins for reading
    write_safetensors(out / "model.safetensors", {"emb": embedding(6, 4)})
    assert cc.read_checkpoint(out).tensors["emb"].shape == (8, 4)
    fails_with({"no_tensor_with_shape": [6, 4]}, ctx, "emb", "model.safetensors")
    fails_with({"no_tensor_with_shape": ["6", 4]}, ctx, "malformed")
    fails_with({"no_tensor_with_shape": [6, 4]}, ctx_for(tmp_path / "absent", inp), "does not exist")


def test_safetensors_metadata(tmp_path: Path):
    emb = embedding()
    write_sharded_safetensors(tmp_path, [{"emb": emb}, {"head": emb}])  # both with {"format": "np"}
    ctx = ctx_for(tmp_path)
    assert passes({"safetensors_metadata": {"format": "np"}}, ctx)
    fails_with({"safetensors_metadata": {"format": "pt"}}, ctx, 'expected "pt", got "np"')
    fails_with({"safetensors_metadata": {"format": "np", "k": "v"}}, ctx, "no 'k'")
    # every file counts: one shard without __metadata__ fails
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"head": emb}, metadata={})
    fails_with(
        {"safetensors_metadata": {"format": "np"}},
        ctx,
        "model-00002-of-00002.safetensors has no __metadata__",
    )
    write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors", {"head": emb}, metadata={"format": "np", "x": "y"}
    )
    assert passes({"safetensors_metadata": {"format": "np"}}, ctx)


def test_safetensors_metadata_needs_a_safetensors_file(tmp_path: Path):
    write_pdparams(tmp_path / "model_state.pdparams", {"emb": embedding()})
    fails_with({"safetensors_metadata": {"format": "pt"}}, ctx_for(tmp_path), "no .safetensors file")
    fails_with(
        {"safetensors_metadata": {"format": "pt"}}, ctx_for(tmp_path / "absent"), "no .safetensors file"
    )


def test_rows_zero(st_pair):
    inp, out, emb = st_pair
    grown = np.concatenate([emb, np.zeros((3, 4), np.float32)])
    write_safetensors(out / "model.safetensors", {"emb": grown})
    ctx = ctx_for(out, inp)
    assert passes({"rows_zero": ["emb", 6, 9]}, ctx)
    assert passes({"rows_equal_input": ["emb", 0, 6]}, ctx)
    fails_with({"rows_zero": ["emb", 6, 10]}, ctx, "does not fit")
    grown[7, 2] = 1e-30
    write_safetensors(out / "model.safetensors", {"emb": grown})
    fails_with({"rows_zero": ["emb", 6, 9]}, ctx, "1 nonzero", "[7, 2]")
    # -0.0 is not zero bytes
    grown[7, 2] = -0.0
    write_safetensors(out / "model.safetensors", {"emb": grown})
    fails_with({"rows_zero": ["emb", 6, 9]}, ctx, "[7, 2]")


def test_rows_equal_input_detects_shift_and_1d(tmp_path: Path):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir(), out.mkdir()
    emb, bias = embedding(), np.arange(1, 7, dtype=np.float32) / 10
    write_pdparams(inp / "model_state.pdparams", {"emb": emb, "bias": bias})
    shifted = np.concatenate([np.zeros((1, 4), np.float32), emb])
    write_pdparams(
        out / "model_state.pdparams",
        {"emb": shifted, "bias": np.concatenate([bias, [0, 0]]).astype(np.float32)},
    )
    ctx = ctx_for(out, inp)
    fails_with({"rows_equal_input": ["emb", 0, 6]}, ctx, "differs from the input")
    assert passes({"rows_equal_input": ["bias", 0, 6]}, ctx)
    assert passes({"rows_zero": ["bias", 6, 8]}, ctx)
    fails_with({"rows_equal_input": ["bias", 0, 7]}, ctx, "does not fit")


def test_cols_checks(tmp_path: Path):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir(), out.mkdir()
    head = np.ascontiguousarray(embedding().T)  # [hidden 4, vocab 6]
    write_pdparams(inp / "model_state.pdparams", {"head": head})
    grown = np.concatenate([head, np.zeros((4, 2), np.float32)], axis=1)
    write_pdparams(out / "model_state.pdparams", {"head": grown})
    ctx = ctx_for(out, inp)
    assert passes({"cols_equal_input": ["head", 0, 6]}, ctx)
    assert passes({"cols_zero": ["head", 6, 8]}, ctx)
    fails_with({"rows_zero": ["head", 2, 4]}, ctx, "nonzero")
    wrong = np.concatenate([head, np.ones((4, 2), np.float32)], axis=1)
    write_pdparams(out / "model_state.pdparams", {"head": wrong})
    fails_with({"cols_zero": ["head", 6, 8]}, ctx, "first at index [0, 6]")


def _bf16_pair(tmp_path: Path, label: str, rows: np.ndarray, cfg: dict):
    """Input with bf16 bits of a [6, 4] embedding and an output with 2 appended rows."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir(exist_ok=True), out.mkdir(exist_ok=True)
    values = embedding()
    values[0] = [1.0, -2.0, -1e6, 0.5]
    bits = to_bf16_bits(values)
    write_safetensors(inp / "model.safetensors", {"emb": bits}, labels={"emb": label})
    write_config(inp, **cfg)
    write_safetensors(
        out / "model.safetensors", {"emb": np.concatenate([bits, rows])}, labels={"emb": "BF16"}
    )
    write_config(out, **cfg)
    decoded = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return ctx_for(out, inp), decoded.mean(axis=0)


@pytest.mark.parametrize("label,cfg", [("BF16", {}), ("U16", {"torch_dtype": "bfloat16"})])
def test_rows_mean_of_input_bf16(tmp_path: Path, label: str, cfg: dict):
    # correct: mean computed on decoded values, rounded back to bf16
    _, mean = _bf16_pair(tmp_path, label, np.zeros((2, 4), np.uint16), cfg)
    good = np.tile(to_bf16_bits(mean.astype(np.float32)), (2, 1))
    ctx, _ = _bf16_pair(tmp_path, label, good, cfg)
    assert passes({"rows_mean_of_input": ["emb", 6, 8, 0.01]}, ctx)
    # wrong 1: mean of the uint16 bit patterns taken as numbers, then re-encoded
    in_bits = cc.read_checkpoint(ctx.input_dir).tensors["emb"]
    as_numbers = np.frombuffer(in_bits.raw, np.uint16).reshape(6, 4).astype(np.float64).mean(axis=0)
    bad = np.tile(to_bf16_bits(as_numbers.astype(np.float32)), (2, 1))
    ctx, _ = _bf16_pair(tmp_path, label, bad, cfg)
    fails_with({"rows_mean_of_input": ["emb", 6, 8, 0.01]}, ctx, "not the input mean row")
    # wrong 2: the integer mean of the bit patterns stored as bits
    bad2 = np.tile(as_numbers.round().astype(np.uint16), (2, 1))
    ctx, _ = _bf16_pair(tmp_path, label, bad2, cfg)
    fails_with({"rows_mean_of_input": ["emb", 6, 8, 0.01]}, ctx)
    # wrong 3: zeros instead of the mean
    ctx, _ = _bf16_pair(tmp_path, label, np.zeros((2, 4), np.uint16), cfg)
    fails_with({"rows_mean_of_input": ["emb", 6, 8, 0.01]}, ctx, "row 6")


def test_rows_mean_of_input_f32_tolerance(st_pair):
    inp, out, emb = st_pair
    mean = emb.astype(np.float64).mean(axis=0)
    rows = np.tile(mean, (2, 1)).astype(np.float32)
    write_safetensors(out / "model.safetensors", {"emb": np.concatenate([emb, rows])})
    ctx = ctx_for(out, inp)
    assert passes({"rows_mean_of_input": ["emb", 6, 8, 1e-5]}, ctx)
    rows[1, 3] += 1e-3
    write_safetensors(out / "model.safetensors", {"emb": np.concatenate([emb, rows])})
    fails_with({"rows_mean_of_input": ["emb", 6, 8, 1e-5]}, ctx, "row 7", "[3]")
    assert passes({"rows_mean_of_input": ["emb", 6, 8, 1e-2]}, ctx)


def test_tensor_scaled_input(st_pair):
    inp, out, emb = st_pair
    write_safetensors(out / "model.safetensors", {"emb": emb * 2})
    ctx = ctx_for(out, inp)
    assert passes({"tensor_scaled_input": ["emb", "emb", 2.0, 1e-6]}, ctx)
    fails_with({"tensor_scaled_input": ["emb", "emb", 3.0, 1e-6]}, ctx, "x 3.0")


def test_tensors_equal_and_same_if_present(st_pair):
    inp, out, emb = st_pair
    write_safetensors(out / "model.safetensors", {"a": emb, "b": emb, "c": emb + 1})
    ctx = ctx_for(out, inp)
    assert passes({"tensors_equal": ["a", "b"]}, ctx)
    fails_with({"tensors_equal": ["a", "c"]}, ctx, "not bitwise equal")
    fails_with({"tensors_equal": ["a", "zzz"]}, ctx, "no tensor 'zzz'")
    assert passes({"same_if_present": ["a", "b"]}, ctx)
    assert passes({"same_if_present": ["a", "zzz"]}, ctx)
    fails_with({"same_if_present": ["a", "c"]}, ctx)
    fails_with({"same_if_present": ["zzz", "a"]}, ctx, "no tensor 'zzz'")


# ---------------------------------------------------------------------------
# Index checks
# ---------------------------------------------------------------------------


def _two_shards():
    return [{"emb": embedding(), "norm": np.ones(4, np.float32)}, {"head": embedding()}]


def test_index_matches_shards_good(tmp_path: Path):
    real = write_sharded_safetensors(tmp_path, _two_shards())
    ctx = ctx_for(tmp_path)
    assert passes({"index_matches_shards": True}, ctx)
    assert passes({"total_size": real}, ctx)
    fails_with({"total_size": real + 1}, ctx, str(real))


def test_index_matches_shards_wrong_total_size(tmp_path: Path):
    real = write_sharded_safetensors(tmp_path, _two_shards(), total_size=999)
    fails_with({"index_matches_shards": True}, ctx_for(tmp_path), "total_size is 999", str(real))


def test_index_matches_shards_unlisted_tensor(tmp_path: Path):
    write_sharded_safetensors(tmp_path, _two_shards(), drop_from_map=("norm",))
    fails_with({"index_matches_shards": True}, ctx_for(tmp_path), "holds norm", "does not list")


def test_index_matches_shards_stale_entry_and_missing_file(tmp_path: Path):
    write_sharded_safetensors(
        tmp_path,
        _two_shards(),
        extra_map={
            "lm_head.weight": "model-00002-of-00002.safetensors",
            "ghost": "model-00003-of-00003.safetensors",
        },
    )
    reason = fails_with({"index_matches_shards": True}, ctx_for(tmp_path), "lm_head.weight")
    assert "model-00003-of-00003.safetensors, which does not exist" in reason


def test_index_matches_shards_wrong_file(tmp_path: Path):
    write_sharded_safetensors(tmp_path, _two_shards(), extra_map={"head": "model-00001-of-00002.safetensors"})
    fails_with({"index_matches_shards": True}, ctx_for(tmp_path), "maps it to model-00001")


def test_index_matches_shards_requires_sharding(st_pair):
    inp, out, emb = st_pair
    write_safetensors(out / "model.safetensors", {"emb": emb})
    fails_with({"index_matches_shards": True}, ctx_for(out, inp), "not sharded")
    fails_with({"total_size": 96}, ctx_for(out, inp), "no index")


# ---------------------------------------------------------------------------
# Config, messages, folders
# ---------------------------------------------------------------------------


def test_config_dotted_paths_and_strict_json(tmp_path: Path):
    write_config(
        tmp_path, tie_word_embeddings=True, vocab_size=20, text_config={"tie_word_embeddings": False}
    )
    (tmp_path / "model_config.json").write_text(
        json.dumps({"init_args": [{"vocab_size": 17}], "init_class": "GPTModel"})
    )
    ctx = ctx_for(tmp_path)
    assert passes({"config": {"tie_word_embeddings": True, "text_config.tie_word_embeddings": False}}, ctx)
    fails_with({"config": {"text_config.tie_word_embeddings": True}}, ctx, "expected true, got false")
    fails_with({"config": {"vocab_size": 21}}, ctx, "got 20")
    fails_with({"config": {"tie_word_embeddings": 1}}, ctx)  # true is not 1
    fails_with({"config": {"text_config.vocab_size": 20}}, ctx, "missing")
    assert passes({"file_json": ["model_config.json", {"init_args.0.vocab_size": 17}]}, ctx)
    fails_with({"file_json": ["model_config.json", {"init_args.0.vocab_size": 20}]}, ctx, "got 17")
    fails_with({"file_json": ["model_config.json", {"init_args.1.vocab_size": 17}]}, ctx, "out of range")
    fails_with({"file_json": ["other.json", {"a": 1}]}, ctx, "no other.json")


def test_message_checks_are_case_insensitive():
    ctx = ctx_for(None, message="Saved 512 bytes; LM_HEAD.weight dropped\nwarning: Mismatch")
    assert passes({"message_mentions_any": ["nothing", "lm_head.weight"]}, ctx)
    fails_with({"message_mentions_any": ["differ", "diverge"]}, ctx, "none of")
    assert passes({"message_mentions_all": ["512", "mismatch"]}, ctx)
    fails_with({"message_mentions_all": ["512", "576"]}, ctx, "'576'")
    assert passes({"message_lacks_any": ["Traceback", "KeyError"]}, ctx)
    fails_with({"message_lacks_any": ["keyerror", "MISMATCH"]}, ctx, "MISMATCH")


def test_input_unchanged(st_pair):
    inp, out, emb = st_pair
    snap = cc.snapshot_tree(inp)
    ctx = ctx_for(out, inp, snapshot=snap)
    assert passes({"input_unchanged": True}, ctx)
    data = bytearray((inp / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (inp / "model.safetensors").write_bytes(bytes(data))
    fails_with({"input_unchanged": True}, ctx, "changed model.safetensors")
    (inp / "model.safetensors").write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))
    assert passes({"input_unchanged": True}, ctx)
    (inp / "sub").mkdir()
    (inp / "sub" / "x.tmp").write_text("x")
    fails_with({"input_unchanged": True}, ctx, "added sub/x.tmp")
    (inp / "sub" / "x.tmp").unlink()
    (inp / "config.json").unlink()
    fails_with({"input_unchanged": True}, ctx, "removed config.json")


def test_no_output(tmp_path: Path):
    out = tmp_path / "out"
    ctx = ctx_for(out)
    assert passes({"no_output": True}, ctx)
    out.mkdir()
    assert passes({"no_output": True}, ctx)
    (out / "config.json").write_text("{}")
    fails_with({"no_output": True}, ctx, "config.json")


def test_unknown_or_malformed_checks_fail(tmp_path: Path):
    ctx = ctx_for(tmp_path)
    assert "unknown check" in cc.run_check({"tensor_is_nice": "x"}, ctx)
    assert "malformed" in cc.run_check({"a": 1, "b": 2}, ctx)
    assert cc.run_check({"tensor_shape": ["x"]}, ctx) is not None  # wrong arity


def test_missing_output_folder_fails_tensor_checks(tmp_path: Path):
    ctx = ctx_for(tmp_path / "absent", tmp_path)
    fails_with({"out_has_tensor": "x"}, ctx, "does not exist")
    fails_with({"out_lacks_tensor": "x"}, ctx, "does not exist")
    fails_with({"config": {"a": 1}}, ctx, "no config.json")


# ---------------------------------------------------------------------------
# Expectation logic
# ---------------------------------------------------------------------------


def test_evaluate_command_expectations(tmp_path: Path):
    out = tmp_path / "out"
    ok_cmd = {"expect": "ok", "checks": []}
    refuse_cmd = {"expect": "refuse", "checks": [{"no_output": True}]}
    either_cmd = {
        "expect": "either",
        "checks": [{"message_mentions_any": ["layout"]}],
        "checks_if_ok": [{"out_has_tensor": "emb"}],
        "checks_if_refuse": [{"no_output": True}],
    }
    quiet = ctx_for(out, message="refusing: layout is ambiguous")
    crash = ctx_for(out, message="Traceback (most recent call last):\n KeyError: 'layout'")
    assert cc.evaluate_command(ok_cmd, 0, quiet) == []
    assert "exit code 1" in cc.evaluate_command(ok_cmd, 1, quiet)[0]
    assert cc.evaluate_command(ok_cmd, None, quiet)  # timeout
    assert cc.evaluate_command(refuse_cmd, 2, quiet) == []
    assert "traceback" in cc.evaluate_command(refuse_cmd, 1, crash)[0].lower()
    assert "exit code 0" in cc.evaluate_command(refuse_cmd, 0, quiet)[0]
    # either: refusal path applies checks_if_refuse only
    assert cc.evaluate_command(either_cmd, 1, quiet) == []
    assert any("traceback" in f.lower() for f in cc.evaluate_command(either_cmd, 1, crash))
    # either: success path applies checks_if_ok (output missing -> fails)
    failures = cc.evaluate_command(either_cmd, 0, quiet)
    assert len(failures) == 1 and "out_has_tensor" in failures[0]
    # all failing checks are reported, not only the first
    many = {"expect": "ok", "checks": [{"out_has_tensor": "a"}, {"message_mentions_any": ["zzz"]}]}
    assert len(cc.evaluate_command(many, 3, quiet)) == 3


def test_tensor_equals_input_file(tmp_path):
    """The copy of a tensor in one named rank file: equal passes, the other rank's differing copy fails, a
    file or name the input lacks fails naming it."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    out.mkdir()
    a, b = embedding(), embedding() + 1
    write_pdparams(inp / "model_state.moe_sharding00.pdparams", {"w": a})
    write_pdparams(inp / "model_state.moe_sharding01.pdparams", {"w": b})
    write_pdparams(out / "model_state.pdparams", {"w": a})
    ctx = ctx_for(out, inp)
    assert passes(
        {"tensor_equals_input_file": ["w", "model_state.moe_sharding00.pdparams", "w", "same"]}, ctx
    )
    fails_with(
        {"tensor_equals_input_file": ["w", "model_state.moe_sharding01.pdparams", "w", "same"]}, ctx, "w"
    )
    fails_with(
        {"tensor_equals_input_file": ["w", "model_state.moe_sharding02.pdparams", "w", "same"]},
        ctx,
        "sharding02",
    )
    fails_with(
        {"tensor_equals_input_file": ["w", "model_state.moe_sharding00.pdparams", "x", "same"]}, ctx, "x"
    )


# ---------------------------------------------------------------------------
# encodes: the output's tokenizer as each library loads it
# ---------------------------------------------------------------------------

TOKENIZERS = paths.TOKENIZERS
E01_CKPT = TOKENIZERS.parent / "cases" / "e01_ernie3_wordpiece_lowercase_add_tokens" / "ckpt"


def _with_added_token(tmp_path: Path, content: str) -> tuple[Path, int]:
    """A copy of the trained byte-level BPE folder whose tokenizer.json and tokenizer_config.json
    (transformers 5 reads its ``added_tokens_decoder``) gain ``content`` as an added token at the next id
    (the oracle: the id the files give it)."""
    out = tmp_path / "out"
    shutil.copytree(TOKENIZERS / "bytelevel_bpe", out)
    data = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    new_id = max([*data["model"]["vocab"].values(), *(t["id"] for t in data["added_tokens"])]) + 1
    entry = {"id": new_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False}
    data["added_tokens"].append({**entry, "normalized": False, "special": True})
    (out / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    decoder = config.setdefault("added_tokens_decoder", {})
    decoder[str(new_id)] = {**entry, "normalized": False, "special": True}
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out, new_id


def test_encodes_tokenizers_reads_tokenizer_json(tmp_path: Path):
    """An added token of tokenizer.json encodes as its id; a wrong list fails with what was seen; a folder
    without tokenizer.json and an unknown loader fail."""
    out, new_id = _with_added_token(tmp_path, "<cc_probe>")
    ctx = ctx_for(out)
    assert passes({"encodes": ["tokenizers", "<cc_probe>", [new_id]]}, ctx)
    fails_with({"encodes": ["tokenizers", "<cc_probe>", [new_id + 1]]}, ctx, str(new_id), "expected")
    (out / "tokenizer.json").unlink()
    fails_with({"encodes": ["tokenizers", "<cc_probe>", [new_id]]}, ctx, "tokenizer.json")
    fails_with({"encodes": ["tiktoken", "x", [1]]}, ctx, "unknown loader")
    fails_with({"encodes": ["tokenizers", "x", [1]]}, ctx_for(tmp_path / "none"), "does not exist")


def test_encodes_sentencepiece_adds_no_bos_and_skips_a_tiktoken_model(tmp_path: Path):
    """The folder's loadable ``*.model`` (a tiktoken rank file named ``.model`` beside it is skipped), no
    BOS added: the ids are the library's own ``EncodeAsIds``, whose first id is not the BOS id."""
    import sentencepiece as spm

    out = tmp_path / "out"
    shutil.copytree(TOKENIZERS / "sp_bpe", out)
    shutil.copy(TOKENIZERS / "tiktoken" / "qwen.tiktoken", out / "a_tiktoken.model")
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZERS / "sp_bpe" / "tokenizer.model"))
    ids = list(sp.EncodeAsIds("hello world"))
    assert ids and ids[0] != sp.bos_id()
    ctx = ctx_for(out)
    assert passes({"encodes": ["sentencepiece", "hello world", ids]}, ctx)
    fails_with({"encodes": ["sentencepiece", "hello world", [sp.bos_id(), *ids]]}, ctx, "sentencepiece")
    (out / "tokenizer.model").unlink()
    fails_with({"encodes": ["sentencepiece", "hello world", ids]}, ctx, "a_tiktoken.model")


def test_encodes_transformers_in_a_child_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """transformers' AutoTokenizer (a child of this interpreter, no special tokens added) gives the added
    token its id; every encodes check of one command with the same loader runs in one child."""
    out, new_id = _with_added_token(tmp_path, "<cc_probe>")
    calls = []
    real_run = preload.run  # casecheck starts its children through support.preload
    monkeypatch.setattr(preload, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    command = {
        "expect": "ok",
        "checks": [
            {"encodes": ["transformers", "<cc_probe>", [new_id]]},
            {"encodes": ["transformers", "<cc_probe><cc_probe>", [new_id, new_id]]},
            {"encodes": ["transformers", "<cc_probe>", [0]]},
        ],
    }
    failures = cc.evaluate_command(command, 0, ctx_for(out))
    assert len(calls) == 1
    assert len(failures) == 1 and "expected [0]" in failures[0]


@pytest.mark.pnlp
def test_encodes_paddlenlp_reads_added_tokens_json(tmp_path: Path):
    """PaddleNLP 2.8.1's AutoTokenizer (ErnieTokenizer, do_lower_case) of the e01 folder: without
    added_tokens.json "covid" is the WordPiece pieces of vocab.txt lines 14..18; with {"covid": 24} it is 24,
    and so are "COVID" (lower-cased first) and the word inside a sentence (vocab lines 9 and 11)."""
    out = tmp_path / "out"
    shutil.copytree(E01_CKPT, out)
    ctx = ctx_for(out)
    assert passes({"encodes": ["paddlenlp-2.8", "covid", [14, 15, 16, 17, 18]]}, ctx)
    (out / "added_tokens.json").write_text(json.dumps({"covid": 24}), encoding="utf-8")
    command = {
        "expect": "ok",
        "checks": [
            {"encodes": ["paddlenlp-2.8", "covid", [24]]},
            {"encodes": ["paddlenlp-2.8", "COVID", [24]]},
            {"encodes": ["paddlenlp-2.8", "a COVID case", [9, 24, 11]]},
            {"encodes": ["paddlenlp-2.8", "COVID", [14, 15, 16, 17, 18]]},
        ],
    }
    failures = cc.evaluate_command(command, 0, ctx_for(out))
    assert len(failures) == 1 and "expected [14, 15, 16, 17, 18]" in failures[0]


def test_encodes_paddlenlp_without_pnlp_python_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Without PNLP_PYTHON the check fails naming it (it never passes unjudged)."""
    monkeypatch.delenv("PNLP_PYTHON", raising=False)
    fails_with({"encodes": ["paddlenlp-2.8", "covid", [24]]}, ctx_for(E01_CKPT), "PNLP_PYTHON")


# Flex checkpoints (support/casecheck_flex.py) against Paddle's own load_state_dict

FLEX_DATA = paths.FLEX


@pytest.mark.parametrize(
    "folder, oracles",
    [
        ("ranks2", {"": "oracle"}),
        ("ranks2_replicas", {"": "oracle"}),
        ("flat2", {"": "oracle"}),
        ("mesh2x2", {"": "oracle"}),
        (
            "trainer_2rank/checkpoint-2",
            {"": "oracle", "optimizer_state/": "oracle_optimizer", "master_weight/": "oracle_master_weight"},
        ),
    ],
)
def test_flex_reader_equals_paddle_load_state_dict(folder, oracles):
    """The checker reads a flex checkpoint (split, replicated, flattened, 2-D mesh slices; a Trainer
    checkpoint's three state folders) as ``paddle.distributed.load_state_dict`` fills it: every tensor of
    the folder's oracles (tests/data/flex/README.md) bit for bit, under its name (``optimizer_state/`` and
    ``master_weight/`` prefixed), and nothing else."""
    ck = cc.read_checkpoint(FLEX_DATA / folder)
    assert not ck.problems, ck.problems
    base = FLEX_DATA / folder.split("/")[0]
    want: dict[str, np.ndarray] = {}
    for prefix, oracle in oracles.items():
        with np.load(base / f"{oracle}.npz") as z:
            want.update({prefix + k: z[k] for k in z.files})
    assert set(ck.tensors) == set(want)
    for name, a in want.items():
        t = ck.tensors[name]
        assert (t.shape, t.raw) == (a.shape, np.ascontiguousarray(a).tobytes()), name


def test_flex_reader_refuses_a_foreign_global(tmp_path):
    """A ``.metadata`` naming a global other than paddle's three records is a read problem, never run."""
    (tmp_path / "0.metadata").write_bytes(pickle.dumps({"state_dict_metadata": Path("x")}, protocol=4))
    ck = cc.read_checkpoint(tmp_path)
    assert ck.problems and not ck.tensors
