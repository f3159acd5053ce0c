"""``verify`` of a ``transplant`` output: the output's own report (its only run since the input) says, per
new id, the donor's token and how its entries were made (``transplant.tokens`` and ``transplant.made``), and
the files must bear out exactly that.

* every vocabulary tensor of the input (embedding, head in either layout, bias, copies): entry ``j`` of the
  output's is, bit for bit, the input's entry ``old_id`` (``kept``), the mean of the input's entries
  ``ids`` (``subword``; float64 sum, float32 mean, rounded to the stored dtype once), the mean of every input
  entry (``mean``, summed in blocks as :func:`~surgery.plan.transplant_rows.mean_entry` sums it), zeros, or
  the report's combination of input entries (``omp``, the head's own when the report gives the head one),
  recomputed here from the input (:func:`expected_entries`); the omp coefficients recomputed from the donor
  model (:mod:`surgery.verify.transplant_omp`);
* a ``kept`` claim names the same token string in the input's tokenizer at ``old_id`` as the output's at
  ``j``; the output's tokenizer files name the report's token at every id and no id beyond them;
* every other tensor bit-identical, the dtype label the edit writes; config files unchanged but for the
  vocabulary-size keys (as :func:`surgery.plan.resize.vocab_size_sets` sets them) and the token id keys
  (an id of the new vocabulary, or null);
* every other file byte-identical, safetensors ``__metadata__`` the input's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..inspect import chunked
from ..inspect.detection import Detection
from ..io.checkpoint import REPORT_NAME, Checkpoint
from ..io.configfile import read_config_file
from ..io.regular import load_json
from ..io.tokenizer import tokenizer_set, vocabulary_maps
from ..io.vocabkeys import walk
from ..model.enums import TensorRole
from ..model.errors import CheckpointError
from ..model.tensor import bf16_bits_to_f32, f32_to_bf16_bits
from ..plan.resize import vocab_size_sets
from ..plan.transplant import TOKENIZER_EXTRAS
from ..plan.transplant_rows import mean_entry
from ..report import chain_since
from .files import compare_metadata, compare_other_files
from .result import VerifyResult
from .tensors import detect_pair, written_labels
from .tokens import tokenizer_names
from .transplant_omp import TABLES, check_coefficients, omp_claims, omp_entry

_CONFIG_FILES = ("config.json", "model_config.json", "generation_config.json")
_MADE = ("kept", "subword", "mean", "zeros", "omp")


def section(a_path: Any, b_path: Any) -> dict[str, Any] | None:
    """The ``transplant`` section of the output's own report when its run is a ``transplant`` and the only
    run that made the output from the input (:func:`surgery.report.chain_since`); None otherwise."""
    b = Path(str(b_path))
    runs = chain_since(b, Path(str(a_path)))
    if len(runs) != 1 or runs[0].get("operation") != "transplant":
        return None
    try:
        rep = load_json(b / REPORT_NAME, REPORT_NAME)
    except (CheckpointError, OSError):
        return None
    sec = rep.get("transplant") if isinstance(rep, dict) and rep.get("operation") == "transplant" else None
    return sec if isinstance(sec, dict) else {}


def chained(res: VerifyResult, a_path: Any, b_path: Any) -> None:
    """When a ``transplant`` is one of several runs that made the output from the input, say so as
    unexplained: the chain's history keeps no per-id rows, so verify each step on its own."""
    runs = chain_since(Path(str(b_path)), Path(str(a_path)))
    if len(runs) > 1 and any(r.get("operation") == "transplant" for r in runs):
        res.unexplained.insert(
            0,
            "the output's report chain holds a transplant and other runs: its rows are checked only when the "
            "transplant is the one run since the input; verify the input against the transplant's output, "
            "then that against this one",
        )


