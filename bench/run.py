#!/usr/bin/env python3
"""Benchmark of issue 4: tietool vs ``cp -r`` vs the PaddleFormers route, wall time and peak RSS per child
process.

    python bench/make_checkpoints.py          # once: bench/_work/ckpt_2l (1.23 GB), ckpt_60l (6.46 GB)
    python bench/run.py                       # 3 alternating rounds, medians, table + ratios
    python bench/run.py --repeat 5 --ckpt 2l --no-pf

Every run is warm: the page cache cannot be dropped here (no root), so before every timed run earlier outputs
are deleted, the dirty pages of earlier runs flushed (``sync``), every input file read once and writeback left
to drain (all untimed), so each run starts from a clean, warm cache. Runs alternate (one of each per round,
the order rotated every round) and the median of the rounds is reported.

Each timed command is a child process run under ``/usr/bin/time -v`` (peak RSS = its "Maximum resident set
size"; without /usr/bin/time, ``os.wait4``'s rusage); wall time is measured here around the child.

Nothing here imports tietool: it is run as a CLI (``python -m tietool``, cwd and PYTHONPATH a folder whose
``tietool`` entry is the project root; the children ran ``python -m cli`` before the single-package move).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / "_work"
NEW_VOCAB = 128512
MB = 1_000_000
TIME = "/usr/bin/time"


# ---------------------------------------------------------------- safetensors headers (for facts and checks)


def st_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def tensors_of(ckpt: Path) -> dict[str, dict]:
    """name → {"dtype", "shape", "nbytes", "file"} from the index and shard headers."""
    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        for name, h in st_header(f).items():
            b, e = h["data_offsets"]
            out[name] = {"dtype": h["dtype"], "shape": h["shape"], "nbytes": e - b, "file": f.name}
    return out


def dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


# ---------------------------------------------------------------- running one child


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


def _rss_split(pids: list[int]) -> tuple[int, int]:
    """Summed RssAnon and RssFile (bytes) of ``pids`` now."""
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


def run_child(
    argv: list[str], env: dict | None = None, cwd: Path | None = None, timeout: float = 3600
) -> dict:
    """Run ``argv``; wall time (perf_counter around the child), its peak RSS (``/usr/bin/time -v``, else
    ``wait4`` rusage), and the peak RssAnon / RssFile sampled from /proc every 10 ms (anonymous memory vs
    mapped file pages, which a memory-mapped tensor adds to RSS). Output goes to a log."""
    log = WORK / "last_child.log"
    use_time = os.access(TIME, os.X_OK)
    tfile = WORK / "last_time.txt"
    tfile.unlink(missing_ok=True)
    full = [TIME, "-v", "-o", str(tfile)] + argv if use_time else argv
    peak = {"anon": 0, "file": 0}
    done = threading.Event()

    def sample(pid: int) -> None:
        t_start = time.perf_counter()
        while not done.wait(0.01):
            anon, file = _rss_split(_descendants(pid))
            peak["anon"], peak["file"] = max(peak["anon"], anon), max(peak["file"], file)
            if time.perf_counter() - t_start > timeout:
                os.kill(pid, 9)

    with open(log, "wb") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        th = threading.Thread(target=sample, args=(p.pid,), daemon=True)
        th.start()
        _, status, ru = os.wait4(p.pid, 0)  # blocking: the wall time is not quantised by the sampler
        wall = time.perf_counter() - t0
        done.set()
        th.join()
        p.returncode = os.waitstatus_to_exitcode(status)
    peak_anon, peak_file = peak["anon"], peak["file"]
    rss_kb = ru.ru_maxrss
    rc = p.returncode
    if use_time and tfile.exists():
        txt = tfile.read_text(errors="replace")
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", txt)
        if m:
            rss_kb = int(m.group(1))
        m = re.search(r"Exit status: (\d+)", txt)
        if m:
            rc = int(m.group(1))
    tail = log.read_text(errors="replace")[-2000:]
    return {
        "wall": wall,
        "rss": rss_kb * 1024,
        "anon": peak_anon,
        "file": peak_file,
        "rc": rc,
        "log_tail": tail,
    }


def warm(paths: list[Path]) -> float:
    """Read every file under ``paths`` once (untimed warm-up); returns the seconds it took."""
    t0 = time.perf_counter()
    buf = bytearray(16 << 20)
    for root in paths:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                with open(f, "rb", buffering=0) as fh:
                    while fh.readinto(buf):
                        pass
    return time.perf_counter() - t0


def settle(limit: int = 64 << 20, timeout: float = 60.0) -> float:
    """Wait (untimed) until the kernel has written back what earlier runs left dirty (Dirty + Writeback in
    /proc/meminfo under ``limit``), so that no run pays for the writeback of the one before it."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        m = {
            ln.split(":")[0]: int(ln.split()[1]) * 1024
            for ln in Path("/proc/meminfo").read_text().splitlines()
            if ln.startswith(("Dirty:", "Writeback:"))
        }
        if sum(m.values()) < limit:
            break
        time.sleep(0.05)
    return time.perf_counter() - t0


