"""tietool: surgery on the input embedding and LM head of PaddlePaddle LLM checkpoints.

The installed package is laid out as the repository is: :mod:`tietool.surgery` (the library, no paddle),
:mod:`tietool.cli` (the Typer app). ``python -m tietool`` runs the command line.

The operations are also a Python API, loaded on first use (importing this package stays cheap: no numpy,
no paddle)::

    import tietool
    info = tietool.inspect("ckpt/")          # Inspection: what `tietool inspect --json` prints, typed
    rep = tietool.tie("ckpt/", "tied/")      # Report (also tied/tietool-report.json); out=None: in place
    rep = tietool.resize("ckpt/", 32000, "resized/", pad_to_multiple_of=64)
    assert tietool.verify("ckpt/", "resized/").explained
    rep = tietool.merge("tp_ranks/", "merged/")  # model_state.tp00.pdparams, ... → one checkpoint

Errors are :class:`tietool.TietoolError` subclasses; ``err.exit_code`` is the CLI's exit status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .surgery import __version__
from .surgery.model.enums import Init, Keep, Layout, Loader, Target
from .surgery.model.errors import (
    CheckpointError,
    ExitCode,
    OutputError,
    RefusedError,
    TietoolError,
    UnsafePickleError,
    UsageError,
    ValuesDifferError,
)
from .surgery.results import Inspection, Report

if TYPE_CHECKING:
    from .surgery.ops import convert, inspect, merge, resize, tie, untie, verify
    from .surgery.verify import VerifyResult as Verification

_OPERATIONS = ("inspect", "tie", "untie", "resize", "verify", "convert", "merge")

__all__ = [
    "CheckpointError",
    "ExitCode",
    "Init",
    "Inspection",
    "Keep",
    "Layout",
    "Loader",
    "OutputError",
    "RefusedError",
    "Report",
    "Target",
    "TietoolError",
    "UnsafePickleError",
    "UsageError",
    "ValuesDifferError",
    "Verification",
    "__version__",
    "convert",
    "inspect",
    "merge",
    "resize",
    "tie",
    "untie",
    "verify",
]


def __getattr__(name: str) -> Any:
    """The operations (:mod:`tietool.surgery.ops`), imported on first use (they need numpy)."""
    if name in _OPERATIONS:
        from .surgery import ops as operations

        return getattr(operations, name)
    if name == "Verification":
        from .surgery.verify import VerifyResult

        return VerifyResult
    raise AttributeError(f"module 'tietool' has no attribute {name!r}")
