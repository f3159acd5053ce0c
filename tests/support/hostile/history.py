"""Forged report history (issue 29): ``verify BASE OUT`` where OUT lost a base-vocabulary token (id 299 of
the 300 of the sample's tokenizer.json, removed by hand) and its ``tietool-report.json`` claims a run
removed it. tietool never removes base-vocabulary tokens, and a trim only ids at or beyond the rows it keeps
(each run starting from the previous one's rows), so every such claim is checked against the files and
called unverifiable: exit 7 naming the token, never exit 0.

A forged ``rows_reset`` claim the same way: OUT is e04 (Llama-3 base, untrained chat tokens) with the
trained rows of '<|begin_of_text|>' (id 262) overwritten by hand and a report saying add-tokens reset them
as all zero; they are not in BASE, so verify calls the report unverifiable (exit 7 naming id 262). Nothing
here imports tietool.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from support import paths
from support.hostile import Hostile

SAMPLE = paths.REPO / "sample_checkpoints" / "pf_llama_with_tokenizer"
E04 = paths.BUG_CASES_DIR / "e04_llama3_base_untrained_chat_tokens" / "ckpt"


def _forged(history: list[dict], own: dict | None = None) -> Callable[[Path], Path]:
    """BASE (the sample, untouched) and OUT (the sample without token 299) with a report whose history is
    ``history`` and whose own run is ``own`` (default: an add-tokens run that added nothing)."""

    def build(dest: Path) -> Path:
        shutil.copytree(SAMPLE, dest / "base")
        ckpt = dest / "ckpt"
        shutil.copytree(SAMPLE, ckpt)
        tok = json.loads((ckpt / "tokenizer.json").read_text())
        gone = next(k for k, v in tok["model"]["vocab"].items() if v == 299)
        del tok["model"]["vocab"][gone]
        (ckpt / "tokenizer.json").write_text(json.dumps(tok))
        claim = [{"id": 299, "content": gone}]
        hist = [json.loads(json.dumps(h).replace('"@CLAIM@"', json.dumps(claim))) for h in history]
        rep = own or {
            "operation": "add-tokens",
            "add_tokens": {"tokens": [], "rows_before": 320, "rows_after": 320},
        }
        (ckpt / "tietool-report.json").write_text(
            json.dumps({**rep, "tool": "tietool 0.1.0", "history": hist})
        )
        return ckpt

    return build


def _resize(before: int | None, after: int | None) -> dict:
    sec: dict = {"tokens_removed": "@CLAIM@"}
    sec |= {k: v for k, v in (("rows_before", before), ("rows_after", after)) if v is not None}
    return {"tool": "tietool 0.1.0", "operation": "resize", "resize": sec}


def _h(name: str, history: list[dict], own: dict | None = None) -> Hostile:
    return Hostile(
        f"history-{name}",
        "report-history",
        _forged(history, own),
        7,
        commands=("verify",),
        names=("(id 299)", "unverifiable"),
        base="base",
    )


CASES = [
    _h("bare-claim", [_resize(None, None)]),
    _h(
        "rows-follow-on",
        [_resize(320, 299)],
        {"operation": "add-tokens", "add_tokens": {"tokens": [], "rows_before": 299, "rows_after": 320}},
    ),
    _h("rows-break", [_resize(320, 299)]),
    _h("trim-above-the-id", [_resize(320, 300)]),
]


def copy_row(st: Path, name: str, src: int, dst: int) -> None:
    """Overwrite row ``dst`` of the 2-D tensor ``name`` of the safetensors file ``st`` by the bytes of row
    ``src`` (any dtype: bytes, read from the file's own header; a new file, so hard links keep theirs)."""
    data = bytearray(st.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    t = json.loads(data[8 : 8 + n])[name]
    begin, end = (8 + n + o for o in t["data_offsets"])
    row = (end - begin) // t["shape"][0]
    a, b = begin + src * row, begin + dst * row
    data[b : b + row] = data[a : a + row]
    st.unlink()
    st.write_bytes(bytes(data))


def _forged_reset(dest: Path) -> Path:
    """BASE: e04; OUT: e04 with rows 262 of the embedding and the head replaced by rows 263, and a report
    whose add-tokens run claims it reset the (trained) rows of '<|begin_of_text|>' (id 262)."""
    shutil.copytree(E04, dest / "base")
    ckpt = dest / "ckpt"
    shutil.copytree(E04, ckpt)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        copy_row(ckpt / "model.safetensors", name, 263, 262)
    claim = {"content": "<|begin_of_text|>", "id": 262, "special": True, "existed": True}
    rep = {
        "tool": "tietool 0.1.0",
        "operation": "add-tokens",
        "add_tokens": {
            "tokens": [{**claim, "rows_reset": True, "init": "copy", "source_ids": [263]}],
            "rows_before": 270,
            "rows_after": 270,
        },
    }
    (ckpt / "tietool-report.json").write_text(json.dumps(rep))
    return ckpt


CASES.append(
    Hostile(
        "history-forged-rows-reset",
        "report-history",
        _forged_reset,
        7,
        commands=("verify",),
        names=("(id 262)", "rows_reset", "not all zero", "unverifiable"),
        base="base",
    )
)
