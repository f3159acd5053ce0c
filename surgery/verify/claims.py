"""The rows the runs of an output's report chain say they set in place (``fix-untrained``, ``rename-tokens
--init trained-mean`` / ``subtokens``), one :class:`Claim` per run, in chain order.

A chain may set rows more than once: ``rename-tokens --init subtokens`` then ``rename-tokens --init
trained-mean`` on other slots, or ``fix-untrained`` (which sets every untrained reserved slot) then
``rename-tokens`` on one of those slots. Each run's rows are its own until a later run sets them again: a
claim keeps only the ids no later run of the chain sets (:func:`claims`), so the output's row is checked
against the run that wrote it last, on the folder that run read (:mod:`surgery.verify.beforeset`).

A prune after a run renumbers its rows and drops some: such a claim keeps the ids of the folder its run read
(where its rows are recomputed) and maps them to the output's (:attr:`Claim.out`); a row the prune dropped is
gone, and checked nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..io.checkpoint import Checkpoint
from ..report import chain_since, prune_map

SETS = ("fix-untrained", "rename-tokens")


@dataclass(frozen=True)
class Claim:
    """Rows one run of the chain says it set.

    Attributes:
        at: the run's index in the chain since the input (:func:`surgery.report.chain_since`).
        op: ``fix-untrained`` or ``rename-tokens``.
        ids: the ids whose rows it set, reach the output and no later run set again (sorted).
        every: every id it set, later runs' or not (the rows it took from the folder it read).
        split: True for ``rename-tokens --init subtokens`` (each row the mean of its split's rows).
        sources: ``{id: source ids}`` of rows made from sub-token rows (every id of a split claim; some
            of a ``fix-untrained --init subtokens`` run); the other ids got the trained mean.
        out: None when no prune of the chain follows the run: its ids are the output's. Else the ids are
            those of the folder the run read, and ``out`` maps each of ``every`` that every later prune
            kept to its id in the output (:func:`out_ids`).
    """

    at: int
    op: str
    ids: tuple[int, ...]
    every: tuple[int, ...]
    split: bool = False
    sources: dict[int, list[int]] = field(default_factory=dict)
    out: dict[int, int] | None = None

    @property
    def after_prune(self) -> bool:
        """A prune of the chain follows the run (its ids are not the output's)."""
        return self.out is not None

    def out_ids(self, ids: tuple[int, ...] | list[int] | None = None) -> list[int]:
        """The output's ids of ``ids`` (default :attr:`ids`) that reach it, in order."""
        got = self.ids if ids is None else ids
        return list(got) if self.out is None else [self.out[i] for i in got if i in self.out]


def claims(B: Checkpoint, A: Checkpoint) -> list[Claim]:
    """Every run of the output ``B``'s chain since ``A`` that says it set rows, in order (a run whose
    report section cannot be read, or that set none, is left out), each with the ids that reach the output
    and no later run sets (in the output's ids). A split claim whose tokens do not all name their source
    ids is left out (nothing explained)."""
    later: set[int] = set()
    kept = []
    for c in reversed(every_claim(B, A)):
        own = tuple(i for i, j in zip(c.ids, _maybe(c), strict=True) if j is not None and j not in later)
        later |= set(c.out_ids())
        if own:
            kept.append(Claim(c.at, c.op, own, c.every, c.split, c.sources, c.out))
    return kept[::-1]


def _maybe(c: Claim) -> list[int | None]:
    """The output's id of each of ``c.ids`` (None: a later prune dropped it)."""
    return [i if c.out is None else c.out.get(i) for i in c.ids]


def every_claim(B: Checkpoint, A: Checkpoint) -> list[Claim]:
    """Every run of ``B``'s chain since ``A`` that says it set rows, in order, each with every id it set
    (in the ids of the folder it read; :attr:`Claim.out` maps them through the later prunes)."""
    runs = chain_since(B.path, A.path)
    out = []
    for k, r in enumerate(runs):
        op = str(r.get("operation"))
        sec = r.get(op.replace("-", "_")) if op in SETS else None
        if not isinstance(sec, dict):
            continue
        maps = [m for m in (prune_map(x) for x in runs[k + 1 :]) if m is not None]
        c = _claim(k, op, sec, maps)
        if c is not None:
            out.append(c)
    return out


def _claim(k: int, op: str, sec: dict[str, Any], maps: list[dict[int, int]]) -> Claim | None:
    """The claim of run ``k`` from its section (``maps``: the ``id_map`` s of the prunes after it), or
    None when it set no row it names."""
    tokens = [t for t in sec.get("tokens") or [] if isinstance(t, dict) and type(t.get("id")) is int]
    init = sec.get("init")
    srcs = {t["id"]: src for t in tokens if (src := _sources(t)) is not None}
    if op == "fix-untrained":
        ids = sec.get("ids")
        if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
            return None
        got = tuple(sorted(set(ids)))
        return Claim(k, op, got, got, sources=srcs if init == "subtokens" else {}, out=_through(got, maps))
    if init not in ("trained-mean", "subtokens") or not tokens:
        return None
    got = tuple(sorted({t["id"] for t in tokens}))
    if init == "subtokens" and len(srcs) != len(tokens):
        return None
    split = init == "subtokens"
    return Claim(k, op, got, got, split, srcs if split else {}, _through(got, maps))


def _through(ids: tuple[int, ...], maps: list[dict[int, int]]) -> dict[int, int] | None:
    """``{id: its id after every prune of maps}`` of the ``ids`` they all keep; None without a prune."""
    if not maps:
        return None
    out = {}
    for i in ids:
        j: int | None = i
        for m in maps:
            j = m.get(j) if j is not None else None
        if j is not None:
            out[i] = j
    return out


def _sources(t: dict[str, Any]) -> list[int] | None:
    src = t.get("source_ids")
    if isinstance(src, list) and src and all(type(j) is int for j in src):
        return [int(j) for j in src]
    return None


def renumbered(sec: dict[str, Any], maps: list[dict[int, int]]) -> dict[str, Any]:
    """``sec`` (a ``fix_untrained`` or ``rename_tokens`` section) with its ids carried through the later
    prunes' ``id_map`` s (``maps``, in order; an id a prune dropped is left out)."""

    def new(i: Any) -> int | None:
        if type(i) is not int:
            return None
        for m in maps:
            if i not in m:
                return None
            i = m[i]
        return i

    out = dict(sec)
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
