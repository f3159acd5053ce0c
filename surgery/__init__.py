"""tietool's library: read → detect → plan → write → report, for PaddlePaddle LLM checkpoints.

The map, one line per layer, in pipeline order:

* :mod:`surgery.model` — the vocabulary: errors, option enums, tensor headers and dtypes; no I/O
* :mod:`surgery.arch` — architecture knowledge as data: families, loader facts and their proofs
* :mod:`surgery.io` — bytes in and out: stores (local, URL), safetensors / ``.pdparams``, the checkpoint
  folder, config and tokenizer files, read-back; the only layer that knows a local path from a URL
* :mod:`surgery.inspect` — what a checkpoint holds: detection of embedding, head, bias and tie state,
  value comparison, findings, conventions and layouts, the ``inspect`` summary
* :mod:`surgery.plan` — planners only: what ``tie`` / ``untie`` / ``resize`` / ``convert`` / ``merge``
  will write, as recipes, computed from headers and detection
* :mod:`surgery.write` — executes a plan into a temporary folder, reads it back, publishes it (or swaps it
  in place, crash-safe)
* :mod:`surgery.report` — the parameter-savings report of a plan; :mod:`surgery.results` its typed face
* :mod:`surgery.verify` — checks a write's differences; :mod:`surgery.diff` — lists any two checkpoints'
  differences (beside verify)
* :mod:`surgery.run` — the run of a writing operation (open → plan → write → report) and its output
  policies (a new folder, in place)
* :mod:`surgery.ops` — the operations end to end
* :mod:`surgery.logits_worker` — the PaddleFormers subprocess of ``verify --logits`` (the only paddle import)

**The layer rule**: a module imports only from its own layer and the layers before it in this list
(``model`` first, then ``arch``, ``io``, ``inspect``, ``plan``, ``write``, ``report``/``results``,
``verify``/``diff``, ``run``, ``ops``); then the package face :mod:`tietool` and :mod:`tietool.cli`.
``tests/structure/test_layers.py`` walks every import (lazy ones included) and fails on an import against this
order or a cycle. A name that another module uses is public (no underscore):
``tests/structure/test_private_names.py`` fails on ``from m import _x`` or ``m._x`` across modules.

Nothing here imports paddle.
"""

__version__ = "0.1.0"
