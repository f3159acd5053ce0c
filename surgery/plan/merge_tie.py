"""The tie check of ``tietool merge``: config flag vs head values vs head presence, on the merged tensors.

A merged checkpoint is a model a loader reads with its ``config.json``; the flag ``tie_word_embeddings``
decides whether the loader uses the head in the files or the embedding as the head. The rank files and flex
checkpoints a training run saves carry the config the run was started with, which may not say what the run
did (``tests/data/cases/e02``: a Qwen3 whose copied config says tied while the Trainer trained
``lm_head.weight`` apart). So every merge makes the same three-way check ``inspect`` and ``tie`` make
(:func:`surgery.inspect.detect.detect` on a view of the merged tensors, never written):

* tied flag, head in the files, head values different from the embedding's: the run trained the head apart.
  The head is kept bit for bit and every tie flag of the config set false (:class:`TieFix`, said on the
  terminal and in the report): PaddleFormers 1.2 and HF transformers then load the trained head, and
  PaddleNLP 2.8 uses a head in the files whatever the flag says (:mod:`surgery.plan.convert`), so this is
  right under every loader; left true, PaddleFormers would use the embedding as the head (measured on e02:
  logits off by up to 1.87).
* untied flag (or an untied family default), no head in the files: a loader builds a random head. Refused
  (:func:`check_tie`), naming the flag and the head, since which fix is right (the flag, or the head's
  missing file) only the run knows.
* tied flag, head bit for bit the embedding, and the model type's own export writes no head when tied
  (:data:`surgery.arch.TIED_HEAD_NOT_EXPORTED`; the Trainer holds the tied parameter under the head's name
  too): the merge drops the duplicate head, as the library's ``save_pretrained`` does (:class:`DroppedHead`,
  :func:`duplicate_head`), where the loaders that read the output (PaddleFormers, HF transformers) are
  proven to re-tie it.
* anything else (tied and equal, tied with no head, untied with a head): nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import arch
from ..inspect.detect import detect, names_a_pair
from ..inspect.detection import Detection
from ..inspect.findings import FindingKind
from ..io.checkpoint import Checkpoint, array_rows
from ..model.enums import Container, Loader, TieState
from ..model.errors import RefusedError
from ..model.tensor import TensorInfo
from .plan import OutTensor
from .recipes import Array, Joined, join, read_slice


@dataclass(frozen=True)
class TieFix:
    """A head trained apart from the embedding under a config that says tied: kept, the flags set false.

    Attributes:
        head, embedding: the tensor names (as written).
        flags: ``{config key: [before, after]}`` for every tie flag set false (a dotted key inside a nested
            text config; ``tie_word_embeddings`` added false where the flag was the family's default).
        source: where the tied value came from (a config key, or the family default under the loader).
        differing_rows, max_abs_diff: how the head differs from the embedding (float32 |difference|); None
            when the values were not compared one by one (a dtype tietool does not decode, compared as
            bytes; a head of other rows than the embedding).
    """

    head: str
    embedding: str
    flags: dict[str, list[Any]]
    source: str
    differing_rows: int | None
    max_abs_diff: float | None

    @property
    def message(self) -> str:
        """The line the terminal prints (and the report keeps)."""
        keys = ", ".join(self.flags)
        how = (
            f"in {self.differing_rows} row(s) (max |Δ| {self.max_abs_diff:.3g})"
            if self.differing_rows is not None and self.max_abs_diff is not None
            else "(its bytes or rows)"
        )
        return (
            f"{self.head} differs from {self.embedding} {how} although config.json says tied "
            f"({self.source} = true): the run "
            f"trained the head apart, so {self.head} is kept as trained and {keys} set false (left true, "
            "PaddleFormers would use the embedding as the head)"
        )

    def facts(self) -> dict[str, Any]:
        """The report's ``tie`` entry."""
        return {
            "action": "head kept, tie flag set false",
            "head": self.head,
            "embedding": self.embedding,
            "flags": self.flags,
            "config_source": self.source,
            "differing_rows": self.differing_rows,
            "max_abs_diff": self.max_abs_diff,
            "message": self.message,
        }

    def config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with every flag of :attr:`flags` set false (a nested one in a copy of its block)."""
        out = dict(config)
        for key in self.flags:
            *blocks, leaf = key.split(".")
            cur = out
            for b in blocks:
                cur[b] = dict(cur[b])
                cur = cur[b]
            cur[leaf] = False
        return out


@dataclass
class JoinedView(Checkpoint):
    """The merged rank files as a :class:`~surgery.io.checkpoint.Checkpoint` that is never written: headers
    are the merged tensors' (safetensors labels, no file), data joined on demand from the rank files
    (:class:`~surgery.plan.recipes.Joined`): what :func:`check_tie` hands :func:`detect`."""

    recipes: dict[str, Joined] = field(default_factory=dict)

    def load(self, name: str) -> Array:
        """The merged tensor ``name`` in its storage dtype (bf16 as uint16 bits)."""
        r = self.recipes[name]
        if r.axis is None:
            return read_slice(r.slices[0])
        return join([read_slice(s) for s in r.slices], r.rule, r.axis, r.parts)

    def iter_rows(
        self, name: str, chunk_rows: int, start: int = 0, stop: int | None = None
    ) -> Iterator[Array]:
        """Rows ``start:stop`` in chunks of ``chunk_rows``; a tensor joined on axis 0 (the embedding, a
        vocabulary-split head) is read slice by slice, never joined whole in memory."""
        r = self.recipes[name]
        if r.axis != 0 or r.parts is not None:
            yield from array_rows(self.load(name), chunk_rows, start, stop)
            return
        arrays = [read_slice(s) for s in r.slices]
        bounds = np.cumsum([0, *(a.shape[0] for a in arrays)])
        stop = int(bounds[-1]) if stop is None else stop
        for s in range(start, stop, chunk_rows):
            e = min(s + chunk_rows, stop)
            parts = [
                a[max(s, lo) - lo : min(e, hi) - lo]
                for a, lo, hi in zip(arrays, bounds[:-1], bounds[1:], strict=True)
                if lo < e and hi > s
            ]
            yield parts[0] if len(parts) == 1 else np.concatenate(parts)


def joined_view(path: Path, config: dict[str, Any], merged: list[OutTensor]) -> JoinedView:
    """The :class:`JoinedView` of merged tensors ``merged`` of the rank folder ``path`` under ``config``."""
    tensors = {t.name: TensorInfo(t.name, t.dtype, t.shape, "", -1, t.nbytes) for t in merged}
    recipes = {t.name: t.recipe for t in merged if isinstance(t.recipe, Joined)}
    cfg = dict(config)
    return JoinedView(path, cfg, Container.SAFETENSORS, False, None, None, [], tensors, recipes=recipes)


def check_tie(view: Checkpoint) -> TieFix | None:
    """The three-way tie check of the merged checkpoint ``view`` (config flag, head present, head values):
    the :class:`TieFix` a head trained apart under a tied flag needs, else None. The values are read only
    when the flag says tied and a head is in the files; a checkpoint with no tensor named like an embedding
    or a head (:func:`~surgery.inspect.detect.names_a_pair`) has no tie to check.

    Raises:
        RefusedError: the flag says untied (or the family is untied by default) and no head is in the files:
            the loader would build a random head (names the head and the flag; nothing is written).
        CheckpointError, RefusedError, UsageError: as :func:`~surgery.inspect.detect.detect` (no embedding
            or head found, an embedding that only a guess could tell).
    """
    if not names_a_pair(view):
        return None  # no embedding or head by name: no tie to check
    det = detect(view, compare_values=False)
    if det.tie.tied and det.head.present:
        det = detect(view, compare_values=True)
    if any(f.kind is FindingKind.UNTIED_BUT_NO_HEAD for f in det.findings):
        raise _untied_no_head(det, view.path)
    comp = det.comparison
    usable = det.head.present and det.embedding.present and det.head.layout is not None
    if not (det.tie.tied and usable and comp.values is TieState.DIFFERENT):
        return None  # different with no magnitude too: a dtype tietool does not decode, other rows
    flags: dict[str, list[Any]] = {k: [v, False] for k, v in det.tie.flags.items() if v}
    if not flags:  # the family's default said tied: the key is written, false
        flags = {"tie_word_embeddings": [None, False]}
    return TieFix(
        det.head.name, det.embedding.name, flags, det.tie.source, comp.differing_rows, comp.max_abs_diff
    )


def _untied_no_head(det: Detection, path: Path) -> RefusedError:
    return RefusedError(
        f"config.json says untied ({det.tie.source} = false) but the merged tensors hold no "
        f"{det.head.name} (the head): a loader would build a random head; tietool cannot tell whether the "
        f"run tied it to {det.embedding.name} or it is in a file that is not here",
        path / "config.json",
        "if the run tied the head, set tie_word_embeddings to true in config.json; otherwise put the files "
        "that hold it beside the others; then merge again",
    )


def changed(
    config: dict[str, Any], changes: dict[str, list[Any]], fix: TieFix | None
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """``(new_config, config_changes)`` with ``fix``'s flags set false (unchanged without one)."""
    if fix is None:
        return config, changes
    return fix.config(config), {**changes, **fix.flags}


@dataclass(frozen=True)
class DroppedHead:
    """A tied model's duplicate head the merge leaves out, as the library's own export of the model does.

    Attributes:
        head, embedding: the tensor names (the head bit for bit the embedding).
        proof: the test that merged a tied Trainer checkpoint of the model type this way and loaded it
            (:data:`surgery.arch.TIED_HEAD_NOT_EXPORTED`).
    """

    head: str
    embedding: str
    proof: str

    @property
    def message(self) -> str:
        """The note the terminal prints (and the report keeps)."""
        return (
            f"{self.head} left out: config.json says tied and it is bit for bit {self.embedding} (the "
            "Trainer keeps the tied parameter under both names); PaddleFormers' own save_pretrained of this "
            "model writes no head, and PaddleFormers and HF transformers load it tied to the embedding"
        )

    def facts(self) -> dict[str, Any]:
        """The report's ``dropped`` entry."""
        return {"name": self.head, "equal_to": self.embedding, "proof": self.proof, "message": self.message}


def duplicate_head(view: Checkpoint) -> DroppedHead | None:
    """The duplicate head of the merged tied checkpoint ``view`` that the model type's own export does not
    write (:data:`surgery.arch.TIED_HEAD_NOT_EXPORTED`), else None: the config says tied, head and
    embedding are in the files and equal bit for bit (read and compared), and PaddleFormers (safetensors)
    and HF transformers are both proven to re-tie a missing head of the model type (``may_drop_head``).

    Raises:
        CheckpointError, RefusedError, UsageError: as :func:`~surgery.inspect.detect.detect`.
    """
    mt = view.config.get("model_type")
    proof = arch.TIED_HEAD_NOT_EXPORTED.get(mt) if isinstance(mt, str) else None
    if proof is None or not names_a_pair(view):
        return None
    assert isinstance(mt, str)
    loaders = (Loader.PADDLEFORMERS.value, Loader.HF.value)
    if not all(arch.lookup(mt, ld, Container.SAFETENSORS.value).may_drop_head for ld in loaders):
        return None
    det = detect(view, compare_values=False)
    if not (det.tie.tied and det.head.present and det.embedding.present):
        return None
    det = detect(view, compare_values=True)
    if det.comparison.values is not TieState.EXACT:
        return None
    return DroppedHead(det.head.name, det.embedding.name, proof)
