"""In place: ``tietool resize --vocab N`` inside a checkpoint folder (CKPT defaults to the current folder,
``--out`` is optional) rewrites it crash-safely, keeps the previous version as a backup that shares the
untouched files' inodes, and a SIGKILL at any moment leaves a complete checkpoint (old or new) under the
original name, with what the killed run left put right by the next run."""

from __future__ import annotations

import contextlib
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

import pytest
from support import cli_runner, paths

import tietool
from tietool.surgery.write import inplace

FIX = paths.CASES_DIR
REPORT = "tietool-report.json"


def _cli(
    *args: object, cwd: Path | None = None, env: dict | None = None, subprocess: bool = False
) -> cli_runner.CliRun:
    """``tietool *args`` (in process unless ``subprocess``). A test that judges the temporary folders a
    run leaves passes ``subprocess=True``: an in-place run names them after its process id, and a later run
    judges them by whether that process is alive (in process, it would be this long-lived one)."""
    return cli_runner.run_cli(
        args,
        subprocess=subprocess,
        cwd=cwd or os.getcwd(),
        env={**(env or {}), **({"PWD": str(cwd)} if cwd else {})},
        timeout=120,
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

# 32 runs killed at random points (56 until the suite's time mattered), each a fresh interpreter; the loop
# goes on past 32 until both outcomes (old, new) were seen
KILL_RUNS = 32
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
        no_backup = ["--no-backup"] if i % 3 == 2 else []  # a third delete the old version
        env = {"TIETOOL_INPLACE_PAUSE": "0.05", **({"TIETOOL_NO_EXCHANGE": "1"} if fallback else {})}
        p = subprocess.Popen(
            [sys.executable, "-m", "tietool", *ARGS, str(ck), *no_backup],
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


# ------------------------------------------------------------------------------- issue 18: faults in place


def _popen(args: list, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tietool", *map(str, args)],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(cond, timeout: float = 60.0, step: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(step)


def _new_under_name(ck: Path) -> bool:
    """The name holds an in-place run's new version (its report carries a token)."""
    return inplace.token_of(ck) is not None


def _staged(parent: Path, name: str) -> bool:
    """A complete staging folder (the new version, published, not yet swapped) is beside ``name``."""
    return any(
        (p / REPORT).exists() and inplace.token_of(p) is not None
        for p in parent.glob(f".{name}.tietool-new-*")
    )


def _with_many_files(ck: Path, n: int) -> Path:
    """``n`` small carried files in a subfolder: the old version's deletion then takes a measurable time."""
    sub = ck / "extra"
    sub.mkdir()
    for k in range(n):
        (sub / f"f{k:05d}.txt").write_bytes(b"x")
    return ck


def test_no_backup_deletion_killed_is_finished_never_adopted_as_backup(tmp_path):
    """SIGKILL at measured points of the old version's deletion (--no-backup): the name always holds the
    new version, and the next run deletes what is left of the old one and says so; it never keeps a
    half-deleted folder as a backup (issue 18 item 1: 17 of 20 kills left one)."""
    args = ["resize", "--vocab", "172", "--seed", "5", "--no-backup", "-q"]
    timed = _with_many_files(_copy("pf_llama_untied_sharded", tmp_path / "timed" / "ckpt"), 1500)
    p = _popen([*args, timed])
    _wait_for(lambda: _deleting(timed.parent) or p.poll() is not None)
    started = time.monotonic()
    _wait_for(lambda: not _deleting(timed.parent), step=0.0005)
    window = time.monotonic() - started  # the deletion, measured
    assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    new = _digest(timed)
    rng = random.Random(18)
    seen_partial, scale, i = 0, 1.0, 0
    while i < 4 or (seen_partial == 0 and i < 10):
        work = tmp_path / f"k{i}"
        ck = _with_many_files(_copy("pf_llama_untied_sharded", work / "ckpt"), 1500)
        p = _popen([*args, ck])
        _wait_for(lambda work=work, p=p: _deleting(work) or p.poll() is not None)
        time.sleep(rng.uniform(0.0, 0.9) * window * scale)
        p.kill()
        p.wait()
        scale *= 1.0 if _deleting(work) else 0.5  # too late (a loaded machine): aim earlier
        assert _digest(ck) == new, f"run {i}: the name does not hold the new version"
        left = [q for q in work.iterdir() if q.name != "ckpt" and not q.name.endswith(".tietool-lock")]
        seen_partial += any(DELETING in q.name for q in left)
        r = _cli("inspect", ck, "--no-values")  # the next run, any command
        assert r.returncode == 0, r.stderr
        for q in left:
            if DELETING in q.name:
                assert f"{q} (the previous version it was deleting; now deleted)" in r.stdout, r.stdout
        for bak in work.glob("ckpt.tietool-backup-*"):  # a kill before the deletion started: complete
            assert sorted(x.name for x in bak.iterdir()) == sorted(FIX_NAMES + ["extra"]), f"run {i}"
            assert len(list((bak / "extra").iterdir())) == 1500, f"run {i}: an incomplete backup"
        assert _leftovers(work, "ckpt") == [], f"run {i}"
        assert not (work / ".ckpt.tietool-lock").exists(), f"run {i}: a killed run's lock file survived"
        shutil.rmtree(work)
        i += 1
    assert seen_partial > 0  # the kills landed in the deletion


DELETING = ".tietool-deleting-"


def _deleting(parent: Path) -> bool:
    """A previous version is being deleted in ``parent`` (its folder renamed to say so)."""
    return any(DELETING in q.name for q in parent.iterdir())


FIX_NAMES = sorted(p.name for p in (FIX / "pf_llama_untied_sharded").iterdir())


@contextlib.contextmanager
def _undeletable(folder: Path):
    """A file in ``folder`` that cannot be deleted (a read-only subfolder; as root, whom permissions do
    not stop, an immutable file: ``chattr +i``)."""
    victim = folder / "pinned.bin"
    victim.write_bytes(b"\1" * 64)
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(victim)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here")
        undo = ["chattr", "-i", str(victim)]
    else:
        folder.chmod(0o500)
        undo = None
    try:
        yield victim
    finally:
        for p in [victim, *victim.parent.parent.parent.glob(f"**/{victim.name}")]:
            if undo is not None:
                subprocess.run(["chattr", "-i", str(p)], capture_output=True)
            else:
                p.parent.chmod(0o700)


def test_no_backup_with_an_undeletable_subfolder_says_the_name_holds_the_new_version(tmp_path):
    """A deletion that fails (a read-only subfolder) does not make the run say "the checkpoint is unchanged":
    the write succeeded (exit 0), a warning names what is left and how to remove it, and the next run
    finishes the deletion once it can (issue 18 item 1)."""
    ck = _copy("pf_llama_tied_fp32", tmp_path / "ckpt")
    (ck / "sub").mkdir()
    with _undeletable(ck / "sub"):
        ref = tmp_path / "ref"
        shutil.copytree(ck, ref)
        r = _cli("tie", ck, "--no-backup", "-q", subprocess=True)
        assert r.returncode == 0, r.stderr
        assert "unchanged" not in r.stdout + r.stderr
        (left,) = [p for p in tmp_path.iterdir() if DELETING in p.name]
        warning = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(warning) == 1 and warning[0].startswith("tietool: warning:"), r.stderr
        assert f"{ck} holds the new version" in warning[0] and str(left) in warning[0]
        assert "rm -rf" in warning[0]
        assert tietool.verify(ref, ck).explained  # the new version, complete
        assert not list(tmp_path.glob("ckpt.tietool-backup-*"))
        if os.geteuid() == 0:  # the new version's copy of the file pinned too (non-root: its folder's mode)
            subprocess.run(["chattr", "+i", str(ck / "sub" / "pinned.bin")], check=True)
        # again, with --json: the warning still on stderr
        r = _cli("untie", ck, "--no-backup", "--json", subprocess=True)
        assert r.returncode == 0 and r.stderr.startswith("tietool: warning:"), r.stderr
        (left2,) = [p for p in tmp_path.iterdir() if DELETING in p.name and p != left]
        assert json.loads(r.stdout)["in_place"]["left_to_delete"] == str(left2)
        # still undeletable: said, not adopted as a backup
        r = _cli("inspect", ck, "--no-values", subprocess=True)
        assert r.returncode == 0 and f"warning: left by an interrupted run: {left}" in r.stdout, r.stdout
        assert left.exists() and not list(tmp_path.glob("ckpt.tietool-backup-*"))
    # deletable now: the next run finishes it
    r = _cli("inspect", ck, "--json", "--no-values", subprocess=True)
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(r.stdout)["recovered"]["finished_deletions"]) == sorted([str(left), str(left2)])
    assert not left.exists() and not left2.exists() and _leftovers(tmp_path, "ckpt") == []


@pytest.mark.parametrize(
    "point, fallback, no_backup, holds",
    [
        ("swap", False, False, "old"),  # before the exchange
        ("swapped", False, False, "new"),  # between the exchange and the backup's rename
        ("renames", True, False, "new"),  # between the fallback's two renames
        ("swapped", False, True, "new"),  # no backup: before the old version is deleted
    ],
    ids=["before-exchange", "after-exchange", "between-renames", "no-backup"],
)
def test_sigterm_inside_the_swap_says_what_the_name_holds(tmp_path, point, fallback, no_backup, holds):
    """SIGTERM at each step of the swap: the one line says what the name holds (by looking), the name is
    never empty (the fallback's two renames defer the signal), and nothing is left behind that the next run
    would not put right (issue 18 item 2: "nothing was written" while the new version was there)."""
    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    old = _digest(ck)
    env = {"TIETOOL_INPLACE_PAUSE": "1.5", "TIETOOL_INPLACE_PAUSE_AT": point}
    env |= {"TIETOOL_NO_EXCHANGE": "1"} if fallback else {}
    p = _popen([*ARGS, ck, *(["--no-backup"] if no_backup else [])], env=env)
    if point == "swap":
        _wait_for(lambda: _staged(tmp_path, "ckpt"))
    elif point == "renames":
        _wait_for(lambda: not ck.exists())
    else:
        _wait_for(lambda: _new_under_name(ck))
    time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tietool: interrupted; "), err
    assert ck.exists()  # never no folder under the name, the fallback included
    if holds == "old":
        assert f"{ck} is unchanged (the previous version)" in lines[0] and _digest(ck) == old
        assert _leftovers(tmp_path, "ckpt") == [] and not list(tmp_path.glob("ckpt.tietool-backup-*"))
        return
    assert f"{ck} holds the new version" in lines[0] and "nothing was written" not in lines[0]
    assert _digest(ck) != old and inplace.token_of(ck) is not None
    backups = list(tmp_path.glob("ckpt.tietool-backup-*"))
    if no_backup:
        (deleting,) = [q for q in tmp_path.iterdir() if DELETING in q.name]
        assert str(deleting) in lines[0] and not backups
        rec = inplace.recover(ck)
        assert rec.finished_deletions == [str(deleting)] and not rec.kept_backups
    else:
        assert len(backups) == 1 and _digest(backups[0]) == old and str(backups[0]) in lines[0]
    assert _leftovers(tmp_path, "ckpt") == []


def _replace_shard(ck: Path) -> None:
    shard = ck / "model-00003-of-00009.safetensors"
    tmp = ck / "incoming.tmp"
    tmp.write_bytes(shard.read_bytes()[:-4] + b"\0\0\0\0")
    os.replace(tmp, shard)  # another process's new file under the shard's name


def _rewrite_shard(ck: Path) -> None:
    shard = ck / "model-00003-of-00009.safetensors"
    with open(shard, "r+b") as f:  # the same inode, rewritten in place
        f.seek(-4, os.SEEK_END)
        f.write(b"\0\0\0\0")
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a coarse clock: still a new mtime


def _add_file(ck: Path) -> None:
    (ck / "model-00010-of-00010.safetensors").write_bytes(b"late")


def _touch_config(ck: Path) -> None:
    cfg = ck / "config.json"
    cfg.write_text(cfg.read_text().replace('"vocab_size"', '"vocab_size" ', 1))


@pytest.mark.parametrize("change", [_replace_shard, _rewrite_shard, _add_file, _touch_config])
@pytest.mark.parametrize("backup", [True, False], ids=["backup", "no-backup"])
def test_a_file_changed_during_the_run_is_never_lost(tmp_path, change, backup):
    """Another process replaces, rewrites or adds a file (or edits config.json) while the new version is
    written: the check before the swap compares the files read (inode, size, mtime), refuses in one
    error naming the file (exit 3), removes the new version and leaves the folder as the other process left
    it (issue 18 item 3: with --no-backup the shard's content existed nowhere)."""
    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    after: dict = {}

    @contextlib.contextmanager
    def meanwhile(_total: int):
        yield None
        change(ck)  # the write is done, the swap not yet
        after.update(_digest(ck))

    with pytest.raises(tietool.CheckpointError, match="while this run read the checkpoint") as e:
        tietool.resize(ck, 172, seed=5, progress=meanwhile, backup=backup)
    assert e.value.exit_code == 3 and e.value.path is not None and e.value.path.startswith(str(ck))
    assert _digest(ck) == after  # what the other process wrote is there, under the name
    assert _leftovers(tmp_path, "ckpt") == [] and not list(tmp_path.glob("ckpt.tietool-backup-*"))
    assert not (tmp_path / ".ckpt.tietool-lock").exists()


def test_a_shard_replaced_at_the_pause_before_the_swap_is_refused(tmp_path):
    """The same through the CLI, the shard replaced while the run waits at its last point before the
    swap: exit 3, one line naming the shard, the replacement kept."""
    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    p = _popen(
        [*ARGS, ck, "--no-backup"], env={"TIETOOL_INPLACE_PAUSE": "1.5", "TIETOOL_INPLACE_PAUSE_AT": "check"}
    )
    _wait_for(lambda: _staged(tmp_path, "ckpt"))
    _replace_shard(ck)
    after = _digest(ck)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert err.count("\n") == 1 and "model-00003-of-00009.safetensors" in err and "replaced" in err, err
    assert _digest(ck) == after and _leftovers(tmp_path, "ckpt") == []


def test_a_killed_runs_lock_file_is_removed_by_the_next_run(tmp_path):
    """A lock file whose holder is dead (no flock on it) is removed by the next run, any command, and said;
    one that a live run holds is left alone (issue 18 item 8)."""
    import fcntl

    ck = _copy("pf_llama_tied_fp32", tmp_path / "ckpt")
    lock = tmp_path / ".ckpt.tietool-lock"
    lock.write_text("999999999\n")  # a killed run's pid
    r = _cli("inspect", ck, "--no-values")
    assert r.returncode == 0, r.stderr
    assert f"note: left by an interrupted run: {lock} (a stale lock file; removed)" in r.stdout
    assert not lock.exists()
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        r = _cli("inspect", ck, "--no-values")
        assert r.returncode == 0 and "stale lock" not in r.stdout and lock.exists()
    finally:
        os.close(fd)
    lock.unlink()
    lock.write_text("")  # empty and recent: perhaps a run that is just taking it; left alone
    assert not inplace.recover(ck).removed_locks and lock.exists()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    assert inplace.recover(ck).removed_locks == [str(lock)] and not lock.exists()


def test_no_space_for_the_lock_file_is_exit_6_and_leaves_no_lock(tmp_path, monkeypatch):
    """A full disk when the lock file's pid is written: exit 6 in one line, no lock file left (issue 18
    item 6: exit 70 and the lock file stayed). In-process, os.pwrite failing as on a full disk."""
    import errno

    from typer.testing import CliRunner

    from tietool.cli.app import app

    ck = _copy("pf_llama_tied_fp32", tmp_path / "ckpt")
    before = _digest(ck, skip_report=False)
    real = os.pwrite

    def full(fd, data, offset):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tietool-lock"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full)
    r = CliRunner().invoke(app, ["tie", str(ck)])
    assert r.exit_code == 6, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no space left" in lines[0] and ".ckpt.tietool-lock" in lines[0], r.output
    assert not (tmp_path / ".ckpt.tietool-lock").exists() and _leftovers(tmp_path, "ckpt") == []
    assert _digest(ck, skip_report=False) == before


def _mount(*args: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount here: {r.stderr.strip()}")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 512 KiB tmpfs at ``tmp_path / "fs"`` (skipped where it cannot be mounted)."""
    fs = tmp_path / "fs"
    fs.mkdir()
    _mount("-t", "tmpfs", "-o", "size=512k", "tmpfs", str(fs))
    yield fs
    subprocess.run(["umount", "-l", str(fs)], capture_output=True)


def test_in_place_on_a_full_tmpfs_is_exit_6_and_leaves_nothing(small_tmpfs):
    """In place with under a page free (a real full tmpfs): exit 6, one line, no lock file, nothing else
    left, the checkpoint unchanged."""
    ck = _copy("pf_llama_tied_fp32", small_tmpfs / "ckpt")
    before = _digest(ck, skip_report=False)
    fd = os.open(small_tmpfs / "filler", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):  # fill the disk, to the last page
        while True:
            os.write(fd, b"\0" * 4096)
    os.close(fd)
    r = _cli("tie", ck)
    assert r.returncode == 6, r.stderr
    assert r.stderr.count("\n") == 1 and "no space left" in r.stderr.lower(), r.stderr
    assert _leftovers(small_tmpfs, "ckpt") == [] and not (small_tmpfs / ".ckpt.tietool-lock").exists()
    assert _digest(ck, skip_report=False) == before


@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_a_mount_point_is_refused_before_writing_and_leaves_nothing(tmp_path, kind):
    """A checkpoint that is a mount point (its own file system, or a bind mount) cannot be renamed, so
    the swap cannot happen: refused at once (exit 6, one line naming --out), nothing copied or left beside
    it (issue 18 item 8: the staging copy stayed)."""
    ck = tmp_path / "ckpt"
    ck.mkdir()
    if kind == "tmpfs":
        _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ck))
    else:
        (tmp_path / "real").mkdir()
        _mount("--bind", str(tmp_path / "real"), str(ck))
    try:
        for p in (FIX / "pf_llama_untied_fp32").iterdir():
            shutil.copy(p, ck / p.name)
        before = _digest(ck, skip_report=False)
        assert _cli("resize", ck, "--vocab", "128", "--dry-run").returncode == 0  # writes nothing: allowed
        r = _cli("resize", ck, "--vocab", "128", "-q")
        assert r.returncode == 6, r.stderr
        assert r.stderr.count("\n") == 1 and "mount point" in r.stderr and "--out" in r.stderr, r.stderr
        assert _digest(ck, skip_report=False) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["ckpt", *(["real"] if kind == "bind" else [])]
        )
    finally:
        subprocess.run(["umount", "-l", str(ck)], capture_output=True)


