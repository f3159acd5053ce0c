"""Shared fixtures of the tietool tests.

The tests read only ``tests/data`` (see its README) and write only below pytest's temporary folders. The
helper modules are the package ``tests/support`` (importable as ``support``: pytest puts ``tests/`` on
``sys.path``, as ``tests/`` has no ``__init__.py``); the code under test is the installed ``tietool``.

The folders mirror the package (tests/README.md): each test gets the marker of its top folder
(:data:`FOLDER_MARKERS`), so ``pytest tests/unit`` or ``-m unit`` is the inner loop. Every folder that holds
test files is put on ``sys.path`` here, so a test module imported by another (``from test_x import ...``)
is found wherever either lives (test file names are unique across folders: pytest imports them by name).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from support import fixture_support as fs
from support import paths, pnlp_support

# top folder below tests/ -> the marker every test in it gets (registered in pyproject.toml)
FOLDER_MARKERS = {
    "unit": "unit",
    "cli": "cli",
    "oracles": "oracle",
    "adversarial": "adversarial",
    "cases": "cases",
    "structure": "structure",
}

for _folder in sorted({p.parent for p in paths.TESTS.rglob("test_*.py")} - {paths.TESTS}):
    if "data" not in _folder.relative_to(paths.TESTS).parts and str(_folder) not in sys.path:
        sys.path.append(str(_folder))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets the marker of its top folder below ``tests/`` (:data:`FOLDER_MARKERS`)."""
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(paths.TESTS) if item.path else None
        marker = FOLDER_MARKERS.get(rel.parts[0]) if rel and len(rel.parts) > 1 else None
        if marker:
            item.add_marker(marker)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``pnlp`` needs the PaddleNLP 2.8.1 venv: skipped without it, failed under
    ``TIETOOL_REQUIRE_PNLP`` (``.ci/run``), whether or not the test calls :func:`pnlp_support.require`."""
    if item.get_closest_marker("pnlp"):
        pnlp_support.require()


@pytest.fixture
def fixture_copy(tmp_path):
    """``fixture_copy(name)``: a writable copy of fixture ``name`` in this test's temporary folder."""

    def copy(name: str, dst: str | None = None) -> Path:
        return fs.copy_checkpoint(paths.CASES_DIR / name, tmp_path / (dst or name))

    return copy


@pytest.fixture(scope="session")
def live_logits(tmp_path_factory):
    """:class:`support.fixture_support.LiveLogits` for the session: PaddleFormers logits computed in this
    run, the inputs' cached once per (folder, keyword arguments)."""
    if importlib.util.find_spec("paddleformers") is None:
        pytest.skip("paddleformers is not importable in this interpreter (install the [test] extra)")
    live = fs.LiveLogits(tmp_path_factory.mktemp("live-logits"))
    yield live
    live.close()
