"""Recipes: what the data of a new tensor is, as plain data; :func:`make` computes it while writing.

A plan (:mod:`surgery.plan.plan`) says which tensor gets which recipe; the writer
(:mod:`surgery.write.writer`) calls
:func:`make` with one memo per execution, keyed by recipe. Recipes are frozen dataclasses, so they compare
equal when they describe the same data: an embedding's resized table, its aliases and a head equal to it
share one computed array, one random draw. Nothing here reads data until :func:`make` is called.

Where a recipe is the input's bytes unchanged (or a prefix of them), :func:`make` returns a
:class:`~surgery.io.safetensors_io.Source` of that byte range, streamed by the writer without decoding.

Every operation's tensors are recipes: ``tie``/``untie``/``resize`` (:class:`CopyOf`, :class:`NewRows`,
:class:`ResizedTable`, ...), ``convert`` (:class:`CopyOf` of a renamed or transposed tensor,
:class:`FusedPart` of a fused projection) and ``merge`` (:class:`Joined` slices of the rank files).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..arch import TPSplit
from ..inspect.compare import compare
from ..io import pdparams, safetensors_io
from ..io.checkpoint import Checkpoint
from ..io.safetensors_io import Source
from ..model.enums import HeadLayout, Init, TieState, TokenInit
from ..model.tensor import TensorInfo, bf16_bits_to_f32, dtype_refusal, f32_to_bf16_bits
from .flex_pieces import Assembled, assembled_data
from .kept_rows import KeptRows, kept_rows_data
from .untrained_rows import MeanRows, mean_rows_data

Array = npt.NDArray[Any]
"""An array in a stored dtype (bf16 as ``uint16`` bits)."""


@dataclass(frozen=True)
class CopyOf:
    """The stored values of tensor ``name`` (2-D), transposed when ``transpose`` (contiguous), times
    ``scale`` when given (in float32, rounded back to the stored dtype; bf16 bits stay bf16 bits).

    Untouched (no transpose, no scale, C order) it is the input's byte range, streamed, never decoded.
    Transposed (no scale), it is read in blocks of rows (:func:`transposed`): memory is the output tensor
    and one block. ``convert``'s renamed and transposed tensors are this recipe of their input name.
    """

    name: str
    transpose: bool = False
    scale: float | None = None


@dataclass(frozen=True)
class FusedPart:
    """Chunks ``chunks`` of the ``count`` equal chunks of axis ``axis`` of fused projection ``name``
    (``-1`` for ``[in, out]``, 0 for ``[out, in]``; ``heads + 2 * kv_heads`` chunks of q/k/v, or 2 of
    ``[gate, up]``), transposed after when ``transpose`` (the Linear layout changes): one unfused tensor of
    ``convert``. Made from the stored array (bf16 as ``uint16`` bits), never decoded."""

    name: str
    axis: int
    count: int
    chunks: tuple[int, ...]
    transpose: bool = False


@dataclass(frozen=True)
class Slice:
    """One rank's piece of a tensor (``merge``): its header and the file it is in."""

    path: Path
    info: TensorInfo


@dataclass(frozen=True)
class Joined:
    """The slices of one tensor (one per tensor-parallel rank, in rank order) joined as the family's rule
    ``rule`` says (``merge``): ``axis`` None (replicated): rank 0's bytes; axis 0 without ``parts``: the
    ranks' byte ranges one after another (no memory); another axis, or a fused kind (``parts``: the shares
    of each part in a rank's slice), through memory (:func:`join`)."""

    slices: tuple[Slice, ...]
    rule: TPSplit
    axis: int | None
    parts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class NewRows:
    """``count`` new rows ``[count, hidden]`` in the stored dtype of ``source``, computed from its stored
    rows (its columns when ``axis`` is 1, a ``[hidden, vocab]`` head) by ``init`` (:func:`new_rows`).

    The random draw is ``default_rng`` of child ``stream`` of ``SeedSequence(seed)``; ``std`` is the
    ``normal`` init's standard deviation.
    """

    source: str
    axis: int
    count: int
    init: Init
    seed: int
    stream: int
    std: float


@dataclass(frozen=True)
class ResizedTable:
    """Tensor ``name`` with ``new`` entries along ``axis`` (0: rows, 1: columns of a ``[hidden, vocab]``
    head): its old entries kept bit-exact (trimmed from the end), then ``rows`` (None when trimming).

    Rows of a C-ordered tensor are the input's byte-range prefix (streamed) followed by the new rows;
    columns, and rows of a Fortran-ordered pdparams array, go through memory.
    """

    name: str
    axis: int
    new: int
    rows: NewRows | None


