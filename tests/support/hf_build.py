#!/usr/bin/env python3
"""Tiny checkpoints written by HF transformers itself, as inputs of the ``hf`` loader's proofs.

usage: python hf_build.py PLAN.json

``PLAN.json`` is a list of ``{"model_type", "tie", "out"}``. Each entry is built as
``torch.manual_seed(0); AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **TINY[model_type],
tie_word_embeddings=...))`` and saved with transformers' own ``save_pretrained`` (safetensors) into ``out``.
Ties: ``tied`` (the flag true: transformers' save writes no head), ``untied`` (the flag false, the head an
independent random tensor), ``untied-equal`` (the flag false, the head set to a copy of the embedding before
the save: the model the tied one stands for; T5, whose tied head scales the decoder output by
``d_model ** -0.5``: the embedding times that). Encoder-decoder types are built with
``AutoModelForSeq2SeqLM``, wrappers (LLaVA) with ``AutoModelForImageTextToText`` (both flags set); an
untied BART (M2M-100 too) holds its encoder/decoder ``embed_tokens`` apart from
``model.shared`` (random at init): they are set to the shared table's values, as in released BART checkpoints
(only the head is untied). transformers 5.3's ``T5Config`` forces ``tie_word_embeddings=True`` (it keeps the
flag given as ``scale_decoder_outputs``) and its loader unties only when both tensors are in the file: the
untied T5 variants are built with the flag false (no scaling, as T5 v1.1), then the loaded model's config
flag set false and the head given a parameter of its own before ``save_pretrained``. Run under the HF venv
(``tests/tools/hf_venv.sh``, ``$HF_PYTHON``) by :func:`build`; it never imports paddle or paddleformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# model_type -> the tiny config (vocabulary 61: above every id of tests/data/fixtures/oracles/input_ids.npy)
TINY: dict[str, dict] = {
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 61, "n_positions": 64},
    "t5": {
        "d_model": 32,
        "d_ff": 64,
        "num_layers": 1,
        "num_decoder_layers": 1,
        "num_heads": 2,
        "d_kv": 16,
        "vocab_size": 61,
    },
    "bart": {
        "d_model": 32,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "vocab_size": 61,
        "max_position_embeddings": 64,
    },
    "m2m_100": {
        "d_model": 32,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "vocab_size": 61,
        "max_position_embeddings": 64,
    },
    "llava": {
        "text_config": {
            "model_type": "llama",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "vocab_size": 61,
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
            "projection_dim": 32,
        },
        "image_token_index": 60,
    },
    "falcon": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 61},
    "mistral3": {
        "text_config": {
            "model_type": "mistral",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 61,
        },
        "vision_config": {
            "model_type": "pixtral",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
            "head_dim": 16,
        },
        "image_token_index": 60,
    },
    "qwen3_vl": {
        "text_config": {
            "model_type": "qwen3_vl_text",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 61,
            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]},
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "hidden_size": 32,
            "intermediate_size": 64,
            "depth": 1,
            "num_heads": 2,
            "out_hidden_size": 32,
            "deepstack_visual_indexes": [],
        },
        "image_token_id": 58,
        "video_token_id": 59,
        "vision_start_token_id": 60,
    },
}
TIES = ("tied", "untied", "untied-equal")


def build(plan: list[dict], work: Path, python: str, timeout: float = 600) -> None:
    """Build every entry of ``plan`` (module docstring) in one subprocess of the HF venv's ``python``.

    Raises:
        RuntimeError: the subprocess failed (its stderr's tail is in the message).
    """
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan, indent=1))
    from support import preload  # the parent side only: this file also runs as a script

    cp = preload.run(
        [python, __file__, str(work / "plan.json")],
        libs=preload.TRANSFORMERS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        stdin=subprocess.DEVNULL,
    )
    if cp.returncode != 0:
        raise RuntimeError(f"hf_build.py failed (exit {cp.returncode}):\n{cp.stderr[-3000:]}")


def _build_one(model_type: str, tie: str, out: str) -> None:
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSeq2SeqLM,
    )

    torch.manual_seed(0)
    kw = json.loads(json.dumps(TINY[model_type]))
    if "text_config" in kw:  # a wrapper: the language model's flag too
        kw["text_config"]["tie_word_embeddings"] = tie == "tied"
    cfg = AutoConfig.for_model(model_type, **kw, tie_word_embeddings=tie == "tied")
    auto = (
        AutoModelForSeq2SeqLM
        if cfg.is_encoder_decoder
        else AutoModelForImageTextToText
        if "text_config" in kw
        else AutoModelForCausalLM
    )
    model = auto.from_config(cfg)
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if tie != "tied" and cfg.tie_word_embeddings:  # forced true by the config class (T5)
        model.config.tie_word_embeddings = False
        head.weight = torch.nn.Parameter(torch.randn_like(emb.weight) * emb.weight.std())
    with torch.no_grad():
        if tie == "untied-equal":
            head.weight.copy_(emb.weight * (cfg.d_model**-0.5 if model_type == "t5" else 1.0))
        for name, param in model.named_parameters():  # untied BART keeps encoder/decoder copies apart
            if name.endswith("embed_tokens.weight") and param is not emb.weight:
                param.copy_(emb.weight)
    model.save_pretrained(out)


def _main(plan_path: str) -> int:
    for job in json.loads(Path(plan_path).read_text()):
        _build_one(job["model_type"], job["tie"], job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
