"""``tietool merge`` of expert-parallel rank files (``model_state.moe_sharding00.pdparams``, ...).

Rank files are cut from real state dicts: the d06 case's files (a Qwen3-MoE of 4 experts saved by the
PaddleFormers trainer with expert parallelism 2, experts numbered globally) and, in the slow test, Qwen3-MoE,
Qwen2-MoE and DeepSeek-V3 checkpoints of 4 experts written by PaddleFormers 1.2's own ``save_pretrained``
(``support/moe_builder.py``). Each is cut into 2 and 4 ranks, numbered globally and locally, and written as
``paddle.save`` writes a ``.pdparams`` (tietool's pickle writer: protocol 4, numpy ``_reconstruct``, with a
``StructuredToParameterName@@`` map of per-rank parameter names). The merge must give back every tensor of
the state dict bit for bit; what cannot be proven is refused naming the cause.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import paths
from support.adversarial_support import assert_refused, run_cli

import tietool
from tietool.surgery import arch
from tietool.surgery.io import pdparams, safetensors_io

D06 = paths.BUG_CASES_DIR / "d06_expert_parallel_rank_files" / "ckpt"


def read_all(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name → (stored dtype, shape, bytes) of every tensor in a folder's weight files."""
    out = {}
    for f in sorted(folder.glob("*.pdparams")):
        infos, _, _ = pdparams.read_header(f, f.name)
        for t in infos:
            out[t.name] = (t.dtype, t.shape, np.ascontiguousarray(pdparams.read_array(f, t)).tobytes())
    for f in sorted(folder.glob("*.safetensors")):
        infos, _ = safetensors_io.read_header(f, f.name)
        for t in infos:
            a = safetensors_io.read_array(f, t)
            out[t.name] = (a.dtype.name, t.shape, a.tobytes())
    return out


def arrays(path: Path) -> dict[str, np.ndarray]:
    infos, _, _ = pdparams.read_header(path, path.name)
    return {t.name: np.array(pdparams.read_array(path, t)) for t in infos}


def write_rank(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """One rank's file as ``paddle.save`` writes it, with a map to per-rank parameter names (each rank
    numbers its parameters from 0, as a separate process does)."""
    rows = [
        (n, a.dtype.name, a.shape, safetensors_io.Source(array=np.ascontiguousarray(a)), None, False)
        for n, a in tensors.items()
    ]
    s2p = {n: f"linear_{i}.w_0" for i, n in enumerate(tensors)}
    pdparams.write_file(path, rows, {"StructuredToParameterName@@": s2p})


def cut(
    full: dict[str, np.ndarray], n: int, local: bool, out: Path, config: dict, tag: str = "moe_sharding"
) -> Path:
    """``full`` cut into ``n`` expert-parallel rank files in ``out``: rank r holds experts r·E/n ..
    (r+1)·E/n - 1 of every MoE layer, named by their global id (``local`` False) or 0..E/n-1."""
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config))
    count = max(int(m["id"]) for k in full if (m := arch.EXPERT_NAME_RE.match(k))) + 1
    per = count // n
    for r in range(n):
        own = {}
        for name, a in full.items():
            m = arch.EXPERT_NAME_RE.match(name)
            if m is None:
                own[name] = a
            elif int(m["id"]) // per == r:
                j = int(m["id"]) - r * per if local else int(m["id"])
                own[f"{m['module']}.{j}.{m['rest']}"] = a
        write_rank(out / f"model_state.{tag}{r:02d}.pdparams", own)
    return out


