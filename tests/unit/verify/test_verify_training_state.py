"""``verify`` of ``resize`` / ``add-tokens --keep-training-state`` outputs: the optimizer state checked
against its contract, entry by entry.

``optimizer.pdopt`` (read by the allow-list walker, never unpickled) beside a PaddleFormers-written
checkpoint (``test_training_state.with_optimizer``; the mixed-precision form with ``master_weights`` as
``paddle.save`` pickles it), and the real PaddleFormers 1.2 Trainer flex checkpoints of ``tests/data/flex``
(trainer_2rank: slices of two ranks; trainer_bf16_layout: bf16 weights with fp32 master weights;
trainer_tied: the tied parameter's state under the head's name, add-tokens into slack rows whose moments
are reset). Right outputs exit 0 with every entry checked; one flipped element of a moment, a master weight
off by one ulp, a changed beta pow, a missing entry exit 7 naming the entry.
"""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support import flex_support as fx
from support.adversarial_support import run_cli
from test_training_state import _Named, arrays, with_optimizer

import tietool
from tietool.surgery.io import flex, flex_write, pdparams, safetensors_io
from tietool.surgery.verify import verify

needs_data = pytest.mark.skipif(
    not (fx.DATA / "trainer_1rank").is_dir(), reason="tests/data/flex not present"
)


def _ok(a: Path, b: Path) -> dict:
    res = verify(a, b)
    assert res.exit_code == 0, res.unexplained
    d = res.as_dict()
    assert d["training_state"] and all(e["equal"] for e in d["training_state"])
    return d


def _unexplained(a: Path, b: Path, *words: str) -> list[str]:
    res = verify(a, b)
    assert res.exit_code == 7, res.as_dict()
    hit = [u for u in res.unexplained if all(w in u for w in words)]
    assert hit, (words, res.unexplained)
    return res.unexplained


def _forge_pdopt(path: Path, edit: Callable[[str, np.ndarray], np.ndarray], master: bool = False) -> None:
    """Rewrite ``optimizer.pdopt`` with each accumulator (or master weight) passed through ``edit``."""
    head = pdparams.read_optimizer_header(path, path.name)

    def rows(ts, is_master):
        for t in ts:
            a = np.array(pdparams.read_array(path, t))
            if is_master == master:
                a = edit(t.name, a)
            yield t.name, t.dtype, a.shape, safetensors_io.Source(array=np.ascontiguousarray(a)), None, False

    tmp = path.with_suffix(".forged")
    pdparams.write_optimizer_file(
        tmp, rows(head.tensors, False), rows(head.master, True), head.names, head.extras, head.np_module
    )
    tmp.replace(path)


def _flip(key: str, row: int) -> Callable[[str, np.ndarray], np.ndarray]:
    def edit(name: str, a: np.ndarray) -> np.ndarray:
        if name == key:
            a.view(np.uint32)[row, 3] ^= 1 << 30
        return a

    return edit


# ------------------------------------------------------------------ optimizer.pdopt


@pytest.mark.parametrize("rows", [128, 64])
def test_pdopt_resize_verifies(tmp_path: Path, rows: int) -> None:
    """Grown and trimmed: every accumulator checked, the vocabulary ones resized with their weight."""
    ck, state = with_optimizer(tmp_path)
    tietool.resize(ck, rows, tmp_path / "out", keep_training_state=True, force=rows < 100)
    d = _ok(ck, tmp_path / "out")
    resized = {e["key"] for e in d["training_state"] if e["rule"] != "unchanged"}
    assert resized == {
        f"{p}_{m}_0" for p in ("embedding_0.w_0", "lm_head_0.w_0") for m in ("moment1", "moment2")
    }
    assert len(d["training_state"]) == len(state)


@pytest.mark.parametrize(
    ("key", "row"),
    [("embedding_0.w_0_moment1_0", 7), ("lm_head_0.w_0_moment2_0", 120), ("linear_0.w_0_moment1_0", 0)],
)
def test_pdopt_flipped_moment_is_unexplained(tmp_path: Path, key: str, row: int) -> None:
    """One flipped element of a moment: an old row of a resized one, a new row (must be zero), a moment of a
    weight that did not move."""
    ck, _ = with_optimizer(tmp_path)
    out = tmp_path / "out"
    tietool.resize(ck, 128, out, keep_training_state=True)
    _forge_pdopt(out / "optimizer.pdopt", _flip(key, row % 16 if key.startswith("linear") else row))
    _unexplained(ck, out, "optimizer.pdopt", key, "1 ")


