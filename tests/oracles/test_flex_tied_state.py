"""``resize`` / ``add-tokens --keep-training-state`` of a TIED model's Trainer checkpoint, and of slack rows.

The input is ``tests/data/flex/trainer_tied/checkpoint-2``: the real PaddleFormers 1.2 Trainer (2 steps, CPU)
on a Llama with ``tie_word_embeddings`` true and ``vocab_size`` 256 while its tokenizer (sp_unigram) has 250
ids: rows 250..255 are slack. As the Trainer saves a tied model, ``model_state/`` holds both
``model.embed_tokens.weight`` and ``lm_head.weight`` (equal: one parameter) and ``optimizer_state/`` the
moments of that parameter once, under ``lm_head.weight.*`` (read from the fixture here, not assumed).

Checked through the CLI: resize grows both stored tensors (equal), the head's moments (old rows bit for bit,
new rows zero), drops nothing, keeps ``tie_word_embeddings``; add-tokens into the slack rows resets the
moments of the rows it takes (said on the terminal) and the tokenizer encodes each new token to its id
(``tokenizers``), also when the tokens fill the slack and grow past it; the case ``e03`` (a tied Qwen3,
byte-level tokenizer.json) likewise; slack rows of the bf16 checkpoint (master weights) through
``state_rewrites``. The oracle (slow): the real Trainer resumes the outputs, loads exactly what tietool wrote
and trains a step; the moments tietool wrote equal those of the same checkpoint grown by Paddle itself
(:func:`support.trainer_resume.grow_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import flex_support as fx
from support import paths
from typer.testing import CliRunner

from tietool.cli.app import app
from tietool.surgery.plan import flex_state

TIED = fx.DATA / "trainer_tied"
SUBS = ("model_state", "optimizer_state", "master_weight")
EMB, HEAD = "model.embed_tokens.weight", "lm_head.weight"
E03 = paths.BUG_CASES_DIR / "e03_flex_tied_model_resize_keep_training_state" / "ckpt"
needs_data = pytest.mark.skipif(not TIED.is_dir(), reason="tests/data/flex/trainer_tied not present")


def _ck(tmp: Path) -> Path:
    """A copy of the tied checkpoint with its run's config.json (base/, what the run started from)."""
    dst = tmp / "in" / "checkpoint-2"
    shutil.copytree(TIED / "checkpoint-2", dst)
    shutil.copy2(TIED / "base" / "config.json", dst / "config.json")
    return dst


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


def _full(folder: Path) -> dict[str, np.ndarray]:
    ck = flex_state._open(folder)
    return {k: flex_state.full_tensor(ck, k) for k in ck.tensors}


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _vocab_key(k: str) -> bool:
    return k in (EMB, HEAD) or (k.startswith(HEAD + ".moment"))


def _check(src: Path, out: Path, rows: int, fresh: tuple[int, int]) -> None:
    """``out`` is ``src`` with both stored vocabulary tensors at ``rows`` rows and equal; the head's moments
    the old ones with rows ``fresh`` zero (new or reset); every other tensor of the three folders bit for
    bit; no tensor added or dropped."""
    lo, hi = fresh
    for sub in SUBS:
        a, b = _full(src / sub), _full(out / sub)
        assert sorted(a) == sorted(b), sub
        for k, old in a.items():
            new = b[k]
            if not _vocab_key(k):
                assert new.tobytes() == old.tobytes(), (sub, k)
                continue
            assert new.shape == (rows, 16), k
            keep = [i for i in range(min(rows, old.shape[0])) if not lo <= i < hi]
            assert new[keep].tobytes() == old[keep].tobytes(), k
            if ".moment" in k:
                assert not new[lo:hi].any(), k
    m = _full(out / "model_state")
    assert m[EMB].tobytes() == m[HEAD].tobytes()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == rows and cfg["tie_word_embeddings"] is True


@needs_data
def test_the_fixture_is_a_tied_trainer_checkpoint() -> None:
    """What the Trainer wrote for a tied model: both names in model_state, equal; the moments once, under
    the head's name (no moment of the embedding's name)."""
    m, o = _full(TIED / "checkpoint-2" / "model_state"), _full(TIED / "checkpoint-2" / "optimizer_state")
    assert m[EMB].shape == m[HEAD].shape == (256, 16) and m[EMB].tobytes() == m[HEAD].tobytes()
    assert HEAD + ".moment1_0" in o and not any(k.startswith(EMB + ".") for k in o)
    assert json.loads((TIED / "base" / "config.json").read_text())["tie_word_embeddings"] is True


