"""Plans: what ``tie``, ``untie`` and ``resize`` will change, computed from headers and detection only.

A :class:`Plan` lists tensors dropped, replaced and added, config keys set, and notes. Executing it
(:func:`surgery.write.execute`) is the only step that writes; ``--dry-run`` prints the plan and stops.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field, replace

import numpy as np

from . import architectures as arch
from .checkpoint import Checkpoint
from .configfile import get_dotted, read_config_file
from .detect import (
    HIDDEN_VOCAB,
    LAYOUTS,
    VOCAB_HIDDEN,
    Detection,
    FoundBy,
    loader_facts_unproven,
    tied_scale,
    unnamed_heads,
)
from .errors import AmbiguousLayoutError, Opt, RefusedError, UsageError, ValuesDifferError
from .findings import FindingKind, Fix, describe
from .formats.tensor import DTYPES, NP_TO_ST, TensorInfo, dtype_refusal
from .options import Init, Keep
from .recipes import CopyIfEqual, CopyOf, NewRows, Recipe, ResizedBias, ResizedTable, TokenRows, uses
from .vocabkeys import vocab_keys

NEW_SHARD = "<new shard>"  # NewTensor.file of a tensor that gets a shard file of its own


@dataclass
class NewTensor:
    """A tensor the output gets new data for.

    Attributes:
        name: state-dict key.
        dtype: label in the checkpoint's format (safetensors ``BF16``...; pdparams numpy name).
        shape: output shape.
        recipe: what its data is (:mod:`surgery.recipes`); the writer makes it once per execution, shared
            by every tensor with an equal recipe.
        file: the weight file it goes into (input file name), or ``NEW_SHARD``.
        after: for an added tensor, the name it follows in that file (None: at the end).
        storage: tensors with the same storage key are one array (pdparams aliases).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    recipe: Recipe
    file: str
    after: str | None = None
    storage: object = None

    @property
    def nbytes(self) -> int:
        return _dtype(self.dtype).nbytes(self.numel)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def _dtype(label: str):
    """The :class:`~surgery.formats.tensor.DType` of a safetensors label or a pdparams numpy name."""
    return DTYPES[label] if label in DTYPES else DTYPES[NP_TO_ST[label]]


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
        metadata_drop: ``__metadata__`` keys to remove (a ``{dropped: kept}`` entry for a tensor the output
            holds again).
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
    metadata_drop: list[str] = field(default_factory=list)
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
    """Refuse a head that cannot be used (wrong shape, a tensor-parallel slice) or a requested layout that
    contradicts its shape."""
    c = det.layout_conflict
    if c is not None:
        raise UsageError(
            f"{op} refused: the layout {c.requested} contradicts the head {c.head} {list(c.shape)} "
            f"(vocab_size {det.vocab_rows} != hidden_size {det.hidden}, so its shape says {c.fits})",
            det.ckpt.path,
            fix=f"pass {Opt('layout', c.fits)}, or leave {Opt('layout')} out",
        )
    if det.head_present and det.head_layout is None:
        raise RefusedError(
            f"{op} refused: " + "; ".join(map(str, det.problems_about(det.head))),
            det.ckpt.path,
            "fix the head first (merge tensor-parallel slices / re-export)",
        )


def refuse_unsettled_pair(det: Detection, op: str) -> None:
    """Refuse a write whose pair or vocabulary is not settled: the text vocabulary is not clear among
    several (unless ``--embedding`` named the table), or no head is named while a tensor of no known name
    has the head's shape (it may be a trained head: tie would set the flag beside it, untie add a second
    head).

    Raises:
        RefusedError: naming the candidates and the ``--embedding`` / ``--head`` to pass.
    """
    if det.unclear_text and det.embedding_found_by is not FoundBy.NAMED:
        found = next(f for f in det.problems if f.kind is FindingKind.TEXT_VOCABULARY_UNCLEAR)
        raise RefusedError(
            f"{op} refused: {describe(found)}", det.ckpt.path, "name the pair of the text model"
        )
    shaped = unnamed_heads(det)
    if shaped:
        raise RefusedError(
            f"{op} refused: no tensor is named like the head ({det.head}), but {', '.join(shaped)} has the "
            f"vocabulary's shape {list(det.ckpt.tensors[shaped[0]].shape)}: it may be a trained head under "
            "another name",
            det.ckpt.path,
            f"if it is the LM head, pass {Opt('head', shaped[0])}; otherwise remove or rename it first",
        )


def refuse_stale_vocab_size(det: Detection, op: str) -> None:
    """Refuse tie/untie while the config's vocabulary size disagrees with the embedding's rows: the loader
    builds a table of the config's size, so the output would load only by luck, and its head would be
    tied or untied against the wrong number of rows. ``resize`` to the rows sets the key (a config that
    counts the head's rows of an embedding with reserved rows agrees).

    Raises:
        RefusedError: one line naming the config file, the key, both numbers and the resize that fixes it.
    """
    cvs, V = det.config_vocab_size, det.vocab_rows
    if cvs is None or cvs == V or (cvs == det.head_rows and det.head_vocab is None):
        return
    key, ckpt = det.vocab_key or "vocab_size", det.ckpt
    if ckpt.config_file != "config.json":
        key = f"{ckpt.config_prefix}.{key}".lstrip(".")
    raise RefusedError(
        f"{op} refused: {ckpt.config_file} {key} is {cvs} but the embedding {det.embedding} has {V} rows "
        f"(the loader would build a {cvs}-row table)",
        ckpt.path / ckpt.config_file,
        f"tietool {Fix(Opt('vocab_size', V), 'resize')} sets {key} to the rows, then {op}",
    )


def _out_dtype(ckpt: Checkpoint, t: TensorInfo, relabel: bool) -> str:
    return "BF16" if relabel and t.dtype == "U16" else t.dtype


def _wants_relabel(ckpt: Checkpoint, loader: str) -> bool:
    """Rewritten U16 tensors holding bfloat16 bits are labelled BF16, except for a loader that reads
    bfloat16 only as U16 (:data:`architectures.U16_BFLOAT16_ONLY`: PaddleNLP 2.8.1)."""
    return (
        ckpt.format == "safetensors"
        and ckpt.bf16_as_u16
        and loader not in arch.U16_BFLOAT16_ONLY
        and any(t.dtype == "U16" for t in ckpt.tensors.values())
    )


def _base_plan(op: str, det: Detection) -> Plan:
    ckpt = det.ckpt
    plan = Plan(op, ckpt, det, relabel_u16=_wants_relabel(ckpt, det.loader))
    if ckpt.index is not None:
        plan.stale_index = [n for n in ckpt.index["weight_map"] if n not in ckpt.tensors]
    if plan.relabel_u16:
        plan.notes.append(
            "U16 tensors hold bfloat16 bits (config dtype bfloat16): rewritten shards label them BF16; "
            "the bytes are unchanged"
        )
    return plan


