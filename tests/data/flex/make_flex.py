"""Write the flex-checkpoint fixtures of tests/data/flex with real Paddle (3.3.1), and their oracles.

Run: ``/work/main/.venv/bin/python tests/data/flex/make_flex.py [--out DIR] [--only NAME ...]``
(default DIR = this file's folder). Every folder is written by Paddle itself:

- ``single/``      one process, ``paddle.distributed.save_state_dict``.
- ``ranks2/``      two CPU processes (gloo), ``dist.shard_tensor`` on ProcessMesh([0, 1]) with
                   Shard(0) / Shard(1) / Replicate(), fp32 and bf16, even and uneven splits.
- ``mesh2x2/``     four CPU processes, ProcessMesh([[0, 1], [2, 3]]) with [Shard(0), Shard(1)],
                   [Shard(1), Replicate()], [Replicate(), Replicate()].
- ``trainer_1rank/``, ``trainer_2rank/`` the PaddleFormers 1.2 Trainer (see ``make_trainer.py``).
- ``trainer_bf16_layout/`` a bf16 model with master weights, saved by the Trainer's save methods
                   (see ``make_bf16_layout.py``).

Each folder gets ``oracle.npz`` (what ``paddle.distributed.load_state_dict`` fills into full-size
tensors in ONE process; bf16 kept as its uint16 bits) and ``oracle.json`` (names, global shapes, dtypes).
Tensor values come from ``numpy.random.default_rng(seed)``: the run is deterministic.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # tests/, for support.preload
from support import preload  # noqa: E402

PADDLE = ("paddle",)  # what the rank, single and oracle runs import first (preload's libs)
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # every Paddle run's (one preload server per libs)

# name -> (global shape, dtype, placements per mesh dim), for the 2-rank and the 2x2 runs.
RANKS2 = {
    "rows.fp32": ((6, 4), "float32", ["S0"]),
    "rows.bf16": ((8, 3), "bfloat16", ["S0"]),
    "cols.fp32": ((3, 8), "float32", ["S1"]),
    "cols.bf16": ((4, 6), "bfloat16", ["S1"]),
    "rep.fp32": ((5,), "float32", ["R"]),
    "rep.bf16": ((2, 3), "bfloat16", ["R"]),
    "vec.fp32": ((10,), "float32", ["S0"]),
    "uneven.fp32": ((5, 2), "float32", ["S0"]),
}
MESH2X2 = {
    "grid.fp32": ((4, 6), "float32", ["S0", "S1"]),
    "grid.bf16": ((6, 4), "bfloat16", ["S0", "S1"]),
    "colrep.fp32": ((3, 4), "float32", ["S1", "R"]),
    "rep.bf16": ((3,), "bfloat16", ["R", "R"]),
}
# name -> (global shape, dtype, flattened range per rank): sharding-v2 style flattened slices
# (ShardedWeight(is_flattened=True, flattened_range=slice(a, b)) over the whole tensor, as
# dygraph_sharding_optimizer.py writes optimizer states).
FLAT2 = {
    "flat.fp32": ((5, 3), "float32", [(0, 7), (7, 15)]),
    "flat.bf16": ((4, 4), "bfloat16", [(0, 10), (10, 16)]),
    "flatvec.fp32": ((9,), "float32", [(0, 4), (4, 9)]),
}
SINGLE = {
    "embed.fp32": ((7, 4), "float32"),
    "norm.fp32": ((4,), "float32"),
    "proj.bf16": ((4, 3), "bfloat16"),
    "bias.bf16": ((3,), "bfloat16"),
}


def _values(name: str, shape: tuple[int, ...], dtype: str):  # noqa: ANN202 - paddle tensor
    """The full tensor ``name`` (same on every rank): seeded by the name's bytes, rounded to 1/64."""
    import numpy as np
    import paddle

    seed = sum(name.encode()) * 7919 + len(name)
    arr = (np.random.default_rng(seed).integers(-256, 256, size=shape) / 64.0).astype(np.float32)
    t = paddle.to_tensor(arr)
    return t.astype("bfloat16") if dtype == "bfloat16" else t


