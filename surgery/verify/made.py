"""``verify`` of the rows a ``resize`` or ``add-tokens`` run made: recomputed from the input by the planner
itself and checked bit for bit.

When such a run is the one run that made the output from the input, its report's fields (``add_tokens``:
each token's id, ``init``, ``source_ids``, the ``seed``, the tokenizer's lengths, ``pad_to_multiple_of``;
``resize``: ``rows_requested``, ``init``, ``seed``, ``pad_to_multiple_of``) plan the run again on the input
(:func:`surgery.plan.add_tokens.plan_add_tokens`, :func:`surgery.plan.resize.plan_resize`: the same
recipes, random streams included, since every draw is ``default_rng`` of a child of ``SeedSequence(seed)``
in planning order), and every row the plan makes (a token's row from its sub-token rows, its copy, the
mean, zeros, a seeded ``mean`` / ``trained-mean`` / ``normal`` draw, padding rows, a head bias's entries) must
be the output's, bit for bit. The rows every other check skips (the added tokens' ids, the new rows of a
resize) are so checked too.

Rows made by a run in a chain of several runs are not recomputed (the folder that run read is not rebuilt):
a note says so, and which rows were checked only for their place and count.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..inspect.detect import detect
from ..inspect.detection import Detection
from ..io.checkpoint import Checkpoint
from ..model.errors import TietoolError
from ..model.tokens import NewToken, TokenEdit
from ..plan.add_tokens import parse_init, plan_add_tokens
from ..plan.plan import Plan
from ..plan.recipes import CopyIfEqual, EditedBias, EditedTable, NewRows, ResizedBias, ResizedTable, make
from ..report import chain_since
from .rebuilt import flat_bytes
from .result import VerifyResult

MADE_BY = ("resize", "add-tokens")


def check(res: VerifyResult, A: Checkpoint, B: Checkpoint, whole: bool = True) -> None:
    """Recompute the rows the output's one ``resize`` / ``add-tokens`` run made (``whole``: ``A`` is the
    folder that run read, not a view rebuilt from it) and name each table whose rows differ in
    ``res.unexplained``; say in ``res.notes`` what was checked, or why those rows were not."""
    runs = chain_since(B.path, A.path)
    made = sorted({str(r.get("operation")) for r in runs if r.get("operation") in MADE_BY})
    if not made:
        return
    if len(runs) == 1 and not whole:
        res.notes.append(
            f"the rows {' and '.join(made)} made are not recomputed on a view rebuilt from the input (a "
            "Trainer checkpoint's merged view): only their place and count are checked"
        )
        return
    if len(runs) != 1:
        res.notes.append(
            f"the rows {' and '.join(made)} made are not recomputed in a chain of {len(runs)} runs (only "
            "their place and count are checked): verify each run on its own to check them bit for bit"
        )
        return
    op = made[0]
    try:
        plan = _replan(A, B, runs[0])
    except (TietoolError, ValueError, KeyError, TypeError) as e:
        res.notes.append(
            f"the rows the {op} run made are not checked: its report's fields do not plan again on the "
            f"input ({e})"
        )
        return
    if plan is not None:
        _compare(res, A, B, plan, f"{op} ({_how(runs[0])})")


def _how(run: dict[str, Any]) -> str:
    """The report's init and seed of a run, as the lines say them."""
    sec = run.get("add_tokens") or run.get("resize") or {}
    return f"init {sec.get('init')}, seed {sec.get('seed')}"


def _detection(A: Checkpoint, B: Checkpoint, run: dict[str, Any]) -> Detection:
    """The input detected as the run detected it: the loader, embedding and head its report names."""
    loader = run.get("loader")
    names = {r: run.get(r) for r in ("embedding", "head")}
    return detect(
        A,
        loader=loader.get("name") if isinstance(loader, dict) else None,
        embedding_name=names["embedding"] if names["embedding"] in A.tensors else None,
        head_name=names["head"] if names["head"] in A.tensors else None,
    )


