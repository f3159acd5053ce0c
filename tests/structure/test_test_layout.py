"""The tests mirror the package (tests/README.md, "The folders"): every test file sits in a folder that is a
marker, ``tests/unit/<layer>/`` names a layer of ``surgery/``, file names are unique across folders (pytest
imports test modules by name) and name a module or feature, not an issue, and tests/README.md lists them."""

from __future__ import annotations

import re

import pytest
from conftest import FOLDER_MARKERS, SHARED_BUILDS, TIMING, shared_build_of, xdist_group_of
from support import paths

TEST_FILES = sorted(
    p for p in paths.TESTS.rglob("test_*.py") if "data" not in p.relative_to(paths.TESTS).parts
)
LAYERS = ("model", "arch", "io", "inspect", "plan", "write", "report", "verify", "diff", "ops")


def test_every_test_file_sits_in_a_marked_folder():
    loose = [p.name for p in TEST_FILES if p.parent == paths.TESTS]
    unknown = [str(p) for p in TEST_FILES if p.relative_to(paths.TESTS).parts[0] not in FOLDER_MARKERS]
    assert loose == [] and unknown == []
    assert len(TEST_FILES) > 50


def test_unit_folders_are_layers_of_the_package():
    folders = {p.relative_to(paths.TESTS / "unit").parts for p in (paths.TESTS / "unit").rglob("test_*.py")}
    layers = {parts[0] for parts in folders}
    assert all(len(parts) == 2 for parts in folders), "tests/unit/<layer>/test_*.py, one level"
    assert layers <= set(LAYERS)
    surgery = paths.REPO / "surgery"
    assert all((surgery / layer).is_dir() or (surgery / f"{layer}.py").is_file() for layer in layers)


def test_test_file_names_are_unique_and_name_no_issue():
    names = [p.name for p in TEST_FILES]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
    assert [n for n in names if re.search(r"_i\d+\b|issue|breaker", n)] == []


def test_readme_lists_every_test_file():
    readme = (paths.TESTS / "README.md").read_text(encoding="utf-8")
    assert [p.name for p in TEST_FILES if p.name not in readme] == []
    assert [f for f in FOLDER_MARKERS if f"`{f}/" not in readme] == []


def test_a_test_gets_its_folders_marker(request: pytest.FixtureRequest):
    assert request.node.get_closest_marker("structure") is not None
    assert request.node.get_closest_marker("unit") is None


def test_unit_tests_load_no_library_in_a_subprocess():
    """tests/unit is the inner loop: no test there is marked ``slow`` or ``pnlp`` (a library load lives in
    tests/oracles)."""
    marked = [
        str(p.relative_to(paths.TESTS))
        for p in (paths.TESTS / "unit").rglob("test_*.py")
        if re.search(r"pytest\.mark\.(slow|pnlp)\b", p.read_text(encoding="utf-8"))
    ]
    assert marked == []


def test_the_xdist_groups_name_existing_tests():
    """Every file and test named by conftest's SHARED_BUILDS and TIMING exists (a renamed file or test would
    fall out of its group silently), and the groups are the ones pytest-xdist is told about."""
    missing = [f for f in SHARED_BUILDS if not (paths.TESTS / f).is_file()]
    for entry in TIMING:
        path, _, name = entry.partition("::")
        file = paths.TESTS / path
        if not file.is_file() or (name and not re.search(rf"^def {name}\(", file.read_text(), re.M)):
            missing.append(entry)
    assert missing == []
    assert xdist_group_of("adversarial/test_hostile.py::test_hostile[x-tie]") == "timing"
    assert xdist_group_of("adversarial/test_atomic.py::test_sigkill_at_random_points") == "timing"
    assert xdist_group_of("adversarial/test_atomic.py::test_disk_full_leaves_nothing[copy]") is None
    assert xdist_group_of("oracles/test_families.py::test_x[a]") == "oracles/test_families.py"
    assert xdist_group_of("oracles/test_families.py::test_x[a]", "b1") == "oracles/test_families.py:b1"
    assert xdist_group_of("adversarial/test_hostile.py::test_hostile[x-tie]", "b1") == "timing"
    assert xdist_group_of("unit/io/test_store.py::test_x", "b1") is None
    assert xdist_group_of("unit/io/test_store.py::test_x") is None


def test_the_tests_run_grouped_under_xdist(request: pytest.FixtureRequest):
    """``--dist loadgroup`` is in pyproject's addopts (any ``-n N`` keeps the groups), and a grouped test
    carries its marker."""
    import tomllib

    ini = tomllib.loads((paths.REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--dist loadgroup" in ini["addopts"]
    assert request.node.get_closest_marker("xdist_group") is None
    grouped = [i for i in request.session.items if i.get_closest_marker("xdist_group")]
    assert all(
        i.get_closest_marker("xdist_group").args[0]
        == xdist_group_of(str(i.path.relative_to(paths.TESTS)) + "::" + i.name, shared_build_of(i))
        for i in grouped
    )
