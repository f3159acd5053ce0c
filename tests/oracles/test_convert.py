"""``tietool convert`` (issue 12 part 1): PaddleNLP 2.x ↔ PaddleFormers conventions, and container changes.

* Layout: every PaddleNLP Llama fixture converted ``--to paddleformers`` has ``model.`` names, every Linear
  weight and the head transposed byte for byte (bf16 bits moved, never converted), embeddings/norms copied,
  and the report lists every renamed and transposed tensor.
* Round trips are bit-identical: pnlp → paddleformers → paddlenlp gives the input's tensors (names, dtypes,
  bytes); pf → paddlenlp → paddleformers too; safetensors ↔ pdparams container changes.
* PaddleNLP fused ``qkv_proj`` (grouped per kv head, GQA) and ``gate_up_fused_proj`` unfuse to what the
  unfused checkpoint gives.
* Refusals: exit non-zero, one line naming the folder and a fix, no output left, input untouched.
* tie/untie/resize work on a converted output, and ``verify`` explains the resize.
* Slow: the converted PaddleNLP fixtures load in PaddleFormers 1.2 with plain ``from_pretrained`` and give
  the stored PaddleNLP 2.8 logits within 1e-5; the converted legacy ``.pdparams`` gives, bit for bit, the
  logits of the legacy load of the input in the same run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import convert_loads, paths, pnlp_support
from support import fixture_support as fs

import tietool
from tietool.surgery.io import pdparams
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.io.safetensors_io import Source
from tietool.surgery.plan import convert as cv
from tietool.surgery.plan import recipes
from tietool.surgery.plan.plan import DEFAULT_MAX_SHARD_SIZE
from tietool.surgery.plan.recipes import CopyOf

PNLP_LLAMA = ["pnlp_llama_untied", "pnlp_llama_tied", "pnlp_llama_untied_bf16", "pnlp_llama_untied_sharded"]
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _is_linear(name: str) -> bool:
    return name == "lm_head.weight" or any(name.endswith(f".{p}.weight") for p in LINEAR)


def _run(src: Path, tmp: Path, to: str, *extra: str) -> fs.ToolRun:
    return fs.run_on_copy(src, tmp, "convert", ["--to", to, *extra])


def _ok(run: fs.ToolRun) -> fs.ToolRun:
    assert run.rc == 0, run.describe()
    assert run.hashes_before == run.hashes_after, "the input was modified"
    return run


def _same_tensors(a: Path, b: Path) -> None:
    """Names, dtypes (the storage label: uint16 stays uint16, BF16 stays BF16), shapes and bytes equal."""
    ta, tb = fs.read_checkpoint(a), fs.read_checkpoint(b)
    assert sorted(ta) == sorted(tb)
    for n in ta:
        assert (ta[n].dtype, ta[n].shape) == (tb[n].dtype, tb[n].shape), n
        assert ta[n].data == tb[n].data, f"{n}: bytes differ"


# ------------------------------------------------------------------------------------------ layout and names
@pytest.mark.parametrize("name", PNLP_LLAMA)
def test_paddlenlp_to_paddleformers_layout(name, tmp_path):
    run = _ok(_run(paths.CASES_DIR / name, tmp_path / "w", "paddleformers"))
    src, out = fs.read_checkpoint(run.inp), fs.read_checkpoint(run.out)
    assert sorted(out) == sorted(n.replace("llama.", "model.", 1) for n in src)
    bf16 = "bf16" in name
    for n, t in src.items():
        o = out[n.replace("llama.", "model.", 1)]
        assert o.dtype == ("BF16" if bf16 else "F32"), (n, o.dtype)
        if _is_linear(n):
            assert o.shape == t.shape[::-1] and o.data == t.transposed_bytes(), n
        else:
            assert o.shape == t.shape and o.data == t.data, n
    assert out["lm_head.weight"].shape == (
        fs.config_of(run.inp)["vocab_size"],
        16 if "sharded" not in name else 32,
    )
    rep = run.report()
    assert {(r["from"], r["to"]) for r in rep["renamed"]} == {
        (n, n.replace("llama.", "model.", 1)) for n in src if n.startswith("llama.")
    }
    assert sorted(x["name"] for x in rep["transposed"]) == sorted(
        n.replace("llama.", "model.", 1) for n in src if _is_linear(n)
    )
    cfg = fs.config_of(run.out)
    assert cfg["tie_word_embeddings"] is False and cfg["model_type"] == "llama"
    assert ("torch_dtype" in cfg and "dtype" not in cfg) if bf16 else "dtype" not in cfg
    assert (run.out / "generation_config.json").read_bytes() == (
        run.inp / "generation_config.json"
    ).read_bytes()
    for table_row in ("llama.layers.0.mlp.gate_proj.weight", "lm_head.weight"):
        assert table_row in run.stdout, f"the terminal table does not list {table_row}"


def test_tied_paddlenlp_llama_is_untied_for_paddleformers(tmp_path):
    """PaddleNLP 2.8 Llama used its own (different) head under tie_word_embeddings true (README L11);
    PaddleFormers would ignore it, so the output says untied, and the report says why."""
    run = _ok(_run(paths.CASES_DIR / "pnlp_llama_tied", tmp_path / "w", "paddleformers"))
    assert fs.config_of(run.inp)["tie_word_embeddings"] is True
    assert fs.config_of(run.out)["tie_word_embeddings"] is False
    rep = run.report()
    assert {"key": "tie_word_embeddings", "before": True, "after": False} in rep["config_changes"]
    assert any("PaddleNLP 2.8 used this checkpoint's own head" in n for n in rep["notes"])


def test_untransposed_tensors_are_byte_ranges_and_bf16_moves_bits():
    ck = Checkpoint.open(paths.CASES_DIR / "pnlp_llama_untied_bf16")
    plan = cv.plan_convert(ck, cv.Target.PADDLEFORMERS)
    by_out = {t.name: t for t in plan.tensors}
    emb = by_out["model.embed_tokens.weight"]
    assert not cv.reshaped(emb) and emb.recipe == CopyOf("llama.embed_tokens.weight")
    src = recipes.make(emb.recipe, ck, {})
    assert src.array is None and src.path is not None and src.nbytes == 100 * 16 * 2
    gate = by_out["model.layers.0.mlp.gate_proj.weight"]
    arr = recipes.make(gate.recipe, ck, {})
    assert isinstance(arr, np.ndarray) and arr.dtype == np.uint16 and arr.shape == (32, 16)
    assert np.array_equal(arr, ck.load("llama.layers.0.mlp.gate_proj.weight").T)


def test_legacy_pdparams_to_paddleformers(tmp_path):
    """HF names in Paddle layout: names kept, Linear weights transposed, the [vocab, hidden] head kept, and
    the shapes are those of PaddleFormers' own safetensors of the same model (pf_llama_untied_fp32)."""
    run = _ok(_run(paths.CASES_DIR / "pf_llama_untied_legacy_pdparams", tmp_path / "w", "paddleformers"))
    src, out = fs.read_checkpoint(run.inp), fs.read_checkpoint(run.out)
    assert sorted(src) == sorted(out)
    ref = fs.read_checkpoint(paths.CASES_DIR / "pf_llama_untied_fp32")
    for n, t in src.items():
        want = t.transposed_bytes() if _is_linear(n) and n != "lm_head.weight" else t.data
        assert out[n].data == want, n
        assert out[n].shape == ref[n].shape, n
    assert "source" not in fs.config_of(run.out)
    assert [r for r in run.report()["renamed"]] == []


def test_safetensors_in_paddle_layout_converts_like_the_pdparams(tmp_path):
    """legacy .pdparams --to safetensors keeps names, layouts and config (source: paddle); converting that
    --to paddleformers gives what converting the .pdparams gives."""
    kept = _ok(_run(paths.CASES_DIR / "pf_llama_untied_legacy_pdparams", tmp_path / "a", "safetensors"))
    assert fs.config_of(kept.out)["source"] == "paddle"
    _same_tensors_as_values(kept.inp, kept.out)
    via = _ok(_run(kept.out, tmp_path / "b", "paddleformers"))
    direct = _ok(_run(paths.CASES_DIR / "pf_llama_untied_legacy_pdparams", tmp_path / "c", "paddleformers"))
    _same_tensors(via.out, direct.out)


