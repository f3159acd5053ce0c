"""What every printer of :mod:`cli.render` shares: the console, byte sizes and shapes in words, the notes and
warnings, the files a checkpoint or a write leaves out, what a killed run left, and the guard that makes a
Ctrl-C while a finished write's report prints say what was written."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from ...surgery.model.errors import Interrupted


class RichConsole(Console):
    """rich's Console, except that a closed pipe (``| head``) is left to ``cli.app.main``, which ends
    quietly with exit 0 (rich's own handler exits 1, the code of a tietool error)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr) that prints names and paths as they are (no markup), never wrapping
    them mid-word when the output is not a terminal."""
    f = sys.stderr if stderr else sys.stdout
    # not a terminal (pipes, CI): wide lines so names are never wrapped mid-word
    # markup off: names, paths and messages are printed as they are, "[...]" included
    return RichConsole(
        file=f, width=None if f.isatty() else 200, soft_wrap=not f.isatty(), highlight=False, markup=False
    )


def size(n: int | None) -> str:
    """``1056`` → ``"1056 bytes (1.0 KiB)"``; the plain byte count always comes first."""
    if n is None:
        return "—"
    units = ["KiB", "MiB", "GiB", "TiB"]
    v, u = float(n), None
    for unit in units:
        if abs(v) < 1024:
            break
        v /= 1024
        u = unit
    return f"{n} bytes" + (f" ({v:.1f} {u})" if u else "")


def shape_text(s) -> str:
    """``[48, 16]``; ``—`` for no shape."""
    return "—" if s is None else "[" + ", ".join(str(d) for d in s) + "]"


def messages(con: Console, notes, warnings, problems=()) -> None:
    """``problem:``, ``note:`` and ``warning:`` lines, in that order."""
    for p in problems:
        con.print(f"problem: {p}", style="yellow")
    for n in notes:
        con.print(f"note: {n}")
    for w in warnings:
        con.print(f"warning: {w}", style="yellow")


LEFT_OUT_WHY = {  # LeftOutReason values (surgery/io/surface.py) in words
    "not-in-index": "not listed in {index}, so not part of the checkpoint; a loader that prefers a lone "
    "weight file over an index would read its weights instead",
    "other-format": "weights in another format than the checkpoint's ({format}); which one a loader reads "
    "depends on the loader",
    "rank-file": "a tensor/pipeline-parallel rank file (a slice of the weights), not part of the whole "
    "checkpoint",
    "training-state": "training state (optimizer moments, master weights, scheduler, trainer or rng state), "
    "stored per parameter",
    "loader-cache": "paddle's flex-checkpoint loader's index of the weights (written at a load, reused if "
    "present): it describes these tensors, and the loader writes it anew for an output",
}


def left_out(con: Console, items: list[dict], index: str | None, fmt: str, writing: bool) -> None:
    """Files of the input that are not part of the checkpoint, or that the output leaves out, with why."""
    for x in items:
        why = LEFT_OUT_WHY.get(x["reason"], x["reason"]).format(index=index or "the index", format=fmt)
        name = f"{x['file']} ({size(x['bytes'])})"
        if x["reason"] != "training-state":
            con.print(
                f"left out{' of the output (not copied)' if writing else ''}: {name}: {why}", style="yellow"
            )
        elif not writing:
            con.print(
                f"training state: {name}: {why}; tie/untie/resize leave it out of their output "
                "(resize / add-tokens --keep-training-state keep it, resized with the vocabulary)"
            )
        elif x["kept"]:
            con.print(
                f"training state copied: {name}: {why}; it matches the input's parameters", style="yellow"
            )
        else:
            con.print(
                f"training state left out of the output (not copied): {name}: {why}, and the parameters "
                "changed, so it no longer matches them (resize / add-tokens --keep-training-state keep it, "
                "resized)",
                style="yellow",
            )


def recovered(rec: dict) -> None:
    """Notes on what the library put right before reading (``inspect``'s ``recovered``: what killed in-place
    runs left), in the words the write commands use."""
    for what, paths in (
        ("removed", rec.get("removed_temps")),
        ("kept as a backup", rec.get("kept_backups")),
        ("the previous version it was deleting; now deleted", rec.get("finished_deletions")),
        ("a stale lock file; removed", rec.get("removed_locks")),
    ):
        for p in paths or ():
            print(f"note: left by an interrupted run: {p} ({what})")
    for p in rec.get("left_to_delete") or ():
        print(
            f"warning: left by an interrupted run: {p}, the previous version it was deleting, still cannot "
            "be deleted: remove it by hand (chmod -R u+w, then rm -rf)"
        )
    if rec.get("restored"):
        print(
            f"note: an interrupted in-place run had left no folder at {rec['restored']}; "
            "its complete new version was put there"
        )


def transfer_line(con, info: dict) -> None:
    """For a checkpoint in object storage: the bytes this run moved over the network."""
    t = info.get("transferred")
    if t:
        con.print(
            f"network: {size(t['received'])} received, {size(t['sent'])} sent, "
            f"{size(t['copied_server_side'])} copied by the server, in {t['requests']} data requests"
        )


def done_state(rep: dict) -> str:
    """What a Ctrl-C while the report of a finished write is printed leaves: the write is complete (an
    in-place run's name holds the new version, the output folder is in place), so the "interrupted" line
    must not say "nothing was written"."""
    ip = rep.get("in_place")
    if rep.get("dry_run") or (ip is not None and not ip.get("written")):
        return "nothing was written" + (" (dry run)" if rep.get("dry_run") else "")
    if ip is not None:
        where = f"the previous version is {ip['backup']}" if ip.get("backup") else "no backup kept"
        return f"{rep['input']} holds the new version (complete); {where}; stopped while printing the report"
    return f"the output {rep.get('output')} is complete; stopped while printing the report"


def result(line: str, notes=(), warnings=(), problems=()) -> None:
    """What ``--quiet`` prints: the one result line on stdout; the problems, notes and warnings (a warning
    that matters is never silenced) on stderr, so that stdout holds the result alone."""
    print(line)
    messages(console(stderr=True), notes, warnings, problems)


def after_write(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` (a finished write's report printer) with a Ctrl-C while it prints raised as
    :class:`Interrupted` whose state is :func:`done_state` (without it, an in-place ``add-tokens``
    interrupted after the swap said "interrupted; nothing was written", exit 130)."""

    @functools.wraps(fn)
    def wrapped(rep: dict, *args: Any, **kwargs: Any) -> None:
        try:
            fn(rep, *args, **kwargs)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            raise Interrupted(done_state(rep)) from None

    return wrapped


def stale_notes(rep: dict) -> None:
    """A note for each temporary folder of a killed run that the write removed (``removed_stale_temps``)."""
    for p in rep.get("removed_stale_temps", ()):
        print(f"note: removed {p}, the temporary folder of an interrupted run (its process is gone)")


def version(v: str) -> None:
    """``tietool --version``."""
    print(f"tietool {v}")
