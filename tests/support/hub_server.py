"""A local stand-in for the Hugging Face Hub's HTTP API, enough for ``huggingface_hub.HfFileSystem`` to
list and read a model repository: model info (``/api/models/{repo}[/revision/{rev}]``), the tree
(``/api/models/{repo}/tree/{rev}[/{path}]``), paths-info, and files with range requests
(``/{repo}/resolve/{rev}/{path}``). The repositories are local folders (``repos``: repo id → folder).

Every response body's bytes are counted per path (``sent``), as the S3 server's middleware counts them.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path

SHA = "0123456789abcdef0123456789abcdef01234567"


class HubApp:
    def __init__(self, repos: dict[str, Path]):
        self.repos = repos
        self.sent: dict[str, int] = {}
        self.lock = threading.Lock()

    def _entries(self, repo: str, sub: str, recursive: bool) -> list[dict]:
        root = self.repos[repo]
        base = root / sub if sub else root
        items = base.rglob("*") if recursive else base.iterdir()
        out = []
        for p in sorted(items):
            rel = p.relative_to(root).as_posix()
            oid = hashlib.sha1(rel.encode()).hexdigest()
            if p.is_dir():
                out.append({"type": "directory", "oid": oid, "path": rel})
            else:
                out.append({"type": "file", "oid": oid, "size": p.stat().st_size, "path": rel})
        return out

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        query = environ.get("QUERY_STRING", "")
        status, headers, body = self._route(method, path, query, environ)
        with self.lock:
            self.sent[path] = self.sent.get(path, 0) + (len(body) if method != "HEAD" else 0)
        headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [b"" if method == "HEAD" else body]

    def _json(self, data) -> tuple[str, list, bytes]:
        return "200 OK", [("Content-Type", "application/json")], json.dumps(data).encode()

    def _route(self, method, path, query, environ):
        for repo in self.repos:
            if m := re.fullmatch(rf"/api/models/{re.escape(repo)}(?:/revision/[^/]+)?", path):
                siblings = [
                    {"rfilename": e["path"]} for e in self._entries(repo, "", True) if e["type"] == "file"
                ]
                return self._json({"id": repo, "sha": SHA, "siblings": siblings, "private": False})
            if m := re.fullmatch(rf"/api/models/{re.escape(repo)}/tree/[^/]+/?(.*)", path):
                return self._json(self._entries(repo, m.group(1), "recursive=true" in query.lower()))
            if re.fullmatch(rf"/api/models/{re.escape(repo)}/paths-info/[^/]+", path):
                length = int(environ.get("CONTENT_LENGTH") or 0)
                form = environ["wsgi.input"].read(length).decode()
                wanted = set(re.findall(r"paths=([^&]+)", form))
                from urllib.parse import unquote_plus

                wanted = {unquote_plus(w) for w in wanted}
                return self._json([e for e in self._entries(repo, "", True) if e["path"] in wanted])
            if m := re.fullmatch(rf"/{re.escape(repo)}/resolve/[^/]+/(.+)", path):
                return self._file(self.repos[repo] / m.group(1), environ)
        return "404 Not Found", [("X-Error-Code", "RepoNotFound")], b'{"error": "not found"}'

    def _file(self, p: Path, environ):
        if not p.is_file():
            return "404 Not Found", [("X-Error-Code", "EntryNotFound")], b'{"error": "entry not found"}'
        data = p.read_bytes()
        headers = [("ETag", f'"{hashlib.sha1(data).hexdigest()}"'), ("X-Repo-Commit", SHA)]
        rng = environ.get("HTTP_RANGE")
        if rng and (m := re.fullmatch(r"bytes=(\d+)-(\d*)", rng)):
            start, end = int(m.group(1)), int(m.group(2) or len(data) - 1)
            headers.append(("Content-Range", f"bytes {start}-{end}/{len(data)}"))
            return "206 Partial Content", headers, data[start : end + 1]
        return "200 OK", headers, data


class HubServer:
    """:class:`HubApp` on 127.0.0.1 (a free port) in a thread."""

    def __init__(self, repos: dict[str, Path]):
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args, **kwargs):
                pass

        self.app = HubApp(repos)
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True, request_handler=Quiet)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()
