"""``tietool inspect``: one checkpoint as lines and tables (the embedding/head table, the tie state three
ways, the drift view, vocabulary, tokenizer, savings), a flex checkpoint's tensors, several checkpoints as a
table of rows; or the inspection as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import finite
from ..numbers import count, percent
from .common import console, left_out, messages, recovered, result, shape_text, size, transfer_line


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
        t.add_row(
            "input embedding", e["name"], shape_text(e["shape"]), _dtype(e), "vocab-hidden", e["file"] or "—"
        )
    else:
        t.add_row(
            "input embedding",
            f"{e['name']} (missing: the table is stored as {e['stored_as']})",
            shape_text(e["shape"]),
            "—",
            "vocab-hidden",
            "—",
        )
    for a in e["aliases"]:
        t.add_row("  alias (same table)", a, shape_text(e["shape"]), e["dtype"], "", "")
    absent = " (the shared table; no separate head)" if tie_vals(info) == "shared" else " (not in files)"
    t.add_row(
        "LM head",
        h["name"] + ("" if h["present"] else absent),
        shape_text(h["shape"]),
        _dtype(h),
        h["layout"] or "—",
        h["file"] or "—",
    )
    for a in h.get("aliases", []):
        t.add_row("  alias", a, "", "", "", "")
    if b:
        t.add_row("head bias", b["name"], shape_text(b["shape"]), b["dtype"], "", b["file"])
        for a in b["aliases"]:
            t.add_row("  alias", a, "", "", "", "")
    for v in info.get("vocabulary_tensors", []):
        if v["role"] in ("extra vocabulary table", "vocab-shaped tensor"):
            t.add_row(v["role"], v["name"], shape_text(v["shape"]), v["dtype"] or "—", "", v["file"] or "—")
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


def inspect_line(info: dict) -> str:
    """One checkpoint in one line (what ``inspect --quiet`` prints per folder): family and model type,
    vocabulary rows, hidden size, head layout, the tie state and what tying saves; a flex checkpoint's
    ranks and tensors; a folder that could not be read, its error."""
    if "error" in info:
        return f"{info['path']}: error (exit {info['exit_code']}): {info['error']['message']}"
    path, what, rows, hidden, layout, tie, saves = _many_row(info)
    if info.get("kind") == "flex":
        shape = f", vocab rows {rows}, hidden {hidden}, head layout {layout}; {tie}" if rows else ""
        return f"{path}: {what}{shape}"
    shape = f"vocab rows {rows}, hidden {hidden}, head layout {layout}"
    return f"{path}: {what}, {shape}; {tie}; tying saves {saves}"


def inspect(info: dict, as_json: bool = False, drift: bool = False, quiet: bool = False) -> None:
    """``tietool inspect``: the summary dict as JSON, or as lines and a table (problems, notes and
    warnings in the words the library gave them); the drift view when the config says tied or ``drift``
    (``--drift``) asks for it; ``quiet``: :func:`inspect_line` and the problems and warnings (on stderr)."""
    if as_json:
        print(json.dumps(finite(dict(info)), indent=2))
        return
    if quiet:  # the problems of a failed inspection are in its one error line (inspect_failed)
        problems = [] if info.get("exit_code") else info.get("problems", [])
        result(inspect_line(info), info.get("notes", []), info.get("warnings", []), problems)
        return
    if info.get("kind") == "flex":
        flex_inspect(info)
        return
    con = console()
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
    transfer_line(con, info)
    con.print(_tie_line(info))
    _drift(con, info, drift)
    con.print(_vocab_line(info))
    tok = _tokenizer_line(info)
    if tok:
        con.print(tok)
    con.print(_savings_line(info))
    messages(con, info["notes"], info["warnings"], info["problems"])
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
    con = console()
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
    if "embedding" in info:  # its vocabulary, detected on the merged view (the Trainer's layout)
        con.print(_pair_table(info))
        con.print(_tie_line(info))
        con.print(_vocab_line(info))
    elif info.get("vocabulary_error") and info.get("config") is not None and not info.get("exit_code"):
        print(f"note: vocabulary not inspected: {info['vocabulary_error']['message']}")
    messages(con, info.get("notes", []), info.get("warnings", []), info.get("problems", []))
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


def inspect_failed(info: dict, quiet: bool = False) -> None:
    """The one ``tietool: error:`` line on stderr that ends an inspection with problems (a flex
    checkpoint's gap: ``exit_code`` 3), after its report: the first problem, how many more (listed above
    unless ``quiet``), and the fix."""
    probs = info["problems"]
    listed = "" if quiet else ", listed above"
    more = f" (and {len(probs) - 1} more problem(s){listed})" if len(probs) > 1 else ""
    where = info.get("failed_path") or (
        Path(info["path"]) / info["metadata"] if info.get("metadata") else info["path"]
    )
    print(f"tietool: error: {where}: {probs[0]}{more} — {info.get('fix', '')}", file=sys.stderr)


def _many_row(info: dict) -> list[str]:
    """Table cells of one inspection: vocab rows, hidden size, head layout, tie state, tying's savings."""
    if info.get("kind") == "flex":  # a flex checkpoint: its vocabulary only with a config.json
        flex = f"flex checkpoint{f' ({mt})' if (mt := info.get('model_type')) else ''}"
        what = f"{flex}, {len(info['ranks'])} rank(s), {info['num_tensors']} tensors: merge it first"
        gaps = sum(1 for t in info["tensors"] if (t.get("coverage") or {}).get("state") == "gap")
        if gaps:
            what = f"{flex}, {len(info['ranks'])} rank(s): {gaps} tensor(s) with a gap"
        elif info.get("exit_code"):  # a damaged file, a name that is not there: the error line says which
            what = f"{flex}, {len(info['ranks'])} rank(s): {len(info['problems'])} problem(s)"
        if "embedding" not in info:  # no config.json: its structure only
            return [str(info["path"]), what, *[""] * 5]
        return [str(info["path"]), what, *_vocab_cells(info), "—"]  # a merge writes what tying saves
    sav = info["savings"]
    return [
        str(info["path"]),
        f"{info['architecture']['family']} ({info['model_type']})",
        *_vocab_cells(info),
        size(sav["bytes"]) if sav["bytes"] else "0",
    ]


