"""A library script run from an interpreter that has already imported its library: ``subprocess.run`` less
the imports.

The oracles run PaddleFormers, PaddleNLP 2.8.1 and transformers in subprocesses (other interpreters, other
venvs, a fresh process per load so no load sees another's state). Importing the library is most of such a
process' CPU: paddle + PaddleFormers ~2.7 s, paddle 2.6 + PaddleNLP ~5.3 s, torch + transformers ~3.7 s,
measured on the CI machine; a profile of the whole suite (py-spy, 2026-12-03) found ~160 processes paying
it, ~30 % of the suite's CPU.

:func:`run` takes ``subprocess.run``'s arguments. When the command is ``[PYTHON, script.py, ...]``,
``[PYTHON, "-c", code, ...]`` or ``[PYTHON, "-m", module, ...]`` (no interpreter option), it is handed to a
server for that interpreter and that exact environment (``python preload.py serve SOCKET``, started on
first use, one per pytest process and set of libraries). The server imported, once, the libraries the caller
names (``libs=``, the modules the script imports first; nothing else: no thread started, no computation run,
``gc.freeze()``), and forks per request:

* a supervisor child takes the caller's stdin/stdout/stderr (the file descriptors themselves,
  ``SCM_RIGHTS``) and forks the run: working folder, ``sys.argv`` and ``sys.path[0]`` as the interpreter
  would set them (``os.environ`` is the server's: the run's own, plus what the imports set in it), then
  the script as ``__main__`` (``runpy``), ``atexit`` handlers, exit;
* the supervisor waits for it and sends its pid and its exit status (a signal as ``-N``, as ``subprocess``
  reports it); a timeout kills it and raises ``subprocess.TimeoutExpired``.

Each run is a fresh fork of the same freshly imported interpreter, so it sees what a new process would:
the library imported under the same environment (the server's key is the whole environment: a library
that reads a variable at import, e.g. ``FLAGS_*`` or ``HF_HUB_OFFLINE``, read the run's value), and no
state of another run. Anything else (interpreter options, a non-Python command, a server that would not
start) runs through ``subprocess.run`` unchanged, as does every run when ``TIETOOL_TEST_NO_PRELOAD=1``.

The module is also the server's script: the server side imports only the standard library.
"""

from __future__ import annotations

import os
import socket
import struct
import sys

# what a server imports, named by the caller (``libs=``): the modules its script imports first, in that order.
# Only those: PaddleFormers patches transformers once imported, so a transformers-only script must not get it.
PADDLEFORMERS = ("paddle", "paddleformers", "paddleformers.transformers")
PADDLENLP = ("zlib", "paddle", "paddlenlp", "paddlenlp.transformers")  # zlib first: paddle 2.6.2 needs it
TRANSFORMERS = ("torch", "transformers")
_MSG = 1 << 22  # the largest request: argv (a -c script) and cwd as JSON
_MODES = ("-c", "-m")


# ---------------------------------------------------------------------------------------------- server side
def _preload(libs: list[str]) -> None:
    import gc
    import importlib
    import threading

    for name in libs:
        importlib.import_module(name)
    if threading.active_count() != 1:
        raise RuntimeError("a preloaded module started a Python thread: forking would not be safe")
    gc.collect()
    gc.freeze()  # the children's writes to refcounts do not copy the preloaded heap's pages for gc


def _exec(req: dict) -> int:
    """Run the request's program in this process (a fresh fork) as the interpreter would; its exit code."""
    import atexit
    import runpy
    import traceback
    import types

    os.chdir(req["cwd"])
    # os.environ is left as the server has it: the caller's environment (the server's key) plus what the
    # imports set in it, as in a fresh process (paddle sets OMP_NUM_THREADS=1 at import when unset: taken
    # away, the first GEMM would start a thread per core and sum in another order), plus the run's own
    # late_env: variables no import reads (the caller's promise): one server serves runs that differ in them
    os.environ.update(req.get("late_env") or {})
    argv = req["argv"]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)  # noqa: S102 - python -c, as asked
        elif argv[0] == "-m":
            sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.realpath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback, exit 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


