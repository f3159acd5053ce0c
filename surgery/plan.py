"""Plans: what ``tie``, ``untie`` and ``resize`` will change, computed from headers and detection only.

A :class:`Plan` lists tensors dropped, replaced and added, config keys set, and notes. Executing it
(:func:`surgery.write.execute`) is the only step that writes; ``--dry-run`` prints the plan and stops.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from .checkpoint import Checkpoint
from .configfile import get_dotted, read_config_file
from .detect import HIDDEN_VOCAB, LAYOUTS, VOCAB_HIDDEN, Detection, tied_scale
from .errors import AmbiguousLayoutError, RefusedError, UsageError, ValuesDifferError
from .formats.safetensors_io import Source
from .formats.tensor import DTYPES, NP_TO_ST, TensorInfo, bf16_bits_to_f32, f32_to_bf16_bits

NEW_SHARD = "<new shard>"  # NewTensor.file of a tensor that gets a shard file of its own


@dataclass
class NewTensor:
    """A tensor the output gets new data for.

    Attributes:
        name: state-dict key.
        dtype: label in the checkpoint's format (safetensors ``BF16``...; pdparams numpy name).
        shape: output shape.
        make: returns the stored array (bf16 as ``uint16`` bits) or a :class:`Source` of its bytes, called
            once while writing.
        file: the weight file it goes into (input file name), or ``NEW_SHARD``.
        after: for an added tensor, the name it follows in that file (None: at the end).
        storage: tensors with the same storage key are one array (pdparams aliases).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    make: Callable[[], np.ndarray | Source]
    file: str
    after: str | None = None
    storage: object = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(_storage_np(self.dtype)).itemsize

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def _storage_np(label: str) -> str:
    return DTYPES[label].storage if label in DTYPES else DTYPES[NP_TO_ST[label]].storage


@dataclass
class Plan:
    """What an operation changes. Nothing is written until it is executed.

    Attributes:
        op: ``tie`` / ``untie`` / ``resize``.
        drop: names removed → reason.
        replace: existing names whose data (and maybe shape) change.
        add: new names.
        config_set: ``(file, dotted key, value)`` to set in config.json / model_config.json.
        stale_index: index entries that name no stored tensor; left out of the output index.
        metadata: safetensors ``__metadata__`` entries to add (``{dropped name: kept name}``).
        relabel_u16: write safetensors ``U16`` tensors that hold bf16 bits as ``BF16``.
        changed: the plan changes tensors or config (False: the output is a copy).
        notes: what the user should know (why nothing was saved, which loader was assumed, ...).
        warnings: what may break the model (trimming rows the tokenizer uses).
        extra_report: operation-specific report fields (resize rows, init, seed).
    """

    op: str
    ckpt: Checkpoint
    det: Detection
    drop: dict[str, str] = field(default_factory=dict)
    replace: dict[str, NewTensor] = field(default_factory=dict)
    add: list[NewTensor] = field(default_factory=list)
    config_set: list[tuple[str, str, object]] = field(default_factory=list)
    stale_index: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    relabel_u16: bool = False
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    extra_report: dict = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        cfg_changes = [c for c in self.config_set if _get_config(self.ckpt, c[0], c[1]) != c[2]]
        return bool(self.drop or self.replace or self.add or cfg_changes)

    @property
    def output_bytes(self) -> int:
        """Bytes of tensor data the output will hold (the progress bar's total): kept tensors, replaced
        tensors at their new size, added tensors."""
        t = self.ckpt.tensors
        kept = sum(x.nbytes for n, x in t.items() if n not in self.drop and n not in self.replace)
        return kept + sum(nt.nbytes for nt in self.replace.values()) + sum(nt.nbytes for nt in self.add)

    def touched_files(self) -> set[str]:
        """Weight files that must be rewritten (not copied)."""
        t = self.ckpt.tensors
        files = (
            {t[n].file for n in self.drop}
            | {t[n].file for n in self.replace}
            | {a.file for a in self.add if a.file != NEW_SHARD}
        )
        if self.relabel_u16:
            files |= {x.file for x in t.values() if x.dtype == "U16"}
        return files


def _get_config(ckpt: Checkpoint, file: str, key: str):
    data = ckpt.config if file == "config.json" else read_config_file(ckpt.path / file)
    try:
        return get_dotted(data, key)
    except (KeyError, IndexError, TypeError):
        return None


