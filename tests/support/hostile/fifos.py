"""Special files where tietool expects a regular file (issue 18, item 7): a FIFO or ``/dev/zero`` must be
refused by name (exit 3), never block or read until memory runs out."""

from __future__ import annotations

import os
from pathlib import Path

from support import adversarial_support as av
from support.hostile import Hostile


def _fifo_for(rel: str):
    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
        p = ckpt / rel
        if p.exists():
            p.unlink()
        os.mkfifo(p)
        return ckpt

    return build


CASES = [Hostile(f"fifo-{rel}", "fifo", _fifo_for(rel), 3, names=(rel,)) for rel in ("config.json",)]
