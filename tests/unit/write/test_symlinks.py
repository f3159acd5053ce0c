"""Issue 11: a checkpoint whose files are symlinks (a Hugging Face cache snapshot, whose files are relative
links into ``../../blobs/``). ``--link``, plain ``--out`` and in place write real files (hard links to the
blobs, or copies), never symlinks, with the bytes the same command writes from a plain folder; the
in-place backup keeps its symlinks; ``verify`` passes."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import pytest
from support.paths import CASES_DIR as FIX
from typer.testing import CliRunner

from tietool.cli.app import app
from tietool.surgery.io.checkpoint import REPORT_NAME
from tietool.surgery.write import writer as write

CASE = "pf_llama_tied_sharded"  # 8 shards: the head's is removed by tie, the others linked or copied


def hf_snapshot(src: Path, cache: Path) -> Path:
    """A fake Hugging Face cache of ``src``: ``models--x/blobs/<sha256>`` holding every file, and
    ``models--x/snapshots/<rev>/<name>`` a relative symlink ``../../blobs/<sha256>``; returns the snapshot
    folder."""
    blobs, snap = cache / "models--x" / "blobs", cache / "models--x" / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        if not (blobs / digest).exists():
            shutil.copyfile(f, blobs / digest)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", digest))
    return snap


def cli(*args) -> None:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, (args, r.output)


def assert_real_files_as(out: Path, ref: Path) -> None:
    """Every file of ``out`` is a regular file (not a symlink) with the bytes of the same file in ``ref``
    (the report aside: it names the paths); both hold the same names."""
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in ref.iterdir())
    for name in names:
        p = out / name
        assert not p.is_symlink() and p.is_file(), p
        if name != REPORT_NAME:
            assert p.read_bytes() == (ref / name).read_bytes(), name


@pytest.fixture
def snapshot(tmp_path) -> Path:
    return hf_snapshot(FIX / CASE, tmp_path / "cache")


@pytest.mark.parametrize(
    "args",
    [["tie", "--link"], ["tie"], ["resize", "--vocab", "176", "--init", "zeros"]],
    ids=["tie-link", "tie", "resize"],
)
def test_out_from_a_snapshot_holds_real_files(tmp_path, snapshot, args):
    """``--out`` (with ``--link`` or not) from a snapshot of symlinks: real files, the bytes the same
    command writes from the plain folder, and ``verify`` exits 0."""
    ref, out = tmp_path / "ref", tmp_path / "out"
    cli(*args, FIX / CASE, "--out", ref, "-q")
    cli(*args, snapshot, "--out", out, "-q")
    assert_real_files_as(out, ref)
    if "--link" in args:  # the untouched shards are the blobs themselves
        blobs = {os.stat(p).st_ino for p in (snapshot.parent.parent / "blobs").iterdir()}
        assert any(os.stat(p).st_ino in blobs for p in out.glob("model-*.safetensors"))
    cli("verify", snapshot, out)


def test_link_across_devices_copies_the_file_behind_the_link(tmp_path, snapshot, monkeypatch):
    """Where the file behind a link cannot be hard-linked (another device: ``EXDEV``), it is copied."""

    def exdev(src, dst, *a, **k):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(write.os, "link", exdev)
    ref, out = tmp_path / "ref", tmp_path / "out"
    cli("tie", FIX / CASE, "--out", ref, "-q")
    cli("tie", snapshot, "--out", out, "--link", "-q")
    assert_real_files_as(out, ref)
    cli("verify", snapshot, out)


def test_in_place_on_a_snapshot(tmp_path, snapshot):
    """In place on a snapshot: the new version holds real files (hard links to the blobs, or copies) with
    the bytes ``tie --out`` writes; the backup is the old version, symlinks and all; ``verify`` of backup
    against new exits 0."""
    ref = tmp_path / "ref"
    cli("tie", FIX / CASE, "--out", ref, "-q")
    links_before = {p.name: os.readlink(p) for p in snapshot.iterdir()}
    cli("tie", snapshot, "-q")
    assert_real_files_as(snapshot, ref)
    (backup,) = [
        p for p in snapshot.parent.iterdir() if p.name.startswith(snapshot.name + ".tietool-backup-")
    ]
    assert {p.name: os.readlink(p) for p in backup.iterdir()} == links_before
    assert all((backup / name).is_file() for name in links_before)  # the links still resolve
    cli("verify", backup, snapshot)


# ------------------------------------------------------------------------------------------------ issue 18
# Symlinked subfolders are followed (an --out output holds a real folder of their files, the in-place new
# version keeps the same link), dangling links and loops are refused by name, and --out as a symbolic link
# is checked before any work (README "Symbolic links in a checkpoint").
import json  # noqa: E402

import tietool  # noqa: E402
from tietool.surgery.model.errors import CheckpointError, OutputError, UsageError  # noqa: E402


@pytest.fixture
def linked(tmp_path) -> Path:
    """The one-shard fixture with ``tokenizer -> ../shared_tokenizer`` (outside the folder, relative) and
    ``assets -> <absolute>/assets_store`` (two files, one in a subfolder)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIX / "pf_llama_tied_fp32", ckpt)
    (tmp_path / "shared_tokenizer").mkdir()
    (tmp_path / "shared_tokenizer" / "tokenizer_config.json").write_text('{"model_max_length": 8}')
    (tmp_path / "assets_store" / "img").mkdir(parents=True)
    (tmp_path / "assets_store" / "a.txt").write_text("a")
    (tmp_path / "assets_store" / "img" / "b.bin").write_bytes(b"\0\1")
    (ckpt / "tokenizer").symlink_to(Path("..", "shared_tokenizer"))
    (ckpt / "assets").symlink_to(tmp_path / "assets_store")
    return ckpt


