"""Independent helpers for ``test_fixtures.py``: read checkpoints, run the CLI, run the logits oracle.

Nothing here imports ``tietool``: the tests judge the tool with their own small readers.

* safetensors: 8-byte little-endian header length, a JSON header ``{name: {dtype, shape, data_offsets}}``
  (offsets relative to the end of the header), then the raw data.
* ``.pdparams``: a pickle of ``{name: numpy.ndarray, "StructuredToParameterName@@": {...}}`` as
  ``paddle.save`` writes it. It is read with an unpickler that only resolves the numpy globals needed to
  rebuild arrays and raises on anything else.
* :func:`run_pf_logits` / :class:`LiveLogits`: PaddleFormers 1.2 logits of a folder
  (``tests/data/tools/pf_logits.py``), in a subprocess of its own / in long-lived processes
  (:mod:`support.pf_worker`).

The fixtures live in ``tests/data/fixtures`` (:mod:`support.paths`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from support import cli_runner, pf_worker, preload
from support.paths import (  # noqa: F401  (re-exported: the tests use fs.CASES_DIR etc.)
    CASES_DIR,
    EXPECTED_DIR,
    INPUT_IDS,
    ORACLES_DIR,
    PF_LOGITS,
    PF_LOGITS_KW,
    REPO,
)

REPORT_NAME = "tietool-report.json"
WEIGHT_SUFFIXES = (".safetensors", ".pdparams")
TRACEBACK = "Traceback (most recent call last)"

# numpy dtype used to view raw bytes of each stored dtype label (bf16 is viewed as uint16: bytes, not values).
_VIEW_DTYPE = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "U16": "<u2",
    "U32": "<u4",
    "U64": "<u8",
    "BOOL": "?",
    "float64": "<f8",
    "float32": "<f4",
    "float16": "<f2",
    "uint16": "<u2",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "i1",
    "uint8": "u1",
    "bool": "?",
}


# --------------------------------------------------------------------------------------------------- reading
@dataclasses.dataclass(frozen=True)
class RawTensor:
    """One stored tensor: the file's own dtype label, its shape and its raw bytes (C order)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes
    file: str

    def array(self) -> np.ndarray:
        """A numpy view of the raw bytes (bf16/uint16 as uint16, so transposes keep the bytes)."""
        return np.frombuffer(self.data, dtype=_VIEW_DTYPE[self.dtype]).reshape(self.shape)

    def decoded(self) -> np.ndarray:
        """Values as float32/float64 (bf16 and uint16-stored bf16 decoded by bit shift, never by casting)."""
        if self.dtype in ("BF16", "uint16", "U16"):
            return (self.array().astype(np.uint32) << 16).view(np.float32)
        return self.array()

    def transposed_bytes(self) -> bytes:
        assert len(self.shape) == 2, self.shape
        return np.ascontiguousarray(self.array().T).tobytes()


def read_safetensors(path: Path) -> dict[str, RawTensor]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = RawTensor(info["dtype"], tuple(info["shape"]), raw[base + start : base + end], path.name)
    return out


def safetensors_metadata(path: Path) -> dict | None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]).get("__metadata__")


_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
    ("collections", "OrderedDict"),
}


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not on the allow-list")
        return super().find_class(module, name)


def read_pdparams_raw(path: Path) -> dict:
    with open(path, "rb") as f:
        return _AllowListUnpickler(f).load()


def read_pdparams(path: Path) -> dict[str, RawTensor]:
    obj = read_pdparams_raw(path)
    assert isinstance(obj, dict), f"{path}: top level is {type(obj).__name__}, not a dict"
    out = {}
    for name, v in obj.items():
        if isinstance(v, np.ndarray):
            out[name] = RawTensor(v.dtype.name, tuple(v.shape), np.ascontiguousarray(v).tobytes(), path.name)
    return out


