"""Time and peak RSS of ``tietool merge`` of a flex checkpoint, beside ``cp -r`` of it in the same run
(issue 21: goal ≤ 1.5 × ``cp -r`` (+ ``sync``: the merge fsyncs what it writes), peak RSS ≤ 2 × the largest
tensor + 150 MB).

The input is a flex checkpoint folder (``checkpoint-N/`` with ``model_state/``, or a folder of
``*.distcp`` + ``*.metadata``), e.g. the 4-rank one the bench's flex generator writes of the 6.5 GB
benchmark model. Each run is one child process (:func:`convert_memory.run_child`: ``ru_maxrss`` and a
10 ms sampler of RssAnon / RssFile); outputs are deleted after each run. The largest tensor is read
from the ``.metadata``.

usage: PYTHONPATH=. python bench/flex_merge.py CKPT [-n ROUNDS]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from convert_memory import WORK, run_child  # noqa: E402

from tietool.surgery.io import flex  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("-n", type=int, default=2)
    a = ap.parse_args()
    a.ckpt = a.ckpt.resolve()
    folder = flex.find(a.ckpt)
    if folder is None:
        raise SystemExit(f"{a.ckpt} is not a flex checkpoint")
    ck = flex.open_flex(folder)
    largest = max(ck.tensors.values(), key=lambda t: t.nbytes)
    budget = 2 * largest.nbytes + (150 << 20)
    WORK.mkdir(exist_ok=True)
    out, copy = WORK / "flex_merged", WORK / "flex_copy"
    rows = []
    for _ in range(a.n):
        for p in (out, copy):
            shutil.rmtree(p, ignore_errors=True)
        # cp's data synced too: the merge fsyncs every file it writes
        cp = run_child(["sh", "-c", f"cp -r '{a.ckpt}' '{copy}' && sync"])
        m = run_child([sys.executable, "-m", "tietool", "merge", str(a.ckpt), "--out", str(out), "--quiet"])
        rows.append({"cp_s": cp["seconds"], "merge_s": m["seconds"], "maxrss": m["maxrss"], **m})
        for p in (out, copy):
            shutil.rmtree(p, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("cp_s", "merge_s", "maxrss")}
    print(
        json.dumps(
            {
                "input": str(a.ckpt),
                "ranks": len(ck.ranks),
                "tensors": len(ck.tensors),
                "largest": [largest.name, largest.nbytes],
                "runs": rows,
                "median": med,
                "time_ratio": med["merge_s"] / med["cp_s"],
                "time_goal_met": med["merge_s"] <= 1.5 * med["cp_s"],
                "rss_budget": budget,
                "rss_goal_met": med["maxrss"] <= budget,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
