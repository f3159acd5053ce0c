"""``fix-untrained``: the rows a model never trained set to the mean of the trained ones, as unsloth's
``fix_untrained_tokens`` does (the rule and its source: :mod:`surgery.plan.untrained_rows`).

The planner :func:`plan_fix_untrained` reads the embedding and the head once to find the rows, and plans
one :class:`~surgery.plan.untrained_rows.MeanRows` recipe per table: only those rows change, every other
byte of the checkpoint is kept. Shapes, config and tokenizer files stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..inspect.detection import Detection
from ..io.tokenizer import token_strings
from ..model.enums import HeadLayout, TieState
from ..model.errors import Opt, RefusedError, UsageError
from .plan import OutTensor, Plan, base_plan, out_dtype, refuse_unsettled_pair, refuse_unusable_head
from .untrained_rows import EPS, KEPT_SPECIAL, MeanRows, Table, find_untrained, trained_mean

FIX_INITS = ("trained-mean", "subtokens")
"""The init choices: ``trained-mean``, unsloth's value (the mean of the trained rows); ``subtokens``, the
mean of the rows of the token's text as the tokenizer splits it without the token, the trained mean where
that split is empty or uses an untrained row (:func:`subtoken_sources`). The source: unsloth-zoo
``tokenizer_utils.add_new_tokens`` (github.com/unslothai/unsloth-zoo, read at commit 0802de02), whose
``interpolation`` method takes each token's ``tokenizer(token).input_ids`` and the float32 mean of those
rows; here the split is made with the token taken out of the tokenizer, so the text is split into the
pieces it is made of (unsloth splits after adding it)."""

RULE = (
    "unsloth fix_untrained_tokens: max(row) <= 1e-16 in the embedding and in the head (or a head row, "
    "rounded to 3 decimals, repeated among those), bos/eos/unk/sep/pad/cls/mask ids excepted; set to the "
    "mean of the other rows"
)

_SPECIAL_KEY = re.compile(r"(?:^|\.)(" + "|".join(KEPT_SPECIAL) + r")_token(?:_id|_ids)?$")


def kept_special(det: Detection) -> dict[int, str]:
    """``{id: why}`` of the ids unsloth never counts as untrained: those the configuration files name as
    a bos/eos/unk/sep/pad/cls/mask token (:data:`~surgery.plan.untrained_rows.KEPT_SPECIAL`; config.json,
    generation_config.json, tokenizer_config.json), first naming kept."""
    out: dict[int, str] = {}
    for s in det.special_ids:
        m = _SPECIAL_KEY.search(s.key)
        if m and s.id not in out:
            why = f"{s} (a {m.group(1)} token"
            out[s.id] = why + (": zero by design, padding_idx)" if m.group(1) == "pad" else ")")
    return out


def plan_fix_untrained(det: Detection, ids: Sequence[int] | None = None, init: str = "trained-mean") -> Plan:
    """Plan the untrained rows of the embedding and the head set to the mean of their trained rows.

    The rows: :func:`~surgery.plan.untrained_rows.find_untrained` over the first ``min(embedding rows, head
    rows)`` entries (the head's rows are columns of a ``[hidden, vocab]`` head), less the special ids
    (:func:`kept_special`); ``ids`` restricts them (every one must be untrained). The embedding (and its
    aliases) gets the mean of its trained rows; a head stored apart the mean of its own, unless it is
    bit-equal to the embedding (it then stays equal); a tied model has one tensor. Head biases and other
    tables are kept (unsloth sets neither). ``--init`` ``trained-mean`` only.

    Raises:
        UsageError: an unknown ``init``; an id in ``ids`` that is not an untrained row.
        RefusedError: an unsettled or unusable pair, vocabulary tables beyond the pair, every row untrained.
    """
    if init not in FIX_INITS:
        raise UsageError(f"unknown {Opt('init')} {init!r}", fix=f"use one of {', '.join(FIX_INITS)}")
    _refuse(det)
    emb, head, pool = tables(det)
    found, kept = untrained_ids(det)
    _refuse_no_trained(det, found, kept, pool)
    chosen = _chosen(det, found, kept, ids)
    plan = base_plan("fix-untrained", det)
    norms: dict[str, float] = {}
    sources = subtoken_sources(det, chosen, found) if init == "subtokens" and chosen else {}
    if chosen:
        srcs = {i: s for i, (s, _) in sources.items()}
        set_mean_rows(det, plan, emb, head, tuple(chosen), tuple(found), pool, norms, srcs)
    plan.extra_report = _report(det, chosen, found, kept, pool, norms, init)
    for t in plan.extra_report["tokens"]:
        src, why = sources.get(t["id"], ((), ""))
        t["init"] = "subtokens" if src else "trained-mean"
        t["source_ids"] = list(src) if init == "subtokens" else None
        if why:
            t["fallback"] = why
    _notes(plan, plan.extra_report["tokens"], kept)
    return plan


def subtoken_sources(
    det: Detection, chosen: list[int], found: list[int]
) -> dict[int, tuple[tuple[int, ...], str]]:
    """``{id: (source ids, why the trained mean instead)}`` of ``--init subtokens``: the ids the folder's
    tokenizer splits each token's text into with the untrained tokens taken out
    (:func:`surgery.io.tokenizer_split.splits_without`); no source ids (the trained mean) where the split
    is empty, uses an untrained row or an id beyond the rows, or the folder has no tokenizer to split with."""
    from ..io.tokenizer_split import splits_without  # tokenizer libraries, lazily

    splits = splits_without(det.ckpt.path, sorted(set(found) | set(chosen)))
    _, _, pool = tables(det)
    bad = set(found)
    out: dict[int, tuple[tuple[int, ...], str]] = {}
    for i in chosen:
        s = splits.get(i)
        if s is None:
            out[i] = ((), "no tokenizer.json or SentencePiece model to split its text with")
        elif not s:
            out[i] = ((), "its text splits into nothing")
        elif any(j in bad or j >= pool for j in s):
            out[i] = ((), f"its split {list(s)} uses an untrained row")
        else:
            out[i] = (s, "")
    return out


def tables(det: Detection) -> tuple[Table, Table | None, int]:
    """The embedding, the head as a table of its own (None: tied, one tensor), and the entries the rule
    reads: ``min(embedding rows, head rows)``."""
    emb, head = Table(det.embedding.name), _head_table(det)
    hrows = det.head.rows if head is not None and det.head.rows is not None else det.vocab_rows
    return emb, head, min(det.vocab_rows, hrows)


def untrained_ids(det: Detection) -> tuple[list[int], dict[int, str]]:
    """The ids unsloth's rule finds untrained (:func:`~surgery.plan.untrained_rows.find_untrained` over
    :func:`tables`), and ``{id: why}`` of those it keeps as special (:func:`kept_special`)."""
    emb, head, pool = tables(det)
    special = kept_special(det)
    small = find_untrained(det.ckpt, emb, head, pool, set(), EPS)
    return [i for i in small if i not in special], {i: special[i] for i in small if i in special}


def _head_table(det: Detection) -> Table | None:
    """The head as a table of its own (None: a tied model, one tensor)."""
    h = det.head
    if not h.present or h.name == det.embedding.name or h.name in det.embedding.aliases:
        return None
    return Table(h.name, 1 if h.layout is HeadLayout.HIDDEN_VOCAB else 0)


def _refuse_no_trained(det: Detection, found: list[int], kept: dict[int, str], pool: int) -> None:
    """Refuse a table whose every entry the rule finds untrained: no trained entry to take the mean of.

    Raises:
        RefusedError: naming the embedding and the count.
    """
    if found and len(found) + len(kept) >= pool:
        raise RefusedError(
            f"fix-untrained refused: every one of the {pool} rows of {det.embedding.name} is untrained by "
            "unsloth's rule (no value above 1e-16, e.g. rows of only negative values): there is no trained "
            "row to take the mean of",
            det.ckpt.path,
            "check that this is a trained model; untrained rows are set from trained ones",
        )


def _chosen(det: Detection, found: list[int], kept: dict[int, str], ids: Sequence[int] | None) -> list[int]:
    """The rows to set: ``found``, or the ``ids`` asked for (each must be among ``found``)."""
    if ids is None:
        return found
    bad = [i for i in dict.fromkeys(ids) if i not in set(found)]
    if bad:
        i = bad[0]
        why = kept.get(i) or "its row is trained (a value above 1e-16 in the embedding or the head)"
        if not 0 <= i < det.vocab_rows:
            why = f"the embedding has {det.vocab_rows} rows"
        raise UsageError(
            f"{Opt('ids', i)} is not an untrained row: {why}",
            det.ckpt.path,
            f"leave it out (untrained rows: {found[:20] or 'none'})",
        )
    return sorted(set(ids))


def set_mean_rows(
    det: Detection,
    plan: Plan,
    emb: Table,
    head: Table | None,
    chosen: tuple[int, ...],
    found: tuple[int, ...],
    pool: int,
    norms: dict[str, float],
    sources: dict[int, tuple[int, ...]] | None = None,
) -> None:
    """Plan rows ``chosen`` of the embedding (and its aliases) and of the head (and its aliases; the
    embedding's recipe when bit-equal to it) set to the mean of the table's entries ``0..pool-1`` not in
    ``found``: one :class:`MeanRows` per table, the norm of each mean in ``norms`` by tensor name.
    ``sources`` (id → ids): those rows the mean of the rows of their ids instead (``subtokens``)."""
    ckpt = det.ckpt
    srcs = tuple((sources or {}).get(i, ()) for i in chosen) if sources else ()
    recipe = MeanRows(emb.name, 0, chosen, found, pool, srcs)
    tables = [(n, recipe) for n in [emb.name, *det.embedding.aliases]]
    if head is not None:
        equal = det.comparison.values is TieState.EXACT and head.axis == 0
        hrec = recipe if equal else MeanRows(head.name, head.axis, chosen, found, pool, srcs)
        tables += [(n, hrec) for n in [head.name, *det.head.aliases]]
    for name, r in tables:
        t = ckpt.tensors[name]
        plan.replace[name] = OutTensor(
            name, out_dtype(ckpt, t, plan.relabel_u16), t.shape, r, t.file, storage=t.storage
        )
        if r.name not in norms:
            mean = trained_mean(ckpt, Table(r.name, r.axis), pool, found)
            norms[r.name] = float(np.linalg.norm(mean.astype(np.float64)))
        norms[name] = norms[r.name]


def _refuse(det: Detection) -> None:
    """What fix-untrained refuses: an unsettled or unusable pair, and vocabulary tables beyond it (MTP
    copies, per-layer tables: which of their rows are untrained is not unsloth's rule)."""
    refuse_unsettled_pair(det, "fix-untrained")
    refuse_unusable_head(det, "fix-untrained")
    extra = det.beyond.extra_tables + det.embedding.vocab_aliases
    if extra:
        raise RefusedError(
            f"fix-untrained refused: {', '.join(extra)} (a vocabulary table beside the embedding and the "
            "head) would keep the old rows",
            det.ckpt.path,
            "fix the rows with a tool that loads the whole model; tietool sets the embedding and head only",
        )
    if det.head.present and det.head.vocab is not None:
        raise RefusedError(
            f"fix-untrained refused: the head {det.head.name} is over another vocabulary "
            f"(config.json {det.head.vocab}): unsloth's rule reads the embedding's rows beside the head's",
            det.ckpt.path,
            f"name the LM head of the embedding's vocabulary ({Opt('head')}), if the model has one",
        )
    if not det.embedding.present:
        raise RefusedError(
            f"fix-untrained refused: the input embedding {det.embedding.name} is missing",
            det.ckpt.path,
            "run untie first",
        )


def _report(
    det: Detection,
    chosen: list[int],
    found: list[int],
    kept: dict[int, str],
    pool: int,
    norms: dict[str, float],
    init: str,
) -> dict[str, Any]:
    """The report's ``fix_untrained`` fields."""
    names = token_strings(det.ckpt.path, chosen) if chosen else {}
    return {
        "rule": RULE,
        "eps": EPS,
        "init": init,
        "rows_scanned": pool,
        "untrained": len(found),
        "trained_rows": pool - len(found),
        "ids": chosen,
        "tokens": [{"id": i, "content": names.get(i)} for i in chosen],
        "kept_special": [{"id": i, "why": w} for i, w in sorted(kept.items())],
        "mean_norm": norms,
    }


def _notes(plan: Plan, tokens: list[dict[str, Any]], kept: dict[int, str]) -> None:
    """Notes: the rows set (``tokens``: id and content), the special rows kept (the pad row zero by
    design)."""
    if tokens:
        shown = ", ".join(
            f"{t['id']} ({t['content']!r})" if t["content"] is not None else str(t["id"]) for t in tokens[:20]
        )
        more = ", …" if len(tokens) > 20 else ""
        sub = [t for t in tokens if t.get("init") == "subtokens"]
        if sub:
            plan.notes.append(
                f"{len(tokens)} untrained row(s) set, {len(sub)} to the mean of their text's sub-tokens "
                f"and the rest to the mean of the trained rows: {shown}{more}"
            )
        else:
            plan.notes.append(
                f"{len(tokens)} untrained row(s) set to the mean of the trained rows: {shown}{more}"
            )
        for t in tokens:
            if t.get("fallback"):
                plan.notes.append(f"row {t['id']}: the trained mean, not subtokens: {t['fallback']}")
    else:
        plan.notes.append("no untrained row (unsloth's rule): nothing to set")
    for i, why in sorted(kept.items()):
        plan.notes.append(f"row {i} is untrained by the rule but kept as it is: {why}")
