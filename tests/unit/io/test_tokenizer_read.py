"""Reading tokenizer files (surgery/io/tokenizer.py: tokenizer_set, tokenizer_info, vocabulary) and what
inspect says about them and about rows that look untrained.

Oracles: the real libraries. ``len(transformers.AutoTokenizer.from_pretrained(folder))`` for every trained
tokenizer of tests/data/tokenizers/ (made by make_tokenizers.py there with the real trainers);
``sentencepiece.SentencePieceProcessor(model_file=...).get_piece_size()`` for each ``*.model``; the
``tokenizers`` library's own ``add_tokens`` for an edited tokenizer.json beside a stale tokenizer.model.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from support import paths

from tietool.surgery.inspect import chunked
from tietool.surgery.inspect.summary import inspect_path
from tietool.surgery.io import tokenizer as tk
from tietool.surgery.model.tokens import TokenizerFormat

TOK = paths.TOKENIZERS
# every tokenizer folder (not a __pycache__ that importing make_tokenizers.py leaves beside them)
FOLDERS = (
    sorted(p.name for p in TOK.iterdir() if p.is_dir() and p.name != "__pycache__") if TOK.is_dir() else []
)
LOADABLE = [f for f in FOLDERS if f != "tiktoken"]  # tiktoken/ is custom code: loads in neither library


def _copy(name: str, dst: Path) -> Path:
    shutil.copytree(TOK / name, dst)
    return dst


def write_checkpoint(
    folder: Path, rows: np.ndarray, tokenizer: str | None = None, head: np.ndarray | None = None
) -> Path:
    """A tiny Qwen2 safetensors checkpoint (embedding ``rows``, a norm; tied, or untied with ``head``
    as ``lm_head.weight``) with the tokenizer files of tests/data/tokenizers/``tokenizer`` beside it."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer:
        for f in (TOK / tokenizer).iterdir():
            shutil.copy(f, folder / f.name)
    V, H = rows.shape
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": head is None,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = {
        "model.embed_tokens.weight": np.ascontiguousarray(rows, np.float32),
        "model.norm.weight": np.ones(H, np.float32),
    }
    if head is not None:
        tensors["lm_head.weight"] = np.ascontiguousarray(head, np.float32)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "np"})
    return folder


def trained_rows(n: int, hidden: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.02, (n, hidden)).astype(np.float32)


@pytest.mark.parametrize("name", LOADABLE)
def test_length_is_transformers_len(name):
    from transformers import AutoTokenizer

    ts = tk.tokenizer_set(TOK / name)
    assert ts.length == len(AutoTokenizer.from_pretrained(str(TOK / name)))
    assert ts.disagreements == ()
    assert tk.tokenizer_info(TOK / name).size == ts.length
    assert all(f.note == "" for f in ts.files)


@pytest.mark.parametrize("name", [f for f in FOLDERS if any((TOK / f).glob("*.model"))])
def test_sentencepiece_size_is_the_processor_piece_size(name):
    import sentencepiece as spm

    ts = tk.tokenizer_set(TOK / name)
    (sp,) = [f for f in ts.files if f.format is TokenizerFormat.SENTENCEPIECE]
    proc = spm.SentencePieceProcessor(model_file=str(TOK / name / sp.name))
    assert sp.length == proc.get_piece_size()
    voc = tk.vocabulary(TOK / name)
    assert [voc[i] for i in range(proc.get_piece_size())] == [
        proc.id_to_piece(i) for i in range(proc.get_piece_size())
    ]


def test_every_file_and_added_token_of_bytelevel_bpe():
    ts = tk.tokenizer_set(TOK / "bytelevel_bpe")
    assert [(f.name, f.format, f.length) for f in ts.files] == [
        ("tokenizer.json", TokenizerFormat.TOKENIZER_JSON, 304),
        ("tokenizer_config.json", TokenizerFormat.ADDED, 304),
        ("special_tokens_map.json", TokenizerFormat.ADDED, None),
    ]
    from tokenizers import Tokenizer

    lib = Tokenizer.from_file(str(TOK / "bytelevel_bpe" / "tokenizer.json"))
    want = {i: (t.content, t.special) for i, t in lib.get_added_tokens_decoder().items()}
    assert {a.id: (a.content, a.special) for a in ts.added} == want
    assert ts.base == lib.get_vocab_size(with_added_tokens=False)
    assert tk.vocabulary(TOK / "bytelevel_bpe") == {
        i: s for s, i in lib.get_vocab(with_added_tokens=True).items()
    }


