"""Defects found by using the vocabulary toolbox as a new user would (docs/guides/vocabulary.md, diff.md,
verify.md on the samples and on the real tokenizers of ``tests/data``), each fixed with its test.

The checkpoints are the weights of ``sample_checkpoints/pf_llama_with_tokenizer`` (320 rows) with another
real tokenizer folder of ``tests/data`` copied in, and ``config.json``'s special ids set to that tokenizer's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import paths
from support.resize_support import run_cli

SAMPLE = paths.SAMPLES / "pf_llama_with_tokenizer"
DATA = paths.REPO / "tests" / "data"
CORPUS = DATA / "tokenizers" / "corpus.txt"


def _model_with(tokenizer: Path, dst: Path, **special_ids: int | None) -> Path:
    """The sample's weights with the files of ``tokenizer``; config.json's bos/eos/pad ids set."""
    dst.mkdir(parents=True)
    for f in SAMPLE.iterdir():
        if f.name == "config.json" or ".safetensors" in f.name:
            shutil.copy2(f, dst / f.name)
    for f in tokenizer.iterdir():
        shutil.copy2(f, dst / f.name)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update({"bos_token_id": None, "eos_token_id": None, "pad_token_id": None})
    cfg.update(special_ids)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def test_keep_special_keeps_the_tokens_a_paddlenlp_tokenizer_config_names(tmp_path):
    """(Fixed: ``prune --keep-ids K --keep-special`` of a PaddleNLP ERNIE folder (``vocab.txt``, a
    ``tokenizer_config.json`` naming ``"unk_token": "[UNK]"`` without ``added_tokens_decoder``) was refused
    "unk_token = '[UNK]' is not kept — keep its id (or pass --keep-special)" although --keep-special was
    passed.) The five special lines of vocab.txt are kept with the listed ids, and the pruned vocab.txt is
    the old lines at the kept ids; verify explains the output."""
    ck = _model_with(DATA / "pnlp_tokenizers" / "ernie_wordpiece", tmp_path / "ck", pad_token_id=0)
    (tmp_path / "keep").write_text("10\n11\n12\n")
    out = tmp_path / "out"
    argv = ["prune", str(ck), "--keep-ids", str(tmp_path / "keep"), "--keep-special"]
    run = run_cli([*argv, "--out", str(out), "--json"])
    assert run.rc == 0, run.stderr
    keep = sorted(map(int, json.loads(run.stdout)["prune"]["id_map"]))
    assert keep == [0, 1, 2, 3, 4, 10, 11, 12]
    old = (ck / "vocab.txt").read_text(encoding="utf-8").splitlines()
    new = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert new == [old[i] for i in keep]
    assert new[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert run_cli(["verify", str(ck), str(out), "-q"]).rc == 0


def test_keep_corpus_with_keep_special_keeps_a_gpt_eos_named_by_string(tmp_path):
    """(Fixed: ``prune --keep-corpus C --keep-special`` of a PaddleNLP GPT folder (``vocab.json`` +
    ``merges.txt``, ``eos_token: "<|endoftext|>"`` by string, id 0) was refused "eos_token = '<|endoftext|>'
    is not kept".) ``<|endoftext|>`` (id 0) is kept with the corpus's tokens, and GPT-2's split of the
    corpus with the pruned files is the old split renumbered."""
    from tokenizers import ByteLevelBPETokenizer

    ck = _model_with(DATA / "pnlp_tokenizers" / "gpt_bpe", tmp_path / "ck")
    lines = CORPUS.read_text(encoding="utf-8").splitlines()[:5]
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["prune", str(ck), "--keep-corpus", str(tmp_path / "corpus.txt"), "--keep-special"]
    run = run_cli([*argv, "--out", str(out), "--json"])
    assert run.rc == 0, run.stderr
    id_map = {int(k): v for k, v in json.loads(run.stdout)["prune"]["id_map"].items()}
    assert id_map[0] == 0
    assert json.loads((out / "vocab.json").read_text(encoding="utf-8"))["<|endoftext|>"] == 0
    old, new = (ByteLevelBPETokenizer(str(d / "vocab.json"), str(d / "merges.txt")) for d in (ck, out))
    assert [e.ids for e in new.encode_batch(lines)] == [
        [id_map[i] for i in e.ids] for e in old.encode_batch(lines)
    ]
    assert run_cli(["verify", str(ck), str(out), "-q"]).rc == 0


def test_a_unigram_model_left_with_no_normal_piece_is_refused_not_an_internal_error(tmp_path):
    """(Fixed: ``prune --keep-ids K --keep-special`` of a SentencePiece Unigram folder whose keep-list holds
    only ``<unk>`` / ``<s>`` / ``</s>`` was exit 70, "internal error: RuntimeError: INTERNAL: no pieces are
    loaded.", from sentencepiece loading the pruned model.) Exit 5 naming tokenizer.model and the fix,
    nothing written; one normal piece more and sentencepiece loads the pruned model (4 pieces)."""
    import sentencepiece as spm

    ck = _model_with(DATA / "tokenizers" / "sp_unigram", tmp_path / "ck", bos_token_id=1, eos_token_id=2)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # sentencepiece alone reads the model
        (ck / name).unlink()
    (tmp_path / "keep").write_text("0\n")
    out = tmp_path / "out"
    argv = ["prune", str(ck), "--keep-ids", str(tmp_path / "keep"), "--keep-special", "--out", str(out)]
    run = run_cli(argv)
    assert run.rc == 5, run.stderr
    assert run.stderr.startswith(f"tietool: error: {ck / 'tokenizer.model'}: "), run.stderr
    assert "keep-list" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not out.exists()
    (tmp_path / "keep").write_text("0\n3\n")
    run = run_cli(argv)
    assert run.rc == 0, run.stderr
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    old = spm.SentencePieceProcessor(model_file=str(ck / "tokenizer.model"))
    assert [sp.id_to_piece(i) for i in range(sp.get_piece_size())] == [old.id_to_piece(i) for i in range(4)]


def _hashes(folder: Path) -> dict[str, str]:
    import hashlib

    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_omp_k_below_one_is_a_usage_error(tmp_path):
    """(Fixed: ``transplant --init omp --k 0`` (or ``--k -3``) was exit 5, "refused ... — pass --k 16 or
    less", a fix that does not fix it.) Exit 2, one line naming --k and the lowest value, input untouched."""
    before = _hashes(SAMPLE)
    for k in ("0", "-3"):
        argv = ["transplant", str(SAMPLE), "--tokenizer", str(SAMPLE), "--init", "omp"]
        run = run_cli([*argv, "--donor-model", str(SAMPLE), "--k", k, "--out", str(tmp_path / k)])
        assert run.rc == 2, run.stderr
        assert run.stderr.strip() == (
            f"tietool: error: --k {k}: omp makes each new token of at least one shared token — "
            "pass --k 1 or more (default 64)"
        )
        assert not (tmp_path / k).exists()
    assert _hashes(SAMPLE) == before


def test_an_empty_keep_corpus_is_named(tmp_path):
    """(Fixed: ``prune --keep-corpus EMPTY`` said "the keep-list is empty ... — list the ids to keep
    (--keep-ids)", naming neither the corpus nor a fix for it.) An empty or blank-lines-only corpus is exit
    2 naming the file."""
    for name, text in (("empty.txt", ""), ("blank.txt", "\n  \n\n")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        run = run_cli(
            ["prune", str(SAMPLE), "--keep-corpus", str(tmp_path / name), "--out", str(tmp_path / "o")]
        )
        assert run.rc == 2, run.stderr
        assert run.stderr.startswith(f"tietool: error: {tmp_path / name}: the keep-corpus "), run.stderr
        assert "has no text" in run.stderr and len(run.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "o").exists()


def test_a_keep_list_naming_an_id_twice_is_said_and_kept_once(tmp_path):
    """(Fixed: duplicate ids of a keep-list were deduplicated without a word.) The run notes how many ids
    were named more than once and the first of them; the output equals the run of the list without them
    (the same tensors, bit for bit)."""
    (tmp_path / "dup.json").write_text("[0, 1, 7, 1, 2, 7, 7]")
    (tmp_path / "once.json").write_text("[0, 1, 2, 7]")
    runs = {}
    for name in ("dup", "once"):
        argv = ["prune", str(SAMPLE), "--keep-ids", str(tmp_path / f"{name}.json"), "--keep-special"]
        runs[name] = run_cli([*argv, "--out", str(tmp_path / name)])
        assert runs[name].rc == 0, runs[name].stderr
    said = [x for x in (runs["dup"].stdout + runs["dup"].stderr).splitlines() if "more than once" in x]
    assert said == ["note: the keep-list names 3 id(s) more than once (e.g. 1): each kept once"], said
    assert "more than once" not in runs["once"].stdout + runs["once"].stderr
    weights = sorted(p.name for p in (tmp_path / "once").glob("*.safetensors"))
    assert weights and all(
        (tmp_path / "dup" / w).read_bytes() == (tmp_path / "once" / w).read_bytes() for w in weights
    )


def test_a_unigram_model_transformers_and_paddleformers_convert_is_refused(tmp_path):
    """``prune --keep-corpus`` of a SentencePiece Unigram folder with a ``tokenizer_config.json`` (so
    transformers and PaddleFormers load it, as ``LlamaTokenizer``, through BPE merges built from the piece
    scores) and no ``tokenizer.json``: the corpus's sentencepiece pieces leave out the pieces their split
    needs ('The' became ``<unk>`` under PaddleFormers); exit 5 naming the model, nothing written, input
    untouched. The split apart is proven by ``test_prune_loader_fact[sentencepiece-Unigram-*]``."""
    ck = _model_with(DATA / "tokenizers" / "sp_unigram", tmp_path / "ck", bos_token_id=1, eos_token_id=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox\n")
    before = _hashes(ck)
    out = tmp_path / "out"
    run = run_cli(["prune", str(ck), "--keep-corpus", str(corpus), "--keep-special", "--out", str(out)])
    assert run.rc == 5, run.stderr
    assert run.stderr.startswith(f"tietool: error: {ck / 'tokenizer.model'}: "), run.stderr
    assert "transformers and paddleformers" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not out.exists() and _hashes(ck) == before


def test_add_tokens_where_tokenizer_json_lacks_an_added_token_is_refused(tmp_path):
    """Case b20: tokenizer.json holds 16 tokens, added_tokens.json adds ``<pad>`` = 16 (17 in all). A new
    token is id 17 by the files together but 16 by ``tokenizers`` on tokenizer.json: was exit 1 ("tokenizers
    gave '<x1>' id 16, expected 17", no fix); now exit 5 naming tokenizer.json and the fix, input kept."""
    ck = tmp_path / "ck"
    shutil.copytree(DATA / "cases" / "b20_added_pad_token_not_in_model" / "ckpt", ck)
    before = _hashes(ck)
    out = tmp_path / "out"
    run = run_cli(["add-tokens", str(ck), "<x1>", "--out", str(out)])
    assert run.rc == 5, run.stderr
    assert run.stderr.startswith(f"tietool: error: {ck / 'tokenizer.json'}: "), run.stderr
    assert "id 16" in run.stderr and "make it 17" in run.stderr and "save_pretrained" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not out.exists() and _hashes(ck) == before


@pytest.mark.parametrize(
    ("command", "extra", "word"),
    [
        ("prune", ["--keep-ids", "KEEP"], "prune refused"),
        ("prune", ["--keep-corpus", "CORPUS"], "prune refused"),
        ("rename-tokens", ["3=<zz>"], "rename-tokens refused"),
        ("add-tokens", ["<zz>"], "cannot edit"),
    ],
)
def test_a_tiktoken_file_named_tokenizer_model_is_refused_by_name(tmp_path, command, extra, word):
    """Case e05: GLM-4's ``tokenizer.model`` is a tiktoken rank file, not a SentencePiece model. prune (a
    keep-list or a corpus) read it as SentencePiece and failed with the protobuf parser's error (exit 3, no
    fix), rename-tokens said only "cannot be edited"; now each names the tiktoken file and a fix, exit 5, as
    add-tokens did, nothing written and the input kept."""
    ck = tmp_path / "ck"
    shutil.copytree(DATA / "cases" / "e05_glm4_tiktoken_tokenizer_model" / "ckpt", ck)
    (tmp_path / "keep.json").write_text("[0, 1, 2, 3, 4, 5]")
    (tmp_path / "corpus.txt").write_text("hello world\n")
    args = [
        {"KEEP": str(tmp_path / "keep.json"), "CORPUS": str(tmp_path / "corpus.txt")}.get(a, a) for a in extra
    ]
    before = _hashes(ck)
    out = tmp_path / "out"
    run = run_cli([command, str(ck), *args, "--out", str(out)])
    assert run.rc == 5, run.stderr
    assert run.stderr.startswith(f"tietool: error: {ck / 'tokenizer.model'}: "), run.stderr
    assert "tokenizer.model is a tiktoken rank file" in run.stderr and word in run.stderr, run.stderr
    assert " — " in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not out.exists() and _hashes(ck) == before


def test_an_edited_tokenizer_file_that_is_a_symbolic_link_is_said(tmp_path):
    """(Fixed: silently.) A checkpoint whose ``tokenizer.json`` is a relative link to a shared tokenizer
    (``../base/tokenizer.json``): add-tokens, in place and with ``--out``, puts the edited file in the
    link's place (the rule of docs/reference/in-place.md), leaves the shared file byte for byte, and says
    so in a note on the terminal and in the report."""
    base = tmp_path / "base"
    base.mkdir()
    for mode in ("out", "in-place"):
        ck = tmp_path / mode
        shutil.copytree(SAMPLE, ck)
        if not (base / "tokenizer.json").exists():
            (ck / "tokenizer.json").rename(base / "tokenizer.json")
        else:
            (ck / "tokenizer.json").unlink()
        (ck / "tokenizer.json").symlink_to("../base/tokenizer.json")
        shared = (base / "tokenizer.json").read_bytes()
        out = tmp_path / f"{mode}-out" if mode == "out" else ck
        argv = ["add-tokens", str(ck), "<zz1>", *(["--out", str(out)] if mode == "out" else [])]
        run = run_cli(argv)
        assert run.rc == 0, run.stderr
        said = (
            "note: tokenizer.json was a symbolic link to ../base/tokenizer.json: the output holds the edited"
        )
        assert said in run.stdout + run.stderr
        assert (base / "tokenizer.json").read_bytes() == shared
        written = out / "tokenizer.json"
        assert not written.is_symlink() and "<zz1>" in written.read_text()
        notes = json.loads((out / "tietool-report.json").read_text())["notes"]
        assert any(n.startswith("tokenizer.json was a symbolic link") for n in notes), notes


def test_a_negative_id_is_not_an_unknown_option_without_a_hint(tmp_path):
    """(Fixed: ``rename-tokens CK -1=<x>`` said only Click's "No such option: -1" and where the help is:
    an argument that starts with ``-`` is read as an option.) The line says so, that ids count from 0 and
    how to pass such an argument; after ``--`` the pair itself is judged. ``add-tokens CK -1`` (a token)
    gets the same line without the word on ids."""
    out = tmp_path / "out"
    r = run_cli(["rename-tokens", SAMPLE, "-1=<x>", "--out", out])
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert (
        "No such option: -1" in r.stderr and "token ids count from 0" in r.stderr and " -- " in r.stderr + " "
    )
    r = run_cli(["rename-tokens", SAMPLE, "--out", out, "--", "-1=<x>"])
    assert r.returncode == 2 and "'-1=<x>' is not ID=TOKEN" in r.stderr, r.stderr
    assert not out.exists()
    r = run_cli(["add-tokens", SAMPLE, "-1", "--out", out])  # a token, not an id: no word of ids
    assert r.returncode == 2 and "No such option: -1" in r.stderr and "token ids" not in r.stderr, r.stderr
    assert "put -- before an argument that must start with '-'" in r.stderr
    assert not out.exists()


def test_a_forced_trim_never_leaves_a_config_id_past_the_rows(tmp_path):
    """(Fixed: ``resize --vocab 301 --force`` of the sample wrote 301 rows under ``config.json``
    ``eos_token_id = 302``, exit 0, and ``verify`` passed it; each refusal on the way named one more row than
    the last.) A trim that would leave an id the configs name past the last row is refused even with
    ``--force``, naming the ids and the least number of rows that keeps them all; that number works, and
    the output verifies."""
    for n, why in ((10, "base vocabulary"), (300, "eos_token"), (301, "config.json eos_token_id = 302")):
        out = tmp_path / f"v{n}"
        run = run_cli(["resize", str(SAMPLE), "--vocab", str(n), "--force", "--out", str(out)])
        assert run.rc == 5 and why in run.stderr, run.describe()
        assert "keep at least 303 rows" in run.stderr, run.describe()
        assert not out.exists()
    out = tmp_path / "v303"
    run = run_cli(["resize", str(SAMPLE), "--vocab", "303", "--force", "--out", str(out)])
    assert run.rc == 0, run.describe()
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 302
    assert run_cli(["verify", str(SAMPLE), str(out), "-q"]).rc == 0
    assert "--force: rows 303..319 removed" in run.stdout, run.describe()
    run = run_cli(["resize", str(SAMPLE), "--vocab", "319", "--force", "--out", str(tmp_path / "v319")])
    assert run.rc == 0 and "--force: row 319 removed" in run.stdout, run.describe()  # not "rows 319..319"


def test_tie_of_a_head_over_its_own_vocabulary_gives_no_fix_that_cannot_work(tmp_path):
    """(Fixed: ``tie`` of an EAGLE-3 draft model (case d10: a [12, 8] head over draft_vocab_size 12, a
    [40, 8] embedding) said "or resize/trim the tables to the same rows first", which resize then refuses:
    its d2t map names target ids up to 36.) The fix is to keep it untied."""
    ckpt = paths.BUG_CASES_DIR / "d10_eagle3_draft_vocab_maps" / "ckpt"
    run = run_cli(["tie", str(ckpt), "--out", str(tmp_path / "o")])
    assert run.rc == 5 and "draft_vocab_size = 12" in run.stderr, run.describe()
    fix = run.stderr.split(" — ", 1)[1]
    assert "keep the checkpoint untied" in fix and "resize" not in fix, run.describe()
