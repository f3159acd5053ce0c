"""``tietool diff A B`` / ``tietool.diff``: every difference it reports is checked against a reference
computed here in numpy from the files themselves (``support.fixture_support``'s own safetensors and
``.pdparams`` readers, ``safetensors.numpy``), never from tietool's readers.

Inputs: the fixtures (``tests/data/fixtures``, written by PaddleFormers 1.2 / PaddleNLP 2.8.1), the bug-report
cases (``tests/data/cases``), flex checkpoints written by Paddle (``tests/data/flex``) and rank files cut by
PaddleFormers (``tests/data/tp_ranks``, ``sample_checkpoints/pf_llama_tp2``); the outputs of tie / untie /
resize / add-tokens against their inputs; edits made here byte by byte (bits flipped in place, a tensor
renamed, a dtype widened).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from support import fixture_support as fs
from support.cli_runner import run_cli
from support.paths import BUG_CASES_DIR, CASES_DIR, DATA, EXPECTED_DIR, REPO

import tietool
from tietool.surgery.io.checkpoint import Checkpoint

SAMPLES = REPO / "sample_checkpoints"
FIXTURES = sorted(p.name for p in CASES_DIR.iterdir() if p.is_dir())
# bit masks that change a mantissa bit of one element and never its exponent (no inf or NaN made)
_FLIP = {1: 1 << 4, 2: 1 << 4, 4: 1 << 20, 8: 1 << 40}


# ------------------------------------------------------------------ the numpy reference


def _axis_of(name: str, expected: dict) -> int | None:
    """The vocabulary axis of ``name`` by the fixture's expected.json (written by the libraries)."""
    if name == expected["input_embedding"]["name"]:
        return 0
    out = expected["output_embedding"]
    if name == out["name_in_model"] and out["in_files"]:
        return 1 if out["layout"] == "[hidden, vocab]" else 0
    return None


