"""numpy, imported on its first use rather than when a module that uses it is imported.

``tietool inspect --no-values`` reads headers only and never touches an array, but most of ``io/`` and
``inspect/`` use numpy somewhere; importing it is the largest single cost of the command's start-up
(~0.1-0.2 s of a ~0.5 s budget, ``bench/RESULTS.md``). Those modules write::

    if TYPE_CHECKING:
        import numpy as np
    else:
        from ..model.lazy import numpy as np

and ``np.x`` then imports numpy on the first attribute read (after which the module's names are copied
into the stand-in, so a later ``np.x`` is a plain attribute). Annotations stay strings
(``from __future__ import annotations``), so they read nothing. ``tests/structure/test_command_imports.py``
checks that ``inspect --no-values`` imports no numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LazyModule", "numpy"]


class LazyModule:
    """A stand-in for the module named ``name``: the first attribute read imports it (``ImportError`` then,
    as ``import name`` would), every read returns the module's attribute."""

    def __init__(self, name: str) -> None:
        self.__dict__["module_name"] = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__dict__["module_name"])
        self.__dict__.update(module.__dict__)  # later reads are plain attribute reads
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['module_name']!r}>"


numpy: Any = LazyModule("numpy")