def d06_full(tmp_path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """d06's whole state dict (the union of its two files, checked disjoint in experts) and config."""
    a, b = (
        arrays(D06 / "model_state.moe_sharding00.pdparams"),
        arrays(D06 / "model_state.moe_sharding01.pdparams"),
    )
    full = dict(a)
    for k, v in b.items():
        if k in full:
            assert full[k].tobytes() == v.tobytes(), k
        full[k] = v
    return full, json.loads((D06 / "config.json").read_text())


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def assert_same(got: Path, full: dict[str, np.ndarray]) -> None:
    merged = read_all(got)
    assert set(merged) == set(full)
    for k, a in full.items():
        assert merged[k] == (a.dtype.name, a.shape, a.tobytes()), k


# ------------------------------------------------------------------------------------------ merges
def test_d06_global_numbering_is_the_union(tmp_path):
    """d06 as the trainer wrote it: every expert once under its global number, the rest once."""
    full, _ = d06_full(tmp_path)
    rep = tietool.merge(D06, tmp_path / "out")
    assert_same(tmp_path / "out", full)
    assert rep["expert_parallel"] == 2 and rep["expert_numbering"] == ["global"]
    rules = {t["name"]: t["rule"] for t in rep["tensors"]}
    assert rules["model.layers.0.mlp.experts.3.down_proj.weight"] == "expert"
    assert rules["model.embed_tokens.weight"] == "replicated"
    _, extras, _ = pdparams.read_header(tmp_path / "out" / "model_state.pdparams", "model_state.pdparams")
    s2p = extras["StructuredToParameterName@@"]  # rank parameter names collide: experts map to themselves
    assert s2p["model.layers.0.mlp.experts.2.up_proj.weight"] == "model.layers.0.mlp.experts.2.up_proj.weight"
    assert s2p["model.embed_tokens.weight"] == "embedding_0.w_0"
    assert len(set(s2p.values())) == len(s2p)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("local", [False, True])
def test_cut_ranks_merge_back_bit_for_bit(tmp_path, n, local):
    full, config = d06_full(tmp_path)
    ranks = cut(full, n, local, tmp_path / "ranks", config)
    if local:  # each rank's file really holds experts 0..E/n-1
        assert "model.layers.0.mlp.experts.0.up_proj.weight" in arrays(
            ranks / f"model_state.moe_sharding0{n - 1}.pdparams"
        )
    rep = tietool.merge(ranks, tmp_path / "out")
    assert rep["expert_numbering"] == ["local" if local and n > 1 else "global"]
    assert_same(tmp_path / "out", full)


def test_paddlenlp_moe_tags_and_bf16(tmp_path):
    """PaddleNLP 2.8's ``moe00`` tag (one file per data-parallel rank) and bf16 bits (uint16) kept."""
    full, config = d06_full(tmp_path)
    full = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in full.items()}
    ranks = cut(full, 2, True, tmp_path / "ranks", {**config, "dtype": "bfloat16"}, tag="moe")
    tietool.merge(ranks, tmp_path / "out")
    assert_same(tmp_path / "out", full)


def test_every_rank_holding_every_expert_is_kept_once(tmp_path):
    full, config = d06_full(tmp_path)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "config.json").write_text(json.dumps(config))
    for r in range(2):
        write_rank(ranks / f"model_state.moe_sharding0{r}.pdparams", full)
    rep = tietool.merge(ranks, tmp_path / "out")
    assert rep["expert_numbering"] == ["replicated"]
    assert_same(tmp_path / "out", full)


def test_safetensors_rank_files(tmp_path):
    """``model.moe_sharding00.safetensors`` (the trainer's weight_name_suffix with safe serialization)."""
    full, config = d06_full(tmp_path)
    ranks = cut(full, 2, True, tmp_path / "pd", config)
    st = tmp_path / "st"
    st.mkdir()
    shutil.copy(ranks / "config.json", st)
    for r in range(2):
        f = ranks / f"model_state.moe_sharding0{r}.pdparams"
        infos, _, _ = pdparams.read_header(f, f.name)
        rows = [(t.name, "F32", t.shape, pdparams.raw_bytes_source(f, t)) for t in infos]
        safetensors_io.write_file(st / f"model.moe_sharding0{r}.safetensors", rows, {"format": "np"})
    rep = tietool.merge(st, tmp_path / "out")
    assert rep["index"] == "model.safetensors.index.json"
    assert_same(tmp_path / "out", full)


def test_merged_output_takes_the_other_commands(tmp_path):
    tietool.merge(D06, tmp_path / "m")
    rep = tietool.resize(tmp_path / "m", 20, tmp_path / "r")
    assert rep.changed and tietool.verify(tmp_path / "m", tmp_path / "r").explained


# ------------------------------------------------------------------------------------------ refusals
def refused(ranks: Path, tmp_path: Path, code: int, *words: str) -> None:
    before = digest(ranks)
    run = run_cli(["merge", ranks, "--out", tmp_path / "out"])
    assert_refused(run, code, list(words), out=tmp_path / "out")
    assert digest(ranks) == before


