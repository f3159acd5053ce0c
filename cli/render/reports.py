"""The reports of the writing commands: tie / untie / resize / add-tokens (:func:`written`), :func:`merge`
and :func:`convert`, as tables and lines or as JSON; then what an in-place run did."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import finite
from ..numbers import RANDOM_INITS, count, percent
from .common import (
    after_write,
    console,
    left_out,
    messages,
    recovered,
    result,
    shape_text,
    size,
    stale_notes,
    transfer_line,
)


def _change_table(rep: dict) -> Table:
    """The report's table: tensors dropped, added, resized or rewritten, and the totals before → after."""
    t = Table(title="report: parameters and bytes")
    for col in ("change", "tensor", "shape", "parameters", "bytes"):
        t.add_column(col, overflow="fold")
    for d in rep["dropped"]:
        t.add_row("dropped", d["name"], shape_text(d["shape"]), f"-{d['parameters']}", f"-{d['bytes']}")
    for a in rep["added"]:
        t.add_row("added", a["name"], shape_text(a["shape"]), f"+{a['parameters']}", f"+{a['bytes']}")
    for c in rep["resized"]:
        t.add_row(
            "resized" if c["shape_before"] != c["shape_after"] else "rewritten",
            c["name"],
            f"{shape_text(c['shape_before'])} → {shape_text(c['shape_after'])}",
            f"{c['parameters_after'] - c['parameters_before']:+d}",
            f"{c['bytes_after'] - c['bytes_before']:+d}",
        )
    b, a = rep["before"], rep["after"]
    t.add_row(
        "total",
        "before → after",
        "",
        f"{count(b['parameters'])} → {count(a['parameters'])}",
        f"{b['bytes']} → {a['bytes']}",
    )
    return t


def _added_tokens(con: Console, a: dict, dry_run: bool) -> None:
    """The ``add_tokens`` fields of a report: one line per token, then the rows (and, for a dry run, the
    tokenizer files; a run lists them with the files it wrote)."""
    table = Table(title="tokens", title_justify="left", box=None, padding=(0, 2, 0, 0))
    for col in ("token", "id", "special", "init", "from ids"):
        table.add_column(col)
    for t in a["tokens"]:
        if t["existed"] and t.get("rows_reset"):
            init = f"{t['init']} (its rows were all zero)"
            table.add_row(repr(t["content"]), str(t["id"]), str(t["special"]), init, "")
        elif t["existed"]:
            table.add_row(repr(t["content"]), str(t["id"]), str(t["special"]), "(already a token)", "")
        else:
            ids = ", ".join(map(str, t["source_ids"] or []))
            table.add_row(repr(t["content"]), str(t["id"]), str(t["special"]), t["init"], ids)
    con.print(table)
    line = f"tokenizer {a['tokenizer_length_before']} → {a['tokenizer_length_after']} tokens; rows "
    line += f"{a['rows_before']} → {a['rows_after']} ({a['slack_used']} slack row(s) used"
    if a["padding_rows"]:
        line += f", {a['padding_rows']} padding row(s): init {a['padding_init']}"
    inits = {t["init"] for t in a["tokens"] if not t["existed"] or t.get("rows_reset")}
    if a["padding_rows"]:
        inits.add(a["padding_init"])
    random = inits & RANDOM_INITS
    seed = f"; seed {a['seed']} (--seed {a['seed']} reproduces the rows)" if random else ""
    con.print(line + ")" + seed)
    if a["files_edited"] and dry_run:
        con.print(f"tokenizer files it would edit: {', '.join(a['files_edited'])}")


