"""tie / untie / resize on real PaddleFormers 1.2 checkpoints of eight families (issue 10).

The checkpoints are built in this run by PaddleFormers itself (``support/family_builder.py``: ``paddle.seed``,
``<Family>ForCausalLM(<Family>Config(...))``, ``save_pretrained``) for llama, qwen2 (bf16), qwen3, ernie4_5,
gemma3_text, gpt_oss, phi3 and a DeepSeek-V3 with a multi-token-prediction layer, each

* tied / untied (an independent random head) / untied-equal (``tie_word_embeddings=False``, head equal to
  the embedding),
* safetensors (the default flex-checkpoint save) / ``.pdparams`` (the legacy save, read back with
  ``load_checkpoint_format="legacy", convert_from_hf=False``),
* one file / sharded (``max_shard_size`` puts the embedding and the head in shards of their own).

Nothing is pruned: PaddleFormers 1.2 writes and reads back every combination (96 checkpoints).

Each command runs once per session on a fresh copy of its input (in process: ``support.cli_runner``), then
``tietool verify INPUT OUTPUT`` must exit 0; the output is loaded in PaddleFormers (the oracle script
``tests/data/tools/pf_logits.py``, many loads per process: :class:`support.pf_worker.LogitsPool`) and its
logits are compared with the input's, computed in the same run:

* ``tie`` / ``untie``: bit for bit (``np.array_equal``);
* ``resize``: on the kept vocabulary (the first min(61, N) logits; the batch uses ids < 40) within
  :data:`RESIZE_ATOL`, and no tensor axis, no vocabulary-size key of config.json / generation_config.json is
  left at the old size 61 (no other dimension of these models is 61).

Whether ``tie`` may drop the head follows the architecture table's loader facts, which these loads checked
(see the comment above ``_params``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pytest
from support import family_builder as fb
from support import fixture_support as fs
from support import paths, pf_worker

from tietool.surgery import arch
from tietool.surgery.inspect.detect import detect
from tietool.surgery.io.checkpoint import Checkpoint

pytestmark = pytest.mark.slow  # every test here needs PaddleFormers (the builder and the logits)

OLD = fb.OLD_VOCAB  # 61
UP = 77  # resize --vocab 77 (grow by 16)
DOWN = 52  # resize --vocab 52 --force (trim 9); the fixed batch uses ids < 40; the VL families' image and
# video token ids (50, 51: support/family_builder.py _VL_IDS) keep their rows (a trim below them is refused)
RESIZE = {"resize-up": UP, "resize-down": DOWN}
LOAD_PROBLEMS = ("Missing keys", "newly initialized", "should be assigned")

# Resized logits on the kept vocabulary: the head matmul of the output is [hidden] x [hidden, N] instead of
# [hidden, 61]; the CPU GEMM picks its blocking / vector width by N, so the hidden-size dot products of the
# kept columns can be summed in another order. That moves a float32 logit by a few ulp of the partial sums:
# the existing resize tests saw up to 6e-7 on logits of magnitude ~1; these models' logits are < 1.5. The
# bound is 2e-6 absolute: ~10x the float32 rounding of a 32-term dot product of these magnitudes
# (32 * 2**-24 * 1.5 ~ 3e-6 worst case, typically far less) and orders of magnitude below any real change
# (a wrong, shifted or re-initialised row moves logits by 1e-2 or more).
RESIZE_ATOL = 2e-6

VARIANTS = [
    fb.Variant(f, t, fmt, sharded)
    for f in fb.FAMILIES
    for t in fb.TIES
    for fmt in fb.formats(f)
    for sharded in (False, True)
]
# the checkpoints test_loader_facts loads (one file, each container): the head dropped with the flag tied, an
# independent head with the flag untied, the head equal to the embedding with the flag untied
FACT_TIES = (fb.NOHEAD, "untied", "untied-equal")
PROBES = [fb.Variant(f, fb.NOHEAD, fmt, False) for f in fb.FAMILIES for fmt in fb.formats(f)]
BY_NAME = {v.name: v for v in VARIANTS + PROBES}

# What is right for each command on each checkpoint (tietool's result is judged against this):
#   "ok"     -- exit 0, verify exit 0, the output loads in PaddleFormers with the input's logits;
#   "refuse" -- exit 5 and no output.


def _emb_name(ck: dict) -> str:
    """The input embedding's name in a built checkpoint (``model.embed_tokens.weight``, or
    ``model.language_model.embed_tokens.weight`` in a vision-language model), never an MTP layer's copy."""
    names = [n for n in ck if n.endswith("embed_tokens.weight") and ".layers." not in n]
    assert len(names) == 1, names
    return names[0]


