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
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .. import store
from ..errors import CheckpointError, UnsafePickleError
from .safetensors_io import Source
from .tensor import NP_TO_ST, TensorInfo, map_array

RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
SCALAR = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
ALLOWED_GLOBALS = (
    RECONSTRUCT
    | SCALAR
    | {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("collections", "OrderedDict"),
        ("_codecs", "encode"),
    }
)
NON_TENSOR_KEYS = ("StructuredToParameterName@@",)
SPLIT_TABLE = "UnpackBigParamInfor@@"  # paddle.save (protocol < 4): NAME -> {OriginShape, slices}
INLINE_MAX = 256  # payloads up to this size are read; larger ones are recorded as byte ranges


class _Global:
    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


class _BytesRef:
    """A bytes payload left in the file: ``[offset, offset + length)``."""

    __slots__ = ("offset", "length")

    def __init__(self, offset: int, length: int):
        self.offset, self.length = offset, length


class _DType:
    __slots__ = ("code", "order")

    def __init__(self, code: str):
        self.code, self.order = code, "<"

    def numpy(self) -> np.dtype:
        try:
            dt = np.dtype(self.code)
        except TypeError:
            raise ValueError(f"unsupported numpy dtype {self.code!r}") from None
        if dt.hasobject or dt.fields:
            raise ValueError(f"unsupported numpy dtype {self.code!r}")
        if self.order not in "<>":  # "|" (no byte order), "=": as numpy made it
            return dt
        if not self.order:  # as numpy itself refuses it
            raise ValueError("byteorder not recognized (got '')")
        # "<", ">" (numpy reads only the first character of "<>")
        return dt.newbyteorder(">" if self.order.startswith(">") else "<")


class _Array:
    """An ndarray seen in the pickle; its data stays in the file."""

    __slots__ = ("shape", "dtype", "fortran", "data", "module")

    def __init__(self, module: str):
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None
        self.fortran = False
        self.data: _BytesRef | bytes | None = None
        self.module = module


class _Mark:
    pass


_MARK = _Mark()


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(what, path, "the file is damaged or is not a Paddle weights file; re-export it")


def walk(path: Path) -> tuple[dict[str, Any], int]:
    """Walk the opcodes of a ``.pdparams`` pickle without executing or loading it.

    Returns:
        ``(top-level dict, file size)``. Array values are ``_Array`` stubs with their byte ranges;
        other values are plain Python objects (the ``StructuredToParameterName@@`` dict).

    Raises:
        UnsafePickleError: a global outside ``ALLOWED_GLOBALS`` (named in the message); nothing is run.
        CheckpointError: truncated or malformed pickle, or a top level that is not a dict.
    """
    try:
        size = store.size(path)
        f = store.open_read(path)  # remote: 64 KiB requests; the walker seeks past payloads
    except IsADirectoryError:
        raise CheckpointError("is a folder, expected a .pdparams file", path, "remove or rename it") from None
    except OSError as e:
        raise CheckpointError(
            f"cannot read: {e.strerror}", path, "check that it exists and is readable"
        ) from None
    with f:
        try:
            return _walk(f, path, size), size
        except (UnsafePickleError, CheckpointError):
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
            raise _refuse(path, f"malformed pickle ({e.__class__.__name__}: {str(e)[:80]})") from None


