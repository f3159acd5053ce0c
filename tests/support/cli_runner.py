"""One way to run the ``tietool`` command line in the tests: in process by default, in a subprocess on demand.

:func:`run_cli` is the helper every test uses. Its result, :class:`CliRun`, carries the exit code
(``rc``, also ``returncode``; None: timed out), stdout, stderr, the seconds taken and (worker runs) the
peak memory.

* in process (the default): :func:`invoke` runs ``tietool/__main__.py`` (``runpy``, as ``python -m``
  does: the CLI's ``main``) in this interpreter, with ``sys.argv``, stdin, stdout and stderr replaced as a
  ``python -m tietool`` child would see them: stdin empty, stdout/stderr byte buffers with the child's
  encoding and error handlers (``probe_streams``: a lone surrogate in a name fails to print the same way),
  the environment of the child, cwd = the repository (or ``cwd``), Python's default warning filters
  printing to stderr. Everything the run may change is put back afterwards: cwd, umask, ``os.environ``,
  the signal handlers ``main`` installs, ``sys.argv`` / the streams / ``__main__``, the CLI's module state
  (:data:`MODULE_STATE`) and the errors' wording. An optional ``timeout`` raises :class:`Timeout` inside
  the run (SIGALRM, main thread only), which unwinds like Ctrl-C would, and the run reports ``rc=None``.
* ``subprocess=True``: ``python -m tietool`` in a fresh interpreter (a user's run). The tests that need one
  say why: signals and kills, exit codes of the real entry point, a stdin pipe, ``RLIMIT_*`` limits.
  ``TIETOOL_TEST_SUBPROCESS=1`` sends every :func:`run_cli` call to a subprocess (to check that the
  in-process runs prove the same).
* :class:`CliWorker`: one long-lived child running :func:`invoke` for many runs, started under
  ``RLIMIT_AS`` / ``RLIMIT_FSIZE``, measuring each run's peak memory (VmHWM reset before each run). The
  adversarial tests use it: a declared huge size must fail under the limit, not be allocated.

Nothing here imports ``tietool`` at module level (a run imports it, once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import resource
import runpy
import signal
import subprocess as sp
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from support.paths import REPO

PYTHON = sys.executable
TRACEBACK = "Traceback (most recent call last)"
TESTS = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class CliRun:
    """One run of the command line (in process, in a worker or in a subprocess)."""

    argv: list[str]
    rc: int | None  # None: timed out (killed, or the in-process alarm fired)
    stdout: str
    stderr: str
    seconds: float = 0.0
    maxrss: int = 0  # peak resident memory of the run, bytes (a CliWorker's VmHWM, reset before each run)

    @property
    def returncode(self) -> int | None:
        """``rc`` under ``subprocess.CompletedProcess``'s name."""
        return self.rc

    @property
    def args(self) -> list[str]:
        return ["python", "-m", "tietool", *self.argv]

    @property
    def cmdline(self) -> str:
        return "python -m tietool " + " ".join(self.argv)

    def describe(self) -> str:
        return (
            f"$ {self.cmdline}\nexit {self.rc} after {self.seconds:.1f}s\n"
            f"--- stderr ---\n{self.stderr[-3000:]}\n--- stdout ---\n{self.stdout[-1500:]}"
        )


class Timeout(BaseException):  # noqa: N818 - not an error of the code under test: the alarm of a run
    """Raised inside an in-process run when its ``timeout`` passes."""


def tool_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a tool run: this one, without ``TIETOOL_DEBUG`` (the one-line messages are what is
    judged) and pytest's variables, with ``COLUMNS=200``, ``NO_COLOR=1``, no GPU and one BLAS thread; then
    ``extra`` (a value None removes the variable)."""
    env = {k: v for k, v in os.environ.items() if k != "TIETOOL_DEBUG" and not k.startswith("PYTEST")}
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_cli(
    argv: Iterable[Any],
    *,
    subprocess: bool = False,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 300,
    limits: tuple[int, int] | None = None,
) -> CliRun:
    """``tietool *argv``: in process (:func:`invoke`), or with ``subprocess=True`` (or
    ``TIETOOL_TEST_SUBPROCESS=1``) as ``python -m tietool`` (:func:`spawn`).

    ``env``: variables added to :func:`tool_env` (None removes one); ``cwd``: default the repository;
    ``timeout``: seconds, then ``rc`` is None; ``limits``: ``(RLIMIT_AS, RLIMIT_FSIZE)`` bytes of the child
    (subprocess only: a limit cannot be lifted again in process — use a :class:`CliWorker`).
    """
    argv = [str(a) for a in argv]
    # in process only in the main thread: the run swaps process-wide state (streams, cwd, signal handlers)
    if (
        subprocess
        or limits is not None
        or not _in_main_thread()
        or os.environ.get("TIETOOL_TEST_SUBPROCESS") == "1"
    ):
        return spawn(argv, cwd=cwd, env=env, timeout=timeout, limits=limits)
    return invoke(argv, cwd=cwd, env=env, timeout=timeout)


def spawn(
    argv: Iterable[Any],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 300,
    limits: tuple[int, int] | None = None,
) -> CliRun:
    """``python -m tietool *argv`` in a fresh interpreter, stdin ``/dev/null``, output decoded with
    ``errors="replace"``."""
    argv = [str(a) for a in argv]

    def preexec() -> None:
        assert limits is not None
        resource.setrlimit(resource.RLIMIT_AS, (limits[0], limits[0]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits[1], limits[1]))

    t0 = time.monotonic()
    try:
        p = sp.run(
            [PYTHON, "-m", "tietool", *argv],
            cwd=cwd or REPO,
            env=tool_env(env),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            preexec_fn=preexec if limits is not None else None,
            stdin=sp.DEVNULL,
            check=False,
        )
        return CliRun(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    except sp.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return CliRun(argv, None, out, err, time.monotonic() - t0)


@cache
def probe_streams() -> tuple[str, str, str, str]:
    """``(stdout encoding, stdout errors, stderr encoding, stderr errors)`` of a ``python`` child whose
    stdout and stderr are pipes, in the tool's environment (asked once per session)."""
    code = "import sys; print(sys.stdout.encoding, sys.stdout.errors, sys.stderr.encoding, sys.stderr.errors)"
    out = sp.run(
        [PYTHON, "-c", code], env=tool_env(), capture_output=True, text=True, check=True, stdin=sp.DEVNULL
    ).stdout.split()
    return out[0], out[1], out[2], out[3]