def test_refuses_a_replicated_tensor_that_differs(tmp_path):
    full, config = d06_full(tmp_path)
    ranks = cut(full, 2, False, tmp_path / "ranks", config)
    a = arrays(ranks / "model_state.moe_sharding01.pdparams")
    a["model.layers.0.mlp.gate.weight"][0, 0] += 1.0
    write_rank(ranks / "model_state.moe_sharding01.pdparams", a)
    refused(
        ranks, tmp_path, 5, "model.layers.0.mlp.gate.weight", "differs", "model_state.moe_sharding01.pdparams"
    )


def test_refuses_a_missing_rank(tmp_path):
    full, config = d06_full(tmp_path)
    ranks = cut(full, 4, True, tmp_path / "ranks", config)
    (ranks / "model_state.moe_sharding02.pdparams").unlink()
    refused(ranks, tmp_path, 3, "model_state.moe_sharding02.pdparams", "missing")


@pytest.mark.parametrize("local", [False, True])
def test_refuses_a_missing_last_rank(tmp_path, local):
    """The last rank's file gone: no gap in the names, but the experts do not add up to the config's."""
    full, config = d06_full(tmp_path)
    ranks = cut(full, 4, local, tmp_path / "ranks", config)
    (ranks / "model_state.moe_sharding03.pdparams").unlink()
    words = ["model.layers.0.mlp.experts", "num_local_experts = 4"]
    words += ["1 experts × 3 ranks = 3, not 4"] if local else ["no rank file holds expert(s) 3"]
    refused(ranks, tmp_path, 5, *words)


def test_config_expert_parallel_degree_checked_and_set_to_1(tmp_path):
    full, config = d06_full(tmp_path)
    ranks = cut(full, 4, True, tmp_path / "ranks", {**config, "expert_model_parallel_size": 4})
    rep = tietool.merge(ranks, tmp_path / "m")
    assert rep["config_changes"] == {"expert_model_parallel_size": [4, 1]}
    assert json.loads((tmp_path / "m" / "config.json").read_text())["expert_model_parallel_size"] == 1
    (ranks / "config.json").write_text(json.dumps({**config, "expert_model_parallel_size": 8}))
    refused(ranks, tmp_path, 3, "expert_model_parallel_size = 8", "missing")
    (ranks / "config.json").write_text(json.dumps({**config, "expert_model_parallel_size": 2}))
    refused(ranks, tmp_path, 5, "expert_model_parallel_size = 2", "4 expert rank files")


def test_refuses_local_numbering_without_an_expert_count(tmp_path):
    full, config = d06_full(tmp_path)
    del config["num_experts"]
    ranks = cut(full, 2, True, tmp_path / "ranks", config)
    refused(ranks, tmp_path, 5, "locally", "no expert count", "num_experts / num_local_experts")


def test_refuses_an_unknown_family(tmp_path):
    """A model type with no proven expert count is refused by name, naming the count keys its config has
    and every key tietool reads (never "add the number of experts" to a config that has it)."""
    full, config = d06_full(tmp_path)
    ranks = cut(full, 2, True, tmp_path / "ranks", {**config, "model_type": "mystery_moe"})
    refused(ranks, tmp_path, 5, "mystery_moe", "num_experts = 4", "n_routed_experts", "moe_num_experts")
    cut(
        full, 2, False, tmp_path / "ranks2", {"model_type": "kimi_k2", "text_config": {"n_routed_experts": 4}}
    )
    refused(tmp_path / "ranks2", tmp_path, 5, "kimi_k2", "text_config.n_routed_experts = 4", "unproven")


E10 = paths.BUG_CASES_DIR / "e10_ernie45_moe_expert_parallel_rank_files" / "ckpt"


def e10_full() -> tuple[dict[str, np.ndarray], dict]:
    """e10's whole state dict (PaddleFormers-written ERNIE-4.5-MoE, experts 0-1 and 2-3) and config."""
    full: dict[str, np.ndarray] = {}
    for r in range(2):
        for k, v in arrays(E10 / f"model_state.moe_sharding0{r}.pdparams").items():
            assert k not in full or full[k].tobytes() == v.tobytes(), k
            full[k] = v
    return full, json.loads((E10 / "config.json").read_text())


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("local", [False, True])
def test_ernie45_moe_num_experts_counts_the_experts(tmp_path, n, local):
    """ERNIE-4.5-MoE's moe_num_experts (e10's PaddleFormers-written files) proves the numbering: cut into
    n ranks, globally or locally numbered, the merge gives every tensor back bit for bit."""
    full, config = e10_full()
    assert config["moe_num_experts"] == 4 and arch.EXPERT_COUNT_KEYS["ernie4_5_moe"] == ("moe_num_experts",)
    ranks = cut(full, n, local, tmp_path / "ranks", {**config, "expert_model_parallel_size": n})
    rep = tietool.merge(ranks, tmp_path / "out")
    assert_same(tmp_path / "out", full)
    got = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (got["moe_num_experts"], got["expert_model_parallel_size"]) == (4, 1)
    assert rep["expert_numbering"] == ["local" if local and n > 1 else "global"]