LINKED_FILES = {"tokenizer/tokenizer_config.json", "assets/a.txt", "assets/img/b.bin"}


def _files_below(root: Path) -> dict[str, bytes]:
    """The files below ``root``'s ``tokenizer`` and ``assets`` (links followed), with their bytes."""
    out = {}
    for d, _, names in os.walk(root, followlinks=True):
        for n in names:
            p = Path(d, n)
            if p.relative_to(root).parts[0] in ("tokenizer", "assets"):
                out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


@pytest.mark.parametrize("link", [False, True], ids=["copy", "link"])
def test_out_holds_symlinked_folders_as_real_folders(tmp_path, linked, link):
    """``--out`` (copy or ``--link``): every file below a symlinked subfolder is in the output, under a real
    folder of the link's name, with its bytes; the report says each link was written as a folder."""
    out = tmp_path / "out"
    rep = tietool.tie(linked, out, link=link)
    got = _files_below(out)
    assert set(got) == LINKED_FILES
    assert got == _files_below(linked)
    assert not (out / "tokenizer").is_symlink() and not (out / "assets").is_symlink()
    facts = {f["link"]: f for f in rep["files"]["folder_links"]}
    assert facts["tokenizer"] == {
        "link": "tokenizer",
        "target": "../shared_tokenizer",
        "files": 1,
        "kept": False,
    }
    assert facts["assets"]["files"] == 2 and not facts["assets"]["kept"]
    assert tietool.verify(linked, out).explained


def test_convert_and_resize_carry_symlinked_folders(tmp_path, linked):
    for i, run in enumerate(
        [
            lambda o: tietool.convert(linked, "paddlenlp", o),
            lambda o: tietool.resize(linked, 128, o, init="zeros"),
        ]
    ):
        out = tmp_path / f"out{i}"
        run(out)
        assert _files_below(out) == _files_below(linked)


def test_in_place_without_backup_leaves_what_links_lead_to(tmp_path, linked):
    """``--no-backup`` deletes the old version: its folder links go, the folders behind them stay whole."""
    before = _files_below(linked)
    tietool.tie(linked, backup=False)
    assert _files_below(linked) == before
    assert (tmp_path / "shared_tokenizer" / "tokenizer_config.json").is_file()
    assert (tmp_path / "assets_store" / "img" / "b.bin").read_bytes() == b"\0\1"


def test_in_place_keeps_symlinked_folders_as_the_same_links(tmp_path, linked):
    """In place, the new version holds each symlinked subfolder as the same link (same text), so it leads
    where the old version's did; the backup keeps its links; nothing behind them changed."""
    before = _files_below(linked)
    rep = tietool.tie(linked)
    assert os.readlink(linked / "tokenizer") == os.path.join("..", "shared_tokenizer")
    assert os.readlink(linked / "assets") == str(tmp_path / "assets_store")
    assert _files_below(linked) == before
    assert {f["link"]: f["kept"] for f in rep["files"]["folder_links"]} == {"assets": True, "tokenizer": True}
    backup = Path(rep["in_place"]["backup"])
    assert os.readlink(backup / "tokenizer") == os.path.join("..", "shared_tokenizer")
    assert tietool.verify(backup, linked).explained