def _placements(codes: list[str]):  # noqa: ANN202
    import paddle.distributed as dist

    table = {"S0": dist.Shard(0), "S1": dist.Shard(1), "R": dist.Replicate()}
    return [table[c] for c in codes]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def rank_worker(kind: str, out: str) -> None:
    """One rank of a multi-process save (env vars set by ``run_ranks``)."""
    import paddle
    import paddle.distributed as dist

    paddle.set_device("cpu")
    dist.init_parallel_env()
    if kind == "flat2":
        dist.save_state_dict(_flat_state_dict(dist.get_rank()), out)
        return
    table, mesh = (
        (RANKS2, dist.ProcessMesh([0, 1], dim_names=["x"]))
        if kind in ("ranks2", "ranks2_replicas")
        else (MESH2X2, dist.ProcessMesh([[0, 1], [2, 3]], dim_names=["x", "y"]))
    )
    sd = {}
    for name, (shape, dtype, codes) in table.items():
        # paddle 3.3.1 CPU has no bf16 "Slice" (r_to_s reshard): shard the fp32 values, then cast the
        # distributed tensor (an elementwise op, placements kept).
        t = dist.shard_tensor(_values(name, shape, "float32"), mesh, _placements(codes))
        sd[name] = t.astype("bfloat16") if dtype == "bfloat16" else t
    dist.save_state_dict(sd, out, save_replicas=kind == "ranks2_replicas")


def _flat_state_dict(rank: int) -> dict:
    """This rank's ShardedWeight of every FLAT2 tensor: a 1-D run of its row-major elements."""
    import paddle
    from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight

    sd = {}
    for name, (shape, dtype, ranges) in FLAT2.items():
        a, b = ranges[rank]
        flat = _values(name, shape, "float32").numpy().reshape(-1)[a:b].copy()
        t = paddle.to_tensor(flat)
        t = t.astype("bfloat16") if dtype == "bfloat16" else t
        sd[name] = ShardedWeight(
            key=name,
            local_tensor=t,
            local_shape=shape,
            global_shape=shape,
            global_offset=(0,) * len(shape),
            is_flattened=True,
            flattened_range=slice(a, b),
        )
    return sd


def run_ranks(kind: str, n: int, out: Path) -> None:
    """``n`` ranks of :func:`rank_worker` (``kind``, ``out``)."""
    run_ranks_cmd([sys.executable, __file__, "--worker", kind, str(out)], n)


def run_ranks_cmd(cmd: list[str], n: int, libs: tuple[str, ...] = PADDLE) -> None:
    """Start ``cmd`` in ``n`` processes with the PADDLE_* env of a gloo CPU job; wait for all.

    The ranks are forks of one ``support.preload`` server that imported ``libs`` (what ``cmd`` imports
    first) under the job's common environment; each rank's own variables are set after the fork (paddle
    reads them when the job starts, in ``init_parallel_env``, not at import: the generators' outputs are
    byte-identical either way, ``test_flex_data.py``). ``TIETOOL_TEST_NO_PRELOAD=1``: plain processes."""
    ports = _free_ports(n)
    eps = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs = []
    for r in range(n):
        rank = dict(
            PADDLE_DISTRI_BACKEND="gloo",
            PADDLE_TRAINER_ID=str(r),
            PADDLE_RANK_IN_NODE=str(r),
            PADDLE_TRAINERS_NUM=str(n),
            PADDLE_TRAINER_ENDPOINTS=eps,
            PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{ports[r]}",
            PADDLE_MASTER=f"127.0.0.1:{ports[0]}",
        )
        log = tempfile.TemporaryFile()  # noqa: SIM115 - read and closed below
        proc = preload.popen(cmd, libs=libs, stdout=log, stderr=subprocess.STDOUT, late_env=rank, env=ENV)
        procs.append((proc, log))
    for r, (p, log) in enumerate(procs):
        code = p.wait(timeout=300)
        log.seek(0)
        text = log.read().decode(errors="replace")
        log.close()
        if code != 0:
            raise SystemExit(f"rank {r} of {cmd[1:]} failed ({code}):\n{text[-3000:]}")


def write_single(out: Path) -> None:
    """One process: ``paddle.distributed.save_state_dict`` of plain (non-distributed) tensors."""
    import paddle

    sd = {name: _values(name, shape, dtype) for name, (shape, dtype) in SINGLE.items()}
    paddle.distributed.save_state_dict(sd, str(out))


def metadata_shapes(folder: Path) -> dict[str, tuple[list[int], str]]:
    """Global shape and dtype of every tensor the folder's ``*.metadata`` names (paddle's own reader)."""
    import paddle

    found: dict[str, tuple[list[int], str]] = {}
    for meta in sorted(folder.glob("*.metadata")):
        md = paddle.load(str(meta))
        for name, locs in md.state_dict_metadata.items():
            found[name] = (list(locs[0].global_shape), locs[0].dtype)
    return found


