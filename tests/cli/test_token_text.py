"""``add-tokens`` with unusual token text (issue 21, a loose end of issue 20): a lone surrogate (what Python
makes of a non-UTF-8 byte in an argument; it crashed with a TypeError before) and a token over 10,000
characters are refused in one line naming the token (exit 2, nothing written); a NUL character and a
10,000-character token are written and load back in ``tokenizers`` as one token each (measured: it accepts
both)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support import paths
from support.resize_support import run_cli

from tietool.surgery import ops
from tietool.surgery.model.errors import UsageError

SRC = paths.SAMPLES / "pf_llama_with_tokenizer"


def test_a_lone_surrogate_is_refused_by_name(tmp_path):
    """The API and the CLI (the argument given as bytes that are not UTF-8) refuse it, exit 2, naming the
    token and the surrogate; no output folder."""
    with pytest.raises(UsageError, match=r"'<a\\udcffb>' is not valid Unicode text: character 2"):
        ops.add_tokens(SRC, ["<a\udcffb>"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    long = "<" + "x" * 100 + "\udc80>"
    with pytest.raises(UsageError, match=r"'<x{39}\.\.\.' is not valid Unicode text: character 101"):
        ops.add_tokens(SRC, [long], tmp_path / "out")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cp = subprocess.run(
        [sys.executable, "-m", "tietool", "add-tokens", str(SRC), b"<a\xffb>", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert cp.returncode == 2, cp.stderr
    assert "lone surrogate" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert not (tmp_path / "o").exists()


def test_a_token_longer_than_the_limit_is_refused(tmp_path):
    """10,001 characters: exit 2, one line naming the token (truncated) and the limit (10000); nothing
    written. The limit's measurement: surgery.io.tokenizer_edit.MAX_TOKEN_CHARS."""
    (tmp_path / "f.txt").write_text("<" + "w" * 10_000 + "\n", encoding="utf-8")
    run = run_cli(["add-tokens", str(SRC), "--file", str(tmp_path / "f.txt"), "--out", str(tmp_path / "o")])
    assert run.rc == 2, run.stderr
    assert "'<" + "w" * 39 + "...' has 10001 characters" in run.stderr and "(10000)" in run.stderr
    assert not (tmp_path / "o").exists()


def test_nul_and_a_long_token_load_back_in_tokenizers(tmp_path):
    """A token with NUL and one of 10,000 characters are added; tokenizers loads the written tokenizer.json
    and encodes each text as its one new id; verify explains the output."""
    from tokenizers import Tokenizer

    toks = ["<a\x00b>", "z" * 10_000]
    (tmp_path / "f.txt").write_text("\n".join(toks) + "\n", encoding="utf-8")
    ck = tmp_path / "ck"
    shutil.copytree(SRC, ck)
    assert (
        run_cli(
            ["add-tokens", str(ck), "--file", str(tmp_path / "f.txt"), "--out", str(tmp_path / "o"), "-q"]
        ).rc
        == 0
    )
    t = Tokenizer.from_file(str(tmp_path / "o" / "tokenizer.json"))
    assert [t.encode(s, add_special_tokens=False).ids for s in toks] == [[304], [305]]
    assert run_cli(["verify", str(ck), str(tmp_path / "o")]).rc == 0
