"""Flex checkpoints (issue 21): recognised, inspected, refused by every other command, merged.

The inputs are real checkpoints written by paddle 3.3.1 ``save_state_dict`` (``tests/data/flex``, see its
README); the oracle is ``paddle.distributed.load_state_dict`` of each into full-size tensors in one process
(``oracle.npz``, bf16 as uint16 bits). Damaged inputs (gaps, overlaps, replicas) are copies whose
``.metadata`` is rewritten by :func:`support.flex_support.write_metadata` (not by paddle); hostile ones are
hand-made pickles.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from support import adversarial_support as av
from support import flex_support as fx
from support import preload

from tietool.surgery.io import flex
from tietool.surgery.io.flex_cover import Piece, flat_boxes, gap, overlaps, uncovered

PY = sys.executable
needs_data = pytest.mark.skipif(not (fx.DATA / "ranks2").is_dir(), reason="tests/data/flex not present")


def _merged(out: Path) -> dict[str, tuple[str, list[int], bytes]]:
    got: dict[str, tuple[str, list[int], bytes]] = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update(av.st_tensors(f))
    return got


# ------------------------------------------------------------------------------------------ pure parts
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (4, 1, 3)])
def test_flat_boxes_cover_each_range_once_in_order(shape: tuple[int, ...]) -> None:
    n = int(np.prod(shape))
    ref = np.arange(n).reshape(shape)
    for a in range(n + 1):
        for b in range(a, n + 1):
            boxes = flat_boxes(shape, a, b)
            flat = []
            for (lo, hi), pos in boxes:
                block = ref[tuple(slice(x, y) for x, y in zip(lo, hi, strict=True))].reshape(-1)
                assert block[0] == pos if block.size else True
                flat += block.tolist()
            assert flat == list(range(a, b)), (shape, a, b, boxes)


def test_gap_on_the_grid_of_boundaries() -> None:
    assert gap((6, 4), [((0, 0), (3, 4)), ((3, 0), (6, 4))]) is None
    assert gap((6, 4), [((0, 0), (3, 4)), ((4, 0), (6, 4))]) == (3, 0)
    assert gap((3, 8), [((0, 0), (3, 4)), ((0, 4), (3, 7))]) == (0, 7)
    assert gap((), [((), ())]) is None


def test_uncovered_counts_the_gap_exactly_with_overlaps() -> None:
    """Elements no box covers, counted on the grid (overlapping boxes counted once), against a numpy mask."""
    boxes = [((0, 0), (3, 5)), ((2, 3), (6, 7)), ((5, 0), (7, 2)), ((1, 1), (2, 2))]
    mask = np.zeros((7, 9), dtype=bool)
    for (a, b), (c, d) in boxes:
        mask[a:c, b:d] = True
    assert uncovered((7, 9), boxes) == (int((~mask).sum()), (0, 5))
    assert uncovered((2**40, 4), [((0, 0), (3, 4))]) == (2**42 - 12, (3, 0))  # exact, nothing allocated
    assert uncovered((4, 4), [((0, 0), (4, 4)), ((1, 1), (2, 2))]) == (0, None)


def test_overlaps_found_by_the_sweep_on_rows_and_columns() -> None:
    s = flex.FlexSlice("0_0.distcp", "w", (0, 0), (1, 1))

    def pieces(boxes):
        return [Piece(s, b, 0) for b in boxes]

    cols = [((0, 4 * k), (64, 4 * k + 4)) for k in range(16)]  # 16 column shards: disjoint
    assert list(overlaps(pieces(cols))) == []
    cols.append(((10, 6), (20, 9)))  # across shards 1 and 2
    got = {(p.box, q.box, sub) for p, q, sub in overlaps(pieces(cols))}
    assert {sub for _, _, sub in got} == {((10, 6), (20, 8)), ((10, 8), (20, 9))}
    rows = [((8 * k, 0), (8 * k + 8, 3)) for k in range(8)] + [((7, 0), (9, 3))]
    assert {sub for _, _, sub in overlaps(pieces(rows))} == {((7, 0), (8, 3)), ((8, 0), (9, 3))}


# ------------------------------------------------------------------------------------------ recognition
@needs_data
def test_recognises_the_three_places(tmp_path: Path) -> None:
    bare = fx.copy_folder("ranks2", tmp_path / "bare")
    assert flex.find(bare) == flex.FlexFolder(bare, bare, ())
    ck = tmp_path / "out" / "checkpoint-4"
    fx.copy_folder("ranks2", ck / "model_state")
    (ck / "optimizer_state").mkdir()
    (ck / "master_weight").mkdir()
    assert flex.find(ck) == flex.FlexFolder(ck, ck / "model_state", ("optimizer_state", "master_weight"))
    assert flex.find(tmp_path / "out") is None
    assert flex.find(av.CASES / av.ST_ONE) is None


@needs_data
@pytest.mark.parametrize("name", fx.FOLDERS)
def test_metadata_read_as_the_oracle_says(name: str) -> None:
    oracle = json.loads((fx.DATA / name / "oracle.json").read_text())["tensors"]
    got = fx.read(fx.DATA / name)
    assert {k: {"dtype": t.dtype, "shape": list(t.shape)} for k, t in got.items()} == oracle


# ---------------------------------------------------------------------------------------- inspect, refusals
@needs_data
def test_inspect_lists_a_trainer_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "checkpoint-2"
    fx.copy_folder("ranks2", ck / "model_state")
    (ck / "optimizer_state").mkdir()
    (ck / "config.json").write_text('{"model_type": "llama"}')
    run = av.run_cli(["inspect", ck, "--json"])
    assert run.rc == 0, run.describe()
    info = json.loads(run.stdout)
    oracle = json.loads((fx.DATA / "ranks2" / "oracle.json").read_text())["tensors"]
    assert info["kind"] == "flex" and info["ranks"] == [0, 1] and info["model_type"] == "llama"
    assert [f["file"] for f in info["files"]] == ["model_state/0_0.distcp", "model_state/1_0.distcp"]
    assert info["metadata"] == "model_state/0.metadata" and info["state_folders"] == ["optimizer_state"]
    assert {t["name"]: {"dtype": t["dtype"], "shape": t["shape"]} for t in info["tensors"]} == oracle
    assert {t["name"]: t["slices"] for t in info["tensors"]}["rep.fp32"] == 1
    text = av.run_cli(["inspect", ck])
    assert text.rc == 0 and "flex checkpoint" in text.stdout and "tietool merge" in text.stdout


@needs_data
@pytest.mark.parametrize("name", fx.FOLDERS)
def test_inspect_says_every_fixture_is_covered(name: str) -> None:
    """Every real save (rows, columns, replicated, 2x2 mesh, flattened, save_replicas) covers each tensor
    exactly: inspect says so from the .metadata alone; the stored copies of save_replicas=True counted."""
    run = av.run_cli(["inspect", fx.DATA / name, "--json"])
    assert run.rc == 0, run.describe()
    info = json.loads(run.stdout)
    assert info["problems"] == [] and info["warnings"] == [] and info["exit_code"] == 0
    cov = {t["name"]: t["coverage"] for t in info["tensors"]}
    assert {c["state"] for c in cov.values()} == {"covered"} and {c["missing"] for c in cov.values()} == {0}
    assert {c["overlaps"] for c in cov.values()} == {0}
    copies = {k: c["copies"] for k, c in cov.items() if c["copies"] > 1}
    assert copies == ({"rep.fp32": 2, "rep.bf16": 2} if name == "ranks2_replicas" else {}), copies
    text = av.run_cli(["inspect", fx.DATA / name])
    assert text.rc == 0 and "covered" in text.stdout and "gap of" not in text.stdout, text.describe()


@needs_data
def test_inspect_reports_gap_overlap_and_copies_from_the_metadata(tmp_path: Path) -> None:
    """A gap (exit 3, the line merge refuses with), partial overlaps (a warning, exit 0: merge compares the
    values) and copies, each counted from the records; no .distcp is read (they are emptied)."""

    def holes(ts):  # cols.fp32 [3, 8]: rank 1's columns 4:8 gone
        t = ts["cols.fp32"]
        return {**ts, "cols.fp32": replace(t, slices=t.slices[:1])}

    src = _edited(tmp_path / "gap", holes)
    for f in src.glob("*.distcp"):
        f.write_bytes(b"")
    run = av.run_cli(["inspect", src, "--json"])
    info = json.loads(run.stdout)
    cov = {t["name"]: t["coverage"] for t in info["tensors"]}["cols.fp32"]
    assert run.rc == 3 and len(av.error_lines(run.stderr)) == 1 and "cols.fp32" in run.stderr, run.describe()
    assert (cov["state"], cov["missing"], cov["first_missing"]) == ("gap", 12, [0, 4])
    merge = av.run_cli(["merge", _edited(tmp_path / "m", holes), "--out", tmp_path / "m" / "out"])
    av.assert_refused(merge, 3, ["cols.fp32", "element [0, 4]", "12 of its 24", info["problems"][0]])

    def grow(ts):  # uneven.fp32 [5, 2]: rank 1's rows 3:5 also claim row 2 (a partial overlap, no gap)
        t = ts["uneven.fp32"]
        s1 = replace(t.slices[1], offset=(2, 0), shape=(3, 2))
        return {**ts, "uneven.fp32": replace(t, slices=(t.slices[0], s1, replace(t.slices[0], replica=1)))}

    ov = _edited(tmp_path / "ov", grow)
    # only the .metadata is edited (its slice of rank 1 no longer matches 1_0.distcp: merge refuses that, and
    # so does inspect where a config.json lets it read the vocabulary from the files): without one, the
    # inspection is the .metadata's alone
    (ov / "config.json").unlink()
    run = av.run_cli(["inspect", ov, "--json"])
    assert run.rc == 0, run.describe()
    info = json.loads(run.stdout)
    cov = {t["name"]: t["coverage"] for t in info["tensors"]}["uneven.fp32"]
    assert (cov["state"], cov["overlaps"], cov["shared_elements"], cov["copies"]) == ("covered", 1, 2, 2)
    assert cov["overlapping"][0]["shared"] == [[2, 0], [3, 2]], cov
    assert len(info["warnings"]) == 1 and "uneven.fp32" in info["warnings"][0]


@needs_data
@pytest.mark.parametrize("command", ["tie", "untie", "resize", "add-tokens", "convert", "verify"])
def test_other_commands_say_merge_first(command: str, tmp_path: Path) -> None:
    ck = tmp_path / "checkpoint-2"
    fx.copy_folder("ranks2", ck / "model_state", {"model_type": "llama"})
    (ck / "config.json").write_text('{"model_type": "llama"}')
    out = tmp_path / "out"
    argv = {
        "add-tokens": ["add-tokens", ck, "<x>", "--out", out],
        "convert": ["convert", ck, "--to", "safetensors", "--out", out],
        "verify": ["verify", ck, av.CASES / av.ST_ONE],
    }.get(command) or av.command_argv(command, ck, out)
    before = av.tree_state(ck)
    run = av.run_cli(argv)
    av.assert_refused(run, 5, ["flex checkpoint", "tietool merge"], out=out)
    assert av.tree_state(ck) == before


# ------------------------------------------------------------------------------------------ merge
@needs_data
@pytest.mark.parametrize("name", fx.FOLDERS)
def test_merge_equals_load_state_dict_bit_for_bit(name: str, tmp_path: Path) -> None:
    src = fx.copy_folder(name, tmp_path / name)
    out = tmp_path / "merged"
    run = av.run_cli(["merge", src, "--out", out, "--json"])  # no model type: refused, named
    av.assert_refused(run, 5, ["without a model_type", "--keep-paddle-layout"], out=out)
    run = av.run_cli(["merge", src, "--out", out, "--json", "--keep-paddle-layout"])
    assert run.rc == 0, run.describe()
    rep = json.loads(run.stdout)
    assert rep["kind"] == "flex" and rep["warnings"] and not rep["to_paddleformers_layout"]
    oracle = np.load(fx.DATA / name / "oracle.npz")
    dtypes = json.loads((fx.DATA / name / "oracle.json").read_text())["tensors"]
    got = _merged(out)
    assert set(got) == set(oracle.files)
    for k in oracle.files:
        dt, shape, raw = got[k]
        assert dt == {"float32": "F32", "bfloat16": "BF16"}[dtypes[k]["dtype"]], k
        assert shape == list(oracle[k].shape) and raw == oracle[k].tobytes(), k
    assert not av.leftovers(out)


@needs_data
def test_merge_dry_run_writes_nothing(tmp_path: Path) -> None:
    src = fx.copy_folder("flat2", tmp_path / "flat2")
    out = tmp_path / "merged"
    run = av.run_cli(["merge", src, "--out", out, "--dry-run", "--json", "--keep-paddle-layout"])
    assert run.rc == 0, run.describe()
    rep = json.loads(run.stdout)
    assert rep["dry_run"] and [t["name"] for t in rep["tensors"]] == list(fx.read(src))
    assert not out.exists()


def _edited(tmp_path: Path, edit) -> Path:
    src = fx.copy_folder("ranks2", tmp_path / "ranks2")
    tensors = fx.read(src)
    tensors = edit(tensors)
    fx.write_metadata(src / "0.metadata", tensors)
    return src


@needs_data
def test_our_metadata_writer_matches_paddle(tmp_path: Path) -> None:
    """The rewritten .metadata (unchanged tensors) reads back the same and merges to the same bytes."""
    src = _edited(tmp_path, lambda ts: ts)
    assert fx.read(src) == fx.read(fx.DATA / "ranks2")
    run = av.run_cli(["merge", src, "--out", tmp_path / "m", "--keep-paddle-layout"])
    assert run.rc == 0, run.describe()


@needs_data
def test_gap_refused_naming_the_tensor(tmp_path: Path) -> None:
    def drop(ts):
        t = ts["rows.fp32"]
        return {**ts, "rows.fp32": replace(t, slices=t.slices[:1])}

    src = _edited(tmp_path, drop)
    before = av.tree_state(src)
    out = tmp_path / "m"
    run = av.run_cli(["merge", src, "--out", out])
    av.assert_refused(run, 3, ["rows.fp32", "element [3, 0]"], out=out)
    assert av.tree_state(src) == before


@needs_data
def test_overlap_that_disagrees_refused_naming_both_files(tmp_path: Path) -> None:
    def shift(ts):  # rank 1's rows 3:6 claimed to be rows 2:5: row 2 twice (different values), row 5 never
        t = ts["rows.fp32"]
        s1 = replace(t.slices[1], offset=(2, 0))
        return {**ts, "rows.fp32": replace(t, slices=(t.slices[0], s1))}

    out = tmp_path / "m"
    run = av.run_cli(["merge", _edited(tmp_path, shift), "--out", out])
    av.assert_refused(run, 5, ["rows.fp32", "0_0.distcp", "1_0.distcp"], out=out)


@needs_data
def test_replica_equal_accepted_different_refused(tmp_path: Path) -> None:
    def same(ts):  # a second copy of rep.fp32's slice, in the same file: equal
        t = ts["rep.fp32"]
        return {**ts, "rep.fp32": replace(t, slices=(*t.slices, replace(t.slices[0], replica=1)))}

    run = av.run_cli(
        ["merge", _edited(tmp_path / "a", same), "--out", tmp_path / "a" / "m", "--keep-paddle-layout"]
    )
    assert run.rc == 0, run.describe()

    def other(ts):  # rows.fp32's rank-0 slice also "held" by 1_0.distcp (whose rows are 3:6): differs
        t = ts["rows.fp32"]
        twin = replace(t.slices[0], file="1_0.distcp", replica=1)
        return {**ts, "rows.fp32": replace(t, slices=(*t.slices, twin))}

    out = tmp_path / "b" / "m"
    run = av.run_cli(["merge", _edited(tmp_path / "b", other), "--out", out])
    av.assert_refused(run, 5, ["rows.fp32", "1_0.distcp"], out=out)


@needs_data
def test_truncated_distcp_one_line_naming_it(tmp_path: Path) -> None:
    src = fx.copy_folder("ranks2", tmp_path / "ranks2")
    data = (src / "1_0.distcp").read_bytes()
    (src / "1_0.distcp").write_bytes(data[: len(data) // 2])
    out = tmp_path / "m"
    run = av.run_cli(["merge", src, "--out", out])
    av.assert_refused(run, 3, ["1_0.distcp"], out=out)


@needs_data
def test_missing_distcp_named(tmp_path: Path) -> None:
    src = fx.copy_folder("ranks2", tmp_path / "ranks2")
    (src / "1_0.distcp").unlink()
    out = tmp_path / "m"
    run = av.run_cli(["merge", src, "--out", out])
    av.assert_refused(run, 3, ["1_0.distcp"], out=out)


# ------------------------------------------------------------------------------------------ hostile metadata
def _hostile(tmp_path: Path, payload: bytes) -> Path:
    src = fx.copy_folder("single", tmp_path / "single")
    (src / "0.metadata").write_bytes(payload)
    return src


MARK = "FLEX_PWNED"


def _payloads(marker: Path) -> dict[str, tuple[bytes, int]]:
    cmd = f"touch {marker}".encode()
    meta = flex.MODULE.encode()
    return {
        "os.system": (b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R.", 4),
        "builtins.eval": (
            b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c" + bytes([len(cmd)]) + cmd + b"\x85R.",
            4,
        ),
        "another class of the module": (b"\x80\x04\x8c" + bytes([len(meta)]) + meta + b"\x8c\x02os\x93).", 4),
        "a record called with arguments": (
            b"\x80\x04\x8c" + bytes([len(meta)]) + meta + b"\x8c\x08Metadata\x93\x8c\x01x\x85R.",
            4,
        ),
        "a huge length": (b"\x80\x04\x8d" + (2**62).to_bytes(8, "little") + b"x.", 3),
        "not a record": (b"\x80\x04}.", 3),
    }


@pytest.mark.parametrize("what", list(_payloads(Path("x"))))
def test_hostile_metadata_refused_nothing_run(what: str, tmp_path: Path) -> None:
    if not (fx.DATA / "single").is_dir():
        pytest.skip("tests/data/flex not present")
    marker = tmp_path / MARK
    payload, code = _payloads(marker)[what]
    src = _hostile(tmp_path, payload)
    for argv in (["inspect", src], ["merge", src, "--out", tmp_path / "m"]):
        run = av.run_cli(argv)
        av.assert_refused(run, code, ["0.metadata"], out=tmp_path / "m")
        assert not marker.exists()


def test_hostile_payload_is_live(tmp_path: Path) -> None:
    """The os.system payload really runs under pickle.loads (in a throw-away subprocess)."""
    marker = tmp_path / MARK
    payload, _ = _payloads(marker)["os.system"]
    (tmp_path / "p").write_bytes(payload)
    code = f"import pickle; pickle.loads(open({str(tmp_path / 'p')!r}, 'rb').read())"
    subprocess.run([PY, "-c", code], check=False, timeout=60)
    assert marker.exists()


# ------------------------------------------------------------------------------------------ PaddleFormers
_MAKE = textwrap.dedent(
    """
    import os, sys, numpy as np, paddle, paddle.distributed as dist
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM
    root = sys.argv[1]
    ids = paddle.to_tensor([[1, 5, 7, 9, 3, 11, 2, 17], [4, 4, 8, 30, 31, 12, 6, 39]])
    for dtype in ("float32", "bfloat16"):
        paddle.seed(3)
        cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
                          fuse_rms_norm=False)
        m = LlamaForCausalLM(cfg)
        if dtype == "bfloat16":
            m = m.to(dtype="bfloat16")
        ck = os.path.join(root, dtype, "checkpoint-2")
        sd = m.sharded_state_dict()
        for v in sd.values():  # as the Trainer's _save_flex_model_state does
            v.local_tensor = paddle.Tensor(v.local_tensor)
        dist.save_state_dict(sd, os.path.join(ck, "model_state"))
        m.config.save_pretrained(ck)
        ref = LlamaForCausalLM(cfg)  # a fresh fp32 model with the saved weights (buffers such as the
        ref.set_state_dict({k: v.astype("float32") for k, v in m.state_dict().items()})  # rope's in fp32)
        ref.eval()
        out = ref(ids)
        logits = out.logits if hasattr(out, "logits") else out[0]
        np.save(os.path.join(root, dtype, "logits.npy"), logits.numpy())
    """
)
_LOAD = textwrap.dedent(
    """
    import sys, numpy as np, paddle
    from paddleformers.transformers import LlamaForCausalLM
    ids = paddle.to_tensor([[1, 5, 7, 9, 3, 11, 2, 17], [4, 4, 8, 30, 31, 12, 6, 39]])
    for folder, ref in zip(sys.argv[1::2], sys.argv[2::2]):
        m = LlamaForCausalLM.from_pretrained(folder, dtype="float32")
        m.eval()
        out = m(ids)
        got = (out.logits if hasattr(out, "logits") else out[0]).numpy()
        want = np.load(ref)
        print(folder, np.array_equal(got, want), float(np.abs(got - want).max()))
    """
)


@pytest.mark.slow
def test_merged_trainer_checkpoint_loads_with_the_same_logits(tmp_path: Path) -> None:
    """A PaddleFormers Llama's ``sharded_state_dict`` saved as the Trainer saves it (``checkpoint-N/
    model_state/``, fp32 and bf16), merged by tietool, loads with ``from_pretrained`` and gives the saved
    model's logits bit for bit (Linear weights converted to the PaddleFormers layout)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    preload.run(
        [PY, "-c", _MAKE, str(tmp_path)],
        libs=preload.PADDLEFORMERS,
        check=True,
        timeout=600,
        env=env,
        capture_output=True,
    )
    args = []
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / f"merged-{dtype}"
        run = av.run_cli(["merge", tmp_path / dtype / "checkpoint-2", "--out", out, "--json"])
        assert run.rc == 0, run.describe()
        rep = json.loads(run.stdout)
        assert rep["to_paddleformers_layout"] and rep["converted"]["transposed"]
        assert not av.leftovers(out)
        labels = {v[0] for v in _merged(out).values()}
        assert labels == ({"F32"} if dtype == "float32" else {"BF16"})
        args += [str(out), str(tmp_path / dtype / "logits.npy")]
    res = preload.run(
        [PY, "-c", _LOAD, *args],
        libs=preload.PADDLEFORMERS,
        timeout=600,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(str(tmp_path))]
    assert len(lines) == 2 and all(" True " in ln for ln in lines), res.stdout


