"""Hostile ``.pdparams`` pickles (issue 18, items 6 and 7): each must be refused with one line (exit 3 for a
damaged or oversized pickle) in linear time and bounded memory, never crash the interpreter (a dict key
that is a tuple nested a million deep segfaulted it), never exit 70 (5,000 deep; a one-byte change of a
dtype string), never hang (memo bombs of a few hundred bytes took exponential time; a FIFO blocked).

Each hostile value is added to a copy of the real PaddleNLP fixture's pickle, as one more entry of its
top-level dict (the dict is still on the stack before STOP: ``(`` key value ``u``), with memo indices of its
own (LONG_BINPUT/LONG_BINGET from :data:`BASE`, far from the fixture's), or built around the fixture's own
dtype strings. Nothing here imports tietool.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from support import adversarial_support as av
from support.hostile import Hostile

PD = av.PD_FILE
BASE = 1_000_000  # memo indices of the hostile values


def _s(text: str) -> bytes:
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b if len(b) < 256 else b"X" + struct.pack("<I", len(b)) + b


def _put(i: int) -> bytes:
    return b"r" + struct.pack("<I", BASE + i)


def _get(i: int) -> bytes:
    return b"j" + struct.pack("<I", BASE + i)


def _raw() -> bytes:
    raw = (av.CASES / av.PD_ONE / PD).read_bytes()
    assert raw.endswith(b"u."), "expected a dict pickle closed by SETITEMS, STOP"
    return raw


def _with_entry(key: bytes, value: bytes, prelude: bytes = b"") -> Callable[[Path], Path]:
    """The fixture with one more top-level entry: ``prelude`` (memoized parts, popped) then key, value."""

    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.PD_ONE, dest / "ckpt")
        (ckpt / PD).write_bytes(_raw()[:-1] + prelude + b"(" + key + value + b"u.")
        return ckpt

    return build


def _raw_file(write: Callable[[Path], None]) -> Callable[[Path], Path]:
    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.PD_ONE, dest / "ckpt")
        write(ckpt / PD)
        return ckpt

    return build


def _sparse_line(head: bytes, n: int, tail: bytes) -> Callable[[Path], Path]:
    """A pickle whose text line (GLOBAL/INST/INT argument) is ``n`` bytes long: a sparse file (the hole
    reads as NUL bytes), so it costs no disk and the test no time to build."""

    def write(p: Path) -> None:
        with open(p, "wb") as f:
            f.write(head)
            f.seek(len(head) + n)
            f.write(b"\n" + tail)

    return _raw_file(write)


def _edit_raw(fn: Callable[[bytes], bytes]) -> Callable[[Path], Path]:
    return _raw_file(lambda p: p.write_bytes(fn(_raw())))


# ------------------------------------------------------------------ deep nesting (crash, exit 70 today)
def _tuple1_chain(n: int) -> bytes:  # ((((),),),) n deep: EMPTY_TUPLE then TUPLE1 n times
    return b")" + b"\x85" * n


def _mark_tuple_chain(n: int) -> bytes:  # the same with MARK ... TUPLE
    return b"(" * n + b")" + b"t" * n


def _list_chain(n: int) -> bytes:  # [[[...]]]: n empty lists, each appended to the one below
    return b"]" * n + b"a" * (n - 1)


def _dict_chain(n: int) -> bytes:  # {"k": {"k": ...}}: SETITEM n times
    return (b"}" + _s("k")) * n + b"}" + b"s" * n


DEEP = [
    ("deep-key-5k", _tuple1_chain(5000), b"K\x01", "as a dict key"),
    ("deep-key-1m", _tuple1_chain(1_000_000), b"K\x01", "as a dict key (1 MB)"),
    ("deep-key-mark-200k", _mark_tuple_chain(200_000), b"K\x01", "as a dict key"),
]
DEEP_VALUES = [
    ("deep-value-tuple-1m", _tuple1_chain(1_000_000)),
    ("deep-value-list-500k", _list_chain(500_000)),
    ("deep-value-dict-200k", _dict_chain(200_000)),
    ("deep-value-list-40", _list_chain(40)),  # just past the limit (32)
]

# ------------------------------------------------------------------ memo bombs (exponential time today)


def _tuple_bomb(levels: int) -> tuple[bytes, bytes]:
    """t0 = (); t(i) = (t(i-1), t(i-1)): 2**levels elements counted at every reference, ~12 bytes a level."""
    pre = b")" + _put(0) + b"0"
    for i in range(1, levels + 1):
        pre += _get(i - 1) + _get(i - 1) + b"\x86" + _put(i) + b"0"
    return pre, _get(levels)


def _list_bomb(levels: int, fan: int) -> tuple[bytes, bytes]:
    """L0 = []; L(i) = [L(i-1)] * fan, by APPENDS of memo references."""
    pre = b"]" + _put(0) + b"0"
    for i in range(1, levels + 1):
        pre += b"](" + _get(i - 1) * fan + b"e" + _put(i) + b"0"
    return pre, _get(levels)


def _dict_bomb(levels: int) -> tuple[bytes, bytes]:
    """D0 = {}; D(i) = {"a": D(i-1), "b": D(i-1)}."""
    pre = b"}" + _put(0) + b"0"
    for i in range(1, levels + 1):
        pre += b"}(" + _s("a") + _get(i - 1) + _s("b") + _get(i - 1) + b"u" + _put(i) + b"0"
    return pre, _get(levels)


def _growing_list(n: int) -> tuple[bytes, bytes]:
    """L = [x]; then n times L.extend(L-as-it-is) through references to one growing tuple chain: each
    step's tuple holds the previous one twice and the list gets them all."""
    pre, top = _tuple_bomb(n)
    return pre + b"]" + _put(10_000) + b"(" + b"".join(_get(i) for i in range(n + 1)) + b"e0", _get(10_000)


