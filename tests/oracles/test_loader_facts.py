"""Loader facts checked against PaddleNLP 2.8.1 itself (issue 10): GPT and Bloom always build the head from
the word embedding, so ``untie`` refuses under that loader; where a loader logs a harmless "newly
initialized" warning for a head that ``tie`` dropped, tie's output says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import cli_runner, loader_table, paths

from tietool.surgery import arch
from tietool.surgery.arch import lookup

FIX = paths.CASES_DIR
ROOT = paths.REPO


def _cli(*args: str) -> cli_runner.CliRun:
    return cli_runner.run_cli(args, cwd=os.getcwd(), timeout=120)


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


def _proven(model_type: str, loader: str = "paddlenlp-2.8", container: str = "pdparams") -> bool:
    """The PaddleNLP facts these tests exercise are proven by the PaddleNLP tests (``_PNLP_PROOFS``); until
    they are, tietool takes the safe default, which these tests then assert instead."""
    return lookup(model_type, loader, container).trusted


def test_untie_pnlp_gpt_refused_naming_loader(tmp_path):
    ckpt = tmp_path / "gpt"
    shutil.copytree(FIX / "pnlp_gpt", ckpt)
    before = _tree(ckpt)
    r = _cli("untie", str(ckpt), "--out", str(tmp_path / "out"))
    if not _proven("gpt"):  # unproven "always tied": untie does not refuse (an ignored head does no harm)
        assert r.returncode == 0 and "unproven" in r.stdout, r.stdout + r.stderr
        assert _tree(ckpt) == before
        return
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
    if _proven("bloom", "paddlenlp-3", "safetensors"):  # llama-style names, no version: PaddleNLP 3
        assert "bloom" in r.stderr and "always" in r.stderr
    else:  # the head it would write needs a layout, which is a loader fact too
        assert "unproven" in r.stderr and "--layout" in r.stderr
    assert not (tmp_path / "out").exists()


def test_tie_says_the_newly_initialized_warning_is_harmless(tmp_path):
    for case, head in (("pnlp_gpt", "lm_head.weight"), ("pnlp_bert_mlm", "cls.predictions.decoder.weight")):
        ckpt = tmp_path / case
        shutil.copytree(FIX / case, ckpt)
        r = _cli("tie", str(ckpt), "--out", str(tmp_path / f"{case}_tied"), "-q")
        assert r.returncode == 0, r.stderr
        if not _proven(case.split("_")[1]):  # unproven re-tie: the head is kept, nothing to warn about
            rep = json.loads((tmp_path / f"{case}_tied" / "tietool-report.json").read_text())
            assert rep["dropped"] == [] and "unproven" in r.stderr
            continue
        # -q: the result line on stdout, the notes on stderr
        assert "newly initialized" in r.stderr and "harmless" in r.stderr and head in r.stderr
        rep = json.loads((tmp_path / f"{case}_tied" / "tietool-report.json").read_text())
        assert any("newly initialized" in n for n in rep["notes"])
    ckpt = tmp_path / "llama"
    shutil.copytree(FIX / "pf_llama_tied_fp32", ckpt)
    r = _cli("tie", str(ckpt), "--out", str(tmp_path / "llama_tied"), "-q")
    assert r.returncode == 0 and "newly initialized" not in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------------ proofs
def test_proofs_are_typed_data():
    """PROOFS is read-only data: (model type, loader, container) keys of LOADERS / CONTAINERS, node ids as
    values; Family.proven is exactly "the triple is in PROOFS"."""
    with pytest.raises(TypeError):
        arch.PROOFS[arch.ProofKey("llama", "paddleformers", "safetensors")] = "x"  # type: ignore[index]
    for key, node in arch.PROOFS.items():
        assert (
            isinstance(key, arch.ProofKey) and key.loader in arch.LOADERS and key.container in arch.CONTAINERS
        )
        assert node.startswith("tests/") and "/test_" in node and "::" in node, node
        fam = lookup(key.model_type, key.loader, key.container)
        assert fam.known, f"{key}: the model type has no row of its own"
        assert fam.proven and fam.proof == node
    assert not lookup("llama", "paddleformers", None).proven  # a proof is per container
    assert not lookup("no-such-model", "paddleformers", "safetensors").proven


def test_proofs_name_existing_tests():
    """Every node id in PROOFS names a test pytest collects (so a renamed or removed test fails here)."""
    nodes = sorted(set(arch.PROOFS.values()))
    if not nodes:
        pytest.skip("no proofs")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *nodes],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    collected = set(r.stdout.split())
    missing = [n for n in nodes if n not in collected]
    assert r.returncode == 0 and not missing, (
        f"not collected: {missing}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
    )


def test_readme_loader_table_matches_architecture_table():
    """README's compact loader table (a row per loader) is the one support/loader_table.py generates from the
    architecture table (regenerate: python tests/support/loader_table.py README.md); the full table is
    docs/design/loader-facts.md's (tests/structure/test_docs_generated.py)."""
    begin, end = loader_table.SUMMARY_BEGIN, loader_table.SUMMARY_END
    block = loader_table.readme_block((ROOT / "README.md").read_text(), begin, end)
    assert block is not None, f"README.md has no {begin} ... {end} block"
    assert block == loader_table.summary().strip(), "README's loader table is stale: regenerate it"
    # every proven model type is in it, under each loader that proved it
    for key in loader_table.arch.PROOFS:
        row = next(r for r in block.splitlines() if r.startswith(f"| {key.loader} |"))
        assert f" {key.model_type}," in row or f" {key.model_type} |" in row, (key, row)


