"""The operations, end to end: open → detect → plan → write (or not, for a dry run) → report; and verify.

Each function is what one ``tietool`` command does; the CLI parses options, calls one of these and renders
the result. They are also the Python API (``tietool.tie(...)``). Paths are ``str`` or ``os.PathLike``.
Errors are the classes of :mod:`surgery.model.errors` (each with its :class:`~surgery.model.errors.ExitCode`);
nothing is written when one is raised, and the input is never modified.

Every writing operation is one :func:`surgery.run.run` of its :class:`~surgery.run.Planner` (how to open
the input and plan): the paths are coerced once, the options stay enums, the output is checked once, and in
place is an output policy of the run (in :mod:`surgery.run`). Every write is one
:class:`~surgery.plan.plan.Plan` (its layout: the input's files with a delta, a whole new checkpoint for
``convert`` and ``merge``, or a Trainer checkpoint's flex folders) through
:func:`surgery.write.writer.execute`, handed its report (:class:`surgery.report.Draft`), which the writer
stores in the output as ``tietool-report.json`` before the output is renamed (or swapped) into place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .inspect.detect import detect
from .inspect.detection import Detection
from .inspect.summary import check_found, check_index, check_names, inspect_path
from .io import flex, special_tokens, store, stores
from .io.checkpoint import Checkpoint, has_whole
from .io.formats import DEFAULT_MAX_SHARD_SIZE
from .model.enums import Init, Keep, Layout, Loader, Target, TokenInit, TransplantInit
from .model.errors import Opt, UsageError
from .results import Inspection, Report
from .run import EDIT, EDIT_WITH_STATE, NEW_CHECKPOINT, PathArg, Planner, WriteOptions, run
from .run import Advance as Advance
from .run import count_option as _count
from .run import enum_option as _enum
from .run import layout_option as _layout
from .run import path_arg as _path
from .run import write_options as _options
from .write import inplace

if TYPE_CHECKING:  # annotations only: each operation imports the planners, writer and report it runs
    from typing_extensions import Unpack

    from . import diff as diff_mod
    from .plan import convert as convert_plan
    from .plan.plan import Plan
    from .run import WriteArgs
    from .verify import VerifyResult


def inspect(
    path: PathArg = ".",
    *,
    layout: Layout | str | None = None,
    loader: Loader | str | None = None,
    embedding: str | None = None,
    head: str | None = None,
    compare_values: bool = True,
) -> Inspection:
    """What ``tietool inspect`` shows, as a dict (``--json`` prints it): the vocabulary surface with roles,
    shapes, dtypes and layouts, the tie state three ways, parameter counts and bytes, what tying saves.

    Args:
        embedding, head: tensor names, for architectures the table does not know.
        compare_values: read the embedding and head to tell "tied by value" (False: headers only).

    Raises:
        CheckpointError, UnsafePickleError, UsageError: as :meth:`Checkpoint.open` and :func:`detect`.
    """
    where = _path(path, "path")
    remote, before = not stores.is_local(where), store.TRANSFER.snapshot()
    try:
        # what a killed in-place run left (a missing folder is restored); object storage has no such runs
        rec = inplace.Recovery() if remote else inplace.recover(where)
    except OSError:
        rec = inplace.Recovery()  # a read-only parent folder: nothing to put right from here
    folder = None if remote else _flex_only(where)
    if folder is not None:  # a flex checkpoint: its structure and coverage, and how to merge it
        from .io import flex_cover

        flex_info = flex_cover.inspection(flex.open_flex(folder))
        if flex_info["exit_code"] == 0:
            from .plan.flex_vocabulary import add_vocabulary

            layout_, loader_ = _layout(layout), _enum(Loader, loader, "loader")
            add_vocabulary(flex_info, Path(where), layout_, loader_, embedding, head, compare_values)
        if rec:
            flex_info["recovered"] = rec.as_dict()
        return Inspection(flex_info)
    info = inspect_path(
        where,
        layout=_layout(layout),
        loader=_enum(Loader, loader, "loader"),
        embedding_name=embedding,
        head_name=head,
        compare_values=compare_values,
    )
    if rec:
        info["recovered"] = rec.as_dict()
    if remote:
        info["transferred"] = store.TRANSFER.since(before).as_dict()
    return Inspection(info)


def _flex_only(where: Any) -> flex.FlexFolder | None:
    """The flex checkpoint at local ``where`` when it holds no whole-model weights beside (a
    ``checkpoint-N/`` with HF weights from ``save_hf_steps`` is inspected as those weights)."""
    folder = flex.find(Path(where))
    if folder is None:
        return None
    names = {p.name for p in Path(where).iterdir() if p.is_file()}
    return None if has_whole(names) else folder


def _detection(ckpt: Checkpoint, opts: WriteOptions, first_difference: bool = False) -> Detection:
    """Detection for a write, with the tensor names and layout of ``opts``: the names checked, values
    compared (up to the first difference with ``first_difference``: for a planner that asks only whether
    head and embedding are equal, :func:`surgery.inspect.detect.detect`), a quantized table refused."""
    check_names(ckpt, opts.embedding, opts.head)
    det = detect(
        ckpt,
        layout=_layout(opts.layout),
        loader=_enum(Loader, opts.loader, "loader"),
        embedding_name=opts.embedding,
        head_name=opts.head,
        compare_values=True,
        first_difference=first_difference,
    )
    check_found(det)
    return det


def _edit(make_plan: Callable[[Checkpoint], Plan], keep_training_state: bool = False) -> Planner:
    """The :class:`Planner` of tie / untie / resize: ``make_plan`` followed by
    :func:`surgery.plan.plan.check_dtypes` (a tensor in a dtype tietool cannot compute in, such as a float8
    vocabulary table, is refused by name before anything is written) and, with ``keep_training_state``,
    the optimizer files resized with it (:func:`surgery.plan.training_state.plan_training_state`, which
    refuses a format it cannot resize)."""
    from .plan import convert as convert_plan
    from .plan.plan import check_dtypes, warn_random_head

    def plan(c: Checkpoint) -> Plan:
        p = convert_plan.warn_legacy_layout(warn_random_head(check_dtypes(make_plan(c))))
        if keep_training_state:
            from .plan.training_state import plan_training_state

            p.training_edit = plan_training_state(p)
        return p

    return Planner(plan=plan)


def _flex_edit(make_plan: Callable[[Checkpoint], Plan]) -> Planner:
    """The :class:`Planner` of resize / add-tokens ``--keep-training-state`` of a PaddleFormers Trainer flex
    checkpoint (:mod:`surgery.plan.flex_edit`): ``make_plan`` on the merged view (config.json as ``merge``
    finds it), the flex folders rewritten to the new shapes."""
    from .plan import flex_edit, merge_plans
    from .plan.plan import check_dtypes, warn_random_head

    def plan(src: Path) -> Plan:
        fp, view = flex_edit.open_view(src)
        return flex_edit.plan_flex_edit(fp, warn_random_head(check_dtypes(make_plan(view))))

    return Planner(open=merge_plans.rank_folder, plan=plan)


def tie(
    path: PathArg,
    out: PathArg | None = None,
    *,
    keep: Keep | str | None = None,
    drop_aliases: bool = False,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Drop the LM head where the loader re-ties it, after checking that its values equal the input
    embedding's; set ``tie_word_embeddings`` true (as PaddleFormers' ``tie_weights`` expects).

    Args:
        keep: when head and embedding differ, whose values to keep (None refuses).
        drop_aliases: also drop copies of the embedding under alias names (T5/BART encoder/decoder).
        out: the output folder (must not exist, or be empty); None rewrites ``path`` in place, crash-safe
            (:mod:`surgery.write.inplace`), keeping the old version as ``NAME.tietool-backup-<time>`` unless
            ``backup`` is False (its path is the report's ``in_place.backup``).
        options: the options every write shares (:class:`~surgery.run.WriteOptions`: ``layout``,
            ``loader``, ``embedding``, ``head``, ``dry_run``, ``link``, ``progress``, ``backup``); each may
            also be passed as a keyword argument of its name (``dry_run=True``), which overrides that field
            of ``options``. ``keep_training_state`` is ``resize``'s and ``add_tokens``' only.

    Returns:
        the parameter-savings report (:func:`surgery.report.build`).

    Raises:
        ValuesDifferError, AmbiguousLayoutError, RefusedError: see :func:`surgery.plan.tie.plan_tie`.
        CheckpointError, UsageError, OutputError: bad input (or an option the operation does not take),
            or an output that cannot be written.
        TypeError: a keyword argument that is no option.
    """
    from .plan.tie import plan_tie

    opts = _options(options, kwargs, "tie", EDIT)
    tied = _edit(
        lambda c: plan_tie(
            _detection(c, opts),
            keep=_enum(Keep, keep, "keep"),
            drop_aliases=drop_aliases,
        )
    )
    return run(tied, path, out, opts)


