"""Every fixture × every ``tietool convert --to`` target, each output loaded by the library meant to read it.

The inputs are the library-written fixtures (``tests/data/fixtures/cases``: PaddleFormers 1.2 and PaddleNLP
2.8.1 ``save_pretrained``) and two case-like edits of ``pf_llama_tied_fp32``: with trained (non-zero)
attention biases (``attention_bias: true``, as a PaddleFormers Llama of that config holds them), and with
its stored head trained apart from the embedding under the tied flag. Each cell is one of:

* **refused**: exit 5 and one line naming the file and a fix (a family the target library lacks, a layout
  no loader of the container reads, tensors the target class has no parameter for, a stored head the two
  libraries would treat differently);
* **written for a loader these tests do not have** (``--to paddlenlp`` of Qwen2: PaddleNLP 3): the terminal
  names that loader;
* **written and loaded**: by the library meant to read it (``paddleformers``: PaddleFormers 1.2;
  ``paddlenlp``: PaddleNLP 2.8.1; ``safetensors`` / ``pdparams``: the input's own library), with the call
  the terminal states (PaddleFormers' legacy Paddle layout: ``load_checkpoint_format="legacy",
  convert_from_hf=False``; else a plain ``from_pretrained``), and its logits equal the input's under its own
  library (same library: bit for bit; across libraries, whose kernels differ: within 1e-4; a model that does
  not run on input ids alone, T5: every loaded tensor equal).

The input ids hold no padding id (0): PaddleNLP masks padding tokens and PaddleFormers does not, so a batch
with one would differ across libraries whatever the weights. One subprocess per library loads every output
(``support/convert_loads.py``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from support import convert_loads, paths, pnlp_support
from support.cli_runner import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.pnlp]

TARGETS = ("paddleformers", "paddlenlp", "safetensors", "pdparams")
IDS = [[3, 17, 5, 44, 9, 28, 39, 1], [7, 11, 33, 12, 47, 21, 2, 30]]  # no padding id; below every vocab
LEGACY_CALL = 'load_checkpoint_format="legacy", convert_from_hf=False'
# model_type -> (PaddleFormers 1.2 class, PaddleNLP 2.8.1 class); None: the library has none
CLASSES = {
    "llama": ("LlamaForCausalLM", "LlamaForCausalLM"),
    "qwen2": ("Qwen2ForCausalLMDeprecated", None),  # fixtures README: Qwen2ForCausalLM needs paddlefleet
    "ernie4_5": ("Ernie4_5ForCausalLM", None),
    "gemma3_text": ("Gemma3ForCausalLM", None),
    "gpt": (None, "GPTForCausalLM"),
    "bert": (None, "BertForMaskedLM"),
    "t5": (None, "T5ForConditionalGeneration"),
}
BIASED = "pf_llama_tied_biased"
APART = "pf_llama_tied_head_apart"


def _biased(root: Path) -> Path:
    """pf_llama_tied_fp32 with non-zero q/k/v/o biases and ``attention_bias: true``."""
    src, out = paths.CASES_DIR / "pf_llama_tied_fp32", root / BIASED
    shutil.copytree(src, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "attention_bias": True}))
    f = out / "model-00001-of-00001.safetensors"
    t = load_file(str(f))
    rng = np.random.default_rng(5)
    for p in "qkvo":
        w = t[f"model.layers.0.self_attn.{p}_proj.weight"]
        t[f"model.layers.0.self_attn.{p}_proj.bias"] = rng.normal(0, 0.5, w.shape[0]).astype(np.float32)
    save_file(t, str(f), metadata={"format": "pt"})
    index = json.loads((out / "model.safetensors.index.json").read_text())
    for p in "qkvo":
        index["weight_map"][f"model.layers.0.self_attn.{p}_proj.bias"] = f.name
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def _apart(root: Path) -> Path:
    """pf_llama_tied_fp32 whose stored head differs from the embedding (trained apart) under the tied flag."""
    out = root / APART
    shutil.copytree(paths.CASES_DIR / "pf_llama_tied_fp32", out)
    f = out / "model-00001-of-00001.safetensors"
    t = load_file(str(f))
    t["lm_head.weight"] = t["lm_head.weight"] + np.random.default_rng(6).normal(0, 0.3, (100, 16)).astype(
        np.float32
    )
    save_file(t, str(f), metadata={"format": "pt"})
    return out


def _library(fixture: str) -> str:
    return "pn" if fixture.startswith("pnlp_") else "pf"


def _job(ckpt: Path, lib: str, model_type: str, legacy: bool, name: str) -> dict | None:
    cls = CLASSES[model_type][0 if lib == "pf" else 1]
    if cls is None:
        return None
    kwargs = {"dtype": "float32", **(convert_loads.LEGACY if legacy else {})}
    return {"ckpt": str(ckpt), "model_class": cls, "kwargs": kwargs, "ids": IDS, "name": name, "lib": lib}


def _convert(src: Path, to: str, out: Path) -> tuple[int, str]:
    cp = run_cli(["convert", str(src), "--to", to, "--out", str(out)])
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp.returncode, cp.stdout + cp.stderr


def _cells(tmp_path: Path) -> tuple[list[dict], dict[str, dict]]:
    """The loads (inputs first) and every cell's conversion: ``{fixture|target: {rc, msg, job}}``."""
    inputs = sorted(p for p in paths.CASES_DIR.iterdir() if (p / "config.json").is_file())
    inputs += [_biased(tmp_path), _apart(tmp_path)]
    jobs, cells = [], {}
    for src in inputs:
        fx, lib = src.name, _library(src.name)
        mt = json.loads((src / "config.json").read_text())["model_type"]
        legacy = "legacy" in fx
        if (ref := _job(src, lib, mt, legacy, f"{fx}|input")) is not None:
            jobs.append(ref)
        for to in TARGETS:
            out = tmp_path / f"{fx}--{to}"
            rc, msg = _convert(src, to, out)
            cell = cells[f"{fx}|{to}"] = {"rc": rc, "msg": msg, "job": None}
            if rc != 0:
                continue
            meant = {"paddleformers": "pf", "paddlenlp": "pn"}.get(to, lib)
            said = LEGACY_CALL in msg
            if meant == "pn" and "paddlenlp_version" not in json.loads((out / "config.json").read_text()):
                continue  # written for PaddleNLP 3 (asserted below)
            cell["job"] = _job(out, meant, mt, said, f"{fx}|{to}")
            if cell["job"] is not None:
                jobs.append(cell["job"])
    return jobs, cells


