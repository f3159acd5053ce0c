"""The store seam (issue 19, S4; :mod:`surgery.io.store`): local and remote are a store, not an ``if``.

- Only ``surgery/io/`` knows local from remote: no other module calls or imports ``is_remote`` (AST walk).
- Third-party errors map in one place: every class below botocore's ``BotoCoreError``/``ClientError``,
  ``aiohttp.ClientError``, ``httpx.HTTPError``, fsspec's errors, ``huggingface_hub``'s validation error,
  ``ValueError``/``RuntimeError`` (what fsspec backends raise for a bad path or an unsupported operation)
  and ``OSError`` (each errno tietool meets) becomes one line naming the URL, exit 3 reading and 6 writing;
  a bug (``KeyError``) and tietool's own errors are not touched.
- A :class:`MemoryStore` (a dict of name → bytes) holds a checkpoint with no files and no server: the
  detection and the plans of tie / untie / resize are the ones of the same checkpoint in a folder, and a
  write into it holds the bytes a local write does.
"""

from __future__ import annotations

import ast
import errno
import importlib
import json
import re

import pytest
from support.paths import CASES_DIR, REPO

from tietool.surgery.inspect.detect import detect
from tietool.surgery.io import store, stores
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.io.stores import LocalStore, MemoryStore, RemoteStore
from tietool.surgery.model.errors import (
    CheckpointError,
    ExitCode,
    OutputError,
    StorageError,
    TietoolError,
    UsageError,
)
from tietool.surgery.plan.resize import plan_resize
from tietool.surgery.plan.tie import plan_tie
from tietool.surgery.plan.untie import plan_untie

pytest.importorskip("fsspec")
pytest.importorskip("upath")

URL = "s3://bucket/prefix/model-00001-of-00002.safetensors"


# ---------------------------------------------------------------------------------------- is_remote in io/
def _library_files():
    top = [REPO / "__init__.py", REPO / "__main__.py"]
    return [*REPO.glob("surgery/**/*.py"), *REPO.glob("cli/**/*.py"), *top]


def _uses_of(name: str, path) -> list[int]:
    """Lines of ``path`` that name ``name``: a call or reference (``store.is_remote``, ``is_remote``) or an
    import of it."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        named = getattr(node, "attr", None) if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if named == name:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            lines.append(node.lineno)
    return lines


def test_is_remote_only_inside_io():
    outside = {
        f"{p.relative_to(REPO)}:{n}"
        for p in _library_files()
        if "surgery/io/" not in p.relative_to(REPO).as_posix()
        for n in _uses_of("is_remote", p)
    }
    assert outside == set()


def test_the_walk_sees_is_remote(tmp_path):
    """Not vacuous: the walk finds a call, a bare call and an import, and the definition in io/."""
    f = tmp_path / "m.py"
    f.write_text("from .io.store import is_remote\nfrom .io import store\nstore.is_remote(p)\nis_remote(q)\n")
    assert _uses_of("is_remote", f) == [1, 3, 4]
    assert _uses_of("is_remote", REPO / "surgery/io/store.py")


def test_store_for():
    assert isinstance(stores.store_for(CASES_DIR), LocalStore) and stores.store_for(CASES_DIR).on_disk
    assert isinstance(stores.store_for(str(CASES_DIR)), LocalStore)
    mem = MemoryStore({"a.txt": b"abc"})
    try:
        st = stores.store_for(mem.url)
        assert isinstance(st, RemoteStore) and not st.on_disk
        assert st.list() == {"a.txt": 3} and st.size("a.txt") == 3 and st.read_range("a.txt", 1, 5) == b"bc"
        with st.open_read("a.txt") as f:
            assert f.read() == b"abc"
    finally:
        mem.clear()


# ------------------------------------------------------------------------------------------ error mapping
def _import_libraries() -> None:
    """The libraries under the stores, imported (the mapping covers the ones a process has imported)."""
    for mod in (
        "botocore.exceptions",
        "aiohttp",
        "fsspec.exceptions",
        "s3fs",
        "huggingface_hub",
        "huggingface_hub.errors",
        "requests",
        "httpx",
    ):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass


def _all_subclasses(roots) -> list[type[BaseException]]:
    seen: dict[type, None] = {}
    todo = list(roots)
    while todo:
        c = todo.pop()
        if c not in seen:
            seen[c] = None
            todo += c.__subclasses__()
    return [c for c in seen if not issubclass(c, TietoolError)]


def _instance(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` however its constructor wants to be called (some need keyword arguments)."""
    try:
        return cls("boom")
    except Exception:  # noqa: BLE001 - a constructor with other arguments: built without it
        e = cls.__new__(cls)
        BaseException.__init__(e, "boom")
        return e


