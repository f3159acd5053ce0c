"""``verify`` of the training state a write keeps (``resize`` / ``add-tokens --keep-training-state``).

The contract (:mod:`surgery.plan.training_state`, :mod:`surgery.plan.flex_state`), checked here from the
files alone, independently of the code that wrote them: for every weight whose vocabulary axis moved
(:class:`Move`, found by comparing the two checkpoints' weights and the report's new token ids),

* each element-wise moment (AdamW's ``moment1``, ``moment2``, ``moment2_max``) keeps its old entries bit
  for bit, has zeros in the new entries and in the rows new tokens took below the old size (slack rows,
  ``rows_reset``), and has lost the trimmed ones;
* its master weight keeps its old entries bit for bit and holds, in the new entries and those slack rows,
  the float32 value of the output's weight (bf16 bits shifted: exact);
* every other entry (``beta1_pow_acc`` / ``beta2_pow_acc``, the state of weights that did not move, the
  scheduler and trainer files) is bit-identical.

``optimizer.pdopt`` is read by the allow-list walker (:func:`surgery.io.pdparams.read_optimizer_header`:
nothing is unpickled); a Trainer flex checkpoint's ``optimizer_state/`` and ``master_weight/`` tensor by
tensor, each assembled from the slices its ``.metadata`` places (:mod:`surgery.verify.flexstate`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..io import pdparams
from ..io.checkpoint import Checkpoint
from ..model.errors import Opt
from ..model.tensor import TensorInfo, bf16_bits_to_f32
from ..plan.training_state import KEPT, PDOPT, RESIZED
from .files import same_bytes
from .result import VerifyResult

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Move:
    """How one weight's vocabulary axis moved between input and output: ``axis`` from ``old`` to ``new``
    entries; ``fresh`` the entries below ``min(old, new)`` that new tokens took (their state starts anew)."""

    name: str
    axis: int
    old: int
    new: int
    fresh: tuple[int, ...] = ()

    def new_entries(self) -> list[int]:
        """The entries of the output whose values are new: the fresh ones, then the grown ones."""
        return [*self.fresh, *range(self.old, self.new)]


def moves(
    A: Any, B: Any, vocab_names: Iterable[str], vocab_rows: int, added: frozenset[int]
) -> dict[str, Move]:
    """``{weight name: Move}`` for every weight of both checkpoints whose shape changed on one axis, and
    every vocabulary weight (``vocab_names``) of one shape in which the report's new tokens (``added``
    ids) took rows below the input's ``vocab_rows``."""
    out: dict[str, Move] = {}
    names = set(vocab_names)
    for name, ta in A.tensors.items():
        tb = B.tensors.get(name)
        if tb is None or len(ta.shape) != len(tb.shape):
            continue
        axes = [i for i, (x, y) in enumerate(zip(ta.shape, tb.shape, strict=True)) if x != y]
        if len(axes) == 1:
            ax = axes[0]
        elif not axes and name in names and any(i < vocab_rows for i in added):
            hit = [i for i, n in enumerate(ta.shape[:2]) if n == vocab_rows]
            if not hit:
                continue
            ax = hit[0]
        else:
            continue
        old, new = ta.shape[ax], tb.shape[ax]
        fresh = tuple(sorted(i for i in added if i < min(old, new))) if name in names else ()
        out[name] = Move(name, ax, old, new, fresh)
    return out


def _at(axis: int, ndim: int, idx: Any) -> tuple[Any, ...]:
    return tuple(idx if i == axis else slice(None) for i in range(ndim))


def expected(a: Array, m: Move, weight: Callable[[], Array] | None = None) -> Array:
    """What the state ``a`` (shaped as the input's weight) must be in the output: the common entries of
    ``a``; zeros in the new and fresh ones (a moment), or, given the output's ``weight`` (a master weight),
    its float32 values there."""
    shape = list(a.shape)
    shape[m.axis] = m.new
    out = np.zeros(shape, dtype=a.dtype)
    k = min(m.old, m.new)
    out[_at(m.axis, a.ndim, slice(0, k))] = a[_at(m.axis, a.ndim, slice(0, k))]
    rows = m.new_entries()
    if rows:
        out[_at(m.axis, a.ndim, list(rows))] = 0
        if weight is not None:
            w = weight()
            out[_at(m.axis, a.ndim, list(rows))] = w[_at(m.axis, w.ndim, list(rows))].astype(a.dtype)
    return out


