"""``verify``'s classification of the tensors of two whole checkpoints: identical, dropped, added, resized or
changed, each difference explained by tie / untie / resize / add-tokens or named as unexplained."""

from __future__ import annotations

from .. import arch
from ..inspect import chunked
from ..inspect.detect import detect, tied_scale
from ..inspect.detection import Detection
from ..io.checkpoint import REPORT_NAME, Checkpoint
from ..io.regular import load_json
from ..io.vocabkeys import vocab_keys
from ..model.errors import CheckpointError, Opt, RefusedError, UsageError
from ..model.tensor import TensorInfo
from ..plan.plan import written_dtype
from ..report import chain_since, rows_floor
from .result import VerifyResult


def left_at_old_size(res: VerifyResult, da: Detection, db: Detection) -> None:
    """When the embedding's rows moved by ``d`` (``V`` → ``V + d``), every vocabulary tensor of the input
    kept in the output must have moved by ``d`` entries along its vocabulary axis, and every vocabulary-size
    config key that counted the rows (or the head's rows) must have moved by ``d``; name each that did not."""
    d = db.vocab_rows - da.vocab_rows
    if d == 0 or not da.embedding.present or not db.embedding.present:
        return
    B = db.ckpt
    for vt in (v for group in da.surface.values() for v in group):
        if not vt.present or vt.vocab_axis is None or vt.entries is None or vt.name not in B.tensors:
            continue
        if vt.vocabulary is not None:  # indexed by another vocabulary: must be unchanged (kept())
            continue
        before, shape = da.ckpt.tensors[vt.name].shape, B.tensors[vt.name].shape
        now = shape[vt.vocab_axis] if len(shape) > max(vt.vocab_axis, 0) else None
        # a square table (vocab == hidden) may have moved along either axis: the layout decides which
        moved = len(shape) == len(before) and any(
            b == vt.entries and a == vt.entries + d for a, b in zip(shape, before, strict=True)
        )
        if not moved:
            where = "left at the old size" if now == vt.entries else f"has {now} entries"
            res.unexplained.append(
                f"{vt.name} ({vt.role.value}) {where}: {vt.entries} → expected {vt.entries + d}, as the "
                f"embedding went {da.vocab_rows} → {db.vocab_rows} rows"
            )
    counted = {da.vocab_rows, da.head.rows if da.head.vocab is None else da.vocab_rows}
    after = {(k.file, k.key): k.value for k in vocab_keys(B.path, B.config)}
    for k in vocab_keys(da.ckpt.path, da.ckpt.config):
        if k.value in counted and after.get((k.file, k.key), k.value + d) != k.value + d:
            now_v = after.get((k.file, k.key))
            where = "left at the old size" if now_v == k.value else f"is {now_v}"
            res.unexplained.append(
                f"{k.file}: {k.key} {where}: {k.value} → expected {k.value + d}, as the embedding went "
                f"{da.vocab_rows} → {db.vocab_rows} rows"
            )


