"""Plans: what ``tie``, ``untie`` and ``resize`` will change, computed from headers and detection only.

A :class:`Plan` lists tensors dropped, replaced and added, config keys set, and notes. Executing it
(:func:`surgery.write.writer.execute`) is the only step that writes; ``--dry-run`` prints the plan and stops.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import arch
from ..inspect.detect import detect, loader_facts_unproven, unnamed_heads
from ..inspect.detection import Detection
from ..inspect.findings import FindingKind, Fix, describe
from ..io.checkpoint import Checkpoint
from ..io.configfile import get_dotted, read_config_file
from ..io.formats import DEFAULT_MAX_SHARD_SIZE
from ..model.enums import Container, FoundBy, HeadLayout, Loader, Operation
from ..model.errors import CheckpointError, Opt, RefusedError, UsageError
from ..model.tensor import DTYPES, NP_TO_ST, DType, TensorInfo, dtype_refusal
from ..model.tokens import TokenEdit
from .recipes import CopyOf, Recipe, uses

NEW_SHARD = "<new shard>"  # OutTensor.file of a tensor that gets a shard file of its own

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_size(text: str | int) -> int:
    """``"10GB"`` → 10_000_000_000, ``"500MiB"`` → 524_288_000, ``"1024"``/``1024`` → 1024 bytes, as
    PaddleFormers' ``convert_file_size_to_int`` (decimal ``KB/MB/GB``, binary ``KiB/MiB/GiB``).

    Raises:
        UsageError: not a positive size.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if m is None or m.group(2) not in _UNITS or float(m.group(1)) * _UNITS[m.group(2)] < 1:
        raise UsageError(
            f"{Opt('max_shard_size', text)} is not a size",
            None,
            f"give bytes or a size: {Opt('max_shard_size', '10GB')}, {Opt('max_shard_size', '500MiB')}",
        )
    return int(float(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True)
class KeepFiles:
    """The layout of an edit (``tie``, ``untie``, ``resize``, ``add-tokens``): the input's own files, those
    that hold a changed tensor rewritten and the rest kept (:func:`surgery.write.layout.keep_files`). The
    changes are the plan's delta (``drop``, ``replace``, ``add``): an edit never lists untouched tensors."""


@dataclass(frozen=True)
class Reshard:
    """The layout of a plan that writes a whole new checkpoint (``convert``, ``merge``): every output
    tensor, in order, laid out in shards of ``container`` of at most ``max_shard_size`` bytes each
    (:func:`surgery.write.layout.reshard`).

    Attributes:
        tensors: the output tensors in the order they are laid out (recipes of the plan's source's tensors,
            or of rank-file slices).
        config: written as ``config.json``.
        carry: ``(source file, relative name in the output)`` copied unchanged (generation config,
            tokenizer files).
        st_metadata: each safetensors file's ``__metadata__`` (PaddleFormers 1.2 writes
            ``{"format": "pt"}``; what the readers of the output expect), or None.
        pdparams_extras: non-tensor entries of each ``.pdparams`` file; ``StructuredToParameterName@@`` is
            restricted to the file's own tensors.
    """

    container: Container
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    tensors: list[OutTensor] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    carry: list[tuple[Path, str]] = field(default_factory=list)
    st_metadata: dict[str, str] | None = None
    pdparams_extras: dict[str, Any] | None = None


@dataclass(frozen=True)
class FlexFolders:
    """The layout of an edit of a PaddleFormers Trainer flex checkpoint kept resumable
    (``--keep-training-state``): in each flex folder, the ``.distcp`` files that hold a changed tensor
    rewritten and a new ``.metadata``; every other file kept (:mod:`surgery.write.flex_edit`).

    Attributes:
        root: the ``checkpoint-N/`` folder.
        config: its config as ``merge`` finds it (the output's config.json, with the plan's sets).
        config_file: where that config was found.
        rewrites: per flex folder (``model_state`` ...), key → (paddle dtype name, the new full array as a
            :class:`~surgery.io.made.Made`: computed when written, one at a time).
    """

    root: Path
    config: dict[str, Any]
    config_file: Path
    rewrites: dict[str, dict[str, tuple[str, Any]]]

    @property
    def output_bytes(self) -> int:
        return sum(a.nbytes for new in self.rewrites.values() for _, a in new.values())


Layout = KeepFiles | Reshard | FlexFolders
"""Which files the output has: the one choice a :class:`Plan` makes about them."""


@dataclass(frozen=True, slots=True)  # slots: one per output tensor, millions in a hostile header
class OutTensor:
    """A tensor the output gets data for (every operation's one tensor type): by a recipe of the input's
    tensors.

    Attributes:
        name: state-dict key.
        dtype: label in the output's format: safetensors ``BF16``...; a kept file of a ``.pdparams`` its
            numpy name. A resharded output (``convert``, ``merge``) takes the safetensors label of the
            logical dtype (a ``.pdparams`` stores bf16 as numpy ``uint16``, as PaddleNLP does, the bits
            unchanged).
        shape: output shape.
        recipe: what its data is (:mod:`surgery.plan.recipes`); the writer makes it once per execution, shared
            by every tensor with an equal recipe.
        file: the weight file it goes into (input file name), or ``NEW_SHARD`` (and for a resharded output,
            whose files the writer lays out).
        after: for an added tensor, the name it follows in that file (None: at the end).
        storage: tensors with the same storage key are one array (pdparams aliases).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    recipe: Recipe
    file: str = NEW_SHARD
    after: str | None = None
    storage: object = None

    @property
    def nbytes(self) -> int:
        return int(_dtype(self.dtype).nbytes(self.numel))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # Python ints: 10x faster than np.prod per call, and never overflow


def _dtype(label: str) -> DType:
    """The :class:`~surgery.model.tensor.DType` of a safetensors label or a pdparams numpy name."""
    return DTYPES[label] if label in DTYPES else DTYPES[NP_TO_ST[label]]


@dataclass(frozen=True)
class Resized:
    """One parameter whose shape the plan changes: ``axis`` goes from ``old`` to ``new`` entries; or whose
    slack entries it gives new values in place (``old == new``): ``reset`` = ``(lo, hi)``, entries
    ``lo..hi-1`` on ``axis`` (below ``old``) that new tokens take. Entries ``old..new-1`` and the reset
    ones are new: their optimizer statistics start from zero, their master weights from the new values."""

    name: str  # the model's (structured) name
    param: str  # its parameter name (StructuredToParameterName@@), the optimizer's key
    axis: int
    old: int
    new: int
    reset: tuple[int, int] | None = None

    def fresh(self) -> list[tuple[int, int]]:
        """The ranges ``(lo, hi)`` of entries on :attr:`axis` of the result whose values are new (the reset
        slack entries, then the grown ones), empty ranges left out."""
        spans = [self.reset] if self.reset is not None else []
        spans.append((self.old, self.new))
        return [(lo, hi) for lo, hi in spans if hi > lo]


@dataclass(frozen=True)
class OptimizerEdit:
    """The rewrite of one ``optimizer.pdopt``: each accumulator and each master weight with the resize it
    gets (None: copied bytes), and what else the file holds (:class:`~surgery.io.pdparams
    .OptimizerHeader`)."""

    rel: str
    entries: tuple[tuple[TensorInfo, Resized | None], ...]
    master: tuple[tuple[TensorInfo, Resized | None], ...]
    names: dict[str, str]
    extras: dict[str, Any]
    np_module: str

    @property
    def resized(self) -> list[str]:
        """The accumulators and master weights (``master_weights/<parameter>``) that are resized."""
        return [t.name for t, r in self.entries if r is not None] + [
            "master_weights/" + t.name for t, r in self.master if r is not None
        ]


@dataclass
class Plan:
    """What an operation writes (every operation's one plan type). Nothing is written until it is executed
    (:func:`surgery.write.writer.execute`).

    Attributes:
        op: the operation.
        source: the input checkpoint the recipes read (None: ``merge``'s rank files, whose slices name their
            files). :attr:`ckpt` for an edit.
        detection: the input's detection (an edit's; None for ``convert`` / ``merge``). :attr:`det`.
        drop: names removed → reason.
        replace: existing names whose data (and maybe shape) change.
        add: new names.
        config_set: ``(file, dotted key, value)`` to set in config.json / model_config.json.
        stale_index: index entries that name no stored tensor; left out of the output index.
        metadata: safetensors ``__metadata__`` entries to add (``{dropped name: kept name}``).
        metadata_drop: ``__metadata__`` keys to remove (a ``{dropped: kept}`` entry for a tensor the output
            holds again).
        relabel_u16: write safetensors ``U16`` tensors that hold bf16 bits as ``BF16``.
        notes: what the user should know (why nothing was saved, which loader was assumed, ...).
        warnings: what may break the model (trimming rows the tokenizer uses).
        extra_report: operation-specific report fields (resize rows, init, seed).
        tokenizer: the edit of the folder's tokenizer files that goes with the rows (``add-tokens``, a
            ``resize`` trim below added tokens): the writer writes ``tokenizer.files`` in place of those
            files of the input; None leaves every tokenizer file as it is.
        training_edit: with ``--keep-training-state``, the optimizer files rewritten to the new shapes
            (:func:`surgery.plan.training_state.plan_training_state`), by path; the writer writes them in
            place of the copies.
        layout: the output's files (:data:`Layout`): the input's with the delta (an edit), a whole new
            checkpoint (``convert``, ``merge``), or a Trainer flex checkpoint's folders.
        section: the operation's own plan its report is worded from (a ``convert`` / ``merge`` plan), or
            None.
    """

    op: Operation
    source: Checkpoint | None
    detection: Detection | None = None
    drop: dict[str, str] = field(default_factory=dict)
    replace: dict[str, OutTensor] = field(default_factory=dict)
    add: list[OutTensor] = field(default_factory=list)
    config_set: list[tuple[str, str, object]] = field(default_factory=list)
    stale_index: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    metadata_drop: list[str] = field(default_factory=list)
    relabel_u16: bool = False
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    extra_report: dict[str, Any] = field(default_factory=dict)
    tokenizer: TokenEdit | None = None
    training_edit: dict[str, OptimizerEdit] = field(default_factory=dict)
    layout: Layout = field(default_factory=KeepFiles)
    section: Any = None

    @property
    def ckpt(self) -> Checkpoint:
        """The input checkpoint of an edit.

        Raises:
            AssertionError: a plan without one (``merge`` of rank files; a bug to ask).
        """
        assert self.source is not None, f"internal: a {self.op} plan has no input checkpoint"
        return self.source

    @property
    def det(self) -> Detection:
        """The detection of an edit's input.

        Raises:
            AssertionError: a ``convert`` / ``merge`` plan (a bug to ask).
        """
        assert self.detection is not None, f"internal: a {self.op} plan has no detection"
        return self.detection

    @property
    def reshard(self) -> Reshard:
        """The layout of a new checkpoint (``convert``, ``merge``).

        Raises:
            AssertionError: the plan edits its input's files (a bug to ask).
        """
        assert isinstance(self.layout, Reshard), f"internal: a {self.op} plan writes no new checkpoint"
        return self.layout

    @property
    def changed(self) -> bool:
        """The output differs from the input (False: an edit that would write a copy). A new checkpoint
        (``convert``, ``merge``) always does."""
        if isinstance(self.layout, Reshard):
            return True
        cfg_changes = [c for c in self.config_set if get_config(self.ckpt, c[0], c[1]) != c[2]]
        tok = self.tokenizer is not None and bool(self.tokenizer.files)
        return bool(self.drop or self.replace or self.add or cfg_changes or tok)

    @property
    def output_bytes(self) -> int:
        """Bytes of tensor data the output will write (the progress bar's total): of an edit, kept tensors,
        replaced tensors at their new size, added tensors; of a new checkpoint every tensor; of a flex edit
        the rewritten tensors."""
        if isinstance(self.layout, Reshard):
            return sum(t.nbytes for t in self.layout.tensors)
        if isinstance(self.layout, FlexFolders):
            return self.layout.output_bytes
        t = self.ckpt.tensors
        kept = sum(x.nbytes for n, x in t.items() if n not in self.drop and n not in self.replace)
        return kept + sum(nt.nbytes for nt in self.replace.values()) + sum(nt.nbytes for nt in self.add)

    def touched_files(self) -> set[str]:
        """Weight files that must be rewritten (not copied)."""
        t = self.ckpt.tensors
        files = (
            {t[n].file for n in self.drop}
            | {t[n].file for n in self.replace}
            | {a.file for a in self.add if a.file != NEW_SHARD}
        )
        if self.relabel_u16:
            files |= {x.file for x in t.values() if x.dtype == "U16"}
        return files


def reshard_plan(
    op: Operation, source: Checkpoint | None, layout: Reshard, section: Any, notes: list[str] | None = None
) -> Plan:
    """The plan of a whole new checkpoint (``convert``, ``merge``): ``layout``'s tensors read from
    ``source`` (None: rank-file slices), reported from ``section`` (the operation's own plan)."""
    return Plan(op, source, layout=layout, section=section, notes=list(notes or []))


def get_config(ckpt: Checkpoint, file: str, key: str) -> Any:
    data = ckpt.config if file == "config.json" else read_config_file(ckpt.path / file)
    try:
        return get_dotted(data, key)
    except (KeyError, IndexError, TypeError):
        return None


def tie_flags(det: Detection, value: bool) -> list[tuple[str, str, object]]:
    """Set ``tie_word_embeddings`` at the top level and in the language model's nested config; and, for a
    family whose tied logits scale the embedding (T5), ``scale_decoder_outputs`` where config.json holds
    it: transformers 5.3's ``T5Config`` always ties, scales the decoder output by that key, and reads it
    before the tie flag (``tests/oracles/test_hf_loader.py::test_hf_native_outputs_load[t5]``); tied, the
    scale is on; untied, the head untie writes is already scaled (and a trained one never was)."""
    out: list[tuple[str, str, object]] = [("config.json", "tie_word_embeddings", value)]
    if det.config.text_key:
        out.append(("config.json", f"{det.config.text_key}.tie_word_embeddings", value))
    if (
        det.family.scales_tied_logits
        and get_config(det.ckpt, "config.json", "scale_decoder_outputs") is not None
    ):
        out.append(("config.json", "scale_decoder_outputs", value))
    return out


def refuse_unusable_head(det: Detection, op: str) -> None:
    """Refuse a head that cannot be used (wrong shape, a tensor-parallel slice) or a requested layout that
    contradicts its shape."""
    c = det.head.conflict
    if c is not None:
        raise UsageError(
            f"{op} refused: the layout {c.requested} contradicts the head {c.head} {list(c.shape)} "
            f"(vocab_size {det.vocab_rows} != hidden_size {det.hidden}, so its shape says {c.fits})",
            det.ckpt.path,
            fix=f"pass {Opt('layout', c.fits)}, or leave {Opt('layout')} out",
        )
    if det.head.present and det.head.layout is None:
        raise RefusedError(
            f"{op} refused: " + "; ".join(map(str, det.problems_about(det.head.name))),
            det.ckpt.path,
            "fix the head first (merge tensor-parallel slices / re-export)",
        )


def refuse_unsettled_pair(det: Detection, op: str) -> None:
    """Refuse a write whose pair or vocabulary is not settled: the text vocabulary is not clear among
    several (unless ``--embedding`` named the table), or no head is named while a tensor of no known name
    has the head's shape (it may be a trained head: tie would set the flag beside it, untie add a second
    head).

    Raises:
        RefusedError: naming the candidates and the ``--embedding`` / ``--head`` to pass.
    """
    if det.config.unclear_text and det.embedding.found_by is not FoundBy.NAMED:
        found = next(f for f in det.problems if f.kind is FindingKind.TEXT_VOCABULARY_UNCLEAR)
        raise RefusedError(
            f"{op} refused: {describe(found)}", det.ckpt.path, "name the pair of the text model"
        )
    shaped = unnamed_heads(det)
    if shaped:
        raise RefusedError(
            f"{op} refused: no tensor is named like the head ({det.head.name}), but {', '.join(shaped)} has "
            "the "
            f"vocabulary's shape {list(det.ckpt.tensors[shaped[0]].shape)}: it may be a trained head under "
            "another name",
            det.ckpt.path,
            f"if it is the LM head, pass {Opt('head', shaped[0])}; otherwise remove or rename it first",
        )


def refuse_stale_vocab_size(det: Detection, op: str) -> None:
    """Refuse tie/untie while the config's vocabulary size disagrees with the embedding's rows: the loader
    builds a table of the config's size, so the output would load only by luck, and its head would be
    tied or untied against the wrong number of rows. ``resize`` to the rows sets the key (a config that
    counts the head's rows of an embedding with reserved rows agrees).

    Raises:
        RefusedError: one line naming the config file, the key, both numbers and the resize that fixes it.
    """
    cvs, V = det.config.vocab_size, det.vocab_rows
    if cvs is None or cvs == V or (cvs == det.head.rows and det.head.vocab is None):
        return
    key, ckpt = det.config.vocab_key or "vocab_size", det.ckpt
    if ckpt.config_file != "config.json":
        key = f"{ckpt.config_prefix}.{key}".lstrip(".")
    raise RefusedError(
        f"{op} refused: {ckpt.config_file} {key} is {cvs} but the embedding {det.embedding.name} has {V} "
        "rows "
        f"(the loader would build a {cvs}-row table)",
        ckpt.path / ckpt.config_file,
        f"tietool {Fix(Opt('vocab_size', V), 'resize')} sets {key} to the rows, then {op}",
    )


def out_dtype(ckpt: Checkpoint, t: TensorInfo, relabel: bool) -> str:
    return "BF16" if relabel and t.dtype == "U16" else t.dtype


def written_dtype(ckpt: Checkpoint, t: TensorInfo, loader: str) -> str:
    """The dtype label an edit of ``ckpt`` (tie, untie, resize, add-tokens, prune, transplant,
    fix-untrained, rename-tokens: :func:`base_plan`) writes for its tensor ``t`` when the output is meant
    for ``loader``: ``BF16`` for a ``U16`` tensor holding bfloat16 bits where :func:`_wants_relabel` says
    so, else ``t``'s own label. ``verify`` expects exactly this label."""
    return out_dtype(ckpt, t, _wants_relabel(ckpt, loader))


def _wants_relabel(ckpt: Checkpoint, loader: str) -> bool:
    """Rewritten U16 tensors holding bfloat16 bits are labelled BF16, except for a loader that reads
    bfloat16 only as U16 (:data:`surgery.arch.U16_BFLOAT16_ONLY`: PaddleNLP 2.8.1)."""
    return (
        ckpt.fmt.bf16_label
        and ckpt.bf16_as_u16
        and loader not in arch.U16_BFLOAT16_ONLY
        and any(t.dtype == "U16" for t in ckpt.tensors.values())
    )


def base_plan(op: str, det: Detection) -> Plan:
    """The empty plan of edit ``op`` of ``det``'s checkpoint (the stale index entries noted, bf16 bits
    stored as U16 relabelled where the loader takes BF16)."""
    ckpt = det.ckpt
    plan = Plan(Operation(op), ckpt, det, relabel_u16=_wants_relabel(ckpt, det.loader.name))
    if ckpt.index is not None:
        plan.stale_index = [n for n in ckpt.index["weight_map"] if n not in ckpt.tensors]
    if plan.relabel_u16:
        plan.notes.append(
            "U16 tensors hold bfloat16 bits (config dtype bfloat16): rewritten shards label them BF16; "
            "the bytes are unchanged"
        )
    return plan


def restore_embedding(det: Detection, plan: Plan) -> None:
    """Add the missing input embedding, written from the head's bytes (``[vocab, hidden]``), in the head's
    file right before the head; a ``{embedding: head}`` metadata entry is removed (the name is real again)."""
    ckpt, h = det.ckpt, det.emb_info  # the head's header (the embedding is stored as the head)
    recipe = CopyOf(det.head.name, transpose=det.head.layout == HeadLayout.HIDDEN_VOCAB)
    names = list(ckpt.tensors)
    i = names.index(det.head.name)
    before = next((n for n in reversed(names[:i]) if ckpt.tensors[n].file == h.file), None)
    plan.add.append(
        OutTensor(
            det.embedding.name,
            out_dtype(ckpt, h, plan.relabel_u16),
            (det.vocab_rows, det.hidden),
            recipe,
            h.file,
            after=before,
        )
    )
    plan.metadata_drop.append(det.embedding.name)
    plan.notes.append(
        f"{det.embedding.name} restored from the bytes of {det.head.name} (the table was stored only there)"
    )


def missing_embedding_refusal(det: Detection, op: str, fix: str) -> RefusedError:
    return RefusedError(
        f"{op} refused: the input embedding {det.embedding.name} is missing (the table is stored only as the "
        "head "
        f"{det.head.name})",
        det.ckpt.path,
        fix,
    )


def check_new_names(plan: Plan) -> None:
    """Never two tensors under one name: an added tensor's name is new (or dropped) and added once.

    Raises:
        AssertionError: a plan that would write a name twice (a bug in the planner).
    """
    kept = set(plan.ckpt.tensors) - set(plan.drop)
    added = [a.name for a in plan.add]
    twice = sorted({n for n in added if n in kept or added.count(n) > 1})
    assert not twice, f"plan {plan.op} would write {', '.join(twice)} twice"


def drop_head(det: Detection, plan: Plan, reason: str) -> bool:
    """Drop the head (for ``reason``) and its aliases, with ``{dropped: embedding}`` safetensors metadata,
    where the loader re-ties a missing head and that is proven (architecture table: ``Family.may_drop_head``;
    a loader that would load a random head, or one whose behaviour is unproven, needs it kept). Shared by
    ``tie`` and ``resize``.

    Returns:
        whether the head was dropped (False: the loader needs it, nothing was planned).
    """
    if not det.family.may_drop_head:
        return False
    plan.drop[det.head.name] = reason
    for a in det.head.aliases:
        plan.drop[a] = f"alias of {det.head.name}"
    plan.metadata = {n: det.embedding.name for n in plan.drop}
    if det.family.warns_missing_head:
        source = f"checked by loading: {det.family.proof}" if det.family.proof else "architecture table"
        plan.notes.append(
            f"the {det.loader.name} loader will log {det.head.name} as 'newly initialized': that warning is "
            f"harmless, it ties {det.head.name} to {det.embedding.name} on load and the logits are identical "
            f"({source})"
        )
    return True


def random_head_problem(det: Detection) -> str | None:
    """The problem an output keeps when the input has no head in its files under an untied flag (an untied
    Gemma 3 export: PaddleFormers writes no head, HF transformers then loads a random ``lm_head``) and
    the write neither adds the head nor sets the flag true, in words; None when the input has no such
    problem or the loader always ties the head, and that is proven (``Family.refuses_untie``: the
    missing head is what it expects)."""
    finding = next((f for f in det.findings if f.kind is FindingKind.UNTIED_BUT_NO_HEAD), None)
    if finding is None or det.family.refuses_untie:
        return None
    return (
        f"{describe(finding)}; the output keeps it: the {det.loader.name} loader would load it with a "
        f"random head (run untie to write {det.head.name}, or tie to set the flag true)"
    )


def _says_untied(config: dict[str, Any]) -> bool:
    """config.json (or a nested block of it) sets ``tie_word_embeddings`` false."""
    blocks = [config, *(v for v in config.values() if isinstance(v, dict))]
    return any(b.get("tie_word_embeddings") is False for b in blocks)


def hf_random_head_problems(ckpt: Checkpoint) -> list[str]:
    """:func:`random_head_problem` of ``ckpt`` under HF transformers, which reads what ``convert`` writes in
    the PaddleFormers/HF layout (a conversion keeps the head and the flag as they are); empty when tietool
    finds no embedding in it (convert needs none)."""
    if not _says_untied(ckpt.config):  # detection reads every name: only where the flag is false
        return []
    try:
        det = detect(ckpt, loader=Loader.HF, compare_values=False)
    except (CheckpointError, RefusedError, UsageError):
        return []
    problem = random_head_problem(det)
    return [problem] if problem else []


def warn_random_head(plan: Plan) -> Plan:
    """Add :func:`random_head_problem` to ``plan.warnings`` (printed on the terminal) unless the plan
    writes the head or sets ``tie_word_embeddings`` true. Returns ``plan``."""
    problem = random_head_problem(plan.det)
    writes_head = any(a.name == plan.det.head.name for a in plan.add) or plan.det.head.name in plan.replace
    ties = any(k.endswith("tie_word_embeddings") and v is True for _, k, v in plan.config_set)
    if problem and not (writes_head or ties):
        plan.warnings.append(problem)
    return plan


def unproven_note(det: Detection, plan: Plan, done: str) -> None:
    """Note what a write did instead of relying on an unproven loader fact (``done``), with the finding
    that words the missing proof and the ``loader`` option that names a proven loader."""
    finding = loader_facts_unproven(det)
    plan.notes.append(f"{done}: " + (describe(finding) if finding else "the loader facts are unproven"))


def check_dtypes(plan: Plan) -> Plan:
    """Refuse a plan that would compute with a tensor in a dtype tietool only copies as bytes: resize or new
    rows of a float8 / float4 / float6 / complex vocabulary tensor, a scaled copy of one; or transpose a
    packed sub-byte one (``F4``, ``F6_*``). Every other tensor of any dtype is copied byte for byte.

    Returns:
        ``plan``, unchanged.

    Raises:
        RefusedError: naming the tensor, its dtype and what the plan would do with it.
    """
    ckpt = plan.ckpt
    for nt in [*plan.replace.values(), *plan.add]:
        for use in uses(nt.recipe):
            d = ckpt.tensors[use.name].st_dtype
            if (use.values and not d.decodable) or d.packed:
                raise dtype_refusal(
                    ckpt.tensors[use.name],
                    ckpt.path,
                    use.doing,
                    "tietool resizes and converts vocabulary tensors stored as float (BF16, F16, F32, F64) "
                    "or integers: run it on the checkpoint before quantization, then quantize the output",
                    op=plan.op,
                )
    return plan
