"""Every file a write publishes is read back: a fault injected into each writer (a write cut 4 bytes short,
one byte changed) stops the run with exit 6 and nothing published, on the ordinary path and on the flex /
training-state path, in place and with ``--out``. And a kept file that is a symbolic link leading outside
the checkpoint is the file behind it in the output, on every path (README, "Symbolic links in a
checkpoint").

The faults are injected by wrapping the function that writes each kind of file (the real writer runs, then
its file is damaged) at the place its caller looks it up: ``safetensors_io.write_rows`` (weight shards),
``pdparams.write_file`` (``.pdparams`` and ``.distcp``), ``pdparams.write_optimizer_file``
(``optimizer.pdopt``), ``flex_write.write_metadata`` (a flex ``.metadata``), ``edits.write_bytes``
(config.json and tokenizer files) and ``copy.copy_range`` (a whole-file copy). The changed byte is byte 10:
inside the safetensors header, the pickle's first records, the JSON text. (The read-back of weight files
reads headers only, README "Layout": a changed byte in tensor data is not what it looks for.)
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import flex_support as fx
from support import paths
from typer.testing import CliRunner

from tietool.cli.app import app
from tietool.surgery.io import flex_write, pdparams, safetensors_io
from tietool.surgery.write import copy as copy_mod
from tietool.surgery.write import edits

SAMPLES = paths.SAMPLES
TRAINER = fx.DATA / "trainer_1rank"


def _tree(folder: Path) -> dict[str, str]:
    """Every entry below ``folder``: a file by its sha256, a symbolic link by its target."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _damage(path: Path, fault: str) -> None:
    """Cut ``path`` 4 bytes short, or change its byte 10."""
    data = bytearray(path.read_bytes())
    if fault == "short":
        path.write_bytes(bytes(data[:-4]))
    else:
        data[10] ^= 0x20
        path.write_bytes(bytes(data))


def _wrapped(real: Callable[..., Any], fault: str, hit: Callable[[Path], bool], seen: list[str]) -> Any:
    """``real`` (whose first argument is the path it writes), then ``path`` damaged when ``hit(path)``."""

    def writer(path: Any, *args: Any, **kw: Any) -> Any:
        got = real(path, *args, **kw)
        if hit(Path(path)):
            seen.append(Path(path).name)
            _damage(Path(path), fault)
        return got

    return writer


def _short_copies(seen: list[str]) -> Callable[..., Any]:
    """``copy_range`` that leaves out the last 4 bytes of a whole-file copy of a tokenizer file."""
    real = copy_mod.copy_range

    def copy_range(f: Any, src: Path, offset: int, nbytes: int, **kw: Any) -> Any:
        if Path(src).name.startswith("tokenizer") and offset == 0:
            seen.append(Path(src).name)
            nbytes -= 4
        return real(f, src, offset, nbytes, **kw)

    return copy_range


def _with_optimizer(ck: Path) -> None:
    """An AdamW ``optimizer.pdopt`` for ``ck``'s parameters (random moments), as Paddle saves it."""
    infos, extras, _ = pdparams.read_header(ck / "model_state.pdparams", "model_state.pdparams")
    shapes = {t.name: t.shape for t in infos}
    rng = np.random.default_rng(0)
    rows = []
    for name, pname in extras["StructuredToParameterName@@"].items():
        for acc in ("moment1", "moment2"):
            a = rng.standard_normal(shapes[name]).astype(np.float32)
            rows.append((f"{pname}_{acc}_0", "float32", a.shape, safetensors_io.Source(array=a), None, False))
    table = {"LR_Scheduler": {"last_epoch": 1}, "StructuredToParameterName@@": {r[0]: r[0] for r in rows}}
    pdparams.write_file(ck / "optimizer.pdopt", rows, table)


def _ordinary(name: str, tmp: Path) -> Path:
    ck = tmp / "ck"
    shutil.copytree(SAMPLES / name, ck)
    return ck


def _trainer(tmp: Path, tokenizer_link: bool = False) -> Path:
    """A copy of trainer_1rank (its checkpoint-2 with base's config.json in the folder above); with
    ``tokenizer_link``, its ``tokenizer.model`` a relative symbolic link to ``../base/tokenizer.model``, as
    people keep one tokenizer for every checkpoint of a run."""
    root = tmp / "run"
    shutil.copytree(TRAINER / "checkpoint-2", root / "checkpoint-2")
    shutil.copytree(TRAINER / "base", root / "base")
    shutil.copy2(TRAINER / "base" / "config.json", root / "config.json")
    if tokenizer_link:
        (root / "checkpoint-2" / "tokenizer.model").unlink()
        (root / "checkpoint-2" / "tokenizer.model").symlink_to("../base/tokenizer.model")
    return root / "checkpoint-2"


# (writer, how its file is recognised, the input, the command) per kind of file written
ORDINARY = {
    "safetensors": (
        (safetensors_io, "write_rows"),
        lambda p: p.suffix == ".safetensors",
        "pf_llama_with_tokenizer",
        ["resize", "--vocab", "330", "--seed", "1"],
    ),
    "pdparams": (
        (pdparams, "write_file"),
        lambda p: p.suffix == ".pdparams",
        "pnlp_llama_untied",
        ["resize", "--vocab", "104", "--seed", "1"],
    ),
    "pdopt": (
        (pdparams, "write_optimizer_file"),
        lambda p: p.suffix == ".pdopt",
        "pnlp_llama_untied",
        ["resize", "--vocab", "104", "--seed", "1", "--keep-training-state"],
    ),
    "config": (
        (edits, "write_bytes"),
        lambda p: p.name == "config.json",
        "pnlp_llama_untied",
        ["resize", "--vocab", "104", "--seed", "1"],
    ),
    "tokenizer": (
        (edits, "write_bytes"),
        lambda p: p.name == "tokenizer.json",
        "pf_llama_with_tokenizer",
        ["add-tokens", "<tool_x>", "--seed", "1"],
    ),
}
FLEX = {
    "distcp": ((pdparams, "write_file"), lambda p: p.suffix == ".distcp", ["resize", "--vocab", "256"]),
    "metadata": (
        (flex_write, "write_metadata"),
        lambda p: p.suffix == ".metadata",
        ["resize", "--vocab", "256"],
    ),
    "config": ((edits, "write_bytes"), lambda p: p.name == "config.json", ["resize", "--vocab", "256"]),
    "tokenizer": (
        (edits, "write_bytes"),
        lambda p: p.name == "tokenizer.json",
        ["add-tokens", "<tool_x>"],
    ),
}


