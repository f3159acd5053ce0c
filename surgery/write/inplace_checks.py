"""The checks that make an in-place swap safe (:mod:`surgery.write.inplace`): before the swap, the folder
under the checkpoint's name and every file in it must still be the ones the run read (device, inode, size,
mtime), so that nothing another process wrote meanwhile is swapped out or deleted; and the new version takes
the permissions of the old one.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from ..model.errors import CheckpointError, RefusedError


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


FileId = tuple[int, int, int, int, str | None]
"""``(device, inode, size, mtime_ns, symlink target)`` of one input file (:func:`input_files`)."""


def input_files(folder: Path) -> dict[str, FileId]:
    """Every file under ``folder`` (relative path → :data:`FileId`, the file behind a symlink; a symlink
    to a folder or a dangling one by its own ``lstat``), taken before anything is read, so that every file
    tietool then reads, hard-links or copies (weights, configs, index, carried files) is covered."""
    found: dict[str, FileId] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        for name in filenames + [d for d in dirnames if (base / d).is_symlink()]:
            p = base / name
            try:
                link = os.readlink(p) if p.is_symlink() else None
                try:
                    st = os.stat(p)
                except OSError:
                    st = os.lstat(p)
            except OSError:
                continue
            found[str(p.relative_to(folder))] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, link)
    return found


def check_inputs(ckpt: Path, read: dict[str, FileId], staging: Path | None) -> None:
    """Before the swap: every file under ``ckpt`` must still be the one :func:`input_files` found at the
    start (same device, inode, size and mtime), and no file may have been added or removed; otherwise the
    new version is removed and the run refused, so that a shard another process replaced or rewrote during
    the run is never swapped out (nor, without a backup, deleted).

    Raises:
        CheckpointError: naming the first file that changed and how.
    """
    now = input_files(ckpt)
    if now == read:
        return
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    rel = sorted(k for k in read.keys() | now.keys() if read.get(k) != now.get(k))[0]
    old, new = read.get(rel), now.get(rel)
    if old is None or new is None:
        how = "appeared" if old is None else "was removed"
    elif old[:2] != new[:2]:
        how = "was replaced by another file"
    else:
        how = "was modified"
    raise CheckpointError(
        f"{how} while this run read the checkpoint; nothing was changed",
        ckpt / rel,
        "check what else writes to the checkpoint, wait for it to finish, then run again",
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
