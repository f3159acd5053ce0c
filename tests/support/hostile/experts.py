"""Hostile expert-parallel rank files (issue 29): ``merge`` of the d06 case's two ``moe_sharding`` files
(a Qwen3-MoE of 4 experts, expert parallelism 2) with one expert id or the config's expert count chosen to
overflow. Each must be a one-line refusal: an id of thousands of digits exit 3 naming the rank file, an id
or a count of 2^64 exit 5 naming it (OverflowError or ValueError, exit 70, before).

The rank file is edited at the opcode level: the tensor names of expert 3 (``SHORT_BINUNICODE`` strings,
wherever the pickle names them) renamed, the single ``FRAME``'s length corrected. Nothing here imports
tietool.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from support import paths
from support.hostile import Hostile

D06 = paths.BUG_CASES_DIR / "d06_expert_parallel_rank_files" / "ckpt"
RANK1 = "model_state.moe_sharding01.pdparams"


def _str(b: bytes) -> bytes:
    return b"\x8c" + bytes([len(b)]) + b if len(b) < 256 else b"X" + struct.pack("<I", len(b)) + b


def _renamed(raw: bytes, new_id: str) -> bytes:
    """``raw`` with every name of expert 3 renamed to expert ``new_id`` (the file is one FRAME)."""
    assert raw[2:3] == b"\x95" and struct.unpack("<Q", raw[3:11])[0] == len(raw) - 11, "expected one FRAME"

    def sub(m: re.Match) -> bytes:
        name = m.group(2)
        assert m.group(1)[0] == len(name)
        return _str(name.replace(b".experts.3.", f".experts.{new_id}.".encode()))

    body = re.sub(rb"\x8c(.)([\w.]*\.experts\.3\.[\w.]*)", sub, raw[11:], flags=re.S)
    assert body != raw[11:]
    return raw[:3] + struct.pack("<Q", len(body)) + body


def _with_id(new_id: str) -> Callable[[Path], Path]:
    def build(dest: Path) -> Path:
        ckpt = dest / "ckpt"
        shutil.copytree(D06, ckpt)
        (ckpt / RANK1).write_bytes(_renamed((ckpt / RANK1).read_bytes(), new_id))
        return ckpt

    return build


def _with_count(count: int) -> Callable[[Path], Path]:
    def build(dest: Path) -> Path:
        ckpt = dest / "ckpt"
        shutil.copytree(D06, ckpt)
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["num_experts"] = count
        (ckpt / "config.json").write_text(json.dumps(cfg))
        return ckpt

    return build


CASES = [
    Hostile(
        "experts-id-2pow64",
        "expert-parallel",
        _with_id(str(2**64)),
        5,  # read, and found beyond the count (never a range of it)
        commands=("merge",),
        names=(f"expert id {2**64} is beyond the count",),
    ),
    Hostile(
        "experts-id-5000-digits",
        "expert-parallel",
        _with_id("9" * 5000),
        3,  # refused where it is parsed (never converted: Python's 4,300-digit limit)
        commands=("merge",),
        names=(RANK1, "5,000 digits"),
    ),
    Hostile(
        "experts-count-2pow64",
        "expert-parallel",
        _with_count(2**64),
        5,  # refused by the numbering, which compares the count and never expands it
        commands=("merge",),
        names=(f"= {2**64}", f"of ids 0..{2**64 - 1}"),
    ),
]
