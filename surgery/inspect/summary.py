"""``inspect``: the facts about a checkpoint as a JSON-able dict (the CLI renders it, ``--json`` prints
it)."""

from __future__ import annotations

import json
from typing import Any, TypedDict

from ..io import surface
from ..io.checkpoint import Checkpoint
from ..io.tokenizer import token_strings
from ..model.enums import TieState
from ..model.errors import Opt, TietoolError
from ..model.tensor import dtype_refusal
from . import chunked
from .convention import LEGACY_LOAD, paddle_layout_evidence
from .detect import detect
from .detection import DRIFT_EDGES, Detection
from .findings import Finding, FindingKind, describe


class _SavingsRequired(TypedDict):
    parameters: int
    bytes: int
    percent: float


class Savings(_SavingsRequired, total=False):
    """What ``tie`` would save (``inspect``'s ``savings``)."""

    why_zero: str  # why nothing would be saved
    assumes: str  # what the figures take for granted


def percent(part: int, whole: int) -> float:
    """``part`` as a percentage of ``whole``, to three decimals (0.0 of nothing)."""
    return round(100.0 * part / whole, 3) if whole else 0.0


def loader_facts(det: Detection) -> dict[str, Any]:
    """The loader block of a report and of ``inspect --json``: the loader, how it was decided, its facts
    for this model type and container (architecture table) and the test that proved them (``proof``,
    None: unproven, so no write relied on them)."""
    fam = det.family
    return {
        "name": det.loader.name,
        "source": det.loader.source,
        "reties_missing_head": fam.reties,
        "always_tied": fam.always_tied,
        "head_layout": fam.head_layout,
        "proven": fam.proven,
        "proof": fam.proof,
        "proven_loaders": list(fam.proven_loaders()),
    }


_DROPPABLE = (TieState.EXACT, TieState.TRANSPOSED, TieState.SCALED, TieState.UNKNOWN)
"""The tie states of a present head that ``tie`` may drop (equal as stored, transposed or scaled; not
compared: tie compares before it drops)."""


def savings_if_tied(det: Detection) -> Savings:
    """What ``tie`` would save on this checkpoint: the head and embedding copies a re-tying loader drops."""
    ckpt = det.ckpt
    params = bytes_ = 0
    why = None
    assumed = None
    if det.head.present and det.comparison.values in _DROPPABLE:
        if det.family.may_drop_head:
            if det.comparison.values is TieState.UNKNOWN:
                assumed = "the values were not compared; tie checks that they agree before it drops the head"
            names = [det.head.name] + det.head.aliases
            params = sum(ckpt.tensors[n].numel for n in names)
            bytes_ = sum(ckpt.tensors[n].nbytes for n in names)
        elif not det.family.trusted:
            why = (
                f"whether the {det.loader.name} loader re-ties a missing head of {det.config.model_type} "
                "from "
                f"{ckpt.format} is unproven, so it stays"
            )
        else:
            why = f"the {det.loader.name} loader does not re-tie a missing head, so it must stay"
    elif not det.embedding.present:
        emb, head = det.embedding.name, det.head.name
        why = f"the input embedding {emb} is missing: the head {head} holds the only table"
    elif det.head.present and det.comparison.values is TieState.DIFFERENT and not det.tie.tied:
        why = (
            "the config says untied and the head differs from the embedding: a head of its own, which tying "
            "would lose"
        )
    elif det.head.present and det.comparison.values is TieState.DIFFERENT:
        why = (
            f"the head differs from the embedding (tie {Opt('keep', 'embedding')} or "
            f"{Opt('keep', 'head')} would drop it)"
        )
    elif not det.head.present:
        why = "no head in the files"
    out: Savings = {"parameters": params, "bytes": bytes_, "percent": percent(bytes_, ckpt.total_bytes)}
    if why:
        out["why_zero"] = why
    if assumed:
        out["assumes"] = assumed
    return out


def _tensor(det: Detection, name: str) -> dict[str, Any]:
    """One stored tensor's header facts (``name`` is in the files: the embedding, a present head, the
    bias)."""
    t = det.ckpt.tensors[name]
    return {
        "name": name,
        "shape": list(t.shape),
        "dtype": t.dtype,
        "logical_dtype": det.ckpt.logical_dtype(t),
        "file": t.file,
        "parameters": t.numel,
        "bytes": t.nbytes,
    }


