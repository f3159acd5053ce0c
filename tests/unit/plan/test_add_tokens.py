"""``add-tokens``, the model's half (issue 20): the planner :func:`plan_add_tokens` on hand-made
:class:`TokenEdit` values (the contract with the tokenizer half is plain data), executed by the one writer,
and the operation / CLI around it.

Checked: slack rows taken (and exactly used up), a batch larger than the slack growing every vocabulary
tensor (to a multiple of ``--pad-to-multiple-of`` and of the config's tensor-parallel degree; never fewer
rows), bf16 rows, a ``[hidden, vocab]`` head, a head bias, an MTP extra table that copies the embedding,
every init computed independently here (subtokens, copy, zeros, mean, trained-mean), old rows and every other
tensor bit-identical, ``--seed`` reproducible, the tokenizer files written (new folder, in place, a
MemoryStore), usage errors, a dry run that writes nothing. The end-to-end PaddleFormers / transformers
oracles with real tokenizers are in the tokenizer tests, not here.

Outputs are read back with the independent reader of :mod:`support.casecheck`.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import casecheck, paths
from support.paths import BUG_CASES_DIR, CASES_DIR
from support.resize_support import run_cli

from tietool.surgery import ops
from tietool.surgery.inspect.detect import detect
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.model.errors import RefusedError, TietoolError, UsageError
from tietool.surgery.model.tokens import NewToken, TokenEdit
from tietool.surgery.plan.add_tokens import plan_add_tokens, tp_degree
from tietool.surgery.plan.plan import check_dtypes
from tietool.surgery.write.writer import execute

R, H = 24, 8
EMB, HEAD, BIAS = "model.embed_tokens.weight", "lm_head.weight", "lm_head.bias"
LLAMA = {"model_type": "llama", "vocab_size": R, "hidden_size": H, "tie_word_embeddings": False}
TOK_JSON = b'{"version": "1.0", "edited": true}'


def rows(n: int, cols: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(1.0, 0.5, size=(n, cols)).astype(np.float32)


def write_ckpt(folder: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(dict(tensors), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "tokenizer.json").write_bytes(b'{"version": "1.0"}')
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


def llama(folder: Path, bias: bool = False, config: dict | None = None) -> tuple[Path, dict[str, np.ndarray]]:
    t = {EMB: rows(R, H, 1), "model.norm.weight": np.ones(H, np.float32), HEAD: rows(R, H, 2)}
    if bias:
        t[BIAS] = np.linspace(-1, 1, R, dtype=np.float32)
    return write_ckpt(folder, {**LLAMA, **(config or {})}, t), t


def edit(before: int, subtokens: list[tuple[int, ...]], existed: tuple[NewToken, ...] = ()) -> TokenEdit:
    """Tokens ``<t0>``, ``<t1>``, ... with ids from ``before``, each splitting into its subtoken ids."""
    new = tuple(NewToken(f"<t{j}>", before + j, False, False, ids) for j, ids in enumerate(subtokens))
    return TokenEdit(before, before + len(new), existed + new, files={"tokenizer.json": TOK_JSON})


def add(ck: Path, ed: TokenEdit, out: Path, **kw):
    """Plan (values compared, as the operation does) and write to ``out``; returns the plan."""
    det = detect(Checkpoint.open(ck), compare_values=True)
    plan = check_dtypes(plan_add_tokens(det, ed, **kw))
    execute(plan, out)
    return plan


def read(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of ``folder`` by the independent reader (float32 as float32, bf16 as uint16 bits)."""
    out = {}
    for n, t in casecheck.read_checkpoint(folder).tensors.items():
        dt = np.float32 if t.label in ("F32", "float32") else np.uint16
        out[n] = np.frombuffer(t.raw, dtype=dt).reshape(t.shape)
    return out


def mean_of(a: np.ndarray, ids) -> np.ndarray:
    """The mean of rows ``ids`` of ``a``, summed in Python floats (independent of the library's numpy)."""
    return np.array([sum(float(a[i, c]) for i in ids) / len(ids) for c in range(a.shape[1])], np.float32)


