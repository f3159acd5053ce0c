"""``transplant --init omp``: mergekit-tokensurgeon's orthogonal matching pursuit, in numpy.

Source: github.com/arcee-ai/mergekit at a6e40288, ``mergekit/tokensurgeon/omp.py`` ``batch_omp`` (the
algorithm, transcribed by :func:`batch_omp`) and ``mergekit/scripts/tokensurgeon.py``
``compute_new_embeddings`` / ``build_embedding_matrix`` / ``main`` (how it is used):

* the donor model's own tokenizer is the donor tokenizer (mergekit reads both from one folder; tietool
  refuses a donor model whose tokenizer files name other tokens);
* the shared tokens are the donor tokens whose string the old vocabulary has, in the donor's id order;
* each other donor token's *donor* embedding is approximated as a combination of ``k`` (``--k``, mergekit's
  default 64) of the shared tokens' donor embeddings, chosen greedily by the largest absolute inner product
  with the residual (no normalisation of the atoms: mergekit's ``--cosine-similarity`` applies only to its
  ``common_interpolation``), the coefficients the least-squares fit over the chosen atoms (Gram-Schmidt QR,
  norms clamped at ``eps = 1e-8``, re-orthogonalised every 256 atoms, a triangular solve at the end);
* the same ids and coefficients are applied to the *old* model's rows of those shared tokens, so the donor's
  hidden size may differ from the old model's;
* the LM head is approximated on its own: the donor's head rows (its embedding when the donor stores no head,
  mergekit's ``get_tied=True``) against the old model's head; a model whose head is its embedding (tied, or
  equal) gets the embedding's rows, as mergekit rebuilds only the tensors the model has.

Differences, all documented in the report: tietool decodes the donor's values to float32 (mergekit's
``work_dtype`` for bf16/f16; a float64 donor is computed in float32 here) and applies the coefficients in
float64, in the order of the chosen atoms, rounding once to the stored dtype (mergekit: a float32 ``bmm``);
it refuses ``k`` above the number of shared tokens (mergekit's ``ValueError``) or above the donor's hidden
size (mergekit runs on: the atoms past the hidden size are noise divided by a clamped norm).

Measured against mergekit's own ``batch_omp`` (torch 2.13, CPU) on random float32 matrices: the same ids
for every row and coefficients within 1e-6 of the largest for ``k`` 8 of hidden 16, 32 and 48 of 64, 64 of
256 and 300 of 512 (its re-orthogonalisation); at ``k`` = hidden size (64 of 64) the last atoms fit a
residual of float32 noise and the two libraries' roundings choose different ones (1 of 200 rows the same,
both fits within 2e-3 of the target).

Memory: the shared tokens' donor rows ``[S, D]`` and the new tokens' ``[T, D]`` in float32 (together at most
the donor table's rows in float32, read from a memory map), plus per batch of ``B`` new tokens the inner
products ``[B, S]`` and the basis ``[B, k, D]`` in float32, ``B`` chosen so each stays under
:data:`WORK_BYTES` (64 MB). Time: ``T * k * S * D`` multiply-adds (mergekit's, which runs it on a GPU);
measured on one core: 87 ms a token for S 30,000, D 1,024, k 64 (128 tokens: 11 s, peak RSS 391 MB of which
117 MB the shared rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..inspect.detection import Detection
from ..model.enums import EQUAL_STATES, HeadLayout, TransplantInit
from ..model.errors import CheckpointError, Opt, RefusedError
from ..model.tensor import bf16_bits_to_f32, dtype_refusal
from .transplant_rows import OmpRow, RowSource

Array = npt.NDArray[Any]

K_DEFAULT = 64
"""mergekit-tokensurgeon's ``--k`` default (``TokenSurgeonOptions.k``)."""
EPS = 1e-8
"""``batch_omp``'s ``eps``: the floor of a new atom's norm."""
REORTHOGONALIZE = 256
"""``batch_omp``'s ``reorthogonalize_interval``."""
WORK_BYTES = 1 << 26
"""Bytes of one per-batch work array (inner products, basis)."""


