"""The vocabulary surface by shape and by value, for the kinds of the third set of bug reports (issue 17,
item 3) in other families and layouts than the cases (d03, d05, d08, d10), and item 7b.

* token-indexed integer/boolean tables: one under a rule of the table (``gate.tid2eid``) in another
  family, layout and container grows with the embedding (old rows kept, new rows valid ids); one no rule
  covers is named by inspect and makes resize refuse; ``verify`` names one left at the old size;
* several vocabularies in one config: a nested text block is chosen and said, the other vocabulary's
  tensors are kept; two text blocks the tokenizer cannot tell apart make writes refuse, printing the
  ``embedding``/``head`` to pass; a draft head and its token-id map are kept, a trim past the map refused;
* a head under a name the table lacks: never "effectively tied", tie/untie refuse naming it; ChatGLM2/3
  names under ``model_type: chatglm`` are read as ChatGLM2 (``output_layer``, ``padded_vocab_size``);
* a vocabulary size that disagrees with the rows makes tie/untie refuse until resize sets it.

Checkpoints are written in ``tmp_path`` with the ``safetensors`` library or as a numpy pickle; outputs are
read back with ``safetensors`` and :mod:`support.casecheck`'s independent reader.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import casecheck
from support.resize_support import run_cli

import tietool
from tietool.surgery.inspect.detect import detect
from tietool.surgery.inspect.findings import FindingKind
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.model.enums import TensorRole
from tietool.surgery.model.errors import ExitCode, RefusedError

V, H = 24, 8


def table(rows: int, cols: int, offset: float = 0.0) -> np.ndarray:
    return (np.arange(rows)[:, None] + 0.01 * np.arange(cols)[None, :] + offset).astype(np.float32)


def write(folder: Path, config: dict, tensors: dict[str, np.ndarray], fmt: str = "safetensors") -> Path:
    """config.json and the tensors (one safetensors file, two shards with an index, or a pickle)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "pdparams":
        (folder / "model_state.pdparams").write_bytes(pickle.dumps(dict(tensors), protocol=4))
    elif fmt == "sharded":
        names = list(tensors)
        parts = [names[: len(names) // 2], names[len(names) // 2 :]]
        weight_map = {}
        for k, part in enumerate(parts):
            f = f"model-{k + 1:05d}-of-00002.safetensors"
            save_file({n: tensors[n] for n in part}, str(folder / f), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, f))
        total = sum(a.nbytes for a in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        save_file(dict(tensors), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def out_tensors(folder: Path) -> dict[str, casecheck.Tensor]:
    return casecheck.read_checkpoint(folder).tensors


def array(t: casecheck.Tensor, dtype) -> np.ndarray:
    return np.frombuffer(t.raw, dtype=dtype).reshape(t.shape)


def config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def cli(*argv) -> tuple[int, str]:
    cp = run_cli([str(a) for a in argv])
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp.returncode, cp.stdout + cp.stderr


# ------------------------------------------------------------------ token-indexed tables

MOE_CFG = {
    "model_type": "glm4_moe",  # another family than DeepSeek-V4, Llama names
    "vocab_size": V,
    "hidden_size": H,
    "num_hidden_layers": 2,
    "n_routed_experts": 5,
    "num_experts_per_tok": 3,
    "tie_word_embeddings": False,
}


def hash_routed(dtype=np.int32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "model.embed_tokens.weight": table(V, H),
        "model.layers.0.mlp.gate.tid2eid": rng.integers(0, 5, size=(V, 3)).astype(dtype),
        "model.layers.0.mlp.gate.weight": table(5, H, 3.0),
        "model.norm.weight": np.ones(H, np.float32),
        "lm_head.weight": table(V, H, 50.0),
    }


@pytest.mark.parametrize("fmt", ["sharded", "pdparams"])
def test_token_table_under_a_rule_grows_with_valid_rows(tmp_path, fmt):
    t = hash_routed()
    ck = write(tmp_path / "in", MOE_CFG, t, fmt)
    det = detect(Checkpoint.open(ck))
    assert det.surface[TensorRole.TOKEN_TABLE][0].name == "model.layers.0.mlp.gate.tid2eid"
    tietool.resize(ck, 30, tmp_path / "out", init="zeros", seed=0)
    out = out_tensors(tmp_path / "out")
    got = array(out["model.layers.0.mlp.gate.tid2eid"], np.int32)
    old = t["model.layers.0.mlp.gate.tid2eid"]
    assert got.shape == (30, 3)
    assert np.array_equal(got[:V], old)  # old rows bit-exact
    assert np.array_equal(got[V:], old[: 30 - V])  # new tokens take rows in use: valid expert ids
    assert out["lm_head.weight"].shape == (30, H) and config(tmp_path / "out")["vocab_size"] == 30
    assert tietool.verify(ck, tmp_path / "out").explained


def test_verify_names_a_token_table_left_at_the_old_size(tmp_path):
    t = hash_routed()
    ck = write(tmp_path / "in", MOE_CFG, t)
    stale = dict(t)
    stale["model.embed_tokens.weight"] = np.concatenate([t["model.embed_tokens.weight"], table(4, H)])
    stale["lm_head.weight"] = np.concatenate([t["lm_head.weight"], table(4, H)])
    b = write(tmp_path / "stale", {**MOE_CFG, "vocab_size": V + 4}, stale)
    res = tietool.verify(ck, b)
    assert res.exit_code == ExitCode.UNEXPLAINED
    assert any("model.layers.0.mlp.gate.tid2eid" in u and "old size" in u for u in res.unexplained)


def test_verify_names_an_integer_tensor_of_no_rule_left_at_the_old_size(tmp_path):
    t = {**hash_routed(), "model.layers.1.token_flags": np.zeros((V, 2), np.int8)}
    ck = write(tmp_path / "in", MOE_CFG, t)
    stale = dict(t)
    for n in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.gate.tid2eid"):
        stale[n] = np.concatenate([t[n], t[n][:4]])
    b = write(tmp_path / "stale", {**MOE_CFG, "vocab_size": V + 4}, stale)
    res = tietool.verify(ck, b)
    assert [u for u in res.unexplained if "old size" in u] == [
        f"model.layers.1.token_flags (vocab-shaped tensor) left at the old size: {V} → expected {V + 4}, as "
        f"the embedding went {V} → {V + 4} rows"
    ]


def test_token_table_values_outside_its_rule_are_refused(tmp_path):
    t = hash_routed()
    t["model.layers.0.mlp.gate.tid2eid"][3, 1] = 7  # 7 >= n_routed_experts 5: not a table of expert ids
    ck = write(tmp_path / "in", MOE_CFG, t)
    with pytest.raises(RefusedError, match=r"tid2eid .* outside 0\.\.4"):
        tietool.resize(ck, 30, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("dtype", "shape"), [(np.int64, (V,)), (np.bool_, (V, 2)), (np.int16, (2, V))])
def test_token_sized_integer_tensor_of_no_rule_is_named_and_refused(tmp_path, dtype, shape):
    t = hash_routed()
    t["model.layers.1.mlp.token_type_map"] = np.zeros(shape, dtype)
    ck = write(tmp_path / "in", MOE_CFG, t)
    info = tietool.inspect(ck)
    assert any(v["name"] == "model.layers.1.mlp.token_type_map" for v in info["vocabulary_tensors"])
    rc, msg = cli("resize", ck, "--vocab", 30, "--out", tmp_path / "out")
    assert rc == 5 and "model.layers.1.mlp.token_type_map" in msg
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ several vocabularies


def omni(blocks: dict, tensors_first_other: bool = True) -> tuple[dict, dict[str, np.ndarray]]:
    cfg = {"model_type": "some_omni", **blocks}
    t = {
        "speaker.model.embed_tokens.weight": table(12, H, 7.0),
        "speaker.lm_head.weight": table(12, H, 70.0),
        "llm.model.embed_tokens.weight": table(V, H),
        "llm.lm_head.weight": table(V, H, 50.0),
    }
    return cfg, t


def test_nested_text_block_chooses_the_pair_and_keeps_the_other_vocabulary(tmp_path):
    cfg, t = omni(
        {
            "llm_wrapper": {"language_config": {"vocab_size": V, "hidden_size": H}},
            "speaker_config": {"vocab_size": 12, "hidden_size": H},
        }
    )
    ck = write(tmp_path / "in", cfg, t, "pdparams")
    det = detect(Checkpoint.open(ck))
    assert (det.embedding.name, det.head.name) == ("llm.model.embed_tokens.weight", "llm.lm_head.weight")
    assert det.beyond.other_vocab == dict.fromkeys(
        ["speaker.model.embed_tokens.weight", "speaker.lm_head.weight"], "speaker_config.vocab_size"
    )
    assert FindingKind.TEXT_VOCABULARY in {f.kind for f in det.findings}
    with pytest.raises(RefusedError, match="llm.lm_head.weight differs from llm.model.embed_tokens.weight"):
        tietool.tie(ck, tmp_path / "tied")
    tietool.resize(ck, 30, tmp_path / "out", init="zeros")
    out, c = out_tensors(tmp_path / "out"), config(tmp_path / "out")
    assert out["llm.model.embed_tokens.weight"].shape == out["llm.lm_head.weight"].shape == (30, H)
    assert out["speaker.model.embed_tokens.weight"].raw == t["speaker.model.embed_tokens.weight"].tobytes()
    assert c["llm_wrapper"]["language_config"]["vocab_size"] == 30 and c["speaker_config"]["vocab_size"] == 12
    assert "vocab_size" not in c  # no key the input did not have
    assert tietool.verify(ck, tmp_path / "out").explained


def test_two_text_blocks_refuse_and_print_the_pairs_unless_the_tokenizer_tells(tmp_path):
    blocks = {
        "thinker_config": {"text_config": {"vocab_size": V, "hidden_size": H}},
        "talker_config": {"text_config": {"vocab_size": 12, "hidden_size": H}},
    }
    cfg, t = omni(blocks)
    ck = write(tmp_path / "in", cfg, t)
    rc, msg = cli("resize", ck, "--vocab", 30, "--out", tmp_path / "out")
    assert rc == 5 and not (tmp_path / "out").exists()
    assert "--embedding llm.model.embed_tokens.weight --head llm.lm_head.weight" in msg
    assert "--embedding speaker.model.embed_tokens.weight --head speaker.lm_head.weight" in msg
    named = ["--embedding", "llm.model.embed_tokens.weight", "--head", "llm.lm_head.weight"]
    rc, msg = cli("resize", ck, "--vocab", 30, *named, "--out", tmp_path / "named")
    assert rc == 0, msg
    # a tokenizer of 20 tokens fits only the 24-entry vocabulary: that block is the text model's
    (ck / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(20)}}}))
    det = detect(Checkpoint.open(ck))
    assert not det.config.unclear_text and det.config.text_key == "thinker_config.text_config"
    assert det.embedding.name == "llm.model.embed_tokens.weight"