# ------------------------------------------------------------------------------------------- slack rows
def test_slack_rows_taken_by_subtokens_rest_bit_identical(tmp_path):
    ck, src = llama(tmp_path / "in")
    ed = edit(20, [(3, 5), (7,)])
    plan = add(ck, ed, tmp_path / "out", seed=0)
    out = read(tmp_path / "out")
    for n in (EMB, HEAD):
        assert out[n].shape == (R, H)
        assert out[n][:20].tobytes() == src[n][:20].tobytes()  # old rows
        assert out[n][22:].tobytes() == src[n][22:].tobytes()  # slack rows not taken
        np.testing.assert_allclose(out[n][20], mean_of(src[n], (3, 5)), rtol=1e-6)
        assert out[n][21].tobytes() == src[n][7].tobytes()  # the mean of one row is that row
    assert out["model.norm.weight"].tobytes() == src["model.norm.weight"].tobytes()
    assert casecheck.read_checkpoint(tmp_path / "out").config["vocab_size"] == R  # no growth: no key moves
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == TOK_JSON
    assert (tmp_path / "out" / "tokenizer_config.json").read_text() == "{}"
    rep = plan.extra_report
    assert (rep["rows_before"], rep["rows_after"], rep["slack_used"], rep["rows_added"]) == (R, R, 2, 0)
    assert [(t["id"], t["init"], t["source_ids"]) for t in rep["tokens"]] == [
        (20, "subtokens", [3, 5]),
        (21, "subtokens", [7]),
    ]
    assert rep["files_edited"] == ["tokenizer.json"]


def test_slack_exactly_used_up(tmp_path):
    ck, src = llama(tmp_path / "in")
    plan = add(ck, edit(20, [(1,), (2,), (3,), (4,)]), tmp_path / "out", seed=0)
    out = read(tmp_path / "out")
    assert out[EMB].shape == (R, H) and out[EMB][:20].tobytes() == src[EMB][:20].tobytes()
    assert [out[EMB][20 + j].tobytes() for j in range(4)] == [src[EMB][i].tobytes() for i in (1, 2, 3, 4)]
    assert plan.extra_report["slack_used"] == 4 and plan.extra_report["rows_after"] == R


def test_batch_larger_than_slack_grows_every_tensor(tmp_path):
    ck, src = llama(tmp_path / "in", bias=True)
    ed = edit(22, [(0, 1), (2,), (4, 5, 6), (9,), (10, 11)])  # ids 22..26: 2 slack rows, 3 new
    plan = add(ck, ed, tmp_path / "out", seed=0)
    out = read(tmp_path / "out")
    for n in (EMB, HEAD):
        assert out[n].shape == (27, H)
        assert out[n][:22].tobytes() == src[n][:22].tobytes()
        for j, ids in enumerate([(0, 1), (2,), (4, 5, 6), (9,), (10, 11)]):
            np.testing.assert_allclose(out[n][22 + j], mean_of(src[n], ids), rtol=1e-6)
    # the head bias: the mean of the subtokens' entries
    assert out[BIAS].shape == (27,) and out[BIAS][:22].tobytes() == src[BIAS][:22].tobytes()
    want = [np.mean([float(src[BIAS][i]) for i in ids]) for ids in [(0, 1), (2,), (4, 5, 6), (9,), (10, 11)]]
    np.testing.assert_allclose(out[BIAS][22:], want, rtol=1e-6)
    assert casecheck.read_checkpoint(tmp_path / "out").config["vocab_size"] == 27
    assert plan.extra_report["slack_used"] == 2 and plan.extra_report["rows_added"] == 3


def test_pad_to_multiple_of_and_tensor_parallel_degree(tmp_path):
    ck, src = llama(tmp_path / "in", config={"tensor_model_parallel_size": 3})
    det = detect(Checkpoint.open(ck), compare_values=True)
    assert tp_degree(det) == 3
    ed = edit(20, [(1,)] * 7)  # length 27 > 24 rows
    plan = add(ck, ed, tmp_path / "out", pad_to_multiple_of=8, seed=4)
    out = read(tmp_path / "out")
    assert out[EMB].shape == (48, H) and out[HEAD].shape == (48, H)  # lcm(8, 3) = 24 → 48
    assert plan.extra_report["pad_to_multiple_of"] == 24 and plan.extra_report["padding_rows"] == 21
    # padding rows: resize's mean init (HF mean_resizing over the old rows): about the old rows' mean
    np.testing.assert_allclose(
        out[EMB][27:], np.broadcast_to(mean_of(src[EMB], range(R)), (21, H)), atol=1e-3
    )
    assert out[EMB][:20].tobytes() == src[EMB][:20].tobytes()
    assert casecheck.read_checkpoint(tmp_path / "out").config["vocab_size"] == 48
    det.ckpt.config["tensor_parallel_degree"] = 4  # the key a PaddleNLP run records
    assert tp_degree(det) == 4


