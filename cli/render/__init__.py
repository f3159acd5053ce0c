"""All terminal output: rich tables for people, JSON for scripts. Nothing else in tietool prints, except the
one line of an error or an interruption (:mod:`cli.errors`).

One function per command's result: :func:`inspect` (and :func:`inspect_many`, a row per checkpoint;
``inspection.py``), :func:`written` (tie, untie, resize, add-tokens: the report, then what an in-place run
did), :func:`convert`, :func:`merge` (``reports.py``), :func:`verify` (``verification.py``);
:func:`progress` is the progress bar the writer advances (``bars.py``); ``common.py`` holds what they share.
With ``as_json`` each prints the result as one JSON document, its non-finite floats as strings
(:func:`cli.errors.finite`).
"""

from __future__ import annotations

from .bars import progress, progress_bar
from .common import done_state, left_out, recovered, size, version
from .inspection import FLEX_COMMANDS, flex_inspect, inspect, inspect_failed, inspect_many
from .reports import convert, merge, report, written
from .verification import verify

__all__ = [
    "FLEX_COMMANDS",
    "convert",
    "done_state",
    "flex_inspect",
    "inspect",
    "inspect_failed",
    "inspect_many",
    "left_out",
    "merge",
    "progress",
    "progress_bar",
    "recovered",
    "report",
    "size",
    "verify",
    "version",
    "written",
]
