"""``verify --logits`` on every causal-LM family PaddleFormers 1.2 ships (issue 17, item 6).

The checkpoints are written in this run by PaddleFormers itself (:mod:`support.family_builder`'s eight
families and :mod:`support.logits_families`' others: Qwen2-MoE, Qwen3-MoE, Qwen3-Next, ERNIE 4.5 MoE,
GLM-4-MoE, GLM-OCR, Qwen2.5-VL, Qwen3-VL, GLM-4.5V), tied and untied, safetensors and ``.pdparams``. Then:

* ``verify --logits INPUT (untie INPUT)`` compares the logits (``logits.compared``, the class PaddleFormers'
  tables give, ``max_abs_diff`` 0) and exits 0, for every family and container PaddleFormers 1.2 can load
  and run on CPU (Gemma3's safetensors, whose loader always ties and where untie is refused: ``tie`` of its
  untied checkpoint whose head equals the embedding);
* ``verify --logits INPUT COPY`` where the copy's head (the embedding, where the loader reads the head from
  it) has noise added exits 7, and the logits were compared and differ (> 1e-5);
* what PaddleFormers 1.2 cannot load or run on CPU exits 8 (``ExitCode.NOT_COMPARED``) with one line naming
  the cause: ERNIE 4.5 MoE (a GPU-only kernel), the safetensors that PaddleFormers 1.2 writes for Qwen2.5-VL
  and GLM-4.5V (its own loader refuses them), a config naming no PaddleFormers class; an output that does
  not load while its input does (a head equal to the embedding dropped from an untied Llama: the tensors
  alone call that explained) exits 7.

Not slow: a PaddleNLP checkpoint and a missing paddle exit 8 before any subprocess; the verdict's order.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support import family_builder as fb
from support import fixture_support as fs
from support import logits_families as lf
from support.paths import CASES_DIR, REPO

from tietool.surgery import arch
from tietool.surgery.inspect.detect import detect
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.model.errors import ExitCode
from tietool.surgery.verify import VerifyResult, logits_check, logits_pool

# PaddleFormers 1.2 on CPU cannot run these (see support/logits_families.py): family -> containers
NOT_RUNNABLE = {
    "ernie4_5_moe": {"safetensors": "expand_modality_expert_id", "pdparams": "expand_modality_expert_id"},
    "qwen2_5_vl": {"safetensors": "should be assigned before"},
    "glm4v_moe": {"safetensors": "should be assigned before"},
}
FAMILIES = sorted(lf.FAMILIES)
FORMATS = ("safetensors", "pdparams")


def _untie_refused(family: str, fmt: str) -> bool:
    """untie is refused where the loader always ties (the architecture table; test_families proves it)."""
    return fmt == "safetensors" and arch.lookup(family, "paddleformers", fmt).refuses_untie


def _layout_written(untied: Path) -> list[str]:
    """``["--layout", L]``: the head layout PaddleFormers itself wrote in the untied sibling ``untied``
    (its shape against the embedding's [vocab, hidden]; these families' vocab != hidden), for an untie
    whose loader facts are unproven (tietool then refuses to guess the layout of the head it writes)."""
    ts = Checkpoint.open(untied).tensors
    emb = next(t.shape for n, t in ts.items() if n.endswith("embed_tokens.weight") and ".layers." not in n)
    assert emb[0] != emb[1], emb
    return ["--layout", "vocab-hidden" if ts["lm_head.weight"].shape == emb else "hidden-vocab"]


# The families fall into BUILDS independent builds (a Runs each, made when its first test runs): under
# pytest-xdist each build is a group of its own (xdist_build, tests/conftest.py), so the two workers build and
# verify two at once. Each build costs one builder process more (paddle's import); the verify runs are one
# subprocess each whatever the grouping.
BUILDS = 4


def _build_of(family: str) -> int:
    return FAMILIES.index(family) % BUILDS


def xdist_build(item) -> str | None:
    """The build a test shares (tests/conftest.py: its xdist group): its family's :func:`_build_of` (the
    llama one for the tests of llama's checkpoints without a family parameter), None without ``runs``."""
    if "runs" not in item.fixturenames:
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    return f"build{_build_of(params.get('family', 'llama'))}"