def as_f32(a: Array, bf16: bool) -> Array:
    """A weight's values as float32 (bf16 bits shifted, exact)."""
    return bf16_bits_to_f32(a) if bf16 else a.astype(np.float32)


def differs(want: Array, got: Array, axis: int | None) -> str:
    """Why ``got`` is not ``want`` bit for bit ("" when it is): its shape, or the entries on ``axis``
    (rows, columns) that differ."""
    if tuple(want.shape) != tuple(got.shape) or want.dtype.itemsize != got.dtype.itemsize:
        return f"{got.dtype} {list(got.shape)} where {want.dtype} {list(want.shape)} is expected"
    a = np.ascontiguousarray(want).view(np.uint8).reshape(want.shape + (-1,)) if want.ndim else want
    b = np.ascontiguousarray(got).view(np.uint8).reshape(got.shape + (-1,)) if got.ndim else got
    if np.array_equal(a, b):
        return ""
    if axis is None or want.ndim == 0:
        return "its values differ"
    other = tuple(i for i in range(a.ndim) if i != axis)
    bad = np.flatnonzero((a != b).any(axis=other))
    what = "rows" if axis == 0 else "columns" if axis == 1 else f"entries on axis {axis}"
    shown = ", ".join(map(str, bad[:5].tolist())) + (", ..." if bad.size > 5 else "")
    return f"{bad.size} {what} differ ({shown})"


def rule(acc: str, m: Move | None, master: bool) -> str:
    """The rule one state entry follows, in words."""
    if m is None or (not master and acc not in RESIZED):
        return "unchanged"
    fill = "the float32 of the output's weight" if master else "zero"
    return f"resized with {m.name} on axis {m.axis} ({m.old} → {m.new}), new and fresh entries {fill}"


def check_entry(
    res: VerifyResult,
    where: str,
    key: str,
    a: Array,
    b: Array,
    m: Move | None,
    master: Callable[[], Array] | None,
    acc: str,
) -> None:
    """Check one state entry ``key`` (input ``a``, output ``b``) against its rule; record it in
    ``res.training_state`` and a broken rule in ``res.unexplained``."""
    resized = m is not None and (master is not None or acc in RESIZED)
    want = expected(a, m, master) if resized and m is not None else a
    why = differs(want, b, m.axis if m is not None else 0)
    how = rule(acc, m, master is not None)
    res.training_state.append({"file": where, "key": key, "rule": how, "equal": not why})
    if why:
        res.unexplained.append(f"{where}: {key} is not {how}: {why}")


# ------------------------------------------------------------------ optimizer.pdopt


def _param_of(key: str) -> tuple[str, str]:
    """``(parameter name, accumulator)`` of a ``.pdopt`` accumulator name (``embedding_0.w_0_moment1_0`` →
    ``(embedding_0.w_0, moment1)``; with master weights ``..._fp32_master_0_moment1_0``); ``(key, "")``
    for a name of no known accumulator."""
    for acc in (*RESIZED, *KEPT):
        head, sep, n = key.rpartition(f"_{acc}_")
        if sep and n.isdigit():
            return head.removesuffix("_fp32_master_0"), acc
    return key, ""


