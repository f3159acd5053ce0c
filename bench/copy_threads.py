#!/usr/bin/env python3
"""How many threads should copy the untouched shards? (the ``COPY_THREADS`` of ``surgery/write/writer.py``)

Copies every file of a checkpoint folder into ``bench/_work/out_copy`` with tietool's own ``copy_file``
(``os.copy_file_range`` + fsync) from a pool of 1, 2, 4 and 8 threads, and with ``cp -r`` and ``cp -r`` +
``sync FILE...`` as the baselines, alternating, in one run. Before every timed copy: the previous copy
deleted, ``sync``, the input read once (warm), writeback left to drain (as ``run.py`` does). Prints the
median wall time of each and its ratio to ``cp -r``.

    PYTHONPATH=. python bench/copy_threads.py bench/_work/ckpt_60l -n 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from run import settle, warm  # noqa: E402

from surgery.write.writer import copy_file  # noqa: E402


def copy_pool(src: Path, dst: Path, threads: int) -> None:
    dst.mkdir()
    files = sorted(p for p in src.iterdir() if p.is_file())
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda p: copy_file(p, dst / p.name), files))


def copy_pieces(src: Path, dst: Path, threads: int, piece: int = 256 << 20) -> None:
    """The alternative: every file cut into ``piece``-byte ranges, the ranges copied by the pool at their
    own offsets (``copy_file_range`` with both offsets), each file fsynced when its ranges are done."""
    dst.mkdir()
    files = sorted(p for p in src.iterdir() if p.is_file())
    jobs = []
    for p in files:
        n = p.stat().st_size
        with open(dst / p.name, "wb") as f:
            f.truncate(n)
        jobs += [(p, o, min(piece, n - o)) for o in range(0, n, piece)] or [(p, 0, 0)]

    def one(job):
        p, off, n = job
        with open(p, "rb") as fs, open(dst / p.name, "r+b") as fd:
            end = off + n
            while off < end:
                off += os.copy_file_range(fs.fileno(), fd.fileno(), end - off, off, off)

    def fsync(p):
        with open(dst / p.name, "r+b") as fd:
            os.fsync(fd.fileno())

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, jobs))
        list(ex.map(fsync, files))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("-n", type=int, default=5, help="rounds (median reported)")
    a = ap.parse_args()
    out = BENCH / "_work" / "out_copy"
    files = sorted(p.name for p in a.ckpt.iterdir() if p.is_file())
    cases = {
        "cp -r": lambda: subprocess.run(["cp", "-r", str(a.ckpt), str(out)], check=True),
        "cp -r + fsync": lambda: subprocess.run(
            ["sh", "-c", 'cp -r "$0" "$1" && sync "$1"/*', str(a.ckpt), str(out)], check=True
        ),
        **{f"copy_file x {n} threads": (lambda n=n: copy_pool(a.ckpt, out, n)) for n in (1, 2, 4, 8)},
        **{f"256 MiB pieces x {n} threads": (lambda n=n: copy_pieces(a.ckpt, out, n)) for n in (4, 8)},
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    labels = list(cases)
    for rep in range(a.n):
        order = labels[rep % len(labels) :] + labels[: rep % len(labels)]
        for label in order:
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            warm([a.ckpt])
            settle()
            t0 = time.perf_counter()
            cases[label]()
            times[label].append(time.perf_counter() - t0)
            assert sorted(p.name for p in out.iterdir()) == files
            print(f"  round {rep + 1}: {label:24s} {times[label][-1]:6.2f} s", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    base = statistics.median(times["cp -r"])
    size = sum((a.ckpt / f).stat().st_size for f in files)
    print(f"\n{a.ckpt} ({size / 1e9:.2f} GB, {len(files)} files), medians of {a.n}:\n")
    print("| copy | median s | min–max s | / cp -r |\n|---|---|---|---|")
    for label, xs in times.items():
        m = statistics.median(xs)
        print(f"| {label} | {m:.2f} | {min(xs):.2f}–{max(xs):.2f} | {m / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
