"""Bounds of ``merge`` of expert-parallel rank files (:mod:`tietool.surgery.plan.merge_experts`): an expert
id of thousands of digits in a tensor name is refused where it is parsed (exit 3, naming the rank file and
:data:`ID_DIGITS`); an id or a ``num_experts`` of 2^64 is compared with the other, never expanded (exit 5,
naming both). Before: a 2^64 id or count raised ``OverflowError`` (a ``range`` of it) and a 5,000-digit id
``ValueError`` (Python's int conversion limit): exit 70.

The inputs are the d06 case's two rank files (a Qwen3-MoE of 4 experts, expert parallelism 2), one tensor
renamed or the config edited (written as ``paddle.save`` writes them: ``test_merge_experts.write_rank``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.adversarial_support import assert_refused, run_cli
from test_merge_experts import D06, arrays, write_rank

from tietool.surgery.plan import merge_experts

RANK1 = "model_state.moe_sharding01.pdparams"
needs_d06 = pytest.mark.skipif(not D06.is_dir(), reason="the d06 case is not present")


def _with_id(tmp: Path, new_id: str) -> Path:
    """d06 with rank 1's expert 3 renamed to expert ``new_id``."""
    d = tmp / "ck"
    shutil.copytree(D06, d)
    a = arrays(d / RANK1)
    for k in [n for n in a if ".experts.3." in n]:
        a[k.replace(".experts.3.", f".experts.{new_id}.")] = a.pop(k)
    write_rank(d / RANK1, a)
    return d


@needs_d06
@pytest.mark.parametrize("digits", [merge_experts.ID_DIGITS + 1, 5000])
def test_an_expert_id_of_thousands_of_digits_is_refused_where_it_is_parsed(tmp_path, digits):
    d = _with_id(tmp_path, "9" * digits)
    out = tmp_path / "out"
    run = run_cli(["merge", d, "--out", out])
    assert_refused(
        run, 3, [RANK1, f"{digits:,} digits", f"the {merge_experts.ID_DIGITS} tietool reads"], out=out
    )


@needs_d06
@pytest.mark.parametrize("new_id", [str(2**64), "9" * merge_experts.ID_DIGITS])
def test_a_huge_expert_id_is_compared_with_the_count(tmp_path, new_id):
    """An id of 2^64 (or of ID_DIGITS digits) is read and found beyond the count: exit 5 naming it, in no
    time (no range of it is built)."""
    d = _with_id(tmp_path, new_id)
    out = tmp_path / "out"
    run = run_cli(["merge", d, "--out", out])
    assert_refused(run, 5, [f"expert id {new_id} is beyond the count (ids run 0..3)"], out=out)
    assert run.seconds < 10


@needs_d06
@pytest.mark.parametrize("count", [2**64, 2**70 + 3])
def test_an_expert_count_beyond_2_63_is_refused(tmp_path, count):
    """num_experts of 2^64 and more: refused in one line naming the count and how many experts no file
    holds, never expanded (exit 5)."""
    d = tmp_path / "ck"
    shutil.copytree(D06, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_experts"] = count
    (d / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    run = run_cli(["merge", d, "--out", out])
    assert_refused(run, 5, [f"= {count}", f"{count - 4} of ids 0..{count - 1}"], out=out)
    assert run.seconds < 10
