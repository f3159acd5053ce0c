"""PaddleNLP 2.8.1's loader facts, proven on checkpoints PaddleNLP itself wrote, and tietool's writes on
them loaded back by PaddleNLP (issue 17, item 1).

Every input is ``paddle.seed(s); <Model>(<Config>(tiny))`` saved by PaddleNLP 2.8.1's own ``save_pretrained``
in both containers (``tests/support/pnlp_worker.py``), in three variants: ``tied``
(``tie_word_embeddings=True``), ``untied`` (the model's own random head), ``untied-equal`` (untied, the head
set to the embedding); Llama, CodeGen, QWen and BERT also sharded (``max_shard_size="6KB"``: the embedding and
the head in shards of their own) and in bfloat16 (PaddleNLP writes it as U16). Two more are edits of the
written files: ``nohead`` (``tied`` with every tensor the table names as the head removed) and ``ownhead``
(``untied`` holding a head that differs from the embedding under the table's head name, where the library
wrote none or wrote the embedding's own storage).

:func:`test_pnlp_loader_facts` is the proof ``surgery/arch/families.py``'s ``_PNLP_PROOFS`` names for
``(model_type, "paddlenlp-2.8", container)``: the table's head layout is the loaded head's, ``reties`` says
whether ``nohead`` loads with the head equal to the embedding, ``always_tied`` whether ``ownhead``'s head is
ignored for the embedding, and the head bias is found exactly where the model has one.

:func:`test_pnlp_writes_load` runs tie / untie / resize (up, down ``--force``, ``--pad-to-multiple-of``, in
place) on them and loads every output in PaddleNLP 2.8.1: the logits of the vocabulary kept equal the
input's (computed in the same run), so no output loads a random head, and none is refused by the library.
A refusal by tietool is right only where the table says so (``untie`` of an always-tied model; ``tie`` of a
T5 head equal to the unscaled embedding). Families: Llama, Mixtral, QWen, GPT-J, CodeGen, RW (Falcon),
ChatGLM2, ChatGLM, Bloom, GPT, OPT, BERT, ERNIE, T5, BART (PaddleNLP 2.8.1 has no Qwen2 or Gemma).

GPT-J from safetensors is left out: PaddleNLP 2.8.1 cannot load the file its own ``save_pretrained(...,
safe_serialization=True)`` writes (its safetensors reader fails on the 0-d ``attn.masked_bias``:
"slice indices must be integers"), so no fact can be proven for that container.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from support import paths, pnlp_support
from support.pnlp_worker import FAMILIES, HIDDEN, VOCAB

import tietool
from tietool.surgery.arch import PROOFS, lookup

LOADER = "paddlenlp-2.8"
CONTAINERS = ("safetensors", "pdparams")
UNLOADABLE = {("gptj", "safetensors")}  # see the module docstring
CASES = [(f, c) for f in FAMILIES for c in CONTAINERS if (f, c) not in UNLOADABLE]
VARIANTS = ("tied", "untied", "untied-equal")
# more variants of a few families: sharded (every vocabulary tensor in a shard of its own) and bfloat16
EXTRA_FAMILIES = ("llama", "codegen", "qwen", "bert")
EXTRA: dict[str, tuple[str, dict]] = {
    "untied-sharded": ("untied", {"max_shard_size": "6KB"}),
    "untied-equal-sharded": ("untied-equal", {"max_shard_size": "6KB"}),
    "untied-bf16": ("untied", {"dtype": "bfloat16"}),
}
KEPT = 48  # resize down keeps 50 rows; IDS are below 48 and the compared logits are the first KEPT columns
# The families fall into BUILDS independent builds (the cases and writes of each made when its first test
# runs): under pytest-xdist each build is a group of its own (xdist_build, tests/conftest.py), so the two
# workers build and load two at once. Each build costs three PaddleNLP processes more (paddle's import).
BUILDS = 2


def _build_of(family: str) -> int:
    """The families with the extra variants alternate first, then the others (two builds of like size)."""
    order = sorted(FAMILIES, key=lambda f: f not in EXTRA_FAMILIES)
    return order.index(family) % BUILDS


def xdist_build(item) -> str | None:
    """The build a test shares (tests/conftest.py: its xdist group): its family's :func:`_build_of`, None
    for a test of the table alone."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return f"build{_build_of(params['family'])}" if "family" in params else None


