"""Deterministic corpus of corrupt checkpoints, built from a few small fixtures.

    cd tests && python -m support.corrupt_corpus DEST   # writes DEST/<variant>/ for every variant

Every variant is a copy of one fixture with one mutation: truncation at many offsets, bit flips in the
safetensors header (and its length field) and in the pickle opcodes, wrong lengths, bad JSON in config.json
and the index, huge declared sizes (a header length of 2**60, a BINBYTES8 of 2**60, shapes whose element count
overflows), wrong dtypes, empty files, folders where files should be. A few mutations are meant to be harmless
(a flipped bit inside tensor data): the tool may accept those.

Random choices come from ``random.Random(<variant name>)``, so the corpus is the same on every machine and
every run. Nothing here imports ``tietool``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from support import adversarial_support as av
from support.adversarial_support import FakeArray

# base name -> (fixture, optional transform of the fresh copy)
ST = "st"  # pf_llama_tied_fp32: model-00001-of-00001.safetensors + index (PaddleFormers)
ST1 = "st1"  # the same, as a single model.safetensors without index
STS = "sts"  # pf_llama_tied_sharded: 9 shards + index
PD = "pd"  # pnlp_llama_untied: model_state.pdparams (PaddleNLP 2.8)
PDS = "pds"  # pnlp_llama_untied_sharded: 8 pdparams shards + index

STF = av.ST_ONE_FILE
PDF = av.PD_FILE


def _to_single(d: Path) -> None:
    (d / STF).rename(d / "model.safetensors")
    (d / av.ST_INDEX).unlink()


BASES: dict[str, tuple[str, Callable[[Path], None] | None]] = {
    ST: (av.ST_ONE, None),
    ST1: (av.ST_ONE, _to_single),
    STS: (av.ST_SHARDED, None),
    PD: (av.PD_ONE, None),
    PDS: (av.PD_SHARDED, None),
}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    base: str
    kind: str
    apply: Callable[[Path, random.Random], None]
    harmless: bool = False  # expected to be accepted (but a refusal is not a failure)


# ------------------------------------------------------------------------------------------ mutations
def _rw(rel: str, fn: Callable[[bytes, random.Random], bytes]) -> Callable[[Path, random.Random], None]:
    def apply(d: Path, rng: random.Random) -> None:
        p = d / rel
        p.write_bytes(fn(p.read_bytes(), rng))

    return apply


def _cut(at: Callable[[bytes], int]) -> Callable[[bytes, random.Random], bytes]:
    return lambda raw, rng: raw[: max(0, min(len(raw), at(raw)))]


def _flip_in(
    lo: Callable[[bytes], int], hi: Callable[[bytes], int]
) -> Callable[[bytes, random.Random], bytes]:
    def fn(raw: bytes, rng: random.Random) -> bytes:
        b = bytearray(raw)
        i = rng.randrange(lo(raw), hi(raw))
        b[i] ^= 1 << rng.randrange(8)
        return bytes(b)

    return fn


def _flip_at(i: int) -> Callable[[bytes, random.Random], bytes]:
    def fn(raw: bytes, rng: random.Random) -> bytes:
        b = bytearray(raw)
        b[i] ^= 1 << rng.randrange(8)
        return bytes(b)

    return fn


def _hlen(raw: bytes) -> int:
    return av.st_header_len(raw)


def _set_len(value: Callable[[bytes], int]) -> Callable[[bytes, random.Random], bytes]:
    return lambda raw, rng: struct.pack("<Q", value(raw) % 2**64) + raw[8:]


def _header_json(fn: Callable[[dict], object]) -> Callable[[bytes, random.Random], bytes]:
    """Rewrite the header (JSON of whatever ``fn`` returns, or the edited dict) keeping the data bytes."""

    def edit(raw: bytes, rng: random.Random) -> bytes:
        header, data = av.st_parse(raw)
        new = fn(header)
        obj = header if new is None else new
        blob = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        return struct.pack("<Q", len(blob)) + blob + data

    return edit


def _tset(name: str, key: str, value) -> Callable[[dict], None]:
    def fn(h: dict) -> None:
        h[name][key] = value

    return fn


def _shape_zero_bytes(name: str, shape: list[int]) -> Callable[[dict], None]:
    def fn(h: dict) -> None:
        b = h[name]["data_offsets"][0]
        h[name]["shape"] = shape
        h[name]["data_offsets"] = [b, b]

    return fn


def _pd_opcodes(raw: bytes) -> list[tuple[int, str]]:
    return av.opcode_positions(raw)


def _pd_flip_opcode(raw: bytes, rng: random.Random) -> bytes:
    ops = [pos for pos, name in _pd_opcodes(raw) if name != "STOP"]
    b = bytearray(raw)
    i = rng.choice(ops)
    b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _pd_structure_ranges(raw: bytes) -> list[int]:
    """Byte positions that are not array payload (opcodes and their arguments)."""
    import pickletools

    skip = set()
    for op, arg, pos in pickletools.genops(raw):
        if op.name in ("BINBYTES", "BINBYTES8") and isinstance(arg, bytes) and len(arg) > 64:
            hdr = 5 if op.name == "BINBYTES" else 9
            skip.update(range(pos + hdr, pos + hdr + len(arg)))
    return [i for i in range(len(raw)) if i not in skip]


def _pd_flip_structure(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    i = rng.choice(_pd_structure_ranges(raw))
    b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _pd_flip_payload(raw: bytes, rng: random.Random) -> bytes:
    pos, op, n = av.pd_first_payload(raw)
    hdr = 5 if op == 0x42 else 9
    b = bytearray(raw)
    i = pos + hdr + rng.randrange(n)
    b[i] ^= 1 << rng.randrange(7)  # never the sign bit of a float's top byte: still a tensor either way
    return bytes(b)


def _pd_payload_len(
    delta: int | None = None, value: int | None = None
) -> Callable[[bytes, random.Random], bytes]:
    """Change the declared length of the first BINBYTES (or make it a BINBYTES8 of ``value``)."""

    def fn(raw: bytes, rng: random.Random) -> bytes:
        pos, op, n = av.pd_first_payload(raw)
        assert op == 0x42, "the fixture's first payload is a BINBYTES"
        if value is not None and value >= 2**32:
            return raw[:pos] + b"\x8e" + struct.pack("<Q", value) + raw[pos + 5 :]
        new = n + delta if value is None else value
        return raw[: pos + 1] + struct.pack("<I", new % 2**32) + raw[pos + 5 :]

    return fn


def _pd_insert_after_proto(blob: bytes) -> Callable[[bytes, random.Random], bytes]:
    """Insert opcodes right after PROTO/FRAME, before the top-level dict is built."""

    def fn(raw: bytes, rng: random.Random) -> bytes:
        ops = _pd_opcodes(raw)
        at = next(pos for pos, name in ops if name not in ("PROTO", "FRAME"))
        return raw[:at] + blob + raw[at:]

    return fn


def _pd_frame_len(value: int) -> Callable[[bytes, random.Random], bytes]:
    def fn(raw: bytes, rng: random.Random) -> bytes:
        assert raw[2] == 0x95
        return raw[:3] + struct.pack("<Q", value) + raw[11:]

    return fn


def _pd_short_unicode_len(delta: int) -> Callable[[bytes, random.Random], bytes]:
    def fn(raw: bytes, rng: random.Random) -> bytes:
        pos = next(p for p, name in _pd_opcodes(raw) if name == "SHORT_BINUNICODE")
        b = bytearray(raw)
        b[pos + 1] = (b[pos + 1] + delta) % 256
        return bytes(b)

    return fn


def _pd_array(key: str, fake: FakeArray) -> Callable[[Path, random.Random], None]:
    def apply(d: Path, rng: random.Random) -> None:
        sd = av.pd_state()
        sd[key] = fake
        av.pd_dump(sd, d / PDF, 4)

    return apply


def _write(rel: str, content: bytes) -> Callable[[Path, random.Random], None]:
    def apply(d: Path, rng: random.Random) -> None:
        (d / rel).write_bytes(content)

    return apply


def _dir(rel: str) -> Callable[[Path, random.Random], None]:
    def apply(d: Path, rng: random.Random) -> None:
        p = d / rel
        if p.exists():
            p.unlink()
        p.mkdir()

    return apply


def _json_edit(rel: str, fn: Callable[[object], object]) -> Callable[[Path, random.Random], None]:
    def apply(d: Path, rng: random.Random) -> None:
        p = d / rel
        data = json.loads(p.read_text())
        new = fn(data)
        p.write_text(json.dumps(data if new is None else new))

    return apply


def _cfg(key: str, value) -> Callable[[Path, random.Random], None]:
    def fn(c: dict) -> None:
        c[key] = value

    return _json_edit("config.json", fn)


EMB, NORM, HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
DEEP = b"[" * 100_000 + b"]" * 100_000


# ------------------------------------------------------------------------------------------ the corpus
def variants() -> list[Variant]:
    v: list[Variant] = []

    def add(name: str, base: str, kind: str, apply, harmless: bool = False) -> None:
        v.append(Variant(name, base, kind, apply, harmless))

    # -- safetensors: truncation
    cuts = {
        "0": lambda r: 0,
        "1": lambda r: 1,
        "4": lambda r: 4,
        "7": lambda r: 7,
        "8": lambda r: 8,
        "9": lambda r: 9,
        "hdr_quarter": lambda r: 8 + _hlen(r) // 4,
        "hdr_half": lambda r: 8 + _hlen(r) // 2,
        "hdr_end-1": lambda r: 8 + _hlen(r) - 1,
        "hdr_end": lambda r: 8 + _hlen(r),
        "hdr_end+1": lambda r: 8 + _hlen(r) + 1,
        "data+100": lambda r: 8 + _hlen(r) + 100,
        "half": lambda r: len(r) // 2,
        "end-4": lambda r: len(r) - 4,
        "end-1": lambda r: len(r) - 1,
    }
    for k, at in cuts.items():
        add(f"st_trunc_{k}", ST, "truncate", _rw(STF, _cut(at)))
    for k in ("8", "hdr_half", "hdr_end", "half", "end-1"):
        add(f"st1_trunc_{k}", ST1, "truncate", _rw("model.safetensors", _cut(cuts[k])))
    add("sts_trunc_shard5_half", STS, "truncate", _rw("model-00005-of-00009.safetensors", _cut(cuts["half"])))
    add(
        "sts_trunc_shard8_hdr",
        STS,
        "truncate",
        _rw("model-00008-of-00009.safetensors", _cut(cuts["hdr_half"])),
    )
    # -- safetensors: bit flips
    for i in range(32):
        add(f"st_flip_header_{i:02d}", ST, "flip", _rw(STF, _flip_in(lambda r: 8, lambda r: 8 + _hlen(r))))
    for i in range(8):
        add(f"st_flip_length_byte{i}", ST, "flip", _rw(STF, _flip_at(i)))
    for i in range(4):
        add(f"st_flip_data_{i}", ST, "flip", _rw(STF, _flip_in(lambda r: 8 + _hlen(r), len)), harmless=True)
    # -- safetensors: wrong and huge lengths
    for k, fn in {
        "n-1": lambda r: _hlen(r) - 1,
        "n+1": lambda r: _hlen(r) + 1,
        "n-8": lambda r: _hlen(r) - 8,
        "n+8": lambda r: _hlen(r) + 8,
        "0": lambda r: 0,
        "1": lambda r: 1,
        "2**60": lambda r: 2**60,
        "2**63": lambda r: 2**63,
        "2**64-1": lambda r: 2**64 - 1,
        "2**32+n": lambda r: 2**32 + _hlen(r),
        "file_size": len,
    }.items():
        add(f"st_len_{k}", ST, "length", _rw(STF, _set_len(fn)))
    huge = {
        "offsets_end_2**60": _tset(NORM, "data_offsets", [0, 2**60]),
        "offsets_both_2**60": _tset(NORM, "data_offsets", [2**60, 2**60 + 64]),
        "shape_2**60": _tset(NORM, "shape", [2**60]),
        "shape_overflow_2**32x2**32": _shape_zero_bytes(NORM, [2**32, 2**32]),
        "shape_overflow_emb": _shape_zero_bytes(EMB, [2**32, 2**32]),
        "shape_overflow_2**62x4": _shape_zero_bytes(HEAD, [2**62, 4]),
        "shape_float": _tset(NORM, "shape", [16.5]),
        "offsets_float": _tset(NORM, "data_offsets", [0.5, 64.5]),
    }
    for k, fn in huge.items():
        add(f"st_{k}", ST, "huge", _rw(STF, _header_json(fn)))
    # -- safetensors: dtypes
    for k, dt in {
        "F33": "F33",
        "empty": "",
        "int": 7,
        "null": None,
        "list": ["F32"],
        "dict": {"a": 1},
        "lower": "f32",
        "BF16_on_F32": "BF16",
        "F64_on_F32": "F64",
        "I32_on_F32": "I32",
        "U32_on_F32": "U32",
    }.items():
        add(f"st_dtype_{k}", ST, "dtype", _rw(STF, _header_json(_tset(EMB, "dtype", dt))))
    # -- safetensors: header structure
    for k, fn in {
        "list": lambda h: [1, 2],
        "string": lambda h: "x",
        "number": lambda h: 3,
        "empty_obj": lambda h: {},
        "no_offsets": lambda h: h[NORM].pop("data_offsets") and None,
        "shape_string": _tset(NORM, "shape", "16"),
        "metadata_list": lambda h: {**h, "__metadata__": [1]},
        "entry_list": lambda h: {**h, NORM: [1, 2, 3]},
        "deep": lambda h: DEEP,
        "binary": lambda h: bytes(range(256)),
        "nul_padded": lambda h: json.dumps(h).encode() + b"\0" * 8,
    }.items():
        add(f"st_header_{k}", ST, "header", _rw(STF, _header_json(fn)))
    add("st_empty", ST, "empty", _write(STF, b""))
    add("st1_empty", ST1, "empty", _write("model.safetensors", b""))
    add("st_dir", ST, "dir", _dir(STF))
    add("st1_dir", ST1, "dir", _dir("model.safetensors"))
    # -- pdparams: truncation
    pd_cuts = [0, 1, 2, 3, 10, 11, 12, 13, 42, 81, 113, 150, 171, 172, 200, 1000, 6000]
    for at in pd_cuts:
        add(f"pd_trunc_{at}", PD, "truncate", _rw(PDF, _cut(lambda r, at=at: at)))
    for k, at in {
        "half": lambda r: len(r) // 2,
        "end-3": lambda r: len(r) - 3,
        "end-2": lambda r: len(r) - 2,
        "end-1": lambda r: len(r) - 1,
    }.items():
        add(f"pd_trunc_{k}", PD, "truncate", _rw(PDF, _cut(at)))
    add(
        "pds_trunc_shard2_half",
        PDS,
        "truncate",
        _rw("model_state-00002-of-00008.pdparams", _cut(lambda r: len(r) // 2)),
    )
    # -- pdparams: bit flips in opcodes, in their arguments, and in array data
    for i in range(40):
        add(f"pd_flip_opcode_{i:02d}", PD, "flip", _rw(PDF, _pd_flip_opcode))
    for i in range(24):
        add(f"pd_flip_structure_{i:02d}", PD, "flip", _rw(PDF, _pd_flip_structure))
    for i in range(3):
        add(f"pd_flip_data_{i}", PD, "flip", _rw(PDF, _pd_flip_payload), harmless=True)
    # -- pdparams: wrong and huge lengths
    for k, fn in {
        "payload-1": _pd_payload_len(-1),
        "payload+1": _pd_payload_len(1),
        "payload-4": _pd_payload_len(-4),
        "payload+4": _pd_payload_len(4),
        "payload_0": _pd_payload_len(value=0),
        "payload_2**32-1": _pd_payload_len(value=2**32 - 1),
        "payload_BINBYTES8_2**60": _pd_payload_len(value=2**60),
        "unicode-1": _pd_short_unicode_len(-1),
        "unicode+1": _pd_short_unicode_len(1),
        "frame_2**60": _pd_frame_len(2**60),
        "BINBYTES8_2**60": _pd_insert_after_proto(b"\x8e" + struct.pack("<Q", 2**60) + b"0"),
        "BINUNICODE8_2**60": _pd_insert_after_proto(b"\x8d" + struct.pack("<Q", 2**60) + b"0"),
        "BINUNICODE_2**31": _pd_insert_after_proto(b"X" + struct.pack("<I", 2**31) + b"0"),
        "LONG4_2**31": _pd_insert_after_proto(b"\x8b" + struct.pack("<i", 2**31 - 1) + b"0"),
        "LONG1_255": _pd_insert_after_proto(b"\x8a\xff" + b"\x7f" * 255 + b"0"),
        "INT_10k_digits": _pd_insert_after_proto(b"I" + b"9" * 10_000 + b"\n0"),
        "BINGET_missing": _pd_insert_after_proto(b"h\xfe0"),
        "POP_empty": _pd_insert_after_proto(b"0" * 3),
        "MARK_unclosed": _pd_insert_after_proto(b"(((("),
    }.items():
        add(f"pd_len_{k}", PD, "length", _rw(PDF, fn))
    # -- pdparams: dtypes and shapes that a weights file does not have
    for k, fake in {
        "complex64": FakeArray((8,), np.dtype("c8"), b"\0" * 64),
        "void": FakeArray((4,), np.dtype("V16"), b"\0" * 64),
        "object": FakeArray((2,), np.dtype("O"), b"\0" * 16),
        "unicode": FakeArray((4,), np.dtype("U4"), b"\0" * 64),
        "datetime": FakeArray((8,), np.dtype("M8[s]"), b"\0" * 64),
        "structured": FakeArray((8,), np.dtype([("a", "<f4"), ("b", "<f4")]), b"\0" * 64),
        "negative_dims": FakeArray((-4, -4), np.dtype("f4"), b"\0" * 64),
        "overflow_dims": FakeArray((2**32, 2**32), np.dtype("f4"), b""),
        "huge_dim_small_data": FakeArray((2**60,), np.dtype("f4"), b"\0" * 64),
        "payload_not_bytes": FakeArray((16,), np.dtype("f4"), [0.0] * 16),
        "payload_str": FakeArray((16,), np.dtype("f4"), "\0" * 64),
    }.items():
        add(f"pd_array_{k}", PD, "dtype", _pd_array("llama.norm.weight", fake))
    add(
        "pd_array_emb_negative",
        PD,
        "dtype",
        _pd_array("llama.embed_tokens.weight", FakeArray((-100, -16), np.dtype("f4"), b"\0" * 6400)),
    )
    # -- pdparams: empty, folder, not a pickle
    add("pd_empty", PD, "empty", _write(PDF, b""))
    add("pd_dir", PD, "dir", _dir(PDF))
    add("pd_random", PD, "random", _write(PDF, np.random.default_rng(1).bytes(2048)))
    add("pd_random_with_proto", PD, "random", _write(PDF, b"\x80\x04" + np.random.default_rng(2).bytes(2048)))
    add("pd_text", PD, "random", _write(PDF, b"PK\x03\x04 this is a zip, not a pickle"))
    # -- config.json
    for k, content in {
        "empty": b"",
        "open_brace": b"{",
        "list": b"[]",
        "null": b"null",
        "string": b'"llama"',
        "truncated": None,
        "binary": bytes(range(256)),
        "deep": DEEP,
        "bom": None,
        "nan": b'{"vocab_size": NaN, "hidden_size": 16, "model_type": "llama"}',
    }.items():
        if k == "truncated":
            add("cfg_truncated", ST, "json", _rw("config.json", _cut(lambda r: len(r) // 2)))
        elif k == "bom":
            add("cfg_utf8_bom", ST, "json", _rw("config.json", lambda r, rng: b"\xef\xbb\xbf" + r))
        else:
            add(f"cfg_{k}", ST, "json", _write("config.json", content))
    add("cfg_dir", ST, "dir", _dir("config.json"))
    for k, val in {
        "vocab_str": ("vocab_size", "100"),
        "vocab_neg": ("vocab_size", -1),
        "vocab_huge": ("vocab_size", 2**70),
        "hidden_zero": ("hidden_size", 0),
        "model_type_list": ("model_type", ["llama"]),
        "model_type_dict": ("model_type", {"a": 1}),
        "tie_str": ("tie_word_embeddings", "yes"),
        "text_config_list": ("text_config", [1]),
        "text_config_deep": ("text_config", {"text_config": {}}),
        "pf_version_list": ("paddleformers_version", [1]),
    }.items():
        add(f"cfg_{k}", ST, "config", _cfg(*val))
    add("cfg_pd_version_int", PD, "config", _cfg("paddlenlp_version", 3))
    add("cfg_pd_version_weird", PD, "config", _cfg("paddlenlp_version", "3x.beta"))
    # -- the index
    for k, content in {
        "empty": b"",
        "open_brace": b"{",
        "list": b"[]",
        "deep": DEEP,
        "wm_list": b'{"weight_map": [1]}',
        "wm_null": b'{"weight_map": null}',
        "wm_ints": None,
    }.items():
        if content is None:
            add(
                f"sts_index_{k}",
                STS,
                "json",
                _json_edit(av.ST_INDEX, lambda i: {**i, "weight_map": {n: 1 for n in i["weight_map"]}}),
            )
        else:
            add(f"sts_index_{k}", STS, "json", _write(av.ST_INDEX, content))
    add("sts_index_truncated", STS, "json", _rw(av.ST_INDEX, _cut(lambda r: len(r) // 2)))
    add("sts_index_dir", STS, "dir", _dir(av.ST_INDEX))
    add("sts_index_metadata_list", STS, "json", _json_edit(av.ST_INDEX, lambda i: {**i, "metadata": [1]}))
    add(
        "sts_index_total_size_str",
        STS,
        "json",
        _json_edit(av.ST_INDEX, lambda i: {**i, "metadata": {"total_size": "x"}}),
    )
    add("sts_shard_dir", STS, "dir", _dir("model-00003-of-00009.safetensors"))
    add("sts_shard_empty", STS, "empty", _write("model-00003-of-00009.safetensors", b""))
    add("pds_index_empty", PDS, "json", _write(av.PD_INDEX, b""))
    add("pds_index_truncated", PDS, "json", _rw(av.PD_INDEX, _cut(lambda r: len(r) // 2)))
    add("pds_index_wm_null", PDS, "json", _write(av.PD_INDEX, b'{"weight_map": null}'))
    add("pds_shard_empty", PDS, "empty", _write("model_state-00006-of-00008.pdparams", b""))
    add("pds_shard_dir", PDS, "dir", _dir("model_state-00006-of-00008.pdparams"))
    # -- other files
    for k, content in {
        "tokenizer_model_str": b'{"model": "bpe"}',
        "tokenizer_binary": bytes(range(256)),
        "tokenizer_added_int": b'{"added_tokens": 5}',
    }.items():
        add(f"st_{k}", ST, "other", _write("tokenizer.json", content))
    add("st_tokenizer_dir", ST, "dir", _dir("tokenizer.json"))
    names = [x.name for x in v]
    assert len(names) == len(set(names)), "duplicate variant names"
    return v


VARIANTS = variants()
BY_NAME = {x.name: x for x in VARIANTS}


def build(variant: Variant, dest: Path) -> Path:
    """Write ``variant`` to ``dest`` (a new folder); returns it."""
    case, transform = BASES[variant.base]
    d = av.copy_case(case, dest)
    if transform is not None:
        transform(d)
    variant.apply(d, random.Random(variant.name))
    return d


def generate(root: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Write every variant (or ``names``) to ``root/<name>``."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for v in VARIANTS:
        if names is None or v.name in names:
            dest = root / v.name
            if dest.exists():
                shutil.rmtree(dest)
            out[v.name] = build(v, dest)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage (in tests/): python -m support.corrupt_corpus DEST")
    made = generate(Path(sys.argv[1]))
    print(f"{len(made)} corrupt variants in {sys.argv[1]}")
