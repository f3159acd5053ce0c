"""An index that does not match the files, and rank files that are not a checkpoint (issue 17: item 7a,
d09, d06), beyond the one case folder of each.

* An index entry for a tensor no shard holds is an incomplete checkpoint: every command refuses (exit 3)
  naming the index, the tensor and the shard; only the stale head entry of a tied checkpoint (the head
  absent, the config tied) is dropped with a warning (b18_index_stale_head_entry).
* An index naming a shard that is gone while an unlisted weight file holds its tensors (a renamed shard,
  d09) is refused naming both files and the fix.
* Expert-parallel rank files (the trainers' ``weight_name_suffix``: ``moe00`` in PaddleNLP 2.8 and
  PaddleFormers with expert_model_parallel_size 1, ``moe_sharding00`` with more) and sharding-stage-1 files
  (``shard00``) are named as such by every command, merge included (not joined yet: issue 21).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import adversarial_support as av
from support import casecheck, paths

import tietool
from tietool.surgery.model.errors import CheckpointError, ExitCode, RefusedError

CASES = paths.BUG_CASES_DIR
INDEX = "model.safetensors.index.json"


def _copy(case: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(CASES / case / "ckpt", tmp_path / "ckpt"))


def _edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


WRITES = {
    "tie": lambda c, o: tietool.tie(c, o, keep="embedding"),
    "untie": lambda c, o: tietool.untie(c, o),
    "resize": lambda c, o: tietool.resize(c, 20, o, init="zeros"),
    "convert": lambda c, o: tietool.convert(c, "safetensors", o),
}


def _refused(ckpt: Path, tmp_path: Path, exc: type, *words: str) -> None:
    """inspect and every write raise ``exc`` naming ``words``; nothing is written, the input unchanged."""
    before = av.tree_state(ckpt)
    with pytest.raises(exc) as ei:
        tietool.inspect(ckpt)
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))
    for op, call in WRITES.items():
        out = tmp_path / f"out-{op}"
        with pytest.raises(exc) as ei:
            call(ckpt, out)
        for w in words:
            assert w in str(ei.value), (op, w, str(ei.value))
        assert not out.exists() and not av.leftovers(out)
    assert av.tree_state(ckpt) == before


# ------------------------------------------------------------------ 7a: an entry no shard holds


def test_stale_head_entry_of_an_untied_checkpoint_is_an_incomplete_checkpoint(tmp_path):
    """b18's folder with the flag false: the head the index lists is a tensor the model needs."""
    ckpt = _copy("b18_index_stale_head_entry", tmp_path)
    _edit_json(ckpt / "config.json", lambda c: c.update(tie_word_embeddings=False))
    _refused(ckpt, tmp_path, CheckpointError, INDEX, "lm_head.weight", "model-00002-of-00002.safetensors")


def test_missing_layer_entry_of_a_tied_checkpoint_is_refused(tmp_path):
    """Tied, the head entry stale (allowed), and a layer weight the index lists but no shard holds."""
    ckpt = _copy("b18_index_stale_head_entry", tmp_path)
    extra = "model.layers.0.mlp.down_proj.weight"
    _edit_json(ckpt / INDEX, lambda i: i["weight_map"].update({extra: "model-00001-of-00002.safetensors"}))
    _refused(ckpt, tmp_path, CheckpointError, INDEX, extra, "model-00001-of-00002.safetensors", "incomplete")


def test_tied_stale_head_entry_dropped_by_every_write(tmp_path):
    """The one allowed case: each output's index matches its shards, the warning names the entry."""
    ckpt = _copy("b18_index_stale_head_entry", tmp_path)
    assert any("lm_head.weight" in w for w in tietool.inspect(ckpt)["warnings"])
    for op in ("untie", "resize", "convert"):
        out = tmp_path / f"out-{op}"
        rep = WRITES[op](ckpt, out)
        assert any("lm_head.weight" in w for w in rep["warnings"]), (op, rep["warnings"])
        ctx = casecheck.CheckContext(out=out, input_dir=ckpt, original_dir=ckpt)
        assert casecheck.run_check({"index_matches_shards": True}, ctx) is None, op


def test_incomplete_index_cli_one_line_exit_3(tmp_path):
    ckpt = _copy("b18_index_stale_head_entry", tmp_path)
    _edit_json(ckpt / "config.json", lambda c: c.update(tie_word_embeddings=False))
    run = av.run_cli(["resize", ckpt, "--vocab", "20", "--out", tmp_path / "out"])
    av.assert_refused(
        run, 3, [INDEX, "lm_head.weight", "model-00002-of-00002.safetensors"], out=tmp_path / "out"
    )


# ------------------------------------------------------------------ d09: a renamed shard


def test_renamed_second_shard_names_both_files(tmp_path):
    """Shard 2 of 2 renamed (not to model.safetensors): refused naming the missing name and the file."""
    ckpt = _copy("b18_shard_tensor_not_in_index", tmp_path)
    (ckpt / "model-00002-of-00002.safetensors").rename(ckpt / "model-00002-of-00002.renamed.safetensors")
    (ckpt / "model-00001-of-00002.safetensors").rename(ckpt / "model-00001-of-00003.safetensors")
    _edit_json(
        ckpt / INDEX,
        lambda i: i["weight_map"].update(
            {k: "model-00001-of-00003.safetensors" for k, v in i["weight_map"].items() if "00001" in v}
        ),
    )
    (ckpt / "model-00002-of-00002.renamed.safetensors").rename(ckpt / "model-00003-of-00003.safetensors")
    _refused(
        ckpt,
        tmp_path,
        CheckpointError,
        "model-00002-of-00002.safetensors",
        "model-00003-of-00003.safetensors",
    )


