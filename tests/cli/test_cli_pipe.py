"""``tietool … | head``: a reader that goes away is not an error (exit 0, nothing on stderr), in both the
table and the JSON output (rich's own handler exited 1; a JSON print raised an internal error, exit 70)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import paths

CKPT = paths.CASES_DIR / "pf_llama_untied_sharded"


@pytest.mark.parametrize("args", [["inspect"], ["inspect", "--json"], ["inspect", "--no-values"]])
def test_closed_pipe_ends_quietly(args):
    p = subprocess.Popen(
        [sys.executable, "-m", "tietool", *args, str(CKPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # before the first write: every write of the command meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert err == ""
