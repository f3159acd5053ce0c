"""Safetensors shards the safetensors library refuses (issue 18, item 5, and the header parts of items 6 and
7): every command must refuse them (exit 3) naming the shard, never read them as a checkpoint, "repair" them
into an output, hang or exit 70. One kind per rule of the library's ``read_metadata`` /
``Metadata::validate`` (``tests/unit/io/test_safetensors_rules.py`` checks each rule against the library
itself), several instances of each (other tensors, other values); plus a header over the library's
100,000,000-byte limit, a FIFO as the shard, and a valid header of 1.6 M empty tensors (time and memory, not
refused).

The header text is edited as text (``@RAW@`` placeholders), so values JSON cannot carry (``Infinity``,
``-0``, integers of 4,301 digits, repeated keys) reach the file as an attacker writes them.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

from support import adversarial_support as av
from support.hostile import Hostile

SHARD = av.ST_ONE_FILE
EMB, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
RAW = "@RAW@"
LIB = "which the safetensors library refuses"


def _parts() -> tuple[dict, bytes]:
    return av.st_parse((av.CASES / av.ST_ONE / SHARD).read_bytes())


def _write(ckpt: Path, text: str | bytes, data: bytes) -> None:
    blob = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    (ckpt / SHARD).write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def _edit(fn: Callable[[dict, bytes], tuple[str | bytes, bytes]]) -> Callable[[Path], Path]:
    """A case whose shard header is ``fn(header, data)`` → (header text, data) on a copy of ``ST_ONE``."""

    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
        _write(ckpt, *fn(*_parts()))
        return ckpt

    return build


def _field(tensor: str, field: str, raw: str) -> Callable[[Path], Path]:
    """``tensor``'s ``field`` replaced by the JSON text ``raw``."""

    def fn(h: dict, data: bytes) -> tuple[str, bytes]:
        h[tensor][field] = RAW
        return json.dumps(h).replace(json.dumps(RAW), raw, 1), data

    return _edit(fn)


def _text(fn: Callable[[str], str]) -> Callable[[Path], Path]:
    """The header text (as the fixture's JSON) rewritten by ``fn``."""
    return _edit(lambda h, data: (fn(json.dumps(h)), data))


def _offsets(tensor: str, begin: int, end: int, data_len: int | None = None) -> Callable[[Path], Path]:
    def fn(h: dict, data: bytes) -> tuple[str, bytes]:
        h[tensor]["data_offsets"] = [begin, end]
        return json.dumps(h), data if data_len is None else (data + b"\0" * data_len)[:data_len]

    return _edit(fn)


def _dup_metadata(h: dict, data: bytes) -> tuple[str, bytes]:
    text = json.dumps({"__metadata__": {"format": "pt"}, **h})
    return text.replace("{", '{"__metadata__": {"format": "np"}, ', 1), data


def _dup_tensor(tensor: str) -> Callable[[dict, bytes], tuple[str, bytes]]:
    def fn(h: dict, data: bytes) -> tuple[str, bytes]:
        entry = json.dumps({tensor: h[tensor]})[1:-1]
        return json.dumps(h).replace("{", "{" + entry + ", ", 1), data

    return fn


def _dup_field(tensor: str, field: str) -> Callable[[dict, bytes], tuple[str, bytes]]:
    def fn(h: dict, data: bytes) -> tuple[str, bytes]:
        text = json.dumps(h)
        key = json.dumps(tensor) + ": {"
        return text.replace(
            key, key + json.dumps(field) + ": " + json.dumps(h[tensor][field]) + ", ", 1
        ), data

    return fn


def _length(n: int, sparse_size: int | None = None) -> Callable[[Path], Path]:
    """The shard's length field set to ``n``; with ``sparse_size`` the file is extended (sparse, no disk)
    to that size, so the length fits the file and only the 100,000,000-byte limit refuses it."""

    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
        p = ckpt / SHARD
        raw = p.read_bytes()
        p.write_bytes(struct.pack("<Q", n) + raw[8:])
        if sparse_size is not None:
            with open(p, "r+b") as f:
                f.truncate(sparse_size)
        return ckpt

    return build


def _fifo(dest: Path) -> Path:
    ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
    (ckpt / SHARD).unlink()
    os.mkfifo(ckpt / SHARD)
    return ckpt


