"""Rewriting a checkpoint in place, crash-safe, at the cost of the touched bytes.

The new version is written beside the checkpoint as an ordinary output (:func:`surgery.write.writer.execute`,
with
untouched weight files hard-linked, so only rewritten shards cost bytes), read back, fsynced, and then
swapped with the original folder in one step: ``renameat2(RENAME_EXCHANGE)`` on Linux. The previous version
stays beside it as ``NAME.tietool-backup-<time>`` (it costs only the bytes of the rewritten shards, since the
untouched files are the same inodes) unless no backup is asked for.

A kill at any moment leaves a complete checkpoint under the original name: the old one until the exchange,
the new one after. What a killed run leaves behind is put right by the next run in that folder
(:func:`recover`): a staging folder ``.NAME.tietool-new-<pid>-<token>`` whose ``tietool-report.json`` carries
its own token is a new version that was never swapped in (removed); one without is the old version after the
swap, still complete (kept as the backup it was about to become).

Without a backup the old version is deleted only once the new one is durable under the name (the exchange
and the parent folder fsynced), and only after it was renamed to ``.NAME.tietool-deleting-<pid>-<token>``
(fsynced): a deletion that is interrupted or fails leaves a folder whose name says it is being deleted, which
the next run finishes deleting (and says so), never one it would take for a backup.

The swap itself (exchange or two renames, and the rename of the old version to its backup or deleting name)
runs with SIGINT/SIGTERM/SIGHUP deferred (:func:`surgery.write.writer.signals_deferred`), so a Ctrl-C or
SIGTERM
lands before it or after it; :func:`interrupted_state` then says, by looking at the folders, what the name
holds.

Two in-place runs on one checkpoint would each build from the original and the later swap would drop the
earlier one's change: a run that writes holds an exclusive ``flock`` on ``.NAME.tietool-lock`` beside the
checkpoint while it writes (:func:`locked`; the file is removed at the end, and a killed run's is removed by
the next run, :func:`recover`), and a second run refuses at once; when it takes the lock and before the swap,
the folder under the name must still be the one that was read (:func:`check_same_folder`), and every file in
it must be the one that was read (:func:`input_files`, :func:`check_inputs`: device, inode, size, mtime), so
that a shard another process replaced meanwhile is never swapped out (or deleted).

Where the exchange is not available (not Linux, an old kernel, a file system without it) two renames are used:
the original to the backup name, then the new version to the original name. A kill between them (only
SIGKILL can land there) leaves no folder under the original name; the next run renames the complete new
version into place and says so.
"""

from __future__ import annotations

import contextlib
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
from typing import TYPE_CHECKING

from ..io import flex, surface
from ..io.checkpoint import CONFIG_FILES, PD_INDEX, PD_SINGLE, REPORT_NAME, SHARD_RE, ST_INDEX, ST_SINGLE
from ..io.regular import INDEX_LIMIT, kind_of, load_json
from ..model.errors import CheckpointError, Opt, OutputError, RefusedError
from .publish import NotDurable, fsync_tree, pid_alive, remove_dead_temps, signals_deferred

if TYPE_CHECKING:  # annotations only: inspect imports this module (a killed in-place run is put right first)
    from ..plan.plan import Plan

NEW_TAG = ".tietool-new-"
BACKUP_TAG = ".tietool-backup-"
DELETING_TAG = ".tietool-deleting-"
LOCK_TAG = ".tietool-lock"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# a lock file with no pid in it and no flock on it is a run's that was killed between creating and locking
# it, or one being created right now: left alone for this long
_EMPTY_LOCK_GRACE_S = 30.0


