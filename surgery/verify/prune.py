"""``verify`` of a ``prune`` output: the output's own report (its only run since the input) names the kept
ids (``prune.id_map``, old → new), and the files must bear out exactly that renumbering.

* every vocabulary tensor of the input (embedding, head in either layout, bias, aliases, copies, token
  tables): entry ``new`` of the output's is entry ``old`` of the input's, bit for bit, and it holds no
  other entry (:func:`compare_tensors`);
* every other tensor: bit-identical; every dtype label the one the edit writes (bfloat16 bits labelled
  ``U16`` become ``BF16`` where the loader reads ``BF16``: :func:`~surgery.verify.tensors.written_labels`);
* config files: each vocabulary-size key the value the planner sets
  (:func:`surgery.plan.resize.vocab_size_sets`: the kept count, a stale ``vocab_size`` and its copies
  included), each token id a config names (``*_id``, ``*_ids``) is its new id, every other key unchanged
  (:func:`compare_configs`);
* tokenizer files, read by :func:`surgery.io.tokenizer.vocabulary_maps`: every kept token at its new id,
  no id beyond the kept ones, no dropped token left (:func:`compare_tokenizer`); ``merges.txt`` the
  input's merges of kept tokens;
* every other file byte-identical, safetensors ``__metadata__`` the input's.

A report whose ``id_map`` is not an order-keeping map of input ids onto ``0..rows_after-1`` is
unverifiable; a row the map contradicts is named.
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
from ..io.tokenizer import tokenizer_set, vocabulary, vocabulary_maps
from ..io.vocabkeys import walk
from ..model.enums import TensorRole
from ..model.errors import CheckpointError
from ..plan.resize import vocab_size_sets
from ..report import chain_since
from .files import compare_metadata, compare_other_files
from .result import VerifyResult
from .tensors import detect_pair, written_labels
from .tokens import tokenizer_names

_CONFIG_FILES = ("config.json", "model_config.json", "generation_config.json")


def section(a_path: Any, b_path: Any) -> dict[str, Any] | None:
    """The ``prune`` section of the output's own report when its run is a ``prune`` and the only run that
    made the output from the input (:func:`surgery.report.chain_since`); None otherwise."""
    b = Path(str(b_path))
    runs = chain_since(b, Path(str(a_path)))
    if len(runs) != 1 or runs[0].get("operation") != "prune":
        return None
    try:
        rep = load_json(b / REPORT_NAME, REPORT_NAME)
    except (CheckpointError, OSError):
        return None
    sec = rep.get("prune") if isinstance(rep, dict) and rep.get("operation") == "prune" else None
    return sec if isinstance(sec, dict) else {}


def verify_prune(a_path: Any, b_path: Any, sec: dict[str, Any]) -> VerifyResult:
    """Compare input ``a_path`` with the prune output ``b_path`` whose report section is ``sec``.

    Returns:
        the classification; every difference the id map does not explain is in ``res.unexplained``.

    Raises:
        CheckpointError, UnsafePickleError: as :meth:`Checkpoint.open`.
    """
    res = VerifyResult()
    A, B = Checkpoint.open(a_path), Checkpoint.open(b_path)
    da, db = detect_pair(A, B)
    ids = kept_ids(res, sec, da.vocab_rows, db.vocab_rows)
    if ids is None:
        return res
    compare_tensors(res, A, B, (da, db), ids)
    compare_configs(res, A, B, da, ids)
    names = compare_tokenizer(res, A, B, ids)
    compare_metadata(res, A, B)
    compare_other_files(res, A, B, names)
    res.notes.append(
        f"prune: {len(ids)} of {da.vocab_rows} ids kept (the report's id_map), each vocabulary entry checked "
        "against the input's entry at its old id"
    )
    return res


def kept_ids(res: VerifyResult, sec: dict[str, Any], rows_a: int, rows_b: int) -> list[int] | None:
    """The old ids in new-id order from ``sec["id_map"]``: the map must send input ids (``0..rows_a-1``)
    onto ``0..rows_b-1`` keeping their order, and agree with ``rows_before`` / ``rows_after``; otherwise
    the report is named unverifiable (None)."""
    m = sec.get("id_map")
    why = ""
    try:
        pairs = sorted((int(o), n) for o, n in m.items()) if isinstance(m, dict) else []
    except ValueError:
        pairs = []
    if not pairs or any(type(n) is not int for _, n in pairs):
        why = "has no id_map of ids"
    elif [n for _, n in pairs] != list(range(len(pairs))):
        bad = next(p for j, p in enumerate(pairs) if p[1] != j)
        why = f"maps id {bad[0]} to {bad[1]}, which breaks the kept ids' order 0..{len(pairs) - 1}"
    elif not (0 <= pairs[0][0] and pairs[-1][0] < rows_a):
        why = f"names ids outside the input's {rows_a} rows"
    elif len(pairs) != rows_b or sec.get("rows_after") != rows_b or sec.get("rows_before") != rows_a:
        why = (
            f"keeps {len(pairs)} ids (rows {sec.get('rows_before')} → {sec.get('rows_after')}) while the "
            f"embedding went {rows_a} → {rows_b} rows"
        )
    if why:
        res.unexplained.append(f"tietool-report.json's prune {why}; the report is unverifiable")
        return None
    return [o for o, _ in pairs]


def _vocab_axes(da: Detection) -> dict[str, int]:
    """``{name: vocabulary axis}`` of every tensor of the input's surface a prune cuts."""
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
    res: VerifyResult, A: Checkpoint, B: Checkpoint, dets: tuple[Detection, Detection], ids: list[int]
) -> None:
    """Vocabulary tensors: the input's entries ``ids`` (in that order) along the vocabulary axis, bit for
    bit; every other tensor bit-identical; the same names in both and the dtype labels the edit writes
    (:func:`~surgery.verify.tensors.written_labels`), but for a copy of the
    embedding a tied output no longer stores (``dets``: the input's and output's detections)."""
    da, db = dets
    axes = _vocab_axes(da)
    labels = written_labels(A, da, B)
    for name in sorted(set(A.tensors) ^ set(B.tensors)):
        if _tied_copy_dropped(A, B, dets, name, axes):
            res.dropped.append({"name": name, "shape": list(A.tensors[name].shape), "equals_embedding": True})
            continue
        where = "input" if name in A.tensors else "output"
        res.unexplained.append(f"{name} is only in the {where}; prune drops and adds no tensor")
    for name in sorted(set(A.tensors) & set(B.tensors)):
        ta, tb = A.tensors[name], B.tensors[name]
        if tb.dtype != labels[name]:
            res.unexplained.append(
                f"{name}: dtype {ta.dtype} → {tb.dtype}; prune writes {labels[name]} (the label rule of "
                "every edit: bfloat16 bits labelled U16 become BF16 unless the loader reads only U16)"
            )
        elif name not in axes:
            if chunked.same_bytes(A, B, name):
                res.identical += 1
            else:
                res.unexplained.append(f"{name} changed, and carries no vocabulary")
        else:
            _kept_entries(res, A, B, name, axes[name], ids)


