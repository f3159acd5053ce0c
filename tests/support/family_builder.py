"""Tiny real checkpoints of eight model families, written by PaddleFormers 1.2 itself (``test_families.py``).

Every checkpoint is ``paddle.seed(s); <Family>ForCausalLM(<Family>Config(**cfg))`` saved with the library's
own ``save_pretrained``; nothing is written by hand except the DeepSeek-V3 multi-token-prediction copies
(see below). Building imports paddle, so it runs in a subprocess (``python family_builder.py PLAN OUT``),
one for every variant of the session: :func:`build_all` writes the plan, runs the script once and reads
back what it wrote (``manifest.json``).

Sizes: hidden 32, 1-2 layers, vocabulary :data:`OLD_VOCAB` = 61 (prime; no other dimension of any family
equals it, so a tensor axis of 61 after a resize is a vocabulary axis left at the old size).
Special token ids are 0-2 (below every vocabulary the tests resize to).

Variants (:class:`Variant`): family x tie x format x sharding:

* tie ``tied`` (``tie_word_embeddings=True``), ``untied`` (an independent random head), ``untied-equal``
  (``tie_word_embeddings=False`` with the head set to a copy of the embedding before saving: the case where
  ``tie`` must succeed on an untied checkpoint);
* format ``safetensors``: the default flex-checkpoint save (HF names and layout, ``model-0000x-of-0000N
  .safetensors`` + ``model.safetensors.index.json``); ``pdparams``: the legacy save
  (``save_checkpoint_format="legacy", save_to_hf=False``: ``model_state.pdparams``, paddle layout), which
  PaddleFormers 1.2 reads back only with ``load_checkpoint_format="legacy", convert_from_hf=False``;
* sharded: ``max_shard_size`` below the embedding's size, so the embedding and the head each sit in a shard
  of their own.

DeepSeek-V3: PaddleFormers 1.2 builds the multi-token-prediction layer (``num_nextn_predict_layers=1``:
``model.layers.{L}`` with ``enorm``, ``hnorm``, ``eh_proj`` and a decoder block) but it has no embedding or
head of its own (it reuses ``model.embed_tokens`` and ``lm_head``), so the library saves no MTP vocabulary
tensors. (Its flex-checkpoint safetensors save writes no tensor of layer L at all; the legacy .pdparams save
writes the layer's own ones.) DeepSeek's released checkpoints carry them (``model.layers.{L}.embed_tokens
.weight``, ``model.layers.{L}.shared_head.head.weight``, ``model.layers.{L}.shared_head.norm.weight``), so
the builder adds them after the save, as copies of the main embedding / head / final norm, to the file that
holds ``model.norm.weight`` (a shard of its own, away from the embedding and the head, when sharded) and
updates the index. The PaddleFormers loader ignores them (not parameters of its model: "Unexpected keys" for
safetensors, silently for .pdparams), so the logits do not see them; the "no vocabulary tensor left at the
old size" check of the resize test judges how they are resized.

Also: PaddleFormers 1.2's flex-checkpoint save leaves a ``saved_signal_<rank>`` marker file beside the
weights; the builder removes it (as the fixtures in ``tests/data/fixtures`` were cleaned of it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

OLD_VOCAB = 61
HIDDEN = 32
SHARD_SIZE = (
    "6KB"  # the embedding / head of 61 x 32 float32 is 7808 bytes (3904 in bf16): shards of their own
)
LEGACY_LOAD = {"load_checkpoint_format": "legacy", "convert_from_hf": False}

# family -> (config class, model class to build and load, config keyword arguments, seed, dtype)
_COMMON = {
    "vocab_size": OLD_VOCAB,
    "hidden_size": HIDDEN,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
FAMILIES: dict[str, dict] = {
    "llama": {
        "config": "LlamaConfig",
        "model": "LlamaForCausalLM",
        "kwargs": {**_COMMON, "intermediate_size": 48, "num_hidden_layers": 2, "head_dim": 16},
        "seed": 2101,
        "dtype": "float32",
    },
    "qwen2": {
        "config": "Qwen2Config",
        # Qwen2ForCausalLM needs paddlefleet (not on PyPI); the Deprecated class is the one that runs
        # (tests/data/fixtures/README.md), with a placeholder gpt_provider module
        "model": "Qwen2ForCausalLMDeprecated",
        "kwargs": {**_COMMON, "intermediate_size": 48, "num_hidden_layers": 1},
        "seed": 2102,
        "dtype": "bfloat16",
    },
    "qwen3": {
        "config": "Qwen3Config",
        "model": "Qwen3ForCausalLMDeprecated",
        "kwargs": {**_COMMON, "intermediate_size": 48, "num_hidden_layers": 1, "head_dim": 16},
        "seed": 2103,
        "dtype": "float32",
    },
    "ernie4_5": {
        "config": "Ernie4_5Config",
        "model": "Ernie4_5ForCausalLM",
        "kwargs": {
            **_COMMON,
            "intermediate_size": 48,
            "num_hidden_layers": 1,
            "num_key_value_heads": 1,
            "head_dim": 16,
        },
        "seed": 2104,
        "dtype": "float32",
    },
    "gemma3_text": {
        "config": "Gemma3TextConfig",
        "model": "Gemma3ForCausalLM",
        "kwargs": {
            **_COMMON,
            "intermediate_size": 48,
            "num_hidden_layers": 1,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "sliding_window": 4,
        },
        "seed": 2105,
        "dtype": "float32",
    },
    "gpt_oss": {
        "config": "GptOssConfig",
        "model": "GptOssForCausalLM",
        "kwargs": {
            **_COMMON,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "head_dim": 16,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "sliding_window": 4,
            "rope_scaling": None,
        },
        "seed": 2106,
        "dtype": "float32",
    },
    "phi3": {
        "config": "Phi3Config",
        "model": "Phi3ForCausalLM",
        "kwargs": {**_COMMON, "intermediate_size": 48, "num_hidden_layers": 1},
        "seed": 2107,
        "dtype": "float32",
    },
    "deepseek_v3": {
        "config": "DeepseekV3Config",
        "model": "DeepseekV3ForCausalLM",
        "kwargs": {
            **_COMMON,
            "intermediate_size": 48,
            "moe_intermediate_size": 24,
            "num_hidden_layers": 2,
            "num_nextn_predict_layers": 1,
            "n_routed_experts": 2,
            "n_shared_experts": 1,
            "num_experts_per_tok": 1,
            "first_k_dense_replace": 1,
            "kv_lora_rank": 16,
            "q_lora_rank": None,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 8,
            "topk_method": "noaux_tc",
            "n_group": 1,
            "topk_group": 1,
            "scoring_func": "sigmoid",
            "norm_topk_prob": True,
            "rope_scaling": {
                "type": "yarn",
                "rope_type": "yarn",
                "factor": 40.0,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096,
            },
        },
        "seed": 2108,
        "dtype": "float32",
    },
}
_FUSE = {"fuse_rms_norm": False}  # the fused RMSNorm kernel is GPU-only
_VL_TEXT = {**_COMMON, **_FUSE, "intermediate_size": 48, "num_hidden_layers": 1, "head_dim": 16}
_VL_VISION = {
    "depth": 1,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_heads": 2,
    "out_hidden_size": HIDDEN,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
_VL_IDS = {"image_token_id": 50, "video_token_id": 51}
_MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3]}
# PaddleFormers 1.2 families beyond the eight above (issue 17). Those whose modeling imports paddlefleet
# (Qwen2-MoE / Qwen3-MoE's non-Deprecated classes) are built with the Deprecated class that runs on CPU.
FAMILIES.update(
    {
        "qwen2_moe": {
            "config": "Qwen2MoeConfig",
            "model": "Qwen2MoeForCausalLMDeprecated",
            "kwargs": {
                **_COMMON,
                **_FUSE,
                "intermediate_size": 48,
                "num_hidden_layers": 1,
                "moe_intermediate_size": 24,
                "shared_expert_intermediate_size": 24,
                "num_experts": 2,
                "num_experts_per_tok": 1,
            },
            "seed": 2109,
            "dtype": "float32",
        },
        "qwen3_moe": {
            "config": "Qwen3MoeConfig",
            "model": "Qwen3MoeForCausalLMDeprecated",
            "kwargs": {
                **_COMMON,
                **_FUSE,
                "intermediate_size": 48,
                "num_hidden_layers": 1,
                "head_dim": 16,
                "moe_intermediate_size": 24,
                "num_experts": 2,
                "num_experts_per_tok": 1,
            },
            "seed": 2110,
            "dtype": "float32",
        },
        "qwen3_next": {
            "config": "Qwen3NextConfig",
            "model": "Qwen3NextForCausalLM",
            "kwargs": {
                **_COMMON,
                **_FUSE,
                "intermediate_size": 48,
                "num_hidden_layers": 2,  # one linear-attention (gated delta) layer, one full-attention
                "head_dim": 16,
                "moe_intermediate_size": 24,
                "shared_expert_intermediate_size": 24,
                "num_experts": 2,
                "num_experts_per_tok": 1,
                "linear_key_head_dim": 8,
                "linear_value_head_dim": 8,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 2,
            },
            "seed": 2111,
            "dtype": "float32",
        },
        "glm4_moe": {
            "config": "Glm4MoeConfig",
            "model": "Glm4MoeForCausalLMDeprecated",
            "kwargs": {
                **_COMMON,
                **_FUSE,
                "intermediate_size": 48,
                "num_hidden_layers": 2,
                "head_dim": 16,
                "moe_intermediate_size": 24,
                "n_routed_experts": 2,
                "num_experts_per_tok": 1,
                "first_k_dense_replace": 1,
            },
            "seed": 2112,
            "dtype": "float32",
        },
        "qwen2_5_vl": {
            "config": "Qwen2_5_VLConfig",
            "model": "Qwen2_5_VLForConditionalGeneration",
            "kwargs": {
                "text_config": {**_VL_TEXT, "rope_scaling": {**_MROPE, "type": "mrope"}},
                "vision_config": {**_VL_VISION, "window_size": 4, "fullatt_block_indexes": [0]},
                **_VL_IDS,
                **_FUSE,
            },
            "seed": 2113,
            "dtype": "float32",
        },
        "qwen3_vl": {
            "config": "Qwen3VLConfig",
            "model": "Qwen3VLForConditionalGenerationDeprecated",
            "kwargs": {
                "text_config": {**_VL_TEXT, "rope_scaling": {**_MROPE, "mrope_interleaved": True}},
                "vision_config": {
                    **_VL_VISION,
                    "num_position_embeddings": 16,
                    "deepstack_visual_indexes": [0],
                },
                **_VL_IDS,
                **_FUSE,
            },
            "seed": 2114,
            "dtype": "float32",
        },
        "glm_ocr": {
            "config": "GlmOcrConfig",
            "model": "GlmOcrForConditionalGeneration",
            "kwargs": {
                "text_config": {**_VL_TEXT, "mrope_section": [2, 3, 3]},
                "vision_config": {**_VL_VISION, "image_size": 8},
                **_VL_IDS,
                **_FUSE,
            },
            "seed": 2115,
            "dtype": "float32",
        },
        "glm4v_moe": {
            "config": "Glm4vMoeConfig",
            "model": "Glm4vMoeForConditionalGeneration",
            "kwargs": {
                "text_config": {
                    **_VL_TEXT,
                    "num_hidden_layers": 2,
                    "moe_intermediate_size": 24,
                    "n_routed_experts": 2,
                    "num_experts_per_tok": 1,
                    "first_k_dense_replace": 1,
                    # half of head_dim 16 rotates: 8 = 2 * sum(mrope_section)
                    "rope_parameters": {**_MROPE, "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5},
                    "num_key_value_heads": 1,
                },
                "vision_config": {**_VL_VISION, "image_size": 8},
                **_VL_IDS,
                **_FUSE,
            },
            "seed": 2116,
            "dtype": "float32",
        },
    }
)
# PaddleFormers 1.2 cannot read back its own safetensors save of these (tiny configs; the flex-checkpoint
# loader stops at "model.language_model.layers.0.self_attn.{qkv_proj.bias,k_proj.weight} should be
# assigned before!"): they are built in the legacy .pdparams container only, and their safetensors facts
# stay unproven (surgery.arch.PROOFS has no entry: tietool keeps the head there).
LOADS_ONLY_PDPARAMS = {"qwen2_5_vl", "glm4v_moe"}
TIES = ("tied", "untied", "untied-equal")
# A probe, not a variant the commands run on: the tied model saved, then its head removed from the files
# (when the save wrote one) -- the checkpoint whose load tells whether the loader re-ties a missing head.
NOHEAD = "tied-nohead"
FORMATS = ("safetensors", "pdparams")


def formats(family: str) -> tuple[str, ...]:
    """The containers a family is built in (:data:`LOADS_ONLY_PDPARAMS`)."""
    return ("pdparams",) if family in LOADS_ONLY_PDPARAMS else FORMATS


@dataclasses.dataclass(frozen=True)
class Variant:
    family: str
    tie: str  # one of TIES
    fmt: str  # one of FORMATS
    sharded: bool

    @property
    def name(self) -> str:
        return f"{self.family}-{self.tie}-{self.fmt}-{'sharded' if self.sharded else 'single'}"

    @property
    def model_class(self) -> str:
        return FAMILIES[self.family]["model"]

    @property
    def load_kwargs(self) -> dict:
        return dict(LEGACY_LOAD) if self.fmt == "pdparams" else {}


@dataclasses.dataclass
class Built:
    """One built checkpoint, as the builder subprocess reported it."""

    variant: Variant
    path: Path | None
    ok: bool
    error: str | None
    files: list[str]
    notes: list[str]


def build_all(
    variants: list[Variant], root: Path, timeout: float = 900
) -> tuple[dict[Variant, Built], float]:
    """Build every variant into ``root/<name>`` in one subprocess; returns what was built, by variant, and
    the seconds it took. A variant the library could not build or save has ``ok=False`` and its error."""
    root.mkdir(parents=True, exist_ok=True)
    plan = root / "plan.json"
    plan.write_text(json.dumps([dataclasses.asdict(v) for v in variants], indent=1))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    t0 = time.monotonic()
    from support import preload  # the parent side only: this file also runs as a script

    cp = preload.run(
        [sys.executable, __file__, str(plan), str(root)],
        libs=preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    seconds = time.monotonic() - t0
    manifest = root / "manifest.json"
    if not manifest.is_file():
        raise RuntimeError(f"the builder wrote no manifest (exit {cp.returncode}):\n{cp.stderr[-3000:]}")
    entries = json.loads(manifest.read_text())
    out = {}
    for v in variants:
        e = entries.get(v.name, {"ok": False, "error": f"not built (builder exit {cp.returncode})"})
        out[v] = Built(
            v,
            root / v.name if e.get("ok") else None,
            bool(e.get("ok")),
            e.get("error"),
            e.get("files", []),
            e.get("notes", []),
        )
    return out, seconds


# ===================================================================================== logits, in batches
@dataclasses.dataclass(frozen=True)
class LogitsJob:
    ckpt: Path
    model_class: str
    kwargs: tuple[tuple[str, object], ...] = ()


def logits_batches(jobs: list[LogitsJob], root: Path, workers: int = 2, timeout: float = 900) -> dict:
    """PaddleFormers 1.2 logits of every job's folder on :data:`support.paths.INPUT_IDS`, computed by
    ``tests/data/tools/pf_logits.py`` itself (run unchanged with ``runpy``, as ``support/pf_logits_kw.py``
    runs it), many folders per subprocess: a subprocess per folder
    (:class:`support.fixture_support.LiveLogits`) costs ~4 s of paddle import each, ~10 minutes of the
    ~300 loads of this matrix on 2 cores.

    A failed ``from_pretrained`` can leave paddle state that breaks later loads in the same process
    (fixtures README, L5), so a batch stops at its first failed job; that job is run again alone in a fresh
    subprocess (its result is the one reported) and the rest of the batch continues in another fresh
    subprocess. Every job after a failure therefore runs in a process that has seen no failure.

    Returns ``{job: run_pf_logits-style dict}`` with ``logits`` (the array, or None) and ``batch`` (how many
    loads the process had done before this one) added.
    """
    import numpy as np

    from support import preload  # the parent side only: this file also runs as a script

    root.mkdir(parents=True, exist_ok=True)
    results: dict[LogitsJob, dict] = {}
    lock = threading.Lock()
    counter = [0]

    def run(batch: list[LogitsJob]) -> list[dict]:
        with lock:
            counter[0] += 1
            work = root / f"batch{counter[0]:03d}"
        work.mkdir()
        spec = []
        for i, j in enumerate(batch):
            spec.append(
                {
                    "ckpt": str(j.ckpt),
                    "model_class": j.model_class,
                    "kwargs": dict(j.kwargs),
                    "out": str(work / f"{i:03d}.npy"),
                }
            )
        (work / "jobs.json").write_text(json.dumps(spec, indent=1))
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        try:
            cp = preload.run(
                [sys.executable, __file__, "--logits", str(work / "jobs.json"), str(work / "results.json")],
                libs=preload.PADDLEFORMERS,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            cp = subprocess.CompletedProcess(e.cmd, -9, "", f"timed out after {timeout}s")
        done = json.loads((work / "results.json").read_text()) if (work / "results.json").is_file() else []
        for r in done:
            r["logits"] = np.load(r["out"]) if r.get("ok") else None
        if len(done) < len(batch) and (not done or done[-1].get("ok")):  # the process died mid-job
            done.append(
                {
                    "ok": False,
                    "error": f"logits subprocess exit {cp.returncode}: {cp.stderr[-1500:]}",
                    "warnings": [],
                    "logits": None,
                    "batch": len(done),
                }
            )
        return done

    def worker(batch: list[LogitsJob]) -> None:
        while batch:
            done = run(batch)
            for j, r in zip(batch, done, strict=False):  # done is shorter after a failure
                results[j] = r
            if len(done) < len(batch) or not done[-1].get("ok"):
                failed = batch[len(done) - 1]
                if (
                    done[-1].get("batch", 0) > 0
                ):  # failed after other loads: the verdict comes from a fresh one
                    results[failed] = run([failed])[0]
            batch = batch[len(done) :]

    chunks = [jobs[i::workers] for i in range(workers)]
    threads = [threading.Thread(target=worker, args=(c,)) for c in chunks if c]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# ===================================================================================== subprocess side
def _stub_gpt_provider() -> None:
    """Qwen2/Qwen3 modeling imports paddleformers.transformers.gpt_provider, which imports paddlefleet (not
    installable): a placeholder with an empty GPTModelProvider, as tests/data/tools/pf_logits.py does."""
    import importlib.util
    import types

    if importlib.util.find_spec("paddlefleet") is not None:
        return
    mod = types.ModuleType("paddleformers.transformers.gpt_provider")

    @dataclasses.dataclass
    class GPTModelProvider:
        transform_rules: typing.ClassVar[dict] = {}  # GLM-4-MoE's provider extends it at import time

    mod.GPTModelProvider = GPTModelProvider  # type: ignore[attr-defined]
    sys.modules["paddleformers.transformers.gpt_provider"] = mod


def _stub_paddlefleet_ops() -> None:
    """DeepSeek-V3's modeling imports paddlefleet_ops (GPU expert-parallel kernels, not on PyPI) through
    token_dispatcher -> fused_a2a, for ``is_deep_ep_available`` only at import time: a placeholder that says
    DeepEP is unavailable (the CPU path)."""
    import importlib.util
    import types

    if importlib.util.find_spec("paddlefleet_ops") is not None:
        return
    mod = types.ModuleType("paddlefleet_ops")
    mod.is_deep_ep_available = lambda: False  # type: ignore[attr-defined]
    sys.modules["paddlefleet_ops"] = mod


def _with_tie(kwargs: dict, tied: bool) -> dict:
    """The config keyword arguments with ``tie_word_embeddings`` set, in the nested text config too (a
    vision-language config reads it from either level)."""
    out = {**kwargs, "tie_word_embeddings": tied}
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = {**out["text_config"], "tie_word_embeddings": tied}
    return out


def _build_model(family: str, tie: str):
    import paddle
    import paddleformers.transformers as T

    spec = FAMILIES[family]
    paddle.seed(spec["seed"])
    paddle.set_default_dtype(spec["dtype"])
    try:
        cfg = getattr(T, spec["config"])(**_with_tie(spec["kwargs"], tie in ("tied", NOHEAD)))
        model = getattr(T, spec["model"])(cfg)
    finally:
        paddle.set_default_dtype("float32")
    model.eval()
    if tie == "untied-equal":
        emb = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        assert emb is not head, "untied model shares its head with the embedding"
        if list(head.shape) == list(emb.shape):
            head.set_value(emb.clone())
        else:  # a paddle-layout [hidden, vocab] head
            head.set_value(emb.clone().T)
    return model


def _save(model, v: dict, out: Path) -> None:
    kw: dict = {}
    if v["sharded"]:
        kw["max_shard_size"] = SHARD_SIZE
    if v["fmt"] == "pdparams":
        kw.update(save_checkpoint_format="legacy", save_to_hf=False, safe_serialization=False)
    model.save_pretrained(str(out), **kw)


def _add_mtp_copies(out: Path, n_layers: int) -> list[str]:
    """DeepSeek-V3's released checkpoints store the MTP layer's own embedding, head and head norm; PF 1.2 does
    not (its MTP layer reuses the main ones). Add them as copies of the main tensors, where DeepSeek puts
    them: in the file that holds the MTP layer's other tensors."""
    import numpy as np

    mtp = f"model.layers.{n_layers}"
    src = {
        f"{mtp}.embed_tokens.weight": "model.embed_tokens.weight",
        f"{mtp}.shared_head.head.weight": "lm_head.weight",
        f"{mtp}.shared_head.norm.weight": "model.norm.weight",
    }
    index = next(iter(sorted(out.glob("*.index.json"))), None)
    idx = json.loads(index.read_text()) if index else None
    if out.joinpath("model_state.pdparams").is_file() or (index and index.name.startswith("model_state")):
        return _add_mtp_pdparams(out, src, mtp, idx, index)
    from safetensors.numpy import load_file, save_file

    files = sorted(out.glob("*.safetensors"))
    everything: dict[str, np.ndarray] = {}
    for f in files:
        everything.update(load_file(str(f)))
    missing = [s for s in src.values() if s not in everything]
    if missing:
        raise RuntimeError(f"cannot add MTP copies: {missing} not in the saved files")
    # PF 1.2's flex-checkpoint save writes no tensor of the MTP layer at all (its inverse AOA maps only the
    # main layers); the copies go into the file that holds the final norm, away from the embedding / head
    target = idx["weight_map"]["model.norm.weight"] if idx else files[0].name
    from safetensors import safe_open

    with safe_open(str(out / target), "np") as fh:
        meta = fh.metadata()
    tensors = load_file(str(out / target))
    for new, old in src.items():
        tensors[new] = everything[old].copy()
        if idx:
            idx["weight_map"][new] = target
    save_file(tensors, str(out / target), metadata=meta)
    if idx and index:
        idx["weight_map"] = dict(sorted(idx["weight_map"].items()))
        total = sum(
            int(a.nbytes) for f in sorted(out.glob("*.safetensors")) for a in load_file(str(f)).values()
        )
        idx.setdefault("metadata", {})["total_size"] = total
        index.write_text(json.dumps(idx, indent=2) + "\n")
    return [f"added {sorted(src)} (copies of {sorted(set(src.values()))}) to {target}"]