@dataclass
class Recovery:
    """What :func:`recover` did in a checkpoint's parent folder (paths as strings, for the report).

    Attributes:
        removed_temps: temporary folders of dead runs removed (never swapped in; their process is gone).
        kept_backups: old versions found at a staging name after a swap, renamed to a backup name.
        restored: the new version renamed to the original name after a kill between the two renames.
        finished_deletions: previous versions a killed ``--no-backup`` run was deleting, now deleted.
        left_to_delete: such folders that still cannot be deleted, each with the reason.
        removed_locks: lock files of dead runs removed (no process holds their ``flock``).
    """

    removed_temps: list[str] = field(default_factory=list)
    kept_backups: list[str] = field(default_factory=list)
    restored: str | None = None
    finished_deletions: list[str] = field(default_factory=list)
    left_to_delete: list[str] = field(default_factory=list)
    removed_locks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "removed_temps": self.removed_temps,
            "kept_backups": self.kept_backups,
            "restored": self.restored,
            "finished_deletions": self.finished_deletions,
            "left_to_delete": self.left_to_delete,
            "removed_locks": self.removed_locks,
        }

    def __bool__(self) -> bool:
        return any(self.as_dict().values())


def _staging_pid_token(name: str, prefix: str) -> tuple[int, str] | None:
    """``(pid, token)`` of a staging folder name ``prefix<pid>-<token>``; None for another name."""
    if not name.startswith(prefix):
        return None
    pid, _, token = name[len(prefix) :].partition("-")
    return (int(pid), token) if pid.isdigit() and token else None


def token_of(folder: Path) -> str | None:
    """The in-place token recorded in ``folder``'s report (None: no report, not an in-place output, or not a
    regular JSON file: read with :func:`surgery.io.regular.load_json`, so a FIFO there cannot block)."""
    try:
        rep = load_json(folder / REPORT_NAME, limit=16 << 20)
    except (OSError, ValueError, CheckpointError):
        return None
    ip = rep.get("in_place") if isinstance(rep, dict) else None
    return ip.get("token") if isinstance(ip, dict) else None