def _surface(det: Detection) -> list[dict[str, Any]]:
    """Every vocabulary tensor with its role (the main pair first), as JSON."""
    out = []
    for role, tensors in det.surface.items():
        for v in tensors:
            t = det.ckpt.tensors.get(v.name) if v.present else None
            out.append(
                {
                    "name": v.name,
                    "role": role.value,
                    "present": v.present,
                    "shape": list(t.shape) if t is not None else None,
                    "dtype": t.dtype if t is not None else None,
                    "file": t.file if t is not None else None,
                    "vocab_axis": v.vocab_axis,
                    "entries": v.entries,
                    "of": v.of,
                    "vocabulary": v.vocabulary,
                    "rule": det.beyond.token_tables[v.name].rule.value
                    if v.name in det.beyond.token_tables
                    else None,
                }
            )
    return out


def _embedding(det: Detection) -> dict[str, Any]:
    """The input embedding: its header facts (or, stored only as the head, the name and shape it would
    have), how it was found and its aliases."""
    emb: dict[str, Any]
    if det.embedding.present:
        emb = _tensor(det, det.embedding.name)
    else:  # stored only as the head: the name it would have, the shape it would have
        emb = {"name": det.embedding.name, "shape": [det.vocab_rows, det.hidden], "dtype": None, "file": None}
    emb["present"] = det.embedding.present
    emb["found_by"] = det.embedding.found_by.value
    emb["stored_as"] = det.embedding.stored_as
    emb["aliases"] = det.embedding.aliases
    emb["other_vocab_tensors"] = det.embedding.vocab_aliases
    return emb


def _head(det: Detection) -> dict[str, Any]:
    """The LM head: its header facts (the shared table's for T5, the name alone when absent), the name
    untie writes, its layout, aliases and rows."""
    head: dict[str, Any]
    if det.head.present:
        head = _tensor(det, det.head.name)
    elif det.comparison.values is TieState.SHARED:  # T5: the head *is* the shared table
        head = {
            "name": det.embedding.name,
            "shape": list(det.emb_info.shape),
            "dtype": det.emb_info.dtype,
            "file": None,
        }
    else:
        head = {"name": det.head.name, "shape": None, "dtype": None, "file": None}
    head["present"] = det.head.present
    head["untie_writes"] = det.head.name
    head["layout"] = det.head.layout
    head["aliases"] = det.head.aliases
    head["rows"] = det.head.rows
    return head


def _bias(det: Detection) -> dict[str, Any] | None:
    """The head bias's header facts and aliases (None without a bias)."""
    if not det.bias:
        return None
    bias = _tensor(det, det.bias.name)
    bias["aliases"] = det.bias.aliases
    return bias


def _tie(det: Detection) -> dict[str, Any]:
    """The tie state: what the config says, whether the head is in the files, how the values compare."""
    c = det.comparison
    return {
        "config": det.tie.tied,
        "config_source": det.tie.source,
        "config_flags": det.tie.flags,
        "head_in_files": det.head.present,
        "values": c.values,
        "max_abs_diff": c.max_abs_diff,
        "differing_rows": c.differing_rows,
        "storage_shared": c.storage_shared,
        "drift": _drift(det),
    }


def _drift(det: Detection) -> dict[str, Any] | None:
    """How a differing head differs row by row (None unless the values were compared and differ): the rows
    that differ, max |Δ| and the mean |Δ| over all elements, the rows with the largest max |Δ| with their
    tokens (from the tokenizer files, when they name them; else null), and the histogram of per-row max |Δ|
    (``{"above", "up_to", "rows"}``: the first bin is |Δ| = 0, the last is above 1)."""
    d = det.comparison.drift
    if d is None or det.comparison.values is not TieState.DIFFERENT:
        return None
    tokens = token_strings(det.ckpt.path, [r for r, _ in d.top_rows])
    lows: list[float | None] = [None, 0.0, *DRIFT_EDGES]
    highs: list[float | None] = [0.0, *DRIFT_EDGES, None]
    return {
        "rows": d.rows,
        "differing_rows": d.differing_rows,
        "max_abs_diff": d.max_abs_diff,
        "mean_abs_diff": d.mean_abs_diff,
        "mean_over": "all elements",
        "elements": d.elements,
        "top_rows": [{"row": r, "token": tokens.get(r), "max_abs_diff": v} for r, v in d.top_rows],
        "histogram": [
            {"above": lo, "up_to": hi, "rows": n} for lo, hi, n in zip(lows, highs, d.histogram, strict=True)
        ],
    }