# ------------------------------------------------------------------ helpers


def _as_layout(a: np.ndarray, layout: str) -> np.ndarray:
    """``[vocab, hidden]`` array → the given head layout (contiguous)."""
    return np.ascontiguousarray(a.T) if layout == HIDDEN_VOCAB else a


def _tie_flags(det: Detection, value: bool) -> list[tuple[str, str, object]]:
    """Set ``tie_word_embeddings`` at the top level and in the language model's nested config."""
    out: list[tuple[str, str, object]] = [("config.json", "tie_word_embeddings", value)]
    if det.text_cfg_key:
        out.append(("config.json", f"{det.text_cfg_key}.tie_word_embeddings", value))
    return out


def _refuse_unusable_head(det: Detection, op: str) -> None:
    if det.head_present and det.head_layout is None:
        raise RefusedError(
            f"{op} refused: " + "; ".join(p for p in det.problems if det.head in p),
            det.ckpt.path,
            "fix the head first (merge tensor-parallel slices / re-export)",
        )


def _out_dtype(ckpt: Checkpoint, t: TensorInfo, relabel: bool) -> str:
    return "BF16" if relabel and t.dtype == "U16" else t.dtype


def _wants_relabel(ckpt: Checkpoint) -> bool:
    return (
        ckpt.format == "safetensors"
        and ckpt.bf16_as_u16
        and any(t.dtype == "U16" for t in ckpt.tensors.values())
    )


def _base_plan(op: str, det: Detection) -> Plan:
    ckpt = det.ckpt
    plan = Plan(op, ckpt, det, relabel_u16=_wants_relabel(ckpt))
    if ckpt.index is not None:
        plan.stale_index = [n for n in ckpt.index["weight_map"] if n not in ckpt.tensors]
    if plan.relabel_u16:
        plan.notes.append(
            "U16 tensors hold bfloat16 bits (config dtype bfloat16): rewritten shards label them BF16; "
            "the bytes are unchanged"
        )
    return plan


# ------------------------------------------------------------------ tie


