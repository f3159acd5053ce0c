"""Where the output's tensors go, computed as a value before anything is written (safetensors'
``prepare``, then ``serialize``): the dry run and the writer use the same layout.

* :func:`keep_files` (``tie`` / ``untie`` / ``resize``): each tensor keeps its input file, a dropped one
  leaves it, an added one follows the tensor it is placed after (or goes into a new shard); files left
  with no tensor are removed and the shards of a sharded checkpoint renumbered ``k-of-n``.
* :func:`reshard` (``convert`` / ``merge``): a whole new checkpoint, its tensors in shards as the libraries'
  ``save_pretrained`` writes them.

Shard naming of a new checkpoint, as the writers our users load from:

* safetensors: ``model-00001-of-0000N.safetensors`` and ``model.safetensors.index.json``, always (as
  PaddleFormers 1.2's ``save_pretrained`` does, even for one shard);
* ``.pdparams``: ``model_state.pdparams`` when everything fits in one shard, else
  ``model_state-00001-of-0000N.pdparams`` and ``model_state.pdparams.index.json`` (as PaddleNLP 2.x's
  ``save_pretrained``).

Shards are filled greedily in the given tensor order, a new shard starting when the next tensor would
take the current one past ``max_shard_size`` (PaddleFormers' ``shard_checkpoint``); a tensor larger than
the limit gets a shard of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..io.checkpoint import SHARD_RE, Checkpoint
from ..io.formats import format_of
from ..model.enums import Container
from ..model.errors import UsageError
from ..plan.plan import NEW_SHARD, OutTensor, Plan


class Entry(NamedTuple):
    """One output tensor of a kept file (a tuple: one per tensor, millions in a hostile header).

    Attributes:
        name, dtype, shape: as written (``dtype`` the label in the checkpoint's format).
        new: its :class:`~surgery.plan.plan.OutTensor` when the plan gives it new data, None when its bytes
            are the input's.
        storage: the storage key (names with one key are one array in a ``.pdparams``).
        fortran: the input's bytes are in Fortran order.
    """

    name: str
    dtype: str
    shape: tuple
    new: OutTensor | None
    storage: object
    fortran: bool


def shard_name(kind: str, k: int, n: int) -> str:
    """``model-00001-of-00003.safetensors`` / ``model_state-00001-of-00003.pdparams`` (``kind`` the stem)."""
    return f"{kind}-{k:05d}-of-{n:05d}.{'safetensors' if kind == 'model' else 'pdparams'}"


@dataclass
class KeepFilesLayout:
    """What goes where in the output.

    Attributes:
        entries: per input weight file (and ``NEW_SHARD``), its output tensors in order.
        kept: the files left with tensors (input order, ``NEW_SHARD`` last); the others are removed.
        rename: output name of each kept file.
        rewrite: the kept files that are rewritten (touched by the plan, or ``NEW_SHARD``), in order; the
            rest are copied or linked whole.
    """

    entries: dict[str, list[Entry]]
    kept: list[str]
    rename: dict[str, str]
    rewrite: list[str]


def keep_files(plan: Plan) -> KeepFilesLayout:
    """The :class:`KeepFilesLayout` of ``plan``'s output.

    Raises:
        UsageError: the plan leaves no tensor in the checkpoint (a bug).
    """
    ckpt = plan.ckpt
    touched = plan.touched_files()
    entries = plan_entries(plan)
    kept = [f for f in ckpt.weight_files + [NEW_SHARD] if entries[f]]
    if not kept:
        raise UsageError(
            "the plan leaves no tensor in the checkpoint", ckpt.path, "this is a bug; please report it"
        )
    rewrite = [f for f in kept if f in touched or f == NEW_SHARD]
    return KeepFilesLayout(entries, kept, output_names(ckpt, kept), rewrite)


def plan_entries(plan: Plan) -> dict[str, list[Entry]]:
    """The output tensors of each input weight file (and of ``NEW_SHARD``), in the order they are written:
    the input's tensors less the dropped ones, replaced tensors in their place, each added tensor right
    after the one it follows (those following none, or a name not written, at the end of their file).

    Returns:
        input file (or ``NEW_SHARD``) → its entries; a file left with no tensor maps to ``[]``.
    """
    ckpt = plan.ckpt
    entries: dict[str, list[Entry]] = {f: [] for f in ckpt.weight_files}
    entries[NEW_SHARD] = []
    adds_after: dict[str | None, list[OutTensor]] = {}
    for a in plan.add:
        adds_after.setdefault(a.after, []).append(a)
    for name, t in ckpt.tensors.items():
        if name in plan.drop:
            continue
        if name in plan.replace:
            nt = plan.replace[name]
            # a replaced tensor has storage of its own unless the plan groups it (aliases of one new table)
            entries[t.file].append(Entry(name, nt.dtype, nt.shape, nt, nt.storage, False))
        else:
            dtype = "BF16" if plan.relabel_u16 and t.dtype == "U16" else t.dtype
            entries[t.file].append(Entry(name, dtype, t.shape, None, t.storage, t.fortran))
        for a in adds_after.pop(name, []):
            entries[a.file].append(Entry(a.name, a.dtype, a.shape, a, a.storage, False))
    for lst in adds_after.values():
        for a in lst:
            entries[a.file].append(Entry(a.name, a.dtype, a.shape, a, a.storage, False))
    return entries


def output_names(ckpt: Checkpoint, kept: list[str]) -> dict[str, str]:
    """Output name of each kept file: in a sharded checkpoint, shards (and ``NEW_SHARD``) are renumbered
    ``k-of-n`` over the kept files; any other name is unchanged."""
    if not ckpt.sharded:
        return {f: f for f in kept}
    rename: dict[str, str] = {}
    n = len(kept)
    kind = ckpt.fmt.stem
    for k, f in enumerate(kept, 1):
        m = SHARD_RE.match(f)
        rename[f] = shard_name(m.group(1) if m else kind, k, n) if (m or f == NEW_SHARD) else f
    return rename


def entry_nbytes(ckpt: Checkpoint, e: Entry) -> int:
    """Tensor bytes of output entry ``e``: its new tensor's, or the input tensor's."""
    return e.new.nbytes if e.new is not None else ckpt.tensors[e.name].nbytes


def plan_shards(tensors: Sequence[OutTensor], max_shard_size: int) -> list[list[OutTensor]]:
    """Split ``tensors`` (in order) into shards of at most ``max_shard_size`` bytes each, greedily, as
    PaddleFormers' ``shard_checkpoint``; a larger tensor gets a shard of its own. Never empty."""
    shards: list[list[OutTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


@dataclass(frozen=True)
class ReshardLayout:
    """Where each tensor goes: ``files`` (output file name → its tensors) and the index name."""

    files: dict[str, list[OutTensor]]
    index: str | None

    @property
    def weight_map(self) -> dict[str, str]:
        return {t.name: f for f, ts in self.files.items() for t in ts}

    @property
    def total_size(self) -> int:
        return sum(t.nbytes for ts in self.files.values() for t in ts)


def reshard(tensors: Sequence[OutTensor], container: Container, max_shard_size: int) -> ReshardLayout:
    """The output files of ``tensors``.

    Raises:
        UsageError: no tensor, or two tensors with one name.
    """
    names = [t.name for t in tensors]
    if not names or len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UsageError(f"the output would hold {dup or 'no tensor'} twice or none", None, "report this bug")
    shards = plan_shards(tensors, max_shard_size)
    fmt = format_of(container)
    files = dict(zip(fmt.shard_names(len(shards)), shards, strict=True))
    return ReshardLayout(files, fmt.index_name(len(shards)))