def _tied_llama(tmp: Path, model_type: str, head: bool) -> Path:
    """A tiny tied PaddleFormers-named checkpoint of ``model_type`` (head equal to the embedding, or none)."""
    ckpt = tmp / f"{model_type}-{head}"
    ckpt.mkdir()
    cfg = {"model_type": model_type, "vocab_size": 16, "hidden_size": 8, "tie_word_embeddings": True}
    (ckpt / "config.json").write_text(json.dumps({**cfg, "paddleformers_version": "1.2.0"}))
    emb = np.arange(128, dtype=np.float32).reshape(16, 8)
    t = {"model.embed_tokens.weight": emb, "model.norm.weight": np.ones(8, np.float32)}
    if head:
        t["lm_head.weight"] = emb.copy()
    save_file(t, str(ckpt / "model.safetensors"))
    return ckpt


def test_unproven_tie_keeps_the_head_and_says_so(tmp_path):
    """A model type whose loader facts are unproven (here internlm2, in the Llama row whose facts say
    "re-ties"): tie keeps the head (equal to the embedding) and sets the flag; the output and the report
    say the fact is unproven and name --loader. Under a proven model type the head is dropped."""
    assert not lookup("internlm2", "paddleformers", "safetensors").proven
    for mt, dropped in (("internlm2", False), ("llama", True)):
        ckpt = _tied_llama(tmp_path, mt, head=True)
        out = tmp_path / f"{mt}-tied"
        r = _cli("tie", str(ckpt), "--out", str(out))
        assert r.returncode == 0, r.stderr
        rep = json.loads((out / "tietool-report.json").read_text())
        assert [d["name"] for d in rep["dropped"]] == (["lm_head.weight"] if dropped else [])
        assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
        kinds = [f["kind"] for f in rep["findings"]]
        assert rep["loader"]["proven"] is dropped
        if dropped:
            assert "loader-facts-unproven" not in kinds
            continue
        assert "loader-facts-unproven" in kinds and "unproven" in r.stdout and "--loader" in r.stdout
        assert any("unproven" in n and "--loader" in n for n in rep["notes"])


def test_model_type_the_table_lacks_keeps_the_head_under_every_loader(tmp_path):
    """A model type with no row (the fallback row's facts say "re-ties") is unproven under every loader, the
    ones whose other rows are used as stated (hf, paddlenlp-3) included: tie keeps the head, sets the flag
    and names --loader; a known model type under hf (HF transformers' re-tie, proven for llama by
    tests/oracles/test_hf_loader.py) drops it."""
    for loader in ("hf", "paddlenlp-3", "paddleformers"):
        assert not lookup("my_new_lm", loader, "safetensors").trusted
    assert lookup("llama", "hf", "safetensors").proven
    for mt, dropped in (("my_new_lm", False), ("llama", True)):
        ckpt = _tied_llama(tmp_path, mt, head=True)
        cfg = json.loads((ckpt / "config.json").read_text())
        del cfg["paddleformers_version"]  # no library's version key: the loader is told from the names (hf)
        (ckpt / "config.json").write_text(json.dumps(cfg))
        out = tmp_path / f"{mt}-hf-tied"
        r = _cli("tie", str(ckpt), "--out", str(out), "--loader", "hf")
        assert r.returncode == 0, r.stderr
        rep = json.loads((out / "tietool-report.json").read_text())
        assert [d["name"] for d in rep["dropped"]] == (["lm_head.weight"] if dropped else []), rep["dropped"]
        assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
        if not dropped:
            assert "unproven" in r.stdout and "--loader" in r.stdout, r.stdout


