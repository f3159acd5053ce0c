"""In place with the training state: ``resize`` / ``add-tokens --keep-training-state`` of a PaddleFormers
Trainer flex checkpoint (``checkpoint-N/`` with ``model_state/``, ``optimizer_state/``, ``master_weight/``;
its config.json in the folder above, as the Trainer's output folder holds it), killed or failing at each step
of the swap, and the lock under I/O errors.

A SIGKILL after the exchange and before the old version is renamed to its backup name (the ``swapped``
pause point: after the exchange's fsync) left the previous version complete at its staging name, and the
next run deleted it: it has no config.json and no weight file of its own, so recovery took it for a
half-deleted folder (6 of 66 kill points lost the backup). It is now recognised as a whole flex checkpoint
(:func:`tietool.surgery.write.inplace._complete_flex`) and kept as the backup. An EIO at that rename left
the ``.NAME.tietool-new-…`` folder behind: the exchange is now undone, the run ends with exit 6, the
checkpoint unchanged and nothing left. EIO at the lock's ``flock`` or ``unlink`` was exit 70.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import cli_runner, paths
from support import flex_support as fx

import tietool
from tietool.surgery.write import inplace

needs_data = pytest.mark.skipif(
    not (fx.DATA / "trainer_1rank").is_dir(), reason="tests/data/flex not present"
)
RESIZE = ["resize", "--vocab", "256", "--keep-training-state", "--seed", "3", "-q"]
ADD = ["add-tokens", "<qq>", "--keep-training-state", "--seed", "3", "-q"]


def _ck(tmp: Path) -> Path:
    """trainer_1rank's checkpoint-2 at ``tmp/run/checkpoint-2``, its config.json at ``tmp/run/``."""
    dst = tmp / "run" / "checkpoint-2"
    shutil.copytree(fx.DATA / "trainer_1rank" / "checkpoint-2", dst)
    shutil.copy2(fx.DATA / "trainer_1rank" / "base" / "config.json", dst.parent / "config.json")
    return dst


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "tietool-report.json"
    }


def _beside(ck: Path) -> list[str]:
    """Everything beside the checkpoint but the checkpoint and the config."""
    return sorted(p.name for p in ck.parent.iterdir() if p.name not in (ck.name, "config.json"))