def _restore_embedding(det: Detection, plan: Plan) -> None:
    """Add the missing input embedding, written from the head's bytes (``[vocab, hidden]``), in the head's
    file right before the head; a ``{embedding: head}`` metadata entry is removed (the name is real again)."""
    ckpt, h = det.ckpt, det.emb_info  # the head's header (the embedding is stored as the head)
    recipe = CopyOf(det.head, transpose=det.head_layout == HIDDEN_VOCAB)
    names = list(ckpt.tensors)
    i = names.index(det.head)
    before = next((n for n in reversed(names[:i]) if ckpt.tensors[n].file == h.file), None)
    plan.add.append(
        NewTensor(
            det.embedding,
            _out_dtype(ckpt, h, plan.relabel_u16),
            (det.vocab_rows, det.hidden),
            recipe,
            h.file,
            after=before,
        )
    )
    plan.metadata_drop.append(det.embedding)
    plan.notes.append(
        f"{det.embedding} restored from the bytes of {det.head} (the table was stored only there)"
    )


def _missing_embedding_refusal(det: Detection, op: str, fix: str) -> RefusedError:
    return RefusedError(
        f"{op} refused: the input embedding {det.embedding} is missing (the table is stored only as the head "
        f"{det.head})",
        det.ckpt.path,
        fix,
    )


def check_new_names(plan: Plan) -> None:
    """Never two tensors under one name: an added tensor's name is new (or dropped) and added once.

    Raises:
        AssertionError: a plan that would write a name twice (a bug in the planner).
    """
    kept = set(plan.ckpt.tensors) - set(plan.drop)
    added = [a.name for a in plan.add]
    twice = sorted({n for n in added if n in kept or added.count(n) > 1})
    assert not twice, f"plan {plan.op} would write {', '.join(twice)} twice"


# ------------------------------------------------------------------ tie


def plan_tie(det: Detection, keep: Keep | str | None = None, drop_aliases: bool = False) -> Plan:
    """Plan ``tie``: drop the head (and its aliases) where the loader re-ties; set the flag true.

    Args:
        det: detection (with ``--layout``/``--loader`` applied).
        keep: when head and embedding differ, ``"embedding"`` keeps the embedding's values, ``"head"``
            writes the head's values (in ``[vocab, hidden]``) as the embedding. None refuses.
        drop_aliases: also drop copies of the embedding under alias names (T5/BART
            ``encoder.embed_tokens``/``decoder.embed_tokens``). Off by default: the loaders build those
            as one shared layer, but the fixtures hold no evidence of a load without them.

    Returns:
        the plan: the head dropped (or, where the loader does not re-tie, kept equal to the embedding), the
        ``tie_word_embeddings`` flags true, ``{dropped: embedding}`` safetensors metadata, as safetensors'
        ``save_model`` records shared tensors.

    Raises:
        ValuesDifferError: values differ and ``keep`` is None (message names both tensors, max |diff|, rows).
        AmbiguousLayoutError: vocab_size == hidden_size and no ``--layout``.
        RefusedError: the head is unusable (a tensor-parallel slice, a wrong shape), has other rows than the
            embedding, or ``keep="head"`` cannot be honoured (:func:`_keep_head_values`).
    """
    plan = _base_plan("tie", det)
    refuse_unsettled_pair(det, "tie")
    _refuse_unusable_head(det, "tie")
    refuse_stale_vocab_size(det, "tie")
    plan.config_set = _tie_flags(det, True)
    if not det.embedding_present:
        return _tie_missing_embedding(det, plan, keep)
    _refuse_unequal_rows(det, "tie")
    _tie_embedding_copies(det, plan, drop_aliases)
    if det.head_info is None:  # the files hold no head
        return _tie_without_head(det, plan)
    _refuse_ambiguous_tie(det)
    _settle_values(det, plan, keep)
    _drop_or_keep_head(det, plan, keep)
    return plan


def _tie_embedding_copies(det: Detection, plan: Plan, drop_aliases: bool) -> None:
    """Drop the embedding's copies under alias names (``--drop-aliases``, where the loader re-ties), or
    note that they are kept."""
    copies = [a for a in det.embedding_aliases if det.family.may_drop_head]
    if drop_aliases:
        for a in copies:
            plan.drop[a] = f"copy of {det.embedding} ({Opt('drop_aliases', True)})"
    elif copies:
        plan.notes.append(
            f"{', '.join(copies)} duplicate {det.embedding} and are kept "
            f"({Opt('drop_aliases', True)} drops them)"
        )


def _tie_without_head(det: Detection, plan: Plan) -> Plan:
    """tie when the files hold no head: only the flag changes (and dropped aliases, if any)."""
    plan.metadata = {n: det.embedding for n in plan.drop}
    if det.config_tied:
        plan.notes.append(f"already tied: no head in the files and {det.config_source} = true")
    else:
        plan.notes.append(f"no head in the files: only {det.config_source} changes to true (0 bytes saved)")
    return plan


def _refuse_ambiguous_tie(det: Detection) -> None:
    """Refuse a square head (vocab_size == hidden_size) with no ``--layout`` (AmbiguousLayoutError)."""
    if det.head_layout == "ambiguous":
        raise AmbiguousLayoutError(
            f"vocab_size == hidden_size == {det.vocab_rows}: the layout of {det.head} cannot be told from "
            f"its square shape; as stored it is {det.comparison.values} vs {det.embedding}",
            det.ckpt.path,
            f"pass {Opt('layout', 'vocab-hidden')} or {Opt('layout', 'hidden-vocab')} (PaddleNLP Llama/Qwen "
            "heads are hidden-vocab)",
        )


def _settle_values(det: Detection, plan: Plan, keep: Keep | str | None) -> None:
    """Which values the tied table gets when head and embedding differ (``--keep``); a T5 head equal to the
    embedding × ``d_model ** -0.5`` is the tied head and is noted as such.

    Raises:
        ValuesDifferError: the values differ and ``keep`` is None.
        RefusedError: from :func:`_keep_head_values`.
    """
    comp = det.comparison
    if comp.values in ("exact", "transposed") and det.family.tied_logit_scale:
        _unscaled_head(det, plan, keep)
    if comp.values == "different":
        _refuse_own_biased_head(det, keep)
        if keep is None:
            raise ValuesDifferError(
                f"tie refused: {det.head} differs from {det.embedding} (max |difference| "
                f"{comp.max_abs_diff:.3g}, {comp.differing_rows} of {det.vocab_rows} rows differ)",
                det.ckpt.path,
                f"pass {Opt('keep', 'embedding')} or {Opt('keep', 'head')} to choose the values to keep, or "
                "use untie",
            )
        if keep == Keep.HEAD:
            _keep_head_values(det, plan)
        else:
            plan.notes.append(f"{Opt('keep', 'embedding')}: the values of {det.head} are discarded")
    if comp.values == "scaled":
        plan.notes.append(
            f"{det.head} is {det.embedding} × d_model ** -0.5: exactly the tied head, so it is dropped"
        )


