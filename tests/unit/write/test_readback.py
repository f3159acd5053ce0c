"""The read-back of written files (``surgery/io/readback.py``): what the safetensors library and the strict
pickle reader see must be what was planned, or the output is never renamed into place."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file
from support import paths

from tietool.surgery.inspect.detect import detect
from tietool.surgery.io import readback, safetensors_io
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.io.readback import Planned, check_index, check_pdparams, check_safetensors
from tietool.surgery.model.errors import OutputError
from tietool.surgery.plan.tie import plan_tie
from tietool.surgery.write import writer as write_mod

SAMPLES = paths.SAMPLES


def _st(tmp_path: Path, meta: dict[str, str] | None = None) -> Path:
    p = tmp_path / "a.safetensors"
    save_file({"e": np.zeros((4, 2), np.float32), "b": np.ones(4, np.float16)}, str(p), metadata=meta)
    return p


PLANNED = [Planned("e", "F32", (4, 2), 32), Planned("b", "F16", (4,), 8)]


def test_safetensors_as_planned_passes(tmp_path):
    check_safetensors(_st(tmp_path, {"format": "pt"}), PLANNED, {"format": "pt"})


@pytest.mark.parametrize(
    "planned, meta, words",
    [
        ([Planned("e", "F32", (2, 4), 32), PLANNED[1]], None, "dtype/shape differs ['e']"),
        ([Planned("e", "BF16", (4, 2), 32), PLANNED[1]], None, "dtype/shape differs ['e']"),
        (PLANNED[:1], None, "unexpected ['b']"),
        (PLANNED + [Planned("h", "F32", (4, 2), 32)], None, "missing ['h']"),
        (PLANNED, {"format": "pt"}, "__metadata__"),
    ],
)
def test_safetensors_not_as_planned_refused(tmp_path, planned, meta, words):
    with pytest.raises(OutputError) as ei:
        check_safetensors(_st(tmp_path), planned, meta)
    assert words in str(ei.value)
    assert str(tmp_path / "a.safetensors") in str(ei.value)


def test_safetensors_with_a_hole_refused_by_the_library(tmp_path):
    """A header whose offsets leave a hole: tietool's old reader would take it, safetensors does not."""
    header = json.dumps(
        {
            "e": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "f": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    p = tmp_path / "hole.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 24)
    with pytest.raises(OutputError, match="safetensors refuses it"):
        check_safetensors(p, [Planned("e", "F32", (2,), 8), Planned("f", "F32", (2,), 8)], None)


def test_pdparams_checked_by_the_strict_reader(tmp_path):
    src = SAMPLES / "pnlp_gpt" / "model_state.pdparams"
    ckpt = Checkpoint.open(SAMPLES / "pnlp_gpt")
    planned = [Planned(t.name, t.dtype, t.shape, t.nbytes) for t in ckpt.tensors.values()]
    check_pdparams(src, planned)
    with pytest.raises(OutputError, match="missing"):
        check_pdparams(src, planned + [Planned("x", "float32", (1,), 4)])
    bad = tmp_path / "bad.pdparams"
    bad.write_bytes(src.read_bytes()[:200])
    with pytest.raises(OutputError, match="pickle reader refuses it"):
        check_pdparams(bad, planned)


def test_index_must_match_the_shards(tmp_path):
    shards = {"s1": [Planned("a", "F32", (2,), 8)], "s2": [Planned("b", "F32", (3,), 12)]}
    idx = tmp_path / "i.json"
    idx.write_text(json.dumps({"metadata": {"total_size": 20}, "weight_map": {"a": "s1", "b": "s2"}}))
    check_index(idx, shards)
    idx.write_text(json.dumps({"metadata": {"total_size": 20}, "weight_map": {"a": "s1", "b": "s1"}}))
    with pytest.raises(OutputError, match="weight_map"):
        check_index(idx, shards)
    idx.write_text(json.dumps({"metadata": {"total_size": 21}, "weight_map": {"a": "s1", "b": "s2"}}))
    with pytest.raises(OutputError, match="total_size"):
        check_index(idx, shards)


def _tie_plan(tmp_path: Path):
    """tie of the PaddleFormers tied Llama: drops the duplicate head, so the weight file is rewritten."""
    ckpt_dir = tmp_path / "in"
    shutil.copytree(SAMPLES / "pf_llama_tied_fp32", ckpt_dir)
    return plan_tie(detect(Checkpoint.open(ckpt_dir)))


def test_every_written_safetensors_opens_with_the_library(tmp_path):
    """A real write: each output file is what safe_open reads, metadata included."""
    plan = _tie_plan(tmp_path)
    out = tmp_path / "out"
    write_mod.execute(plan, out)
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), framework="numpy") as s:
            assert set(s.keys()) == {n for n, t in Checkpoint.open(out).tensors.items() if t.file == f.name}