@needs_data
def test_inspect_of_several_folders_names_the_flex_one(tmp_path: Path) -> None:
    src = fx.copy_folder("ranks2", tmp_path / "ranks2")
    run = av.run_cli(["inspect", src, av.CASES / av.ST_ONE])
    assert run.rc == 0, run.describe()
    assert "flex checkpoint" in run.stdout and "8 tensors" in run.stdout
    both = json.loads(av.run_cli(["inspect", src, av.CASES / av.ST_ONE, "--json"]).stdout)
    assert [r.get("kind") for r in both] == ["flex", None]


def test_trainer_layout_merged_and_converted_to_the_paddleformers_layout(tmp_path: Path) -> None:
    """A Trainer-like ``output/checkpoint-7/`` (config.json and tokenizer files in ``output/``, the Trainer's
    resume files beside ``model_state/``): merged, every Linear weight transposed to ``[out, in]`` and every
    other tensor kept, bits unchanged; tokenizer files carried from above, the resume files left out."""
    state = fx.llama_state()
    run_dir = tmp_path / "output"
    ck = run_dir / "checkpoint-7"
    fx.write_flex(ck / "model_state", state)
    for d in ("optimizer_state", "master_weight"):
        (ck / d).mkdir()
    for f in ("training_args.bin", "saved_signal_0", "rng_state_0.pth", "scheduler.pdparams"):
        (ck / f).write_bytes(b"x")
    (run_dir / "config.json").write_text(json.dumps(fx.LLAMA))
    (run_dir / "tokenizer_config.json").write_text("{}")
    out = tmp_path / "merged"
    run = av.run_cli(["merge", ck, "--out", out, "--json"])
    assert run.rc == 0, run.describe()
    rep = json.loads(run.stdout)
    assert rep["to_paddleformers_layout"] and rep["config_from"] == str(run_dir / "config.json")
    assert set(rep["left_out"]) >= {"optimizer_state", "master_weight", "training_args.bin", "saved_signal_0"}
    got = _merged(out)
    assert set(got) == set(state)
    linear = {n for n in state if n.endswith("proj.weight")}
    assert {t["name"] for t in rep["converted"]["transposed"]} == linear
    assert {t["name"] for t in rep["tensors"] if t["transposed"]} == linear
    assert {t["name"]: t["shape"] for t in rep["tensors"]} == {n: got[n][1] for n in got}
    for name, a in state.items():
        want = a.T if name in linear else a
        assert got[name][1] == list(want.shape) and got[name][2] == np.ascontiguousarray(want).tobytes(), name
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "config.json",
            "tokenizer_config.json",
            "tietool-report.json",
            *[f for f in rep["weight_files"]],
            rep["index"],
        ]
    )
    assert not av.leftovers(out)


