"""The reports of the writing operations: :func:`build` for ``tie`` / ``untie`` / ``resize`` (what a plan
drops, adds and changes, with parameters and bytes before and after), :func:`convert_report` and
:func:`merge_report`. Numbers only; the CLI renders them (a rich table) and the writer stores them
(tietool-report.json). Each operation keeps the JSON keys it always had; the fields every operation
answers are :class:`surgery.results.Report`'s accessors (``merge``'s totals from :func:`merge_totals`).

Bytes are counted per tensor name, as an index's ``total_size`` counts them and as a loader materialises
them; where names shared one array in a ``.pdparams`` (pickle memo), the file held it once, and
``storage_shared`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from . import __version__
from .inspect.findings import FindingKind
from .inspect.summary import loader_facts, percent
from .io import surface, tree
from .io.checkpoint import REPORT_NAME
from .io.regular import load_json
from .model.enums import Operation, Target
from .model.errors import CheckpointError
from .plan import merge_flex
from .plan.convert import ConvertPlan
from .plan.merge import MergePlan
from .plan.plan import FlexFolders, KeepFiles, OutTensor, Plan, Reshard, get_config
from .plan.recipes import FusedPart, Joined
from .results import Totals
from .write.layout import reshard

if TYPE_CHECKING:  # annotations only: convert and merge are imported by the operations that run them
    from .plan.convert import ConvertPlan
    from .plan.merge import MergePlan


class DroppedTensor(TypedDict):
    name: str
    shape: list[int]
    dtype: str
    parameters: int
    bytes: int
    reason: str
    storage_shared: bool


class AddedTensor(TypedDict):
    name: str
    shape: list[int]
    dtype: str
    parameters: int
    bytes: int


class ResizedTensor(TypedDict):
    name: str
    shape_before: list[int]
    shape_after: list[int]
    dtype: str
    parameters_before: int
    parameters_after: int
    bytes_before: int
    bytes_after: int


class ConfigChange(TypedDict):
    file: str
    key: str
    before: object
    after: object


def _dropped(plan: Plan) -> list[DroppedTensor]:
    """The tensors the plan drops, with their reason and whether they shared the embedding's storage."""
    t, emb_storage = plan.ckpt.tensors, plan.det.emb_info.storage
    return [
        {
            "name": n,
            "shape": list(t[n].shape),
            "dtype": t[n].dtype,
            "parameters": t[n].numel,
            "bytes": t[n].nbytes,
            "reason": why,
            "storage_shared": t[n].storage is not None and t[n].storage == emb_storage,
        }
        for n, why in plan.drop.items()
    ]


def _added(plan: Plan) -> list[AddedTensor]:
    """The tensors the plan writes that the input does not hold."""
    return [
        {"name": a.name, "shape": list(a.shape), "dtype": a.dtype, "parameters": a.numel, "bytes": a.nbytes}
        for a in plan.add
    ]


def _resized(plan: Plan) -> list[ResizedTensor]:
    """The tensors the plan replaces, with their shape, parameters and bytes before and after."""
    t = plan.ckpt.tensors
    return [
        {
            "name": n,
            "shape_before": list(t[n].shape),
            "shape_after": list(nt.shape),
            "dtype": nt.dtype,
            "parameters_before": t[n].numel,
            "parameters_after": nt.numel,
            "bytes_before": t[n].nbytes,
            "bytes_after": nt.nbytes,
        }
        for n, nt in plan.replace.items()
    ]


def _total_after(
    before: int,
    dropped: list[DroppedTensor],
    added: list[AddedTensor],
    resized: list[ResizedTensor],
    unit: Literal["parameters", "bytes"],
) -> int:
    """The checkpoint's total ``unit`` after the plan: ``before`` less the dropped, plus the added and the
    growth of the resized tensors."""
    if unit == "parameters":
        grown = sum(c["parameters_after"] - c["parameters_before"] for c in resized)
    else:
        grown = sum(c["bytes_after"] - c["bytes_before"] for c in resized)
    return before - sum(d[unit] for d in dropped) + sum(a[unit] for a in added) + grown


