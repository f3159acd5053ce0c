"""The package face, pinned (as httpx's ``tests/test_exported_members.py``): ``tietool.__all__`` is exactly
the set of public names of ``import tietool``, every name in it resolves, it holds the whole API (the seven
operations, every error class, the option enums, the result types), and importing tietool stays cheap (no
numpy, no paddle).
"""

from __future__ import annotations

import inspect as pyinspect
import subprocess
import sys
import types

import tietool
from tietool.surgery.model import enums, errors

OPERATIONS = {
    "inspect",
    "tie",
    "untie",
    "resize",
    "add_tokens",
    "fix_untrained",
    "rename_tokens",
    "prune",
    "transplant",
    "verify",
    "convert",
    "merge",
    "diff",
}
RESULTS = {"Inspection", "Report", "Verification", "Diff"}


def _public_names() -> set[str]:
    """What ``dir(tietool)`` offers that is not private and not a subpackage (``tietool.surgery`` and
    ``tietool.cli`` are the implementation, reachable but not the API)."""
    return {
        n
        for n in dir(tietool)
        if not n.startswith("_") and not isinstance(getattr(tietool, n), types.ModuleType)
    }


def test_all_is_the_set_of_public_names():
    assert sorted(tietool.__all__) == tietool.__all__, "keep __all__ sorted"
    assert len(set(tietool.__all__)) == len(tietool.__all__)
    assert set(tietool.__all__) - {"__version__"} == _public_names()


def test_every_name_in_all_resolves():
    for name in tietool.__all__:
        assert getattr(tietool, name) is not None, name
    assert isinstance(tietool.__version__, str) and tietool.__version__


def test_the_seven_operations_are_the_library_functions():
    from tietool.surgery import ops

    assert OPERATIONS <= set(tietool.__all__)
    for name in OPERATIONS:
        fn = getattr(tietool, name)
        assert pyinspect.isfunction(fn), name
        assert fn.__doc__, f"{name} has no docstring"
    assert tietool.tie is ops.tie and tietool.verify is ops.verify


def test_every_error_class_is_exported():
    """Every exception class of the error module (AmbiguousLayoutError was missing before issue 19), the same
    objects as the library raises."""
    classes = {
        n: c
        for n, c in vars(errors).items()
        if isinstance(c, type) and issubclass(c, BaseException) and c.__module__ == errors.__name__
    }
    assert {"TietoolError", "AmbiguousLayoutError", "Interrupted"} <= set(classes)
    for n, c in classes.items():
        assert getattr(tietool, n, None) is c, n
        assert n in tietool.__all__, n
    assert tietool.ExitCode is errors.ExitCode


# Enums of model/enums.py that are the library's inner vocabulary, not the API: how detection found a head
# (the enums seam's FoundBy), the scale of a tied head's logits (the arch seam's TiedScale), how far detection
# reads head and embedding (ValueCompare: a writer's choice, not an option), and StrEnum, the base class of
# the fact enums. Every other enum there is exported: an option an operation takes, or a value a result
# carries (HeadLayout, TieState, Container in inspect's result; Operation names an operation).
INTERNAL_ENUMS = {"FoundBy", "StrEnum", "TiedScale", "ValueCompare"}


def test_every_enum_is_exported_or_listed_internal():
    """Every enum of ``model/enums.py`` is in ``__all__`` (the same object), unless listed as internal: a new
    enum is a decision, not an accident."""
    found = {
        n
        for n, c in vars(enums).items()
        if isinstance(c, type) and issubclass(c, enums.Enum) and c.__module__ == enums.__name__
    }
    assert {"Layout", "Keep", "Init", "Loader", "Target"} <= found
    assert not INTERNAL_ENUMS & set(tietool.__all__)
    for n in found - INTERNAL_ENUMS:
        assert getattr(tietool, n, None) is getattr(enums, n), (
            f"{n}: add it to tietool.__all__ or INTERNAL_ENUMS"
        )
        assert n in tietool.__all__, n


def test_result_types_are_exported():
    from tietool.surgery.verify import VerifyResult

    assert RESULTS <= set(tietool.__all__)
    assert tietool.Verification is VerifyResult
    assert issubclass(tietool.Inspection, dict) and issubclass(tietool.Report, dict)


def test_an_unknown_name_is_an_attribute_error():
    try:
        tietool.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("tietool.no_such_name resolved")


def test_importing_tietool_and_its_face_is_cheap():
    """``import tietool`` and every eager name of ``__all__`` (errors, enums, result types) import no numpy
    and no paddle; nor does an operation's name (the operations load on use, numpy on its first use by
    ``surgery.model.lazy``); a planner does (the probe is not vacuous)."""
    code = (
        "import sys, tietool\n"
        "eager = [n for n in tietool.__all__ if n not in tietool._LAZY]\n"
        "[getattr(tietool, n) for n in eager]\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'paddle', 'paddleformers'))\n"
        "tietool.tie\n"
        "quiet = 'numpy' not in sys.modules\n"
        "import tietool.surgery.plan.resize\n"
        "print(heavy, quiet, 'numpy' in sys.modules, 'paddle' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "True", "True", "False"], r.stdout