def _refuse_own_biased_head(det: Detection, keep: Keep | str | None) -> None:
    """``--keep`` on a biased Linear head that the loader never builds from the embedding (PaddleNLP 2.8.1
    CodeGen / GPT-J: ``lm_head.weight`` + ``lm_head.bias``, ``tests/test_pnlp_loaders.py``): the head
    stays (0 bytes saved) and ``--keep`` would only overwrite one side's trained values.

    Raises:
        RefusedError: ``keep`` is set, the head has a bias and the loader neither re-ties nor always ties.
    """
    fam = det.family
    if keep is None or not det.bias or fam.reties or fam.always_tied:
        return
    other = det.embedding if keep == Keep.HEAD else det.head
    raise RefusedError(
        f"tie {Opt('keep', Keep(keep).value)} on {fam.model_type or fam.name}: {det.head} is a Linear head "
        f"of its own with a bias ({det.bias}) that the {det.loader} loader never builds from "
        f"{det.embedding}, so tie cannot drop it (0 bytes saved) and would only overwrite the trained values "
        f"of {other}",
        det.ckpt.path,
        f"keep the checkpoint untied: the loader uses {det.head} and {det.bias} whatever "
        "tie_word_embeddings says",
    )


def _unscaled_head(det: Detection, plan: Plan, keep: Keep | str | None) -> None:
    """A head equal to the embedding itself in a family whose tied logits scale the embedding (T5:
    ``d_model ** -0.5``) is not the tied head: dropping it scales every logit (checked with PaddleNLP
    2.8.1's T5, ``tests/test_pnlp_loaders.py``). Only ``--keep embedding`` accepts that.

    Raises:
        ValuesDifferError: ``keep`` is None. RefusedError: ``keep`` is ``head`` (:func:`_keep_head_values`).
    """
    scale = det.family.tied_logit_scale
    if keep is None:
        raise ValuesDifferError(
            f"tie refused: {det.head} equals {det.embedding}, but the tied {det.family.name} model scales "
            f"the embedding by {scale} for the logits, so without the head every logit would be scaled",
            det.ckpt.path,
            f"keep the checkpoint untied, or pass {Opt('keep', 'embedding')} to accept the scaled logits",
        )
    if keep == Keep.HEAD:
        _keep_head_values(det, plan)
    plan.notes.append(f"{Opt('keep', 'embedding')}: the tied logits are the untied ones × {scale}")


def _keep_head_values(det: Detection, plan: Plan) -> None:
    """``--keep head``: the embedding and its aliases become the head's values ``[vocab, hidden]`` (a
    ``[hidden, vocab]`` head transposed), one shared array in a ``.pdparams``.

    Raises:
        RefusedError: a family whose tied logits scale the embedding (T5), or head and embedding of
            different logical dtypes.
    """
    ckpt, h = det.ckpt, det.head_info
    assert h is not None
    if det.family.tied_logit_scale:
        raise RefusedError(
            f"{Opt('keep', 'head')} on {det.family.name}: the tied model multiplies the embedding by "
            "d_model ** -0.5 for the logits, so the head's values cannot become the embedding",
            ckpt.path,
            f"use {Opt('keep', 'embedding')}, or keep the checkpoint untied",
        )
    _refuse_other_dtypes(det, Keep.HEAD)
    recipe = CopyOf(det.head, transpose=det.head_layout == HIDDEN_VOCAB)
    for n in [det.embedding] + det.embedding_aliases:
        t = ckpt.tensors[n]
        out = _out_dtype(ckpt, t, plan.relabel_u16)
        plan.replace[n] = NewTensor(n, out, t.shape, recipe, t.file, storage=("embedding",))
    plan.notes.append(f"{Opt('keep', 'head')}: {det.embedding} takes the values of {det.head}")


def _refuse_other_dtypes(det: Detection, keep: Keep) -> None:
    """``--keep``: one side's values are written into the other's tensor, which keeps its dtype, so both
    must hold the same logical dtype (a byte copy of float32 values into a float64 head would be another
    size and other numbers).

    Raises:
        RefusedError: naming both tensors and their dtypes.
    """
    ckpt, h, e = det.ckpt, det.head_info, det.emb_info
    assert h is not None
    if ckpt.logical_dtype(h) != ckpt.logical_dtype(e):
        raise RefusedError(
            f"{Opt('keep', keep.value)}: {det.head} is {ckpt.logical_dtype(h)} but {det.embedding} is "
            f"{ckpt.logical_dtype(e)}",
            ckpt.path,
            "convert the dtypes first",
        )


def _drop_or_keep_head(det: Detection, plan: Plan, keep: Keep | str | None) -> None:
    """Drop the head and its aliases where the loader re-ties a missing head (architecture table:
    ``Family.reties``); elsewhere keep it, rewritten as the embedding in the head's layout when
    ``--keep embedding`` chose the embedding's differing values."""
    h = det.head_info
    assert h is not None
    if _drop_head(det, plan, f"duplicate of {det.embedding} (the {det.loader} loader re-ties it)"):
        return
    if not det.family.trusted:
        kept = f"{det.head} is kept, equal to the embedding, and the flag set; 0 bytes saved"
        _unproven_note(det, plan, kept)
    else:
        plan.notes.append(
            f"the {det.loader} loader ({det.family.name}) does not re-tie a missing head: it would load a "
            f"random one, so {det.head} is kept, equal to the embedding in the loader's {det.head_layout} "
            "layout; 0 bytes saved"
        )
    if keep == Keep.EMBEDDING and det.comparison.values == "different":
        _refuse_other_dtypes(det, Keep.EMBEDDING)
        recipe = CopyOf(det.embedding, transpose=det.head_layout == HIDDEN_VOCAB)
        out = _out_dtype(det.ckpt, h, plan.relabel_u16)
        plan.replace[det.head] = NewTensor(det.head, out, h.shape, recipe, h.file)


def _drop_head(det: Detection, plan: Plan, reason: str) -> bool:
    """Drop the head (for ``reason``) and its aliases, with ``{dropped: embedding}`` safetensors metadata,
    where the loader re-ties a missing head and that is proven (architecture table: ``Family.may_drop_head``;
    a loader that would load a random head, or one whose behaviour is unproven, needs it kept). Shared by
    ``tie`` and ``resize``.

    Returns:
        whether the head was dropped (False: the loader needs it, nothing was planned).
    """
    if not det.family.may_drop_head:
        return False
    plan.drop[det.head] = reason
    for a in det.head_aliases:
        plan.drop[a] = f"alias of {det.head}"
    plan.metadata = {n: det.embedding for n in plan.drop}
    if det.family.warns_missing_head:
        source = f"checked by loading: {det.family.proof}" if det.family.proof else "architecture table"
        plan.notes.append(
            f"the {det.loader} loader will log {det.head} as 'newly initialized': that warning is "
            f"harmless, it ties {det.head} to {det.embedding} on load and the logits are identical "
            f"({source})"
        )
    return True