def _run(ck: Path, command: list[str], out: Path | None, extra: list[str]) -> tuple[int, str]:
    argv = [command[0], str(ck), *command[1:], *extra]
    if out is not None:
        argv += ["--out", str(out)]
    r = CliRunner().invoke(app, argv)
    return r.exit_code, r.output


def _assert_nothing_published(ck: Path, before: dict[str, str], out: Path | None, code: int, text: str):
    assert code == 6, text
    assert "does not read back as planned" in text, text
    assert _tree(ck) == before
    if out is not None:
        assert not out.exists()
    assert sorted(p.name for p in ck.parent.iterdir()) == sorted(
        n for n in {ck.name, "base", "config.json"} if (ck.parent / n).exists()
    )


@pytest.mark.parametrize("fault", ["short", "flip"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("kind", sorted(ORDINARY))
def test_ordinary_write_fault_is_exit_6(tmp_path, monkeypatch, kind, in_place, fault):
    (module, attr), hit, sample, command = ORDINARY[kind]
    ck = _ordinary(sample, tmp_path)
    extra = []
    if kind == "pdopt":
        _with_optimizer(ck)
    before = _tree(ck)
    seen: list[str] = []
    monkeypatch.setattr(module, attr, _wrapped(getattr(module, attr), fault, hit, seen))
    out = None if in_place else tmp_path / "out"
    code, text = _run(ck, command, out, extra)
    assert seen, f"no {kind} file was written"
    _assert_nothing_published(ck, before, out, code, text)


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_short_copy_is_exit_6(tmp_path, monkeypatch, in_place):
    """A whole-file copy (a carried tokenizer file) cut short is caught too."""
    ck = _ordinary("pf_llama_with_tokenizer", tmp_path)
    before = _tree(ck)
    seen: list[str] = []
    monkeypatch.setattr(copy_mod, "copy_range", _short_copies(seen))
    out = None if in_place else tmp_path / "out"
    code, text = _run(ck, ["resize", "--vocab", "330", "--seed", "1"], out, [])
    if in_place:  # the new version hard-links what it keeps: nothing is copied, nothing to cut
        assert code == 0 and not seen, text
        return
    assert seen
    _assert_nothing_published(ck, before, out, code, text)


@pytest.mark.skipif(not TRAINER.is_dir(), reason="tests/data/flex not present")
@pytest.mark.parametrize("fault", ["short", "flip"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("kind", sorted(FLEX))
def test_flex_write_fault_is_exit_6(tmp_path, monkeypatch, kind, in_place, fault):
    (module, attr), hit, command = FLEX[kind]
    ck = _trainer(tmp_path)
    before = _tree(ck)
    seen: list[str] = []
    monkeypatch.setattr(module, attr, _wrapped(getattr(module, attr), fault, hit, seen))
    out = None if in_place else tmp_path / "out"
    code, text = _run(ck, command, out, ["--keep-training-state", "--seed", "1"])
    assert seen, f"no {kind} file was written"
    _assert_nothing_published(ck, before, out, code, text)


@pytest.mark.skipif(not TRAINER.is_dir(), reason="tests/data/flex not present")
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_flex_edit_keeps_no_link_that_leads_outside(tmp_path, in_place):
    """``resize --keep-training-state`` of a Trainer checkpoint whose ``tokenizer.model`` is a relative
    symbolic link out of the folder (``../base/tokenizer.model``): the output holds the file behind it, as
    the ordinary path does; before, the flex path linked the link, which dangled in ``--out``."""
    ck = _trainer(tmp_path, tokenizer_link=True)
    out = None if in_place else tmp_path / "out"
    code, text = _run(ck, ["resize", "--vocab", "256"], out, ["--keep-training-state", "--seed", "1"])
    assert code == 0, text
    got = (out or ck) / "tokenizer.model"
    assert not got.is_symlink()
    assert got.read_bytes() == (TRAINER / "base" / "tokenizer.model").read_bytes()


@pytest.mark.parametrize("link", [False, True], ids=["copy", "link"])
def test_ordinary_write_keeps_no_link_that_leads_outside(tmp_path, link):
    """The same rule on the ordinary path: a carried tokenizer file that is a relative link out of the
    folder is the file behind it in ``--out`` (copied, or hard-linked with ``--link``)."""
    ck = _ordinary("pf_llama_with_tokenizer", tmp_path)
    shutil.move(ck / "tokenizer_config.json", tmp_path / "shared_tokenizer_config.json")
    (ck / "tokenizer_config.json").symlink_to("../shared_tokenizer_config.json")
    out = tmp_path / "out"
    code, text = _run(ck, ["resize", "--vocab", "330", "--seed", "1"], out, ["--link"] if link else [])
    assert code == 0, text
    got = out / "tokenizer_config.json"
    assert not got.is_symlink()
    assert got.read_bytes() == (tmp_path / "shared_tokenizer_config.json").read_bytes()
