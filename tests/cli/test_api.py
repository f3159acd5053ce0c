"""The Python API (``import tietool``): the operations as functions, the report written by the library, the
same errors (with the CLI's exit codes) as exceptions, and ``verify``'s verdict decided by the library —
including every vocabulary tensor and vocabulary-size key that a resize left at the old size."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from support import paths

import tietool
from tietool.surgery.io.checkpoint import Checkpoint

FIX = paths.CASES_DIR
CASES = paths.BUG_CASES_DIR


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    ck = Checkpoint.open(folder)
    return {n: ck.load(n) for n in ck.tensors}


def test_import_is_cheap_and_operations_load_on_use():
    code = (
        "import sys, tietool\n"
        "heavy = [m for m in ('numpy', 'paddle', 'tietool.surgery.ops') if m in sys.modules]\n"
        "assert callable(tietool.tie) and 'tietool.surgery.ops' in sys.modules\n"
        "print(heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_tie_untie_round_trip_through_the_api(tmp_path):
    src = FIX / "pf_llama_tied_fp32"  # PaddleFormers 1.2 wrote lm_head.weight although tied
    before = _digest(src)
    rep = tietool.tie(src, tmp_path / "tied")  # os.PathLike
    assert [d["name"] for d in rep["dropped"]] == ["lm_head.weight"]
    # the library stored the report it returned
    stored = json.loads((tmp_path / "tied" / "tietool-report.json").read_text())
    assert stored == json.loads(json.dumps(rep))
    assert "lm_head.weight" not in Checkpoint.open(tmp_path / "tied").tensors
    assert tietool.verify(src, tmp_path / "tied").exit_code == tietool.ExitCode.OK

    tietool.untie(str(tmp_path / "tied"), str(tmp_path / "untied"))  # str paths
    a, b = _tensors(src), _tensors(tmp_path / "untied")
    assert a.keys() == b.keys()
    for n in a:  # untie(tie(x)) == x, bit for bit (the head was equal to the embedding)
        assert a[n].dtype == b[n].dtype and a[n].tobytes() == b[n].tobytes(), n
    assert _digest(src) == before  # the input is never touched


def test_resize_up_then_down_is_the_identity_on_every_tensor(tmp_path):
    src = FIX / "pf_llama_untied_fp32"  # 100 rows, untied head
    up = tietool.resize(src, 101, tmp_path / "up", pad_to_multiple_of=8, init=tietool.Init.NORMAL, seed=3)
    assert up["resize"]["rows_after"] == 104
    assert Checkpoint.open(tmp_path / "up").config["vocab_size"] == 104
    down = tietool.resize(tmp_path / "up", 100, tmp_path / "down", force=True, init="zeros")
    assert down["resize"]["rows_after"] == 100
    a, b = _tensors(src), _tensors(tmp_path / "down")
    for n in a:
        assert a[n].tobytes() == b[n].tobytes(), n


def test_dry_run_writes_nothing_and_reports_the_plan(tmp_path):
    rep = tietool.resize(FIX / "pf_qwen2_tied", 200, tmp_path / "never", dry_run=True)
    assert rep["dry_run"] is True and rep["resize"]["rows_after"] == 200
    assert not (tmp_path / "never").exists()


def test_the_write_options_as_one_object_or_as_keywords(tmp_path):
    """``options=WriteOptions(...)`` (what the CLI passes) and the keyword arguments of the same names give
    the same plan; a keyword overrides the object's field; an option an operation does not take is refused
    by name (exit 2), an unknown keyword is a TypeError, as for any Python function."""
    from typing import get_type_hints

    from tietool.surgery.run import WriteArgs, WriteOptions

    assert set(get_type_hints(WriteArgs)) == {f for f in WriteOptions.__dataclass_fields__}
    src = FIX / "pf_qwen2_tied"
    by_object = tietool.resize(src, 200, tmp_path / "a", seed=1, options=WriteOptions(dry_run=True))
    by_keyword = tietool.resize(src, 200, tmp_path / "a", seed=1, dry_run=True)
    for rep in (by_object, by_keyword):
        assert rep["dry_run"] is True and rep["resize"]["rows_after"] == 200
    assert by_object["resize"] == by_keyword["resize"]
    assert not (tmp_path / "a").exists()
    with pytest.raises(tietool.UsageError, match="tie does not take keep_training_state"):
        tietool.tie(src, tmp_path / "b", keep_training_state=True)
    with pytest.raises(tietool.UsageError, match="convert does not take link"):
        tietool.convert(src, "paddlenlp", tmp_path / "c", options=WriteOptions(link=True))
    with pytest.raises(TypeError, match="no_such_option"):
        tietool.untie(src, tmp_path / "d", no_such_option=1)  # type: ignore[call-arg]
    rep = tietool.untie(src, tmp_path / "e", options=WriteOptions(dry_run=True), dry_run=False)
    assert rep["dry_run"] is False and (tmp_path / "e" / "tietool-report.json").is_file()
    assert not {p.name for p in (tmp_path).iterdir()} & {"a", "b", "c", "d"}


@pytest.mark.parametrize(
    "call, error, code",
    [
        (lambda t: tietool.inspect(t / "missing"), tietool.CheckpointError, 3),
        (lambda t: tietool.tie(FIX / "pf_llama_untied_fp32", t / "o"), tietool.ValuesDifferError, 5),
        (lambda t: tietool.resize(FIX / "pf_llama_untied_fp32", 50, t / "o"), tietool.RefusedError, 5),
        (lambda t: tietool.resize(FIX / "pf_llama_untied_fp32", 0, t / "o"), tietool.UsageError, 2),
        (lambda t: tietool.untie(FIX / "pf_llama_untied_fp32", FIX), tietool.UsageError, 2),
    ],
    ids=["missing-folder", "tie-values-differ", "trim-without-force", "vocab-zero", "out-is-parent-of-input"],
)
def test_errors_carry_the_cli_exit_code(tmp_path, call, error, code):
    before = _digest(FIX / "pf_llama_untied_fp32")
    with pytest.raises(error) as e:
        call(tmp_path)
    assert e.value.exit_code == code and int(e.value.exit_code) == code
    assert e.value.one_line() and "\n" not in e.value.one_line()
    assert not (tmp_path / "o").exists()
    assert _digest(FIX / "pf_llama_untied_fp32") == before


# ---------------------------------------------------------------- verify: left at the old size


def _put_back_old(out: Path, src: Path, name: str) -> None:
    """Replace tensor ``name`` in the output's single safetensors file by the input's (old-size) one."""
    f = out / "model.safetensors"
    tensors = load_file(f)
    tensors[name] = load_file(src / "model.safetensors")[name]
    save_file(tensors, f, metadata={"format": "pt"})


C01 = CASES / "c01_deepseek_mtp_embed_head_copies" / "ckpt"  # vocab 24, MTP layer 1 has embed + head


@pytest.mark.parametrize(
    "name", ["model.layers.1.embed_tokens.weight", "model.layers.1.shared_head.head.weight", "lm_head.weight"]
)
def test_verify_names_a_vocabulary_tensor_left_at_the_old_size(tmp_path, name):
    out = tmp_path / "out"
    tietool.resize(C01, 30, out, seed=1)
    assert tietool.verify(C01, out).explained
    _put_back_old(out, C01, name)
    res = tietool.verify(C01, out)
    assert res.exit_code == tietool.ExitCode.UNEXPLAINED
    assert any(
        u.startswith(f"{name} (") and "left at the old size: 24 → expected 30" in u for u in res.unexplained
    )


@pytest.mark.parametrize(
    "key, path",
    [("vocab_size", ["vocab_size"]), ("text_config.vocab_size", ["text_config", "vocab_size"])],
)
def test_verify_names_a_vocabulary_size_key_left_at_the_old_size(tmp_path, key, path):
    src = tmp_path / "src"
    src.mkdir()
    for f in C01.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    cfg["text_config"] = {"vocab_size": 24, "hidden_size": 8}
    (src / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    tietool.resize(src, 26, out, seed=1)
    assert tietool.verify(src, out).explained
    new = json.loads((out / "config.json").read_text())
    assert new["vocab_size"] == new["text_config"]["vocab_size"] == 26
    node = new
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = 24
    (out / "config.json").write_text(json.dumps(new))
    res = tietool.verify(src, out)
    assert (
        f"config.json: {key} left at the old size: 24 → expected 26, as the embedding went 24 → 26 rows"
        in (res.unexplained)
    )
    assert res.exit_code == 7


def test_verify_cli_exit_code_is_the_library_verdict(tmp_path):
    out = tmp_path / "out"
    tietool.resize(C01, 30, out, seed=1)
    _put_back_old(out, C01, "model.layers.1.embed_tokens.weight")
    r = subprocess.run(
        [sys.executable, "-m", "tietool", "verify", str(C01), str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    res = json.loads(r.stdout)
    assert r.returncode == res["exit_code"] == tietool.verify(C01, out).exit_code == 7
    assert res["explained"] is False


def test_typed_results(tmp_path):
    info = tietool.inspect(FIX / "pnlp_llama_untied")
    assert isinstance(info, tietool.Inspection) and isinstance(info, dict)
    assert (info.embedding, info.head, info.head_layout) == (
        "llama.embed_tokens.weight",
        "lm_head.weight",
        "hidden-vocab",
    )
    assert (info.vocab_rows, info.hidden_size, info.head_values) == (100, 16, "different")
    assert info.savings_bytes == 0 and info.tied_by_config is False
    rep = tietool.tie(FIX / "pf_llama_tied_fp32", tmp_path / "t")
    assert isinstance(rep, tietool.Report) and rep.operation == "tie" and rep.changed
    assert rep.bytes_before - rep.bytes_after == 100 * 16 * 4  # the [100, 16] float32 head
    assert rep.output == tmp_path / "t" and rep.backup is None and not rep.dry_run
    res = tietool.verify(FIX / "pf_llama_tied_fp32", tmp_path / "t")
    assert isinstance(res, tietool.Verification) and res.explained


def _drop_tensor(folder: Path, name: str) -> None:
    """Remove ``name`` from a single-shard safetensors checkpoint (file and index)."""
    (f,) = [p for p in folder.glob("*.safetensors")]
    tensors = load_file(f)
    del tensors[name]
    save_file(tensors, f, metadata={"format": "pt"})
    idx = next(folder.glob("*.index.json"), None)
    if idx is not None:
        doc = json.loads(idx.read_text())
        del doc["weight_map"][name]
        idx.write_text(json.dumps(doc))


@pytest.mark.parametrize("tied_after, explained", [(True, True), (False, False)])
def test_verify_explains_a_redundant_head_dropped_by_a_resize(tmp_path, tied_after, explained):
    """A tied checkpoint with the duplicate head PaddleFormers writes, resized, the head dropped: the loader
    rebuilds the head from the resized embedding, so the drop is explained — only while the output is tied."""
    src = FIX / "pf_llama_tied_fp32"
    out = tmp_path / "out"
    tietool.resize(src, 104, out, seed=0)
    if "lm_head.weight" in Checkpoint.open(out).tensors:  # (a resize that drops it itself needs no help)
        _drop_tensor(out, "lm_head.weight")
    cfg = json.loads((out / "config.json").read_text())
    cfg["tie_word_embeddings"] = tied_after
    (out / "config.json").write_text(json.dumps(cfg))
    res = tietool.verify(src, out)
    assert res.explained is explained, res.unexplained
    assert [d["equals_embedding"] for d in res.dropped] == [explained]


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda t: tietool.tie(FIX / "pf_llama_untied_fp32", t / "o", keep="HEAD"), "keep must be one of"),
        (
            lambda t: tietool.untie(FIX / "pf_llama_tied_fp32", t / "o", layout="bogus"),
            "layout must be one of",
        ),
        (
            lambda t: tietool.resize(FIX / "pf_llama_untied_fp32", True, t / "o"),
            "vocab_size must be an integer",
        ),
        (
            lambda t: tietool.resize(FIX / "pf_llama_untied_fp32", 120.0, t / "o"),
            "vocab_size must be an integer",
        ),
        (lambda t: tietool.inspect(5), "path must be a folder path"),
        (lambda t: tietool.tie(FIX / "pf_llama_tied_fp32", b"o"), "out must be a folder path"),
    ],
    ids=["keep", "layout", "bool-size", "float-size", "int-path", "bytes-out"],
)
def test_bad_arguments_are_usage_errors_in_python_words(tmp_path, call, words):
    """The API checks what the CLI's option parser checks, and words options as Python does (keep='head')."""
    with pytest.raises(tietool.UsageError) as e:
        call(tmp_path)
    assert e.value.exit_code == 2 and words in e.value.one_line() and "--" not in e.value.one_line()
    assert not (tmp_path / "o").exists()


