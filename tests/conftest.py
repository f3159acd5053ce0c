"""Shared fixtures of the tietool tests.

The tests read only ``tests/data`` (see its README) and write only below pytest's temporary folders. The
helper modules are the package ``tests/support`` (importable as ``support``: pytest puts ``tests/`` on
``sys.path``, as ``tests/`` has no ``__init__.py``); the code under test is the installed ``tietool``.

The folders mirror the package (tests/README.md): each test gets the marker of its top folder
(:data:`FOLDER_MARKERS`), so ``pytest tests/unit`` or ``-m unit`` is the inner loop. Every folder that holds
test files is put on ``sys.path`` here, so a test module imported by another (``from test_x import ...``)
is found wherever either lives (test file names are unique across folders: pytest imports them by name).

Run in parallel (README's test command: ``pytest -n auto``; ``--dist loadgroup`` comes from
``pyproject.toml``), each worker is a process of its own with its own temporary folders, so tests share no
path; two kinds of
tests are kept together by an ``xdist_group`` marker (:func:`xdist_group_of`): a module whose tests share an
expensive module- or session-scoped build (:data:`SHARED_BUILDS`: split over two workers, each would build
it), and the tests bounded by time or memory or that kill runs at measured moments (:data:`TIMING`: one at a
time, never against each other).
"""

from __future__ import annotations

import importlib.util
import signal
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

# test files whose tests share a module- or session-scoped fixture that builds much (checkpoints written by
# PaddleFormers, a corpus run through the CLI, libraries loaded in subprocesses): one worker builds it once
SHARED_BUILDS = frozenset(
    {
        "cli/test_remote.py",  # moto's S3 server, the fixtures uploaded
        "oracles/test_add_tokens_e2e.py",
        "oracles/test_convert.py",
        "oracles/test_families.py",
        "oracles/test_fixtures.py",
        "oracles/test_hf_loader.py",
        "oracles/test_merge_experts.py",
        "oracles/test_pnlp_loaders.py",
        "oracles/test_hf_vocab_outputs.py",
        "oracles/test_prune.py",
        "oracles/test_prune_tokenizers.py",
        "oracles/test_rename_tokens.py",
        "oracles/test_resize.py",
        "oracles/test_tokenizer_edit.py",
        "oracles/test_tokenizer_loaders.py",
        "oracles/test_verify_logits.py",
    }
)

# tests (a file, or a test by its node id without parameters) whose verdict rests on time or memory: kills at
# measured moments, a run's seconds or peak RSS under a bound, a corpus run under per-run alarms. They run on
# one worker one after another, so none of them is measured while another of them loads the machine.
TIMING = (
    "adversarial/test_atomic.py::test_sigkill_at_random_points",
    "adversarial/test_corrupt_corpus.py",  # 30 s alarm per run, peak memory bound
    "adversarial/test_flex_bounds.py",  # seconds < 10, peak RSS
    "adversarial/test_hostile.py",  # the case's alarm per run (up to 60 s), peak memory under 1 GiB
    "adversarial/test_inplace.py",  # SIGKILL / SIGTERM at measured points of a swap
    "adversarial/test_inplace_flex.py",
    "adversarial/test_merge_experts_bounds.py",  # seconds < 10
    "adversarial/test_pickle_safety.py::test_memo_bomb_refused_in_linear_time",  # < 2 s
    "cli/test_cli_runner.py::test_a_timeout_stops_an_in_process_run",  # < 4 s
)


def xdist_group_of(rel: str, build: str | None = None) -> str | None:
    """The ``xdist_group`` of the test with node id ``rel`` (relative to ``tests/``): ``"timing"``
    (:data:`TIMING`), the file's path (:data:`SHARED_BUILDS`; ``PATH:BUILD`` when the file names the
    separate build the test shares, :func:`shared_build_of`), or None (any worker)."""
    path, _, name = rel.partition("::")
    bare = f"{path}::{name.split('[', 1)[0]}" if name else path
    if any(bare == t or path == t for t in TIMING):
        return "timing"
    if path not in SHARED_BUILDS:
        return None
    return f"{path}:{build}" if build else path


