"""Recipes: what the data of a new tensor is, as plain data; :func:`make` computes it while writing.

A plan (:mod:`surgery.plan.plan`) says which tensor gets which recipe; the writer
(:mod:`surgery.write.writer`) calls
:func:`make` with one memo per execution, keyed by recipe. Recipes are frozen dataclasses, so they compare
equal when they describe the same data: an embedding's resized table, its aliases and a head equal to it
share one computed array, one random draw. Nothing here reads data until :func:`make` is called.

Where a recipe is the input's bytes unchanged (or a prefix of them), :func:`make` returns a
:class:`~surgery.io.safetensors_io.Source` of that byte range, streamed by the writer without decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..inspect.detect import compare
from ..io.checkpoint import Checkpoint
from ..io.safetensors_io import Source
from ..model.enums import HeadLayout, Init, TieState
from ..model.tensor import TensorInfo, bf16_bits_to_f32, dtype_refusal, f32_to_bf16_bits


@dataclass(frozen=True)
class CopyOf:
    """The stored values of tensor ``name`` (2-D), transposed when ``transpose`` (contiguous), times
    ``scale`` when given (in float32, rounded back to the stored dtype; bf16 bits stay bf16 bits).

    Untouched (no transpose, no scale, C order) it is the input's byte range, streamed, never decoded.
    """

    name: str
    transpose: bool = False
    scale: float | None = None


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


Recipe = CopyOf | NewRows | ResizedTable | ResizedBias | CopyIfEqual | TokenRows
Data = np.ndarray | Source


def parts(recipe: Recipe) -> tuple[Recipe, ...]:
    """The recipes ``recipe`` is made from (whose data :func:`make` memoizes too)."""
    if isinstance(recipe, ResizedTable):
        return (recipe.rows,) if recipe.rows is not None else ()
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
    if isinstance(recipe, ResizedBias):
        return [Use(recipe.name, "resize it", True)]
    if isinstance(recipe, TokenRows):  # whole rows kept or repeated: elements moved, never computed with
        return [Use(recipe.name, "resize it", False)]
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
    if isinstance(recipe, TokenRows):
        fill = "repeating existing rows" if recipe.cycle else "new ones zero"
        return f"{recipe.name} to {recipe.new} rows ({fill})"
    return f"{describe(recipe.copy)} if {recipe.name} equals {recipe.main}, else {describe(recipe.own)}"


def make(recipe: Recipe, ckpt: Checkpoint, memo: dict[Recipe, Data]) -> Data:
    """The data of ``recipe``: an array (stored dtype, bf16 as ``uint16`` bits) or a :class:`Source` of the
    input's bytes. Computed once per ``memo`` (the writer's, one per execution), sub-recipes included.

    Raises:
        OSError: reading the input fails.
    """
    if recipe not in memo:
        memo[recipe] = _build(recipe, ckpt, lambda r: make(r, ckpt, memo))
    return memo[recipe]


def _build(recipe: Recipe, ckpt: Checkpoint, get: Callable[[Recipe], Data]) -> Data:
    if isinstance(recipe, CopyOf):
        return _copy_of(recipe, ckpt)
    if isinstance(recipe, NewRows):
        return _new_rows_of(recipe, ckpt)
    if isinstance(recipe, ResizedTable):
        return _resized(recipe, ckpt, get)
    if isinstance(recipe, ResizedBias):
        a = ckpt.load(recipe.name)
        old, new = a.shape[-1], recipe.new
        if new <= old:
            return np.ascontiguousarray(a[..., :new])
        return np.concatenate([a, np.zeros(a.shape[:-1] + (new - old,), dtype=a.dtype)], axis=-1)
    if isinstance(recipe, TokenRows):
        return _token_rows(recipe, ckpt)
    m, t = ckpt.tensors[recipe.main], ckpt.tensors[recipe.name]
    same = m.shape == t.shape and m.dtype == t.dtype
    if same and compare(ckpt, recipe.main, recipe.name, HeadLayout.VOCAB_HIDDEN).values is TieState.EXACT:
        return get(recipe.copy)
    return get(recipe.own)


def _token_rows(r: TokenRows, ckpt: Checkpoint) -> np.ndarray:
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
    a = ckpt.load(r.name)
    if r.scale is not None:
        bf16 = ckpt.logical_dtype(t) == "bfloat16"
        x = (bf16_bits_to_f32(a) if bf16 else a.astype(np.float32)) * np.float32(r.scale)
        a = f32_to_bf16_bits(x) if bf16 else x.astype(a.dtype)
    return np.ascontiguousarray(a.T) if r.transpose else a


def _new_rows_of(r: NewRows, ckpt: Checkpoint) -> np.ndarray:
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

    def extra() -> np.ndarray:
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


# ------------------------------------------------------------------ new rows


def _decode(ckpt: Checkpoint, t: TensorInfo, a: np.ndarray) -> np.ndarray:
    if not t.st_dtype.decodable:  # a plan refuses this first (surgery.plan.plan.check_dtypes)
        raise dtype_refusal(t, ckpt.path, "decode its values")
    return bf16_bits_to_f32(a) if ckpt.logical_dtype(t) == "bfloat16" else a.astype(np.float32)


def _encode(ckpt: Checkpoint, t: TensorInfo, x: np.ndarray) -> np.ndarray:
    if not t.st_dtype.decodable:
        raise dtype_refusal(t, ckpt.path, "encode new values")
    if ckpt.logical_dtype(t) == "bfloat16":
        return f32_to_bf16_bits(x)
    return x.astype(t.storage_dtype)


def new_rows(
    old: np.ndarray,
    n: int,
    init: Init | str,
    rng: np.random.Generator,
    std: float,
    decode: Callable[[np.ndarray], np.ndarray] | None = None,
    chunk_rows: int = 8192,
) -> np.ndarray:
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
    mu, cov = _mean_and_covariance(old, decode or (lambda a: np.asarray(a, dtype=np.float32)), chunk_rows)
    chol = _cholesky_if_definite(cov * 1e-9)
    if chol is None:
        return np.broadcast_to(mu, (n, h)).astype(np.float32)
    z = rng.standard_normal(size=(n, h))
    return (mu.astype(np.float64) + z @ chol.T).astype(np.float32)


def _mean_and_covariance(
    old: np.ndarray, decode: Callable[[np.ndarray], np.ndarray], chunk_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``[hidden]`` (float32, summed in float64) and population covariance ``[hidden, hidden]``
    (float64) of the rows of ``old``, ``chunk_rows`` rows at a time."""
    rows, h = old.shape
    total = np.zeros(h, np.float64)
    for s in range(0, rows, chunk_rows):
        total += decode(np.asarray(old[s : s + chunk_rows])).sum(axis=0, dtype=np.float64)
    mu = (total / rows).astype(np.float32)
    cov = np.zeros((h, h), np.float64)
    for s in range(0, rows, chunk_rows):
        x = decode(np.asarray(old[s : s + chunk_rows])) - mu
        cov += (x.T @ x).astype(np.float64)
    return mu, cov / rows


def _cholesky_if_definite(cov: np.ndarray) -> np.ndarray | None:
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
