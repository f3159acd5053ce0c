"""``tietool verify BEFORE AFTER``: the differences, the logits and the verdict, or the result as JSON; and
on stderr why the exit code is 7 or 8."""

from __future__ import annotations

import json
import sys
from typing import Any

from ...surgery.io.checkpoint import REPORT_NAME
from ...surgery.model.errors import ExitCode
from ..errors import finite
from .common import console, shape_text


def verify(res: Any, before: str, after: str, as_json: bool = False, quiet: bool = False) -> None:
    """``tietool verify BEFORE AFTER``: the :class:`~tietool.surgery.verify.VerifyResult` as JSON or as
    lines and a verdict (``quiet``: the verdict line only); then on stderr, why the exit code is 7
    (unexplained differences) or 8 (logits not compared)."""
    d = res.as_dict()
    if as_json:
        print(json.dumps(finite(d), indent=2))
    elif quiet:
        print(verdict_line(d))
    else:
        _verify_text(d)
    if res.exit_code == ExitCode.UNEXPLAINED:
        listed = "run without --quiet to list them" if quiet and not as_json else "listed above"
        print(
            f"tietool: verify: {len(res.unexplained)} difference(s) that tietool's operations do not "
            f"explain between {before} and {after} ({listed})",
            file=sys.stderr,
        )
    if res.logits and res.logits.get("ok") is None:  # exit NOT_COMPARED (8) unless 7 already
        print(f"tietool: verify: {res.logits.get('error')}", file=sys.stderr)


def _verify_text(res: dict) -> None:
    """:func:`verify` for people: the counts, each difference, the logits and the verdict."""
    con = console()
    con.print(
        f"{res['identical_tensors']} tensors bit-identical; {len(res['dropped'])} dropped, "
        f"{len(res['added'])} added, {len(res['resized'])} resized, {len(res['changed'])} changed"
    )
    for d in res["dropped"]:
        con.print(
            f"dropped {d['name']} {shape_text(d['shape'])}"
            + (
                " (equals the embedding)"
                if d["equals_embedding"]
                else f" ({d['why']})"
                if d.get("why")
                else ""
            )
        )
    for a in res["added"]:
        con.print(
            f"added {a['name']} {shape_text(a['shape'])}"
            + (
                " (equals the embedding)"
                if a["equals_embedding"]
                else f" ({a['why']})"
                if a.get("why")
                else ""
            )
        )
    for r in res["resized"]:
        con.print(
            f"resized {r['name']} {shape_text(r['shape_before'])} → {shape_text(r['shape_after'])}"
            + (
                " (common part identical)"
                if r["common_part_identical"]
                else f" ({r['why']})"
                if r.get("why")
                else " (common part DIFFERS)"
            )
        )
    for c in res["changed"]:
        why = c.get("why") or "max |difference| " + format(c.get("max_abs_diff", 0), ".3g")
        con.print(f"changed {c['name']}: {why}")
    for c in res["config_differences"]:
        con.print(f"config {c['file']} {c['key']}: {json.dumps(c['before'])} → {json.dumps(c['after'])}")
    lg = res.get("logits")
    if lg:
        if lg.get("ok") is None:
            con.print(lg.get("error"))
        elif lg.get("output_error"):
            con.print(f"logits: the output does not load under PaddleFormers {lg.get('model_class')}")
        else:
            con.print(
                f"logits under {lg.get('libraries', 'PaddleFormers')} {lg.get('model_class')} on token ids "
                f"below {lg.get('token_ids_below')}: max |difference| {lg.get('max_abs_diff'):.3g} "
                f"({'same' if lg['ok'] else 'DIFFERENT'})"
            )
    for n in res.get("notes", ()):
        con.print(f"note: {n}")
    for u in [] if res["explained"] else res["unexplained"]:
        con.print(f"unexplained: {u}", style="red")
    con.print(verdict_line(res))


def verdict_line(res: dict) -> str:
    """The verdict of a verification (``VerifyResult.as_dict()``): its last line, and all ``--quiet``
    prints."""
    lg = res.get("logits")
    if res["explained"] and lg and lg.get("ok") is None:
        return (
            "verdict: every tensor difference is explained by the operations tietool-report.json records; "
            "the logits were not compared"
        )
    if res["explained"] and res.get("report") is False:
        return f"verdict: no difference (the output has no {REPORT_NAME}, and needs none)"
    if res["explained"] and res.get("report_checked") is False:
        return f"verdict: no difference (the output's {REPORT_NAME} records another input's run: not checked)"
    if res["explained"]:
        return "verdict: every difference is explained by the operations tietool-report.json records"
    return "verdict: differences that tietool's operations do not explain"