def verify_transplant(a_path: Any, b_path: Any, sec: dict[str, Any]) -> VerifyResult:
    """Compare input ``a_path`` with the transplant output ``b_path`` whose report section is ``sec``.

    Returns:
        the classification; every difference the report's rows do not explain is in ``res.unexplained``.

    Raises:
        CheckpointError, UnsafePickleError: as :meth:`Checkpoint.open`.
    """
    res = VerifyResult()
    A, B = Checkpoint.open(a_path), Checkpoint.open(b_path)
    da, db = detect_pair(A, B)
    rows = claimed_rows(res, sec, da.vocab_rows, db.vocab_rows)
    if rows is None or not omp_claims(res, sec, rows, da.vocab_rows):
        return res
    compare_tensors(res, A, B, (da, db), rows)
    check_coefficients(res, sec, rows)
    compare_configs(res, A, B, da, len(rows))
    compare_tokens(res, A, B, rows)
    sets = (tokenizer_set(A.path), tokenizer_set(B.path))
    skip = tokenizer_names(A, B, sets) | set(TOKENIZER_EXTRAS)
    compare_metadata(res, A, B)
    compare_other_files(res, A, B, skip)
    counts = {k: sum(r["made"] == k for r in rows) for k in _MADE}
    res.notes.append(
        f"transplant: {len(rows)} donor ids ({', '.join(f'{n} {k}' for k, n in counts.items())}), each "
        "vocabulary entry recomputed from the input as the report's rows say"
    )
    return res


def _parse(j: int, token: Any, made: Any, rows_a: int) -> dict[str, Any] | str:
    """Row ``j`` of the report (``tokens[j]``, ``made[j]``) as ``{"token", "made", "old_id" | "ids"}``, or
    why it is not a valid row."""
    parts = made.split(" ") if isinstance(made, str) else []
    kind = parts[0] if parts else None
    nums = [int(p) for p in parts[1:] if p.isdigit() and p.isascii() and len(p) <= 18]
    if not isinstance(token, str) or kind not in _MADE or len(nums) != len(parts) - 1:
        return f"row {j} is {made!r} (token {token!r}), not one of {', '.join(_MADE)}"
    if any(n >= rows_a for n in nums) or (kind == "kept" and len(nums) != 1):
        return f"row {j} is {made!r}: not ids of the input's {rows_a} rows"
    if kind in ("mean", "zeros") and nums:
        return f"row {j} is {made!r}: {kind} names no ids"
    row: dict[str, Any] = {"token": token, "made": kind}
    if kind == "kept":
        row["old_id"] = nums[0]
    elif kind == "subword":
        row["ids"] = nums
    return row


def claimed_rows(res: VerifyResult, sec: dict[str, Any], rows_a: int, rows_b: int) -> list[dict] | None:
    """The report's rows (``tokens``, ``made``), one per output id ``0..rows_b-1``, each valid
    (:func:`_parse`), agreeing with ``rows_before`` / ``rows_after``; otherwise the report is named
    unverifiable (None)."""
    tokens, made = sec.get("tokens"), sec.get("made")
    why = ""
    rows: list[dict] = []
    if not isinstance(tokens, list) or not isinstance(made, list) or not made or len(tokens) != len(made):
        why = "has no tokens and made lists of one length"
    elif len(made) != rows_b or sec.get("rows_after") != rows_b or sec.get("rows_before") != rows_a:
        why = (
            f"lists {len(made)} rows (rows {sec.get('rows_before')} → {sec.get('rows_after')}) while the "
            f"embedding went {rows_a} → {rows_b} rows"
        )
    else:
        for j, (t, m) in enumerate(zip(tokens, made, strict=True)):
            r = _parse(j, t, m, rows_a)
            if isinstance(r, str):
                why = r
                break
            rows.append(r)
    if why:
        res.unexplained.append(f"tietool-report.json's transplant {why}; the report is unverifiable")
        return None
    return rows


def _vocab_axes(da: Detection) -> dict[str, int]:
    """``{name: vocabulary axis}`` of every tensor of the input's surface a transplant lays out."""
    return {
        vt.name: vt.vocab_axis
        for group in da.surface.values()
        for vt in group
        if vt.present
        and vt.vocab_axis is not None
        and vt.vocabulary is None
        and vt.role is not TensorRole.TOKEN_ID_MAP
    }


