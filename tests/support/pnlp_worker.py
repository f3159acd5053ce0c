"""Runs under PaddleNLP 2.8.1 on paddle 2.6.2 (``PNLP_PYTHON``), never in tietool's own venv: builds tiny
real checkpoints with the library's own ``save_pretrained`` and loads checkpoint folders with its own
``from_pretrained``, reporting what the loaded model holds. ``tests/support/pnlp_support.py`` drives it:

    $PNLP_PYTHON pnlp_worker.py JOBS.json RESULTS.json

``JOBS.json`` is a list of jobs, run in one process (importing paddle costs seconds):

* ``{"op": "build", "family": F, "tie": T, "container": C, "out": DIR}``: ``paddle.seed(seed);
  Model(Config(**cfg))`` of :data:`FAMILIES` [F] (or :data:`OTHER_MODELS` [F]), then
  ``save_pretrained(DIR, safe_serialization=C == "safetensors")`` (optional ``"max_shard_size"``: sharded
  with an index; ``"dtype"``: e.g. ``"bfloat16"``,
  the model cast before saving; ``"cfg"``: config arguments over the family's). ``T``: ``"tied"``
  (``tie_word_embeddings=True``), ``"untied"`` (the model's own random head), ``"untied-equal"``
  (``tie_word_embeddings=False``, the head set to the embedding in the head's own layout before saving, so
  that ``tie`` must succeed on it).
* ``{"op": "edit", "dir": DIR, "drop_suffixes": [...], "put": {NAME: NPY}}``: rewrites the folder's weight
  file in its own container (``paddle.load``/``paddle.save``, or safetensors with its metadata) without the
  tensors whose names end with one of the suffixes, and with the given arrays added: a checkpoint whose
  head was dropped (does the loader re-tie it?) or that holds a head of its own (does the loader use it?).
* ``{"op": "load", "family": F, "dir": DIR, "npz": PATH}``: copies DIR to a temporary folder,
  ``from_pretrained`` (float32, CPU), runs :data:`IDS` through it and saves to PATH: ``logits``,
  ``embedding`` (the input embedding's weight), ``head`` (the tensor the head multiplies with) and
  ``bias`` (the head bias, when the model has one). The result row also says whether ``head`` *is* the
  embedding parameter (``head_is_embedding``) and names the state-dict keys of the loaded model.
* ``{"op": "encode", "dir": DIR, "texts": [...]}``: PaddleNLP's ``AutoTokenizer.from_pretrained(DIR)``
  encodes each text (``add_special_tokens=False``); the result has ``len`` and ``ids``.

Each result is ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}`` (one job's failure never stops the
others). Nothing here imports tietool.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import traceback
import zlib  # noqa: F401  (paddle 2.6.2 needs zlib imported before it)

VOCAB = 61  # prime: no other dimension of any family equals it
HIDDEN = 32
IDS = [[3, 17, 5, 44, 9, 28, 39, 1], [7, 0, 33, 12, 47, 21, 2, 30]]  # every id below 48

_DEC = {"decoder_start_token_id": 0}
_MLM = {  # BERT / ERNIE masked LM
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
# family -> model_type its config writes, (config class, model class), config kwargs, the loaded model's head
# attribute path (``tied_head`` where a tied model has no head layer), its bias attribute path
FAMILIES: dict[str, dict] = {
    "llama": {
        "model_type": "llama",
        "cls": ("LlamaConfig", "LlamaForCausalLM"),
        "cfg": {
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 48,
        },
        "head": "lm_head.weight",
    },
    "mixtral": {
        "model_type": "mixtral",
        "cls": ("MixtralConfig", "MixtralForCausalLM"),
        "cfg": {
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 48,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
        },
        "head": "lm_head.weight",
    },
    "qwen": {
        "model_type": "qwen",
        "cls": ("QWenConfig", "QWenForCausalLM"),
        "cfg": {
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "kv_channels": 16,
            "intermediate_size": 96,
            "seq_length": 64,
        },
        "head": "lm_head.weight",
    },
    "gptj": {
        "model_type": "gptj",
        "cls": ("GPTJConfig", "GPTJForCausalLM"),
        "cfg": {"n_embd": HIDDEN, "n_layer": 1, "n_head": 2, "rotary_dim": 8, "n_positions": 64},
        "head": "lm_head.weight",
        "bias": "lm_head.bias",
    },
    "codegen": {
        "model_type": "codegen",
        "cls": ("CodeGenConfig", "CodeGenForCausalLM"),
        "cfg": {"n_embd": HIDDEN, "n_layer": 1, "n_head": 4, "rotary_dim": 4, "n_positions": 64, "n_ctx": 64},
        "head": "lm_head.weight",
        "bias": "lm_head.bias",
    },
    "rw": {
        "model_type": "RefinedWeb",
        "cls": ("RWConfig", "RWForCausalLM"),
        "cfg": {"n_layer": 1, "n_head": 2},
        "head": "lm_head.weight",
    },
    "chatglm_v2": {
        "model_type": "chatglm_v2",
        "cls": ("ChatGLMv2Config", "ChatGLMv2ForCausalLM"),
        "cfg": {
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "kv_channels": 16,
            "ffn_hidden_size": 48,
            "multi_query_group_num": 1,
            "max_sequence_length": 64,
        },
        "head": "chatglm_v2.output_layer.weight",
    },
    "chatglm": {
        "model_type": "chatglm",
        "cls": ("ChatGLMConfig", "ChatGLMForCausalLM"),
        "cfg": {
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "inner_hidden_size": 64,
            "max_sequence_length": 64,
            "mask_token_id": 45,
            "gmask_token_id": 46,
        },
        "head": "lm_head.decoder_weight",
        "glm_inputs": True,  # its forward needs a 4-D attention mask and 2-D position ids
    },
    "bloom": {
        "model_type": "bloom",
        "cls": ("BloomConfig", "BloomForCausalLM"),
        "cfg": {"n_layer": 1, "n_head": 2},
        "head": "lm_head.decoder_weight",
    },
    "gpt": {
        "model_type": "gpt",
        "cls": ("GPTConfig", "GPTForCausalLM"),
        "cfg": {
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
        "head": "lm_head.weight",
    },
    "opt": {
        "model_type": "opt",
        "cls": ("OPTConfig", "OPTForCausalLM"),
        "cfg": {
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "word_embed_proj_dim": HIDDEN,
            "max_position_embeddings": 64,
            "hidden_dropout_prob": 0.0,
        },
        "head": "lm_head.decoder_weight",
    },
    "bert": {
        "model_type": "bert",
        "cls": ("BertConfig", "BertForMaskedLM"),
        "cfg": _MLM,
        "head": "cls.predictions.decoder.weight",
        "bias": "cls.predictions.decoder.bias",
    },
    "ernie": {
        "model_type": "ernie",
        "cls": ("ErnieConfig", "ErnieForMaskedLM"),
        "cfg": _MLM,
        "head": "cls.predictions.decoder.weight",
        "bias": "cls.predictions.decoder.bias",
    },
    "t5": {
        "model_type": "t5",
        "cls": ("T5Config", "T5ForConditionalGeneration"),
        "cfg": {
            "d_model": HIDDEN,
            "d_kv": 16,
            "d_ff": 64,
            "num_layers": 1,
            "num_heads": 2,
            "dropout_rate": 0.0,
        },
        "head": "lm_head.weight",
        "tied_head": "t5.shared.weight",
        "seq2seq": True,
    },
    "bart": {
        "model_type": "bart",
        "cls": ("BartConfig", "BartForConditionalGeneration"),
        "cfg": {
            "d_model": HIDDEN,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64,
            "dropout": 0.0,
            **_DEC,
        },
        "head": "lm_head_weight",
        "bias": "final_logits_bias",
        "seq2seq": True,
    },
}
# models built and loaded like FAMILIES but outside the loader-facts matrix of
# tests/oracles/test_pnlp_loaders.py
OTHER_MODELS: dict[str, dict] = {
    "unified_transformer": {  # PLATO: the head is the word embedding plus lm_head.decoder_bias [vocab]
        "model_type": "unified_transformer",
        "cls": ("UnifiedTransformerConfig", "UnifiedTransformerLMHeadModel"),
        "cfg": {**_MLM, "mask_token_id": 45},
        "head": "lm_head.decoder_weight",
        "bias": "lm_head.decoder_bias",
        "position_ids": True,  # its own (relu of int64 positions) has no CPU kernel in paddle 2.6.2
    },
}
SEED = 1017
_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # ids below every vocabulary tested


def _spec(family: str) -> dict:
    return FAMILIES[family] if family in FAMILIES else OTHER_MODELS[family]


def _classes(family: str):
    import paddlenlp.transformers as t

    conf, model = _spec(family)["cls"]
    return getattr(t, conf), getattr(t, model)


def _attr(model, path: str):
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _head_param(model, family: str):
    spec = _spec(family)
    head = _attr(model, spec["head"])
    if head is None and "tied_head" in spec:
        head = _attr(model, spec["tied_head"])
    return head


def _build(job: dict) -> dict:
    import paddle

    family, tie = job["family"], job["tie"]
    conf_cls, model_cls = _classes(family)
    paddle.seed(SEED)
    config = conf_cls(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        tie_word_embeddings=tie == "tied",
        **_TOKENS,
        **{**_spec(family)["cfg"], **job.get("cfg", {})},
    )
    model = model_cls(config)
    model.eval()
    if tie == "untied-equal":
        emb = model.get_input_embeddings().weight
        head = _head_param(model, family)
        value = emb if list(head.shape) == list(emb.shape) else emb.T
        head.set_value(value.clone())
    if job.get("dtype", "float32") != "float32":
        model.to(dtype=job["dtype"])
        config.dtype = job["dtype"]
    out = job["out"]
    kw = {"max_shard_size": job["max_shard_size"]} if job.get("max_shard_size") else {}
    model.save_pretrained(out, safe_serialization=job["container"] == "safetensors", **kw)
    return {"files": sorted(os.listdir(out))}


def _weight_file(folder: str) -> str:
    names = [n for n in os.listdir(folder) if n.endswith((".safetensors", ".pdparams"))]
    if len(names) != 1:
        raise RuntimeError(f"expected one weight file in {folder}: {names}")
    return os.path.join(folder, names[0])


def _edit(job: dict) -> dict:
    import numpy as np
    import paddle

    path = _weight_file(job["dir"])
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, "np") as f:
            meta = f.metadata()
            state = {k: f.get_tensor(k) for k in f.keys()}
    else:
        state = paddle.load(path, return_numpy=True)
    dropped = [
        n for n in list(state) if any(n == s or n.endswith("." + s) for s in job.get("drop_suffixes", []))
    ]
    for n in dropped:
        del state[n]
    for name, npy in job.get("put", {}).items():
        state[name] = np.load(npy)
    if path.endswith(".safetensors"):
        from safetensors.numpy import save_file

        save_file(state, path, metadata=meta)
    else:
        paddle.save(state, path)
    return {"dropped": dropped}


def _forward(model, family: str):
    import paddle

    ids = paddle.to_tensor(IDS, dtype="int64")
    kw = {"input_ids": ids}
    if _spec(family).get("seq2seq"):
        kw["decoder_input_ids"] = ids
    if _spec(family).get("position_ids"):
        kw["position_ids"] = paddle.arange(ids.shape[1], dtype="int64").expand(ids.shape)
    if _spec(family).get("glm_inputs"):
        b, t = ids.shape
        kw["attention_mask"] = paddle.tril(paddle.ones([b, 1, t, t], dtype="int64"))
        kw["position_ids"] = paddle.stack([paddle.arange(t).expand([b, t]), paddle.zeros([b, t], "int64")], 1)
    with paddle.no_grad():
        out = model(**kw, return_dict=True)
    logits = out["logits"] if isinstance(out, dict) or hasattr(out, "keys") else out[0]
    return logits.astype("float32").numpy()


def _load(job: dict) -> dict:
    import numpy as np

    family = job["family"]
    _, model_cls = _classes(family)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "ckpt")
        shutil.copytree(job["dir"], folder)  # from_pretrained may write into the folder it loads
        model = model_cls.from_pretrained(folder, dtype="float32")
    model.eval()
    emb = model.get_input_embeddings().weight
    head = _head_param(model, family)
    bias_path = _spec(family).get("bias")
    bias = _attr(model, bias_path) if bias_path else None
    arrays = {"logits": _forward(model, family), "embedding": emb.numpy(), "head": head.numpy()}
    if bias is not None:
        arrays["bias"] = bias.numpy()
    np.savez(job["npz"], **arrays)
    return {
        "head_is_embedding": head is emb or head.name == emb.name,
        "head_shape": list(head.shape),
        "bias_shape": list(bias.shape) if bias is not None else None,
        "state_keys": sorted(model.state_dict()),
    }


def _encode(job: dict) -> dict:
    """``AutoTokenizer.from_pretrained(DIR)`` (PaddleNLP's own tokenizer classes) encodes each text with
    ``add_special_tokens=False``: ``{"len": len(tokenizer), "ids": [[...], ...], "specials": {name: [token,
    id]}}`` (pad, bos, eos)."""
    from paddlenlp.transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(job["dir"])
    ids = [[int(i) for i in tok(t, add_special_tokens=False)["input_ids"]] for t in job["texts"]]
    specials = {
        n: [getattr(tok, f"{n}_token", None), getattr(tok, f"{n}_token_id", None)]
        for n in ("pad", "bos", "eos")
    }
    return {"len": len(tok), "ids": ids, "specials": specials}


_OPS = {"build": _build, "edit": _edit, "load": _load, "encode": _encode}


def main(jobs_path: str, results_path: str) -> int:
    import paddle

    paddle.set_device("cpu")
    paddle.set_default_dtype("float32")
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        try:
            results.append({"ok": True, **_OPS[job["op"]](job)})
        except Exception as e:  # one job's failure is its result, never the batch's
            results.append(
                {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
            )
    with open(results_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