def test_a_failed_swap_removes_the_new_version(tmp_path, monkeypatch):
    """A swap the file system refuses (EBUSY, EACCES, ...) after the new version was built: the name holds
    the old version, the error says so, and the new version is removed (no staging copy left)."""
    import errno

    ck = _copy("pf_llama_untied_fp32", tmp_path / "ckpt")
    before = _digest(ck, skip_report=False)

    def busy(a, b):
        raise OSError(errno.EBUSY, "Device or resource busy", str(b))

    monkeypatch.setattr(inplace, "exchange", busy)
    with pytest.raises(
        tietool.OutputError, match="the checkpoint is unchanged and the new version was removed"
    ):
        tietool.resize(ck, 128)
    assert _digest(ck, skip_report=False) == before and _leftovers(tmp_path, "ckpt") == []
    assert not list(tmp_path.glob("ckpt.tietool-backup-*"))


def test_the_old_version_is_deleted_only_after_the_new_one_is_durable(tmp_path, monkeypatch):
    """--no-backup: the order of the steps, recorded: exchange, fsync of the parent, rename of the old
    version to its "being deleted" name, fsync of the parent, and only then the deletion."""
    ck = _copy("pf_llama_untied_fp32", tmp_path / "ckpt")
    steps: list[str] = []
    real_exchange, real_rename, real_delete = inplace.exchange, os.rename, inplace.delete_tree

    def exchange(a, b):
        steps.append("exchange")
        return real_exchange(a, b)

    def rename(a, b):
        steps.append(f"rename to {'deleting' if DELETING in str(b) else Path(b).name}")
        return real_rename(a, b)

    def delete(p):
        steps.append("delete")
        return real_delete(p)

    monkeypatch.setattr(inplace, "exchange", exchange)
    monkeypatch.setattr(inplace, "delete_tree", delete)
    monkeypatch.setattr(inplace.os, "rename", rename)
    from tietool.surgery import run as operations

    monkeypatch.setattr(operations, "fsync_dir", lambda p: steps.append(f"fsync {Path(p).name}"))
    tietool.resize(ck, 128, backup=False)
    i = steps.index("exchange")
    assert steps[i : i + 5] == [
        "exchange",
        "fsync " + tmp_path.name,
        "rename to deleting",
        "fsync " + tmp_path.name,
        "delete",
    ], steps


