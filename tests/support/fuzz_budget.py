"""How many examples the ``slow`` fuzz variants draw (``test_fuzz_hypothesis.py``, ``test_fuzz_commands.py``).

The default run (README's ``pytest -q``, CI) draws a quarter of each slow variant's full count (750 of 3,000,
375 of 1,500, 1,000 of 4,000): the same properties on the same strategies, still several times the examples
of the fast variants, at a quarter of the time. ``TIETOOL_DEEP_FUZZ=1`` draws the full counts (a deep run,
e.g. after a change to a reader or the writer). ``derandomize=True`` keeps both deterministic.
"""

from __future__ import annotations

import os

DEEP = os.environ.get("TIETOOL_DEEP_FUZZ") == "1"


def slow_examples(full: int) -> int:
    """``full`` under ``TIETOOL_DEEP_FUZZ=1``, else a quarter of it."""
    return full if DEEP else max(1, full // 4)