def write_oracle(folder: Path, dest: Path | None = None) -> None:
    """``<dest>.npz`` + ``.json`` (default ``folder/oracle``): ``load_state_dict`` into full-size zeros."""
    import numpy as np
    import paddle

    shapes = metadata_shapes(folder)
    sd = {n: paddle.zeros(s, dtype=d) for n, (s, d) in shapes.items()}
    paddle.distributed.load_state_dict(sd, str(folder))
    arrays = {}
    for n, t in sd.items():
        arrays[n] = t.view("uint16").numpy() if t.dtype == paddle.bfloat16 else t.numpy()
    dest = dest or folder / "oracle"
    with dest.with_suffix(".npz").open("wb") as fh:
        np.savez(fh, **arrays)
    info = {
        "made_by": "paddle.distributed.load_state_dict into paddle.zeros(global_shape, dtype), one process",
        "paddle": paddle.__version__,
        "bf16_stored_as": "uint16 bits",
        "tensors": {n: {"shape": s, "dtype": d} for n, (s, d) in sorted(shapes.items())},
    }
    dest.with_suffix(".json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")


def build(name: str, out: Path) -> None:
    """Write folder ``name`` under ``out`` (replacing it), without its oracles: :func:`write_oracles` makes
    them, in a fresh process, once every folder is written."""
    target = out / name
    shutil.rmtree(target, ignore_errors=True)
    if name == "single":
        _in_subprocess("--single", target)
    elif name == "ranks2":
        run_ranks("ranks2", 2, target)
    elif name == "ranks2_replicas":
        run_ranks("ranks2_replicas", 2, target)
    elif name == "flat2":
        run_ranks("flat2", 2, target)
    elif name == "mesh2x2":
        run_ranks("mesh2x2", 4, target)
    elif name == "trainer_bf16_layout":
        _sibling("make_bf16_layout").make(target, oracle=False)
    elif name == "trainer_tied":
        _sibling("make_trainer").make(target, 1, tied=True, oracle=False)
    elif name.startswith("trainer_"):
        ranks = int(name.removeprefix("trainer_").removesuffix("rank"))
        _sibling("make_trainer").make(target, ranks, oracle=False)
    else:
        raise SystemExit(f"unknown fixture {name}")


def _sibling(name: str):  # noqa: ANN202 - a module
    """``make_trainer`` / ``make_bf16_layout``, called in this process, so that their Paddle runs fork from
    this process' preload servers (one import of paddle + PaddleFormers for all of them)."""
    import importlib

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(name)


def write_oracles(out: Path, names: list[str]) -> None:
    """The oracles of the folders ``names`` under ``out``, all in this one process (a fresh one, that wrote
    none of them: ``--oracles``); the Trainer folders' through their own scripts' functions."""
    sys.path.insert(0, str(HERE))
    import make_bf16_layout
    import make_trainer

    for name in names:
        if name == "trainer_bf16_layout":
            make_bf16_layout.oracles(out / name)
        elif name.startswith("trainer_"):
            make_trainer.write_oracles(out / name)
        else:
            write_oracle(out / name)


def _in_subprocess(flag: str, target: Path, *more: str) -> None:
    cmd = [sys.executable, __file__, flag, str(target), *more]
    preload.run(cmd, libs=PADDLE, check=True, env=ENV, capture_output=True)


ALL = [
    "single",
    "ranks2",
    "ranks2_replicas",
    "flat2",
    "mesh2x2",
    "trainer_1rank",
    "trainer_2rank",
    "trainer_bf16_layout",
    "trainer_tied",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--only", nargs="*", default=ALL)
    ap.add_argument("--worker", nargs=2)
    ap.add_argument("--single", type=Path)
    ap.add_argument("--oracles", type=Path)
    a = ap.parse_args()
    if a.worker:
        rank_worker(*a.worker)
    elif a.single:
        write_single(a.single)
    elif a.oracles:
        write_oracles(a.oracles, a.only)
    else:
        for name in a.only:
            build(name, a.out)
            print("wrote", a.out / name)
        _in_subprocess("--oracles", a.out, "--only", *a.only)
        print("wrote the oracles of", ", ".join(a.only))


if __name__ == "__main__":
    main()