def _equal_as_head(head: fs.RawTensor, emb: fs.RawTensor) -> bool:
    """The head holds the embedding's values, in either layout (GLM-OCR's .pdparams head: [hidden, vocab])."""
    if head.shape == emb.shape:
        return head.data == emb.data
    return bool(np.array_equal(head.array().T, emb.array()))


def _vocab_size(cfg: dict) -> int | None:
    """config.json's vocabulary size: top level, or the text model's (vision-language configs)."""
    return cfg.get("vocab_size", (cfg.get("text_config") or {}).get("vocab_size"))


def _facts(v: fb.Variant) -> arch.Family:
    """The architecture table's row for the variant's model type (builder family names are model types)
    under the PaddleFormers loader, in its container."""
    return arch.lookup(v.family, "paddleformers", v.fmt)


def expected(v: fb.Variant, op: str, ck: dict[str, fs.RawTensor]) -> str:
    """The right outcome of ``op`` on variant ``v`` whose files hold ``ck`` (read with the tests' reader)."""
    if op == "tie":
        # tie is right exactly where the head in the files (if any) equals the embedding. Beyond the plain
        # untied checkpoints (an independent random head) that refuses: PF 1.2 GptOss and DeepSeek-V3 never
        # tie (their __init__ has no tie_weights), so even with tie_word_embeddings=True they save an
        # independent random head (and load it); PF 1.2 saves an untied Gemma3 .pdparams with its random
        # head, but its safetensors without any head (tie then only sets the flag: the flex loader always
        # takes the embedding).
        head = ck.get("lm_head.weight")
        return "ok" if head is None or _equal_as_head(head, ck[_emb_name(ck)]) else "refuse"
    if op == "untie":
        # PF 1.2 Gemma3's safetensors (flex-checkpoint) loader always builds the head from the embedding
        # (its AOA maps "model.embed_tokens.weight -> lm_head.weight"), so an untied head would be ignored
        # and tietool refuses (README). Its legacy .pdparams loader has no AOA and does read lm_head.weight
        # (an untied Gemma3 .pdparams loads its own head): there an untie output is loaded as written.
        # (table: always_tied; proven by test_loader_facts, so untie refuses where it is proven)
        return "refuse" if _facts(v).refuses_untie else "ok"
    return "ok"  # resize


def _ops_for(v: fb.Variant) -> list[str]:
    if v.tie == "tied":
        return ["tie", "untie", "resize-up", "resize-down"]
    if v.tie == "untied":
        return ["tie", "resize-up", "resize-down"]
    return ["tie"]  # untied-equal: the case where tie must succeed on an untied checkpoint


# This file found five loader facts of PaddleFormers 1.2 that the architecture table then lacked (each was an
# xfail here until surgery/arch/families.py learnt it): Qwen2/Qwen3/Gemma3 legacy .pdparams loaders do not
# re-tie a dropped head; Phi3 never rebuilds a missing head; GptOss and DeepSeek-V3 ignore
# tie_word_embeddings; Gemma3's legacy .pdparams loader reads lm_head.weight as stored (untie is valid).


def _params(op_filter) -> list:
    out = []
    for v in VARIANTS:
        for op in _ops_for(v):
            if not op_filter(op):
                continue
            out.append(pytest.param(v.name, op, id=f"{v.name}-{op}"))
    return out


# ------------------------------------------------------------------------------------------------ plumbing
@dataclasses.dataclass
class OpResult:
    run: fs.ToolRun
    verify: object | None  # subprocess.CompletedProcess of `tietool verify INPUT OUTPUT`, when the op wrote