def _cycle() -> tuple[bytes, bytes]:
    return b"]" + _put(0) + _get(0) + b"a0", _get(0)


def _ordered_dict_of(pre: bytes, key: bytes) -> tuple[bytes, bytes]:  # OrderedDict([(key, 1)])
    od = b"\x8c\x0bcollections\x8c\x0bOrderedDict\x93"
    return pre, od + b"](" + key + b"K\x01\x86" + b"a" + b"\x85R"


def _codecs_of(pre: bytes, value: bytes) -> tuple[bytes, bytes]:  # _codecs.encode(value, "latin1")
    return pre, b"\x8c\x07_codecs\x8c\x06encode\x93" + value + _s("latin1") + b"\x86R"


def _s2p_of(pre: bytes, value: bytes) -> tuple[bytes, bytes]:  # inside StructuredToParameterName@@
    return pre, b"}(" + _s("llama.norm.weight") + value + b"u"


def _split_table_of(pre: bytes, value: bytes) -> tuple[bytes, bytes]:  # a slice name of the split table
    entry = _s("OriginShape") + b"]K\x01a" + _s("slices") + b"](" + value + b"e"
    return pre, b"}(" + _s("w") + b"}(" + entry + b"uu"


def _as_value(key: str, pv: tuple[bytes, bytes]) -> tuple[bytes, bytes, bytes]:
    """(prelude, key, value) of an entry ``key: <the bomb>``."""
    return pv[0], _s(key), pv[1]


_TB = _tuple_bomb(60)
_LB = _list_bomb(28, 2)
BOMBS: list[tuple[str, bytes, bytes, bytes]] = [  # name, prelude, key, value
    ("bomb-tuple-key", _TB[0], _TB[1], b"K\x01"),
    ("bomb-tuple-key-shallow", *_tuple_bomb(20)[:1], _tuple_bomb(20)[1], b"K\x01"),  # under the depth limit
    ("bomb-tuple-value", *_as_value("meta", _TB)),
    ("bomb-list-value", *_as_value("meta", _LB)),
    ("bomb-list-fan100", *_as_value("meta", _list_bomb(5, 100))),
    ("bomb-dict-value", *_as_value("meta", _dict_bomb(40))),
    ("bomb-growing", *_as_value("meta", _growing_list(40))),
    ("bomb-cycle", *_as_value("meta", _cycle())),
    ("bomb-ordereddict-key", *_as_value("meta", _ordered_dict_of(*_TB))),
    ("bomb-codecs-encode", *_as_value("meta", _codecs_of(*_LB))),
    ("bomb-in-structured-names", *_as_value("StructuredToParameterName@@", _s2p_of(*_LB))),
    ("bomb-split-table-slice", *_as_value("UnpackBigParamInfor@@", _split_table_of(*_TB))),
]

