#!/usr/bin/env python3
"""In-place tie and resize (issue 11) against ``cp -r`` of the same checkpoint, in the same run.

    python bench/make_checkpoints.py                 # once: bench/_work/ckpt_60l (6.46 GB), ckpt_2l
    python bench/inplace.py [-n 3] [--ckpt 60l]

Each round, untimed: a working copy of the checkpoint is made with ``cp -al`` (hard links: free, and a valid
independent input, since tietool never modifies a file, it writes new ones and swaps folders), the inputs are
read once and writeback is left to drain (see ``run.py``). Timed, one child process each, alternating:
``cp -r`` of the checkpoint, ``tietool tie CKPT`` in place, ``tietool resize CKPT --vocab 128512 --init
zeros`` in place (+256 rows), both keeping their backup, and the floor of a resize: ``cp`` of the two shards
it rewrites (the embedding's and the head's) followed by ``sync``. Medians and the ratios to ``cp -r`` go to
``bench/_work/inplace.{json,md}``. The targets: tie under 0.1x ``cp -r``; resize in the time it takes to
write the touched shards (here the embedding's and the head's, 2 x 525 MB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from run import MB, ROOT, WORK, clean, run_child, settle, warm

PY = sys.executable


def _fresh(ckpt: Path, dst: Path) -> Path:
    """A working copy of ``ckpt`` made of hard links (and no backups of earlier rounds beside it)."""
    for p in dst.parent.glob(f"{dst.name}*"):
        clean(p)
    subprocess.run(["cp", "-al", str(ckpt), str(dst)], check=True)
    return dst


def _cases(ckpt: Path) -> dict[str, tuple[list[str], Path | None]]:
    """label → (argv, the folder that gets a fresh working copy first, or None)."""
    work = WORK / "inplace-ckpt"
    tool = [PY, "-m", "tietool"]
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    touched = sorted({str(ckpt / index[n]) for n in ("model.embed_tokens.weight", "lm_head.weight")})
    dst = WORK / "inplace-cp"
    return {
        "cp -r": (["cp", "-r", str(ckpt), str(dst)], None),
        # what resize must at least do: write the two touched shards (durably, as tietool does)
        "cp touched shards + fsync": (
            ["sh", "-c", f'mkdir -p "{dst}" && cp {" ".join(touched)} "{dst}/" && sync "{dst}"/*'],
            None,
        ),
        "tie in place": ([*tool, "tie", str(work), "-q"], work),
        "resize in place": ([*tool, "resize", str(work), "--vocab", "128512", "--init", "zeros", "-q"], work),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--repeat", type=int, default=3)
    ap.add_argument("--ckpt", default="60l", choices=["2l", "60l"])
    a = ap.parse_args()
    ckpt = WORK / f"ckpt_{a.ckpt}"
    if not ckpt.exists():
        print(f"{ckpt} is missing: run bench/make_checkpoints.py first", file=sys.stderr)
        return 2
    cases = _cases(ckpt)
    runs: dict[str, list[dict]] = {k: [] for k in cases}
    env = {"PYTHONPATH": str(ROOT.parent), "PATH": "/usr/bin:/bin"}
    for r in range(a.repeat):
        order = list(cases)
        order = order[r % len(order) :] + order[: r % len(order)]
        for label in order:
            argv, work = cases[label]
            clean(WORK / "inplace-cp")
            if work is not None:
                _fresh(ckpt, work)
            warm([ckpt])
            settle()
            res = run_child(argv, env=env, cwd=WORK)
            runs[label].append(res)
            print(f"round {r + 1} {label:>16}: {res['wall']:.2f} s, {res['rss'] / MB:.0f} MB, rc {res['rc']}")
    med = {k: statistics.median(x["wall"] for x in v if x["rc"] == 0) for k, v in runs.items()}
    rss = {k: max(x["rss"] for x in v) / MB for k, v in runs.items()}
    size = sum(f.stat().st_size for f in ckpt.iterdir()) / 1e9
    lines = [
        f"# in place on {ckpt.name} ({size:.2f} GB), medians of {a.repeat} alternating rounds",
        "",
        "| case | wall s | ratio to `cp -r` | peak RSS MB |",
        "|---|---|---|---|",
        *(f"| {k} | {med[k]:.2f} | {med[k] / med['cp -r']:.3f} | {rss[k]:.0f} |" for k in cases),
    ]
    (WORK / "inplace.json").write_text(
        json.dumps({"median_s": med, "peak_rss_mb": rss, "runs": runs}, indent=1)
    )
    (WORK / "inplace.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for p in WORK.glob("inplace-*"):
        clean(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