def _same_tensors_as_values(a: Path, b: Path) -> None:
    """Same names, shapes and bytes; dtype labels may be the two containers' spellings (float32 / F32)."""
    ta, tb = fs.read_checkpoint(a), fs.read_checkpoint(b)
    assert sorted(ta) == sorted(tb)
    spell = {"float32": "F32", "uint16": "BF16", "F32": "F32", "BF16": "BF16"}
    for n in ta:
        assert spell[ta[n].dtype] == spell[tb[n].dtype] and ta[n].shape == tb[n].shape, n
        assert ta[n].data == tb[n].data, n


def test_paddle_layout_without_source_key_is_proven_from_shapes(tmp_path):
    """A safetensors in the Paddle layout whose config lost ``source: paddle`` (it claimed the HF layout and
    was refused, or with a square config copied as HF): the shapes of gate/up/down prove [in, out], so it
    converts as the .pdparams does, and the report says what proved it."""
    kept = _ok(_run(paths.CASES_DIR / "pf_llama_untied_legacy_pdparams", tmp_path / "a", "safetensors"))
    cfg = fs.config_of(kept.out)
    del cfg["source"]
    (kept.out / "config.json").write_text(json.dumps(cfg))
    via = _ok(_run(kept.out, tmp_path / "b", "paddleformers"))
    direct = _ok(_run(paths.CASES_DIR / "pf_llama_untied_legacy_pdparams", tmp_path / "c", "paddleformers"))
    _same_tensors(via.out, direct.out)
    rep = via.report()
    assert rep["layout"] == "[in, out]" and rep["from_convention"] == "PaddleFormers legacy (Paddle layout)"
    assert any("proven by the shapes of 3 of them" in n and "4 square ones" in n for n in rep["notes"])


def test_shape_that_fits_neither_layout_is_refused(tmp_path, fixture_copy):
    """config.json's intermediate_size no longer matches the files: down_proj [16, 32] is neither [48, 16]
    nor [16, 48], so no layout is claimed (exit 3, the tensor, the sizes and the count of others named)."""
    ck = fixture_copy("pf_llama_untied_fp32")
    (ck / "config.json").write_text(json.dumps({**fs.config_of(ck), "intermediate_size": 48}))
    run = fs.run_tool(["convert", ck, "--to", "paddlenlp", "--out", tmp_path / "o"])
    assert run.returncode == 3, run.stdout + run.stderr
    assert (
        "down_proj.weight is [16, 32], which is neither [intermediate_size, hidden_size] = [48, 16]"
        in run.stderr
    )
    assert "(2 more)" in run.stderr
    assert not (tmp_path / "o").exists()


def test_weights_in_two_layouts_are_refused(tmp_path):
    """One Linear weight transposed (an export that missed one, d11's story): the shapes prove both layouts,
    and convert refuses naming one weight of each instead of transposing half of them the wrong way."""
    ck = Checkpoint.open(paths.CASES_DIR / "pnlp_llama_untied")
    arrays = {n: ck.load(n) for n in ck.tensors}
    arrays["llama.layers.0.mlp.down_proj.weight"] = np.ascontiguousarray(
        arrays["llama.layers.0.mlp.down_proj.weight"].T
    )
    src = _write_pnlp(tmp_path / "mixed", arrays, ck.config)
    with pytest.raises(
        tietool.CheckpointError,
        match="in two layouts: .* is .*\\(\\[in, out\\]\\) but "
        "llama.layers.0.mlp.down_proj.weight is \\[16, 32\\] \\(\\[out, in\\]\\)",
    ):
        tietool.convert(src, "paddleformers", tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_all_square_weights_are_refused_by_name(tmp_path):
    """hidden == intermediate == heads x head_dim: every Linear weight is square, no shape proves the layout,
    so --to paddleformers refuses naming them (exit 5); a container change still works and says the layout
    was not proven."""
    rng = np.random.default_rng(3)
    cfg = {
        "model_type": "llama",
        "vocab_size": 24,
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "paddlenlp_version": None,
    }
    arrays = {"llama.embed_tokens.weight": rng.standard_normal((24, 8)).astype(np.float32)}
    for p in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ):
        arrays[f"llama.layers.0.{p}.weight"] = rng.standard_normal((8, 8)).astype(np.float32)
    arrays["llama.norm.weight"] = np.ones(8, np.float32)
    arrays["lm_head.weight"] = rng.standard_normal((8, 24)).astype(np.float32)
    src = _write_pnlp(tmp_path / "square", arrays, cfg)
    run = fs.run_tool(["convert", src, "--to", "paddleformers", "--out", tmp_path / "o"])
    assert run.returncode == 5, run.stdout + run.stderr
    assert "cannot prove the layout ([in, out] or [out, in]) of 7 Linear weight(s): " in run.stderr
    assert "llama.layers.0.self_attn.q_proj.weight is square" in run.stderr and not (tmp_path / "o").exists()
    rep = tietool.convert(src, "safetensors", tmp_path / "st")
    assert rep["layout"] is None and any(
        n.startswith("layout not proven (tietool cannot prove") for n in rep["notes"]
    )


# ------------------------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize(
    "name, there, back",
    [
        *[(n, "paddleformers", "paddlenlp") for n in PNLP_LLAMA if n != "pnlp_llama_tied"],
        ("pf_llama_untied_fp32", "paddlenlp", "paddleformers"),
        ("pf_llama_tied_bf16", "paddlenlp", "paddleformers"),
        ("pf_llama_untied_sharded", "paddlenlp", "paddleformers"),
        ("pf_qwen2_tied", "paddlenlp", "paddleformers"),
        ("pnlp_t5", "safetensors", "pdparams"),
        ("pnlp_bert_mlm", "safetensors", "pdparams"),
        ("pnlp_llama_untied_bf16", "safetensors", "pdparams"),
        ("pf_llama_untied_legacy_pdparams", "safetensors", "pdparams"),
    ],
)
def test_round_trip_is_bit_identical(name, there, back, tmp_path):
    one = _ok(_run(paths.CASES_DIR / name, tmp_path / "a", there))
    two = _ok(_run(one.out, tmp_path / "b", back))
    _same_tensors(one.inp, two.out)
    if there in ("safetensors", "pdparams"):
        assert one.report()["renamed"] == [] and one.report()["transposed"] == []


def test_pnlp_tied_round_trip_keeps_tensors(tmp_path):
    one = _ok(_run(paths.CASES_DIR / "pnlp_llama_tied", tmp_path / "a", "paddleformers"))
    two = _ok(_run(one.out, tmp_path / "b", "paddlenlp"))
    _same_tensors(one.inp, two.out)
    assert (two.out / "model_state.pdparams").is_file()


@pytest.mark.parametrize("name", ["pf_llama_tied_fp32", "pf_llama_tied_bf16", "pf_llama_tied_sharded"])
def test_tied_paddleformers_round_trip_keeps_the_tie(name, tmp_path):
    """A tied PaddleFormers Llama (duplicate head in the files) → paddlenlp → paddleformers gives the
    input's config back: the head is the embedding transposed, so tie_word_embeddings stays true (it was
    set false, turning a tied checkpoint into an untied one)."""
    one = _ok(_run(paths.CASES_DIR / name, tmp_path / "a", "paddlenlp"))
    assert fs.config_of(one.out)["tie_word_embeddings"] is True
    two = _ok(_run(one.out, tmp_path / "b", "paddleformers"))
    _same_tensors(one.inp, two.out)
    assert fs.config_of(two.out)["tie_word_embeddings"] is True
    rep = two.report()
    assert not any(c["key"] == "tie_word_embeddings" for c in rep["config_changes"])
    assert any("tie_word_embeddings stays true" in n for n in rep["notes"])
    ck = Checkpoint.open(one.out)
    assert cv.head_is_embedding_t(ck, "lm_head.weight", "llama.embed_tokens.weight")
    # one flipped bit in the head: not the embedding any more, so the flag goes false as before
    arrays = {n: ck.load(n).copy() for n in ck.tensors}
    arrays["lm_head.weight"].view(np.uint8).reshape(-1)[5] ^= 1
    src = _write_pnlp(tmp_path / "flip", arrays, ck.config)
    assert not cv.head_is_embedding_t(Checkpoint.open(src), "lm_head.weight", "llama.embed_tokens.weight")
    three = fs.run_tool(["convert", src, "--to", "paddleformers", "--out", tmp_path / "c"])
    assert three.returncode == 0, three.stderr
    assert json.loads((tmp_path / "c" / "config.json").read_text())["tie_word_embeddings"] is False


