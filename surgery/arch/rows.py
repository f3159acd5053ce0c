"""The row types of the architecture tables: frozen records whose fields default to "nothing special", so a
row states only what is special about its family (mergekit's ``WeightInfo``). Each row checks itself when it
is built (``__post_init__``), so a malformed row fails when :mod:`surgery.arch` is imported, not when a
checkpoint of that family first meets it; the checks across rows and tables are in :mod:`surgery.arch`
(``check_tables``).

Every table speaks of tensors in one vocabulary, :class:`~surgery.model.enums.TensorRole`: a family row's
``names(role)``, a tensor-parallel rule's ``role`` and a conversion row's ``roles`` all say "this suffix is
the LM head" the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import NamedTuple, TypeVar

from ..model.enums import Layout, Loader, TensorRole, TiedScale

# Loaders tietool knows (the values of :class:`~surgery.model.enums.Loader`, in its order). "hf" is the
# HF-transformers naming (model.*, transformer.*) that PaddleFormers reads.
LOADERS: tuple[str, ...] = tuple(ld.value for ld in Loader)
# The containers a loader may read differently (``Checkpoint.format``).
CONTAINERS: tuple[str, ...] = ("safetensors", "pdparams")
# The loaders under which a write relies on a fact only where PROOFS holds it: the ones the tests load with
# (PaddleFormers 1.2 in the test environment, PaddleNLP 2.8.1 and HF transformers 5.3 with CPU torch in
# venvs of their own: tests/tools/pnlp_venv.sh, tests/tools/hf_venv.sh). An hf row no test proves
# (Mistral, Mixtral, ChatGLM2, ...) takes the safe default. "paddlenlp-3" has no library here; its rows are
# the facts read from that library's source, used as the table states them.
PROVABLE_LOADERS: tuple[str, ...] = (
    Loader.PADDLEFORMERS.value,
    Loader.PADDLENLP_28.value,
    Loader.HF.value,
)


_K = TypeVar("_K")
_V = TypeVar("_V")


class TableError(ValueError):
    """A malformed row or table of :mod:`surgery.arch` (raised when the package is imported)."""


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise TableError(what)


def _names(value: object, what: str, *, empty: bool = False) -> None:
    """``value`` is a tuple of non-empty strings (non-empty itself unless ``empty``)."""
    _need(isinstance(value, tuple), f"{what}: a tuple of names, not {type(value).__name__}")
    assert isinstance(value, tuple)
    _need(empty or bool(value), f"{what}: an empty list of names")
    _need(all(isinstance(n, str) and n for n in value), f"{what}: every name a non-empty string")


def check_loader_key(key: str, what: str) -> None:
    """``key`` of a per-loader table is ``"*"``, a loader (:data:`LOADERS`) or ``"LOADER/CONTAINER"``.

    Raises:
        TableError: it is none of these.
    """
    loader, _, container = key.partition("/")
    ok = key == "*" or (loader in LOADERS and (not container or container in CONTAINERS))
    _need(ok, f"{what}: {key!r} is not a loader key ('*', one of {', '.join(LOADERS)}, or LOADER/CONTAINER)")


def matches(name: str, suffix: str) -> bool:
    """``name`` is ``suffix`` or ends with ``"." + suffix``."""
    return name == suffix or name.endswith("." + suffix)


def frozen_map(items: Mapping[_K, _V]) -> Mapping[_K, _V]:
    """A read-only copy of ``items`` (the mapping fields of a frozen row)."""
    return MappingProxyType(dict(items))


# ============================================================================ families and loaders
@dataclass(frozen=True)
class LoaderFacts:
    """One loader's facts for a family (see :mod:`surgery.arch.families`).

    Attributes:
        layout: the layout the loader expects for a head it reads from the file.
        reties: a checkpoint without the head loads with the head tied to the embedding when the config
            says tied (False: the loader builds a random head instead, so ``tie`` keeps the head).
        always_tied: the loader ties the head to the embedding whatever the config says.
        warns_missing_head: the loader logs a dropped head as "newly initialized" although it loads it tied.
    """

    layout: Layout
    reties: bool
    always_tied: bool = False
    warns_missing_head: bool = False

    def __post_init__(self) -> None:
        _need(
            isinstance(self.layout, Layout) and self.layout is not Layout.AUTO,
            f"loader facts: layout {self.layout!r}",
        )
        for f in (self.reties, self.always_tied, self.warns_missing_head):
            _need(isinstance(f, bool), f"loader facts: {f!r} is not a bool")


def _untied_by_default() -> Mapping[str, bool]:
    return {"*": False}


@dataclass(frozen=True)
class FamilyRow:
    """One row of ``FAMILIES``: a family of model types that store their vocabulary tensors under the same
    names and whose loaders behave alike.

    Attributes:
        family: the family's name (messages, ``PADDLEFORMERS_LACKS``).
        model_types: config.json ``model_type`` values (also ``text_config.model_type``).
        embedding: suffixes of the input embedding, in order of preference (``[vocab_size, hidden_size]``).
        head: suffixes of the LM head weight.
        loaders: per loader key (``"*"``, a loader, ``"LOADER/CONTAINER"``, which wins over ``"LOADER"``):
            its :class:`LoaderFacts`.
        aliases: suffixes of other names for the embedding's table (encoder/decoder copies).
        bias: suffixes of the LM head bias (``[vocab]`` or ``[1, vocab]``); the first present is "the" bias,
            the others present are its aliases.
        tie_default: per loader key: the config class's default for ``tie_word_embeddings`` (PaddleNLP
            leaves the key out of config.json when it equals the default).
        model_loaders: ``{model_type: {loader key: facts}}`` for the model types whose loaders differ from
            the family's (consulted first).
        tied_scale: what the tied head is multiplied by for the logits (T5: ``d_model ** -0.5``).
        head_under_model: the head sits inside the model's top module, beside the embedding (ChatGLM2/3
            ``transformer.output_layer``): a head untie writes gets the embedding's first name component.
    """

    family: str
    model_types: tuple[str, ...]
    embedding: tuple[str, ...]
    head: tuple[str, ...]
    loaders: Mapping[str, LoaderFacts]
    aliases: tuple[str, ...] = ()
    bias: tuple[str, ...] = ()
    tie_default: Mapping[str, bool] = field(default_factory=_untied_by_default)
    model_loaders: Mapping[str, Mapping[str, LoaderFacts]] = field(default_factory=dict)
    tied_scale: TiedScale = TiedScale.NONE
    head_under_model: bool = False

    def __post_init__(self) -> None:
        what = f"family {self.family!r}"
        _need(isinstance(self.family, str) and bool(self.family), "a family row without a family name")
        _names(self.model_types, f"{what} model_types", empty=True)  # the fallback row has none
        for role in (TensorRole.INPUT_EMBEDDING, TensorRole.LM_HEAD):
            _names(self.names(role), f"{what} {role.value} names")
        _names(self.aliases, f"{what} aliases", empty=True)
        _names(self.bias, f"{what} bias", empty=True)
        _need(isinstance(self.tied_scale, TiedScale), f"{what}: tied_scale {self.tied_scale!r}")
        _per_loader_table(self.loaders, LoaderFacts, f"{what} loaders")
        _per_loader_table(self.tie_default, bool, f"{what} tie_default")
        for mt, table in self.model_loaders.items():
            _need(mt in self.model_types, f"{what} model_loaders: {mt!r} is not one of its model types")
            _per_loader_table(table, LoaderFacts, f"{what} model_loaders[{mt!r}]", covers_all=False)
        object.__setattr__(self, "loaders", frozen_map(self.loaders))
        object.__setattr__(self, "tie_default", frozen_map(self.tie_default))
        object.__setattr__(
            self, "model_loaders", frozen_map({k: frozen_map(v) for k, v in self.model_loaders.items()})
        )

    def names(self, role: TensorRole) -> tuple[str, ...]:
        """The suffixes this row lists for tensors of ``role`` (empty for a role it names nothing of)."""
        return {
            TensorRole.INPUT_EMBEDDING: self.embedding,
            TensorRole.EMBEDDING_ALIAS: self.aliases,
            TensorRole.LM_HEAD: self.head,
            TensorRole.HEAD_BIAS: self.bias,
        }.get(role, ())

    def role_of(self, suffix: str) -> TensorRole | None:
        """The role this row gives ``suffix`` (a name or a suffix of one), or None."""
        roles = (
            TensorRole.INPUT_EMBEDDING,
            TensorRole.EMBEDDING_ALIAS,
            TensorRole.LM_HEAD,
            TensorRole.HEAD_BIAS,
        )
        return next((r for r in roles if any(matches(suffix, s) for s in self.names(r))), None)


def _per_loader_table(table: Mapping[str, object], kind: type, what: str, covers_all: bool = True) -> None:
    """Every key of ``table`` a loader key, every value a ``kind``; with ``covers_all``, every loader
    resolves (``"*"`` or each loader listed), so a lookup never falls through."""
    _need(isinstance(table, Mapping) and bool(table), f"{what}: an empty table")
    for key, value in table.items():
        check_loader_key(key, what)
        _need(isinstance(value, kind), f"{what}[{key!r}]: {value!r} is not a {kind.__name__}")
    if covers_all and "*" not in table:
        lacking = [ld for ld in LOADERS if ld not in table]
        _need(not lacking, f"{what}: no entry for {', '.join(lacking)} and no '*'")


class ProofKey(NamedTuple):
    """What a proof covers: one model type (config.json ``model_type``, as detection resolves it), one loader
    (:data:`LOADERS`), one container (:data:`CONTAINERS`)."""

    model_type: str
    loader: str
    container: str


@dataclass(frozen=True)
class Family:
    """One row of the family table, resolved for one checkpoint's model_type and loader
    (:func:`surgery.arch.lookup`)."""

    name: str
    model_type: str | None
    loader: str
    embedding: tuple[str, ...]
    aliases: tuple[str, ...]
    head: tuple[str, ...]
    bias: tuple[str, ...]
    tie_default: bool
    head_layout: str
    reties: bool
    tied_scale: TiedScale = TiedScale.NONE
    always_tied: bool = False
    warns_missing_head: bool = False
    known: bool = True
    notes: tuple[str, ...] = field(default=())
    container: str | None = None
    proof: str | None = None
    head_under_model: bool = False
    proven_in: tuple[str, ...] = ()

    @property
    def proven(self) -> bool:
        """:data:`~surgery.arch.PROOFS` holds ``(model_type, loader, container)``: a test loaded a checkpoint
        the library wrote of this model type in this container and asserted this row's loader facts."""
        return self.proof is not None

    @property
    def trusted(self) -> bool:
        """A write may rely on this row's loader facts: proven (:data:`~surgery.arch.PROOFS`), or the model
        type has a row of its own and the loader is not one the tests can load with
        (:data:`PROVABLE_LOADERS`). A model type the table does not know (the fallback row) is never trusted,
        under any loader."""
        return self.proven or (self.known and self.loader not in PROVABLE_LOADERS)

    @property
    def may_drop_head(self) -> bool:
        """A write may drop a duplicate head (and embedding copies): the loader re-ties a missing head, and
        that is proven (``trusted``). Unproven, a head is kept equal to the embedding (right under every
        loader)."""
        return self.reties and self.trusted

    @property
    def refuses_untie(self) -> bool:
        """``untie`` is refused: the loader always takes the head from the embedding, and that is proven.
        Unproven, untie writes the head (an ignored head does no harm)."""
        return self.always_tied and self.trusted

    @property
    def head_layout_proven(self) -> bool:
        """The layout of a head tietool writes (``head_layout``) may come from the table: it is proven."""
        return self.trusted

    @property
    def scales_tied_logits(self) -> bool:
        """The loader multiplies the tied head for the logits (``tied_scale`` is not ``NONE``): a head equal
        to the embedding itself is not the tied head, and no head in the files is the shared table."""
        return self.tied_scale is not TiedScale.NONE

    def proven_loaders(self) -> tuple[str, ...]:
        """The loaders (in :data:`LOADERS` order) whose facts are proven for this model type and container
        (:data:`~surgery.arch.PROOFS`); empty when the container is not known."""
        return self.proven_in