def backup_name(ckpt: Path) -> Path:
    """A new backup folder name beside ``ckpt``: ``NAME.tietool-backup-YYYYmmdd-HHMMSS`` (then ``-2``…)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    p = ckpt.with_name(f"{ckpt.name}{BACKUP_TAG}{stamp}")
    k = 2
    while os.path.lexists(p):  # a dangling symlink there too: rename would fail after the exchange
        p, k = ckpt.with_name(f"{ckpt.name}{BACKUP_TAG}{stamp}-{k}"), k + 1
    return p


def recover(ckpt: Path) -> Recovery:
    """Put right what killed runs left beside checkpoint ``ckpt`` (see the module docstring); returns what
    was done. Folders and locks of runs still alive are left alone. Never raises: what cannot be put right
    (a read-only parent folder) is left as it is, for a run that can."""
    ckpt = Path(os.path.abspath(ckpt))
    parent, rec = ckpt.parent, Recovery()
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return rec
    rec.removed_temps += remove_dead_temps(parent)
    prefix = f".{ckpt.name}{NEW_TAG}"
    for p in entries:
        found = _staging_pid_token(p.name, prefix)
        if found is None or not p.is_dir() or p.is_symlink() or pid_alive(found[0]):
            continue
        try:
            _recover_staging(ckpt, p, found[1], rec)
        except OSError:
            continue
    _finish_deletions(ckpt, entries, rec)
    _remove_stale_lock(ckpt, rec)
    return rec


def _recover_staging(ckpt: Path, p: Path, token: str, rec: Recovery) -> None:
    """Staging folder ``p`` of a dead run (``token`` from its name): the old version after the exchange is
    kept as a backup; the new version goes under the name if none is there, else it is removed."""
    if token_of(p) != token and not _complete(p):  # half deleted by an earlier tietool: finish it
        dst = ckpt.with_name(p.name.replace(NEW_TAG, DELETING_TAG, 1))
        os.rename(p, dst)
        err = delete_tree(dst)
        if err is None:
            rec.finished_deletions.append(str(dst))
        else:
            rec.left_to_delete.append(f"{dst} ({err})")
    elif token_of(p) != token:  # the old version, swapped out and still complete: keep it as the backup
        dst = backup_name(ckpt)
        os.rename(p, dst)
        rec.kept_backups.append(str(dst))
    elif not ckpt.exists():  # the two-rename fallback was killed between its renames
        os.rename(p, ckpt)
        rec.restored = str(ckpt)
    else:  # a new version never swapped in
        shutil.rmtree(p, ignore_errors=True)
        rec.removed_temps.append(str(p))


def _complete(folder: Path) -> bool:
    """``folder`` holds a whole checkpoint: a config file, and every shard its index names (without an
    index, a weight file); or a whole flex checkpoint (:func:`_complete_flex`: its config may be in the
    folder above). A previous version that an older tietool was deleting from a staging name when it was
    killed fails this, and is never kept as a backup."""
    try:
        names = set(os.listdir(folder))
    except OSError:
        return False
    whole_flex = _complete_flex(folder)
    if whole_flex is not None:
        return whole_flex
    if not names & set(CONFIG_FILES):
        return False
    for index in (ST_INDEX, PD_INDEX):
        if index in names:
            try:
                wm = load_json(folder / index, limit=INDEX_LIMIT).get("weight_map")
            except (CheckpointError, AttributeError):
                return False
            return isinstance(wm, dict) and all(isinstance(f, str) and f in names for f in set(wm.values()))
    return bool(names & {ST_SINGLE, PD_SINGLE}) or any(SHARD_RE.match(n) for n in names)


def _complete_flex(folder: Path) -> bool | None:
    """None when ``folder`` is not a flex checkpoint (:func:`surgery.io.flex.find`); else whether it is
    whole: every flex folder in it (``model_state`` and any ``optimizer_state`` / ``master_weight`` that
    holds a ``.metadata``) has its one ``.metadata`` and every ``.distcp`` file it names
    (:func:`surgery.io.flex.open_flex`, bounded like any read)."""
    found = flex.find(folder)
    if found is None:
        return None
    dirs = [found.state] + [found.root / d for d in found.others]
    for d in dirs:
        try:
            if d != found.state and not any(flex.META_RE.match(n) for n in os.listdir(d)):
                continue
            flex.open_flex(flex.FlexFolder(found.root, d, ()))
        except (CheckpointError, OSError):
            return False
    return True


def _finish_deletions(ckpt: Path, entries: list[Path], rec: Recovery) -> None:
    """Delete the previous versions dead ``--no-backup`` runs were deleting (``.NAME.tietool-deleting-…``),
    once the name holds a checkpoint; what still cannot be deleted goes to ``rec.left_to_delete``."""
    prefix = f".{ckpt.name}{DELETING_TAG}"
    for p in entries:
        found = _staging_pid_token(p.name, prefix)
        if found is None or p.is_symlink() or pid_alive(found[0]) or not ckpt.is_dir():
            continue
        err = delete_tree(p)
        if err is None:
            rec.finished_deletions.append(str(p))
        else:
            rec.left_to_delete.append(f"{p} ({err})")


def delete_tree(p: Path) -> str | None:
    """Delete folder ``p`` as far as possible; None when it is gone, else the first error (``strerror:
    path``)."""
    errors: list[str] = []

    def onerror(_fn, path, exc_info) -> None:
        e = exc_info[1]
        errors.append(f"{getattr(e, 'strerror', None) or e}: {path}")

    shutil.rmtree(p, onerror=onerror)
    return None if not os.path.lexists(p) else (errors[0] if errors else "not deleted")


def _remove_stale_lock(ckpt: Path, rec: Recovery) -> None:
    """Remove the lock file of a dead run: nobody holds its ``flock`` (the holder's pid is gone, or its
    descriptor closed) and it records a pid (or is empty and older than :data:`_EMPTY_LOCK_GRACE_S`). It
    is unlinked while this process holds its ``flock``, so a run that opened it meanwhile sees the name no
    longer leads to its file and refuses (:func:`locked`)."""
    path = lock_path(ckpt)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # held: a live run
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if not holder.isdigit() and time.time() - st.st_mtime < _EMPTY_LOCK_GRACE_S:
            return
        if os.stat(path).st_ino == st.st_ino:
            path.unlink()
            rec.removed_locks.append(str(path))
    except OSError:
        return
    finally:
        os.close(fd)


def target(path: str | os.PathLike[str]) -> Path:
    """The folder an in-place run rewrites: ``path`` with symlinks resolved (a link to a checkpoint rewrites
    the checkpoint and stays a link to it).

    Raises:
        RefusedError: the folder is a backup tietool made (``NAME.tietool-backup-<time>``) or a previous
            version being deleted (``.NAME.tietool-deleting-…``): a shell (or a process) that stood in the
            checkpoint during an earlier in-place run is still in the previous version's folder; rewriting
            it would change that, not the checkpoint.
    """
    real = Path(os.path.realpath(path))
    for tag, what in ((BACKUP_TAG, "the backup"), (DELETING_TAG, "the previous version being deleted")):
        if tag in real.name:
            name = real.name.split(tag)[0].removeprefix(".")
            raise RefusedError(
                f"this is {real.name}, {what} of an earlier in-place run; the checkpoint is {name}",
                real,
                f"cd {shlex.quote(str(real.parent / name))} (in a shell that stood in it, `cd .`) "
                "and run again",
            )
    return real


def check_swappable(ckpt: Path) -> None:
    """Before anything is written in place: ``ckpt`` must be a folder that can be renamed.

    Raises:
        OutputError: it is a mount point (its own file system, or a bind mount): ``rename`` and the exchange
            fail with ``EBUSY``, so the new version could never be swapped in.
    """
    if _is_mount_point(ckpt):
        raise OutputError(
            "is a mount point, which cannot be renamed, so it cannot be rewritten in place; "
            "nothing was written",
            ckpt,
            f"write the new version to another folder with {Opt('out')} (then copy it onto the mount if it "
            "must live there)",
        )


def _is_mount_point(folder: Path) -> bool:
    """``folder`` is a mount point: another device than its parent's (``os.path.ismount``), or listed in
    ``/proc/self/mountinfo`` (a bind mount of a folder of the same file system, which ``ismount`` misses)."""
    if os.path.ismount(folder):
        return True
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read(4 << 20).splitlines()
    except OSError:
        return False
    want = os.fsencode(folder)
    for line in lines:
        fields = line.split(b" ")
        if len(fields) > 4 and _unescape_mount(fields[4]) == want:
            return True
    return False


def _unescape_mount(field_: bytes) -> bytes:
    """A mountinfo path field with its octal escapes (``\\040`` for a space, ...) decoded."""
    import re

    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field_)


def exchange(a: Path, b: Path) -> bool:
    """Swap folders ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``). Returns False when the
    system cannot (no ``renameat2`` in libc, or the kernel / file system refuses the flag), True when done.

    Raises:
        OSError: any other failure (permissions, a missing path, a mount point: ``EBUSY``).
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
    raise OSError(err, os.strerror(err), str(b))


