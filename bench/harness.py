#!/usr/bin/env python3
"""tietool's one benchmark harness: a case is a command, an input and a budget (the cases: bench/cases.py).

    python bench/harness.py --list                              # the cases, their inputs and budgets
    python bench/harness.py --case 'startup/*' --rounds 5 --json bench/_work/startup.json
    python bench/harness.py --case inplace/tie --size 2l --before /tmp/base-pkg   # before/after, one run

What it does, per run (the same for every case, so figures of different cases compare):

* **Inputs** are built once and cached under ``bench/_work`` (``--size``: ``tiny`` = a few hundred KB made
  in seconds, for ``tests/structure/test_bench_cases.py``; ``2l`` = 1.23 GB; ``60l`` = the 6.46 GB
  benchmark checkpoint of ``make_checkpoints.py``). A case whose input cannot be made here (paddle, network,
  an S3 server missing) is listed as skipped, with why.
* **Warm-up and writeback settling** before every timed run (untimed): earlier outputs deleted, ``sync``,
  every input file read once (warm: dropping the page cache needs root and makes every run cold; this
  harness measures warm runs), then the kernel's Dirty + Writeback left to drain below 64 MB, so no run
  pays for the writeback of the one before it. ``--warmup N`` whole untimed rounds first (default 1:
  bytecode written, page cache filled).
* **Rounds** alternate: one run of each case per round, the order rotated by one each round; medians over
  rounds (``--rounds``).
* **Each run is one child process** (a ``call`` case is timed in this process, for in-process loops): wall
  time around it (``perf_counter``), user + system CPU from ``os.wait4``, and the peak RSS of the child and
  its descendants from ``/proc/PID/status`` polled every 5 ms (RssAnon = allocated, RssFile = mapped
  page-cache pages; their sum's peak is ``peak_rss``). ``ru_maxrss`` is not used: Linux keeps the forked
  harness's pre-``exec`` RSS in it.
* **Baselines in the same run**: a case names the case it is a ratio to (``cp -r`` of the same folder,
  reading both inputs once, ``pickletools.genops``...); with ``--before DIR`` (a folder holding another
  ``tietool``, e.g. ``git worktree add`` of main + a ``tietool`` symlink) every tietool case also runs with
  that code, alternating in the same rounds, as ``NAME@before``.
* **Budgets** (a ratio to the baseline, a wall time, a peak RSS from the input's largest tensor) are checked
  on the medians; the verdicts go to the table and the JSON. ``--strict`` exits 1 on a missed budget.
* **Checked**: every run's exit code against the case's, and a case's own check of its output; a failed
  run is reported and left out of the medians (exit 1 at the end).

The JSON (``--json OUT``): the machine (CPUs, load average before and after, memory), the tree(s) run
(git HEAD), the size, and per case its command, input, every run and the medians, ratios and verdicts.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / "_work"
MB = 1_000_000
SIZES = ("tiny", "2l", "60l")


# ---------------------------------------------------------------- what a case is


@dataclass(frozen=True)
class Budget:
    """What a case must meet, on medians: ``ratio`` × its baseline's wall time, ``wall_s`` seconds, and a
    peak RSS of ``rss_x_largest`` × the input's largest tensor + ``rss_plus_mb`` MB (when ``rss_x_largest``
    is set). ``why`` names where the budget comes from."""

    ratio: float | None = None
    wall_s: float | None = None
    rss_x_largest: float | None = None
    rss_plus_mb: float = 150.0
    rss_mb: float | None = None
    why: str = ""

    def text(self) -> str:
        parts = []
        if self.ratio is not None:
            parts.append(f"≤ {self.ratio:g}× baseline")
        if self.wall_s is not None:
            parts.append(f"≤ {self.wall_s:g} s")
        if self.rss_x_largest is not None:
            parts.append(f"RSS ≤ {self.rss_x_largest:g}× largest tensor + {self.rss_plus_mb:g} MB")
        if self.rss_mb is not None:
            parts.append(f"RSS ≤ {self.rss_mb:g} MB")
        return ", ".join(parts) or "—"


@dataclass
class Ctx:
    """What a case's command sees: its input folder (and the other inputs it asked for), its output folder
    (absent before each run), the interpreter and the tietool tree's ``PYTHONPATH`` folder."""

    inp: Path
    out: Path
    python: str
    pkg: Path
    size: str
    extra: dict[str, Path] = field(default_factory=dict)

    def tool(self, *args: str) -> list[str]:
        """argv of ``tietool ARGS`` (run as ``python -m tietool`` with this tree on ``PYTHONPATH``)."""
        return [self.python, "-m", "tietool", *args]


