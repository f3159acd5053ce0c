"""Rewriting a checkpoint in place, crash-safe, at the cost of the touched bytes.

The new version is written beside the checkpoint as an ordinary output (:func:`surgery.write.execute`, with
untouched weight files hard-linked, so only rewritten shards cost bytes), read back and checked there, and
then swapped with the original folder in one step: ``renameat2(RENAME_EXCHANGE)`` on Linux. The previous
version stays beside it as ``NAME.tietool-backup-<time>`` (it costs only the bytes of the rewritten shards,
since the untouched files are the same inodes) unless no backup is asked for.

A kill at any moment leaves a complete checkpoint under the original name: the old one until the exchange,
the new one after. What a killed run leaves behind is put right by the next run in that folder
(:func:`recover`): a staging folder ``.NAME.tietool-new-<pid>-<token>`` whose ``tietool-report.json`` carries
its own token is a new version that was never swapped in (removed); one without is the old version after the
swap (kept as the backup it was about to become).

Two in-place runs on one checkpoint would each build from the original and the later swap would drop the
earlier one's change: a run that writes holds an exclusive ``flock`` on ``.NAME.tietool-lock`` beside the
checkpoint while it writes (:func:`locked`; the file is removed at the end), and a second run refuses at once;
when it takes the lock and before the swap, the folder under the name must still be the one that was read
(:func:`check_same_folder`).

Where the exchange is not available (not Linux, an old kernel, a file system without it) two renames are used:
the original to the backup name, then the new version to the original name. A kill between them leaves no
folder under the original name; the next run renames the complete new version into place and says so.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import secrets
import shlex
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .errors import OutputError, RefusedError
from .write import REPORT_NAME, pid_alive, remove_dead_temps

NEW_TAG = ".tietool-new-"
BACKUP_TAG = ".tietool-backup-"
LOCK_TAG = ".tietool-lock"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@dataclass
class Recovery:
    """What :func:`recover` did in a checkpoint's parent folder (paths as strings, for the report).

    Attributes:
        removed_temps: temporary folders of dead runs removed (never swapped in; their process is gone).
        kept_backups: old versions found at a staging name after a swap, renamed to a backup name.
        restored: the new version renamed to the original name after a kill between the two renames.
    """

    removed_temps: list[str] = field(default_factory=list)
    kept_backups: list[str] = field(default_factory=list)
    restored: str | None = None

    def as_dict(self) -> dict:
        return {
            "removed_temps": self.removed_temps,
            "kept_backups": self.kept_backups,
            "restored": self.restored,
        }

    def __bool__(self) -> bool:
        return bool(self.removed_temps or self.kept_backups or self.restored)


def _staging_pid_token(name: str, prefix: str) -> tuple[int, str] | None:
    """``(pid, token)`` of a staging folder name ``prefix<pid>-<token>``; None for another name."""
    if not name.startswith(prefix):
        return None
    pid, _, token = name[len(prefix) :].partition("-")
    return (int(pid), token) if pid.isdigit() and token else None


def _token_of(folder: Path) -> str | None:
    """The in-place token recorded in ``folder``'s report (None: no report, or not an in-place output)."""
    import json

    try:
        rep = json.loads((folder / REPORT_NAME).read_text())
    except (OSError, ValueError):
        return None
    ip = rep.get("in_place") if isinstance(rep, dict) else None
    return ip.get("token") if isinstance(ip, dict) else None


