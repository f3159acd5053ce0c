"""Defects found by trying issue 28's surfaces as a user would, each kept as a failing test marked
``xfail(strict=True)`` until it is fixed (the reason names the command and what is wrong), or fixed with
its test.

The checkpoint is the PaddleFormers Llama sample with a real tokenizer (``sample_checkpoints/
pf_llama_with_tokenizer``: 304 tokens, 320 rows), as in ``tests/unit/report/test_verify_chain.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import paths
from support.resize_support import run_cli

SRC = paths.SAMPLES / "pf_llama_with_tokenizer"


def test_verify_one_step_after_a_chain_explains_the_trim(tmp_path):
    """(Fixed: ``verify CK CK2`` exited 7, 'token <bb_tok> is not in the output's tokenizer', because the
    whole report chain was netted although CK already holds its first runs.) ``verify A B`` where B is
    ``resize --force`` of A and A is itself an ``add-tokens`` output: the tokens the trim removed are the
    ones B's own report lists as removed, so verify explains them (exit 0); against the untouched original
    the same B verifies too."""
    orig, ck, ck2 = tmp_path / "orig", tmp_path / "ck", tmp_path / "ck2"
    shutil.copytree(SRC, orig)
    shutil.copytree(SRC, ck)
    run = run_cli(["add-tokens", str(ck), "<aa_tok>", "<bb_tok>", "--no-backup", "-q"])
    assert run.rc == 0, run.stderr
    run = run_cli(["resize", str(ck), "--vocab", "305", "--force", "--out", str(ck2), "-q"])
    assert run.rc == 0, run.stderr
    assert "<bb_tok>" not in (ck2 / "tokenizer.json").read_text(encoding="utf-8")
    whole = run_cli(["verify", str(orig), str(ck2)])
    assert whole.rc == 0, whole.stdout + whole.stderr
    step = run_cli(["verify", str(ck), str(ck2)])
    assert step.rc == 0, step.stdout + step.stderr


TRAINER_TIED = paths.FLEX / "trainer_tied"


@pytest.mark.parametrize("command", ["merge", "resize", "add-tokens"])
def test_a_flex_checkpoint_without_config_names_the_fix_of_the_command_run(tmp_path, command):
    """(Fixed: ``resize CK --vocab 264 --keep-training-state`` of a Trainer ``checkpoint-N/`` without
    config.json said "... then merge again".) Every command that reads a flex checkpoint without config.json
    is refused (exit 3) naming config.json, the input untouched, and the fix says to run the command again,
    not to merge."""
    ck = tmp_path / "run" / "checkpoint-2"
    shutil.copytree(TRAINER_TIED / "checkpoint-2", ck)
    args = {
        "merge": [],
        "resize": ["--vocab", "264", "--keep-training-state"],
        "add-tokens": ["<x1>", "--keep-training-state"],
    }[command]
    run = run_cli([command, str(ck), *args, "--out", str(tmp_path / "out"), "-q"])
    assert run.rc == 3, run.stderr
    assert "config.json" in run.stderr and "run the command again" in run.stderr, run.stderr
    assert "merge again" not in run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keep", [False, True], ids=["plain", "keep_paddle_layout"])
def test_merge_of_a_trainer_output_dir_names_its_checkpoints(tmp_path, keep):
    """(Fixed: ``merge OUTPUT_DIR --out X`` of a Trainer's output_dir holding ``checkpoint-1/`` said "no
    tensor- or pipeline-parallel rank files ... give the folder the training run saved its rank files in",
    and with ``--keep-paddle-layout`` that "rank files are merged in their own container": neither names
    the flex checkpoint one level down.) Exit 2 naming the checkpoints, latest last, nothing written."""
    run_dir = tmp_path / "run"
    src = TRAINER_TIED / "checkpoint-2"
    for n in ("checkpoint-9", "checkpoint-10"):
        shutil.copytree(src, run_dir / n)
    run = run_cli(["merge", str(run_dir), "--out", str(tmp_path / "out"), *(["--keep-paddle-layout"] * keep)])
    assert run.rc == 2, run.stderr
    assert "checkpoint-9/, checkpoint-10/" in run.stderr, run.stderr
    assert f"merge {run_dir / 'checkpoint-10'} instead" in run.stderr
    assert "rank files are merged" not in run.stderr
    assert not (tmp_path / "out").exists()


TRAINER_1RANK = paths.FLEX / "trainer_1rank"


@pytest.fixture(scope="module")
def paddle_layout_folder(tmp_path_factory) -> Path:
    """``merge --keep-paddle-layout`` of the real Trainer's Llama checkpoint-2/ (config.json of its base
    model beside it): safetensors in the Paddle layout, config ``source: paddle``."""
    tmp = tmp_path_factory.mktemp("keep")
    ck = tmp / "checkpoint-2"
    shutil.copytree(TRAINER_1RANK / "checkpoint-2", ck)
    shutil.copy(TRAINER_1RANK / "base" / "config.json", ck / "config.json")
    out = tmp / "merged"
    run = run_cli(["merge", str(ck), "--out", str(out), "--keep-paddle-layout", "-q"])
    assert run.rc == 0, run.stderr
    assert 'load_checkpoint_format="legacy"' in run.stdout + run.stderr  # merge itself says it
    return out


@pytest.mark.parametrize(
    "argv",
    [["resize", "--vocab", "260"], ["untie"], ["tie", "--keep", "embedding"], ["add-tokens", "<zz>"]],
    ids=["resize", "untie", "tie", "add-tokens"],
)
def test_write_commands_on_paddle_layout_safetensors_say_the_load(tmp_path, paddle_layout_folder, argv):
    """(Fixed: ``resize M --vocab 260 --out R`` of ``merge --keep-paddle-layout``'s output M, and untie /
    tie / add-tokens, exited 0 saying nothing; PaddleFormers' plain from_pretrained(R) gave logits off by
    7.7, the legacy load 2e-7.) Every write command whose output stays in PaddleFormers' legacy Paddle
    layout says on the terminal the call that loads it."""
    cmd, *args = argv
    out = tmp_path / "out"
    run = run_cli([cmd, str(paddle_layout_folder), *args, "--out", str(out)])
    assert run.rc == 0, run.stderr
    assert 'load_checkpoint_format="legacy"' in run.stdout + run.stderr, run.stdout + run.stderr


ERNIE = paths.BUG_CASES_DIR / "e01_ernie3_wordpiece_lowercase_add_tokens"
ERNIE = ERNIE / "ckpt"


def test_adding_an_existing_special_token_to_a_lower_casing_vocab_adds_nothing(tmp_path):
    """(Fixed: ``add-tokens CK '[CLS]'`` on ERNIE's lower-casing vocab.txt added '[cls]' as a new token with
    a new row, "'[CLS]' is added as '[cls]'", although '[CLS]' is its cls_token: PaddleNLP 2.8.1 encodes
    the text '[CLS]' as id 2, never the new id.) The special token is already there: nothing is added."""
    ck = tmp_path / "ck"
    shutil.copytree(ERNIE, ck)
    vocab = (ck / "vocab.txt").read_text(encoding="utf-8").splitlines()
    cls_id = vocab.index("[CLS]")
    run = run_cli(["add-tokens", str(ck), "[CLS]", "--out", str(tmp_path / "out")])
    assert run.rc == 0, run.stderr
    assert f"already in the tokenizer, not added: '[CLS]' (id {cls_id})" in run.stdout + run.stderr
    assert "[cls]" not in run.stdout + run.stderr
    added = tmp_path / "out" / "added_tokens.json"
    assert not added.exists() or "[cls]" not in added.read_text(encoding="utf-8")


def test_untie_of_a_tied_output_records_no_alias_for_the_head_it_stores(tmp_path):
    """tie records ``{"lm_head.weight": "model.embed_tokens.weight"}`` in the safetensors ``__metadata__``
    (as safetensors' ``save_model`` records a dropped shared tensor); untie then stores ``lm_head.weight`` in
    a new shard, and that shard must not carry the record saying the head was dropped (the untouched shard
    is linked as it was)."""
    from safetensors import safe_open

    tied, untied = tmp_path / "t", tmp_path / "u"
    src = paths.SAMPLES / "pf_llama_tied_fp32"
    assert run_cli(["tie", str(src), "--out", str(tied), "-q"]).rc == 0
    assert run_cli(["untie", str(tied), "--out", str(untied), "-q"]).rc == 0
    holders = []
    for f in sorted(untied.glob("*.safetensors")):
        with safe_open(str(f), "np") as h:
            if "lm_head.weight" in h.keys():
                holders.append(f.name)
                assert "lm_head.weight" not in (h.metadata() or {}), f.name
    assert holders, "untie wrote no lm_head.weight"
    assert run_cli(["verify", str(src), str(untied)]).rc == 0