@dataclass
class Case:
    family: str
    container: str
    model_type: str = ""
    dirs: dict[str, Path] = field(default_factory=dict)
    loads: dict[str, dict] = field(default_factory=dict)  # variant -> worker result + "arrays"


def _key(family: str, container: str) -> str:
    return f"{family}-{container}"


def _build_jobs(root: Path, build: int) -> tuple[list[dict], dict[str, Case]]:
    jobs, cases = [], {}
    for family, container in (c for c in CASES if _build_of(c[0]) == build):
        case = cases.setdefault(_key(family, container), Case(family, container))
        extra = EXTRA if family in EXTRA_FAMILIES else {}
        for variant, (tie, kw) in {**{v: (v, {}) for v in VARIANTS}, **extra}.items():
            out = root / f"{family}_{container}_{variant}"
            case.dirs[variant] = out
            jobs.append(
                {"op": "build", "family": family, "tie": tie, "container": container, "out": str(out), **kw}
            )
    return jobs, cases


def _load_jobs(cases: dict[str, Case], root: Path) -> list[dict]:
    return [
        {"op": "load", "family": c.family, "dir": str(d), "npz": str(root / f"{k}_{v}.npz")}
        for k, c in cases.items()
        for v, d in c.dirs.items()
    ]


def _edit_jobs(cases: dict[str, Case], root: Path) -> list[dict]:
    """``nohead`` and ``ownhead``: the table's head names dropped from ``tied`` / put into ``untied``."""
    jobs = []
    rng = np.random.default_rng(7)
    for k, c in cases.items():
        family = lookup(c.model_type, LOADER, c.container)
        nohead, ownhead = root / f"{k}_nohead", root / f"{k}_ownhead"
        shutil.copytree(c.dirs["tied"], nohead)
        shutil.copytree(c.dirs["untied"], ownhead)
        c.dirs["nohead"], c.dirs["ownhead"] = nohead, ownhead
        jobs.append({"op": "edit", "dir": str(nohead), "drop_suffixes": list(family.head)})
        info = tietool.inspect(c.dirs["untied"])
        if info["tie"]["values"] != "different":  # no head of its own (none, or the embedding's storage)
            head = info["head"]
            npy = root / f"{k}_ownhead.npy"
            shape = head["shape"] if head["present"] else [VOCAB, HIDDEN]
            np.save(npy, rng.normal(0, 0.5, shape).astype(np.float32))
            name = head["name"] if head["present"] else head["untie_writes"]
            jobs.append({"op": "edit", "dir": str(ownhead), "put": {name: str(npy)}})
    return jobs


def _check(results: list[dict], jobs: list[dict]) -> None:
    bad = [(j, r["error"]) for j, r in zip(jobs, results, strict=True) if not r["ok"] and j["op"] != "load"]
    assert not bad, bad


def _attach(cases: dict[str, Case], jobs: list[dict], results: list[dict], names: dict[str, str]) -> None:
    for job, res in zip(jobs, results, strict=True):
        if job["op"] != "load":
            continue
        key, variant = names[job["dir"]]
        if res["ok"]:
            res["arrays"] = dict(np.load(job["npz"]))
        cases[key].loads[variant] = res


def _once(make):
    """``make(build)`` for each build at most once: its value, or its error raised again for each test of
    the build."""
    made: dict[int, object] = {}

    def of(build: int):
        if build not in made:
            try:
                made[build] = make(build)
            except Exception as e:  # noqa: BLE001 - raised again for each test of the build
                made[build] = e
        if isinstance(made[build], BaseException):
            raise made[build]
        return made[build]

    return of


