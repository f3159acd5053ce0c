"""config.json / model_config.json helpers: read, and get or set a dotted key (``text_config.vocab_size``,
``init_args.0.vocab_size``: integers index lists)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_config_file(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:  # a Path or a remote UPath
        return json.load(f)


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