# ------------------------------------------------------------------ lengths (memory, tracebacks today)
LENGTHS = [
    ("len-binunicode8-2e63", _s("k"), b"\x8d" + struct.pack("<Q", 2**63)),
    ("len-binunicode-4g", _s("k"), b"X" + struct.pack("<I", 2**32 - 1)),
    ("len-binbytes8-max", _s("k"), b"\x8e" + struct.pack("<Q", 2**64 - 1)),
    ("len-binbytes-4g", _s("k"), b"B" + struct.pack("<I", 2**32 - 1)),
    ("len-binstring-neg", _s("k"), b"T" + struct.pack("<i", -1)),
    ("len-binstring-2g", _s("k"), b"T" + struct.pack("<i", 2**31 - 1)),
    ("len-long4-2g", _s("k"), b"\x8b" + struct.pack("<i", 2**31 - 1)),
    ("len-short-binbytes-past-end", _s("k"), b"C\xff"),
]
LINES = [  # (name, head, line length, tail): the text line runs this long before its newline
    ("line-global-600m", b"\x80\x02}q\x00(X\x01\x00\x00\x00kc", 600 * 1024**2, b"b\nK\x01\x85Ru."),
    ("line-inst-64m", b"\x80\x02}q\x00(X\x01\x00\x00\x00k(i", 64 * 1024**2, b"b\nu."),
    ("line-int-64m", b"\x80\x02}q\x00(X\x01\x00\x00\x00kI1", 64 * 1024**2, b"u."),
    ("line-get-64m", b"\x80\x02}q\x00(X\x01\x00\x00\x00kNp0\ng1", 64 * 1024**2, b"u."),
]


# ------------------------------------------------------------------ dtype strings (exit 70 today)
def _dtype_to(new: bytes, nth: int = 0) -> Callable[[bytes], bytes]:
    """Replace the fixture's ``nth`` memoized dtype string ``f4`` (SHORT_BINUNICODE, given to
    ``numpy.dtype``) by ``new``; every array that references it gets the new dtype string."""

    def fn(raw: bytes) -> bytes:
        old = b"\x8c\x02f4\x94"
        at = -1
        for _ in range(nth + 1):
            at = raw.index(old, at + 1)
        return raw[:at] + b"\x8c" + bytes([len(new)]) + new + b"\x94" + raw[at + len(old) :]

    return fn


def _order_to(new: bytes) -> Callable[[bytes], bytes]:
    """Replace the byte-order string ``<`` of the fixture's dtype states (one memoized string)."""

    def fn(raw: bytes) -> bytes:
        old = b"\x8c\x01<\x94"
        at = raw.index(old)
        return raw[:at] + b"\x8c" + bytes([len(new)]) + new + b"\x94" + raw[at + len(old) :]

    return fn


DTYPES = [
    # one-byte changes of "f4"
    ("dtype-f5", b"f5"),
    ("dtype-comma", b"f,"),  # numpy parses it as float32
    ("dtype-leading-comma", b",4"),
    ("dtype-O4", b"O4"),
    ("dtype-U4", b"U4"),
    ("dtype-V4", b"V4"),
    ("dtype-M4", b"M4"),
    ("dtype-nul", b"f\x00"),
    # other lengths
    ("dtype-subarray", b"(2,)f4"),
    ("dtype-structured", b"f4,f4"),
    ("dtype-syntax", b",f4"),  # numpy raises SyntaxError
    ("dtype-datetime", b"M8[s]"),
    ("dtype-bad-datetime", b"m8["),
    ("dtype-empty", b""),
]


def _dtype_not_str(raw: bytes) -> bytes:
    """numpy.dtype(7): an int where the dtype string was."""
    old = b"\x8c\x02f4\x94"
    at = raw.index(old)
    return raw[:at] + b"K\x07\x94" + raw[at + len(old) :]


ORDERS = [("order-bang", b"!"), ("order-empty", b""), ("order-two", b"<>"), ("order-big", b">")]