@pytest.fixture(scope="session")
def all_pnlp_cases(tmp_path_factory):
    """``of(build)``: :func:`cases_of` of that build, made once."""
    return _once(lambda b: cases_of(tmp_path_factory.mktemp(f"pnlp{b}"), b))


@pytest.fixture
def pnlp_cases(request, all_pnlp_cases) -> dict[str, Case]:
    """The cases of the build of this test's family."""
    pnlp_support.require()
    return all_pnlp_cases(_build_of(request.node.callspec.params["family"]))


def cases_of(root: Path, build: int) -> dict[str, Case]:
    """Every input of :data:`CASES` of build ``build``, built, edited and loaded by PaddleNLP 2.8.1 (two
    worker processes)."""
    jobs, cases = _build_jobs(root, build)
    _check(pnlp_support.run_jobs(jobs, root / "work"), jobs)
    for c in cases.values():
        c.model_type = json.loads((c.dirs["tied"] / "config.json").read_text())["model_type"]
    jobs = _edit_jobs(cases, root)
    jobs += _load_jobs(cases, root)
    names = {str(d): (k, v) for k, c in cases.items() for v, d in c.dirs.items()}
    results = pnlp_support.run_jobs(jobs, root / "work")
    _check(results, jobs)
    _attach(cases, jobs, results, names)
    return cases


def _arrays(case: Case, variant: str) -> dict[str, np.ndarray]:
    res = case.loads[variant]
    assert res["ok"], f"PaddleNLP 2.8.1 cannot load {case.dirs[variant].name}: {res['error']}"
    return res["arrays"]


def _as_embedding(head: np.ndarray) -> np.ndarray:
    """The loaded head as a [vocab, hidden] table (VOCAB != HIDDEN, so its shape says its layout)."""
    return head.T if head.shape == (HIDDEN, VOCAB) else head


def _layout(head: np.ndarray) -> str:
    assert head.shape in ((HIDDEN, VOCAB), (VOCAB, HIDDEN)), head.shape
    return "hidden-vocab" if head.shape == (HIDDEN, VOCAB) else "vocab-hidden"


def _observed(case: Case) -> dict:
    """What PaddleNLP 2.8.1 did with the case's inputs, in the table's terms."""
    untied, nohead, ownhead = (_arrays(case, v) for v in ("untied", "nohead", "ownhead"))
    return {
        "layout": _layout(untied["head"]),
        "reties": np.array_equal(_as_embedding(nohead["head"]), nohead["embedding"]),
        "always_tied": np.array_equal(_as_embedding(ownhead["head"]), ownhead["embedding"]),
        "bias": list(untied["bias"].shape) if "bias" in untied else None,
    }


def test_pnlp_proofs_name_these_tests():
    """Every PaddleNLP 2.8 proof in the table names a case of :func:`test_pnlp_loader_facts` of its model
    type, and every case is a proof (runs without the venv)."""
    ours = {k: v for k, v in PROOFS.items() if k[1] == LOADER}
    want = {
        (
            FAMILIES[f]["model_type"],
            LOADER,
            c,
        ): f"tests/oracles/test_pnlp_loaders.py::test_pnlp_loader_facts[{_key(f, c)}]"
        for f, c in CASES
    }
    assert ours == want


@pytest.mark.pnlp
@pytest.mark.slow
@pytest.mark.parametrize("family,container", CASES, ids=[_key(*c) for c in CASES])
def test_pnlp_loader_facts(pnlp_cases, family, container, request):
    case = pnlp_cases[_key(family, container)]
    assert case.model_type == FAMILIES[family]["model_type"]
    assert PROOFS[(case.model_type, LOADER, container)] == paths.node_id(request)
    facts = lookup(case.model_type, LOADER, container)
    own = tietool.inspect(case.dirs["ownhead"])
    assert own["head"]["present"] and own["tie"]["values"] == "different", own["tie"]
    info = tietool.inspect(case.dirs["untied"])
    assert info["loader"]["name"] == LOADER
    bias = info["head_bias"]["shape"] if info["head_bias"] else None
    table = {
        "layout": facts.head_layout,
        "reties": facts.reties,
        "always_tied": facts.always_tied,
        "bias": bias,
    }
    assert facts.known and table == _observed(case), case.model_type


