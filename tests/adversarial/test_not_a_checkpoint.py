"""Folders that are not a whole checkpoint, or hold more than one: refused with the true cause, or read with
the extra files named and left out of every output (surgery/io/surface.py).

* tensor/pipeline-parallel rank files (names, or ``tensor_parallel_degree`` > 1): every command refuses,
  says "parallel" and "merge", never "rename";
* adapters (LoRA/PEFT folders and adapter-wrapped names): refused as adapters, never "not in the
  architecture table";
* a quantized embedding/head: refused as quantized; ``--embedding``/``--head`` naming a quantization
  tensor, an integer tensor or a 1-D tensor is refused;
* ``paddle.save``'s split of big arrays (``NAME@@.k`` + ``UnpackBigParamInfor@@``): read and resized as
  ``paddle.load`` joins them; a piece named with ``--embedding`` is refused;
* stray weight files (not in the index, the other format): named by inspect, left out of outputs;
* training state: left out of a write's output with the reason, or kept with ``--keep-training-state``;
* a folder with only ``model_config.json`` (PaddleNLP 2.x) is read and written.

Every checkpoint is built here, tiny, in several families and both formats, single and sharded.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import adversarial_support as av
from support import casecheck

V, H = 16, 8


def _table(v: int = V, h: int = H, scale: float = 1.0) -> np.ndarray:
    return ((np.arange(v)[:, None] + 0.01 * np.arange(h)[None, :] + 0.5) * scale).astype(np.float32)


def _tensors(family: str) -> dict[str, np.ndarray]:
    """A tiny untied model of ``family``: embedding, one norm, head (PaddleNLP heads are [hidden, vocab])."""
    norm = np.ones(H, np.float32)
    if family == "llama_pd":
        return {
            "llama.embed_tokens.weight": _table(),
            "llama.norm.weight": norm,
            "lm_head.weight": _table().T * 2,
        }
    if family == "gpt_pd":
        return {"gpt.embeddings.word_embeddings.weight": _table(), "gpt.decoder.norm.weight": norm}
    return {"model.embed_tokens.weight": _table(), "model.norm.weight": norm, "lm_head.weight": _table() * 2}


def _config(d: Path, model_type: str = "llama", **extra) -> None:
    cfg = {"model_type": model_type, "vocab_size": V, "hidden_size": H, "tie_word_embeddings": False, **extra}
    (d / "config.json").write_text(json.dumps(cfg))


def _pd(path: Path, tensors: dict, protocol: int = 4) -> None:
    obj = dict(tensors)
    obj.setdefault("StructuredToParameterName@@", {k: f"p_{i}" for i, k in enumerate(tensors)})
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def _write(d: Path, tensors: dict, fmt: str, sharded: bool = False) -> Path:
    """Weights in ``d``: one file, or two shards with an index."""
    d.mkdir(parents=True, exist_ok=True)
    if not sharded:
        if fmt == "safetensors":
            save_file(tensors, str(d / "model.safetensors"))
        else:
            _pd(d / "model_state.pdparams", tensors)
        return d
    names = list(tensors)
    parts = [names[: len(names) // 2], names[len(names) // 2 :]]
    stem, ext = ("model", "safetensors") if fmt == "safetensors" else ("model_state", "pdparams")
    wm = {}
    for k, part in enumerate(parts, 1):
        f = f"{stem}-0000{k}-of-00002.{ext}"
        sub = {n: tensors[n] for n in part}
        save_file(sub, str(d / f)) if fmt == "safetensors" else _pd(d / f, sub)
        wm.update(dict.fromkeys(part, f))
    total = sum(a.nbytes for a in tensors.values())
    (d / f"{stem}.{ext}.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": wm})
    )
    return d


def _model(tmp: Path, family: str = "qwen_st", sharded: bool = False) -> Path:
    fmt = "pdparams" if family.endswith("_pd") else "safetensors"
    d = _write(tmp / "ckpt", _tensors(family), fmt, sharded)
    _config(d, {"llama_pd": "llama", "gpt_pd": "gpt", "qwen_st": "qwen2"}[family])
    return d


def _argv(command: str, ckpt: Path, out: Path, extra: tuple = ()) -> list:
    return av.command_argv(command, ckpt, out, extra)


def _refused(
    tmp: Path, ckpt: Path, code: int, words: tuple[str, ...], commands=av.COMMANDS, extra=()
) -> list[str]:
    """Run every command on ``ckpt``; each must be refused with ``code``, one line naming ``words`` (case-
    insensitive), no 'rename' and no 'not in the architecture table'. Returns the messages."""
    before = av.tree_state(ckpt)
    msgs = []
    for command in commands:
        out = tmp / f"out_{command}"
        run = av.run_cli(_argv(command, ckpt, out, extra))
        av.assert_refused(run, code, inp=ckpt, before=before, out=out)
        low = run.stderr.lower()
        for w in words:
            assert w.lower() in low, f"{w!r} not in the message\n{run.describe()}"
        for w in ("rename", "not in the architecture table"):
            assert w not in low, f"{w!r} in the message\n{run.describe()}"
        msgs.append(run.stderr)
    return msgs


# ---------------------------------------------------------------------------------- rank files
def _rank_files(tmp: Path, names: list[str], fmt: str) -> Path:
    d = tmp / "ckpt"
    d.mkdir()
    full = _tensors("llama_pd")
    for r, n in enumerate(names):
        half = {
            "llama.embed_tokens.weight": full["llama.embed_tokens.weight"][r * 8 : (r + 1) * 8],
            "llama.norm.weight": full["llama.norm.weight"],
            "lm_head.weight": np.ascontiguousarray(full["lm_head.weight"][:, r * 8 : (r + 1) * 8]),
        }
        save_file(half, str(d / n)) if fmt == "safetensors" else _pd(d / n, half)
    _config(d, paddlenlp_version="2.8.1")
    return d


@pytest.mark.parametrize(
    ("names", "fmt", "kind"),
    [
        (["model_state.tp00.pdparams", "model_state.tp01.pdparams"], "pdparams", "tensor-parallel"),
        (["model_state.tp00_pp00.pdparams", "model_state.tp01_pp00.pdparams"], "pdparams", "tensor-parallel"),
        (["model_state.pp00.pdparams", "model_state.pp01.pdparams"], "pdparams", "pipeline-parallel"),
        (
            ["model-00001-of-00001.tp00.safetensors", "model-00001-of-00001.tp01.safetensors"],
            "safetensors",
            "tensor",
        ),
    ],
    ids=["pd_tp", "pd_tp_pp", "pd_pp", "st_tp"],
)
def test_rank_files_refused_everywhere(tmp_path: Path, names: list[str], fmt: str, kind: str) -> None:
    ckpt = _rank_files(tmp_path, names, fmt)
    msgs = _refused(tmp_path, ckpt, 5, ("parallel", "merge", kind, names[0]))
    assert all("tietool merge" in m for m in msgs)
    assert all(("merge_tensor_parallel" in m) == ("tensor" in kind) for m in msgs)


@pytest.mark.parametrize("fmt", ["pdparams", "safetensors"])
def test_tensor_parallel_degree_in_config_refused(tmp_path: Path, fmt: str) -> None:
    """One rank's file saved (or renamed) under the whole-model name: config.json still says the degree."""
    ckpt = _model(tmp_path, "llama_pd" if fmt == "pdparams" else "qwen_st")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "tensor_parallel_degree": 2}))
    _refused(tmp_path, ckpt, 5, ("tensor_parallel_degree = 2", "merge"))


