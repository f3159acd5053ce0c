"""Every dtype the safetensors format defines is read and copied as bytes (issue 17, item 4; case d04).

The oracle is the ``safetensors`` library itself (0.8): its writer (``serialize_file`` with ``TensorSpec``,
which takes every dtype it can write, float8 / float4 / complex included) makes the inputs, and its reader
(``safe_open``) must open both the inputs and every output with the labels and shapes planned. The
dtypes it reads but cannot write (``F6_E2M3``, ``F6_E3M2``) are written by hand as the format specifies and
shown to open with ``safe_open`` first.

What tietool must do with them: every tensor it does not change is copied byte for byte with its label
through tie / untie / resize / convert --to safetensors; a vocabulary tensor in a dtype it cannot compute
in (float8, float4, float6, complex) is refused by name with the dtype named (exit 5), and a dtype a
``.pdparams`` cannot hold stops ``convert --to pdparams`` by name; never "damaged".
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import TensorSpec, safe_open, serialize_file
from support import preload

import tietool
from tietool.surgery.io import safetensors_io
from tietool.surgery.model.errors import CheckpointError, ExitCode, RefusedError
from tietool.surgery.model.tensor import DTYPES

# TensorSpec dtype name (what the library's writer takes) -> the header label it writes
LIBRARY_WRITES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "complex64": "C64",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
    "float4_e2m1fn_x2": "F4",
}
READ_ONLY = ("F6_E2M3", "F6_E3M2")  # safe_open reads them; TensorSpec has no name for them
V, H = 16, 8


def _lib_write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], meta=None) -> None:
    """Write ``{name: (TensorSpec dtype, shape, raw bytes)}`` with the safetensors library's own writer
    (for ``float4_e2m1fn_x2`` the shape is the storage shape, bytes; the library doubles the last axis)."""
    keep = []
    specs = {}
    for name, (dtype, shape, raw) in tensors.items():
        buf = ctypes.create_string_buffer(raw, max(1, len(raw)))
        keep.append(buf)
        specs[name] = TensorSpec(dtype=dtype, shape=shape, data_ptr=ctypes.addressof(buf), data_len=len(raw))
    serialize_file(specs, str(path), meta)


def _hand_write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file written per the format (8-byte length, JSON header, data), for labels the
    library's writer lacks; each test shows ``safe_open`` opens it."""
    header, pos, data = {}, 0, b""
    for name, (label, shape, raw) in tensors.items():
        header[name] = {"dtype": label, "shape": shape, "data_offsets": [pos, pos + len(raw)]}
        pos, data = pos + len(raw), data + raw
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def _opened(path: Path) -> dict[str, tuple[str, list[int]]]:
    """What the safetensors library sees: name -> (label, shape)."""
    with safe_open(str(path), framework="numpy") as f:
        return {n: (str(f.get_slice(n).get_dtype()), list(f.get_slice(n).get_shape())) for n in f.keys()}


