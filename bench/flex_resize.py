"""Time and peak RSS of ``tietool resize --vocab V+8 --keep-training-state --out`` of a Trainer flex
checkpoint with its optimizer state, beside ``cp -r`` of it in the same run (issue 21, flexmem: goal peak
RSS ≤ 2 × the largest vocabulary tensor, a fp32 moment, + 150 MB).

The input is a ``checkpoint-N/`` folder whose ``model_state/`` ``make_flex.py --paddle-layout`` wrote with
real Paddle (4 ranks, row shards, config.json in its parent). ``--make`` adds what the Trainer saves beside
it: ``optimizer_state/`` (a fp32 ``.moment1_0`` and ``.moment2_0`` of every tensor, sliced as the weight is,
and its ``.beta1_pow_acc_0`` / ``.beta2_pow_acc_0``, shape [1]) and ``master_weight/`` (a fp32 ``.w_0`` of
every tensor, sliced as the weight is). **These two folders are written by tietool**
(:mod:`tietool.surgery.io.flex_write`: ``.distcp`` by the ``.pdparams`` writer, ``.metadata`` by
``write_metadata``), **not by paddle**; the format is proven by ``tests/oracles/test_flex_write.py``, whose
paddle oracle (``paddle.distributed.load_state_dict``) reads such folders bit for bit. The values are a
pattern (moment1 = 1e-3 × the tensor's index, moment2 = its square, master = 1/(index+1)), one slice in memory
at a time. The benchmark model stores a duplicate ``lm_head.weight`` under ``tie_word_embeddings: true``, a
tie that resize keeps by dropping the duplicate (which a flex checkpoint's optimizer state cannot follow:
refused); ``--make`` therefore sets ``tie_word_embeddings: false`` in the config.json beside the
checkpoint, so the embedding and the head are resized each with its moments and master weight.

Per round, alternating (the order rotated each round): ``cp -r`` of the checkpoint, ``cp -r`` + ``sync``
(resize fsyncs what it writes), ``resize`` (this tree); with ``--old PKG`` (a folder holding a ``tietool``
symlink to another tree, e.g. ``git archive`` of main before this change) also ``resize`` with that code.
Before each run: outputs deleted, ``sync``, the input read once (warm), the kernel's dirty pages drained
(``run.settle``), all untimed. Each run is a child under ``/usr/bin/time -f %M`` (its peak RSS); a watchdog
kills a run (its own process group) when MemAvailable falls below ``--min-free`` GB (recorded as killed).

``--compare``: the first outputs of ``resize`` and ``resize_old`` kept and compared (``diff -rq``, every
file's bytes; tietool-report.json differs in its timings/paths if at all).

usage: PYTHONPATH=. python bench/flex_resize.py CKPT [--make] [-n 3] [--old PKG] [--compare] [--work DIR]
    [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import settle, warm  # noqa: E402

from tietool.surgery.io import flex, flex_write, pdparams  # noqa: E402
from tietool.surgery.io.flex import FlexSlice, FlexTensor  # noqa: E402
from tietool.surgery.io.safetensors_io import Source  # noqa: E402

MB = 1 << 20
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def _slices(t: FlexTensor, key: str) -> tuple[FlexSlice, ...]:
    return tuple(FlexSlice(s.file, key, s.offset, s.shape) for s in t.slices)


class _Pattern(Source):
    """A fp32 slice of constant value ``v``, made when written (one slice in memory at a time)."""

    __slots__ = ("shape", "v")

    def __init__(self, shape: tuple[int, ...], v: float):
        super().__init__()
        self.shape, self.v = shape, v
        self.nbytes = int(np.prod(shape)) * 4

    def write_to(self, f) -> None:
        Source(array=np.full(self.shape, self.v, np.float32)).write_to(f)


def _write(folder: Path, meta: str, tensors: dict[str, FlexTensor], value) -> None:
    """``folder`` as a flex folder of ``tensors`` (fp32), each slice the value ``value(key)``."""
    folder.mkdir()
    files: dict[str, list[pdparams.Row]] = {}
    for t in tensors.values():
        for s in t.slices:
            src = _Pattern(s.shape, value(t.name))
            files.setdefault(s.file, []).append((s.key, "float32", s.shape, src, None, False))
    for file, rows in sorted(files.items()):
        pdparams.write_file(folder / file, rows, {})
    flex_write.write_metadata(folder / meta, tensors)


def make(ckpt: Path) -> None:
    """Add ``optimizer_state/`` and ``master_weight/`` (written by tietool, module docstring) to ``ckpt``."""
    model = flex.open_flex(flex.FlexFolder(ckpt, ckpt / "model_state", ()))
    opt: dict[str, FlexTensor] = {}
    master: dict[str, FlexTensor] = {}
    index: dict[str, float] = {}
    for i, (name, t) in enumerate(sorted(model.tensors.items())):
        for m, v in (("moment1_0", 1e-3 * (i + 1)), ("moment2_0", (1e-3 * (i + 1)) ** 2)):
            key = f"{name}.{m}"
            opt[key] = FlexTensor(key, t.shape, "float32", _slices(t, key))
            index[key] = v
        for b in ("beta1_pow_acc_0", "beta2_pow_acc_0"):
            key = f"{name}.{b}"
            opt[key] = FlexTensor(key, (1,), "float32", (FlexSlice("0_0.distcp", key, (0,), (1,)),))
            index[key] = 0.9 if b.startswith("beta1") else 0.999
        key = f"{name}.w_0"
        master[key] = FlexTensor(key, t.shape, "float32", _slices(t, key))
        index[key] = 1.0 / (i + 1)
    config = ckpt.parent / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tie_word_embeddings": False}, indent=2))
    _write(ckpt / "optimizer_state", model.metadata, opt, index.__getitem__)
    _write(ckpt / "master_weight", model.metadata, master, index.__getitem__)


def _avail() -> int:
    for ln in Path("/proc/meminfo").read_text().splitlines():
        if ln.startswith("MemAvailable:"):
            return int(ln.split()[1]) * 1024
    return 0


def run(argv: list[str], peak: Path, min_free: int) -> dict:
    """Run ``argv`` under ``/usr/bin/time``: wall seconds, peak RSS; killed when memory runs low."""
    subprocess.run(["sync"], check=True)
    t0 = time.monotonic()
    p = subprocess.Popen(
        ["/usr/bin/time", "-f", "%M", "-o", str(peak), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    killed = threading.Event()

    def watch() -> None:
        while p.poll() is None:
            if _avail() < min_free:
                killed.set()
                os.killpg(p.pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    err = p.communicate()[1].decode()
    seconds = time.monotonic() - t0
    th.join()
    if killed.is_set():
        return {"seconds": seconds, "maxrss": None, "killed": f"MemAvailable < {min_free / 2**30:.0f} GB"}
    if p.returncode != 0:
        return {"seconds": seconds, "maxrss": None, "failed": err.strip().splitlines()[-1][-300:]}
    return {"seconds": seconds, "maxrss": int(peak.read_text().split()[-1]) * 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", type=Path, help="checkpoint-N/ (model_state/ by make_flex.py --paddle-layout)")
    ap.add_argument("--make", action="store_true", help="first add optimizer_state/ and master_weight/")
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--old", type=Path, help="a folder with a tietool symlink: that code measured too")
    ap.add_argument("--old-rounds", type=int, default=1)
    ap.add_argument("--work", type=Path, default=HERE / "_work")
    ap.add_argument("--min-free", type=float, default=4.5, help="GB of MemAvailable a run may not go below")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compare", action="store_true", help="the first outputs of resize and resize_old equal")
    a = ap.parse_args()
    ck = a.ckpt.resolve()
    if a.make and not (ck / "optimizer_state").exists():
        make(ck)
    model = flex.open_flex(flex.FlexFolder(ck, ck / "model_state", ()))
    opt = flex.open_flex(flex.FlexFolder(ck, ck / "optimizer_state", ()))
    vocab = model.tensors[VOCAB[0]].shape[0]
    largest = max((opt.tensors[f"{n}.moment1_0"] for n in VOCAB), key=lambda t: t.nbytes)
    budget = 2 * largest.nbytes + 150 * MB
    a.work.mkdir(parents=True, exist_ok=True)
    out, copy = a.work / "resized", a.work / "copy"
    resize = ["-m", "tietool", "resize", str(ck), "--vocab", str(vocab + 8), "--keep-training-state"]
    resize += ["--out", str(out), "--quiet", "--seed", "0"]
    cases = {
        "cp": ["cp", "-r", str(ck), str(copy)],
        "cp_sync": ["sh", "-c", f"cp -r '{ck}' '{copy}' && sync"],
        "resize": [sys.executable, *resize],
    }
    if a.old:
        cases["resize_old"] = ["env", f"PYTHONPATH={a.old.resolve()}", sys.executable, *resize]
    names, runs = list(cases), {k: [] for k in cases}
    for r in range(a.n):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            if k == "resize_old" and len(runs[k]) >= a.old_rounds:
                continue
            for p in (out, copy):
                shutil.rmtree(p, ignore_errors=True)
            warm([ck])
            settle()
            runs[k].append(run(cases[k], a.work / "maxrss.txt", int(a.min_free * 2**30)))
            x = runs[k][-1]
            rss = x.get("killed") or x.get("failed") or f"{x['maxrss'] / MB:.0f} MB"
            print(k, f"{x['seconds']:.2f} s", rss, flush=True)
            if a.compare and k.startswith("resize") and x["maxrss"] and not (a.work / f"first_{k}").exists():
                out.rename(a.work / f"first_{k}")
    same = None
    if a.compare and (a.work / "first_resize_old").exists():
        diff = ["diff", "-rq", str(a.work / "first_resize"), str(a.work / "first_resize_old")]
        same = subprocess.run(diff, capture_output=True, text=True).stdout.strip() or "identical"
    for k in ("first_resize", "first_resize_old"):
        shutil.rmtree(a.work / k, ignore_errors=True)
    for p in (out, copy):
        shutil.rmtree(p, ignore_errors=True)
    med = {
        k: {m: statistics.median(x[m] for x in v if x[m] is not None) for m in ("seconds", "maxrss")}
        for k, v in runs.items()
        if any(x["maxrss"] is not None for x in v)
    }
    res = {
        "input": str(ck),
        "input_bytes": sum(p.stat().st_size for p in ck.rglob("*") if p.is_file()),
        "vocab": [vocab, vocab + 8],
        "largest_vocab_tensor": [largest.name, largest.nbytes],
        "runs": runs,
        "median": med,
        "time_ratio_cp": med["resize"]["seconds"] / med["cp"]["seconds"],
        "time_ratio_cp_sync": med["resize"]["seconds"] / med["cp_sync"]["seconds"],
        "rss_budget": budget,
        "rss_ratio": med["resize"]["maxrss"] / budget,
        "rss_goal_met": med["resize"]["maxrss"] <= budget,
        "outputs_new_vs_old": same,
    }
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