def batch_omp(targets: Array, points: Array, k: int, eps: float = EPS) -> tuple[Array, Array]:
    """mergekit's ``batch_omp`` (``mergekit/tokensurgeon/omp.py``) in numpy: for each row of ``targets``
    (``[B, D]`` float32) the ``k`` rows of ``points`` (``[N, D]`` float32) chosen greedily and the
    least-squares coefficients over them.

    Returns:
        ``(indices [B, k] int64, coef [B, k] float32)``: ``targets[b] ≈ coef[b] @ points[indices[b]]``.

    Raises:
        ValueError: ``k > N`` (mergekit's own check).
    """
    B, D = targets.shape
    N = points.shape[0]
    if k > N:
        raise ValueError(f"Cannot select {k} points from {N} candidates")
    t32 = np.asarray(targets, np.float32)
    q = np.zeros((B, k, D), np.float32)  # mergekit's q[:, :, t] is q[:, t] here
    r = np.zeros((B, k, k), np.float32)
    sel = np.zeros((B, k), np.int64)
    mask = np.zeros((B, N), bool)
    res = t32.copy()
    at = np.arange(B)
    for t in range(k):
        inner = np.abs(res @ points.T)
        inner[mask] = -np.inf
        new = inner.argmax(axis=1)  # the first maximum, as torch.max
        sel[:, t] = new
        mask[at, new] = True
        _add_atom(q, r, t, points[new], eps)
        if t > 0 and t % REORTHOGONALIZE == 0:
            _reorthogonalize(q, r, t)
        qt = np.matmul(q[:, : t + 1], t32[:, :, None])  # [B, t+1, 1]
        res = t32 - np.matmul(q[:, : t + 1].transpose(0, 2, 1), qt)[:, :, 0]
    y = np.matmul(q, t32[:, :, None])[:, :, 0]
    return sel, _solve_upper(r, y)


def _add_atom(q: Array, r: Array, t: int, atom: Array, eps: float) -> None:
    """Gram-Schmidt step ``t`` of ``batch_omp``: ``atom`` ``[B, D]`` orthogonalised against ``q[:, :t]``
    into ``q[:, t]``, its projections and (clamped) norm into column ``t`` of ``r``."""
    if t == 0:
        r[:, 0, 0] = np.linalg.norm(atom, axis=1)
        q[:, 0] = atom / np.maximum(r[:, 0, 0], np.float32(eps))[:, None]
        return
    proj = np.matmul(q[:, :t], atom[:, :, None])[:, :, 0]  # [B, t]
    resid = atom - np.matmul(q[:, :t].transpose(0, 2, 1), proj[:, :, None])[:, :, 0]
    norm = np.maximum(np.linalg.norm(resid, axis=1), np.float32(eps))
    r[:, :t, t] = proj
    r[:, t, t] = norm
    q[:, t] = resid / norm[:, None]


def _reorthogonalize(q: Array, r: Array, t: int) -> None:
    """``batch_omp``'s periodic QR of the basis ``q[:, :t+1]``, folded into ``r``."""
    qn, rn = np.linalg.qr(q[:, : t + 1].transpose(0, 2, 1))
    r[:, : t + 1, : t + 1] = np.matmul(rn, r[:, : t + 1, : t + 1])
    q[:, : t + 1] = qn.transpose(0, 2, 1)


def _solve_upper(r: Array, y: Array) -> Array:
    """``solve_triangular(r, y, upper=True)`` for a batch: ``c`` with ``r[b] @ c[b] = y[b]`` (float32)."""
    k = r.shape[1]
    c = np.zeros(y.shape, np.float32)
    for i in range(k - 1, -1, -1):
        c[:, i] = (y[:, i] - np.einsum("bj,bj->b", r[:, i, i + 1 :], c[:, i + 1 :])) / r[:, i, i]
    return c


