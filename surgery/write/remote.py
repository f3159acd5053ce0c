"""Write an output checkpoint to object storage (an output given as a URL, :mod:`surgery.io.store`).

Object stores have no rename, so the local recipe (write a temporary folder, rename it into place) cannot
be used. Instead the output is *published in order*:

1. the rewritten weight files (the shards the plan touches, streamed with bounded memory) are written to
   a local temporary folder and read back there (:mod:`surgery.io.readback`), as a local run does;
2. every untouched weight file and carried file is copied to the output: by the server when input and
   output are in one store (``s3fs``'s ``copy``: an S3 ``CopyObject``, no bytes through this machine), else
   streamed in ``store.STREAM_CHUNK`` pieces; the rewritten files are uploaded; the size of every object is
   checked against its source;
3. then ``tietool-report.json`` and the config file(s); and the index (``*.index.json``) last.

A loader reads the index (sharded checkpoints) or ``config.json`` (single-file ones) first, so a reader of
the output never sees a checkpoint that claims to be complete while objects are missing: the index (or,
without one, ``config.json``) is the marker of a complete output. A failed request stops the run, the
objects written so far are deleted (best effort), and the error names the object; the index is never
written then. What is not atomic: while the run goes on, and after a failure whose clean-up could not
reach the store, objects other than the index can be listed under the output prefix.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..io import store
from ..io.checkpoint import CONFIG_FILES, PD_INDEX, REPORT_NAME, ST_INDEX
from ..model.errors import Opt, OutputError, TietoolError, UsageError
from ..plan.plan import Plan

# whole-object copies and uploads in flight at once (each is a request the server does, or a stream)
PUBLISH_THREADS = 8


def check_remote_output(inp: Any, out: Any) -> None:
    """Refuse an output that is the input, inside it, contains it, or already holds objects (files), when
    either side is a URL.

    Raises:
        UsageError: with the fix (another output).
    """
    if store.same_store(inp, out):
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
        entries = out.fs.ls(out.path, detail=True)
    except FileNotFoundError:
        entries = []
    except Exception as e:
        raise store.remote_error(e, out) from None
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


class _DeferredCopier:
    """Stands in for ``write.Copier``: records the whole-file copies (source, output-relative name, progress
    label, tensor bytes) instead of copying them into the local folder; :func:`_publish` copies them."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.jobs: list[tuple[Any, str, str | None, int]] = []

    def submit(self, src: Any, dst: Path, label: str | None, tensor_bytes: int = 0) -> None:
        self.jobs.append((src, dst.relative_to(self.tmp).as_posix(), label, tensor_bytes))

    def poll(self, block: bool = False) -> None:
        """Nothing runs until :func:`_publish`."""

    def close(self) -> None:
        """Nothing runs until :func:`_publish`."""


def execute_remote(
    plan: Plan,
    out: Any,
    progress: Any = None,
    report: Any = None,
    keep_training_state: bool = False,
) -> dict:
    """Write ``plan``'s output to the URL ``out`` (a remote ``UPath``), in the order the module describes.

    Args:
        progress, report, keep_training_state: as :func:`surgery.write.writer.execute`.

    Returns:
        the report (:func:`surgery.ops` adds the bytes moved, ``store.TRANSFER``).

    Raises:
        UsageError: ``out`` is the input, inside it, or holds objects.
        OutputError: a request failed (one line naming the object); no index was written and the objects
            written were deleted where the store could be reached.
    """
    from .writer import _write_all  # write imports this module lazily; no cycle at import time

    check_remote_output(plan.ckpt.path, out)
    tmp = Path(tempfile.mkdtemp(prefix="tietool-out-"))
    written: list[Any] = []
    try:
        copier = _DeferredCopier(tmp)
        facts = _write_all(plan, tmp, False, progress, keep_training_state, copier)
        if report is not None:
            facts = report(facts)
            from .publish import write_json

            write_json(tmp / REPORT_NAME, facts)
        _publish(copier.jobs, tmp, out, progress, written)
    except BaseException as e:
        left = _remove(written)
        if left and isinstance(e, TietoolError):
            raise type(e)(
                f"{e.message}; {len(left)} object(s) it had written could not be deleted",
                e.path,
                f"delete every object under {out}, check the endpoint, the credentials and the connection, "
                "and run again",
            ) from None
        if isinstance(e, TietoolError | KeyboardInterrupt):
            raise
        if isinstance(e, OSError) and not store.is_remote(getattr(e, "filename", None)):
            raise OutputError(f"cannot write the local staging copy: {e.strerror or e}", str(tmp)) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return facts


def _publish(jobs: list, tmp: Path, out: Any, progress: Any, written: list[Any]) -> None:
    """Copy the deferred whole files and upload the files of ``tmp`` to ``out``: weight and carried files
    first (in threads), then the report and the config files, then the index; each object's size is
    checked. ``written`` collects the objects written (for the clean-up of a failed run).

    Raises:
        OutputError: a copy or an upload failed, or an object has another size than its source.
    """
    last = [REPORT_NAME, *CONFIG_FILES, ST_INDEX, PD_INDEX]  # in publishing order: the index at the end
    local = [p.relative_to(tmp).as_posix() for p in sorted(tmp.rglob("*")) if p.is_file()]
    first = [(tmp / rel, rel, None, 0) for rel in local if rel not in last] + list(jobs)
    with ThreadPoolExecutor(PUBLISH_THREADS, thread_name_prefix="tietool-publish") as pool:
        futures = [pool.submit(_put, src, out / rel, written) for src, rel, _label, _n in first]
        for fut, (_src, _rel, label, n) in zip(futures, first, strict=True):
            fut.result()
            if progress is not None and label is not None:
                progress(label, n)
    for rel in last:
        if rel in local:
            _put(tmp / rel, out / rel, written)


def _put(src: Any, dst: Any, written: list[Any]) -> None:
    """One object of the output: ``src`` (a local file or an object) copied to ``dst`` (an object), by the
    server within one store, else uploaded or streamed; then its size checked.

    Raises:
        OutputError: the request failed or the object's size differs (naming ``dst``).
    """
    n = store.size(src)
    try:
        written.append(dst)
        if store.same_store(src, dst):
            dst.fs.copy(src.path, dst.path)
            store.count(copied=n)
        elif not store.is_remote(src):
            dst.fs.put_file(str(src), dst.path)
            store.count(sent=n)
        else:
            _stream(src, dst)
        got = dst.fs.info(dst.path)["size"]
    except TietoolError:
        raise
    except Exception as e:
        line = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise OutputError(
            f"cannot write the object ({line}); the output is incomplete and was not published",
            str(dst),
            "check the endpoint, the credentials and the connection, and run again",
        ) from None
    if got != n:
        raise OutputError(f"object has {got} bytes, its source {n}", str(dst), "run again")


def _stream(src: Any, dst: Any) -> None:
    """Copy object ``src`` to object ``dst`` of another store through this machine, one
    ``store.STREAM_CHUNK`` at a time (memory: one chunk)."""
    with store.open_read(src, block_size=None) as fi, dst.fs.open(dst.path, "wb") as fo:
        while buf := fi.read(store.STREAM_CHUNK):
            fo.write(buf)


def _remove(objects: list[Any]) -> list[Any]:
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
        except Exception:
            left.append(o)
    return left
