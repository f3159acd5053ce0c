"""How tietool is installed: one top-level import package, no paddle in the core install, ``python -m
tietool``, immune to a user's own ``cli`` / ``surgery`` packages on ``PYTHONPATH``."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

from support import paths

import tietool

SAMPLE = paths.SAMPLES / "pf_llama_tied_fp32"


def _run(args: list[str], cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_one_top_level_package():
    dist = md.distribution("tietool")
    assert (dist.read_text("top_level.txt") or "").split() == ["tietool"]
    assert dist.version == tietool.__version__


def test_core_requirements_have_no_paddle():
    """paddle and PaddleFormers come only with an extra; the core is typer, rich, safetensors, numpy."""
    reqs = md.requires("tietool") or []
    core = sorted(r.split(">")[0].split("=")[0].split(";")[0].strip() for r in reqs if "extra ==" not in r)
    assert core == ["numpy", "rich", "safetensors", "typer"]
    paddle_extra = [r for r in reqs if 'extra == "paddle"' in r]
    assert any(r.startswith("paddlepaddle") for r in paddle_extra)
    assert any(r.startswith("paddleformers") for r in paddle_extra)


def test_python_m_tietool_help_imports_no_numpy_or_paddle(tmp_path):
    r = _run([sys.executable, "-X", "importtime", "-m", "tietool", "--help"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "inspect" in r.stdout and "resize" in r.stdout
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert "tietool.cli.app" in imported
    assert not {m for m in imported if m.split(".")[0] in ("numpy", "paddle", "paddleformers")}


def test_users_own_cli_and_surgery_packages_do_not_shadow_tietool(tmp_path):
    """A project with its own top-level ``cli`` and ``surgery`` first on PYTHONPATH (they raise on import)."""
    for pkg in ("cli", "surgery"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text(
            f"raise ImportError('the user project {pkg} was imported')\n"
        )
    env = {"PYTHONPATH": str(tmp_path)}
    r = _run([sys.executable, "-m", "tietool", "inspect", str(SAMPLE), "--json"], cwd=tmp_path, env_extra=env)
    assert r.returncode == 0, r.stderr
    assert '"lm_head.weight"' in r.stdout
    script = Path(sys.executable).with_name("tietool")
    if script.exists():
        r = _run([str(script), "inspect", str(SAMPLE), "--no-values"], cwd=tmp_path, env_extra=env)
        assert r.returncode == 0, r.stderr


def test_every_subpackage_is_listed_for_setuptools():
    """A package folder missing from ``[tool.setuptools] packages`` installs from a clone in editable mode but
    is absent from a wheel (``pip install .``): the list must name every folder with an ``__init__.py``."""
    import tomllib

    root = paths.REPO
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"tietool"} | {
        "tietool." + ".".join(init.parent.relative_to(root).parts)
        for top in ("cli", "surgery")
        for init in (root / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert listed == found
