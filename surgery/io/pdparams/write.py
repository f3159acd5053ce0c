"""Writing Paddle pickles (``.pdparams``, ``.pdopt``): the protocol-4 structure numpy/paddle use, with
payloads streamed from their sources, and aliases (names bound to one array) written once and referenced
through the pickle memo, as ``paddle.save`` does.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..safetensors_io import Source

if TYPE_CHECKING:
    import numpy as np
else:
    from ...model.lazy import numpy as np

# ---------------------------------------------------------------- writer


class Emitter:
    """Writes protocol-4 pickle opcodes for a ``{name: array}`` dict (the layout ``paddle.save`` uses)."""

    def __init__(self, f: BinaryIO, np_module: str):
        self.f = f
        self.w: Callable[[bytes], object] = f.write  # one opcode's bytes (bound once: called per opcode)
        self.memo_n = 0
        self.globals: dict[tuple[str, str], int] = {}
        self.np_module = np_module
        self.strings: dict[str, int] = {}

    def memoize(self) -> int:
        self.w(b"\x94")
        self.memo_n += 1
        return self.memo_n - 1

    def get(self, i: int) -> None:
        self.w(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))

    def obj(self, v: Any) -> None:
        """Emit ``v`` (None, bool, int, float, str, bytes, tuple, list, dict of these). The exact types the
        records hold most (tuples of ints, strings) are tried first, by identity of their type; the bytes
        are those of :meth:`other` (a subclass of int or str goes there too).

        Raises:
            TypeError: a value of any other type.
        """
        t = type(v)
        if t is tuple:
            self.w(b"(")
            for x in v:
                self.obj(x)
            self.w(b"t")
        elif t is str:
            self.string(v)
        elif t is int and 0 <= v < 256:
            self.w(b"K" + bytes((v,)))
        else:
            self.other(v)

    def other(self, v: Any) -> None:
        """Emit ``v`` of any type :meth:`obj` takes (its fast path's exact types too), by ``isinstance``."""
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
