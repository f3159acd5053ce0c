"""``tietool merge`` applies the tie check ``inspect`` and ``tie`` make (config flag vs head values vs head
presence) to every kind of merge: tensor-parallel rank files (``tests/data/tp_ranks``, cut from PaddleFormers
1.2 checkpoints by the library's own split functions), expert-parallel ones (the d06 / e10 cases' files) and
flex checkpoints (``support.flex_support.write_flex``: the pickles paddle writes).

* a head that differs from the embedding under a tied flag is kept bit for bit and every tie flag set false,
  said on the terminal naming the head and the flag;
* an untied flag with no head in the files is refused (exit 5) naming both, nothing written;
* anything else leaves the config as it was.

The slow test loads the merged e02 output in PaddleFormers 1.2 (``from_pretrained``) and compares its logits
with the trained model's, computed with the trained head.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import flex_support, paths, preload
from support.adversarial_support import assert_refused, run_cli

from tietool.surgery.io import pdparams, safetensors_io
from tietool.surgery.plan.merge_tie import TieFix

TP = paths.DATA / "tp_ranks"
E02 = paths.BUG_CASES_DIR / "e02_flex_tied_config_head_trained_apart" / "ckpt"
E10 = paths.BUG_CASES_DIR / "e10_ernie45_moe_expert_parallel_rank_files" / "ckpt"
D06 = paths.BUG_CASES_DIR / "d06_expert_parallel_rank_files" / "ckpt"


def tensors(folder: Path) -> dict[str, np.ndarray]:
    """name → array (storage dtype) of every tensor in a folder's weight files."""
    out = {}
    for f in sorted(folder.glob("*.pdparams")):
        infos, _, _ = pdparams.read_header(f, f.name)
        out.update({t.name: np.array(pdparams.read_array(f, t)) for t in infos})
    for f in sorted(folder.glob("*.safetensors")):
        infos, _ = safetensors_io.read_header(f, f.name)
        out.update({t.name: np.array(safetensors_io.read_array(f, t)) for t in infos})
    return out


def with_config(src: Path, dst: Path, **changes) -> Path:
    """A copy of folder ``src`` whose config.json has ``changes`` (None: the key removed)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def without(folder: Path, name: str) -> None:
    """Remove tensor ``name`` from every ``.pdparams`` rank file of ``folder`` (as paddle.save writes)."""
    for f in sorted(folder.glob("*.pdparams")):
        infos, _, _ = pdparams.read_header(f, f.name)
        keep = {t.name: np.array(pdparams.read_array(f, t)) for t in infos if t.name != name}
        rows = [
            (n, a.dtype.name, a.shape, safetensors_io.Source(array=np.ascontiguousarray(a)), None, False)
            for n, a in keep.items()
        ]
        pdparams.write_file(f, rows, {})


def merged_ok(src: Path, out: Path) -> tuple[dict, str]:
    """Merge ``src`` into ``out`` through the CLI (exit 0): the report and the terminal text."""
    run = run_cli(["merge", src, "--out", out])
    assert run.rc == 0, run.describe()
    return json.loads((out / "tietool-report.json").read_text()), run.stdout + run.stderr


def said_untied(text: str, head: str = "lm_head.weight") -> None:
    """The terminal names the head and the flag it set false."""
    line = next(ln for ln in text.splitlines() if ln.startswith("warning:") and head in ln)
    assert "tie_word_embeddings" in line and "kept" in line, text


# ------------------------------------------------------------------------------------------ rank files
@pytest.mark.parametrize("variant", ["llama_fp32", "llama_bf16", "llama_fused_fp32", "qwen2_bf16"])
def test_rank_files_tied_flag_head_trained_apart_kept_and_untied(tmp_path, variant):
    """Tensor-parallel rank files of an untied model (head [vocab, hidden] or PaddleNLP's [hidden, vocab],
    split on its vocabulary axis) under a config saying tied: the head is kept bit for bit as the unsplit
    original's and tie_word_embeddings set false, said on the terminal."""
    src = with_config(TP / variant / "tp2", tmp_path / "ranks", tie_word_embeddings=True)
    rep, text = merged_ok(src, tmp_path / "out")
    original = tensors(TP / variant / "original")
    head = next(n for n in original if n.endswith("lm_head.weight"))
    got = tensors(tmp_path / "out")
    assert got[head].tobytes() == original[head].tobytes() and got[head].shape == original[head].shape
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    assert rep["config_changes"]["tie_word_embeddings"] == [True, False]
    assert rep["tie"]["head"] == head and rep["tie"]["differing_rows"] > 0
    said_untied(text, head)


