"""Helpers for the adversarial tests (bad input, unsafe pickles, the corrupt corpus, fuzzing).

Nothing here imports ``tietool``: the inputs are built with our own small writers, and the tool is
judged from the outside (exit code, stderr, the files left behind).

* :func:`run_cli` runs ``tietool ...`` with a timeout and an address-space limit (``RLIMIT_AS``), in a
  worker child (:class:`support.cli_runner.CliWorker`), so a hang or an attempt to allocate a declared huge
  size fails loudly instead of passing.
* :func:`tree_state` fingerprints a folder (sha256 of every file, and every sub-folder) so a test can prove
  the input was not touched.
* :func:`assert_refused` is the contract every bad input must satisfy: a non-zero exit with the expected
  code, one line on stderr starting ``tietool: error:`` that names the file and says how to fix it, no
  traceback, no ``--out`` and no ``.<name>.tietool-tmp-*`` folder left behind, the input byte-identical.
"""

from __future__ import annotations

import copyreg
import hashlib
import json
import os
import pickle
import re
import shutil
import struct
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from support import cli_runner
from support import fixture_support as fs

REPO = fs.REPO
CASES = fs.CASES_DIR
PYTHON = sys.executable
TRACEBACK = "Traceback (most recent call last)"
ERROR_PREFIX = "tietool: error: "
# a refusal is one terminal line: the cause and the fix in at most this many characters besides the path it
# names (the flex and rank-file rules ran to 600 before their words were cut; the longest now is a hostile
# expert id of 64 digits, 400)
MAX_ERROR_CHARS = 450
_LEADING_PATH = re.compile(r"^tietool: error: \S*: ")
MEM_LIMIT = 2 * 1024**3  # RLIMIT_AS of every tool run: declared huge sizes must fail, not be allocated
FSIZE_LIMIT = 1024**3  # RLIMIT_FSIZE: a runaway write is killed (SIGXFSZ) rather than filling the disk
TIMEOUT = 30.0

# the four fixtures the adversarial tests start from (read-only: always copy first)
ST_SHARDED = "pf_llama_tied_sharded"  # 9 safetensors shards + model.safetensors.index.json
ST_ONE = "pf_llama_tied_fp32"  # one safetensors shard (…-00001-of-00001) + index
PD_ONE = "pnlp_llama_untied"  # model_state.pdparams, head [hidden, vocab]
PD_SHARDED = "pnlp_llama_untied_sharded"  # 8 pdparams shards + model_state.pdparams.index.json

ST_ONE_FILE = "model-00001-of-00001.safetensors"
ST_INDEX = "model.safetensors.index.json"
PD_FILE = "model_state.pdparams"
PD_INDEX = "model_state.pdparams.index.json"


# ----------------------------------------------------------------------------------------------- running
Run = cli_runner.CliRun  # argv, rc (None: timed out), stdout, stderr, seconds, maxrss
CliWorker = cli_runner.CliWorker


def cli_env() -> dict[str, str]:
    """The environment of a tool run (:func:`support.cli_runner.tool_env`)."""
    return cli_runner.tool_env()


def run_cli(
    argv: Iterable[Any], timeout: float = TIMEOUT, cwd: Path | None = None, subprocess: bool = False
) -> Run:
    """``tietool *argv`` with cwd = the repository (or ``cwd``), RLIMIT_AS 2 GB, RLIMIT_FSIZE 1 GB and a
    timeout: a hang or an attempt to allocate a declared huge size fails loudly instead of passing.

    The run goes to the session's :class:`support.cli_runner.CliWorker` started under those limits (the
    CLI's ``main`` in process there, the state a run changes put back after it): a fraction of the cost of
    a fresh interpreter. ``subprocess=True`` (or ``TIETOOL_TEST_SUBPROCESS=1``) runs ``python -m tietool``
    in a child under the same limits, what a user gets.
    """
    argv = [str(a) for a in argv]
    if subprocess or os.environ.get("TIETOOL_TEST_SUBPROCESS") == "1":
        return cli_runner.spawn(argv, cwd=cwd, timeout=timeout, limits=(MEM_LIMIT, FSIZE_LIMIT))
    return cli_runner.shared_worker(MEM_LIMIT, FSIZE_LIMIT).run(argv, timeout, cwd=cwd)


