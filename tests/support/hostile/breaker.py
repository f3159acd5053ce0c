"""New instances of the hostile kinds, from the breaker rerun of issue 18's campaign (other files, other
positions, other combinations than ``reads``, ``st``, ``pickle`` and ``folders`` hold). Each held in the
campaign (exit 3, one line naming the file); they stay here so that a regression in the general mechanism
is seen on an instance the other modules do not build.

Kinds: ``special`` (a FIFO, socket, ``/dev/zero`` or ``/dev/null`` link at files and depths the other
modules do not use), ``json`` (a negative 5,000-digit integer in the index, ``NaN`` inside a list, a
byte-order mark; a generation_config.json nested 2,000 deep inside an object is read for token ids only
and carried: exit 0, verify 3), ``safetensors`` (a header shorter than its 8-byte length, data one byte
short, ``data_offsets`` of three numbers or of strings).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

from support import adversarial_support as av
from support.hostile import Hostile
from support.hostile.reads import _fifo, _link, _put, _socket, _text


def _shard_edit(fn: Callable[[dict, bytes], bytes]) -> Callable[[Path], Path]:
    """A build that rewrites the one safetensors shard of the base checkpoint as ``fn(header, data)``."""

    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
        p = ckpt / av.ST_ONE_FILE
        blob = p.read_bytes()
        n = struct.unpack("<Q", blob[:8])[0]
        p.write_bytes(fn(json.loads(blob[8 : 8 + n]), blob[8 + n :]))
        return ckpt

    return build


def _st(header: dict, data: bytes) -> bytes:
    b = json.dumps(header).encode()
    return struct.pack("<Q", len(b)) + b + data


def _offsets(value: object) -> Callable[[dict, bytes], bytes]:
    def fn(h: dict, data: bytes) -> bytes:
        h["model.embed_tokens.weight"]["data_offsets"] = value
        return _st(h, data)

    return fn


EMB_RANGE = ["0", "6400"]

CASES: list[Hostile] = [
    Hostile("brk-fifo-deep-template", "special", _put("s/d/chat_template.jinja", _fifo), 3, names=("FIFO",)),
    Hostile("brk-socket-added-tokens", "special", _put("added_tokens.json", _socket), 3, names=("socket",)),
    Hostile("brk-devzero-sub-json", "special", _put("sub/tokenizer_config.json", _link("/dev/zero")), 3),
    Hostile("brk-devzero-model-config", "special", _put("model_config.json", _link("/dev/zero")), 3),
    Hostile("brk-devnull-config", "special", _put("config.json", _link("/dev/null")), 3, names=("device",)),
    Hostile(
        "brk-json-deep-array-in-generation-config",
        "json",
        _put("generation_config.json", _text('{"x":' + "[" * 2000 + "]" * 2000 + "}")),
        {"verify": 3, "*": 0},  # read for token ids only, carried unchanged (as reads' json-* cases)
    ),
    Hostile(
        "brk-json-negative-bigint",
        "json",
        _put(av.ST_INDEX, _text('{"metadata": {"total_size": -' + "9" * 5000 + "}}")),
        3,
        names=(av.ST_INDEX,),
    ),
    Hostile("brk-json-nan-in-list", "json", _put("config.json", _text('{"a": {"b": [NaN]}}')), 3),
    Hostile("brk-json-bom", "json", _put("config.json", _text("\ufeff{}")), 3, names=("config.json",)),
    Hostile("brk-st-header-cut", "safetensors", _shard_edit(lambda h, d: b"\x07\x00\x00"), 3),
    Hostile("brk-st-data-short", "safetensors", _shard_edit(lambda h, d: _st(h, d[:-1])), 3),
    Hostile("brk-st-offsets-three", "safetensors", _shard_edit(_offsets([0, 4, 8])), 3),
    Hostile("brk-st-offsets-strings", "safetensors", _shard_edit(_offsets(EMB_RANGE)), 3),
]
