#!/usr/bin/env python3
"""Benchmark of issue 13: tietool on a checkpoint in object storage vs the same command on the local folder,
in the same run: wall time, and bytes over the network as the server counted them and as tietool reports.

    python bench/remote.py --ckpt bench/_work/ckpt_60l -n 3

The S3 server is moto's (``tests/support/s3server.py``: moto's server app behind a counting middleware) in
its own process on 127.0.0.1; objects over 16 MB spill to temporary files
(``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``).
The checkpoint is uploaded once (untimed). Per round, alternating: ``inspect --no-values`` local and remote,
``inspect`` (values compared) local and remote, ``tie`` local → local folder and ``tie`` s3 → s3 (another
prefix of the same bucket: untouched shards are copied by the server). Each command is a child process
(``python -m tietool``); medians over rounds.

"Touched shards" = the weight files that hold the embedding or the head (what tie reads: it compares them;
the head's shard is dropped, every other shard is copied whole).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / "_work"
MB = 1_000_000
sys.path.insert(0, str(ROOT / "tests"))
from support.s3server import client_env  # noqa: E402


def start_server() -> tuple[subprocess.Popen, str]:
    """The counting S3 server in a child process; returns it and its endpoint."""
    p = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "s3server.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline().split()
    return p, f"http://127.0.0.1:{line[1]}"


def counts(endpoint: str, reset: bool = False) -> dict:
    """The server's counts (``POST``: and reset them)."""
    req = urllib.request.Request(f"{endpoint}/_counts", method="POST" if reset else "GET")
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def object_bytes(c: dict) -> tuple[int, int]:
    """(bytes of object bodies sent by the server, bytes of bodies it received) from its log."""
    sent = sum(s for m, p, _r, _g, s in c["log"] if m == "GET" and p.count("/") >= 2)
    return sent, c["received"]


def run(cmd: list[str], env: dict) -> tuple[float, dict]:
    """Run ``python -m tietool CMD --json``; returns (wall seconds, its JSON)."""
    t = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "tietool", *cmd, "--json"], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return wall, json.loads(r.stdout)


