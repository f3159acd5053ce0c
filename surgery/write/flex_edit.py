"""Write a plan of :class:`~surgery.plan.plan.FlexFolders` layout: the Trainer flex checkpoint with its
vocabulary tensors (and their moments and master weights) rewritten, into a folder
:func:`surgery.write.publish.publish` moves into place when complete.

Each flex folder is written by :func:`surgery.io.flex_write.rewrite_folder` (a ``.distcp`` without a
changed tensor kept by :func:`surgery.io.tree.place_kept`: hard-linked, copied across file systems; the
others rewritten keeping every other entry's bytes); a folder with nothing changed is kept file by file.
Every other file of the checkpoint is kept the same way (a symbolic link by the one rule of
:func:`~surgery.io.tree.place_kept`: one that leads outside the checkpoint is the file behind it):
``rng_state*``, ``scheduler.pdparams``, ``trainer_state.bin``, ``training_args.bin``,
``saved_signal_*``, the tokenizer files add-tokens does not edit; except PaddleFormers' loader cache
``*.auto_generated.metadata`` (it describes the old shapes: :data:`surgery.io.surface.LOADER_CACHE`) and
an old ``tietool-report.json``. ``config.json`` is written with the plan's changes (the config found as
``merge`` finds it, so a later ``merge`` of the output finds the new sizes beside it).

Every file written is read back before the folder is published (:mod:`surgery.io.readback`): each
rewritten ``.distcp`` by the strict pickle reader (names, dtypes, shapes as written), each ``.metadata`` by
tietool's flex reader (every record as planned), config.json and the tokenizer files byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..io import flex, flex_write, surface, tree
from ..io.checkpoint import REPORT_NAME
from ..io.configfile import apply_config_sets
from ..plan.plan import FlexFolders, Plan
from .edits import json_bytes, write_edited


def _kept_files(root: Path, skip: set[str]) -> list[str]:
    """Every file below ``root`` the output keeps unchanged (relative names, sorted as the walk meets them):
    all but the top-level names in ``skip`` and PaddleFormers' loader caches."""
    out: list[str] = []

    def walk(folder: Path, rel: str) -> None:
        for p in sorted(folder.iterdir()):
            r = f"{rel}{p.name}"
            if (not rel and p.name in skip) or surface.LOADER_CACHE.match(p.name):
                continue
            if p.is_dir():
                walk(p, r + "/")
            else:
                out.append(r)

    walk(root, "")
    return out


def _keep(root: Path, tmp: Path, rels: list[str]) -> list[str]:
    """Place each of ``rels`` (files of ``root``) in ``tmp`` by :func:`surgery.io.tree.place_kept` (linked;
    copied across file systems); returns them."""
    kept = set(rels)
    for rel in rels:
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if tree.place_kept(root / rel, dst, root, kept, True) is tree.Placed.COPY:
            shutil.copy2(root / rel, dst)
    return rels


def _config(plan: Plan, lay: FlexFolders) -> dict[str, Any]:
    """The checkpoint's config (as found by ``merge``) with the plan's config.json changes."""
    data = json.loads(json.dumps(lay.config))
    apply_config_sets(data, [(key, value) for file, key, value in plan.config_set if file == "config.json"])
    return data


def _rewrite_state(lay: FlexFolders, tmp: Path, name: str) -> list[str]:
    """Rewrite flex folder ``name`` into ``tmp / name`` (:func:`surgery.io.flex_write.rewrite_folder`) and
    read back what it wrote, each file by its format (:meth:`surgery.io.formats.Written.check`): each
    rewritten ``.distcp`` and the ``.metadata``; returns those files.

    Raises:
        OutputError: a file does not read back as planned.
    """
    src, dst = lay.root / name, tmp / name
    ck = flex.open_flex(flex.FlexFolder(lay.root, src, ()))
    dst.mkdir()
    done = flex_write.rewrite_folder(src, dst, ck.metadata, ck.tensors, lay.rewrites[name])
    for q in sorted(dst.iterdir()):
        if surface.LOADER_CACHE.match(q.name):
            q.unlink()
    for w in done.written:
        w.check(dst)
    return [f"{name}/{f}" for f in sorted(done.rewritten)] + [f"{name}/{done.metadata}"]


def write_flex_edit(plan: Plan, tmp: Path) -> dict[str, Any]:
    """Write ``plan`` (its layout :class:`~surgery.plan.plan.FlexFolders`) into the empty folder ``tmp``,
    every written file read back; returns the written-file facts (``files``: ``linked``, ``rewritten``,
    ``written``; ``training_state_resized``: per flex folder, the keys replaced).

    Raises:
        OSError: a write failed (the caller removes ``tmp``). OutputError: a file does not read back.
    """
    lay = plan.layout
    assert isinstance(lay, FlexFolders), "internal: a flex edit has the FlexFolders layout"
    root = lay.root
    tok = plan.tokenizer.files if plan.tokenizer is not None else {}
    changed = {n for n in flex.STATE_DIRS if lay.rewrites.get(n) and (root / n).is_dir()}
    skip = {"config.json", REPORT_NAME, *changed, *(r.split("/", 1)[0] for r in tok if "/" not in r)}
    linked = _keep(root, tmp, [r for r in _kept_files(root, skip) if r not in tok])
    rewritten: list[str] = []
    for n in sorted(changed):
        rewritten += _rewrite_state(lay, tmp, n)
    write_edited(tmp, "config.json", json_bytes(_config(plan, lay)), None)
    for rel, data in sorted(tok.items()):
        write_edited(tmp, rel, data, root / rel)
    return {
        "files": {
            "copied": [],
            "linked": linked,
            "rewritten": rewritten,
            "written": ["config.json", *sorted(tok)],
            "removed": [],
            "edited": sorted(tok),
        },
        "training_state_resized": {n: sorted(lay.rewrites[n]) for n in sorted(changed)},
        "total_size": sum(os.path.getsize(tmp / f) for f in rewritten if (tmp / f).is_file()),
    }