@dataclass(frozen=True)
class ResizedBias:
    """The head bias ``name`` (``[V]`` or ``[1, V]``) with ``new`` entries on its last axis: old entries
    kept (trimmed from the end), new entries zero."""

    name: str
    new: int


@dataclass(frozen=True)
class CopyIfEqual:
    """``copy`` when tensor ``name`` is a bit-exact copy of ``main`` (same shape, dtype and values, told
    when written by reading both), else ``own``: an extra table that copies the embedding stays a copy."""

    name: str
    main: str
    copy: Recipe
    own: Recipe


@dataclass(frozen=True)
class TokenRows:
    """A token-indexed integer/boolean table ``name`` with ``new`` rows (axis 0): old rows kept (trimmed
    from the end); new row ``V + j`` repeats row ``j mod V`` when ``cycle`` (ids of something else, such as
    experts, stay ids in use), else zero/False (a membership mask)."""

    name: str
    new: int
    cycle: bool


@dataclass(frozen=True)
class TokenSpec:
    """How the row of one new token is made (``add-tokens``): ``kind``, and the ids it reads (the subtoken
    ids for ``SUBTOKENS``, the one id for ``COPY``; empty for the others)."""

    kind: TokenInit
    ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenInitRows:
    """One row per spec, ``[len(specs), hidden]`` in the stored dtype of ``source`` (its columns when
    ``axis`` is 1, a ``[hidden, vocab]`` head), made from its stored entries by :func:`token_rows`.

    ``trained``: entries ``0..trained-1`` are the tokens the tokenizer had (the candidates of
    ``TRAINED_MEAN``). The random draws of ``MEAN`` / ``TRAINED_MEAN`` use ``default_rng`` of child
    ``stream`` of ``SeedSequence(seed)``, one row per such token in spec order.
    """

    source: str
    axis: int
    specs: tuple[TokenSpec, ...]
    trained: int
    seed: int
    stream: int


@dataclass(frozen=True)
class EditedTable:
    """Tensor ``name`` with ``new`` entries along ``axis`` (``add-tokens``; never fewer than it has): entries
    ``0..start-1`` kept bit-exact, then the ``tokens`` rows (over slack entries where it has them), then its
    old entries after those kept, then ``tail`` (padding rows up to ``new``; None when there are none).

    Kept rows of a C-ordered tensor are byte ranges of the input (streamed); columns and Fortran-ordered
    pdparams arrays go through memory.
    """

    name: str
    axis: int
    new: int
    start: int
    tokens: TokenInitRows
    tail: NewRows | None


@dataclass(frozen=True)
class EditedBias:
    """The head bias ``name`` (``[V]`` / ``[1, V]``) with ``new`` entries (``add-tokens``): entries from
    ``start`` on, one per spec, are the mean of the bias entries of the spec's ids (``SUBTOKENS``, ``COPY``)
    or zero (the other kinds, as ``resize`` gives new entries); the other old entries kept, the padding
    entries up to ``new`` zero."""

    name: str
    new: int
    start: int
    specs: tuple[TokenSpec, ...]


Recipe = (
    CopyOf
    | NewRows
    | ResizedTable
    | ResizedBias
    | CopyIfEqual
    | TokenRows
    | FusedPart
    | Joined
    | Assembled
    | TokenInitRows
    | EditedTable
    | EditedBias
    | MeanRows
    | KeptRows
)
Data = Array | Source


def parts(recipe: Recipe) -> tuple[Recipe, ...]:
    """The recipes ``recipe`` is made from (whose data :func:`make` memoizes too)."""
    if isinstance(recipe, ResizedTable):
        return (recipe.rows,) if recipe.rows is not None else ()
    if isinstance(recipe, EditedTable):
        return (recipe.tokens,) + ((recipe.tail,) if recipe.tail is not None else ())
    if isinstance(recipe, CopyIfEqual):
        return (recipe.copy, recipe.own)
    return ()


@dataclass(frozen=True)
class Use:
    """What a recipe does with tensor ``name`` beyond copying its byte range: ``doing`` in words;
    ``values``: it computes with the values (needs a dtype tietool decodes), else it only moves whole
    elements (a transpose: needs elements of whole bytes)."""

    name: str
    doing: str
    values: bool


