"""merge of real PaddleFormers 1.2 Trainer flex checkpoints of families other than Llama: the output loads
with the library's documented default call (a plain ``from_pretrained``) and gives the trained model's
logits, or merge refuses naming the model type and the layout; ``keep_paddle_layout`` writes the training
layout and says the exact load it needs.

The inputs are ``tests/data/flex/families/<model_type>/`` (``make_trainer_families.py``: the real Trainer, 2
steps on CPU; ``checkpoint-2/model_state`` as it left it, the base model's config.json above it, the trained
model's logits on ``input_ids.npy`` as ``logits.npy``; see tests/data/flex/README.md). The logits are
computed by ``tests/data/tools/pf_logits.py`` (``from_pretrained`` as a user calls it, in the session's
long-lived logits processes, :class:`support.fixture_support.LiveLogits`, each load in a process that saw no
failed load: ``test_families.py::test_batched_logits_equal_fresh_process`` shows such loads give a fresh
subprocess's logits bit for bit) and compared with the stored oracle within 1e-5 (bit for bit on the CPU
that wrote it; another CPU may round the last bits differently), and the Paddle-layout output's legacy load
with the converted output's plain load bit for bit (same CPU, same run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import adversarial_support as av
from support import fixture_support as fs
from support import flex_support as fx
from support import paths, preload

from tietool.surgery import arch

FAMILIES = fx.DATA / "families"
# model_type -> the PaddleFormers class a user loads it with (pf_logits.py takes the Deprecated Qwen2 /
# Qwen3 / GLM-4-MoE classes when paddlefleet is missing, as the Trainer ran them)
MODEL_CLASS = {
    "gemma3_text": "Gemma3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
}
LEGACY = {"load_checkpoint_format": "legacy", "convert_from_hf": False}
TOOLS = paths.TESTS
needs_families = pytest.mark.skipif(not FAMILIES.is_dir(), reason="tests/data/flex/families not present")


def _copy(model_type: str, tmp_path: Path) -> Path:
    """A copy of the family's run folder; returns its checkpoint-2/ (config.json is in the folder above)."""
    run = tmp_path / f"run-{model_type}"
    shutil.copytree(FAMILIES / model_type, run)
    return run / "checkpoint-2"


def _load(live_logits, folder: Path, model_type: str, ids: Path, kwargs: dict | None = None) -> dict:
    """pf_logits.py's result for ``folder`` (``from_pretrained(folder, **kwargs)``) on ``ids``: ``ok``,
    ``error``, ``warnings``, ``logits`` (the array when ``ok``): the session's
    :class:`support.fixture_support.LiveLogits`."""
    return live_logits.submit(folder, MODEL_CLASS[model_type], kwargs, ids=ids).result()


def _logits(live_logits, folder: Path, model_type: str, ids: Path, kwargs: dict | None = None) -> np.ndarray:
    """PaddleFormers 1.2 logits of ``folder`` (``from_pretrained(folder, **kwargs)``) on ``ids``.

    Raises:
        AssertionError: the load failed (its error and warnings shown).
    """
    res = _load(live_logits, folder, model_type, ids, kwargs)
    assert res["ok"], {k: v for k, v in res.items() if k != "logits"}
    return res["logits"]


def _names(out: Path) -> dict[str, list[int]]:
    got: dict[str, list[int]] = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update({k: v[1] for k, v in av.st_tensors(f).items()})
    return got


def _formats(out: Path) -> set[str]:
    """The ``__metadata__`` ``format`` of every safetensors file in ``out``."""
    return {str((fs.safetensors_metadata(f) or {}).get("format")) for f in out.glob("*.safetensors")}


