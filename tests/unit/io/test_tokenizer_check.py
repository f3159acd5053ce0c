"""The checks of tokenizer files before a tokenizer library reads them (surgery/io/tokenizer_check.py), on
the trained tokenizers of tests/data/tokenizers: each refusal is a CheckpointError (exit 3) naming the
file, the id or piece and the limit; what a library writes to fd 2 meanwhile never reaches the terminal.
The CLI runs of the same inputs are the ``tok-`` kinds of the hostile corpus (support/hostile/tokfiles.py).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sentencepiece import sentencepiece_model_pb2 as pb
from support.paths import DATA

from tietool.surgery.io.tokenizer import GAP_LIMIT, tokenizer_set
from tietool.surgery.io.tokenizer_check import MAX_TOKEN_CHARS
from tietool.surgery.io.tokenizer_edit import add_tokens_edit
from tietool.surgery.model.errors import CheckpointError, ExitCode

TOK = DATA / "tokenizers"


def _copy(name: str, tmp: Path) -> Path:
    return Path(shutil.copytree(TOK / name, tmp / name))


def _sp(folder: Path, fn) -> None:
    m = pb.ModelProto()
    m.ParseFromString((folder / "tokenizer.model").read_bytes())
    fn(m)
    (folder / "tokenizer.model").write_bytes(m.SerializeToString())


def test_quiet_stderr_silences_fd2_and_restores_it() -> None:
    code = (
        "import os\nfrom tietool.surgery.io.tokenizer import quiet_stderr\n"
        "with quiet_stderr():\n    os.write(2, b'library log\\n')\nos.write(2, b'after\\n')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr == "after\n"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: setattr(m.pieces[10], "piece", ""), "tokenizer.model piece 10 is empty"),
        (
            lambda m: setattr(m.pieces[10], "score", math.nan),
            "tokenizer.model piece 10 're' has the score nan",
        ),
        (lambda m: setattr(m.pieces[0], "type", 1), "tokenizer.model has 0 unknown (unk) pieces, not one"),
        (
            lambda m: setattr(m.normalizer_spec, "precompiled_charsmap", b"garbage!" * 3),
            "tokenizer.model is refused by sentencepiece (Trie data size exceeds the input blob size.)",
        ),
    ],
)
def test_sentencepiece_refusals(tmp_path: Path, edit, message: str) -> None:
    folder = _copy("sp_bpe", tmp_path)
    _sp(folder, edit)
    with pytest.raises(CheckpointError) as e:
        add_tokens_edit(folder, ["zqx"])
    assert e.value.exit_code == ExitCode.CHECKPOINT
    assert str(e.value).startswith(f"{folder / 'tokenizer.model'}: {message} — "), str(e.value)


def test_tokenizer_json_id_beyond_its_size(tmp_path: Path) -> None:
    folder = _copy("bytelevel_bpe", tmp_path)
    d = json.loads((folder / "tokenizer.json").read_text())
    d["model"]["vocab"]["zz"] = 2_000_000_000  # tokenizers 0.22.2 aborted the process (SIGABRT) on this
    (folder / "tokenizer.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="model.vocab has the id 2000000000, beyond its own 305 tokens"):
        add_tokens_edit(folder, ["zqx"])
    ts = tokenizer_set(folder)  # inspect's read: the file named, counted in no length
    assert [f.name for f in ts.beyond] == ["tokenizer.json"]
    assert f"at most {GAP_LIMIT} unnamed" in (ts.beyond[0].note or "")
    assert ts.length == 304  # tokenizer_config.json's added_tokens_decoder (ids 300..303) still counts


def test_added_token_of_the_input_over_the_limit(tmp_path: Path) -> None:
    folder = _copy("bytelevel_bpe", tmp_path)
    d = json.loads((folder / "tokenizer.json").read_text())
    d["added_tokens"].append({"id": 304, "content": "y" * 30_000, "special": False, "normalized": True})
    (folder / "tokenizer.json").write_text(json.dumps(d))
    with pytest.raises(
        CheckpointError, match=f"of 30000 characters, more than tietool reads \\({MAX_TOKEN_CHARS}"
    ):
        add_tokens_edit(folder, ["zqx"])


def test_added_tokens_json_id_bounded_by_base_and_count(tmp_path: Path) -> None:
    folder = _copy("wordpiece", tmp_path)
    (folder / "added_tokens.json").write_text(json.dumps({"<big>": 10**9}))
    limit = 234 + 1 + GAP_LIMIT
    with pytest.raises(CheckpointError, match=f"added-token id 1000000000, beyond {limit}"):
        add_tokens_edit(folder, ["zqx"])


def test_text_files_must_be_utf8(tmp_path: Path) -> None:
    folder = _copy("gpt2_bpe", tmp_path)
    with open(folder / "merges.txt", "ab") as f:
        f.write(b"\xff \xfe\n")
    with pytest.raises(
        CheckpointError, match=r"merges.txt is not UTF-8 text \(byte \d+: invalid start byte\)"
    ):
        add_tokens_edit(folder, ["zqx"])