def _drop_head(out: Path) -> list[str]:
    """Remove ``lm_head.weight`` from the saved files (and the index) and say so; nothing when the save
    wrote no head. Safetensors shards are rewritten byte for byte (header and data of the other tensors
    unchanged, any dtype); a .pdparams through paddle.load / paddle.save."""
    index = next(iter(sorted(out.glob("*.index.json"))), None)
    idx = json.loads(index.read_text()) if index else None
    files = [idx["weight_map"]["lm_head.weight"]] if idx and "lm_head.weight" in idx["weight_map"] else []
    if not idx:
        files = [p.name for p in out.iterdir() if p.suffix in (".safetensors", ".pdparams")]
    notes = []
    for name in files:
        path = out / name
        if path.suffix == ".safetensors":
            dropped = _drop_safetensors_tensor(path, "lm_head.weight")
        else:
            import paddle

            state = paddle.load(str(path))
            dropped = state.pop("lm_head.weight", None) is not None
            if dropped:
                paddle.save(state, str(path))
        if dropped:
            notes.append(f"removed lm_head.weight from {name}")
    if idx and index and "lm_head.weight" in idx["weight_map"]:
        del idx["weight_map"]["lm_head.weight"]
        index.write_text(json.dumps(idx, indent=2) + "\n")
    return notes or ["the save wrote no lm_head.weight"]