# ============================================================================ token-indexed tables
class TokenRule(str, Enum):
    """How a token-indexed table follows a resize of the vocabulary it is indexed by (or keyed to)."""

    CYCLE_ROWS = "new rows repeat existing rows"  # row V + j = row j mod V: every value stays one in use
    NEW_FALSE = "new entries false/zero"  # a membership mask: a new token is not a member
    KEEP_IDS = "kept; its values are token ids"  # indexed by another vocabulary; ids must stay < the rows


@dataclass(frozen=True)
class TokenTable:
    """A token-indexed integer or boolean tensor whose meaning is known (one row of ``TOKEN_TABLES``).

    Attributes:
        pattern: regular expression matched against the end of a tensor name (after a dot or at the start).
        kind: ``int`` (any integer dtype) or ``bool``.
        ndim: its number of axes.
        indexed_by: ``vocab``: axis 0 counts the embedding's vocabulary (it is resized with it);
            ``other``: axis 0 counts another vocabulary the config names (``draft_vocab_size``): it is kept.
        rule: how a resize treats it (:class:`TokenRule`).
        bound: config keys (at the language model's level or the top), the first present of which bounds
            its values (``n_routed_experts``); empty: no bound checked.
        what: what it is, in words.
        source: where the fact comes from.
    """

    pattern: str
    kind: str
    ndim: int
    indexed_by: str
    rule: TokenRule
    bound: tuple[str, ...]
    what: str
    source: str

    def __post_init__(self) -> None:
        what = f"token table {self.pattern!r}"
        re.compile(self.pattern)
        _need(self.kind in ("int", "bool"), f"{what}: kind {self.kind!r}")
        _need(self.indexed_by in ("vocab", "other"), f"{what}: indexed_by {self.indexed_by!r}")
        _need(isinstance(self.rule, TokenRule) and self.ndim >= 1, f"{what}: rule or ndim")
        _names(self.bound, f"{what} bound", empty=True)

    @property
    def role(self) -> TensorRole:
        """Its role on the vocabulary surface: indexed by the vocabulary, or holding ids of it."""
        return TensorRole.TOKEN_TABLE if self.indexed_by == "vocab" else TensorRole.TOKEN_ID_MAP


