"""The benchmark cases cannot rot: ``bench/harness.py`` runs every case of ``bench/cases.py`` once on its
tiny inputs (``--size tiny``: the benchmark Llama at vocab 1280 / hidden 64, the shipped Trainer and
tokenizer samples, the ``.pdparams`` of ``tests/data``), with no warm-up round, and every run must exit as
its case expects and pass the case's check of its output. The cases that need what a test machine may lack
(PaddleFormers, an S3 server, the network) are only built (their command line made), not run.

Budgets are not checked here (tiny inputs say nothing about them): ``bench/RESULTS.md`` has the figures.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from support import paths

BENCH = paths.REPO / "bench"
HEAVY = {"paddle", "moto", "network"}

sys.path.insert(0, str(BENCH))  # bench/cases.py imports bench/harness.py by name, as when run as a script
import harness  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_cases", BENCH / "cases.py")
assert _spec is not None and _spec.loader is not None
cases = importlib.util.module_from_spec(_spec)  # not ``import cases``: tests/cases is a test folder
_spec.loader.exec_module(cases)


def _light() -> list[str]:
    return [c.name for c in cases.CASES if not HEAVY & set(c.needs)]


def test_case_names_are_unique_and_their_baselines_exist():
    names = [c.name for c in cases.CASES]
    assert len(names) == len(set(names))
    assert {c.baseline for c in cases.CASES if c.baseline} <= set(names)
    assert all(c.input in cases.INPUTS and set(c.extra) <= set(cases.INPUTS) for c in cases.CASES)
    assert all((c.command is None) != (c.call is None) for c in cases.CASES)


def test_list_names_every_case():
    argv = [sys.executable, str(BENCH / "harness.py"), "--list", "--size", "tiny"]
    r = subprocess.run(argv, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0] for line in r.stdout.splitlines() if line and not line.startswith(" ")}
    assert listed == {c.name for c in cases.CASES}


def test_heavy_cases_build_their_command(tmp_path):
    ctx = harness.Ctx(
        cases.SAMPLES / "pf_llama_tied_fp32", tmp_path / "out", sys.executable, tmp_path, "tiny"
    )
    heavy = [c for c in cases.CASES if HEAVY & set(c.needs)]
    assert heavy
    for c in heavy:
        argv = c.command(ctx)
        assert argv and all(isinstance(a, str) for a in argv), c.name


def test_every_case_runs_once_on_tiny_inputs(tmp_path):
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(BENCH / "harness.py"), "--size", "tiny", "--rounds", "1", "--warmup", "0"]
    for name in _light():
        argv += ["--case", name]
    r = subprocess.run([*argv, "--json", str(out)], capture_output=True, text=True, timeout=900)
    doc = json.loads(out.read_text())
    failed = {k: c["runs"][0].get("problem") for k, c in doc["cases"].items() if c["failed"]}
    assert failed == {}, r.stdout[-3000:]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ran = set(doc["cases"]) | set(doc["skipped"])
    assert ran == set(_light())
    # tokenizers/transformers are needed only to build the large tokenizer inputs, never at tiny
    assert doc["skipped"] == {}
    assert all(len(c["runs"]) == 1 and c["wall_s"] is not None for c in doc["cases"].values())
