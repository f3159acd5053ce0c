"""config.json / model_config.json helpers: read (strictly, :mod:`surgery.io.regular`), check the types of the
keys tietool reads (:func:`check_config`), and get or set a dotted key (``text_config.vocab_size``,
``init_args.0.vocab_size``: integers index lists)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model.errors import CheckpointError
from .regular import load_json


@dataclass(frozen=True)
class KeyType:
    """What a config key tietool reads must hold (at any nesting: ``text_config.vocab_size`` too).

    Attributes:
        kinds: the JSON types allowed (``int`` excludes ``bool``; ``float`` accepts ints); ``None``
            (JSON ``null``) is always allowed: it reads as absent.
        minimum: the least value of a number.
        what: how the message names the expectation.
    """

    kinds: tuple[type, ...]
    minimum: float | None = None
    what: str = ""


_COUNT = KeyType((int,), 1, "a positive integer")
_COUNT0 = KeyType((int,), 0, "an integer ≥ 0")
_FLAG = KeyType((bool,), None, "true or false")
_TEXT = KeyType((str,), None, "a string")
_BLOCK = KeyType((dict,), None, "a JSON object")
_STD = KeyType((float,), 0, "a number ≥ 0")  # a standard deviation (resize --init normal draws with it)

# The keys tietool reads from a config block, with their type. Data, not code: the readers (detect,
# layout, plan, merge, convert) then rely on it. Proved against the libraries: every config class's defaults
# of PaddleFormers 1.2 and transformers pass
# (tests/adversarial/test_bad_input.py::test_*_default_configs_pass_the_type_ check), and each wrong type
# gives exit 3 (tests/support/hostile/reads.py, the config-type cases).
CONFIG_KEYS: dict[str, KeyType] = {
    **{
        k: _COUNT
        for k in (
            "vocab_size",
            "padded_vocab_size",
            "decoder_vocab_size",
            "vocab_size_per_layer_input",
            "draft_vocab_size",
            "hidden_size",
            "d_model",
            "n_embd",
            "head_dim",
        )
    },
    **{k: _COUNT0 for k in ("moe_num_shared_experts",)},
    # a list per stage in vision backbones (SegFormer, PVT, LeViT: num_attention_heads [1, 2, 5, 8]), an
    # object per tower (LXMERT: num_hidden_layers {"language": 9, ...}); the readers take only an int
    **{
        k: KeyType((int, list, dict), 0, "an integer ≥ 0")
        for k in ("num_attention_heads", "num_key_value_heads", "num_hidden_layers")
    },
    # ERNIE 4.5 VL: one count per modality ([64, 64]); 0 in dense configs
    "moe_num_experts": KeyType((int, list), 0, "an integer ≥ 0"),
    # a list per layer in some families (Gemma3n's text_config.intermediate_size); 0 in PaddleFormers'
    # Ernie4_5_MoeConfig() default
    **{k: KeyType((int, list), 0, "an integer ≥ 0") for k in ("intermediate_size", "moe_intermediate_size")},
    # PaddleNLP writes -1 for "not set"
    **{
        k: KeyType((int,), None, "an integer") for k in ("tensor_parallel_degree", "pipeline_parallel_degree")
    },
    "tie_word_embeddings": _FLAG,
    **{
        k: _TEXT for k in ("model_type", "torch_dtype", "dtype", "paddleformers_version", "paddlenlp_version")
    },
    **{k: _BLOCK for k in ("text_config", "llm_config", "language_config")},
    "initializer_range": _STD,
}


def _fits(v: Any, t: KeyType) -> bool:
    if v is None:
        return True
    if isinstance(v, bool):
        return bool in t.kinds
    ok = any(isinstance(v, (int, float) if k is float else k) for k in t.kinds if k is not bool)
    if ok and t.minimum is not None and isinstance(v, (int, float)):
        return math.isfinite(v) and v >= t.minimum
    return ok


def _shown(v: Any) -> str:
    s = repr(v) if not isinstance(v, (dict, list)) else ("an object" if isinstance(v, dict) else "a list")
    return s if len(s) <= 40 else s[:37] + "..."


def check_config(data: Any, path: Any, file: str | None = None) -> None:
    """Refuse a config whose keys tietool reads (:data:`CONFIG_KEYS`, in the top-level object and every
    nested object and list) hold a value of the wrong type or range.

    Args:
        data: the parsed config (``config.json``, ``model_config.json``).
        path: the file, for the message.
        file: its name in the message (default: the name of ``path``).

    Raises:
        CheckpointError: naming the file and the dotted key (``text_config.vocab_size is "100", expected
            a positive integer``).
    """
    name = file or Path(str(path)).name
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:  # iterative: a parsed config may be nested up to regular.JSON_DEPTH levels
        prefix, node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            key = f"{prefix}{k}"
            t = CONFIG_KEYS.get(k) if isinstance(k, str) else None
            if t is not None and not _fits(v, t):
                raise CheckpointError(
                    f"{name} {key} is {_shown(v)}, expected {t.what}",
                    path,
                    f"set {key} in {name} to the value the model was saved with",
                )
            if isinstance(v, (dict, list)):
                todo.append((f"{key}.", v))


def read_config_file(path: Path) -> Any:
    """A config file (``config.json``, ``model_config.json``), parsed strictly and type-checked.

    Raises:
        CheckpointError: missing, not a regular file, unreadable, not valid JSON (:func:`regular.load_json`)
            or a key of the wrong type (:func:`check_config`).
    """
    data = load_json(path, Path(str(path)).name)
    check_config(data, path)
    return data


def get_dotted(data: Any, key: str) -> Any:
    """Value at a dotted path. Raises KeyError / IndexError / TypeError when absent."""
    for part in key.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def set_dotted(data: Any, key: str, value: Any) -> None:
    """Set a dotted path; the parent must exist."""
    parts = key.split(".")
    for part in parts[:-1]:
        data = data[int(part)] if isinstance(data, list) else data[part]
    last = parts[-1]
    if isinstance(data, list):
        data[int(last)] = value
    else:
        data[last] = value


def read_config(path: Path) -> tuple[dict, str, str]:
    """config.json; or, in a folder that has only the older ``model_config.json`` (PaddleNLP 2.x), the
    model arguments in it: ``(config, file, dotted prefix of the arguments in the file)``."""
    name = "config.json"
    if not (path / name).exists() and (path / "model_config.json").is_file():
        name = "model_config.json"
    config = load_json(path / name, name)
    if not isinstance(config, dict):
        raise CheckpointError(f"{name} is not a JSON object", path / name, "fix or restore it")
    check_config(config, path / name, name)
    prefix = ""
    if name == "model_config.json":
        # {"init_args": [{"init_args": [{...}], "init_class": "GPTModel"}], "init_class": "GPTForCausalLM"}
        init_class = config.get("init_class")
        while isinstance(config.get("init_args"), list) and config["init_args"]:
            first = config["init_args"][0]
            if not isinstance(first, dict):
                break
            prefix = f"{prefix}.init_args.0".lstrip(".")
            config = first
        config = dict(config)
        if "model_type" not in config and isinstance(init_class, str):
            config["model_type"] = re.sub(r"(For[A-Z].*|Model|PretrainedModel)$", "", init_class).lower()
    return config, name, prefix


def apply_config_sets(data: dict, sets: list[tuple[str, Any]]) -> bool:
    """Set each dotted ``key`` of ``sets`` to its value in ``data`` (a parsed config, changed in place);
    True when any value changed (a key already holding its value is left as it is)."""
    changed = False
    for key, value in sets:
        try:
            if get_dotted(data, key) == value:
                continue
        except (KeyError, IndexError, TypeError):
            pass
        set_dotted(data, key, value)
        changed = True
    return changed
