"""Issue 4 mechanisms (not timed): untouched shards are copied byte for byte or hard-linked, inspect reads
no tensor data but the embedding's and the head's, a .pdparams structure is read without its payloads, and
--help / safetensors paths import no paddle."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import cli_runner
from support.paths import BUG_CASES_DIR, REPO
from support.paths import CASES_DIR as FIX

from tietool.surgery.inspect.detect import detect
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.plan.tie import plan_tie
from tietool.surgery.write.writer import execute


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def run_cli(*args, cwd=REPO):
    return cli_runner.run_cli(args, cwd=cwd, timeout=120)


@pytest.mark.parametrize("link", [False, True])
def test_untouched_shards_are_copied_or_linked(tmp_path, fixture_copy, link):
    src = fixture_copy("pf_llama_tied_sharded", "in")
    ck = Checkpoint.open(src)
    head_file = ck.tensors["lm_head.weight"].file
    # the head sits alone in its shard: tie removes that shard and rewrites nothing
    assert [n for n, t in ck.tensors.items() if t.file == head_file] == ["lm_head.weight"]
    out = tmp_path / "out"
    rep = execute(plan_tie(detect(ck)), out, link=link)
    assert rep["files"]["rewritten"] == []
    assert rep["files"]["removed"] == [head_file]
    out_ck = Checkpoint.open(out)
    assert "lm_head.weight" not in out_ck.tensors
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == ck.total_bytes - ck.tensors["lm_head.weight"].nbytes
    # every remaining shard holds exactly the bytes of an input shard (renumbered), same inode with --link
    in_by_hash = {sha(src / f): src / f for f in ck.weight_files}
    for f in out_ck.weight_files:
        h = sha(out / f)
        assert h in in_by_hash, f"{f} is not a byte copy of an input shard"
        if link:
            assert os.stat(out / f).st_ino == os.stat(in_by_hash[h]).st_ino
        else:
            assert os.stat(out / f).st_ino != os.stat(in_by_hash[h]).st_ino
    assert rep["files"]["linked" if link else "copied"] and not rep["files"]["copied" if link else "linked"]


def test_untie_of_a_sharded_checkpoint_adds_a_shard_and_rewrites_none(tmp_path, fixture_copy):
    src = fixture_copy("pf_llama_tied_sharded", "in")
    tied = tmp_path / "tied"
    assert run_cli("tie", src, "--out", tied).returncode == 0
    untied = tmp_path / "untied"
    r = run_cli("untie", tied, "--out", untied, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["files"]["rewritten"] == [] and len(rep["files"]["written"]) == 1
    new = Checkpoint.open(untied)
    assert [n for n, t in new.tensors.items() if t.file == rep["files"]["written"][0]] == ["lm_head.weight"]
    assert new.load("lm_head.weight").tobytes() == new.load("model.embed_tokens.weight").tobytes()
    # every other shard is a byte copy of a shard of the tied input
    old = Checkpoint.open(tied)
    old_hashes = {sha(tied / f) for f in old.weight_files}
    for f in new.weight_files:
        if f not in rep["files"]["written"]:
            assert sha(untied / f) in old_hashes


class _Tracker:
    """Wraps ``open`` in the format modules and records every (file, offset, length) read."""

    def __init__(self):
        self.reads: list[tuple[str, int, int]] = []

    def open(self, path, mode="r", *a, **k):
        f = open(path, mode, *a, **k)
        reads = self.reads
        name = os.path.basename(str(path))

        class F:
            def __init__(self, f):
                self._f = f

            def readinto(self, b):
                pos = self._f.tell()
                n = self._f.readinto(b)
                reads.append((name, pos, n))
                return n

            def read(self, n=-1):
                pos = self._f.tell()
                b = self._f.read(n)
                reads.append((name, pos, len(b)))
                return b

            def readline(self):
                pos = self._f.tell()
                b = self._f.readline()
                reads.append((name, pos, len(b)))
                return b

            def __getattr__(self, a):
                return getattr(self._f, a)

            def __enter__(self):
                return self

            def __exit__(self, *e):
                self._f.close()

        return F(f)


def _overlaps(reads, file, start, n):
    return [r for r in reads if r[0] == file and r[1] < start + n and start < r[1] + r[2]]


@pytest.mark.parametrize("case", ["pf_llama_tied_sharded", "pf_llama_untied_fp32"])
def test_inspect_reads_no_untouched_tensor_data(monkeypatch, case):
    from tietool.surgery.io import checkpoint, safetensors_io, store, stores
    from tietool.surgery.io.pdparams import unpickle as pdparams_unpickle

    tr = _Tracker()
    # store and stores: the file access layer (local files are opened there too: read_range, LocalStore)
    for mod in (safetensors_io, pdparams_unpickle, checkpoint, store, stores):
        monkeypatch.setattr(mod, "open", tr.open, raising=False)
    ck = Checkpoint.open(FIX / case)
    det = detect(ck)
    assert det.comparison.values in ("exact", "different")  # the values were compared
    touched = {det.embedding.name, det.head.name}
    for name, t in ck.tensors.items():
        hits = _overlaps(tr.reads, t.file, t.offset, t.nbytes)
        if name in touched:
            assert hits, f"{name} should have been read to compare values"
        else:
            assert not hits, f"inspect read data of untouched tensor {name}: {hits}"


@pytest.mark.parametrize("case", ["pf_llama_tied_sharded", "pf_llama_untied_fp32", "pnlp_llama_untied"])
def test_inspect_no_values_reads_headers_only(monkeypatch, case):
    """``inspect --no-values`` reads no tensor data at all, the embedding's and head's included."""
    from tietool.surgery.inspect.summary import inspect_path
    from tietool.surgery.io import checkpoint, safetensors_io
    from tietool.surgery.io.pdparams import unpickle as pdparams_unpickle

    tr = _Tracker()
    for mod in (safetensors_io, pdparams_unpickle, checkpoint):
        monkeypatch.setattr(mod, "open", tr.open, raising=False)
    info = inspect_path(FIX / case, compare_values=False)
    ck = Checkpoint.open(FIX / case)
    for name, t in ck.tensors.items():
        if t.offset < 0:  # a small array pickled inline (no byte range of its own): part of the structure
            continue
        hits = _overlaps(tr.reads, t.file, t.offset, t.nbytes)
        assert not hits, f"inspect --no-values read data of {name}: {hits}"
    assert info["tie"]["values"] == "unknown"
    # the rest of the facts are those of a full inspect
    full = inspect_path(FIX / case)
    for key in ("embedding", "head", "head_bias", "vocab", "loader", "architecture"):
        assert info[key] == full[key], key
    if full["savings"]["parameters"]:  # what tying would save, given agreeing values
        assert info["savings"]["parameters"] == full["savings"]["parameters"]
        assert "assumes" in info["savings"]


def test_inspect_no_values_cli_on_unreadable_tensor_data(tmp_path, fixture_copy):
    """Every tensor byte of every shard zeroed out (an unreadable data region, as far as values go): the
    header-only inspect reports the same tensors and says the values were not compared."""
    src = fixture_copy("pf_llama_tied_sharded", "in")
    ck = Checkpoint.open(src)
    for t in ck.tensors.values():
        with open(src / t.file, "r+b") as f:
            f.seek(t.offset)
            f.write(b"\xff" * t.nbytes)  # NaN bf16/f32 patterns: a value comparison would see them
    r = run_cli("inspect", src, "--no-values", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["tie"]["values"] == "unknown"
    assert (
        info["head"]["name"] == "lm_head.weight" and info["embedding"]["name"] == "model.embed_tokens.weight"
    )
    r = run_cli("inspect", src, "--no-values")
    assert r.returncode == 0 and "not compared" in r.stdout, r.stdout + r.stderr


def _copy_threads_alive() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("tietool-copy") and t.is_alive()]


@pytest.mark.parametrize("fail", ["copy", "rewrite", "interrupt"])
def test_parallel_copies_stop_and_clean_up(tmp_path, fixture_copy, monkeypatch, fail):
    """Untouched shards are copied by a pool of threads while the main thread rewrites: when one copy
    fails, a rewrite fails, or the user interrupts, every copy thread has stopped before ``execute``
    returns and nothing is left beside --out; the input is unchanged."""
    import errno
    import threading
    import time

    from tietool.surgery.plan.resize import plan_resize
    from tietool.surgery.write import copy as copies
    from tietool.surgery.write import writer as write

    src = fixture_copy("pf_llama_tied_sharded", "in")
    before = {p.name: sha(p) for p in src.iterdir()}
    ck = Checkpoint.open(src)
    det = detect(ck)
    plan = plan_resize(det, det.vocab_rows + 8, init="zeros")
    assert plan.touched_files() and len(set(ck.weight_files) - set(plan.touched_files())) >= 1
    real_copy = copies.copy_file
    started = threading.Event()

    def slow_copy(s, d, cancelled=None, advance=None):
        started.set()
        if fail == "copy" and s.suffix == ".safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        for _ in range(100):  # a long copy that honours cancellation, as copy_range does
            if cancelled is not None and cancelled():
                return
            time.sleep(0.01)
        real_copy(s, d, cancelled, advance)

    monkeypatch.setattr(copies, "copy_file", slow_copy)
    if fail in ("rewrite", "interrupt"):
        exc = KeyboardInterrupt() if fail == "interrupt" else OSError(errno.EIO, "I/O error")

        def bad_rewrite(*a, **k):
            started.wait(5)
            raise exc

        monkeypatch.setattr(write, "_rewrite", bad_rewrite)
    out = tmp_path / "out"
    from tietool.surgery.model.errors import OutputError

    with pytest.raises(KeyboardInterrupt if fail == "interrupt" else OutputError):
        write.execute(plan, out)
    assert not _copy_threads_alive()
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert {p.name: sha(p) for p in src.iterdir()} == before


def test_parallel_copies_match_sequential(tmp_path, monkeypatch):
    """The same plan executed with 1 and with 8 copy threads gives byte-identical outputs."""
    from tietool.surgery.plan.resize import plan_resize
    from tietool.surgery.write import copy as copies

    ck = Checkpoint.open(FIX / "pf_llama_tied_sharded")
    det = detect(ck)
    outs = []
    for n in (1, 8):
        monkeypatch.setattr(copies, "COPY_THREADS", n)
        out = tmp_path / f"out{n}"
        execute(plan_resize(det, det.vocab_rows + 8, init="zeros"), out)
        outs.append({p.name: sha(p) for p in out.iterdir() if p.name != "tietool-report.json"})
    assert outs[0] == outs[1] and len(outs[0]) > 3


def test_pdparams_structure_is_read_without_payloads(tmp_path, monkeypatch):
    from tietool.surgery.io.pdparams import unpickle as pdparams_unpickle

    ck_dir = tmp_path / "ck"
    ck_dir.mkdir()
    (ck_dir / "config.json").write_text(
        json.dumps(
            {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "tie_word_embeddings": False}
        )
    )
    rng = np.random.default_rng(0)
    sd = {
        "llama.embed_tokens.weight": rng.standard_normal((512, 64)).astype(np.float32),
        "lm_head.weight": rng.standard_normal((64, 512)).astype(np.float32),
    }
    for i in range(8):
        sd[f"llama.layers.{i}.mlp.weight"] = rng.standard_normal((256, 256)).astype(np.float32)
    with open(ck_dir / "model_state.pdparams", "wb") as f:
        pickle.dump(sd, f, protocol=4)
    size = (ck_dir / "model_state.pdparams").stat().st_size
    tr = _Tracker()
    monkeypatch.setattr(pdparams_unpickle, "open", tr.open, raising=False)
    ck = Checkpoint.open(ck_dir)
    read = sum(r[2] for r in tr.reads)
    assert read < 4096 < size, f"walking the pickle read {read} of {size} bytes"
    # and the arrays it locates are the real ones
    for name, arr in sd.items():
        assert ck.load(name).tobytes() == arr.tobytes()


def _imports_after(code: str) -> set[str]:
    r = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def test_help_imports_neither_paddle_nor_numpy():
    mods = _imports_after(
        "from tietool.cli.app import app\ntry:\n    app(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert "paddle" not in mods and "numpy" not in mods
    # of the library, only the light modules (the option enums, the exit codes, the typed results:
    # standard library only), never the pipeline (checkpoint, detect, plan, write: numpy)
    library = sorted(m for m in mods if m.startswith("tietool.surgery."))
    light = [
        "tietool.surgery.model",
        "tietool.surgery.model.enums",
        "tietool.surgery.model.errors",
        "tietool.surgery.results",
    ]
    assert library == light, f"--help imported the library: {library}"


def test_safetensors_paths_import_no_paddle(tmp_path):
    out = tmp_path / "o"
    code = (
        f"from tietool.cli.app import app\nfor args in (['inspect', {str(FIX / 'pf_llama_tied_fp32')!r}], "
        f"['tie', {str(FIX / 'pf_llama_tied_fp32')!r}, '--out', {str(out)!r}]):\n"
        "    try:\n        app(args)\n    except SystemExit as e:\n        assert not e.code, e.code"
    )
    mods = _imports_after(code)
    assert (out / "model-00001-of-00001.safetensors").exists()
    assert "paddle" not in mods


# ---------------------------------------------------------------- unknown architectures, T5 round trip
# (placed here for lack of a better home; these are detection tests, not streaming ones)


def _unknown_arch(tmp_path: Path, head_differs: bool) -> Path:
    """A Llama fixture renamed to names and a model_type tietool does not know."""
    from tietool.surgery.io.safetensors_io import write_file

    src = Checkpoint.open(FIX / "pf_llama_untied_fp32" if head_differs else FIX / "pf_llama_tied_fp32")
    d = tmp_path / "zorblax"
    d.mkdir()
    ren = {"model.embed_tokens.weight": "zb.wordvecs.w", "lm_head.weight": "zb.unembed.w"}
    write_file(
        d / "model.safetensors",
        [(ren.get(n, n), t.dtype, t.shape, src.source(n)) for n, t in src.tensors.items()],
        None,
    )
    cfg = dict(src.config, model_type="zorblax", architectures=["ZorblaxForCausalLM"])
    cfg.pop("paddleformers_version", None)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_unknown_architecture_with_two_candidate_tables_refuses_until_named(tmp_path):
    d = _unknown_arch(tmp_path, head_differs=True)
    for args in (
        ["inspect", d],
        ["tie", d, "--out", tmp_path / "o1"],
        ["resize", d, "--vocab", "107", "--out", tmp_path / "o2"],
    ):
        r = run_cli(*args)
        assert r.returncode == 5, (args, r.stdout, r.stderr)
        assert "--embedding" in r.stderr and "zb.wordvecs.w" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    r = run_cli(
        "resize",
        d,
        "--vocab",
        "107",
        "--init",
        "zeros",
        "--out",
        tmp_path / "o3",
        "--embedding",
        "zb.wordvecs.w",
        "--head",
        "zb.unembed.w",
    )
    assert r.returncode == 0, r.stderr
    out = Checkpoint.open(tmp_path / "o3")
    assert out.tensors["zb.wordvecs.w"].shape == (107, 16) and out.tensors["zb.unembed.w"].shape == (107, 16)
    r = run_cli("tie", d, "--out", tmp_path / "o4", "--embedding", "zb.wordvecs.w", "--head", "zb.unembed.w")
    assert r.returncode == 5 and "differs" in r.stderr


def test_t5_untie_then_tie_round_trip(tmp_path):
    untied, tied = tmp_path / "u", tmp_path / "t"
    from tietool.surgery.arch import lookup

    if not lookup("t5", "paddlenlp-2.8", "pdparams").trusted:
        # no test loads PaddleNLP 2.8.1 T5: the layout of the head untie would write is unproven (refused,
        # naming --layout) and tie would keep the head, so there is no round trip to check
        r = run_cli("untie", FIX / "pnlp_t5", "--out", untied)
        assert r.returncode == 5 and "--layout" in r.stderr and not untied.exists(), r.stderr
        return
    assert run_cli("untie", FIX / "pnlp_t5", "--out", untied).returncode == 0
    r = run_cli("tie", untied, "--out", tied)
    assert r.returncode == 0, r.stderr
    a, b = Checkpoint.open(FIX / "pnlp_t5"), Checkpoint.open(tied)
    assert set(a.tensors) == set(b.tensors)
    for n in a.tensors:
        assert a.load(n).tobytes() == b.load(n).tobytes()
    assert run_cli("tie", untied, "--out", tmp_path / "k", "--keep", "head").returncode in (0, 5)


def test_close_joins_copy_threads_through_a_second_interrupt(monkeypatch):
    """A second Ctrl-C while the copies are being stopped must not cut the join short (else the temporary
    folder is removed while a thread still writes into it, and comes back)."""
    import threading

    from tietool.surgery.write.copy import Copier

    copier = Copier(None)
    release = threading.Event()
    copier._pending.append(copier._pool.submit(release.wait, 10))
    real, calls = copier._pool.shutdown, []

    def shutdown(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the second Ctrl-C, while waiting for the threads
        release.set()
        return real(*a, **k)

    monkeypatch.setattr(copier._pool, "shutdown", shutdown)
    copier.close()
    assert len(calls) == 2 and not _copy_threads_alive()


def test_temp_folder_removed_through_a_second_interrupt(tmp_path, monkeypatch):
    """Ctrl-C during the write, then again during the removal of the temporary folder: it is still removed."""
    import shutil

    from tietool.surgery.write import writer as write

    src = FIX / "pf_llama_tied_sharded"
    det = detect(Checkpoint.open(src))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    real_rmtree, calls = shutil.rmtree, []

    def rmtree(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_rmtree(*a, **k)

    monkeypatch.setattr(write, "_write_configs", interrupted)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with pytest.raises(KeyboardInterrupt):
        execute(plan_tie(detect(Checkpoint.open(src))), tmp_path / "out")
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert len(calls) == 2
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    assert det.head.name == "lm_head.weight"


@pytest.mark.parametrize("op", ["tie", "untie", "resize"])
@pytest.mark.parametrize("case", ["pf_llama_tied_sharded", "pnlp_llama_untied_sharded", "pnlp_llama_untied"])
def test_progress_counts_every_written_byte_once(tmp_path, op, case):
    """The progress bar's total is the output's tensor bytes (``Plan.output_bytes`` = the index total_size),
    and the bytes reported (by the copy threads as they copy, and per tensor in rewrites) add up to the
    tensor bytes of each weight file written, each counted once, so the bar ends at its total."""
    import threading

    from tietool.surgery.plan.resize import plan_resize
    from tietool.surgery.plan.untie import plan_untie

    det = detect(Checkpoint.open(FIX / case))
    plan = {
        "tie": lambda: plan_tie(det, keep="embedding"),
        "untie": lambda: plan_untie(det),
        "resize": lambda: plan_resize(det, det.vocab_rows + 16, init="zeros"),
    }[op]()
    if not plan.changed:
        pytest.skip(f"{op} changes nothing on {case}")
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def progress(name, n):
        with lock:
            seen[name] = seen.get(name, 0) + n

    facts = execute(plan, tmp_path / "out", progress=progress)
    assert plan.output_bytes == facts["total_size"]
    out = tmp_path / "out"
    per_file: dict[str, int] = {}
    for t in Checkpoint.open(out).tensors.values():
        per_file[t.file] = per_file.get(t.file, 0) + t.nbytes
    assert seen == per_file and set(seen) == set(facts["weight_files"])
    assert sum(seen.values()) == plan.output_bytes


def test_copy_error_names_the_file_being_written(tmp_path, monkeypatch):
    """A kernel-copy error carries no file name; the one-line message names the output file."""
    import errno

    from typer.testing import CliRunner

    from tietool.cli.app import app
    from tietool.surgery.io import safetensors_io

    def efbig(*a, **k):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(safetensors_io.os, "copy_file_range", efbig)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["tie", str(FIX / "pf_llama_tied_sharded"), "--out", str(out), "-q"])
    assert r.exit_code == 6, r.output
    line = " ".join(r.output.split())
    assert "File too large" in line and ".safetensors" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum, code", [(2, 130), (15, 143)])
def test_interrupt_exit_codes(tmp_path, monkeypatch, signum, code):
    """Ctrl-C exits 130, SIGTERM 143 (128 + the signal), with one line and nothing written."""
    import signal

    from tietool.cli import errors
    from tietool.surgery.write import writer as write

    def signalled(*a, **k):
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        errors._on_signal(signum, None)

    monkeypatch.setattr(write, "_write_configs", signalled)
    monkeypatch.setattr(errors, "_signal_received", None)
    out = tmp_path / "out"
    # in process through run_cli, which puts back the signal handlers main() leaves (it ignores SIGINT,
    # SIGTERM and SIGHUP once the run has said its result)
    run = cli_runner.run_cli(["tie", FIX / "pf_llama_tied_sharded", "--out", out, "-q"])
    assert run.rc == code, run.stderr
    assert run.stderr.count("\n") == 1 and "interrupted" in run.stderr
    assert list(tmp_path.iterdir()) == []


def _all_inputs():
    return sorted(
        [p for p in FIX.iterdir() if (p / "config.json").is_file()]
        + [p / "ckpt" for p in BUG_CASES_DIR.iterdir() if (p / "ckpt" / "config.json").is_file()]
    )


@pytest.mark.parametrize("path", _all_inputs(), ids=lambda p: p.name if p.name != "ckpt" else p.parent.name)
def test_inspect_no_values_agrees_with_full_inspect(path):
    """Whatever the headers alone can tell, ``--no-values`` tells as the full inspect does: tensors,
    layout, config tie state, storage sharing (one array under two names), the layout ambiguity, and the
    reason a loader cannot save bytes."""
    from tietool.surgery.inspect.summary import inspect_path
    from tietool.surgery.model.errors import TietoolError

    try:
        full = inspect_path(path)
    except TietoolError:
        with pytest.raises(TietoolError):
            inspect_path(path, compare_values=False)
        return
    fast = inspect_path(path, compare_values=False)
    for key in ("embedding", "head", "head_bias", "vocab", "loader", "architecture", "format", "files"):
        assert fast[key] == full[key], key
    for key in ("config", "config_source", "head_in_files", "storage_shared"):
        assert fast["tie"][key] == full["tie"][key], key
    if full["tie"]["storage_shared"]:
        assert fast["tie"]["values"] == full["tie"]["values"] == "exact"
    elif full["head"]["present"] and full["head"]["layout"] is None:  # shapes that cannot match: different
        assert fast["tie"]["values"] == full["tie"]["values"] == "different"
    elif full["tie"]["values"] in ("exact", "transposed", "scaled", "different"):
        assert fast["tie"]["values"] == "unknown"
    else:  # absent / shared: told by the headers
        assert fast["tie"]["values"] == full["tie"]["values"]
    if "does not re-tie" in full["savings"].get("why_zero", ""):
        assert fast["savings"]["why_zero"] == full["savings"]["why_zero"]
    if any("cannot be told from its shape" in n for n in full["notes"]):
        assert any("cannot be told from its shape" in n for n in fast["notes"])
    if full["savings"]["parameters"] and fast["tie"]["values"] == "unknown":
        assert fast["savings"]["parameters"] == full["savings"]["parameters"] and "assumes" in fast["savings"]


def test_verify_failure_says_so_on_stderr(tmp_path):
    """verify's exit 7 comes with one 'tietool:' line on stderr, like every other non-zero exit."""
    out = tmp_path / "u"
    assert run_cli("untie", FIX / "pf_llama_untied_fp32", "--out", out, "-q").returncode == 0
    ck = Checkpoint.open(out)
    t = ck.tensors["model.norm.weight"]
    with open(out / t.file, "r+b") as f:  # flip one bit of a tensor untie never changes
        f.seek(t.offset)
        b = f.read(1)
        f.seek(t.offset)
        f.write(bytes([b[0] ^ 0x40]))
    r = run_cli("verify", FIX / "pf_llama_untied_fp32", out)
    assert r.returncode == 7
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tietool: verify:") and "1 difference" in lines[0], (
        r.stderr
    )
    assert "model.norm.weight" in r.stdout


def test_out_is_an_existing_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = run_cli("untie", FIX / "pf_llama_tied_fp32", "--out", f)
    assert r.returncode == 2 and "is an existing file" in r.stderr, r.stderr
    assert f.read_text() == "x"


def test_invalid_json_message_keeps_the_position(tmp_path, fixture_copy):
    src = fixture_copy("pf_llama_tied_fp32", "in")
    (src / "config.json").write_text('{"model_type": "llama", "vocab_size": 100,,')
    r = run_cli("inspect", src)
    assert r.returncode == 3 and "line 1 column 43" in r.stderr, r.stderr