def test_draft_head_and_map_are_kept_and_a_trim_past_the_map_refused(tmp_path):
    Vt, Vd = 32, 10
    cfg = {"model_type": "llama", "vocab_size": Vt, "draft_vocab_size": Vd, "hidden_size": H}
    d2t = (np.arange(Vd) * 3 - np.arange(Vd)).astype(np.int64)  # draft i -> target 3 i (up to 27)
    t2d = np.zeros(Vt, np.bool_)
    t2d[np.arange(Vd) * 3] = True
    t = {
        "model.embed_tokens.weight": table(Vt, H),
        "lm_head.weight": table(Vd, H, 40.0),
        "d2t": d2t,
        "t2d": t2d,
    }
    ck = write(tmp_path / "in", cfg, t, "pdparams")
    det = detect(Checkpoint.open(ck))
    assert det.head.vocab == "draft_vocab_size"
    with pytest.raises(RefusedError, match="draft_vocab_size"):
        tietool.tie(ck, tmp_path / "tied")
    tietool.resize(ck, 40, tmp_path / "out", init="zeros")
    out = out_tensors(tmp_path / "out")
    assert out["lm_head.weight"].raw == t["lm_head.weight"].tobytes() and out["d2t"].raw == d2t.tobytes()
    grown = array(out["t2d"], np.bool_)
    assert grown.shape == (40,) and np.array_equal(grown[:Vt], t2d) and grown.sum() == Vd
    assert config(tmp_path / "out")["draft_vocab_size"] == Vd
    assert tietool.verify(ck, tmp_path / "out").explained
    with pytest.raises(RefusedError, match="d2t .* up to 27"):
        tietool.resize(ck, 20, tmp_path / "trim", force=True)
    tietool.resize(ck, 28, tmp_path / "trim28", force=True)  # every draft token keeps its target row