def _supervise(conn: socket.socket) -> None:
    """In a child of the server: take the request's descriptors, fork the run, report its pid and its exit
    status on ``conn``; never returns."""
    import json

    try:
        msg, fds, _flags, _addr = socket.recv_fds(conn, _MSG, 3)
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            code = 70
            try:
                code = _exec(req)
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except Exception:  # noqa: BLE001 - a closed pipe, as at interpreter exit
                        pass
                os._exit(code & 0xFF)
        for fd in fds:
            os.close(fd)
        conn.send(struct.pack("i", pid))
        _, status = os.waitpid(pid, 0)
        conn.send(struct.pack("i", os.waitstatus_to_exitcode(status)))
    finally:
        os._exit(0)


def serve_forks(path: str, handle, stop=None) -> None:
    """Listen on the Unix socket ``path``, print ``ready``, and fork a child per connection that runs
    ``handle(conn)`` (which never returns), reaping the children that ended; return when ``stop`` (a file,
    e.g. ``sys.stdin``) becomes readable: its writer closed it. Also ``support/fork_server.py``'s loop."""
    import select

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(64)
    print("ready", flush=True)
    while True:
        if stop is not None and stop in select.select([srv, stop], [], [])[0]:
            return
        conn, _ = srv.accept()
        if os.fork() == 0:
            srv.close()
            handle(conn)
        conn.close()
        while True:
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if done == 0:
                break


def serve(path: str, libs: list[str]) -> None:
    """Import ``libs``, then fork a supervisor per connection on the Unix socket ``path``
    (:func:`serve_forks`); ends when its stdin closes (the pytest process that started it ended)."""
    _preload(libs)
    serve_forks(path, _supervise, stop=sys.stdin)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "serve":
    serve(sys.argv[2], sys.argv[3].split(","))
    sys.exit(0)

# ---------------------------------------------------------------------------------------------- client side
import atexit  # noqa: E402 - the client's imports; the server above needs none of them
import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

_SERVERS: dict[tuple[str, str, str], tuple[subprocess.Popen, str] | None] = {}
_LOCK = threading.Lock()
_DIR: list[str] = []


def _request(cmd: list) -> list[str] | None:
    """``cmd`` as the server's argv (``script ...``, ``-c code ...``, ``-m module ...``), or None when it
    is not a plain interpreter run."""
    if len(cmd) < 2 or not str(cmd[0]).endswith(("python", "python3")) or not Path(str(cmd[0])).is_file():
        return None
    first = str(cmd[1])
    if first in _MODES:
        return [str(a) for a in cmd[1:]] if len(cmd) >= 3 else None
    if first.startswith("-") or not first.endswith(".py"):
        return None
    return [str(a) for a in cmd[1:]]


