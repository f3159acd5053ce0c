"""``tietool convert``: move a checkpoint between the on-disk conventions of PaddleNLP 2.x, ERNIEKit and
PaddleFormers.

Conventions (:mod:`surgery.inspect.convention`; fixtures ``pnlp_llama_untied``,
``pf_llama_untied_legacy_pdparams``,
``pf_llama_untied_fp32``, cases ``d01``/``d11``):

* PaddleNLP 2.x: ``llama.``/``qwen2.`` names, every ``nn.Linear`` weight ``[in, out]``, the head
  ``[hidden, vocab]``; ``model_state.pdparams`` (bf16 as numpy ``uint16``).
* ERNIEKit (ERNIE 4.5 ``*-Paddle`` releases): ``ernie.`` names, fused ``qkv_proj`` ``[q | k | v]`` and
  ``up_gate_proj`` ``[gate | up]``, ``[in, out]``, an untied head ``[hidden, vocab]``; safetensors ``np``.
* PaddleFormers legacy (``save_checkpoint_format="legacy"``, config ``source: paddle``): HF names
  (``model.``), Linear weights ``[in, out]`` (ERNIE 4.5 / Qwen2 / Qwen3 fused, qkv grouped per kv head),
  the head ``[vocab, hidden]``.
* PaddleFormers / HF safetensors: HF names, Linear weights ``[out, in]``, the head ``[vocab, hidden]``.

The input's naming is read from its tensor names, its Linear layout proven from the shapes against the
config (:mod:`surgery.inspect.linear_layout`), never taken from the container. Which tensors are Linear
weights, their axis sizes, the name prefixes and the fused projections are data
(:data:`surgery.arch.CONVERSIONS`). Planning here is pure: :func:`plan_convert` says which output
tensor comes from which input tensor by which recipe (:class:`~surgery.plan.recipes.CopyOf`, transposed or
not, :class:`~surgery.plan.recipes.FusedPart`); :func:`surgery.ops.convert` has the writer stream it
(:func:`surgery.write.writer.write_new`: one tensor in memory at a time, untransposed tensors copied by byte
range, bf16 moved as raw ``uint16`` bits, never converted). No paddle import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import arch
from ..inspect.convention import (
    HF,
    KEPT,
    LEGACY_LOAD,
    PADDLENLP,
    Convention,
    Naming,
    suffix_in,
)
from ..inspect.linear_layout import Layout, Proof, hint_container_only, prove
from ..io.checkpoint import Checkpoint
from ..model.enums import Container, Operation, Target
from ..model.errors import CheckpointError, Opt, RefusedError
from ..model.tensor import DTYPES, describe_dtype, dtype_refusal
from .convert_tensors import (
    conversion_step,
    copy_steps,
    head_is_embedding_t,
    label_of,
    model_steps,
    prefix_of,
    reshaped,
    source_convention,
    source_of,
    swapped,
)
from .plan import OutTensor, Plan, Reshard, reshard_plan
from .recipes import ROWS_BYTES

# files an output never carries: PaddleFormers' loader writes this one into the folder it loads, and it
# describes the input's files, not the output's
NOT_CARRIED = ("flex-ckpt.auto_generated.metadata",)


# target -> (convention, container); None: the input's convention (a container change only)
TARGETS: dict[Target, tuple[Convention | None, Container]] = {
    Target.PADDLEFORMERS: (HF, Container.SAFETENSORS),
    Target.PADDLENLP: (PADDLENLP, Container.PDPARAMS),
    Target.SAFETENSORS: (None, Container.SAFETENSORS),
    Target.PDPARAMS: (None, Container.PDPARAMS),
}


@dataclass
class ConvertPlan:
    """What ``convert`` writes: ``tensors`` in order (recipes of the input's tensors), into ``container``,
    with ``config``.

    ``source``/``target``: the conventions (equal for a container change); ``layout``: the input's Linear
    layout when proven from the shapes (None: not checked); ``notes``: said to the user; ``warnings``: what
    the output's loader will get wrong (printed).
    """

    ckpt: Checkpoint
    source: Convention
    target: Convention
    container: Container
    tensors: list[OutTensor]
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    config_changes: list[dict[str, Any]] = field(default_factory=list)
    layout: Layout | None = None
    warnings: list[str] = field(default_factory=list)


def _model_type(ckpt: Checkpoint) -> str:
    """config.json's ``model_type``. Raises CheckpointError when it is not a non-empty string."""
    mt = ckpt.config.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise CheckpointError(
            f"{ckpt.config_file} has no model_type (a string), so tietool cannot tell which tensors are "
            "Linear weights",
            ckpt.path / ckpt.config_file,
            f'add "model_type" (e.g. "llama", "qwen2") as the training run wrote it, or use '
            f"{Opt('to', 'safetensors')} to change only the container",
        )
    return mt


def _lacks(mt: str) -> str | None:
    return arch.paddleformers_lacks(mt)


def conversion_row(ckpt: Checkpoint, to: Target) -> arch.ConversionRow:
    """The :data:`~surgery.arch.CONVERSIONS` row of the checkpoint's ``model_type``.

    Raises:
        RefusedError: PaddleFormers 1.2 has no class for the family (GPT, BERT, T5, ...) or tietool has no
            conversion data for the model type; the message names the container-only alternative.
    """
    mt = _model_type(ckpt)
    row = arch.conversion_row(mt)
    alt = f"to change only the container, keeping names and layouts, use {Opt('to', 'safetensors')}"
    lacks = _lacks(mt)
    if row is None and lacks and to is Target.PADDLEFORMERS:
        raise RefusedError(
            f"PaddleFormers 1.2 has no {lacks} model class (model_type {mt!r}), so no PaddleFormers layout "
            "of it can load",
            ckpt.path,
            f"{alt}, and keep loading it with PaddleNLP",
        )
    if row is None:
        known = ", ".join(sorted(arch.CONVERSIONS))
        raise RefusedError(
            f"tietool has no conversion data for model_type {mt!r} (it knows {known}); it will not guess "
            "which tensors are Linear weights",
            ckpt.path,
            alt,
        )
    if to is Target.PADDLENLP and Naming.PADDLENLP not in row.prefixes:
        raise RefusedError(
            f"tietool knows no PaddleNLP 2.x naming of model_type {mt!r}",
            ckpt.path,
            f"{alt}, or convert with {Opt('to', 'paddleformers')}",
        )
    return row


def _head_steps(plan: ConvertPlan, row: arch.ConversionRow) -> None:
    """The head where the target loader treats it differently from the source's (adds steps and notes):

    * to PaddleNLP without a head in the files (tied): PaddleNLP 2.8 builds a random head of its own
      (``paddlenlp_own_head``, fixtures README L11), so the embedding is written as the head, transposed to
      ``[hidden, vocab]``;
    * from PaddleNLP with a head under ``tie_word_embeddings: true``: PaddleNLP used the file's head, while
      PaddleFormers would ignore it and tie, so the output says ``tie_word_embeddings: false``, unless
      the head is the embedding transposed bit for bit (a tied PaddleFormers checkpoint converted to
      PaddleNLP): then tying gives the same head, and the flag stays true (the round trip is exact).
    """
    ckpt, head = plan.ckpt, row.head
    if not row.paddlenlp_own_head:
        return
    tied = bool(ckpt.config.get("tie_word_embeddings", False))
    if plan.target == PADDLENLP and head in ckpt.tensors and tied:
        _refuse_head_apart(ckpt, head, f"{prefix_of(plan.source, row)}.{row.embedding}")
    if plan.target == PADDLENLP and head not in ckpt.tensors:
        emb = f"{prefix_of(plan.source, row)}.{row.embedding}"
        if emb not in ckpt.tensors:
            return
        t = ckpt.tensors[emb]
        plan.tensors.append(conversion_step(head, emb, label_of(ckpt, emb), swapped(tuple(t.shape)), True))
        plan.notes.append(
            f"{head} is written as {emb} transposed to [hidden, vocab]: the input has no head (tied) and "
            "PaddleNLP 2.8 never ties this model's head, it would build a random one"
        )
    elif plan.source.names == Naming.PADDLENLP and head in ckpt.tensors and tied:
        emb = f"{prefix_of(plan.source, row)}.{row.embedding}"
        if emb in ckpt.tensors and head_is_embedding_t(ckpt, head, emb):
            plan.notes.append(
                f"tie_word_embeddings stays true: {head} is {emb} transposed bit for bit, so the head "
                "PaddleFormers ties to the embedding is the one PaddleNLP 2.8 used"
            )
            return
        plan.config["tie_word_embeddings"] = False
        plan.config_changes.append({"key": "tie_word_embeddings", "before": True, "after": False})
        plan.notes.append(
            "tie_word_embeddings is set false: PaddleNLP 2.8 used this checkpoint's own head whatever the "
            "flag said, and PaddleFormers would ignore that head and tie it to the embedding"
        )


def _refuse_head_apart(ckpt: Checkpoint, head: str, emb: str) -> None:
    """Refuse a conversion to PaddleNLP of a ``[vocab, hidden]`` head (PaddleFormers layout) that differs
    from the embedding under ``tie_word_embeddings: true``: PaddleFormers ties and uses the embedding as the
    head, PaddleNLP 2.8 uses the file's head whatever the flag says (``paddlenlp_own_head``), so the output
    would load with another head than the input does, and which one was meant is unknown. Compared in
    blocks of rows, bit for bit.

    Raises:
        RefusedError: the head differs from the embedding (both named, the two fixes).
    """
    h, e = ckpt.tensors[head], ckpt.tensors.get(emb)
    if e is None or tuple(h.shape) != tuple(e.shape) or len(e.shape) != 2 or h.dtype != e.dtype:
        return
    rows = max(1, ROWS_BYTES // max(1, e.nbytes // max(1, e.shape[0])))
    same = all(
        a.tobytes() == b.tobytes()
        for a, b in zip(ckpt.iter_rows(head, rows), ckpt.iter_rows(emb, rows), strict=True)
    )
    if not same:
        raise RefusedError(
            f"config.json says tie_word_embeddings: true but {head} differs from {emb}: PaddleFormers loads "
            "this checkpoint with the embedding as the head, PaddleNLP 2.8 would use the stored head, so "
            "the output would not be the model the input is",
            ckpt.path,
            f"to keep the embedding as the head (what PaddleFormers loads), run tietool tie "
            f"{Opt('keep', 'embedding')} first; to keep the stored head, set tie_word_embeddings to false "
            "in config.json first",
        )


def _edit_config(plan: ConvertPlan, key: str, row: arch.ConversionRow) -> None:
    """Apply :data:`~surgery.arch.CONFIG_KEYS` ``[key]`` to ``plan.config`` (recording each change).

    Raises:
        RefusedError: a key the row must refuse is set (a rope scaling tietool cannot translate).
    """
    edits, cfg = arch.CONFIG_KEYS[key], plan.config
    for k in edits.refuse_set:
        if cfg.get(k) not in (None, {}, 1.0):
            raise RefusedError(
                f"config.json sets {k}={cfg[k]!r}, which tietool cannot translate for {plan.target.title}",
                plan.ckpt.path,
                f"convert with {Opt('to', 'safetensors')} (names and layouts unchanged)",
            )
    for old, new in edits.rename.items():
        if old in cfg:
            val = cfg.pop(old)
            plan.config_changes.append({"key": old, "before": val, "after": None})
            if new not in cfg:
                cfg[new] = val
                plan.config_changes.append({"key": new, "before": None, "after": val})
    for k in edits.drop:
        if k in cfg:
            plan.config_changes.append({"key": k, "before": cfg.pop(k), "after": None})
    for k in edits.unfuse:
        if cfg.get(k):
            cfg[k] = False
            plan.config_changes.append({"key": k, "before": True, "after": False})
    if key == "paddlenlp":
        _drop_deprecated_class_names(plan)
    if key == "paddlenlp" and not row.paddlenlp_28:
        plan.notes.append(
            f"PaddleNLP 2.8.1 has no {cfg.get('model_type')} model class: the output is for PaddleNLP 3 "
            "(not loaded by tietool's tests); config.json gets no paddlenlp_version, so tietool's next "
            "command takes PaddleNLP 3 as its loader"
        )
        return
    for k, v in edits.set.items():
        if k not in cfg or cfg[k] != v:
            plan.config_changes.append({"key": k, "before": cfg.get(k), "after": v})
            cfg[k] = v


def _drop_deprecated_class_names(plan: ConvertPlan) -> None:
    """``architectures`` of a PaddleNLP output names PaddleNLP's class: PaddleFormers 1.2 saves the classes it
    keeps beside a paddlefleet one as ``<Name>Deprecated`` (``Qwen2ForCausalLMDeprecated``), a name only
    PaddleFormers has, so the suffix is dropped (``Qwen2ForCausalLM``)."""
    names = plan.config.get("architectures")
    if not isinstance(names, list) or not any(isinstance(n, str) and n.endswith("Deprecated") for n in names):
        return
    new = [n.removesuffix("Deprecated") if isinstance(n, str) else n for n in names]
    plan.config_changes.append({"key": "architectures", "before": names, "after": new})
    plan.config["architectures"] = new


def _require_sizes(ckpt: Checkpoint) -> None:
    """A layout change needs ``vocab_size`` and ``hidden_size``: they tell the head's layout from its
    shape, and the target loader builds its tables from them (PaddleFormers' Llama default vocab_size is
    32000). Raises CheckpointError naming the missing keys."""
    missing = [k for k in ("vocab_size", "hidden_size") if not _positive_int(ckpt.config.get(k))]
    if missing:
        emb = next((t for n, t in ckpt.tensors.items() if n.endswith("embed_tokens.weight")), None)
        hint = f" (the embedding is {list(emb.shape)}: [vocab_size, hidden_size])" if emb is not None else ""
        raise CheckpointError(
            f"{ckpt.config_file} has no {' / '.join(missing)} (a positive integer), which a layout change "
            "needs to tell the head's layout and the loader needs to build the model",
            ckpt.path / ckpt.config_file,
            f"add {', '.join(missing)} as the training run wrote it{hint}",
        )


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _generic_proof(ckpt: Checkpoint, what: str) -> Proof:
    """The layout of a checkpoint whose model type has no row: the tensors named as a row's Linear weights
    (:data:`~surgery.arch.ANY_LINEAR`), their shapes against the config (:func:`prove`)."""
    weights = {}
    for name in ckpt.tensors:
        hit = suffix_in(name, arch.ANY_LINEAR)
        if hit is not None:
            weights[name] = arch.ANY_LINEAR[hit]
    return prove(ckpt, weights, what, strict=False)


def _reshard_plan(ckpt: Checkpoint, container: Container, fix: str | None = None) -> ConvertPlan:
    """``--to paddleformers`` of a model type without a row: only when its Linear weights are proven
    ``[out, in]`` by their shapes, and no name carries a PaddleNLP-era prefix, are the shards rewritten as
    they are (the input is then already in the PaddleFormers layout, Gemma3, Phi3, ...).

    Raises:
        RefusedError: PaddleNLP names, a Paddle layout, or no Linear weight whose shape proves the layout.
    """
    mt = ckpt.config.get("model_type")
    pre = tuple(p + "." for p in arch.PADDLENLP_PREFIXES)
    named = next((n for n in ckpt.tensors if n.startswith(pre)), None)
    fix = fix or hint_container_only()
    proof = _generic_proof(ckpt, fix) if named is None else None
    if proof is None or proof.layout is not Layout.OUT_IN:
        why = (
            f"its names ({named}) are not PaddleFormers names"
            if named
            else "its Linear weights are [in, out] (the Paddle layout)"
            if proof and proof.layout
            else "no tensor named as a Linear weight tietool knows tells its layout"
        )
        raise RefusedError(
            f"tietool has no conversion data for model_type {mt!r} and {why}, so it cannot write the "
            "PaddleFormers layout",
            ckpt.path,
            fix,
        )
    plan = ConvertPlan(ckpt, HF, HF, container, copy_steps(ckpt), dict(ckpt.config), layout=proof.layout)
    plan.notes += [
        "the input is already in the PaddleFormers/HF layout: only the shards are rewritten",
        proof.note(),
    ]
    return plan


def _container_plan(ckpt: Checkpoint, container: Container) -> ConvertPlan:
    """A container change: every tensor copied as stored, config untouched. The report says which layout
    the tensors are in where the shapes prove it (the model type has a row), else that it was not checked;
    the output's ``__metadata__`` follows from it (:func:`st_metadata`)."""
    plan = ConvertPlan(ckpt, KEPT, KEPT, container, copy_steps(ckpt), dict(ckpt.config))
    if container is Container.SAFETENSORS and _paddlenlp_files(ckpt):
        _bf16_as_u16(plan)
    mt = ckpt.config.get("model_type")
    row = arch.conversion_row(mt)
    try:
        if row is None:
            raise RefusedError(f"tietool has no conversion data for model_type {mt!r}", ckpt.path)
        src, proof = source_convention(ckpt, row)
        plan.layout = proof.layout
        plan.notes.append(f"the input is {src.title}: {proof.note()}")
    except (RefusedError, CheckpointError) as e:
        plan.notes.append(f"layout not proven ({e.message}): names and layouts are copied as stored")
    _pf_container(plan)
    return plan


def _bf16_as_u16(plan: ConvertPlan) -> None:
    """bf16 tensors of a PaddleNLP checkpoint labelled ``U16`` in safetensors, as PaddleNLP 2.8.1's
    ``save_pretrained(safe_serialization=True)`` writes them (it reads through numpy, which has no bf16: a
    ``BF16`` label fails its load with "Cannot interpret '2' as a data type"); the bytes are the same."""
    n = sum(s.dtype == "BF16" for s in plan.tensors)
    if n:
        plan.tensors = [dataclasses.replace(s, dtype="U16") if s.dtype == "BF16" else s for s in plan.tensors]
        plan.notes.append(f"{n} bf16 tensor(s) labelled U16, as PaddleNLP 2.8.1 writes and reads them")


def _pf_container(plan: ConvertPlan) -> None:
    """What PaddleFormers 1.2 needs of a container change of its checkpoint (measured in
    ``tests/oracles/test_convert.py::test_paddleformers_container_changes_load_as_said``): its Paddle layout
    loads only with :data:`LEGACY_LOAD` (a plain ``from_pretrained`` of such safetensors loads without a
    warning and gives wrong logits), so the output says so; it reads a ``.pdparams`` only in that layout, so a
    ``.pdparams`` of its HF layout is refused (no ``from_pretrained`` loads it).

    Raises:
        RefusedError: ``--to pdparams`` of a PaddleFormers checkpoint not proven in the Paddle layout.
    """
    ck = plan.ckpt
    if "paddleformers_version" not in ck.config:
        return
    if _pf_legacy(ck, plan.layout):
        plan.notes.append(
            f"PaddleFormers 1.2 loads this (its legacy Paddle layout) only with {LEGACY_LOAD}"
            + ("" if plan.container is Container.PDPARAMS else ": a plain from_pretrained gives wrong logits")
        )
    elif plan.container is Container.PDPARAMS:
        hf = plan.layout is Layout.OUT_IN
        how = "its Linear weights are [out, in]" if hf else "its layout is not proven [in, out]"
        keep = (
            "keep it as safetensors (PaddleFormers loads its HF layout with a plain from_pretrained)"
            if hf
            else "keep it as safetensors (its layout is not proven: load it as the library that wrote it "
            "says)"
        )
        raise RefusedError(
            f"PaddleFormers 1.2 reads a .pdparams only in its legacy Paddle layout ({LEGACY_LOAD}, Linear "
            f"weights [in, out]), and {how}: no from_pretrained would load the output",
            ck.path,
            f"{keep}, or use {Opt('to', 'paddlenlp')} for PaddleNLP's .pdparams",
        )


def pf_legacy_layout(ckpt: Checkpoint) -> bool:
    """Whether PaddleFormers 1.2 loads ``ckpt`` only with :data:`LEGACY_LOAD` (a plain ``from_pretrained``
    of its safetensors loads without a warning and gives wrong logits, measured in
    ``tests/oracles/test_convert.py::test_paddleformers_container_changes_load_as_said``): a PaddleFormers
    checkpoint in its legacy Paddle layout, told as :func:`_container_plan` tells it (config ``source:
    paddle``, or Linear weights proven ``[in, out]`` by their shapes for a model type of :data:`~surgery.arch.
    CONVERSIONS`). Reads headers only; a layout not proven counts as not legacy. Raises nothing."""
    mt = ckpt.config.get("model_type")
    row = arch.conversion_row(mt)
    layout = None
    if row is not None:
        try:
            layout = source_convention(ckpt, row)[1].layout
        except (RefusedError, CheckpointError):
            layout = None
    return _pf_legacy(ckpt, layout)


def _pf_legacy(ckpt: Checkpoint, layout: Layout | None) -> bool:
    """A PaddleFormers checkpoint (``paddleformers_version``) in the Paddle layout (``source: paddle`` or
    Linear weights proven ``[in, out]``): PaddleFormers' legacy format."""
    cfg = ckpt.config
    return "paddleformers_version" in cfg and (cfg.get("source") == "paddle" or layout is Layout.IN_OUT)


def plan_convert(ckpt: Checkpoint, to: Target, fix: str | None = None) -> ConvertPlan:
    """Which output tensor comes from which input tensor, by which transform (pure: reads headers only).

    ``to`` ``paddleformers``/``paddlenlp``: the input's convention found (:func:`source_convention`: names,
    Linear layout proven from the shapes, head layout), names renamed (``llama.``/``ernie.`` ↔ ``model.``),
    every Linear weight transposed where the layouts differ, the head ``[hidden, vocab]`` ↔
    ``[vocab, hidden]``, fused ``qkv_proj`` / ``gate_up_fused_proj`` / ``up_gate_proj`` split (PaddleNLP and
    PaddleFormers grouped per kv head, ERNIEKit ``q | k | v``), embeddings/norms/biases copied; config keys
    as :data:`~surgery.arch.CONFIG_KEYS` (the target's version key). ``safetensors``/``pdparams``:
    the container only (:func:`_container_plan`). An input already in the target's convention is a
    container change. ``fix`` is the fix a refused layout names, one the calling command has (default:
    convert's ``--to safetensors``; merge passes its own).

    Raises:
        RefusedError: an unknown model type, unplaceable tensors (:func:`model_steps`), a layout not proven
            (:func:`surgery.inspect.linear_layout.prove`), a family PaddleFormers 1.2 lacks
            (:func:`conversion_row`).
        CheckpointError: shapes that contradict the config or each other.
    """
    conv, container = TARGETS[to]
    if conv is None:
        return _container_plan(ckpt, container)
    mt = _model_type(ckpt)
    if to is Target.PADDLEFORMERS and mt not in arch.CONVERSIONS and not _lacks(mt):
        return _reshard_plan(ckpt, container, fix)
    row = conversion_row(ckpt, to)
    _require_sizes(ckpt)
    source, proof = source_convention(ckpt, row, fix)
    plan = ConvertPlan(ckpt, source, conv, container, [], dict(ckpt.config), layout=proof.layout)
    plan.notes.append(proof.note())
    if source == conv:
        plan.tensors = copy_steps(ckpt)
        plan.notes.insert(
            0, f"the input is already in the {conv.title} layout: only the shards are rewritten"
        )
        return plan
    if to is Target.PADDLENLP:
        _refuse_lacking(ckpt, row, source)
    plan.tensors = model_steps(ckpt, row, source, conv, fix)
    _edit_config(plan, to.value, row)
    _head_steps(plan, row)
    return plan


def _refuse_lacking(ckpt: Checkpoint, row: arch.ConversionRow, src: Convention) -> None:
    """Refuse a conversion to PaddleNLP of tensors its class has no parameter for
    (:attr:`~surgery.arch.ConversionRow.paddlenlp_lacks`: PaddleNLP 2.8.1's Llama has no Linear biases)
    holding values other than zero: PaddleNLP would load the output without them ("were not used", a log
    line) and give other logits. All-zero ones add nothing to the logits and are written as they are.
    Reads those tensors' values (biases: small).

    Raises:
        RefusedError: such tensors with a value other than zero (named, up to four).
    """
    pre = prefix_of(src, row) + "."
    lacking = [
        n
        for n in ckpt.tensors
        if n.startswith(pre) and suffix_in(n[len(pre) :], row.paddlenlp_lacks) is not None
    ]
    nonzero = [n for n in lacking if np.any(ckpt.load(n))]
    if nonzero:
        more = f" and {len(nonzero) - 4} more" if len(nonzero) > 4 else ""
        raise RefusedError(
            f"PaddleNLP's {ckpt.config.get('model_type')} class has no parameter for {', '.join(nonzero[:4])}"
            f"{more} (Linear biases; PaddleNLP 2.8.1 builds them with bias_attr=False): it would load the "
            "output without them, with a log line only, and give other logits",
            ckpt.path,
            f"keep the checkpoint for PaddleFormers ({Opt('to', 'paddleformers')} or "
            f"{Opt('to', 'safetensors')}), which reads the biases",
        )


def _paddlenlp_files(ck: Checkpoint) -> bool:
    """PaddleNLP's checkpoint: a ``paddlenlp_version`` key or PaddleNLP-era name prefixes (``llama.``; not
    the model type's ERNIEKit ``ernie.``, which is no PaddleNLP naming of ERNIE 4.5)."""
    mt = ck.config.get("model_type")
    row = arch.conversion_row(mt)
    kit = row.prefixes.get(Naming.KIT) if row else None
    pre = tuple(p + "." for p in arch.PADDLENLP_PREFIXES if p != kit)
    return "paddlenlp_version" in ck.config or any(n.startswith(pre) for n in ck.tensors)


def st_metadata(plan: ConvertPlan) -> dict[str, str]:
    """Each output safetensors file's ``__metadata__``: what the output's loader reads and its layout is.

    ``{"format": "pt"}`` for the PaddleFormers/HF layout (PaddleFormers' ``save_to_hf`` export and ERNIE's
    paddle2torch write it); ``{"format": "np"}`` for the Paddle layout (PaddleNLP 2.8.1's
    ``load_state_dict`` refuses any other format, and a file without metadata; PaddleFormers'
    ``save_to_hf=False`` writes it). A container change: from the layout the shapes proved; PaddleNLP
    names or version key: ``np``; unproven: the input's own metadata when all its files agree, none when its
    safetensors have none (``np`` would claim the Paddle layout, and HF transformers refuses a file labelled
    ``np``), else ``np`` (a ``.pdparams`` was written by Paddle code)."""
    ck = plan.ckpt
    if plan.target == HF:
        return {"format": "pt"}
    if plan.target != KEPT:
        return {"format": "np"}
    if _paddlenlp_files(ck):
        return {"format": "np"}
    if plan.layout is not None:
        return {"format": "np" if plan.layout is Layout.IN_OUT else "pt"}
    metas = {str(m) for m in ck.st_metadata.values()}
    first = next(iter(ck.st_metadata.values()), None) if ck.fmt.has_metadata else None
    if len(metas) == 1 and first:
        return dict(first)
    if ck.fmt.has_metadata and not any(ck.st_metadata.values()):
        return {}  # none in the input (PaddleFormers' own HF-layout save): a copy as stored has none either
    return {"format": "np"}


def pdparams_extras(plan: ConvertPlan) -> dict[str, Any] | None:
    """The input's non-tensor ``.pdparams`` entries (``StructuredToParameterName@@`` of every file) when
    names are unchanged; a renamed checkpoint gets none (PaddleNLP's loader does not need it)."""
    if plan.ckpt.format is not Container.PDPARAMS or plan.source != plan.target:
        return None
    merged: dict[str, Any] = {}
    for ex in plan.ckpt.extras.values():
        for k, v in ex.items():
            if isinstance(v, dict) and isinstance(merged.get(k), dict):
                merged[k] = {**merged[k], **v}
            else:
                merged.setdefault(k, v)
    return merged or None


def carry(ckpt: Checkpoint) -> list[tuple[Path, str]]:
    """Files carried unchanged: everything but weights, index, config, report and training state."""
    skip = {ckpt.config_file, *NOT_CARRIED}
    return [
        (ckpt.path / rel, rel) for rel in ckpt.other_files if rel not in skip and Path(rel).name not in skip
    ]


def check_dtypes(plan: ConvertPlan) -> ConvertPlan:
    """Refuse, by name, a tensor whose dtype the output cannot carry: a ``.pdparams`` holds numpy dtypes
    only (no float8, float4, float6 or complex: ``DType.np_name`` is None; relabelling their bytes as
    ``uint8`` would make paddle load integers), and a packed sub-byte tensor (``F4``, ``F6_*``) cannot be
    transposed or split (its elements are not whole bytes). Every other tensor moves as bytes, any dtype.

    Returns:
        ``plan``, unchanged. Raises RefusedError naming the tensor and its dtype.
    """
    ck = plan.ckpt
    for s in plan.tensors:
        t = ck.tensors[source_of(s)]
        if plan.container is Container.PDPARAMS and DTYPES[s.dtype].np_name is None:
            raise RefusedError(
                f"convert refused: {t.name} is stored as {describe_dtype(s.dtype)}, which a .pdparams cannot "
                "hold (numpy has no float8/float4/float6: paddle.save itself writes float8 as int8, which "
                "paddle.load returns as int8; complex arrays are outside the .pdparams reader's allow-list)",
                ck.path,
                f"keep the safetensors container ({Opt('to', 'safetensors')} or "
                f"{Opt('to', 'paddleformers')})",
            )
        if reshaped(s) and DTYPES[s.dtype].packed:
            raise dtype_refusal(t, ck.path, "transpose or split it", op="convert")
    return plan


def note_left_out(plan: ConvertPlan) -> None:
    """Say which files of the input the output does not hold: training state (optimizer, master weights:
    their layout is the input's) and files the input's index does not list (:attr:`Checkpoint.left_out`)."""
    ck = plan.ckpt
    if ck.training_state:
        plan.notes.append(
            f"training state left out ({', '.join(ck.training_state[:3])}"
            f"{', ...' if len(ck.training_state) > 3 else ''}): its tensors keep the input's names and layout"
        )
    if ck.left_out:
        plan.notes.append(
            f"files that are not part of the checkpoint left out: {', '.join(x.file for x in ck.left_out)}"
        )


def output_plan(plan: ConvertPlan, max_shard_size: int) -> Plan:
    """The :class:`~surgery.plan.plan.Plan` the conversion ``plan`` writes: its tensors in shards of
    ``plan.container`` of at most ``max_shard_size`` bytes, its config, the carried files (:func:`carry`)
    and the container's non-tensor entries (:func:`st_metadata`, :func:`pdparams_extras`)."""
    safetensors = plan.container is Container.SAFETENSORS
    layout = Reshard(
        plan.container,
        max_shard_size,
        plan.tensors,
        plan.config,
        carry=carry(plan.ckpt),
        st_metadata=st_metadata(plan) if safetensors else None,
        pdparams_extras=pdparams_extras(plan),
    )
    return reshard_plan(Operation.CONVERT, plan.ckpt, layout, plan)


def warn_legacy_layout(plan: Plan) -> Plan:
    """Add to ``plan.warnings`` (printed on the terminal) the call PaddleFormers 1.2 needs to load the output
    when the checkpoint is PaddleFormers safetensors in its legacy Paddle layout
    (:func:`pf_legacy_layout`; ``merge --keep-paddle-layout`` writes them): a plain
    ``from_pretrained`` of such a folder loads without a warning and computes other logits (measured:
    ``tests/oracles/test_convert.py::test_paddleformers_container_changes_load_as_said``)."""
    ck = plan.ckpt
    if ck.format is Container.SAFETENSORS and pf_legacy_layout(ck):
        plan.warnings.append(
            "the checkpoint is PaddleFormers safetensors in its legacy Paddle layout (Linear weights "
            f"[in, out]) and so is the output: PaddleFormers 1.2 loads it only with {LEGACY_LOAD}; a plain "
            "from_pretrained loads it without an error but computes other logits"
        )
    return plan
