#!/usr/bin/env python3
"""Time and peak memory of ``tietool diff`` of a checkpoint against a copy of it with one embedding row
changed, against the baseline of the same run: reading both checkpoints once (every file of both folders
read through a 4 MiB buffer by a child Python process, the way tietool reads; ``cat`` into a pipe is
printed beside it as a second reference). The issue's targets: diff ≤ 1.2 × the time of reading both once,
peak RSS ≤ 2 × the largest tensor + 150 MB.

    python bench/make_checkpoints.py --layers 2     # once: bench/_work/ckpt_2l (1.23 GB; 60: 6.46 GB)
    PYTHONPATH=<folder holding a tietool link> python bench/diff.py [-n 5] [--ckpt 2l|60l]

The copy (``bench/_work/ckpt_<L>.diff-copy``, made once, untimed) is a full copy (``cp``, not linked: a
hard link would be compared unread), then row 1234 of ``model.embed_tokens.weight`` gets one bit flipped in
place. Cases, alternating with the order rotated each round, each after ``run.py``'s warm-up (every input
file read once) and writeback settling: ``read both`` (the baseline), ``cat, wc -c`` (reference), ``diff``
(one row changed; must exit 1 and name exactly that row), ``diff itself`` (A against A: every tensor the
same bytes of one file, so nothing is read). Peak RSS from ``/usr/bin/time -v``. Medians and ratios to the
baseline go to ``bench/_work/diff.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from run import MB, WORK, run_child, settle, st_header, warm

PY = sys.executable
ROW = 1234
EMB = "model.embed_tokens.weight"

READ_BOTH = """
import sys, pathlib
buf = bytearray(4 << 20)
for root in sys.argv[1:]:
    for f in sorted(pathlib.Path(root).rglob("*")):
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
"""


def largest_tensor(ckpt: Path) -> int:
    """Bytes of the checkpoint's largest tensor (from its safetensors headers)."""
    out = 0
    for f in ckpt.glob("*.safetensors"):
        for name, t in st_header(f).items():
            if name != "__metadata__":
                out = max(out, t["data_offsets"][1] - t["data_offsets"][0])
    return out