class TensorComparison:
    """Classifies the tensors of ``A`` (before) and ``B`` (after) into ``res``, one name at a time, and
    records each difference tie / untie / resize does not explain in ``res.unexplained``."""

    def __init__(self, A: Checkpoint, B: Checkpoint, added_ids: frozenset[int] = frozenset()):
        self.A, self.B = A, B
        self.da, self.db = detect_pair(A, B)
        self.res = VerifyResult()
        da = self.da
        self.emb_b = self.db.embedding.name
        self.vocab_names_a = {
            da.embedding.name,
            *([da.head.name] if da.head.vocab is None else []),
            *da.embedding.aliases,
            *da.embedding.vocab_aliases,
            *da.head.aliases,
            *([da.bias.name] if da.bias and da.head.vocab is None else []),
            *(da.bias.aliases if da.bias else []),
            *da.beyond.extra_tables,
            *(n for n, r in da.beyond.token_tables.items() if r.indexed_by == "vocab"),
        }
        self.head_names = {da.head.name, self.db.head.name, *da.head.aliases}
        # ids of tokens new in the output that its report lists as added: their rows may hold new values
        self.added_ids = added_ids
        self.fixed_ids: frozenset[int] = frozenset()  # rows set to the trained mean (surgery.verify.vocab)
        # the operations of the output's report chain since the input (a tie run discards a head's values)
        runs = chain_since(B.path, A.path)
        self.ops = {e.get("operation") for e in runs}
        # a trim then a grow of the chain: the entries from the fewest rows on are new in the output
        self.floor = rows_floor(runs, self.da.vocab_rows, self.db.vocab_rows)

    def dropped(self, name: str, ta: TensorInfo) -> None:
        """``name`` is in ``A`` only: explained when it is a vocabulary tensor equal to the output's embedding
        (tie), or, when the output is tied, to the input's own embedding (a resize that dropped the redundant
        head of a tied checkpoint: the loader rebuilds it from the resized embedding)."""
        A, B, emb_b, da = self.A, self.B, self.emb_b, self.da
        scale = _t5_scale(self.db)
        ok = (
            emb_b in B.tensors
            and name in self.vocab_names_a
            and (
                _equal_to_embedding(A, name, B, emb_b, scale=scale, skip=self.added_ids | self.fixed_ids)
                or (
                    self.db.tie.tied
                    and da.embedding.present
                    and name != da.embedding.name
                    and _equal_to_embedding(A, name, A, da.embedding.name, scale=scale)
                )
            )
        )
        moved = not ok and self._head_into_embedding(name)
        discarded = not (ok or moved) and self._discarded_head(name)
        self.res.dropped.append(
            {
                "name": name,
                "shape": list(ta.shape),
                "equals_embedding": ok,
                "discarded_by_tie": discarded,
                **({"why": moved} if moved else {}),
            }
        )
        if discarded:
            self.res.notes.append(
                f"{name} was dropped with its own values: the report's tie run kept the embedding's "
                f"({Opt('keep', 'embedding')} discards the head's)"
            )
        elif not (ok or moved):
            self.res.unexplained.append(f"{name} was dropped but does not equal the embedding {emb_b}")

    def _head_into_embedding(self, name: str) -> str | None:
        """Why the input's head ``name``, dropped by a ``tie`` of the chain, is explained by the output's
        embedding holding its values (``tie --keep head`` after a resize or add-tokens: the entries both
        have are the head's, bit for bit, but for the rows a report set; the entries beyond are new rows),
        or None."""
        da, B = self.da, self.B
        if (
            "tie" not in self.ops
            or name not in {da.head.name, *da.head.aliases}
            or name == da.embedding.name
            or self.emb_b not in B.tensors
        ):
            return None
        beyond = frozenset(range(self.floor, da.vocab_rows)) if self.floor is not None else frozenset()
        if not chunked.common_entries_equal(
            self.A, name, B, self.emb_b, self.added_ids | self.fixed_ids | beyond
        ):
            return None
        return f"its values went into the embedding {self.emb_b}: tie {Opt('keep', 'head')}"

    def _discarded_head(self, name: str) -> bool:
        """``name`` is the input's head (or an alias of it), dropped by a ``tie`` run of the output's report
        chain into a tied output that still holds the embedding: ``tie --keep embedding`` discards the
        head's values (tie without ``--keep`` refuses differing values; ``--keep head`` makes the embedding
        equal to the head, explained as such). The embedding itself is compared as any other tensor."""
        da, db = self.da, self.db
        return (
            "tie" in self.ops
            and name in {da.head.name, *da.head.aliases}
            and name != da.embedding.name
            and db.tie.tied
            and self.emb_b in self.B.tensors
        )

    def added(self, name: str, tb: TensorInfo) -> None:
        """``name`` is in ``B`` only: explained when it is the head, equal to the embedding."""
        A, B, da, emb_b = self.A, self.B, self.da, self.emb_b
        ok = (
            emb_b in B.tensors
            and name in self.head_names | {self.db.head.name}
            and _equal_to_embedding(B, name, B, emb_b, scale=_t5_scale(self.db))
        )
        # an embedding restored from the head that stored the table alone (untie, tie --keep head)
        restored = (
            not da.embedding.present
            and name == emb_b
            and da.head.name in A.tensors
            and _equal_to_embedding(B, name, A, da.head.name)
        )
        moved = not (ok or restored) and self._untied_then_moved(name)
        self.res.added.append(
            {
                "name": name,
                "shape": list(tb.shape),
                "equals_embedding": ok,
                "restored_from_head": restored,
                **({"why": moved} if moved else {}),
            }
        )
        if not (ok or restored or moved):
            self.res.unexplained.append(
                f"{name} was added but is not the head equal to the embedding {emb_b}"
            )

    def _untied_then_moved(self, name: str) -> str | None:
        """Why an added head that is not the output's embedding is still explained, or None: an ``untie``
        of the chain wrote it from the input's embedding (times ``d_model ** -0.5`` for T5, as untie
        scales a tied T5 head), and a later resize or add-tokens moved the vocabulary, so the entries it
        has in common with the input's embedding are that embedding's, bit for bit, but for the rows a
        report set; the entries beyond are the new rows of the resize (as the embedding's are)."""
        da = self.da
        if "untie" not in self.ops or name not in self.head_names or not da.embedding.present:
            return None
        emb = da.embedding.name
        if emb not in self.A.tensors or da.head.name in self.A.tensors:
            return None
        scale = _t5_scale(da) if not da.head.present else None
        beyond = frozenset(range(self.floor, da.vocab_rows)) if self.floor is not None else frozenset()
        skip = self.added_ids | self.fixed_ids | beyond
        if not chunked.common_entries_equal(self.B, name, self.A, emb, skip, scale=scale):
            return None
        times = f" × {scale:.6g}" if scale is not None else ""
        return (
            f"the input's embedding {emb}{times} in the common entries (untie), then resized with the "
            "vocabulary"
        )

    def kept(self, name: str, ta: TensorInfo, tb: TensorInfo) -> None:
        """``name`` is in both: identical (a ``U16`` → ``BF16`` label change with the same bytes is noted as
        a change), resized, or changed."""
        same_label = ta.dtype == tb.dtype or {ta.dtype, tb.dtype} == {"U16", "BF16"}
        if ta.shape == tb.shape and same_label and chunked.same_bytes(self.A, self.B, name):
            self.res.identical += 1
            if ta.dtype != tb.dtype:
                self.res.changed.append(
                    {"name": name, "why": f"dtype label {ta.dtype} → {tb.dtype}, same bytes"}
                )
        elif ta.shape != tb.shape:
            self._resized(name, ta, tb)
        else:
            self._changed(name, ta)

    def _resized(self, name: str, ta: TensorInfo, tb: TensorInfo) -> None:
        """Explained when ``name`` carries the vocabulary and the common part is bit-identical (but for the
        rows of tokens the report says were added: slack rows taken by add-tokens)."""
        vocab = name in self.vocab_names_a
        skip = self.added_ids | self.fixed_ids if vocab else frozenset()
        ok, why = _common_part_equal(self.A, self.B, name, skip, self.floor if vocab else None)
        entry = {
            "name": name,
            "shape_before": list(ta.shape),
            "shape_after": list(tb.shape),
            "common_part_identical": ok,
        }
        self.res.resized.append(entry)
        took = None if ok or name not in self.vocab_names_a else self._resized_took(name, skip)
        if took is not None:
            entry["why"] = took
        elif name not in self.vocab_names_a:
            self.res.unexplained.append(
                f"{name} changed shape {list(ta.shape)} → {list(tb.shape)} but carries no vocabulary"
            )
        elif not ok:
            self.res.unexplained.append(f"{name} was resized but its common {why} differ")

    def _resized_took(self, name: str, skip: frozenset[int]) -> str | None:
        """Why a resized vocabulary tensor whose common part differs from its own old values is still
        explained, or None: the head holding the output's embedding (``tie --keep embedding`` on a loader
        that keeps both tensors, ``untie``), or the embedding (or an alias of it) holding the input head's
        values in the entries both have (``tie --keep head`` after a resize: the embedding becomes the
        resized head; the entries beyond the common part are new rows, as any resize's)."""
        A, B, da = self.A, self.B, self.da
        if (
            name in self.head_names
            and self.emb_b in B.tensors
            and _equal_to_embedding(B, name, B, self.emb_b)
        ):
            return "head set equal to the embedding"
        head = da.head.name
        if (
            name in {da.embedding.name, *da.embedding.aliases}
            and head != name
            and head in A.tensors
            and chunked.common_entries_equal(A, head, B, name, skip)
        ):
            what = "embedding" if name == da.embedding.name else f"alias of the embedding {da.embedding.name}"
            return f"{what} takes the head's values in the common entries (tie {Opt('keep', 'head')})"
        return None

    def _set_rows_why(self, ndim: int, axis: int) -> str:
        """Why the rows (columns, entries) of the added tokens and of the rows a report set differ."""
        what = "entries" if ndim == 1 else "columns" if axis == 1 else "rows"
        parts = []
        if self.added_ids:
            parts.append(f"{what} of the added tokens (ids {_id_span(self.added_ids)}) set by add-tokens")
        if self.fixed_ids:
            parts.append(f"{what} {_id_span(self.fixed_ids)} set as its report says (checked bit for bit)")
        if self.floor is not None:
            parts.append(
                f"{what} from {self.floor} on made anew: the chain trimmed to {self.floor}, then grew"
            )
        return "; ".join(parts)

    def _changed(self, name: str, ta: TensorInfo) -> None:
        """Same shape, other values: explained when the head now equals the embedding, the embedding took
        the head's values (``tie --keep head``), or a vocabulary tensor differs only in the rows of tokens
        the report says were added (slack rows taken by ``add-tokens``)."""
        A, B, da = self.A, self.B, self.da
        diff = chunked.max_abs_diff(A, B, name)
        entry = {"name": name, "shape": list(ta.shape), "max_abs_diff": diff}
        self.res.changed.append(entry)
        axis = _vocab_axis(ta.shape, self.da.vocab_rows)
        set_ids = self.added_ids | self.fixed_ids
        if (
            (set_ids or self.floor is not None)
            and name in self.vocab_names_a
            and axis is not None
            and chunked.common_part_equal(A, B, name, axis, set_ids, self.floor)
        ):
            entry["why"] = self._set_rows_why(len(ta.shape), axis)
        elif (
            name in self.head_names
            and self.emb_b in B.tensors
            and _equal_to_embedding(B, name, B, self.emb_b)
        ):
            entry["why"] = "head set equal to the embedding"
        elif (
            name in {da.embedding.name, *da.embedding.aliases}
            and da.head.name in A.tensors
            and _equal_to_embedding(A, da.head.name, B, name, skip=set_ids)
        ):  # the embedding's aliases (BART's encoder/decoder embed_tokens) take them with it
            what = "embedding" if name == da.embedding.name else f"alias of the embedding {da.embedding.name}"
            entry["why"] = f"{what} takes the head's values (tie {Opt('keep', 'head')})"
        else:
            rows = ""
            if axis == 0 and name in self.vocab_names_a and len(ta.shape) == 2:
                ids = chunked.rows_differing(A, B, name, self.added_ids)
                rows = f" in rows {', '.join(map(str, ids))}" if ids else ""
                rows += " (rows of no token the report added or reset)" if ids and self.added_ids else ""
            self.res.unexplained.append(
                f"{name} changed{rows} (max |difference| {diff:.3g}) and tie/untie/resize do not change it"
            )


