"""Property: reading any byte-mutation of a small checkpoint either works or raises ``TietoolError``.

The reader is what every command runs first: ``tietool.surgery.checkpoint.Checkpoint.open`` (config, index,
headers or pickle walk) and ``tietool.surgery.detect.detect`` (embedding/head lookup, value comparison, which
loads tensor data).
Anything else escaping (ValueError, KeyError, TypeError, RecursionError, MemoryError, ...) is a bug: the CLI
would report it as an internal error (exit 70) instead of a one-line "bad checkpoint" message.

Mutations (hypothesis draws 1-8 of them, positions biased towards the structure: the safetensors JSON header,
the pickle opcodes before the first array payload): flip a bit, overwrite a byte, delete a byte, insert a
byte, truncate. ``derandomize=True`` keeps CI deterministic; ``database=None`` keeps the source tree clean.

``.pdparams`` mutants that read are also run through the write operations in-process (``tie``, ``untie``,
``resize``, ``convert`` of the Python API, each into a fresh ``out``): a mutant the reader accepts must be
written or refused, never crash the writer. Besides byte mutations, pickle mutants are made at the opcode
level (:func:`pickle_mutations`): another opcode, a changed length or memo index, a global renamed, an opcode
deleted or repeated, nesting or a memo bomb inserted at an opcode boundary. The default run has a few hundred
examples per property; the ``slow`` variants run thousands.
"""

from __future__ import annotations

import pickletools
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import adversarial_support as av

import tietool
from tietool.surgery.checkpoint import Checkpoint
from tietool.surgery.detect import detect
from tietool.surgery.errors import TietoolError

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
SLOW = settings(SETTINGS, max_examples=3000)

ST_RAW = (av.CASES / av.ST_ONE / av.ST_ONE_FILE).read_bytes()
PD_RAW = (av.CASES / av.PD_ONE / av.PD_FILE).read_bytes()
ST_HEADER_END = 8 + av.st_header_len(ST_RAW)
PD_STRUCT_END = av.pd_first_payload(PD_RAW)[0] + 5


def mutations(size: int, hot_end: int):
    pos = st.one_of(st.integers(0, hot_end - 1), st.integers(0, size - 1))
    one = st.tuples(
        st.sampled_from(["flip", "set", "delete", "insert", "truncate"]), pos, st.integers(0, 255)
    )
    return st.lists(one, min_size=1, max_size=8)


def mutate(raw: bytes, muts) -> bytes:
    b = bytearray(raw)
    for kind, pos, val in muts:
        if not b:
            break
        pos %= len(b)
        if kind == "flip":
            b[pos] ^= 1 << (val % 8)
        elif kind == "set":
            b[pos] = val
        elif kind == "delete":
            del b[pos]
        elif kind == "insert":
            b.insert(pos, val)
        else:
            del b[pos:]
    return bytes(b)


@pytest.fixture(scope="module")
def st_ckpt(tmp_path_factory) -> Path:
    return av.copy_case(av.ST_ONE, tmp_path_factory.mktemp("fuzz_st") / "ckpt")


@pytest.fixture(scope="module")
def pd_ckpt(tmp_path_factory) -> Path:
    return av.copy_case(av.PD_ONE, tmp_path_factory.mktemp("fuzz_pd") / "ckpt")


def read_or_refuse(ckpt: Path) -> bool:
    """True: the checkpoint read and detected; False: a clean refusal (anything else propagates and fails
    the property)."""
    try:
        c = Checkpoint.open(ckpt)
        detect(c, compare_values=True)
    except TietoolError:
        return False
    return True


WRITES = {
    "tie": lambda ckpt, out: tietool.tie(ckpt, out, keep="embedding"),
    "untie": lambda ckpt, out: tietool.untie(ckpt, out),
    "resize": lambda ckpt, out: tietool.resize(ckpt, 256, out),
    "convert": lambda ckpt, out: tietool.convert(ckpt, "paddleformers", out),
}


