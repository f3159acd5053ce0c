"""tietool: surgery on the input embedding and LM head of PaddlePaddle LLM checkpoints.

The installed package is laid out as the repository is: :mod:`tietool.surgery` (the library, no paddle),
:mod:`tietool.cli` (the Typer app). ``python -m tietool`` runs the command line.

The operations are also a Python API, loaded on first use (importing this package stays cheap: no numpy,
no paddle)::

    import tietool
    info = tietool.inspect("ckpt/")          # Inspection: what `tietool inspect --json` prints, typed
    rep = tietool.tie("ckpt/", "tied/")      # Report (also tied/tietool-report.json); out=None: in place
    rep = tietool.resize("ckpt/", 32000, "resized/", pad_to_multiple_of=64)
    rep = tietool.add_tokens("ckpt/", ["<think>", "</think>"], "added/", special=True)
    assert tietool.verify("ckpt/", "resized/").explained
    d = tietool.diff("ckpt/", "resized/")   # Diff: tensors, config keys, tokens, files that differ
    rep = tietool.merge("tp_ranks/", "merged/")  # model_state.tp00.pdparams, ... → one checkpoint
    opts = tietool.WriteOptions(dry_run=True)     # the common write options, once for several calls
    rep = tietool.tie("ckpt/", "tied/", options=opts)

:data:`__all__` is the API, and ``tests/structure/test_exported_members.py`` pins it: the operations,
the options as enums and :class:`WriteOptions`, the result types, and the errors. Everything else
(``tietool.surgery.*``, ``tietool.cli.*``) is the implementation, free to move. The errors, drawn once::

    TietoolError                 err.exit_code is the CLI's exit status (ExitCode), err.path, err.fix
    ├── UsageError               2: an option value that makes no sense
    ├── CheckpointError          3: the input is missing files, corrupt or inconsistent
    │   └── UnsafePickleError    4: a .pdparams names a global outside the allow-list
    ├── RefusedError             5: possible, but would lose or invent information
    │   ├── ValuesDifferError        tie: the head's values differ from the embedding's
    │   └── AmbiguousLayoutError     vocab_size == hidden_size: the head's layout is not told by its shape
    ├── OutputError              6: the output cannot be written
    └── StorageError            75: the network or the object store failed: run it again
    Interrupted (KeyboardInterrupt)  Ctrl-C or SIGTERM stopped an in-place run; .state: what the name holds
"""

import typing as _typing

from .surgery import __version__
from .surgery.model.enums import (
    Container,
    HeadLayout,
    Init,
    Keep,
    Layout,
    Loader,
    Operation,
    Target,
    TensorRole,
    TieState,
    TokenInit,
    TransplantInit,
)
from .surgery.model.errors import (
    AmbiguousLayoutError,
    CheckpointError,
    ExitCode,
    Interrupted,
    OutputError,
    RefusedError,
    StorageError,
    TietoolError,
    UnsafePickleError,
    UsageError,
    ValuesDifferError,
)
from .surgery.results import Inspection, Report

if _typing.TYPE_CHECKING:
    from .surgery.diff import DiffResult as Diff
    from .surgery.ops import (
        add_tokens,
        convert,
        diff,
        fix_untrained,
        inspect,
        merge,
        prune,
        rename_tokens,
        resize,
        tie,
        transplant,
        untie,
        verify,
    )
    from .surgery.run import WriteOptions
    from .surgery.verify import VerifyResult as Verification

# the names that need numpy, imported on first use: name → (module under tietool, attribute)
_LAZY = {
    "inspect": ("surgery.ops", "inspect"),
    "tie": ("surgery.ops", "tie"),
    "untie": ("surgery.ops", "untie"),
    "resize": ("surgery.ops", "resize"),
    "add_tokens": ("surgery.ops", "add_tokens"),
    "fix_untrained": ("surgery.ops", "fix_untrained"),
    "prune": ("surgery.ops", "prune"),
    "rename_tokens": ("surgery.ops", "rename_tokens"),
    "transplant": ("surgery.ops", "transplant"),
    "verify": ("surgery.ops", "verify"),
    "convert": ("surgery.ops", "convert"),
    "merge": ("surgery.ops", "merge"),
    "diff": ("surgery.ops", "diff"),
    "Diff": ("surgery.diff", "DiffResult"),
    "Verification": ("surgery.verify", "VerifyResult"),
    "WriteOptions": ("surgery.run", "WriteOptions"),
}

__all__ = [
    "AmbiguousLayoutError",
    "CheckpointError",
    "Container",
    "Diff",
    "ExitCode",
    "HeadLayout",
    "Init",
    "Inspection",
    "Interrupted",
    "Keep",
    "Layout",
    "Loader",
    "Operation",
    "OutputError",
    "RefusedError",
    "Report",
    "StorageError",
    "Target",
    "TensorRole",
    "TieState",
    "TietoolError",
    "TokenInit",
    "TransplantInit",
    "UnsafePickleError",
    "UsageError",
    "ValuesDifferError",
    "Verification",
    "WriteOptions",
    "__version__",
    "add_tokens",
    "convert",
    "diff",
    "fix_untrained",
    "inspect",
    "merge",
    "prune",
    "rename_tokens",
    "resize",
    "tie",
    "transplant",
    "untie",
    "verify",
]


def __getattr__(name: str) -> _typing.Any:
    """The operations and :class:`Verification` (:data:`_LAZY`), imported on first use (they need numpy)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'tietool' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


def __dir__() -> list[str]:
    """The module's names, the lazily imported ones included (``dir(tietool)`` lists the whole API)."""
    return sorted(set(globals()) | set(_LAZY))