def detect_pair(A: Checkpoint, B: Checkpoint) -> tuple[Detection, Detection]:
    """Both folders' vocabulary surfaces; where the automatic detection of ``A`` finds another embedding or
    head than the output's ``tietool-report.json`` names (a write given ``--embedding`` / ``--head``), or
    where a bias beside the named head (:func:`arch.head_bias_names`) is not the found one, both are
    detected with the report's names (present in both folders), so that what the write took as the
    head's (its bias beside it) is read the same way. A name that cannot be one keeps the automatic
    detection."""
    da, db = detect(A, compare_values=False), detect(B, compare_values=False)
    try:
        rep = load_json(B.path / REPORT_NAME, REPORT_NAME) if (B.path / REPORT_NAME).is_file() else None
    except (CheckpointError, OSError):
        return da, db
    if not isinstance(rep, dict):
        return da, db
    names, differs = {}, False
    for role, found in (("embedding", da.embedding.name), ("head", da.head.name)):
        n = rep.get(role)
        if isinstance(n, str) and n in A.tensors and n in B.tensors:
            names[f"{role}_name"] = n
            own_bias = role == "head" and any(
                b in A.tensors and b not in da.bias_names for b in arch.head_bias_names(n)
            )
            differs = differs or n != found or own_bias
    if not differs:
        return da, db
    try:
        emb, head = names.get("embedding_name"), names.get("head_name")
        return (
            detect(A, compare_values=False, embedding_name=emb, head_name=head),
            detect(B, compare_values=False, embedding_name=emb, head_name=head),
        )
    except (CheckpointError, UsageError, RefusedError):
        return da, db


