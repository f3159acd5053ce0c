"""``verify``: compare two checkpoints and say whether their difference is exactly what tie / untie /
resize explains.

Every tensor is classified: identical (same bytes), dropped, added, resized, or changed. A difference is
*explained* when:

* dropped: a head (or embedding alias) whose values equal the output's embedding (tie);
* added: a head equal to the embedding, as stored or transposed, or scaled by ``d_model ** -0.5`` (T5 untie);
* resized: a vocabulary tensor (embedding, alias, head, bias) whose common rows — columns for a
  ``[hidden, vocab]`` head, last-axis entries for a bias — are bit-identical;
* changed: the embedding taking the head's values or the head taking the embedding's (``tie --keep``), or a
  bfloat16 ``U16`` label written as ``BF16`` with the same bytes.

Every other tensor must be bit-identical, and config files may differ only in ``tie_word_embeddings`` and
vocab-size keys (:data:`surgery.arch.VOCAB_SIZE_KEYS`).

When the embedding's row count changed, every tensor of the input's vocabulary surface (heads, biases,
aliases, multi-token-prediction copies, vocabulary-shaped tensors) must have moved by the same number of
entries, and every config key that counted the rows must have moved with them: one left at the old size is
unexplained (a loader would index past it, or reject it). With ``logits=True`` the logits under PaddleFormers
must agree too. The verdict (:attr:`VerifyResult.exit_code`) is decided here, not by the caller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

from . import arch
from .inspect import chunked
from .inspect.detect import detect, tied_scale
from .inspect.detection import Detection
from .io import store, stores
from .io.checkpoint import REPORT_NAME, Checkpoint
from .io.configfile import read_config_file
from .io.regular import load_json
from .io.tokenizer import vocabulary
from .io.vocabkeys import vocab_keys, walk
from .model.errors import CheckpointError, ExitCode, Opt, RefusedError, UsageError
from .model.tensor import TensorInfo
from .model.tokens import TokenizerSet
from .plan.add_tokens import not_resettable
from .report import token_claims

ALLOWED_CONFIG_KEYS = ("tie_word_embeddings", *arch.VOCAB_SIZE_KEYS)


def _flatten(d) -> dict:
    """``{dotted key: value}`` of every leaf of a parsed config (:func:`surgery.io.vocabkeys.walk`)."""
    return dict(walk(d))


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`. ``explained`` is True when every difference is one tietool makes."""

    identical: int = 0
    dropped: list[dict] = field(default_factory=list)
    added: list[dict] = field(default_factory=list)
    resized: list[dict] = field(default_factory=list)
    changed: list[dict] = field(default_factory=list)
    config: list[dict] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    logits: dict | None = None
    tokenizer: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def explained(self) -> bool:
        """Every difference is one tie / untie / resize makes (and the logits agree, when compared)."""
        return not self.unexplained

    @property
    def exit_code(self) -> ExitCode:
        """The verdict as an exit status: ``UNEXPLAINED`` (7) when a difference is unexplained (the logits'
        included), else ``NOT_COMPARED`` (8) when logits were asked for but could not be compared, else
        ``OK``."""
        if not self.explained:
            return ExitCode.UNEXPLAINED
        if self.logits is not None and not self.logits_compared:
            return ExitCode.NOT_COMPARED
        return ExitCode.OK

    @property
    def logits_compared(self) -> bool:
        """Logits were asked for and computed for both checkpoints (or the output did not load while the
        input did: a difference too)."""
        return bool(self.logits) and self.logits.get("ok") is not None  # type: ignore[union-attr]

    def as_dict(self) -> dict:
        return {
            "explained": self.explained,
            "exit_code": int(self.exit_code),
            "identical_tensors": self.identical,
            "dropped": self.dropped,
            "added": self.added,
            "resized": self.resized,
            "changed": self.changed,
            "config_differences": self.config,
            "unexplained": self.unexplained,
            "notes": self.notes,
            "tokenizer": self.tokenizer,
            "logits": self.logits,
            "logits_compared": self.logits_compared if self.logits is not None else None,
        }