def test_rank_files_untied_flag_without_a_head_refused(tmp_path):
    """Untied (the config, or Llama's default when the key is absent) with no head in any rank file: a
    loader would build a random head, so merge refuses naming the head and the flag."""
    for flag in (False, None):
        src = with_config(TP / "llama_fp32" / "tp2", tmp_path / f"ranks-{flag}", tie_word_embeddings=flag)
        without(src, "lm_head.weight")
        before = {p.name: p.read_bytes() for p in src.iterdir()}
        run = run_cli(["merge", src, "--out", tmp_path / f"out-{flag}"])
        assert_refused(run, 5, ["lm_head.weight", "tie_word_embeddings", "random head"], out=tmp_path / "out")
        assert not (tmp_path / f"out-{flag}").exists()
        assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_rank_files_tied_without_a_head_and_untied_with_one_unchanged(tmp_path):
    """A tied flag with no head (the loader ties), and the untied originals (a head, flag false): the
    config is written as it was, and the report has no tie fix."""
    src = with_config(TP / "llama_fp32" / "tp2", tmp_path / "tied", tie_word_embeddings=True)
    without(src, "lm_head.weight")
    rep, text = merged_ok(src, tmp_path / "out-tied")
    assert json.loads((tmp_path / "out-tied" / "config.json").read_text())["tie_word_embeddings"] is True
    assert rep["tie"] is None and "warning:" not in text
    rep, _ = merged_ok(TP / "llama_fp32" / "tp2", tmp_path / "out-untied")
    assert rep["tie"] is None and "tie_word_embeddings" not in rep["config_changes"]


def test_rank_files_tied_and_equal_head_keeps_the_flag(tmp_path):
    """A head equal to the embedding bit for bit under a tied flag (a tied model saved with its head):
    nothing changes."""
    src = tmp_path / "ranks"
    shutil.copytree(TP / "llama_fp32" / "tp2", src)
    for f in sorted(src.glob("*.pdparams")):
        a = {t.name: np.array(pdparams.read_array(f, t)) for t in pdparams.read_header(f, f.name)[0]}
        a["lm_head.weight"] = a["model.embed_tokens.weight"].copy()
        rows = [(n, x.dtype.name, x.shape, safetensors_io.Source(array=x), None, False) for n, x in a.items()]
        pdparams.write_file(f, rows, {})
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    rep, _ = merged_ok(src, tmp_path / "out")
    assert rep["tie"] is None
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is True


# ------------------------------------------------------------------------------------------ expert-parallel
def test_expert_rank_files_tied_flag_head_trained_apart(tmp_path):
    """d06's Qwen3-MoE rank files (a head of its own) under a tied flag: head kept, flag set false."""
    src = with_config(D06, tmp_path / "ranks", tie_word_embeddings=True)
    rep, text = merged_ok(src, tmp_path / "out")
    a = tensors(D06)  # both files hold the same head
    assert tensors(tmp_path / "out")["lm_head.weight"].tobytes() == a["lm_head.weight"].tobytes()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    assert rep["expert_parallel"] == 2 and rep["tie"]["flags"] == {"tie_word_embeddings": [True, False]}
    said_untied(text)


def test_expert_rank_files_untied_without_a_head_refused(tmp_path):
    """e10's ERNIE-4.5-MoE (tied, no head in the files) with the flag set false: refused by name."""
    src = with_config(E10, tmp_path / "ranks", tie_word_embeddings=False)
    run = run_cli(["merge", src, "--out", tmp_path / "out"])
    assert_refused(run, 5, ["lm_head.weight", "tie_word_embeddings"], out=tmp_path / "out")
    rep, _ = merged_ok(E10, tmp_path / "out-tied")  # as saved (tied): merged, the flag kept
    assert rep["tie"] is None
    assert json.loads((tmp_path / "out-tied" / "config.json").read_text())["tie_word_embeddings"] is True


# ------------------------------------------------------------------------------------------ flex
def flex_ckpt(folder: Path, state: dict, **config) -> Path:
    """``state`` as a 2-rank flex checkpoint with a Llama config.json (``config`` over it)."""
    flex_support.write_flex(folder, state)
    (folder / "config.json").write_text(json.dumps({**flex_support.LLAMA, **config}))
    return folder


