"""Whole-file copies and links of untouched files (``copy_file_range`` + fsync, hard links for in place),
by a pool of threads, and the streaming of a source into a file with progress.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..io.readback import check_size
from ..io.safetensors_io import Source, copy_range
from .publish import uninterruptibly


def copy_file(
    src: Path,
    dst: Path,
    cancelled: Callable[[], bool] | None = None,
    advance: Callable[[int], None] | None = None,
) -> None:
    """Copy a whole file by the kernel (:func:`copy_range`: ``copy_file_range``, a reflink clone on
    btrfs/XFS, with a chunked fallback) and fsync it, so the output is durable before the final rename.
    ``cancelled`` (polled between 256 MiB steps) stops the copy early when the output is being abandoned;
    ``advance`` is told the bytes copied after each step. The copy must then hold as many bytes as
    ``src`` (a short copy is never published).

    Raises:
        OSError: with ``filename`` set to ``dst`` when the write fails (disk full, file too large).
        OutputError: the copy holds another number of bytes.
    """
    try:
        with open(dst, "wb") as fo:
            size = src.stat().st_size
            copy_range(fo, src, 0, size, cancelled=cancelled, advance=advance)
            if cancelled is not None and cancelled():
                return
            fo.flush()
            os.fsync(fo.fileno())
            check_size(dst, os.fstat(fo.fileno()).st_size, size)
    except OSError as e:
        if e.filename is None:  # copy_file_range / write errors name no file: name the one being written
            raise OSError(e.errno, e.strerror, str(dst)) from None
        raise


# Untouched files are copied by this many threads at once. The copies are kernel copies (no user-space
# buffer, the GIL released), so the threads cost no memory; several copies in flight keep the disk's queue
# full and overlap one file's fsync with the next one's copy. On the benchmark machine (virtio ext4), the
# 6.5 GB checkpoint copied with fsync in a median 2.5 s with 8 threads, 3.7 s with 4, 4.8 s with 2 and 6.9 s
# one file at a time (`cp -r`, no fsync: 4.4 s); cutting files into 256 MiB pieces did not help.
# bench/harness.py --case 'copy/*' measures it; bench/RESULTS.md has the figures.
COPY_THREADS = 8


class Copier:
    """Copies whole files in a small pool of threads while the caller goes on (rewrites touched shards).

    The copy threads report their bytes to ``progress`` as they go; ``poll`` collects finished copies and
    re-raises the first error; ``close`` stops the copies still running (within one 256 MiB step) and
    waits for every thread, even through a second Ctrl-C, so the temporary folder can be removed with
    nothing still writing into it.
    """

    def __init__(self, progress: Callable[[str, int], None] | None):
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="tietool-copy")
        self._stop = threading.Event()
        self._pending: list = []
        self._progress = progress

    def submit(self, src: Path, dst: Path, label: str | None, tensor_bytes: int = 0) -> None:
        """Copy ``src`` to ``dst`` in a thread. Unless ``label`` is None, ``progress(label, bytes)`` is called
        from that thread as bytes are copied, scaled so that the whole file reports ``tensor_bytes`` (the
        progress total counts tensor bytes, not headers: :func:`_scaled_advance`)."""
        progress = self._progress
        advance = None
        if progress is not None and label is not None:
            advance = _scaled_advance(progress, label, src.stat().st_size, tensor_bytes)
        self._pending.append(self._pool.submit(copy_file, src, dst, self._stop.is_set, advance))

    def poll(self, block: bool = False) -> None:
        """Collect finished copies (all of them when ``block``); raise the first copy error."""
        keep = []
        for fut in self._pending:
            if block or fut.done():
                fut.result()
            else:
                keep.append(fut)
        self._pending = keep

    def close(self) -> None:
        """Stop the copies still running and join every thread, even through a second Ctrl-C."""
        self._stop.set()
        uninterruptibly(lambda: self._pool.shutdown(wait=True, cancel_futures=True))


def _scaled_advance(
    progress: Callable[[str, int], None], label: str, file_bytes: int, tensor_bytes: int
) -> Callable[[int], None]:
    """An ``advance(bytes copied)`` for the copy of a whole weight file of ``file_bytes`` bytes that tells
    ``progress(label, n)`` the same share of the file's ``tensor_bytes`` (what ``Plan.output_bytes``, the
    bar's total, counts: no header, aliases once per name): in integers, so a finished copy has reported
    exactly ``tensor_bytes``. Called from one copy thread only."""
    done = told = 0

    def advance(n: int) -> None:
        nonlocal done, told
        done += n
        now = tensor_bytes if done >= file_bytes else done * tensor_bytes // max(file_bytes, 1)
        if now != told:
            progress(label, now - told)
            told = now

    return advance


# Bytes of new data (an array made in memory) written per step when progress is reported, so that a new
# 500 MB table moves the bar in eight steps, not one. Byte ranges of the input are reported per step of
# :func:`copy_range` (256 MiB).
CHUNK_BYTES = 64 << 20


class Reporting(Source):
    """A :class:`Source` that tells ``advance`` the bytes it writes, as it writes them: per chunk of
    :data:`CHUNK_BYTES` for arrays, per :func:`copy_range` step for byte ranges."""

    __slots__ = ("advance",)

    def __init__(self, inner: Source, advance: Callable[[int], None]):
        super().__init__(inner.path, inner.offset, inner.nbytes, inner.array, inner.parts)
        self.advance = advance

    def write_to(self, f) -> None:
        """Append the bytes to ``f``, reporting them; the same bytes as :meth:`Source.write_to`."""
        write_reporting(self, f, self.advance)


def write_reporting(src: Source, f, advance: Callable[[int], None]) -> None:
    """Append ``src``'s bytes to ``f`` as :meth:`Source.write_to` does, calling ``advance(n)`` after each
    piece of ``n`` bytes.

    Raises:
        ValueError: a source with no path, array nor parts. OSError: the write fails.
    """
    if src.parts is not None:
        for part in src.parts:
            write_reporting(part, f, advance)
    elif src.array is not None:
        a = np.ascontiguousarray(src.array)
        buf = a.reshape(-1).data.cast("B") if a.size else memoryview(b"")  # the array's buffer, no copy
        for i in range(0, len(buf), CHUNK_BYTES):
            piece = buf[i : i + CHUNK_BYTES]
            f.write(piece)
            advance(len(piece))
    elif src.path is None:
        raise ValueError("a Source needs a path, an array or parts")
    else:
        copy_range(f, src.path, src.offset, src.nbytes, advance=advance)