def test_never_shrinks(tmp_path):
    ck, src = llama(tmp_path / "in")
    plan = add(ck, edit(10, [(1,), (2,)]), tmp_path / "out", pad_to_multiple_of=16, seed=0)
    out = read(tmp_path / "out")
    assert out[EMB].shape == (R, H) and plan.extra_report["rows_after"] == R  # 12 tokens, 24 rows kept
    assert out[EMB][12:].tobytes() == src[EMB][12:].tobytes()


def test_a_token_already_present_adds_nothing(tmp_path):
    ck, src = llama(tmp_path / "in")
    had = (NewToken("<s>", 1, False, True),)
    ed = TokenEdit(20, 20, had, files={})
    plan = add(ck, ed, tmp_path / "out", seed=0)
    assert not plan.replace and not plan.changed
    assert plan.extra_report["tokens"][0]["existed"] and plan.extra_report["tokens"][0]["init"] is None


def test_refusals(tmp_path):
    ck, _ = llama(tmp_path / "in")
    det = detect(Checkpoint.open(ck), compare_values=True)
    with pytest.raises(RefusedError, match="already has 30 tokens"):
        plan_add_tokens(det, edit(30, [(1,)]))
    gap = TokenEdit(20, 22, (NewToken("<a>", 21, False, False, (1,)),))
    with pytest.raises(TietoolError, match="not contiguous"):
        plan_add_tokens(det, gap)
    for bad in ("median", "copy:"):
        with pytest.raises(UsageError):
            plan_add_tokens(det, edit(20, [(1,)]), init=bad)
    with pytest.raises(UsageError):
        plan_add_tokens(det, edit(20, [(1,)]), init="copy:<s>")  # no copy_id resolved
    with pytest.raises(UsageError, match="int32"):
        plan_add_tokens(det, edit(24, [(1,)]), pad_to_multiple_of=2**31)
    with pytest.raises(UsageError):
        plan_add_tokens(det, edit(20, [(1,)]), seed=-1)


# ------------------------------------------------------------------------------------------------ inits
def test_each_init_computed_independently(tmp_path):
    t = rows(R, H, 7) + 4.0  # trained rows far from zero
    t[16:18] = 0.0  # never-trained rows: all zero
    t[18] = t[19] = 0.25  # never-trained rows left at one value
    tensors = {EMB: t, "model.norm.weight": np.ones(H, np.float32), HEAD: rows(R, H, 8)}
    ck = write_ckpt(tmp_path / "in", LLAMA, tensors)
    got = {}
    for init in ("mean", "trained-mean", "zeros", "copy"):
        kw = {"init": "copy:<x>", "copy_id": 5} if init == "copy" else {"init": init}
        add(ck, edit(20, [(1, 2), (3,)]), tmp_path / init, seed=11, **kw)
        got[init] = read(tmp_path / init)[EMB]
    assert not got["zeros"][20:22].any()
    assert got["copy"][20].tobytes() == got["copy"][21].tobytes() == t[5].tobytes()
    everything, trained = mean_of(t, range(R)), mean_of(t, range(16))
    np.testing.assert_allclose(got["mean"][20:22], [everything] * 2, atol=1e-3)
    np.testing.assert_allclose(got["trained-mean"][20:22], [trained] * 2, atol=1e-3)
    assert np.abs(trained - everything).min() > 0.3  # the two rules differ here
    assert got["mean"][20].tobytes() != got["mean"][21].tobytes()  # drawn, not the bare mean
    for g in got.values():
        assert g[:20].tobytes() == t[:20].tobytes() and g[22:].tobytes() == t[22:].tobytes()


def test_seed_reproducible(tmp_path):
    ck, _ = llama(tmp_path / "in")
    ed = edit(22, [(1,), (2,), (3,), (4,)])
    a = [add(ck, ed, tmp_path / f"o{k}", init="mean", seed=s) for k, s in enumerate((5, 5, 6))]
    ra, rb, rc = (read(tmp_path / f"o{k}") for k in range(3))
    assert ra[EMB].tobytes() == rb[EMB].tobytes() and ra[HEAD].tobytes() == rb[HEAD].tobytes()
    assert ra[EMB][22:].tobytes() != rc[EMB][22:].tobytes()
    assert [t["seed"] for t in a[0].extra_report["tokens"]] == [5] * 4


