"""``tietool diff`` output: the :class:`~tietool.surgery.diff.DiffResult` as one JSON document (``--json``)
or, for people, a table of the changed tensors and a line for every other difference, then the verdict."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from .errors import finite

_LINES = 50  # keys and files listed one a line; the rest counted
_TOKENS = 20  # tokens listed one a line; the rest counted


class _Console(Console):
    """rich's Console, except that a closed pipe (``| head``) is left to ``cli.errors``, which ends quietly
    with exit 0 (rich's own handler exits 1, which for diff means "they differ")."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _console() -> Console:
    tty = sys.stdout.isatty()
    return _Console(width=None if tty else 200, soft_wrap=not tty, highlight=False, markup=False)


def _shape(s: list[int]) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"


def _num(x: Any) -> str:
    return "—" if x is None else format(x, ".3g")


def _rows(r: dict | None) -> str:
    """``rows 320–383 (64 of 384)``: the token ids whose rows differ, as ranges (the first few)."""
    if not r:
        return "—"
    shown = [f"{a}" if b == a + 1 else f"{a}–{b - 1}" for a, b in r["ranges"][:6]]
    more = ", …" if len(r["ranges"]) > 6 or r["ranges_truncated"] else ""
    what = "rows" if r["axis"] == 0 else f"entries on axis {r['axis']}"
    return f"{r['count']} {what}: {', '.join(shown)}{more}"


def _changed_table(changed: list[dict]) -> Table:
    t = Table(title="tensors that differ", title_justify="left")
    for col in ("name", "dtype", "shape", "max |Δ|", "‖Δ‖/‖A‖", "token ids that differ"):
        t.add_column(col, overflow="fold")
    for c in changed:
        dtype = (
            c["dtype_before"]
            if c["dtype_before"] == c["dtype_after"]
            else f"{c['dtype_before']} → {c['dtype_after']}"
        )
        shape = (
            _shape(c["shape_before"])
            if c["shape_before"] == c["shape_after"]
            else f"{_shape(c['shape_before'])} → {_shape(c['shape_after'])}"
        )
        note = f" ({c['note']})" if c.get("note") else ""
        t.add_row(
            c["name"] + note,
            dtype,
            shape,
            _num(c.get("max_abs_diff")),
            _num(c.get("relative_norm")),
            _rows(c.get("rows_changed")),
        )
    return t


def _listed(con: Console, lines: list[str], most: int = _LINES) -> None:
    for line in lines[:most]:
        con.print(line)
    if len(lines) > most:
        con.print(f"and {len(lines) - most} more")


def diff(d: dict, as_json: bool = False) -> None:
    """``tietool diff A B``: ``d`` is :meth:`DiffResult.as_dict`."""
    if as_json:
        print(json.dumps(finite(d), indent=2))
        return
    con = _console()
    t = d["tensors"]
    same = t.get("identical", t.get("same_header", 0))
    word = "bit-identical" if d["values_compared"] else "with the same header (values not read)"
    con.print(f"A: {d['a']} ({d['read_as']['a']})")
    con.print(f"B: {d['b']} ({d['read_as']['b']})")
    con.print(
        f"tensors: {same} {word}, {len(t['changed'])} changed, {len(t['added'])} only in B, "
        f"{len(t['removed'])} only in A, {len(t['renamed'])} renamed"
    )
    if t["changed"]:
        con.print(_changed_table(t["changed"]))
    lines = [f"renamed {r['from']} → {r['to']} {_shape(r['shape'])} {r['dtype']}" for r in t["renamed"]]
    lines += [f"only in A: {x['name']} {_shape(x['shape'])} {x['dtype']}" for x in t["removed"]]
    lines += [f"only in B: {x['name']} {_shape(x['shape'])} {x['dtype']}" for x in t["added"]]
    for sec, label in (("config", "config"), ("metadata", "safetensors __metadata__")):
        s = d[sec]
        lines += [f"{label} {c['key']}: {_js(c['before'])} → {_js(c['after'])}" for c in s["changed"]]
        lines += [f"{label} {c['key']} only in A: {_js(c['value'])}" for c in s["removed"]]
        lines += [f"{label} {c['key']} only in B: {_js(c['value'])}" for c in s["added"]]
    _listed(con, lines)
    tok = d["tokenizer"]
    if any(tok.values()):
        con.print(
            f"tokens: {len(tok['added'])} only in B, {len(tok['removed'])} only in A, "
            f"{len(tok['renumbered'])} renumbered"
        )
    _listed(
        con,
        [f"token {x['token']!r} only in B (id {x['id']})" for x in tok["added"]]
        + [f"token {x['token']!r} only in A (id {x['id']})" for x in tok["removed"]]
        + [
            f"token {x['token']!r} renumbered: id {x['id_before']} → {x['id_after']}"
            for x in tok["renumbered"]
        ],
    )
    f = d["files"]
    _listed(
        con,
        [f"file {x['name']} differs ({x['bytes_before']} → {x['bytes_after']} bytes)" for x in f["changed"]]
        + [f"file {x['name']} only in A ({x['bytes']} bytes)" for x in f["removed"]]
        + [f"file {x['name']} only in B ({x['bytes']} bytes)" for x in f["added"]],
    )
    for n in d["notes"]:
        con.print(f"note: {n}")
    if not d["identical"]:
        con.print("verdict: the checkpoints differ")
    elif d["values_compared"]:
        con.print("verdict: identical")
    else:
        con.print("verdict: identical headers, config, tokens and files (tensor values not read)")


def _js(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)