def test_every_fixture_converted_to_every_target_loads_right_or_is_refused(tmp_path):
    pnlp_support.require()
    jobs, cells = _cells(tmp_path / "c")
    pf = [j for j in jobs if j["lib"] == "pf"]
    pn = [j for j in jobs if j["lib"] == "pn"]
    rows = convert_loads.load_all(pf, str(tmp_path / "pf"))
    rows += convert_loads.load_all(pn, str(tmp_path / "pn"), python=os.environ["PNLP_PYTHON"])
    loaded = {r["job"]["name"]: r for r in rows}
    verdicts: dict[str, str] = {}
    for key, cell in cells.items():
        fx, to = key.split("|")
        if cell["rc"] != 0:
            assert cell["rc"] == 5, (key, cell["msg"])
            assert " — " in cell["msg"] and len(cell["msg"].strip().splitlines()) == 1, (key, cell["msg"])
            verdicts[key] = "refused"
            continue
        if cell["job"] is None:
            if to == "paddlenlp":
                assert "PaddleNLP 3" in cell["msg"], (key, cell["msg"])
                verdicts[key] = "for PaddleNLP 3"
            else:
                verdicts[key] = "no class to load with"
            continue
        ref, got = loaded[f"{fx}|input"], loaded[key]
        assert ref["ok"], (fx, ref["error"])
        assert got["ok"], (key, got["error"], cell["msg"][-600:])
        assert not [w for w in got["warnings"] if "not used" in w or "newly initialized" in w], (key, got)
        same = ref["job"]["lib"] == got["job"]["lib"]
        if "logits" in ref["arrays"]:
            a, b = got["arrays"]["logits"], ref["arrays"]["logits"]
            d = float(np.abs(a - b).max())
            assert d == 0 if same else d < 1e-4, (key, d)
            verdicts[key] = f"loads, logits Δ {d:.1g}"
        else:  # no logits from input ids alone (T5): every loaded tensor is the input's
            state = {k: v for k, v in ref["arrays"].items() if k.startswith("state/")}
            assert same and state.keys() == {k for k in got["arrays"] if k.startswith("state/")}
            for k, v in state.items():
                assert got["arrays"][k].tobytes() == v.tobytes(), (key, k)
            verdicts[key] = "loads, every tensor equal"
    # the cells the fixtures must give (a change of verdict is a change of behaviour)
    assert verdicts[f"{BIASED}|paddlenlp"] == "refused"
    assert "q_proj.bias" in cells[f"{BIASED}|paddlenlp"]["msg"]
    assert verdicts[f"{BIASED}|paddleformers"].startswith("loads")
    # PaddleFormers ties: the head trained apart under the tied flag is not the one it loads (its logits are
    # the tied fixture's), PaddleNLP would use it: refused, naming both tensors
    tied_ref = loaded["pf_llama_tied_fp32|input"]["arrays"]["logits"]
    assert loaded[f"{APART}|input"]["arrays"]["logits"].tobytes() == tied_ref.tobytes()
    assert verdicts[f"{APART}|paddlenlp"] == "refused"
    assert "lm_head.weight differs from model.embed_tokens.weight" in cells[f"{APART}|paddlenlp"]["msg"]
    assert verdicts[f"{APART}|paddleformers"].startswith("loads")
    assert verdicts["pf_llama_tied_fp32|paddlenlp"].startswith("loads")
    assert verdicts["pf_llama_tied_sharded|paddlenlp"].startswith("loads")
    assert verdicts["pf_llama_untied_legacy_pdparams|safetensors"].startswith("loads")  # the call said
    assert verdicts["pf_qwen2_tied|paddlenlp"] == "for PaddleNLP 3"
    assert sum(v.startswith("loads") for v in verdicts.values()) >= 40, verdicts