def _stream(encoding: str, errors: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors=errors, line_buffering=False)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buf = stream.buffer
    assert isinstance(buf, io.BytesIO)
    return buf.getvalue().decode(stream.encoding, errors="replace")


_HANDLED = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None), signal.SIGINT) if s is not None)


@contextlib.contextmanager
def _isolated(argv: list[str], cwd: Path | str | None, env: Mapping[str, str] | None) -> Iterator[tuple]:
    """The process state of a fresh ``python -m tietool`` child for one run; put back afterwards."""
    from tietool.surgery.model import errors

    enc_out, err_out, enc_err, err_err = probe_streams()
    out, err = _stream(enc_out, err_out), _stream(enc_err, err_err)
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_umask = os.umask(0o022)
    os.umask(saved_umask)
    saved_handlers = {s: signal.getsignal(s) for s in _HANDLED}
    saved_sys = (sys.argv, sys.stdin, sys.stdout, sys.stderr, sys.modules["__main__"])
    saved_wording = errors.set_wording(lambda o: "")  # read the caller's wording (put back just below)
    errors.set_wording(saved_wording)
    try:
        fresh = tool_env(env)  # read before the clear (after it, the run had no PATH, no PNLP_PYTHON)
        os.environ.clear()
        os.environ.update(fresh)
        os.chdir(cwd or REPO)
        _reset_module_state()
        sys.argv = ["-m", *argv]  # runpy puts the path of tietool/__main__.py in sys.argv[0], as -m does
        sys.stdin = io.TextIOWrapper(io.BytesIO(b""), encoding=enc_out)
        sys.stdout, sys.stderr = out, err
        with warnings.catch_warnings():
            warnings.resetwarnings()  # Python's defaults (no -W, no PYTHONWARNINGS): what a child does
            for cat in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", cat)
            warnings.showwarning = _showwarning
            yield out, err
    finally:
        with contextlib.suppress(Exception):
            out.flush()
            err.flush()
        sys.argv, sys.stdin, sys.stdout, sys.stderr, sys.modules["__main__"] = saved_sys
        for s, h in saved_handlers.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        errors.set_wording(saved_wording)
        _reset_module_state()
        os.chdir(saved_cwd)
        os.umask(saved_umask)
        os.environ.clear()
        os.environ.update(saved_env)


# the CLI's module-level state a fresh child starts with: (module, name) -> value (a signal received, the
# "interrupted" line said); test_cli_runner checks that each is where this table says
MODULE_STATE: dict[tuple[str, str], Any] = {
    ("tietool.cli.errors", "_signal_received"): None,
    ("tietool.cli.errors", "_announced"): False,
}


def _reset_module_state() -> None:
    import importlib

    for (module, name), value in MODULE_STATE.items():
        mod = importlib.import_module(module)
        if hasattr(mod, name):
            setattr(mod, name, value)


def _showwarning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _alarm(signum: int, frame: Any) -> None:
    raise Timeout()