def _variants(families: list[str]) -> list[fb.Variant]:
    out = [fb.Variant(f, t, fmt, False) for f in families for t in ("tied", "untied") for fmt in FORMATS]
    out += [
        fb.Variant(f, "untied-equal", fmt, False)
        for f in families
        for fmt in FORMATS
        if _untie_refused(f, fmt)
    ]
    return out + ([fb.Variant("llama", "untied-equal", "safetensors", False)] if "llama" in families else [])


def _corrupt_head(src: Path, dst: Path) -> str:
    """A copy of ``src`` (safetensors) whose head has noise added, its bytes rewritten in place (F32 or
    BF16): the head tensor in the files, or the embedding where the loader reads the head from it (tied, or
    a loader that always ties). Returns the tensor's name."""
    fs.copy_checkpoint(src, dst)
    det = detect(Checkpoint.open(dst), compare_values=False)
    name = (
        det.head.name
        if det.head.present and not det.tie.tied and not det.family.always_tied
        else det.embedding.name
    )
    for f in sorted(dst.glob("*.safetensors")):
        raw = bytearray(f.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        entry = json.loads(raw[8 : 8 + n]).get(name)
        if entry is None:
            continue
        start, end = (8 + n + o for o in entry["data_offsets"])
        if entry["dtype"] == "BF16":
            x = (np.frombuffer(raw[start:end], np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            assert entry["dtype"] == "F32", entry
            x = np.frombuffer(raw[start:end], np.float32)
        y = (x + np.random.default_rng(0).normal(0, 0.5, x.shape)).astype(np.float32)
        raw[start:end] = (
            (y.view(np.uint32) >> 16).astype(np.uint16).tobytes() if entry["dtype"] == "BF16" else y.tobytes()
        )
        f.write_bytes(bytes(raw))
        return name
    raise AssertionError(f"{name} is in no safetensors file of {dst}")


def _drop_head(src: Path, dst: Path) -> None:
    """A copy of an untied safetensors ``src`` without ``lm_head.weight`` (files and index), flag kept."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    fs.copy_checkpoint(src, dst)
    for f in sorted(dst.glob("*.safetensors")):
        with safe_open(str(f), "np") as h:
            meta, tensors = h.metadata(), {k: h.get_tensor(k) for k in h.keys() if k != "lm_head.weight"}
        save_file(tensors, str(f), metadata=meta)
    for idx in dst.glob("*.index.json"):
        doc = json.loads(idx.read_text())
        doc["weight_map"].pop("lm_head.weight", None)
        idx.write_text(json.dumps(doc, indent=2))


def _verify(a: Path, b: Path) -> dict:
    r = fs.run_tool(["verify", str(a), str(b), "--logits", "--json"], timeout=900)
    doc = json.loads(r.stdout)
    doc["_rc"], doc["_stderr"] = r.returncode, r.stderr
    return doc


class Runs:
    """Every checkpoint of a build built (one builder subprocess), every tool run and ``verify --logits``
    (in process, one after the other, in the PaddleFormers process :func:`all_runs` keeps alive), once per
    session."""

    def __init__(self, root: Path, families: list[str]):
        t0 = time.monotonic()
        self.built, self.build_seconds = lf.build_all(_variants(families), root / "built")
        work = root / "work"
        work.mkdir()
        jobs: dict[str, tuple[Path, Path]] = {}
        self.corrupted: dict[str, str] = {}  # family -> the tensor given noise
        for fam in families:
            for fmt in FORMATS:
                if _untie_refused(fam, fmt):
                    jobs[f"{fam}-{fmt}-op"] = self._op("tie", self._path(fam, "untied-equal", fmt), work)
                else:
                    trusted = arch.lookup(fam, "paddleformers", fmt).trusted
                    extra = [] if trusted else _layout_written(self._path(fam, "untied", fmt))
                    jobs[f"{fam}-{fmt}-op"] = self._op("untie", self._path(fam, "tied", fmt), work, extra)
            src = self._path(fam, "untied", "safetensors")
            jobs[f"{fam}-corrupt"] = (src, work / f"{fam}-corrupt")
            self.corrupted[fam] = _corrupt_head(src, work / f"{fam}-corrupt")
        if "llama" in families:
            self._llama_jobs(work, jobs)
        t1 = time.monotonic()
        # one after the other in this thread: in process (a thread would fall back to a `python -m tietool`
        # subprocess, support.cli_runner), so inside all_runs' logits_pool.reuse_processes
        self.jobs = jobs
        self.docs = {k: _verify(*ab) for k, ab in jobs.items()}
        self.verify_seconds = time.monotonic() - t1
        self.seconds = time.monotonic() - t0

    def _llama_jobs(self, work: Path, jobs: dict[str, tuple[Path, Path]]) -> None:
        """The head dropped from an untied Llama whose head equals the embedding, and a Llama whose config
        names no PaddleFormers class."""
        src = self._path("llama", "untied-equal", "safetensors")
        _drop_head(src, work / "llama-no-head")
        jobs["llama-no-head"] = (src, work / "llama-no-head")
        src = self._path("llama", "tied", "safetensors")
        fs.copy_checkpoint(src, work / "unknown-in")
        cfg = json.loads((work / "unknown-in" / "config.json").read_text())
        cfg.update(model_type="qwen2_5_omni", architectures=["Qwen2_5OmniForConditionalGeneration"])
        (work / "unknown-in" / "config.json").write_text(json.dumps(cfg))
        shutil.copytree(work / "unknown-in", work / "unknown-out")
        jobs["no-class"] = (work / "unknown-in", work / "unknown-out")

    def _path(self, fam: str, tie: str, fmt: str) -> Path:
        b = self.built[fb.Variant(fam, tie, fmt, False)]
        assert b.ok, f"PaddleFormers 1.2 could not build/save {b.variant.name}: {b.error}"
        assert b.path is not None
        return b.path

    @staticmethod
    def _op(op: str, src: Path, work: Path, extra: list[str] | None = None) -> tuple[Path, Path]:
        out = work / f"{src.name}-{op}"
        r = fs.run_tool([op, str(src), "--out", str(out), *(extra or [])])
        assert r.returncode == 0, f"tietool {op} {src.name}: exit {r.returncode}\n{r.stderr}"
        return src, out


@pytest.fixture(scope="module")
def all_runs(tmp_path_factory):
    """The :class:`Runs` of each build (:data:`BUILDS`), made on first use, for the module; their
    ``verify --logits`` runs share one PaddleFormers process (:func:`surgery.verify.logits_pool
    .reuse_processes`: a verdict of failure still comes from a fresh process;
    ``tests/unit/verify/test_logits_pool.py`` proves the rule, test_the_fresh_and_reused_verdicts_agree the
    logits)."""
    if importlib.util.find_spec("paddleformers") is None:
        pytest.skip("paddleformers is not importable in this interpreter (install the [test] extra)")
    made: dict[int, Runs | BaseException] = {}

    def of(b: int) -> Runs:
        if b not in made:  # a build that failed fails every test of it, once
            try:
                families = [f for f in FAMILIES if _build_of(f) == b]
                made[b] = Runs(tmp_path_factory.mktemp(f"verify-logits{b}"), families)
            except Exception as e:  # noqa: BLE001 - raised again for each test of the build
                made[b] = e
        r = made[b]
        if isinstance(r, BaseException):
            raise r
        return r

    with logits_pool.reuse_processes() as procs:
        yield of
    for r in made.values():
        if isinstance(r, Runs):
            print(
                f"\n[test_verify_logits] {len(r.built)} checkpoints built in {r.build_seconds:.1f}s; "
                f"{len(r.docs)} verify --logits in {r.verify_seconds:.1f}s; {r.seconds:.1f}s in all"
            )
    print(f"[test_verify_logits] {procs.started} PaddleFormers processes started by the verify runs")


@pytest.fixture
def runs(request, all_runs) -> Runs:
    """The :class:`Runs` of the build of this test's family (llama's for the tests without one)."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    return all_runs(_build_of(params.get("family", "llama")))


def _one_line(doc: dict) -> str:
    lines = doc["_stderr"].strip().splitlines()
    assert len(lines) == 1, doc["_stderr"]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_verify_logits_of_tie_untie_compares_and_exits_0(runs, family, fmt):
    doc = runs.docs[f"{family}-{fmt}-op"]
    lg = doc["logits"]
    if fmt in NOT_RUNNABLE.get(family, {}):
        assert doc["_rc"] == doc["exit_code"] == ExitCode.NOT_COMPARED, doc
        assert lg["cause"] == "input_failed" and NOT_RUNNABLE[family][fmt] in lg["error"], lg
        line = _one_line(doc)
        assert (
            line.startswith("tietool: verify: logits not compared: ")
            and "where PaddleFormers can load and run the input" in line
        )
        return
    assert doc["_rc"] == doc["exit_code"] == 0, doc
    assert lg["compared"] is True and lg["ok"] is True and lg["max_abs_diff"] == 0.0, lg
    assert doc["logits_compared"] is True and lg["model_class"], lg
    if family in ("qwen2_5_vl", "qwen3_vl", "glm4v_moe"):  # their class is named in text_config only
        assert lg["class_from"] == "text_config.architectures", lg


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_verify_logits_of_a_corrupted_head_exits_7(runs, family):
    doc = runs.docs[f"{family}-corrupt"]
    assert doc["_rc"] == doc["exit_code"] == ExitCode.UNEXPLAINED, doc
    assert any(u.startswith(f"{runs.corrupted[family]} changed") for u in doc["unexplained"]), doc
    lg = doc["logits"]
    if "safetensors" in NOT_RUNNABLE.get(family, {}):  # 7 wins over 8; the logits line still says why
        assert lg["compared"] is False and lg["cause"] == "input_failed", lg
        return
    assert lg["compared"] is True and lg["ok"] is False and lg["max_abs_diff"] > 1e-5, lg
    assert any(u.startswith("logits differ") for u in doc["unexplained"]), doc


@pytest.mark.slow
def test_verify_logits_of_an_output_that_does_not_load_exits_7(runs):
    doc = runs.docs["llama-no-head"]
    # made by hand (no tietool-report.json): the missing report is named as well, and nothing else
    missing = [u for u in doc["unexplained"] if "has no tietool-report.json" in u]
    assert len(missing) == 1, doc
    assert not [u for u in doc["unexplained"] if "does not load" not in u and u not in missing], doc
    assert any("does not load" in u for u in doc["unexplained"]), doc
    assert doc["_rc"] == doc["exit_code"] == ExitCode.UNEXPLAINED, doc
    assert "lm_head.weight should be assigned before" in doc["logits"]["output_error"], doc


@pytest.mark.slow
def test_verify_logits_without_a_paddleformers_class_exits_8(runs):
    doc = runs.docs["no-class"]
    assert doc["_rc"] == doc["exit_code"] == ExitCode.NOT_COMPARED and doc["unexplained"] == [], doc
    assert doc["logits"]["cause"] == "no_class" and doc["logits"]["model_class"] is None, doc
    line = _one_line(doc)
    assert "PaddleFormers has no language-model class for architectures" in line, line
    assert "qwen2_5_omni" in line and "with the library that wrote the checkpoint" in line, line


@pytest.mark.slow
def test_the_fresh_and_reused_verdicts_agree(runs):
    """The verify runs of :class:`Runs` share a PaddleFormers process (:func:`all_runs`); run again in a
    fresh ``python -m tietool`` (its own PaddleFormers subprocess, nothing reused), Llama's untie, corrupted
    head and dropped head give the same verdict, the logits difference bit for bit."""
    from support import cli_runner

    for key in ("llama-safetensors-op", "llama-corrupt", "llama-no-head"):
        a, b = runs.jobs[key]
        r = cli_runner.spawn(["verify", a, b, "--logits", "--json"], timeout=900)
        fresh, reused = json.loads(r.stdout), runs.docs[key]
        assert r.rc == reused["_rc"] and fresh["unexplained"] == reused["unexplained"], (fresh, reused)
        assert fresh["logits"] == reused["logits"], (fresh["logits"], reused["logits"])


_RESOLVE = """
import json, sys
from tietool.surgery import logits_worker
fleetless = logits_worker._stub_fleet()
print(json.dumps([logits_worker.resolve_class(c, fleetless)[1:] for c in json.load(sys.stdin)]))
"""


@pytest.mark.slow
def test_the_class_comes_from_paddleformers_tables():
    """:func:`surgery.logits_worker.resolve_class` on configs PaddleFormers 1.2 writes or could read: the
    ``architectures`` entry first (top level, then nested), then ``model_type`` through the auto tables; the
    non-fleet ``*Deprecated`` twin without paddlefleet; None where PaddleFormers has no class."""
    omni = {
        "architectures": ["Qwen2_5OmniForConditionalGeneration"],
        "model_type": "qwen2_5_omni",
        "thinker_config": {
            "model_type": "qwen2_5_omni_thinker",
            "text_config": {"model_type": "qwen2_5_omni_text"},
        },
    }
    cases = [
        (
            {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"},
            "Qwen2ForCausalLMDeprecated",
            "architectures",
        ),
        (
            {
                "model_type": "qwen2_5_vl",
                "vision_config": {"model_type": "qwen2_5_vl"},
                "text_config": {
                    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
                    "model_type": "qwen2_5_vl_text",
                },
            },
            "Qwen2_5_VLForConditionalGeneration",
            "text_config.architectures",
        ),
        ({"model_type": "qwen3_moe"}, "Qwen3MoeForCausalLMDeprecated", "model_type ('qwen3_moe')"),
        (
            {"model_type": "qwen2_5_vl_text"},
            "Qwen2_5_VLForConditionalGeneration",
            "model_type ('qwen2_5_vl_text')",
        ),
        (
            {"architectures": ["LlamaModel"], "model_type": "llama"},
            "LlamaForCausalLM",
            "model_type ('llama')",
        ),
        (
            {"architectures": ["Qwen3VLForConditionalGeneration"]},
            "Qwen3VLForConditionalGenerationDeprecated",
            "architectures",
        ),
        ({"model_type": "gemma3_text"}, "Gemma3ForCausalLM", "model_type ('gemma3_text')"),
        (
            {"text_config": {"vision_config": {"model_type": "qwen2_5_vl"}}},
            "",
            "architectures none, model_type none",
        ),
        (omni, "", "architectures ['Qwen2_5OmniForConditionalGeneration'], model_type ['qwen2_5_omni', "),
    ]
    r = subprocess.run(
        [sys.executable, "-c", _RESOLVE],
        input=json.dumps([c for c, _, _ in cases]),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for (_, name, where), (gname, gwhere) in zip(cases, got, strict=True):
        assert gname == name and gwhere.startswith(where), (name, where, gname, gwhere)


@pytest.mark.slow
def test_verify_logits_loads_legacy_layout_safetensors_with_the_legacy_loader(tmp_path):
    """PaddleFormers' legacy Llama converted --to safetensors (its Paddle layout, which a plain
    from_pretrained loads silently wrong: test_convert.py) and resized: verify --logits loads both with the
    legacy loader, so a right resize compares equal and exits 0 (it exited 7, 'logits differ' by 2.77)."""
    st, out = tmp_path / "legacy-st", tmp_path / "resized"
    r = fs.run_tool(
        ["convert", str(CASES_DIR / "pf_llama_untied_legacy_pdparams"), "--to", "safetensors"]
        + ["--out", str(st)]
    )
    assert r.returncode == 0, r.stderr
    r = fs.run_tool(["resize", str(st), "--vocab", "110", "--seed", "1", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    doc = _verify(st, out)
    lg = doc["logits"]
    assert doc["_rc"] == doc["exit_code"] == 0, doc
    assert lg["compared"] is True and lg["ok"] is True and lg["max_abs_diff"] < 1e-5, lg


# ------------------------------------------------------------------------------------------------ not slow
def test_legacy_layout_is_told_from_the_checkpoint(tmp_path):
    """The loader verify --logits picks: legacy for PaddleFormers' Paddle layout in either container, plain
    for its HF layout (no paddle needed: headers and config only)."""
    from tietool.surgery.plan.convert import pf_legacy_layout

    legacy = CASES_DIR / "pf_llama_untied_legacy_pdparams"
    st = tmp_path / "legacy-st"
    assert fs.run_tool(["convert", str(legacy), "--to", "safetensors", "--out", str(st)]).returncode == 0
    cfg = json.loads((st / "config.json").read_text())
    cfg.pop("source")  # the shapes alone prove the Paddle layout
    (st / "config.json").write_text(json.dumps(cfg))
    assert pf_legacy_layout(Checkpoint.open(legacy)) and pf_legacy_layout(Checkpoint.open(st))
    assert not pf_legacy_layout(Checkpoint.open(CASES_DIR / "pf_llama_untied_fp32"))
    assert not pf_legacy_layout(Checkpoint.open(CASES_DIR / "pnlp_llama_untied"))  # not PaddleFormers


def test_verify_logits_of_a_paddlenlp_checkpoint_exits_8(tmp_path):
    """Without PNLP_PYTHON (no PaddleNLP to run the input in; with it: test_verify_logits_across.py)."""
    from support import cli_runner

    src = CASES_DIR / "pnlp_llama_tied"
    out = fs.copy_checkpoint(src, tmp_path / "copy")
    r = cli_runner.run_cli(["verify", str(src), str(out), "--logits", "--json"], env={"PNLP_PYTHON": None})
    doc = json.loads(r.stdout)
    assert r.returncode == doc["exit_code"] == 8 and doc["logits"]["cause"] == "paddlenlp", doc
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tietool: verify: logits not compared: "), r.stderr
    assert "PaddleNLP checkpoint" in lines[0] and "convert both to PaddleFormers" in lines[0]
    plain = fs.run_tool(["verify", str(src), str(out)])
    assert plain.returncode == 0, plain.stderr  # without --logits nothing was asked that could not be done


def test_verify_logits_without_paddle_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "paddle" else real(n, *a))
    lg = logits_check(CASES_DIR / "pf_llama_tied_fp32", CASES_DIR / "pf_llama_tied_fp32")
    assert (
        lg["ok"] is None
        and lg["cause"] == "no_paddle"
        and 'pip install ".[paddle]" in the tietool clone' in lg["error"]
    )


@pytest.mark.parametrize(
    "unexplained, logits, code",
    [
        ([], None, ExitCode.OK),
        ([], {"ok": True, "compared": True}, ExitCode.OK),
        ([], {"ok": None, "compared": False}, ExitCode.NOT_COMPARED),
        (["x changed"], {"ok": None, "compared": False}, ExitCode.UNEXPLAINED),
        (["logits differ"], {"ok": False, "compared": True}, ExitCode.UNEXPLAINED),
    ],
)
def test_verify_verdict_order(unexplained, logits, code):
    res = VerifyResult(unexplained=list(unexplained), logits=logits)
    assert res.exit_code == code and res.as_dict()["exit_code"] == int(code)
    assert ExitCode.NOT_COMPARED == 8 and len({int(c) for c in ExitCode}) == len(ExitCode)
