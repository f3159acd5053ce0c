"""``tietool merge``: tensor-parallel (and pipeline) rank files back into the checkpoint they were cut from.

The rank files in ``tests/data/tp_ranks`` were cut from real PaddleFormers 1.2 checkpoints by PaddleFormers'
own split functions, with the arguments PaddleNLP's ``_get_tensor_parallel_mappings`` passes
(``tests/data/tools/make_tp_ranks.py``); the unsplit originals are committed beside them. A merge must give
back every original tensor bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import paths
from typer.testing import CliRunner

import tietool
from tietool.cli.app import app
from tietool.surgery.io import pdparams, safetensors_io
from tietool.surgery.io.safetensors_io import Source
from tietool.surgery.plan import merge as merge_mod
from tietool.surgery.plan import recipes

TP = paths.DATA / "tp_ranks"
VARIANTS = ("llama_fp32", "llama_bf16", "llama_fused_fp32", "qwen2_fused_fp32", "qwen2_bf16", "phi3_fp32")
SPLITS = ("tp2", "tp4", "tp2pp2")
C05 = paths.BUG_CASES_DIR / "c05_paddlenlp_tp_rank_files" / "ckpt"


def tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name → (stored dtype, shape, C-order bytes) of every tensor in a folder's .pdparams files."""
    out = {}
    for f in sorted(folder.glob("*.pdparams")):
        infos, _, _ = pdparams.read_header(f, f.name)
        for t in infos:
            a = np.ascontiguousarray(pdparams.read_array(f, t))
            out[t.name] = (t.dtype, t.shape, a.tobytes())
    return out


def tree_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ranks"
    shutil.copytree(src, dst)
    return dst


def cli(*args) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def rules(rep: dict) -> dict[str, tuple[str, int | None]]:
    return {t["name"]: (t["rule"], t["axis"]) for t in rep["tensors"]}


# ------------------------------------------------------------------------------------------ bit for bit
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_merge_gives_back_the_original_bit_for_bit(tmp_path, variant, split):
    src = TP / variant / split
    before = tree_digest(src)
    rep = tietool.merge(src, tmp_path / "out")
    original = tensors(TP / variant / "original")
    merged = tensors(tmp_path / "out")
    assert list(merged) == list(original)  # the same names, in the original's order
    for name, (dtype, shape, data) in original.items():
        assert merged[name][0] == dtype, name  # bf16 stays uint16 bits
        assert merged[name][1] == shape, name
        assert merged[name][2] == data, name
    assert tree_digest(src) == before
    assert (tmp_path / "out" / "model_state.pdparams").is_file()
    stored = json.loads((tmp_path / "out" / "tietool-report.json").read_text())
    assert stored["tensors"] == rep["tensors"] and len(rep["tensors"]) == len(original)
    assert rep["tensor_parallel"] == (4 if split == "tp4" else 2)
    assert rep["pipeline_parallel"] == (2 if split == "tp2pp2" else 1)


@pytest.mark.parametrize(
    ("variant", "split", "name", "rule", "axis"),
    [
        ("llama_fp32", "tp2", "model.embed_tokens.weight", "vocab", 0),
        ("llama_fp32", "tp2", "lm_head.weight", "head", 0),  # PaddleFormers legacy head [vocab, hidden]
        ("llama_fp32", "tp2", "model.layers.0.self_attn.k_proj.weight", "column", 1),
        ("llama_fp32", "tp4", "model.layers.0.self_attn.k_proj.weight", "replicated", None),  # kv 2 % 4
        ("llama_fp32", "tp2", "model.layers.1.mlp.down_proj.weight", "row", 0),
        ("llama_fp32", "tp2", "model.norm.weight", "replicated", None),
        ("llama_fused_fp32", "tp4", "lm_head.weight", "head", 1),  # PaddleNLP head [hidden, vocab]
        ("llama_fused_fp32", "tp4", "llama.layers.0.self_attn.qkv_proj.weight", "column", 1),
        ("llama_fused_fp32", "tp4", "llama.layers.0.mlp.gate_up_fused_proj.weight", "fused-2", 1),
        ("qwen2_fused_fp32", "tp2", "model.layers.0.self_attn.qkv_proj.bias", "column", 0),
        ("qwen2_fused_fp32", "tp4", "model.layers.1.mlp.up_gate_proj.weight", "fused-2", 1),
        ("qwen2_bf16", "tp2", "model.layers.0.self_attn.v_proj.bias", "column", 0),
        ("phi3_fp32", "tp4", "model.layers.0.self_attn.qkv_proj.weight", "fused-3", 1),
        ("phi3_fp32", "tp2", "model.layers.0.mlp.gate_up_proj.weight", "fused-2", 1),
    ],
)
def test_report_names_each_rule_and_axis(tmp_path, variant, split, name, rule, axis):
    rep = tietool.merge(TP / variant / split, tmp_path / "out")
    assert rules(rep)[name] == (rule, axis)


