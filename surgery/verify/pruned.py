"""``verify ORIGINAL FINAL`` across a chain of writes with a ``prune`` in it (``prune`` → ``tie``,
``add-tokens`` → ``prune`` → ``resize``).

A prune renumbers the ids it keeps; the other runs keep every id of their input in place (tie, untie,
convert, merge), append (add-tokens, a resize that grows), trim the last ones (a resize that shrinks) or set
rows in place (fix-untrained, rename-tokens). So the original's ids that reach the output are those every
prune of the chain kept (each ``prune.id_map`` of the report chain, in order), and they are the output's
first ids, in their old order; the ids after them are the ones the chain's runs added.

The chain is checked as: the original pruned to exactly those ids, by the prune planner
(:func:`surgery.plan.prune.plan_prune`, the tensors, tokenizer files and config ids it renumbers) and the
write loop, into a temporary folder that holds the original's ``tietool-report.json`` (so the output's chain
since it is the chain since the original); then that folder compared with the output as a chain without a
prune is, the report's token claims renumbered through each prune (:func:`surgery.report.token_claims`).
The rows a run set in place before a prune (fix-untrained, rename-tokens with a mean init) were computed
from rows the prune may have dropped: they are recomputed from the original, each kept one checked at its
new id (:func:`surgery.verify.vocab.fixed_rows`).
A ``prune.id_map`` that is not an order-keeping map of its rows, or ids of the original that do not come
first in the output, make the chain unverifiable (named).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..inspect.detect import detect
from ..io.checkpoint import REPORT_NAME, Checkpoint
from ..model.errors import TietoolError
from ..plan.plan import check_dtypes
from ..plan.prune import plan_prune
from ..report import chain_since, prune_map
from ..write.writer import execute
from .prune import kept_ids
from .result import VerifyResult


def applies(a_path: Any, b_path: Any) -> bool:
    """The output's report chain since the input (:func:`surgery.report.chain_since`) holds a ``prune``
    and more than that one run."""
    runs = chain_since(Path(str(b_path)), Path(str(a_path)))
    return len(runs) > 1 and any(r.get("operation") == "prune" for r in runs)


def survivors(res: VerifyResult, runs: list[dict[str, Any]], rows: int) -> list[int] | None:
    """The ids of the original (``rows`` rows) that reach the end of ``runs``, in order: each prune keeps
    those its ``id_map`` names (checked as one prune's is, :func:`surgery.verify.prune.kept_ids`), a resize
    keeps those below its ``rows_after``. They must stay the first ids, in their old order; otherwise (or a
    prune whose map is broken) ``res`` names why and None is returned."""
    now = {o: o for o in range(rows)}  # original id -> its id after the runs so far
    for k, run in enumerate(runs):
        op = run.get("operation")
        if op == "prune":
            got = run.get("prune")
            sec: dict[str, Any] = got if isinstance(got, dict) else {}
            m = prune_map(run)
            before, after = sec.get("rows_before"), sec.get("rows_after")
            if m is None or type(before) is not int or type(after) is not int:
                res.unexplained.append(
                    f"the prune of the output's report chain (run {k + 1}) records no id_map with its rows; "
                    "the chain is unverifiable"
                )
                return None
            if kept_ids(res, sec, before, after) is None:
                return None
            now = {o: m[i] for o, i in now.items() if i in m}
        elif op == "resize" and isinstance(run.get("resize"), dict):
            after = run["resize"].get("rows_after")
            if type(after) is int:
                now = {o: i for o, i in now.items() if i < after}
    kept = sorted(now)
    if [now[o] for o in kept] != list(range(len(kept))):
        res.unexplained.append(
            "the ids of the input that the output's report chain keeps are not the output's first ids in "
            "their order; the chain is unverifiable"
        )
        return None
    return kept


def verify_through(
    a_path: Any, b_path: Any, compare: Callable[[Any, Any, Any], VerifyResult]
) -> VerifyResult:
    """:func:`surgery.verify.verify` of a chain with a prune (this module's recipe): the input pruned to the
    ids that reach the output (:func:`survivors`) in a temporary folder (removed after), then ``compare``
    of that folder with the output, given the input too (``compare(pruned, output, input)``: the rows a
    run set before a prune are recomputed from the input, :func:`surgery.verify.vocab.fixed_rows`).

    Raises:
        CheckpointError, UnsafePickleError: as :meth:`Checkpoint.open`.
    """
    a, b = Path(str(a_path)), Path(str(b_path))
    res = VerifyResult()
    A = Checkpoint.open(a)
    det = detect(A, compare_values=False)
    keep = survivors(res, chain_since(b, a), det.vocab_rows)
    if keep is None:
        return res
    tmp = Path(tempfile.mkdtemp(prefix="tietool-verify-"))
    try:
        mid = tmp / "pruned"
        try:
            execute(check_dtypes(plan_prune(det, keep)), mid, link=True)
        except (TietoolError, ValueError) as e:
            res.unexplained.append(
                f"the input does not prune to the {len(keep)} ids the output's report chain keeps ({e}); "
                "the chain is unverifiable"
            )
            return res
        (mid / REPORT_NAME).unlink(missing_ok=True)
        if (a / REPORT_NAME).is_file():  # the chain since the pruned copy is the chain since the input
            shutil.copyfile(a / REPORT_NAME, mid / REPORT_NAME)
        out = compare(mid, b, a)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.notes.append(
        f"the report chain holds a prune: the input was pruned to the {len(keep)} of its {det.vocab_rows} "
        "ids that reach the output (the prune planner, in a temporary folder), then compared with the output"
    )
    return out