def test_tied_paddleformers_without_head_gets_one_for_paddlenlp_llama(tmp_path, fixture_copy):
    """PaddleNLP 2.8 Llama never ties: a tied PaddleFormers Llama whose files hold no head gets the embedding
    written as a [hidden, vocab] head (else PaddleNLP would build a random one)."""
    ck = fixture_copy("pf_llama_tied_fp32")
    tietool.tie(ck, tmp_path / "tied")  # drops the duplicate head
    assert "lm_head.weight" not in fs.read_checkpoint(tmp_path / "tied")
    rep = tietool.convert(tmp_path / "tied", "paddlenlp", tmp_path / "pnlp")
    out = fs.read_checkpoint(tmp_path / "pnlp")
    emb = fs.read_checkpoint(ck)["model.embed_tokens.weight"]
    assert out["lm_head.weight"].shape == (16, 100) and out["lm_head.weight"].data == emb.transposed_bytes()
    assert any("PaddleNLP 2.8 never ties" in n for n in rep["notes"])


# ------------------------------------------------------------------------------------------------ fused qkv
def _fuse_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray, nh: int, kv: int) -> np.ndarray:
    """PaddleNLP's fused layout on the last axis, built head by head: [q(group), k, v] per kv head."""
    hd = q.shape[-1] // nh
    g = nh // kv
    cols = []
    for i in range(kv):
        cols += [q[:, (i * g + j) * hd : (i * g + j + 1) * hd] for j in range(g)]
        cols += [k[:, i * hd : (i + 1) * hd], v[:, i * hd : (i + 1) * hd]]
    return np.concatenate(cols, axis=-1)


def _write_pnlp(folder: Path, tensors: dict[str, np.ndarray], config: dict) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    rows = [(n, a.dtype.name, a.shape, Source(array=a), None, False) for n, a in tensors.items()]
    pdparams.write_file(folder / "model_state.pdparams", rows, {})
    return folder


@pytest.mark.parametrize("dtype", ["float32", "uint16"])
def test_fused_projections_unfuse_as_the_unfused_checkpoint(tmp_path, dtype):
    """GQA (4 heads, 2 kv heads, head_dim 4): a PaddleNLP checkpoint with qkv_proj (+ bias) and
    gate_up_fused_proj converts to exactly what its unfused twin converts to."""
    rng = np.random.default_rng(0)
    h, nh, kv, hd, inter, vocab = 16, 4, 2, 4, 24, 40

    def r(*shape):
        a = rng.standard_normal(shape).astype(np.float32)
        return a if dtype == "float32" else (a.view(np.uint32) >> 16).astype(np.uint16)

    q, k, v = r(h, nh * hd), r(h, kv * hd), r(h, kv * hd)
    qb, kb, vb = r(nh * hd), r(kv * hd), r(kv * hd)
    gate, up = r(h, inter), r(h, inter)
    common = {
        "llama.embed_tokens.weight": r(vocab, h),
        "llama.norm.weight": r(h),
        "lm_head.weight": r(h, vocab),
    }
    layer = "llama.layers.0."
    unfused = {
        **common,
        **{f"{layer}self_attn.{p}_proj.weight": a for p, a in zip("qkv", (q, k, v), strict=True)},
        **{f"{layer}self_attn.{p}_proj.bias": a for p, a in zip("qkv", (qb, kb, vb), strict=True)},
        f"{layer}mlp.gate_proj.weight": gate,
        f"{layer}mlp.up_proj.weight": up,
    }
    fused = {
        **common,
        f"{layer}self_attn.qkv_proj.weight": _fuse_qkv(q, k, v, nh, kv),
        f"{layer}self_attn.qkv_proj.bias": _fuse_qkv(qb[None], kb[None], vb[None], nh, kv)[0],
        f"{layer}mlp.gate_up_fused_proj.weight": np.concatenate([gate, up], axis=-1),
    }
    cfg = {"model_type": "llama", "hidden_size": h, "num_attention_heads": nh, "num_key_value_heads": kv}
    cfg |= {
        "vocab_size": vocab,
        "intermediate_size": inter,
        "dtype": "float32" if dtype == "float32" else "bfloat16",
    }
    a = _write_pnlp(tmp_path / "unfused", unfused, cfg)
    b = _write_pnlp(
        tmp_path / "fused", fused, {**cfg, "fuse_attention_qkv": True, "fuse_attention_ffn": True}
    )
    tietool.convert(a, "paddleformers", tmp_path / "a_pf")
    rep = tietool.convert(b, "paddleformers", tmp_path / "b_pf")
    _same_tensors(tmp_path / "a_pf", tmp_path / "b_pf")
    assert fs.read_checkpoint(tmp_path / "b_pf")["model.layers.0.self_attn.q_proj.weight"].shape == (16, 16)
    cfg_b = fs.config_of(tmp_path / "b_pf")
    assert cfg_b["fuse_attention_qkv"] is False and cfg_b["fuse_attention_ffn"] is False
    assert {s["from"]: len(s["to"]) for s in rep["split"]} == {
        f"{layer}self_attn.qkv_proj.weight": 3,
        f"{layer}self_attn.qkv_proj.bias": 3,
        f"{layer}mlp.gate_up_fused_proj.weight": 2,
    }


# ------------------------------------------------------------------------------------------------- sharding
def test_max_shard_size_shards_with_an_index(tmp_path):
    run = _ok(
        _run(
            paths.CASES_DIR / "pnlp_llama_untied_sharded",
            tmp_path / "w",
            "paddleformers",
            "--max-shard-size",
            "20KB",
        )
    )
    files = sorted(p.name for p in run.out.glob("*.safetensors"))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((run.out / "model.safetensors.index.json").read_text())
    out = fs.read_checkpoint(run.out)
    assert {n: t.file for n, t in out.items()} == index["weight_map"]
    assert index["metadata"]["total_size"] == sum(len(t.data) for t in out.values())
    for f in files:
        inside = [t for t in out.values() if t.file == f]
        assert sum(len(t.data) for t in inside) <= 20_000 or len(inside) == 1, f
    assert fs.index_problems(run.out) == []


def test_default_shard_size_is_ten_gb_and_pdparams_unsharded(tmp_path):
    assert DEFAULT_MAX_SHARD_SIZE == 10 * 10**9
    run = _ok(_run(paths.CASES_DIR / "pf_llama_untied_sharded", tmp_path / "w", "paddlenlp"))
    assert sorted(p.name for p in run.out.iterdir() if "model" in p.name) == ["model_state.pdparams"]


# -------------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name, what", [("pnlp_gpt", "GPT"), ("pnlp_bert_mlm", "BERT"), ("pnlp_t5", "T5")])
def test_families_paddleformers_lacks_are_refused(name, what, tmp_path):
    run = _run(paths.CASES_DIR / name, tmp_path / "w", "paddleformers")
    assert run.rc == 5, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"PaddleFormers 1.2 has no {what}" in lines[0]
    assert str(run.inp) in lines[0] and "--to safetensors" in lines[0]
    assert run.out_empty() and run.hashes_before == run.hashes_after


def test_unknown_model_type_is_refused(tmp_path, fixture_copy):
    ck = fixture_copy("pnlp_llama_untied")
    cfg = fs.config_of(ck)
    (ck / "config.json").write_text(json.dumps({**cfg, "model_type": "mystery"}))
    run = _run(ck, tmp_path / "w", "paddleformers")
    assert run.rc == 5 and "no conversion data for model_type 'mystery'" in run.stderr, run.describe()
    assert "--to safetensors" in run.stderr and run.out_empty()