def _config_changes(plan: Plan) -> list[ConfigChange]:
    """The config keys the plan sets to a value other than the one they hold."""
    cfg: list[ConfigChange] = []
    for file, key, value in plan.config_set:
        before = get_config(plan.ckpt, file, key)
        if before != value:
            cfg.append({"file": file, "key": key, "before": before, "after": value})
    return cfg


def _left_out(plan: Plan, facts: dict | None, keep_training_state: bool) -> list:
    """The input's files the output does not hold: as the write found them (``facts``), else as it would."""
    if facts and "left_out" in facts:
        return facts["left_out"]
    ckpt = plan.ckpt
    return [
        x.as_dict()
        for x in surface.output_left_out(
            ckpt.path, ckpt.left_out, ckpt.training_state, plan.changed, keep_training_state
        )
    ]


def _edited_links(plan: Plan) -> list[str]:
    """A note per tokenizer file the run edits that is a symbolic link in the input: the output holds the
    edited file in its place; the file behind the link is not touched."""
    edited = plan.tokenizer.files if plan.tokenizer is not None else {}
    return [
        f"{rel} was a symbolic link to {target}: the output holds the edited file in its place (the file "
        "behind the link is unchanged)"
        for rel, target in tree.linked_files(plan.ckpt.path, edited)
    ]


def _stale_index_warnings(plan: Plan) -> list[str]:
    """A warning for each stale index entry the plan drops that the checkpoint's warnings do not name."""
    return [
        f"stale index entry {n} dropped (no shard holds it)"
        for n in plan.stale_index
        if not any(n in w for w in plan.ckpt.warnings)
    ]


def _add_written_files(rep: dict[str, Any], facts: dict) -> None:
    """Add the files the write produced (and any it renamed) and their total size to ``rep``."""
    rep["files"] = facts["files"]
    rep["total_size"] = facts["total_size"]
    if facts.get("rename"):
        rep["files"]["renamed"] = facts["rename"]


# the sections of a report a later run carries forward in its ``history`` (what verify reads of a report)
HISTORY_KEYS = (
    "tool",
    "operation",
    "input",
    "output",
    "add_tokens",
    "tokenizer",
    "resize",
    "to",
    "config_changes",
    "prune",
    "fix_untrained",
    "rename_tokens",
    "dropped",
)


def history(folder: Any) -> list[dict[str, Any]]:
    """The edits already made to the checkpoint in ``folder``, oldest first, as its ``tietool-report.json``
    records them: that report's own ``history`` followed by the report itself, each entry cut to
    :data:`HISTORY_KEYS`. A write stores it in the new report, so that ``verify ORIGINAL FINAL`` across a
    chain of runs (``add-tokens`` in place twice, ``resize`` after ``add-tokens``) knows every token added or
    removed since ORIGINAL, not only the last run's. No report, or one that cannot be read: ``[]`` (verify
    then explains only the last run's tokens: it refuses rather than trusts)."""
    try:
        rep = load_json(folder / REPORT_NAME, REPORT_NAME)
    except (CheckpointError, OSError, ValueError):  # missing or unreadable: no history
        return []
    if not isinstance(rep, dict):
        return []
    past = rep.get("history")
    entries = [e for e in past if isinstance(e, dict)] if isinstance(past, list) else []
    return [{k: e[k] for k in HISTORY_KEYS if k in e} for e in [*entries, rep]]


def with_history(rep: dict[str, Any], folder: Any) -> dict[str, Any]:
    """``rep`` with the ``history`` of the input ``folder`` (:func:`history`) when it has one and ``rep``
    holds none yet: every write carries its input's chain forward (``convert`` and ``merge`` as ``tie``
    does), so ``verify`` reads a chain through all of them. A dry run's report (no files) is unchanged."""
    if "history" not in rep and not rep.get("dry_run"):
        past = history(folder) if isinstance(folder, Path) else []
        if past:
            rep["history"] = past
    return rep


def chain_since(folder: Any, base: Any = None) -> list[dict[str, Any]]:
    """The runs of ``folder``'s report chain (:func:`history`, oldest first) that the input ``base`` does
    not already hold (its own chain, when ``folder``'s starts with it): what made ``folder`` from ``base``."""
    chain = history(folder)
    return chain[_held_by(chain, history(base) if base is not None else []) :]