def uses(recipe: Recipe) -> list[Use]:
    """The tensors ``recipe`` reads other than as one unchanged byte range, and how (for the dtype check
    of a plan, :func:`surgery.plan.plan.check_dtypes`): its sub-recipes' uses included."""
    if isinstance(recipe, CopyOf):
        out = [Use(recipe.name, "scale its values", True)] if recipe.scale is not None else []
        return out + ([Use(recipe.name, "transpose it", False)] if recipe.transpose else [])
    if isinstance(recipe, NewRows):
        return [Use(recipe.source, f"compute new rows from it ({recipe.init.value})", True)]
    if isinstance(recipe, ResizedTable):
        return [Use(recipe.name, "resize it", True)] + (uses(recipe.rows) if recipe.rows else [])
    if isinstance(recipe, ResizedBias | EditedBias):
        return [Use(recipe.name, "resize it", True)]
    if isinstance(recipe, TokenInitRows):
        return [Use(recipe.source, "compute the rows of new tokens from it", True)]
    if isinstance(recipe, EditedTable):
        tail = uses(recipe.tail) if recipe.tail else []
        return [Use(recipe.name, "add token rows to it", True), *uses(recipe.tokens), *tail]
    if isinstance(recipe, TokenRows):  # whole rows kept or repeated: elements moved, never computed with
        return [Use(recipe.name, "resize it", False)]
    if isinstance(recipe, FusedPart):
        return [Use(recipe.name, "transpose or split it", False)]
    if isinstance(recipe, Joined | Assembled):  # slices of rank files, not of a checkpoint: moved as bits
        return []
    if isinstance(recipe, MeanRows):
        return [Use(recipe.name, "set untrained rows to the mean of the trained ones", True)]
    if isinstance(recipe, KeptRows):  # whole entries kept: elements moved, never computed with
        return [Use(recipe.name, "keep some of its entries", False)]
    return uses(recipe.copy) + uses(recipe.own)


def describe(recipe: Recipe) -> str:
    """One line for a plan listing: ``copy of lm_head.weight (transposed)``, ..."""
    if isinstance(recipe, CopyOf):
        how = ["transposed"] if recipe.transpose else []
        how += [f"× {recipe.scale:.6g}"] if recipe.scale is not None else []
        return f"copy of {recipe.name}" + (f" ({', '.join(how)})" if how else "")
    if isinstance(recipe, NewRows):
        return f"{recipe.count} new rows from {recipe.source} ({recipe.init.value}, seed {recipe.seed})"
    if isinstance(recipe, ResizedTable):
        what = "rows" if recipe.axis == 0 else "columns"
        extra = f" + {describe(recipe.rows)}" if recipe.rows is not None and recipe.rows.count else ""
        return f"{recipe.name} to {recipe.new} {what}{extra}"
    if isinstance(recipe, ResizedBias):
        return f"{recipe.name} to {recipe.new} entries (new ones zero)"
    if isinstance(recipe, TokenInitRows):
        kinds = ", ".join(sorted({s.kind.value for s in recipe.specs}))
        return f"{len(recipe.specs)} token rows from {recipe.source} ({kinds}, seed {recipe.seed})"
    if isinstance(recipe, EditedTable):
        what = "rows" if recipe.axis == 0 else "columns"
        tail = f" + {describe(recipe.tail)}" if recipe.tail is not None else ""
        ids = f"{recipe.start}..{recipe.start + len(recipe.tokens.specs) - 1}"
        return f"{recipe.name} to {recipe.new} {what}: ids {ids} = {describe(recipe.tokens)}{tail}"
    if isinstance(recipe, EditedBias):
        return (
            f"{recipe.name} to {recipe.new} entries ({len(recipe.specs)} token entries from {recipe.start})"
        )
    if isinstance(recipe, TokenRows):
        fill = "repeating existing rows" if recipe.cycle else "new ones zero"
        return f"{recipe.name} to {recipe.new} rows ({fill})"
    if isinstance(recipe, FusedPart):
        turned = ", transposed" if recipe.transpose else ""
        return f"chunks {list(recipe.chunks)} of {recipe.count} of {recipe.name} (axis {recipe.axis}{turned})"
    if isinstance(recipe, Assembled):
        return f"assembled from {len({p.slice for p in recipe.pieces})} flex slices"
    if isinstance(recipe, Joined):
        rule = "replicated" if recipe.axis is None else f"{recipe.rule.value} on axis {recipe.axis}"
        return f"{len(recipe.slices)} slices of {recipe.slices[0].info.name} joined: {rule}"
    if isinstance(recipe, MeanRows):
        what = "rows" if recipe.axis == 0 else "columns"
        whose = "of their sub-tokens (or its trained" if recipe.sources else "of its trained"
        close = ")" if recipe.sources else ""
        return f"{recipe.name} with {len(recipe.ids)} {what} set to the mean {whose} {what}{close}"
    if isinstance(recipe, KeptRows):
        return f"{recipe.name} with {len(recipe.ids)} kept entries on axis {recipe.axis}"
    return f"{describe(recipe.copy)} if {recipe.name} equals {recipe.main}, else {describe(recipe.own)}"