def report(rep: dict, as_json: bool = False) -> None:
    """A tie/untie/resize report: as JSON, or the change table, savings, rows, config changes, files,
    notes and what was left out."""
    if as_json:
        print(json.dumps(rep, indent=2))
        return
    con = console()
    con.print(_head(rep), style="bold")
    con.print(_change_table(rep))
    transfer_line(con, rep)
    con.print(_saved(rep))
    if "resize" in rep:
        r = rep["resize"]
        con.print(
            f"rows {r['rows_before']} → {r['rows_after']} (+{r['rows_added']} / -{r['rows_removed']})"
            + (
                f", requested {r['rows_requested']} padded to a multiple of {r['pad_to_multiple_of']}"
                if r.get("rows_requested") not in (None, r["rows_after"])
                else ""
            )
            + (f", new rows: init {r['init']}" if r["rows_added"] else "")
            + (
                f", seed {r['seed']} (--seed {r['seed']} reproduces them)"
                if r["rows_added"] and r["init"] in RANDOM_INITS
                else ""
            )
        )
    if "add_tokens" in rep:
        _added_tokens(con, rep["add_tokens"], rep["dry_run"])
    if "rename_tokens" in rep:
        r = rep["rename_tokens"]
        norms = ", ".join(f"{n} {v:.4g}" for n, v in r["mean_norm"].items())
        con.print(
            f"rows: {r['init']}" + (f" (L2 norm of the mean: {norms})" if norms else "; no row changes")
        )
    if "fix_untrained" in rep:
        norms = ", ".join(f"{n} {v:.4g}" for n, v in rep["fix_untrained"]["mean_norm"].items())
        con.print(f"init {rep['fix_untrained']['init']}; L2 norm of the mean: {norms or '(no row set)'}")
    for c in rep["config_changes"]:
        con.print(f"config: {c['file']} {c['key']}: {json.dumps(c['before'])} → {json.dumps(c['after'])}")
    if "files" in rep:
        f = rep["files"]
        con.print(
            f"files: {len(f['rewritten'])} rewritten, {len(f.get('written', []))} new, "
            f"{len(f['copied'])} copied, {len(f['linked'])} hard-linked"
            f", {len(f['removed'])} removed"
            + (f", {len(f['symlinked'])} symlinks kept" if f.get("symlinked") else "")
            + (f", tokenizer files edited: {', '.join(f['edited'])}" if f.get("edited") else "")
            + (" (linked files share data with the input: edit neither in place)" if f["linked"] else "")
        )
        for fl in f.get("folder_links", []):
            how = "kept as the same link" if fl["kept"] else "written as a real folder of its files"
            con.print(f"symlinked folder {fl['link']} → {fl['target']} ({fl['files']} files): {how}")
    messages(con, rep["notes"], rep["warnings"])
    resized = rep.get("training_state_resized") or {}
    left_out(
        con,
        [x for x in rep.get("left_out", []) if x["file"] not in resized],
        rep["index"],
        rep["format"],
        writing=True,
    )
    for f, names in resized.items():
        con.print(
            f"training state {'to be ' if rep.get('dry_run') else ''}resized: {f}: {len(names)} optimizer "
            "accumulators / master weights of the resized parameters (new entries 0 / the new weight rows, "
            "old entries bit for bit), everything else copied"
        )


def _head(rep: dict) -> str:
    """``tie: IN → OUT``, ``tie (dry run: nothing written): IN``."""
    head = f"{rep['operation']}{' (dry run: nothing written)' if rep['dry_run'] else ''}: {rep['input']}"
    if rep["output"] and not rep["dry_run"]:
        head += f" → {rep['output']}"
    return head


def _saved(rep: dict) -> str:
    """``saved 768 parameters, 3072 bytes (3.0 KiB) (2.49%)`` or ``added ...``."""
    s = rep["saved"]
    sign, word = (1, "saved") if s["bytes"] >= 0 else (-1, "added")
    return (
        f"{word} {count(sign * s['parameters'])} parameters, {size(sign * s['bytes'])} "
        f"({percent(sign * s['percent'])}%)"
    )


def written_line(rep: dict) -> str:
    """The one line ``--quiet`` prints for tie / untie / resize / add-tokens: what was done to what, the
    parameters saved or added, and for an in-place run where the previous version is."""
    line = f"{_head(rep)}: {_saved(rep)}"
    if "add_tokens" in rep:
        a = rep["add_tokens"]
        new = sum(not t["existed"] for t in a["tokens"])
        line += f"; {new} token(s) added, rows {a['rows_before']} → {a['rows_after']}"
    elif "resize" in rep:
        r = rep["resize"]
        line += f"; rows {r['rows_before']} → {r['rows_after']}"
        if r.get("rows_requested") not in (None, r["rows_after"]):
            line += f" (requested {r['rows_requested']} padded to a multiple of {r['pad_to_multiple_of']})"
        if r["rows_added"] and r["init"] in RANDOM_INITS:
            line += f", seed {r['seed']}"
    ip = rep.get("in_place")
    if ip and ip.get("written"):
        line += f"; in place, the previous version is {ip['backup']}" if ip.get("backup") else "; in place"
        if _inside(Path(rep["input"])):
            line += " (your shell is still inside the previous version's folder: run `cd .`)"
    elif ip:
        line += "; in place: nothing written"
    return line


