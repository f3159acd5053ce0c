"""The drift view of ``inspect`` (issue 11): how a head that differs from the embedding differs row by row
(differing rows, max and mean |Δ|, the rows with the largest |Δ| and their tokens, a histogram of per-row
max |Δ|), gathered in the chunked comparison and the same whatever the chunk size.

The checkpoints are the fixture pf_llama_untied_fp32's embedding (``[100, 16]`` float32) with a head equal
to it except known rows, written as safetensors beside its config.json (and, for the ``[hidden, vocab]``
head, pnlp_llama_untied's config and PaddleNLP names).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import fixture_support as fs
from support import paths
from typer.testing import CliRunner

from tietool.cli.app import app
from tietool.surgery.inspect import compare as compare_mod
from tietool.surgery.inspect.detect import detect
from tietool.surgery.inspect.detection import DRIFT_EDGES
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.io.tokenizer import token_strings
from tietool.surgery.model.tensor import bf16_bits_to_f32, f32_to_bf16_bits
from tietool.surgery.ops import inspect as inspect_op

# row -> (column, |Δ| added): one row per histogram bin but "(1e-06, 1e-05]" and "(0.001, 0.01]"; twelve
# rows, so the top ten leave two out; 95 is an added token, 99 has no token
DELTAS = {
    5: (0, 2.0),
    42: (3, 0.5),
    7: (15, 0.25),
    95: (1, 0.2),
    99: (2, 0.125),
    11: (4, 0.05),
    12: (5, 0.03),
    13: (6, 0.02),
    20: (7, 3e-4),
    21: (8, 2e-4),
    30: (9, 5e-5),
    31: (10, 5e-7),
}
TOKENS = {f"tok{i}": i for i in range(90)}
ADDED = [{"id": 95, "content": "<|special|>", "special": True}]


def _embedding() -> np.ndarray:
    raw = fs.read_checkpoint(paths.CASES_DIR / "pf_llama_untied_fp32")
    return np.ascontiguousarray(raw["model.embed_tokens.weight"].array(), dtype=np.float32)


def _drifted(emb: np.ndarray) -> np.ndarray:
    head = emb.copy()
    for r, (c, d) in DELTAS.items():
        head[r, c] += np.float32(d)
    return head


def _write_tokenizer(out: Path) -> None:
    tj = {"model": {"type": "BPE", "vocab": TOKENS}, "added_tokens": ADDED}
    (out / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")


def _folder(tmp_path: Path, case: str, tensors: dict[str, np.ndarray], name: str) -> Path:
    out = tmp_path / name
    out.mkdir()
    cfg = json.loads((paths.CASES_DIR / case / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(out / "model.safetensors"))
    _write_tokenizer(out)
    return out


def _save_bf16(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file of ``BF16`` tensors from bfloat16 bit patterns (uint16), written by hand (numpy has
    no bfloat16)."""
    header, blobs, at = {}, [], 0
    for n, a in tensors.items():
        b = np.ascontiguousarray(a, "<u2").tobytes()
        header[n] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _expected(emb: np.ndarray, head: np.ndarray) -> dict:
    """The numbers the drift must carry, computed on the whole tables."""
    d = np.abs(head.astype(np.float32) - emb.astype(np.float32))
    row_max = d.max(axis=1)
    rows = [int(r) for r in np.flatnonzero(row_max > 0)]
    top = sorted(rows, key=lambda r: (-row_max[r], r))[:10]
    bins = [int((row_max == 0).sum())] + [0] * (len(DRIFT_EDGES) + 1)
    for r in rows:
        bins[1 + int(np.searchsorted(np.asarray(DRIFT_EDGES), float(row_max[r])))] += 1
    return {
        "differing_rows": len(rows),
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.astype(np.float64).mean()),
        "top_rows": [(r, float(row_max[r])) for r in top],
        "histogram": bins,
    }


def _check(folder: Path, want: dict) -> None:
    comp = detect(Checkpoint.open(folder)).comparison
    d = comp.drift
    assert comp.values == "different" and d is not None
    assert d.differing_rows == comp.differing_rows == want["differing_rows"]
    assert d.max_abs_diff == comp.max_abs_diff == want["max_abs_diff"]
    assert d.mean_abs_diff == pytest.approx(want["mean_abs_diff"], rel=1e-12)
    assert list(d.top_rows) == want["top_rows"]
    assert list(d.histogram) == want["histogram"]


@pytest.fixture
def fp32_case(tmp_path):
    emb = _embedding()
    head = _drifted(emb)
    folder = _folder(
        tmp_path, "pf_llama_untied_fp32", {"model.embed_tokens.weight": emb, "lm_head.weight": head}, "fp32"
    )
    return folder, emb, head


