"""The run of a writing operation: open → plan → write (or not, for a dry run) → report, and its output
policies.

Every writing operation of :mod:`surgery.ops` is one :func:`run` of its :class:`Planner` (how to open the
input and plan): the paths are coerced once, the options stay enums, the output is checked once, and in
place is an output policy of the run (:class:`_InPlace`, beside :class:`_NewFolder`). Every write is one
:class:`~surgery.plan.plan.Plan` through :func:`surgery.write.writer.execute`, handed its report
(:class:`surgery.report.Draft`), which the writer stores in the output as ``tietool-report.json`` before the
output is renamed (or swapped) into place.
"""

from __future__ import annotations

import numbers
import shutil
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields, replace
from enum import Enum
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from .io import store, stores
from .io.checkpoint import Checkpoint
from .io.regular import parsed_once
from .model.enums import Layout, Loader, Target
from .model.errors import Interrupted, Opt, UsageError
from .results import Report
from .write import inplace, inplace_checks
from .write.publish import check_output_path, fsync_dir

if TYPE_CHECKING:  # annotations only: the run imports the writer and report when it writes
    from .plan.plan import Plan

PathArg = str | PathLike[str]

Advance = Callable[[str, int], None]
"""Called with (file name, bytes) as bytes are written; must be thread-safe."""

ProgressFactory = Callable[[int], AbstractContextManager[Advance | None]]
"""Given the bytes the output will hold, a context manager that yields an :data:`Advance` (or None)."""


def path_arg(p: object, name: str) -> Any:
    """A folder argument as a Path, or a URL (``s3://``, ``hf://``) as a remote path
    (:func:`store.as_path`). Raises UsageError for anything but ``str`` / ``os.PathLike``."""
    if isinstance(p, bytes) or not isinstance(p, str | PathLike):
        raise UsageError(
            f"{name} must be a folder path (str or os.PathLike), got {type(p).__name__}", fix='e.g. "ckpt/"'
        )
    return store.as_path(p) if isinstance(p, str) else Path(p)


def _open(path: Any) -> Checkpoint:
    """:meth:`Checkpoint.open`, looked up at each call (so a patched ``Checkpoint.open`` is the one used)."""
    return Checkpoint.open(path)


@dataclass(frozen=True)
class Planner:
    """One writing operation as :func:`run` drives it: how to open its input and plan; its report is
    worded from the plan (:func:`surgery.report.report_of`).

    Attributes:
        plan: the opened input → the plan (refusals raised here, before anything is written).
        open: the input path → what ``plan`` takes (default :meth:`Checkpoint.open`).
        write: the plan → the :class:`~surgery.plan.plan.Plan` :func:`surgery.write.writer.execute` takes
            (default: the plan itself; ``convert``'s own plan becomes a new checkpoint's).
        to: ``convert``'s target (its report names it).
    """

    plan: Callable[[Any], Any]
    open: Callable[[Any], Any] = _open
    write: Callable[[Any], Plan] = lambda p: p
    to: Target | None = None


@dataclass(frozen=True)
class WriteOptions:
    """The options the writing operations share: how the vocabulary tensors are found, and how the output is
    written. The CLI builds one from its common flags; the Python API builds one from the keyword arguments
    of the same names (:func:`write_options`).

    Attributes:
        layout: the head's layout when ``vocab_size == hidden_size`` (:class:`Layout`, or its value;
            ``AUTO`` and None: detection decides); ``untie``: the new head's layout (None: ``AUTO``).
        loader: the library that will load the output (:class:`Loader`, or its value; None: told from the
            checkpoint).
        embedding, head: the input embedding's and the LM head's tensor names, for architectures the
            table does not know (None: found by detection).
        dry_run: open, check and plan, write nothing; the report names what a run would write.
        link: hard-link untouched weight files instead of copying them (always, in place).
        progress: given the bytes the output will hold, a context manager yielding ``advance(file, bytes)``
            or None (:data:`ProgressFactory`).
        keep_training_state: keep the optimizer, scheduler and trainer files in the output, the optimizer
            state resized with the vocabulary (``resize``, ``add_tokens``); False leaves them out.
        backup: in place (no ``out``): keep the old version as ``NAME.tietool-backup-<time>``.
    """

    layout: Layout | str | None = None
    loader: Loader | str | None = None
    embedding: str | None = None
    head: str | None = None
    dry_run: bool = False
    link: bool = False
    progress: ProgressFactory | None = None
    keep_training_state: bool = False
    backup: bool = True


