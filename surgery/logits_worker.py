"""Logits of checkpoint folders under PaddleFormers on CPU, run as ``python -m tietool.surgery.logits_worker
IDS.npy OUT_DIR CONFIG_CKPT CKPT [CKPT ...]`` in a subprocess. The only module of tietool that
imports paddle.

The model class is found once, from ``CONFIG_CKPT/config.json`` (the input of ``verify``), through
PaddleFormers' own registries (:func:`resolve_class`), and every checkpoint is run with it. The logits of
checkpoint ``i`` go to ``OUT_DIR/i.npy``. Prints one JSON line: ``{"model_class", "class_from", "error",
"results": [{"ok", "stage", "error"}, ...]}``; ``stage`` says where a checkpoint failed (``load``,
``forward``, ``weights``: loaded, but not every weight came from the files). The loads stop at the first
failure: after a failed ``from_pretrained`` paddle keeps state that breaks later loads in the same process
(fixtures README, L5), so the caller runs what follows in a fresh process.

CPU quirks handled as PaddleFormers 1.2 needs (tests/data/fixtures/README.md): the folder is copied first
(``from_pretrained`` writes into it); ``fuse_rms_norm`` is turned off in every config the model's layers
hold (no CPU kernel; the norm reads it at each forward); bf16 weights run in a float32 copy (no bf16 matmul
on CPU); without ``paddlefleet`` (not on PyPI) the non-fleet ``*Deprecated`` twin of a class is used and a
placeholder ``gpt_provider`` module stands in for the one that imports paddlefleet.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import types
from typing import Any, ClassVar

# the endings of a language-model class: another (``LlamaModel``, ``...ForSequenceClassification``) gives
# no logits over the vocabulary
LM_TASKS = ("ForCausalLM", "ForConditionalGeneration")
# log lines that say the model holds weights the files did not give it
_NOT_LOADED = ("Missing keys", "newly initialized", "should be assigned")


def _stub_fleet() -> bool:
    """Without ``paddlefleet``: a placeholder ``paddleformers.transformers.gpt_provider`` (the real one
    imports paddlefleet; the modeling files of Qwen2/Qwen3/GLM-4-MoE import it for their fleet classes
    only) and a ``paddlefleet_ops`` that says DeepEP is unavailable (DeepSeek-V3 asks at import).
    Returns True when paddlefleet is missing (the ``*Deprecated`` classes are then the ones that run)."""
    if importlib.util.find_spec("paddlefleet") is not None:
        return False

    @dataclasses.dataclass
    class GPTModelProvider:
        transform_rules: ClassVar[dict] = {}

    mod = types.ModuleType("paddleformers.transformers.gpt_provider")
    mod.__dict__["GPTModelProvider"] = GPTModelProvider  # a module's attributes live in its __dict__
    sys.modules.setdefault("paddleformers.transformers.gpt_provider", mod)
    if "paddlefleet_ops" not in sys.modules and importlib.util.find_spec("paddlefleet_ops") is None:
        ops = types.ModuleType("paddlefleet_ops")
        ops.__dict__["is_deep_ep_available"] = lambda: False
        sys.modules["paddlefleet_ops"] = ops
    return True


def _levels(config: dict, where: str = "") -> list[tuple[str, dict]]:
    """``[(dotted path, dict)]``: the config and every nested config dict (``text_config``,
    ``thinker_config``, ...), the top first, then depth-first in the file's order. A vision or audio
    tower's config is left out: its ``model_type`` names the tower (Qwen2.5-VL's ``vision_config`` says
    ``qwen2_5_vl``), not the language model."""
    out = [(where, config)]
    for k, v in config.items():
        if isinstance(v, dict) and not any(w in k for w in ("vision", "audio")):
            out += _levels(v, f"{where}{k}.")
    return out


def _export(T: Any, name: str, fleetless: bool) -> Any:
    """The class ``paddleformers.transformers`` exports as ``name`` (its non-fleet ``*Deprecated`` twin when
    paddlefleet is missing), or None. A class whose module cannot be imported counts as not exported."""
    for n in [name + "Deprecated", name] if fleetless and not name.endswith("Deprecated") else [name]:
        try:
            cls = getattr(T, n)
        except (AttributeError, ImportError):
            continue
        if isinstance(cls, type) and hasattr(cls, "from_pretrained"):
            return cls
    return None


def resolve_class(config: dict, fleetless: bool) -> tuple[Any, str, str]:
    """The PaddleFormers class that gives the logits of a checkpoint with this ``config.json``.

    Tried in order: each ``architectures`` entry naming a language-model class (:data:`LM_TASKS`), at the
    top level and then in nested configs (``text_config.architectures``, ...), as ``paddleformers.
    transformers`` exports it; then each ``model_type`` (top level, then nested) through PaddleFormers'
    own auto-class tables: ``model_type_to_module_name`` gives the module, ``get_name_mapping(task)`` (the
    table ``AutoModelForCausalLM`` reads) the class of that module for ``ForCausalLM``, then
    ``ForConditionalGeneration`` (vision-language wrappers: they run on text-only input ids).

    Returns:
        ``(class, its name, where it came from)``, e.g. ``(cls, "Qwen2_5_VLForConditionalGeneration",
        "text_config.architectures")``; ``(None, "", what was tried)`` when PaddleFormers has no class.
    """
    import paddleformers.transformers as T
    from paddleformers.transformers.auto.configuration import model_type_to_module_name
    from paddleformers.transformers.auto.modeling import get_name_mapping

    levels = _levels(config)
    for where, c in levels:
        for name in c.get("architectures") or []:
            if isinstance(name, str) and any(t in name for t in LM_TASKS) and "Pipe" not in name:
                cls = _export(T, name, fleetless)
                if cls is not None:
                    return cls, cls.__name__, f"{where}architectures"
    for where, c in levels:
        mt = c.get("model_type")
        if not isinstance(mt, str):
            continue
        module = model_type_to_module_name(mt)
        for task in LM_TASKS:
            for name, mod in get_name_mapping(task).items():
                if mod == module and not name.endswith("_Import_Class"):
                    cls = _export(T, name, fleetless)
                    if cls is not None:
                        return cls, cls.__name__, f"{where}model_type ({mt!r})"
    archs = [a for _, c in levels for a in (c.get("architectures") or [])]
    types_ = [c["model_type"] for _, c in levels if isinstance(c.get("model_type"), str)]
    return None, "", f"architectures {archs or 'none'}, model_type {types_ or 'none'}"


def _no_fused_norm(model: Any) -> None:
    """``fuse_rms_norm = False`` in the model's config and in every config its layers hold (a vision-language
    wrapper's text model keeps its own ``text_config``)."""
    seen: set[int] = set()
    for layer in [model, *model.sublayers()]:
        cfg = getattr(layer, "config", None)
        if cfg is not None and id(cfg) not in seen and hasattr(cfg, "__setattr__"):
            seen.add(id(cfg))
            with contextlib.suppress(Exception):
                cfg.fuse_rms_norm = False


