"""Detection: which tensors are the input embedding, the LM head and its bias, their layout, and the tie
state three ways (config flag, head present in the files, head values vs embedding values).

Reads headers, and the data of the embedding and head only (to compare values). Architecture knowledge
comes from :mod:`surgery.architectures`; nothing here names a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from . import architectures as arch
from .checkpoint import Checkpoint
from .errors import CheckpointError, RefusedError
from .formats.tensor import TensorInfo, bf16_bits_to_f32, f32_to_bf16_bits
from .tokenizer import TokenizerInfo, tokenizer_info

VOCAB_HIDDEN = "vocab-hidden"  # [vocab_size, hidden_size]
HIDDEN_VOCAB = "hidden-vocab"  # [hidden_size, vocab_size]
LAYOUTS = (VOCAB_HIDDEN, HIDDEN_VOCAB)


@dataclass
class Comparison:
    """Head vs embedding values.

    Attributes:
        values: ``exact`` (same bytes, as stored), ``transposed`` (head == embedding.T), ``scaled`` (head ==
            embedding × d_model ** -0.5, T5's tied head materialised), ``different``,
            ``absent`` (no head in the files), ``shared`` (the head *is* the embedding: T5, or one storage).
        max_abs_diff: largest |head - embedding| in float32 (after transposing a ``hidden-vocab`` head).
        differing_rows: number of vocab rows with any difference.
        storage_shared: the head and embedding are one array in the file (pickle memo).
    """

    values: str
    max_abs_diff: float | None = None
    differing_rows: int | None = None
    storage_shared: bool = False


@dataclass
class Detection:
    """Everything ``inspect`` shows and every plan needs. Shapes are stored shapes.

    Attributes:
        family: the architecture row (with the loader's facts).
        loader: which library will load the output, and ``loader_source`` says how that was decided.
        embedding: input embedding name, ``[vocab_size, hidden_size]``.
        embedding_aliases: other names for the same table (same storage, or an alias name with equal bytes).
        vocab_aliases: other tensors with the embedding's shape under an alias name (resized together).
        head: the LM head name (present in the files or not), ``head_present``, ``head_layout``.
        bias: LM head bias name (``[vocab]`` or ``[1, vocab]``) and ``bias_aliases``.
        config_tied: the effective ``tie_word_embeddings``; ``config_source`` names where it came from.
        comparison: head vs embedding values.
        problems: findings a user must know about, in words (inconsistent flags, stale vocab_size, ...).
        tp_fraction: when the head's vocab dimension is an exact fraction 1/k of the embedding's, k.
    """

    ckpt: Checkpoint
    family: arch.Family
    loader: str
    loader_source: str
    model_type: str | None
    vocab_rows: int
    hidden: int
    embedding: str
    embedding_aliases: list[str]
    vocab_aliases: list[str]
    head: str
    head_present: bool
    head_layout: str | None
    head_aliases: list[str]
    bias: str | None
    bias_aliases: list[str]
    config_tied: bool
    config_source: str
    config_flags: dict[str, bool]
    comparison: Comparison
    config_vocab_size: int | None
    text_cfg_key: str | None
    tokenizer: TokenizerInfo
    fallback: bool = False
    tp_fraction: int | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def head_info(self) -> TensorInfo | None:
        """The head's header; None exactly when ``head_present`` is False."""
        return self.ckpt.tensors.get(self.head) if self.head_present else None

    @property
    def emb_info(self) -> TensorInfo:
        return self.ckpt.tensors[self.embedding]


def text_config(config: dict) -> tuple[dict, str | None]:
    """The config block of the language model: ``text_config`` (or ``llm_config``) when present."""
    for k in ("text_config", "llm_config", "language_config"):
        if isinstance(config.get(k), dict):
            return config[k], k
    return config, None


def hidden_size_of(cfg: dict) -> int | None:
    for k in ("hidden_size", "d_model", "n_embd", "hidden_dim", "dim"):
        if isinstance(cfg.get(k), int):
            return cfg[k]
    return None


def infer_loader(ckpt: Checkpoint, embedding_name: str | None) -> tuple[str, str]:
    """Which library will load this checkpoint, from the checkpoint itself.

    Order: ``paddleformers_version`` in config.json → PaddleFormers; ``paddlenlp_version`` → PaddleNLP (2.8
    when null or 2.x, as 2.8.1 writes it; 3 when 3.x); PaddleNLP-era name prefixes (``llama.``, ``gpt.``, ...)
    without a version → PaddleNLP 3 (which re-ties Llama/Qwen2 heads), with a note; else the HF naming that
    PaddleFormers reads.
    """
    cfg = ckpt.config
    if "paddleformers_version" in cfg:
        return "paddleformers", f"config.json paddleformers_version = {cfg['paddleformers_version']!r}"
    if "paddlenlp_version" in cfg:
        v = cfg["paddlenlp_version"]
        major = re.match(r"\s*(\d+)", v) if isinstance(v, str) else None
        if major and int(major.group(1)) >= 3:
            return "paddlenlp-3", f"config.json paddlenlp_version = {v!r}"
        return "paddlenlp-2.8", f"config.json paddlenlp_version = {v!r} (PaddleNLP 2.x writes null)"
    first = (embedding_name or "").split(".")[0]
    if first in arch.PADDLENLP_PREFIXES:
        return "paddlenlp-3", (
            f"PaddleNLP names ({first}.*) and no paddlenlp_version in config.json: assumed "
            "PaddleNLP ≥ 3; pass --loader paddlenlp-2.8 if an older PaddleNLP loads it"
        )
    return "hf", "HF-style names (model.*, transformer.*), as PaddleFormers reads them"


def _find(ckpt: Checkpoint, suffixes, exclude=(), ndim: int | None = 2) -> list[str]:
    out = []
    for suf in suffixes:
        for name, t in ckpt.tensors.items():
            if name in exclude or name in out:
                continue
            if arch.matches(name, suf) and (ndim is None or len(t.shape) == ndim):
                out.append(name)
    return out


def _pick(ckpt: Checkpoint, names: list[str], rows: int | None) -> str | None:
    """First candidate (in the table's order of preference) whose rows equal vocab_size, else the first."""
    for n in names:
        if rows is not None and ckpt.tensors[n].shape[0] == rows:
            return n
    return names[0] if names else None


def shared_storage(ckpt: Checkpoint, emb: str, head: str) -> Comparison | None:
    """``exact`` with ``storage_shared`` when the file stores head and embedding as one array (a
    ``.pdparams`` memo alias), told from the file structure without reading values; else None."""
    e_st, h_st = ckpt.tensors[emb].storage, ckpt.tensors[head].storage
    return Comparison("exact", 0.0, 0, storage_shared=True) if e_st is not None and e_st == h_st else None


def compare(
    ckpt: Checkpoint, emb: str, head: str, layout: str, chunk_bytes: int = 1 << 20, scale: float | None = None
) -> Comparison:
    """Compare head and embedding values in row chunks (memory bounded by one chunk of each).

    Chunks of about ``chunk_bytes`` (1 MiB): small enough that a chunk read from the page cache is still
    in the CPU cache when it is compared (2-3x faster than 32 MiB chunks on a 525 MB table), large enough
    that the per-chunk Python cost is negligible.

    A ``hidden-vocab`` head ``[hidden, vocab]`` is compared as its transpose. Identical bits → ``exact``
    (``transposed`` for a transposed head); equal values in another dtype or ``-0.0`` vs ``0.0`` count as
    equal too. Otherwise ``different`` with the float32 max |difference| and the number of differing rows.
    """
    shared = shared_storage(ckpt, emb, head)
    if shared is not None:
        return shared
    e_info, h_info = ckpt.tensors[emb], ckpt.tensors[head]
    eshape = tuple(e_info.shape)
    hshape = tuple(h_info.shape[::-1]) if layout == HIDDEN_VOCAB else tuple(h_info.shape)
    if len(eshape) != 2 or hshape != eshape:
        return Comparison("different")
    equal = "transposed" if layout == HIDDEN_VOCAB else "exact"
    e_bf = ckpt.logical_dtype(e_info) == "bfloat16"
    h_bf = ckpt.logical_dtype(h_info) == "bfloat16"
    bit_equal = e_info.storage_dtype == h_info.storage_dtype and e_bf == h_bf and scale is None
    bits = (
        np.dtype(f"<u{e_info.storage_dtype.itemsize}")
        if e_info.storage_dtype.itemsize in (1, 2, 4, 8)
        else None
    )
    bit_equal = bit_equal and bits is not None
    if scale is not None:
        equal = "scaled"
    hT = ckpt.load(head).T if layout == HIDDEN_VOCAB else None  # columns of the stored head: a mapped array
    row_bytes = max(1, e_info.nbytes // max(1, eshape[0]))
    # a transposed head is gathered column by column from a mapping: larger chunks amortize the strides
    chunk_rows = max(1, (chunk_bytes * (8 if hT is not None else 1)) // row_bytes)

    def part(start: int, stop: int) -> tuple[float, int]:
        """max |diff| and differing rows over rows start:stop (0.0, 0 when bit-identical)."""
        if hT is not None:
            h_chunks = (
                np.ascontiguousarray(hT[s : min(s + chunk_rows, stop)])
                for s in range(start, stop, chunk_rows)
            )
        else:
            h_chunks = ckpt.iter_rows(head, chunk_rows, start, stop)
        max_diff, rows, bit_eq = 0.0, 0, bit_equal
        # the same rows of two tables of one shape, in the same chunks
        for a, b in zip(ckpt.iter_rows(emb, chunk_rows, start, stop), h_chunks, strict=True):
            if bit_eq and np.array_equal(a.view(bits), b.view(bits)):  # bits, not values (-0.0, NaN)
                continue
            bit_eq = False
            fa = bf16_bits_to_f32(a) if e_bf else a.astype(np.float32)
            fb = bf16_bits_to_f32(b) if h_bf else b.astype(np.float32)
            if (
                scale is not None
            ):  # the embedding times the scale, rounded to the head's dtype as untie writes it
                fa = fa * np.float32(scale)
                fa = bf16_bits_to_f32(f32_to_bf16_bits(fa)) if h_bf else fa.astype(b.dtype).astype(np.float32)
            with np.errstate(invalid="ignore", over="ignore"):
                d = np.abs(fa - fb)
            d = np.where(np.isnan(fa) & np.isnan(fb), 0.0, np.where(np.isnan(d), np.inf, d))
            if d.size:
                max_diff = max(max_diff, float(d.max()))
                rows += int((d > 0).any(axis=tuple(range(1, d.ndim))).sum())
        return max_diff, rows

    # two halves in two threads: reads and numpy release the GIL, so a multi-GB pair compares ~2x faster
    n = eshape[0]
    if e_info.nbytes >= 64 << 20:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            parts = list(pool.map(lambda r: part(*r), [(0, n // 2), (n // 2, n)]))
    else:
        parts = [part(0, n)]
    max_diff, rows = max(p[0] for p in parts), sum(p[1] for p in parts)
    if rows == 0:
        return Comparison(equal, 0.0, 0)
    return Comparison("different", max_diff, rows)


def detect(
    ckpt: Checkpoint,
    layout: str | None = None,
    loader: str | None = None,
    compare_values: bool = True,
    embedding_name: str | None = None,
    head_name: str | None = None,
) -> Detection:
    """Find embedding, head, bias and tie state of ``ckpt``.

    Args:
        layout: ``vocab-hidden`` / ``hidden-vocab`` to override the head layout decision (needed when
            vocab_size == hidden_size and a head is present).
        loader: one of ``architectures.LOADERS`` to override :func:`infer_loader`.
        compare_values: read the embedding and head data to compare them (inspect and tie do).
        embedding_name, head_name: the tensor names to use (``--embedding`` / ``--head``), for architectures
            the table does not know.

    Raises:
        CheckpointError: no input embedding can be found, or a named tensor does not exist.
        RefusedError: the embedding can only be guessed by shape and several tensors fit.
    """
    for n, what in ((embedding_name, "--embedding"), (head_name, "--head")):
        if n is not None and n not in ckpt.tensors:
            raise CheckpointError(
                f"{what} {n}: no such tensor",
                ckpt.path,
                "tietool inspect lists the tensors; pass a name from the weight files",
            )
    cfg = ckpt.config
    tcfg, tkey = text_config(cfg)
    model_type = cfg.get("model_type")
    if tkey and not any(model_type in r["model_types"] for r in arch.FAMILIES if isinstance(model_type, str)):
        model_type = tcfg.get("model_type", model_type)
    bad_type = model_type is not None and not isinstance(model_type, str)
    if bad_type:
        model_type = None
    vocab_size = tcfg.get("vocab_size", cfg.get("vocab_size"))
    vocab_size = vocab_size if isinstance(vocab_size, int) else None
    hidden = hidden_size_of(tcfg) or hidden_size_of(cfg)

    probe = arch.lookup(model_type, "hf")
    embedding: str | None
    if embedding_name is not None:
        embedding = embedding_name
    else:
        embedding = _pick(ckpt, _find(ckpt, probe.embedding), vocab_size)
    fallback = False
    notes: list[str] = []
    problems: list[str] = []
    if bad_type:
        problems.append("config.json model_type is not a string; ignored")
    if embedding is None:
        # not in the table: shape search against config vocab_size / hidden_size
        cands = [
            n
            for n, t in ckpt.tensors.items()
            if len(t.shape) == 2
            and vocab_size
            and hidden
            and tuple(t.shape) == (vocab_size, hidden)
            and n != head_name
        ]
        hinted = [n for n in cands if any(k in n for k in ("embed", "wte", "shared", "word", "tok"))]
        if not cands:
            raise CheckpointError(
                f"no input embedding found (model_type {model_type!r}: no tensor named like "
                f"{', '.join(probe.embedding[:3])}, and none of shape [vocab_size, hidden_size] = "
                f"[{vocab_size}, {hidden}])",
                ckpt.path,
                "pass --embedding NAME (and --head NAME), or check config.json vocab_size/hidden_size",
            )
        if len(cands) > 1 and len(hinted) != 1:
            raise RefusedError(
                f"model_type {model_type!r} is not in the architecture table and {len(cands)} tensors have "
                f"the embedding's shape [{vocab_size}, {hidden}]: {', '.join(cands[:6])}",
                ckpt.path,
                "pass --embedding NAME and --head NAME to say which is which",
            )
        cands = hinted or cands
        embedding = cands[0]
        fallback = True
        notes.append(
            f"model_type {model_type!r} is not in the architecture table: found the embedding "
            f"{embedding} by its shape [vocab_size, hidden_size]"
        )
    if not probe.known and not fallback:
        notes.append(
            f"model_type {model_type!r} is not in the architecture table: names matched by the "
            "common patterns"
        )

    if loader is None:
        loader, loader_source = infer_loader(ckpt, embedding)
    else:
        loader_source = "--loader"
    fam = arch.lookup(model_type, loader)

    e_info = ckpt.tensors[embedding]
    V, H = e_info.shape
    if hidden is not None and H != hidden:
        problems.append(
            f"the embedding {embedding} is {list(e_info.shape)} but config hidden_size is {hidden}"
        )

    # aliases: same storage, or a known alias name with identical shape and bytes
    same_storage = [
        n
        for n, t in ckpt.tensors.items()
        if n != embedding and e_info.storage is not None and t.storage == e_info.storage
    ]
    alias_named = [
        n
        for n in _find(ckpt, fam.aliases + fam.embedding, exclude=(embedding,))
        if ckpt.tensors[n].shape == e_info.shape
    ]
    # the head
    head_cands = _find(ckpt, fam.head, exclude=(embedding,), ndim=None)
    head = head_cands[0] if head_cands else None
    head_present = head is not None
    if head_name is not None:
        head, head_present = head_name, True
    elif head is None and not fam.known:
        # fallback: the other 2-D tensor of shape {V, H}, if there is exactly one
        others = [
            n
            for n, t in ckpt.tensors.items()
            if n != embedding and n not in alias_named and len(t.shape) == 2 and set(t.shape) == {V, H}
        ]
        if len(others) == 1:
            head, head_present = others[0], True
            notes.append(f"found the head {head} by its shape")
        elif others:
            raise RefusedError(
                f"model_type {model_type!r} is not in the architecture table and several tensors "
                f"could be the head: {', '.join(others[:6])}",
                ckpt.path,
                "pass --head NAME (and --embedding NAME)",
            )
    if head is None:
        head = _default_head_name(fam)
    head_aliases = []
    if head_present:
        h_info = ckpt.tensors[head]
        if h_info.storage is not None:
            head_aliases = [
                n
                for n, t in ckpt.tensors.items()
                if n not in (head, embedding) and t.storage == h_info.storage and n in head_cands
            ]
    emb_aliases = [
        n for n in dict.fromkeys(same_storage + alias_named) if n != head and n not in head_aliases
    ]
    if ckpt.tensors and emb_aliases:
        eq = []
        for n in emb_aliases:
            if n in same_storage or compare(ckpt, embedding, n, VOCAB_HIDDEN).values == "exact":
                eq.append(n)
        vocab_aliases = [n for n in emb_aliases if n not in eq]
        emb_aliases = eq
    else:
        vocab_aliases = []

    # head layout
    head_layout = None
    tp = None
    if head_present:
        hs = ckpt.tensors[head].shape
        if len(hs) != 2:
            problems.append(f"the head {head} has shape {list(hs)}, not 2-D")
            head_layout = None
        elif layout in LAYOUTS and set(hs) == {V, H}:
            head_layout = layout
        elif V == H and tuple(hs) == (V, H):
            head_layout = "ambiguous"
        elif tuple(hs) == (V, H):
            head_layout = VOCAB_HIDDEN
        elif tuple(hs) == (H, V):
            head_layout = HIDDEN_VOCAB
        else:
            a, b = hs
            for rows, other in ((a, b), (b, a)):
                if other == H and rows and rows < V and V % rows == 0:
                    tp = V // rows
                    problems.append(
                        f"the head {head} {list(hs)} has {rows} vocab rows, exactly 1/{tp} of the "
                        f"embedding's {V}: likely an unmerged tensor-parallel shard (merge the "
                        "tensor-parallel slices first)"
                    )
                    break
            else:
                problems.append(
                    f"the head {head} has shape {list(hs)}, which fits neither [vocab, hidden] = "
                    f"[{V}, {H}] nor [hidden, vocab]"
                )
            head_layout = None

    # bias
    bias_names = _find(ckpt, fam.bias, ndim=None)
    bias = bias_names[0] if bias_names else None
    bias_aliases = []
    if bias:
        b_info = ckpt.tensors[bias]
        for n in bias_names[1:]:
            t = ckpt.tensors[n]
            if (b_info.storage is not None and t.storage == b_info.storage) or (
                t.shape == b_info.shape and np.array_equal(ckpt.load(n), ckpt.load(bias))
            ):
                bias_aliases.append(n)

    # config flag
    flags = {}
    if isinstance(cfg.get("tie_word_embeddings"), bool):
        flags["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    if tkey and isinstance(tcfg.get("tie_word_embeddings"), bool):
        flags[f"{tkey}.tie_word_embeddings"] = tcfg["tie_word_embeddings"]
    if tkey and f"{tkey}.tie_word_embeddings" in flags:
        source = f"{tkey}.tie_word_embeddings"
    elif "tie_word_embeddings" in flags:
        source = "tie_word_embeddings"
    else:
        source = None
    if source:
        config_tied = flags[source]
    else:
        config_tied = fam.tie_default
        source = f"default for {model_type or 'unknown model_type'} under {loader} (key absent)"
    if len(set(flags.values())) > 1:
        problems.append(
            "tie_word_embeddings flags disagree: "
            + ", ".join(f"{k} = {str(v).lower()}" for k, v in flags.items())
            + f"; {tkey} governs the language model, so {source} is used"
        )

    # values
    seen = ""  # what the values say about an ambiguous layout, when compared
    if not head_present:
        if fam.tied_logit_scale or (config_tied and fam.name == "t5"):
            comp = Comparison("shared")
        else:
            comp = Comparison("absent")
    elif head_layout is None:
        comp = Comparison("different")
    elif not compare_values:  # the file structure alone can still tell one array under two names
        comp = shared_storage(ckpt, embedding, head) or Comparison("unknown")
    elif head_layout == "ambiguous":
        as_stored = compare(ckpt, embedding, head, VOCAB_HIDDEN)
        transposed = compare(ckpt, embedding, head, HIDDEN_VOCAB)
        if as_stored.values != "exact" and transposed.values == "transposed":
            comp = transposed
        else:
            comp = as_stored
        seen = (
            f" (as stored: {as_stored.values}; transposed: "
            f"{'equal' if transposed.values == 'transposed' else 'different'})"
        )
    else:
        comp = compare(ckpt, embedding, head, head_layout)
        if comp.values == "different" and fam.tied_logit_scale:
            scaled = compare(ckpt, embedding, head, head_layout, scale=tied_scale(ckpt.config, H))
            if scaled.values == "scaled":
                comp = scaled
                notes.append(
                    f"{head} equals {embedding} × d_model ** -0.5: the tied head of {fam.name}, "
                    "materialised (as tietool untie writes it)"
                )

    if head_present and head_layout == "ambiguous":
        notes.append(
            f"vocab_size == hidden_size ({V}): the head's layout cannot be told from its shape{seen}; "
            "pass --layout vocab-hidden or hidden-vocab"
        )

    # consistency findings
    if head_present and comp.values == "different" and config_tied and comp.max_abs_diff is not None:
        problems.append(
            f"tied in config ({source} = true) but {head} differs from {embedding}: "
            f"max |difference| {comp.max_abs_diff:.3g} in {comp.differing_rows} of {V} rows; a loader "
            "that re-ties ignores the head's values"
        )
    if not head_present and config_tied and not fam.reties and comp.values != "shared":
        problems.append(
            f"no head in the files, and the {loader} loader does not re-tie a missing head: it would "
            f"load a random {head} (run untie to write it, or pass --loader if another library loads it)"
        )
    if not head_present and not config_tied:
        problems.append(
            f"untied in config ({source} = false) but no head ({head}) was found in the files: "
            "effectively tied; a loader would fail or initialise a random head "
            "(tie fixes the flag; untie writes the head as a copy of the embedding)"
        )
    cvs = vocab_size
    if cvs is not None and cvs != V:
        problems.append(
            f"config vocab_size is {cvs} but the embedding {embedding} has {V} rows "
            f"(resize --vocab {V} fixes vocab_size)"
        )
    tok = tokenizer_info(ckpt.path)
    if tok.size is not None:
        if tok.size < V:
            notes.append(
                f"the embedding has {V} rows and the tokenizer defines {tok.size} tokens "
                f"(highest id {tok.size - 1}): {V - tok.size} padding rows beyond the tokenizer "
                "(normal when vocab_size is padded to a multiple; trimming below "
                f"{tok.size} would break tokens)"
            )
        elif tok.size > V:
            problems.append(
                f"the tokenizer defines {tok.size} tokens (highest id {tok.size - 1}, from "
                f"{', '.join(tok.sources)}) but the embedding has only {V} rows: the model is "
                f"{tok.size - V} row(s) short (resize --vocab {tok.size})"
            )
    for n in tok.unreadable:
        problems.append(f"tokenizer file {n} could not be read")

    return Detection(
        ckpt=ckpt,
        family=fam,
        loader=loader,
        loader_source=loader_source,
        model_type=model_type,
        vocab_rows=V,
        hidden=H,
        embedding=embedding,
        embedding_aliases=emb_aliases,
        vocab_aliases=vocab_aliases,
        head=head,
        head_present=head_present,
        head_layout=head_layout,
        head_aliases=head_aliases,
        bias=bias,
        bias_aliases=bias_aliases,
        config_tied=config_tied,
        config_source=source,
        config_flags=flags,
        comparison=comp,
        config_vocab_size=cvs,
        text_cfg_key=tkey,
        tokenizer=tok,
        fallback=fallback,
        tp_fraction=tp,
        problems=problems,
        notes=notes,
    )


def tied_scale(config: dict, hidden: int) -> float:
    """T5's tied-logit factor ``d_model ** -0.5``."""
    d_model = config.get("d_model")
    d = d_model if isinstance(d_model, int) else hidden
    return float(d) ** -0.5


def _default_head_name(fam: arch.Family) -> str:
    """Name for a head that is not in the files: the family's first head name, at the top level
    (``lm_head.weight``), as every loader in the table names it."""
    return fam.head[0]
