"""Special-token sync: which token is the pad / bos / eos token, said the same way by every file that says
it (the set_special option of ``rename-tokens``; gguf's ``gguf-new-metadata`` special-token option).

The tokenizer files name the token by its string (``tokenizer_config.json`` and ``special_tokens_map.json``
``<name>_token``, a string or an ``AddedToken`` object whose ``content`` is set; ``tokenizer.json``'s
``padding``), the model files by its id (config.json ``<name>_token_id``, also in the language model's
nested block; ``generation_config.json``): :func:`special_files` edits the first kind,
:func:`special_config_sets` gives the second as config sets for the plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..model.errors import Opt, RefusedError, UsageError
from .regular import JSON_LIMIT, read_bounded

SPECIAL_NAMES = ("pad", "bos", "eos")
"""The special tokens the set_special option sets (their ``<name>_token`` / ``<name>_token_id`` keys)."""


def parse_specials(items: list[str]) -> dict[str, str]:
    """``["pad=<|pad|>"]`` → ``{"pad": "<|pad|>"}``.

    Raises:
        UsageError: not ``NAME=TOKEN``, a name outside :data:`SPECIAL_NAMES`, a name twice.
    """
    out: dict[str, str] = {}
    for item in items:
        name, sep, token = item.partition("=")
        if not sep or name not in SPECIAL_NAMES or not token:
            raise UsageError(
                f"{Opt('set_special', item)} is not NAME=TOKEN with NAME one of {', '.join(SPECIAL_NAMES)}",
                fix=f"e.g. {Opt('set_special', 'pad=<|pad|>')}",
            )
        if name in out:
            raise UsageError(f"{Opt('set_special', name)} is given twice", fix="give each name once")
        out[name] = token
    return out


def _dump(original: str, data: Any) -> bytes:
    m = re.search(r"\n( +)\S", original)
    text = json.dumps(data, indent=len(m.group(1)) if m else 2, ensure_ascii=False)
    return (text + ("\n" if original.endswith("\n") else "")).encode()


def special_files(
    folder: Path, specials: Mapping[str, tuple[str, int]], files: Mapping[str, bytes]
) -> dict[str, bytes]:
    """The tokenizer files with each ``name`` of ``specials`` (``name → (token, id)``) set: ``files`` (the
    edit's new bytes, by name) and the folder's other files, edited; only files that change are returned.

    Raises:
        RefusedError: a bos/eos that tokenizer.json's post-processor inserts by its old string (changing it
            needs a new template: not done).
    """
    out: dict[str, bytes] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        blob = files.get(name) or ((folder / name).read_bytes() if (folder / name).is_file() else None)
        if blob is None:
            continue
        text = blob.decode("utf-8")
        data = json.loads(text) if len(blob) <= JSON_LIMIT else None
        if not isinstance(data, dict):
            continue
        if name == "tokenizer.json":
            _refuse_template(folder, data, specials, _named(folder, files))
            _padding(data, specials)
        else:
            for s, (token, _) in specials.items():
                key = f"{s}_token"
                v = data.get(key)
                if isinstance(v, dict):
                    v["content"] = token
                elif name == "tokenizer_config.json" or key in data:
                    data[key] = token
        new = _dump(text, data)
        if new != blob or name in files:
            out[name] = new
    return out


def _named(folder: Path, files: Mapping[str, bytes]) -> dict[str, str]:
    """``{name: token}`` of the special tokens tokenizer_config.json names now."""
    blob = files.get("tokenizer_config.json")
    p = folder / "tokenizer_config.json"
    if blob is None and p.is_file():
        blob = read_bounded(p, JSON_LIMIT)
    data = json.loads(blob) if blob else {}
    out = {}
    for s in SPECIAL_NAMES:
        v = data.get(f"{s}_token") if isinstance(data, dict) else None
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[s] = v
    return out


def _refuse_template(
    folder: Path, data: dict, specials: Mapping[str, tuple[str, int]], named: dict[str, str]
) -> None:
    post = json.dumps(data.get("post_processor") or {}, ensure_ascii=False)
    for s in ("bos", "eos"):
        old = named.get(s)
        if s in specials and old and old != specials[s][0] and json.dumps(old)[1:-1] in post:
            raise RefusedError(
                f"{Opt('set_special', s)}: tokenizer.json's post_processor inserts {old!r} by its string",
                folder / "tokenizer.json",
                "set it with the tokenizer library (its template), or leave it as it is",
            )


def _padding(data: dict, specials: Mapping[str, tuple[str, int]]) -> None:
    """tokenizer.json's ``padding`` (when set) pads with the new pad token."""
    pad = data.get("padding")
    if "pad" in specials and isinstance(pad, dict):
        pad["pad_token"], pad["pad_id"] = specials["pad"]


def special_config_sets(
    folder: Path, specials: Mapping[str, tuple[str, int]], text_key: str | None
) -> list[tuple[str, str, object]]:
    """``(file, dotted key, id)`` for each name: config.json ``<name>_token_id`` (and in the language
    model's block ``text_key`` where it has the key), generation_config.json's when the file exists.

    Raises:
        RefusedError: an eos_token_id that is a list (several stop ids: which to replace is not told).
    """
    out: list[tuple[str, str, object]] = []
    for file in ("config.json", "generation_config.json"):
        p = folder / file
        if not p.is_file():
            continue
        data = json.loads(read_bounded(p, JSON_LIMIT))
        block = data.get(text_key) if text_key and isinstance(data, dict) else None
        for s, (_, i) in specials.items():
            key = f"{s}_token_id"
            for where, d in (("", data), (f"{text_key}.", block)):
                if not isinstance(d, dict) or (where and key not in d):
                    continue
                if isinstance(d.get(key), list):
                    raise RefusedError(
                        f"{Opt('set_special', s)}: {file} {where}{key} is a list {d[key]} (several stop ids)",
                        p,
                        "edit that list by hand",
                    )
                out.append((file, where + key, i))
    return out
