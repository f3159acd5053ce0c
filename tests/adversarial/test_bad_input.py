"""Bad input must be refused cleanly, by every command.

The contract (from the project's issues), checked by ``adversarial_support.check_refused``:

* exit code from the README table (2 usage, 3 bad checkpoint, 4 unsafe pickle, 5 refused, 6 output);
* exactly one line on stderr, ``tietool: error: <file>: <what> — <fix>``, naming the file concerned;
* no Python traceback;
* nothing written: ``--out`` absent afterwards, no ``.<name>.tietool-tmp-*`` folder beside it;
* the input folder byte-identical (sha256 of every file and the list of folders, before and after).

Each bad input is built in ``tmp_path`` from a copy of a real fixture and run through ``inspect``, ``tie``,
``untie`` and ``resize`` (``--vocab 256``) in a subprocess (``python -m tietool``, 30 s timeout, RLIMIT_AS
2 GB).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support import adversarial_support as av
from support.adversarial_support import (
    PD_FILE,
    PD_INDEX,
    PD_ONE,
    PD_SHARDED,
    ST_INDEX,
    ST_ONE,
    ST_ONE_FILE,
    ST_SHARDED,
    FakeArray,
)

CHECKPOINT = 3
ALL = av.COMMANDS


@dataclasses.dataclass
class Bad:
    """One bad checkpoint: ``build(tmp)`` returns the CKPT path; ``names`` must appear in the message."""

    id: str
    build: Callable[[Path], Path]
    names: tuple[str, ...] = ()
    code: int = CHECKPOINT
    commands: tuple[str, ...] = ALL


def on(case: str, edit: Callable[[Path], None] | None = None) -> Callable[[Path], Path]:
    """A builder: copy fixture ``case`` to ``tmp/ckpt`` and apply ``edit`` to the copy."""

    def build(tmp: Path) -> Path:
        d = av.copy_case(case, tmp / "ckpt")
        if edit is not None:
            edit(d)
        return d

    return build


def write(rel: str, content: bytes | str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        p = d / rel
        p.write_bytes(content.encode() if isinstance(content, str) else content)

    return edit


def remove(*rels: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        for rel in rels:
            (d / rel).unlink()

    return edit


def truncate(rel: str, where: Callable[[bytes], int]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        p = d / rel
        raw = p.read_bytes()
        p.write_bytes(raw[: where(raw)])

    return edit


def edit_json(rel: str, fn: Callable[[object], object]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        p = d / rel
        data = json.loads(p.read_text())
        new = fn(data)
        p.write_text(json.dumps(data if new is None else new))

    return edit


def st_header(rel: str, fn) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        av.st_edit_header(d / rel, fn)

    return edit


def set_key(path: list, value):
    def fn(h):
        x = h
        for k in path[:-1]:
            x = x[k]
        x[path[-1]] = value

    return fn


def dir_instead(rel: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        p = d / rel
        if p.exists():
            p.unlink()
        p.mkdir()
        (p / "inside.txt").write_text("x")

    return edit


def pd_replace(
    key: str, value, case: str = PD_ONE, file: str = PD_FILE, protocol: int = 4
) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        sd = av.pd_state(case, file)
        sd[key] = value
        av.pd_dump(sd, d / file, protocol)

    return edit


def st_len(n: int) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        p = d / ST_ONE_FILE
        raw = p.read_bytes()
        p.write_bytes(struct.pack("<Q", n) + raw[8:])

    return edit


def st_header_bytes(blob: bytes) -> Callable[[Path], None]:
    """Replace the JSON header by ``blob`` (length field updated), keep the data."""

    def edit(d: Path) -> None:
        p = d / ST_ONE_FILE
        raw = p.read_bytes()
        n = av.st_header_len(raw)
        p.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n :])

    return edit


def _offsets(name: str, fn):
    def edit(h):
        h[name]["data_offsets"] = fn(h, h[name]["data_offsets"])

    return edit


def _other(h, name):
    """The tensor whose data comes right after ``name``'s."""
    b = h[name]["data_offsets"][1]
    return next(k for k, v in h.items() if k != "__metadata__" and v["data_offsets"][0] == b)


def st_in_header(raw: bytes) -> int:
    return 8 + av.st_header_len(raw) // 2


def st_in_data(raw: bytes) -> int:
    return len(raw) - 100


def misnamed_weights(d: Path) -> None:
    (d / ST_ONE_FILE).rename(d / "weights.safetensors")
    (d / ST_INDEX).unlink()


def _move_entry(index: str, name: str, to: str | None = None) -> Callable[[Path], None]:
    """Map tensor ``name`` in the index to another shard (``to``, or the first other shard named)."""

    def edit(d: Path) -> None:
        p = d / index
        idx = json.loads(p.read_text())
        wm = idx["weight_map"]
        wm[name] = to or next(v for v in wm.values() if v != wm[name])
        p.write_text(json.dumps(idx))

    return edit


EMB_ST, HEAD_ST = "model.embed_tokens.weight", "lm_head.weight"
NORM_ST = "model.norm.weight"
NORM_PD, EMB_PD = "llama.norm.weight", "llama.embed_tokens.weight"


def _overflow_shape(h):
    # 2**32 * 2**32 elements: the element count overflows 64 bits to 0, matching 0 data bytes
    b = h[NORM_ST]["data_offsets"][0]
    h[NORM_ST]["shape"] = [2**32, 2**32]
    h[NORM_ST]["data_offsets"] = [b, b]


