"""``tietool merge`` of a flex checkpoint (:mod:`surgery.io.flex`): every global tensor assembled from its
slices into one PaddleFormers safetensors checkpoint.

Planning reads the ``.metadata`` and every ``.distcp`` header (nothing of the data but replicated or
overlapping slices, compared here): each slice's array must be the dtype and shape the metadata says; the
slices of a tensor must cover every element (a gap is refused naming the tensor and the first uncovered
element); two slices that share elements must hold the same values there (compared as bits: a disagreement
is refused naming both files). Coverage is :func:`surgery.io.flex_cover.coverage` (shared with ``inspect``),
decided on a grid of the slices' own boundaries, so it costs nothing like the tensor's size.

Writing assembles one global tensor at a time (:class:`~surgery.plan.flex_pieces.Assembled`, made by
:func:`assemble`): an array of the global shape in the stored dtype (bf16 as ``uint16`` bits, never
converted) filled from the slices, which are memory-mapped from the ``.distcp`` files (never loaded whole
twice); the writer drops it once written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import arch
from ..inspect.convention import LEGACY_LOAD
from ..io import flex, flex_cover, pdparams, surface
from ..io.checkpoint import REPORT_NAME, Checkpoint, array_rows, read_config
from ..io.flex import FlexCheckpoint, FlexSlice, FlexTensor
from ..io.flex_cover import Box, Piece
from ..io.regular import require_regular
from ..io.safetensors_io import Source
from ..model.enums import Container, Operation
from ..model.errors import CheckpointError, RefusedError
from ..model.tensor import TensorInfo
from .flex_pieces import Assembled, assemble, assembled_data, piece_array
from .merge import merged_config
from .merge_tie import DroppedHead, TieFix, changed, check_tie, duplicate_head
from .plan import OutTensor, Plan, Reshard, reshard_plan
from .recipes import Array

Headers = dict[str, dict[str, TensorInfo]]  # .distcp file -> its arrays by key
_FIX = (
    "re-copy the flex checkpoint from the training run (its .metadata and .distcp files are written together)"
)
TRAINER_FILES = re.compile(r"^(training_args\.bin|trainer_state\.(json|bin)|saved_signal_\d+|rng_state.*)$")
"""Files of the Trainer's resume point in a ``checkpoint-N/`` (PaddleFormers 1.2 ``utils/env.py``
``TRAINING_ARGS_NAME``, ``TRAINER_STATE_NAME``; ``trainer.py``'s ``saved_signal_<rank>``,
``rng_state_<rank>``): left out of the merged model, as the optimizer and master-weight folders are."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "sentencepiece.bpe.model",
    "spiece.model",
    "generation_config.json",
    "chat_template.json",
    "chat_template.jinja",
)
"""Files carried from the folder above ``checkpoint-N/`` when config.json is taken from there (the tokenizer
and generation config the run saved with the model); the root's own non-training files are all carried."""


def _region(a: Array, box: Box, sub: Box) -> Array:
    return a[tuple(slice(s - o, e - o) for o, s, e in zip(box[0], sub[0], sub[1], strict=True))]


@dataclass(frozen=True)
class FlexPlan:
    """What a flex merge writes (nothing written yet).

    Attributes:
        ck: the flex checkpoint read (:class:`surgery.io.flex.FlexCheckpoint`).
        headers: ``.distcp`` file → its arrays by key (headers only).
        config, config_file: the config.json used and where it was found; ``new_config`` the merged one,
            ``config_changes`` its changes.
        merged: the output tensors (an :class:`Assembled` recipe each).
        carry: ``(source, name)`` copied unchanged; ``left``: the root's names left out.
        tie: the :class:`~surgery.plan.merge_tie.TieFix` of the tie check (a head trained apart under a tied
            flag: kept, the flags set false in ``new_config``), else None.
        kept_layout: written in the Paddle layout the training run held, as the user asked
            (:func:`keep_layout`); False: converted, or refused (:func:`refuse_unconverted`).
        dropped: the duplicate tied head left out as the library's export leaves it out
            (:func:`as_exported`), else None.
    """

    ck: FlexCheckpoint
    headers: dict[str, dict[str, TensorInfo]]
    config: dict[str, Any]
    config_file: Path
    new_config: dict[str, Any]
    config_changes: dict[str, list[Any]]
    merged: list[OutTensor]
    carry: list[tuple[Path, str]]
    left: list[str]
    tie: TieFix | None = None
    kept_layout: bool = False
    dropped: DroppedHead | None = None