def omp_rows(points: Array, targets: Array, old_ids: list[int], k: int) -> list[OmpRow]:
    """One :class:`OmpRow` per row of ``targets`` (``[T, D]`` float32): :func:`batch_omp` over ``points``
    (``[S, D]`` float32, the shared tokens' donor rows) in batches of at most :data:`WORK_BYTES` per work
    array, the chosen indices mapped to the old ids ``old_ids`` (``[S]``) of the same tokens."""
    S, D = points.shape
    B = max(1, min(512, WORK_BYTES // (4 * max(S, k * D))))
    out: list[OmpRow] = []
    for s in range(0, targets.shape[0], B):
        sel, coef = batch_omp(targets[s : s + B], points, k)
        for ids, c in zip(sel.tolist(), coef.tolist(), strict=True):
            out.append(OmpRow(tuple(old_ids[i] for i in ids), tuple(c)))
    return out


# ------------------------------------------------------------------------------------------ the donor model


@dataclass(frozen=True)
class DonorTables:
    """The donor model's tables an omp transplant reads: ``embedding`` and ``head`` (the same name when
    the donor stores no head), the head's vocabulary axis (1: ``[hidden, vocab]``), and ``path``."""

    path: Path
    embedding: str
    head: str
    head_axis: int


def open_donor(path: Path, tokens: int, need_head: bool) -> tuple[Any, DonorTables]:
    """The donor model's checkpoint and tables, with ``tokens`` the donor tokenizer's length.

    Raises:
        RefusedError: the folder is not a checkpoint tietool reads, its embedding (or head, ``need_head``)
            has fewer rows than the donor tokenizer has tokens, or a dtype tietool cannot decode.
    """
    from ..inspect.detect import detect
    from ..io.checkpoint import Checkpoint

    fix = (
        f"pass {Opt('donor_model')} the donor's checkpoint folder (the model whose tokenizer "
        f"{Opt('tokenizer')} is)"
    )
    try:
        ckpt = Checkpoint.open(path)
        det = detect(ckpt, compare_values=False)
    except (CheckpointError, OSError) as e:
        raise RefusedError(
            f"transplant refused: the donor model {path} cannot be read ({e})", path, fix
        ) from e
    tables = _tables(det, path)
    names = [tables.embedding] + ([tables.head] if need_head else [])
    for name in names:
        t = ckpt.tensors[name]
        rows = t.shape[tables.head_axis if name == tables.head and name != tables.embedding else 0]
        if rows < tokens:
            raise RefusedError(
                f"transplant refused: the donor model's {name} has {rows} rows but the donor tokenizer "
                f"{tokens} tokens",
                path,
                fix,
            )
        if not t.st_dtype.decodable:
            raise dtype_refusal(t, path, "decode the donor's values")
    return ckpt, tables


def _tables(det: Detection, path: Path) -> DonorTables:
    """The donor's embedding and head names (the embedding as head when the donor stores none)."""
    emb = det.embedding.name if det.embedding.present else det.head.name
    if not det.head.present:
        return DonorTables(path, emb, emb, 0)
    if det.head.layout not in (HeadLayout.VOCAB_HIDDEN, HeadLayout.HIDDEN_VOCAB):
        raise RefusedError(
            f"transplant refused: the donor model's head {det.head.name} has no usable layout",
            path,
            "pass a donor model whose head tietool inspect reads",
        )
    return DonorTables(path, emb, det.head.name, 1 if det.head.layout == HeadLayout.HIDDEN_VOCAB else 0)


def donor_rows(ckpt: Any, tables: DonorTables, head: bool, ids: list[int]) -> Array:
    """The donor's rows ``ids`` (``[len(ids), hidden]`` float32) of its embedding, or of its head
    (``head``; the embedding's when it stores none), gathered from a memory map of the tensor."""
    name = tables.head if head else tables.embedding
    axis = tables.head_axis if name == tables.head and name != tables.embedding else 0
    a = np.asarray(ckpt.load(name))
    idx = np.asarray(ids, np.int64)
    x = np.take(a, idx, axis=axis)
    x = x.T if axis == 1 else x
    if ckpt.logical_dtype(ckpt.tensors[name]) == "bfloat16":
        return np.ascontiguousarray(bf16_bits_to_f32(x))
    return np.ascontiguousarray(x, dtype=np.float32)


# ------------------------------------------------------------------------------------------- the planner


@dataclass(frozen=True)
class OmpPlan:
    """What an omp transplant gives each vocabulary tensor: ``embedding`` rows (every table but an own
    head), ``head`` rows (None: the model has no head of its own values), and the report's ``omp`` part."""

    embedding: tuple[RowSource, ...]
    head: tuple[RowSource, ...] | None
    section: dict[str, Any]


def refuse_omp_surface(det: Detection) -> None:
    """What omp refuses in the model: tables mergekit has no omp rule for (a head bias, extra vocabulary
    tables, vocabulary aliases)."""
    others = (
        ([det.bias.name] if det.bias else []) + list(det.beyond.extra_tables) + det.embedding.vocab_aliases
    )
    if others:
        raise RefusedError(
            f"transplant refused: {Opt('init', TransplantInit.OMP)} has no rule for {others[0]} (mergekit "
            "approximates only the embedding and the LM head)",
            det.ckpt.path,
            f"use {Opt('init', TransplantInit.SUBWORD)} or {Opt('init', TransplantInit.MEAN)}",
        )


def plan_omp(det: Detection, rows: list[RowSource], tokens: int, donor_model: Path, k: int) -> OmpPlan:
    """The rows of an omp transplant: ``rows`` (one per donor id: an old id where the token is shared,
    anything else where it is made) with each made row an :class:`OmpRow` (module docstring), for the
    embedding and, when the model's head has values of its own, for the head.

    Raises:
        RefusedError: as :func:`open_donor` and :func:`refuse_omp_surface`; ``k`` above the shared tokens
            or the donor's hidden size.
    """
    refuse_omp_surface(det)
    own_head = det.head_info is not None and not _head_is_embedding(det)
    ckpt, tables = open_donor(Path(donor_model), tokens, own_head)
    shared = [j for j, r in enumerate(rows) if isinstance(r, int) and r >= 0]
    made = [j for j, r in enumerate(rows) if not (isinstance(r, int) and r >= 0)]
    old_ids = [r for r in rows if isinstance(r, int) and r >= 0]
    out: dict[str, tuple[RowSource, ...]] = {}
    section: dict[str, Any] = {"donor_model": str(donor_model), "k": k, "method": "mergekit batch_omp"}
    for which in ["embedding"] + (["head"] if own_head else []):
        points = donor_rows(ckpt, tables, which == "head", shared)
        _refuse_k(det, k, points.shape)
        made_rows = (
            omp_rows(points, donor_rows(ckpt, tables, which == "head", made), old_ids, k) if made else []
        )
        new = list(rows)
        for j, m in zip(made, made_rows, strict=True):
            new[j] = m
        out[which] = tuple(new)
        section[which] = {"ids": [list(m.ids) for m in made_rows], "coef": [list(m.coef) for m in made_rows]}
        section[f"{which}_donor_tensor"] = tables.head if which == "head" else tables.embedding
    return OmpPlan(out["embedding"], out.get("head"), section)


def _head_is_embedding(det: Detection) -> bool:
    """The model's head takes the embedding's rows in a transplant (tied, or equal in value and dtype)."""
    h = det.head_info
    return h is not None and det.comparison.values in EQUAL_STATES and h.dtype == det.emb_info.dtype


def _refuse_k(det: Detection, k: int, shape: tuple[int, ...]) -> None:
    """``k`` must be at least 1 and at most the shared tokens and the donor's hidden size."""
    S, D = shape
    if not 1 <= k <= min(S, D):
        raise RefusedError(
            f"transplant refused: {Opt('k', k)} atoms from {S} shared tokens of donor hidden size {D} (omp "
            "needs 1 <= k <= both)",
            det.ckpt.path,
            f"pass {Opt('k', max(1, min(S, D, K_DEFAULT)))} or less",
        )
