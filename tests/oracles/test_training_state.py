"""``resize`` / ``add-tokens --keep-training-state``: ``optimizer.pdopt`` resized with the vocabulary.

The oracle (slow): an ``optimizer.pdopt`` written by Paddle itself (``support/optim_worker.py``: AdamW on a
tiny PaddleFormers Llama, one step, ``paddle.save(opt.state_dict())``) resized with the model; Paddle then
loads it into AdamW of the resized model (``set_state_dict``) and trains one more step. The same folder with
the optimizer copied unchanged (what ``--keep-training-state`` did before) fails there: the test can fail.

Fast tests write optimizer files as ``paddle.save`` writes a state dict (tietool's pickle writer: arrays
at the top, ``LR_Scheduler``, ``StructuredToParameterName@@``) beside a PaddleFormers-written checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import paths
from support.adversarial_support import assert_refused, run_cli

import tietool
from tietool.surgery.io import pdparams, safetensors_io

LEGACY = paths.CASES_DIR / "pf_llama_untied_legacy_pdparams"


def arrays(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    infos, extras, _ = pdparams.read_header(path, path.name)
    return {t.name: np.array(pdparams.read_array(path, t)) for t in infos}, extras


def write_state_dict(path: Path, tensors: dict[str, np.ndarray], extras: dict) -> None:
    rows = [
        (n, a.dtype.name, a.shape, safetensors_io.Source(array=np.ascontiguousarray(a)), None, False)
        for n, a in tensors.items()
    ]
    pdparams.write_file(path, rows, extras)


def with_optimizer(tmp_path: Path, src: Path = LEGACY) -> tuple[Path, dict[str, np.ndarray]]:
    """A copy of ``src`` with an AdamW ``optimizer.pdopt`` for its parameters (random moments)."""
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    weights, extras = arrays(ck / "model_state.pdparams")
    rng = np.random.default_rng(0)
    state: dict[str, np.ndarray] = {}
    for name, pname in extras["StructuredToParameterName@@"].items():
        for acc in ("moment1", "moment2"):
            state[f"{pname}_{acc}_0"] = rng.standard_normal(weights[name].shape).astype(np.float32)
        for acc in ("beta1_pow_acc", "beta2_pow_acc"):
            state[f"{pname}_{acc}_0"] = np.array([0.9], dtype=np.float32)
    lr = {"last_epoch": 1, "last_lr": 0.000975}
    write_state_dict(
        ck / "optimizer.pdopt",
        state,
        {"LR_Scheduler": lr, "StructuredToParameterName@@": {k: k for k in state}},
    )
    return ck, state


def digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def check_resized(
    before: dict[str, np.ndarray], after: dict[str, np.ndarray], resized: set[str], old: int, new: int
) -> None:
    """Resized accumulators: the first rows bit for bit, new rows 0; every other one bit for bit."""
    assert set(before) == set(after)
    for k, a in before.items():
        b = after[k]
        if k in resized:
            assert b.shape == (new,) + a.shape[1:] and b.dtype == a.dtype, k
            keep = min(old, new)
            assert b[:keep].tobytes() == a[:keep].tobytes(), k
            assert not b[keep:].any(), k
        else:
            assert (b.dtype, b.shape, b.tobytes()) == (a.dtype, a.shape, a.tobytes()), k


# ------------------------------------------------------------------------------------------ resized
@pytest.mark.parametrize("vocab", [128, 90])
def test_resize_resizes_the_vocabulary_moments(tmp_path, vocab):
    ck, state = with_optimizer(tmp_path)
    rep = tietool.resize(ck, vocab, tmp_path / "out", keep_training_state=True, force=vocab < 100)
    after, extras = arrays(tmp_path / "out" / "optimizer.pdopt")
    vocab_params = {"embedding_0.w_0", "lm_head_0.w_0"}
    resized = {k for k in state if k.rsplit("_", 2)[0] in vocab_params and "moment" in k}
    assert len(resized) == 4
    check_resized(state, after, resized, 100, vocab)
    assert extras["LR_Scheduler"] == {"last_epoch": 1, "last_lr": 0.000975}
    assert sorted(rep["files"]["training_state_resized"]["optimizer.pdopt"]) == sorted(resized)
    assert rep["training_state_resized"] == rep["files"]["training_state_resized"]
    assert {"file": "optimizer.pdopt", "kept": True}.items() <= next(
        x for x in rep["left_out"] if x["file"] == "optimizer.pdopt"
    ).items()


def test_a_hidden_by_vocab_head_gets_new_columns(tmp_path):
    """PaddleNLP Llama's head is a Linear ``[hidden, vocab]``: its moments grow by columns."""
    ck, state = with_optimizer(tmp_path, paths.CASES_DIR / "pnlp_llama_untied")
    tietool.resize(ck, 128, tmp_path / "out", keep_training_state=True)
    after, _ = arrays(tmp_path / "out" / "optimizer.pdopt")
    for acc in ("moment1", "moment2"):
        a, b = state[f"llama_lm_head_0.w_0_{acc}_0"], after[f"llama_lm_head_0.w_0_{acc}_0"]
        assert a.shape == (16, 100) and b.shape == (16, 128)
        assert b[:, :100].tobytes() == a.tobytes() and not b[:, 100:].any()
        e = after[f"embedding_0.w_0_{acc}_0"]
        assert e.shape == (128, 16) and e[:100].tobytes() == state[f"embedding_0.w_0_{acc}_0"].tobytes()


