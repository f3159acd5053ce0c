#!/usr/bin/env python3
"""Write a benchmark checkpoint of make_checkpoints.py as a 4-rank flex checkpoint, with real Paddle.

    python bench/make_flex.py                    # bench/_work/ckpt_60l -> bench/_work/flex_60l (6.5 GB)
    python bench/make_flex.py --ckpt 2l --check  # ckpt_2l -> flex_2l, then compare with load_state_dict

Four plain CPU processes (gloo, the PADDLE_* env of tests/data/flex/make_flex.py) each build a dict of
``ShardedWeight`` (``paddle.distributed.flex_checkpoint.dcp.sharded_weight``, what the Trainer's
``sharded_state_dict`` hands to ``save_state_dict``): rank r holds rows ``[r*n/4, (r+1)*n/4)`` of every 2-D
tensor (Shard(0); every dim 0 of this model divides by 4) and the whole 1-D norms (replicated: Paddle saves
each once, on the rank its balancing picks). Each rank maps only its quarter of each tensor from the
safetensors (copy-on-write numpy memmap of the rows, bf16 bits as uint16) and hands it to paddle without a
copy (``paddle.Tensor(arr, zero_copy=True)``; paddle reads uint16 arrays as bfloat16), so the only
anonymous copy is the one ``paddle.save`` makes to pickle it; every rank prints its peak RSS.
Then ``dist.save_state_dict`` writes the Trainer's layout:

    bench/_work/flex_<L>l/config.json                       (the source's; the flex output has none)
    bench/_work/flex_<L>l/checkpoint-1/model_state/{0..3}_0.distcp + 0.metadata

``--paddle-layout``: the tensors as the PaddleFormers 1.2 Trainer really saves them, the model's in-memory
layout (``model.state_dict()``; tests/data/flex/trainer_1rank/state_dict_names.json): every nn.Linear weight
``[in, out]``, the transpose of the safetensors ``[out, in]``; the embedding and ``lm_head``
``[vocab, hidden]`` as in the safetensors; norms 1-D. Rank r then holds rows ``[r*n/4, (r+1)*n/4)`` of the
transposed tensor
(columns of the source, copied to a contiguous array: ~1/4 of the model of anonymous memory per rank, beside
paddle.save's copy). Output ``flex_<L>l_paddle``. ``tietool merge`` converts it back (merge_flex's conversion:
``surgery.arch.CONVERSIONS``), so its output must equal the source bit for bit.

``--check`` (for the 2-layer one; needs ~2.5 GB): ``paddle.distributed.load_state_dict`` in one process
into full-size bf16 zeros, compared bit for bit with the source safetensors (transposed back for
``--paddle-layout``). Nothing here imports tietool.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
WORK = BENCH / "_work"
RANKS = 4
UNTURNED = ("model.embed_tokens.weight", "lm_head.weight")  # [vocab, hidden] in the Trainer's state dict too


def turned(name: str, shape: tuple[int, ...], paddle_layout: bool) -> bool:
    """True when the Trainer's state dict holds this tensor transposed: a 2-D nn.Linear weight."""
    return paddle_layout and len(shape) == 2 and name not in UNTURNED


def st_tensors(folder: Path) -> dict[str, tuple[Path, int, tuple[int, ...]]]:
    """name -> (file, data offset, shape) of every BF16 tensor of the folder's safetensors (header only)."""
    out: dict[str, tuple[Path, int, tuple[int, ...]]] = {}
    for p in sorted(folder.glob("*.safetensors")):
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, h in header.items():
            if name == "__metadata__":
                continue
            if h["dtype"] != "BF16":
                raise SystemExit(f"{p.name}: {name} is {h['dtype']}, expected BF16")
            out[name] = (p, 8 + n + h["data_offsets"][0], tuple(h["shape"]))
    return out


