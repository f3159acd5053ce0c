"""tietool's library: read → detect → plan → write → report, for PaddlePaddle LLM checkpoints.

The pipeline lives in one module per step:

* :mod:`surgery.formats` — safetensors and ``.pdparams`` readers/writers (headers first, data on demand)
* :mod:`surgery.checkpoint` — a checkpoint folder: config, weight files, index, tensor headers
* :mod:`surgery.architectures` — the architecture table (data) and per-library loader facts
* :mod:`surgery.detect` — finds the input embedding, LM head, bias and the tie state
* :mod:`surgery.plan` — ``plan_tie`` / ``plan_untie`` / ``plan_resize``: what changes, bytes saved
* :mod:`surgery.write` — executes a plan into a temporary folder, then renames it into place
* :mod:`surgery.report` — the parameter-savings report

Nothing here imports paddle.
"""

__version__ = "0.1.0"
