"""Read back every weight file of an output before it is renamed into place.

What was meant to be written (names in order, dtype labels, shapes, the safetensors ``__metadata__``) is
compared with what a reader sees in the temporary folder:

* ``.safetensors`` files are opened with the ``safetensors`` library's own ``safe_open`` (the reference
  reader: it refuses duplicate names, holes or overlaps between tensors, a span that does not match the
  shape and dtype, and bytes after the last tensor), so an output tietool writes is one that library loads;
* ``.pdparams`` files are walked by tietool's strict opcode reader (:func:`pdparams_io.read_header`), the
  one that refuses anything a weights pickle should not hold, so an output never fails tietool's own
  checks on the next run;
* the index (``weight_map``, ``metadata.total_size``) must equal what the shard headers hold.

Only headers are read (the data was streamed from byte ranges checked when they were planned), so this
costs milliseconds even for a 100 GB checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import OutputError
from .formats import pdparams_io
from .formats.tensor import DTYPES, NP_TO_ST


@dataclass(frozen=True)
class Planned:
    """One tensor as it was meant to be written.

    Attributes:
        name: state-dict name.
        dtype: the safetensors label (``F32``, ``BF16``...) or the numpy name a ``.pdparams`` stores
            (``float32``, ``uint16``); both are normalised before comparing.
        shape: e.g. ``(vocab_size, hidden_size)``.
        nbytes: size of the data in bytes (what ``total_size`` counts).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def _pdparams_label(dtype: str) -> str:
    """The label a ``.pdparams`` reader reports for ``dtype`` (bf16 is stored as ``uint16`` there)."""
    np_name = (DTYPES[dtype].np_name or dtype) if dtype in DTYPES else dtype
    return NP_TO_ST.get(np_name, np_name)


def _mismatch(path: Path, what: str) -> OutputError:
    return OutputError(
        f"the written file does not read back as planned ({what}); nothing was written",
        path,
        "this is a bug in tietool or a failing disk: please report it with TIETOOL_DEBUG=1",
    )


def _check_same(path: Path, planned: list[Planned], seen: list[tuple[str, str, tuple[int, ...]]]) -> None:
    want = [(p.name, p.dtype, tuple(p.shape)) for p in planned]
    if sorted(seen) != sorted(want):
        missing = sorted({w[0] for w in want} - {s[0] for s in seen})
        extra = sorted({s[0] for s in seen} - {w[0] for w in want})
        changed = sorted(w[0] for w in want if w not in seen and w[0] not in missing)
        raise _mismatch(path, f"missing {missing}, unexpected {extra}, dtype/shape differs {changed}")


def check_safetensors(path: Path, planned: list[Planned], metadata: dict[str, str] | None) -> None:
    """Open ``path`` with ``safetensors.safe_open`` and compare names, dtypes, shapes and metadata.

    Raises:
        OutputError: the library refuses the file, or it holds other tensors or metadata than planned.
    """
    from safetensors import safe_open  # the reference reader; imported only when a file is written

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata()
            seen = []
            for name in f.keys():
                s = f.get_slice(name)
                seen.append((name, str(s.get_dtype()), tuple(s.get_shape())))
    except OutputError:
        raise
    except Exception as e:  # noqa: BLE001 - the library's own refusal, whatever its class
        raise _mismatch(path, f"safetensors refuses it: {e}") from None
    _check_same(path, planned, seen)
    if (meta or None) != ({str(k): str(v) for k, v in metadata.items()} if metadata else None):
        raise _mismatch(path, f"__metadata__ {meta!r}, planned {metadata!r}")


def check_pdparams(path: Path, planned: list[Planned]) -> None:
    """Walk ``path`` with the strict opcode reader and compare names, dtypes and shapes.

    Raises:
        OutputError: the reader refuses the file, or it holds other tensors than planned.
    """
    try:
        tensors, _extras, _module = pdparams_io.read_header(path, path.name)
    except Exception as e:  # noqa: BLE001 - tietool's own refusal of the file it just wrote
        raise _mismatch(path, f"the pickle reader refuses it: {e}") from None
    seen = [(t.name, _pdparams_label(t.dtype), tuple(t.shape)) for t in tensors]
    want = [Planned(p.name, _pdparams_label(p.dtype), p.shape, p.nbytes) for p in planned]
    _check_same(path, want, seen)


def check_index(path: Path, shards: dict[str, list[Planned]]) -> None:
    """The index at ``path`` names exactly the tensors of ``shards`` (file → tensors), each in its file,
    and ``metadata.total_size`` is their byte total.

    Raises:
        OutputError: the index disagrees with the shards.
    """
    index = json.loads(path.read_text(encoding="utf-8"))
    want = {p.name: f for f, ps in shards.items() for p in ps}
    if index.get("weight_map") != want:
        raise _mismatch(path, "weight_map differs from the shards' contents")
    total = sum(p.nbytes for ps in shards.values() for p in ps)
    if (index.get("metadata") or {}).get("total_size") != total:
        raise _mismatch(path, f"metadata.total_size is not {total}")
