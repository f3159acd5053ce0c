"""The vocabulary surface by shape for every dtype: a float tensor with an axis of the vocabulary's size that
no rule covers (a float vector included) makes resize and add-tokens refuse naming it, whatever ``--head``
says, and ``verify`` names one left at the old size; the bias beside a head named by ``--head``
(``lm_head.decoder_bias`` of ``lm_head.decoder_weight``, :data:`tietool.surgery.arch.HEAD_BIAS_OF`) is the
head's and moves with it.

The PaddleNLP 2.8.1 test builds PLATO (``unified_transformer``, ``UnifiedTransformerLMHeadModel``: its head
multiplies by the word embedding and adds ``lm_head.decoder_bias [vocab]``) with PaddleNLP's own
``save_pretrained`` in both containers, gives the bias values of its own, resizes it with
``--head lm_head.decoder_weight`` and loads the output in PaddleNLP: the logits of the kept vocabulary equal
the input's, the bias keeps its old entries and is zero beyond them. The other checkpoints are written
here with the ``safetensors`` library (names after the cases they stand for).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from support import pnlp_support
from support.pnlp_worker import VOCAB
from support.resize_support import run_cli

import tietool
from tietool.surgery.model.errors import ExitCode

V, H = 29, 8  # V prime: no size the config keys make


def table(rows: int, cols: int, offset: float = 0.0) -> np.ndarray:
    return (np.arange(rows)[:, None] + 0.01 * np.arange(cols)[None, :] + offset).astype(np.float32)


def write(folder: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(dict(tensors), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def cli(*argv) -> tuple[int, str]:
    cp = run_cli([str(a) for a in argv])
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp.returncode, cp.stdout + cp.stderr


LLAMA = {"model_type": "llama", "vocab_size": V, "hidden_size": H, "num_hidden_layers": 1}


def llama(dtype=np.float32) -> dict[str, np.ndarray]:
    return {
        "model.embed_tokens.weight": table(V, H).astype(dtype),
        "model.layers.0.mlp.up_proj.weight": table(H, 16, 1.0).astype(dtype),
        "model.norm.weight": np.ones(H, dtype),
        "lm_head.weight": table(V, H, 50.0).astype(dtype),
    }


@pytest.mark.parametrize(
    ("name", "array", "cfg"),
    [
        # a float vector over the vocabulary beside a head (PLATO's decoder_bias under another module)
        ("lm_head.logits_offset", np.linspace(0, 1, V, dtype=np.float32), {}),
        # the same where another config key names the vocabulary's size: a vector still counts
        ("lm_head.logits_offset", np.linspace(0, 1, V, dtype=np.float32), {"intermediate_size": V}),
        ("final_logits_scale", np.ones((1, V), np.float16), {}),
        # a float table inside a numbered block, of a size no config key names
        ("model.layers.0.mlp.token_gate.weight", table(V, 3), {}),
    ],
)
@pytest.mark.parametrize("head", [None, "lm_head.weight"])
def test_float_tensor_of_no_rule_is_named_and_refused_whatever_head_says(tmp_path, name, array, cfg, head):
    ck = write(tmp_path / "in", {**LLAMA, **cfg}, {**llama(), name: array})
    info = tietool.inspect(ck)
    assert any(v["name"] == name for v in info["vocabulary_tensors"])
    extra = ["--head", head] if head else []
    rc, msg = cli("resize", ck, "--vocab", 30, "--out", tmp_path / "out", *extra)
    assert rc == ExitCode.REFUSED and name in msg and "old size" in msg
    assert not (tmp_path / "out").exists()


def test_layer_weights_of_a_size_config_keys_make_are_not_vocabulary_tensors(tmp_path):
    """V equals 2 x intermediate_size (a fused gate | up) and 3 x hidden (a fused q | k | v): the layer
    weights of that size are no vocabulary tensors, and the resize runs."""
    cfg = {**LLAMA, "vocab_size": 3 * H, "intermediate_size": 12, "num_attention_heads": 2}
    t = {
        "model.embed_tokens.weight": table(3 * H, H),
        "model.layers.0.self_attn.qkv_proj.weight": table(H, 3 * H),
        "model.layers.0.mlp.up_gate_proj.weight": table(H, 24),
        "model.norm.weight": np.ones(H, np.float32),
        "lm_head.weight": table(3 * H, H, 50.0),
    }
    ck = write(tmp_path / "in", cfg, t)
    rc, msg = cli("resize", ck, "--vocab", 30, "--out", tmp_path / "out")
    assert rc == 0, msg
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    for n in ("model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.up_gate_proj.weight"):
        assert out[n].tobytes() == t[n].tobytes()


def test_add_tokens_refuses_a_float_vector_of_no_rule(tmp_path):
    src = write(tmp_path / "in", LLAMA, {**llama(), "lm_head.logits_offset": np.zeros(V, np.float32)})
    vocab = {f"t{i}": i for i in range(V)}
    (src / "tokenizer.json").write_text(
        json.dumps(
            {
                "version": "1.0",
                "added_tokens": [],
                "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
                "pre_tokenizer": {"type": "Whitespace"},
            }
        )
    )
    rc, msg = cli("add-tokens", src, "newtok", "--out", tmp_path / "out")
    assert rc == ExitCode.REFUSED and "lm_head.logits_offset" in msg, msg
    assert not (tmp_path / "out").exists()


def test_verify_names_a_float_vector_left_at_the_old_size(tmp_path):
    t = {**llama(), "lm_head.logits_offset": np.linspace(0, 1, V, dtype=np.float32)}
    ck = write(tmp_path / "in", LLAMA, t)
    stale = dict(t)
    for n in ("model.embed_tokens.weight", "lm_head.weight"):
        stale[n] = np.concatenate([t[n], t[n][:4]])
    b = write(tmp_path / "stale", {**LLAMA, "vocab_size": V + 4}, stale)
    res = tietool.verify(ck, b)
    assert res.exit_code == ExitCode.UNEXPLAINED
    assert [u for u in res.unexplained if "old size" in u] == [
        f"lm_head.logits_offset (vocab-shaped tensor) left at the old size: {V} → expected {V + 4}, as the "
        f"embedding went {V} → {V + 4} rows"
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bias_beside_a_named_head_moves_with_it(tmp_path, dtype):
    """A model type the table does not know: ``--head NAME.decoder_weight`` binds ``NAME.decoder_bias``."""
    bias = np.linspace(-1, 1, V).astype(dtype)
    t = {
        "body.word_embeddings.weight": table(V, H).astype(dtype),
        "body.layers.0.linear.weight": table(H, H).astype(dtype),
        "lm_head.decoder_weight": table(V, H, 50.0).astype(dtype),
        "lm_head.decoder_bias": bias,
    }
    cfg = {"model_type": "some_plato_like", "vocab_size": V, "hidden_size": H}
    ck = write(tmp_path / "in", cfg, t)
    rc, msg = cli("resize", ck, "--vocab", 30, "--out", tmp_path / "nohead")  # the bias is no row's
    assert rc == ExitCode.REFUSED and "lm_head.decoder_bias" in msg
    rc, msg = cli(
        "resize",
        ck,
        "--vocab",
        30,
        "--out",
        tmp_path / "out",
        "--embedding",
        "body.word_embeddings.weight",
        "--head",
        "lm_head.decoder_weight",
    )
    assert rc == 0, msg
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert out["lm_head.decoder_bias"].shape == (30,) and out["lm_head.decoder_bias"].dtype == dtype
    assert out["lm_head.decoder_bias"][:V].tobytes() == bias.tobytes()
    assert not out["lm_head.decoder_bias"][V:].any()
    assert out["lm_head.decoder_weight"].shape == (30, H)
    res = tietool.verify(ck, tmp_path / "out")
    assert res.exit_code == ExitCode.OK, res.unexplained


# ------------------------------------------------------------------ PaddleNLP 2.8.1: PLATO
@pytest.mark.pnlp
@pytest.mark.slow
def test_paddlenlp_plato_resized_with_its_head_bias_loads(tmp_path):
    pnlp_support.require()
    work = tmp_path / "w"
    bias = np.linspace(-2, 2, VOCAB).astype(np.float32)
    np.save(tmp_path / "bias.npy", bias)
    ins = {c: tmp_path / f"plato-{c}" for c in ("pdparams", "safetensors")}
    jobs: list[dict] = []
    for c, d in ins.items():
        jobs.append(
            {"op": "build", "family": "unified_transformer", "tie": "tied", "container": c, "out": str(d)}
        )
        jobs.append(
            {"op": "edit", "dir": str(d), "put": {"lm_head.decoder_bias": str(tmp_path / "bias.npy")}}
        )
    for i, d in enumerate(ins.values()):
        jobs.append(
            {"op": "load", "family": "unified_transformer", "dir": str(d), "npz": str(work / f"in{i}.npz")}
        )
    res = pnlp_support.run_jobs(jobs, work)
    assert all(r["ok"] for r in res), res
    outs = {}
    for c, d in ins.items():
        rc, msg = cli("resize", d, "--vocab", 64, "--out", tmp_path / f"out-{c}")
        assert rc == ExitCode.REFUSED and "lm_head.decoder_weight" in msg  # a head under a name the row lacks
        outs[c] = tmp_path / f"out-{c}"
        rc, msg = cli("resize", d, "--vocab", 64, "--out", outs[c], "--head", "lm_head.decoder_weight")
        assert rc == 0, msg
        assert "lm_head.decoder_bias" in msg
    loads = [
        {"op": "load", "family": "unified_transformer", "dir": str(d), "npz": str(work / f"out{i}.npz")}
        for i, d in enumerate(outs.values())
    ]
    res = pnlp_support.run_jobs(loads, work)
    for i, r in enumerate(res):
        assert r["ok"], r
        assert r["bias_shape"] == [64] and r["head_shape"] == [64, 32]
        got, want = np.load(work / f"out{i}.npz"), np.load(work / f"in{i}.npz")
        assert want["bias"].tobytes() == bias.tobytes()  # the input's bias is the one given
        assert got["bias"][:VOCAB].tobytes() == bias.tobytes() and not got["bias"][VOCAB:].any()
        np.testing.assert_allclose(got["logits"][..., :VOCAB], want["logits"], rtol=0, atol=1e-6)
        assert np.abs(got["embedding"][VOCAB:] - got["head"][VOCAB:]).max() == 0
