"""``tietool resize`` / ``add-tokens --keep-training-state`` of the real PaddleFormers Trainer flex
checkpoints of ``tests/data/flex`` (trainer_1rank, trainer_2rank, trainer_bf16_layout; config.json copied
from trainer_1rank/base, the same model), end to end through the CLI: the output is a Trainer checkpoint
whose vocabulary tensors, moments and master weights are resized (read back by tietool here; by paddle's
``load_state_dict`` and by the real Trainer's resume in the slow tests), the input unchanged, refusals
with one line, their exit code and nothing written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support import flex_support as fx
from support import preload
from typer.testing import CliRunner

from tietool.cli.app import app
from tietool.surgery.io import flex, flex_write
from tietool.surgery.plan import flex_state

CKPTS = {
    "trainer_1rank": "checkpoint-2",
    "trainer_2rank": "checkpoint-2",
    "trainer_bf16_layout": "checkpoint-1",
}
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")
SUBS = ("model_state", "optimizer_state", "master_weight")
needs_data = pytest.mark.skipif(
    not (fx.DATA / "trainer_1rank").is_dir(), reason="tests/data/flex not present"
)


def _ck(name: str, tmp: Path) -> Path:
    """A copy of fixture ``name``'s checkpoint with trainer_1rank/base's config.json."""
    dst = tmp / name / CKPTS[name]
    shutil.copytree(fx.DATA / name / CKPTS[name], dst)
    shutil.copy2(fx.DATA / "trainer_1rank" / "base" / "config.json", dst / "config.json")
    return dst


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


def _full(folder: Path) -> dict[str, np.ndarray]:
    ck = flex_state._open(folder)
    return {k: flex_state.full_tensor(ck, k) for k in ck.tensors}


def _check_resized(src: Path, out: Path, rows: int, linked: bool = True) -> None:
    """``out`` holds ``src`` with the vocabulary grown (or trimmed) to ``rows``: old rows bit for bit, new
    moment rows zero, new master rows the fp32 of the new weight rows, everything else bit for bit."""
    keep = min(250, rows)
    for sub in SUBS:
        if not (src / sub).is_dir():
            continue
        a, b = _full(src / sub), _full(out / sub)
        assert sorted(a) == sorted(b), sub
        for k, old in a.items():
            new = b[k]
            if k.startswith(VOCAB) and not k.endswith(("beta1_pow_acc_0", "beta2_pow_acc_0")):
                assert new.shape == (rows, 16), (sub, k)
                assert new[:keep].tobytes() == old[:keep].tobytes(), (sub, k)
                if sub == "optimizer_state":
                    assert not new[keep:].any(), k
            else:
                assert new.tobytes() == old.tobytes(), (sub, k)
    w, m = (
        _full(out / "model_state"),
        _full(out / "master_weight") if (out / "master_weight").is_dir() else {},
    )
    for k in VOCAB:
        if f"{k}.w_0" in m and rows > 250:
            rows_w = w[k][250:]
            want = (rows_w.astype(np.uint32) << 16).view(np.float32) if rows_w.dtype == np.uint16 else rows_w
            assert m[f"{k}.w_0"][250:].tobytes() == want.tobytes(), k
    assert json.loads((out / "config.json").read_text())["vocab_size"] == rows
    for p in src.iterdir():  # the Trainer's other files carried, by hard link
        if p.is_file() and p.name not in ("config.json",) and not p.name.startswith("tokenizer"):
            assert (out / p.name).read_bytes() == p.read_bytes(), p.name
            assert not linked or (out / p.name).stat().st_ino == p.stat().st_ino, p.name


@needs_data
@pytest.mark.parametrize("name", CKPTS)
def test_resize_grow_and_trim_out(name: str, tmp_path: Path) -> None:
    src = _ck(name, tmp_path)
    before = _hashes(src)
    code, text = _cli(
        "resize", str(src), "--vocab", "256", "--keep-training-state", "--out", str(tmp_path / "g")
    )
    assert code == 0, text
    _check_resized(src, tmp_path / "g", 256)
    rep = json.loads((tmp_path / "g" / "tietool-report.json").read_text())
    assert (
        rep["kind"] == "flex"
        and "lm_head.weight.moment1_0" in rep["training_state_resized"]["optimizer_state"]
    )
    code, text = _cli(
        "resize", str(src), "--vocab", "248", "--force", "--keep-training-state", "--out", str(tmp_path / "t")
    )
    if (src / "tokenizer.json").is_file():  # the tokenizer beside it uses rows 248, 249
        assert code == 5 and "base vocabulary" in text, text
        assert not (tmp_path / "t").exists()
    else:
        assert code == 0, text
    bare = tmp_path / "bare" / "checkpoint-2"
    shutil.copytree(src, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    code, text = _cli(
        "resize",
        str(bare),
        "--vocab",
        "248",
        "--force",
        "--keep-training-state",
        "--out",
        str(tmp_path / "u"),
    )
    assert code == 0, text
    _check_resized(bare, tmp_path / "u", 248)
    assert _hashes(src) == before


@needs_data
def test_add_tokens_keep_training_state(tmp_path: Path) -> None:
    src = _ck("trainer_1rank", tmp_path)
    before = _hashes(src)
    out = tmp_path / "a"
    code, text = _cli(
        "add-tokens",
        str(src),
        "<think>",
        "</think>",
        "--keep-training-state",
        "--pad-to-multiple-of",
        "8",
        "--seed",
        "1",
        "--out",
        str(out),
    )
    assert code == 0, text
    _check_resized(src, out, 256)
    tok = json.loads((out / "tokenizer.json").read_text())
    assert {"<think>", "</think>"} <= {t["content"] for t in tok["added_tokens"]}
    assert _hashes(src) == before


@needs_data
def test_in_place_and_dry_run(tmp_path: Path) -> None:
    src = _ck("trainer_bf16_layout", tmp_path)
    keep = tmp_path / "orig"
    shutil.copytree(src, keep)
    before = _hashes(src)
    code, text = _cli(
        "resize",
        str(src),
        "--vocab",
        "256",
        "--keep-training-state",
        "--dry-run",
        "--out",
        str(tmp_path / "d"),
    )
    assert code == 0, text
    assert not (tmp_path / "d").exists() and _hashes(src) == before
    code, text = _cli("resize", str(src), "--vocab", "256", "--keep-training-state", "--dry-run")
    assert code == 0 and _hashes(src) == before, text
    code, text = _cli("resize", str(src), "--vocab", "256", "--keep-training-state")
    assert code == 0, text
    _check_resized(keep, src, 256, linked=False)
    (bak,) = [p for p in src.parent.iterdir() if ".tietool-backup-" in p.name]
    assert _hashes(bak) == before


@needs_data
def test_refusals_write_nothing(tmp_path: Path) -> None:
    src = _ck("trainer_1rank", tmp_path)
    out = tmp_path / "o"
    code, text = _cli("resize", str(src), "--vocab", "256", "--out", str(out))
    assert code == 5 and "--keep-training-state" in text and "merge" in text, text
    (src / "config.json").unlink()
    before = _hashes(src)
    code, text = _cli("resize", str(src), "--vocab", "256", "--keep-training-state", "--out", str(out))
    assert code != 0 and "config.json" in text, text
    assert not out.exists() and _hashes(src) == before
    shutil.copy2(fx.DATA / "trainer_1rank" / "base" / "config.json", src / "config.json")
    meta = next((src / "optimizer_state").glob("*.metadata"))
    ts = flex.read_metadata(meta)
    flex_write.write_metadata(meta, {k: t for k, t in ts.items() if k != "lm_head.weight.moment2_0"})
    before = _hashes(src)
    code, text = _cli("resize", str(src), "--vocab", "256", "--keep-training-state", "--out", str(out))
    assert code == 5 and "lm_head.weight.moment2_0" in text, text
    assert not out.exists() and _hashes(src) == before
    assert len([x for x in text.strip().splitlines() if x.startswith("tietool")]) == 1


@needs_data
def test_incomplete_checkpoints_named(tmp_path: Path) -> None:
    """A Trainer checkpoint-N/ with a part missing is named as such (exit 3, one line, input untouched):
    no model_state/ (resize, inspect and merge name it, not "no whole-model weights" / "no rank files"),
    and an empty optimizer_state/ (no .metadata: not "several saves share the folder")."""
    out = tmp_path / "o"
    src = _ck("trainer_1rank", tmp_path)
    shutil.rmtree(src / "model_state")
    before = _hashes(src)
    for args in (("resize", str(src), "--vocab", "256", "--keep-training-state", "--out", str(out)),
                 ("inspect", str(src)), ("merge", str(src), "--out", str(out))):  # fmt: skip
        code, text = _cli(*args)
        assert code == 3 and "no model_state/" in text and "optimizer_state/" in text, (args, text)
        assert len([x for x in text.strip().splitlines() if x.startswith("tietool")]) == 1, text
    assert not out.exists() and _hashes(src) == before
    src = tmp_path / "b"
    src.mkdir()
    src = _ck("trainer_1rank", src)
    for f in (src / "optimizer_state").iterdir():
        f.unlink()
    before = _hashes(src)
    code, text = _cli("resize", str(src), "--vocab", "256", "--keep-training-state", "--out", str(out))
    assert code == 3 and "optimizer_state" in text and "no <id>.metadata" in text, text
    assert "several saves" not in text and "Traceback" not in text, text
    assert not out.exists() and _hashes(src) == before


@needs_data
def test_misshapen_moment_refused(tmp_path: Path) -> None:
    """A moment stored (metadata and data agreeing) with another shape than its weight: exit 5, one line
    naming the moment and both shapes, nothing written, input untouched."""
    src = _ck("trainer_1rank", tmp_path)
    d, key = src / "optimizer_state", "lm_head.weight.moment1_0"
    ts = flex.read_metadata(d / "0.metadata")
    t, s = ts[key], ts[key].slices[0]
    bad = np.zeros((t.shape[0], t.shape[1] + 1), dtype=t.storage_dtype)
    flex_write._rewrite_file(d / s.file, tmp_path / "x.distcp", {s.key}, [(s.key, bad)])
    (tmp_path / "x.distcp").replace(d / s.file)
    ts[key] = flex_write.whole(key, t.dtype, bad.shape, s.file)
    flex_write.write_metadata(d / "0.metadata", ts)
    before, out = _hashes(src), tmp_path / "o"
    for cmd in (("resize", str(src), "--vocab", "256"), ("add-tokens", str(src), "<new>")):
        code, text = _cli(*cmd, "--keep-training-state", "--out", str(out))
        assert code == 5 and key in text and "[250, 17]" in text and "[250, 16]" in text, text
        assert len([x for x in text.strip().splitlines() if x.startswith("tietool")]) == 1, text
    assert not out.exists() and _hashes(src) == before


_LOAD = textwrap.dedent(
    """
    import json, sys, numpy as np, paddle
    for folder, shapes in json.loads(sys.argv[1]).items():
        sd = {n: paddle.zeros(s, dtype=d) for n, (s, d) in shapes.items()}
        paddle.distributed.load_state_dict(sd, folder)
        got = {n: (t.view("uint16") if t.dtype == paddle.bfloat16 else t).numpy() for n, t in sd.items()}
        np.savez(folder + ".got.npz", **got)
    """
)


@needs_data
@pytest.mark.slow
def test_paddle_loads_the_cli_output(tmp_path: Path) -> None:
    """paddle's load_state_dict of every folder the CLI wrote equals tietool's reading (one subprocess)."""
    folders = []
    for name in CKPTS:
        src = _ck(name, tmp_path / "in")
        out = tmp_path / name
        assert _cli("resize", str(src), "--vocab", "256", "--keep-training-state", "--out", str(out))[0] == 0
        folders += [out / s for s in SUBS if (out / s).is_dir() and any((out / s).glob("*.distcp"))]
    shapes = {}
    for f in folders:
        ts = flex.read_metadata(next(f.glob("*.metadata")))
        shapes[str(f)] = {n: (list(t.shape), t.dtype) for n, t in ts.items()}
    shapes = {k: v for k, v in shapes.items() if v}
    run = preload.run(
        [sys.executable, "-c", _LOAD, json.dumps(shapes)],
        libs=("paddle",),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for f in shapes:
        got, want = dict(np.load(f"{f}.got.npz")), _full(Path(f))
        assert sorted(got) == sorted(want), f
        for k, w in want.items():
            assert got[k].tobytes() == w.tobytes(), (f, k)


@needs_data
@pytest.mark.slow
def test_the_trainer_resumes_from_the_cli_output(tmp_path: Path) -> None:
    """The real Trainer resumes from ``tietool resize checkpoint-2 --vocab 256 --keep-training-state`` into a
    model built from ``tietool resize base --vocab 256`` (not resize_token_embeddings, which leaves the
    untied head at 250): what it loaded equals what tietool wrote, and one step runs."""
    from tests.support.trainer_resume import ResumeRun, resume

    src = _ck("trainer_1rank", tmp_path / "in")
    base = tmp_path / "base"
    shutil.copytree(fx.DATA / "trainer_1rank" / "base", base)
    assert (
        _cli("resize", str(base), "--vocab", "256", "--seed", "3", "--out", str(tmp_path / "base-256"))[0]
        == 0
    )
    out = tmp_path / "run" / "checkpoint-2"
    code, text = _cli(
        "resize", str(src), "--vocab", "256", "--seed", "3", "--keep-training-state", "--out", str(out)
    )
    assert code == 0, text
    (got,) = resume([ResumeRun(out, tmp_path / "base-256")])
    assert got.ok, got.error
    assert got.losses and all(np.isfinite(got.losses))
    model, opt = _full(out / "model_state"), _full(out / "optimizer_state")
    assert sorted(got.model) == sorted(model)
    for k, w in model.items():
        assert got.model[k].tobytes() == w.tobytes(), k
    for k, w in opt.items():
        assert got.optimizer[k].tobytes() == w.tobytes(), k