def test_other_training_state_is_carried_and_unchanged_resize_keeps_it(tmp_path):
    ck, _ = with_optimizer(tmp_path)
    (ck / "trainer_state.json").write_text('{"global_step": 5}')
    (ck / "scheduler.pdparams").write_bytes(pickle.dumps({"last_epoch": 1}, protocol=4))
    tietool.resize(ck, 128, tmp_path / "out", keep_training_state=True)
    for f in ("trainer_state.json", "scheduler.pdparams"):
        assert (tmp_path / "out" / f).read_bytes() == (ck / f).read_bytes()
    tietool.resize(ck, 100, tmp_path / "same", keep_training_state=True)  # no shape changes: copied
    assert (tmp_path / "same" / "optimizer.pdopt").read_bytes() == (ck / "optimizer.pdopt").read_bytes()


def test_without_the_flag_the_optimizer_is_left_out(tmp_path):
    ck, _ = with_optimizer(tmp_path)
    rep = tietool.resize(ck, 128, tmp_path / "out")
    assert not (tmp_path / "out" / "optimizer.pdopt").exists()
    assert "training_state_resized" not in rep["files"]


def test_dry_run_plans_the_resize_and_writes_nothing(tmp_path):
    ck, _ = with_optimizer(tmp_path)
    (ck / "optimizer.tp00.pdopt").write_bytes(b"")
    before = digest(ck)
    run = run_cli(
        ["resize", ck, "--vocab", "128", "--out", tmp_path / "out", "--keep-training-state", "--dry-run"]
    )
    assert_refused(run, 5, ["optimizer.tp00.pdopt"], out=tmp_path / "out")
    assert digest(ck) == before


# ------------------------------------------------------------------------------------------ refusals
def refused(ck: Path, tmp_path: Path, *words: str) -> None:
    before = digest(ck)
    run = run_cli(["resize", ck, "--vocab", "128", "--out", tmp_path / "out", "--keep-training-state"])
    assert_refused(run, 5, list(words), out=tmp_path / "out")
    assert digest(ck) == before


@pytest.mark.parametrize(
    "name, words",
    [
        (
            "optimizer-00001-of-00001.safetensors",
            ["optimizer-00001-of-00001.safetensors", "unified-checkpoint"],
        ),
        ("master_weights-00001-of-00001.safetensors", ["master_weights-00001-of-00001.safetensors"]),
        ("optimizer.tp00.pdopt", ["optimizer.tp00.pdopt", "rank"]),
        ("optimizer.pt", ["optimizer.pt", "does not know"]),
        # torch's other suffixes (accelerate's save_state writes optimizer.bin): copied stale before
        ("optimizer.bin", ["optimizer.bin", "does not know"]),
        ("optimizer.pth", ["optimizer.pth", "does not know"]),
    ],
)
def test_refuses_an_optimizer_file_it_cannot_resize(tmp_path, name, words):
    ck, _ = with_optimizer(tmp_path)
    (ck / name).write_bytes(b"\0" * 16)
    refused(ck, tmp_path, *words)


