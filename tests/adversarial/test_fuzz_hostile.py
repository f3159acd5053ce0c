"""Properties over structure-aware mutants of the surfaces issue 29 attacked (hypothesis, derandomized):

* a flex ``.metadata`` (tensors of 0 to 40 axes, sizes up to 2^62, slices anywhere, flattened or not, in
  ``.distcp`` files of ranks up to 5,000 digits, up to thousands of slices): ``inspect`` and ``merge``
  either succeed or raise ``TietoolError``, each in seconds;
* expert-parallel rank files with an expert id of up to 6,000 digits, or any expert count in config.json:
  ``merge`` succeeds or raises ``TietoolError``;
* a report history of random claims (removals and additions of any id, content and rows) on an output
  that lost a base-vocabulary token: ``verify`` never explains it (exit 7), whatever the report says.

Anything else escaping is a bug (the CLI's exit 70). The inputs are built with the hostile corpus's own
writers (``support.hostile.flexmeta``, ``.experts``, ``.history``); the slow variants draw more examples
(:mod:`support.fuzz_budget`).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fuzz_budget import fast_twin, slow_examples  # noqa: F401 - fast_twin: autouse (TWINS)
from support.hostile import experts, flexmeta, history

import tietool
from tietool.surgery.model.errors import TietoolError

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# fast variant -> its slow twin (same property, same or wider strategy, more examples)
TWINS = {
    n: n + "_slow"
    for n in ("test_metadata_mutants_succeed_or_refuse", "test_no_report_history_explains_a_lost_base_token")
}


SECONDS = 10.0  # issue 29: no run over 10 s on a small input

needs_flex = pytest.mark.skipif(not flexmeta.RANKS2.is_dir(), reason="tests/data/flex not present")
needs_d06 = pytest.mark.skipif(not experts.D06.is_dir(), reason="the d06 case is not present")


# ------------------------------------------------------------------------------------------- .metadata
DIMS = st.one_of(st.integers(0, 8), st.sampled_from([2**31, 2**40, 2**62 - 1]))


@st.composite
def _tensor(draw) -> tuple[tuple[int, ...], list]:
    nd = draw(st.one_of(st.integers(0, 4), st.sampled_from([12, 33, 40])))
    shape = tuple(draw(DIMS) for _ in range(nd))
    n = draw(st.one_of(st.integers(1, 6), st.sampled_from([300, 2000])))
    rank = draw(st.one_of(st.sampled_from(["0", "1"]), st.text("0123456789", min_size=1, max_size=5000)))
    big = n > 6
    slices = []
    for i in range(n):
        if big:  # a layout of many slices: rows, columns, diagonal or nested, drawn once
            off = tuple((i * (k + 1)) % (s or 1) for k, s in enumerate(shape))
            pairs = enumerate(zip(shape, off, strict=True))
            local = tuple(max(0, s - o) if k == 0 else 1 for k, (s, o) in pairs)
        else:
            off = tuple(draw(st.integers(0, max(0, s))) for s in shape)
            local = tuple(draw(st.integers(0, max(0, s - o) + 1)) for s, o in zip(shape, off, strict=True))
        flat = None
        size = 1
        for x in local:
            size *= x
        if not big and size and draw(st.booleans()):
            a = draw(st.integers(0, size))
            flat = (a, draw(st.integers(a, size)))
        slices.append((f"{rank if i == 0 else i % 2}_0.distcp", off, local, flat))
    return shape, slices


METADATA = st.dictionaries(st.sampled_from(["rows.fp32", "a", "b.weight", "c"]), _tensor(), max_size=3)


def _one_metadata(tensors: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = flexmeta._with(tensors)(Path(tmp))
        for run in (lambda: tietool.inspect(ckpt), lambda: tietool.merge(ckpt, Path(tmp) / "out")):
            t0 = time.process_time()
            try:
                run()
            except TietoolError:
                pass
            assert time.process_time() - t0 < SECONDS, tensors.keys()


@needs_flex
def test_metadata_mutants_succeed_or_refuse() -> None:
    @settings(max_examples=12, **SETTINGS)
    @given(METADATA)
    def prop(tensors):
        _one_metadata(tensors)

    prop()


@needs_flex
@pytest.mark.slow
def test_metadata_mutants_succeed_or_refuse_slow() -> None:
    @settings(max_examples=slow_examples(1000), **SETTINGS)
    @given(METADATA)
    def prop(tensors):
        _one_metadata(tensors)

    prop()


# ------------------------------------------------------------------------------------- expert-parallel
IDS = st.one_of(st.integers(0, 70000).map(str), st.text("0123456789", min_size=1, max_size=6000))
COUNTS = st.one_of(st.integers(-3, 70000), st.integers(2**62, 2**70), st.just(True), st.just("4"))


def _one_experts(new_id: str | None, count) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp)
        ckpt = experts._with_id(new_id)(dest) if new_id is not None else experts._with_count(4)(dest)
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["num_experts"] = count
        (ckpt / "config.json").write_text(json.dumps(cfg))
        try:
            tietool.merge(ckpt, dest / "out")
        except TietoolError:
            pass


@needs_d06
def test_expert_ids_and_counts_succeed_or_refuse() -> None:
    @settings(max_examples=30, **SETTINGS)
    @given(st.one_of(st.none(), IDS), COUNTS)
    def prop(new_id, count):
        _one_experts(new_id, count)

    prop()


# ------------------------------------------------------------------------------------- report history
CLAIM_IDS = st.sampled_from([299, 298, 0, 303, 304, -1, 2**70])
CONTENT = st.sampled_from(["@GONE@", "<think>", "x", ""])
ROWS = st.one_of(st.none(), st.sampled_from([0, 298, 299, 300, 304, 320, 2**70]), st.just("299"))


@st.composite
def _entry(draw) -> dict:
    key = draw(st.sampled_from(["resize", "add_tokens", "tokenizer"]))
    listed = draw(st.sampled_from(["tokens_removed", "removed", "tokens"]))
    toks = [{"id": draw(CLAIM_IDS), "content": draw(CONTENT)} for _ in range(draw(st.integers(0, 3)))]
    sec: dict = {listed: toks}
    for k in ("rows_before", "rows_after"):
        v = draw(ROWS)
        if v is not None:
            sec[k] = v
    return {"tool": "tietool 0.1.0", "operation": draw(st.sampled_from(["resize", "add-tokens"])), key: sec}


def _one_history(entries: list[dict], own: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp)
        ckpt = history._forged([])(dest)
        gone = json.loads((dest / "base" / "tokenizer.json").read_text())
        gone = next(k for k, v in gone["model"]["vocab"].items() if v == 299)
        fill = json.dumps(gone)[1:-1]
        rep = {**own, "history": entries}
        (ckpt / "tietool-report.json").write_text(json.dumps(rep).replace("@GONE@", fill))
        res = tietool.verify(dest / "base", ckpt)
        assert res.exit_code != 0, (entries, own, res.unexplained)
        assert any("(id 299)" in u for u in res.unexplained), res.unexplained


@pytest.mark.skipif(not history.SAMPLE.is_dir(), reason="the sample checkpoint is not present")
def test_no_report_history_explains_a_lost_base_token() -> None:
    @settings(max_examples=60, **SETTINGS)
    @given(st.lists(_entry(), max_size=4), _entry())
    def prop(entries, own):
        _one_history(entries, own)

    prop()


@pytest.mark.slow
@pytest.mark.skipif(not history.SAMPLE.is_dir(), reason="the sample checkpoint is not present")
def test_no_report_history_explains_a_lost_base_token_slow() -> None:
    @settings(max_examples=slow_examples(1000), **SETTINGS)
    @given(st.lists(_entry(), max_size=6), _entry())
    def prop(entries, own):
        _one_history(entries, own)

    prop()
