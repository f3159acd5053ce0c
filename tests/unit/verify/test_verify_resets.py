"""``verify`` checks an add-tokens report's ``rows_reset`` claims against the files: an existing token whose
rows add-tokens reset must have had all-zero rows in the input's embedding and in a head stored apart (the
rule add-tokens itself applies, :func:`tietool.surgery.plan.add_tokens.not_resettable`), else the report is
unverifiable (exit 7 naming the token, its id and why), never exit 0 on an overwritten trained row.

The checkpoint is e04 (tests/data/cases: Llama-3 base written by PaddleFormers 1.2, untied, [vocab, hidden]
head): '<|begin_of_text|>' (262) and '<|reserved_special_token_0|>'-style id 263 have trained rows; the chat
tokens 266, 267, 269 are all zero in the embedding and the head.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import casecheck
from support.hostile.history import copy_row
from support.paths import BUG_CASES_DIR
from support.resize_support import run_cli

E04 = BUG_CASES_DIR / "e04_llama3_base_untrained_chat_tokens" / "ckpt"
NAMES = ("model.embed_tokens.weight", "lm_head.weight")
CHAT = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> tuple[Path, Path]:
    """e04 (a copy) and the output of a real ``add-tokens`` of the three chat tokens (rows reset)."""
    tmp = tmp_path_factory.mktemp("e04")
    ck = shutil.copytree(E04, tmp / "ck")
    out = tmp / "out"
    run = run_cli(
        ["add-tokens", str(ck), *CHAT, "--special", "--init", "copy:<|begin_of_text|>"]
        + ["--out", str(out), "-q"]
    )
    assert run.rc == 0, (run.stdout, run.stderr)
    rep = json.loads((out / "tietool-report.json").read_text())
    assert [(t["id"], t["rows_reset"]) for t in rep["add_tokens"]["tokens"]] == [
        (266, True),
        (267, True),
        (269, True),
    ]
    return ck, out


def _copy(out: Path, dest: Path) -> Path:
    return shutil.copytree(out, dest)


def _rows(ck: Path, name: str):
    return casecheck.read_checkpoint(ck).tensors[name].byte_view()


def test_a_real_reset_verifies(real):
    """The real add-tokens output verifies (exit 0): its reset rows are all zero in the input (the oracle:
    the rows read with numpy by the case checker) and changed in the output."""
    ck, out = real
    for name in NAMES:
        x, y = _rows(ck, name), _rows(out, name)
        assert not x[[266, 267, 269]].any() and y[[266, 267, 269]].any()
    run = run_cli(["verify", str(ck), str(out)])
    assert run.rc == 0, run.stdout


def test_a_forged_reset_of_a_trained_row_is_unverifiable(real, tmp_path):
    """The same output with row 262 ('<|begin_of_text|>', trained: not all zero in the input) overwritten in
    the embedding and the head by row 263, and the report forged to list 262 as ``rows_reset``: exit 7 naming
    the token, its id, the tensor whose row is not zero, and the report as unverifiable. Without the
    overwrite the forged claim is still called unverifiable."""
    ck, out = real
    assert _rows(ck, NAMES[0])[262].any() and _rows(ck, NAMES[1])[262].any()
    for overwrite in (True, False):
        b = _copy(out, tmp_path / f"b{overwrite}")
        if overwrite:
            for name in NAMES:
                copy_row(b / "model.safetensors", name, 263, 262)
        p = b / "tietool-report.json"
        rep = json.loads(p.read_text())
        rep["add_tokens"]["tokens"].append(
            {"content": "<|begin_of_text|>", "id": 262, "special": True, "existed": True, "rows_reset": True}
        )
        p.unlink()
        p.write_text(json.dumps(rep))
        run = run_cli(["verify", str(ck), str(b)])
        assert run.rc == 7, run.stdout
        text = " ".join(run.stdout.split())
        assert "'<|begin_of_text|>' (id 262)" in text and "rows_reset" in text, run.stdout
        assert "its row of model.embed_tokens.weight in the input is not all zero" in text, run.stdout
        assert "unverifiable" in text, run.stdout


def test_a_changed_trained_row_beside_a_genuine_reset_is_unexplained(real, tmp_path):
    """A genuine ``rows_reset`` claim for 266/267/269 explains only those rows: the trained row 263 changed
    in the embedding of the same output is unexplained (exit 7 naming the tensor and the row)."""
    ck, out = real
    b = _copy(out, tmp_path / "b")
    copy_row(b / "model.safetensors", NAMES[0], 262, 263)
    assert _rows(b, NAMES[0])[263].tobytes() != _rows(ck, NAMES[0])[263].tobytes()
    run = run_cli(["verify", str(ck), str(b)])
    assert run.rc == 7, run.stdout
    text = " ".join(run.stdout.split())
    assert "model.embed_tokens.weight changed in rows 263 (rows of no token" in text, run.stdout


def test_a_reset_claim_under_a_head_row_not_zero_is_unverifiable(real, tmp_path):
    """The head stored apart must be all zero too (add-tokens' rule): the input with row 266 of lm_head
    made non-zero (row 262 copied) does not explain the real output's reset of 266: exit 7 naming the head."""
    ck, out = real
    a = shutil.copytree(ck, tmp_path / "a")
    copy_row(a / "model.safetensors", NAMES[1], 262, 266)
    run = run_cli(["verify", str(a), str(out)])
    assert run.rc == 7, run.stdout
    text = " ".join(run.stdout.split())
    assert "'<|start_header_id|>' (id 266)" in text, run.stdout
    assert "its row of lm_head.weight in the input is not all zero" in text and "unverifiable" in text
