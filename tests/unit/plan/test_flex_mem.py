"""Bounded memory of ``resize`` / ``add-tokens --keep-training-state`` of a Trainer flex checkpoint
(issue 21): planning (and ``--dry-run``) decides every refusal from the ``.metadata`` records without
reading optimizer or master-weight data, and the rewrite computes one replacement at a time (each dropped
before the next is made). The written bytes are checked by test_flex_state.py, test_flex_resize_cli.py."""

from __future__ import annotations

import shutil
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import flex_support as fx
from typer.testing import CliRunner

from tietool.cli.app import app
from tietool.surgery.io import flex, flex_write
from tietool.surgery.io.made import Made
from tietool.surgery.model.errors import RefusedError
from tietool.surgery.plan import flex_pieces, flex_state, merge_flex

needs_data = pytest.mark.skipif(
    not (fx.DATA / "trainer_1rank").is_dir(), reason="tests/data/flex not present"
)
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def _ck(name: str, sub: str, tmp: Path) -> Path:
    dst = tmp / name / sub
    shutil.copytree(fx.DATA / name / sub, dst)
    shutil.copy2(fx.DATA / "trainer_1rank" / "base" / "config.json", dst / "config.json")
    return dst


def _no_data(monkeypatch: pytest.MonkeyPatch, allowed: str = "") -> list[str]:
    """Make every read of a slice's values (assembling a tensor) outside folder ``allowed`` fail; returns
    the files read."""
    reads: list[str] = []
    real = flex_pieces.piece_array

    def guarded(path: Path, *a: Any, **k: Any) -> Any:
        reads.append(Path(path).parent.name)
        if Path(path).parent.name != allowed:
            raise AssertionError(f"tensor data read while planning: {path}")
        return real(path, *a, **k)

    # every module that binds piece_array by name (imported above, so none binds ``guarded`` for good)
    for module in (flex_pieces, flex_state, merge_flex):
        monkeypatch.setattr(module, "piece_array", guarded)
    return reads


@needs_data
def test_dry_run_reads_no_optimizer_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planners read the weights they always read (detection compares the embedding and the head);
    the optimizer state and master weights are planned from their ``.metadata`` alone."""
    src = _ck("trainer_bf16_layout", "checkpoint-1", tmp_path)
    reads = _no_data(monkeypatch, "model_state")
    r = CliRunner().invoke(app, ["resize", str(src), "--vocab", "256", "--keep-training-state", "--dry-run"])
    assert r.exit_code == 0 and set(reads) <= {"model_state"}, (r.output, reads)


@needs_data
def test_refusals_from_the_metadata_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing moment is refused by name while no slice is readable at all."""
    src = _ck("trainer_1rank", "checkpoint-2", tmp_path)
    meta = next((src / "optimizer_state").glob("*.metadata"))
    ts = flex.read_metadata(meta)
    flex_write.write_metadata(meta, {k: t for k, t in ts.items() if k != "lm_head.weight.moment2_0"})
    model = flex_state._open(src / "model_state")
    weights = {
        k: Made.call(lambda: pytest.fail("made"), (253, 16), np.dtype(model.tensors[k].storage_dtype))
        for k in VOCAB
    }
    reads = _no_data(monkeypatch)
    with pytest.raises(RefusedError, match=r"lm_head\.weight\.moment2_0"):
        flex_state.state_rewrites(src, weights)
    assert reads == []


@needs_data
@pytest.mark.parametrize("name, sub", [("trainer_1rank", "checkpoint-2"), ("trainer_2rank", "checkpoint-2")])
def test_one_replacement_in_memory_at_a_time(name: str, sub: str, tmp_path: Path) -> None:
    """Every replacement is a Made (made when written); when one is made, every earlier one has been
    freed; the output equals the one written from the same plan without the check (bit for bit)."""
    src = fx.DATA / name / sub
    model = flex_state._open(src / "model_state")
    weights = {}
    for k in VOCAB:
        w = flex_state.full_tensor(model, k)
        weights[k] = np.concatenate([w, np.zeros((3, *w.shape[1:]), w.dtype)])
    edits = flex_state.state_rewrites(src, weights)
    alive: list[weakref.ref[np.ndarray]] = []
    made = 0

    def tracked(lazy: Made) -> Made:
        def make() -> np.ndarray:
            nonlocal made
            assert all(r() is None for r in alive), "an earlier replacement is still in memory"
            a = lazy.make()
            alive.append(weakref.ref(a))
            made += 1
            return a

        assert lazy.dtype is not None
        return Made.call(make, lazy.shape, lazy.dtype)

    lazies = [a for new in edits.values() for _, a in new.values() if isinstance(a, Made)]
    assert len(lazies) >= 2 * len(VOCAB)  # every moment (and master weight) is made when written
    for sub_, new in edits.items():
        meta = next((src / sub_).glob("*.metadata")).name
        tensors = flex.read_metadata(src / sub_ / meta)
        plain = {k: (d, a.as_array() if isinstance(a, Made) else a) for k, (d, a) in new.items()}
        seen = {k: (d, tracked(a) if isinstance(a, Made) else a) for k, (d, a) in new.items()}
        (tmp_path / "a" / sub_).mkdir(parents=True)
        (tmp_path / "b" / sub_).mkdir(parents=True)
        flex_write.rewrite_folder(src / sub_, tmp_path / "a" / sub_, meta, tensors, plain)
        del plain
        flex_write.rewrite_folder(src / sub_, tmp_path / "b" / sub_, meta, tensors, seen)
        for p in sorted((tmp_path / "a" / sub_).iterdir()):
            assert p.read_bytes() == (tmp_path / "b" / sub_ / p.name).read_bytes(), (sub_, p.name)
    assert made == len(lazies)


def test_prefix_of_a_concatenated_source(tmp_path: Path) -> None:
    """``Source.prefix`` of parts (a row-sharded flex tensor's rank files one after another: what resize
    keeps of the old rows) is the first bytes of their concatenation; it had no path before (an internal
    error on a 4-rank checkpoint)."""
    from tietool.surgery.io.safetensors_io import Source

    f = tmp_path / "f.bin"
    f.write_bytes(bytes(range(256)) * 4)
    parts = [Source(f, 10, 100), Source(array=np.arange(50, dtype=np.uint8)), Source(f, 500, 300)]

    def written(s: Source) -> bytes:
        with open(tmp_path / "out.bin", "wb") as out:
            s.write_to(out)
        return (tmp_path / "out.bin").read_bytes()

    whole = written(Source(parts=parts))
    assert whole == f.read_bytes()[10:110] + bytes(range(50)) + f.read_bytes()[500:800]
    for n in (0, 1, 99, 100, 101, 150, 151, 449, 450):
        cut = Source(parts=parts).prefix(n)
        assert cut.nbytes == n and written(cut) == whole[:n], n
