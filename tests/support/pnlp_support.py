"""Running PaddleNLP 2.8.1 from the tests: it needs paddle 2.6.2 and cannot share tietool's venv (paddle 3),
so it runs under the interpreter named by the environment variable ``PNLP_PYTHON``, in a subprocess.

``PNLP_PYTHON`` is exported by ``tests/tools/pnlp_venv.sh`` (``source`` it; ``.ci/run`` does). A test that
needs PaddleNLP carries ``@pytest.mark.pnlp`` and calls :func:`require` (directly or through a fixture),
which skips it, with the reason, when the variable is unset: a plain ``pytest`` without the venv passes.

:func:`run_jobs` runs a batch of :mod:`tests.support.pnlp_worker` jobs in one process (importing paddle
costs seconds; one process builds or loads dozens of tiny checkpoints).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support import preload

WORKER = Path(__file__).resolve().parent / "pnlp_worker.py"
PNLP_PYTHON = os.environ.get("PNLP_PYTHON", "")
SKIP_REASON = (
    "PaddleNLP 2.8.1 venv not available: set PNLP_PYTHON (`source tests/tools/pnlp_venv.sh` builds it and "
    "exports it; .ci/run does)"
)


def _usable() -> bool:
    return bool(PNLP_PYTHON) and Path(PNLP_PYTHON).exists()


def require() -> None:
    """Skip the calling test (or fixture) with :data:`SKIP_REASON` when ``PNLP_PYTHON`` names no
    interpreter (fail instead when ``TIETOOL_REQUIRE_PNLP`` is set, as ``.ci/run`` sets it). Tests that run
    PaddleNLP also carry ``@pytest.mark.pnlp``."""
    if not _usable():
        if os.environ.get("TIETOOL_REQUIRE_PNLP"):  # .ci/run: a proof that does not run is a failure
            pytest.fail(f"TIETOOL_REQUIRE_PNLP is set but {SKIP_REASON}")
        pytest.skip(SKIP_REASON)


class WorkerError(RuntimeError):
    """The worker process itself failed (one job's failure is a result row, not this)."""


def run_jobs(jobs: list[dict], work: Path, timeout: float = 1200) -> list[dict]:
    """Run ``jobs`` (see :mod:`tests.support.pnlp_worker`) in one PaddleNLP process, on the CPU.

    Args:
        jobs: the job dicts, in order (a build before the loads of what it wrote).
        work: a folder for the job and result files (and the worker's log, ``pnlp_worker.log``).

    Returns:
        one result dict per job, in order: ``{"ok": True, ...}`` or ``{"ok": False, "error": ...}``.

    Raises:
        WorkerError: the process exited non-zero or wrote no results (the log's tail is in the message).
    """
    work.mkdir(parents=True, exist_ok=True)
    n = len(list(work.glob("jobs-*.json")))
    jobs_path, results_path = work / f"jobs-{n}.json", work / f"results-{n}.json"
    jobs_path.write_text(json.dumps(jobs))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    log = work / f"pnlp_worker-{n}.log"
    with log.open("w") as out:
        r = preload.run(
            [PNLP_PYTHON, str(WORKER), str(jobs_path), str(results_path)],
            libs=preload.PADDLENLP,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=timeout,
            check=False,
        )
    if r.returncode != 0 or not results_path.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise WorkerError(f"PaddleNLP worker exited {r.returncode}:\n{tail}")
    results = json.loads(results_path.read_text())
    assert len(results) == len(jobs)
    return results
