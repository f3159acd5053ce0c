"""``rename-tokens``: reserved or unused slots given new strings, the model never grown (the planner
:func:`plan_rename_tokens`).

The tokenizer's half is a :class:`~surgery.model.tokens.TokenEdit` of the same length
(:func:`surgery.io.tokenizer_rename.rename_tokens_edit`). Here the rows: kept as they are (``keep``), or set
to the mean of the trained rows (``trained-mean``, the value fix-untrained gives untrained rows:
:func:`surgery.plan.fix_untrained.set_mean_rows`). Shapes and config stay.
"""

from __future__ import annotations

from typing import Any

from ..inspect import chunked
from ..inspect.detect import Detection
from ..model.errors import Opt, RefusedError, UsageError
from ..model.tokens import TokenEdit
from .fix_untrained import set_mean_rows as _set_mean_rows
from .fix_untrained import tables, untrained_ids
from .plan import Plan, base_plan, refuse_unsettled_pair, refuse_unusable_head

RENAME_INITS = ("keep", "trained-mean")
"""The rows of renamed slots: ``keep`` (as they are), ``trained-mean`` (the mean of the trained rows)."""


def plan_rename_tokens(
    det: Detection,
    edit: TokenEdit,
    old: dict[int, str],
    init: str = "keep",
    config_sets: list[tuple[str, str, object]] | None = None,
    specials: dict[str, tuple[str, int]] | None = None,
) -> Plan:
    """Plan the tokenizer files of ``edit`` (each slot's id keeps its row) and, for ``trained-mean``, the
    rows of the renamed ids set to the mean of the rows unsloth's rule counts as trained (the renamed ids
    and every untrained row left out of the mean); ``old``: each id's string before. ``config_sets`` and
    ``specials`` (``name → (token, id)``): the special tokens set (:mod:`surgery.io.special_tokens`).

    Raises:
        UsageError: an unknown ``init``.
        RefusedError: an id with no row, an unsettled or unusable pair.
    """
    if init not in RENAME_INITS:
        raise UsageError(f"unknown {Opt('init')} {init!r}", fix=f"use one of {', '.join(RENAME_INITS)}")
    refuse_unsettled_pair(det, "rename-tokens")
    refuse_unusable_head(det, "rename-tokens")
    ids = sorted(t.id for t in edit.tokens)
    _, _, pool = tables(det)
    beyond = [i for i in ids if i >= pool]
    if beyond:
        raise RefusedError(
            f"rename-tokens refused: id {beyond[0]} has no row (the tables have {pool})",
            det.ckpt.path,
            "rename a slot below the rows",
        )
    plan = base_plan("rename-tokens", det)
    plan.tokenizer = edit
    plan.config_set += config_sets or []
    norms: dict[str, float] = {}
    if init == "trained-mean":
        emb, head, pool = tables(det)
        found, _ = untrained_ids(det)
        leave_out = tuple(sorted(set(found) | set(ids)))
        _set_mean_rows(det, plan, emb, head, tuple(ids), leave_out, pool, norms)
    plan.extra_report = _report(edit, old, init, norms)
    plan.extra_report["special_set"] = [
        {"name": n, "token": t, "id": i} for n, (t, i) in sorted((specials or {}).items())
    ]
    _notes(plan, det, ids, init)
    for n, (t, i) in sorted((specials or {}).items()):
        plan.notes.append(
            f"{n} token: {t!r} (id {i}) in the tokenizer files, config.json and generation config"
        )
    return plan


def _report(edit: TokenEdit, old: dict[int, str], init: str, norms: dict[str, float]) -> dict[str, Any]:
    """The report's ``rename_tokens`` fields."""
    return {
        "tokens": [
            {"id": t.id, "old": old.get(t.id), "new": t.content, "special": t.special} for t in edit.tokens
        ],
        "init": init,
        "mean_norm": norms,
        "tokenizer_length": edit.length_after,
        "files_edited": sorted(edit.files),
    }


def _notes(plan: Plan, det: Detection, ids: list[int], init: str) -> None:
    """The renames in words; a warning for kept rows that are all zero (never trained)."""
    for t in plan.extra_report["tokens"]:
        plan.notes.append(f"id {t['id']}: {t['old']!r} → {t['new']!r}")
    if init != "keep":
        return
    zero = chunked.zero_rows(det.ckpt, det.embedding.name, ids)
    if zero:
        plan.warnings.append(
            f"the rows of id(s) {', '.join(map(str, zero))} are all zero (never trained) and are kept: train "
            f"them in the fine-tune, or give them the trained mean ({Opt('init', 'trained-mean')})"
        )