def test_fused_kinds_are_not_a_plain_concatenation():
    """The interleaving matters: concatenating the gate-up / GQA qkv slices as they are gives other bytes
    than the original (so the bit-for-bit test above checks the fused rules, not only the concatenation)."""
    original = tensors(TP / "phi3_fp32" / "original")
    for name in ("model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"):
        slices = []
        for r in range(2):
            f = TP / "phi3_fp32" / "tp2" / f"model_state.tp0{r}.pdparams"
            infos, _, _ = pdparams.read_header(f, f.name)
            slices.append(pdparams.read_array(f, next(t for t in infos if t.name == name)))
        plain = np.concatenate(slices, axis=1)
        assert plain.tobytes() != original[name][2], name


def test_config_parallel_degree_is_neutralised_and_said(tmp_path):
    src = TP / "qwen2_fused_fp32" / "tp4"
    assert json.loads((src / "config.json").read_text())["tensor_parallel_degree"] == 4
    code, out, _err = cli("merge", src, "--out", tmp_path / "out")
    assert code == 0
    assert "config.json: tensor_parallel_degree 4 -> 1" in out
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["tensor_parallel_degree"] == 1
    assert cfg["vocab_size"] == 48 and cfg["model_type"] == "qwen2"


def test_sharded_output_with_index(tmp_path):
    rep = tietool.merge(TP / "llama_fp32" / "tp2", tmp_path / "out", max_shard_size="8KB")
    out = tmp_path / "out"
    assert len(rep["weight_files"]) > 1 and rep["index"] == "model_state.pdparams.index.json"
    index = json.loads((out / rep["index"]).read_text())
    assert set(index["weight_map"]) == set(tensors(TP / "llama_fp32" / "original"))
    assert tensors(out) == tensors(TP / "llama_fp32" / "original")


def test_axis0_joins_are_byte_ranges_not_arrays():
    """An embedding / row-parallel merge streams the ranks' byte ranges (no array in memory)."""
    src = TP / "llama_fp32" / "tp4"
    names = {p.name for p in src.iterdir()}
    container, groups = merge_mod.find_ranks(src, names)
    by_tp, _ = merge_mod.read_ranks(src, container, groups)
    config = json.loads((src / "config.json").read_text())
    plan = {m.name: m for m in merge_mod.plan(src, config, by_tp)}
    emb = recipes.make(plan["model.embed_tokens.weight"].recipe, None, {})
    assert isinstance(emb, Source) and emb.parts is not None and len(emb.parts) == 4
    assert all(p.array is None and p.path is not None for p in emb.parts)
    col = recipes.make(plan["model.layers.0.self_attn.q_proj.weight"].recipe, None, {})
    assert isinstance(col, np.ndarray) and col.shape == (16, 16)


