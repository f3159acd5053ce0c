"""``diff``: what differs between any two checkpoints, and by how much. An inspection: nothing is written.

Each side is a checkpoint folder or URL (safetensors or ``.pdparams``, one file or shards), or rank files /
a flex checkpoint read as the checkpoint ``merge`` writes of them (:mod:`surgery.diff.sides`). Compared:

* tensors (:mod:`surgery.diff.tensors`): only in B (``added``), only in A (``removed``), only in one side
  each under another name with the same shape, dtype and bytes (``renamed``), in both and not bit-identical
  (``changed``: dtype and shape before and after, max |Δ|, ‖Δ‖/‖A‖, and for the vocabulary tensors that
  :func:`surgery.inspect.detect.detect` finds, the token ids whose rows differ); the rest are counted
  (``identical``). Headers only with ``values=False``: a tensor is then ``changed`` when its dtype or shape
  is, and equal headers are counted as ``same_header``.
* config keys, safetensors ``__metadata__`` entries, tokenizer tokens (added, removed, renumbered), and the
  other files by content (:mod:`surgery.diff.files`); ``tietool-report.json``, a record of how a write was
  made and no part of the checkpoint, is not compared (a note says when only one side has it).

Memory: two chunks of ~4 MiB per tensor pair (one whole tensor of a merged view); each tensor is read once,
plus, for a tensor that differs, a second read of ``A``'s identical chunks before its first difference
(for ‖A‖). Tensors stored in the
same local file at the same place (a hard link) are equal unread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..inspect.detect import detect
from ..inspect.detection import Detection
from ..model.errors import ExitCode, TietoolError
from . import files as files_mod
from .sides import Side, has_report, open_side, same_file
from .tensors import compare, header, renames

SCHEMA = "tietool.diff/1"


@dataclass
class DiffResult:
    """Outcome of :func:`diff`; :meth:`as_dict` is ``tietool diff --json`` (schema :data:`SCHEMA`, README
    "diff")."""

    a: str
    b: str
    values: bool
    kinds: tuple[str, str]
    identical_tensors: int = 0
    added: list[dict] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)
    renamed: list[dict] = field(default_factory=list)
    changed: list[dict] = field(default_factory=list)
    config: dict[str, list[dict]] = field(default_factory=dict)
    metadata: dict[str, list[dict]] = field(default_factory=dict)
    tokens: dict[str, list[dict]] = field(default_factory=dict)
    files: dict[str, list[dict]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Nothing compared differs (with ``values=False``: the tensors' headers)."""
        sections = (self.config, self.metadata, self.tokens, self.files)
        return not (self.added or self.removed or self.renamed or self.changed) and not any(
            v for s in sections for v in s.values()
        )

    @property
    def exit_code(self) -> ExitCode:
        """``OK`` (0) when identical, ``DIFFERENT`` (1) otherwise, as ``diff`` and ``cmp`` exit."""
        return ExitCode.OK if self.identical else ExitCode.DIFFERENT

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "a": self.a,
            "b": self.b,
            "read_as": {"a": self.kinds[0], "b": self.kinds[1]},
            "values_compared": self.values,
            "identical": self.identical,
            "exit_code": int(self.exit_code),
            "tensors": {
                "identical" if self.values else "same_header": self.identical_tensors,
                "added": self.added,
                "removed": self.removed,
                "renamed": self.renamed,
                "changed": self.changed,
            },
            "config": self.config,
            "metadata": self.metadata,
            "tokenizer": self.tokens,
            "files": self.files,
            "notes": self.notes,
        }


def diff(a_path: Any, b_path: Any, values: bool = True) -> DiffResult:
    """Compare checkpoint ``a`` with ``b``: every tensor, config key, metadata entry, token and file.

    Args:
        a_path, b_path: folders (``Path``) or remote paths (:func:`surgery.io.store.as_path`); rank files
            and flex checkpoints are read as their merge.
        values: read tensor data (False: headers only; renames are then not found).

    Returns:
        the :class:`DiffResult`; ``result.exit_code`` is 0 when identical, 1 when they differ.

    Raises:
        CheckpointError, UnsafePickleError, RefusedError, StorageError: as :func:`sides.open_side` (a side
            that cannot be read, or rank files ``merge`` would refuse).
    """
    A, B = open_side(a_path), open_side(b_path)
    res = DiffResult(str(a_path), str(b_path), values, (A.kind.value, B.kind.value), notes=A.notes + B.notes)
    _tensors(res, A, B)
    res.config = files_mod.keys(A.ckpt.config, B.ckpt.config)
    res.metadata = files_mod.keys(files_mod.metadata(A), files_mod.metadata(B))
    res.tokens = _tokens(res, A, B)
    res.files = files_mod.files(A, B)
    ra, rb = has_report(A), has_report(B)
    if ra != rb:
        res.notes.append(
            f"tietool-report.json is only in {'A' if ra else 'B'} (a write's record: not compared)"
        )
    return res


