"""Paddle flex checkpoints (``paddle.distributed.save_state_dict``; PaddleFormers 1.2's Trainer default,
``save_checkpoint_format="flex_checkpoint"``), read without executing anything.

A flex checkpoint folder holds ``<rank>_<id>.distcp`` files (``paddle.save`` pickles of ``{key: ndarray}``,
each a rank's local slices, read by :mod:`surgery.io.pdparams`'s walker like any ``.pdparams``) and one
``<id>.metadata`` file: a pickle of ``paddle.distributed.flex_checkpoint.dcp.metadata.Metadata`` whose
``state_dict_metadata`` maps each tensor key to its ``LocalTensorMetadata`` (``global_offset``,
``local_shape``, ``global_shape``, ``dtype``, ``is_flattened``, ``flattened_range``) and whose
``storage_metadata`` maps each ``LocalTensorIndex`` (``tensor_key``, ``global_offset``, ``local_shape``,
flattening, ``replica_id``) to the file that holds that slice. The three classes are simulated as plain
:class:`~surgery.io.pdparams.Record` s (:data:`METADATA`: nothing is imported or called); any other global
is refused by name (``UnsafePickleError``, exit 4).

The Trainer writes such a folder as ``checkpoint-N/model_state/`` beside ``optimizer_state/`` and
``master_weight/`` (flex folders of their own) and the files of a save (config.json, trainer_state.json,
tokenizer files). :func:`find` recognises the three places a flex folder may be; :func:`read` gives one
:class:`FlexTensor` per global tensor, every field checked.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..model.errors import CheckpointError
from ..model.tensor import TensorInfo
from . import pdparams, regular, tree
from .configfile import read_config
from .pdparams import AllowList, Limits, Record

if TYPE_CHECKING:
    import numpy as np
else:
    from ..model.lazy import numpy as np

MODULE = "paddle.distributed.flex_checkpoint.dcp.metadata"
_META, _LTM, _LTI = (MODULE, "Metadata"), (MODULE, "LocalTensorMetadata"), (MODULE, "LocalTensorIndex")

MAX_SLICES = 1 << 17
"""The most stored slices (``storage_metadata`` entries, each with its ``LocalTensorMetadata``) of one
``.metadata`` (131,072): reading time and memory grow with each (a 22 MB ``.metadata`` of 200,000 took 11 s
of CPU), and a save holds about one per parameter and rank that shares it (an optimizer's state a few per
parameter); the walk stops at the record beyond them rather than read for a minute."""
MAX_TENSORS = MAX_SLICES
"""The most global tensors of one ``.metadata``: each has at least one slice."""
MAX_AXES = 32
"""The most axes of a tensor (paddle's tensors have at most 9; numpy 1.x's limit is 32): the boxes of a
flattened slice are found axis by axis, so the axes bound that work."""
MAX_RANK = 1 << 20
"""The highest rank number of a ``<rank>_<id>.distcp`` file name (1,048,576 processes): far above any
training run, low enough that a file name of thousands of digits is never converted to an integer."""

METADATA = AllowList(
    "a flex checkpoint's .metadata",
    {},
    limits=Limits(
        records=2 * MAX_SLICES + 1,
        records_why=f"tietool reads at most {MAX_SLICES:,} slices (two records each) from one .metadata",
    ),
    records=frozenset({_META, _LTM, _LTI}),
    top_record=True,
)
"""The allow-list of a ``.metadata`` pickle: exactly the three record classes of
``paddle.distributed.flex_checkpoint.dcp.metadata`` (paddle 3.x), simulated, never imported."""

STATE_DIRS = ("model_state", "optimizer_state", "master_weight")
"""The flex folders of a PaddleFormers 1.2 Trainer ``checkpoint-N/`` (``trainer.py``, ``_save_checkpoint``
with ``save_checkpoint_format="flex_checkpoint"``)."""
DATA_RE = re.compile(r"^(\d+)_(\d+)\.distcp$")  # <rank>_<unique id>.distcp (save_state_dict's file_name)
META_RE = re.compile(r"^(\d+)\.metadata$")  # <unique id>.metadata

# paddle dtype name (LocalTensorMetadata.dtype) -> numpy storage dtype in the .distcp (bf16 as uint16 bits)
# and the safetensors label of what the values mean
DTYPES: dict[str, tuple[str, str]] = {
    "float32": ("float32", "F32"),
    "float16": ("float16", "F16"),
    "bfloat16": ("uint16", "BF16"),
    "float64": ("float64", "F64"),
    "int64": ("int64", "I64"),
    "int32": ("int32", "I32"),
    "int16": ("int16", "I16"),
    "int8": ("int8", "I8"),
    "uint8": ("uint8", "U8"),
    "bool": ("bool", "BOOL"),
}
_FIX = (
    "re-copy the checkpoint folder from the training run (the .metadata and .distcp files are written "
    "together)"
)


@dataclass(frozen=True)
class FlexSlice:
    """One stored slice of a global tensor.

    Attributes:
        file: the ``.distcp`` file (name in the flex folder) that holds it.
        key: its key in that file (the tensor key).
        offset: where its block starts in the global tensor (``global_offset``).
        shape: the block's shape (``local_shape``).
        flat: ``(start, stop)`` of the block's C-order elements the file holds as a 1-D array
            (``flattened_range``, sharding's flattened slices), or None: the whole block, shaped ``shape``.
        replica: ``replica_id`` (``save_replicas=True``: each copy of a replicated slice), or None.
    """

    file: str
    key: str
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    flat: tuple[int, int] | None = None
    replica: int | None = None

    @property
    def numel(self) -> int:
        """Elements the file holds for this slice."""
        return self.flat[1] - self.flat[0] if self.flat else math.prod(self.shape)


@dataclass(frozen=True)
class FlexTensor:
    """A global tensor of a flex checkpoint: its key, global shape, paddle dtype name and slices."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    slices: tuple[FlexSlice, ...]

    @property
    def storage_dtype(self) -> str:
        """The numpy dtype of its slices in the ``.distcp`` files (``uint16`` for bf16)."""
        return DTYPES[self.dtype][0]

    @property
    def label(self) -> str:
        """The safetensors dtype label of its values (``BF16``, ``F32``, ...)."""
        return DTYPES[self.dtype][1]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.storage_dtype).itemsize