def test_numpy_integers_and_default_folder(tmp_path, monkeypatch):
    rep = tietool.resize(FIX / "pf_llama_untied_fp32", np.int64(104), tmp_path / "o", seed=1)
    assert rep["resize"]["rows_after"] == 104
    monkeypatch.chdir(FIX / "pnlp_llama_untied")
    assert tietool.inspect().head == "lm_head.weight"  # the current folder, as the CLI


def test_in_place_refuses_a_backup_folder(tmp_path, monkeypatch):
    """A process that stood in the checkpoint during an in-place run is left in the backup (the old folder's
    inode): a second in-place run from there must not rewrite the backup."""
    ck = tmp_path / "ck"
    ck.mkdir()
    for f in (FIX / "pf_llama_untied_fp32").iterdir():
        (ck / f.name).write_bytes(f.read_bytes())
    monkeypatch.chdir(ck)
    first = tietool.resize(".", 104, seed=0)
    assert first.backup is not None and Path.cwd().resolve() == first.backup.resolve()
    backup_state = _digest(first.backup)
    with pytest.raises(tietool.RefusedError) as e:
        tietool.resize(".", 112, seed=0, backup=False)
    assert "backup" in e.value.one_line() and "cd " in e.value.one_line()
    assert _digest(first.backup) == backup_state
    assert Checkpoint.open(ck).config["vocab_size"] == 104


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda c: c.update(padded_vocab_size=7), "padded_vocab_size added"),
        (lambda c: c.update(text_config={"vocab_size": 100}), "text_config.vocab_size added"),
        (lambda c: c.update(hidden_act="gelu"), 'hidden_act changed ("silu" → "gelu")'),
    ],
    ids=["added-padded", "added-nested", "other-key"],
)
def test_verify_config_keys_a_tie_does_not_write(tmp_path, edit, words):
    out = tmp_path / "out"
    tietool.tie(FIX / "pf_llama_tied_fp32", out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    res = tietool.verify(FIX / "pf_llama_tied_fp32", out)
    assert not res.explained and any(words in u for u in res.unexplained), res.unexplained


def test_verify_a_resized_key_must_count_a_vocabulary(tmp_path):
    out = tmp_path / "out"
    tietool.resize(FIX / "pf_llama_untied_fp32", 110, out, seed=0)
    assert tietool.verify(FIX / "pf_llama_untied_fp32", out).explained
    cfg = json.loads((out / "config.json").read_text())
    cfg["vocab_size"] = 160
    (out / "config.json").write_text(json.dumps(cfg))
    res = tietool.verify(FIX / "pf_llama_untied_fp32", out)
    assert any("vocab_size changed (100 → 160), which counts no vocabulary" in u for u in res.unexplained)


@pytest.mark.parametrize("meta", [{"format": "zz"}, {"format": "pt", "lm_head.weight": "xx_head.weight"}])
def test_verify_checks_safetensors_metadata(tmp_path, meta):
    out = tmp_path / "out"
    tietool.tie(FIX / "pf_llama_tied_fp32", out)
    (st,) = out.glob("*.safetensors")
    save_file(load_file(st), st, metadata=meta)
    res = tietool.verify(FIX / "pf_llama_tied_fp32", out)
    assert not res.explained and any("__metadata__" in u for u in res.unexplained), res.unexplained


def test_output_error_docstring_names_only_its_own_causes(tmp_path):
    """``help(tietool.OutputError)`` must not send a user to catch it for an ``out`` that exists or is inside
    the input: those raise :class:`tietool.UsageError` (exit 2, README's table), as the calls below show."""
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_text("x")
    for out in (tmp_path / "o", FIX / "pf_llama_tied_fp32" / "sub"):
        with pytest.raises(tietool.UsageError) as e:
            tietool.tie(FIX / "pf_llama_tied_fp32", out)
        assert not isinstance(e.value, tietool.OutputError)
    doc = tietool.OutputError.__doc__ or ""
    causes = doc.split("(An")[0]  # what it lists before naming the UsageError ones
    assert "exists" not in causes and "inside the input" not in causes, doc