def compare_pdopt(res: VerifyResult, A: Checkpoint, B: Checkpoint, mv: dict[str, Move]) -> None:
    """``optimizer.pdopt`` of the output against the input's, entry by entry (headers by the allow-list
    walker; one entry in memory at a time): the same entries, names and non-tensor entries
    (``LR_Scheduler``, ``StructuredToParameterName@@``); each accumulator and master weight as its rule
    says (:func:`check_entry`)."""
    pa, pb = A.path / PDOPT, B.path / PDOPT
    ha = pdparams.read_optimizer_header(pa, PDOPT)
    hb = pdparams.read_optimizer_header(pb, PDOPT)
    s2p: dict[str, str] = {}
    for ex in A.extras.values():
        m = ex.get("StructuredToParameterName@@")
        if isinstance(m, dict):
            s2p.update({v: k for k, v in m.items() if isinstance(k, str) and isinstance(v, str)})
    by_param = {p: mv[n] for p, n in s2p.items() if n in mv}
    for label, xs, ys in (("accumulator", ha.tensors, hb.tensors), ("master weight", ha.master, hb.master)):
        got = {t.name: t for t in ys}
        for t in xs:
            tb = got.pop(t.name, None)
            if tb is None:
                res.unexplained.append(f"{PDOPT}: the {label} {t.name} is not in the output")
                continue
            param, acc = (t.name, "") if label == "master weight" else _param_of(t.name)
            mm = by_param.get(param)
            master = _weight_f32(B, mm.name) if label == "master weight" and mm is not None else None
            a, b = _read(pa, t), _read(pb, tb)
            check_entry(res, PDOPT, t.name, a, b, mm, master, acc)
        for n in sorted(got):
            res.unexplained.append(f"{PDOPT}: the {label} {n} is in the output, not in the input")
    if ha.extras != hb.extras:
        keys = sorted(k for k in set(ha.extras) | set(hb.extras) if ha.extras.get(k) != hb.extras.get(k))
        res.unexplained.append(f"{PDOPT}: its non-tensor entries {keys} differ from the input's")
    if ha.names != hb.names:
        res.unexplained.append(f"{PDOPT}: the tensors' stored names differ from the input's")


def _read(path: Any, t: TensorInfo) -> Array:
    return np.asarray(pdparams.read_array(path, t))


def _weight_f32(B: Checkpoint, name: str) -> Callable[[], Array]:
    """The output's weight ``name`` as float32, read when asked."""

    def get() -> Array:
        t = B.tensors[name]
        return as_f32(np.asarray(B.load(name)), B.logical_dtype(t) == "bfloat16")

    return get


def compare_training_files(res: VerifyResult, A: Checkpoint, B: Checkpoint, mv: dict[str, Move]) -> None:
    """The training-state files beside the weights (``Checkpoint.training_state``): each one the output
    holds is the input's, byte for byte, but ``optimizer.pdopt``, which may be resized as the weights were
    (:func:`compare_pdopt`). One the output left out is a note (a write without
    ``--keep-training-state`` leaves the stale state out, and its report lists it); one only in the
    output is unexplained."""
    ta, tb = set(A.training_state), set(B.training_state)
    for rel in sorted(tb - ta):
        res.unexplained.append(f"{rel} is training state in the output, and the input has none such")
    for rel in sorted(ta - tb):
        res.notes.append(f"{rel} (training state) is left out of the output")
    for rel in sorted(ta & tb):
        if rel == PDOPT and (mv or not same_bytes(A.path / rel, B.path / rel)):
            compare_pdopt(res, A, B, mv)  # a copy left at the old shapes is wrong when weights moved
        elif same_bytes(A.path / rel, B.path / rel):
            res.training_state.append({"file": rel, "key": None, "rule": "unchanged", "equal": True})
        else:
            res.unexplained.append(f"{rel} (training state) differs from the input's")
    if ta & tb and mv:
        summarize(res)


def summarize(res: VerifyResult) -> None:
    """The note that counts the training-state entries checked against their rules."""
    ok = sum(1 for e in res.training_state if e["equal"])
    moved = sum(1 for e in res.training_state if e["rule"] != "unchanged")
    res.notes.append(
        f"training state: {ok} of {len(res.training_state)} entries as {Opt('keep_training_state', True)} "
        "writes them "
        f"({moved} resized with their weight: old entries bit for bit, new entries zero or, for a master "
        "weight, the float32 of the output's weight; the rest unchanged)"
    )