def plan_tie(det: Detection, keep: str | None = None, drop_aliases: bool = False) -> Plan:
    """Plan ``tie``: drop the head (and its aliases) where the loader re-ties; set the flag true.

    Args:
        det: detection (with ``--layout``/``--loader`` applied).
        keep: when head and embedding differ, ``"embedding"`` keeps the embedding's values, ``"head"``
            writes the head's values (in ``[vocab, hidden]``) as the embedding. None refuses.
        drop_aliases: also drop copies of the embedding under alias names (T5/BART
            ``encoder.embed_tokens``/``decoder.embed_tokens``). Off by default: the loaders build those
            as one shared layer, but the fixtures hold no evidence of a load without them.

    Raises:
        ValuesDifferError: values differ and ``keep`` is None (message names both tensors, max |diff|, rows).
        AmbiguousLayoutError: vocab_size == hidden_size and no ``--layout``.
        RefusedError: the head is unusable (a tensor-parallel slice, a wrong shape).
    """
    ckpt, plan = det.ckpt, _base_plan("tie", det)
    _refuse_unusable_head(det, "tie")
    plan.config_set = _tie_flags(det, True)
    copies = [a for a in det.embedding_aliases if det.family.reties]
    if drop_aliases:
        for a in copies:
            plan.drop[a] = f"copy of {det.embedding} (--drop-aliases)"
    elif copies:
        plan.notes.append(
            f"{', '.join(copies)} duplicate {det.embedding} and are kept (--drop-aliases drops them)"
        )
    h = det.head_info  # None exactly when the files hold no head
    if h is None:
        plan.metadata = {n: det.embedding for n in plan.drop}
        if det.config_tied:
            plan.notes.append(f"already tied: no head in the files and {det.config_source} = true")
        else:
            plan.notes.append(
                f"no head in the files: only {det.config_source} changes to true (0 bytes saved)"
            )
        return plan
    if det.head_layout == "ambiguous":
        raise AmbiguousLayoutError(
            f"vocab_size == hidden_size == {det.vocab_rows}: the layout of {det.head} cannot be told from "
            f"its square shape; as stored it is {det.comparison.values} vs {det.embedding}",
            ckpt.path,
            "pass --layout vocab-hidden or --layout hidden-vocab (PaddleNLP Llama/Qwen heads are "
            "hidden-vocab)",
        )
    comp = det.comparison
    if comp.values == "different":
        if keep is None:
            raise ValuesDifferError(
                f"tie refused: {det.head} differs from {det.embedding} (max |difference| "
                f"{comp.max_abs_diff:.3g}, {comp.differing_rows} of {det.vocab_rows} rows differ)",
                ckpt.path,
                "pass --keep embedding or --keep head to choose the values to keep, or use untie",
            )
        if keep == "head" and det.family.tied_logit_scale:
            raise RefusedError(
                f"--keep head on {det.family.name}: the tied model multiplies the embedding by "
                "d_model ** -0.5 for the logits, so the head's values cannot become the embedding",
                ckpt.path,
                "use --keep embedding, or keep the checkpoint untied",
            )
        if keep == "head":
            layout = det.head_layout

            def head_as_embedding() -> np.ndarray:
                return (
                    np.ascontiguousarray(ckpt.load(det.head).T)
                    if layout == HIDDEN_VOCAB
                    else ckpt.load(det.head)
                )

            e = det.emb_info
            if ckpt.logical_dtype(h) != ckpt.logical_dtype(e):
                raise RefusedError(
                    f"--keep head: {det.head} is {ckpt.logical_dtype(h)} but {det.embedding} is "
                    f"{ckpt.logical_dtype(e)}",
                    ckpt.path,
                    "convert the dtypes first",
                )
            for n in [det.embedding] + det.embedding_aliases:
                t = ckpt.tensors[n]
                plan.replace[n] = NewTensor(
                    n,
                    _out_dtype(ckpt, t, plan.relabel_u16),
                    t.shape,
                    head_as_embedding,
                    t.file,
                    storage=("embedding",),
                )
            plan.notes.append(f"--keep head: {det.embedding} takes the values of {det.head}")
        else:
            plan.notes.append(f"--keep embedding: the values of {det.head} are discarded")
    if comp.values == "scaled":
        plan.notes.append(
            f"{det.head} is {det.embedding} × d_model ** -0.5: exactly the tied head, so it is dropped"
        )
    if det.family.reties:
        plan.drop[det.head] = f"duplicate of {det.embedding} (the {det.loader} loader re-ties it)"
        for a in det.head_aliases:
            plan.drop[a] = f"alias of {det.head}"
        plan.metadata = {n: det.embedding for n in plan.drop}
    else:
        plan.notes.append(
            f"the {det.loader} loader ({det.family.name}) does not re-tie a missing head: it would load a "
            f"random one, so {det.head} is kept, equal to the embedding in the loader's {det.head_layout} "
            "layout; 0 bytes saved"
        )
        if keep == "embedding" and comp.values == "different":

            def make(lay=det.head_layout) -> np.ndarray:
                return _as_layout(ckpt.load(det.embedding), lay)

            plan.replace[det.head] = NewTensor(
                det.head, _out_dtype(ckpt, h, plan.relabel_u16), h.shape, make, h.file
            )
    return plan


# ------------------------------------------------------------------ untie