class WriteArgs(TypedDict, total=False):
    """:class:`WriteOptions` as keyword arguments of an operation (``tietool.tie(..., dry_run=True)``)."""

    layout: Layout | str | None
    loader: Loader | str | None
    embedding: str | None
    head: str | None
    dry_run: bool
    link: bool
    progress: ProgressFactory | None
    keep_training_state: bool
    backup: bool


EDIT = frozenset({"layout", "loader", "embedding", "head", "dry_run", "link", "progress", "backup"})
"""The options of an edit of the vocabulary tensors (``tie``, ``untie``, ``fix_untrained``,
``rename_tokens``, ``prune``, ``transplant``)."""
EDIT_WITH_STATE = EDIT | {"keep_training_state"}
"""The options of an edit that can keep the training state (``resize``, ``add_tokens``)."""
NEW_CHECKPOINT = frozenset({"dry_run", "progress"})
"""The options of an operation that writes a new checkpoint to a new folder (``convert``, ``merge``)."""


def write_options(
    options: WriteOptions | None, given: Mapping[str, Any], operation: str, takes: Collection[str]
) -> WriteOptions:
    """``options`` (default: every option at its default) with the keyword arguments ``given`` set, for
    ``operation``, which takes the options named in ``takes``.

    Raises:
        TypeError: a keyword that is no option (as Python refuses an unknown keyword argument).
        UsageError: an option ``operation`` does not take, set to other than its default.
    """
    opts = replace(options or WriteOptions(), **given)
    for f in fields(opts):
        if f.name not in takes and getattr(opts, f.name) != f.default:
            raise UsageError(f"{operation} does not take {Opt(f.name)}", fix=f"leave {Opt(f.name)} out")
    return opts


def run(planner: Planner, path: PathArg, out: PathArg | None, options: WriteOptions | None = None) -> Report:
    """The one run of a writing operation: coerce the paths, open the input and plan; on a dry run (or an
    in-place plan that changes nothing) return the report of the plan; else check the output once, execute
    the plan (the writer stores the report in the staging folder before it is published or swapped in) and
    return the report. ``out`` None rewrites ``path`` in place, a local folder only (the policy
    :class:`_InPlace`; ``options.backup`` applies to it alone). ``options``: its ``dry_run``, ``link``,
    ``progress``, ``keep_training_state`` and ``backup`` (default: :class:`WriteOptions`' defaults).

    Raises:
        UsageError: a bad path, an output that cannot be used, in place on object storage.
        and what ``planner``, :func:`surgery.write.writer.execute` and :class:`_InPlace` raise; the input is
        then unchanged.
    """
    from . import report as report_mod
    from .write.writer import execute

    src = path_arg(path, "path")
    before = store.TRANSFER.snapshot()  # bytes moved from here on: headers, values, copies
    opts = options or WriteOptions()
    dest = _destination(src, out, opts)
    with parsed_once():  # a JSON file the planners read several times is parsed once
        opened = planner.open(dest.source)
        if not opts.dry_run:
            dest.check(opened.path if isinstance(opened, Checkpoint) else dest.source)
        plan = planner.write(planner.plan(opened))
    draft = report_mod.Draft(plan, str(dest.path), planner.to, opts.keep_training_state, dest.source)
    if not dest.writes(plan, opts.dry_run):
        rep = dest.unwritten(draft.unwritten(opts.dry_run))
    else:

        def write(where: Path, extra: dict[str, Any], own: bool) -> dict:
            with _progress(opts.progress, plan.output_bytes) as advance:
                return execute(
                    plan,
                    where,
                    link=opts.link or own,
                    progress=advance,
                    report=draft.adding(extra),
                    keep_training_state=opts.keep_training_state,
                    keep_folder_links=own,
                )

        rep = _finished(dest, lambda: dest.write(plan, write))
    return _finished(dest, lambda: _result(rep, src, dest, before, report_mod.totals_of(plan)))