# ------------------------------------------------------------------ heads under other names


def test_head_under_a_name_the_table_lacks_is_never_tied_by_absence(tmp_path):
    cfg = {"model_type": "llama", "vocab_size": V, "hidden_size": H, "tie_word_embeddings": False}
    t = {"model.embed_tokens.weight": table(V, H), "score_head.weight": table(V, H, 9.0)}
    ck = write(tmp_path / "in", cfg, t)
    info = tietool.inspect(ck)
    assert not any("effectively tied" in p for p in info["problems"])
    assert any("score_head.weight" in p for p in info["problems"])
    for op in ("tie", "untie"):
        rc, msg = cli(op, ck, "--out", tmp_path / op)
        assert rc == 5 and "score_head.weight" in msg and "--head score_head.weight" in msg, msg
        assert not (tmp_path / op).exists()
    rc, msg = cli("tie", ck, "--head", "score_head.weight", "--out", tmp_path / "named")
    assert rc == 5 and "differs" in msg


@pytest.mark.parametrize("fmt", ["safetensors", "pdparams"])
def test_chatglm_type_with_v2_names_is_read_as_chatglm2(tmp_path, fmt):
    cfg = {"model_type": "chatglm", "padded_vocab_size": V, "hidden_size": H, "ffn_hidden_size": 16}
    t = {
        "transformer.embedding.word_embeddings.weight": table(V, H),
        "transformer.output_layer.weight": table(V, H, 3.0),
        "transformer.encoder.final_layernorm.weight": np.ones(H, np.float32),
    }
    ck = write(tmp_path / "in", cfg, t, fmt)
    det = detect(Checkpoint.open(ck))
    assert det.family.name == "chatglm_v2" and det.head.name == "transformer.output_layer.weight"
    assert det.config.vocab_key == "padded_vocab_size"
    rep = tietool.untie(ck, tmp_path / "untied")
    assert "lm_head.weight" not in out_tensors(tmp_path / "untied") and rep
    tietool.resize(ck, 32, tmp_path / "out", init="zeros")
    out, c = out_tensors(tmp_path / "out"), config(tmp_path / "out")
    assert out["transformer.output_layer.weight"].shape == (32, H)
    assert c["padded_vocab_size"] == 32 and "vocab_size" not in c
    assert tietool.verify(ck, tmp_path / "out").explained