def test_rank_files_beside_whole_weights_left_out(tmp_path: Path) -> None:
    ckpt = _model(tmp_path, "llama_pd")
    _pd(ckpt / "model_state.tp00.pdparams", {"llama.norm.weight": np.ones(H, np.float32)})
    run = av.run_cli(["inspect", ckpt, "--json"])
    assert run.rc == 0, run.describe()
    info = json.loads(run.stdout)
    assert info["left_out"] == [
        {
            "file": "model_state.tp00.pdparams",
            "reason": "rank-file",
            "bytes": info["left_out"][0]["bytes"],
            "kept": False,
        }
    ]
    out = tmp_path / "out"
    run = av.run_cli(["tie", ckpt, "--out", out, "--keep", "embedding"])
    assert run.rc == 0, run.describe()
    assert not (out / "model_state.tp00.pdparams").exists()
    assert "model_state.tp00.pdparams (" in run.stdout


# ---------------------------------------------------------------------------------- adapters
@pytest.mark.parametrize(
    "files",
    [
        {"lora_config.json": "{}", "lora_model_state.pdparams": None},
        {"adapter_config.json": "{}", "adapter_model.safetensors": None},
        {"adapter_model.safetensors": None},
    ],
    ids=["paddlenlp_lora", "peft_adapter", "peft_no_config"],
)
def test_adapter_folder_refused(tmp_path: Path, files: dict) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    lora = {"llama.layers.0.self_attn.q_proj.lora_A": np.zeros((H, 2), np.float32)}
    for name, text in files.items():
        if text is not None:
            (d / name).write_text(text)
        elif name.endswith(".pdparams"):
            _pd(d / name, lora)
        else:
            save_file(lora, str(d / name))
    _config(d, "qwen2")
    _refused(tmp_path, d, 5, ("adapter", "merge"))