def _vocab(det: Detection) -> dict[str, Any]:
    """The vocabulary sizes (config, rows, tokenizer) and the special token ids with those beyond the
    rows."""
    return {
        "config_vocab_size": det.config.vocab_size,
        "config_vocab_key": det.config.vocab_key,
        "vocabularies": {v.key: v.size for v in det.config.vocabularies},
        "embedding_rows": det.vocab_rows,
        "hidden_size": det.hidden,
        "tokenizer_size": det.tokenizer.size,
        "tokenizer_files": list(det.tokenizer.sources),
        "tokenizer": _tokenizer(det),
        "slack_rows": (
            det.vocab_rows - det.tokenizer.size
            if det.tokenizer.size is not None and det.tokenizer.size < det.vocab_rows
            else 0
            if det.tokenizer.size is not None
            else None
        ),
        "special_token_ids": [
            {"file": i.file, "key": i.key, "id": i.id, "beyond_rows": i.id >= det.vocab_rows}
            for i in det.special_ids
        ],
    }


def _tokenizer(det: Detection) -> dict[str, Any]:
    """The tokenizer file set (:func:`surgery.io.tokenizer.tokenizer_set`): each file with its format and
    length (and why it was not parsed), ``len(tokenizer)``, the base vocabulary, the added tokens, and
    whether the files agree (each disagreement one line)."""
    ts = det.tokenizer.files
    return {
        "files": [
            {"name": f.name, "format": f.format.value, "length": f.length, "note": f.note} for f in ts.files
        ],
        "length": ts.length,
        "base": ts.base,
        "added": [{"content": a.content, "id": a.id, "special": a.special} for a in ts.added],
        "agree": not ts.disagreements and not ts.gaps,
        "disagreements": list(ts.disagreements),
        "gaps": list(ts.gaps),
        "needs_extra": list(ts.needs_extra),
        "unsupported": list(ts.unsupported),
    }


def untrained_finding(
    det: Detection, scan: chunked.RowScan | None = None
) -> tuple[dict | None, Finding | None]:
    """Rows of the embedding that look untrained (:func:`surgery.inspect.chunked.untrained_rows`: all-zero,
    identical to an earlier row, L2 norm far below the rest), with how many lie beyond the tokenizer and the
    tokens of the first all-zero rows the tokenizer has (the finding's ``zero_tokens``); an all-zero row at
    config.json's ``pad_token_id`` is the pad row (``padding_idx``: zero by design), named as such and not
    counted; the finding is None when there are none and no pad row. Taken from ``scan`` when the head
    comparison read every row into
    it, else the embedding is read here in chunks; (None, None) without a stored 2-D embedding."""
    name = det.embedding.name
    if not det.embedding.present or len(det.ckpt.tensors[name].shape) != 2:
        return None, None
    pad = det.ckpt.config.get("pad_token_id")
    pad = pad if type(pad) is int else None
    u = chunked.untrained_rows(det.ckpt, name, det.tokenizer.size, scan, pad=pad)
    if not (u["zero"]["count"] or u["duplicate"]["count"] or u["low_norm"]["count"] or "pad_row" in u):
        return u, None
    size = det.tokenizer.size or 0
    named = token_strings(det.ckpt.path, [i for i in u["zero"]["first"] if i < size]) if size else {}
    tokens = [{"id": i, "content": c} for i, c in sorted(named.items())]
    return u, Finding(FindingKind.UNTRAINED_ROWS, (name,), {**u, "zero_tokens": tokens})


def summarize(det: Detection) -> dict[str, Any]:
    """Everything ``tietool inspect`` reports, as numbers and names (the schema: docs/reference/commands.md
    and docs/reference/tokenizer-files.md)."""
    ckpt: Checkpoint = det.ckpt
    emb, head, bias = _embedding(det), _head(det), _bias(det)
    return {
        "path": str(ckpt.path),
        "format": ckpt.format,
        "sharded": len(ckpt.weight_files) > 1,
        "files": list(ckpt.weight_files),
        "index": ckpt.index_name,
        "other_files": list(ckpt.other_files),
        "folder_links": [fl.as_dict() for fl in ckpt.folder_links],
        "left_out": [x.as_dict() for x in ckpt.left_out],
        "training_state": list(ckpt.training_state),
        "library": det.loader.name.split("-")[0] if det.loader.name != "hf" else "unknown",
        "model_type": det.config.model_type,
        "architecture": {
            "family": det.family.name,
            "in_table": det.family.known,
            "found_by_shape": det.embedding.by_shape,
        },
        "num_tensors": len(ckpt.tensors),
        "total_parameters": ckpt.total_parameters,
        "total_bytes": ckpt.total_bytes,
        "embedding": emb,
        "head": head,
        "head_bias": bias,
        "vocabulary_tensors": _surface(det),
        "tie": _tie(det),
        "vocab": _vocab(det),
        "savings": savings_if_tied(det),
        "loader": loader_facts(det),
        "problems": [describe(f) for f in det.problems],
        "notes": [describe(f) for f in det.notes],
        "findings": [f.as_dict() for f in det.findings],
        "warnings": list(ckpt.warnings),
    }