@pytest.mark.parametrize(
    ("rel", "text", "named"),
    [
        ("tokenizer", "../no_such_folder", "does not exist"),
        ("tokenizer.json", "gone.json", "does not exist"),
        ("loop", "loop", "symbolic link loop"),
        ("sub/up", "..", "symbolic link loop"),
        ("above", "../..", "symbolic link loop"),
    ],
    ids=["dangling-folder", "dangling-file", "self", "to-checkpoint", "above"],
)
def test_bad_links_are_refused_by_name(tmp_path, rel, text, named):
    """A dangling link or a loop anywhere below the folder: every command refuses it (exit 3), naming the
    link; nothing is dropped silently."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIX / "pf_llama_tied_fp32", ckpt)
    (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(text, ckpt / rel)
    for call in (lambda: tietool.inspect(ckpt), lambda: tietool.tie(ckpt, tmp_path / "out")):
        with pytest.raises(CheckpointError) as e:
            call()
        assert str(ckpt / rel) in str(e.value) and named in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_link_diamond_is_bounded(tmp_path, monkeypatch):
    """Folder links that multiply one tree are walked up to ``tree.MAX_ENTRIES`` entries, then refused."""
    from tietool.surgery.io import tree

    monkeypatch.setattr(tree, "MAX_ENTRIES", 50)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIX / "pf_llama_tied_fp32", ckpt)
    level = tmp_path / "l0"
    level.mkdir()
    (level / "f").write_text("x")
    for i in range(1, 8):  # l_i holds two links to l_{i-1}: 2**7 paths to f
        nxt = tmp_path / f"l{i}"
        nxt.mkdir()
        (nxt / "a").symlink_to(level)
        (nxt / "b").symlink_to(level)
        level = nxt
    (ckpt / "deep").symlink_to(level)
    with pytest.raises(CheckpointError, match="more than 50 files and folders"):
        tietool.inspect(ckpt)


def test_out_link_to_an_empty_folder_is_followed(tmp_path):
    """``--out`` a symbolic link to an empty folder: the output is written into that folder (the link
    stays); the temporary folder is made beside the folder, not beside the link."""
    target, out = tmp_path / "disk" / "out", tmp_path / "out"
    target.mkdir(parents=True)
    out.symlink_to(target)
    tietool.tie(FIX / "pf_llama_tied_fp32", out)
    assert out.is_symlink() and os.readlink(out) == str(target)
    assert json.loads((target / "config.json").read_text())["tie_word_embeddings"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "out"]


@pytest.mark.parametrize("kind", ["dangling", "loop", "dangling-above"])
def test_out_dangling_link_is_refused_before_any_work(tmp_path, monkeypatch, kind):
    """A dangling ``--out`` link, a link loop, or a dangling link above ``--out``: exit 6 naming the link,
    before anything is written (no temporary folder is made), for every writing command."""
    from tietool.surgery.write import writer as write

    def no_work(*a, **k):
        raise AssertionError("the output was started")

    monkeypatch.setattr(write, "publish", no_work)
    link = tmp_path / "link"
    if kind == "loop":
        link.symlink_to("link")
    else:
        link.symlink_to(tmp_path / "nowhere")
    out = link / "out" if kind == "dangling-above" else link
    src = FIX / "pf_llama_tied_fp32"
    for call in (
        lambda: tietool.tie(src, out),
        lambda: tietool.untie(src, out),
        lambda: tietool.resize(src, 128, out),
        lambda: tietool.convert(src, "paddlenlp", out),
    ):
        with pytest.raises(OutputError) as e:
            call()
        assert e.value.exit_code == 6 and str(link) in str(e.value) and "symbolic link" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"]


def test_out_link_to_a_file_is_a_file(tmp_path):
    (tmp_path / "f").write_text("mine")
    (tmp_path / "out").symlink_to(tmp_path / "f")
    with pytest.raises(UsageError, match="existing file"):
        tietool.tie(FIX / "pf_llama_tied_fp32", tmp_path / "out")
    assert (tmp_path / "f").read_text() == "mine"