@pytest.mark.parametrize("to", ["paddleformers", "paddlenlp"])
def test_missing_model_type_names_config_json(to, tmp_path, fixture_copy):
    """A config.json without model_type: one line naming config.json and what to add (not "model_type
    None"); exit 3 (a bad checkpoint); nothing written. The container change still works."""
    ck = fixture_copy("pnlp_llama_untied")
    cfg = fs.config_of(ck)
    del cfg["model_type"]
    (ck / "config.json").write_text(json.dumps(cfg))
    run = _run(ck, tmp_path / "w", to)
    lines = run.stderr.strip().splitlines()
    assert run.rc == 3 and len(lines) == 1, run.describe()
    assert f"{run.inp / 'config.json'}: config.json has no model_type" in lines[0]
    assert 'add "model_type"' in lines[0] and "None" not in lines[0] and "Traceback" not in run.stderr
    assert run.out_empty() and run.hashes_before == run.hashes_after
    kept = _ok(_run(ck, tmp_path / "k", "safetensors"))
    ta, tb = fs.read_checkpoint(kept.inp), fs.read_checkpoint(kept.out)
    assert sorted(ta) == sorted(tb) and all(ta[n].data == tb[n].data for n in ta)


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size"])
def test_missing_sizes_refused_for_a_layout_change(key, tmp_path, fixture_copy):
    """Without vocab_size the head's layout went unchecked and the PaddleFormers output had no vocab_size
    (its loader would build 32000 rows): refused as one line naming config.json and the embedding's shape;
    a container change still works."""
    ck = fixture_copy("pnlp_llama_untied")
    cfg = fs.config_of(ck)
    del cfg[key]
    (ck / "config.json").write_text(json.dumps(cfg))
    run = _run(ck, tmp_path / "w", "paddleformers")
    lines = run.stderr.strip().splitlines()
    assert run.rc == 3 and len(lines) == 1, run.describe()
    assert f"{run.inp / 'config.json'}: config.json has no {key}" in lines[0]
    assert f"add {key}" in lines[0] and "[100, 16]" in lines[0]
    assert run.out_empty() and run.hashes_before == run.hashes_after
    assert _ok(_run(ck, tmp_path / "k", "safetensors")).rc == 0


def test_unplaceable_tensor_is_refused_by_name(tmp_path):
    ck = Checkpoint.open(paths.CASES_DIR / "pnlp_llama_untied")
    arrays = {n: ck.load(n) for n in ck.tensors}
    arrays["llama.layers.0.self_attn.rotary_emb.mystery"] = np.zeros((4, 4), np.float32)
    src = _write_pnlp(tmp_path / "in", arrays, ck.config)
    run = fs.run_tool(["convert", src, "--to", "paddleformers", "--out", tmp_path / "out"])
    assert run.returncode == 5, run.stderr
    assert "llama.layers.0.self_attn.rotary_emb.mystery" in run.stderr and "CONVERSIONS" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_no_paddlenlp_naming_is_refused(tmp_path):
    run = _run(paths.CASES_DIR / "pf_ernie4_5_untied", tmp_path / "w", "paddlenlp")
    assert run.rc == 5 and "no PaddleNLP 2.x naming of model_type 'ernie4_5'" in run.stderr, run.describe()
    assert run.out_empty()


@pytest.mark.parametrize("size", ["12XB", "0", "-5", "ten"])
def test_bad_max_shard_size(size, tmp_path):
    run = _run(
        paths.CASES_DIR / "pnlp_llama_untied", tmp_path / "w", "paddleformers", "--max-shard-size", size
    )
    assert run.rc == 2, run.describe()
    assert "--max-shard-size" in run.stderr and "10GB" in run.stderr and run.out_empty()


def test_missing_input_and_occupied_output(tmp_path):
    run = fs.run_tool(["convert", tmp_path / "nope", "--to", "paddleformers", "--out", tmp_path / "o"])
    assert run.returncode == 3 and "nope: no such folder" in run.stderr and not (tmp_path / "o").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep")
    run = fs.run_tool(
        ["convert", paths.CASES_DIR / "pnlp_gpt", "--to", "safetensors", "--out", tmp_path / "busy"]
    )
    assert run.returncode == 2 and "not empty" in run.stderr
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["x"]


def test_api_dry_run_and_bad_target(tmp_path):
    rep = tietool.convert(
        paths.CASES_DIR / "pnlp_llama_untied", "paddleformers", tmp_path / "o", dry_run=True
    )
    assert isinstance(rep, tietool.Report) and rep.dry_run and not (tmp_path / "o").exists()
    src = fs.read_checkpoint(paths.CASES_DIR / "pnlp_llama_untied")
    assert rep.parameters_before == rep.parameters_after == sum(int(np.prod(t.shape)) for t in src.values())
    assert len(rep["transposed"]) == 8 and len(rep["renamed"]) == 11
    with pytest.raises(tietool.UsageError, match="to must be one of"):
        tietool.convert(paths.CASES_DIR / "pnlp_llama_untied", "onnx", tmp_path / "o")


# ------------------------------------------------------------------------------- operations on the output
def test_resize_of_a_converted_checkpoint_is_explained_by_verify(tmp_path):
    conv = _ok(_run(paths.CASES_DIR / "pnlp_llama_untied", tmp_path / "w", "paddleformers"))
    res = fs.run_tool(["resize", conv.out, "--vocab", "128", "--out", tmp_path / "r"])
    assert res.returncode == 0, res.stderr
    emb = fs.read_checkpoint(tmp_path / "r")["model.embed_tokens.weight"]
    assert emb.shape == (128, 16)
    ver = fs.run_tool(["verify", conv.out, tmp_path / "r"])
    assert ver.returncode == 0, ver.stdout + ver.stderr
    tie = fs.run_tool(["tie", conv.out, "--keep", "head", "--out", tmp_path / "t"])
    assert tie.returncode == 0, tie.stderr
    assert fs.config_of(tmp_path / "t")["tie_word_embeddings"] is True


# ---------------------------------------------------------------------------------------------- slow: loads
@pytest.mark.slow
@pytest.mark.parametrize("name", PNLP_LLAMA)
def test_converted_paddlenlp_loads_in_paddleformers(name, tmp_path, live_logits):
    run = _ok(_run(paths.CASES_DIR / name, tmp_path / "w", "paddleformers"))
    res = live_logits.submit(run.out, "LlamaForCausalLM").result()
    assert res.get("ok"), res
    assert res["warnings"] == [], res["warnings"]
    got = res["logits"]
    want = np.load(paths.ORACLES_DIR / f"{name}.logits_before.npy")
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) < 1e-5


@pytest.mark.slow
def test_converted_legacy_pdparams_loads_without_legacy_format(tmp_path, live_logits):
    name = "pf_llama_untied_legacy_pdparams"
    run = _ok(_run(paths.CASES_DIR / name, tmp_path / "w", "paddleformers"))
    ref = live_logits.submit(
        paths.CASES_DIR / name,
        "LlamaForCausalLM",
        {"load_checkpoint_format": "legacy", "convert_from_hf": False},
    ).result()
    assert ref.get("ok"), ref
    res = live_logits.submit(run.out, "LlamaForCausalLM").result()
    assert res.get("ok") and res["warnings"] == [], res
    got, want = res["logits"], ref["logits"]
    assert fs.logits_mismatch(got, want) is None


def test_training_state_is_left_out_and_said(fixture_copy, tmp_path):
    ck = fixture_copy("pnlp_llama_untied")
    (ck / "model_state.pdopt").write_bytes(b"optimizer")
    (ck / "tokenizer_config.json").write_text("{}")
    rep = tietool.convert(ck, "paddleformers", tmp_path / "o")
    assert not (tmp_path / "o" / "model_state.pdopt").exists()
    assert (tmp_path / "o" / "tokenizer_config.json").read_text() == "{}"
    assert any(n.startswith("training state left out (model_state.pdopt)") for n in rep["notes"])