def inspect_path(
    path,
    layout: str | None = None,
    loader: str | None = None,
    embedding_name: str | None = None,
    head_name: str | None = None,
    compare_values: bool = True,
) -> dict:
    """Open, detect and summarise the checkpoint at ``path``. Raises what :meth:`Checkpoint.open` and
    :func:`detect` raise.

    Reads the headers (safetensors) or the pickle structure (``.pdparams``) of every weight file and, unless
    ``compare_values`` is False, the embedding and head data (to tell tied by value); never another
    tensor's data. With ``compare_values=False`` the values are reported as ``"unknown"``.
    """
    ckpt = Checkpoint.open(path)
    check_names(ckpt, embedding_name, head_name)
    # bound to the embedding by compare, which fills it from the rows it reads (headers only: no compare)
    scan = chunked.RowScan() if compare_values else None
    token = chunked.ROW_SCAN.set(scan)
    try:
        det = detect(
            ckpt,
            layout=layout,
            loader=loader,
            embedding_name=embedding_name,
            head_name=head_name,
            compare_values=compare_values,
        )
    finally:
        chunked.ROW_SCAN.reset(token)
    check_found(det)
    untrained, finding = untrained_finding(det, scan) if compare_values else (None, None)
    if finding is not None:
        det.findings.append(finding)
    paddle = paddle_layout_evidence(ckpt)
    if paddle is not None:
        facts = {"evidence": paddle, "load": LEGACY_LOAD.replace("path", json.dumps(str(ckpt.path)), 1)}
        det.findings.append(Finding(FindingKind.PADDLE_LAYOUT, (), facts))
    info = summarize(det)
    info["untrained_rows"] = untrained
    return info


def check_names(ckpt: Checkpoint, embedding_name: str | None, head_name: str | None) -> None:
    """Refuse an ``--embedding`` / ``--head`` that cannot be a vocabulary table (before detection)."""
    logical = {n: ckpt.logical_dtype(t) for n, t in ckpt.tensors.items()}
    surface.check_named(ckpt.path, ckpt.tensors, logical, embedding=embedding_name, head=head_name)


def check_index(ckpt: Checkpoint) -> None:
    """:meth:`Checkpoint.check_index_complete` for a command that has no detection of its own (convert):
    the head and tie state are detected from headers; a checkpoint whose head cannot be found keeps no
    missing entry.

    Raises:
        CheckpointError: an index entry no shard holds, other than a tied checkpoint's stale head entry.
    """
    if not ckpt.missing_entries:
        return
    try:
        det = detect(ckpt, compare_values=False)
    except TietoolError:
        ckpt.check_index_complete(None)
        return
    ckpt.check_index_complete(det.head.name if det.tie.tied and not det.head.present else None)


def check_found(det: Detection) -> None:
    """Refuse an incomplete checkpoint (an index entry no shard holds, other than a tied checkpoint's stale
    head entry: :meth:`Checkpoint.check_index_complete`), and a found embedding/head stored as integers (a
    quantized table) or in a dtype tietool only copies as bytes (float8, float4, float6, complex: named
    with its label)."""
    ckpt = det.ckpt
    found = {
        "embedding": det.embedding.name if det.embedding.present else None,
        "head": det.head.name if det.head.present else None,
    }
    ckpt.check_index_complete(det.head.name if det.tie.tied and not det.head.present else None)
    for role, name in found.items():
        if name is not None and not ckpt.tensors[name].st_dtype.decodable:
            raise dtype_refusal(
                ckpt.tensors[name],
                ckpt.path,
                f"compare or resize it as the {role}",
                "tie/untie/resize the checkpoint before quantization (a float embedding and head), then "
                "quantize the output again",
            )
    surface.check_found(
        ckpt.path, {n: ckpt.logical_dtype(ckpt.tensors[n]) for n in filter(None, found.values())}, found
    )