def _check_headers(ck: FlexCheckpoint, t: FlexTensor, headers: dict[str, dict[str, TensorInfo]]) -> None:
    """Every slice of ``t`` is in its file under its key, of the metadata's dtype and shape.

    Raises:
        CheckpointError: naming the file and the slice.
    """
    for s in t.slices:
        info = headers[s.file].get(s.key)
        want = (s.numel,) if s.flat else s.shape
        if info is None:
            raise CheckpointError(
                f"holds no array {s.key!r}, which the .metadata puts in it", ck.path_of(s.file), _FIX
            )
        if np.dtype(info.dtype) != np.dtype(t.storage_dtype) or tuple(info.shape) != want:
            raise CheckpointError(
                f"{s.key!r} is {info.dtype} {list(info.shape)} but the .metadata says {t.dtype} {list(want)}",
                ck.path_of(s.file),
                _FIX,
            )


def check_tensor(ck: FlexCheckpoint, t: FlexTensor, headers: dict[str, dict[str, TensorInfo]]) -> list[Piece]:
    """The pieces that assemble ``t``: coverage checked, shared elements compared as bits.

    Returns:
        the pieces to write, duplicates of an earlier slice (a replica) left out.

    Raises:
        CheckpointError: a slice's array unlike the metadata, or an element no slice covers (named).
        RefusedError: two slices that share elements disagree there (both files named).
    """
    _check_headers(ck, t, headers)
    cov = flex_cover.coverage(t, ck.path_of(ck.metadata))
    for first, copy in cov.replicas:  # a replica of an earlier slice: compared whole, not written twice
        _same(ck, t, first, copy, headers)
    for p, q, sub in cov.shared:
        _compare(ck, t, p, q, sub, headers)
    if cov.first_missing is not None:
        raise CheckpointError(flex_cover.gap_message(t, cov), ck.path_of(ck.metadata), _FIX)
    return list(cov.pieces)


def _same(ck: FlexCheckpoint, t: FlexTensor, a: FlexSlice, b: FlexSlice, headers: Headers) -> None:
    x = pdparams.read_array(ck.path_of(a.file), headers[a.file][a.key]).reshape(-1).view(np.uint8)
    y = pdparams.read_array(ck.path_of(b.file), headers[b.file][b.key]).reshape(-1).view(np.uint8)
    if not np.array_equal(x, y):
        raise _disagree(ck, t, a, b)


def _compare(ck: FlexCheckpoint, t: FlexTensor, p: Piece, q: Piece, sub: Box, headers: Headers) -> None:
    x = piece_array(ck.path_of(p.slice.file), p, headers[p.slice.file][p.slice.key])
    y = piece_array(ck.path_of(q.slice.file), q, headers[q.slice.file][q.slice.key])
    if not np.array_equal(_region(x, p.box, sub).view(np.uint8), _region(y, q.box, sub).view(np.uint8)):
        raise _disagree(ck, t, p.slice, q.slice)


def _disagree(ck: FlexCheckpoint, t: FlexTensor, a: FlexSlice, b: FlexSlice) -> RefusedError:
    return RefusedError(
        f"slices of {t.name!r} at {list(a.offset)} in {a.file} and at {list(b.offset)} in {b.file} share "
        "elements but hold different values there; the files are not from one save",
        ck.path_of(b.file),
        _FIX,
    )


