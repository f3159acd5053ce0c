"""Property: reading any byte-mutation of a small checkpoint either works or raises ``TietoolError``.

The reader is what every command runs first: ``tietool.surgery.checkpoint.Checkpoint.open`` (config, index,
headers or pickle walk) and ``tietool.surgery.detect.detect`` (embedding/head lookup, value comparison, which
loads tensor data).
Anything else escaping (ValueError, KeyError, TypeError, RecursionError, MemoryError, ...) is a bug: the CLI
would report it as an internal error (exit 70) instead of a one-line "bad checkpoint" message.

Mutations (hypothesis draws 1-8 of them, positions biased towards the structure: the safetensors JSON header,
the pickle opcodes before the first array payload): flip a bit, overwrite a byte, delete a byte, insert a
byte, truncate. ``derandomize=True`` keeps CI deterministic; ``database=None`` keeps the source tree clean.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import adversarial_support as av

from tietool.surgery.checkpoint import Checkpoint
from tietool.surgery.detect import detect
from tietool.surgery.errors import TietoolError

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

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


def read_or_refuse(ckpt: Path) -> None:
    try:
        c = Checkpoint.open(ckpt)
        detect(c, compare_values=True)
    except TietoolError:
        pass  # a clean refusal; anything else propagates and fails the property


def test_unmutated_fixtures_read(st_ckpt: Path, pd_ckpt: Path) -> None:
    """Control: the fixtures themselves read and detect."""
    for ckpt in (st_ckpt, pd_ckpt):
        detect(Checkpoint.open(ckpt), compare_values=True)


@SETTINGS
@given(muts=mutations(len(ST_RAW), ST_HEADER_END))
def test_safetensors_mutations_read_or_refuse(st_ckpt: Path, muts) -> None:
    (st_ckpt / av.ST_ONE_FILE).write_bytes(mutate(ST_RAW, muts))
    read_or_refuse(st_ckpt)


@SETTINGS
@given(muts=mutations(len(PD_RAW), PD_STRUCT_END))
def test_pdparams_mutations_read_or_refuse(pd_ckpt: Path, muts) -> None:
    (pd_ckpt / av.PD_FILE).write_bytes(mutate(PD_RAW, muts))
    read_or_refuse(pd_ckpt)


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