def _result(rep: dict, src: Any, dest: Any, before: Any, totals: dict) -> Report:
    if not stores.is_local(src) or not stores.is_local(dest.path):
        rep["transferred"] = store.TRANSFER.since(before).as_dict()
    return Report(rep, **totals)


def _finished(dest: _NewFolder | _InPlace, step: Callable[[], Any]) -> Any:
    """``step()``, with a Ctrl-C or SIGTERM that lands once the write is complete (the output published,
    the new version swapped in: the lock's release, the report's assembly) raised as :class:`Interrupted`
    saying so, not as a plain KeyboardInterrupt ("nothing was written"). Without it, an in-place
    ``add-tokens`` interrupted 1.2 s in said "interrupted; nothing was written" beside its backup."""
    try:
        return step()
    except KeyboardInterrupt as e:
        state = None if isinstance(e, Interrupted) else dest.done_state()
        if state is None:
            raise
        raise Interrupted(state) from None


def _destination(src: Any, out: PathArg | None, opts: WriteOptions) -> _NewFolder | _InPlace:
    """The output policy of :func:`run`: in place for no ``out`` on a local folder, else a new folder
    (``out`` None there: a dry run on a URL, which writes nothing).

    Raises:
        UsageError: in place on object storage (no atomic swap), or a bad ``out``.
    """
    on_disk = stores.is_local(src)
    if out is None and not on_disk and not opts.dry_run:
        raise UsageError(
            "cannot rewrite a checkpoint in object storage in place: the store has no atomic swap "
            "(a reader could see a half-written checkpoint)",
            str(src),
            f"write to another prefix with {Opt('out')} (a URL or a local folder)",
        )
    if out is None and on_disk:
        return _InPlace(src, opts)
    return _NewFolder(src, src if out is None else path_arg(out, "out"))


Write = Callable[[Path, dict[str, Any], bool], dict]
"""The write of :func:`run`, handed to its output policy: ``(folder, extra, own)`` executes the plan into
``folder`` with the report's ``extra`` keys (what the policy adds to it); ``own``: the folder is the
in-place new version (untouched files hard-linked, links to folders kept as links)."""


class _NewFolder:
    """The output policy of :func:`run` for ``out``: a new folder, checked once (it must be new or empty,
    outside the input) and published by the writer (:func:`surgery.write.publish.publish`, or in order to
    object storage)."""

    def __init__(self, source: Any, out: Any) -> None:
        self.source, self.path = source, out
        self.done = False

    def check(self, inp: Any) -> None:
        """Refuse an output that cannot be used (:func:`check_output_path`); not for a dry run."""
        check_output_path(inp, self.path)

    def writes(self, plan: Any, dry_run: bool) -> bool:
        return not dry_run

    def unwritten(self, rep: dict) -> dict:
        return rep

    def write(self, plan: Any, write: Write) -> dict:
        rep = write(self.path, {}, False)
        self.done = True
        return rep

    def done_state(self) -> str | None:
        """What an interruption after the write says (None before it is complete)."""
        return f"the output {self.path} was written completely just before" if self.done else None