def _config(ck: FlexCheckpoint) -> tuple[dict[str, Any], Path]:
    """config.json of the flex checkpoint's root, or of the folder above (the Trainer's output_dir)."""
    root = ck.folder.root
    for d in (root, flex.above(root)):
        if (d / "config.json").is_file():
            return read_config(d)[0], d / "config.json"
    raise CheckpointError(
        "no config.json beside the flex checkpoint or in the folder above it (the Trainer's flex saves, "
        "checkpoint-N/ and save_model's, write none)",
        root,
        "copy the config.json of the model the run started from (its model_name_or_path) into the folder, "
        "then run the command again",
    )


def _carried(ck: FlexCheckpoint, config_file: Path) -> tuple[list[tuple[Path, str]], list[str]]:
    root = ck.folder.root
    carry, left = [], []
    for p in sorted(root.iterdir()):
        n = p.name
        if n in ("config.json", REPORT_NAME) or p == ck.folder.state:
            continue
        if flex.DATA_RE.match(n) or flex.META_RE.match(n) or n.endswith(".metadata.lock"):
            continue  # the input itself (a flex folder named directly)
        if p.is_dir() or surface.TRAINING_STATE.match(n) or TRAINER_FILES.match(n):
            left.append(n)
        elif n.endswith((".lock",) + surface.WEIGHT_EXT):
            left.append(n)
        else:
            require_regular(p, n)
            carry.append((p, n))
    if config_file.parent != root:
        have = {n for _, n in carry}
        for n in TOKENIZER_FILES:
            p = config_file.parent / n
            if n not in have and p.is_file():
                require_regular(p, n)
                carry.append((p, n))
    return carry, left


def _refuse_training_state(folder: flex.FlexFolder) -> None:
    """``folder`` is not a Trainer checkpoint's ``optimizer_state/`` or ``master_weight/`` named directly
    (beside a ``model_state/`` flex folder, as ``trainer.py`` ``_save_flex_optimizer_state`` writes them):
    those hold the optimizer's moments / fp32 master weights by parameter, and merged they would be written
    as a model with the checkpoint's config.json and tokenizer files.

    Raises:
        RefusedError: it is one of them (exit 5), naming the checkpoint folder to merge instead.
    """
    root, parent = Path(os.path.abspath(folder.root)), flex.above(folder.root)
    up = flex.find(parent) if root.name in flex.STATE_DIRS[1:] else None
    if up is not None and up.state.name == flex.STATE_DIRS[0]:
        raise RefusedError(
            f"{root.name}/ is the training state of the Trainer checkpoint {parent.name}/ (the "
            "optimizer's moments or master weights, by parameter), not the model's weights",
            folder.root,
            f"merge the checkpoint folder {parent} instead (its {flex.STATE_DIRS[0]}/ holds the weights)",
        )


def plan_flex(src: Path) -> FlexPlan:
    """The merge of the flex checkpoint at ``src``: metadata and headers read and checked, every tensor's
    coverage and shared elements checked (:func:`check_tensor`), config.json and the carried files (merge
    then applies :func:`tie_checked`).

    Raises:
        CheckpointError, UnsafePickleError, RefusedError: as :func:`surgery.io.flex.open_flex` and
            :func:`check_tensor` say; nothing is written.
    """
    folder = flex.find(src)
    if folder is None:
        raise CheckpointError("not a flex checkpoint", src, "give the checkpoint-N/ or model_state/ folder")
    _refuse_training_state(folder)
    ck = flex.open_flex(folder)
    headers = {f: flex.data_headers(ck, f) for f in ck.files}
    config, config_file = _config(ck)
    merged = []
    for t in ck.tensors.values():
        ps = check_tensor(ck, t, headers)
        infos = tuple(sorted({p.slice.file: headers[p.slice.file][p.slice.key] for p in ps}.items()))
        recipe = Assembled(folder.state, t.shape, t.storage_dtype, tuple(ps), infos)
        merged.append(OutTensor(t.name, t.label, t.shape, recipe))
    new_config, changes = merged_config(config)
    carry, left = _carried(ck, config_file)
    return FlexPlan(ck, headers, config, config_file, new_config, changes, merged, carry, left)