def shared_build_of(item: pytest.Item) -> str | None:
    """The build ``item`` shares, where its file builds more than one: the file's ``xdist_build(item)``
    (a file of :data:`SHARED_BUILDS` whose tests fall into independent builds, each with its own module- or
    session-scoped fixture, defines it; each build is then a group of its own, so two workers can build two
    at once), else None (the whole file is one build)."""
    of = getattr(getattr(item, "module", None), "xdist_build", None)
    return of(item) if of is not None else None


for _folder in sorted({p.parent for p in paths.TESTS.rglob("test_*.py")} - {paths.TESTS}):
    if "data" not in _folder.relative_to(paths.TESTS).parts and str(_folder) not in sys.path:
        sys.path.append(str(_folder))


def _compile_sources() -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` (or ``-B``), compile tietool's modules and ``tests/support`` into
    their ``__pycache__`` once, as ``pip install`` does for an installed package, so that the suite's many
    fresh interpreters (``python -m tietool`` runs, killed runs, workers) read bytecode instead of compiling
    ~25,000 lines each (``import tietool.cli.app, tietool.surgery.ops``: 0.31 s → 0.18 s). Without the flag
    Python caches on first import by itself, and this does nothing."""
    import compileall

    import tietool

    if not sys.dont_write_bytecode:
        return
    package = Path(tietool.__file__).resolve().parent
    compileall.compile_dir(package, maxlevels=0, quiet=1)  # __init__.py, __main__.py
    for folder in (package / "cli", package / "surgery", paths.TESTS / "support"):
        compileall.compile_dir(folder, quiet=1)


def pytest_configure(config: pytest.Config) -> None:
    """Compile the sources once (:func:`_compile_sources`, in the controlling process only). Refuse a parallel
    run in which the ``xdist_group`` markers would be silently ignored: pytest-xdist's
    ``--dist loadgroup`` suffixes each grouped item's ``_nodeid`` with ``@group``, which pytest 9.2's
    ``Node.nodeid`` no longer reads (the groups of :func:`xdist_group_of` then split over the workers)."""
    if not hasattr(config, "workerinput"):
        _compile_sources()
    if getattr(config.option, "dist", None) != "loadgroup":
        return
    probe = type("Probe", (), {"_nodeid": "x@group", "_id": "x"})()
    if pytest.Item.nodeid.fget(probe) != "x@group":  # type: ignore[attr-defined]
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores pytest-xdist's --dist loadgroup (Node.nodeid does not read "
            "_nodeid): install the test extra's pytest (<9.2), or run with -n 0"
        )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets the marker of its top folder below ``tests/`` (:data:`FOLDER_MARKERS`) and its
    ``xdist_group`` (:func:`xdist_group_of`)."""
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(paths.TESTS) if item.path else None
        marker = FOLDER_MARKERS.get(rel.parts[0]) if rel and len(rel.parts) > 1 else None
        if marker:
            item.add_marker(marker)
        group = xdist_group_of(rel.as_posix() + "::" + item.name, shared_build_of(item)) if rel else None
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
_HANDLERS = pytest.StashKey[dict]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``pnlp`` needs the PaddleNLP 2.8.1 venv: skipped without it, failed under
    ``TIETOOL_REQUIRE_PNLP`` (``.ci/run``), whether or not the test calls :func:`pnlp_support.require`.
    First it notes the signal handlers the test starts with (:func:`pytest_runtest_teardown`)."""
    item.stash[_HANDLERS] = {s: signal.getsignal(s) for s in _SIGNALS}
    if item.get_closest_marker("pnlp"):
        pnlp_support.require()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item):
    """A test (or its fixtures) that leaves SIGINT, SIGTERM or SIGHUP with another handler than it found
    fails, naming the signals, and the handlers are put back: the next test of the worker process (any
    test, under xdist) must see Python's defaults. (The CLI ignores these signals once a run has said its
    result, and the product holds them back while it renames: a later test that sends itself Ctrl-C would
    see it ignored.)"""
    yield
    before = item.stash.get(_HANDLERS, {})
    changed = sorted(signal.Signals(s).name for s, h in before.items() if signal.getsignal(s) is not h)
    for s, h in before.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)
    if changed:
        pytest.fail(f"{item.nodeid} left other handlers for {changed} (put back now)", pytrace=False)


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
