"""Architecture knowledge as data: the face every other module reads it through (``from .. import arch``).

* :mod:`~surgery.arch.rows` — the row types (frozen records with defaults, checked when built);
* :mod:`~surgery.arch.families` — ``FAMILIES`` (names per :class:`~surgery.model.enums.TensorRole` and the
  loader facts), ``FALLBACK``, extra and token-indexed tables, PaddleNLP prefixes, ``PROOFS``;
* :mod:`~surgery.arch.parallel` — ``TENSOR_PARALLEL`` (``merge``);
* :mod:`~surgery.arch.conversions` — ``CONVERSIONS``, ``PADDLEFORMERS_LACKS``, ``CONFIG_KEYS`` (``convert``),
  ``FLEX_MERGE_PROOFS`` (``merge`` of Trainer flex checkpoints);
* :mod:`~surgery.arch.config_keys` — every config key name tietool reads to size a model.

:func:`lookup` resolves a family row for one model type, loader and container; :func:`tp_rule` and
:func:`conversion_row` read the other two tables. The tables are checked against each other when this
package is imported (:func:`check_tables`): a model type in two rows, a key no row knows, an empty list of
names fails the import, naming the row. arch imports nothing but :mod:`surgery.model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from ..model.enums import TensorRole, TiedScale
from ..model.errors import UsageError
from .config_keys import (
    HIDDEN_SIZE_KEYS,
    KEY_DIM,
    TABLE_SIZE_KEYS,
    TEXT_BLOCKS,
    TP_SIZE_KEYS,
    VOCAB_SIZE_KEYS,
)
from .conversions import (
    ANY_LINEAR,
    CONFIG_KEYS,
    CONVERSIONS,
    FLEX_MERGE_PROOFS,
    PADDLEFORMERS_LACKS,
    TIED_HEAD_NOT_EXPORTED,
)
from .families import (
    EXTRA_TABLES,
    FALLBACK,
    FAMILIES,
    HEAD_BIAS_OF,
    HF_NOT_PF,
    HF_PDPARAMS_PROVEN,
    HF_UNTIED_KEEPS_ALIASES_APART,
    NAME_LAYOUTS,
    PADDLENLP_PREFIXES,
    PROOFS,
    TOKEN_TABLES,
    U16_BFLOAT16_ONLY,
    depth,
    head_bias_names,
    is_extra_table,
    is_listed_extra,
    model_type_by_names,
    token_table,
)
from .parallel import (
    EXPERT_COUNT_KEYS,
    EXPERT_COUNTS,
    EXPERT_NAME_RE,
    PARALLEL_CONFIG_KEYS,
    SHIPPED_EXPERT_COUNT_KEYS,
    TENSOR_PARALLEL,
    TP_DIM_KEYS,
    ExpertCount,
    tp_rule,
)
from .rows import (
    CONTAINERS,
    LOADERS,
    PROVABLE_LOADERS,
    ConfigKeys,
    ConversionRow,
    Family,
    FamilyRow,
    FusedSpec,
    LoaderFacts,
    Naming,
    ProofKey,
    Size,
    Split,
    TableError,
    TokenRule,
    TokenTable,
    TPRule,
    TPSplit,
    matches,
)

__all__ = [
    "ANY_LINEAR",
    "CONFIG_KEYS",
    "CONTAINERS",
    "CONVERSIONS",
    "EXPERT_COUNT_KEYS",
    "EXPERT_COUNTS",
    "SHIPPED_EXPERT_COUNT_KEYS",
    "ExpertCount",
    "FLEX_MERGE_PROOFS",
    "TIED_HEAD_NOT_EXPORTED",
    "EXPERT_NAME_RE",
    "EXTRA_TABLES",
    "FALLBACK",
    "FAMILIES",
    "HEAD_BIAS_OF",
    "HF_NOT_PF",
    "HF_PDPARAMS_PROVEN",
    "HF_UNTIED_KEEPS_ALIASES_APART",
    "HIDDEN_SIZE_KEYS",
    "KEY_DIM",
    "LOADERS",
    "NAME_LAYOUTS",
    "PADDLEFORMERS_LACKS",
    "PADDLENLP_PREFIXES",
    "PARALLEL_CONFIG_KEYS",
    "PROOFS",
    "PROVABLE_LOADERS",
    "TABLE_SIZE_KEYS",
    "TENSOR_PARALLEL",
    "TEXT_BLOCKS",
    "TOKEN_TABLES",
    "TP_DIM_KEYS",
    "TP_SIZE_KEYS",
    "U16_BFLOAT16_ONLY",
    "VOCAB_SIZE_KEYS",
    "ConfigKeys",
    "ConversionRow",
    "Family",
    "FamilyRow",
    "FusedSpec",
    "LoaderFacts",
    "Naming",
    "ProofKey",
    "Size",
    "Split",
    "TPRule",
    "TPSplit",
    "TableError",
    "TensorRole",
    "TiedScale",
    "TokenRule",
    "TokenTable",
    "check_tables",
    "conversion_row",
    "depth",
    "head_bias_names",
    "family_row",
    "is_extra_table",
    "is_listed_extra",
    "lookup",
    "matches",
    "model_type_by_names",
    "paddleformers_lacks",
    "proven_loaders",
    "token_table",
    "tp_rule",
]

_T = TypeVar("_T")


def family_row(model_type: object) -> FamilyRow | None:
    """The :data:`FAMILIES` row listing ``model_type`` (config.json's value, of any type), or None."""
    return next((r for r in FAMILIES if model_type in r.model_types), None)


def _per_loader(table: Mapping[str, _T], loader: str, container: str | None = None) -> _T:
    """The entry of ``table`` for ``loader/container``, else for ``loader``, else ``"*"``.

    Raises:
        UsageError: ``loader`` is not one of ``LOADERS`` (every row covers each of those).
    """
    if container and f"{loader}/{container}" in table:
        return table[f"{loader}/{container}"]
    if loader in table:
        return table[loader]
    if "*" in table:
        return table["*"]
    raise UsageError(f"unknown loader {loader!r}", fix=f"use one of {', '.join(LOADERS)}")


def proven_loaders(model_type: str | None, container: str | None) -> tuple[str, ...]:
    """The loaders (in :data:`LOADERS` order) whose facts :data:`PROOFS` holds a proof of for
    ``model_type`` read from ``container``; empty when either is None."""
    return tuple(ld for ld in LOADERS if ProofKey(model_type or "", ld, container or "") in PROOFS)


def lookup(model_type: str | None, loader: str, container: str | None = None) -> Family:
    """The table row for ``model_type`` (or the fallback row), with the facts of ``loader`` resolved, and
    the proof of those facts (:data:`PROOFS`; ``Family.proven``).

    Args:
        model_type: config.json ``model_type`` (or ``text_config.model_type``); None if absent.
        loader: one of ``LOADERS``.
        container: ``safetensors`` or ``pdparams`` (a loader may read the two differently); None: any
            (then nothing is proven: a proof is per container).

    Raises:
        UsageError: ``loader`` is not one of ``LOADERS``.
    """
    found = family_row(model_type)
    row = found or FALLBACK
    own = row.model_loaders.get(model_type or "", {})
    key = next((k for k in (f"{loader}/{container}", loader) if k in own), None)
    facts = own[key] if key else _per_loader(row.loaders, loader, container)
    return Family(
        name=row.family,
        model_type=model_type,
        loader=loader,
        embedding=row.embedding,
        aliases=row.aliases,
        head=row.head,
        bias=row.bias,
        tie_default=bool(_per_loader(row.tie_default, loader)),
        head_layout=facts.layout.value,
        reties=facts.reties,
        tied_scale=row.tied_scale,
        always_tied=facts.always_tied,
        warns_missing_head=facts.warns_missing_head,
        known=found is not None,
        container=container,
        proof=PROOFS.get(ProofKey(model_type or "", loader, container or "")),
        head_under_model=row.head_under_model,
        proven_in=proven_loaders(model_type, container),
    )


def conversion_row(model_type: object) -> ConversionRow | None:
    """The :data:`CONVERSIONS` row of ``model_type`` (config.json's value, of any type), or None."""
    return CONVERSIONS.get(model_type) if isinstance(model_type, str) else None


def paddleformers_lacks(model_type: str) -> str | None:
    """How messages name ``model_type`` when PaddleFormers 1.2 has no class for it (by its own entry in
    :data:`PADDLEFORMERS_LACKS` or its family's), else None."""
    row = family_row(model_type)
    return PADDLEFORMERS_LACKS.get(model_type) or PADDLEFORMERS_LACKS.get(row.family if row else "unknown")


def _families_problems(families: tuple[FamilyRow, ...]) -> list[str]:
    out: list[str] = []
    seen: dict[str, str] = {}
    for row in families:
        if not row.model_types:
            out.append(f"family {row.family!r} lists no model types")
        for mt in row.model_types:
            if mt in seen:
                out.append(f"model type {mt!r} is in two rows: {seen[mt]!r} and {row.family!r}")
            seen.setdefault(mt, row.family)
    names = [r.family for r in families]
    out += [f"family {f!r} has two rows" for f in sorted({f for f in names if names.count(f) > 1})]
    return out


def _keys_problems(
    families: tuple[FamilyRow, ...],
    tensor_parallel: Mapping[str, Mapping[str, TPRule]],
    conversions: Mapping[str, ConversionRow],
    lacks: Mapping[str, str],
) -> list[str]:
    out: list[str] = []
    by_type = {mt: r for r in families for mt in r.model_types}
    for table, keys in (("TENSOR_PARALLEL", tensor_parallel), ("CONVERSIONS", conversions)):
        out += [f"{table} key {k!r} is not a model type of FAMILIES" for k in keys if k not in by_type]
    known = set(by_type) | {r.family for r in families}
    out += [
        f"PADDLEFORMERS_LACKS key {k!r} is neither a family nor a model type" for k in lacks if k not in known
    ]
    for mt, rules in tensor_parallel.items():
        if not rules:
            out.append(f"TENSOR_PARALLEL[{mt!r}] is empty")
        for suffix, rule in rules.items():
            out += _role_problems(by_type.get(mt), f"TENSOR_PARALLEL[{mt!r}]", suffix, rule.role)
            out += [
                f"TENSOR_PARALLEL[{mt!r}][{suffix!r}]: size {s!r}" for s in rule.shape if s not in TP_DIM_KEYS
            ]
    for mt, conv in conversions.items():
        for suffix, role in conv.roles.items():
            out += _role_problems(by_type.get(mt), f"CONVERSIONS[{mt!r}]", suffix, role)
    return out


def _role_problems(row: FamilyRow | None, where: str, suffix: str, role: TensorRole | None) -> list[str]:
    """A suffix a table gives a vocabulary role that the model type's family row does not give it (or the
    other way round): the tables would disagree on which tensor is the head."""
    if row is None:
        return []
    theirs = row.role_of(suffix)
    if role is None and theirs is None:
        return []
    if role is not None and suffix in row.names(role):
        return []
    return [
        f"{where}[{suffix!r}] is {role.value if role else 'no vocabulary tensor'} but family "
        f"{row.family!r} says {theirs.value if theirs else 'nothing'}"
    ]


def check_tables(
    families: tuple[FamilyRow, ...] = FAMILIES,
    tensor_parallel: Mapping[str, Mapping[str, TPRule]] = TENSOR_PARALLEL,
    conversions: Mapping[str, ConversionRow] = CONVERSIONS,
    lacks: Mapping[str, str] = PADDLEFORMERS_LACKS,
    proofs: Mapping[ProofKey, str] = PROOFS,
) -> list[str]:
    """What is wrong across the tables (empty when nothing is): no model type in two rows and no row
    without one; every ``TENSOR_PARALLEL`` / ``CONVERSIONS`` key a model type of a row; every
    ``PADDLEFORMERS_LACKS`` key a family or a model type; every suffix those tables call the LM head or the
    input embedding a name the family row gives that role; every size a tensor-parallel shape names one
    ``merge`` can compute; every proof for a known model type, loader and container. (Each row's own checks
    run when it is built: :mod:`~surgery.arch.rows`.)"""
    out = _families_problems(families) + _keys_problems(families, tensor_parallel, conversions, lacks)
    types = {mt for r in families for mt in r.model_types}
    for key in proofs:
        if key.model_type not in types or key.loader not in LOADERS or key.container not in CONTAINERS:
            out.append(f"PROOFS key {tuple(key)} names an unknown model type, loader or container")
    out += [
        f"TP_DIM_KEYS[{s!r}] names {k!r}, not a key of TP_SIZE_KEYS"
        for s, keys in TP_DIM_KEYS.items()
        for k in keys
        if k not in TP_SIZE_KEYS.values()
    ]
    return out


def _check_on_import() -> None:
    problems = check_tables()
    if problems:
        raise TableError("; ".join(problems))


_check_on_import()