def test_refuses_flex_optimizer_folders(tmp_path):
    ck, _ = with_optimizer(tmp_path)
    (ck / "optimizer_state").mkdir()
    (ck / "optimizer_state" / "0_0.distcp").write_bytes(b"\0" * 16)
    refused(ck, tmp_path, "optimizer_state/", "flex-checkpoint")


def test_refuses_a_flex_model_state_beside_the_weights(tmp_path):
    """A Trainer checkpoint-N/ with whole weights (save_hf_steps) and its flex ``model_state/`` (the weights
    at the old vocabulary, .distcp slices): --keep-training-state refuses it by name, as optimizer_state/."""
    ck, _ = with_optimizer(tmp_path)
    no_oracle = shutil.ignore_patterns("oracle*")
    shutil.copytree(paths.FLEX / "ranks2", ck / "model_state", ignore=no_oracle)
    refused(ck, tmp_path, "model_state/", "flex-checkpoint")


class _Named:
    """A tensor as ``paddle.save`` pickles a Tensor outside a plain state dict: ``tuple((name, array))``."""

    def __init__(self, name: str, a: np.ndarray):
        self.name, self.a = name, a

    def __reduce__(self):
        return (tuple, ((self.name, self.a),))


def test_the_master_weights_form_is_resized_and_written_back_in_it(tmp_path):
    """Tensors pickled as ``tuple((name, array))`` and a ``master_weights`` dict (what ``paddle.save``
    writes for mixed precision): moments resized (new rows 0), the master weight's new rows the new weight
    rows in float32, old ones bit for bit; the output pickles them the same way (names kept)."""
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
    rep = tietool.resize(ck, 128, tmp_path / "out", keep_training_state=True)
    assert "master_weights/embedding_0.w_0" in rep["files"]["training_state_resized"]["optimizer.pdopt"]
    f = tmp_path / "out" / "optimizer.pdopt"
    head = pdparams.read_optimizer_header(f, f.name)
    after = {t.name: np.asarray(pdparams.read_array(f, t)) for t in head.tensors}
    vocab = ("embedding_0.w_0_fp32_master_0_moment", "lm_head_0.w_0_fp32_master_0_moment")
    check_resized(mp, after, {k for k in mp if k.startswith(vocab)}, 100, 128)
    assert head.names == {
        **{k: k for k in mp},
        **{"master_weights/" + k: k + "_fp32_master_0" for k in master},
    }
    assert head.extras == {"master_weights": None, "LR_Scheduler": {"last_epoch": 3}}
    got = {t.name: np.asarray(pdparams.read_array(f, t)) for t in head.master}
    new_w, _ = arrays(tmp_path / "out" / "model_state.pdparams")
    emb = got["embedding_0.w_0"]
    assert emb.shape == (128, 16) and emb[:100].tobytes() == master["embedding_0.w_0"].tobytes()
    assert emb[100:].tobytes() == new_w["model.embed_tokens.weight"][100:].tobytes()
    assert got["linear_0.w_0"].tobytes() == master["linear_0.w_0"].tobytes()


def test_refuses_arrays_outside_master_weights(tmp_path):
    ck, state = with_optimizer(tmp_path)
    obj: dict = dict(state)
    obj["LR_Scheduler"] = {"hidden": state["embedding_0.w_0_moment1_0"]}
    (ck / "optimizer.pdopt").write_bytes(pickle.dumps(obj, protocol=4))
    before = digest(ck)
    run = run_cli(["resize", ck, "--vocab", "128", "--out", tmp_path / "out", "--keep-training-state"])
    assert_refused(run, 3, ["optimizer.pdopt", "LR_Scheduler"], out=tmp_path / "out")
    assert digest(ck) == before


def test_refuses_an_accumulator_of_another_shape(tmp_path):
    ck, state = with_optimizer(tmp_path)
    state["embedding_0.w_0_moment1_0"] = state["embedding_0.w_0_moment1_0"][:50]
    write_state_dict(ck / "optimizer.pdopt", state, {})
    refused(ck, tmp_path, "embedding_0.w_0_moment1_0", "not shaped as model.embed_tokens.weight")