def write_or_refuse(ckpt: Path, outs: Path) -> None:
    """Every write operation on ``ckpt`` (in-process, into a fresh folder under ``outs``): written or a
    ``TietoolError``; the input is unchanged and a refusal leaves no output."""
    before = av.tree_state(ckpt)
    for op, run in WRITES.items():
        out = outs / op
        try:
            run(ckpt, out)
        except TietoolError:
            assert not out.exists(), f"{op}: refused but left {out}"
        finally:
            shutil.rmtree(out, ignore_errors=True)
    assert av.tree_state(ckpt) == before, "a write operation changed its input"


def read_write_or_refuse(ckpt: Path, outs: Path) -> None:
    """:func:`read_or_refuse`, then the writes when it read (a mutant the reader refuses is refused by
    every operation in the same way: they all open it first)."""
    if read_or_refuse(ckpt):
        write_or_refuse(ckpt, outs)


def test_unmutated_fixtures_read(st_ckpt: Path, pd_ckpt: Path) -> None:
    """Control: the fixtures themselves read and detect."""
    for ckpt in (st_ckpt, pd_ckpt):
        detect(Checkpoint.open(ckpt), compare_values=True)


@SETTINGS
@given(muts=mutations(len(ST_RAW), ST_HEADER_END))
def test_safetensors_mutations_read_or_refuse(st_ckpt: Path, muts) -> None:
    (st_ckpt / av.ST_ONE_FILE).write_bytes(mutate(ST_RAW, muts))
    read_or_refuse(st_ckpt)


@pytest.fixture(scope="module")
def outs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz_out")


@SETTINGS
@given(muts=mutations(len(PD_RAW), PD_STRUCT_END))
def test_pdparams_mutations_read_or_refuse(pd_ckpt: Path, outs: Path, muts) -> None:
    (pd_ckpt / av.PD_FILE).write_bytes(mutate(PD_RAW, muts))
    read_write_or_refuse(pd_ckpt, outs)


@pytest.mark.slow
@SLOW
@given(muts=mutations(len(PD_RAW), PD_STRUCT_END))
def test_pdparams_mutations_read_or_refuse_slow(pd_ckpt: Path, outs: Path, muts) -> None:
    (pd_ckpt / av.PD_FILE).write_bytes(mutate(PD_RAW, muts))
    read_write_or_refuse(pd_ckpt, outs)


# ------------------------------------------------------------------ opcode-level pickle mutations
PD_OPS = [(pos, op, arg) for op, arg, pos in pickletools.genops(PD_RAW)]  # (offset, opcode, argument)
PD_STRUCT_OPS = [i for i, (pos, _, _) in enumerate(PD_OPS) if pos < PD_STRUCT_END]
PD_ENDS = [pos for pos, _, _ in PD_OPS[1:]] + [len(PD_RAW)]
WALKER_OPCODES = sorted(
    set(b"\x80\x95}])(dlt\x85\x86\x87suae\x94qrphjg\x8cX\x8dUTCB\x8eN\x88\x89JKM\x8a\x8bIGc\x93ioR\x81b012.")
)
LENGTH_OPS = {  # opcode -> (offset of the length in the opcode, struct format)
    "SHORT_BINUNICODE": (1, "<B"),
    "BINUNICODE": (1, "<I"),
    "BINUNICODE8": (1, "<Q"),
    "SHORT_BINBYTES": (1, "<B"),
    "BINBYTES": (1, "<I"),
    "BINBYTES8": (1, "<Q"),
    "SHORT_BINSTRING": (1, "<B"),
    "BINSTRING": (1, "<i"),
    "FRAME": (1, "<Q"),
}
MEMO_OPS = {"BINGET": "<B", "BINPUT": "<B", "LONG_BINGET": "<I", "LONG_BINPUT": "<I"}
NAMES = [
    "numpy",
    "numpy.core.multiarray",
    "numpy._core.multiarray",
    "_reconstruct",
    "scalar",
    "ndarray",
    "dtype",
    "collections",
    "OrderedDict",
    "_codecs",
    "encode",
    "os",
    "system",
    "builtins",
    "eval",
    "getattr",
    "numpy.lib.format",
    "memmap",
    "",
    "numpy\n",
    "a" * 300,
]
GLOBAL_STRINGS = [
    i for i, (_, op, arg) in enumerate(PD_OPS) if op.name == "SHORT_BINUNICODE" and arg in NAMES
]