def _tie_missing_embedding(det: Detection, plan: Plan, keep: Keep | str | None) -> Plan:
    """tie of a checkpoint whose embedding is stored only as the head: with ``keep="head"`` the embedding
    is restored from the head's bytes and the head dropped (kept where the loader does not re-tie)."""
    if keep != Keep.HEAD:
        raise _missing_embedding_refusal(
            det,
            "tie",
            f"pass {Opt('keep', 'head')} to restore {det.embedding} from {det.head} (and drop the head), or "
            "use untie to restore it beside the head",
        )
    _restore_embedding(det, plan)
    if det.family.may_drop_head:
        plan.drop[det.head] = f"its table is {det.embedding} now (the {det.loader} loader re-ties it)"
        plan.metadata = {det.head: det.embedding}
    elif not det.family.trusted:
        _unproven_note(det, plan, f"{det.head} is kept")
    else:
        plan.notes.append(
            f"the {det.loader} loader ({det.family.name}) does not re-tie a missing head, so {det.head} "
            "is kept"
        )
    check_new_names(plan)
    return plan


def _unproven_note(det: Detection, plan: Plan, done: str) -> None:
    """Note what a write did instead of relying on an unproven loader fact (``done``), with the finding
    that words the missing proof and the ``loader`` option that names a proven loader."""
    finding = loader_facts_unproven(det)
    plan.notes.append(f"{done}: " + (describe(finding) if finding else "the loader facts are unproven"))


def _refuse_unequal_rows(det: Detection, op: str) -> None:
    """tie needs a head with the embedding's vocabulary rows."""
    if det.head_rows is not None and det.head_rows != det.vocab_rows:
        other = (
            f" (the head is over another vocabulary, config.json {det.head_vocab} = {det.head_rows})"
            if det.head_vocab
            else ""
        )
        raise RefusedError(
            f"{op} refused: the head {det.head} {list(det.ckpt.tensors[det.head].shape)} has {det.head_rows} "
            f"vocabulary rows and the embedding {det.embedding} {list(det.emb_info.shape)} has "
            f"{det.vocab_rows}{other}: one table cannot serve both shapes",
            det.ckpt.path,
            "keep the checkpoint untied, or resize/trim the tables to the same rows first",
        )


# ------------------------------------------------------------------ untie


def _embedding_as_head(det: Detection, lay: str, scale: float | None) -> CopyOf:
    """The recipe of an untied head: the embedding ``[vocab, hidden]`` in layout ``lay`` (a byte-range copy
    when the layout is the stored one), times ``scale`` (T5) when given, rounded back to the stored dtype."""
    return CopyOf(det.embedding, transpose=lay == HIDDEN_VOCAB, scale=scale)


def _place_new_head(det: Detection, plan: Plan, head: NewTensor) -> None:
    """Put the untied head into the plan: in place of a head that aliased the embedding's storage, in a
    shard of its own for a sharded checkpoint (as PaddleFormers lays the head out; every existing shard is
    then copied unchanged), or after the last tensor of the embedding's file."""
    ckpt = det.ckpt
    if det.head_info is not None:
        plan.replace[head.name] = replace(head, file=det.head_info.file)
    elif ckpt.sharded:
        plan.add.append(replace(head, file=NEW_SHARD))
    else:
        plan.add.append(replace(head, after=_last_in_file(ckpt, head.file)))


def plan_untie(det: Detection, layout: str = "auto") -> Plan:
    """Plan ``untie``: the head as its own tensor, equal to the embedding, flag set false.

    Args:
        layout: ``auto`` (the layout the detected loader expects for this family: PaddleNLP Llama/Qwen/
            ChatGLM ``hidden-vocab``, everything else ``vocab-hidden``), or an explicit layout. Only used
            when a new head is written: an existing head keeps its stored bytes.

    The new head is ``[vocab, hidden]`` or ``[hidden, vocab]`` in the embedding's dtype. A missing
    embedding (stored only as the head) is restored from the head's bytes instead. For T5, whose tied
    logits are scaled by ``d_model ** -0.5``, the new head is the embedding times that factor (computed in
    float32, rounded back), so logits do not change.

    Raises:
        RefusedError: the loader always ties the head to the embedding (PaddleFormers Gemma3, PaddleNLP 2.8
            GPT/Bloom: architecture table ``Family.always_tied``), or the head is unusable.
        UsageError: an unknown ``layout``, or one that contradicts the head's shape.
    """
    ckpt, plan = det.ckpt, _base_plan("untie", det)
    refuse_unsettled_pair(det, "untie")
    _refuse_unusable_head(det, "untie")
    refuse_stale_vocab_size(det, "untie")
    if det.family.refuses_untie:
        raise RefusedError(
            f"untie refused: the {det.loader} loader of {det.model_type} always takes {det.head} from "
            f"{det.embedding} on load, whatever tie_word_embeddings says, so an untied head would be ignored",
            ckpt.path,
            f"pass {Opt('loader', 'hf')} if another library will load the output",
        )
    if det.family.always_tied:
        _unproven_note(det, plan, "the head is written although the table says the loader always ties it")
    plan.config_set = _tie_flags(det, False)
    if not det.embedding_present:
        _restore_embedding(det, plan)
        check_new_names(plan)
        return plan
    if det.head_present and not det.comparison.storage_shared:
        plan.notes.append(
            f"{det.head} already exists as its own tensor: its bytes are kept (untie only sets the flag)"
        )
        return plan
    _add_untied_head(det, plan, layout)
    check_new_names(plan)
    return plan


def _add_untied_head(det: Detection, plan: Plan, layout: str) -> None:
    """The new head (:func:`_embedding_as_head`) in ``layout`` (``auto``: the family's, for the loader),
    placed by :func:`_place_new_head`, with a note of its shape and why that layout.

    Raises:
        UsageError: an unknown ``layout``.
    """
    lay = _auto_layout(det) if layout in (None, "auto") else layout
    if lay not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}", fix="use auto, vocab-hidden or hidden-vocab")
    e = det.emb_info
    shape = (det.vocab_rows, det.hidden) if lay == VOCAB_HIDDEN else (det.hidden, det.vocab_rows)
    scale = None
    if det.family.tied_logit_scale and not det.head_present:
        scale = tied_scale(det.ckpt.config, det.hidden, det.ckpt.path)
        plan.notes.append(
            f"{det.family.name}: tied logits are scaled by d_model ** -0.5 = {scale:.6g}; the new head "
            "is the embedding times that factor, so logits do not change"
        )
    recipe = _embedding_as_head(det, lay, scale)
    dtype = _out_dtype(det.ckpt, e, plan.relabel_u16)
    _place_new_head(det, plan, NewTensor(det.head, dtype, shape, recipe, e.file))
    plan.notes.append(
        f"{det.head} written as {list(shape)} ({lay}), for the {det.loader} loader"
        + ("" if layout not in (None, "auto") else f" (auto: {det.loader_source})")
    )