# ------------------------------------------------------------------------------------ other surfaces
def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits, round to nearest even (independent of the library's)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_decode(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_bf16_rows(tmp_path):
    src = CASES_DIR / "pf_llama_tied_bf16"
    det = detect(Checkpoint.open(src), compare_values=True)
    V = det.vocab_rows
    before = read(src)[det.embedding.name]
    ed = edit(V - 1, [(3, 4, 9), (10,)])  # one slack row, one new row
    add(src, ed, tmp_path / "out", seed=0)
    got = read(tmp_path / "out")[det.embedding.name]
    assert got.dtype == np.uint16 and got.shape == (V + 1, before.shape[1])
    assert got[: V - 1].tobytes() == before[: V - 1].tobytes()
    dec = _bf16_decode(before)
    assert got[V - 1].tobytes() == _bf16_round(mean_of(dec, (3, 4, 9))).tobytes()
    assert got[V].tobytes() == before[10].tobytes()


def test_hidden_vocab_head(tmp_path):
    src = CASES_DIR / "pnlp_llama_untied"
    det = detect(Checkpoint.open(src), compare_values=True)
    assert det.head.layout == "hidden-vocab"
    V = det.vocab_rows
    old = read(src)
    add(src, edit(V, [(5, 6), (7,)]), tmp_path / "out", seed=0)
    out = read(tmp_path / "out")
    h, e = det.head.name, det.embedding.name
    assert out[h].shape == (old[h].shape[0], V + 2) and out[e].shape == (V + 2, old[e].shape[1])
    assert out[h][:, :V].tobytes() == np.ascontiguousarray(old[h]).tobytes()
    np.testing.assert_allclose(out[h][:, V], mean_of(old[h].T, (5, 6)), rtol=1e-6)
    assert out[h][:, V + 1].tobytes() == np.ascontiguousarray(old[h][:, 7]).tobytes()
    np.testing.assert_allclose(out[e][V], mean_of(old[e], (5, 6)), rtol=1e-6)


def test_mtp_extra_table_stays_a_copy(tmp_path):
    cfg = {**LLAMA, "model_type": "deepseek_v3", "num_nextn_predict_layers": 1, "num_hidden_layers": 1}
    emb, head = rows(R, H, 3), rows(R, H, 4)
    tensors = {
        "model.layers.1.embed_tokens.weight": emb.copy(),
        "model.layers.1.shared_head.head.weight": head.copy(),
        "model.layers.1.enorm.weight": np.ones(H, np.float32),
        EMB: emb,
        "model.norm.weight": np.ones(H, np.float32),
        HEAD: head,
    }
    ck = write_ckpt(tmp_path / "in", cfg, tensors)
    add(ck, edit(23, [(1, 2), (3,)]), tmp_path / "out", seed=0)
    out = read(tmp_path / "out")
    assert out["model.layers.1.embed_tokens.weight"].tobytes() == out[EMB].tobytes()
    assert out["model.layers.1.shared_head.head.weight"].tobytes() == out[HEAD].tobytes()
    assert out[EMB].shape == (25, H)
    np.testing.assert_allclose(out[EMB][23], mean_of(emb, (1, 2)), rtol=1e-6)


# --------------------------------------------------------------------------- the operation and the CLI
def _fake_edit(before: int = 20):
    """A stand-in for :mod:`surgery.io.tokenizer_edit` (the tokenizer half, tested with it): each string
    gets the next id and splits into ids 1 and 2; ``<s>`` is token 1."""

    def add_tokens_edit(folder, strings, special=False):
        toks, nid = [], before
        for s in strings:
            if s == "<s>":
                toks.append(NewToken(s, 1, special, True))
            else:
                toks.append(NewToken(s, nid, special, False, (1, 2)))
                nid += 1
        return TokenEdit(before, nid, tuple(toks), files={"tokenizer.json": TOK_JSON})

    return types.SimpleNamespace(add_tokens_edit=add_tokens_edit)


@pytest.fixture
def fake_tokenizer(monkeypatch):
    monkeypatch.setattr(ops, "_tokenizer_edit", _fake_edit)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_dry_run_writes_nothing(tmp_path, fake_tokenizer):
    ck, _ = llama(tmp_path / "in")
    before = _tree(ck)
    rep = ops.add_tokens(ck, ["<a>", "<b>"], tmp_path / "out", dry_run=True, seed=1)
    assert not (tmp_path / "out").exists() and _tree(ck) == before
    assert [t["id"] for t in rep["add_tokens"]["tokens"]] == [20, 21]
    rep = ops.add_tokens(ck, ["<a>"], dry_run=True)  # in place, dry
    assert _tree(ck) == before and not rep["in_place"]["written"]


def test_in_place_copy_init_and_report(tmp_path, fake_tokenizer):
    ck, src = llama(tmp_path / "in")
    rep = ops.add_tokens(ck, ["<a>", "<a>", "<s>"], init="copy:<s>", seed=2)
    assert rep["in_place"]["written"] and Path(rep["in_place"]["backup"]).is_dir()
    assert (ck / "tokenizer.json").read_bytes() == TOK_JSON
    assert "tokenizer.json" in rep["files"]["edited"]
    out = read(ck)
    assert out[EMB][20].tobytes() == src[EMB][1].tobytes()  # copy of <s> (id 1)
    assert out[EMB][:20].tobytes() == src[EMB][:20].tobytes()
    toks = rep["add_tokens"]["tokens"]
    assert [(t["content"], t["id"], t["existed"]) for t in toks] == [("<a>", 20, False), ("<s>", 1, True)]
    assert json.loads((ck / "tietool-report.json").read_text())["add_tokens"]["init"] == "copy:<s>"


def test_copy_of_a_string_that_is_not_one_token(tmp_path, fake_tokenizer):
    ck, _ = llama(tmp_path / "in")
    with pytest.raises(UsageError, match="not one token"):
        ops.add_tokens(ck, ["<a>"], tmp_path / "out", init="copy:<zz>")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["add-tokens"], "CKPT"),
        (["add-tokens", "{ck}"], "at least one token"),
        (["add-tokens", "{ck}", "--file", "{empty}"], "at least one token"),
        (["add-tokens", "{ck}", "--file", "{latin1}"], "not UTF-8"),
        (["add-tokens", "{ck}", "<a>", "--init", "median"], "unknown"),
        (["add-tokens", "{ck}", "<a>", "--pad-to-multiple-of", "0"], "greater than or equal to 1"),
    ],
)
def test_cli_usage_errors(tmp_path, args, needle):
    ck, _ = llama(tmp_path / "in")
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    before = _tree(ck)
    subs = {"{ck}": str(ck), "{empty}": str(tmp_path / "empty.txt"), "{latin1}": str(tmp_path / "latin1.txt")}
    cp = run_cli([subs.get(a, a) for a in args])
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert needle in cp.stdout + cp.stderr and "Traceback" not in cp.stderr
    assert _tree(ck) == before