@dataclass(frozen=True)
class FlexFolder:
    """Where a flex checkpoint is: ``root`` the folder named (a ``checkpoint-N/`` or the flex folder itself),
    ``state`` the folder with the ``.distcp`` and ``.metadata`` files, ``others`` the other flex folders of a
    Trainer checkpoint present (``optimizer_state``, ``master_weight``)."""

    root: Path
    state: Path
    others: tuple[str, ...]


def above(root: Path) -> Path:
    """The folder above ``root`` (where a Trainer's config.json and tokenizer files are), as the user means
    it: ``root`` made absolute first, since ``Path(".").parent`` is ``.`` (``os.path.abspath``: lexical, a
    symbolic link to the folder is not resolved)."""
    return Path(os.path.abspath(root)).parent


def _is_flex_dir(p: Path) -> bool:
    try:
        names = [q.name for q in p.iterdir()] if p.is_dir() else []
    except OSError:
        return False
    return any(META_RE.match(n) for n in names) and any(DATA_RE.match(n) for n in names)


def find(path: Path) -> FlexFolder | None:
    """The flex checkpoint at ``path``: ``path/model_state/`` (a Trainer ``checkpoint-N/``), or ``path``
    itself holding ``*.distcp`` and ``*.metadata``; None when it is neither (local folders only)."""
    try:
        if not path.is_dir():
            return None
        others = tuple(d for d in STATE_DIRS[1:] if (path / d).is_dir())
        if _is_flex_dir(path / "model_state"):
            return FlexFolder(path, path / "model_state", others)
        if _is_flex_dir(path):
            return FlexFolder(path, path, ())
    except OSError:  # unreadable: the reader that lists the folder refuses it by name
        return None
    return None


def inside(path: Path) -> list[Path]:
    """The sub-folders of ``path`` that are flex checkpoints (:func:`find`), shorter names first
    (``checkpoint-9`` before ``checkpoint-10``): a Trainer's ``output_dir`` holds its ``checkpoint-N/``
    there (a checkpoint's own ``model_state/``, ``optimizer_state/``, ``master_weight/`` are not counted);
    ``[]`` for an unreadable folder."""
    try:
        subs = [p for p in path.iterdir() if p.is_dir()] if path.is_dir() else []
        subs.sort(key=lambda p: (len(p.name), p.name))
    except OSError:
        return []
    return [p for p in subs if p.name not in STATE_DIRS and find(p) is not None]