def _legacy(folder: str) -> bool:
    """Whether PaddleFormers 1.2 reads ``folder`` only with its legacy loader: a ``.pdparams`` folder, or
    safetensors in its legacy Paddle layout (``convert --to safetensors`` of a legacy save writes them, and
    resize/tie/untie keep them; :func:`surgery.plan.convert.pf_legacy_layout`), which a plain
    ``from_pretrained``
    loads silently wrong."""
    if any(f.endswith(".pdparams") for f in os.listdir(folder)):
        return True
    from .io.checkpoint import Checkpoint
    from .plan.convert import pf_legacy_layout

    try:
        return pf_legacy_layout(Checkpoint.open(folder))
    except Exception:  # noqa: BLE001 - unreadable here: the load that follows says why
        return False


def run_one(cls: Any, ckpt: str, ids_path: str, out_path: str) -> dict:
    """Load ``ckpt`` with ``cls`` (the legacy loader for a ``.pdparams`` folder or legacy-layout safetensors,
    as PaddleFormers 1.2 needs: :func:`_legacy`)
    and save the float32 logits of the ids in ``ids_path`` (``int64 [batch, seq]``) to ``out_path``.

    Returns ``{"ok": bool, "stage": None | "load" | "forward" | "weights", "error": str | None}``.
    """
    import numpy as np
    import paddle

    log = io.StringIO()
    handler = logging.StreamHandler(log)
    loggers = [logging.getLogger(n) for n in ("PaddleFormers", "paddle.distributed.fleet.utils.log_util", "")]
    for lg in loggers:
        lg.addHandler(handler)
    res: dict = {"ok": False, "stage": "load", "error": None}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = os.path.join(tmp, "ckpt")
            shutil.copytree(ckpt, d)
            kwargs = {"load_checkpoint_format": "legacy", "convert_from_hf": False} if _legacy(d) else {}
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                m = cls.from_pretrained(d, **kwargs)
                m.eval()
                res["stage"] = "forward"
                if "float16" in str(m.get_input_embeddings().weight.dtype):
                    m = copy.deepcopy(m)
                    m.to(dtype="float32")
                _no_fused_norm(m)
                with paddle.no_grad():
                    out = m(input_ids=paddle.to_tensor(np.load(ids_path), dtype="int64"))
        lg = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
        np.save(out_path, lg.astype("float32").numpy())
        bad = [ln for ln in log.getvalue().splitlines() if any(w in ln for w in _NOT_LOADED)]
        if bad:  # some weights were not loaded: the logits are not the checkpoint's
            res.update(stage="weights", error="not every weight was loaded from the files: " + bad[0][:200])
        else:
            res.update(ok=True, stage=None)
    except Exception as e:  # noqa: BLE001 - reported to the caller as data
        msg = " ".join(str(e).split()).split(" [Hint:")[0]  # paddle's hint repeats the message
        res["error"] = f"{type(e).__name__}: {msg[:300]}"
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    return res


