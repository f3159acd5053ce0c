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
from .beforeset import before_set, with_rows
from .claims import SETS, Claim, claims, every_claim, renumbered
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
        return renumbered(sec, maps) if maps else sec
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
            out.append(renumbered(sec, maps) if maps else sec)
    return out


def _crosses(c: Claim, every: list[Claim]) -> bool:
    """The run of claim ``c`` and a prune of the chain are on either side of it, or an earlier set-run and
    ``c``'s are (``every``: :func:`surgery.verify.claims.every_claim`): its rows or the rows it read are
    checked through :func:`_across_prune`."""
    return c.after_prune or any(d.after_prune and d.at < c.at for d in every)


def _across_prune(
    res: VerifyResult, da: Detection, B: Checkpoint, c: Claim, original: Any
) -> frozenset[int] | None:
    """Claim ``c`` (:func:`_crosses`) checked on the folder its run read, rebuilt (:func:`_read_before`)
    from the chain's original input (``original``, before any prune) and that input pruned (``da``): each
    row that reached the output (at its id there, :attr:`~surgery.verify.claims.Claim.out`) must equal the
    one recomputed, bit for bit. Returns the output's ids explained (none: the claim is contradicted,
    said); None, with why, when that folder is not rebuilt: a run before it other than a set-run
    (fix-untrained, rename-tokens) or, for a run after the prunes, a prune; a set-run between two prunes;
    or the original not known."""
    runs = chain_since(B.path, da.ckpt.path)
    ops = [str(r.get("operation")) for r in runs[: c.at]]
    allowed = SETS if c.after_prune else (*SETS, "prune")
    other = next((o for o in ops if o not in allowed), None)
    cut = [k for k, o in enumerate(ops) if o == "prune"]
    if other is None and cut and any(o in SETS for o in ops[cut[0] : cut[-1]]):
        other = "set-run between two prunes"
    if original is None or other is not None:
        where = "before a prune" if c.after_prune else "after a prune, on rows a run set before it"
        after = f" (a {other} before it)" if other is not None else ""
        res.unexplained.append(
            f"the output's report chain sets rows by {c.op} {where}{after}: verify does not rebuild the rows "
            f"that run read; verify the input against the {c.op} output, then that against this one"
        )
        return None
    dv = detect(_read_before(Checkpoint.open(original), da.ckpt, B, c), compare_values=False)
    if c.split:
        ok = _split_holds(res, dv, B, c)
    else:
        why = _check_mean_rows(dv, B, c, tables(dv)[:2])
        if why:
            res.unexplained.append(why)
        ok = why is None
    return frozenset(c.out_ids()) if ok else frozenset()


def _read_before(A: Checkpoint, pruned: Checkpoint, B: Checkpoint, c: Claim) -> Checkpoint:
    """The folder the run of claim ``c`` read, the rows each earlier set-run of the chain wrote (every one,
    later set again or not) recomputed in order, each on the folder its own run read (:func:`_written`):
    for a run a prune follows, the original input ``A`` with those rows; for a run after the prunes, the
    input ``pruned`` with those rows (a run before the prunes: the ones they kept, at their new ids)."""
    orig, out = A, pruned
    for d in every_claim(B, A):
        if d.at >= c.at:
            break
        rows = _written(detect(orig if d.after_prune else out, compare_values=False), d)
        if d.out is not None:
            orig = with_rows(orig, rows)
            m = d.out
            rows = {n: (axis, {m[i]: r for i, r in got.items() if i in m}) for n, (axis, got) in rows.items()}
        out = with_rows(out, rows)
    return orig if c.after_prune else out


def _written(dv: Detection, d: Claim) -> dict[str, tuple[int, dict[int, np.ndarray]]]:
    """The rows the run of claim ``d`` wrote for each of its ids (``d.every``), computed on the folder it
    read (``dv``), per table: ``{name: (vocabulary axis, {id: row})}``."""
    emb, head, pool = tables(dv)
    ids = list(d.every)
    leave_out = tuple(sorted(set(_found(dv, (emb, head))) | (set(ids) if d.op == "rename-tokens" else set())))
    out = {}
    for t in [emb] + ([head] if head is not None else []):
        if d.split:
            rows = np.concatenate([subtoken_row(dv.ckpt, t, d.sources[i]) for i in ids])
        else:
            rows = _mean_rows(dv, t, pool, leave_out, ids, d.sources)
        out[t.name] = (t.axis, dict(zip(ids, rows, strict=True)))
    return out