# ------------------------------------------------------------------------------------ converted, proven
@needs_families
@pytest.mark.parametrize("model_type", sorted(MODEL_CLASS))
def test_merged_in_the_hf_layout(model_type: str, tmp_path: Path) -> None:
    """The merge converts (exit 0): HF names (no fused projection left), every Linear [out, in] as the
    config says (q_proj [heads x head_dim, hidden]), ``format: pt``, config unmarked."""
    ck, out = _copy(model_type, tmp_path), tmp_path / "m"
    run = av.run_cli(["merge", ck, "--out", out, "--json"])
    assert run.rc == 0, run.describe()
    rep = json.loads(run.stdout)
    assert rep["to_paddleformers_layout"] and not rep["warnings"] and rep["converted"]["transposed"]
    assert rep["conversion_proof"].endswith(
        f"test_plain_from_pretrained_gives_the_trained_logits[{model_type}]"
    )
    names = _names(out)
    assert not [n for n in names if "qkv_proj" in n or "up_gate_proj" in n], sorted(names)
    cfg = json.loads((ck.parent / "config.json").read_text())
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    layer = "model.layers.1.self_attn"
    if model_type == "deepseek_v3":  # multi-head latent attention
        q = nh * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
        assert names[f"{layer}.q_b_proj.weight"] == [q, cfg["q_lora_rank"]]
        assert names[f"{layer}.o_proj.weight"] == [h, nh * cfg["v_head_dim"]]
    else:  # Qwen3-Next's query heads carry their gate: twice as wide
        q, kv = nh * cfg.get("head_dim", 8), cfg["num_key_value_heads"] * cfg.get("head_dim", 8)
        q *= 2 if model_type == "qwen3_next" else 1
        assert names[f"{layer}.q_proj.weight"] == [q, h] and names[f"{layer}.k_proj.weight"] == [kv, h]
    if model_type in arch.TIED_HEAD_NOT_EXPORTED and cfg["tie_word_embeddings"]:  # as its export writes it
        assert "lm_head.weight" not in names and [d["name"] for d in rep["dropped"]] == ["lm_head.weight"]
    else:
        assert names["lm_head.weight"] == [cfg["vocab_size"], h] and rep["dropped"] == []
    assert _formats(out) == {"pt"}
    written = json.loads((out / "config.json").read_text())
    assert "source" not in written and written["model_type"] == model_type


@pytest.mark.slow
@needs_families
@pytest.mark.parametrize("model_type", sorted(MODEL_CLASS))
def test_plain_from_pretrained_gives_the_trained_logits(model_type: str, tmp_path: Path, live_logits) -> None:
    """The proof of the family's conversion row: merged by the CLI, loaded with a plain ``from_pretrained``
    (the README's recipe), the trained model's logits; the Paddle layout written on request loads with the
    load the terminal names (the same logits bit for bit) and a plain load of it does not (other logits, or
    GLM-4-MoE's "should be assigned before!": the call is needed, not decoration)."""
    src = FAMILIES / model_type
    ids, want = src / "input_ids.npy", np.load(src / "logits.npy")
    conv, kept = tmp_path / "converted", tmp_path / "kept"
    assert av.run_cli(["merge", _copy(model_type, tmp_path), "--out", conv]).rc == 0
    run = av.run_cli(["merge", _copy(model_type, tmp_path / "k"), "--out", kept, "--keep-paddle-layout"])
    assert run.rc == 0, run.describe()
    got = _logits(live_logits, conv, model_type, ids)
    assert np.abs(got - want).max() < 1e-5, np.abs(got - want).max()
    legacy = _logits(live_logits, kept, model_type, ids, LEGACY)
    assert np.array_equal(legacy, got)
    plain = _load(live_logits, kept, model_type, ids)  # fails (GLM-4-MoE) or computes others
    if plain["ok"]:
        assert np.abs(plain["logits"] - want).max() > 1e-2
    else:
        assert "should be assigned before" in plain["error"], plain


