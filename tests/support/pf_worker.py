"""PaddleFormers 1.2 logits of one folder after another in a long-lived process: the oracle
``tests/data/tools/pf_logits.py`` run unchanged, as :func:`support.family_builder.logits_batches` runs it,
but fed one job at a time (``python family_builder.py --serve``), so a caller that learns its folders one by
one (:class:`support.fixture_support.LiveLogits`) pays paddle's import (~3 s of CPU) once per process, not
once per load.

A failed ``from_pretrained`` can leave paddle state that breaks later loads in the same process (fixtures
README, L5), so :meth:`LogitsPool.load` keeps :func:`~support.family_builder.logits_batches`' rule: a process
that saw a failure is never used again, and a job that failed after other loads is run again in a fresh
process, whose result is the one reported. Every reported load therefore ran in a process that had seen no
failure; ``test_families.py::test_batched_logits_equal_fresh_process`` checks that such loads give, bit for
bit, the logits of a fresh ``pf_logits.py`` subprocess of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from support import family_builder as fb
from support import preload


class LogitsWorker:
    """One ``family_builder.py --serve`` process; its stderr goes to ``log``."""

    def __init__(self, log: Path):
        self.log = log
        self.loads = 0  # jobs this process has run
        self._err = log.open("ab")
        self.proc = preload.popen(
            [sys.executable, fb.__file__, "--serve"],
            libs=preload.PADDLEFORMERS,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        )

    def run(self, job: dict, timeout: float) -> dict:
        """``job``'s result (:func:`support.family_builder._logits_job`'s dict), or ``ok: False`` with the
        reason when the process died or ran out of ``timeout`` seconds (it is killed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        start = self.log.stat().st_size
        timed_out = threading.Event()

        def stop() -> None:
            timed_out.set()
            self.proc.kill()

        timer = threading.Timer(timeout, stop)
        timer.start()
        res = None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                if line.startswith(fb.SERVE_MARK):
                    res = json.loads(line[len(fb.SERVE_MARK) :])
                    break
        except (BrokenPipeError, OSError):
            pass
        finally:
            timer.cancel()
        self._err.flush()
        tail = self.log.read_bytes()[start:].decode(errors="replace")[-1500:]
        if res is None:
            self.close()
            why = f"timed out after {timeout}s" if timed_out.is_set() else "died"
            res = {"ok": False, "error": f"logits process {why}: {tail}", "warnings": [], "batch": self.loads}
        self.loads += 1
        res["rc"] = 0 if res.get("ok") else 1
        res["stderr_tail"] = tail
        return res

    def close(self) -> None:
        """End the process (the end of its stdin ends its loop) and wait for it."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()


class LogitsPool:
    """One :class:`LogitsWorker` per calling thread, replaced after any failed load (module docstring)."""

    def __init__(self, root: Path):
        self.root = root
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[LogitsWorker] = []

    def _fresh(self) -> LogitsWorker:
        with self._lock:
            w = LogitsWorker(self.root / f"pf-worker-{len(self._all):02d}.log")
            self._all.append(w)
        return w

    def load(
        self,
        ckpt: Path,
        model_class: str,
        kwargs: dict,
        out: Path,
        ids: Path | None = None,
        timeout: float = 900,
    ) -> dict:
        """PaddleFormers logits of ``ckpt`` on ``ids`` (default :data:`support.paths.INPUT_IDS`) written to
        ``out``: ``pf_logits.py``'s JSON line as a dict, with ``rc`` (0 when ``ok``) and ``stderr_tail``
        added (as :func:`support.fixture_support.run_pf_logits` returns it)."""
        job = {"ckpt": str(ckpt), "model_class": model_class, "kwargs": kwargs, "out": str(out)}
        if ids is not None:
            job["ids"] = str(ids)
        w = getattr(self._local, "worker", None) or self._fresh()
        self._local.worker = w
        res = w.run(job, timeout)
        if not res.get("ok"):
            w.close()
            self._local.worker = None
            if res.get("batch", 0) > 0:  # failed after other loads: the verdict comes from a fresh one
                alone = self._fresh()
                res = alone.run(job, timeout)
                alone.close()
        return res

    def close(self) -> None:
        """End every worker process."""
        with self._lock:
            for w in self._all:
                w.close()
