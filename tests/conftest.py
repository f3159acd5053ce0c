"""Shared fixtures of the tietool tests.

The tests read only ``tests/data`` (see its README) and write only below pytest's temporary folders. The
helper modules are the package ``tests/support`` (importable as ``support``: pytest puts ``tests/`` on
``sys.path``, as ``tests/`` has no ``__init__.py``); the code under test is the installed ``tietool``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support import fixture_support as fs
from support import paths, pnlp_support


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
