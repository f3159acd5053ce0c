"""What the pickle walker (:mod:`.unpickle`) accepts and what it builds instead of running the pickle.

The allow-lists (:data:`WEIGHTS` for ``.pdparams``, :data:`OPTIMIZER` for ``.pdopt``; flex ``.metadata`` has
its own in :mod:`surgery.io.flex`), each with its :class:`Limits`; the globals they allow are *simulated* by
the functions here, never imported or called. The stand-ins the walker builds in place of objects
(:class:`PickledArray`, :class:`PickledDType`, :class:`PickledGlobal`, :class:`BytesRef`, :class:`Record`)
hold only plain values and byte ranges of the file.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any, Literal

from ...model.tensor import NP_TO_ST

if TYPE_CHECKING:
    import numpy as np
else:
    from ...model.lazy import numpy as np

RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
SCALAR = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}


@dataclass(frozen=True)
class Limits:
    """Bounds of one walk (no input may crash the interpreter or take more than linear time).

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


class PickledGlobal:
    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


class BytesRef:
    """A bytes payload left in the file: ``[offset, offset + length)``."""

    __slots__ = ("offset", "length")

    def __init__(self, offset: int, length: int):
        self.offset, self.length = offset, length


@cache
def _dtype_codes() -> dict[str, np.dtype]:
    """The dtype strings a weights pickle may give ``numpy.dtype`` (``f4``, ``u2``, ``b1``: what numpy's
    ``dtype.__reduce__`` writes; also the names and one-letter codes), each a weight dtype of ``NP_TO_ST``.
    A table, so that no other string from the file ever reaches numpy's dtype parser (which raises
    TypeError, ValueError or SyntaxError on strings it does not know and accepts structured, subarray and
    object dtypes). Made on first use (numpy is imported then, not with this module)."""
    out: dict[str, np.dtype] = {}
    for name in NP_TO_ST:
        dt = np.dtype(name)
        for code in (dt.str[1:], dt.char, name, f"{dt.kind}{dt.itemsize}"):
            out[code] = dt
    return out


_NATIVE: Literal["<", ">"] = "<" if sys.byteorder == "little" else ">"
_ORDERS: dict[str, Literal["<", ">"]] = {"<": "<", "|": "<", "=": _NATIVE, ">": ">"}


class PickledDType:
    """A simulated ``numpy.dtype(code)``; BUILD may set its byte order. ``error`` says why it is not a
    weight dtype (reported with the tensor's name by :func:`read_header`)."""

    __slots__ = ("code", "order", "error")

    def __init__(self, code: Any):
        self.code, self.order = code, "<"
        self.error = (
            None
            if isinstance(code, str) and code in _dtype_codes()
            else f"dtype {show_value(code)} is not a weight dtype"
        )

    def numpy(self) -> np.dtype:
        """The dtype (byte order applied).

        Raises:
            ValueError: not a weight dtype, or an unknown byte order.
        """
        if self.error:
            raise ValueError(self.error)
        if type(self.order) is not str or self.order not in _ORDERS:  # a str: hashing it is bounded
            raise ValueError(f"dtype byte order {show_value(self.order)} (expected '<', '|', '=' or '>')")
        return _dtype_codes()[self.code].newbyteorder(_ORDERS[self.order])


class PickledArray:
    """An ndarray seen in the pickle; its data stays in the file. ``error``: why its BUILD state is not a
    weights array (raised, naming the tensor, by :func:`read_header`)."""

    __slots__ = ("shape", "dtype", "fortran", "data", "module", "error", "name")

    def __init__(self, module: str):
        self.name: str | None = None  # the Tensor's name, when pickled as tuple((name, array))
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None
        self.fortran = False
        self.data: BytesRef | bytes | None = None
        self.module = module
        self.error: str | None = None


class _Mark:
    pass


MARK_OBJECT = _Mark()
STAND_INS = (
    PickledGlobal,
    BytesRef,
    PickledDType,
    PickledArray,
    _Mark,
)  # what the walker builds besides plain values
KEY_LEAVES = (str, int, float, bytes, type(None))  # bool is an int


def show_value(v: Any, n: int = 40) -> str:
    """``v`` for a message, bounded: a string or bytes cut to ``n`` characters, anything else by its type
    (never ``repr`` of a container: a deep or shared one would recurse or take exponential time)."""
    if isinstance(v, (str, bytes)):
        return repr(v[:n]) + ("..." if len(v) > n else "")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 10**20:
        return repr(v)
    return f"a {type(v).__name__}"


# ------------------------------------------------------------ the simulated globals of a weights pickle


def simulated_reconstruct(
    args: tuple[Any, ...],
) -> Any:  # numpy.core.multiarray._reconstruct: a PickledArray stub
    raise AssertionError("handled by _Walker.reduce")  # pragma: no cover


def simulated_ordered_dict(
    args: tuple[Any, ...],
) -> Any:  # collections.OrderedDict: keys checked by the walker
    raise AssertionError("handled by _Walker.ordered_dict")  # pragma: no cover


def _np_dtype(args: tuple[Any, ...]) -> PickledDType:
    """``numpy.dtype(code, align, copy)``: a :class:`PickledDType` (an unknown code is reported with the
    tensor's name when the array is read)."""
    if not args:
        raise ValueError("numpy.dtype without arguments")
    return PickledDType(args[0])


def _codecs_encode(args: tuple[Any, ...]) -> bytes:
    """``_codecs.encode(text, "latin1")``: how protocol 2 pickles bytes."""
    if not args or type(args[0]) is not str or (len(args) > 1 and args[1] not in ("latin1", "latin-1")):
        raise ValueError("_codecs.encode of something other than a latin-1 string")
    return args[0].encode("latin-1")


def _np_scalar(args: tuple[Any, ...]) -> Any:
    """``numpy.core.multiarray.scalar(dtype, bytes)``: the scalar's Python value."""
    if len(args) != 2 or not isinstance(args[0], PickledDType) or type(args[1]) is not bytes:
        raise ValueError("numpy scalar without a dtype and its bytes")
    dt = args[0].numpy()
    if len(args[1]) != dt.itemsize:
        raise ValueError(f"numpy scalar of {len(args[1])} bytes for dtype {dt.name}")
    return np.frombuffer(args[1], dtype=dt)[0].item()


WEIGHTS = AllowList(
    "a Paddle weights file",
    {
        **{g: simulated_reconstruct for g in RECONSTRUCT},
        **{g: _np_scalar for g in SCALAR},
        ("numpy", "dtype"): _np_dtype,
        ("collections", "OrderedDict"): simulated_ordered_dict,
        ("_codecs", "encode"): _codecs_encode,
    },
    classes=frozenset({("numpy", "ndarray")}),
)
ALLOWED_GLOBALS = WEIGHTS.globals  # every global a weights pickle may name


def _named_tensor(args: tuple[Any, ...]) -> PickledArray:
    """``builtins.tuple(((name, array),))``: how ``paddle.save`` pickles a Tensor outside a plain state dict
    (``reduce_varbase``: ``(tuple, ((tensor.name, ndarray),))``; ``paddle.load`` makes it a Tensor of that
    name again). The array stub, its name recorded."""
    if len(args) != 1 or type(args[0]) is not tuple or len(args[0]) != 2:
        raise ValueError("builtins.tuple of something other than one (name, array) pair")
    name, arr = args[0]
    if type(name) is not str or not isinstance(arr, PickledArray) or arr.name is not None:
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
