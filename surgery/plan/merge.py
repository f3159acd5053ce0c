"""``tietool merge``: tensor-parallel (and pipeline-parallel) rank files into one whole checkpoint.

PaddleNLP and PaddleFormers write ``model_state.tp00.pdparams``, ``model_state.tp01.pdparams``, ... (and
``model_state.tp00_pp00.pdparams``, ``_pp01``, ...) when a model trained with tensor (pipeline) parallelism is
saved without merging. Each tensor-parallel rank holds a slice of each split tensor; each pipeline rank
holds some of the layers, under the whole model's names (PaddleNLP's ``PipelinePretrainedModel.state_dict``
maps the pipeline-layer names back to the single model's). The rules are the libraries' own
``_get_tensor_parallel_mappings`` (merge direction, ``split_or_merge_func(is_split=False)``), kept as data
in :data:`surgery.arch.families.TENSOR_PARALLEL`; this module only applies them:

1. :func:`find_ranks`: the rank files of a folder, grouped by ``(tp, pp)``; a missing rank is refused by
   the file name it would have.
2. :func:`read_ranks`: their headers (never unpickled: :mod:`.formats.pdparams_io`).
3. :func:`plan`: per tensor, its rule, axis and merged shape, checked against ``config.json``; replicated
   tensors (and a tensor in two pipeline ranks) compared byte for byte.
4. :func:`merge`: the merged tensors written by :func:`surgery.write.assemble.assemble`, one at a time: an
axis-0
   concatenation is a list of byte ranges (no memory); another axis loads the slices of one tensor,
   concatenates, writes and drops them. bf16 (``uint16`` in ``.pdparams``) moves as bits, never converted.

The rules, per tensor: the embedding ``[V/n, H]`` per rank → ``[V, H]`` by rows; the head ``[H, V/n]`` →
``[H, V]`` (or ``[V/n, H]`` → ``[V, H]``, told from the shapes and ``vocab_size``); column-parallel weights
``[H, X/n]`` and biases ``[X/n]`` on their output axis; row-parallel weights ``[X/n, H]`` on their input
axis; fused gate-up / GQA qkv per rank interleaved; norms and row-parallel biases replicated (checked
equal). Pipeline ranks are unioned.

Every refusal is one line naming the file and a fix that cannot do damage; nothing is written then.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from ..arch import families as arch
from ..arch.families import TPRule, TPSplit
from ..io import pdparams_io, safetensors_io, surface
from ..io.checkpoint import REPORT_NAME, read_config, special_file, unreadable_folder
from ..io.regular import require_regular
from ..io.safetensors_io import Source
from ..io.store import local_only
from ..model.errors import CheckpointError, RefusedError, UsageError
from ..model.tensor import TensorInfo
from ..results import Report
from ..write.assemble import DEFAULT_MAX_SHARD_SIZE, Container, OutTensor, assemble, layout, parse_size

# model_state.tp00.pdparams, model_state.tp01_pp00.pdparams, model_state_pp01.pdparams,
# model-00001-of-00002.tp00.safetensors (a rank's shards): the tags and the rest of the name
_TAG_RE = re.compile(r"(?:^|[._-])(tp|pp)(\d+)(?=[._-])", re.IGNORECASE)
_FIX_RESAVE = "re-save the rank files from the training run's last checkpoint (they are written together)"


@dataclass(frozen=True)
class RankFile:
    """One weight file of one rank: ``tp`` / ``pp`` are its rank numbers (0 without a tag)."""

    rel: str
    tp: int
    pp: int


@dataclass(frozen=True)
class Slice:
    """One rank's piece of a tensor: its header and the file it is in."""

    path: Path
    info: TensorInfo


@dataclass(frozen=True)
class Merged:
    """One tensor of the merged checkpoint.

    Attributes:
        name: state-dict name (as in the rank files).
        rule: how its slices are joined (:class:`TPSplit`); ``REPLICATED`` also for a split rule whose every
            rank holds the whole tensor (PaddleNLP keeps k/v whole when kv_heads % tp != 0, the embedding
            and head when vocab_size % tp != 0).
        axis: the axis the slices are concatenated on (None: replicated).
        dtype: safetensors label of the logical dtype (``F32``, ``BF16``).
        shape: the merged shape.
        slices: one per tensor-parallel rank, in rank order.
        parts: fused kinds: the shares of each part in a rank's slice (``(1, 1)`` gate/up, ``(g, 1, 1)``
            q/k/v with g = kv groups); None otherwise.
    """

    name: str
    rule: TPSplit
    axis: int | None
    dtype: str
    shape: tuple[int, ...]
    slices: tuple[Slice, ...]
    parts: tuple[int, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rule": self.rule.value,
            "axis": self.axis,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "from": sorted({s.info.file for s in self.slices}),
        }


