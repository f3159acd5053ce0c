"""Hostile flex checkpoints (issue 29): a ``.metadata`` whose counts, ids and axes are chosen to crash, hang
or exhaust ``inspect`` and ``merge``. Each must be a one-line exit 3 naming the ``.metadata`` and the limit
(or the gap it found), in bounded time and memory.

The folder is a copy of the real paddle-written ``tests/data/flex/ranks2`` (its ``.distcp`` files); the
``.metadata`` is written here by a small opcode emitter of paddle's three records (protocol 4,
``STACK_GLOBAL`` + ``EMPTY_TUPLE NEWOBJ`` + field dict ``BUILD``, as ``tests/data/flex/README.md``
describes paddle's pickle), independent of tietool's own writer. Nothing here imports tietool.

* ``flex-rank-5000-digits``: a slice stored in ``<5,000 digits>_0.distcp`` (int conversion limit: exit 70).
* ``flex-axes-3000``: a flattened slice of a 3,000-axis tensor (RecursionError: exit 70).
* ``flex-sweep-3000``: 3,000 slices open together along rows, disjoint along columns (the sweep compared
  every pair: a hang); a gap, exit 3.
* ``flex-grid12-holes``: 37 one-element slices of a ``4^12`` tensor (a 16.7 M-cell grid of holes: 3.1 GB).
* ``flex-distcp-*``: the real ``1_0.distcp`` with one more entry, a key nested 5,000 deep or a memo bomb
  (``merge`` reads it; ``inspect`` reads only the ``.metadata``).
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import paths
from support.hostile import Hostile

RANKS2 = paths.DATA / "flex" / "ranks2"
MODULE = "paddle.distributed.flex_checkpoint.dcp.metadata"


class _Rec:
    """One record: paddle's class name and its fields in order."""

    def __init__(self, cls: str, **fields: Any) -> None:
        self.cls, self.fields = cls, fields


def _str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b if len(b) < 256 else b"X" + struct.pack("<I", len(b)) + b


def _obj(v: Any) -> bytes:
    if v is None:
        return b"N"
    if v is True or v is False:
        return b"\x88" if v else b"\x89"
    if isinstance(v, int):
        if 0 <= v < 2**31:
            return b"J" + struct.pack("<i", v)
        raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, tuple):
        return b"(" + b"".join(map(_obj, v)) + b"t"
    if isinstance(v, list):
        return b"](" + b"".join(map(_obj, v)) + b"e"
    if isinstance(v, dict):
        return b"}(" + b"".join(_obj(k) + _obj(x) for k, x in v.items()) + b"u"
    if isinstance(v, _Rec):
        head = _str(MODULE) + _str(v.cls) + b"\x93)\x81"
        return head + b"}(" + b"".join(_str(k) + _obj(x) for k, x in v.fields.items()) + b"ub"
    raise TypeError(type(v))


def _metadata(tensors: dict[str, tuple[tuple[int, ...], list[tuple[str, tuple, tuple, Any]]]]) -> bytes:
    """``{key: (global shape, [(file, offset, local shape, flattened range or None)])}`` as a
    ``.metadata``."""
    sdm: dict[str, list[_Rec]] = {}
    stm: dict[_Rec, str] = {}
    for key, (shape, slices) in tensors.items():
        for file, off, local, flat in slices:
            sdm.setdefault(key, []).append(
                _Rec(
                    "LocalTensorMetadata",
                    global_offset=off,
                    local_shape=local,
                    dtype="float32",
                    global_shape=shape,
                    is_flattened=flat is not None,
                    flattened_range=flat,
                )
            )
            index = _Rec(
                "LocalTensorIndex",
                tensor_key=key,
                global_offset=off,
                is_flattened=flat is not None,
                flattened_range=flat,
                replica_id=None,
                local_shape=local,
            )
            stm[index] = file
    top = _Rec(
        "Metadata", state_dict_metadata=sdm, storage_metadata=stm, flat_mapping={k: (k,) for k in tensors}
    )
    return b"\x80\x04" + _obj(top) + b"."


# the real save's tensors (rows.fp32: rows 0:3 in rank 0, 3:6 in rank 1; the others whole in rank 0)
BASE = {
    "rows.fp32": ((6, 4), [("0_0.distcp", (0, 0), (3, 4), None), ("1_0.distcp", (3, 0), (3, 4), None)]),
}