@dataclass(frozen=True)
class Removal:
    """One token a report says a run removed (resize's ``tokens_removed``).

    Attributes:
        content: the token's string.
        source: which report said so (``history entry 2 (resize)``, ``the last run (resize)``).
        doubt: why the claim contradicts the report chain itself, "" when it does not: a trim removes only
            ids at or beyond its ``rows_after``, and each run's ``rows_before`` is the previous run's
            ``rows_after``.
    """

    content: str
    source: str
    doubt: str = ""


@dataclass(frozen=True)
class TokenClaims:
    """What a folder's report chain says was added and removed since its first run, net: ``added``
    ``{id: content}``, ``removed`` ``{id: Removal}`` (a token a later run removes that an earlier one added
    is neither), and ``rows``: the ``rows_after`` of the last run that counted rows (None: none did), which
    the folder's embedding must have for the chain to describe it."""

    added: dict[int, str] = field(default_factory=dict)
    removed: dict[int, Removal] = field(default_factory=dict)
    rows: Any = None


def token_claims(folder: Any, base: Any = None) -> TokenClaims:
    """The tokens ``folder``'s ``tietool-report.json`` says were added and removed across the chain of runs
    it records (:func:`history`, oldest first, then the report itself), each entry applied in turn. The
    entries the input ``base`` already holds (its own chain, when ``folder``'s chain starts with it) are
    skipped: their tokens are in both folders, so ``verify BASE OUT`` of one step of a chain explains that
    step alone.

    Read from ``add_tokens.tokens`` and ``tokenizer.tokens`` (entries ``{"content", "id", ...}``;
    ``"existed": true`` ones are not new) and ``tokens_removed`` / ``removed`` lists under ``add_tokens``,
    ``tokenizer`` or ``resize``. A removal is only ever claimed, not proven: each carries the reason the
    chain itself contradicts it (:class:`Removal`), and the caller checks it against the files (verify: a
    token of the input's base vocabulary is never removed). A missing or unreadable report claims nothing.
    """
    chain = history(folder)
    breaks = _rows_breaks(chain)
    counted = [r for r in (_rows(e)[1] for e in chain) if r is not None]
    out = TokenClaims(rows=counted[-1] if counted else None)
    held = _held_by(chain, history(base) if base is not None else [])
    for k, entry in enumerate(chain):
        if k < held:
            continue
        last = k == len(chain) - 1
        source = f"{'the last run' if last else f'history entry {k + 1}'} ({entry.get('operation')})"
        id_map = prune_map(entry)
        if id_map is not None:  # a prune renumbers the tokens claimed so far; a dropped one is neither
            out = replace(
                out,
                added={id_map[i]: c for i, c in out.added.items() if i in id_map},
                removed={id_map[i]: r for i, r in out.removed.items() if i in id_map},
            )
        added, removed = _entry_tokens(entry)
        for i, c in removed.items():
            if out.added.get(i) == c:
                del out.added[i]
            else:
                out.removed[i] = Removal(c, source, breaks or _trim_doubt(entry, i))
        out.added.update(added)
    return out


def _held_by(chain: list[dict[str, Any]], done: list[dict[str, Any]]) -> int:
    """How many leading entries of an output's report chain the input already holds: the length of the
    input's own chain ``done`` when ``chain`` starts with it (and goes on), else 0."""
    return len(done) if done and len(done) < len(chain) and chain[: len(done)] == done else 0


def _entry_tokens(entry: dict) -> tuple[dict[int, str], dict[int, str]]:
    """The tokens one report (or one ``history`` entry) lists as added and removed, as
    :func:`token_claims` reads them."""
    added: dict[int, str] = {}
    removed: dict[int, str] = {}
    for key in ("add_tokens", "tokenizer", "resize"):
        sec = entry.get(key)
        if not isinstance(sec, dict):
            continue
        for into, name in ((added, "tokens"), (removed, "tokens_removed"), (removed, "removed")):
            listed = sec.get(name)
            for t in listed if isinstance(listed, list) else []:
                ok = isinstance(t, dict) and isinstance(t.get("content"), str) and type(t.get("id")) is int
                if ok and not (into is added and t.get("existed")):
                    into[t["id"]] = t["content"]
    return added, removed


