"""Write the hostile flex-checkpoint folders of tests/data/flex/hostile (see README.md there).

Run: ``/work/main/.venv/bin/python tests/data/flex/hostile/make_hostile.py [OUT]`` (default: this folder).
Every case is a copy of the real ``../ranks2`` folder (written by paddle 3.3.1) with one thing changed:
opcode-level cases edit the ``.metadata`` bytes (its FRAME removed, frames are optional in protocol 4);
record-level cases rebuild the ``Metadata`` with paddle's own dataclasses and ``paddle.save`` (the writer
``save_state_dict`` uses). Deterministic. Nothing here imports tietool.
"""

from __future__ import annotations

import dataclasses
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE = HERE.parent / "ranks2"
META = "0.metadata"
MARKER = "pwned_by_flex_metadata"  # what the payloads try to create in the working directory


def _s(text: str) -> bytes:
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _unframed(raw: bytes) -> bytes:
    """The pickle without its one FRAME opcode (PROTO 4, FRAME n, ...): same meaning, editable."""
    assert raw[:3] == b"\x80\x04\x95", raw[:3]
    n = struct.unpack("<Q", raw[3:11])[0]
    assert n == len(raw) - 11, "expected a single frame"
    return raw[:2] + raw[11:]


def _meta_raw() -> bytes:
    raw = _unframed((BASE / META).read_bytes())
    assert raw.endswith(b"uub."), raw[-4:]
    return raw


def _extra_state_entry(key: str, value: bytes) -> bytes:
    """The metadata with one more entry in the Metadata object's state dict (before its SETITEMS)."""
    raw = _meta_raw()
    return raw[:-3] + _s(key) + value + raw[-3:]


MOD = "paddle.distributed.flex_checkpoint.dcp.metadata"
SYSTEM = _s("os") + _s("system") + b"\x93" + _s(f"touch {MARKER}") + b"\x85R"  # os.system("touch ..")