# ------------------------------------------------------------------------------------------ the real Trainer
TRAINERS = ("trainer_1rank", "trainer_2rank")
needs_trainer = pytest.mark.skipif(
    not (fx.DATA / "trainer_1rank" / "base").is_dir(), reason="tests/data/flex/trainer_* not present"
)


def _trainer_copy(name: str, tmp_path: Path, config: bool = True) -> Path:
    import shutil

    step = next((fx.DATA / name).glob("checkpoint-*")).name
    ck = tmp_path / name / step
    shutil.copytree(fx.DATA / name / step, ck)
    if config:  # the Trainer's flex saves write no config.json: the model the run started from has it
        shutil.copy2(fx.DATA / "trainer_1rank" / "base" / "config.json", ck / "config.json")
    return ck


@needs_trainer
@pytest.mark.parametrize("name", TRAINERS)
def test_real_trainer_checkpoint_needs_a_config(name: str, tmp_path: Path) -> None:
    ck = _trainer_copy(name, tmp_path, config=False)
    info = json.loads(av.run_cli(["inspect", ck, "--json"]).stdout)
    assert info["kind"] == "flex" and info["config"] is None
    assert info["state_folders"] == ["optimizer_state", "master_weight"]
    out = tmp_path / "m"
    av.assert_refused(
        av.run_cli(["merge", ck, "--out", out]), 3, ["config.json", "model_name_or_path"], out=out
    )


