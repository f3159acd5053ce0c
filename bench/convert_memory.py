"""Peak RSS and time of ``tietool convert`` on the 6.5 GB benchmark checkpoint, beside ``cp -r`` (issue 12).

``bench/_work/ckpt_60l`` is PaddleFormers safetensors (HF names, Linear ``[out, in]``, bf16), so it is
converted ``--to paddlenlp`` (every Linear weight and the head transposed, names renamed; 6.5 GB < the
default 10 GB shard, so one ``model_state.pdparams``) and ``--to pdparams`` (container only: every tensor
a byte-range copy). Each run is one child process; its peak RSS is ``ru_maxrss`` from ``os.wait4`` and a
10 ms sampler of ``/proc/PID/status`` (RssAnon: allocated memory; RssFile: mapped page-cache pages). The
budget checked is the one of issue 12: peak RSS < 2 × the largest tensor + 150 MB. Outputs are deleted
after each run.

usage: PYTHONPATH=. python bench/convert_memory.py [-n ROUNDS] [--ckpt bench/_work/ckpt_60l]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / "_work"


def _sample(pid: int, peaks: dict[str, int], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                k, _, v = line.partition(":")
                if k in ("RssAnon", "RssFile"):
                    peaks[k] = max(peaks.get(k, 0), int(v.split()[0]) * 1024)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        stop.wait(0.01)


def run_child(argv: list[str]) -> dict:
    """Run ``argv``; wall seconds, peak RSS (bytes, ``ru_maxrss``) and peak RssAnon / RssFile."""
    subprocess.run(["sync"], check=True)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=REPO.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks: dict[str, int] = {}
    stop = threading.Event()
    th = threading.Thread(target=_sample, args=(p.pid, peaks, stop), daemon=True)
    th.start()
    _, status, ru = os.wait4(p.pid, 0)
    seconds = time.monotonic() - t0
    stop.set()
    th.join()
    err = p.stderr.read().decode() if p.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err[-2000:]}")
    return {"seconds": seconds, "maxrss": ru.ru_maxrss * 1024, **peaks}


def largest_tensor(ckpt: Path) -> tuple[str, int]:
    from tietool.surgery.io.checkpoint import Checkpoint

    c = Checkpoint.open(ckpt)
    t = max(c.tensors.values(), key=lambda t: t.nbytes)
    return t.name, t.nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--ckpt", type=Path, default=WORK / "ckpt_60l")
    args = ap.parse_args()
    out = WORK / "convert_out"
    name, biggest = largest_tensor(args.ckpt)
    budget = 2 * biggest + 150 * 10**6
    py = [sys.executable, "-m", "tietool", "convert", str(args.ckpt), "-q", "--out", str(out)]
    cases = {
        "cp -r": ["cp", "-r", str(args.ckpt), str(out)],
        "convert --to paddlenlp": [*py, "--to", "paddlenlp"],
        "convert --to pdparams": [*py, "--to", "pdparams"],
    }
    runs: dict[str, list[dict]] = {k: [] for k in cases}
    for r in range(args.n):
        for k in list(cases)[r % len(cases) :] + list(cases)[: r % len(cases)]:
            shutil.rmtree(out, ignore_errors=True)
            runs[k].append(run_child(cases[k]))
            shutil.rmtree(out, ignore_errors=True)
            print(k, json.dumps(runs[k][-1]), flush=True)
    cp = statistics.median(x["seconds"] for x in runs["cp -r"])
    lines = [
        f"input {args.ckpt.name}: {sum(f.stat().st_size for f in args.ckpt.iterdir()) / 1e9:.2f} GB; largest "
        f"tensor {name} {biggest / 1e6:.0f} MB; budget 2 x largest + 150 MB = {budget / 1e6:.0f} MB; "
        f"{args.n} rounds, medians",
        "",
        "| case | wall s | x cp -r | peak RSS MB | max RssAnon MB | max RssFile MB | RSS vs budget |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, rs in runs.items():
        s = statistics.median(x["seconds"] for x in rs)
        rss = max(x["maxrss"] for x in rs)
        anon, fil = max(x.get("RssAnon", 0) for x in rs), max(x.get("RssFile", 0) for x in rs)
        verdict = (
            "" if k == "cp -r" else f"{rss / budget:.2f} of budget ({'under' if rss < budget else 'OVER'})"
        )
        mb = " | ".join(f"{x / 1e6:.0f}" for x in (rss, anon, fil))
        lines.append(f"| {k} | {s:.1f} | {s / cp:.2f} | {mb} | {verdict} |")
    text = "\n".join(lines)
    print(text)
    (WORK / "convert_memory.md").write_text(text + "\n")
    (WORK / "convert_memory.json").write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