# ------------------------------------------------------------------------------------------ afterwards
def test_c05_merge_then_resize(tmp_path):
    before = tree_digest(C05)
    code, _, err = cli("merge", C05, "--out", tmp_path / "m")
    assert code == 0, err
    r0 = C05 / "model_state.tp00.pdparams"
    r1 = C05 / "model_state.tp01.pdparams"
    slices = []
    for f in (r0, r1):
        infos, _, _ = pdparams.read_header(f, f.name)
        slices.append({t.name: pdparams.read_array(f, t) for t in infos})
    merged = tensors(tmp_path / "m")
    emb = np.frombuffer(merged["llama.embed_tokens.weight"][2], dtype=np.float32).reshape(16, 6)
    assert np.array_equal(emb[:8], slices[0]["llama.embed_tokens.weight"])
    assert np.array_equal(emb[8:], slices[1]["llama.embed_tokens.weight"])
    head = np.frombuffer(merged["lm_head.weight"][2], dtype=np.float32).reshape(6, 16)
    assert np.array_equal(head[:, :8], slices[0]["lm_head.weight"])
    assert np.array_equal(head[:, 8:], slices[1]["lm_head.weight"])

    code, _, err = cli("resize", tmp_path / "m", "--vocab", "20", "--out", tmp_path / "r", "-q")
    assert code == 0, err
    resized = tensors(tmp_path / "r")
    remb = np.frombuffer(resized["llama.embed_tokens.weight"][2], dtype=np.float32).reshape(20, 6)
    assert remb[:16].tobytes() == emb.tobytes()
    code, out, err = cli("verify", tmp_path / "m", tmp_path / "r")
    assert code == 0, out + err
    assert json.loads((tmp_path / "r" / "config.json").read_text())["vocab_size"] == 20
    assert tree_digest(C05) == before


def test_tie_untie_resize_on_merged_checkpoints(tmp_path):
    """The merged folders are ordinary checkpoints: resize, tie and untie take them, and verify explains
    each. (Their heads differ from the embeddings, so tie needs keep=...; verify explains the dropped head as
    the one ``tie --keep embedding`` discards, which the output's report records, and says so.)"""
    tietool.merge(TP / "llama_fp32" / "tp2", tmp_path / "m")
    tietool.resize(tmp_path / "m", 64, tmp_path / "m64")
    assert tensors(tmp_path / "m64")["lm_head.weight"][1] == (64, 16)
    assert tietool.verify(tmp_path / "m", tmp_path / "m64").explained
    tietool.merge(TP / "qwen2_fused_fp32" / "tp4", tmp_path / "q")
    tietool.resize(tmp_path / "q", 64, tmp_path / "q64")
    assert tensors(tmp_path / "q64")["model.embed_tokens.weight"][1] == (64, 16)
    assert tietool.verify(tmp_path / "q", tmp_path / "q64").explained
    tietool.merge(TP / "llama_bf16" / "tp2pp2", tmp_path / "b")
    rep = tietool.tie(tmp_path / "b", tmp_path / "bt", keep="embedding", loader="paddleformers")
    assert rep.changed and "lm_head.weight" not in tensors(tmp_path / "bt")
    lossy = tietool.verify(tmp_path / "b", tmp_path / "bt")
    assert [d["name"] for d in lossy.dropped] == ["lm_head.weight"] and lossy.explained
    assert lossy.dropped[0]["equals_embedding"] is False and lossy.dropped[0]["discarded_by_tie"]
    tietool.untie(tmp_path / "bt", tmp_path / "bu", loader="paddleformers")
    untied = tensors(tmp_path / "bu")
    assert untied["lm_head.weight"][2] == untied["model.embed_tokens.weight"][2]  # [vocab, hidden] copy
    assert tietool.verify(tmp_path / "bt", tmp_path / "bu").explained


# ------------------------------------------------------------------------------------------ refusals
def rewrite(path: Path, change) -> None:
    """Rewrite a rank file with ``change(dict name → array)`` applied (our writer; no paddle)."""
    infos, extras, module = pdparams.read_header(path, path.name)
    arrays = {t.name: np.array(pdparams.read_array(path, t)) for t in infos}
    change(arrays)
    rows = [
        (n, a.dtype.name, a.shape, safetensors_io.Source(array=np.ascontiguousarray(a)), None, False)
        for n, a in arrays.items()
    ]
    pdparams.write_file(path, rows, extras, module)


def refuse(ranks: Path, tmp_path: Path, code: int, *words: str) -> str:
    """Run the CLI merge; it must fail with ``code``, say one line holding ``words``, write nothing and
    leave the input as it was."""
    before = tree_digest(ranks)
    got, _out, err = cli("merge", ranks, "--out", tmp_path / "out")
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert tree_digest(ranks) == before
    return lines[0]


def test_refuses_a_missing_rank_file(tmp_path):
    ranks = copy(TP / "llama_fp32" / "tp4", tmp_path)
    (ranks / "model_state.tp02.pdparams").unlink()
    line = refuse(ranks, tmp_path, 3, "model_state.tp02.pdparams", "missing")
    assert "rename" not in line


