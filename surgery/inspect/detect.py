"""Detection: the vocabulary surface of a checkpoint (every tensor with a vocabulary axis, each with a
role), the main input embedding and LM head among them, the head's layout, and the tie state three ways
(config flag, head present in the files, head values vs embedding values).

Reads headers, and the data of the embedding and head only (to compare values). Architecture knowledge
comes from :mod:`surgery.arch`; nothing here names a model. The main pair is chosen by the table's
order of preference, then by module depth (the model's own table beats a copy inside a layer), never by
file order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .. import arch
from ..io.checkpoint import Checkpoint
from ..io.surface import quant_module
from ..io.tokenizer import SpecialTokenId, TokenizerInfo, special_token_ids, tokenizer_info
from ..model.enums import LAYOUTS, Container, FoundBy, HeadLayout, TensorRole, TieState
from ..model.errors import CheckpointError, Opt, RefusedError, UsageError
from ..model.tensor import FLOAT_DTYPES, TensorInfo, bf16_bits_to_f32, f32_to_bf16_bits
from ..model.tokens import TokenizerSet
from . import chunked
from .findings import Finding, FindingKind, Fix, OneOf, Severity
from .vocabularies import (
    Vocabulary,
    ambiguous_sizes,
    derived_sizes,
    dtype_kind,
    float_counts,
    sized_by,
    table_size_key,
    text_block,
    vocabularies,
)


@dataclass
class Comparison:
    """Head vs embedding values.

    Attributes:
        values: a :class:`~surgery.model.enums.TieState`: ``exact`` (same bytes, as stored),
            ``transposed`` (head == embedding.T), ``scaled`` (head == embedding × d_model ** -0.5, T5's tied
            head materialised), ``different``, ``absent`` (no head in the files), ``shared`` (the head *is*
            the embedding: T5, or one storage), ``no_embedding`` (the embedding is missing; the head holds
            the only table), ``unknown`` (not compared).
        max_abs_diff: largest |head - embedding| in float32 (after transposing a ``hidden-vocab`` head).
        differing_rows: number of vocab rows with any difference.
        storage_shared: the head and embedding are one array in the file (pickle memo).
        drift: how the difference is spread over the rows (only when ``values`` is ``different`` and the
            values were compared).
    """

    values: TieState
    max_abs_diff: float | None = None
    differing_rows: int | None = None
    storage_shared: bool = False
    drift: Drift | None = None


DRIFT_EDGES = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
"""Upper edges of the drift histogram's bins of per-row max |Δ|: 0, (0, 1e-6], (1e-6, 1e-5], ..., (0.1, 1],
> 1 (so ``len(DRIFT_EDGES) + 2`` bins)."""
DRIFT_TOP = 10
"""How many rows with the largest max |Δ| a :class:`Drift` names."""


@dataclass(frozen=True)
class Drift:
    """How a head that differs from the embedding differs, row by row (vocab rows; a ``[hidden, vocab]`` head
    is compared as its transpose). All |Δ| are float32 ``|head - embedding|`` as :func:`compare` computes
    them (NaN vs NaN is 0, another NaN difference is infinite).

    Attributes:
        rows: the vocab rows compared (``V``); ``elements``: ``V × hidden``.
        differing_rows: rows with any element that differs.
        max_abs_diff: the largest |Δ| of any element.
        mean_abs_diff: the mean |Δ| over *all* elements (equal ones included), summed in float64.
        top_rows: up to :data:`DRIFT_TOP` ``(row, max |Δ| of the row)`` of differing rows, largest first
            (ties by row id).
        histogram: the number of rows per bin of their max |Δ| (bins of :data:`DRIFT_EDGES`; the first is
            |Δ| = 0, the rows that do not differ).
    """

    rows: int
    elements: int
    differing_rows: int
    max_abs_diff: float
    mean_abs_diff: float
    top_rows: tuple[tuple[int, float], ...]
    histogram: tuple[int, ...]


@dataclass(frozen=True)
class VocabTensor:
    """One tensor of the vocabulary surface.

    Attributes:
        name: the tensor's name (for a missing input embedding, the name it would have).
        role: what it is.
        vocab_axis: the axis the vocabulary runs along (0: rows; 1: columns of a ``[hidden, vocab]``
            head; -1: the last axis of a bias); None when it has no axis of the embedding's size.
        entries: the number of vocabulary entries along that axis.
        of: the main tensor it copies or aliases (embedding or head), when it is one.
        present: False only for a missing input embedding.
        vocabulary: the config key of the vocabulary it is indexed by when that is not the embedding's
            (``draft_vocab_size``, ``talker_config.vocab_size``); None: the embedding's.
    """

    name: str
    role: TensorRole
    vocab_axis: int | None
    entries: int | None
    of: str | None = None
    present: bool = True
    vocabulary: str | None = None


@dataclass(frozen=True)
class LayoutConflict:
    """A requested head layout that contradicts the head's shape (vocab_size != hidden_size)."""

    head: str
    shape: tuple[int, ...]
    requested: HeadLayout
    fits: HeadLayout


@dataclass(frozen=True)
class ConfigFacts:
    """What the configuration says about the vocabulary.

    Attributes:
        model_type: the language model's ``model_type`` (None: absent or not a string).
        vocab_size: the value of ``vocab_key``, the config key (dotted) that sizes the embedding's
            vocabulary.
        text_key: the dotted path of the language model's config block (``text_config``; None: the top
            level).
        vocabularies: every vocabulary the config names.
        unclear_text: the config blocks that could each be the text model's, when the choice is not clear.
    """

    model_type: str | None
    vocab_size: int | None
    vocab_key: str | None
    text_key: str | None
    vocabularies: tuple[Vocabulary, ...] = ()
    unclear_text: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoaderChoice:
    """Which library will load the output (``name``: a :class:`~surgery.model.enums.Loader` value), and
    ``source``: how that was decided (config.json's version key, the names, or the caller)."""

    name: str
    source: str


@dataclass
class EmbeddingMatch:
    """The input embedding as found.

    Attributes:
        name: its name, ``[rows, hidden]``; when ``present`` is False, the name it would have (the table is
            then stored only as the head ``stored_as``).
        found_by: how it was found.
        aliases: other names for the same table (same storage, or an alias name with equal bytes).
        vocab_aliases: other tensors with the embedding's shape under an alias name (resized together).
    """

    name: str
    rows: int
    hidden: int
    present: bool = True
    found_by: FoundBy = FoundBy.TABLE
    stored_as: str | None = None
    aliases: list[str] = field(default_factory=list)
    vocab_aliases: list[str] = field(default_factory=list)

    @property
    def by_shape(self) -> bool:
        """Found by its shape alone (a model type the table does not know)."""
        return self.found_by is FoundBy.SHAPE


@dataclass
class HeadMatch:
    """The LM head: in the files (``present``) or not (``name``: the name untie would write).

    Attributes:
        layout: how it lies (None: not in the files, or unusable; ``AMBIGUOUS``: square, no layout given).
        rows: its vocabulary entries (may differ from the embedding's rows: reserved rows).
        aliases: other names of the same storage under a head name.
        tp_fraction: when its vocab dimension is an exact fraction 1/k of the embedding's, k.
        vocab: the config key of another vocabulary that counts its rows (an EAGLE-3 draft head over
            ``draft_vocab_size``); None: the embedding's vocabulary.
        conflict: a requested layout that contradicts its shape.
    """

    name: str
    present: bool
    layout: HeadLayout | None = None
    rows: int | None = None
    aliases: list[str] = field(default_factory=list)
    tp_fraction: int | None = None
    vocab: str | None = None
    conflict: LayoutConflict | None = None


@dataclass
class BiasMatch:
    """The LM head bias (``[vocab]`` or ``[1, vocab]``) and its aliases (same storage or bytes)."""

    name: str
    aliases: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TieFlag:
    """The effective ``tie_word_embeddings`` (``tied``), where it came from (``source``: a config key, or
    the family's default under the loader), and every flag found."""

    tied: bool
    source: str
    flags: dict[str, bool] = field(default_factory=dict)


@dataclass
class Beyond:
    """The vocabulary surface beyond the main pair and its aliases.

    Attributes:
        extra_tables: further vocabulary tables (MTP embed/head copies, per-layer token tables).
        by_shape: tensors of no known name or rule with an axis of the vocabulary's size.
        token_tables: integer/boolean tensors a :data:`~surgery.arch.TOKEN_TABLES` rule covers,
            with the rule (indexed by the embedding's vocabulary, or keyed to it by value).
        other_vocab: tensors sized by another vocabulary the config names → its key (kept by resize).
    """

    extra_tables: list[str] = field(default_factory=list)
    by_shape: list[str] = field(default_factory=list)
    token_tables: dict[str, arch.TokenTable] = field(default_factory=dict)
    other_vocab: dict[str, str] = field(default_factory=dict)


