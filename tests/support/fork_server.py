"""A ``tietool`` command for the documents' shell examples that starts in milliseconds: a fork server.

``python fork_server.py serve SOCKET`` imports the package under test once (every module of ``tietool.cli``
and ``tietool.surgery``; no paddle, no thread) and waits on a Unix socket. ``python -S -I fork_server.py run
SOCKET ARG...`` (the ``tietool`` on the examples' ``PATH``, :func:`write_shim`) hands it its argv, working
folder, environment and its stdin/stdout/stderr (the file descriptors themselves, ``SCM_RIGHTS``); the
server forks a child that takes them as its own, runs ``tietool.cli.app.main()`` as ``python -m tietool``
would, and sends back the exit code, which the command exits with.

Each run is a fresh fork of the same freshly imported process, so no run sees another's state; what a run
shares with the server is only what importing did (nothing reads the environment at import: the child gets
the caller's environment before ``main`` runs). A run costs the command's work, not the ~1 s of imports of a
new interpreter. Without the server (it could not start), the command runs ``python -m tietool`` instead.

Nothing here is imported by the tests at module level but :func:`start` and :func:`write_shim`.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

_MSG = 1 << 20  # the largest request: argv, cwd and the environment as JSON


def _preload() -> None:
    """Import every module of the CLI and the library (what the commands would import lazily)."""
    import importlib
    import pkgutil
    import threading

    import tietool

    for pkg in ("tietool.cli", "tietool.surgery"):
        mod = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
            if not info.name.endswith(".__main__"):  # `python -m tietool.cli` would run the app
                importlib.import_module(info.name)
    assert "paddle" not in sys.modules and threading.active_count() == 1, "cannot fork safely"
    assert tietool.__file__


def _child(conn: socket.socket) -> None:
    """Run one request in this (forked) process and send its exit code; never returns."""
    import json
    import traceback

    code = 70
    try:
        msg, fds, _flags, _addr = socket.recv_fds(conn, _MSG, 3)
        req = json.loads(msg)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["tietool", *req["argv"]]
        from tietool.cli import app

        try:
            app.main()
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe, as at interpreter exit
                pass
        try:
            conn.send(struct.pack("i", code))
        finally:
            os._exit(0)


def serve(path: str) -> None:
    """Preload, then fork a child per connection on the Unix socket ``path`` until killed."""
    _preload()
    from preload import serve_forks  # run as a script: tests/support is sys.path[0]

    serve_forks(path, _child)


def run(path: str, argv: list[str]) -> int:
    """The ``tietool`` command: one run by the server at ``path``; its exit code."""
    import json

    req = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.connect(path)
        except OSError:  # the server is gone: a new interpreter, as without it
            os.execv(sys.executable, [sys.executable, "-m", "tietool", *argv])
        socket.send_fds(s, [json.dumps(req).encode()], [0, 1, 2])
        reply = s.recv(4)
    if len(reply) != 4:
        print("tietool (fork server): the run ended without an exit code", file=sys.stderr)
        return 1
    return struct.unpack("i", reply)[0]


def start(folder: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a server in ``folder`` (its socket ``folder/tietool.sock``) with ``env``; returns it once it is
    ready (the caller terminates it)."""
    sock = folder / "tietool.sock"
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve", str(sock)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the fork server did not start (exit {proc.wait()})")
    return proc


def write_shim(shim: Path, sock: Path) -> None:
    """``shim``: a ``tietool`` command that runs through the server at ``sock`` when it listens, else
    ``python -m tietool``."""
    py, me = sys.executable, __file__
    shim.write_text(
        "#!/bin/sh\n"
        f'if [ -S "{sock}" ]; then exec "{py}" -S -I "{me}" run "{sock}" "$@"; fi\n'
        f'exec "{py}" -m tietool "$@"\n'
    )
    shim.chmod(0o755)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(run(sys.argv[2], sys.argv[3:]))
