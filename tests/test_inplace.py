"""In place: ``tietool resize --vocab N`` inside a checkpoint folder (CKPT defaults to the current folder,
``--out`` is optional) rewrites it crash-safely, keeps the previous version as a backup that shares the
untouched files' inodes, and a SIGKILL at any moment leaves a complete checkpoint (old or new) under the
original name, with what the killed run left put right by the next run."""

from __future__ import annotations

import contextlib
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

import pytest

import tietool
from tietool.surgery import inplace

FIX = Path(__file__).resolve().parent / "data" / "fixtures" / "cases"
REPORT = "tietool-report.json"


def _cli(*args: object, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tietool", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {}), **({"PWD": str(cwd)} if cwd else {})},
    )


def _digest(folder: Path, skip_report: bool = True) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and not (skip_report and p.name == REPORT)
    }


def _copy(name: str, dst: Path) -> Path:
    shutil.copytree(FIX / name, dst)
    return dst


def _leftovers(parent: Path, name: str) -> list[str]:
    """What runs left beside checkpoint ``name``, the lock file aside (it stays, by design)."""
    return sorted(
        p.name
        for p in parent.iterdir()
        if (p.name.startswith(f".{name}") or ".tietool-tmp-" in p.name) and p.name != f".{name}.tietool-lock"
    )


@pytest.mark.parametrize(
    "fixture, args",
    [
        ("pf_llama_tied_sharded", ["tie"]),
        ("pf_llama_tied_bf16", ["untie"]),
        ("pf_llama_untied_sharded", ["resize", "--vocab", "200", "--seed", "1"]),
        ("pnlp_llama_untied", ["resize", "--pad-to-multiple-of", "64", "--seed", "1"]),
    ],
    ids=lambda x: x if isinstance(x, str) else " ".join(x[:1]),
)
def test_in_place_from_inside_equals_out_and_keeps_a_backup(tmp_path, fixture, args):
    ref = tmp_path / "ref"
    r = _cli(*args[:1], FIX / fixture, *args[1:], "--out", ref, "-q")
    assert r.returncode == 0, r.stderr
    ck = _copy(fixture, tmp_path / "ckpt")
    before = _digest(ck, skip_report=False)
    r = _cli(*args, "-q", cwd=ck)  # CKPT defaults to the current folder, no --out: in place
    assert r.returncode == 0, r.stderr
    assert _digest(ck) == _digest(ref)  # the same checkpoint as --out writes
    backups = sorted(tmp_path.glob("ckpt.tietool-backup-*"))
    assert len(backups) == 1 and _digest(backups[0], skip_report=False) == before
    rep = json.loads((ck / REPORT).read_text())
    assert rep["in_place"]["backup"] == str(backups[0]) and rep["in_place"]["written"] is True
    assert f"the previous version is {backups[0]}" in r.stdout and "cd ." in r.stdout
    # untouched weight files are the backup's own inodes (hard links): only rewritten files cost bytes
    files = rep["files"]
    weights = [f.name for f in ck.iterdir() if f.suffix in (".safetensors", ".pdparams")]
    linked_weights = [f for f in files["linked"] if f in weights]
    assert sorted(weights) == sorted(linked_weights + files["rewritten"] + files["written"])
    backup_inodes = {f.stat().st_ino for f in backups[0].iterdir()}
    assert all((ck / f).stat().st_ino in backup_inodes for f in files["linked"])
    if len(weights) > 2:
        assert len(files["linked"]) >= len(weights) - 2  # a sharded checkpoint: most shards untouched
    assert _leftovers(tmp_path, "ckpt") == []


def test_no_backup_and_api_in_place(tmp_path):
    ck = _copy("pf_llama_tied_fp32", tmp_path / "ckpt")
    rep = tietool.tie(ck, backup=False)
    assert rep["in_place"]["backup"] is None and "lm_head.weight" not in json.dumps(rep["added"])
    assert not list(tmp_path.glob("ckpt.tietool-backup-*"))
    assert tietool.verify(FIX / "pf_llama_tied_fp32", ck).explained
    again = tietool.tie(ck)  # already tied, no head: nothing to change, nothing written
    assert again["in_place"]["written"] is False and not list(tmp_path.glob("ckpt.tietool-backup-*"))


def test_no_backup_refuses_to_delete_training_state(tmp_path):
    ck = _copy("pf_llama_untied_fp32", tmp_path / "ckpt")
    (ck / "optimizer.pdopt").write_bytes(b"\0" * 64)
    before = _digest(ck)
    r = _cli("resize", ck, "--vocab", "128", "--no-backup", "-q")
    assert r.returncode == 5 and "optimizer.pdopt" in r.stderr and r.stderr.count("\n") == 1
    assert _digest(ck) == before and _leftovers(tmp_path, "ckpt") == []
    r = _cli("resize", ck, "--vocab", "128", "-q")  # with the backup it is kept there
    assert r.returncode == 0, r.stderr
    (bak,) = tmp_path.glob("ckpt.tietool-backup-*")
    assert (bak / "optimizer.pdopt").exists() and not (ck / "optimizer.pdopt").exists()