@dataclass
class Detection:
    """Everything ``inspect`` shows and every plan needs, grouped by role. Shapes are stored shapes.

    Attributes:
        ckpt: the checkpoint.
        config: what the config says (:class:`ConfigFacts`).
        family: the architecture row (with the loader's facts).
        loader: which library will load the output and how that was decided (:class:`LoaderChoice`).
        embedding, head, bias: the main tables (:class:`EmbeddingMatch`, :class:`HeadMatch`,
            :class:`BiasMatch` or None without a bias).
        tie: the effective ``tie_word_embeddings`` (:class:`TieFlag`).
        comparison: head vs embedding values (``values``: a :class:`~surgery.model.enums.TieState`).
        beyond: the surface beyond the main tables (:class:`Beyond`); :attr:`surface` lists it all by role.
        tokenizer: the tokenizer files' facts; ``special_ids``: token ids the configuration files name.
        findings: what a user should know, as data (:mod:`surgery.inspect.findings`; ``problems`` and
            ``notes`` select them by severity, :func:`~surgery.inspect.findings.describe` words them).
    """

    ckpt: Checkpoint
    config: ConfigFacts
    family: arch.Family
    loader: LoaderChoice
    embedding: EmbeddingMatch
    head: HeadMatch
    bias: BiasMatch | None
    tie: TieFlag
    comparison: Comparison
    beyond: Beyond
    tokenizer: TokenizerInfo
    special_ids: tuple[SpecialTokenId, ...] = ()
    findings: list[Finding] = field(default_factory=list)

    @property
    def vocab_rows(self) -> int:
        """The embedding's rows (the vocabulary the files hold)."""
        return self.embedding.rows

    @property
    def hidden(self) -> int:
        """The embedding's hidden size."""
        return self.embedding.hidden

    @property
    def bias_names(self) -> list[str]:
        """The head bias and its aliases ([] without a bias)."""
        return [self.bias.name, *self.bias.aliases] if self.bias else []

    @property
    def problems(self) -> list[Finding]:
        """The findings a user must know about (inconsistent flags, stale vocab_size, ...), in order."""
        return [f for f in self.findings if f.severity is Severity.PROBLEM]

    @property
    def notes(self) -> list[Finding]:
        """The findings that are context (how names were matched, padding rows, ...), in order."""
        return [f for f in self.findings if f.severity is Severity.NOTE]

    def problems_about(self, name: str) -> list[Finding]:
        """The problems about the tensor ``name`` (those listing it in ``tensors``), in order."""
        return [f for f in self.problems if name in f.tensors]

    @property
    def head_info(self) -> TensorInfo | None:
        """The head's header; None exactly when the head is not in the files."""
        return self.ckpt.tensors.get(self.head.name) if self.head.present else None

    @property
    def emb_info(self) -> TensorInfo:
        """The embedding's header (the head's when the embedding is missing and stored as the head)."""
        return self.ckpt.tensors[self.embedding.name if self.embedding.present else self.head.name]

    def vocab_axis(self, name: str) -> int | None:
        """The axis of ``name`` the vocabulary runs along (see :class:`VocabTensor`); None for a 0-D tensor
        (a damaged head has no axis at all)."""
        t, head, beyond = self.ckpt.tensors[name], self.head, self.beyond
        if not t.shape:
            return None
        if name in beyond.token_tables:
            return 0
        if name in beyond.other_vocab:
            key = beyond.other_vocab[name]
            size = next((v.size for v in self.config.vocabularies if v.key == key), None)
            return list(t.shape).index(size) if size in t.shape else None
        if name == head.name or name in head.aliases:
            return 1 if head.layout == HeadLayout.HIDDEN_VOCAB else 0
        if len(t.shape) == 1 or name in self.bias_names:
            return -1
        rows = self.vocab_rows
        if t.shape[0] in (rows, head.rows) and t.shape[-1] == self.hidden:
            return 0
        if len(t.shape) == 2 and t.shape[1] in (rows, head.rows) and t.shape[0] == self.hidden:
            return 1
        if name in beyond.by_shape and rows in t.shape:  # an integer tensor of no rule: its vocabulary axis
            return list(t.shape).index(rows)
        return None

    @property
    def surface(self) -> dict[TensorRole, list[VocabTensor]]:
        """Every vocabulary tensor, grouped by role (roles with no tensor are left out)."""
        out: dict[TensorRole, list[VocabTensor]] = {}
        emb, head, beyond = self.embedding, self.head, self.beyond

        def add(name: str, role: TensorRole, of: str | None = None, present: bool = True) -> None:
            axis = self.vocab_axis(name) if present else 0
            entries = self.ckpt.tensors[name].shape[axis] if present and axis is not None else None
            vocab = beyond.other_vocab.get(name) or (head.vocab if name == head.name else None)
            out.setdefault(role, []).append(
                VocabTensor(name, role, axis, entries if present else self.vocab_rows, of, present, vocab)
            )

        add(emb.name, TensorRole.INPUT_EMBEDDING, present=emb.present)
        for n in emb.aliases + emb.vocab_aliases:
            add(n, TensorRole.EMBEDDING_ALIAS, emb.name)
        if head.present:
            add(head.name, TensorRole.LM_HEAD)
            for n in head.aliases:
                add(n, TensorRole.HEAD_ALIAS, head.name)
        if self.bias:
            add(self.bias.name, TensorRole.HEAD_BIAS)
            for n in self.bias.aliases:
                add(n, TensorRole.HEAD_BIAS, self.bias.name)
        for n in beyond.extra_tables:
            add(n, TensorRole.EXTRA_TABLE)
        for n, rule in beyond.token_tables.items():
            add(n, TensorRole.TOKEN_TABLE if rule.indexed_by == "vocab" else TensorRole.TOKEN_ID_MAP)
        for n in beyond.other_vocab:
            if n not in beyond.token_tables:
                add(n, TensorRole.OTHER_VOCABULARY)
        for n in beyond.by_shape:
            add(n, TensorRole.BY_SHAPE)
        return out


def text_config(config: dict) -> tuple[dict, str | None]:
    """The config block of the language model and its dotted path (None: the top level):
    :func:`surgery.inspect.vocabularies.text_block`."""
    tb = text_block(config)
    return tb.block, tb.key


def hidden_size_of(cfg: dict) -> int | None:
    """The hidden size a config block names (``hidden_size``, ``d_model``, ``n_embd``, ...), else None."""
    for k in arch.HIDDEN_SIZE_KEYS:
        if isinstance(cfg.get(k), int):
            return cfg[k]
    return None


