"""The vocabulary surface: every vocabulary tensor found with its role, the main pair chosen by the table's
preference and module depth (never file order), special token ids against the rows, a missing embedding
stored as the head, a head with fewer rows than the embedding, validated overrides.

Checkpoints are built in ``tmp_path`` (safetensors single and sharded, ``.pdparams``); outputs are read
back with the ``safetensors`` library and the independent reader of :mod:`support.casecheck`.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file
from support import casecheck
from support.resize_support import run_cli

from tietool.surgery.inspect.detect import FoundBy, detect
from tietool.surgery.inspect.findings import FindingKind
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.model.enums import TensorRole

V, H = 24, 8


def table(rows: int, cols: int, offset: float = 0.0) -> np.ndarray:
    """Row i holds i + 0.01 * column + offset (row shifts and transposes are visible)."""
    return (np.arange(rows)[:, None] + 0.01 * np.arange(cols)[None, :] + offset).astype(np.float32)


def write_ckpt(
    folder: Path, config: dict, tensors: dict[str, np.ndarray], fmt: str = "safetensors", shards: int = 1
) -> Path:
    """A checkpoint folder: config.json and the tensors in the given order (one file, or ``shards``
    safetensors shards with an index, or one ``model_state.pdparams``)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "pdparams":
        (folder / "model_state.pdparams").write_bytes(pickle.dumps(dict(tensors), protocol=4))
        return folder
    if shards == 1:
        save_file(dict(tensors), str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k * per : (k + 1) * per]}
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
        total += sum(a.nbytes for a in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def read_out(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of an output folder (casecheck's reader: safetensors or pdparams, sharded or not)."""
    ck = casecheck.read_checkpoint(folder)
    return {n: np.frombuffer(t.raw, dtype=np.float32).reshape(t.shape) for n, t in ck.tensors.items()}


def cli(*argv) -> tuple[int, str]:
    cp = run_cli([str(a) for a in argv])
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp.returncode, cp.stdout + cp.stderr


LLAMA_CFG = {"model_type": "llama", "vocab_size": V, "hidden_size": H, "tie_word_embeddings": False}
DSV3_CFG = {**LLAMA_CFG, "model_type": "deepseek_v3", "num_nextn_predict_layers": 1, "num_hidden_layers": 1}


def mtp_tensors(prefix: str = "model", head_layout: str = "vocab-hidden") -> dict[str, np.ndarray]:
    """DeepSeek-V3 with one MTP layer whose embed/head copies come first in the file."""
    emb, head = table(V, H, 0.5), table(V, H, 100.0)
    as_head = head.T.copy() if head_layout == "hidden-vocab" else head
    return {
        f"{prefix}.layers.1.embed_tokens.weight": emb.copy(),
        f"{prefix}.layers.1.shared_head.head.weight": as_head.copy(),
        f"{prefix}.layers.1.enorm.weight": np.ones(H, np.float32),
        f"{prefix}.embed_tokens.weight": emb,
        f"{prefix}.norm.weight": np.ones(H, np.float32),
        "lm_head.weight": as_head,
    }


# ------------------------------------------------------------------------------------ main pair + roles
@pytest.mark.parametrize(
    "fmt,shards", [("safetensors", 1), ("safetensors", 3), ("pdparams", 1)], ids=["st", "st-sharded", "pd"]
)
def test_mtp_copies_are_extra_tables_not_the_main_pair(tmp_path, fmt, shards):
    ck = write_ckpt(tmp_path / "in", DSV3_CFG, mtp_tensors(), fmt, shards)
    det = detect(Checkpoint.open(ck))
    assert (det.embedding.name, det.head.name) == ("model.embed_tokens.weight", "lm_head.weight")
    assert det.beyond.extra_tables == [
        "model.layers.1.embed_tokens.weight",
        "model.layers.1.shared_head.head.weight",
    ]
    roles = {v.name: r for r, vs in det.surface.items() for v in vs}
    assert roles == {
        "model.embed_tokens.weight": TensorRole.INPUT_EMBEDDING,
        "lm_head.weight": TensorRole.LM_HEAD,
        "model.layers.1.embed_tokens.weight": TensorRole.EXTRA_TABLE,
        "model.layers.1.shared_head.head.weight": TensorRole.EXTRA_TABLE,
    }
    rc, msg = cli("inspect", ck, "--json")
    assert rc == 0
    listed = {t["name"]: t["role"] for t in json.loads(msg)["vocabulary_tensors"]}
    assert listed["model.layers.1.shared_head.head.weight"] == "extra vocabulary table"


@pytest.mark.parametrize("fmt,shards", [("safetensors", 1), ("safetensors", 2), ("pdparams", 1)])
def test_resize_grows_every_vocabulary_tensor(tmp_path, fmt, shards):
    src = mtp_tensors()
    ck = write_ckpt(tmp_path / "in", DSV3_CFG, src, fmt, shards)
    rc, msg = cli("resize", ck, "--vocab", 28, "--init", "mean", "--seed", 3, "--out", tmp_path / "out")
    assert rc == 0, msg
    out = read_out(tmp_path / "out")
    for n in ("model.embed_tokens.weight", "lm_head.weight", *[k for k in src if ".layers.1." in k][:2]):
        assert out[n].shape == (28, H), n
        assert out[n][:V].tobytes() == src[n].tobytes(), n
    assert not [n for n, a in out.items() if a.shape == (V, H)]
    # the copies stay bit-exact copies of the main tables, new rows included
    assert out["model.layers.1.embed_tokens.weight"].tobytes() == out["model.embed_tokens.weight"].tobytes()
    assert out["model.layers.1.shared_head.head.weight"].tobytes() == out["lm_head.weight"].tobytes()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == 28


def test_paddlenlp_hidden_vocab_head_copy_grows_by_columns(tmp_path):
    cfg = {**DSV3_CFG, "paddlenlp_version": "3.0.0"}
    src = mtp_tensors("deepseek_v3", head_layout="hidden-vocab")
    ck = write_ckpt(tmp_path / "in", cfg, src, "pdparams")
    det = detect(Checkpoint.open(ck))
    assert (det.embedding.name, det.head.name, det.head.layout) == (
        "deepseek_v3.embed_tokens.weight",
        "lm_head.weight",
        "hidden-vocab",
    )
    rc, msg = cli("resize", ck, "--vocab", 26, "--init", "zeros", "--out", tmp_path / "out")
    assert rc == 0, msg
    out = read_out(tmp_path / "out")
    mtp_head = out["deepseek_v3.layers.1.shared_head.head.weight"]
    assert mtp_head.shape == (H, 26)
    assert np.array_equal(mtp_head[:, :V], src["deepseek_v3.layers.1.shared_head.head.weight"])
    assert not mtp_head[:, V:].any()


def test_tie_refusal_names_the_main_pair(tmp_path):
    ck = write_ckpt(tmp_path / "in", DSV3_CFG, mtp_tensors())
    rc, msg = cli("tie", ck, "--out", tmp_path / "out")
    assert rc == 5
    assert "lm_head.weight differs from model.embed_tokens.weight" in msg
    assert not (tmp_path / "out").exists()


def test_vocab_shaped_tensor_of_no_role_is_listed_and_resize_refuses(tmp_path):
    t = {"model.embed_tokens.weight": table(V, H), "lm_head.weight": table(V, H, 9.0)}
    t["model.mystery.proj"] = table(H, V)
    ck = write_ckpt(tmp_path / "in", LLAMA_CFG, t)
    det = detect(Checkpoint.open(ck))
    assert det.beyond.by_shape == ["model.mystery.proj"]
    rc, msg = cli("resize", ck, "--vocab", 30, "--out", tmp_path / "out")
    assert rc == 5 and "model.mystery.proj [8, 24]" in msg
    assert not (tmp_path / "out").exists()


def test_encoder_decoder_without_shared_table_uses_its_other_names(tmp_path):
    cfg = {"model_type": "t5", "vocab_size": V, "d_model": H, "tie_word_embeddings": True}
    emb = table(V, H)
    t = {"encoder.embed_tokens.weight": emb, "decoder.embed_tokens.weight": emb.copy(), "x.w": table(H, H)}
    ck = write_ckpt(tmp_path / "in", cfg, t)
    det = detect(Checkpoint.open(ck))
    assert det.embedding.name == "encoder.embed_tokens.weight"
    assert det.embedding.found_by is FoundBy.OTHER_NAME
    assert det.embedding.aliases == ["decoder.embed_tokens.weight"]


# ------------------------------------------------------------------------------------ special token ids
def test_special_token_ids_beyond_rows(tmp_path):
    cfg = {**LLAMA_CFG, "vocab_size": 16, "bos_token_id": 1, "eos_token_id": [2, 16], "image_token_index": 15}
    t = {"model.embed_tokens.weight": table(16, H), "lm_head.weight": table(16, H, 3.0)}
    ck = write_ckpt(tmp_path / "in", cfg, t)
    (ck / "generation_config.json").write_text(json.dumps({"pad_token_id": 14}))
    tc = {"eos_token": "<end>", "added_tokens_decoder": {"17": {"content": "<end>"}}}
    (ck / "tokenizer_config.json").write_text(json.dumps(tc))
    det = detect(Checkpoint.open(ck))
    ids = {(s.file, s.key, s.id) for s in det.special_ids}
    assert ("config.json", "eos_token_id", 16) in ids and ("tokenizer_config.json", "eos_token", 17) in ids
    problem = str(next(p for p in det.problems if p.kind is FindingKind.SPECIAL_IDS_BEYOND_ROWS))
    assert problem.startswith("token ids beyond the last row of the embedding (16 rows, ids 0..15): ")
    assert "config.json eos_token_id = 16" in problem and "tokenizer_config.json eos_token = 17" in problem
    assert "image_token_index" not in problem  # 15 < 16 rows
    # a trim that leaves ids past the last row: refused naming them
    rc, msg = cli("resize", ck, "--vocab", 12, "--out", tmp_path / "o1")
    assert rc == 5 and "image_token_index = 15" in msg and "generation_config.json pad_token_id = 14" in msg
    # with --force, a trim that cuts the token tokenizer_config.json adds (<end>, 17, its eos_token) is still
    # refused (issue 20: never a tokenizer emitting ids beyond the rows; this one has no vocabulary file to
    # edit, and a loader would add <end> back past the rows); nothing written
    rc, msg = cli("resize", ck, "--vocab", 12, "--force", "--out", tmp_path / "o2")
    assert rc == 5 and "even with --force" in msg and not (tmp_path / "o2").exists()
    # without that tokenizer file, still refused: the ids the configs name that had a row would point past
    # the last row (eos 16 was already past: not counted); nothing written
    (ck / "tokenizer_config.json").unlink()
    rc, msg = cli("resize", ck, "--vocab", 12, "--force", "--out", tmp_path / "o2")
    assert rc == 5 and "even with --force" in msg and not (tmp_path / "o2").exists()
    assert "image_token_index = 15" in msg and "generation_config.json pad_token_id = 14" in msg
    assert "keep at least 16 rows" in msg and "already past the rows: config.json eos_token_id = 16" in msg
    # without the image and pad ids: done; the id already past the rows is still named, in a warning
    cfg2 = json.loads((ck / "config.json").read_text())
    del cfg2["image_token_index"]
    (ck / "config.json").write_text(json.dumps(cfg2))
    (ck / "generation_config.json").unlink()
    rc, msg = cli("resize", ck, "--vocab", 12, "--force", "--out", tmp_path / "o3")
    assert rc == 0 and "eos_token_id = 16" in msg
    report = json.loads((tmp_path / "o3" / "tietool-report.json").read_text())
    assert any("config.json eos_token_id = 16" in w for w in report["warnings"])
    assert read_out(tmp_path / "o3")["lm_head.weight"].tobytes() == t["lm_head.weight"][:12].tobytes()


# ------------------------------------------------------------------------------------ missing embedding
FALCON_CFG = {"model_type": "falcon", "vocab_size": 16, "hidden_size": H}


def dropped_embedding(tmp_path: Path, fmt: str) -> tuple[Path, np.ndarray]:
    head = table(16, H, 0.5)
    t = {"lm_head.weight": head, "transformer.h.0.ln.weight": np.ones(H, np.float32)}
    ck = write_ckpt(tmp_path / "in", FALCON_CFG, t, fmt)
    if fmt == "safetensors":  # as a deduplicating converter records it
        save_file(
            t,
            str(ck / "model.safetensors"),
            metadata={"transformer.word_embeddings.weight": "lm_head.weight"},
        )
    return ck, head


@pytest.mark.parametrize("fmt", ["safetensors", "pdparams"])
def test_missing_embedding_is_said_and_untie_restores_both(tmp_path, fmt):
    ck, head = dropped_embedding(tmp_path, fmt)
    det = detect(Checkpoint.open(ck))
    assert not det.embedding.present and det.embedding.stored_as == "lm_head.weight"
    assert det.embedding.name == "transformer.word_embeddings.weight"  # from the metadata, or the prefix
    rc, msg = cli("inspect", ck)
    assert rc == 0 and "transformer.word_embeddings.weight is missing" in msg
    rc, msg = cli("untie", ck, "--out", tmp_path / "out")
    assert rc == 0, msg
    out = read_out(tmp_path / "out")
    assert out["transformer.word_embeddings.weight"].tobytes() == head.tobytes()
    assert out["lm_head.weight"].tobytes() == head.tobytes()
    if fmt == "safetensors":
        with safe_open(str(tmp_path / "out" / "model.safetensors"), "numpy") as f:
            assert sorted(f.keys()) == [
                "lm_head.weight",
                "transformer.h.0.ln.weight",
                "transformer.word_embeddings.weight",
            ]
            assert "transformer.word_embeddings.weight" not in (f.metadata() or {})


@pytest.mark.parametrize("fmt", ["safetensors", "pdparams"])
def test_missing_embedding_tie_keep_head_restores_it_alone(tmp_path, fmt):
    ck, head = dropped_embedding(tmp_path, fmt)
    rc, msg = cli("tie", ck, "--out", tmp_path / "refused")
    assert rc == 5 and "transformer.word_embeddings.weight is missing" in msg
    rc, msg = cli("tie", ck, "--keep", "head", "--out", tmp_path / "out")
    assert rc == 0, msg
    out = read_out(tmp_path / "out")
    restored = {"transformer.word_embeddings.weight", "transformer.h.0.ln.weight"}
    if fmt == "pdparams":  # HF-named .pdparams: PaddleFormers' legacy load, unproven for Falcon: head kept
        assert set(out) == restored | {"lm_head.weight"} and "unproven" in msg, msg
        assert out["lm_head.weight"].tobytes() == head.tobytes()
    else:
        assert set(out) == restored
    assert out["transformer.word_embeddings.weight"].tobytes() == head.tobytes()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is True
    rc, msg = cli("resize", ck, "--vocab", 20, "--out", tmp_path / "r")
    assert rc == 5 and "missing" in msg


def test_missing_embedding_with_hidden_vocab_head_is_restored_transposed(tmp_path):
    cfg = {
        "model_type": "llama",
        "vocab_size": 16,
        "hidden_size": H,
        "paddlenlp_version": "3.0",
        "tie_word_embeddings": True,
    }
    head = table(16, H).T.copy()
    ck = write_ckpt(
        tmp_path / "in",
        cfg,
        {"llama.norm.weight": np.ones(H, np.float32), "lm_head.weight": head},
        "pdparams",
    )
    det = detect(Checkpoint.open(ck))
    assert (det.embedding.name, det.head.layout, det.vocab_rows) == (
        "llama.embed_tokens.weight",
        "hidden-vocab",
        16,
    )
    rc, msg = cli("untie", ck, "--out", tmp_path / "out")
    assert rc == 0, msg
    out = read_out(tmp_path / "out")
    assert out["llama.embed_tokens.weight"].tobytes() == head.T.copy().tobytes()


# ------------------------------------------------------------------------------------ overrides, layout
def test_overrides_are_validated(tmp_path):
    t = {
        "model.embed_tokens.weight": table(V, H),
        "lm_head.weight": table(V, H, 2.0),
        "model.norm.weight": np.ones(H, np.float32),
    }
    t["model.other.weight"] = table(V, 5)
    ck = write_ckpt(tmp_path / "in", LLAMA_CFG, t)
    rc, msg = cli("inspect", ck, "--embedding", "model.norm.weight")
    assert rc == 2 and "model.norm.weight" in msg and ("1-D" in msg or "not 2-D" in msg)
    rc, msg = cli("resize", ck, "--vocab", 30, "--embedding", "model.other.weight", "--out", tmp_path / "o")
    assert rc == 2 and "hidden size 8" in msg
    rc, msg = cli("untie", ck, "--head", "model.other.weight", "--out", tmp_path / "o")
    assert rc == 2 and "[24, 5]" in msg


@pytest.mark.parametrize(
    "cfg_extra,head,argv,fits",
    [
        ({}, table(V, H, 1.0), ["--keep", "head", "--layout", "hidden-vocab"], "vocab-hidden"),
        (
            {"paddlenlp_version": "3.0"},
            table(V, H, 1.0).T.copy(),
            ["--keep", "embedding", "--layout", "vocab-hidden"],
            "hidden-vocab",
        ),
    ],
)
def test_layout_contradicting_the_head_shape_is_refused(tmp_path, cfg_extra, head, argv, fits):
    prefix = "llama" if cfg_extra else "model"
    t = {f"{prefix}.embed_tokens.weight": table(V, H), "lm_head.weight": head}
    ck = write_ckpt(tmp_path / "in", {**LLAMA_CFG, **cfg_extra}, t)
    rc, msg = cli("tie", ck, *argv, "--out", tmp_path / "out")
    assert rc == 2, msg
    assert f"{list(head.shape)}" in msg and f"--layout {fits}" in msg
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------ reserved rows
@pytest.mark.parametrize("fmt", ["safetensors", "pdparams"])
def test_embedding_with_more_rows_than_head(tmp_path, fmt):
    cfg = {**LLAMA_CFG, "vocab_size": 16}
    emb, head = table(20, H), table(16, H, 50.0)
    ck = write_ckpt(tmp_path / "in", cfg, {"model.embed_tokens.weight": emb, "lm_head.weight": head}, fmt)
    det = detect(Checkpoint.open(ck))
    assert (det.vocab_rows, det.head.rows, det.head.layout) == (20, 16, "vocab-hidden")
    rc, msg = cli("inspect", ck)
    assert rc == 0 and "embedding rows 20, head rows 16" in msg
    rc, msg = cli("tie", ck, "--keep", "embedding", "--out", tmp_path / "t")
    assert rc == 5 and "16 vocabulary rows" in msg and "[20, 8]" in msg
    rc, msg = cli("resize", ck, "--vocab", 24, "--init", "zeros", "--out", tmp_path / "out")
    assert rc == 0, msg
    out = read_out(tmp_path / "out")
    assert out["model.embed_tokens.weight"].shape == (24, H) and out["lm_head.weight"].shape == (20, H)
    assert out["lm_head.weight"][:16].tobytes() == head.tobytes() and not out["lm_head.weight"][16:].any()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == 20
