"""One parse of a JSON file per planned run (surgery/io/regular.py ``parsed_once``):
``load_json(shared=True)`` hands back the value an earlier call parsed from the same bytes, only within the
block and only for the same bytes; ``tokenizer_set`` is read once per folder and state of its files;
prune's tokenizer edit, which edits what it parsed, leaves the shared value as it was (the same files twice
in one block, and the shared value equal to a fresh parse afterwards)."""

from __future__ import annotations

import json
import os
import shutil

from support.paths import DATA

from tietool.surgery.io.regular import load_json, parsed_once
from tietool.surgery.io.tokenizer import tokenizer_set
from tietool.surgery.io.tokenizer_prune import prune_tokenizer_edit

TOK = DATA / "tokenizers"


def test_shared_within_the_block_only(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('{"x": [1, 2]}')
    assert load_json(p, shared=True) is not load_json(p, shared=True)  # no block: parsed each time
    with parsed_once():
        a = load_json(p, shared=True)
        assert load_json(p, shared=True) is a
        assert load_json(p) is not a and load_json(p) == a  # not shared: a value of its own
        p.write_text('{"x": [1, 3]}')  # other bytes: parsed again
        assert load_json(p, shared=True) == {"x": [1, 3]}
    with parsed_once():
        assert load_json(p, shared=True) is not a


def test_tokenizer_set_once_per_state_of_the_files(tmp_path):
    folder = shutil.copytree(TOK / "bytelevel_bpe", tmp_path / "tok")
    with parsed_once():
        ts = tokenizer_set(folder)
        assert tokenizer_set(folder) is ts
        cfg = folder / "tokenizer_config.json"
        data = json.loads(cfg.read_text())
        data["added_tokens_decoder"] = {}
        cfg.write_text(json.dumps(data, indent=2))
        st = cfg.stat()
        os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        again = tokenizer_set(folder)
        assert again is not ts and again.disagreements != ts.disagreements


def test_prune_leaves_the_shared_value_as_parsed(tmp_path):
    folder = shutil.copytree(TOK / "bytelevel_bpe", tmp_path / "tok")
    fresh = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    keep = sorted(set(range(256)) | {a["id"] for a in fresh["added_tokens"]})
    outside = prune_tokenizer_edit(folder, keep)
    with parsed_once():
        shared = load_json(folder / "tokenizer.json", shared=True)
        first = prune_tokenizer_edit(folder, keep)
        second = prune_tokenizer_edit(folder, keep)
        assert load_json(folder / "tokenizer.json", shared=True) is shared
    assert shared == fresh
    assert first is not None and second is not None and outside is not None
    assert first.files == second.files == outside.files
    assert json.loads(first.files["tokenizer.json"])["model"]["vocab"] != fresh["model"]["vocab"]
