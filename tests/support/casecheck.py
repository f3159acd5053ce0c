"""Independent reader and checker for the tietool case suite.

This module implements the check vocabulary of ``tests/data/cases/README.md``
without importing the code under test (``tietool``): it has its own
safetensors header parser and its own restricted pdparams unpickler, and it
only depends on the standard library and numpy.

Main entry points:

* :func:`read_checkpoint` -- load every tensor of a checkpoint folder
  (``model.safetensors``, sharded safetensors + index, ``model_state.pdparams``,
  sharded pdparams + index) as :class:`Tensor` objects (dtype label, shape,
  raw bytes).
* :func:`snapshot_tree` -- relative path -> sha256 of every file of a folder,
  for ``input_unchanged``.
* :func:`run_check` -- evaluate one check object; returns ``None`` when it
  passes or a human-readable failure description.
* :func:`evaluate_command` -- judge one finished command (exit status against
  ``expect``, then every applicable check) and return the list of failures.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import math
import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Tensor",
    "Checkpoint",
    "CheckContext",
    "ReadError",
    "read_checkpoint",
    "read_safetensors",
    "read_pdparams",
    "safetensors_header_metadata",
    "snapshot_tree",
    "diff_snapshots",
    "run_check",
    "evaluate_command",
    "json_equal",
    "lookup_path",
    "CHECKS",
    "ENCODE_LOADERS",
    "encode_texts",
    "pnlp_python",
    "prefetch_encodings",
]

# ---------------------------------------------------------------------------
# Tensors and file formats
# ---------------------------------------------------------------------------

SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
SAFE_SHARD_RE = re.compile(r"^model-\d+-of-\d+\.safetensors$")
PD_SINGLE = "model_state.pdparams"
PD_INDEX = "model_state.pdparams.index.json"
PD_SHARD_RE = re.compile(r"^model_state-\d+-of-\d+\.pdparams$")

#: safetensors dtype label -> numpy dtype used to *store* the elements
#: (BF16 and the 8-bit float formats have no numpy type: stored as unsigned ints).
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"),
    "F8_E4M3FNUZ": np.dtype("u1"),
    "F8_E5M2FNUZ": np.dtype("u1"),
    "C64": np.dtype("<c8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

#: dtype labels whose elements are bfloat16 bit patterns regardless of config.
BF16_LABELS = {"BF16", "bfloat16"}
#: dtype labels that hold bfloat16 bits when the checkpoint config says bfloat16.
U16_LABELS = {"U16", "uint16"}
#: dtype labels that cannot be decoded to numbers by this checker.
UNDECODABLE_LABELS = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "C64"}


class ReadError(Exception):
    """A weight file could not be read (bad header, forbidden pickle global...)."""


@dataclass
class Tensor:
    """One stored tensor: dtype label, shape and raw C-order bytes.

    ``label`` is the safetensors header string (``F32``, ``BF16``, ``U16``...)
    or, for pdparams, the numpy dtype name (``float32``, ``uint16``...).
    ``storage`` is the numpy dtype of the stored elements (``<u2`` for BF16).
    """

    name: str
    label: str
    shape: tuple[int, ...]
    raw: bytes
    storage: np.dtype | None
    source: str

    @property
    def nbytes(self) -> int:
        """Size of the raw data in bytes."""
        return len(self.raw)

    @property
    def itemsize(self) -> int | None:
        """Bytes per element, or None when unknown."""
        return None if self.storage is None else self.storage.itemsize

    def byte_view(self) -> np.ndarray:
        """The raw data as a uint8 array of shape ``shape + (itemsize,)``.

        Slicing this view and comparing it compares raw bytes, independently of
        the dtype label (so a ``U16`` input and a ``BF16`` output with the same
        bits compare equal, as "bitwise equal" requires).
        """
        if self.itemsize is None:
            raise ReadError(f"{self.name}: unknown element size for dtype {self.label}")
        count = math.prod(self.shape)
        if count * self.itemsize != len(self.raw):
            raise ReadError(
                f"{self.name}: {len(self.raw)} bytes do not match shape {list(self.shape)} "
                f"x {self.itemsize} bytes"
            )
        return np.frombuffer(self.raw, dtype=np.uint8).reshape(tuple(self.shape) + (self.itemsize,))

    def describe(self) -> str:
        """Short description: ``dtype shape (file)``."""
        return f"{self.label} {list(self.shape)} in {self.source}"


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads`` object hook: a key given twice is an error (plain ``json`` keeps the last one)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ReadError(f"name {key!r} appears twice in the header")
        seen[key] = value
    return seen


def _split_safetensors(path: Path) -> tuple[dict, bytes]:
    """The parsed JSON header and the data block of a safetensors file."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ReadError(f"{path.name}: file too short for a safetensors header ({len(data)} bytes)")
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        raise ReadError(f"{path.name}: header length {hlen} exceeds file size {len(data)}")
    try:
        header = json.loads(data[8 : 8 + hlen].decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReadError(f"{path.name}: header is not valid JSON: {exc}") from exc
    except ReadError as exc:
        raise ReadError(f"{path.name}: {exc}") from exc
    if not isinstance(header, dict):
        raise ReadError(f"{path.name}: header is not a JSON object")
    return header, data[8 + hlen :]


def safetensors_header_metadata(path: Path) -> Any:
    """The ``__metadata__`` entry of a safetensors header (None when absent)."""
    header, _ = _split_safetensors(path)
    return header.get("__metadata__")


def _check_contiguous(path: Path, spans: list[tuple[int, int, str]], size: int) -> None:
    """The safetensors library's layout rule: sorted by offset, the tensors tile the data block exactly (no
    hole, no overlap, no byte after the last one)."""
    position, previous = 0, "the start of the data block"
    for start, end, name in sorted(spans):
        if start != position:
            what = "a hole" if start > position else "an overlap"
            raise ReadError(
                f"{path.name}: {name} starts at {start}, {what} after {previous} (ends at {position}); "
                "the safetensors library refuses such a file"
            )
        position, previous = end, name
    if position != size:
        raise ReadError(
            f"{path.name}: {size - position} byte(s) after the last tensor ({previous}) in the data block; "
            "the safetensors library refuses such a file"
        )


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """Parse a safetensors file by hand and return its tensors by name.

    The format is an 8-byte little-endian header length, a JSON header
    ``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}`` and
    the data block; offsets are relative to the start of the data block.
    A file the safetensors library would refuse (a name twice in the header,
    a span that does not match shape and dtype, holes or overlaps between the
    tensors, bytes after the last one) raises :class:`ReadError`.
    """
    path = Path(path)
    header, body = _split_safetensors(path)
    tensors: dict[str, Tensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            label = str(info["dtype"])
            shape = tuple(int(d) for d in info["shape"])
            start, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ReadError(f"{path.name}: malformed header entry for {name!r}: {info!r}") from exc
        if not 0 <= start <= end <= len(body):
            raise ReadError(
                f"{path.name}: {name} data_offsets [{start}, {end}] outside the {len(body)}-byte data block"
            )
        storage = SAFETENSORS_DTYPES.get(label)
        if storage is not None and math.prod(shape) * storage.itemsize != end - start:
            raise ReadError(f"{path.name}: {name} is {label} {list(shape)} but spans {end - start} bytes")
        tensors[name] = Tensor(name, label, shape, bytes(body[start:end]), storage, path.name)
        spans.append((start, end, name))
    _check_contiguous(path, spans, len(body))
    return tensors


def _reconstruct_function() -> Callable:
    """numpy's array reconstruction helper, wherever this numpy version keeps it."""
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 1.26 / 2.x
    except ImportError:  # pragma: no cover - older numpy
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickler that only resolves the globals needed to rebuild numpy arrays."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct_function,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct_function,
        ("numpy", "ndarray"): lambda: np.ndarray,
        ("numpy", "dtype"): lambda: np.dtype,
        ("collections", "OrderedDict"): lambda: OrderedDict,
        ("_codecs", "encode"): lambda: codecs.encode,  # array bytes in a protocol-2 pickle
    }

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see class doc
        factory = self._ALLOWED.get((module, name))
        if factory is None:
            raise pickle.UnpicklingError(f"forbidden global {module}.{name} in pdparams pickle")
        return factory()


#: key of the table in which ``paddle.save`` lists the pieces of the arrays it split
UNPACK_INFO = "UnpackBigParamInfor@@"


def _join_split_params(path: Path, obj: dict) -> dict:
    """What ``paddle.load`` returns: every split parameter joined again.

    ``paddle.save`` stores an array over its size limit as flat pieces ``NAME@@.0``, ``NAME@@.1``, ... and
    lists them in ``UnpackBigParamInfor@@`` (``{NAME: {"OriginShape": shape, "slices": [piece names]}}``);
    ``paddle.load`` concatenates the pieces, reshapes them to ``OriginShape`` and stores the result as NAME
    (replacing any key NAME), dropping the pieces and the table.
    """
    table = obj.get(UNPACK_INFO)
    if table is None:
        return obj
    if not isinstance(table, dict):
        raise ReadError(f"{path.name}: {UNPACK_INFO} is {type(table).__name__}, not a dict")
    joined = dict(obj)
    del joined[UNPACK_INFO]
    for name, info in table.items():
        try:
            pieces = [obj[piece] for piece in info["slices"]]
            shape = tuple(int(d) for d in info["OriginShape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ReadError(f"{path.name}: {UNPACK_INFO} entry {name!r} is unusable: {exc!r}") from exc
        if not pieces or not all(isinstance(p, np.ndarray) for p in pieces):
            raise ReadError(f"{path.name}: the pieces of {name} are not all arrays")
        flat = np.concatenate([p.reshape(-1) for p in pieces])
        if flat.size != math.prod(shape):
            raise ReadError(f"{path.name}: the pieces of {name} hold {flat.size} values, shape {list(shape)}")
        joined[name] = flat.reshape(shape)
        for piece in info["slices"]:
            joined.pop(piece, None)
    return joined


def read_pdparams(path: Path) -> dict[str, Tensor]:
    """Load a pdparams pickle with the restricted unpickler, as ``paddle.load`` returns it.

    Only numpy arrays become tensors; other values (such as the
    ``StructuredToParameterName@@`` dict) are ignored. The pieces of a split
    parameter (``UnpackBigParamInfor@@``) are joined into one tensor. Raw
    bytes are ``arr.tobytes()`` (C order) and the label is the numpy dtype name.
    """
    path = Path(path)
    try:
        obj = _ArrayOnlyUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as exc:  # any unpickling problem is a read error
        raise ReadError(f"{path.name}: cannot unpickle: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, dict):
        raise ReadError(f"{path.name}: top-level object is {type(obj).__name__}, not a dict")
    obj = _join_split_params(path, obj)
    tensors: dict[str, Tensor] = {}
    for name, value in obj.items():
        if isinstance(value, np.ndarray):
            arr = value
            tensors[str(name)] = Tensor(
                str(name), arr.dtype.name, tuple(arr.shape), arr.tobytes(order="C"), arr.dtype, path.name
            )
    return tensors


@dataclass
class IndexInfo:
    """A parsed ``*.index.json`` file (or the problem met reading it)."""

    filename: str
    weight_map: dict[str, str] = field(default_factory=dict)
    total_size: Any = None
    error: str | None = None


@dataclass
class Checkpoint:
    """Everything read from one checkpoint folder.

    ``tensors`` maps names to the first tensor of that name found (files are
    read in sorted order; where the folder has an index, a name held both by
    a file the index lists and by an unlisted file is read from the listed
    file); ``files`` maps each weight file read to the tensors it holds;
    ``unreadable`` each weight file that could not be read to the reason;
    ``problems`` lists what could not be read (missing shard, forbidden pickle
    global, a safetensors file the library would refuse, duplicated names...).
    Reading never raises.
    """

    folder: Path
    tensors: dict[str, Tensor] = field(default_factory=dict)
    files: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)
    indexes: dict[str, IndexInfo] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    config: dict | None = None

    @property
    def exists(self) -> bool:
        """Whether the folder exists."""
        return self.folder.is_dir()

    def index_names(self) -> set[str]:
        """Every name listed in any index ``weight_map``."""
        names: set[str] = set()
        for info in self.indexes.values():
            names.update(info.weight_map)
        return names

    def is_bf16_checkpoint(self) -> bool:
        """True when config.json says the dtype is bfloat16.

        Looks at ``torch_dtype`` and ``dtype`` at the top level and in
        ``text_config``.
        """
        cfg = self.config if isinstance(self.config, dict) else {}
        scopes = [cfg]
        if isinstance(cfg.get("text_config"), dict):
            scopes.append(cfg["text_config"])
        for scope in scopes:
            for key in ("torch_dtype", "dtype"):
                value = scope.get(key)
                if (
                    isinstance(value, str)
                    and value.lower().replace("paddle.", "").replace("torch.", "") == "bfloat16"
                ):
                    return True
        return False

    def is_bf16(self, tensor: Tensor) -> bool:
        """Whether ``tensor`` holds bfloat16 bit patterns."""
        return tensor.label in BF16_LABELS or (tensor.label in U16_LABELS and self.is_bf16_checkpoint())

    def decode(self, tensor: Tensor) -> np.ndarray:
        """Decode a tensor to float64 numbers for numeric checks.

        bf16 (``BF16``, or ``U16``/``uint16`` in a bfloat16 checkpoint) is
        widened by bit shifting into float32, never by value casting; F16 goes
        through float16 -> float32.
        """
        if tensor.label in UNDECODABLE_LABELS or tensor.storage is None:
            raise ReadError(f"{tensor.name}: cannot decode dtype {tensor.label}")
        arr = np.frombuffer(tensor.raw, dtype=tensor.storage).reshape(tensor.shape)
        if self.is_bf16(tensor):
            bits = arr.astype(np.uint32) << np.uint32(16)
            return bits.view(np.float32).astype(np.float64)
        if arr.dtype.kind == "f" and arr.dtype.itemsize == 2:
            return arr.astype(np.float32).astype(np.float64)
        return arr.astype(np.float64)

    def names_summary(self, limit: int = 30) -> str:
        """Comma-separated tensor names (for failure messages)."""
        names = sorted(self.tensors)
        text = ", ".join(names[:limit])
        if len(names) > limit:
            text += f", ... ({len(names)} in all)"
        return text or "(none)"


def _read_json(path: Path) -> tuple[Any, str | None]:
    """Load a JSON file, returning ``(value, error)``."""
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path.name}: {type(exc).__name__}: {exc}"


def _read_index(path: Path) -> IndexInfo:
    """Parse an index file ``{"metadata": {"total_size": n}, "weight_map": {...}}``."""
    info = IndexInfo(path.name)
    value, error = _read_json(path)
    if error:
        info.error = error
        return info
    if not isinstance(value, dict) or not isinstance(value.get("weight_map"), dict):
        info.error = f"{path.name}: no weight_map object"
        return info
    info.weight_map = {str(k): str(v) for k, v in value["weight_map"].items()}
    metadata = value.get("metadata")
    info.total_size = metadata.get("total_size") if isinstance(metadata, dict) else None
    return info


def _weight_files(folder: Path, indexes: dict[str, IndexInfo]) -> list[tuple[str, Callable]]:
    """List ``(filename, reader)`` for every weight file of the folder.

    Includes the single-file forms, every file matching a shard pattern and
    every file named by an index (even if missing; the reader then fails).
    """
    present = {p.name for p in folder.iterdir() if p.is_file()}
    chosen: dict[str, Callable] = {}
    for name in sorted(present):
        if name == SAFE_SINGLE or SAFE_SHARD_RE.match(name):
            chosen[name] = read_safetensors
        elif name == PD_SINGLE or PD_SHARD_RE.match(name):
            chosen[name] = read_pdparams
    for index_name, info in indexes.items():
        reader = read_safetensors if index_name == SAFE_INDEX else read_pdparams
        for filename in sorted(set(info.weight_map.values())):
            chosen.setdefault(filename, reader)
    return sorted(chosen.items())


def _read_flex(folder: Path, ckpt: Checkpoint) -> bool:
    """A flex checkpoint's tensors into ``ckpt`` (:mod:`support.casecheck_flex`: ``model_state/`` names
    kept, ``optimizer_state/NAME``, ``master_weight/NAME``); False when ``folder`` is not one."""
    try:
        from . import casecheck_flex as flex
    except ImportError:  # loaded as a top-level module beside it
        import casecheck_flex as flex  # type: ignore[no-redef]
    if not flex.is_flex(folder):
        return False
    dirs = [(folder / d, "" if i == 0 else f"{d}/") for i, d in enumerate(flex.STATE_DIRS)]
    if not (folder / "model_state").is_dir():
        dirs = [(folder, "")]
    allowed = {k: f() for k, f in _ArrayOnlyUnpickler._ALLOWED.items()}
    for sub, prefix in dirs:
        if not any(sub.glob("*.metadata")):
            continue
        try:
            got = flex.read_state_folder(sub, allowed)
        except (flex.FlexReadError, OSError) as exc:
            ckpt.problems.append(str(exc))
            continue
        for key, (label, arr) in got.items():
            name = prefix + key
            ckpt.tensors[name] = Tensor(name, label, tuple(arr.shape), arr.tobytes(), arr.dtype, sub.name)
    return True


def read_checkpoint(folder: Path | str) -> Checkpoint:
    """Read every tensor, index and config.json of a checkpoint folder.

    Never raises: problems are collected in ``Checkpoint.problems``.
    """
    folder = Path(folder)
    ckpt = Checkpoint(folder)
    if not folder.is_dir():
        ckpt.problems.append(f"folder {folder} does not exist")
        return ckpt
    cfg_path = folder / "config.json"
    if cfg_path.is_file():
        ckpt.config, error = _read_json(cfg_path)
        if error:
            ckpt.problems.append(error)
    for index_name in (SAFE_INDEX, PD_INDEX):
        if (folder / index_name).is_file():
            info = _read_index(folder / index_name)
            ckpt.indexes[index_name] = info
            if info.error:
                ckpt.problems.append(info.error)
    files = _weight_files(folder, ckpt.indexes)
    if not files and _read_flex(folder, ckpt):
        return ckpt
    if not files:
        ckpt.problems.append("no weight file (model.safetensors, shards or model_state.pdparams)")
    listed = {f for info in ckpt.indexes.values() for f in info.weight_map.values()}
    for filename, reader in files:
        path = folder / filename
        if not path.is_file():
            ckpt.unreadable[filename] = f"{filename}: named in the index but missing"
            ckpt.problems.append(ckpt.unreadable[filename])
            continue
        try:
            tensors = reader(path)
        except (ReadError, OSError) as exc:
            ckpt.unreadable[filename] = str(exc)
            ckpt.problems.append(str(exc))
            continue
        ckpt.files[filename] = tensors
        for name, tensor in tensors.items():
            if name in ckpt.tensors:
                first_listed, this_listed = ckpt.tensors[name].source in listed, filename in listed
                if this_listed and not first_listed:  # the index says which file holds it
                    ckpt.tensors[name] = tensor
                elif first_listed == this_listed:
                    ckpt.problems.append(
                        f"tensor {name} stored twice: {ckpt.tensors[name].source} and {filename}"
                    )
                continue
            ckpt.tensors[name] = tensor
    return ckpt


# ---------------------------------------------------------------------------
# Snapshots (input_unchanged)
# ---------------------------------------------------------------------------


def snapshot_tree(folder: Path | str) -> dict[str, str]:
    """Map relative path -> sha256 hex digest of every file under ``folder``."""
    folder = Path(folder)
    result: dict[str, str] = {}
    if not folder.exists():
        return result
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            result[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return result


def diff_snapshots(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Describe the differences between two snapshots (empty when identical)."""
    diffs = []
    for rel in sorted(before.keys() - after.keys()):
        diffs.append(f"removed {rel}")
    for rel in sorted(after.keys() - before.keys()):
        diffs.append(f"added {rel}")
    for rel in sorted(before.keys() & after.keys()):
        if before[rel] != after[rel]:
            diffs.append(f"changed {rel}")
    return diffs


# ---------------------------------------------------------------------------
# JSON helpers (config / file_json)
# ---------------------------------------------------------------------------

_MISSING = object()


def lookup_path(value: Any, dotted: str) -> tuple[Any, str | None]:
    """Follow a dotted path (integers index lists) into parsed JSON.

    Returns ``(found_value, None)`` or ``(_MISSING, reason)``.
    """
    current = value
    walked: list[str] = []
    for part in dotted.split("."):
        where = ".".join(walked) or "(top level)"
        if isinstance(current, dict):
            if part not in current:
                return _MISSING, f"key {part!r} missing at {where} (keys: {sorted(current)[:20]})"
            current = current[part]
        elif isinstance(current, list):
            try:
                position = int(part)
            except ValueError:
                return _MISSING, f"{where} is a list, {part!r} is not an index"
            if not -len(current) <= position < len(current):
                return _MISSING, f"index {position} out of range at {where} (length {len(current)})"
            current = current[position]
        else:
            return _MISSING, f"{where} is {json.dumps(current)}, cannot descend into {part!r}"
        walked.append(part)
    return current, None


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: like ``==`` but booleans never equal numbers (``true != 1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------------------
# Check context and checks
# ---------------------------------------------------------------------------


@dataclass
class CheckContext:
    """What the checks of one command can look at.

    ``out`` is the ``{out}`` path (may be None for commands without one),
    ``input_dir`` the command's CKPT argument, ``original_dir`` the case's
    original ``ckpt/``; ``message`` is stdout and stderr together;
    ``input_snapshot`` the :func:`snapshot_tree` of the input taken before the
    command ran. Checkpoints are read lazily and cached; pass ``input_ckpt``
    (read before the command ran) to compare against the input as it was.
    """

    out: Path | None
    input_dir: Path | None
    original_dir: Path | None
    message: str = ""
    input_snapshot: dict[str, str] | None = None
    input_ckpt: Checkpoint | None = None
    original_ckpt: Checkpoint | None = None
    _out_ckpt: Checkpoint | None = None
    #: loader -> {text: ids, or an error string}: what ``encodes`` saw (filled per loader, batched)
    encodings: dict[str, dict[str, list[int] | str]] = field(default_factory=dict)

    def out_ckpt(self, require_readable: bool = True) -> Checkpoint:
        """The output checkpoint (read once).

        With ``require_readable`` (every tensor check) it fails when a weight
        file of the output cannot be read, e.g. a safetensors file the library
        would refuse: a check must not pass on what it could not read.
        """
        if self._out_ckpt is None:
            if self.out is None:
                raise CheckFailure("this command has no {out} folder")
            self._out_ckpt = read_checkpoint(self.out)
        if require_readable and self._out_ckpt.unreadable:
            raise CheckFailure(
                "output weight file(s) cannot be read: " + "; ".join(self._out_ckpt.unreadable.values())
            )
        return self._out_ckpt

    def in_ckpt(self) -> Checkpoint:
        """The input checkpoint (read once, ideally before the command ran)."""
        if self.input_ckpt is None:
            if self.input_dir is None:
                raise CheckFailure("this command has no input folder")
            self.input_ckpt = read_checkpoint(self.input_dir)
        return self.input_ckpt

    def orig_ckpt(self) -> Checkpoint:
        """The case's original ckpt/ (read once)."""
        if self.original_ckpt is None:
            if self.original_dir is None:
                raise CheckFailure("no original ckpt/ folder known")
            self.original_ckpt = read_checkpoint(self.original_dir)
        return self.original_ckpt


class CheckFailure(Exception):
    """Raised inside a check to report why it fails."""


def _problems_note(ckpt: Checkpoint) -> str:
    """Suffix listing a checkpoint's read problems, if any."""
    return f" [read problems in {ckpt.folder.name}: {'; '.join(ckpt.problems)}]" if ckpt.problems else ""


def _get(ckpt: Checkpoint, name: str, role: str) -> Tensor:
    """Fetch a tensor or fail listing what the checkpoint does hold."""
    tensor = ckpt.tensors.get(name)
    if tensor is None:
        if not ckpt.exists:
            raise CheckFailure(f"{role} folder {ckpt.folder} does not exist")
        raise CheckFailure(
            f"{role} has no tensor {name!r}; it holds: {ckpt.names_summary()}{_problems_note(ckpt)}"
        )
    return tensor


def _differing_elements(a: np.ndarray, b: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """Count the elements that differ between two equally shaped byte views.

    Returns ``(count, index_of_first_difference)``; the index is ``()`` when
    nothing differs.
    """
    diff = np.any(a != b, axis=-1)
    if not np.any(diff):
        return 0, ()
    return int(np.sum(diff)), tuple(int(i) for i in np.argwhere(diff)[0])


def _values_at(ckpt: Checkpoint, tensor: Tensor, index: tuple[int, ...]) -> str:
    """Decoded value of one element, for failure messages (best effort)."""
    try:
        return repr(float(ckpt.decode(tensor)[index]))
    except Exception:  # noqa: BLE001 - purely informative
        return "?"


def _compare_bitwise(
    out_ckpt: Checkpoint, out_t: Tensor, ref_ckpt: Checkpoint, ref_t: Tensor, mode: str, ref_role: str
) -> None:
    """Fail unless ``out_t`` is bitwise equal to ``ref_t`` (or its transpose)."""
    if mode not in ("same", "transposed"):
        raise CheckFailure(f"unknown mode {mode!r} (expected 'same' or 'transposed')")
    ref_view = ref_t.byte_view()
    if mode == "transposed":
        if len(ref_t.shape) != 2:
            raise CheckFailure(f"{ref_role} {ref_t.name} is {list(ref_t.shape)}, not 2-D: cannot transpose")
        ref_view = ref_view.transpose(1, 0, 2)
    want_shape = list(ref_view.shape[:-1])
    if list(out_t.shape) != want_shape:
        raise CheckFailure(
            f"output {out_t.name} is {out_t.describe()}, expected shape {want_shape} "
            f"({ref_role} {ref_t.name} {mode}: {ref_t.describe()})"
        )
    if out_t.itemsize != ref_t.itemsize:
        raise CheckFailure(
            f"output {out_t.name} ({out_t.label}, {out_t.itemsize} B/elem) vs {ref_role} "
            f"{ref_t.name} ({ref_t.label}, {ref_t.itemsize} B/elem): element sizes differ"
        )
    out_view = out_t.byte_view()
    count, first = _differing_elements(out_view, ref_view)
    if count:
        ref_index = first[::-1] if mode == "transposed" else first
        hint = ""
        if mode == "same" and len(ref_t.shape) == 2 and ref_t.shape[0] == ref_t.shape[1]:
            if np.array_equal(out_view, ref_view.transpose(1, 0, 2)):
                hint = " (it equals the transpose instead)"
        elif mode == "transposed" and list(out_t.shape) == list(ref_t.shape):
            if np.array_equal(out_view, ref_t.byte_view()):
                hint = " (it equals the untransposed tensor instead)"
        raise CheckFailure(
            f"output {out_t.name} ({out_t.describe()}) is not bitwise equal to {ref_role} "
            f"{ref_t.name} {mode} ({ref_t.describe()}): {count} element(s) differ, first at "
            f"index {list(first)}; output value {_values_at(out_ckpt, out_t, first)} vs "
            f"{ref_role} value {_values_at(ref_ckpt, ref_t, ref_index)}{hint}"
        )


def _axis_slice(tensor: Tensor, axis: int, start: int, stop: int, role: str) -> np.ndarray:
    """Byte view of ``tensor[start:stop]`` along ``axis``; fails if it is too short."""
    view = tensor.byte_view()
    ndim = len(tensor.shape)
    if axis >= ndim:
        raise CheckFailure(f"{role} {tensor.name} is {list(tensor.shape)}: has no axis {axis}")
    if not 0 <= start <= stop <= tensor.shape[axis]:
        raise CheckFailure(
            f"{role} {tensor.name} is {tensor.describe()}: range {start}:{stop} on axis {axis} "
            f"does not fit (size {tensor.shape[axis]})"
        )
    index = [slice(None)] * (ndim + 1)
    index[axis] = slice(start, stop)
    return view[tuple(index)]


def _check_range_equal(ctx: CheckContext, args: list, axis: int) -> None:
    """rows_equal_input / cols_equal_input."""
    name, start, stop = args
    out_t = _get(ctx.out_ckpt(), name, "output")
    in_t = _get(ctx.in_ckpt(), name, "input")
    if out_t.itemsize != in_t.itemsize:
        raise CheckFailure(f"output {out_t.describe()} vs input {in_t.describe()}: element sizes differ")
    out_part = _axis_slice(out_t, axis, start, stop, "output")
    in_part = _axis_slice(in_t, axis, start, stop, "input")
    if out_part.shape != in_part.shape:
        raise CheckFailure(
            f"slice {start}:{stop} (axis {axis}) has shape {list(out_part.shape[:-1])} in the output "
            f"({out_t.describe()}) but {list(in_part.shape[:-1])} in the input ({in_t.describe()})"
        )
    count, where = _differing_elements(out_part, in_part)
    if count:
        first = list(where)
        first[axis] += start
        raise CheckFailure(
            f"{name}[{start}:{stop}] along axis {axis} differs from the input: "
            f"{count} element(s) differ, first at index {first}; output value "
            f"{_values_at(ctx.out_ckpt(), out_t, tuple(first))} vs input value "
            f"{_values_at(ctx.in_ckpt(), in_t, tuple(first))} "
            f"(output {out_t.describe()}, input {in_t.describe()})"
        )


def _check_range_zero(ctx: CheckContext, args: list, axis: int) -> None:
    """rows_zero / cols_zero."""
    name, start, stop = args
    out_t = _get(ctx.out_ckpt(), name, "output")
    part = _axis_slice(out_t, axis, start, stop, "output")
    count, where = _differing_elements(part, np.zeros_like(part))
    if count:
        first = list(where)
        first[axis] += start
        raise CheckFailure(
            f"{name}[{start}:{stop}] along axis {axis} is not all zero bytes: "
            f"{count} nonzero element(s), first at index {first} = "
            f"{_values_at(ctx.out_ckpt(), out_t, tuple(first))} ({out_t.describe()})"
        )


def check_out_has_tensor(ctx: CheckContext, name: str) -> None:
    """The output has a tensor NAME."""
    _get(ctx.out_ckpt(), name, "output")


def check_out_lacks_tensor(ctx: CheckContext, name: str) -> None:
    """The output has no tensor NAME and no index entry for it."""
    ckpt = ctx.out_ckpt()
    if name in ckpt.tensors:
        raise CheckFailure(f"output still holds tensor {name} ({ckpt.tensors[name].describe()})")
    for index_name, info in ckpt.indexes.items():
        if name in info.weight_map:
            raise CheckFailure(
                f"output {index_name} still lists {name} -> {info.weight_map[name]} "
                f"(no such tensor in the shards: stale entry)"
            )
    if not ckpt.exists:
        raise CheckFailure(f"output folder {ckpt.folder} does not exist")


def check_out_lacks_file(ctx: CheckContext, name: str) -> None:
    """The output folder exists and holds no file NAME (a path relative to the folder)."""
    if ctx.out is None:
        raise CheckFailure("this command has no {out} folder")
    out = Path(ctx.out)
    if not out.is_dir():
        raise CheckFailure(f"output folder {out} does not exist")
    path = out / name
    if path.exists() or path.is_symlink():
        kind = (
            "folder" if path.is_dir() else f"file of {path.stat().st_size} bytes" if path.exists() else "link"
        )
        raise CheckFailure(f"output holds {name} (a {kind})")


def check_no_tensor_with_shape(ctx: CheckContext, shape: list) -> None:
    """No output tensor has shape SHAPE."""
    ckpt = ctx.out_ckpt()
    if not ckpt.exists:
        raise CheckFailure(f"output folder {ckpt.folder} does not exist")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise CheckFailure(f"malformed shape {json.dumps(shape)}: expected a list of integers")
    # every file's tensors, not only the first of each name: a stale duplicate counts too
    hits = [
        f"{name} ({t.describe()})"
        for _, tensors in sorted(ckpt.files.items())
        for name, t in sorted(tensors.items())
        if list(t.shape) == shape
    ]
    if hits:
        raise CheckFailure(f"{len(hits)} output tensor(s) have shape {shape}: {', '.join(hits)}")


def check_tensor_shape(ctx: CheckContext, args: list) -> None:
    """Output tensor NAME has shape SHAPE."""
    name, shape = args
    tensor = _get(ctx.out_ckpt(), name, "output")
    if list(tensor.shape) != list(shape):
        raise CheckFailure(
            f"output {name} has shape {list(tensor.shape)}, expected {list(shape)} ({tensor.describe()})"
        )


def check_tensor_dtype(ctx: CheckContext, args: list) -> None:
    """Output tensor NAME has stored dtype label DTYPE."""
    name, dtype = args
    tensor = _get(ctx.out_ckpt(), name, "output")
    if tensor.label != dtype:
        raise CheckFailure(
            f"output {name} is stored as {tensor.label!r}, expected {dtype!r} ({tensor.describe()})"
        )


def check_tensor_equals_input(ctx: CheckContext, args: list) -> None:
    """Output OUT is bitwise equal to input IN (same or transposed)."""
    out_name, in_name, mode = args
    out_t = _get(ctx.out_ckpt(), out_name, "output")
    in_t = _get(ctx.in_ckpt(), in_name, "input")
    _compare_bitwise(ctx.out_ckpt(), out_t, ctx.in_ckpt(), in_t, mode, "input")


def check_tensor_equals_input_slice(ctx: CheckContext, args: list) -> None:
    """Output OUT is bitwise equal to ``IN[START:STOP]`` along AXIS of the input, as is or transposed (a part
    split out of a fused tensor)."""
    out_name, in_name, axis, start, stop, mode = args
    if mode not in ("same", "transposed"):
        raise CheckFailure(f"unknown mode {mode!r} (expected 'same' or 'transposed')")
    out_t = _get(ctx.out_ckpt(), out_name, "output")
    in_t = _get(ctx.in_ckpt(), in_name, "input")
    ref = _axis_slice(in_t, int(axis), int(start), int(stop), "input")
    if mode == "transposed":
        if ref.ndim != 3:
            raise CheckFailure(f"input {in_name} is {list(in_t.shape)}, not 2-D: cannot transpose")
        ref = ref.transpose(1, 0, 2)
    if out_t.itemsize != in_t.itemsize or list(out_t.shape) != list(ref.shape[:-1]):
        raise CheckFailure(
            f"output {out_name} is {out_t.describe()}, expected {list(ref.shape[:-1])} "
            f"({in_name}[{start}:{stop}] on axis {axis}, {mode}: {in_t.describe()})"
        )
    count, first = _differing_elements(out_t.byte_view(), ref)
    if count:
        raise CheckFailure(
            f"output {out_name} is not bitwise equal to input {in_name}[{start}:{stop}] on axis {axis} "
            f"{mode}: {count} element(s) differ, first at index {list(first)}"
        )


def check_tensor_equals_input_file(ctx: CheckContext, args: list) -> None:
    """Output OUT is bitwise equal to tensor IN as stored in the input's weight file FILE (same or
    transposed): for rank files, which repeat names (each holds its own copy of a replicated tensor)."""
    out_name, filename, in_name, mode = args
    out_t = _get(ctx.out_ckpt(), out_name, "output")
    in_ckpt = ctx.in_ckpt()
    tensors = in_ckpt.files.get(filename)
    if tensors is None:  # a rank file: not a weight file of a whole checkpoint, read on its own
        path = in_ckpt.folder / filename
        reader = read_safetensors if filename.endswith(".safetensors") else read_pdparams
        if not path.is_file() or not filename.endswith((".safetensors", ".pdparams")):
            raise CheckFailure(f"input file {filename} is not a weight file in {in_ckpt.folder}")
        try:
            tensors = in_ckpt.files[filename] = reader(path)
        except (ReadError, OSError) as exc:
            raise CheckFailure(f"input file {filename} cannot be read: {exc}") from None
    in_t = tensors.get(in_name)
    if in_t is None:
        raise CheckFailure(f"input file {filename} holds no tensor {in_name}")
    _compare_bitwise(ctx.out_ckpt(), out_t, in_ckpt, in_t, mode, f"input {filename}")


def check_tensor_equals_original(ctx: CheckContext, args: list) -> None:
    """Output OUT is bitwise equal to tensor IN of the case's original ckpt/."""
    out_name, in_name, mode = args
    out_t = _get(ctx.out_ckpt(), out_name, "output")
    orig_t = _get(ctx.orig_ckpt(), in_name, "original")
    _compare_bitwise(ctx.out_ckpt(), out_t, ctx.orig_ckpt(), orig_t, mode, "original")


def check_tensor_scaled_input(ctx: CheckContext, args: list) -> None:
    """Decoded OUT equals decoded input IN times FACTOR within RTOL."""
    out_name, in_name, factor, rtol = args
    out_t = _get(ctx.out_ckpt(), out_name, "output")
    in_t = _get(ctx.in_ckpt(), in_name, "input")
    if list(out_t.shape) != list(in_t.shape):
        raise CheckFailure(f"output {out_t.describe()} vs input {in_t.describe()}: shapes differ")
    out_v = ctx.out_ckpt().decode(out_t)
    want = ctx.in_ckpt().decode(in_t) * float(factor)
    err = np.abs(out_v - want)
    bad = err > float(rtol) * np.abs(want) + 1e-7
    if np.any(bad):
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CheckFailure(
            f"output {out_name} != input {in_name} x {factor} (rtol {rtol}) at {int(bad.sum())} "
            f"element(s); first at {list(first)}: got {out_v[first]!r}, expected {want[first]!r}"
        )


def check_rows_equal_input(ctx: CheckContext, args: list) -> None:
    """out[NAME][START:STOP] bitwise equals in[NAME][START:STOP] along axis 0."""
    _check_range_equal(ctx, args, axis=0)


def check_cols_equal_input(ctx: CheckContext, args: list) -> None:
    """The same along axis 1."""
    _check_range_equal(ctx, args, axis=1)


def check_rows_zero(ctx: CheckContext, args: list) -> None:
    """Every byte of out[NAME][START:STOP] (axis 0) is zero."""
    _check_range_zero(ctx, args, axis=0)


def check_cols_zero(ctx: CheckContext, args: list) -> None:
    """The same along axis 1."""
    _check_range_zero(ctx, args, axis=1)


def check_rows_mean_of_input(ctx: CheckContext, args: list) -> None:
    """Output rows START..STOP-1 are within TOL*max(1,|m|) of the input's mean row m."""
    name, start, stop, tol = args
    out_ckpt, in_ckpt = ctx.out_ckpt(), ctx.in_ckpt()
    out_t = _get(out_ckpt, name, "output")
    in_t = _get(in_ckpt, name, "input")
    if not 0 <= start <= stop <= (out_t.shape[0] if out_t.shape else 0):
        raise CheckFailure(f"output {name} is {out_t.describe()}: rows {start}:{stop} do not exist")
    mean = in_ckpt.decode(in_t).astype(np.float64).mean(axis=0)
    rows = out_ckpt.decode(out_t)[start:stop]
    if rows.shape[1:] != mean.shape:
        raise CheckFailure(
            f"output rows of {name} have shape {list(rows.shape[1:])}, input mean row {list(mean.shape)}"
        )
    limit = float(tol) * np.maximum(1.0, np.abs(mean))
    bad = np.abs(rows - mean) > limit
    if np.any(bad):
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        col = first[1:]
        bf16_note = (
            f"; output decoded as {'bf16' if out_ckpt.is_bf16(out_t) else out_t.label}, "
            f"input as {'bf16' if in_ckpt.is_bf16(in_t) else in_t.label}"
        )
        raise CheckFailure(
            f"{name} rows {start}:{stop} are not the input mean row (tol {tol}): "
            f"{int(bad.sum())} element(s) off; first at row {first[0] + start}, column "
            f"{list(col)}: got {rows[first]!r}, mean {mean[col]!r}; mean row = "
            f"{np.array2string(mean, precision=6)}; row {first[0] + start} = "
            f"{np.array2string(rows[first[0]], precision=6)}{bf16_note}"
        )


def check_tensors_equal(ctx: CheckContext, args: list) -> None:
    """Output A and output B both exist and are bitwise equal."""
    a_name, b_name = args
    ckpt = ctx.out_ckpt()
    a = _get(ckpt, a_name, "output")
    b = _get(ckpt, b_name, "output")
    _compare_bitwise(ckpt, b, ckpt, a, "same", "output")


def check_same_if_present(ctx: CheckContext, args: list) -> None:
    """Output A exists; if output B exists, it is bitwise equal to A."""
    a_name, b_name = args
    ckpt = ctx.out_ckpt()
    a = _get(ckpt, a_name, "output")
    b = ckpt.tensors.get(b_name)
    if b is not None:
        _compare_bitwise(ckpt, b, ckpt, a, "same", "output")


def _check_json_file(ctx: CheckContext, filename: str, expected: dict) -> None:
    """Compare dotted keys of a JSON file of the output with expected values."""
    if ctx.out is None:
        raise CheckFailure("this command has no {out} folder")
    path = Path(ctx.out) / filename
    if not path.is_file():
        raise CheckFailure(f"output has no {filename}")
    data, error = _read_json(path)
    if error:
        raise CheckFailure(f"cannot read output {error}")
    wrong = []
    for key, want in expected.items():
        got, reason = lookup_path(data, key)
        if got is _MISSING:
            wrong.append(f"{filename} {key}: expected {json.dumps(want)}, but {reason}")
        elif not json_equal(got, want):
            wrong.append(f"{filename} {key}: expected {json.dumps(want)}, got {json.dumps(got)}")
    if wrong:
        raise CheckFailure("; ".join(wrong))


def check_config(ctx: CheckContext, expected: dict) -> None:
    """Each dotted KEY of the output config.json equals VALUE."""
    _check_json_file(ctx, "config.json", expected)


def check_file_json(ctx: CheckContext, args: list) -> None:
    """The same for another JSON file of the output."""
    filename, expected = args
    _check_json_file(ctx, filename, expected)


def check_safetensors_metadata(ctx: CheckContext, expected: dict) -> None:
    """The output holds a .safetensors file, and in every one the header's __metadata__ has each KEY equal to
    VALUE."""
    if ctx.out is None:
        raise CheckFailure("this command has no {out} folder")
    out = Path(ctx.out)
    if not isinstance(expected, dict):
        raise CheckFailure(f"malformed argument {json.dumps(expected)}: expected an object")
    files = sorted(p for p in out.glob("*.safetensors") if p.is_file()) if out.is_dir() else []
    if not files:
        raise CheckFailure(f"output holds no .safetensors file ({'no folder' if not out.is_dir() else out})")
    wrong = []
    for path in files:
        try:
            meta = safetensors_header_metadata(path)
        except ReadError as exc:
            wrong.append(f"cannot read the header: {exc}")
            continue
        if not isinstance(meta, dict):
            wrong.append(
                f"{path.name} has no __metadata__"
                if meta is None
                else f"{path.name} __metadata__ is {json.dumps(meta)}"
            )
            continue
        for key, want in expected.items():
            if key not in meta:
                wrong.append(f"{path.name} __metadata__ has no {key!r} (it has {json.dumps(meta)})")
            elif not json_equal(meta[key], want):
                got = json.dumps(meta[key])
                wrong.append(f"{path.name} __metadata__ {key}: expected {json.dumps(want)}, got {got}")
    if wrong:
        raise CheckFailure("; ".join(wrong))


def _message_has(message: str, word: str) -> bool:
    """Case-insensitive substring test."""
    return word.lower() in message.lower()


def check_message_mentions_any(ctx: CheckContext, words: list) -> None:
    """The message contains at least one of WORDS."""
    if not any(_message_has(ctx.message, w) for w in words):
        raise CheckFailure(f"the output mentions none of {words}")


def check_message_mentions_all(ctx: CheckContext, words: list) -> None:
    """The message contains all of WORDS."""
    missing = [w for w in words if not _message_has(ctx.message, w)]
    if missing:
        raise CheckFailure(f"the output does not mention {missing} (of required {words})")


def check_message_lacks_any(ctx: CheckContext, words: list) -> None:
    """The message contains none of WORDS."""
    present = [w for w in words if _message_has(ctx.message, w)]
    if present:
        raise CheckFailure(f"the output mentions {present}, which it must not")


def check_input_unchanged(ctx: CheckContext, flag: bool) -> None:
    """After the command the input folder holds exactly the same files and bytes."""
    if not flag:
        return
    if ctx.input_snapshot is None or ctx.input_dir is None:
        raise CheckFailure("no snapshot of the input was taken before the command")
    diffs = diff_snapshots(ctx.input_snapshot, snapshot_tree(ctx.input_dir))
    if diffs:
        raise CheckFailure(f"the input folder {ctx.input_dir} was modified: {', '.join(diffs)}")


def check_no_output(ctx: CheckContext, flag: bool) -> None:
    """``{out}`` does not exist, or is an empty folder."""
    if not flag or ctx.out is None:
        return
    out = Path(ctx.out)
    if not out.exists():
        return
    if not out.is_dir():
        raise CheckFailure(f"{out} exists as a file")
    entries = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    if entries:
        raise CheckFailure(f"output folder was written with {len(entries)} entries: {entries[:20]}")


def _index_problems(ckpt: Checkpoint, index_name: str, info: IndexInfo) -> list[str]:
    """Everything wrong between one index and the shard files it describes."""
    if info.error:
        return [info.error]
    problems = []
    shard_re = SAFE_SHARD_RE if index_name == SAFE_INDEX else PD_SHARD_RE
    listed_files = set(info.weight_map.values())
    for filename in sorted(listed_files):
        if not (ckpt.folder / filename).is_file():
            problems.append(f"{index_name} names {filename}, which does not exist")
        elif filename not in ckpt.files:
            problems.append(f"{filename} (named in {index_name}) cannot be read{_problems_note(ckpt)}")
    for name, filename in sorted(info.weight_map.items()):
        if filename in ckpt.files and name not in ckpt.files[filename]:
            problems.append(f"{index_name} maps {name} -> {filename}, but that file has no such tensor")
    shard_files = {f for f in ckpt.files if shard_re.match(f)} | (listed_files & ckpt.files.keys())
    real_total = 0
    for filename in sorted(shard_files):
        for name, tensor in sorted(ckpt.files[filename].items()):
            real_total += tensor.nbytes
            listed = info.weight_map.get(name)
            if listed is None:
                problems.append(f"{filename} holds {name}, which {index_name} does not list")
            elif listed != filename:
                problems.append(f"{filename} holds {name}, but {index_name} maps it to {listed}")
    total = info.total_size
    if isinstance(total, bool) or not isinstance(total, (int, float)):
        problems.append(f"{index_name} metadata.total_size is {json.dumps(total)}, not a number")
    elif total != real_total:
        problems.append(
            f"{index_name} metadata.total_size is {total}, but the shards hold {real_total} bytes of tensors"
        )
    return problems


def check_index_matches_shards(ctx: CheckContext, flag: bool) -> None:
    """The output is sharded and its index agrees exactly with the shard files."""
    if not flag:
        return
    ckpt = ctx.out_ckpt(require_readable=False)
    if not ckpt.exists:
        raise CheckFailure(f"output folder {ckpt.folder} does not exist")
    if not ckpt.indexes:
        files = sorted(p.name for p in ckpt.folder.iterdir())
        raise CheckFailure(f"output is not sharded: no {SAFE_INDEX} or {PD_INDEX} (files: {files})")
    problems = []
    for index_name, info in sorted(ckpt.indexes.items()):
        problems.extend(_index_problems(ckpt, index_name, info))
    if problems:
        raise CheckFailure("; ".join(problems))


def check_total_size(ctx: CheckContext, expected: int) -> None:
    """The output index has metadata.total_size == N."""
    ckpt = ctx.out_ckpt(require_readable=False)
    if not ckpt.indexes:
        raise CheckFailure(f"output has no index file, so no total_size (expected {expected})")
    seen = {name: info.total_size for name, info in ckpt.indexes.items()}
    if not any(
        not isinstance(v, bool) and isinstance(v, (int, float)) and v == expected for v in seen.values()
    ):
        raise CheckFailure(f"index metadata.total_size is {seen}, expected {expected}")


# ---------------------------------------------------------------------------
# encodes: the output's tokenizer as each library loads it
# ---------------------------------------------------------------------------

#: the LOADER values of ``encodes``
ENCODE_LOADERS = ("tokenizers", "sentencepiece", "transformers", "paddlenlp-2.8")
ENCODE_TIMEOUT_S = 600

# Runs in a child process (transformers under this interpreter, because PaddleFormers patches transformers
# once imported; PaddleNLP 2.8.1 under $PNLP_PYTHON). argv: folder, texts.json, result.json, loader.
_ENCODE_SCRIPT = r"""
import json, sys, zlib  # zlib before paddle: paddle 2.6.2 needs it imported first
folder, texts_path, out_path, loader = sys.argv[1:5]
texts = json.load(open(texts_path, encoding="utf-8"))
try:
    if loader == "paddlenlp-2.8":
        from paddlenlp.transformers import AutoTokenizer
    else:
        from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    result = {"ids": [[int(i) for i in tok(t, add_special_tokens=False)["input_ids"]] for t in texts]}
except Exception as exc:
    result = {"error": type(exc).__name__ + ": " + str(exc)[:500]}
json.dump(result, open(out_path, "w", encoding="utf-8"))
"""


def pnlp_python() -> str | None:
    """The PaddleNLP 2.8.1 interpreter ``PNLP_PYTHON`` names, or None when it is unset or missing."""
    value = os.environ.get("PNLP_PYTHON", "")
    return value if value and Path(value).exists() else None


def _encode_child(python: str, folder: Path, texts: list[str], loader: str) -> list[list[int]] | str:
    """Encode ``texts`` with ``loader``'s ``AutoTokenizer`` in a child ``python``: ids per text, or why."""
    try:
        from support import preload
    except ImportError:  # run as a script (tests/support on sys.path, not tests/)
        import preload  # type: ignore[no-redef]

    with tempfile.TemporaryDirectory(prefix="casecheck-encode-") as tmp:
        texts_path, out_path = Path(tmp) / "texts.json", Path(tmp) / "result.json"
        texts_path.write_text(json.dumps(texts), encoding="utf-8")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1"}
        try:
            run = preload.run(
                [python, "-c", _ENCODE_SCRIPT, str(folder), str(texts_path), str(out_path), loader],
                libs=preload.PADDLENLP if loader == "paddlenlp-2.8" else ("transformers",),
                capture_output=True,
                text=True,
                env=env,
                timeout=ENCODE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{loader} did not run: {exc}"
        if not out_path.exists():
            tail = " | ".join((run.stdout + run.stderr).strip().splitlines()[-5:])
            return f"{loader} process exited {run.returncode} without a result: {tail}"
        result = json.loads(out_path.read_text(encoding="utf-8"))
    return result["ids"] if "ids" in result else f"{loader} cannot load the tokenizer: {result['error']}"


def _encode_tokenizers(folder: Path, texts: list[str]) -> list[list[int]] | str:
    """``tokenizers.Tokenizer.from_file(folder/tokenizer.json)``, ``add_special_tokens=False``."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return "the output holds no tokenizer.json"
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return [tok.encode(t, add_special_tokens=False).ids for t in texts]
    except Exception as exc:  # noqa: BLE001  (any load error of the library is the check's failure)
        return f"tokenizers cannot load tokenizer.json: {type(exc).__name__}: {exc}"


def _encode_sentencepiece(folder: Path, texts: list[str]) -> list[list[int]] | str:
    """The folder's ``*.model`` (the only one, else the first sentencepiece loads) with ``sentencepiece``."""
    import sentencepiece as spm

    models = sorted(folder.glob("*.model"))
    if not models:
        return "the output holds no *.model file"
    errors = []
    for path in models:
        sp = spm.SentencePieceProcessor()
        try:
            sp.Load(str(path))
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{path.name}: {type(exc).__name__}: {exc}")
            continue
        return [list(sp.EncodeAsIds(t)) for t in texts]
    return "sentencepiece cannot load " + "; ".join(errors)


def encode_texts(folder: Path, loader: str, texts: list[str]) -> list[list[int]] | str:
    """Encode ``texts`` (no special tokens added) with the tokenizer of ``folder`` as ``loader`` loads it.

    Returns one id list per text, or a string saying why the loader could not load or run (a missing
    ``PNLP_PYTHON`` for ``paddlenlp-2.8`` included). Raises ValueError for an unknown loader.
    """
    if loader == "tokenizers":
        return _encode_tokenizers(folder, texts)
    if loader == "sentencepiece":
        return _encode_sentencepiece(folder, texts)
    if loader == "transformers":
        return _encode_child(sys.executable, folder, texts, loader)
    if loader == "paddlenlp-2.8":
        python = pnlp_python()
        if python is None:
            return "PNLP_PYTHON names no interpreter: PaddleNLP 2.8.1 cannot run (tests/tools/pnlp_venv.sh)"
        return _encode_child(python, folder, texts, loader)
    raise ValueError(f"unknown encodes loader {loader!r} (one of {list(ENCODE_LOADERS)})")


def prefetch_encodings(ctx: CheckContext, checks: list) -> None:
    """Run every ``encodes`` check's loader once for all its texts (one process per loader, not per check)."""
    wanted: dict[str, list[str]] = {}
    for check in checks:
        if isinstance(check, dict) and len(check) == 1 and isinstance(check.get("encodes"), list):
            args = check["encodes"]
            if len(args) == 3 and args[0] in ENCODE_LOADERS and isinstance(args[1], str):
                wanted.setdefault(args[0], []).append(args[1])
    if ctx.out is None or not Path(ctx.out).is_dir():
        return
    for loader, texts in wanted.items():
        texts = [t for t in dict.fromkeys(texts) if t not in ctx.encodings.get(loader, {})]
        if texts:
            got = encode_texts(Path(ctx.out), loader, texts)
            ctx.encodings.setdefault(loader, {}).update(
                {t: (got if isinstance(got, str) else got[i]) for i, t in enumerate(texts)}
            )


def check_encodes(ctx: CheckContext, args: list) -> None:
    """The output's tokenizer, loaded by LOADER, encodes TEXT (no special tokens added) as IDS."""
    loader, text, ids = args
    if loader not in ENCODE_LOADERS:
        raise CheckFailure(f"unknown loader {loader!r} (one of {list(ENCODE_LOADERS)})")
    if ctx.out is None or not Path(ctx.out).is_dir():
        raise CheckFailure(f"output folder {ctx.out} does not exist")
    if text not in ctx.encodings.get(loader, {}):
        prefetch_encodings(ctx, [{"encodes": [loader, text, ids]}])
    got = ctx.encodings[loader][text]
    if isinstance(got, str):
        raise CheckFailure(got)
    if list(got) != list(ids):
        raise CheckFailure(f"{loader} encodes {text!r} as {list(got)}, expected {list(ids)}")


#: check name -> function(ctx, argument)
CHECKS: dict[str, Callable[[CheckContext, Any], None]] = {
    "out_has_tensor": check_out_has_tensor,
    "out_lacks_tensor": check_out_lacks_tensor,
    "out_lacks_file": check_out_lacks_file,
    "tensor_shape": check_tensor_shape,
    "no_tensor_with_shape": check_no_tensor_with_shape,
    "tensor_dtype": check_tensor_dtype,
    "tensor_equals_input": check_tensor_equals_input,
    "tensor_equals_input_slice": check_tensor_equals_input_slice,
    "tensor_equals_input_file": check_tensor_equals_input_file,
    "tensor_equals_original": check_tensor_equals_original,
    "tensor_scaled_input": check_tensor_scaled_input,
    "rows_equal_input": check_rows_equal_input,
    "cols_equal_input": check_cols_equal_input,
    "rows_zero": check_rows_zero,
    "cols_zero": check_cols_zero,
    "rows_mean_of_input": check_rows_mean_of_input,
    "tensors_equal": check_tensors_equal,
    "same_if_present": check_same_if_present,
    "config": check_config,
    "file_json": check_file_json,
    "safetensors_metadata": check_safetensors_metadata,
    "message_mentions_any": check_message_mentions_any,
    "message_mentions_all": check_message_mentions_all,
    "message_lacks_any": check_message_lacks_any,
    "input_unchanged": check_input_unchanged,
    "no_output": check_no_output,
    "index_matches_shards": check_index_matches_shards,
    "total_size": check_total_size,
    "encodes": check_encodes,
}


def run_check(check: dict, ctx: CheckContext) -> str | None:
    """Evaluate one one-key check object.

    Returns None when it passes, else a description of the failure with the
    values seen. Unknown checks and malformed arguments fail (never pass).
    """
    if not isinstance(check, dict) or len(check) != 1:
        return f"malformed check {json.dumps(check)}: expected a one-key object"
    ((kind, arg),) = check.items()
    func = CHECKS.get(kind)
    if func is None:
        return f"unknown check {kind!r} (not in the README vocabulary known to casecheck)"
    try:
        func(ctx, arg)
    except CheckFailure as exc:
        return str(exc)
    except ReadError as exc:
        return f"cannot read tensor data: {exc}"
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        return f"check could not be evaluated ({type(exc).__name__}: {exc})"
    return None


# ---------------------------------------------------------------------------
# Judging one command
# ---------------------------------------------------------------------------

TRACEBACK_MARK = "Traceback"


def evaluate_command(command: dict, returncode: int | None, ctx: CheckContext) -> list[str]:
    """Judge one finished command of a case.

    ``returncode`` is None when the command timed out or could not start.
    ``expect``: ``ok`` = exit 0; ``refuse`` = non-zero exit and no
    ``Traceback`` in the message; ``either`` = both acceptable, adding
    ``checks_if_ok`` or ``checks_if_refuse``. Returns the failure lines
    (``check json: reason``); empty when everything passes.
    """
    failures: list[str] = []
    expect = command.get("expect", "ok")
    has_traceback = TRACEBACK_MARK in ctx.message
    if returncode is None:
        failures.append("the command did not finish (timeout or could not start)")
        succeeded = False
    else:
        succeeded = returncode == 0
    checks = list(command.get("checks", []))
    if expect == "ok":
        if returncode is not None and not succeeded:
            failures.append(
                f"expect ok: exit code {returncode} (should be 0)"
                + (" -- the output contains a Python traceback" if has_traceback else "")
            )
    elif expect == "refuse":
        if succeeded:
            failures.append("expect refuse: exit code 0 (should be non-zero, a handled refusal)")
        elif returncode is not None and has_traceback:
            failures.append(
                f"expect refuse: exit code {returncode} but the output contains a Python traceback "
                "(a crash, not a handled refusal)"
            )
    elif expect == "either":
        if succeeded:
            checks += command.get("checks_if_ok", [])
        else:
            if returncode is not None and has_traceback:
                failures.append(
                    f"expect either: exit code {returncode} with a Python traceback "
                    "(a crash, not a handled refusal)"
                )
            checks += command.get("checks_if_refuse", [])
    else:
        failures.append(f"unknown expect value {expect!r}")
    prefetch_encodings(ctx, checks)
    for check in checks:
        reason = run_check(check, ctx)
        if reason is not None:
            failures.append(f"{json.dumps(check)}: {reason}")
    return failures
