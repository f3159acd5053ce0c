"""``tietool merge`` of expert-parallel rank files: the union of the ranks' experts, the rest once.

PaddleFormers 1.2's trainer saves a model trained with expert parallelism (``expert_model_parallel_size``
> 1) without merging as ``model_state.moe_sharding00.pdparams``, ``model_state.moe_sharding01.pdparams``,
... (``TrainingArguments.weight_name_suffix``: ``moe_sharding{expert_parallel_rank:02d}``; with
``safe_serialization`` the same tag in ``model.moe_sharding00.safetensors``); PaddleNLP 2.8's ``moe_group``
saves (``use_expert_parallel`` with ``expert_model_parallel_size`` 1) tag them ``moe00``, one per
data-parallel rank. Each file holds the whole embedding, attention, router, shared experts and head (its
own copy) and some of the routed experts, ``<module>.experts.<id>.<rest>``
(:data:`surgery.arch.EXPERT_NAME_RE`), numbered either globally (rank 1 of 2 with 4 experts holds 2 and 3:
the d06 case) or locally (every rank 0..E/ep-1).

The numbering is proven per expert module from the ids alone, with the config's number of routed experts E
(:data:`surgery.arch.EXPERT_COUNT_KEYS`) and the rank from the file name:

* **global**: the ranks' id sets are disjoint and their union is exactly ``0..E-1``: names kept;
* **local**: every rank holds the same ids ``0..m-1`` and ``m × ranks == E``: expert ``j`` of rank ``r``
  becomes ``r × m + j`` (the expert-parallel split of PaddleFormers' MoE layers: rank r owns the r-th
  contiguous block of E/ep experts);
* **replicated**: every rank holds all E experts: kept once, checked equal bit for bit;
* anything else (overlapping but unequal sets, gaps, no known E) is refused naming the cause.

Every tensor that is not a routed expert's must be in every rank and equal bit for bit (else refused by
name: the files are not from one save, or a stacked-experts tensor tietool cannot split). Tensors move as
byte ranges (bf16 stays bits); nothing is unpickled. The output is what :mod:`.merge` writes for
tensor-parallel files (same container, report, carried files).
"""

from __future__ import annotations

import re
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

from .. import arch
from ..arch import TPSplit
from ..io import surface
from ..io.checkpoint import read_config
from ..model.errors import CheckpointError, RefusedError
from .merge import (
    MergePlan,
    RankFile,
    carried,
    folder_names,
    merged_config,
    plan_merge,
    read_ranks,
    refuse_whole_beside,
    require_readable,
    same_or_refuse,
)
from .merge_tie import changed, check_tie, joined_view
from .plan import OutTensor
from .recipes import Joined, Slice

_EP_TAGS = ("moe_sharding", "moe")
ID_DIGITS = 64
"""The most digits of an expert id read from a tensor name: ids far beyond any expert count are still
compared with it (:func:`numbering`), while one of thousands of digits is refused where it is parsed,
never converted to an integer (Python's 4,300-digit limit)."""
_FIX_RESAVE = "re-save the rank files from the training run's last checkpoint (they are written together)"
_FIX_COPY = "copy every rank file the training run saved into the folder, then merge again"


class Numbering(str, Enum):
    """How the rank files of one expert module number its experts."""

    GLOBAL = "global"  # disjoint ids whose union is 0..E-1: names kept
    LOCAL = "local"  # every rank 0..m-1, m x ranks == E: renumbered rank x m + id
    REPLICATED = "replicated"  # every rank holds every expert: kept once, checked equal


def is_expert_parallel(names: set[str]) -> bool:
    """The folder's rank files are expert-parallel ones (a ``moe_sharding`` / ``moe`` tag; :data:`surface
    .RANK_TAGS`)."""
    ranks = [n for n in surface.rank_files(names) if n.endswith(surface.WEIGHT_EXT)]
    return bool(ranks) and surface.rank_cause(ranks) is surface.Cause.EXPERT_PARALLEL


# the fix where merge itself cannot join the files: the training library reads its own layout
_SAVE_WHOLE = (
    "load the training checkpoint in PaddleFormers/PaddleNLP on the same parallel layout and save it whole "
    "(save_pretrained or a unified checkpoint), then run tietool on that folder"
)