def _empty_tensors(count: int) -> Callable[[Path], Path]:
    """A valid shard (the library opens it) whose header adds ``count`` empty tensors ``[0]`` at offset 0;
    the index lists them too (else each is a warning). 1.6 M of them make a header of ~93 MB."""

    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
        h, data = _parts()
        parts = [json.dumps(h, separators=(",", ":"))[:-1]]
        parts += [f',"e{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(count)]
        text = "".join(parts) + "}"
        _write(ckpt, text + " " * (-len(text) % 8), data)
        index = json.loads((ckpt / av.ST_INDEX).read_text())
        index["weight_map"].update({f"e{i}": SHARD for i in range(count)})
        (ckpt / av.ST_INDEX).write_text(json.dumps(index))
        return ckpt

    return build


def _case(name: str, build: Callable[[Path], Path], *names: str, **kw) -> Hostile:
    return Hostile(f"st-{name}", "safetensors", build, 3, names=(SHARD, *names), **kw)


CASES = [
    # a shape must be a list of non-negative integers (serde usize): not strings, floats, booleans, -0
    *(
        _case(f"shape-{what}-{t.split('.')[-2]}", _field(t, "shape", raw), "shape", LIB)
        for what, raw, t in (
            ("string", '["100", 16]', EMB),
            ("string", '"16"', NORM),
            ("float", "[100.0, 16]", HEAD),
            ("float", "[16e0]", NORM),
            ("bool", "[true, 16]", EMB),
            ("negative", "[-100, -16]", HEAD),
            ("minus-zero", "[100, 16, -0]", EMB),
            ("null", "null", NORM),
            ("nested", "[[100], 16]", EMB),
        )
    ),
    # data_offsets: two non-negative integers
    *(
        _case(f"offsets-{what}-{t.split('.')[-2]}", _field(t, "data_offsets", raw), "data_offsets", LIB)
        for what, raw, t in (
            ("string", '["0", "6400"]', HEAD),
            ("float", "[23168.0, 23232]", NORM),
            ("bool", "[false, 6400]", HEAD),
            ("three", "[6400, 12800, 12800]", EMB),
            ("minus-zero", "[-0, 6400]", HEAD),
        )
    ),
    # Infinity / NaN / 1e400 / integers over 4,300 digits or 64 bits in a shape or an offset (issue 18 item 6)
    *(
        _case(f"number-{what}-{field}", _field(t, field, raw), *names)
        for what, field, t, raw, names in (
            ("infinity", "shape", EMB, "[Infinity, 16]", ("Infinity",)),
            ("infinity", "data_offsets", NORM, "[23168, Infinity]", ("Infinity",)),
            ("nan", "shape", NORM, "[NaN]", ("NaN",)),
            ("1e400", "shape", HEAD, "[1e400, 16]", ("out of range",)),
            ("1e400", "data_offsets", EMB, "[6400, 1e400]", ("out of range",)),
            ("4301-digits", "shape", EMB, "[" + "1" * 4301 + ", 16]", ("digits",)),
            ("4301-digits", "data_offsets", HEAD, "[0, " + "6" * 4301 + "]", ("digits",)),
            ("2to64", "shape", NORM, f"[{2**64 + 16}]", ("shape", LIB)),
            ("2to64", "data_offsets", NORM, f"[{2**64 + 23168}, 23232]", ("data_offsets", LIB)),
        )
    ),
    # dtype: one of the format's labels
    _case("dtype-lowercase", _field(NORM, "dtype", '"f32"'), "dtype"),
    _case("dtype-unknown", _field(EMB, "dtype", '"F33"'), "dtype"),
    _case("dtype-number", _field(HEAD, "dtype", "32"), "dtype"),
    # repeated keys: __metadata__ (the library refuses), a tensor field (refuses), a tensor name (the format
    # forbids it; the library would keep the last one)
    _case("dup-metadata", _edit(_dup_metadata), "__metadata__", "twice"),
    _case("dup-field-shape", _edit(_dup_field(EMB, "shape")), "shape", "twice"),
    _case("dup-field-dtype", _edit(_dup_field(NORM, "dtype")), "dtype", "twice"),
    _case("dup-tensor-head", _edit(_dup_tensor(HEAD)), HEAD, "twice"),
    _case("dup-tensor-norm", _edit(_dup_tensor(NORM)), NORM, "twice"),
    # __metadata__: null or a string → string map
    _case(
        "metadata-int", _text(lambda t: t.replace("{", '{"__metadata__": {"format": 1}, ', 1)), "__metadata__"
    ),
    _case("metadata-list", _text(lambda t: t.replace("{", '{"__metadata__": ["pt"], ', 1)), "__metadata__"),
    _case(
        "metadata-null-value",
        _text(lambda t: t.replace("{", '{"__metadata__": {"a": null}, ', 1)),
        "__metadata__",
    ),
    # the tensors tile the data exactly: no hole, no overlap, nothing after the last, sizes = shape × dtype
    _case("hole-first", _offsets(HEAD, 8, 6408, 23240), HEAD, LIB),
    _case("overlap-norm", _offsets(NORM, 23100, 23164), NORM, LIB),
    _case("overlap-emb", _offsets(EMB, 0, 6400), EMB, LIB),
    _case("bytes-after-last", _edit(lambda h, data: (json.dumps(h), data + b"\0" * 64)), "no tensor", LIB),
    _case("size-not-shape", _field(NORM, "shape", "[15]"), NORM, LIB),
    _case("end-before-begin", _offsets(NORM, 23232, 23168), NORM, LIB),
    # JSON the library's parser refuses
    _case("nested-128", _text(lambda t: t[:-1] + ', "x": {"y": ' + "[" * 126 + "]" * 126 + "}}"), "nested"),
    _case(
        "lone-surrogate",
        _text(lambda t: t.replace('"model.norm.weight"', '"model.norm\\ud800"')),
        "surrogate",
    ),
    _case("trailing-nul", _text(lambda t: t + "\0"), "JSON"),
    _case("not-utf8", _edit(lambda h, d: (json.dumps(h).encode().replace(b"norm", b"n\xffrm"), d)), "utf-8"),
    # the 8-byte length: over the library's limit (100,000,000 bytes, decimal), beyond the file
    _case("length-100MB-plus-1", _length(100_000_001, 100_000_009 + 23232), "100,000,000"),
    _case("length-2to63", _length(2**63), "100,000,000"),
    _case("length-beyond-file", _length(30_000), "exceeds the file size"),
    _case("length-u64-max", _length(2**64 - 1), "100,000,000"),
    # not a regular file (issue 18 item 7): a FIFO must be refused at once, never block
    _case("fifo-shard", _fifo, "FIFO"),
    # valid, but huge (issue 18 item 7: 205 s and 1.3 GB before): 1.6 M empty tensors in a ~93 MB header
    # (near the 100 MB header limit, the largest header the format allows) through inspect, and 100 k
    # through every write and verify (idle: convert 46 s -> 16 s at 400 k once a planned tensor's size
    # stopped calling np.prod 14 times per tensor; verify 63 s -> 10 s once an empty tensor's bytes stopped
    # being read). The writes were run at 400 k until the suite's time mattered: time and memory are linear
    # in the count (measured: tie 6.6 s / 184 MB at 100 k, 27 s / 398 MB at 400 k), so 100 k still turns a
    # quadratic walk into hours, and its memory bound is scaled to match (see max_rss). The writes on 1.6 M
    # peak at 1.0-2.1 GB, over the corpus' 1 GiB: the per-tensor records of the reader and the writers.
    Hostile(
        "st-many-empty-tensors",
        "safetensors",
        _empty_tensors(1_600_000),
        0,
        commands=("inspect",),
        # idle 24-48 s (1.0 GB) by the machine; beside another pytest worker at load 10 it passed 90 s: the
        # limit catches a hang or a quadratic walk, not load
        timeout=180.0,
    ),
    Hostile(
        "st-many-empty-tensors-100k",
        "safetensors",
        _empty_tensors(100_000),
        0,
        commands=("tie", "resize", "untie", "convert", "verify"),
        # idle 6-9 s each: the limit catches a hang or a quadratic walk, not load
        timeout=120.0,
        # measured 141-205 MB (convert the most): the 1 GiB of the corpus allowed 2.3 KB per tensor at
        # 400 k; this allows ~2.7 KB per tensor over a ~110 MB process at 100 k
        max_rss=384 * 2**20,
    ),
]
