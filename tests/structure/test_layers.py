"""The layer rule of ``surgery/__init__.py``, enforced: an AST walk of every import in the library (lazy
imports inside functions included, ``TYPE_CHECKING`` ones too) finds no import against the pipeline order and
no cycle between modules.

Layers, in order (a module may import its own layer and the layers before it):
``model`` → ``arch`` → ``io`` → ``inspect`` → ``plan`` → ``write`` → ``report``/``results`` →
``verify``/``diff`` → ``run`` → ``ops`` → ``logits_worker``; then the package face ``tietool``
(``__init__.py``), and ``cli`` with ``__main__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

LAYERS = [
    "surgery surgery.model",  # surgery/__init__.py holds only __version__ and the map
    "surgery.arch",
    "surgery.io",
    "surgery.inspect",
    "surgery.plan",
    "surgery.write",
    "surgery.report surgery.results",
    "surgery.verify surgery.diff",
    "surgery.run",
    "surgery.ops",
    "surgery.logits_worker surgery.pnlp_logits_worker surgery.hf_logits_worker",
    "__init__",
    "cli __main__",
]
RANK = {unit: k for k, units in enumerate(LAYERS) for unit in units.split()}


def _modules() -> dict[str, Path]:
    """Every library module by dotted name relative to the package root (``surgery.io.store``)."""
    out = {}
    for f in [
        *REPO.glob("surgery/**/*.py"),
        *REPO.glob("cli/**/*.py"),
        REPO / "__init__.py",
        REPO / "__main__.py",
    ]:
        parts = list(f.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _unit(mod: str) -> str | None:
    """The layer unit a module belongs to (the longest prefix in :data:`RANK`)."""
    parts = mod.split(".")
    if mod == "surgery":
        return mod
    for n in range(len(parts), 1 if parts[0] == "surgery" else 0, -1):
        if ".".join(parts[:n]) in RANK:
            return ".".join(parts[:n])
    return None


def _imports(mod: str, path: Path, known: set[str]) -> set[str]:
    """The library modules ``mod`` imports (a name imported from a package counts as its submodule)."""
    is_pkg = path.name == "__init__.py"
    here = mod.split(".") if is_pkg and mod != "__init__" else mod.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{target}.{a.name}" if target else a.name
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tietool"):
            target = node.module.removeprefix("tietool").removeprefix(".")
            for a in node.names:
                sub = f"{target}.{a.name}" if target else a.name
                found.add(sub if sub in known else target)
    return {m for m in found if m and m != mod and m in known}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    bad = set()
    for m, deps in graph.items():
        for d in deps:
            um, ud = _unit(m), _unit(d)
            assert um is not None and ud is not None, (m, d)
            if RANK[ud] > RANK[um]:
                bad.add((m, d))
    return bad


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.add(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# Imports against the rule that the redesign (issue 19) still has to cut. Each entry is one import; the
# test fails when a new one appears and when one listed here is gone (so the list only shrinks).
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_CYCLES: set[frozenset[str]] = set()


def test_every_module_is_in_a_layer():
    assert all(_unit(m) is not None for m in _modules()), [m for m in _modules() if _unit(m) is None]


def test_no_import_against_the_layer_order():
    assert _upward(_graph()) == KNOWN_UPWARD


def test_no_import_cycle():
    assert _cycles(_graph()) == KNOWN_CYCLES


def test_the_walk_sees_lazy_imports():
    """The walk is not vacuous: run imports the writer lazily, and cli's lazy imports are found."""
    g = _graph()
    assert "surgery.write.writer" in g["surgery.run"]
    assert any(d.startswith("surgery.") for d in g["cli.app"])