def prune_map(entry: dict) -> dict[int, int] | None:
    """``{old id: new id}`` of one report (or ``history`` entry) of a ``prune`` run, from its
    ``prune.id_map`` (JSON keys are strings); None for another run, or a map that is not ids to ids."""
    sec = entry.get("prune") if entry.get("operation") == "prune" else None
    m = sec.get("id_map") if isinstance(sec, dict) else None
    if not isinstance(m, dict):
        return None
    try:
        out = {int(o): n for o, n in m.items()}
    except ValueError:
        return None
    return out if all(type(n) is int for n in out.values()) else None


def _rows(entry: dict) -> tuple[Any, Any]:
    """``(rows_before, rows_after)`` of one entry's ``resize``, ``add_tokens`` or ``prune`` section (None:
    none)."""
    for key in ("resize", "add_tokens", "prune"):
        sec = entry.get(key)
        if isinstance(sec, dict):
            return sec.get("rows_before"), sec.get("rows_after")
    return None, None


def _rows_breaks(chain: list[dict[str, Any]]) -> str:
    """Why the chain's rows do not follow from run to run ("" when they do): a run's ``rows_before`` must
    be the ``rows_after`` of the last earlier run that counted rows (tie, untie, convert keep the rows)."""
    rows: Any = None
    for k, entry in enumerate(chain):
        before, after = _rows(entry)
        if before is None and after is None:
            continue
        if rows is not None and before != rows:
            return f"its run {k + 1} starts from {before!r} rows after a run that ended with {rows!r}"
        rows = after
    return ""


def rows_floor(chain: list[dict[str, Any]], rows_in: int, rows_out: int) -> int | None:
    """The fewest rows the vocabulary had along ``chain`` (the runs that made an output of ``rows_out``
    rows from an input of ``rows_in``) when a ``resize`` of it trimmed below both ends (a trim, then a
    grow: the entries from there on are new in the output, though both ends hold them); None otherwise, or
    when the chain's rows do not follow from ``rows_in`` to ``rows_out`` run by run
    (:func:`_rows_breaks`)."""
    counted = [(b, a) for b, a in (_rows(e) for e in chain) if b is not None or a is not None]
    if not counted or _rows_breaks(chain) or counted[0][0] != rows_in or counted[-1][1] != rows_out:
        return None
    trims = [
        e["resize"]["rows_after"]
        for e in chain
        if isinstance(e.get("resize"), dict) and type(e["resize"].get("rows_after")) is int
    ]
    low = min(trims, default=None)
    return low if low is not None and 0 <= low < min(rows_in, rows_out) else None


def _trim_doubt(entry: dict, i: int) -> str:
    """Why a removal of id ``i`` by ``entry`` is not a trim tietool makes ("" when it is): only ``resize``
    removes tokens, those at or beyond the rows it keeps."""
    after = entry.get("resize", {}).get("rows_after") if isinstance(entry.get("resize"), dict) else None
    if type(after) is not int:
        return "only a resize that records its rows_after removes tokens"
    if i < after:
        return f"a resize to {after} rows removes only ids from {after}"
    return ""


_EXTRA_KEY = {
    "add-tokens": "add_tokens",
    "fix-untrained": "fix_untrained",
    "rename-tokens": "rename_tokens",
    "prune": "prune",
    "transplant": "transplant",
}
"""The report key of a plan's ``extra_report`` by operation (``resize`` for the others)."""