def tie_checked(fp: FlexPlan) -> FlexPlan:
    """The flex merge ``fp`` with merge's tie check applied (:func:`surgery.plan.merge_tie.check_tie` on its
    merged view): a head trained apart under a tied flag is kept and the flags set false in ``new_config``
    (``tie`` the :class:`~surgery.plan.merge_tie.TieFix`).

    Raises:
        RefusedError: an untied flag with no head in the checkpoint (and as
            :func:`~surgery.plan.merge_tie.check_tie` says).
    """
    fix = check_tie(flex_view(fp))
    new_config, changes = changed(fp.new_config, fp.config_changes, fix)
    return replace(fp, new_config=new_config, config_changes=changes, tie=fix)


def as_exported(fp: FlexPlan) -> FlexPlan:
    """The flex merge ``fp`` (tie-checked, to be converted to the PaddleFormers layout) without the duplicate
    head a tied model's own export does not write (:func:`surgery.plan.merge_tie.duplicate_head`): the
    merged folder holds what ``save_pretrained`` of the trained model writes. Unchanged otherwise.

    Raises:
        CheckpointError, RefusedError, UsageError: as :func:`~surgery.plan.merge_tie.duplicate_head`.
    """
    if fp.tie is not None or fp.kept_layout:
        return fp
    dup = duplicate_head(flex_view(fp))
    if dup is None:
        return fp
    return replace(fp, merged=[t for t in fp.merged if t.name != dup.head], dropped=dup)


def output_plan(plan: FlexPlan, max_shard_size: int) -> Plan:
    """The :class:`~surgery.plan.plan.Plan` the flex merge writes: PaddleFormers safetensors
    (``model.safetensors``, or shards of at most ``max_shard_size`` with an index), the merged config and
    the carried files."""
    layout = Reshard(
        Container.SAFETENSORS,
        max_shard_size,
        plan.merged,
        plan.new_config,
        carry=plan.carry,
        st_metadata={"format": "np"},  # the Paddle layout ([in, out]), as convert labels it
    )
    return reshard_plan(Operation.MERGE, None, layout, plan)


def report(plan: FlexPlan, out: str, facts: dict[str, Any]) -> dict[str, Any]:
    """The report of a flex merge (``tietool-report.json``)."""
    ck = plan.ck
    return {
        "operation": "merge",
        "kind": "flex",
        "dry_run": facts.pop("dry_run", False),
        "changed": True,
        "input": str(ck.folder.root),
        "output": out,
        "model_type": plan.config.get("model_type"),
        "metadata": str(ck.path_of(ck.metadata).relative_to(ck.folder.root)),
        "ranks": list(ck.ranks),
        "rank_files": [str(ck.path_of(f).relative_to(ck.folder.root)) for f in ck.files],
        "config_from": str(plan.config_file),
        "config_changes": plan.config_changes,
        "tie": plan.tie.facts() if plan.tie else None,
        "dropped": [plan.dropped.facts()] if plan.dropped else [],
        "left_out": plan.left,
        "to_paddleformers_layout": not plan.kept_layout,
        "conversion_proof": None
        if plan.kept_layout
        else arch.FLEX_MERGE_PROOFS.get(str(plan.config.get("model_type"))),
        "paddle_layout_load": legacy_load(out) if plan.kept_layout else None,
        "warnings": [kept_warning(plan, out)] if plan.kept_layout else [],
        **facts,
        "tensors": [_facts(t) for t in plan.merged],
    }


PADDLE_LAYOUT = (
    "the Paddle layout (Linear weights [in, out], fused qkv_proj / up_gate_proj as the model held them)"
)
"""How messages name the layout a Trainer flex checkpoint holds (the model's in-memory state dict)."""


def legacy_load(out: str) -> str:
    """The PaddleFormers 1.2 call that loads a folder in the Paddle layout (:data:`LEGACY_LOAD` for ``out``;
    measured in ``tests/oracles/test_flex_families.py``: the trained model's logits)."""
    return LEGACY_LOAD.replace("path", json.dumps(str(out)), 1)