def test_flex_tied_flag_head_trained_apart_kept_and_untied(tmp_path):
    """A flex checkpoint of an untied Llama under a tied flag: converted to the PaddleFormers layout as
    always, the head kept bit for bit, tie_word_embeddings set false (also in a dry run's report)."""
    state = flex_support.llama_state()
    src = flex_ckpt(tmp_path / "ckpt", state, tie_word_embeddings=True)
    dry = run_cli(["merge", src, "--out", tmp_path / "dry", "--dry-run", "--json"])
    assert dry.rc == 0 and json.loads(dry.stdout)["tie"]["head"] == "lm_head.weight", dry.describe()
    rep, text = merged_ok(src, tmp_path / "out")
    got = tensors(tmp_path / "out")
    assert got["lm_head.weight"].tobytes() == state["lm_head.weight"].tobytes()
    assert got["model.embed_tokens.weight"].tobytes() == state["model.embed_tokens.weight"].tobytes()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert got[q].tobytes() == state[q].T.tobytes()  # the conversion still runs
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    assert rep["tie"]["flags"] == {"tie_word_embeddings": [True, False]}
    said_untied(text)


def test_flex_untied_flag_without_a_head_refused_and_tied_equal_kept(tmp_path):
    """Flex: an untied flag and no lm_head.weight is refused naming both; a tied flag with a head equal to
    the embedding (the Trainer's copy of a tied parameter) keeps the flag."""
    state = flex_support.llama_state()
    headless = {k: v for k, v in state.items() if k != "lm_head.weight"}
    src = flex_ckpt(tmp_path / "headless", headless)
    run = run_cli(["merge", src, "--out", tmp_path / "out"])
    assert_refused(run, 5, ["lm_head.weight", "tie_word_embeddings"], out=tmp_path / "out")
    equal = {**state, "lm_head.weight": state["model.embed_tokens.weight"].copy()}
    rep, text = merged_ok(flex_ckpt(tmp_path / "equal", equal, tie_word_embeddings=True), tmp_path / "o2")
    assert rep["tie"] is None and "warning: lm_head" not in text
    assert json.loads((tmp_path / "o2" / "config.json").read_text())["tie_word_embeddings"] is True


FLEX_TRAINER = paths.FLEX / "trainer_2rank"


