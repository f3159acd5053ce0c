"""Property: reading any byte-mutation of a small checkpoint either works or raises ``TietoolError``.

The reader is what every command runs first: ``tietool.surgery.io.checkpoint.Checkpoint.open`` (config, index,
headers or pickle walk) and ``tietool.surgery.inspect.detect.detect`` (embedding/head lookup, value
comparison, which
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
examples per property; the ``slow`` variants run an eighth of their full counts (375 of 3,000; 200, the
fast twins' count, of 1,500), the full counts under ``TIETOOL_DEEP_FUZZ=1`` (:mod:`support.fuzz_budget`).
"""

from __future__ import annotations

import copy
import json
import pickletools
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import adversarial_support as av
from support.fuzz_budget import fast_twin, slow_examples  # noqa: F401 - fast_twin: autouse (TWINS)

import tietool
from tietool.surgery.inspect.detect import detect
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.model.errors import TietoolError

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
SLOW = settings(SETTINGS, max_examples=slow_examples(3000))

# fast variant -> its slow twin (same property, same or wider strategy, more examples)
TWINS = {
    n: n + "_slow"
    for n in (
        "test_pdparams_mutations_read_or_refuse",
        "test_pdparams_opcode_mutations_read_or_refuse",
        "test_safetensors_header_mutations_through_every_write",
        "test_safetensors_byte_mutations_through_every_write",
    )
} | {
    "test_index_mutants_read_write_or_refuse": "test_index_mutants_many",
    "test_config_mutants_read_write_or_refuse": "test_config_mutants_many",
    "test_tokenizer_mutants_read_write_or_refuse": "test_tokenizer_mutants_many",
}


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


PD_WRITES = {
    "tie": lambda ckpt, out: tietool.tie(ckpt, out, keep="embedding"),
    "untie": lambda ckpt, out: tietool.untie(ckpt, out),
    "resize": lambda ckpt, out: tietool.resize(ckpt, 256, out),
    "convert": lambda ckpt, out: tietool.convert(ckpt, "paddleformers", out),
}


def every_write_or_refuse(ckpt: Path, outs: Path) -> None:
    """Every write operation on ``ckpt`` (in-process, into a fresh folder under ``outs``): written or a
    ``TietoolError``; the input is unchanged and a refusal leaves no output."""
    before = av.tree_state(ckpt)
    for op, run in PD_WRITES.items():
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
        every_write_or_refuse(ckpt, outs)


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


# ------------------------------------------------------------------ safetensors: every write operation
# Issue 18: 718 of ~36,000 fuzzed safetensors mutants exited 70, at several sites past the reader (tie,
# untie, resize, convert). So a mutant the reader accepts also goes through each write operation in
# process (the Python API, into a temporary --out): each must work or raise TietoolError. The mutations are
# byte-level (above) and structure-aware: a header entry's field given a value of another type or range
# (written as JSON text, so ``Infinity``, ``-0``, 1e400 and 4,301-digit integers reach the file), a field
# removed or repeated, a tensor repeated or renamed, offsets shifted or swapped, a dtype relabelled, extra
# fields and odd ``__metadata__``, the data lengthened or shortened.
WRITES = ("tie", "untie", "resize", "convert")
ST_HEADER, ST_DATA = av.st_parse(ST_RAW)
ST_NAMES = sorted(ST_HEADER)
RAW_VALUES = st.sampled_from(
    [
        "Infinity",
        "-Infinity",
        "NaN",
        "-0",
        "1e400",
        "1e2",
        "1.0",
        "true",
        "null",
        '"16"',
        "[]",
        "{}",
        "[-0]",
        "[16, -0]",
        "[" + "9" * 4301 + "]",
        f"[{2**64}]",
        f"[{2**64 - 1}]",
        f"[0, {2**64 - 1}]",
        "[[16]]",
        '{"F32": null}',
        '"BF16"',
        '"U16"',
        '"F8_E4M3"',
        '"F4"',
        '"I64"',
    ]
)
FIELD = st.sampled_from(["dtype", "shape", "data_offsets", "extra"])
# labels of the same width: a relabelled tensor keeps a valid size (the reader accepts it, the writes run)
SAME_WIDTH = {
    "F32": ["I32", "U32", "F16", "BF16"],
    "BF16": ["F16", "U16", "I16"],
    "F16": ["BF16", "U16"],
    "U16": ["BF16", "F16"],
}