def _order_value(value: bytes) -> Callable[[bytes], bytes]:
    """Replace the memoized byte-order string ``<`` by the value ``value`` pushes (memoized in its place,
    so every dtype state that references it gets the value): found by the opcode fuzzer, a byte order
    that is a memo bomb was hashed (exponential time)."""

    def fn(raw: bytes) -> bytes:
        old = b"\x8c\x01<\x94"
        at = raw.index(old)
        return raw[:at] + value + b"\x94" + raw[at + len(old) :]

    return fn


ORDER_VALUES = [
    ("order-tuple-bomb", b")" + b"22\x87" * 40),
    ("order-deep-tuple", b")" + b"\x85" * 100_000),
    ("order-list", b"]"),
    ("order-int", b"K\x03"),
]


def _shape_edit(new: bytes) -> Callable[[bytes], bytes]:
    """Replace the shape of the fixture's first array state ``(K\\x01 <shape> numpy.dtype...``: the
    BININT1 1 version then a TUPLE of BININT1/BININT2 dims, up to the first ``\\x85``/``\\x86``."""

    def fn(raw: bytes) -> bytes:
        at = raw.index(b"(K\x01") + 3
        end = min(i for i in (raw.find(b"\x85", at), raw.find(b"\x86", at)) if i >= 0) + 1
        return raw[:at] + new + raw[end:]

    return fn


SHAPES = [
    ("shape-float", b"G" + struct.pack(">d", 16.0) + b"\x85"),
    ("shape-string", _s("16") + b"\x85"),
    ("shape-negative", b"J" + struct.pack("<i", -16) + b"\x85"),
    ("shape-huge", b"\x8a\x09" + (2**64).to_bytes(9, "little") + b"\x85"),
    ("shape-65-dims", b"(" + b"K\x01" * 65 + b"t"),
    ("shape-list", b"]K\x10a"),
    ("shape-none", b"N"),
]


# ------------------------------------------------------------------ special files (hang today)
def _fifo_as(rel: str, case: str = av.PD_ONE) -> Callable[[Path], Path]:
    def build(dest: Path) -> Path:
        ckpt = av.copy_case(case, dest / "ckpt")
        (ckpt / rel).unlink()
        os.mkfifo(ckpt / rel)
        return ckpt

    return build


def _link_as(rel: str, target: str) -> Callable[[Path], Path]:
    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.PD_ONE, dest / "ckpt")
        (ckpt / rel).unlink()
        (ckpt / rel).symlink_to(target)
        return ckpt

    return build


SHARD5 = "model_state-00005-of-00008.pdparams"


def _h(name: str, build: Callable[[Path], Path], *names: str) -> Hostile:
    return Hostile(f"pickle-{name}", "pickle", build, 3, names=(PD, *names))


CASES: list[Hostile] = [
    *[_h(n, _with_entry(key, value), "levels") for n, key, value, _ in DEEP],
    *[_h(n, _with_entry(_s("meta"), value), "levels deep") for n, value in DEEP_VALUES],
    *[_h(n, _with_entry(key, value, pre)) for n, pre, key, value in BOMBS],
    *[_h(n, _with_entry(key, value)) for n, key, value in LENGTHS],
    *[_h(n, _sparse_line(head, size, tail), "bytes") for n, head, size, tail in LINES],
    *[_h(n, _edit_raw(_dtype_to(code)), "dtype", "tensor") for n, code in DTYPES],
    _h("dtype-int", _edit_raw(_dtype_not_str), "dtype", "tensor"),
    # not UTF-8: refused as a malformed string, before it is known to be a dtype
    _h("dtype-not-utf8", _edit_raw(_dtype_to(b"f\xc3")), "malformed pickle"),
    *[_h(n, _edit_raw(_order_to(o)), "tensor") for n, o in ORDERS],
    *[_h(n, _edit_raw(_order_value(v)), "tensor", "byte order") for n, v in ORDER_VALUES],
    *[_h(n, _edit_raw(_shape_edit(b)), "tensor") for n, b in SHAPES],
    _h("fifo-pdparams", _fifo_as(PD), "FIFO"),
    Hostile(
        "pickle-fifo-shard",
        "pickle",
        _fifo_as(SHARD5, av.PD_SHARDED),
        3,
        names=(SHARD5, "FIFO"),
    ),
    _h("dev-zero-pdparams", _link_as(PD, "/dev/zero"), "character device"),
    _h("dev-null-pdparams", _link_as(PD, "/dev/null"), "character device"),
]