# ------------------------------------------------------------------------------- SIGKILL at random points

KILL_RUNS = 56
ARGS = ["resize", "--vocab", "172", "--seed", "5", "-q"]


def _states(tmp_path: Path) -> tuple[dict, dict, float]:
    """Digests of the old checkpoint and of the new one an uninterrupted in-place run makes, and how long
    that run takes on this machine with the test's pauses (the kill points are fractions of it, so they
    span the whole run on a fast machine and on a slow one)."""
    old = _copy("pf_llama_untied_sharded", tmp_path / "old")
    new = _copy("pf_llama_untied_sharded", tmp_path / "new")
    start = time.monotonic()
    r = _cli(*ARGS, new, "--no-backup", env={"TIETOOL_INPLACE_PAUSE": "0.05"})
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    return _digest(old), _digest(new), elapsed


def test_sigkill_at_random_points_leaves_old_or_new(tmp_path):
    old, new, elapsed = _states(tmp_path)
    rng = random.Random(20261130)
    seen = {"old": 0, "new": 0, "missing": 0}
    scale, i = 1.0, 0  # adapts when the machine's load changes after the timing: both outcomes must be seen
    while i < KILL_RUNS or ((seen["old"] == 0 or seen["new"] == 0) and i < 3 * KILL_RUNS):
        work = tmp_path / f"k{i}"
        work.mkdir()
        ck = _copy("pf_llama_untied_sharded", work / "ckpt")
        fallback = i % 2 == 1  # half the runs use the two-rename fallback
        env = {"TIETOOL_INPLACE_PAUSE": "0.05", **({"TIETOOL_NO_EXCHANGE": "1"} if fallback else {})}
        p = subprocess.Popen(
            [sys.executable, "-m", "tietool", *ARGS, str(ck)],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.15, 1.1) * elapsed * scale)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if ck.exists():
            state = _digest(ck)
            assert state in (old, new), f"run {i}: the original name holds a mix"
            seen["old" if state == old else "new"] += 1
            scale *= 0.9 if seen["old"] == 0 and state == new else 1.1 if seen["new"] == 0 else 1.0
        else:
            assert fallback, f"run {i}: the folder is missing after an atomic exchange"
            seen["missing"] += 1
        # the next run puts right what was left: the folder is back, temporaries are gone, backups are old
        rec = inplace.recover(ck)
        assert ck.exists() and _digest(ck) in (old, new), f"run {i}: {rec}"
        assert _leftovers(work, "ckpt") == [], f"run {i}"
        for bak in work.glob("ckpt.tietool-backup-*"):
            assert _digest(bak) == old, f"run {i}: a backup is not the old version"
        shutil.rmtree(work)
        i += 1
    # the random points covered both outcomes (the delays span the whole run, measured above)
    assert seen["old"] > 0 and seen["new"] > 0, seen


