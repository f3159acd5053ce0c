"""Findings as data: every kind is worded by describe(), severity follows the kind, --json carries the
structure beside the words, and Detection.problems_about selects by the tensors a finding is about."""

from __future__ import annotations

import json

from tietool.surgery.findings import _WORDS, Finding, FindingKind, Fix, Severity, describe


def test_every_kind_is_worded():
    assert set(_WORDS) == set(FindingKind)


def test_words_severity_and_json():
    f = Finding(
        FindingKind.VOCAB_SIZE_MISMATCH,
        ("model.embed_tokens.weight",),
        {"config_vocab_size": 20, "embedding_rows": 16},
        Fix("vocab", (16,), "resize"),
    )
    assert (
        describe(f)
        == str(f)
        == (
            "config vocab_size is 20 but the embedding model.embed_tokens.weight has 16 rows "
            "(resize --vocab 16 fixes vocab_size)"
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
        "fix": {"command": "resize", "option": "vocab", "values": [16]},
    }


def test_ambiguous_layout_words_both_ways():
    fix = Fix("layout", ("vocab-hidden", "hidden-vocab"))
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