def build(
    plan: Plan, facts: dict | None, out: str | None, dry_run: bool = False, keep_training_state: bool = False
) -> dict:
    """The report of a plan (and of its execution, ``facts`` from :func:`surgery.write.writer.execute`).

    ``left_out`` lists the input's files the output does not hold (not part of the checkpoint, or training
    state made stale), each with its reason (:class:`surgery.io.surface.LeftOutReason`)."""
    ckpt, det = plan.ckpt, plan.det
    dropped, added, changed = _dropped(plan), _added(plan), _resized(plan)
    p0, b0 = ckpt.total_parameters, ckpt.total_bytes
    p1 = _total_after(p0, dropped, added, changed, "parameters")
    b1 = _total_after(b0, dropped, added, changed, "bytes")
    cfg = _config_changes(plan)
    rep: dict[str, Any] = {  # JSON: tietool-report.json
        "tool": f"tietool {__version__}",
        "operation": plan.op,
        "dry_run": dry_run,
        "input": str(ckpt.path),
        "output": str(out) if out else None,
        "format": ckpt.format,
        "sharded": len(ckpt.weight_files) > 1,
        "index": ckpt.index_name,
        "loader": loader_facts(det),
        "embedding": det.embedding.name,
        "head": det.head.name,
        "changed": plan.changed,
        "dropped": dropped,
        "added": added,
        "resized": changed,
        "config_changes": cfg,
        "before": {"parameters": p0, "bytes": b0},
        "after": {"parameters": p1, "bytes": b1},
        "saved": {"parameters": p0 - p1, "bytes": b0 - b1, "percent": percent(b0 - b1, b0)},
        "notes": list(plan.notes),
        "findings": [f.as_dict() for f in det.findings if f.kind is FindingKind.LOADER_FACTS_UNPROVEN],
        "warnings": list(ckpt.warnings) + list(plan.warnings),
        "left_out": _left_out(plan, facts, keep_training_state),
    }
    if plan.stale_index:
        rep["warnings"] += _stale_index_warnings(plan)
    if plan.extra_report:
        rep[_EXTRA_KEY.get(plan.op, "resize")] = plan.extra_report
    if plan.training_edit:  # --keep-training-state: the optimizer accumulators / master weights resized
        rep["training_state_resized"] = {rel: e.resized for rel, e in sorted(plan.training_edit.items())}
    if not plan.changed:
        rep["notes"].append(
            f"nothing to change: the output tensors and config equal the input's ({plan.op} is a no-op)"
        )
    rep["notes"] += _edited_links(plan)
    if facts:
        _add_written_files(rep, facts)
        past = history(ckpt.path)
        if past:
            rep["history"] = past
    return rep


def convert_report(plan: ConvertPlan, to: Target, out: str, facts: dict | None) -> dict:
    """The report of ``convert`` (``tietool-report.json``): every renamed, transposed and split tensor, config
    changes, notes, and the files written (``facts`` from :func:`~surgery.write.writer.write_new`; None for a
    dry run)."""
    from .plan.convert_tensors import source_of

    ck, ts = plan.ckpt, plan.tensors
    renamed = [
        {"from": source_of(t), "to": t.name}
        for t in ts
        if t.name != source_of(t) and not isinstance(t.recipe, FusedPart)
    ]
    transposed = [
        {
            "name": t.name,
            "from": source_of(t),
            "shape_before": list(ck.tensors[source_of(t)].shape),
            "shape_after": list(t.shape),
        }
        for t in ts
        if t.recipe.transpose  # type: ignore[union-attr]  # a conversion's: CopyOf or FusedPart
    ]
    split: dict[str, list[str]] = {}
    for t in ts:
        if isinstance(t.recipe, FusedPart):
            split.setdefault(t.recipe.name, []).append(t.name)
    total_in = sum(t.nbytes for t in ck.tensors.values())
    total_out = sum(t.nbytes for t in ts)
    params_in = sum(t.numel for t in ck.tensors.values())
    params_out = sum(t.numel for t in ts)
    return {
        "operation": "convert",
        "to": to.value,
        "input": str(ck.path),
        "output": out,
        "dry_run": facts is None,
        "changed": True,
        "from_convention": plan.source.title,
        "to_convention": plan.target.title,
        "layout": plan.layout.value if plan.layout else None,
        "container": {"before": ck.format, "after": plan.container.value},
        "before": {"parameters": params_in, "bytes": total_in, "tensors": len(ck.tensors)},
        "after": {"parameters": params_out, "bytes": total_out, "tensors": len(ts)},
        "renamed": renamed,
        "transposed": transposed,
        "split": [{"from": k, "to": v} for k, v in split.items()],
        "config_changes": plan.config_changes,
        "notes": plan.notes,
        "warnings": list(ck.warnings) + plan.warnings,
        "files": facts,
    }