def _wait_for(cond, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def _staged(ck: Path) -> bool:
    """The new version is built and published at its staging name (its report carries a token)."""
    return any(inplace.token_of(p) is not None for p in ck.parent.glob(f".{ck.name}.tietool-new-*"))


POINTS = {  # pause point: (fallback, no_backup, what the name holds, what the next run says)
    "check": (False, False, "old", "(removed)"),
    "swap": (False, True, "old", "(removed)"),
    "swapped": (False, False, "new", "(kept as a backup)"),
    "swapped-no-backup": (False, True, "new", "(kept as a backup)"),
    "renames": (True, False, "new", "its complete new version was put there"),
    "delete": (False, True, "new", "(the previous version it was deleting; now deleted)"),
}


@needs_data
@pytest.mark.parametrize("args", [RESIZE, ADD], ids=["resize", "add-tokens"])
@pytest.mark.parametrize("point", list(POINTS))
def test_sigkill_at_each_step_keeps_old_or_new_and_the_backup(tmp_path, args, point):
    """SIGKILL at each step of the swap of a flex edit in place: the name holds the old or the new version,
    and the next run (inspect) puts right what was left and says so. After the exchange and before the
    old version's rename (``swapped``), the previous version, complete at its staging name, is kept as the
    backup (it was deleted before: no config.json of its own), even with --no-backup (nothing was deleted
    yet); nothing else is left."""
    ck = _ck(tmp_path)
    old = _hashes(ck)
    fallback, no_backup, holds, note = POINTS[point]
    env = {**os.environ, "TIETOOL_INPLACE_PAUSE": "60", "TIETOOL_INPLACE_PAUSE_AT": point.split("-")[0]}
    env |= {"TIETOOL_NO_EXCHANGE": "1"} if fallback else {}
    argv = [args[0], str(ck), *args[1:], *(["--no-backup"] if no_backup else [])]
    p = subprocess.Popen([sys.executable, "-m", "tietool", *argv], env=env, stderr=subprocess.PIPE)
    reached = {
        "check": lambda: _staged(ck),
        "swap": lambda: _staged(ck),
        "swapped": lambda: inplace.token_of(ck) is not None,
        "renames": lambda: not ck.exists(),
        "delete": lambda: any(inplace.DELETING_TAG in n for n in _beside(ck)),
    }[point.split("-")[0]]
    try:
        _wait_for(lambda: reached() or p.poll() is not None)
        assert p.poll() is None, p.stderr.read() if p.stderr else ""
        time.sleep(0.3 if point in ("check", "swap") else 0.0)  # past the last step before the pause
    finally:
        p.kill()
        p.wait()
    r = cli_runner.run_cli(["inspect", str(ck)], subprocess=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert note in r.stdout, r.stdout
    assert (_hashes(ck) == old) == (holds == "old")
    baks = [ck.parent / n for n in _beside(ck) if inplace.BACKUP_TAG in n]
    for bak in baks:
        assert _hashes(bak) == old
    if holds == "new" and point != "delete":
        assert len(baks) == 1  # the previous version kept (as a backup: the one the run made, or recovered)
    assert _beside(ck) == sorted(b.name for b in baks)


@needs_data
def test_recovery_tells_a_whole_flex_checkpoint_from_a_half_deleted_one(tmp_path):
    """The staging folder of a dead run holding a flex checkpoint without its own config is whole (kept
    as the backup); one whose optimizer_state lost a .distcp the .metadata names is not (its deletion is
    finished, never a backup)."""
    ck = _ck(tmp_path)
    whole = tmp_path / "run" / ".checkpoint-2.tietool-new-999999999-abc"
    shutil.copytree(ck, whole)
    assert inplace._complete(whole) and inplace._complete_flex(whole)
    half = tmp_path / "run" / ".checkpoint-2.tietool-new-999999998-abc"
    shutil.copytree(ck, half)
    next((half / "optimizer_state").glob("*.distcp")).unlink()
    assert inplace._complete(half) is False
    rec = inplace.recover(ck)
    assert len(rec.kept_backups) == 1 and len(rec.finished_deletions) == 1, rec.as_dict()
    assert _hashes(Path(rec.kept_backups[0])) == _hashes(ck)
    assert not whole.exists() and not half.exists()
    assert inplace._complete_flex(fx.DATA / "ranks2") is True and inplace._complete_flex(tmp_path) is None


def _old_published(a: str, b: str) -> bool:
    """The rename of the old version (at the staging name after the exchange) to its backup or "being
    deleted" name."""
    return ".tietool-new-" in a and (inplace.BACKUP_TAG in b or inplace.DELETING_TAG in b)


def _eio_at(monkeypatch, pred) -> list[str]:
    """``os.rename`` in the in-place module fails with EIO when ``pred(src, dst)``; returns the calls."""
    real = os.rename
    calls: list[str] = []

    def rename(a, b):
        calls.append(f"{Path(a).name} -> {Path(b).name}")
        if pred(str(a), str(b)):
            raise OSError(errno.EIO, "Input/output error", str(a))
        return real(a, b)

    monkeypatch.setattr(inplace.os, "rename", rename)
    return calls


@needs_data
@pytest.mark.parametrize("op", ["add_tokens", "resize"])
@pytest.mark.parametrize("backup", [True, False], ids=["backup", "no-backup"])
def test_eio_at_the_rename_after_the_exchange_undoes_it(tmp_path, monkeypatch, op, backup):
    """EIO when the old version is renamed to its backup (or "being deleted") name after the exchange:
    the exchange is undone, the run ends with an OutputError (exit 6) saying the checkpoint is unchanged,
    and nothing is left beside it (the new version removed)."""
    ck = _ck(tmp_path)
    old = _hashes(ck)
    calls = _eio_at(monkeypatch, _old_published)
    with pytest.raises(tietool.OutputError, match="the checkpoint is unchanged") as e:
        if op == "add_tokens":
            tietool.add_tokens(ck, ["<qq>"], keep_training_state=True, backup=backup)
        else:
            tietool.resize(ck, 256, keep_training_state=True, backup=backup)
    assert e.value.exit_code == 6 and "Input/output error" in str(e.value)
    assert calls and _hashes(ck) == old and _beside(ck) == [], (calls, _beside(ck))


def test_eio_at_the_rename_of_a_tokenizer_trim_undoes_it(tmp_path, monkeypatch):
    """The same for resize's tokenizer trim of a safetensors checkpoint in place (the tokens beyond the
    new rows removed from the tokenizer files): exit 6, unchanged, nothing left."""
    src = paths.SAMPLES / "pf_llama_with_tokenizer"
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    old = _hashes(ck)
    _eio_at(monkeypatch, _old_published)
    with pytest.raises(tietool.OutputError, match="the checkpoint is unchanged"):
        tietool.resize(ck, 303, force=True)
    assert _hashes(ck) == old and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


@pytest.mark.parametrize("where", ["flock", "unlink", "unlink-once"])
def test_eio_at_the_lock_is_exit_6_and_leaves_no_lock(tmp_path, monkeypatch, where):
    """EIO at the lock's flock: exit 6 naming the lock file, nothing written, no lock file left. At its
    unlink after the run: retried once (a single EIO leaves nothing); twice: exit 6 naming the lock file and
    saying the new version is in place (the next run removes the file)."""
    src = paths.SAMPLES / "pf_llama_with_tokenizer"
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    old = _hashes(ck)
    if where == "flock":
        real_flock = inplace.fcntl.flock

        def flock(fd, op):
            if op & inplace.fcntl.LOCK_EX:
                raise OSError(errno.EIO, "Input/output error")
            return real_flock(fd, op)

        monkeypatch.setattr(inplace.fcntl, "flock", flock)
        with pytest.raises(tietool.OutputError, match="cannot lock .ck.tietool-lock: Input/output error"):
            tietool.resize(ck, 384)
        assert _hashes(ck) == old and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
        return
    fails = [2 if where == "unlink" else 1]
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name == ".ck.tietool-lock" and fails[0] > 0:
            fails[0] -= 1
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    if where == "unlink-once":
        tietool.resize(ck, 384, backup=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
        return
    with pytest.raises(tietool.OutputError, match="the new version is in place") as e:
        tietool.resize(ck, 384, backup=False)
    assert ".ck.tietool-lock" in str(e.value) and e.value.exit_code == 6
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert inplace.recover(ck).removed_locks == [str(tmp_path / ".ck.tietool-lock")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
