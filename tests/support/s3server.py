"""An S3-compatible server on 127.0.0.1 for the remote tests and ``bench/remote.py``: moto's server app
(what ``moto.server.ThreadedMotoServer`` serves) behind a WSGI middleware that counts, per request, the
body bytes received from the client (uploads) and sent to it (downloads), and that can fail requests on
purpose (fault injection).

The counts are the server's, independent of tietool's own :data:`tietool.surgery.io.store.TRANSFER`: a
server-side copy (``PUT`` with ``x-amz-copy-source``) moves no body in either direction.

Run as a script (``python tests/support/s3server.py --port 0``) it serves in its own process and prints
``PORT <n>``; ``GET /_counts`` returns the counts as JSON and ``POST /_counts`` resets them.
"""

from __future__ import annotations

import json
import os
import re
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
    """WSGI middleware over moto's app: counts bytes, fails requests that ``fail`` selects (a callable of
    ``(method, path)``; it returns True for a request that gets a 500 with no effect), and answers ranged
    GETs of objects itself (:func:`_ranged_get`) unless ``fast_ranges`` is False."""

    def __init__(self, app: Any):
        self.app = app
        self.counts = Counts()
        self.lock = threading.Lock()
        self.fail: Any = None
        self.fast_ranges = True
        self.fast_hits = 0
        self.copy_lock = threading.Lock()  # server-side copies one at a time (bounded server memory)

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
        fast = _ranged_get(environ, method, path) if self.fast_ranges else None
        if fast is not None:
            self.fast_hits += 1
            status, headers, body = fast
            start_response(status, headers)
            chunks = [body]
        elif "HTTP_X_AMZ_COPY_SOURCE" in environ or (
            method == "POST" and "uploadId=" in environ["QUERY_STRING"]
        ):
            # copies and multipart completions one at a time: moto holds whole objects in memory for them
            with self.copy_lock:
                chunks = list(self.app(environ, start_response))
        else:
            chunks = list(self.app(environ, start_response))  # moto builds whole responses in memory
        sent = sum(len(c) for c in chunks)
        with self.lock:
            c = self.counts
            c.received += received
            c.sent += sent
            c.requests[method] = c.requests.get(method, 0) + 1
            c.log.append((method, path, environ.get("HTTP_RANGE", ""), received, sent))
        return chunks


def _ranged_get(environ, method: str, path: str) -> tuple[str, list, bytes] | None:
    """A ranged GET of an object, answered from moto's stored key by seeking to the range: moto's own
    handler reads (and copies) the whole object for every range request, which makes a 8-byte read of a
    1.4 GB shard take a second; S3 itself serves a range in time proportional to the range. Returns None
    (moto answers) for anything else: no Range, a bucket-level path, an unknown key, a range it cannot
    parse, a versioned request, a condition other than an ``If-Match`` the object's ETag meets."""
    rng = environ.get("HTTP_RANGE", "")
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng)
    if method != "GET" or not m or path.count("/") < 2 or environ.get("QUERY_STRING"):
        return None
    if any(
        k in environ for k in ("HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE", "HTTP_IF_UNMODIFIED_SINCE")
    ):
        return None
    from urllib.parse import unquote

    from moto.s3.models import s3_backends

    bucket, key = unquote(path).lstrip("/").split("/", 1)
    try:
        backend = s3_backends["123456789012"]["aws"]
        k = backend.buckets[bucket].keys.get(key)
    except KeyError:
        return None
    if k is None or environ.get("HTTP_IF_MATCH", k.etag) != k.etag:  # s3fs files send If-Match: ETag
        return None
    start, end = int(m.group(1)), min(int(m.group(2)), k.size - 1)
    if start > end:
        return None
    with k.lock:
        k._value_buffer.seek(start)
        body = k._value_buffer.read(end - start + 1)
    headers = [
        ("Content-Type", "binary/octet-stream"),
        ("Content-Range", f"bytes {start}-{end}/{k.size}"),
        ("Content-Length", str(len(body))),
        ("ETag", k.etag),
        ("Last-Modified", k.last_modified_RFC1123),
        ("Accept-Ranges", "bytes"),
    ]
    return "206 Partial Content", headers, body


def _patch_part_copy() -> None:
    """moto's ``UploadPartCopy`` reads the whole source object for every part (s3fs copies objects over
    150 MB in 50 MB parts, so a 1.4 GB shard is read 29 times); read only the part's range instead, as S3
    does. Same result: the part's bytes."""
    from moto.s3.models import S3Backend

    def upload_part_copy(
        self,
        dest_bucket_name,
        multipart_id,
        part_id,
        src_bucket_name,
        src_key_name,
        src_version_id,
        start_byte,
        end_byte,
    ):
        multipart = self.get_bucket(dest_bucket_name).multiparts[multipart_id]
        key = self.get_object(src_bucket_name, src_key_name, version_id=src_version_id)
        if start_byte is None:
            value = key.value
        else:
            with key.lock:
                key._value_buffer.seek(start_byte)
                value = key._value_buffer.read(end_byte - start_byte + 1)
        return multipart.set_part(part_id, value)

    S3Backend.upload_part_copy = upload_part_copy


class S3Server:
    """moto's S3 server with :class:`CountingApp` on ``127.0.0.1:port`` (0: a free port), in a thread."""

    def __init__(self, port: int = 0):
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args, **kwargs):  # no line per request on stderr
                pass

        _patch_part_copy()
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
