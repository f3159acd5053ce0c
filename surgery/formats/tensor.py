"""Tensor headers and the dtype table shared by both formats."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class DType:
    """One storage dtype.

    Attributes:
        st: the safetensors header label (``F32``, ``BF16``, ...).
        np_name: the numpy dtype name a ``.pdparams`` stores it as (bf16 is ``uint16`` there).
        storage: numpy dtype of the raw bytes (bf16 → ``uint16``: bits, never values).
        itemsize: bytes per element.
        logical: the dtype the values mean (``bfloat16`` for bf16 bits).
    """

    st: str
    np_name: str
    storage: str
    itemsize: int
    logical: str


# safetensors label -> DType. U16 is listed as its own label; whether U16 means bf16 bits is decided
# per checkpoint (Paddle writes bf16 as uint16; see ``Checkpoint.bf16_as_u16``).
DTYPES: dict[str, DType] = {
    d.st: d
    for d in (
        DType("F64", "float64", "float64", 8, "float64"),
        DType("F32", "float32", "float32", 4, "float32"),
        DType("F16", "float16", "float16", 2, "float16"),
        DType("BF16", "uint16", "uint16", 2, "bfloat16"),
        DType("U16", "uint16", "uint16", 2, "uint16"),
        DType("I64", "int64", "int64", 8, "int64"),
        DType("I32", "int32", "int32", 4, "int32"),
        DType("I16", "int16", "int16", 2, "int16"),
        DType("I8", "int8", "int8", 1, "int8"),
        DType("U8", "uint8", "uint8", 1, "uint8"),
        DType("U32", "uint32", "uint32", 4, "uint32"),
        DType("U64", "uint64", "uint64", 8, "uint64"),
        DType("BOOL", "bool", "bool", 1, "bool"),
        DType("F8_E4M3", "uint8", "uint8", 1, "float8_e4m3fn"),
        DType("F8_E5M2", "uint8", "uint8", 1, "float8_e5m2"),
    )
}
# numpy dtype name (as found in a .pdparams) -> safetensors label
NP_TO_ST = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "uint16": "U16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
}


@dataclass(frozen=True)
class TensorInfo:
    """Header of one stored tensor; no data.

    Attributes:
        name: state-dict key.
        dtype: the label as the file stores it (safetensors ``F32``/``BF16``/``U16``; pdparams numpy name).
        shape: dimensions, e.g. ``(vocab_size, hidden_size)``.
        file: weight file name, relative to the checkpoint folder.
        offset: absolute byte offset of the first data byte in ``file``.
        nbytes: size of the data in bytes (``prod(shape) * itemsize``).
        storage: identity of the stored array; names with equal ``storage`` are aliases of one array
            (pickle memo in ``.pdparams``). ``None`` when the name has storage of its own.
        fortran: the bytes are in Fortran order (numpy pickles may store that).
        inline: the data itself, for payloads small enough to be read while walking a pickle
            (``offset`` is then -1).
        pieces: for a ``.pdparams`` parameter that ``paddle.save`` split into ``NAME@@.k`` pieces, where
            each piece is, in order: ``(offset, nbytes)`` in ``file``, or the bytes read while walking
            (``offset`` is then -1 and ``inline`` None).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    offset: int
    nbytes: int
    storage: object = field(default=None, compare=False)
    fortran: bool = False
    inline: bytes | None = field(default=None, compare=False, repr=False)
    pieces: tuple[tuple[int, int] | bytes, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def st_dtype(self) -> DType:
        """The :class:`DType` of this tensor (pdparams numpy names are mapped to safetensors labels)."""
        return DTYPES[self.dtype] if self.dtype in DTYPES else DTYPES[NP_TO_ST[self.dtype]]

    @property
    def storage_dtype(self) -> np.dtype:
        return np.dtype(self.st_dtype.storage).newbyteorder("<")


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (``uint16``, any shape) → ``float32`` by a 16-bit shift; exact."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """``float32`` → bfloat16 bit patterns (``uint16``), rounding to nearest even, NaN kept NaN.

    Same rounding as paddle's and PyTorch's ``float32 → bfloat16`` cast.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded = rounded.copy()
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


MMAP_MIN_BYTES = 64 << 20


def map_array(path, offset: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...], fortran: bool = False):
    """A read-only memory map of ``nbytes`` at ``offset`` as an array, for tensors of at least
    ``MMAP_MIN_BYTES`` (None below that: callers read small tensors into memory). Pages come from the page
    cache on demand, so comparing or copying a multi-GB embedding never holds a second copy in memory."""
    if nbytes < MMAP_MIN_BYTES or not isinstance(path, str | os.PathLike) or hasattr(path, "fs"):
        return None  # small, or a remote file (a UPath: no memory map over the network)
    return np.memmap(
        path, dtype=dtype, mode="r", offset=offset, shape=tuple(shape), order="F" if fortran else "C"
    )