@pytest.mark.skipif(not FLEX_TRAINER.is_dir(), reason="tests/data/flex/trainer_2rank not present")
def test_real_trainer_checkpoint_under_a_tied_flag(tmp_path):
    """The real PaddleFormers Trainer's 2-rank checkpoint-2/ of an untied Llama (tests/data/flex) with the
    base model's config.json edited to say tied: the head is Paddle's load_state_dict oracle's bit for bit,
    tie_word_embeddings false, said; the flag as saved (false) is left alone."""
    ck = tmp_path / "checkpoint-2"
    shutil.copytree(FLEX_TRAINER / "checkpoint-2", ck)
    cfg = json.loads((FLEX_TRAINER.parent / "trainer_1rank" / "base" / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    rep, text = merged_ok(ck, tmp_path / "out")
    with np.load(FLEX_TRAINER / "oracle.npz") as z:
        head = z["lm_head.weight"]
    assert tensors(tmp_path / "out")["lm_head.weight"].tobytes() == np.ascontiguousarray(head).tobytes()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    said_untied(text)
    (ck / "config.json").write_text(json.dumps(cfg))
    rep, _ = merged_ok(ck, tmp_path / "out-as-saved")
    assert rep["tie"] is None and "tie_word_embeddings" not in rep["config_changes"]


def test_e02_case_head_kept_flag_false(tmp_path):
    """The e02 Trainer checkpoint (Qwen3, tied config, head trained apart in rows 3 and 7): the merged head is
    the trained one bit for bit, the flag false, the Linear weights transposed."""
    rep, text = merged_ok(E02, tmp_path / "out")
    got = tensors(tmp_path / "out")
    assert rep["tie"]["differing_rows"] == 2
    emb, head = got["model.embed_tokens.weight"], got["lm_head.weight"]
    assert sorted(np.nonzero((emb != head).any(axis=1))[0].tolist()) == [3, 7]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    said_untied(text)


def test_tiefix_config_sets_every_flag_false_nested_too():
    """:meth:`TieFix.config` sets a nested text config's flag false in a copy (the input is not changed)."""
    cfg = {"tie_word_embeddings": True, "text_config": {"tie_word_embeddings": True, "x": 1}}
    fix = TieFix(
        "lm_head.weight",
        "model.embed_tokens.weight",
        {"tie_word_embeddings": [True, False], "text_config.tie_word_embeddings": [True, False]},
        "text_config.tie_word_embeddings",
        1,
        0.5,
    )
    out = fix.config(cfg)
    assert out == {"tie_word_embeddings": False, "text_config": {"tie_word_embeddings": False, "x": 1}}
    assert cfg["text_config"]["tie_word_embeddings"] is True


# ------------------------------------------------------------------------------------------ PaddleFormers 1.2
def _logits(cmd: list, out: Path, clean: bool = True) -> np.ndarray:
    import os
    import sys

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    cp = preload.run(
        [sys.executable, *map(str, cmd)],
        libs=preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    line = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
    res = json.loads(line[-1]) if line else {"ok": False, "error": cp.stderr[-1500:]}
    assert res["ok"], res
    assert not clean or not (res.get("warnings") or res.get("missing")), res
    return np.load(out)


@pytest.mark.slow
def test_e02_merged_output_loads_with_the_trained_head_in_paddleformers(tmp_path):
    """The merged e02 output, loaded by PaddleFormers 1.2's plain ``from_pretrained``
    (``tests/data/tools/pf_logits.py``), gives the logits of the model the run trained: the flex checkpoint
    loaded by ``paddle.distributed.load_state_dict`` into Qwen3 with its own head
    (``support/flex_trained_logits.py``), bit for bit. With the copied config's flag left true (the output
    before the tie check), PaddleFormers ties the head to the embedding and the logits differ: the check is
    what makes the output the trained model."""
    ids = tmp_path / "ids.npy"
    np.save(ids, np.random.default_rng(28).integers(0, 16, size=(2, 9)).astype(np.int64))
    merged_ok(E02, tmp_path / "out")
    untied = tmp_path / "cfg" / "config.json"
    untied.parent.mkdir()
    untied.write_text(
        json.dumps({**json.loads((E02 / "config.json").read_text()), "tie_word_embeddings": False})
    )
    trained = _logits(
        [
            paths.TESTS / "support" / "flex_trained_logits.py",
            E02 / "model_state",
            untied,
            "Qwen3ForCausalLMDeprecated",
            ids,
            tmp_path / "trained.npy",
        ],
        tmp_path / "trained.npy",
    )
    tool = paths.PF_LOGITS
    got = _logits(
        [tool, tmp_path / "out", "Qwen3ForCausalLM", ids, tmp_path / "got.npy"], tmp_path / "got.npy"
    )
    assert got.shape == trained.shape == (2, 9, 16)
    assert np.array_equal(got, trained), float(np.abs(got - trained).max())
    stale = tmp_path / "stale"
    shutil.copytree(tmp_path / "out", stale)
    cfg = json.loads((stale / "config.json").read_text())
    (stale / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    tied = _logits(
        [tool, stale, "Qwen3ForCausalLM", ids, tmp_path / "tied.npy"], tmp_path / "tied.npy", False
    )
    assert float(np.abs(tied - trained).max()) > 0.1


def _write_st(path: Path, arrays: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file of ``{name: (label, array)}`` (the array's bytes stored under the label)."""
    header, blobs, at = {}, [], 0
    for name, (label, a) in arrays.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": label, "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def test_undecodable_head_compared_as_bytes_is_kept_and_untied(tmp_path):
    """Rank files whose embedding and head are float8 (a dtype tietool compares as bytes, never as values)
    under a tied flag, the head's bytes different: kept and the flag set false as well; equal bytes: the
    flag stays."""
    for same in (False, True):
        src = tmp_path / f"ranks-{same}"
        src.mkdir()
        cfg = json.loads((TP / "llama_fp32" / "tp2" / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
        for r in range(2):
            f = TP / "llama_fp32" / "tp2" / f"model_state.tp0{r}.pdparams"
            a = {t.name: np.array(pdparams.read_array(f, t)) for t in pdparams.read_header(f, f.name)[0]}
            emb = a.pop("model.embed_tokens.weight").view(np.uint8)[:, ::4].copy()  # 1 byte an element
            head = emb.copy() if same else emb[::-1].copy()
            st = {k: ("F32", v) for k, v in a.items() if k != "lm_head.weight"}
            st.update({"model.embed_tokens.weight": ("F8_E4M3", emb), "lm_head.weight": ("F8_E4M3", head)})
            _write_st(src / f"model.tp0{r}.safetensors", st)
        rep, text = merged_ok(src, tmp_path / f"out-{same}")
        assert (
            json.loads((tmp_path / f"out-{same}" / "config.json").read_text())["tie_word_embeddings"] is same
        )
        assert (rep["tie"] is None) is same
        if not same:
            assert rep["tie"]["max_abs_diff"] is None
            said_untied(text)
