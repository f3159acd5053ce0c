# ruff: noqa: UP031  (the headers are JSON text: %-formatting keeps their braces readable)
"""The safetensors header rules, with the ``safetensors`` library as the oracle (issue 18, item 5).

Each crafted file is opened by ``safetensors.safe_open`` (the library every loader uses; 0.8 here) and read
by tietool's :func:`read_header`: tietool must refuse (a ``CheckpointError``, exit 3) exactly the files the
library refuses, except the differences listed in ``STRICTER`` (tietool refuses, the library accepts), each
with its reason. The rules come from ``safetensors/src/tensor.rs`` (``read_metadata``, ``Metadata::validate``,
serde's ``HashMetadata`` / ``TensorInfo`` / ``Dtype``); each has several instances here, and the hostile
corpus (``tests/support/hostile/st.py``) runs instances of each through every command.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from tietool.surgery.io.safetensors_io import read_header
from tietool.surgery.model.errors import CheckpointError

A4 = '"dtype":"F32","shape":[1],"data_offsets":[0,4]'
T = '"a":{%s}' % A4
U64 = 2**64 - 1


def entry(dtype: str = '"F32"', shape: str = "[1]", offsets: str = "[0,4]", extra: str = "") -> str:
    return '{"a":{"dtype":%s,"shape":%s,"data_offsets":%s%s}}' % (dtype, shape, offsets, extra)


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    """A header nesting ``depth`` levels in all (the outer object and the entry count two)."""
    return entry(extra=',"z":' + open_ * (depth - 2) + close * (depth - 2))


# name -> (header text or bytes, data bytes); data defaults to 4 zero bytes
CASES: dict[str, tuple[str | bytes, bytes]] = {
    # accepted by the library
    "plain": ("{%s}" % T, b"\0" * 4),
    "padded-spaces": ("{%s}    " % T, b"\0" * 4),
    "padded-tab-newline": ("{%s}\t\n\r" % T, b"\0" * 4),
    "leading-whitespace": (" \n{%s}" % T, b"\0" * 4),
    "scalar": (entry(shape="[]"), b"\0" * 4),
    "empty-header": ("{}", b""),
    "empty-tensors-same-offset": (
        '{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"I8","shape":[3,0],'
        '"data_offsets":[0,0]},"c":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
        b"\0" * 2,
    ),
    "empty-tensor-after-data": (
        '{"c":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"F32","shape":[0],'
        '"data_offsets":[2,2]}}',
        b"\0" * 2,
    ),
    "u64max-dim-times-zero": (entry(shape=f"[{U64},0]", offsets="[0,0]"), b""),
    "zero-then-huge-dims": (entry(shape="[0,4294967296,4294967296]", offsets="[0,0]"), b""),
    "unknown-field": (entry(extra=',"z":[1,{"k":null}],"q":-0'), b"\0" * 4),
    "unknown-field-long-int": (entry(extra=',"z":123456789012345678901234567890'), b"\0" * 4),
    "unknown-field-float": (entry(extra=',"z":1.5e300'), b"\0" * 4),
    "fields-reordered": ('{"a":{"data_offsets":[0,4],"shape":[1],"dtype":"F32"}}', b"\0" * 4),
    "entry-as-list": ('{"a":["F32",[1],[0,4]]}', b"\0" * 4),
    "dtype-as-unit-variant-map": (entry(dtype='{"F32":null}'), b"\0" * 4),
    "dtype-escaped": (entry(dtype='"\\u0046\\u00332"'), b"\0" * 4),
    "metadata-null": ('{"__metadata__":null,%s}' % T, b"\0" * 4),
    "metadata-empty": ('{"__metadata__":{},%s}' % T, b"\0" * 4),
    "metadata-after-tensors": ('{%s,"__metadata__":{"format":"pt"}}' % T, b"\0" * 4),
    "metadata-keys-like-an-entry": (
        '{"__metadata__":{"dtype":"x","shape":"y","data_offsets":"z"},%s}' % T,
        b"\0" * 4,
    ),
    "empty-name": ('{"":{%s}}' % A4, b"\0" * 4),
    "surrogate-pair-name": ('{"\\ud83d\\ude00":{%s}}' % A4, b"\0" * 4),
    "nested-127": (nested(127), b"\0" * 4),
    "nested-127-objects": (entry(extra=',"z":' + '{"k":' * 125 + "1" + "}" * 125), b"\0" * 4),
    "u64max-offset-bytes-none": (entry(dtype='"U8"', shape="[0]", offsets="[0,0]"), b""),
    "f4-even": (entry(dtype='"F4"', shape="[4]", offsets="[0,2]"), b"\0" * 2),
    # refused by the library
    "length-over-100MB": (b"", b""),  # built apart: an 8-byte length of 100,000,001
    "length-beyond-file": (b"", b""),  # built apart
    "shorter-than-length-field": (b"", b""),  # built apart
    "length-zero": (b"", b""),  # built apart
    "trailing-nul": ("{%s}\0" % T, b"\0" * 4),
    "trailing-garbage": ("{%s}x" % T, b"\0" * 4),
    "two-objects": ("{}{}", b""),
    "bom": ("\ufeff{%s}" % T, b"\0" * 4),
    "whitespace-only": ("    ", b""),
    "not-utf8": (b'{"\xff":{' + A4.encode() + b"}}", b"\0" * 4),
    "lone-surrogate-name": ('{"\\ud800":{%s}}' % A4, b"\0" * 4),
    "lone-surrogate-metadata": ('{"__metadata__":{"k":"\\udc00"},%s}' % T, b"\0" * 4),
    "control-char-in-name": ('{"a\x01":{%s}}' % A4, b"\0" * 4),
    "not-an-object": ("[]", b""),
    "shape-string": (entry(shape='["1"]'), b"\0" * 4),
    "shape-float": (entry(shape="[1.0]"), b"\0" * 4),
    "shape-exponent": (entry(shape="[1e0]"), b"\0" * 4),
    "shape-bool": (entry(shape="[true]"), b"\0" * 4),
    "shape-negative": (entry(shape="[-1]"), b"\0" * 4),
    "shape-minus-zero": (entry(shape="[-0]", offsets="[0,0]"), b""),
    "shape-null": (entry(shape="null", offsets="[0,0]"), b""),
    "shape-int": (entry(shape="1"), b"\0" * 4),
    "shape-nested": (entry(shape="[[1]]"), b"\0" * 4),
    "shape-2to64": (entry(shape=f"[{2**64}]"), b"\0" * 4),
    "shape-infinity": (entry(shape="[Infinity]"), b"\0" * 4),
    "shape-nan": (entry(shape="[NaN]"), b"\0" * 4),
    "shape-1e400": (entry(shape="[1e400]"), b"\0" * 4),
    "shape-4301-digits": (entry(shape="[" + "9" * 4301 + "]"), b"\0" * 4),
    "offsets-string": (entry(offsets='["0",4]'), b"\0" * 4),
    "offsets-float": (entry(offsets="[0,4.0]"), b"\0" * 4),
    "offsets-bool": (entry(offsets="[false,4]"), b"\0" * 4),
    "offsets-three": (entry(offsets="[0,4,4]"), b"\0" * 4),
    "offsets-one": (entry(offsets="[0]"), b"\0" * 4),
    "offsets-object": (entry(offsets='{"0":0,"1":4}'), b"\0" * 4),
    "offsets-infinity": (entry(offsets="[0,Infinity]"), b"\0" * 4),
    "offsets-1e400": (entry(offsets="[0,1e400]"), b"\0" * 4),
    "offsets-minus-zero": (entry(offsets="[-0,4]"), b"\0" * 4),
    "offsets-2to64": (entry(offsets=f"[0,{2**64}]"), b"\0" * 4),
    "offsets-u64max": (entry(offsets=f"[0,{U64}]"), b"\0" * 4),
    "unknown-field-1e400": (entry(extra=',"z":1e400'), b"\0" * 4),
    "unknown-field-400-digits": (entry(extra=',"z":' + "9" * 400), b"\0" * 4),
    "unknown-field-nan": (entry(extra=',"z":NaN'), b"\0" * 4),
    "dtype-lowercase": (entry(dtype='"f32"'), b"\0" * 4),
    "dtype-unknown": (entry(dtype='"F33"'), b"\0" * 4),
    "dtype-int": (entry(dtype="1"), b"\0" * 4),
    "dtype-null": (entry(dtype="null"), b"\0" * 4),
    "dtype-map-two-keys": (entry(dtype='{"F32":null,"F16":null}'), b"\0" * 4),
    "dtype-map-not-null": (entry(dtype='{"F32":[]}'), b"\0" * 4),
    "missing-offsets": ('{"a":{"dtype":"F32","shape":[1]}}', b"\0" * 4),
    "entry-null": ('{"a":null}', b""),
    "entry-int": ('{"a":1}', b""),
    "entry-list-of-two": ('{"a":["F32",[1]]}', b"\0" * 4),
    "entry-list-of-four": ('{"a":["F32",[1],[0,4],1]}', b"\0" * 4),
    "duplicate-field": ('{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
    "duplicate-field-escaped": (
        '{"a":{"dtype":"F32","\\u0064type":"F32","shape":[1],"data_offsets":[0,4]}}',
        b"\0" * 4,
    ),
    "duplicate-metadata": ('{"__metadata__":{"x":"1"},"__metadata__":{"x":"1"},%s}' % T, b"\0" * 4),
    "metadata-int-value": ('{"__metadata__":{"x":1},%s}' % T, b"\0" * 4),
    "metadata-null-value": ('{"__metadata__":{"x":null},%s}' % T, b"\0" * 4),
    "metadata-list": ('{"__metadata__":[],%s}' % T, b"\0" * 4),
    "metadata-string": ('{"__metadata__":"x",%s}' % T, b"\0" * 4),
    "metadata-entry-shaped": ('{"__metadata__":{%s}}' % A4, b"\0" * 4),
    "hole-at-start": (entry(offsets="[4,8]"), b"\0" * 8),
    "hole-between": (
        '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],'
        '"data_offsets":[3,5]}}',
        b"\0" * 5,
    ),
    "overlap": (
        '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],'
        '"data_offsets":[2,4]}}',
        b"\0" * 4,
    ),
    "same-range-twice": (
        '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],'
        '"data_offsets":[0,4]}}',
        b"\0" * 4,
    ),
    "bytes-after-last": ("{%s}" % T, b"\0" * 8),
    "data-without-tensors": ("{}", b"\0"),
    "truncated-data": ("{%s}" % T, b"\0" * 3),
    "end-before-begin": (entry(shape="[0]", offsets="[4,0]"), b"\0" * 4),
    "size-not-shape": (entry(shape="[2]"), b"\0" * 4),
    "f4-odd": (entry(dtype='"F4"', shape="[3]", offsets="[0,2]"), b"\0" * 2),
    "f6-not-whole-bytes": (entry(dtype='"F6_E2M3"', shape="[2]", offsets="[0,2]"), b"\0" * 2),
    "element-count-overflow": (entry(shape="[4294967296,4294967296,0]", offsets="[0,0]"), b""),
    "bit-count-overflow": (entry(dtype='"F64"', shape=f"[{2**61}]", offsets="[0,0]"), b""),
    "nested-128": (nested(128), b"\0" * 4),
    "nested-128-objects": (entry(extra=',"z":' + '{"k":' * 126 + "1" + "}" * 126), b"\0" * 4),
    "nested-100000": (nested(100_000), b"\0" * 4),
}

# tietool refuses, the library accepts: the format says "duplicate keys are disallowed" (README of
# huggingface/safetensors), and which of two entries a loader takes is the parser's choice (the library keeps
# the last): a file that means two things is refused, never "repaired" into one of them.
STRICTER = {
    "duplicate-tensor": ("{%s,%s}" % (T, T), b"\0" * 4),
    "duplicate-tensor-different": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},%s}' % T,
        b"\0" * 4,
    ),
    "duplicate-metadata-key": ('{"__metadata__":{"x":"1","x":"2"},%s}' % T, b"\0" * 4),
    "duplicate-key-in-unknown-field": (entry(extra=',"z":{"k":1,"k":2}'), b"\0" * 4),
}


def build(name: str, header: str | bytes, data: bytes) -> bytes:
    if name == "length-over-100MB":
        return struct.pack("<Q", 100_000_001) + b"{}"
    if name == "length-beyond-file":
        return struct.pack("<Q", 100) + b"{}"
    if name == "shorter-than-length-field":
        return b"\x02\0\0"
    if name == "length-zero":
        return struct.pack("<Q", 0)
    raw = header if isinstance(header, bytes) else header.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(raw)) + raw + data


def library_refuses(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="numpy") as f:
            list(f.keys())
            f.metadata()
    except Exception:
        return True
    return False


def tietool_refuses(path: Path) -> str | None:
    try:
        read_header(path, path.name)
    except CheckpointError as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", sorted(CASES))
def test_refuses_iff_the_library_refuses(tmp_path: Path, name: str) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(build(name, *CASES[name]))
    lib, ours = library_refuses(p), tietool_refuses(p)
    assert lib == (ours is not None), f"library refuses: {lib}; tietool: {ours or 'accepted'}"
    if ours is not None:
        assert "model.safetensors" in ours and " — " in ours, ours


@pytest.mark.parametrize("name", sorted(STRICTER))
def test_stricter_than_the_library(tmp_path: Path, name: str) -> None:
    """The documented differences: the library accepts, tietool refuses naming the repeated key."""
    p = tmp_path / "model.safetensors"
    p.write_bytes(build(name, *STRICTER[name]))
    assert not library_refuses(p), "the library now refuses it too: move the case to CASES"
    msg = tietool_refuses(p)
    assert msg is not None and "appears twice" in msg, msg


def test_header_length_limit_is_decimal(tmp_path: Path) -> None:
    """The limit is 100,000,000 bytes exactly, as MAX_HEADER_SIZE: a header of that length parses, one byte
    more is refused before it is read."""
    p = tmp_path / "model.safetensors"
    blob = b"{}" + b" " * (100_000_000 - 2)
    p.write_bytes(struct.pack("<Q", len(blob)) + blob)
    assert not library_refuses(p) and tietool_refuses(p) is None
    p.write_bytes(struct.pack("<Q", len(blob) + 1) + blob + b" ")
    assert library_refuses(p)
    msg = tietool_refuses(p)
    assert msg is not None and "100,000,000" in msg


def test_values_read_back(tmp_path: Path) -> None:
    """What the odd accepted forms mean, read as the library reads them: dtype, shape, offsets."""
    p = tmp_path / "model.safetensors"
    for name in ("entry-as-list", "dtype-as-unit-variant-map", "fields-reordered", "leading-whitespace"):
        p.write_bytes(build(name, *CASES[name]))
        (t,), meta = read_header(p, p.name)
        with safe_open(str(p), framework="numpy") as f:
            sl = f.get_slice("a")
            assert (t.name, t.dtype, list(t.shape)) == ("a", sl.get_dtype(), sl.get_shape()), name
        assert t.nbytes == 4 and t.offset == p.stat().st_size - 4 and meta is None