def test_refuses_missing_last_ranks_that_config_counts(tmp_path):
    ranks = copy(TP / "llama_fp32" / "tp4", tmp_path)
    (ranks / "model_state.tp03.pdparams").unlink()
    refuse(ranks, tmp_path, 3, "tensor_parallel_degree = 4", "missing")


def test_refuses_a_missing_pipeline_rank(tmp_path):
    ranks = copy(TP / "qwen2_bf16" / "tp2pp2", tmp_path)
    (ranks / "model_state.tp01_pp01.pdparams").unlink()
    refuse(ranks, tmp_path, 3, "model_state.tp01_pp01.pdparams", "missing")


def test_refuses_a_replicated_tensor_that_differs(tmp_path):
    ranks = copy(TP / "qwen2_fused_fp32" / "tp2", tmp_path)

    def bump(a):
        a["model.layers.1.input_layernorm.weight"][3] += 1

    rewrite(ranks / "model_state.tp01.pdparams", bump)
    refuse(
        ranks, tmp_path, 5, "model.layers.1.input_layernorm.weight", "model_state.tp01.pdparams", "differs"
    )


def test_refuses_pipeline_copies_that_differ(tmp_path):
    ranks = copy(TP / "llama_fp32" / "tp2pp2", tmp_path)

    def add(a):
        a["model.norm.weight"] = np.zeros(16, dtype=np.float32)

    rewrite(ranks / "model_state.tp00_pp00.pdparams", add)  # pp01 holds the real norm
    refuse(ranks, tmp_path, 5, "model.norm.weight", "model_state.tp00_pp01.pdparams", "differs")


def test_refuses_a_shape_that_does_not_fit_the_config(tmp_path):
    ranks = copy(TP / "llama_fp32" / "tp2", tmp_path)
    cfg = json.loads((ranks / "config.json").read_text())
    (ranks / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=32)))
    refuse(
        ranks, tmp_path, 5, "model.layers.0.mlp.gate_proj.weight", "model_state.tp00.pdparams", "config.json"
    )


def test_refuses_an_unknown_tensor(tmp_path):
    ranks = copy(TP / "llama_fp32" / "tp2", tmp_path)
    for r in range(2):

        def add(a):
            a["model.layers.0.mlp.mystery.weight"] = np.ones((16, 4), dtype=np.float32)

        rewrite(ranks / f"model_state.tp0{r}.pdparams", add)
    refuse(
        ranks, tmp_path, 5, "model.layers.0.mlp.mystery.weight", "model_state.tp00.pdparams", "does not know"
    )


def test_refuses_an_unknown_family(tmp_path):
    ranks = copy(TP / "llama_fp32" / "tp2", tmp_path)
    cfg = json.loads((ranks / "config.json").read_text())
    (ranks / "config.json").write_text(json.dumps(dict(cfg, model_type="gpt2")))
    refuse(ranks, tmp_path, 5, "config.json", "'gpt2'")


def test_refuses_a_config_without_model_type(tmp_path):
    """No model_type: one line naming config.json and what to add (it said "not model_type None" and
    pointed to the training library); exit 3, a bad checkpoint."""
    ranks = copy(TP / "llama_fp32" / "tp2", tmp_path)
    cfg = json.loads((ranks / "config.json").read_text())
    del cfg["model_type"]
    (ranks / "config.json").write_text(json.dumps(cfg))
    line = refuse(
        ranks, tmp_path, 3, f"{ranks / 'config.json'}: config.json has no model_type", 'add "model_type"'
    )
    assert "None" not in line


@pytest.mark.parametrize("key", ["vocab_size", "intermediate_size", "num_attention_heads"])
def test_refuses_a_config_without_a_size_by_its_key(tmp_path, key):
    """A size missing from config.json is named by its key (it said "lacks the sizes V")."""
    ranks = copy(TP / "llama_fp32" / "tp2", tmp_path)
    cfg = json.loads((ranks / "config.json").read_text())
    del cfg[key]
    (ranks / "config.json").write_text(json.dumps(cfg))
    line = refuse(ranks, tmp_path, 3, f"{ranks / 'config.json'}: config.json lacks {key}", f"add {key}")
    assert "sizes" not in line and " V " not in line


