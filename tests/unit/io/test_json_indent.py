"""``dumps_indented`` (surgery/io/json_indent.py) writes exactly what ``json.dumps(indent=n,
ensure_ascii=False)`` writes: on every JSON file of the test tokenizers, on values of every JSON type and
the shapes its fast paths take (lists of strings, pairs of strings, ``{str: int}``), on what they must
not take (a string of two characters among pairs, ``bool`` among ints, tuples, non-``str`` keys, ``int`` and
``str`` subclasses), and on random nested values."""

from __future__ import annotations

import enum
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.paths import DATA

from tietool.surgery.io.json_indent import dumps_indented

FILES = sorted((DATA / "tokenizers").glob("*/*.json"))


class _Kind(enum.IntEnum):
    ONE = 1


class _Text(str):
    pass


class _Name(str, enum.Enum):
    A = "a"


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("indent", [2, 4])
def test_tokenizer_files(path, indent):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert dumps_indented(data, indent) == json.dumps(data, indent=indent, ensure_ascii=False)


EDGES = [
    {},
    [],
    [[[]]],
    {"a": {}, "b": []},
    1,
    "s",
    None,
    1e300,
    -0.0,
    float("nan"),
    [float("inf"), -float("inf"), 0.1],
    {"a": [1, 2.5, None, True, False, 'x\u2028"\\é\U0001f600\x00']},
    ["a", "b", "c"],
    ["a", 1],
    [["a", "b"], ["c", "d"]],
    [["a", "b"], ["c", 1]],
    [["a", "b"], "cd"],
    [["a", "b"], ["c", "d", "e"]],
    [["a", "b"], ("c", "d")],
    [["a", "b"], [[], "c"]],
    ("a", "b"),
    {"k": (1, 2)},
    {"t": True, "i": 1, "f": False, "n": None, "s": "x", "l": [True, 0]},
    {1: 2},
    {None: 1, True: 2, 1.5: 3},
    {"e": _Kind.ONE},
    [_Kind.ONE],
    [_Text("a"), "b"],
    {_Text("k"): _Text("v")},
    {"e": _Name.A, _Name.A: [_Name.A, 1.5]},
    {_Kind.ONE: 1},
    [1.0, _Kind.ONE, True],
]


@pytest.mark.parametrize("value", EDGES, ids=range(len(EDGES)))
@pytest.mark.parametrize("indent", [0, 1, 2, 4])
def test_edges(value, indent):
    assert dumps_indented(value, indent) == json.dumps(value, indent=indent, ensure_ascii=False)


def test_refusals_are_json_dumps_refusals():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_indented(loop, 2)
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps_indented({"a": {1, 2}}, 2)


scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=5), inner, max_size=5)
        | st.lists(st.lists(st.text(max_size=3), min_size=2, max_size=2), min_size=1, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(values, st.integers(0, 4))
def test_random_values(value, indent):
    assert dumps_indented(value, indent) == json.dumps(value, indent=indent, ensure_ascii=False)
