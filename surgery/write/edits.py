"""File edits (config.json, tokenizer files): written whole, fsynced, and read back byte for byte before
the output is published (:func:`surgery.io.readback.check_bytes`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..io.readback import check_bytes
from .publish import JSON_STYLE


def write_edited(tmp: Path, rel: str, data: bytes, like: Path | None) -> None:
    """Write the file edit ``data`` as ``tmp / rel`` (fsynced; the mode of ``like``, the file it replaces,
    when there is one) and read it back byte for byte.

    Raises:
        OSError: the write fails. OutputError: the file does not hold ``data``.
    """
    dst = tmp / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(dst, data)
    if like is not None and like.is_file():
        shutil.copymode(like, dst)
    check_bytes(dst, data)


def json_bytes(data: Any) -> bytes:
    """``data`` as tietool writes a JSON file (:data:`surgery.write.publish.JSON_STYLE`, then a newline), as
    :func:`surgery.write.publish.write_json` writes it."""
    return (json.dumps(data, **JSON_STYLE) + "\n").encode("utf-8")


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` as the new file ``path``, fsynced (the writer of every file edit).

    Raises:
        OSError: the write fails.
    """
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