def find_expert_ranks(path: Path, names: set[str]) -> tuple[str, list[str]]:
    """The expert-parallel rank files of a folder, by rank (``rank r`` is ``files[r]``).

    Returns:
        ``(container: "pdparams" or "safetensors", [the file of rank 0, rank 1, ...])``.

    Raises:
        RefusedError: expert-parallel tags combined with tensor-, pipeline-parallel or sharding tags, or
            both ``moe`` and ``moe_sharding`` tags, or two files of one rank: not joined (named).
        UsageError: whole-model weights beside the rank files.
        CheckpointError: rank files of both containers, or a rank missing (named by its file name).
    """
    ranks = sorted(n for n in surface.rank_files(names) if n.endswith(surface.WEIGHT_EXT))
    tags = {n: surface.rank_tags(n) for n in ranks}
    mixed = sorted({t for ts in tags.values() for t in ts} - set(_EP_TAGS))
    kinds = sorted({t for ts in tags.values() for t in ts} & set(_EP_TAGS))
    if mixed or len(kinds) > 1 or any(len(ts) != 1 for ts in tags.values()):
        raise RefusedError(
            f"expert-parallel rank files of a run with more than expert parallelism ({surface.few(ranks)}: "
            f"tagged {', '.join(mixed + kinds)}); tietool merge joins files of one moe_sharding / moe tag "
            "only",
            path,
            _SAVE_WHOLE,
        )
    refuse_whole_beside(path, names, ranks)
    if len({n.rsplit(".", 1)[1] for n in ranks}) > 1:
        raise CheckpointError(
            "rank files of both .pdparams and .safetensors", path, "merge a folder of one kind at a time"
        )
    return ranks[0].rsplit(".", 1)[1], _by_rank(
        path, ranks, {n: next(iter(t.values())) for n, t in tags.items()}
    )


def _by_rank(path: Path, ranks: list[str], rank_of: dict[str, int]) -> list[str]:
    """``ranks`` ordered by rank, every rank 0..n-1 once.

    Raises:
        RefusedError: two files of one rank (a rank's shards: not joined).
        CheckpointError: a missing rank, named by the file name it would have.
    """
    by: dict[int, str] = {}
    for n in ranks:
        if rank_of[n] in by:
            raise RefusedError(
                f"{by[rank_of[n]]} and {n} are both of expert rank {rank_of[n]}; tietool merge joins one "
                "file a rank",
                path,
                _SAVE_WHOLE,
            )
        by[rank_of[n]] = n
    for r in range(1 + max(by)):
        if r not in by:
            some = by[min(by)]
            m = re.search(r"(?<=moe)(?:_sharding)?(\d+)(?=[._-])", some)
            assert m is not None  # a moe / moe_sharding tag: surface.RANK_RE found it
            missing = f"{some[: m.start(1)]}{r:0{len(m.group(1))}d}{some[m.end(1) :]}"
            raise CheckpointError(
                f"rank file {missing} is missing (the files found are of expert ranks 0..{max(by)}); without "
                "it its experts are lost",
                path / missing,
                _FIX_COPY,
            )
    return [by[r] for r in range(len(by))]


def check_ep_degree(path: Path, config: dict[str, Any], files: list[str]) -> None:
    """config.json's ``expert_model_parallel_size`` (PaddleFormers' config records it when it is not 1)
    agrees with the number of ``moe_sharding`` rank files.

    Raises:
        CheckpointError: it says more ranks than there are files (the last ones missing).
        RefusedError: it says fewer (the files are not of that run).
    """
    v = config.get("expert_model_parallel_size")
    if not (isinstance(v, int) and not isinstance(v, bool) and v > 1) or "moe_sharding" not in files[0]:
        return
    if v > len(files):
        raise CheckpointError(
            f"config.json expert_model_parallel_size = {v} but only expert ranks 0..{len(files) - 1} have "
            "files: the last ranks' files are missing",
            path,
            _FIX_COPY,
        )
    if v < len(files):
        raise RefusedError(
            f"config.json expert_model_parallel_size = {v} but there are {len(files)} expert rank files: "
            "the files are not all of the run this config is from",
            path,
            _FIX_RESAVE,
        )


