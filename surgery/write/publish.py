"""Publishing an output: the temporary folder beside ``--out``, the checks of the output path, the
fsyncs, and the rename into place that makes a run all or nothing (dead temporaries of killed runs removed).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..io import stores
from ..io.checkpoint import REPORT_NAME
from ..model.errors import Interrupted, Opt, OutputError

TMP_TAG = ".tietool-tmp-"


def check_output_path(inp: Any, out: Any) -> None:
    """Refuse an ``--out`` that is the input, inside it, contains it, or is a non-empty existing path: the
    check of the store ``out`` is in (:meth:`surgery.io.stores.Store.check_output`; either may be a URL).

    A symbolic link as ``--out`` (or above it) is followed: the output is written into the folder it leads
    to (:func:`output_folder`), which must be empty or new as any ``--out``; a link that leads nowhere is
    refused here, before any work.

    Raises:
        UsageError: with the fix (another folder).
        OutputError: ``out`` or a folder above it is a dangling symbolic link or a link loop.
    """
    stores.store_for(out).check_output(inp, out)


def output_folder(out: Path) -> Path:
    """The folder an output is written to: ``out``, or where it leads when it is a symbolic link (to an
    empty folder: the link stays, the folder behind it is filled)."""
    return Path(os.path.realpath(out)) if os.path.islink(out) else out


def pid_alive(pid: int) -> bool:
    """Process ``pid`` is running (another user's counts as running: its folders are left alone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_temps(parent: Path) -> list[str]:
    """Remove every temporary output folder ``.X.tietool-tmp-<pid>`` in ``parent`` whose process is gone
    (a killed run's); returns their paths. A missing or unreadable ``parent`` holds none."""
    removed: list[str] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        if not (p.name.startswith(".") and TMP_TAG in p.name and p.is_dir() and not p.is_symlink()):
            continue
        pid = p.name.rsplit(TMP_TAG, 1)[1].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(str(p))
    return removed


def uninterruptibly(fn: Callable[[], None]) -> None:
    """Run ``fn`` to the end even if Ctrl-C (or SIGTERM, raised as KeyboardInterrupt) arrives meanwhile:
    for the clean-up steps (joining the copy threads, removing the temporary folder), which a second
    Ctrl-C must not cut short. ``fn`` must be safe to call again after an interruption."""
    while True:
        try:
            fn()
            return
        except KeyboardInterrupt:
            continue


def publish(out: Path, fill: Callable[[Path], dict], report: Callable[[dict], dict] | None) -> dict:
    """Build an output folder atomically: ``fill(tmp)`` writes it into a temporary folder beside ``out``
    (``.NAME.tietool-tmp-PID``) and returns the written-file facts; ``report(facts)``, if given, is written
    as ``tietool-report.json`` inside; then everything is fsynced and the folder renamed to ``out`` (which
    must not exist, or be empty: the caller checks). Temporary folders of dead runs beside ``out`` are
    removed first, and listed as the report's ``removed_stale_temps`` (absent when there were none).

    Returns:
        the report (or the facts when ``report`` is None).

    Raises:
        OutputError: the output cannot be written (no space, permissions); nothing is left behind.
    """
    out = output_folder(out)
    stale = remove_dead_temps(out.parent)
    parent = _make_parent(out)
    tmp = parent / f".{out.name}{TMP_TAG}{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    published = False
    try:
        tmp.mkdir()
        facts = fill(tmp)
        if report is not None:
            facts = report(facts)
        if stale:
            facts = {**facts, "removed_stale_temps": stale}
        if report is not None:
            write_json(tmp / REPORT_NAME, facts)
        fsync_tree(tmp)
        with signals_deferred():  # a Ctrl-C or SIGTERM lands before the rename or after it
            if out.exists():
                out.rmdir()  # empty: the caller checked
            os.rename(tmp, out)
            published = True
            fsync_dir(parent)
        return facts
    except BaseException as e:
        if published and isinstance(e, KeyboardInterrupt):  # came during the rename, held back until now
            raise Interrupted(f"the output {out} was written completely just before") from None
        uninterruptibly(lambda: shutil.rmtree(tmp, ignore_errors=True))
        if published and isinstance(e, NotDurable):  # renamed, but the rename may not survive a crash
            uninterruptibly(lambda: shutil.rmtree(out, ignore_errors=True))
        if not isinstance(e, OSError):
            raise
        raise output_error(e, parent, tmp) from None


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold back SIGINT, SIGTERM and SIGHUP for the ``with`` block, then deliver the first one that came (to
    the handler that was there before): a Ctrl-C or SIGTERM lands before or after the block, never inside.
    Python runs signal handlers in the main thread only, so from another thread nothing can interrupt the
    block (a signal whose action kills the process, as SIGKILL does, is for :func:`recover`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    saved = {}
    for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if s is not None and signal.getsignal(s) is not None:  # None: a handler not set from Python
            saved[s] = signal.signal(s, lambda n, _f: got.append(n))
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        if got:
            signal.raise_signal(got[0])


def _make_parent(out: Path) -> Path:
    """Create the parent folder of ``out`` (and its parents) if missing; returns it.

    Raises:
        OutputError: the folder cannot be created.
    """
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        file = next((p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), None)
        if file is not None:  # mkdir says only "File exists" (or "Not a directory") of the wrong path
            raise OutputError(
                "is a file, so the output cannot be created inside it; nothing was written",
                file,
                f"choose an {Opt('out')} whose parent is a folder",
            ) from None
        raise OutputError(
            f"cannot create the output's parent folder: {e.strerror}", parent, "check the path"
        ) from None
    return parent


def output_error(e: OSError, parent: Path, tmp: Path | None = None) -> OutputError:
    """The :class:`OutputError` for a failed write of the output (``parent``: the output's parent
    folder, ``tmp``: the temporary folder it is built in): no space left, a parent folder that cannot be
    written (named, not the temporary folder it failed to create), or the OS error naming the file."""
    if e.filename == str(tmp) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return OutputError(
            f"cannot create the output in this folder: {e.strerror}; nothing was written",
            parent,
            f"choose an {Opt('out')} in a folder you can write to",
        )
    if isinstance(e, NotDurable):
        return OutputError(
            f"the folder could not be fsynced ({e.strerror}): the output might not survive a crash, so it "
            "was removed; nothing was written",
            Path(e.filename) if e.filename else parent,
            "check the disk (an I/O error: see dmesg) and run again",
        )
    if e.errno == errno.ENOSPC:
        return OutputError(
            "no space left on the device; nothing was written",
            parent,
            f"free space or choose an {Opt('out')} on another disk",
        )
    return OutputError(
        f"cannot write the output: {e.strerror or e}",
        getattr(e, "filename", None) or parent,
        "check permissions and free space; nothing was written",
    )


def fsync_tree(folder: Path) -> None:
    """fsync ``folder`` and every folder under it (not following symlinks), so that the entries in them
    (hard links, symlinks, renamed files) are durable; files are fsynced by their writers."""
    for dirpath, _dirs, _files in os.walk(folder):
        fsync_dir(Path(dirpath))


# A folder's fsync that fails with these says the file system cannot sync a folder at all (some FUSE, network
# and virtual file systems answer EINVAL or ENOTSUP/EOPNOTSUPP): nothing was lost, the renames in it are as
# durable as that file system makes them, and no retry would do better, so they are ignored. Any other error
# (EIO above all: the write-back of the folder failed) means a rename in it may not survive a crash.
_CANNOT_SYNC_FOLDERS = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})

