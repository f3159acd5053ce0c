#!/usr/bin/env python3
"""Run tests/data/tools/pf_logits.py unchanged, but with extra ``from_pretrained`` keyword arguments.

usage: python tests/support/pf_logits_kw.py KWARGS_JSON CKPT_DIR MODEL_CLASS INPUT_IDS.npy OUT.npy

pf_logits.py calls ``getattr(paddleformers.transformers, MODEL_CLASS).from_pretrained(dir)`` with no
keyword arguments. Some checkpoints (PaddleFormers legacy ``model_state.pdparams``) only load with
``load_checkpoint_format="legacy", convert_from_hf=False``. This wrapper patches that one classmethod
to add the given keyword arguments, then runs the oracle script as ``__main__``; everything else
(copy to a temp dir, CPU workarounds, warning capture, JSON line) is the oracle's own code.
"""

import json
import os
import runpy
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
PF_LOGITS = os.path.join(os.path.dirname(_HERE), "data", "tools", "pf_logits.py")


def main() -> None:
    kwargs = json.loads(sys.argv[1])
    argv = sys.argv[2:]
    if kwargs:
        # patched on the base class, not on MODEL_CLASS: pf_logits.py may load another class than the one
        # named (the Deprecated Qwen2/Qwen3 ones without paddlefleet, whose module cannot be imported
        # before its stand-in for gpt_provider is in place)
        from paddleformers.transformers.model_utils import PretrainedModel as cls

        orig = cls.from_pretrained.__func__

        def from_pretrained(klass, *a, **kw):
            return orig(klass, *a, **{**kwargs, **kw})

        cls.from_pretrained = classmethod(from_pretrained)
    sys.argv = [PF_LOGITS, *argv]
    runpy.run_path(PF_LOGITS, run_name="__main__")


if __name__ == "__main__":
    main()
