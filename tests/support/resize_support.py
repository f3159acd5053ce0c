"""Independent helpers for ``test_resize.py``: fixture metadata, running the CLI, reading outputs.

Nothing here imports ``tietool``. Checkpoints are read with :mod:`casecheck` (its own
safetensors header parser and allow-list pdparams unpickler); fixture facts come from
``fixtures/expected/<case>.json`` (written by the libraries' own save, not by tietool).

* :class:`Fixture` -- one ``fixtures/cases/<name>``: which stored tensors carry the vocabulary, on which
  axis, whether the head is tied, the oracles of ``resize_token_embeddings``.
* :func:`run_cli` / :func:`run_resize` -- ``tietool ...`` on a writable copy (in process:
  :mod:`support.cli_runner`).
* :func:`vocab_major` / :func:`decoded_rows` -- a tensor with its vocabulary axis first (raw bytes or
  float values), so ``[vocab, hidden]`` rows, ``[hidden, vocab]`` columns and ``[V]`` / ``[1, V]``
  biases compare the same way.
* :func:`patch_safetensors` -- overwrite one tensor's bytes in place (same dtype and shape) to build
  a variant of a real fixture (rank-deficient embedding...).
* :func:`f32_to_bf16_rne` -- float32 -> bfloat16 bits, round to nearest even (the reference rounding).

The PaddleFormers logits (``tests/data/tools/pf_logits.py``) are run by
:class:`support.fixture_support.LiveLogits`; :func:`widened_copy` builds a same-width reference for them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from support import casecheck  # independent reader; no tietool imports
from support.cli_runner import CliRun
from support.fixture_support import copy_checkpoint, read_pdparams_raw, run_tool
from support.paths import BUG_CASES_DIR, CASES_DIR, EXPECTED_DIR, ORACLES_DIR, REPO  # noqa: F401

REPORT_NAME = "tietool-report.json"
WEIGHT_SUFFIXES = (".safetensors", ".pdparams")
LAYOUTS = {"[vocab, hidden]": "vocab-hidden", "[hidden, vocab]": "hidden-vocab"}


# ------------------------------------------------------------------------------------------- fixtures
@dataclasses.dataclass
class Role:
    """One stored tensor that carries the vocabulary: its name, the axis the vocabulary runs along, and
    what it is (``embedding``, ``embedding-copy``, ``head``, ``bias``)."""

    name: str
    axis: int
    kind: str


def _tietool_drops_head(path) -> bool:
    """Whether tietool's table lets a write drop this checkpoint's duplicate head (``Family.may_drop_head``:
    the loader re-ties a missing head and that is proven in ``surgery.arch.PROOFS``)."""
    from tietool.surgery.inspect.detect import detect
    from tietool.surgery.io.checkpoint import Checkpoint

    return detect(Checkpoint.open(path), compare_values=False).family.may_drop_head


class Fixture:
    """What ``expected/<name>.json`` says about a fixture checkpoint, in the terms the resize tests need."""

    def __init__(self, name: str):
        self.name = name
        self.src = CASES_DIR / name
        self.exp = json.loads((EXPECTED_DIR / f"{name}.json").read_text())
        e = self.exp
        ie, oe, cfg = e["input_embedding"], e["output_embedding"], e["config"]
        self.cfg = cfg
        self.stored = e["tensors"]  # name -> {shape, dtype, file, nbytes, sha256}
        self.V = int(cfg["vocab_size"])
        self.H = int(ie["shape"][1])
        self.embedding = ie["name"]
        self.head = oe["name_in_model"]
        self.head_in_files = bool(oe["in_files"]) and self.head != self.embedding
        self.head_layout = LAYOUTS[oe["layout"]]
        heq = e["head_equals_embedding"]
        self.head_equals = "shared" if heq.startswith("same tensor name") else heq
        group = next((set(g) for g in ie["aliases_in_model"] if self.embedding in g), {self.embedding})
        self.embedding_copies = sorted(n for n in group - {self.embedding, self.head} if n in self.stored)
        bias_group: set[str] = set()
        if oe["bias"]:
            groups = oe["bias_aliases_in_model"]
            bias_group = {oe["bias"]} | next((set(g) for g in groups if oe["bias"] in g), set())
        self.bias_names = sorted(n for n in bias_group if n in self.stored)
        # tied = the head the model uses is the embedding table (one Parameter in the live model)
        self.tied = bool(oe["is_same_parameter_as_embedding_in_live_model"])
        # a head stored beside a tied embedding, equal to it, that the library's loader rebuilds from the
        # embedding when the file lacks it (the fixture's own load check, loader.dedup_verdict): resize drops
        # it instead of resizing it, as tie does
        verdict = str(e["loader"].get("dedup_verdict") or "")
        redundant = self.head_in_files and self.tied and self.head_equals in ("exact", "transposed")
        # (only where tietool's table proves the re-tie: Family.may_drop_head; else the head is resized)
        drops = redundant and verdict.startswith("can_drop_head") and _tietool_drops_head(self.src)
        self.dropped_by_resize = {self.head} if drops else set()
        self.model_class = cfg["architectures"][0]
        self.pf = name.startswith("pf_")
        self.load_kwargs = e["loader"]["roundtrip"].get("from_pretrained_kwargs") or {}
        self.init_range = cfg.get("initializer_range")
        self.oracles = {
            int(k[len("resize") :]): v
            for k, v in e.get("oracles", {}).items()
            if k.startswith("resize") and k[len("resize") :].isdigit()
        }

    @property
    def roles(self) -> list[Role]:
        """Every stored tensor that carries the vocabulary, with the axis it runs along."""
        out = [Role(self.embedding, 0, "embedding")]
        out += [Role(n, 0, "embedding-copy") for n in self.embedding_copies]
        if self.head_in_files:
            out.append(Role(self.head, 1 if self.head_layout == "hidden-vocab" else 0, "head"))
        for n in self.bias_names:
            out.append(Role(n, len(self.stored[n]["shape"]) - 1, "bias"))
        return out

    @property
    def kept_roles(self) -> list[Role]:
        """The roles a resize keeps (and resizes): every one but a redundant tied head."""
        return [r for r in self.roles if r.name not in self.dropped_by_resize]

    @property
    def vocab_names(self) -> set[str]:
        return {r.name for r in self.roles}

    def oracle_dir(self, n: int) -> Path:
        return ORACLES_DIR / f"{self.name}_resize{n}"

    def __repr__(self) -> str:
        return self.name


def fixture_names() -> list[str]:
    return sorted(p.name for p in CASES_DIR.iterdir() if p.is_dir()) if CASES_DIR.is_dir() else []


# ------------------------------------------------------------------------------------------- tensors
def vocab_major(t: casecheck.Tensor, axis: int) -> np.ndarray:
    """The raw bytes of ``t`` as a uint8 array with the vocabulary axis first and the element bytes last."""
    return np.moveaxis(t.byte_view(), axis, 0)


def decoded_rows(ck: casecheck.Checkpoint, t: casecheck.Tensor, axis: int = 0) -> np.ndarray:
    """Values (float64; bf16 widened by bit shift) with the vocabulary axis first."""
    return np.moveaxis(ck.decode(t), axis, 0)


def f32_to_bf16_rne(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even (finite inputs)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def read(folder: Path) -> casecheck.Checkpoint:
    ck = casecheck.read_checkpoint(folder)
    assert not ck.problems, f"cannot read {folder}: {ck.problems}"
    return ck


def weight_file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every weight file and index in a folder."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and (p.name.endswith(WEIGHT_SUFFIXES) or p.name.endswith(".index.json"))
    }


def tensor_table(ck: casecheck.Checkpoint) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """name -> (dtype label, shape, sha256 of the bytes): compares two checkpoints tensor for tensor."""
    return {
        n: (t.label, tuple(t.shape), hashlib.sha256(t.raw).hexdigest()) for n, t in sorted(ck.tensors.items())
    }


def table_diff(a: dict, b: dict, label_a: str = "a", label_b: str = "b") -> list[str]:
    out = []
    for n in sorted(a.keys() - b.keys()):
        out.append(f"{n} only in {label_a}")
    for n in sorted(b.keys() - a.keys()):
        out.append(f"{n} only in {label_b}")
    for n in sorted(a.keys() & b.keys()):
        if a[n] != b[n]:
            what = "bytes" if a[n][:2] == b[n][:2] else f"{a[n][:2]} vs {b[n][:2]}"
            out.append(f"{n} differs ({what})")
    return out


def patch_safetensors(folder: Path, name: str, data: np.ndarray) -> None:
    """Overwrite the bytes of tensor ``name`` in whichever ``.safetensors`` file of ``folder`` holds it.

    ``data`` must have exactly the stored size (same dtype width and shape): the header is untouched.
    """
    for f in sorted(folder.glob("*.safetensors")):
        raw = bytearray(f.read_bytes())
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        if name not in header:
            continue
        start, end = header[name]["data_offsets"]
        payload = np.ascontiguousarray(data).tobytes()
        assert len(payload) == end - start, f"{name}: {len(payload)} bytes for a {end - start}-byte slot"
        raw[8 + n + start : 8 + n + end] = payload
        f.write_bytes(bytes(raw))
        return
    raise KeyError(f"{name} is not in any safetensors file of {folder}")


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data, indent=2))


# ------------------------------------------------------------------------------------------- the tool
@dataclasses.dataclass
class Run:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    inp: Path
    out: Path | None
    input_before: dict[str, str]
    input_after: dict[str, str]
    seconds: float
    _ck: Any = None

    def describe(self) -> str:
        text = (self.stdout + self.stderr).strip()
        return f"`tietool {' '.join(self.argv)}` -> exit {self.rc}\n--- output (tail) ---\n{text[-2500:]}"

    def ok(self) -> Run:
        assert self.rc == 0, self.describe()
        return self

    def ckpt(self) -> casecheck.Checkpoint:
        if self._ck is None:
            self.ok()
            self._ck = read(self.out)
        return self._ck

    def config(self) -> dict:
        return json.loads((self.out / "config.json").read_text())

    def report(self) -> dict:
        p = self.out / REPORT_NAME
        assert p.is_file(), f"{REPORT_NAME} missing from {self.out}\n{self.describe()}"
        return json.loads(p.read_text())


def run_cli(argv: list[str], timeout: float = 300) -> CliRun:
    """``tietool ARGV`` (:func:`support.fixture_support.run_tool`: :func:`support.cli_runner.run_cli`)."""
    return run_tool(argv, timeout)


def run_on(inp: Path, out: Path | None, command: str, extra: list[str]) -> Run:
    """``tietool COMMAND INP [--out OUT] EXTRA`` on an existing (writable) input folder."""
    argv = [command, str(inp), *(["--out", str(out)] if out is not None else []), *map(str, extra)]
    before = casecheck.snapshot_tree(inp)
    t0 = time.monotonic()
    cp = run_cli(argv)
    return Run(
        argv,
        cp.returncode,
        cp.stdout,
        cp.stderr,
        inp,
        out,
        before,
        casecheck.snapshot_tree(inp),
        time.monotonic() - t0,
    )


def run_resize(src: Path, work: Path, extra: list[str], command: str = "resize") -> Run:
    """Copy ``src`` to ``work/in`` and run ``tietool COMMAND work/in --out work/out EXTRA``."""
    work.mkdir(parents=True, exist_ok=False)
    inp = copy_checkpoint(src, work / "in")
    return run_on(inp, work / "out", command, extra)


# ------------------------------------------------------------------------------------- logits references
def oracle_reloads(info: dict) -> bool:
    """Whether the library's saved resize oracle reloads with ``from_pretrained`` (as
    ``expected/<case>.json`` records it: a dict or its repr)."""
    reload = info["reload_with_from_pretrained"]
    if isinstance(reload, dict):
        return reload.get("ok") is True
    return str(reload).startswith("{'ok': True")


def widened_copy(f: Fixture, n: int, dst: Path) -> Path:
    """A copy of fixture ``f`` with ``n`` entries along the vocabulary axis of every vocabulary tensor: the
    first min(V, n) as stored, the rest zero; config ``vocab_size`` = n. The test's own resize, for a
    single-file ``model_state.pdparams`` only (rewritten with :mod:`pickle`, protocol 4, as ``paddle.save``
    writes it)."""
    copy_checkpoint(f.src, dst)
    pd = dst / "model_state.pdparams"
    files = sorted(p.name for p in dst.iterdir())
    assert pd.is_file() and not [n for n in files if n.endswith((".safetensors", ".index.json"))], (
        f"widened_copy builds single-file .pdparams checkpoints only, not {files}"
    )
    state = read_pdparams_raw(pd)
    for role in f.roles:
        old = state[role.name]
        shape = list(old.shape)
        shape[role.axis] = n
        new = np.zeros(shape, old.dtype)
        kept = tuple(slice(0, min(f.V, n)) if ax == role.axis else slice(None) for ax in range(old.ndim))
        new[kept] = old[kept]
        state[role.name] = new
    pd.write_bytes(pickle.dumps(state, protocol=4))
    edit_json(dst / "config.json", lambda cfg: cfg.__setitem__("vocab_size", n))
    return dst