def _argv(op: str) -> tuple[str, list[str]]:
    if op in ("tie", "untie"):
        return op, []
    n = RESIZE[op]
    extra = ["--vocab", str(n), "--seed", "0"]
    return "resize", extra + (["--force"] if n < OLD else [])


class Matrix:
    """Builds the selected checkpoints (one builder subprocess), runs the selected commands (in process, each
    on a fresh copy: :func:`support.cli_runner.run_cli`), then every PaddleFormers load (in ``pool``'s
    long-lived process, shared by the builds of this pytest process)."""

    def __init__(self, root: Path, selected: set[tuple[str, str | None]], pool: pf_worker.LogitsPool):
        self.root = root
        t0 = time.monotonic()
        variants = sorted({BY_NAME[n] for n, _ in selected}, key=lambda v: v.name)
        self.built, self.build_seconds = fb.build_all(variants, root / "built")
        self.results: dict[tuple[str, str], OpResult] = {}
        self.resize_deltas: dict[tuple[str, str], float] = {}  # max |logit difference| on the kept vocabulary
        jobs = [(n, op) for n, op in sorted(selected, key=str) if op and self.built[BY_NAME[n]].ok]
        t1 = time.monotonic()
        for key in jobs:  # in process, one after the other (support.cli_runner: main thread only)
            self.results[key] = self._run_op(key)
        self.tool_seconds = time.monotonic() - t1
        logits_jobs: dict[fb.LogitsJob, None] = {}
        for n, op in jobs:
            v = BY_NAME[n]
            logits_jobs[self._job(self.built[v].path, v)] = None
            r = self.results[(n, op)]
            if r.run.rc == 0:
                logits_jobs[self._job(r.run.out, v)] = None
        for v in variants:  # every input, for the cross-format check
            if self.built[v].ok:
                logits_jobs[self._job(self.built[v].path, v)] = None
        t2 = time.monotonic()
        self.logits = {}
        (root / "logits").mkdir()
        for i, job in enumerate(logits_jobs):  # the session's worker process (a fresh one after a failure)
            out = root / "logits" / f"{i:03d}.npy"
            res = pool.load(job.ckpt, job.model_class, dict(job.kwargs), out)
            res["logits"] = np.load(out) if res.get("ok") else None
            self.logits[job] = res
        self.logits_seconds = time.monotonic() - t2
        self.seconds = time.monotonic() - t0
        self.loads = len(logits_jobs)

    @staticmethod
    def _job(path: Path, v: fb.Variant) -> fb.LogitsJob:
        return fb.LogitsJob(Path(path), v.model_class, tuple(sorted(v.load_kwargs.items())))

    def _run_op(self, key: tuple[str, str]) -> OpResult:
        name, op = key
        command, extra = _argv(op)
        run = fs.run_on_copy(
            self.built[BY_NAME[name]].path, self.root / "runs" / f"{name}-{op}", command, extra
        )
        verify = None
        if run.rc == 0:
            verify = fs.run_tool(["verify", str(run.inp), str(run.out)])
        return OpResult(run, verify)

    def input_logits(self, v: fb.Variant) -> dict:
        return self.logits[self._job(self.built[v].path, v)]

    def output_logits(self, v: fb.Variant, run: fs.ToolRun) -> dict:
        return self.logits[self._job(run.out, v)]


# The families fall into BUILDS independent builds (a Matrix each, built when its first test runs): under
# pytest-xdist each build is a group of its own (xdist_build, tests/conftest.py), so the two workers build two
# at once instead of one worker building all 16 families while the other waits for nothing of it. Each build
# costs one builder process more (~3 s of CPU: paddle's import); four keep that small. The loads of every
# build of one pytest process share one long-lived logits process (the ``matrices`` fixture's pool).
BUILDS = 4


def _family_of(params: dict) -> str:
    return params["family"] if "family" in params else BY_NAME[params["name"]].family


def _build_of(family: str) -> int:
    return list(fb.FAMILIES).index(family) % BUILDS


def xdist_build(item) -> str:
    """The build a test shares (tests/conftest.py: its xdist group): its family's :func:`_build_of`."""
    return f"build{_build_of(_family_of(item.callspec.params))}"


