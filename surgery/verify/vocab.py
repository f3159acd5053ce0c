"""``verify`` of the vocabulary toolbox's outputs (``fix-untrained``, ``rename-tokens``): what the output's
own report claims, checked against the files before it explains anything.

* rows set to the trained mean (:func:`fixed_rows`): for fix-untrained each id untrained in the input by
  its rule, and every such row the mean of the input's trained rows, bit for bit;
* renamed slots (:func:`rename_claims`): a reserved string at the id in the input, the new one in the
  output;
* special tokens set (:func:`special_claims`): the token at that id in the output.

A claim the files contradict explains nothing (the row or token is then unexplained), and a contradicted
row claim calls the report unverifiable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..inspect.detect import detect
from ..inspect.detection import Detection
from ..io.checkpoint import REPORT_NAME, Checkpoint
from ..io.regular import load_json
from ..io.special_tokens import SPECIAL_NAMES
from ..io.tokenizer import vocabulary
from ..io.tokenizer_rename import is_reserved
from ..model.errors import CheckpointError
from ..plan.fix_untrained import kept_special, tables, untrained_ids
from ..plan.untrained_rows import EPS, Table, find_untrained, mean_row, stored_entries, subtoken_row
from ..report import chain_since, prune_map
from .beforeset import before_set
from .result import VerifyResult


def _own_section(B: Checkpoint, op: str, A: Checkpoint | None = None) -> dict[str, Any] | None:
    """The ``op`` section of the last ``op`` run among the runs that made the output ``B`` from the input
    ``A`` (its report chain since ``A``, :func:`surgery.report.chain_since`: a ``fix-untrained`` followed
    by a ``tie`` still explains its rows); without ``A``, of the output's own report when its run was
    ``op``. None when no such run, or no readable report."""
    if A is not None:
        runs = chain_since(B.path, A.path)
        at = [k for k, r in enumerate(runs) if r.get("operation") == op]
        while len(at) > 1 and _set_nothing(runs[at[-1]].get(op.replace("-", "_"))):
            at.pop()  # a later run of op that set no row (fix-untrained finding none) hides no earlier one
        sec = runs[at[-1]].get(op.replace("-", "_")) if at else None
        if not isinstance(sec, dict):
            return None
        maps = [m for m in (prune_map(r) for r in runs[at[-1] + 1 :]) if m is not None]
        return _renumbered(sec, maps) if maps else sec
    try:
        rep = load_json(B.path / REPORT_NAME, REPORT_NAME) if (B.path / REPORT_NAME).is_file() else None
    except (CheckpointError, OSError):
        return None
    if not isinstance(rep, dict) or rep.get("operation") != op:
        return None
    sec = rep.get(op.replace("-", "_"))
    return sec if isinstance(sec, dict) else None


def _set_nothing(sec: Any) -> bool:
    """A section of a run that set no row: ``fix_untrained`` with ``ids`` empty (every row trained),
    ``rename_tokens`` whose ``init`` keeps the rows (``keep``)."""
    if not isinstance(sec, dict):
        return False
    return (sec.get("ids") == [] and not sec.get("tokens")) or sec.get("init") == "keep"


def _sections(B: Checkpoint, op: str, A: Checkpoint) -> list[dict[str, Any]]:
    """The ``op`` section of every ``op`` run of the output's chain since ``A``, in order, each with its
    ids carried through the prunes after it (:func:`_renumbered`)."""
    runs = chain_since(B.path, A.path)
    out = []
    for k, r in enumerate(runs):
        sec = r.get(op.replace("-", "_")) if r.get("operation") == op else None
        if isinstance(sec, dict):
            maps = [m for m in (prune_map(x) for x in runs[k + 1 :]) if m is not None]
            out.append(_renumbered(sec, maps) if maps else sec)
    return out


AFTER_PRUNE = "renumbered_by_a_later_prune"
"""The key :func:`_own_section` sets in a section it renumbered through the chain's later prunes."""


def _renumbered(sec: dict[str, Any], maps: list[dict[int, int]]) -> dict[str, Any]:
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


def _before_prune(res: VerifyResult, B: Checkpoint, A: Checkpoint, op: str) -> bool:
    """The ``op`` run that set rows precedes a prune of the chain since ``A``: its rows were computed from
    the rows before the prune, which verify does not hold; say so as unexplained (True)."""
    sec = _own_section(B, op, A)
    if sec is None or not sec.get(AFTER_PRUNE):
        return False
    res.unexplained.append(
        f"the output's report chain sets rows by {op} before a prune: they were computed from rows the "
        f"prune then dropped, which verify does not hold; verify the input against the {op} output, then "
        "that against this one"
    )
    return True