def pause(point: str) -> None:
    """Tests widen the windows between the steps of a swap (``TIETOOL_INPLACE_PAUSE`` seconds) so that a
    kill at a random time lands in each of them; ``TIETOOL_INPLACE_PAUSE_AT=point[,point]`` pauses only at
    those points (``swap``: before the exchange, ``renames``: between the fallback's two renames,
    ``swapped``: after the exchange, ``delete``: before the old version is deleted, ``check``: before the
    pre-swap checks)."""
    pause = os.environ.get("TIETOOL_INPLACE_PAUSE")
    only = os.environ.get("TIETOOL_INPLACE_PAUSE_AT")
    if pause and (not only or point in only.split(",")):
        time.sleep(float(pause))


def staging_path(ckpt: Path, token: str) -> Path:
    """Where the new version of ``ckpt`` is built: ``.NAME.tietool-new-<pid>-<token>`` beside it."""
    return ckpt.with_name(f".{ckpt.name}{NEW_TAG}{os.getpid()}-{token}")


def deleting_path(ckpt: Path, token: str) -> Path:
    """Where the previous version of ``ckpt`` is deleted from: ``.NAME.tietool-deleting-<pid>-<token>``."""
    return ckpt.with_name(f".{ckpt.name}{DELETING_TAG}{os.getpid()}-{token}")