def test_next_run_removes_dead_temporary_folders_and_says_so(tmp_path):
    dead = tmp_path / ".old-out.tietool-tmp-999999999"  # no such process
    alive = tmp_path / f".busy.tietool-tmp-{os.getpid()}"  # this test's own process: still running
    for d in (dead, alive):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\0" * 1024)
    r = _cli("tie", FIX / "pf_llama_tied_fp32", "--out", tmp_path / "out", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["removed_stale_temps"] == [str(dead)]
    assert not dead.exists() and alive.exists()
    r = _cli("tie", FIX / "pf_llama_tied_fp32", "--out", tmp_path / "out2")
    assert r.returncode == 0 and "interrupted run" not in r.stdout


def test_in_place_refuses_a_backup_folder(tmp_path):
    """A shell that stood in the checkpoint during an earlier in-place run is in the backup now: a run there
    is refused (it would rewrite the backup), naming the checkpoint."""
    ck = _copy("pf_llama_untied_fp32", tmp_path / "ckpt")
    assert _cli("resize", "--vocab", "128", "-q", cwd=ck).returncode == 0
    (bak,) = tmp_path.glob("ckpt.tietool-backup-*")
    before = _digest(bak, skip_report=False)
    r = _cli("resize", "--vocab", "160", "-q", cwd=bak)
    assert r.returncode == 5 and "the checkpoint is ckpt" in r.stderr, r.stderr
    assert _digest(bak, skip_report=False) == before


# ------------------------------------------------------------------------------- one run at a time


def test_second_run_refuses_while_one_holds_the_lock(tmp_path):
    """A run holding the checkpoint's lock (here the test) makes a second in-place run refuse at once, in one
    line naming the holder's pid; the checkpoint is untouched."""
    import fcntl

    ck = _copy("pf_llama_untied_fp32", tmp_path / "ckpt")
    before = _digest(ck, skip_report=False)
    fd = os.open(tmp_path / ".ckpt.tietool-lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        r = _cli("resize", "--vocab", "128", "-q", cwd=ck)
    finally:
        os.close(fd)
    assert r.returncode == 5 and r.stderr.count("\n") == 1, r.stderr
    assert (
        "another tietool run (pid 4242) is rewriting ckpt" in r.stderr and "wait for it to finish" in r.stderr
    )
    assert _digest(ck, skip_report=False) == before and _leftovers(tmp_path, "ckpt") == []
    assert not list(tmp_path.glob("ckpt.tietool-backup-*"))
    r = _cli("resize", "--vocab", "128", "-q", cwd=ck)  # the lock released: the run goes ahead
    assert r.returncode == 0, r.stderr


def test_two_runs_at_once_the_second_refuses_and_the_first_counts(tmp_path):
    """A slow in-place run (TIETOOL_INPLACE_PAUSE) and a second one started meanwhile: the second refuses
    naming the first's pid, the first's change is what the folder holds."""
    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    lock = tmp_path / ".ckpt.tietool-lock"
    env = {**os.environ, "TIETOOL_INPLACE_PAUSE": "2"}
    slow = subprocess.Popen(
        [sys.executable, "-m", "tietool", *ARGS, str(ck)], env=env, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().strip() == str(slow.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    r = _cli("tie", ck, "--keep", "embedding", "-q")
    assert slow.wait(timeout=120) == 0, slow.stderr.read() if slow.stderr else ""
    assert r.returncode == 5 and f"another tietool run (pid {slow.pid})" in r.stderr, r.stderr
    assert json.loads((ck / REPORT).read_text())["operation"] == "resize"
    assert len(list(tmp_path.glob("ckpt.tietool-backup-*"))) == 1 and _leftovers(tmp_path, "ckpt") == []


def test_a_folder_replaced_during_the_run_is_not_swapped_over(tmp_path):
    """Something that takes no lock replaces the folder while the new version is written: the run refuses
    before the swap, removes its new version and leaves the replacement alone."""
    ck = _copy("pf_llama_untied_fp32", tmp_path / "ckpt")

    @contextlib.contextmanager
    def replacing(_total: int):
        yield None
        os.rename(ck, tmp_path / "moved")  # the write is done: swap the folder under the name for another
        _copy("pf_llama_tied_fp32", ck)

    with pytest.raises(tietool.RefusedError, match="replaced or removed"):
        tietool.resize(ck, 128, progress=replacing)
    assert _digest(ck) == _digest(FIX / "pf_llama_tied_fp32")
    assert _digest(tmp_path / "moved") == _digest(FIX / "pf_llama_untied_fp32")
    assert _leftovers(tmp_path, "ckpt") == [] and not list(tmp_path.glob("ckpt.tietool-backup-*"))


def test_inspect_says_what_it_put_right(tmp_path):
    """``inspect`` removes what a killed run left, and its text output says so (as the write commands do)."""
    ck = _copy("pf_llama_tied_fp32", tmp_path / "ckpt")
    dead = tmp_path / ".other.tietool-tmp-999999999"  # a killed --out run's temporary folder
    stale = tmp_path / ".ckpt.tietool-new-999999999-abc"  # a killed in-place run's new version (its token)
    for d in (dead, stale):
        d.mkdir()
    (stale / REPORT).write_text(json.dumps({"in_place": {"token": "abc"}}))
    r = _cli("inspect", ck)
    assert r.returncode == 0, r.stderr
    assert f"note: left by an interrupted run: {dead} (removed)" in r.stdout
    assert f"note: left by an interrupted run: {stale} (removed)" in r.stdout
    assert not dead.exists() and not stale.exists()
    assert "interrupted" not in _cli("inspect", ck).stdout


def test_in_place_links_subfolders_and_extra_files(tmp_path):
    """In place, a subfolder and an extra file are hard links to the backup's (no bytes copied), a relative
    symlink to another extra file stays a symlink, and the report counts them as linked."""
    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    (ck / "checkpoint-100").mkdir()
    (ck / "checkpoint-100" / "notes.bin").write_bytes(b"\1" * 4096)
    (ck / "extra.txt").write_text("extra\n")
    (ck / "extra-link.txt").symlink_to("extra.txt")
    r = _cli(*ARGS, ck, "--json")
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    (bak,) = tmp_path.glob("ckpt.tietool-backup-*")
    for rel in ("checkpoint-100/notes.bin", "extra.txt"):
        assert (ck / rel).stat().st_ino == (bak / rel).stat().st_ino, rel
        assert rel in files["linked"] and rel not in files["copied"]
    assert os.readlink(ck / "extra-link.txt") == "extra.txt" and files["symlinked"] == ["extra-link.txt"]
    assert files["copied"] == []


def test_in_place_keeps_a_private_checkpoint_private(tmp_path):
    """A 0700 folder of 0600 files stays so in place: folder, rewritten files, new ones (the report)."""
    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    for p in ck.iterdir():
        p.chmod(0o600)
    ck.chmod(0o700)
    r = _cli(*ARGS, ck)
    assert r.returncode == 0, r.stderr
    assert ck.stat().st_mode & 0o777 == 0o700
    assert {p.name: p.stat().st_mode & 0o777 for p in ck.iterdir()} == {p.name: 0o600 for p in ck.iterdir()}