def test_recover_finishes_deletions_and_never_adopts_them(tmp_path):
    """A "being deleted" folder of a dead run is deleted (once the name holds a checkpoint), one of a live
    run is left alone, and neither is ever renamed to a backup."""
    ck = _copy("pf_llama_tied_fp32", tmp_path / "ckpt")
    dead = _copy("pf_llama_untied_fp32", tmp_path / ".ckpt.tietool-deleting-999999999-abc")
    (dead / "model-00001-of-00001.safetensors").unlink()  # half deleted
    alive = _copy("pf_llama_untied_fp32", tmp_path / f".ckpt.tietool-deleting-{os.getpid()}-abc")
    rec = inplace.recover(ck)
    assert rec.finished_deletions == [str(dead)] and not rec.kept_backups
    assert not dead.exists() and alive.exists()
    shutil.rmtree(alive)
    moved = _copy("pf_llama_untied_fp32", tmp_path / ".ckpt.tietool-deleting-999999999-def")
    os.rename(ck, tmp_path / "elsewhere")  # no checkpoint under the name: the folder is not deleted
    rec = inplace.recover(ck)
    assert moved.exists() and not rec.finished_deletions and not rec.kept_backups


def test_in_place_refuses_a_folder_being_deleted(tmp_path):
    """A shell left in the previous version's folder while it is deleted: a run there is refused."""
    d = _copy("pf_llama_untied_fp32", tmp_path / ".ckpt.tietool-deleting-999999999-abc")
    before = _digest(d, skip_report=False)
    r = _cli("resize", "--vocab", "128", "-q", cwd=d)
    assert r.returncode == 5 and "the checkpoint is ckpt" in r.stderr, r.stderr
    assert _digest(d, skip_report=False) == before


