"""The operations, end to end: open → detect → plan → write (or not, for a dry run) → report; and verify.

Each function is what one ``tietool`` command does; the CLI parses options, calls one of these and renders
the result. They are also the Python API (``tietool.tie(...)``). Paths are ``str`` or ``os.PathLike``.
Errors are the classes of :mod:`surgery.errors` (each with its :class:`~surgery.errors.ExitCode`); nothing
is written when one is raised, and the input is never modified.

The report (a dict, :func:`surgery.report.build`) is returned and, for a real run, also stored in the output
as ``tietool-report.json`` before the output is renamed into place.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from enum import Enum
from os import PathLike
from pathlib import Path

from . import report as report_mod
from .checkpoint import Checkpoint
from .detect import Detection, detect
from .errors import UsageError
from .options import Init, Keep, Layout, Loader
from .plan import Plan, plan_resize, plan_tie, plan_untie
from .summary import check_found, check_names, inspect_path
from .verify import VerifyResult
from .verify import verify as _verify
from .write import check_output_path, execute

PathArg = str | PathLike[str]

Advance = Callable[[str, int], None]
"""Called with (file name, bytes) as bytes are written; must be thread-safe."""

ProgressFactory = Callable[[int], AbstractContextManager[Advance | None]]
"""Given the bytes the output will hold, a context manager that yields an :data:`Advance` (or None)."""


def _value(x: Enum | str | None) -> str | None:
    return x.value if isinstance(x, Enum) else x


def _layout(layout: Layout | str | None) -> str | None:
    v = _value(layout)
    return None if v in (None, Layout.AUTO.value) else v


def inspect(
    path: PathArg,
    *,
    layout: Layout | str | None = None,
    loader: Loader | str | None = None,
    embedding: str | None = None,
    head: str | None = None,
    compare_values: bool = True,
) -> dict:
    """What ``tietool inspect`` shows, as a dict (``--json`` prints it): the vocabulary surface with roles,
    shapes, dtypes and layouts, the tie state three ways, parameter counts and bytes, what tying saves.

    Args:
        embedding, head: tensor names, for architectures the table does not know.
        compare_values: read the embedding and head to tell "tied by value" (False: headers only).

    Raises:
        CheckpointError, UnsafePickleError, UsageError: as :meth:`Checkpoint.open` and :func:`detect`.
    """
    return inspect_path(
        Path(path),
        layout=_layout(layout),
        loader=_value(loader),
        embedding_name=embedding,
        head_name=head,
        compare_values=compare_values,
    )


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
        loader=_value(loader),
        embedding_name=embedding,
        head_name=head,
        compare_values=True,
    )
    check_found(det)
    return det


def _run_plan(
    path: PathArg,
    out: PathArg,
    make_plan: Callable[[Checkpoint], Plan],
    dry_run: bool,
    link: bool,
    progress: ProgressFactory | None,
    keep_training_state: bool = False,
) -> dict:
    """Open ``path``, plan, and either report the plan (``dry_run``) or write it to ``out`` atomically
    with the report inside; returns the report."""
    ckpt = Checkpoint.open(Path(path))
    if not dry_run:
        check_output_path(ckpt.path, Path(out))
    plan = make_plan(ckpt)
    if dry_run:
        return report_mod.build(plan, None, str(out), dry_run=True, keep_training_state=keep_training_state)
    with (progress or (lambda _total: nullcontext(None)))(plan.output_bytes) as advance:
        return execute(
            plan,
            Path(out),
            link=link,
            progress=advance,
            report=lambda facts: report_mod.build(plan, facts, str(out)),
            keep_training_state=keep_training_state,
        )


def tie(
    path: PathArg,
    out: PathArg,
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
) -> dict:
    """Drop the LM head where the loader re-ties it, after checking that its values equal the input
    embedding's; set ``tie_word_embeddings`` true (as PaddleFormers' ``tie_weights`` expects).

    Args:
        keep: when head and embedding differ, whose values to keep (None refuses).
        drop_aliases: also drop copies of the embedding under alias names (T5/BART encoder/decoder).
        link: hard-link untouched weight files instead of copying them.

    Returns:
        the parameter-savings report (:func:`surgery.report.build`).

    Raises:
        ValuesDifferError, AmbiguousLayoutError, RefusedError: see :func:`surgery.plan.plan_tie`.
        CheckpointError, UsageError, OutputError: bad input or an output that cannot be written.
    """
    return _run_plan(
        path,
        out,
        lambda c: plan_tie(
            _detection(c, layout, loader, embedding, head), keep=_value(keep), drop_aliases=drop_aliases
        ),
        dry_run,
        link,
        progress,
    )


def untie(
    path: PathArg,
    out: PathArg,
    *,
    layout: Layout | str = Layout.AUTO,
    loader: Loader | str | None = None,
    embedding: str | None = None,
    head: str | None = None,
    dry_run: bool = False,
    link: bool = False,
    progress: ProgressFactory | None = None,
) -> dict:
    """Write the LM head as its own tensor equal to the input embedding, in the layout the loader expects
    (``layout``: AUTO), and set ``tie_word_embeddings`` false.

    Returns:
        the report. Raises as :func:`tie` (and ``RefusedError`` for a loader that always ties).
    """
    return _run_plan(
        path,
        out,
        lambda c: plan_untie(
            _detection(c, layout, loader, embedding, head), layout=_value(layout) or Layout.AUTO.value
        ),
        dry_run,
        link,
        progress,
    )


def resize(
    path: PathArg,
    out: PathArg,
    vocab_size: int | None,
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
) -> dict:
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
    return _run_plan(
        path,
        out,
        lambda c: _plan_resize(
            _detection(c, layout, loader, embedding, head),
            vocab_size,
            pad_to_multiple_of,
            _value(init) or Init.MEAN.value,
            seed,
            force,
        ),
        dry_run,
        link,
        progress,
        keep_training_state,
    )


def _plan_resize(det: Detection, vocab_size: int | None, pad_to_multiple_of: int | None, *args) -> Plan:
    """:func:`plan_resize`; with no ``vocab_size``, the current rows rounded up to ``pad_to_multiple_of``."""
    if vocab_size is None:
        if pad_to_multiple_of is None:
            raise UsageError(
                "resize needs the new number of rows", fix="give vocab_size, or pad_to_multiple_of alone"
            )
        vocab_size = det.vocab_rows
    return plan_resize(det, vocab_size, pad_to_multiple_of, *args)


def verify(before: PathArg, after: PathArg, *, logits: bool = False) -> VerifyResult:
    """Check that ``after`` differs from ``before`` exactly as tie / untie / resize explain (every other
    tensor bit-identical, every vocabulary tensor and size key moved together); ``logits`` also compares
    PaddleFormers logits. The verdict is ``result.exit_code``. Raises as :meth:`Checkpoint.open`."""
    return _verify(Path(before), Path(after), logits=logits)