@needs_data
def test_resize_grows_the_stored_head_and_its_moments(tmp_path: Path) -> None:
    src = _ck(tmp_path)
    before = _hashes(src)
    out = tmp_path / "r"
    code, text = _cli("resize", str(src), "--vocab", "264", "--keep-training-state", "--out", str(out))
    assert code == 0, text
    assert "not dropped" in text
    _check(src, out, 264, (256, 264))
    rep = json.loads((out / "tietool-report.json").read_text())
    assert not rep.get("dropped")
    assert sorted(rep["training_state_resized"]["optimizer_state"]) == [
        HEAD + ".moment1_0",
        HEAD + ".moment2_0",
    ]
    assert _hashes(src) == before


@needs_data
def test_add_tokens_into_slack_rows_resets_their_moments(tmp_path: Path) -> None:
    """Two tokens take slack rows 250, 251 (no growth): the moments of those rows are reset to zero (said
    on the terminal), the tokenizer encodes each to its id."""
    from tokenizers import Tokenizer

    src = _ck(tmp_path)
    before = _hashes(src)
    out = tmp_path / "a"
    code, text = _cli(
        "add-tokens",
        str(src),
        "<think>",
        "</think>",
        "--seed",
        "1",
        "--keep-training-state",
        "--out",
        str(out),
    )
    assert code == 0, text
    assert "reset to zero" in " ".join(text.split()) and "rows 250..251" in text, text
    _check(src, out, 256, (250, 252))
    m0, m1 = _full(src / "model_state"), _full(out / "model_state")
    assert not np.array_equal(m1[EMB][250:252], m0[EMB][250:252])  # the rows got new values
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert [tok.encode(s, add_special_tokens=False).ids for s in ("<think>", "</think>")] == [[250], [251]]
    assert _hashes(src) == before


@pytest.mark.skipif(not E03.is_dir(), reason="case e03 not present")
@pytest.mark.parametrize("cmd", ["resize", "add-tokens"])
def test_case_e03_tied_qwen3(cmd: str, tmp_path: Path) -> None:
    """The case's tied Qwen3 (16 rows, no slack): both stored tensors and the head's moments grow, the new
    tokens of the byte-level tokenizer.json encode to their ids."""
    from tokenizers import Tokenizer

    src = tmp_path / "ckpt"
    shutil.copytree(E03, src)
    out = tmp_path / "o"
    args = ["--vocab", "20"] if cmd == "resize" else ["<tool_call>", "</tool_call>", "--special"]
    code, text = _cli(cmd, str(src), *args, "--init", "zeros", "--keep-training-state", "--out", str(out))
    assert code == 0, text
    rows = 20 if cmd == "resize" else 18
    m0, m1 = _full(src / "model_state"), _full(out / "model_state")
    o0, o1 = _full(src / "optimizer_state"), _full(out / "optimizer_state")
    assert m1[EMB].shape == (rows, 8) and m1[EMB].tobytes() == m1[HEAD].tobytes()
    assert m1[EMB][:16].tobytes() == m0[EMB].tobytes() and not m1[EMB][16:].any()
    for k in (HEAD + ".moment1_0", HEAD + ".moment2_0"):
        assert o1[k][:16].tobytes() == o0[k].tobytes() and not o1[k][16:].any()
    assert sorted(o1) == sorted(o0)
    if cmd == "add-tokens":
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        assert tok.encode("<tool_call>").ids == [16] and tok.encode("</tool_call>").ids == [17]


@needs_data
@pytest.mark.slow
def test_the_trainer_resumes_both_outputs(tmp_path: Path) -> None:
    """The real Trainer resumes the resized checkpoint (model folder: ``tietool resize base --vocab 264``),
    the slack add-tokens one (model folder: base, the same shapes) and the one whose tokens fill the slack
    and grow past it (model folder: base resized to 258): it loads exactly what tietool wrote (model and
    optimizer state, bit for bit) and trains a step. The head's moments tietool wrote equal those of the
    checkpoint grown by Paddle itself."""
    from support.trainer_resume import ResumeRun, grow_checkpoint, resume

    src = _ck(tmp_path)
    base = tmp_path / "base"
    shutil.copytree(TIED / "base", base)
    for rows in (264, 258):
        assert (
            _cli("resize", str(base), "--vocab", str(rows), "--out", str(tmp_path / f"base-{rows}"))[0] == 0
        )
    grown, slack, past = (tmp_path / f"run_{n}" / "checkpoint-2" for n in ("r", "a", "p"))
    code, text = _cli("resize", str(src), "--vocab", "264", "--keep-training-state", "--out", str(grown))
    assert code == 0, text
    code, text = _cli(
        "add-tokens", str(src), "<think>", "</think>", "--keep-training-state", "--out", str(slack)
    )
    assert code == 0, text
    toks = [f"<t{i}>" for i in range(8)]
    code, text = _cli("add-tokens", str(src), *toks, "--keep-training-state", "--out", str(past))
    assert code == 0, text
    runs = [
        ResumeRun(grown, tmp_path / "base-264"),
        ResumeRun(slack, base),
        ResumeRun(past, tmp_path / "base-258"),
    ]
    for out, got in zip((grown, slack, past), resume(runs), strict=True):
        assert got.ok, got.error
        assert got.losses and all(np.isfinite(got.losses))
        model, opt = _full(out / "model_state"), _full(out / "optimizer_state")
        assert sorted(got.model) == sorted(model)
        for k, w in model.items():
            assert got.model[k].tobytes() == w.tobytes(), k
        for k, w in opt.items():
            assert got.optimizer[k].tobytes() == w.tobytes(), k
    paddle_ck, _ = grow_checkpoint(src, base, tmp_path / "paddle", 264)
    ours, theirs = _full(grown / "optimizer_state"), _full(paddle_ck / "optimizer_state")
    assert sorted(ours) == sorted(theirs)
    for k, w in theirs.items():
        assert ours[k].tobytes() == w.tobytes(), k


