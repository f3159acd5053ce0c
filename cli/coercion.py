"""Typer's parameter coercion, without importing pydantic for the parameters that do not need it.

Typer (0.2x) coerces every parameter value through a pydantic ``TypeAdapter`` that it builds the first time
the parameter is processed, even when no value was given: any command then imports pydantic and builds
its adapters (~0.15-0.35 s of ``tietool inspect``'s start-up, more than the command's own work on a
6.5 GB checkpoint). :func:`install` puts a lazy coercion in front of Typer's: a value that was not given
(``None``), a ``str`` for a ``str`` parameter, a plain decimal within its bounds for an ``int`` one, a
``list``/``tuple`` of ``str`` for a ``list[str]`` one, and a choice of an ``Enum`` parameter (by Typer's
own ``coerce_cli_choice``) get the value Typer's adapter returns for them; anything else (a ``Path``, a
value the shortcut does not accept) goes to Typer's own coercion, built then, so its results and its
error messages are Typer's. ``tests/cli/test_coercion.py`` checks both give the same values and errors for
every parameter of every command.
A Typer without this internal layer (``typer.core.build_runtime_param``) is left as it is.
"""

from __future__ import annotations

import importlib
import re
from enum import Enum
from typing import Any, get_args, get_origin

__all__ = ["install", "plain_value"]

_NOTHING = object()
_INT = re.compile(r"-?[1-9][0-9]{0,17}|0")  # a plain decimal (no sign +, leading zero, _ or space)


def plain_value(annotation: Any, value: Any, info: Any, ctx: Any) -> Any:
    """What Typer's coercion returns for ``value`` of a parameter annotated ``annotation`` (Typer's
    ``ParameterInfo`` ``info``: case sensitivity, bounds), when that needs no pydantic; else the module's
    ``_NOTHING`` sentinel (exposed as ``plain_value.nothing``).

    Raises:
        Nothing: a value the shortcut cannot settle is left to Typer.
    """
    if annotation is str and isinstance(value, str):
        return value
    if annotation is int and isinstance(value, str) and _INT.fullmatch(value):
        n = int(value)
        low, high = info.min, info.max
        return n if (low is None or n >= low) and (high is None or n <= high) else _NOTHING
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        return _NOTHING
    if isinstance(annotation, type) and issubclass(annotation, Enum) and isinstance(value, (str, Enum)):
        choice = importlib.import_module("typer._param_types").coerce_cli_choice
        try:
            return choice(value, choices=tuple(annotation), case_sensitive=info.case_sensitive, ctx=ctx)
        except ValueError:
            return _NOTHING
    return _NOTHING


plain_value.nothing = _NOTHING  # type: ignore[attr-defined]


class LazyCoercion:
    """A parameter's coercion: :func:`plain_value` first, Typer's runtime parameter (built by ``build`` on
    first need) for the rest. The ``coerce(value, param, ctx)`` of Typer's ``RuntimeParam``."""

    def __init__(self, descriptor: Any, build: Any) -> None:
        self.descriptor = descriptor
        self.build = build
        self.typer_param: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        """Typer's ``RuntimeParam.coerce``: ``None`` is ``()`` for a multi-value parameter, else ``None``."""
        if value is None:
            return () if (param.multiple or param.nargs == -1) else None
        info = self.descriptor.parameter_info
        multi_str = (param.multiple or param.nargs == -1) and isinstance(value, str)  # Typer refuses it
        if info.parser is None and not multi_str:
            got = plain_value(self.descriptor.annotation, value, info, ctx)
            if got is not _NOTHING:
                return got
        if self.typer_param is None:
            self.typer_param = self.build(self.descriptor)
        return self.typer_param.coerce(value, param=param, ctx=ctx)


def install() -> None:
    """Route Typer's parameter coercion through :class:`LazyCoercion` (once; a no-op on a Typer without
    ``typer.core.build_runtime_param``)."""
    try:
        core = importlib.import_module("typer.core")
    except ImportError:
        return
    build = getattr(core, "build_runtime_param", None)
    if build is None or getattr(build, "tietool_lazy", False):
        return

    def lazy(descriptor: Any) -> LazyCoercion:
        return LazyCoercion(descriptor, build)

    lazy.tietool_lazy = True  # type: ignore[attr-defined]
    setattr(core, "build_runtime_param", lazy)  # noqa: B010 - a module attribute Typer looks up per call