def infer_loader(ckpt: Checkpoint, embedding_name: str | None) -> tuple[str, str]:
    """Which library will load this checkpoint, from the checkpoint itself: ``(loader, why)``.

    Order: ``paddleformers_version`` in config.json → PaddleFormers; ``paddlenlp_version`` → PaddleNLP (2.8
    when null or 2.x, as 2.8.1 writes it; 3 when 3.x); PaddleNLP-era name prefixes (``llama.``, ``gpt.``, ...)
    without a version → PaddleNLP 3 (which re-ties Llama/Qwen2 heads), with a note. Then the container
    decides. HF transformers reads no ``.pdparams`` (a pickle; its ``from_pretrained`` looks for
    ``*.safetensors`` / ``*.bin``), so a ``.pdparams`` folder with HF-style names is PaddleFormers'
    (``load_checkpoint_format="legacy"``), whatever ``transformers_version`` its config carries; unless
    PaddleFormers 1.2 has no class for its ``model_type`` (GPT-2, BART, T5, ...: ``PADDLEFORMERS_LACKS``):
    then no Paddle library reads it, and the library whose names it holds, HF transformers, reads it once
    ``convert --to safetensors`` has changed the container (names and bytes kept), so ``hf``, whose
    ``hf``/``pdparams`` rows are proven on that route (``surgery.arch.HF_PDPARAMS_PROVEN``). A safetensors
    folder with HF-style names is read by PaddleFormers and transformers alike and takes the ``hf`` rows
    (``transformers_version`` names transformers when present). Raises nothing.
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
            f"PaddleNLP ≥ 3; pass {Opt('loader', 'paddlenlp-2.8')} if an older PaddleNLP loads it"
        )
    if ckpt.format == Container.PDPARAMS:
        mt = cfg.get("model_type")
        lacks = arch.paddleformers_lacks(mt) if isinstance(mt, str) else None
        if lacks is None:
            return "paddleformers", (
                "HF-style names in .pdparams and no library version in config.json: PaddleFormers' legacy "
                "load (HF transformers reads no .pdparams)"
            )
        return "hf", (
            f"HF-style names of {lacks} ({mt}) in .pdparams, which no Paddle library reads: HF transformers "
            f"reads them once {Opt('to', 'safetensors')} of tietool convert has changed the container (it "
            "reads no .pdparams)"
        )
    if "transformers_version" in cfg:
        return "hf", f"config.json transformers_version = {cfg['transformers_version']!r}"
    return "hf", "HF-style names (model.*, transformer.*), as PaddleFormers reads them"


@dataclass(frozen=True)
class _Cfg:
    """The config facts detection needs: the language model's block ``tcfg`` at dotted path ``tkey``
    (``unclear``: the candidate blocks when several could be it), the key sizing its table
    (``vocab_key``) and its value, every vocabulary the config names, and the sizes that cannot tell a
    vocabulary axis (:func:`~surgery.inspect.vocabularies.ambiguous_sizes`)."""

    model_type: str | None
    bad_type: bool
    vocab_size: int | None
    hidden: int | None
    tcfg: dict
    tkey: str | None
    vocab_key: str | None = None
    vocabs: tuple[Vocabulary, ...] = ()
    unclear: tuple[str, ...] = ()
    ambiguous: frozenset[int] = frozenset()
    derived: frozenset[int] = frozenset()


def _config_facts(ckpt: Checkpoint) -> _Cfg:
    """model_type (the language model's, in a multimodal config whose own type the table does not know;
    the family whose names the files hold where a model type is shared, :func:`arch.model_type_by_names`),
    the language model's block (``text_config`` at any nesting,
    :func:`~surgery.inspect.vocabularies.text_block`),
    the key sizing its vocabulary and the hidden size from config.json."""
    cfg = ckpt.config
    tb = text_block(cfg, lambda: tokenizer_info(ckpt.path).size)
    tcfg, tkey = tb.block, tb.key
    model_type = cfg.get("model_type")
    if tkey and not (isinstance(model_type, str) and arch.family_row(model_type)):
        model_type = tcfg.get("model_type", model_type)
    bad_type = model_type is not None and not isinstance(model_type, str)
    if not bad_type:
        model_type = arch.model_type_by_names(model_type, ckpt.tensors)
    key = table_size_key(tcfg, tkey) or table_size_key(cfg, None)
    vocab_size = get_dotted_int(cfg, key)
    hidden = hidden_size_of(tcfg) or hidden_size_of(cfg)
    return _Cfg(
        model_type=None if bad_type else model_type,
        bad_type=bad_type,
        vocab_size=vocab_size,
        hidden=hidden,
        tcfg=tcfg,
        tkey=tkey,
        vocab_key=key if vocab_size is not None else None,
        vocabs=tuple(vocabularies(cfg)),
        unclear=tb.unclear,
        ambiguous=frozenset(ambiguous_sizes(tcfg, hidden) | ambiguous_sizes(cfg, hidden)),
        derived=frozenset(derived_sizes(tcfg, hidden) | derived_sizes(cfg, hidden)),
    )


def _settle_text(ckpt: Checkpoint, cf: _Cfg, rows: int) -> _Cfg:
    """An unclear text block settled by a named embedding: the one candidate block whose vocabulary has the
    embedding's ``rows`` becomes the language model's (unchanged otherwise)."""
    fits = [
        b
        for b in cf.unclear
        if get_dotted_int(ckpt.config, table_size_key(_block_at(ckpt.config, b), b)) == rows
    ]
    if len(fits) != 1:
        return cf
    block = _block_at(ckpt.config, fits[0])
    key = table_size_key(block, fits[0])
    return replace(cf, tcfg=block, tkey=fits[0], vocab_key=key, vocab_size=rows, unclear=())


def get_dotted_int(cfg: dict, key: str | None) -> int | None:
    """The integer at dotted ``key`` of ``cfg`` (None when absent, not an integer, or ``key`` is None)."""
    v: object = cfg
    for part in (key or "").split(".") if key else []:
        v = v.get(part) if isinstance(v, dict) else None
    return v if key and isinstance(v, int) and not isinstance(v, bool) else None


def _ranked(
    ckpt: Checkpoint, suffixes, rows: int | None = None, exclude=(), ndim: int | None = 2
) -> list[str]:
    """Tensors named by ``suffixes``, best first: the table's order of preference, then outside a numbered
    block (a copy inside a layer comes last), then ``rows`` vocab rows, then module depth (shallowest
    first), then name. File order never counts; a listed extra table (MTP copies) is never a candidate."""
    found: dict[str, tuple] = {}
    ends = tuple(suffixes)  # one C-level pass keeps the names that can match (a header may hold millions)
    near = {n: t for n, t in ckpt.tensors.items() if n.endswith(ends)}
    for i, suf in enumerate(ends):
        for name, t in near.items():
            if not arch.matches(name, suf) or name in exclude or name in found or arch.is_listed_extra(name):
                continue
            if ndim is None or len(t.shape) == ndim:
                inner = arch.is_extra_table(name)
                other_rows = rows is not None and (t.shape[0] != rows if ndim else rows not in t.shape)
                found[name] = (i, inner, other_rows, arch.depth(name), name)
    return sorted(found, key=found.__getitem__)


def _check_overrides(
    ckpt: Checkpoint, embedding: str | None, head: str | None, hidden: int | None, layout: str | None
) -> None:
    """``embedding`` / ``head`` name tensors that can be one: present, 2-D, a float dtype, with the config's
    hidden size on the right axis.

    Raises:
        CheckpointError: no such tensor.
        UsageError: a tensor that cannot be an input embedding or LM head.
    """
    for n, what in ((embedding, "embedding"), (head, "head")):
        if n is None:
            continue
        if n not in ckpt.tensors:
            raise CheckpointError(
                f"{Opt(what, n)}: no such tensor",
                ckpt.path,
                "tietool inspect lists the tensors; pass a name from the weight files",
            )
        t = ckpt.tensors[n]
        shape, lg = list(t.shape), ckpt.logical_dtype(t)
        why = None
        if len(shape) != 2:
            why = f"has shape {shape}, not 2-D ([vocab, hidden] or [hidden, vocab])"
        elif lg not in FLOAT_DTYPES:
            why = f"is {lg}, not a float table (a quantized or integer tensor cannot be tied or resized)"
        elif hidden is not None:
            axes = (
                [1] if what == "embedding" or layout == HeadLayout.VOCAB_HIDDEN else [0] if layout else [0, 1]
            )
            if not any(shape[a] == hidden for a in axes):
                where = "its second axis" if axes == [1] else "its first axis" if axes == [0] else "one axis"
                why = f"has shape {shape}, but {where} should be the config's hidden size {hidden}"
        if why:
            raise UsageError(
                f"{Opt(what, n)} {why}",
                fix="name the input embedding / LM head matrix (tietool inspect lists them)",
            )


def _embedding_by_shape(ckpt: Checkpoint, cf: _Cfg, exclude) -> str | None:
    """The one tensor of shape ``[vocab_size, hidden_size]`` (a name hinting at an embedding wins); None
    when there is none.

    Raises:
        RefusedError: several tensors fit and names do not single one out.
    """
    V, H = cf.vocab_size, cf.hidden
    cands = [
        n
        for n, t in ckpt.tensors.items()
        if V and H and tuple(t.shape) == (V, H) and n not in exclude and not arch.is_extra_table(n)
    ]
    hinted = [n for n in cands if any(k in n for k in ("embed", "wte", "shared", "word", "tok"))]
    if len(cands) > 1 and len(hinted) != 1:
        raise RefusedError(
            f"model_type {cf.model_type!r} is not in the architecture table and {len(cands)} tensors have "
            f"the embedding's shape [{V}, {H}]: {', '.join(cands[:6])}",
            ckpt.path,
            f"pass {Opt('embedding', 'NAME')} and {Opt('head', 'NAME')} to say which is which",
        )
    found = hinted or cands
    return found[0] if found else None


def _find_embedding(
    ckpt: Checkpoint, probe: arch.Family, cf: _Cfg, head_named: list[str]
) -> tuple[str | None, FoundBy]:
    """The input embedding: the family's names in order of preference, then its other known names
    (encoder/decoder copies of a shared table, the common names of other families), then the shape
    ``[vocab_size, hidden_size]``. A tensor named like a head is never taken."""
    tried: list[str] = []
    for names, how in (
        (probe.embedding, FoundBy.TABLE),
        (probe.aliases, FoundBy.OTHER_NAME),
        (arch.FALLBACK.embedding + arch.FALLBACK.aliases, FoundBy.OTHER_NAME),
    ):
        names = tuple(n for n in names if n not in tried)
        tried += names
        ranked = _ranked(ckpt, names, cf.vocab_size, exclude=head_named)
        if ranked:
            return ranked[0], how
    found = _embedding_by_shape(ckpt, cf, head_named)
    return found, (FoundBy.SHAPE if found else FoundBy.MISSING)


def _missing_embedding_name(ckpt: Checkpoint, fam: arch.Family, head: str) -> str:
    """The name of an input embedding the files lack: the one the safetensors metadata records as a
    dropped copy of ``head`` (``{dropped: kept}``), else the family's name under the prefix most tensors
    share (``transformer.`` + ``word_embeddings.weight``)."""
    for meta in ckpt.st_metadata.values():
        for k, v in (meta or {}).items():
            if v == head and any(arch.matches(k, s) for s in fam.embedding + fam.aliases):
                return k
    firsts = [n.split(".")[0] for n in ckpt.tensors if n != head and "." in n]
    prefix = max(set(firsts), key=firsts.count) if firsts else None
    return f"{prefix}.{fam.embedding[0]}" if prefix else fam.embedding[0]


def _find_head(
    ckpt: Checkpoint, fam: arch.Family, embedding: str, taken: list[str], V: int, H: int
) -> tuple[str | None, bool]:
    """The LM head by the family's names in order of preference; for a family the table does not know,
    the one other 2-D tensor of shape ``{V, H}``. Returns (name or None, whether it was found by shape).

    Raises:
        RefusedError: several tensors could be the head.
    """
    named = _ranked(ckpt, fam.head, V, exclude=(embedding,), ndim=None)
    if named or fam.known:
        return (named[0] if named else None), False
    others = [
        n
        for n, t in ckpt.tensors.items()
        if n != embedding
        and n not in taken
        and not arch.is_extra_table(n)
        and len(t.shape) == 2
        and set(t.shape) == {V, H}
    ]
    if len(others) > 1:
        raise RefusedError(
            f"model_type {fam.model_type!r} is not in the architecture table and several tensors "
            f"could be the head: {', '.join(others[:6])}",
            ckpt.path,
            f"pass {Opt('head', 'NAME')} (and {Opt('embedding', 'NAME')})",
        )
    return (others[0], True) if others else (None, False)


def _find_aliases(
    ckpt: Checkpoint, fam: arch.Family, embedding: str, head: str | None, head_named: list[str]
) -> tuple[list[str], list[str], list[str]]:
    """(embedding aliases with equal bytes, alias-named tensors of the embedding's shape with other bytes,
    head aliases: same storage as the head under a head name)."""
    e_info = ckpt.tensors[embedding]
    same_storage = [
        n
        for n, t in ckpt.tensors.items()
        if n != embedding and e_info.storage is not None and t.storage == e_info.storage
    ]
    alias_named = [
        n
        for n in _ranked(ckpt, fam.aliases + fam.embedding, exclude=(embedding,))
        if ckpt.tensors[n].shape == e_info.shape and not arch.is_extra_table(n)
    ]
    head_aliases: list[str] = []
    h_info = ckpt.tensors.get(head) if head else None
    if h_info is not None and h_info.storage is not None:
        head_aliases = [
            n
            for n, t in ckpt.tensors.items()
            if n not in (head, embedding) and t.storage == h_info.storage and n in head_named
        ]
    cands = [n for n in dict.fromkeys(same_storage + alias_named) if n != head and n not in head_aliases]
    equal = [
        n
        for n in cands
        if n in same_storage or compare(ckpt, embedding, n, HeadLayout.VOCAB_HIDDEN).values is TieState.EXACT
    ]
    return equal, [n for n in cands if n not in equal], head_aliases


def _find_extra_tables(ckpt: Checkpoint, fam: arch.Family, taken: set[str]) -> list[str]:
    """Further vocabulary tables: names the table lists as extra (:data:`surgery.arch.EXTRA_TABLES`), and
    embedding or head names inside a numbered block (a copy inside a layer), in file order."""
    known = fam.embedding + fam.aliases + fam.head + arch.FALLBACK.embedding + arch.FALLBACK.head
    return [
        n
        for n, t in ckpt.tensors.items()
        if n not in taken
        and len(t.shape) == 2
        and arch.is_extra_table(n)
        and (arch.is_listed_extra(n) or any(arch.matches(n, s) for s in known))
    ]


def _find_by_shape(ckpt: Checkpoint, taken: set[str], V: int, H: int) -> list[str]:
    """2-D tensors of no known vocabulary name whose shape is ``[V, H]`` or ``[H, V]`` (V != H), outside the
    numbered blocks (a layer's own weights, an MLP projection of ``intermediate_size == vocab_size``, are no
    vocabulary tables; a table inside a layer is found by name as an extra table)."""
    if V == H:
        return []
    return [
        n
        for n, t in ckpt.tensors.items()
        if n not in taken and tuple(t.shape) in ((V, H), (H, V)) and not arch.is_extra_table(n)
    ]


def _find_bias(
    ckpt: Checkpoint, fam: arch.Family, head_name: str | None, hidden: int | None
) -> tuple[str | None, list[str]]:
    """The head bias (the first present in the table's order; before them, the bias of the module of a head
    named by ``--head``, :func:`_named_head_bias`) and its aliases (same storage or bytes)."""
    own = _named_head_bias(ckpt, head_name, hidden)
    names = [*own, *(n for n in _ranked(ckpt, fam.bias, ndim=None) if n not in own)]
    if not names:
        return None, []
    bias, b_info = names[0], ckpt.tensors[names[0]]
    aliases = []
    for n in names[1:]:
        t = ckpt.tensors[n]
        if (b_info.storage is not None and t.storage == b_info.storage) or (
            t.shape == b_info.shape and np.array_equal(ckpt.load(n), ckpt.load(bias))
        ):
            aliases.append(n)
    return bias, aliases


def _named_head_bias(ckpt: Checkpoint, head_name: str | None, hidden: int | None) -> list[str]:
    """The bias beside a head named by ``--head`` (:func:`arch.head_bias_names`: ``lm_head.decoder_bias``
    of ``lm_head.decoder_weight``) when it is present, float and ``[rows]`` / ``[1, rows]`` for the head's
    vocabulary axis (its axis that is not ``hidden``); [] otherwise."""
    if head_name is None or head_name not in ckpt.tensors:
        return []
    rows = set(ckpt.tensors[head_name].shape) - ({hidden} if hidden is not None else set())
    out = []
    for n in arch.head_bias_names(head_name):
        t = ckpt.tensors.get(n)
        if t is None or dtype_kind(ckpt.logical_dtype(t)) != "float":
            continue
        shape = tuple(t.shape)
        if (len(shape) == 1 and shape[0] in rows) or (len(shape) == 2 and shape[0] == 1 and shape[1] in rows):
            out.append(n)
    return out


@dataclass
class _HeadShape:
    """What the head's shape says: its layout (None: unusable; ``ambiguous``), its vocab entries, a
    tensor-parallel fraction, a problem, a conflict with the requested layout."""

    layout: HeadLayout | None = None
    rows: int | None = None
    tp: int | None = None
    problem: Finding | None = None
    conflict: LayoutConflict | None = None


def _conflict(head: str, hs: tuple[int, ...], layout: str | None, fits: HeadLayout) -> LayoutConflict | None:
    """The conflict of a requested ``layout`` (one of :data:`~surgery.model.enums.LAYOUTS`) with the layout
    that ``fits`` the head's shape; None when none was requested or it fits."""
    return (
        LayoutConflict(head, hs, HeadLayout(layout), fits) if layout in LAYOUTS and layout != fits else None
    )