def kept_warning(plan: FlexPlan, out: str) -> str:
    """The warning of a merge written in the Paddle layout on request: what it is and the exact load."""
    mt = plan.config.get("model_type")
    return (
        f"written in {PADDLE_LAYOUT} of this {mt or 'model'} checkpoint, as asked: a plain PaddleFormers "
        f"from_pretrained loads it without an error but computes other logits; load it with "
        f"{legacy_load(out)}"
    )


def refuse_unconverted(plan: FlexPlan, fix: str) -> None:
    """A flex checkpoint of a model type :data:`surgery.arch.CONVERSIONS` has no row for: its tensors are
    in the Paddle layout, which a plain ``from_pretrained`` of safetensors loads with wrong logits and no
    error (measured on the Trainer's checkpoints of seven families), and tietool has no proven facts to
    convert them; so merge refuses, naming the model type and the layout. ``fix`` names the option that
    writes the layout as it is (and the load it then needs).

    Raises:
        RefusedError: always (exit 5).
    """
    mt = plan.config.get("model_type")
    what = f"model_type {mt!r}" if isinstance(mt, str) and mt else "a config.json without a model_type"
    raise RefusedError(
        f"no conversion data for {what} ({len(arch.CONVERSIONS)} model types have it: CONVERSIONS in "
        "surgery/arch/conversions.py): this flex checkpoint's Paddle layout (Linear [in, out], fused "
        "projections) would load with other logits",
        plan.ck.folder.root,
        fix,
    )


def keep_layout(plan: FlexPlan) -> FlexPlan:
    """``plan`` written in the Paddle layout as the run held it, on the user's request: config.json gets
    ``"source": "paddle"``, as PaddleFormers 1.2's own ``save_pretrained(save_to_hf=False)`` marks that
    layout (``model_utils.py``; tietool's ``convert`` and ``inspect`` read it as the legacy layout)."""
    new, changes = dict(plan.new_config), dict(plan.config_changes)
    if new.get("source") != "paddle":
        changes["source"] = [new.get("source"), "paddle"]
        new["source"] = "paddle"
    return replace(plan, new_config=new, config_changes=changes, kept_layout=True)


def _facts(t: OutTensor) -> dict[str, Any]:
    r = t.recipe
    assert isinstance(r, Assembled), f"internal: {t.name} is not assembled"
    return {
        "name": t.name,
        "rule": "assembled",
        "axis": None,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "slices": len({p.slice for p in r.pieces}),
        "from": sorted({p.slice.file for p in r.pieces}),
    }


def totals(plan: FlexPlan) -> tuple[tuple[int, int], tuple[int, int]]:
    """(parameters, bytes) the slices store (a replica counted each time) and the merged tensors hold."""
    stored = [
        (s.numel, s.numel * np.dtype(t.storage_dtype).itemsize)
        for t in plan.ck.tensors.values()
        for s in t.slices
    ]
    before = (sum(n for n, _ in stored), sum(b for _, b in stored))
    return before, (sum(t.numel for t in plan.merged), sum(t.nbytes for t in plan.merged))


def convertible(src: Path) -> bool:
    """The flex checkpoint at ``src`` has a config.json whose ``model_type`` :data:`surgery.arch.CONVERSIONS`
    knows, so its Paddle-layout tensors can be converted to the PaddleFormers layout (False otherwise, and
    when there is no flex checkpoint or config: :func:`plan_flex` then refuses or writes as saved)."""
    folder = flex.find(src)
    if folder is None:
        return False
    for d in (folder.root, flex.above(folder.root)):
        if (d / "config.json").is_file():
            mt = read_config(d)[0].get("model_type")
            return isinstance(mt, str) and arch.conversion_row(mt) is not None
    return False