@pytest.mark.parametrize(
    ("family", "rename"),
    [
        ("qwen_st", lambda n: "base_model.model." + n),
        ("llama_pd", lambda n: n),  # PaddleNLP LoRA names: q_proj.lora_A / lora_B beside the base weights
    ],
    ids=["peft_prefix_st", "paddlenlp_lora_names_pd"],
)
@pytest.mark.parametrize("sharded", [False, True])
def test_adapter_wrapped_names_refused(tmp_path: Path, family: str, rename, sharded: bool) -> None:
    t = {rename(n): a for n, a in _tensors(family).items()}
    t[rename("model.layers.0.self_attn.q_proj.lora_B")] = np.zeros((H, 2), np.float32)
    fmt = "pdparams" if family.endswith("_pd") else "safetensors"
    d = _write(tmp_path / "ckpt", t, fmt, sharded)
    _config(d, "qwen2" if fmt == "safetensors" else "llama")
    _refused(tmp_path, d, 5, ("adapter", "merge_lora"), commands=("inspect", "resize"))


# ---------------------------------------------------------------------------------- quantized
@pytest.mark.parametrize(
    ("family", "edit"),
    [
        # GPTQ-style head: qweight / scales / qzeros instead of lm_head.weight
        (
            "qwen_st",
            lambda t: (
                t.pop("lm_head.weight") is not None
                and t.update(
                    {
                        "lm_head.qweight": np.zeros((1, V), np.int32),
                        "lm_head.scales": np.ones((1, V), np.float16),
                        "lm_head.qzeros": np.zeros((1, 2), np.int32),
                    }
                )
            ),
        ),
        # weight-only int8 embedding with its scale (Paddle names)
        (
            "llama_pd",
            lambda t: t.update(
                {
                    "llama.embed_tokens.weight": np.zeros((V, H), np.int8),
                    "llama.embed_tokens.weight_scale": np.ones(V, np.float32),
                }
            ),
        ),
        # an int8 embedding with no scale tensor: the dtype alone says it
        ("llama_pd", lambda t: t.update({"llama.embed_tokens.weight": np.zeros((V, H), np.int8)})),
    ],
    ids=["st_gptq_head", "pd_int8_embedding_scale", "pd_int8_embedding_dtype"],
)
@pytest.mark.parametrize("sharded", [False, True])
def test_quantized_vocab_table_refused(tmp_path: Path, family: str, edit, sharded: bool) -> None:
    t = _tensors(family)
    edit(t)
    fmt = "pdparams" if family.endswith("_pd") else "safetensors"
    d = _write(tmp_path / "ckpt", t, fmt, sharded)
    _config(d, "qwen2" if fmt == "safetensors" else "llama", quantization_config={"quant_method": "gptq"})
    _refused(tmp_path, d, 5, ("quantized",))


