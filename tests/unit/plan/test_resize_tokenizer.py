"""``resize --vocab N --force`` keeps the tokenizer in step (issue 20): a trim below tokens the tokenizer has
removes the added tokens at ids >= N from every tokenizer file, and refuses (even with ``--force``) where
base-vocabulary tokens would be cut or the files cannot be edited, so a tokenizer emitting ids beyond the
rows is never left. Judged with HF transformers' ``AutoTokenizer`` on the output (the loader's count) and the
rows' bytes.

The tokenizer is ``tests/data/tokenizers/bytelevel_bpe`` (300 base tokens + 4 added: ``<|endoftext|>`` 300,
``<|im_start|>`` 301, ``<|im_end|>`` 302, ``<think>`` 303), beside a hand-written Llama checkpoint of 304
rows (the rows' values do not matter here: only that they are kept or cut).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from support import resize_support as rs
from support import tokmodel_support as ts

if importlib.util.find_spec("tietool.surgery.io.tokenizer_edit") is None:
    pytest.skip("surgery/io/tokenizer_edit.py (helper tokedit) is not merged yet", allow_module_level=True)
TOK = ts.tokenizer_dir("bytelevel_bpe")
if TOK is None:
    pytest.skip("tests/data/tokenizers (helper tokedit) is not merged yet", allow_module_level=True)

ROWS, H = 304, 8


def _ckpt(folder: Path) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(20)
    folder.mkdir(parents=True)
    t = {
        "model.embed_tokens.weight": rng.normal(size=(ROWS, H)).astype(np.float32),
        "lm_head.weight": rng.normal(size=(ROWS, H)).astype(np.float32),
        "model.norm.weight": np.ones(H, np.float32),
    }
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": ROWS, "hidden_size": H}
    (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    assert TOK is not None
    for f in TOK.iterdir():
        shutil.copy2(f, folder / f.name)
    return folder


def _resize(tmp_path: Path, *extra) -> rs.Run:
    inp = _ckpt(tmp_path / "in")
    return rs.run_on(inp, tmp_path / "out", "resize", [*map(str, extra)])


def _nothing_written(run: rs.Run) -> None:
    assert run.out is not None and not run.out.exists(), f"output written\n{run.describe()}"
    assert run.input_before == run.input_after, "input changed"


@pytest.mark.skipif(
    importlib.util.find_spec("tietool.surgery.plan.add_tokens") is None,
    reason="the writer of Plan.tokenizer comes with add-tokens (helper addplan), not merged yet",
)
def test_trim_removes_added_tokens_with_force(tmp_path):
    """--vocab 302 --force: ``<|im_end|>`` (302) and ``<think>`` (303) leave every tokenizer file; the loader
    counts 302 tokens, no more than the rows; ``<think>`` is no longer one token; rows 0..301 kept."""
    run = _resize(tmp_path, "--vocab", 302, "--force").ok()
    tok = ts.hf_tokenizer(run.out)
    assert len(tok) == 302, f"the output's tokenizer has {len(tok)} tokens for 302 rows"
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [301]
    assert len(tok.encode("<think>", add_special_tokens=False)) > 1
    for name in ("tokenizer.json", "tokenizer_config.json"):
        text = (run.out / name).read_text()
        assert "<think>" not in text and "<|im_end|>" not in text, f"{name} still names a removed token"
    ck_in, ck = rs.read(run.inp), run.ckpt()
    for n in ("model.embed_tokens.weight", "lm_head.weight"):
        assert ck.tensors[n].shape == (302, H)
        assert ck.tensors[n].raw == ck_in.tensors[n].raw[: 302 * H * 4]
    removed = {(t["id"], t["content"]) for t in run.report()["resize"]["tokens_removed"]}
    assert removed == {(302, "<|im_end|>"), (303, "<think>")}


def test_trim_keeps_tokenizer_within_rows(tmp_path):
    """--vocab 300 --force cuts every added token, ``<|endoftext|>`` (the eos and pad token) too: refused, or
    done with a tokenizer the loader counts at most 300 tokens in (a special token left named in
    tokenizer_config.json but gone from the vocabulary is added back by the loader at id 300)."""
    run = _resize(tmp_path, "--vocab", 300, "--force")
    if run.rc != 0:
        assert run.rc == 5, run.describe()
        _nothing_written(run)
        return
    assert len(ts.hf_tokenizer(run.out)) <= 300, "the output's tokenizer emits ids beyond its 300 rows"


def test_trim_below_base_vocabulary_refused_even_with_force(tmp_path):
    """--vocab 298 --force would cut base-vocabulary tokens 298 and 299 (pieces of the BPE model, which no
    edit removes): refused naming them, nothing written."""
    run = _resize(tmp_path, "--vocab", 298, "--force")
    assert run.rc == 5, run.describe()
    assert "298" in run.stderr and "--force" in run.stderr, run.describe()
    _nothing_written(run)


def test_trim_without_force_refused_as_before(tmp_path):
    """Without --force the refusal is today's (how many rows, real tokens, pass --force)."""
    run = _resize(tmp_path, "--vocab", 302)
    assert run.rc == 5 and "2 of them are real tokens" in run.stderr and "--force" in run.stderr
    _nothing_written(run)