# ------------------------------------------------------------------------------------------ rank files
def _tags(name: str) -> dict[str, int]:
    return {m.group(1).lower(): int(m.group(2)) for m in _TAG_RE.finditer(name)}


def _renumber(name: str, tp: int, pp: int) -> str:
    """``name`` with its rank tags set to ``tp`` / ``pp`` (the name a missing rank's file would have)."""

    def sub(m: re.Match) -> str:
        n = tp if m.group(1).lower() == "tp" else pp
        return m.group(0)[: -len(m.group(2))] + f"{n:0{len(m.group(2))}d}"

    return _TAG_RE.sub(sub, name)


def find_ranks(path: Path, names: set[str]) -> tuple[str, dict[tuple[int, int], list[RankFile]]]:
    """The rank files of a folder, by ``(tp, pp)``: every rank of ``tp00..tpNN`` × ``pp00..ppMM``.

    Returns:
        ``(container: "pdparams" or "safetensors", {(tp, pp): [its files, by name]})``.

    Raises:
        UsageError: no rank files (nothing to merge), or whole-model weights beside them.
        RefusedError: expert-parallel or sharding rank files (``moe00``, ``moe_sharding00``, ``shard00``):
            not joined yet (issue 21), named as such.
        CheckpointError: rank files of both containers, or a rank missing (named by its file name).
    """
    ranks = [n for n in surface.rank_files(names) if n.endswith(surface.WEIGHT_EXT)]
    if not ranks:
        raise UsageError(
            "no tensor- or pipeline-parallel rank files (model_state.tp00.pdparams, ...) in the folder; "
            "nothing to merge",
            path,
            "give the folder the training run saved its rank files in",
        )
    cause = surface.rank_cause(ranks)
    if cause not in (surface.Cause.TENSOR_PARALLEL, surface.Cause.PIPELINE_PARALLEL):
        raise surface.refuse(
            cause, path, f"{', '.join(ranks[:6])}; merge joins tensor- and pipeline-parallel rank files only"
        )
    whole = sorted(n for n in names if n.endswith(surface.WEIGHT_EXT) and n not in ranks)
    if whole:
        raise UsageError(
            f"whole-model weights ({', '.join(whole[:3])}) beside the rank files: which one is the model "
            "is unclear",
            path,
            "copy config.json and the rank files alone into a new folder and merge that",
        )
    exts = {n.rsplit(".", 1)[1] for n in ranks}
    if len(exts) > 1:
        raise CheckpointError(
            "rank files of both .pdparams and .safetensors", path, "merge a folder of one kind at a time"
        )
    groups: dict[tuple[int, int], list[RankFile]] = {}
    for n in sorted(ranks):
        t = _tags(n)
        groups.setdefault((t.get("tp", 0), t.get("pp", 0)), []).append(
            RankFile(n, t.get("tp", 0), t.get("pp", 0))
        )
    _check_complete(path, groups)
    return exts.pop(), groups


def _check_complete(path: Path, groups: dict[tuple[int, int], list[RankFile]]) -> None:
    """Refuse a gap in ``tp00..tpNN`` × ``pp00..ppMM``, naming the first missing file."""
    n_tp = 1 + max(tp for tp, _ in groups)
    n_pp = 1 + max(pp for _, pp in groups)
    some = next(iter(groups.values()))[0].rel
    for tp in range(n_tp):
        for pp in range(n_pp):
            if (tp, pp) not in groups:
                raise CheckpointError(
                    f"rank file {_renumber(some, tp, pp)} is missing (the files found are of tensor-parallel "
                    f"ranks 0..{n_tp - 1} and pipeline ranks 0..{n_pp - 1}); without it part of every split "
                    "tensor is lost",
                    path / _renumber(some, tp, pp),
                    "copy the missing rank file from the training run's output, then merge again",
                )