def _nesting(kind: int, n: int, memo: int) -> bytes:
    """Bytes that push one value: nested ``n`` deep (tuple, list, dict, MARK-tuple) or a memo bomb of ``n``
    levels around memo entry ``memo`` (which may not exist: then a KeyError, a refusal)."""
    if kind == 0:
        return b")" + b"\x85" * n
    if kind == 1:
        return b"]" * n + b"a" * (n - 1)
    if kind == 2:
        return (b"}\x8c\x01k") * n + b"}" + b"s" * n
    if kind == 3:
        return b"(" * n + b")" + b"t" * n
    # a memo bomb: DUP, TUPLE2 doubles the value every 2 bytes
    return b"j" + struct.pack("<I", memo) + b"2\x86" * n


def pickle_mutations():
    """Opcode-level mutations of the fixture's pickle, each ``(kind, opcode index, value)``."""
    op_i = st.one_of(st.sampled_from(PD_STRUCT_OPS), st.integers(0, len(PD_OPS) - 1))
    return st.lists(
        st.one_of(
            st.tuples(st.just("opcode"), op_i, st.sampled_from(WALKER_OPCODES) | st.integers(0, 255)),
            st.tuples(
                st.just("length"),
                op_i,
                st.sampled_from([-1, 1, -8, 8, 2**31, 2**32 - 1, 2**63]) | st.integers(-300, 300),
            ),
            st.tuples(st.just("memo"), op_i, st.integers(0, 300) | st.sampled_from([2**31, 2**32 - 1])),
            st.tuples(st.just("global"), st.sampled_from(GLOBAL_STRINGS), st.sampled_from(NAMES)),
            st.tuples(st.just("delete"), op_i, st.just(0)),
            st.tuples(st.just("repeat"), op_i, st.integers(1, 50)),
            st.tuples(
                st.just("nest"),
                op_i,
                st.tuples(
                    st.integers(0, 4), st.sampled_from([1, 2, 31, 33, 1000, 100_000]), st.integers(0, 40)
                ),
            ),
        ),
        min_size=1,
        max_size=4,
    )


def _edit_op(i: int, kind: str, value) -> tuple[int, int, bytes]:
    """(start, end, replacement) of one opcode-level mutation of opcode ``i`` of the fixture."""
    pos, op, arg = PD_OPS[i]
    end = PD_ENDS[i]
    raw = PD_RAW[pos:end]
    if kind == "opcode":
        return pos, pos + 1, bytes([value])
    if kind == "length" and op.name in LENGTH_OPS:
        at, fmt = LENGTH_OPS[op.name]
        n = struct.calcsize(fmt)
        old = struct.unpack(fmt, raw[at : at + n])[0]
        lo, hi = (-(2 ** (8 * n - 1)), 2 ** (8 * n - 1) - 1) if fmt[-1].islower() else (0, 2 ** (8 * n) - 1)
        new = value if abs(value) > 300 else old + value
        return pos + at, pos + at + n, struct.pack(fmt, min(max(new, lo), hi))
    if kind == "memo" and op.name in MEMO_OPS:
        fmt = MEMO_OPS[op.name]
        return pos + 1, end, struct.pack(fmt, value % 2 ** (8 * struct.calcsize(fmt)))
    if kind == "global":
        b = value.encode()
        return pos, end, (b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + struct.pack("<I", len(b))) + b
    if kind == "delete":
        return pos, end, b""
    if kind == "repeat":
        return pos, end, raw * value
    if kind == "nest":
        return pos, pos, _nesting(*value)
    return pos, pos, b""  # a mutation that does not apply to this opcode


def pickle_mutate(muts) -> bytes:
    """Apply opcode-level mutations to the fixture (later edits first, so earlier offsets stay valid)."""
    edits = sorted((_edit_op(i, kind, v) for kind, i, v in muts), reverse=True)
    b = bytearray(PD_RAW)
    last = len(b) + 1
    for start, end, new in edits:
        if end > last:  # overlaps an edit already made
            continue
        b[start:end] = new
        last = start
    return bytes(b)