def test_drift_numbers_fp32(fp32_case):
    folder, emb, head = fp32_case
    want = _expected(emb, head)
    assert want["differing_rows"] == 12
    assert want["max_abs_diff"] == pytest.approx(2.0, rel=1e-6)
    assert [r for r, _ in want["top_rows"]] == [5, 42, 7, 95, 99, 11, 12, 13, 20, 21]
    #          0   ≤1e-6 ≤1e-5 ≤1e-4 ≤1e-3 ≤1e-2 ≤0.1 ≤1 >1
    assert want["histogram"] == [88, 1, 0, 1, 2, 0, 3, 4, 1]
    _check(folder, want)


@pytest.mark.parametrize("chunk_bytes, halves", [(1, False), (3 * 16 * 4, False), (1, True), (10**9, True)])
def test_drift_same_in_any_chunks(fp32_case, monkeypatch, chunk_bytes, halves):
    """Chunks smaller than a row (one row each), of three rows (not dividing 100), one chunk; one thread or
    two halves: the same numbers (the mean's float64 sum may round differently in the last bits)."""
    folder, emb, head = fp32_case
    monkeypatch.setattr(compare_mod, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(compare_mod, "HALVES_BYTES", 0 if halves else 64 << 20)
    _check(folder, _expected(emb, head))


def test_drift_bf16(tmp_path):
    emb = f32_to_bf16_bits(_embedding())
    head = f32_to_bf16_bits(_drifted(bf16_bits_to_f32(emb)))
    out = tmp_path / "bf16"
    out.mkdir()
    cfg = json.loads((paths.CASES_DIR / "pf_llama_untied_fp32" / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "dtype": "bfloat16"}))
    _save_bf16(out / "model.safetensors", {"model.embed_tokens.weight": emb, "lm_head.weight": head})
    want = _expected(bf16_bits_to_f32(emb), bf16_bits_to_f32(head))
    # the changes of 5e-7, 5e-5 and 2e-4 are below bfloat16's resolution at these values (~1e-4): they vanish
    assert want["differing_rows"] == 9 and want["top_rows"][0][0] == 5
    _check(out, want)


def test_drift_hidden_vocab_head(tmp_path, monkeypatch):
    """A PaddleNLP ``[hidden, vocab]`` head: rows are its columns; one-column blocks give the same."""
    emb = _embedding()
    head = _drifted(emb)
    tensors = {"llama.embed_tokens.weight": emb, "lm_head.weight": np.ascontiguousarray(head.T)}
    folder = _folder(tmp_path, "pnlp_llama_untied", tensors, "pnlp")
    det = detect(Checkpoint.open(folder))
    assert det.head.layout == "hidden-vocab"
    want = _expected(emb, head)
    _check(folder, want)
    monkeypatch.setattr(compare_mod, "CHUNK_BYTES", 1)
    _check(folder, want)


def test_equal_head_has_no_drift(tmp_path):
    emb = _embedding()
    tensors = {"model.embed_tokens.weight": emb, "lm_head.weight": emb.copy()}
    folder = _folder(tmp_path, "pf_llama_untied_fp32", tensors, "equal")
    comp = detect(Checkpoint.open(folder)).comparison
    assert comp.values == "exact" and comp.drift is None
    assert inspect_op(folder)["tie"]["drift"] is None


def test_drift_json_with_tokens(fp32_case):
    folder = fp32_case[0]
    d = inspect_op(folder)["tie"]["drift"]
    assert [(r["row"], r["token"]) for r in d["top_rows"]] == [
        (5, "tok5"),
        (42, "tok42"),
        (7, "tok7"),
        (95, "<|special|>"),  # an added token
        (99, None),  # no file names it
        (11, "tok11"),
        (12, "tok12"),
        (13, "tok13"),
        (20, "tok20"),
        (21, "tok21"),
    ]
    assert d["differing_rows"] == 12 and d["rows"] == 100 and d["elements"] == 1600
    assert d["mean_over"] == "all elements"
    assert [(b["above"], b["up_to"], b["rows"]) for b in d["histogram"]][:2] == [
        (None, 0.0, 88),
        (0.0, 1e-6, 1),
    ]
    assert d["histogram"][-1] == {"above": 1.0, "up_to": None, "rows": 1}


def test_tokens_absent_or_unreadable(tmp_path):
    assert token_strings(tmp_path, [1, 2]) == {}
    (tmp_path / "tokenizer.json").write_text("{not json")
    assert token_strings(tmp_path, [1]) == {}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": [["<unk>", 0], ["▁a", -1]]}}))
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    assert token_strings(tmp_path, [1, 2, 7]) == {1: "▁a", 2: "hello"}


