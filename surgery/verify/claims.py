"""The rows the runs of an output's report chain say they set in place (``fix-untrained``, ``rename-tokens
--init trained-mean`` / ``subtokens``), one :class:`Claim` per run, in chain order.

A chain may set rows more than once: ``rename-tokens --init subtokens`` then ``rename-tokens --init
trained-mean`` on other slots, or ``fix-untrained`` (which sets every untrained reserved slot) then
``rename-tokens`` on one of those slots. Each run's rows are its own until a later run sets them again: a
claim keeps only the ids no later run of the chain sets (:func:`claims`), so the output's row is checked
against the run that wrote it last, on the folder that run read (:mod:`surgery.verify.beforeset`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..io.checkpoint import Checkpoint
from ..report import chain_since, prune_map

SETS = ("fix-untrained", "rename-tokens")

AFTER_PRUNE = "renumbered_by_a_later_prune"
"""The key :func:`renumbered` sets in a section it carried through the chain's later prunes."""


@dataclass(frozen=True)
class Claim:
    """Rows one run of the chain says it set.

    Attributes:
        at: the run's index in the chain since the input (:func:`surgery.report.chain_since`).
        op: ``fix-untrained`` or ``rename-tokens``.
        ids: the ids whose rows it set and no later run set again (sorted).
        every: every id it set, later runs' or not (the rows it took from the folder it read).
        split: True for ``rename-tokens --init subtokens`` (each row the mean of its split's rows).
        sources: ``{id: source ids}`` of rows made from sub-token rows (every id of a split claim; some
            of a ``fix-untrained --init subtokens`` run); the other ids got the trained mean.
        after_prune: a prune of the chain follows the run (its ids were carried through that prune).
    """

    at: int
    op: str
    ids: tuple[int, ...]
    every: tuple[int, ...]
    split: bool = False
    sources: dict[int, list[int]] = field(default_factory=dict)
    after_prune: bool = False


def claims(B: Checkpoint, A: Checkpoint) -> list[Claim]:
    """Every run of the output ``B``'s chain since ``A`` that says it set rows, in order (a run whose
    report section cannot be read, or that set none, is left out), each with the ids no later run sets.
    A split claim whose tokens do not all name their source ids is left out (nothing explained)."""
    runs = chain_since(B.path, A.path)
    out = []
    for k, r in enumerate(runs):
        op = str(r.get("operation"))
        sec = r.get(op.replace("-", "_")) if op in SETS else None
        if not isinstance(sec, dict):
            continue
        maps = [m for m in (prune_map(x) for x in runs[k + 1 :]) if m is not None]
        c = _claim(k, op, renumbered(sec, maps) if maps else sec)
        if c is not None:
            out.append(c)
    later: set[int] = set()
    kept = []
    for c in reversed(out):
        own = tuple(i for i in c.ids if i not in later)
        later |= set(c.ids)
        if own:
            kept.append(Claim(c.at, c.op, own, c.ids, c.split, c.sources, c.after_prune))
    return kept[::-1]


def _claim(k: int, op: str, sec: dict[str, Any]) -> Claim | None:
    """The claim of run ``k`` from its (renumbered) section, or None when it set no row it names."""
    tokens = [t for t in sec.get("tokens") or [] if isinstance(t, dict) and type(t.get("id")) is int]
    init, after = sec.get("init"), bool(sec.get(AFTER_PRUNE))
    srcs = {t["id"]: src for t in tokens if (src := _sources(t)) is not None}
    if op == "fix-untrained":
        ids = sec.get("ids")
        if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
            return None
        got = tuple(sorted(set(ids)))
        return Claim(k, op, got, got, sources=srcs if init == "subtokens" else {}, after_prune=after)
    if init not in ("trained-mean", "subtokens") or not tokens:
        return None
    got = tuple(sorted({t["id"] for t in tokens}))
    if init == "subtokens" and len(srcs) != len(tokens):
        return None
    return Claim(k, op, got, got, init == "subtokens", srcs if init == "subtokens" else {}, after)


def _sources(t: dict[str, Any]) -> list[int] | None:
    src = t.get("source_ids")
    if isinstance(src, list) and src and all(type(j) is int for j in src):
        return [int(j) for j in src]
    return None


def renumbered(sec: dict[str, Any], maps: list[dict[int, int]]) -> dict[str, Any]:
    """``sec`` (a ``fix_untrained`` or ``rename_tokens`` section) with its ids carried through the later
    prunes' ``id_map`` s (``maps``, in order; an id a prune dropped is left out), marked
    :data:`AFTER_PRUNE`."""

    def new(i: Any) -> int | None:
        if type(i) is not int:
            return None
        for m in maps:
            if i not in m:
                return None
            i = m[i]
        return i

    out = {**sec, AFTER_PRUNE: True}
    if isinstance(sec.get("ids"), list):
        out["ids"] = [j for j in (new(i) for i in sec["ids"]) if j is not None]
    for key in ("tokens", "special_set"):
        if isinstance(sec.get(key), list):
            out[key] = [
                {**e, "id": new(e.get("id"))}
                for e in sec[key]
                if isinstance(e, dict) and new(e.get("id")) is not None
            ]
    return out