def _found(da: Detection, view: tuple[Table, Table | None]) -> list[int]:
    """The ids fix-untrained's rule finds untrained in ``da``, read on ``view`` (:func:`_rule_views`)."""
    emb, head, pool = tables(da)
    if view[1] is None and head is not None:  # one table: the rule of a tied model
        special = kept_special(da)
        return [i for i in find_untrained(da.ckpt, view[0], None, pool, set(), EPS) if i not in special]
    return untrained_ids(da)[0]


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


def split_rows(res: VerifyResult, da: Detection, B: Checkpoint, original: Any = None) -> frozenset[int]:
    """The ids whose rows a ``rename-tokens --init subtokens`` run of the chain says it made from the rows
    of their strings' split (:func:`surgery.verify.claims.claims`: each run's ids no later run set
    again), checked bit for bit against the input (:func:`surgery.plan.untrained_rows.subtoken_row`) in
    the output's embedding and head; a contradicted claim is unexplained (the report is unverifiable) and
    explains nothing. A run a prune follows is checked on ``original`` (:func:`_across_prune`)."""
    out: set[int] = set()
    every = every_claim(B, da.ckpt)
    for c in claims(B, da.ckpt):
        if not c.split:
            continue
        if _crosses(c, every):
            got = _across_prune(res, da, B, c, original)
            if not got:
                return frozenset()
            out |= got
        elif _split_holds(res, da, B, c):
            out |= set(c.ids)
        else:
            return frozenset()
    return frozenset(out)


def _split_holds(res: VerifyResult, da: Detection, B: Checkpoint, c: Claim) -> bool:
    """:func:`split_rows` for one claim: False (and why, when the output holds its tables) when a row is
    not the mean of its source rows in the input (``da``: the folder its run read; the output's row of id
    ``i`` is at ``c.out[i]`` when a prune followed)."""
    emb, head, pool = tables(da)
    at = dict(zip(c.ids, c.out_ids(), strict=True))
    checked = _tables_in(da, B, emb, head, list(at.values()))
    for t in checked:
        for i in c.ids:
            src = c.sources[i]
            bad = not (0 <= i < pool and all(0 <= j < pool for j in src))
            if bad or not any(
                np.array_equal(
                    stored_entries(B, t, [at[i]]).view(np.uint8), subtoken_row(da.ckpt, s, src).view(np.uint8)
                )
                for s in _sources(da, B, t, head)
            ):
                moved = f" (id {at[i]} after the prune)" if c.after_prune else ""
                res.unexplained.append(
                    f"tietool-report.json says rename-tokens made row {i}{moved} of {t.name} from the rows "
                    f"of ids {src[:10]}, which the files contradict; the report is unverifiable"
                )
                return False
    return bool(checked)


def fixed_rows(res: VerifyResult, da: Detection, B: Checkpoint, original: Any = None) -> frozenset[int]:
    """The ids whose rows the output's runs say they set to the trained mean (every ``fix-untrained`` and
    ``rename-tokens --init trained-mean`` run of the chain, :func:`surgery.verify.claims.claims`: each
    run's ids no later run set again), checked: for fix-untrained each must be untrained by its rule in
    the folder it read (:func:`surgery.plan.fix_untrained.untrained_ids`); each such row of the output's
    embedding and head must be the mean of that folder's table over the rows the rule counts as trained
    (less the renamed ids, for rename-tokens; the mean of its trained source rows for ``fix-untrained
    --init subtokens``), bit for bit (:func:`surgery.plan.untrained_rows.mean_row`). When a ``tie`` of
    the chain ran before that run, its input held one table, the input's embedding or its head
    (:func:`_rule_views`): the claim holds when it holds for either. A run a prune follows is checked on
    ``original``, the chain's input before the prune (:func:`_across_prune`). A contradicted claim is
    unexplained (the report is unverifiable) and explains nothing."""
    out: set[int] = set()
    every, runs = claims(B, da.ckpt), every_claim(B, da.ckpt)
    for c in every:
        if c.split:
            continue
        if _crosses(c, runs):
            got = _across_prune(res, da, B, c, original)
            if not got:
                return frozenset()
            out |= got
            continue
        later = sorted({i for d in every if d.at >= c.at for i in d.every})
        got = _one_claim(res, da, B, c, later)
        if not got:
            return frozenset()
        out |= got
    return frozenset(out)