@pytest.mark.parametrize("shape", [(1, 1), (3, 700), (513, 257), (256, 256), (0, 5)])
@pytest.mark.parametrize("dtype", [np.uint16, np.float32, np.int8])
def test_tiled_transpose_moves_the_same_bits(shape, dtype):
    a = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)
    t = recipes.transpose_2d(a)
    assert t.flags.c_contiguous and t.dtype == a.dtype and t.shape == shape[::-1]
    assert t.tobytes() == np.ascontiguousarray(a.T).tobytes()


def test_unfuses_what_paddleformers_fuse_param_func_fused(tmp_path):
    """tests/data/tp_ranks/llama_fused_fp32/original was fused by PaddleFormers' own ``fuse_param_func``
    (4 heads, 4 kv heads: per head [q_i, k_i, v_i]); the unfused q/k/v and gate/up of the conversion, fused
    again head by head, give the file's bytes back."""
    src = paths.DATA / "tp_ranks" / "llama_fused_fp32" / "original"
    tietool.convert(src, "paddleformers", tmp_path / "pf")
    inp, out = fs.read_checkpoint(src), fs.read_checkpoint(tmp_path / "pf")
    for layer in range(2):
        pre = f"model.layers.{layer}."
        q, k, v = (out[f"{pre}self_attn.{p}_proj.weight"].array().T for p in "qkv")
        fused = inp[f"llama.layers.{layer}.self_attn.qkv_proj.weight"]
        assert _fuse_qkv(q, k, v, 4, 4).tobytes() == fused.data
        gate, up = (out[f"{pre}mlp.{p}_proj.weight"].array().T for p in ("gate", "up"))
        assert (
            np.concatenate([gate, up], axis=-1).tobytes()
            == inp[f"llama.layers.{layer}.mlp.gate_up_fused_proj.weight"].data
        )
    assert not any("qkv_proj" in n or "fused" in n for n in out)


@pytest.mark.slow
def test_converted_fused_paddlenlp_loads_in_paddleformers(tmp_path, live_logits):
    """The unfused output of a fused PaddleNLP checkpoint (fuse flags set false) loads in PaddleFormers with
    no missing or unexpected keys and finite logits; and converting it to unfused PaddleNLP and back gives
    the same tensors bit for bit."""
    src = paths.DATA / "tp_ranks" / "llama_fused_fp32" / "original"
    tietool.convert(src, "paddleformers", tmp_path / "pf")
    tietool.convert(tmp_path / "pf", "paddlenlp", tmp_path / "pnlp")  # unfused llama. names, [in, out]
    tietool.convert(tmp_path / "pnlp", "paddleformers", tmp_path / "pf2")
    _same_tensors(tmp_path / "pf", tmp_path / "pf2")
    res = live_logits.submit(tmp_path / "pf", "LlamaForCausalLM").result()
    assert res.get("ok") and res["warnings"] == [] and res["shape"] == [2, 8, 48], res
    assert np.isfinite(res["logits"]).all()


def test_mistral_is_refused_for_paddleformers(tmp_path, fixture_copy):
    """Mistral has Llama's names but no PaddleFormers 1.2 class: refused by name, not converted as Llama."""
    ck = fixture_copy("pnlp_llama_untied")
    (ck / "config.json").write_text(json.dumps({**fs.config_of(ck), "model_type": "mistral"}))
    with pytest.raises(tietool.RefusedError, match="PaddleFormers 1.2 has no Mistral model class"):
        tietool.convert(ck, "paddleformers", tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["pf_gemma3_text", "pf_llama_tied_sharded"])
def test_paddleformers_input_to_paddleformers_only_reshards(name, tmp_path):
    """Already in the PaddleFormers layout (any model type, Gemma3 included): tensors and config unchanged,
    the shards rewritten at the new size."""
    run = _ok(_run(paths.CASES_DIR / name, tmp_path / "w", "paddleformers", "--max-shard-size", "1GB"))
    _same_tensors(run.inp, run.out)
    assert fs.config_of(run.out) == fs.config_of(run.inp)
    assert [p.name for p in run.out.glob("*.safetensors")] == ["model-00001-of-00001.safetensors"]
    rep = run.report()
    assert (
        rep["renamed"] == [] and rep["transposed"] == [] and "already in the PaddleFormers" in rep["notes"][0]
    )


@pytest.mark.parametrize("name", ["pnlp_llama_untied_bf16", "pf_llama_untied_sharded", "pnlp_llama_untied"])
def test_blockwise_transpose_of_a_stored_tensor(name, monkeypatch):
    """Read in blocks of a few rows (forced small), the transposed tensor has the stored bits of ``.T``."""
    monkeypatch.setattr(cv, "ROWS_BYTES", 100)
    ck = Checkpoint.open(paths.CASES_DIR / name)
    for n in [n for n in ck.tensors if _is_linear(n)]:
        got, want = recipes.transposed(ck, n), np.ascontiguousarray(ck.load(n).T)
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), n


# ------------------------------------------------------------------------------------------ the CLI's help
@pytest.mark.parametrize("command", ["inspect", "tie", "untie", "resize", "verify", "convert", "merge"])
def test_help_names_arguments_without_braces(command):
    """Usage lines name arguments as CKPT / BEFORE AFTER: Typer 0.29 wrapped required ones as {BEFORE}."""
    run = fs.run_tool([command, "--help"])
    assert run.returncode == 0, run.stderr
    usage = run.stdout.splitlines()[0]
    assert "{" not in run.stdout and "}" not in run.stdout, usage
    want = {"verify": "[OPTIONS] BEFORE AFTER", "inspect": "[OPTIONS] [CKPT...]"}.get(
        command, "[OPTIONS] [CKPT]"
    )
    assert usage.startswith("Usage: ") and usage.endswith(f"tietool {command} {want}"), usage