def _settle_heap() -> None:
    """Collect the garbage so far, then freeze what survives (``gc.freeze``): PaddleFormers 1.2's
    ``from_pretrained`` calls ``gc.collect()`` after every file it reads, and each full collection walks
    every object of a process that imported paddle and PaddleFormers (~0.15 s of CPU a call, most of a small
    model's load). Frozen objects are only left out of those walks; reference counting frees them as
    before, and no logit depends on when a cycle is collected (the test suite's loaders do the same,
    compared bit for bit with fresh processes)."""
    import gc

    gc.collect()
    gc.freeze()


def main(argv: list[str]) -> int:
    """``IDS.npy OUT_DIR CONFIG_CKPT CKPT [CKPT ...]``: see the module docstring. Exit 0 when every
    checkpoint ran."""
    ids_path, out_dir, config_of, *ckpts = argv
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    fleetless = _stub_fleet()
    import paddle

    paddle.set_device("cpu")
    cfg_path = os.path.join(config_of, "config.json")
    config = {}
    if os.path.isfile(cfg_path):  # none: no class can be found, said as such
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
    with contextlib.redirect_stdout(io.StringIO()):
        cls, name, where = resolve_class(config, fleetless)
    doc: dict = {"model_class": name or None, "class_from": where, "error": None, "results": []}
    if cls is None:
        doc["error"] = f"PaddleFormers has no language-model class for {where}"
    _settle_heap()
    for i, ckpt in enumerate(ckpts if cls is not None else []):
        r = run_one(cls, ckpt, ids_path, os.path.join(out_dir, f"{i}.npy"))
        doc["results"].append(r)
        if not r["ok"]:
            break
        _settle_heap()
    print(json.dumps(doc))
    return 0 if cls is not None and all(r["ok"] for r in doc["results"]) else 1


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
