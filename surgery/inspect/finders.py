"""The finders of detection: the config facts detection needs, the embedding, head, aliases, extra tables and
biases by name (the architecture table's order of preference, then module depth) or by shape, the head's
layout from its shape, and the tie flag the config sets. Headers only, except :func:`find_aliases`, which
compares values. Architecture knowledge comes from :mod:`surgery.arch`; nothing here names a model."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from .. import arch
from ..io.checkpoint import Checkpoint
from ..io.tokenizer import tokenizer_info
from ..model.enums import LAYOUTS, Container, FoundBy, HeadLayout, TieState
from ..model.errors import CheckpointError, Opt, RefusedError, UsageError
from ..model.tensor import FLOAT_DTYPES
from .compare import compare
from .detection import LayoutConflict
from .findings import Finding, FindingKind
from .vocabularies import (
    Vocabulary,
    ambiguous_sizes,
    derived_sizes,
    dtype_kind,
    table_size_key,
    text_block,
    vocabularies,
)

if TYPE_CHECKING:
    import numpy as np
else:
    from ..model.lazy import numpy as np


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
class Cfg:
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


def config_facts(ckpt: Checkpoint) -> Cfg:
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
    return Cfg(
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


def settle_text(ckpt: Checkpoint, cf: Cfg, rows: int) -> Cfg:
    """An unclear text block settled by a named embedding: the one candidate block whose vocabulary has the
    embedding's ``rows`` becomes the language model's (unchanged otherwise)."""
    fits = [
        b
        for b in cf.unclear
        if get_dotted_int(ckpt.config, table_size_key(block_at(ckpt.config, b), b)) == rows
    ]
    if len(fits) != 1:
        return cf
    block = block_at(ckpt.config, fits[0])
    key = table_size_key(block, fits[0])
    return replace(cf, tcfg=block, tkey=fits[0], vocab_key=key, vocab_size=rows, unclear=())


def get_dotted_int(cfg: dict, key: str | None) -> int | None:
    """The integer at dotted ``key`` of ``cfg`` (None when absent, not an integer, or ``key`` is None)."""
    v: object = cfg
    for part in (key or "").split(".") if key else []:
        v = v.get(part) if isinstance(v, dict) else None
    return v if key and isinstance(v, int) and not isinstance(v, bool) else None


def ranked_by_suffix(
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


def check_overrides(
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


def _embedding_by_shape(ckpt: Checkpoint, cf: Cfg, exclude) -> str | None:
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


def find_embedding(
    ckpt: Checkpoint, probe: arch.Family, cf: Cfg, head_named: list[str]
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
        ranked = ranked_by_suffix(ckpt, names, cf.vocab_size, exclude=head_named)
        if ranked:
            return ranked[0], how
    found = _embedding_by_shape(ckpt, cf, head_named)
    return found, (FoundBy.SHAPE if found else FoundBy.MISSING)


def missing_embedding_name(ckpt: Checkpoint, fam: arch.Family, head: str) -> str:
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


def find_head(
    ckpt: Checkpoint, fam: arch.Family, embedding: str, taken: list[str], V: int, H: int
) -> tuple[str | None, bool]:
    """The LM head by the family's names in order of preference; for a family the table does not know,
    the one other 2-D tensor of shape ``{V, H}``. Returns (name or None, whether it was found by shape).

    Raises:
        RefusedError: several tensors could be the head.
    """
    named = ranked_by_suffix(ckpt, fam.head, V, exclude=(embedding,), ndim=None)
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


def find_aliases(
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
        for n in ranked_by_suffix(ckpt, fam.aliases + fam.embedding, exclude=(embedding,))
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


def find_extra_tables(ckpt: Checkpoint, fam: arch.Family, taken: set[str]) -> list[str]:
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


def find_by_shape(ckpt: Checkpoint, taken: set[str], V: int, H: int) -> list[str]:
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


def find_bias(
    ckpt: Checkpoint, fam: arch.Family, head_name: str | None, hidden: int | None
) -> tuple[str | None, list[str]]:
    """The head bias (the first present in the table's order; before them, the bias of the module of a head
    named by ``--head``, :func:`_named_head_bias`) and its aliases (same storage or bytes)."""
    own = _named_head_bias(ckpt, head_name, hidden)
    names = [*own, *(n for n in ranked_by_suffix(ckpt, fam.bias, ndim=None) if n not in own)]
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
class HeadShape:
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


def head_shape(
    head: str, hs: tuple[int, ...], V: int, H: int, layout: str | None, named: frozenset[int] = frozenset()
) -> HeadShape:
    """Read the head's layout from its shape against the embedding's ``[V, H]``: ``vocab-hidden`` or
    ``hidden-vocab`` (``layout`` when the square shape cannot say, else ``ambiguous``); a head with fewer
    rows keeps them (reserved rows) unless it is an exact fraction 1/k of ``V`` (a tensor-parallel slice:
    unusable, a problem) whose rows no other vocabulary of the config (``named``: ``draft_vocab_size``)
    counts; any other shape is unusable (a problem). A ``layout`` the shape contradicts is a conflict."""
    hs = tuple(hs)
    if len(hs) != 2:
        return HeadShape(problem=Finding(FindingKind.HEAD_NOT_2D, (head,), {"shape": list(hs)}))
    if V == H and hs == (V, H):
        return HeadShape(HeadLayout(layout) if layout in LAYOUTS else HeadLayout.AMBIGUOUS, V)
    if hs in ((V, H), (H, V)):
        fits = HeadLayout.VOCAB_HIDDEN if hs == (V, H) else HeadLayout.HIDDEN_VOCAB
        conflict = _conflict(head, hs, layout, fits)
        return HeadShape(fits, V, conflict=conflict)
    a, b = hs
    for rows, other, fits in ((a, b, HeadLayout.VOCAB_HIDDEN), (b, a, HeadLayout.HIDDEN_VOCAB)):
        if other != H or not rows or rows > V:  # a head with more rows than the embedding fits neither
            continue
        if rows < V and V % rows == 0 and rows not in named:
            facts = {"shape": list(hs), "head_rows": rows, "fraction": V // rows, "embedding_rows": V}
            return HeadShape(tp=V // rows, problem=Finding(FindingKind.HEAD_TP_SLICE, (head,), facts))
        conflict = _conflict(head, hs, layout, fits)
        return HeadShape(fits, rows, conflict=conflict)
    facts = {"shape": list(hs), "embedding_rows": V, "hidden_size": H}
    return HeadShape(problem=Finding(FindingKind.HEAD_SHAPE_MISFIT, (head,), facts))


class Flag(NamedTuple):
    """The effective ``tie_word_embeddings``: its value, where it came from, every flag found, problems."""

    tied: bool
    source: str
    flags: dict[str, bool]
    findings: list[Finding]


def config_flag(ckpt: Checkpoint, cf: Cfg, fam: arch.Family, loader: str) -> Flag:
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
    return Flag(tied, source, flags, findings)


def block_at(cfg: dict, dotted: str) -> dict:
    v: object = cfg
    for part in dotted.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v if isinstance(v, dict) else {}
