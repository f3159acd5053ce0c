#!/usr/bin/env python3
"""The ``.pdparams`` opcode walker's speed (issue 18: its limits must not make it more than a few % slower).

    PYTHONPATH=<pkg dir holding tietool> python bench/pdparams_walk.py [-n 7] [--baseline-commit REV]

Walks (``pdparams.walk``) every real ``.pdparams`` under ``tests/data`` (PaddleNLP / PaddleFormers /
paddle.save files, ~120, 3-130 KB) and one synthetic file of 20,000 small tensors written by tietool's own
writer (the layout ``paddle.save`` uses), several rounds, alternating, medians. Each figure is given as a
ratio to a baseline measured in the same run: ``pickletools.genops`` over the same bytes (a pure-Python
opcode decoder, so the ratio does not move with the machine's speed), and, with ``--baseline-commit``, the
walker of that commit (extracted with ``git archive`` into a temporary folder and imported as its own
package), so before/after is one run on one machine.
"""

from __future__ import annotations

import argparse
import importlib
import io
import pickletools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _files() -> list[Path]:
    return sorted(p for p in (ROOT / "tests" / "data").rglob("*.pdparams") if p.is_file())


def _synthetic(dest: Path, pdparams, n: int = 20_000) -> Path:
    import numpy as np

    from tietool.surgery.io.safetensors_io import Source

    rows = []
    for i in range(n):
        a = np.full((4, 8) if i % 2 else (16,), i % 7, dtype=np.float32)
        rows.append((f"llama.layers.{i}.weight", "float32", a.shape, Source(array=a), None, False))
    p = dest / "many.pdparams"
    names = {r[0]: f"w_{i}" for i, r in enumerate(rows)}
    pdparams.write_file(p, rows, {"StructuredToParameterName@@": names})
    return p


def _time(fn, files: list[Path]) -> float:
    t0 = time.perf_counter()
    for p in files:
        fn(p)
    return time.perf_counter() - t0


def _genops(p: Path) -> None:
    for _ in pickletools.genops(io.BytesIO(p.read_bytes())):
        pass


def _baseline(commit: str, tmp: Path):
    dst = tmp / "base"
    dst.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=tar, check=True)
    (tmp / "tietool_base").symlink_to(dst)
    sys.path.insert(0, str(tmp))
    try:
        return importlib.import_module("tietool_base.surgery.io.pdparams")
    except ModuleNotFoundError:  # commits before the walker became the io/pdparams package
        return importlib.import_module("tietool_base.surgery.io.pdparams_io")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=7, help="rounds (medians)")
    ap.add_argument("--baseline-commit", help="also time the walker of this commit")
    a = ap.parse_args()
    from tietool.surgery.io import pdparams

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        sets = {"real fixtures": _files(), "20k tensors": [_synthetic(tmp, pdparams)]}
        walkers = {"walker": lambda p: pdparams.walk(p), "genops": _genops}
        if a.baseline_commit:
            base = _baseline(a.baseline_commit, tmp)
            walkers["walker@" + a.baseline_commit] = lambda p: base.walk(p)
        for name, files in sets.items():
            times: dict[str, list[float]] = {k: [] for k in walkers}
            for r in range(a.n + 1):  # round 0 warms the page cache and the imports
                order = list(walkers)[r % len(walkers) :] + list(walkers)[: r % len(walkers)]
                for k in order:
                    dt = _time(walkers[k], files)
                    if r:
                        times[k].append(dt)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{name} ({len(files)} files, {sum(p.stat().st_size for p in files) / 1e6:.2f} MB):")
            for k, v in med.items():
                print(f"  {k:28s} {v * 1e3:8.1f} ms   / genops {v / med['genops']:.3f}", end="")
                if a.baseline_commit:
                    print(f"   / old walker {v / med['walker@' + a.baseline_commit]:.3f}", end="")
                print()


if __name__ == "__main__":
    main()