def test_renamed_pdparams_shard_names_both_files(tmp_path):
    """d09 in the other container: model_state.pdparams holds what the index maps to a missing shard."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(CASES / "d09_paddleocr_vl_renamed_shard_stale_index" / "ckpt" / "config.json", ckpt)
    st = casecheck.read_safetensors(
        CASES / "d09_paddleocr_vl_renamed_shard_stale_index" / "ckpt" / "model.safetensors"
    )
    state = {n: np.frombuffer(t.raw, t.storage).reshape(t.shape).copy() for n, t in st.items()}
    (ckpt / "model_state.pdparams").write_bytes(pickle.dumps(state, protocol=4))
    shard = "model_state-00001-of-00001.pdparams"
    (ckpt / "model_state.pdparams.index.json").write_text(
        json.dumps({"metadata": {"total_size": 1}, "weight_map": dict.fromkeys(state, shard)})
    )
    _refused(ckpt, tmp_path, CheckpointError, shard, "model_state.pdparams,", "delete the stale index")


# ------------------------------------------------------------------ d06: expert-parallel and sharding ranks


def _rank_folder(tmp_path: Path, names: list[str]) -> Path:
    """d06's rank files under other names the trainers write."""
    src = CASES / "d06_expert_parallel_rank_files" / "ckpt"
    ckpt = tmp_path / "ranks"
    ckpt.mkdir()
    shutil.copy(src / "config.json", ckpt)
    for i, n in enumerate(names):
        shutil.copy(src / f"model_state.moe_sharding0{i % 2}.pdparams", ckpt / n)
    return ckpt


_ONLY = "tensor-, pipeline- and expert-parallel rank files only"
_EP_ONLY = "tietool merge joins files of one moe_sharding / moe tag only"


@pytest.mark.parametrize(
    "names, words, merge_refusal",
    [
        (
            ["model_state.moe00.pdparams", "model_state.moe01.pdparams"],
            "expert-parallel",
            None,
        ),  # PaddleNLP 2.8
        (["model_state.tp00_moe00.pdparams", "model_state.tp00_moe01.pdparams"], "expert-parallel", _EP_ONLY),
        (
            [
                "model_state.tp00_pp00_moe_sharding00.pdparams",
                "model_state.tp00_pp00_moe_sharding01.pdparams",
            ],
            "expert-parallel",
            _EP_ONLY,
        ),  # fmt: skip
        (["model_state.shard00.pdparams", "model_state.shard01.pdparams"], "sharding", _ONLY),
        (["model_state.tp00_shard00.pdparams", "model_state.tp00_shard01.pdparams"], "sharding", _ONLY),
    ],
)
def test_expert_parallel_and_sharding_rank_files_named_by_every_command(
    tmp_path, names, words, merge_refusal
):
    """Every command but merge refuses them by cause; merge joins expert-parallel files of one tag (issue 21:
    tests/oracles/test_merge_experts.py) and refuses the rest, naming why."""
    ckpt = _rank_folder(tmp_path, names)
    _refused(ckpt, tmp_path, RefusedError, words, names[0])
    if merge_refusal is None:
        rep = tietool.merge(ckpt, tmp_path / "merged")
        assert rep["expert_parallel"] == 2 and rep["expert_numbering"] == ["global"]
        return
    with pytest.raises(RefusedError) as ei:
        tietool.merge(ckpt, tmp_path / "merged")
    assert words in str(ei.value) and merge_refusal in str(ei.value)
    assert ei.value.exit_code == ExitCode.REFUSED and not (tmp_path / "merged").exists()


def test_expert_parallel_rank_file_beside_whole_weights_left_out(tmp_path):
    """A rank file beside a whole checkpoint is not part of it: named, left out of the output."""
    ckpt = _copy("b17_bf16_as_uint16_pdparams", tmp_path)
    shutil.copy(
        CASES / "d06_expert_parallel_rank_files" / "ckpt" / "model_state.moe_sharding00.pdparams", ckpt
    )
    info = tietool.inspect(ckpt)
    assert {"file": "model_state.moe_sharding00.pdparams", "reason": "rank-file"}.items() <= next(
        x for x in info["left_out"] if x["file"] == "model_state.moe_sharding00.pdparams"
    ).items()
    tietool.untie(ckpt, tmp_path / "out")
    assert not (tmp_path / "out" / "model_state.moe_sharding00.pdparams").exists()


def test_expert_parallel_cli_refusal_one_line(tmp_path):
    ckpt = _rank_folder(tmp_path, ["model_state.tp00_moe00.pdparams", "model_state.tp00_moe01.pdparams"])
    run = av.run_cli(["merge", ckpt, "--out", tmp_path / "out"])
    av.assert_refused(run, 5, ["expert-parallel", "model_state.tp00_moe00.pdparams"], out=tmp_path / "out")
