"""All terminal output: rich tables for people, JSON for scripts. Nothing else in tietool prints, except the
one line of an error or an interruption (:mod:`cli.errors`).

One function per command's result: :func:`inspect` (and :func:`inspect_many`, a row per checkpoint),
:func:`written` (tie, untie, resize: the report, then what an in-place run did), :func:`convert`,
:func:`merge`, :func:`verify`; :func:`progress` is the progress bar the writer advances. With ``as_json``
each prints the result as one JSON document, its non-finite floats as strings (:func:`cli.errors.finite`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..surgery.model.errors import ExitCode, Interrupted
from .errors import finite
from .numbers import RANDOM_INITS, count, percent


class _Console(Console):
    """rich's Console, except that a closed pipe (``| head``) is left to ``cli.app.main``, which ends
    quietly with exit 0 (rich's own handler exits 1, the code of a tietool error)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _console(stderr: bool = False) -> Console:
    f = sys.stderr if stderr else sys.stdout
    # not a terminal (pipes, CI): wide lines so names are never wrapped mid-word
    # markup off: names, paths and messages are printed as they are, "[...]" included
    return _Console(
        file=f, width=None if f.isatty() else 200, soft_wrap=not f.isatty(), highlight=False, markup=False
    )


def size(n: int | None) -> str:
    """``1056`` → ``"1056 bytes (1.0 KiB)"``; the plain byte count always comes first."""
    if n is None:
        return "—"
    units = ["KiB", "MiB", "GiB", "TiB"]
    v, u = float(n), None
    for unit in units:
        if abs(v) < 1024:
            break
        v /= 1024
        u = unit
    return f"{n} bytes" + (f" ({v:.1f} {u})" if u else "")


def _shape(s) -> str:
    return "—" if s is None else "[" + ", ".join(str(d) for d in s) + "]"


def _messages(con: Console, notes, warnings, problems=()) -> None:
    for p in problems:
        con.print(f"problem: {p}", style="yellow")
    for n in notes:
        con.print(f"note: {n}")
    for w in warnings:
        con.print(f"warning: {w}", style="yellow")


_LEFT_OUT_WHY = {  # LeftOutReason values (surgery/io/surface.py) in words
    "not-in-index": "not listed in {index}, so not part of the checkpoint; a loader that prefers a lone "
    "weight file over an index would read its weights instead",
    "other-format": "weights in another format than the checkpoint's ({format}); which one a loader reads "
    "depends on the loader",
    "rank-file": "a tensor/pipeline-parallel rank file (a slice of the weights), not part of the whole "
    "checkpoint",
    "training-state": "training state (optimizer moments, master weights, scheduler, trainer or rng state), "
    "stored per parameter",
    "loader-cache": "paddle's flex-checkpoint loader's index of the weights (written at a load, reused if "
    "present): it describes these tensors, and the loader writes it anew for an output",
}


def left_out(con: Console, items: list[dict], index: str | None, fmt: str, writing: bool) -> None:
    """Files of the input that are not part of the checkpoint, or that the output leaves out, with why."""
    for x in items:
        why = _LEFT_OUT_WHY.get(x["reason"], x["reason"]).format(index=index or "the index", format=fmt)
        name = f"{x['file']} ({size(x['bytes'])})"
        if x["reason"] != "training-state":
            con.print(
                f"left out{' of the output (not copied)' if writing else ''}: {name}: {why}", style="yellow"
            )
        elif not writing:
            con.print(
                f"training state: {name}: {why}; tie/untie/resize leave it out of their output "
                "(resize / add-tokens --keep-training-state keep it, resized with the vocabulary)"
            )
        elif x["kept"]:
            con.print(
                f"training state copied: {name}: {why}; it matches the input's parameters", style="yellow"
            )
        else:
            con.print(
                f"training state left out of the output (not copied): {name}: {why}, and the parameters "
                "changed, so it no longer matches them (resize / add-tokens --keep-training-state keep it, "
                "resized)",
                style="yellow",
            )


def tie_vals(info: dict) -> str:
    return info["tie"]["values"]


def _dtype(t: dict) -> str:
    """``BF16`` / ``uint16 (bfloat16)``: the stored label, and what it means when they differ."""
    d, lg = t.get("dtype"), t.get("logical_dtype")
    if not d:
        return "—"
    return (
        d
        if not lg
        or lg.lower()
        in (d.lower(), {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}.get(d, ""))
        else f"{d} ({lg})"
    )


def _pair_table(info: dict) -> Table:
    """The embedding, head and bias rows (with aliases), then extra tables and vocab-shaped tensors."""
    t = Table(title="embedding and head", show_lines=False)
    for col in ("role", "name", "shape", "dtype", "layout", "file"):
        t.add_column(col, overflow="fold")
    e, h, b = info["embedding"], info["head"], info["head_bias"]
    if e.get("present", True):
        t.add_row("input embedding", e["name"], _shape(e["shape"]), _dtype(e), "vocab-hidden", e["file"])
    else:
        t.add_row(
            "input embedding",
            f"{e['name']} (missing: the table is stored as {e['stored_as']})",
            _shape(e["shape"]),
            "—",
            "vocab-hidden",
            "—",
        )
    for a in e["aliases"]:
        t.add_row("  alias (same table)", a, _shape(e["shape"]), e["dtype"], "", "")
    absent = " (the shared table; no separate head)" if tie_vals(info) == "shared" else " (not in files)"
    t.add_row(
        "LM head",
        h["name"] + ("" if h["present"] else absent),
        _shape(h["shape"]),
        _dtype(h),
        h["layout"] or "—",
        h["file"] or "—",
    )
    for a in h.get("aliases", []):
        t.add_row("  alias", a, "", "", "", "")
    if b:
        t.add_row("head bias", b["name"], _shape(b["shape"]), b["dtype"], "", b["file"])
        for a in b["aliases"]:
            t.add_row("  alias", a, "", "", "", "")
    for v in info.get("vocabulary_tensors", []):
        if v["role"] in ("extra vocabulary table", "vocab-shaped tensor"):
            t.add_row(v["role"], v["name"], _shape(v["shape"]), v["dtype"] or "—", "", v["file"] or "—")
    return t


def _tie_line(info: dict) -> str:
    """``tie: config ...; head in files: ...; values: ...`` (the comparison in words)."""
    tie, h, e = info["tie"], info["head"]["name"], info["embedding"]["name"]
    vals = tie["values"]
    desc = {
        "exact": f"{h} equals {e} bit for bit",
        "transposed": f"{h} equals {e} transposed",
        "different": f"{h} differs from {e}"
        + (
            f" (max |difference| {tie['max_abs_diff']:.3g}, {tie['differing_rows']} rows differ)"
            if tie["max_abs_diff"] is not None
            else ""
        ),
        "scaled": f"{h} equals {e} × d_model ** -0.5 (the tied head, materialised)",
        "absent": f"no head in the files ({h} not found)",
        "shared": f"the head is the shared table {e} (no separate head tensor)",
        "unknown": "not compared (--no-values: headers only)",
        "no_embedding": f"the input embedding {e} is missing; {h} holds the only table",
    }.get(vals, vals)
    if tie["storage_shared"]:
        desc += " (one array in the file: same storage)"
    return (
        f"tie: config {str(tie['config']).lower()} ({tie['config_source']}); head in files: "
        f"{'yes' if tie['head_in_files'] else 'no'}; values: {desc}"
    )


def _bin_label(b: dict) -> str:
    """``0``, ``(0, 1e-06]``, ``(1e-06, 1e-05]``, ..., ``> 1``: a histogram bin of per-row max |Δ|."""
    if b["above"] is None:
        return "0 (equal)"
    if b["up_to"] is None:
        return f"> {b['above']:g}"
    return f"({b['above']:g}, {b['up_to']:g}]"


def _drift_tables(d: dict, width: int = 40) -> tuple[Table, Table]:
    """The rows with the largest max |Δ| (row, token when known, max |Δ|), and the histogram of per-row max
    |Δ| with ``▇`` bars scaled to the largest bin (``width`` characters; a bin with rows has at least one)."""
    top = Table(title="rows with the largest |Δ|", title_justify="left", box=None, padding=(0, 2, 0, 2))
    for col, just in (("row", "right"), ("token", "left"), ("max |Δ| of the row", "right")):
        top.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in d["top_rows"]:
        token = "—" if r["token"] is None else json.dumps(r["token"], ensure_ascii=False)
        top.add_row(str(r["row"]), token, f"{r['max_abs_diff']:.3g}")
    hist = Table(title="rows by their max |Δ|", title_justify="left", box=None, padding=(0, 2, 0, 2))
    for col, just in (("max |Δ|", "left"), ("rows", "right"), ("", "left")):
        hist.add_column(col, justify=just)  # type: ignore[arg-type]
    most = max(b["rows"] for b in d["histogram"]) or 1
    for b in d["histogram"]:
        bar = "▇" * max(1 if b["rows"] else 0, round(width * b["rows"] / most))
        hist.add_row(_bin_label(b), str(b["rows"]), bar)
    return top, hist


def _drift(con: Console, info: dict, asked: bool = False) -> None:
    """The drift section of a head that differs from the embedding: numbers, top rows, histogram. Shown
    when the config says tied (a head that drifted from the table it should equal) or when ``asked``
    (``inspect --drift``); a head of its own under an untied config is not drift."""
    d = info["tie"].get("drift")
    if not d or not (asked or info["tie"]["config"]):
        return
    con.print(
        f"drift: {d['differing_rows']} of {d['rows']} rows differ; max |Δ| {d['max_abs_diff']:.3g}, mean |Δ| "
        f"{d['mean_abs_diff']:.3g} over all {d['elements']} elements (equal ones included)"
    )
    for t in _drift_tables(d):
        con.print(t)


def _vocab_line(info: dict) -> str:
    """``vocab: config vocab_size ..., embedding rows ..., [head rows ...,] hidden_size ..., tokenizer``"""
    v, h = info["vocab"], info["head"]
    return (
        f"vocab: config {v.get('config_vocab_key') or 'vocab_size'} {v['config_vocab_size']}, "
        f"embedding rows {v['embedding_rows']}, "
        + (
            f"head rows {h['rows']}, "
            if h.get("rows") is not None and h["rows"] != v["embedding_rows"]
            else ""
        )
        + f"hidden_size {v['hidden_size']}, tokenizer "
        + (
            f"{v['tokenizer_size']} tokens ({', '.join(v['tokenizer_files'])})"
            if v["tokenizer_size"]
            else "not found"
        )
    )


def _tokenizer_line(info: dict) -> str | None:
    """``tokenizer files: tokenizer.json 301, tokenizer.model 300 (not parsed: ...): they agree`` (None
    without tokenizer files); each disagreement is a problem line of its own."""
    t = info["vocab"].get("tokenizer")
    if not t or not t["files"]:
        return None
    files = ", ".join(
        f["name"]
        + (f" {f['length']}" if f["length"] is not None else "")
        + (f" ({f['note']})" if f["note"] else "")
        for f in t["files"]
    )
    n = len(t["disagreements"])
    verdict = "they agree" if t["agree"] else f"{n} disagreement{'s' if n > 1 else ''} (problems below)"
    if t.get("gaps") and not n:
        verdict = f"a gap of {len(t['gaps'])} id(s) no file names, which loaders renumber (problems below)"
    added = f", {len(t['added'])} added" if t["added"] else ""
    return f"tokenizer files: {files}; len(tokenizer) {t['length']}{added}: {verdict}"


def _savings_line(info: dict) -> str:
    """``tying would save N parameters, B bytes (P% of the checkpoint)``, with why nothing or on what
    condition."""
    s = info["savings"]
    return (
        f"tying would save {count(s['parameters'])} parameters, {size(s['bytes'])} "
        f"({percent(s['percent'])}% of the checkpoint)"
        + (f": {s['why_zero']}" if s.get("why_zero") else "")
        + (f", if the values agree ({s['assumes']})" if s.get("assumes") else "")
    )


def version(v: str) -> None:
    """``tietool --version``."""
    print(f"tietool {v}")


def inspect(info: dict, as_json: bool = False, drift: bool = False) -> None:
    """``tietool inspect``: the summary dict as JSON, or as lines and a table (problems, notes and
    warnings in the words the library gave them); the drift view when the config says tied or ``drift``
    (``--drift``) asks for it."""
    if as_json:
        print(json.dumps(finite(dict(info)), indent=2))
        return
    if info.get("kind") == "flex":
        flex_inspect(info)
        return
    con = _console()
    con.print(
        f"{info['path']}: {info['format']}{' (sharded)' if info['sharded'] else ''}, "
        f"{len(info['files'])} weight file(s), {info['num_tensors']} tensors, "
        f"{count(info['total_parameters'])} parameters, {size(info['total_bytes'])}"
    )
    arch = info["architecture"]
    con.print(
        f"model_type {info['model_type']!s} (family {arch['family']}"
        f"{'' if arch['in_table'] else ', not in the table'}); loader {info['loader']['name']}: "
        f"{info['loader']['source']}"
    )
    con.print(_pair_table(info))
    _transfer_line(con, info)
    con.print(_tie_line(info))
    _drift(con, info, drift)
    con.print(_vocab_line(info))
    tok = _tokenizer_line(info)
    if tok:
        con.print(tok)
    con.print(_savings_line(info))
    _messages(con, info["notes"], info["warnings"], info["problems"])
    left_out(con, info.get("left_out", []), info["index"], info["format"], writing=False)
    left_out(
        con,
        [
            {"file": f, "reason": "training-state", "bytes": None, "kept": False}
            for f in info.get("training_state", [])
        ],
        info["index"],
        info["format"],
        writing=False,
    )
    recovered(info.get("recovered") or {})


def flex_inspect(info: dict) -> None:
    """``tietool inspect`` of a flex checkpoint: its files and ranks, a table of its global tensors, the
    Trainer's other state folders, and the merge that makes it a checkpoint."""
    con = _console()
    con.print(
        f"{info['path']}: flex checkpoint ({info['metadata']}), {len(info['ranks'])} rank(s), "
        f"{len(info['files'])} .distcp file(s), {info['num_tensors']} tensors, "
        f"{count(info['total_parameters'])} parameters, {size(info['total_bytes'])}"
        + (f"; model_type {info['model_type']}" if info.get("model_type") else "")
    )
    t = Table()
    for col in ("tensor", "global shape", "dtype", "slices", "files", "coverage"):
        t.add_column(col, overflow="fold")
    for x in info["tensors"]:
        flat = " (flattened)" if x["flattened"] else ""
        t.add_row(
            x["name"],
            str(x["shape"]),
            x["dtype"],
            f"{x['slices']}{flat}",
            ", ".join(x["files"]),
            _coverage_cell(x.get("coverage")),
        )
    con.print(t)
    _messages(con, info.get("notes", []), info.get("warnings", []), info.get("problems", []))
    for d in info["state_folders"]:
        print(f"training state: {d}/ (a flex folder of its own; not merged into the model)")
    if info.get("config") is None:
        print(
            "note: no config.json here or in the folder above (the Trainer's flex saves write none); merge "
            "needs the config.json of the model the run started from, copied into the folder"
        )
    print(f"note: {FLEX_COMMANDS}")
    recovered(info.get("recovered") or {})


FLEX_COMMANDS = (
    "tietool merge takes a flex checkpoint into a new folder (PaddleFormers safetensors, which every command "
    "takes); resize and add-tokens take a Trainer checkpoint-N/ as it is with --keep-training-state (its "
    "optimizer state resized too); tie, untie, convert and verify refuse it"
)


def _coverage_cell(cov: dict | None) -> str:
    """A flex tensor's coverage in words: ``covered``, ``gap of K elements (first [i, j])``, with the
    overlapping slices and stored copies."""
    if cov is None:
        return ""
    if cov["state"] == "gap":
        n = cov["missing"]
        what = f"gap of {n:,} element{'s' if n != 1 else ''} (first {cov['first_missing']})"
    else:
        what = "covered"
    if cov["overlaps"]:
        what += (
            f"; overlapping slices ({cov['overlaps']} pair(s), {cov['shared_elements']:,} elements shared)"
        )
    if cov["copies"] > 1:
        what += f"; {cov['copies']} copies"
    return what


def inspect_failed(info: dict) -> None:
    """The one ``tietool: error:`` line on stderr that ends an inspection with problems (a flex
    checkpoint's gap: ``exit_code`` 3), after its report: the first problem, how many more, and the fix."""
    probs = info["problems"]
    more = f" (and {len(probs) - 1} more problem(s), listed above)" if len(probs) > 1 else ""
    where = Path(info["path"]) / info["metadata"] if info.get("metadata") else info["path"]
    print(f"tietool: error: {where}: {probs[0]}{more} — {info.get('fix', '')}", file=sys.stderr)


def recovered(rec: dict) -> None:
    """Notes on what the library put right before reading (``inspect``'s ``recovered``: what killed in-place
    runs left), in the words the write commands use."""
    for what, paths in (
        ("removed", rec.get("removed_temps")),
        ("kept as a backup", rec.get("kept_backups")),
        ("the previous version it was deleting; now deleted", rec.get("finished_deletions")),
        ("a stale lock file; removed", rec.get("removed_locks")),
    ):
        for p in paths or ():
            print(f"note: left by an interrupted run: {p} ({what})")
    for p in rec.get("left_to_delete") or ():
        print(
            f"warning: left by an interrupted run: {p}, the previous version it was deleting, still cannot "
            "be deleted: remove it by hand (chmod -R u+w, then rm -rf)"
        )
    if rec.get("restored"):
        print(
            f"note: an interrupted in-place run had left no folder at {rec['restored']}; "
            "its complete new version was put there"
        )


def _change_table(rep: dict) -> Table:
    """The report's table: tensors dropped, added, resized or rewritten, and the totals before → after."""
    t = Table(title="report: parameters and bytes")
    for col in ("change", "tensor", "shape", "parameters", "bytes"):
        t.add_column(col, overflow="fold")
    for d in rep["dropped"]:
        t.add_row("dropped", d["name"], _shape(d["shape"]), f"-{d['parameters']}", f"-{d['bytes']}")
    for a in rep["added"]:
        t.add_row("added", a["name"], _shape(a["shape"]), f"+{a['parameters']}", f"+{a['bytes']}")
    for c in rep["resized"]:
        t.add_row(
            "resized" if c["shape_before"] != c["shape_after"] else "rewritten",
            c["name"],
            f"{_shape(c['shape_before'])} → {_shape(c['shape_after'])}",
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


def _transfer_line(con, info: dict) -> None:
    """For a checkpoint in object storage: the bytes this run moved over the network."""
    t = info.get("transferred")
    if t:
        con.print(
            f"network: {size(t['received'])} received, {size(t['sent'])} sent, "
            f"{size(t['copied_server_side'])} copied by the server, in {t['requests']} data requests"
        )


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
    con = _console()
    head = f"{rep['operation']}{' (dry run: nothing written)' if rep['dry_run'] else ''}: {rep['input']}"
    if rep["output"] and not rep["dry_run"]:
        head += f" → {rep['output']}"
    con.print(head, style="bold")
    con.print(_change_table(rep))
    _transfer_line(con, rep)
    s = rep["saved"]
    if s["bytes"] >= 0:
        con.print(f"saved {count(s['parameters'])} parameters, {size(s['bytes'])} ({percent(s['percent'])}%)")
    else:
        con.print(
            f"added {count(-s['parameters'])} parameters, {size(-s['bytes'])} ({percent(-s['percent'])}%)"
        )
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
    _messages(con, rep["notes"], rep["warnings"])
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


def done_state(rep: dict) -> str:
    """What a Ctrl-C while the report of a finished write is printed leaves: the write is complete (an
    in-place run's name holds the new version, the output folder is in place), so the "interrupted" line
    must not say "nothing was written"."""
    ip = rep.get("in_place")
    if rep.get("dry_run") or (ip is not None and not ip.get("written")):
        return "nothing was written" + (" (dry run)" if rep.get("dry_run") else "")
    if ip is not None:
        where = f"the previous version is {ip['backup']}" if ip.get("backup") else "no backup kept"
        return f"{rep['input']} holds the new version (complete); {where}; stopped while printing the report"
    return f"the output {rep.get('output')} is complete; stopped while printing the report"


def _after_write(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` (a finished write's report printer) with a Ctrl-C while it prints raised as
    :class:`Interrupted` whose state is :func:`done_state` (without it, an in-place
    ``add-tokens`` interrupted after the swap said "interrupted; nothing was written", exit 130)."""

    @functools.wraps(fn)
    def wrapped(rep: dict, as_json: bool = False) -> None:
        try:
            fn(rep, as_json)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            raise Interrupted(done_state(rep)) from None

    return wrapped


@_after_write
def written(rep: dict, as_json: bool = False) -> None:
    """The report of tie, untie or resize (:func:`report`), and for an in-place run where the old version
    went and what earlier runs left."""
    report(finite(dict(rep)) if as_json else rep, as_json=as_json)
    if not as_json:
        _stale_notes(rep)
    ip = rep.get("in_place")
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


def _stale_notes(rep: dict) -> None:
    """A note for each temporary folder of a killed run that the write removed (``removed_stale_temps``)."""
    for p in rep.get("removed_stale_temps", ()):
        print(f"note: removed {p}, the temporary folder of an interrupted run (its process is gone)")


def _inside(folder: Path) -> bool:
    """The current folder was ``folder`` (or inside it) before a swap: its path still names ``folder``."""
    here = Path(os.environ.get("PWD") or os.getcwd())
    return here == folder or folder in here.parents


@_after_write
def merge(rep: dict, as_json: bool = False) -> None:
    """The merge report: JSON, or one line per tensor (rule, axis, shape) and a summary; then the temporary
    folders of killed runs it removed."""
    if as_json:
        print(json.dumps(finite(dict(rep)), indent=2))
        return
    for t in rep["tensors"]:
        axis = "" if t["axis"] is None else f" on axis {t['axis']}"
        turned = ", transposed" if t.get("transposed") else ""
        print(f"  {t['name']}: {t['rule']}{axis}{turned} -> {t['dtype']} {t['shape']}")
    for k, (before, after) in rep["config_changes"].items():
        print(f"config.json: {k} {before} -> {after}")
    if rep.get("tie"):  # the tie check: a head trained apart kept, the tie flag set false
        print(f"warning: {rep['tie']['message']}")
    for f in rep["left_out"]:
        print(f"left out: {f}")
    if rep["dry_run"]:
        print(
            f"dry run: would merge {len(rep['rank_files'])} rank files into {len(rep['tensors'])} tensors in "
            f"{', '.join(rep['weight_files'])}; nothing was written"
        )
    elif rep.get("kind") == "flex":
        nr, nf = len(rep["ranks"]), len(rep["rank_files"])
        print(
            f"merged the flex checkpoint ({nr} rank{'s' * (nr != 1)}, {nf} .distcp file{'s' * (nf != 1)}) "
            f"into {rep['output']}: {len(rep['tensors'])} tensors in {', '.join(rep['weight_files'])}"
        )
    else:
        ranks = (
            f"{rep['expert_parallel']} expert-parallel, numbered {' / '.join(rep['expert_numbering'] or [])}"
            if rep.get("expert_parallel", 1) > 1
            else f"{rep['tensor_parallel']} tensor-parallel x {rep['pipeline_parallel']} pipeline"
        )
        print(
            f"merged {len(rep['rank_files'])} rank files ({ranks}) into {rep['output']}: "
            f"{len(rep['tensors'])} tensors in {', '.join(rep['weight_files'])}"
        )
    _merge_messages(rep)
    _stale_notes(rep)


def _merge_messages(rep: dict) -> None:
    """Every note and warning of a merge report, its conversion's too (``converted``): a warning that
    matters is said on the terminal, not only in tietool-report.json."""
    conv = rep.get("converted") or {}
    _messages(_console(), conv.get("notes", []), [*rep.get("warnings", []), *conv.get("warnings", [])])


@_after_write
def convert(rep: dict, as_json: bool = False) -> None:
    """A convert report: as JSON, or a table of every renamed, transposed and split tensor, the config
    changes, the files written and the notes; then the temporary folders of killed runs it removed."""
    if as_json:
        print(json.dumps(finite(rep), indent=2))
        return
    _convert_text(rep)
    _stale_notes(rep)


def _convert_text(rep: dict) -> None:
    """:func:`convert` for people."""
    con = _console()
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
        shape = f"{_shape(x['shape_before'])} → {_shape(x['shape_after'])}" if x else ""
        t.add_row("renamed, transposed" if x else "renamed", r["from"], r["to"], shape)
    for x in turned.values():
        t.add_row(
            "transposed", x["from"], x["name"], f"{_shape(x['shape_before'])} → {_shape(x['shape_after'])}"
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
    _messages(con, rep["notes"], rep["warnings"])


def verify(res: Any, before: str, after: str, as_json: bool = False) -> None:
    """``tietool verify BEFORE AFTER``: the :class:`~tietool.surgery.verify.VerifyResult` as JSON or as
    lines and a verdict; then on stderr, why the exit code is 7 (unexplained differences) or 8 (logits
    not compared)."""
    d = res.as_dict()
    if as_json:
        print(json.dumps(finite(d), indent=2))
    else:
        _verify_text(d)
    if res.exit_code == ExitCode.UNEXPLAINED:
        print(
            f"tietool: verify: {len(res.unexplained)} difference(s) that tietool's operations do not "
            f"explain between {before} and {after} (listed above)",
            file=sys.stderr,
        )
    if res.logits and res.logits.get("ok") is None:  # exit NOT_COMPARED (8) unless 7 already
        print(f"tietool: verify: {res.logits.get('error')}", file=sys.stderr)


def _verify_text(res: dict) -> None:
    """:func:`verify` for people: the counts, each difference, the logits and the verdict."""
    con = _console()
    con.print(
        f"{res['identical_tensors']} tensors bit-identical; {len(res['dropped'])} dropped, "
        f"{len(res['added'])} added, {len(res['resized'])} resized, {len(res['changed'])} changed"
    )
    for d in res["dropped"]:
        con.print(
            f"dropped {d['name']} {_shape(d['shape'])}"
            + (" (equals the embedding)" if d["equals_embedding"] else "")
        )
    for a in res["added"]:
        con.print(
            f"added {a['name']} {_shape(a['shape'])}"
            + (" (equals the embedding)" if a["equals_embedding"] else "")
        )
    for r in res["resized"]:
        con.print(
            f"resized {r['name']} {_shape(r['shape_before'])} → {_shape(r['shape_after'])}"
            + (" (common part identical)" if r["common_part_identical"] else " (common part DIFFERS)")
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
                f"logits under PaddleFormers {lg.get('model_class')} on token ids below "
                f"{lg.get('token_ids_below')}: max |difference| {lg.get('max_abs_diff'):.3g} "
                f"({'same' if lg['ok'] else 'DIFFERENT'})"
            )
    for n in res.get("notes", ()):
        con.print(f"note: {n}")
    if res["explained"] and lg and lg.get("ok") is None:
        con.print(
            "verdict: every tensor difference is explained by the operations tietool-report.json records; "
            "the logits were not compared"
        )
    elif res["explained"]:
        con.print("verdict: every difference is explained by the operations tietool-report.json records")
    else:
        for u in res["unexplained"]:
            con.print(f"unexplained: {u}", style="red")
        con.print("verdict: differences that tietool's operations do not explain")


def _many_row(info: dict) -> list[str]:
    """Table cells of one inspection: vocab rows, hidden size, head layout, tie state, tying's savings."""
    if info.get("kind") == "flex":  # a flex checkpoint: no vocabulary surface until it is merged
        what = f"flex checkpoint, {len(info['ranks'])} rank(s), {info['num_tensors']} tensors: merge it first"
        if info.get("problems"):
            what = (
                f"flex checkpoint, {len(info['ranks'])} rank(s): {len(info['problems'])} tensor(s) with a gap"
            )
        return [str(info["path"]), f"{what} ({info.get('model_type')})", *[""] * 5]
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
        size(sav["bytes"]) if sav["bytes"] else "0",
    ]


def inspect_many(results: list[dict], as_json: bool = False) -> None:
    """``tietool inspect A B C``: a table with a row per checkpoint (or a JSON list). ``results`` holds an
    inspection per folder, or for a folder that could not be read ``{"path", "error", "exit_code"}``
    (its row says why)."""
    if as_json:
        print(json.dumps(finite(results), indent=2))
        return
    t = Table(title=f"{len(results)} checkpoints")
    for col in ("checkpoint", "family", "vocab rows", "hidden", "head layout", "tie", "tying saves"):
        t.add_column(col, overflow="fold")
    for r in results:
        if "error" in r:
            t.add_row(r["path"], f"error (exit {r['exit_code']}): {r['error']['message']}", *[""] * 5)
        else:
            t.add_row(*_many_row(r))
    _console().print(t)


def progress_bar(quiet: bool) -> Callable[..., Any] | None:
    """The progress-bar factory the operations take (``progress(total)``: :func:`progress`); None: no bar."""
    from functools import partial

    return None if quiet else partial(progress, False)


@contextlib.contextmanager
def progress(quiet: bool, total: int, threshold: int = 256 << 20):
    """A rich progress bar over the ``total`` bytes written (the output's tensor bytes), with the rate and
    the time left, on stderr. Shown only on a terminal, without ``quiet``, for an output of at least
    ``threshold`` bytes (a small one is written before a bar would mean anything); yields None otherwise.

    The bar is drawn as soon as it is made, at 0, and again on the first bytes, rather than at rich's next
    timed refresh: the writer reports bytes per tensor and per step as it writes them (copies and rewrites),
    so the bar moves from the first byte. Yields ``advance(file name, bytes)``, thread-safe.
    """
    if quiet or total < threshold or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    ) as p:
        task = p.add_task("writing", total=total)
        p.refresh()
        first = [True]

        def advance(name: str, nbytes: int) -> None:
            p.update(task, advance=nbytes, description=f"writing {name}")
            if first[0]:
                first[0] = False
                p.refresh()

        yield advance
