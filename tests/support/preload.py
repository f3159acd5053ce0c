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
    # away, the first GEMM would start a thread per core and sum in another order)
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


def serve(path: str, libs: list[str]) -> None:
    """Import ``libs``, then fork a supervisor per connection on the Unix socket ``path``; ends when its stdin
    closes (the pytest process that started it ended) or it is killed."""
    import select

    _preload(libs)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(64)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([srv, sys.stdin], [], [])
        if sys.stdin in ready:
            return
        conn, _ = srv.accept()
        if os.fork() == 0:
            srv.close()
            _supervise(conn)
        conn.close()
        while True:  # reap the supervisors that ended
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if done == 0:
                break


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


def _fd(spec, files: list):
    """The descriptor a stream spec of ``subprocess.run`` names (None: the caller's own): DEVNULL, PIPE (a
    temporary file read afterwards), a file object or a descriptor. What it opens is added to ``files``."""
    if spec is subprocess.DEVNULL:
        f = open(os.devnull, "r+b")  # noqa: SIM115 - closed by the caller through ``files``
        files.append(f)
        return f.fileno()
    if spec is subprocess.PIPE:
        f = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the caller through ``files``
        files.append(f)
        return f.fileno()
    if spec is None:
        return None
    return spec if isinstance(spec, int) else spec.fileno()


def _decode(data: bytes, text: bool):
    if not text:
        return data
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


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
    plain = dict(
        capture_output=capture_output,
        text=text,
        timeout=timeout,
        env=env,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        input=input,
        check=check,
        **other,
    )
    req = _request(cmd)
    if req is None or other or os.environ.get("TIETOOL_TEST_NO_PRELOAD") == "1":
        return subprocess.run(cmd, **plain)
    run_env = dict(os.environ if env is None else env)
    sock = _server(str(cmd[0]), libs, run_env)
    if sock is None:
        return subprocess.run(cmd, **plain)
    if capture_output:
        stdout = stderr = subprocess.PIPE
    files: list = []
    try:
        if input is not None:
            f = tempfile.TemporaryFile()  # noqa: SIM115 - closed below through ``files``
            files.append(f)
            f.write(input.encode() if isinstance(input, str) else input)
            f.seek(0)
            fd_in = f.fileno()
        else:
            fd_in = _fd(stdin, files)
        fd_out = _fd(stdout, files)
        out_file = files[-1] if stdout is subprocess.PIPE else None
        fd_err = fd_out if stderr is subprocess.STDOUT else _fd(stderr, files)
        err_file = files[-1] if stderr is subprocess.PIPE else None
        fds = [
            0 if fd_in is None else fd_in,
            1 if fd_out is None else fd_out,
            2 if fd_err is None else fd_err,
        ]
        req_msg = {"argv": req, "cwd": os.path.abspath(cwd) if cwd else os.getcwd()}
        code = _ask(sock, req_msg, fds, cmd, timeout)
        out = _read(out_file, text)
        err = _read(err_file, text)
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
    return _decode(f.read(), text)


def _ask(sock: str, req: dict, fds: list[int], cmd: list, timeout: float | None) -> int:
    """Send the run to the server at ``sock``; its exit status (killed and ``TimeoutExpired`` after
    ``timeout`` seconds)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(sock)
        socket.send_fds(s, [json.dumps(req).encode()], fds)
        pid = struct.unpack("i", s.recv(4))[0]
        s.settimeout(timeout)
        try:
            reply = s.recv(4)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            s.settimeout(None)
            s.recv(4)
            raise subprocess.TimeoutExpired(cmd, timeout) from None
    if len(reply) != 4:
        raise RuntimeError(f"the preload server lost the run of {cmd[:2]} (no exit status)")
    return struct.unpack("i", reply)[0]


class Process:
    """A run of :func:`popen`: the part of ``subprocess.Popen`` its callers use (``stdin``, ``stdout``,
    ``pid``, ``poll``, ``wait``, ``kill``, ``returncode``)."""

    def __init__(self, sock: socket.socket, pid: int, stdin, stdout):
        self._sock, self.pid, self.stdin, self.stdout = sock, pid, stdin, stdout
        self.returncode: int | None = None

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self._sock.settimeout(timeout)
            try:
                reply = self._sock.recv(4)
            except (TimeoutError, BlockingIOError):
                return None
            self.returncode = struct.unpack("i", reply)[0] if len(reply) == 4 else -signal.SIGKILL
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


def popen(cmd: list, *, libs: tuple[str, ...], stdin=None, stdout=None, stderr=None, text: bool = False,
          env: dict | None = None):  # fmt: skip
    """``subprocess.Popen(cmd, ...)`` with those arguments, the program run by a server that imported
    ``libs`` (as :func:`run`); a :class:`Process`, or a ``subprocess.Popen`` when ``cmd`` is not a plain
    interpreter run or no server starts. ``PIPE`` gives ``stdin`` / ``stdout`` as in ``Popen``."""
    req = _request(cmd)
    run_env = dict(os.environ if env is None else env)
    sock = None if req is None or os.environ.get("TIETOOL_TEST_NO_PRELOAD") == "1" else _server(
        str(cmd[0]), libs, run_env
    )  # fmt: skip
    if sock is None:
        return subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr, text=text, env=env)
    files: list = []
    ours, theirs = [None, None], []
    for i, spec in enumerate((stdin, stdout)):
        if spec is subprocess.PIPE:
            r, w = os.pipe()
            ours[i] = os.fdopen(w if i == 0 else r, ("w" if i == 0 else "r") + ("" if text else "b"))
            theirs.append(r if i == 0 else w)
            files.append(theirs[-1])
        else:
            fd = _fd(spec, files)
            theirs.append(i if fd is None else fd)
    err = _fd(stderr, files)
    theirs.append(2 if err is None else err)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sock)
    req_msg = {"argv": req, "cwd": os.getcwd()}
    socket.send_fds(s, [json.dumps(req_msg).encode()], theirs)
    for f in files:
        if isinstance(f, int):
            os.close(f)
        else:
            f.close()
    pid = struct.unpack("i", s.recv(4))[0]
    return Process(s, pid, ours[0], ours[1])