def plan_untie(det: Detection, layout: str = "auto") -> Plan:
    """Plan ``untie``: the head as its own tensor, equal to the embedding, flag set false.

    Args:
        layout: ``auto`` (the layout the detected loader expects for this family: PaddleNLP Llama/Qwen/
            ChatGLM ``hidden-vocab``, everything else ``vocab-hidden``), or an explicit layout. Only used
            when a new head is written: an existing head keeps its stored bytes.

    For T5, whose tied logits are scaled by ``d_model ** -0.5``, the new head is the embedding times that
    factor (computed in float32, rounded back), so logits do not change.
    """
    ckpt, plan = det.ckpt, _base_plan("untie", det)
    _refuse_unusable_head(det, "untie")
    if det.family.always_tied:
        raise RefusedError(
            f"untie refused: the {det.loader} loader of {det.model_type} always takes {det.head} from "
            f"{det.embedding} on load, whatever tie_word_embeddings says, so an untied head would be ignored",
            ckpt.path,
            "pass --loader hf if another library will load the output",
        )
    plan.config_set = _tie_flags(det, False)
    if det.head_present and not det.comparison.storage_shared:
        plan.notes.append(
            f"{det.head} already exists as its own tensor: its bytes are kept (untie only sets the flag)"
        )
        return plan
    lay = det.family.head_layout if layout in (None, "auto") else layout
    if lay not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}", fix="use auto, vocab-hidden or hidden-vocab")
    e = det.emb_info
    shape = (det.vocab_rows, det.hidden) if lay == VOCAB_HIDDEN else (det.hidden, det.vocab_rows)
    scale = None
    if det.family.tied_logit_scale and not det.head_present:
        scale = tied_scale(det.ckpt.config, det.hidden)
        plan.notes.append(
            f"{det.family.name}: tied logits are scaled by d_model ** -0.5 = {scale:.6g}; the new head "
            "is the embedding times that factor, so logits do not change"
        )

    def make() -> np.ndarray | Source:
        if scale is None and lay == VOCAB_HIDDEN and not e.fortran:
            return ckpt.source(det.embedding)  # the same bytes: a kernel copy of the embedding's range
        a = ckpt.load(det.embedding)
        if scale is not None:
            lg = ckpt.logical_dtype(e)
            x = (bf16_bits_to_f32(a) if lg == "bfloat16" else a.astype(np.float32)) * np.float32(scale)
            a = f32_to_bf16_bits(x) if lg == "bfloat16" else x.astype(a.dtype)
        return _as_layout(a, lay)

    name = det.head
    head_info = det.head_info
    if head_info is not None:  # present: an alias of the embedding's storage, written as its own array
        plan.replace[name] = NewTensor(
            name, _out_dtype(ckpt, e, plan.relabel_u16), shape, make, head_info.file
        )
    elif ckpt.sharded:
        # a shard of its own (as PaddleFormers lays the head out): every existing shard is copied unchanged
        plan.add.append(NewTensor(name, _out_dtype(ckpt, e, plan.relabel_u16), shape, make, NEW_SHARD))
    else:
        plan.add.append(
            NewTensor(
                name,
                _out_dtype(ckpt, e, plan.relabel_u16),
                shape,
                make,
                e.file,
                after=_last_in_file(ckpt, e.file),
            )
        )
    plan.notes.append(
        f"{name} written as {list(shape)} ({lay}), for the {det.loader} loader"
        + ("" if layout not in (None, "auto") else f" (auto: {det.loader_source})")
    )
    return plan


def _last_in_file(ckpt: Checkpoint, file: str) -> str | None:
    names = [n for n, t in ckpt.tensors.items() if t.file == file]
    return names[-1] if names else None


# ------------------------------------------------------------------ resize


INITS = ("mean", "zeros", "normal")
MAX_VOCAB = 2**31 - 1


