"""Malicious ``.pdparams`` must be refused before anything runs.

Each payload is a real, working exploit: unpickled with ``pickle.load`` (as ``paddle.load`` does) it creates a
marker file in ``tmp_path`` (``test_payload_is_live`` proves that, in a throw-away subprocess). tietool must
refuse every one with exit code 4, name the global in its one-line message (``os.system``, ``posix.system``,
...), write nothing, leave the input unchanged, and the marker must not exist afterwards.

The pickles are written by :class:`EvilPickler`, the pure-Python pickler with a few extra opcodes emitters, so
a global can be named exactly (``os.system`` rather than the ``posix.system`` that pickling ``os.system``
gives), in protocol 2 (``GLOBAL``) and protocol 4 (``STACK_GLOBAL``), called with ``REDUCE``, ``NEWOBJ``, or
the protocol-0 ``INST``/``OBJ`` opcodes, and hidden anywhere in an otherwise genuine state dict.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import adversarial_support as av
from support.adversarial_support import PD_FILE, PD_ONE, FakeArray

UNSAFE = 4


# ------------------------------------------------------------------------------------------ the pickler
class G:
    """The global ``module.name`` (not imported here)."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"


class Reduce:
    """``fn(*args)`` via REDUCE; ``fn`` is a :class:`G` or another :class:`Reduce` (a getattr chain)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args


class NewObj:
    """``cls.__new__(cls, *args)`` via NEWOBJ."""

    def __init__(self, cls: G, *args):
        self.cls, self.args = cls, args


class Inst:
    """``module.name(*args)`` via the protocol-0 INST opcode (``i module\\nname\\n``)."""

    def __init__(self, g: G, *args):
        self.g, self.args = g, args


class Obj:
    """``cls(*args)`` via the protocol-1 OBJ opcode."""

    def __init__(self, g: G, *args):
        self.g, self.args = g, args


class EvilPickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table can be extended
    dispatch = pickle._Pickler.dispatch.copy()

    def save_g(self, obj: G) -> None:
        if self.proto >= 4:
            self.save(obj.module)
            self.save(obj.name)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    def save_reduce_call(self, obj: Reduce) -> None:
        self.save(obj.fn)
        self.save(tuple(obj.args))
        self.write(pickle.REDUCE)
        self.memoize(obj)

    def save_newobj(self, obj: NewObj) -> None:
        self.save(obj.cls)
        self.save(tuple(obj.args))
        self.write(pickle.NEWOBJ)
        self.memoize(obj)

    def save_inst(self, obj: Inst) -> None:
        self.write(pickle.MARK)
        for a in obj.args:
            self.save(a)
        self.write(pickle.INST + f"{obj.g.module}\n{obj.g.name}\n".encode())
        self.memoize(obj)

    def save_obj(self, obj: Obj) -> None:
        self.write(pickle.MARK)
        self.save(obj.g)
        for a in obj.args:
            self.save(a)
        self.write(pickle.OBJ)
        self.memoize(obj)

    dispatch[G] = save_g
    dispatch[Reduce] = save_reduce_call
    dispatch[NewObj] = save_newobj
    dispatch[Inst] = save_inst
    dispatch[Obj] = save_obj


def dumps(obj: Any, protocol: int) -> bytes:
    buf = io.BytesIO()
    EvilPickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


# ------------------------------------------------------------------------------------------ payloads
def _touch(m: Path) -> str:
    return f"touch '{m}'"


# id -> (build(marker) -> object, the global the message must name, live: pickle.load creates the marker)
PAYLOADS: dict[str, tuple[Callable[[Path], Any], str, bool]] = {
    "os.system": (lambda m: Reduce(G("os", "system"), _touch(m)), "os.system", True),
    "posix.system": (lambda m: Reduce(G("posix", "system"), _touch(m)), "posix.system", True),
    "builtins.eval": (
        lambda m: Reduce(G("builtins", "eval"), f"__import__('os').system({_touch(m)!r})"),
        "builtins.eval",
        True,
    ),
    "builtins.exec": (
        lambda m: Reduce(G("builtins", "exec"), f"open({str(m)!r}, 'w').close()"),
        "builtins.exec",
        True,
    ),
    "subprocess.Popen": (
        lambda m: Reduce(G("subprocess", "Popen"), ["touch", str(m)]),
        "subprocess.Popen",
        True,
    ),
    "subprocess.Popen-newobj": (
        lambda m: NewObj(G("subprocess", "Popen"), ["touch", str(m)]),
        "subprocess.Popen",
        False,
    ),
    "subprocess.check_call": (
        lambda m: Reduce(G("subprocess", "check_call"), ["touch", str(m)]),
        "subprocess.check_call",
        True,
    ),
    # getattr(__import__('os'), 'system')('touch m'): the first global in the stream is builtins.getattr
    "getattr-chain": (
        lambda m: Reduce(
            Reduce(G("builtins", "getattr"), Reduce(G("builtins", "__import__"), "os"), "system"), _touch(m)
        ),
        "builtins.getattr",
        True,
    ),
    # getattr(numpy, 'load') reached through an allowed-looking module
    "getattr-numpy": (
        lambda m: Reduce(
            Reduce(G("builtins", "getattr"), Reduce(G("builtins", "__import__"), "numpy"), "fromfile"),
            "/etc/hostname",
        ),
        "builtins.getattr",
        False,
    ),
    "numpy.load": (lambda m: Reduce(G("numpy", "load"), str(m) + ".npy"), "numpy.load", False),
    "numpy.frombuffer": (lambda m: Reduce(G("numpy", "frombuffer"), b"\0" * 8), "numpy.frombuffer", False),
    "numpy.fromfile": (lambda m: Reduce(G("numpy", "fromfile"), "/etc/hostname"), "numpy.fromfile", False),
    "numpy-runstring": (
        lambda m: Reduce(
            G("numpy.testing._private.utils", "runstring"), f"import os; os.system({_touch(m)!r})", {}
        ),
        "numpy.testing._private.utils.runstring",
        True,
    ),
    # classes outside numpy's array reconstruction: memmap(mode="w+") creates its file
    "numpy.memmap": (
        lambda m: Reduce(G("numpy", "memmap"), str(m), "uint8", "w+", 0, (1,)),
        "numpy.memmap",
        True,
    ),
    "reconstruct-memmap": (
        lambda m: Reduce(G("numpy.core.multiarray", "_reconstruct"), G("numpy", "memmap"), (0,), b"b"),
        "numpy.memmap",
        False,
    ),
    # the protocol-0/1 call opcodes, valid in any protocol
    "os.system-INST": (lambda m: Inst(G("os", "system"), _touch(m)), "os.system", True),
    "os.system-OBJ": (lambda m: Obj(G("os", "system"), _touch(m)), "os.system", True),
    # Python 2 module name: pickle maps __builtin__ to builtins when loading protocol < 3
    "__builtin__.eval": (
        lambda m: Reduce(G("__builtin__", "eval"), f"__import__('os').system({_touch(m)!r})"),
        "__builtin__.eval",
        False,
    ),
}


def _state() -> dict:
    return av.pd_state(PD_ONE, PD_FILE)


# where the payload goes: a genuine state dict with the payload somewhere inside it
PLACES: dict[str, Callable[[Any], Any]] = {
    "value": lambda e: {**_state(), "evil": e},
    "first_value": lambda e: {"evil": e, **_state()},
    "top_level": lambda e: e,
    "in_StructuredToParameterName": lambda e: {
        **_state(),
        "StructuredToParameterName@@": {**_state()["StructuredToParameterName@@"], "lm_head.weight": e},
    },
    "tuple_element": lambda e: {**_state(), "meta": (1, "x", e)},
    "list_element": lambda e: {**_state(), "meta": [1, [2, [e]]]},
    "dict_key": lambda e: {**_state(), "meta": {("k", e): 1}},
    "ordereddict_arg": lambda e: {**_state(), "meta": Reduce(G("collections", "OrderedDict"), [("k", e)])},
    "array_shape": lambda e: {**_state(), "llama.norm.weight": FakeArray((e,), np.dtype("f4"), b"\0" * 64)},
    "array_dtype_arg": lambda e: {
        **_state(),
        "llama.norm.weight": Reduce(
            G("numpy.core.multiarray", "_reconstruct"), G("numpy", "ndarray"), (0,), e
        ),
    },
    "codecs_encode_arg": lambda e: {**_state(), "meta": Reduce(G("_codecs", "encode"), e, "latin1")},
}


def _build(tmp: Path, payload: str, proto: int, place: str = "value") -> tuple[Path, Path]:
    """A copy of the PaddleNLP Llama fixture whose .pdparams carries ``payload``; returns (ckpt, marker)."""
    marker = tmp / "PWNED"
    ckpt = av.copy_case(PD_ONE, tmp / "ckpt")
    build, _, _ = PAYLOADS[payload]
    (ckpt / PD_FILE).write_bytes(dumps(PLACES[place](build(marker)), proto))
    return ckpt, marker


def _check(tmp: Path, ckpt: Path, marker: Path, command: str, name: str) -> None:
    before = av.tree_state(ckpt)
    out = tmp / "out"
    run = av.run_cli(av.command_argv(command, ckpt, out))
    time.sleep(0.05)  # a Popen child would need a moment to create the marker
    bad = av.check_refused(run, UNSAFE, (PD_FILE, name), inp=ckpt, before=before, out=out)
    if marker.exists():
        bad.insert(0, f"THE PAYLOAD RAN: {marker} was created")
    assert not bad, "; ".join(bad) + "\n" + run.describe()


@pytest.mark.parametrize("command", av.COMMANDS)
@pytest.mark.parametrize("proto", [2, 4])
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_malicious_pdparams_refused(payload: str, proto: int, command: str, tmp_path: Path) -> None:
    ckpt, marker = _build(tmp_path, payload, proto)
    _check(tmp_path, ckpt, marker, command, PAYLOADS[payload][1])


@pytest.mark.parametrize("command", av.COMMANDS)
@pytest.mark.parametrize("proto", [2, 4])
@pytest.mark.parametrize("place", [p for p in PLACES if p != "value"])
def test_hidden_payload_refused(place: str, proto: int, command: str, tmp_path: Path) -> None:
    """The REDUCE hidden in a nested value (StructuredToParameterName@@, a tuple, a list, a dict key, an
    OrderedDict's items, an array's shape or dtype argument, _codecs.encode's argument) is refused too."""
    ckpt, marker = _build(tmp_path, "os.system", proto, place)
    _check(tmp_path, ckpt, marker, command, "os.system")


@pytest.mark.parametrize("proto", [2, 4])
def test_payload_in_one_shard_of_many(proto: int, tmp_path: Path) -> None:
    """Sharded: only the 5th of 8 shards is poisoned; every command refuses it and names that shard."""
    marker = tmp_path / "PWNED"
    ckpt = av.copy_case(av.PD_SHARDED, tmp_path / "ckpt")
    shard = "model_state-00005-of-00008.pdparams"
    sd = av.pd_state(av.PD_SHARDED, shard)
    sd["StructuredToParameterName@@"] = {
        **sd.get("StructuredToParameterName@@", {}),
        "x": Reduce(G("posix", "system"), _touch(marker)),
    }
    (ckpt / shard).write_bytes(dumps(sd, proto))
    for command in av.COMMANDS:
        before = av.tree_state(ckpt)
        out = tmp_path / f"out_{command}"
        run = av.run_cli(av.command_argv(command, ckpt, out))
        av.assert_refused(run, UNSAFE, (shard, "posix.system"), inp=ckpt, before=before, out=out)
        assert not marker.exists(), f"THE PAYLOAD RAN\n{run.describe()}"


# ------------------------------------------------------------------------------------------ controls
def test_legit_pdparams_loads(tmp_path: Path) -> None:
    """Positive control: the untouched fixture is accepted."""
    ckpt = av.copy_case(PD_ONE, tmp_path / "ckpt")
    run = av.run_cli(["inspect", ckpt])
    assert run.rc == 0, run.describe()


@pytest.mark.parametrize("proto", [2, 4])
def test_legit_pdparams_through_our_pickler_loads(proto: int, tmp_path: Path) -> None:
    """Control for the harness: the same state dict written by EvilPickler without a payload is accepted,
    so each refusal above is caused by the payload, not by how the file was written."""
    ckpt = av.copy_case(PD_ONE, tmp_path / "ckpt")
    (ckpt / PD_FILE).write_bytes(dumps(_state(), proto))
    for command in av.COMMANDS:
        run = av.run_cli(
            av.command_argv(
                command,
                ckpt,
                tmp_path / f"out_{command}",
                ["--keep", "embedding"] if command == "tie" else [],
            )
        )
        assert run.rc == 0, run.describe()


@pytest.mark.parametrize("proto", [2, 4])
@pytest.mark.parametrize("payload", [p for p, (_, _, live) in PAYLOADS.items() if live])
def test_payload_is_live(payload: str, proto: int, tmp_path: Path) -> None:
    """Control for the payloads: ``pickle.load`` (what paddle.load does) really runs them. Done in a
    subprocess whose only effect is the marker file in ``tmp_path``."""
    marker = tmp_path / "PWNED"
    f = tmp_path / "evil.pdparams"
    f.write_bytes(dumps(PAYLOADS[payload][0](marker), proto))
    subprocess.run(
        [sys.executable, "-c", "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))", str(f)],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    for _ in range(400):  # a payload that spawns (subprocess.Popen) writes the marker later: wait up to 20 s
        if marker.exists():  # (the 2.5 s this waited before is short on a machine at load 7-9)
            break
        time.sleep(0.05)
    assert marker.exists(), f"{payload}: unpickling did not create the marker; the payload is not live"


# ------------------------------------------------------------------------------------ the walker's limits
REAL_PDPARAMS = sorted(p for p in (av.REPO / "tests" / "data").rglob("*.pdparams") if p.is_file())


def test_every_real_pdparams_walks_as_pickle_loads_it() -> None:
    """Oracle for the walker's stricter checks (dtype table, shapes, keys, nesting, memo references): every
    ``.pdparams`` in tests/data (PaddleNLP/PaddleFormers/paddle.save files and tietool's own outputs) is
    read, and gives the tensors and non-tensor entries that ``pickle.load`` (allow-listed, building real
    numpy arrays) gives."""
    from tietool.surgery.io import pdparams

    assert len(REAL_PDPARAMS) > 50
    for p in REAL_PDPARAMS:
        tensors, extras, _ = pdparams.read_header(p, p.name)
        want = av.fs.read_pdparams_raw(p)
        arrays = {k: v for k, v in want.items() if isinstance(v, np.ndarray)}
        if pdparams.SPLIT_TABLE in want:  # joined by name: compared by test_index_and_ranks
            continue
        got = {t.name: (t.dtype, tuple(t.shape)) for t in tensors}
        assert got == {k: (v.dtype.name, v.shape) for k, v in arrays.items()}, p
        assert extras == {k: v for k, v in want.items() if not isinstance(v, np.ndarray)}, p


def _pd_with(entry: bytes) -> bytes:
    raw = (av.CASES / PD_ONE / PD_FILE).read_bytes()
    return raw[:-1] + b"(" + b"\x8c\x04meta" + entry + b"u."


@pytest.mark.parametrize("levels", [13, 20, 31])
def test_memo_bomb_refused_in_linear_time(levels: int, tmp_path: Path) -> None:
    """A value tripled by DUP DUP TUPLE3 ``levels`` times (3**levels elements counted at every reference,
    3 bytes a level, nested less than the depth limit) is refused by its counted size, in time that does
    not grow with 3**levels."""
    from tietool.surgery.io import pdparams
    from tietool.surgery.model.errors import CheckpointError

    p = tmp_path / PD_FILE
    p.write_bytes(_pd_with(b")" + b"22\x87" * levels))
    t0 = time.monotonic()
    with pytest.raises(CheckpointError, match="memo bomb"):
        pdparams.walk(p)
    assert time.monotonic() - t0 < 2.0


def test_shared_values_within_the_limit_are_read(tmp_path: Path) -> None:
    """Control: sharing itself is allowed (pickle memoizes any repeated object); 2**12 counted values read."""
    from tietool.surgery.io import pdparams

    p = tmp_path / PD_FILE
    p.write_bytes(_pd_with(b")" + b"2\x86" * 12))
    top, _ = pdparams.walk(p)
    x, n = top["meta"], 0
    while x:
        x, n = x[0], n + 1
    assert n == 12


@pytest.mark.parametrize("depth", [32, 33])
def test_nesting_limit_is_exact(depth: int, tmp_path: Path) -> None:
    """A list value nested ``depth`` deep below its entry: 32 levels read, 33 refused naming the limit."""
    from tietool.surgery.io import pdparams
    from tietool.surgery.model.errors import CheckpointError

    p = tmp_path / PD_FILE
    p.write_bytes(_pd_with(b"]" * depth + b"a" * (depth - 1)))
    if depth <= pdparams.WEIGHTS.limits.depth:
        assert isinstance(pdparams.walk(p)[0]["meta"], list)
    else:
        with pytest.raises(CheckpointError, match="nested more than 32 levels"):
            pdparams.walk(p)