def weight_files(ckpt: Path) -> list[Path]:
    return sorted(p for p in ckpt.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def read_checkpoint(ckpt: Path) -> dict[str, RawTensor]:
    """Every tensor of every weight file in the folder. A name stored in two files is an error."""
    out: dict[str, RawTensor] = {}
    for f in weight_files(ckpt):
        part = read_safetensors(f) if f.suffix == ".safetensors" else read_pdparams(f)
        for name, t in part.items():
            assert name not in out, f"{name} is stored in both {out[name].file} and {f.name}"
            out[name] = t
    return out


def index_file(ckpt: Path) -> Path | None:
    found = sorted(ckpt.glob("*.index.json"))
    assert len(found) <= 1, f"more than one index file in {ckpt}: {[p.name for p in found]}"
    return found[0] if found else None


def index_problems(ckpt: Path) -> list[str]:
    """Disagreements between the index (if any) and the weight files. Empty list = consistent."""
    idx = index_file(ckpt)
    if idx is None:
        return []
    data = json.loads(idx.read_text())
    wmap = data.get("weight_map", {})
    problems = []
    per_file = {
        f.name: (read_safetensors(f) if f.suffix == ".safetensors" else read_pdparams(f))
        for f in weight_files(ckpt)
    }
    for name, fname in wmap.items():
        if fname not in per_file:
            problems.append(f"index names {name} -> {fname}, which does not exist")
        elif name not in per_file[fname]:
            problems.append(f"index names {name} -> {fname}, but that file has no such tensor")
    for fname, tensors in per_file.items():
        for name in tensors:
            if wmap.get(name) != fname:
                problems.append(f"{fname} holds {name} but the index maps it to {wmap.get(name)}")
    total = data.get("metadata", {}).get("total_size")
    actual = sum(len(t.data) for ts in per_file.values() for t in ts.values())
    if total is not None and total != actual:
        problems.append(f"index metadata.total_size={total} but the weight files hold {actual} bytes")
    return problems


def config_of(ckpt: Path) -> dict:
    p = ckpt / "config.json"
    return json.loads(p.read_text()) if p.exists() else {}


# --------------------------------------------------------------------------------------------------- files
def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file below root, by relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def copy_checkpoint(src: Path, dst: Path) -> Path:
    """Copy a checkpoint folder; the copy is writable (the fixtures are read-only) so that a tool that writes
    into its input is caught by the hash check instead of failing with EACCES."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for d in [dst, *[p for p in dst.rglob("*") if p.is_dir()]]:
        d.chmod(0o755)
    return dst


# --------------------------------------------------------------------------------------------------- tool
@dataclasses.dataclass
class ToolRun:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    inp: Path
    out: Path | None
    hashes_before: dict[str, str]
    hashes_after: dict[str, str]
    seconds: float

    @property
    def message(self) -> str:
        return self.stdout + self.stderr

    def describe(self) -> str:
        tail = self.message.strip()[-2000:]
        return f"`tietool {' '.join(self.argv)}` -> exit {self.rc}\n--- output (tail) ---\n{tail}"

    def report(self) -> dict:
        assert self.out is not None
        p = self.out / REPORT_NAME
        assert p.is_file(), f"{REPORT_NAME} missing from {self.out}\n{self.describe()}"
        return json.loads(p.read_text())

    def out_empty(self) -> bool:
        return self.out is None or not self.out.exists() or not any(self.out.iterdir())


def run_tool(argv: list, timeout: float = 300) -> cli_runner.CliRun:
    """``tietool ARGV`` (:func:`support.cli_runner.run_cli`: in process, as a ``python -m tietool`` child
    with cwd = the repository would run it); ``returncode`` / ``stdout`` / ``stderr`` as a subprocess's."""
    return cli_runner.run_cli(argv, timeout=timeout)


def run_on_copy(src: Path, work: Path, command: str, extra: list[str], with_out: bool = True) -> ToolRun:
    """Copy src to work/in, run `tietool COMMAND work/in [--out work/out] EXTRA`, hash the input around it."""
    work.mkdir(parents=True, exist_ok=False)
    inp = copy_checkpoint(src, work / "in")
    out = work / "out" if with_out else None
    argv = [command, str(inp), *(["--out", str(out)] if out else []), *extra]
    before = tree_hashes(inp)
    t0 = time.monotonic()
    cp = run_tool(argv)
    seconds = time.monotonic() - t0
    return ToolRun(argv, cp.returncode, cp.stdout, cp.stderr, inp, out, before, tree_hashes(inp), seconds)


def find_saved_bytes(report: dict) -> list[tuple[str, Any]]:
    """Places in a report that state the bytes saved: keys bytes_saved / saved_bytes anywhere, or `bytes`
    under a key named savings/saved."""
    hits: list[tuple[str, Any]] = []

    def walk(node: Any, path: str, parent: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                p = f"{path}.{k}" if path else k
                if k in ("bytes_saved", "saved_bytes") or (k == "bytes" and parent in ("savings", "saved")):
                    if not isinstance(v, (dict, list)):
                        hits.append((p, v))
                walk(v, p, k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]", parent)

    walk(report, "", "")
    return hits


# --------------------------------------------------------------------------------------------------- oracle
def run_pf_logits(
    ckpt: Path, model_class: str, out_npy: Path, kwargs: dict | None = None, timeout: float = 900
) -> dict:
    """PaddleFormers 1.2 logits of ``ckpt`` on :data:`INPUT_IDS`, written to ``out_npy``.

    Runs ``tests/data/tools/pf_logits.py`` in a subprocess (through ``pf_logits_kw.py`` when
    ``from_pretrained`` needs keyword arguments). Returns its JSON line plus ``rc`` and the tail of stderr.
    """
    if kwargs:
        cmd = [sys.executable, str(PF_LOGITS_KW), json.dumps(kwargs), str(ckpt)]
    else:
        cmd = [sys.executable, str(PF_LOGITS), str(ckpt)]
    cmd += [model_class, str(INPUT_IDS), str(out_npy)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    cp = preload.run(
        cmd,
        libs=preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1]) if lines else {"ok": False, "error": "no JSON line", "warnings": []}
    res["rc"] = cp.returncode
    res["stderr_tail"] = cp.stderr[-1500:]
    return res


class LiveLogits:
    """PaddleFormers logits computed in this run, two loads at a time.

    The stored ``oracles/*.npy`` logits are bit-exact only on the CPU that wrote them, so a fidelity test
    compares the logits of a tool's output with the logits of its input computed here, the same way: a fresh
    copy of the folder in a temporary folder, ``pf_logits.py`` with the same keyword arguments, in one of two
    long-lived processes (:class:`support.pf_worker.LogitsPool`: paddle imported once per process, not once
    per load; a process that saw a failed load is replaced, and a load that failed after others is run
    again in a fresh one, as a failed load can break later loads in-process).

    * :meth:`reference` -- logits of an input (a fixture, an oracle folder), computed once per session per
      (folder, keyword arguments) and shared by every test that compares with it;
    * :meth:`submit` -- logits of any folder (a tool's output), not cached.

    Both return a future of :func:`run_pf_logits`'s dict, with ``logits`` (the array, or None when the
    load failed) and ``folder`` (the folder it was computed for) added.
    """

    def __init__(self, root: Path, workers: int = 2):
        self.root = root
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pf-logits")
        self._workers = pf_worker.LogitsPool(root)
        self._lock = threading.Lock()
        self._count = 0
        self._references: dict[tuple[str, str], Future] = {}

    def _job(self, src: Path, model_class: str, kwargs: dict, ids: Path | None = None) -> dict:
        with self._lock:
            self._count += 1
            work = self.root / f"{self._count:03d}-{src.name}"
        work.mkdir(parents=True)
        ckpt = copy_checkpoint(src, work / "ckpt")
        res = self._workers.load(ckpt, model_class, kwargs, work / "logits.npy", ids)
        res["folder"] = str(src)
        res["logits"] = np.load(work / "logits.npy") if res.get("ok") else None
        return res

    def submit(
        self, ckpt: Path, model_class: str, kwargs: dict | None = None, ids: Path | None = None
    ) -> Future:
        """The logits of ``ckpt`` (on ``ids``, default :data:`INPUT_IDS`), not cached."""
        return self._pool.submit(self._job, Path(ckpt), model_class, dict(kwargs or {}), ids)

    def reference(self, src: Path, model_class: str, kwargs: dict | None = None) -> Future:
        key = (str(Path(src).resolve()), json.dumps(kwargs or {}, sort_keys=True))
        with self._lock:
            if key not in self._references:
                self._references[key] = self._pool.submit(
                    self._job, Path(src), model_class, dict(kwargs or {})
                )
            return self._references[key]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._workers.close()


def logits_mismatch(got: np.ndarray, want: np.ndarray, atol: float | None = None) -> str | None:
    """None when ``got`` equals ``want`` bit for bit (``atol=None``) or within ``atol`` everywhere; else what
    differs (shape, or how many values, where, and the largest difference)."""
    if got.shape != want.shape:
        return f"shapes differ: {list(got.shape)} vs {list(want.shape)}"
    if atol is None and np.array_equal(got, want):
        return None
    delta = np.abs(got.astype(np.float64) - want.astype(np.float64))
    if atol is not None and bool(np.all(delta < atol)):
        return None
    bad = ~(delta < atol) if atol is not None else (got != want)
    first = [int(i) for i in np.argwhere(bad)[0]]
    how = "bit for bit" if atol is None else f"within {atol:g}"
    return (
        f"{int(bad.sum())} of {got.size} values differ ({how}), first at {first}: "
        f"{got[tuple(first)]!r} vs {want[tuple(first)]!r}; max |delta| {np.nanmax(delta):.3g}"
    )