def _walk(f: BinaryIO, path: Path, size: int) -> dict[str, Any]:
    """Run the opcodes of the pickle in ``f`` (``size`` bytes) through :class:`_Walker` up to STOP.

    Returns:
        the top-level dict.

    Raises:
        UnsafePickleError: a global outside ``ALLOWED_GLOBALS``.
        CheckpointError: truncated, an opcode a weights pickle does not use, or a top level that is not
            a dict.
        ValueError, IndexError, KeyError, TypeError, struct.error...: a malformed pickle (:func:`walk`
            turns these into a ``CheckpointError``).
    """
    w = _Walker(f, path, size)
    ops = _OPCODES
    while True:
        op = f.read(1)
        if not op:
            raise _refuse(path, "truncated pickle (no STOP opcode)")
        c = op[0]
        if c == 0x2E:  # STOP
            break
        handler = ops.get(c)
        if handler is None:
            raise _refuse(path, f"unsupported pickle opcode 0x{c:02x} at offset {f.tell() - 1}")
        handler(w)
    stack = w.stack
    if len(stack) != 1 or not isinstance(stack[0], dict):
        raise _refuse(path, "the pickle does not hold a {name: array} dict")
    return stack[0]


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

    __slots__ = ("f", "path", "size", "stack", "memo")

    def __init__(self, f: BinaryIO, path: Path, size: int):
        self.f, self.path, self.size = f, path, size
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}

    # ------------------------------------------------------------ helpers

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes.

        Raises:
            CheckpointError: fewer than ``n`` bytes are left.
        """
        f = self.f
        if n < 0 or f.tell() + n > self.size:
            raise _refuse(
                self.path, f"truncated pickle (wants {n} bytes at offset {f.tell()} of {self.size})"
            )
        b = f.read(n)
        if len(b) != n:
            raise _refuse(self.path, "truncated pickle")
        return b

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

    def check_global(self, module: str, name: str) -> _Global:
        """The global ``module.name``.

        Raises:
            UnsafePickleError: it is not in ``ALLOWED_GLOBALS`` (nothing is imported).
        """
        if (module, name) not in ALLOWED_GLOBALS:
            raise UnsafePickleError(
                f"refused to unpickle: the pickle calls {module}.{name}, which a weights file never needs "
                "(nothing was executed)",
                self.path,
                "do not load this file with paddle.load/pickle; get the weights from a trusted source",
            )
        return _Global(module, name)

    def readline_global(self) -> _Global:
        """The checked global named by the next two lines (``module``, ``name``: GLOBAL, INST)."""
        module = self.f.readline().decode("utf-8").rstrip("\n")
        name = self.f.readline().decode("utf-8").rstrip("\n")
        return self.check_global(module, name)

    @staticmethod
    def reduce(fn: Any, args: Any) -> Any:
        """Simulate calling an allowed global: an :class:`_Array` stub, a :class:`_DType`, a dict, bytes or
        a numpy scalar's value.

        Raises:
            ValueError: ``fn`` is not a global, or not one that is simulated.
        """
        if not isinstance(fn, _Global):
            raise ValueError("REDUCE on a non-global")
        key = (fn.module, fn.name)
        if key in RECONSTRUCT:
            return _Array(fn.module)
        if key == ("numpy", "dtype"):
            return _DType(str(args[0]))
        if key == ("collections", "OrderedDict"):
            return dict(args[0]) if args else {}
        if key == ("_codecs", "encode"):
            return str(args[0]).encode("latin-1")
        if key in SCALAR:
            dt = args[0].numpy() if isinstance(args[0], _DType) else np.dtype("float32")
            return np.frombuffer(args[1], dtype=dt)[0].item()
        raise ValueError(f"cannot call {fn.module}.{fn.name}")

    # ------------------------------------------------------------ opcodes

    def op_proto(self) -> None:
        self.read(1)

    def op_frame(self) -> None:
        self.read(8)

    def op_empty_dict(self) -> None:
        self.stack.append({})

    def op_empty_list(self) -> None:
        self.stack.append([])

    def op_empty_tuple(self) -> None:
        self.stack.append(())

    def op_mark(self) -> None:
        self.stack.append(_MARK)

    def op_dict(self) -> None:
        items = self.pop_mark()
        self.stack.append(dict(_pairs(items, "DICT")))

    def op_list(self) -> None:
        self.stack.append(self.pop_mark())

    def op_tuple(self) -> None:
        self.stack.append(tuple(self.pop_mark()))

    def op_tuple_n(self, n: int) -> None:
        """TUPLE1/2/3: the top ``n`` items as a tuple."""
        stack = self.stack
        items = stack[-n:]
        del stack[-n:]
        stack.append(tuple(items))

    def op_setitem(self) -> None:
        stack = self.stack
        v = stack.pop()
        k = stack.pop()
        stack[-1][k] = v

    def op_setitems(self) -> None:
        items = self.pop_mark()
        d = self.stack[-1]
        for k, v in _pairs(items, "SETITEMS"):
            d[k] = v

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
        self.memo[int(self.f.readline())] = self.stack[-1]

    def op_binget(self) -> None:
        self.stack.append(self.memo[self.read(1)[0]])

    def op_long_binget(self) -> None:
        self.stack.append(self.memo[struct.unpack("<I", self.read(4))[0]])

    def op_get(self) -> None:
        self.stack.append(self.memo[int(self.f.readline())])

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
        line = self.f.readline().strip()
        self.stack.append(True if line == b"01" else False if line == b"00" else int(line))

    def op_binfloat(self) -> None:
        self.stack.append(struct.unpack(">d", self.read(8))[0])

    def op_global(self) -> None:
        self.stack.append(self.readline_global())

    def op_stack_global(self) -> None:
        stack = self.stack
        name = stack.pop()
        module = stack.pop()
        stack.append(self.check_global(str(module), str(name)))

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
        _build(self.stack[-1], state)

    def op_pop(self) -> None:
        self.stack.pop()

    def op_pop_mark(self) -> None:
        self.pop_mark()

    def op_dup(self) -> None:
        self.stack.append(self.stack[-1])


def _build(obj: Any, state: Any) -> None:
    """BUILD: set the state of an :class:`_Array` stub (checked: shape, a weight dtype, little-endian, a bytes
    payload of shape × itemsize), of a :class:`_DType` (byte order), or update a dict.

    Raises:
        ValueError: a state a weights pickle does not have.
    """
    if isinstance(obj, _Array):
        _version, shape, dtype, fortran, data = state
        obj.shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in obj.shape):
            raise ValueError(f"array with negative dimension {obj.shape}")
        obj.dtype = dtype.numpy()
        if obj.dtype.byteorder == ">":
            raise ValueError("big-endian array (Paddle writes little-endian; re-save the weights)")
        if obj.dtype.name not in NP_TO_ST:
            raise ValueError(f"array dtype {obj.dtype.name} is not a weight dtype")
        obj.fortran = bool(fortran)
        if isinstance(data, str):
            data = data.encode("latin-1")
        if not isinstance(data, (bytes, _BytesRef)):
            raise ValueError("array payload is not bytes (object arrays are not weights)")
        n = len(data) if isinstance(data, bytes) else data.length
        numel = math.prod(obj.shape)  # Python ints: no overflow on absurd shapes
        if n != numel * obj.dtype.itemsize:
            raise ValueError(
                f"array payload has {n} bytes, shape {obj.shape} needs {numel * obj.dtype.itemsize}"
            )
        obj.data = data
    elif isinstance(obj, _DType):
        if isinstance(state, tuple) and len(state) > 1 and isinstance(state[1], str):
            obj.order = state[1]
    elif isinstance(obj, dict) and isinstance(state, dict):
        obj.update(state)
    else:
        raise ValueError("BUILD on an unsupported object")


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
            raise _refuse(path, f"non-string key {name!r}")
        if isinstance(v, _Array):
            if v.data is None or v.dtype is None or v.shape is None:  # never BUILT with its state
                raise _refuse(path, f"array {name!r} has no data")
            module = v.module
            if isinstance(v.data, bytes):  # small payload, read during the walk
                off, n, inline = -1, len(v.data), v.data
            else:
                off, n, inline = v.data.offset, v.data.length, None
            tensors.append(
                TensorInfo(
                    name,
                    v.dtype.name,
                    v.shape,
                    rel,
                    off,
                    n,
                    storage=(rel, id(v)),
                    fortran=v.fortran,
                    inline=inline,
                )
            )
        else:
            _check_depth(path, name, v)
            extras[name] = v
    if SPLIT_TABLE in extras:
        tensors = _join_split(path, tensors, extras.pop(SPLIT_TABLE))
    return tensors, extras, module


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
            raise _refuse(path, f"{what}: entry {name!r} has no list of slices")
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise _refuse(path, f"{what}: entry {name!r} has no OriginShape")
        missing = [s for s in slices if s not in by_name]
        if missing:
            raise _refuse(path, f"{what}: piece {missing[0]!r} of {name!r} is not in the file")
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


def _check_depth(path: Path, name: str, v: Any, limit: int = 32) -> None:
    """Refuse absurdly nested non-tensor values (the writer re-emits them recursively)."""
    todo = [(v, 0)]
    while todo:
        x, d = todo.pop()
        if d > limit:
            raise _refuse(path, f"entry {name!r} is nested more than {limit} levels deep")
        if isinstance(x, dict):
            todo += [(y, d + 1) for kv in x.items() for y in kv]
        elif isinstance(x, (list, tuple)):
            todo += [(y, d + 1) for y in x]


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


class _Emitter:
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
    tensors: list[tuple[str, str, tuple[int, ...], Source, object, bool]],
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
        e = _Emitter(f, np_module)
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
