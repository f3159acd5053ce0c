"""Bounds of ``merge`` of expert-parallel rank files (:mod:`tietool.surgery.plan.merge_experts`): an expert
id in a tensor name or an expert count in config.json beyond :data:`MAX_EXPERTS` is a one-line refusal
(exit 3) naming the file, never an internal error. Before: an id or a ``num_experts`` of 2^64 raised
``OverflowError`` (``range`` of it), an id of 5,000 digits ``ValueError`` (the int conversion limit): exit 70.

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


def _with_id(tmp: Path, new_id: str) -> Path:
    """d06 with rank 1's expert 3 renamed to expert ``new_id``."""
    d = tmp / "ck"
    shutil.copytree(D06, d)
    a = arrays(d / RANK1)
    for k in [n for n in a if ".experts.3." in n]:
        a[k.replace(".experts.3.", f".experts.{new_id}.")] = a.pop(k)
    write_rank(d / RANK1, a)
    return d


@pytest.mark.skipif(not D06.is_dir(), reason="the d06 case is not present")
@pytest.mark.parametrize(
    "new_id, shown",
    [
        (str(2**64), str(2**64)),
        (str(merge_experts.MAX_EXPERTS), str(merge_experts.MAX_EXPERTS)),
        ("9" * 5000, "(5,000 digits)"),
    ],
    ids=["2^64", "max", "5000-digits"],
)
def test_an_expert_id_beyond_the_limit_is_refused(tmp_path, new_id, shown):
    d = _with_id(tmp_path, new_id)
    out = tmp_path / "out"
    run = run_cli(["merge", d, "--out", out])
    assert_refused(run, 3, [RANK1, shown, f"{merge_experts.MAX_EXPERTS:,} experts"], out=out)


@pytest.mark.skipif(not D06.is_dir(), reason="the d06 case is not present")
@pytest.mark.parametrize("count", [2**64, merge_experts.MAX_EXPERTS + 1])
def test_an_expert_count_beyond_the_limit_is_refused(tmp_path, count):
    d = tmp_path / "ck"
    shutil.copytree(D06, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_experts"] = count
    (d / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    run = run_cli(["merge", d, "--out", out])
    assert_refused(run, 3, ["config.json", f"num_experts / num_local_experts = {count}"], out=out)


@pytest.mark.skipif(not D06.is_dir(), reason="the d06 case is not present")
def test_the_largest_id_under_the_limit_is_a_gap_not_a_crash(tmp_path):
    """An id just under the limit passes the bound and is judged as ids are (a gap: expert 3 missing,
    exit 5 naming it), in no time: no range of it is built beyond the config's count."""
    d = _with_id(tmp_path, str(merge_experts.MAX_EXPERTS - 1))
    out = tmp_path / "out"
    run = run_cli(["merge", d, "--out", out])
    assert_refused(run, 5, ["expert(s) 3", "65535"], out=out)
    assert run.seconds < 10
