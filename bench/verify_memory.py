#!/usr/bin/env python3
"""Peak memory and time of ``tietool verify`` (issue 11: "peak RSS under 200 MB at any checkpoint size"),
against a baseline run in the same script: the verify of an older commit that loaded whole tensors
(``--baseline-commit``, default ``3c6dd40``, extracted with ``git archive`` into ``bench/_work/``).

    python bench/make_checkpoints.py                 # once: bench/_work/ckpt_2l (1.23 GB)
    python bench/verify_memory.py [-n 3] [--ckpt 2l|60l]

Pairs verified (outputs made once with the current tietool, untimed): the checkpoint against its ``tie``
output (head dropped: compared with the embedding), against its ``resize`` +256 rows (every tensor compared,
the vocabulary tables by common rows), and against itself (every tensor compared byte for byte). Each run is
a child process; peak RSS from ``/usr/bin/time -v`` (see ``run.py``), RssAnon / RssFile sampled. Medians
of ``-n`` alternating rounds go to ``bench/_work/verify_memory.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

from run import BENCH, MB, ROOT, WORK, clean, run_child, settle, warm

PY = sys.executable


def _tool(root: Path, *args: str) -> list[str]:
    """argv of tietool from the tree whose package folder is ``root`` (run with PYTHONPATH = its parent)."""
    return [PY, "-m", "tietool", *args]


def _env(root: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(root.parent)}


def baseline_tree(commit: str) -> Path:
    """The package of ``commit`` extracted to ``bench/_work/baseline-<commit>/tietool`` (once)."""
    dst = WORK / f"baseline-{commit}" / "tietool"
    if not (dst / "__init__.py").exists():
        dst.mkdir(parents=True, exist_ok=True)
        tar = WORK / f"baseline-{commit}.tar"
        subprocess.run(["git", "archive", "-o", str(tar), commit], cwd=ROOT, check=True)
        with tarfile.open(tar) as t:
            t.extractall(dst, filter="data")
        tar.unlink()
    return dst


def outputs(ckpt: Path) -> dict[str, Path]:
    """The ``tie`` and ``resize`` outputs of ``ckpt`` (made once, with the current tree)."""
    made = {"tie": WORK / f"{ckpt.name}.vm-tied", "resize": WORK / f"{ckpt.name}.vm-resized"}
    if not made["tie"].exists():
        subprocess.run(
            _tool(ROOT, "tie", str(ckpt), "--out", str(made["tie"]), "-q"), env=_env(ROOT), check=True
        )
    if not made["resize"].exists():
        args = [
            "resize",
            str(ckpt),
            "--out",
            str(made["resize"]),
            "--vocab",
            "128512",
            "--init",
            "zeros",
            "-q",
        ]
        subprocess.run(_tool(ROOT, *args), env=_env(ROOT), check=True)
    made["itself"] = ckpt
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--repeat", type=int, default=3)
    ap.add_argument("--ckpt", default="2l", choices=["2l", "60l"])
    ap.add_argument("--baseline-commit", default="3c6dd40")
    a = ap.parse_args()
    ckpt = WORK / f"ckpt_{a.ckpt}"
    if not ckpt.exists():
        print(f"{ckpt} is missing: run bench/make_checkpoints.py first", file=sys.stderr)
        return 2
    trees = {"current": ROOT, f"baseline {a.baseline_commit}": baseline_tree(a.baseline_commit)}
    pairs = outputs(ckpt)
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(a.repeat):
        order = [(t, p) for p in pairs for t in trees]
        order = order[r % len(order) :] + order[: r % len(order)]
        for tree, pair in order:
            warm([ckpt, pairs[pair]])
            settle()
            res = run_child(
                _tool(trees[tree], "verify", str(ckpt), str(pairs[pair]), "--json"),
                env=_env(trees[tree]),
                cwd=BENCH,
            )
            runs.setdefault((tree, pair), []).append(res)
            print(
                f"round {r + 1} {tree:>20} {pair:>7}: {res['wall']:.2f} s, "
                f"{res['rss'] / MB:.0f} MB (rc {res['rc']})"
            )
    rows = []
    for (tree, pair), rs in runs.items():
        ok = [x for x in rs if x["rc"] == 0]
        rows.append(
            {
                "tree": tree,
                "pair": pair,
                "runs": len(rs),
                "ok": len(ok),
                "wall_s": statistics.median(x["wall"] for x in ok) if ok else None,
                "peak_rss_mb": statistics.median(x["rss"] for x in ok) / MB if ok else None,
                "peak_anon_mb": statistics.median(x["anon"] for x in ok) / MB if ok else None,
            }
        )
    base = {r["pair"]: r for r in rows if r["tree"] != "current"}
    lines = [
        f"# verify memory: {ckpt.name} ({sum(f.stat().st_size for f in ckpt.iterdir()) / 1e9:.2f} GB), "
        f"medians of {a.repeat}",
        "",
        "| pair | current s | current peak RSS MB | baseline s | baseline peak RSS MB | RSS ratio "
        "| time ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in (x for x in rows if x["tree"] == "current"):
        b = base.get(r["pair"], {})
        ratio = (
            (r["peak_rss_mb"] / b["peak_rss_mb"]) if r.get("peak_rss_mb") and b.get("peak_rss_mb") else None
        )
        tratio = (r["wall_s"] / b["wall_s"]) if r.get("wall_s") and b.get("wall_s") else None
        lines.append(
            f"| {r['pair']} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} | {b.get('wall_s', 0):.2f} | "
            f"{b.get('peak_rss_mb', 0):.0f} | {ratio:.3f} | {tratio:.2f} |"
        )
    (WORK / "verify_memory.json").write_text(json.dumps(rows, indent=2))
    (WORK / "verify_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for p in (WORK / f"{ckpt.name}.vm-tied", WORK / f"{ckpt.name}.vm-resized"):
        clean(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