def _available_memory() -> int | None:
    """Bytes of memory available (Linux ``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def target_rows(vocab: int, pad_to_multiple_of: int | None) -> int:
    """``vocab`` rounded up to a multiple of ``pad_to_multiple_of`` (13, 8 → 16; 16, 8 → 16)."""
    if pad_to_multiple_of in (None, 1):
        return vocab
    return math.ceil(vocab / pad_to_multiple_of) * pad_to_multiple_of


def _decode(ckpt: Checkpoint, t: TensorInfo, a: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(a) if ckpt.logical_dtype(t) == "bfloat16" else a.astype(np.float32)


def _encode(ckpt: Checkpoint, t: TensorInfo, x: np.ndarray) -> np.ndarray:
    lg = ckpt.logical_dtype(t)
    if lg == "bfloat16":
        return f32_to_bf16_bits(x)
    return x.astype(t.storage_dtype)


def new_rows(
    old: np.ndarray,
    n: int,
    init: str,
    rng: np.random.Generator,
    std: float,
    decode: Callable[[np.ndarray], np.ndarray] | None = None,
    chunk_rows: int = 8192,
) -> np.ndarray:
    """``n`` new rows ``[n, hidden]`` (float32) for a table whose stored rows are ``old`` ``[rows, hidden]``.

    Args:
        old: stored rows (any dtype; ``decode`` turns a chunk of them into float32, e.g. bf16 bits).
        init: ``mean``: as HF transformers' ``mean_resizing``: mean ``mu`` and population covariance ``C`` of
            the old rows in float32; rows drawn from N(mu, 1e-9 · C); exactly ``mu`` when ``1e-9 · C`` is not
            positive definite (Cholesky fails, or its smallest eigenvalue is within float32 rounding of zero,
            which a rank-deficient C only passes by rounding noise). ``zeros``. ``normal``: N(0, std²), std =
            config ``initializer_range`` (else 0.02).
        rng: the generator (seeded by ``--seed``).

    The mean and covariance are accumulated over row chunks (two passes), so memory stays at one chunk plus
    the ``[hidden, hidden]`` covariance, whatever the vocabulary size.
    """
    h = old.shape[1]
    if n <= 0:
        return np.zeros((0, h), np.float32)
    if init == "zeros":
        return np.zeros((n, h), np.float32)
    if init == "normal":
        return rng.normal(0.0, std, size=(n, h)).astype(np.float32)
    decode = decode or (lambda a: np.asarray(a, dtype=np.float32))
    rows = old.shape[0]
    total = np.zeros(h, np.float64)
    for s in range(0, rows, chunk_rows):
        total += decode(np.asarray(old[s : s + chunk_rows])).sum(axis=0, dtype=np.float64)
    mu = (total / rows).astype(np.float32)
    cov = np.zeros((h, h), np.float64)
    for s in range(0, rows, chunk_rows):
        x = decode(np.asarray(old[s : s + chunk_rows])) - mu
        cov += (x.T @ x).astype(np.float64)
    cov = cov / rows * 1e-9
    pd = False
    if np.isfinite(cov).all():
        try:
            chol = np.linalg.cholesky(cov)
            ev = np.linalg.eigvalsh(cov)
            pd = bool(ev.min() > ev.max() * h * np.finfo(np.float32).eps)
        except np.linalg.LinAlgError:
            pd = False
    if not pd:
        return np.broadcast_to(mu, (n, h)).astype(np.float32)
    z = rng.standard_normal(size=(n, h))
    return (mu.astype(np.float64) + z @ chol.T).astype(np.float32)


def plan_resize(
    det: Detection,
    vocab: int,
    pad_to_multiple_of: int | None = None,
    init: str = "mean",
    seed: int | None = None,
    force: bool = False,
) -> Plan:
    """Plan ``resize``: every tensor that carries the vocabulary gets ``target_rows(vocab, M)`` rows.

    Resized together, old rows kept bit-exact, trimming from the end: the input embedding and its aliases,
    the head (rows for ``[vocab, hidden]``, columns for ``[hidden, vocab]``), the head bias (``[V]`` or
    ``[1, V]``, new entries zero) and its aliases. A tied checkpoint stays tied (a head present and equal to
    the embedding is written equal to the new embedding), an untied head gets rows of its own by the same
    ``init``. config ``vocab_size`` (also ``text_config``, ``padded_vocab_size``, ``model_config.json``)
    becomes the new row count. Unlike PaddleFormers' ``resize_token_embeddings`` (which builds new rows by a
    Xavier-uniform draw and never resizes an untied head), the head is always resized.

    Raises:
        UsageError: vocab < 1, pad_to_multiple_of < 1, unknown init.
        RefusedError: the result has fewer rows than the checkpoint and ``force`` is False (message says how
            many rows would go and whether they are padding rows or real tokens), or the head is unusable.
    """
    ckpt = det.ckpt
    if not isinstance(vocab, int) or vocab < 1:
        raise UsageError(f"--vocab must be a positive integer, got {vocab!r}", fix="e.g. --vocab 32000")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise UsageError(f"--pad-to-multiple-of must be ≥ 1, got {pad_to_multiple_of}", fix="e.g. 64 or 128")
    if init not in INITS:
        raise UsageError(f"unknown --init {init!r}", fix="use mean, zeros or normal")
    _refuse_unusable_head(det, "resize")
    if det.head_present and det.head_layout == "ambiguous":
        raise AmbiguousLayoutError(
            f"vocab_size == hidden_size == {det.vocab_rows}: whether {det.head} is [vocab, hidden] or "
            "[hidden, vocab] cannot be told from its square shape",
            ckpt.path,
            "pass --layout vocab-hidden or --layout hidden-vocab",
        )
    V, H = det.vocab_rows, det.hidden
    N = target_rows(vocab, pad_to_multiple_of)
    if N > MAX_VOCAB:
        raise UsageError(
            f"--vocab {N} is beyond any tokenizer (token ids are int32 in Paddle; at most {MAX_VOCAB})",
            fix="check the number",
        )
    # bytes per new value held at once: float32 rows + stored copy (zeros); + float64 draw (normal, mean)
    need = (N - V) * H * {"zeros": 8, "normal": 16, "mean": 32}.get(init, 32)
    avail = _available_memory()
    if N > V and avail is not None and need > avail:
        raise UsageError(
            f"--vocab {N} adds {N - V} rows of {H}: about {need >> 20} MiB of new rows, more than the "
            f"{avail >> 20} MiB of memory available",
            fix="check the number, or free memory",
        )
    plan = _base_plan("resize", det)
    tok = det.tokenizer
    if N < V and not force:
        lost = V - N
        if tok.size is None:
            what = "no tokenizer files in the checkpoint, so it is unknown whether they are real tokens"
        elif N >= tok.size:
            what = (
                f"they are padding rows beyond the tokenizer's {tok.size} tokens (highest id "
                f"{tok.size - 1}), which may still hold trained values"
            )
        else:
            real = min(V, tok.size) - N
            what = (
                f"{real} of them are real tokens of the tokenizer ({tok.size} tokens, highest id "
                f"{tok.size - 1}): trimming below {tok.size} breaks those tokens"
            )
        raise RefusedError(
            f"resize to {N} rows would trim {lost} rows ({V} → {N}, rows {N}..{V - 1} removed): {what}",
            ckpt.path,
            "pass --force to shrink anyway, or a --vocab of at least the current rows",
        )
    if seed is None:
        # as uniform as SeedSequence().entropy (OS randomness) % 2**31, which it was
        seed = secrets.randbits(31)
    elif not isinstance(seed, int) or seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {seed!r}", fix="e.g. --seed 0")
    std = float(ckpt.config.get("initializer_range") or 0.02)
    rng_root = np.random.SeedSequence(seed)
    rngs = iter(np.random.default_rng(s) for s in rng_root.spawn(16))
    plan.extra_report = {
        "rows_before": V,
        "rows_after": N,
        "rows_added": max(0, N - V),
        "rows_removed": max(0, V - N),
        "init": init,
        "seed": seed,
        "pad_to_multiple_of": pad_to_multiple_of,
        "tokenizer_size": tok.size,
    }
    if N < V:
        plan.notes.append(f"--force: rows {N}..{V - 1} removed from every vocabulary tensor")
    if tok.size is not None and N < tok.size:
        plan.warnings.append(f"the tokenizer defines {tok.size} tokens; ids ≥ {N} will have no row")

    def extra_rows(name: str, rng, layout: str = VOCAB_HIDDEN) -> Callable[[], np.ndarray]:
        """The N - V new rows of table ``name`` (stored dtype, ``[N - V, hidden]``), computed once."""
        t = ckpt.tensors[name]

        def make() -> np.ndarray:
            a = ckpt.load(name)
            a = a.T if layout == HIDDEN_VOCAB else a
            return _encode(ckpt, t, new_rows(a, N - V, init, rng, std, decode=lambda c: _decode(ckpt, t, c)))

        return _cached(make)

    def rows_source(name: str, extra: Callable[[], np.ndarray]) -> Callable[[], Source | np.ndarray]:
        """Table ``name`` ``[V, hidden]`` resized to N rows: its first min(V, N) rows copied by byte range
        from the input (never decoded, never in memory), then the new rows."""
        t = ckpt.tensors[name]

        def make() -> Source | np.ndarray:
            if t.fortran:  # rows are not contiguous in the file: go through memory
                a = ckpt.load(name)
                return np.ascontiguousarray(a[:N]) if N <= V else np.concatenate([a, extra()], axis=0)
            src = ckpt.source(name)
            keep = src.prefix(t.nbytes // V * min(N, V))
            return keep if N <= V else Source(parts=[keep, Source(array=extra())])

        return make

    def head_columns(name: str, extra: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
        """A ``[hidden, V]`` head resized to N columns (new columns = the new rows, transposed)."""

        def make() -> np.ndarray:
            a = ckpt.load(name)
            out = a[:, :N] if N <= V else np.concatenate([a, extra().T], axis=1)
            return np.ascontiguousarray(out)

        return make

    if N != V:
        emb = det.emb_info
        emb_extra = extra_rows(det.embedding, next(rngs))
        emb_make = _cached(rows_source(det.embedding, emb_extra))
        for n in [det.embedding] + det.embedding_aliases:
            t = ckpt.tensors[n]
            plan.replace[n] = NewTensor(
                n, _out_dtype(ckpt, t, plan.relabel_u16), (N, H), emb_make, t.file, storage=t.storage
            )
        for n in det.vocab_aliases:
            t = ckpt.tensors[n]
            plan.replace[n] = NewTensor(
                n,
                _out_dtype(ckpt, t, plan.relabel_u16),
                (N, H),
                rows_source(n, extra_rows(n, next(rngs))),
                t.file,
                storage=t.storage,
            )
        h = det.head_info
        if h is not None:
            lay = det.head_layout
            hshape = (N, H) if lay == VOCAB_HIDDEN else (H, N)
            # a head equal to the embedding stays equal (tied or not): it gets the embedding's new rows, so
            # resize-then-untie and untie-then-resize give the same tensors
            tied_equal = det.comparison.values in ("exact", "transposed") and h.dtype == emb.dtype
            head_make: Callable[[], np.ndarray | Source]
            if tied_equal and lay == VOCAB_HIDDEN:
                head_make = emb_make
            elif tied_equal:
                head_make = head_columns(det.head, emb_extra)
            elif lay == VOCAB_HIDDEN:
                head_make = rows_source(det.head, extra_rows(det.head, next(rngs)))
            else:
                head_make = head_columns(det.head, extra_rows(det.head, next(rngs), HIDDEN_VOCAB))
            head_make = _cached(head_make)
            for n in [det.head] + det.head_aliases:
                t = ckpt.tensors[n]
                plan.replace[n] = NewTensor(
                    n,
                    _out_dtype(ckpt, t, plan.relabel_u16),
                    hshape,
                    head_make,
                    t.file,
                    storage=t.storage if not det.comparison.storage_shared else emb.storage,
                )
        bias = det.bias
        if bias:
            b = ckpt.tensors[bias]
            if b.shape[-1] != V:
                raise RefusedError(
                    f"the head bias {bias} has {b.shape[-1]} entries but the embedding has {V} rows",
                    ckpt.path,
                    "fix the bias first",
                )

            def bias_make() -> np.ndarray:
                a = ckpt.load(bias)
                if N <= V:
                    return np.ascontiguousarray(a[..., :N])
                pad = np.zeros(a.shape[:-1] + (N - V,), dtype=a.dtype)
                return np.concatenate([a, pad], axis=-1)

            bias_make = _cached(bias_make)
            for n in [bias] + det.bias_aliases:
                t = ckpt.tensors[n]
                plan.replace[n] = NewTensor(
                    n,
                    _out_dtype(ckpt, t, plan.relabel_u16),
                    t.shape[:-1] + (N,),
                    bias_make,
                    t.file,
                    storage=t.storage,
                )
    # config: every vocab_size key that exists (and the top level one)
    cfg = ckpt.config
    plan.config_set.append(("config.json", "vocab_size", N))
    if det.text_cfg_key and "vocab_size" in cfg.get(det.text_cfg_key, {}):
        plan.config_set.append(("config.json", f"{det.text_cfg_key}.vocab_size", N))
        if "vocab_size" not in cfg:
            plan.config_set.remove(("config.json", "vocab_size", N))
    for k in ("padded_vocab_size",):
        if k in cfg:
            plan.config_set.append(("config.json", k, N))
    if "model_config.json" in ckpt.other_files:
        mc = read_config_file(ckpt.path / "model_config.json")
        if isinstance(mc, dict):
            if "vocab_size" in mc:
                plan.config_set.append(("model_config.json", "vocab_size", N))
            for i, a in enumerate(mc.get("init_args") or []):
                if isinstance(a, dict) and "vocab_size" in a:
                    plan.config_set.append(("model_config.json", f"init_args.{i}.vocab_size", N))
    if N == V:
        plan.notes.append(f"the embedding already has {N} rows: no tensor changes")
    return plan


_T = TypeVar("_T")


def _cached(fn: Callable[[], _T]) -> Callable[[], _T]:
    """Compute once; aliases of one table share the result. Released by the writer after use."""
    box: list[_T] = []

    def get() -> _T:
        if not box:
            box.append(fn())
        return box[0]

    return get