def written_labels(A: Checkpoint, da: Detection, B: Checkpoint) -> dict[str, str]:
    """``{name: dtype label}`` the output's run writes for each tensor of the input, by the planners' rule
    (:func:`surgery.plan.plan.written_dtype`: bfloat16 bits labelled ``U16`` become ``BF16`` unless the
    loader reads them only as ``U16``), on the loader the output's report names (else the detected one)."""
    loader = da.loader.name
    try:
        rep = load_json(B.path / REPORT_NAME, REPORT_NAME) if (B.path / REPORT_NAME).is_file() else None
    except (CheckpointError, OSError):
        rep = None
    named = rep.get("loader") if isinstance(rep, dict) else None
    if isinstance(named, dict) and isinstance(named.get("name"), str):
        loader = named["name"]
    return {n: written_dtype(A, t, loader) for n, t in A.tensors.items()}


def _t5_scale(det) -> float | None:
    return tied_scale(det.ckpt.config, det.hidden, det.ckpt.path) if det.family.scales_tied_logits else None


def _equal_to_embedding(
    X: Checkpoint,
    name: str,
    E: Checkpoint,
    emb: str,
    scale: float | None = None,
    skip: frozenset[int] = frozenset(),
) -> bool:
    """``X[name]`` holds the embedding ``E[emb]``: the same bits as stored or transposed (a ``[hidden,
    vocab]`` head), or, with ``scale``, its values times ``scale`` (T5's tied head materialised). The token
    ids in ``skip`` (rows a report of the chain set: added tokens, fixed rows) are not compared. Read in
    bounded chunks (:mod:`surgery.inspect.chunked`)."""
    if chunked.same_bytes(X, E, name, emb, skip) or chunked.transposed_equal(X, name, E, emb, skip=skip):
        return True
    if scale is None:
        return False
    return chunked.scaled_equal(X, name, E, emb, scale) or chunked.transposed_equal(X, name, E, emb, scale)