def _selected(request, build: int) -> set[tuple[str, str | None]]:
    """(variant name, op) of every selected test of build ``build``; a test of inputs only needs its
    checkpoints built and loaded, which tie (every variant's first command) brings."""
    sel: set[tuple[str, str | None]] = set()
    for it in request.session.items:
        p = getattr(getattr(it, "callspec", None), "params", None)
        if it.module is None or it.module.__name__ != __name__ or p is None:
            continue
        if _build_of(_family_of(p)) != build:
            continue
        if "op" in p:
            sel.add((p["name"], p["op"]))
        elif "fmt" in p:  # test_loader_facts: load only
            sel |= {(fb.Variant(p["family"], t, p["fmt"], False).name, None) for t in FACT_TIES}
        elif "name" in p:
            sel.add((p["name"], "tie"))
        elif "family" in p:
            sel |= {(v.name, "tie") for v in VARIANTS if v.family == p["family"] and v.tie == p["tie"]}
    return sel


@pytest.fixture(scope="session")
def matrices(request, tmp_path_factory):
    """The :class:`Matrix` of each build (:data:`BUILDS`), made on first use, for the session."""
    if importlib.util.find_spec("paddleformers") is None:
        pytest.skip("paddleformers is not importable in this interpreter (install the [test] extra)")
    made: dict[int, Matrix | BaseException] = {}
    pool = pf_worker.LogitsPool(tmp_path_factory.mktemp("families-pf"))

    def of(b: int) -> Matrix:
        if b not in made:  # a build that failed fails every test of it, once
            try:
                made[b] = Matrix(tmp_path_factory.mktemp(f"families{b}"), _selected(request, b), pool)
            except Exception as e:  # noqa: BLE001 - raised again for each test of the build
                made[b] = e
        m = made[b]
        if isinstance(m, BaseException):
            raise m
        return m

    yield of
    pool.close()
    for m in made.values():
        if isinstance(m, Matrix):
            _summary(m)


@pytest.fixture
def matrix(request, matrices) -> Matrix:
    """The :class:`Matrix` of the build of this test's family."""
    return matrices(_build_of(_family_of(request.node.callspec.params)))


def _summary(m: Matrix) -> None:
    print(
        f"\n[test_families] {len(m.built)} checkpoints built in {m.build_seconds:.1f}s; "
        f"{len(m.results)} commands (+ verify) in {m.tool_seconds:.1f}s; {m.loads} PaddleFormers loads in "
        f"{m.logits_seconds:.1f}s; {m.seconds:.1f}s in all"
    )
    if m.resize_deltas:
        worst = max(m.resize_deltas, key=m.resize_deltas.__getitem__)
        exact = sum(1 for d in m.resize_deltas.values() if d == 0)
        print(
            f"[test_families] resize logits on the kept vocabulary: {exact} of {len(m.resize_deltas)} "
            f"bit-exact, "
            f"max |delta| {m.resize_deltas[worst]:.3g} ({'-'.join(worst)})"
        )


def _built(matrix: Matrix, name: str) -> fb.Built:
    b = matrix.built[BY_NAME[name]]
    assert b.ok, f"PaddleFormers 1.2 could not build/save {name}: {b.error}"
    return b


def _load_ok(res: dict, what: str, retied: bool = False) -> np.ndarray:
    """The logits of a load that ran without load problems; ``retied``: the output dropped the head and the
    table says the loader logs a re-tied head as newly initialized (the logits then show it was re-tied)."""
    assert res.get("ok"), f"PaddleFormers could not run {what}: {res.get('error')}"
    harmless = "newly initialized: ['lm_head.weight']"
    bad = [
        w
        for w in res.get("warnings", [])
        if any(p in w for p in LOAD_PROBLEMS) and not (retied and w.endswith(harmless))
    ]
    assert not bad, f"PaddleFormers warned loading {what}: {bad}"
    return res["logits"]


def _retied(v: fb.Variant, r: OpResult) -> bool:
    """The command dropped the head and the table says the loader logs the re-tied head as new."""
    rep = json.loads((r.run.out / "tietool-report.json").read_text())
    return _facts(v).warns_missing_head and any(d["name"] == "lm_head.weight" for d in rep["dropped"])