def _server(python: str, libs: tuple[str, ...], env: dict[str, str]) -> str | None:
    """The socket of the server for ``python`` with ``libs`` imported under ``env`` (started now when there
    is none), or None when it cannot start."""
    key = (python, ",".join(libs), json.dumps(sorted(env.items())))
    with _LOCK:
        if key in _SERVERS:
            got = _SERVERS[key]
            return None if got is None or got[0].poll() is not None else got[1]
        if not _DIR:
            _DIR.append(tempfile.mkdtemp(prefix="tietool-preload-"))
            atexit.register(_stop_all)
        sock = os.path.join(_DIR[0], f"{len(_SERVERS)}.sock")
        proc = subprocess.Popen(
            [python, os.path.abspath(__file__), "serve", sock, ",".join(libs)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        ok = proc.stdout.readline().strip() == "ready"
        if not ok:
            proc.kill()
            proc.wait()
        _SERVERS[key] = (proc, sock) if ok else None
        return sock if ok else None


def _stop_all() -> None:
    import shutil

    for got in _SERVERS.values():
        if got is not None:
            proc, _ = got
            if proc.stdin:
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    _SERVERS.clear()
    if _DIR:
        shutil.rmtree(_DIR[0], ignore_errors=True)


def _fd(spec, files: list, own: int) -> int:
    """The descriptor a stream spec of ``subprocess.run`` names: None → ``own`` (the caller's own stream),
    DEVNULL, PIPE (a temporary file read afterwards), a file object or a descriptor. What it opens is added
    to ``files``."""
    if spec is None:
        return own
    if spec is subprocess.DEVNULL or spec is subprocess.PIPE:
        f = open(os.devnull, "r+b") if spec is subprocess.DEVNULL else tempfile.TemporaryFile()  # noqa: SIM115
        files.append(f)
        return f.fileno()
    return spec if isinstance(spec, int) else spec.fileno()


# set after the fork, not part of a server's key: pytest's name of the running test, which it changes in
# os.environ at every test phase (in the key, each test started its own server and imported the library anew)
_ALWAYS_LATE = ("PYTEST_CURRENT_TEST",)


def _route(
    cmd: list, libs: tuple[str, ...], env: dict | None, late_env: dict | None = None
) -> tuple[list[str], str, dict[str, str]] | None:
    """``(the server's argv, its socket, the variables to set after the fork)`` for ``cmd``, or None when
    ``cmd`` runs as a plain subprocess: not a plain interpreter run, ``TIETOOL_TEST_NO_PRELOAD=1``, or no
    server starts."""
    req = _request(cmd)
    if req is None or os.environ.get("TIETOOL_TEST_NO_PRELOAD") == "1":
        return None
    base = dict(os.environ if env is None else env)
    late = {k: base.pop(k) for k in _ALWAYS_LATE if k in base} | dict(late_env or {})
    sock = _server(str(cmd[0]), libs, base)
    return None if sock is None else (req, sock, late)


class Process:
    """A run started by the server: the part of ``subprocess.Popen`` the callers use (``stdin``, ``stdout``,
    ``pid``, ``poll``, ``wait``, ``kill``, ``returncode``)."""

    def __init__(
        self, sock: str, argv: list[str], cwd: str, fds: list[int], stdin=None, stdout=None, late_env=None
    ):
        """Hand ``argv`` (run in ``cwd``, ``fds`` its stdin, stdout, stderr, ``late_env`` set in it) to the
        server at ``sock``."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.connect(sock)
        req = {"argv": argv, "cwd": cwd, "late_env": dict(late_env or {})}
        socket.send_fds(self._sock, [json.dumps(req).encode()], fds)
        self.pid = struct.unpack("i", self._sock.recv(4))[0]
        self.stdin, self.stdout = stdin, stdout
        self.returncode: int | None = None

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self._sock.settimeout(timeout)
            try:
                reply = self._sock.recv(4)
            except (TimeoutError, BlockingIOError):
                return None
            if len(reply) != 4:
                raise RuntimeError(f"the preload server lost run {self.pid} (no exit status)")
            self.returncode = struct.unpack("i", reply)[0]
            self._sock.close()
        return self.returncode

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self._status(0.0)

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, waiting up to ``timeout`` seconds (``subprocess.TimeoutExpired`` after)."""
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        return code

    def kill(self) -> None:
        """SIGKILL, unless it already ended."""
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run(
    cmd: list,
    *,
    libs: tuple[str, ...],
    capture_output: bool = False,
    text: bool = False,
    timeout: float | None = None,
    env: dict | None = None,
    cwd=None,
    stdin=None,
    stdout=None,
    stderr=None,
    input=None,  # noqa: A002
    check: bool = False,
    **other,
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, ...)`` with those arguments (``universal_newlines`` / ``encoding`` and the
    rest fall back to it), the program run by a server that imported ``libs`` (the modules the program
    imports first, in its order: :data:`PADDLEFORMERS`, ...) when ``cmd`` is a plain interpreter run
    (module docstring). The result (``CompletedProcess``, ``TimeoutExpired``, ``CalledProcessError``) is
    the one ``subprocess.run`` gives; on a timeout the run is killed (SIGKILL)."""
    route = None if other else _route(cmd, libs, env)
    if route is None:
        return subprocess.run(
            cmd, capture_output=capture_output, text=text, timeout=timeout, env=env, cwd=cwd, stdin=stdin,
            stdout=stdout, stderr=stderr, input=input, check=check, **other,
        )  # fmt: skip
    if capture_output:
        stdout = stderr = subprocess.PIPE
    files: list = []
    try:
        if input is not None:
            stdin = tempfile.TemporaryFile()  # noqa: SIM115 - closed below through ``files``
            files.append(stdin)
            stdin.write(input.encode() if isinstance(input, str) else input)
            stdin.seek(0)
        fds = [_fd(stdin, files, 0), _fd(stdout, files, 1)]
        out_file = files[-1] if stdout is subprocess.PIPE else None
        fds.append(fds[1] if stderr is subprocess.STDOUT else _fd(stderr, files, 2))
        err_file = files[-1] if stderr is subprocess.PIPE else None
        proc = Process(
            route[1], route[0], os.path.abspath(cwd) if cwd else os.getcwd(), fds, late_env=route[2]
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(cmd, timeout) from None
        out, err = _read(out_file, text), _read(err_file, text)
    finally:
        for f in files:
            f.close()
    if check and code != 0:
        raise subprocess.CalledProcessError(code, cmd, out, err)
    return subprocess.CompletedProcess(cmd, code, out, err)


def _read(f, text: bool):
    if f is None:
        return None
    f.seek(0)
    data = f.read()
    return data.decode().replace("\r\n", "\n").replace("\r", "\n") if text else data


def popen(cmd: list, *, libs: tuple[str, ...], stdin=None, stdout=None, stderr=None, text: bool = False,
          env: dict | None = None, late_env: dict | None = None):  # fmt: skip
    """``subprocess.Popen(cmd, ...)`` with those arguments, the program run by a server that imported
    ``libs`` (as :func:`run`); a :class:`Process`, or a ``subprocess.Popen`` when ``cmd`` is not a plain
    interpreter run or no server starts. ``PIPE`` gives ``stdin`` / ``stdout`` as in ``Popen``, ``stderr``
    may be ``STDOUT``. ``late_env``: variables added to ``env`` that no import of ``libs`` reads (the
    caller's promise: the ranks of one distributed job differ only in their ``PADDLE_*`` variables, which
    paddle reads when the job starts), set in the run after the fork, so one server serves them all."""
    route = _route(cmd, libs, env, late_env)
    if route is None:
        full = (
            None
            if env is None and not late_env
            else {**(os.environ if env is None else env), **(late_env or {})}
        )
        return subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr, text=text, env=full)
    files: list = []  # the child's ends, closed here once sent
    ours: list = [None, None]
    fds = []
    for i, spec in enumerate((stdin, stdout)):
        if spec is subprocess.PIPE:
            r, w = os.pipe()
            ours[i] = os.fdopen(w if i == 0 else r, ("w" if i == 0 else "r") + ("" if text else "b"))
            child = os.fdopen(r if i == 0 else w, "rb" if i == 0 else "wb")
            files.append(child)
            fds.append(child.fileno())
        else:
            fds.append(_fd(spec, files, i))
    fds.append(fds[1] if stderr is subprocess.STDOUT else _fd(stderr, files, 2))
    try:
        return Process(route[1], route[0], os.getcwd(), fds, stdin=ours[0], stdout=ours[1], late_env=route[2])
    finally:
        for f in files:
            f.close()
