"""``untie``: materialise the LM head as a copy of the input embedding, in the layout the loader expects
(the planner :func:`plan_untie`).
"""

from __future__ import annotations

from dataclasses import replace

from .. import arch
from ..inspect.detect import tied_scale
from ..inspect.detection import Detection
from ..io.checkpoint import Checkpoint
from ..model.enums import LAYOUTS, HeadLayout, Loader
from ..model.errors import Opt, RefusedError, UsageError
from .plan import (
    NEW_SHARD,
    OutTensor,
    Plan,
    base_plan,
    check_new_names,
    out_dtype,
    refuse_stale_vocab_size,
    refuse_unsettled_pair,
    refuse_unusable_head,
    restore_embedding,
    tie_flags,
    unproven_note,
)
from .recipes import CopyOf


def _embedding_as_head(det: Detection, lay: str, scale: float | None) -> CopyOf:
    """The recipe of an untied head: the embedding ``[vocab, hidden]`` in layout ``lay`` (a byte-range copy
    when the layout is the stored one), times ``scale`` (T5) when given, rounded back to the stored dtype."""
    return CopyOf(det.embedding.name, transpose=lay == HeadLayout.HIDDEN_VOCAB, scale=scale)


def _place_new_head(det: Detection, plan: Plan, head: OutTensor) -> None:
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
    ckpt, plan = det.ckpt, base_plan("untie", det)
    refuse_unsettled_pair(det, "untie")
    refuse_unusable_head(det, "untie")
    refuse_stale_vocab_size(det, "untie")
    if det.family.refuses_untie:
        raise RefusedError(
            f"untie refused: the {det.loader.name} loader of {det.config.model_type} always takes "
            f"{det.head.name} from "
            f"{det.embedding.name} on load, whatever tie_word_embeddings says, so an untied head would be "
            "ignored",
            ckpt.path,
            f"pass {Opt('loader', 'hf')} if another library will load the output",
        )
    if det.family.always_tied:
        unproven_note(det, plan, "the head is written although the table says the loader always ties it")
    plan.config_set = tie_flags(det, False)
    if not det.embedding.present:
        restore_embedding(det, plan)
        check_new_names(plan)
        return plan
    if det.head.present and not det.comparison.storage_shared:
        plan.notes.append(
            f"{det.head.name} already exists as its own tensor: its bytes are kept (untie only sets the flag)"
        )
        return plan
    _add_untied_head(det, plan, layout)
    _add_alias_copies(det, plan)
    check_new_names(plan)
    return plan


def _add_alias_copies(det: Detection, plan: Plan) -> None:
    """Under HF transformers, a family whose untied model keeps the encoder/decoder embedding copies apart
    from the shared table (``arch.HF_UNTIED_KEEPS_ALIASES_APART``: BART) gets each alias name the file lacks
    as a copy of the embedding ``[vocab, hidden]`` (same dtype), so that they do not load random."""
    fam = det.family
    if det.loader.name != Loader.HF or fam.name not in arch.HF_UNTIED_KEEPS_ALIASES_APART:
        return
    suffix = next((s for s in fam.embedding if det.embedding.name.endswith(s)), None)
    if suffix is None:
        return
    prefix, e = det.embedding.name[: -len(suffix)], det.emb_info
    dtype = out_dtype(det.ckpt, e, plan.relabel_u16)
    for alias in fam.aliases:
        name = prefix + alias
        if name in det.ckpt.tensors:
            continue
        copy = OutTensor(name, dtype, (det.vocab_rows, det.hidden), CopyOf(det.embedding.name), e.file)
        plan.add.append(replace(copy, file=NEW_SHARD) if det.ckpt.sharded else copy)
        plan.notes.append(
            f"{name} written as a copy of {det.embedding.name}: the untied {fam.name} model of the "
            f"{det.loader.name} loader keeps it apart from the shared table"
        )


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
    shape = (det.vocab_rows, det.hidden) if lay == HeadLayout.VOCAB_HIDDEN else (det.hidden, det.vocab_rows)
    scale = None
    if det.family.scales_tied_logits and not det.head.present:
        scale = tied_scale(det.ckpt.config, det.hidden, det.ckpt.path)
        plan.notes.append(
            f"{det.family.name}: tied logits are scaled by d_model ** -0.5 = {scale:.6g}; the new head "
            "is the embedding times that factor, so logits do not change"
        )
    recipe = _embedding_as_head(det, lay, scale)
    dtype = out_dtype(det.ckpt, e, plan.relabel_u16)
    _place_new_head(det, plan, OutTensor(det.head.name, dtype, shape, recipe, e.file))
    plan.notes.append(
        f"{det.head.name} written as {list(shape)} ({lay}), for the {det.loader.name} loader"
        + ("" if layout not in (None, "auto") else f" (auto: {det.loader.source})")
    )


def _auto_layout(det: Detection) -> str:
    """The layout of an untied head under ``layout="auto"``: the stored head's (a head sharing the
    embedding's storage), else the layout the loader expects for the family, where that is proven.

    Raises:
        RefusedError: no stored head and the loader's head layout is unproven for the model type and
            container (``Family.head_layout_proven``): a wrong layout would not load.
    """
    if det.head.present and det.head.layout in LAYOUTS:
        return det.head.layout
    fam = det.family
    if fam.head_layout_proven:
        return fam.head_layout
    proven = fam.proven_loaders()
    raise RefusedError(
        f"untie refused: the head layout the {det.loader.name} loader expects for {det.config.model_type} "
        "from "
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