@pytest.mark.parametrize(
    "point, fallback, no_backup, holds, note",
    [
        ("check", False, False, "old", "(removed)"),  # the new version built, not yet checked
        ("swap", False, True, "old", "(removed)"),  # checked, not yet swapped
        ("swapped", False, False, "new", "(kept as a backup)"),  # the old version still at the staging name
        ("swapped", False, True, "new", "(kept as a backup)"),  # no backup asked, but nothing deleted yet
        ("renames", True, False, "new", "its complete new version was put there"),  # no folder under NAME
        ("delete", False, True, "new", "(the previous version it was deleting; now deleted)"),
    ],
    ids=[
        "before-check",
        "before-swap",
        "after-exchange",
        "after-exchange-no-backup",
        "between-renames",
        "delete",
    ],
)
def test_sigkill_at_each_step_and_the_next_run(tmp_path, point, fallback, no_backup, holds, note):
    """SIGKILL at each step of an in-place run (a pause point): the name holds the old or the new version
    (or, between the fallback's renames, nothing until the next run), and the next run, here `inspect`, puts
    right what was left and says so: the new version never swapped in removed, the old version kept as a
    complete backup or its deletion finished, the lock file removed."""
    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    old = _digest(ck)
    env = {"TIETOOL_INPLACE_PAUSE": "30", "TIETOOL_INPLACE_PAUSE_AT": point}
    env |= {"TIETOOL_NO_EXCHANGE": "1"} if fallback else {}
    p = _popen([*ARGS, ck, *(["--no-backup"] if no_backup else [])], env=env)
    waits = {
        "check": lambda: _staged(tmp_path, "ckpt"),
        "swap": lambda: _staged(tmp_path, "ckpt"),
        "swapped": lambda: _new_under_name(ck),
        "renames": lambda: not ck.exists(),
        "delete": lambda: any(DELETING in q.name for q in tmp_path.iterdir()),
    }
    _wait_for(waits[point])
    time.sleep(0.3 if point in ("check", "swap") else 0.0)  # past the last step before the pause
    p.kill()
    p.wait()
    r = _cli("inspect", ck, "--no-values")
    assert r.returncode == 0, r.stderr
    assert note in r.stdout, r.stdout
    assert f"{tmp_path / '.ckpt.tietool-lock'} (a stale lock file; removed)" in r.stdout, r.stdout
    assert (_digest(ck) == old) == (holds == "old")
    for bak in tmp_path.glob("ckpt.tietool-backup-*"):
        assert _digest(bak) == old
    assert _leftovers(tmp_path, "ckpt") == [] and not (tmp_path / ".ckpt.tietool-lock").exists()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_something_else_at_the_lock_files_name_is_refused_and_left_alone(tmp_path, kind):
    """A symlink (to a file the truncation that records the pid would empty), a FIFO or a folder where the
    lock file goes: exit 6 in one line naming it, nothing followed, truncated or removed, nothing written."""
    ck = _copy("pf_llama_tied_fp32", tmp_path / "ckpt")
    before = _digest(ck, skip_report=False)
    lock = tmp_path / ".ckpt.tietool-lock"
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    r = _cli("tie", ck)
    assert r.returncode == 6, r.stderr
    assert r.stderr.count("\n") == 1 and ".ckpt.tietool-lock" in r.stderr, r.stderr
    assert victim.read_text() == "keep me\n" and os.path.lexists(lock)
    assert _digest(ck, skip_report=False) == before and not list(tmp_path.glob(".ckpt.tietool-new-*"))


