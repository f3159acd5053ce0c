"""Write a :class:`surgery.plan.flex_edit.FlexEdit`: the Trainer flex checkpoint with its vocabulary tensors
(and their moments and master weights) rewritten, into a folder :func:`surgery.write.publish.publish`
moves into place when complete.

Each flex folder is written by :func:`surgery.io.flex_write.rewrite_folder` (a ``.distcp`` without a
changed tensor hard-linked, or copied across file systems; the others rewritten keeping every other
entry's bytes); a folder with nothing changed is linked file by file. Every other file of the checkpoint is
linked the same way (``rng_state*``, ``scheduler.pdparams``, ``trainer_state.bin``, ``training_args.bin``,
``saved_signal_*``, the tokenizer files add-tokens does not edit), except PaddleFormers' loader cache
``*.auto_generated.metadata`` (it describes the old shapes: :data:`surgery.io.surface.LOADER_CACHE`) and
an old ``tietool-report.json``. ``config.json`` is written with the plan's changes (the config found as
``merge`` finds it, so a later ``merge`` of the output finds the new sizes beside it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..io import flex, flex_write, surface
from ..io.checkpoint import REPORT_NAME
from ..io.configfile import apply_config_sets
from ..plan.flex_edit import FlexEdit
from .publish import write_json


def _link_tree(src: Path, dst: Path, done: list[str], rel: str) -> None:
    """``src`` (a file or a folder) as ``dst``: files hard-linked (copied across file systems)."""
    if src.is_dir():
        dst.mkdir()
        for p in sorted(src.iterdir()):
            if not surface.LOADER_CACHE.match(p.name):
                _link_tree(p, dst / p.name, done, f"{rel}/{p.name}")
        return
    flex_write.link_or_copy(src, dst)
    done.append(rel)


def _config(edit: FlexEdit) -> dict[str, Any]:
    """The checkpoint's config (as found by ``merge``) with the plan's config.json changes."""
    data = json.loads(json.dumps(edit.flex.config))
    apply_config_sets(
        data, [(key, value) for file, key, value in edit.plan.config_set if file == "config.json"]
    )
    return data


def write_flex_edit(edit: FlexEdit, tmp: Path) -> dict[str, Any]:
    """Write ``edit`` into the empty folder ``tmp``; returns the written-file facts (``files``:
    ``linked``, ``rewritten``, ``written``; ``training_state_resized``: per flex folder, the keys replaced).

    Raises:
        OSError: a write failed (the caller removes ``tmp``).
    """
    root = edit.root
    tok = edit.plan.tokenizer.files if edit.plan.tokenizer is not None else {}
    linked: list[str] = []
    rewritten: list[str] = []
    resized: dict[str, list[str]] = {}
    for p in sorted(root.iterdir()):
        n = p.name
        if n in flex.STATE_DIRS and p.is_dir():
            new = edit.rewrites.get(n, {})
            if not new:
                _link_tree(p, tmp / n, linked, n)
                continue
            ck = flex.open_flex(flex.FlexFolder(root, p, ()))
            (tmp / n).mkdir()
            flex_write.rewrite_folder(p, tmp / n, ck.metadata, ck.tensors, new)
            for q in sorted((tmp / n).iterdir()):
                if surface.LOADER_CACHE.match(q.name):
                    q.unlink()
            rewritten += [f"{n}/{f}" for f in sorted({s.file for k in new for s in ck.tensors[k].slices})]
            rewritten.append(f"{n}/{ck.metadata}")
            resized[n] = sorted(new)
        elif n in ("config.json", REPORT_NAME) or n in tok or surface.LOADER_CACHE.match(n):
            continue
        else:
            _link_tree(p, tmp / n, linked, n)
    write_json(tmp / "config.json", _config(edit))
    for rel, data in sorted(tok.items()):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
        if (root / rel).is_file():
            shutil.copymode(root / rel, tmp / rel)
    written = ["config.json", *sorted(tok)]
    return {
        "files": {
            "copied": [],
            "linked": linked,
            "rewritten": rewritten,
            "written": written,
            "removed": [],
            "edited": sorted(tok),
        },
        "training_state_resized": resized,
        "total_size": sum(os.path.getsize(tmp / f) for f in rewritten if (tmp / f).is_file()),
    }