def _detect(side: Side, res: DiffResult) -> Detection | None:
    """The side's vocabulary surface (headers only), or None with a note when detection refuses it."""
    try:
        return detect(side.ckpt, compare_values=False)
    except TietoolError as e:
        res.notes.append(f"{side.path}: vocabulary tensors not known ({e.one_line()}): rows not listed")
        return None


def _axis(da: Detection | None, db: Detection | None, name: str) -> int | None:
    """The vocabulary axis of ``name`` by ``A``'s detection (``B``'s when ``A``'s has none)."""
    for d in (da, db):
        if d is not None and name in d.ckpt.tensors:
            try:
                ax = d.vocab_axis(name)
            except (KeyError, ValueError):
                ax = None
            if ax is not None:
                return ax
    return None


def _tensors(res: DiffResult, A: Side, B: Side) -> None:
    """Fill the tensor sections of ``res``."""
    ta, tb = A.ckpt.tensors, B.ckpt.tensors
    removed = [n for n in ta if n not in tb]
    added = [n for n in tb if n not in ta]
    if res.values:
        pairs = renames(A.ckpt, B.ckpt, removed, added)
        for a, b in pairs:
            res.renamed.append({"from": a, "to": b, **_kind(A, ta[a])})
        gone, new = {a for a, _ in pairs}, {b for _, b in pairs}
        removed = [n for n in removed if n not in gone]
        added = [n for n in added if n not in new]
    else:
        res.notes.append("headers only: tensor values were not read (renames are not found)")
    res.removed = [header(A.ckpt, ta[n]) for n in removed]
    res.added = [header(B.ckpt, tb[n]) for n in added]
    da, db = (_detect(A, res), _detect(B, res)) if res.values else (None, None)
    for name in ta:
        if name in tb:
            _one(res, A, B, name, _axis(da, db, name))


def _kind(side: Side, t: Any) -> dict[str, Any]:
    return {"dtype": side.ckpt.logical_dtype(t), "shape": list(t.shape)}


def _one(res: DiffResult, A: Side, B: Side, name: str, axis: int | None) -> None:
    """Compare tensor ``name`` of both sides into ``res``."""
    ta, tb = A.ckpt.tensors[name], B.ckpt.tensors[name]
    ha, hb = header(A.ckpt, ta), header(B.ckpt, tb)
    same_header = ha["dtype"] == hb["dtype"] and ha["shape"] == hb["shape"]
    if not res.values or _same_place(A, B, name):
        if same_header:
            res.identical_tensors += 1
        else:
            res.changed.append(_changed(ha, hb))
        return
    m = compare(A.ckpt, B.ckpt, name, axis)
    if m.identical and same_header:
        res.identical_tensors += 1
        return
    entry = _changed(ha, hb)
    entry.update(
        max_abs_diff=m.max_abs_diff,
        relative_norm=m.relative_norm,
        rows_changed=m.rows.as_dict() if m.rows is not None and m.rows.count else None,
        note=m.note,
    )
    res.changed.append(entry)


def _changed(ha: dict, hb: dict) -> dict[str, Any]:
    return {
        "name": ha["name"],
        "dtype_before": ha["dtype"],
        "dtype_after": hb["dtype"],
        "shape_before": ha["shape"],
        "shape_after": hb["shape"],
        "before": {k: ha[k] for k in ("stored_dtype", "file", "offset", "nbytes")},
        "after": {k: hb[k] for k in ("stored_dtype", "file", "offset", "nbytes")},
    }


def _same_place(A: Side, B: Side, name: str) -> bool:
    """Tensor ``name`` is the same bytes of one local file on both sides (same header, file and offset)."""
    ta, tb = A.ckpt.tensors[name], B.ckpt.tensors[name]
    if not (ta.file and tb.file) or (ta.dtype, ta.shape, ta.offset, ta.nbytes) != (
        tb.dtype,
        tb.shape,
        tb.offset,
        tb.nbytes,
    ):
        return False
    if ta.offset < 0 or ta.fortran != tb.fortran:
        return False
    return same_file(A.ckpt.path / ta.file, B.ckpt.path / tb.file)


def _tokens(res: DiffResult, A: Side, B: Side) -> dict[str, list[dict]]:
    """:func:`files.tokens`, or empty sections with a note when a side's tokenizer files cannot be read."""
    try:
        return files_mod.tokens(A, B)
    except TietoolError as e:
        res.notes.append(f"tokenizer files not compared token by token: {e.one_line()}")
        return {"added": [], "removed": [], "renumbered": []}