def test_cli_token_file_lines(tmp_path):
    from tietool.cli.app import _token_file

    f = tmp_path / "t.txt"
    f.write_bytes("\ufeff<think>\r\n\n a b \n</think>".encode())
    assert _token_file(str(f)) == ["<think>", " a b ", "</think>"]


def test_write_into_memory_equals_local(tmp_path):
    """The writer with a tokenizer edit, memory → memory: the bytes of a local write (tokenizer file
    included), the input untouched (tests/unit/io/test_store.py's check, for add-tokens)."""
    pytest.importorskip("fsspec")
    from tietool.surgery.io.store import as_path
    from tietool.surgery.io.stores import MemoryStore

    ck, _ = llama(tmp_path / "in", bias=True)
    ed = edit(22, [(1,), (2, 3), (4,)])
    add(ck, ed, tmp_path / "local", seed=3)
    mem = MemoryStore.from_folder(ck)
    try:
        det = detect(Checkpoint.open(mem.url), compare_values=True)
        execute(check_dtypes(plan_add_tokens(det, ed, seed=3)), as_path(mem.sibling("out")))
        got, want = mem.files(mem.sibling("out")), _tree(tmp_path / "local")
        assert sorted(got) == sorted(want)
        assert [k for k in want if got[k] != want[k]] == []
        assert got["tokenizer.json"] == TOK_JSON
        assert mem.files() == _tree(ck)
    finally:
        mem.clear()


def test_trained_index_rule():
    """unsloth's rule (largest value ≤ 1e-16: untrained) plus rows bit-identical to another, among the
    tokenizer's old ids only."""
    from tietool.surgery.plan.recipes import trained_index

    a = rows(12, 4, 9)
    a[2] = 0.0
    a[3] = -1.0  # negative everywhere: amax ≤ eps, untrained by unsloth's rule
    a[5] = a[7] = 0.5
    got = trained_index(a, 10, lambda x: np.asarray(x, np.float32))
    assert got.tolist() == [0, 1, 4, 6, 8, 9]
    assert trained_index(np.zeros((3, 4), np.float32), 3, lambda x: x).tolist() == [0, 1, 2]  # none: all


