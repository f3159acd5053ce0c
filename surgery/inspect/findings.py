"""Findings: what detection tells a user about a checkpoint (problems and notes), as data.

A :class:`Finding` is a kind (:class:`FindingKind`, which fixes its severity), the tensors it is about, and
the facts that word it (numbers, names, JSON-able). :func:`describe` is the one place that words a finding;
``inspect`` prints those words and ``--json`` adds the findings themselves (:meth:`Finding.as_dict`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..io.tokenizer import SpecialTokenId
from ..model.errors import Opt
from ..model.extras import install_extra


class Severity(str, Enum):
    """A problem is something a user must know about (inconsistent or unusable); a note is context."""

    PROBLEM = "problem"
    NOTE = "note"


class FindingKind(str, Enum):
    """Every kind of finding detection reports (the value is its name in ``--json``)."""

    MODEL_TYPE_NOT_STRING = "model-type-not-string"
    EMBEDDING_BY_SHAPE = "embedding-found-by-shape"
    MODEL_TYPE_NOT_IN_TABLE = "model-type-not-in-table"
    EMBEDDING_HIDDEN_MISMATCH = "embedding-hidden-size-mismatch"
    HEAD_BY_SHAPE = "head-found-by-shape"
    HEAD_NOT_2D = "head-not-2d"
    HEAD_TP_SLICE = "head-tensor-parallel-slice"
    HEAD_SHAPE_MISFIT = "head-shape-fits-neither-layout"
    TIE_FLAGS_DISAGREE = "tie-flags-disagree"
    AMBIGUOUS_LAYOUT = "ambiguous-head-layout"
    SCALED_TIED_HEAD = "scaled-tied-head"
    VOCAB_SIZE_MISMATCH = "config-vocab-size-mismatch"
    HEAD_ROWS_DIFFER = "head-rows-differ"
    PADDING_ROWS = "padding-rows-beyond-tokenizer"
    TOKENIZER_BEYOND_ROWS = "tokenizer-beyond-rows"
    TOKENIZER_UNREADABLE = "tokenizer-file-unreadable"
    TOKENIZER_FILES_DISAGREE = "tokenizer-files-disagree"
    TOKENIZER_ID_GAP = "tokenizer-id-gap"
    TOKENIZER_NEEDS_EXTRA = "tokenizer-needs-extra"
    TOKENIZER_READ_ONLY = "tokenizer-format-read-only"
    UNTRAINED_ROWS = "untrained-rows"
    SPECIAL_IDS_BEYOND_ROWS = "special-token-ids-beyond-rows"
    EMBEDDING_MISSING = "embedding-missing"
    TIED_BUT_DIFFERENT = "tied-but-different"
    HEAD_MISSING_NOT_RETIED = "head-missing-not-retied"
    LOADER_FACTS_UNPROVEN = "loader-facts-unproven"
    UNTIED_BUT_NO_HEAD = "untied-but-no-head"
    LAYOUT_CONFLICT = "layout-conflict"
    EXTRA_TABLES = "extra-vocabulary-tables"
    BY_SHAPE = "vocab-shaped-tensors"
    TOKEN_TABLES = "token-indexed-tables"
    OTHER_VOCABULARY = "other-vocabulary-tensors"
    HEAD_OTHER_VOCABULARY = "head-over-another-vocabulary"
    TEXT_VOCABULARY = "text-vocabulary-chosen"
    TEXT_VOCABULARY_UNCLEAR = "text-vocabulary-unclear"
    HEAD_UNNAMED = "head-not-named-but-shaped"
    PADDLE_LAYOUT = "paddle-layout-safetensors"


_NOTES = {
    FindingKind.EMBEDDING_BY_SHAPE,
    FindingKind.MODEL_TYPE_NOT_IN_TABLE,
    FindingKind.HEAD_BY_SHAPE,
    FindingKind.AMBIGUOUS_LAYOUT,
    FindingKind.SCALED_TIED_HEAD,
    FindingKind.HEAD_ROWS_DIFFER,
    FindingKind.PADDING_ROWS,
    FindingKind.TOKENIZER_NEEDS_EXTRA,
    FindingKind.TOKENIZER_READ_ONLY,
    FindingKind.UNTRAINED_ROWS,
    FindingKind.EXTRA_TABLES,
    FindingKind.BY_SHAPE,
    FindingKind.TOKEN_TABLES,
    FindingKind.OTHER_VOCABULARY,
    FindingKind.HEAD_OTHER_VOCABULARY,
    FindingKind.TEXT_VOCABULARY,
    FindingKind.LOADER_FACTS_UNPROVEN,
    FindingKind.PADDLE_LAYOUT,
}


@dataclass(frozen=True)
class OneOf:
    """Several values an option may take, as one :class:`~surgery.model.errors.Opt` value: the CLI words it
    ``vocab-hidden or hidden-vocab`` (its ``value``, as it words an Enum), Python ``'vocab-hidden' or
    'hidden-vocab'`` (its ``repr``)."""

    values: tuple[str | int, ...]

    @property
    def value(self) -> str:
        return " or ".join(map(str, self.values))

    def __repr__(self) -> str:
        return " or ".join(repr(getattr(v, "value", v)) for v in self.values)


@dataclass(frozen=True)
class Fix:
    """A remedy as data: run ``command`` (None: the operation just run) with the option ``opt`` (its value
    one value, or :class:`OneOf` several). Worded by the caller's wording of :class:`Opt`: ``resize
    vocab_size=16`` in Python, ``resize --vocab 16`` in the CLI."""

    opt: Opt
    command: str | None = None

    def __format__(self, spec: str) -> str:
        return f"{self.command} {self.opt}" if self.command else f"{self.opt}"

    def __str__(self) -> str:
        return format(self)

    def as_dict(self) -> dict[str, Any]:
        """``{"command", "option", "values"}``: the option by its Python name (``vocab_size``, ``layout``)."""
        v = self.opt.value
        return {
            "command": self.command,
            "option": self.opt.name,
            "values": list(v.values) if isinstance(v, OneOf) else [v],
        }


@dataclass(frozen=True)
class Finding:
    """One finding.

    Attributes:
        kind: what was found (fixes the severity).
        tensors: the tensors it is about, main subject first.
        facts: the numbers and names that word it (JSON-able; keys per kind, see :data:`_WORDS`).
        fix: a remedy (an option and its value), when the finding names one.
    """

    kind: FindingKind
    tensors: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    fix: Fix | None = None

    @property
    def severity(self) -> Severity:
        return Severity.NOTE if self.kind in _NOTES else Severity.PROBLEM

    def __str__(self) -> str:
        return describe(self)

    def as_dict(self) -> dict[str, Any]:
        """``{"kind", "severity", "tensors", **facts, "fix"}`` for ``--json``."""
        fix = self.fix
        return {
            "kind": self.kind.value,
            "severity": self.severity.value,
            "tensors": list(self.tensors),
            **self.facts,
            "fix": None if fix is None else fix.as_dict(),
        }


def _missing_embedding(f: Finding) -> str:
    emb, head = f.tensors
    where = (
        "the safetensors metadata records it as a dropped copy of it"
        if f.facts["recorded_as_dropped"]
        else "no tensor has one of the family's embedding names"
    )
    return (
        f"the input embedding {emb} is missing: the table is stored only as the head {head} "
        f"({where}); untie or tie {Opt('keep', 'head')} restores it from the head's bytes"
    )


def _ambiguous_layout(f: Finding) -> str:
    x = f.facts
    compared = ""
    if x["as_stored"] is not None:
        compared = (
            f" (as stored: {x['as_stored']}; transposed: {'equal' if x['transposed_equal'] else 'different'})"
        )
    return (
        f"vocab_size == hidden_size ({x['size']}): the head's layout cannot be told from its "
        f"shape{compared}; pass {f.fix}"
    )


def _head_rows_differ(f: Finding) -> str:
    (emb, head), x = f.tensors, f.facts
    V, rows = x["embedding_rows"], x["head_rows"]
    return (
        f"the embedding {emb} has {V} rows and the head {head} has {rows}: "
        f"{abs(V - rows)} rows only the {'embedding' if V > rows else 'head'} has "
        "(reserved or image rows); tie needs equal shapes, resize moves both by the same number of rows"
    )


def _padding_rows(f: Finding) -> str:
    V, n = f.facts["embedding_rows"], f.facts["tokenizer_size"]
    return (
        f"the embedding has {V} rows and the tokenizer defines {n} tokens (highest id "
        f"{n - 1}): {V - n} padding rows beyond the tokenizer (normal when vocab_size is "
        f"padded to a multiple; trimming below {n} would break tokens)"
    )


def _tokenizer_beyond_rows(f: Finding) -> str:
    V, n, sources = f.facts["embedding_rows"], f.facts["tokenizer_size"], f.facts["tokenizer_files"]
    return (
        f"the tokenizer defines {n} tokens (highest id {n - 1}, from "
        f"{', '.join(sources)}) but the embedding has only {V} rows: the model is "
        f"{n - V} row(s) short ({f.fix})"
    )


def _ids_shown(part: dict) -> str:
    first = [str(i) if isinstance(i, int) else f"{i['id']} = {i['same_as']}" for i in part["first"]]
    return ", ".join(first) + (", …" if part["count"] > len(first) else "")


def _untrained_rows(f: Finding) -> str:
    x = f.facts
    parts = []
    if x["zero"]["count"]:
        parts.append(f"{x['zero']['count']} all-zero (ids {_ids_shown(x['zero'])})")
    if x["duplicate"]["count"]:
        parts.append(
            f"{x['duplicate']['count']} identical to an earlier row (ids {_ids_shown(x['duplicate'])})"
        )
    if x["low_norm"]["count"]:
        parts.append(
            f"{x['low_norm']['count']} with an L2 norm below {x['low_norm_factor']:g} × "
            f"the median row norm {x['median_norm']:.3g} (ids {_ids_shown(x['low_norm'])})"
        )
    beyond = x.get("beyond_tokenizer")
    tail = f"; {beyond} of them beyond the tokenizer's {x['tokenizer_size']} tokens" if beyond else ""
    tokens = x.get("zero_tokens") or []
    if tokens:
        shown = ", ".join(f"{t['content']!r} ({t['id']})" for t in tokens)
        tail += (
            "; tokens with all-zero rows (untrained: the reported cause of NaN losses and of chat templates "
            "never learned; add-tokens of these tokens gives them rows by its init, as new tokens get): "
            + shown
        )
    pad = (
        f"row {x['pad_row']} of {f.tensors[0]} is all zero: the pad row (pad_token_id {x['pad_row']}), zero "
        "by design (padding_idx)"
        if "pad_row" in x
        else ""
    )
    if not parts:
        return pad
    return (
        f"rows of {f.tensors[0]} that look untrained ({x['rows']} rows): "
        + "; ".join(parts)
        + tail
        + (f" ({pad}, not counted)" if pad else "")
    )


def _tokenizer_id_gap(f: Finding) -> str:
    gaps, moved = f.facts["gaps"], f.facts["renumbered"]
    ids = f"{gaps[0]}..{gaps[-1]}" if len(gaps) > 1 else str(gaps[0])
    shown = ", ".join(f"{m['content']!r} {m['id']} → {m['loaded_id']}" for m in moved[:3])
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    return (
        f"tokenizer id(s) {ids} are named by no tokenizer file (a gap): tokenizers, transformers and "
        f"PaddleFormers renumber the added tokens after it on load ({shown}{more}), so those tokens use "
        "other rows than the ids the files give them (add-tokens refuses the folder; save the tokenizer "
        "again with save_pretrained so its ids are contiguous)"
    )


def _special_ids_beyond_rows(f: Finding) -> str:
    V = f.facts["embedding_rows"]
    ids = (SpecialTokenId(i["file"], i["key"], i["id"]) for i in f.facts["ids"])
    return f"token ids beyond the last row of the embedding ({V} rows, ids 0..{V - 1}): " + ", ".join(
        map(str, ids)
    )


def _tied_but_different(f: Finding) -> str:
    (head, emb), x = f.tensors, f.facts
    return (
        f"tied in config ({x['config_source']} = true) but {head} differs from {emb}: max |difference| "
        f"{x['max_abs_diff']:.3g} in {x['differing_rows']} of {x['embedding_rows']} rows; a loader that "
        "re-ties ignores the head's values"
    )


def _tie_flags_disagree(f: Finding) -> str:
    x = f.facts
    return (
        "tie_word_embeddings flags disagree: "
        + ", ".join(f"{k} = {str(v).lower()}" for k, v in x["flags"].items())
        + f"; {x['governing']} governs the language model, so {x['used']} is used"
    )


def _head_tp_slice(f: Finding) -> str:
    x = f.facts
    return (
        f"the head {f.tensors[0]} {x['shape']} has {x['head_rows']} vocab rows, exactly 1/{x['fraction']} of "
        f"the embedding's {x['embedding_rows']}: likely an unmerged tensor-parallel shard (merge the "
        "tensor-parallel slices first)"
    )


def _token_tables(f: Finding) -> str:
    shown = [f"{t['name']} ({t['what']}: {t['rule']})" for t in f.facts["tables"]]
    return "token-indexed tables, resized with the embedding by the architecture table's rule: " + "; ".join(
        shown
    )


def _other_vocabulary(f: Finding) -> str:
    groups = [
        f"config.json {k} = {v['size']}: {', '.join(v['tensors'])}" for k, v in f.facts["by_key"].items()
    ]
    return "tensors of another vocabulary, left as they are by resize (" + "; ".join(groups) + ")"


def _head_other_vocabulary(f: Finding) -> str:
    (head, emb), x = f.tensors, f.facts
    return (
        f"the head {head} has {x['head_rows']} rows: it is over another vocabulary, config.json "
        f"{x['head_key']} = {x['head_rows']}, not the embedding's ({x['embedding_key']} = "
        f"{x['embedding_rows']} rows of {emb}); by design, not a truncated or tensor-parallel head: tie "
        "cannot serve both with one table, resize keeps it"
    )


def _text_vocabulary(f: Finding) -> str:
    x = f.facts
    named = ", ".join(f"{k} = {v}" for k, v in x["vocabularies"].items())
    return (
        f"config.json names several vocabularies ({named}): the text model's is {x['block']} "
        f"({x['key']} = {x['size']}), so the pair is {f.tensors[0]} / {f.tensors[1]}; the other "
        "vocabularies' tensors are left as they are"
    )


def _text_vocabulary_unclear(f: Finding) -> str:
    pairs = [
        f"{c['block']}: {Opt('embedding', c['embedding'])} {Opt('head', c['head'])}"
        if "embedding" in c
        else f"{c['block']}: {Opt('embedding')}/{Opt('head')} among {', '.join(c['tables']) or 'none'}"
        for c in f.facts["candidates"]
    ]
    return (
        f"config.json names several language-model blocks ({', '.join(f.facts['blocks'])}): which one is "
        "the text vocabulary is not clear (tie/untie/resize refuse until the pair is named); pass "
        + ("; or ".join(pairs) if pairs else f"{Opt('embedding', 'NAME')} and {Opt('head', 'NAME')}")
    )


def _head_unnamed(f: Finding) -> str:
    head, shaped = f.tensors[0], f.tensors[1:]
    return (
        f"no tensor is named like the head ({head}), but {', '.join(shaped)} has the vocabulary's shape: it "
        f"may be a trained head under another name, so the model is not 'tied' by absence; if it is the "
        f"head, pass {Opt('head', shaped[0])} (tie and untie refuse until then)"
    )


def _loader_hint(x: Mapping[str, Any]) -> str:
    """How to tell tietool which library loads the output: ``--loader``, with the loaders proven for the
    model type (only a proven loader lets a write drop the head)."""
    proven = x["proven_loaders"]
    if proven:
        return (
            f"pass {Opt('loader', OneOf(tuple(proven)))} if that library loads it (proven for "
            f"{x['model_type']} from {x['container']}: only a proven loader lets tietool drop the head)"
        )
    return (
        f"no loader is proven for {x['model_type']} from {x['container']}; {Opt('loader')} names the "
        "library that loads it, and a head is dropped only under a proven one"
    )


def _loader_facts_unproven(f: Finding) -> str:
    x = f.facts
    return (
        f"what the {x['loader']} loader does with the head of {x['model_type']} from {x['container']} "
        "(re-ties a missing head, ignores an untied one, the head layout) is unproven: tie and resize keep "
        "the head equal to the embedding, untie writes it; " + _loader_hint(x)
    )


def _head_missing_not_retied(f: Finding) -> str:
    x = f.facts
    if x.get("proven", True):
        return (
            f"no head in the files, and the {x['loader']} loader does not re-tie a missing head: it "
            f"would load a random {f.tensors[0]} (run untie to write it, or pass {Opt('loader')} if another "
            "library loads it)"
        )
    return (
        f"no head in the files, and whether the {x['loader']} loader re-ties a missing head of "
        f"{x['model_type']} from {x['container']} is unproven: it may load a random {f.tensors[0]} (untie "
        "writes it, right under every loader; or " + _loader_hint(x) + ")"
    )


_WORDS: dict[FindingKind, Callable[[Finding], str]] = {
    FindingKind.MODEL_TYPE_NOT_STRING: lambda f: "config.json model_type is not a string; ignored",
    FindingKind.EMBEDDING_BY_SHAPE: lambda f: (
        f"model_type {f.facts['model_type']!r} is not in the architecture table: found the embedding "
        f"{f.tensors[0]} by its shape [vocab_size, hidden_size]"
    ),
    FindingKind.MODEL_TYPE_NOT_IN_TABLE: lambda f: (
        f"model_type {f.facts['model_type']!r} is not in the architecture table: names matched by the "
        "common patterns"
    ),
    FindingKind.EMBEDDING_HIDDEN_MISMATCH: lambda f: (
        f"the embedding {f.tensors[0]} is {f.facts['shape']} but config hidden_size is "
        f"{f.facts['config_hidden_size']}"
    ),
    FindingKind.HEAD_BY_SHAPE: lambda f: f"found the head {f.tensors[0]} by its shape",
    FindingKind.HEAD_NOT_2D: lambda f: f"the head {f.tensors[0]} has shape {f.facts['shape']}, not 2-D",
    FindingKind.HEAD_TP_SLICE: _head_tp_slice,
    FindingKind.HEAD_SHAPE_MISFIT: lambda f: (
        f"the head {f.tensors[0]} has shape {f.facts['shape']}, which fits neither [vocab, hidden] = "
        f"[{f.facts['embedding_rows']}, {f.facts['hidden_size']}] nor [hidden, vocab]"
    ),
    FindingKind.TIE_FLAGS_DISAGREE: _tie_flags_disagree,
    FindingKind.AMBIGUOUS_LAYOUT: _ambiguous_layout,
    FindingKind.SCALED_TIED_HEAD: lambda f: (
        f"{f.tensors[0]} equals {f.tensors[1]} × d_model ** -0.5: the tied head of {f.facts['family']}, "
        "materialised (as tietool untie writes it)"
    ),
    FindingKind.VOCAB_SIZE_MISMATCH: lambda f: (
        f"config {f.facts.get('key', 'vocab_size')} is {f.facts['config_vocab_size']} but the embedding "
        f"{f.tensors[0]} has {f.facts['embedding_rows']} rows ({f.fix} fixes "
        f"{f.facts.get('key', 'vocab_size')}; tie and untie refuse until then)"
    ),
    FindingKind.HEAD_ROWS_DIFFER: _head_rows_differ,
    FindingKind.PADDING_ROWS: _padding_rows,
    FindingKind.TOKENIZER_BEYOND_ROWS: _tokenizer_beyond_rows,
    FindingKind.TOKENIZER_UNREADABLE: lambda f: f"tokenizer file {f.facts['file']} could not be read",
    FindingKind.SPECIAL_IDS_BEYOND_ROWS: _special_ids_beyond_rows,
    FindingKind.TOKENIZER_FILES_DISAGREE: lambda f: (
        f"the tokenizer files disagree: {f.facts['disagreement']}"
    ),
    FindingKind.TOKENIZER_ID_GAP: _tokenizer_id_gap,
    FindingKind.TOKENIZER_NEEDS_EXTRA: lambda f: (
        f"tokenizer file(s) {', '.join(f.facts['files'])} not parsed: reading them needs the tokenizer "
        f"extra ({install_extra('tokenizer')})"
    ),
    FindingKind.TOKENIZER_READ_ONLY: lambda f: (
        f"tokenizer file(s) {', '.join(f.facts['files'])}: a tiktoken rank file or a custom tokenizer class "
        "(auto_map AutoTokenizer), which tietool reads (a tiktoken file's ranks are counted) but cannot edit "
        "(add-tokens refuses them)"
    ),
    FindingKind.UNTRAINED_ROWS: _untrained_rows,
    FindingKind.EMBEDDING_MISSING: _missing_embedding,
    FindingKind.TIED_BUT_DIFFERENT: _tied_but_different,
    FindingKind.HEAD_MISSING_NOT_RETIED: _head_missing_not_retied,
    FindingKind.LOADER_FACTS_UNPROVEN: _loader_facts_unproven,
    FindingKind.UNTIED_BUT_NO_HEAD: lambda f: (
        f"untied in config ({f.facts['config_source']} = false) but no head ({f.tensors[0]}) was found in "
        "the files: effectively tied; a loader would fail or initialise a random head (tie fixes the "
        "flag; untie writes the head as a copy of the embedding)"
    ),
    FindingKind.LAYOUT_CONFLICT: lambda f: (
        f"the requested layout {f.facts['requested']} contradicts the head {f.tensors[0]} "
        f"{f.facts['shape']}: the layout that fits is {f.facts['fits']}"
    ),
    FindingKind.EXTRA_TABLES: lambda f: (
        "further vocabulary tables (resized with the embedding and head): " + ", ".join(f.tensors)
    ),
    FindingKind.BY_SHAPE: lambda f: (
        "tensors of no known vocabulary name or rule with an axis of the vocabulary's size (resize refuses "
        f"until they are named or removed): {', '.join(f.tensors)}"
    ),
    FindingKind.TOKEN_TABLES: _token_tables,
    FindingKind.OTHER_VOCABULARY: _other_vocabulary,
    FindingKind.HEAD_OTHER_VOCABULARY: _head_other_vocabulary,
    FindingKind.TEXT_VOCABULARY: _text_vocabulary,
    FindingKind.TEXT_VOCABULARY_UNCLEAR: _text_vocabulary_unclear,
    FindingKind.HEAD_UNNAMED: _head_unnamed,
    FindingKind.PADDLE_LAYOUT: lambda f: (
        f"PaddleFormers safetensors in its legacy Paddle layout (Linear weights [in, out]; "
        f"{f.facts['evidence']}): a plain from_pretrained loads it without an error but computes other "
        f"logits; load it with {f.facts['load']}"
    ),
}


def describe(finding: Finding) -> str:
    """The finding in words, as ``inspect`` prints it and ``--json`` lists it under problems/notes."""
    return _WORDS[finding.kind](finding)
