"""The writer of a new checkpoint (convert and merge: :func:`surgery.write.writer.write_new`, laid out by
:func:`surgery.write.layout.reshard`). Shards as save_pretrained does, streams each tensor from its recipe,
reads every file back, and leaves nothing when a source fails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import paths

from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.io.formats import PDPARAMS, SAFETENSORS
from tietool.surgery.io.safetensors_io import Source
from tietool.surgery.model.enums import Container, Operation
from tietool.surgery.model.errors import OutputError, UsageError
from tietool.surgery.plan.plan import OutTensor, Reshard, parse_size, reshard_plan
from tietool.surgery.plan.recipes import CopyOf
from tietool.surgery.write.layout import plan_shards
from tietool.surgery.write.writer import write_new


def assemble(out, tensors, container, config, *, ckpt=None, carry=(), max_shard_size=10**10, progress=None):
    """:func:`write_new` of the plan of a new checkpoint of these parts (the facts it returns)."""
    layout = Reshard(container, max_shard_size, list(tensors), config, list(carry))
    return write_new(reshard_plan(Operation.CONVERT, ckpt, layout, None), out, progress=progress)


FIX = paths.CASES_DIR


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "model.embed_tokens.weight": rng.standard_normal((10, 4)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(4).astype(np.float32),
        "lm_head.weight": rng.integers(0, 2**16, (10, 4), dtype=np.uint16),  # bf16 bits
    }


def _tensors(arrays: dict[str, np.ndarray]) -> list[OutTensor]:
    """The arrays as output tensors: each a :class:`CopyOf` the tensor of that name (:func:`_input`)."""
    label = {np.float32: "F32", np.uint16: "BF16"}
    return [OutTensor(k, label[a.dtype.type], a.shape, CopyOf(k)) for k, a in arrays.items()]


def _input(folder: Path, arrays: dict[str, np.ndarray]) -> Checkpoint:
    """A safetensors checkpoint in ``folder`` holding ``arrays`` (the recipes of :func:`_tensors` read it)."""
    folder.mkdir()
    save_file(arrays, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    return Checkpoint.open(folder)


def test_parse_size_as_paddleformers():
    assert parse_size("10GB") == 10 * 10**9
    assert parse_size("500MiB") == 500 * 2**20
    assert parse_size("16KB") == 16_000
    assert parse_size(1024) == 1024 and parse_size("1024") == 1024
    for bad in ("0", "ten", "-5MB", "5XB", ""):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_plan_shards_greedy_and_big_tensors_alone():
    ts = _tensors(_arrays())  # 160, 16 and 80 bytes
    assert [[t.name for t in s] for s in plan_shards(ts, 176)] == [
        ["model.embed_tokens.weight", "model.norm.weight"],
        ["lm_head.weight"],
    ]
    assert [len(s) for s in plan_shards(ts, 10)] == [1, 1, 1]  # each larger than the limit: alone
    assert [len(s) for s in plan_shards(ts, 10**9)] == [3]
    assert PDPARAMS.shard_names(1) == ["model_state.pdparams"]
    assert PDPARAMS.index_name(1) is None
    assert SAFETENSORS.shard_names(2)[1] == "model-00002-of-00002.safetensors"
    assert SAFETENSORS.index_name(1) == "model.safetensors.index.json"


@pytest.mark.parametrize("container", list(Container))
@pytest.mark.parametrize("max_shard_size", [100, 10**9])
def test_round_trip_bit_exact(tmp_path, container, max_shard_size):
    arrays = _arrays()
    config = {"model_type": "llama", "vocab_size": 10, "hidden_size": 4}
    (tmp_path / "gen.json").write_text('{"eos_token_id": 2}')
    seen: dict[str, int] = {}
    ck = _input(tmp_path / "in", arrays)
    facts = assemble(
        tmp_path / "out",
        _tensors(arrays),
        container,
        config,
        ckpt=ck,
        carry=[(tmp_path / "gen.json", "generation_config.json")],
        max_shard_size=max_shard_size,
        progress=lambda f, n: seen.__setitem__(f, seen.get(f, 0) + n),
    )
    out = tmp_path / "out"
    assert json.loads((out / "config.json").read_text()) == config
    assert (out / "generation_config.json").read_text() == '{"eos_token_id": 2}'
    assert sum(seen.values()) == facts["total_size"] == sum(a.nbytes for a in arrays.values())
    ck = Checkpoint.open(out)
    assert sorted(ck.weight_files) == sorted(facts["weight_files"])
    assert len(ck.weight_files) == (2 if max_shard_size == 100 else 1)
    for k, a in arrays.items():
        got = ck.load(k)
        assert got.tobytes() == a.tobytes() and got.shape == a.shape
    assert ck.logical_dtype(ck.tensors["lm_head.weight"]) in ("BF16", "bfloat16")
    assert not [p for p in tmp_path.iterdir() if "tietool-tmp" in p.name]


def test_a_failing_source_leaves_nothing(tmp_path, monkeypatch):
    arrays = _arrays()
    ts = _tensors(arrays)
    ck = _input(tmp_path / "in", arrays)
    real = ck.source

    def boom(name: str) -> Source:
        if name == ts[1].name:
            raise OSError(28, "No space left on device")
        return real(name)

    monkeypatch.setattr(ck, "source", boom)
    with pytest.raises(OutputError, match="no space left on the device; nothing was written"):
        assemble(tmp_path / "out", ts, Container.SAFETENSORS, {}, ckpt=ck)
    assert [p.name for p in tmp_path.iterdir()] == ["in"]


def test_unwritable_parent_names_the_parent_not_the_temp_folder(tmp_path, monkeypatch):
    """An --out whose parent is read-only (simulated: tests may run as root): the error named
    ``.out.tietool-tmp-<pid>``, a folder the user never chose; it names the parent and what to do."""
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **k):
        if "tietool-tmp" in self.name:
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    ck = _input(tmp_path / "in", _arrays())
    with pytest.raises(OutputError) as e:
        assemble(tmp_path / "ro" / "out", _tensors(_arrays()), Container.SAFETENSORS, {}, ckpt=ck)
    assert e.value.path == str(tmp_path / "ro") and "tietool-tmp" not in str(e.value)
    assert "cannot create the output in this folder: Permission denied" in str(e.value)
    assert e.value.exit_code == 6 and sorted(p.name for p in tmp_path.iterdir()) == ["in", "ro"]


def test_duplicate_names_refused(tmp_path):
    ts = _tensors(_arrays())
    with pytest.raises(UsageError):
        assemble(tmp_path / "out", ts + ts[:1], Container.SAFETENSORS, {})
    assert not (tmp_path / "out").exists()


def test_wrong_source_size_is_caught(tmp_path):
    arrays = _arrays()
    ts = _tensors(arrays)
    ck = _input(tmp_path / "in", arrays)
    ts[0] = OutTensor(ts[0].name, "F32", (10, 4), CopyOf("model.norm.weight"))  # 4 floats made, 40 planned
    with pytest.raises(ValueError, match="planned"):
        assemble(tmp_path / "out", ts, Container.PDPARAMS, {}, ckpt=ck)
    assert [p.name for p in tmp_path.iterdir()] == ["in"]
