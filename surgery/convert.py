"""``tietool convert``: move a checkpoint between the on-disk conventions of PaddleNLP 2.x and PaddleFormers.

Three conventions (fixtures ``pnlp_llama_untied``, ``pf_llama_untied_legacy_pdparams``,
``pf_llama_untied_fp32``):

* PaddleNLP 2.x: ``llama.``/``qwen2.`` names, every ``nn.Linear`` weight ``[in, out]``, the head
  ``[hidden, vocab]``; ``model_state.pdparams`` (bf16 as numpy ``uint16``).
* PaddleFormers legacy ``.pdparams`` (``save_checkpoint_format="legacy"``, config ``source: paddle``): HF
  names (``model.``), Linear weights ``[in, out]``, the head ``[vocab, hidden]``.
* PaddleFormers / HF safetensors: HF names, Linear weights ``[out, in]``, the head ``[vocab, hidden]``.

Which tensors are Linear weights, the name prefixes and the fused projections are data
(:data:`surgery.architectures.CONVERSIONS`). Planning here is pure: :func:`plan_convert` says which output
tensor comes from which input tensor by which transform; :func:`convert` streams it through
:func:`surgery.assemble.assemble` (one tensor in memory at a time, untransposed tensors copied by byte
range, bf16 moved as raw ``uint16`` bits, never converted). No paddle import.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

import numpy as np

from . import architectures as arch
from .assemble import DEFAULT_MAX_SHARD_SIZE, Container, OutTensor, assemble, parse_size
from .checkpoint import Checkpoint
from .errors import CheckpointError, Opt, RefusedError, UsageError
from .formats.safetensors_io import Source
from .formats.tensor import DTYPES, describe_dtype, dtype_refusal
from .options import Target
from .results import Report
from .store import local_only
from .summary import check_index
from .write import check_output_path

# files an output never carries: PaddleFormers' loader writes this one into the folder it loads, and it
# describes the input's files, not the output's
NOT_CARRIED = ("flex-ckpt.auto_generated.metadata",)

# safetensors label of each logical dtype ("bfloat16" -> "BF16")
_LABEL = {d.logical: d.st for d in DTYPES.values()}


@dataclass(frozen=True)
class Convention:
    """One on-disk convention.

    Attributes:
        title: how messages name it.
        names: ``"paddlenlp"`` (``llama.`` prefix) or ``"hf"`` (``model.`` prefix).
        linear: ``"in-out"`` (Paddle ``nn.Linear``) or ``"out-in"`` (HF).
        head: ``"hidden-vocab"`` or ``"vocab-hidden"``.
    """

    title: str
    names: str
    linear: str
    head: str


PADDLENLP = Convention("PaddleNLP 2.x", "paddlenlp", "in-out", "hidden-vocab")
PF_LEGACY = Convention("PaddleFormers legacy .pdparams", "hf", "in-out", "vocab-hidden")
HF = Convention("PaddleFormers/HF safetensors", "hf", "out-in", "vocab-hidden")
# a container change: names and layouts as the input has them, whatever they are
KEPT = Convention("the input's names and layouts", "kept", "kept", "kept")

# target -> (convention, container); None: the input's convention (a container change only)
TARGETS: dict[Target, tuple[Convention | None, Container]] = {
    Target.PADDLEFORMERS: (HF, Container.SAFETENSORS),
    Target.PADDLENLP: (PADDLENLP, Container.PDPARAMS),
    Target.SAFETENSORS: (None, Container.SAFETENSORS),
    Target.PDPARAMS: (None, Container.PDPARAMS),
}


@dataclass(frozen=True)
class Part:
    """The chunks of a fused projection's output axis that make one unfused tensor.

    Attributes:
        axis: the output axis in the input (-1 for ``[in, out]``, 0 for ``[out, in]``).
        count: how many equal chunks the axis holds (``heads + 2 * kv_heads``, or 2 for ``[gate, up]``).
        chunks: which chunks, in order.
    """

    axis: int
    count: int
    chunks: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """One output tensor: ``out`` (its name, ``dtype`` label, ``shape``) made from input tensor ``src``.

    ``transpose``: swap the two axes (a Linear weight or head changing layout); ``part``: take these chunks
    of a fused projection first. Neither: the stored bytes are copied by byte range.
    """

    out: str
    src: str
    dtype: str
    shape: tuple[int, ...]
    transpose: bool = False
    part: Part | None = None


@dataclass
class ConvertPlan:
    """What :func:`convert` writes: ``steps`` in order, into ``container``, with ``config``.

    ``source``/``target``: the conventions (equal for a container change); ``notes``: said to the user.
    """

    ckpt: Checkpoint
    source: Convention
    target: Convention
    container: Container
    steps: list[Step]
    config: dict
    notes: list[str] = field(default_factory=list)
    config_changes: list[dict] = field(default_factory=list)


def _label(ckpt: Checkpoint, name: str) -> str:
    """The safetensors label of the logical dtype of input tensor ``name`` (bf16 stored as U16 → BF16)."""
    return _LABEL[ckpt.logical_dtype(ckpt.tensors[name])]


def _copy_steps(ckpt: Checkpoint) -> list[Step]:
    return [Step(n, n, _label(ckpt, n), tuple(t.shape)) for n, t in ckpt.tensors.items()]


def _family_name(model_type: str | None) -> str:
    return next((r["family"] for r in arch.FAMILIES if model_type in r["model_types"]), "unknown")


def conversion_row(ckpt: Checkpoint, to: Target) -> arch.ConversionRow:
    """The :data:`~surgery.architectures.CONVERSIONS` row of the checkpoint's ``model_type``.

    Raises:
        RefusedError: PaddleFormers 1.2 has no class for the family (GPT, BERT, T5, ...) or tietool has no
            conversion data for the model type; the message names the container-only alternative.
    """
    mt = ckpt.config.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise CheckpointError(
            f"{ckpt.config_file} has no model_type (a string), so tietool cannot tell which tensors are "
            "Linear weights",
            ckpt.path / ckpt.config_file,
            f'add "model_type" (e.g. "llama", "qwen2") as the training run wrote it, or use '
            f"{Opt('to', 'safetensors')} to change only the container",
        )
    row = arch.CONVERSIONS.get(mt)
    alt = f"to change only the container, keeping names and layouts, use {Opt('to', 'safetensors')}"
    name = mt if isinstance(mt, str) else None
    lacks = arch.PADDLEFORMERS_LACKS.get(name or "") or arch.PADDLEFORMERS_LACKS.get(_family_name(name))
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
    if to is Target.PADDLENLP and row["paddlenlp_prefix"] is None:
        raise RefusedError(
            f"tietool knows no PaddleNLP 2.x naming of model_type {mt!r}",
            ckpt.path,
            f"{alt}, or convert with {Opt('to', 'paddleformers')}",
        )
    return row


def convention_of(ckpt: Checkpoint, row: arch.ConversionRow) -> Convention:
    """The input's convention: PaddleNLP when its names carry the PaddleNLP prefix, else PaddleFormers'
    Paddle layout for a ``.pdparams`` or a config saying ``source: paddle`` (PaddleFormers'
    ``save_pretrained(save_to_hf=False)``), else HF."""
    pre = row["paddlenlp_prefix"]
    if pre is not None and any(n.startswith(pre + ".") for n in ckpt.tensors):
        return PADDLENLP
    if ckpt.format == "pdparams" or ckpt.config.get("source") == "paddle":
        return PF_LEGACY
    return HF


def _prefix(conv: Convention, row: arch.ConversionRow) -> str:
    return str(row["paddlenlp_prefix"] if conv.names == "paddlenlp" else row["hf_prefix"])


def _suffix_in(body: str, suffixes) -> str | None:
    return next((s for s in suffixes if arch.matches(body, s)), None)


def _swap(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[1], shape[0])


def _refuse_layout(ckpt: Checkpoint, name: str, shape, want, conv: Convention) -> CheckpointError:
    return CheckpointError(
        f"tensor {name} is {list(shape)}, but a {conv.title} checkpoint of this config stores it as "
        f"{list(want)}: its layout is not the one its names and container say",
        ckpt.path,
        f"check config.json (hidden_size, vocab_size, source) or convert with {Opt('to', 'safetensors')}, "
        "which keeps names and layouts",
    )


def _check_head(ckpt: Checkpoint, name: str, conv: Convention) -> None:
    """The head's shape agrees with ``conv`` (``[hidden, vocab]`` or ``[vocab, hidden]``) where the config
    tells the two apart. Raises CheckpointError otherwise."""
    shape = tuple(ckpt.tensors[name].shape)
    v, h = ckpt.config.get("vocab_size"), ckpt.config.get("hidden_size")
    if len(shape) != 2 or not isinstance(v, int) or not isinstance(h, int) or v == h:
        if len(shape) != 2:
            raise _refuse_layout(ckpt, name, shape, ("vocab", "hidden"), conv)
        return
    want = (h, v) if conv.head == "hidden-vocab" else (v, h)
    if shape != want:
        raise _refuse_layout(ckpt, name, shape, want, conv)


def _check_linear(ckpt: Checkpoint, name: str, body: str, row: arch.ConversionRow, conv: Convention) -> None:
    """A Linear weight is 2-D, and one whose in_features is hidden_size (``row["in_hidden"]``) has it on
    the axis ``conv`` says. Raises CheckpointError otherwise."""
    shape = tuple(ckpt.tensors[name].shape)
    h = ckpt.config.get("hidden_size")
    if len(shape) != 2:
        raise _refuse_layout(
            ckpt, name, shape, ("in", "out") if conv.linear == "in-out" else ("out", "in"), conv
        )
    if _suffix_in(body, row["in_hidden"]) and isinstance(h, int) and h in shape:
        axis = 0 if conv.linear == "in-out" else 1
        if shape[axis] != h:
            raise _refuse_layout(ckpt, name, shape, _swap(shape), conv)


def _fused_parts(ckpt: Checkpoint, name: str, spec: arch.FusedSpec, axis: int) -> list[Part]:
    """How the fused tensor ``name`` splits along ``axis`` (see :class:`~surgery.architectures.FusedSpec`).

    Raises:
        CheckpointError: the config lacks the head counts, or the axis does not divide into them.
    """
    size = ckpt.tensors[name].shape[axis]
    groups: list[tuple[int, ...]]
    if spec["split"] == "halves":
        count, groups = 2, [(0,), (1,)]
    else:
        nh = ckpt.config.get("num_attention_heads")
        kv = ckpt.config.get("num_key_value_heads") or nh
        if not isinstance(nh, int) or not isinstance(kv, int) or kv < 1 or nh % kv:
            raise CheckpointError(
                f"cannot split {name}: config.json has no usable num_attention_heads / num_key_value_heads",
                ckpt.path,
                "restore the config's head counts",
            )
        g, count = nh // kv, nh + 2 * kv
        groups = [
            tuple(i * (g + 2) + j for i in range(kv) for j in range(g)),
            tuple(i * (g + 2) + g for i in range(kv)),
            tuple(i * (g + 2) + g + 1 for i in range(kv)),
        ]
    if size % count:
        raise CheckpointError(
            f"cannot split {name}: its output axis ({size}) is not {count} equal chunks as the config's head "
            "counts say",
            ckpt.path,
            "check num_attention_heads / num_key_value_heads in config.json",
        )
    return [Part(axis, count, c) for c in groups]


def _unfuse(
    ckpt: Checkpoint,
    name: str,
    out_body: str,
    fused: str,
    spec: arch.FusedSpec,
    src: Convention,
    dst: Convention,
) -> list[Step]:
    """The unfused steps of PaddleNLP fused projection ``name`` (``out_body`` its output name, ending in
    ``fused``): q, k, v (or gate, up), each transposed when the Linear layout changes."""
    shape = tuple(ckpt.tensors[name].shape)
    weight = len(shape) == 2
    axis = len(shape) - 1 if src.linear == "in-out" else 0
    turn = weight and src.linear != dst.linear
    steps = []
    for suffix, part in zip(spec["parts"], _fused_parts(ckpt, name, spec, axis), strict=True):
        s = list(shape)
        s[axis] = shape[axis] // part.count * len(part.chunks)
        out_shape = _swap(tuple(s)) if turn else tuple(s)
        out = out_body[: -len(fused)] + suffix
        steps.append(Step(out, name, _label(ckpt, name), out_shape, turn, part))
    return steps


def _body_step(
    ckpt: Checkpoint, name: str, row: arch.ConversionRow, src: Convention, dst: Convention
) -> list[Step] | None:
    """The steps of one tensor under the model prefix (None: tietool cannot place it)."""
    pre = _prefix(src, row) + "."
    if not name.startswith(pre):
        return None
    body = name[len(pre) :]
    out = f"{_prefix(dst, row)}.{body}"
    shape, label = tuple(ckpt.tensors[name].shape), _label(ckpt, name)
    if _suffix_in(body, row["linear"]):
        _check_linear(ckpt, name, body, row, src)
        turn = src.linear != dst.linear
        return [Step(out, name, label, _swap(shape) if turn else shape, turn)]
    if _suffix_in(body, row["plain"]):
        return [Step(out, name, label, shape)]
    fused = _suffix_in(body, row["fused"]) if src.names == "paddlenlp" else None
    if fused is not None:
        return _unfuse(ckpt, name, out, fused, row["fused"][fused], src, dst)
    return None


def model_steps(ckpt: Checkpoint, row: arch.ConversionRow, src: Convention, dst: Convention) -> list[Step]:
    """Every output tensor of a conversion from ``src`` to ``dst``, in the input's tensor order.

    Raises:
        RefusedError: tensors the row cannot place (named, up to five), never guessed.
        CheckpointError: a head or Linear weight whose shape contradicts ``src`` (see :func:`_check_head`).
    """
    steps: list[Step] = []
    unplaced: list[str] = []
    for name, t in ckpt.tensors.items():
        if name == row["head"]:
            _check_head(ckpt, name, src)
            turn = src.head != dst.head
            steps.append(
                Step(name, name, _label(ckpt, name), _swap(tuple(t.shape)) if turn else tuple(t.shape), turn)
            )
            continue
        got = _body_step(ckpt, name, row, src, dst)
        if got is None:
            unplaced.append(name)
        else:
            steps += got
    if unplaced:
        more = f" and {len(unplaced) - 5} more" if len(unplaced) > 5 else ""
        raise RefusedError(
            f"tietool cannot place {len(unplaced)} tensor(s) of this {ckpt.config.get('model_type')} "
            f"checkpoint in the {dst.title} layout: {', '.join(unplaced[:5])}{more}; it will not guess "
            "whether they are Linear weights",
            ckpt.path,
            f"convert with {Opt('to', 'safetensors')} (names and layouts unchanged), or add their suffixes "
            "to CONVERSIONS in surgery/architectures.py",
        )
    return steps


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
    ckpt, head = plan.ckpt, row["head"]
    if not row["paddlenlp_own_head"]:
        return
    tied = bool(ckpt.config.get("tie_word_embeddings", False))
    if plan.target is PADDLENLP and head not in ckpt.tensors:
        emb = f"{_prefix(plan.source, row)}.embed_tokens.weight"
        if emb not in ckpt.tensors:
            return
        t = ckpt.tensors[emb]
        plan.steps.append(Step(head, emb, _label(ckpt, emb), _swap(tuple(t.shape)), True))
        plan.notes.append(
            f"{head} is written as {emb} transposed to [hidden, vocab]: the input has no head (tied) and "
            "PaddleNLP 2.8 never ties this model's head, it would build a random one"
        )
    elif plan.source is PADDLENLP and head in ckpt.tensors and tied:
        emb = f"{_prefix(plan.source, row)}.embed_tokens.weight"
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


def head_is_embedding_t(ckpt: Checkpoint, head: str, emb: str) -> bool:
    """Whether ``[hidden, vocab]`` head ``head`` holds the bits of ``[vocab, hidden]`` embedding ``emb``
    transposed (same dtype), compared in blocks of embedding rows against the head loaded once."""
    h, e = ckpt.tensors[head], ckpt.tensors[emb]
    if len(e.shape) != 2 or tuple(h.shape) != _swap(tuple(e.shape)) or h.dtype != e.dtype:
        return False
    if ckpt.logical_dtype(h) != ckpt.logical_dtype(e):
        return False
    cols, i = ckpt.load(head), 0
    for block in ckpt.iter_rows(emb, max(1, ROWS_BYTES // max(1, e.nbytes // max(1, e.shape[0])))):
        n = block.shape[0]
        if transpose_2d(block).tobytes() != np.ascontiguousarray(cols[:, i : i + n]).tobytes():
            return False
        i += n
    return True


def _edit_config(plan: ConvertPlan, key: str) -> None:
    """Apply :data:`~surgery.architectures.CONFIG_KEYS` ``[key]`` to ``plan.config`` (recording each change).

    Raises:
        RefusedError: a key the row must refuse is set (a rope scaling tietool cannot translate).
    """
    edits, cfg = arch.CONFIG_KEYS[key], plan.config
    for k in edits["refuse_set"]:
        if cfg.get(k) not in (None, {}, 1.0):
            raise RefusedError(
                f"config.json sets {k}={cfg[k]!r}, which tietool cannot translate for {plan.target.title}",
                plan.ckpt.path,
                f"convert with {Opt('to', 'safetensors')} (names and layouts unchanged)",
            )
    for old, new in edits["rename"].items():
        if old in cfg:
            val = cfg.pop(old)
            plan.config_changes.append({"key": old, "before": val, "after": None})
            if new not in cfg:
                cfg[new] = val
                plan.config_changes.append({"key": new, "before": None, "after": val})
    for k in edits["drop"]:
        if k in cfg:
            plan.config_changes.append({"key": k, "before": cfg.pop(k), "after": None})
    for k in edits["unfuse"]:
        if cfg.get(k):
            cfg[k] = False
            plan.config_changes.append({"key": k, "before": True, "after": False})


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


def _already_hf(ckpt: Checkpoint) -> bool:
    """Safetensors in the HF layout (no ``source: paddle``) whose names carry no PaddleNLP prefix: a
    PaddleFormers / HF checkpoint of any model type (Gemma3, Phi3, ...), nothing to rename or transpose."""
    pre = tuple(p + "." for p in arch.PADDLENLP_PREFIXES)
    return (
        ckpt.format == "safetensors"
        and ckpt.config.get("source") != "paddle"
        and not any(n.startswith(pre) for n in ckpt.tensors)
    )


def plan_convert(ckpt: Checkpoint, to: Target) -> ConvertPlan:
    """Which output tensor comes from which input tensor, by which transform (pure: reads headers only).

    ``to`` ``paddleformers``/``paddlenlp``: names renamed (``llama.`` ↔ ``model.``), every Linear weight
    transposed, the head ``[hidden, vocab]`` ↔ ``[vocab, hidden]``, PaddleNLP fused ``qkv_proj`` /
    ``gate_up_fused_proj`` split (as PaddleFormers' ``split_param_func``), embeddings/norms/biases copied;
    config keys as :data:`~surgery.architectures.CONFIG_KEYS`. ``safetensors``/``pdparams``: the container
    only; names, layouts, dtypes and config untouched. An input already in the target's convention is a
    container change.

    Raises:
        RefusedError: an unknown model type or unplaceable tensors (:func:`model_steps`), a family
            PaddleFormers 1.2 lacks (:func:`conversion_row`).
        CheckpointError: a layout that contradicts the input's names and container.
    """
    conv, container = TARGETS[to]
    if conv is None:
        return ConvertPlan(ckpt, KEPT, KEPT, container, _copy_steps(ckpt), dict(ckpt.config))
    if conv is HF and _already_hf(ckpt):
        plan = ConvertPlan(ckpt, HF, HF, container, _copy_steps(ckpt), dict(ckpt.config))
        plan.notes.append(
            "the input is already in the PaddleFormers/HF layout: only the shards are rewritten"
        )
        return plan
    row = conversion_row(ckpt, to)
    source = convention_of(ckpt, row)
    plan = ConvertPlan(ckpt, source, conv, container, [], dict(ckpt.config))
    if source is conv:
        plan.steps = _copy_steps(ckpt)
        return plan
    _require_sizes(ckpt)
    plan.steps = model_steps(ckpt, row, source, conv)
    _edit_config(plan, to.value)
    _head_steps(plan, row)
    return plan


def _take(a: np.ndarray, part: Part) -> np.ndarray:
    """The chunks ``part.chunks`` of ``a``'s axis ``part.axis`` (raw storage dtype: bits move, no cast)."""
    axis = part.axis % a.ndim
    size = a.shape[axis] // part.count
    split = a.reshape(a.shape[:axis] + (part.count, size) + a.shape[axis + 1 :])
    got = np.take(split, list(part.chunks), axis=axis)
    return got.reshape(a.shape[:axis] + (len(part.chunks) * size,) + a.shape[axis + 1 :])


TILE = 256


def transpose_2d(a: np.ndarray, tile: int = TILE, out: np.ndarray | None = None) -> np.ndarray:
    """``a.T`` as a C-ordered array (written into ``out`` when given, shape ``a.shape[::-1]``), copied tile
    by tile (``tile`` × ``tile``): the same bits as ``np.ascontiguousarray(a.T)`` (any dtype; bf16 as
    ``uint16``), 2-7x faster on large matrices, where numpy's strided copy misses the cache on every
    element (measured in ``bench/convert_memory.py``)."""
    rows, cols = a.shape
    if out is None:
        out = np.empty((cols, rows), dtype=a.dtype)
    for i in range(0, rows, tile):
        for j in range(0, cols, tile):
            out[j : j + tile, i : i + tile] = a[i : i + tile, j : j + tile].T
    return out


# rows of the input read at a time when transposing a whole tensor (about this many bytes)
ROWS_BYTES = 16 << 20


def transposed(ckpt: Checkpoint, name: str) -> np.ndarray:
    """Tensor ``name`` (2-D) transposed, in its stored dtype, reading the input in blocks of rows of about
    :data:`ROWS_BYTES` (:meth:`Checkpoint.iter_rows`, one reused buffer): memory is the output tensor plus
    one block, never the input tensor as well."""
    t = ckpt.tensors[name]
    rows, cols = t.shape
    if rows == 0 or cols == 0:
        return transpose_2d(ckpt.load(name))
    out: np.ndarray | None = None
    i = 0
    for block in ckpt.iter_rows(name, max(1, ROWS_BYTES // max(1, t.nbytes // rows))):
        if out is None:
            out = np.empty((cols, rows), dtype=block.dtype)
        n = block.shape[0]
        transpose_2d(block, out=out[:, i : i + n])
        i += n
    assert out is not None and i == rows
    return out


def step_source(ckpt: Checkpoint, step: Step) -> Callable[[], Source]:
    """The bytes of ``step`` in C order, produced when called: a byte range of the input for a plain copy
    (C-ordered storage); a whole transposed tensor built by :func:`transposed` (peak memory: the output
    tensor and one block of input rows); a chunk of a fused projection from the stored array (bf16 as
    ``uint16`` bits), chunked then transposed (peak: the fused input and its chunk)."""
    t = ckpt.tensors[step.src]

    def build() -> Source:
        if step.part is None and step.transpose:
            return Source(array=transposed(ckpt, step.src))
        a = ckpt.load(step.src)
        if step.part is not None:
            a = _take(a, step.part)
        return Source(array=transpose_2d(a) if step.transpose else np.ascontiguousarray(a))

    if step.part is None and not step.transpose and not t.fortran:
        return lambda: ckpt.source(step.src)
    return build


def _st_metadata(plan: ConvertPlan) -> dict[str, str] | None:
    """The input's ``__metadata__`` when it is safetensors with one metadata for all files and keeps its
    layout; else ``{"format": "pt"}`` as HF's ``save_pretrained`` writes (HF loaders require it)."""
    metas = {str(m) for m in plan.ckpt.st_metadata.values()}
    if plan.ckpt.format == "safetensors" and plan.source is plan.target and len(metas) == 1:
        first = next(iter(plan.ckpt.st_metadata.values()))
        return dict(first) if first else None
    return {"format": "pt"}


def _pdparams_extras(plan: ConvertPlan) -> dict | None:
    """The input's non-tensor ``.pdparams`` entries (``StructuredToParameterName@@`` of every file) when
    names are unchanged; a renamed checkpoint gets none (PaddleNLP's loader does not need it)."""
    if plan.ckpt.format != "pdparams" or plan.source is not plan.target:
        return None
    merged: dict = {}
    for ex in plan.ckpt.extras.values():
        for k, v in ex.items():
            if isinstance(v, dict) and isinstance(merged.get(k), dict):
                merged[k] = {**merged[k], **v}
            else:
                merged.setdefault(k, v)
    return merged or None


def _carry(ckpt: Checkpoint) -> list[tuple[Path, str]]:
    """Files carried unchanged: everything but weights, index, config, report and training state."""
    skip = {ckpt.config_file, *NOT_CARRIED}
    return [
        (ckpt.path / rel, rel) for rel in ckpt.other_files if rel not in skip and Path(rel).name not in skip
    ]


def build_report(plan: ConvertPlan, to: Target, out: str, facts: dict | None) -> dict:
    """The report (``tietool-report.json``): every renamed, transposed and split tensor, config changes,
    notes, and the files written (``facts`` from :func:`~surgery.assemble.assemble`; None for a dry run)."""
    ck = plan.ckpt
    renamed = [{"from": s.src, "to": s.out} for s in plan.steps if s.out != s.src and s.part is None]
    transposed = [
        {
            "name": s.out,
            "from": s.src,
            "shape_before": list(ck.tensors[s.src].shape),
            "shape_after": list(s.shape),
        }
        for s in plan.steps
        if s.transpose
    ]
    split: dict[str, list[str]] = {}
    for s in plan.steps:
        if s.part is not None:
            split.setdefault(s.src, []).append(s.out)
    total_in = sum(t.nbytes for t in ck.tensors.values())
    total_out = sum(DTYPES[s.dtype].nbytes(int(np.prod(s.shape, dtype=np.int64))) for s in plan.steps)
    params_in = sum(t.numel for t in ck.tensors.values())
    params_out = sum(int(np.prod(s.shape, dtype=np.int64)) for s in plan.steps)
    return {
        "operation": "convert",
        "to": to.value,
        "input": str(ck.path),
        "output": out,
        "dry_run": facts is None,
        "changed": True,
        "from_convention": plan.source.title,
        "to_convention": plan.target.title,
        "container": {"before": ck.format, "after": plan.container.value},
        "before": {"parameters": params_in, "bytes": total_in, "tensors": len(ck.tensors)},
        "after": {"parameters": params_out, "bytes": total_out, "tensors": len(plan.steps)},
        "renamed": renamed,
        "transposed": transposed,
        "split": [{"from": k, "to": v} for k, v in split.items()],
        "config_changes": plan.config_changes,
        "notes": plan.notes,
        "warnings": list(ck.warnings),
        "files": facts,
    }


ProgressFactory = Callable[[int], AbstractContextManager[Callable[[str, int], None] | None]]


def convert(
    path: str | PathLike[str],
    to: Target | str,
    out: str | PathLike[str],
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    dry_run: bool = False,
    progress: ProgressFactory | None = None,
) -> Report:
    """Convert checkpoint ``path`` to the convention or container ``to`` (see :func:`plan_convert`),
    written to ``out`` atomically (a temporary folder renamed into place when complete, as
    :func:`surgery.assemble.assemble`), sharded at ``max_shard_size`` bytes (default ``"10GB"`` =
    10·10⁹ bytes, as PaddleFormers' ``save_pretrained``; ints, ``"500MB"``, ``"2GiB"`` accepted).

    Tensors stream one at a time: a copied tensor by byte range, a transposed or split one loaded in its
    stored dtype (bf16 as ``uint16`` bits, never converted), rearranged, written and dropped.

    Returns:
        the report (:func:`build_report`), also written as ``out/tietool-report.json`` (not for a dry run).

    Raises:
        UsageError: ``to`` not a target, a bad ``max_shard_size``, an ``out`` that is the input, inside it or
            not empty.
        CheckpointError: a missing or corrupt input, or one whose layout contradicts its names.
        RefusedError: see :func:`plan_convert`.
        OutputError: the output cannot be written; nothing is left behind.
    """
    target = _target(to)
    limit = parse_size(max_shard_size)
    for arg, what in ((path, "path"), (out, "out")):
        if isinstance(arg, bytes) or not isinstance(arg, str | PathLike):
            raise UsageError(f"{what} must be a folder path (str or os.PathLike), got {type(arg).__name__}")
    local_only("convert", path, out)
    ckpt = Checkpoint.open(Path(path))
    check_index(ckpt)
    if not dry_run:
        check_output_path(ckpt.path, Path(out))
    plan = check_dtypes(plan_convert(ckpt, target))
    _note_left_out(plan)
    if dry_run:
        return Report(build_report(plan, target, str(out), None))
    tensors = [OutTensor(s.out, s.dtype, s.shape, step_source(ckpt, s)) for s in plan.steps]
    total = sum(t.nbytes for t in tensors)
    with (progress or (lambda _total: nullcontext(None)))(total) as advance:
        rep = assemble(
            Path(out),
            tensors,
            plan.container,
            plan.config,
            carry=_carry(ckpt),
            max_shard_size=limit,
            st_metadata=_st_metadata(plan) if plan.container is Container.SAFETENSORS else None,
            pdparams_extras=_pdparams_extras(plan),
            report=lambda facts: build_report(plan, target, str(out), facts),
            progress=advance,
        )
    return Report(rep)


def check_dtypes(plan: ConvertPlan) -> ConvertPlan:
    """Refuse, by name, a tensor whose dtype the output cannot carry: a ``.pdparams`` holds numpy dtypes
    only (no float8, float4, float6 or complex: ``DType.np_name`` is None; relabelling their bytes as
    ``uint8`` would make paddle load integers), and a packed sub-byte tensor (``F4``, ``F6_*``) cannot be
    transposed or split (its elements are not whole bytes). Every other tensor moves as bytes, any dtype.

    Returns:
        ``plan``, unchanged. Raises RefusedError naming the tensor and its dtype.
    """
    ck = plan.ckpt
    for s in plan.steps:
        t = ck.tensors[s.src]
        if plan.container is Container.PDPARAMS and DTYPES[s.dtype].np_name is None:
            raise RefusedError(
                f"convert refused: {s.src} is stored as {describe_dtype(s.dtype)}, which a .pdparams cannot "
                "hold (numpy has no float8/float4/float6: paddle.save itself writes float8 as int8, which "
                "paddle.load returns as int8; complex arrays are outside the .pdparams reader's allow-list)",
                ck.path,
                f"keep the safetensors container ({Opt('to', 'safetensors')} or "
                f"{Opt('to', 'paddleformers')})",
            )
        if (s.transpose or s.part is not None) and DTYPES[s.dtype].packed:
            raise dtype_refusal(t, ck.path, "transpose or split it", op="convert")
    return plan


def _note_left_out(plan: ConvertPlan) -> None:
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


def _target(to: Target | str) -> Target:
    """``to`` as a :class:`Target`. Raises UsageError for anything else."""
    try:
        return Target(to.value if isinstance(to, Target) else to)
    except ValueError:
        allowed = ", ".join(repr(t.value) for t in Target)
        raise UsageError(
            f"{Opt('to')} must be one of {allowed}, got {to!r}", fix=f"e.g. {Opt('to', 'paddleformers')}"
        ) from None