def test_refuses_a_safetensors_checkpoint_with_no_parameter_names(tmp_path):
    ck, _ = with_optimizer(tmp_path)
    st = tmp_path / "st"
    tietool.convert(ck, "safetensors", st)
    shutil.copy(ck / "optimizer.pdopt", st)
    refused(st, tmp_path, "StructuredToParameterName@@", "model.embed_tokens.weight")


# ------------------------------------------------------------------------------------------ the oracle
@pytest.mark.slow
def test_paddle_resumes_from_the_resized_optimizer(tmp_path):
    """Paddle's own AdamW state (one step) resized with the model: Paddle loads it into AdamW of the resized
    model and trains on; the unchanged copy fails (Paddle: shape not match). The bf16 model's
    multi-precision state (master weights, the tuple form): Paddle loads it into multi_precision AdamW of the
    resized bf16 model with every accumulator and master weight shaped as its parameter (no step: CPU has
    no bf16 matmul)."""
    from support import optim_worker

    optim_worker.run("build", str(tmp_path))
    src = tmp_path / "fp32"
    state, _ = arrays(src / "optimizer.pdopt")
    tietool.resize(src, 64, tmp_path / "r64", keep_training_state=True)
    tietool.resize(src, 56, tmp_path / "r56", keep_training_state=True, force=True)
    stale = tmp_path / "stale"
    shutil.copytree(tmp_path / "r64", stale)
    shutil.copy(src / "optimizer.pdopt", stale)
    for out, new in (("r64", 64), ("r56", 56)):
        after, _ = arrays(tmp_path / out / "optimizer.pdopt")
        resized = {k for k in state if k.startswith(("embedding_0.w_0_moment", "lm_head_0.w_0_moment"))}
        check_resized(state, after, resized, optim_worker.VOCAB, new)
    tietool.resize(tmp_path / "bf16", 64, tmp_path / "b64", keep_training_state=True)
    rep = tietool.resize(tmp_path / "tied", 64, tmp_path / "t64", keep_training_state=True)
    assert [d["name"] for d in rep["dropped"]] == ["lm_head.weight"]  # the duplicate head (same parameter)
    jobs = [str(tmp_path / n) for n in ("r64", "r56", "stale", "b64", "t64")]
    (tmp_path / "jobs.json").write_text(json.dumps([[j, j.endswith("b64")] for j in jobs]))
    optim_worker.run("resume", str(tmp_path / "jobs.json"), str(tmp_path / "res.json"))
    res = json.loads((tmp_path / "res.json").read_text())
    for j in jobs[:2] + jobs[4:]:
        assert res[j]["ok"], res[j]["error"]
        assert res[j]["shapes"]["embedding_0.w_0:moment1"] == res[j]["params"]["embedding_0.w_0"]
        assert np.isfinite(res[j]["loss"])
    assert not res[jobs[2]]["ok"] and "shape" in res[jobs[2]]["error"].lower()
    b64 = res[jobs[3]]
    assert b64["ok"], b64["error"]
    assert b64["master"]["embedding_0.w_0"] == b64["params"]["embedding_0.w_0"] == [64, 32]


def test_add_tokens_resizes_the_moments_too(tmp_path, monkeypatch):
    """add-tokens grows the tables past the checkpoint's rows: the moments grow with them (a tokenizer
    edit stands in for the tokenizer half, as in test_add_tokens.py)."""
    import types

    from tietool.surgery import ops
    from tietool.surgery.model.tokens import NewToken, TokenEdit

    def edit(folder, strings, special=False):
        toks = tuple(NewToken(s, 100 + i, special, False, (1, 2)) for i, s in enumerate(strings))
        return TokenEdit(100, 100 + len(toks), toks, files={"tokenizer.json": b"{}"})

    monkeypatch.setattr(ops, "_tokenizer_edit", lambda: types.SimpleNamespace(add_tokens_edit=edit))
    ck, state = with_optimizer(tmp_path)
    ops.add_tokens(ck, ["<a>", "<b>", "<c>"], tmp_path / "out", seed=0, keep_training_state=True)
    weights, _ = arrays(tmp_path / "out" / "model_state.pdparams")
    rows = weights["model.embed_tokens.weight"].shape[0]
    assert rows >= 103
    after, _ = arrays(tmp_path / "out" / "optimizer.pdopt")
    resized = {k for k in state if k.startswith(("embedding_0.w_0_moment", "lm_head_0.w_0_moment"))}
    check_resized(state, after, resized, 100, rows)


