"""The generated pages of the docs site are up to date with what they are generated from.

* ``docs/cli.md`` is ``docs/gen_cli_reference.py``'s rendering of the Typer app: a new option, a changed
  help text or metavar makes it stale. Regenerate: ``python docs/gen_cli_reference.py``.
* ``docs/design/loader-facts.md`` holds the loader table ``tests/support/loader_table.py`` renders from the
  architecture table. Regenerate: ``python tests/support/loader_table.py docs/design/loader-facts.md``.
"""

from __future__ import annotations

import importlib.util

from support import loader_table, paths

ROOT = paths.REPO


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_current() -> None:
    gen = _generator()
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == gen.render(), "docs/cli.md is stale: run python docs/gen_cli_reference.py"


def test_cli_reference_lists_every_command() -> None:
    """The page has a section per command of the app (what the generator walks is the real tree)."""
    import typer

    from tietool.cli.app import app

    group = typer.main.get_command(app)
    ctx = group.make_context("tietool", [], resilient_parsing=True)
    names = group.list_commands(ctx)  # type: ignore[attr-defined]
    assert {"inspect", "tie", "untie", "resize", "add-tokens", "verify", "convert", "merge"} <= set(names)
    page = _generator().render()
    for name in names:
        assert f"\n## tietool {name}\n" in page
        assert f"Usage: tietool {name} [OPTIONS]" in page


def test_loader_facts_page_is_current() -> None:
    text = (ROOT / "docs" / "design" / "loader-facts.md").read_text(encoding="utf-8")
    block = loader_table.readme_block(text)
    assert block is not None, f"docs/design/loader-facts.md has no {loader_table.BEGIN} ... block"
    assert block == loader_table.markdown().strip(), (
        "docs/design/loader-facts.md's loader table is stale: run "
        "python tests/support/loader_table.py docs/design/loader-facts.md"
    )