def verify(a_path, b_path, logits: bool = False, timeout: float = 600) -> VerifyResult:
    """Compare checkpoint ``a`` (before) with ``b`` (after). Reads every tensor of both, one at a time.

    Args:
        a_path, b_path: checkpoint folders (``str`` or ``os.PathLike``).
        logits: also compare PaddleFormers logits of both on token ids valid in both
            (:func:`logits_check`; a subprocess, needs the ``paddle`` extra). Logits that differ by more
            than 1e-5, or an output that does not load while the input does, are unexplained (exit 7);
            logits that could not be compared make the verdict ``ExitCode.NOT_COMPARED`` (8) when the
            tensors explain everything, and ``res.logits["error"]`` says why and what to do.
        timeout: seconds allowed for each logits subprocess.

    Returns:
        the classification; ``res.exit_code`` is the verdict.

    Raises:
        CheckpointError, UnsafePickleError: as :meth:`Checkpoint.open`.
    """
    res = _verify_tensors_and_files(a_path, b_path)
    if logits:
        res.logits = lg = logits_check(a_path, b_path, timeout=timeout)
        if lg.get("ok") is False and lg.get("output_error"):
            res.unexplained.append(
                f"{b_path} does not load under PaddleFormers {lg.get('model_class')} while {a_path} does "
                f"({lg['output_error']})"
            )
        elif lg.get("ok") is False:
            res.unexplained.append(
                f"logits differ (max |difference| {lg.get('max_abs_diff', float('nan')):.3g} "
                f"> 1e-5 on token ids below {lg.get('token_ids_below')})"
            )
    return res


def _verify_tensors_and_files(a_path, b_path) -> VerifyResult:
    """:func:`verify` without logits."""
    A, B = Checkpoint.open(a_path), Checkpoint.open(b_path)
    cmp = _TensorComparison(A, B)  # detection first: it refuses a tokenizer_config of the wrong types
    tok = _Tokenizers.read(cmp.da, cmp.db)
    cmp.added_ids = tok.new_rows()
    for name, ta in A.tensors.items():
        tb = B.tensors.get(name)
        if tb is None:
            cmp.dropped(name, ta)
        else:
            cmp.kept(name, ta, tb)
    for name, tb in B.tensors.items():
        if name not in A.tensors:
            cmp.added(name, tb)
    _compare_configs(cmp.res, A, B, cmp.da, cmp.db)
    _compare_metadata(cmp.res, A, B)
    _compare_other_files(cmp.res, A, B, _tokenizer_names(A, B, tok.sets))
    _compare_tokenizers(cmp.res, A, B, tok, (cmp.da.vocab_rows, cmp.db.vocab_rows))
    _left_at_old_size(cmp.res, cmp.da, cmp.db)
    return cmp.res


def _left_at_old_size(res: VerifyResult, da: Detection, db: Detection) -> None:
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