@pytest.mark.parametrize(
    "value, said",
    [
        (2**64, "ids run 0..18446744073709551615"),
        (2**63 + 1, "no rank file holds expert(s) 9223372036854775805 of ids"),
        ([4, 4], "is not a positive integer"),
        (0, "is not a positive integer"),
    ],
)
def test_huge_or_odd_expert_counts_are_one_line_refusals(tmp_path, value, said):
    """A count beyond 2**63 (or a list, or 0) in config.json is refused in one line naming the key, never an
    OverflowError or a range of its size built."""
    full, config = e10_full()
    ranks = cut(full, 2, False, tmp_path / "ranks", {**config, "moe_num_experts": value})
    if value == 2**64:  # an id beyond the count too: rename expert 3 as 2**64
        a = arrays(ranks / "model_state.moe_sharding01.pdparams")
        write_rank(
            ranks / "model_state.moe_sharding01.pdparams",
            {k.replace("experts.3.", f"experts.{2**64}."): v for k, v in a.items()},
        )
        said = f"expert id {2**64} is beyond the count"
    run = run_cli(["merge", ranks, "--out", tmp_path / "out"])
    assert run.rc in (3, 5) and "Traceback" not in run.stderr, run.describe()
    assert len(run.stderr.strip().splitlines()) == 1 and "moe_num_experts" in run.stderr, run.describe()
    assert said in run.stderr, run.describe()
    assert not (tmp_path / "out").exists()


def test_refuses_overlapping_ids(tmp_path):
    full, config = d06_full(tmp_path)
    ranks = cut(full, 2, False, tmp_path / "ranks", config)
    a = arrays(ranks / "model_state.moe_sharding01.pdparams")
    write_rank(
        ranks / "model_state.moe_sharding01.pdparams",
        {k.replace("experts.3.", "experts.1."): v for k, v in a.items()},
    )
    refused(ranks, tmp_path, 5, "rank 0 0, 1; rank 1 1, 2", "neither global")


def test_refuses_expert_tags_with_tensor_parallel_ones(tmp_path):
    full, config = d06_full(tmp_path)
    ranks = cut(full, 2, False, tmp_path / "ranks", config)
    for r in range(2):
        (ranks / f"model_state.moe_sharding0{r}.pdparams").rename(
            ranks / f"model_state.tp00_moe_sharding0{r}.pdparams"
        )
    refused(ranks, tmp_path, 5, "expert-parallel", "tagged tp")


# ------------------------------------------------------------------------------------------ real checkpoints
@pytest.fixture(scope="module")
def built_moe(tmp_path_factory):
    """Every MoE family of ``moe_builder.EXPERT_KEYS`` with 4 experts, written by PaddleFormers 1.2 (one
    subprocess for all)."""
    from support import moe_builder

    return moe_builder.build(tmp_path_factory.mktemp("moe") / "built")


def _at(config: dict, dotted: str):
    for part in dotted.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


PNLP_MOE = {"mixtral": "num_local_experts"}
"""PaddleNLP 2.8.1 MoE families (built by ``support/pnlp_worker.py``) → their expert-count key."""