# ---------------------------------------------------------------------------------------------- writes
# (name, input variant, operation, keyword arguments); rows compared: the first KEPT of every output
OPS: list[tuple[str, str, str, dict]] = [
    ("tie", "untied-equal", "tie", {}),
    ("untie", "tied", "untie", {}),
    ("resize-up", "untied", "resize", {"vocab_size": 67}),
    ("resize-up-tied", "tied", "resize", {"vocab_size": 67}),
    ("resize-down", "untied", "resize", {"vocab_size": 50, "force": True}),
    ("resize-pad", "untied", "resize", {"pad_to_multiple_of": 8}),
    ("resize-in-place", "untied", "resize", {"vocab_size": 67, "in_place": True}),
    ("tie-sharded", "untied-equal-sharded", "tie", {}),
    ("resize-up-sharded", "untied-sharded", "resize", {"vocab_size": 67}),
    ("resize-down-sharded", "untied-sharded", "resize", {"vocab_size": 50, "force": True}),
    ("untie-sharded", "untied-sharded", "untie", {}),
    ("resize-up-bf16", "untied-bf16", "resize", {"vocab_size": 67}),
    ("resize-in-place-bf16", "untied-bf16", "resize", {"pad_to_multiple_of": 16, "in_place": True}),
]
WRITES = [(f, c, op[0]) for f, c in CASES for op in OPS if op[1] in VARIANTS or f in EXTRA_FAMILIES]


@dataclass
class Write:
    src: Path
    out: Path | None = None
    refused: str | None = None  # tietool's refusal (exit code and message)
    load: dict = field(default_factory=dict)


def _write(case: Case, op: tuple[str, str, str, dict], root: Path) -> Write:
    name, variant, command, kw = op
    kw = dict(kw)
    src = case.dirs[variant]
    w = Write(src)
    if kw.pop("in_place", False):
        target = root / f"{case.family}_{case.container}_{name}" / "ckpt"
        shutil.copytree(src, target)
        out, where = target, None
    else:
        out = root / f"{case.family}_{case.container}_{name}"
        where = out
    if command == "resize":
        kw.setdefault("seed", 0)
    try:
        getattr(tietool, command)(src if where is not None else out, out=where, **kw)
        w.out = out
    except tietool.TietoolError as e:
        w.refused = f"exit {int(e.exit_code)}: {e}"
    return w


@pytest.fixture(scope="session")
def all_pnlp_writes(all_pnlp_cases, tmp_path_factory):
    """``of(build)``: :func:`writes_of` of that build, made once."""
    return _once(lambda b: writes_of(all_pnlp_cases(b), tmp_path_factory.mktemp(f"pnlp-writes{b}")))


@pytest.fixture
def pnlp_writes(request, all_pnlp_writes) -> dict[tuple[str, str, str], Write]:
    """The writes of the build of this test's family."""
    return all_pnlp_writes(_build_of(request.node.callspec.params["family"]))


def writes_of(pnlp_cases: dict[str, Case], root: Path) -> dict[tuple[str, str, str], Write]:
    """Every operation of :data:`OPS` on every case of ``pnlp_cases``, by tietool in this process; every
    output loaded by PaddleNLP 2.8.1 in one worker process."""
    writes, jobs = {}, []
    for case in pnlp_cases.values():
        f, c = case.family, case.container
        for op in (o for o in OPS if o[1] in case.dirs):
            w = writes[(f, c, op[0])] = _write(case, op, root)
            if w.out is not None:
                npz = root / f"{f}_{c}_{op[0]}.npz"
                jobs.append(
                    {"op": "load", "family": f, "dir": str(w.out), "npz": str(npz), "key": [f, c, op[0]]}
                )
    for job, res in zip(jobs, pnlp_support.run_jobs(jobs, root / "work"), strict=True):
        if res["ok"]:
            res["arrays"] = dict(np.load(job["npz"]))
        writes[tuple(job["key"])].load = res
    return writes