_import_libraries()
THIRD_PARTY = _all_subclasses(store.third_party_errors())
ERRNOS = [errno.EACCES, errno.ENOENT, errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EIO]
ERRNOS += [errno.ENOSPC, errno.EROFS, errno.EPIPE, errno.EHOSTUNREACH]


def test_the_walk_covers_the_libraries():
    names = {f"{c.__module__}.{c.__qualname__}" for c in THIRD_PARTY}
    for expected in (
        "botocore.exceptions.EndpointConnectionError",
        "botocore.exceptions.NoCredentialsError",
        "botocore.exceptions.ClientError",
        "aiohttp.client_exceptions.ClientConnectorError",
        "httpx.ConnectError",
        "fsspec.exceptions.FSTimeoutError",
        "builtins.PermissionError",
        "builtins.FileNotFoundError",
    ):
        if expected.split(".")[0] != "builtins" and importlib.util.find_spec(expected.split(".")[0]) is None:
            continue
        assert expected in names
    assert len(THIRD_PARTY) > 50


def _mapped(e: BaseException, output: bool) -> TietoolError:
    with pytest.raises(TietoolError) as got:
        with store.map_errors(URL, output=output):
            raise e
    return got.value


@pytest.mark.parametrize("output", [False, True], ids=["read", "write"])
def test_no_third_party_error_escapes(output):
    """Every class (and an ``OSError`` of each errno) becomes one line naming the URL, with exit 75 for a
    network or store failure (:data:`TRANSIENT`), else 3 (read) or 6 (write)."""
    wrong = []
    cases = [_instance(c) for c in THIRD_PARTY] + [OSError(n, f"{errno.errorcode[n]} text") for n in ERRNOS]
    for e in cases:
        got = _mapped(e, output)
        want = (OutputError, ExitCode.OUTPUT) if output else (CheckpointError, ExitCode.CHECKPOINT)
        if store.is_transient(e):
            want = (StorageError, ExitCode.UNAVAILABLE)
        line = got.one_line()
        if type(got) is not want[0] or got.exit_code != want[1] or "\n" in line or URL not in line:
            wrong.append((type(e), type(got), line))
    assert wrong == []


# network failures (retry: exit 75) and failures of the object or the request (exit 3 / 6), by class name
TRANSIENT = {
    "builtins.ConnectionResetError",
    "builtins.ConnectionRefusedError",
    "builtins.TimeoutError",
    "botocore.exceptions.EndpointConnectionError",
    "botocore.exceptions.ConnectTimeoutError",
    "botocore.exceptions.ReadTimeoutError",
    "aiohttp.client_exceptions.ClientConnectorError",
    "aiohttp.client_exceptions.ServerTimeoutError",
    "httpx.ConnectError",
    "httpx.ReadTimeout",
    "fsspec.exceptions.FSTimeoutError",
}
NOT_TRANSIENT = {
    "builtins.PermissionError",
    "builtins.FileNotFoundError",
    "builtins.ValueError",
    "botocore.exceptions.NoCredentialsError",
    "botocore.exceptions.ClientError",
    "httpx.InvalidURL",
    "httpx.UnsupportedProtocol",
}


def test_transient_classes():
    """The network failures a second run may not meet are exit 75 (:class:`StorageError`), read or write;
    a missing object, a refused credential or a bad URL stay 3 / 6."""
    by_name = {f"{c.__module__}.{c.__qualname__}": c for c in THIRD_PARTY}
    for name in TRANSIENT | NOT_TRANSIENT:
        if name not in by_name:
            assert importlib.util.find_spec(name.split(".")[0]) is None or name.startswith("builtins"), name
            continue
        e = _instance(by_name[name])
        for output in (False, True):
            got = _mapped(e, output)
            if name in TRANSIENT:
                assert type(got) is StorageError and got.exit_code == 75, (name, output)
                assert "the network or the store failed" in got.message and "run the command again" in got.fix
            else:
                assert type(got) is not StorageError, (name, output)
    for n in (errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EHOSTUNREACH):
        assert _mapped(OSError(n, "x"), False).exit_code == ExitCode.UNAVAILABLE
    for n in (errno.ENOENT, errno.EACCES, errno.ENOSPC, errno.EIO):
        assert _mapped(OSError(n, "x"), False).exit_code == ExitCode.CHECKPOINT