def test_trim_without_tokenizer_library(tmp_path, monkeypatch):
    """The ``tokenizer`` extra missing (``tokenizers`` and ``sentencepiece`` not importable, in process):
    where the removal needs them, refused with one line naming the extra and nothing written; where it does
    not (tokenizer.json and tokenizer_config.json are JSON), done, and the tokenizer within the rows."""
    if os.environ.get("TIETOOL_TEST_SUBPROCESS") == "1":
        pytest.skip("the libraries are hidden in this process only")
    for lib in ("tokenizers", "sentencepiece"):
        monkeypatch.setitem(sys.modules, lib, None)  # import -> ImportError
    run = _resize(tmp_path, "--vocab", 302, "--force")
    monkeypatch.undo()
    if run.rc != 0:
        assert run.rc == 5 and 'pip install ".[tokenizer]" in the tietool clone' in run.stderr, run.describe()
        _nothing_written(run)
        return
    assert len(ts.hf_tokenizer(run.out)) <= 302


def test_grow_leaves_tokenizer_files_alone(tmp_path):
    """A resize that grows keeps every tokenizer file byte for byte (no edit)."""
    run = _resize(tmp_path, "--vocab", 320).ok()
    for f in TOK.iterdir() if TOK else ():
        assert (run.out / f.name).read_bytes() == f.read_bytes(), f"{f.name} changed"


def test_trim_in_place_edits_tokenizer(tmp_path):
    """In place (no --out, --no-backup): the folder's own tokenizer files are edited with the rows."""
    inp = _ckpt(tmp_path / "in")
    run = rs.run_on(inp, None, "resize", ["--vocab", "302", "--force", "--no-backup"])
    assert run.rc == 0, run.describe()
    assert len(ts.hf_tokenizer(inp)) == 302
    assert rs.read(inp).tensors["model.embed_tokens.weight"].shape == (302, H)


@pytest.mark.parametrize("name", ["sp_unigram", "wordpiece"])
def test_refusal_names_only_base_tokens_after_add_tokens(tmp_path, name):
    """Found by breaking issue 20: after ``add-tokens`` appended its tokens to tokenizer.model / vocab.txt
    (pieces / lines, listed in added_tokens_decoder), a trim one row into the base vocabulary named the added
    tokens as base ones and advised "keep at least <len with the added tokens> rows", though ``--force`` at
    the base size removes them. The refusal names only the base ids and the rows that do work."""
    from tietool.surgery import ops

    tok = ts.tokenizer_dir(name)
    assert tok is not None
    base = len(ts.hf_tokenizer(tok))
    folder = tmp_path / "in"
    _ckpt(folder)
    for f in folder.iterdir():
        if f.name in {p.name for p in TOK.iterdir()}:
            f.unlink()
    for f in tok.iterdir():
        shutil.copy2(f, folder / f.name)
    ops.add_tokens(folder, ["<a1>", "<a2>"], out=tmp_path / "added", seed=0)
    run = rs.run_on(tmp_path / "added", tmp_path / "out", "resize", ["--vocab", str(base - 1), "--force"])
    assert run.rc == 5, run.describe()
    assert f"keep at least {base} rows" in run.stderr and "<a1>" not in run.stderr, run.stderr
    _nothing_written(run)
    ok = rs.run_on(tmp_path / "added", tmp_path / "out2", "resize", ["--vocab", str(base), "--force"]).ok()
    assert [t["content"] for t in ok.report()["resize"]["tokens_removed"]] == ["<a1>", "<a2>"]