def merge_report(plan: MergePlan, out: str, facts: dict) -> dict:
    """The report of ``merge`` (``tietool-report.json``): the ranks, the config changes, the files left
    out, the written (or, ``facts["dry_run"]``, planned) files' facts and each tensor's rule and axis."""
    groups = plan.groups
    return {
        "operation": "merge",
        "dry_run": facts.pop("dry_run", False),
        "changed": True,
        "input": str(plan.path),
        "output": out,
        "tensor_parallel": 1 + max(t for t, _ in groups),
        "pipeline_parallel": 1 + max(p for _, p in groups),
        "expert_parallel": plan.expert_parallel,
        "expert_numbering": plan.expert_numbering,
        "model_type": plan.config.get("model_type"),
        "rank_files": plan.rank_files,
        "config_changes": plan.config_changes,
        "tie": plan.tie.facts() if plan.tie else None,
        "left_out": plan.left,
        **facts,
        "tensors": [_merged_facts(t) for t in plan.merged],
    }


def merge_totals(plan: MergePlan) -> tuple[Totals, Totals]:
    """Parameters and bytes of a merge before (every tensor-parallel rank's tensors: a replicated tensor
    once per rank, a tensor in two pipeline ranks of one rank once) and after (the merged tensors). Not in
    ``tietool-report.json`` (its keys are kept as they were); :class:`~surgery.results.Report` reads them."""
    slices = [s.info for own in plan.by_tp.values() for s in own.values()]
    before = Totals(sum(t.numel for t in slices), sum(t.nbytes for t in slices))
    return before, Totals(sum(t.numel for t in plan.merged), sum(t.nbytes for t in plan.merged))


def _merged_facts(t: OutTensor) -> dict[str, Any]:
    """One merged tensor in the report: its rule, axis, dtype, shape and the rank files it comes from."""
    j = t.recipe
    assert isinstance(j, Joined), f"internal: {t.name} is not joined"
    return {
        "name": t.name,
        "rule": j.rule.value,
        "axis": j.axis,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "from": sorted({s.info.file for s in j.slices}),
    }


# ------------------------------------------------------------------ the report of any plan


def report_of(
    plan: Plan,
    out: str,
    facts: dict | None,
    dry_run: bool = True,
    keep_training_state: bool = False,
    to: Target | None = None,
) -> dict:
    """The report (``tietool-report.json``) of ``plan``: of its execution, given the writer's written-file
    ``facts``; of a dry run (``dry_run``) or of an in-place plan that writes nothing, without. Each
    operation's JSON keys are the ones it always had: an edit's (:func:`build`; a Trainer flex checkpoint's
    with the flex facts), ``convert``'s (:func:`convert_report`, ``to`` the target asked for), ``merge``'s
    (:func:`merge_report`, a flex checkpoint's :func:`surgery.plan.merge_flex.report`, a converted one's
    with the conversion under ``converted``)."""
    lay = plan.layout
    if isinstance(lay, FlexFolders):
        rep = _flex_edit_report(plan, lay, out, facts, dry_run)
    elif isinstance(lay, KeepFiles):
        if facts is None:
            rep = build(plan, None, out, dry_run=dry_run, keep_training_state=keep_training_state)
        else:
            rep = build(plan, facts, out)
    elif plan.op is Operation.CONVERT:
        assert to is not None, "internal: a convert report names its target"
        rep = convert_report(plan.section, to, out, facts)
    else:
        rep = _merge_of(plan, lay, out, facts)
    return with_common(rep, plan)


COMMON_FIELDS = (
    "tool",
    "version",
    "operation",
    "input",
    "output",
    "dry_run",
    "changed",
    "before",
    "after",
    "config_changes",
    "left_out",
    "notes",
    "warnings",
)
"""The fields the report of every writing operation has, dry run included (after its own keys)."""


def with_common(rep: dict, plan: Plan) -> dict:
    """``rep`` with each of :data:`COMMON_FIELDS` it lacks added at its end (its own keys keep their place
    and values): the tool and its version, a merge's totals (:func:`totals_of`), the plan's notes and
    warnings, ``convert``'s files that are not part of the checkpoint (``left_out``)."""
    rep.setdefault("tool", f"tietool {__version__}")
    rep.setdefault("version", __version__)
    for key, t in totals_of(plan).items():
        rep.setdefault(key, {"parameters": t.parameters, "bytes": t.bytes})
    rep.setdefault("notes", list(plan.notes))
    rep.setdefault("warnings", list(plan.warnings))
    if "left_out" not in rep:
        source = plan.source
        rep["left_out"] = [x.as_dict() for x in source.left_out] if source is not None else []
    missing = [k for k in COMMON_FIELDS if k not in rep]
    assert not missing, f"internal: the {plan.op} report lacks {missing}"
    return rep


