"""The pickle walker: :func:`walk` reads a pickle's opcodes itself instead of calling ``pickle.load``.

* nothing from the file is ever executed: the only globals accepted are the ones the allow-list names
  (:mod:`.allowlist`), and even those are *simulated*, never imported or called; any other global is refused
  by name before anything is built (``UnsafePickleError``);
* array payloads (``BINBYTES``/``BINBYTES8``) are not read: the walker records their byte range and seeks
  past them, so the structure of a multi-GB file is known after reading a few KB, and a rewrite copies
  unchanged arrays by byte range;
* every walk is bounded (:class:`~.allowlist.Limits`): no input may crash the interpreter or take more than
  linear time.

``pickle`` cannot do any of these (its ``Unpickler`` materialises every payload).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ...model.errors import CheckpointError, UnsafePickleError
from .. import regular, store
from .allowlist import (
    KEY_LEAVES,
    MARK_OBJECT,
    STAND_INS,
    WEIGHTS,
    AllowList,
    BytesRef,
    Limits,
    PickledArray,
    PickledDType,
    PickledGlobal,
    Record,
    show_value,
    simulated_ordered_dict,
    simulated_reconstruct,
)

INLINE_MAX = 256  # payloads up to this size are read; larger ones are recorded as byte ranges


_REFUSE_FIX = "the file is damaged or is not a Paddle weights file; re-export it"


def _fix_for(rules: AllowList) -> str:
    return f"the file is damaged or is not {rules.what}; copy it again from where it was written"


def refuse(path: Path, what: str) -> CheckpointError:
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
        ``(top-level dict, file size)``. Array values are ``PickledArray`` stubs with their byte ranges;
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
            bad = refuse(path, f"malformed pickle ({e.__class__.__name__}: {str(e)[:80]})")
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
            raise refuse(path, "truncated pickle (no STOP opcode)")
        c = op[0]
        if c == 0x2E:  # STOP
            break
        handler = ops.get(c)
        if handler is None:
            raise refuse(path, f"unsupported pickle opcode 0x{c:02x} at offset {f.tell() - 1}")
        handler(w)
    else:
        raise _too_big(path, f"more opcodes than the file's {size} bytes")
    stack = w.stack
    if rules.top_record:
        if len(stack) != 1 or type(stack[0]) is not Record:
            raise refuse(path, f"the pickle does not hold one record, as {rules.what} does")
        _check_values(path, {"": stack[0]}, rules.limits, size)
        return {"": stack[0]}
    if len(stack) != 1 or not isinstance(stack[0], dict):
        raise refuse(path, "the pickle does not hold a {name: array} dict")
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
            if isinstance(v, STAND_INS) and not isinstance(v, PickledArray):
                raise refuse(path, f"entry {show_value(name)} is a bare {_stand_in(v)}, not a value")
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
                        raise refuse(path, f"entry {show_value(name)} contains itself (a cyclic value)")
                    if len(todo) >= lim.depth:
                        raise _too_big(
                            path, f"entry {show_value(name)} is nested more than {lim.depth} levels deep"
                        )
                    on_path.add(i)
                    todo.append((c, iter(_children(c))))
                    counts.append(1)
                    break
                nested = lim.nested_arrays and t is PickledArray and type(x) is dict and len(todo) == 1
                if isinstance(c, STAND_INS) and not nested:  # nested: an array in a top-level dict
                    raise refuse(
                        path, f"entry {show_value(name)} holds {_stand_in(c)} inside a non-tensor value"
                    )
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
                        f"entry {show_value(name)} counts over {budget:,} values at every reference "
                        "(memo references repeat one value: a memo bomb)",
                    )


def _stand_in(v: Any) -> str:
    if isinstance(v, PickledArray):
        return "an array"
    if isinstance(v, PickledDType):
        return "a numpy dtype"
    if isinstance(v, PickledGlobal):
        return f"the global {v.module[:80]}.{v.name[:80]}"
    return "an array payload" if isinstance(v, BytesRef) else "a MARK"


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
                raise refuse(self.path, f"truncated pickle (wants {n} bytes at offset {f.tell() - len(b)})")
            return b
        if n < 0 or f.tell() + n > self.size:
            raise refuse(self.path, f"truncated pickle (wants {n} bytes at offset {f.tell()} of {self.size})")
        b = f.read(n)
        if len(b) != n:
            raise refuse(self.path, "truncated pickle")
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
            raise refuse(self.path, f"truncated pickle (a {what} without its end of line)")
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
        if isinstance(k, KEY_LEAVES) or type(k) is Record:  # a record: hashed by identity
            return k
        if type(k) is not tuple:
            raise refuse(self.path, f"a dict key is {show_value(k)} (a weights pickle's keys are names)")
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
                elif not isinstance(c, KEY_LEAVES):
                    raise refuse(
                        self.path, f"a dict key holds {show_value(c)} (a weights pickle's keys are names)"
                    )
        return k

    def setitems(self, d: Any, items: list[Any], op: str) -> None:
        """``d[k] = v`` for the alternating keys and values ``items`` (keys checked by :meth:`key`)."""
        if type(d) is not dict:
            raise ValueError(f"{op} on {show_value(d)}")
        key = self.key
        for k, v in _pairs(items, op):
            d[k if type(k) is str else key(k)] = v

    def payload(self, n: int) -> Any:
        """A bytes payload of ``n`` bytes: read when small, else a :class:`BytesRef` skipped over.

        Raises:
            CheckpointError: the payload runs past the end of the file.
        """
        if n <= INLINE_MAX:
            return self.read(n)
        f = self.f
        off = f.tell()
        if off + n > self.size:
            raise refuse(
                self.path, f"truncated pickle: a {n}-byte array payload at offset {off} runs past the end"
            )
        f.seek(off + n)
        return BytesRef(off, n)

    def pop_mark(self) -> list[Any]:
        """Pop the items above the topmost MARK (and the MARK), in stack order."""
        stack = self.stack
        items = []
        while True:
            x = stack.pop()
            if x is MARK_OBJECT:
                break
            items.append(x)
        items.reverse()
        return items

    def check_global(self, module: Any, name: Any) -> PickledGlobal:
        """The global ``module.name``.

        Raises:
            UnsafePickleError: it is not in the allow-list (nothing is imported).
            CheckpointError: the module or the name is not a string of at most ``Limits.name`` bytes.
        """
        lim = self.lim.name
        for s in (module, name):
            if type(s) is not str:
                raise refuse(self.path, f"a global's module or name is {show_value(s)}, not a string")
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
        return PickledGlobal(module, name)

    def readline_global(self) -> PickledGlobal:
        """The checked global named by the next two lines (``module``, ``name``: GLOBAL, INST), each read
        at most ``Limits.name`` bytes far."""
        lim = self.lim.name
        module = self.readline(lim, "global's module name").decode("utf-8")
        name = self.readline(lim, "global's name").decode("utf-8")
        return self.check_global(module, name)

    def reduce(self, fn: Any, args: Any) -> Any:
        """Simulate calling an allowed global (``AllowList.calls``): an :class:`PickledArray` stub, a
        :class:`PickledDType`, a dict, bytes or a numpy scalar's value.

        Raises:
            ValueError: ``fn`` is not a global, or not one that is called; ``args`` not a tuple.
            CheckpointError: a dict key of the wrong kind (OrderedDict).
        """
        if not isinstance(fn, PickledGlobal):
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
            raise ValueError(f"arguments of {fn.module}.{fn.name} are {show_value(args)}, not a tuple")
        if call is simulated_ordered_dict:
            return self.ordered_dict(args)
        return call(args) if call is not simulated_reconstruct else PickledArray(fn.module)

    def ordered_dict(self, args: tuple[Any, ...]) -> dict[Any, Any]:
        """``collections.OrderedDict(pairs)`` as a dict, keys checked by :meth:`key`."""
        d: dict[Any, Any] = {}
        if args:
            if type(args[0]) not in (list, tuple):
                raise ValueError(f"OrderedDict of {show_value(args[0])}")
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
            raise refuse(self.path, f"truncated pickle (a {n}-byte frame at offset {self.f.tell() - 9})")

    def op_empty_dict(self) -> None:
        self.stack.append({})

    def op_empty_list(self) -> None:
        self.stack.append([])

    def op_empty_tuple(self) -> None:
        self.stack.append(())

    def op_mark(self) -> None:
        self.stack.append(MARK_OBJECT)

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
            raise ValueError(f"SETITEM on {show_value(d)}")
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
        if not items or not isinstance(items[0], PickledGlobal):
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
        if isinstance(obj, PickledArray):
            obj.error = _array_state(obj, state, self.lim)
        elif isinstance(obj, PickledDType):
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


def _array_state(obj: PickledArray, state: Any, lim: Limits) -> str | None:
    """BUILD of an :class:`PickledArray` stub: set its shape, dtype, order and payload from ``state``
    (``(version, shape, dtype, fortran, data)``, what ``ndarray.__reduce__`` writes), each checked: a tuple
    of at most ``lim.dims`` ints in ``[0, 2**63)``, a weight dtype (``allowlist``'s table) little-endian, a
    bool order, a bytes payload of shape × itemsize.

    Returns:
        None, or what is wrong (reported with the tensor's name by :func:`read_header`; the walk goes on,
        so the message can name the tensor).
    """
    if type(state) is not tuple or len(state) != 5:
        return f"array state is {show_value(state)}, expected (version, shape, dtype, fortran, data)"
    _version, shape, dtype, fortran, data = state
    if type(shape) is not tuple or len(shape) > lim.dims:
        return f"array shape is {show_value(shape)}, expected a tuple of at most {lim.dims} ints"
    if not all(type(d) is int and 0 <= d < 2**63 for d in shape):
        bad = next(d for d in shape if not (type(d) is int and 0 <= d < 2**63))
        return f"array shape has the dimension {show_value(bad)} (expected an int from 0 to 2**63 - 1)"
    if not isinstance(dtype, PickledDType):
        return f"array dtype is {show_value(dtype)}, not a numpy dtype"
    try:
        dt = dtype.numpy()
    except ValueError as e:
        return str(e)
    if dt.byteorder == ">":
        return "big-endian array (Paddle writes little-endian; re-save the weights)"
    if type(fortran) not in (bool, int):
        return f"array order flag is {show_value(fortran)}, not a bool"
    if isinstance(data, str):  # protocol 2 writes the payload as a latin-1 str
        data = data.encode("latin-1")
    if not isinstance(data, (bytes, BytesRef)):
        return "array payload is not bytes (object arrays are not weights)"
    n = len(data) if isinstance(data, bytes) else data.length
    numel = math.prod(shape)  # Python ints: no overflow on absurd shapes
    if n != numel * dt.itemsize:
        return f"array payload has {n} bytes, shape {shape} needs {numel * dt.itemsize}"
    obj.shape, obj.dtype, obj.fortran, obj.data = shape, dt, bool(fortran), data
    return None


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