def _mean_claims(B: Checkpoint, A: Checkpoint | None = None) -> list[tuple[str, list[int]]]:
    """``(operation, ids)`` of the rows the output's runs say they set to the trained mean:
    ``fix-untrained``'s ``fix_untrained.ids``, and ``rename-tokens --init trained-mean``'s renamed ids
    (the last run of each that set rows)."""
    fix, ren = _own_section(B, "fix-untrained", A), _own_section(B, "rename-tokens", A)
    out = []
    if fix is not None:
        out.append(("fix-untrained", fix.get("ids")))
    if ren is not None and ren.get("init") == "trained-mean" and isinstance(ren.get("tokens"), list):
        out.append(("rename-tokens", [t.get("id") for t in ren["tokens"] if isinstance(t, dict)]))
    return [
        (op, [int(i) for i in ids])
        for op, ids in out
        if isinstance(ids, list) and ids and all(type(i) is int for i in ids)
    ]


def _fix_sources(B: Checkpoint, A: Checkpoint | None = None) -> dict[int, list[int]]:
    """``{id: source ids}`` of the rows a ``fix-untrained --init subtokens`` run says it set to the mean of
    their sub-tokens' rows (its report's tokens; the others got the trained mean)."""
    fix = _own_section(B, "fix-untrained", A) or {}
    out = {}
    for t in fix.get("tokens") or [] if fix.get("init") == "subtokens" else []:
        src = t.get("source_ids") if isinstance(t, dict) else None
        if type(t.get("id")) is int and isinstance(src, list) and src and all(type(j) is int for j in src):
            out[t["id"]] = [int(j) for j in src]
    return out


def _split_claim(B: Checkpoint, A: Checkpoint | None = None) -> dict[int, list[int]] | None:
    """``{id: source ids}`` of a ``rename-tokens --init subtokens`` run (its report's tokens), or None."""
    ren = _own_section(B, "rename-tokens", A)
    if ren is None or ren.get("init") != "subtokens" or not isinstance(ren.get("tokens"), list):
        return None
    out = {}
    for t in ren["tokens"]:
        src = t.get("source_ids") if isinstance(t, dict) else None
        if not (
            type(t.get("id")) is int and isinstance(src, list) and src and all(type(j) is int for j in src)
        ):
            return None
        out[t["id"]] = [int(j) for j in src]
    return out or None


def _tables_in(da: Detection, B: Checkpoint, emb: Table, head: Table | None, ids: list[int]) -> list[Table]:
    """The tables of the input (its embedding and a head of its own) whose entries ``ids`` the output
    still holds in the input's layout: the same name, the same size off the vocabulary axis, the ids
    within its entries (a later resize grows or trims only the vocabulary axis). A head a later ``tie``
    dropped is left out; an embedding the output lacks leaves none (nothing is then explained)."""
    out = []
    for t in [emb] + ([head] if head is not None else []):
        tb, ta = B.tensors.get(t.name), da.ckpt.tensors[t.name]
        if tb is None or len(tb.shape) != 2 or len(ta.shape) != 2:
            if t is emb:
                return []
            continue
        other = 1 - t.axis
        if tb.shape[other] != ta.shape[other] or not all(0 <= i < tb.shape[t.axis] for i in ids):
            return []
        out.append(t)
    return out


def _sources(da: Detection, B: Checkpoint, t: Table, head: Table | None) -> list[Table]:
    """The input tables whose set rows the output's table ``t`` may hold: its own, and for the embedding
    the input's head too when a ``tie`` of the chain since the input dropped that head (``tie --keep
    head`` writes the head's values, its set rows included, into the embedding)."""
    out = [t]
    if (
        head is not None
        and t.name == da.embedding.name
        and head.name not in B.tensors
        and any(r.get("operation") == "tie" for r in chain_since(B.path, da.ckpt.path))
    ):
        out.append(head)
    return out