def test_tiktoken_is_read_but_unsupported():
    ts = tk.tokenizer_set(TOK / "tiktoken")
    assert ts.unsupported == ("qwen.tiktoken", "tokenizer_config.json")  # and its auto_map class
    assert ts.length == sum(
        1 for line in (TOK / "tiktoken" / "qwen.tiktoken").read_text().splitlines() if line
    )


def test_stale_model_beside_edited_json(tmp_path):
    """tokenizers' add_tokens on tokenizer.json alone (the model and the config's decoder left as they were):
    the SentencePiece model and the decoder no longer know the token."""
    from tokenizers import AddedToken, Tokenizer

    d = _copy("sp_bpe_with_json", tmp_path / "t")
    lib = Tokenizer.from_file(str(d / "tokenizer.json"))
    lib.add_tokens([AddedToken("<tool_call>", special=False)])
    lib.save(str(d / "tokenizer.json"))
    ts = tk.tokenizer_set(d)
    assert ts.length == 251
    text = "\n".join(ts.disagreements)
    assert "tokenizer.json 251" in text and "tokenizer.model 250" in text, text
    assert "'<tool_call>' (id 250), which tokenizer_config.json does not list" in text, text
    # why it matters: the loaders part ways on such a folder. transformers 5.3 does not see the token
    # (len 250, the string split), while PaddleFormers 1.2 loads it as id 250 (len 251; measured by hand)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(d))
    assert len(hf) == 250 and hf.encode("<tool_call>", add_special_tokens=False) != [250]


def test_model_of_another_training_beside_json(tmp_path):
    """A tokenizer.model of another training (the unigram model) beside the BPE model's tokenizer.json:
    same size, other pieces."""
    d = _copy("sp_bpe_with_json", tmp_path / "t")
    shutil.copy(TOK / "sp_unigram" / "tokenizer.model", d / "tokenizer.model")
    ts = tk.tokenizer_set(d)
    (line,) = [x for x in ts.disagreements if "tokenizer.model" in x and "disagree on" in x]
    import sentencepiece as spm

    bpe = spm.SentencePieceProcessor(model_file=str(TOK / "sp_bpe" / "tokenizer.model"))
    uni = spm.SentencePieceProcessor(model_file=str(TOK / "sp_unigram" / "tokenizer.model"))
    differ = sum(bpe.id_to_piece(i) != uni.id_to_piece(i) for i in range(250))
    assert f"disagree on {differ} id(s)" in line, line


def test_hf_style_add_keeps_the_files_agreeing(tmp_path):
    """The add HF transformers makes (tokenizer.json's added_tokens and tokenizer_config.json's
    added_tokens_decoder, tokenizer.model untouched) is consistent: slow and fast loaders see the token."""
    from tokenizers import AddedToken, Tokenizer

    d = _copy("sp_bpe_with_json", tmp_path / "t")
    lib = Tokenizer.from_file(str(d / "tokenizer.json"))
    lib.add_tokens([AddedToken("<tool_call>", special=False)])
    lib.save(str(d / "tokenizer.json"))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc["added_tokens_decoder"]["250"] = {
        "content": "<tool_call>",
        "lstrip": False,
        "normalized": True,
        "rstrip": False,
        "single_word": False,
        "special": False,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    ts = tk.tokenizer_set(d)
    assert ts.disagreements == () and ts.length == 251
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(str(d))) == 251


def test_one_id_two_strings_in_added_files(tmp_path):
    d = _copy("gpt2_bpe", tmp_path / "t")
    (d / "added_tokens.json").write_text(json.dumps({"<pad>": 300, "<other>": 300}))
    ts = tk.tokenizer_set(d)
    assert any("id 300 is both" in x for x in ts.disagreements), ts.disagreements


def test_without_sentencepiece_the_model_is_listed_not_parsed(tmp_path, monkeypatch):
    d = _copy("sp_unigram", tmp_path / "t")
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import sentencepiece raises ImportError
    ts = tk.tokenizer_set(d)
    (sp,) = [f for f in ts.files if f.format is TokenizerFormat.SENTENCEPIECE]
    assert sp.length is None and 'pip install ".[tokenizer]" in the tietool clone' in sp.note
    assert ts.needs_extra == ("tokenizer.model",)
    assert tk.tokenizer_info(d).unreadable == ()


def test_vocab_file_named_by_the_config(tmp_path):
    d = _copy("sp_unigram", tmp_path / "t")
    (d / "tokenizer.model").rename(d / "my.model")
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc["vocab_file"] = "my.model"
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    assert [f.name for f in tk.tokenizer_set(d).files][0] == "my.model"
    assert tk.tokenizer_set(d).length == 250