def _auto_layout(det: Detection) -> str:
    """The layout of an untied head under ``layout="auto"``: the stored head's (a head sharing the
    embedding's storage), else the layout the loader expects for the family, where that is proven.

    Raises:
        RefusedError: no stored head and the loader's head layout is unproven for the model type and
            container (``Family.head_layout_proven``): a wrong layout would not load.
    """
    if det.head_present and det.head_layout in LAYOUTS:
        return det.head_layout
    fam = det.family
    if fam.head_layout_proven:
        return fam.head_layout
    proven = fam.proven_loaders()
    raise RefusedError(
        f"untie refused: the head layout the {det.loader} loader expects for {det.model_type} from "
        f"{det.ckpt.format} is unproven (the table says {fam.head_layout}; a head in the wrong layout does "
        "not load)",
        det.ckpt.path,
        f"pass {Opt('layout', 'vocab-hidden')} or {Opt('layout', 'hidden-vocab')} for the library that "
        f"loads it, or {Opt('loader')} naming a proven loader"
        + (f" ({', '.join(proven)})" if proven else ""),
    )


def _last_in_file(ckpt: Checkpoint, file: str) -> str | None:
    names = [n for n, t in ckpt.tensors.items() if t.file == file]
    return names[-1] if names else None


# ------------------------------------------------------------------ resize


INITS = tuple(i.value for i in Init)  # --init choices
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


def plan_resize(
    det: Detection,
    vocab: int,
    pad_to_multiple_of: int | None = None,
    init: Init | str = Init.MEAN,
    seed: int | None = None,
    force: bool = False,
) -> Plan:
    """Plan ``resize``: every tensor that carries the vocabulary gets ``target_rows(vocab, M)`` rows.

    Resized together, old rows kept bit-exact, trimming from the end: the input embedding and its aliases,
    the head (rows for ``[vocab, hidden]``, columns for ``[hidden, vocab]``), the head bias (``[V]`` or
    ``[1, V]``, new entries zero) and its aliases. A tied checkpoint stays tied: a head present and equal to
    the embedding is dropped where the config says tied and the loader re-ties a missing head (as ``tie``
    drops it: :func:`_drop_redundant_head`), else written equal to the new embedding; an untied head gets
    rows of its own by the same ``init``. Every vocabulary-size config key that counted the rows
    (:func:`_resize_config`: ``vocab_size`` at any nesting, ``padded_vocab_size``, ``decoder_vocab_size``,
    ``model_config.json``) becomes the new row count. Unlike PaddleFormers' ``resize_token_embeddings``
    (which builds new rows by a Xavier-uniform draw and never resizes an untied head), an untied head is
    always resized; ``init="mean"`` is HF transformers' ``resize_token_embeddings(mean_resizing=True)``
    (:func:`surgery.recipes.new_rows`).

    Raises:
        UsageError: vocab < 1 or beyond int32, pad_to_multiple_of < 1, unknown init, a negative seed, new
            rows that would not fit in the memory available.
        AmbiguousLayoutError: a square head and no ``--layout``.
        RefusedError: the result has fewer rows than the checkpoint and ``force`` is False (message says how
            many rows would go and whether they are padding rows or real tokens), the head is unusable, or
            part of the vocabulary surface cannot follow (:func:`_refuse_resize_surface`).
    """
    how = _resize_init(vocab, pad_to_multiple_of, init)
    refuse_unsettled_pair(det, "resize")
    _refuse_unusable_head(det, "resize")
    _refuse_ambiguous_resize(det)
    V, N = det.vocab_rows, target_rows(vocab, pad_to_multiple_of)
    _refuse_target(det, N, how)
    _refuse_resize_surface(det, N)
    _refuse_token_values(det, N)
    plan = _base_plan("resize", det)
    past = [str(i) for i in det.special_ids if i.id >= N]
    if N < V and not force:
        raise _trim_refusal(det, N, past)
    seed = _resolve_seed(seed)
    plan.extra_report = _resize_report(det, vocab, N, how, seed, pad_to_multiple_of)
    _resize_notes(det, plan, N, past)
    if N != V:
        std = float(det.ckpt.config.get("initializer_range") or 0.02)
        _resize_tensors(det, plan, N, _Draws(how, seed, std))
    _resize_config(det, plan, N)
    if N == V:
        plan.notes.append(f"the embedding already has {N} rows: no tensor changes")
    return plan


def _resize_init(vocab: int, pad_to_multiple_of: int | None, init: Init | str) -> Init:
    """Check the resize options that need no checkpoint; returns ``init`` as an :class:`Init`.

    Raises:
        UsageError: vocab < 1, pad_to_multiple_of < 1, unknown init.
    """
    if not isinstance(vocab, int) or vocab < 1:
        raise UsageError(
            f"{Opt('vocab_size')} must be a positive integer, got {vocab!r}",
            fix=f"e.g. {Opt('vocab_size', 32000)}",
        )
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise UsageError(
            f"{Opt('pad_to_multiple_of')} must be ≥ 1, got {pad_to_multiple_of}", fix="e.g. 64 or 128"
        )
    if init not in INITS:
        raise UsageError(f"unknown {Opt('init')} {init!r}", fix="use mean, zeros or normal")
    return Init(init)


def _refuse_ambiguous_resize(det: Detection) -> None:
    """Refuse a square head (vocab_size == hidden_size) with no ``--layout`` (AmbiguousLayoutError)."""
    if det.head_present and det.head_layout == "ambiguous":
        raise AmbiguousLayoutError(
            f"vocab_size == hidden_size == {det.vocab_rows}: whether {det.head} is [vocab, hidden] or "
            "[hidden, vocab] cannot be told from its square shape",
            det.ckpt.path,
            f"pass {Opt('layout', 'vocab-hidden')} or {Opt('layout', 'hidden-vocab')}",
        )


def _refuse_target(det: Detection, N: int, init: Init) -> None:
    """Refuse (UsageError) ``N`` rows beyond int32 token ids, or new rows of ``hidden`` values that would
    not fit in the memory available (per new value: float32 rows + stored copy for ``zeros``; + a float64
    draw for ``normal`` and ``mean``)."""
    V, H = det.vocab_rows, det.hidden
    if N > MAX_VOCAB:
        raise UsageError(
            f"{Opt('vocab_size', N)} is beyond any tokenizer (token ids are int32 in Paddle; at most "
            f"{MAX_VOCAB})",
            fix="check the number",
        )
    need = (N - V) * H * {Init.ZEROS: 8, Init.NORMAL: 16, Init.MEAN: 32}[init]
    avail = _available_memory()
    if N > V and avail is not None and need > avail:
        raise UsageError(
            f"{Opt('vocab_size', N)} adds {N - V} rows of {H}: about {need >> 20} MiB of new rows, more "
            f"than the {avail >> 20} MiB of memory available",
            fix="check the number, or free memory",
        )


