"""The two sides of a ``diff``: a checkpoint folder (local or a URL, safetensors or ``.pdparams``), or rank
files and flex checkpoints seen as the whole checkpoint ``merge`` would write of them, never written.

A :class:`Side` is the tensors (a :class:`~surgery.io.checkpoint.Checkpoint`, whose :meth:`iter_rows` the
comparison reads in chunks), the config, the other files by relative name, and where the tokenizer files
are. The merged views are :class:`PlannedView`: the tensors of a planned new checkpoint
(a :class:`~surgery.plan.plan.Plan`), each made from its recipe on demand (one tensor held at a time), so the
rank files and ``.distcp`` slices are read as ``merge`` reads them, by the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from ..io import flex, store, stores, surface
from ..io.checkpoint import CONFIG_FILES, REPORT_NAME, Checkpoint, has_whole
from ..io.safetensors_io import Source
from ..model.enums import Container, Target
from ..model.errors import Opt
from ..model.tensor import TensorInfo
from ..plan.plan import Plan

# the shard limit of a merged view: its shards are never written, so one is as good as any
_NO_LIMIT = 1 << 62


class SideKind(str, Enum):
    """What a side of a diff was read as."""

    CHECKPOINT = "checkpoint"  # a whole checkpoint folder (or URL)
    RANK_FILES = "rank files"  # tensor/pipeline/expert-parallel rank files, merged as `merge` merges them
    FLEX = "flex"  # a flex checkpoint (`.distcp` + `.metadata`), assembled as `merge` assembles it


@dataclass
class PlannedView(Checkpoint):
    """The tensors of a planned new checkpoint as a :class:`Checkpoint` that is never written:
    headers from the plan (safetensors labels, no file), data made from each tensor's recipe on demand
    (:func:`surgery.plan.recipes.make`; bf16 as ``uint16`` bits, never converted). The last tensor made is
    kept, so that reading it again in chunks makes it once; memory: one whole tensor."""

    recipes: dict[str, Any] = field(default_factory=dict)
    recipe_source: Checkpoint | None = None
    _last: tuple[str, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def load(self, name: str) -> np.ndarray:
        """Tensor ``name`` made from its recipe (stored dtype, C order)."""
        from ..plan.recipes import make  # the planners: imported for a merged view only

        if self._last is None or self._last[0] != name:
            self._last = None  # dropped before the next is made: one tensor at a time
            t = self.tensors[name]
            data = make(self.recipes[name], self.recipe_source, {})
            a = data if isinstance(data, np.ndarray) else _source_bytes(data)
            flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            self._last = (name, flat.view(self.fmt.row_dtype(t)).reshape(t.shape))
        return self._last[1]

    def iter_rows(self, name: str, chunk_rows: int, start: int = 0, stop: int | None = None):
        """Rows ``start:stop`` of the made tensor in chunks of ``chunk_rows`` (views, no copy)."""
        a = self.load(name)
        if a.ndim == 0:
            yield a
            return
        stop = a.shape[0] if stop is None else stop
        for s in range(start, stop, chunk_rows):
            yield a[s : min(s + chunk_rows, stop)]


def _source_bytes(src: Source) -> np.ndarray:
    """The bytes a :class:`Source` names (byte ranges of files, arrays, or parts of those), as one array."""
    out = np.empty(src.nbytes, np.uint8)
    pos = 0
    for part in _flat_parts(src):
        if part.array is not None:
            b = np.ascontiguousarray(part.array).reshape(-1).view(np.uint8)
        else:
            b = np.frombuffer(store.read_range(part.path, part.offset, part.nbytes), np.uint8)
        out[pos : pos + b.size] = b
        pos += b.size
    return out


def _flat_parts(src: Source) -> list[Source]:
    if src.parts is None:
        return [src]
    return [q for p in src.parts for q in _flat_parts(p)]


def _view(plan: Plan, root: Path) -> PlannedView:
    """The :class:`PlannedView` of the new checkpoint ``plan`` writes (its config, its tensors, read from its
    source) rooted at ``root``."""
    new = plan.reshard
    tensors = {t.name: TensorInfo(t.name, t.dtype, tuple(t.shape), "", -1, _nbytes(t)) for t in new.tensors}
    view = PlannedView(root, dict(new.config), Container.SAFETENSORS, False, None, None, [], tensors)
    view.recipes = {t.name: t.recipe for t in new.tensors}
    view.recipe_source = plan.source
    view.st_metadata = {"model.safetensors": dict(new.st_metadata)} if new.st_metadata else {}
    return view


def _nbytes(t: Any) -> int:
    info = TensorInfo(t.name, t.dtype, tuple(t.shape), "", -1, 0)
    return info.st_dtype.nbytes(info.numel)


@dataclass
class Side:
    """One side of a diff.

    Attributes:
        path: the folder or URL as given.
        kind: how it was read (:class:`SideKind`).
        ckpt: its tensors and config (a :class:`PlannedView` for rank files and flex checkpoints).
        files: every other file by relative name → its path (a local ``Path`` or a remote path); for a
            merged view, the files ``merge`` would carry.
        tokenizer: the folder whose tokenizer files are the side's.
        notes: how the side was read, worded for the user.
    """

    path: Any
    kind: SideKind
    ckpt: Checkpoint
    files: dict[str, Any]
    tokenizer: Any
    notes: list[str] = field(default_factory=list)


def open_side(path: Any) -> Side:
    """Open one side: a flex checkpoint with no whole-model weights beside it, or a folder of rank files,
    as the merged view (:func:`merged_flex`, :func:`merged_ranks`); anything else as
    :meth:`Checkpoint.open` opens it for reading (a quantized or adapter-wrapped checkpoint too: its
    tensors are compared as stored).

    Raises:
        CheckpointError, UnsafePickleError, RefusedError, StorageError: as :meth:`Checkpoint.open`,
            :func:`surgery.plan.merge_flex.plan_flex` and :func:`surgery.plan.merge_experts.plan_rank_merge`
            raise them (a rank folder whose slices ``merge`` would refuse is refused here too).
    """
    local = stores.local_root(path)
    if local is not None:
        names = {p.name for p in local.iterdir()} if local.is_dir() else set()
        if flex.find(local) is not None and not has_whole(names):
            return merged_flex(local)
        if names and surface.rank_files(names) and not has_whole(names):
            return merged_ranks(local)
    ck = Checkpoint.open(path, for_edit=False)
    return Side(path, SideKind.CHECKPOINT, ck, _checkpoint_files(ck), ck.path)


def _checkpoint_files(ck: Checkpoint) -> dict[str, Any]:
    """The non-weight files of ``ck`` (carried files and training state) but its config file (compared key
    by key) and ``tietool-report.json`` (a record of how a write was made, not part of the checkpoint:
    :func:`has_report` tells it)."""
    skip = {*CONFIG_FILES, REPORT_NAME}
    return {rel: ck.path / rel for rel in sorted([*ck.other_files, *ck.training_state]) if rel not in skip}


def has_report(side: Side) -> bool:
    """The side's folder holds a ``tietool-report.json`` (a merged view: never; merge writes a new one)."""
    return side.kind is SideKind.CHECKPOINT and (side.ckpt.path / REPORT_NAME).is_file()


