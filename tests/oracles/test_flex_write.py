"""tietool's flex ``.metadata`` writer (``surgery/io/flex_write.py``) against tietool's reader and against
paddle itself.

- Round trip: for every Paddle-written ``.metadata`` in ``tests/data/flex`` (slices by rows and columns,
  replicas, flattened slices, the Trainer's three folders), writing what tietool read and reading it back
  gives the same tensors.
- The oracle (slow, one subprocess): paddle's own ``load_state_dict`` fills full-size zeros from each
  fixture folder whose ``.metadata`` tietool rewrote, and from folders tietool wrote whole (``.distcp`` by
  its ``.pdparams`` writer, fp32 and bf16 as uint16); the result equals the fixture's ``oracle.npz`` (or the
  arrays written) bit for bit.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support import flex_support as fx
from support import preload

from tietool.surgery.io import flex, flex_write, pdparams
from tietool.surgery.io.safetensors_io import Source

PY = sys.executable
FOLDERS = [
    *fx.FOLDERS,
    "trainer_1rank/checkpoint-2/model_state",
    "trainer_1rank/checkpoint-2/optimizer_state",
    "trainer_1rank/checkpoint-2/master_weight",
    "trainer_2rank/checkpoint-2/optimizer_state",
    "trainer_bf16_layout/checkpoint-1/model_state",
    "trainer_bf16_layout/checkpoint-1/master_weight",
]
ORACLE = {  # folder -> its oracle file (load_state_dict of the Paddle-written folder)
    **{f: f"{f}/oracle.npz" for f in fx.FOLDERS},
    "trainer_1rank/checkpoint-2/optimizer_state": "trainer_1rank/oracle_optimizer.npz",
    "trainer_2rank/checkpoint-2/optimizer_state": "trainer_2rank/oracle_optimizer.npz",
    "trainer_bf16_layout/checkpoint-1/model_state": "trainer_bf16_layout/oracle.npz",
    "trainer_bf16_layout/checkpoint-1/master_weight": "trainer_bf16_layout/oracle_master_weight.npz",
}
needs_data = pytest.mark.skipif(not (fx.DATA / "ranks2").is_dir(), reason="tests/data/flex not present")


def _metadata(folder: Path) -> Path:
    return next(folder.glob("*.metadata"))


@needs_data
@pytest.mark.parametrize("name", FOLDERS)
def test_round_trip_through_our_reader(name: str, tmp_path: Path) -> None:
    """What tietool reads from a Paddle-written .metadata, written by tietool, reads back identical."""
    want = flex.read_metadata(_metadata(fx.DATA / name))
    flex_write.write_metadata(tmp_path / "0.metadata", want)
    got = flex.read_metadata(tmp_path / "0.metadata")
    assert got == want
    assert list(got) == list(want)  # the order of the tensors too


def _rewritten(name: str, dst: Path) -> Path:
    """A copy of fixture folder ``name`` (its .distcp files) with the .metadata written by tietool."""
    src = fx.DATA / name
    dst.mkdir(parents=True)
    for p in src.glob("*.distcp"):
        shutil.copy2(p, dst / p.name)
    meta = _metadata(src)
    flex_write.write_metadata(dst / meta.name, flex.read_metadata(meta))
    return dst


def _written_whole(dst: Path, arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> Path:
    """A flex folder written by tietool alone: every tensor whole in ``0_0.distcp`` (one slice, offset 0),
    2-D tensors cut in two row blocks over ``0_0`` / ``1_0`` to cover several files."""
    dst.mkdir(parents=True)
    files: dict[str, list[pdparams.Row]] = {"0_0.distcp": [], "1_0.distcp": []}
    tensors = {}
    for name, a in arrays.items():
        cuts = [(0, a.shape[0])] if a.ndim < 2 else [(0, 2), (2, a.shape[0])]
        slices = []
        for k, (lo, hi) in enumerate(cuts):
            part = np.ascontiguousarray(a[lo:hi])
            file = f"{k}_0.distcp"
            files[file].append((name, part.dtype.name, part.shape, Source(array=part), None, False))
            slices.append(flex.FlexSlice(file, name, (lo,) + (0,) * (a.ndim - 1), part.shape))
        tensors[name] = flex.FlexTensor(name, a.shape, dtypes[name], tuple(slices))
    for file, rows in files.items():  # paddle.load makes Tensors of the keys this table names (else ndarrays)
        names = {r[0]: f"generated_tensor_{k}" for k, r in enumerate(rows)}
        pdparams.write_file(dst / file, rows, {"StructuredToParameterName@@": names})
    flex_write.write_metadata(dst / "0.metadata", tensors)
    np.savez(dst.parent / f"{dst.name}.want.npz", **arrays)
    return dst


_LOAD = textwrap.dedent(
    """
    import json, sys, numpy as np, paddle
    out = {}
    for folder, shapes in json.loads(sys.argv[1]).items():
        sd = {n: paddle.zeros(s, dtype=d) for n, (s, d) in shapes.items()}
        paddle.distributed.load_state_dict(sd, folder)
        got = {n: (t.view("uint16") if t.dtype == paddle.bfloat16 else t).numpy() for n, t in sd.items()}
        np.savez(folder + ".got.npz", **got)
    """
)


def _paddle_loads(folders: list[Path]) -> dict[Path, dict[str, np.ndarray]]:
    """paddle's ``load_state_dict`` of each folder into full-size zeros (one subprocess for all)."""
    shapes = {}
    for f in folders:
        ts = flex.read_metadata(_metadata(f))
        shapes[str(f)] = {n: (list(t.shape), t.dtype) for n, t in ts.items()}
    run = preload.run(
        [PY, "-c", _LOAD, json.dumps(shapes)], libs=("paddle",), capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return {f: dict(np.load(f"{f}.got.npz")) for f in folders}


@needs_data
@pytest.mark.slow
def test_paddle_loads_what_we_wrote_bit_for_bit(tmp_path: Path) -> None:
    """The oracle: paddle's load_state_dict of folders whose .metadata (or everything) tietool wrote."""
    rewritten = {name: _rewritten(name, tmp_path / name.replace("/", "_")) for name in ORACLE}
    rng = np.random.default_rng(7)
    fp32 = {"w.fp32": rng.standard_normal((5, 3)).astype(np.float32), "v.fp32": np.arange(4.0, dtype="f4")}
    bits = (rng.integers(-256, 256, (6, 4)) / 64).astype(np.float32).view(np.uint32) >> 16
    bf16 = {"w.bf16": bits.astype(np.uint16), "b.bf16": np.array([0x3F80, 0xC000, 0x0000], np.uint16)}
    whole = [
        _written_whole(tmp_path / "whole_fp32", fp32, dict.fromkeys(fp32, "float32")),
        _written_whole(tmp_path / "whole_bf16", bf16, dict.fromkeys(bf16, "bfloat16")),
    ]
    grown = {name: _grown(name, tmp_path / f"grown_{k}") for k, name in enumerate(GROW)}
    got = _paddle_loads([*rewritten.values(), *whole, *(f for f, _ in grown.values())])
    for name, folder in rewritten.items():
        want = np.load(fx.DATA / ORACLE[name])
        assert sorted(got[folder]) == sorted(want.files), name
        for k in want.files:
            g = got[folder][k]
            assert g.dtype == want[k].dtype and np.array_equal(g, want[k]), (name, k)
    for folder in whole:
        want = np.load(f"{folder}.want.npz")
        assert sorted(got[folder]) == sorted(want.files)
        for k in want.files:
            assert got[folder][k].tobytes() == want[k].tobytes(), (folder.name, k)
    for name, (folder, changed) in grown.items():
        want = dict(np.load(fx.DATA / ORACLE[name]))
        want.update(changed)
        assert sorted(got[folder]) == sorted(want), name
        for k, w in want.items():
            assert got[folder][k].dtype == w.dtype and got[folder][k].tobytes() == w.tobytes(), (name, k)


GROW = {  # folder -> the tensors rewrite_folder replaces (grown by 3 rows) in the tests below
    "trainer_2rank/checkpoint-2/optimizer_state": (
        "lm_head.weight.moment1_0",
        "model.embed_tokens.weight.moment2_0",
    ),
    "trainer_bf16_layout/checkpoint-1/model_state": ("model.embed_tokens.weight",),
    "ranks2": ("rows.fp32", "cols.bf16"),  # sliced over both files: written whole into the first one
}


def _grown(name: str, dst: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Fixture folder ``name`` rewritten by ``flex_write.rewrite_folder`` with the :data:`GROW` tensors
    grown by 3 rows (the old rows from the oracle, bits kept; the new rows a pattern)."""
    src = fx.DATA / name
    tensors = flex.read_metadata(_metadata(src))
    oracle = np.load(fx.DATA / ORACLE[name])
    new = {}
    for key in GROW[name]:
        old = oracle[key]
        extra = (np.arange(3 * old.shape[1]).reshape(3, -1) + 0x3F00).astype(old.dtype)
        new[key] = (tensors[key].dtype, np.concatenate([old, extra]))
    dst.mkdir(parents=True)
    flex_write.rewrite_folder(src, dst, _metadata(src).name, tensors, new)
    return dst, {k: a for k, (_, a) in new.items()}


@needs_data
@pytest.mark.parametrize("name", GROW)
def test_rewrite_folder_links_untouched_files_and_keeps_other_entries(name: str, tmp_path: Path) -> None:
    """Files without a replaced tensor are hard links; in a rewritten file every other entry has the same
    bytes; the .metadata changes only the replaced tensors' records (one whole slice each)."""
    src = fx.DATA / name
    dst, changed = _grown(name, tmp_path / "out")
    before, after = flex.read_metadata(_metadata(src)), flex.read_metadata(_metadata(dst))
    assert list(after) == list(before)
    for k, t in after.items():
        if k in changed:
            assert t.shape == changed[k].shape and len(t.slices) == 1 and t.slices[0].offset == (0, 0)
        else:
            assert t == before[k], k
    touched = {s.file for k in changed for s in before[k].slices}
    for p in src.glob("*.distcp"):
        q = dst / p.name
        if p.name not in touched:
            assert q.stat().st_ino == p.stat().st_ino, p.name
            continue
        old = {t.name: t for t in pdparams.read_header(p, p.name)[0]}
        new = {t.name: t for t in pdparams.read_header(q, q.name)[0]}
        for k, t in old.items():
            if k not in changed:
                assert pdparams.read_array(q, new[k]).tobytes() == pdparams.read_array(p, t).tobytes(), k
        for k in changed:
            if after[k].slices[0].file == p.name:
                assert pdparams.read_array(q, new[k]).tobytes() == changed[k].tobytes(), k
            else:
                assert k not in new, k