def _trim_refusal(det: Detection, N: int, past: list[str]) -> RefusedError:
    """The refusal of trimming to ``N`` rows without ``--force``: how many rows go, and whether they are
    padding rows beyond the tokenizer, real tokens, or unknown (no tokenizer files); ``past``: special
    token ids that would point past the last row."""
    V, tok = det.vocab_rows, det.tokenizer
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
    if past:
        what += f"; these token ids would point past the last row: {', '.join(past)}"
    return RefusedError(
        f"resize to {N} rows would trim {V - N} rows ({V} → {N}, rows {N}..{V - 1} removed): {what}",
        det.ckpt.path,
        f"pass {Opt('force', True)} to shrink anyway, or a {Opt('vocab_size')} of at least the current rows",
    )


def _resolve_seed(seed: int | None) -> int:
    """``seed``, or a random one in [0, 2**31) when None (as uniform as ``SeedSequence().entropy % 2**31``,
    which it was).

    Raises:
        UsageError: a seed that is not a non-negative integer.
    """
    if seed is None:
        return secrets.randbits(31)
    if not isinstance(seed, int) or seed < 0:
        raise UsageError(
            f"{Opt('seed')} must be a non-negative integer, got {seed!r}", fix=f"e.g. {Opt('seed', 0)}"
        )
    return seed


def _resize_report(
    det: Detection, vocab: int, N: int, init: Init, seed: int, pad_to_multiple_of: int | None
) -> dict:
    """The report's ``resize`` fields: rows before/after/requested/added/removed, init, seed, padding,
    tokenizer size, and the head's rows where they differ from the embedding's."""
    V = det.vocab_rows
    rep = {
        "rows_before": V,
        "rows_after": N,
        "rows_requested": vocab,
        "rows_added": max(0, N - V),
        "rows_removed": max(0, V - N),
        "init": init.value,
        "seed": seed,
        "pad_to_multiple_of": pad_to_multiple_of,
        "tokenizer_size": det.tokenizer.size,
    }
    if det.head_rows is not None and det.head_rows != V and det.head_vocab is None:
        rep["head_rows_before"] = det.head_rows
        rep["head_rows_after"] = det.head_rows + N - V
    return rep


def _resize_notes(det: Detection, plan: Plan, N: int, past: list[str]) -> None:
    """Notes and warnings of a resize: rows removed (``--force``), token ids left without a row."""
    V, tok = det.vocab_rows, det.tokenizer
    if N < V:
        plan.notes.append(f"{Opt('force', True)}: rows {N}..{V - 1} removed from every vocabulary tensor")
    if tok.size is not None and N < tok.size:
        plan.warnings.append(f"the tokenizer defines {tok.size} tokens; ids ≥ {N} will have no row")
    if past:
        plan.warnings.append(
            f"token ids beyond the last row after the resize (ids 0..{N - 1}): {', '.join(past)}"
        )


def _resize_config(det: Detection, plan: Plan, N: int) -> None:
    """Every vocabulary-size key (:func:`surgery.vocabkeys.vocab_keys`: any nesting, config.json and
    model_config.json) that counts the embedding's rows becomes ``N``; one that counts the head's rows (an
    embedding with reserved rows, ``head_rows != vocab_rows``) moves with the head. The language model's own
    ``vocab_size`` (top level, or the nested ``text_config`` one) is set whatever it held
    (:func:`_primary_vocab_size`), and a key equal to it (a stale copy, such as ``model_config.json``'s
    ``init_args``) follows it; a key of another value (a second vocabulary) stays.

    Where only the keys handled before exist (top-level / nested ``vocab_size``, ``padded_vocab_size``,
    model_config.json ``vocab_size`` / ``init_args.N.vocab_size``) the keys set are the same as before.
    """
    V, hrows, ckpt = det.vocab_rows, det.head_rows, det.ckpt
    primary = _primary_vocab_size(det, N)
    moves = {V: N}
    if hrows is not None and hrows != V and det.head_vocab is None:
        moves.setdefault(hrows, hrows + N - V)
    if det.config_vocab_size is not None:
        moves.setdefault(det.config_vocab_size, _config_rows(det, N))
    # the primary keys as the files spell them (a folder with only model_config.json keeps them in its args)
    spelled = {_spelled(ckpt, f, k) for f, k, _ in primary}
    config = ckpt.config if ckpt.config_file == "config.json" else None
    plan.config_set += primary
    for k in vocab_keys(ckpt.path, config):
        if (k.file, k.key) not in spelled and k.value in moves:
            plan.config_set.append((k.file, k.key, moves[k.value]))


def _spelled(ckpt: Checkpoint, file: str, key: str) -> tuple[str, str]:
    """``(file, key)`` of a config.json key as the folder stores it: in a folder with only model_config.json,
    under its model arguments (``init_args.0.vocab_size``), as :mod:`surgery.write` sets it."""
    if file == "config.json" and ckpt.config_file != "config.json":
        return ckpt.config_file, f"{ckpt.config_prefix}.{key}".lstrip(".")
    return file, key


def _config_rows(det: Detection, N: int) -> int:
    """The config's vocab_size after a resize to ``N`` embedding rows: ``N``, or the head's new rows where
    the config counted the head's rows (an embedding with reserved rows)."""
    V, hrows = det.vocab_rows, det.head_rows
    offset_head = hrows is not None and hrows != V and det.config_vocab_size == hrows and not det.head_vocab
    return N - V + hrows if offset_head and hrows is not None else N


def _primary_vocab_size(det: Detection, N: int) -> list[tuple[str, str, object]]:
    """config.json ``vocab_size`` (when present, or created when the config names no key sizing the table)
    and the key that sizes the language model's table (``det.vocab_key``: ``text_config.vocab_size``,
    ``thinker_config.text_config.vocab_size``, ``padded_vocab_size``): ``N``, or the head's new rows where
    the config counted the head's rows (an embedding with reserved rows)."""
    cfg, cvs, key = det.ckpt.config, _config_rows(det, N), det.vocab_key
    out: list[tuple[str, str, object]] = []
    if "vocab_size" in cfg or key in (None, "vocab_size"):
        out.append(("config.json", "vocab_size", cvs))
    if key is not None and key != "vocab_size":
        out.append(("config.json", key, cvs))
    return out