def untie(
    path: PathArg,
    out: PathArg | None = None,
    *,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Write the LM head as its own tensor equal to the input embedding, in the layout the loader expects
    (``layout``: AUTO), and set ``tie_word_embeddings`` false.

    Returns:
        the report. Raises as :func:`tie` (and ``RefusedError`` for a loader that always ties).
    """
    from .plan.untie import plan_untie

    opts = _options(options, kwargs, "untie", EDIT)
    untied = _edit(
        lambda c: plan_untie(
            _detection(c, opts),
            layout=_enum(Layout, opts.layout, "layout") or Layout.AUTO,
        )
    )
    return run(untied, path, out, opts)


def resize(
    path: PathArg,
    vocab_size: int | None = None,
    out: PathArg | None = None,
    *,
    pad_to_multiple_of: int | None = None,
    init: Init | str = Init.MEAN,
    seed: int | None = None,
    force: bool = False,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Grow or trim the vocabulary rows of every vocabulary tensor together (embedding, head, head bias,
    copies) and every vocabulary-size config key, as PaddleFormers' ``resize_token_embeddings`` (plus the
    untied head it leaves alone).

    Args:
        vocab_size: the new number of rows (≥ 1), rounded up to ``pad_to_multiple_of``; None: the current
            rows, rounded up (as HF ``resize_token_embeddings(None, pad_to_multiple_of=64)``).
        init: values of new rows: ``MEAN`` (the default) and ``NORMAL`` are random draws (``MEAN`` from
            N(mean, 1e-9 · covariance) of the old rows, as HF ``mean_resizing``), so both depend on ``seed``;
            ``ZEROS`` does not.
        seed: makes the random draws of ``MEAN`` and ``NORMAL`` reproducible (same seed, same bytes); None:
            a random seed, written in the report (to draw the same rows again).
        force: allow trimming rows.
        options: as :func:`tie`'s, and ``keep_training_state``: keep the optimizer, scheduler and trainer
            files, the optimizer state resized with the vocabulary.

    Returns:
        the report. Raises as :func:`tie`; ``RefusedError`` for a trim without ``force``.
    """
    from .plan.resize import plan_resize_to

    opts = _options(options, kwargs, "resize", EDIT_WITH_STATE)
    vocab_size = _count(vocab_size, "vocab_size")
    pad_to_multiple_of = _count(pad_to_multiple_of, "pad_to_multiple_of")

    def make(c: Checkpoint) -> Plan:
        det = _detection(c, opts)
        return plan_resize_to(
            det, vocab_size, pad_to_multiple_of, _enum(Init, init, "init") or Init.MEAN, seed, force
        )

    return run(_edit_planner(make, opts.keep_training_state, path), path, out, opts)


def _edit_planner(make_plan: Callable[[Checkpoint], Plan], keep_training_state: bool, path: Any) -> Planner:
    """:func:`_flex_edit` for ``--keep-training-state`` of a local Trainer flex checkpoint, else
    :func:`_edit` (which refuses a flex checkpoint, naming ``merge`` and ``--keep-training-state``)."""
    from .plan import flex_edit

    if keep_training_state and isinstance(path, str | PathLike) and flex_edit.is_trainer_checkpoint(path):
        return _flex_edit(make_plan)
    return _edit(make_plan, keep_training_state)


def add_tokens(
    path: PathArg,
    tokens: Sequence[str],
    out: PathArg | None = None,
    *,
    special: bool = False,
    init: TokenInit | str = TokenInit.SUBTOKENS,
    pad_to_multiple_of: int | None = None,
    seed: int | None = None,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Add ``tokens`` to the checkpoint's tokenizer and give them rows: every tokenizer file edited
    (:func:`surgery.io.tokenizer_edit.add_tokens_edit`: contiguous ids from the tokenizer's length, a string
    it already has as one token reported, not added), the rows planned by
    :func:`surgery.plan.add_tokens.plan_add_tokens` (slack rows first, then every vocabulary tensor grown as
    ``resize`` grows it, to a multiple of ``pad_to_multiple_of`` and of the config's tensor-parallel degree).

    Args:
        tokens: the strings, in the order their ids are given (repeats counted once).
        special: add them as special tokens (never split; ``CONTROL`` pieces in SentencePiece).
        init: ``subtokens`` (default), ``mean``, ``trained-mean``, ``zeros``, ``copy:TOKEN`` (one token).
        seed: makes the random draws (``mean``, ``trained-mean``, padding rows) reproducible; None: drawn.
        out: the output folder; None rewrites ``path`` in place (as :func:`tie`).

    Returns the report (its ``add_tokens`` fields: each token's id, init and source ids). Raises
        UsageError: no token, an empty or non-string token, a bad ``init`` (``copy:`` of a string that is
            not one token), a URL. RefusedError: a tokenizer it cannot edit; what ``plan_add_tokens`` refuses.
        TietoolError: no ``tokenizer`` extra (``pip install ".[tokenizer]"``); and as :func:`tie`.
    """
    from .plan import add_tokens as token_plan
    from .plan.add_tokens import parse_init, plan_add_tokens

    opts = _options(options, kwargs, "add_tokens", EDIT_WITH_STATE)
    strings = _token_strings(tokens)
    choice = parse_init(init)
    pad_to_multiple_of = _count(pad_to_multiple_of, "pad_to_multiple_of")
    store.local_only("add-tokens", path, out)

    def plan(c: Checkpoint) -> Plan:
        det = _detection(c, opts)
        tokenizer = _tokenizer_edit()
        edit = tokenizer.add_tokens_edit(c.path, strings, special=special)
        copy_id = token_plan.copy_token_id(c.path, choice, tokenizer.add_tokens_edit)
        return plan_add_tokens(det, edit, choice, pad_to_multiple_of, seed, copy_id)

    return run(_edit_planner(plan, opts.keep_training_state, path), path, out, opts)


def fix_untrained(
    path: PathArg,
    out: PathArg | None = None,
    *,
    ids: Sequence[int] | None = None,
    init: str = "trained-mean",
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Set the rows a model never trained to the mean of its trained rows, as unsloth's
    ``fix_untrained_tokens`` finds and sets them (:func:`surgery.plan.fix_untrained.plan_fix_untrained`):
    the embedding's rows and the head's (its own mean, or the embedding's when the two are one tensor);
    every other byte, the shapes, the config and the tokenizer files unchanged.

    Args:
        ids: only these rows (each must be untrained by the rule); None: every untrained row.
        init: ``trained-mean`` (unsloth's value) or ``subtokens`` (the mean of the rows of the token's text
            split without the token, the trained mean where that split is empty or untrained).
        out: the output folder; None rewrites ``path`` in place (as :func:`tie`).

    Returns the report (its ``fix_untrained`` fields: the ids and tokens set, the special rows kept, the
    norm of each mean). Raises as :func:`tie`; UsageError for an id that is not an untrained row.
    """
    from .plan.fix_untrained import plan_fix_untrained

    opts = _options(options, kwargs, "fix_untrained", EDIT)
    chosen = None if ids is None else [_count(i, "ids") for i in ids]

    def plan(c: Checkpoint) -> Plan:
        det = _detection(c, opts)
        return plan_fix_untrained(det, chosen, init)  # type: ignore[arg-type]

    return run(_edit(plan), path, out, opts)


def _rename_pairs(renames: Mapping[int, str], set_special: Mapping[str, str] | None) -> dict[int, str]:
    """:func:`rename_tokens`' ``renames`` checked: ``{id: non-empty string}`` with ids counted as ints.

    Raises:
        UsageError: not a mapping, empty with no ``set_special``, an id that is None or not a count,
            a string that is empty or not a string.
    """
    if not isinstance(renames, Mapping) or not (renames or set_special):
        raise UsageError("renames must be a non-empty {id: string} mapping", fix='e.g. {128002: "<think>"}')
    pairs: dict[int, str] = {}
    for i, s in (renames or {}).items():
        n = _count(i, "renames")
        if n is None:
            raise UsageError("a token id is None", fix='e.g. {128002: "<think>"}')
        pairs[n] = s
    bad = [s for s in pairs.values() if not isinstance(s, str) or not s]
    if bad:
        raise UsageError(f"a token must be a non-empty string, got {bad[0]!r}", fix="remove it")
    return pairs


def rename_tokens(
    path: PathArg,
    renames: Mapping[int, str],
    out: PathArg | None = None,
    *,
    special: bool = False,
    init: str = "keep",
    set_special: Mapping[str, str] | None = None,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Give reserved or unused slots new strings (``{id: string}``) in every tokenizer file
    (:func:`surgery.io.tokenizer_rename.rename_tokens_edit`), the model never grown: each id keeps its row
    (``init`` ``keep``), the mean of the trained rows (``trained-mean``) or of the rows its string split
    into before (``subtokens``,
    :func:`surgery.plan.rename_tokens.plan_rename_tokens`).

    Args:
        renames: token id → its new string; each id must be a reserved slot (``<|reserved_special_token_N|>``,
            ``[unusedN]``, ...).
        special: the new tokens are special (never split; ``CONTROL`` pieces).
        set_special: ``{"pad": "<|pad|>"}``: make that token (after the renames) the pad / bos / eos token
            in every file that names it (:mod:`surgery.io.special_tokens`); ``renames`` may then be empty.
        out: the output folder; None rewrites ``path`` in place (as :func:`tie`).

    Returns the report (its ``rename_tokens`` fields). Raises UsageError for bad ``renames``; RefusedError
    for a slot that is not reserved or a format a loader cannot read renamed; and as :func:`tie`.
    """
    from .plan.rename_tokens import plan_rename_tokens, special_ids, split_ids

    opts = _options(options, kwargs, "rename_tokens", EDIT)
    pairs = _rename_pairs(renames, set_special)
    store.local_only("rename-tokens", path, out)

    def plan(c: Checkpoint) -> Plan:
        from .io import tokenizer_rename
        from .io.tokenizer import vocabulary

        det = _detection(c, opts)
        vocab = vocabulary(c.path)
        old = {i: vocab.get(i, "") for i in pairs}
        edit = tokenizer_rename.rename_tokens_edit(c.path, pairs, special=special)
        specials = special_ids(c.path, {**vocab, **pairs}, dict(set_special or {}))
        if specials:
            files = special_tokens.special_files(c.path, specials, edit.files)
            edit = replace(edit, files={**edit.files, **files})
        sets = special_tokens.special_config_sets(c.path, specials, det.config.text_key)
        subs = split_ids(c.path, pairs, special) if init == "subtokens" else None
        return plan_rename_tokens(det, edit, old, init, sets, specials, subs)

    return run(_edit(plan), path, out, opts)


def _tokenizer_edit() -> Any:
    """:mod:`surgery.io.tokenizer_edit`, imported on first use (:func:`token_plan.tokenizer_edit`)."""
    from .plan import add_tokens as token_plan

    return token_plan.tokenizer_edit()


def _token_strings(tokens: object) -> list[str]:
    """``tokens`` as a list of distinct non-empty strings, in order.

    Raises:
        UsageError: a single string (not a list), no token, an empty or non-string one.
    """
    if isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence):
        raise UsageError(
            f"tokens must be a list of strings, got {type(tokens).__name__}", fix='e.g. ["<think>"]'
        )
    bad = [t for t in tokens if not isinstance(t, str) or not t]
    if bad:
        raise UsageError(f"a token must be a non-empty string, got {bad[0]!r}", fix="remove it")
    if not tokens:
        raise UsageError("add-tokens needs at least one token", fix="give the strings to add")
    return list(dict.fromkeys(tokens))


def verify(
    before: PathArg, after: PathArg, *, logits: bool = False, logits_with: str | None = None
) -> VerifyResult:
    """Check that ``after`` differs from ``before`` exactly as tie / untie / resize explain (every other
    tensor bit-identical, every vocabulary tensor and size key moved together); ``logits`` also compares
    logits (PaddleFormers; a PaddleNLP side in PaddleNLP 2.8.1); ``logits_with`` (``paddleformers``,
    ``paddlenlp``, ``hf``) names the library that runs the output and implies ``logits``. The verdict is
    ``result.exit_code``. Raises as :meth:`Checkpoint.open`; UsageError for an unknown ``logits_with``."""
    from .verify import verify as _verify

    return _verify(_path(before, "before"), _path(after, "after"), logits=logits, logits_with=logits_with)


def diff(a: PathArg, b: PathArg, *, values: bool = True) -> diff_mod.DiffResult:
    """What differs between checkpoints ``a`` and ``b``, and by how much; nothing is written.

    Each is a folder or a URL (``s3://``, ``hf://``) of safetensors or ``.pdparams`` weights; a folder of
    rank files or a flex checkpoint (a Trainer ``checkpoint-N/``) is compared as the checkpoint :func:`merge`
    would write of it. Tensors are read once, in chunks (memory: two chunks of ~4 MiB, or one whole tensor
    of a merged side), bit-identical chunks skipped at memory speed.

    Args:
        values: read the tensors' data (False: headers only: names, dtypes, shapes, byte ranges).

    Returns:
        the :class:`~surgery.diff.DiffResult`: tensors ``added`` / ``removed`` / ``renamed`` (same shape,
        dtype and bytes under another name) / ``changed`` (dtype and shape before and after, ``max_abs_diff``,
        ``relative_norm`` = ‖B − A‖ / ‖A‖ in float64, ``rows_changed`` of a vocabulary tensor as token-id
        ranges), config keys, safetensors metadata, tokenizer tokens (added, removed, renumbered) and other
        files (size and sha256); ``result.as_dict()`` is ``tietool diff --json``; ``result.exit_code`` is 0
        when identical, 1 when they differ.

    Raises:
        CheckpointError, UnsafePickleError, RefusedError, StorageError, UsageError: a side that cannot be
            read (as :meth:`Checkpoint.open`, :func:`merge`'s planning of rank files or a flex checkpoint),
            a path that is not ``str`` / ``os.PathLike``.
    """
    from . import diff as diff_mod

    return diff_mod.diff(_path(a, "a"), _path(b, "b"), values=bool(values))


def convert(
    path: PathArg,
    to: Target | str,
    out: PathArg,
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Convert checkpoint ``path`` to the convention or container ``to`` (see
    :func:`surgery.plan.convert.plan_convert`), written to ``out`` atomically (a temporary folder renamed into
    place when complete, as :func:`surgery.write.writer.write_new`), sharded at ``max_shard_size`` bytes
    (default ``"10GB"`` = 10·10⁹ bytes, as PaddleFormers' ``save_pretrained``; ints, ``"500MB"``, ``"2GiB"``
    accepted).

    Tensors stream one at a time: a copied tensor by byte range, a transposed or split one loaded in its
    stored dtype (bf16 as ``uint16`` bits, never converted), rearranged, written and dropped. ``options``
    (or keyword arguments): ``dry_run`` and ``progress`` as :func:`merge`'s.

    Returns:
        the report (:func:`surgery.report.convert_report`), also written as ``out/tietool-report.json`` (not
        for a dry run).

    Raises:
        UsageError: ``to`` not a target, a bad ``max_shard_size``, an ``out`` that is the input, inside it or
            not empty.
        CheckpointError: a missing or corrupt input, or one whose layout contradicts its names.
        RefusedError: see :func:`surgery.plan.convert.plan_convert`.
        OutputError: the output cannot be written; nothing is left behind.
    """
    from .plan import convert as convert_plan
    from .plan.plan import hf_random_head_problems, parse_size

    opts = _options(options, kwargs, "convert", NEW_CHECKPOINT)
    target = _enum(Target, to, "to")
    assert target is not None, "convert needs a target"
    limit = parse_size(max_shard_size)
    for arg, what in ((path, "path"), (out, "out")):
        if isinstance(arg, bytes) or not isinstance(arg, str | PathLike):
            raise UsageError(f"{what} must be a folder path (str or os.PathLike), got {type(arg).__name__}")
    store.local_only("convert", path, out)

    def plan(ckpt: Checkpoint) -> convert_plan.ConvertPlan:
        p = convert_plan.check_dtypes(convert_plan.plan_convert(ckpt, target))
        convert_plan.note_left_out(p)
        if target in (Target.PADDLEFORMERS, Target.SAFETENSORS):
            p.warnings += hf_random_head_problems(ckpt)
        return p

    converted = Planner(
        open=lambda p: _indexed(Checkpoint.open(Path(p))),
        plan=plan,
        write=lambda p: convert_plan.output_plan(p, limit),
        to=target,
    )
    return run(converted, path, out, opts)


def _indexed(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt``, its index checked (:func:`surgery.inspect.summary.check_index`)."""
    check_index(ckpt)
    return ckpt


def merge(
    path: PathArg,
    out: PathArg,
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    keep_paddle_layout: bool = False,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Merge tensor-parallel (and pipeline-parallel) rank files into one whole checkpoint in ``out``, each
    tensor joined by its family's rule (:mod:`surgery.plan.merge`); expert-parallel rank files as the union
    of their experts (:mod:`surgery.plan.merge_experts`); or a flex checkpoint (the PaddleFormers Trainer's
    ``checkpoint-N/``), every global tensor assembled from its slices (:mod:`surgery.plan.merge_flex`).
    Values keep their dtype and bits (bf16 stays bf16). The output of rank files is in their container and
    names: ``model_state.pdparams`` (or shards of at most
    ``max_shard_size`` with ``model_state.pdparams.index.json``, as PaddleNLP's ``save_pretrained``),
    config.json with ``tensor_parallel_degree``-like keys set to 1, the other files copied, and
    ``tietool-report.json`` listing each tensor's rule and axis.

    Args:
        max_shard_size: bytes or a size (``"10GB"``, PaddleFormers' default).
        keep_paddle_layout: a flex checkpoint only: write its tensors in the Paddle layout the training run
            held (Linear weights ``[in, out]``, fused projections), unconverted, with config
            ``"source": "paddle"``; the report's warning names the load it needs (PaddleFormers'
            ``from_pretrained(out, load_checkpoint_format="legacy", convert_from_hf=False)``). Without it,
            a model type tietool cannot convert is refused.
        options: :class:`~surgery.run.WriteOptions`' ``dry_run`` (check and plan everything: rank files
            read, shapes checked; write nothing, the report names the files a run would write) and
            ``progress``, also as keyword arguments of their names; the other options are refused.

    Returns:
        the report (also ``out/tietool-report.json``); ``parameters_before`` counts every rank's tensors
        (:func:`surgery.report.merge_totals`); ``warnings`` (printed by the CLI).

    Raises:
        UsageError: no rank files, whole weights beside them, a bad ``out`` or ``max_shard_size``;
            ``keep_paddle_layout`` for rank files (not a flex checkpoint).
        CheckpointError: a rank file missing (named), damaged, or config.json lacking a size.
        RefusedError: a flex checkpoint of a model type tietool cannot convert (without
            ``keep_paddle_layout``; named with its layout), an unknown family or tensor, a replicated
            tensor that differs between ranks, a shape that does not fit config.json. Nothing is written
            when any is raised.
        OutputError: the output cannot be written.
    """
    from .plan import merge_plans
    from .plan.plan import parse_size

    opts = _options(options, kwargs, "merge", NEW_CHECKPOINT)
    store.local_only("merge", path, out)
    limit = partial(parse_size, max_shard_size)  # checked once the folders are (as the plan starts)
    plan = merge_plans.planner_for(Path(str(path)), limit, keep_paddle_layout)
    merged = Planner(open=merge_plans.rank_folder, plan=plan)
    return run(merged, path, out, opts)


def prune(
    path: PathArg,
    keep_ids: Sequence[int] | None = None,
    out: PathArg | None = None,
    *,
    corpus: str | None = None,
    keep_special: bool = False,
    keep_source: PathArg | None = None,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Cut the model to the token ids ``keep_ids`` (:func:`surgery.plan.prune.plan_prune`): every vocabulary
    tensor keeps the kept entries byte for byte, renumbered in their old order; the tokenizer files, the
    config's ``vocab_size`` and every token id a configuration file names follow.

    Args:
        keep_ids: the old ids to keep (any order; duplicates ignored).
        corpus: text whose tokens to keep instead (the ids ``tokenizer.json`` gives its lines, with the
            tokens BPE merges into them; implies ``keep_special``,
            :func:`surgery.io.tokenizer_prune.corpus_ids`).
        keep_special: also keep every added token, every token a configuration file names and the byte
            tokens of a byte-level / byte-fallback BPE.
        keep_source: the keep-file ``keep_ids`` were read from (named by an error about them).
        out: the output folder; None rewrites ``path`` in place (as :func:`tie`).

    Returns the report (its ``prune`` fields: rows before/after, ``id_map`` old → new). Raises UsageError for
    an empty keep-list or an id outside the vocabulary; RefusedError for a special id or byte token not
    kept, or a tokenizer format whose pruning is not proven; and as :func:`tie`.
    """
    from .plan.prune import plan_prune

    opts = _options(options, kwargs, "prune", EDIT)
    if (keep_ids is None) == (corpus is None):
        raise UsageError(
            "pass a keep-list or a keep-corpus (one of them)", fix=f"e.g. {Opt('keep_ids', [0, 1, 2])}"
        )
    ids = [_count(i, "keep_ids") for i in keep_ids or []]
    store.local_only("prune", path, out)

    def plan(c: Checkpoint) -> Plan:
        det = _detection(c, opts, first_difference=True)  # prune asks only: head == embedding?
        if corpus is not None:
            from .io.tokenizer_prune import corpus_ids

            return plan_prune(det, corpus_ids(c.path, corpus), True, corpus.splitlines())
        src = Path(keep_source) if keep_source is not None else None
        return plan_prune(det, [i for i in ids if i is not None], keep_special, keep_source=src)

    return run(_edit(plan), path, out, opts)


def _omp_options(how: TransplantInit, donor_model: PathArg | None, k: int | None) -> tuple[Path | None, int]:
    """``(donor_model, k)`` of a transplant: both only with omp, which needs ``donor_model``, and ``k`` at
    least 1 (UsageError)."""
    from .plan.transplant_omp import K_DEFAULT

    if how is not TransplantInit.OMP:
        if donor_model is not None or k is not None:
            omp = Opt("init", TransplantInit.OMP)
            raise UsageError(
                f"{Opt('donor_model')} and {Opt('k')} are read only by {omp}",
                fix=f"add {omp}, or leave them out",
            )
        return None, K_DEFAULT
    if donor_model is None:
        raise UsageError(
            f"{Opt('init', TransplantInit.OMP)} needs the donor's weights",
            fix=f"pass {Opt('donor_model')} DONOR_CHECKPOINT_DIR",
        )
    if k is not None and k < 1:
        raise UsageError(
            f"{Opt('k', k)}: omp makes each new token of at least one shared token",
            fix=f"pass {Opt('k', 1)} or more (default {K_DEFAULT})",
        )
    return Path(str(donor_model)), K_DEFAULT if k is None else k


def transplant(
    path: PathArg,
    tokenizer: PathArg,
    out: PathArg | None = None,
    *,
    init: TransplantInit | str = TransplantInit.SUBWORD,
    donor_model: PathArg | None = None,
    k: int | None = None,
    options: WriteOptions | None = None,
    **kwargs: Unpack[WriteArgs],
) -> Report:
    """Give the model the tokenizer of the folder ``tokenizer`` (a donor's; see
    :func:`surgery.plan.transplant.plan_transplant`): every vocabulary tensor laid out in the donor's id
    order, each donor token's entry the old entry of the same token string (bit for bit) or made by ``init``
    (``subword``: the mean of the old entries of the old tokenizer's split of its text; ``mean``; ``zeros``;
    ``omp``: mergekit-tokensurgeon's orthogonal matching pursuit of ``k`` atoms, default 64, over the shared
    tokens of the checkpoint ``donor_model``, :mod:`surgery.plan.transplant_omp`); the donor's tokenizer
    files, ``vocab_size`` and the config's token ids follow. ``out`` None rewrites ``path`` in place (as
    :func:`tie`).

    Returns the report (its ``transplant`` section: per new id how its entries were made, and counts).
    Raises UsageError for a bad ``init``, a donor that is not a folder, omp without ``donor_model`` or
    ``donor_model`` / ``k`` without omp; RefusedError for a donor model as
    :func:`surgery.plan.transplant_omp.plan_omp` refuses it; RefusedError for a tokenizer
    tietool cannot read (the model's or the donor's), a config token id the donor has no token for, and as
    :func:`prune`.
    """
    from .plan.transplant import plan_transplant

    opts = _options(options, kwargs, "transplant", EDIT)
    how = _enum(TransplantInit, init, "init")
    assert how is not None, "transplant needs an init"
    donor = Path(str(_path(tokenizer, "tokenizer")))
    omp = _omp_options(how, donor_model, k)
    store.local_only("transplant", path, out)

    def plan(c: Checkpoint) -> Plan:
        return plan_transplant(_detection(c, opts, first_difference=True), donor, how, *omp)

    return run(_edit(plan), path, out, opts)
