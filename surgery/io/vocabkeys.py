"""The config keys that size a vocabulary, found at any nesting of the checkpoint's config files.

A key sizes a vocabulary when its last part is one of :data:`surgery.arch.VOCAB_SIZE_KEYS`
(``vocab_size`` at the top level or inside ``text_config``/``llm_config``, ChatGLM's ``padded_vocab_size``,
Marian's ``decoder_vocab_size``, ...) and its value is an integer. PaddleNLP's older ``model_config.json``
keeps them under ``init_args.N``. ``resize`` moves the keys that count the embedding's rows (or the head's,
for an embedding with reserved rows); ``verify`` flags one left at the old size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..arch import VOCAB_SIZE_KEYS
from . import store
from .configfile import read_config_file

# The key names (:data:`surgery.arch.VOCAB_SIZE_KEYS`, :data:`surgery.arch.TABLE_SIZE_KEYS`) are data in
# :mod:`surgery.arch.config_keys`; this module walks the files for them.

# Config files that may hold vocabulary sizes, in the order a loader reads them.
CONFIG_FILES: tuple[str, ...] = ("config.json", "model_config.json")


@dataclass(frozen=True)
class VocabKey:
    """One config key that sizes a vocabulary.

    Attributes:
        file: the config file (``config.json`` or ``model_config.json``), relative to the checkpoint.
        key: dotted path (``text_config.vocab_size``, ``init_args.0.vocab_size``; integers index lists).
        value: its integer value (a count of vocabulary entries).
    """

    file: str
    key: str
    value: int


def walk(data: object, prefix: str = ""):
    """(dotted key, value) of every leaf under ``data``: dict keys and list indices joined by dots."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from walk(v, f"{prefix}{k}.")
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from walk(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], data


def vocab_keys_in(data: object, file: str) -> list[VocabKey]:
    """The vocabulary-size keys of one parsed config file (any nesting), in file order.

    Booleans are not sizes (``bool`` is an ``int`` in Python): they are skipped.
    """
    return [
        VocabKey(file, k, v)
        for k, v in walk(data)
        if k.split(".")[-1] in VOCAB_SIZE_KEYS and isinstance(v, int) and not isinstance(v, bool)
    ]


def vocab_keys(folder: str | Path, config: dict | None = None) -> list[VocabKey]:
    """Every vocabulary-size key in the config files of checkpoint ``folder``.

    Args:
        folder: the checkpoint folder.
        config: its parsed ``config.json`` when already read (it is not read again).

    An absent config file contributes nothing.

    Raises:
        CheckpointError: a config file that is not a regular file, cannot be read, is not valid JSON or
            holds a key of the wrong type (:func:`surgery.io.configfile.read_config_file`).
    """
    out: list[VocabKey] = []
    for name in CONFIG_FILES:
        if name == "config.json" and config is not None:
            data: object = config
        else:
            p = store.path_of(folder) / name
            if not p.exists():
                continue
            data = read_config_file(p)
        out += vocab_keys_in(data, name)
    return out
