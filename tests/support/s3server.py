"""An S3-compatible server on 127.0.0.1 for the remote tests and ``bench/remote.py``: moto's server app
(what ``moto.server.ThreadedMotoServer`` serves) behind a WSGI middleware that counts, per request, the
body bytes received from the client (uploads) and sent to it (downloads), and that can fail requests on
purpose (fault injection).

The counts are the server's, independent of tietool's own :data:`tietool.surgery.store.TRANSFER`: a
server-side copy (``PUT`` with ``x-amz-copy-source``) moves no body in either direction.

Run as a script (``python tests/support/s3server.py --port 0``) it serves in its own process and prints
``PORT <n>``; ``GET /_counts`` returns the counts as JSON and ``POST /_counts`` resets them.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Counts:
    """What the server saw. ``received``: request body bytes (uploads); ``sent``: response body bytes
    (downloads); ``requests``: requests by method; ``log``: ``(method, path, range, received, sent)``."""

    received: int = 0
    sent: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    log: list[tuple[str, str, str, int, int]] = field(default_factory=list)


class CountingApp:
    """WSGI middleware over moto's app: counts bytes, and fails requests that ``fail`` selects (a callable
    of ``(method, path)``; it returns True for a request that gets a 500 with no effect)."""

    def __init__(self, app: Any):
        self.app = app
        self.counts = Counts()
        self.lock = threading.Lock()
        self.fail: Any = None

    def reset(self) -> None:
        with self.lock:
            self.counts = Counts()

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if path == "/_counts":
            if method == "POST":
                self.reset()
            body = json.dumps(asdict(self.counts)).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if self.fail is not None and self.fail(method, path):
            start_response("500 Internal Server Error", [("Content-Type", "application/xml")])
            return [b"<Error><Code>InternalError</Code><Message>injected fault</Message></Error>"]
        received = int(environ.get("CONTENT_LENGTH") or 0)
        chunks = list(self.app(environ, start_response))  # moto builds whole responses in memory anyway
        sent = sum(len(c) for c in chunks)
        with self.lock:
            c = self.counts
            c.received += received
            c.sent += sent
            c.requests[method] = c.requests.get(method, 0) + 1
            c.log.append((method, path, environ.get("HTTP_RANGE", ""), received, sent))
        return chunks


class S3Server:
    """moto's S3 server with :class:`CountingApp` on ``127.0.0.1:port`` (0: a free port), in a thread."""

    def __init__(self, port: int = 0):
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args, **kwargs):  # no line per request on stderr
                pass

        self.app = CountingApp(DomainDispatcherApplication(create_backend_app))
        self._server = make_server("127.0.0.1", port, self.app, threaded=True, request_handler=Quiet)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> S3Server:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()


def client_env(endpoint: str) -> dict[str, str]:
    """The environment botocore/s3fs read to talk to the server at ``endpoint`` (any key works)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
    }


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(16 << 20))  # larger objects spill to disk
    srv = S3Server(args.port)
    print(f"PORT {srv.port}", flush=True)
    srv._server.serve_forever()