def rows(path: Path, offset: int, shape: tuple[int, ...], start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a row-major bf16 tensor as a copy-on-write uint16 memmap (nothing read yet)."""
    row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    return np.memmap(
        path, dtype="<u2", mode="c", offset=offset + start * row * 2, shape=(stop - start, *shape[1:])
    )


class AnonPeak:
    """Samples this process's anonymous RSS (``RssAnon`` of /proc/self/status) every 20 ms: the memory a
    rank really takes (its file-backed pages are the source's page cache, counted in ru_maxrss too)."""

    def __init__(self) -> None:
        import threading

        self.peak, self._stop = 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            with open("/proc/self/status") as f:
                kb = next(int(ln.split()[1]) for ln in f if ln.startswith("RssAnon:"))
            self.peak = max(self.peak, kb)

    def stop(self) -> int:
        """Peak anonymous RSS in MB."""
        self._stop.set()
        self._t.join()
        return self.peak // 1024


def rank_main(src: Path, out: Path, paddle_layout: bool = False) -> None:
    """One rank: its quarter of every 2-D tensor (of its transpose for nn.Linear weights under
    ``paddle_layout``), the 1-D ones whole, then save_state_dict."""
    import paddle
    import paddle.distributed as dist
    from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight

    paddle.set_device("cpu")
    dist.init_parallel_env()
    anon = AnonPeak()
    r, n = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    sd, maps = {}, []
    for name, (path, off, shape) in st_tensors(src).items():
        if turned(name, shape, paddle_layout):
            q = shape[1] // n
            if shape[1] % n:
                raise SystemExit(f"{name}: {shape[1]} columns do not divide by {n}")
            full = rows(path, off, shape, 0, shape[0])
            local, goff = np.ascontiguousarray(full[:, r * q : (r + 1) * q].T), (r * q, 0)
            shape = (shape[1], shape[0])
            del full
        elif len(shape) == 2:
            if shape[0] % n:
                raise SystemExit(f"{name}: {shape[0]} rows do not divide by {n}")
            q = shape[0] // n
            local, goff = rows(path, off, shape, r * q, (r + 1) * q), (r * q, 0)
        else:
            local, goff = rows(path, off, shape, 0, shape[0]), (0,) * len(shape)
        maps.append(local)  # the tensor shares these mapped pages: keep them alive until the save
        t = paddle.Tensor(local, zero_copy=True)  # a uint16 array becomes a paddle bfloat16 tensor
        if t.dtype != paddle.bfloat16:
            raise SystemExit(f"{name}: paddle made {t.dtype} of uint16 bits, expected bfloat16")
        sd[name] = ShardedWeight(
            key=name, local_tensor=t, local_shape=tuple(t.shape), global_shape=shape, global_offset=goff
        )
    t1 = time.perf_counter()
    dist.save_state_dict(sd, str(out))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"RANK {r} map {t1 - t0:.1f} s, save {time.perf_counter() - t1:.1f} s, peak RSS {peak:.0f} MB"
        f" (anonymous {anon.stop()} MB), local data {sum(m.nbytes for m in maps) / 1e6:.0f} MB",
        flush=True,
    )


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch(src: Path, out: Path, n: int = RANKS, paddle_layout: bool = False) -> list[str]:
    """Run ``n`` ranks of :func:`rank_main`; returns their RANK lines."""
    ports = free_ports(n)
    eps = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs = []
    for r in range(n):
        env = dict(
            os.environ,
            PADDLE_TRAINER_ID=str(r),
            PADDLE_RANK_IN_NODE=str(r),
            PADDLE_TRAINERS_NUM=str(n),
            PADDLE_TRAINER_ENDPOINTS=eps,
            PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{ports[r]}",
            PADDLE_MASTER=f"127.0.0.1:{ports[0]}",
            PADDLE_DISTRI_BACKEND="gloo",
            CUDA_VISIBLE_DEVICES="",
        )
        cmd = [sys.executable, __file__, "--rank", str(src), str(out)]
        cmd += ["--paddle-layout"] if paddle_layout else []
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    lines = []
    for r, p in enumerate(procs):
        log = p.communicate()[0].decode(errors="replace")
        if p.returncode != 0:
            raise SystemExit(f"rank {r} failed ({p.returncode}):\n{log[-3000:]}")
        lines += [ln for ln in log.splitlines() if ln.startswith("RANK ")]
    return lines


def check(src: Path, model_state: Path, paddle_layout: bool = False) -> int:
    """load_state_dict (one process) of the flex folder == the source safetensors (transposed where
    :func:`turned`), bit for bit."""
    import paddle

    paddle.set_device("cpu")
    tensors = st_tensors(src)
    sd = {
        name: paddle.zeros(shape[::-1] if turned(name, shape, paddle_layout) else shape, dtype="bfloat16")
        for name, (_, _, shape) in tensors.items()
    }
    paddle.distributed.load_state_dict(sd, str(model_state))
    bad = []
    for name, (path, off, shape) in tensors.items():
        want = np.asarray(rows(path, off, shape, 0, shape[0]))
        if not np.array_equal(
            sd[name].view(paddle.uint16).numpy(),
            want.T if want.ndim == 2 and turned(name, shape, paddle_layout) else want,
        ):
            bad.append(name)
    print(f"check: {len(tensors) - len(bad)}/{len(tensors)} tensors equal the source bit for bit", flush=True)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="60l", help="2l or 60l: bench/_work/ckpt_<L> (make_checkpoints.py)")
    ap.add_argument("--out-dir", type=Path, default=WORK)
    ap.add_argument("--check", action="store_true", help="compare load_state_dict with the source")
    ap.add_argument(
        "--paddle-layout", action="store_true", help="nn.Linear weights [in, out], as the Trainer"
    )
    ap.add_argument("--rank", nargs=2, type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        rank_main(*a.rank, paddle_layout=a.paddle_layout)
        return 0
    src = a.out_dir / f"ckpt_{a.ckpt}"
    if not (src / "config.json").is_file():
        print(f"missing {src}: run python bench/make_checkpoints.py --layers {a.ckpt[:-1]}", file=sys.stderr)
        return 2
    out = a.out_dir / (f"flex_{a.ckpt}" + ("_paddle" if a.paddle_layout else ""))
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model_state = tmp / "checkpoint-1" / "model_state"
    model_state.mkdir(parents=True)
    t0 = time.perf_counter()
    for line in launch(src, model_state, paddle_layout=a.paddle_layout):
        print(line, flush=True)
    shutil.copy2(src / "config.json", tmp / "config.json")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    size = sum(p.stat().st_size for p in (out / "checkpoint-1" / "model_state").iterdir())
    print(f"wrote {out}: {size / 1e9:.3f} GB in {time.perf_counter() - t0:.1f} s", flush=True)
    return check(src, out / "checkpoint-1" / "model_state", a.paddle_layout) if a.check else 0


if __name__ == "__main__":
    sys.exit(main())