def test_corrupt_model_is_unreadable(tmp_path):
    d = _copy("sp_unigram", tmp_path / "t")
    (d / "tokenizer.model").write_bytes(b"not a protobuf at all")
    info = tk.tokenizer_info(d)
    assert "tokenizer.model" in info.unreadable


# ------------------------------------------------------------------ inspect


def test_inspect_lists_the_file_set_and_slack(tmp_path):
    ck = write_checkpoint(tmp_path / "ck", trained_rows(312), "bytelevel_bpe")
    info = inspect_path(ck)
    t = info["vocab"]["tokenizer"]
    assert t["length"] == 304 and t["agree"] and t["base"] == 300
    assert [f["name"] for f in t["files"]] == [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ]
    assert info["vocab"]["slack_rows"] == 8
    assert any("8 padding rows beyond the tokenizer" in n for n in info["notes"])
    assert info["untrained_rows"]["zero"]["count"] == 0


def test_inspect_disagreement_is_a_problem(tmp_path):
    ck = write_checkpoint(tmp_path / "ck", trained_rows(256), "sp_bpe_with_json")
    shutil.copy(TOK / "sp_unigram" / "tokenizer.model", ck / "tokenizer.model")
    info = inspect_path(ck)
    assert not info["vocab"]["tokenizer"]["agree"]
    kinds = [f["kind"] for f in info["findings"]]
    assert "tokenizer-files-disagree" in kinds
    assert any(
        p.startswith("the tokenizer files disagree: tokenizer.json model.vocab and tokenizer.model")
        for p in info["problems"]
    )


def test_untrained_rows_zero_duplicate_low_norm(tmp_path):
    rows = trained_rows(312)
    rows[304:] = 0  # slack rows never trained
    rows[7] = 0  # an all-zero row inside the vocabulary
    rows[20] = rows[10]  # a row identical to another
    rows[30] = rows[31] * 1e-5  # a row whose norm is far below the rest
    ck = write_checkpoint(tmp_path / "ck", rows, "bytelevel_bpe")
    info = inspect_path(ck)
    u = info["untrained_rows"]
    norms = np.linalg.norm(rows, axis=1)
    median = float(np.median(norms[norms > 0]))
    assert u["zero"] == {"count": 9, "first": [7, 304, 305, 306, 307, 308, 309, 310, 311]}
    assert u["duplicate"] == {"count": 1, "first": [{"id": 20, "same_as": 10}]}
    low = [int(i) for i in np.flatnonzero((norms > 0) & (norms < 1e-3 * median))]
    assert u["low_norm"]["first"] == low == [30]
    assert u["median_norm"] == pytest.approx(median, rel=1e-5)
    assert u["beyond_tokenizer"] == 8
    (note,) = [
        n for n in info["notes"] if n.startswith("rows of model.embed_tokens.weight that look untrained")
    ]
    assert "9 all-zero (ids 7, 304, 305" in note and "20 = 10" in note and "(ids 30)" in note, note
    assert inspect_path(ck, compare_values=False)["untrained_rows"] is None


def test_untrained_rows_in_small_chunks_match(tmp_path, monkeypatch):
    """The scan is chunked: a chunk of 3 rows gives the same answer as one chunk."""
    rows = trained_rows(50)
    rows[[3, 4, 41]] = 0
    rows[45] = rows[2]
    ck = write_checkpoint(tmp_path / "ck", rows)
    from tietool.surgery.io.checkpoint import Checkpoint

    whole = chunked.untrained_rows(Checkpoint.open(ck), "model.embed_tokens.weight")
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 3 * 8 * 4)
    small = chunked.untrained_rows(Checkpoint.open(ck), "model.embed_tokens.weight")
    assert whole == small
    assert whole["zero"]["first"] == [3, 4, 41] and whole["duplicate"]["first"] == [{"id": 45, "same_as": 2}]


def test_untrained_rows_beyond_the_tokenizer_are_all_counted(tmp_path):
    """More untrained rows than ids listed: the count beyond the tokenizer covers them all."""
    rows = trained_rows(330)
    rows[304:] = 0
    rows[100] = 0
    from tietool.surgery.io.checkpoint import Checkpoint

    ck = write_checkpoint(tmp_path / "ck", rows)
    u = chunked.untrained_rows(Checkpoint.open(ck), "model.embed_tokens.weight", 304)
    assert u["zero"]["count"] == 27 and len(u["zero"]["first"]) == chunked.FIRST_IDS
    assert u["beyond_tokenizer"] == 26


