"""The stores a checkpoint folder lives in (:func:`store_for`): :class:`LocalStore` (a folder on disk),
:class:`RemoteStore` (object storage through ``fsspec``) and :class:`MemoryStore` (a dict of name → bytes, for
tests), behind one :class:`Store` protocol: check an output location, stage, publish (remote: uploads in
threads, server-side copies of unchanged files, the report and configs last). Addressing and reading bytes
is :mod:`surgery.io.store`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
from collections.abc import MutableSequence, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..model.errors import Opt, OutputError, UsageError
from .store import (
    STREAM_CHUNK,
    as_path,
    count,
    is_remote,
    is_url,
    list_files,
    map_errors,
    open_read,
    read_range,
    same_store,
    size,
)

# ---------------------------------------------------------------------------------------------- the seam
Written = MutableSequence[Any]  # the objects a publish wrote so far (for the clean-up of a failed run)


class Store(Protocol):
    """Where a checkpoint folder's bytes live, as one narrow interface (httpx's transport): the rest of
    tietool asks a store, not ``if remote``. :func:`store_for` gives the store of a path.

    Names are relative to :attr:`root` (``"model-00001-of-00002.safetensors"``, ``"sub/vocab.txt"``).
    Implementations: :class:`LocalStore` (a folder of this machine: memory maps, ``copy_file_range``, hard
    links, atomic renames), :class:`RemoteStore` (an fsspec file system: range requests, server-side copies,
    published in order), :class:`MemoryStore` (a dict of name → bytes, for tests: no files, no server).

    Publishing is not part of the protocol: a local output is renamed into place atomically by
    :func:`surgery.write.publish.publish` (and swapped in by :mod:`surgery.write.inplace`), which need the
    signal deferral, the fsyncs and the crash recovery of ``write/``, a layer above this one (``io`` may
    not import it); an output in object storage has no rename, and :meth:`RemoteStore.publish` uploads it
    in order (index last). The caller knows which it holds (:attr:`on_disk`).

    Attributes:
        root: the folder, a path object (``Path`` or ``UPath``) the readers of :mod:`surgery.io` take.
        on_disk: the files are in this machine's file system: a library can open them, numpy can map them,
            the folder can be renamed into place atomically (so a run can rewrite it in place).
    """

    root: Any
    on_disk: bool

    def list(self, prefix: str = "") -> dict[str, int] | None:
        """The files directly in folder ``prefix`` (name → bytes); None when ``prefix`` is a file.

        Raises:
            FileNotFoundError: nothing at ``prefix``.
        """
        ...

    def size(self, rel: str) -> int:
        """Bytes in file ``rel``."""
        ...

    def read_range(self, rel: str, offset: int, nbytes: int) -> bytes:
        """``nbytes`` bytes of file ``rel`` from ``offset`` (fewer at the end of the file)."""
        ...

    def open_read(self, rel: str, block_size: int | None = -1) -> Any:
        """A binary file object on ``rel`` (as :func:`open_read`)."""
        ...

    def check_output(self, inp: Any, out: Any) -> None:
        """Refuse output folder ``out`` (in this store) for input ``inp``: the input, inside it, containing
        it, or holding files already.

        Raises:
            UsageError: with the fix (another output).
            OutputError: a local ``out`` (or a folder above it) is a dangling link or a loop of links.
        """
        ...

    def map_errors(self, where: Any = None, *, output: bool = False) -> AbstractContextManager[None]:
        """A context in which a third-party error (:func:`third_party_errors`) becomes tietool's one line
        naming ``where`` (default: :attr:`root`): :class:`CheckpointError` (exit 3) while reading,
        :class:`OutputError` (exit 6) while writing (``output``)."""
        ...


@dataclass(frozen=True)
class Copy:
    """A whole file of the input the output holds unchanged: ``src`` (a path object of the input's store)
    to output-relative name ``rel``; ``label`` and ``tensor_bytes`` for the progress bar (None: no bar)."""

    src: Any
    rel: str
    label: str | None
    tensor_bytes: int = 0


def store_for(path: Any) -> Store:
    """The store ``path`` (a ``Path``, a ``UPath``, or a folder argument: :func:`as_path`) lives in.

    Raises:
        UsageError: as :func:`as_path`, for a URL no installed backend handles.
    """
    if isinstance(path, str | os.PathLike) and not isinstance(path, Path) and not is_remote(path):
        path = as_path(path)
    if is_remote(path):
        return RemoteStore(path)
    return LocalStore(Path(path))


class LocalStore:
    """A folder of this machine (:class:`Store`): the readers of :mod:`surgery.io` keep their fast paths
    (memory maps, ``copy_file_range``, hard links), and an output is published by an atomic rename
    (:func:`surgery.write.publish.publish`, which holds the signals and the fsyncs around it)."""

    on_disk = True

    def __init__(self, root: Path):
        self.root = Path(root)

    def list(self, prefix: str = "") -> dict[str, int] | None:
        folder = self.root / prefix
        if folder.is_file():
            return None
        return {e.name: e.stat().st_size for e in os.scandir(folder) if e.is_file()}

    def size(self, rel: str) -> int:
        return os.stat(self.root / rel).st_size

    def read_range(self, rel: str, offset: int, nbytes: int) -> bytes:
        return read_range(self.root / rel, offset, nbytes)

    def open_read(self, rel: str, block_size: int | None = -1) -> Any:
        return open(self.root / rel, "rb")

    def check_output(self, inp: Any, out: Any) -> None:
        check_local_output(inp, Path(out))

    def map_errors(self, where: Any = None, *, output: bool = False) -> AbstractContextManager[None]:
        return map_errors(self.root if where is None else where, output=output)


def is_local(p: Any) -> bool:
    """``p`` is in this machine's file system (its store is :attr:`Store.on_disk`; a URL string never is):
    the one local-or-remote question the layers above ``io`` ask."""
    return not is_url(p) and store_for(p).on_disk


def local_root(p: Any) -> Path | None:
    """The local folder or file ``p`` names (a ``Path``), or None when ``p`` is remote (:func:`is_local`)."""
    return Path(store_for(p).root) if is_local(p) else None


def same_local_file(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are one local file (the same device and inode: a hard link, or the same path); never
    for a remote path."""
    if not (is_local(a) and is_local(b)):
        return False
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_local_output(inp: Any, out: Path) -> None:
    """:meth:`LocalStore.check_output`: refuse an ``--out`` that is the input, inside it, contains it, or is
    a non-empty existing path (the input may be remote).

    A symbolic link as ``--out`` (or above it) is followed: the output is written into the folder it leads
    to, which must be empty or new as any ``--out``; a link that leads nowhere is refused here, before any
    work.

    Raises:
        UsageError: with the fix (another folder).
        OutputError: ``out`` or a folder above it is a dangling symbolic link or a link loop.
    """
    _check_out_links(out)
    ro = out.resolve()
    if not is_remote(inp):  # a local output cannot be the remote input or inside it
        ri = inp.resolve()
        if ro == ri or ri in ro.parents:
            raise UsageError(
                f"{Opt('out')} is the input folder or inside it; the input is never modified",
                out,
                f"choose an {Opt('out')} outside the checkpoint folder",
            )
        if ro in ri.parents:
            raise UsageError(f"{Opt('out')} contains the input folder", out, f"choose another {Opt('out')}")
    if out.exists() and not out.is_dir():
        raise UsageError(
            f"{Opt('out')} is an existing file, not a folder",
            out,
            f"remove it or choose another {Opt('out')}",
        )
    if out.exists() and any(out.iterdir()):
        raise UsageError(
            f"{Opt('out')} already exists and is not empty", out, f"remove it or choose another {Opt('out')}"
        )


def _check_out_links(out: Path) -> None:
    """``out`` and every folder above it that is a symbolic link lead somewhere (a folder, or for ``out``
    also a file, which :func:`check_local_output` refuses as a file).

    Raises:
        OutputError: naming the link, what it points to, and that nothing was written.
    """
    for p in (out, *out.parents):
        if not os.path.islink(p):
            continue
        try:
            os.stat(p)
        except OSError as e:
            target = os.readlink(p)
            what = (
                f"is a symbolic link loop ({target})"
                if e.errno == errno.ELOOP
                else f"is a symbolic link to {target}, which does not exist"
            )
            where = Opt("out") if p == out else f"a folder above {Opt('out')}"
            raise OutputError(
                f"{where} {what}; nothing was written",
                p,
                f"create the folder it points to, remove the link, or choose another {Opt('out')}",
            ) from None


# whole-object copies and uploads in flight at once (each is a request the server does, or a stream)
PUBLISH_THREADS = 8


class RemoteStore:
    """A prefix of object storage through fsspec (:class:`Store`): range requests, listings cached per
    operation, and an output *published in order* (object stores have no rename):

    1. every untouched weight file and carried file is copied to the output: by the server when input and
       output are in one store (``s3fs``'s ``copy``: an S3 ``CopyObject``, no bytes through this machine),
       else streamed in :data:`STREAM_CHUNK` pieces; the rewritten files (staged and read back in a local
       folder) are uploaded; the size of every object is checked against its source;
    2. then ``tietool-report.json`` and the config file(s); and the index (``*.index.json``) last.

    A loader reads the index (sharded checkpoints) or ``config.json`` (single-file ones) first, so a reader
    of the output never sees a checkpoint that claims to be complete while objects are missing.
    """

    on_disk = False

    def __init__(self, root: Any):
        self.root = root

    def list(self, prefix: str = "") -> dict[str, int] | None:
        return list_files(self.root / prefix if prefix else self.root)

    def size(self, rel: str) -> int:
        return size(self.root / rel)

    def read_range(self, rel: str, offset: int, nbytes: int) -> bytes:
        return read_range(self.root / rel, offset, nbytes)

    def open_read(self, rel: str, block_size: int | None = -1) -> Any:
        return open_read(self.root / rel, block_size)

    def map_errors(self, where: Any = None, *, output: bool = False) -> AbstractContextManager[None]:
        return map_errors(self.root if where is None else where, output=output)

    def check_output(self, inp: Any, out: Any) -> None:
        """Refuse an output that is the input, inside it, contains it, or already holds objects (files).

        Raises:
            UsageError: with the fix (another output).
            CheckpointError: the output prefix cannot be listed (naming it).
        """
        if same_store(inp, out):
            a, b = str(inp).rstrip("/") + "/", str(out).rstrip("/") + "/"
            if a == b or b.startswith(a):
                raise UsageError(
                    f"{Opt('out')} is the input or inside it; the input is never modified",
                    str(out),
                    f"choose an {Opt('out')} outside the checkpoint",
                )
            if a.startswith(b):
                raise UsageError(f"{Opt('out')} contains the input", str(out), f"choose another {Opt('out')}")
        me = out.path.rstrip("/")
        try:
            with map_errors(out, keep=(FileNotFoundError,)):
                entries = out.fs.ls(out.path, detail=True)
        except FileNotFoundError:
            entries = []
        if len(entries) == 1 and entries[0]["type"] == "file" and entries[0]["name"] == me:
            raise UsageError(
                f"{Opt('out')} is an existing object (a file), not a folder",
                str(out),
                f"give a prefix for {Opt('out')} that holds nothing yet",
            )
        # a folder marker ("me/", what "Create folder" in a console makes) is not content
        if any(e["name"].rstrip("/") != me for e in entries):
            raise UsageError(
                f"{Opt('out')} already exists and is not empty",
                str(out),
                f"remove it or choose another {Opt('out')}",
            )

    def publish(
        self, staging: Path, out: Any, copies: Sequence[Copy], progress: Any, written: Written
    ) -> None:
        """Copy ``copies`` and upload the files of ``staging`` to ``out``: weight and carried files first
        (in threads), then the report and the config files, then the index; each object's size is checked.
        ``written`` collects the objects written (for :meth:`remove` after a failure).

        Raises:
            OutputError: a copy or an upload failed, or an object has another size than its source.
        """
        last = [_REPORT, *_CONFIGS, *_INDEXES]  # in publishing order: the index at the end
        local = [p.relative_to(staging).as_posix() for p in sorted(staging.rglob("*")) if p.is_file()]
        first = [Copy(staging / rel, rel, None) for rel in local if rel not in last] + list(copies)
        with ThreadPoolExecutor(PUBLISH_THREADS, thread_name_prefix="tietool-publish") as pool:
            futures = [pool.submit(_put, c.src, out / c.rel, written) for c in first]
            for fut, c in zip(futures, first, strict=True):
                fut.result()
                if progress is not None and c.label is not None:
                    progress(c.label, c.tensor_bytes)
        for rel in last:
            if rel in local:
                _put(staging / rel, out / rel, written)

    @staticmethod
    def remove(objects: builtins.list[Any]) -> builtins.list[Any]:
        """Delete the objects a failed run wrote, as far as the store can be reached (never raises).

        Returns:
            the objects that could not be deleted (some may not exist: the write that failed).
        """
        left = []
        for o in reversed(objects):
            try:
                o.fs.rm_file(o.path)
            except FileNotFoundError:
                pass
            except Exception:  # noqa: BLE001 - best effort: what is left is named by the caller
                left.append(o)
        return left


# the files published last, in this order (names as surgery.io.checkpoint has them; kept here, below it)
_REPORT = "tietool-report.json"
_CONFIGS = ("config.json", "model_config.json")
_INDEXES = ("model.safetensors.index.json", "model_state.pdparams.index.json")


def _put(src: Any, dst: Any, written: Written) -> None:
    """One object of the output: ``src`` (a local file or an object) copied to ``dst`` (an object), by the
    server within one store, else uploaded or streamed; then its size checked.

    Raises:
        OutputError: the request failed or the object's size differs (naming ``dst``).
    """
    n = size(src)
    with map_errors(dst, output=True):
        written.append(dst)
        if same_store(src, dst):
            dst.fs.copy(src.path, dst.path)
            count(copied=n)
        elif not is_remote(src):
            dst.fs.put_file(str(src), dst.path)
            count(sent=n)
        else:
            _stream(src, dst)
        got = dst.fs.info(dst.path)["size"]
    if got != n:
        raise OutputError(f"object has {got} bytes, its source {n}", str(dst), "run again")


def _stream(src: Any, dst: Any) -> None:
    """Copy object ``src`` to object ``dst`` of another store through this machine, one
    :data:`STREAM_CHUNK` at a time (memory: one chunk)."""
    with open_read(src, block_size=None) as fi, dst.fs.open(dst.path, "wb") as fo:
        while buf := fi.read(STREAM_CHUNK):
            fo.write(buf)


class MemoryStore(RemoteStore):
    """A checkpoint held in memory (a dict of name → bytes), for tests with no files and no server: fsspec's
    in-memory file system under a prefix of its own, read and written through :class:`RemoteStore` (range
    requests, listings, publishing in order), so the planner, the detection and the writer run on it as on
    object storage.

    ``MemoryStore({"config.json": b"...", "model.safetensors": b"..."})``; :meth:`from_folder` copies a
    local folder's files; :attr:`url` (``memory://tietool-…/ckpt``) is a folder argument of every operation;
    :meth:`files` reads a folder back as a dict.
    """

    def __init__(self, files: dict[str, bytes] | None = None, name: str = "ckpt"):
        import uuid

        self.url = f"memory://tietool-{uuid.uuid4().hex[:12]}/{name}"
        root = as_path(self.url)
        super().__init__(root)
        for rel, data in (files or {}).items():
            root.fs.pipe_file(f"{root.path}/{rel}", bytes(data))

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str], name: str = "ckpt") -> MemoryStore:
        """The files of local ``folder`` (recursively, by relative name) in a new store."""
        base = Path(folder)
        return cls(
            {p.relative_to(base).as_posix(): p.read_bytes() for p in base.rglob("*") if p.is_file()}, name
        )

    def sibling(self, name: str) -> str:
        """The URL of folder ``name`` beside :attr:`url` in this store (an output to write)."""
        return self.url.rsplit("/", 1)[0] + "/" + name

    def files(self, url: str | None = None) -> dict[str, bytes]:
        """Every file under ``url`` (default :attr:`url`), by relative name."""
        root = as_path(url or self.url)
        base = root.path.rstrip("/") + "/"
        return {p[len(base) :]: root.fs.cat_file(p) for p in sorted(root.fs.find(root.path))}

    def clear(self) -> None:
        """Remove every file of this store (memory is freed)."""
        top = self.url.rsplit("/", 1)[0]
        with contextlib.suppress(FileNotFoundError):
            self.root.fs.rm(as_path(top).path, recursive=True)
