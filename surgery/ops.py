"""The operations, end to end: open → detect → plan → write (or not, for a dry run) → report; and verify.

Each function is what one ``tietool`` command does; the CLI parses options, calls one of these and renders
the result. They are also the Python API (``tietool.tie(...)``). Paths are ``str`` or ``os.PathLike``.
Errors are the classes of :mod:`surgery.model.errors` (each with its
:class:`~surgery.model.errors.ExitCode`); nothing
is written when one is raised, and the input is never modified.

The report (a dict, :func:`surgery.report.build`) is returned and, for a real run, also stored in the output
as ``tietool-report.json`` before the output is renamed into place.
"""

from __future__ import annotations

import numbers
import os
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from enum import Enum
from os import PathLike
from pathlib import Path
from typing import Any

from . import report as report_mod
from .inspect.detect import Detection, detect
from .inspect.summary import check_found, check_names, inspect_path
from .io import store, surface
from .io.checkpoint import Checkpoint
from .model.enums import Init, Keep, Layout, Loader
from .model.errors import Interrupted, Opt, OutputError, RefusedError, UsageError
from .plan.plan import Plan, check_dtypes
from .plan.resize import plan_resize
from .plan.tie import plan_tie
from .plan.untie import plan_untie
from .results import Inspection, Report
from .verify import VerifyResult
from .verify import verify as _verify
from .write import inplace
from .write.publish import check_output_path, fsync_dir, fsync_tree, output_folder, remove_dead_temps
from .write.writer import execute

PathArg = str | PathLike[str]

Advance = Callable[[str, int], None]
"""Called with (file name, bytes) as bytes are written; must be thread-safe."""

ProgressFactory = Callable[[int], AbstractContextManager[Advance | None]]
"""Given the bytes the output will hold, a context manager that yields an :data:`Advance` (or None)."""