def test_inspect_text_shows_drift(fp32_case):
    # an untied config: the head is its own, so the drift view is shown only when asked (--drift)
    plain = CliRunner().invoke(app, ["inspect", str(fp32_case[0])])
    assert plain.exit_code == 0 and "drift:" not in plain.output and "|Δ|" not in plain.output, plain.output
    r = CliRunner().invoke(app, ["inspect", str(fp32_case[0]), "--drift"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    drift = next(i for i, x in enumerate(lines) if x.startswith("drift: "))
    assert lines[drift].startswith("drift: 12 of 100 rows differ; max |Δ| 2, mean |Δ| ")
    assert lines[drift].endswith("over all 1600 elements (equal ones included)")
    row5 = next(x for x in lines if x.split()[:2] == ["5", '"tok5"'])
    assert row5.split()[2] == "2"
    assert any(x.split()[:3] == ["95", '"<|special|>"', "0.2"] for x in lines)
    assert any(x.split()[:2] == ["42", '"tok42"'] for x in lines)
    zero = next(x for x in lines if x.strip().startswith("0 (equal)"))
    assert zero.split()[2] == "88" and zero.split()[3] == "▇" * 40
    over = next(x for x in lines if x.strip().startswith("> 1"))
    assert over.split()[2:] == ["1", "▇"]  # a bin with rows shows at least one block
    tenth = next(x for x in lines if x.strip().startswith("(0.1, 1]"))
    assert tenth.split()[2:] == ["4", "▇" * round(40 * 4 / 88)]
    # a head equal to the embedding: no drift section
    assert (
        "drift:"
        not in CliRunner().invoke(app, ["inspect", str(paths.CASES_DIR / "pf_llama_tied_fp32")]).output
    )


def _counting_rows(monkeypatch) -> list[int]:
    """Rows ``Checkpoint.iter_rows`` hands out from now on (both tables, both halves), in a list."""
    read: list[int] = []
    orig = Checkpoint.iter_rows

    def counted(self, *a, **k):
        for chunk in orig(self, *a, **k):
            read.append(len(chunk))
            yield chunk

    monkeypatch.setattr(Checkpoint, "iter_rows", counted)
    return read


@pytest.mark.parametrize("halves", [False, True])
def test_first_difference_stops_at_the_first_differing_chunk(fp32_case, monkeypatch, halves):
    """``first_difference``: ``different`` without a magnitude, read up to the first differing row (row 5
    of 100, one row a chunk; with two halves, the second half stops at its own first difference, row 95, or
    when the first half found one)."""
    folder, emb, _ = fp32_case
    monkeypatch.setattr(compare_mod, "CHUNK_BYTES", 1)
    monkeypatch.setattr(compare_mod, "HALVES_BYTES", 0 if halves else 64 << 20)
    read = _counting_rows(monkeypatch)
    comp = compare_mod.compare(
        Checkpoint.open(folder),
        "model.embed_tokens.weight",
        "lm_head.weight",
        "vocab-hidden",
        first_difference=True,
    )
    assert comp.values == "different"
    assert (comp.max_abs_diff, comp.differing_rows, comp.drift) == (None, None, None)
    assert sum(read) <= (2 * (6 + 46) if halves else 2 * 6)  # a row of each table per chunk
    read.clear()
    full = compare_mod.compare(
        Checkpoint.open(folder), "model.embed_tokens.weight", "lm_head.weight", "vocab-hidden"
    )
    assert full.differing_rows == 12 and sum(read) == 2 * emb.shape[0]


def test_first_difference_of_equal_tables_reads_them_whole(tmp_path, monkeypatch):
    emb = _embedding()
    tensors = {"model.embed_tokens.weight": emb, "lm_head.weight": emb.copy()}
    folder = _folder(tmp_path, "pf_llama_untied_fp32", tensors, "equal")
    read = _counting_rows(monkeypatch)
    comp = detect(Checkpoint.open(folder), first_difference=True).comparison
    assert comp.values == "exact" and sum(read) == 2 * emb.shape[0]


@pytest.mark.parametrize("tied", [False, True])
def test_detect_first_difference_keeps_the_drift_of_a_tied_config(fp32_case, tied):
    """Only an untied config's pair stops early: a tied config's different head is a finding that names its
    drift, so it is read whole (the same comparison and findings as without ``first_difference``)."""
    folder, emb, head = fp32_case
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": tied}))
    fast = detect(Checkpoint.open(folder), first_difference=True)
    full = detect(Checkpoint.open(folder))
    assert fast.comparison.values == full.comparison.values == "different"
    if tied:
        assert fast.comparison == full.comparison and fast.comparison.drift is not None
        assert [f.kind for f in fast.findings] == [f.kind for f in full.findings]
        assert "tied-but-different" in [f.kind for f in fast.findings]
    else:
        assert fast.comparison.drift is None and full.comparison.differing_rows == 12
