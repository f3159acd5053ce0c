"""``plan.flex_state.state_rewrites`` + ``io.flex_write.rewrite_folder`` on the real Trainer checkpoints of
``tests/data/flex`` (fp32 1 rank, fp32 2 ranks with sharding stage 1, bf16 with fp32 master weights): the
vocabulary tables grown by 3 rows and shrunk by 2, every folder checked through paddle's own
``load_state_dict`` (one subprocess): untouched tensors equal the Paddle-written oracles bit for bit, old
rows of changed tensors too, new moment rows zero, new master rows the fp32 value of the new weight rows,
beta pows unchanged. Refusals: a missing moment, a moment of another shape, an unknown accumulator.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support import flex_support as fx
from support import preload

from tietool.surgery.io import flex, flex_write
from tietool.surgery.model.errors import RefusedError
from tietool.surgery.model.tensor import bf16_bits_to_f32
from tietool.surgery.plan import flex_state

PY = sys.executable
CKPTS = {  # folder -> its checkpoint and the oracle file prefix
    "trainer_1rank": "checkpoint-2",
    "trainer_2rank": "checkpoint-2",
    "trainer_bf16_layout": "checkpoint-1",
}
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")  # both [vocab 250, hidden 16] (checked below)
SUBS = {
    "model_state": "oracle",
    "optimizer_state": "oracle_optimizer",
    "master_weight": "oracle_master_weight",
}
needs_data = pytest.mark.skipif(
    not (fx.DATA / "trainer_1rank").is_dir(), reason="tests/data/flex not present"
)


def _oracle(name: str, sub: str) -> dict[str, np.ndarray]:
    return dict(np.load(fx.DATA / name / f"{SUBS[sub]}.npz"))


def _new_weights(name: str, rows: int) -> dict[str, np.ndarray]:
    """The vocabulary weights with ``rows`` more rows (a pattern, exact in bf16) or fewer."""
    w = _oracle(name, "model_state")
    out = {}
    for k in VOCAB:
        assert w[k].shape == (250, 16)
        if rows < 0:
            out[k] = np.ascontiguousarray(w[k][:rows])
            continue
        extra = (np.arange(rows * 16).reshape(rows, 16) % 7 - 3).astype(np.float32) / 8
        extra = (extra.view(np.uint32) >> 16).astype(np.uint16) if w[k].dtype == np.uint16 else extra
        out[k] = np.concatenate([w[k], extra])
    return out


def _edit(name: str, rows: int, dst: Path) -> tuple[Path, dict[str, dict[str, np.ndarray]]]:
    """The checkpoint of fixture ``name`` with the vocabulary resized by ``rows``, written to ``dst``;
    and what each folder should hold (the oracles with the changes a resize makes)."""
    src = fx.DATA / name / CKPTS[name]
    weights = _new_weights(name, rows)
    edits = flex_state.state_rewrites(src, weights)
    want = {sub: _oracle(name, sub) for sub in SUBS}
    for sub, new in edits.items():
        meta = next((src / sub).glob("*.metadata"))
        (dst / sub).mkdir(parents=True)
        flex_write.rewrite_folder(src / sub, dst / sub, meta.name, flex.read_metadata(meta), new)
    keep = min(250, 250 + rows)
    for k, w in weights.items():
        want["model_state"][k] = w
        for m in ("moment1_0", "moment2_0"):
            old = want["optimizer_state"][f"{k}.{m}"]
            want["optimizer_state"][f"{k}.{m}"] = np.concatenate(
                [old[:keep], np.zeros((max(rows, 0), 16), "f4")]
            )
        mk = f"{k}.w_0"
        if mk in want["master_weight"]:
            new = w[250:]
            new = bf16_bits_to_f32(new) if new.dtype == np.uint16 else new
            want["master_weight"][mk] = np.concatenate([want["master_weight"][mk][:keep], new])
    return dst, want


@needs_data
@pytest.mark.parametrize("rows", [3, -2])
@pytest.mark.parametrize("name", CKPTS)
def test_plan_gives_the_resized_state(name: str, rows: int, tmp_path: Path) -> None:
    """What the plan replaces, read back by tietool's reader (the paddle oracle: the slow test below)."""
    dst, want = _edit(name, rows, tmp_path / "out")
    for sub in SUBS:
        ck = flex_state._open(dst / sub)
        assert sorted(ck.tensors) == sorted(want[sub]), sub
        for k, w in want[sub].items():
            assert flex_state.full_tensor(ck, k).tobytes() == w.tobytes(), (sub, k)
    src = fx.DATA / name / CKPTS[name]
    for sub in SUBS:  # files without a changed tensor are links to the input, the others rewritten
        before = flex.read_metadata(next((src / sub).glob("*.metadata")))
        touched = {s.file for k in want[sub] if k.startswith(VOCAB) for s in before[k].slices}
        for p in (src / sub).glob("*.distcp"):
            linked = (dst / sub / p.name).stat().st_ino == p.stat().st_ino
            assert linked == (p.name not in touched), (sub, p.name)