@pytest.mark.parametrize(
    ("option", "name", "word"),
    [
        ("--embedding", "model.norm.weight", "1-d"),
        ("--head", "model.ids", "int64"),
        ("--embedding", "model.extra.weight_scale", "quantization tensor"),
    ],
)
def test_named_tensor_that_is_no_table_refused(tmp_path: Path, option: str, name: str, word: str) -> None:
    t = _tensors("qwen_st")
    t["model.ids"] = np.arange(V * H, dtype=np.int64).reshape(V, H)
    t["model.extra.weight_scale"] = np.ones((V, H), np.float32)
    d = _write(tmp_path / "ckpt", t, "safetensors")
    _config(d, "qwen2")
    _refused(tmp_path, d, 2, (word, name), extra=(option, name))


# ---------------------------------------------------------------------------------- paddle.save split
def _split_ckpt(tmp: Path, protocol: int, pieces: int = 2) -> Path:
    """``paddle.save`` with protocol < 4: big arrays as flat ``NAME@@.k`` pieces and a table,
    ``UnpackBigParamInfor@@``."""
    full = _tensors("llama_pd")
    obj: dict = {"llama.norm.weight": full["llama.norm.weight"]}
    table = {}
    for name in ("llama.embed_tokens.weight", "lm_head.weight"):
        flat = full[name].reshape(-1)
        slices = [f"{name}@@.{k}" for k in range(pieces)]
        for k, chunk in enumerate(np.array_split(flat, pieces)):
            obj[slices[k]] = chunk
        table[name] = {"OriginShape": full[name].shape, "slices": slices}
    obj["StructuredToParameterName@@"] = {n: n for n in full}
    obj["UnpackBigParamInfor@@"] = table
    d = tmp / "ckpt"
    d.mkdir()
    with open(d / "model_state.pdparams", "wb") as f:
        pickle.dump(obj, f, protocol=protocol)
    _config(d, "llama", paddlenlp_version="3.0.0")
    return d


@pytest.mark.parametrize("protocol", [2, 3])
def test_split_parameters_joined_and_resized(tmp_path: Path, protocol: int) -> None:
    ckpt = _split_ckpt(tmp_path, protocol, pieces=2 if protocol == 2 else 3)
    before = av.tree_state(ckpt)
    run = av.run_cli(["inspect", ckpt, "--json"])
    assert run.rc == 0, run.describe()
    info = json.loads(run.stdout)
    assert info["embedding"]["name"] == "llama.embed_tokens.weight" and info["embedding"]["shape"] == [V, H]
    assert info["head"]["name"] == "lm_head.weight" and info["head"]["shape"] == [H, V]
    assert info["tie"]["values"] == "different"
    out = tmp_path / "out"
    run = av.run_cli(["resize", ckpt, "--vocab", 20, "--init", "zeros", "--out", out])
    assert run.rc == 0, run.describe()
    assert av.tree_state(ckpt) == before
    got = casecheck.read_checkpoint(out)
    assert not got.problems, got.problems
    emb = got.tensors["llama.embed_tokens.weight"]
    head = got.tensors["lm_head.weight"]
    assert emb.shape == (20, H) and head.shape == (H, 20)
    e = np.frombuffer(emb.raw, np.float32).reshape(20, H)
    h = np.frombuffer(head.raw, np.float32).reshape(H, 20)
    full = _tensors("llama_pd")
    assert np.array_equal(e[:V], full["llama.embed_tokens.weight"]) and not e[V:].any()
    assert np.array_equal(h[:, :V], full["lm_head.weight"]) and not h[:, V:].any()
    assert not any("@@" in n for n in got.tensors)
    # the output reads back as a plain checkpoint (the joined arrays written whole)
    assert av.run_cli(["inspect", out]).rc == 0


def test_split_piece_named_refused(tmp_path: Path) -> None:
    ckpt = _split_ckpt(tmp_path, 2)
    msgs = _refused(
        tmp_path,
        ckpt,
        2,
        ("piece", "--embedding llama.embed_tokens.weight"),
        extra=("--embedding", "llama.embed_tokens.weight@@.0"),
    )
    assert all("internal error" not in m for m in msgs)


def test_split_table_naming_a_missing_piece_refused(tmp_path: Path) -> None:
    ckpt = _split_ckpt(tmp_path, 2)
    p = ckpt / "model_state.pdparams"
    obj = pickle.loads(p.read_bytes())
    del obj["lm_head.weight@@.1"]
    p.write_bytes(pickle.dumps(obj, protocol=2))
    _refused(
        tmp_path, ckpt, 3, ("UnpackBigParamInfor@@", "lm_head.weight@@.1"), commands=("inspect", "untie")
    )