def test_in_place_rewrites_only_the_touched_shards(tmp_path, monkeypatch):
    import shutil

    ck = tmp_path / "ckpt"
    shutil.copytree(CASES_DIR / "pf_llama_untied_sharded", ck)
    det = detect(Checkpoint.open(ck), compare_values=True)
    V = det.vocab_rows
    monkeypatch.setattr(ops, "_tokenizer_edit", lambda: _fake_edit(V - 1))
    touched = {det.ckpt.tensors[n].file for n in (det.embedding.name, det.head.name)}
    rep = ops.add_tokens(ck, ["<a>", "<b>"], seed=0)
    bak = Path(rep["in_place"]["backup"])
    for f in det.ckpt.weight_files:
        same = (ck / f).stat().st_ino == (bak / f).stat().st_ino
        assert same == (f not in touched), f
    assert sorted(rep["files"]["rewritten"]) == sorted(touched)
    assert (ck / "tokenizer.json").read_bytes() == TOK_JSON and not (bak / "tokenizer.json").exists()
    assert read(ck)[det.embedding.name].shape[0] == V + 1


SAMPLE = paths.SAMPLES / "pf_llama_with_tokenizer"


def test_real_tokenizer_dry_run_then_in_place(tmp_path):
    """With the real tokenizer half (tokenizer_edit) on the README's sample: a dry run writes nothing; in
    place, the new ids take slack rows, each the mean of its subtokens' rows, the old rows unchanged."""
    pytest.importorskip("tokenizers")
    import shutil

    ck = tmp_path / "ckpt"
    shutil.copytree(SAMPLE, ck)
    before, src = _tree(ck), read(ck)
    strings = ["<think>", "</think>", "<tool_call>"]
    rep = ops.add_tokens(ck, strings, special=True, seed=0, dry_run=True)
    assert _tree(ck) == before and not rep["in_place"]["written"]
    rep = ops.add_tokens(ck, strings, special=True, seed=0)
    toks = {t["content"]: t for t in rep["add_tokens"]["tokens"]}
    assert toks["<think>"]["existed"] and (toks["</think>"]["id"], toks["<tool_call>"]["id"]) == (304, 305)
    out = read(ck)
    for n in (EMB, HEAD):
        assert out[n].shape == src[n].shape == (320, 16)
        assert (
            out[n][:304].tobytes() == src[n][:304].tobytes()
            and out[n][306:].tobytes() == src[n][306:].tobytes()
        )
        for s in ("</think>", "<tool_call>"):
            ids = toks[s]["source_ids"]
            np.testing.assert_allclose(out[n][toks[s]["id"]], mean_of(src[n], ids), rtol=1e-6)
    assert "tokenizer.json" in rep["files"]["edited"]
    assert (ck / "tokenizer.json").read_bytes() != before["tokenizer.json"]


def test_a_base_token_marked_special_is_warned(tmp_path):
    """--special on a word of the base vocabulary marks it special (as HF add_special_tokens does), and the
    report warns that text containing it tokenizes differently from then on; a plain added token of the
    input marked special is warned as a changed special flag (decoders with skip_special_tokens drop it
    from then on: vllm-project/vllm#25281); a base token left as it is gives no warning."""
    pytest.importorskip("tokenizers")
    import shutil

    ck = tmp_path / "ckpt"
    shutil.copytree(SAMPLE, ck)
    rep = ops.add_tokens(ck, ["vocab", "<think>"], special=True, dry_run=True)
    flag = (
        "'<think>' (id 303) was not special and is now marked special (its special flag changed): "
        "decode(skip_special_tokens=True) drops it from now on, so parsers that read it from decoded text "
        "(tool-call parsers of serving engines) no longer see it; leave it out of a special batch to keep it "
        "plain"
    )
    assert rep["warnings"] == [
        flag,
        "marked special, though part of the base vocabulary: 'vocab' (id 293); text that contains them is "
        "split around them from now on (ordinary words may tokenize differently)",
    ]
    assert not ops.add_tokens(ck, ["vocab"], dry_run=True)["warnings"]
    assert ops.add_tokens(ck, ["<think>"], special=True, dry_run=True)["warnings"] == [flag]