def _slack_edit(monkeypatch, start: int) -> None:
    """add-tokens' tokenizer half replaced by an edit giving new tokens ids from ``start`` (as in
    test_add_tokens.py): below the checkpoint's rows, they take slack rows."""
    import types

    from tietool.surgery import ops
    from tietool.surgery.model.tokens import NewToken, TokenEdit

    def edit(folder, strings, special=False):
        toks = tuple(NewToken(s, start + i, special, False, (1, 2)) for i, s in enumerate(strings))
        return TokenEdit(start, start + len(toks), toks, files={"tokenizer.json": b"{}"})

    monkeypatch.setattr(ops, "_tokenizer_edit", lambda: types.SimpleNamespace(add_tokens_edit=edit))


def test_add_tokens_into_slack_rows_resets_their_moments(tmp_path, monkeypatch):
    """Two tokens take slack rows 90, 91 of the 100 (no growth): their moments are reset to zero (they held
    the statistics of whatever trained those rows), every other entry bit for bit, shapes unchanged; the
    report's notes say so."""
    from tietool.surgery import ops

    _slack_edit(monkeypatch, 90)
    ck, state = with_optimizer(tmp_path)
    rep = ops.add_tokens(ck, ["<a>", "<b>"], tmp_path / "out", seed=0, keep_training_state=True)
    weights, _ = arrays(tmp_path / "out" / "model_state.pdparams")
    assert weights["model.embed_tokens.weight"].shape[0] == 100
    after, _ = arrays(tmp_path / "out" / "optimizer.pdopt")
    vocab = ("embedding_0.w_0_moment", "lm_head_0.w_0_moment")
    assert set(after) == set(state)
    for k, a in state.items():
        b = after[k]
        assert b.shape == a.shape and b.dtype == a.dtype, k
        if k.startswith(vocab):
            assert not b[90:92].any(), k
            assert b[:90].tobytes() == a[:90].tobytes() and b[92:].tobytes() == a[92:].tobytes(), k
        else:
            assert b.tobytes() == a.tobytes(), k
    assert any("rows 90..91" in n and "reset to zero" in n for n in rep["notes"]), rep["notes"]


def test_slack_rows_master_weights_take_the_new_values(tmp_path, monkeypatch):
    """The mixed-precision form: the master weight's slack rows 90, 91 become the new weight rows (fp32),
    its other rows bit for bit; the moments of those rows zero."""
    from tietool.surgery import ops

    _slack_edit(monkeypatch, 90)
    ck, state = with_optimizer(tmp_path)
    weights, _ = arrays(ck / "model_state.pdparams")
    master = {"embedding_0.w_0": weights["model.embed_tokens.weight"] + 1}
    mp = {k.replace("w_0_", "w_0_fp32_master_0_"): v for k, v in state.items()}
    obj: dict = {k: _Named(k, v) for k, v in mp.items()}
    obj["master_weights"] = {k: _Named(k + "_fp32_master_0", v) for k, v in master.items()}
    (ck / "optimizer.pdopt").write_bytes(pickle.dumps(obj, protocol=4))
    ops.add_tokens(ck, ["<a>", "<b>"], tmp_path / "out", seed=0, keep_training_state=True)
    f = tmp_path / "out" / "optimizer.pdopt"
    head = pdparams.read_optimizer_header(f, f.name)
    got = {t.name: np.asarray(pdparams.read_array(f, t)) for t in head.master}["embedding_0.w_0"]
    new_w, _ = arrays(tmp_path / "out" / "model_state.pdparams")
    old = master["embedding_0.w_0"]
    assert got.shape == old.shape
    assert got[:90].tobytes() == old[:90].tobytes() and got[92:].tobytes() == old[92:].tobytes()
    assert got[90:92].tobytes() == new_w["model.embed_tokens.weight"][90:92].tobytes()
    assert not np.array_equal(got[90:92], old[90:92])
    moments = {t.name: np.asarray(pdparams.read_array(f, t)) for t in head.tensors}
    assert not moments["embedding_0.w_0_fp32_master_0_moment1_0"][90:92].any()
