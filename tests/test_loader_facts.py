"""Loader facts checked against PaddleNLP 2.8.1 itself (issue 10): GPT and Bloom always build the head from
the word embedding, so ``untie`` refuses under that loader; where a loader logs a harmless "newly
initialized" warning for a head that ``tie`` dropped, tie's output says so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tietool.surgery.architectures import lookup

FIX = Path(__file__).resolve().parent / "data" / "fixtures" / "cases"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tietool", *args], capture_output=True, text=True, timeout=120
    )


def _tree(p: Path) -> dict[str, bytes]:
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}


def test_table_rows():
    for model_type in ("gpt", "bloom"):
        for loader in ("paddlenlp-2.8", "paddlenlp-3"):
            assert lookup(model_type, loader).always_tied
        assert not lookup(model_type, "paddleformers").always_tied
    assert lookup("gpt", "paddlenlp-2.8").warns_missing_head
    assert lookup("bert", "paddlenlp-2.8").warns_missing_head
    assert not lookup("bert", "paddlenlp-2.8").always_tied  # a different head in the file is used (L15)
    assert not lookup("llama", "paddlenlp-2.8").warns_missing_head


def test_untie_pnlp_gpt_refused_naming_loader(tmp_path):
    ckpt = tmp_path / "gpt"
    shutil.copytree(FIX / "pnlp_gpt", ckpt)
    before = _tree(ckpt)
    r = _cli("untie", str(ckpt), "--out", str(tmp_path / "out"))
    assert r.returncode == 5, r.stderr
    assert "paddlenlp-2.8" in r.stderr and "always" in r.stderr and "--loader" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and _tree(ckpt) == before
    r = _cli("untie", str(ckpt), "--out", str(tmp_path / "out_hf"), "--loader", "hf", "-q")
    assert r.returncode == 0, r.stderr


def test_untie_bloom_refused(tmp_path):
    ckpt = tmp_path / "bloom"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "bloom", "vocab_size": 16, "hidden_size": 8}))
    emb = np.arange(128, dtype=np.float32).reshape(16, 8)
    save_file(
        {"bloom.word_embeddings.weight": emb, "bloom.ln_f.weight": np.ones(8, np.float32)},
        str(ckpt / "model.safetensors"),
    )
    r = _cli("untie", str(ckpt), "--out", str(tmp_path / "out"))
    assert r.returncode == 5, r.stderr
    assert "bloom" in r.stderr and "always" in r.stderr
    assert not (tmp_path / "out").exists()


def test_tie_says_the_newly_initialized_warning_is_harmless(tmp_path):
    for case, head in (("pnlp_gpt", "lm_head.weight"), ("pnlp_bert_mlm", "cls.predictions.decoder.weight")):
        ckpt = tmp_path / case
        shutil.copytree(FIX / case, ckpt)
        r = _cli("tie", str(ckpt), "--out", str(tmp_path / f"{case}_tied"), "-q")
        assert r.returncode == 0, r.stderr
        assert "newly initialized" in r.stdout and "harmless" in r.stdout and head in r.stdout
        rep = json.loads((tmp_path / f"{case}_tied" / "tietool-report.json").read_text())
        assert any("newly initialized" in n for n in rep["notes"])
    ckpt = tmp_path / "llama"
    shutil.copytree(FIX / "pf_llama_tied_fp32", ckpt)
    r = _cli("tie", str(ckpt), "--out", str(tmp_path / "llama_tied"), "-q")
    assert r.returncode == 0 and "newly initialized" not in r.stdout
