"""``tie``: drop the duplicate LM head, or keep it where the loader would not rebuild it (the planner
:func:`plan_tie`; the shared plan type and refusals are :mod:`surgery.plan.plan`).
"""

from __future__ import annotations

from ..inspect.detection import Detection
from ..model.enums import EQUAL_STATES, HeadLayout, Keep, TieState
from ..model.errors import AmbiguousLayoutError, Opt, RefusedError, ValuesDifferError
from .plan import (
    OutTensor,
    Plan,
    base_plan,
    check_new_names,
    drop_head,
    missing_embedding_refusal,
    out_dtype,
    refuse_stale_vocab_size,
    refuse_unsettled_pair,
    refuse_unusable_head,
    restore_embedding,
    tie_flags,
    unproven_note,
)
from .recipes import CopyOf


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
    plan = base_plan("tie", det)
    refuse_unsettled_pair(det, "tie")
    refuse_unusable_head(det, "tie")
    refuse_stale_vocab_size(det, "tie")
    plan.config_set = tie_flags(det, True)
    if not det.embedding.present:
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
    copies = [a for a in det.embedding.aliases if det.family.may_drop_head]
    if drop_aliases:
        for a in copies:
            plan.drop[a] = f"copy of {det.embedding.name} ({Opt('drop_aliases', True)})"
    elif copies:
        plan.notes.append(
            f"{', '.join(copies)} duplicate {det.embedding.name} and are kept "
            f"({Opt('drop_aliases', True)} drops them)"
        )


def _tie_without_head(det: Detection, plan: Plan) -> Plan:
    """tie when the files hold no head: only the flag changes (and dropped aliases, if any)."""
    plan.metadata = {n: det.embedding.name for n in plan.drop}
    if det.tie.tied:
        plan.notes.append(f"already tied: no head in the files and {det.tie.source} = true")
    else:
        plan.notes.append(f"no head in the files: only {det.tie.source} changes to true (0 bytes saved)")
    return plan