def _apply(h: dict, kind: str, name: str, other: str, field: str, raw: str, k: int) -> tuple[str, int]:
    """One structural mutation of header ``h`` (edited in place): the JSON text of the result, and how many
    bytes to add (> 0) or cut (< 0) at the end of the data."""
    raws: list[str] = []

    def put(value_text: str) -> str:
        raws.append(value_text)
        return f"@RAW{len(raws) - 1}@"

    e = h[name] if isinstance(h.get(name), dict) else None
    grow = 0
    dup = ""
    if kind == "set" and e is not None:
        e[field] = put(raw)
    elif kind == "delete" and e is not None:
        e.pop(field, None)
    elif kind == "duplicate-field" and e is not None and field in e:
        dup = f'"{field}": {json.dumps(e[field])}, '
    elif kind == "duplicate-tensor":
        dup = f"{json.dumps(name)}: {json.dumps(h[name])}, "
    elif kind == "rename" and name != "__metadata__":
        h[f"{name}.{k}"] = h.pop(name)
    elif kind == "shift" and e is not None and isinstance(e.get("data_offsets"), list):
        e["data_offsets"] = [o + k - 4 if isinstance(o, int) else o for o in e["data_offsets"]]
    elif kind == "swap" and e is not None and isinstance(h.get(other), dict):
        e["data_offsets"], h[other]["data_offsets"] = h[other].get("data_offsets"), e.get("data_offsets")
    elif kind == "metadata":
        h["__metadata__"] = put(raw) if k % 2 else {"format": put(raw)}
    elif kind == "empty-tensor":
        h[f"empty.{k}"] = {"dtype": "F32", "shape": [0], "data_offsets": [k * 4, k * 4]}
    elif kind == "data":
        grow = k - 4
    elif kind == "extra-field" and e is not None:
        e[f"x{k}"] = put(raw)  # a field the library ignores (valid unless the value is not JSON)
    elif kind == "as-list" and e is not None and all(f in e for f in ("dtype", "shape", "data_offsets")):
        h[name] = [e["dtype"], e["shape"], e["data_offsets"]]  # serde reads a struct from a list too
    elif kind == "unit-variant" and e is not None and isinstance(e.get("dtype"), str):
        e["dtype"] = {e["dtype"]: None}
    elif kind == "reorder" and e is not None:
        h[name] = dict(reversed(list(e.items())))
    elif kind == "relabel" and e is not None and isinstance(e.get("dtype"), str) and e["dtype"] in SAME_WIDTH:
        e["dtype"] = SAME_WIDTH[e["dtype"]][k % len(SAME_WIDTH[e["dtype"]])]
    elif kind == "reshape" and e is not None and isinstance(e.get("shape"), list) and len(e["shape"]) == 2:
        # same bytes, the same or another rank (a 1-D or 3-D embedding is refused by name)
        a, b = e["shape"]
        n = a * b if isinstance(a, int) and isinstance(b, int) else 0
        e["shape"] = [[b, a], [1, n], [n, 1], [n], [1, a, b], [a, 1, b]][k % 6]
    text = json.dumps(h)
    if kind == "pad":
        text = " \n\t"[: k % 4] + text + " " * k  # JSON whitespace around the object: valid
    if dup:
        key = json.dumps(name) + ": {"
        text = text.replace(key, key + dup, 1) if kind == "duplicate-field" else "{" + dup + text[1:]
    for i, r in enumerate(raws):
        text = text.replace(json.dumps(f"@RAW{i}@"), r)
    return text, grow


HEADER_MUTATION = st.tuples(
    st.sampled_from(
        [
            "set",
            "set",
            "set",
            "delete",
            "duplicate-field",
            "duplicate-tensor",
            "rename",
            "shift",
            "swap",
            "metadata",
            "empty-tensor",
            "data",
            "extra-field",
            "as-list",
            "unit-variant",
            "reorder",
            "relabel",
            "relabel",
            "pad",
            "reshape",
            "reshape",
        ]
    ),
    st.sampled_from([*ST_NAMES, "__metadata__"]),
    st.sampled_from(ST_NAMES),
    FIELD,
    RAW_VALUES | ANY_JSON.map(json.dumps),
    st.integers(0, 8),
)


