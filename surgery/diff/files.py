"""What ``diff`` compares besides tensors: config keys, safetensors ``__metadata__``, tokenizer tokens and
the other files of the folders."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..io import store
from ..io.tokenizer import vocabulary
from ..io.vocabkeys import walk
from .sides import Side, same_file

_BLOCK = 1 << 20


def keys(a: dict, b: dict) -> dict[str, list[dict]]:
    """Leaf keys (dotted: ``text_config.vocab_size``, list items by index) only in ``b`` (``added``), only
    in ``a`` (``removed``), and in both with different values (``changed``: ``before``, ``after``); values
    compare as JSON does (``1`` and ``1.0`` equal, ``true`` and ``1`` not)."""
    fa, fb = dict(walk(a)), dict(walk(b))
    return {
        "added": [{"key": k, "value": fb[k]} for k in fb if k not in fa],
        "removed": [{"key": k, "value": fa[k]} for k in fa if k not in fb],
        "changed": [
            {"key": k, "before": fa[k], "after": fb[k]} for k in fa if k in fb and not _same(fa[k], fb[k])
        ],
    }


def _same(x: object, y: object) -> bool:
    return (
        type(x) is type(y)
        and x == y
        or (
            isinstance(x, int | float)
            and isinstance(y, int | float)
            and not isinstance(x, bool)
            and not isinstance(y, bool)
            and x == y
        )
    )


def metadata(side: Side) -> dict[str, str]:
    """Every shard's safetensors ``__metadata__`` entries, merged (``{}`` for a ``.pdparams``)."""
    out: dict[str, str] = {}
    for m in side.ckpt.st_metadata.values():
        out.update(m or {})
    return out


def tokens(a: Side, b: Side) -> dict[str, list[dict]]:
    """Tokens only in ``b`` (``added``: ``token``, ``id``), only in ``a`` (``removed``), and in both at
    other ids (``renumbered``: ``token``, ``id_before``, ``id_after``), from each side's tokenizer files
    (:func:`surgery.io.tokenizer.vocabulary`: ``{id: token}``, the first file naming an id wins); a token
    at several ids counts at its lowest."""
    va, vb = vocabulary(a.tokenizer), vocabulary(b.tokenizer)
    ia, ib = _ids(va), _ids(vb)
    return {
        "added": [{"token": s, "id": i} for s, i in sorted(ib.items(), key=lambda x: x[1]) if s not in ia],
        "removed": [{"token": s, "id": i} for s, i in sorted(ia.items(), key=lambda x: x[1]) if s not in ib],
        "renumbered": [
            {"token": s, "id_before": i, "id_after": ib[s]}
            for s, i in sorted(ia.items(), key=lambda x: x[1])
            if s in ib and ib[s] != i
        ],
    }


def _ids(vocab: dict[int, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in sorted(vocab):
        out.setdefault(vocab[i], i)
    return out


def sha256(path: Any) -> str:
    """The sha256 of a file, read in blocks (local or remote)."""
    h = hashlib.sha256()
    with store.open_read(path) as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _size(path: Any) -> int:
    return int(store.size(path))


def files(a: Side, b: Side) -> dict[str, list[dict]]:
    """Other files by relative name: only in ``b`` (``added``), only in ``a`` (``removed``), in both with
    different bytes (``changed``); each with its size and sha256 (``changed``: both sides'). Two names of
    one local file (a hard link) are equal unread; files of different sizes differ unread; others are
    compared byte for byte (:func:`surgery.io.store.same_bytes`)."""
    out: dict[str, list[dict]] = {"added": [], "removed": [], "changed": []}
    for rel in sorted(set(a.files) | set(b.files)):
        pa, pb = a.files.get(rel), b.files.get(rel)
        if pa is None or pb is None:
            p = pb if pa is None else pa
            out["added" if pa is None else "removed"].append(
                {"name": rel, "bytes": _size(p), "sha256": sha256(p)}
            )
            continue
        if same_file(pa, pb):
            continue
        sa, sb = _size(pa), _size(pb)
        if sa == sb and store.same_bytes(pa, pb):
            continue
        out["changed"].append(
            {
                "name": rel,
                "bytes_before": sa,
                "bytes_after": sb,
                "sha256_before": sha256(pa),
                "sha256_after": sha256(pb),
            }
        )
    return out


def shown(v: object) -> str:
    """A config value as the text output shows it (JSON)."""
    return json.dumps(v, ensure_ascii=False)
