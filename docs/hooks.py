"""mkdocs hook: let mkdocstrings read ``tietool`` from this checkout, whatever its folder is named.

The repository root *is* the package (``package-dir = {"tietool" = "."}`` in pyproject.toml), so griffe,
which finds a package as a folder of its name on the search path, finds none in a clone (and in an editable
install it falls back to importing, where the lazily imported operations of ``tietool.__all__`` cannot be
collected). Before the build, a temporary folder gets a ``tietool/`` of links to what pyproject.toml installs
(``__init__.py``, ``__main__.py``, ``cli/``, ``surgery/``) and goes first on ``sys.path``, which mkdocstrings'
Python handler searches; it is removed after the build.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = ("__init__.py", "__main__.py", "cli", "surgery")
_made: list[str] = []


@event_priority(100)  # before mkdocstrings sets up its Python handler, which reads sys.path
def on_config(config: Any, **_: Any) -> Any:
    """Make the ``tietool/`` of links and put its folder first on ``sys.path``."""
    base = tempfile.mkdtemp(prefix="tietool-docs-")
    package = Path(base) / "tietool"
    package.mkdir()
    for name in INSTALLED:
        (package / name).symlink_to(ROOT / name)
    sys.path.insert(0, base)
    _made.append(base)
    return config


def on_shutdown(**_: Any) -> None:
    """Remove the folder (the links only: their targets stay)."""
    while _made:
        base = _made.pop()
        if base in sys.path:
            sys.path.remove(base)
        shutil.rmtree(base, ignore_errors=True)