def invoke(
    argv: Iterable[Any],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> CliRun:
    """``tietool/__main__.py`` (the CLI's ``main``) in this interpreter, as a ``python -m tietool *argv``
    child would run it (see the module docstring). An exception other than ``SystemExit`` escaping ``main``
    is what a child prints as a traceback: it goes to stderr with the traceback header, exit code 1."""
    import traceback

    argv = [str(a) for a in argv]
    alarm = timeout is not None and timeout > 0 and _in_main_thread()
    rc: int | None = 0
    t0 = time.monotonic()
    with _isolated(argv, cwd, env) as (out, err):
        old_alarm = signal.signal(signal.SIGALRM, _alarm) if alarm else None
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, float(timeout))  # type: ignore[arg-type]
        try:
            # ``python -m tietool``: tietool/__main__.py runs as ``__main__`` (runpy sets sys.argv[0] and
            # sys.modules["__main__"] as the interpreter does and puts them back), so Click names the
            # program ``python -m tietool``
            runpy.run_module("tietool", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            rc = _exit_code(e.code, err)
        except Timeout:
            rc = None
        except BaseException:  # noqa: BLE001 - the child would die with this traceback
            err.write(traceback.format_exc())
            rc = 1
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old_alarm)
        stdout, stderr = _text(out), _text(err)
    return CliRun(argv, rc, stdout, stderr, time.monotonic() - t0)


def _exit_code(code: Any, err: io.TextIOWrapper) -> int:
    """The exit status ``sys.exit(code)`` gives: None → 0, an int as is (mod 256), else printed → 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    err.write(f"{code}\n")
    return 1


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ----------------------------------------------------------------------------------------------- worker
# A long-lived child that runs many CLI invocations with :func:`invoke`: started under RLIMIT_AS /
# RLIMIT_FSIZE (set before anything is imported), a fraction of the cost of a child per run (no interpreter
# start and no imports per run). Used by the adversarial tests (bad input, pickles, the corrupt corpus, the
# hostile corpus), where hundreds of runs must fit in a few minutes and each run's peak memory is judged.
_WORKER = r"""
import resource, sys
# the limits first, before anything is imported (set here rather than in a preexec_fn: the workers are
# started from a thread pool, where preexec_fn is not safe)
mem, fsize = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
sys.path.insert(0, sys.argv[3])
import json
from support import cli_runner

def _peak():
    # this run's peak RSS: VmHWM of this process's memory, reset before each run (clear_refs 5, Linux 4.0+).
    # Not ru_maxrss: Linux carries a forked parent's RSS across fork + exec into it, so a worker started by
    # a pytest process of 1.1 GB (paddle imported by earlier tests) would report 1.1 GB for every run.
    try:
        with open("/proc/self/status") as f:
            for ln in f:
                if ln.startswith("VmHWM:"):
                    return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass

out = sys.stdout
for line in sys.stdin:
    job = json.loads(line)
    _reset_peak()
    r = cli_runner.invoke(job["argv"], cwd=job["cwd"], env=job["env"], timeout=max(1, job["timeout"]))
    res = {"rc": r.rc, "stdout": r.stdout, "stderr": r.stderr, "seconds": r.seconds, "maxrss": _peak()}
    out.write(json.dumps(res) + "\n")
    out.flush()
"""


class CliWorker:
    """One worker child (limits ``mem`` / ``fsize`` bytes); :meth:`run` sends a job and waits, with a hard
    deadline, for its result. A child that hangs past its own alarm or dies is replaced at the next run."""

    def __init__(self, mem: int = 2 * 1024**3, fsize: int = 1024**3) -> None:
        self.proc: sp.Popen | None = None
        self.mem, self.fsize = mem, fsize

    def _start(self) -> sp.Popen:
        self.proc = sp.Popen(
            [PYTHON, "-c", _WORKER, str(self.mem), str(self.fsize), str(TESTS)],
            cwd=REPO,
            env=tool_env(),
            stdin=sp.PIPE,
            stdout=sp.PIPE,
            stderr=sp.DEVNULL,
            text=True,
            bufsize=1,
        )
        return self.proc

    def run(
        self,
        argv: Iterable[Any],
        timeout: float = 30.0,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CliRun:
        import selectors

        argv = [str(a) for a in argv]
        p = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        assert p.stdin is not None and p.stdout is not None
        t0 = time.monotonic()
        job = {"argv": argv, "timeout": timeout, "cwd": str(cwd or REPO), "env": dict(env or {})}
        p.stdin.write(json.dumps(job) + "\n")
        p.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout + 15)  # the child's own alarm fires at ``timeout``; this is the backstop
        sel.close()
        line = p.stdout.readline() if ready else ""
        if not line:  # hung past the alarm, or died (killed by a signal, out of memory in C code)
            self.close()
            rc = None if not ready else (p.returncode if p.returncode is not None else -9)
            return CliRun(argv, rc, "", f"worker {'hung' if rc is None else 'died'}", time.monotonic() - t0)
        res = json.loads(line)
        return CliRun(argv, res["rc"], res["stdout"], res["stderr"], res["seconds"], res.get("maxrss", 0))

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError, AttributeError):
                    f.close()  # type: ignore[union-attr]
            self.proc = None


_SHARED: dict[tuple[int, int], CliWorker] = {}


def shared_worker(mem: int = 2 * 1024**3, fsize: int = 1024**3) -> CliWorker:
    """The session's shared :class:`CliWorker` for these limits (bytes of address space, of a file), closed
    at exit."""
    if (mem, fsize) not in _SHARED:
        import atexit

        w = _SHARED[mem, fsize] = CliWorker(mem, fsize)
        atexit.register(w.close)
    return _SHARED[mem, fsize]
