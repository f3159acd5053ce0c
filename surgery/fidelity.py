"""Logits of a checkpoint folder under PaddleFormers on CPU, run as ``python -m tietool.surgery.fidelity CKPT
ARCH IDS.npy OUT.npy`` in a subprocess (a failed PaddleFormers load leaves global state that breaks later
loads in the same process). Prints one JSON line. The only module of tietool that imports paddle.

CPU quirks handled as PaddleFormers 1.2 needs: the folder is copied first (``from_pretrained`` writes into
it), ``fuse_rms_norm`` is turned off (no CPU kernel), bf16 weights run in a float32 copy (no bf16 matmul on
CPU), Qwen2/Qwen3 use the ``*Deprecated`` classes with a placeholder ``gpt_provider`` module when
``paddlefleet`` is missing.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import types


def main(argv: list[str]) -> int:
    ckpt, cls_name, ids_path, out_path = argv[:4]
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    if cls_name.startswith(("Qwen2", "Qwen3")) and importlib.util.find_spec("paddlefleet") is None:
        mod = types.ModuleType("paddleformers.transformers.gpt_provider")

        @dataclasses.dataclass
        class GPTModelProvider:
            pass

        mod.__dict__["GPTModelProvider"] = GPTModelProvider  # a module's attributes live in its __dict__
        sys.modules["paddleformers.transformers.gpt_provider"] = mod
        if not cls_name.endswith("Deprecated"):
            cls_name += "Deprecated"
    import numpy as np
    import paddle
    import paddleformers.transformers as T

    paddle.set_device("cpu")
    res: dict = {"ok": False, "error": None}
    log = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "ckpt")
        shutil.copytree(ckpt, d)
        kwargs = {}
        if any(f.endswith(".pdparams") for f in os.listdir(d)):
            kwargs = {"load_checkpoint_format": "legacy", "convert_from_hf": False}
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                m = getattr(T, cls_name).from_pretrained(d, **kwargs)
                m.eval()
                if "float16" in str(m.get_input_embeddings().weight.dtype):
                    m = copy.deepcopy(m)
                    m.to(dtype="float32")
                m.config.fuse_rms_norm = False
                ids = paddle.to_tensor(np.load(ids_path), dtype="int64")
                with paddle.no_grad():
                    out = m(input_ids=ids)
            lg = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
            np.save(out_path, lg.astype("float32").numpy())
            bad = [
                ln
                for ln in log.getvalue().splitlines()
                if any(w in ln for w in ("Missing keys", "newly initialized", "should be assigned"))
            ]
            if bad:  # some weights were not loaded: the logits are not the checkpoint's
                res["error"] = "not every weight was loaded: " + bad[0][:200]
            else:
                res["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported to the caller as data
            res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