def _check_op(matrix: Matrix, name: str, op: str) -> tuple[fb.Variant, OpResult | None]:
    """The command's exit status as :func:`expected` says, the input untouched, and verify exit 0."""
    v = BY_NAME[name]
    inp = fs.read_checkpoint(_built(matrix, name).path)
    r = matrix.results[(name, op)]
    run = r.run
    assert run.hashes_before == run.hashes_after, f"tietool {op} changed its input\n{run.describe()}"
    if expected(v, op, inp) == "refuse":
        assert run.rc == 5, f"expected a refusal (exit 5)\n{run.describe()}"
        assert run.out_empty(), f"a refused {op} left an output: {sorted(p.name for p in run.out.iterdir())}"
        return v, None
    assert run.rc == 0, f"expected exit 0\n{run.describe()}"
    assert r.verify is not None and r.verify.returncode == 0, (
        f"tietool verify INPUT OUTPUT exit {getattr(r.verify, 'returncode', None)}:\n"
        f"{(r.verify.stdout + r.verify.stderr)[-2000:] if r.verify else ''}"
    )
    problems = fs.index_problems(run.out)
    assert not problems, f"the output's index disagrees with its shards: {problems}"
    return v, r


# ------------------------------------------------------------------------------------------------ inputs
@pytest.mark.parametrize("name", [v.name for v in VARIANTS])
def test_inputs(matrix, name):
    """What the builder wrote is the checkpoint the tests claim: the library's files load in PaddleFormers
    without missing keys; 61 is the size of vocabulary axes only (so "no axis of 61" after a resize means no
    vocabulary tensor left behind); sharded = embedding and head (when saved) in different shards;
    untied-equal = head equal to the embedding; DeepSeek-V3 carries its MTP copies."""
    v = BY_NAME[name]
    b = _built(matrix, name)
    ck = fs.read_checkpoint(b.path)
    vocab_like = ("embed_tokens.weight", "lm_head.weight", "shared_head.head.weight")
    with_61 = sorted(n for n, t in ck.items() if OLD in t.shape)
    assert with_61 and all(n.endswith(vocab_like) for n in with_61), with_61
    assert _vocab_size(fs.config_of(b.path)) == OLD
    emb, head = ck[_emb_name(ck)], ck.get("lm_head.weight")
    if v.sharded and head is not None:
        assert emb.file != head.file, f"embedding and head share {emb.file}"
    if v.tie == "untied-equal" and head is not None:
        assert _equal_as_head(head, emb)
    if v.family == "deepseek_v3":
        n = fb.FAMILIES["deepseek_v3"]["kwargs"]["num_hidden_layers"]
        assert ck[f"model.layers.{n}.embed_tokens.weight"].data == emb.data
        assert head is not None and ck[f"model.layers.{n}.shared_head.head.weight"].data == head.data
    if v.fmt == "pdparams":
        assert all(f.suffix == ".pdparams" for f in fs.weight_files(b.path))
    _load_ok(matrix.input_logits(v), f"the input {name}")


# PaddleFormers 1.2 Qwen2-MoE / Qwen3-MoE: the same model saved in the two containers does not load to the
# same logits. Tied, the .pdparams holds the model's own (untied, random) lm_head while the safetensors save
# writes none and loads tied; untied, the logits still differ by up to ~2.5e-3 (not explained here: each
# container is compared with itself only, and every output with its own input).
CONTAINERS_DIFFER = {"qwen2_moe", "qwen3_moe"}