def structural_mutant(muts) -> bytes:
    """The fixture shard with the header mutations ``muts`` applied in turn (each on the last one's JSON,
    as long as it still parses)."""
    h, data = json.loads(json.dumps(ST_HEADER)), ST_DATA
    text = json.dumps(h)
    for kind, name, other, field, raw, k in muts:
        try:
            h = json.loads(text)
        except ValueError:
            break  # the text is no longer JSON Python reads: keep it as it is
        if not isinstance(h, dict) or name not in h and kind != "metadata":
            continue
        text, grow = _apply(h, kind, name, other, field, raw, k)
        data = data + b"\0" * grow if grow >= 0 else data[:grow]
    blob = text.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(blob)) + blob + data


def st_write_or_refuse(ckpt: Path, out_root: Path) -> None:
    """Open + detect (:func:`read_or_refuse`); when the reader accepts, each write operation into a fresh
    ``--out``: work or raise ``TietoolError`` (anything else fails the property)."""
    import tietool

    try:
        detect(Checkpoint.open(ckpt), compare_values=True)
    except TietoolError:
        return  # refused by the reader: every command refuses it the same way
    for op in WRITES:
        out = out_root / op
        try:
            if op == "resize":
                tietool.resize(ckpt, 256, out, seed=0)
            elif op == "convert":
                tietool.convert(ckpt, "paddleformers", out)
            else:
                getattr(tietool, op)(ckpt, out)
        except TietoolError:
            pass
        finally:
            shutil.rmtree(out, ignore_errors=True)


def _fuzz_header(st_ckpt: Path, tmp_path_factory, muts) -> None:
    (st_ckpt / av.ST_ONE_FILE).write_bytes(structural_mutant(muts))
    st_write_or_refuse(st_ckpt, tmp_path_factory.mktemp("fuzz_out", numbered=True))


@SETTINGS
@given(muts=st.lists(HEADER_MUTATION, min_size=1, max_size=4))
def test_safetensors_header_mutations_through_every_write(st_ckpt: Path, tmp_path_factory, muts) -> None:
    """Structure-aware header mutations: read, then tie/untie/resize/convert, each works or refuses."""
    _fuzz_header(st_ckpt, tmp_path_factory, muts)


@SETTINGS
@given(muts=mutations(len(ST_RAW), ST_HEADER_END))
def test_safetensors_byte_mutations_through_every_write(st_ckpt: Path, tmp_path_factory, muts) -> None:
    """Byte mutations (as :func:`test_safetensors_mutations_read_or_refuse`) through every write."""
    (st_ckpt / av.ST_ONE_FILE).write_bytes(mutate(ST_RAW, muts))
    st_write_or_refuse(st_ckpt, tmp_path_factory.mktemp("fuzz_out", numbered=True))


@pytest.mark.slow
@settings(SETTINGS, max_examples=slow_examples(3000))
@given(muts=st.lists(HEADER_MUTATION, min_size=1, max_size=6))
def test_safetensors_header_mutations_through_every_write_slow(st_ckpt: Path, tmp_path_factory, muts) -> None:
    """The slow set: thousands of structural mutants through every write."""
    _fuzz_header(st_ckpt, tmp_path_factory, muts)


@pytest.mark.slow
@settings(SETTINGS, max_examples=slow_examples(3000))
@given(muts=mutations(len(ST_RAW), ST_HEADER_END))
def test_safetensors_byte_mutations_through_every_write_slow(st_ckpt: Path, tmp_path_factory, muts) -> None:
    """The slow set: thousands of byte mutants through every write."""
    (st_ckpt / av.ST_ONE_FILE).write_bytes(mutate(ST_RAW, muts))
    st_write_or_refuse(st_ckpt, tmp_path_factory.mktemp("fuzz_out", numbered=True))


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


# ------------------------------------------------------------------ the JSON files: index and config
# Structure-aware mutants of model.safetensors.index.json and config.json (issue 18: 906 of ~36,000 index
# mutants exited 70): a value anywhere in the document replaced by one of the wrong type, a huge or
# non-finite number (written as raw JSON text: Python cannot even dump 10**5000), a deep nesting, an odd
# file name; or the text's bytes mutated. Each mutant is read (Checkpoint.open + detect) and written (tie,
# resize, untie to a fresh --out) in-process: only success or a TietoolError may come out.


class Raw(str):
    """JSON text put into a document as it is (``1e400``, a 5,000-digit integer, ``[[[...]]]``)."""