def make(recipe: Recipe, ckpt: Checkpoint | None, memo: dict[Recipe, Data]) -> Data:
    """The data of ``recipe``: an array (stored dtype, bf16 as ``uint16`` bits) or a :class:`Source` of the
    input's bytes. Computed once per ``memo`` (the writer's, one per execution), sub-recipes included.
    ``ckpt`` is the input checkpoint (None for a :class:`Joined`, whose slices name their files).

    Raises:
        OSError: reading the input fails.
    """
    if recipe not in memo:
        memo[recipe] = _build(recipe, ckpt, lambda r: make(r, ckpt, memo))
    return memo[recipe]


def _build(recipe: Recipe, ckpt: Checkpoint | None, get: Callable[[Recipe], Data]) -> Data:
    if isinstance(recipe, Joined):
        return _joined(recipe)
    if isinstance(recipe, Assembled):
        return assembled_data(recipe)
    assert ckpt is not None, f"internal: {describe(recipe)} needs the input checkpoint"
    if isinstance(recipe, FusedPart):
        return _fused_part(recipe, ckpt)
    if isinstance(recipe, CopyOf):
        return _copy_of(recipe, ckpt)
    if isinstance(recipe, NewRows):
        return _new_rows_of(recipe, ckpt)
    if isinstance(recipe, ResizedTable):
        return _resized(recipe, ckpt, get)
    if isinstance(recipe, ResizedBias):
        return _resized_bias(recipe, ckpt)
    if isinstance(recipe, TokenRows):
        return _token_rows(recipe, ckpt)
    if isinstance(recipe, TokenInitRows | EditedTable | EditedBias):
        return _token_edit(recipe, ckpt, get)
    if isinstance(recipe, MeanRows):
        return mean_rows_data(recipe, ckpt)
    if isinstance(recipe, KeptRows):
        return kept_rows_data(recipe, ckpt)
    m, t = ckpt.tensors[recipe.main], ckpt.tensors[recipe.name]
    same = m.shape == t.shape and m.dtype == t.dtype
    if same and compare(ckpt, recipe.main, recipe.name, HeadLayout.VOCAB_HIDDEN).values is TieState.EXACT:
        return get(recipe.copy)
    return get(recipe.own)


def _resized_bias(r: ResizedBias, ckpt: Checkpoint) -> Array:
    """:class:`ResizedBias`: old entries kept (trimmed from the end), new entries zero."""
    a: Array = ckpt.load(r.name)
    old, new = a.shape[-1], r.new
    if new <= old:
        return np.ascontiguousarray(a[..., :new])
    return np.concatenate([a, np.zeros(a.shape[:-1] + (new - old,), dtype=a.dtype)], axis=-1)


def _fused_part(r: FusedPart, ckpt: Checkpoint) -> Array:
    """:class:`FusedPart`: the chunks from the stored array, chunked then transposed (peak memory: the fused
    input and its chunk)."""
    a = _take(ckpt.load(r.name), r.axis, r.count, r.chunks)
    return transpose_2d(a) if r.transpose else np.ascontiguousarray(a)


def _token_rows(r: TokenRows, ckpt: Checkpoint) -> Array:
    """:class:`TokenRows`: kept rows, then repeated rows or zeros, in the stored dtype."""
    a = np.asarray(ckpt.load(r.name))
    old = a.shape[0]
    if r.new <= old:
        return np.ascontiguousarray(a[: r.new])
    if r.cycle and old:
        extra = a[np.arange(old, r.new) % old]
    else:
        extra = np.zeros((r.new - old, *a.shape[1:]), dtype=a.dtype)
    return np.ascontiguousarray(np.concatenate([a, extra], axis=0))