@pytest.mark.parametrize("family", list(fb.FAMILIES))
@pytest.mark.parametrize("tie", fb.TIES)
def test_inputs_agree_across_formats(matrix, family, tie):
    """The same model saved four ways (safetensors / pdparams, one file / sharded) gives the same logits: the
    formats are read back faithfully, so each input is a sound reference for its outputs."""
    groups: dict[str, dict[str, np.ndarray]] = {}
    for v in VARIANTS:
        if v.family == family and v.tie == tie and matrix.built.get(v) and matrix.built[v].ok:
            # PF 1.2 saves an untied Gemma3 without its head in safetensors (the flex-checkpoint loader then
            # takes the embedding), but with it in the legacy .pdparams (whose loader uses it): the two
            # formats hold different models, so they are compared within each format only
            key = (
                v.fmt if (family, tie) == ("gemma3_text", "untied") or family in CONTAINERS_DIFFER else "all"
            )
            groups.setdefault(key, {})[v.name] = _load_ok(matrix.input_logits(v), v.name)
    if not any(len(g) > 1 for g in groups.values()):
        pytest.skip(f"fewer than two comparable {family} {tie} checkpoints selected")
    for got in groups.values():
        first, *rest = got
        for n in rest:
            diff = fs.logits_mismatch(got[n], got[first])
            assert diff is None, f"{n} vs {first}: {diff}"


# ------------------------------------------------------------------------------------------------ tie / untie
@pytest.mark.parametrize("name,op", _params(lambda op: op == "tie"))
def test_tie(matrix, name, op):
    """tie succeeds where the head equals the embedding (or the loader takes the head from the embedding
    anyway) and the output gives the input's logits bit for bit; on an independent head it refuses
    (exit 5)."""
    v, r = _check_op(matrix, name, op)
    if r is None:
        return
    cfg = fs.config_of(r.run.out)
    assert cfg.get("tie_word_embeddings") is True, (
        f"tie left tie_word_embeddings={cfg.get('tie_word_embeddings')}"
    )
    want = _load_ok(matrix.input_logits(v), f"the input {name}")
    got = _load_ok(matrix.output_logits(v, r.run), f"the tie output of {name}", _retied(v, r))
    diff = fs.logits_mismatch(got, want)
    assert diff is None, f"tie output of {name}: logits differ from the input's: {diff}\n{r.run.describe()}"


@pytest.mark.parametrize("name,op", _params(lambda op: op == "untie"))
def test_untie(matrix, name, op):
    """untie of a tied checkpoint writes a head the loader uses and gives the input's logits bit for bit
    (Gemma3, whose PF 1.2 loader always re-ties, is refused)."""
    v, r = _check_op(matrix, name, op)
    if r is None:
        return
    cfg = fs.config_of(r.run.out)
    assert cfg.get("tie_word_embeddings") is False
    ck = fs.read_checkpoint(r.run.out)
    assert "lm_head.weight" in ck, f"untie wrote no lm_head.weight: {sorted(ck)}"
    want = _load_ok(matrix.input_logits(v), f"the input {name}")
    got = _load_ok(matrix.output_logits(v, r.run), f"the untie output of {name}")
    diff = fs.logits_mismatch(got, want)
    assert diff is None, f"untie output of {name}: logits differ from the input's: {diff}\n{r.run.describe()}"


# ------------------------------------------------------------------------------------------------ resize
def _vocab_keys(node, path="") -> list[tuple[str, object]]:
    """Every (path, value) in a JSON tree whose key names a vocabulary size (``vocab_size``,
    ``padded_vocab_size``, ``text_config.vocab_size``, ...), at any nesting."""
    out = []
    if isinstance(node, dict):
        for k, val in node.items():
            p = f"{path}.{k}" if path else k
            if "vocab" in k.lower() and "size" in k.lower():
                out.append((p, val))
            out += _vocab_keys(val, p)
    elif isinstance(node, list):
        for i, val in enumerate(node):
            out += _vocab_keys(val, f"{path}[{i}]")
    return out