# ============================================================================ tensor parallelism
class TPSplit(str, Enum):
    """How one tensor is cut across the tensor-parallel ranks (and so how ``merge`` joins it)."""

    VOCAB = "vocab"  # VocabParallelEmbedding: vocabulary rows (axis 0)
    HEAD = "head"  # LM head: its vocabulary axis, from the shapes ([hidden, vocab] → 1, [vocab, hidden] → 0)
    COLUMN = "column"  # ColumnParallelLinear weight/bias: the output axis (last), is_column=True
    ROW = "row"  # RowParallelLinear weight: the input axis (0), is_column=False
    REPLICATED = "replicated"  # norms, RowParallelLinear biases: the same on every rank
    FUSED_2 = "fused-2"  # is_naive_2fuse: rank r holds [gate_r, up_r]; merged [gate_0..gate_n, up_0..up_n]
    FUSED_3 = "fused-3"  # is_naive_3fuse: rank r holds [q_r, k_r, v_r] (q is kv_groups/(kv_groups+2))
    EXPERT = "expert"  # expert parallel: one expert's tensor, whole in the one rank file that holds it


# the split a tensor of a vocabulary role has (and only it): the embedding's rows, the head's vocab axis
TP_ROLE_SPLIT: Mapping[TensorRole, TPSplit] = MappingProxyType(
    {TensorRole.INPUT_EMBEDDING: TPSplit.VOCAB, TensorRole.LM_HEAD: TPSplit.HEAD}
)


