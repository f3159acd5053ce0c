"""The plan ``merge`` writes, chosen by what the folder holds: rank files (tensor-, pipeline- and
expert-parallel) merged in their own container (:mod:`.merge`, :mod:`.merge_experts`), or a PaddleFormers
Trainer flex checkpoint (:mod:`.merge_flex`) converted to the PaddleFormers layout when
:data:`surgery.arch.CONVERSIONS` knows its model type (:mod:`.convert`, in the same pass), else written in
the Paddle layout the run held when asked (``--keep-paddle-layout``), else refused.

Each planner returns the one :class:`~surgery.plan.plan.Plan` (layout :class:`~surgery.plan.plan.Reshard`)
with the merge's own plan as its ``section`` (a converted flex merge: ``(FlexPlan, ConvertPlan)``), from
which :mod:`surgery.report` words the report. The shard limit (``limit``) is checked before the folder is
read, as the option is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from ..inspect.convention import LEGACY_LOAD
from ..io import flex, mistaken, surface
from ..model.enums import Operation, Target
from ..model.errors import CheckpointError, Opt, UsageError
from . import convert, merge, merge_flex
from .merge_experts import plan_rank_merge
from .plan import Plan, Reshard


def merge_layout_fix() -> str:
    """merge's fix where a flex checkpoint's layout cannot be converted: write the layout as it is (the
    option that asks for it, with the load it then needs), or export the HF layout from the training run."""
    return (
        f"merge with {Opt('keep_paddle_layout', True)} (then load with {LEGACY_LOAD}), or export it "
        "from the training run (save_pretrained / save_hf_steps)"
    )


def rank_folder(src: Path) -> Path:
    """The folder ``merge`` reads, checked to be a folder.

    Raises:
        CheckpointError: ``src`` does not exist (a Hub id named as such: :func:`mistaken.no_such_folder`) or
            is not a folder.
    """
    if not src.exists():
        raise mistaken.no_such_folder(src)
    if not src.is_dir():
        raise CheckpointError(
            "not a folder", src, "give the folder that holds the rank files and config.json"
        )
    return src


def planner_for(local: Path, limit: Callable[[], int], keep: bool) -> Callable[[Path], Plan]:
    """The planner of ``merge`` for folder ``local``: a flex checkpoint's (converted, or as saved with
    ``keep``), else rank files'.

    Raises:
        UsageError: a Trainer output_dir (flex checkpoints only in its subfolders), or ``keep`` for rank
            files.
    """
    if flex.find(local) is not None:
        if keep or not merge_flex.convertible(local):
            return partial(plan_flex_as_saved, limit=limit, keep=keep)
        return partial(plan_flex_converted, limit=limit)
    _check_rank_input(local, keep)
    return partial(plan_ranks, limit=limit)


def _check_rank_input(local: Path, keep: bool) -> None:
    """Refuse a folder of flex checkpoints (a Trainer's output_dir) without rank files of its own, and
    ``--keep-paddle-layout`` for rank files."""
    held = flex.inside(local)
    if held and not surface.rank_files({p.name for p in local.iterdir()}):
        raise UsageError(
            "the folder holds no rank files and no flex checkpoint of its own, but flex checkpoints in "
            f"{', '.join(p.name + '/' for p in held[:4])} (a Trainer's output_dir): merge one of them",
            local,
            f"merge {held[-1]} instead (one checkpoint-N/ folder)",
        )
    if keep:
        raise UsageError(
            f"{Opt('keep_paddle_layout', True)} applies to a flex checkpoint (a Trainer checkpoint-N/ with "
            "model_state/*.distcp); rank files are merged in their own container and layout",
            fix=f"merge without {Opt('keep_paddle_layout', True)}",
        )


def plan_ranks(src: Path, limit: Callable[[], int]) -> Plan:
    """The merge of the rank files in ``src`` (:func:`~surgery.plan.merge_experts.plan_rank_merge`) in
    shards of at most ``limit()`` bytes."""
    size = limit()
    return merge.output_plan(plan_rank_merge(src), size)


def plan_flex_as_saved(src: Path, limit: Callable[[], int], keep: bool) -> Plan:
    """The merge of the flex checkpoint ``src`` written as saved (Paddle layout): with ``keep`` (asked
    for), else refused (a model type tietool cannot convert:
    :func:`~surgery.plan.merge_flex.refuse_unconverted`)."""
    size = limit()
    fp = merge_flex.tie_checked(merge_flex.plan_flex(src))
    if not keep:
        merge_flex.refuse_unconverted(fp, merge_layout_fix())
    return merge_flex.output_plan(merge_flex.keep_layout(fp), size)


def plan_flex_converted(src: Path, limit: Callable[[], int]) -> Plan:
    """The merge of the flex checkpoint ``src`` converted to the PaddleFormers layout as ``convert``
    converts (its merged view, never written, planned by :func:`~surgery.plan.convert.plan_convert`), with
    the flex checkpoint's carried files; ``section`` is ``(FlexPlan, ConvertPlan)``."""
    size = limit()
    fp = merge_flex.as_exported(merge_flex.tie_checked(merge_flex.plan_flex(src)))
    cp = convert.check_dtypes(
        convert.plan_convert(merge_flex.flex_view(fp), Target.PADDLEFORMERS, merge_layout_fix())
    )
    new = convert.output_plan(cp, size)
    assert isinstance(new.layout, Reshard), "internal: a conversion writes a new checkpoint"
    return replace(new, op=Operation.MERGE, layout=replace(new.layout, carry=fp.carry), section=(fp, cp))
