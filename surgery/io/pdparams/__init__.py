"""Paddle pickles (``.pdparams`` weights, ``.pdopt`` optimizer state): a pickle of ``{name: numpy.ndarray}``
(+ ``StructuredToParameterName@@``), read without ever unpickling and written as ``paddle.save`` writes it.

* :mod:`.unpickle` — the allow-list walker: walks the pickle's opcodes itself, executes nothing from the file,
  records array payloads as byte ranges, bounded by its limits;
* :mod:`.allowlist` — what the walker accepts (the allow-lists and their limits) and the stand-ins it builds;
* :mod:`.read` — tensor headers and arrays of a weights or optimizer file, from the walk;
* :mod:`.write` — the protocol-4 emitter, with payloads streamed from their sources and aliases written once
  and referenced through the pickle memo.
"""

from .allowlist import ALLOWED_GLOBALS, OPTIMIZER, WEIGHTS, AllowList, Limits, Record
from .read import (
    NON_TENSOR_KEYS,
    SPLIT_TABLE,
    OptimizerHeader,
    raw_bytes_source,
    read_array,
    read_header,
    read_optimizer_header,
)
from .unpickle import walk
from .write import Emitter, Row, write_file, write_optimizer_file

__all__ = [
    "ALLOWED_GLOBALS",
    "NON_TENSOR_KEYS",
    "OPTIMIZER",
    "SPLIT_TABLE",
    "WEIGHTS",
    "AllowList",
    "Emitter",
    "Limits",
    "OptimizerHeader",
    "Record",
    "Row",
    "raw_bytes_source",
    "read_array",
    "read_header",
    "read_optimizer_header",
    "walk",
    "write_file",
    "write_optimizer_file",
]
