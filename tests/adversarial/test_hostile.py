"""The crafted-hostile corpus (``tests/support/hostile``, issue 18): every case through each of its commands,
with the exit code it must give.

The runs happen once per module in worker children (``adversarial_support.CliWorker``, one per core, RLIMIT_AS
2 GB, an alarm of the case's ``timeout`` per run), as ``test_corrupt_corpus.py`` does. A worker whose peak
memory passed ``MAX_RSS`` is replaced, so one case's excess is not blamed on the next. Each parametrized test
then judges one (case, command): the exit code, the one error line (names, a fix), no hang, no traceback, the
input unchanged (FIFOs and links included: the fingerprint never opens a special file), nothing left beside
``--out`` after a refusal, peak memory under 1 GiB.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest
from support import adversarial_support as av
from support import hostile

MAX_RSS = 1024**3  # issue 18: "no run over 1 GB on a small input"
CASES = hostile.cases()
BY_NAME = {c.name: c for c in CASES}


def fingerprint(root: Path) -> dict[str, str]:
    """Every entry below ``root`` (not following links) as type + size + mtime + sha256 of regular files.
    Never opens a FIFO or a device: a hostile input must not hang the test that judges it."""
    out: dict[str, str] = {}
    if not os.path.lexists(root):
        return {".": "<absent>"}
    todo = [root]
    while todo:
        p = todo.pop()
        st = os.lstat(p)
        rel = p.relative_to(root).as_posix()
        if stat.S_ISDIR(st.st_mode):
            out[rel] = "<dir>"
            todo += sorted(p.iterdir())
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = f"<link {os.readlink(p)}>"
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[rel] = f"{st.st_size}:{st.st_mtime_ns}:{h.hexdigest()}"
        else:
            out[rel] = f"<special {stat.S_IFMT(st.st_mode):o}>"
    return out


def _rss_limit(case: hostile.Hostile) -> int:
    """The peak memory a run of ``case`` may reach: its own bound, else the corpus' :data:`MAX_RSS`."""
    return case.max_rss or MAX_RSS


def _argv(case: hostile.Hostile, command: str, ckpt: Path, out: Path) -> list:
    extra = list(case.extra.get(command, ()))
    if command == "verify":
        return ["verify", ckpt.parent / case.base if case.base else ckpt, ckpt, *extra]
    if command == "convert":
        return ["convert", ckpt, "--to", "paddleformers", "--out", out, "--quiet", *extra]
    return av.command_argv(command, ckpt, out, extra)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hostile")
    inputs = {}
    for c in CASES:
        dest = root / "in" / c.name
        dest.mkdir(parents=True)
        inputs[c.name] = c.build(dest)
    before = {n: fingerprint(p.parent) for n, p in inputs.items()}
    local = threading.local()
    workers: list[av.CliWorker] = []
    lock = threading.Lock()

    def job(name: str, command: str) -> dict:
        w = getattr(local, "worker", None)
        if w is None:
            w = local.worker = av.CliWorker()
            with lock:
                workers.append(w)
        out = root / "out" / f"{name}.{command}"
        out.parent.mkdir(parents=True, exist_ok=True)
        if BY_NAME[name].out is not None:  # the case's own --out (a symbolic link, ...)
            BY_NAME[name].out(out)
        out_before = av.tree_state(out) if os.path.lexists(out) else None
        run = w.run(_argv(BY_NAME[name], command, inputs[name], out), timeout=BY_NAME[name].timeout)
        if run.maxrss > _rss_limit(BY_NAME[name]):
            w.close()  # a fresh worker for the next run: its high-water mark starts again
        return {"run": run, "out": out, "out_before": out_before}

    jobs = [(c.name, cmd) for c in CASES for cmd in c.commands]
    try:
        with cf.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            futs = {pool.submit(job, n, cmd): (n, cmd) for n, cmd in jobs}
            results = {futs[f]: f.result() for f in cf.as_completed(futs)}
    finally:
        for w in workers:
            w.close()
    return {"inputs": inputs, "before": before, "results": results}


def test_corpus_covers_every_kind() -> None:
    kinds = {c.kind for c in CASES}
    assert len(CASES) >= 1, "no hostile case is defined"
    assert all(c.codes(cmd) for c in CASES for cmd in c.commands), "a case allows no exit code"
    assert 70 not in {code for c in CASES for cmd in c.commands for code in c.codes(cmd)}, kinds


@pytest.mark.parametrize(
    ("name", "command"),
    [pytest.param(c.name, cmd, id=f"{c.name}-{cmd}") for c in CASES for cmd in c.commands],
)
def test_hostile(corpus: dict, name: str, command: str) -> None:
    case = BY_NAME[name]
    res = corpus["results"][(name, command)]
    run, out = res["run"], res["out"]
    codes = case.codes(command)
    bad = []
    if run.rc is None:
        bad.append(f"hung: no exit within {case.timeout:.0f}s")
    elif run.rc not in codes:
        bad.append(f"exit {run.rc}, expected {' or '.join(map(str, sorted(codes)))}")
    if command == "verify" and run.rc == 7:  # differences named on stdout, one summary line on stderr
        bad += [f"stdout does not name {n}" for n in case.names if n not in run.stdout]
        lines = [x for x in run.stderr.splitlines() if x.strip()]
        if len(lines) != 1 or not lines[0].startswith("tietool: verify:"):
            bad.append("stderr is not one 'tietool: verify:' line")
    elif run.rc not in (0, None):
        bad += av.check_refused(run, run.rc, case.names, out=out, out_before=res["out_before"])
    elif av.TRACEBACK in run.stderr:
        bad.append("a Python traceback was printed")
    limit = _rss_limit(case)
    if run.maxrss > limit:
        bad.append(f"peak memory {run.maxrss / 2**20:.0f} MiB > {limit / 2**20:.0f} MiB")
    ckpt = corpus["inputs"][name]
    if fingerprint(ckpt.parent) != corpus["before"][name]:
        bad.append("the input changed")
    assert not bad, f"[{case.kind}] " + "; ".join(dict.fromkeys(bad)) + "\n" + run.describe()