def test_transient_status_and_cause():
    """An HTTP 429/5xx (an S3 ``SlowDown``, a Hub 503) is exit 75, a 403/404 is not; an error raised from a
    network failure (s3fs re-raises botocore's as OSError) is exit 75 too."""
    botocore = pytest.importorskip("botocore.exceptions")

    def client_error(code: str, status: int) -> BaseException:
        return botocore.ClientError(
            {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
            "GetObject",
        )

    assert _mapped(client_error("SlowDown", 503), False).exit_code == ExitCode.UNAVAILABLE
    assert _mapped(client_error("InternalError", 500), True).exit_code == ExitCode.UNAVAILABLE
    assert _mapped(client_error("AccessDenied", 403), False).exit_code == ExitCode.CHECKPOINT
    assert _mapped(client_error("NoSuchKey", 404), False).exit_code == ExitCode.CHECKPOINT
    try:
        try:
            raise botocore.EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
        except Exception as inner:
            raise OSError(errno.EIO, "s3fs: could not read") from inner
    except OSError as e:
        outer = e
    got = _mapped(outer, False)
    assert got.exit_code == ExitCode.UNAVAILABLE
    assert got.one_line() == (
        f"{URL}: cannot read the object (OSError: [Errno 5] s3fs: could not read): the network or the store "
        "failed — run the command again (if it keeps failing, check the endpoint (AWS_ENDPOINT_URL / "
        "HF_ENDPOINT) and the connection)"
    )


def test_mapping_is_not_a_blanket():
    """tietool's own errors pass unchanged, and so does a bug (a KeyError is not a store's error)."""
    own = UsageError("x", "y", "z")
    with pytest.raises(UsageError) as got:
        with store.map_errors(URL):
            raise own
    assert got.value is own
    with pytest.raises(KeyError):
        with store.map_errors(URL):
            raise KeyError("a bug")
    with pytest.raises(FileNotFoundError):
        with store.map_errors(URL, keep=(FileNotFoundError,)):
            raise FileNotFoundError("a missing folder the caller explains")


def test_messages():
    e = _mapped(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), output=False)
    assert e.exit_code == 75
    assert e.one_line() == (
        f"{URL}: cannot read the object (ConnectionResetError: [Errno 104] Connection reset by peer): the "
        "network or the store failed — run the command again (if it keeps failing, check the endpoint "
        "(AWS_ENDPOINT_URL / HF_ENDPOINT) and the connection)"
    )
    e = _mapped(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), output=True)
    assert e.exit_code == 75
    assert e.one_line() == (
        f"{URL}: cannot write the object ([Errno 104] Connection reset by peer): the network or the store "
        "failed; the output is incomplete and was not published — run the command again (if it keeps "
        "failing, check the endpoint and the connection)"
    )
    e = _mapped(PermissionError(errno.EACCES, "Access Denied"), output=False)
    assert (type(e), e.exit_code) == (CheckpointError, 3)
    assert e.one_line() == (
        f"{URL}: cannot read the object (PermissionError: [Errno 13] Access Denied) — check the URL, the "
        "endpoint (AWS_ENDPOINT_URL / HF_ENDPOINT), the credentials and the connection"
    )
    e = _mapped(PermissionError(errno.EACCES, "Access Denied"), output=True)
    assert (type(e), e.exit_code) == (OutputError, 6)


def test_open_maps_a_backend_error(monkeypatch):
    """Checkpoint.open of a store whose listing fails with a botocore error: one line naming the folder."""
    botocore = pytest.importorskip("botocore.exceptions")
    mem = MemoryStore.from_folder(CASES_DIR / "pnlp_llama_tied")
    try:

        def ls(*_a, **_k):
            raise botocore.EndpointConnectionError(endpoint_url="http://127.0.0.1:9")

        monkeypatch.setattr(mem.root.fs, "ls", ls)
        with pytest.raises(StorageError) as got:
            Checkpoint.open(mem.url)
        assert got.value.exit_code == ExitCode.UNAVAILABLE
        line = got.value.one_line()
        assert line.startswith(f"{mem.url}: cannot read the object (EndpointConnectionError: "), line
    finally:
        monkeypatch.undo()
        mem.clear()


# ------------------------------------------------------------------------------ planners on a MemoryStore
CASES = [
    "pf_llama_tied_sharded",
    "pf_llama_untied_sharded",
    "pnlp_llama_tied",
    "pnlp_llama_untied",
    "pf_llama_untied_legacy_pdparams",
    "pnlp_bert_mlm",
    "pnlp_t5",
    "pf_qwen2_tied",
]


@pytest.fixture(params=CASES)
def both(request):
    """The checkpoint of a fixture opened from its folder and from a MemoryStore of its bytes, and a function
    that shows a value with either root replaced by ``<ckpt>``."""
    folder = CASES_DIR / request.param
    mem = MemoryStore.from_folder(folder)
    local, held = Checkpoint.open(folder), Checkpoint.open(mem.url)
    roots = [str(local.path), str(held.path), repr(held.path), repr(local.path), held.path.path]

    def shown(value) -> str:
        text = value if isinstance(value, str) else repr(value)
        for r in sorted(roots, key=len, reverse=True):
            text = text.replace(r, "<ckpt>")
        return re.sub(r"\b\d{12,}\b", "<id>", text)  # id() of a pickle's storage object

    yield local, held, shown
    mem.clear()