def _tied_copy_dropped(
    A: Checkpoint, B: Checkpoint, dets: tuple[Detection, Detection], name: str, axes: dict[str, int]
) -> bool:
    """``name`` is a vocabulary tensor of the input only, equal to the input's embedding (as stored or
    transposed), and the output is tied with its embedding kept: the loader rebuilds it from the pruned
    embedding (checked entry by entry as every vocabulary tensor)."""
    emb = dets[0].embedding.name
    return (
        name in A.tensors
        and name in axes
        and name != emb
        and emb in B.tensors
        and dets[1].tie.tied
        and (chunked.same_bytes(A, A, name, emb) or chunked.transposed_equal(A, name, A, emb))
    )


def _kept_entries(
    res: VerifyResult, A: Checkpoint, B: Checkpoint, name: str, axis: int, ids: list[int]
) -> None:
    """``name`` of ``B`` is ``name`` of ``A`` at entries ``ids`` along ``axis``, bit for bit."""
    a, b = np.asarray(A.load(name)), np.asarray(B.load(name))
    want = np.moveaxis(np.take(a, np.asarray(ids, dtype=np.int64), axis=axis), axis, 0)
    entry = {"name": name, "shape_before": list(a.shape), "shape_after": list(b.shape), "kept_ids": len(ids)}
    entry["common_part_identical"] = False
    res.resized.append(entry)
    expect = list(a.shape)
    expect[axis] = len(ids)
    if list(b.shape) != expect:
        res.unexplained.append(f"{name} has shape {list(b.shape)}; the kept ids make it {expect}")
        return
    got = np.moveaxis(b, axis, 0)
    n = len(ids)
    wb = np.ascontiguousarray(want).view(np.uint8).reshape(n, -1)
    gb = np.ascontiguousarray(got).view(np.uint8).reshape(n, -1)
    bad = np.flatnonzero((wb != gb).any(axis=1))
    entry["common_part_identical"] = not bad.size
    if bad.size:
        j = int(bad[0])
        what = "entry" if axis else "row"
        res.unexplained.append(
            f"{name}: {what} {j} is not the input's {what} {ids[j]} (its old id by the report's id_map)"
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


def compare_configs(res: VerifyResult, A: Checkpoint, B: Checkpoint, da: Detection, ids: list[int]) -> None:
    """Config files: every leaf unchanged, but a vocabulary-size key the planner sets
    (:func:`surgery.plan.resize.vocab_size_sets`: the kept count, a stale ``vocab_size`` too) and a token
    id key of ``config.json`` / ``generation_config.json`` (now the id's new number; a dropped id there is
    unexplained)."""
    new_id = {o: n for n, o in enumerate(ids)}
    sizes = vocab_size_sets(da, len(ids))
    specials = {(s.file, s.key) for s in da.special_ids if s.key.endswith(("_id", "_ids"))}
    for fname in _CONFIG_FILES:
        pa, pb = A.path / fname, B.path / fname
        if not pa.exists() and not pb.exists():
            continue
        ca = dict(walk(_read_cfg(pa))) if pa.exists() else {}
        cb = dict(walk(_read_cfg(pb))) if pb.exists() else {}
        for k in sorted(set(ca) | set(cb)):
            before, want = ca.get(k), ca.get(k)
            if (fname, k) in sizes:
                want = sizes[fname, k]
            elif (fname, _base(k)) in specials and isinstance(before, int) and not isinstance(before, bool):
                if 0 <= before < da.vocab_rows and before not in new_id:
                    res.unexplained.append(f"{fname}: {k} names id {before}, which the prune dropped")
                    continue
                want = new_id.get(before, before)
            after = cb.get(k)
            if k not in cb or (k not in ca and (fname, k) not in sizes) or after != want:
                res.unexplained.append(
                    f"{fname}: {k} is {after!r} (input {before!r}); the prune makes it {want!r}"
                )
            elif after != before:
                res.config.append({"file": fname, "key": k, "before": before, "after": after})


def compare_tokenizer(res: VerifyResult, A: Checkpoint, B: Checkpoint, ids: list[int]) -> set[str]:
    """Every map of the output's tokenizer files (:func:`surgery.io.tokenizer.vocabulary_maps`) gives each
    id the token the input gave its old id, names no id beyond the kept ones, and holds no token only
    dropped ids had; every kept token is named. Returns the tokenizer file names (compared here, not byte
    for byte)."""
    va = vocabulary(A.path)
    want = {n: va[o] for n, o in enumerate(ids) if o in va}
    kept = set(want.values())
    dropped = {s for i, s in va.items() if s not in kept}
    maps, clashes = vocabulary_maps(B.path)
    res.unexplained.extend(f"{c}; the prune gives each id one token" for c in clashes)
    got: dict[int, str] = {}
    for where, m in maps.items():
        for i, s in sorted(m.items()):
            got.setdefault(i, s)
            if s in dropped:
                res.unexplained.append(f"{where}: {s!r} (id {i}) is a token the prune dropped")
            elif want.get(i) != s:
                exp = f"{want[i]!r}" if i in want else f"no token (the output has {len(ids)} ids)"
                res.unexplained.append(f"{where}: id {i} is {s!r}, expected {exp}")
    missing = [i for i in want if i not in got]
    if missing and maps:
        res.unexplained.append(
            f"the output's tokenizer names no token at id(s) {', '.join(map(str, missing[:10]))} "
            f"(expected {want[missing[0]]!r} first)"
        )
    sets = (tokenizer_set(A.path), tokenizer_set(B.path))
    gone = sorted({f.name for f in sets[0].files} - {f.name for f in sets[1].files})
    res.unexplained.extend(f"{n} is only in the input; the prune edits it in place" for n in gone)
    res.tokenizer = {"kept_tokens": len(want), "dropped_tokens": len(dropped)}
    return tokenizer_names(A, B, sets) | _merges_txt(res, A, B, kept)


def _merges_txt(res: VerifyResult, A: Checkpoint, B: Checkpoint, kept: set[str]) -> set[str]:
    """``merges.txt`` (beside ``vocab.json``): the output's lines must be the input's header lines and the
    merges whose two parts and result are kept tokens, in order. Returns ``{"merges.txt"}`` when both have
    one (compared here)."""
    pa, pb = A.path / "merges.txt", B.path / "merges.txt"
    if not (pa.is_file() and pb.is_file()):
        return set()
    lines = pa.read_text(encoding="utf-8").splitlines()
    want = [ln for ln in lines if ln.startswith("#") or (ln and _merge_kept(ln, kept))]
    got = pb.read_text(encoding="utf-8").splitlines()
    if got != want:
        res.unexplained.append(
            f"merges.txt has {len(got)} lines, not the {len(want)} merges (and header) of kept tokens"
        )
    return {"merges.txt"}


def _merge_kept(line: str, kept: set[str]) -> bool:
    a, _, b = line.partition(" ")
    return a in kept and b in kept and a + b in kept