@dataclass(frozen=True)
class TPRule:
    """One tensor's tensor-parallel split and its whole shape in config terms.

    ``shape`` names config quantities: ``V`` vocab_size, ``H`` hidden_size, ``I`` intermediate_size,
    ``2I`` twice it, ``Q`` num_attention_heads × head_dim, ``KV`` num_key_value_heads × head_dim, ``QKV``
    ``Q + 2 KV``, ``D`` head_dim. A HEAD's shape is ``("V", "H")`` in either order. ``role``: the tensor's
    :class:`~surgery.model.enums.TensorRole` when it is one of the vocabulary (the embedding is split
    ``VOCAB``, the head ``HEAD``, and nothing else is).
    """

    split: TPSplit
    shape: tuple[str, ...]
    role: TensorRole | None = None

    def __post_init__(self) -> None:
        _need(isinstance(self.split, TPSplit), f"tensor-parallel rule: split {self.split!r}")
        _names(self.shape, "tensor-parallel rule shape")
        expected = TP_ROLE_SPLIT.get(self.role) if self.role else None
        _need(
            (expected is self.split) if self.role else self.split not in TP_ROLE_SPLIT.values(),
            f"tensor-parallel rule: role {self.role} with split {self.split.value}",
        )


# ============================================================================ conversions
class Size(str, Enum):
    """A size of the model that a Linear weight's axis has, read from config.json
    (``surgery.inspect.linear_layout``)."""

    HIDDEN = "hidden_size"
    HIDDEN2 = "2 x hidden_size"
    Q = "num_attention_heads x head_dim"
    KV = "num_key_value_heads x head_dim"
    QKV = "(num_attention_heads + 2 x num_key_value_heads) x head_dim"
    INTER = "intermediate_size"
    INTER2 = "2 x intermediate_size"
    MOE_INTER = "moe_intermediate_size"
    MOE_INTER2 = "2 x moe_intermediate_size"
    SHARED_INTER = "moe_intermediate_size x moe_num_shared_experts"
    SHARED_INTER2 = "2 x moe_intermediate_size x moe_num_shared_experts"
    EXPERTS = "moe_num_experts"
    NUM_EXPERTS = "num_experts"
    SHARED_EXPERT_INTER = "shared_expert_intermediate_size"
    SHARED_EXPERT_INTER2 = "2 x shared_expert_intermediate_size"
    N_SHARED_INTER = "moe_intermediate_size x n_shared_experts"
    N_SHARED_INTER2 = "2 x moe_intermediate_size x n_shared_experts"
    N_ROUTED = "n_routed_experts"
    Q_LORA = "q_lora_rank"
    KV_LORA = "kv_lora_rank"
    KV_LORA_ROPE = "kv_lora_rank + qk_rope_head_dim"
    MLA_Q = "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)"
    MLA_KV = "num_attention_heads x (qk_nope_head_dim + v_head_dim)"
    MLA_O = "num_attention_heads x v_head_dim"
    Q_GATED = "2 x num_attention_heads x head_dim"
    QKV_GATED = "(2 x num_attention_heads + 2 x num_key_value_heads) x head_dim"
    LINEAR_QKVZ = (
        "2 x linear_num_key_heads x linear_key_head_dim + 2 x linear_num_value_heads x linear_value_head_dim"
    )
    LINEAR_BA = "2 x linear_num_value_heads"
    LINEAR_V = "linear_num_value_heads x linear_value_head_dim"
    ONE = "1"
    VOCAB = "vocab_size"


