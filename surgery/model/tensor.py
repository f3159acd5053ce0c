"""Tensor headers and the dtype table shared by both formats."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import RefusedError

if TYPE_CHECKING:
    import numpy as np
else:
    from .lazy import numpy as np


@dataclass(frozen=True)
class DType:
    """One storage dtype of the safetensors format.

    Attributes:
        st: the safetensors header label (``F32``, ``BF16``, ``F8_E8M0``, ``F4``, ...).
        np_name: the numpy dtype name a ``.pdparams`` stores it as (bf16 is ``uint16`` there); None when a
            ``.pdparams`` cannot hold it (numpy and paddle's pickles have no such dtype: float8, float4,
            float6, complex).
        storage: numpy dtype of the raw bytes (bf16 → ``uint16``: bits, never values; the 8-bit floats →
            ``uint8`` bits; the packed sub-byte floats are bytes that hold no whole element).
        bits: bits per element (4 for ``F4``, 6 for ``F6_*``: packed, see :meth:`nbytes`).
        logical: the dtype the values mean (``bfloat16`` for bf16 bits, ``float8_e8m0fnu``, ...).
        decodable: tietool can compute with the values (numpy has the dtype, or bf16 by a bit shift);
            False for float8/float4/float6: those are only ever copied as bytes.
    """

    st: str
    np_name: str | None
    storage: str
    bits: int
    logical: str
    decodable: bool = True

    @property
    def itemsize(self) -> int:
        """Bytes per element; 0 for a packed sub-byte dtype (use :meth:`nbytes`)."""
        return self.bits // 8 if self.bits % 8 == 0 else 0

    @property
    def packed(self) -> bool:
        """Elements smaller than a byte, packed (``F4``: two per byte; ``F6_*``: four per three bytes)."""
        return self.bits % 8 != 0

    def nbytes(self, numel: int) -> int:
        """Bytes of ``numel`` elements, as the safetensors library sizes a tensor: ``numel × bits / 8``,
        which must be whole bytes (the library refuses a sub-byte tensor that does not end on a byte
        boundary; checked against safetensors 0.8 in ``tests/unit/model/test_dtypes.py``).

        Raises:
            ValueError: ``numel × bits`` is not a multiple of 8.
        """
        n = numel * self.bits
        if n % 8:
            raise ValueError(f"{numel} {self.st} elements are {n} bits, not whole bytes")
        return n // 8


# safetensors label -> DType: every dtype of the format as the safetensors library (0.8, Rust ``Dtype``)
# defines it; ``tests/unit/model/test_dtypes.py`` checks this list against the library. U16 is listed as its
# own label; whether U16 means bf16 bits is decided per checkpoint (Paddle writes bf16 as uint16; see
# ``Checkpoint.bf16_as_u16``).
DTYPES: dict[str, DType] = {
    d.st: d
    for d in (
        DType("F64", "float64", "float64", 64, "float64"),
        DType("F32", "float32", "float32", 32, "float32"),
        DType("F16", "float16", "float16", 16, "float16"),
        DType("BF16", "uint16", "uint16", 16, "bfloat16"),
        DType("U16", "uint16", "uint16", 16, "uint16"),
        DType("I64", "int64", "int64", 64, "int64"),
        DType("I32", "int32", "int32", 32, "int32"),
        DType("I16", "int16", "int16", 16, "int16"),
        DType("I8", "int8", "int8", 8, "int8"),
        DType("U8", "uint8", "uint8", 8, "uint8"),
        DType("U32", "uint32", "uint32", 32, "uint32"),
        DType("U64", "uint64", "uint64", 64, "uint64"),
        DType("BOOL", "bool", "bool", 8, "bool"),
        DType("C64", None, "complex64", 64, "complex64", decodable=False),
        DType("F8_E4M3", None, "uint8", 8, "float8_e4m3fn", decodable=False),
        DType("F8_E5M2", None, "uint8", 8, "float8_e5m2", decodable=False),
        DType("F8_E8M0", None, "uint8", 8, "float8_e8m0fnu", decodable=False),
        DType("F8_E4M3FNUZ", None, "uint8", 8, "float8_e4m3fnuz", decodable=False),
        DType("F8_E5M2FNUZ", None, "uint8", 8, "float8_e5m2fnuz", decodable=False),
        DType("F6_E2M3", None, "uint8", 6, "float6_e2m3fn", decodable=False),
        DType("F6_E3M2", None, "uint8", 6, "float6_e3m2fn", decodable=False),
        DType("F4", None, "uint8", 4, "float4_e2m1fn", decodable=False),
    )
}
FLOAT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
"""The logical dtypes of a float table tietool decodes (an embedding or head it can compare, tie, resize)."""

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


@dataclass(frozen=True, slots=True)  # slots: a header of millions of tensors stays lean
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
    def storage_dtype(self) -> np.dtype[Any]:
        return np.dtype(self.st_dtype.storage).newbyteorder("<")


def pdparams_name(label: str) -> str:
    """The numpy dtype name a ``.pdparams`` stores ``label`` as (a numpy name is itself; ``BF16`` →
    ``uint16``).

    Raises:
        ValueError: a dtype a ``.pdparams`` cannot hold (callers refuse it by name first).
    """
    if label in NP_TO_ST:
        return label
    name = DTYPES[label].np_name
    if name is None:
        raise ValueError(f"a .pdparams cannot hold {label}")
    return name


def describe_dtype(label: str) -> str:
    """``F8_E8M0 (float8_e8m0fnu)``, ``F4 (float4_e2m1fn, 4-bit packed)``: a label as a message names it."""
    d = DTYPES.get(label) or DTYPES.get(NP_TO_ST.get(label, ""))
    if d is None:
        return label
    packed = f", {d.bits}-bit packed" if d.packed else ""
    return f"{d.st} ({d.logical}{packed})" if d.logical.lower() != d.st.lower() or packed else d.st


def dtype_refusal(
    t: TensorInfo, path: Any, doing: str, fix: str | None = None, op: str | None = None
) -> RefusedError:
    """The refusal of an operation (``op``, named first when given) that would ``doing`` (compute with,
    cut, build) tensor ``t`` in a dtype tietool only copies as bytes (:attr:`DType.decodable` False; a
    packed dtype cannot even be read as an array). Never a claim that the file is damaged: it is valid,
    tietool does not compute in that dtype."""
    return RefusedError(
        f"{op + ' refused: ' if op else ''}{t.name} is stored as {describe_dtype(t.dtype)}, a dtype "
        f"tietool copies byte for byte but cannot {doing} (no numpy dtype holds its values)",
        path,
        fix
        or "keep this tensor out of the operation, or run it on the checkpoint in a float dtype (BF16, F16, "
        "F32) and convert or quantize the output again",
    )


def require_array(t: TensorInfo, path: Any) -> None:
    """Raise :func:`dtype_refusal` when ``t`` cannot be read as an array of its shape: a packed sub-byte
    dtype (``F4``, ``F6_*``) has no element a numpy array could hold."""
    if t.st_dtype.packed:
        raise dtype_refusal(t, path, "read it as an array")


def bf16_bits_to_f32(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """bfloat16 bit patterns (``uint16``, any shape) → ``float32`` by a 16-bit shift; exact."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``float32`` → bfloat16 bit patterns (``uint16``), rounding to nearest even, NaN kept NaN.

    Same rounding as paddle's and PyTorch's ``float32 → bfloat16`` cast.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    # in uint32, in place: u + 0x7FFF + 1 fits for every non-NaN pattern (at most 0xFF800000, -inf); a NaN's
    # sum may wrap, and is replaced below (equal to the uint64 sum on all 2**32 patterns, checked once)
    t = (u >> 16) & np.uint32(1)
    t += u
    t += np.uint32(0x7FFF)
    t >>= 16
    rounded = t.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return rounded


MMAP_MIN_BYTES = 64 << 20


def map_array(
    path: Any, offset: int, nbytes: int, dtype: np.dtype[Any], shape: tuple[int, ...], fortran: bool = False
) -> np.memmap[Any, Any] | None:
    """A read-only memory map of ``nbytes`` at ``offset`` as an array, for tensors of at least
    ``MMAP_MIN_BYTES`` (None below that: callers read small tensors into memory). Pages come from the page
    cache on demand, so comparing or copying a multi-GB embedding never holds a second copy in memory."""
    if nbytes < MMAP_MIN_BYTES or not isinstance(path, str | os.PathLike) or hasattr(path, "fs"):
        return None  # small, or a remote file (a UPath: no memory map over the network)
    return np.memmap(
        path, dtype=dtype, mode="r", offset=offset, shape=tuple(shape), order="F" if fortran else "C"
    )