def _refuse_ambiguous_tie(det: Detection) -> None:
    """Refuse a square head (vocab_size == hidden_size) with no ``--layout`` (AmbiguousLayoutError)."""
    if det.head.layout is HeadLayout.AMBIGUOUS:
        raise AmbiguousLayoutError(
            f"vocab_size == hidden_size == {det.vocab_rows}: the layout of {det.head.name} cannot be told "
            "from "
            f"its square shape; as stored it is {det.comparison.values} vs {det.embedding.name}",
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
    if comp.values in EQUAL_STATES and det.family.scales_tied_logits:
        _unscaled_head(det, plan, keep)
    if comp.values is TieState.DIFFERENT:
        _refuse_own_biased_head(det, keep)
        if keep is None:
            raise ValuesDifferError(
                f"tie refused: {det.head.name} differs from {det.embedding.name} (max |difference| "
                f"{comp.max_abs_diff:.3g}, {comp.differing_rows} of {det.vocab_rows} rows differ)",
                det.ckpt.path,
                f"pass {Opt('keep', 'embedding')} or {Opt('keep', 'head')} to choose the values to keep, or "
                "use untie",
            )
        if keep == Keep.HEAD:
            _keep_head_values(det, plan)
        else:
            plan.notes.append(f"{Opt('keep', 'embedding')}: the values of {det.head.name} are discarded")
    if comp.values is TieState.SCALED:
        plan.notes.append(
            f"{det.head.name} is {det.embedding.name} × d_model ** -0.5: exactly the tied head, so it is "
            "dropped"
        )


def _refuse_own_biased_head(det: Detection, keep: Keep | str | None) -> None:
    """``--keep`` on a biased Linear head that the loader never builds from the embedding (PaddleNLP 2.8.1
    CodeGen / GPT-J: ``lm_head.weight`` + ``lm_head.bias``, ``tests/oracles/test_pnlp_loaders.py``): the head
    stays (0 bytes saved) and ``--keep`` would only overwrite one side's trained values.

    Raises:
        RefusedError: ``keep`` is set, the head has a bias and the loader neither re-ties nor always ties.
    """
    fam = det.family
    if keep is None or not det.bias or fam.reties or fam.always_tied:
        return
    other = det.embedding.name if keep == Keep.HEAD else det.head.name
    raise RefusedError(
        f"tie {Opt('keep', Keep(keep).value)} on {fam.model_type or fam.name}: {det.head.name} is a Linear "
        "head "
        f"of its own with a bias ({det.bias.name}) that the {det.loader.name} loader never builds from "
        f"{det.embedding.name}, so tie cannot drop it (0 bytes saved) and would only overwrite the trained "
        "values "
        f"of {other}",
        det.ckpt.path,
        f"keep the checkpoint untied: the loader uses {det.head.name} and {det.bias.name} whatever "
        "tie_word_embeddings says",
    )


def _unscaled_head(det: Detection, plan: Plan, keep: Keep | str | None) -> None:
    """A head equal to the embedding itself in a family whose tied logits scale the embedding (T5:
    ``d_model ** -0.5``) is not the tied head: dropping it scales every logit (checked with PaddleNLP
    2.8.1's T5, ``tests/oracles/test_pnlp_loaders.py``). Only ``--keep embedding`` accepts that.

    Raises:
        ValuesDifferError: ``keep`` is None. RefusedError: ``keep`` is ``head`` (:func:`_keep_head_values`).
    """
    scale = det.family.tied_scale.value
    if keep is None:
        raise ValuesDifferError(
            f"tie refused: {det.head.name} equals {det.embedding.name}, but the tied {det.family.name} model "
            "scales "
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
    if det.family.scales_tied_logits:
        raise RefusedError(
            f"{Opt('keep', 'head')} on {det.family.name}: the tied model multiplies the embedding by "
            "d_model ** -0.5 for the logits, so the head's values cannot become the embedding",
            ckpt.path,
            f"use {Opt('keep', 'embedding')}, or keep the checkpoint untied",
        )
    _refuse_other_dtypes(det, Keep.HEAD)
    recipe = CopyOf(det.head.name, transpose=det.head.layout == HeadLayout.HIDDEN_VOCAB)
    for n in [det.embedding.name] + det.embedding.aliases:
        t = ckpt.tensors[n]
        out = out_dtype(ckpt, t, plan.relabel_u16)
        plan.replace[n] = OutTensor(n, out, t.shape, recipe, t.file, storage=("embedding",))
    plan.notes.append(f"{Opt('keep', 'head')}: {det.embedding.name} takes the values of {det.head.name}")


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
            f"{Opt('keep', keep.value)}: {det.head.name} is {ckpt.logical_dtype(h)} but {det.embedding.name} "
            "is "
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
    if drop_head(det, plan, f"duplicate of {det.embedding.name} (the {det.loader.name} loader re-ties it)"):
        return
    if not det.family.trusted:
        kept = f"{det.head.name} is kept, equal to the embedding, and the flag set; 0 bytes saved"
        unproven_note(det, plan, kept)
    else:
        plan.notes.append(
            f"the {det.loader.name} loader ({det.family.name}) does not re-tie a missing head: it would load "
            "a "
            f"random one, so {det.head.name} is kept, equal to the embedding in the loader's "
            f"{det.head.layout} "
            "layout; 0 bytes saved"
        )
    if keep == Keep.EMBEDDING and det.comparison.values is TieState.DIFFERENT:
        _refuse_other_dtypes(det, Keep.EMBEDDING)
        recipe = CopyOf(det.embedding.name, transpose=det.head.layout == HeadLayout.HIDDEN_VOCAB)
        out = out_dtype(det.ckpt, h, plan.relabel_u16)
        plan.replace[det.head.name] = OutTensor(det.head.name, out, h.shape, recipe, h.file)


def _tie_missing_embedding(det: Detection, plan: Plan, keep: Keep | str | None) -> Plan:
    """tie of a checkpoint whose embedding is stored only as the head: with ``keep="head"`` the embedding
    is restored from the head's bytes and the head dropped (kept where the loader does not re-tie)."""
    if keep != Keep.HEAD:
        raise missing_embedding_refusal(
            det,
            "tie",
            f"pass {Opt('keep', 'head')} to restore {det.embedding.name} from {det.head.name} (and drop the "
            "head), or "
            "use untie to restore it beside the head",
        )
    restore_embedding(det, plan)
    if det.family.may_drop_head:
        plan.drop[det.head.name] = (
            f"its table is {det.embedding.name} now (the {det.loader.name} loader re-ties it)"
        )
        plan.metadata = {det.head.name: det.embedding.name}
    elif not det.family.trusted:
        unproven_note(det, plan, f"{det.head.name} is kept")
    else:
        plan.notes.append(
            f"the {det.loader.name} loader ({det.family.name}) does not re-tie a missing head, so "
            f"{det.head.name} "
            "is kept"
        )
    check_new_names(plan)
    return plan


def _refuse_unequal_rows(det: Detection, op: str) -> None:
    """tie needs a head with the embedding's vocabulary rows."""
    if det.head.rows is not None and det.head.rows != det.vocab_rows:
        other = (
            f" (the head is over another vocabulary, config.json {det.head.vocab} = {det.head.rows})"
            if det.head.vocab
            else ""
        )
        raise RefusedError(
            f"{op} refused: the head {det.head.name} {list(det.ckpt.tensors[det.head.name].shape)} has "
            f"{det.head.rows} "
            f"vocabulary rows and the embedding {det.embedding.name} {list(det.emb_info.shape)} has "
            f"{det.vocab_rows}{other}: one table cannot serve both shapes",
            det.ckpt.path,
            "keep the checkpoint untied (its head is over its own vocabulary by design)"
            if det.head.vocab
            else "keep the checkpoint untied, or resize the tables to the same rows first",
        )