def _head_shape(
    head: str, hs: tuple[int, ...], V: int, H: int, layout: str | None, named: frozenset[int] = frozenset()
) -> _HeadShape:
    """Read the head's layout from its shape against the embedding's ``[V, H]``: ``vocab-hidden`` or
    ``hidden-vocab`` (``layout`` when the square shape cannot say, else ``ambiguous``); a head with fewer
    rows keeps them (reserved rows) unless it is an exact fraction 1/k of ``V`` (a tensor-parallel slice:
    unusable, a problem) whose rows no other vocabulary of the config (``named``: ``draft_vocab_size``)
    counts; any other shape is unusable (a problem). A ``layout`` the shape contradicts is a conflict."""
    hs = tuple(hs)
    if len(hs) != 2:
        return _HeadShape(problem=Finding(FindingKind.HEAD_NOT_2D, (head,), {"shape": list(hs)}))
    if V == H and hs == (V, H):
        return _HeadShape(HeadLayout(layout) if layout in LAYOUTS else HeadLayout.AMBIGUOUS, V)
    if hs in ((V, H), (H, V)):
        fits = HeadLayout.VOCAB_HIDDEN if hs == (V, H) else HeadLayout.HIDDEN_VOCAB
        conflict = _conflict(head, hs, layout, fits)
        return _HeadShape(fits, V, conflict=conflict)
    a, b = hs
    for rows, other, fits in ((a, b, HeadLayout.VOCAB_HIDDEN), (b, a, HeadLayout.HIDDEN_VOCAB)):
        if other != H or not rows or rows > V:  # a head with more rows than the embedding fits neither
            continue
        if rows < V and V % rows == 0 and rows not in named:
            facts = {"shape": list(hs), "head_rows": rows, "fraction": V // rows, "embedding_rows": V}
            return _HeadShape(tp=V // rows, problem=Finding(FindingKind.HEAD_TP_SLICE, (head,), facts))
        conflict = _conflict(head, hs, layout, fits)
        return _HeadShape(fits, rows, conflict=conflict)
    facts = {"shape": list(hs), "embedding_rows": V, "hidden_size": H}
    return _HeadShape(problem=Finding(FindingKind.HEAD_SHAPE_MISFIT, (head,), facts))


class _Flag(NamedTuple):
    """The effective ``tie_word_embeddings``: its value, where it came from, every flag found, problems."""

    tied: bool
    source: str
    flags: dict[str, bool]
    findings: list[Finding]


def _config_flag(ckpt: Checkpoint, cf: _Cfg, fam: arch.Family, loader: str) -> _Flag:
    """The effective ``tie_word_embeddings``: the language model's own (``text_config``) over the top
    level's, else the family's default under ``loader``; flags that disagree are a problem."""
    cfg, tcfg, tkey = ckpt.config, cf.tcfg, cf.tkey
    flags = {}
    if isinstance(cfg.get("tie_word_embeddings"), bool):
        flags["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    if tkey and isinstance(tcfg.get("tie_word_embeddings"), bool):
        flags[f"{tkey}.tie_word_embeddings"] = tcfg["tie_word_embeddings"]
    source = next((k for k in (f"{tkey}.tie_word_embeddings", "tie_word_embeddings") if k in flags), None)
    if source:
        tied = flags[source]
    else:
        tied = fam.tie_default
        source = f"default for {cf.model_type or 'unknown model_type'} under {loader} (key absent)"
    findings = []
    if len(set(flags.values())) > 1:
        facts = {"flags": dict(flags), "governing": tkey, "used": source}
        findings.append(Finding(FindingKind.TIE_FLAGS_DISAGREE, (), facts))
    return _Flag(tied, source, flags, findings)


def shared_storage(ckpt: Checkpoint, emb: str, head: str) -> Comparison | None:
    """``exact`` with ``storage_shared`` when the file stores head and embedding as one array (a
    ``.pdparams`` memo alias), told from the file structure without reading values; else None."""
    e_st, h_st = ckpt.tensors[emb].storage, ckpt.tensors[head].storage
    return (
        Comparison(TieState.EXACT, 0.0, 0, storage_shared=True) if e_st is not None and e_st == h_st else None
    )


def _bits_dtype(storage: np.dtype) -> np.dtype | None:
    """The unsigned integer dtype that views ``storage`` as raw bits (None for an unusual item size)."""
    return np.dtype(f"<u{storage.itemsize}") if storage.itemsize in (1, 2, 4, 8) else None


def _chunk_difference(
    a: np.ndarray, b: np.ndarray, e_bf: bool, h_bf: bool, scale: float | None
) -> tuple[np.ndarray, float]:
    """Per-row max |diff| (float32, one value per row of the chunk) and the float64 sum of |diff| of one
    embedding chunk ``a`` and head chunk ``b`` ``[rows, hidden]``, as float32 (NaN equals NaN; another NaN
    difference is infinite); the embedding is scaled first when ``scale`` is set."""
    fa = bf16_bits_to_f32(a) if e_bf else a.astype(np.float32)
    fb = bf16_bits_to_f32(b) if h_bf else b.astype(np.float32)
    if scale is not None:  # the embedding times the scale, rounded to the head's dtype as untie writes it
        fa = fa * np.float32(scale)
        fa = bf16_bits_to_f32(f32_to_bf16_bits(fa)) if h_bf else fa.astype(b.dtype).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(fa - fb)
    d = np.where(np.isnan(fa) & np.isnan(fb), 0.0, np.where(np.isnan(d), np.inf, d)).astype(
        np.float32, copy=False
    )
    if not d.size:
        return np.zeros(d.shape[:1], np.float32), 0.0
    d = d.reshape(d.shape[0], -1)
    return d.max(axis=1), float(d.sum(dtype=np.float64))


def drift_of(row_max: np.ndarray, total: float, hidden: int) -> Drift:
    """The :class:`Drift` of per-row max |Δ| ``row_max`` (float32 ``[V]``) and the float64 sum ``total`` of
    |Δ| over all ``V × hidden`` elements."""
    V = int(row_max.shape[0])
    differing = np.flatnonzero(row_max > 0)
    vals = row_max[differing]
    if differing.size > DRIFT_TOP:  # the rows at or above the k-th largest value (ties kept), then sorted
        kth = np.partition(vals, -DRIFT_TOP)[-DRIFT_TOP]
        keep = vals >= kth
        differing, vals = differing[keep], vals[keep]
    order = np.lexsort((differing, -vals))[:DRIFT_TOP]
    positive = row_max[row_max > 0]
    bins = 1 + np.searchsorted(np.asarray(DRIFT_EDGES, np.float64), positive.astype(np.float64), "left")
    hist = np.bincount(bins, minlength=len(DRIFT_EDGES) + 2)
    hist[0] = V - positive.size
    return Drift(
        rows=V,
        elements=V * hidden,
        differing_rows=int(positive.size),
        max_abs_diff=float(row_max.max()) if V else 0.0,
        mean_abs_diff=total / (V * hidden) if V * hidden else 0.0,
        top_rows=tuple((int(differing[i]), float(vals[i])) for i in order),
        histogram=tuple(int(c) for c in hist),
    )


def _head_row_chunks(
    ckpt: Checkpoint, head: str, hT: np.ndarray | None, chunk_rows: int, start: int, stop: int
) -> Iterator[np.ndarray]:
    """The head's rows ``start:stop`` in chunks of ``chunk_rows``: gathered from ``hT`` (the transpose of a
    ``hidden-vocab`` head) when given, else read as stored."""
    if hT is None:
        return ckpt.iter_rows(head, chunk_rows, start, stop)
    return (np.ascontiguousarray(hT[s : min(s + chunk_rows, stop)]) for s in range(start, stop, chunk_rows))


HALVES_BYTES = 64 << 20
"""A table of this many bytes or more is compared in two halves in two threads (:func:`_in_halves`)."""
CHUNK_BYTES = 1 << 20
"""The size of the row chunks :func:`compare` reads (see there)."""


def _in_halves(part: Callable[[int, int], float], n: int, nbytes: int) -> float:
    """``part`` over rows 0:n, in two halves in two threads for a table of :data:`HALVES_BYTES` or more
    (reads and numpy release the GIL, so a multi-GB pair compares ~2x faster): the sum of the parts."""
    if nbytes >= HALVES_BYTES:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            parts = list(pool.map(lambda r: part(*r), [(0, n // 2), (n // 2, n)]))
    else:
        parts = [part(0, n)]
    return sum(parts)


def compare(
    ckpt: Checkpoint,
    emb: str,
    head: str,
    layout: str,
    chunk_bytes: int | None = None,
    scale: float | None = None,
) -> Comparison:
    """Compare head and embedding values in row chunks (memory: a chunk of each, 4 bytes a row for its max).

    Chunks of about ``chunk_bytes`` (default :data:`CHUNK_BYTES`, 1 MiB; at least one row): still in the CPU
    cache when compared (2-3x faster than 32 MiB chunks on a 525 MB table), large enough for Python.

    A ``hidden-vocab`` head ``[hidden, vocab]`` is compared as its transpose. Identical bits → ``exact``
    (``transposed`` for a transposed head); equal values in another dtype or ``-0.0`` vs ``0.0`` count as
    equal too. Otherwise ``different`` with the float32 max |difference|, the number of differing rows and
    how the difference is spread over the rows (:class:`Drift`).
    """
    shared = shared_storage(ckpt, emb, head)
    if shared is not None:
        return shared
    e_info, h_info = ckpt.tensors[emb], ckpt.tensors[head]
    eshape = tuple(e_info.shape)
    hshape = tuple(h_info.shape[::-1]) if layout == HeadLayout.HIDDEN_VOCAB else tuple(h_info.shape)
    if len(eshape) != 2 or hshape != eshape:
        return Comparison(TieState.DIFFERENT)
    if not (e_info.st_dtype.decodable and h_info.st_dtype.decodable):
        return _compare_undecodable(ckpt, emb, head, layout)
    e_bf = ckpt.logical_dtype(e_info) == "bfloat16"
    h_bf = ckpt.logical_dtype(h_info) == "bfloat16"
    bits = _bits_dtype(e_info.storage_dtype)
    bit_equal = e_info.storage_dtype == h_info.storage_dtype and e_bf == h_bf and scale is None
    bits = bits if bit_equal else None
    hT = (
        ckpt.load(head).T if layout == HeadLayout.HIDDEN_VOCAB else None
    )  # columns of the stored head: a mapped array
    row_bytes = max(1, e_info.nbytes // max(1, eshape[0]))
    # a transposed head is gathered column by column from a mapping: larger chunks amortize the strides
    chunk_rows = max(1, ((chunk_bytes or CHUNK_BYTES) * (8 if hT is not None else 1)) // row_bytes)
    row_max = np.zeros(eshape[0], np.float32)  # per-row max |diff|; each half writes its own rows
    scan = chunked.ROW_SCAN.get()  # inspect's untrained-row scan, fed from the chunks read here
    scan = scan if scan is not None and scan.bind(emb, eshape[0]) else None

    def part(start: int, stop: int) -> float:
        """Fill ``row_max[start:stop]``; the sum of |diff| over those rows (0.0 when bit-identical)."""
        h_chunks = _head_row_chunks(ckpt, head, hT, chunk_rows, start, stop)
        total, at, bits_ = 0.0, start, bits
        # the same rows of two tables of one shape, in the same chunks
        for a, b in zip(ckpt.iter_rows(emb, chunk_rows, start, stop), h_chunks, strict=True):
            n, at = len(a), at + len(a)
            if scan is not None:
                scan.add(at - n, a, bf16_bits_to_f32(a) if e_bf else a.astype(np.float32))
            if bits_ is not None and np.array_equal(a.view(bits_), b.view(bits_)):  # bits (-0.0, NaN)
                continue
            bits_ = None
            row_max[at - n : at], chunk_sum = _chunk_difference(a, b, e_bf, h_bf, scale)
            total += chunk_sum
        return total

    return _verdict(drift_of(row_max, _in_halves(part, eshape[0], e_info.nbytes), eshape[1]), scale, hT)


def _verdict(drift: Drift, scale: float | None, hT: np.ndarray | None) -> Comparison:
    """The :class:`Comparison` of a compared pair: no differing row → ``scaled`` / ``transposed`` (a
    ``[hidden, vocab]`` head, ``hT`` its transpose) / ``exact``; else ``different`` with its drift."""
    if drift.differing_rows == 0:
        return Comparison(
            TieState.SCALED
            if scale is not None
            else TieState.TRANSPOSED
            if hT is not None
            else TieState.EXACT,
            0.0,
            0,
        )
    return Comparison(TieState.DIFFERENT, drift.max_abs_diff, drift.differing_rows, drift=drift)


def _compare_undecodable(ckpt: Checkpoint, emb: str, head: str, layout: str) -> Comparison:
    """:func:`compare` of tables in a dtype tietool does not decode (float8, float4, complex): the same label
    and bytes (as stored) is ``exact``; anything else ``different``, with no magnitude (never computed from
    bits read as integers)."""
    e, h = ckpt.tensors[emb], ckpt.tensors[head]
    same = (
        layout == HeadLayout.VOCAB_HIDDEN and e.dtype == h.dtype and chunked.same_bytes(ckpt, ckpt, emb, head)
    )
    return Comparison(TieState.EXACT, 0.0, 0) if same else Comparison(TieState.DIFFERENT)


def _ambiguous_layout(
    head: str, size: int, as_stored: str | None = None, transposed: bool | None = None
) -> Finding:
    """The note on a square head (``vocab_size == hidden_size``) whose layout its shape cannot tell, with how
    it compared both ways when it was compared."""
    facts = {"size": size, "as_stored": as_stored, "transposed_equal": transposed}
    return Finding(FindingKind.AMBIGUOUS_LAYOUT, (head,), facts, Fix(Opt("layout", OneOf(LAYOUTS))))


def _compare_pair(
    ckpt: Checkpoint, fam: arch.Family, embedding: str, head: str, shape: _HeadShape, H: int
) -> tuple[Comparison, list[Finding]]:
    """Head vs embedding values (an ambiguous square head both ways; T5's scaled tied head); notes.

    An unusable head (layout None) or one with other rows than the embedding is ``different`` unread. Reads
    both tables in row chunks (:func:`compare`)."""
    notes: list[Finding] = []
    if shape.layout is None or (shape.rows is not None and shape.rows != ckpt.tensors[embedding].shape[0]):
        return Comparison(TieState.DIFFERENT), notes
    if shape.layout is HeadLayout.AMBIGUOUS:
        as_stored = compare(ckpt, embedding, head, HeadLayout.VOCAB_HIDDEN)
        transposed = compare(ckpt, embedding, head, HeadLayout.HIDDEN_VOCAB)
        as_transposed = transposed.values is TieState.TRANSPOSED
        comp = transposed if as_stored.values is not TieState.EXACT and as_transposed else as_stored
        notes.append(_ambiguous_layout(head, H, as_stored.values, as_transposed))
        return comp, notes
    comp = compare(ckpt, embedding, head, shape.layout)
    if comp.values is TieState.DIFFERENT and fam.scales_tied_logits:
        scaled = compare(ckpt, embedding, head, shape.layout, scale=tied_scale(ckpt.config, H, ckpt.path))
        if scaled.values is TieState.SCALED:
            comp = scaled
            notes.append(Finding(FindingKind.SCALED_TIED_HEAD, (head, embedding), {"family": fam.name}))
    return comp, notes


def _comparison(
    ckpt: Checkpoint,
    fam: arch.Family,
    embedding: str,
    head: str | None,
    shape: _HeadShape,
    compare_values: bool,
) -> tuple[Comparison, list[Finding]]:
    """How the head compares with the embedding, and notes: no head in the files is ``shared`` (T5's head
    is the shared table) or ``absent``; without ``compare_values`` only a shared storage is told
    (``unknown`` otherwise); else the values are read (:func:`_compare_pair`)."""
    if head is None:
        return Comparison(TieState.SHARED if fam.scales_tied_logits else TieState.ABSENT), []
    if not compare_values and shape.layout is not None:
        comp = shared_storage(ckpt, embedding, head) or Comparison(TieState.UNKNOWN)
        H = ckpt.tensors[embedding].shape[1]
        return comp, [_ambiguous_layout(head, H)] if shape.layout is HeadLayout.AMBIGUOUS else []
    return _compare_pair(ckpt, fam, embedding, head, shape, ckpt.tensors[embedding].shape[1])


def _size_findings(det: Detection) -> list[Finding]:
    """Findings about sizes: config vocab_size vs the embedding's rows, the head's rows (reserved rows),
    the tokenizer (padding rows, or rows missing), unreadable tokenizer files, special ids past the rows."""
    out: list[Finding] = []
    V, tok, emb = det.vocab_rows, det.tokenizer, (det.embedding.name,)
    facts: dict[str, Any]
    if det.config.vocab_size is not None and det.config.vocab_size != V:
        facts = {"config_vocab_size": det.config.vocab_size, "embedding_rows": V, "key": det.config.vocab_key}
        out.append(Finding(FindingKind.VOCAB_SIZE_MISMATCH, emb, facts, Fix(Opt("vocab_size", V), "resize")))
    if det.head.vocab is not None and det.head.rows is not None:
        facts = {
            "head_rows": det.head.rows,
            "head_key": det.head.vocab,
            "embedding_rows": V,
            "embedding_key": det.config.vocab_key,
        }
        out.append(Finding(FindingKind.HEAD_OTHER_VOCABULARY, (det.head.name, det.embedding.name), facts))
    elif det.head.rows is not None and det.head.rows != V:
        facts = {"embedding_rows": V, "head_rows": det.head.rows}
        out.append(Finding(FindingKind.HEAD_ROWS_DIFFER, (det.embedding.name, det.head.name), facts))
    if tok.size is not None and tok.size != V:
        facts = {"embedding_rows": V, "tokenizer_size": tok.size, "tokenizer_files": list(tok.sources)}
        if tok.size < V:
            out.append(Finding(FindingKind.PADDING_ROWS, emb, facts))
        else:
            fix = Fix(Opt("vocab_size", tok.size), "resize")
            out.append(Finding(FindingKind.TOKENIZER_BEYOND_ROWS, emb, facts, fix))
    out += [Finding(FindingKind.TOKENIZER_UNREADABLE, (), {"file": n}) for n in tok.unreadable]
    out += _tokenizer_set_findings(tok.files)
    beyond = [{"file": s.file, "key": s.key, "id": s.id} for s in det.special_ids if s.id >= V]
    if beyond:
        facts = {"embedding_rows": V, "ids": beyond}
        out.append(Finding(FindingKind.SPECIAL_IDS_BEYOND_ROWS, emb, facts))
    return out


def _tokenizer_set_findings(ts: TokenizerSet) -> list[Finding]:
    """One problem per disagreement of the tokenizer files, one for ids no file names (a gap: loaders
    renumber the tokens after it); notes for files that need the tokenizer extra and for formats tietool
    cannot edit."""
    out = [Finding(FindingKind.TOKENIZER_FILES_DISAGREE, (), {"disagreement": d}) for d in ts.disagreements]
    if ts.gaps:
        moved = [
            {"content": a.content, "id": a.id, "loaded_id": a.id - sum(g < a.id for g in ts.gaps)}
            for a in ts.added
            if a.id > ts.gaps[0]
        ]
        out.append(Finding(FindingKind.TOKENIZER_ID_GAP, (), {"gaps": list(ts.gaps), "renumbered": moved}))
    if ts.needs_extra:
        out.append(Finding(FindingKind.TOKENIZER_NEEDS_EXTRA, (), {"files": list(ts.needs_extra)}))
    if ts.unsupported:
        out.append(Finding(FindingKind.TOKENIZER_READ_ONLY, (), {"files": list(ts.unsupported)}))
    return out


def _missing_embedding_finding(det: Detection) -> Finding:
    """The problem of an input embedding stored only as the head, and whether the safetensors metadata
    records it as a dropped copy of the head."""
    recorded = any((m or {}).get(det.embedding.name) == det.head.name for m in det.ckpt.st_metadata.values())
    return Finding(
        FindingKind.EMBEDDING_MISSING, (det.embedding.name, det.head.name), {"recorded_as_dropped": recorded}
    )


def _tie_findings(det: Detection) -> list[Finding]:
    """Problems about the tie state: a missing embedding; the flag vs the head's values; a missing head the
    loader will not re-tie; an untied flag with no head."""
    if not det.embedding.present:
        return [_missing_embedding_finding(det)]
    out: list[Finding] = []
    comp, head, source = det.comparison, det.head.name, det.tie.source
    if (
        det.head.present
        and comp.values is TieState.DIFFERENT
        and det.tie.tied
        and comp.max_abs_diff is not None
    ):
        facts = {
            "config_source": source,
            "max_abs_diff": comp.max_abs_diff,
            "differing_rows": comp.differing_rows,
            "embedding_rows": det.vocab_rows,
        }
        out.append(Finding(FindingKind.TIED_BUT_DIFFERENT, (head, det.embedding.name), facts))
    if (
        not det.head.present
        and det.tie.tied
        and not det.family.may_drop_head
        and comp.values is not TieState.SHARED
    ):
        facts = {**_proof_facts(det), "proven": det.family.trusted and not det.family.reties}
        out.append(Finding(FindingKind.HEAD_MISSING_NOT_RETIED, (head,), facts))
    shaped = unnamed_heads(det)
    if not det.head.present and shaped:
        out.append(Finding(FindingKind.HEAD_UNNAMED, (head, *shaped)))
    elif not det.head.present and not det.tie.tied:
        out.append(Finding(FindingKind.UNTIED_BUT_NO_HEAD, (head,), {"config_source": source}))
    return out


def unnamed_heads(det: Detection) -> list[str]:
    """Tensors of no known name with the head's shape (``[V, H]`` or ``[H, V]``, outside the numbered
    blocks) when the files hold no head by name: each may be a trained head under a name the table lacks."""
    if det.head.present:
        return []
    shapes = ((det.vocab_rows, det.hidden), (det.hidden, det.vocab_rows))
    return [n for n in det.beyond.by_shape if tuple(det.ckpt.tensors[n].shape) in shapes]


def _beyond_findings(det: Detection) -> list[Finding]:
    """Notes on the surface found by shape and by value: token-indexed tables and their rules, tensors of
    another vocabulary, the text vocabulary chosen among several (or a problem: not clear)."""
    out: list[Finding] = []
    tables = [
        {"name": n, "what": r.what, "rule": r.rule.value}
        for n, r in det.beyond.token_tables.items()
        if r.indexed_by == "vocab"
    ]
    if tables:
        out.append(Finding(FindingKind.TOKEN_TABLES, tuple(t["name"] for t in tables), {"tables": tables}))
    by_key: dict[str, dict] = {}
    sizes = {v.key: v.size for v in det.config.vocabularies}
    for n, k in det.beyond.other_vocab.items():
        by_key.setdefault(k, {"size": sizes.get(k), "tensors": []})["tensors"].append(n)
    if by_key:
        out.append(Finding(FindingKind.OTHER_VOCABULARY, tuple(det.beyond.other_vocab), {"by_key": by_key}))
    if det.config.unclear_text:
        facts = {"blocks": list(det.config.unclear_text), "candidates": _candidate_pairs(det)}
        out.append(Finding(FindingKind.TEXT_VOCABULARY_UNCLEAR, (), facts))
    elif det.config.text_key and det.config.vocab_key and det.head.present:
        block = det.config.vocab_key.rpartition(".")[0]
        named = {
            v.key: v.size for v in det.config.vocabularies if v.block != block and v.size != det.vocab_rows
        }
        if named:
            facts = {
                "vocabularies": {det.config.vocab_key: det.config.vocab_size, **named},
                "block": det.config.text_key,
                "key": det.config.vocab_key,
                "size": det.config.vocab_size,
            }
            out.append(Finding(FindingKind.TEXT_VOCABULARY, (det.embedding.name, det.head.name), facts))
    return out


def _candidate_pairs(det: Detection) -> list[dict]:
    """For each candidate language-model block of an unclear choice: the embedding and head with its
    vocabulary's rows (the common names, else a 2-D table of those rows named like one), for the refusal to
    print; a block with no such pair lists its tables of those rows instead (``tables``)."""
    ckpt, out, names = det.ckpt, [], arch.FALLBACK
    for block in det.config.unclear_text:
        size = get_dotted_int(ckpt.config, table_size_key(_block_at(ckpt.config, block), block))
        if size is None:
            continue
        tables = [n for n, t in ckpt.tensors.items() if len(t.shape) == 2 and size in t.shape]
        embs = [n for n in _ranked(ckpt, names.embedding, size) if ckpt.tensors[n].shape[0] == size]
        embs += [n for n in tables if "embed" in n and ckpt.tensors[n].shape[0] == size]
        heads = [n for n in _ranked(ckpt, names.head, size, ndim=None) if size in ckpt.tensors[n].shape]
        heads += [n for n in tables if "head" in n and n not in embs[:1]]
        pair = {"embedding": embs[0], "head": heads[0]} if embs and heads else {"tables": tables}
        out.append({"block": block, **pair})
    return out


def _block_at(cfg: dict, dotted: str) -> dict:
    v: object = cfg
    for part in dotted.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v if isinstance(v, dict) else {}


def _proof_facts(det: Detection) -> dict:
    """The facts that word a loader fact's proof: loader, model type, container, the loaders proven for
    them (architecture table ``PROOFS``)."""
    fam = det.family
    return {
        "loader": det.loader.name,
        "model_type": det.config.model_type,
        "container": det.ckpt.format,
        "proven_loaders": list(fam.proven_loaders()),
    }


def loader_facts_unproven(det: Detection) -> Finding | None:
    """The note that the loader facts of ``det`` are unproven (``Family.proven`` False), else None. Its
    words say what the writes do instead and how to name a proven loader (``Opt('loader')``)."""
    if det.family.trusted:
        return None
    return Finding(FindingKind.LOADER_FACTS_UNPROVEN, (), _proof_facts(det))


def _later_findings(det: Detection) -> list[Finding]:
    """The findings every detection gets from its facts: tie state, sizes, a layout conflict, the surface
    beyond the main pair, unproven loader facts."""
    unproven = loader_facts_unproven(det)
    out = _tie_findings(det) + _size_findings(det) + ([unproven] if unproven else [])
    c = det.head.conflict
    if c is not None:
        facts = {"requested": c.requested, "shape": list(c.shape), "fits": c.fits}
        out.append(Finding(FindingKind.LAYOUT_CONFLICT, (c.head,), facts))
    if det.beyond.extra_tables:
        out.append(Finding(FindingKind.EXTRA_TABLES, tuple(det.beyond.extra_tables)))
    if det.beyond.by_shape:
        out.append(Finding(FindingKind.BY_SHAPE, tuple(det.beyond.by_shape)))
    return out + _beyond_findings(det)


def _missing_embedding_dims(ckpt: Checkpoint, head: str, fam: arch.Family, cf: _Cfg) -> tuple[int, int]:
    """``(vocab, hidden)`` of a table stored only as the head: the config's hidden size picks the axis."""
    hs = tuple(ckpt.tensors[head].shape)
    if len(hs) != 2:
        raise CheckpointError(
            f"no input embedding found, and the head {head} has shape {list(hs)}, not 2-D",
            ckpt.path,
            f"pass {Opt('embedding', 'NAME')} (and {Opt('head', 'NAME')})",
        )
    a, b = hs
    if a != b and cf.hidden in hs:
        return (b, a) if a == cf.hidden else (a, b)
    return (b, a) if fam.head_layout == HeadLayout.HIDDEN_VOCAB else (a, b)


@dataclass
class _Pair:
    """The main pair as found, with what depends on it: the input embedding (or, missing, the name it would
    have and ``stored_as`` the head that holds the table), its ``[V, H]``, the head (None: not in the
    files) and its shape, the comparison, aliases, the surface beyond the pair, findings about the pair."""

    embedding: str
    found_by: FoundBy
    V: int
    H: int
    head: str | None
    shape: _HeadShape
    comparison: Comparison
    stored_as: str | None = None
    emb_aliases: list[str] = field(default_factory=list)
    vocab_aliases: list[str] = field(default_factory=list)
    head_aliases: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    by_shape: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    beyond: _Beyond | None = None


@dataclass
class _Beyond:
    """The surface beyond the named tables, found by shape and by value (:func:`_beyond_names`)."""

    token_tables: dict[str, arch.TokenTable] = field(default_factory=dict)
    other_vocab: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    head_vocab: str | None = None


def _beyond_names(
    ckpt: Checkpoint, cf: _Cfg, taken: set[str], V: int, head: str | None, head_rows: int | None
) -> _Beyond:
    """Every tensor outside ``taken`` with an axis of a vocabulary's size (:func:`vocabularies.sized_by`):
    for the embedding's ``V`` rows, a :data:`~surgery.arch.TOKEN_TABLES` rule's table or an
    unknown one; for another vocabulary the config names (not ``V``), a tensor of that vocabulary (a rule's
    token-id map, or kept as it is). A float tensor counts only where no other config key names the size
    (:func:`vocabularies.ambiguous_sizes`); quantization tensors never. The head is over another
    vocabulary when its rows are that vocabulary's and not the embedding's (``head_vocab``)."""
    logical = {n: ckpt.logical_dtype(t) for n, t in ckpt.tensors.items()}
    out, seen = _Beyond(), set(taken)
    others = [v for v in cf.vocabs if v.size != V]
    if head is not None and head_rows is not None and head_rows != V:
        out.head_vocab = next((v.key for v in others if v.size == head_rows and v.key != cf.vocab_key), None)

    def sized(size: int) -> list[str]:
        return [
            n
            for n in sized_by(ckpt.tensors, size, seen)
            if quant_module(n) is None
            and (
                dtype_kind(logical[n]) != "float"
                or float_counts(n, tuple(ckpt.tensors[n].shape), size, cf.ambiguous, cf.derived, cf.hidden)
            )
        ]

    for n in sized(V):
        t = ckpt.tensors[n]
        rule = arch.token_table(n, dtype_kind(logical[n]), len(t.shape))
        if rule is not None and rule.indexed_by == "vocab" and t.shape[0] == V:
            out.token_tables[n] = rule
        else:
            out.unknown.append(n)
    seen |= set(out.token_tables) | set(out.unknown)
    for v in others:
        for n in sized(v.size):
            t = ckpt.tensors[n]
            rule = arch.token_table(n, dtype_kind(logical[n]), len(t.shape))
            if rule is not None and rule.indexed_by == "other" and t.shape[0] == v.size:
                out.token_tables[n] = rule
            out.other_vocab[n] = v.key
            seen.add(n)
    return out


def _found_head(
    ckpt: Checkpoint, fam: arch.Family, embedding: str, head_name: str | None, V: int, H: int
) -> tuple[str | None, list[str], list[Finding]]:
    """The head (``head_name`` when given, else :func:`_find_head`), the tensors named like a head (for
    head aliases), and the note on a head found by its shape.

    Raises:
        RefusedError: several tensors could be the head.
    """
    if head_name:
        return head_name, [head_name], []
    head_named = _ranked(ckpt, fam.head, V, exclude=(embedding,), ndim=None)
    alias_probe = _ranked(ckpt, fam.aliases + fam.embedding, exclude=(embedding,))
    head, by_shape = _find_head(ckpt, fam, embedding, alias_probe, V, H)
    return head, head_named, [Finding(FindingKind.HEAD_BY_SHAPE, (head,))] if head and by_shape else []


def _embedding_pair(
    ckpt: Checkpoint,
    fam: arch.Family,
    cf: _Cfg,
    found: tuple[str, FoundBy],
    head_name: str | None,
    layout: str | None,
    bias: tuple[str | None, list[str]],
    compare_values: bool,
) -> _Pair:
    """The pair of a checkpoint with its input embedding ``[V, H]`` (``found``: its name and how it was
    found): the head, aliases, the comparison, extra tables and vocab-shaped tensors (none of them ``bias``
    or its aliases); a hidden size other than the config's, a head found by shape or unusable, a square
    head's layout, are findings.

    Raises:
        RefusedError: several tensors could be the head (:func:`_find_head`).
    """
    embedding, found_by = found
    V, H = ckpt.tensors[embedding].shape
    findings: list[Finding] = []
    if cf.hidden is not None and H != cf.hidden:
        facts = {"shape": [V, H], "config_hidden_size": cf.hidden}
        findings.append(Finding(FindingKind.EMBEDDING_HIDDEN_MISMATCH, (embedding,), facts))
    head, head_named, head_notes = _found_head(ckpt, fam, embedding, head_name, V, H)
    emb_aliases, vocab_aliases, head_aliases = _find_aliases(ckpt, fam, embedding, head, head_named)
    named = frozenset(v.size for v in cf.vocabs if v.key != cf.vocab_key and v.size != V)
    shape = _head_shape(head, ckpt.tensors[head].shape, V, H, layout, named) if head else _HeadShape()
    comp, cmp_notes = _comparison(ckpt, fam, embedding, head, shape, compare_values)
    findings += head_notes + ([shape.problem] if shape.problem else []) + cmp_notes
    taken = {embedding, *emb_aliases, *vocab_aliases, *head_aliases, *([head] if head else [])}
    taken |= {*([bias[0]] if bias[0] else []), *bias[1]}
    extra = _find_extra_tables(ckpt, fam, taken)
    by_shape = _find_by_shape(ckpt, taken | set(extra), V, H)
    beyond = _beyond_names(ckpt, cf, taken | set(extra) | set(by_shape), V, head, shape.rows)
    by_shape += beyond.unknown
    return _Pair(
        embedding,
        found_by,
        V,
        H,
        head,
        shape,
        comp,
        emb_aliases=emb_aliases,
        vocab_aliases=vocab_aliases,
        head_aliases=head_aliases,
        extra=extra,
        by_shape=by_shape,
        findings=findings,
        beyond=beyond,
    )


def _missing_embedding_pair(
    ckpt: Checkpoint, fam: arch.Family, cf: _Cfg, head: str, layout: str | None
) -> _Pair:
    """The pair of a checkpoint whose input embedding is missing while the head is present (a converter
    kept one of a tied pair): the table is stored only as the head, the embedding gets the name it would
    have. No aliases, extra tables or vocab-shaped tensors are looked for, and values are not compared.

    Raises:
        CheckpointError: the head is not 2-D (:func:`_missing_embedding_dims`); a tensor named like the
            family's embedding is there but not 2-D (:func:`_refuse_flat_embedding`).
    """
    _refuse_flat_embedding(ckpt, fam, head)
    V, H = _missing_embedding_dims(ckpt, head, fam, cf)
    shape = _head_shape(head, ckpt.tensors[head].shape, V, H, layout)
    embedding = _missing_embedding_name(ckpt, fam, head)
    findings = [shape.problem] if shape.problem else []
    no_embedding = Comparison(TieState.NO_EMBEDDING)
    return _Pair(
        embedding, FoundBy.MISSING, V, H, head, shape, no_embedding, stored_as=head, findings=findings
    )


def _refuse_flat_embedding(ckpt: Checkpoint, fam: arch.Family, head: str | None) -> None:
    """Refuse a checkpoint whose input embedding is there under its name but is not a matrix (0-D, 1-D, 3-D
    or more): taking it as missing would rebuild it from the head and write a second tensor of its name.

    Raises:
        CheckpointError: naming the tensor, its shape and its file.
    """
    exclude = (head,) if head else ()
    names = _ranked(ckpt, fam.embedding + fam.aliases, exclude=exclude, ndim=None)
    name = _missing_embedding_name(ckpt, fam, head) if head else None
    flat = [n for n in names if len(ckpt.tensors[n].shape) != 2]
    if name in ckpt.tensors and name not in flat and name != head and len(ckpt.tensors[name].shape) != 2:
        flat.insert(0, name)  # the name a missing embedding would get is taken by a tensor of another rank
    if flat:
        t = ckpt.tensors[flat[0]]
        raise CheckpointError(
            f"the input embedding {t.name} has shape {list(t.shape)}, not 2-D ([vocab_size, hidden_size])",
            ckpt.path / t.file,
            "the file is damaged or the tensor was reshaped: restore it from the original checkpoint",
        )


def _nothing_found(ckpt: Checkpoint, cf: _Cfg, probe: arch.Family) -> CheckpointError:
    """The error for a checkpoint with neither an input embedding nor a head."""
    return CheckpointError(
        f"no input embedding found (model_type {cf.model_type!r}: no tensor named like "
        f"{', '.join(probe.embedding[:3])}, and none of shape [vocab_size, hidden_size] = "
        f"[{cf.vocab_size}, {cf.hidden}])",
        ckpt.path,
        f"pass {Opt('embedding', 'NAME')} (and {Opt('head', 'NAME')}), or check config.json "
        "vocab_size/hidden_size",
    )


def _config_findings(cf: _Cfg, probe: arch.Family, found_by: FoundBy, embedding: str | None) -> list[Finding]:
    """A model_type that is not a string; how names were matched for a model_type not in the table (said
    only when the embedding was found)."""
    out = [Finding(FindingKind.MODEL_TYPE_NOT_STRING)] if cf.bad_type else []
    if embedding is None:
        return out
    if found_by is FoundBy.SHAPE:
        out.append(Finding(FindingKind.EMBEDDING_BY_SHAPE, (embedding,), {"model_type": cf.model_type}))
    elif not probe.known:
        out.append(Finding(FindingKind.MODEL_TYPE_NOT_IN_TABLE, (), {"model_type": cf.model_type}))
    return out


def detect(
    ckpt: Checkpoint,
    layout: str | None = None,
    loader: str | None = None,
    compare_values: bool = True,
    embedding_name: str | None = None,
    head_name: str | None = None,
) -> Detection:
    """Find the vocabulary surface of ``ckpt``: embedding, head, bias, aliases, extra tables, and the tie
    state.

    Args:
        layout: ``vocab-hidden`` / ``hidden-vocab`` to override the head layout decision (needed when
            vocab_size == hidden_size and a head is present).
        loader: one of ``surgery.arch.LOADERS`` to override :func:`infer_loader`.
        compare_values: read the embedding and head data to compare them (inspect and tie do).
        embedding_name, head_name: the tensor names to use (``--embedding`` / ``--head``), for architectures
            the table does not know.

    Raises:
        CheckpointError: neither an input embedding nor a head can be found, or a named tensor does not
            exist.
        UsageError: a named tensor cannot be an embedding or head (not 2-D, not float, wrong hidden size).
        RefusedError: the embedding can only be guessed by shape and several tensors fit.
    """
    cf = _config_facts(ckpt)
    _check_overrides(ckpt, embedding_name, head_name, cf.hidden, layout)
    probe = arch.lookup(cf.model_type, "hf")
    head_named = [head_name] if head_name else _ranked(ckpt, probe.head, ndim=None)
    embedding, found_by = (
        (embedding_name, FoundBy.NAMED) if embedding_name else _find_embedding(ckpt, probe, cf, head_named)
    )
    if embedding is None and not head_named:
        _refuse_flat_embedding(ckpt, probe, None)
        raise _nothing_found(ckpt, cf, probe)
    if embedding is not None and found_by is FoundBy.NAMED:
        cf = _settle_text(ckpt, cf, ckpt.tensors[embedding].shape[0])
    findings = _config_findings(cf, probe, found_by, embedding)
    if loader is None:
        loader, loader_source = infer_loader(ckpt, embedding or head_named[0])
    else:
        loader_source = f"{Opt('loader')}"
    fam = arch.lookup(cf.model_type, loader, ckpt.format)
    bias = _find_bias(ckpt, fam, head_name, cf.hidden)
    flag = _config_flag(ckpt, cf, fam, loader)
    if embedding is None:
        pair = _missing_embedding_pair(ckpt, fam, cf, head_named[0], layout)
    else:
        pair = _embedding_pair(ckpt, fam, cf, (embedding, found_by), head_name, layout, bias, compare_values)
    det = _detection(ckpt, cf, fam, (loader, loader_source), pair, bias, flag)
    det.findings = findings + pair.findings + flag.findings + _later_findings(det)
    return det


def names_a_pair(ckpt: Checkpoint) -> bool:
    """Whether ``ckpt`` holds a tensor named like an input embedding or an LM head (its family's names,
    their aliases, the common names of other families; any rank), from the headers: where none is, there is
    no tie for :func:`detect` to check (a checkpoint of no vocabulary, or one whose pair only a guess by
    shape could find)."""
    cf = _config_facts(ckpt)
    probe = arch.lookup(cf.model_type, "hf")
    names = probe.head + probe.embedding + probe.aliases + arch.FALLBACK.embedding + arch.FALLBACK.aliases
    return bool(_ranked(ckpt, dict.fromkeys(names), ndim=None))


def _detection(
    ckpt: Checkpoint,
    cf: _Cfg,
    fam: arch.Family,
    loader: tuple[str, str],
    pair: _Pair,
    bias: tuple[str | None, list[str]],
    flag: _Flag,
) -> Detection:
    """The :class:`Detection` of ``pair`` under ``fam`` and ``loader`` (name, how it was decided), without
    findings; reads the tokenizer files and the special token ids of the folder."""
    beyond = pair.beyond or _Beyond()
    shape = pair.shape
    return Detection(
        ckpt=ckpt,
        config=ConfigFacts(cf.model_type, cf.vocab_size, cf.vocab_key, cf.tkey, cf.vocabs, cf.unclear),
        family=fam,
        loader=LoaderChoice(*loader),
        embedding=EmbeddingMatch(
            pair.embedding,
            pair.V,
            pair.H,
            present=pair.stored_as is None,
            found_by=pair.found_by,
            stored_as=pair.stored_as,
            aliases=pair.emb_aliases,
            vocab_aliases=pair.vocab_aliases,
        ),
        head=HeadMatch(
            pair.head or _default_head_name(fam, pair.embedding),
            pair.head is not None,
            layout=shape.layout,
            rows=shape.rows,
            aliases=pair.head_aliases,
            tp_fraction=shape.tp,
            vocab=beyond.head_vocab,
            conflict=shape.conflict,
        ),
        bias=BiasMatch(bias[0], bias[1]) if bias[0] else None,
        tie=TieFlag(flag.tied, flag.source, flag.flags),
        comparison=pair.comparison,
        beyond=Beyond(pair.extra, pair.by_shape, beyond.token_tables, beyond.other_vocab),
        tokenizer=tokenizer_info(ckpt.path),
        special_ids=special_token_ids(ckpt.path),
    )


def tied_scale(config: dict, hidden: int, path: Path | None = None) -> float:
    """T5's tied-logit factor ``d_model ** -0.5`` (``hidden`` when the config has no ``d_model``).

    Raises:
        CheckpointError: ``d_model`` is not a positive integer (0, negative, a bool, 1e30 as a float), or
            is absent and ``hidden`` is not positive; ``path`` is the checkpoint folder, for the message.
    """
    d_model = config.get("d_model")
    d = hidden if d_model is None else d_model
    if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
        raise CheckpointError(
            f"d_model = {d_model!r} in config.json is not a positive integer (the tied logits are scaled "
            "by d_model ** -0.5)"
            if d_model is not None
            else f"config.json has no d_model and the hidden size is {hidden}",
            None if path is None else path / "config.json",
            "set d_model to the model's hidden size, as the training run wrote it",
        )
    return float(d) ** -0.5


def _default_head_name(fam: arch.Family, embedding: str = "") -> str:
    """Name for a head that is not in the files: the family's first head name, at the top level
    (``lm_head.weight``), or inside the embedding's top module for a family whose head sits there
    (``Family.head_under_model``: ``transformer.output_layer.weight``)."""
    first = embedding.split(".")[0] if "." in embedding else ""
    if fam.head_under_model and first:
        return f"{first}.{fam.head[0]}"
    return fam.head[0]