@dataclass(frozen=True)
class FlexCheckpoint:
    """A flex checkpoint's structure (nothing of the data read).

    Attributes:
        folder: where it is (:class:`FlexFolder`).
        metadata: the ``.metadata`` file name; ``files`` the ``.distcp`` files, by rank.
        tensors: key → :class:`FlexTensor`, in the metadata's order.
        ranks: the ranks that wrote a ``.distcp`` file.
    """

    folder: FlexFolder
    metadata: str
    files: tuple[str, ...]
    tensors: dict[str, FlexTensor]
    ranks: tuple[int, ...]

    def path_of(self, file: str) -> Path:
        """The path of ``file`` (a ``.distcp`` or the ``.metadata``) in the flex folder."""
        return self.folder.state / file


def _bad(path: Path, what: str) -> CheckpointError:
    return CheckpointError(what, path, _FIX)


def _ints(v: Any, n: int | None, what: str, path: Path) -> tuple[int, ...]:
    if type(v) is tuple and len(v) > MAX_AXES:
        raise _bad(path, f"{what} has {len(v):,} axes, more than the {MAX_AXES} tietool reads")
    if type(v) is not tuple or not all(type(x) is int and 0 <= x < 2**62 for x in v):
        raise _bad(path, f"{what} is not a tuple of non-negative integers")
    if n is not None and len(v) != n:
        raise _bad(path, f"{what} has {len(v)} axes, not {n}")
    return v


def _fields(r: Any, cls: tuple[str, str], path: Path, what: str, names: dict[str, Any]) -> dict[str, Any]:
    """The fields of record ``r`` of class ``cls``: exactly the dataclass's (``names``: field → default),
    defaults filled in.

    Raises:
        CheckpointError: ``r`` is not such a record, or has a field the class does not have.
    """
    if type(r) is not Record or r.cls != cls:
        raise _bad(path, f"{what} is not a {cls[1]} record")
    extra = [k for k in r.fields if k not in names]
    if extra:
        raise _bad(path, f"{what} ({cls[1]}) has a field {extra[0][:40]!r} paddle's class does not have")
    return {**names, **r.fields}


# the dataclasses' fields and defaults (paddle 3.3.1 metadata.py); None for a field without a default
_LTM_FIELDS: dict[str, Any] = dict.fromkeys(("global_offset", "local_shape", "dtype", "global_shape"))
_LTM_FIELDS |= {"is_flattened": False, "flattened_range": None}
_LTI_FIELDS: dict[str, Any] = dict.fromkeys(("tensor_key", "global_offset", "flattened_range", "replica_id"))
_LTI_FIELDS |= {"is_flattened": False, "local_shape": None}
_META_FIELDS: dict[str, Any] = {"state_dict_metadata": None, "storage_metadata": None, "flat_mapping": None}


def _flat(f: dict[str, Any], shape: tuple[int, ...], what: str, path: Path) -> tuple[int, int] | None:
    if type(f["is_flattened"]) is not bool:
        raise _bad(path, f"{what}: is_flattened is not a bool")
    if not f["is_flattened"]:
        return None
    rng = _ints(f["flattened_range"], 2, f"{what}: flattened_range", path)
    if not rng[0] <= rng[1] <= math.prod(shape):
        raise _bad(path, f"{what}: flattened_range {list(rng)} is outside its block of {math.prod(shape)}")
    return (rng[0], rng[1])


def _tensor_meta(path: Path, key: str, metas: Any) -> tuple[tuple[int, ...], str]:
    """The global shape and dtype of ``key`` from its ``LocalTensorMetadata`` list (every slice's agree)."""
    if type(metas) is not list or not metas:
        raise _bad(path, f"state_dict_metadata[{key[:60]!r}] is not a list of LocalTensorMetadata")
    seen: set[tuple[tuple[int, ...], str]] = set()
    for m in metas:
        f = _fields(m, _LTM, path, f"a slice of {key[:60]!r}", _LTM_FIELDS)
        gs = _ints(f["global_shape"], None, f"{key[:60]!r}: global_shape", path)
        if type(f["dtype"]) is not str or f["dtype"].removeprefix("paddle.") not in DTYPES:
            raise _bad(
                path, f"{key[:60]!r}: dtype {str(f['dtype'])[:30]!r} is not a weight dtype tietool reads"
            )
        seen.add((gs, f["dtype"].removeprefix("paddle.")))
    if len(seen) != 1:
        raise _bad(path, f"the slices of {key[:60]!r} disagree on the global shape or dtype")
    return seen.pop()