def merged_ranks(src: Path) -> Side:
    """Rank files (tensor/pipeline or expert-parallel) as the checkpoint ``merge`` writes of them (the
    same plan: :func:`surgery.plan.merge_experts.plan_rank_merge`)."""
    from ..plan import merge as merge_plan
    from ..plan.merge_experts import plan_rank_merge

    plan = plan_rank_merge(src)
    view = _view(merge_plan.output_plan(plan, _NO_LIMIT), src)
    files = {rel: p for p, rel in plan.carry if rel not in CONFIG_FILES}
    note = f"{src}: {len(plan.rank_files)} rank files read as the checkpoint `merge` writes of them"
    return Side(src, SideKind.RANK_FILES, view, files, src, [note])


def merged_flex(src: Path) -> Side:
    """A flex checkpoint as the checkpoint ``merge`` writes of it: converted to the PaddleFormers layout
    where the model type's conversion is proven (:func:`surgery.plan.merge_flex.convertible`), else in the
    Paddle layout it was saved in (as merge with ``keep_paddle_layout`` writes it)."""
    from ..plan import convert as convert_plan
    from ..plan import merge_flex

    fp = merge_flex.tie_checked(merge_flex.plan_flex(src))
    if merge_flex.convertible(src):
        cp = convert_plan.plan_convert(merge_flex.flex_view(fp), Target.PADDLEFORMERS)
        new = convert_plan.output_plan(cp, _NO_LIMIT)
        how = "assembled and converted to the PaddleFormers layout, as `merge` writes it"
    else:
        new = merge_flex.output_plan(merge_flex.keep_layout(fp), _NO_LIMIT)
        keep = Opt("keep_paddle_layout", True)
        how = f"assembled in the Paddle layout it was saved in, as merge with {keep} writes it"
    view = _view(new, fp.ck.folder.root)
    files = {rel: p for p, rel in fp.carry if rel not in CONFIG_FILES}
    tokenizer = next((p.parent for p, rel in fp.carry if rel.startswith("tokenizer")), fp.ck.folder.root)
    return Side(src, SideKind.FLEX, view, files, tokenizer, [f"{src}: flex checkpoint {how}"])


def same_file(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are one local file (:func:`surgery.io.store.same_local_file`)."""
    return stores.same_local_file(a, b)
