"""Bounds of a flex checkpoint's ``.metadata`` (:mod:`tietool.surgery.io.flex`, :mod:`~.flex_cover`): every
count, id and axis from the file is bounded by an explicit limit named in a one-line refusal (exit 3), and
coverage costs about ``n log n`` whatever the slices' layout, in bounded memory.

Each case is the real ``tests/data/flex/ranks2`` save with one tensor added to its ``.metadata`` (written by
:func:`support.flex_support.write_metadata`, tietool's writer proven against paddle): a ``.distcp`` rank
number of 5,000 digits (an ``int`` conversion past Python's limit: exit 70 before), a flattened slice of a
3,000-axis tensor (``RecursionError``), 3,000 slices laid out so that the old sweep compared every pair
(a hang), 4,002 disjoint slices open together on both axes (the grid proves them disjoint), a 12-axis grid
that is almost all gap (3.1 GB before), and more tensors or records than tietool reads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support import adversarial_support as av
from support import flex_support as fx

from tietool.surgery.io import flex, flex_cover
from tietool.surgery.model.errors import CheckpointError

needs_data = pytest.mark.skipif(not (fx.DATA / "ranks2").is_dir(), reason="tests/data/flex not present")
T, S = flex.FlexTensor, flex.FlexSlice
MAX_RSS = 1024**3


def _case(tmp_path: Path, add: dict[str, flex.FlexTensor], edit=None) -> Path:
    """ranks2 with the tensors ``add`` in its ``.metadata`` (``edit`` may change the read tensors first)."""
    d = fx.copy_folder("ranks2", tmp_path / "ck")
    ts = fx.read(d)
    if edit is not None:
        edit(ts)
    ts.update(add)
    fx.write_metadata(d / "0.metadata", ts)
    return d


def _refused(tmp_path: Path, ck: Path, names: list[str], commands=("inspect", "merge")) -> None:
    for cmd in commands:
        out = tmp_path / f"out-{cmd}"
        argv = ["inspect", ck] if cmd == "inspect" else ["merge", ck, "--out", out]
        run = av.run_cli(argv)
        av.assert_refused(run, 3, ["0.metadata", *names], out=out)
        assert run.maxrss < MAX_RSS, run.describe()


def _long_rank(ts: dict[str, flex.FlexTensor]) -> None:
    t = ts["rows.fp32"]
    far = dataclasses.replace(t.slices[1], file="1" * 5000 + "_0.distcp")
    ts["rows.fp32"] = dataclasses.replace(t, slices=(t.slices[0], far))


@needs_data
def test_a_rank_number_of_5000_digits_is_refused(tmp_path):
    """A ``<rank>_<id>.distcp`` name whose rank has 5,000 digits: exit 3 naming the limit (was exit 70:
    ``int()`` past Python's 4,300-digit conversion limit); the name is never converted."""
    ck = _case(tmp_path, {}, _long_rank)
    _refused(tmp_path, ck, ["rows.fp32", f"{flex.MAX_RANK:,} ranks", "5,000 digits"])
    assert flex._rank_of("1" * 5000 + "_0.distcp") == -1 and flex._rank_of("3_0.distcp") == 3


@needs_data
def test_a_3000_axis_flattened_slice_is_refused(tmp_path):
    """A flattened slice of a 3,000-axis tensor (its boxes are found axis by axis: RecursionError, exit 70
    before): exit 3 naming the axes and the limit."""
    n, shape = 3000, (2,) * 3000
    deep = T("deep", shape, "float32", (S("0_0.distcp", "deep", (0,) * n, shape, (1, 3)),))
    ck = _case(tmp_path, {"deep": deep})
    _refused(tmp_path, ck, ["deep", "3,000 axes", f"the {flex.MAX_AXES}"])


@needs_data
def test_slices_open_together_on_the_sweep_axis_cost_n_not_n_squared(tmp_path):
    """3,000 slices ``(i, i)`` of ``(n - i, 1)``: all open together along rows (the old sweep compared
    4.5 M pairs), disjoint along columns, where the sweep now runs; the gap is found and named at once
    (exit 3, the first missing element ``[0, 1]`` and the count ``n(n-1)/2``)."""
    n = 3000
    q = T("q", (n, n), "float32", tuple(S("0_0.distcp", "q", (i, i), (n - i, 1)) for i in range(n)))
    pieces = [p for s in q.slices for p in flex_cover.pieces(s)]
    assert flex_cover._open_pairs(pieces, 0) > flex_cover.MAX_COMPARISONS
    assert flex_cover.sweep_axis(pieces) == (1, 0)
    ck = _case(tmp_path, {"q": q})
    run = av.run_cli(["inspect", ck])
    av.assert_refused(run, 3, ["0.metadata", "'q'", "element [0, 1]", f"{n * (n - 1) // 2:,} of its"])
    assert run.seconds < 10 and run.maxrss < MAX_RSS, run.describe()


def _cross(n: int, extra: tuple[flex.FlexSlice, ...] = ()) -> flex.FlexTensor:
    """``2n × 2n``: n tall columns fill the top-left square, n wide rows the bottom-right, two blocks the
    rest: disjoint, every element held once, and open together along both axes."""
    sl = [S("0_0.distcp", "c", (0, i), (n, 1)) for i in range(n)]
    sl += [S("0_0.distcp", "c", (n + i, n), (1, n)) for i in range(n)]
    sl += [S("0_0.distcp", "c", (0, n), (n, n)), S("0_0.distcp", "c", (n, 0), (n, n))]
    return T("c", (2 * n, 2 * n), "float32", (*sl, *extra))


def test_disjoint_slices_open_together_on_every_axis_are_checked_on_the_grid():
    """When every axis would make the sweep compare more than MAX_COMPARISONS pairs, the grid of the slices'
    boundaries proves them disjoint (covered, no overlap: what the sweep would have found); with one
    slice that does overlap, the refusal names the limit."""
    t = _cross(2100)
    pieces = [p for s in t.slices for p in flex_cover.pieces(s)]
    assert flex_cover.sweep_axis(pieces)[1] > flex_cover.MAX_COMPARISONS
    cov = flex_cover.coverage(t, Path("0.metadata"))
    assert (cov.missing, cov.shared, cov.held) == (0, (), t.numel)
    bad = _cross(2100, (S("0_0.distcp", "c", (5, 5), (1, 1)),))
    with pytest.raises(CheckpointError) as e:
        flex_cover.coverage(bad, Path("0.metadata"))
    assert "overlap on every axis" in e.value.message and f"{flex_cover.MAX_COMPARISONS:,}" in e.value.message


def test_the_grid_fallback_agrees_with_the_sweep_on_small_layouts():
    """The grid's verdict (:func:`_disjoint`) is the sweep's on layouts small enough for both: disjoint
    shards, a one-element overlap, a replica-free mesh."""
    layouts = {
        "rows": ([((0, 0), (2, 4)), ((2, 0), (4, 4))], True),
        "touch": ([((0, 0), (2, 4)), ((1, 3), (4, 4))], False),
        "mesh": ([((i, j), (i + 2, j + 2)) for i in (0, 2) for j in (0, 2)], True),
        "inside": ([((0, 0), (4, 4)), ((1, 1), (2, 2))], False),
    }
    for name, (boxes, disjoint) in layouts.items():
        pieces = [flex_cover.Piece(S("0_0.distcp", "x", b[0], b[1]), b, 0) for b in boxes]
        assert flex_cover._disjoint((4, 4), boxes) is disjoint, name
        assert (not list(flex_cover.overlaps(pieces))) is disjoint, name


@needs_data
def test_a_12_axis_grid_of_holes_stays_in_bounded_memory(tmp_path):
    """37 one-element slices cut each of 12 axes of ``4^12`` at 1, 2, 3 (a grid of 16.7 M cells, nearly
    all holes: np.argwhere took 3.1 GB before): exit 3 naming the gap, its count exact, under 1 GiB."""
    k = 12
    sl = []
    for ax in range(k):
        for c in (1, 2, 3):
            off = [0] * k
            off[ax] = c
            sl.append(S("0_0.distcp", "g", tuple(off), (1,) * k))
    sl.append(S("0_0.distcp", "g", (3,) * k, (1,) * k))
    ck = _case(tmp_path, {"g": T("g", (4,) * k, "float32", tuple(sl))})
    run = av.run_cli(["inspect", ck])
    av.assert_refused(run, 3, ["0.metadata", "'g'", f"{4**k - len(sl):,} of its {4**k:,}"])
    assert run.maxrss < MAX_RSS, run.describe()


@needs_data
def test_more_tensors_than_tietool_reads_is_refused(tmp_path, monkeypatch):
    """A ``.metadata`` with more tensors than MAX_TENSORS is refused naming both numbers (the limit lowered
    here to 4 so the test is quick; the CLI case with 200,000 tensors is the slow test below)."""
    monkeypatch.setattr(flex, "MAX_TENSORS", 4)
    with pytest.raises(CheckpointError) as e:
        fx.read(fx.DATA / "ranks2")
    assert "more than the 4 tensors tietool reads" in e.value.message


@needs_data
def test_the_walk_stops_at_the_record_beyond_the_limit(tmp_path, monkeypatch):
    """The walk counts records as it makes them and stops at the first beyond ``Limits.records`` (a file of
    millions of slices is not read to the end), naming the limit and why."""
    rules = dataclasses.replace(
        flex.METADATA, limits=dataclasses.replace(flex.METADATA.limits, records=3, records_why="a test")
    )
    monkeypatch.setattr(flex, "METADATA", rules)
    with pytest.raises(CheckpointError) as e:
        fx.read(fx.DATA / "ranks2")
    assert "more than 3 records: a test" in e.value.message


@needs_data
@pytest.mark.slow
def test_200000_tensors_are_refused_by_the_cli(tmp_path):
    """200,000 one-slice tensors (22 MB): the walk stops at the record beyond 2 x MAX_SLICES + 1 (exit 3
    naming the limit; 11 s of CPU before, reading it all), under 1 GiB."""
    add = {
        f"t{i}": T(f"t{i}", (4,), "float32", (S("0_0.distcp", f"t{i}", (0,), (4,)),)) for i in range(200_000)
    }
    ck = _case(tmp_path, add)
    run = av.run_cli(["inspect", ck], timeout=120)
    av.assert_refused(
        run, 3, ["0.metadata", f"{2 * flex.MAX_SLICES + 1:,} records", f"{flex.MAX_SLICES:,} slices"]
    )
    assert run.maxrss < MAX_RSS, run.describe()
