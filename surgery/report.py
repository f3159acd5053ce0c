"""The parameter-savings report: what a plan drops, adds and changes, with parameters and bytes before and
after. Numbers only; the CLI renders them (a rich table) and the writer stores them (tietool-report.json).

Bytes are counted per tensor name, as an index's ``total_size`` counts them and as a loader materialises
them; where names shared one array in a ``.pdparams`` (pickle memo), the file held it once, and
``storage_shared`` says so.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from . import __version__
from .inspect.detect import Detection
from .inspect.findings import FindingKind
from .io import surface
from .model.enums import TieState
from .model.errors import Opt
from .plan.plan import Plan, get_config


class _SavingsRequired(TypedDict):
    parameters: int
    bytes: int
    percent: float


class Savings(_SavingsRequired, total=False):
    """What ``tie`` would save (``inspect``'s ``savings``)."""

    why_zero: str  # why nothing would be saved
    assumes: str  # what the figures take for granted


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


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 3) if whole else 0.0


def loader_facts(det: Detection) -> dict[str, Any]:
    """The loader block of a report and of ``inspect --json``: the loader, how it was decided, its facts
    for this model type and container (architecture table) and the test that proved them (``proof``,
    None: unproven, so no write relied on them)."""
    fam = det.family
    return {
        "name": det.loader.name,
        "source": det.loader.source,
        "reties_missing_head": fam.reties,
        "always_tied": fam.always_tied,
        "head_layout": fam.head_layout,
        "proven": fam.proven,
        "proof": fam.proof,
        "proven_loaders": list(fam.proven_loaders()),
    }


_DROPPABLE = (TieState.EXACT, TieState.TRANSPOSED, TieState.SCALED, TieState.UNKNOWN)
"""The tie states of a present head that ``tie`` may drop (equal as stored, transposed or scaled; not
compared: tie compares before it drops)."""


def savings_if_tied(det: Detection) -> Savings:
    """What ``tie`` would save on this checkpoint: the head and embedding copies a re-tying loader drops."""
    ckpt = det.ckpt
    params = bytes_ = 0
    why = None
    assumed = None
    if det.head.present and det.comparison.values in _DROPPABLE:
        if det.family.may_drop_head:
            if det.comparison.values is TieState.UNKNOWN:
                assumed = "the values were not compared; tie checks that they agree before it drops the head"
            names = [det.head.name] + det.head.aliases
            params = sum(ckpt.tensors[n].numel for n in names)
            bytes_ = sum(ckpt.tensors[n].nbytes for n in names)
        elif not det.family.trusted:
            why = (
                f"whether the {det.loader.name} loader re-ties a missing head of {det.config.model_type} "
                "from "
                f"{ckpt.format} is unproven, so it stays"
            )
        else:
            why = f"the {det.loader.name} loader does not re-tie a missing head, so it must stay"
    elif not det.embedding.present:
        emb, head = det.embedding.name, det.head.name
        why = f"the input embedding {emb} is missing: the head {head} holds the only table"
    elif det.head.present and det.comparison.values is TieState.DIFFERENT:
        why = (
            f"the head differs from the embedding (tie {Opt('keep', 'embedding')} or "
            f"{Opt('keep', 'head')} would drop it)"
        )
    elif not det.head.present:
        why = "no head in the files"
    out: Savings = {"parameters": params, "bytes": bytes_, "percent": _pct(bytes_, ckpt.total_bytes)}
    if why:
        out["why_zero"] = why
    if assumed:
        out["assumes"] = assumed
    return out


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
        "saved": {"parameters": p0 - p1, "bytes": b0 - b1, "percent": _pct(b0 - b1, b0)},
        "notes": list(plan.notes),
        "findings": [f.as_dict() for f in det.findings if f.kind is FindingKind.LOADER_FACTS_UNPROVEN],
        "warnings": list(ckpt.warnings) + list(plan.warnings),
        "left_out": _left_out(plan, facts, keep_training_state),
    }
    if plan.stale_index:
        rep["warnings"] += _stale_index_warnings(plan)
    if plan.extra_report:
        rep["resize"] = plan.extra_report
    if not plan.changed:
        rep["notes"].append(
            f"nothing to change: the output tensors and config equal the input's ({plan.op} is a no-op)"
        )
    if facts:
        _add_written_files(rep, facts)
    return rep
