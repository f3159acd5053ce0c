"""Atomic writes: SIGKILL at random points never harms the input and leaves --out absent or complete; a
full disk gives a clear error and no half checkpoint."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.paths import REPO

from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.verify import verify


def snapshot(d: Path) -> dict[str, str]:
    return {
        p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def _bf16(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def make_sharded_ckpt(d: Path, vocab=4096, hidden=512, layers=4) -> Path:
    """A tied Llama in PaddleFormers layout (bf16, duplicate head), ~40 MB in 3 shards."""
    from tietool.surgery.io.safetensors_io import Source, write_file

    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    emb = _bf16(rng.standard_normal((vocab, hidden)))
    shards = {
        "model-00001-of-00003.safetensors": [("model.embed_tokens.weight", emb)],
        "model-00002-of-00003.safetensors": [
            (f"model.layers.{i}.mlp.down_proj.weight", _bf16(rng.standard_normal((hidden, 4 * hidden))))
            for i in range(layers)
        ]
        + [("model.norm.weight", _bf16(np.ones(hidden)))],
        "model-00003-of-00003.safetensors": [("lm_head.weight", emb.copy())],
    }
    wm, total = {}, 0
    for f, ts in shards.items():
        total += write_file(d / f, [(n, "BF16", a.shape, Source(array=a)) for n, a in ts], None)
        wm.update({n: f for n, _ in ts})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": wm})
    )
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": vocab,
                "hidden_size": hidden,
                "intermediate_size": 4 * hidden,
                "tie_word_embeddings": True,
                "torch_dtype": "bfloat16",
                "paddleformers_version": "1.2.0",
            }
        )
    )
    (d / "tokenizer_config.json").write_text("{}")
    return d


COMMANDS = [["tie"], ["untie"], ["resize", "--vocab", "4200", "--init", "mean", "--seed", "1"]]


def _timed_run(src: Path, out: Path, cmd: list[str]) -> float:
    start = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "tietool", cmd[0], str(src), "--out", str(out), *cmd[1:], "-q"], check=True
    )
    took = time.monotonic() - start
    shutil.rmtree(out)
    return took


def test_sigkill_at_random_points(tmp_path):
    src = make_sharded_ckpt(tmp_path / "in")
    before = snapshot(src)
    rnd = random.Random(1234)
    # kill points are fractions of an uninterrupted run of each command, timed here on this machine
    elapsed = [_timed_run(src, tmp_path / f"timed{k}", cmd) for k, cmd in enumerate(COMMANDS)]
    complete = killed = i = 0
    scale = 1.0  # adapts when the machine's load changes after the timing: both outcomes must be covered
    # 30 runs (54 until the suite's time mattered), each a fresh interpreter; more until both outcomes
    # were seen often enough
    while i < 30 or ((killed < 10 or complete < 5) and i < 160):
        cmd = COMMANDS[i % len(COMMANDS)]
        out = tmp_path / f"out{i}"
        p = subprocess.Popen(
            [sys.executable, "-m", "tietool", cmd[0], str(src), "--out", str(out), *cmd[1:], "-q"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rnd.uniform(0.05, 1.25) * elapsed[i % len(COMMANDS)] * scale)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
            scale *= 1.1 if complete < 5 else 1.0
        else:
            scale *= 0.9 if killed < 10 else 1.0
        p.wait()
        assert snapshot(src) == before, f"run {i} ({cmd[0]}): the input changed"
        if out.exists():
            complete += 1
            assert (out / "tietool-report.json").exists(), f"run {i}: --out exists but has no report"
            assert verify(src, out).explained, f"run {i}: --out exists but is not a valid {cmd[0]} output"
        i += 1
    assert killed >= 10 and complete >= 5, (killed, complete)
    # leftover temporary folders are named as such and removed by the next run for the same --out
    leftovers = [p for p in tmp_path.iterdir() if ".tietool-tmp-" in p.name]
    for p in leftovers:
        name = p.name[1 : p.name.index(".tietool-tmp-")]
        r = subprocess.run(
            [sys.executable, "-m", "tietool", "tie", str(src), "--out", str(tmp_path / name), "-q"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if not (tmp_path / name).exists():
            continue  # its --out completed earlier; the name is taken
        assert r.returncode == 0, r.stderr
        assert not p.exists(), f"stale temporary folder {p.name} was not cleaned"


@pytest.mark.parametrize("where", ["copy", "write"])
def test_disk_full_leaves_nothing(tmp_path, monkeypatch, where):
    from typer.testing import CliRunner

    from tietool.cli.app import app
    from tietool.surgery.io import safetensors_io

    src = make_sharded_ckpt(tmp_path / "in", vocab=256, hidden=64, layers=1)
    before = snapshot(src)

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "copy":
        from tietool.surgery.write import copy as copies
        from tietool.surgery.write import writer

        # the writer binds copy_file by name when it is imported: imported here first, so a run that imports
        # it under the patch cannot keep the patched function for every later test of this process
        monkeypatch.setattr(copies, "copy_file", enospc)
        monkeypatch.setattr(writer, "copy_file", enospc)
    else:
        # every tensor byte a rewritten shard gets goes through Source.write_to
        monkeypatch.setattr(safetensors_io.Source, "write_to", enospc)
    out = tmp_path / "out"
    args = ["untie"] if where == "copy" else ["resize", "--vocab", "300", "--init", "zeros"]
    r = CliRunner().invoke(app, [args[0], str(src), "--out", str(out), *args[1:]])
    assert r.exit_code == 6, r.output
    assert "no space left" in r.output.lower()
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".tietool-tmp-" in p.name]
    assert snapshot(src) == before
    Checkpoint.open(src)


@pytest.mark.parametrize("command", ["convert", "merge"])
def test_convert_and_merge_say_when_they_remove_a_dead_runs_temporary_folder(tmp_path, command):
    """A killed run's temporary folder beside --out is removed by the next convert/merge, which says so (a
    note, and ``removed_stale_temps`` in the report and --json); a live run's is left alone (issue 18 item
    8: they removed it silently)."""
    from support.paths import DATA

    dead = tmp_path / ".old.tietool-tmp-999999999"  # no such process
    alive = tmp_path / f".busy.tietool-tmp-{os.getpid()}"
    for d in (dead, alive):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\0" * 64)
    if command == "convert":
        args = ["convert", str(REPO / "tests/data/fixtures/cases/pf_llama_tied_fp32"), "--to", "paddlenlp"]
    else:
        args = ["merge", str(DATA / "tp_ranks" / "llama_fp32" / "tp2")]
    run = [sys.executable, "-m", "tietool", *args]
    r = subprocess.run([*run, "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    note = f"note: removed {dead}, the temporary folder of an interrupted run (its process is gone)"
    assert note in r.stdout, r.stdout
    assert json.loads((tmp_path / "out" / "tietool-report.json").read_text())["removed_stale_temps"] == [
        str(dead)
    ]
    assert not dead.exists() and alive.exists()
    dead.mkdir()
    r = subprocess.run(
        [*run, "--out", str(tmp_path / "out2"), "--json"], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 0 and json.loads(r.stdout)["removed_stale_temps"] == [str(dead)], r.stderr
    r = subprocess.run([*run, "--out", str(tmp_path / "out3")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "interrupted run" not in r.stdout


def test_an_interrupt_during_the_final_rename_is_held_back_and_said(tmp_path, monkeypatch):
    """Ctrl-C while the output is renamed into place (here: sent while the parent folder is fsynced, right
    after the rename): it is held back to the end of the step, and the interruption says the output is
    complete, not "nothing was written" (issue 18 item 2, for --out)."""
    import os
    import signal

    import tietool
    from tietool.surgery import run
    from tietool.surgery.write import publish

    # run binds fsync_dir by name: imported before the patch, it keeps the real one for later tests
    assert run.fsync_dir is publish.fsync_dir
    src = make_sharded_ckpt(tmp_path / "in", vocab=256, hidden=64, layers=1)
    out = tmp_path / "out"
    real = publish.fsync_dir

    def fsync_and_interrupt(p):
        if Path(p) == tmp_path:  # the parent folder, after the rename
            os.kill(os.getpid(), signal.SIGINT)
        real(p)

    monkeypatch.setattr(publish, "fsync_dir", fsync_and_interrupt)
    with pytest.raises(KeyboardInterrupt) as e:
        tietool.tie(src, out)
    assert isinstance(e.value, tietool.surgery.model.errors.Interrupted)
    assert e.value.state == f"the output {out} was written completely just before"
    assert verify(src, out).explained and not [p for p in tmp_path.iterdir() if ".tietool-tmp-" in p.name]


def _fail_folder_fsync(monkeypatch, code: int, when) -> list[str]:
    """Make ``os.fsync`` of a folder fail with ``OSError(code)`` when ``when(path_of_the_folder)`` holds
    (files fsync as usual): an injection at the syscall itself, so the real ``fsync_dir`` runs. Returns the
    folders it failed for."""
    import stat

    real, failed = os.fsync, []

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            p = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if when(p):
                failed.append(str(p))
                raise OSError(code, os.strerror(code))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return failed


def test_eio_at_the_folder_fsync_after_the_rename_fails_the_write(tmp_path, monkeypatch):
    """EIO when the output's parent folder is fsynced after the output was renamed into place: the rename
    may not survive a crash, so the write fails (OutputError, exit 6) naming that folder, and the output
    is removed (nothing left behind, the input untouched)."""
    import tietool

    src = make_sharded_ckpt(tmp_path / "in", vocab=256, hidden=64, layers=1)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    out = tmp_path / "out"
    failed = _fail_folder_fsync(monkeypatch, errno.EIO, lambda p: p == tmp_path and out.exists())
    with pytest.raises(tietool.OutputError) as e:
        tietool.tie(src, out)
    assert failed == [str(tmp_path)] and e.value.exit_code == 6
    assert str(tmp_path) in str(e.value) and "fsynced" in str(e.value), str(e.value)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_einval_at_every_folder_fsync_is_harmless(tmp_path, monkeypatch):
    """EINVAL (a file system that cannot fsync a folder) at every folder fsync: ignored, the write succeeds
    and verifies (exit 0)."""
    import tietool

    src = make_sharded_ckpt(tmp_path / "in", vocab=256, hidden=64, layers=1)
    out = tmp_path / "out"
    failed = _fail_folder_fsync(monkeypatch, errno.EINVAL, lambda p: True)
    tietool.tie(src, out)
    assert str(tmp_path) in failed and verify(src, out).explained