_LOAD = textwrap.dedent(
    """
    import json, sys, numpy as np, paddle
    for folder, shapes in json.loads(sys.argv[1]).items():
        sd = {n: paddle.zeros(s, dtype=d) for n, (s, d) in shapes.items()}
        if sd:
            paddle.distributed.load_state_dict(sd, folder)
        got = {n: (t.view("uint16") if t.dtype == paddle.bfloat16 else t).numpy() for n, t in sd.items()}
        np.savez(folder + ".got.npz", **got)
    """
)


@needs_data
@pytest.mark.slow
def test_paddle_loads_the_resized_state_bit_for_bit(tmp_path: Path) -> None:
    """paddle's load_state_dict of every rewritten folder equals the intended tensors, bit for bit."""
    cases = [(n, r) for n in CKPTS for r in (3, -2)]
    wants = {}
    for k, (name, rows) in enumerate(cases):
        dst, want = _edit(name, rows, tmp_path / f"c{k}")
        for sub in SUBS:
            wants[dst / sub] = want[sub]
    shapes = {}
    for folder in wants:
        ts = flex.read_metadata(next(folder.glob("*.metadata")))
        shapes[str(folder)] = {n: (list(t.shape), t.dtype) for n, t in ts.items()}
    run = preload.run(
        [PY, "-c", _LOAD, json.dumps(shapes)], libs=("paddle",), capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for folder, want in wants.items():
        got = dict(np.load(f"{folder}.got.npz"))
        assert sorted(got) == sorted(want), folder
        for k, w in want.items():
            assert got[k].dtype == w.dtype and got[k].tobytes() == w.tobytes(), (folder, k)


def _broken(tmp_path: Path, edit) -> Path:
    """A copy of trainer_1rank's checkpoint whose optimizer_state .metadata ``edit`` changed."""
    src = fx.DATA / "trainer_1rank" / "checkpoint-2"
    dst = tmp_path / "ck"
    shutil.copytree(src, dst)
    meta = next((dst / "optimizer_state").glob("*.metadata"))
    flex_write.write_metadata(meta, edit(flex.read_metadata(meta)))
    return dst


@needs_data
def test_missing_moment_refused_by_name(tmp_path: Path) -> None:
    ck = _broken(tmp_path, lambda ts: {k: t for k, t in ts.items() if k != "lm_head.weight.moment2_0"})
    with pytest.raises(RefusedError, match=r"lm_head\.weight\.moment2_0"):
        flex_state.state_rewrites(ck, _new_weights("trainer_1rank", 3))


@needs_data
def test_moment_of_another_shape_refused_by_name(tmp_path: Path) -> None:
    from dataclasses import replace

    def edit(ts):
        k = "model.embed_tokens.weight.moment1_0"
        (sl,) = ts[k].slices
        return {**ts, k: replace(ts[k], shape=(125, 32), slices=(replace(sl, shape=(125, 32)),))}

    ck = _broken(tmp_path, edit)
    with pytest.raises(RefusedError, match=r"embed_tokens\.weight\.moment1_0 is float32 \[125, 32\]"):
        flex_state.state_rewrites(ck, _new_weights("trainer_1rank", 3))


@needs_data
def test_unknown_accumulator_refused_by_name(tmp_path: Path) -> None:
    from dataclasses import replace

    def edit(ts):
        t = ts["lm_head.weight.moment1_0"]
        k = "lm_head.weight.velocity_0"
        return {**ts, k: replace(t, name=k, slices=tuple(replace(sl, key=k) for sl in t.slices))}

    ck = _broken(tmp_path, edit)
    with pytest.raises(RefusedError, match=r"lm_head\.weight\.velocity_0"):
        flex_state.state_rewrites(ck, _new_weights("trainer_1rank", 3))


@needs_data
@pytest.mark.slow
def test_the_trainer_resumes_from_what_tietool_wrote(tmp_path: Path) -> None:
    """The end-to-end oracle: the real PaddleFormers Trainer (``support/trainer_resume.py``) resumes from
    trainer_1rank's checkpoint with the vocabulary grown to 256 by tietool, into a vocab-256 model; what it
    loaded equals what tietool wrote (weights, moments with zero new rows, beta pows), and one more step
    runs with a finite loss. The stale checkpoint (today's copy, old shapes) loads without the new rows."""
    from tests.support.trainer_resume import ResumeRun, grow_checkpoint, resume

    src = fx.DATA / "trainer_1rank" / "checkpoint-2"
    _, model_dir = grow_checkpoint(src, fx.DATA / "trainer_1rank" / "base", tmp_path / "g", 256)
    ck = tmp_path / "t" / "checkpoint-2"
    shutil.copytree(src, ck, ignore=shutil.ignore_patterns(*SUBS))
    _, want = _edit("trainer_1rank", 6, ck)
    ours, stale = resume([ResumeRun(ck, model_dir), ResumeRun(src, model_dir)])
    assert ours.ok, ours.error
    assert ours.losses and all(np.isfinite(ours.losses))
    assert sorted(ours.model) == sorted(want["model_state"])
    for k, w in want["model_state"].items():
        assert ours.model[k].tobytes() == w.tobytes(), k
    for k, w in want["optimizer_state"].items():
        assert ours.optimizer[k].tobytes() == w.tobytes(), k
    new_rows = want["model_state"][VOCAB[0]][250:]
    assert not stale.ok or stale.model[VOCAB[0]][250:].tobytes() != new_rows.tobytes()
