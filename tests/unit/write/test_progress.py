"""Issue 11: the progress bar moves with the bytes written, rewrites included (per tensor, and per chunk
within one), its advances add up to its total (``Plan.output_bytes``) exactly, and it shows a rate and the
time left. No terminal and no timing: the progress factory the operations take records the calls."""

from __future__ import annotations

import io
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.paths import CASES_DIR as FIX

from tietool.cli import render
from tietool.surgery import ops as operations
from tietool.surgery.io.safetensors_io import read_header
from tietool.surgery.write import copy as copies
from tietool.surgery.write import writer as write


class Recorder:
    """A progress factory (``operations.ProgressFactory``) that records, in order, the total it was given,
    each ``advance(name, bytes)`` and (through :func:`watch_rewrites`) each rewritten file finished."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.events: list[tuple[str, str, int]] = []  # ("advance" | "done", output file name, bytes)
        self.lock = threading.Lock()

    @contextmanager
    def __call__(self, total: int):
        self.total = total

        def advance(name: str, nbytes: int) -> None:
            with self.lock:
                self.events.append(("advance", name, nbytes))

        yield advance

    def done(self, name: str) -> None:
        with self.lock:
            self.events.append(("done", name, 0))

    def advances(self, name: str | None = None) -> list[int]:
        return [n for kind, f, n in self.events if kind == "advance" and name in (None, f)]


def watch_rewrites(monkeypatch, rec: Recorder, chunk: int = 4096) -> None:
    """Record the end of every rewritten file in ``rec``; new arrays are written in ``chunk``-byte steps."""
    real = write._rewrite

    def rewrite(plan, f, entries, dst: Path, *a, **k):
        real(plan, f, entries, dst, *a, **k)
        rec.done(dst.name)

    monkeypatch.setattr(write, "_rewrite", rewrite)
    monkeypatch.setattr(copies, "CHUNK_BYTES", chunk)


def _tensor_bytes(path: Path) -> int:
    return sum(t.nbytes for t in read_header(path, path.name)[0])


@pytest.mark.parametrize("case", ["pf_llama_untied_sharded", "pf_llama_untied_fp32"])
def test_resize_reports_bytes_as_they_are_written(tmp_path, monkeypatch, case):
    """A resize (embedding and head rewritten with new rows; in the sharded case each in a shard of its
    own and the other shards copied in threads, in the other one file of every tensor): the advances add
    up to ``output_bytes`` exactly, each output file reports exactly its tensor bytes, a rewritten file of
    several tensors reports at least one advance per tensor before it is finished, and the first advance
    of all comes before the first rewritten file is finished."""
    from tietool.surgery.inspect.detect import detect
    from tietool.surgery.io.checkpoint import Checkpoint
    from tietool.surgery.plan.resize import plan_resize

    src = FIX / case
    det = detect(Checkpoint.open(src))
    plan = plan_resize(det, det.vocab_rows + 40, init="mean")
    rec = Recorder()
    watch_rewrites(monkeypatch, rec)
    out = tmp_path / "out"
    operations.resize(src, det.vocab_rows + 40, out, init="mean", progress=rec)

    assert rec.total == plan.output_bytes
    assert sum(rec.advances()) == plan.output_bytes
    assert all(n > 0 for n in rec.advances())
    shards = sorted(out.glob("model*.safetensors"))
    assert {f: sum(rec.advances(f.name)) for f in shards} == {f: _tensor_bytes(f) for f in shards}

    done = [name for kind, name, _ in rec.events if kind == "done"]
    assert done, "resize rewrites the embedding's and the head's shards"
    first_done = next(i for i, e in enumerate(rec.events) if e[0] == "done")
    assert rec.events[0][0] == "advance" and 0 < first_done
    for name in done:
        end = rec.events.index(("done", name, 0))
        before = [e for e in rec.events[:end] if e[0] == "advance" and e[1] == name]
        n_tensors = len(read_header(out / name, name)[0])
        assert before, f"{name} reported nothing before it was finished"
        if n_tensors > 1:
            assert len(before) >= n_tensors, (name, n_tensors, len(before))


def test_new_rows_are_reported_in_chunks(tmp_path, monkeypatch):
    """Within one tensor, new data is reported per chunk of ``copy.CHUNK_BYTES``: the resized embedding,
    alone in its shard (old rows by byte range, new rows from memory), moves the bar many times."""
    from tietool.surgery.inspect.detect import detect
    from tietool.surgery.io.checkpoint import Checkpoint

    src = FIX / "pf_llama_untied_sharded"
    ckpt = Checkpoint.open(src)
    det = detect(ckpt)
    rec = Recorder()
    watch_rewrites(monkeypatch, rec, chunk=256)
    out = tmp_path / "out"
    rep = operations.resize(src, det.vocab_rows + 64, out, init="mean", progress=rec)
    shard = rep["files"]["rewritten"][0]
    assert len(read_header(out / shard, shard)[0]) == 1
    new_bytes = 64 * ckpt.tensors[det.embedding.name].nbytes // det.vocab_rows
    assert len(rec.advances(shard)) >= 1 + new_bytes // 256, rec.events
    assert max(rec.advances(shard)[1:]) <= 256


@pytest.mark.parametrize(
    "case, op, rewrites",
    [
        ("pnlp_llama_untied_sharded", "resize", True),  # .pdparams shards rewritten
        ("pnlp_llama_untied", "tie", True),  # the head dropped from a .pdparams file
        ("pf_llama_tied_sharded", "tie", False),  # the head's shard removed, the rest copied
        ("pf_llama_untied_sharded", "resize-in-place", True),  # untouched shards hard-linked
    ],
)
def test_advances_add_up_to_the_total(tmp_path, monkeypatch, fixture_copy, case, op, rewrites):
    """Other layouts and routes report the same total: .pdparams rewrites (aliases counted per name),
    copies only, and in place (linked files reported at once)."""
    from tietool.surgery.inspect.detect import detect
    from tietool.surgery.io.checkpoint import Checkpoint

    rec = Recorder()
    watch_rewrites(monkeypatch, rec)
    if op == "resize-in-place":
        src = fixture_copy(case)
        rows = detect(Checkpoint.open(src)).vocab_rows
        operations.resize(src, rows + 8, None, init="zeros", progress=rec)
    elif op == "resize":
        rows = detect(Checkpoint.open(FIX / case)).vocab_rows
        operations.resize(FIX / case, rows + 8, tmp_path / "out", init="zeros", progress=rec)
    else:
        operations.tie(FIX / case, tmp_path / "out", keep="embedding", progress=rec)
    assert rec.total is not None and rec.total > 0
    assert sum(rec.advances()) == rec.total
    assert any(kind == "done" for kind, _, _ in rec.events) == rewrites


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_shows_rate_and_time_left_from_the_first_byte(monkeypatch):
    """On a terminal, a large output gets a bar drawn at once (before any byte), with the transfer rate and
    the time left; small outputs, ``quiet`` and non-terminals get none."""
    import rich.progress

    columns: list = []
    real = rich.progress.Progress

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, *cols, **kw):
            columns.extend(type(c).__name__ for c in cols)
            super().__init__(*cols, **kw)

    monkeypatch.setattr(rich.progress, "Progress", Spy)
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with render.progress(False, 1 << 30) as advance:
        assert advance is not None
        assert "writing" in term.getvalue()  # drawn before the first byte
        advance("model-00001-of-00002.safetensors", 1 << 20)
        assert "model-00001-of-00002.safetensors" in term.getvalue()  # and again on the first bytes
    assert {"TransferSpeedColumn", "TimeRemainingColumn", "DownloadColumn"} <= set(columns)

    for quiet, total in [(True, 1 << 30), (False, 1 << 10)]:
        with render.progress(quiet, total) as advance:
            assert advance is None
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with render.progress(False, 1 << 30) as advance:
        assert advance is None
