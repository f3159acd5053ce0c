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
from tietool.surgery import write
from tietool.surgery.checkpoint import REPORT_NAME

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