def test_tokenizer_files_that_disagree_are_refused(tmp_path):
    """Found by breaking issue 20: the README's classic stale folder (``<tool_call>`` id 250 added to
    tokenizer.json alone, beside its tokenizer.model and tokenizer_config.json) took ``add-tokens ck <a>``
    (exit 0, '<a>' id 251); transformers 5.3 then loaded '<a>' as id 250 and PaddleFormers 1.2 as 251, and
    ``verify`` called the output's files disagreeing. Refused (exit 5), one line naming the disagreement and
    the fix, nothing written, input untouched; the folder once saved consistently is accepted."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("sentencepiece")
    import shutil

    tok = paths.TOKENIZERS / "sp_bpe_with_json"
    t = {EMB: rows(256, H, 1), "model.norm.weight": np.ones(H, np.float32), HEAD: rows(256, H, 2)}
    ck = write_ckpt(tmp_path / "ck", {**LLAMA, "vocab_size": 256}, t)  # rows beyond the 251 tokens
    for p in tok.iterdir():
        shutil.copy(p, ck / p.name)
    tj = json.loads((ck / "tokenizer.json").read_text())
    tj["added_tokens"].append(
        {
            "id": 250,
            "content": "<tool_call>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }  # fmt: skip
    )
    (ck / "tokenizer.json").write_text(json.dumps(tj))
    before = _tree(ck)
    cp = run_cli(["add-tokens", str(ck), "<a>", "--out", str(tmp_path / "out")])
    assert cp.returncode == 5, cp.stderr
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and "tokenizer files disagree" in err[0] and "save_pretrained" in err[0], err
    assert "Traceback" not in cp.stderr and not (tmp_path / "out").exists() and _tree(ck) == before
    dec = json.loads((ck / "tokenizer_config.json").read_text())
    dec["added_tokens_decoder"]["250"] = {"content": "<tool_call>", "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}  # fmt: skip
    (ck / "tokenizer_config.json").write_text(json.dumps(dec))  # the state save_pretrained leaves: agrees
    rep = ops.add_tokens(ck, ["<a>"], out=tmp_path / "out2", seed=0)
    assert [(t["content"], t["id"]) for t in rep["add_tokens"]["tokens"]] == [("<a>", 251)]


def test_missing_tokenizer_extra_is_one_line_naming_it_once(tmp_path, monkeypatch):
    """Found by breaking issue 20 in a core-only venv: ``add-tokens`` on a folder whose files need the extra
    said ``... needs tokenizers: pip install "tietool[tokenizer]" — pip install "tietool[tokenizer]"``. One
    line, the command once, exit 1, nothing written."""
    import os
    import shutil
    import sys

    if os.environ.get("TIETOOL_TEST_SUBPROCESS") == "1":
        pytest.skip("the libraries are hidden in this process only")
    ck = tmp_path / "ckpt"
    shutil.copytree(SAMPLE, ck)
    before = _tree(ck)
    for lib in ("tokenizers", "sentencepiece"):
        monkeypatch.setitem(sys.modules, lib, None)  # import -> ImportError
    cp = run_cli(["add-tokens", str(ck), "<x>", "--out", str(tmp_path / "out")])
    monkeypatch.undo()
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == 1 and len(lines) == 1, cp.stderr
    assert lines[0].count('pip install ".[tokenizer]" in the tietool clone') == 1, lines[0]
    assert not (tmp_path / "out").exists() and _tree(ck) == before


def test_copy_of_a_text_that_is_one_token_under_another_spelling(tmp_path):
    """Found by breaking issue 20: ``--init copy:the`` on a SentencePiece tokenizer was refused with "'the'
    is not one token of the tokenizer (it splits into ids [12])": one id, the piece '▁the'. It copies row
    12; a string add-tokens would refuse (byte-level 'é') stays a usage error (exit 2), named."""
    pytest.importorskip("tokenizers")
    import shutil

    tok = paths.TOKENIZERS
    t = {EMB: rows(256, H, 1), "model.norm.weight": np.ones(H, np.float32), HEAD: rows(256, H, 2)}
    ck = write_ckpt(tmp_path / "sp", {**LLAMA, "vocab_size": 256}, t)
    for p in (tok / "sp_bpe_with_json").iterdir():
        shutil.copy(p, ck / p.name)
    rep = ops.add_tokens(ck, ["<q>"], tmp_path / "out", init="copy:the", seed=0)
    (q,) = rep["add_tokens"]["tokens"]
    assert q["source_ids"] == [12] and q["id"] == 250
    out = read(tmp_path / "out")
    for n in (EMB, HEAD):
        assert out[n][250].tobytes() == t[n][12].tobytes()
    t2 = {**t, EMB: rows(310, H, 1), HEAD: rows(310, H, 2)}
    bl = write_ckpt(tmp_path / "bl", {**LLAMA, "vocab_size": 310}, t2)
    for p in (tok / "bytelevel_bpe").iterdir():
        shutil.copy(p, bl / p.name)
    with pytest.raises(UsageError, match="'é' is not one token of the tokenizer"):
        ops.add_tokens(bl, ["<q>"], tmp_path / "out2", init="copy:é")
    assert not (tmp_path / "out2").exists()


def test_verify_across_a_chain_of_in_place_add_tokens_runs(tmp_path):
    """add-tokens in place twice (a, then b), then verify ORIGINAL FINAL: the second run's report lists only
    '<bb_tok>', so verify called '<aa_tok>' unexplained (exit 7); it now carries the first run's edits in its
    ``history`` (surgery.report.history), and verify reads the chain. More:
    tests/unit/report/test_verify_chain.py."""
    import shutil

    src = paths.SAMPLES / "pf_llama_with_tokenizer"
    orig, ck = tmp_path / "orig", tmp_path / "ck"
    shutil.copytree(src, orig)
    shutil.copytree(src, ck)
    for tok in ("<aa_tok>", "<bb_tok>"):
        assert run_cli(["add-tokens", str(ck), tok, "--no-backup", "-q"]).rc == 0
    run = run_cli(["verify", str(orig), str(ck)])
    assert run.rc != 7 or "'<aa_tok>'" not in run.stdout, run.stdout  # was: exit 7 naming '<aa_tok>'
    assert run.rc == 0, run.stdout


def test_existing_tokens_with_all_zero_rows_are_named(tmp_path):
    """e04 (axolotl#1666): Llama-3 base's chat tokens exist with all-zero rows. add-tokens of them warns on
    the terminal naming exactly the asked tokens whose embedding rows are all zero (the oracle: the rows read
    with numpy by the case checker), not the asked token with a trained row."""
    import shutil

    ck = shutil.copytree(BUG_CASES_DIR / "e04_llama3_base_untrained_chat_tokens" / "ckpt", tmp_path / "ck")
    emb = casecheck.read_checkpoint(ck)
    table = emb.decode(emb.tensors["model.embed_tokens.weight"])
    asked = {"<|begin_of_text|>": 262, "<|start_header_id|>": 266, "<|eot_id|>": 269}
    zero = [s for s, i in asked.items() if not table[i].any()]
    assert zero == ["<|start_header_id|>", "<|eot_id|>"]
    rep = ops.add_tokens(ck, list(asked), special=True, dry_run=True)
    (warning,) = [w for w in rep["warnings"] if "all zero" in w]
    assert all(f"{s!r} (id {asked[s]})" in warning for s in zero) and "<|begin_of_text|>" not in warning


def test_existing_tokens_with_all_zero_rows_get_rows(tmp_path):
    """e04: the existing chat tokens with all-zero rows in the embedding and the head get rows by the init,
    as new tokens do (``copy:<|begin_of_text|>``: exactly row 262, the oracle); every other row, the
    all-zero reserved row 268 between them included, stays bit-identical; the report marks them
    ``rows_reset``; verify explains the output (exit 0)."""
    import shutil

    from tietool.surgery.verify import verify

    ck = shutil.copytree(BUG_CASES_DIR / "e04_llama3_base_untrained_chat_tokens" / "ckpt", tmp_path / "ck")
    out = tmp_path / "out"
    asked = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    rep = ops.add_tokens(ck, asked, out=out, special=True, init="copy:<|begin_of_text|>")
    assert [(t["id"], t["rows_reset"], t["init"]) for t in rep["add_tokens"]["tokens"]] == [
        (266, True, "copy"),
        (267, True, "copy"),
        (269, True, "copy"),
    ]
    a, b = casecheck.read_checkpoint(ck), casecheck.read_checkpoint(out)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        x, y = a.tensors[name].byte_view(), b.tensors[name].byte_view()
        assert all((y[i] == x[262]).all() for i in (266, 267, 269))
        kept = [i for i in range(x.shape[0]) if i not in (266, 267, 269)]
        assert y[kept].tobytes() == x[kept].tobytes() and not y[268].any()
    res = verify(ck, out)
    assert res.unexplained == [], res.unexplained