class Split(str, Enum):
    """How a fused projection's output axis splits into its parts."""

    QKV_GROUPED = "q, k, v grouped per kv head"  # [q x (heads / kv_heads), k, v] x kv_heads
    # as QKV_GROUPED with every query head twice as wide ([query | gate] per head: Qwen3-Next's gated
    # attention; paddle's fused_qkv macro cuts q into heads, k and v into kv heads, whatever their widths)
    QKV_GROUPED_GATED = "q (query | gate per head), k, v grouped per kv head"
    QKV_CONCAT = "q | k | v"  # heads, then kv heads, then kv heads (ERNIE's paddle2torch)
    HALVES = "gate | up"


class Naming(str, Enum):
    """The name prefix convention of a checkpoint's body tensors."""

    PADDLENLP = "paddlenlp"  # llama., qwen2., ... (PaddleNLP 2.x)
    KIT = "kit"  # ernie. (ERNIEKit, the ERNIE 4.5 *-Paddle releases)
    HF = "hf"  # model. (PaddleFormers, HF)


@dataclass(frozen=True)
class FusedSpec:
    """A fused projection: its parts (suffixes, same module), how its output axis splits, and the sizes of
    its two axes in ``[in, out]`` order (a weight; a bias is ``[out]``)."""

    parts: tuple[str, ...]
    split: Split
    dims: tuple[Size, Size]

    def __post_init__(self) -> None:
        _names(self.parts, "fused projection parts")
        _need(len(self.parts) == (2 if self.split is Split.HALVES else 3), f"fused parts {self.parts}")
        _need(len(self.dims) == 2 and all(isinstance(d, Size) for d in self.dims), f"fused dims {self.dims}")