def with_conversion(rep: dict[str, Any], conv: dict[str, Any], out: str) -> dict[str, Any]:
    """The report of a flex merge converted to the PaddleFormers layout: merge's report for ``out``, its
    written-file facts the conversion's, the conversion's renames, transposes, notes and config changes
    under ``converted`` (a dropped duplicate head's note first among the notes, so the terminal says it)."""
    keep = ("to", "renamed", "transposed", "split", "config_changes", "notes", "warnings")
    turned = {t["from"]: t["shape_after"] for t in conv.get("transposed", [])}
    names = {r["from"]: r["to"] for r in conv.get("renamed", [])}
    for t in rep.get("tensors", []):  # each tensor as written: its output name and shape
        t["transposed"] = t["name"] in turned
        t["shape"] = turned.get(t["name"], t["shape"])
        t["name"] = names.get(t["name"], t["name"])
    rep.update(
        output=out,
        weight_files=conv.get("weight_files", rep.get("weight_files")),
        index=conv.get("index", rep.get("index")),
        total_size=conv.get("total_size", rep.get("total_size")),
        converted={k: conv[k] for k in keep if k in conv},
    )
    said = [d["message"] for d in rep.get("dropped", [])]  # printed with the conversion's notes
    if said:
        rep["converted"]["notes"] = [*said, *rep["converted"].get("notes", [])]
    return rep


@dataclass
class FlexView(Checkpoint):
    """The merged flex checkpoint as a :class:`~surgery.io.checkpoint.Checkpoint` that is never written:
    its tensors' headers are the merged ones (safetensors labels, no file), their data assembled on demand
    (:func:`assemble`, the last one kept, so a tensor read again, as a fused projection split in parts is,
    is assembled once). :func:`surgery.plan.convert.plan_convert` plans on it and the writer reads from it,
    so the conversion to the PaddleFormers layout is the same single pass as the merge."""

    recipes: dict[str, Assembled] = field(default_factory=dict)
    _last: tuple[str, Array] | None = field(default=None, repr=False, compare=False)

    def load(self, name: str) -> Array:
        """The assembled tensor ``name`` (stored dtype; one slice: its memory-mapped array)."""
        if self._last is None or self._last[0] != name:
            self._last = None  # dropped before the next is made: one assembled tensor at a time
            self._last = (name, assemble(self.recipes[name]))
        return self._last[1]

    def forget(self) -> None:
        """Drop the assembled tensor :meth:`load` keeps (its memory freed once no one else holds it)."""
        self._last = None

    def source(self, name: str) -> Source:
        """The assembled tensor ``name`` as a :class:`Source` for the writer: where its slices are whole
        row blocks (one slice, row shards, a 1-D tensor's shards) their stored bytes by byte range
        (:func:`~surgery.plan.flex_pieces.assembled_data`: a kernel copy, nothing assembled in memory), as
        the unconverted merge writes them; else the array :meth:`load` assembles."""
        if self._last is not None and self._last[0] == name:
            return Source(array=self._last[1])
        data = assembled_data(self.recipes[name])
        return data if isinstance(data, Source) else Source(array=data)

    def iter_rows(
        self, name: str, chunk_rows: int, start: int = 0, stop: int | None = None
    ) -> Iterator[Array]:
        """Rows ``start:stop`` of the assembled tensor in chunks of ``chunk_rows`` (views, no copy)."""
        yield from array_rows(self.load(name), chunk_rows, start, stop)


def flex_view(plan: FlexPlan) -> FlexView:
    """The :class:`FlexView` of a planned flex merge (its merged config, its tensors)."""
    tensors = {t.name: TensorInfo(t.name, t.dtype, t.shape, "", -1, t.nbytes) for t in plan.merged}
    recipes = {t.name: t.recipe for t in plan.merged if isinstance(t.recipe, Assembled)}
    return FlexView(
        plan.ck.folder.root,
        dict(plan.new_config),
        Container.SAFETENSORS,
        False,
        None,
        None,
        [],
        tensors,
        config_dir=above if (above := plan.config_file.parent) != plan.ck.folder.root else None,
        recipes=recipes,
    )