def _copy_of(r: CopyOf, ckpt: Checkpoint) -> Data:
    """:class:`CopyOf`: the byte range when unchanged, else through memory."""
    t = ckpt.tensors[r.name]
    if not r.transpose and r.scale is None:
        return ckpt.load(r.name) if t.fortran else ckpt.source(r.name)
    if r.scale is None:
        return transposed(ckpt, r.name)
    a = ckpt.load(r.name)
    if r.scale is not None:
        bf16 = ckpt.logical_dtype(t) == "bfloat16"
        x = (bf16_bits_to_f32(a) if bf16 else a.astype(np.float32)) * np.float32(r.scale)
        a = f32_to_bf16_bits(x) if bf16 else x.astype(a.dtype)
    return np.ascontiguousarray(a.T) if r.transpose else a


def _new_rows_of(r: NewRows, ckpt: Checkpoint) -> Array:
    """:class:`NewRows`, encoded to the source's stored dtype."""
    t = ckpt.tensors[r.source]
    a = ckpt.load(r.source)
    a = a.T if r.axis == 1 else a
    rng = np.random.default_rng(np.random.SeedSequence(r.seed, spawn_key=(r.stream,)))
    rows = new_rows(a, r.count, r.init, rng, r.std, decode=lambda c: _decode(ckpt, t, c))
    return _encode(ckpt, t, rows)