@pytest.mark.parametrize("name,op", _params(lambda op: op.startswith("resize")))
def test_resize(matrix, name, op):
    """resize --vocab 77 / --vocab 52 --force: every vocabulary tensor (embedding, head, DeepSeek's MTP
    copies) has N rows and no tensor axis is 61 any more; every vocabulary-size key of config.json and
    generation_config.json says N; the output loads and, on the kept vocabulary, gives the input's logits
    within RESIZE_ATOL."""
    v, r = _check_op(matrix, name, op)
    assert r is not None
    n = RESIZE[op]
    out = r.run.out
    ck = fs.read_checkpoint(out)
    stale = sorted(f"{k}{list(t.shape)}" for k, t in ck.items() if OLD in t.shape)
    assert not stale, f"tensors left at the old vocabulary size {OLD}: {stale}"
    inp = fs.read_checkpoint(_built(matrix, name).path)
    dropped = _redundant_heads_dropped(out, inp)
    for k, t in inp.items():
        if OLD in t.shape and k not in dropped:
            want = tuple(n if d == OLD else d for d in t.shape)
            assert k in ck and ck[k].shape == want, (
                f"{k}: {t.shape} -> {ck[k].shape if k in ck else 'absent'}"
            )
            kept = tuple(slice(0, min(n, OLD)) if d == OLD else slice(None) for d in t.shape)
            assert np.array_equal(ck[k].array()[kept], t.array()[kept]), f"{k}: the kept rows changed"
    for fname in ("config.json", "generation_config.json"):
        p = out / fname
        if not p.is_file():
            continue
        keys = _vocab_keys(json.loads(p.read_text()))
        stale_keys = [(k, val) for k, val in keys if val == OLD]
        assert not stale_keys, f"{fname} still says {OLD}: {stale_keys}"
        if fname == "config.json":
            top = (
                "vocab_size"
                if "vocab_size" in fs.config_of(_built(matrix, name).path)
                else "text_config.vocab_size"
            )
            assert (top, n) in keys, f"config.json vocab-size keys: {keys}"
    want = _load_ok(matrix.input_logits(v), f"the input {name}")
    got = _load_ok(matrix.output_logits(v, r.run), f"the {op} output of {name}", _retied(v, r))
    assert got.shape[:-1] == want.shape[:-1] and got.shape[-1] == n, f"logits {got.shape}, input {want.shape}"
    k = min(n, OLD)
    matrix.resize_deltas[(name, op)] = float(np.max(np.abs(got[..., :k].astype(np.float64) - want[..., :k])))
    diff = fs.logits_mismatch(got[..., :k], want[..., :k], atol=RESIZE_ATOL)
    assert diff is None, f"{op} output of {name}: logits on the first {k} tokens differ: {diff}"


def _redundant_heads_dropped(out, inp) -> set[str]:
    """The heads a resize of a tied checkpoint dropped instead of resizing (PaddleFormers writes a duplicate
    head; where the loader re-ties, resize drops it as tie would). Each must be listed in the report as
    dropped, have been byte-equal to the input's embedding, and the output must say tied; the logits check
    then shows that the loader rebuilt it from the resized embedding."""
    rep = json.loads((out / "tietool-report.json").read_text())
    names = {d["name"] for d in rep["dropped"]}
    if names:
        emb = inp[_emb_name(inp)].array()
        assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
        for k in names:
            assert np.array_equal(inp[k].array(), emb), f"{k} was dropped but differed from the embedding"
    return names


# ------------------------------------------------------------------------------------------------ the oracle
# one float32 safetensors, the bf16 one, one legacy .pdparams (through pf_logits_kw.py's keyword arguments)
CROSS_CHECK = [
    "llama-untied-safetensors-sharded",
    "qwen2-tied-safetensors-single",
    "phi3-untied-pdparams-single",
]


@pytest.mark.parametrize("name", CROSS_CHECK)
def test_batched_logits_equal_fresh_process(matrix, name, tmp_path):
    """The batched loads give, bit for bit, the logits ``run_pf_logits`` gives in a fresh subprocess of its
    own (the way LiveLogits computes them), so computing many loads per process changes nothing.
    (DeepSeek-V3 is left out: pf_logits.py alone cannot import it without the paddlefleet_ops placeholder.)"""
    v = BY_NAME[name]
    b = _built(matrix, name)
    batched = _load_ok(matrix.input_logits(v), name)
    ckpt = fs.copy_checkpoint(b.path, tmp_path / "ckpt")
    fresh = fs.run_pf_logits(ckpt, v.model_class, tmp_path / "l.npy", v.load_kwargs)
    assert fresh["ok"], fresh
    diff = fs.logits_mismatch(batched, np.load(tmp_path / "l.npy"))
    assert diff is None, diff