# ------------------------------------------------------------------ 7b: a stale vocabulary size


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        ({"model_type": "llama", "vocab_size": 20}, "vocab_size"),
        (
            {"model_type": "llava", "text_config": {"model_type": "llama", "vocab_size": 20}},
            "text_config.vocab_size",
        ),
        ({"model_type": "chatglm", "padded_vocab_size": 20}, "padded_vocab_size"),
    ],
)
def test_stale_vocab_size_makes_tie_and_untie_refuse_until_resize_sets_it(tmp_path, cfg, key):
    cfg = {**cfg, "hidden_size": H, "tie_word_embeddings": True}
    emb = "transformer.embedding.word_embeddings.weight" if "padded" in key else "model.embed_tokens.weight"
    ck = write(tmp_path / "in", cfg, {emb: table(V, H)})
    for op in ("tie", "untie"):
        rc, msg = cli(op, ck, "--out", tmp_path / op)
        line = msg.strip().splitlines()[-1]
        assert rc == 5 and len(msg.strip().splitlines()) == 1, msg
        assert "config.json" in line and key in line and "20" in line and f"{V} rows" in line
        assert f"tietool resize --vocab {V}" in line and not (tmp_path / op).exists()
    tietool.resize(ck, V, tmp_path / "fixed")
    if "padded" in key:  # ChatGLM2's names: transformers has no class for it (only remote code), so the hf
        # loader's head layout is unproven there and untie asks for it, naming the option
        with pytest.raises(RefusedError, match="layout"):
            tietool.untie(tmp_path / "fixed", tmp_path / "untied")
        tietool.untie(tmp_path / "fixed", tmp_path / "untied", layout="vocab-hidden")
    else:
        tietool.untie(tmp_path / "fixed", tmp_path / "untied")
    # the head, written now that the size agrees (ChatGLM2's inside the model, beside the embedding)
    head = "transformer.output_layer.weight" if "padded" in key else "lm_head.weight"
    assert sorted(out_tensors(tmp_path / "untied")) == sorted([emb, head])