def _option(kind: type[Enum], x: Enum | str | None, name: str) -> str | None:
    """The value of option ``name`` as the library's string, checked against the enum ``kind``.

    Raises:
        UsageError: ``x`` is not one of ``kind``'s values (as the CLI's choices refuse it).
    """
    if x is None:
        return None
    try:
        return str(kind(x.value if isinstance(x, Enum) else x).value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise UsageError(
            f"{Opt(name)} must be one of {allowed}, got {x!r}",
            fix=f"e.g. {Opt(name, next(iter(kind)).value)}",
        ) from None


def _layout(layout: Layout | str | None) -> str | None:
    v = _option(Layout, layout, "layout")
    return None if v in (None, Layout.AUTO.value) else v


def _path(p: object, name: str) -> Any:
    """A folder argument as a Path, or a URL (``s3://``, ``hf://``) as a remote path
    (:func:`store.as_path`). Raises UsageError for anything but ``str`` / ``os.PathLike``."""
    if isinstance(p, bytes) or not isinstance(p, str | PathLike):
        raise UsageError(
            f"{name} must be a folder path (str or os.PathLike), got {type(p).__name__}", fix='e.g. "ckpt/"'
        )
    return store.as_path(p) if isinstance(p, str) else Path(p)


def _count(x: object, name: str) -> int | None:
    """A count option (``vocab_size``, ``pad_to_multiple_of``) as an int; numpy integers are ints, a bool
    is not. Raises UsageError otherwise (the range is checked by the planner)."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise UsageError(f"{Opt(name)} must be an integer, got {x!r}", fix=f"e.g. {Opt(name, 32000)}")
    return int(x)


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
    remote, before = not store.store_for(where).on_disk, store.TRANSFER.snapshot()
    try:
        # what a killed in-place run left (a missing folder is restored); object storage has no such runs
        rec = inplace.Recovery() if remote else inplace.recover(where)
    except OSError:
        rec = inplace.Recovery()  # a read-only parent folder: nothing to put right from here
    info = inspect_path(
        where,
        layout=_layout(layout),
        loader=_option(Loader, loader, "loader"),
        embedding_name=embedding,
        head_name=head,
        compare_values=compare_values,
    )
    if rec:
        info["recovered"] = rec.as_dict()
    if remote:
        info["transferred"] = store.TRANSFER.since(before).as_dict()
    return Inspection(info)


def _detection(
    ckpt: Checkpoint,
    layout: Layout | str | None,
    loader: Loader | str | None,
    embedding: str | None,
    head: str | None,
) -> Detection:
    """Detection for a write: the names checked, values compared, a quantized table refused."""
    check_names(ckpt, embedding, head)
    det = detect(
        ckpt,
        layout=_layout(layout),
        loader=_option(Loader, loader, "loader"),
        embedding_name=embedding,
        head_name=head,
        compare_values=True,
    )
    check_found(det)
    return det


def _run_plan(
    path: PathArg,
    out: PathArg | None,
    make_plan: Callable[[Checkpoint], Plan],
    dry_run: bool,
    link: bool,
    progress: ProgressFactory | None,
    keep_training_state: bool = False,
    backup: bool = True,
) -> Report:
    """Open ``path``, plan, and either report the plan (``dry_run``) or write it to ``out`` atomically
    with the report inside (``out`` None: in place, :func:`_in_place`); returns the report."""
    src = _path(path, "path")
    before = store.TRANSFER.snapshot()  # bytes moved from here on: headers, values, copies
    make_plan = _dtype_checked(make_plan)
    if out is None and not store.store_for(src).on_disk and not dry_run:
        raise UsageError(
            "cannot rewrite a checkpoint in object storage in place: the store has no atomic swap "
            "(a reader could see a half-written checkpoint)",
            str(src),
            f"write to another prefix with {Opt('out')} (a URL or a local folder)",
        )
    if out is None and store.store_for(src).on_disk:
        return Report(_in_place(src, make_plan, dry_run, progress, keep_training_state, backup))
    dst = src if out is None else _path(out, "out")  # out None here: a dry run on a URL, writes nothing
    ckpt = Checkpoint.open(src)
    if not dry_run:
        check_output_path(ckpt.path, dst)
    plan = make_plan(ckpt)
    if dry_run:
        rep = report_mod.build(plan, None, str(dst), dry_run=True, keep_training_state=keep_training_state)
        if not store.store_for(src).on_disk or not store.store_for(dst).on_disk:
            rep["transferred"] = store.TRANSFER.since(before).as_dict()
        return Report(rep)
    real = Path(os.path.abspath(output_folder(dst))) if store.store_for(dst).on_disk else None
    stale = [] if real is None else remove_dead_temps(real.parent)

    def report(facts: dict) -> dict:
        rep = report_mod.build(plan, facts, str(dst))
        return {**rep, "removed_stale_temps": stale} if stale else rep

    with (progress or (lambda _total: nullcontext(None)))(plan.output_bytes) as advance:
        rep = execute(
            plan,
            dst,
            link=link,
            progress=advance,
            report=report,
            keep_training_state=keep_training_state,
        )
    if not store.store_for(src).on_disk or not store.store_for(dst).on_disk:
        rep["transferred"] = store.TRANSFER.since(before).as_dict()
    return Report(rep)


def _dtype_checked(make_plan: Callable[[Checkpoint], Plan]) -> Callable[[Checkpoint], Plan]:
    """``make_plan`` followed by :func:`surgery.plan.plan.check_dtypes` (a tensor in a dtype tietool cannot
    compute in, such as a float8 vocabulary table, is refused by name before anything is written)."""
    return lambda c: check_dtypes(make_plan(c))


def _in_place(
    path: Path,
    make_plan: Callable[[Checkpoint], Plan],
    dry_run: bool,
    progress: ProgressFactory | None,
    keep_training_state: bool,
    backup: bool,
) -> dict:
    """Rewrite checkpoint ``path`` in place (:mod:`surgery.write.inplace`): what killed runs left is put right
    first; the new version is built beside it with untouched files hard-linked, read back, and swapped in;
    the old one is kept as a backup unless ``backup`` is False. A plan that changes nothing writes nothing.

    Raises:
        RefusedError: no backup asked for while the write would leave files out (they would be deleted).
        OutputError: a mount point (it cannot be swapped), or what :func:`_write_in_place` raises.
        and what :func:`_run_plan` raises; the checkpoint is then unchanged.
    """
    ckpt_path = inplace.target(path)
    rec = inplace.recover(ckpt_path)
    read = inplace.folder_id(ckpt_path)
    files = inplace.input_files(ckpt_path)  # before anything is read: compared before the swap
    plan = make_plan(Checkpoint.open(ckpt_path))
    if dry_run or not plan.changed:
        rep = report_mod.build(
            plan, None, str(ckpt_path), dry_run=dry_run, keep_training_state=keep_training_state
        )
        rep["in_place"] = {"written": False, "backup": None, "recovered": rec.as_dict()}
        return rep
    if not backup:
        _refuse_deleting_left_out(plan, keep_training_state)
    inplace.check_swappable(ckpt_path)
    with inplace.locked(ckpt_path):  # one writing run per checkpoint at a time
        inplace.check_same_folder(ckpt_path, read, None)  # not swapped by another run since it was read
        return _write_in_place(plan, (read, files), rec.as_dict(), progress, keep_training_state, backup)


def _write_in_place(
    plan: Plan,
    read: tuple[tuple[int, int] | None, dict[str, inplace.FileId]],
    recovered: dict,
    progress: ProgressFactory | None,
    keep_training_state: bool,
    backup: bool,
) -> dict:
    """The write of :func:`_in_place`, under its lock: build the new version at a staging name, check that
    the folder under the name and every file in it are still the ones read (``read``:
    :func:`inplace.folder_id` and :func:`inplace.input_files` at the start), swap it in.

    Raises:
        RefusedError: the folder was replaced meanwhile; CheckpointError: a file in it changed (the new
            version is removed in both cases).
        OutputError: the write or the swap failed; the checkpoint is then unchanged.
        Interrupted: a Ctrl-C or SIGTERM; its ``state`` says what the name holds.
    """
    ckpt_path = plan.ckpt.path
    token, bak = inplace.new_token(), (inplace.backup_name(ckpt_path) if backup else None)
    staging = inplace.staging_path(ckpt_path, token)
    info = {"written": True, "token": token, "backup": str(bak) if bak else None, "recovered": recovered}

    def report(facts: dict) -> dict:
        return {**report_mod.build(plan, facts, str(ckpt_path)), "in_place": info}

    try:
        with (progress or (lambda _total: nullcontext(None)))(plan.output_bytes) as advance:
            rep = execute(
                plan,
                staging,
                link=True,
                progress=advance,
                report=report,
                keep_training_state=keep_training_state,
                keep_folder_links=True,
            )
        inplace.keep_modes(ckpt_path, staging, plan.ckpt.weight_files)
        fsync_tree(staging)
        inplace.pause("check")
        inplace.check_same_folder(ckpt_path, read[0], staging)
        inplace.check_inputs(ckpt_path, read[1], staging)
        swapped = _swap(ckpt_path, staging, bak, token)
    except KeyboardInterrupt:
        raise Interrupted(inplace.interrupted_state(ckpt_path, token, staging, bak)) from None
    except BaseException:
        if inplace.token_of(staging) == token:  # the new version, never swapped in
            shutil.rmtree(staging, ignore_errors=True)
        raise
    info["atomic_exchange"] = swapped.exchanged
    if swapped.left_to_delete is not None:
        info["left_to_delete"], info["delete_error"] = swapped.left_to_delete, swapped.error
    return {**rep, "in_place": info}


def _swap(ckpt_path: Path, staging: Path, bak: Path | None, token: str) -> inplace.Swapped:
    """:func:`inplace.swap_in`, with the error saying what the name holds when it fails.

    Raises:
        OutputError: the swap failed (permissions, a busy mount): the name holds the old version (the
            caller removes the new one); or, after the exchange, moving the old version away failed.
    """
    try:
        return inplace.swap_in(ckpt_path, staging, bak, token, fsync_dir)
    except OSError as e:
        if inplace.token_of(ckpt_path) == token:
            raise OutputError(
                f"the new version is in place, but the previous version could not be moved from {staging} "
                f"({e.strerror})",
                ckpt_path,
                "the next tietool run on it keeps that folder as a backup; delete it if you do not need it",
            ) from None
        raise OutputError(
            f"could not swap the new version in ({e.strerror}); the checkpoint is unchanged and the new "
            "version was removed",
            ckpt_path,
            "free the folder (permissions, a busy mount) and run again",
        ) from None


def _refuse_deleting_left_out(plan: Plan, keep_training_state: bool) -> None:
    """In place without a backup, files the output leaves out would be deleted: refuse, naming them."""
    ck = plan.ckpt
    lost = [
        x.file
        for x in surface.output_left_out(
            ck.path, ck.left_out, ck.training_state, plan.changed, keep_training_state
        )
        if not x.kept
    ]
    if lost:
        raise RefusedError(
            f"in place without a backup would delete {', '.join(lost)} (not part of the new checkpoint)",
            ck.path,
            "keep the backup (the default), keep the training state, or write to another folder",
        )


def tie(
    path: PathArg,
    out: PathArg | None = None,
    *,
    keep: Keep | str | None = None,
    drop_aliases: bool = False,
    layout: Layout | str | None = None,
    loader: Loader | str | None = None,
    embedding: str | None = None,
    head: str | None = None,
    dry_run: bool = False,
    link: bool = False,
    progress: ProgressFactory | None = None,
    backup: bool = True,
) -> Report:
    """Drop the LM head where the loader re-ties it, after checking that its values equal the input
    embedding's; set ``tie_word_embeddings`` true (as PaddleFormers' ``tie_weights`` expects).

    Args:
        keep: when head and embedding differ, whose values to keep (None refuses).
        drop_aliases: also drop copies of the embedding under alias names (T5/BART encoder/decoder).
        out: the output folder (must not exist, or be empty); None rewrites ``path`` in place, crash-safe
            (:mod:`surgery.write.inplace`), keeping the old version as ``NAME.tietool-backup-<time>`` unless
            ``backup`` is False (its path is the report's ``in_place.backup``).
        link: hard-link untouched weight files instead of copying them (always, in place).

    Returns:
        the parameter-savings report (:func:`surgery.report.build`).

    Raises:
        ValuesDifferError, AmbiguousLayoutError, RefusedError: see :func:`surgery.plan.tie.plan_tie`.
        CheckpointError, UsageError, OutputError: bad input or an output that cannot be written.
    """
    return _run_plan(
        path,
        out,
        lambda c: plan_tie(
            _detection(c, layout, loader, embedding, head),
            keep=_option(Keep, keep, "keep"),
            drop_aliases=drop_aliases,
        ),
        dry_run,
        link,
        progress,
        backup=backup,
    )


def untie(
    path: PathArg,
    out: PathArg | None = None,
    *,
    layout: Layout | str = Layout.AUTO,
    loader: Loader | str | None = None,
    embedding: str | None = None,
    head: str | None = None,
    dry_run: bool = False,
    link: bool = False,
    progress: ProgressFactory | None = None,
    backup: bool = True,
) -> Report:
    """Write the LM head as its own tensor equal to the input embedding, in the layout the loader expects
    (``layout``: AUTO), and set ``tie_word_embeddings`` false.

    Returns:
        the report. Raises as :func:`tie` (and ``RefusedError`` for a loader that always ties).
    """
    return _run_plan(
        path,
        out,
        lambda c: plan_untie(
            _detection(c, layout, loader, embedding, head),
            layout=_option(Layout, layout, "layout") or Layout.AUTO.value,
        ),
        dry_run,
        link,
        progress,
        backup=backup,
    )


def resize(
    path: PathArg,
    vocab_size: int | None = None,
    out: PathArg | None = None,
    *,
    pad_to_multiple_of: int | None = None,
    init: Init | str = Init.MEAN,
    seed: int | None = None,
    force: bool = False,
    keep_training_state: bool = False,
    layout: Layout | str | None = None,
    loader: Loader | str | None = None,
    embedding: str | None = None,
    head: str | None = None,
    dry_run: bool = False,
    link: bool = False,
    progress: ProgressFactory | None = None,
    backup: bool = True,
) -> Report:
    """Grow or trim the vocabulary rows of every vocabulary tensor together (embedding, head, head bias,
    copies) and every vocabulary-size config key, as PaddleFormers' ``resize_token_embeddings`` (plus the
    untied head it leaves alone).

    Args:
        vocab_size: the new number of rows (≥ 1), rounded up to ``pad_to_multiple_of``; None: the current
            rows, rounded up (as HF ``resize_token_embeddings(None, pad_to_multiple_of=64)``).
        init: values of new rows; ``seed`` makes ``NORMAL`` (and nothing else) reproducible.
        force: allow trimming rows.
        keep_training_state: copy optimizer / scheduler / trainer files too (stale after a resize).

    Returns:
        the report. Raises as :func:`tie`; ``RefusedError`` for a trim without ``force``.
    """
    vocab_size = _count(vocab_size, "vocab_size")
    pad_to_multiple_of = _count(pad_to_multiple_of, "pad_to_multiple_of")
    return _run_plan(
        path,
        out,
        lambda c: _plan_resize(
            _detection(c, layout, loader, embedding, head),
            vocab_size,
            pad_to_multiple_of,
            _option(Init, init, "init") or Init.MEAN.value,
            seed,
            force,
        ),
        dry_run,
        link,
        progress,
        keep_training_state,
        backup,
    )


def _plan_resize(det: Detection, vocab_size: int | None, pad_to_multiple_of: int | None, *args) -> Plan:
    """:func:`plan_resize`; with no ``vocab_size``, the current rows rounded up to ``pad_to_multiple_of``."""
    if vocab_size is None:
        if pad_to_multiple_of is None:
            raise UsageError(
                "resize needs the new number of rows",
                fix=f"give {Opt('vocab_size')}, or {Opt('pad_to_multiple_of')} alone to round the rows up",
            )
        vocab_size = det.vocab_rows
    return plan_resize(det, vocab_size, pad_to_multiple_of, *args)


def verify(before: PathArg, after: PathArg, *, logits: bool = False) -> VerifyResult:
    """Check that ``after`` differs from ``before`` exactly as tie / untie / resize explain (every other
    tensor bit-identical, every vocabulary tensor and size key moved together); ``logits`` also compares
    PaddleFormers logits. The verdict is ``result.exit_code``. Raises as :meth:`Checkpoint.open`."""
    return _verify(_path(before, "before"), _path(after, "after"), logits=logits)