def dumps(obj) -> str:
    """``json.dumps`` that writes :class:`Raw` values verbatim (iterative over the document's depth is not
    needed: the documents here are shallow; deep nestings are Raw)."""
    if isinstance(obj, Raw):
        return str(obj)
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {dumps(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + ", ".join(dumps(v) for v in obj) + "]"
    return json.dumps(obj)


HOSTILE_SCALARS = [
    Raw("9" * 5000),  # over CPython's 4,300-digit int limit
    Raw("-" + "1" * 4301),
    Raw("1e400"),  # parses to inf
    Raw("-1e400"),
    Raw("Infinity"),
    Raw("NaN"),
    Raw("[" * 10_000 + "]" * 10_000),  # deeper than any recursive parser
    Raw("{" + '"a": {' * 3000 + "}" * 3001),
    Raw('"\\ud800"'),  # a lone surrogate
    2**64,
    -1,
    0,
    True,
    1.5,
    None,
    "",
    "100",
    [],
    [1, 2],
    {},
    {"a": 1},
]
ODD_NAMES = [
    "x" * 300 + ".safetensors",  # over 255 bytes: ENAMETOOLONG
    "é" * 130 + ".safetensors",  # 260 bytes in UTF-8, 143 characters
    "../model-00001-of-00009.safetensors",
    "/etc/passwd",
    "sub/model-00001-of-00009.safetensors",
    "model-00001-of-00009.safetensors\\x",
    ".hidden.safetensors",
    ".",
    "..",
    "model\x00.safetensors",
    "model-00001-of-00009.safetensors ",
    "config.json",
    "model-00099-of-00009.safetensors",
    "",
]
HOSTILE_VALUE = st.sampled_from(HOSTILE_SCALARS).map(copy.deepcopy) | ANY_JSON
HOSTILE_NAME = st.sampled_from(ODD_NAMES) | st.text(max_size=12)


def _paths(doc, prefix=()):
    """Every (path tuple) to a value in ``doc``, the root included."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _replace(doc, path, value):
    if not path:
        return value
    doc = copy.deepcopy(doc)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return doc


@st.composite
def json_mutant(draw, doc: dict, names=HOSTILE_NAME, keys: tuple[str, ...] = ()) -> bytes:
    """One mutant of ``doc`` as the bytes of a file: 1-3 structure-aware edits (a value replaced, a
    weight_map file name made odd, a key added at the top or in a nested object, a key deleted), and
    sometimes byte mutations of the result."""
    doc = copy.deepcopy(doc)  # never edit the module's document or a shared hostile value
    paths = list(_paths(doc))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["replace", "name", "add", "delete"]))
        if kind == "replace":
            doc = _replace(doc, draw(st.sampled_from(paths)), draw(HOSTILE_VALUE))
        elif kind == "name" and isinstance(doc, dict) and isinstance(doc.get("weight_map"), dict):
            wm = doc["weight_map"]
            if wm:
                doc = _replace(doc, ("weight_map", draw(st.sampled_from(sorted(wm)))), draw(names))
        elif kind == "add" and isinstance(doc, dict):
            key = draw(st.sampled_from(keys) | st.text(max_size=8)) if keys else draw(st.text(max_size=8))
            where = draw(st.sampled_from([p for p in paths if not p] + [("text_config",), ("metadata",)]))
            target = doc if not where else doc.get(where[0])
            if where and not isinstance(target, dict):
                doc = _replace(doc, where, {key: draw(HOSTILE_VALUE)})
            elif isinstance(target, dict):
                target[key] = draw(HOSTILE_VALUE)
        elif kind == "delete" and len(paths) > 1:
            path = draw(st.sampled_from(paths[1:]))
            try:
                parent = doc
                for p in path[:-1]:
                    parent = parent[p]
                del parent[path[-1]]
            except (KeyError, IndexError, TypeError):
                pass
        paths = list(_paths(doc))
    raw = dumps(doc).encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 4)) == 0:
        raw = mutate(raw, draw(mutations(len(raw), len(raw))))
    return raw


def write_or_refuse(ckpt: Path, scratch: Path, ops) -> None:
    """Open + detect, then each of ``ops`` (``(name, kwargs)`` of :mod:`tietool.surgery.ops`) to a
    fresh ``--out`` under ``scratch``: only success or a TietoolError may come out; a refusal leaves no
    output behind."""
    read_or_refuse(ckpt)
    for i, (op, kw) in enumerate(ops):
        out = scratch / f"out{i}"
        try:
            _op(op)(ckpt, out=out, **kw)
        except TietoolError:
            assert not out.exists(), f"{op} refused but left {out}"
        finally:
            shutil.rmtree(out, ignore_errors=True)


def _op(name: str):
    """An operation by name: ``tie``/``untie``/``resize`` of :mod:`tietool.surgery.ops`, ``convert``
    (to PaddleFormers), ``verify`` (the input against itself; ``out`` unused)."""
    from tietool.surgery import ops as operations
    from tietool.surgery.ops import convert

    if name == "convert":
        return lambda ckpt, out, **kw: convert(ckpt, "paddleformers", out, **kw)
    if name == "verify":
        return lambda ckpt, out, **kw: operations.verify(ckpt, ckpt)
    return getattr(operations, name)


INDEX_CASE = "pf_llama_untied_sharded"
INDEX_DOC = json.loads((av.CASES / INDEX_CASE / av.ST_INDEX).read_text())
INDEX_OPS = (("tie", {"keep": "embedding"}), ("resize", {"vocab_size": 256}), ("convert", {}), ("verify", {}))
CONFIG_CASE = av.ST_ONE
CONFIG_DOC = json.loads((av.CASES / CONFIG_CASE / "config.json").read_text())
CONFIG_OPS = (
    ("untie", {}),
    ("resize", {"vocab_size": 256}),
    ("resize", {"vocab_size": 256, "init": "normal"}),  # draws with the config's initializer_range
    ("convert", {}),
    ("verify", {}),
)
CONFIG_KEYS = tuple(CONFIG_DOC) + (
    "text_config",
    "llm_config",
    "padded_vocab_size",
    "d_model",
    "tensor_parallel_degree",
    "init_args",
)


@pytest.fixture(scope="module")
def index_ckpt(tmp_path_factory) -> Path:
    return av.copy_case(INDEX_CASE, tmp_path_factory.mktemp("fuzz_index") / "ckpt")


@pytest.fixture(scope="module")
def config_ckpt(tmp_path_factory) -> Path:
    return av.copy_case(CONFIG_CASE, tmp_path_factory.mktemp("fuzz_config") / "ckpt")


@pytest.fixture(scope="module")
def pd_config_ckpt(tmp_path_factory) -> Path:
    return av.copy_case(av.PD_ONE, tmp_path_factory.mktemp("fuzz_pd_config") / "ckpt")


def test_unmutated_json_fixtures_write(
    index_ckpt: Path, config_ckpt: Path, pd_config_ckpt: Path, tmp_path: Path
) -> None:
    """Control: the unmutated index and config checkpoints are written by every op the fuzzers run (so a
    mutant's refusal is the mutant's doing)."""
    for ckpt, ops in ((index_ckpt, INDEX_OPS), (config_ckpt, CONFIG_OPS), (pd_config_ckpt, CONFIG_OPS)):
        for i, (op, kw) in enumerate(ops):
            _op(op)(ckpt, out=tmp_path / f"{ckpt.parent.name}{i}", **kw)


def _index_property(index_ckpt: Path, tmp_path_factory, raw: bytes) -> None:
    (index_ckpt / av.ST_INDEX).write_bytes(raw)
    write_or_refuse(index_ckpt, tmp_path_factory.mktemp("o"), INDEX_OPS)


def _config_property(config_ckpt: Path, tmp_path_factory, raw: bytes) -> None:
    (config_ckpt / "config.json").write_bytes(raw)
    write_or_refuse(config_ckpt, tmp_path_factory.mktemp("o"), CONFIG_OPS)


@SETTINGS
@given(raw=json_mutant(INDEX_DOC))
def test_index_mutants_read_write_or_refuse(index_ckpt: Path, tmp_path_factory, raw: bytes) -> None:
    _index_property(index_ckpt, tmp_path_factory, raw)


@SETTINGS
@given(raw=json_mutant(CONFIG_DOC, keys=CONFIG_KEYS))
def test_config_mutants_read_write_or_refuse(config_ckpt: Path, tmp_path_factory, raw: bytes) -> None:
    _config_property(config_ckpt, tmp_path_factory, raw)


PD_CONFIG_DOC = json.loads((av.CASES / av.PD_ONE / "config.json").read_text())
PD_CONFIG_KEYS = tuple(PD_CONFIG_DOC) + ("text_config", "tensor_parallel_degree", "paddlenlp_version")


@SETTINGS
@given(raw=json_mutant(PD_CONFIG_DOC, keys=PD_CONFIG_KEYS))
def test_pdparams_config_mutants_read_write_or_refuse(pd_config_ckpt: Path, tmp_path_factory, raw) -> None:
    """The config fuzzer on a PaddleNLP ``.pdparams`` checkpoint (loader facts from paddlenlp_version)."""
    _config_property(pd_config_ckpt, tmp_path_factory, raw)


# x3 tests: ~4 min of CI in full; never fewer than the fast twins' 200
SLOW_SETTINGS = settings(SETTINGS, max_examples=slow_examples(1500, at_least=200))


@pytest.mark.slow
@SLOW_SETTINGS
@given(raw=json_mutant(INDEX_DOC))
def test_index_mutants_many(index_ckpt: Path, tmp_path_factory, raw: bytes) -> None:
    _index_property(index_ckpt, tmp_path_factory, raw)


@pytest.mark.slow
@SLOW_SETTINGS
@given(raw=json_mutant(CONFIG_DOC, keys=CONFIG_KEYS))
def test_config_mutants_many(config_ckpt: Path, tmp_path_factory, raw: bytes) -> None:
    _config_property(config_ckpt, tmp_path_factory, raw)


# tokenizer and generation files: read for the tokenizer's size, token strings and special token ids
TOKENIZER_DOCS: dict[str, dict] = {
    "tokenizer_config.json": {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "lstrip": False},
        "pad_token": None,
        "added_tokens_decoder": {"1": {"content": "<s>", "special": True}, "2": {"content": "</s>"}},
        "model_max_length": 2048,
        "add_bos_token": True,  # a flag, not a token: accepted
    },
    "tokenizer.json": {
        "added_tokens": [{"id": 1, "content": "<s>"}, {"id": 2, "content": "</s>"}],
        "model": {"type": "BPE", "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}},
    },
    "added_tokens.json": {"<extra_0>": 98, "<extra_1>": 99},
    "generation_config.json": {"bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0},
    "vocab.json": {"<unk>": 0, "a": 1},
}
TOKENIZER_OPS = (("untie", {}), ("resize", {"vocab_size": 256}), ("verify", {}))


@pytest.fixture(scope="module")
def tokenizer_ckpt(tmp_path_factory) -> Path:
    ckpt = av.copy_case(av.ST_ONE, tmp_path_factory.mktemp("fuzz_tokenizer") / "ckpt")
    for name, doc in TOKENIZER_DOCS.items():
        (ckpt / name).write_text(json.dumps(doc))
    return ckpt


@st.composite
def tokenizer_mutant(draw) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(TOKENIZER_DOCS)))
    return name, draw(json_mutant(TOKENIZER_DOCS[name], keys=("bos_token", "added_tokens_decoder", "id")))


def _tokenizer_property(ckpt: Path, tmp_path_factory, mutant: tuple[str, bytes]) -> None:
    name, raw = mutant
    try:
        (ckpt / name).write_bytes(raw)
        write_or_refuse(ckpt, tmp_path_factory.mktemp("o"), TOKENIZER_OPS)
    finally:
        (ckpt / name).write_text(json.dumps(TOKENIZER_DOCS[name]))


def test_unmutated_tokenizer_fixture_writes(tokenizer_ckpt: Path, tmp_path: Path) -> None:
    """Control: with every tokenizer file intact, each op the tokenizer fuzzer runs succeeds."""
    for i, (op, kw) in enumerate(TOKENIZER_OPS):
        _op(op)(tokenizer_ckpt, out=tmp_path / f"o{i}", **kw)


@SETTINGS
@given(mutant=tokenizer_mutant())
def test_tokenizer_mutants_read_write_or_refuse(tokenizer_ckpt: Path, tmp_path_factory, mutant) -> None:
    _tokenizer_property(tokenizer_ckpt, tmp_path_factory, mutant)


@pytest.mark.slow
@SLOW_SETTINGS
@given(mutant=tokenizer_mutant())
def test_tokenizer_mutants_many(tokenizer_ckpt: Path, tmp_path_factory, mutant) -> None:
    _tokenizer_property(tokenizer_ckpt, tmp_path_factory, mutant)