class _TensorComparison:
    """Classifies the tensors of ``A`` (before) and ``B`` (after) into ``res``, one name at a time, and
    records each difference tie / untie / resize does not explain in ``res.unexplained``."""

    def __init__(self, A: Checkpoint, B: Checkpoint, added_ids: frozenset[int] = frozenset()):
        self.A, self.B = A, B
        self.da, self.db = _detect_pair(A, B)
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
                _equal_to_embedding(A, name, B, emb_b, scale=scale)
                or (
                    self.db.tie.tied
                    and da.embedding.present
                    and name != da.embedding.name
                    and _equal_to_embedding(A, name, A, da.embedding.name, scale=scale)
                )
            )
        )
        self.res.dropped.append({"name": name, "shape": list(ta.shape), "equals_embedding": ok})
        if not ok:
            self.res.unexplained.append(f"{name} was dropped but does not equal the embedding {emb_b}")

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
        self.res.added.append(
            {"name": name, "shape": list(tb.shape), "equals_embedding": ok, "restored_from_head": restored}
        )
        if not (ok or restored):
            self.res.unexplained.append(
                f"{name} was added but is not the head equal to the embedding {emb_b}"
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
        skip = self.added_ids if name in self.vocab_names_a else frozenset()
        ok, why = _common_part_equal(self.A, self.B, name, skip)
        self.res.resized.append(
            {
                "name": name,
                "shape_before": list(ta.shape),
                "shape_after": list(tb.shape),
                "common_part_identical": ok,
            }
        )
        if name not in self.vocab_names_a:
            self.res.unexplained.append(
                f"{name} changed shape {list(ta.shape)} → {list(tb.shape)} but carries no vocabulary"
            )
        elif not ok:
            self.res.unexplained.append(f"{name} was resized but its common {why} differ")

    def _changed(self, name: str, ta: TensorInfo) -> None:
        """Same shape, other values: explained when the head now equals the embedding, the embedding took
        the head's values (``tie --keep head``), or a vocabulary tensor differs only in the rows of tokens
        the report says were added (slack rows taken by ``add-tokens``)."""
        A, B, da = self.A, self.B, self.da
        diff = chunked.max_abs_diff(A, B, name)
        entry = {"name": name, "shape": list(ta.shape), "max_abs_diff": diff}
        self.res.changed.append(entry)
        axis = _vocab_axis(ta.shape, self.da.vocab_rows)
        if (
            self.added_ids
            and name in self.vocab_names_a
            and axis is not None
            and chunked.common_part_equal(A, B, name, axis, self.added_ids)
        ):
            what = "entries" if len(ta.shape) == 1 else "columns" if axis == 1 else "rows"
            entry["why"] = f"{what} of the added tokens (ids {_id_span(self.added_ids)}) set by add-tokens"
        elif (
            name in self.head_names
            and self.emb_b in B.tensors
            and _equal_to_embedding(B, name, B, self.emb_b)
        ):
            entry["why"] = "head set equal to the embedding"
        elif (
            name == da.embedding.name
            and da.head.name in A.tensors
            and _equal_to_embedding(A, da.head.name, B, name)
        ):
            entry["why"] = f"embedding takes the head's values (tie {Opt('keep', 'head')})"
        else:
            rows = ""
            if axis == 0 and name in self.vocab_names_a and len(ta.shape) == 2:
                ids = chunked.rows_differing(A, B, name, self.added_ids)
                rows = f" in rows {', '.join(map(str, ids))}" if ids else ""
                rows += " (rows of no token the report added or reset)" if ids and self.added_ids else ""
            self.res.unexplained.append(
                f"{name} changed{rows} (max |difference| {diff:.3g}) and tie/untie/resize do not change it"
            )


_CONFIG_FILES = ("config.json", "model_config.json", "generation_config.json")


def _compare_configs(res: VerifyResult, A: Checkpoint, B: Checkpoint, da: Detection, db: Detection) -> None:
    """Record every differing key of the config files in ``res.config``. Unexplained: a key outside
    ``ALLOWED_CONFIG_KEYS``; a vocabulary-size key the input did not have; a vocabulary-size key whose new
    value counts no vocabulary of the output (neither its embedding's nor its head's rows, nor the old value
    moved as the embedding moved)."""
    d = db.vocab_rows - da.vocab_rows
    counts = {db.vocab_rows, db.head.rows}
    for fname in _CONFIG_FILES:
        pa, pb = A.path / fname, B.path / fname
        if not pa.exists() and not pb.exists():
            continue
        ca = _flatten(_read_cfg(pa)) if pa.exists() else {}
        cb = _flatten(_read_cfg(pb)) if pb.exists() else {}
        for k in sorted(set(ca) | set(cb)):
            before, after = ca.get(k, _ABSENT), cb.get(k, _ABSENT)
            if before == after:
                continue
            res.config.append({"file": fname, "key": k, "before": ca.get(k), "after": cb.get(k)})
            name = k.split(".")[-1]
            change = f"({_shown(before)} → {_shown(after)})"
            if name not in ALLOWED_CONFIG_KEYS:
                res.unexplained.append(f"{fname}: {k} changed {change}")
            elif name != "tie_word_embeddings" and before is _ABSENT:
                res.unexplained.append(
                    f"{fname}: {k} added {change}; tie/untie/resize add no vocabulary size"
                )
            elif (
                name != "tie_word_embeddings"
                and after is not _ABSENT
                and after not in counts
                and (not isinstance(before, int) or after != before + d)
            ):
                res.unexplained.append(
                    f"{fname}: {k} changed {change}, which counts no vocabulary of the output "
                    f"(its embedding has {db.vocab_rows} rows)"
                )


_ABSENT = object()


def _shown(v: object) -> str:
    """A config value as JSON writes it (``null``, ``"silu"``), or ``absent``."""
    return "absent" if v is _ABSENT else json.dumps(v)


def _compare_metadata(res: VerifyResult, A: Checkpoint, B: Checkpoint) -> None:
    """safetensors ``__metadata__``: every entry of the output must be one of the input's (any shard), or a
    ``{dropped tensor: the embedding}`` entry that tie writes for a tensor the output no longer holds."""
    before: dict[str, str] = {}
    for m in A.st_metadata.values():
        before.update(m or {})
    for f, m in B.st_metadata.items():
        for k, v in (m or {}).items():
            tie_entry = k in A.tensors and k not in B.tensors and v in B.tensors
            if before.get(k) != v and not tie_entry:
                res.unexplained.append(
                    f"{f}: __metadata__ {json.dumps(k)}: {json.dumps(v)} is not the input's "
                    f"({_shown(before.get(k, _ABSENT))}) and no tie entry"
                )


def _read_cfg(p: Path) -> object:
    """A config file (strictly, types checked: :func:`surgery.io.configfile.read_config_file`) or
    ``generation_config.json`` (strictly: :func:`surgery.io.regular.load_json`)."""
    return load_json(p, p.name) if p.name == "generation_config.json" else read_config_file(p)


def _same_bytes(pa: Path, pb: Path) -> bool:
    """Two carried files hold the same bytes (local: compared in blocks, :func:`filecmp.cmp`; both were
    checked to be regular, readable files when the checkpoints were opened)."""
    try:
        return store.same_bytes(pa, pb)
    except OSError as e:
        raise CheckpointError(
            f"cannot be read ({e.strerror})", e.filename or pa, "make it readable"
        ) from None


def _compare_other_files(res: VerifyResult, A: Checkpoint, B: Checkpoint, skip: set[str]) -> None:
    """Files other than weights, configs and ``skip`` (the tokenizer files, compared token by token) must
    be in both and byte-identical; any other is unexplained."""
    for rel in sorted(set(A.other_files) | set(B.other_files)):
        if rel in _CONFIG_FILES or rel in skip:
            continue
        pa, pb = A.path / rel, B.path / rel
        if not pa.exists() or not pb.exists():
            res.unexplained.append(f"{rel} is only in {'the input' if pa.exists() else 'the output'}")
        elif not _same_bytes(pa, pb):
            res.unexplained.append(f"{rel} differs")


# ------------------------------------------------------------------ tokenizer files

# keys of a tokenizer file that list tokens (add-tokens and a resize trim change them); every other key
# must keep its value
_TOKEN_KEYS = {
    "tokenizer.json": ("added_tokens",),
    "tokenizer_config.json": ("added_tokens_decoder", "additional_special_tokens", "extra_special_tokens"),
    "special_tokens_map.json": ("additional_special_tokens",),
}
_TRIM_KEYS = {"tokenizer.json": ("model.vocab", "model.merges")}  # a trim below the base vocabulary
_ADDED_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_LINES = 20  # tokens named one line each; the rest counted


def _detect_pair(A: Checkpoint, B: Checkpoint) -> tuple[Detection, Detection]:
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
        return detect(A, compare_values=False, **names), detect(B, compare_values=False, **names)
    except (CheckpointError, UsageError, RefusedError):
        return da, db


def _reset_tokens(path: Path) -> dict[int, str]:
    """``{id: content}`` of the existing tokens whose all-zero rows the output's own ``add-tokens`` run reset
    (``add_tokens.tokens`` entries with ``"rows_reset": true``); ``{}`` without a readable report."""
    try:
        rep = load_json(path / REPORT_NAME, REPORT_NAME) if (path / REPORT_NAME).is_file() else None
    except (CheckpointError, OSError):
        rep = None
    sec = rep.get("add_tokens") if isinstance(rep, dict) else None
    tokens = sec.get("tokens") if isinstance(sec, dict) else None
    return {
        t["id"]: t["content"]
        for t in (tokens if isinstance(tokens, list) else [])
        if isinstance(t, dict)
        and t.get("rows_reset") is True
        and isinstance(t.get("id"), int)
        and isinstance(t.get("content"), str)
    }


@dataclass(frozen=True)
class _Tokenizers:
    """What verify reads of both folders' tokenizers: the file sets, the vocabularies (``{id: token}``),
    the tokens the output's report chain says were added (``{id: content}``), the input's tokens it says
    were removed that the files bear out (``{id: content}``: absent from the output, an added token of the
    input, removed by a trim of the chain's rows), and the ones they contradict (``{id: why}``); the
    existing tokens whose all-zero rows the output's add-tokens run says it reset that the input bears out
    (``reset``, ``{id: content}``), and the ones it contradicts (``reset_doubted``, ``{id: line}``)."""

    sets: tuple[TokenizerSet, TokenizerSet]
    vocab: tuple[dict[int, str], dict[int, str]]
    added: dict[int, str]
    removed: dict[int, str]
    doubted: dict[int, str] = field(default_factory=dict)
    reset: dict[int, str] = field(default_factory=dict)
    reset_doubted: dict[int, str] = field(default_factory=dict)

    @classmethod
    def read(cls, da: Detection, db: Detection) -> _Tokenizers:
        """From the detections' tokenizer sets (:func:`surgery.io.tokenizer.tokenizer_set`, read once) and
        the output's report chain (:func:`surgery.report.token_claims`), checked against the files."""
        A, B = da.ckpt, db.ckpt
        claims = token_claims(B.path, A.path)
        sets = (da.tokenizer.files, db.tokenizer.files)
        va, vb = vocabulary(A.path), vocabulary(B.path)
        own = {(t.id, t.content) for t in sets[0].added}
        removed: dict[int, str] = {}
        doubted: dict[int, str] = {}
        for i, r in claims.removed.items():
            if va.get(i) != r.content or i in vb:
                continue  # explains nothing: the input lacks it, or the output still has the id
            base = "" if (i, r.content) in own else _BASE_KEPT
            why = r.doubt or _rows_doubt(claims.rows, db.vocab_rows) or base
            if why:
                doubted[i] = f"{r.source} says it was removed, which the files contradict: {why}"
            else:
                removed[i] = r.content
        reset, reset_doubted = _checked_resets(da, _reset_tokens(B.path), va, vb, claims.added)
        return cls(sets, (va, vb), claims.added, removed, doubted, reset, reset_doubted)

    def new_rows(self) -> frozenset[int]:
        """Ids the report added that the input's tokenizer does not have and the output's has with that
        content, and ids of existing tokens whose all-zero rows add-tokens reset (``rows_reset``, the same
        content in both): the rows add-tokens may set."""
        va, vb = self.vocab
        new = {i for i, c in self.added.items() if i not in va and vb.get(i) == c}
        return frozenset(new | set(self.reset))


def _checked_resets(
    da: Detection, claimed: dict[int, str], va: dict[int, str], vb: dict[int, str], added: dict[int, str]
) -> tuple[dict[int, str], dict[int, str]]:
    """The ``rows_reset`` claims (``{id: content}``) split into those the files bear out and ``{id: line}``
    of those they contradict. A claim holds when the token has that id in both folders and add-tokens' own
    rule (:func:`surgery.plan.add_tokens.not_resettable`) resets its rows in the input: all zero in the
    embedding and in a head stored apart. A claim for an id the chain added (new in the output) or beyond
    the input's rows explains nothing the files do not already: it is left out, not doubted."""
    rows = da.vocab_rows
    asked = {i: c for i, c in claimed.items() if not (i in added and i not in va) and 0 <= i < rows}
    why = {i: f"the input's id {i} is {va.get(i)!r}" for i, c in asked.items() if va.get(i) != c}
    why |= {i: f"the output's id {i} is {vb.get(i)!r}" for i, c in asked.items() if vb.get(i) != c}
    rest = sorted(set(asked) - set(why))
    if rest and da.embedding.name not in da.ckpt.tensors:
        why |= dict.fromkeys(rest, "the input has no embedding tensor to read the rows in")
    elif rest:
        why |= not_resettable(da, rest)
    doubted = {
        i: f"token {asked[i]!r} (id {i}): tietool-report.json says add-tokens reset its all-zero rows "
        f"(rows_reset), which the files contradict: {w}; tietool-report.json is unverifiable"
        for i, w in sorted(why.items())
    }
    return {i: c for i, c in asked.items() if i not in why}, doubted


_BASE_KEPT = "it is in the input's base vocabulary, which tietool never removes (only added tokens)"


def _rows_doubt(claimed: object, rows: int) -> str:
    """Why a report chain that ends with ``claimed`` rows cannot describe an output of ``rows`` ("" when
    it can)."""
    if claimed == rows:
        return ""
    return f"the report's runs end with {claimed!r} rows, the output's embedding has {rows}"


def _tokenizer_names(A: Checkpoint, B: Checkpoint, sets: tuple[TokenizerSet, TokenizerSet]) -> set[str]:
    """The files compared token by token instead of byte by byte: every file of either tokenizer set, and
    the added-token files present in either folder."""
    names = {f.name for s in sets for f in s.files}
    return names | {n for n in _ADDED_FILES if n in A.other_files or n in B.other_files}


def _token_changes(
    va: dict[int, str],
    vb: dict[int, str],
    added: dict[int, str],
    removed: dict[int, str],
    doubted: dict[int, str] | None = None,
) -> list[str]:
    """Every token of the input keeps its id in the output unless the report removed it; every id only the
    output has is a token the report added, with that content. One line per broken token (a few named); a
    token the report says was removed against the files (``doubted``, ``{id: why}``) names why and calls
    the report unverifiable."""
    where_b = {s: i for i, s in vb.items()}
    out: list[str] = []
    for i, s in va.items():
        t = vb.get(i)
        if t == s:
            continue
        if t is None and removed.get(i) == s:
            continue
        j = where_b.get(s)
        now = f"is id {j} in the output" if j is not None else "is not in the output's tokenizer"
        got = f" (id {i} is {t!r} there)" if t is not None else ""
        why = (doubted or {}).get(i)
        tail = f": {why}; tietool-report.json is unverifiable" if why else ""
        out.append(
            f"token {s!r} (id {i}) {now}{got}"
            + ("" if i not in removed else ", not as reported removed")
            + tail
        )
    for i in sorted(set(vb) - set(va)):
        if added.get(i) != vb[i]:
            why = (
                f"the report adds {added[i]!r} at id {i}"
                if i in added
                else "tietool-report.json does not list it"
            )
            out.append(f"token {vb[i]!r} (id {i}) is only in the output: {why}")
    if len(out) > _LINES:
        out[_LINES:] = [f"and {len(out) - _LINES} more token(s) changed"]
    return out


def _json_rest(path: Path, drop: tuple[str, ...]) -> object:
    """A JSON tokenizer file without the (dotted) keys ``drop``; None when it cannot be read."""
    try:
        data = load_json(path, path.name)
    except (CheckpointError, OSError):
        return None
    if isinstance(data, dict):
        data = dict(data)
        for k in drop:
            head, _, tail = k.partition(".")
            if tail and isinstance(data.get(head), dict):
                data[head] = {x: v for x, v in data[head].items() if x != tail}
            elif not tail:
                data.pop(k, None)
    return data


def _file_changes(A: Checkpoint, B: Checkpoint, names: set[str], explained: bool, trim: bool) -> list[str]:
    """Tokenizer files only in one folder, and files that differ: without a reported token change any
    difference; with one, a difference outside the keys that list tokens (:data:`_TOKEN_KEYS`)."""
    out: list[str] = []
    for rel in sorted(names):
        pa, pb = A.path / rel, B.path / rel
        if not pa.exists() or not pb.exists():
            # added_tokens.json is created by add-tokens where added tokens live outside the model file
            # (tokenizer_edit: PaddleNLP 2.8.1 reads them only there); its tokens are compared above
            if not (rel == "added_tokens.json" and pb.exists() and explained and not trim):
                out.append(f"{rel} is only in {'the input' if pa.exists() else 'the output'}")
            continue
        if _same_bytes(pa, pb):
            continue
        if not explained:
            out.append(f"{rel} differs and tietool-report.json lists no token added or removed")
        elif rel in _TOKEN_KEYS:
            drop = _TOKEN_KEYS[rel] + (_TRIM_KEYS.get(rel, ()) if trim else ())
            if _json_rest(pa, drop) != _json_rest(pb, drop):
                out.append(f"{rel} differs beyond the tokens it lists ({', '.join(drop)})")
    return out


def _compare_tokenizers(
    res: VerifyResult, A: Checkpoint, B: Checkpoint, tok: _Tokenizers, rows: tuple[int, int]
) -> None:
    """The tokenizer files of each folder agree with each other; every token of the input keeps its id
    in the output; the output's new tokens are the ones its ``tietool-report.json`` lists; len(tokenizer)
    of the output is at most its embedding's rows; tokenizer files differ only in the tokens they list.
    Each broken rule is unexplained (exit 7), naming the token or file. A problem the input already has
    (the same disagreement, a tokenizer longer than the rows by as much or more) is not a difference the
    operation made: it is a note."""
    (sa, sb), (va, vb), added, removed = tok.sets, tok.vocab, tok.added, tok.removed
    changes = _token_changes(va, vb, added, removed, tok.doubted)
    res.tokenizer = {
        "before": {"length": sa.length, "files": [f.name for f in sa.files], "agree": not sa.disagreements},
        "after": {"length": sb.length, "files": [f.name for f in sb.files], "agree": not sb.disagreements},
        "added": [{"content": c, "id": i} for i, c in sorted(added.items()) if vb.get(i) == c],
        "removed": [{"content": c, "id": i} for i, c in sorted(removed.items()) if i not in vb],
        "changes": changes,
    }
    res.notes += [f"the input's tokenizer files disagree: {d}" for d in sa.disagreements]
    for d in sb.disagreements:
        (res.notes if d in sa.disagreements else res.unexplained).append(
            f"the output's tokenizer files disagree: {d}"
            + (" (as the input's do)" if d in sa.disagreements else "")
        )
    res.unexplained += changes + list(tok.reset_doubted.values())
    _rows_for_tokens(res, (sa.length, sb.length), rows)
    names = _tokenizer_names(A, B, tok.sets)
    explained = bool(added or removed) and not changes
    res.unexplained += _file_changes(A, B, names, explained, bool(removed))


def _rows_for_tokens(
    res: VerifyResult, lengths: tuple[int | None, int | None], rows: tuple[int, int]
) -> None:
    """len(tokenizer) <= rows in the output: unexplained when the output lacks rows for its tokens, a note
    when the input lacked as many or more (the operation did not make it worse)."""
    (la, lb), (ra, rb) = lengths, rows
    if lb is None or lb <= rb:
        return
    line = f"the output's tokenizer has {lb} tokens but its embedding only {rb} rows: ids {rb}..{lb - 1} "
    line += "have no row"
    if la is not None and la - ra >= lb - rb:
        res.notes.append(f"{line} (the input's has {la} tokens for {ra} rows)")
    else:
        res.unexplained.append(line)


def _t5_scale(det) -> float | None:
    return tied_scale(det.ckpt.config, det.hidden, det.ckpt.path) if det.family.scales_tied_logits else None


def _equal_to_embedding(
    X: Checkpoint, name: str, E: Checkpoint, emb: str, scale: float | None = None
) -> bool:
    """``X[name]`` holds the embedding ``E[emb]``: the same bits as stored or transposed (a ``[hidden,
    vocab]`` head), or, with ``scale``, its values times ``scale`` (T5's tied head materialised). Read in
    bounded chunks (:mod:`surgery.inspect.chunked`)."""
    if chunked.same_bytes(X, E, name, emb) or chunked.transposed_equal(X, name, E, emb):
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
    A: Checkpoint, B: Checkpoint, name: str, skip: frozenset[int] = frozenset()
) -> tuple[bool, str]:
    """The part ``name`` has in both checkpoints along its vocabulary axis is bit-identical.

    The axis is the one whose size changed (resize moves exactly one axis of a vocabulary tensor), so a
    square head whose layout detection cannot tell is compared the way it was resized; a 1-D bias (or
    ``[1, V]``) compares entries. Returns ``(equal, what was compared)`` (``rows``, ``columns``,
    ``entries``); a tensor whose shape changed on more than one axis, or whose number of axes changed, is not
    a resize: ``(False, ...)``.
    """
    xs, ys = tuple(A.tensors[name].shape), tuple(B.tensors[name].shape)
    if len(xs) != len(ys):
        return False, "shapes (the number of axes changed)"
    if len(xs) == 1 or (len(xs) == 2 and xs[0] == 1 and ys[0] == 1):
        return chunked.common_part_equal(A, B, name, len(xs) - 1, skip), "entries"
    moved = [a for a in range(len(xs)) if xs[a] != ys[a]]
    if len(moved) != 1 or moved[0] > 1:
        return False, "shapes (more than one axis changed)"
    return chunked.common_part_equal(A, B, name, moved[0], skip), "columns" if moved[0] == 1 else "rows"


