"""Issue 4 mechanisms (not timed): untouched shards are copied byte for byte or hard-linked, inspect reads
no tensor data but the embedding's and the head's, a .pdparams structure is read without its payloads, and
--help / safetensors paths import no paddle."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT.parent / "shared" / "fixtures" / "cases"
pytestmark = pytest.mark.skipif(not FIX.is_dir(), reason="../shared/fixtures not found")

sys.path.insert(0, str(ROOT))

from surgery.checkpoint import Checkpoint  # noqa: E402
from surgery.detect import detect  # noqa: E402
from surgery.plan import plan_tie  # noqa: E402
from surgery.write import execute  # noqa: E402


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def run_cli(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("link", [False, True])
def test_untouched_shards_are_copied_or_linked(tmp_path, link):
    src = tmp_path / "in"
    shutil.copytree(FIX / "pf_llama_tied_sharded", src)
    ck = Checkpoint.open(src)
    head_file = ck.tensors["lm_head.weight"].file
    # the head sits alone in its shard: tie removes that shard and rewrites nothing
    assert [n for n, t in ck.tensors.items() if t.file == head_file] == ["lm_head.weight"]
    out = tmp_path / "out"
    rep = execute(plan_tie(detect(ck)), out, link=link)
    assert rep["files"]["rewritten"] == []
    assert rep["files"]["removed"] == [head_file]
    out_ck = Checkpoint.open(out)
    assert "lm_head.weight" not in out_ck.tensors
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == ck.total_bytes - ck.tensors["lm_head.weight"].nbytes
    # every remaining shard holds exactly the bytes of an input shard (renumbered), same inode with --link
    in_by_hash = {sha(src / f): src / f for f in ck.weight_files}
    for f in out_ck.weight_files:
        h = sha(out / f)
        assert h in in_by_hash, f"{f} is not a byte copy of an input shard"
        if link:
            assert os.stat(out / f).st_ino == os.stat(in_by_hash[h]).st_ino
        else:
            assert os.stat(out / f).st_ino != os.stat(in_by_hash[h]).st_ino
    assert rep["files"]["linked" if link else "copied"] and not rep["files"]["copied" if link else "linked"]


def test_untie_of_a_sharded_checkpoint_adds_a_shard_and_rewrites_none(tmp_path):
    src = tmp_path / "in"
    shutil.copytree(FIX / "pf_llama_tied_sharded", src)
    tied = tmp_path / "tied"
    assert run_cli("tie", src, "--out", tied).returncode == 0
    untied = tmp_path / "untied"
    r = run_cli("untie", tied, "--out", untied, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["files"]["rewritten"] == [] and len(rep["files"]["written"]) == 1
    new = Checkpoint.open(untied)
    assert [n for n, t in new.tensors.items() if t.file == rep["files"]["written"][0]] == ["lm_head.weight"]
    assert new.load("lm_head.weight").tobytes() == new.load("model.embed_tokens.weight").tobytes()
    # every other shard is a byte copy of a shard of the tied input
    old = Checkpoint.open(tied)
    old_hashes = {sha(tied / f) for f in old.weight_files}
    for f in new.weight_files:
        if f not in rep["files"]["written"]:
            assert sha(untied / f) in old_hashes


class _Tracker:
    """Wraps ``open`` in the format modules and records every (file, offset, length) read."""

    def __init__(self):
        self.reads: list[tuple[str, int, int]] = []

    def open(self, path, mode="r", *a, **k):
        f = open(path, mode, *a, **k)
        reads = self.reads
        name = os.path.basename(str(path))

        class F:
            def __init__(self, f):
                self._f = f

            def readinto(self, b):
                pos = self._f.tell()
                n = self._f.readinto(b)
                reads.append((name, pos, n))
                return n

            def read(self, n=-1):
                pos = self._f.tell()
                b = self._f.read(n)
                reads.append((name, pos, len(b)))
                return b

            def readline(self):
                pos = self._f.tell()
                b = self._f.readline()
                reads.append((name, pos, len(b)))
                return b

            def __getattr__(self, a):
                return getattr(self._f, a)

            def __enter__(self):
                return self

            def __exit__(self, *e):
                self._f.close()

        return F(f)


def _overlaps(reads, file, start, n):
    return [r for r in reads if r[0] == file and r[1] < start + n and start < r[1] + r[2]]


@pytest.mark.parametrize("case", ["pf_llama_tied_sharded", "pf_llama_untied_fp32"])
def test_inspect_reads_no_untouched_tensor_data(monkeypatch, case):
    from surgery import checkpoint
    from surgery.formats import pdparams_io, safetensors_io

    tr = _Tracker()
    for mod in (safetensors_io, pdparams_io, checkpoint):
        monkeypatch.setattr(mod, "open", tr.open, raising=False)
    ck = Checkpoint.open(FIX / case)
    det = detect(ck)
    assert det.comparison.values in ("exact", "different")  # the values were compared
    touched = {det.embedding, det.head}
    for name, t in ck.tensors.items():
        hits = _overlaps(tr.reads, t.file, t.offset, t.nbytes)
        if name in touched:
            assert hits, f"{name} should have been read to compare values"
        else:
            assert not hits, f"inspect read data of untouched tensor {name}: {hits}"


def test_pdparams_structure_is_read_without_payloads(tmp_path, monkeypatch):
    from surgery.formats import pdparams_io

    ck_dir = tmp_path / "ck"
    ck_dir.mkdir()
    (ck_dir / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 512, "hidden_size": 64,
                                                    "tie_word_embeddings": False}))
    rng = np.random.default_rng(0)
    sd = {"llama.embed_tokens.weight": rng.standard_normal((512, 64)).astype(np.float32),
          "lm_head.weight": rng.standard_normal((64, 512)).astype(np.float32)}
    for i in range(8):
        sd[f"llama.layers.{i}.mlp.weight"] = rng.standard_normal((256, 256)).astype(np.float32)
    with open(ck_dir / "model_state.pdparams", "wb") as f:
        pickle.dump(sd, f, protocol=4)
    size = (ck_dir / "model_state.pdparams").stat().st_size
    tr = _Tracker()
    monkeypatch.setattr(pdparams_io, "open", tr.open, raising=False)
    ck = Checkpoint.open(ck_dir)
    read = sum(r[2] for r in tr.reads)
    assert read < 4096 < size, f"walking the pickle read {read} of {size} bytes"
    # and the arrays it locates are the real ones
    for name, arr in sd.items():
        assert ck.load(name).tobytes() == arr.tobytes()


def _imports_after(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def test_help_imports_neither_paddle_nor_numpy():
    mods = _imports_after("from cli.app import app\ntry:\n    app(['--help'])\nexcept SystemExit:\n    pass")
    assert "paddle" not in mods and "numpy" not in mods and "surgery" not in mods


def test_safetensors_paths_import_no_paddle(tmp_path):
    out = tmp_path / "o"
    code = (f"from cli.app import app\nfor args in (['inspect', {str(FIX / 'pf_llama_tied_fp32')!r}], "
            f"['tie', {str(FIX / 'pf_llama_tied_fp32')!r}, '--out', {str(out)!r}]):\n"
            "    try:\n        app(args)\n    except SystemExit as e:\n        assert not e.code, e.code")
    mods = _imports_after(code)
    assert (out / "model-00001-of-00001.safetensors").exists()
    assert "paddle" not in mods