def _with(extra: dict) -> Callable[[Path], Path]:
    def build(dest: Path) -> Path:
        ckpt = dest / "ckpt"
        ckpt.mkdir()
        for p in RANKS2.iterdir():
            if p.suffix == ".distcp":
                shutil.copy2(p, ckpt / p.name)
        (ckpt / "config.json").write_text('{"architectures": []}')
        (ckpt / "0.metadata").write_bytes(_metadata({**BASE, **extra}))
        return ckpt

    return build


def _grid12() -> dict:
    k, sl = 12, []
    for ax in range(k):
        for c in (1, 2, 3):
            off = [0] * k
            off[ax] = c
            sl.append(("0_0.distcp", tuple(off), (1,) * k, None))
    sl.append(("0_0.distcp", (3,) * k, (1,) * k, None))
    return {"g": ((4,) * k, sl)}


def _distcp_with(key: bytes, value: bytes, prelude: bytes = b"") -> Callable[[Path], Path]:
    """The real ranks2 save with one more top-level entry in ``1_0.distcp`` (its one FRAME's length
    corrected): ``prelude`` (memoized parts, popped), then key and value."""

    def build(dest: Path) -> Path:
        ckpt = _with({})(dest)
        raw = (RANKS2 / "1_0.distcp").read_bytes()
        assert raw[2:3] == b"\x95" and raw.endswith(b"u."), "expected one FRAME and a dict closed by SETITEMS"
        body = raw[11:-1] + prelude + b"(" + key + value + b"u."
        (ckpt / "1_0.distcp").write_bytes(raw[:3] + struct.pack("<Q", len(body)) + body)
        (ckpt / "0.metadata").write_bytes((RANKS2 / "0.metadata").read_bytes())
        return ckpt

    return build


def _memo_bomb(levels: int) -> tuple[bytes, bytes]:
    """t0 = (); t(i) = (t(i-1), t(i-1)): 2**levels elements counted at every reference."""
    put = lambda i: b"r" + struct.pack("<I", 1_000_000 + i)  # noqa: E731
    get = lambda i: b"j" + struct.pack("<I", 1_000_000 + i)  # noqa: E731
    pre = b")" + put(0) + b"0"
    for i in range(1, levels + 1):
        pre += get(i - 1) + get(i - 1) + b"\x86" + put(i) + b"0"
    return pre, get(levels)


N = 3000
CASES = [
    Hostile(
        "flex-distcp-deep-key",
        "flex-distcp",
        _distcp_with(b")" + b"\x85" * 5000, b"K\x01"),
        3,
        commands=("merge",),
        names=("1_0.distcp",),
    ),
    Hostile(
        "flex-distcp-memo-bomb",
        "flex-distcp",
        _distcp_with(_str("bomb"), _memo_bomb(60)[1], _memo_bomb(60)[0]),
        3,
        commands=("merge",),
        names=("1_0.distcp",),
    ),
    Hostile(
        "flex-rank-5000-digits",
        "flex-metadata",
        _with({"far": ((2, 2), [("1" * 5000 + "_0.distcp", (0, 0), (2, 2), None)])}),
        3,
        commands=("inspect", "merge"),
        names=("0.metadata", "5,000 digits", "1,048,576 ranks"),
    ),
    Hostile(
        "flex-axes-3000",
        "flex-metadata",
        _with({"deep": ((2,) * N, [("0_0.distcp", (0,) * N, (2,) * N, (1, 3))])}),
        3,
        commands=("inspect", "merge"),
        names=("0.metadata", "3,000 axes"),
    ),
    Hostile(
        "flex-sweep-3000",
        "flex-metadata",
        _with({"q": ((N, N), [("0_0.distcp", (i, i), (N - i, 1), None) for i in range(N)])}),
        3,
        commands=("inspect", "merge"),
        names=("'q'",),  # inspect: the gap at element [0, 1]; merge: 'q' not in the rank file
    ),
    Hostile(
        "flex-grid12-holes",
        "flex-metadata",
        _with(_grid12()),
        3,
        commands=("inspect", "merge"),
        names=("'g'",),  # inspect: the gap of 4^12 - 37 elements; merge: 'g' not in the rank file
    ),
]
