"""``tietool merge``: tensor-parallel (and pipeline-parallel) rank files into one whole checkpoint.

PaddleNLP and PaddleFormers write ``model_state.tp00.pdparams``, ``model_state.tp01.pdparams``, ... (and
``model_state.tp00_pp00.pdparams``, ``_pp01``, ...) when a model trained with tensor (pipeline) parallelism is
saved without merging. Each tensor-parallel rank holds a slice of each split tensor; each pipeline rank
holds some of the layers, under the whole model's names (PaddleNLP's ``PipelinePretrainedModel.state_dict``
maps the pipeline-layer names back to the single model's). The rules are the libraries' own
``_get_tensor_parallel_mappings`` (merge direction, ``split_or_merge_func(is_split=False)``), kept as data
in :data:`surgery.arch.TENSOR_PARALLEL`; this module only applies them:

1. :func:`find_ranks`: the rank files of a folder, grouped by ``(tp, pp)``; a missing rank is refused by
   the file name it would have.
2. :func:`read_ranks`: their headers (never unpickled: :mod:`.formats.pdparams`).
3. :func:`plan`: per tensor, its rule, axis and merged shape, checked against ``config.json``; replicated
   tensors (and a tensor in two pipeline ranks) compared byte for byte.
4. :func:`plan_merge` does 1-3 for a folder; :func:`output_plan` is the plan :func:`surgery.ops.merge`
   has the writer write (:func:`surgery.write.writer.write_new`), one tensor at a time: each merged tensor is
   a :class:`~surgery.plan.recipes.Joined` recipe; an axis-0 concatenation is a list of byte ranges (no
   memory); another axis loads the slices of one tensor, concatenates, writes and drops them. bf16
   (``uint16`` in ``.pdparams``) moves as bits, never converted.

The rules, per tensor: the embedding ``[V/n, H]`` per rank → ``[V, H]`` by rows; the head ``[H, V/n]`` →
``[H, V]`` (or ``[V/n, H]`` → ``[V, H]``, told from the shapes and ``vocab_size``); column-parallel weights
``[H, X/n]`` and biases ``[X/n]`` on their output axis; row-parallel weights ``[X/n, H]`` on their input
axis; fused gate-up / GQA qkv per rank interleaved; norms and row-parallel biases replicated (checked
equal). Pipeline ranks are unioned.

Every refusal is one line naming the file and a fix that cannot do damage; nothing is written then.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import arch
from ..arch import TPRule, TPSplit
from ..io import pdparams, safetensors_io, surface
from ..io.checkpoint import REPORT_NAME, read_config, refuse_state_only, special_file, unreadable_folder
from ..io.regular import require_regular
from ..model.enums import Container, Operation
from ..model.errors import CheckpointError, RefusedError, UsageError
from ..model.tensor import TensorInfo
from .merge_tie import TieFix
from .plan import OutTensor, Plan, Reshard, reshard_plan
from .recipes import Joined, Slice, read_slice

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


# ------------------------------------------------------------------------------------------ rank files
def _tags(name: str) -> dict[str, int]:
    return {m.group(1).lower(): int(m.group(2)) for m in _TAG_RE.finditer(name)}


def _renumber(name: str, tp: int, pp: int) -> str:
    """``name`` with its rank tags set to ``tp`` / ``pp`` (the name a missing rank's file would have)."""

    def sub(m: re.Match[str]) -> str:
        n = tp if m.group(1).lower() == "tp" else pp
        return str(m.group(0)[: -len(m.group(2))]) + f"{n:0{len(m.group(2))}d}"

    return _TAG_RE.sub(sub, name)


def find_ranks(path: Path, names: set[str]) -> tuple[str, dict[tuple[int, int], list[RankFile]]]:
    """The rank files of a folder, by ``(tp, pp)``: every rank of ``tp00..tpNN`` × ``pp00..ppMM``.

    Returns:
        ``(container: "pdparams" or "safetensors", {(tp, pp): [its files, by name]})``.

    Raises:
        UsageError: no rank files (nothing to merge), or whole-model weights beside them.
        CheckpointError: a Trainer checkpoint-N/ with optimizer_state/ or master_weight/ but no
            model_state/ (:func:`~tietool.surgery.io.checkpoint.refuse_state_only`).
        RefusedError: sharding rank files (``shard00``): not joined, named as such (expert-parallel ones
            are :mod:`.merge_experts`').
        CheckpointError: rank files of both containers, or a rank missing (named by its file name).
    """
    ranks = [n for n in surface.rank_files(names) if n.endswith(surface.WEIGHT_EXT)]
    if not ranks:
        refuse_state_only(path)
        raise UsageError(
            "no tensor- or pipeline-parallel rank files (model_state.tp00.pdparams, ...) in the folder; "
            "nothing to merge",
            path,
            "give the folder the training run saved its rank files in",
        )
    cause = surface.rank_cause(ranks)
    if cause not in (surface.Cause.TENSOR_PARALLEL, surface.Cause.PIPELINE_PARALLEL):
        raise surface.refuse(
            cause,
            path,
            f"{surface.few(ranks)}; merge joins tensor-, pipeline- and expert-parallel rank files only",
        )
    refuse_whole_beside(path, names, ranks)
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
                infos, ex, _ = pdparams.read_header(p, rf.rel)
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
                    same_or_refuse(path, t.name, own[t.name], Slice(p, t), "pipeline ranks")
                    continue
                own[t.name] = Slice(p, t)
    return by_tp, extras


def same_or_refuse(path: Path, name: str, a: Slice, b: Slice, what: str) -> None:
    """Refuse when ``b`` differs from ``a`` (dtype, shape or bytes), naming both files."""
    same = a.info.dtype == b.info.dtype and a.info.shape == b.info.shape
    if same:
        x, y = read_slice(a).reshape(-1).view(np.uint8), read_slice(b).reshape(-1).view(np.uint8)
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
def config_dims(config: dict[str, Any]) -> dict[str, int]:
    """The config quantities :class:`TPRule` shapes name (``V``, ``H``, ``I``, ``Q``, ``KV``, ...); a
    quantity whose keys config.json lacks is left out (a rule that needs it refuses)."""

    def get(key: str) -> int | None:
        v = config.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    key = arch.TP_SIZE_KEYS
    v, h, i, heads = get(key["V"]), get(key["H"]), get(key["I"]), get(key["HEADS"])
    kv = get(key["KV_HEADS"]) or heads
    d = get(key["HEAD_DIM"]) or (h // heads if h and heads else None)
    dims = {"V": v, "H": h, "I": i, "2I": 2 * i if i else None, "D": d, "D/2": d // 2 if d else None}
    dims["HEADS"] = heads
    if heads and kv and d:
        dims.update({"Q": heads * d, "KV": kv * d, "QKV": (heads + 2 * kv) * d, "GROUPS": heads // kv})
    return {k: x for k, x in dims.items() if x is not None}


def _expected(rule: TPRule, dims: dict[str, int], path: Path, name: str) -> tuple[int, ...]:
    missing = [s for s in rule.shape if s not in dims]
    if missing:
        wanted = dict.fromkeys(k for s in missing for k in arch.TP_DIM_KEYS.get(s, (s,)))
        keys = [k for k in wanted if arch.KEY_DIM.get(k) not in dims] or list(wanted)
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


def _plan_one(
    path: Path, name: str, rule: TPRule, slices: tuple[Slice, ...], dims: dict[str, int]
) -> OutTensor:
    """One tensor's merge: its axis, merged shape (checked against config.json) and dtype; its data the
    :class:`~surgery.plan.recipes.Joined` slices.

    The rule used is ``REPLICATED`` also for a split rule whose every rank holds the whole tensor
    (PaddleNLP keeps k/v whole when kv_heads % tp != 0, the embedding and head when vocab_size % tp != 0);
    fused kinds join by ``parts``, the shares of each part in a rank's slice (``(1, 1)`` gate/up,
    ``(g, 1, 1)`` q/k/v with g = kv groups). The dtype is the safetensors label of the logical dtype.

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
            same_or_refuse(path, name, slices[0], s, "tensor-parallel ranks (it is not split)")
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
    return OutTensor(name, dtype, tuple(shape), Joined(slices, rule_used, axis, parts))


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


def plan(path: Path, config: dict[str, Any], by_tp: dict[int, dict[str, Slice]]) -> list[OutTensor]:
    """The merged tensors, in the order of rank 0's files, each with its rule (as the family's
    ``_get_tensor_parallel_mappings`` in :data:`surgery.arch.TENSOR_PARALLEL`).

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
    out: list[OutTensor] = []
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


# ------------------------------------------------------------------------------------------ the operation
def merged_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """config.json for the merged checkpoint: the parallel-run keys set to a single process's values
    (:data:`surgery.arch.PARALLEL_CONFIG_KEYS`). Returns it and ``{key: [before, after]}``."""
    out, changed = dict(config), {}
    for k, v in arch.PARALLEL_CONFIG_KEYS.items():
        if k in out and out[k] != v:
            changed[k] = [out[k], v]
            out[k] = v
    return out, changed


def check_degree(path: Path, config: dict[str, Any], n_tp: int, n_pp: int) -> None:
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


def carried(path: Path, names: set[str], skip: set[str]) -> tuple[list[tuple[Path, str]], list[str]]:
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


def refuse_whole_beside(path: Path, names: set[str], ranks: list[str]) -> None:
    """Refuse whole-model weight files beside the rank files ``ranks`` of the folder ``path`` (its file
    ``names``): which one is the model is unclear.

    Raises:
        UsageError: naming the first few.
    """
    whole = sorted(n for n in names if n.endswith(surface.WEIGHT_EXT) and n not in ranks)
    if whole:
        raise UsageError(
            f"whole-model weights ({', '.join(whole[:3])}) beside the rank files: which one is the model "
            "is unclear",
            path,
            "copy config.json and the rank files alone into a new folder and merge that",
        )


def folder_names(src: Path) -> set[str]:
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


def require_readable(src: Path, groups: dict[tuple[int, int], list[RankFile]]) -> None:
    """Every rank file is a readable regular file, checked before the first header is read.

    Raises:
        CheckpointError: naming the first that is not (:func:`surgery.io.regular.require_regular`).
    """
    for rf in (rf for fs in groups.values() for rf in fs):
        require_regular(src / rf.rel, rf.rel)


@dataclass
class MergePlan:
    """What :func:`tietool.merge` writes, planned from the rank files' headers (nothing written yet).

    Attributes:
        path: the rank folder.
        container: ``"pdparams"`` or ``"safetensors"`` (the rank files').
        groups: the rank files by ``(tp, pp)`` (:func:`find_ranks`).
        config: the rank folder's config.json; ``new_config`` the merged one, ``config_changes`` its
            ``{key: [before, after]}`` (:func:`merged_config`).
        by_tp: each tensor-parallel rank's tensors (:func:`read_ranks`); ``extras`` their non-tensor entries.
        merged: the merged tensors in order (:func:`plan`).
        carry: ``(source, name)`` copied unchanged; ``left``: the folder's names left out (:func:`carried`).
        expert_parallel: the number of expert-parallel ranks joined (1: a tensor/pipeline merge);
            ``expert_numbering`` how they numbered their experts (:mod:`.merge_experts`), else None.
        tie: the :class:`~surgery.plan.merge_tie.TieFix` the tie check made (a head trained apart under a
            tied flag: kept, the flags set false in ``new_config``), else None.
    """

    path: Path
    container: str
    groups: dict[tuple[int, int], list[RankFile]]
    config: dict[str, Any]
    new_config: dict[str, Any]
    config_changes: dict[str, list[Any]]
    by_tp: dict[int, dict[str, Slice]]
    extras: dict[str, Any]
    merged: list[OutTensor]
    carry: list[tuple[Path, str]]
    left: list[str]
    expert_parallel: int = 1
    expert_numbering: list[str] | None = None
    tie: TieFix | None = None

    @property
    def rank_files(self) -> list[str]:
        """Every rank file, sorted by name."""
        return sorted(rf.rel for fs in self.groups.values() for rf in fs)


def plan_merge(src: Path) -> MergePlan:
    """The merge of the rank folder ``src`` (a local folder): rank files found and checked readable,
    config.json read and its parallel degree checked, every header read, every tensor planned
    (:func:`plan`), the merged config and the carried files.

    Expert-parallel rank files (``moe_sharding00``, ``moe00``) are not this function's:
    :func:`surgery.plan.merge_experts.plan_rank_merge` hands them to
    :func:`~surgery.plan.merge_experts.plan_expert_merge` (it builds on this module's helpers, so this
    module does not import it).

    Raises:
        UsageError, CheckpointError, RefusedError: as :func:`find_ranks`, :func:`read_ranks`, :func:`plan`,
            :func:`check_degree`, :func:`require_readable` and :func:`carried` say; nothing is written.
    """
    names = folder_names(src)
    container, groups = find_ranks(src, names)
    require_readable(src, groups)
    config, _, _ = read_config(src)
    n_tp, n_pp = 1 + max(t for t, _ in groups), 1 + max(p for _, p in groups)
    check_degree(src, config, n_tp, n_pp)
    by_tp, extras = read_ranks(src, container, groups)
    merged = plan(src, config, by_tp)
    new_config, config_changes = merged_config(config)
    carry, left = carried(src, names, {rf.rel for fs in groups.values() for rf in fs})
    return MergePlan(
        src, container, groups, config, new_config, config_changes, by_tp, extras, merged, carry, left
    )


def output_plan(plan: MergePlan, max_shard_size: int) -> Plan:
    """The :class:`~surgery.plan.plan.Plan` the merge ``plan`` writes: the merged tensors in the rank files'
    container, in shards of at most ``max_shard_size`` bytes, the merged config, the carried files and the
    rank files' non-tensor entries (a safetensors ``__metadata__`` or a ``.pdparams``'
    ``StructuredToParameterName@@``)."""
    container = Container(plan.container)
    st = container is Container.SAFETENSORS
    layout = Reshard(
        container,
        max_shard_size,
        plan.merged,
        plan.new_config,
        carry=plan.carry,
        st_metadata=(plan.extras or None) if st else None,
        pdparams_extras=None if st else (plan.extras or None),
    )
    return reshard_plan(Operation.MERGE, None, layout, plan)
