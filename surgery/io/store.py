"""Where a checkpoint's bytes live: a local folder or a URL of object storage.

A folder argument that is a URL (``s3://bucket/prefix``, ``hf://org/model``, any protocol ``fsspec`` has a
file system for) becomes a ``universal_pathlib`` ``UPath`` over that file system; anything else stays a
:class:`pathlib.Path`. The rest of tietool uses the methods both share (``/``, ``name``, ``exists``,
``is_file``, ``iterdir``, ``rglob``, ``stat().st_size``, ``open``, ``read_text``) and, for the bytes of
weight files, the functions here, which keep the local fast paths (memory maps, ``copy_file_range``, hard
links) and give remote files range requests: :func:`read_range` fetches exactly the bytes asked for;
:func:`open_read` a file object that fetches ``block_size`` bytes per request (the ``.pdparams`` opcode
walker seeks past array payloads, so it reads only the pickle structure).

Credentials and endpoints are the backends' own (``s3fs``/botocore: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/config``; ``huggingface_hub``:
``HF_TOKEN``, ``HF_ENDPOINT``). ``fsspec``, ``s3fs`` and ``upath`` are imported only for a URL.

Every byte that crosses the network through these file systems is counted in :data:`TRANSFER`
(:class:`Transfer`): received, sent, and copied server-side (which crosses no client link).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import filecmp
import os
import re
import sys
import threading
from collections.abc import Iterator, MutableSequence, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ..model.errors import CheckpointError, Opt, OutputError, StorageError, TietoolError, UsageError
from ..model.extras import install_extra
from .transient import is_transient

# "scheme://" at the start of a folder argument; file:// is a local path
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

# the protocols the ``remote`` extra brings a file system for
_REMOTE_EXTRA = frozenset({"s3", "s3a", "hf"})

# bytes per request of a file opened for reading structure (a .pdparams pickle walk): the opcodes between
# two array payloads are small, so a small block keeps the bytes fetched close to the bytes parsed.
WALK_BLOCK = 64 << 10
# bytes per request when streaming a range (a tensor copied into a rewritten shard, a cross-store copy):
# also the memory a stream holds
STREAM_CHUNK = 32 << 20


@dataclass
class Transfer:
    """Bytes moved by remote file systems since the process started (or a :meth:`snapshot`).

    Attributes:
        received: bytes read from a remote store (response bodies of range and whole-object GETs).
        sent: bytes written to a remote store (bodies of uploads).
        copied_server_side: bytes of objects copied within one store by the server (no client traffic).
        requests: data requests made (reads of a range, uploads, server-side copies).
    """

    received: int = 0
    sent: int = 0
    copied_server_side: int = 0
    requests: int = 0

    def snapshot(self) -> Transfer:
        """A copy of the counts now."""
        return Transfer(**asdict(self))

    def since(self, before: Transfer) -> Transfer:
        """The counts accumulated after ``before`` (a :meth:`snapshot`)."""
        now = asdict(self)
        return Transfer(**{k: now[k] - v for k, v in asdict(before).items()})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


TRANSFER = Transfer()
_LOCK = threading.Lock()


def count(received: int = 0, sent: int = 0, copied: int = 0, requests: int = 1) -> None:
    """Add to :data:`TRANSFER` (thread-safe)."""
    with _LOCK:
        TRANSFER.received += received
        TRANSFER.sent += sent
        TRANSFER.copied_server_side += copied
        TRANSFER.requests += requests


def is_url(p: object) -> bool:
    """``p`` is a URL string of a remote store (``s3://``, ``hf://``, ...; not ``file://``)."""
    return isinstance(p, str) and bool(_URL_RE.match(p)) and not p.startswith("file://")


def local_only(command: str, path: object, out: object) -> None:
    """Refuse a URL as input ``path`` or output ``out`` of a command that reads and writes local folders only
    (``convert``, ``merge``: they rewrite every tensor, so a remote run would move the whole checkpoint
    through this machine anyway).

    Raises:
        UsageError: naming the URL and the local route (download first, or upload after).
    """
    if is_url(path):
        raise UsageError(
            f"{command} takes local folders only, not a URL",
            str(path),
            f"copy the checkpoint to a local folder first (aws s3 sync, huggingface-cli download) and run "
            f"{command} there",
        )
    if is_url(out):
        raise UsageError(
            f"{command} writes local folders only, not a URL",
            str(out),
            "write the output to a local folder, then upload it (aws s3 sync, huggingface-cli upload)",
        )


def is_remote(p: object) -> bool:
    """``p`` is a path object on a remote file system (a ``UPath`` that is not local)."""
    return not isinstance(p, Path) and hasattr(p, "fs") and hasattr(p, "protocol")


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


def as_path(p: str | os.PathLike) -> Any:
    """A folder argument as a path: a counting ``UPath`` for a URL (:func:`is_url`), else a ``Path``.

    Raises:
        UsageError: a URL whose protocol no installed fsspec backend handles.
    """
    if isinstance(p, str) and p.startswith("file://"):
        return Path(p[len("file://") :])
    if not is_url(p):
        return Path(p)
    scheme, rest = str(p).split("://", 1)
    if not rest.strip("/"):
        example = "org/model" if scheme == "hf" else "bucket/prefix"  # the Hub has repositories
        raise UsageError("the URL names no bucket or repository", str(p), f"e.g. {scheme}://{example}")
    try:
        from upath import UPath

        u = UPath(str(p).rstrip("/"))
        _instrument(u.fs)
    except ImportError as e:
        raise UsageError(
            f"reading {scheme}:// needs a package that is not installed ({e.name or e})",
            str(p),
            f"{install_extra('remote')} (fsspec, s3fs, universal_pathlib; huggingface_hub for hf://)"
            if scheme in _REMOTE_EXTRA
            else f"install the fsspec file system for {scheme}:// (fsspec's list of implementations names "
            "its package)",
        ) from None
    except ValueError as e:
        raise UsageError(
            f"not a supported URL ({e})", str(p), "use s3://bucket/prefix or hf://org/model"
        ) from None
    # each operation starts from fresh listings: fsspec keeps them per file-system instance, which lives as
    # long as the process (a Python session would otherwise see a folder as it was minutes ago)
    u.fs.invalidate_cache()
    return u


def path_of(p: Any) -> Any:
    """``p`` as a path object: a remote path stays itself, anything else becomes a ``Path``."""
    return p if is_remote(p) else Path(p)


def same_store(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are on one remote file system instance (so a server-side copy can join them)."""
    return is_remote(a) and is_remote(b) and a.fs is b.fs


def _instrument(fs: Any) -> None:
    """Make every file ``fs`` opens count its bytes in :data:`TRANSFER` (once per file system instance;
    fsspec caches instances, so one URL's paths share one)."""
    if getattr(fs, "_tietool_counted", False):
        return
    orig = fs._open

    def _open(path, mode="rb", *args, **kwargs):
        f = orig(path, mode, *args, **kwargs)
        _count_file(f, mode)
        return f

    fs._open = _open
    fs._tietool_counted = True


def _count_file(f: Any, mode: str) -> None:
    """Count the bytes file object ``f`` of an fsspec file system fetches (its cache's fetcher, which
    issues each range request) or writes."""
    if "r" in mode:
        cache = getattr(f, "cache", None)
        fetch = getattr(cache, "fetcher", None)
        if cache is None or fetch is None or getattr(f, "blocksize", None) == 0:
            # a streaming file (block size 0: HfFileSystemStreamFile reads past its cache): count its reads
            read = f.read

            def counted_read(*args):
                with map_errors(_url(f)):
                    data = read(*args)
                count(received=len(data))
                return data

            f.read = counted_read
            return

        def fetcher(start, end):
            with map_errors(_url(f)):  # one line naming the object, not the backend's traceback
                data = fetch(start, end)
            count(received=len(data))
            return data

        cache.fetcher = fetcher
    else:
        write = f.write

        def counted_write(data):
            n = write(data)
            count(sent=len(memoryview(data).cast("B")), requests=0)
            return n

        f.write = counted_write


def _url(f: Any) -> str:
    """The URL of the object fsspec file ``f`` reads (``s3://bucket/key``)."""
    try:
        return str(f.fs.unstrip_protocol(f.path))
    except Exception:
        return str(getattr(f, "path", f))


def remote_error(e: BaseException, path: Any, what: str = "read") -> TietoolError:
    """One line for an error of a remote file system while reading or writing object ``path``: a
    :class:`StorageError` (exit 75, run again) when the network or the store failed (:func:`is_transient`),
    else a :class:`CheckpointError` (exit 3)."""
    msg = first_line(e)
    if is_transient(e):
        return StorageError(
            f"cannot {what} the object ({type(e).__name__}{': ' + msg if msg else ''}): the network or the "
            "store failed",
            str(path),
            "run the command again (if it keeps failing, check the endpoint (AWS_ENDPOINT_URL / HF_ENDPOINT) "
            "and the connection)",
        )
    return CheckpointError(
        f"cannot {what} the object ({type(e).__name__}{': ' + msg if msg else ''})",
        str(path),
        "check the URL, the endpoint (AWS_ENDPOINT_URL / HF_ENDPOINT), the credentials and the connection",
    )


def read_range(path: Any, offset: int, nbytes: int) -> bytes:
    """``nbytes`` bytes of file ``path`` from byte ``offset`` (fewer at the end of the file): one range
    request for a remote file, a seek and a read for a local one.

    Raises:
        CheckpointError: a remote read failed (naming the object).
        OSError: a local read failed.
    """
    if not is_remote(path):
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(nbytes)
    if nbytes == 0:
        return b""
    fs = path.fs
    with map_errors(path, keep=(FileNotFoundError, IsADirectoryError)):
        if hasattr(fs, "_cat_file"):  # an async file system (s3fs): one ranged GET, no HEAD first
            data = fs.cat_file(path.path, start=offset, end=offset + nbytes)
            count(received=len(data))
            return data
        with fs.open(path.path, "rb", cache_type="none") as f:  # counted by its fetcher (_count_file)
            f.seek(offset)
            return f.read(nbytes)


def read_ranges(paths: list[Any], starts: list[int], ends: list[int]) -> list[bytes]:
    """Bytes ``starts[i]:ends[i]`` of each remote file ``paths[i]`` (all on one file system): concurrent
    range requests where the file system is asynchronous (s3fs ``cat_ranges``: one round trip for all),
    else one :func:`read_range` after another.

    Raises:
        CheckpointError: a request failed (naming the first object).
    """
    if not paths:
        return []
    fs = paths[0].fs
    if not hasattr(fs, "_cat_ranges"):
        return [read_range(p, a, b - a) for p, a, b in zip(paths, starts, ends, strict=True)]
    with map_errors(paths[0]):
        out = fs.cat_ranges([p.path for p in paths], starts, ends, on_error="raise")
    for data in out:
        if isinstance(data, BaseException):
            raise remote_error(data, paths[0])
        count(received=len(data))
    return list(out)


def list_files(folder: Any) -> dict[str, int] | None:
    """The files directly in remote ``folder`` (name → bytes) with one listing request, or None when
    ``folder`` is a file. The listing stays in fsspec's cache, so later ``is_file``/``stat`` calls on the
    files cost no request.

    Raises:
        FileNotFoundError: nothing at ``folder``.
    """
    entries = folder.fs.ls(folder.path, detail=True)  # s3fs raises FileNotFoundError for no such prefix
    me = folder.path.rstrip("/")
    if len(entries) == 1 and entries[0]["type"] == "file" and entries[0]["name"] == me:
        return None
    entries = [e for e in entries if e["name"].rstrip("/") != me]  # a folder marker object "me/"
    if not entries:  # an empty "folder" (a bare prefix marker, or an empty Hub folder)
        raise FileNotFoundError(str(folder))
    return {
        e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
        for e in entries
        if e["type"] == "file"
    }


def open_read(path: Any, block_size: int | None = -1) -> Any:
    """A binary file object on ``path`` for sequential reads with seeks: a local file, or a remote one
    whose fetches are counted and that fetches ``block_size`` bytes per request (a read-ahead cache), or,
    with ``block_size`` None, exactly the bytes each ``read`` asks for (no cache: for streaming ranges).
    ``block_size`` -1: :data:`WALK_BLOCK` (read when called)."""
    if not is_remote(path):
        return open(path, "rb")
    if block_size == -1:
        block_size = WALK_BLOCK
    if block_size is None:
        return path.fs.open(path.path, "rb", cache_type="none")
    return path.fs.open(path.path, "rb", block_size=block_size, cache_type="readahead")


def size(path: Any) -> int:
    """Bytes in file ``path`` (remote: from the listing fsspec caches, else one HEAD request)."""
    return int(path.stat().st_size)


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


def same_bytes(a: Any, b: Any) -> bool:
    """Files ``a`` and ``b`` (path objects) hold the same bytes: local ones compared in blocks
    (:func:`filecmp.cmp`), remote ones read whole.

    Raises:
        OSError: a local file cannot be read.
    """
    if is_remote(a) or is_remote(b):
        return bool(a.read_bytes() == b.read_bytes())
    return filecmp.cmp(a, b, shallow=False)


def third_party_errors() -> tuple[type[BaseException], ...]:
    """The exception classes of the layers below tietool that :meth:`Store.map_errors` translates:

    - ``OSError`` (so ``requests``' and ``huggingface_hub``'s HTTP errors, ``TimeoutError``, a refused
      connection);
    - ``ValueError`` and ``RuntimeError``: fsspec file systems refuse a malformed path with a plain
      ``ValueError`` (``hf://org``: "Repository id must be 'namespace/name'"), ``NotImplementedError`` for
      what a backend cannot do (listing every repository), and aiobotocore raises ``RuntimeError`` for a
      closed session;
    - botocore's ``BotoCoreError`` and ``ClientError``, ``aiohttp.ClientError``, ``httpx.HTTPError`` (and
      its ``InvalidURL``, ``CookieConflict``, ``StreamError``: huggingface_hub 1.x talks through httpx),
      fsspec's own, ``huggingface_hub``'s ``HFValidationError``.

    Those of a package this process has not imported are left out (it cannot have raised). What is not
    here (``KeyError``, ``TypeError``, ``AttributeError``) is a bug, reported as one (the CLI's internal
    error), not as a store that cannot be read."""
    found: list[type[BaseException]] = [OSError, ValueError, RuntimeError]
    for mod, names in _THIRD_PARTY:
        m = sys.modules.get(mod)
        if m is not None:
            found += [getattr(m, n) for n in names if isinstance(getattr(m, n, None), type)]
    return tuple(found)


_THIRD_PARTY = (
    ("botocore.exceptions", ("BotoCoreError", "ClientError")),
    ("aiohttp", ("ClientError",)),
    ("httpx", ("HTTPError", "InvalidURL", "CookieConflict", "StreamError")),
    ("fsspec.exceptions", ("FSTimeoutError", "BlocksizeMismatchError")),
    ("huggingface_hub.errors", ("HFValidationError",)),
)


def text_of(e: BaseException) -> str:
    """``str(e)``, or "" for an exception whose ``__str__`` fails (one built without its attributes)."""
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - such an error still maps to one line
        return ""


def first_line(e: BaseException) -> str:
    """The first line of ``str(e)``, at most 200 characters ("" for none)."""
    text = text_of(e)
    return text.splitlines()[0][:200] if text else ""


def output_error(e: BaseException, path: Any) -> TietoolError:
    """One line for an error of a remote file system while writing object ``path``: a
    :class:`StorageError` (exit 75) when the network or the store failed (:func:`is_transient`), else an
    :class:`OutputError` (exit 6)."""
    if is_transient(e):
        return StorageError(
            f"cannot write the object ({first_line(e) if text_of(e) else type(e).__name__}): the network or "
            "the store failed; the output is incomplete and was not published",
            str(path),
            "run the command again (if it keeps failing, check the endpoint and the connection)",
        )
    return OutputError(
        f"cannot write the object ({first_line(e) if text_of(e) else type(e).__name__}); the output is "
        "incomplete and was not published",
        str(path),
        "check the endpoint, the credentials and the connection, and run again",
    )


@contextmanager
def map_errors(
    where: Any, *, output: bool = False, what: str = "read", keep: tuple[type[BaseException], ...] = ()
) -> Iterator[None]:
    """The one translation of third-party errors (:func:`third_party_errors`) into tietool's: inside the
    block, such an error becomes :func:`remote_error` (:class:`CheckpointError`, exit 3: ``cannot {what}
    the object``) or, with ``output``, :func:`output_error` (:class:`OutputError`, exit 6), naming
    ``where`` (or, reading, the file the error names). tietool's own errors pass through, and so do the
    classes in ``keep`` (a caller that handles them: a missing file that means "no such folder")."""
    try:
        yield
    except TietoolError:
        raise
    except keep:
        raise
    except third_party_errors() as e:
        if output:
            raise output_error(e, where) from None
        raise remote_error(e, getattr(e, "filename", None) or where, what) from None


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