def compare_tensors(
    res: VerifyResult, A: Checkpoint, B: Checkpoint, dets: tuple[Detection, Detection], rows: list[dict]
) -> None:
    """Vocabulary tensors: every entry as its row says (:func:`_entries`); every other tensor
    bit-identical; the same names in both and the dtype labels the edit writes, but for a copy of the
    embedding a tied output no longer stores (``dets``: the input's and output's detections)."""
    da, db = dets
    axes = _vocab_axes(da)
    labels = written_labels(A, da, B)
    emb = da.embedding.name
    for name in sorted(set(A.tensors) ^ set(B.tensors)):
        if name in A.tensors and name in axes and db.tie.tied and emb in B.tensors:
            if chunked.same_bytes(A, A, name, emb) or chunked.transposed_equal(A, name, A, emb):
                res.dropped.append(
                    {"name": name, "shape": list(A.tensors[name].shape), "equals_embedding": True}
                )
                continue
        where = "input" if name in A.tensors else "output"
        res.unexplained.append(f"{name} is only in the {where}; transplant drops and adds no tensor")
    for name in sorted(set(A.tensors) & set(B.tensors)):
        ta, tb = A.tensors[name], B.tensors[name]
        if tb.dtype != labels[name]:
            res.unexplained.append(
                f"{name}: dtype {ta.dtype} → {tb.dtype}; transplant writes {labels[name]} (the label rule of "
                "every edit: bfloat16 bits labelled U16 become BF16 unless the loader reads only U16)"
            )
        elif name not in axes:
            if chunked.same_bytes(A, B, name):
                res.identical += 1
            else:
                res.unexplained.append(f"{name} changed, and carries no vocabulary")
        else:
            head = name in [da.head.name, *da.head.aliases] and any("head" in r.get("omp", {}) for r in rows)
            _entries(res, A, B, (name, TABLES[head]), axes[name], rows)


def expected_entries(
    a: np.ndarray, axis: int, rows: list[dict], bf16: bool, table: str = "embedding"
) -> np.ndarray:
    """The entries ``[len(rows), ...]`` (stored dtype; ``bf16``: ``uint16`` bits of bfloat16) the report's
    ``rows`` make from the input tensor ``a`` along ``axis`` (an omp row: its ``table``'s ids and
    coefficients)."""
    x = np.moveaxis(a, axis, 0)

    def dec(v: np.ndarray) -> np.ndarray:
        return bf16_bits_to_f32(v) if bf16 else v.astype(np.float32)

    def enc(v: np.ndarray) -> np.ndarray:
        return f32_to_bf16_bits(v) if bf16 else v.astype(a.dtype)

    out = np.empty((len(rows),) + x.shape[1:], a.dtype)
    mean = None
    for j, r in enumerate(rows):
        if r["made"] == "kept":
            out[j] = x[r["old_id"]]
            continue
        if r["made"] == "mean":
            mean = mean_entry(x, dec) if mean is None else mean
            v = mean
        elif r["made"] == "omp":
            v = omp_entry(
                dec(x[r["omp"][table][0]]), list(range(len(r["omp"][table][0]))), r["omp"][table][1]
            )
        elif r["made"] == "subword" and r["ids"]:
            v = dec(x[r["ids"]]).mean(axis=0, dtype=np.float64).astype(np.float32)
        else:
            v = np.zeros(x.shape[1:], np.float32)
        out[j] = enc(np.asarray(v, np.float32)[None])[0]
    return out


def _entries(
    res: VerifyResult, A: Checkpoint, B: Checkpoint, named: tuple[str, str], axis: int, rows: list[dict]
) -> None:
    """``name`` of ``B`` (``named``: the name and the omp table its rows follow) holds, along ``axis``, the
    entries the report's ``rows`` make from ``name`` of ``A``, bit for bit."""
    name, table = named
    a, b = np.asarray(A.load(name)), np.asarray(B.load(name))
    axis %= a.ndim
    entry: dict[str, Any] = {"name": name, "shape_before": list(a.shape), "shape_after": list(b.shape)}
    entry["common_part_identical"] = False  # every entry as the report's rows make it
    res.resized.append(entry)
    expect = list(a.shape)
    expect[axis] = len(rows)
    if list(b.shape) != expect:
        res.unexplained.append(f"{name} has shape {list(b.shape)}; the report's rows make it {expect}")
        return
    want = expected_entries(a, axis, rows, A.logical_dtype(A.tensors[name]) == "bfloat16", table)
    n = len(rows)
    wb = np.ascontiguousarray(want).view(np.uint8).reshape(n, -1)
    gb = np.ascontiguousarray(np.moveaxis(b, axis, 0)).view(np.uint8).reshape(n, -1)
    bad = np.flatnonzero((wb != gb).any(axis=1))
    entry["common_part_identical"] = not bad.size
    if bad.size:
        r = rows[int(bad[0])]
        how = f"old id {r['old_id']}" if r["made"] == "kept" else f"{r['made']} {r.get('ids', '')}".strip()
        res.unexplained.append(
            f"{name}: entry {int(bad[0])} is not what the report says ({how})"
            + (f", nor are {bad.size - 1} more" if bad.size > 1 else "")
        )


