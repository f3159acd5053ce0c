"""One error hierarchy. Every error carries the file it concerns and says how to fix the problem.

The CLI maps each class to a one-line message and an exit code (see ``EXIT_CODES``).
"""

from __future__ import annotations

from pathlib import Path


class TietoolError(Exception):
    """Base class: a problem with the user's input that tietool explains in one line.

    Args:
        message: what is wrong.
        path: the file or folder concerned (shown first in the message).
        fix: what the user can do about it.
    """

    exit_code = 1

    def __init__(self, message: str, path: str | Path | None = None, fix: str | None = None):
        self.message = message
        self.path = str(path) if path is not None else None
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts = []
        if self.path:
            parts.append(f"{self.path}: ")
        parts.append(self.message)
        if self.fix:
            parts.append(f" — {self.fix}")
        return "".join(parts).replace("\n", " ")


class UsageError(TietoolError):
    """An option value that makes no sense (``--vocab 0``, ``--out`` inside the input, ...)."""

    exit_code = 2


class CheckpointError(TietoolError):
    """The checkpoint folder is missing files, is corrupt or inconsistent."""

    exit_code = 3


class UnsafePickleError(CheckpointError):
    """A ``.pdparams`` pickle names a global outside the allow-list; nothing was executed."""

    exit_code = 4


class RefusedError(TietoolError):
    """The operation is possible but would lose or invent information; an option can override it."""

    exit_code = 5


class ValuesDifferError(RefusedError):
    """``tie`` found a head whose values differ from the input embedding."""


class AmbiguousLayoutError(RefusedError):
    """vocab_size == hidden_size: the head's layout cannot be told from its shape."""


class OutputError(TietoolError):
    """The output folder cannot be written (exists, inside the input, disk full)."""

    exit_code = 6


EXIT_CODES = {
    "ok": 0,
    "error": TietoolError.exit_code,
    "usage": UsageError.exit_code,
    "checkpoint": CheckpointError.exit_code,
    "unsafe_pickle": UnsafePickleError.exit_code,
    "refused": RefusedError.exit_code,
    "output": OutputError.exit_code,
}