def test_convert_help_does_not_import_paddle():
    code = (
        "import sys\nfrom tietool.cli.app import app\ntry:\n    app(['convert', '--help'])\n"
        "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('paddle', 'paddleformers', 'paddlenlp')))"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_unknown_target_is_one_clean_line(tmp_path):
    """--to bogus: one line with the allowed values and an example (it said "Value error, ...")."""
    run = _run(paths.CASES_DIR / "pnlp_llama_untied", tmp_path / "w", "bogus")
    lines = run.stderr.strip().splitlines()
    assert run.rc == 2 and len(lines) == 1, run.describe()
    assert "Value error" not in lines[0] and "'bogus' is not one of 'paddleformers'" in lines[0]
    assert lines[0].endswith("— e.g. --to paddleformers") and run.out_empty()


def test_container_change_headline(tmp_path):
    """A container change said "the input's names and layouts (pdparams) → the input's names and layouts
    (safetensors)"; it now says what changes."""
    run = _ok(_run(paths.CASES_DIR / "pnlp_llama_untied", tmp_path / "w", "safetensors"))
    assert "pdparams → safetensors: the container only, names and layouts kept" in run.stdout
    assert "the input's names and layouts (" not in run.stdout
    run = _ok(_run(paths.CASES_DIR / "pnlp_llama_untied", tmp_path / "p", "paddleformers"))
    assert "PaddleNLP 2.x (pdparams) → PaddleFormers/HF safetensors (safetensors)" in run.stdout


def test_paddleformers_hf_layout_to_pdparams_is_refused(tmp_path):
    """PaddleFormers 1.2 reads a .pdparams only in its legacy Paddle layout: a .pdparams of its HF-layout
    safetensors loads with no from_pretrained (measured in the slow test below), so it is refused; the
    legacy layout converts and says how it loads."""
    run = _run(paths.CASES_DIR / "pf_llama_untied_fp32", tmp_path / "w", "pdparams")
    assert run.rc == 5 and run.out_empty(), run.describe()
    assert "reads a .pdparams only in its legacy Paddle layout" in run.stderr
    assert "its Linear weights are [out, in]" in run.stderr
    ok = _ok(_run(paths.CASES_DIR / "pf_llama_untied_legacy_pdparams", tmp_path / "l", "safetensors"))
    rep = ok.report()
    assert rep["layout"] == "[in, out]"
    assert any(
        cv.LEGACY_LOAD in n and "a plain from_pretrained gives wrong logits" in n for n in rep["notes"]
    )
    assert cv.LEGACY_LOAD in ok.stdout


@pytest.mark.parametrize(
    "name, to, fmt",
    [
        ("pnlp_llama_untied", "safetensors", "np"),  # PaddleNLP 2.8.1 reads only format np
        ("pf_llama_untied_legacy_pdparams", "safetensors", "np"),  # Paddle layout, as save_to_hf=False
        ("pf_llama_untied_fp32", "safetensors", "pt"),  # HF layout
        ("pnlp_llama_untied", "paddleformers", "pt"),
        # no metadata in the input, its layout proven [out, in] by gemma3_text's row: pt
        ("pf_gemma3_text", "safetensors", "pt"),
        # the same files under a model type without conversion data (qwen3_vl): layout not proven, so none, as
        # stored (it was labelled np, the Paddle layout, which HF transformers refuses to load)
        ("pf_gemma3_text:qwen3_vl", "safetensors", None),
    ],
)
def test_safetensors_metadata_is_the_targets(name, to, fmt, tmp_path):
    name, _, model_type = name.partition(":")
    src = paths.CASES_DIR / name
    if model_type:  # a copy whose config names another model type
        src = Path(shutil.copytree(src, tmp_path / "src"))
        cfg = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
    run = _ok(_run(src, tmp_path / "w", to))
    from safetensors import safe_open

    for f in run.out.glob("*.safetensors"):
        with safe_open(str(f), "np") as fh:
            assert (fh.metadata() or None) == ({"format": fmt} if fmt else None), f
    if fmt is None:  # nothing but the container changed: verify finds the files' metadata equal too
        assert fs.run_tool(["verify", str(src), str(run.out)]).returncode == 0


@pytest.mark.parametrize(
    "name, to, key, value, gone",
    [
        ("pf_llama_untied_fp32", "paddlenlp", "paddlenlp_version", None, "paddleformers_version"),
        ("pnlp_llama_untied", "paddleformers", "paddleformers_version", "1.2.0", "paddlenlp_version"),
    ],
)
def test_version_key_is_the_targets(name, to, key, value, gone, tmp_path):
    """The source library's version key would make the next command pick it as the loader (tie of a Llama
    converted --to paddlenlp dropped the head PaddleNLP 2.8 needs): the target's key as its save_pretrained
    writes it, the other one dropped, and inspect names the target's loader."""
    run = _ok(_run(paths.CASES_DIR / name, tmp_path / "w", to))
    cfg = fs.config_of(run.out)
    assert key in cfg and cfg[key] == value and gone not in cfg
    info = tietool.inspect(run.out)
    assert info["loader"]["name"] == ("paddlenlp-2.8" if to == "paddlenlp" else "paddleformers"), info[
        "loader"
    ]


# -------------------------------------------------------------- slow: ERNIE 4.5 in its Paddle layouts, loaded
@pytest.fixture(scope="module")
def ernie_saves(tmp_path_factory) -> Path:
    """ERNIE 4.5 dense (tied, untied) and MoE + MTP, each saved by PaddleFormers 1.2 in its HF layout
    (``-hf``) and its legacy Paddle layout (``-legacy``): ``support/convert_loads.py build``."""
    root = tmp_path_factory.mktemp("ernie")
    cp = convert_loads.run(["build", str(root)])
    assert (root / "built.json").is_file(), cp.stderr[-3000:]
    return root


def _to_erniekit(hf: Path, out: Path) -> Path:
    """The ERNIEKit layout of PaddleFormers' HF export ``hf``, as ERNIE's ``tools/paddle2torch`` reads it (its
    inverse): ``ernie.`` names, ``qkv_proj`` = ``[q | k | v]`` and ``up_gate_proj`` = ``[gate | up]`` along
    the output axis, every Linear weight (router and ``mtp_linear_proj`` included) and an untied head
    ``[in, out]``, no head when tied, ``__metadata__`` ``format: np``, config ``dtype`` and no
    ``paddleformers_version``."""
    from safetensors.numpy import save_file

    ck = Checkpoint.open(hf)
    cfg = dict(ck.config)
    arrays = {n: ck.load(n) for n in ck.tensors}
    res: dict[str, np.ndarray] = {}
    for n, a in arrays.items():
        body = n.replace("model.", "ernie.", 1)
        if n.endswith("self_attn.q_proj.weight"):
            k, v = (arrays[n.replace("q_proj", p)] for p in ("k_proj", "v_proj"))
            res[body.replace("q_proj", "qkv_proj")] = np.concatenate([a.T, k.T, v.T], axis=1)
        elif n.endswith("gate_proj.weight"):
            up = arrays[n.replace("gate_proj", "up_proj")]
            res[body.replace("gate_proj", "up_gate_proj")] = np.concatenate([a.T, up.T], axis=1)
        elif n.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            continue
        elif n == "lm_head.weight":
            if not cfg.get("tie_word_embeddings"):
                res[n] = np.ascontiguousarray(a.T)
        elif a.ndim == 2 and "embed_tokens" not in n and "moe_statics" not in n:  # o, down, router, MTP
            res[body] = np.ascontiguousarray(a.T)
        else:
            res[body] = a
    out.mkdir(parents=True)
    # safetensors.numpy writes an array's memory as is: a Fortran-ordered concatenation must be C-ordered
    res = {n: np.ascontiguousarray(a) for n, a in res.items()}
    save_file(res, str(out / "model.safetensors"), metadata={"format": "np"})
    cfg["dtype"] = cfg.pop("torch_dtype")
    cfg.pop("paddleformers_version")
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _hf_bytes_equal(got: Path, export: Path) -> None:
    """``got`` holds PaddleFormers' own HF export's tensors bit for bit (a tied legacy save's duplicate head
    aside, which the HF export leaves out)."""
    a, b = fs.read_checkpoint(got), fs.read_checkpoint(export)
    assert sorted(set(a) - {"lm_head.weight"}) == sorted(set(b) - {"lm_head.weight"})
    for n in b:
        assert (a[n].shape, a[n].data) == (b[n].shape, b[n].data), n


@pytest.mark.slow
def test_ernie_paddle_layouts_convert_to_what_paddleformers_loads(ernie_saves, tmp_path):
    """ERNIE 4.5 (and 4.5-MoE with router, experts, shared expert, moe_statics and an MTP block) in both
    Paddle layouts -- PaddleFormers' legacy save (``model.``, qkv grouped per kv head) and ERNIEKit's
    (``ernie.``, ``q | k | v``) -- converted --to paddleformers: the tensors of PaddleFormers' own HF export
    bit for bit, and PaddleFormers 1.2 loads them with a plain from_pretrained, no missing or unexpected
    key, giving the logits of the legacy input loaded in the same run bit for bit (dense), and the same
    parameters (MoE: PaddleFormers 1.2 runs its MoE only on GPU, ``expand_modality_expert_id``)."""
    built = json.loads((ernie_saves / "built.json").read_text())
    jobs = []
    for name, cls in built.items():
        hf, legacy = ernie_saves / f"{name}-hf", ernie_saves / f"{name}-legacy"
        kit = _to_erniekit(hf, tmp_path / f"{name}-kit")
        outs = []
        for src in (legacy, kit):
            rep = tietool.convert(src, "paddleformers", tmp_path / f"{src.name}-pf")
            assert rep["layout"] == "[in, out]" and rep["notes"], rep
            _hf_bytes_equal(tmp_path / f"{src.name}-pf", hf)
            outs.append(tmp_path / f"{src.name}-pf")
        assert fs.config_of(outs[1])["paddleformers_version"] == "1.2.0"
        jobs += [{"ckpt": str(legacy), "model_class": cls, "kwargs": convert_loads.LEGACY, "name": name}]
        jobs += [{"ckpt": str(o), "model_class": cls, "name": name} for o in outs]
    rows = convert_loads.load_all(jobs, str(tmp_path / "loads"))
    for r in rows:
        assert r["ok"] and r["warnings"] == [], (r["job"]["ckpt"], r["error"], r["warnings"])
    for ref, *got in (rows[i : i + 3] for i in range(0, len(rows), 3)):
        for g in got:
            assert sorted(g["arrays"]) == sorted(ref["arrays"]), g["job"]["ckpt"]
            for k, v in ref["arrays"].items():
                assert fs.logits_mismatch(g["arrays"][k], v) is None, (g["job"]["ckpt"], k)
        assert ref["logits"] is ("moe" not in ref["job"]["name"]), ref.get("no_logits")


@pytest.mark.slow
def test_paddleformers_container_changes_load_as_said(ernie_saves, tmp_path):
    """What the container-change notes and the refusal rest on (PaddleFormers 1.2, ERNIE 4.5, Llama): its
    legacy Paddle layout converted --to safetensors loads right with load_checkpoint_format="legacy",
    convert_from_hf=False, and wrong with a plain from_pretrained (no warning); an HF-layout .pdparams
    (what --to pdparams of an HF checkpoint would write) loads right with no from_pretrained at all."""
    hf, legacy = ernie_saves / "ernie4_5-untied-hf", ernie_saves / "ernie4_5-untied-legacy"
    st = tmp_path / "legacy-st"
    rep = tietool.convert(legacy, "safetensors", st)
    assert any(cv.LEGACY_LOAD in n for n in rep["notes"])
    ck = Checkpoint.open(hf)
    hf_pd = _write_pnlp(tmp_path / "hf-pdparams", {n: ck.load(n) for n in ck.tensors}, ck.config)
    cls = "Ernie4_5ForCausalLM"
    jobs = [
        {"ckpt": str(hf), "model_class": cls},
        {"ckpt": str(st), "model_class": cls, "kwargs": convert_loads.LEGACY},
        {"ckpt": str(st), "model_class": cls},
        *(
            {"ckpt": str(hf_pd), "model_class": cls, "kwargs": kw}
            for kw in ({}, convert_loads.LEGACY, {**convert_loads.LEGACY, "convert_from_hf": True})
        ),
    ]
    ll_src = paths.CASES_DIR / "pf_llama_untied_legacy_pdparams"  # and Llama: the same facts
    tietool.convert(ll_src, "safetensors", tmp_path / "ll-st")
    jobs[3:3] = [  # before the loads that fail (a failed from_pretrained can break later ones in-process)
        {"ckpt": str(ll_src), "model_class": "LlamaForCausalLM", "kwargs": convert_loads.LEGACY},
        {"ckpt": str(tmp_path / "ll-st"), "model_class": "LlamaForCausalLM", "kwargs": convert_loads.LEGACY},
        {"ckpt": str(tmp_path / "ll-st"), "model_class": "LlamaForCausalLM"},
    ]
    rows = convert_loads.load_all(jobs, str(tmp_path / "loads"))
    ref, legacy_ok, plain, *pdparams = rows[:3] + rows[6:]
    ll_ref, ll_legacy, ll_plain = (r["arrays"]["logits"] for r in rows[3:6])
    assert fs.logits_mismatch(ll_legacy, ll_ref) is None and fs.logits_mismatch(ll_plain, ll_ref, atol=1e-3)
    want = ref["arrays"]["logits"]
    assert legacy_ok["ok"] and fs.logits_mismatch(legacy_ok["arrays"]["logits"], want) is None
    assert plain["ok"] and plain["warnings"] == [] and fs.logits_mismatch(plain["arrays"]["logits"], want)
    for r in pdparams:
        assert not r["ok"] or fs.logits_mismatch(r["arrays"]["logits"], want, atol=1e-3), r["job"]["kwargs"]


# ------------------------------------------------------------------------- PaddleNLP 2.8.1 loads (pnlp venv)


@pytest.mark.pnlp
@pytest.mark.slow
def test_paddlenlp_outputs_load_in_paddlenlp(tmp_path):
    """Every PaddleNLP output of convert loads in PaddleNLP 2.8.1 itself with no missing or unexpected
    key: container changes of PaddleNLP checkpoints (safetensors with format np, the only format PaddleNLP
    reads, bf16 labelled U16, sharded, and back to .pdparams) and a round trip through PaddleFormers give
    its logits bit for bit; PaddleFormers Llama (HF and legacy) converted --to paddlenlp gives the PF 1.2
    logits of the input computed in the same run (1e-5: two libraries), and so does a tied PaddleFormers
    Llama converted and then tied, which keeps the head PaddleNLP 2.8 needs (the output's
    paddlenlp_version tells tie the loader; with the paddleformers_version convert kept, tie dropped the
    head and PaddleNLP loaded a random one)."""
    src = {
        n: fs.copy_checkpoint(paths.CASES_DIR / n, tmp_path / "in" / n)
        for n in (
            "pnlp_llama_untied",
            "pf_llama_untied_fp32",
            "pf_llama_tied_fp32",
            "pf_qwen2_tied",
            "pf_llama_untied_legacy_pdparams",
        )
    }
    out = tmp_path / "out"
    tietool.convert(src["pnlp_llama_untied"], "safetensors", out / "pnlp-st")
    tietool.convert(src["pnlp_llama_untied"], "paddleformers", out / "pnlp-pf")
    tietool.convert(out / "pnlp-pf", "paddlenlp", out / "pnlp-pf-pnlp")
    for n in (
        "pf_llama_untied_fp32",
        "pf_llama_tied_fp32",
        "pf_qwen2_tied",
        "pf_llama_untied_legacy_pdparams",
    ):
        tietool.convert(src[n], "paddlenlp", out / f"{n}-pnlp")
    # PaddleNLP 2.8.1 has no Qwen2 class: the output names no version, so tietool takes PaddleNLP 3
    assert "paddlenlp_version" not in fs.config_of(out / "pf_qwen2_tied-pnlp")
    assert tietool.inspect(out / "pf_qwen2_tied-pnlp")["loader"]["name"] == "paddlenlp-3"
    # PaddleFormers' class name Qwen2ForCausalLMDeprecated exists in no PaddleNLP
    assert fs.config_of(src["pf_qwen2_tied"])["architectures"] == ["Qwen2ForCausalLMDeprecated"]
    assert fs.config_of(out / "pf_qwen2_tied-pnlp")["architectures"] == ["Qwen2ForCausalLM"]
    rep = tietool.tie(out / "pf_llama_tied_fp32-pnlp", out / "tied")
    assert "lm_head.weight" in fs.read_checkpoint(out / "tied") and rep["loader"]["name"] == "paddlenlp-2.8"
    ll = "LlamaForCausalLM"
    pnlp_jobs = [
        {"ckpt": str(src["pnlp_llama_untied"]), "model_class": ll},
        *({"ckpt": str(out / d), "model_class": ll} for d in ("pnlp-st", "pnlp-pf-pnlp")),
        *(
            {"ckpt": str(out / d), "model_class": ll}
            for d in ("pf_llama_untied_fp32-pnlp", "tied", "pf_llama_untied_legacy_pdparams-pnlp")
        ),
    ]
    pf_jobs = [
        {"ckpt": str(src["pf_llama_untied_fp32"]), "model_class": ll},
        {"ckpt": str(src["pf_llama_tied_fp32"]), "model_class": ll},
        {
            "ckpt": str(src["pf_llama_untied_legacy_pdparams"]),
            "model_class": ll,
            "kwargs": convert_loads.LEGACY,
        },
    ]
    extra = []  # container changes and back: bf16 (labelled U16, as PaddleNLP writes it), sharded
    for n in ("pnlp_llama_untied_bf16", "pnlp_llama_untied_sharded"):
        st = out / f"{n}-st"
        tietool.convert(paths.CASES_DIR / n, "safetensors", st)
        tietool.convert(st, "pdparams", out / f"{n}-st-pd")
        kw = {"dtype": "float32"} if "bf16" in n else {}  # paddle 2.6 has no bf16 kernels on CPU
        extra += [
            {"ckpt": str(d), "model_class": ll, "kwargs": kw}
            for d in (paths.CASES_DIR / n, st, out / f"{n}-st-pd")
        ]
    rows = convert_loads.load_all(pnlp_jobs + extra, str(tmp_path / "pnlp"), pnlp_support.PNLP_PYTHON)
    rows, extra_rows = rows[: len(pnlp_jobs)], rows[len(pnlp_jobs) :]
    for ref, *got in (extra_rows[i : i + 3] for i in range(0, len(extra_rows), 3)):
        for g in [ref, *got]:
            assert g["ok"] and g["warnings"] == [], (g["job"]["ckpt"], g["error"], g["warnings"])
            assert fs.logits_mismatch(g["arrays"]["logits"], ref["arrays"]["logits"]) is None, g["job"][
                "ckpt"
            ]
    refs = convert_loads.load_all(pf_jobs, str(tmp_path / "pf"))
    for r in rows + refs:
        assert r["ok"] and r["logits"] and r["warnings"] == [], (r["job"]["ckpt"], r["error"], r["warnings"])
    lg = [r["arrays"]["logits"] for r in rows]
    assert fs.logits_mismatch(lg[1], lg[0]) is None and fs.logits_mismatch(lg[2], lg[0]) is None
    for got, ref in zip(lg[3:], refs, strict=True):
        assert fs.logits_mismatch(got, ref["arrays"]["logits"], atol=1e-5) is None, ref["job"]["ckpt"]


@pytest.mark.parametrize(
    "name, edit, rc, said",
    [
        # other attention sizes (as DeepSeek MLA q_proj): q/k/v/o prove nothing, gate/up/down [out, in]
        ("pf_llama_untied_fp32", {"head_dim": 5}, 0, "already in the PaddleFormers/HF layout"),
        ("pf_llama_untied_legacy_pdparams", {}, 5, "its Linear weights are [in, out] (the Paddle layout)"),
        ("pnlp_llama_untied", {}, 5, "its names (llama.embed_tokens.weight) are not PaddleFormers names"),
        ("pf_llama_untied_fp32", {"intermediate_size": 7, "head_dim": 5}, 5, "no tensor named as a Linear"),
    ],
)
def test_model_type_without_a_row_reshards_only_a_proven_hf_layout(
    name, edit, rc, said, fixture_copy, tmp_path
):
    """A model type tietool has no conversion data for goes --to paddleformers only when the shapes of its
    tensors named as Linear weights prove [out, in] (then only the shards are rewritten); a Paddle layout,
    PaddleNLP names or no proof at all are refused (exit 5), naming why and the container-only fix."""
    ck = fixture_copy(name)
    (ck / "config.json").write_text(json.dumps({**fs.config_of(ck), "model_type": "acme", **edit}))
    run = fs.run_tool(["convert", ck, "--to", "paddleformers", "--out", tmp_path / "o"])
    assert run.returncode == rc, run.stdout + run.stderr
    assert said in (run.stdout if rc == 0 else run.stderr).replace("\n", " ")
    if rc:
        assert "--to safetensors" in run.stderr and not (tmp_path / "o").exists()
    else:
        _same_tensors(ck, tmp_path / "o")


@pytest.mark.slow
def test_paddleformers_legacy_fused_qwen_converts_to_its_hf_export(tmp_path):
    """PaddleFormers 1.2's legacy save of Qwen2 (bf16, qkv bias) and Qwen3 fuses qkv_proj (grouped per kv
    head) and up_gate_proj (gate | up): --to paddleformers gives its own HF export of the same model bit for
    bit, and --to paddlenlp unfuses them too (was: refused, tensors it could not place)."""
    from support import family_builder as fb

    vs = [fb.Variant(f, "untied", fmt, False) for f in ("qwen2", "qwen3") for fmt in fb.FORMATS]
    built, _ = fb.build_all(vs, tmp_path / "built")
    assert all(b.ok for b in built.values()), {v.name: b.error for v, b in built.items()}
    for f in ("qwen2", "qwen3"):
        legacy = built[fb.Variant(f, "untied", "pdparams", False)].path
        export = built[fb.Variant(f, "untied", "safetensors", False)].path
        assert legacy is not None and export is not None
        assert any("qkv_proj" in n for n in fs.read_checkpoint(legacy))
        rep = tietool.convert(legacy, "paddleformers", tmp_path / f"{f}-pf")
        assert rep["split"] and rep["layout"] == "[in, out]"
        _same_tensors(tmp_path / f"{f}-pf", export)
        tietool.convert(legacy, "paddlenlp", tmp_path / f"{f}-pnlp")
        tietool.convert(tmp_path / f"{f}-pnlp", "paddleformers", tmp_path / f"{f}-back")
        _same_tensors(tmp_path / f"{f}-back", export)


def test_tie_of_a_llama_converted_to_paddlenlp_keeps_the_head(tmp_path):
    """The output names PaddleNLP 2.8 (paddlenlp_version: null), so tie keeps the [hidden, vocab] head
    PaddleNLP 2.8 Llama needs (it never re-ties; the pnlp test loads it): with the kept
    paddleformers_version, tie took PaddleFormers as the loader and dropped the head."""
    tietool.convert(paths.CASES_DIR / "pf_llama_tied_fp32", "paddlenlp", tmp_path / "pnlp")
    rep = tietool.tie(tmp_path / "pnlp", tmp_path / "tied")
    assert rep["loader"]["name"] == "paddlenlp-2.8"
    out = fs.read_checkpoint(tmp_path / "tied")
    assert out["lm_head.weight"].shape == (16, 100)
    assert out["lm_head.weight"].data == fs.read_checkpoint(tmp_path / "pnlp")["lm_head.weight"].data


def test_square_head_layout_is_told_by_its_bytes_or_refused(tmp_path):
    """vocab_size == hidden_size: the head's shape cannot tell [hidden, vocab] from [vocab, hidden]; the
    embedding transposed is [hidden, vocab] (converted), any other head is refused by name."""
    rng = np.random.default_rng(5)
    cfg = {
        "model_type": "llama",
        "vocab_size": 16,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "paddlenlp_version": None,
    }
    emb = rng.standard_normal((16, 16)).astype(np.float32)
    arrays = {"llama.embed_tokens.weight": emb, "llama.norm.weight": np.ones(16, np.float32)}
    for p, shape in (("mlp.gate_proj", (16, 32)), ("mlp.up_proj", (16, 32)), ("mlp.down_proj", (32, 16))):
        arrays[f"llama.layers.0.{p}.weight"] = rng.standard_normal(shape).astype(np.float32)
    ok = _write_pnlp(tmp_path / "t", {**arrays, "lm_head.weight": np.ascontiguousarray(emb.T)}, cfg)
    tietool.convert(ok, "paddleformers", tmp_path / "o")
    assert fs.read_checkpoint(tmp_path / "o")["lm_head.weight"].data == emb.tobytes()
    bad = _write_pnlp(
        tmp_path / "b", {**arrays, "lm_head.weight": rng.standard_normal((16, 16)).astype(np.float32)}, cfg
    )
    with pytest.raises(tietool.RefusedError, match="cannot tell the layout of lm_head.weight"):
        tietool.convert(bad, "paddleformers", tmp_path / "o2")


def test_erniekit_container_change_keeps_its_own_labels(tmp_path):
    """ERNIEKit's ernie.* names are no PaddleNLP naming: --to safetensors of d01 keeps format np (its Paddle
    layout, proven) and says it is ERNIEKit's convention, and --to pdparams round-trips it."""
    d01 = paths.BUG_CASES_DIR / "d01_ernie45_paddle_weights_convert" / "ckpt"
    rep = tietool.convert(d01, "safetensors", tmp_path / "st")
    assert rep["layout"] == "[in, out]" and any(n.startswith("the input is ERNIEKit") for n in rep["notes"])
    from safetensors import safe_open

    with safe_open(str(next((tmp_path / "st").glob("*.safetensors"))), "np") as fh:
        assert fh.metadata() == {"format": "np"}
    tietool.convert(tmp_path / "st", "pdparams", tmp_path / "pd")
    _same_tensors_as_values(d01, tmp_path / "pd")
