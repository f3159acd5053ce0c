"""Detection: the vocabulary surface of a checkpoint (every tensor with a vocabulary axis, each with a
role), the main input embedding and LM head among them, the head's layout, and the tie state three ways
(config flag, head present in the files, head values vs embedding values).

Reads headers, and the data of the embedding and head only (to compare values). Architecture knowledge
comes from :mod:`surgery.arch`; nothing here names a model. The main pair is chosen by the table's
order of preference, then by module depth (the model's own table beats a copy inside a layer), never by
file order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import arch
from ..io.checkpoint import Checkpoint
from ..io.surface import quant_module
from ..io.tokenizer import special_token_ids, tokenizer_info
from ..model.enums import LAYOUTS, FoundBy, HeadLayout, TieState, ValueCompare
from ..model.errors import CheckpointError, Opt
from ..model.tokens import TokenizerSet
from .compare import compare, shared_storage
from .detection import (
    Beyond,
    BiasMatch,
    Comparison,
    ConfigFacts,
    Detection,
    EmbeddingMatch,
    HeadMatch,
    LoaderChoice,
    TieFlag,
)
from .finders import (
    Cfg,
    Flag,
    HeadShape,
    block_at,
    check_overrides,
    config_facts,
    config_flag,
    find_aliases,
    find_bias,
    find_by_shape,
    find_embedding,
    find_extra_tables,
    find_head,
    get_dotted_int,
    head_shape,
    infer_loader,
    missing_embedding_name,
    ranked_by_suffix,
    settle_text,
)
from .findings import Finding, FindingKind, Fix, OneOf
from .vocabularies import (
    dtype_kind,
    float_counts,
    sized_by,
    table_size_key,
)


def _ambiguous_layout(
    head: str, size: int, as_stored: str | None = None, transposed: bool | None = None
) -> Finding:
    """The note on a square head (``vocab_size == hidden_size``) whose layout its shape cannot tell, with how
    it compared both ways when it was compared."""
    facts = {"size": size, "as_stored": as_stored, "transposed_equal": transposed}
    return Finding(FindingKind.AMBIGUOUS_LAYOUT, (head,), facts, Fix(Opt("layout", OneOf(LAYOUTS))))


def _compare_pair(
    ckpt: Checkpoint, fam: arch.Family, pair: tuple[str, str], shape: HeadShape, H: int, first: bool
) -> tuple[Comparison, list[Finding]]:
    """Head vs embedding values (an ambiguous square head both ways; T5's scaled tied head); notes.

    An unusable head (layout None) or one with other rows than the embedding is ``different`` unread. Reads
    both tables in row chunks (:func:`compare`; up to the first difference only with ``first``)."""
    embedding, head = pair
    notes: list[Finding] = []
    if shape.layout is None or (shape.rows is not None and shape.rows != ckpt.tensors[embedding].shape[0]):
        return Comparison(TieState.DIFFERENT), notes
    if shape.layout is HeadLayout.AMBIGUOUS:
        as_stored = compare(ckpt, embedding, head, HeadLayout.VOCAB_HIDDEN, first_difference=first)
        transposed = compare(ckpt, embedding, head, HeadLayout.HIDDEN_VOCAB, first_difference=first)
        as_transposed = transposed.values is TieState.TRANSPOSED
        comp = transposed if as_stored.values is not TieState.EXACT and as_transposed else as_stored
        notes.append(_ambiguous_layout(head, H, as_stored.values, as_transposed))
        return comp, notes
    comp = compare(ckpt, embedding, head, shape.layout, first_difference=first)
    if comp.values is TieState.DIFFERENT and fam.scales_tied_logits:
        scale = tied_scale(ckpt.config, H, ckpt.path)
        scaled = compare(ckpt, embedding, head, shape.layout, scale=scale, first_difference=first)
        if scaled.values is TieState.SCALED:
            comp = scaled
            notes.append(Finding(FindingKind.SCALED_TIED_HEAD, (head, embedding), {"family": fam.name}))
    return comp, notes


def _comparison(
    ckpt: Checkpoint,
    fam: arch.Family,
    embedding: str,
    head: str | None,
    shape: HeadShape,
    how: ValueCompare,
) -> tuple[Comparison, list[Finding]]:
    """How the head compares with the embedding, and notes: no head in the files is ``shared`` (T5's head
    is the shared table) or ``absent``; ``how`` ``none``: only a shared storage is told (``unknown``
    otherwise); else the values are read (:func:`_compare_pair`)."""
    if head is None:
        return Comparison(TieState.SHARED if fam.scales_tied_logits else TieState.ABSENT), []
    if how is ValueCompare.NONE and shape.layout is not None:
        comp = shared_storage(ckpt, embedding, head) or Comparison(TieState.UNKNOWN)
        H = ckpt.tensors[embedding].shape[1]
        return comp, [_ambiguous_layout(head, H)] if shape.layout is HeadLayout.AMBIGUOUS else []
    H = ckpt.tensors[embedding].shape[1]
    return _compare_pair(ckpt, fam, (embedding, head), shape, H, how is ValueCompare.FIRST_DIFFERENCE)


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
        size = get_dotted_int(ckpt.config, table_size_key(block_at(ckpt.config, block), block))
        if size is None:
            continue
        tables = [n for n, t in ckpt.tensors.items() if len(t.shape) == 2 and size in t.shape]
        embs = [n for n in ranked_by_suffix(ckpt, names.embedding, size) if ckpt.tensors[n].shape[0] == size]
        embs += [n for n in tables if "embed" in n and ckpt.tensors[n].shape[0] == size]
        heads = [
            n for n in ranked_by_suffix(ckpt, names.head, size, ndim=None) if size in ckpt.tensors[n].shape
        ]
        heads += [n for n in tables if "head" in n and n not in embs[:1]]
        pair = {"embedding": embs[0], "head": heads[0]} if embs and heads else {"tables": tables}
        out.append({"block": block, **pair})
    return out


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


def _missing_embedding_dims(ckpt: Checkpoint, head: str, fam: arch.Family, cf: Cfg) -> tuple[int, int]:
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
    shape: HeadShape
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
    ckpt: Checkpoint, cf: Cfg, taken: set[str], V: int, head: str | None, head_rows: int | None
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
    """The head (``head_name`` when given, else :func:`find_head`), the tensors named like a head (for
    head aliases), and the note on a head found by its shape.

    Raises:
        RefusedError: several tensors could be the head.
    """
    if head_name:
        return head_name, [head_name], []
    head_named = ranked_by_suffix(ckpt, fam.head, V, exclude=(embedding,), ndim=None)
    alias_probe = ranked_by_suffix(ckpt, fam.aliases + fam.embedding, exclude=(embedding,))
    head, by_shape = find_head(ckpt, fam, embedding, alias_probe, V, H)
    return head, head_named, [Finding(FindingKind.HEAD_BY_SHAPE, (head,))] if head and by_shape else []


def _embedding_pair(
    ckpt: Checkpoint,
    fam: arch.Family,
    cf: Cfg,
    found: tuple[str, FoundBy],
    head_name: str | None,
    layout: str | None,
    bias: tuple[str | None, list[str]],
    how: ValueCompare,
) -> _Pair:
    """The pair of a checkpoint with its input embedding ``[V, H]`` (``found``: its name and how it was
    found): the head, aliases, the comparison, extra tables and vocab-shaped tensors (none of them ``bias``
    or its aliases); a hidden size other than the config's, a head found by shape or unusable, a square
    head's layout, are findings.

    Raises:
        RefusedError: several tensors could be the head (:func:`find_head`).
    """
    embedding, found_by = found
    V, H = ckpt.tensors[embedding].shape
    findings: list[Finding] = []
    if cf.hidden is not None and H != cf.hidden:
        facts = {"shape": [V, H], "config_hidden_size": cf.hidden}
        findings.append(Finding(FindingKind.EMBEDDING_HIDDEN_MISMATCH, (embedding,), facts))
    head, head_named, head_notes = _found_head(ckpt, fam, embedding, head_name, V, H)
    emb_aliases, vocab_aliases, head_aliases = find_aliases(ckpt, fam, embedding, head, head_named)
    named = frozenset(v.size for v in cf.vocabs if v.key != cf.vocab_key and v.size != V)
    shape = head_shape(head, ckpt.tensors[head].shape, V, H, layout, named) if head else HeadShape()
    comp, cmp_notes = _comparison(ckpt, fam, embedding, head, shape, how)
    findings += head_notes + ([shape.problem] if shape.problem else []) + cmp_notes
    taken = {embedding, *emb_aliases, *vocab_aliases, *head_aliases, *([head] if head else [])}
    taken |= {*([bias[0]] if bias[0] else []), *bias[1]}
    extra = find_extra_tables(ckpt, fam, taken)
    by_shape = find_by_shape(ckpt, taken | set(extra), V, H)
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
    ckpt: Checkpoint, fam: arch.Family, cf: Cfg, head: str, layout: str | None
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
    shape = head_shape(head, ckpt.tensors[head].shape, V, H, layout)
    embedding = missing_embedding_name(ckpt, fam, head)
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
    names = ranked_by_suffix(ckpt, fam.embedding + fam.aliases, exclude=exclude, ndim=None)
    name = missing_embedding_name(ckpt, fam, head) if head else None
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


def _nothing_found(ckpt: Checkpoint, cf: Cfg, probe: arch.Family) -> CheckpointError:
    """The error for a checkpoint with neither an input embedding nor a head."""
    return CheckpointError(
        f"no input embedding found (model_type {cf.model_type!r}: no tensor named like "
        f"{', '.join(probe.embedding[:3])}, and none of shape [vocab_size, hidden_size] = "
        f"[{cf.vocab_size}, {cf.hidden}])",
        ckpt.path,
        f"pass {Opt('embedding', 'NAME')} (and {Opt('head', 'NAME')}), or check config.json "
        "vocab_size/hidden_size",
    )


def _config_findings(cf: Cfg, probe: arch.Family, found_by: FoundBy, embedding: str | None) -> list[Finding]:
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
    first_difference: bool = False,
) -> Detection:
    """Find the vocabulary surface of ``ckpt``: embedding, head, bias, aliases, extra tables, and the tie
    state.

    Args:
        layout: ``vocab-hidden`` / ``hidden-vocab`` to override the head layout decision (needed when
            vocab_size == hidden_size and a head is present).
        loader: one of ``surgery.arch.LOADERS`` to override :func:`infer_loader`.
        compare_values: read the embedding and head data to compare them (inspect and tie do).
        first_difference: with ``compare_values``, for a caller that needs only whether head and embedding
            are equal: an untied config's pair is read up to the first difference (:func:`compare`; its
            ``different`` has no magnitude). A tied config's pair is compared whole (its finding names the
            drift).
        embedding_name, head_name: the tensor names to use (``--embedding`` / ``--head``), for architectures
            the table does not know.

    Raises:
        CheckpointError: neither an input embedding nor a head can be found, or a named tensor does not
            exist.
        UsageError: a named tensor cannot be an embedding or head (not 2-D, not float, wrong hidden size).
        RefusedError: the embedding can only be guessed by shape and several tensors fit.
    """
    cf = config_facts(ckpt)
    check_overrides(ckpt, embedding_name, head_name, cf.hidden, layout)
    probe = arch.lookup(cf.model_type, "hf")
    head_named = [head_name] if head_name else ranked_by_suffix(ckpt, probe.head, ndim=None)
    embedding, found_by = (
        (embedding_name, FoundBy.NAMED) if embedding_name else find_embedding(ckpt, probe, cf, head_named)
    )
    if embedding is None and not head_named:
        _refuse_flat_embedding(ckpt, probe, None)
        raise _nothing_found(ckpt, cf, probe)
    if embedding is not None and found_by is FoundBy.NAMED:
        cf = settle_text(ckpt, cf, ckpt.tensors[embedding].shape[0])
    findings = _config_findings(cf, probe, found_by, embedding)
    if loader is None:
        loader, loader_source = infer_loader(ckpt, embedding or head_named[0])
    else:
        loader_source = f"{Opt('loader')}"
    fam = arch.lookup(cf.model_type, loader, ckpt.format)
    bias = find_bias(ckpt, fam, head_name, cf.hidden)
    flag = config_flag(ckpt, cf, fam, loader)
    if embedding is None:
        pair = _missing_embedding_pair(ckpt, fam, cf, head_named[0], layout)
    else:
        how = ValueCompare.NONE if not compare_values else ValueCompare.FULL
        if compare_values and first_difference and not flag.tied:
            how = ValueCompare.FIRST_DIFFERENCE
        pair = _embedding_pair(ckpt, fam, cf, (embedding, found_by), head_name, layout, bias, how)
    det = _detection(ckpt, cf, fam, (loader, loader_source), pair, bias, flag)
    det.findings = findings + pair.findings + flag.findings + _later_findings(det)
    return det


def names_a_pair(ckpt: Checkpoint) -> bool:
    """Whether ``ckpt`` holds a tensor named like an input embedding or an LM head (its family's names,
    their aliases, the common names of other families; any rank), from the headers: where none is, there is
    no tie for :func:`detect` to check (a checkpoint of no vocabulary, or one whose pair only a guess by
    shape could find)."""
    cf = config_facts(ckpt)
    probe = arch.lookup(cf.model_type, "hf")
    names = probe.head + probe.embedding + probe.aliases + arch.FALLBACK.embedding + arch.FALLBACK.aliases
    return bool(ranked_by_suffix(ckpt, dict.fromkeys(names), ndim=None))


def _detection(
    ckpt: Checkpoint,
    cf: Cfg,
    fam: arch.Family,
    loader: tuple[str, str],
    pair: _Pair,
    bias: tuple[str | None, list[str]],
    flag: Flag,
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
        special_ids=special_token_ids(ckpt.path, ckpt.config_dir),
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
