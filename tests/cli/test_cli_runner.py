"""The in-process runs of the tests (:mod:`support.cli_runner`) prove what a ``python -m tietool`` child does.

Most tests run the CLI in process (``tietool.cli.app.main`` with the streams, argv, cwd and environment of
a child) to save an interpreter start and the imports per run. Here every command and every exit code a
run can reach without a signal runs both ways, on the same input and the same output path (removed in
between), and must give the same exit code, the same stdout and stderr byte for byte, and the same output
files; so the real entry point stays covered for each. Signals, kills and exit codes 130/143 run in
subprocesses in ``test_cli_options.py``, ``test_atomic.py`` and ``test_inplace.py``; ``test_packaging.py``
runs the installed ``tietool`` script.

The isolation is checked too: a run puts back cwd, umask, the environment, the signal handlers, the
streams and the errors' wording, and a run that fails does not leak into the next.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
from support import adversarial_support as av
from support import cli_runner
from support.fixture_support import copy_checkpoint, tree_hashes
from support.paths import BUG_CASES_DIR, CASES_DIR

UNTIED = CASES_DIR / "pf_llama_untied_fp32"
TIED = CASES_DIR / "pf_llama_tied_fp32"
PNLP = CASES_DIR / "pnlp_llama_untied"
TP = BUG_CASES_DIR / "c05_paddlenlp_tp_rank_files" / "ckpt"


def _unsafe_pickle(tmp: Path) -> Path:
    """A copy of a ``.pdparams`` checkpoint whose pickle calls ``os.system`` (exit 4; never executed)."""
    ck = copy_checkpoint(PNLP, tmp / "unsafe")
    state = av.pd_state()
    state["evil"] = av.Call(os.system, "true")
    av.pd_dump(state, ck / av.PD_FILE)
    return ck


def _dangling(tmp: Path) -> Path:
    link = tmp / "dangling"
    link.symlink_to(tmp / "nowhere")
    return link


# (id, argv builder, expected exit code); {tmp} is the test's folder, ``out`` the output path
_PNLP_CODE = 0 if Path(os.environ.get("PNLP_PYTHON") or "/nonexistent").is_file() else 8

CASES = [
    ("inspect-0", lambda t: ["inspect", TIED], 0),
    ("inspect-json-0", lambda t: ["inspect", UNTIED, "--json"], 0),
    ("help-0", lambda t: ["--help"], 0),
    ("no-args-0", lambda t: [], 0),
    ("version-0", lambda t: ["--version"], 0),
    ("tie-dry-run-0", lambda t: ["tie", TIED, "--out", t / "out", "--dry-run"], 0),
    ("untie-0", lambda t: ["untie", TIED, "--out", t / "out"], 0),
    ("resize-0", lambda t: ["resize", TIED, "--vocab", "256", "--seed", "1", "-o", t / "out", "--json"], 0),
    ("convert-0", lambda t: ["convert", PNLP, "--to", "paddleformers", "--out", t / "out"], 0),
    ("merge-0", lambda t: ["merge", TP, "--out", t / "out"], 0),
    ("verify-0", lambda t: ["verify", TIED, TIED], 0),
    ("unknown-command-2", lambda t: ["bogus"], 2),
    ("usage-2", lambda t: ["resize", TIED, "--vocab", "0", "--out", t / "out"], 2),
    ("usage-json-2", lambda t: ["resize", TIED, "--vocab", "x", "--json"], 2),
    ("missing-3", lambda t: ["inspect", t / "missing"], 3),
    ("missing-json-3", lambda t: ["tie", t / "missing", "--out", t / "out", "--json"], 3),
    ("unsafe-pickle-4", lambda t: ["inspect", _unsafe_pickle(t)], 4),
    ("values-differ-5", lambda t: ["tie", UNTIED, "--out", t / "out"], 5),
    ("dangling-out-6", lambda t: ["untie", TIED, "--out", _dangling(t)], 6),
    ("unexplained-7", lambda t: ["verify", TIED, UNTIED], 7),
    # a PaddleNLP input: its logits run under PaddleNLP where PNLP_PYTHON names it (0), else not compared (8)
    (f"logits-paddlenlp-{_PNLP_CODE}", lambda t: ["verify", PNLP, PNLP, "--logits"], _PNLP_CODE),
]


@pytest.mark.parametrize("build, code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_in_process_run_is_the_subprocess_run(tmp_path, build, code):
    argv = build(tmp_path)
    out = tmp_path / "out"
    inner = cli_runner.run_cli(argv)
    inner_files = tree_hashes(out) if out.is_dir() else None
    if out.is_dir():
        shutil.rmtree(out)
    child = cli_runner.run_cli(argv, subprocess=True)
    child_files = tree_hashes(out) if out.is_dir() else None
    assert child.rc == code, child.describe()
    assert (inner.rc, inner.stdout, inner.stderr) == (child.rc, child.stdout, child.stderr), (
        inner.describe() + "\n=== subprocess ===\n" + child.describe()
    )
    assert inner_files == child_files


def test_worker_run_is_the_subprocess_run(tmp_path):
    """The adversarial harness's worker (limits, an alarm) gives what a limited child gives."""
    for argv in (["inspect", _unsafe_pickle(tmp_path)], ["inspect", tmp_path / "missing", "--json"]):
        a = av.run_cli(argv)
        b = av.run_cli(argv, subprocess=True)
        assert (a.rc, a.stdout, a.stderr) == (b.rc, b.stdout, b.stderr), a.describe() + "\n" + b.describe()
        assert a.maxrss > 0


