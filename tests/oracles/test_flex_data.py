"""The flex-checkpoint fixtures of tests/data/flex (issue 21): what their pickles name, their oracles'
shapes, and (slow) that their generators, run again with real Paddle, reproduce every byte."""

from __future__ import annotations

import io
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


TRAINED = (".distcp", ".npy", ".npz")  # in TRAINERS: float payloads a Trainer computed (see below)


def _structure(data: bytes) -> list[tuple[str, object]]:
    """The opcodes of a pickle with every bytes payload replaced by its length (no unpickling)."""
    return [
        (op.name, len(arg) if isinstance(arg, bytes | bytearray) else arg)
        for op, arg, _ in pickletools.genops(data)
    ]


def _trained_close(name: str, want: bytes, got: bytes) -> str | None:
    """None when a Trainer-written file ``name`` matches but for float rounding, else why not."""
    if name.endswith(".distcp"):  # the values are compared through the oracles, read from these files
        return None if _structure(want) == _structure(got) else f"{name}: the pickle's structure differs"
    a, b = np.load(io.BytesIO(want)), np.load(io.BytesIO(got))
    pairs = [(a, b)] if isinstance(a, np.ndarray) else [(a[k], b[k]) for k in a.files]
    if isinstance(a, np.lib.npyio.NpzFile) and sorted(a.files) != sorted(b.files):
        return f"{name}: arrays {sorted(a.files)} != {sorted(b.files)}"
    for x, y in pairs:
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{name}: {x.shape} {x.dtype} != {y.shape} {y.dtype}"
        if x.dtype.kind == "f" and np.abs(x - y).max(initial=0) > 1e-5 * np.abs(x).max(initial=0):
            return f"{name}: max |diff| {np.abs(x - y).max()}"
        if x.dtype.kind != "f" and not np.array_equal(x, y):
            return f"{name}: values differ"
    return None


def _differences(want: dict[str, bytes], got: dict[str, bytes]) -> list[str]:
    """Files that differ: every byte, except that a Trainer's trained floats may differ in rounding."""
    bad = []
    for name in want:
        if want[name] == got[name]:
            continue
        trained = name.split("/", 1)[0] in TRAINERS and name.endswith(TRAINED)
        why = _trained_close(name, want[name], got[name]) if trained else f"{name}: bytes differ"
        if why:
            bad.append(why)
    return bad


@pytest.mark.slow
def test_generators_reproduce_every_byte(tmp_path):
    """Run the generators again: the rng-made folders and every file but the trained floats are equal
    byte for byte. The Trainer folders' weights, moments and logits come out of CPU training, whose
    rounding depends on the CPU's vector instructions (fixtures written on an AVX-512 machine, rerun on an
    AVX2 one: max |diff| 2.5e-6 on logits of magnitude 4.8, 6e-8 on weights), so there the pickles'
    structure is compared exactly and the values within 1e-5 of each array's largest magnitude."""
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
    assert _differences(want, got) == []
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


def test_differences_allow_rounding_only_in_trained_files():
    """The comparison above: a trained float within rounding passes; the same change in an rng-made
    folder, a changed shape, or a pickle with another structure fails."""

    def npy(a):
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()

    x = np.linspace(-4, 4, 12, dtype=np.float32)
    near = npy(x + np.float32(2e-6))
    assert _differences({"trainer_1rank/logits.npy": npy(x)}, {"trainer_1rank/logits.npy": near}) == []
    assert _differences({"single/logits.npy": npy(x)}, {"single/logits.npy": near})
    far = {"trainer_1rank/logits.npy": npy(x + 1e-3)}
    assert _differences({"trainer_1rank/logits.npy": npy(x)}, far)
    short = {"trainer_1rank/logits.npy": npy(x[:-1])}
    assert _differences({"trainer_1rank/logits.npy": npy(x)}, short)
    import pickle

    a, b = pickle.dumps({"w": x.tobytes()}), pickle.dumps({"v": x.tobytes()})
    c = pickle.dumps({"w": (x + 1).tobytes()})
    assert _differences({"trainer_1rank/m/0_0.distcp": a}, {"trainer_1rank/m/0_0.distcp": b})
    assert _differences({"trainer_1rank/m/0_0.distcp": a}, {"trainer_1rank/m/0_0.distcp": c}) == []
