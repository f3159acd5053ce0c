"""Logits of checkpoint folders under HF transformers on CPU torch, run as ``$HF_PYTHON hf_logits_worker.py
IDS.npy OUT_DIR CKPT [CKPT ...]`` (a file path, not ``-m``: transformers with torch runs in its own Python,
where tietool and PaddleFormers are not installed; PaddleFormers switches torch off in transformers when it is
imported, so this file imports nothing of tietool).

Each checkpoint is loaded by ``transformers.AutoModelForCausalLM.from_pretrained(folder,
dtype=torch.float32, output_loading_info=True)`` (the class transformers' own registry gives for its
config.json), run on the token ids of ``IDS.npy`` (``input_ids`` only), and its logits saved to
``OUT_DIR/<i>.npy``. A load that reports missing or size-mismatched weights (transformers then initialises
them at random) is a failed load. Prints one JSON line: ``{"results": [{"ok", "model_class", "stage",
"error"}, ...]}``; the loads stop at the first failure.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys


def _run(ids_path: str, out: str, k: int, ckpt: str) -> dict:
    import numpy as np
    import torch  # type: ignore[import-not-found]
    from transformers import AutoModelForCausalLM

    stage = "load"
    try:
        torch.manual_seed(0)
        model, info = AutoModelForCausalLM.from_pretrained(
            ckpt, dtype=torch.float32, output_loading_info=True
        )
        missing = sorted(info.get("missing_keys", []))
        bad = [str(m[0]) if isinstance(m, tuple) else str(m) for m in info.get("mismatched_keys", [])]
        if missing or bad:
            what = f"missing {missing[:5]}" if missing else f"shapes not as the config says {bad[:5]}"
            raise ValueError(f"transformers loaded it with weights {what}, initialised at random")
        model.eval()
        stage = "forward"
        ids = torch.from_numpy(np.load(ids_path)).long()
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        np.save(os.path.join(out, f"{k}.npy"), logits.float().numpy())
    except Exception as e:  # noqa: BLE001 - reported to the caller, one line
        error = f"{type(e).__name__}: {str(e)[:300]}"
        return {"ok": False, "stage": stage, "error": error, "model_class": None}
    return {"ok": True, "stage": None, "error": None, "model_class": type(model).__name__}


def main(argv: list[str]) -> int:
    """Run every checkpoint of ``argv[2:]`` on the ids of ``argv[0]``, logits into ``argv[1]``."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    logging.disable(logging.WARNING)
    ids_path, out, *ckpts = argv
    results = []
    for k, ck in enumerate(ckpts):
        results.append(_run(ids_path, out, k, ck))
        if not results[-1]["ok"]:
            break
    print(json.dumps({"results": results}))
    return 0


def serve(run) -> int:
    """``serve`` (``surgery.verify.logits_pool``): one JSON argv per line of stdin, each run as
    ``run(argv)``; the JSON line it prints goes, alone, to the original stdout (anything else printed there,
    a library's own output included, goes to stderr). Ends at the end of stdin."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            run(json.loads(line))
        docs = [ln for ln in buf.getvalue().splitlines() if ln.startswith("{")]
        channel.write((docs[-1] if docs else "{}") + "\n")
        channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve(main) if sys.argv[1:] == ["serve"] else main(sys.argv[1:]))