class NotCompared(str, Enum):
    """Why ``verify`` could not compare the logits (``res.logits["cause"]``; exit
    :attr:`ExitCode.NOT_COMPARED`)."""

    NO_PADDLE = "no_paddle"  # paddlepaddle or PaddleFormers is not installed
    REMOTE = "remote"  # a checkpoint is in object storage; PaddleFormers loads local folders
    PADDLENLP = "paddlenlp"  # a PaddleNLP checkpoint: PaddleFormers cannot load its names
    NO_CLASS = "no_class"  # PaddleFormers has no language-model class for the config
    INPUT_FAILED = "input_failed"  # the input does not load or run under PaddleFormers (on this machine)
    TIMEOUT = "timeout"  # the PaddleFormers subprocess ran out of time
    CRASHED = "crashed"  # the PaddleFormers subprocess died without a verdict


def _not_compared(cause: NotCompared, why: str, fix: str, **extra) -> dict:
    """``res.logits`` when nothing was compared: ``ok`` None, the cause, and one line naming cause and fix."""
    return {
        "ok": None,
        "compared": False,
        "cause": cause.value,
        "error": f"logits not compared: {why}; {fix}",
        **extra,
    }


def logits_check(a_path, b_path, timeout: float = 600) -> dict:
    """Logits of both checkpoints under PaddleFormers on CPU, on a fixed batch of ids valid in both and not a
    special token the config names (a vision-language model's image id would ask for pixels), in one
    subprocess (:mod:`surgery.logits_worker`: the model class comes from the input's config through
    PaddleFormers'
    own registries, and both are run with it).

    Returns:
        compared: ``{"ok": max |difference| <= 1e-5, "compared": True, "max_abs_diff", "token_ids_below",
        "model_class", "class_from", "error": None}``; when the input runs but the output does not load (or
        loads without every weight), ``ok`` False and ``output_error`` says why: the output is broken.
        Not compared: ``{"ok": None, "compared": False, "cause": NotCompared value, "error": one line
        naming the cause and the fix}`` (no paddle, a URL, a PaddleNLP checkpoint, no class, the input
        does not run, timeout).
    """
    import importlib.util

    from .io import store

    missing = [m for m in ("paddle", "paddleformers") if importlib.util.find_spec(m) is None]
    if missing:
        return _not_compared(
            NotCompared.NO_PADDLE,
            f"{' and '.join(missing)} not installed",
            'pip install "tietool[paddle]" adds paddlepaddle and PaddleFormers 1.2.0',
        )
    remote = [str(p) for p in (a_path, b_path) if store.is_url(p) or not stores.store_for(p).on_disk]
    if remote:
        return _not_compared(
            NotCompared.REMOTE,
            f"{remote[0]} is in object storage and PaddleFormers loads local folders",
            f"download both checkpoints and verify the local copies with {Opt('logits', True)}",
        )
    A, B = Checkpoint.open(a_path), Checkpoint.open(b_path)
    da = detect(A, compare_values=False)
    if da.loader.name.startswith("paddlenlp"):
        return _not_compared(
            NotCompared.PADDLENLP,
            f"{a_path} is a PaddleNLP checkpoint ({da.loader.source}); PaddleFormers cannot load its names",
            "compare logits under PaddleNLP itself, or convert both to PaddleFormers first",
        )
    v = min(da.vocab_rows, detect(B, compare_values=False).vocab_rows)
    return _compare_logits(a_path, b_path, _token_ids(A.config, v), v, timeout)


