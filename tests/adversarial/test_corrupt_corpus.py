"""``inspect`` and ``tie`` on every variant of the corrupt corpus (``corrupt_corpus.py``, 200+ variants).

The runs happen once per module in worker children (``adversarial_support.CliWorker``: one per core, each
started with ``RLIMIT_AS`` = 2 GB and running the CLI in-process through ``typer.testing.CliRunner`` on
``tietool.cli.app.app``, with a 30 s alarm per run and a hard deadline behind it), so a hang fails, and an
attempt to allocate a declared huge size fails loudly (MemoryError → exit 70 → failure) instead of passing on
a machine with memory to spare. A Python process per run would cost ~0.4 s each and the corpus would not fit
in three minutes. In-process, "no traceback" means ``result.exception`` is None or a ``SystemExit``. Each
parametrized test then judges one (variant, command):

* no hang, no Python traceback, not killed by a signal;
* exit 0 (a harmless mutation, e.g. a flipped bit inside tensor data), or a non-zero exit with exactly one
  ``tietool: error:`` line on stderr (exit 70, ``tietool: internal error:``, is a failure);
* the input folder byte-identical; after a refusal no ``--out`` and no ``.<out>.tietool-tmp-*`` folder;
* after ``tie`` exits 0, every tensor of the output can be read back by an independent reader (shape × dtype
  matches the bytes), so "exit 0" cannot hide a corrupt output.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from pathlib import Path

import pytest
from support import adversarial_support as av
from support import corrupt_corpus as cc
from support import fixture_support as fs

COMMANDS = ("inspect", "tie")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("corrupt")
    paths = cc.generate(root / "corpus")
    before = {n: av.tree_state(p) for n, p in paths.items()}
    jobs = [(n, c) for n in paths for c in COMMANDS]
    local = threading.local()
    workers: list[av.CliWorker] = []
    lock = threading.Lock()

    def job(name: str, command: str) -> dict:
        if not hasattr(local, "worker"):
            local.worker = av.CliWorker()
            with lock:
                workers.append(local.worker)
        out = root / "out" / f"{name}.{command}"
        out.parent.mkdir(parents=True, exist_ok=True)
        extra = ["--keep", "embedding"] if command == "tie" else []  # also exercise the writer on pdparams
        return {"run": local.worker.run(av.command_argv(command, paths[name], out, extra)), "out": out}

    try:
        with cf.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            futs = {pool.submit(job, n, c): (n, c) for n, c in jobs}
            results = {futs[f]: f.result() for f in cf.as_completed(futs)}
    finally:
        for w in workers:
            w.close()
    return {"root": root, "paths": paths, "before": before, "results": results}


def test_corpus_is_big_enough_and_deterministic(tmp_path: Path) -> None:
    assert len(cc.VARIANTS) >= 100, len(cc.VARIANTS)
    kinds = {v.kind for v in cc.VARIANTS}
    assert {"truncate", "flip", "length", "huge", "dtype", "json", "empty", "dir"} <= kinds, kinds
    names = [v.name for v in cc.VARIANTS if v.kind in ("flip", "truncate")][::7]
    a = cc.generate(tmp_path / "a", names)
    b = cc.generate(tmp_path / "b", names)
    for n in names:
        assert av.tree_state(a[n]) == av.tree_state(b[n]), f"{n} is not deterministic"
    # and each variant really differs from its base fixture
    for v in cc.VARIANTS[::5]:
        base = av.tree_state(av.CASES / cc.BASES[v.base][0])
        d = cc.build(v, tmp_path / "x" / v.name)
        if cc.BASES[v.base][1] is None:
            assert av.tree_state(d) != base, f"{v.name} did not change anything"


def _read_back(out: Path) -> list[str]:
    """Problems reading every tensor of a written checkpoint with the independent readers."""
    bad = []
    for f in fs.weight_files(out):
        try:
            part = fs.read_safetensors(f) if f.suffix == ".safetensors" else fs.read_pdparams(f)
            for name, t in part.items():
                if any(d < 0 for d in t.shape):
                    bad.append(f"{f.name}: {name} has shape {t.shape}")
                    continue
                t.array()  # shape × dtype must match the bytes
        except Exception as e:  # noqa: BLE001 - any failure to read back is the finding
            bad.append(f"{f.name}: {type(e).__name__}: {str(e)[:200]}")
    return bad


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", [v.name for v in cc.VARIANTS])
def test_corrupt_variant(corpus: dict, name: str, command: str) -> None:
    res = corpus["results"][(name, command)]
    run, out = res["run"], res["out"]
    bad = av.check_no_crash(run)
    ckpt = corpus["paths"][name]
    if av.tree_state(ckpt) != corpus["before"][name]:
        bad.append("the input changed")
    if run.rc not in (0, None):
        if out.exists():
            bad.append(f"--out {out.name} exists after a refusal")
        if av.leftovers(out):
            bad.append(f"temporary folders left: {av.leftovers(out)}")
    elif run.rc == 0 and command == "tie":
        bad += [f"exit 0 but the output is unreadable: {p}" for p in _read_back(out)]
    assert not bad, f"[{cc.BY_NAME[name].kind}] " + "; ".join(bad) + "\n" + run.describe()