def _at(config: dict[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` (``text_config.n_routed_experts``) of ``config``, or None."""
    v: Any = config
    for part in dotted.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def expert_count(path: Path, config: dict[str, Any]) -> tuple[int | None, str]:
    """The number of routed experts config.json gives (:data:`surgery.arch.EXPERT_COUNTS` of its model_type),
    and the keys it is read from (for messages).

    Returns:
        ``(count or None: config.json lacks the family's keys, "key / key")``.

    Raises:
        CheckpointError: a key of the family that is not a positive integer (a list: ERNIE's multimodal
            text/vision experts), or two keys with different values.
        RefusedError: a model_type whose expert count no test has proven (named, with the keys the config
            has of those the libraries ship, :data:`surgery.arch.SHIPPED_EXPERT_COUNT_KEYS`).
    """
    model_type = config.get("model_type")
    row = arch.EXPERT_COUNTS.get(model_type) if isinstance(model_type, str) else None
    if row is None:
        raise _unproven_family(path, config)
    got = {k: v for k in row.keys if (v := _at(config, k)) is not None}
    bad = {k: v for k, v in got.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0}
    if bad:
        k, v = next(iter(bad.items()))
        raise CheckpointError(
            f"config.json {k} = {v!r} is not a positive integer (the number of routed experts of each MoE "
            "layer, which the rank files' expert ids are checked against)",
            path / "config.json",
            f"set {k} to the number of routed experts the training run used",
        )
    if len(set(got.values())) > 1:
        raise CheckpointError(
            f"config.json gives the number of experts twice, differently ({got})",
            path / "config.json",
            "keep the value the training run used in both keys",
        )
    return (next(iter(got.values())) if got else None), " / ".join(row.keys)


def _unproven_family(path: Path, config: dict[str, Any]) -> RefusedError:
    """The refusal of expert-parallel rank files of a model type :data:`surgery.arch.EXPERT_COUNTS` lacks."""
    blocks = [("", config)] + [(f"{k}.", v) for k, v in config.items() if isinstance(v, dict)]
    has = [f"{pre}{k} = {b[k]!r}" for pre, b in blocks for k in arch.SHIPPED_EXPERT_COUNT_KEYS if k in b]
    found = f"config.json has {', '.join(has)}" if has else "config.json has none of them"
    return RefusedError(
        f"expert-parallel rank files of model_type {config.get('model_type')!r}, whose expert numbering is "
        f"unproven ({found}; the proven types, EXPERT_COUNTS, read "
        f"{' / '.join(arch.SHIPPED_EXPERT_COUNT_KEYS)})",
        path / "config.json",
        "save it whole from the training library (expert_model_parallel_size 1 or a unified checkpoint), or "
        "add the model type to EXPERT_COUNTS in surgery/arch/parallel.py with a test",
    )


def numbering(
    path: Path, module: str, ids: list[set[int]], count: int | None, what: str
) -> tuple[Numbering, dict[int, tuple[int, int]]]:
    """How the ranks number the experts of ``module`` (``ids[r]``: the ids in rank r's file), and where each
    global expert is: ``{global id: (rank, id in that rank's file)}``.

    Raises:
        RefusedError: no expert count (``count`` None: the numbering, and a missing last rank, cannot be
            told), or ids that fit no numbering (named with the ranks' ids and the count).
    """
    n = len(ids)
    seen = sorted(set().union(*ids))
    if count is None:
        raise _no_count(path, module, ids, what)
    held = sum(len(s) for s in ids)
    if held == len(seen) == count and seen[0] == 0 and seen[-1] == count - 1:  # sorted, distinct: 0..E-1
        return Numbering.GLOBAL, {g: (r, g) for r, s in enumerate(ids) for g in s}
    same = all(s == ids[0] for s in ids) and ids[0] == set(range(len(ids[0])))
    if n > 1 and same:
        m = len(ids[0])
        if m * n == count:
            return Numbering.LOCAL, {r * m + j: (r, j) for r in range(n) for j in range(m)}
        if m == count:
            return Numbering.REPLICATED, {j: (0, j) for j in range(m)}
    holds = "; ".join(f"rank {r} {_ids(s)}" for r, s in enumerate(ids))
    if seen[-1] >= count:  # never a range of the id or the count: either may be any size (bounded here)
        cause = f"expert id {seen[-1]} is beyond the count (ids run 0..{count - 1})"
    elif held == len(seen):
        cause = f"no rank file holds expert(s) {_gap(seen, count)}: a rank file is missing"
    elif same:
        cause = (
            f"numbered locally, {len(ids[0])} experts × {n} ranks = {len(ids[0]) * n}, not {count}: a rank "
            "file is missing, or config.json is not the run's"
        )
    else:
        cause = (
            "the ids fit neither global numbering (disjoint, 0..E-1 together) nor local (each rank 0..E/n-1)"
        )
    missing = seen[-1] < count and held == len(seen)
    raise RefusedError(
        f"{module}: the {n} rank files hold experts {holds}, config.json {what} = {count}: {cause}",
        path,
        _FIX_COPY if missing else _FIX_RESAVE,
    )


def _no_count(path: Path, module: str, ids: list[set[int]], what: str) -> RefusedError:
    """The refusal of expert rank files whose config gives no expert count."""
    if len(ids) > 1 and all(s == ids[0] for s in ids):
        how, use = f"locally (every rank {_ids(ids[0])})", "to renumber them by (expert r × E/n + id)"
    else:
        how, use = f"{_ids(set().union(*ids))} in {len(ids)} files", "to prove that no rank file is missing"
    return RefusedError(
        f"{module}: the rank files number its experts {how}, and config.json has no expert count "
        f"({what}) {use}",
        path / "config.json",
        f"add {what.split(' / ')[0]} (the number of routed experts of each MoE layer) to config.json as the "
        "training run set it, then merge again",
    )


def _gap(seen: list[int], count: int) -> str:
    """The ids of ``0..count-1`` that ``seen`` (sorted, all below ``count``) lacks, listed when few; the
    count alone when there are more than the files could name (a count of 2**64 is never made a range)."""
    if count - len(seen) > 64:
        return f"{count - len(seen)} of ids 0..{count - 1} (it holds {len(seen)})"
    return _ids(set(range(count)) - set(seen))


def _ids(s: set[int]) -> str:
    v = sorted(s)
    if len(v) > 2 and v[-1] - v[0] + 1 == len(v):  # distinct ids: a run (no list of the span is built)
        return f"{v[0]}-{v[-1]}"
    return ", ".join(map(str, v)) or "none"


def _split_names(own: dict[str, Slice]) -> tuple[list[str], dict[str, dict[int, list[str]]]]:
    """A rank's names: the ones of no routed expert (in file order), and ``{module: {id: [rest, ...]}}``."""
    others: list[str] = []
    experts: dict[str, dict[int, list[str]]] = {}
    for name in own:
        m = arch.EXPERT_NAME_RE.match(name)
        if m is None:
            others.append(name)
        else:
            experts.setdefault(m["module"], {}).setdefault(_expert_id(m["id"], name, own[name]), []).append(
                m["rest"]
            )
    return others, experts


def _expert_id(digits: str, name: str, where: Slice) -> int:
    """The expert id of tensor ``name`` (its ``digits``), at most :data:`ID_DIGITS` digits long.

    Raises:
        CheckpointError: a longer id, naming the tensor and its file.
    """
    if len(digits) > ID_DIGITS:
        raise CheckpointError(
            f"{name[:60]}... has an expert id of {len(digits):,} digits, more than the {ID_DIGITS} tietool "
            "reads",
            where.path,
            _FIX_RESAVE,
        )
    return int(digits)


def _replicated(path: Path, by_rank: list[dict[str, Slice]], others: list[str]) -> None:
    """Every rank holds the tensors of no routed expert that rank 0 holds, equal bit for bit, and no other.

    Raises:
        RefusedError: a tensor missing from a rank, extra in one, or different (named with both files).
    """
    for own in by_rank[1:]:
        mine = _split_names(own)[0]
        extra = sorted(set(mine) - set(others)) or sorted(set(others) - set(mine))
        if extra:
            name = extra[0]
            where, other = (own, by_rank[0]) if name in own else (by_rank[0], own)
            raise RefusedError(
                f"{name} is in {where[name].info.file} but not in {next(iter(other.values())).info.file}; "
                "each expert-parallel rank holds its own copy of every tensor that is not a routed expert's",
                path / where[name].info.file,
                _FIX_RESAVE,
            )
        for name in others:
            same_or_refuse(path, name, by_rank[0][name], own[name], "expert-parallel ranks (not an expert)")


def _module_tensors(
    path: Path,
    module: str,
    by_rank: list[dict[str, Slice]],
    per_rank: list[dict[int, list[str]]],
    count: int | None,
    what: str,
) -> tuple[Numbering, list[OutTensor]]:
    """The merged tensors of expert module ``module``, by global expert id, each expert's tensors in rank 0's
    order.

    Raises:
        RefusedError: as :func:`numbering`; experts with other tensors, dtypes or shapes than expert 0's;
            (replicated) an expert that differs between ranks.
    """
    kind, where = numbering(path, module, [set(p) for p in per_rank], count, what)
    r0, j0 = where[0]
    rests = per_rank[r0][j0]
    first = {rest: by_rank[r0][f"{module}.{j0}.{rest}"].info for rest in rests}
    out = []
    for g in sorted(where):
        r, j = where[g]
        if per_rank[r][j] != rests:
            raise RefusedError(
                f"{module}.{j} in {by_rank[r][f'{module}.{j}.{per_rank[r][j][0]}'].info.file} holds "
                f"{', '.join(per_rank[r][j])}, expert {j0} of {first[rests[0]].file} {', '.join(rests)}",
                path,
                _FIX_RESAVE,
            )
        for rest in rests:
            s = by_rank[r][f"{module}.{j}.{rest}"]
            if (s.info.dtype, s.info.shape) != (first[rest].dtype, first[rest].shape):
                raise RefusedError(
                    f"{module}.{j}.{rest} is {s.info.dtype} {list(s.info.shape)} in {s.info.file}, expert "
                    f"{j0}'s {first[rest].dtype} {list(first[rest].shape)}; the experts of a layer are alike",
                    path / s.info.file,
                    _FIX_RESAVE,
                )
            if kind is Numbering.REPLICATED:
                for other in by_rank[1:]:
                    same_or_refuse(
                        path,
                        f"{module}.{j}.{rest}",
                        s,
                        other[f"{module}.{j}.{rest}"],
                        "expert-parallel ranks (every rank holds every expert)",
                    )
            rule = TPSplit.REPLICATED if kind is Numbering.REPLICATED else TPSplit.EXPERT
            out.append(_whole(f"{module}.{g}.{rest}", s, rule))
    return kind, out


def _whole(name: str, s: Slice, rule: TPSplit) -> OutTensor:
    """Output tensor ``name``: the bytes of slice ``s`` unchanged (bf16 bits stay bits)."""
    dtype = "BF16" if s.info.st_dtype.st == "U16" else s.info.st_dtype.st
    return OutTensor(name, dtype, tuple(s.info.shape), Joined((s,), rule, None))


def plan_experts(
    path: Path, config: dict[str, Any], by_rank: list[dict[str, Slice]]
) -> tuple[list[OutTensor], dict[str, Numbering]]:
    """The merged tensors, in rank 0's order (each expert module's experts, by global id, where rank 0's
    first expert of it is), and each module's :class:`Numbering`.

    Raises:
        RefusedError, CheckpointError: as :func:`_replicated`, :func:`expert_count`, :func:`numbering`,
            :func:`_module_tensors`; a module in some ranks only.
    """
    count, what = expert_count(path, config)
    others, _ = _split_names(by_rank[0])
    _replicated(path, by_rank, others)
    per_rank = [_split_names(own)[1] for own in by_rank]
    modules = list(per_rank[0])
    for r, p in enumerate(per_rank):
        odd = sorted(set(p) ^ set(modules))
        if odd:
            lacking = next(iter(by_rank[r if odd[0] not in p else 0].values())).info.file
            raise RefusedError(
                f"{odd[0]} has experts in some rank files only (none in {lacking}); every expert-parallel "
                "rank holds experts of every MoE layer",
                path,
                _FIX_RESAVE,
            )
    merged: dict[str, list[OutTensor]] = {}
    kinds: dict[str, Numbering] = {}
    for module in modules:
        kinds[module], merged[module] = _module_tensors(
            path, module, by_rank, [p[module] for p in per_rank], count, what
        )
    out: list[OutTensor] = []
    for name, s in by_rank[0].items():
        m = arch.EXPERT_NAME_RE.match(name)
        if m is None:
            out.append(_whole(name, s, TPSplit.REPLICATED))
        elif m["module"] in merged:
            out += merged.pop(m["module"])
    return out, kinds


def _extras(extras: dict[str, Any], merged: list[OutTensor]) -> dict[str, Any]:
    """The output's non-tensor entries: a ``.pdparams``' ``StructuredToParameterName@@`` (each rank numbers
    its parameters on its own, so two ranks' experts share parameter names) keeps the ranks' parameter name
    for every tensor of no expert and maps each expert tensor to its own name (as the writer does for a new
    tensor)."""
    out = dict(extras)
    key = "StructuredToParameterName@@"
    s2p = out.get(key)
    if isinstance(s2p, dict):
        out[key] = {
            t.name: t.name
            if isinstance(t.recipe, Joined) and t.recipe.rule is TPSplit.EXPERT
            else s2p.get(t.name, t.name)
            for t in merged
        }
    return out


def plan_expert_merge(src: Path, names: set[str]) -> MergePlan:
    """The merge of the expert-parallel rank folder ``src`` (:func:`surgery.plan.merge.plan_merge` hands
    it over): rank files found by rank and checked readable, headers read, every tensor planned
    (:func:`plan_experts`), the merged config and the carried files.

    Raises:
        UsageError, CheckpointError, RefusedError: as :func:`find_expert_ranks` and :func:`plan_experts`
            say; nothing is written.
    """
    container, files = find_expert_ranks(src, names)
    groups = {(r, 0): [RankFile(f, 0, 0)] for r, f in enumerate(files)}
    require_readable(src, groups)
    config, _, _ = read_config(src)
    check_ep_degree(src, config, files)
    by_tp, extras = read_ranks(src, container, groups)
    by_rank = [by_tp[r] for r in range(len(files))]
    merged, kinds = plan_experts(src, config, by_rank)
    new_config, config_changes = merged_config(config)
    carry, left = carried(src, names, set(files))
    return MergePlan(
        src,
        container,
        {(0, 0): [RankFile(f, 0, 0) for f in files]},
        config,
        new_config,
        config_changes,
        by_tp,
        _extras(extras, merged),
        merged,
        carry,
        left,
        expert_parallel=len(files),
        expert_numbering=sorted({k.value for k in kinds.values()}),
    )


def plan_rank_merge(src: Path) -> MergePlan:
    """The merge of the rank folder ``src``: expert-parallel rank files (``moe_sharding00``, ``moe00``) by
    :func:`plan_expert_merge`, tensor- and pipeline-parallel ones by :func:`surgery.plan.merge.plan_merge`;
    then the tie check on the merged tensors (:func:`surgery.plan.merge_tie.check_tie`: a head trained apart
    under a tied flag is kept and the flags set false, ``plan.tie``).

    Raises:
        UsageError, CheckpointError, RefusedError: as those two and :func:`~surgery.plan.merge_tie.check_tie`
            say (an untied flag with no head in the files is refused); nothing is written.
    """
    names = folder_names(src)
    plan = plan_expert_merge(src, names) if is_expert_parallel(names) else plan_merge(src)
    fix = check_tie(joined_view(plan.path, plan.new_config, plan.merged))
    new_config, changes = changed(plan.new_config, plan.config_changes, fix)
    return replace(plan, new_config=new_config, config_changes=changes, tie=fix)
