"""The result of detection, as data: :class:`Detection` (the vocabulary surface, the main embedding and
head, the head's layout, the tie state three ways) and the types it groups (:class:`EmbeddingMatch`,
:class:`HeadMatch`, :class:`BiasMatch`, :class:`TieFlag`, :class:`Beyond`, :class:`Comparison` and its
:class:`Drift`). :func:`surgery.inspect.detect.detect` fills them."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import arch
from ..io.checkpoint import Checkpoint
from ..io.tokenizer import SpecialTokenId, TokenizerInfo
from ..model.enums import FoundBy, HeadLayout, TensorRole, TieState
from ..model.tensor import TensorInfo
from .findings import Finding, Severity
from .vocabularies import Vocabulary


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