def _slice(path: Path, lti: Any, file: Any, tensors: dict[str, Any]) -> FlexSlice:
    f = _fields(lti, _LTI, path, "a storage_metadata key", _LTI_FIELDS)
    key = f["tensor_key"]
    if type(key) is not str or key not in tensors:
        raise _bad(path, f"storage_metadata names tensor {str(key)[:60]!r}, which state_dict_metadata lacks")
    m = DATA_RE.match(file) if type(file) is str else None
    if m is None:
        raise _bad(
            path, f"storage_metadata puts a slice of {key[:60]!r} in {str(file)[:60]!r}, not a .distcp"
        )
    if len(m.group(1)) > len(str(MAX_RANK)) or int(m.group(1)) > MAX_RANK:
        raise _bad(
            path,
            f"storage_metadata puts a slice of {key[:60]!r} in a file of rank {m.group(1)[:20]}"
            f"{'...' if len(m.group(1)) > 20 else ''} ({len(m.group(1)):,} digits), above the "
            f"{MAX_RANK:,} ranks tietool reads",
        )
    n = len(tensors[key][0])
    off = _ints(f["global_offset"], n, f"{key[:60]!r}: global_offset", path)
    shape = _ints(f["local_shape"], n, f"{key[:60]!r}: local_shape", path)
    if any(o + s > g for o, s, g in zip(off, shape, tensors[key][0], strict=True)):
        raise _bad(path, f"a slice of {key[:60]!r} at {list(off)} {list(shape)} runs past its global shape")
    rep = f["replica_id"]
    if rep is not None and type(rep) is not int:
        raise _bad(path, f"{key[:60]!r}: replica_id is not an integer")
    return FlexSlice(file, key, off, shape, _flat(f, shape, key[:60], path), rep)


def read_metadata(path: Path) -> dict[str, FlexTensor]:
    """The global tensors a ``.metadata`` file describes, each field checked, nothing executed.

    Returns:
        key → :class:`FlexTensor` (slices in the order of ``storage_metadata``).

    Raises:
        UnsafePickleError: a global other than the three record classes (named; nothing is run).
        CheckpointError: a malformed pickle or record (a field missing, of the wrong type, a slice outside
            its tensor, a tensor without slices), naming the file.
    """
    top, _ = pdparams.walk(path, METADATA)
    f = _fields(top[""], _META, path, "the top-level record", _META_FIELDS)
    sdm, stm = f["state_dict_metadata"], f["storage_metadata"]
    if type(sdm) is not dict or type(stm) is not dict:
        raise _bad(path, "Metadata lacks its state_dict_metadata or storage_metadata dict")
    if len(sdm) > MAX_TENSORS or len(stm) > MAX_SLICES:
        what = f"{len(sdm):,} tensors" if len(sdm) > MAX_TENSORS else f"{len(stm):,} slices"
        most = f"{MAX_TENSORS:,} tensors" if len(sdm) > MAX_TENSORS else f"{MAX_SLICES:,} slices"
        raise _bad(path, f"it describes {what}, more than the {most} tietool reads from one .metadata")
    meta: dict[str, tuple[tuple[int, ...], str]] = {}
    for key, metas in sdm.items():
        if type(key) is not str:
            raise _bad(path, "a state_dict_metadata key is not a tensor name")
        meta[key] = _tensor_meta(path, key, metas)
    slices: dict[str, list[FlexSlice]] = {k: [] for k in meta}
    for lti, file in stm.items():
        s = _slice(path, lti, file, meta)
        slices[s.key].append(s)
    empty = [k for k, v in slices.items() if not v]
    if empty:
        raise _bad(path, f"tensor {empty[0][:60]!r} has no stored slice (storage_metadata names none)")
    return {k: FlexTensor(k, meta[k][0], meta[k][1], tuple(slices[k])) for k in meta}