COMMANDS = ("inspect", "tie", "untie", "resize")


def command_argv(command: str, ckpt: Path, out: Path, extra: Iterable[Any] = ()) -> list[Any]:
    """Arguments for one command; the write commands get ``--out out`` (resize also ``--vocab 256``, a growth
    for every fixture used here, so a refusal is never the trim guard)."""
    if command == "inspect":
        return ["inspect", ckpt, *extra]
    if command == "resize":
        return ["resize", ckpt, "--out", out, "--vocab", "256", "--quiet", *extra]
    return [command, ckpt, "--out", out, "--quiet", *extra]


# ----------------------------------------------------------------------------------------------- files
def copy_case(name: str, dst: Path) -> Path:
    """A writable copy of fixture ``name`` at ``dst``."""
    return fs.copy_checkpoint(CASES / name, dst)


def tree_state(root: Path) -> dict[str, str]:
    """Fingerprint of ``root``: sha256 of every file, ``<dir>`` for every folder, ``<absent>`` if missing."""
    if not root.exists() and not root.is_symlink():
        return {".": "<absent>"}
    if root.is_file():
        return {".": hashlib.sha256(root.read_bytes()).hexdigest()}
    out = {".": "<dir>"}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = "<dir>" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def leftovers(out: Path) -> list[str]:
    """Temporary folders a write to ``out`` may leave beside it."""
    if not out.parent.is_dir():
        return []
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tietool-tmp-"))


# ----------------------------------------------------------------------------------------------- the contract
def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


def check_refused(
    run: Run,
    codes: int | Iterable[int],
    names: Iterable[str] = (),
    *,
    inp: Path | None = None,
    before: dict | None = None,
    out: Path | None = None,
    out_before: dict | None = None,
) -> list[str]:
    """Everything wrong with ``run`` as a refusal of a bad input (empty list: it behaved)."""
    codes = {codes} if isinstance(codes, int) else set(codes)
    bad = []
    if run.rc is None:
        bad.append(f"hung: no exit within {TIMEOUT:.0f}s")
    elif run.rc == 0:
        bad.append("exit 0: the bad input was accepted")
    elif run.rc not in codes:
        bad.append(f"exit {run.rc}, expected {' or '.join(map(str, sorted(codes)))}")
    if TRACEBACK in run.stderr or TRACEBACK in run.stdout:
        bad.append("a Python traceback was printed")
    lines = error_lines(run.stderr)
    if len(lines) != 1:
        bad.append(f"stderr has {len(lines)} non-empty lines, expected exactly one")
    if not lines or not lines[0].startswith(ERROR_PREFIX):
        bad.append(f"stderr does not start with {ERROR_PREFIX!r}")
    msg = run.stderr
    for n in names:
        if str(n) not in msg:
            bad.append(f"the message does not name {n}")
    if lines and lines[0].startswith(ERROR_PREFIX) and " — " not in lines[0]:
        bad.append("the message says no fix (no ' — <what to do>' part)")
    n = len(_LEADING_PATH.sub("", lines[0])) if lines else 0
    if n > MAX_ERROR_CHARS:
        bad.append(f"the line is {n} characters besides the path (> {MAX_ERROR_CHARS})")
    if inp is not None and before is not None and tree_state(inp) != before:
        bad.append(f"the input {inp} changed")
    if out is not None:
        if out_before is None:
            if out.exists():
                bad.append(f"--out {out} exists afterwards")
        elif tree_state(out) != out_before:
            bad.append(f"the pre-existing --out {out} changed")
        if leftovers(out):
            bad.append(f"temporary folders left beside --out: {leftovers(out)}")
    return bad


def assert_refused(run: Run, codes: int | Iterable[int], names: Iterable[str] = (), **kw) -> None:
    bad = check_refused(run, codes, names, **kw)
    assert not bad, "; ".join(bad) + "\n" + run.describe()


