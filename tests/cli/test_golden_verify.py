"""The golden harness's promise check on a representative subset: every write of ``bench/golden.py``
(``capture --only INPUT``) that succeeds is followed by ``verify IN OUT`` exiting 0 (``golden.py
verified``). Inputs: a PaddleNLP checkpoint (convert across conventions, tie, untie, resize, in place),
tensor-parallel rank files (merge), a Trainer flex case (``resize`` / ``add-tokens --keep-training-state``,
merge of a flex checkpoint), a case with its own command lines (chains through ``{prev_out}``).

The full harness (every input, about 13,000 runs) is run by hand: ``python bench/golden.py capture DIR &&
python bench/golden.py verified DIR`` (bench/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import paths

import tietool

REPO = paths.REPO
GOLDEN = REPO / "bench" / "golden.py"
SUBSET = [
    "fixture:pnlp_llama_untied_bf16",
    "tp:llama_fp32/tp2pp2",
    "case:e03_flex_tied_model_resize_keep_training_state",
    "case:b01_gpt2_head_aliases_embedding",
]


def _golden(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(tietool.__file__).parent.parent), env.get("PYTHONPATH")])
    )
    return subprocess.run(
        [sys.executable, str(GOLDEN), *args], capture_output=True, text=True, env=env, timeout=900
    )


@pytest.mark.slow
@pytest.mark.parametrize("only", SUBSET)
def test_every_write_of_the_harness_verifies(tmp_path: Path, only: str) -> None:
    cap = _golden("capture", str(tmp_path / "cap"), "--only", only)
    assert cap.returncode == 0, cap.stderr[-3000:]
    runs = json.loads((tmp_path / "cap" / "manifest.json").read_text())["runs"]
    verified = [r for r in runs.values() if r.get("of") and runs[r["of"]]["exit"] == 0]
    # the check has work: rank files take only merge (3 writes, 4 verify runs); the other inputs many more
    assert len(verified) >= 4, f"{only}: only {len(verified)} successful writes"
    v = _golden("verified", str(tmp_path / "cap"))
    assert v.returncode == 0, v.stdout[-4000:]
    assert v.stderr.startswith("0 of ")