def _resized(r: ResizedTable, ckpt: Checkpoint, get: Callable[[Recipe], Data]) -> Data:
    """:class:`ResizedTable`: kept rows by byte range (never decoded), columns through memory."""
    t = ckpt.tensors[r.name]
    old, new = t.shape[r.axis], r.new

    def extra() -> Array:
        assert r.rows is not None, f"internal: {r.name} grows without new rows"
        made = get(r.rows)
        assert isinstance(made, np.ndarray)
        return made

    if r.axis != 0:
        a = ckpt.load(r.name)
        return np.ascontiguousarray(a[:, :new] if new <= old else np.concatenate([a, extra().T], axis=1))
    if t.fortran:  # rows are not contiguous in the file: go through memory
        a = ckpt.load(r.name)
        return np.ascontiguousarray(a[:new]) if new <= old else np.concatenate([a, extra()], axis=0)
    keep = ckpt.source(r.name).prefix(t.nbytes // old * min(new, old))
    return keep if new <= old else Source(parts=[keep, Source(array=extra())])


# ------------------------------------------------------------------ token rows (add-tokens)


def _token_edit(
    r: TokenInitRows | EditedTable | EditedBias, ckpt: Checkpoint, get: Callable[[Recipe], Data]
) -> Data:
    """:class:`TokenInitRows`, :class:`EditedTable` or :class:`EditedBias`."""
    if isinstance(r, TokenInitRows):
        t = ckpt.tensors[r.source]
        a = ckpt.load(r.source)
        a = a.T if r.axis == 1 else a
        rng = np.random.default_rng(np.random.SeedSequence(r.seed, spawn_key=(r.stream,)))
        rows = token_rows(a, r.specs, r.trained, rng, decode=lambda c: _decode(ckpt, t, c))
        return _encode(ckpt, t, rows)
    if isinstance(r, EditedBias):
        return _edited_bias(r, ckpt)
    return _edited(r, ckpt, get)


def _array(d: Data) -> Array:
    assert isinstance(d, np.ndarray), "internal: new rows are an array"
    return d


def _edited(r: EditedTable, ckpt: Checkpoint, get: Callable[[Recipe], Data]) -> Data:
    """:class:`EditedTable`: kept rows by byte range where the tensor is stored as one C-ordered range,
    else (columns, Fortran order, pieces) through memory."""
    t = ckpt.tensors[r.name]
    old = t.shape[r.axis]
    tok = _array(get(r.tokens))
    end = r.start + tok.shape[0]
    tail = [_array(get(r.tail))] if r.tail is not None else []
    src = ckpt.source(r.name)
    if r.axis == 0 and not t.fortran and src.path is not None and src.parts is None and src.array is None:
        row = t.nbytes // old if old else 0
        parts = [src.prefix(row * r.start), Source(array=tok)]
        if end < old:
            parts.append(Source(src.path, src.offset + row * end, row * (old - end)))
        return Source(parts=parts + [Source(array=a) for a in tail])
    a = ckpt.load(r.name)
    a = a.T if r.axis == 1 else a
    out = np.concatenate([a[: r.start], tok, a[end:old], *tail], axis=0)
    return np.ascontiguousarray(out.T if r.axis == 1 else out)


def _edited_bias(r: EditedBias, ckpt: Checkpoint) -> Array:
    """:class:`EditedBias`: token entries the mean of their ids' entries (float32, rounded to the stored
    dtype), or zero; the other old entries kept; padding entries zero."""
    t = ckpt.tensors[r.name]
    a: Array = ckpt.load(r.name)
    old = a.shape[-1]
    x = _decode(ckpt, t, a)
    vals = np.zeros(a.shape[:-1] + (len(r.specs),), np.float32)
    for j, spec in enumerate(r.specs):
        if spec.kind in (TokenInit.SUBTOKENS, TokenInit.COPY) and spec.ids:
            vals[..., j] = x[..., list(spec.ids)].mean(axis=-1, dtype=np.float64)
    end = r.start + len(r.specs)
    pad = np.zeros(a.shape[:-1] + (r.new - max(old, end),), a.dtype)
    tail = [a[..., end:old]] if end < old else []
    return np.ascontiguousarray(
        np.concatenate([a[..., : r.start], _encode(ckpt, t, vals), *tail, pad], axis=-1)
    )


def token_rows(
    old: Array,
    specs: tuple[TokenSpec, ...],
    trained: int,
    rng: np.random.Generator,
    decode: Callable[[Array], Array] | None = None,
    chunk_rows: int = 8192,
) -> Array:
    """The rows ``[len(specs), hidden]`` (float32) of new tokens for a table of stored rows ``old``
    ``[rows, hidden]``, one per spec:

    - ``SUBTOKENS``: the mean (float64 sum, float32 result) of the decoded rows of ``spec.ids``;
    - ``COPY``: the decoded row of its id;
    - ``MEAN``: as :func:`new_rows` ``mean`` (HF ``mean_resizing``: N(mu, 1e-9 · C) over every row, or
      exactly mu), the tokens of this kind drawn together, in spec order;
    - ``TRAINED_MEAN``: the same over the trained rows only (:func:`trained_index`);
    - ``ZEROS``.

    Raises:
        ValueError: a spec of ``SUBTOKENS`` / ``COPY`` without ids.
    """
    dec = decode or (lambda a: np.asarray(a, dtype=np.float32))
    out = np.zeros((len(specs), old.shape[1]), np.float32)
    for kind in (TokenInit.MEAN, TokenInit.TRAINED_MEAN):
        at = [j for j, s in enumerate(specs) if s.kind is kind]
        if at:
            index = trained_index(old, trained, dec) if kind is TokenInit.TRAINED_MEAN else None
            out[at] = _mean_rows(old, len(at), rng, dec, chunk_rows, index)
    for j, spec in enumerate(specs):
        if spec.kind in (TokenInit.SUBTOKENS, TokenInit.COPY):
            if not spec.ids:
                raise ValueError(f"a {spec.kind.value} token row needs ids")
            out[j] = dec(np.asarray(old[list(spec.ids)])).mean(axis=0, dtype=np.float64)
    return out


def trained_index(
    old: Array, trained: int, decode: Callable[[Array], Array], chunk_rows: int = 8192
) -> Array:
    """The indexes of the trained rows among ``old[:trained]`` (int64): every row but those whose largest
    value is ≤ 1e-16 (unsloth's ``mean_of_trained_tokens``: ``amax(row) <= eps``, all-zero rows among them)
    and those bit-identical to another of these rows (never-trained rows left at one init value). All rows
    of ``old[:trained]`` when that leaves none."""
    n = min(trained, old.shape[0])
    keep = np.ones(n, bool)
    seen: dict[int, int] = {}
    for s in range(0, n, chunk_rows):
        blk = np.ascontiguousarray(old[s : min(n, s + chunk_rows)])
        keep[s : s + len(blk)] &= decode(blk).max(axis=1, initial=-np.inf) > 1e-16
        for i, row in enumerate(blk):
            first = seen.setdefault(hash(row.tobytes()), s + i)
            if first != s + i and np.array_equal(np.asarray(old[first]), row):
                keep[first] = keep[s + i] = False
    idx = np.flatnonzero(keep)
    return idx if idx.size else np.arange(n)


# ------------------------------------------------------------------ transposes and fused parts (convert)


def _take(a: Array, axis: int, count: int, chunks: tuple[int, ...]) -> Array:
    """The chunks ``chunks`` of the ``count`` equal chunks of ``a``'s axis ``axis`` (raw storage dtype: bits
    move, no cast)."""
    axis %= a.ndim
    size = a.shape[axis] // count
    split = a.reshape(a.shape[:axis] + (count, size) + a.shape[axis + 1 :])
    got: Array = np.take(split, list(chunks), axis=axis)
    return got.reshape(a.shape[:axis] + (len(chunks) * size,) + a.shape[axis + 1 :])


TILE = 256


def transpose_2d(a: Array, tile: int = TILE, out: Array | None = None) -> Array:
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


def transposed(ckpt: Checkpoint, name: str) -> Array:
    """Tensor ``name`` (2-D) transposed, in its stored dtype, reading the input in blocks of rows of about
    :data:`ROWS_BYTES` (:meth:`Checkpoint.iter_rows`, one reused buffer): memory is the output tensor plus
    one block, never the input tensor as well."""
    t = ckpt.tensors[name]
    rows, cols = t.shape
    if rows == 0 or cols == 0:
        return transpose_2d(ckpt.load(name))
    out: Array | None = None
    i = 0
    for block in ckpt.iter_rows(name, max(1, ROWS_BYTES // max(1, t.nbytes // rows))):
        if out is None:
            out = np.empty((cols, rows), dtype=block.dtype)
        n = block.shape[0]
        transpose_2d(block, out=out[:, i : i + n])
        i += n
    assert out is not None and i == rows
    return out


# ------------------------------------------------------------------ joined slices (merge)


def read_slice(s: Slice) -> Array:
    """The slice's array in its storage dtype (bf16 as uint16 bits), C order."""
    if s.path.suffix == ".safetensors":
        return safetensors_io.read_array(s.path, s.info)
    return np.ascontiguousarray(pdparams.read_array(s.path, s.info))


def raw_slice(s: Slice) -> Source:
    """The slice's bytes in C order, by byte range when stored so (no memory)."""
    if s.path.suffix == ".safetensors":
        return Source(s.path, s.info.offset, s.info.nbytes)
    if s.info.fortran and len(s.info.shape) > 1:
        return Source(array=read_slice(s))
    return pdparams.raw_bytes_source(s.path, s.info)


def join(arrays: list[Array], rule: TPSplit, axis: int, parts: tuple[int, ...] | None) -> Array:
    """Join the slices of one tensor (one array per rank, in rank order), as PaddleFormers'
    ``normal_fuse_merge_tp`` (plain concatenation on ``axis``) and ``naive_fuse_merge_tp`` (fused kinds:
    each rank's slice is cut into ``parts`` shares along ``axis`` — ``[gate_r, up_r]`` or ``[q_r, k_r, v_r]``
    — and the merged tensor is every rank's first part, then every rank's second, ...).

    Args:
        arrays: same shape and dtype (storage dtype: bf16 as uint16 bits; values are never touched).
        parts: None for a plain concatenation.

    Returns:
        the merged array, C order.
    """
    if parts is None:
        return np.concatenate(arrays, axis=axis)
    cut = np.cumsum([0, *parts])
    size = arrays[0].shape[axis]
    total = cut[-1]
    if size % total:
        raise ValueError(f"a fused slice of {size} does not split into shares {parts}")
    bounds = [(size * cut[k] // total, size * cut[k + 1] // total) for k in range(len(parts))]
    pieces = [np.take(a, np.arange(lo, hi), axis=axis) for lo, hi in bounds for a in arrays]
    return np.concatenate(pieces, axis=axis)


def _joined(r: Joined) -> Data:
    """:class:`Joined`: replicated → rank 0's byte range; axis 0 → the ranks' byte ranges one after
    another (no memory); another axis or a fused kind → the slices loaded and joined (:func:`join`)."""
    if r.axis is None:
        return raw_slice(r.slices[0])
    if r.axis == 0 and r.parts is None:
        return Source(parts=[raw_slice(s) for s in r.slices])
    return join([read_slice(s) for s in r.slices], r.rule, r.axis, r.parts)


# ------------------------------------------------------------------ new rows


def _decode(ckpt: Checkpoint, t: TensorInfo, a: Array) -> Array:
    if not t.st_dtype.decodable:  # a plan refuses this first (surgery.plan.plan.check_dtypes)
        raise dtype_refusal(t, ckpt.path, "decode its values")
    return bf16_bits_to_f32(a) if ckpt.logical_dtype(t) == "bfloat16" else a.astype(np.float32)


def _encode(ckpt: Checkpoint, t: TensorInfo, x: Array) -> Array:
    if not t.st_dtype.decodable:
        raise dtype_refusal(t, ckpt.path, "encode new values")
    if ckpt.logical_dtype(t) == "bfloat16":
        return f32_to_bf16_bits(x)
    return x.astype(t.storage_dtype)


def new_rows(
    old: Array,
    n: int,
    init: Init | str,
    rng: np.random.Generator,
    std: float,
    decode: Callable[[Array], Array] | None = None,
    chunk_rows: int = 8192,
) -> Array:
    """``n`` new rows ``[n, hidden]`` (float32) for a table whose stored rows are ``old`` ``[rows, hidden]``.

    Args:
        old: stored rows (any dtype; ``decode`` turns a chunk of them into float32, e.g. bf16 bits).
        init: ``mean``: as HF transformers' ``mean_resizing``: mean ``mu`` and population covariance ``C`` of
            the old rows in float32; rows drawn from N(mu, 1e-9 · C); exactly ``mu`` when ``1e-9 · C`` is not
            positive definite (Cholesky fails, or its smallest eigenvalue is within float32 rounding of zero,
            which a rank-deficient C only passes by rounding noise). ``zeros``. ``normal``: N(0, std²), std =
            config ``initializer_range`` (else 0.02).
        rng: the generator (seeded by ``--seed``).

    The mean and covariance are accumulated over row chunks (two passes, :func:`_mean_and_covariance`), so
    memory stays at one chunk plus the ``[hidden, hidden]`` covariance, whatever the vocabulary size.
    """
    h = old.shape[1]
    if n <= 0:
        return np.zeros((0, h), np.float32)
    if init == Init.ZEROS:
        return np.zeros((n, h), np.float32)
    if init == Init.NORMAL:
        return rng.normal(0.0, std, size=(n, h)).astype(np.float32)
    return _mean_rows(old, n, rng, decode or (lambda a: np.asarray(a, dtype=np.float32)), chunk_rows)


def _mean_rows(
    old: Array,
    n: int,
    rng: np.random.Generator,
    decode: Callable[[Array], Array],
    chunk_rows: int,
    index: Array | None = None,
) -> Array:
    """``n`` rows of HF ``mean_resizing`` over the rows of ``old`` (those of ``index`` when given): drawn
    from N(mu, 1e-9 · C), or exactly mu when that is not positive definite (:func:`new_rows`)."""
    h = old.shape[1]
    mu, cov = _mean_and_covariance(old, decode, chunk_rows, index)
    chol = _cholesky_if_definite(cov * 1e-9)
    if chol is None:
        return np.broadcast_to(mu, (n, h)).astype(np.float32)
    z = rng.standard_normal(size=(n, h))
    return (mu.astype(np.float64) + z @ chol.T).astype(np.float32)


def _mean_and_covariance(
    old: Array, decode: Callable[[Array], Array], chunk_rows: int, index: Array | None = None
) -> tuple[Array, Array]:
    """Mean ``[hidden]`` (float32, summed in float64) and population covariance ``[hidden, hidden]``
    (float64) of the rows of ``old`` (those of ``index`` when given), ``chunk_rows`` rows at a time."""
    rows, h = (old.shape[0] if index is None else len(index)), old.shape[1]

    def chunk(s: int) -> Array:
        got = old[s : s + chunk_rows] if index is None else old[index[s : s + chunk_rows]]
        return decode(np.asarray(got))

    total = np.zeros(h, np.float64)
    for s in range(0, rows, chunk_rows):
        total += chunk(s).sum(axis=0, dtype=np.float64)
    mu = (total / rows).astype(np.float32)
    cov = np.zeros((h, h), np.float64)
    for s in range(0, rows, chunk_rows):
        x = chunk(s) - mu
        cov += (x.T @ x).astype(np.float64)
    return mu, cov / rows


def _cholesky_if_definite(cov: Array) -> Array | None:
    """The Cholesky factor of ``cov``, or None when it is not finite or not positive definite beyond
    float32 rounding (smallest eigenvalue ≤ largest · hidden · float32 eps)."""
    if not np.isfinite(cov).all():
        return None
    try:
        chol = np.linalg.cholesky(cov)
        ev = np.linalg.eigvalsh(cov)
    except np.linalg.LinAlgError:
        return None
    return chol if bool(ev.min() > ev.max() * cov.shape[0] * np.finfo(np.float32).eps) else None
