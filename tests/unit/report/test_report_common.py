"""The report's common fields (:class:`tietool.Report`) for every writing operation, dry run or not:
``operation``, ``dry_run``, ``changed``, ``input``, ``output``, ``parameters_before/after``,
``bytes_before/after`` and ``backup``, each checked against the checkpoints themselves (before: the input's
tensors as stored; after: the output's, opened again). ``merge``'s JSON has no ``before``/``after`` (its keys
are kept as they were), yet its report answers them: before counts every rank file's tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import paths

import tietool
from tietool.surgery.io import pdparams
from tietool.surgery.io.checkpoint import Checkpoint

TP2 = paths.DATA / "tp_ranks" / "llama_fp32" / "tp2"
UNTIED = paths.CASES_DIR / "pnlp_llama_untied"
TIED = paths.CASES_DIR / "pf_llama_tied_fp32"

RUNS = {
    "tie": (UNTIED, lambda p, o, dry: tietool.tie(p, o, keep="embedding", dry_run=dry)),
    "untie": (TIED, lambda p, o, dry: tietool.untie(p, o, dry_run=dry)),
    "resize": (UNTIED, lambda p, o, dry: tietool.resize(p, 128, o, dry_run=dry)),
    "convert": (UNTIED, lambda p, o, dry: tietool.convert(p, "paddleformers", o, dry_run=dry)),
    "merge": (TP2, lambda p, o, dry: tietool.merge(p, o, dry_run=dry)),
}


def _totals(folder: Path) -> tuple[int, int]:
    """Parameters and bytes of a checkpoint's tensors (a rank folder: every rank file's tensors)."""
    if any(folder.glob("*.tp0*.pdparams")):
        infos = [
            t for f in sorted(folder.glob("*.tp0*.pdparams")) for t in pdparams.read_header(f, f.name)[0]
        ]
        return sum(t.numel for t in infos), sum(t.nbytes for t in infos)
    ck = Checkpoint.open(folder)
    return ck.total_parameters, ck.total_bytes


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize("op", list(RUNS))
def test_common_fields_of_every_operation(tmp_path, op, dry_run):
    src, run = RUNS[op]
    out = tmp_path / "out"
    rep = run(src, out, dry_run)
    assert isinstance(rep, tietool.Report)
    assert rep.operation == op and rep.dry_run is dry_run and rep.changed is True
    assert Path(rep.input).resolve() == src.resolve() and Path(rep.output) == out
    assert (rep.parameters_before, rep.bytes_before) == _totals(src)
    assert rep.backup is None
    if dry_run:
        assert not out.exists()
        return
    assert (rep.parameters_after, rep.bytes_after) == _totals(out)
    if op == "merge":  # a replicated tensor is counted once per rank before, once after
        assert rep.parameters_after < rep.parameters_before


def test_merge_dry_run_parameters_before_is_the_issue_case(tmp_path):
    """``tietool.merge(..., dry_run=True).parameters_before`` raised KeyError (issue 19)."""
    rep = tietool.merge(TP2, tmp_path / "m", dry_run=True)
    assert rep.parameters_before == _totals(TP2)[0]
    full = tietool.merge(TP2, tmp_path / "m")
    assert rep.parameters_after == full.parameters_after == _totals(tmp_path / "m")[0]
    # every write's report has the common fields, merge's included (its own keys kept beside them)
    assert (
        full["before"]["parameters"] == rep.parameters_before
        and full["after"]["parameters"] == rep.parameters_after
    )