@pytest.mark.parametrize("layout", ["vocab-hidden", "hidden-vocab"])
@pytest.mark.parametrize("halves", [False, True])
def test_untrained_rows_come_from_the_head_comparison(tmp_path, monkeypatch, layout, halves):
    """With a head to compare, inspect's scan is fed from the embedding chunks the comparison reads (in one
    thread or two halves): the embedding is not read a second time, and the answer equals a scan of its
    own."""
    from tietool.surgery.inspect import compare as compare_mod
    from tietool.surgery.io.checkpoint import Checkpoint

    rows = trained_rows(312)
    rows[[5, 306]] = 0
    rows[200] = rows[100]
    head = trained_rows(312, seed=3)
    ck = write_checkpoint(
        tmp_path / "ck", rows, "bytelevel_bpe", head=head if layout == "vocab-hidden" else head.T
    )
    want = chunked.untrained_rows(Checkpoint.open(ck), "model.embed_tokens.weight", 304)
    if halves:
        monkeypatch.setattr(compare_mod, "HALVES_BYTES", 1)
    real = chunked._rows

    def no_second_read(c, name, *a, **k):
        assert name != "model.embed_tokens.weight", "the embedding was read again for the untrained rows"
        return real(c, name, *a, **k)

    monkeypatch.setattr(chunked, "_rows", no_second_read)
    info = inspect_path(ck)
    assert info["tie"]["values"] == "different"
    assert info["untrained_rows"] == want
    assert want["zero"]["first"] == [5, 306] and want["duplicate"]["first"] == [{"id": 200, "same_as": 100}]


CASES = paths.BUG_CASES_DIR


def test_an_id_gap_is_reported_as_loaders_renumber_it():
    """e07 (transformers#48446): added tokens 262, 263, 264, 266, nothing names 265. The set records the gap,
    inspect calls it a problem (the files do not 'agree'), and the id it says loaders give '<tool_call>' is
    the one the tokenizers library gives it (the oracle: 265, not 266)."""
    import tokenizers

    folder = CASES / "e07_added_token_id_gap" / "ckpt"
    assert tk.tokenizer_set(folder).gaps == (265,)
    info = inspect_path(folder)
    assert info["vocab"]["tokenizer"]["gaps"] == [265] and not info["vocab"]["tokenizer"]["agree"]
    gap = next(p for p in info["problems"] if "named by no tokenizer file" in p)
    loaded = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id("<tool_call>")
    assert f"'<tool_call>' 266 → {loaded}" in gap and loaded == 265


def test_no_gap_in_contiguous_tokenizers():
    """Every trained tokenizer (contiguous ids, as the libraries wrote them) has no gap."""
    assert all(tk.tokenizer_set(TOK / name).gaps == () for name in LOADABLE)


def test_tiktoken_rank_files_under_model_names(tmp_path):
    """GLM-4's tokenizer.model (e05) and Kimi's tiktoken.model are tiktoken rank files: read as tiktoken with
    their rank count (the file's lines, each a distinct rank), listed as unsupported, never a SentencePiece
    model that 'could not be read'; a real SentencePiece model is not taken for one; add-tokens refuses both
    names naming tiktoken."""
    from tietool.surgery.io.tokenizer_edit import add_tokens_edit
    from tietool.surgery.model.errors import RefusedError

    e05 = CASES / "e05_glm4_tiktoken_tokenizer_model" / "ckpt"
    ranks = len((e05 / "tokenizer.model").read_text().split())  # 'base64 rank' lines
    f = next(f for f in tk.tokenizer_set(e05).files if f.name == "tokenizer.model")
    assert (f.format, f.length, f.note) == (TokenizerFormat.TIKTOKEN, ranks // 2, "")
    assert "tokenizer.model" in tk.tokenizer_set(e05).unsupported
    kimi = tmp_path / "kimi"
    kimi.mkdir()
    shutil.copy(TOK / "tiktoken" / "qwen.tiktoken", kimi / "tiktoken.model")
    lines = (kimi / "tiktoken.model").read_text().splitlines()
    f = next(f for f in tk.tokenizer_set(kimi).files if f.name == "tiktoken.model")
    assert (f.format, f.length) == (TokenizerFormat.TIKTOKEN, len(lines))
    assert not tk.is_tiktoken((TOK / "sp_bpe" / "tokenizer.model").read_bytes())
    for folder in (e05, kimi):
        copy = shutil.copytree(folder, tmp_path / f"edit-{folder.name}")
        with pytest.raises(RefusedError, match="is a tiktoken rank file"):
            add_tokens_edit(copy, ["<x>"])