def _vocab_axis(shape, rows: int) -> int | None:
    """The axis of a same-shape vocabulary tensor that counts the ``rows`` tokens (0 first; a 1-D bias:
    0; a ``[1, V]`` bias: 1); None when no axis has that size."""
    axes = [a for a, n in enumerate(shape[:2]) if n == rows and not (len(shape) == 2 and n == 1)]
    return axes[0] if axes else None


def _id_span(ids: frozenset[int]) -> str:
    lo, hi = min(ids), max(ids)
    return f"{lo}..{hi}" if hi - lo + 1 == len(ids) else ", ".join(map(str, sorted(ids)))


def _common_part_equal(
    A: Checkpoint, B: Checkpoint, name: str, skip: frozenset[int] = frozenset(), upto: int | None = None
) -> tuple[bool, str]:
    """The part ``name`` has in both checkpoints along its vocabulary axis is bit-identical.

    The axis is the one whose size changed (resize moves exactly one axis of a vocabulary tensor), so a
    square head whose layout detection cannot tell is compared the way it was resized; a 1-D bias (or
    ``[1, V]``) compares entries. Returns ``(equal, what was compared)`` (``rows``, ``columns``,
    ``entries``); a tensor whose shape changed on more than one axis, or whose number of axes changed, is not
    a resize: ``(False, ...)``. Entries from ``upto`` on (a trim then a grow of the chain) are new rows.
    """
    xs, ys = tuple(A.tensors[name].shape), tuple(B.tensors[name].shape)
    if len(xs) != len(ys):
        return False, "shapes (the number of axes changed)"
    if len(xs) == 1 or (len(xs) == 2 and xs[0] == 1 and ys[0] == 1):
        return chunked.common_part_equal(A, B, name, len(xs) - 1, skip, upto), "entries"
    moved = [a for a in range(len(xs)) if xs[a] != ys[a]]
    if len(moved) != 1 or moved[0] > 1:
        return False, "shapes (more than one axis changed)"
    return chunked.common_part_equal(A, B, name, moved[0], skip, upto), "columns" if moved[0] == 1 else "rows"