def _refuse_resize_surface(det: Detection, N: int) -> None:
    """Refuse a resize that would leave part of the vocabulary surface behind: a missing embedding, a
    vocabulary-shaped tensor of no known role, an extra table of another vocabulary size, a head with
    reserved rows the new size cannot keep."""
    ckpt, V = det.ckpt, det.vocab_rows
    if not det.embedding_present:
        raise _missing_embedding_refusal(
            det, "resize", f"restore it first (untie, or tie {Opt('keep', 'head')}), then resize"
        )
    odd = [f"{n} {list(ckpt.tensors[n].shape)} {ckpt.logical_dtype(ckpt.tensors[n])}" for n in det.by_shape]
    if odd:
        raise RefusedError(
            f"resize refused: {', '.join(odd)} has an axis of the vocabulary's {V} entries but no known role "
            "or rule (not the embedding, head, bias, a known copy or a token-indexed table of the "
            "architecture table): resizing the rest would leave it at the old size",
            ckpt.path,
            f"if it is the embedding or head, pass {Opt('embedding')}/{Opt('head', 'NAME')}; otherwise "
            "remove or rename it first",
        )
    rows = (V, det.head_rows if det.head_vocab is None else V)

    def follows(n: str) -> bool:
        axis = det.vocab_axis(n)
        return axis is not None and ckpt.tensors[n].shape[axis] in rows

    other = [n for n in det.extra_tables if not follows(n)]
    if other:
        raise RefusedError(
            f"resize refused: the extra vocabulary table(s) {', '.join(other)} have no axis of the "
            f"embedding's {V} rows (a vocabulary of their own), so it is unknown how they follow a resize",
            ckpt.path,
            "resize them with the tool of their model, or remove them first",
        )
    if det.head_rows is not None and det.head_vocab is None and det.head_rows + N - V < 1:
        raise RefusedError(
            f"resize to {N} rows would leave the head {det.head} with {det.head_rows + N - V} rows (it has "
            f"{V - det.head_rows} rows fewer than the embedding)",
            ckpt.path,
            f"pass a larger {Opt('vocab_size')}",
        )


@dataclass
class _Draws:
    """Hands out the recipes of new rows, each with the next random stream of ``seed`` (child 0, 1, ... of
    ``SeedSequence(seed)``, in planning order), so a given seed gives the same bytes."""

    init: Init
    seed: int
    std: float
    streams: int = 0

    def rows(self, name: str, count: int, axis: int) -> NewRows | None:
        """``count`` new rows for ``name`` from its own entries along ``axis`` (None when ``count`` is 0;
        a stream is used either way)."""
        stream, self.streams = self.streams, self.streams + 1
        return NewRows(name, axis, count, self.init, self.seed, stream, self.std) if count > 0 else None

    def table(self, name: str, axis: int, new: int, old: int) -> ResizedTable:
        """``name`` to ``new`` entries along ``axis`` (``old`` now), new entries from its own."""
        return ResizedTable(name, axis, new, self.rows(name, max(0, new - old), axis))


def _new_shape(shape: tuple[int, ...], axis: int, new: int) -> tuple[int, ...]:
    s = list(shape)
    s[axis] = new
    return tuple(s)


def _put(plan: Plan, n: str, axis: int, new: int, recipe: Recipe, storage: object = None) -> None:
    """Replace ``n`` by ``recipe``: its shape with ``new`` entries along ``axis``, its (relabelled) dtype."""
    t = plan.ckpt.tensors[n]
    out = _out_dtype(plan.ckpt, t, plan.relabel_u16)
    plan.replace[n] = NewTensor(n, out, _new_shape(t.shape, axis, new), recipe, t.file, storage=storage)


def _resize_tensors(det: Detection, plan: Plan, N: int, draws: _Draws) -> None:
    """Every vocabulary tensor to ``N`` embedding rows (the head and its bias move by the same number of
    rows): the embedding and its aliases (one table), vocabulary aliases, the head, the bias, the extra
    tables. New rows are drawn in that order (:class:`_Draws`)."""
    ckpt, V = det.ckpt, det.vocab_rows
    emb = ResizedTable(det.embedding, 0, N, draws.rows(det.embedding, max(0, N - V), 0))
    for n in [det.embedding] + det.embedding_aliases:
        _put(plan, n, 0, N, emb, ckpt.tensors[n].storage)
    for n in det.vocab_aliases:
        _put(plan, n, 0, N, draws.table(n, 0, N, V), ckpt.tensors[n].storage)
    hrows = det.head_rows if det.head_rows is not None else V
    hnew = hrows + N - V
    head: Recipe | None = None
    if det.head_vocab is None:
        head = _resize_head(det, plan, hrows, hnew, emb, draws)
        _resize_bias(det, plan, hrows, hnew)
    else:
        plan.notes.append(
            f"{det.head} is over another vocabulary (config.json {det.head_vocab} = {hrows}): kept as it is"
        )
    _resize_token_tables(det, plan, N)
    for n in det.extra_tables:
        axis = det.vocab_axis(n) or 0
        old = ckpt.tensors[n].shape[axis]
        new = N if old == V else hnew
        own = draws.table(n, axis, new, old)
        main = det.embedding if old == V and axis == 0 else det.head if head is not None else None
        main_recipe = emb if main == det.embedding else head
        if main is not None and main_recipe is not None:  # a copy of main stays a copy
            _put(plan, n, axis, new, CopyIfEqual(n, main, main_recipe, own))
        else:
            _put(plan, n, axis, new, own)


def _resize_token_tables(det: Detection, plan: Plan, N: int) -> None:
    """Every token-indexed table of the embedding's vocabulary to ``N`` rows by its rule
    (:data:`~surgery.architectures.TOKEN_TABLES`): old rows kept, new rows repeating existing rows (ids of
    something else stay valid) or zero/False (a membership mask); tables keyed to another vocabulary are
    kept (their values checked by :func:`_refuse_token_values`)."""
    for n, rule in det.token_tables.items():
        if rule.indexed_by != "vocab":
            continue
        recipe = TokenRows(n, N, cycle=rule.rule is arch.TokenRule.CYCLE_ROWS)
        _put(plan, n, 0, N, recipe, det.ckpt.tensors[n].storage)
        plan.notes.append(f"{n} ({rule.what}) to {N} rows: {rule.rule.value}")


def _refuse_token_values(det: Detection, N: int) -> None:
    """Refuse a resize to ``N`` rows that the values of a token table contradict
    (:func:`_refuse_bound`, :func:`_refuse_trimmed_ids`), or a trim while an integer tensor of another
    vocabulary, whose values no rule explains, may hold token ids the trim removes.

    Raises:
        RefusedError: naming the tensor.
    """
    ckpt = det.ckpt
    for n, rule in det.token_tables.items():
        _refuse_bound(det, n, rule)
        if rule.rule is arch.TokenRule.KEEP_IDS and N < det.vocab_rows:
            _refuse_trimmed_ids(det, n, rule, N)
    unknown = [
        n
        for n in det.other_vocab
        if n not in det.token_tables and ckpt.logical_dtype(ckpt.tensors[n]) not in _FLOATS
    ]
    if N < det.vocab_rows and unknown:
        raise RefusedError(
            f"resize to {N} rows refused: {', '.join(unknown)} (integer, of another vocabulary) may hold "
            "token ids the trim removes, and no rule of the architecture table says what its values are",
            ckpt.path,
            "grow the vocabulary instead, or remove the tensor first",
        )