def test_unproven_resize_resizes_the_duplicate_head(tmp_path):
    ckpt = _tied_llama(tmp_path, "internlm2", head=True)
    out = tmp_path / "resized"
    r = _cli("resize", str(ckpt), "--vocab", "24", "--out", str(out), "--seed", "0")
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "tietool-report.json").read_text())
    assert rep["dropped"] == [] and "unproven" in r.stdout
    assert {x["name"] for x in rep["resized"]} >= {"lm_head.weight", "model.embed_tokens.weight"}


def test_unproven_untie_writes_the_head_only_with_a_layout(tmp_path):
    """untie of a tied checkpoint without a head under an unproven loader: the head layout is a loader
    fact, so it is refused naming --layout; with --layout it writes it."""
    ckpt = _tied_llama(tmp_path, "internlm2", head=False)
    r = _cli("untie", str(ckpt), "--out", str(tmp_path / "u"))
    assert r.returncode == 5 and "--layout" in r.stderr and "unproven" in r.stderr, r.stderr
    assert not (tmp_path / "u").exists()
    r = _cli("untie", str(ckpt), "--out", str(tmp_path / "u2"), "--layout", "vocab-hidden", "-q")
    assert r.returncode == 0, r.stderr
    ckpt = _tied_llama(tmp_path, "llama", head=False)
    r = _cli("untie", str(ckpt), "--out", str(tmp_path / "u3"), "-q")
    assert r.returncode == 0, r.stderr


def test_every_write_names_a_head_the_loader_builds_at_random(tmp_path):
    """An untied Gemma 3 checkpoint without ``lm_head`` (what PaddleFormers 1.2 exports: it always ties
    Gemma 3 and writes no head; HF transformers then loads a random head, tests/oracles/test_hf_loader.py):
    every write that leaves the flag false and the head missing says so on the terminal and in the report's
    warnings -- resize and add-tokens under ``--loader hf``, convert to the HF layout; not
    under PaddleFormers (which always ties it, proven), nor tie (sets the flag) or untie (writes the
    head)."""
    ckpt = _tied_llama(tmp_path, "gemma3_text", head=False)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    vocab = {f"t{i}": i for i in range(16)}  # a tokenizer of the embedding's 16 rows, for add-tokens
    model = {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    tok = {"version": "1.0", "added_tokens": [], "model": model, "pre_tokenizer": {"type": "Whitespace"}}
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    runs = {
        "add-tokens-hf": (["add-tokens", "CKPT", "newtok", "--seed", "0", "--loader", "hf"], True),
        "add-tokens": (["add-tokens", "CKPT", "newtok", "--seed", "0"], False),
        "resize-hf": (["resize", "--vocab", "24", "--seed", "0", "--loader", "hf"], True),
        "resize": (["resize", "--vocab", "24", "--seed", "0"], False),
        "convert": (["convert", "--to", "safetensors"], True),
        "tie-hf": (["tie", "--loader", "hf"], False),
        "untie-hf": (["untie", "--loader", "hf"], False),
    }
    for op, (argv, warned) in runs.items():
        out = tmp_path / op
        args = [str(ckpt) if a == "CKPT" else a for a in argv] + ([] if "CKPT" in argv else [str(ckpt)])
        r = _cli(*args, "--out", str(out))
        assert r.returncode == 0, f"{op}: {r.stderr}"
        said = " ".join(r.stdout.split())
        rep = json.loads((out / "tietool-report.json").read_text())
        named = [w for w in rep["warnings"] if "random head" in w and "lm_head.weight" in w]
        assert bool(named) is warned, f"{op}: {rep['warnings']}"
        assert ("random head" in said and "untie" in said) is warned, f"{op}: {r.stdout}"
