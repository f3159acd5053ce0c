"""The folder a mean-setting run (``fix-untrained``, ``rename-tokens --init trained-mean``) read, when its
earlier runs in the chain only grew, trimmed or appended vocabulary rows (``resize``, ``add-tokens``) or set
other rows (``fix-untrained``, ``rename-tokens``), and its later runs only set rows in place: ``resize 400 →
fix-untrained`` computes its mean over the 400 rows of the resized folder, not over the input's;
``rename-tokens --init trained-mean`` after another rename computes it with that rename's rows trained.

That folder is the output itself but for the rows that run and the runs after it set: they changed nothing
else, and those rows came to it from the input unchanged (a resize keeps the common rows bit for bit;
add-tokens, rename-tokens and fix-untrained set only the rows of the ids they list; the rows fix-untrained
read to set them are required to be other rows than the earlier runs listed, while a renamed row's old value
is never read). So :class:`BeforeSet` is the output with those rows of its embedding and head taken back
from the input; the claims are then checked against it as against any input
(:func:`surgery.verify.vocab.fixed_rows`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..inspect.detection import Detection
from ..io.checkpoint import Checkpoint, array_rows
from ..plan.fix_untrained import tables
from ..report import chain_since

GROWS = ("resize", "add-tokens")
SETS = ("fix-untrained", "rename-tokens")  # set rows in place: other ids than the last run's


@dataclass
class BeforeSet(Checkpoint):
    """The output with entries ``ids`` of the tables ``patch`` (name → vocabulary axis) read from
    ``before`` (the chain's input); every other byte the output's. Never written."""

    before: Checkpoint | None = None
    patch: dict[str, int] = field(default_factory=dict)
    ids: tuple[int, ...] = ()

    def load(self, name: str) -> np.ndarray[Any, Any]:
        """Tensor ``name`` as stored (bf16 as ``uint16`` bits), entries ``ids`` of a patched table the
        input's."""
        a = super().load(name)
        if name not in self.patch or self.before is None:
            return a
        a, src, ids = np.array(a), self.before.load(name), list(self.ids)
        if self.patch[name] == 0:
            a[ids] = src[ids]
        else:
            a[:, ids] = src[:, ids]
        return a

    def iter_rows(self, name: str, chunk_rows: int, start: int = 0, stop: int | None = None) -> Any:
        """Rows ``start:stop`` of :meth:`load`'s array in chunks (an unpatched tensor: the output's)."""
        if name not in self.patch:
            yield from super().iter_rows(name, chunk_rows, start, stop)
        else:
            yield from array_rows(self.load(name), chunk_rows, start, stop)


def before_set(
    da: Detection, B: Checkpoint, at: int, ids: list[int], own: list[int] | None = None
) -> BeforeSet | None:
    """The folder run ``at`` of the output's chain since the input read (module docstring): the output
    with entries ``ids`` (the rows that run and the runs after it set) taken back from the input; or None
    when the chain is not of that shape: ``at`` is its first run or beyond it, an earlier run is not a
    resize, add-tokens, fix-untrained or rename-tokens, a later run sets no rows in place (fix-untrained,
    rename-tokens), an id of ``own`` (the rows the run read to set them: fix-untrained's) is one an
    earlier run lists (:func:`_listed`), an id is beyond either folder's rows, or the input's embedding /
    head is not in the output with the same size off the vocabulary axis."""
    A = da.ckpt
    runs = chain_since(B.path, A.path)
    if not 0 < at < len(runs):
        return None
    if any(r.get("operation") not in GROWS + SETS for r in runs[:at]):
        return None
    if any(r.get("operation") not in SETS for r in runs[at + 1 :]) or set(own or ()) & _listed(runs[:at]):
        return None
    emb, head, _ = tables(da)
    patch = {}
    for t in [emb] + ([head] if head is not None else []):
        ta, tb = A.tensors.get(t.name), B.tensors.get(t.name)
        if ta is None or tb is None or len(ta.shape) != 2 or len(tb.shape) != 2:
            return None
        other = 1 - t.axis
        if ta.shape[other] != tb.shape[other] or ta.dtype != tb.dtype:
            return None
        if not all(0 <= i < min(ta.shape[t.axis], tb.shape[t.axis]) for i in ids):
            return None
        patch[t.name] = t.axis
    fields = {f.name: getattr(B, f.name) for f in dataclasses.fields(Checkpoint) if f.init}
    return BeforeSet(**fields, before=A, patch=patch, ids=tuple(ids))


def _listed(runs: list[dict[str, Any]]) -> set[int]:
    """Every id a section of ``runs`` lists: ``add_tokens`` (new tokens, rows reset), ``rename_tokens``
    (renamed slots) and ``fix_untrained`` (rows set) tokens and ids."""
    out = set()
    for r in runs:
        for key in ("add_tokens", "rename_tokens", "fix_untrained"):
            sec = r.get(key)
            if not isinstance(sec, dict):
                continue
            out |= {i for i in sec.get("ids") or [] if type(i) is int}
            out |= {
                t["id"] for t in sec.get("tokens") or [] if isinstance(t, dict) and type(t.get("id")) is int
            }
    return out


@dataclass
class WithRows(Checkpoint):
    """A checkpoint with entries of some tables given: ``rows`` maps a table's name to its vocabulary axis
    and ``{id: entry}`` (each ``[hidden]``, in the stored dtype; bf16 as ``uint16`` bits); every other byte
    the checkpoint's. Never written."""

    rows: dict[str, tuple[int, dict[int, np.ndarray[Any, Any]]]] = field(default_factory=dict)

    def load(self, name: str) -> np.ndarray[Any, Any]:
        """Tensor ``name`` as stored, the given entries of a table replaced."""
        a = super().load(name)
        if name not in self.rows:
            return a
        axis, got = self.rows[name]
        a, ids = np.array(a), sorted(got)
        vals = np.stack([got[i] for i in ids]).view(a.dtype)
        if axis == 0:
            a[ids] = vals
        else:
            a[:, ids] = vals.T
        return a

    def iter_rows(self, name: str, chunk_rows: int, start: int = 0, stop: int | None = None) -> Any:
        """Rows ``start:stop`` of :meth:`load`'s array in chunks (an untouched tensor: the checkpoint's)."""
        if name not in self.rows:
            yield from super().iter_rows(name, chunk_rows, start, stop)
        else:
            yield from array_rows(self.load(name), chunk_rows, start, stop)


def with_rows(ck: Checkpoint, rows: dict[str, tuple[int, dict[int, np.ndarray[Any, Any]]]]) -> WithRows:
    """``ck`` (a :class:`WithRows` too) with the entries ``rows`` given over its own (:class:`WithRows`)."""
    merged = {k: (a, dict(v)) for k, (a, v) in ck.rows.items()} if isinstance(ck, WithRows) else {}
    for name, (axis, got) in rows.items():
        merged.setdefault(name, (axis, {}))[1].update(got)
    fields = {f.name: getattr(ck, f.name) for f in dataclasses.fields(Checkpoint) if f.init}
    return WithRows(**fields, rows=merged)