def _raw(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor's label, shape and stored bytes, from the header (any dtype)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n :]
    spans = {k: h["data_offsets"] for k, h in header.items()}
    return {k: (h["dtype"], h["shape"], data[spans[k][0] : spans[k][1]]) for k, h in header.items()}


def _bytes(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _extras() -> dict[str, tuple[str, list[int], bytes]]:
    """One tensor of every dtype the library writes, under layer names that are no vocabulary tensor
    (shape [3, 4]: no axis of V or H). Bytes are random: every bit pattern, NaNs and all."""
    out = {}
    for i, (dtype, label) in enumerate(LIBRARY_WRITES.items()):
        shape = [3, 2] if dtype == "float4_e2m1fn_x2" else [3, 4]  # F4: 3 x 2 bytes = [3, 4] elements
        n = 6 if dtype == "float4_e2m1fn_x2" else 12 * DTYPES[label].itemsize
        raw = _bytes(n, i)
        if dtype == "bool":
            raw = bytes(b & 1 for b in raw)
        out[f"model.layers.0.mlp.experts.{i}.{label.lower()}"] = (dtype, shape, raw)
    return out


def _config(tied: bool) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",  # bfloat16 would relabel U16 as BF16 (b17: bf16 bits), on purpose
        "paddleformers_version": "1.2.0",
    }


def _ckpt(tmp_path: Path, tied: bool = False, head: bool = True, name: str = "ckpt") -> Path:
    """A Llama-named checkpoint in BF16 whose layer also holds a tensor of every library-written dtype."""
    d = tmp_path / name
    d.mkdir()
    emb = _bytes(V * H * 2, 100)
    tensors = {"model.embed_tokens.weight": ("bfloat16", [V, H], emb)}
    tensors |= {"model.norm.weight": ("bfloat16", [H], _bytes(H * 2, 101))} | _extras()
    if head:
        tensors["lm_head.weight"] = ("bfloat16", [V, H], emb if tied else _bytes(V * H * 2, 102))
    _lib_write(d / "model.safetensors", tensors, {"format": "pt"})
    (d / "config.json").write_text(json.dumps(_config(tied)))
    return d


def _assert_extras_copied(src: Path, out: Path) -> None:
    """Every non-vocabulary tensor of ``src`` is in ``out`` with the same label, shape and bytes, and the
    safetensors library opens every output file with those labels and shapes."""
    before = _raw(src / "model.safetensors")
    after: dict[str, tuple[str, list[int], bytes]] = {}
    for f in sorted(out.glob("*.safetensors")):
        after |= _raw(f)
        assert {n: (v[0], v[1]) for n, v in _raw(f).items()} == _opened(f)
    for name, (label, shape, raw) in before.items():
        if ".experts." in name:
            assert after[name] == (label, shape, raw), name


# ------------------------------------------------------------------ the format's list, against the library


def test_every_library_written_dtype_is_in_the_table(tmp_path):
    """Each dtype the safetensors writer takes gives a label tietool knows, sized as tietool sizes it, and
    tietool's header reader agrees with ``safe_open`` on every tensor of the file."""
    p = tmp_path / "all.safetensors"
    _lib_write(p, _extras())
    seen = _opened(p)
    assert {label for label, _ in seen.values()} == set(LIBRARY_WRITES.values())
    infos, _ = safetensors_io.read_header(p, p.name)
    assert {t.name: (t.dtype, list(t.shape)) for t in infos} == seen
    for t in infos:
        assert DTYPES[t.dtype].nbytes(t.numel) == t.nbytes


@pytest.mark.parametrize("label", READ_ONLY)
def test_float6_written_per_spec_opens_in_the_library_and_in_tietool(tmp_path, label):
    """F6: four elements in three bytes. The library opens a [2, 4] tensor of 6 bytes; tietool too."""
    p = tmp_path / "f6.safetensors"
    _hand_write(p, {"x": (label, [2, 4], _bytes(6, 1))})
    assert _opened(p) == {"x": (label, [2, 4])}
    (t,), _ = safetensors_io.read_header(p, p.name)
    assert (t.dtype, t.shape, t.nbytes) == (label, (2, 4), 6)


def test_table_holds_exactly_the_formats_dtypes():
    assert set(DTYPES) == set(LIBRARY_WRITES.values()) | set(READ_ONLY)


@pytest.mark.parametrize(
    "label, shape, nbytes", [("F4", [3], 2), ("F4", [3], 1), ("F6_E2M3", [2], 2), ("F6_E3M2", [3], 3)]
)
def test_sub_byte_tensor_off_a_byte_boundary_refused_like_the_library(tmp_path, label, shape, nbytes):
    """numel × bits not a multiple of 8: the library refuses the file, tietool too (exit 3)."""
    p = tmp_path / "bad.safetensors"
    _hand_write(p, {"x": (label, shape, _bytes(nbytes, 2))})
    with pytest.raises(Exception, match="byte boundary"):
        _opened(p)
    with pytest.raises(CheckpointError, match="whole bytes"):
        safetensors_io.read_header(p, p.name)


def test_a_label_the_format_lacks_is_not_called_damaged_first(tmp_path):
    p = tmp_path / "odd.safetensors"
    _hand_write(p, {"x": ("F8_E3M4", [2], b"\0\0")})
    with pytest.raises(Exception):  # noqa: B017 - the library refuses it too, in its own words
        _opened(p)
    with pytest.raises(CheckpointError) as ei:
        safetensors_io.read_header(p, p.name)
    assert "not a safetensors dtype" in str(ei.value) and "F8_E3M4" in str(ei.value)


# ------------------------------------------------------------------ copied bit for bit by every operation


def test_resize_copies_every_dtype_bit_for_bit(tmp_path):
    src = _ckpt(tmp_path)
    out = tmp_path / "out"
    tietool.resize(src, 20, out, init="zeros")
    _assert_extras_copied(src, out)
    assert _raw(out / "model.safetensors")["model.embed_tokens.weight"][1] == [20, H]
    assert tietool.verify(src, out).exit_code == ExitCode.OK


def test_tie_and_untie_copy_every_dtype_bit_for_bit(tmp_path):
    src = _ckpt(tmp_path, tied=True)
    tietool.tie(src, tmp_path / "tied")
    _assert_extras_copied(src, tmp_path / "tied")
    assert tietool.verify(src, tmp_path / "tied").exit_code == ExitCode.OK
    bare = _ckpt(tmp_path, tied=True, head=False, name="bare")
    tietool.untie(bare, tmp_path / "untied")
    _assert_extras_copied(bare, tmp_path / "untied")
    assert "lm_head.weight" in _raw(tmp_path / "untied" / "model.safetensors")


def test_convert_to_safetensors_copies_every_dtype_bit_for_bit(tmp_path):
    src = _ckpt(tmp_path)
    tietool.convert(src, "safetensors", tmp_path / "out", max_shard_size="1000")  # several shards
    assert len(list((tmp_path / "out").glob("*.safetensors"))) > 1
    _assert_extras_copied(src, tmp_path / "out")


def test_float6_copied_bit_for_bit(tmp_path):
    """F6 (read-only in the library): a checkpoint whose file is written by hand, opened by safe_open."""
    d = tmp_path / "ckpt"
    d.mkdir()
    emb = _bytes(V * H * 4, 3)
    f6 = {f"model.layers.0.q.{lb.lower()}": (lb, [3, 4], _bytes(9, i)) for i, lb in enumerate(READ_ONLY)}
    _hand_write(d / "model.safetensors", {"model.embed_tokens.weight": ("F32", [V, H], emb)} | f6)
    assert set(_opened(d / "model.safetensors")) == {"model.embed_tokens.weight", *f6}
    (d / "config.json").write_text(json.dumps(_config(True)))
    tietool.resize(d, 20, tmp_path / "out", init="zeros")
    after = _raw(tmp_path / "out" / "model.safetensors")
    assert {n: after[n] for n in f6} == f6
    assert _opened(tmp_path / "out" / "model.safetensors")["model.layers.0.q.f6_e2m3"] == ("F6_E2M3", [3, 4])


# ------------------------------------------------------------------ refused by name, never damage


def test_convert_to_pdparams_refuses_a_dtype_it_cannot_hold(tmp_path):
    src = _ckpt(tmp_path)
    # not written by PaddleFormers: its .pdparams of the HF layout would be refused first, for its layout
    cfg = json.loads((src / "config.json").read_text())
    del cfg["paddleformers_version"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RefusedError) as ei:
        tietool.convert(src, "pdparams", tmp_path / "out")
    msg = str(ei.value)
    assert ei.value.exit_code == ExitCode.REFUSED and ".pdparams cannot hold" in msg
    named = [lb for n, (_, _, _) in _extras().items() if n in msg for lb in [n.rsplit(".", 1)[1].upper()]]
    assert len(named) == 1 and DTYPES[named[0]].np_name is None and named[0] in msg, msg  # by name, label
    assert not (tmp_path / "out").exists()


_PADDLE_F8 = """
import numpy as np, paddle
x = paddle.to_tensor(np.array([1.0, -0.5], np.float32)).astype(paddle.float8_e4m3fn)
paddle.save({"a": x}, "OUT")
print(paddle.load("OUT")["a"].dtype)
"""


def test_paddle_pdparams_loses_float8(tmp_path):
    """Why convert --to pdparams refuses float8 rather than writing its bytes as uint8: paddle.save itself
    pickles a float8 tensor as an int8 array, and paddle.load gives int8 back (paddle 3)."""
    if importlib.util.find_spec("paddle") is None:  # not imported here: paddle costs seconds and threads
        pytest.skip("paddle is not installed")
    code = _PADDLE_F8.replace("OUT", str(tmp_path / "f8.pdparams"))
    run = preload.run(
        [sys.executable, "-c", code], libs=("paddle",), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "paddle.int8"


@pytest.mark.parametrize("label", ["F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "C64"])
@pytest.mark.parametrize("role", ["embedding", "head"])
def test_vocabulary_tensor_in_an_undecodable_dtype_refused_by_name(tmp_path, label, role):
    d = tmp_path / "ckpt"
    d.mkdir()
    size = DTYPES[label].nbytes(V * H)
    bf16 = ("BF16", [V, H], _bytes(V * H * 2, 7))
    odd = (label, [V, H], _bytes(size, 8))
    emb, head = (odd, bf16) if role == "embedding" else (bf16, odd)
    _hand_write(d / "model.safetensors", {"model.embed_tokens.weight": emb, "lm_head.weight": head})
    assert _opened(d / "model.safetensors")["lm_head.weight"][0] == head[0]
    (d / "config.json").write_text(json.dumps(_config(False)))
    for call in (
        lambda: tietool.resize(d, 20, tmp_path / "out", init="zeros"),
        lambda: tietool.tie(d, tmp_path / "out", keep="embedding"),
        lambda: tietool.untie(d, tmp_path / "out"),
    ):
        with pytest.raises(RefusedError) as ei:
            call()
        msg = str(ei.value)
        assert label in msg and "damaged" not in msg and "re-download" not in msg, msg
        assert ("model.embed_tokens.weight" if role == "embedding" else "lm_head.weight") in msg
        assert not (tmp_path / "out").exists()


def test_float8_head_bias_refused_by_resize(tmp_path):
    """A vocabulary tensor beyond the embedding and head (a [V] head bias, here F8_E8M0) is refused by name
    when resize would have to grow it; the file itself is valid."""
    d = tmp_path / "ckpt"
    d.mkdir()
    emb = ("BF16", [V, H], _bytes(V * H * 2, 9))
    tensors = {"model.embed_tokens.weight": emb, "lm_head.weight": ("BF16", [V, H], _bytes(V * H * 2, 10))}
    tensors["lm_head.bias"] = ("F8_E8M0", [V], _bytes(V, 11))
    _hand_write(d / "model.safetensors", tensors)
    assert _opened(d / "model.safetensors")["lm_head.bias"] == ("F8_E8M0", [V])
    (d / "config.json").write_text(json.dumps(_config(False)))
    with pytest.raises(RefusedError) as ei:
        tietool.resize(d, 20, tmp_path / "out", init="zeros")
    assert "lm_head.bias" in str(ei.value) and "F8_E8M0" in str(ei.value)
    assert not (tmp_path / "out").exists()