def test_a_half_deleted_old_version_at_a_staging_name_is_never_kept_as_a_backup(tmp_path):
    """What an earlier tietool left when a kill cut its deletion short (the old version at the staging name,
    shards missing): the next run finishes the deletion and says so instead of keeping it as a backup; a
    complete old version there is still kept."""
    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    half = _copy("pf_llama_untied_sharded", tmp_path / ".ckpt.tietool-new-999999998-abc")
    (half / "model-00001-of-00009.safetensors").unlink()
    whole = _copy("pf_llama_untied_sharded", tmp_path / ".ckpt.tietool-new-999999999-def")
    no_config = _copy("pf_llama_tied_fp32", tmp_path / ".ckpt.tietool-new-999999997-ghi")
    (no_config / "config.json").unlink()
    rec = inplace.recover(ck)
    assert sorted(rec.finished_deletions) == sorted(
        str(tmp_path / f".ckpt.tietool-deleting-{x}") for x in ("999999998-abc", "999999997-ghi")
    )
    (bak,) = tmp_path.glob("ckpt.tietool-backup-*")
    assert rec.kept_backups == [str(bak)] and _digest(bak) == _digest(FIX / "pf_llama_untied_sharded")
    assert not half.exists() and not whole.exists() and _leftovers(tmp_path, "ckpt") == []


