"""Every shell example of the documents runs as written: each ```` ```bash ```` block of ``README.md``,
``docs/index.md``, ``docs/guides/*.md``, ``docs/reference/*.md`` and ``docs/design/*.md``, with
``bash -euo pipefail``, exits 0 (or the status its page says). README's first two blocks (the install and
the test suite) are marked skip: ``.ci/run`` runs them, in a fresh clone.

A block runs in a temporary folder that holds a copy of what the examples name from a clone
(``sample_checkpoints/``: nothing else, so an example that names the test data fails), with a ``tietool``
command first on ``PATH`` that runs the package under test: ``tietool.cli.app.main()`` in a fork of a
process that imported the package once (:mod:`support.fork_server`: the caller's argv, folder, environment
and standard streams, as ``python -m tietool`` would; a run costs its work, not a new interpreter's
imports), or ``python -m tietool`` itself under ``TIETOOL_DOCS_FRESH=1``. Each block is self-contained (its
outputs in ``"$(mktemp -d)"``); blocks do not share variables.

Markers, an HTML comment on the line just before the fence (invisible on the site):

* ``<!-- docs-test: exit N -->``: the block must exit with status N (a refusal the page shows);
* ``<!-- docs-test: skip (REASON) -->``: not run, e.g. it installs packages, needs a bucket or credentials,
  needs the paddle extra, or a checkpoint of your own. Every skip names its reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import fork_server, paths

import tietool

ROOT = paths.REPO
GUIDES = [ROOT / "README.md", ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
PAGES = [
    *GUIDES,
    *sorted((ROOT / "docs" / "reference").glob("*.md")),
    *sorted((ROOT / "docs" / "design").glob("*.md")),
]
COPIED = ["sample_checkpoints"]
MARKER = re.compile(r"<!-- docs-test: (exit (\d+)|skip \(([^)]+)\)) -->")
FENCE = re.compile(r"^```bash\n(.*?)^```$", re.S | re.M)


def _blocks(page: Path) -> list[tuple[str, int, str, int | None, str | None]]:
    """``(page name, line, code, expected status or None to skip, skip reason)`` of each bash block."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARKER.fullmatch(before.strip())
        status: int | None = 0
        reason = None
        if mark and mark.group(2):
            status = int(mark.group(2))
        elif mark:
            status, reason = None, mark.group(3)
        out.append((str(page.relative_to(ROOT)), line, m.group(1), status, reason))
    return out


BLOCKS = [b for page in PAGES for b in _blocks(page)]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A folder with the copied inputs, and an environment whose ``tietool`` is this package."""
    base = tmp_path_factory.mktemp("docs")
    for rel in COPIED:
        shutil.copytree(ROOT / rel, base / "tree" / rel, symlinks=True)
    bindir = base / "bin"
    bindir.mkdir()
    env = dict(os.environ)
    package_parent = str(Path(tietool.__file__).parent.parent)  # not resolved: a symlinked package stays
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    env["TMPDIR"] = str(base)
    env.pop("TIETOOL_DEBUG", None)
    server = fork_server.start(base, env) if not os.environ.get("TIETOOL_DOCS_FRESH") else None
    fork_server.write_shim(bindir / "tietool", base / "tietool.sock")
    yield base / "tree", env
    if server is not None:
        server.kill()
        server.wait()


def _readme_block(n: int) -> str:
    """README's n-th ```bash block, as ``.ci/run`` reads it."""
    return FENCE.findall((ROOT / "README.md").read_text(encoding="utf-8"))[n - 1]


def test_readme_first_command_is_the_user_install() -> None:
    """README's first command installs the tool alone (no extra: seconds, not the test extra's minutes and
    2 GB) and runs the main job on a shipped sample; the second installs the test extra and runs the tests.
    Its time is measured by ``bench/first_command.py`` and recorded in ``bench/RESULTS.md`` (this test
    times nothing)."""
    first, second = _readme_block(1), _readme_block(2)
    assert "python3 -m venv .venv" in first and ".venv/bin/pip install . " in first and "[" not in first
    assert ".venv/bin/tietool inspect sample_checkpoints/" in first
    assert '.venv/bin/pip install -e ".[test]"' in second and "pytest" in second
    results = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    assert "# README's first command" in results and "bench/first_command.py" in results


def test_pages_have_examples() -> None:
    """The runner finds the blocks: README, every guide and the index have at least one bash block (object
    storage's are all marked skip: they need a bucket); README's five tasks each have one that runs."""
    pages = {b[0] for b in BLOCKS}
    assert pages >= {str(p.relative_to(ROOT)) for p in GUIDES}
    assert sum(b[3] is not None for b in BLOCKS) >= 30
    assert sum(b[0] == "README.md" and b[3] is not None for b in BLOCKS) >= 5


@pytest.mark.parametrize("page,line,code,status,reason", BLOCKS, ids=[f"{b[0]}:{b[1]}" for b in BLOCKS])
def test_example_runs(
    sandbox: tuple[Path, dict[str, str]],
    page: str,
    line: int,
    code: str,
    status: int | None,
    reason: str | None,
) -> None:
    if status is None:
        pytest.skip(f"marked in {page}: {reason}")
    cwd, env = sandbox
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == status, (
        f"{page}:{line} exited {proc.returncode}, the page says {status}\n"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )
