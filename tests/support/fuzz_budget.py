"""How many examples the ``slow`` fuzz variants draw (``test_fuzz_hypothesis.py``, ``test_fuzz_commands.py``).

The default run (README's ``pytest -q``, CI) draws an eighth of each slow variant's full count (375 of 3,000,
500 of 4,000, 125 of 1,000), never fewer than its fast twin's (200 of 1,500): the same properties on the
same strategies, at an eighth of the time. ``TIETOOL_DEEP_FUZZ=1`` draws the full counts (a deep run, e.g.
after a change to a reader or the writer). ``derandomize=True`` keeps both deterministic, so every CI run
draws the same examples: the default budget is a regression net at the cost the suite can pay on 2 cores
(a quarter until 2026-12-03), the deep run the search.

A fast variant whose slow twin is selected in the same session is skipped (:func:`skip_if_twin_selected`):
the whole suite draws each property's examples once, from the twin.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

DEEP = os.environ.get("TIETOOL_DEEP_FUZZ") == "1"


def slow_examples(full: int, at_least: int = 1) -> int:
    """``full`` under ``TIETOOL_DEEP_FUZZ=1``, else an eighth of it but at least ``at_least`` (the fast
    twin's count, which this variant replaces in a whole run)."""
    return full if DEEP else max(at_least, full // 8)


def skip_if_twin_selected(request: Any, twin: str) -> None:
    """Skip the calling fast fuzz test when ``twin``, its slow variant in the same module (the same property
    on the same or a wider strategy, several times the examples, the same parameters), is selected in this
    session: the whole suite (CI, README's command) or ``-m slow`` runs the twin, whose examples exercise the
    same paths, so the fast test's would be drawn for nothing. ``-m "not slow"``, ``-k`` of the fast test
    alone, or ``TIETOOL_FUZZ_BOTH=1`` runs it as before. Each xdist worker collects (and deselects) the
    same items, so the decision is the same on every worker."""
    if os.environ.get("TIETOOL_FUZZ_BOTH") == "1":
        return
    node = request.node
    name = twin + node.name[len(node.originalname) :]  # the same parameters, e.g. "[pf_llama_tied_fp32]"
    if any(getattr(i, "module", None) is node.module and i.name == name for i in request.session.items):
        pytest.skip(
            f"{name} runs in this session: the same property, more examples (TIETOOL_FUZZ_BOTH=1 runs both)"
        )


@pytest.fixture(autouse=True)
def fast_twin(request: pytest.FixtureRequest) -> None:
    """Autouse in a module that imports it: its fast test named in the module's ``TWINS`` (fast name → slow
    name) is skipped when the slow twin runs in this session (:func:`skip_if_twin_selected`)."""
    twin = getattr(request.module, "TWINS", {}).get(request.node.originalname)
    if twin is not None:
        skip_if_twin_selected(request, twin)