def test_token_table_under_another_module_and_a_coinciding_size_is_still_found(tmp_path):
    # V equals intermediate_size (a float axis of that size cannot tell a vocabulary), num_experts bounds
    cfg = {"model_type": "qwen3_moe", "vocab_size": V, "hidden_size": H, "intermediate_size": V}
    cfg["num_experts"] = 4
    t = {
        "model.embed_tokens.weight": table(V, H),
        "model.layers.0.mlp.router.tid2eid": (np.arange(V * 2).reshape(V, 2) % 4).astype(np.int64),
        "model.layers.0.mlp.up_proj.weight": table(V, H, 1.0),  # [intermediate, hidden]: a layer weight
        "lm_head.weight": table(V, H, 50.0),
    }
    ck = write(tmp_path / "in", cfg, t)
    det = detect(Checkpoint.open(ck))
    assert list(det.beyond.token_tables) == ["model.layers.0.mlp.router.tid2eid"] and not det.beyond.by_shape
    tietool.resize(ck, 28, tmp_path / "out", init="zeros")
    out = out_tensors(tmp_path / "out")
    assert out["model.layers.0.mlp.router.tid2eid"].shape == (28, 2)
    assert out["model.layers.0.mlp.up_proj.weight"].raw == t["model.layers.0.mlp.up_proj.weight"].tobytes()


def test_two_nested_vocabularies_without_a_text_block_refuse_naming_both_tables(tmp_path):
    cfg = {
        "model_type": "some_omni",
        "thinker_config": {"vocab_size": V, "hidden_size": H},
        "talker_config": {"vocab_size": 12, "hidden_size": H},
    }
    t = {
        "talker.model.codec_embedding.weight": table(12, H, 7.0),  # a name no table lists
        "talker.codec_head.weight": table(12, H, 70.0),
        "thinker.model.embed_tokens.weight": table(V, H),
        "thinker.lm_head.weight": table(V, H, 50.0),
    }
    ck = write(tmp_path / "in", cfg, t)
    for argv in (["resize", ck, "--vocab", 30], ["tie", ck], ["untie", ck]):
        rc, msg = cli(*argv, "--out", tmp_path / "out")
        assert rc == 5 and not (tmp_path / "out").exists(), msg
        assert "--embedding thinker.model.embed_tokens.weight --head thinker.lm_head.weight" in msg
        assert "--embedding talker.model.codec_embedding.weight --head talker.codec_head.weight" in msg
    named = ["--embedding", "thinker.model.embed_tokens.weight", "--head", "thinker.lm_head.weight"]
    rc, msg = cli("resize", ck, "--vocab", 30, *named, "--init", "zeros", "--out", tmp_path / "named")
    assert rc == 0, msg
    c = config(tmp_path / "named")
    assert c["thinker_config"]["vocab_size"] == 30 and c["talker_config"]["vocab_size"] == 12
    assert "vocab_size" not in c
    assert tietool.verify(ck, tmp_path / "named").explained


def test_draft_head_whose_size_another_key_also_names_is_still_the_draft_head(tmp_path):
    cfg = {"model_type": "llama", "vocab_size": 32, "draft_vocab_size": 16, "hidden_size": H}
    cfg["intermediate_size"] = 16
    t = {"model.embed_tokens.weight": table(32, H), "lm_head.weight": table(16, H, 40.0)}
    ck = write(tmp_path / "in", cfg, t)
    tietool.resize(ck, 40, tmp_path / "out", init="zeros")
    assert out_tensors(tmp_path / "out")["lm_head.weight"].raw == t["lm_head.weight"].tobytes()
    assert config(tmp_path / "out")["draft_vocab_size"] == 16