@dataclass(frozen=True)
class Case:
    """One benchmark: ``command(ctx)`` is the child's argv (or ``call(ctx)`` a callable timed in-process),
    on the input ``input`` (a key of ``cases.INPUTS``), against ``baseline`` (another case's name), within
    ``budget``. ``fresh``: the run gets a fresh hard-linked working copy of the input (``cp -al``; an
    in-place command then edits that, and tietool never writes into a file it did not create).
    ``check(ctx, log)`` returns what is wrong with the output or None. ``tietool``: the command runs tietool
    (so ``--before`` runs it with the other tree too). ``extra``: other inputs the command needs."""

    name: str
    input: str
    doc: str
    command: Callable[[Ctx], list[str]] | None = None
    call: Callable[[Ctx], None] | None = None
    baseline: str | None = None
    budget: Budget = Budget()
    expect_rc: int = 0
    fresh: bool = False
    check: Callable[[Ctx, str], str | None] | None = None
    tietool: bool = True
    extra: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()


# ---------------------------------------------------------------- measuring one run


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _rss(pids: list[int]) -> tuple[int, int]:
    anon = file = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        anon += int(line.split()[1]) * 1024
                    elif line.startswith("RssFile:"):
                        file += int(line.split()[1]) * 1024
        except OSError:
            pass
    return anon, file


def run_child(argv: Sequence[str], env: dict, cwd: Path, log: Path, timeout: float = 3600) -> dict:
    """Run ``argv`` once: wall seconds, user + system CPU seconds (``wait4``), exit code, and the peak of
    RssAnon + RssFile summed over the child and its descendants, polled every 5 ms (``peak_rss``; with
    ``peak_anon`` / ``peak_file`` the peaks of each). stdout and stderr go to ``log``."""
    peak = {"rss": 0, "anon": 0, "file": 0}
    done = threading.Event()

    def sample(pid: int) -> None:
        t0 = time.perf_counter()
        while not done.is_set():
            anon, file = _rss(_descendants(pid))
            peak["rss"] = max(peak["rss"], anon + file)
            peak["anon"], peak["file"] = max(peak["anon"], anon), max(peak["file"], file)
            if time.perf_counter() - t0 > timeout:
                os.kill(pid, 9)
            done.wait(0.005)

    with open(log, "wb") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        th = threading.Thread(target=sample, args=(p.pid,), daemon=True)
        th.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        th.join()
        p.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall": wall,
        "cpu": ru.ru_utime + ru.ru_stime,
        "rc": p.returncode,
        "peak_rss": peak["rss"],
        "peak_anon": peak["anon"],
        "peak_file": peak["file"],
    }


def run_call(fn: Callable[[Ctx], None], ctx: Ctx) -> dict:
    """Time ``fn(ctx)`` in this process (wall and this process's CPU); rc 1 if it raised."""
    t0, c0 = time.perf_counter(), time.process_time()
    rc = 0
    try:
        fn(ctx)
    except Exception as e:  # noqa: BLE001 - reported as a failed run
        print(f"    {type(e).__name__}: {e}", file=sys.stderr)
        rc = 1
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "rc": rc}