def new_token() -> str:
    return secrets.token_hex(6)


@dataclass
class Swapped:
    """What :func:`swap_in` did.

    Attributes:
        exchanged: the atomic exchange was used (False: two renames).
        left_to_delete: without a backup, the previous version's folder when it could not be deleted
            completely (``.NAME.tietool-deleting-…``), with ``error`` the first reason; None when deleted.
    """

    exchanged: bool
    left_to_delete: str | None = None
    error: str | None = None


def swap_in(
    ckpt: Path, staging: Path, backup: Path | None, token: str, fsync_dir: Callable[[Path], None]
) -> Swapped:
    """Put the complete new version ``staging`` (fsynced) under ``ckpt``'s name; the old version goes to
    ``backup``, or, when None, to :func:`deleting_path` (fsynced) and is then deleted. The swap runs with
    signals deferred (:func:`signals_deferred`); the deletion does not (an interrupted one is finished by
    the next run).

    Raises:
        OSError: the swap failed; the name then holds the old version (a fallback's first rename is undone)
            and ``staging`` is left for the caller to remove. When ``fsync_dir`` fails after a rename (the
            rename may not be durable), its error is raised at once and nothing more is moved or deleted:
            both versions stay complete where they are, each recognised by :func:`recover` (the old one at
            ``staging``, kept as a backup; at ``backup``; or at :func:`deleting_path` once the new one was
            synced under the name).
    """
    old = backup or deleting_path(ckpt, token)
    pause("swap")
    with signals_deferred():
        exchanged = exchange(staging, ckpt)
        if exchanged:
            fsync_dir(ckpt.parent)  # the new version is durable under the name
            pause("swapped")
            _publish_old(ckpt, staging, old, fsync_dir)
        else:
            _two_renames(ckpt, staging, old, fsync_dir)
        fsync_dir(ckpt.parent)
    if backup is not None:
        return Swapped(exchanged)
    pause("delete")
    err = delete_tree(old)
    # the new version is durable under the name already; a deletion that does not survive a crash leaves
    # the folder under its "being deleted" name, which the next run finishes deleting: harmless
    with contextlib.suppress(OSError):
        fsync_dir(ckpt.parent)
    return Swapped(exchanged, None if err is None else str(old), err)


def _publish_old(ckpt: Path, staging: Path, old: Path, fsync_dir: Callable[[Path], None]) -> None:
    """After the exchange, the old version (at ``staging``) to its backup or "being deleted" name ``old``;
    when that rename fails, the exchange is undone (the old version back under the name, durable), so that
    the run fails with the checkpoint unchanged and the caller removes the new version from ``staging``.

    Raises:
        OSError: the rename failed (undone when the exchange back succeeded: the name then holds the old
            version; else the name holds the new one and ``staging`` the old, complete).
    """
    try:
        os.rename(staging, old)
    except OSError:
        if exchange(staging, ckpt):
            fsync_dir(ckpt.parent)
        raise


def _two_renames(ckpt: Path, staging: Path, old: Path, fsync_dir: Callable[[Path], None]) -> None:
    """The fallback swap: ``ckpt`` → ``old``, then ``staging`` → ``ckpt``; a failed second rename puts the
    old version back under the name.

    Raises:
        OSError: either rename failed (the name holds the old version).
    """
    os.rename(ckpt, old)
    pause("renames")
    try:
        os.rename(staging, ckpt)
    except OSError:
        os.rename(old, ckpt)
        raise
    fsync_dir(ckpt.parent)