def _mean_rows(
    da: Detection, t: Table, pool: int, leave_out: tuple[int, ...], ids: list[int], srcs: dict[int, list[int]]
) -> np.ndarray:
    """The rows ``ids`` (sorted) a mean init writes into table ``t`` of the input, ``[len(ids), hidden]``
    in its stored dtype: the trained mean, or the mean of the sub-token rows ``srcs[id]``."""
    mean = mean_row(da.ckpt, t, pool, leave_out)
    return np.concatenate([subtoken_row(da.ckpt, t, srcs[i]) if srcs.get(i) else mean for i in ids])


def split_rows(res: VerifyResult, da: Detection, B: Checkpoint) -> frozenset[int]:
    """The ids whose rows a ``rename-tokens --init subtokens`` run says it made from the rows of their
    strings' split (:func:`_split_claim`), checked bit for bit against the input
    (:func:`surgery.plan.untrained_rows.subtoken_row`) in the output's embedding and head; a contradicted
    claim is unexplained (the report is unverifiable) and explains nothing."""
    claim = _split_claim(B, da.ckpt)
    if claim is None or _before_prune(res, B, da.ckpt, "rename-tokens"):
        return frozenset()
    emb, head, pool = tables(da)
    checked = _tables_in(da, B, emb, head, list(claim))
    if not checked:
        return frozenset()
    for t in checked:
        for i, src in claim.items():
            bad = not (0 <= i < pool and all(0 <= j < pool for j in src))
            if bad or not any(
                np.array_equal(
                    stored_entries(B, t, [i]).view(np.uint8), subtoken_row(da.ckpt, s, src).view(np.uint8)
                )
                for s in _sources(da, B, t, head)
            ):
                res.unexplained.append(
                    f"tietool-report.json says rename-tokens made row {i} of {t.name} from the rows of ids "
                    f"{src[:10]}, which the files contradict; the report is unverifiable"
                )
                return frozenset()
    return frozenset(claim)


def fixed_rows(res: VerifyResult, da: Detection, B: Checkpoint) -> frozenset[int]:
    """The ids whose rows the output's runs say they set to the trained mean (:func:`_mean_claims`),
    checked: for fix-untrained each must be untrained in the input by its rule
    (:func:`surgery.plan.fix_untrained.untrained_ids`); each such row of the output's embedding and head
    must be the mean of the input's table over the rows the rule counts as trained (less the renamed ids,
    for rename-tokens; the mean of its trained source rows for ``fix-untrained --init subtokens``), bit
    for bit (:func:`surgery.plan.untrained_rows.mean_row`). When a ``tie`` of the chain ran before that
    run, its input held one table, the input's embedding or its head (:func:`_rule_views`): the claim
    holds when it holds for either. A contradicted claim is unexplained (the report is unverifiable) and
    explains nothing."""
    out: set[int] = set()
    for op, ids in _mean_claims(B, da.ckpt):
        if _before_prune(res, B, da.ckpt, op):
            return frozenset()
        got = _one_claim(res, da, B, op, ids)
        if not got:
            return frozenset()
        out |= got
    return frozenset(out)


def _one_claim(res: VerifyResult, da: Detection, B: Checkpoint, op: str, ids: list[int]) -> frozenset[int]:
    """:func:`fixed_rows` for the claim of one run ``op`` on ``ids``: checked on the folder it read (the
    input, the one table a tie before it kept, or the output with those rows taken back from the input
    when it is the chain's last run, :func:`surgery.verify.beforeset.before_set`)."""
    fails = []
    for view in _rule_views(da, B, op):
        why = _check_mean_rows(da, B, op, ids, view, da.ckpt)
        if why is None:
            return frozenset(ids)
        fails.append(why)
    read = before_set(da, B, op, ids)  # the run last after resizes / add-tokens: the folder it read
    if read is not None:
        dr = detect(read, compare_values=False)
        emb, head, _ = tables(dr)
        if _check_mean_rows(dr, B, op, ids, (emb, head), da.ckpt) is None:
            return frozenset(ids)
    if fails[0]:
        res.unexplained.append(fails[0])
    return frozenset()


def _rule_views(da: Detection, B: Checkpoint, op: str) -> list[tuple[Table, Table | None]]:
    """The tables the ``op`` run read its rule and means from: the input's embedding and head; when a
    ``tie`` of the chain since the input ran before it and the output holds no head of its own, the one
    table the tie left, the input's embedding (``--keep embedding``) or its head (``--keep head``)."""
    emb, head, _ = tables(da)
    if head is None or head.name in B.tensors:
        return [(emb, head)]
    runs = chain_since(B.path, da.ckpt.path)
    at = [k for k, r in enumerate(runs) if r.get("operation") == op]
    if at and any(r.get("operation") == "tie" for r in runs[: at[-1]]):
        return [(emb, None), (head, None)]
    return [(emb, head)]