def read_ranks(
    path: Path, container: str, groups: dict[tuple[int, int], list[RankFile]]
) -> tuple[dict[int, dict[str, Slice]], dict[str, Any]]:
    """The tensors of each tensor-parallel rank: the union of its pipeline ranks' files.

    Returns:
        ``({tp: {name: Slice}}, the files' non-tensor entries merged into one dict: a .pdparams'
        ``StructuredToParameterName@@``, or a safetensors ``__metadata__``)``.

    Raises:
        RefusedError: a name in two pipeline ranks of one tensor-parallel rank with different bytes.
        CheckpointError, UnsafePickleError: a damaged or unsafe file (the readers'; nothing is unpickled).
    """
    by_tp: dict[int, dict[str, Slice]] = {}
    extras: dict[str, Any] = {}
    for (tp, _pp), files in sorted(groups.items()):
        own = by_tp.setdefault(tp, {})
        for rf in files:
            p = path / rf.rel
            if container == "pdparams":
                infos, ex, _ = pdparams_io.read_header(p, rf.rel)
                for k, v in ex.items():
                    if isinstance(v, dict) and isinstance(extras.get(k), dict):
                        extras[k].update(v)
                    else:
                        extras.setdefault(k, v)
            else:
                infos, meta = safetensors_io.read_header(p, rf.rel)
                extras.update(meta or {})
            for t in infos:
                if t.name in own:
                    _same_or_refuse(path, t.name, own[t.name], Slice(p, t), "pipeline ranks")
                    continue
                own[t.name] = Slice(p, t)
    return by_tp, extras


# ------------------------------------------------------------------------------------------ reading bytes
def _read(s: Slice) -> np.ndarray:
    """The slice's array in its storage dtype (bf16 as uint16 bits), C order."""
    if s.path.suffix == ".safetensors":
        return safetensors_io.read_array(s.path, s.info)
    return np.ascontiguousarray(pdparams_io.read_array(s.path, s.info))


def _raw(s: Slice) -> Source:
    """The slice's bytes in C order, by byte range when stored so (no memory)."""
    if s.path.suffix == ".safetensors":
        return Source(s.path, s.info.offset, s.info.nbytes)
    if s.info.fortran and len(s.info.shape) > 1:
        return Source(array=_read(s))
    return pdparams_io.raw_bytes_source(s.path, s.info)


def _same_or_refuse(path: Path, name: str, a: Slice, b: Slice, what: str) -> None:
    """Refuse when ``b`` differs from ``a`` (dtype, shape or bytes), naming both files."""
    same = a.info.dtype == b.info.dtype and a.info.shape == b.info.shape
    if same:
        x, y = _read(a).reshape(-1).view(np.uint8), _read(b).reshape(-1).view(np.uint8)
        step = 64 << 20  # chunks: a replicated embedding may be GBs (memory-mapped), no full-size mask
        same = all(np.array_equal(x[i : i + step], y[i : i + step]) for i in range(0, x.size, step))
    if not same:
        raise RefusedError(
            f"{name} must be equal in every one of its {what} but differs between {a.info.file} and "
            f"{b.info.file}; the rank files are not from one save",
            path / b.info.file,
            _FIX_RESAVE,
        )