# Opening a folder to fsync it fails harmlessly with these: a folder one may write but not read (mode
# 0300) cannot be opened, and one already removed (a tree walked while leftovers go) has nothing to sync.
_CANNOT_OPEN_FOLDERS = frozenset({errno.EACCES, errno.EPERM, errno.ENOENT})


class NotDurable(OSError):
    """A folder's fsync failed (``errno`` and ``strerror`` of the failure, ``filename`` the folder): the
    entries renamed or linked in it may not survive a crash."""


def fsync_dir(p: Path) -> None:
    """fsync the folder ``p``, so that the entries renamed, linked or created in it are durable.

    Failures that only say the folder cannot be synced on this file system (:data:`_CANNOT_SYNC_FOLDERS`)
    or opened (:data:`_CANNOT_OPEN_FOLDERS`) are ignored.

    Raises:
        NotDurable: any other failure (EIO: a rename in ``p`` may not be durable).
    """
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as e:
        if e.errno in _CANNOT_OPEN_FOLDERS or e.errno in _CANNOT_SYNC_FOLDERS:
            return
        raise NotDurable(e.errno, e.strerror, str(p)) from e
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _CANNOT_SYNC_FOLDERS:
            raise NotDurable(e.errno, e.strerror, str(p)) from e
    finally:
        os.close(fd)


# How tietool writes JSON files (json.dump's arguments); the read-back of an index encodes it the same way.
JSON_STYLE: dict[str, Any] = {"indent": 2, "ensure_ascii": False}


def write_json(path: Path, data: Any) -> None:
    from ..io.json_indent import dumps_indented  # only a write needs it (inspect imports this module)

    with open(path, "w", encoding="utf-8") as fh:
        fh.write(dumps_indented(data, JSON_STYLE["indent"]) + "\n")  # json.dump's text, faster
        fh.flush()
        os.fsync(fh.fileno())