def interrupted_state(ckpt: Path, token: str, staging: Path, backup: Path | None) -> str:
    """After a Ctrl-C or SIGTERM in an in-place run: what is under ``ckpt``'s name now, by looking (the new
    version carries ``token`` in its report), in words for the one line the run ends with. A new version
    never swapped in (``staging`` with ``token``) is removed; with no folder under the name (cannot happen
    while the swap defers signals), :func:`recover` runs at once."""
    if not os.path.lexists(ckpt):
        recover(ckpt)
    if token_of(staging) == token:
        shutil.rmtree(staging, ignore_errors=True)
    if token_of(ckpt) != token:
        return f"{ckpt} is unchanged (the previous version); nothing was written"
    done = f"{ckpt} holds the new version (complete)"
    deleting = deleting_path(ckpt, token)
    if backup is not None and backup.exists():
        return f"{done}; the previous version is {backup}"
    if deleting.exists():
        return (
            f"{done}; the previous version was being deleted: the next tietool run on it deletes {deleting}"
        )
    if staging.exists():
        return f"{done}; the previous version is {staging}: the next tietool run on it keeps it as a backup"
    return f"{done}; no backup kept"


def lock_path(ckpt: Path) -> Path:
    """The lock file of checkpoint ``ckpt``: ``.NAME.tietool-lock`` beside it."""
    return ckpt.with_name(f".{ckpt.name}{LOCK_TAG}")


@contextmanager
def locked(ckpt: Path) -> Iterator[None]:
    """Hold the exclusive lock of checkpoint ``ckpt`` (``flock`` on :func:`lock_path`, which records the
    holder's pid) for the ``with`` block, which writes. The file exists only while a run writes: it is
    removed at the end while still locked (a killed run's by the next run, :func:`recover`), and a run that
    locked a file already removed (it opened it just before) sees that the name no longer leads to its file
    and refuses, so two runs never both hold it.

    Raises:
        RefusedError: another run holds the lock (its pid named when recorded), or just released it.
        OutputError: the lock file cannot be created or written (a read-only folder, a full disk); no lock
            file is left.
    """
    path = lock_path(ckpt)
    fd = _open_lock(path)
    try:
        _lock(fd, ckpt, path)
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
        except BaseException:
            with contextlib.suppress(OutputError):
                _unlock(path, "")
            raise
        _unlock(path, "the checkpoint was rewritten (the new version is in place), but ")
    finally:
        os.close(fd)  # releases the lock


def _unlock(path: Path, done: str) -> None:
    """Remove the lock file at the end of a run, while still holding its ``flock`` (a run that opened it
    now refuses, :func:`locked`); one failure (EIO) is retried. ``done`` opens the error's line (what the
    run did).

    Raises:
        OutputError: it cannot be removed (named; the next run removes it: :func:`recover`).
    """
    for attempt in (1, 2):
        try:
            path.unlink(missing_ok=True)
            return
        except OSError as e:
            if attempt == 2:
                raise OutputError(
                    f"{done}the lock file {path.name} cannot be removed ({e.strerror})",
                    path,
                    "the next tietool run on the checkpoint removes it (or delete it once no run is active)",
                ) from None


def _open_lock(path: Path) -> int:
    """Open (or create) lock file ``path``: never through a symlink, never blocking, a regular file only
    (a link there could make the truncation that records the pid hit another file).

    Raises:
        OutputError: it cannot be created, or something else has its name (named, left alone).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputError(
                f"{path.name} is a symbolic link, not tietool's lock file; nothing was written",
                path,
                "remove it (tietool creates that file while it rewrites the checkpoint) and run again",
            ) from None
        raise _lock_error(e, path) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OutputError(
            f"{path.name} is {kind_of(mode)}, not tietool's lock file; nothing was written",
            path,
            "remove it (tietool creates that file while it rewrites the checkpoint) and run again",
        )
    return fd


def _lock_error(e: OSError, path: Path) -> OutputError:
    """The one-line error for a lock file that cannot be created or written."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(
            f"no space left on the device for the lock file {path.name}; nothing was written",
            path.parent,
            "free space (or inodes) on that file system and run again",
        )
    return OutputError(
        f"cannot create the lock file {path.name}: {e.strerror}; nothing was written",
        path.parent,
        "check the folder's permissions",
    )