def _check_mean_rows(
    da: Detection, B: Checkpoint, op: str, ids: list[int], view: tuple[Table, Table | None], A: Checkpoint
) -> str | None:
    """None when the ``op`` claim on ``ids`` holds with the rule read on ``view`` of ``da`` (the folder
    the run read; :func:`fixed_rows`), the run's report section read in the chain since ``A``; else why
    not ("" when the output holds no table to check: nothing is explained, nothing said)."""
    emb, head, pool = tables(da)
    if view[1] is None and head is not None:  # one table: the rule of a tied model
        special = kept_special(da)
        found = [i for i in find_untrained(da.ckpt, view[0], None, pool, set(), EPS) if i not in special]
    else:
        found, _ = untrained_ids(da)
    wrong = [i for i in ids if i not in set(found)] if op == "fix-untrained" else []
    if wrong:
        return (
            f"tietool-report.json says fix-untrained set row(s) {', '.join(map(str, wrong[:10]))}, which "
            "are trained in the input (or kept as special) by its rule; the report is unverifiable"
        )
    srcs = _fix_sources(B, A) if op == "fix-untrained" else {}
    if any(j in set(found) or j >= da.vocab_rows for src in srcs.values() for j in src):
        return (
            "tietool-report.json says fix-untrained set rows from the rows of untrained ids; the report is "
            "unverifiable"
        )
    leave_out = tuple(sorted(set(found) | (set(ids) if op == "rename-tokens" else set())))
    checked = _tables_in(da, B, emb, head, ids)
    if not checked:
        return ""
    for t in checked:
        got = stored_entries(B, t, sorted(ids)).view(np.uint8)
        sources = [view[0]] if view[1] is None and head is not None else _sources(da, B, t, head)
        if not any(
            np.array_equal(got, _mean_rows(da, s, pool, leave_out, sorted(ids), srcs).view(np.uint8))
            for s in sources
        ):
            return (
                f"tietool-report.json says {op} set rows {', '.join(map(str, sorted(ids)[:10]))} of {t.name} "
                "to the mean of the input's trained rows, which the files contradict; the report is "
                "unverifiable"
            )
    return None


def rename_claims(
    B: Checkpoint, va: dict[int, str], vb: dict[int, str], A: Checkpoint | None = None
) -> dict[int, tuple[str, str]]:
    """``{id: (old, new)}`` of the renames the output's own ``rename-tokens`` run lists (with ``A``: every
    ``rename-tokens`` run of its chain since ``A``) that the files bear out: ``old`` at the id in the
    input (``va``) and a reserved slot's string (:func:`surgery.io.tokenizer_rename.is_reserved`), ``new``
    there in the output (``vb``)."""
    secs = _sections(B, "rename-tokens", A) if A is not None else [_own_section(B, "rename-tokens")]
    entries = [e for sec in secs if sec is not None for e in (sec.get("tokens") or [])]
    return {
        e["id"]: (e["old"], e["new"])
        for e in (entries if isinstance(entries, list) else [])
        if isinstance(e, dict)
        and isinstance(e.get("id"), int)
        and isinstance(e.get("old"), str)
        and va.get(e["id"]) == e["old"]
        and vb.get(e["id"]) == e.get("new")
        and is_reserved(e["old"])
    }


def special_claims(B: Checkpoint, A: Checkpoint | None = None) -> dict[str, tuple[str, int]]:
    """``{name: (token, id)}`` of the special tokens the output's own ``rename-tokens`` run set (its
    report's ``rename_tokens.special_set``) that the output's tokenizer bears out (the token at that id);
    their ``<name>_token_id`` config keys and ``<name>_token`` tokenizer keys may differ from the input's."""
    sec = _own_section(B, "rename-tokens", A)
    entries = sec.get("special_set") if sec is not None else None
    if not isinstance(entries, list) or not entries:
        return {}
    vb = vocabulary(B.path)
    return {
        e["name"]: (e["token"], e["id"])
        for e in entries
        if isinstance(e, dict)
        and e.get("name") in SPECIAL_NAMES
        and isinstance(e.get("id"), int)
        and vb.get(e["id"]) == e.get("token")
    }