@after_write
def written(rep: dict, as_json: bool = False, quiet: bool = False) -> None:
    """The report of tie, untie or resize (:func:`report`), and for an in-place run where the old version
    went and what earlier runs left; with ``quiet`` (and not ``as_json``) only :func:`written_line` and the
    warnings."""
    ip = rep.get("in_place")
    if quiet and not as_json:
        result(written_line(rep), rep["notes"], rep["warnings"])
        if ip and ip.get("left_to_delete"):
            _left_to_delete_warning(rep["input"], ip)
        return
    report(finite(dict(rep)) if as_json else rep, as_json=as_json)
    if not as_json:
        stale_notes(rep)
    if ip and ip.get("left_to_delete"):  # on stderr, with --json too
        _left_to_delete_warning(rep["input"], ip)
    if as_json or not ip:
        return
    recovered(ip.get("recovered") or {})
    if not ip.get("written"):
        print("in place: nothing written" + (" (dry run)" if rep.get("dry_run") else " (nothing to change)"))
    elif ip.get("backup"):
        q_in, q_bak = shlex.quote(rep["input"]), shlex.quote(ip["backup"])
        print(
            f"in place: {rep['input']} rewritten; the previous version is {ip['backup']} "
            f"(restore: rm -rf {q_in} && mv {q_bak} {q_in}; delete it when satisfied)"
        )
    else:
        print(f"in place: {rep['input']} rewritten (no backup kept)")
    if ip.get("written") and _inside(Path(rep["input"])):
        print("note: your shell is still inside the previous version's folder: run `cd .` to see the new one")


def _left_to_delete_warning(ckpt: str, ip: dict) -> None:
    """The one warning line of an in-place run without a backup whose old version could not be deleted
    completely: the name holds the new version (exit 0), what is left, and how to remove it."""
    left = shlex.quote(ip["left_to_delete"])
    print(
        f"tietool: warning: {ckpt} holds the new version, but the previous version could not be "
        f"deleted completely ({ip['delete_error']}); what is left is {ip['left_to_delete']} — "
        f"remove it with: chmod -R u+w {left} && rm -rf {left} (the next tietool run on it tries again)",
        file=sys.stderr,
    )


def _inside(folder: Path) -> bool:
    """The current folder was ``folder`` (or inside it) before a swap: its path still names ``folder``."""
    here = Path(os.environ.get("PWD") or os.getcwd())
    return here == folder or folder in here.parents


def _merge_table(rep: dict) -> Table:
    """The merged tensors grouped by how they were joined (rule, axis, transposed): a row per group with
    its count and first tensor; ``--verbose`` prints every tensor instead."""
    groups: dict[tuple, list[dict]] = {}
    for t in rep["tensors"]:
        groups.setdefault((t["rule"], t["axis"], bool(t.get("transposed"))), []).append(t)
    table = Table(title=f"{len(rep['tensors'])} tensors merged", title_justify="left")
    for col, just in (("how", "left"), ("tensors", "right"), ("first of them", "left")):
        table.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for (rule, axis, turned), ts in groups.items():
        how = rule + ("" if axis is None else f" on axis {axis}") + (", transposed" if turned else "")
        table.add_row(how, str(len(ts)), f"{ts[0]['name']} -> {ts[0]['dtype']} {ts[0]['shape']}")
    return table


def merge_line(rep: dict) -> str:
    """The result line of a merge (what ``--quiet`` prints): the rank files or flex checkpoint, the output,
    the tensor count and the weight files; for a dry run, what it would do."""
    if rep["dry_run"]:
        return (
            f"dry run: would merge {len(rep['rank_files'])} rank files into {len(rep['tensors'])} tensors in "
            f"{', '.join(rep['weight_files'])}; nothing was written"
        )
    into = f"into {rep['output']}: {len(rep['tensors'])} tensors in {', '.join(rep['weight_files'])}"
    if rep.get("kind") == "flex":
        nr, nf = len(rep["ranks"]), len(rep["rank_files"])
        return (
            f"merged the flex checkpoint ({nr} rank{'s' * (nr != 1)}, {nf} .distcp file{'s' * (nf != 1)}) "
            + into
        )
    ranks = (
        f"{rep['expert_parallel']} expert-parallel, numbered {' / '.join(rep['expert_numbering'] or [])}"
        if rep.get("expert_parallel", 1) > 1
        else f"{rep['tensor_parallel']} tensor-parallel x {rep['pipeline_parallel']} pipeline"
    )
    return f"merged {len(rep['rank_files'])} rank files ({ranks}) {into}"


def _merge_warnings(rep: dict) -> list[str]:
    """Every warning of a merge: the tie check's, the report's and its conversion's."""
    conv = rep.get("converted") or {}
    tie = [rep["tie"]["message"]] if rep.get("tie") else []
    return [*tie, *rep.get("warnings", []), *conv.get("warnings", [])]


