"""Logits of checkpoint folders under PaddleNLP 2.8.1 on CPU, run as ``$PNLP_PYTHON pnlp_logits_worker.py
IDS.npy OUT_DIR CKPT [CKPT ...]`` (a file path, not ``-m``: PaddleNLP 2.8.1 needs paddle 2.6.2 and runs in
its own Python, where tietool is not installed; this file imports nothing of tietool).

Each checkpoint is loaded by ``paddlenlp.transformers.AutoModelForCausalLM.from_pretrained`` (the class
PaddleNLP's own registry gives for its config.json) in float32 from a copy of the folder (``from_pretrained``
may write into the folder it loads), run on the token ids of ``IDS.npy`` (``input_ids`` only), and its
logits saved to ``OUT_DIR/<i>.npy``. Prints one JSON line: ``{"results": [{"ok", "model_class", "stage",
"error"}, ...]}``; the loads stop at the first failure.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile


def _run(ids_path: str, out: str, k: int, ckpt: str) -> dict:
    import numpy as np
    import paddle
    from paddlenlp.transformers import AutoModelForCausalLM  # type: ignore[import-not-found]

    paddle.set_device("cpu")
    stage = "load"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "ckpt")
            shutil.copytree(ckpt, folder)
            with contextlib.redirect_stdout(io.StringIO()):
                model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
        model.eval()
        stage = "forward"
        ids = paddle.to_tensor(np.load(ids_path), dtype="int64")
        with paddle.no_grad():
            res = model(input_ids=ids, return_dict=True)
        logits = res["logits"] if hasattr(res, "keys") else res[0]
        np.save(os.path.join(out, f"{k}.npy"), logits.astype("float32").numpy())
    except Exception as e:  # noqa: BLE001 - reported to the caller, one line
        return {
            "ok": False,
            "stage": stage,
            "error": f"{type(e).__name__}: {str(e)[:300]}",
            "model_class": None,
        }
    return {"ok": True, "stage": None, "error": None, "model_class": type(model).__name__}


def main(argv: list[str]) -> int:
    """Run every checkpoint of ``argv[2:]`` on the ids of ``argv[0]``, logits into ``argv[1]``."""
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