BAD: list[Bad] = [
    # ---- the folder itself
    Bad("missing_folder", lambda t: t / "no_such_ckpt", ("no_such_ckpt",)),
    Bad(
        "file_not_folder",
        lambda t: Path(shutil.copyfile(av.CASES / ST_ONE / ST_ONE_FILE, t / "ckpt.safetensors")),
        ("ckpt.safetensors",),
    ),
    # ---- config.json
    Bad("missing_config", on(ST_ONE, remove("config.json")), ("config.json",)),
    Bad("config_not_json", on(ST_ONE, write("config.json", '{"model_type": "llama",')), ("config.json",)),
    Bad("config_empty", on(ST_ONE, write("config.json", b"")), ("config.json",)),
    Bad("config_not_utf8", on(ST_ONE, write("config.json", b'{"model_type": "\xff\xfe"}')), ("config.json",)),
    Bad("config_json_list", on(ST_ONE, write("config.json", "[1, 2, 3]")), ("config.json",)),
    Bad("config_json_null", on(PD_ONE, write("config.json", "null")), ("config.json",)),
    Bad("config_is_folder", on(ST_ONE, dir_instead("config.json")), ("config.json",)),
    Bad(
        "config_deeply_nested",
        on(ST_ONE, write("config.json", "[" * 100_000 + "]" * 100_000)),
        ("config.json",),
    ),
    # ---- weights missing / misnamed
    Bad("no_weights", on(ST_ONE, remove(ST_ONE_FILE, ST_INDEX)), ("ckpt",)),
    Bad("no_weights_pd", on(PD_ONE, remove(PD_FILE)), ("ckpt",)),
    Bad("weights_misnamed", on(ST_ONE, misnamed_weights), ("weights.safetensors",)),
    Bad("st_shards_without_index", on(ST_SHARDED, remove(ST_INDEX)), (ST_INDEX,)),
    Bad("pd_shards_without_index", on(PD_SHARDED, remove(PD_INDEX)), (PD_INDEX,)),
    # ---- the index
    Bad(
        "index_names_missing_shard",
        on(ST_SHARDED, remove("model-00003-of-00009.safetensors")),
        (ST_INDEX, "model-00003-of-00009.safetensors"),
    ),
    Bad(
        "pd_index_names_missing_shard",
        on(PD_SHARDED, remove("model_state-00004-of-00008.pdparams")),
        (PD_INDEX, "model_state-00004-of-00008.pdparams"),
    ),
    Bad(
        "index_weight_map_list",
        on(ST_SHARDED, edit_json(ST_INDEX, set_key(["weight_map"], [1, 2]))),
        (ST_INDEX,),
    ),
    Bad(
        "index_weight_map_missing",
        on(ST_SHARDED, edit_json(ST_INDEX, lambda i: {"metadata": {}})),
        (ST_INDEX,),
    ),
    Bad(
        "index_weight_map_values_not_str",
        on(ST_ONE, edit_json(ST_INDEX, lambda i: {**i, "weight_map": {k: 1 for k in i["weight_map"]}})),
        (ST_INDEX,),
    ),
    Bad("index_not_json", on(ST_SHARDED, write(ST_INDEX, '{"weight_map": {')), (ST_INDEX,)),
    Bad("index_json_list", on(PD_SHARDED, write(PD_INDEX, "[]")), (PD_INDEX,)),
    Bad("index_is_folder", on(ST_SHARDED, dir_instead(ST_INDEX)), (ST_INDEX,)),
    # a tensor moved to another listed shard (its own shard still holds other tensors)
    Bad(
        "index_wrong_shard",
        on(
            ST_SHARDED,
            _move_entry(ST_INDEX, "model.layers.0.mlp.gate_proj.weight", "model-00003-of-00009.safetensors"),
        ),
        (ST_INDEX, "model.layers.0.mlp.gate_proj.weight"),
    ),
    Bad(
        "pd_index_wrong_shard",
        on(
            PD_SHARDED,
            _move_entry(
                PD_INDEX, "llama.layers.0.self_attn.q_proj.weight", "model_state-00003-of-00008.pdparams"
            ),
        ),
        (PD_INDEX, "llama.layers.0.self_attn.q_proj.weight"),
    ),
    # the only tensor of a shard moved to another shard: that shard is then named by no index entry
    Bad(
        "index_wrong_shard_sole_tensor",
        on(ST_SHARDED, _move_entry(ST_INDEX, "lm_head.weight", "model-00001-of-00009.safetensors")),
        (ST_INDEX, "lm_head.weight"),
    ),
    Bad(
        "pd_index_wrong_shard_sole_tensor",
        on(PD_SHARDED, _move_entry(PD_INDEX, EMB_PD, "model_state-00002-of-00008.pdparams")),
        (PD_INDEX, EMB_PD),
    ),
    Bad(
        "index_shard_outside_folder",
        on(
            ST_ONE,
            edit_json(
                ST_INDEX, lambda i: {**i, "weight_map": {k: "../x.safetensors" for k in i["weight_map"]}}
            ),
        ),
        (ST_INDEX,),
    ),
    Bad("index_deeply_nested", on(ST_ONE, write(ST_INDEX, "[" * 100_000 + "]" * 100_000)), (ST_INDEX,)),
    # ---- safetensors files
    Bad("st_truncated_in_length", on(ST_ONE, truncate(ST_ONE_FILE, lambda r: 5)), (ST_ONE_FILE,)),
    Bad("st_truncated_in_header", on(ST_ONE, truncate(ST_ONE_FILE, st_in_header)), (ST_ONE_FILE,)),
    Bad("st_truncated_in_data", on(ST_ONE, truncate(ST_ONE_FILE, st_in_data)), (ST_ONE_FILE,)),
    Bad(
        "st_shard_truncated_in_data",
        on(ST_SHARDED, truncate("model-00005-of-00009.safetensors", st_in_data)),
        ("model-00005-of-00009",),
    ),
    Bad(
        "st_header_len_gt_file",
        on(ST_ONE, st_len((av.CASES / ST_ONE / ST_ONE_FILE).stat().st_size)),
        (ST_ONE_FILE,),
    ),
    Bad("st_header_len_2_60", on(ST_ONE, st_len(2**60)), (ST_ONE_FILE,)),
    Bad("st_header_not_json", on(ST_ONE, st_header_bytes(b'{"a": [1, 2' + b" " * 21)), (ST_ONE_FILE,)),
    Bad("st_header_not_utf8", on(ST_ONE, st_header_bytes(b'{"\xff\xfe": 1}  ')), (ST_ONE_FILE,)),
    Bad("st_header_json_list", on(ST_ONE, st_header_bytes(b"[1, 2, 3]       ")), (ST_ONE_FILE,)),
    Bad(
        "st_header_deeply_nested", on(ST_ONE, st_header_bytes(b"[" * 50_000 + b"]" * 50_000)), (ST_ONE_FILE,)
    ),
    Bad(
        "st_bad_dtype",
        on(ST_ONE, st_header(ST_ONE_FILE, set_key([NORM_ST, "dtype"], "F33"))),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad(
        "st_dtype_lowercase",
        on(ST_ONE, st_header(ST_ONE_FILE, set_key([EMB_ST, "dtype"], "f32"))),
        (ST_ONE_FILE, EMB_ST),
    ),
    Bad(
        "st_dtype_not_a_string",
        on(ST_ONE, st_header(ST_ONE_FILE, set_key([NORM_ST, "dtype"], ["F32"]))),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad(
        "st_dtype_null",
        on(ST_ONE, st_header(ST_ONE_FILE, set_key([NORM_ST, "dtype"], None))),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad(
        "st_entry_not_object",
        on(ST_ONE, st_header(ST_ONE_FILE, set_key([NORM_ST], "F32"))),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad(
        "st_metadata_not_strings",
        on(ST_ONE, st_header(ST_ONE_FILE, set_key(["__metadata__"], {"format": 1}))),
        (ST_ONE_FILE,),
    ),
    Bad(
        "st_offsets_exceed_file",
        on(ST_ONE, st_header(ST_ONE_FILE, _offsets(NORM_ST, lambda h, o: [o[0] + 10**6, o[1] + 10**6]))),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad(
        "st_offsets_2_60",
        on(ST_ONE, st_header(ST_ONE_FILE, _offsets(NORM_ST, lambda h, o: [2**60, 2**60 + 64]))),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad(
        "st_offsets_reversed",
        on(ST_ONE, st_header(ST_ONE_FILE, _offsets(NORM_ST, lambda h, o: [o[1], o[0]]))),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad(
        "st_offsets_negative",
        on(ST_ONE, st_header(ST_ONE_FILE, _offsets(NORM_ST, lambda h, o: [-64, 0]))),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad(
        "st_offsets_overlap",
        on(
            ST_ONE,
            st_header(
                ST_ONE_FILE,
                _offsets(
                    EMB_ST,
                    lambda h, o: [
                        h[_other(h, EMB_ST)]["data_offsets"][0] - 16,
                        h[_other(h, EMB_ST)]["data_offsets"][0] - 16 + (o[1] - o[0]),
                    ],
                ),
            ),
        ),
        (ST_ONE_FILE,),
    ),
    Bad(
        "st_shape_size_mismatch",
        on(ST_ONE, st_header(ST_ONE_FILE, set_key([EMB_ST, "shape"], [100, 15]))),
        (ST_ONE_FILE, EMB_ST),
    ),
    Bad(
        "st_negative_dim",
        on(ST_ONE, st_header(ST_ONE_FILE, set_key([EMB_ST, "shape"], [-100, -16]))),
        (ST_ONE_FILE, EMB_ST),
    ),
    Bad(
        "st_shape_overflows_to_0_bytes",
        on(ST_ONE, st_header(ST_ONE_FILE, _overflow_shape)),
        (ST_ONE_FILE, NORM_ST),
    ),
    Bad("st_empty_file", on(ST_ONE, write(ST_ONE_FILE, b"")), (ST_ONE_FILE,)),
    Bad(
        "st_single_empty_file",
        on(ST_ONE, lambda d: (remove(ST_INDEX, ST_ONE_FILE)(d), write("model.safetensors", b"")(d))),
        ("model.safetensors",),
    ),
    Bad("st_weight_is_folder", on(ST_ONE, dir_instead(ST_ONE_FILE)), (ST_ONE_FILE,)),
    Bad(
        "st_single_weight_is_folder",
        on(ST_ONE, lambda d: (remove(ST_INDEX, ST_ONE_FILE)(d), dir_instead("model.safetensors")(d))),
        ("model.safetensors",),
    ),
    Bad(
        "st_tensor_in_two_shards",
        on(
            ST_SHARDED,
            lambda d: shutil.copyfile(
                d / "model-00001-of-00009.safetensors", d / "model-00002-of-00009.safetensors"
            ),
        ),
        ("model-0000",),
    ),
    # ---- pdparams files
    Bad("pd_truncated_in_opcodes", on(PD_ONE, truncate(PD_FILE, lambda r: 120)), (PD_FILE,)),
    Bad("pd_truncated_in_payload", on(PD_ONE, truncate(PD_FILE, lambda r: 1000)), (PD_FILE,)),
    Bad("pd_truncated_before_stop", on(PD_ONE, truncate(PD_FILE, lambda r: len(r) - 1)), (PD_FILE,)),
    Bad(
        "pd_shard_truncated",
        on(PD_SHARDED, truncate("model_state-00003-of-00008.pdparams", lambda r: len(r) // 2)),
        ("model_state-00003-of-00008.pdparams",),
    ),
    Bad("pd_random_bytes", on(PD_ONE, write(PD_FILE, np.random.default_rng(0).bytes(4096))), (PD_FILE,)),
    Bad("pd_text_file", on(PD_ONE, write(PD_FILE, "this is not a pickle\n")), (PD_FILE,)),
    Bad("pd_empty_file", on(PD_ONE, write(PD_FILE, b"")), (PD_FILE,)),
    Bad(
        "pd_top_level_list",
        on(PD_ONE, lambda d: av.pd_dump(list(av.pd_state().values()), d / PD_FILE)),
        (PD_FILE,),
    ),
    Bad("pd_top_level_int", on(PD_ONE, lambda d: av.pd_dump(7, d / PD_FILE, 2)), (PD_FILE,)),
    Bad(
        "pd_key_not_string",
        on(PD_ONE, pd_replace(7, FakeArray((4,), np.dtype("f4"), b"\0" * 16))),
        (PD_FILE,),
    ),
    Bad("pd_weight_is_folder", on(PD_ONE, dir_instead(PD_FILE)), (PD_FILE,)),
    Bad(
        "pd_payload_shorter_than_shape",
        on(PD_ONE, pd_replace(NORM_PD, FakeArray((16,), np.dtype("f4"), b"\0" * 60))),
        (PD_FILE,),
    ),
    Bad(
        "pd_negative_dims",
        on(PD_ONE, pd_replace(NORM_PD, FakeArray((-4, -4), np.dtype("f4"), b"\0" * 64))),
        (PD_FILE,),
    ),
    Bad(
        "pd_shape_overflows_to_0_bytes",
        on(PD_ONE, pd_replace(NORM_PD, FakeArray((2**32, 2**32), np.dtype("f4"), b""))),
        (PD_FILE,),
    ),
    Bad(
        "pd_dtype_object",
        on(PD_ONE, pd_replace(NORM_PD, FakeArray((2,), np.dtype("O"), b"\0" * 16))),
        (PD_FILE,),
    ),
]


def _pd_deep_extras(d: Path) -> None:
    """StructuredToParameterName@@ holding a list nested 5000 deep (built by the walker without recursion)."""
    raw = (av.CASES / PD_ONE / PD_FILE).read_bytes()
    assert raw.endswith(b"u."), "expected a dict pickle closed by SETITEMS, STOP"
    nested = b"(" + b"\x8c\x04deep" + b"]" * 5000 + b"a" * 4999 + b"u"
    # add one more entry to the top-level dict before STOP: SETITEMS on the still-open dict
    d.joinpath(PD_FILE).write_bytes(raw[:-1] + nested + b".")


@pytest.mark.parametrize("command", ALL)
@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_checkpoint_refused(bad: Bad, command: str, tmp_path: Path) -> None:
    if command not in bad.commands:
        pytest.skip(f"{command} does not apply")
    ckpt = bad.build(tmp_path)
    before = av.tree_state(ckpt)
    out = tmp_path / "out"
    # tie --keep embedding: the PaddleNLP fixture's head differs from its embedding, and a plain tie would be
    # refused for that (exit 5) whether or not the damage was noticed
    extra = ["--keep", "embedding"] if command == "tie" else []
    run = av.run_cli(av.command_argv(command, ckpt, out, extra))
    av.assert_refused(run, bad.code, bad.names, inp=ckpt, before=before, out=out)


# Unusual but not necessarily broken: tietool may handle these or refuse them (exit 3, one line), but never
# crash (exit 70) or half-write. A write that succeeds must give an output the tool itself can read back.
ODD = {
    "pd_dtype_complex64": on(PD_ONE, pd_replace(NORM_PD, FakeArray((8,), np.dtype("c8"), b"\0" * 64))),
    "pd_dtype_unicode": on(PD_ONE, pd_replace(NORM_PD, FakeArray((4,), np.dtype("U4"), b"\0" * 64))),
    "pd_dtype_datetime": on(PD_ONE, pd_replace(NORM_PD, FakeArray((8,), np.dtype("M8[s]"), b"\0" * 64))),
    "pd_dtype_void": on(PD_ONE, pd_replace(NORM_PD, FakeArray((4,), np.dtype("V16"), b"\0" * 64))),
    "pd_deeply_nested_extras": on(PD_ONE, lambda d: _pd_deep_extras(d)),
    "pd_protocol_2": on(PD_ONE, lambda d: av.pd_dump(av.pd_state(), d / PD_FILE, 2)),
    "pd_fortran_order": on(
        PD_ONE,
        pd_replace(
            "llama.layers.0.mlp.gate_proj.weight",
            np.asfortranarray(av.pd_state()["llama.layers.0.mlp.gate_proj.weight"]),
        ),
    ),
    "st_trailing_bytes_after_data": on(
        ST_ONE,
        lambda d: d.joinpath(ST_ONE_FILE).write_bytes(d.joinpath(ST_ONE_FILE).read_bytes() + b"\0" * 64),
    ),
}


@pytest.mark.parametrize("command", ALL)
@pytest.mark.parametrize("odd", list(ODD))
def test_odd_checkpoint_handled_or_refused(odd: str, command: str, tmp_path: Path) -> None:
    ckpt = ODD[odd](tmp_path)
    before = av.tree_state(ckpt)
    out = tmp_path / "out"
    extra = ["--keep", "embedding"] if command == "tie" else []
    run = av.run_cli(av.command_argv(command, ckpt, out, extra))
    if run.rc == 0:
        assert av.tree_state(ckpt) == before, "the input changed"
        if command != "inspect":
            back = av.run_cli(["inspect", out])
            assert back.rc == 0, (
                f"the output of a successful {command} does not read back\n" + back.describe()
            )
    else:
        av.assert_refused(run, 3, (), inp=ckpt, before=before, out=out)


# ------------------------------------------------------------------------------------------ option values
BAD_VOCAB = ["0", "-5", "abc", "1.5", "", " ", "1e3", "0x10", "-0"]


@pytest.mark.parametrize("vocab", BAD_VOCAB, ids=[f"vocab={v!r}" for v in BAD_VOCAB])
@pytest.mark.parametrize("case", [ST_ONE, PD_ONE])
def test_resize_bad_vocab(case: str, vocab: str, tmp_path: Path) -> None:
    ckpt = av.copy_case(case, tmp_path / "ckpt")
    before = av.tree_state(ckpt)
    out = tmp_path / "out"
    run = av.run_cli(["resize", ckpt, "--out", out, "--vocab", vocab, "--quiet"])
    av.assert_refused(run, 2, ("--vocab",), inp=ckpt, before=before, out=out)


@pytest.mark.parametrize("vocab", ["99999999999999999999999999", "99999999999", "100000000"])
def test_resize_vocab_too_large_for_memory(vocab: str, tmp_path: Path) -> None:
    """A --vocab whose new rows cannot fit in memory is a bad option value, not an internal error (70)."""
    ckpt = av.copy_case(ST_ONE, tmp_path / "ckpt")
    before = av.tree_state(ckpt)
    out = tmp_path / "out"
    run = av.run_cli(["resize", ckpt, "--out", out, "--vocab", vocab, "--quiet"])
    av.assert_refused(run, (2, 6), (), inp=ckpt, before=before, out=out)


@pytest.mark.parametrize("mult", ["0", "-8", "x", "2.5"])
def test_resize_bad_pad_to_multiple_of(mult: str, tmp_path: Path) -> None:
    ckpt = av.copy_case(ST_ONE, tmp_path / "ckpt")
    before = av.tree_state(ckpt)
    out = tmp_path / "out"
    run = av.run_cli(
        ["resize", ckpt, "--out", out, "--vocab", "128", "--pad-to-multiple-of", mult, "--quiet"]
    )
    av.assert_refused(run, 2, ("--pad-to-multiple-of",), inp=ckpt, before=before, out=out)


def test_bad_vocab_checked_before_bad_checkpoint(tmp_path: Path) -> None:
    """Both wrong: either refusal is fine, but it must be one clean line and write nothing."""
    out = tmp_path / "out"
    run = av.run_cli(["resize", tmp_path / "missing", "--out", out, "--vocab", "0", "--quiet"])
    av.assert_refused(run, (2, 3), (), out=out)


# ------------------------------------------------------------------------------------------ --out
WRITERS = ("tie", "untie", "resize")


def _out_equal(ckpt: Path, tmp: Path) -> Path:
    return ckpt


def _out_inside(ckpt: Path, tmp: Path) -> Path:
    return ckpt / "sub" / "out"


def _out_inside_existing(ckpt: Path, tmp: Path) -> Path:
    (ckpt / "emptydir").mkdir()
    return ckpt / "emptydir"


def _out_dotdot(ckpt: Path, tmp: Path) -> Path:
    return tmp / "elsewhere" / ".." / "ckpt"


def _out_parent(ckpt: Path, tmp: Path) -> Path:
    return tmp


def _out_nonempty(ckpt: Path, tmp: Path) -> Path:
    o = tmp / "existing"
    o.mkdir()
    (o / "keep.txt").write_text("do not delete")
    return o


def _out_file(ckpt: Path, tmp: Path) -> Path:
    o = tmp / "existing.txt"
    o.write_text("do not delete")
    return o


def _out_symlink_to_input(ckpt: Path, tmp: Path) -> Path:
    o = tmp / "link"
    o.symlink_to(ckpt, target_is_directory=True)
    return o


OUTS = {
    "equal_to_input": _out_equal,
    "inside_input": _out_inside,
    "inside_input_existing_empty": _out_inside_existing,
    "equal_via_dotdot": _out_dotdot,
    "contains_input": _out_parent,
    "existing_nonempty_folder": _out_nonempty,
    "existing_file": _out_file,
    "symlink_to_input": _out_symlink_to_input,
}


@pytest.mark.parametrize("command", WRITERS)
@pytest.mark.parametrize("where", list(OUTS))
@pytest.mark.parametrize("case", [ST_ONE, PD_ONE])
def test_bad_out(case: str, where: str, command: str, tmp_path: Path) -> None:
    ckpt = av.copy_case(case, tmp_path / "ckpt")
    out = OUTS[where](ckpt, tmp_path)
    before = av.tree_state(ckpt)
    out_before = av.tree_state(out) if out.exists() else None
    extra = ["--keep", "embedding"] if command == "tie" else []
    run = av.run_cli(av.command_argv(command, ckpt, out, extra))
    # ``inside_input_existing_empty`` / ``contains_input`` exist but their content is the input's business
    if where in (
        "equal_to_input",
        "inside_input_existing_empty",
        "contains_input",
        "equal_via_dotdot",
        "symlink_to_input",
    ):
        av.assert_refused(run, 2, ("--out",), inp=ckpt, before=before)
        assert not av.leftovers(out), av.leftovers(out)
    else:
        av.assert_refused(run, 2, ("--out",), inp=ckpt, before=before, out=out, out_before=out_before)


# ------------------------------------------------------------------------------------------ head vs embedding
def _st_head_rows(rows: int) -> Callable[[Path], None]:
    """Safetensors head [rows, 16] (vocab-hidden): the embedding's rows, cycled to ``rows``."""

    def edit(d: Path) -> None:
        p = d / ST_ONE_FILE
        ts = av.st_tensors(p)
        dt, shape, _ = ts[HEAD_ST]
        emb = np.frombuffer(ts[EMB_ST][2], "<f4").reshape(ts[EMB_ST][1])
        ts[HEAD_ST] = (dt, [rows, shape[1]], np.resize(emb, (rows, shape[1])).astype("<f4").tobytes())
        av.st_write_tensors(p, ts)

    return edit


def _pd_head_cols(cols: int) -> Callable[[Path], None]:
    """PaddleNLP head [16, cols] (hidden-vocab): the embedding transposed, columns cycled to ``cols``."""

    def edit(d: Path) -> None:
        sd = av.pd_state()
        emb = sd[EMB_PD]
        head = np.ascontiguousarray(np.resize(emb, (cols, emb.shape[1])).T).astype(np.float32)
        sd["lm_head.weight"] = head
        av.pd_dump(sd, d / PD_FILE)

    return edit


HEADS = {
    "st_head_8_rows_more": (on(ST_ONE, _st_head_rows(108)), "[108, 16]"),
    "st_head_half_rows": (on(ST_ONE, _st_head_rows(50)), "[50, 16]"),
    "pd_head_8_cols_more": (on(PD_ONE, _pd_head_cols(108)), "[16, 108]"),
    "pd_head_half_cols": (on(PD_ONE, _pd_head_cols(50)), "[16, 50]"),
}


@pytest.mark.parametrize("command", ["tie", "resize"])
@pytest.mark.parametrize("head", list(HEADS))
def test_head_vocab_disagrees_with_embedding(head: str, command: str, tmp_path: Path) -> None:
    build, shape = HEADS[head]
    ckpt = build(tmp_path)
    before = av.tree_state(ckpt)
    out = tmp_path / "out"
    for extra in ([], ["--keep", "embedding"]) if command == "tie" else ([],):
        run = av.run_cli(av.command_argv(command, ckpt, out, extra))
        av.assert_refused(run, 5, ("lm_head.weight", shape), inp=ckpt, before=before, out=out)


@pytest.mark.parametrize("head", list(HEADS))
def test_inspect_reports_head_mismatch_readably(head: str, tmp_path: Path) -> None:
    """inspect exits 0 and says what is wrong; the text of the problem survives the terminal rendering."""
    build, _ = HEADS[head]
    ckpt = build(tmp_path)
    run = av.run_cli(["inspect", ckpt])
    assert run.rc == 0, run.describe()
    problems = [ln for ln in run.stdout.splitlines() if ln.startswith("problem:") and "lm_head.weight" in ln]
    assert problems, run.describe()
    # the JSON report carries the full text; the terminal one must not lose words of it
    js = av.run_cli(["inspect", ckpt, "--json"])
    assert js.rc == 0, js.describe()
    full = [p for p in json.loads(js.stdout)["problems"] if "lm_head.weight" in p]
    for p in full:
        assert f"problem: {p}" in run.stdout, f"rendered text differs from the report:\n{p}\n{run.stdout}"


# ------------------------------------------------------------------------------------------ other odd input
def test_bracketed_names_are_printed_not_parsed(tmp_path: Path) -> None:
    """A folder called ``ckpt[/x]`` (legal on every file system) and a model_type with brackets: inspect must
    print them, not feed them to the terminal markup parser (a MarkupError is an internal error, exit 70)."""
    ckpt = av.copy_case(ST_ONE, tmp_path / "ckpt[/x]")
    run = av.run_cli(["inspect", ckpt])
    assert run.rc == 0 and "ckpt[/x]" in run.stdout, run.describe()


def test_bracketed_model_type(tmp_path: Path) -> None:
    ckpt = av.copy_case(ST_ONE, tmp_path / "ckpt")
    edit_json("config.json", set_key(["model_type"], "[/llama]"))(ckpt)
    run = av.run_cli(["inspect", ckpt])
    assert av.check_no_crash(run) == [], run.describe()


@pytest.mark.parametrize(
    "tok",
    [
        '{"model": "bpe"}',
        '{"model": {"vocab": 5}, "added_tokens": 3}',
        '{"added_tokens": [1, 2]}',
        "[1, 2]",
        '{"model": {"vocab": {"a": 0}}, "added_tokens": {"id": 1}}',
    ],
    ids=["model_str", "added_tokens_int", "added_tokens_ints", "list", "added_tokens_dict"],
)
@pytest.mark.parametrize("command", ["inspect", "tie"])
def test_odd_tokenizer_json(tok: str, command: str, tmp_path: Path) -> None:
    """tokenizer.py says it "never raises on a bad file": an odd tokenizer.json is a problem to report or a
    one-line error, never an internal error."""
    ckpt = av.copy_case(ST_ONE, tmp_path / "ckpt")
    (ckpt / "tokenizer.json").write_text(tok)
    before = av.tree_state(ckpt)
    run = av.run_cli(av.command_argv(command, ckpt, tmp_path / "out"))
    assert av.check_no_crash(run) == [], run.describe()
    assert av.tree_state(ckpt) == before


def test_big_endian_pdparams_values_survive_or_refused(tmp_path: Path) -> None:
    """A numpy pickle may hold big-endian arrays (dtype '>f4'). tie must either refuse it or keep the values:
    writing the big-endian bytes under a little-endian label silently changes every value."""
    ckpt = av.copy_case(PD_ONE, tmp_path / "ckpt")
    vals = np.arange(16, dtype=">f4")
    pd_replace(NORM_PD, FakeArray((16,), np.dtype(">f4"), vals.tobytes()))(ckpt)
    out = tmp_path / "out"
    run = av.run_cli(["tie", ckpt, "--out", out, "--keep", "embedding", "--quiet"])
    if run.rc == 0:
        got = pickle.loads((out / PD_FILE).read_bytes())[NORM_PD]  # our own output, from our own input
        assert np.array_equal(got.astype(np.float32), vals.astype(np.float32)), (
            f"{NORM_PD} changed: {got[:4]} (input {vals[:4]})\n{run.describe()}"
        )
    else:
        av.assert_refused(run, 3, (PD_FILE,), out=out)


@pytest.mark.parametrize("command", WRITERS)
def test_good_input_still_works(command: str, tmp_path: Path) -> None:
    """Positive control for the harness: a clean copy goes through every write command."""
    ckpt = av.copy_case(ST_ONE, tmp_path / "ckpt")
    out = tmp_path / "out"
    run = av.run_cli(av.command_argv(command, ckpt, out))
    assert run.rc == 0, run.describe()
    assert (out / "config.json").is_file() and not av.leftovers(out)


# ------------------------------------------------------------------ unreadable files and folders (issue 18)
# The suite may run as root, which reads anything: these runs drop CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH
# from the child's bounding set (setpriv), so that mode 000 means "cannot be read" for it too.
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def _permissions_enforced(tmp: Path) -> bool:
    probe = tmp / "probe"
    probe.write_text("x")
    probe.chmod(0)
    try:
        return subprocess.run([*NO_DAC, "cat", str(probe)], capture_output=True, check=False).returncode != 0
    except OSError:  # no setpriv
        return False
    finally:
        probe.chmod(0o600)


def run_no_dac(argv: list) -> av.Run:
    """``python -m tietool *argv`` as :func:`av.run_cli`, with file permissions enforced even for root."""
    argv = [str(a) for a in argv]
    t0 = time.monotonic()
    p = subprocess.run(
        [*NO_DAC, av.PYTHON, "-m", "tietool", *argv],
        cwd=av.REPO,
        env=av.cli_env(),
        capture_output=True,
        text=True,
        timeout=av.TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return av.Run(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


# (what is made unreadable, its mode, the name the error must give); "." is the checkpoint folder itself
UNREADABLE = [
    ("config.json", 0, "config.json"),
    (ST_INDEX, 0, ST_INDEX),
    ("tokenizer.json", 0, "tokenizer.json"),  # item 9: exit 6 "cannot write the output" before
    ("tokenizer_config.json", 0, "tokenizer_config.json"),
    ("generation_config.json", 0, "generation_config.json"),
    ("assets/notes.txt", 0, "notes.txt"),
    ("assets", 0, "assets"),  # an unreadable subfolder: its files were left out of the output in silence
    (".", 0, "ckpt"),  # exit 70 before
    (".", 0o600, "ckpt"),  # listable but not searchable: exit 70 before
]


@pytest.mark.parametrize(("rel", "mode", "name"), UNREADABLE, ids=[f"{r}-{m:o}" for r, m, _ in UNREADABLE])
def test_unreadable_refused(rel: str, mode: int, name: str, tmp_path: Path) -> None:
    if not _permissions_enforced(tmp_path):
        pytest.skip("cannot make a file unreadable here (no setpriv, or permissions are not enforced)")
    tmp_path.chmod(0o755)
    ckpt = av.copy_case(ST_ONE, tmp_path / "ckpt")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (ckpt / f).write_text("{}")
    (ckpt / "assets").mkdir()
    (ckpt / "assets" / "notes.txt").write_text("hi")
    target = ckpt / rel
    target.chmod(mode)
    try:
        for command in ("inspect", "untie"):
            out = tmp_path / f"out-{command}"
            run = run_no_dac(av.command_argv(command, ckpt, out))
            av.assert_refused(run, 3, [name], out=out)
    finally:
        target.chmod(0o755 if target.is_dir() else 0o644)


@pytest.mark.parametrize("rel", ["model_state.tp01.pdparams", "tokenizer_config.json", "."])
def test_merge_unreadable_refused(rel: str, tmp_path: Path) -> None:
    if not _permissions_enforced(tmp_path):
        pytest.skip("cannot make a file unreadable here (no setpriv, or permissions are not enforced)")
    from support import fixture_support as fs
    from support.paths import BUG_CASES_DIR

    tmp_path.chmod(0o755)
    ranks = fs.copy_checkpoint(BUG_CASES_DIR / "c05_paddlenlp_tp_rank_files" / "ckpt", tmp_path / "ckpt")
    (ranks / "tokenizer_config.json").write_text("{}")
    target = ranks / rel
    target.chmod(0)
    try:
        out = tmp_path / "out"
        run = run_no_dac(["merge", ranks, "--out", out, "--quiet"])
        av.assert_refused(run, 3, [target.name if rel != "." else "ckpt"], out=out)
    finally:
        target.chmod(0o755 if target.is_dir() else 0o644)


# ------------------------------------------------------------ the config type check refuses no real config
# configfile.CONFIG_KEYS is checked against every config class's defaults of the libraries (an oracle: what
# they write is what a checkpoint holds). transformers' Pix2StructConfig() nests a dict as
# text_config.vocab_size (a construction quirk of that class: pix2struct checkpoints hold an int), which
# tietool refuses as it must.
KNOWN_BAD_DEFAULTS = {"pix2struct"}


def _default_config_refusals(mapping) -> tuple[int, list[str]]:
    import warnings

    from tietool.surgery.io.configfile import check_config
    from tietool.surgery.model.errors import CheckpointError

    checked, refused = 0, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in list(mapping.keys()):
            try:
                doc = json.loads(mapping[name]().to_json_string())
            except Exception:  # a class that cannot be built without arguments: nothing to check
                continue
            checked += 1
            try:
                check_config(doc, name)
            except CheckpointError as e:
                if name not in KNOWN_BAD_DEFAULTS:
                    refused.append(str(e))
    return checked, refused


def test_paddleformers_default_configs_pass_the_type_check() -> None:
    from paddleformers.transformers.auto.configuration import CONFIG_MAPPING

    checked, refused = _default_config_refusals(CONFIG_MAPPING)
    assert checked >= 20 and not refused, refused


@pytest.mark.slow
def test_transformers_default_configs_pass_the_type_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # offline: a few classes' defaults name a Hub model (a timm backbone) and would fetch its config, which
    # fails without a network only after huggingface_hub's retries (~23 s of back-off each; the test took
    # ~50 s for 3 s of work) and would make the check depend on the Hub where there is one. Offline, those
    # classes refuse at once and are left out as classes that cannot be built without arguments (461 of
    # them are checked either way).
    import huggingface_hub.constants as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    from transformers import CONFIG_MAPPING

    checked, refused = _default_config_refusals(CONFIG_MAPPING)
    assert checked >= 300 and not refused, refused


# ------------------------------------------------------------------------------------------- mistaken inputs
# What people pass instead of a checkpoint folder (surgery/io/mistaken.py): each named, with what tietool
# does not read and what to do, in one exact line and its exit code. Built in tmp_path, run with cwd there so
# that the path in the line is the relative one the user typed.
_UNFINISHED = "wait for the save to finish or use the previous checkpoint-N"
_TORCH = (
    "PyTorch weights (a pickle); tietool never unpickles PyTorch files (.bin, .pt, .pth, .ckpt) and reads "
    "only .safetensors and .pdparams — load the model where you trust the file and save it as safetensors "
    "(transformers: save_pretrained(DIR, safe_serialization=True); a state dict: "
    "safetensors.torch.save_file), then run tietool on that folder"
)
_ADAPTER = (
    "a LoRA/PEFT adapter, not a whole model: it holds only the adapter weights ({}; no config.json and no "
    "base-model weights) — merge the adapter into the base model first (PaddleNLP/PaddleFormers merge_lora, "
    "or PEFT merge_and_unload() then save_pretrained) and run tietool on the merged folder"
)


def _folder(files: dict[str, bytes | str]) -> Callable[[Path], str]:
    """A builder: folder ``m`` in tmp holding ``files`` (relative names; folders made)."""

    def build(tmp: Path) -> str:
        for rel, content in files.items():
            p = tmp / "m" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content.encode() if isinstance(content, str) else content)
        return "m"

    return build


def _case(case: str, edit: Callable[[Path], None]) -> Callable[[Path], str]:
    def build(tmp: Path) -> str:
        on(case, edit)(tmp)
        (tmp / "ckpt").rename(tmp / "m")
        return "m"

    return build


def _truncate_to(n: int) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        with open(d / ST_ONE_FILE, "r+b") as f:
            f.truncate(n)

    return edit


_CONFIG = json.dumps({"model_type": "llama", "vocab_size": 16, "hidden_size": 8})
MISTAKEN = {
    "hub_id": (
        lambda tmp: "Qwen/Qwen2.5-0.5B",
        3,
        "Qwen/Qwen2.5-0.5B: no such folder; it looks like a Hugging Face Hub id — did you mean "
        "hf://Qwen/Qwen2.5-0.5B? (a revision: hf://Qwen/Qwen2.5-0.5B@REVISION; merge, convert and add-tokens "
        "take local folders: download it first, e.g. huggingface_hub.snapshot_download('Qwen/Qwen2.5-0.5B', "
        "local_dir=DIR))",
    ),
    "pytorch_model_bin": (
        _folder({"config.json": _CONFIG, "pytorch_model.bin": b"PK\x03\x04", "training_args.bin": b"x"}),
        3,
        "m: pytorch_model.bin: " + _TORCH,
    ),
    "model_pt_no_config": (_folder({"model.pt": b"x", "rng_state.pth": b"x"}), 3, "m: model.pt: " + _TORCH),
    "ckpt_file": (_folder({"config.json": _CONFIG, "last.ckpt": b"x"}), 3, "m: last.ckpt: " + _TORCH),
    "gguf": (
        _folder({"qwen2.5-0.5b-q4_k_m.gguf": b"GGUF"}),
        3,
        "m: qwen2.5-0.5b-q4_k_m.gguf: GGUF (llama.cpp); tietool does not read GGUF and reads only "
        ".safetensors and .pdparams — run tietool on the safetensors checkpoint the GGUF was made from (or "
        "load it with transformers' from_pretrained(..., gguf_file=...) and save_pretrained(DIR))",
    ),
    "peft_adapter": (
        _folder({"adapter_config.json": "{}", "adapter_model.safetensors": b"x", "README.md": "x"}),
        5,
        "m: " + _ADAPTER.format("adapter_config.json, adapter_model.safetensors"),
    ),
    "paddle_lora_adapter": (
        _folder({"lora_config.json": "{}", "lora_model_state.pdparams": b"x"}),
        5,
        "m: " + _ADAPTER.format("lora_config.json, lora_model_state.pdparams"),
    ),
    "paddleformers_peft_safetensors": (
        _folder({"lora_config.json": "{}", "peft_model-00001-of-00001.safetensors": b"x"}),
        5,
        "m: " + _ADAPTER.format("lora_config.json, peft_model-00001-of-00001.safetensors"),
    ),
    "flex_without_metadata": (
        _folder({"model_state/0_0.distcp": b"x", "model_state/1_0.distcp": b"x", "training_args.bin": b"x"}),
        3,
        "m: an unfinished save: model_state/ holds 2 .distcp file(s) (0_0.distcp, ...) but no .metadata (a "
        f"save still being written or stopped, or a folder copied in part) — {_UNFINISHED}",
    ),
    "tmp_file": (
        _case(ST_ONE, lambda d: (d / ST_INDEX).rename(d / (ST_INDEX + ".tmp"))),
        3,
        "m: an unfinished save: model.safetensors.index.json.tmp is a temporary file (a file still being "
        f"written, or left by a save that was stopped) — {_UNFINISHED}",
    ),
    "shards_without_index": (
        _case(ST_ONE, remove(ST_INDEX)),
        3,
        "m: shard files are present but model.safetensors.index.json is missing: an unfinished save "
        f"(save_pretrained writes the index after the shards) or a lost index — {_UNFINISHED}; if the save "
        "had finished, restore model.safetensors.index.json (it maps tensor names to shards)",
    ),
    "truncated_safetensors": (
        _case(ST_ONE, _truncate_to(20_000)),
        3,
        f"m/{ST_ONE_FILE}: truncated: the file is 20,000 bytes, its header says 24,392 (4,392 bytes missing "
        "at the end: a save or a copy cut short) — copy or download the file again; if a save is still being "
        f"written, {_UNFINISHED}",
    ),
}
# the merge of a folder of rank files names the same inputs (it said "nothing to merge", exit 2)
MERGE_TOO = ("hub_id", "flex_without_metadata", "tmp_file")


@pytest.mark.parametrize("command", ["inspect", "resize", "merge"])
@pytest.mark.parametrize("name", list(MISTAKEN))
def test_mistaken_input_named(name: str, command: str, tmp_path: Path) -> None:
    if command == "merge" and name not in MERGE_TOO:
        pytest.skip("merge takes rank files and flex checkpoints only")
    build, code, line = MISTAKEN[name]
    arg = build(tmp_path)
    before = av.tree_state(tmp_path / arg)
    argv = ["inspect", arg] if command == "inspect" else [command, arg, "--out", "out", "--quiet"]
    if command == "resize":
        argv += ["--vocab", "256"]
    run = av.run_cli(argv, cwd=tmp_path)
    assert (run.rc, run.stderr) == (code, f"tietool: error: {line}\n"), run.describe()
    assert av.tree_state(tmp_path / arg) == before and not (tmp_path / "out").exists()