def _one_claim(res: VerifyResult, da: Detection, B: Checkpoint, c: Claim, later: list[int]) -> frozenset[int]:
    """:func:`fixed_rows` for claim ``c``: checked on the folder its run read (the input, the one table a
    tie before it kept, or, after other runs that grew the vocabulary or set rows, the output with the rows
    ``later`` (those its run and the runs after it set) taken back from the input,
    :func:`surgery.verify.beforeset.before_set`)."""
    fails = []
    for view in _rule_views(da, B, c):
        why = _check_mean_rows(da, B, c, view)
        if why is None:
            return frozenset(c.ids)
        fails.append(why)
    own = list(c.every) if c.op == "fix-untrained" else []  # a renamed row's old value is not read
    read = before_set(da, B, c.at, later, own)
    if read is not None:
        dr = detect(read, compare_values=False)
        emb, head, _ = tables(dr)
        if _check_mean_rows(dr, B, c, (emb, head)) is None:
            return frozenset(c.ids)
    if fails[0]:
        res.unexplained.append(fails[0])
    return frozenset()


def _rule_views(da: Detection, B: Checkpoint, c: Claim) -> list[tuple[Table, Table | None]]:
    """The tables the run of claim ``c`` read its rule and means from: the input's embedding and head;
    when a ``tie`` of the chain since the input ran before it and the output holds no head of its own,
    the one table the tie left, the input's embedding (``--keep embedding``) or its head (``--keep
    head``)."""
    emb, head, _ = tables(da)
    if head is None or head.name in B.tensors:
        return [(emb, head)]
    runs = chain_since(B.path, da.ckpt.path)
    if any(r.get("operation") == "tie" for r in runs[: c.at]):
        return [(emb, None), (head, None)]
    return [(emb, head)]


def _check_mean_rows(da: Detection, B: Checkpoint, c: Claim, view: tuple[Table, Table | None]) -> str | None:
    """None when claim ``c`` holds with the rule read on ``view`` of ``da`` (the folder the run read;
    :func:`fixed_rows`); else why not ("" when the output holds no table to check: nothing is explained,
    nothing said)."""
    emb, head, pool = tables(da)
    found = _found(da, view)
    wrong = [i for i in c.every if i not in set(found)] if c.op == "fix-untrained" else []
    if wrong:
        return (
            f"tietool-report.json says fix-untrained set row(s) {', '.join(map(str, wrong[:10]))}, which "
            "are trained in the input (or kept as special) by its rule; the report is unverifiable"
        )
    srcs = c.sources
    if any(j in set(found) or j >= da.vocab_rows for src in srcs.values() for j in src):
        return (
            "tietool-report.json says fix-untrained set rows from the rows of untrained ids; the report is "
            "unverifiable"
        )
    leave_out = tuple(sorted(set(found) | (set(c.every) if c.op == "rename-tokens" else set())))
    ids, at = list(c.ids), c.out_ids()  # its ids in the folder it read, and in the output
    checked = _tables_in(da, B, emb, head, at)
    if not checked:
        return ""
    for t in checked:
        got = stored_entries(B, t, at).view(np.uint8)
        sources = [view[0]] if view[1] is None and head is not None else _sources(da, B, t, head)
        if not any(
            np.array_equal(got, _mean_rows(da, s, pool, leave_out, ids, srcs).view(np.uint8)) for s in sources
        ):
            moved = f" (ids {', '.join(map(str, at[:10]))} after the prune)" if c.after_prune else ""
            return (
                f"tietool-report.json says {c.op} set rows {', '.join(map(str, ids[:10]))}{moved} of "
                f"{t.name} to the mean of the input's trained rows, which the files contradict; the report "
                "is unverifiable"
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