class _InPlace:
    """The output policy of :func:`run` for no ``out``: rewrite checkpoint ``path`` in place
    (:mod:`surgery.write.inplace`). What killed runs left is put right first (here, before the input is
    read); the new version is built beside it with untouched files hard-linked, read back, and swapped in;
    the old one is kept as a backup unless ``opts.backup`` is False. A plan that changes nothing writes
    nothing.
    """

    def __init__(self, path: Path, opts: WriteOptions) -> None:
        self.path = self.source = inplace.target(path)
        self.rec = inplace.recover(self.path)
        self.read = inplace_checks.folder_id(self.path)
        self.files = inplace_checks.input_files(self.path)  # before any read; checked before the swap
        self.backup, self.keep_training_state = opts.backup, opts.keep_training_state
        self.swapped: tuple[Path, str, Path, Path | None] | None = None  # interrupted_state's arguments

    def done_state(self) -> str | None:
        """What the name holds, by looking (:func:`inplace.interrupted_state`), once the new version was
        swapped in; None before."""
        return inplace.interrupted_state(*self.swapped) if self.swapped else None

    def check(self, inp: Any) -> None:
        """Nothing before planning: the checks of an in-place write are made by :meth:`write`."""

    def writes(self, plan: Plan, dry_run: bool) -> bool:
        return not dry_run and plan.changed

    def unwritten(self, rep: dict) -> dict:
        rep["in_place"] = {"written": False, "backup": None, "recovered": self.rec.as_dict()}
        return rep

    def write(self, plan: Plan, write: Write) -> dict:
        """Write ``plan`` and swap it in, under the checkpoint's lock (one writing run at a time), once the
        folder is checked to be the one read.

        Raises:
            RefusedError: no backup asked for while the write would leave files out (they would be
                deleted), or the folder was replaced since it was read.
            OutputError: a mount point (it cannot be swapped), or what :meth:`_swap_in` raises.
        """
        if not self.backup:
            inplace.refuse_deleting_left_out(plan, self.keep_training_state)
        inplace.check_swappable(self.path)
        with inplace.locked(self.path):
            inplace_checks.check_same_folder(self.path, self.read, None)  # not swapped since it was read
            return self._swap_in(plan, write)

    def _swap_in(self, plan: Plan, write: Write) -> dict:
        """Build the new version at a staging name, check that the folder under the name and every file in
        it are still the ones read (:func:`~surgery.write.inplace_checks.folder_id` and
        :func:`~surgery.write.inplace_checks.input_files` at the start), swap it in.

        Raises:
            RefusedError: the folder was replaced meanwhile; CheckpointError: a file in it changed (the new
                version is removed in both cases).
            OutputError: the write or the swap failed; the checkpoint is then unchanged.
            Interrupted: a Ctrl-C or SIGTERM; its ``state`` says what the name holds.
        """
        ckpt_path, recovered = self.path, self.rec.as_dict()
        token, bak = inplace.new_token(), (inplace.backup_name(ckpt_path) if self.backup else None)
        staging = inplace.staging_path(ckpt_path, token)
        info = {"written": True, "token": token, "backup": str(bak) if bak else None, "recovered": recovered}
        try:
            rep = write(staging, {"in_place": info}, True)
            inplace_checks.keep_modes(ckpt_path, staging, plan.ckpt.weight_files)
            inplace.synced(staging, ckpt_path)
            inplace.pause("check")
            inplace_checks.check_same_folder(ckpt_path, self.read, staging)
            inplace_checks.check_inputs(ckpt_path, self.files, staging)
            swapped = inplace.swap(ckpt_path, staging, bak, token, lambda p: fsync_dir(p))
            self.swapped = (ckpt_path, token, staging, bak)
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


def _progress(progress: ProgressFactory | None, total: int) -> AbstractContextManager[Advance | None]:
    """``progress(total)``, or a context that yields None without one."""
    return (progress or (lambda _total: nullcontext(None)))(total)


# ------------------------------------------------------------------ the options of the operations

E = TypeVar("E", bound=Enum)


def enum_option(kind: type[E], x: Enum | str | None, name: str) -> E | None:
    """Option ``name`` as a member of the enum ``kind`` (None stays None).

    Raises:
        UsageError: ``x`` is not one of ``kind``'s values (as the CLI's choices refuse it).
    """
    if x is None:
        return None
    try:
        return kind(x.value if isinstance(x, Enum) else x)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise UsageError(
            f"{Opt(name)} must be one of {allowed}, got {x!r}",
            fix=f"e.g. {Opt(name, next(iter(kind)).value)}",
        ) from None


def layout_option(layout: Layout | str | None) -> Layout | None:
    """Option ``layout`` as a :class:`Layout`; ``AUTO`` (and None) as None: detection decides."""
    v = enum_option(Layout, layout, "layout")
    return None if v in (None, Layout.AUTO) else v


def count_option(x: object, name: str) -> int | None:
    """A count option (``vocab_size``, ``pad_to_multiple_of``) as an int; numpy integers are ints, a bool
    is not. Raises UsageError otherwise (the range is checked by the planner)."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise UsageError(f"{Opt(name)} must be an integer, got {x!r}", fix=f"e.g. {Opt(name, 32000)}")
    return int(x)