def clean(p: Path) -> None:
    if p.exists():
        shutil.rmtree(p)
    for stale in p.parent.glob(f".{p.name}.tietool-tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


# ---------------------------------------------------------------- output checks (untimed)


def check_output(op: str, out: Path) -> str | None:
    """A light check that the output is what the operation should make; None when fine, else what is wrong."""
    try:
        if op in ("inspect", "help"):
            return None
        cfg = json.loads((out / "config.json").read_text())
        ts = tensors_of(out)
        if op.startswith("cp"):
            return None if "lm_head.weight" in ts else "copy lacks lm_head.weight"
        tied = cfg.get("tie_word_embeddings")
        op = op.replace(" --link", "")
        if op.endswith("tie") and not op.endswith("untie"):
            if tied is not True:
                return f"tie_word_embeddings = {tied}"
            if op == "tietool tie" and "lm_head.weight" in ts:
                return "lm_head.weight still present"
        elif op.endswith("untie"):
            if tied is not False:
                return f"tie_word_embeddings = {tied}"
            if "lm_head.weight" not in ts:
                return "no lm_head.weight"
        elif op.endswith("resize"):
            if cfg.get("vocab_size") != NEW_VOCAB:
                return f"vocab_size = {cfg.get('vocab_size')}"
            if ts["model.embed_tokens.weight"]["shape"][0] != NEW_VOCAB:
                return f"embedding shape {ts['model.embed_tokens.weight']['shape']}"
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def package_folder(root: Path) -> Path:
    """A folder whose ``tietool`` entry is ``root`` (the tree to run), for PYTHONPATH and the children's cwd:
    the import package is ``tietool`` = the project root, so the root itself cannot be on the path."""
    if root.name == "tietool" and (root / "__main__.py").is_file():
        return root.parent
    pkg = WORK / "pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    link = pkg / "tietool"
    if not link.is_symlink() or link.resolve() != root:
        link.unlink(missing_ok=True)
        link.symlink_to(root)
    return pkg


# ---------------------------------------------------------------- the cases


def cases(
    py: str, ck: Path, tied: Path, out: Path, with_pf: bool, with_help: bool, with_link: bool = False
) -> list[tuple[str, list[str]]]:
    cli = [py, "-m", "tietool"]
    pf = [py, str(BENCH / "pf_route.py")]
    c = [
        ("cp -r", ["cp", "-r", str(ck), str(out)]),
        ("cp -r + fsync", ["sh", "-c", 'cp -r "$0" "$1" && sync "$1"/*', str(ck), str(out)]),
        ("tietool inspect", cli + ["inspect", str(ck)]),
        ("tietool inspect --no-values", cli + ["inspect", "--no-values", str(ck)]),  # start-up: headers only
        ("tietool tie", cli + ["tie", str(ck), "--out", str(out), "-q"]),
        ("tietool untie", cli + ["untie", str(tied), "--out", str(out), "-q"]),
        (
            "tietool resize",
            cli
            + [
                "resize",
                str(ck),
                "--vocab",
                str(NEW_VOCAB),
                "--init",
                "zeros",
                "--seed",
                "0",
                "--out",
                str(out),
                "-q",
            ],
        ),
    ]
    if with_link:  # untouched shards hard-linked instead of copied
        c += [
            ("tietool tie --link", cli + ["tie", str(ck), "--out", str(out), "-q", "--link"]),
            ("tietool untie --link", cli + ["untie", str(tied), "--out", str(out), "-q", "--link"]),
            (
                "tietool resize --link",
                cli
                + [
                    "resize",
                    str(ck),
                    "--vocab",
                    str(NEW_VOCAB),
                    "--init",
                    "zeros",
                    "--seed",
                    "0",
                    "--out",
                    str(out),
                    "-q",
                    "--link",
                ],
            ),
        ]
    if with_help:
        c.append(("tietool --help", cli + ["--help"]))
    if with_pf:
        c += [
            ("PaddleFormers tie", pf + ["tie", str(ck), str(out)]),
            ("PaddleFormers untie", pf + ["untie", str(tied), str(out)]),
            ("PaddleFormers resize", pf + ["resize", str(ck), str(out), "--vocab", str(NEW_VOCAB)]),
        ]
    return c


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def machine() -> dict:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = next(
        int(x.split()[1]) * 1024
        for x in Path("/proc/meminfo").read_text().splitlines()
        if x.startswith("MemTotal:")
    )
    df = (
        subprocess.run(["df", "-hT", str(WORK)], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    dev = df.split()[0]
    rot = "?"
    blk = Path("/sys/block") / Path(dev).name / "queue" / "rotational"
    if blk.exists():
        rot = "rotational" if blk.read_text().strip() == "1" else "non-rotational"
    np_ver = subprocess.run(
        [sys.executable, "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "ram_bytes": mem,
        "cpu": cpu,
        "disk": f"{df} ({rot} per /sys)",
        "python": platform.python_version(),
        "numpy": np_ver,
        "kernel": platform.release(),
        "cp": subprocess.run(["cp", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
    }


# ---------------------------------------------------------------- main


def fmt_s(x):
    return "—" if x is None else (f"{x:.3f}" if x < 1 else f"{x:.2f}")


def fmt_mb(x):
    return "—" if x is None else f"{x / MB:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description="tietool vs cp -r vs PaddleFormers (issue 4)")
    ap.add_argument("--repeat", "-n", type=int, default=3, help="rounds (median reported); default 3")
    ap.add_argument("--ckpt", action="append", choices=["2l", "60l"], help="default: both")
    ap.add_argument(
        "--python", default=str(Path("/work/venv/bin/python")), help="interpreter with tietool's deps"
    )
    ap.add_argument("--no-pf", action="store_true", help="skip the PaddleFormers route")
    ap.add_argument(
        "--pf-repeat-large",
        type=int,
        default=1,
        help="rounds of the PaddleFormers route on the 6.5 GB checkpoint (peak ~18 GB RSS, ~2.5 min "
        "per op); default 1",
    )
    ap.add_argument(
        "--pf-min-free-gb",
        type=float,
        default=20.0,
        help="skip a PaddleFormers run on the 6.5 GB checkpoint when MemAvailable is below this",
    )
    ap.add_argument("--only", action="append", help="run only cases whose label contains this (repeatable)")
    ap.add_argument("--no-link", action="store_true", help="skip the tie/untie/resize --link cases")
    ap.add_argument("--results", default="results", help="name of the results files in bench/_work/")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tietool tree to run (cwd and PYTHONPATH)")
    ap.add_argument(
        "--snapshot",
        action="store_true",
        help="copy the package of ROOT (surgery, cli, __init__.py, __main__.py) to bench/_work/snapshot "
        "first and run that copy, so edits made to the tree while the benchmark runs do not mix versions",
    )
    a = ap.parse_args()
    if not os.path.exists(a.python):
        a.python = sys.executable
    WORK.mkdir(exist_ok=True)
    keys = a.ckpt or ["2l", "60l"]
    root = a.root.resolve()
    git = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--", "surgery", "cli"],
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    dirty = [d for d in dirty if d.strip()]
    if a.snapshot:
        snap = WORK / "snapshot"
        shutil.rmtree(snap, ignore_errors=True)
        snap.mkdir()
        for d in ("surgery", "cli"):
            shutil.copytree(root / d, snap / "tietool" / d, ignore=shutil.ignore_patterns("__pycache__"))
        for f in ("__init__.py", "__main__.py"):
            shutil.copy2(root / f, snap / "tietool" / f)
        root = snap / "tietool"
    pkg = package_folder(root)
    env = dict(os.environ, PYTHONPATH=str(pkg), CUDA_VISIBLE_DEVICES="")
    info = {
        "machine": machine(),
        "repeat": a.repeat,
        "tietool": {"root": str(root), "git_head": git, "uncommitted_in_surgery_cli": dirty},
        "ckpts": {},
        "runs": [],
    }
    print("machine:", json.dumps(info["machine"]))
    print("tietool:", json.dumps(info["tietool"]))

    # inputs: the checkpoints and, for untie, a tied copy made once by tietool (untimed)
    ck_paths, tied_paths = {}, {}
    for k in keys:
        ck = WORK / f"ckpt_{k}"
        if not (ck / "config.json").is_file():
            print(f"missing {ck}: run python bench/make_checkpoints.py --layers {k[:-1]}", file=sys.stderr)
            return 2
        tied = WORK / f"ckpt_{k}_tied"
        if not (tied / "config.json").is_file():
            clean(tied)
            r = run_child(
                [a.python, "-m", "tietool", "tie", str(ck), "--out", str(tied), "-q"], env=env, cwd=pkg
            )
            if r["rc"] != 0:
                print(f"could not make {tied}: {r['log_tail']}", file=sys.stderr)
                return 1
        ck_paths[k], tied_paths[k] = ck, tied
        ts = tensors_of(ck)
        emb = ts["model.embed_tokens.weight"]["nbytes"]
        head = ts.get("lm_head.weight", {}).get("nbytes", emb)
        info["ckpts"][k] = {
            "path": str(ck),
            "bytes": dir_bytes(ck),
            "tied_bytes": dir_bytes(tied),
            "files": len(list(ck.glob("*.safetensors"))),
            "tensors": len(ts),
            "touched_bytes": emb + head,
        }
        print(f"{k}: {info['ckpts'][k]}")

    out = WORK / "out"
    for rep in range(a.repeat):
        for ki, k in enumerate(keys):
            ck, tied = ck_paths[k], tied_paths[k]
            pf = not a.no_pf and (k == "2l" or rep < a.pf_repeat_large)
            cs = cases(a.python, ck, tied, out, pf, with_help=(ki == 0), with_link=not a.no_link)
            if a.only:
                cs = [c for c in cs if any(o in c[0] for o in a.only)]
            shift = rep % len(cs) if cs else 0
            cs = cs[shift:] + cs[:shift]
            clean(out)
            os.sync()
            wsec = warm([ck, tied])
            print(
                f"\n== round {rep + 1}/{a.repeat}, {k}: warm-up read of {ck.name} + {tied.name} "
                f"(untimed, {wsec:.1f} s)",
                flush=True,
            )
            for label, argv in cs:
                if (
                    label.startswith("PaddleFormers")
                    and k != "2l"
                    and mem_available() < a.pf_min_free_gb * 1e9
                ):
                    print(
                        f"  {label:22s} skipped: MemAvailable {mem_available() / 1e9:.1f} GB < "
                        f"{a.pf_min_free_gb} GB",
                        flush=True,
                    )
                    info["runs"].append({"ckpt": k, "rep": rep, "case": label, "skipped": "low memory"})
                    continue
                clean(out)
                os.sync()
                # the outputs of earlier runs may have pushed input pages out of the page cache: read the
                # inputs again (untimed) so every run starts warm, then let writeback settle
                warm([ck, tied])
                settle()
                r = run_child(argv, env=env, cwd=pkg)
                problem = None if r["rc"] == 0 else f"exit {r['rc']}: {r['log_tail'][-400:]}"
                if problem is None and label not in (
                    "tietool inspect",
                    "tietool inspect --no-values",
                    "tietool --help",
                ):
                    problem = check_output(label, out)
                out_bytes = dir_bytes(out) if out.exists() else None
                rec = {
                    "ckpt": k,
                    "rep": rep,
                    "case": label,
                    "wall": r["wall"],
                    "rss": r["rss"],
                    "anon": r["anon"],
                    "file": r["file"],
                    "rc": r["rc"],
                    "out_bytes": out_bytes,
                    "problem": problem,
                }
                info["runs"].append(rec)
                print(
                    f"  {label:22s} {r['wall']:8.2f} s  {r['rss'] / MB:8.0f} MB (anon {r['anon'] / MB:.0f}, "
                    f"file {r['file'] / MB:.0f})"
                    + (f"  out {out_bytes / 1e9:.3f} GB" if out_bytes else "")
                    + (f"  PROBLEM: {problem}" if problem else ""),
                    flush=True,
                )
                clean(out)
    os.sync()

    # ------------------------------------------------------------ summary
    def med(k, case, field="wall"):
        xs = [
            r[field]
            for r in info["runs"]
            if r["ckpt"] == k and r["case"] == case and "skipped" not in r and not r.get("problem")
        ]
        return statistics.median(xs) if xs else None

    def count(k, case):
        return len(
            [
                r
                for r in info["runs"]
                if r["ckpt"] == k and r["case"] == case and "skipped" not in r and not r.get("problem")
            ]
        )

    labels = []
    for r in info["runs"]:
        if r["case"] not in labels:
            labels.append(r["case"])
    order = [
        "cp -r",
        "cp -r + fsync",
        "tietool --help",
        "tietool inspect",
        "tietool inspect --no-values",
        "tietool tie",
        "tietool untie",
        "tietool resize",
        "tietool tie --link",
        "tietool untie --link",
        "tietool resize --link",
        "PaddleFormers tie",
        "PaddleFormers untie",
        "PaddleFormers resize",
    ]
    labels = [x for x in order if x in labels]
    lines = []
    hdr = (
        "| case | "
        + " | ".join(f"{k} wall s | {k} peak RSS MB | {k} anon / file MB | {k} n" for k in keys)
        + " |"
    )
    lines += [hdr, "|" + "---|" * (1 + 4 * len(keys))]
    for lab in labels:
        row = [lab]
        for k in keys:
            n = count(k, lab)
            row += [
                fmt_s(med(k, lab)),
                fmt_mb(med(k, lab, "rss")),
                f"{fmt_mb(med(k, lab, 'anon'))} / {fmt_mb(med(k, lab, 'file'))}",
                str(n) if n else "—",
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("| ratio | " + " | ".join(keys) + " | target |")
    lines.append("|---|" + "---|" * len(keys) + "---|")

    def ratio(a_, b_):
        return None if a_ is None or b_ is None or b_ == 0 else a_ / b_

    def fr(x, nd=2):
        return "—" if x is None else f"{x:.{nd}f}x"

    for op in ("tie", "untie", "resize"):
        lines.append(
            f"| tietool {op} / cp -r | "
            + " | ".join(fr(ratio(med(k, f"tietool {op}"), med(k, "cp -r"))) for k in keys)
            + " | ≤ 1.1x (6.5 GB) |"
        )
    for op in ("tie", "untie", "resize"):
        lines.append(
            f"| tietool {op} / (cp -r + fsync) | "
            + " | ".join(fr(ratio(med(k, f"tietool {op}"), med(k, "cp -r + fsync"))) for k in keys)
            + " | (reference) |"
        )
    for op in ("tie", "untie", "resize"):
        lines.append(
            f"| PaddleFormers {op} / tietool {op} | "
            + " | ".join(fr(ratio(med(k, f"PaddleFormers {op}"), med(k, f"tietool {op}")), 1) for k in keys)
            + " | ≥ 20x |"
        )
    for op in ("tie", "untie", "resize"):
        lines.append(
            f"| PaddleFormers {op} / tietool {op} --link | "
            + " | ".join(
                fr(ratio(med(k, f"PaddleFormers {op}"), med(k, f"tietool {op} --link")), 1) for k in keys
            )
            + " | (reference) |"
        )
    for op in ("inspect", "tie", "untie", "resize", "tie --link", "untie --link", "resize --link"):
        cells = []
        for k in keys:
            t = info["ckpts"][k]["touched_bytes"]
            rss = med(k, f"tietool {op}", "rss")
            cells.append(
                "—"
                if rss is None
                else f"{rss / (t + 150 * MB):.2f} (limit 2x+150 MB: "
                f"{'met' if rss <= 2 * t + 150 * MB else 'MISSED'})"
            )
        lines.append(
            f"| tietool {op} peak RSS / (touched {info['ckpts'][keys[0]]['touched_bytes'] / MB:,.0f} MB"
            f" + 150 MB) | " + " | ".join(cells) + " | ≤ 2x touched + 150 MB |"
        )
    if "2l" in keys and "60l" in keys:
        lines.append(
            "| inspect 6.5 GB / 1.3 GB | "
            + fr(ratio(med("60l", "tietool inspect"), med("2l", "tietool inspect")))
            + " | | ≤ 1.5x |"
        )
    lines.append(
        "| tietool inspect (s) | "
        + " | ".join(fmt_s(med(k, "tietool inspect")) for k in keys)
        + " | < 0.5 s (6.5 GB) |"
    )
    lines.append(
        "| tietool inspect --no-values (s) | "
        + " | ".join(fmt_s(med(k, "tietool inspect --no-values")) for k in keys)
        + " | ≤ 0.5 s (6.5 GB) |"
    )
    lines.append(
        f"| tietool --help (s) | {fmt_s(med(keys[0], 'tietool --help'))} |"
        + " |" * (len(keys) - 1)
        + " < 0.3 s |"
    )
    problems = [r for r in info["runs"] if r.get("problem")]
    text = "\n".join(lines)
    print("\n" + text)
    if problems:
        print("\nPROBLEMS:")
        for r in problems:
            print(f"  {r['ckpt']} {r['case']} round {r['rep'] + 1}: {r['problem']}")
    (WORK / f"{a.results}.json").write_text(json.dumps(info, indent=1))
    (WORK / f"{a.results}.md").write_text(text + "\n")
    print(f"\nwritten: {WORK / (a.results + '.json')}, {WORK / (a.results + '.md')}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
