"""One error hierarchy. Every error carries the file it concerns and says how to fix the problem.

The CLI maps each class to a one-line message and its :class:`ExitCode`; the Python API raises them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    """Every exit status of ``tietool`` (the one list; the CLI, the errors and ``verify`` use it).

    ``INTERRUPTED`` is the base: a signal adds its number (130 for Ctrl-C, 143 for SIGTERM), as shells do.
    """

    OK = 0
    ERROR = 1  # a tietool error of no narrower kind
    DIFFERENT = 1  # diff: the checkpoints differ (as diff and cmp exit); an alias of ERROR's value
    USAGE = 2  # an option value that makes no sense
    CHECKPOINT = 3  # the input is missing files, corrupt or inconsistent
    UNSAFE_PICKLE = 4  # a .pdparams names a global outside the allow-list
    REFUSED = 5  # possible, but would lose or invent information
    OUTPUT = 6  # the output cannot be written (also: out of memory, read-back mismatch)
    UNEXPLAINED = 7  # verify: a difference tie/untie/resize do not make
    NOT_COMPARED = 8  # verify --logits: the logits could not be compared (the tensors alone explain all)
    INTERNAL = 70  # a bug in tietool (EX_SOFTWARE)
    UNAVAILABLE = (
        75  # the network or the storage failed (connection, timeout, 5xx, throttling): retry (EX_TEMPFAIL)
    )
    INTERRUPTED = 128  # + the signal number


@dataclass(frozen=True)
class Opt:
    """An option of an operation, as a message names it. The library never spells a command-line flag: it
    puts ``Opt("keep", "head")`` in an f-string, and the caller's wording (:func:`set_wording`) turns it
    into ``keep='head'`` (Python, the default) or ``--keep head`` (the CLI).

    Attributes:
        name: the parameter name, as the Python API spells it (``keep``, ``vocab_size``, ``force``).
        value: the value to pass; None names the option in general; True a flag that is switched on.
    """

    name: str
    value: object = None

    def __format__(self, spec: str) -> str:
        return _wording(self)

    def __str__(self) -> str:
        return _wording(self)


def api_wording(o: Opt) -> str:
    """``keep='head'``, ``force=True``, ``vocab_size``: how Python code passes the option."""
    value = o.value.value if isinstance(o.value, Enum) else o.value  # an enum as the string it stands for
    return o.name if value is None else f"{o.name}={value!r}"


_wording: Callable[[Opt], str] = api_wording


def set_wording(wording: Callable[[Opt], str]) -> Callable[[Opt], str]:
    """How :class:`Opt` is worded in messages from now on, in this process (the CLI sets its flags while
    a command runs). Returns the wording it replaces, to put back."""
    global _wording
    before, _wording = _wording, wording
    return before


class TietoolError(Exception):
    """Base class: a problem with the user's input that tietool explains in one line.

    Args:
        message: what is wrong.
        path: the file or folder concerned (shown first in the message).
        fix: what the user can do about it.
    """

    exit_code = ExitCode.ERROR

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


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C or SIGTERM (raised as KeyboardInterrupt) that stopped an in-place run, with ``state``: what
    the checkpoint's name holds now (the old or the new version, and where the other one is), found by
    looking at the folders (:func:`surgery.write.inplace.interrupted_state`)."""

    def __init__(self, state: str):
        super().__init__(state)
        self.state = state


class UsageError(TietoolError):
    """An option value that makes no sense (``--vocab 0``, ``--out`` inside the input, ...)."""

    exit_code = ExitCode.USAGE


class CheckpointError(TietoolError):
    """The checkpoint folder is missing files, is corrupt or inconsistent."""

    exit_code = ExitCode.CHECKPOINT


class UnsafePickleError(CheckpointError):
    """A ``.pdparams`` pickle names a global outside the allow-list; nothing was executed."""

    exit_code = ExitCode.UNSAFE_PICKLE


class RefusedError(TietoolError):
    """The operation is possible but would lose or invent information; an option can override it."""

    exit_code = ExitCode.REFUSED


class ValuesDifferError(RefusedError):
    """``tie`` found a head whose values differ from the input embedding."""


class AmbiguousLayoutError(RefusedError):
    """vocab_size == hidden_size: the head's layout cannot be told from its shape."""


class OutputError(TietoolError):
    """The output cannot be written: disk full, permissions, a dangling link or a link loop at the output,
    in place on a mount point, or a file that does not read back as planned. Nothing is left behind. (An
    output that exists and is not empty, or lies inside the input, is a :class:`UsageError`.)"""

    exit_code = ExitCode.OUTPUT


class StorageError(TietoolError):
    """The network or the object store failed while reading or writing (a refused or reset connection, a
    timeout, a server error or throttling): nothing is wrong with the checkpoint, and the same command run
    again may succeed. Nothing is left behind (an output is not published)."""

    exit_code = ExitCode.UNAVAILABLE
