"""The documents name files that exist: every ``surgery/…``, ``cli/…``, ``tests/…`` and ``bench/…`` path in
the READMEs, the docs site (``docs/**/*.md``, ``mkdocs.yml``), in ``surgery/__init__.py`` and in the bench
scripts' docstrings is a file or folder of the repository, and every "``NAME`` in ``path.py``" names
something ``path.py`` defines at its top level.

Issue 19 moved most modules into layers (``surgery/plan.py`` → ``surgery/plan/``, ``write.py`` →
``write/writer.py`` + ``write/copy.py``, ...); a document that still names the old file sends a reader to a
file that is not there. Generated folders (``bench/_work``) and the steering repository's ``eval/`` are not
part of the clone and are not checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support import paths

ROOT = paths.REPO
DOCS = [
    "README.md",
    "tests/README.md",
    "bench/README.md",
    "sample_checkpoints/README.md",
    "tests/data/cases/README.md",
    "tests/data/tp_ranks/README.md",
    "surgery/__init__.py",
    "mkdocs.yml",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench").glob("*.py")),
]
PATH = re.compile(r"(?<![\w./:-])((?:surgery|cli|tests|bench)/[\w./*-]*[\w*])")
NAMED_IN = re.compile(r"`+(\w+)(?: = [^`]+)?`+ in `+((?:surgery|cli|tests|bench)/[\w/]+\.py)`+")
NOT_IN_CLONE = ("bench/_work",)


def _text(doc: str) -> str:
    """A document's text; of a Python file its docstrings only (its code names object-store keys too)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    if not doc.endswith(".py"):
        return text
    kinds = (ast.Module, ast.FunctionDef, ast.ClassDef)
    nodes = [n for n in ast.walk(ast.parse(text)) if isinstance(n, kinds)]
    return "\n".join(filter(None, (ast.get_docstring(n) for n in nodes)))


def _paths(doc: str) -> list[str]:
    text = _text(doc)
    return sorted({m.group(1) for m in PATH.finditer(text) if not m.group(1).startswith(NOT_IN_CLONE)})


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("doc", DOCS)
def test_named_paths_exist(doc: str) -> None:
    missing = [p for p in _paths(doc) if not any((ROOT / p).exists() for p in _globs(p))]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def _globs(path: str) -> list[Path]:
    return list(ROOT.glob(path)) if "*" in path else [ROOT / path]


@pytest.mark.parametrize("doc", DOCS)
def test_named_definitions_exist(doc: str) -> None:
    text = _text(doc)
    wrong = [
        f"{name} in {path}"
        for name, path in NAMED_IN.findall(text)
        if (ROOT / path).is_file() and name not in _top_level_names(ROOT / path)
    ]
    assert not wrong, f"{doc} says a name is defined in a module that does not define it: {wrong}"
