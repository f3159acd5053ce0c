"""Paddle ``.pdparams``: a pickle of ``{name: numpy.ndarray}`` (+ ``StructuredToParameterName@@``).

Reading walks the pickle opcodes itself instead of calling ``pickle.load``:

* nothing from the file is ever executed: the only globals accepted are the ones a numpy weights pickle
  needs (``ALLOWED_GLOBALS``), and even those are *simulated* here, never imported or called; any other
  global is refused by name before anything is built (``UnsafePickleError``);
* array payloads (``BINBYTES``/``BINBYTES8``) are not read: the walker records their byte range and seeks
  past them, so the structure of a multi-GB file is known after reading a few KB, and a rewrite copies
  unchanged arrays by byte range.

``pickle`` cannot do either (its ``Unpickler`` materialises every payload). The writer emits the same
protocol-4 structure numpy/paddle use, with payloads streamed from the input, and aliases (names bound
to one array) written once and referenced through the pickle memo, as ``paddle.save`` does.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np

from ..model.errors import CheckpointError, UnsafePickleError
from ..model.tensor import NP_TO_ST, TensorInfo, map_array
from . import regular, store
from .safetensors_io import Source

RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
SCALAR = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
NON_TENSOR_KEYS = ("StructuredToParameterName@@",)
SPLIT_TABLE = "UnpackBigParamInfor@@"  # paddle.save (protocol < 4): NAME -> {OriginShape, slices}
INLINE_MAX = 256  # payloads up to this size are read; larger ones are recorded as byte ranges


@dataclass(frozen=True)
class Limits:
    """Bounds of one walk (issue 18: no input may crash the interpreter or take more than linear time).

    Attributes:
        depth: nesting of a value in the top-level dict (real weights files: under 6 levels); deeper is
            refused, so nothing that recurses over the values (the writer, ``repr``) can overflow the stack.
        key_nodes: elements of one dict key counted at every reference (a tuple key is hashed by walking
            all of them: a key that shares sub-tuples would take exponential time); real keys are strings.
        nodes_beyond_size: values counted at every reference (a list referenced twice counts twice) may
            exceed the file's size in bytes by this much: memo references cannot blow a few hundred bytes up
            into exponential work for the code that walks the result.
        name: bytes of a global's module or name (GLOBAL/INST lines, STACK_GLOBAL strings).
        line: bytes of an INT/PUT/GET text line.
        dims: dimensions of an array (numpy's own limit: 64).
        nested_arrays: arrays may also sit in a dict one level below the top (an optimizer's
            ``master_weights``); elsewhere an array inside a non-tensor value is refused.
        records: the most :class:`Record` s one walk may create (None: no bound beyond ``size``), checked
            as each is made, so a file of millions of records is refused before it is read to the end.
        records_why: why that bound, for the refusal.
    """

    depth: int = 32
    key_nodes: int = 256
    nodes_beyond_size: int = 1_000_000
    name: int = 1024
    line: int = 64
    dims: int = 64
    nested_arrays: bool = False
    records: int | None = None
    records_why: str = ""


@dataclass(frozen=True)
class AllowList:
    """The globals one kind of pickle may name, each mapped to the function that *simulates* calling it
    (never imported or called: ``calls[(module, name)](args)`` builds a stand-in). A second kind of pickle
    (e.g. the flex-checkpoint ``.metadata``) is a second ``AllowList``.

    Attributes:
        what: what such a file is, for messages ("a Paddle weights file").
        calls: ``(module, name)`` → simulation; a global not in it is refused (``UnsafePickleError``).
        classes: globals that may appear only as an argument (``numpy.ndarray`` given to ``_reconstruct``).
        limits: the bounds of a walk.
        records: classes whose instances are simulated as plain :class:`Record` s (created by NEWOBJ or
            REDUCE with no arguments, their fields set by BUILD of a dict of field name → value, as pickle
            restores a dataclass): never imported, never called. A record may be a dict key (identity).
        top_record: the pickle's top level is one such record (a flex ``.metadata``), not a dict.
    """

    what: str
    calls: Mapping[tuple[str, str], Callable[[tuple[Any, ...]], Any]]
    classes: frozenset[tuple[str, str]] = frozenset()
    limits: Limits = Limits()
    records: frozenset[tuple[str, str]] = frozenset()
    top_record: bool = False

    @cached_property
    def globals(self) -> frozenset[tuple[str, str]]:
        """Every global the pickle may name."""
        return frozenset(self.calls) | self.classes | self.records


class Record:
    """A simulated instance of an allowed record class (:attr:`AllowList.records`): the class's
    ``(module, name)`` and the fields BUILD gave it (names are strings, values plain values or records).
    Hashed by identity: a record used as a dict key (the flex ``storage_metadata``) is never looked up by
    value, so no field is hashed."""

    __slots__ = ("cls", "fields", "built")

    def __init__(self, cls: tuple[str, str]):
        self.cls = cls
        self.fields: dict[str, Any] = {}
        self.built = False


class _Global:
    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


class _BytesRef:
    """A bytes payload left in the file: ``[offset, offset + length)``."""

    __slots__ = ("offset", "length")

    def __init__(self, offset: int, length: int):
        self.offset, self.length = offset, length


def _dtype_codes() -> dict[str, np.dtype]:
    """The dtype strings a weights pickle may give ``numpy.dtype`` (``f4``, ``u2``, ``b1``: what numpy's
    ``dtype.__reduce__`` writes; also the names and one-letter codes), each a weight dtype of ``NP_TO_ST``.
    A table, so that no other string from the file ever reaches numpy's dtype parser (which raises
    TypeError, ValueError or SyntaxError on strings it does not know and accepts structured, subarray and
    object dtypes)."""
    out: dict[str, np.dtype] = {}
    for name in NP_TO_ST:
        dt = np.dtype(name)
        for code in (dt.str[1:], dt.char, name, f"{dt.kind}{dt.itemsize}"):
            out[code] = dt
    return out


_DTYPE_CODES = _dtype_codes()
_NATIVE: Literal["<", ">"] = "<" if np.little_endian else ">"
_ORDERS: dict[str, Literal["<", ">"]] = {"<": "<", "|": "<", "=": _NATIVE, ">": ">"}


class _DType:
    """A simulated ``numpy.dtype(code)``; BUILD may set its byte order. ``error`` says why it is not a
    weight dtype (reported with the tensor's name by :func:`read_header`)."""

    __slots__ = ("code", "order", "error")

    def __init__(self, code: Any):
        self.code, self.order = code, "<"
        self.error = (
            None
            if isinstance(code, str) and code in _DTYPE_CODES
            else f"dtype {_show(code)} is not a weight dtype"
        )

    def numpy(self) -> np.dtype:
        """The dtype (byte order applied).

        Raises:
            ValueError: not a weight dtype, or an unknown byte order.
        """
        if self.error:
            raise ValueError(self.error)
        if type(self.order) is not str or self.order not in _ORDERS:  # a str: hashing it is bounded
            raise ValueError(f"dtype byte order {_show(self.order)} (expected '<', '|', '=' or '>')")
        return _DTYPE_CODES[self.code].newbyteorder(_ORDERS[self.order])


class _Array:
    """An ndarray seen in the pickle; its data stays in the file. ``error``: why its BUILD state is not a
    weights array (raised, naming the tensor, by :func:`read_header`)."""

    __slots__ = ("shape", "dtype", "fortran", "data", "module", "error", "name")

    def __init__(self, module: str):
        self.name: str | None = None  # the Tensor's name, when pickled as tuple((name, array))
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None
        self.fortran = False
        self.data: _BytesRef | bytes | None = None
        self.module = module
        self.error: str | None = None


class _Mark:
    pass


_MARK = _Mark()
_STAND_INS = (_Global, _BytesRef, _DType, _Array, _Mark)  # what the walker builds besides plain values
_KEY_LEAVES = (str, int, float, bytes, type(None))  # bool is an int


def _show(v: Any, n: int = 40) -> str:
    """``v`` for a message, bounded: a string or bytes cut to ``n`` characters, anything else by its type
    (never ``repr`` of a container: a deep or shared one would recurse or take exponential time)."""
    if isinstance(v, (str, bytes)):
        return repr(v[:n]) + ("..." if len(v) > n else "")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 10**20:
        return repr(v)
    return f"a {type(v).__name__}"


_REFUSE_FIX = "the file is damaged or is not a Paddle weights file; re-export it"


def _fix_for(rules: AllowList) -> str:
    return f"the file is damaged or is not {rules.what}; copy it again from where it was written"


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(what, path, _REFUSE_FIX)


def _too_big(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"{what}, more than tietool reads from a weights pickle",
        path,
        "the file is damaged or crafted; re-export it or get it from a trusted source",
    )


def walk(path: Path, rules: AllowList | None = None) -> tuple[dict[str, Any], int]:
    """Walk the opcodes of a ``.pdparams`` pickle without executing or loading it.

    Args:
        path: the file (local, or a remote ``UPath``); a local one must be a regular file (a FIFO or a
            device is refused by :func:`regular.open_regular`, never opened for reading).
        rules: the allow-list and limits (default :data:`WEIGHTS`).

    Returns:
        ``(top-level dict, file size)``. Array values are ``_Array`` stubs with their byte ranges;
        other values are plain Python objects (the ``StructuredToParameterName@@`` dict), checked against
        ``rules.limits`` (no cycle, nesting depth, size counted at every reference).

    Raises:
        UnsafePickleError: a global outside the allow-list (named in the message); nothing is run.
        CheckpointError: not a regular file, truncated or malformed pickle, a limit passed (named), or a
            top level that is not a dict.
    """
    rules = rules or WEIGHTS
    try:
        if store.is_remote(path):
            size = store.size(path)
            f = store.open_read(path)  # remote: 64 KiB requests; the walker seeks past payloads
        else:
            f = regular.open_regular(path)
            size = os.fstat(f.fileno()).st_size
    except IsADirectoryError:
        raise CheckpointError("is a folder, expected a .pdparams file", path, "remove or rename it") from None
    except OSError as e:
        raise CheckpointError(
            f"cannot read: {e.strerror}", path, "check that it exists and is readable"
        ) from None
    with f:
        try:
            return _walk(f, path, size, rules), size
        except UnsafePickleError:
            raise
        except CheckpointError as e:
            if rules is not WEIGHTS and e.fix == _REFUSE_FIX:  # the words of the kind of pickle it is
                raise CheckpointError(e.message, path, _fix_for(rules)) from None
            raise
        except (
            struct.error,
            IndexError,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            UnicodeDecodeError,
            RecursionError,
            MemoryError,
            OverflowError,
        ) as e:
            bad = _refuse(path, f"malformed pickle ({e.__class__.__name__}: {str(e)[:80]})")
            if rules is not WEIGHTS:
                bad = CheckpointError(bad.message, path, _fix_for(rules))
            raise bad from None


def _walk(f: BinaryIO, path: Path, size: int, rules: AllowList) -> dict[str, Any]:
    """Run the opcodes of the pickle in ``f`` (``size`` bytes) through :class:`_Walker` up to STOP, then
    check the result against ``rules.limits`` (:func:`_check_values`).

    Every opcode consumes at least one byte, so the loop runs at most ``size + 1`` times (an explicit
    bound, not a ``while True``).

    Returns:
        the top-level dict.

    Raises:
        UnsafePickleError: a global outside the allow-list.
        CheckpointError: truncated, an opcode a weights pickle does not use, a limit passed, or a top level
            that is not a dict.
        ValueError, IndexError, KeyError, TypeError, struct.error...: a malformed pickle (:func:`walk`
            turns these into a ``CheckpointError``).
    """
    w = _Walker(f, path, size, rules)
    ops = _OPCODES
    read = f.read
    for _ in range(size + 1):
        op = read(1)
        if not op:
            raise _refuse(path, "truncated pickle (no STOP opcode)")
        c = op[0]
        if c == 0x2E:  # STOP
            break
        handler = ops.get(c)
        if handler is None:
            raise _refuse(path, f"unsupported pickle opcode 0x{c:02x} at offset {f.tell() - 1}")
        handler(w)
    else:
        raise _too_big(path, f"more opcodes than the file's {size} bytes")
    stack = w.stack
    if rules.top_record:
        if len(stack) != 1 or type(stack[0]) is not Record:
            raise _refuse(path, f"the pickle does not hold one record, as {rules.what} does")
        _check_values(path, {"": stack[0]}, rules.limits, size)
        return {"": stack[0]}
    if len(stack) != 1 or not isinstance(stack[0], dict):
        raise _refuse(path, "the pickle does not hold a {name: array} dict")
    _check_values(path, stack[0], rules.limits, size)
    return stack[0]


def _children(x: Any) -> Any:
    if type(x) is dict:
        return (y for kv in x.items() for y in kv)
    return x.fields.values() if type(x) is Record else x


def _check_values(path: Path, top: dict[Any, Any], lim: Limits, size: int) -> None:
    """Refuse a result no weights file has, before any code walks it: a value that contains itself, one
    nested deeper than ``lim.depth``, more than ``size + lim.nodes_beyond_size`` values counted at every
    reference (a memo bomb), or a walker stand-in (an array, a dtype, a global) inside a non-tensor value.

    One iterative pass; each container is visited once (its counted size is remembered by ``id``; the
    containers stay alive in ``top`` meanwhile), so the cost is linear in the references the file made.

    Raises:
        CheckpointError: naming the top-level entry and the limit.
    """
    budget = size + lim.nodes_beyond_size
    sizes: dict[int, int] = {}
    for name, v in top.items():
        if type(v) not in (dict, list, tuple, Record):
            if isinstance(v, _STAND_INS) and not isinstance(v, _Array):
                raise _refuse(path, f"entry {_show(name)} is a bare {_stand_in(v)}, not a value")
            continue
        on_path = {id(v)}
        todo = [(v, iter(_children(v)))]
        counts = [1]
        while todo:
            x, it = todo[-1]
            for c in it:
                t = type(c)
                if t is dict or t is list or t is tuple or t is Record:
                    i = id(c)
                    if i in sizes:
                        counts[-1] += sizes[i]
                        continue
                    if i in on_path:
                        raise _refuse(path, f"entry {_show(name)} contains itself (a cyclic value)")
                    if len(todo) >= lim.depth:
                        raise _too_big(
                            path, f"entry {_show(name)} is nested more than {lim.depth} levels deep"
                        )
                    on_path.add(i)
                    todo.append((c, iter(_children(c))))
                    counts.append(1)
                    break
                nested = lim.nested_arrays and t is _Array and type(x) is dict and len(todo) == 1
                if isinstance(c, _STAND_INS) and not nested:  # nested: an array in a top-level dict
                    raise _refuse(path, f"entry {_show(name)} holds {_stand_in(c)} inside a non-tensor value")
                counts[-1] += 1
            else:
                todo.pop()
                on_path.discard(id(x))
                n = counts.pop()
                sizes[id(x)] = n
                if counts:
                    counts[-1] += n
                if n > budget:
                    raise _too_big(
                        path,
                        f"entry {_show(name)} counts over {budget:,} values at every reference "
                        "(memo references repeat one value: a memo bomb)",
                    )


def _stand_in(v: Any) -> str:
    if isinstance(v, _Array):
        return "an array"
    if isinstance(v, _DType):
        return "a numpy dtype"
    if isinstance(v, _Global):
        return f"the global {v.module[:80]}.{v.name[:80]}"
    return "an array payload" if isinstance(v, _BytesRef) else "a MARK"


def _pairs(items: list[Any], op: str) -> zip[tuple[Any, Any]]:
    """Keys and values alternate; an odd count is malformed (pickle refuses it the same way)."""
    if len(items) % 2:
        raise ValueError(f"odd number of items for {op}")
    return zip(items[::2], items[1::2], strict=True)


class _Walker:
    """The state of one walk over a pickle's opcodes (the file, the stack, the memo) and one method per
    opcode a weights pickle uses (``_OPCODES`` maps each opcode to its method). Globals are checked and
    simulated, never imported; array payloads are recorded as byte ranges, not read.
    """

    __slots__ = ("f", "path", "size", "stack", "memo", "rules", "lim", "records")

    def __init__(self, f: BinaryIO, path: Path, size: int, rules: AllowList):
        self.f, self.path, self.size, self.rules, self.lim = f, path, size, rules, rules.limits
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}
        self.records = 0

    # ------------------------------------------------------------ helpers

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes.

        Raises:
            CheckpointError: fewer than ``n`` bytes are left.
        """
        f = self.f
        if 0 <= n <= 4096:  # a short read needs no position: fewer bytes than asked is a truncation
            b = f.read(n)
            if len(b) != n:
                raise _refuse(self.path, f"truncated pickle (wants {n} bytes at offset {f.tell() - len(b)})")
            return b
        if n < 0 or f.tell() + n > self.size:
            raise _refuse(
                self.path, f"truncated pickle (wants {n} bytes at offset {f.tell()} of {self.size})"
            )
        b = f.read(n)
        if len(b) != n:
            raise _refuse(self.path, "truncated pickle")
        return b

    def readline(self, limit: int, what: str) -> bytes:
        """The next text line (protocol 0 arguments), without its newline, read at most ``limit`` bytes far.

        Raises:
            CheckpointError: no newline within ``limit`` bytes (named: ``what`` and the limit).
        """
        line = self.f.readline(limit + 1)
        if not line.endswith(b"\n"):
            if len(line) > limit:
                raise _too_big(self.path, f"{what} is longer than {limit:,} bytes")
            raise _refuse(self.path, f"truncated pickle (a {what} without its end of line)")
        return line[:-1]

    def key(self, k: Any) -> Any:
        """``k``, checked to be a dict key a pickle of plain values has: a string, a number, bytes, None,
        or a tuple of them of at most ``key_nodes`` elements counted at every reference and ``depth``
        levels (hashing a tuple walks it all, recursively, in C: a deep one crashes the interpreter, a
        shared one takes exponential time).

        Raises:
            CheckpointError: another key (named by its type and the limit).
        """
        if type(k) is str:
            return k
        if isinstance(k, _KEY_LEAVES) or type(k) is Record:  # a record: hashed by identity
            return k
        if type(k) is not tuple:
            raise _refuse(self.path, f"a dict key is {_show(k)} (a weights pickle's keys are names)")
        lim = self.lim
        todo = [(k, 1)]
        n = 0
        while todo:
            x, d = todo.pop()
            n += len(x)
            if d > lim.depth:
                raise _too_big(self.path, f"a dict key tuple is nested more than {lim.depth} levels deep")
            if n > lim.key_nodes:
                raise _too_big(
                    self.path, f"a dict key tuple counts over {lim.key_nodes} elements at every reference"
                )
            for c in x:
                if type(c) is tuple:
                    todo.append((c, d + 1))
                elif not isinstance(c, _KEY_LEAVES):
                    raise _refuse(
                        self.path, f"a dict key holds {_show(c)} (a weights pickle's keys are names)"
                    )
        return k

    def setitems(self, d: Any, items: list[Any], op: str) -> None:
        """``d[k] = v`` for the alternating keys and values ``items`` (keys checked by :meth:`key`)."""
        if type(d) is not dict:
            raise ValueError(f"{op} on {_show(d)}")
        key = self.key
        for k, v in _pairs(items, op):
            d[k if type(k) is str else key(k)] = v

    def payload(self, n: int) -> Any:
        """A bytes payload of ``n`` bytes: read when small, else a :class:`_BytesRef` skipped over.

        Raises:
            CheckpointError: the payload runs past the end of the file.
        """
        if n <= INLINE_MAX:
            return self.read(n)
        f = self.f
        off = f.tell()
        if off + n > self.size:
            raise _refuse(
                self.path, f"truncated pickle: a {n}-byte array payload at offset {off} runs past the end"
            )
        f.seek(off + n)
        return _BytesRef(off, n)

    def pop_mark(self) -> list[Any]:
        """Pop the items above the topmost MARK (and the MARK), in stack order."""
        stack = self.stack
        items = []
        while True:
            x = stack.pop()
            if x is _MARK:
                break
            items.append(x)
        items.reverse()
        return items

    def check_global(self, module: Any, name: Any) -> _Global:
        """The global ``module.name``.

        Raises:
            UnsafePickleError: it is not in the allow-list (nothing is imported).
            CheckpointError: the module or the name is not a string of at most ``Limits.name`` bytes.
        """
        lim = self.lim.name
        for s in (module, name):
            if type(s) is not str:
                raise _refuse(self.path, f"a global's module or name is {_show(s)}, not a string")
            if len(s) > lim:
                raise _too_big(self.path, f"a global's module or name is longer than {lim:,} bytes")
        if (module, name) not in self.rules.globals:
            raise UnsafePickleError(
                f"refused to unpickle: the pickle calls {module}.{name}, which "
                f"{'a weights file' if self.rules is WEIGHTS else self.rules.what} never needs (nothing was "
                "executed)",
                self.path,
                "do not load this file with paddle.load/pickle; get the weights from a trusted source",
            )
        return _Global(module, name)

    def readline_global(self) -> _Global:
        """The checked global named by the next two lines (``module``, ``name``: GLOBAL, INST), each read
        at most ``Limits.name`` bytes far."""
        lim = self.lim.name
        module = self.readline(lim, "global's module name").decode("utf-8")
        name = self.readline(lim, "global's name").decode("utf-8")
        return self.check_global(module, name)

    def reduce(self, fn: Any, args: Any) -> Any:
        """Simulate calling an allowed global (``AllowList.calls``): an :class:`_Array` stub, a
        :class:`_DType`, a dict, bytes or a numpy scalar's value.

        Raises:
            ValueError: ``fn`` is not a global, or not one that is called; ``args`` not a tuple.
            CheckpointError: a dict key of the wrong kind (OrderedDict).
        """
        if not isinstance(fn, _Global):
            raise ValueError("REDUCE on a non-global")
        if (fn.module, fn.name) in self.rules.records:
            if args != ():  # a call of the class: never simulated (its instances are only built by BUILD)
                raise UnsafePickleError(
                    f"refused to unpickle: the pickle calls {fn.module}.{fn.name} with arguments, which "
                    f"{self.rules.what} never does (nothing was executed)",
                    self.path,
                    "do not load this file with paddle.load/pickle; get it from a trusted source",
                )
            self.records += 1
            if self.lim.records is not None and self.records > self.lim.records:
                raise CheckpointError(
                    f"more than {self.lim.records:,} records: {self.lim.records_why}",
                    self.path,
                    "the file is damaged or crafted, or from a save larger than tietool reads",
                )
            return Record((fn.module, fn.name))
        call = self.rules.calls.get((fn.module, fn.name))
        if call is None:
            raise ValueError(f"cannot call {fn.module}.{fn.name}")
        if type(args) is not tuple:
            raise ValueError(f"arguments of {fn.module}.{fn.name} are {_show(args)}, not a tuple")
        if call is _ordered_dict:
            return self.ordered_dict(args)
        return call(args) if call is not _reconstruct else _Array(fn.module)

    def ordered_dict(self, args: tuple[Any, ...]) -> dict[Any, Any]:
        """``collections.OrderedDict(pairs)`` as a dict, keys checked by :meth:`key`."""
        d: dict[Any, Any] = {}
        if args:
            if type(args[0]) not in (list, tuple):
                raise ValueError(f"OrderedDict of {_show(args[0])}")
            for kv in args[0]:
                if type(kv) not in (list, tuple) or len(kv) != 2:
                    raise ValueError("OrderedDict item that is not a (key, value) pair")
                d[self.key(kv[0])] = kv[1]
        return d

    # ------------------------------------------------------------ opcodes

    def op_proto(self) -> None:
        self.read(1)

    def op_frame(self) -> None:
        n = struct.unpack("<Q", self.read(8))[0]
        # a frame is a length hint: a .pdparams walk ignores it (as it always has: edited weights files keep
        # stale hints); another kind of pickle with a frame past its end is damaged
        if self.rules is not WEIGHTS and n > self.size - self.f.tell():
            raise _refuse(self.path, f"truncated pickle (a {n}-byte frame at offset {self.f.tell() - 9})")

    def op_empty_dict(self) -> None:
        self.stack.append({})

    def op_empty_list(self) -> None:
        self.stack.append([])

    def op_empty_tuple(self) -> None:
        self.stack.append(())

    def op_mark(self) -> None:
        self.stack.append(_MARK)

    def op_dict(self) -> None:
        d: dict[Any, Any] = {}
        self.setitems(d, self.pop_mark(), "DICT")
        self.stack.append(d)

    def op_list(self) -> None:
        self.stack.append(self.pop_mark())

    def op_tuple(self) -> None:
        self.stack.append(tuple(self.pop_mark()))

    def op_tuple_n(self, n: int) -> None:
        """TUPLE1/2/3: the top ``n`` items as a tuple."""
        stack = self.stack
        if len(stack) < n:
            raise IndexError(f"TUPLE{n} on a stack of {len(stack)}")
        items = stack[-n:]
        del stack[-n:]
        stack.append(tuple(items))

    def op_setitem(self) -> None:
        stack = self.stack
        v = stack.pop()
        k = stack.pop()
        d = stack[-1]
        if type(d) is not dict:
            raise ValueError(f"SETITEM on {_show(d)}")
        d[k if type(k) is str else self.key(k)] = v

    def op_setitems(self) -> None:
        items = self.pop_mark()
        self.setitems(self.stack[-1], items, "SETITEMS")

    def op_append(self) -> None:
        stack = self.stack
        v = stack.pop()
        stack[-1].append(v)

    def op_appends(self) -> None:
        items = self.pop_mark()
        self.stack[-1].extend(items)

    def op_memoize(self) -> None:
        self.memo[len(self.memo)] = self.stack[-1]

    def op_binput(self) -> None:
        self.memo[self.read(1)[0]] = self.stack[-1]

    def op_long_binput(self) -> None:
        self.memo[struct.unpack("<I", self.read(4))[0]] = self.stack[-1]

    def op_put(self) -> None:
        self.memo[int(self.readline(self.lim.line, "PUT index"))] = self.stack[-1]

    def op_binget(self) -> None:
        self.stack.append(self.memo[self.read(1)[0]])

    def op_long_binget(self) -> None:
        self.stack.append(self.memo[struct.unpack("<I", self.read(4))[0]])

    def op_get(self) -> None:
        self.stack.append(self.memo[int(self.readline(self.lim.line, "GET index"))])

    def op_short_binunicode(self) -> None:
        self.stack.append(self.read(self.read(1)[0]).decode("utf-8"))

    def op_binunicode(self) -> None:
        self.stack.append(self.read(struct.unpack("<I", self.read(4))[0]).decode("utf-8"))

    def op_binunicode8(self) -> None:
        self.stack.append(self.read(struct.unpack("<Q", self.read(8))[0]).decode("utf-8"))

    def op_short_binstring(self) -> None:  # protocol 2 str
        self.stack.append(self.read(self.read(1)[0]).decode("latin-1"))

    def op_binstring(self) -> None:
        self.stack.append(self.read(struct.unpack("<i", self.read(4))[0]).decode("latin-1"))

    def op_short_binbytes(self) -> None:
        self.stack.append(self.read(self.read(1)[0]))

    def op_binbytes(self) -> None:
        self.stack.append(self.payload(struct.unpack("<I", self.read(4))[0]))

    def op_binbytes8(self) -> None:
        self.stack.append(self.payload(struct.unpack("<Q", self.read(8))[0]))

    def op_none(self) -> None:
        self.stack.append(None)

    def op_newtrue(self) -> None:
        self.stack.append(True)

    def op_newfalse(self) -> None:
        self.stack.append(False)

    def op_binint(self) -> None:
        self.stack.append(struct.unpack("<i", self.read(4))[0])

    def op_binint1(self) -> None:
        self.stack.append(self.read(1)[0])

    def op_binint2(self) -> None:
        self.stack.append(struct.unpack("<H", self.read(2))[0])

    def op_long1(self) -> None:
        self.stack.append(int.from_bytes(self.read(self.read(1)[0]), "little", signed=True))

    def op_long4(self) -> None:
        n = struct.unpack("<i", self.read(4))[0]
        if n > 64:
            raise ValueError("LONG4 integer too large for a weights file")
        self.stack.append(int.from_bytes(self.read(n), "little", signed=True))

    def op_int(self) -> None:  # protocol 0
        line = self.readline(self.lim.line, "INT value").strip()
        self.stack.append(True if line == b"01" else False if line == b"00" else int(line))

    def op_binfloat(self) -> None:
        self.stack.append(struct.unpack(">d", self.read(8))[0])

    def op_global(self) -> None:
        self.stack.append(self.readline_global())

    def op_stack_global(self) -> None:
        stack = self.stack
        name = stack.pop()
        module = stack.pop()
        stack.append(self.check_global(module, name))

    def op_inst(self) -> None:  # protocol 0: module, name, then MARK'ed args
        fn = self.readline_global()
        self.stack.append(self.reduce(fn, tuple(self.pop_mark())))

    def op_obj(self) -> None:  # protocol 1: MARK cls args...
        items = self.pop_mark()
        if not items or not isinstance(items[0], _Global):
            raise ValueError("OBJ without a class")
        self.stack.append(self.reduce(items[0], tuple(items[1:])))

    def op_reduce(self) -> None:  # REDUCE and NEWOBJ
        stack = self.stack
        args = stack.pop()
        fn = stack.pop()
        stack.append(self.reduce(fn, args))

    def op_build(self) -> None:
        state = self.stack.pop()
        obj = self.stack[-1]
        if isinstance(obj, _Array):
            obj.error = _array_state(obj, state, self.lim)
        elif isinstance(obj, _DType):
            if type(state) is tuple and len(state) > 1:
                obj.order = state[1]
        elif type(obj) is dict and type(state) is dict:
            self.setitems(obj, [x for kv in state.items() for x in kv], "BUILD")
        elif type(obj) is Record and type(state) is dict and not obj.built:
            if not all(type(k) is str for k in state):
                raise ValueError(f"BUILD of {obj.cls[1]} with a field name that is not a string")
            obj.fields, obj.built = state, True
        else:
            raise ValueError("BUILD on an unsupported object")

    def op_pop(self) -> None:
        self.stack.pop()

    def op_pop_mark(self) -> None:
        self.pop_mark()

    def op_dup(self) -> None:
        self.stack.append(self.stack[-1])


def _array_state(obj: _Array, state: Any, lim: Limits) -> str | None:
    """BUILD of an :class:`_Array` stub: set its shape, dtype, order and payload from ``state``
    (``(version, shape, dtype, fortran, data)``, what ``ndarray.__reduce__`` writes), each checked: a tuple
    of at most ``lim.dims`` ints in ``[0, 2**63)``, a weight dtype (:data:`_DTYPE_CODES`) little-endian, a
    bool order, a bytes payload of shape × itemsize.

    Returns:
        None, or what is wrong (reported with the tensor's name by :func:`read_header`; the walk goes on,
        so the message can name the tensor).
    """
    if type(state) is not tuple or len(state) != 5:
        return f"array state is {_show(state)}, expected (version, shape, dtype, fortran, data)"
    _version, shape, dtype, fortran, data = state
    if type(shape) is not tuple or len(shape) > lim.dims:
        return f"array shape is {_show(shape)}, expected a tuple of at most {lim.dims} ints"
    if not all(type(d) is int and 0 <= d < 2**63 for d in shape):
        bad = next(d for d in shape if not (type(d) is int and 0 <= d < 2**63))
        return f"array shape has the dimension {_show(bad)} (expected an int from 0 to 2**63 - 1)"
    if not isinstance(dtype, _DType):
        return f"array dtype is {_show(dtype)}, not a numpy dtype"
    try:
        dt = dtype.numpy()
    except ValueError as e:
        return str(e)
    if dt.byteorder == ">":
        return "big-endian array (Paddle writes little-endian; re-save the weights)"
    if type(fortran) not in (bool, int):
        return f"array order flag is {_show(fortran)}, not a bool"
    if isinstance(data, str):  # protocol 2 writes the payload as a latin-1 str
        data = data.encode("latin-1")
    if not isinstance(data, (bytes, _BytesRef)):
        return "array payload is not bytes (object arrays are not weights)"
    n = len(data) if isinstance(data, bytes) else data.length
    numel = math.prod(shape)  # Python ints: no overflow on absurd shapes
    if n != numel * dt.itemsize:
        return f"array payload has {n} bytes, shape {shape} needs {numel * dt.itemsize}"
    obj.shape, obj.dtype, obj.fortran, obj.data = shape, dt, bool(fortran), data
    return None


# ------------------------------------------------------------ the simulated globals of a weights pickle


def _reconstruct(args: tuple[Any, ...]) -> Any:  # numpy.core.multiarray._reconstruct: an _Array stub
    raise AssertionError("handled by _Walker.reduce")  # pragma: no cover


def _ordered_dict(args: tuple[Any, ...]) -> Any:  # collections.OrderedDict: keys checked by the walker
    raise AssertionError("handled by _Walker.ordered_dict")  # pragma: no cover


def _np_dtype(args: tuple[Any, ...]) -> _DType:
    """``numpy.dtype(code, align, copy)``: a :class:`_DType` (an unknown code is reported with the
    tensor's name when the array is read)."""
    if not args:
        raise ValueError("numpy.dtype without arguments")
    return _DType(args[0])


def _codecs_encode(args: tuple[Any, ...]) -> bytes:
    """``_codecs.encode(text, "latin1")``: how protocol 2 pickles bytes."""
    if not args or type(args[0]) is not str or (len(args) > 1 and args[1] not in ("latin1", "latin-1")):
        raise ValueError("_codecs.encode of something other than a latin-1 string")
    return args[0].encode("latin-1")


def _np_scalar(args: tuple[Any, ...]) -> Any:
    """``numpy.core.multiarray.scalar(dtype, bytes)``: the scalar's Python value."""
    if len(args) != 2 or not isinstance(args[0], _DType) or type(args[1]) is not bytes:
        raise ValueError("numpy scalar without a dtype and its bytes")
    dt = args[0].numpy()
    if len(args[1]) != dt.itemsize:
        raise ValueError(f"numpy scalar of {len(args[1])} bytes for dtype {dt.name}")
    return np.frombuffer(args[1], dtype=dt)[0].item()


WEIGHTS = AllowList(
    "a Paddle weights file",
    {
        **{g: _reconstruct for g in RECONSTRUCT},
        **{g: _np_scalar for g in SCALAR},
        ("numpy", "dtype"): _np_dtype,
        ("collections", "OrderedDict"): _ordered_dict,
        ("_codecs", "encode"): _codecs_encode,
    },
    classes=frozenset({("numpy", "ndarray")}),
)
ALLOWED_GLOBALS = WEIGHTS.globals  # every global a weights pickle may name


def _named_tensor(args: tuple[Any, ...]) -> _Array:
    """``builtins.tuple(((name, array),))``: how ``paddle.save`` pickles a Tensor outside a plain state dict
    (``reduce_varbase``: ``(tuple, ((tensor.name, ndarray),))``; ``paddle.load`` makes it a Tensor of that
    name again). The array stub, its name recorded."""
    if len(args) != 1 or type(args[0]) is not tuple or len(args[0]) != 2:
        raise ValueError("builtins.tuple of something other than one (name, array) pair")
    name, arr = args[0]
    if type(name) is not str or not isinstance(arr, _Array) or arr.name is not None:
        raise ValueError("builtins.tuple of something other than (a tensor name, an array)")
    arr.name = name
    return arr


OPTIMIZER = AllowList(
    "a Paddle optimizer state file",
    {**WEIGHTS.calls, ("builtins", "tuple"): _named_tensor},
    classes=WEIGHTS.classes,
    limits=Limits(nested_arrays=True),
)
"""``optimizer.pdopt``: a weights pickle, plus Tensors pickled as ``tuple((name, array))`` and arrays in the
``master_weights`` dict (``paddle.save`` of an optimizer state dict with master weights goes through
``_pickle_save``, not the state-dict path: ``paddle/framework/io.py``)."""


# opcode -> its :class:`_Walker` method (STOP ends the loop in :func:`_walk`); any other opcode is refused
_OPCODES: dict[int, Callable[[_Walker], None]] = {
    0x80: _Walker.op_proto,  # PROTO
    0x95: _Walker.op_frame,  # FRAME
    0x7D: _Walker.op_empty_dict,  # EMPTY_DICT
    0x5D: _Walker.op_empty_list,  # EMPTY_LIST
    0x29: _Walker.op_empty_tuple,  # EMPTY_TUPLE
    0x28: _Walker.op_mark,  # MARK
    0x64: _Walker.op_dict,  # DICT
    0x6C: _Walker.op_list,  # LIST
    0x74: _Walker.op_tuple,  # TUPLE
    0x85: lambda w: w.op_tuple_n(1),  # TUPLE1
    0x86: lambda w: w.op_tuple_n(2),  # TUPLE2
    0x87: lambda w: w.op_tuple_n(3),  # TUPLE3
    0x73: _Walker.op_setitem,  # SETITEM
    0x75: _Walker.op_setitems,  # SETITEMS
    0x61: _Walker.op_append,  # APPEND
    0x65: _Walker.op_appends,  # APPENDS
    0x94: _Walker.op_memoize,  # MEMOIZE
    0x71: _Walker.op_binput,  # BINPUT
    0x72: _Walker.op_long_binput,  # LONG_BINPUT
    0x70: _Walker.op_put,  # PUT
    0x68: _Walker.op_binget,  # BINGET
    0x6A: _Walker.op_long_binget,  # LONG_BINGET
    0x67: _Walker.op_get,  # GET
    0x8C: _Walker.op_short_binunicode,  # SHORT_BINUNICODE
    0x58: _Walker.op_binunicode,  # BINUNICODE
    0x8D: _Walker.op_binunicode8,  # BINUNICODE8
    0x55: _Walker.op_short_binstring,  # SHORT_BINSTRING
    0x54: _Walker.op_binstring,  # BINSTRING
    0x43: _Walker.op_short_binbytes,  # SHORT_BINBYTES
    0x42: _Walker.op_binbytes,  # BINBYTES
    0x8E: _Walker.op_binbytes8,  # BINBYTES8
    0x4E: _Walker.op_none,  # NONE
    0x88: _Walker.op_newtrue,  # NEWTRUE
    0x89: _Walker.op_newfalse,  # NEWFALSE
    0x4A: _Walker.op_binint,  # BININT
    0x4B: _Walker.op_binint1,  # BININT1
    0x4D: _Walker.op_binint2,  # BININT2
    0x8A: _Walker.op_long1,  # LONG1
    0x8B: _Walker.op_long4,  # LONG4
    0x49: _Walker.op_int,  # INT
    0x47: _Walker.op_binfloat,  # BINFLOAT
    0x63: _Walker.op_global,  # GLOBAL
    0x93: _Walker.op_stack_global,  # STACK_GLOBAL
    0x69: _Walker.op_inst,  # INST
    0x6F: _Walker.op_obj,  # OBJ
    0x52: _Walker.op_reduce,  # REDUCE
    0x81: _Walker.op_reduce,  # NEWOBJ
    0x62: _Walker.op_build,  # BUILD
    0x30: _Walker.op_pop,  # POP
    0x31: _Walker.op_pop_mark,  # POP_MARK
    0x32: _Walker.op_dup,  # DUP
}


def read_header(path: Path, rel: str) -> tuple[list[TensorInfo], dict[str, Any], str]:
    """Tensor headers of a ``.pdparams`` file, without loading array data.

    Returns:
        ``(tensors in file order, non-tensor entries such as StructuredToParameterName@@, numpy module
        name the file's arrays were pickled with)``. Names bound to one array share ``TensorInfo.storage``.

    Raises:
        UnsafePickleError, CheckpointError: see :func:`walk`.
    """
    top, _ = walk(path)
    tensors: list[TensorInfo] = []
    extras: dict[str, Any] = {}
    module = "numpy.core.multiarray"
    for name, v in top.items():
        if not isinstance(name, str):
            raise _refuse(path, f"a top-level key is {_show(name)}, not a tensor name")
        if isinstance(v, _Array):
            module = v.module
            tensors.append(_tensor_info(path, rel, name, v))
        else:  # plain values, checked by the walk (depth, no cycle, size at every reference)
            extras[name] = v
    if SPLIT_TABLE in extras:
        tensors = _join_split(path, tensors, extras.pop(SPLIT_TABLE))
    return tensors, extras, module


def _tensor_info(path: Path, rel: str, name: str, v: _Array) -> TensorInfo:
    """The header of array stub ``v`` stored under ``name`` in file ``rel``.

    Raises:
        CheckpointError: the stub is not a weights array (its BUILD state), or has no data.
    """
    if v.error:
        raise _refuse(path, f"tensor {_show(name, 200)}: {v.error}")
    if v.data is None or v.dtype is None or v.shape is None:  # never BUILT with its state
        raise _refuse(path, f"tensor {_show(name, 200)} has no data")
    if isinstance(v.data, bytes):  # small payload, read during the walk
        off, n, inline = -1, len(v.data), v.data
    else:
        off, n, inline = v.data.offset, v.data.length, None
    return TensorInfo(
        name, v.dtype.name, v.shape, rel, off, n, storage=(rel, id(v)), fortran=v.fortran, inline=inline
    )


@dataclass
class OptimizerHeader:
    """The headers of an ``optimizer.pdopt`` (:func:`read_optimizer_header`).

    Attributes:
        tensors: the top-level accumulators, in file order.
        master: the ``master_weights`` arrays, keyed by parameter name (``TensorInfo.name`` is the key).
        names: key → Tensor name, for tensors pickled as ``tuple((name, array))`` (master weights are named
            ``<param>_fp32_master_0``); empty for a plain state dict.
        extras: the other entries (``LR_Scheduler``, ``StructuredToParameterName@@``), in file order; the
            position of ``master_weights`` among them is kept as ``{"master_weights": None}``.
        np_module: the numpy module the arrays were pickled with.
    """

    tensors: list[TensorInfo]
    master: list[TensorInfo]
    names: dict[str, str]
    extras: dict[str, Any]
    np_module: str


def read_optimizer_header(path: Path, rel: str) -> OptimizerHeader:
    """Headers of a Paddle ``optimizer.pdopt`` (``paddle.save(optimizer.state_dict())``) without loading
    or executing anything: the walker with :data:`OPTIMIZER`.

    Raises:
        UnsafePickleError, CheckpointError: as :func:`walk`; a ``master_weights`` that is not a dict of
            arrays.
    """
    top, _ = walk(path, OPTIMIZER)
    out = OptimizerHeader([], [], {}, {}, "numpy.core.multiarray")
    for key, v in top.items():
        if not isinstance(key, str):
            raise _refuse(path, f"a top-level key is {_show(key)}, not a tensor name")
        if isinstance(v, _Array):
            out.tensors.append(_tensor_info(path, rel, key, v))
            out.np_module = v.module
            if v.name is not None:
                out.names[key] = v.name
        elif key == "master_weights" and isinstance(v, dict):
            for pname, m in v.items():
                if not isinstance(pname, str) or not isinstance(m, _Array):
                    raise _refuse(path, f"master_weights entry {_show(pname)} is not a named array")
                out.master.append(_tensor_info(path, rel, pname, m))
                if m.name is not None:
                    out.names["master_weights/" + pname] = m.name
            out.extras[key] = None
        elif isinstance(v, dict) and any(isinstance(x, _Array) for x in v.values()):
            raise _refuse(path, f"entry {_show(key)} holds arrays, and only master_weights may")
        else:
            out.extras[key] = v
    return out


def _join_split(path: Path, tensors: list[TensorInfo], table: Any) -> list[TensorInfo]:
    """Join the ``NAME@@.k`` pieces of each parameter ``paddle.save`` split (arrays over 1 GiB, pickle
    protocol < 4) into NAME with the table's ``OriginShape``, as ``paddle.load`` does, by byte range: the
    joined tensor lists its pieces (:attr:`TensorInfo.pieces`), nothing is decoded. NAME takes the place of
    its first piece; a key NAME stored beside the pieces is replaced, as ``paddle.load`` replaces it."""
    what = f"{SPLIT_TABLE} (paddle.save's table of parameters split into pieces)"
    if not isinstance(table, dict):
        raise _refuse(path, f"{what} is not a dict")
    by_name = {t.name: t for t in tensors}
    joined: dict[str, TensorInfo] = {}
    first_piece: dict[str, str] = {}
    for name, info in table.items():
        slices = info.get("slices") if isinstance(info, dict) else None
        shape = info.get("OriginShape") if isinstance(info, dict) else None
        if not isinstance(name, str) or not isinstance(slices, list) or not slices:
            raise _refuse(path, f"{what}: entry {_show(name)} has no list of slices")
        if not all(type(x) is str for x in slices):
            raise _refuse(path, f"{what}: the slices of {_show(name)} are not all names")
        if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
            raise _refuse(path, f"{what}: entry {_show(name)} has no OriginShape")
        missing = [s for s in slices if s not in by_name]
        if missing:
            raise _refuse(path, f"{what}: piece {_show(missing[0])} of {_show(name)} is not in the file")
        parts = [by_name[s] for s in slices]
        if len({p.dtype for p in parts}) != 1:
            raise _refuse(path, f"{what}: the pieces of {name!r} have different dtypes")
        nbytes = sum(p.nbytes for p in parts)
        if nbytes != math.prod(shape) * np.dtype(parts[0].dtype).itemsize:
            raise _refuse(
                path, f"{what}: the pieces of {name!r} hold {nbytes} bytes, not shape {tuple(shape)}"
            )
        pieces = tuple(p.inline if p.inline is not None else (p.offset, p.nbytes) for p in parts)
        inline = (
            b"".join(x for x in pieces if isinstance(x, bytes))
            if all(p.inline is not None for p in parts)
            else None
        )
        joined[name] = TensorInfo(
            name,
            parts[0].dtype,
            tuple(shape),
            parts[0].file,
            -1 if inline is not None else parts[0].offset,
            nbytes,
            storage=(parts[0].file, "split", name),
            inline=inline,
            pieces=None if inline is not None else pieces,
        )
        first_piece[slices[0]] = name
    drop = {s for info in table.values() for s in info["slices"]} | set(joined)
    out: list[TensorInfo] = []
    for t in tensors:
        if t.name in first_piece:
            out.append(joined[first_piece[t.name]])
        elif t.name not in drop:
            out.append(t)
    return out


def raw_bytes_source(path: Path, t: TensorInfo) -> Source:
    """A :class:`Source` for the stored bytes of ``t`` (in the order stored, C or Fortran)."""
    if t.pieces is not None:
        return Source(
            parts=[
                Source(array=np.frombuffer(x, dtype=np.uint8)) if isinstance(x, bytes) else Source(path, *x)
                for x in t.pieces
            ]
        )
    if t.inline is not None:
        return Source(array=np.frombuffer(t.inline, dtype=np.uint8))
    return Source(path, t.offset, t.nbytes)


def read_array(path: Path, t: TensorInfo) -> np.ndarray:
    """Load one array (raw storage dtype, e.g. bf16 as ``uint16``), reading only its payload."""
    dt = np.dtype(t.dtype).newbyteorder("<")
    if t.pieces is not None:
        buf = b"".join(_read_range(path, x, t.name) if isinstance(x, tuple) else x for x in t.pieces)
    elif t.inline is not None:
        buf = t.inline
    else:
        m = map_array(path, t.offset, t.nbytes, dt, t.shape, t.fortran)
        if m is not None:
            return m
        buf = store.read_range(path, t.offset, t.nbytes)
        if len(buf) != t.nbytes:
            raise CheckpointError(f"array {t.name!r} is truncated", path, "re-download or re-export the file")
    return np.frombuffer(buf, dtype=dt).reshape(t.shape, order="F" if t.fortran else "C")


def _read_range(path: Path, rng: tuple[int, int], name: str) -> bytes:
    buf = store.read_range(path, rng[0], rng[1])
    if len(buf) != rng[1]:
        raise CheckpointError(f"array {name!r} is truncated", path, "re-download or re-export the file")
    return buf


# ---------------------------------------------------------------- writer


class Emitter:
    """Writes protocol-4 pickle opcodes for a ``{name: array}`` dict (the layout ``paddle.save`` uses)."""

    def __init__(self, f: BinaryIO, np_module: str):
        self.f = f
        self.memo_n = 0
        self.globals: dict[tuple[str, str], int] = {}
        self.np_module = np_module
        self.strings: dict[str, int] = {}

    def w(self, b: bytes) -> None:
        self.f.write(b)

    def memoize(self) -> int:
        self.w(b"\x94")
        self.memo_n += 1
        return self.memo_n - 1

    def get(self, i: int) -> None:
        self.w(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))

    def obj(self, v: Any) -> None:
        if v is None:
            self.w(b"N")
        elif v is True:
            self.w(b"\x88")
        elif v is False:
            self.w(b"\x89")
        elif isinstance(v, int):
            if 0 <= v < 256:
                self.w(b"K" + bytes([v]))
            elif -(2**31) <= v < 2**31:
                self.w(b"J" + struct.pack("<i", v))
            else:
                b = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
                self.w(b"\x8a" + bytes([len(b)]) + b)
        elif isinstance(v, float):
            self.w(b"G" + struct.pack(">d", v))
        elif isinstance(v, str):
            self.string(v)
        elif isinstance(v, bytes):
            self.w((b"C" + bytes([len(v)]) if len(v) < 256 else b"B" + struct.pack("<I", len(v))) + v)
        elif isinstance(v, tuple):
            self.w(b"(")
            for x in v:
                self.obj(x)
            self.w(b"t")
        elif isinstance(v, list):
            self.w(b"](")
            for x in v:
                self.obj(x)
            self.w(b"e")
        elif isinstance(v, dict):
            self.w(b"}(")
            for k, x in v.items():
                self.obj(k)
                self.obj(x)
            self.w(b"u")
        else:
            raise TypeError(f"cannot write {type(v).__name__} into a .pdparams")

    def string(self, s: str) -> None:
        if s in self.strings:
            self.get(self.strings[s])
            return
        b = s.encode("utf-8")
        self.w((b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + struct.pack("<I", len(b))) + b)
        self.strings[s] = self.memoize()

    def glob(self, module: str, name: str) -> None:
        key = (module, name)
        if key in self.globals:
            self.get(self.globals[key])
            return
        self.string(module)
        self.string(name)
        self.w(b"\x93")
        self.globals[key] = self.memoize()

    def array(self, dtype: np.dtype, shape: tuple[int, ...], fortran: bool, src: Source) -> int:
        """Emit one ndarray; the payload is streamed from ``src``. Returns its memo index."""
        self.glob(self.np_module, "_reconstruct")
        self.glob("numpy", "ndarray")
        self.w(b"K\x00\x85C\x01b\x87R")
        idx = self.memoize()
        self.w(b"(K\x01")
        self.obj(tuple(int(d) for d in shape))
        self.glob("numpy", "dtype")
        self.string(dtype.str[1:])
        self.w(b"\x89\x88\x87R")
        self.memoize()
        order = "|" if dtype.itemsize == 1 or dtype.kind == "b" else "<"
        self.w(b"(K\x03")
        self.string(order)
        self.w(b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
        self.w(b"\x88" if fortran else b"\x89")
        n = src.nbytes
        self.w(b"B" + struct.pack("<I", n) if n < 2**32 else b"\x8e" + struct.pack("<Q", n))
        src.write_to(self.f)
        self.w(b"tb")
        return idx


def write_file(
    path: Path,
    tensors: Iterable[tuple[str, str, tuple[int, ...], Source, object, bool]],
    extras: dict[str, Any],
    np_module: str = "numpy.core.multiarray",
) -> int:
    """Write a ``.pdparams`` file, streaming every payload.

    Args:
        path: output file.
        tensors: ``(name, numpy dtype name, shape, source, storage key, fortran)``; entries with the same
            non-None storage key are written once and bound to every name (aliases, as in the input).
        extras: non-tensor entries written after the arrays (``StructuredToParameterName@@``).
        np_module: module of ``_reconstruct`` (``numpy.core.multiarray`` loads under numpy 1 and 2).

    Returns:
        bytes of array data referenced by names (aliases counted once per name, as an index counts).
    """
    total = 0
    with open(path, "wb") as f:
        e = Emitter(f, np_module)
        e.w(b"\x80\x04}")
        e.memoize()
        written: dict[object, int] = {}
        for name, dtype, shape, src, storage, fortran in tensors:
            e.w(b"(")
            e.string(name)
            if storage is not None and storage in written:
                e.get(written[storage])
            else:
                idx = e.array(np.dtype(dtype), shape, fortran, src)
                if storage is not None:
                    written[storage] = idx
            e.w(b"u")
            total += src.nbytes
        for k, v in extras.items():
            e.w(b"(")
            e.string(k)
            e.obj(v)
            e.w(b"u")
        e.w(b".")
        f.flush()
        os.fsync(f.fileno())
    return total


Row = tuple[str, str, tuple[int, ...], Source, object, bool]
"""One tensor to write: ``(key, numpy dtype name, shape, source, storage key, fortran)``."""


def write_optimizer_file(
    path: Path,
    tensors: Iterable[Row],
    master: Iterable[Row],
    names: dict[str, str],
    extras: dict[str, Any],
    np_module: str = "numpy.core.multiarray",
) -> None:
    """Write an ``optimizer.pdopt`` as ``paddle.save`` writes it, streaming every payload: the accumulators,
    then ``extras`` in order, ``master_weights`` (its value None in ``extras``) made of ``master``.

    A key in ``names`` is written as ``paddle.save``'s ``_pickle_save`` writes a Tensor,
    ``tuple((name, array))`` (master weights under ``"master_weights/" + parameter name``); the others as
    plain arrays (its state-dict path).
    """
    with open(path, "wb") as f:
        e = Emitter(f, np_module)
        e.w(b"\x80\x04}")
        e.memoize()

        def put(prefix: str, row: Row) -> None:
            key, dtype, shape, src, _storage, fortran = row
            e.w(b"(")
            e.string(key)
            name = names.get(prefix + key)
            if name is not None:
                e.glob("builtins", "tuple")
                e.string(name)
            e.array(np.dtype(dtype), shape, fortran, src)
            if name is not None:
                e.w(b"\x86\x85R")  # TUPLE2 TUPLE1 REDUCE: tuple(((name, array),))
            e.w(b"u")

        for row in tensors:
            put("", row)
        for k, v in extras.items():
            if k == "master_weights" and v is None:
                e.w(b"(")
                e.string(k)
                e.w(b"}")
                e.memoize()
                for row in master:
                    put("master_weights/", row)
                e.w(b"u")
                continue
            e.w(b"(")
            e.string(k)
            e.obj(v)
            e.w(b"u")
        e.w(b".")
        f.flush()
        os.fsync(f.fileno())
