"""HF transformers loads what ``prune`` and ``fix-untrained`` write, with the logits of the model they stand
for (``AutoModelForCausalLM.from_pretrained(folder, dtype=float32)``, torch CPU, transformers 5.3, in the venv
of ``tests/tools/hf_venv.sh``: ``$HF_PYTHON``; :mod:`support.hf_logits`, one subprocess for every folder).

* ``prune`` of the shipped sample ``pf_llama_with_tokenizer`` (PaddleFormers 1.2, HF layout, untied) to the
  ids of the corpus lines and the fixed batch (their BPE closure, the 256 byte tokens and the added tokens:
  ids 1..39 of the batch keep their numbers): the pruned model's logits on the batch are the old logits at
  the kept columns.
* ``fix-untrained`` (``trained-mean`` and ``subtokens``) of e04 (a Llama-3-style base written by
  PaddleFormers 1.2, bf16, rows 264..269 all zero): the batch (ids 1..39, all trained) gives the input's
  logits at every column but the fixed ones, bit for bit; the fixed columns are finite and no longer the
  input's.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from support import cli_runner, hf_logits, paths
from support.fixture_support import logits_mismatch

pytestmark = pytest.mark.slow

SAMPLE = paths.REPO / "sample_checkpoints" / "pf_llama_with_tokenizer"
E04 = paths.BUG_CASES_DIR / "e04_llama3_base_untrained_chat_tokens" / "ckpt"
TOK = paths.DATA / "tokenizers"


def _keep() -> list[int]:
    """The sample's keep-list: what ``--keep-corpus`` keeps for the corpus lines, plus the batch's ids."""
    from tietool.surgery.io.tokenizer_prune import alphabet_ids, corpus_ids

    lines = [ln for ln in (TOK / "corpus.txt").read_text(encoding="utf-8").splitlines() if ln.strip()][:12]
    batch = set(np.load(paths.INPUT_IDS).ravel().tolist())
    return sorted(
        set(corpus_ids(SAMPLE, "\n".join(lines))) | batch | set(alphabet_ids(SAMPLE)) | {300, 301, 302, 303}
    )


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict:
    python = hf_logits.python()
    why = hf_logits.available(python) if python else "HF_PYTHON is not set (source tests/tools/hf_venv.sh)"
    if why:
        if os.environ.get("TIETOOL_REQUIRE_HF"):
            pytest.fail(f"TIETOOL_REQUIRE_HF is set but the HF venv is unusable: {why}")
        pytest.skip(f"no HF transformers venv: {why}")
    assert python is not None
    root = tmp_path_factory.mktemp("hf-vocab")
    keep = _keep()
    (root / "keep.json").write_text(json.dumps(keep))
    outs = {
        "pruned": ["prune", str(SAMPLE), "--keep-ids", str(root / "keep.json")],
        "trained-mean": ["fix-untrained", str(E04), "--init", "trained-mean"],
        "subtokens": ["fix-untrained", str(E04), "--init", "subtokens"],
    }
    for name, argv in outs.items():
        run = cli_runner.run_cli([*argv, "--out", str(root / name), "--json"])
        assert run.rc == 0, run.stderr
    folders = [SAMPLE, E04, *(root / n for n in outs)]
    res = hf_logits.run(folders, root / "logits", python)
    for f, r in res.items():
        assert r["ok"] and not r["mismatched"], (f, r["error"], r["mismatched"])
    return {"keep": keep, "root": root, "res": res}


def test_hf_pruned_logits_are_the_old_at_the_kept_ids(loaded):
    keep, root, res = loaded["keep"], loaded["root"], loaded["res"]
    assert set(np.load(paths.INPUT_IDS).ravel().tolist()) <= set(keep[:256])  # the batch keeps its numbers
    old, new = res[SAMPLE]["logits"], res[root / "pruned"]["logits"]
    assert new.shape[-1] == len(keep) < old.shape[-1]
    assert logits_mismatch(new, old[..., keep]) is None


@pytest.mark.parametrize("init", ["trained-mean", "subtokens"])
def test_hf_fix_untrained_keeps_the_logits_of_trained_tokens(loaded, init):
    root, res = loaded["root"], loaded["res"]
    rep = json.loads((root / init / "tietool-report.json").read_text())["fix_untrained"]
    fixed = rep["ids"]
    assert fixed == [264, 265, 266, 267, 268, 269]
    assert all(t["init"] == init for t in rep["tokens"])
    old, new = res[E04]["logits"], res[root / init]["logits"]
    other = np.setdiff1d(np.arange(old.shape[-1]), fixed)
    assert logits_mismatch(new[..., other], old[..., other]) is None
    assert np.isfinite(new[..., fixed]).all()
    assert not np.array_equal(new[..., fixed], old[..., fixed])
