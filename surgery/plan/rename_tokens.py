"""``rename-tokens``: reserved or unused slots given new strings, the model never grown (the planner
:func:`plan_rename_tokens`).

The tokenizer's half is a :class:`~surgery.model.tokens.TokenEdit` of the same length
(:func:`surgery.io.tokenizer_rename.rename_tokens_edit`). Here the rows: kept as they are (``keep``), or set
to the mean of the trained rows (``trained-mean``, the value fix-untrained gives untrained rows:
:func:`surgery.plan.fix_untrained.set_mean_rows`). Shapes and config stay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..inspect import chunked
from ..inspect.detection import Detection
from ..model.enums import TieState, TokenInit
from ..model.errors import Opt, RefusedError, UsageError
from ..model.tokens import TokenEdit
from .fix_untrained import set_mean_rows as _set_mean_rows
from .fix_untrained import tables, untrained_ids
from .plan import OutTensor, Plan, base_plan, out_dtype, refuse_unsettled_pair, refuse_unusable_head
from .recipes import EditedTable, TokenInitRows, TokenSpec

RENAME_INITS = ("keep", "trained-mean", "subtokens")
"""The rows of renamed slots: ``keep`` (as they are), ``trained-mean`` (the mean of the trained rows),
``subtokens`` (the mean of the rows of the ids the new string splits into before the rename, as add-tokens'
``subtokens``)."""


def plan_rename_tokens(
    det: Detection,
    edit: TokenEdit,
    old: dict[int, str],
    init: str = "keep",
    config_sets: list[tuple[str, str, object]] | None = None,
    specials: dict[str, tuple[str, int]] | None = None,
    subtokens: dict[int, tuple[int, ...]] | None = None,
) -> Plan:
    """Plan the tokenizer files of ``edit`` (each slot's id keeps its row) and, for ``trained-mean``, the
    rows of the renamed ids set to the mean of the rows unsloth's rule counts as trained (the renamed ids
    and every untrained row left out of the mean); ``old``: each id's string before. ``config_sets`` and
    ``specials`` (``name → (token, id)``): the special tokens set (:mod:`surgery.io.special_tokens`).
    ``subtokens`` (``id → the ids its new string splits into before the rename``): for ``subtokens``, each
    row the mean of those rows (:func:`surgery.plan.recipes.token_rows`, as add-tokens makes them).

    Raises:
        UsageError: an unknown ``init``; ``subtokens`` without a split for every id.
        RefusedError: an id with no row, an unsettled or unusable pair, a float64 table (``subtokens``:
            the rows between the renamed ones go through float32).
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
    elif init == "subtokens":
        _subtoken_rows(det, plan, ids, subtokens or {})
    plan.extra_report = _report(edit, old, init, norms)
    for t in plan.extra_report["tokens"]:
        t["source_ids"] = list((subtokens or {}).get(t["id"], ())) if init == "subtokens" else None
    plan.extra_report["special_set"] = [
        {"name": n, "token": t, "id": i} for n, (t, i) in sorted((specials or {}).items())
    ]
    _notes(plan, det, ids, init)
    for n, (t, i) in sorted((specials or {}).items()):
        plan.notes.append(
            f"{n} token: {t!r} (id {i}) in the tokenizer files, config.json and generation config"
        )
    return plan


def _subtoken_rows(det: Detection, plan: Plan, ids: list[int], subs: dict[int, tuple[int, ...]]) -> None:
    """Rows ``ids`` of the embedding (and aliases) and of the head (its columns when ``[hidden, vocab]``; the
    embedding's recipe when bit-equal) made as add-tokens' ``subtokens`` makes them: one
    :class:`~surgery.plan.recipes.EditedTable` per table, of as many entries as it has, from the lowest
    renamed id to the highest (the rows between are copies of themselves)."""
    missing = [i for i in ids if not subs.get(i)]
    if missing:
        raise UsageError(f"{Opt('init', 'subtokens')}: id {missing[0]} has no split", fix="use trained-mean")
    emb, head, _ = tables(det)
    names = [emb.name, *([head.name] if head is not None else [])]
    wide = [n for n in names if det.ckpt.logical_dtype(det.ckpt.tensors[n]) == "float64"]
    if wide:
        raise RefusedError(
            f"rename-tokens {Opt('init', 'subtokens')} refused: {wide[0]} is float64 (its rows between the "
            "renamed ones would go through float32)",
            det.ckpt.path,
            f"use {Opt('init', 'trained-mean')}, which writes only the renamed rows",
        )
    lo, hi = ids[0], ids[-1]
    specs = tuple(
        TokenSpec(TokenInit.SUBTOKENS, subs[i]) if i in subs else TokenSpec(TokenInit.COPY, (i,))
        for i in range(lo, hi + 1)
    )

    def table(name: str, axis: int) -> EditedTable:
        n = det.ckpt.tensors[name].shape[axis]
        return EditedTable(name, axis, n, lo, TokenInitRows(name, axis, specs, n, 0, 0), None)

    recipe = table(emb.name, 0)
    put = [(n, recipe) for n in [emb.name, *det.embedding.aliases]]
    if head is not None:
        equal = det.comparison.values is TieState.EXACT and head.axis == 0
        hrec = recipe if equal else table(head.name, head.axis)
        put += [(n, hrec) for n in [head.name, *det.head.aliases]]
    for name, r in put:
        t = det.ckpt.tensors[name]
        plan.replace[name] = OutTensor(
            name, out_dtype(det.ckpt, t, plan.relabel_u16), t.shape, r, t.file, storage=t.storage
        )


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


def split_ids(folder: Path, pairs: dict[int, str], special: bool) -> dict[int, tuple[int, ...]]:
    """``{id: the ids its new string splits into}`` by the tokenizer before the rename (add-tokens' split,
    :func:`surgery.io.tokenizer_edit.add_tokens_edit`, whose files are not used)."""
    from . import add_tokens as token_plan

    edit = token_plan.tokenizer_edit().add_tokens_edit(folder, list(pairs.values()), special=special)
    by_string = {t.content: tuple(t.subtoken_ids) for t in edit.tokens}
    return {i: by_string.get(s, ()) for i, s in pairs.items()}


def special_ids(folder: Path, vocab: dict[int, str], asked: dict[str, str]) -> dict[str, tuple[str, int]]:
    """``{name: (token, id)}`` of ``--set-special``: each token's id in the tokenizer after the renames.

    Raises:
        UsageError: a name outside pad/bos/eos, a token that is not one token of the tokenizer.
    """
    from ..io.special_tokens import SPECIAL_NAMES

    ids = {s: i for i, s in sorted(vocab.items(), reverse=True)}  # the lowest id of a string wins
    out = {}
    for name, token in asked.items():
        if name not in SPECIAL_NAMES:
            raise UsageError(f"{Opt('set_special', name)} is not one of {', '.join(SPECIAL_NAMES)}")
        if token not in ids:
            raise UsageError(
                f"{Opt('set_special', f'{name}={token}')}: {token!r} is not a token of the tokenizer",
                folder,
                "rename a reserved slot to it in the same run, or add it with add-tokens first",
            )
        out[name] = (token, ids[token])
    return out
