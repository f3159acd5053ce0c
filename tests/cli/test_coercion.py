"""``cli.coercion``: the lazy coercion in front of Typer's gives, for every parameter of every command and
each kind of value, what Typer's own (pydantic) coercion gives, including its errors; and ``tietool
inspect`` then imports no pydantic."""

from __future__ import annotations

import enum
import importlib

import pytest
import typer.main

from tietool.cli.app import app
from tietool.cli.coercion import LazyCoercion, install

core = importlib.import_module("typer.core")
install()
BUILD = getattr(core, "build_runtime_param")  # noqa: B009 - the patched name
TYPER_BUILD = importlib.import_module("typer._coercion").build_runtime_param


def _params():
    cmd = typer.main.get_command(app)
    for name, sub in sorted(cmd.commands.items()):
        for p in sub.params:
            if hasattr(p, "type_descriptor"):
                yield name, sub, p


def _values(p) -> list:
    ann = p.type_descriptor.annotation
    out: list = [None]
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        out += [m.value for m in ann] + [next(iter(ann)), "no-such-choice"]
    elif ann is str:
        out += ["abc", "", "ü/ß path"]
    elif ann is int:
        out += ["128512", "-1", "0", "007", "+5", "1_000", " 3", "99999999999999999999", "x", ""]
    elif getattr(ann, "__origin__", None) is list:
        out += [("a", "b"), (), ["c"]]
    return out


def _outcome(rp, value, p, ctx):
    try:
        return ("value", rp.coerce(value, param=p, ctx=ctx))
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        return ("error", type(e).__name__, str(e))


PARAMS = list(_params())


def test_the_lazy_coercion_is_installed():
    assert getattr(BUILD, "tietool_lazy", False)


@pytest.mark.parametrize(("command", "sub", "param"), PARAMS, ids=[f"{c}-{p.name}" for c, _, p in PARAMS])
def test_same_values_and_errors_as_typer(command, sub, param):
    ctx = typer.main.get_command(app).make_context("tietool", [command, "--help"], resilient_parsing=True)
    for value in _values(param):
        ours = _outcome(LazyCoercion(param.type_descriptor, TYPER_BUILD), value, param, ctx)
        theirs = _outcome(TYPER_BUILD(param.type_descriptor), value, param, ctx)
        assert ours == theirs, (command, param.name, value)
        if ours[0] == "value":
            assert type(ours[1]) is type(theirs[1])


def test_every_kind_of_parameter_is_covered():
    kinds = {repr(p.type_descriptor.annotation) for _, _, p in PARAMS}
    assert {"<class 'str'>", "<class 'int'>", "list[str]", "<class 'bool'>"} <= kinds
    assert any("enum" in k for k in kinds)