def _bits(t: fs.RawTensor) -> np.ndarray:
    a = np.frombuffer(t.data, dtype=np.uint8)
    size = max(1, len(t.data) // max(1, int(np.prod(t.shape))))
    return a.view(f"<u{size}").reshape(t.shape) if size in (1, 2, 4, 8) else a.reshape(*t.shape, -1)


def _values(t: fs.RawTensor) -> np.ndarray:
    return np.asarray(t.decoded(), dtype=np.float64)


def reference(a: dict[str, fs.RawTensor], b: dict[str, fs.RawTensor], axes: dict[str, int]) -> dict:
    """What differs between two tensor dicts: ``{"identical": n, "added", "removed", "changed": {name:
    {"max", "rel", "rows"}}}`` (rows: ids along the vocabulary axis whose bits differ, or None)."""
    out: dict = {"identical": 0, "added": sorted(set(b) - set(a)), "removed": sorted(set(a) - set(b))}
    changed: dict = {}
    for n in sorted(set(a) & set(b)):
        x, y = a[n], b[n]
        if x.shape == y.shape and x.data == y.data:
            out["identical"] += 1
            continue
        xa, yb = _values(x), _values(y)
        d = np.abs(yb - xa)
        rows = None
        if n in axes:
            diff = _bits(x) != _bits(y)
            other = tuple(k for k in range(diff.ndim) if k != axes[n])
            rows = np.flatnonzero(diff.any(axis=other)).tolist()
        changed[n] = {
            "max": float(d.max()),
            "rel": float(np.linalg.norm(yb - xa) / np.linalg.norm(xa)),
            "rows": rows,
        }
    out["changed"] = changed
    return out


def _ids(ranges: list[list[int]]) -> list[int]:
    return [i for a, b in ranges for i in range(a, b)]


def check_against(res: tietool.Diff, ref: dict) -> None:
    """The diff's tensor sections equal the reference (measures within float rounding)."""
    d = res.as_dict()["tensors"]
    assert d["identical"] == ref["identical"]
    assert sorted(x["name"] for x in d["added"]) == ref["added"]
    assert sorted(x["name"] for x in d["removed"]) == ref["removed"]
    got = {c["name"]: c for c in d["changed"]}
    assert set(got) == set(ref["changed"])
    for n, want in ref["changed"].items():
        c = got[n]
        assert c["max_abs_diff"] == pytest.approx(want["max"], rel=1e-12, abs=0), n
        # ‖A‖ sums chunks by float32 dot products (surgery.diff.tensors.square_sum): ~1e-6 relative
        assert c["relative_norm"] == pytest.approx(want["rel"], rel=1e-5), n
        if want["rows"] is not None:
            assert c["rows_changed"] is not None and _ids(c["rows_changed"]["ranges"]) == want["rows"], n
            assert c["rows_changed"]["count"] == len(want["rows"])


# ------------------------------------------------------------------ edits made byte by byte


def _flip(raw: bytearray, start: int, t: fs.RawTensor, flat_ids: list[int]) -> None:
    """Flip one mantissa bit of the elements ``flat_ids`` of tensor ``t`` whose data starts at ``start``."""
    size = len(t.data) // int(np.prod(t.shape))
    view = np.frombuffer(raw, dtype=np.uint8)[start : start + len(t.data)]
    el = view.view(f"<u{size}")
    for i in flat_ids:
        el[i] ^= el.dtype.type(_FLIP[size])


def _st_starts(raw: bytes) -> dict[str, int]:
    """Where each tensor's data starts in a safetensors file (its own header)."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    return {k: 8 + n + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def _occurrences(raw: bytes, data: bytes) -> list[int]:
    out, at = [], raw.find(data)
    while at >= 0:
        out.append(at)
        at = raw.find(data, at + 1)
    return out


def edit(folder: Path, edits: dict[str, list[int]]) -> None:
    """Flip bits of the named tensors in place (``{name: flat element ids}``): in a safetensors file where
    its header says; in a ``.pdparams`` wherever the tensor's own bytes are (a table stored twice, as
    PaddleNLP's BERT stores its tied decoder, is edited in both places: the reference reads both)."""
    for f in fs.weight_files(folder):
        st = f.suffix == ".safetensors"
        tensors = fs.read_safetensors(f) if st else fs.read_pdparams(f)
        raw = bytearray(f.read_bytes())
        starts = _st_starts(raw) if st else {}
        for name, ids in edits.items():
            if name in tensors:
                t = tensors[name]
                found = [starts[name]] if st else _occurrences(bytes(raw), t.data)
                assert found, name
                for start in found:
                    _flip(raw, start, t, ids)
        f.write_bytes(bytes(raw))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------ identical


@pytest.mark.parametrize("name", FIXTURES)
def test_a_fixture_against_itself_and_a_copy_is_identical(name, tmp_path):
    src = CASES_DIR / name
    copy = _copy(src, tmp_path / name)
    for b in (src, copy):
        res = tietool.diff(src, b)
        assert res.identical and res.exit_code == 0, res.as_dict()
        assert res.identical_tensors == len(fs.read_checkpoint(src))


CASES = sorted(p.parent.name for p in BUG_CASES_DIR.glob("*/ckpt") if not (p / "model_state").exists())


def _opening_error(ck: Path, tmp: Path) -> type[BaseException] | None:
    """The error opening ``ck`` raises as the other commands open it (rank files: merge's plan)."""
    names = {p.name for p in ck.iterdir()}
    try:
        if any(".tp0" in n or "moe" in n for n in names):
            tietool.merge(ck, tmp / "never", dry_run=True)
        else:
            Checkpoint.open(ck)
    except tietool.TietoolError as e:
        return type(e)
    return None


@pytest.mark.parametrize("case", CASES)
def test_a_case_against_itself(case, tmp_path):
    """Every bug-report case diff'd with itself: identical, or refused with the error opening it raises in
    the other commands (exit 3/5)."""
    ck = BUG_CASES_DIR / case / "ckpt"
    try:
        res = tietool.diff(ck, ck)
    except tietool.TietoolError as e:
        assert type(e) is _opening_error(ck, tmp_path), e
        return
    assert res.identical and res.exit_code == 0, res.as_dict()
    assert res.identical_tensors > 0


@pytest.mark.parametrize(
    ("case", "name"),
    [
        ("c10_quantized_packed_embedding", "model.embed_tokens.weight_packed"),
        (
            "c11_peft_wrapper_names_in_full_ckpt",
            "base_model.model.model.embed_tokens.modules_to_save.default.weight",
        ),
    ],
)
def test_quantized_and_adapter_wrapped_checkpoints_are_compared_as_stored(case, name, tmp_path):
    """A quantized embedding (c10) and adapter-wrapped names (c11), which every edit refuses, are read by
    diff as stored (docs/guides/diff.md: any two checkpoints): a copy is identical (exit 0); a bit flipped
    in one of the tensors the edits refuse is that tensor changed and nothing else (exit 1), as the numpy
    reference of the files says; the other commands still refuse the folder."""
    src = BUG_CASES_DIR / case / "ckpt"
    with pytest.raises(tietool.TietoolError):
        Checkpoint.open(src)
    b = _copy(src, tmp_path / "b")
    res = tietool.diff(src, b)
    assert res.identical and res.exit_code == 0, res.as_dict()
    edit(b, {name: [1]})
    tensors = fs.read_checkpoint(src)
    ref = reference(tensors, fs.read_checkpoint(b), {})
    assert list(ref["changed"]) == [name]
    res = tietool.diff(src, b)
    check_against(res, ref)
    assert res.exit_code == 1


# ------------------------------------------------------------------ changed values vs numpy


@pytest.mark.parametrize("name", FIXTURES)
def test_changed_rows_and_measures_match_numpy(name, tmp_path):
    """Bits flipped in rows 1 and 7 of the embedding, in token 3's entries of the head (a row or a column by
    its layout) and in one element of a layer tensor: the diff lists exactly those tensors, with max |Δ|,
    ‖Δ‖/‖A‖ and the token rows numpy computes from the files."""
    src = CASES_DIR / name
    expected = json.loads((EXPECTED_DIR / f"{name}.json").read_text())
    tensors = fs.read_checkpoint(src)
    emb = expected["input_embedding"]["name"]
    hidden = tensors[emb].shape[1]
    edits = {emb: [hidden * 1, hidden * 1 + 3, hidden * 7 + hidden - 1]}
    head = expected["output_embedding"]
    hn = head["name_in_model"]
    if head["in_files"] and hn != emb and tensors[hn].data != tensors[emb].data:
        h = tensors[hn]
        edits[hn] = [3 * h.shape[1]] if _axis_of(hn, expected) == 0 else [3, h.shape[1] + 3]
    layer = next(
        n for n, t in tensors.items() if len(t.shape) == 2 and n not in edits and t.data != tensors[emb].data
    )
    edits[layer] = [5]
    b = _copy(src, tmp_path / "b")
    edit(b, edits)
    axes = {n: ax for n in tensors if (ax := _axis_of(n, expected)) is not None}
    ref = reference(tensors, fs.read_checkpoint(b), axes)
    assert set(ref["changed"]) >= set(edits)
    res = tietool.diff(src, b)
    check_against(res, ref)
    assert res.exit_code == 1
    assert ref["changed"][emb]["rows"] == [1, 7]


def test_safetensors_numpy_reference_of_a_float32_fixture(tmp_path):
    """The same check through ``safetensors.numpy.load_file`` (the library's own reader)."""
    from safetensors.numpy import load_file

    src = CASES_DIR / "pf_llama_untied_fp32"
    b = _copy(src, tmp_path / "b")
    edit(b, {"lm_head.weight": [16 * 9 + 2], "model.layers.0.mlp.up_proj.weight": [0, 1]})
    f = "model-00001-of-00001.safetensors"
    x, y = load_file(src / f), load_file(b / f)
    res = tietool.diff(src, b).as_dict()["tensors"]
    got = {c["name"]: c for c in res["changed"]}
    assert (
        set(got)
        == {n for n in x if not np.array_equal(x[n], y[n])}
        == {
            "lm_head.weight",
            "model.layers.0.mlp.up_proj.weight",
        }
    )
    for n, c in got.items():
        d = y[n].astype(np.float64) - x[n].astype(np.float64)
        assert c["max_abs_diff"] == np.abs(d).max()
        assert c["relative_norm"] == pytest.approx(
            np.linalg.norm(d) / np.linalg.norm(x[n].astype(np.float64))
        )
    assert got["lm_head.weight"]["rows_changed"]["ranges"] == [[9, 10]]
    assert got["model.layers.0.mlp.up_proj.weight"]["rows_changed"] is None
    assert res["identical"] == len(x) - 2


# ------------------------------------------------------------------ renamed, dtype changed


def _write_st(path: Path, tensors: dict[str, tuple[str, tuple, bytes]], metadata: dict | None = None) -> None:
    """A safetensors file written here (header, then the data in order)."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    pos = 0
    for n, (dt, shape, data) in tensors.items():
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(d for _, _, d in tensors.values()))


def _rewrite(folder: Path, change) -> None:
    """Rewrite the single-file fixture ``folder`` with ``change(name, RawTensor) -> (name, (dtype, shape,
    bytes))``, its index dropped (one file)."""
    f = folder / "model-00001-of-00001.safetensors"
    meta = fs.safetensors_metadata(f)
    out = dict(change(n, t) for n, t in fs.read_safetensors(f).items())
    f.unlink()
    (folder / "model.safetensors.index.json").unlink()
    _write_st(folder / "model.safetensors", out, meta)


def test_a_renamed_tensor_is_matched_by_shape_and_bytes(tmp_path):
    src = CASES_DIR / "pf_llama_untied_fp32"
    b = _copy(src, tmp_path / "b")
    old, new = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.query.weight"
    _rewrite(b, lambda n, t: (new if n == old else n, (t.dtype, t.shape, t.data)))
    d = tietool.diff(src, b).as_dict()
    assert d["tensors"]["renamed"] == [{"from": old, "to": new, "dtype": "float32", "shape": [16, 16]}]
    assert d["tensors"]["added"] == d["tensors"]["removed"] == d["tensors"]["changed"] == []
    assert d["exit_code"] == 1
    # k_proj has q_proj's shape: a rename is told by the bytes, not the shape
    assert d["tensors"]["identical"] == len(fs.read_checkpoint(src)) - 1


def test_a_widened_dtype_is_a_dtype_change_with_equal_values(tmp_path):
    src = CASES_DIR / "pf_llama_untied_fp32"
    b = _copy(src, tmp_path / "b")
    name = "model.norm.weight"

    def widen(n, t):
        if n != name:
            return n, (t.dtype, t.shape, t.data)
        return n, ("F64", t.shape, t.array().astype("<f8").tobytes())

    _rewrite(b, widen)
    (c,) = tietool.diff(src, b).as_dict()["tensors"]["changed"]
    assert (c["name"], c["dtype_before"], c["dtype_after"]) == (name, "float32", "float64")
    assert c["max_abs_diff"] == 0.0 and c["relative_norm"] == 0.0


# ------------------------------------------------------------------ what the operations change


def test_resize_changes_the_vocabulary_shapes_and_only_the_new_rows(tmp_path):
    src = SAMPLES / "pf_llama_with_tokenizer"
    out = tmp_path / "resized"
    tietool.resize(src, 384, out, seed=0)
    d = tietool.diff(src, out).as_dict()
    changed = {c["name"]: c for c in d["tensors"]["changed"]}
    assert set(changed) == {"model.embed_tokens.weight", "lm_head.weight"}
    for c in changed.values():
        assert (c["shape_before"], c["shape_after"]) == ([320, 16], [384, 16])
        assert c["rows_changed"]["ranges"] == [[320, 384]] and c["rows_changed"]["common"] == 320
        assert c["max_abs_diff"] == 0.0  # the common rows are bit-identical
    assert d["config"] == {
        "added": [],
        "removed": [],
        "changed": [{"key": "vocab_size", "before": 320, "after": 384}],
    }
    assert d["tokenizer"] == {"added": [], "removed": [], "renumbered": []}
    assert d["files"] == {"added": [], "removed": [], "changed": []}
    assert d["tensors"]["added"] == d["tensors"]["removed"] == d["tensors"]["renamed"] == []
    assert d["tensors"]["identical"] == len(fs.read_checkpoint(src)) - 2


def test_add_tokens_shows_the_tokens_their_rows_and_the_tokenizer_files(tmp_path):
    src = SAMPLES / "pf_llama_with_tokenizer"
    out = tmp_path / "added"
    tietool.add_tokens(src, ["<tool_call>", "</tool_call>"], out, special=True)
    d = tietool.diff(src, out).as_dict()
    assert d["tokenizer"]["added"] == [
        {"token": "<tool_call>", "id": 304},
        {"token": "</tool_call>", "id": 305},
    ]
    assert d["tokenizer"]["removed"] == d["tokenizer"]["renumbered"] == []
    ref = reference(
        fs.read_checkpoint(src),
        fs.read_checkpoint(out),
        {"model.embed_tokens.weight": 0, "lm_head.weight": 0},
    )
    check_against(tietool.diff(src, out), ref)
    for c in d["tensors"]["changed"]:
        assert c["rows_changed"]["ranges"] == [[304, 306]]  # the slack rows the tokens took, nothing else
    changed_files = {f["name"] for f in d["files"]["changed"]}
    assert changed_files == {
        n
        for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        if (src / n).exists()
    } & {
        p.name
        for p in out.iterdir()
        if (src / p.name).exists() and (src / p.name).read_bytes() != p.read_bytes()
    }
    assert d["config"]["changed"] == []


def test_untie_then_tie(tmp_path):
    src = SAMPLES / "pf_llama_tied_fp32"
    untied, tied = tmp_path / "untied", tmp_path / "tied"
    tietool.untie(src, untied)
    tietool.tie(untied, tied)
    d = tietool.diff(src, untied).as_dict()
    assert d["config"]["changed"] == [{"key": "tie_word_embeddings", "before": True, "after": False}]
    assert d["tensors"]["changed"] == [] and d["tensors"]["added"] == d["tensors"]["removed"] == []
    assert any("tietool-report.json is only in B" in n for n in d["notes"])
    back = tietool.diff(src, tied)
    ref = reference(fs.read_checkpoint(src), fs.read_checkpoint(tied), {})
    check_against(back, ref)
    assert back.as_dict()["config"]["changed"] == []


# ------------------------------------------------------------------ rank files and flex checkpoints


@pytest.mark.parametrize("variant", sorted(p.name for p in (DATA / "tp_ranks").iterdir() if p.is_dir()))
def test_rank_files_against_the_state_dict_they_were_cut_from(variant):
    """PaddleFormers cut ``original/`` into rank files; read as their merge they hold its tensors bit for bit
    (the numpy reader of ``original/`` is the reference)."""
    base = DATA / "tp_ranks" / variant
    n = len(fs.read_checkpoint(base / "original"))
    for ranks in sorted(p for p in base.iterdir() if p.name.startswith("tp")):
        d = tietool.diff(ranks, base / "original").as_dict()
        assert d["read_as"] == {"a": "rank files", "b": "checkpoint"}
        assert d["tensors"]["identical"] == n, (ranks, d["tensors"])
        assert not d["tensors"]["changed"] and not d["tensors"]["added"] and not d["tensors"]["removed"]


def test_sample_rank_files_against_their_merge(tmp_path):
    src = SAMPLES / "pf_llama_tp2"
    out = tmp_path / "merged"
    tietool.merge(src, out)
    res = tietool.diff(src, out)
    assert res.identical and res.exit_code == 0, res.as_dict()
    assert res.identical_tensors == len(fs.read_checkpoint(out))
    edit(out, {"model.embed_tokens.weight": [16 * 40]})
    ref_emb = fs.read_checkpoint(out)["model.embed_tokens.weight"]
    (c,) = tietool.diff(src, out).as_dict()["tensors"]["changed"]
    assert c["name"] == "model.embed_tokens.weight" and c["rows_changed"]["ranges"] == [[40, 41]]
    assert c["max_abs_diff"] > 0 and ref_emb.shape == tuple(c["shape_after"])


@pytest.mark.parametrize(
    "folder, start",
    [
        ("trainer_1rank", "trainer_1rank"),
        ("trainer_2rank", "trainer_1rank"),
        ("trainer_tied", "trainer_tied"),
    ],
)
def test_a_flex_checkpoint_against_its_merge_and_its_base(folder, start, tmp_path):
    """A Trainer ``checkpoint-N/`` (written by Paddle) read as its merge: identical to the merge output;
    against the base model it started from, the measures numpy computes between the merge output and base
    (``trainer_2rank`` is the Trainer of ``trainer_1rank`` on two ranks: the same base)."""
    base = DATA / "flex" / start / "base"
    src = _copy(DATA / "flex" / folder / "checkpoint-2", tmp_path / "checkpoint-2")
    shutil.copy(base / "config.json", src / "config.json")  # the Trainer's save has none: the run's model's
    out = tmp_path / "merged"
    tietool.merge(src, out)
    res = tietool.diff(src, out)
    assert res.as_dict()["tensors"]["changed"] == [] and res.identical_tensors == len(fs.read_checkpoint(out))
    axes = {"model.embed_tokens.weight": 0, "lm_head.weight": 0}
    ref = reference(fs.read_checkpoint(out), fs.read_checkpoint(base), axes)
    check_against(tietool.diff(src, base), ref)


# ------------------------------------------------------------------ other containers, places, modes


def test_pdparams_against_its_safetensors_conversion(tmp_path):
    """The same tensors in two containers (a bf16 ``.pdparams`` stores uint16 bits): identical tensors."""
    src = CASES_DIR / "pnlp_llama_untied_bf16"
    out = tmp_path / "st"
    tietool.convert(src, "safetensors", out)
    d = tietool.diff(src, out).as_dict()
    assert d["tensors"]["identical"] == len(fs.read_checkpoint(src))
    assert d["tensors"]["changed"] == d["tensors"]["added"] == d["tensors"]["removed"] == []


def test_a_remote_side(tmp_path):
    from tietool.surgery.io.stores import MemoryStore

    src = CASES_DIR / "pf_llama_tied_sharded"
    st = MemoryStore.from_folder(src)
    try:
        res = tietool.diff(src, st.url)
        assert res.identical, res.as_dict()
        b = _copy(src, tmp_path / "b")
        edit(b, {"model.embed_tokens.weight": [32 * 11]})
        (c,) = tietool.diff(st.url, b).as_dict()["tensors"]["changed"]
        assert c["rows_changed"]["ranges"] == [[11, 12]]
    finally:
        st.clear()


def test_a_hard_linked_copy_is_identical_unread(tmp_path, monkeypatch):
    src = CASES_DIR / "pf_llama_tied_sharded"
    b = tmp_path / "b"
    b.mkdir()
    for p in src.iterdir():
        os.link(p, b / p.name)

    def unread(*_a, **_k):
        raise AssertionError("a tensor was read")

    monkeypatch.setattr(Checkpoint, "iter_rows", unread)
    monkeypatch.setattr(Checkpoint, "load", unread)
    assert tietool.diff(src, b).identical


def test_no_values_compares_headers(tmp_path):
    src = SAMPLES / "pf_llama_with_tokenizer"
    out = tmp_path / "resized"
    tietool.resize(src, 384, out, init="zeros")
    d = tietool.diff(src, out, values=False).as_dict()
    assert d["values_compared"] is False and d["tensors"]["same_header"] == len(fs.read_checkpoint(src)) - 2
    for c in d["tensors"]["changed"]:
        assert c["shape_after"] == [384, 16] and "max_abs_diff" not in c
        assert (
            c["after"]["nbytes"] == 384 * 16 * 4 and c["after"]["file"] == "model-00001-of-00001.safetensors"
        )
    b = _copy(src, tmp_path / "b")
    edit(b, {"model.embed_tokens.weight": [0]})
    assert tietool.diff(src, b, values=False).identical  # headers only: a changed value is not seen
    assert not tietool.diff(src, b).identical


# ------------------------------------------------------------------ the command line


def test_cli_exit_codes_and_json_schema(tmp_path):
    src = SAMPLES / "pf_llama_tied_fp32"
    same = run_cli(["diff", src, src])
    assert same.rc == 0 and "verdict: identical" in same.stdout
    out = tmp_path / "resized"
    tietool.resize(src, 128, out, init="zeros")
    r = run_cli(["diff", src, out, "--json"])
    assert r.rc == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["schema"] == "tietool.diff/1" and d["exit_code"] == 1 and d["identical"] is False
    assert set(d) == {
        "schema",
        "a",
        "b",
        "read_as",
        "values_compared",
        "identical",
        "exit_code",
        "tensors",
        "config",
        "metadata",
        "tokenizer",
        "files",
        "notes",
    }
    assert set(d["tensors"]) == {"identical", "added", "removed", "renamed", "changed"}
    assert set(d["tensors"]["changed"][0]) == {
        "name",
        "dtype_before",
        "dtype_after",
        "shape_before",
        "shape_after",
        "before",
        "after",
        "max_abs_diff",
        "relative_norm",
        "rows_changed",
        "note",
    }
    text = run_cli(["diff", src, out])
    assert (
        text.rc == 1
        and "tensors that differ" in text.stdout
        and "verdict: the checkpoints differ" in text.stdout
    )
    assert "config vocab_size: 100 → 128" in text.stdout


def test_cli_bad_input_is_one_line_and_its_exit_code(tmp_path):
    src = SAMPLES / "pf_llama_tied_fp32"
    missing = run_cli(["diff", src, tmp_path / "nowhere"])
    assert missing.rc == 3 and missing.stderr.count("\n") == 1 and "tietool: error:" in missing.stderr
    assert str(tmp_path / "nowhere") in missing.stderr
    broken = _copy(src, tmp_path / "broken")
    (broken / "model-00001-of-00001.safetensors").write_bytes(b"\x10\x00")
    bad = run_cli(["diff", broken, src, "--json"])
    assert bad.rc == 3 and bad.stderr.count("\n") == 1
    assert json.loads(bad.stdout)["exit_code"] == 3
    usage = run_cli(["diff", src])
    assert usage.rc == 2


def test_memory_stays_at_a_few_chunks_not_a_tensor(tmp_path):
    """A 96 MiB tensor with one row changed: the comparison allocates three 16 MiB chunks at most (A's and
    B's read buffers, then A's again for ‖A‖ of the chunks before the difference), the whole diff less than
    the tensor (tracemalloc sees numpy's buffers and the read buffers); the row is found."""
    import tracemalloc

    from tietool.surgery.diff.tensors import compare

    rows, hidden = 24576, 1024
    cfg = json.dumps({"model_type": "llama", "vocab_size": rows, "hidden_size": hidden}).encode()
    a = np.random.default_rng(0).standard_normal((rows, hidden), dtype=np.float32)
    b = a.copy()
    b[20000, 7] += 1.0
    for name, x in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_bytes(cfg)
        _write_st(
            tmp_path / name / "model.safetensors",
            {"model.embed_tokens.weight": ("F32", x.shape, x.tobytes())},
        )
    del a, b
    A, B = Checkpoint.open(tmp_path / "a"), Checkpoint.open(tmp_path / "b")
    tracemalloc.start()
    try:
        m = compare(A, B, "model.embed_tokens.weight", 0)
        _, engine = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        d = tietool.diff(tmp_path / "a", tmp_path / "b").as_dict()
        _, whole = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert m.rows is not None and m.rows.ranges == [[20000, 20001]]
    (c,) = d["tensors"]["changed"]
    assert c["rows_changed"]["ranges"] == [[20000, 20001]] and c["max_abs_diff"] == pytest.approx(
        1.0, rel=1e-6
    )
    assert engine < 3 * (16 << 20) + (8 << 20), f"comparison peak {engine / 2**20:.0f} MiB"
    assert whole < 96 << 20, f"diff peak {whole / 2**20:.0f} MiB for a 96 MiB tensor"
