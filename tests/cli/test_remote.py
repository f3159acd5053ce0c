"""Checkpoints in object storage (issue 13), against a real S3 API on 127.0.0.1: moto's server app behind a
counting middleware (``support/s3server.py``), in a thread of this process; the fixtures are uploaded there.

Every command runs against it and its output is compared byte for byte with the local run's; the bytes the
server sends and receives are counted per object, independently of tietool's own counter (which must agree).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import CASES_DIR, REPO
from support.s3server import S3Server, client_env

pytest.importorskip("moto")
pytest.importorskip("s3fs")
pytest.importorskip("upath")

BUCKET = "ckpts"
CASES = ["pf_llama_untied_sharded", "pf_llama_tied_sharded", "pnlp_llama_untied", "pnlp_llama_tied"]


@pytest.fixture(scope="module")
def s3():
    """The server, the client environment pointed at it (restored after), the fixtures uploaded."""
    srv = S3Server().start()
    saved = {k: os.environ.get(k) for k in client_env(srv.endpoint)}
    os.environ.update(client_env(srv.endpoint))
    import fsspec
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = fsspec.filesystem("s3")
    fs.mkdir(BUCKET)
    for case in CASES:
        fs.put(str(CASES_DIR / case), f"{BUCKET}/in/{case}", recursive=True)
    srv.app.reset()
    yield srv, fs
    s3fs.S3FileSystem.clear_instance_cache()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    srv.stop()


def _object_bytes(srv, key_part: str = "") -> dict[str, int]:
    """Bytes the server sent per object (GETs of a key; listings are not objects), since the last reset."""
    out: dict[str, int] = {}
    for method, path, _rng, _recv, sent in srv.app.counts.log:
        if method == "GET" and path.count("/") >= 2 and key_part in path:
            out[path] = out.get(path, 0) + sent
    return out


def _header_bytes(path: Path) -> int:
    """8 + the header length of a safetensors file: what reading its header takes."""
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def _tree(p: Path) -> dict[str, bytes]:
    return {q.relative_to(p).as_posix(): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file()}


def _same_report(a: bytes, b: bytes) -> bool:
    """Two ``tietool-report.json`` agree but for where they were read and written."""
    ra, rb = json.loads(a), json.loads(b)
    for r in (ra, rb):
        for k in ("input", "output", "transferred"):
            r.pop(k, None)
    return ra == rb


def _inspect_doc(info) -> str:
    d = dict(info)
    d.pop("path")
    d.pop("transferred", None)
    return json.dumps(d, sort_keys=True, default=str)


# ---------------------------------------------------------------- inspect


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("values", [False, True])
def test_inspect_remote_equals_local_and_reads_headers_only(s3, case, values):
    from tietool.surgery import ops as operations
    from tietool.surgery.io import store

    srv, _fs = s3
    srv.app.reset()
    remote = operations.inspect(f"s3://{BUCKET}/in/{case}", compare_values=values)
    local = operations.inspect(CASES_DIR / case, compare_values=values)
    assert _inspect_doc(remote) == _inspect_doc(local)
    sent = _object_bytes(srv)
    assert remote["transferred"]["received"] == sum(sent.values())  # tietool's count = the server's
    folder = CASES_DIR / case
    if case.startswith("pf_"):
        ckpt = store.as_path(str(folder))
        from tietool.surgery.io.checkpoint import Checkpoint

        c = Checkpoint.open(ckpt)
        value_bytes: dict[str, int] = {}
        if values:
            for name in (remote["embedding"]["name"], remote["head"].get("name")):
                if name and name in c.tensors:
                    t = c.tensors[name]
                    value_bytes[t.file] = value_bytes.get(t.file, 0) + t.nbytes
        for f in c.weight_files:
            got = sent.get(f"/{BUCKET}/in/{case}/{f}", 0)
            assert got == _header_bytes(folder / f) + value_bytes.get(f, 0), f
        small = sum((folder / n).stat().st_size for n in ("config.json", "model.safetensors.index.json"))
        assert (
            sum(sent.values()) - sum(sent.get(f"/{BUCKET}/in/{case}/{f}", 0) for f in c.weight_files)
            <= 2 * small
        )


def test_inspect_pdparams_walk_skips_payloads(s3, monkeypatch):
    """The opcode walker over a remote ``.pdparams`` fetches the pickle structure, not the arrays: with a
    512-byte block, the bytes fetched stay under the non-payload bytes plus a block per array."""
    from tietool.surgery import ops as operations
    from tietool.surgery.io import store
    from tietool.surgery.io.checkpoint import Checkpoint

    srv, _fs = s3
    monkeypatch.setattr(store, "WALK_BLOCK", 512)
    case = "pnlp_llama_untied"
    c = Checkpoint.open(CASES_DIR / case)
    payload = sum(t.nbytes for t in c.tensors.values())
    size = (CASES_DIR / case / "model_state.pdparams").stat().st_size
    srv.app.reset()
    operations.inspect(f"s3://{BUCKET}/in/{case}", compare_values=False)
    got = _object_bytes(srv, "model_state.pdparams")[f"/{BUCKET}/in/{case}/model_state.pdparams"]
    assert got <= size - payload + 512 * (len(c.tensors) + 2)
    assert got < size // 2


# ---------------------------------------------------------------- writes

WRITES = [
    ("tie", "pf_llama_tied_sharded", {}),
    ("untie", "pf_llama_tied_sharded", {}),
    ("resize", "pf_llama_untied_sharded", {"vocab_size": 192, "seed": 0}),
    ("tie", "pnlp_llama_tied", {"keep": "embedding"}),
    ("resize", "pnlp_llama_untied", {"vocab_size": 192, "seed": 0}),
]


@pytest.mark.parametrize(("op", "case", "kw"), WRITES, ids=[f"{w[0]}-{w[1]}" for w in WRITES])
@pytest.mark.parametrize("where", ["s3-s3", "s3-local", "local-s3"])
def test_write_remote_equals_local(s3, tmp_path, op, case, kw, where):
    from tietool.surgery import ops as operations

    srv, fs = s3
    fn = getattr(operations, op)
    local = tmp_path / "local"
    fn(CASES_DIR / case, out=local, **kw)
    src = str(CASES_DIR / case) if where.startswith("local") else f"s3://{BUCKET}/in/{case}"
    key = f"{BUCKET}/out/{op}-{case}-{where}-{tmp_path.name}"
    dst = f"s3://{key}" if where.endswith("s3") else str(tmp_path / "remote")
    rep = fn(src, out=dst, **kw)
    assert rep["transferred"]["requests"] > 0
    got = tmp_path / "got"
    if where.endswith("s3"):
        fs.get(key, str(got), recursive=True)
    else:
        got = Path(dst)
    a, b = _tree(local), _tree(got)
    assert sorted(a) == sorted(b)
    assert [k for k in a if a[k] != b[k] and k != "tietool-report.json"] == []
    assert _same_report(a["tietool-report.json"], b["tietool-report.json"])


def test_tie_sharded_moves_no_untouched_shard(s3, tmp_path):
    """tie s3 → s3 of a sharded checkpoint: untouched shards are copied by the server (no body in either
    direction); the client downloads only headers, the compared tensors and the rewritten shards' kept
    tensors, and uploads only the rewritten files, the configs, the report and the index."""
    from tietool.surgery import ops as operations

    srv, fs = s3
    case = "pf_llama_tied_sharded"
    srv.app.reset()
    rep = operations.tie(f"s3://{BUCKET}/in/{case}", out=f"s3://{BUCKET}/out/tie-sharded")
    copied = rep["files"]["copied"]
    assert len(copied) >= 7  # 9 shards: the head's shard goes, the rest are untouched
    from tietool.surgery.io.checkpoint import Checkpoint

    c = Checkpoint.open(CASES_DIR / case)
    compared = {c.tensors[n].file: c.tensors[n].nbytes for n in (rep["embedding"], "lm_head.weight")}
    rename = {v: k for k, v in rep["files"]["renamed"].items()}
    for out_name in copied:
        if not out_name.endswith(".safetensors"):
            continue
        src = rename.get(out_name, out_name)
        got = _object_bytes(srv, f"/in/{case}/{src}").get(f"/{BUCKET}/in/{case}/{src}", 0)
        # its header, and the embedding's bytes where it is (tie compares the head with it)
        assert got == _header_bytes(CASES_DIR / case / src) + compared.get(src, 0), src
    uploads = {p: r for m, p, _g, r, _s in srv.app.counts.log if m == "PUT" and r}
    assert not any(p.endswith(tuple(copied)) for p in uploads)  # copied shards: no upload body
    server_sent = sum(s for m, p, _g, _r, s in srv.app.counts.log if m == "GET" and p.count("/") >= 2)
    assert rep["transferred"]["received"] == server_sent  # tietool's count = the server's
    assert rep["transferred"]["sent"] == sum(uploads.values())
    assert rep["transferred"]["copied_server_side"] >= sum(
        (CASES_DIR / case / rename.get(n, n)).stat().st_size for n in copied if n.endswith(".safetensors")
    )
    assert fs.exists(f"{BUCKET}/out/tie-sharded/model.safetensors.index.json")


def test_in_place_on_a_url_is_refused(s3):
    env = {**os.environ}
    r = subprocess.run(
        [sys.executable, "-m", "tietool", "tie", f"s3://{BUCKET}/in/pf_llama_tied_sharded"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO.parent,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no atomic swap" in lines[0] and "--out" in lines[0], r.stderr


def test_failed_upload_leaves_no_index_and_one_line(s3):
    """The server fails the upload of a shard mid-run (500 InternalError): one line naming the object, exit
    75 (the store failed: run again), and no index (nor any object) under the output prefix."""
    srv, fs = s3
    prefix = f"{BUCKET}/out/fault"
    srv.app.fail = lambda method, path: method == "PUT" and "/out/fault/" in path and "00003" in path
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tietool",
                "tie",
                f"s3://{BUCKET}/in/pf_llama_tied_sharded",
                "--out",
                f"s3://{prefix}",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            env={**os.environ},
            cwd=REPO.parent,
        )
    finally:
        srv.app.fail = None
    assert r.returncode == 75, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"s3://{prefix}/model-00003-of-00008.safetensors" in lines[0], lines[0]
    assert "the network or the store failed" in lines[0] and "run the command again" in lines[0], lines[0]
    fs.invalidate_cache()
    assert not fs.exists(f"{prefix}/model.safetensors.index.json")
    assert fs.find(prefix) == []


def test_cli_inspect_json_reports_bytes(s3):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tietool",
            "inspect",
            f"s3://{BUCKET}/in/pf_llama_untied_sharded",
            "--json",
            "--no-values",
        ],
        capture_output=True,
        text=True,
        env={**os.environ},
        cwd=REPO.parent,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["path"] == f"s3://{BUCKET}/in/pf_llama_untied_sharded"
    assert 0 < doc["transferred"]["received"] < 20_000
    assert doc["transferred"]["sent"] == 0


def test_failed_read_mid_run_names_the_object(s3):
    """The server fails the reads of the embedding's shard after its header was read (the values tie
    compares, 500 InternalError): one line naming the object, exit 75 (run again), nothing under the output
    prefix."""
    srv, fs = s3
    case, prefix = "pf_llama_tied_sharded", f"{BUCKET}/out/read-fault"
    shard = "model-00008-of-00009.safetensors"  # holds model.embed_tokens.weight
    seen = {"n": 0}

    def fail(method: str, path: str) -> bool:
        if method == "GET" and path.endswith(f"/in/{case}/{shard}"):
            seen["n"] += 1
            return seen["n"] > 2  # the 8-byte length and the header pass; the tensor's bytes fail
        return False

    srv.app.fail = fail
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tietool",
                "tie",
                f"s3://{BUCKET}/in/{case}",
                "--out",
                f"s3://{prefix}",
                "-q",
            ],
            capture_output=True,
            text=True,
            env={**os.environ},
            cwd=REPO.parent,
        )
    finally:
        srv.app.fail = None
    assert r.returncode == 75, r.stderr  # a 500 InternalError: the store failed, not the checkpoint
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"s3://{BUCKET}/in/{case}/{shard}" in lines[0], r.stderr
    assert "the network or the store failed" in lines[0], lines[0]
    fs.invalidate_cache()
    assert fs.find(prefix) == []


def test_verify_and_dry_run_on_urls(s3, tmp_path):
    """verify reads two URLs as it reads two folders (the same verdict and findings as the local pair); a
    dry run against a URL output writes no object."""
    from tietool.surgery import ops as operations

    _srv, fs = s3
    case = "pf_llama_tied_sharded"
    operations.untie(f"s3://{BUCKET}/in/{case}", out=f"s3://{BUCKET}/out/verify-untied")
    operations.untie(CASES_DIR / case, out=tmp_path / "untied")
    res = operations.verify(f"s3://{BUCKET}/in/{case}", f"s3://{BUCKET}/out/verify-untied").as_dict()
    local = operations.verify(CASES_DIR / case, tmp_path / "untied").as_dict()
    assert res == local
    assert res["config_differences"] == [
        {"file": "config.json", "key": "tie_word_embeddings", "before": True, "after": False}
    ]
    rep = operations.tie(f"s3://{BUCKET}/in/{case}", out=f"s3://{BUCKET}/out/dry", dry_run=True)
    assert rep["dry_run"] is True
    fs.invalidate_cache()
    assert fs.find(f"{BUCKET}/out/dry") == []


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "s3://ckpts/in/pf_llama_tied_sharded", "--to", "paddlenlp", "--out", "{tmp}/o"],
        ["convert", "{case}", "--to", "safetensors", "--out", "s3://ckpts/out/conv"],
        ["merge", "s3://ckpts/in/ranks", "--out", "{tmp}/o"],
        ["merge", "{case}", "--out", "s3://ckpts/out/merged"],
    ],
)
def test_convert_and_merge_refuse_urls_in_one_line(tmp_path, argv):
    """convert and merge work on local folders only: a URL on either side is refused before anything is
    read (no server needed), naming the URL and the local route; nothing is written."""
    case = str(CASES_DIR / "pf_llama_tied_sharded")
    args = [a.format(tmp=tmp_path, case=case) for a in argv]
    r = subprocess.run(
        [sys.executable, "-m", "tietool", *args], capture_output=True, text=True, cwd=REPO.parent
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    url = next(a for a in args if a.startswith("s3://"))
    verb = "takes" if args.index(url) == 1 else "writes"
    head = f"tietool: error: {url}: {argv[0]} {verb} local folders only, not a URL"
    assert len(lines) == 1 and lines[0].startswith(head), lines
    assert ("local folder first" if verb == "takes" else "then upload it") in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_api_convert_refuses_url():
    import tietool
    from tietool.surgery.model.errors import UsageError

    with pytest.raises(UsageError, match="hf://org/model: convert writes local folders only"):
        tietool.convert(CASES_DIR / "pf_llama_tied_sharded", "safetensors", "hf://org/model")


# ---------------------------------------------------------------- found by a new-user run (breaker)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tietool", *args, "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ},
        cwd=REPO.parent,
    )


def test_failed_clean_up_names_what_is_left(s3):
    """The upload of config.json fails and so does every DELETE: the one line says objects were left and
    that the prefix must be cleared before running again (which is then refused as not empty)."""
    srv, fs = s3
    prefix = f"{BUCKET}/out/left"
    srv.app.fail = lambda method, path: (
        "/out/left/" in path and (method == "DELETE" or (method == "PUT" and path.endswith("config.json")))
    )
    try:
        r = _cli("tie", f"s3://{BUCKET}/in/pf_llama_tied_sharded", "--out", f"s3://{prefix}")
    finally:
        srv.app.fail = None
    assert r.returncode == 6, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "could not be deleted" in lines[0] and f"delete every object under s3://{prefix}" in lines[0], (
        lines[0]
    )
    fs.invalidate_cache()
    assert fs.find(prefix) != [] and not fs.exists(f"{prefix}/model.safetensors.index.json")
    again = _cli("tie", f"s3://{BUCKET}/in/pf_llama_tied_sharded", "--out", f"s3://{prefix}")
    assert again.returncode == 2 and "not empty" in again.stderr
    fs.rm(prefix, recursive=True)


def test_output_prefix_with_only_a_folder_marker_is_empty(s3, tmp_path):
    srv, fs = s3
    fs.pipe(f"{BUCKET}/out/marker/", b"")  # what "Create folder" in a console makes
    r = _cli("tie", f"s3://{BUCKET}/in/pf_llama_tied_sharded", "--out", f"s3://{BUCKET}/out/marker")
    assert r.returncode == 0, r.stderr
    fs.invalidate_cache()
    assert fs.exists(f"{BUCKET}/out/marker/model.safetensors.index.json")
    fs.rm(f"{BUCKET}/out/marker", recursive=True)


def test_output_that_is_an_object_is_named_a_file(s3):
    srv, fs = s3
    fs.pipe(f"{BUCKET}/out/an_object", b"x")
    r = _cli("tie", f"s3://{BUCKET}/in/pf_llama_tied_sharded", "--out", f"s3://{BUCKET}/out/an_object")
    assert r.returncode == 2 and "is an existing object (a file), not a folder" in r.stderr, r.stderr
    assert fs.cat(f"{BUCKET}/out/an_object") == b"x"
    fs.rm(f"{BUCKET}/out/an_object")


def test_api_sees_objects_written_since_its_last_call(s3):
    """fsspec caches listings per file system for the life of the process; each operation lists afresh, so
    a Python session does not write into a prefix another client filled after it looked."""
    import fsspec

    import tietool
    from tietool.surgery.model.errors import CheckpointError, UsageError

    srv, fs = s3
    with pytest.raises(CheckpointError, match="no such folder"):
        tietool.inspect(f"s3://{BUCKET}/out/race")
    other = fsspec.filesystem("s3", skip_instance_cache=True)
    other.pipe(f"{BUCKET}/out/race/precious.bin", b"x")
    with pytest.raises(UsageError, match="not empty"):
        tietool.tie(f"s3://{BUCKET}/in/pf_llama_tied_sharded", out=f"s3://{BUCKET}/out/race")
    assert sorted(fs.ls(f"{BUCKET}/out/race")) == [f"{BUCKET}/out/race/precious.bin"]
    fs.rm(f"{BUCKET}/out/race", recursive=True)


def test_dry_run_on_a_url_needs_no_out_and_reports_bytes(s3):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tietool",
            "tie",
            f"s3://{BUCKET}/in/pf_llama_tied_sharded",
            "--dry-run",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO.parent,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dry_run"] is True and doc["transferred"]["sent"] == 0 and doc["transferred"]["received"] > 0


def test_verify_logits_on_a_url_says_why_not(s3):
    from tietool.surgery.verify import logits_check

    res = logits_check(f"s3://{BUCKET}/in/pnlp_llama_tied", str(CASES_DIR / "pnlp_llama_tied"))
    assert res["ok"] is None and "is in object storage" in res["error"] and "download" in res["error"]


@pytest.mark.parametrize(
    "url, words",
    [
        ("s3://", "names no bucket"),
        ("s3:///", "names no bucket"),
        ("gs://b/x", "gs://"),
        ("hf://", "e.g. hf://org/model"),
        ("s3://", "e.g. s3://bucket/prefix"),
    ],
)
def test_bad_urls_one_line(url, words):
    r = subprocess.run(
        [sys.executable, "-m", "tietool", "inspect", url], capture_output=True, text=True, cwd=REPO.parent
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr


def test_file_url_is_a_local_folder():
    import tietool

    a = tietool.inspect(f"file://{CASES_DIR / 'pnlp_llama_tied'}", compare_values=False)
    b = tietool.inspect(CASES_DIR / "pnlp_llama_tied", compare_values=False)
    assert _inspect_doc(a) == _inspect_doc(b)