def make_copy(ckpt: Path) -> Path:
    """A full copy of ``ckpt`` with one bit of row :data:`ROW` of the embedding flipped (made once)."""
    dst = WORK / f"{ckpt.name}.diff-copy"
    if dst.exists():
        return dst
    tmp = WORK / f".{dst.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["cp", "-r", "--reflink=never", str(ckpt), str(tmp)], check=True)
    index = json.loads((tmp / "model.safetensors.index.json").read_text())
    f = tmp / index["weight_map"][EMB]
    with open(f, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        head = json.loads(fh.read(n))
    t = head[EMB]
    row_bytes = (t["data_offsets"][1] - t["data_offsets"][0]) // t["shape"][0]
    at = 8 + n + t["data_offsets"][0] + ROW * row_bytes + 1  # the high byte of element 0 (bf16): a value bit
    with open(f, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([b ^ 0x01]))
        fh.flush()
        os.fsync(fh.fileno())
    tmp.rename(dst)
    return dst


def cpu_seconds() -> float | None:
    """User + system seconds of the last child, from ``/usr/bin/time -v``'s report (``run.run_child``): on
    a shared machine the CPU each case spends is steadier than its wall time."""
    try:
        txt = (WORK / "last_time.txt").read_text()
    except OSError:
        return None
    m = (
        re.search(r"User time \(seconds\): ([\d.]+)", txt),
        re.search(r"System time \(seconds\): ([\d.]+)", txt),
    )
    return float(m[0].group(1)) + float(m[1].group(1)) if m[0] and m[1] else None


def check_diff(log: Path) -> str | None:
    """The diff's JSON output names exactly the embedding with row :data:`ROW` changed."""
    try:
        d = json.loads(log.read_text())
    except ValueError as e:
        return f"no JSON: {e}"
    ch = d["tensors"]["changed"]
    if [c["name"] for c in ch] != [EMB] or ch[0]["rows_changed"]["ranges"] != [[ROW, ROW + 1]]:
        return f"unexpected changes: {json.dumps(ch)[:300]}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--repeat", type=int, default=5)
    ap.add_argument("--ckpt", default="2l", choices=["2l", "60l"])
    a = ap.parse_args()
    ckpt = WORK / f"ckpt_{a.ckpt}"
    if not ckpt.exists():
        print(
            f"{ckpt} is missing: run bench/make_checkpoints.py --layers {a.ckpt[:-1]} first", file=sys.stderr
        )
        return 2
    copy = make_copy(ckpt)
    env = dict(os.environ)
    cases = {
        "read both": [PY, "-c", READ_BOTH, str(ckpt), str(copy)],
        "cat, wc -c": ["sh", "-c", f'cat "{ckpt}"/* "{copy}"/* | wc -c'],
        "diff": [PY, "-m", "tietool", "diff", str(ckpt), str(copy), "--json"],
        "diff itself": [PY, "-m", "tietool", "diff", str(ckpt), str(ckpt), "--json"],
    }
    want_rc = {"read both": 0, "cat, wc -c": 0, "diff": 1, "diff itself": 0}
    runs: dict[str, list[dict]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(a.repeat):
        order = names[r % len(names) :] + names[: r % len(names)]
        for case in order:
            warm([ckpt, copy])
            settle()
            res = run_child(cases[case], env=env)
            res["cpu"] = cpu_seconds()
            problem = None if res["rc"] == want_rc[case] else f"exit {res['rc']}"
            if case == "diff" and problem is None:
                problem = check_diff(WORK / "last_child.log")
            res["problem"] = problem
            runs[case].append(res)
            print(
                f"round {r + 1} {case:>12}: {res['wall']:.2f} s wall, {res['cpu']} s cpu, "
                f"{res['rss'] / MB:.0f} MB {problem or ''}",
                flush=True,
            )
    base = statistics.median(x["wall"] for x in runs["read both"] if not x["problem"])
    base_cpu = statistics.median(x["cpu"] or 0 for x in runs["read both"] if not x["problem"])
    budget = 2 * largest_tensor(ckpt) + 150 * MB
    rows = []
    for case, rs in runs.items():
        ok = [x for x in rs if not x["problem"]]
        wall = statistics.median(x["wall"] for x in ok) if ok else None
        rss = statistics.median(x["rss"] for x in ok) if ok else None
        ratios = sorted(x["wall"] / base for x in ok)
        cpu = statistics.median(x["cpu"] or 0 for x in ok) if ok else None
        rows.append(
            {
                "case": case,
                "runs": len(rs),
                "ok": len(ok),
                "wall_s": wall,
                "ratio_to_read_both": wall / base if wall else None,
                "ratio_min": ratios[0] if ratios else None,
                "ratio_max": ratios[-1] if ratios else None,
                "cpu_s": cpu,
                "cpu_ratio_to_read_both": cpu / base_cpu if cpu and base_cpu else None,
                "peak_rss_mb": rss / MB if rss else None,
                "peak_anon_mb": statistics.median(x["anon"] for x in ok) / MB if ok else None,
            }
        )
    size = sum(f.stat().st_size for f in ckpt.iterdir())
    lines = [
        f"# diff: {ckpt.name} ({size / 1e9:.2f} GB) against a copy with row {ROW} of the embedding changed, "
        f"medians of {a.repeat} alternating rounds",
        "",
        f"RSS budget: 2 × the largest tensor ({largest_tensor(ckpt) / MB:.0f} MB) + 150 MB = "
        f"{budget / MB:.0f} MB",
        "",
        "| case | ok | wall s | × read both (min–max) | cpu s (user+sys) | cpu × read both | peak RSS MB "
        "| RssAnon MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        if x["wall_s"] is None:
            lines.append(f"| {x['case']} | 0/{x['runs']} | — | — | — | — | — | — |")
            continue
        lines.append(
            f"| {x['case']} | {x['ok']}/{x['runs']} | {x['wall_s']:.2f} | {x['ratio_to_read_both']:.2f} "
            f"({x['ratio_min']:.2f}–{x['ratio_max']:.2f}) | {x['cpu_s']:.2f} | "
            f"{x['cpu_ratio_to_read_both']:.2f} | {x['peak_rss_mb']:.0f} | {x['peak_anon_mb']:.0f} |"
        )
    (WORK / "diff.json").write_text(json.dumps({"rows": rows, "budget_mb": budget / MB}, indent=2))
    (WORK / "diff.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