def _lock(fd: int, ckpt: Path, path: Path) -> None:
    """Take the lock on open lock file ``fd`` (at ``path``) without waiting and record this pid in it.

    Raises:
        RefusedError: another process holds it.
        OutputError: the pid cannot be written (a full disk); the file is removed first.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise RefusedError(
            f"another tietool run{who} is rewriting {ckpt.name} in place", ckpt, "wait for it to finish"
        ) from None
    except OSError as e:  # EIO, ENOLCK: not held by anyone we know of
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == 0 and os.fstat(fd).st_ino == os.stat(path).st_ino:
                path.unlink()  # an empty file: ours, just created (a holder records its pid at once)
        raise OutputError(
            f"cannot lock {path.name}: {e.strerror}; nothing was written",
            path,
            "check the file system (its log), then run again",
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        if os.fstat(fd).st_ino == os.stat(path).st_ino:  # ours (we hold its flock): no file left behind
            path.unlink(missing_ok=True)
        raise _lock_error(e, path) from None


def synced(staging: Path, ckpt_path: Path) -> None:
    """:func:`fsync_tree` of the new version before the swap.

    Raises:
        OutputError: a folder of it could not be fsynced (EIO): the checkpoint is unchanged (the caller
            removes the new version).
    """
    try:
        fsync_tree(staging)
    except NotDurable as e:
        raise OutputError(
            f"the new version could not be fsynced ({e.strerror}); the checkpoint is unchanged and the new "
            "version was removed",
            Path(e.filename or staging),
            "check the disk (an I/O error: see dmesg) and run again",
        ) from None


def swap(
    ckpt_path: Path, staging: Path, bak: Path | None, token: str, fsync_dir: Callable[[Path], None]
) -> Swapped:
    """:func:`swap_in`, with the error saying what the name holds when it fails.

    Raises:
        OutputError: the swap failed (permissions, a busy mount): the name holds the old version (the
            caller removes the new one); or, after the exchange, moving the old version away failed; or the
            parent folder could not be fsynced after a rename (EIO: named, with what the name holds now and
            where the previous version is).
    """
    try:
        return swap_in(ckpt_path, staging, bak, token, fsync_dir)
    except NotDurable as e:
        raise OutputError(
            f"the folder could not be fsynced after the swap ({e.strerror}): a rename in it may not survive "
            f"a crash; {interrupted_state(ckpt_path, token, staging, bak)}",
            Path(e.filename or ckpt_path.parent),
            "check the disk (an I/O error: see dmesg); after a crash the next tietool run on the checkpoint "
            "puts its folders right",
        ) from None
    except OSError as e:
        if token_of(ckpt_path) == token:
            raise OutputError(
                f"the new version is in place, but the previous version could not be moved from {staging} "
                f"({e.strerror})",
                ckpt_path,
                "the next tietool run on it keeps that folder as a backup; delete it if you do not need it",
            ) from None
        raise OutputError(
            f"could not swap the new version in ({e.strerror}); the checkpoint is unchanged and the new "
            "version was removed",
            ckpt_path,
            "free the folder (permissions, a busy mount) and run again",
        ) from None


def refuse_deleting_left_out(plan: Plan, keep_training_state: bool) -> None:
    """In place without a backup, files the output leaves out would be deleted: refuse, naming them."""
    ck = plan.ckpt
    lost = [
        x.file
        for x in surface.output_left_out(
            ck.path, ck.left_out, ck.training_state, plan.changed, keep_training_state
        )
        if not x.kept
    ]
    if lost:
        raise RefusedError(
            f"in place without a backup would delete {', '.join(lost)} (not part of the new checkpoint)",
            ck.path,
            "keep the backup (the default), keep the training state, or write to another folder",
        )