def _refuse_bound(det: Detection, n: str, rule: arch.TokenTable) -> None:
    """Refuse a token table whose values lie outside the bound its rule names (``n_routed_experts``): it is
    not the table the rule describes."""
    key, limit = _bound(det, rule)
    if limit is None:
        return
    a = np.asarray(det.ckpt.load(n))
    if a.size and (int(a.min()) < 0 or int(a.max()) >= limit):
        raise RefusedError(
            f"resize refused: {n} ({rule.what}) holds values {int(a.min())}..{int(a.max())}, outside "
            f"0..{limit - 1} (config {key} = {limit}): not the table its rule describes",
            det.ckpt.path,
            "check the checkpoint; remove the table or resize it with its model's own tools",
        )


def _refuse_trimmed_ids(det: Detection, n: str, rule: arch.TokenTable, N: int) -> None:
    """Refuse a trim to ``N`` rows while the token-id map ``n`` (target id = index + value) points at a
    removed row."""
    a = np.asarray(det.ckpt.load(n)).astype(np.int64)
    ids = np.arange(a.shape[0]) + a
    top = int(ids.max()) if ids.size else -1
    if top >= N:
        raise RefusedError(
            f"resize to {N} rows refused: {n} ({rule.what}) points at token ids up to {top}, which the "
            "trim removes",
            det.ckpt.path,
            f"pass a {Opt('vocab_size')} above {top}",
        )


_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _bound(det: Detection, rule: arch.TokenTable) -> tuple[str | None, int | None]:
    """The config key and value bounding a token table's values (the first of its rule's ``bound`` keys
    present in the language model's block or at the top), or ``(None, None)``."""
    for b in (det.ckpt.config if det.text_cfg_key is None else _text_block(det), det.ckpt.config):
        for key in rule.bound:
            v = b.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return key, v
    return None, None


def _text_block(det: Detection) -> dict:
    """The language model's config block (``det.text_cfg_key``, dotted), or the top level."""
    try:
        block = get_dotted(det.ckpt.config, det.text_cfg_key or "")
    except (KeyError, IndexError, TypeError):
        return det.ckpt.config
    return block if isinstance(block, dict) else det.ckpt.config


def _resize_head(
    det: Detection, plan: Plan, hrows: int, hnew: int, emb: ResizedTable, draws: _Draws
) -> Recipe | None:
    """The head and its aliases from ``hrows`` to ``hnew`` vocabulary entries (rows of ``[vocab, hidden]``,
    columns of ``[hidden, vocab]``); returns its recipe (None: no head in the files).

    A head equal to the embedding stays equal (tied or not): it gets the embedding's new rows, so
    resize-then-untie and untie-then-resize give the same tensors; otherwise rows of its own.
    """
    h = det.head_info
    if h is None:
        return None
    axis = 1 if det.head_layout == HIDDEN_VOCAB else 0
    tied_equal = det.comparison.values in ("exact", "transposed") and h.dtype == det.emb_info.dtype
    recipe: Recipe
    if tied_equal and axis == 0:
        recipe = emb
    else:
        rows = emb.rows if tied_equal else draws.rows(det.head, max(0, hnew - hrows), axis)
        recipe = ResizedTable(det.head, axis, hnew, rows)
    if tied_equal and det.config_tied and hrows == det.vocab_rows and _drop_redundant_head(det, plan):
        return recipe  # extra tables that copy the head still follow it
    storage = det.emb_info.storage if det.comparison.storage_shared else None
    for n in [det.head] + det.head_aliases:
        _put(plan, n, axis, hnew, recipe, storage or det.ckpt.tensors[n].storage)
    return recipe


def _drop_redundant_head(det: Detection, plan: Plan) -> bool:
    """Drop the redundant head of a tied checkpoint (config tied, head byte-equal to the embedding) where
    the loader re-ties a missing head, as ``tie`` would (:func:`_drop_head`), with a note: the loader
    rebuilds it from the resized embedding. PaddleFormers 1.2 writes such a head although the config says
    tied. Returns whether it was dropped (False: the loader needs the head, which is resized)."""
    why = f"duplicate of {det.embedding} in a tied checkpoint (the {det.loader} loader re-ties it)"
    if not _drop_head(det, plan, why):
        if det.family.reties and not det.family.trusted:
            _unproven_note(det, plan, f"{det.head} is resized with the embedding, not dropped")
        return False
    plan.notes.append(
        f"{det.head} dropped instead of resized: {det.config_source} is true and it equalled "
        f"{det.embedding}, so the {det.loader} loader rebuilds it from the resized embedding"
    )
    return True


def _resize_bias(det: Detection, plan: Plan, old: int, new: int) -> None:
    """The head bias ``[V]`` / ``[1, V]`` (and its aliases, one array) to ``new`` entries; new entries zero.

    Raises:
        RefusedError: the bias has another number of entries than the head's ``old`` rows.
    """
    ckpt, bias = det.ckpt, det.bias
    if not bias:
        return
    b = ckpt.tensors[bias]
    if not b.shape or b.shape[-1] != old:
        got = f"{b.shape[-1]} entries" if b.shape else "no axis (shape [])"
        raise RefusedError(
            f"the head bias {bias} has {got} but the head has {old} vocabulary rows",
            ckpt.path,
            "fix the bias first",
        )
    recipe = ResizedBias(bias, new)
    for n in [bias] + det.bias_aliases:
        t = ckpt.tensors[n]
        out = _out_dtype(ckpt, t, plan.relabel_u16)
        plan.replace[n] = NewTensor(n, out, t.shape[:-1] + (new,), recipe, t.file, storage=t.storage)


def check_dtypes(plan: Plan) -> Plan:
    """Refuse a plan that would compute with a tensor in a dtype tietool only copies as bytes: resize or new
    rows of a float8 / float4 / float6 / complex vocabulary tensor, a scaled copy of one; or transpose a
    packed sub-byte one (``F4``, ``F6_*``). Every other tensor of any dtype is copied byte for byte.

    Returns:
        ``plan``, unchanged.

    Raises:
        RefusedError: naming the tensor, its dtype and what the plan would do with it.
    """
    ckpt = plan.ckpt
    for nt in [*plan.replace.values(), *plan.add]:
        for use in uses(nt.recipe):
            d = ckpt.tensors[use.name].st_dtype
            if (use.values and not d.decodable) or d.packed:
                raise dtype_refusal(
                    ckpt.tensors[use.name],
                    ckpt.path,
                    use.doing,
                    "tietool resizes and converts vocabulary tensors stored as float (BF16, F16, F32, F64) "
                    "or integers: run it on the checkpoint before quantization, then quantize the output",
                    op=plan.op,
                )
    return plan