def _replan(A: Checkpoint, B: Checkpoint, run: dict[str, Any]) -> Plan | None:
    """The run planned again on the input from its report's fields; None when it made no row (a trim).

    Raises:
        TietoolError, ValueError, KeyError, TypeError: fields missing or of the wrong type, or a plan the
            input refuses with them (a square head planned with ``--layout``).
    """
    det = _detection(A, B, run)
    if run.get("operation") == "resize":
        sec = run["resize"]
        if int(sec["rows_after"]) <= int(sec["rows_before"]):
            return None
        from ..plan.resize import plan_resize_to

        return plan_resize_to(
            det, sec.get("rows_requested"), sec.get("pad_to_multiple_of"), sec["init"], int(sec["seed"])
        )
    sec = run["add_tokens"]
    tokens = tuple(
        NewToken(
            str(t["content"]),
            int(t["id"]),
            bool(t["special"]),
            bool(t["existed"]),
            tuple(int(i) for i in t["source_ids"]) if t.get("init") == "subtokens" else (),
        )
        for t in sec["tokens"]
    )
    edit = TokenEdit(int(sec["tokenizer_length_before"]), int(sec["tokenizer_length_after"]), tokens)
    copy = [t["source_ids"][0] for t in sec["tokens"] if t.get("init") == "copy" and t.get("source_ids")]
    choice = parse_init(str(sec["init"]))
    return plan_add_tokens(det, edit, choice, sec.get("pad_to_multiple_of"), int(sec["seed"]), *copy[:1])


def _compare(res: VerifyResult, A: Checkpoint, B: Checkpoint, plan: Plan, what: str) -> None:
    """Every row ``plan`` makes (:func:`_made`) against the output's, bit for bit."""
    memo: dict[Any, Any] = {}
    checked: dict[str, int] = {}
    for t in [*plan.replace.values(), *plan.add]:
        if t.name not in B.tensors:
            continue
        for axis, start, recipe in _made(t.recipe):
            b = np.asarray(B.load(t.name))
            if axis is None:  # the whole tensor, as bytes
                want = np.ascontiguousarray(flat_bytes(make(recipe, A, memo))).view(np.uint8).ravel()
                got = np.ascontiguousarray(b).view(np.uint8).ravel()
            else:
                want = np.ascontiguousarray(make(recipe, A, memo))
                got = np.ascontiguousarray(np.moveaxis(b, axis, 0)[start : start + want.shape[0]])
            ok = got.shape == want.shape and np.array_equal(got.view(np.uint8), want.view(np.uint8))
            n = want.shape[0] if axis is not None else 0
            if ok:
                checked[t.name] = checked.get(t.name, 0) + n
                continue
            where = (
                "its values"
                if axis is None
                else f"row {start}"
                if n == 1
                else f"rows {start}..{start + n - 1}"
            )
            verb = "is" if n == 1 else "are"
            res.unexplained.append(
                f"{t.name}: {where} {verb} not what the report's {what} makes of the input (recomputed by "
                "its planner, compared bit for bit)"
            )
    if checked:
        res.notes.append(
            f"the rows {what} made were recomputed from the input by its planner and match bit for bit: "
            + ", ".join(f"{n} in {name}" if n else f"{name} whole" for name, n in sorted(checked.items()))
        )


def _made(recipe: Any) -> list[tuple[int | None, int, Any]]:
    """``(axis, first entry, recipe)`` of each block of new rows a table's recipe makes (an axis of None:
    the whole tensor, a bias or an extra table kept equal to the embedding)."""
    if isinstance(recipe, EditedTable):
        out: list[tuple[int | None, int, Any]] = [(recipe.axis, recipe.start, recipe.tokens)]
        if recipe.tail is not None:
            out.append((recipe.axis, recipe.new - recipe.tail.count, recipe.tail))
        return out
    if isinstance(recipe, ResizedTable) and isinstance(recipe.rows, NewRows):
        return [(recipe.axis, recipe.new - recipe.rows.count, recipe.rows)]
    if isinstance(recipe, EditedBias | ResizedBias | CopyIfEqual):
        return [(None, 0, recipe)]
    return []