def test_pdopt_beta_pow_changed_is_unexplained(tmp_path: Path) -> None:
    ck, _ = with_optimizer(tmp_path)
    out = tmp_path / "out"
    tietool.resize(ck, 128, out, keep_training_state=True)
    key = "embedding_0.w_0_beta1_pow_acc_0"
    _forge_pdopt(out / "optimizer.pdopt", lambda n, a: a * np.float32(0.5) if n == key else a)
    _unexplained(ck, out, key, "unchanged")


def _mixed_precision(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """``with_optimizer``'s checkpoint with the optimizer in the mixed-precision form: accumulators
    ``..._fp32_master_0_...`` and ``master_weights`` (as ``paddle.save`` pickles them)."""
    ck, state = with_optimizer(tmp_path)
    weights, _ = arrays(ck / "model_state.pdparams")
    master = {
        "embedding_0.w_0": weights["model.embed_tokens.weight"] + 1,
        "linear_0.w_0": weights["model.layers.0.self_attn.q_proj.weight"],
    }
    mp = {k.replace("w_0_", "w_0_fp32_master_0_"): v for k, v in state.items()}
    obj: dict = {k: _Named(k, v) for k, v in mp.items()}
    obj["master_weights"] = {k: _Named(k + "_fp32_master_0", v) for k, v in master.items()}
    obj["LR_Scheduler"] = {"last_epoch": 3}
    (ck / "optimizer.pdopt").write_bytes(pickle.dumps(obj, protocol=4))
    return ck, master


def test_pdopt_master_weights_verify(tmp_path: Path) -> None:
    """The master weight's old rows its own (not the weight's: it is the weight + 1 here), its new rows the
    float32 of the output's new weight rows: exit 0; both checked."""
    ck, _ = _mixed_precision(tmp_path)
    tietool.resize(ck, 128, tmp_path / "out", keep_training_state=True)
    d = _ok(ck, tmp_path / "out")
    rules = {e["key"]: e["rule"] for e in d["training_state"]}
    assert "float32 of the output's weight" in rules["embedding_0.w_0"]
    assert rules["linear_0.w_0"] == "unchanged"


@pytest.mark.parametrize("row", [3, 110])
def test_pdopt_master_weight_off_by_one_ulp_is_unexplained(tmp_path: Path, row: int) -> None:
    ck, _ = _mixed_precision(tmp_path)
    out = tmp_path / "out"
    tietool.resize(ck, 128, out, keep_training_state=True)

    def edit(name: str, a: np.ndarray) -> np.ndarray:
        if name == "embedding_0.w_0":
            a[row, 5] = np.nextafter(a[row, 5], np.float32(np.inf))
        return a

    _forge_pdopt(out / "optimizer.pdopt", edit, master=True)
    _unexplained(ck, out, "optimizer.pdopt", "embedding_0.w_0", f"rows differ ({row})")


def test_pdopt_missing_accumulator_is_unexplained(tmp_path: Path) -> None:
    ck, state = with_optimizer(tmp_path)
    out = tmp_path / "out"
    tietool.resize(ck, 128, out, keep_training_state=True)
    f = out / "optimizer.pdopt"
    head = pdparams.read_optimizer_header(f, f.name)
    keep = [t for t in head.tensors if t.name != "linear_1.w_0_moment2_0"]
    rows = [
        (
            t.name,
            t.dtype,
            t.shape,
            safetensors_io.Source(array=np.array(pdparams.read_array(f, t))),
            None,
            False,
        )
        for t in keep
    ]
    g = tmp_path / "forged.pdopt"
    pdparams.write_optimizer_file(g, rows, [], head.names, head.extras, head.np_module)
    g.replace(f)
    _unexplained(ck, out, "linear_1.w_0_moment2_0", "not in the output")


def test_pdopt_copied_unresized_is_unexplained(tmp_path: Path) -> None:
    """The input's optimizer.pdopt copied into a resized output as it was (moments at the old shape)."""
    ck, _ = with_optimizer(tmp_path)
    out = tmp_path / "out"
    tietool.resize(ck, 128, out)
    shutil.copy2(ck / "optimizer.pdopt", out / "optimizer.pdopt")
    _unexplained(ck, out, "embedding_0.w_0_moment1_0", "[100, 16] where float32 [128, 16] is expected")


def test_scheduler_changed_is_unexplained(tmp_path: Path) -> None:
    ck, _ = with_optimizer(tmp_path)
    shutil.copy2(ck / "optimizer.pdopt", ck / "scheduler.pdparams")
    out = tmp_path / "out"
    tietool.resize(ck, 128, out, keep_training_state=True)
    (out / "scheduler.pdparams").write_bytes(b"x" + (out / "scheduler.pdparams").read_bytes()[1:])
    _unexplained(ck, out, "scheduler.pdparams", "differs")


# ------------------------------------------------------------------ Trainer flex checkpoints

CKPTS = {
    "trainer_2rank": "checkpoint-2",
    "trainer_bf16_layout": "checkpoint-1",
    "trainer_tied": "checkpoint-2",
}


def _trainer(name: str, tmp: Path) -> Path:
    """A copy of fixture ``name``'s checkpoint with its model's config.json."""
    dst = tmp / name / CKPTS[name]
    shutil.copytree(fx.DATA / name / CKPTS[name], dst)
    base = fx.DATA / name / "base" / "config.json"
    shutil.copy2(base if base.is_file() else fx.DATA / "trainer_1rank" / "base" / "config.json", dst)
    return dst


def _forge_flex(folder: Path, key: str, edit: Callable[[np.ndarray], None]) -> None:
    """Rewrite tensor ``key`` of flex folder ``folder`` (``optimizer_state``, ...) through ``edit``."""
    from tietool.surgery.plan.flex_state import full_tensor

    ck = flex.open_flex(flex.FlexFolder(folder.parent, folder, ()))
    a = np.array(full_tensor(ck, key))
    edit(a)
    tmp = folder.with_name(folder.name + ".forged")
    tmp.mkdir()
    flex_write.rewrite_folder(folder, tmp, ck.metadata, ck.tensors, {key: (ck.tensors[key].dtype, a)})
    shutil.rmtree(folder)
    tmp.rename(folder)


@needs_data
@pytest.mark.parametrize(
    ("name", "args", "resized"),
    [
        ("trainer_2rank", ("resize", "--vocab", "256"), 4),
        ("trainer_bf16_layout", ("resize", "--vocab", "256"), 6),
        ("trainer_bf16_layout", ("resize", "--vocab", "240", "--force"), 6),
        ("trainer_tied", ("add-tokens", "<q1>", "<q2>"), 2),
    ],
)
def test_flex_keep_training_state_verifies(
    tmp_path: Path, name: str, args: tuple[str, ...], resized: int
) -> None:
    """Grown, trimmed, and add-tokens into a tied model's slack rows (its moments reset): exit 0, every
    optimizer_state / master_weight entry checked slice by slice; the resized ones as many as the run's
    report lists (moments; master weights of the bf16 model)."""
    src = _trainer(name, tmp_path)
    out = tmp_path / "out"
    op, *rest = args
    r = run_cli([op, str(src), *rest, "--keep-training-state", "--out", str(out)])
    assert r.rc == 0, r
    d = _ok(src, out)
    moved = [e for e in d["training_state"] if e["rule"] != "unchanged"]
    assert len(moved) == resized, moved
    r = run_cli(["verify", str(src), str(out)])
    assert r.rc == 0 and "training state:" in r.stdout, r
    # one run, checked on the view rebuilt from the checkpoint: said so, never "a chain of 1 runs"
    assert "not recomputed on a view rebuilt from the input" in r.stdout, r
    assert "chain of 1" not in r.stdout, r


@needs_data
@pytest.mark.parametrize(
    ("sub", "key", "what"),
    [
        ("optimizer_state", "model.embed_tokens.weight.moment1_0", "flip"),
        ("optimizer_state", "lm_head.weight.moment2_0", "new"),
        ("optimizer_state", "lm_head.weight.beta2_pow_acc_0", "beta"),
        ("master_weight", "model.embed_tokens.weight.w_0", "ulp"),
        ("master_weight", "lm_head.weight.w_0", "ulp-new"),
    ],
)
def test_flex_forged_state_is_unexplained(tmp_path: Path, sub: str, key: str, what: str) -> None:
    """One flipped element of a moment (old row; a new row, which must be zero), a changed beta pow, a
    master weight off by one ulp (old row; a new row, which must be the fp32 of the new weight): exit 7
    naming the folder and key."""
    src = _trainer("trainer_bf16_layout", tmp_path)
    out = tmp_path / "out"
    tietool.resize(src, 256, out, keep_training_state=True)

    def edit(a: np.ndarray) -> None:
        if what == "beta":
            a[...] = a * np.float32(0.5)
        elif what.startswith("ulp"):
            r = 252 if what == "ulp-new" else 4
            a[r, 1] = np.nextafter(a[r, 1], np.float32(np.inf))
        else:
            r = 253 if what == "new" else 10
            a.view(np.uint32)[r, 2] ^= 1 << 30

    _forge_flex(out / sub, key, edit)
    _unexplained(src, out, f"{sub}/", key)
