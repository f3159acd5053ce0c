"""Findings as data: every kind is worded by describe(), severity follows the kind, --json carries the
structure beside the words, and Detection.problems_about selects by the tensors a finding is about."""

from __future__ import annotations

import json

import pytest

from tietool.cli.errors import _cli_wording
from tietool.surgery.inspect.findings import _WORDS, Finding, FindingKind, Fix, OneOf, Severity, describe
from tietool.surgery.model import errors
from tietool.surgery.model.errors import Opt, api_wording


@pytest.fixture
def wording(monkeypatch):
    """Set the wording of Opt for one test (restored after it): ``wording(api_wording)``."""
    return lambda w: monkeypatch.setattr(errors, "_wording", w)


def test_every_kind_is_worded():
    assert set(_WORDS) == set(FindingKind)


def test_words_severity_and_json(wording):
    wording(_cli_wording)
    f = Finding(
        FindingKind.VOCAB_SIZE_MISMATCH,
        ("model.embed_tokens.weight",),
        {"config_vocab_size": 20, "embedding_rows": 16},
        Fix(Opt("vocab_size", 16), "resize"),
    )
    assert (
        describe(f)
        == str(f)
        == (
            "config vocab_size is 20 but the embedding model.embed_tokens.weight has 16 rows "
            "(resize --vocab 16 fixes vocab_size; tie and untie refuse until then)"
        )
    )
    assert f.severity is Severity.PROBLEM
    d = json.loads(json.dumps(f.as_dict()))
    assert d == {
        "kind": "config-vocab-size-mismatch",
        "severity": "problem",
        "tensors": ["model.embed_tokens.weight"],
        "config_vocab_size": 20,
        "embedding_rows": 16,
        "fix": {"command": "resize", "option": "vocab_size", "values": [16]},
    }


def test_ambiguous_layout_words_both_ways(wording):
    wording(_cli_wording)
    fix = Fix(Opt("layout", OneOf(("vocab-hidden", "hidden-vocab"))))
    facts = {"size": 8, "as_stored": None, "transposed_equal": None}
    plain = Finding(FindingKind.AMBIGUOUS_LAYOUT, ("lm_head.weight",), facts, fix)
    assert plain.severity is Severity.NOTE
    assert describe(plain) == (
        "vocab_size == hidden_size (8): the head's layout cannot be told from its shape; "
        "pass --layout vocab-hidden or hidden-vocab"
    )
    compared = Finding(
        plain.kind, plain.tensors, {**facts, "as_stored": "exact", "transposed_equal": False}, fix
    )
    assert "(as stored: exact; transposed: different); pass --layout" in describe(compared)
    assert fix.as_dict() == {"command": None, "option": "layout", "values": ["vocab-hidden", "hidden-vocab"]}


def test_python_wording_names_no_flag(wording):
    """The library's own wording (Python API): parameters, not flags."""
    wording(api_wording)
    fix = Fix(Opt("layout", OneOf(("vocab-hidden", "hidden-vocab"))))
    facts = {"size": 8, "as_stored": None, "transposed_equal": None}
    assert describe(Finding(FindingKind.AMBIGUOUS_LAYOUT, ("h",), facts, fix)).endswith(
        "pass layout='vocab-hidden' or 'hidden-vocab'"
    )
    assert str(Fix(Opt("vocab_size", 16), "resize")) == "resize vocab_size=16"
    missing = Finding(FindingKind.EMBEDDING_MISSING, ("e", "h"), {"recorded_as_dropped": False})
    assert "untie or tie keep='head' restores it" in describe(missing)
    assert "--" not in describe(Finding(FindingKind.HEAD_MISSING_NOT_RETIED, ("h",), {"loader": "hf"}))