@pytest.mark.parametrize("where", ["printing", "lock-release"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out"])
def test_ctrl_c_after_the_write_says_the_write_is_complete(tmp_path, monkeypatch, in_place, where):
    """Found by breaking issue 20 (Ctrl-C 0.7 s and 1.2 s into an in-place ``add-tokens``): the signal landed
    after the swap (while the lock was released, or while the report printed) and the line said
    "interrupted; nothing was written" (exit 130) though the name held the new version and its backup was
    beside it. Now it says so."""
    from tietool.cli.render import reports
    from tietool.surgery import run as run_mod

    ck = _copy("pf_llama_untied_sharded", tmp_path / "ckpt")
    old = _digest(ck)

    def stop(*_a, **_k):
        raise KeyboardInterrupt

    if where == "printing":
        monkeypatch.setattr(reports, "stale_notes", stop)  # the report's last part, after the write
    else:
        monkeypatch.setattr(run_mod, "Report", stop)  # after the write (in place: the lock released)
    out = [] if in_place else ["--out", tmp_path / "out"]
    r = _cli(*ARGS[:-1], ck, *out)
    assert r.returncode == 130, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "nothing was written" not in lines[0], r.stderr
    if in_place:
        (backup,) = tmp_path.glob("ckpt.tietool-backup-*")
        assert f"{ck} holds the new version (complete)" in lines[0] and str(backup) in lines[0]
        assert _digest(backup) == old and _digest(ck) != old
    else:
        said = "is complete" if where == "printing" else "was written completely"
        assert f"the output {tmp_path / 'out'} {said}" in lines[0] and _digest(ck) == old
        assert (tmp_path / "out" / REPORT).is_file()


def _fail_parent_fsync_after_exchange(monkeypatch, parent: Path, code: int) -> list[str]:
    """``os.fsync`` of the folder ``parent`` fails with ``OSError(code)`` once the exchange (or the first
    rename) has happened; every other fsync runs. The real ``fsync_dir`` runs (injection at the syscall)."""
    import stat

    real, real_exchange, state, failed = os.fsync, inplace.exchange, {"swapped": False}, []

    def exchange(a, b):
        state["swapped"] = True
        return real_exchange(a, b)

    def fsync(fd):
        if state["swapped"] and stat.S_ISDIR(os.fstat(fd).st_mode):
            if os.path.samefile(f"/proc/self/fd/{fd}", parent):
                failed.append(str(parent))
                raise OSError(code, os.strerror(code))
        return real(fd)

    monkeypatch.setattr(inplace, "exchange", exchange)
    monkeypatch.setattr(os, "fsync", fsync)
    return failed


@pytest.mark.parametrize("backup", [True, False], ids=["backup", "no_backup"])
def test_eio_at_the_parent_fsync_after_the_swap_is_exit_6_and_keeps_the_old_version(
    tmp_path, monkeypatch, backup
):
    """EIO at the fsync of the parent folder right after the exchange: the swap may not be durable, so the
    run fails (OutputError, exit 6) naming that folder and what the name holds; nothing more is moved or
    deleted (with or without --no-backup): the name holds the new version, the previous version stays
    complete at its staging name, and the next run's recovery keeps it as a backup, byte for byte the
    original."""
    ck = _copy("pf_llama_untied_fp32", tmp_path / "ckpt")
    before = _digest(ck, skip_report=False)
    failed = _fail_parent_fsync_after_exchange(monkeypatch, tmp_path, errno.EIO)
    with pytest.raises(tietool.OutputError) as e:
        tietool.resize(ck, 128, backup=backup)
    assert failed[:1] == [str(tmp_path)] and e.value.exit_code == 6
    msg = str(e.value)
    assert str(tmp_path) in msg and "fsynced" in msg and "holds the new version" in msg, msg
    monkeypatch.undo()
    staged = [p for p in tmp_path.iterdir() if ".tietool-new-" in p.name]
    assert len(staged) == 1 and _digest(staged[0], skip_report=False) == before and staged[0].name in msg
    assert not list(tmp_path.glob(f"*{DELETING}*")) and not list(tmp_path.glob("ckpt.tietool-backup-*"))
    # the next run, after this one's process ended (a CLI run exits with 6): its pid is no longer alive
    monkeypatch.setattr(inplace, "pid_alive", lambda pid: False)
    rec = inplace.recover(ck)
    (kept,) = rec.kept_backups
    assert _digest(Path(kept), skip_report=False) == before and _leftovers(tmp_path, "ckpt") == []


def test_einval_at_the_parent_fsync_after_the_swap_is_harmless(tmp_path, monkeypatch):
    """EINVAL (a file system that cannot fsync a folder) at the same fsyncs: ignored, the run succeeds
    without a backup and leaves nothing behind."""
    ck = _copy("pf_llama_untied_fp32", tmp_path / "ckpt")
    failed = _fail_parent_fsync_after_exchange(monkeypatch, tmp_path, errno.EINVAL)
    rep = tietool.resize(ck, 128, backup=False)
    assert len(failed) >= 2 and rep["in_place"]["written"]
    monkeypatch.undo()
    assert _leftovers(tmp_path, "ckpt") == [] and not list(tmp_path.glob(f"*{DELETING}*"))