def _read_cfg(p: Path) -> object:
    return load_json(p, p.name) if p.name == "generation_config.json" else read_config_file(p)


def _base(key: str) -> str:
    """A flattened key without its list indices (``eos_token_id.1`` → ``eos_token_id``)."""
    parts = key.split(".")
    while parts and parts[-1].isdigit():
        parts.pop()
    return ".".join(parts)


def compare_configs(res: VerifyResult, A: Checkpoint, B: Checkpoint, da: Detection, n: int) -> None:
    """Config files: every leaf unchanged, but a vocabulary-size key that counted the input's rows (now
    ``n``, as :func:`surgery.plan.resize.vocab_size_sets` sets it: a stale ``vocab_size`` too) and a token
    id key of ``config.json`` / ``generation_config.json`` (an id below ``n``, or null)."""
    sizes = vocab_size_sets(da, n)
    specials = {(s.file, s.key) for s in da.special_ids if s.key.endswith(("_id", "_ids"))}
    for fname in _CONFIG_FILES:
        pa, pb = A.path / fname, B.path / fname
        if not pa.exists() and not pb.exists():
            continue
        ca = dict(walk(_read_cfg(pa))) if pa.exists() else {}
        cb = dict(walk(_read_cfg(pb))) if pb.exists() else {}
        for k in sorted(set(ca) | set(cb)):
            before, after = ca.get(k), cb.get(k)
            if (fname, _base(k)) in specials:
                ok = after is None or (type(after) is int and 0 <= after < n)
                why = f"an id of the new {n}-token vocabulary or null"
            elif (fname, k) in sizes:
                ok, why = after == sizes[fname, k] and k in cb, f"{sizes[fname, k]!r}"
            else:
                ok, why = k in ca and k in cb and after == before, f"{before!r}"
            if not ok:
                res.unexplained.append(
                    f"{fname}: {k} is {after!r} (input {before!r}); the transplant makes it {why}"
                )
            elif after != before:
                res.config.append({"file": fname, "key": k, "before": before, "after": after})


def compare_tokens(res: VerifyResult, A: Checkpoint, B: Checkpoint, rows: list[dict]) -> None:
    """The output's tokenizer maps give each id the report's token and name no id beyond the rows; a
    ``kept`` row's token is the input's token at its old id."""
    want = {j: r["token"] for j, r in enumerate(rows)}
    maps_a, _ = vocabulary_maps(A.path)
    va: dict[int, str] = {}
    for m in maps_a.values():
        for i, s in m.items():
            va.setdefault(i, s)
    for j, r in enumerate(rows):
        if r["made"] == "kept" and va.get(r["old_id"]) != r["token"]:
            res.unexplained.append(
                f"id {j} keeps old id {r['old_id']}, whose token is {va.get(r['old_id'])!r}, not "
                f"{r['token']!r}"
            )
    maps, clashes = vocabulary_maps(B.path)
    res.unexplained.extend(f"{c}; a tokenizer gives each id one token" for c in clashes)
    got: dict[int, str] = {}
    for where, m in maps.items():
        for i, s in sorted(m.items()):
            got.setdefault(i, s)
            if want.get(i) != s:
                exp = f"{want[i]!r}" if i in want else f"no token (the output has {len(rows)} ids)"
                res.unexplained.append(f"{where}: id {i} is {s!r}, expected {exp} (the report's rows)")
    missing = [i for i in want if i not in got]
    if missing:
        res.unexplained.append(
            f"the output's tokenizer names no token at id(s) {', '.join(map(str, missing[:10]))}"
        )
    res.tokenizer = {"tokens": len(rows), "kept": sum(r["made"] == "kept" for r in rows)}
