"""The tensors of a conversion (:mod:`surgery.plan.convert`): the input's convention, proven from its
names and shapes (:func:`source_convention`, :func:`head_layout`), and the output tensor each input tensor
becomes (:func:`model_steps`): a copy, a transposed Linear weight, or the chunks of a fused projection
(:class:`Part`), as recipes (:class:`~surgery.plan.recipes.CopyOf`, :class:`~surgery.plan.recipes.FusedPart`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import arch
from ..inspect.convention import (
    DEFAULT_HEAD,
    Convention,
    Naming,
    convention,
    linear_weights,
    naming_of,
    rebase,
    suffix_in,
)
from ..inspect.linear_layout import Proof, hint_container_only, prove
from ..io import surface
from ..io.checkpoint import Checkpoint
from ..model.errors import CheckpointError, Opt, RefusedError
from ..model.tensor import DTYPES
from .plan import OutTensor
from .recipes import ROWS_BYTES, CopyOf, FusedPart, transpose_2d

# safetensors label of each logical dtype ("bfloat16" -> "BF16")
_LABEL = {d.logical: d.st for d in DTYPES.values()}


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


def conversion_step(
    out: str, src: str, dtype: str, shape: tuple[int, ...], transpose: bool = False, part: Part | None = None
) -> OutTensor:
    """One output tensor: ``out`` (its name, ``dtype`` label, ``shape``) made from input tensor ``src``:
    :class:`~surgery.plan.recipes.CopyOf` it (transposed when ``transpose``: a Linear weight or head changing
    layout), or take the chunks ``part`` of a fused projection first
    (:class:`~surgery.plan.recipes.FusedPart`). Neither: the stored bytes are copied by byte range."""
    if part is None:
        return OutTensor(out, dtype, shape, CopyOf(src, transpose=transpose))
    return OutTensor(out, dtype, shape, FusedPart(src, part.axis, part.count, part.chunks, transpose))


def source_of(t: OutTensor) -> str:
    """The input tensor an output tensor of a conversion is made from."""
    assert isinstance(t.recipe, CopyOf | FusedPart), f"internal: {t.name} is no conversion recipe"
    return t.recipe.name


def reshaped(t: OutTensor) -> bool:
    """Whether a conversion transposes or splits the tensor (False: its bytes are copied as stored)."""
    return isinstance(t.recipe, FusedPart) or (isinstance(t.recipe, CopyOf) and t.recipe.transpose)


def label_of(ckpt: Checkpoint, name: str) -> str:
    """The safetensors label of the logical dtype of input tensor ``name`` (bf16 stored as U16 → BF16)."""
    return _LABEL[ckpt.logical_dtype(ckpt.tensors[name])]


def copy_steps(ckpt: Checkpoint) -> list[OutTensor]:
    return [conversion_step(n, n, label_of(ckpt, n), tuple(t.shape)) for n, t in ckpt.tensors.items()]


def source_convention(
    ckpt: Checkpoint, row: arch.ConversionRow, fix: str | None = None
) -> tuple[Convention, Proof]:
    """The input's convention: its naming from the tensor names, its Linear layout proven from the shapes
    (:func:`surgery.inspect.linear_layout.prove`), its head layout from the head's shape
    (:func:`head_layout`).
    ``fix`` is the refusals' fix, one the calling command has (default: convert's
    :func:`~surgery.inspect.linear_layout.hint_container_only`).

    Raises:
        RefusedError: no tensor carries a prefix of the row, or a layout is not proven (named).
        CheckpointError: shapes that contradict the config or each other.
    """
    fix = fix or hint_container_only()
    naming = naming_of(ckpt, row)
    if naming is None:
        pres = ", ".join(f"{p}." for p in row.prefixes.values())
        raise RefusedError(
            f"no tensor of this {ckpt.config.get('model_type')} checkpoint carries a name prefix tietool "
            f"knows for it ({pres})",
            ckpt.path,
            fix,
        )
    proof = prove(ckpt, linear_weights(ckpt, row, naming), fix)
    if proof.layout is None:
        raise RefusedError("the files hold no Linear weight whose shape tells the layout", ckpt.path, fix)
    emb = f"{row.prefixes[naming]}.{row.embedding}"
    _check_embedding(ckpt, emb)
    head = head_layout(ckpt, row.head, emb, fix) if row.head in ckpt.tensors else DEFAULT_HEAD[naming]
    return convention(naming, proof.layout, head), proof


def _check_embedding(ckpt: Checkpoint, emb: str) -> None:
    """The input embedding ``emb`` (when present) is ``[rows, hidden_size]``, as every convention stores it.

    Raises:
        CheckpointError: any other shape (0-D, 1-D, 3-D or more, another hidden size), naming the tensor.
    """
    t = ckpt.tensors.get(emb)
    h = ckpt.config.get("hidden_size")
    if t is not None and (len(t.shape) != 2 or t.shape[1] != h):
        raise CheckpointError(
            f"tensor {emb} is {list(t.shape)}, but this config's embedding is [vocab_size, {h}]",
            ckpt.path / t.file,
            "check config.json (hidden_size) against the files; a damaged file must be re-exported",
        )


def head_layout(ckpt: Checkpoint, head: str, emb: str, fix: str | None = None) -> str:
    """``"hidden-vocab"`` or ``"vocab-hidden"``: the head's shape against vocab_size / hidden_size; a square
    head (vocab == hidden) by its bytes: the embedding's as stored, or transposed.

    Raises:
        CheckpointError: a head whose shape fits neither; RefusedError: a square head that is neither.
    """
    shape = tuple(ckpt.tensors[head].shape)
    v, h = ckpt.config.get("vocab_size"), ckpt.config.get("hidden_size")
    if shape == (h, v) != (v, h):
        return "hidden-vocab"
    if shape == (v, h) != (h, v):
        return "vocab-hidden"
    if shape == (v, h) and emb in ckpt.tensors:
        if (
            ckpt.tensors[emb].shape == ckpt.tensors[head].shape
            and ckpt.load(emb).tobytes() == ckpt.load(head).tobytes()
        ):
            return "vocab-hidden"
        if head_is_embedding_t(ckpt, head, emb):
            return "hidden-vocab"
    if shape == (v, h):
        raise RefusedError(
            f"tietool cannot tell the layout of {head}: it is {list(shape)} with vocab_size == hidden_size, "
            "and it is not the embedding as stored or transposed",
            ckpt.path,
            fix or hint_container_only(),
        )
    raise CheckpointError(
        f"tensor {head} is {list(shape)}, but this config's head is [{v}, {h}] or [{h}, {v}]",
        ckpt.path,
        "check config.json (vocab_size, hidden_size) against the files",
    )


def prefix_of(conv: Convention, row: arch.ConversionRow) -> str:
    return row.prefixes[Naming(conv.names)]


def swapped(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[1], shape[0])


def _fused_parts(ckpt: Checkpoint, name: str, spec: arch.FusedSpec, axis: int) -> list[Part]:
    """How the fused tensor ``name`` splits along ``axis`` (see :class:`~surgery.arch.Split`).

    Raises:
        CheckpointError: the config lacks the head counts, or the axis does not divide into them.
    """
    size = ckpt.tensors[name].shape[axis]
    groups: list[tuple[int, ...]]
    if spec.split is arch.Split.HALVES:
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
        if spec.split is arch.Split.QKV_CONCAT:
            groups = [tuple(range(nh)), tuple(range(nh, nh + kv)), tuple(range(nh + kv, count))]
        elif spec.split is arch.Split.QKV_GROUPED_GATED:  # chunks of head_dim: 2 per query head
            q, count = 2 * g, 2 * nh + 2 * kv
            groups = [
                tuple(i * (q + 2) + j for i in range(kv) for j in range(q)),
                tuple(i * (q + 2) + q for i in range(kv)),
                tuple(i * (q + 2) + q + 1 for i in range(kv)),
            ]
        else:
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
) -> list[OutTensor]:
    """The unfused steps of fused projection ``name`` (``out_body`` its output name, matching the table's
    ``fused``): q, k, v (or gate, up), each transposed when the Linear layout changes."""
    shape = tuple(ckpt.tensors[name].shape)
    weight = len(shape) == 2
    axis = len(shape) - 1 if src.linear == "in-out" else 0
    turn = weight and src.linear != dst.linear
    steps = []
    for suffix, part in zip(spec.parts, _fused_parts(ckpt, name, spec, axis), strict=True):
        s = list(shape)
        s[axis] = shape[axis] // part.count * len(part.chunks)
        out_shape = swapped(tuple(s)) if turn else tuple(s)
        steps.append(
            conversion_step(
                rebase(out_body, fused, suffix), name, label_of(ckpt, name), out_shape, turn, part
            )
        )
    return steps


def _body_step(
    ckpt: Checkpoint, name: str, row: arch.ConversionRow, src: Convention, dst: Convention
) -> list[OutTensor] | None:
    """The steps of one tensor under the model prefix (None: tietool cannot place it). Linear weights'
    layout was proven by :func:`source_convention`."""
    pre = prefix_of(src, row) + "."
    if not name.startswith(pre):
        return None
    body = name[len(pre) :]
    out = f"{prefix_of(dst, row)}.{body}"
    shape, label = tuple(ckpt.tensors[name].shape), label_of(ckpt, name)
    fused_specs = row.fused.get(Naming(src.names), {})
    lin, fused = suffix_in(body, row.linear), suffix_in(body, fused_specs)
    if lin is not None and (fused is None or len(lin) >= len(fused)):
        turn = src.linear != dst.linear
        return [conversion_step(out, name, label, swapped(shape) if turn else shape, turn)]
    if fused is not None:
        return _unfuse(ckpt, name, out, fused, fused_specs[fused], src, dst)
    if suffix_in(body, row.plain):
        return [conversion_step(out, name, label, shape)]
    return None


def model_steps(
    ckpt: Checkpoint, row: arch.ConversionRow, src: Convention, dst: Convention, fix: str | None = None
) -> list[OutTensor]:
    """Every output tensor of a conversion from ``src`` to ``dst``, in the input's tensor order. ``fix``: the
    refusal's fix, one the calling command has (default: convert's container-only conversion).

    Raises:
        RefusedError: tensors the row cannot place (named, up to two), never guessed.
    """
    steps: list[OutTensor] = []
    unplaced: list[str] = []
    for name, t in ckpt.tensors.items():
        if name == row.head:
            turn = src.head != dst.head
            steps.append(
                conversion_step(
                    name,
                    name,
                    label_of(ckpt, name),
                    swapped(tuple(t.shape)) if turn else tuple(t.shape),
                    turn,
                )
            )
            continue
        got = _body_step(ckpt, name, row, src, dst)
        if got is None:
            unplaced.append(name)
        else:
            steps += got
    if unplaced:
        raise RefusedError(
            f"{len(unplaced)} tensor(s) of this {ckpt.config.get('model_type')} checkpoint "
            f"({surface.few(unplaced)}) cannot be placed in the {dst.title} layout without guessing "
            "if they are Linear weights",
            ckpt.path,
            (fix or f"convert with {Opt('to', 'safetensors')} (names and layouts unchanged)")
            + ", or add their suffixes to CONVERSIONS in surgery/arch/conversions.py",
        )
    return steps


def head_is_embedding_t(ckpt: Checkpoint, head: str, emb: str) -> bool:
    """Whether ``[hidden, vocab]`` head ``head`` holds the bits of ``[vocab, hidden]`` embedding ``emb``
    transposed (same dtype), compared in blocks of embedding rows against the head loaded once."""
    h, e = ckpt.tensors[head], ckpt.tensors[emb]
    if len(e.shape) != 2 or tuple(h.shape) != swapped(tuple(e.shape)) or h.dtype != e.dtype:
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