def open_flex(folder: FlexFolder) -> FlexCheckpoint:
    """Read the flex checkpoint in ``folder.state``: its one ``.metadata`` (:func:`read_metadata`), the
    ``.distcp`` files it names checked present.

    Raises:
        CheckpointError: no ``.metadata`` file (an incomplete folder), several (several saves in one
            folder: which one is meant is unclear), a file the metadata names missing, or what
            :func:`read_metadata` raises.
        UnsafePickleError: as :func:`read_metadata`.
    """
    names = sorted(p.name for p in folder.state.iterdir())
    metas = [n for n in names if META_RE.match(n)]
    if not metas:
        raise CheckpointError(
            "no <id>.metadata file: the flex folder is incomplete (the save was cut short or files are "
            "missing)",
            folder.state,
            "copy the whole folder the training run saved (its <id>.metadata and every <rank>_<id>.distcp)",
        )
    if len(metas) != 1:
        raise CheckpointError(
            f"{len(metas)} .metadata files ({', '.join(metas[:4])}): several saves share the folder",
            folder.state,
            "keep one save's <id>.metadata and <rank>_<id>.distcp files in the folder (paddle loads the "
            "newest)",
        )
    tensors = read_metadata(folder.state / metas[0])
    files = sorted({s.file for t in tensors.values() for s in t.slices}, key=_rank_of)
    for fname in files:
        _require_data_file(folder.state / fname, metas[0])
    ranks = tuple(sorted({_rank_of(f) for f in files}))
    return FlexCheckpoint(folder, metas[0], tuple(files), tensors, ranks)


def _require_data_file(path: Path, meta: str) -> None:
    """``path`` (a ``.distcp`` the ``meta`` file names) is a regular file tietool can read.

    Raises:
        CheckpointError: it is missing; a dangling link or a link loop (:func:`tree.stat_link`); a folder,
            FIFO, socket or device, or unreadable (:func:`regular.require_regular`): each said as what it is.
    """
    if path.is_symlink():
        tree.stat_link(str(path))
    elif not path.exists():
        raise CheckpointError(
            f"{path.name}, which {meta} names for some slices, is missing",
            path,
            "copy every <rank>_<id>.distcp file the training run saved into the folder",
        )
    regular.require_regular(path, path.name)


def _rank_of(file: str) -> int:
    """The rank of a ``<rank>_<id>.distcp`` name (-1: not one, or a rank number above :data:`MAX_RANK`,
    which :func:`read_metadata` refuses; never an integer conversion of thousands of digits)."""
    m = DATA_RE.match(file)
    if not m or len(m.group(1)) > len(str(MAX_RANK)):
        return -1
    return int(m.group(1))


def data_headers(ck: FlexCheckpoint, file: str) -> dict[str, TensorInfo]:
    """The arrays of one ``.distcp`` file by key (headers only: :func:`pdparams.read_header`).

    Raises:
        CheckpointError, UnsafePickleError: a damaged or unsafe file, naming it.
    """
    infos, _, _ = pdparams.read_header(ck.path_of(file), file)
    return {t.name: t for t in infos}


def summary(ck: FlexCheckpoint) -> dict[str, Any]:
    """What ``tietool inspect`` shows of a flex checkpoint (``--json`` prints it): the folders, the
    ``.metadata`` and ``.distcp`` files with their ranks and sizes, every global tensor (shape, paddle dtype,
    number of slices, flattened or not), the totals, the model_type of a config.json beside it or above it,
    and how to merge it. Headers only: no tensor data is read."""
    root, state = ck.folder.root, ck.folder.state
    config = next((d / "config.json" for d in (root, above(root)) if (d / "config.json").is_file()), None)
    model_type = None
    if config is not None:  # a bad config.json is refused here as everywhere
        model_type = read_config(config.parent)[0].get("model_type")
    files = [
        {
            "file": state.joinpath(f).relative_to(root).as_posix(),
            "rank": _rank_of(f),
            "bytes": (state / f).stat().st_size,
        }
        for f in ck.files
    ]
    tensors = [
        {
            "name": t.name,
            "shape": list(t.shape),
            "dtype": t.dtype,
            "slices": len(t.slices),
            "flattened": any(s.flat is not None for s in t.slices),
            "files": sorted({s.file for s in t.slices}, key=_rank_of),
        }
        for t in ck.tensors.values()
    ]
    return {
        "path": str(root),
        "kind": "flex",
        "format": "flex-checkpoint",
        "model_state": state.relative_to(root).as_posix(),
        "metadata": state.joinpath(ck.metadata).relative_to(root).as_posix(),
        "ranks": list(ck.ranks),
        "files": files,
        "state_folders": list(ck.folder.others),
        "config": None if config is None else str(config),
        "model_type": model_type,
        "num_tensors": len(ck.tensors),
        "total_parameters": sum(t.numel for t in ck.tensors.values()),
        "total_bytes": sum(t.nbytes for t in ck.tensors.values()),
        "tensors": tensors,
        "next": "tietool merge (tietool.merge in Python) into a new folder: PaddleFormers safetensors the "
        "other commands take",
    }