# ------------------------------------------------------------------------------------ refused / kept
def _unknown(tmp_path: Path, model_type: str = "qwen3_vl") -> Path:
    """The Gemma 3 Trainer checkpoint under a config.json naming a model type tietool has no row for."""
    ck = _copy("gemma3_text", tmp_path)
    cfg = json.loads((ck.parent / "config.json").read_text())
    (ck.parent / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
    return ck


@needs_families
def test_a_model_type_without_conversion_data_is_refused_by_name(tmp_path: Path) -> None:
    """No row: exit 5, nothing written, the model type and the Paddle layout named, and the two fixes (the
    option that keeps the layout with the load it needs, or an HF export from the run)."""
    ck, out = _unknown(tmp_path), tmp_path / "m"
    before = av.tree_state(ck.parent)
    run = av.run_cli(["merge", ck, "--out", out])
    av.assert_refused(
        run, 5, ["qwen3_vl", "[in, out]", "--keep-paddle-layout", "convert_from_hf=False"], out=out
    )
    assert av.tree_state(ck.parent) == before


@needs_families
def test_keep_paddle_layout_writes_as_held_and_says_the_load(tmp_path: Path) -> None:
    """With the option: exit 0, the tensors as the run held them (bit for bit, fused and [in, out]),
    config ``source: paddle`` (as PaddleFormers' own legacy save marks it), ``format: np``, and the terminal
    says the exact load (a warning printed, not only in the report)."""
    ck, out = _unknown(tmp_path), tmp_path / "m"
    run = av.run_cli(["merge", ck, "--out", out, "--keep-paddle-layout"])
    assert run.rc == 0, run.describe()
    load = f'from_pretrained("{out}", load_checkpoint_format="legacy", convert_from_hf=False)'
    assert "warning:" in run.stdout and load in run.stdout, run.describe()
    rep = json.loads((out / "tietool-report.json").read_text())
    assert rep["paddle_layout_load"] == load and not rep["to_paddleformers_layout"]
    assert json.loads((out / "config.json").read_text())["source"] == "paddle"
    names = _names(out)
    held = json.loads((FAMILIES / "gemma3_text" / "state_dict_names.json").read_text())
    assert names == held
    assert _formats(out) == {"np"}


@needs_families
def test_keep_paddle_layout_output_is_named_by_inspect_and_convert(tmp_path: Path) -> None:
    """What reads the Paddle-layout output names its load: ``inspect`` (a note with the call), ``convert
    --to pdparams`` (the legacy load, never "a plain from_pretrained")."""
    ck, out = _unknown(tmp_path), tmp_path / "m"
    assert av.run_cli(["merge", ck, "--out", out, "--keep-paddle-layout"]).rc == 0
    ins = av.run_cli(["inspect", out])
    assert ins.rc == 0 and "Paddle layout" in ins.stdout and "convert_from_hf=False" in ins.stdout, (
        ins.describe()
    )
    pd = tmp_path / "pd"
    conv = av.run_cli(["convert", out, "--to", "pdparams", "--out", pd])
    assert conv.rc == 0, conv.describe()
    assert "convert_from_hf=False" in conv.stdout and "plain from_pretrained)" not in conv.stdout, (
        conv.describe()
    )


@needs_families
def test_keep_paddle_layout_of_rank_files_is_a_usage_error(tmp_path: Path) -> None:
    """The option is a flex checkpoint's: given for tensor-parallel rank files, exit 2 naming it."""
    src = tmp_path / "ranks"
    src.mkdir()
    (src / "model_state.tp00.pdparams").write_bytes(b"")
    (src / "config.json").write_text("{}")
    run = av.run_cli(["merge", src, "--out", tmp_path / "m", "--keep-paddle-layout"])
    av.assert_refused(run, 2, ["--keep-paddle-layout", "flex checkpoint"], out=tmp_path / "m")


def test_every_flex_merge_proof_names_a_row_and_a_test_that_exists() -> None:
    """``FLEX_MERGE_PROOFS`` (model type -> the test that loaded its merged Trainer checkpoint): every key a
    CONVERSIONS row, every value a test function of this repository (the family parameter one of
    MODEL_CLASS here)."""
    import ast

    from tietool.surgery import arch

    assert set(MODEL_CLASS) <= set(arch.FLEX_MERGE_PROOFS) <= set(arch.CONVERSIONS)
    for mt, node in arch.FLEX_MERGE_PROOFS.items():
        path, _, test = node.partition("::")
        tree = ast.parse((TOOLS.parent / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert test.split("[")[0] in names, node
        assert "[" not in test or test.endswith(f"[{mt}]"), node


@needs_families
def test_a_tensor_the_row_does_not_place_is_refused_with_merges_fix(tmp_path: Path) -> None:
    """A Qwen3-MoE Trainer checkpoint with one more tensor (as an MTP block or a new module would add): the
    row does not place it, so merge refuses (exit 5) naming it, and the fix is one merge has (the option
    that keeps the layout), not convert's container-only conversion; nothing written."""
    kept = tmp_path / "kept"
    run = av.run_cli(["merge", _copy("qwen3_moe", tmp_path / "a"), "--out", kept, "--keep-paddle-layout"])
    assert run.rc == 0, run.describe()
    state = {k: np.frombuffer(raw, np.float32).reshape(shape) for k, (_, shape, raw) in _raw(kept).items()}
    state["model.layers.0.mlp.mystery.weight"] = np.ones((16, 3), np.float32)
    ck = tmp_path / "b" / "checkpoint-2"
    fx.write_flex(ck / "model_state", state, ranks=2)
    shutil.copy(FAMILIES / "qwen3_moe" / "config.json", ck.parent / "config.json")
    out = tmp_path / "m"
    run = av.run_cli(["merge", ck, "--out", out])
    av.assert_refused(run, 5, ["model.layers.0.mlp.mystery.weight", "--keep-paddle-layout"], out=out)
    assert "--to" not in run.stderr, run.describe()


def _raw(out: Path) -> dict[str, tuple[str, list[int], bytes]]:
    got: dict[str, tuple[str, list[int], bytes]] = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update(av.st_tensors(f))
    return got


# ------------------------------------------------------------------------------------ tied: as exported
_EXPORT = """
import sys
import paddleformers.transformers as T
src, cls, out = sys.argv[1:4]
model = getattr(T, cls).from_pretrained(src, load_checkpoint_format="legacy", convert_from_hf=False)
model.save_pretrained(out)
"""


def _arrays(out: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    got: dict[str, np.ndarray] = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update(load_file(str(f)))
    return got


@pytest.mark.slow
@needs_families
@pytest.mark.parametrize("model_type", ["gemma3_text"])
def test_tied_merge_is_the_librarys_export(model_type: str, tmp_path: Path, live_logits) -> None:
    """The proof of ``TIED_HEAD_NOT_EXPORTED``: a tied Trainer checkpoint (the Trainer holds the tied
    parameter under the head's name too) merges into what PaddleFormers' own ``save_pretrained`` of the
    trained model writes (the Paddle-layout merge loaded with the legacy load and saved: no
    ``lm_head.weight``, every other tensor bit for bit, a fused MLP its export leaves fused compared split);
    the merge says the head is left out, and ``verify`` explains the output; a plain
    ``from_pretrained`` gives the trained logits; HF transformers (where ``$HF_PYTHON`` is set) ties the head
    and gives the logits of the same model with the head written out."""
    from support import hf_logits

    src = FAMILIES / model_type
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True
    conv, kept, export = tmp_path / "converted", tmp_path / "kept", tmp_path / "export"
    ck = _copy(model_type, tmp_path)
    run = av.run_cli(["merge", ck, "--out", conv])
    assert run.rc == 0, run.describe()
    said = " ".join(run.stdout.split())
    assert "lm_head.weight left out" in said and "writes no head" in said, run.describe()
    ver = av.run_cli(["verify", ck, conv])  # the merge as verify rebuilds it leaves the head out too
    assert ver.rc == 0, ver.describe()
    rep = json.loads((conv / "tietool-report.json").read_text())
    assert [d["name"] for d in rep["dropped"]] == ["lm_head.weight"]
    assert (
        av.run_cli(["merge", _copy(model_type, tmp_path / "k"), "--out", kept, "--keep-paddle-layout"]).rc
        == 0
    )
    assert "lm_head.weight" in _names(kept)  # the Trainer holds it
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    cp = preload.run(
        [sys.executable, "-c", _EXPORT, str(kept), MODEL_CLASS[model_type], str(export)],
        libs=preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    want, got = _arrays(export), _arrays(conv)
    assert "lm_head.weight" not in want and "lm_head.weight" not in got
    # PaddleFormers 1.2's Gemma 3 export splits only layer 0's up_gate_proj (its _gen_inv_aoa_config names
    # layer 0 alone): a later layer's is written fused, [in, out], gate | up; the merge splits every layer's
    fused = {k for k in want if k.endswith("mlp.up_gate_proj.weight")}
    for k in fused:
        g, u = np.split(want.pop(k), 2, axis=1)
        stem = k[: -len("up_gate_proj.weight")]
        want[stem + "gate_proj.weight"], want[stem + "up_proj.weight"] = g.T, u.T
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]) for k in want)
    ids = src / "input_ids.npy"
    plain = _logits(live_logits, conv, model_type, ids)
    assert np.abs(plain - np.load(src / "logits.npy")).max() < 1e-5
    python = hf_logits.python()
    if python is None or hf_logits.available(python):
        if os.environ.get("TIETOOL_REQUIRE_HF"):
            pytest.fail("TIETOOL_REQUIRE_HF is set but the HF venv is unusable")
        return
    # transformers' reference: the same model with the head written out (a copy of the embedding) under an
    # untied flag, which it reads as stored (its Gemma 3 body differs from PaddleFormers': test_hf_loader)
    from safetensors.numpy import save_file

    equal = tmp_path / "untied-equal"
    shutil.copytree(conv, equal)
    arrays = _arrays(equal)
    arrays["lm_head.weight"] = arrays["model.embed_tokens.weight"].copy()
    for f in equal.glob("*.safetensors"):
        f.unlink()
    (equal / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(arrays, str(equal / "model.safetensors"), metadata={"format": "pt"})
    (equal / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    res = hf_logits.run([conv, equal], tmp_path / "hf", python)
    assert res[conv]["ok"] and res[conv]["tied"] and not res[conv]["missing"], res[conv]
    assert res[equal]["ok"] and not res[equal]["tied"], res[equal]
    assert np.abs(res[conv]["logits"] - res[equal]["logits"]).max() < 1e-6