def warm(paths: Sequence[Path]) -> None:
    """Read every file under ``paths`` once (untimed): each run starts with its input in the page cache."""
    buf = bytearray(16 << 20)
    for root in paths:
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for f in files:
            if f.is_file():
                with open(f, "rb", buffering=0) as fh:
                    while fh.readinto(buf):
                        pass


def settle(limit: int = 64 << 20, timeout: float = 60.0) -> None:
    """``sync``, then wait (untimed) until Dirty + Writeback in /proc/meminfo is under ``limit``."""
    os.sync()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        m = [
            ln
            for ln in Path("/proc/meminfo").read_text().splitlines()
            if ln.startswith(("Dirty:", "Writeback:"))
        ]
        if sum(int(ln.split()[1]) * 1024 for ln in m) < limit:
            return
        time.sleep(0.05)


def clean(p: Path) -> None:
    """Remove ``p`` and what an interrupted tietool run left beside it (temporary folders, backups)."""
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.exists():
        shutil.rmtree(p)
    for stale in p.parent.glob(f".{p.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in p.parent.glob(f"{p.name}.*"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()


# ---------------------------------------------------------------- the rounds


@dataclass
class Variant:
    """A case run with one tree: ``label`` is the case's name, or ``NAME@before`` for ``--before``'s."""

    label: str
    case: Case
    pkg: Path
    runs: list[dict] = field(default_factory=list)


def package_folder(root: Path) -> Path:
    """A folder whose ``tietool`` entry is the tree ``root`` (for ``PYTHONPATH``; absolute, as the children
    run in ``bench/_work``)."""
    root = root.resolve()
    if root.name == "tietool" and (root / "__main__.py").is_file():
        return root.parent
    if (root / "tietool" / "__main__.py").is_file():
        return root
    pkg = WORK / "pkg" / root.name
    pkg.mkdir(parents=True, exist_ok=True)
    link = pkg / "tietool"
    if not link.is_symlink() or link.resolve() != root:
        link.unlink(missing_ok=True)
        link.symlink_to(root)
    return pkg


def child_env(pkg: Path) -> dict:
    """The children's environment: this tree on ``PYTHONPATH``, no GPU, and bytecode written and used (a
    user's installed package has its ``.pyc``: ``PYTHONDONTWRITEBYTECODE`` would make every run compile
    tietool from source)."""
    env = dict(os.environ, PYTHONPATH=str(pkg), CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def one_run(v: Variant, ctx: Ctx, log: Path) -> dict:
    """Prepare (output gone, fresh working copy, warm input, settle), run, check."""
    case = v.case
    clean(ctx.out)
    if case.fresh:
        clean(ctx.extra["work"])
        subprocess.run(["cp", "-al", str(ctx.inp), str(ctx.extra["work"])], check=True)
    warm([ctx.inp, *(p for k, p in ctx.extra.items() if k != "work" and p.exists())])
    settle()
    if case.call is not None:
        res = run_call(case.call, ctx)
        log.write_text("")
    else:
        assert case.command is not None
        res = run_child(case.command(ctx), child_env(v.pkg), WORK, log)
    text = log.read_text(errors="replace")
    problem = None if res["rc"] == case.expect_rc else f"exit {res['rc']}, expected {case.expect_rc}"
    if problem is None and case.check is not None:
        problem = case.check(ctx, text)
    res["ok"] = problem is None
    if problem:
        res["problem"] = problem
        res["log_tail"] = text[-1500:]
    clean(ctx.out)
    if case.fresh:
        clean(ctx.extra["work"])
    return res


def median(runs: list[dict], key: str) -> float | None:
    xs = [r[key] for r in runs if r.get("ok") and key in r]
    return statistics.median(xs) if xs else None


def summary(v: Variant, by_label: dict[str, Variant], largest: int | None) -> dict:
    """Medians of ``v``'s good runs, its ratio to its baseline (run with the same tree), the verdicts."""
    case = v.case
    out = {"wall_s": median(v.runs, "wall"), "cpu_s": median(v.runs, "cpu")}
    out["peak_rss_mb"] = (
        (max(r["peak_rss"] for r in v.runs if r.get("ok")) / MB) if median(v.runs, "peak_rss") else None
    )
    out["failed"] = sum(not r.get("ok") for r in v.runs)
    suffix = v.label[len(case.name) :]
    base = by_label.get((case.baseline or "") + suffix) or by_label.get(case.baseline or "")
    if base is not None and out["wall_s"] and median(base.runs, "wall"):
        out["baseline"] = base.label
        out["ratio"] = out["wall_s"] / median(base.runs, "wall")
    b, verdicts = case.budget, []
    if b.ratio is not None and "ratio" in out:
        verdicts.append(out["ratio"] <= b.ratio)
    if b.wall_s is not None and out["wall_s"] is not None:
        verdicts.append(out["wall_s"] <= b.wall_s)
    if b.rss_x_largest is not None and largest and out["peak_rss_mb"] is not None:
        out["rss_budget_mb"] = (b.rss_x_largest * largest) / MB + b.rss_plus_mb
        verdicts.append(out["peak_rss_mb"] <= out["rss_budget_mb"])
    if b.rss_mb is not None and out["peak_rss_mb"] is not None:
        verdicts.append(out["peak_rss_mb"] <= b.rss_mb)
    out["budget"] = b.text()
    out["met"] = all(verdicts) if verdicts else None
    if v.label != case.name and v.label.endswith("@before") and case.name in by_label:
        now, before = median(by_label[case.name].runs, "wall"), median(v.runs, "wall")
        if now and before:
            out["after_over_before"] = now / before
    return out


def machine() -> dict:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    mem = next(
        ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:")
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gb": round(int(mem) / 1e6, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg": os.getloadavg(),
    }


def git_head(root: Path) -> str:
    r = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip()


# ---------------------------------------------------------------- the command line


def select(cases: Sequence[Case], patterns: Sequence[str] | None) -> list[Case]:
    if not patterns:
        return list(cases)
    chosen = [c for c in cases if any(fnmatch.fnmatch(c.name, p) for p in patterns)]
    if not chosen:
        raise SystemExit(f"no case matches {list(patterns)}: see --list")
    return chosen


def run_cases(args: argparse.Namespace, chosen: list[Case]) -> dict:
    """Build inputs, run warm-up and rounds, and return the result document."""
    import cases as table

    WORK.mkdir(exist_ok=True)
    trees = {"": package_folder(args.tree)}
    if args.before:
        trees["@before"] = package_folder(args.before)
    for pkg in trees.values():  # bytecode once, as an installed package has it (the package only)
        code = [str(pkg / "tietool" / d) for d in ("__init__.py", "__main__.py", "surgery", "cli")]
        subprocess.run([args.python, "-m", "compileall", "-q", *code], env=child_env(pkg), check=False)
    doc: dict = {"machine": machine(), "size": args.size, "rounds": args.rounds, "cases": {}, "skipped": {}}
    doc["trees"] = {
        k or "now": {"pkg": str(p), "git_head": git_head(p / "tietool")} for k, p in trees.items()
    }
    for pkg in trees.values():  # the children must import this tree, not an installed tietool
        probe = [args.python, "-c", "import tietool; print(tietool.__file__)"]
        got = subprocess.run(
            probe, env=child_env(pkg), cwd=WORK, capture_output=True, text=True
        ).stdout.strip()
        if not got.startswith(str(pkg)):
            raise SystemExit(f"the children import tietool from {got or '(nowhere)'}, not from {pkg}")
    variants: list[tuple[Variant, Ctx]] = []
    for case in chosen:
        why = table.missing(case, args.size)
        if why:
            doc["skipped"][case.name] = why
            print(f"skip {case.name}: {why}", flush=True)
            continue
        inp = table.INPUTS[case.input](args.size)
        extra = {k: table.INPUTS[k](args.size) for k in case.extra}
        for suffix, pkg in trees.items():
            if suffix and not case.tietool:
                continue
            tag = case.name.replace("/", "_") + suffix.replace("@", "_")
            if case.fresh:
                extra = {**extra, "work": WORK / f"work_{tag}"}
            ctx = Ctx(inp, WORK / f"out_{tag}", args.python, pkg, args.size, dict(extra))
            variants.append((Variant(case.name + suffix, case, pkg), ctx))
    by_label = {v.label: v for v, _ in variants}
    log = WORK / "last_child.log"
    for r in range(-args.warmup, args.rounds):
        k = r % max(1, len(variants))
        for v, ctx in variants[k:] + variants[:k]:
            res = one_run(v, ctx, log)
            if r >= 0:
                v.runs.append(res)
            tag = "warm-up" if r < 0 else f"round {r + 1}"
            flag = "" if res["ok"] else f"  FAILED: {res['problem']}"
            print(f"{tag:>9} {v.label:40s} {res['wall']:8.3f} s{flag}", flush=True)
    for v, ctx in variants:
        largest = table.largest_tensor(ctx.inp)
        doc["cases"][v.label] = {
            "doc": v.case.doc,
            "input": str(ctx.inp),
            "command": v.case.command(ctx) if v.case.command else f"(in process) {v.case.call.__name__}",
            "runs": v.runs,
            **summary(v, by_label, largest),
        }
    doc["machine"]["loadavg_after"] = os.getloadavg()
    return doc


def fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "—"
    return (f"{x:.3f}" if x < 10 else f"{x:.1f}") + unit


def table_text(doc: dict) -> str:
    lines = [
        f"size {doc['size']}, {doc['rounds']} rounds, medians; load average "
        f"{doc['machine']['loadavg'][0]:.2f} before, {doc['machine']['loadavg_after'][0]:.2f} after; "
        f"{doc['machine']['nproc']} CPUs",
        "",
        "| case | wall s | CPU s | peak RSS MB | ratio | budget | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, c in doc["cases"].items():
        ratio = "" if "ratio" not in c else f"{c['ratio']:.3f}× {c['baseline']}"
        if "after_over_before" in c:
            ratio += f" (now/before {c['after_over_before']:.2f})"
        met = {True: "yes", False: "**no**", None: ""}[c["met"]]
        failed = f" ({c['failed']} failed)" if c["failed"] else ""
        lines.append(
            f"| {label}{failed} | {fmt(c['wall_s'])} | {fmt(c['cpu_s'])} | {fmt(c['peak_rss_mb'])} | "
            f"{ratio} | {c['budget']} | {met} |"
        )
    lines += [f"| {k} | skipped: {why} ||||||" for k, why in doc["skipped"].items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(BENCH))
    import cases as table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--case", action="append", help="a case name or glob (repeatable); default: all")
    ap.add_argument("--rounds", "-n", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed whole rounds first (default 1)")
    ap.add_argument("--size", choices=SIZES, default="60l", help="input size (default 60l, the 6.46 GB one)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the tietool tree to run (default: this one)")
    ap.add_argument("--before", type=Path, help="another tietool tree, run alternating in the same rounds")
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the children")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a budget is missed")
    args = ap.parse_args(argv)
    chosen = select(table.CASES, args.case)
    if args.list:
        for c in chosen:
            why = table.missing(c, args.size)
            print(f"{c.name:28s} input {c.input:10s} baseline {c.baseline or '—':16s} {c.budget.text()}")
            print(f"{'':28s} {c.doc}" + (f" [skipped at --size {args.size}: {why}]" if why else ""))
        return 0
    doc = run_cases(args, chosen)
    text = table_text(doc)
    print("\n" + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1, default=str))
        args.json.with_suffix(".md").write_text(text + "\n")
    failed = any(c["failed"] for c in doc["cases"].values())
    missed = args.strict and any(c["met"] is False for c in doc["cases"].values())
    return 1 if failed or missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