@needs_trainer
@pytest.mark.parametrize("name", [*TRAINERS, "trainer_bf16_layout"])
def test_real_trainer_checkpoint_merges_to_the_oracle(name: str, tmp_path: Path) -> None:
    """The real Trainer's checkpoint-2/ (1 rank; 2 ranks with sharding stage 1) merges to
    ``load_state_dict``'s tensors bit for bit, Linear weights transposed to the PaddleFormers layout (as
    ``save_pretrained`` writes them: the names and shapes of ``base/``), tokenizer files carried, the
    Trainer's resume files and the optimizer / master-weight folders left out."""
    ck = _trainer_copy(name, tmp_path)
    out = tmp_path / "m"
    run = av.run_cli(["merge", ck, "--out", out, "--json"])
    assert run.rc == 0, run.describe()
    rep = json.loads(run.stdout)
    turned = {t["name"] for t in rep["converted"]["transposed"]}
    oracle = np.load(fx.DATA / name / "oracle.npz")
    got = _merged(out)
    base = _merged(fx.DATA / "trainer_1rank" / "base")
    label = "BF16" if name == "trainer_bf16_layout" else "F32"  # the saved dtype, whatever config.json says
    assert {k: v[1] for k, v in got.items()} == {k: v[1] for k, v in base.items()}
    assert {v[0] for v in got.values()} == {label}
    assert set(got) == set(oracle.files) and turned
    for k in oracle.files:
        want = np.ascontiguousarray(oracle[k].T) if k in turned else oracle[k]
        assert got[k][1] == list(want.shape) and got[k][2] == want.tobytes(), k
    assert {"optimizer_state", "master_weight", "saved_signal_0"} <= set(rep["left_out"])
    if name != "trainer_bf16_layout":  # not a training run: no tokenizer or trainer files beside it
        assert {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"} <= set(rep["carried"])
        assert {"training_args.bin", "trainer_state.bin"} <= set(rep["left_out"])


_TRAINER_LOGITS = textwrap.dedent(
    """
    import sys, numpy as np, paddle
    from paddleformers.transformers import LlamaForCausalLM
    base, ids = sys.argv[1], paddle.to_tensor(np.load(sys.argv[2]))
    def logits(m):
        m.eval()
        out = m(ids)
        return (out.logits if hasattr(out, "logits") else out[0]).numpy()
    for merged, oracle in zip(sys.argv[3::2], sys.argv[4::2]):
        ref = LlamaForCausalLM.from_pretrained(base, dtype="float32")
        ref.set_state_dict({k: paddle.to_tensor(v) for k, v in np.load(oracle).items()})
        got = logits(LlamaForCausalLM.from_pretrained(merged, dtype="float32"))
        want = logits(ref)
        print("RESULT", merged, np.array_equal(got, want), float(np.abs(got - want).max()))
    """
)


@pytest.mark.slow
@needs_trainer
@pytest.mark.parametrize("sub", ["optimizer_state", "master_weight"])
@pytest.mark.parametrize("model_type", ["llama", "mystery"])
def test_optimizer_folders_are_not_merged_as_a_model(sub: str, model_type: str, tmp_path: Path) -> None:
    """``merge checkpoint-N/optimizer_state`` (or ``master_weight``) wrote the moments as a model, with the
    checkpoint's config.json and tokenizer files, for a model type of no conversion ("mystery"; and refused
    with convert's ``--to safetensors`` hint, an option merge has not, for llama): refused, naming the
    checkpoint folder to merge."""
    ck = tmp_path / "checkpoint-2"
    shutil.copytree(fx.DATA / "trainer_bf16_layout" / "checkpoint-1", ck)
    config = json.loads((fx.DATA / "trainer_1rank" / "base" / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    before = av.tree_state(ck)
    out = tmp_path / "m"
    run = av.run_cli(["merge", ck / sub, "--out", out])
    av.assert_refused(run, 5, [sub, "merge the checkpoint folder", "checkpoint-2 instead"], out=out)
    assert "--to" not in run.stderr, run.describe()
    assert av.tree_state(ck) == before


@needs_trainer
@pytest.mark.parametrize("command", [["resize", "--vocab", "256", "--seed", "1"], ["tie", "--keep", "head"]])
def test_hf_weights_beside_flex_saves_leave_them_out(command: list[str], tmp_path: Path) -> None:
    """A ``checkpoint-N/`` that also holds whole-model weights (``save_hf_steps``) is taken as those weights;
    a command that changes the model left its flex saves (``model_state/`` at the old vocabulary,
    ``optimizer_state/``, ``master_weight/``: per parameter) in the output unchanged, though README says
    training state is left out when the model changes: a resume from the output would read them."""
    ck = tmp_path / "checkpoint-2"
    shutil.copytree(fx.DATA / "trainer_1rank" / "checkpoint-2", ck)
    base = fx.DATA / "trainer_1rank" / "base"
    for n in ("config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"):
        shutil.copy2(base / n, ck / n)
    out = tmp_path / "out"
    run = av.run_cli([command[0], ck, *command[1:], "--out", out])
    assert run.rc == 0, run.describe()
    stale = [d for d in flex.STATE_DIRS if (out / d).exists()]
    assert not stale, f"{stale} carried into the changed checkpoint"
    report = json.loads((out / "tietool-report.json").read_text())
    left = {x["file"].split("/")[0] for x in report["left_out"]}
    assert set(flex.STATE_DIRS) <= left, left


@needs_trainer
@pytest.mark.parametrize("inside", [False, True])
def test_merge_of_dot_finds_the_config_above(inside: bool, tmp_path: Path) -> None:
    """``cd checkpoint-N && tietool merge . --out ../m`` with config.json in the Trainer's output_dir (the
    folder above), or ``cd checkpoint-N/model_state`` with it in ``checkpoint-N/``: ``Path(".").parent`` is
    ``.``, so the folder above was never looked at (exit 3 "no config.json ... in the folder above it")."""
    run_dir = tmp_path / "run"
    ck = run_dir / "checkpoint-2"
    shutil.copytree(fx.DATA / "trainer_1rank" / "checkpoint-2", ck)
    above = ck if inside else run_dir
    shutil.copy2(fx.DATA / "trainer_1rank" / "base" / "config.json", above / "config.json")
    for n in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(fx.DATA / "trainer_1rank" / n, above / n)
    cwd = ck / "model_state" if inside else ck
    insp = av.run_cli(["inspect", ".", "--json"], cwd=cwd)
    assert insp.rc == 0 and json.loads(insp.stdout)["model_type"] == "llama", insp.describe()
    run = av.run_cli(["merge", ".", "--out", tmp_path / "m"], cwd=cwd)
    assert run.rc == 0, run.describe()
    assert (tmp_path / "m" / "tokenizer.json").is_file()


@needs_trainer
def test_the_loaders_auto_generated_metadata_is_not_carried_or_compared(tmp_path: Path) -> None:
    """PaddleFormers' ``from_pretrained`` of a merged (safetensors) folder writes
    ``flex-ckpt.auto_generated.metadata`` into it (paddle ``create_hf_ckpt_metadata``: the tensors' names,
    shapes and files; measured on the merged trainer_1rank), and paddle's ``load_state_dict`` reuses one that
    exists. resize carried the input's copy (the old shapes) into its output, and verify called the file an
    unexplained difference (exit 7) when only one side had been loaded."""
    ck = tmp_path / "checkpoint-2"
    shutil.copytree(fx.DATA / "trainer_1rank" / "checkpoint-2", ck)
    shutil.copy2(fx.DATA / "trainer_1rank" / "base" / "config.json", ck / "config.json")
    m = tmp_path / "m"
    assert av.run_cli(["merge", ck, "--out", m]).rc == 0
    (m / "flex-ckpt.auto_generated.metadata").write_bytes(b"\x80\x04N.")  # tietool never reads it
    r = tmp_path / "r"
    run = av.run_cli(["resize", m, "--vocab", "256", "--seed", "1", "--out", r])
    assert run.rc == 0, run.describe()
    assert not (r / "flex-ckpt.auto_generated.metadata").exists()
    ver = av.run_cli(["verify", m, r])
    assert ver.rc == 0, ver.describe()


@needs_trainer
def test_real_trainer_checkpoint_merged_loads_with_the_trained_logits(tmp_path: Path) -> None:
    """The merged real-Trainer checkpoints load with PaddleFormers' ``from_pretrained`` and give the logits of
    the trained model (``load_state_dict``'s tensors set into the model the run started from), bit for bit,
    computed live in one subprocess."""
    import shutil

    args = []
    base = tmp_path / "base"
    shutil.copytree(fx.DATA / "trainer_1rank" / "base", base)  # from_pretrained writes into the folder
    for name in TRAINERS:
        out = tmp_path / f"merged-{name}"
        run = av.run_cli(["merge", _trainer_copy(name, tmp_path), "--out", out])
        assert run.rc == 0, run.describe()
        args += [str(out), str(fx.DATA / name / "oracle.npz")]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    ids = fx.DATA / "trainer_1rank" / "input_ids.npy"
    cmd = [PY, "-c", _TRAINER_LOGITS, str(base), str(ids), *args]
    res = preload.run(cmd, libs=preload.PADDLEFORMERS, timeout=600, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 2 and all(ln.split()[2] == "True" for ln in lines), res.stdout


@needs_data
@pytest.mark.parametrize("kind", ["dangling", "folder"])
def test_a_distcp_that_is_no_file_named_as_what_it_is(kind: str, tmp_path: Path) -> None:
    """A ``.distcp`` that is a dangling symbolic link or a folder is said to be that (as for any file of a
    checkpoint: README's exit 3 row), not "missing" with the advice to copy a file that is there."""
    src = fx.copy_folder("ranks2", tmp_path / "ranks2")
    (src / "1_0.distcp").unlink()
    if kind == "dangling":
        (src / "1_0.distcp").symlink_to(tmp_path / "gone.distcp")
    else:
        (src / "1_0.distcp").mkdir()
    (src / "config.json").write_text("{}")
    words = ["1_0.distcp", "symbolic link" if kind == "dangling" else "folder"]
    for argv in (["merge", src, "--out", tmp_path / "m"], ["inspect", src]):
        run = av.run_cli(argv)
        av.assert_refused(run, 3, words, out=tmp_path / "m")
        assert "missing" not in run.stderr, run.describe()


def test_an_unprovable_layout_is_refused_with_a_fix_merge_has(tmp_path: Path) -> None:
    """A Llama flex checkpoint whose Linear weights are all square (intermediate_size == hidden_size ==
    the k/v width): the layout cannot be proven from the shapes, so merge refuses (exit 5), and its fix is
    one merge has (ops.MERGE_LAYOUT_FIX: export from the run), not convert's "--to safetensors"."""
    rng = np.random.default_rng(0)
    state = {n: a for n, a in fx.llama_state().items() if a.ndim == 1 or "proj" not in n}
    for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
        state[f"model.layers.0.self_attn.{p}.weight"] = rng.standard_normal((8, 8)).astype(np.float32)
    for p in ("gate_proj", "up_proj", "down_proj"):
        state[f"model.layers.0.mlp.{p}.weight"] = rng.standard_normal((8, 8)).astype(np.float32)
    ck = tmp_path / "checkpoint-1"
    fx.write_flex(ck / "model_state", state)
    config = {**fx.LLAMA, "intermediate_size": 8, "num_key_value_heads": 2}
    (ck / "config.json").write_text(json.dumps(config))
    out = tmp_path / "m"
    run = av.run_cli(["merge", ck, "--out", out])
    av.assert_refused(run, 5, ["square"], out=out)
    assert "--to" not in run.stderr, run.describe()
    assert "save_pretrained" in run.stderr, run.describe()


# ------------------------------------------------------------------------------ flexdata's hostile set
HOSTILE = fx.DATA / "hostile"
# case -> (exit of merge, the file its one line names); inspect reads the .metadata only, so a problem of the
# .distcp data (a payload, a truncated or missing file, an array unlike its record, values that disagree) is
# found by merge alone, while a gap the records leave is found by both (INSPECT_GAP)
HOSTILE_MERGE = {
    "distcp_os_system": (4, "1_0.distcp"),
    "dtype_vs_array": (3, "0.metadata"),
    "gap_missing_slice": (3, "0.metadata"),
    "global_builtins_eval": (4, "0.metadata"),
    "global_os_system": (4, "0.metadata"),
    "global_os_system_only": (4, "0.metadata"),
    "global_same_module_other_name": (4, "0.metadata"),
    "huge_bytes_length": (3, "0.metadata"),
    "huge_frame": (3, "0.metadata"),
    "huge_global_shape": (3, "0.metadata"),
    "huge_string_length": (3, "0.metadata"),
    "key_missing_in_file": (3, "0_0.distcp"),
    "local_shape_vs_array": (3, "1_0.distcp"),
    "memo_get_missing": (3, "0.metadata"),
    "missing_distcp": (3, "1_0.distcp"),
    "negative_offset": (3, "0.metadata"),
    "newobj_with_args": (4, "0.metadata"),
    "offset_out_of_range": (3, "0.metadata"),
    "overlap_disagreeing_replica": (5, "0_0.distcp"),
    "overlap_offsets": (5, "1_0.distcp"),
    "path_escape_absolute": (3, "0.metadata"),
    "path_escape_parent": (3, "0.metadata"),
    "reduce_allowed_class": (4, "0.metadata"),
    "truncated_distcp": (3, "1_0.distcp"),
    "truncated_metadata": (3, "0.metadata"),
    "unknown_record_field": (3, "0.metadata"),
    "wrong_type_offset": (3, "0.metadata"),
}
HOSTILE_OK = ("overlap_equal_replica",)  # an equal replica
# case -> (tensor, elements no slice holds, the first): the gaps inspect finds in the .metadata alone (exit 3)
INSPECT_GAP = {
    "gap_missing_slice": ("rows.fp32", 12, [3, 0]),
    "huge_global_shape": ("rows.fp32", 2**80 - 24, [0, 4]),
    "overlap_offsets": ("rows.fp32", 4, [5, 0]),  # row 2 held twice, row 5 never
}


@pytest.mark.skipif(not HOSTILE.is_dir(), reason="tests/data/flex/hostile not present")
@pytest.mark.parametrize("case", sorted(HOSTILE_MERGE) + list(HOSTILE_OK))
def test_flexdata_hostile_folders(case: str, tmp_path: Path) -> None:
    import shutil

    src = tmp_path / case
    shutil.copytree(HOSTILE / case, src)
    (src / "config.json").write_text("{}")
    before = av.tree_state(src)
    out = tmp_path / "m"
    run = av.run_cli(["merge", src, "--out", out, "--keep-paddle-layout"], cwd=tmp_path)
    if case in HOSTILE_OK:
        assert run.rc == 0, run.describe()
    else:
        code, file = HOSTILE_MERGE[case]
        av.assert_refused(run, code, [file], out=out)
    insp = av.run_cli(["inspect", src], cwd=tmp_path)
    assert insp.rc in (0, 3, 4) and (insp.rc == 0 or len(av.error_lines(insp.stderr)) == 1), insp.describe()
    if case in INSPECT_GAP:
        name, missing, first = INSPECT_GAP[case]
        assert insp.rc == 3 and name in insp.stderr and f"element {first}" in insp.stderr, insp.describe()
        assert f"problem: no slice of {name!r}" in insp.stdout, insp.describe()
        info = json.loads(av.run_cli(["inspect", src, "--json"], cwd=tmp_path).stdout)
        cov = {t["name"]: t["coverage"] for t in info["tensors"]}
        assert cov[name]["state"] == "gap" and cov[name]["missing"] == missing, cov[name]
        assert cov[name]["first_missing"] == first and info["exit_code"] == 3 and len(info["problems"]) == 1
        assert all(c["state"] == "covered" for k, c in cov.items() if k != name), cov
    assert av.tree_state(src) == before
    assert not list(tmp_path.rglob("pwned*")), "a payload ran"
