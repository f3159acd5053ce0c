"""Symbolic links in and around a checkpoint (issue 18, items 4 and 9) and tensors of the wrong rank (item 6).

* ``link-``: a symlinked subfolder (relative inside the folder, relative outside it, absolute, nested) is
  followed: every command exits 0 (README "Symbolic links in a checkpoint"); a dangling link (to a folder
  or a file), a loop (to itself, to the checkpoint, to a folder above it, to ``/``) is refused by name,
  exit 3.
* ``out-``: ``--out`` as a symbolic link: to an empty folder it is followed (exit 0); dangling or a loop,
  exit 6 before any work; to a file or a non-empty folder, exit 2 as that
  file or folder itself.
* ``rank-``: an embedding or head of rank 0, 1, 3 or 40, in a safetensors and a ``.pdparams``: exit 3 or 5
  naming the tensor, never 70.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from support import adversarial_support as av
from support.hostile import Hostile

WRITERS = ("tie", "untie", "resize", "convert")


# ------------------------------------------------------------------------------------------------ link-
def _with_links(*links: tuple[str, str], folders: tuple[str, ...] = ()):
    """A build: the safetensors fixture with each ``(path in the checkpoint, link text)`` made; ``folders``
    (relative to the case's folder, beside ``ckpt``) are created first with a file in each."""

    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
        (ckpt / "inside").mkdir()
        (ckpt / "inside" / "tokenizer_config.json").write_text('{"model_max_length": 8}')
        for f in folders:
            (dest / f).mkdir(parents=True)
            (dest / f / "vocab.txt").write_text("a\nb\n")
        for rel, text in links:
            (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(text.replace("{dest}", str(dest)), ckpt / rel)
        return ckpt

    return build


FOLLOWED = [
    ("link-folder-relative-inside", [("tokenizer", "inside")], ()),
    ("link-folder-relative-outside", [("tokenizer", "../shared_tokenizer")], ("shared_tokenizer",)),
    ("link-folder-absolute", [("assets", "{dest}/assets_store")], ("assets_store",)),
    ("link-folder-nested", [("sub/deeper/assets", "../../../assets_store")], ("assets_store",)),
    ("link-folder-to-link", [("tok", "tok2"), ("tok2", "../shared_tokenizer")], ("shared_tokenizer",)),
]
REFUSED = [
    ("link-folder-dangling", [("tokenizer", "../no_such_tokenizer")], "tokenizer"),
    ("link-file-dangling", [("tokenizer.json", "../gone/tokenizer.json")], "tokenizer.json"),
    ("link-file-dangling-nested", [("inside/special_tokens_map.json", "nowhere.json")], "special_tokens_map"),
    ("link-loop-self", [("loop", "loop")], "loop"),
    ("link-loop-pair", [("a", "b"), ("b", "a")], "symbolic link loop"),
    ("link-loop-to-checkpoint", [("inside/up", "..")], "inside/up"),
    ("link-loop-above", [("upup", "../..")], "upup"),
    ("link-loop-root", [("rootfs", "/")], "rootfs"),
    ("link-loop-to-parent-folder", [("inside/back", "../inside")], "inside/back"),
]

LINK_CASES = [Hostile(n, "folder-link", _with_links(*links, folders=f), 0) for n, links, f in FOLLOWED] + [
    Hostile(n, "folder-link", _with_links(*links), 3, names=(name, "symbolic link"))
    for n, links, name in REFUSED
]


# ------------------------------------------------------------------------------------------------ out-
def _plain(dest: Path) -> Path:
    return av.copy_case(av.ST_ONE, dest / "ckpt")


def _out_link(kind: str):
    """``--out`` made a symbolic link of ``kind`` before each run (its targets sit beside it)."""

    def prepare(out: Path) -> None:
        target = out.with_name(out.name + ".target")
        if kind == "empty-folder":
            target.mkdir()
            out.symlink_to(target)
        elif kind == "full-folder":
            target.mkdir()
            (target / "keep.txt").write_text("mine")
            out.symlink_to(target)
        elif kind == "file":
            target.write_text("mine")
            out.symlink_to(target)
        elif kind == "dangling":
            out.symlink_to(out.with_name(out.name + ".nowhere"))
        elif kind == "loop":
            out.symlink_to(out.name)

    return prepare


OUT_CASES = [
    Hostile("out-link-empty-folder", "out-link", _plain, 0, commands=WRITERS, out=_out_link("empty-folder")),
    Hostile("out-link-full-folder", "out-link", _plain, 2, commands=WRITERS, out=_out_link("full-folder"),
            names=("not empty",)),
    Hostile("out-link-file", "out-link", _plain, 2, commands=WRITERS, out=_out_link("file"),
            names=("existing file",)),
    Hostile("out-link-dangling", "out-link", _plain, 6, commands=WRITERS, out=_out_link("dangling"),
            names=("--out", "symbolic link", ".nowhere")),
    Hostile("out-link-loop", "out-link", _plain, 6, commands=WRITERS, out=_out_link("loop"),
            names=("--out", "symbolic link loop")),
]  # fmt: skip


# ------------------------------------------------------------------------------------------------ rank-
def _rank_st(name: str, shape: list[int]):
    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.ST_ONE, dest / "ckpt")
        f = ckpt / av.ST_ONE_FILE
        ts = av.st_tensors(f)
        dt, _, data = ts[name]
        ts[name] = (
            dt,
            shape,
            (data * (math.prod(shape) * 4 // max(1, len(data)) + 1))[: math.prod(shape) * 4],
        )
        av.st_write_tensors(f, ts, {"format": "pt"})
        return ckpt

    return build


def _rank_pd(name: str, shape: list[int]):
    def build(dest: Path) -> Path:
        ckpt = av.copy_case(av.PD_ONE, dest / "ckpt")
        state = av.pd_state()
        a = np.ascontiguousarray(state[name]).tobytes()
        n = math.prod(shape) * 4
        state[name] = av.FakeArray(shape, np.dtype("float32"), (a * (n // max(1, len(a)) + 1))[:n])
        av.pd_dump(state, ckpt / av.PD_FILE)
        return ckpt

    return build


RANKS = {"0d": [], "1d": [1600], "3d": [100, 16, 1], "40d": [1] * 38 + [100, 16]}
# a flat embedding: every command refuses it by name (exit 3); rank 40: numpy holds 32 axes, exit 3 for any
# tensor; a flat head: inspect shows it as a problem (0), tie/untie/resize refuse (5), convert's shape check
# says the config wants [V, H] (3), verify of the folder against itself passes (0)
HEAD_FLAT = {"inspect": 0, "verify": 0, "convert": 3, "*": 5}
RANK_CASES = []
for fmt, make, emb in (
    ("st", _rank_st, "model.embed_tokens.weight"),
    ("pd", _rank_pd, "llama.embed_tokens.weight"),
):
    for tag, shape in RANKS.items():
        RANK_CASES.append(Hostile(f"rank-{fmt}-embedding-{tag}", "rank", make(emb, shape), 3, names=(emb,)))
        RANK_CASES.append(
            Hostile(
                f"rank-{fmt}-head-{tag}",
                "rank",
                make("lm_head.weight", shape),
                3 if tag == "40d" else HEAD_FLAT,
                names=("lm_head.weight",),
            )
        )

CASES = LINK_CASES + OUT_CASES + RANK_CASES
