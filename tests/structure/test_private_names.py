"""No module of tietool uses another module's private name (issue 19: "a visible boundary"). An AST walk of
``surgery/``, ``cli/`` and ``__init__.py`` (lazy imports inside functions included) finds

- ``from M import _name`` where ``M`` is a tietool module, and
- ``m._name`` where ``m`` is bound by an import of a tietool module in that file (``from . import render``,
  ``from .io import store``, ``import tietool.surgery.ops as ops``).

A name shared between modules is public (no underscore). Importing a public name under a private alias
(``from .verify import verify as _verify``) is fine: the alias is the importer's own. Dunder names
(``__version__``) are not private.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO


def _modules() -> dict[str, Path]:
    """Every library module by dotted name relative to the package root (``surgery.io.store``)."""
    out = {}
    for f in [*REPO.glob("surgery/**/*.py"), *REPO.glob("cli/**/*.py"), REPO / "__init__.py"]:
        parts = list(f.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _target(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str | None:
    """The tietool module (dotted, relative to the package root) that ``node`` imports from; None for a
    third-party one."""
    if node.level:
        here = mod.split(".") if is_pkg and mod != "__init__" else mod.split(".")[:-1]
        base = here[: len(here) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    if node.module == "tietool" or (node.module or "").startswith("tietool."):
        return node.module.removeprefix("tietool").removeprefix(".")
    return None


def _uses(mod: str, is_pkg: bool, source: str, known: set[str]) -> set[tuple[str, str, str]]:
    """``(module, private name, where it lives)`` for every use in ``mod`` (its ``source``; ``is_pkg``: an
    ``__init__.py``) of another module's private name; ``known``: every tietool module."""
    tree = ast.parse(source)
    found: set[tuple[str, str, str]] = set()
    bound: dict[str, str] = {}  # a local name bound to a tietool module → that module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _target(mod, is_pkg, node)
            if target is None:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}" if target else a.name
                if sub in known:  # a module: its attributes are checked below
                    bound[a.asname or a.name] = sub
                elif _private(a.name):
                    found.add((mod, a.name, target or "__init__"))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tietool.") and a.asname:
                    bound[a.asname] = a.name.removeprefix("tietool.")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and _private(node.attr)
        ):
            found.add((mod, node.attr, bound[node.value.id]))
    return found


def _all_uses() -> set[tuple[str, str, str]]:
    mods = _modules()
    return {u for m, p in mods.items() for u in _uses(m, p.name == "__init__.py", p.read_text(), set(mods))}


# Private names used across modules, as (user, name, owner): none (issue 19 removed the last ones).
KNOWN: set[tuple[str, str, str]] = set()


def test_no_module_uses_another_modules_private_name():
    assert _all_uses() == KNOWN


def test_the_walk_finds_both_kinds():
    """The walk is not vacuous: an import of a private name and an attribute of an imported module are found,
    a private alias of a public name is not."""
    src = (
        "from .checkpoint import _read_config\n"
        "from . import store\n"
        "from .verify import verify as _verify\n"
        "import tietool.surgery.ops as o\n"
        "def f():\n"
        "    from ..ops import _path\n"
        "    from tietool.surgery.io.store import _fs\n"
        "    return store._walk, store.public, o._run, o.run\n"
    )
    known = {"surgery.io.checkpoint", "surgery.io.store", "surgery.io.verify", "surgery.ops"}
    tree_uses = _uses("surgery.io.probe", False, src, known)
    assert tree_uses == {
        ("surgery.io.probe", "_read_config", "surgery.io.checkpoint"),
        ("surgery.io.probe", "_path", "surgery.ops"),
        ("surgery.io.probe", "_walk", "surgery.io.store"),
        ("surgery.io.probe", "_fs", "surgery.io.store"),
        ("surgery.io.probe", "_run", "surgery.ops"),
    }