def _drop_safetensors_tensor(path: Path, name: str) -> bool:
    """Rewrite the safetensors file ``path`` without tensor ``name`` (the others' bytes and the metadata
    unchanged, offsets recomputed); False when it holds no such tensor."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    if name not in header:
        return False
    data = raw[8 + n :]
    del header[name]
    new_header: dict = {k: v for k, v in header.items() if k == "__metadata__"}
    chunks, at = [], 0
    for k, v in sorted(
        ((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]
    ):
        a, b = v["data_offsets"]
        chunks.append(data[a:b])
        new_header[k] = {**v, "data_offsets": [at, at + (b - a)]}
        at += b - a
    hb = json.dumps(new_header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(len(hb).to_bytes(8, "little") + hb + b"".join(chunks))
    return True


def _add_mtp_pdparams(out: Path, src: dict, mtp: str, idx: dict | None, index: Path | None) -> list[str]:
    import paddle

    target = idx["weight_map"]["model.norm.weight"] if idx else "model_state.pdparams"
    everything = {}
    names = sorted(set(idx["weight_map"].values())) if idx else [target]
    for n in names:
        everything.update(paddle.load(str(out / n), return_numpy=True))
    state = paddle.load(str(out / target), return_numpy=True)
    for new, old in src.items():
        state[new] = everything[old].copy()
        if idx:
            idx["weight_map"][new] = target
    paddle.save(state, str(out / target))
    if idx and index:
        total = 0
        for n in sorted(set(idx["weight_map"].values())):
            total += sum(
                int(a.nbytes)
                for a in paddle.load(str(out / n), return_numpy=True).values()
                if hasattr(a, "nbytes")
            )
        idx.setdefault("metadata", {})["total_size"] = total
        index.write_text(json.dumps(idx, indent=2) + "\n")
    return [f"added {sorted(src)} (copies of {sorted(set(src.values()))}) to {target}"]


def _settle_heap() -> None:
    """Collect the garbage of the work done so far, then freeze what survives (``gc.freeze``).

    PaddleFormers 1.2's ``from_pretrained`` calls ``gc.collect()`` after every file it reads
    (``model_utils._load_pretrained_model``, ``load_sharded_checkpoint``; paddle's flex
    ``load_state_dict`` too), and a full collection walks every object the collector tracks: in a process
    that imported paddle and paddleformers that is ~0.15 s of CPU per call, most of the CPU of a tiny
    model's load (a sharded .pdparams of 11 files: ~2 s of CPU, 0.07 s with the heap frozen). Frozen objects
    are only left out of the collector's walks; reference counting frees them as before and nothing a load
    computes depends on when a cycle is collected (``test_batched_logits_equal_fresh_process`` of
    ``test_families.py`` compares such loads with a fresh ``pf_logits.py`` process, bit for bit)."""
    import gc

    gc.collect()
    gc.freeze()


def _main(plan_path: str, root: str) -> int:
    import contextlib
    import io
    import logging
    import traceback

    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    _stub_gpt_provider()
    _stub_paddlefleet_ops()
    import paddle

    paddle.set_device("cpu")
    logging.disable(logging.WARNING)
    plan = json.loads(Path(plan_path).read_text())
    manifest: dict[str, dict] = {}
    models: dict[tuple[str, str], object] = {}
    for v in plan:
        variant = Variant(**v)
        out = Path(root) / variant.name
        entry: dict = {"ok": False, "error": None, "files": [], "notes": []}
        try:
            key = (variant.family, "tied" if variant.tie == NOHEAD else variant.tie)
            if key not in models:
                with contextlib.redirect_stdout(io.StringIO()):
                    models[key] = _build_model(*key)
            with contextlib.redirect_stdout(io.StringIO()):
                _save(models[key], v, out)
            if variant.tie == NOHEAD:
                entry["notes"] += _drop_head(out)
            if variant.family == "deepseek_v3" and variant.tie != NOHEAD:  # a probe: the loader ignores them
                entry["notes"] += _add_mtp_copies(out, FAMILIES["deepseek_v3"]["kwargs"]["num_hidden_layers"])
            for transient in out.glob("saved_signal_*"):  # the flex-checkpoint saver's done-marker
                transient.unlink()
                entry["notes"].append(f"removed {transient.name} (a transient marker of the save)")
            entry["files"] = sorted(p.name for p in out.iterdir())
            entry["ok"] = True
        except Exception as e:  # noqa: BLE001  (reported per variant; the test says what failed)
            entry["error"] = f"{type(e).__name__}: {str(e)[:500]}\n{traceback.format_exc()[-1500:]}"
        manifest[variant.name] = entry
        Path(root, "manifest.json").write_text(json.dumps(manifest, indent=1))
        _settle_heap()
    return 0


PF_LOGITS = Path(__file__).resolve().parents[1] / "data" / "tools" / "pf_logits.py"
INPUT_IDS = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "oracles" / "input_ids.npy"


def _alias_deprecated(T, cls_name: str) -> None:
    """pf_logits.py loads ``<cls>Deprecated`` for every Qwen2*/Qwen3* class when paddlefleet is missing;
    Qwen2.5-VL and Qwen3-Next have no such class (their own one runs on CPU): alias it."""
    if cls_name.startswith(("Qwen2", "Qwen3")) and not cls_name.endswith("Deprecated"):
        try:
            getattr(T, cls_name + "Deprecated")
        except (AttributeError, ModuleNotFoundError):
            setattr(T, cls_name + "Deprecated", getattr(T, cls_name))


def _logits_job(n: int, job: dict) -> dict:
    """Run pf_logits.py unchanged (``runpy``) on one job in this process, where ``n`` loads ran before it
    (on :data:`INPUT_IDS`, or the job's ``ids`` file); its JSON line as a dict, with ``out`` and ``batch``
    (= ``n``) added."""
    import contextlib
    import io
    import runpy

    import paddleformers.transformers as T

    _alias_deprecated(T, job["model_class"])

    cls = None
    orig = None
    if job["kwargs"]:  # as support/pf_logits_kw.py does, undone after the job
        # on the base class, as pf_logits_kw.py: pf_logits.py may load another class than the one named
        # (the Deprecated Qwen2/Qwen3 ones without paddlefleet), which need not inherit from it
        from paddleformers.transformers.model_utils import PretrainedModel as cls

        orig = cls.__dict__.get("from_pretrained")
        base = cls.from_pretrained.__func__
        kwargs = job["kwargs"]

        def from_pretrained(klass, *a, _base=base, _kw=kwargs, **kw):
            return _base(klass, *a, **{**_kw, **kw})

        cls.from_pretrained = classmethod(from_pretrained)
    out = io.StringIO()
    sys.argv = [str(PF_LOGITS), job["ckpt"], job["model_class"], job.get("ids") or str(INPUT_IDS), job["out"]]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(PF_LOGITS), run_name="__main__")
    except SystemExit:
        pass
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}", "warnings": []}), file=out)
    finally:
        if cls is not None:
            if orig is None:
                del cls.from_pretrained
            else:
                cls.from_pretrained = orig
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1]) if lines else {"ok": False, "error": "no JSON line", "warnings": []}
    res["out"] = job["out"]
    res["batch"] = n
    return res


def _logits_main(jobs_path: str, results_path: str) -> int:
    """Run :func:`_logits_job` for each job in turn, in this one process; stop at the first failure (the
    parent reruns it and what follows in fresh processes)."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    _stub_gpt_provider()
    _stub_paddlefleet_ops()
    import paddleformers.transformers  # noqa: F401 - imported before the heap is frozen (_settle_heap)

    _settle_heap()
    jobs = json.loads(Path(jobs_path).read_text())
    results = []
    for n, job in enumerate(jobs):
        res = _logits_job(n, job)
        results.append(res)
        Path(results_path).write_text(json.dumps(results))
        if not res["ok"]:
            break
        _settle_heap()
    return 0


SERVE_MARK = "@@pf-logits-result@@ "


def _serve_main() -> int:
    """``--serve``: one job per line of stdin (a job of :func:`_logits_main`'s list), run by
    :func:`_logits_job`; each result is one line of the original stdout, after :data:`SERVE_MARK`. Anything
    else written to stdout (a library's own print, native logs) goes to stderr, so the channel holds
    results only. Ends at the end of stdin (:class:`support.pf_worker.LogitsWorker` is the other side)."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _stub_gpt_provider()
    _stub_paddlefleet_ops()
    import paddleformers.transformers  # noqa: F401 - imported before the heap is frozen (_settle_heap)

    _settle_heap()
    for n, line in enumerate(sys.stdin):
        res = _logits_job(n, json.loads(line))
        channel.write(SERVE_MARK + json.dumps(res) + "\n")
        channel.flush()
        _settle_heap()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        sys.exit(_serve_main())
    if sys.argv[1] == "--logits":
        sys.exit(_logits_main(sys.argv[2], sys.argv[3]))
    sys.exit(_main(sys.argv[1], sys.argv[2]))