# --------------------------------------------------------------------------------------------- loader facts
def _same(a: dict, b: dict) -> bool:
    """Both loads ran and gave the same logits bit for bit."""
    return bool(a.get("ok") and b.get("ok")) and np.array_equal(a["logits"], b["logits"])


@pytest.mark.parametrize(
    "family,fmt", [pytest.param(f, fmt, id=f"{f}-{fmt}") for f in fb.FAMILIES for fmt in fb.formats(f)]
)
def test_loader_facts(matrix, family, fmt, request):
    """The proof of the architecture table's PaddleFormers 1.2 facts for one model type and container
    (``surgery.arch.PROOFS`` names this test): loads of checkpoints PaddleFormers itself wrote --

    * reties: the tied model with its head removed from the files loads with the logits of the model whose
      head equals the embedding (a random head, or "should be assigned before!", means it does not);
    * always_tied: an independent head saved with the flag untied is ignored (or not even saved);
    * warns_missing_head: the re-tied load logs the head as newly initialized;
    * head layout: the shape of the head PaddleFormers writes ([vocab, hidden] or [hidden, vocab]);
    * head bias: a bias PaddleFormers writes is one of the row's bias names;

    and that detection resolves the model type to this row, under the paddleformers loader, and PROOFS maps
    (model_type, paddleformers, container) to this test; the hf row mirrors the paddleformers one.
    """
    nohead, untied, equal = (BY_NAME[fb.Variant(family, t, fmt, False).name] for t in FACT_TIES)
    built = {v: matrix.built[v] for v in (nohead, untied, equal)}
    if not all(b.ok for b in built.values()):
        pytest.fail(
            f"PaddleFormers 1.2 could not build/save {family} ({fmt}): "
            + "; ".join(f"{v.name}: {b.error}" for v, b in built.items() if not b.ok)
        )
    ref = matrix.input_logits(equal)
    assert ref.get("ok"), f"PaddleFormers could not load {equal.name}: {ref.get('error')}"
    ck = fs.read_checkpoint(built[untied].path)
    emb = _emb_name(ck)
    V, H = ck[emb].shape
    head = ck.get("lm_head.weight") or fs.read_checkpoint(built[equal].path).get("lm_head.weight")
    nohead_res, untied_res = matrix.input_logits(nohead), matrix.input_logits(untied)
    reties = _same(nohead_res, ref)
    warns = reties and any("newly initialized" in w for w in nohead_res.get("warnings", []))
    ignored = _same(untied_res, ref)  # the independent head (saved or not) does not reach the logits
    layout = None if head is None else {(V, H): "vocab-hidden", (H, V): "hidden-vocab"}[tuple(head.shape)]
    det = detect(Checkpoint.open(built[untied].path))
    assert (det.config.model_type, det.loader.name, det.family.known) == (family, "paddleformers", True)
    assert arch.PROOFS.get(arch.ProofKey(family, "paddleformers", fmt)) == paths.node_id(request)
    fam = arch.lookup(family, "paddleformers", fmt)
    seen = {"reties": reties, "always_tied": ignored, "warns_missing_head": warns}
    table = {
        "reties": fam.reties,
        "always_tied": fam.always_tied,
        "warns_missing_head": fam.warns_missing_head,
    }
    assert table == seen, f"{family} paddleformers/{fmt}: table {table}, loads {seen}"
    assert layout is not None or fam.always_tied, f"{family} {fmt}: no head saved, yet not always tied"
    if layout is not None:
        assert fam.head_layout == layout, f"{family} {fmt}: head {list(head.shape)}, table {fam.head_layout}"
    for b in (n for n in ck if n.startswith("lm_head.") and n != "lm_head.weight"):
        assert b in fam.bias, f"{family}: PaddleFormers writes {b}, not a bias name of the row"
    if (family, fmt) not in arch.HF_NOT_PF:  # the hf row mirrors PaddleFormers' reading of HF names
        hf = arch.lookup(family, "hf", fmt)
        assert (hf.reties, hf.always_tied, hf.warns_missing_head, hf.head_layout) == (
            fam.reties,
            fam.always_tied,
            fam.warns_missing_head,
            fam.head_layout,
        ), f"{family} {fmt}: the hf row differs from the paddleformers row"
