"""The optional extras install and import cleanly, and no message sends a user to a package index that does
not have tietool.

* tietool is not on PyPI: a message or a document that says ``pip install "tietool[tokenizer]"`` fails
  ("no matching distribution"). The words are :func:`tietool.surgery.model.extras.install_extra`'s
  (``pip install ".[tokenizer]" in the tietool clone``); this test greps the library, the CLI, README and
  the docs site for the other spelling.
* The ``paddle`` extra (PaddleFormers 1.2) and the NumPy it gets: PaddleFormers pulls ``datasets`` ->
  ``pyarrow`` unpinned while ``fast_dataindex`` pins ``numpy<=1.26.4``, and pyarrow 26 refuses NumPy 1 at
  import, so ``from paddleformers.trainer import Trainer`` and ``paddleformers-cli`` failed in the venv
  README builds. ``pyproject.toml`` pins ``pyarrow<26``; the slow test imports both in this venv.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import paths

from tietool.surgery.model.extras import install_extra

ROOT = paths.REPO
# pip install tietool / "tietool[x]" / 'tietool[x]' (an index install); `pip install .` and ".[x]" are fine
INDEX_INSTALL = re.compile(r"pip install (?:-\w+ )*[\"']?tietool\b")


def _texts() -> list[Path]:
    return [
        *ROOT.glob("surgery/**/*.py"),
        *ROOT.glob("cli/**/*.py"),
        ROOT / "README.md",
        *ROOT.glob("docs/**/*.md"),
        ROOT / "sample_checkpoints" / "README.md",
    ]


def _optional_dependencies() -> str:
    """pyproject.toml's ``[project.optional-dependencies]`` table as text (tomllib is 3.11+; tietool runs
    on 3.10)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]


def test_no_message_installs_tietool_from_an_index() -> None:
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in _texts()
        if p.name != "extras.py"  # its docstring quotes the spelling it replaces
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if INDEX_INSTALL.search(line)
    ]
    assert not hits, "tietool is not on PyPI; say install_extra()'s words instead:\n" + "\n".join(hits)


def test_install_extra_words() -> None:
    assert install_extra("tokenizer") == 'pip install ".[tokenizer]" in the tietool clone'
    assert not INDEX_INSTALL.search(install_extra("paddle"))


def test_extras_name_what_pyproject_defines() -> None:
    """Every ``install_extra("X")`` in the code names an extra of pyproject.toml."""
    extras = set(re.findall(r"(?m)^(\w+) = \[", _optional_dependencies()))
    used = {
        m
        for p in [*ROOT.glob("surgery/**/*.py"), *ROOT.glob("cli/**/*.py")]
        for m in re.findall(r"install_extra\([\"'](\w+)[\"']\)", p.read_text(encoding="utf-8"))
    }
    assert used and used <= extras, used - extras


def test_paddle_extra_pins_pyarrow() -> None:
    paddle = _optional_dependencies().split("paddle = [", 1)[1].split("]", 1)[0]
    assert '"pyarrow<26"' in paddle


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("paddleformers") is None, reason="the paddle extra is not installed"
)
def test_paddleformers_trainer_and_cli_import() -> None:
    """In the venv the test extra builds (this one), PaddleFormers' Trainer imports and its CLI runs."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pyarrow, numpy; from paddleformers.trainer import Trainer; print('ok')",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]
    cli = Path(sys.executable).parent / "paddleformers-cli"
    if not cli.exists():
        pytest.skip(f"{cli} not installed")
    run = subprocess.run([str(cli), "help"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "paddleformers-cli train" in run.stdout, run.stderr[-2000:]