@pytest.mark.parametrize("large", [False, True], ids=["safe_open", "large-header"])
def test_a_bad_write_never_reaches_out(tmp_path, monkeypatch, large):
    """If the writer produced a file the library refuses, the output is not renamed into place (read back
    by safe_open, or as a header over the safe_open limit is)."""
    real = safetensors_io.write_rows

    def truncating(path, header, sources, metadata):
        n = real(path, header, sources, metadata)
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size - 4)
        return n

    monkeypatch.setattr(safetensors_io, "write_rows", truncating)
    if large:
        monkeypatch.setattr(readback, "SAFE_OPEN_HEADER", 0)
    plan = _tie_plan(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(OutputError, match="does not read back as planned"):
        write_mod.execute(plan, out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in"]


@pytest.mark.parametrize("tail, words", [(b"\0" * 8, "bytes after the last tensor"), (b"", None)])
def test_input_reader_takes_only_what_the_library_takes(tmp_path, tail, words):
    """tietool's header reader refuses bytes the tensors do not cover, as safe_open does: such an input is
    never copied into an output."""
    from tietool.surgery.model.errors import CheckpointError

    p = _st(tmp_path)
    with open(p, "ab") as fh:
        fh.write(tail)
    if words is None:
        assert sorted(t.name for t in safetensors_io.read_header(p, p.name)[0]) == ["b", "e"]
        return
    with pytest.raises(CheckpointError, match=words):
        safetensors_io.read_header(p, p.name)
    with pytest.raises(Exception, match="not fully covered|incomplete"):
        with safe_open(str(p), framework="numpy"):
            pass


def _ours(tmp_path: Path, meta: dict[str, str] | None = None) -> Path:
    """PLANNED written by tietool's writer, in the planned order (the header a large read-back expects)."""
    p = tmp_path / "ours.safetensors"
    arrays = {"e": np.zeros((4, 2), np.float32), "b": np.ones(4, np.float16)}
    rows = [(t.name, t.dtype, t.shape, safetensors_io.Source(array=arrays[t.name])) for t in PLANNED]
    safetensors_io.write_file(p, rows, meta)
    return p


def test_large_header_read_back_compares_the_header_bytes(tmp_path, monkeypatch):
    """Over SAFE_OPEN_HEADER (a hostile header of millions of tensors) the header on disk must be the one
    serialised from the plan, and the file end where the planned data does; a file whose header differs
    (copied whole, written by another writer) is parsed with the library's rules and compared."""
    monkeypatch.setattr(readback, "SAFE_OPEN_HEADER", 0)
    p = _ours(tmp_path, {"format": "pt"})
    check_safetensors(p, PLANNED, {"format": "pt"})
    with pytest.raises(OutputError, match="dtype/shape differs \\['e'\\]"):
        check_safetensors(p, [Planned("e", "F32", (2, 4), 32), PLANNED[1]], {"format": "pt"})
    with pytest.raises(OutputError, match="__metadata__"):
        check_safetensors(p, PLANNED, None)
    with pytest.raises(OutputError, match="32 bytes for F32 \\[4, 3\\]"):
        check_safetensors(p, [Planned("e", "F32", (4, 3), 32), PLANNED[1]], {"format": "pt"})
    with pytest.raises(OutputError, match="planned twice"):
        check_safetensors(p, [PLANNED[0], PLANNED[0]], {"format": "pt"})
    with open(p, "ab") as fh:
        fh.write(b"\0" * 8)
    with pytest.raises(OutputError, match="bytes, planned"):
        check_safetensors(p, PLANNED, {"format": "pt"})
    lib = _st(tmp_path)  # the library's own order: the parsed comparison
    check_safetensors(lib, PLANNED, None)
    with pytest.raises(OutputError, match="unexpected \\['b'\\]"):
        check_safetensors(lib, PLANNED[:1], None)


def test_large_header_with_a_hole_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(readback, "SAFE_OPEN_HEADER", 0)
    header = json.dumps(
        {
            "e": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "f": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    p = tmp_path / "hole.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 24)
    with pytest.raises(OutputError, match="breaks a rule of the format"):
        check_safetensors(p, [Planned("e", "F32", (2,), 8), Planned("f", "F32", (2,), 8)], None)


def test_index_read_back_is_byte_for_byte(tmp_path):
    """The index tietool wrote must be the one made again from the plan: an entry, a size, a byte
    appended or cut is refused."""
    data = {"metadata": {"total_size": 20}, "weight_map": {"a": "s1", "b": "s2", "ü": "s2"}}
    idx = tmp_path / "i.json"
    write_mod.write_json(idx, data)
    readback.check_json_file(idx, data, write_mod.JSON_STYLE)
    text = idx.read_bytes()
    for bad in (text.replace(b'"s2"', b'"s1"', 1), text + b" ", text[:-1], text.replace(b"20", b"21")):
        idx.write_bytes(bad)
        with pytest.raises(OutputError, match="not the index planned"):
            readback.check_json_file(idx, data, write_mod.JSON_STYLE)


# ------------------------------------------------------------------ one write / check signature, Made


def _rows_and_planned(memo):
    """Two tensors: one made by recipe ``"w"`` through ``memo``, one an array."""
    from tietool.surgery.io.formats import Row
    from tietool.surgery.io.made import Made

    made = Made("w", (3, 2), 24, memo)
    rows = [
        Row("w", "float32", (3, 2), made),
        Row("b", "float32", (2,), safetensors_io.Source(array=np.arange(2, dtype=np.float32))),
    ]
    planned = [Planned("w", "float32", (3, 2), 24), Planned("b", "float32", (2,), 8)]
    return rows, planned


@pytest.mark.parametrize("fmt_name", ["SAFETENSORS", "PDPARAMS", "PDOPT"])
def test_every_format_writes_and_checks_in_one_signature(tmp_path, fmt_name):
    """``write(path, entries, metadata)`` then ``check(path, planned, metadata)`` for each format, the made
    tensor made once though safetensors reads its rows twice (header, then bytes); a file holding other
    tensors than planned is refused."""
    from tietool.surgery.io import formats
    from tietool.surgery.io.formats import MASTER, PickleMeta, Row, Rows
    from tietool.surgery.io.made import Memo

    calls: list[str] = []

    def build(recipe, data):
        calls.append(recipe)
        return np.full((3, 2), 7, np.float32)

    fmt = getattr(formats, fmt_name)
    rows, planned = _rows_and_planned(Memo(build, ["w"]))
    meta = {"format": "pt"} if fmt_name == "SAFETENSORS" else PickleMeta()
    if fmt_name == "SAFETENSORS":
        rows = [r._replace(dtype="F32") for r in rows]
        planned = [Planned(p.name, "F32", p.shape, p.nbytes) for p in planned]
    if fmt_name == "PDOPT":  # the second row is a master weight, written where the extras hold None
        meta = PickleMeta({"LR_Scheduler": {"last_epoch": 1}, "master_weights": None})
        rows[1] = rows[1]._replace(name=MASTER + "b")
        planned[1] = Planned(MASTER + "b", "float32", (2,), 8)
    path = tmp_path / f"f.{fmt_name.lower()}"
    assert fmt.write(path, Rows(rows, lambda r: Row(*r)), meta) == 32
    assert calls == ["w"]
    fmt.check(path, planned, meta)
    with pytest.raises(OutputError, match="does not read back as planned"):
        fmt.check(path, [planned[0]], meta)


def test_made_memo_shares_and_drops(tmp_path):
    """Equal recipes are made once per memo and dropped after their last counted use; a recipe that makes
    another size than planned is refused before a byte of it is written."""
    from tietool.surgery.io.made import Made, Memo

    calls: list[str] = []

    def build(recipe, data):
        if recipe not in data:
            calls.append(recipe)
            data[recipe] = np.ones(4, np.float32) if recipe == "a" else np.ones(3, np.float32)
        return data[recipe]

    memo = Memo(build, ["a", "a"])
    a1, a2 = Made("a", (4,), 16, memo), Made("a", (4,), 16, memo)
    assert a1.made().array.tobytes() == a2.made().array.tobytes()
    assert calls == ["a"] and "a" not in memo.data  # made once, dropped after its second use
    with open(tmp_path / "x", "wb") as f, pytest.raises(ValueError, match="planned"):
        Made("b", (4,), 16, memo).write_to(f)
    assert (tmp_path / "x").stat().st_size == 0