def _built(request, family: str, tmp_path: Path) -> Path:
    """The 4-expert checkpoint of ``family``: PaddleFormers 1.2's (``built_moe``) or PaddleNLP 2.8.1's."""
    if family not in PNLP_MOE:
        return request.getfixturevalue("built_moe")[family]
    from support import moe_builder, pnlp_support

    pnlp_support.require()
    out = tmp_path / "built" / family
    job = {"op": "build", "family": family, "tie": "untied", "container": "pdparams", "out": str(out)}
    res = pnlp_support.run_jobs([{**job, "cfg": {PNLP_MOE[family]: moe_builder.EXPERTS}}], tmp_path / "w")
    assert res[0]["ok"], res
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=[pytest.mark.pnlp] if f in PNLP_MOE else []) for f in sorted(arch.EXPERT_COUNTS)],
)
def test_real_moe_rank_files_merge_back_bit_for_bit(request, tmp_path, family):
    """Each model type of :data:`surgery.arch.EXPERT_COUNTS` (the node id its row names), built with 4
    experts and written by its library's own save (PaddleFormers 1.2; PaddleNLP 2.8.1 for mixtral), cut
    into 2 and 4 ranks as an expert-parallel save cuts them (rank r the r-th block of E/ep experts),
    numbered globally and locally, and into 2 ranks each holding every expert (PaddleNLP's moe00 files of a
    model whose experts are not split): each merge gives back the library's model_state.pdparams bit for
    bit. Proves the row's keys (the saved config's key counts the experts the library saves) and the
    expert names."""
    from support import moe_builder

    row = arch.EXPERT_COUNTS[family]
    assert row.proof.endswith(f"test_real_moe_rank_files_merge_back_bit_for_bit[{family}]")
    folder = _built(request, family, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert [_at(config, k) for k in row.keys if _at(config, k) is not None] == [moe_builder.EXPERTS]
    assert {**moe_builder.EXPERT_KEYS, **PNLP_MOE}[family] in row.keys
    full = arrays(folder / "model_state.pdparams")
    ids = {int(m["id"]) for k in full if (m := arch.EXPERT_NAME_RE.match(k))}
    assert ids == set(range(moe_builder.EXPERTS)), family
    tag = "moe" if family in PNLP_MOE else "moe_sharding"
    for n in (2, 4):
        for local in (False, True):
            where = tmp_path / f"{family}-{n}-{local}"
            cut(full, n, local, where / "ranks", {**config, "expert_model_parallel_size": n}, tag)
            rep = tietool.merge(where / "ranks", where / "out")
            assert_same(where / "out", full)
            assert rep["expert_numbering"] == ["local" if local else "global"]
            assert json.loads((where / "out" / "config.json").read_text())["expert_model_parallel_size"] == 1
    where = tmp_path / f"{family}-replicated"
    (where / "ranks").mkdir(parents=True)
    (where / "ranks" / "config.json").write_text(json.dumps(config))
    for r in range(2):
        write_rank(where / "ranks" / f"model_state.{tag}{r:02d}.pdparams", full)
    rep = tietool.merge(where / "ranks", where / "out")
    assert_same(where / "out", full)
    assert rep["expert_numbering"] == ["replicated"]


def test_every_expert_count_row_names_its_proof():
    """Every row of the table names the parametrized slow test that proves it (a node id that exists)."""
    proof = "tests/oracles/test_merge_experts.py::test_real_moe_rank_files_merge_back_bit_for_bit"
    for family, row in arch.EXPERT_COUNTS.items():
        assert row.proof == f"{proof}[{family}]"
        assert row.keys and set(row.keys) <= {
            *arch.SHIPPED_EXPERT_COUNT_KEYS,
            *(f"text_config.{k}" for k in arch.SHIPPED_EXPERT_COUNT_KEYS),
        }


@pytest.mark.parametrize("tag", ["moe_sharding", "tp"])
def test_a_rank_tag_of_any_size_is_a_missing_rank_not_a_range(tmp_path, tag):
    """A rank file tagged 99999999999999999999 beside rank 0 (expert-parallel or tensor-parallel): the
    ranks between are missing, refused in one line naming the first one, at once (no range of the tag)."""
    full, config = d06_full(tmp_path)
    ranks = cut(full, 2, False, tmp_path / "ranks", config)
    if tag == "tp":
        for r in range(2):
            (ranks / f"model_state.moe_sharding0{r}.pdparams").rename(ranks / f"model_state.tp0{r}.pdparams")
        (ranks / "model_state.tp01.pdparams").rename(ranks / f"model_state.tp{'9' * 20}.pdparams")
    else:
        (ranks / "model_state.moe_sharding01.pdparams").rename(
            ranks / f"model_state.moe_sharding{'9' * 20}.pdparams"
        )
    run = run_cli(["merge", ranks, "--out", tmp_path / "out"], timeout=60)
    assert run.rc == 3 and len(run.stderr.strip().splitlines()) == 1, run.describe()
    assert f"model_state.{tag}01.pdparams is missing" in run.stderr or (
        tag == "tp" and "model_state.tp01.pdparams" in run.stderr
    ), run.describe()
    assert not (tmp_path / "out").exists()
