"""``tietool inspect A B C``: one row per checkpoint (a JSON list with ``--json``). A folder that cannot be
read gets a row saying why; the others are still shown, and the exit code is the first failure's."""

from __future__ import annotations

import json
from collections.abc import Callable

from rich.table import Table

from . import render


def _row(info: dict) -> list[str]:
    """Table cells of one inspection: vocab rows, hidden size, head layout, tie state, tying's savings."""
    tie, head = info["tie"], info["head"]
    tied = (
        "tied" if tie["config"] else "untied"
    ) + f" by config; head {'in files' if tie['head_in_files'] else 'absent'}"
    sav = info["savings"]
    return [
        str(info["path"]),
        f"{info['architecture']['family']} ({info['model_type']})",
        str(info["vocab"]["embedding_rows"]),
        str(info["vocab"]["hidden_size"]),
        str(head.get("layout") or "—") if head.get("present") else "—",
        f"{tied}; values {tie['values']}",
        render.size(sav["bytes"]) if sav["bytes"] else "0",
    ]


def inspect_many(paths: list[str], inspect_one: Callable[[str], dict], as_json: bool) -> int:
    """Inspect every folder in ``paths`` with ``inspect_one`` (which raises ``TietoolError``), print a table
    with a row each (or a JSON list), and return the exit code: 0, or the first failure's."""
    from ..surgery.model.errors import TietoolError

    results: list[dict] = []
    code = 0
    for p in paths:
        try:
            results.append(dict(inspect_one(p)))
        except TietoolError as e:
            code = code or int(e.exit_code)
            err = {"type": type(e).__name__, "message": e.message, "path": e.path, "fix": e.fix}
            results.append({"path": str(p), "error": err, "exit_code": int(e.exit_code)})
    if as_json:
        from .app import finite

        print(json.dumps(finite(results), indent=2))
        return code
    t = Table(title=f"{len(paths)} checkpoints")
    for col in ("checkpoint", "family", "vocab rows", "hidden", "head layout", "tie", "tying saves"):
        t.add_column(col, overflow="fold")
    for r in results:
        if "error" in r:
            t.add_row(r["path"], f"error (exit {r['exit_code']}): {r['error']['message']}", *[""] * 5)
        else:
            t.add_row(*_row(r))
    render._console().print(t)
    return code