def test_a_run_puts_the_process_state_back(tmp_path):
    from tietool.surgery.model import errors

    before = (
        os.getcwd(),
        dict(os.environ),
        {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGALRM)},
        (sys.stdout, sys.stderr, sys.stdin, list(sys.argv), sys.modules["__main__"]),
    )
    wording = errors.set_wording(errors.api_wording)
    errors.set_wording(wording)
    umask = os.umask(0o077)
    try:
        # a run that changes the environment (--debug: the error escapes main as a traceback, exit 1, as in
        # a child), one that fails with a usage error, and one that succeeds in another folder
        runs = [
            cli_runner.run_cli(["--debug", "inspect", tmp_path / "missing"]),
            cli_runner.run_cli(["resize", TIED, "--vocab", "0", "--out", tmp_path / "o"]),
            cli_runner.run_cli(["inspect", "."], cwd=TIED),
        ]
        assert [r.rc for r in runs] == [1, 2, 0], [r.describe() for r in runs]
        assert cli_runner.TRACEBACK in runs[0].stderr and "CheckpointError" in runs[0].stderr
        assert cli_runner.TRACEBACK not in runs[1].stderr
        assert os.umask(0o077) == 0o077
    finally:
        os.umask(umask)
    after = (
        os.getcwd(),
        dict(os.environ),
        {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGALRM)},
        (sys.stdout, sys.stderr, sys.stdin, list(sys.argv), sys.modules["__main__"]),
    )
    assert after == before
    assert errors.set_wording(wording) is wording  # the library's wording is back
    # the module state a child starts with is where the runner resets it (moved: update MODULE_STATE)
    import importlib

    state = {(m, n): getattr(importlib.import_module(m), n, "<missing>") for m, n in cli_runner.MODULE_STATE}
    assert state == cli_runner.MODULE_STATE, state


def test_a_timeout_stops_an_in_process_run(tmp_path, monkeypatch):
    """``timeout`` fires inside the run (rc None); the temporary output folder is removed as for Ctrl-C."""
    from tietool.surgery.io import checkpoint

    real = checkpoint.Checkpoint.open

    def slow(*a, **k):
        import time

        time.sleep(5)
        return real(*a, **k)

    monkeypatch.setattr(checkpoint.Checkpoint, "open", slow)
    run = cli_runner.invoke(["untie", TIED, "--out", tmp_path / "out"], timeout=0.5)
    assert run.rc is None and run.seconds < 4, run.describe()
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
    assert before_alarm_is_default()


def before_alarm_is_default() -> bool:
    return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
