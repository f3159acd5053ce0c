"""surgery.io.tokenizer_edit against the real libraries, on the trained tokenizers of tests/data/tokenizers.

Fast tests check the edit with ``tokenizers`` / ``sentencepiece`` directly (ids, splits, round trips,
refusals); the slow ones load every edited folder in transformers 5.x and PaddleFormers 1.2
``AutoTokenizer`` (one subprocess per library for all folders) and check that each new string encodes to its
new id, alone and inside a sentence, that ``len(tokenizer) == length_after``, and that every line of
corpus.txt tokenizes as before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import paths, preload

from tietool.surgery.io import tokenizer_folder
from tietool.surgery.io.tokenizer_edit import add_tokens_edit, remove_tokens_edit
from tietool.surgery.model.errors import CheckpointError, RefusedError, TietoolError

tokenizers = pytest.importorskip("tokenizers")
spm = pytest.importorskip("sentencepiece")
from sentencepiece import sentencepiece_model_pb2 as pb  # noqa: E402

DATA = paths.TOKENIZERS
EDITABLE = ("bytelevel_bpe", "gpt2_bpe", "sp_unigram", "sp_bpe", "sp_bpe_with_json", "wordpiece")
LENGTH = {"bytelevel_bpe": 304, "gpt2_bpe": 301, "sp_unigram": 250, "sp_bpe": 250, "sp_bpe_with_json": 250,
          "wordpiece": 234}  # fmt: skip
PLAIN = ["<tool_call>", "<tool", "</tool_call>"]  # a prefix of another, and a third sharing it
SPECIAL = ["<|tool_sep|>", "<tool"]  # a new special token, and an added one marked special
# a base token of each (in sp_bpe_with_json's tokenizer.json the text "he" encodes as ["▁", "he"], not as the
# piece "he": see test_vocabulary_spelling_of_another_text_is_refused)
KNOWN = {"bytelevel_bpe": "he", "gpt2_bpe": "he", "sp_unigram": "he", "sp_bpe": "he",
         "sp_bpe_with_json": "▁the", "wordpiece": "the"}  # fmt: skip


def _copy(name: str, tmp_path: Path) -> Path:
    """A copy of a folder of tests/data/tokenizers; ``bytelevel_bpe_full`` is bytelevel_bpe with the
    vocab.json + merges.txt a Qwen2 folder also carries (written by tokenizers' ``model.save``)."""
    out = tmp_path / name
    shutil.copytree(DATA / name.removesuffix("_full"), out)
    if name.endswith("_full"):
        tokenizers.Tokenizer.from_file(str(out / "tokenizer.json")).model.save(str(out))
    return out


def _write(folder: Path, edit) -> None:
    for name, blob in edit.files.items():
        (folder / name).write_bytes(blob)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _encode_before(folder: Path, text: str) -> list[int]:
    """The ids the original tokenizer gives ``text``, computed here without tokenizer_edit."""
    if (folder / "tokenizer.json").is_file():
        tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        return tok.encode(text, add_special_tokens=False).ids
    if (folder / "tokenizer.model").is_file():
        return spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model")).encode(text)
    if (folder / "vocab.txt").is_file():
        tok = tokenizers.Tokenizer(tokenizers.models.WordPiece.from_file(str(folder / "vocab.txt")))
        tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
        return tok.encode(text).ids
    bpe = tokenizers.models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tok = tokenizers.Tokenizer(bpe)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok.encode(text).ids


@pytest.mark.parametrize("name", EDITABLE)
def test_ids_contiguous_existing_and_subtokens(name, tmp_path):
    folder = _copy(name, tmp_path)
    edit = add_tokens_edit(folder, [*PLAIN, KNOWN[name], PLAIN[0]])
    n = LENGTH[name]
    assert (edit.length_before, edit.length_after) == (n, n + 3)
    assert [(t.content, t.id, t.existed) for t in edit.added] == [
        (s, n + i, False) for i, s in enumerate(PLAIN)
    ]
    for t in edit.added:
        assert t.subtoken_ids == tuple(_encode_before(folder, t.content)) and len(t.subtoken_ids) > 1
    known, again = edit.tokens[3], edit.tokens[4]
    assert known.existed and known.subtoken_ids == () and known.id < n  # a base token: not added again
    assert again.existed and again.id == n  # a string given twice gets one id
    assert _snapshot(folder) == _snapshot(DATA / name)  # nothing written by the edit itself


@pytest.mark.parametrize("name", EDITABLE)
def test_add_then_remove_gives_every_original_byte(name, tmp_path):
    folder = _copy(name, tmp_path)
    _write(folder, add_tokens_edit(folder, PLAIN))
    _write(folder, add_tokens_edit(folder, SPECIAL, special=True))
    edit = remove_tokens_edit(folder, LENGTH[name])
    assert [t.content for t in edit.removed] == [*PLAIN, SPECIAL[0]]
    assert edit.length_after == LENGTH[name]
    _write(folder, edit)
    created = {"added_tokens.json": b"{}\n"} if name == "wordpiece" else {}  # the file PaddleNLP 2.8.1 reads
    assert _snapshot(folder) == {**_snapshot(DATA / name), **created}


def test_added_existing_token_marked_special(tmp_path):
    folder = _copy("bytelevel_bpe", tmp_path)
    edit = add_tokens_edit(folder, ["<think>"], special=True)  # an added, non-special token (id 303)
    assert [(t.id, t.existed, t.special) for t in edit.tokens] == [(303, True, True)]
    assert edit.length_after == edit.length_before == 304
    tj = json.loads(edit.files["tokenizer.json"])
    assert [t["special"] for t in tj["added_tokens"] if t["content"] == "<think>"] == [True]
    cfg = json.loads(edit.files["tokenizer_config.json"])
    assert cfg["added_tokens_decoder"]["303"]["special"] is True
    assert cfg["additional_special_tokens"] == ["<|im_start|>", "<|im_end|>", "<think>"]
    assert json.loads(edit.files["special_tokens_map.json"])["additional_special_tokens"][-1] == "<think>"
    again = add_tokens_edit(folder, ["<|im_start|>"], special=True)  # already an added special token
    assert [(t.id, t.existed, t.special) for t in again.tokens] == [(301, True, True)] and again.files == {}


@pytest.mark.parametrize("name", ["sp_unigram", "sp_bpe"])
def test_sentencepiece_pieces_appended_and_encoded_whole(name, tmp_path):
    folder = _copy(name, tmp_path)
    _write(folder, add_tokens_edit(folder, PLAIN))
    _write(folder, add_tokens_edit(folder, ["<|tool_sep|>"], special=True))
    m = pb.ModelProto()
    m.ParseFromString((folder / "tokenizer.model").read_bytes())
    kinds = [(p.piece, p.type) for p in m.pieces[250:]]
    user, control = pb.ModelProto.SentencePiece.USER_DEFINED, pb.ModelProto.SentencePiece.CONTROL
    assert kinds == [(s, user) for s in PLAIN] + [("<|tool_sep|>", control)]
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    assert sp.get_piece_size() == 254
    for i, s in enumerate(PLAIN):  # USER_DEFINED pieces are never split, alone or in a sentence
        assert sp.encode(s)[-1:] == [250 + i] and 250 + i in sp.encode(f"call {s} now")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert sorted(int(i) for i in cfg["added_tokens_decoder"]) == [0, 1, 2, 250, 251, 252, 253]


def test_json_and_model_both_edited_and_agree(tmp_path):
    folder = _copy("sp_bpe_with_json", tmp_path)
    edit = add_tokens_edit(folder, PLAIN)
    assert {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"} <= set(edit.files)
    _write(folder, edit)
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    assert tok.get_vocab_size(with_added_tokens=True) == sp.get_piece_size() == 253
    assert all(tok.id_to_token(i) == sp.id_to_piece(i) for i in range(250, 253))


def test_string_given_twice_with_special_gets_one_id(tmp_path):
    edit = add_tokens_edit(_copy("bytelevel_bpe", tmp_path), ["<a>", "<a>", "<b>"], special=True)
    assert [(t.id, t.existed, t.special) for t in edit.tokens] == [
        (304, False, True),
        (304, True, True),
        (305, False, True),
    ]
    tj = json.loads(edit.files["tokenizer.json"])
    assert [t["content"] for t in tj["added_tokens"][4:]] == ["<a>", "<b>"] and edit.length_after == 306


def test_tokenizer_json_rewritten_as_tokenizers_writes_it(tmp_path):
    """A file tokenizers wrote is written by to_str(pretty=True); only added_tokens differs from before."""
    folder = _copy("bytelevel_bpe", tmp_path)
    edit = add_tokens_edit(folder, PLAIN)
    new, old = json.loads(edit.files["tokenizer.json"]), json.loads((folder / "tokenizer.json").read_text())
    assert {k: v for k, v in new.items() if k != "added_tokens"} == {
        k: v for k, v in old.items() if k != "added_tokens"
    }
    assert new["added_tokens"][:4] == old["added_tokens"]
    assert [(t["content"], t["id"], t["special"], t["normalized"]) for t in new["added_tokens"][4:]] == [
        (s, 304 + i, False, True) for i, s in enumerate(PLAIN)
    ]  # tokenizers' add_tokens flags: normalized = not special


@pytest.mark.parametrize("style", ["older", "compact"])
def test_tokenizer_json_from_another_writer_keeps_its_json(style, tmp_path):
    """A tokenizer.json that to_str would not reproduce (an older tokenizers without ``ignore_merges``; a
    compact file) keeps every other byte of its JSON: only added_tokens is replaced."""
    folder = _copy("bytelevel_bpe", tmp_path)
    data = json.loads((folder / "tokenizer.json").read_text())
    if style == "older":
        del data["model"]["ignore_merges"]  # tokenizers < 0.19 did not write it; to_str would add it
    text = json.dumps(
        data, indent=2 if style == "older" else None, separators=(",", ":") if style == "compact" else None
    )
    (folder / "tokenizer.json").write_text(text)
    edit = add_tokens_edit(folder, PLAIN)
    got = edit.files["tokenizer.json"].decode()
    data["added_tokens"] += [
        dict(
            id=304 + i,
            content=s,
            single_word=False,
            lstrip=False,
            rstrip=False,
            normalized=True,
            special=False,
        )
        for i, s in enumerate(PLAIN)
    ]
    want = json.dumps(
        data, indent=2 if style == "older" else None, separators=(",", ":") if style == "compact" else None
    )
    assert got == want
    tok = tokenizers.Tokenizer.from_str(got)
    assert [tok.token_to_id(s) for s in PLAIN] == [304, 305, 306]


def test_gpt2_added_tokens_json_not_merges(tmp_path):
    folder = _copy("gpt2_bpe", tmp_path)
    edit = add_tokens_edit(folder, PLAIN)
    assert sorted(edit.files) == ["added_tokens.json", "tokenizer_config.json"]  # vocab.json, merges.txt kept
    assert json.loads(edit.files["added_tokens.json"]) == {
        "<pad>": 300,
        **{s: 301 + i for i, s in enumerate(PLAIN)},
    }


def test_wordpiece_added_tokens_json_not_vocab_lines(tmp_path):
    """vocab.txt is kept; the tokens go to added_tokens.json (in id order) and added_tokens_decoder, as the
    slow tokenizers' save_pretrained writes them: PaddleNLP 2.8.1 reads only added_tokens.json, and refuses
    an id there that vocab.txt already counts ("Non-consecutive added token")."""
    folder = _copy("wordpiece", tmp_path)
    edit = add_tokens_edit(folder, PLAIN)
    assert sorted(edit.files) == ["added_tokens.json", "tokenizer_config.json"]
    added = json.loads(edit.files["added_tokens.json"])
    assert list(added.items()) == [(s, 234 + i) for i, s in enumerate(PLAIN)]
    decoder = json.loads(edit.files["tokenizer_config.json"])["added_tokens_decoder"]
    assert [decoder[str(234 + i)]["content"] for i in range(len(PLAIN))] == PLAIN


def test_wordpiece_lower_cases_a_plain_token_and_says_so(tmp_path):
    """The WordPiece tokenizer lower-cases text (do_lower_case): 'COVID' is stored as 'covid' (what
    PaddleNLP 2.8.1's own add_tokens stores), said in the edit's warnings; 'Café' (accents stripped too, by
    transformers' normalizer only) is refused naming the lower-casing; special tokens keep their case."""
    folder = _copy("wordpiece", tmp_path)
    edit = add_tokens_edit(folder, ["COVID"])
    assert [(t.content, t.id) for t in edit.added] == [("covid", 234)]
    assert json.loads(edit.files["added_tokens.json"]) == {"covid": 234}
    assert "'COVID' is added as 'covid'" in edit.warnings[0] and "lower-cases" in edit.warnings[0]
    with pytest.raises(RefusedError, match="lower-cases text"):
        add_tokens_edit(folder, ["Café"])
    assert [t.content for t in add_tokens_edit(folder, ["<TOOL>"], special=True).added] == ["<TOOL>"]


def test_tiktoken_refused_nothing_written(tmp_path):
    folder = _copy("tiktoken", tmp_path)
    with pytest.raises(RefusedError, match="qwen.tiktoken is a tiktoken"):
        add_tokens_edit(folder, PLAIN)
    assert _snapshot(folder) == _snapshot(DATA / "tiktoken")


def test_custom_class_refused(tmp_path):
    folder = _copy("bytelevel_bpe", tmp_path)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(RefusedError, match="custom tokenizer class"):
        add_tokens_edit(folder, PLAIN)


def test_no_vocabulary_refused(tmp_path):
    folder = tmp_path / "cfg_only"
    folder.mkdir()
    shutil.copy(DATA / "bytelevel_bpe" / "tokenizer_config.json", folder)
    with pytest.raises(RefusedError, match="nothing to add the token to"):
        add_tokens_edit(folder, PLAIN)


def test_named_special_token_cannot_be_removed():
    """eos_token / pad_token <|endoftext|> (300): the loaders would add it back as id 300 (measured)."""
    with pytest.raises(RefusedError, match=r"token 300 '<\|endoftext\|>' is tokenizer_config.json eos_token"):
        remove_tokens_edit(DATA / "bytelevel_bpe", 300)
    with pytest.raises(RefusedError, match=r"token 300 '<pad>' is tokenizer_config.json pad_token"):
        remove_tokens_edit(DATA / "gpt2_bpe", 300)


def test_special_attribute_without_a_token_refused(tmp_path):
    folder = _copy("sp_bpe", tmp_path)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["pad_token"] = "<pad>"  # no file has it: loaders add it at load, at id 250
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        RefusedError, match="tokenizer_config.json pad_token is '<pad>', which no tokenizer file"
    ):
        add_tokens_edit(folder, PLAIN)
    edit = add_tokens_edit(folder, ["<pad>", *PLAIN], special=True)  # adding it first is the fix
    assert [t.id for t in edit.tokens] == [250, 251, 252, 253]


def test_base_token_cannot_be_removed(tmp_path):
    with pytest.raises(RefusedError, match=r"ids 298 .* base vocabulary \(300 tokens\)"):
        remove_tokens_edit(DATA / "bytelevel_bpe", 298)
    edit = remove_tokens_edit(DATA / "bytelevel_bpe", 301)  # drops <|im_start|>, <|im_end|>, <think>
    assert [t.id for t in edit.removed] == [301, 302, 303] and edit.length_after == 301
    assert remove_tokens_edit(DATA / "bytelevel_bpe", 400).files == {}


@pytest.mark.parametrize(
    ("name", "file", "text"),
    [
        ("bytelevel_bpe", "tokenizer.json", '{"model": {"type": "BPE", "vocab": {"a": 0}}}'),
        ("bytelevel_bpe", "tokenizer_config.json", "{not json"),
        ("gpt2_bpe", "added_tokens.json", '{"<pad>": "x"}'),
        ("sp_bpe", "tokenizer.model", "not a protobuf"),
    ],
)
def test_bad_file_is_a_checkpoint_error(name, file, text, tmp_path):
    folder = _copy(name, tmp_path)
    (folder / file).write_text(text)
    with pytest.raises(CheckpointError):
        add_tokens_edit(folder, PLAIN)


def test_stale_model_file_refused(tmp_path):
    folder = _copy("sp_bpe_with_json", tmp_path)
    shutil.copy(DATA / "sp_unigram" / "tokenizer.model", folder)  # another model's pieces
    with pytest.raises(CheckpointError, match=r"tokenizer.model and tokenizer.json disagree \(id \d+ is"):
        add_tokens_edit(folder, PLAIN)
    full = _copy("bytelevel_bpe_full", tmp_path)
    vocab = json.loads((full / "vocab.json").read_text())
    (full / "vocab.json").write_text(json.dumps(dict(list(vocab.items())[:200])))
    with pytest.raises(CheckpointError, match=r"vocab.json and tokenizer.json disagree \(200 tokens there"):
        add_tokens_edit(full, PLAIN)


def test_files_giving_an_id_two_strings_refused(tmp_path):
    folder = _copy("bytelevel_bpe", tmp_path)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"]["303"]["content"] = "<thinking>"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="gives id 303 the string '<thinking>', tokenizer.json gives"):
        add_tokens_edit(folder, PLAIN)


def test_qwen2_folder_with_vocab_json_keeps_it(tmp_path):
    folder = _copy("bytelevel_bpe_full", tmp_path)
    edit = add_tokens_edit(folder, PLAIN)
    # vocab.json, merges.txt kept; added_tokens.json (created) lists the added tokens for slow tokenizers
    assert sorted(edit.files) == ["added_tokens.json", "tokenizer.json", "tokenizer_config.json"]
    listed = json.loads(edit.files["added_tokens.json"])
    tok = tokenizers.Tokenizer.from_str(edit.files["tokenizer.json"].decode())
    assert listed == {t["content"]: t["id"] for t in json.loads(tok.to_str())["added_tokens"]}
    assert list(listed.values()) == sorted(listed.values()) and min(listed.values()) == 300


def test_gap_refused(tmp_path):
    folder = _copy("gpt2_bpe", tmp_path)
    (folder / "added_tokens.json").write_text(json.dumps({"<pad>": 300, "<far>": 310}))
    with pytest.raises(RefusedError, match="301..309 are named by no tokenizer file"):
        add_tokens_edit(folder, PLAIN)


def test_missing_library_names_the_extra(monkeypatch, tmp_path):
    import importlib

    real = importlib.import_module

    def fake(name, *a):
        if name.startswith("tokenizers"):
            raise ImportError(name)
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(TietoolError, match=r'pip install "\.\[tokenizer\]" in the tietool clone'):
        add_tokens_edit(DATA / "bytelevel_bpe", PLAIN)
    assert tokenizer_folder.EXTRA == 'pip install ".[tokenizer]" in the tietool clone'


# ------------------------------------------------------------------ the loaders

_ORACLE = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
lib, spec = sys.argv[1], json.loads(sys.argv[2])
if lib == "hf":
    from transformers import AutoTokenizer
else:
    from paddleformers.transformers import AutoTokenizer
out = {}
for name, s in spec.items():
    before, after = AutoTokenizer.from_pretrained(s["before"]), AutoTokenizer.from_pretrained(s["after"])
    enc = lambda t, x: t.encode(x, add_special_tokens=False)
    out[name] = {
        "len": len(after),
        "len_before": len(before),
        "alone": {x: enc(after, x) for x in s["new"]},
        "inside": {x: enc(after, "call " + x + " now") for x in s["new"]},
        "corpus_same": [enc(before, x) == enc(after, x) for x in s["corpus"]],
    }
print("\nRESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    """Every editable folder with PLAIN added, then SPECIAL added special; {name: (before, after, ids)}."""
    root = tmp_path_factory.mktemp("edited")
    out = {}
    for name in (*EDITABLE, "bytelevel_bpe_full"):
        before, after = root / f"{name}.before", root / f"{name}.after"
        shutil.copytree(_copy(name, root / "src"), before)
        shutil.copytree(before, after)
        e1 = add_tokens_edit(after, PLAIN)
        _write(after, e1)
        e2 = add_tokens_edit(after, SPECIAL, special=True)
        _write(after, e2)
        out[name] = (before, after, {t.content: t.id for t in (*e1.tokens, *e2.tokens)}, e2.length_after)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("lib", ["hf", "pf"])
def test_loaders_encode_new_tokens_and_keep_the_corpus(lib, edited):
    pytest.importorskip("transformers" if lib == "hf" else "paddleformers")
    corpus = [x for x in (DATA / "corpus.txt").read_text(encoding="utf-8").splitlines() if x.strip()]
    spec = {
        n: {"before": str(b), "after": str(a), "new": sorted(ids), "corpus": corpus}
        for n, (b, a, ids, _) in edited.items()
    }
    run = preload.run(
        [sys.executable, "-c", _ORACLE, lib, json.dumps(spec)],
        libs=("transformers",) if lib == "hf" else preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))[7:])
    problems = []
    for name, (_, _, ids, length) in edited.items():
        g = got[name]
        want = (LENGTH[name.removesuffix("_full")], length)  # length_before as the loaders count it
        if (g["len_before"], g["len"]) != want:
            problems.append(f"{name}: len {g['len_before']} -> {g['len']}, want {want[0]} -> {want[1]}")
        for s, i in ids.items():
            if g["alone"][s] != [i]:
                problems.append(f"{name}: {s!r} alone -> {g['alone'][s]}, want [{i}]")
            if i not in g["inside"][s]:
                problems.append(f"{name}: {s!r} in a sentence -> {g['inside'][s]}, no {i}")
        bad = [corpus[k] for k, same in enumerate(g["corpus_same"]) if not same]
        if bad:
            problems.append(f"{name}: corpus lines tokenized differently: {bad[:2]}")
    assert problems == [], "\n".join(problems)


# (string, the id it spells in the base vocabulary, what the text encodes as), each a vocabulary string that
# is not one token of its own text: byte-level BPE's byte alphabet ('é' is byte 0xE9's piece; the text é is
# the two UTF-8 bytes), its space mark 'Ġ', a SentencePiece piece (in tokenizer.json) without the '▁' its
# text gets
SPELLINGS = [("bytelevel_bpe", "é"), ("bytelevel_bpe", "Ġ"), ("gpt2_bpe", "é"), ("sp_bpe_with_json", "he")]


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize(("name", "text"), SPELLINGS)
def test_vocabulary_spelling_of_another_text_is_refused(name, text, special, tmp_path):
    """Found by breaking issue 20: ``add-tokens ck é`` reported 'é' as "already a token (id 165)" of a
    byte-level BPE tokenizer, whose text é encodes as [127, 102]; with ``--special`` it marked id 165 (byte
    0xE9) special, and transformers 5.3 then encoded "café" as [66, 64, 69, 165] and decoded it
    'caf\ufffd'. A new id is no way out either: tokenizers' add_tokens maps the string to the model's id.
    Refused, nothing written."""
    folder = _copy(name, tmp_path)
    before = _encode_before(folder, text)
    vocab = tokenizer_folder._base_of(tokenizer_folder.scan_folder(folder))
    assert text in vocab and before != [vocab[text]]  # the premise, from the files themselves
    with pytest.raises(RefusedError, match=f"{text!r} is the vocabulary's spelling of token {vocab[text]}"):
        add_tokens_edit(folder, ["<ok>", text], special=special)
    assert _snapshot(folder) == _snapshot(DATA / name)


@pytest.mark.parametrize(
    "text", ["a\nb", "a\rb", "   ", "\t", "trail "], ids=["lf", "cr", "spaces", "tab", "trail"]
)
def test_vocab_txt_refuses_a_token_its_readers_would_move(text, tmp_path):
    """Found by breaking issue 20: appended to vocab.txt, 'a\\nb' became two lines and '   ' / '\\t' /
    'trail ' lost their trailing whitespace in transformers 5.3 and PaddleFormers 1.2 (``AutoTokenizer``:
    '<z>' added after 'a\\nb' loaded as id 237 of a 237-row model, one past tietool's 236). Refused, nothing
    written; a leading space and an inner one are kept by both and stay allowed."""
    folder = _copy("wordpiece", tmp_path)
    with pytest.raises(RefusedError, match="cannot be a line of vocab.txt"):
        add_tokens_edit(folder, ["<ok>", text])
    assert _snapshot(folder) == _snapshot(DATA / "wordpiece")
    edit = add_tokens_edit(folder, [" lead", "a b"])
    assert [t.id for t in edit.added] == [LENGTH["wordpiece"], LENGTH["wordpiece"] + 1]


def test_vocab_txt_lines_as_transformers_reads_them(tmp_path):
    """A token of vocab.txt holding U+2028 (or \\x85, \\x0c: characters ``str.splitlines`` breaks at) is one
    line for transformers' ``load_vocab`` (``readlines``); tietool read it as two, so every later id and the
    new tokens' ids were one too high."""
    bert = pytest.importorskip("transformers.models.bert.tokenization_bert")
    folder = _copy("wordpiece", tmp_path)
    lines = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    lines[200], lines[201] = "x\u2028y", "p\x85q\x0cr"
    (folder / "vocab.txt").write_text("\n".join(lines), encoding="utf-8")
    oracle = bert.load_vocab(str(folder / "vocab.txt"))
    edit = add_tokens_edit(folder, ["<new>"])
    assert edit.length_before == len(oracle) == LENGTH["wordpiece"]
    assert [t.id for t in edit.added] == [len(oracle)]


def test_sentencepiece_model_under_another_name_is_refused_by_name(tmp_path):
    """Found by breaking issue 20: a folder whose only model is ``spm.model`` (DeBERTa-v2's name; inspect
    reads it, as tokenizer_config.json's ``vocab_file`` too) was refused as having "no tokenizer vocabulary
    (tokenizer.json, *.model, ...)", which is false. Which class reads that name cannot be told (transformers
    5.3 and PaddleFormers 1.2 load this Llama folder as 3 tokens), so it is refused naming the file."""
    folder = _copy("sp_unigram", tmp_path)
    (folder / "tokenizer.model").rename(folder / "spm.model")
    before = _snapshot(folder)
    with pytest.raises(RefusedError) as e:
        add_tokens_edit(folder, ["<a>"])
    msg = str(e.value)
    assert "spm.model is a SentencePiece model" in msg and "no tokenizer vocabulary" not in msg
    assert _snapshot(folder) == before


def test_a_token_the_edited_tokenizer_never_produces_is_refused(tmp_path):
    """Found by breaking issue 20: a plain ``<|im_start|>user`` added beside the special ``<|im_start|>``
    (id 301; special tokens are matched first, on the raw text) took a row, and transformers 5.3 and
    PaddleFormers 1.2 encoded it as [301, 84, 82, 263]: never produced. Refused, nothing written; as a special
    token it is produced (the longest special match) and added."""
    folder = _copy("bytelevel_bpe", tmp_path)
    with pytest.raises(RefusedError, match="would never be produced"):
        add_tokens_edit(folder, ["<ok>", "<|im_start|>user"])
    assert _snapshot(folder) == _snapshot(DATA / "bytelevel_bpe")
    edit = add_tokens_edit(folder, ["<|im_start|>user"], special=True)
    _write(folder, edit)
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.encode("<|im_start|>user", add_special_tokens=False).ids == [LENGTH["bytelevel_bpe"]]


# a special token of each folder (matched first, on the raw text) inside a new plain token
SHADOWED = [("gpt2_bpe", "<|endoftext|>x"), ("sp_unigram", "<s>x"), ("sp_bpe", "<s>x"),
            ("wordpiece", "[CLS]x")]  # fmt: skip


@pytest.mark.parametrize(("name", "text"), SHADOWED)
def test_a_plain_token_holding_a_special_one_is_refused_in_every_format(name, text, tmp_path):
    """Found by breaking issue 20: in the formats without tokenizer.json, transformers 5.3 and PaddleFormers
    1.2 encoded the new plain tokens ``<|endoftext|>x`` / ``<s>x`` / ``[CLS]x`` as [0, 88] / [1, 117] /
    [2, 138]: never produced. Refused, nothing written; as special tokens they are added."""
    folder = _copy(name, tmp_path)
    with pytest.raises(RefusedError, match="would never be produced: it holds the token"):
        add_tokens_edit(folder, [text])
    assert _snapshot(folder) == _snapshot(DATA / name)
    assert [t.id for t in add_tokens_edit(folder, [text], special=True).added] == [LENGTH[name]]