def _vocab_cells(info: dict) -> list[str]:
    """Vocab rows, hidden size, head layout and the tie state of an inspection, as table cells."""
    tie, head = info["tie"], info["head"]
    tied = (
        "tied" if tie["config"] else "untied"
    ) + f" by config; head {'in files' if tie['head_in_files'] else 'absent'}"
    return [
        str(info["vocab"]["embedding_rows"]),
        str(info["vocab"]["hidden_size"]),
        str(head.get("layout") or "—") if head.get("present") else "—",
        f"{tied}; values {tie['values']}",
    ]


def inspect_many(results: list[dict], as_json: bool = False, quiet: bool = False) -> None:
    """``tietool inspect A B C``: a table with a row per checkpoint (or a JSON list; ``quiet``: an
    :func:`inspect_line` per checkpoint). ``results`` holds an inspection per folder, or for a folder that
    could not be read ``{"path", "error", "exit_code"}`` (its row says why)."""
    if as_json:
        print(json.dumps(finite(results), indent=2))
        return
    if quiet:
        for r in results:
            print(inspect_line(r))
        return
    t = Table(title=f"{len(results)} checkpoints")
    for col in ("checkpoint", "family", "vocab rows", "hidden", "head layout", "tie", "tying saves"):
        t.add_column(col, overflow="fold")
    for r in results:
        if "error" in r:
            t.add_row(r["path"], f"error (exit {r['exit_code']}): {r['error']['message']}", *[""] * 5)
        else:
            t.add_row(*_many_row(r))
    console().print(t)
