"""The vocabulary of a Trainer flex checkpoint as ``tietool inspect`` shows it: the input embedding, LM head,
tie state and vocabulary sizes detected on its merged view (:func:`surgery.plan.merge_flex.flex_view`), the
view ``resize --keep-training-state`` plans on, so that they agree with the inspection of the folder
``tietool merge`` writes (``tests/cli/test_inspect_flex_vocabulary.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..inspect.detect import detect
from ..inspect.summary import check_found, check_names, summarize
from ..model.enums import Layout, Loader
from ..model.errors import TietoolError
from .merge_flex import flex_view, plan_flex

# the keys of a checkpoint's inspection that describe its vocabulary (docs/reference/commands.md)
VOCABULARY_KEYS = ("architecture", "embedding", "head", "head_bias", "vocabulary_tensors", "tie", "vocab")


def add_vocabulary(
    info: dict[str, Any],
    where: Path,
    layout: Layout | None,
    loader: Loader | None,
    embedding: str | None,
    head: str | None,
    compare_values: bool,
) -> None:
    """Add to the inspection ``info`` of flex checkpoint ``where`` the vocabulary keys of every inspection
    (:data:`VOCABULARY_KEYS`), its problems and warnings: detected on its merged view, the view ``resize
    --keep-training-state`` plans on (the Trainer's in-memory layout and names), values compared from the
    slices of the embedding and head only. When the view cannot be made: ``vocabulary_error`` (the message,
    fix and exit code ``resize`` would give: no config.json, a checkpoint merge refuses); with a config.json,
    a damaged or unsafe ``.distcp`` is a problem and the inspection's exit code (3 or 4, as ``merge``'s).

    Raises:
        TietoolError: the detection's error when ``embedding`` / ``head`` were given (a name the
            checkpoint does not hold is exit 3, as for any checkpoint).
    """
    try:
        view = flex_view(plan_flex(where))
    except TietoolError as e:
        _not_inspected(info, e)
        if info.get("config") is not None and int(e.exit_code) in (3, 4):  # damaged or unsafe, as merge says
            info["problems"].append(e.message)
            info.update(exit_code=int(e.exit_code), fix=e.fix, failed_path=e.path)
        return
    check_names(view, embedding, head)
    try:
        det = detect(
            view,
            layout=layout,
            loader=loader,
            embedding_name=embedding,
            head_name=head,
            compare_values=compare_values,
        )
        check_found(det)
    except TietoolError as e:  # no embedding found, an ambiguous layout: the structure is still shown
        if embedding or head:  # unless the names were the user's: their error, as for any checkpoint
            raise
        _not_inspected(info, e)
        return
    found = summarize(det)
    info.update({k: found[k] for k in VOCABULARY_KEYS})
    info["problems"] += found["problems"]
    info["warnings"] += found["warnings"]


def _not_inspected(info: dict[str, Any], e: TietoolError) -> None:
    info["vocabulary_error"] = {"message": str(e), "fix": e.fix, "exit_code": int(e.exit_code)}
