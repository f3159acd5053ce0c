"""``tietool inspect`` of a Trainer flex checkpoint that has its config: the vocabulary keys of every other
inspection (``embedding``, ``head``, ``head_bias``, ``vocabulary_tensors``, ``tie``, ``vocab``,
``architecture``), detected on the merged view ``resize --keep-training-state`` plans on. The oracle is the
inspection of the same checkpoint merged by ``tietool merge`` (whose outputs the PaddleFormers oracles of
``tests/oracles/test_flex*.py`` load): the tie state, the value comparison and the vocabulary sizes agree
exactly. Inputs: ``sample_checkpoints/pf_llama_trainer`` (untied), ``tests/data/flex/trainer_tied`` with its
``base/config.json`` copied in (tied by the Trainer: the head stored as the embedding), both PaddleFormers
1.2 Trainer saves (tests/data/flex/README.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import paths
from support.cli_runner import run_cli

UNTIED = paths.REPO / "sample_checkpoints" / "pf_llama_trainer" / "checkpoint-2"
TIED = paths.REPO / "tests" / "data" / "flex" / "trainer_tied"
# what a merged checkpoint's inspection and the flex one must agree on
TIE_KEYS = ("config", "config_source", "head_in_files", "values", "max_abs_diff", "differing_rows")
VOCAB_KEYS = ("config_vocab_size", "embedding_rows", "hidden_size", "tokenizer_size")


def _inspect(folder: Path, *extra: str) -> dict:
    run = run_cli(["inspect", folder, "--json", *extra])
    assert run.rc == 0, run.describe()
    return json.loads(run.stdout)


def _tied_with_config(tmp_path: Path) -> Path:
    ck = tmp_path / "checkpoint-2"
    shutil.copytree(TIED / "checkpoint-2", ck)
    shutil.copy(TIED / "base" / "config.json", ck / "config.json")
    return ck


@pytest.mark.parametrize("which", ["untied", "tied"])
def test_flex_vocabulary_is_the_merged_checkpoints(tmp_path: Path, which: str) -> None:
    ck = UNTIED if which == "untied" else _tied_with_config(tmp_path)
    flex = _inspect(ck)
    assert flex["kind"] == "flex" and "vocabulary_error" not in flex, flex.get("vocabulary_error")
    merged_dir = tmp_path / "merged"
    run = run_cli(["merge", ck, "--out", merged_dir, "-q"])
    assert run.rc == 0, run.describe()
    merged = _inspect(merged_dir)
    assert flex["embedding"]["name"] == merged["embedding"]["name"] == "model.embed_tokens.weight"
    assert flex["embedding"]["shape"] == merged["embedding"]["shape"]
    assert {k: flex["tie"][k] for k in TIE_KEYS} == {k: merged["tie"][k] for k in TIE_KEYS}, (
        flex["tie"],
        merged["tie"],
    )
    assert {k: flex["vocab"][k] for k in VOCAB_KEYS} == {k: merged["vocab"][k] for k in VOCAB_KEYS}
    want = ("different", False) if which == "untied" else ("exact", True)
    assert (flex["tie"]["values"], flex["tie"]["config"]) == want
    text = run_cli(["inspect", ck])
    assert text.rc == 0 and "embedding and head" in text.stdout, text.describe()
    assert f"tie: config {str(want[1]).lower()} (tie_word_embeddings)" in text.stdout, text.stdout


def test_flex_vocabulary_without_values(tmp_path: Path) -> None:
    info = _inspect(UNTIED, "--no-values")
    assert info["tie"]["values"] == "unknown" and info["head"]["name"] == "lm_head.weight"


def test_flex_checkpoint_without_config_says_why(tmp_path: Path) -> None:
    """No config.json (the Trainer writes none): the structure alone, the reason in ``vocabulary_error``
    (the line resize would give), and in words only the note that merge needs the config."""
    info = _inspect(TIED / "checkpoint-2")
    assert "embedding" not in info and info["exit_code"] == 0
    assert info["vocabulary_error"]["exit_code"] == 3 and "config.json" in info["vocabulary_error"]["message"]
    text = run_cli(["inspect", TIED / "checkpoint-2"])
    assert (
        text.rc == 0
        and "no config.json here" in text.stdout
        and "vocabulary not inspected" not in text.stdout
    )


def test_a_trainer_output_dir_names_its_checkpoints() -> None:
    """(Fixed: ``inspect`` of a Trainer's ``output_dir`` said "no whole-model weights found ... save the
    model with save_pretrained", where ``merge`` names the ``checkpoint-N/`` to give.) Every command names
    the checkpoints it holds and the one to give; that one inspects."""
    out_dir = paths.REPO / "tests" / "data" / "flex" / "families" / "gemma3_text"
    for argv in (["inspect", out_dir], ["tie", out_dir, "--dry-run"]):
        run = run_cli(argv)
        assert run.rc == 3 and "checkpoint-2/" in run.stderr, run.describe()
        assert f"e.g. {out_dir / 'checkpoint-2'}" in run.stderr, run.describe()
    assert run_cli(["inspect", out_dir / "checkpoint-2", "-q"]).rc == 0
