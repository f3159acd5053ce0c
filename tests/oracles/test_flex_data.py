"""The flex-checkpoint fixtures of tests/data/flex (issue 21): what their pickles name, their oracles'
shapes, and (slow) that their generators, run again with real Paddle, reproduce every byte."""

from __future__ import annotations

import json
import pickletools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import paths

DATA = paths.FLEX
FOLDERS = ("single", "ranks2", "ranks2_replicas", "flat2", "mesh2x2")
TRAINERS = ("trainer_1rank", "trainer_2rank", "trainer_tied")
LAYOUTS = ("trainer_bf16_layout",)
RECORDS = "paddle.distributed.flex_checkpoint.dcp.metadata"
NUMPY = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}
VARIES = {"training_args.bin"}  # holds the absolute output path


def _globals(path: Path) -> set[tuple[str, str]]:
    """(module, name) of every STACK_GLOBAL/GLOBAL, following memoized strings (no unpickling)."""
    memo: dict[int, object] = {}
    stack: list[object] = []
    found: set[tuple[str, str]] = set()
    for op, arg, _ in pickletools.genops(path.read_bytes()):
        if op.name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo.get(int(arg)))
        elif op.name == "STACK_GLOBAL":
            found.add((str(stack[-2]), str(stack[-1])))
            stack[-2:] = [None]
        elif op.name == "GLOBAL":
            found.add(tuple(str(arg).split(" ", 1)))  # type: ignore[arg-type]
            stack.append(None)
        else:
            stack.append(arg if isinstance(arg, str) else None)
    return found


def _metadata_files() -> list[Path]:
    return [p for p in DATA.rglob("*.metadata") if "hostile" not in p.parts]


def test_metadata_pickles_name_exactly_the_three_record_classes():
    files = _metadata_files()
    assert len(files) >= len(FOLDERS) + 7  # + 3 folders in each Trainer checkpoint, + save_model's
    for p in files:
        names = _globals(p)
        assert names <= {(RECORDS, c) for c in ("Metadata", "LocalTensorMetadata", "LocalTensorIndex")}, p
        assert (RECORDS, "Metadata") in names, p


def test_distcp_pickles_name_only_numpy():
    files = [p for p in DATA.rglob("*.distcp") if "hostile" not in p.parts]
    assert files
    for p in files:  # fp32 training: master_weight/ holds empty dicts, which name nothing
        empty = p.parent.name == "master_weight" and p.parts[-4] in TRAINERS
        assert _globals(p) == (set() if empty else NUMPY), p


@pytest.mark.parametrize(
    "folder", FOLDERS + TRAINERS + LAYOUTS + tuple(f"{t}/oracle_optimizer" for t in TRAINERS)
)
def test_oracle_json_describes_oracle_npz(folder):
    stem = DATA / folder if folder.endswith("oracle_optimizer") else DATA / folder / "oracle"
    info = json.loads(stem.with_suffix(".json").read_text())["tensors"]
    arrays = np.load(stem.with_suffix(".npz"))
    assert sorted(arrays.files) == sorted(info)
    for name, want in info.items():
        a = arrays[name]
        assert list(a.shape) == want["shape"], name
        assert a.dtype == (np.uint16 if want["dtype"] == "bfloat16" else np.dtype(want["dtype"])), name
        assert a.any(), name  # values are rng draws, never all zeros


def test_trainer_oracle_names_are_the_state_dict_names():
    for t in TRAINERS:
        names = json.loads((DATA / t / "state_dict_names.json").read_text())
        info = json.loads((DATA / t / "oracle.json").read_text())["tensors"]
        assert {k: v["shape"] for k, v in info.items()} == names


def test_bf16_layout_master_weights_are_fp32_near_the_bf16_weights():
    base = DATA / "trainer_bf16_layout"
    weights, masters = np.load(base / "oracle.npz"), np.load(base / "oracle_master_weight.npz")
    assert sorted(masters.files) == sorted(f"{k}.w_0" for k in weights.files)
    for k in weights.files:
        as_fp32 = (weights[k].astype(np.uint32) << 16).view(np.float32)
        assert masters[f"{k}.w_0"].dtype == np.float32
        assert 0 < np.abs(masters[f"{k}.w_0"] - as_fp32).max() <= 1 / 1024, k


def _files(root: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for name in names
        for p in sorted((root / name).rglob("*"))
        if p.is_file() and p.name not in VARIES
    }


@pytest.mark.slow
def test_generators_reproduce_every_byte(tmp_path):
    pytest.importorskip("paddle")
    names = FOLDERS + TRAINERS + LAYOUTS
    subprocess.run(
        [sys.executable, str(DATA / "make_flex.py"), "--out", str(tmp_path), "--only", *names],
        check=True,
        capture_output=True,
        timeout=900,
    )
    want, got = _files(DATA, names), _files(tmp_path, names)
    assert sorted(got) == sorted(want)
    assert [n for n in want if want[n] != got[n]] == []
    hostile = tmp_path / "hostile"
    subprocess.run(
        [sys.executable, str(DATA / "hostile" / "make_hostile.py"), str(hostile)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    cases = tuple(p.name for p in (DATA / "hostile").iterdir() if p.is_dir())
    want, got = _files(DATA / "hostile", cases), _files(hostile, cases)
    assert sorted(got) == sorted(want)
    assert [n for n in want if want[n] != got[n]] == []