@dataclass(frozen=True)
class ConversionRow:
    """One row of ``CONVERSIONS``.

    Attributes:
        prefixes: first name component of each naming the model type is stored with (``Naming.PADDLENLP``
            absent: tietool knows no PaddleNLP naming of it, conversion to PaddleNLP refuses).
        head: the LM head weight (top level, no prefix): ``[hidden, vocab]`` in PaddleNLP (and ERNIEKit,
            untied), ``[vocab, hidden]`` in PaddleFormers (legacy ``.pdparams`` and safetensors alike).
        linear: suffixes of ``nn.Linear`` weights inside the model body, with the sizes of their axes in
            Paddle's ``[in, out]`` order (the shape proves the layout).
        plain: suffixes of every other tensor (embeddings, norms, biases, statistics): copied byte for byte.
        embedding: the input embedding's suffix inside the body (one of ``plain``).
        fused: naming → fused projection suffix → :class:`FusedSpec` (weights and biases); a naming not
            listed has no fused tensors.
        paddlenlp_own_head: PaddleNLP 2.8 builds a head of its own whatever ``tie_word_embeddings`` says
            (fixtures README L11), so a PaddleFormers output of a checkpoint with a head is untied.
        paddlenlp_28: PaddleNLP 2.8.1 has a model class of the type (``paddlenlp/transformers/<type>``),
            so a PaddleNLP output says ``paddlenlp_version: null`` as 2.8.1 writes it; else (Qwen2, Qwen3:
            PaddleNLP 3 only) no version key is written, and tietool takes PaddleNLP 3 as the loader.
        paddlenlp_lacks: body suffixes (among ``plain``) PaddleNLP's class has no parameter for: its
            ``from_pretrained`` drops them with a log line only ("were not used"), so a PaddleNLP output
            holding one with values other than zero would load with other logits (conversion refuses).
    """

    prefixes: Mapping[Naming, str]
    head: str
    linear: Mapping[str, tuple[Size, Size]]
    plain: tuple[str, ...]
    embedding: str = "embed_tokens.weight"
    fused: Mapping[Naming, Mapping[str, FusedSpec]] = field(default_factory=dict)
    paddlenlp_own_head: bool = False
    paddlenlp_28: bool = False
    paddlenlp_lacks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _need(Naming.HF in self.prefixes, "conversion row: no HF prefix")
        _need(bool(self.linear), "conversion row: no Linear weights")
        _names(self.plain, "conversion row plain")
        _need(self.embedding in self.plain, f"conversion row: embedding {self.embedding!r} not among plain")
        _need(self.head not in self.linear, f"conversion row: head {self.head!r} listed as a body Linear")
        _names(self.paddlenlp_lacks, "conversion row paddlenlp_lacks", empty=True)
        _need(set(self.paddlenlp_lacks) <= set(self.plain), "conversion row: paddlenlp_lacks not among plain")
        for naming, specs in self.fused.items():
            _need(naming in self.prefixes, f"conversion row: fused tensors of {naming} without its prefix")
            _need(all(isinstance(s, FusedSpec) for s in specs.values()), "conversion row: a fused spec")
        object.__setattr__(self, "prefixes", frozen_map(self.prefixes))
        object.__setattr__(self, "linear", frozen_map(self.linear))
        object.__setattr__(self, "fused", frozen_map({k: frozen_map(v) for k, v in self.fused.items()}))

    @property
    def roles(self) -> Mapping[str, TensorRole]:
        """The suffixes of this row's vocabulary tensors and their roles (the head, the embedding)."""
        return {self.head: TensorRole.LM_HEAD, self.embedding: TensorRole.INPUT_EMBEDDING}


@dataclass(frozen=True)
class ConfigKeys:
    """config.json edits of one convert target: ``rename`` old → new key, ``drop`` keys, ``unfuse`` keys set
    false, ``set`` keys to these values, ``refuse_set``: keys whose non-null value tietool cannot translate
    (it refuses)."""

    rename: Mapping[str, str]
    drop: tuple[str, ...]
    unfuse: tuple[str, ...]
    set: Mapping[str, str | None]
    refuse_set: tuple[str, ...]

    def __post_init__(self) -> None:
        for f in (self.drop, self.unfuse, self.refuse_set):
            _names(f, "config keys", empty=True)
        object.__setattr__(self, "rename", frozen_map(self.rename))
        object.__setattr__(self, "set", frozen_map(self.set))
