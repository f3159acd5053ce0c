"""tietool: surgery on the input embedding and LM head of PaddlePaddle LLM checkpoints.

The installed package is laid out as the repository is: :mod:`tietool.surgery` (the library, no paddle),
:mod:`tietool.cli` (the Typer app). ``python -m tietool`` runs the command line.

The operations are also a Python API, loaded on first use (importing this package stays cheap: no numpy,
no paddle)::

    import tietool
    info = tietool.inspect("ckpt/")                      # dict: what `tietool inspect --json` prints
    rep = tietool.tie("ckpt/", "tied/")                  # dict: the report (also tied/tietool-report.json)
    rep = tietool.resize("ckpt/", 32000, "resized/", pad_to_multiple_of=64)
    assert tietool.verify("ckpt/", "resized/").explained

Errors are :class:`tietool.TietoolError` subclasses; ``err.exit_code`` is the CLI's exit status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .surgery import __version__
from .surgery.errors import (
    CheckpointError,
    ExitCode,
    OutputError,
    RefusedError,
    TietoolError,
    UnsafePickleError,
    UsageError,
    ValuesDifferError,
)
from .surgery.options import Init, Keep, Layout, Loader

if TYPE_CHECKING:
    from .surgery.operations import inspect, resize, tie, untie, verify

_OPERATIONS = ("inspect", "tie", "untie", "resize", "verify")

__all__ = [
    "CheckpointError",
    "ExitCode",
    "Init",
    "Keep",
    "Layout",
    "Loader",
    "OutputError",
    "RefusedError",
    "TietoolError",
    "UnsafePickleError",
    "UsageError",
    "ValuesDifferError",
    "__version__",
    "inspect",
    "resize",
    "tie",
    "untie",
    "verify",
]


def __getattr__(name: str) -> Any:
    """The operations (:mod:`tietool.surgery.operations`), imported on first use (they need numpy)."""
    if name in _OPERATIONS:
        from .surgery import operations

        return getattr(operations, name)
    raise AttributeError(f"module 'tietool' has no attribute {name!r}")