# ---------------------------------------------------------------------------------- stray weight files
@pytest.mark.parametrize(
    ("family", "sharded", "stray", "reason"),
    [
        ("qwen_st", True, "model.safetensors", "not-in-index"),
        ("llama_pd", True, "model_state.pdparams", "not-in-index"),
        ("qwen_st", True, "model_state.pdparams", "other-format"),
        ("qwen_st", False, "model_state.pdparams", "other-format"),
        # a safetensors shard without its index beside a single .pdparams: the .pdparams is the checkpoint
        ("llama_pd", False, "model-00001-of-00002.safetensors", "other-format"),
        ("qwen_st", True, "pytorch_model.bin", "other-format"),
    ],
)
def test_stray_weight_file_named_and_left_out(
    tmp_path: Path, family: str, sharded: bool, stray: str, reason: str
) -> None:
    ckpt = _model(tmp_path, family, sharded=sharded)
    other = {"x.weight": np.ones((2, 2), np.float32)}
    if stray.endswith(".safetensors"):
        save_file(other, str(ckpt / stray))
    elif stray.endswith(".pdparams"):
        _pd(ckpt / stray, other)
    else:
        (ckpt / stray).write_bytes(b"torch zip")
    size = (ckpt / stray).stat().st_size
    before = av.tree_state(ckpt)
    run = av.run_cli(["inspect", ckpt])
    assert run.rc == 0 and f"left out: {stray} ({size} bytes" in run.stdout, run.describe()
    run = av.run_cli(["inspect", ckpt, "--json"])
    assert json.loads(run.stdout)["left_out"] == [
        {"file": stray, "reason": reason, "bytes": size, "kept": False}
    ]
    out = tmp_path / "out"
    run = av.run_cli(["untie", ckpt, "--out", out])
    assert run.rc == 0, run.describe()
    assert not (out / stray).exists()
    assert f"left out of the output (not copied): {stray} ({size} bytes" in run.stdout
    rep = json.loads((out / "tietool-report.json").read_text())
    assert rep["left_out"] == [{"file": stray, "reason": reason, "bytes": size, "kept": False}]
    assert av.tree_state(ckpt) == before


def test_unlisted_shard_left_out(tmp_path: Path) -> None:
    ckpt = _model(tmp_path, "qwen_st", sharded=True)
    save_file({"y.weight": np.ones(3, np.float32)}, str(ckpt / "model-00003-of-00003.safetensors"))
    out = tmp_path / "out"
    run = av.run_cli(["resize", ckpt, "--vocab", 20, "--out", out, "--json"])
    assert run.rc == 0, run.describe()
    rep = json.loads(run.stdout)
    assert [x["file"] for x in rep["left_out"]] == ["model-00003-of-00003.safetensors"]
    assert rep["left_out"][0]["reason"] == "not-in-index"
    assert not (out / "model-00003-of-00003.safetensors").exists()


# ---------------------------------------------------------------------------------- training state
TRAINING = [
    "optimizer.pdopt",
    "master_weights.pdparams",
    "scheduler.pdparams",
    "trainer_state.json",
    "rng_state.pth",
]


def _with_training_state(tmp: Path, family: str, sharded: bool) -> Path:
    ckpt = _model(tmp, family, sharded)
    for f in TRAINING:
        (ckpt / f).write_bytes(b"state of " + f.encode())
    (ckpt / "training_args.bin").write_bytes(b"args")  # not per-parameter: always carried
    return ckpt


@pytest.mark.parametrize(("family", "sharded"), [("llama_pd", False), ("qwen_st", True)])
def test_resize_drops_training_state_by_default(tmp_path: Path, family: str, sharded: bool) -> None:
    ckpt = _with_training_state(tmp_path, family, sharded)
    run = av.run_cli(["inspect", ckpt, "--json"])
    assert run.rc == 0, run.describe()
    assert sorted(json.loads(run.stdout)["training_state"]) == sorted(TRAINING)
    out = tmp_path / "out"
    run = av.run_cli(["resize", ckpt, "--vocab", 20, "--out", out])
    assert run.rc == 0, run.describe()
    for f in TRAINING:
        assert not (out / f).exists()
        assert f"training state left out of the output (not copied): {f}" in run.stdout
    assert (out / "training_args.bin").exists()
    rep = json.loads((out / "tietool-report.json").read_text())
    assert sorted(x["file"] for x in rep["left_out"] if x["reason"] == "training-state") == sorted(TRAINING)
    assert not any(x["kept"] for x in rep["left_out"])