def _flex_edit_report(plan: Plan, lay: FlexFolders, out: str, facts: dict | None, dry_run: bool) -> dict:
    """:func:`build` of an edit of a Trainer flex checkpoint, with ``kind``, where its config was found and
    the optimizer state and master weights resized (the weights are ``resized``)."""
    if facts is None:
        rep = build(plan, None, out, dry_run=dry_run, keep_training_state=True)
        resized = {k: sorted(v) for k, v in lay.rewrites.items() if v}
    else:
        resized = facts.pop("training_state_resized", {})
        rep = build(plan, facts, out)
    resized = {k: v for k, v in resized.items() if k != "model_state"}  # the weights: "resized"
    rep.update(kind="flex", config_from=str(lay.config_file), training_state_resized=resized)
    return rep


def _merge_of(plan: Plan, lay: Reshard, out: str, facts: dict | None) -> dict:
    """The report of a merge; a dry run's facts are the files a run would write (the layout's shards)."""
    if facts is None:
        shards = reshard(lay.tensors, lay.container, lay.max_shard_size)
        facts = {"weight_files": list(shards.files), "index": shards.index, "total_size": shards.total_size}
        facts.update(carried=[n for _, n in lay.carry], dry_run=True)
    sec = plan.section
    if isinstance(sec, MergePlan):
        return merge_report(sec, out, facts)
    if isinstance(sec, merge_flex.FlexPlan):
        return merge_flex.report(sec, out, facts)
    fp, cp = sec
    conv = convert_report(cp, Target.PADDLEFORMERS, out, dict(facts))
    return merge_flex.with_conversion(merge_flex.report(fp, out, facts), conv, out)


def totals_of(plan: Plan) -> dict[str, Totals]:
    """:class:`~surgery.results.Report`'s ``before`` / ``after`` where the JSON has none (a merge: every
    rank's or slice's tensors, and the merged ones); {} otherwise."""
    sec = plan.section
    if not isinstance(plan.layout, Reshard) or plan.op is not Operation.MERGE:
        return {}
    if isinstance(sec, MergePlan):
        before, after = merge_totals(sec)
        return {"before": before, "after": after}
    fp = sec if isinstance(sec, merge_flex.FlexPlan) else sec[0]
    (bp, bb), (ap, ab) = merge_flex.totals(fp)
    if not isinstance(sec, merge_flex.FlexPlan):  # converted: the tensors as written
        ts = plan.layout.tensors
        ap, ab = sum(t.numel for t in ts), sum(t.nbytes for t in ts)
    return {"before": Totals(bp, bb), "after": Totals(ap, ab)}


@dataclass
class Draft:
    """The report of a run before its files are written, handed to the writer
    (:func:`surgery.write.writer.execute`): :meth:`with_files` makes the report of the execution from the
    written-file facts, and the writer stores it in the output before the output is published.

    Attributes:
        plan: the plan executed.
        out: the output as the user named it.
        to: ``convert``'s target.
        keep_training_state: the run keeps the training state (the report's ``left_out``).
        source: the input folder, whose report chain a written report carries forward (:func:`with_history`).
        extra: keys the output policy adds (``in_place``), last.
    """

    plan: Plan
    out: str
    to: Target | None = None
    keep_training_state: bool = False
    source: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def unwritten(self, dry_run: bool) -> dict:
        """The report of a run that writes nothing (a dry run, or an in-place plan that changes nothing)."""
        return {
            **report_of(self.plan, self.out, None, dry_run, self.keep_training_state, self.to),
            **self.extra,
        }

    def with_files(self, facts: dict) -> dict:
        """The report of the execution that wrote ``facts``, with the input's history carried forward."""
        rep = report_of(self.plan, self.out, facts, False, self.keep_training_state, self.to)
        return {**with_history(rep, self.source), **self.extra}

    def adding(self, extra: dict[str, Any]) -> Draft:
        """This draft with ``extra`` keys (the output policy's)."""
        return replace(self, extra={**self.extra, **extra})
