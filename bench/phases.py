#!/usr/bin/env python3
"""Where tietool's time and memory go, phase by phase, for one operation (attributes harness figures).

    python bench/phases.py tie|untie|resize|inspect CKPT [--out DIR] [--init mean]
    TIETOOL_ROOT=DIR python bench/phases.py ...   # another tree (a folder with the package)

Runs the same library calls the CLI makes (``Checkpoint.open`` → ``detect`` → ``plan_*`` → ``write.execute``)
in this process, with timers wrapped around them at run time (no source is changed): the value comparison
(``compare.compare``), making new tensors (the writer's ``_NewData.source`` per tensor; ``OutTensor.make`` in
trees before recipes), kernel copies of untouched shards (``shutil.copyfile``), byte-range copies inside
rewritten shards (``safetensors_io.copy_range``), writing rewritten shards (``safetensors_io.write_file``,
minus the range copies), and ``os.fsync``. A sampler thread reads ``/proc/self/status`` every 5 ms for the
peak RssAnon (heap, numpy arrays) and RssFile (mapped file pages, e.g. memory-mapped tensors). Times of nested
wrappers overlap (``write_file`` contains its fsync and range copies); the "self" column of write_file
excludes them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the tietool tree: $TIETOOL_ROOT (e.g. bench/_work/snapshot) or the project root
sys.path.insert(0, os.environ.get("TIETOOL_ROOT", str(ROOT)))

T: dict[str, float] = defaultdict(float)
N: dict[str, int] = defaultdict(int)
PEAK = {"anon": 0, "file": 0, "rss": 0}
PHASE_PEAK: dict[str, dict] = {}
_stop = False
_IN_WRITE = [False]


def status() -> dict:
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                d[k] = int(v.split()[0]) * 1024
    return d


def sampler():
    while not _stop:
        s = status()
        PEAK["anon"] = max(PEAK["anon"], s.get("RssAnon", 0))
        PEAK["file"] = max(PEAK["file"], s.get("RssFile", 0))
        PEAK["rss"] = max(PEAK["rss"], s.get("VmRSS", 0))
        time.sleep(0.005)


def timed(name, fn):
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[name] += time.perf_counter() - t0
            N[name] += 1

    return w


def phase(name, fn, *a, **k):
    for key in PEAK:
        PEAK[key] = 0
    t0 = time.perf_counter()
    r = fn(*a, **k)
    time.sleep(0.01)
    T["phase: " + name] = time.perf_counter() - t0
    PHASE_PEAK[name] = dict(PEAK)
    return r


def main() -> int:
    global _stop
    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=["inspect", "tie", "untie", "resize"])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "_work" / "phases_out")
    ap.add_argument("--vocab", type=int, default=128512)
    ap.add_argument("--init", default="zeros")
    a = ap.parse_args()
    t_start = time.perf_counter()
    import numpy  # noqa: F401

    from tietool.surgery.inspect import detect as detect_mod
    from tietool.surgery.inspect import finders as finders_mod
    from tietool.surgery.io import safetensors_io
    from tietool.surgery.io.checkpoint import Checkpoint
    from tietool.surgery.plan import plan as plan_mod
    from tietool.surgery.plan.resize import plan_resize
    from tietool.surgery.plan.tie import plan_tie
    from tietool.surgery.plan.untie import plan_untie
    from tietool.surgery.write import writer as write_mod

    T["import surgery"] = time.perf_counter() - t_start
    detect_mod.compare = finders_mod.compare = timed("detect.compare (value comparison)", detect_mod.compare)
    shutil.copyfile = timed("shutil.copyfile (untouched shards)", shutil.copyfile)
    safetensors_io.copy_range = timed(
        "copy_range (unchanged tensors in rewritten shards)", safetensors_io.copy_range
    )
    safetensors_io.write_file = timed(
        "safetensors_io.write_file (rewritten shards, total)", safetensors_io.write_file
    )
    real_fsync = os.fsync

    def fsync(fd):
        t0 = time.perf_counter()
        try:
            return real_fsync(fd)
        finally:
            dt = time.perf_counter() - t0
            where = "in write_file" if _IN_WRITE[0] else "json/dirs"
            T[f"os.fsync ({where})"] += dt
            N[f"os.fsync ({where})"] += 1

    os.fsync = fsync
    wf = safetensors_io.write_file

    def write_file(*a, **k):
        _IN_WRITE[0] = True
        try:
            return wf(*a, **k)
        finally:
            _IN_WRITE[0] = False

    safetensors_io.write_file = write_file
    threading.Thread(target=sampler, daemon=True).start()

    ck = phase("Checkpoint.open", Checkpoint.open, a.ckpt)
    det = phase("detect", detect_mod.detect, ck, compare_values=True)
    if a.op == "inspect":
        from tietool.surgery.inspect.summary import summarize

        phase("summarize", summarize, det)
    else:
        if a.op == "tie":
            plan = phase("plan", plan_tie, det)
        elif a.op == "untie":
            plan = phase("plan", plan_untie, det)
        else:
            plan = phase("plan", plan_resize, det, a.vocab, None, a.init, 0)
        if "make" in plan_mod.OutTensor.__dataclass_fields__:  # older trees: data by closures
            for nt in list(plan.replace.values()) + list(plan.add):
                nt.make = timed(f"OutTensor.make ({nt.name})", nt.make)
        else:  # recipes, made (once per recipe) by the writer's memo
            src = write_mod._NewData.source
            write_mod._NewData.source = lambda self, nt: timed(f"new tensor data ({nt.name})", src)(self, nt)
        if a.out.exists():
            shutil.rmtree(a.out)
        phase("write.execute", write_mod.execute, plan, a.out)
        out_bytes = sum(p.stat().st_size for p in a.out.iterdir())
        shutil.rmtree(a.out)
        print(f"output {out_bytes / 1e9:.3f} GB")
    _stop = True
    total = time.perf_counter() - t_start
    w = "safetensors_io.write_file (rewritten shards, total)"
    if w in T:
        T["  write_file self: header + new arrays (.tobytes() + write), excl. range copies and fsync"] = (
            T[w]
            - T.get("copy_range (unchanged tensors in rewritten shards)", 0)
            - T.get("os.fsync (in write_file)", 0)
        )
    rows = sorted(T.items(), key=lambda kv: (not kv[0].startswith("phase"), -kv[1]))
    print(f"{a.op} {a.ckpt.name}: total in-process {total:.2f} s")
    for k, v in rows:
        print(f"  {v:8.3f} s  {('x' + str(N[k])) if N.get(k) else '':>4}  {k}")
    for k, p in PHASE_PEAK.items():
        print(
            f"  peak during {k:16s} RSS {p['rss'] / 1e6:7.0f} MB  (anon {p['anon'] / 1e6:6.0f} MB, "
            f"file-backed {p['file'] / 1e6:6.0f} MB)"
        )
    print(json.dumps({"op": a.op, "ckpt": str(a.ckpt), "total": total, "times": T, "peaks": PHASE_PEAK}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
