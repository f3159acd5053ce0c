"""``tietool resize`` moves every vocabulary-size config key (issue 10): at any nesting, in config.json and
model_config.json, the keys named ``vocab_size``, ``padded_vocab_size``, ``decoder_vocab_size``, ...
whose value counted the embedding's rows; a key of another value (a second vocabulary) stays. ``verify``
(which names a key left at the old size) then exits 0.

The tool runs as ``python -m tietool`` in a subprocess on a copy of a fixture with an edited config; outputs
are read as plain JSON (nothing here imports ``tietool``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import resize_support as rs

FIX = rs.Fixture("pf_llama_untied_fp32")
OTHER = 7  # a vocabulary of its own (neither the embedding's nor the head's rows)


def _with_keys(dst: Path) -> Path:
    """A copy of the fixture whose configs carry vocabulary sizes in every place a config may."""
    src = rs.copy_checkpoint(FIX.src, dst)
    V, H = FIX.V, FIX.H

    def edit(cfg: dict) -> None:
        cfg["text_config"] = {"model_type": "llama", "vocab_size": V, "hidden_size": H}
        cfg["decoder_vocab_size"] = V
        cfg["llm_config"] = {"model_type": "llama", "vocab_size": V, "nested": {"padded_vocab_size": V}}
        cfg["speech_config"] = {"vocab_size": OTHER}

    rs.edit_json(src / "config.json", edit)
    model_config = {
        "init_args": [{"vocab_size": V, "hidden_size": H, "init_args": [{"vocab_size": V}]}],
        "init_class": "LlamaForCausalLM",
    }
    (src / "model_config.json").write_text(json.dumps(model_config))
    return src


@pytest.fixture(scope="module")
def resized(tmp_path_factory) -> tuple[rs.Run, int]:
    work = tmp_path_factory.mktemp("vocab-keys")
    n = FIX.V + 12
    run = rs.run_resize(_with_keys(work / "src"), work / "run", ["--vocab", n, "--init", "zeros"])
    return run.ok(), n


def test_every_vocab_size_key_follows(resized):
    """text_config.vocab_size, decoder_vocab_size, llm_config.vocab_size (and a padded_vocab_size nested
    below it), model_config.json init_args (two levels) and the top-level vocab_size all become N."""
    run, n = resized
    cfg = run.config()
    mc = json.loads((run.out / "model_config.json").read_text())
    got = {
        "vocab_size": cfg["vocab_size"],
        "text_config.vocab_size": cfg["text_config"]["vocab_size"],
        "decoder_vocab_size": cfg["decoder_vocab_size"],
        "llm_config.vocab_size": cfg["llm_config"]["vocab_size"],
        "llm_config.nested.padded_vocab_size": cfg["llm_config"]["nested"]["padded_vocab_size"],
        "model_config.init_args.0.vocab_size": mc["init_args"][0]["vocab_size"],
        "model_config.init_args.0.init_args.0.vocab_size": mc["init_args"][0]["init_args"][0]["vocab_size"],
    }
    assert got == dict.fromkeys(got, n), f"expected {n} everywhere: {got}"
    assert run.ckpt().tensors[FIX.embedding].shape[0] == n


def test_other_vocabulary_stays_and_nothing_else_changes(resized):
    """A vocab_size of another value (a second vocabulary) is left as it was, without a word about it;
    every config key that is not a vocabulary size is unchanged."""
    run, _ = resized
    cfg_in = json.loads((run.inp / "config.json").read_text())
    cfg = run.config()
    assert cfg["speech_config"] == {"vocab_size": OTHER}
    assert "speech_config" not in run.stdout + run.stderr
    for k in cfg_in.keys() - {"vocab_size", "text_config", "decoder_vocab_size", "llm_config"}:
        assert cfg[k] == cfg_in[k], k
    assert cfg["text_config"]["hidden_size"] == FIX.H and cfg["llm_config"]["model_type"] == "llama"


def test_verify_explains_the_resize(resized):
    """``verify`` (which names a vocabulary-size key left at the old size) exits 0 on input and output."""
    run, _ = resized
    cp = rs.run_cli(["verify", str(run.inp), str(run.out)])
    assert cp.returncode == 0, cp.stdout + cp.stderr


def test_verify_names_a_key_left_behind(resized, tmp_path):
    """The check above can fail: the output with decoder_vocab_size put back to the old size is unexplained
    (exit 7) and the message names the key."""
    run, _ = resized
    out = rs.copy_checkpoint(run.out, tmp_path / "stale")
    rs.edit_json(out / "config.json", lambda c: c.__setitem__("decoder_vocab_size", FIX.V))
    cp = rs.run_cli(["verify", str(run.inp), str(out)])
    assert cp.returncode == 7 and "decoder_vocab_size" in cp.stdout + cp.stderr, cp.stdout + cp.stderr