# ------------------------------------------------------------------------------------------ planning
def config_dims(config: dict) -> dict[str, int]:
    """The config quantities :class:`TPRule` shapes name (``V``, ``H``, ``I``, ``Q``, ``KV``, ...); a
    quantity whose keys config.json lacks is left out (a rule that needs it refuses)."""

    def get(key: str) -> int | None:
        v = config.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    v, h, i, heads = (
        get("vocab_size"),
        get("hidden_size"),
        get("intermediate_size"),
        get("num_attention_heads"),
    )
    kv = get("num_key_value_heads") or heads
    d = get("head_dim") or (h // heads if h and heads else None)
    dims = {"V": v, "H": h, "I": i, "2I": 2 * i if i else None, "D": d, "D/2": d // 2 if d else None}
    dims["HEADS"] = heads
    if heads and kv and d:
        dims.update({"Q": heads * d, "KV": kv * d, "QKV": (heads + 2 * kv) * d, "GROUPS": heads // kv})
    return {k: x for k, x in dims.items() if x is not None}


# the config_dims symbol each config.json key gives (a key whose symbol is there is not missing)
_KEY_DIM = {"vocab_size": "V", "hidden_size": "H", "intermediate_size": "I", "num_attention_heads": "HEADS"}


def _expected(rule: TPRule, dims: dict[str, int], path: Path, name: str) -> tuple[int, ...]:
    missing = [s for s in rule.shape if s not in dims]
    if missing:
        wanted = dict.fromkeys(k for s in missing for k in arch.TP_DIM_KEYS.get(s, (s,)))
        keys = [k for k in wanted if _KEY_DIM.get(k) not in dims] or list(wanted)
        what = "a positive integer" if len(keys) == 1 else "positive integers"
        raise CheckpointError(
            f"config.json lacks {' / '.join(keys)} ({what}), which the merged shape of "
            f"{name} is checked against",
            path / "config.json",
            f"add {', '.join(keys)} to config.json as the training run wrote it",
        )
    return tuple(dims[s] for s in rule.shape)


def _head_axis(shape: tuple[int, ...], n: int, dims: dict[str, int]) -> int | None:
    """The vocabulary axis of one rank's head slice: 1 for ``[hidden, vocab / n]`` (a Paddle Linear, as
    PaddleNLP's untied head, is_column=True), 0 for ``[vocab / n, hidden]`` (embedding-shaped, PaddleNLP's
    tied head and PaddleFormers' legacy head, is_column=False); None when both or neither fit."""
    v, h = dims["V"], dims["H"]
    fits = [ax for ax in (0, 1) if len(shape) == 2 and shape[ax] * n == v and shape[1 - ax] == h]
    return fits[0] if len(fits) == 1 else None


_AXIS = {TPSplit.VOCAB: 0, TPSplit.ROW: 0, TPSplit.COLUMN: -1, TPSplit.FUSED_2: -1, TPSplit.FUSED_3: -1}


def _plan_one(path: Path, name: str, rule: TPRule, slices: tuple[Slice, ...], dims: dict[str, int]) -> Merged:
    """One tensor's merge: its axis, merged shape (checked against config.json) and dtype.

    Raises:
        RefusedError: ranks disagree on dtype or shape, a replicated tensor differs, or the merged shape
            does not fit config.json.
    """
    first = slices[0].info
    for s in slices[1:]:
        if s.info.dtype != first.dtype or s.info.shape != first.shape:
            raise RefusedError(
                f"{name} is {first.dtype} {list(first.shape)} in {first.file} but {s.info.dtype} "
                f"{list(s.info.shape)} in {s.info.file}; slices of one tensor are alike on every rank",
                path / s.info.file,
                _FIX_RESAVE,
            )
    want = _expected(rule, dims, path, name)
    n = len(slices)
    whole = first.shape == want or (rule.split is TPSplit.HEAD and first.shape == want[::-1])
    if rule.split is TPSplit.REPLICATED or n == 1 or whole:
        for s in slices[1:]:
            _same_or_refuse(path, name, slices[0], s, "tensor-parallel ranks (it is not split)")
        rule_used, axis, shape = TPSplit.REPLICATED, None, first.shape
    else:
        axis = _head_axis(first.shape, n, dims) if rule.split is TPSplit.HEAD else _AXIS[rule.split]
        if axis is None or not first.shape:
            raise _misfit(path, name, first, n, want)
        axis %= len(first.shape)
        shape = tuple(d * n if k == axis else d for k, d in enumerate(first.shape))
        if shape != want and not (rule.split is TPSplit.HEAD and shape == want[::-1]):
            raise _misfit(path, name, first, n, want)
        rule_used = rule.split
    parts = {TPSplit.FUSED_2: (1, 1), TPSplit.FUSED_3: (dims.get("GROUPS", 1), 1, 1)}.get(rule_used)
    dtype = "BF16" if first.st_dtype.st == "U16" else first.st_dtype.st
    return Merged(name, rule_used, axis, dtype, tuple(shape), slices, parts)


def _misfit(path: Path, name: str, first: TensorInfo, n: int, want: tuple[int, ...]) -> RefusedError:
    return RefusedError(
        f"{name} is {list(first.shape)} on each of {n} ranks, which does not join into {list(want)} as "
        "config.json says (vocab_size, hidden_size, intermediate_size, heads × head_dim); the config is "
        "not the rank files' or a rank file is from another model",
        path / first.file,
        "put the config.json saved with these rank files beside them, then merge again",
    )


def _rule(path: Path, model_type: str, name: str, file: str) -> TPRule:
    """The :class:`TPRule` of ``name``.

    Raises:
        RefusedError: a pipeline-layer name (``1.self_attn.q_proj.weight``: ``PipelineLayer``'s own naming,
            which says a stage-local layer index, not the model's layer), or a name the family's table
            does not list.
    """
    if name.split(".", 1)[0].isdigit():
        raise RefusedError(
            f"{name} is a pipeline-layer name (a PipelineLayer index, not the model's layer number): the "
            "file was saved without PaddleNLP's mapping back to the model's names, so its layer is unknown",
            path / file,
            "save the pipeline model with PaddleNLP's save_pretrained (it maps the names back), or merge it "
            "with PaddleNLP",
        )
    rule = arch.tp_rule(model_type, name)
    if rule is None:
        raise RefusedError(
            f"{name} is a tensor tietool does not know how {model_type} splits across ranks",
            path / file,
            "merge with the training library (PaddleNLP/PaddleFormers merge_tensor_parallel); tietool "
            "merges only tensors whose rule it knows",
        )
    return rule


def plan(path: Path, config: dict, by_tp: dict[int, dict[str, Slice]]) -> list[Merged]:
    """The merged tensors, in the order of rank 0's files, each with its rule (as the family's
    ``_get_tensor_parallel_mappings`` in :data:`surgery.arch.families.TENSOR_PARALLEL`).

    Raises:
        RefusedError: an unknown family or tensor (named), a tensor missing from a rank, or a shape that
            does not fit (:func:`_plan_one`).
    """
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CheckpointError(
            "config.json has no model_type (a string), so tietool cannot tell how the tensors were split",
            path / "config.json",
            'add "model_type" (e.g. "llama", "qwen2") as the training run wrote it',
        )
    if model_type not in arch.TENSOR_PARALLEL:
        raise RefusedError(
            f"tietool knows how tensor-parallel {', '.join(sorted(arch.TENSOR_PARALLEL))} checkpoints are "
            f"split, not model_type {model_type!r}; merging by guess could join slices wrongly",
            path / "config.json",
            "merge with the training library (PaddleNLP/PaddleFormers merge_tensor_parallel, or save with "
            "merge_tensor_parallel=True / a unified checkpoint)",
        )
    dims = config_dims(config)
    ranks = sorted(by_tp)
    out: list[Merged] = []
    for name, s0 in by_tp[ranks[0]].items():
        rule = _rule(path, model_type, name, s0.info.file)
        missing = [tp for tp in ranks if name not in by_tp[tp]]
        if missing:
            other = next(iter(by_tp[missing[0]].values())).info.file
            raise RefusedError(
                f"{name} is in {s0.info.file} but in no file of tensor-parallel rank {missing[0]} "
                f"({other}, ...)",
                path / other,
                _FIX_RESAVE,
            )
        out.append(_plan_one(path, name, rule, tuple(by_tp[tp][name] for tp in ranks), dims))
    extra = [(n, s) for tp in ranks[1:] for n, s in by_tp[tp].items() if n not in by_tp[ranks[0]]]
    if extra:
        raise RefusedError(
            f"{extra[0][0]} is in {extra[0][1].info.file} but in no file of tensor-parallel rank {ranks[0]}",
            path / extra[0][1].info.file,
            _FIX_RESAVE,
        )
    return out


# ------------------------------------------------------------------------------------------ joining
def join(arrays: list[np.ndarray], rule: TPSplit, axis: int, parts: tuple[int, ...] | None) -> np.ndarray:
    """Join the slices of one tensor (one array per rank, in rank order), as PaddleFormers'
    ``normal_fuse_merge_tp`` (plain concatenation on ``axis``) and ``naive_fuse_merge_tp`` (fused kinds:
    each rank's slice is cut into ``parts`` shares along ``axis`` — ``[gate_r, up_r]`` or ``[q_r, k_r, v_r]``
    — and the merged tensor is every rank's first part, then every rank's second, ...).

    Args:
        arrays: same shape and dtype (storage dtype: bf16 as uint16 bits; values are never touched).
        parts: None for a plain concatenation.

    Returns:
        the merged array, C order.
    """
    if parts is None:
        return np.concatenate(arrays, axis=axis)
    cut = np.cumsum([0, *parts])
    size = arrays[0].shape[axis]
    total = cut[-1]
    if size % total:
        raise ValueError(f"a fused slice of {size} does not split into shares {parts}")
    bounds = [(size * cut[k] // total, size * cut[k + 1] // total) for k in range(len(parts))]
    pieces = [np.take(a, np.arange(lo, hi), axis=axis) for lo, hi in bounds for a in arrays]
    return np.concatenate(pieces, axis=axis)


def source(m: Merged) -> Callable[[], Source]:
    """The merged tensor's bytes, made when written: replicated → rank 0's byte range; axis 0 → the ranks'
    byte ranges one after another (no memory); another axis or a fused kind → the slices loaded,
    joined (:func:`join`), released after the write."""
    if m.axis is None:
        return lambda: _raw(m.slices[0])
    if m.axis == 0 and m.parts is None:
        return lambda: Source(parts=[_raw(s) for s in m.slices])
    axis = m.axis
    return lambda: Source(array=join([_read(s) for s in m.slices], m.rule, axis, m.parts))


# ------------------------------------------------------------------------------------------ the operation
def _merged_config(config: dict) -> tuple[dict, dict[str, list]]:
    """config.json for the merged checkpoint: the parallel-run keys set to a single process's values
    (:data:`surgery.arch.families.PARALLEL_CONFIG_KEYS`). Returns it and ``{key: [before, after]}``."""
    out, changed = dict(config), {}
    for k, v in arch.PARALLEL_CONFIG_KEYS.items():
        if k in out and out[k] != v:
            changed[k] = [out[k], v]
            out[k] = v
    return out, changed


def _check_degree(path: Path, config: dict, n_tp: int, n_pp: int) -> None:
    """Refuse when config.json's parallel degree says more ranks than there are files."""
    for key, n in (("tensor_parallel_degree", n_tp), ("pipeline_parallel_degree", n_pp)):
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > n:
            raise CheckpointError(
                f"config.json {key} = {v} but only ranks 0..{n - 1} have files: the last ranks' files "
                "are missing",
                path,
                "copy every rank file the training run saved into the folder, then merge again",
            )


def _carried(path: Path, names: set[str], skip: set[str]) -> tuple[list[tuple[Path, str]], list[str]]:
    """Files copied unchanged (tokenizer, generation config) and files left out (training state, rank
    indexes, subfolders)."""
    carry, left = [], []
    for n in sorted(names):
        if n in skip or n in ("config.json", REPORT_NAME):
            continue
        p = path / n
        if (
            not p.is_file()
            or surface.TRAINING_STATE.match(n)
            or surface.RANK_RE.search(n)
            or n.endswith(surface.WEIGHT_EXT)
        ):
            left.append(n)
        else:
            require_regular(p, n)  # unreadable: refused now (exit 3), not met as a failed write
            carry.append((p, n))
    return carry, left


def _names(src: Path) -> set[str]:
    """The entries of the rank folder (files and subfolders).

    Raises:
        CheckpointError: the folder cannot be listed, or holds a FIFO, socket or device (or a link to
            one): a rank file or carried file that would block the read or the copy.
    """
    try:
        names = set()
        for p in src.iterdir():
            names.add(p.name)
            if p.exists() and not (p.is_file() or p.is_dir()):
                raise special_file(p, p.stat().st_mode)
        return names
    except OSError as e:
        raise unreadable_folder(src, e) from None


def _reporter(
    src: Path,
    dst: Path,
    config: dict,
    groups: dict[tuple[int, int], list[RankFile]],
    config_changes: dict[str, list],
    left: list[str],
    merged: list[Merged],
) -> Callable[[dict], dict]:
    """The report builder :func:`surgery.write.assemble.assemble` calls with the written-file facts."""
    files = sorted(rf.rel for fs in groups.values() for rf in fs)

    def report(facts: dict) -> dict:
        return {
            "operation": "merge",
            "dry_run": facts.pop("dry_run", False),
            "changed": True,
            "input": str(src),
            "output": str(dst),
            "tensor_parallel": 1 + max(t for t, _ in groups),
            "pipeline_parallel": 1 + max(p for _, p in groups),
            "model_type": config.get("model_type"),
            "rank_files": files,
            "config_changes": config_changes,
            "left_out": left,
            **facts,
            "tensors": [m.as_dict() for m in merged],
        }

    return report


def _require_readable(src: Path, groups: dict) -> None:
    """Every rank file is a readable regular file, checked before the first header is read.

    Raises:
        CheckpointError: naming the first that is not (:func:`surgery.io.regular.require_regular`).
    """
    for rf in (rf for fs in groups.values() for rf in fs):
        require_regular(src / rf.rel, rf.rel)


def merge(
    path: str | PathLike[str],
    out: str | PathLike[str],
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    dry_run: bool = False,
    progress: Callable[[int], AbstractContextManager[Callable[[str, int], None] | None]] | None = None,
) -> Report:
    """Merge tensor-parallel (and pipeline-parallel) rank files into one whole checkpoint in ``out``.

    Each tensor is joined by its family's rule, as the module docstring says. Values keep their dtype and
    bits (bf16 stays bf16).

    The output is in the rank files' container and names: ``model_state.pdparams`` (or shards of at most
    ``max_shard_size`` with ``model_state.pdparams.index.json``, as PaddleNLP's ``save_pretrained``),
    config.json with ``tensor_parallel_degree``-like keys set to 1, the other files copied, and
    ``tietool-report.json`` listing each tensor's rule and axis.

    Args:
        max_shard_size: bytes or a size (``"10GB"``, PaddleFormers' default).
        dry_run: check and plan everything (rank files read, shapes checked), write nothing; the report
            names the files a run would write.
        progress: given the bytes the output will hold, a context manager yielding ``advance(file, bytes)``
            or None (the operations' progress factory).

    Returns:
        the report (also ``out/tietool-report.json``).

    Raises:
        UsageError: no rank files, whole weights beside them, a bad ``out`` or ``max_shard_size``.
        CheckpointError: a rank file missing (named), damaged, or config.json lacking a size.
        RefusedError: an unknown family or tensor, a replicated tensor that differs between ranks, a
            shape that does not fit config.json. Nothing is written when any is raised.
        OutputError: the output cannot be written.
    """
    src, dst = _folders(path, out, dry_run)
    limit = parse_size(max_shard_size)
    names = _names(src)
    container, groups = find_ranks(src, names)
    _require_readable(src, groups)
    config, _, _ = read_config(src)
    n_tp, n_pp = 1 + max(t for t, _ in groups), 1 + max(p for _, p in groups)
    _check_degree(src, config, n_tp, n_pp)
    by_tp, extras = read_ranks(src, container, groups)
    merged = plan(src, config, by_tp)
    new_config, config_changes = _merged_config(config)
    carry, left = _carried(src, names, {rf.rel for fs in groups.values() for rf in fs})
    tensors = [OutTensor(m.name, m.dtype, m.shape, source(m)) for m in merged]

    report = _reporter(src, dst, config, groups, config_changes, left, merged)
    if dry_run:
        return Report(report(_planned(tensors, Container(container), limit, carry)))
    total = sum(t.nbytes for t in tensors)
    with (progress or (lambda _n: nullcontext(None)))(total) as advance:
        extras_of = {"st_metadata" if container == "safetensors" else "pdparams_extras": extras or None}
        rep = assemble(
            dst, tensors, Container(container), new_config, carry=carry, max_shard_size=limit,
            report=report, progress=advance, **extras_of,
        )  # fmt: skip
    return Report(rep)


def _planned(tensors: list[OutTensor], container: Container, limit: int, carry: list) -> dict:
    """The report facts of a dry run: the weight files, index and total size the output would have, and
    the files it would carry."""
    lay = layout(tensors, container, limit)
    planned = {"weight_files": list(lay.files), "index": lay.index, "total_size": lay.total_size}
    return {**planned, "carried": [n for _, n in carry], "dry_run": True}


def _folders(path: str | PathLike[str], out: str | PathLike[str], dry_run: bool) -> tuple[Path, Path]:
    """The rank folder and the output folder of :func:`merge`, checked (local, a folder, an output that
    is new or empty and outside the input; the output is not checked for a dry run).

    Raises:
        UsageError: a URL, or a bad ``out``. CheckpointError: ``path`` is not a folder.
    """
    from ..ops import _path
    from ..write.publish import check_output_path

    local_only("merge", path, out)
    src, dst = _path(path, "path"), _path(out, "out")
    if not src.is_dir():
        raise CheckpointError(
            "not a folder", src, "give the folder that holds the rank files and config.json"
        )
    if not dry_run:
        check_output_path(src, dst)
    return src, dst