def test_resize_keep_training_state(tmp_path: Path) -> None:
    """With --keep-training-state the files of no parameter are copied (issue 21: optimizer files are
    resized where tietool reads them, tests/oracles/test_training_state.py, and refused by name where it
    cannot)."""
    ckpt = _with_training_state(tmp_path, "llama_pd", False)
    for f in ("optimizer.pdopt", "master_weights.pdparams"):
        (ckpt / f).unlink()
    out = tmp_path / "out"
    run = av.run_cli(["resize", ckpt, "--vocab", 20, "--out", out, "--keep-training-state"])
    assert run.rc == 0, run.describe()
    for f in TRAINING[2:]:
        assert (out / f).read_bytes() == (ckpt / f).read_bytes()
        assert f"training state copied: {f}" in run.stdout
    rep = json.loads((out / "tietool-report.json").read_text())
    assert all(x["kept"] for x in rep["left_out"] if x["reason"] == "training-state")


def test_resize_keep_training_state_refuses_what_it_cannot_resize(tmp_path: Path) -> None:
    """Optimizer state tietool cannot resize is refused by name, nothing written (it copied it, stale,
    before issue 21)."""
    ckpt = _with_training_state(tmp_path, "llama_pd", False)
    out = tmp_path / "out"
    run = av.run_cli(["resize", ckpt, "--vocab", 20, "--out", out, "--keep-training-state"])
    av.assert_refused(run, 5, ["master_weights.pdparams", "--keep-training-state"], out=out)
    (ckpt / "master_weights.pdparams").unlink()
    run = av.run_cli(["resize", ckpt, "--vocab", 20, "--out", out, "--keep-training-state"])
    av.assert_refused(run, 3, ["optimizer.pdopt"], out=out)  # not a pickle: damaged


@pytest.mark.parametrize("command", ["tie", "untie"])
def test_tie_untie_drop_training_state(tmp_path: Path, command: str) -> None:
    ckpt = _with_training_state(tmp_path, "qwen_st", False)
    out = tmp_path / "out"
    extra = ["--keep", "embedding"] if command == "tie" else []
    run = av.run_cli([command, ckpt, "--out", out, *extra])
    assert run.rc == 0, run.describe()
    if command == "untie":  # the head is already there: nothing changes, the state stays valid
        assert all((out / f).exists() for f in TRAINING)
    else:
        assert not any((out / f).exists() for f in TRAINING)


# ---------------------------------------------------------------------------------- model_config.json only
def test_model_config_json_only_folder(tmp_path: Path) -> None:
    """PaddleNLP 2.x wrote model_config.json (init_args) and no config.json: it is the config."""
    d = _write(tmp_path / "ckpt", _tensors("gpt_pd"), "pdparams")
    mc = {
        "init_args": [{"vocab_size": V, "hidden_size": H, "num_hidden_layers": 1}],
        "init_class": "GPTForCausalLM",
    }
    (d / "model_config.json").write_text(json.dumps(mc))
    run = av.run_cli(["inspect", d, "--json"])
    assert run.rc == 0, run.describe()
    info = json.loads(run.stdout)
    assert info["embedding"]["name"] == "gpt.embeddings.word_embeddings.weight"
    assert info["vocab"]["config_vocab_size"] == V and info["model_type"] == "gpt"
    out = tmp_path / "out"
    run = av.run_cli(["resize", d, "--vocab", 20, "--out", out])
    assert run.rc == 0, run.describe()
    assert json.loads((out / "model_config.json").read_text())["init_args"][0]["vocab_size"] == 20
    assert not (out / "config.json").exists()
    got = casecheck.read_checkpoint(out)
    assert got.tensors["gpt.embeddings.word_embeddings.weight"].shape == (20, H)
