"""The files below a checkpoint folder, symbolic links included.

Rules (README, "Symbolic links in a checkpoint"):

* a symlinked file is the file behind it (an output holds a regular file with its bytes);
* a symlinked subfolder (``tokenizer/ -> ../shared_tokenizer``, ``assets/ -> /data/assets``, relative or
  absolute, inside the folder or outside it) is followed: its files are part of the checkpoint as if the
  folder were real. An ``--out`` output holds a real folder with them (a relative link pointing outside
  would dangle there); the in-place new version keeps the same link (:class:`FolderLink`), as
  ``save_pretrained`` into the same folder would leave it;
* a dangling link, a link loop (a folder link leading to the checkpoint or a folder above it, or to one of
  its own parents), an unreadable subfolder, or more than :data:`MAX_ENTRIES` entries is refused by name
  (exit 3): never silently dropped.

A FIFO, socket or device below the folder (or a link to one) is refused by name, never opened: a copy of it
would block or never end, and leaving it out would drop a file silently.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ..model.errors import CheckpointError
from .regular import kind_of

MAX_ENTRIES = 100_000
"""Entries (files and folders) a walk visits at most: a folder link to a huge tree (or a diamond of links
that multiplies one) is refused rather than walked for minutes."""


@dataclass(frozen=True)
class FolderLink:
    """A symbolic link to a folder below a checkpoint.

    Attributes:
        rel: the link's path relative to the checkpoint (``tokenizer``, ``assets/images``).
        target: the link's text (``os.readlink``), kept as is when the link is kept.
        files: every regular file below it, relative to the checkpoint.
    """

    rel: str
    target: str
    files: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"link": self.rel, "target": self.target, "files": len(self.files)}


def stat_link(path: str) -> os.stat_result:
    """``os.stat`` of the symbolic link ``path`` (followed); also for a reader that opens one named file
    (a flex checkpoint's ``.distcp``) to say what a link that cannot be followed is.

    Raises:
        CheckpointError: a dangling link, a loop of links, or one that cannot be followed.
    """
    try:
        return os.stat(path)
    except OSError as e:
        target = os.readlink(path)
        if e.errno == errno.ELOOP:
            what = f"is a symbolic link loop ({target})"
        elif e.errno in (errno.ENOENT, errno.ENOTDIR):
            what = f"is a symbolic link to {target}, which does not exist"
        else:
            what = f"is a symbolic link to {target}, which cannot be read: {e.strerror}"
        raise CheckpointError(
            what, path, "restore what it points to or remove the link (tietool never drops a file silently)"
        ) from None


def _contains(outer: str, inner: str) -> bool:
    return os.path.commonpath([outer, inner]) == outer


def walk(root: Path) -> tuple[list[str], list[FolderLink]]:
    """The regular files below folder ``root`` (relative POSIX paths, sorted), following symlinked files and
    subfolders, and the symlinked subfolders met on the way (outermost first).

    Raises:
        CheckpointError: a dangling link, a link loop, an unreadable subfolder, a FIFO, socket or device,
            more than :data:`MAX_ENTRIES` entries (each naming the path).
    """
    real_root = os.path.realpath(root)
    files: list[str] = []
    links: list[tuple[str, str]] = []  # rel, target
    todo: list[tuple[str, str, frozenset]] = [(str(root), "", frozenset({_key(os.stat(root))}))]
    seen = 0
    while todo:
        folder, rel, above = todo.pop()
        for name, path, st, link in _entries(folder):
            seen += 1
            if seen > MAX_ENTRIES:
                raise CheckpointError(
                    f"holds more than {MAX_ENTRIES} files and folders (symbolic links followed)",
                    str(root),
                    "a checkpoint folder holds its weights, configs and tokenizer: move the rest out",
                )
            sub = f"{rel}{name}"
            if stat.S_ISDIR(st.st_mode):
                if _key(st) in above or (link and _contains(os.path.realpath(path), real_root)):
                    raise CheckpointError(
                        "is a symbolic link loop: it leads back to the checkpoint or a folder above it",
                        path,
                        "remove the link (or replace it by a copy of the folder it should hold)",
                    )
                todo.append((path, sub + "/", above | {_key(st)}))
                if link:
                    links.append((sub, os.readlink(path)))
            elif stat.S_ISREG(st.st_mode):
                files.append(sub)
            else:  # never opened: a FIFO blocks the copy, a device never ends
                raise CheckpointError(
                    f"{sub} is {kind_of(st.st_mode)}, expected a regular file: tietool reads or copies every "
                    "file of a checkpoint",
                    path,
                    "remove it from the checkpoint folder, or replace it with the real file",
                )
    return sorted(files), _folder_links(links, files)


def _folder_links(links: list[tuple[str, str]], files: list[str]) -> list[FolderLink]:
    """Each link with the files below it (a file is below ``rel`` when its path starts with ``rel/``)."""
    return [
        FolderLink(rel, target, tuple(sorted(f for f in files if f.startswith(rel + "/"))))
        for rel, target in sorted(links)
    ]


def _key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _entries(folder: str):
    """``(name, path, stat, is_link)`` of each entry of ``folder``, links followed; FIFOs, sockets and
    devices are returned too (the caller refuses them) but never opened.

    Raises:
        CheckpointError: the folder cannot be listed; a link that cannot be followed (:func:`stat_link`).
    """
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise CheckpointError(
            f"cannot list this folder of the checkpoint: {e.strerror}",
            folder,
            "give tietool read access to it or move it out of the checkpoint",
        ) from None
    for entry in entries:
        if entry.is_symlink():
            yield entry.name, entry.path, stat_link(entry.path), True
        else:
            yield entry.name, entry.path, entry.stat(follow_symlinks=False), False


class Placed(Enum):
    """What :func:`place_kept` did with a file an output keeps unchanged (the report's ``files`` list it
    goes in)."""

    SYMLINKED = "symlinked"
    LINKED = "linked"
    COPY = "copied"  # nothing yet: the caller copies the bytes of the file behind the name


def linked_files(root: object, rels: Collection[str]) -> list[tuple[str, str]]:
    """``(rel, link text)`` of each file of ``rels`` that is a symbolic link in the local folder ``root``
    (none for a remote root), sorted: an edit writes a regular file in its place (the rule of
    ``docs/reference/in-place.md``), which the report says."""
    from .stores import local_root

    local = local_root(root)
    if local is None:
        return []
    return [(rel, os.readlink(local / rel)) for rel in sorted(rels) if (local / rel).is_symlink()]


def place_kept(src: Path, dst: Path, folder: Path, carried: Collection[str], link: bool) -> Placed:
    """Put the unchanged file ``src`` (below checkpoint ``folder``) at ``dst`` in the output, by the one
    rule every write follows (README, "In place" and "Symbolic links in a checkpoint"):

    * with ``link``, a relative symbolic link to another file of ``carried`` (names relative to
      ``folder``, each of which the output holds at the same place) stays the same link: it leads to the
      same file there;
    * any other symbolic link is the file behind it, never the link: a link that leads outside ``folder``
      (``tokenizer.model -> ../base/tokenizer.model``) would dangle at the output's place;
    * with ``link``, that file is hard-linked (``os.link`` of its real path: Linux's ``link(2)`` would link
      the symbolic link itself) where the file system allows; otherwise :attr:`Placed.COPY` is returned and
      the caller copies its bytes (``dst``'s folder exists, nothing is made).

    Raises:
        OSError: a symbolic link cannot be made.
    """
    if link and src.is_symlink() and not os.path.isabs(os.readlink(src)):
        base, behind = os.path.realpath(folder), os.path.realpath(src)
        if os.path.commonpath([base, behind]) == base and os.path.relpath(behind, base) in carried:
            os.symlink(os.readlink(src), dst)
            return Placed.SYMLINKED
    if link:
        try:
            os.link(os.path.realpath(src), dst)
            return Placed.LINKED
        except OSError:  # another file system (EXDEV), or links not allowed: copied
            pass
    return Placed.COPY
