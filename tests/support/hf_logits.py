#!/usr/bin/env python3
"""HF transformers logits of many checkpoint folders in one process, as the oracle of the ``hf`` loader.

usage: python hf_logits.py JOBS.json RESULTS.json

``JOBS.json`` is a list of ``{"ckpt": folder, "out": logits.npy}``. Each folder is loaded with the documented
default call, ``AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)`` on CPU
(``AutoModelForSeq2SeqLM`` for an encoder-decoder config, run with the same ids as the decoder's input;
``AutoModelForImageTextToText`` for a type with no causal-LM class, LLaVA: text ids only;
torch 2.13 CPU, transformers as PaddleFormers 1.2 pins it, < 5.4), and run on
``tests/data/fixtures/oracles/input_ids.npy``.
``RESULTS.json`` gets one entry per job: ``ok``, ``error``, the logits' ``shape``, the keys the load reported
``missing`` / ``unexpected`` / ``mismatched``, and ``tied`` (the loaded model's head is the embedding's
parameter).

The process must not import paddleformers: PaddleFormers patches
``transformers.utils.import_utils.is_torch_available`` to return False when it is imported, after which
transformers cannot build a torch model. It is run by :func:`run` in a subprocess of its own, under the HF
venv (``tests/tools/hf_venv.sh``, ``$HF_PYTHON``), which has torch and transformers and no PaddleFormers.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

INPUT_IDS = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "oracles" / "input_ids.npy"


def python() -> str | None:
    """The interpreter of the HF venv (``$HF_PYTHON``, built by ``tests/tools/hf_venv.sh``), or None."""
    return os.environ.get("HF_PYTHON") or None


@functools.cache
def available(python: str) -> str | None:
    """None when ``python`` can import torch and transformers, else why not (asked once per process)."""
    cp = subprocess.run(
        [python, "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    return None if cp.returncode == 0 else (cp.stderr.strip().splitlines() or ["no output"])[-1]


def run(folders: list[Path], work: Path, python: str, timeout: float = 1200) -> dict[Path, dict]:
    """HF transformers logits of every folder, all loaded in one subprocess (``python hf_logits.py`` under
    the HF venv's ``python``).

    Returns ``{folder: result}``; a result has the fields of ``RESULTS.json`` (module docstring) and
    ``logits`` (the float32 array, or None when the load or the forward failed) and ``seconds`` (the whole
    subprocess's wall time).

    Raises:
        RuntimeError: the subprocess wrote no results (it could not import torch / transformers).
    """
    import numpy as np

    work.mkdir(parents=True, exist_ok=True)
    jobs = [{"ckpt": str(f), "out": str(work / f"{i:03d}.npy")} for i, f in enumerate(folders)]
    (work / "jobs.json").write_text(json.dumps(jobs, indent=1))
    t0 = time.monotonic()
    from support import preload  # the parent side only: this file also runs as a script

    cp = preload.run(
        [python, __file__, str(work / "jobs.json"), str(work / "results.json")],
        libs=preload.TRANSFORMERS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        stdin=subprocess.DEVNULL,
    )
    seconds = time.monotonic() - t0
    path = work / "results.json"
    if not path.is_file():
        raise RuntimeError(f"hf_logits.py wrote no results (exit {cp.returncode}):\n{cp.stderr[-3000:]}")
    out = {}
    for job, res in zip(jobs, json.loads(path.read_text()), strict=True):
        res["logits"] = np.load(job["out"]) if res["ok"] else None
        res["seconds"] = seconds
        out[Path(job["ckpt"])] = res
    return out


def _load(ckpt: str, out: str) -> dict:
    import numpy as np
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSeq2SeqLM,
    )
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    res: dict = {"ok": False, "error": None, "missing": [], "unexpected": [], "mismatched": [], "tied": None}
    try:
        torch.manual_seed(0)
        config = AutoConfig.from_pretrained(ckpt)
        seq2seq = config.is_encoder_decoder
        auto = (
            AutoModelForSeq2SeqLM
            if seq2seq
            else AutoModelForCausalLM
            if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            else AutoModelForImageTextToText
        )
        model, info = auto.from_pretrained(ckpt, dtype=torch.float32, output_loading_info=True)
        model.eval()
        res["missing"] = sorted(info.get("missing_keys", []))
        res["unexpected"] = sorted(info.get("unexpected_keys", []))
        res["mismatched"] = sorted(
            str(m[0]) if isinstance(m, tuple) else str(m) for m in info.get("mismatched_keys", [])
        )
        head, emb = model.get_output_embeddings(), model.get_input_embeddings()
        res["tied"] = head is not None and head.weight.data_ptr() == emb.weight.data_ptr()
        ids = torch.from_numpy(np.load(INPUT_IDS)).long()
        with torch.no_grad():
            extra = {"decoder_input_ids": ids} if seq2seq else {}
            logits = model(input_ids=ids, **extra).logits
        arr = logits.float().numpy()
        np.save(out, arr)
        res["shape"] = list(arr.shape)
        res["ok"] = True
    except Exception as e:  # noqa: BLE001  (reported per folder; the test says what failed)
        res["error"] = f"{type(e).__name__}: {str(e)[:600]}"
    return res


def _main(jobs_path: str, results_path: str) -> int:
    import logging

    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    logging.disable(logging.WARNING)
    jobs = json.loads(Path(jobs_path).read_text())
    results = []
    for job in jobs:
        results.append(_load(job["ckpt"], job["out"]))
        assert "paddleformers" not in sys.modules, (
            "paddleformers was imported: it disables torch in transformers"
        )
        Path(results_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:3]))
