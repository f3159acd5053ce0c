"""The progress bar the writer advances: bytes, rate and time left, on stderr, only on a terminal."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console


def progress_bar(quiet: bool) -> Callable[..., Any] | None:
    """The progress-bar factory the operations take (``progress(total)``: :func:`progress`); None: no bar."""
    from functools import partial

    return None if quiet else partial(progress, False)


@contextlib.contextmanager
def progress(quiet: bool, total: int, threshold: int = 256 << 20):
    """A rich progress bar over the ``total`` bytes written (the output's tensor bytes), with the rate and
    the time left, on stderr. Shown only on a terminal, without ``quiet``, for an output of at least
    ``threshold`` bytes (a small one is written before a bar would mean anything); yields None otherwise.

    The bar is drawn as soon as it is made, at 0, and again on the first bytes, rather than at rich's next
    timed refresh: the writer reports bytes per tensor and per step as it writes them (copies and rewrites),
    so the bar moves from the first byte. Yields ``advance(file name, bytes)``, thread-safe.
    """
    if quiet or total < threshold or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    ) as p:
        task = p.add_task("writing", total=total)
        p.refresh()
        first = [True]

        def advance(name: str, nbytes: int) -> None:
            p.update(task, advance=nbytes, description=f"writing {name}")
            if first[0]:
                first[0] = False
                p.refresh()

        yield advance