def test_dry_run_plans_and_writes_nothing(tmp_path):
    """--dry-run (a common option; merge lacked it: "No such option") reads and checks every rank file,
    prints the plan and writes nothing; the report names the files a run would write."""
    ranks = copy(TP / "llama_fp32" / "tp2pp2", tmp_path)
    before = tree_digest(ranks)
    code, out, err = cli("merge", ranks, "--out", tmp_path / "out", "--dry-run", "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["dry_run"] is True and rep["weight_files"] == ["model_state.pdparams"]
    assert rep["index"] is None and rep["rank_files"] == sorted(p.name for p in ranks.glob("*.pdparams"))
    original = tensors(TP / "llama_fp32" / "original")
    assert rep["total_size"] == sum(len(b) for _, _, b in original.values())
    assert {t["name"] for t in rep["tensors"]} == set(original)
    assert not (tmp_path / "out").exists() and tree_digest(ranks) == before
    assert not [p for p in tmp_path.iterdir() if "tietool" in p.name]
    code, out, err = cli("merge", ranks, "--out", tmp_path / "out", "--dry-run", "--max-shard-size", "2KB")
    assert code == 0 and "dry run: would merge 4 rank files" in out and "nothing was written" in out, err
    assert "model_state-00001-of-" in out and not (tmp_path / "out").exists()
    rep = tietool.merge(ranks, tmp_path / "out", dry_run=True)
    assert rep["dry_run"] is True and not (tmp_path / "out").exists()
    # still refuses a broken input, and still needs --out
    (ranks / "model_state.tp01_pp01.pdparams").unlink()
    code, _, err = cli("merge", ranks, "--out", tmp_path / "out", "--dry-run")
    assert code == 3 and "model_state.tp01_pp01.pdparams" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("merge", ranks, "--dry-run")
    assert code == 2 and "--out" in err


def test_refuses_a_folder_without_rank_files(tmp_path):
    refuse(paths.CASES_DIR / "pnlp_llama_untied", tmp_path, 2, "no tensor- or pipeline-parallel rank files")


def test_other_commands_point_to_merge():
    code, _, err = cli("inspect", C05)
    assert code == 5
    assert "tietool merge" in err and "rename" not in err


def test_safetensors_rank_files_merge_into_safetensors(tmp_path):
    """Rank files in safetensors (``model.tp00.safetensors``, Paddle layout, as PaddleNLP's
    ``save_pretrained(safe_serialization=True)`` names a rank's file) merge the same way, into safetensors."""
    src = tmp_path / "st"
    src.mkdir()
    shutil.copy(TP / "qwen2_bf16" / "tp2" / "config.json", src / "config.json")
    for r in range(2):
        f = TP / "qwen2_bf16" / "tp2" / f"model_state.tp0{r}.pdparams"
        infos, _, _ = pdparams.read_header(f, f.name)
        rows = [(t.name, "BF16", t.shape, pdparams.raw_bytes_source(f, t)) for t in infos]
        safetensors_io.write_file(src / f"model.tp0{r}.safetensors", rows, {"format": "np"})
    rep = tietool.merge(src, tmp_path / "out")
    assert rep["index"] == "model.safetensors.index.json"
    out = tmp_path / "out" / rep["weight_files"][0]
    infos, meta = safetensors_io.read_header(out, out.name)
    assert meta == {"format": "np"}
    original = tensors(TP / "qwen2_bf16" / "original")
    got = {t.name: (t.dtype, t.shape, safetensors_io.read_array(out, t).tobytes()) for t in infos}
    assert set(got) == set(original)
    for name, (_dtype, shape, data) in original.items():
        assert got[name] == ("BF16", shape, data), name


def test_refuses_pipeline_layer_names(tmp_path):
    """Pipeline files saved without PaddleNLP's name mapping hold PipelineLayer names (``0.weight``,
    ``1.self_attn...``): refused with that cause, not merged by guess."""
    ranks = copy(TP / "llama_fp32" / "tp2pp2", tmp_path)
    for r in range(2):

        def rename(a):
            a["1.self_attn.q_proj.weight"] = a.pop("model.layers.0.self_attn.q_proj.weight")

        rewrite(ranks / f"model_state.tp0{r}_pp00.pdparams", rename)
    refuse(
        ranks,
        tmp_path,
        5,
        "1.self_attn.q_proj.weight",
        "pipeline-layer name",
        "model_state.tp00_pp00.pdparams",
    )