def touched_bytes(ckpt: Path) -> int:
    """Bytes of the weight files holding the embedding or the head."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    wm = index["weight_map"]
    files = {f for n, f in wm.items() if n.endswith(("embed_tokens.weight", "lm_head.weight"))}
    return sum((ckpt / f).stat().st_size for f in files)


def in_process(ckpt: Path, rounds: int) -> dict:
    """``inspect --no-values`` through the library in this process, local and s3 alternating, after one
    untimed call of each: what a remote inspect costs once the S3 client stack is imported and its client
    made (what a Python user calling ``tietool.inspect`` repeatedly pays). Medians of ``2 * rounds``."""
    from tietool.surgery import ops as operations

    operations.inspect(ckpt, compare_values=False)
    operations.inspect("s3://bench/ckpt", compare_values=False)
    local, remote = [], []
    for _ in range(2 * rounds):
        for where, into in ((str(ckpt), local), ("s3://bench/ckpt", remote)):
            t = time.perf_counter()
            operations.inspect(where, compare_values=False)
            into.append(time.perf_counter() - t)
    out = {"local_median_s": statistics.median(local), "s3_median_s": statistics.median(remote)}
    print(
        f"in-process inspect --no-values: local {out['local_median_s']:.3f} s, s3 {out['s3_median_s']:.3f} s"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, default=WORK / "ckpt_60l")
    ap.add_argument("-n", "--rounds", type=int, default=3)
    ap.add_argument(
        "--cases",
        choices=["all", "inspect"],
        default="all",
        help="inspect: only the four inspect cases (no tie, whose server-side copies take minutes in moto)",
    )
    args = ap.parse_args()
    ckpt = args.ckpt.resolve()
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(16 << 20))
    srv, endpoint = start_server()
    # s3fs's default read timeout (15 s) is shorter than moto's multipart completion of a 1.4 GB copy while
    # the machine is busy; fsspec's own configuration variable raises it (what a user would set too)
    os.environ["FSSPEC_S3"] = json.dumps({"config_kwargs": {"read_timeout": 600, "connect_timeout": 60}})
    env = {**os.environ, **client_env(endpoint)}
    os.environ.update(client_env(endpoint))
    out_local = WORK / "remote_out"
    try:
        import fsspec

        # one part at a time, patient timeouts: moto parses each 50 MB part in Python
        fs = fsspec.filesystem(
            "s3", max_concurrency=1, config_kwargs={"connect_timeout": 120, "read_timeout": 600}
        )
        fs.mkdir("bench")
        t = time.perf_counter()
        for f in sorted(ckpt.iterdir()):
            fs.put_file(str(f), f"bench/ckpt/{f.name}")
        print(f"uploaded {ckpt} in {time.perf_counter() - t:.1f} s", flush=True)
        for f in ckpt.iterdir():  # warm the local input's headers
            with open(f, "rb") as fh:
                fh.read(1 << 20)
        res: dict[str, list] = {}
        cases = [
            ("inspect --no-values, local", ["inspect", str(ckpt), "--no-values"]),
            ("inspect --no-values, s3", ["inspect", "s3://bench/ckpt", "--no-values"]),
            ("inspect, local", ["inspect", str(ckpt)]),
            ("inspect, s3", ["inspect", "s3://bench/ckpt"]),
            ("tie, local → local", ["tie", str(ckpt), "--out", str(out_local)]),
            ("tie, s3 → s3", ["tie", "s3://bench/ckpt", "--out", "s3://bench/tie"]),
        ]
        if args.cases == "inspect":
            cases = [c for c in cases if c[0].startswith("inspect")]
        for rnd in range(args.rounds):
            order = cases[rnd % len(cases) :] + cases[: rnd % len(cases)]
            for name, cmd in order:
                shutil.rmtree(out_local, ignore_errors=True)
                if fs.exists("bench/tie"):
                    fs.rm("bench/tie", recursive=True)
                subprocess.run(["sync"])
                counts(endpoint, reset=True)
                wall, doc = run(cmd, env)
                sent, received = object_bytes(counts(endpoint))
                res.setdefault(name, []).append(
                    {
                        "wall": wall,
                        "server_sent": sent,
                        "server_received": received,
                        "tietool": doc.get("transferred"),
                    }
                )
                print(
                    f"round {rnd}: {name}: {wall:.2f} s, server sent {sent} B, received {received} B",
                    flush=True,
                )
        rep_inproc = in_process(ckpt, args.rounds)
        touched = touched_bytes(ckpt)
        summary = {
            name: {
                "wall_median_s": statistics.median(r["wall"] for r in runs),
                "walls": [round(r["wall"], 3) for r in runs],
                "server_sent_bytes": runs[-1]["server_sent"],
                "server_received_bytes": runs[-1]["server_received"],
                "tietool_transferred": runs[-1]["tietool"],
            }
            for name, runs in res.items()
        }
        rep = {
            "checkpoint": str(ckpt),
            "checkpoint_bytes": sum(f.stat().st_size for f in ckpt.iterdir()),
            "touched_shard_bytes": touched,
            "rounds": args.rounds,
            "results": summary,
            "in_process": rep_inproc,
        }
        s = summary
        ins_ratio = (
            s["inspect --no-values, s3"]["wall_median_s"] / s["inspect --no-values, local"]["wall_median_s"]
        )
        rep["targets"] = {
            "inspect_no_values_bytes": s["inspect --no-values, s3"]["server_sent_bytes"],
            "inspect_no_values_time_ratio": round(ins_ratio, 3),
        }
        if "tie, s3 → s3" in s:
            tie = s["tie, s3 → s3"]
            tie_bytes = tie["server_sent_bytes"] + tie["server_received_bytes"]
            rep["targets"]["tie_bytes_both_ways"] = tie_bytes
            rep["targets"]["tie_bytes_over_touched"] = round(tie_bytes / touched, 4)
        WORK.mkdir(exist_ok=True)
        (WORK / "remote.json").write_text(json.dumps(rep, indent=2))
        print("\n| case | wall s (median; each round) | server → client bytes | client → server bytes |")
        print("|---|---|---|---|")
        for name, x in summary.items():
            walls = ", ".join(f"{w:.2f}" for w in x["walls"])
            sent, got = x["server_sent_bytes"], x["server_received_bytes"]
            print(f"| {name} | {x['wall_median_s']:.2f} ({walls}) | {sent:,} | {got:,} |")
        print(f"\ntouched shards: {touched:,} bytes; targets: {json.dumps(rep['targets'])}")
    finally:
        shutil.rmtree(out_local, ignore_errors=True)
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