@SETTINGS
@given(muts=pickle_mutations())
def test_pdparams_opcode_mutations_read_or_refuse(pd_ckpt: Path, outs: Path, muts) -> None:
    (pd_ckpt / av.PD_FILE).write_bytes(pickle_mutate(muts))
    read_write_or_refuse(pd_ckpt, outs)


@pytest.mark.slow
@SLOW
@given(muts=pickle_mutations())
def test_pdparams_opcode_mutations_read_or_refuse_slow(pd_ckpt: Path, outs: Path, muts) -> None:
    (pd_ckpt / av.PD_FILE).write_bytes(pickle_mutate(muts))
    read_write_or_refuse(pd_ckpt, outs)


def test_opcode_mutations_control() -> None:
    """Control for :func:`pickle_mutate`: each kind of mutation changes the pickle where it should."""
    i = next(i for i, (_, op, _) in enumerate(PD_OPS) if op.name == "SHORT_BINUNICODE")
    assert pickle_mutate([("delete", i, 0)]) != PD_RAW
    assert pickle_mutate([("global", GLOBAL_STRINGS[0], "os")]).count(b"\x8c\x02os") == 1
    assert len(pickle_mutate([("nest", 5, (0, 1000, 0))])) == len(PD_RAW) + 1001
    assert pickle_mutate([("length", i, 1)])[PD_OPS[i][0] + 1] == PD_RAW[PD_OPS[i][0] + 1] + 1


ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
SMALL_INT = st.integers(-2, 2**66) | st.sampled_from([0, 1, 16, 100, 2**32, 2**63])
ENTRY = st.one_of(
    ANY_JSON,
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(
                ["F32", "F16", "BF16", "U16", "I64", "BOOL", "F8_E4M3", "f32", "", "F33"]
            )
            | ANY_JSON,
            "shape": st.lists(SMALL_INT, max_size=3) | ANY_JSON,
            "data_offsets": st.lists(SMALL_INT, min_size=2, max_size=2) | ANY_JSON,
        }
    ),
)


@SETTINGS
@given(
    name=st.sampled_from(["model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"]), entry=ENTRY
)
def test_safetensors_header_entry_of_any_shape(st_ckpt: Path, name: str, entry) -> None:
    """One header entry replaced by arbitrary JSON (dtype/shape/offsets of any type, size): read or refuse."""
    h, data = av.st_parse(ST_RAW)
    h[name] = entry
    (st_ckpt / av.ST_ONE_FILE).write_bytes(av.st_build(h, data))
    read_or_refuse(st_ckpt)


NP_CODES = [
    "f4",
    "<f4",
    ">f4",
    "f2",
    "f8",
    "u2",
    "i8",
    "i1",
    "?",
    "c8",
    "V8",
    "U2",
    "S4",
    "M8[s]",
    "m8[s]",
    "O",
]


@SETTINGS
@given(
    name=st.sampled_from(["llama.norm.weight", "llama.embed_tokens.weight", "lm_head.weight"]),
    code=st.sampled_from(NP_CODES),
    shape=st.sampled_from([[100, 16], [16, 100], [16], [2**32, 2**32], [-100, -16]])
    | st.lists(st.integers(-4, 20) | st.sampled_from([16, 100, 2**32, 2**62]), max_size=3),
    consistent=st.booleans(),
    nbytes=st.integers(0, 7000),
    fortran=st.booleans(),
)
def test_pdparams_array_of_any_header(
    pd_ckpt: Path, name: str, code: str, shape, consistent: bool, nbytes: int, fortran: bool
) -> None:
    """One array of the state dict given any numpy dtype, shape and payload length (often the length that
    shape × itemsize, computed in 64 bits as numpy does, asks for): read or refuse."""
    import numpy as np

    dt = np.dtype(code)
    if consistent:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize % 2**64 if shape else dt.itemsize
        if not 0 <= nbytes <= 100_000:
            nbytes = 0
    sd = av.pd_state()
    sd[name] = av.FakeArray(shape, dt, b"\x01" * nbytes, fortran)
    av.pd_dump(sd, pd_ckpt / av.PD_FILE, 4)
    read_or_refuse(pd_ckpt)
