"""The library processes of ``verify --logits`` kept alive between calls, inside :func:`reuse_processes`.

Each ``verify --logits`` runs its checkpoints in a subprocess of the library meant to read them
(:mod:`surgery.verify.logits`); importing paddle and PaddleFormers (or PaddleNLP, or torch and transformers)
costs seconds of CPU per process, more than loading a tiny checkpoint. A caller that verifies many pairs in
one Python process (a script over many outputs, a test suite) can run them inside ``with
reuse_processes():``: each library's worker (``surgery/logits_worker.py``, ``pnlp_logits_worker.py``,
``hf_logits_worker.py``, started with ``serve``) then stays up and runs call after call, one job per line
of its stdin, each answered by the JSON line its one-shot run prints.

A failed load can leave library state that breaks later loads in the same process (paddle's does:
tests/data/fixtures/README.md, L5), so the verdicts stay those of fresh processes: a process whose job saw a
failure is never used again, and a job that failed in a process that had run jobs before is run again in a
fresh one-shot subprocess, whose result is the one returned. A job that succeeds in a reused process ran
exactly as in its own: the workers keep no state between checkpoints but the imported modules. Outside the
block every call runs its own subprocess, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator

SERVE = "serve"
"""The workers' argument for the long-lived mode (one JSON argv per stdin line, one JSON line back)."""


class _Worker:
    """One ``serve`` process of ``command``; its stderr goes to a temporary file."""

    def __init__(self, command: tuple[str, ...], env: dict[str, str]):
        self.jobs = 0  # jobs this process has answered
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [*command, SERVE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            env=env,
        )

    def run(self, args: list[str], timeout: float) -> tuple[str | None, str, bool]:
        """``(the JSON line, the stderr written meanwhile, timed out)``; the line is None when the process
        died or ran out of ``timeout`` seconds (it is then killed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        start = self._err.seek(0, os.SEEK_END)
        expired = threading.Event()

        def stop() -> None:
            expired.set()
            self.proc.kill()

        timer = threading.Timer(timeout, stop)
        timer.start()
        line = None
        try:
            self.proc.stdin.write(json.dumps(args) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline() or None
        except (BrokenPipeError, OSError):
            pass
        finally:
            timer.cancel()
        self._err.seek(start)
        err = self._err.read().decode(errors="replace")
        self.jobs += 1
        return line, err, expired.is_set()

    def close(self) -> None:
        """End the process (the end of its stdin ends its loop) and wait for it."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()


class _Pool:
    """The live workers, by command; one caller at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: dict[tuple[str, ...], _Worker] = {}
        self.started = 0  # processes started, for the curious (tests print it)

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()


_ACTIVE: list[_Pool] = []


@contextlib.contextmanager
def reuse_processes() -> Iterator[_Pool]:
    """Within the block, ``verify --logits`` (:func:`surgery.verify.logits.logits_check`) keeps one process
    per library and Python alive between calls (module docstring: the verdicts stay those of fresh
    processes). Nested blocks share the outer one's processes; they end with the outermost block."""
    if _ACTIVE:
        yield _ACTIVE[-1]
        return
    pool = _Pool()
    _ACTIVE.append(pool)
    try:
        yield pool
    finally:
        _ACTIVE.remove(pool)
        pool.close()


def _failed(line: str | None) -> bool:
    """Whether the worker's JSON line reports anything but a run of every checkpoint (or is missing)."""
    try:
        doc = json.loads(line or "")
    except json.JSONDecodeError:
        return True
    results = doc.get("results") or []
    return bool(doc.get("error")) or not results or not all(r.get("ok") for r in results)


def run(command: list[str], args: list[str], timeout: float, env: dict[str, str] | None = None):
    """``command + args`` run as a worker job: in the live ``serve`` process of ``command`` inside
    :func:`reuse_processes` (the fresh-process rule of the module docstring), else None (the caller runs its
    own subprocess).

    Returns:
        None outside the block or when the one-shot run is due (a failure after earlier jobs); else
        ``(the JSON line or None, stderr text, timed out)``.
    """
    if not _ACTIVE:
        return None
    pool = _ACTIVE[-1]
    key = tuple(command)
    with pool.lock:
        w = pool.workers.get(key)
        if w is None or w.proc.poll() is not None:
            w = pool.workers[key] = _Worker(key, dict(env or os.environ))
            pool.started += 1
        before = w.jobs
        line, err, expired = w.run(args, timeout)
        if line is not None and not _failed(line):
            return line, err, expired
        w.close()
        del pool.workers[key]
    if expired or before == 0:  # a fresh process's verdict (or its timeout) stands
        return line, err, expired
    return None  # failed after other jobs: the caller's one-shot subprocess gives the verdict


def started() -> int:
    """Processes the active block has started (0 outside one)."""
    return _ACTIVE[-1].started if _ACTIVE else 0