def _token_ids(config: dict, v: int) -> np.ndarray:
    """A fixed ``int64 [2, 8]`` batch of ids in ``1..v-1`` (0 is the padding id of PaddleFormers Llama, which
    reads as zeros whatever the weights), none a ``*_token_id`` the config names at any nesting (image,
    video, vision-start ids make a vision-language model look for pixels)."""
    special = {val for k, val in walk(config) if k.endswith("token_id") and isinstance(val, int)}
    pool = np.setdiff1d(np.arange(1, max(2, v)), np.array(sorted(special), dtype=np.int64))
    return (
        np.random.default_rng(0).choice(pool if pool.size else np.arange(1, 2), size=(2, 8)).astype(np.int64)
    )


def _compare_logits(a_path, b_path, ids: np.ndarray, v: int, timeout: float) -> dict:
    """Run both checkpoints (:func:`_run_fidelity`) and compare their logits on the first ``v`` entries."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "ids.npy", ids)
        doc = _run_fidelity([a_path, b_path], Path(tmp) / "ids.npy", Path(tmp), timeout)
        if "cause" in doc:  # timed out, or no verdict
            return doc
        found = {"model_class": doc.get("model_class"), "class_from": doc.get("class_from")}
        results = doc.get("results") or []
        if found["model_class"] is None:
            return _not_compared(
                NotCompared.NO_CLASS,
                f"{a_path}: {doc.get('error')}",
                "compare the logits with the library that wrote the checkpoint",
                **found,
            )
        if not results or not results[0].get("ok"):
            r = results[0] if results else {"error": doc.get("error"), "stage": None}
            return _not_compared(
                NotCompared.INPUT_FAILED,
                f"{a_path} does not {'load' if r.get('stage') in ('load', None) else 'run'} under "
                f"PaddleFormers {found['model_class']} ({r.get('error')})",
                f"the tensors alone were compared; verify with {Opt('logits', True)} where PaddleFormers "
                "can load and run the input (a GPU for a GPU-only kernel, another PaddleFormers version for "
                "files this one cannot read back)",
                **found,
            )
        after = Path(tmp) / "1.npy"
        if len(results) < 2 or not results[1].get("ok"):
            # a load after a successful one: run it again alone, so no state of the first can be the cause
            again = _run_fidelity([b_path], Path(tmp) / "ids.npy", Path(tmp) / "b", timeout, config_of=a_path)
            if again.get("cause") == NotCompared.TIMEOUT.value:
                return {**again, **found}
            r = (again.get("results") or [{"error": again.get("error")}])[0]
            if not r.get("ok"):  # the input runs, the output does not: a difference
                return {"ok": False, "compared": True, "output_error": r.get("error"), "error": None, **found}
            after = Path(tmp) / "b" / "0.npy"
        d = float(np.max(np.abs(np.load(Path(tmp) / "0.npy")[..., :v] - np.load(after)[..., :v])))
    return {
        "ok": d <= 1e-5,
        "compared": True,
        "max_abs_diff": d,
        "error": None,
        "token_ids_below": v,
        **found,
    }


def _run_fidelity(paths: list, ids: Path, out: Path, timeout: float, config_of=None) -> dict:
    """Run ``tietool.surgery.logits_worker`` on the checkpoints ``paths`` in one subprocess: the logits of the
    token ids in ``ids`` go to ``out/<i>.npy``; the class comes from the first one's config (or from
    ``config_of``'s).

    Returns:
        the subprocess's JSON line (:mod:`surgery.logits_worker`), or a not-compared dict
        (:func:`_not_compared`)
        when it timed out or printed no JSON (its stderr's last line says why).
    """
    import subprocess
    import sys

    out.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "tietool.surgery.logits_worker",
        str(ids),
        str(out),
        str(config_of or paths[0]),
    ]
    try:
        r = subprocess.run(
            [*args, *map(str, paths)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return _not_compared(
            NotCompared.TIMEOUT,
            f"PaddleFormers took more than {timeout:.0f} s to run {paths[0]}",
            "run verify on a machine with more memory or cores",
        )
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):  # no JSON line: it died before printing one
        tail = r.stderr.strip().splitlines()
        why = tail[-1][-300:] if tail else f"exit code {r.returncode}, no output"
        return _not_compared(
            NotCompared.CRASHED,
            f"the PaddleFormers subprocess stopped without a result ({why})",
            "check that paddle runs on this machine: python -c 'import paddle; paddle.utils.run_check()'",
        )