def check_no_crash(run: Run) -> list[str]:
    """The corpus contract: no hang, no traceback, and exit 0 or one ``tietool: error:`` line."""
    bad = []
    if run.rc is None:
        return [f"hung: no exit within {TIMEOUT:.0f}s"]
    if TRACEBACK in run.stderr or TRACEBACK in run.stdout:
        bad.append("a Python traceback was printed")
    if run.rc < 0:
        bad.append(f"killed by signal {-run.rc}")
    if run.rc != 0:
        lines = error_lines(run.stderr)
        if len(lines) != 1 or not lines[0].startswith(ERROR_PREFIX):
            bad.append(f"exit {run.rc} without exactly one {ERROR_PREFIX.strip()!r} line on stderr")
        if run.rc == 70:
            bad.append("exit 70 (internal error)")
    return bad


# ----------------------------------------------------------------------------------------------- safetensors
def st_parse(raw: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def st_header_len(raw: bytes) -> int:
    return struct.unpack("<Q", raw[:8])[0]


def st_build(header: dict, data: bytes, pad: bool = True) -> bytes:
    blob = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + data


def st_edit_header(path: Path, fn: Callable[[dict], dict | None]) -> None:
    """Edit the JSON header of a safetensors file in place; the data bytes stay as they are."""
    header, data = st_parse(path.read_bytes())
    new = fn(header)
    path.write_bytes(st_build(header if new is None else new, data))


def st_tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    header, data = st_parse(path.read_bytes())
    header.pop("__metadata__", None)
    out = {}
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], list(v["shape"]), data[b:e])
    return out


def st_write_tensors(
    path: Path, tensors: dict[str, tuple[str, list[int], bytes]], meta: dict | None = None
) -> None:
    header: dict = {"__metadata__": meta} if meta else {}
    data = b""
    for k, (dt, shape, by) in tensors.items():
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(by)]}
        data += by
    path.write_bytes(st_build(header, data))


# ----------------------------------------------------------------------------------------------- pdparams
class FakeArray:
    """Pickles exactly as ``numpy.ndarray`` does (``_reconstruct`` + BUILD state), with any shape, dtype and
    payload, consistent or not."""

    def __init__(
        self, shape, dtype, data: bytes, fortran: bool = False, module: str = "numpy.core.multiarray"
    ):
        self.shape, self.dtype, self.data, self.fortran = tuple(shape), dtype, data, fortran

    def __reduce__(self):
        return (
            np.core.multiarray._reconstruct,
            (np.ndarray, (0,), b"b"),
            (1, self.shape, self.dtype, self.fortran, self.data),
        )


class Call:
    """``fn(*args)`` when unpickled: ``fn`` may itself be a :class:`Call` (a getattr chain)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __call__(self, *a, **k):  # pickle insists a reduce callable is callable
        raise RuntimeError("never called")

    def __reduce__(self):
        return (self.fn, self.args)


class New:
    """``cls.__new__(cls, *args)`` when unpickled: pickled with the NEWOBJ opcode (protocol ≥ 2)."""

    def __init__(self, cls, *args):
        self.cls, self.args = cls, args

    def __reduce__(self):
        return (copyreg.__newobj__, (self.cls, *self.args))


def pd_state(case: str = PD_ONE, file: str = PD_FILE) -> dict:
    """The state dict of a fixture's ``.pdparams`` (read with the allow-list unpickler of fixture_support)."""
    return fs.read_pdparams_raw(CASES / case / file)


def pd_dump(obj: Any, path: Path, protocol: int = 4) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=protocol))


def pd_first_payload(raw: bytes) -> tuple[int, int, int]:
    """(opcode offset, opcode, payload length) of the first BINBYTES/BINBYTES8 in a pickle."""
    import pickletools

    for op, arg, pos in pickletools.genops(raw):
        if op.name in ("BINBYTES", "BINBYTES8"):
            return pos, raw[pos], len(arg)
    raise AssertionError("no BINBYTES in the pickle")


def opcode_positions(raw: bytes) -> list[tuple[int, str]]:
    import pickletools

    return [(pos, op.name) for op, _arg, pos in pickletools.genops(raw)]


def rmtree(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True)