@after_write
def merge(rep: dict, as_json: bool = False, quiet: bool = False, verbose: bool = False) -> None:
    """The merge report: JSON; or a table of the tensors by how they were joined (``verbose``: one line
    per tensor: rule, axis, shape), the config changes, the result line, the notes and warnings, then the
    temporary folders of killed runs it removed; ``quiet``: the result line and the warnings only."""
    if as_json:
        print(json.dumps(finite(dict(rep)), indent=2))
        return
    if quiet:
        result(merge_line(rep), (rep.get("converted") or {}).get("notes", []), _merge_warnings(rep))
        return
    if verbose:
        for t in rep["tensors"]:
            axis = "" if t["axis"] is None else f" on axis {t['axis']}"
            turned = ", transposed" if t.get("transposed") else ""
            print(f"  {t['name']}: {t['rule']}{axis}{turned} -> {t['dtype']} {t['shape']}")
    elif rep["tensors"]:
        console().print(_merge_table(rep))
    for k, (before, after) in rep["config_changes"].items():
        print(f"config.json: {k} {before} -> {after}")
    if rep.get("tie"):  # the tie check: a head trained apart kept, the tie flag set false
        print(f"warning: {rep['tie']['message']}")
    for f in rep["left_out"]:
        print(f"left out: {f}")
    print(merge_line(rep))
    _merge_messages(rep)
    stale_notes(rep)


def _merge_messages(rep: dict) -> None:
    """Every note and warning of a merge report, its conversion's too (``converted``): a warning that
    matters is said on the terminal, not only in tietool-report.json."""
    conv = rep.get("converted") or {}
    messages(console(), conv.get("notes", []), [*rep.get("warnings", []), *conv.get("warnings", [])])


def convert_line(rep: dict) -> str:
    """The result line of a convert (what ``--quiet`` prints): input → output, the conventions and
    containers, tensors and bytes after."""
    head = f"convert{' (dry run: nothing written)' if rep['dry_run'] else ''}: {rep['input']}"
    head += f" → {rep['output']}" if not rep["dry_run"] else ""
    before, after = rep["container"]["before"], rep["container"]["after"]
    a = rep["after"]
    return (
        f"{head}: {rep['from_convention']} ({before}) → {rep['to_convention']} ({after}), "
        f"{a['tensors']} tensors, {size(a['bytes'])}"
    )


@after_write
def convert(rep: dict, as_json: bool = False, quiet: bool = False) -> None:
    """A convert report: as JSON, or a table of every renamed, transposed and split tensor, the config
    changes, the files written and the notes; then the temporary folders of killed runs it removed;
    ``quiet``: :func:`convert_line` and the warnings only."""
    if as_json:
        print(json.dumps(finite(rep), indent=2))
        return
    if quiet:
        result(convert_line(rep), rep["notes"], rep["warnings"])
        return
    _convert_text(rep)
    stale_notes(rep)


def _convert_text(rep: dict) -> None:
    """:func:`convert` for people."""
    con = console()
    head = f"convert{' (dry run: nothing written)' if rep['dry_run'] else ''}: {rep['input']}"
    con.print(head + (f" → {rep['output']}" if not rep["dry_run"] else ""), style="bold")
    before, after = rep["container"]["before"], rep["container"]["after"]
    if rep["from_convention"] == rep["to_convention"]:
        con.print(f"{before} → {after}: the container only, names and layouts kept")
    else:
        con.print(f"{rep['from_convention']} ({before}) → {rep['to_convention']} ({after})")
    t = Table(title="tensors renamed, transposed or split")
    for col in ("change", "from", "to", "shape"):
        t.add_column(col, overflow="fold")
    turned = {x["name"]: x for x in rep["transposed"]}
    for r in rep["renamed"]:
        x = turned.pop(r["to"], None)
        shape = f"{shape_text(x['shape_before'])} → {shape_text(x['shape_after'])}" if x else ""
        t.add_row("renamed, transposed" if x else "renamed", r["from"], r["to"], shape)
    for x in turned.values():
        t.add_row(
            "transposed",
            x["from"],
            x["name"],
            f"{shape_text(x['shape_before'])} → {shape_text(x['shape_after'])}",
        )
    for sp in rep["split"]:
        t.add_row("split", sp["from"], ", ".join(sp["to"]), "")
    if t.row_count:
        con.print(t)
    else:
        con.print("no tensor renamed or transposed: names and layouts are unchanged")
    for c in rep["config_changes"]:
        con.print(f"config: config.json {c['key']}: {json.dumps(c['before'])} → {json.dumps(c['after'])}")
    b, a = rep["before"], rep["after"]
    con.print(f"tensors {b['tensors']} → {a['tensors']}, {size(b['bytes'])} → {size(a['bytes'])}")
    if rep.get("files"):
        f = rep["files"]
        con.print(
            f"files: {len(f['weight_files'])} weight file(s)"
            + (f" + {f['index']}" if f["index"] else "")
            + (f", carried {', '.join(f['carried'])}" if f["carried"] else "")
        )
    messages(con, rep["notes"], rep["warnings"])
