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
    # with a config.json of its own (gemma3_text), and without one (the sample: "not a checkpoint folder")
    for out_dir in (paths.REPO / "tests" / "data" / "flex" / "families" / "gemma3_text", UNTIED.parent):
        for argv in (["inspect", out_dir], ["tie", out_dir, "--dry-run"]):
            run = run_cli(argv)
            assert run.rc == 3 and "checkpoint-2/" in run.stderr, run.describe()
            assert f"e.g. {out_dir / 'checkpoint-2'}" in run.stderr, run.describe()
        assert run_cli(["inspect", out_dir / "checkpoint-2", "-q"]).rc == 0


def test_a_flex_folder_that_is_not_a_trainer_checkpoint_is_told_to_merge_only(tmp_path: Path) -> None:
    """A flex folder without optimizer_state/ (paddle.distributed.save_state_dict's own) cannot be edited
    with --keep-training-state: its refusal says merge, never the option the user may have just given."""
    flat = paths.REPO / "tests" / "data" / "flex" / "single"
    for extra in ([], ["--keep-training-state"]):
        run = run_cli(["resize", flat, "--vocab", "300", *extra, "--out", tmp_path / f"o{len(extra)}"])
        assert run.rc == 5 and "tietool merge" in run.stderr, run.describe()
        assert "--keep-training-state" not in run.stderr.split(" — ", 1)[1], run.describe()


def test_a_damaged_distcp_or_a_wrong_name_fails_the_inspection(tmp_path: Path) -> None:
    """With a config, the vocabulary reads the embedding's and head's ``.distcp`` files: one cut short is
    exit 3 with one error line naming it (as ``merge`` says), never "covered" and exit 0; an
    ``--embedding`` the checkpoint does not hold is exit 3 naming it, as for any checkpoint."""
    ck = tmp_path / "checkpoint-2"
    shutil.copytree(UNTIED, ck)
    distcp = ck / "model_state" / "0_0.distcp"
    with distcp.open("r+b") as f:
        f.truncate(distcp.stat().st_size // 2)
    for argv in (["inspect", ck], ["inspect", ck, "-q"]):
        run = run_cli(argv)
        lines = run.stderr.splitlines()
        assert run.rc == 3 and len(lines) == 1 and "0_0.distcp" in lines[0], run.describe()
        assert "truncated" in lines[0] and "vocabulary not inspected" not in run.stdout, run.describe()
    assert run_cli(["merge", ck, "--out", tmp_path / "m"]).rc == 3
    run = run_cli(["inspect", UNTIED, "--embedding", "nope.weight", "-q"])
    assert run.rc == 3 and "nope.weight" in run.stderr, run.describe()


def test_the_config_above_a_checkpoint_names_its_token_ids(tmp_path: Path) -> None:
    """A Trainer checkpoint-N/ whose config.json is in the folder above (tests/data/flex/families:
    DeepSeek-V3, bos / eos ids 100000 / 100001 over 250 rows): its token ids are read from there, as merge
    carries that config, so the problem the merged folder's inspection names is named here too (none
    before)."""
    ck = paths.REPO / "tests" / "data" / "flex" / "families" / "deepseek_v3" / "checkpoint-2"
    assert not (ck / "config.json").exists()
    flex = _inspect(ck)
    run = run_cli(["merge", ck, "--out", tmp_path / "merged", "-q"])
    assert run.rc == 0, run.describe()
    merged = _inspect(tmp_path / "merged")
    beyond = [p for p in merged["problems"] if p.startswith("token ids beyond the last row")]
    assert beyond and "config.json bos_token_id = 100000" in beyond[0], merged["problems"]
    assert [p for p in flex["problems"] if p.startswith("token ids beyond the last row")] == beyond