@pytest.mark.skipif(not (fx.DATA / "trainer_bf16_layout").is_dir(), reason="tests/data/flex not present")
def test_slack_rows_of_a_bf16_checkpoint_reset_moments_and_masters(tmp_path: Path) -> None:
    """:func:`flex_state.state_rewrites` with slack rows 240, 241 given new values (bf16 weights, fp32
    masters): the moments of those rows zero, the master rows the exact fp32 of the new bf16 rows, every
    other entry bit for bit; shapes unchanged. Read back after :func:`flex_write.rewrite_folder`."""
    from tietool.surgery.io import flex, flex_write
    from tietool.surgery.model.tensor import bf16_bits_to_f32

    src = fx.DATA / "trainer_bf16_layout" / "checkpoint-1"
    old = {sub: _full(src / sub) for sub in SUBS}
    new_rows = ((np.arange(32).reshape(2, 16) % 7 - 3).astype(np.float32) / 8).view(np.uint32) >> 16
    weights = {}
    for k in (EMB, HEAD):
        w = old["model_state"][k].copy()
        w[240:242] = new_rows.astype(np.uint16)
        weights[k] = w
    edits = flex_state.state_rewrites(src, weights, {k: (0, (240, 242)) for k in weights})
    for sub, new in edits.items():
        meta = next((src / sub).glob("*.metadata"))
        (tmp_path / sub).mkdir()
        flex_write.rewrite_folder(src / sub, tmp_path / sub, meta.name, flex.read_metadata(meta), new)
    for sub in SUBS:
        got = _full(tmp_path / sub)
        assert sorted(got) == sorted(old[sub])
        for k, a in old[sub].items():
            b = got[k]
            assert b.shape == a.shape and b.dtype == a.dtype, k
            param = k.removesuffix(".w_0").split(".moment")[0]
            if param not in weights or "pow_acc" in k:
                assert b.tobytes() == a.tobytes(), k
                continue
            rest = np.r_[0:240, 242 : a.shape[0]]
            assert b[rest].tobytes() == a[rest].tobytes(), k
            if sub == "model_state":
                assert b[240:242].tobytes() == weights[k][240:242].tobytes(), k
            elif sub == "optimizer_state":
                assert not b[240:242].any() and a[240:242].any(), k
            else:
                assert b[240:242].tobytes() == bf16_bits_to_f32(weights[param][240:242]).tobytes(), k
                assert a[240:242].tobytes() != b[240:242].tobytes(), k


@needs_data
def test_add_tokens_past_the_slack_rows_resets_them_and_grows(tmp_path: Path) -> None:
    """Eight tokens: six take slack rows 250..255, two grow the tables to 258; the moments of rows
    250..257 are zero, rows 0..249 bit for bit."""
    src = _ck(tmp_path)
    out = tmp_path / "a"
    toks = [f"<t{i}>" for i in range(8)]
    code, text = _cli(
        "add-tokens", str(src), *toks, "--seed", "1", "--keep-training-state", "--out", str(out)
    )
    assert code == 0, text
    assert "rows 250..255" in text, text
    _check(src, out, 258, (250, 258))


@needs_data
def test_new_values_in_unnamed_rows_refused() -> None:
    """A weight that keeps its shape with no slack rows named: which moments to reset cannot be told, so
    the edit is refused by name (nothing is planned)."""
    from tietool.surgery.model.errors import RefusedError

    src = TIED / "checkpoint-2"
    w = _full(src / "model_state")[HEAD] + 1
    with pytest.raises(RefusedError, match="lm_head.weight keeps its shape"):
        flex_state.state_rewrites(src, {HEAD: w})