def _expected_refusal(op: str, facts) -> str | None:
    """The refusals the table calls for (a word of the message), None where the write must succeed:
    untie of a model whose loader always ties; tie of a T5 head equal to the embedding itself (the tied
    model scales the embedding by d_model ** -0.5, so the head is not a duplicate)."""
    if op.split("-")[0] == "untie" and facts.always_tied:
        return "always"
    if op.split("-")[0] == "tie" and facts.scales_tied_logits:
        return "scaled"
    return None


@pytest.mark.pnlp
@pytest.mark.slow
@pytest.mark.parametrize("family,container,op", WRITES, ids=["-".join(w) for w in WRITES])
def test_pnlp_writes_load(pnlp_cases, pnlp_writes, family, container, op):
    case = pnlp_cases[_key(family, container)]
    w = pnlp_writes[(family, container, op)]
    facts = lookup(case.model_type, LOADER, container)
    refusal = _expected_refusal(op, facts)
    if refusal:
        assert w.refused and w.refused.startswith("exit 5") and refusal in w.refused, w.refused
        return
    assert w.refused is None, w.refused
    res = w.load
    assert res["ok"], f"PaddleNLP 2.8.1 refuses tietool's {op} output: {res.get('error')}"
    variant = next(o[1] for o in OPS if o[0] == op)
    before = _arrays(case, variant)["logits"]
    after = res["arrays"]["logits"]
    np.testing.assert_allclose(after[..., :KEPT], before[..., :KEPT], rtol=1e-5, atol=1e-6)


@pytest.mark.pnlp
@pytest.mark.slow
@pytest.mark.parametrize("family,container", [c for c in CASES if c[0] in ("codegen", "gptj")])
@pytest.mark.parametrize("keep", ["head", "embedding"])
def test_pnlp_biased_head_tie_keep_refused(pnlp_cases, family, container, keep, tmp_path):
    """CodeGen / GPT-J (d07's kind): ``tie --keep`` of their own biased head is refused by name (the loader
    uses it whatever the flag says, so tie saves nothing and would overwrite trained values); nothing is
    written."""
    case = pnlp_cases[_key(family, container)]
    with pytest.raises(tietool.RefusedError, match="lm_head.bias") as e:
        tietool.tie(case.dirs["untied"], tmp_path / "out", keep=keep)
    assert e.value.exit_code == tietool.ExitCode.REFUSED and not (tmp_path / "out").exists()


def test_pnlp_rows_without_the_venv():
    """The rows the PaddleNLP proofs fixed, read from the table alone (runs without the venv): CodeGen and
    GPT-J have their own biased ``[hidden, vocab]`` head, never re-tied; QWen's is unbiased; RW, BART never
    re-tie an embedding-shaped head; ChatGLM v1 always ties; bfloat16 stays U16 for PaddleNLP 2.8."""
    from tietool.surgery.arch import U16_BFLOAT16_ONLY

    for model_type in ("codegen", "gptj", "qwen"):
        f = lookup(model_type, LOADER, "pdparams")
        assert (f.name, f.head_layout, f.reties, f.always_tied) == (model_type, "hidden-vocab", False, False)
        assert f.bias == (("lm_head.bias",) if model_type != "qwen" else ())
    for model_type in ("RefinedWeb", "bart"):
        f = lookup(model_type, LOADER, "safetensors")
        assert (f.head_layout, f.reties, f.always_tied) == ("vocab-hidden", False, False)
    assert lookup("chatglm", LOADER).always_tied and not lookup("chatglm", "hf").always_tied
    assert LOADER in U16_BFLOAT16_ONLY and "paddleformers" not in U16_BFLOAT16_ONLY
    info = tietool.inspect(paths.BUG_CASES_DIR / "d07_paddlenlp_codegen_head_bias/ckpt")
    assert info["head_bias"]["name"] == "lm_head.bias" and info["head"]["layout"] == "hidden-vocab"
    assert info["loader"]["reties_missing_head"] is False