def _outcome(make, shown) -> str:
    """The plan ``make()`` returns without its checkpoint and detection (shown), or the refusal's line."""
    try:
        plan = make()
    except TietoolError as e:
        return shown(f"{type(e).__name__}: {e.one_line()}")
    fields = {k: v for k, v in vars(plan).items() if k not in ("ckpt", "det")}
    return shown(fields)


def test_memory_store_holds_no_files(both):
    _, held, _ = both
    assert not held.store.on_disk and str(held.path).startswith("memory://")


def test_checkpoint_and_detection_equal(both):
    local, held, shown = both
    assert list(held.tensors) == list(local.tensors)
    assert [shown(t) for t in held.tensors.values()] == [shown(t) for t in local.tensors.values()]
    assert (held.config, held.format, held.weight_files, held.other_files) == (
        local.config,
        local.format,
        local.weight_files,
        local.other_files,
    )
    assert shown(detect(held)) == shown(detect(local))


@pytest.mark.parametrize("op", ["tie", "tie-head", "untie", "resize", "resize-pad"])
def test_plan_equal(both, op):
    local, held, shown = both
    make = {
        "tie": lambda d: plan_tie(d),
        "tie-head": lambda d: plan_tie(d, keep="head"),
        "untie": lambda d: plan_untie(d),
        "resize": lambda d: plan_resize(d, d.vocab_rows + 8, init="zeros", seed=0),
        "resize-pad": lambda d: plan_resize(d, d.vocab_rows + 3, pad_to_multiple_of=8, init="mean", seed=1),
    }[op]
    a = _outcome(lambda: make(detect(local)), shown)
    b = _outcome(lambda: make(detect(held)), shown)
    assert b == a
    assert a.startswith(("{'op': ", "RefusedError: ", "ValuesDifferError: ", "UsageError: ")), a


# ---------------------------------------------------------------------------------- writing into memory
WRITES = [
    ("tie", "pf_llama_tied_sharded", {}),
    ("untie", "pnlp_llama_tied", {}),
    ("resize", "pf_llama_untied_sharded", {"vocab_size": 192, "seed": 0}),
]


def _files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _same_report(a: bytes, b: bytes) -> bool:
    ra, rb = json.loads(a), json.loads(b)
    for r in (ra, rb):
        for k in ("input", "output", "transferred"):
            r.pop(k, None)
    return bool(ra == rb)


@pytest.mark.parametrize(("op", "case", "kw"), WRITES, ids=[f"{w[0]}-{w[1]}" for w in WRITES])
def test_write_into_memory_equals_local(tmp_path, op, case, kw):
    """memory → memory (whole files copied within the store, rewritten ones uploaded, index last): the same
    bytes as a local write, and the report but for where it was read and written."""
    from tietool.surgery import ops

    fn = getattr(ops, op)
    fn(CASES_DIR / case, out=tmp_path / "local", **kw)
    mem = MemoryStore.from_folder(CASES_DIR / case)
    try:
        rep = fn(mem.url, out=mem.sibling("out"), **kw)
        assert rep["transferred"]["requests"] > 0
        got = mem.files(mem.sibling("out"))
        want = _files(tmp_path / "local")
        assert sorted(got) == sorted(want)
        assert [k for k in want if got[k] != want[k] and k != "tietool-report.json"] == []
        assert _same_report(got["tietool-report.json"], want["tietool-report.json"])
        src = CASES_DIR / case
        assert mem.files() == _files(src)  # the input is untouched
    finally:
        mem.clear()


def test_write_refuses_a_non_empty_memory_output():
    from tietool.surgery import ops

    mem = MemoryStore.from_folder(CASES_DIR / "pnlp_llama_tied")
    try:
        with pytest.raises(UsageError, match="out contains the input"):
            ops.tie(mem.url, out=mem.url.rsplit("/", 1)[0])
        full = MemoryStore({"x.txt": b"x"})
        with pytest.raises(UsageError, match="out already exists and is not empty"):
            ops.tie(mem.url, out=full.url)
        assert full.files() == {"x.txt": b"x"}
        full.clear()
    finally:
        mem.clear()


def test_a_backend_value_error_is_one_line():
    """huggingface_hub's file system refuses ``hf://org`` with a plain ValueError (no request made): mapped,
    as it was by the blanket ``except Exception`` it replaces."""
    pytest.importorskip("huggingface_hub")
    with pytest.raises(CheckpointError) as got:
        Checkpoint.open("hf://org")
    line = got.value.one_line()
    assert line.startswith("hf://org: cannot read the object (ValueError: Repository id must be"), line
