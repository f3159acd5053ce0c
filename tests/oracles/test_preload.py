"""``support.preload``: a script run by a preloaded server behaves as in a fresh interpreter.

The oracles' library processes (PaddleFormers, PaddleNLP, transformers) start from a server that imported
the library once (``tests/support/preload.py``). These tests hold it to what a fresh ``python`` gives: the
same bits out of paddle's GEMM (paddle sets ``OMP_NUM_THREADS=1`` at import; a child that lost it summed in
another order), the same ``sys.argv`` / ``sys.path[0]`` / working folder / environment, and the exit
status, signal, timeout and streams ``subprocess.run`` reports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support import preload

_GEMM = """
import json, os, sys
import numpy as np, paddle
rs = np.random.RandomState(0)
a = paddle.to_tensor(rs.randn(16, 64).astype("float32"))
b = paddle.to_tensor(rs.randn(64, 300).astype("float32"))
np.save(sys.argv[1], np.stack([(a @ b).numpy()[:, :150], (a @ b[:, :150]).numpy()]))
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "env": {k: v for k, v in os.environ.items() if k in ("OMP_NUM_THREADS", "TT_MARK")}}))
"""


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="paddle is not installed")
def test_a_preloaded_run_is_a_fresh_run(tmp_path):
    env = {**dict(os.environ), "TT_MARK": "x"}
    env.pop("OMP_NUM_THREADS", None)
    argv = [sys.executable, "-c", _GEMM]
    fresh = subprocess.run(
        [*argv, str(tmp_path / "a.npy")], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    pre = preload.run(
        [*argv, str(tmp_path / "b.npy")], libs=preload.PADDLEFORMERS, capture_output=True, text=True, env=env,
        cwd=tmp_path,
    )  # fmt: skip
    assert fresh.returncode == pre.returncode == 0, fresh.stderr[-2000:] + pre.stderr[-2000:]
    a, b = json.loads(fresh.stdout.splitlines()[-1]), json.loads(pre.stdout.splitlines()[-1])
    assert a["argv"][1:] != b["argv"][1:]  # the output paths, the one difference asked for
    a["argv"], b["argv"] = a["argv"][:1], b["argv"][:1]
    assert a == b and a["env"] == {"OMP_NUM_THREADS": "1", "TT_MARK": "x"}
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


def test_exit_status_streams_timeout_as_subprocess(tmp_path):
    py, libs = sys.executable, ("json",)
    script = tmp_path / "s.py"
    script.write_text(
        "import sys\nprint(sys.argv[1:], sys.path[0] == sys.argv[1])\nsys.exit(int(sys.argv[2]))\n"
    )
    r = preload.run([py, script, str(tmp_path), "3"], libs=libs, capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (3, f"['{tmp_path}', '3'] True\n")
    r = preload.run([py, "-c", "raise ValueError('v')"], libs=libs, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.rstrip().endswith("ValueError: v")
    r = preload.run([py, "-c", "import os; os.kill(os.getpid(), 9)"], libs=libs, capture_output=True)
    assert r.returncode == -9
    r = preload.run([py, "-c", "import sys; print(sys.stdin.read()[::-1])"], libs=libs, input="abc",
                    capture_output=True, text=True)  # fmt: skip
    assert r.stdout == "cba\n"
    r = preload.run([py, "-c", "import sys; print(1); print(2, file=sys.stderr)"], libs=libs,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert (r.stdout, r.stderr) == ("1\n2\n", None)
    with pytest.raises(subprocess.TimeoutExpired):
        preload.run([py, "-c", "import time; time.sleep(60)"], libs=libs, timeout=0.5)
    with pytest.raises(subprocess.CalledProcessError):
        preload.run([py, "-c", "raise SystemExit(2)"], libs=libs, check=True)


def test_popen_pipes_wait_kill():
    py, libs = sys.executable, ("json",)
    echo = "import sys\nfor line in sys.stdin: print(line.upper(), end='', flush=True)"
    p = preload.popen([py, "-c", echo], libs=libs, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert isinstance(p, preload.Process) and p.poll() is None
    p.stdin.write("abc\n")
    p.stdin.flush()
    assert p.stdout.readline() == "ABC\n"
    p.stdin.close()
    assert p.wait(timeout=30) == 0
    p = preload.popen([py, "-c", "import time; time.sleep(60)"], libs=libs, stdin=subprocess.PIPE)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    p.kill()
    assert p.wait() == -9


def test_popen_late_env_and_stderr_to_stdout(tmp_path):
    """``late_env``: set in the run only, after the fork, so runs differing only in it share one server (the
    ranks of a gloo job, ``tests/data/flex/make_flex.py``); ``stderr=STDOUT`` as ``Popen`` gives it."""
    py, libs = sys.executable, ("json",)
    show = "import os, sys; print(os.environ.get('TT_RANK')); print('e', file=sys.stderr)"
    runs = []
    for rank in ("0", "1"):
        log = (tmp_path / f"log{rank}").open("w+b")
        p = preload.popen([py, "-c", show], libs=libs, stdout=log, stderr=subprocess.STDOUT,
                          late_env={"TT_RANK": rank})  # fmt: skip
        runs.append((p, log))
    assert all(isinstance(p, preload.Process) for p, _ in runs)
    for rank, (p, log) in enumerate(runs):
        assert p.wait(timeout=30) == 0
        log.seek(0)
        assert log.read() == f"{rank}\ne\n".encode()
        log.close()
    assert "TT_RANK" not in os.environ
    assert len({k for k in preload._SERVERS if k[1] == "json"}) == 1  # one server for every test here


def test_the_running_tests_name_is_not_a_servers_key():
    """pytest sets ``PYTEST_CURRENT_TEST`` in ``os.environ`` at every phase of every test: set after the
    fork, so the tests of a pytest process share a server (in the key, each test imported the library
    anew), and each run still sees its own test's name."""
    py = sys.executable
    r = preload.run([py, "-c", "import os; print(os.environ['PYTEST_CURRENT_TEST'])"], libs=("json",),
                    capture_output=True, text=True)  # fmt: skip
    assert r.stdout.strip() == os.environ["PYTEST_CURRENT_TEST"]
    assert "the_running_tests_name" in r.stdout
    assert all("PYTEST_CURRENT_TEST" not in k[2] for k in preload._SERVERS)