def backup_name(ckpt: Path) -> Path:
    """A new backup folder name beside ``ckpt``: ``NAME.tietool-backup-YYYYmmdd-HHMMSS`` (then ``-2``…)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    p = ckpt.with_name(f"{ckpt.name}{BACKUP_TAG}{stamp}")
    k = 2
    while p.exists():
        p, k = ckpt.with_name(f"{ckpt.name}{BACKUP_TAG}{stamp}-{k}"), k + 1
    return p


def recover(ckpt: Path) -> Recovery:
    """Put right what killed runs left beside checkpoint ``ckpt`` (see the module docstring); returns what
    was done. Folders of runs still alive are left alone."""
    ckpt = Path(os.path.abspath(ckpt))
    parent, rec = ckpt.parent, Recovery()
    if not parent.is_dir():
        return rec
    rec.removed_temps += remove_dead_temps(parent)
    prefix = f".{ckpt.name}{NEW_TAG}"
    for p in sorted(parent.iterdir()):
        found = _staging_pid_token(p.name, prefix)
        if found is None or not p.is_dir() or pid_alive(found[0]):
            continue
        if _token_of(p) != found[1]:  # the old version, swapped out: keep it as the backup it was to be
            dst = backup_name(ckpt)
            os.rename(p, dst)
            rec.kept_backups.append(str(dst))
        elif not ckpt.exists():  # the two-rename fallback was killed between its renames
            os.rename(p, ckpt)
            rec.restored = str(ckpt)
        else:  # a new version never swapped in
            shutil.rmtree(p, ignore_errors=True)
            rec.removed_temps.append(str(p))
    return rec


def target(path: str | os.PathLike[str]) -> Path:
    """The folder an in-place run rewrites: ``path`` with symlinks resolved (a link to a checkpoint rewrites
    the checkpoint and stays a link to it).

    Raises:
        RefusedError: the folder is a backup tietool made (``NAME.tietool-backup-<time>``): a shell (or a
            process) that stood in the checkpoint during an earlier in-place run is still in the previous
            version's folder, now the backup; rewriting it would change the backup, not the checkpoint.
    """
    real = Path(os.path.realpath(path))
    if BACKUP_TAG in real.name:
        name = real.name.split(BACKUP_TAG)[0]
        raise RefusedError(
            f"this is {real.name}, the backup an earlier in-place run kept; the checkpoint is {name}",
            real,
            f"cd {shlex.quote(str(real.parent / name))} (in a shell that stood in it, `cd .`) and run again",
        )
    return real


def exchange(a: Path, b: Path) -> bool:
    """Swap folders ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``). Returns False when the
    system cannot (no ``renameat2`` in libc, or the kernel / file system refuses the flag), True when done.

    Raises:
        OSError: any other failure (permissions, a missing path).
    """
    if os.environ.get("TIETOOL_NO_EXCHANGE") == "1":  # tests of the fallback
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _pause() -> None:
    """Tests widen the windows between the steps of a swap (``TIETOOL_INPLACE_PAUSE`` seconds) so that a
    kill at a random time lands in each of them."""
    pause = os.environ.get("TIETOOL_INPLACE_PAUSE")
    if pause:
        time.sleep(float(pause))


def staging_path(ckpt: Path, token: str) -> Path:
    """Where the new version of ``ckpt`` is built: ``.NAME.tietool-new-<pid>-<token>`` beside it."""
    return ckpt.with_name(f".{ckpt.name}{NEW_TAG}{os.getpid()}-{token}")


def new_token() -> str:
    return secrets.token_hex(6)


def swap_in(ckpt: Path, staging: Path, backup: Path | None, fsync_dir: Callable[[Path], None]) -> bool:
    """Put the complete new version ``staging`` under ``ckpt``'s name; the old version goes to ``backup``
    (or is removed when None). Returns True when the atomic exchange was used, False for two renames."""
    _pause()
    exchanged = exchange(staging, ckpt)
    if exchanged:
        fsync_dir(ckpt.parent)
        _pause()
        if backup is not None:
            os.rename(staging, backup)  # staging now holds the old version
        else:
            shutil.rmtree(staging)
    else:
        old = backup or ckpt.with_name(f".{ckpt.name}{NEW_TAG}{os.getpid()}-old")
        os.rename(ckpt, old)
        _pause()
        os.rename(staging, ckpt)
        _pause()
        if backup is None:
            shutil.rmtree(old)
    fsync_dir(ckpt.parent)
    return exchanged


def lock_path(ckpt: Path) -> Path:
    """The lock file of checkpoint ``ckpt``: ``.NAME.tietool-lock`` beside it."""
    return ckpt.with_name(f".{ckpt.name}{LOCK_TAG}")


@contextmanager
def locked(ckpt: Path) -> Iterator[None]:
    """Hold the exclusive lock of checkpoint ``ckpt`` (``flock`` on :func:`lock_path`, which records the
    holder's pid) for the ``with`` block, which writes. The file exists only while a run writes: it is
    removed at the end while still locked, and a run that locked a file already removed (it opened it just
    before) sees that the name no longer leads to its file and refuses, so two runs never both hold it.

    Raises:
        RefusedError: another run holds the lock (its pid named when recorded), or just released it.
        OutputError: the lock file cannot be created (a read-only folder).
    """
    path = lock_path(ckpt)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutputError(
            f"cannot create the lock file {path.name}: {e.strerror}", path, "check the folder's permissions"
        ) from None
    try:
        _lock(fd, ckpt)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise RefusedError(
                f"another tietool run has just rewritten {ckpt.name} in place", ckpt, "run again"
            )
        try:
            yield
        finally:
            path.unlink(missing_ok=True)  # still locked: a run that opened it now refuses (above)
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, ckpt: Path) -> None:
    """Take the lock on open lock file ``fd`` without waiting and record this pid in it.

    Raises:
        RefusedError: another process holds it.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise RefusedError(
            f"another tietool run{who} is rewriting {ckpt.name} in place", ckpt, "wait for it to finish"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def folder_id(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of folder ``path`` (symlinks followed); None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_same_folder(ckpt: Path, read: tuple[int, int] | None, staging: Path | None) -> None:
    """Before the swap: the folder under ``ckpt``'s name must still be the one that was read (``read``,
    :func:`folder_id` at the start); otherwise the new version is removed and the run refused.

    Raises:
        RefusedError: the folder was replaced or removed meanwhile (by something that takes no lock).
    """
    if read is None or folder_id(ckpt) != read:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise RefusedError(
            f"{ckpt.name} was replaced or removed while this run read it; nothing was changed",
            ckpt,
            "check what else writes to it, then run again",
        )


def keep_modes(ckpt: Path, staging: Path, weight_files: list[str]) -> None:
    """Give the new version ``staging`` the permissions of ``ckpt``: the folder's mode, and each file or
    subfolder written anew the mode of the same name in ``ckpt`` (a new name: a weight file's mode for a
    weight file, ``config.json``'s for another file). Hard links of ``ckpt``'s files keep their own."""
    os.chmod(staging, stat.S_IMODE(os.stat(ckpt).st_mode))
    linked = {(st.st_dev, st.st_ino) for st in map(os.stat, (p for p in ckpt.rglob("*") if p.is_file()))}
    weight = next((ckpt / f for f in weight_files if (ckpt / f).is_file()), ckpt / "config.json")
    for p in staging.rglob("*"):
        st = p.lstat()
        if p.is_symlink() or (st.st_dev, st.st_ino) in linked:
            continue
        old = ckpt / p.relative_to(staging)
        if not old.exists():
            old = weight if p.suffix in (".safetensors", ".pdparams") else ckpt / "config.json"
            old = old if p.is_file() else ckpt
        if old.exists():
            os.chmod(p, stat.S_IMODE(os.stat(old).st_mode))