# name -> the new .metadata bytes (opcode level)
RAW_CASES: dict[str, Callable[[], bytes]] = {
    # a global outside the three record classes, called by REDUCE: os.system("touch pwned...")
    "global_os_system": lambda: _extra_state_entry("evil", SYSTEM),
    # the classic payload alone: the whole file is os.system(...)
    "global_os_system_only": lambda: b"\x80\x04" + SYSTEM + b".",
    # another name of the same module (it imports dataclass), called
    "global_same_module_other_name": lambda: _extra_state_entry(
        "evil", _s(MOD) + _s("dataclass") + b"\x93" + b")R"
    ),
    # builtins.eval of a string
    "global_builtins_eval": lambda: _extra_state_entry(
        "evil", _s("builtins") + _s("eval") + b"\x93" + _s(f"open('{MARKER}', 'w')") + b"\x85R"
    ),
    # REDUCE of an allowed record class (paddle writes EMPTY_TUPLE NEWOBJ + BUILD, never a call)
    "reduce_allowed_class": lambda: _extra_state_entry(
        "evil", _s(MOD) + _s("LocalTensorMetadata") + b"\x93" + b"(K\x00\x85K\x03\x85" + _s("float32") + b"tR"
    ),
    # NEWOBJ with arguments (cls.__new__(cls, *args)): paddle's records always get ()
    "newobj_with_args": lambda: _extra_state_entry(
        "evil", _s(MOD) + _s("LocalTensorIndex") + b"\x93" + _s("x") + b"\x85\x81"
    ),
    # an extra field in a record's state (BUILD of {"evil": True, ...})
    "unknown_record_field": lambda: _replace_once(
        _meta_raw(), _s("global_offset"), _s("evil") + b"\x88" + _s("global_offset")
    ),
    # a string claiming 2**40 bytes (BINUNICODE8) in a 2 KB file
    "huge_string_length": lambda: _extra_state_entry("evil", b"\x8d" + struct.pack("<Q", 1 << 40) + b"abc"),
    # bytes claiming 2**62 bytes (BINBYTES8)
    "huge_bytes_length": lambda: _extra_state_entry("evil", b"\x8e" + struct.pack("<Q", 1 << 62) + b"abc"),
    # a FRAME claiming 2**60 bytes
    "huge_frame": lambda: b"\x80\x04\x95" + struct.pack("<Q", 1 << 60) + _meta_raw()[2:],
    # a memo reference far beyond anything stored (LONG_BINGET 2**32-1)
    "memo_get_missing": lambda: _extra_state_entry("evil", b"j" + struct.pack("<I", 0xFFFFFFFF)),
    # the metadata cut in the middle
    "truncated_metadata": lambda: (BASE / META).read_bytes()[: (BASE / META).stat().st_size // 2],
}


def _replace_once(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert old in raw
    return raw.replace(old, new, 1)


# ------------------------------------------------------------------ record level (paddle.save)
def _load_meta():  # noqa: ANN202 - paddle's Metadata
    import paddle

    return paddle.load(str(BASE / META))


def _save_meta(md: object, dest: Path) -> None:
    import paddle

    paddle.save(md, str(dest / META))


def _edit_slice(md, tensor: str, rank_file: str, **change):  # noqa: ANN001, ANN202
    """Change one slice (metadata entry and storage key) of ``tensor`` stored in ``rank_file``."""
    idx = next(i for i, f in md.storage_metadata.items() if i.tensor_key == tensor and f == rank_file)
    del md.storage_metadata[idx]
    index_fields = {f.name for f in dataclasses.fields(idx)}
    md.storage_metadata[
        dataclasses.replace(idx, **{k: v for k, v in change.items() if k in index_fields})
    ] = rank_file
    locs = md.state_dict_metadata[tensor]
    j = next(j for j, m in enumerate(locs) if m.global_offset == idx.global_offset)
    meta_fields = {f.name for f in dataclasses.fields(locs[j])}
    locs[j] = dataclasses.replace(locs[j], **{k: v for k, v in change.items() if k in meta_fields})


def _drop_slice(md, tensor: str, rank_file: str) -> None:  # noqa: ANN001
    idx = next(i for i, f in md.storage_metadata.items() if i.tensor_key == tensor and f == rank_file)
    del md.storage_metadata[idx]
    md.state_dict_metadata[tensor] = [
        m for m in md.state_dict_metadata[tensor] if m.global_offset != idx.global_offset
    ]


def _rename_file(md, tensor: str, new: str) -> None:  # noqa: ANN001
    idx = next(i for i in md.storage_metadata if i.tensor_key == tensor)
    md.storage_metadata[idx] = new


def _write_distcp_with(dest: Path, name: str, key: str, values) -> None:  # noqa: ANN001
    import paddle

    sd = paddle.load(str(dest / name))
    sd[key] = paddle.to_tensor(values)
    paddle.save(sd, str(dest / name))


def _duplicate_replicated(md, dest: Path, equal: bool) -> None:  # noqa: ANN001
    """rep.fp32 stored twice (replica 0 in 1_0.distcp, replica 1 in 0_0.distcp), as ``save_replicas``."""
    import paddle

    idx = next(i for i in md.storage_metadata if i.tensor_key == "rep.fp32")
    del md.storage_metadata[idx]
    md.storage_metadata[dataclasses.replace(idx, replica_id=0)] = "1_0.distcp"
    md.storage_metadata[dataclasses.replace(idx, replica_id=1)] = "0_0.distcp"
    vals = paddle.load(str(dest / "1_0.distcp"))["rep.fp32"].numpy().copy()
    if not equal:
        vals[2] += 1.0
    _write_distcp_with(dest, "0_0.distcp", "rep.fp32", vals)


RECORD_CASES: dict[str, Callable[[object, Path], None]] = {
    "gap_missing_slice": lambda md, d: _drop_slice(md, "rows.fp32", "1_0.distcp"),
    "overlap_disagreeing_replica": lambda md, d: _duplicate_replicated(md, d, equal=False),
    "overlap_equal_replica": lambda md, d: _duplicate_replicated(md, d, equal=True),
    "overlap_offsets": lambda md, d: _edit_slice(md, "rows.fp32", "1_0.distcp", global_offset=(2, 0)),
    "offset_out_of_range": lambda md, d: _edit_slice(md, "rows.fp32", "1_0.distcp", global_offset=(5, 0)),
    "negative_offset": lambda md, d: _edit_slice(md, "cols.fp32", "1_0.distcp", global_offset=(0, -4)),
    "local_shape_vs_array": lambda md, d: _edit_slice(md, "rows.fp32", "1_0.distcp", local_shape=(2, 4)),
    "dtype_vs_array": lambda md, d: _edit_slice(md, "rows.fp32", "1_0.distcp", dtype="bfloat16"),
    "huge_global_shape": lambda md, d: [
        _edit_slice(md, "rows.fp32", f, global_shape=(1 << 40, 1 << 40)) for f in ("0_0.distcp", "1_0.distcp")
    ],
    "wrong_type_offset": lambda md, d: _edit_slice(md, "rows.fp32", "1_0.distcp", global_offset="3,0"),
    "path_escape_parent": lambda md, d: _rename_file(md, "rows.fp32", "../ranks2/0_0.distcp"),
    "path_escape_absolute": lambda md, d: _rename_file(md, "rows.fp32", "/etc/passwd"),
    "key_missing_in_file": lambda md, d: _rename_file(md, "rep.fp32", "0_0.distcp"),
}


def _file_cases(dest: Path, name: str) -> bool:
    """Cases that change a .distcp file, not the metadata."""
    if name == "missing_distcp":
        (dest / "1_0.distcp").unlink()
    elif name == "truncated_distcp":
        p = dest / "1_0.distcp"
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif name == "distcp_os_system":
        raw = _unframed((BASE / "1_0.distcp").read_bytes())
        assert raw.endswith(b"uu."), raw[-3:]
        (dest / "1_0.distcp").write_bytes(raw[:-2] + _s("evil") + SYSTEM + raw[-2:])
    else:
        return False
    return True


FILE_CASES = ["missing_distcp", "truncated_distcp", "distcp_os_system"]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    for name in [*RAW_CASES, *RECORD_CASES, *FILE_CASES]:
        dest = out / name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(BASE, dest, ignore=shutil.ignore_patterns("oracle.*"))
        if name in RAW_CASES:
            (dest / META).write_bytes(RAW_CASES[name]())
        elif name in RECORD_CASES:
            md = _load_meta()
            RECORD_CASES[name](md, dest)
            _save_meta(md, dest)
        else:
            assert _file_cases(dest, name)
    print("wrote", len(RAW_CASES) + len(RECORD_CASES) + len(FILE_CASES), "cases under", out)


if __name__ == "__main__":
    main()
