""":mod:`surgery.verify.logits_pool`: the rule that keeps the verdicts of a reused library process those of
fresh processes, on a stand-in worker (a few lines of Python speaking the workers' ``serve`` protocol,
and printing the same JSON line when run once, as ``surgery/logits_worker.py`` does): a success is answered
by the live process, a failure after earlier jobs is left to a fresh one-shot run, a failure in a process
that had run nothing else stands, a process that failed is never used again, a timeout kills it. The real
workers' logits in a reused process equal a fresh one's: ``tests/oracles/test_verify_logits.py::
test_the_fresh_and_reused_verdicts_agree``."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from tietool.surgery.verify import logits, logits_pool

# argv[0] is what to do: "ok", "fail" (a failed load), "die" (the process ends), "sleep" (runs long)
WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    def main(argv):
        if argv[0] == "die":
            sys.exit(3)
        if argv[0] == "sleep":
            time.sleep(60)
        os.write(1, b"native chatter\\n")  # to fd 1, as native code writes
        print(json.dumps({"results": [{"ok": argv[0] == "ok"}], "pid": os.getpid()}))
    if sys.argv[1:] == ["serve"]:
        channel = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        for line in sys.stdin:
            import io, contextlib
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                main(json.loads(line))
            channel.write([ln for ln in buf.getvalue().splitlines() if ln.startswith("{")][-1] + "\\n")
            channel.flush()
    else:
        main(sys.argv[1:])
    """
)


@pytest.fixture
def worker(tmp_path: Path) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return [sys.executable, str(script)]


def _pid(res) -> int:
    line, _, expired = res
    assert not expired
    return json.loads(line)["pid"]


def test_outside_the_block_nothing_is_pooled(worker):
    assert logits_pool.run(worker, ["ok"], 30) is None and logits_pool.started() == 0
    r = logits._call(worker, ["ok"], 30)  # the caller's own subprocess
    assert r is not None and r.returncode == 0 and json.loads(r.stdout.splitlines()[-1])["pid"] != os.getpid()


def test_a_failure_is_a_fresh_process_verdict(worker):
    with logits_pool.reuse_processes() as pool:
        first = _pid(logits_pool.run(worker, ["ok"], 30))
        assert _pid(logits_pool.run(worker, ["ok"], 30)) == first and pool.started == 1  # reused
        assert logits_pool.run(worker, ["fail"], 30) is None  # after other jobs: the caller runs it fresh
        line, _, _ = logits_pool.run(worker, ["fail"], 30)  # a new process: its own failure stands
        doc = json.loads(line)
        assert doc["results"] == [{"ok": False}] and doc["pid"] != first and pool.started == 2
        third = _pid(logits_pool.run(worker, ["ok"], 30))  # the failed one is never used again
        assert third not in (first, doc["pid"]) and pool.started == 3
        r = logits._call(worker, ["fail"], 30)  # after other jobs, as _call runs it: a one-shot subprocess
        assert r is not None and pool.started == 3
        again = json.loads(r.stdout.splitlines()[-1])
        assert again["results"] == [{"ok": False}] and again["pid"] != third
        line, _, expired = logits_pool.run(worker, ["die"], 30)  # died as its first job: stands
        assert line is None and not expired and pool.started == 4
        _pid(logits_pool.run(worker, ["ok"], 30))
        assert logits_pool.run(worker, ["die"], 30) is None and pool.started == 5  # after other jobs
        line, _, expired = logits_pool.run(worker, ["sleep"], 1)
        assert line is None and expired and pool.started == 6
        assert logits._call(worker, ["sleep"], 1) is None  # timed out: None, as a one-shot's timeout
    assert logits_pool.started() == 0 and not pool.workers


def test_the_chatter_goes_to_stderr_and_blocks_nest(worker):
    with logits_pool.reuse_processes() as outer, logits_pool.reuse_processes() as inner:
        assert inner is outer
        line, err, _ = logits_pool.run(worker, ["ok"], 30)
        assert line.startswith("{") and "chatter" in err
