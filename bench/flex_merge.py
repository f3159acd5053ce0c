"""Time and peak RSS of ``tietool merge`` of a flex checkpoint, beside ``cp -r`` of it in the same run
(issue 21: goal ≤ 1.5 × ``cp -r``, peak RSS ≤ 2 × the largest tensor + 150 MB).

The input is a flex checkpoint folder (``checkpoint-N/`` with ``model_state/``, or a folder of
``*.distcp`` + ``*.metadata``), e.g. the 4-rank one ``make_flex.py`` writes of a benchmark model. Per
round, alternating (the order rotated by one each round): ``cp -r`` of the folder, ``cp -r`` + ``sync``
(the merge fsyncs what it writes), ``tietool merge``. Before every timed run, as in ``run.py``: earlier
outputs deleted, ``sync``, the input read once (warm) and the kernel's Dirty + Writeback drained below
64 MB, all untimed. Each run is one child process (:func:`convert_memory.run_child`: wall time) under
``/usr/bin/time -f %M``: its "maximum resident set size" is the peak RSS (``os.wait4``'s ``ru_maxrss``
is not: Linux keeps the forked bench process's RSS from before the ``exec`` in it, 56-184 MB here).
The largest tensor is read from the ``.metadata``.

``--source CKPT`` (the safetensors folder the flex checkpoint was written from): the first merge's output
is compared with it tensor by tensor (names, dtype labels, shapes, raw bytes) before it is deleted.
``--work DIR`` (default ``bench/_work``): where the outputs go (same file system as the input).
``--before DIR``: a fourth case, ``merge_before``, the same merge with ``PYTHONPATH=DIR`` (a folder holding
another ``tietool``, e.g. ``git archive`` of the commit before a change), alternating with the others in the
same run; with ``--source`` its first output is compared too.

usage: PYTHONPATH=. python bench/flex_merge.py CKPT [-n ROUNDS] [--source CKPT] [--work DIR] [--json OUT]
       [--before DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from convert_memory import WORK, run_child  # noqa: E402
from run import settle, warm  # noqa: E402

from tietool.surgery.io import flex  # noqa: E402

MB = 1 << 20


def st_index(folder: Path) -> dict[str, tuple[Path, int, int, str, list[int]]]:
    """name -> (file, data offset, length, dtype label, shape) of every tensor of the folder's safetensors."""
    out: dict[str, tuple[Path, int, int, str, list[int]]] = {}
    for p in sorted(folder.glob("*.safetensors")):
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, h in header.items():
            if name != "__metadata__":
                a, b = h["data_offsets"]
                out[name] = (p, 8 + n + a, b - a, h["dtype"], h["shape"])
    return out


def digest(path: Path, offset: int, length: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        f.seek(offset)
        while length:
            b = f.read(min(length, 64 * MB))
            if not b:
                raise SystemExit(f"{path}: truncated")
            h.update(b)
            length -= len(b)
    return h.hexdigest()


def compare(source: Path, merged: Path) -> dict:
    """Every tensor of ``source`` in ``merged`` with the same dtype label, shape and bytes (and no other)."""
    a, b = st_index(source), st_index(merged)
    bad = sorted(set(a) ^ set(b))
    for name in sorted(set(a) & set(b)):
        pa, oa, la, da, sa = a[name]
        pb, ob, lb, db, sb = b[name]
        if (da, sa, la) != (db, sb, lb) or digest(pa, oa, la) != digest(pb, ob, lb):
            bad.append(name)
    return {"tensors": len(a), "equal": len(a) - len(bad), "differ": bad}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--source", type=Path, help="the safetensors folder the flex checkpoint came from")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--before", type=Path, help="a folder holding another tietool: case merge_before")
    a = ap.parse_args()
    a.ckpt, a.work = a.ckpt.resolve(), a.work.resolve()
    folder = flex.find(a.ckpt)
    if folder is None:
        raise SystemExit(f"{a.ckpt} is not a flex checkpoint")
    ck = flex.open_flex(folder)
    largest = max(ck.tensors.values(), key=lambda t: t.nbytes)
    budget = 2 * largest.nbytes + 150 * MB
    a.work.mkdir(parents=True, exist_ok=True)
    out, copy = a.work / "flex_merged", a.work / "flex_copy"
    cases = {
        "cp": ["cp", "-r", str(a.ckpt), str(copy)],
        "cp_sync": ["sh", "-c", f"cp -r '{a.ckpt}' '{copy}' && sync"],
        "merge": [sys.executable, "-m", "tietool", "merge", str(a.ckpt), "--out", str(out), "--quiet"],
    }
    if a.before:
        cases["merge_before"] = ["env", f"PYTHONPATH={a.before.resolve()}", *cases["merge"]]
    names, runs, checks = list(cases), {k: [] for k in cases}, {}
    for r in range(a.n):
        rot = r % len(names)
        for k in names[rot:] + names[:rot]:
            for p in (out, copy):
                shutil.rmtree(p, ignore_errors=True)
            warm([a.ckpt])
            settle()
            peak = a.work / "maxrss.txt"
            runs[k].append(run_child(["/usr/bin/time", "-f", "%M", "-o", str(peak), *cases[k]]))
            runs[k][-1]["maxrss"] = int(peak.read_text().split()[-1]) * 1024
            for x in ("RssAnon", "RssFile"):  # sampled of /usr/bin/time, not of the command
                runs[k][-1].pop(x, None)
            if k.startswith("merge") and a.source and k not in checks:
                checks[k] = compare(a.source, out)
            print(k, f"{runs[k][-1]['seconds']:.2f} s", f"{runs[k][-1]['maxrss'] / MB:.0f} MB", flush=True)
    for p in (out, copy):
        shutil.rmtree(p, ignore_errors=True)
    med = {
        k: {m: statistics.median(x.get(m, 0) for x in v) for m in ("seconds", "maxrss")}
        for k, v in runs.items()
    }
    res = {
        "input": str(a.ckpt),
        "input_bytes": sum(p.stat().st_size for p in a.ckpt.rglob("*") if p.is_file()),
        "ranks": len(ck.ranks),
        "tensors": len(ck.tensors),
        "largest": [largest.name, largest.nbytes],
        "runs": runs,
        "median": med,
        "time_ratio_cp": med["merge"]["seconds"] / med["cp"]["seconds"],
        "time_ratio_cp_sync": med["merge"]["seconds"] / med["cp_sync"]["seconds"],
        "time_goal_met": med["merge"]["seconds"] <= 1.5 * med["cp"]["seconds"],
        "rss_budget": budget,
        "rss_ratio": med["merge"]["maxrss"] / budget,
        "rss_goal_met": med["merge"]["maxrss"] <= budget,
        "bit_for_bit": checks.get("merge"),
    }
    if a.before:
        res["bit_for_bit_before"] = checks.get("merge_before")
        res["time_ratio_cp_before"] = med["merge_before"]["seconds"] / med["cp"]["seconds"]
        res["after_over_before"] = med["merge"]["seconds"] / med["merge_before"]["seconds"]
    text = json.dumps(res, indent=1)
    if a.json:
        a.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
