"""Loads of ``tietool convert`` outputs by the library each is meant for, many folders per subprocess.

    python convert_loads.py build OUT            # PaddleFormers 1.2: the ERNIE 4.5 checkpoints below
    python convert_loads.py load JOBS RESULTS    # PaddleFormers 1.2 (tietool's venv)
    $PNLP_PYTHON convert_loads.py load JOBS RESULTS   # PaddleNLP 2.8.1 (paddle 2.6.2)

``build`` writes, with PaddleFormers 1.2's own ``save_pretrained``, ERNIE 4.5 dense (``ernie4_5``: 4 heads,
2 kv heads, so that a qkv split grouped per kv head and one ``q | k | v`` differ) tied and untied, and
ERNIE 4.5 MoE with one MTP block (``ernie4_5_moe``: a dense layer 0, an MoE layer 1 with 2 experts, a shared
expert and ``moe_statics``), each as ``<name>-hf`` (the default flex-checkpoint save: HF names and layout)
and ``<name>-legacy`` (``save_checkpoint_format="legacy", save_to_hf=False``: ``model_state.pdparams``,
``model.`` names, fused ``qkv_proj`` / ``up_gate_proj``, ``[in, out]``).

``load``: JOBS is a list of ``{"ckpt", "model_class", "kwargs", "npz"}`` (optional ``"ids"``: other input ids
than :data:`IDS`); each folder is copied to a
temporary folder (``from_pretrained`` writes into the folder it loads), loaded with
``from_pretrained(d, **kwargs)`` on CPU, and ``npz`` gets ``logits`` on :data:`IDS` (when the model runs on
CPU: PaddleFormers 1.2's ERNIE MoE needs the GPU kernel ``expand_modality_expert_id``) and every
state-dict tensor (``state/NAME``), as float32. RESULTS: one row per job, ``ok``, ``error``, ``logits``
(bool), ``warnings`` (the library's missing / unexpected / newly initialized lines). A failed load is
reported, and later jobs run on (a failed ``from_pretrained`` can leave paddle state that breaks later
loads in the process, fixtures README L5: put the loads expected to fail last).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zlib  # noqa: F401  (paddle 2.6.2 needs zlib imported before it)

IDS = [[3, 17, 5, 44, 9, 28, 39, 1], [7, 0, 33, 12, 47, 21, 2, 30]]  # below every vocabulary here (61)
_COMMON = {
    "vocab_size": 61,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 48,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
ERNIE = {
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {**_COMMON, "num_hidden_layers": 1}, 1701),
    "ernie4_5_moe": (
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        {
            **_COMMON,
            "num_hidden_layers": 2,
            "moe_num_experts": 2,
            "moe_k": 1,
            "moe_layer_start_index": 1,
            "moe_intermediate_size": 24,
            "moe_num_shared_experts": 1,
            "moe_use_aux_free": True,
            "num_nextn_predict_layers": 1,
        },
        1702,
    ),
}
WARN = ("Unexpected keys", "Missing keys", "newly initialized", "should be assigned", "not used when")


def _stubs() -> None:
    """PaddleFormers' placeholders for modules that are not on PyPI (``family_builder``'s)."""
    import importlib.util

    if importlib.util.find_spec("paddleformers") is None:
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import family_builder

    family_builder._stub_gpt_provider()
    family_builder._stub_paddlefleet_ops()


def build(out: str) -> None:
    import paddle
    import paddleformers.transformers as T

    paddle.set_device("cpu")
    made = {}
    for mt, (cfg_cls, model_cls, kw, seed) in ERNIE.items():
        for tie in (False, True) if mt == "ernie4_5" else (False,):
            paddle.seed(seed)
            model = getattr(T, model_cls)(getattr(T, cfg_cls)(**kw, tie_word_embeddings=tie))
            model.eval()
            name = f"{mt}-{'tied' if tie else 'untied'}"
            with contextlib.redirect_stdout(io.StringIO()):
                model.save_pretrained(os.path.join(out, f"{name}-hf"))
                model.save_pretrained(
                    os.path.join(out, f"{name}-legacy"),
                    save_checkpoint_format="legacy",
                    save_to_hf=False,
                    safe_serialization=False,
                )
            for d in (f"{name}-hf", f"{name}-legacy"):
                for f in os.listdir(os.path.join(out, d)):
                    if f.startswith("saved_signal_"):  # the flex-checkpoint saver's done-marker
                        os.remove(os.path.join(out, d, f))
            made[name] = model_cls
    with open(os.path.join(out, "built.json"), "w") as fh:
        json.dump(made, fh)


def _classes(cls_name: str):
    try:
        import paddleformers.transformers as T
    except ImportError:
        import paddlenlp.transformers as T  # type: ignore[no-redef]
    return getattr(T, cls_name)


def load_one(job: dict, log: io.StringIO) -> dict:
    import numpy as np
    import paddle

    res: dict = {"ok": False, "error": None, "logits": False}
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "ckpt")
        shutil.copytree(job["ckpt"], d)
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                m = _classes(job["model_class"]).from_pretrained(d, **job.get("kwargs", {}))
            m.eval()
            for layer in [m, *m.sublayers()]:  # the fused kernel is GPU-only (pf_logits.py); experts copy
                cfg = getattr(layer, "config", None)  # the config, so each layer's is set
                if cfg is not None and not isinstance(cfg, dict):
                    cfg.fuse_rms_norm = False
            arrays = {f"state/{k}": v.astype("float32").numpy() for k, v in m.state_dict().items()}
            try:
                with paddle.no_grad(), contextlib.redirect_stdout(log):
                    out = m(input_ids=paddle.to_tensor(job.get("ids", IDS), dtype="int64"))
                lg = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
                arrays["logits"] = lg.astype("float32").numpy()
                res["logits"] = True
            except Exception as e:  # noqa: BLE001 - a model that does not run on CPU still loaded
                res["no_logits"] = f"{type(e).__name__}: {str(e)[:200]}"
            np.savez(job["npz"], **arrays)
            res["ok"] = True
        except Exception as e:  # noqa: BLE001
            res["error"] = f"{type(e).__name__}: {str(e)[:400]}"
    return res


def load(jobs_path: str, results_path: str) -> None:
    import paddle

    paddle.set_device("cpu")
    handler_log = io.StringIO()
    handler = logging.StreamHandler(handler_log)
    for name in ("PaddleFormers", "PaddleNLP", "paddlenlp", ""):
        logging.getLogger(name).addHandler(handler)
    results = []
    for job in json.load(open(jobs_path)):
        start = len(handler_log.getvalue())
        log = io.StringIO()
        res = load_one(job, log)
        text = log.getvalue() + handler_log.getvalue()[start:]
        res["warnings"] = [ln.strip() for ln in text.splitlines() if any(w in ln for w in WARN)]
        results.append(res)
        with open(results_path, "w") as fh:
            json.dump(results, fh)


# ===================================================================================== parent side
LEGACY = {"load_checkpoint_format": "legacy", "convert_from_hf": False}


def run(args: list[str], python: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """This script under ``python`` (default: this interpreter) with ``args``, on CPU."""
    from support import pnlp_support, preload  # the parent side only: this file also runs as a script

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    pnlp = python is not None and python == pnlp_support.PNLP_PYTHON
    return preload.run(
        [python or sys.executable, os.path.abspath(__file__), *args],
        libs=preload.PADDLENLP if pnlp else preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def load_all(jobs: list[dict], work: str, python: str | None = None) -> list[dict]:
    """Every job of :func:`load` in one subprocess; each result row gets ``arrays`` (the npz, loaded) and
    the job itself. Raises RuntimeError when the subprocess wrote fewer rows than jobs."""
    import numpy as np

    os.makedirs(work, exist_ok=True)
    for i, j in enumerate(jobs):
        j.setdefault("npz", os.path.join(work, f"{i:03d}.npz"))
        j.setdefault("kwargs", {})
    with open(os.path.join(work, "jobs.json"), "w") as fh:
        json.dump(jobs, fh)
    res_path = os.path.join(work, "results.json")
    cp = run(["load", os.path.join(work, "jobs.json"), res_path], python)
    rows = json.load(open(res_path)) if os.path.isfile(res_path) else []
    if len(rows) < len(jobs):
        raise RuntimeError(
            f"loads stopped after {len(rows)} of {len(jobs)} (exit {cp.returncode}):\n{cp.stderr[-3000:]}"
        )
    for row, job in zip(rows, jobs, strict=True):
        row["job"] = job
        row["arrays"] = dict(np.load(job["npz"])) if row["ok"] else {}
    return rows


if __name__ == "__main__":
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    _stubs()
    if sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        load(sys.argv[2], sys.argv[3])
