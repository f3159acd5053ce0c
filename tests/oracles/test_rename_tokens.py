"""The proving test of :data:`surgery.io.tokenizer_rename.RENAME_FACTS`: a reserved slot renamed by
``rename-tokens`` (:func:`surgery.io.tokenizer_rename.rename_tokens_edit`'s files) is encoded to its id by
the real library, and the old string no longer yields that id.

Inputs: the trained tokenizers of ``tests/data/tokenizers`` and the PaddleNLP-written folders of
``tests/data/pnlp_tokenizers``, each given two reserved slots first as a model ships them
(``<|reserved_special_token_0|>``, ``<|reserved_special_token_1|>``: special added tokens, written by
add-tokens), and the e01 case (ERNIE 3.0, PaddleNLP, its own ``[unused1..3]`` lines of vocab.txt). Each slot
is renamed (``<think>`` and ``<|tool|>``, special). A fact ``(format, loader)``: every folder of that format
the loader reads (its input loads with the tokenizer's length) encodes each new string, alone, as exactly
its id and inside ``and X then`` with its id; the old string, encoded, is not ``[id]``; the length is
unchanged. Loaders: ``tokenizers`` and ``sentencepiece`` here, transformers 5.3 and PaddleFormers 1.2 in one
subprocess, PaddleNLP 2.8.1 in its venv (marked ``pnlp``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import casecheck, paths, pnlp_support
from support import tokmodel_support as ts
from support.paths import BUG_CASES_DIR
from support.resize_support import run_cli

from tietool.surgery.io.tokenizer import tokenizer_set, vocabulary
from tietool.surgery.io.tokenizer_edit import add_tokens_edit
from tietool.surgery.io.tokenizer_loaders import TokenizerLoader as L
from tietool.surgery.io.tokenizer_rename import RENAME_FACTS, rename_tokens_edit
from tietool.surgery.model.errors import RefusedError
from tietool.surgery.model.tokens import TokenizerFormat as F

DATA = paths.DATA
TOK, PNLP_TOK = DATA / "tokenizers", DATA / "pnlp_tokenizers"
E01 = BUG_CASES_DIR / "e01_ernie3_wordpiece_lowercase_add_tokens" / "ckpt"
SLOTS = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]
NEW = ["<tt_think>", "<|tt_tool|>"]
FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "sentencepiece.bpe.model",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
SOURCES: dict[F, tuple[Path, ...]] = {
    F.TOKENIZER_JSON: (TOK / "bytelevel_bpe", TOK / "sp_bpe_with_json"),
    F.SENTENCEPIECE: (TOK / "sp_bpe", TOK / "sp_unigram", PNLP_TOK / "llama_sp"),
    F.WORDPIECE: (TOK / "wordpiece", PNLP_TOK / "ernie_wordpiece", E01),
    F.GPT2_BPE: (TOK / "gpt2_bpe", PNLP_TOK / "gpt_bpe"),
}


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return dst


def _write(folder: Path, files: dict[str, bytes]) -> None:
    for name, blob in files.items():
        (folder / name).write_bytes(blob)


def _with_slots(src: Path, dst: Path) -> tuple[Path, list[int]]:
    """A copy of ``src`` with two reserved slots: e01's own ``[unused1]``/``[unused2]`` lines, else two
    ``<|reserved_special_token_N|>`` special tokens added as add-tokens adds them."""
    folder = _copy(src, dst)
    if src == E01:
        v = {s: i for i, s in vocabulary(folder).items()}
        return folder, [v["[unused1]"], v["[unused2]"]]
    edit = add_tokens_edit(folder, SLOTS, special=True)
    _write(folder, dict(edit.files))
    return folder, [t.id for t in edit.tokens]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[F, list[dict]]:
    """Per format: ``{"input", "output", "ids", "old", "source"}`` of each source (slots made, renamed)."""
    root = tmp_path_factory.mktemp("rename")
    out: dict[F, list[dict]] = {}
    for fmt, sources in SOURCES.items():
        for n, src in enumerate(sources):
            inp, ids = _with_slots(src, root / f"{fmt.value}-{n}" / "in")
            old = [vocabulary(inp)[i] for i in ids]
            outp = _copy(inp, root / f"{fmt.value}-{n}" / "out")
            edit = rename_tokens_edit(outp, dict(zip(ids, NEW, strict=True)), special=True)
            _write(outp, dict(edit.files))
            out.setdefault(fmt, []).append(
                {"input": inp, "output": outp, "ids": ids, "old": old, "source": src}
            )
    return out


def _all(folders) -> list[dict]:
    return [x for group in folders.values() for x in group]


@pytest.fixture(scope="module")
def hf_pf(folders, tmp_path_factory) -> dict[str, dict]:
    jobs = []
    for x in _all(folders):
        for key in ("input", "output"):
            jobs.append({"folder": str(x[key]), "strings": NEW + x["old"], "corpus": []})
    loads = ts.tokenizer_loads(jobs, tmp_path_factory.mktemp("hfpf"))
    return {j["folder"]: r for j, r in zip(jobs, loads, strict=True)}


@pytest.fixture(scope="module")
def pnlp(folders, tmp_path_factory) -> dict[str, dict]:
    pnlp_support.require()
    jobs, keys = [], []
    for x in _all(folders):
        for key in ("input", "output"):
            texts = NEW + x["old"]
            jobs.append(
                {"op": "encode", "dir": str(x[key]), "texts": [*texts, *(f"and {s} then" for s in texts)]}
            )
            keys.append(str(x[key]))
    results = pnlp_support.run_jobs(jobs, tmp_path_factory.mktemp("pnlp"))
    out = {}
    for k, r in zip(keys, results, strict=True):
        if r["ok"]:
            n = len(NEW) + 2
            r = {"ok": True, "len": r["len"], "strings": r["ids"][:n], "inside": r["ids"][n:]}
        out[k] = r
    return out


def _load(loader: L, folder: Path, hf_pf, request) -> dict:
    strings = NEW + [vocabulary(folder.parent / "in")[i] for i in _ids_of(folder, request)]
    if loader is L.TOKENIZERS:
        import tokenizers

        if not (folder / "tokenizer.json").is_file():
            return {"ok": False}
        tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        return {
            "ok": True,
            "len": tok.get_vocab_size(with_added_tokens=True),
            "strings": [tok.encode(s, add_special_tokens=False).ids for s in strings],
            "inside": [tok.encode(f"and {s} then", add_special_tokens=False).ids for s in strings],
        }
    if loader is L.SENTENCEPIECE:
        import sentencepiece as spm

        name = next(
            (n for n in ("tokenizer.model", "sentencepiece.bpe.model") if (folder / n).is_file()), None
        )
        if name is None:
            return {"ok": False}
        sp = spm.SentencePieceProcessor(model_file=str(folder / name))
        return {
            "ok": True,
            "len": sp.get_piece_size(),
            "pieces": [sp.piece_to_id(s) for s in strings],
            "control": [sp.is_control(sp.piece_to_id(s)) for s in strings],
        }
    if loader is L.PADDLENLP_28:
        return request.getfixturevalue("pnlp")[str(folder)]
    return hf_pf[str(folder)]["hf" if loader is L.TRANSFORMERS else "pf"]


def _ids_of(folder: Path, request) -> list[int]:
    for x in _all(request.getfixturevalue("folders")):
        if folder in (x["input"], x["output"]):
            return x["ids"]
    raise AssertionError(folder)


def _fact_ids():
    return [
        pytest.param(
            fmt,
            loader,
            id=f"{fmt.value}-{loader.value}",
            marks=[pytest.mark.pnlp] if loader is L.PADDLENLP_28 else [],
        )
        for fmt, loader in RENAME_FACTS
    ]


@pytest.mark.parametrize(("fmt", "loader"), _fact_ids())
def test_rename_fact(fmt, loader, folders, hf_pf, request):
    """Every folder of ``fmt`` that ``loader`` reads: each new string is its slot's id (alone and inside
    text), the old string no longer is, the length is unchanged; at least one such folder."""
    assert RENAME_FACTS[(fmt, loader)] == paths.node_id(request)
    readers = 0
    for x in folders[fmt]:
        before = _load(loader, x["input"], hf_pf, request)
        length = tokenizer_set(x["input"]).length
        if not before.get("ok") or before["len"] != length:
            continue
        readers += 1
        got = _load(loader, x["output"], hf_pf, request)
        assert got.get("ok") and got["len"] == length, (x["source"], got)
        ids = x["ids"]
        if loader is L.SENTENCEPIECE:
            assert got["pieces"][:2] == ids and all(got["control"][:2]), (x["source"], got)
            assert all(p != i for p, i in zip(got["pieces"][2:], ids, strict=True)), (x["source"], got)
            continue
        assert got["strings"][:2] == [[i] for i in ids], (x["source"], got["strings"])
        assert all(i in s for i, s in zip(ids, got["inside"][:2], strict=True)), (x["source"], got["inside"])
        assert all(s != [i] for s, i in zip(got["strings"][2:], ids, strict=True)), (
            x["source"],
            got["strings"],
        )
    assert readers, f"{loader.value} reads none of the {fmt.value} folders"


def test_refusals(tmp_path):
    """A slot that is not reserved (a base token, a named special token), an id the tokenizer lacks, a new
    string the tokenizer already has, a plain token in a vocab.txt line: refused, naming it."""
    folder, ids = _with_slots(TOK / "bytelevel_bpe", tmp_path / "bl")
    with pytest.raises(RefusedError, match="not a reserved slot"):
        rename_tokens_edit(folder, {5: "<think>"})
    with pytest.raises(RefusedError, match="not a token"):
        rename_tokens_edit(folder, {10**6: "<think>"})
    with pytest.raises(RefusedError, match="already is token"):
        rename_tokens_edit(folder, {ids[0]: vocabulary(folder)[5]})
    e01, uids = _with_slots(E01, tmp_path / "e01")
    with pytest.raises(RefusedError, match="special"):
        rename_tokens_edit(e01, {uids[0]: "<think>"}, special=False)
    cfg = json.loads((e01 / "tokenizer_config.json").read_text())
    assert "unk_token" in cfg
    assert vocabulary(e01)[0] == "[PAD]"
    with pytest.raises(RefusedError, match="not a reserved slot"):
        rename_tokens_edit(e01, {0: "<think>"})


def test_special_sentencepiece_pieces_are_said_to_be_control(tmp_path):
    """A special token appended to (add-tokens) or renamed in (rename-tokens) a SentencePiece model is a
    CONTROL piece, which the sentencepiece library reading the model alone never produces from text (its
    encode of the string is other ids): each edit says so in one warning naming the tokens and the model,
    and an edit of plain tokens (USER_DEFINED, which sentencepiece does produce) or of no SentencePiece
    model says nothing of it."""
    import sentencepiece as spm

    folder, ids = _with_slots(TOK / "sp_bpe", tmp_path / "sp")
    added = add_tokens_edit(_copy(folder, tmp_path / "a"), ["<tt_a>"], special=True)
    renamed = rename_tokens_edit(folder, dict(zip(ids, NEW, strict=True)), special=True)
    for edit, strings in ((added, ["<tt_a>"]), (renamed, NEW)):
        said = [w for w in edit.warnings if "CONTROL piece" in w]
        assert len(said) == 1 and "tokenizer.model" in said[0], edit.warnings
        assert all(repr(s) in said[0] for s in strings), said
    _write(folder, dict(renamed.files))
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    assert all(sp.is_control(i) and sp.encode(s) != [i] for i, s in zip(ids, NEW, strict=True))
    plain = add_tokens_edit(_copy(TOK / "sp_bpe", tmp_path / "p"), ["<tt_p>"], special=False)
    assert not [w for w in plain.warnings if "CONTROL" in w]
    bl, bids = _with_slots(TOK / "bytelevel_bpe", tmp_path / "bl")
    assert not [
        w for w in rename_tokens_edit(bl, {bids[0]: "<tt_b>"}, special=True).warnings if "CONTROL" in w
    ]


SAMPLE = paths.SAMPLES / "pf_llama_with_tokenizer"
NAMES = ("model.embed_tokens.weight", "lm_head.weight")


@pytest.fixture
def reserved(tmp_path) -> Path:
    """pf_llama_with_tokenizer (PaddleFormers 1.2, untied, 320 rows, byte-level BPE of 304 tokens) with two
    reserved special tokens at ids 304, 305 whose rows are zero (``add-tokens --init zeros``), as Llama-3
    base ships its reserved tokens."""
    out = tmp_path / "reserved"
    run = run_cli(
        ["add-tokens", str(SAMPLE), *SLOTS, "--special", "--init", "zeros", "--out", str(out), "-q"]
    )
    assert run.rc == 0, run.stderr
    return out


def test_cli_renames_keeping_every_row(reserved, tmp_path):
    """``rename-tokens CKPT 304=<think_x> 305=<tool_x> --special``: every tensor byte-identical, the
    tokenizer length unchanged, ``tokenizers`` encodes each new string as its slot's id and the old string
    no longer as it; the report names old and new; a warning says the kept rows are all zero."""
    out = tmp_path / "out"
    run = run_cli(
        ["rename-tokens", str(reserved), "304=<think_x>", "305=<tool_x>", "--special", "--out", str(out)]
    )
    assert run.rc == 0, run.stderr
    assert "all zero" in run.stdout + run.stderr
    a, b = casecheck.read_checkpoint(reserved), casecheck.read_checkpoint(out)
    assert {n: t.raw for n, t in a.tensors.items()} == {n: t.raw for n, t in b.tensors.items()}
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert [tok.encode(s, add_special_tokens=False).ids for s in ("<think_x>", "<tool_x>")] == [[304], [305]]
    assert tok.encode(SLOTS[0], add_special_tokens=False).ids != [304]
    assert tok.get_vocab_size(with_added_tokens=True) == tokenizer_set(reserved).length
    rep = json.loads((out / "tietool-report.json").read_text())["rename_tokens"]
    assert [(t["id"], t["old"], t["new"]) for t in rep["tokens"]] == [
        (304, SLOTS[0], "<think_x>"),
        (305, SLOTS[1], "<tool_x>"),
    ]


def test_cli_trained_mean_rows(reserved, tmp_path):
    """``--init trained-mean``: rows 304, 305 of the embedding and the head are the float64 mean of the
    other rows (numpy, independently), rounded to float32; every other row bit-identical."""
    out = tmp_path / "out"
    run = run_cli(
        ["rename-tokens", str(reserved), "304=<think_x>", "--init", "trained-mean", "--out", str(out), "-q"]
    )
    assert run.rc == 0, run.stderr
    a, b = casecheck.read_checkpoint(reserved), casecheck.read_checkpoint(out)
    for name in NAMES:
        x, y = a.decode(a.tensors[name]).astype(np.float32), b.decode(b.tensors[name]).astype(np.float32)
        rest = [i for i in range(x.shape[0]) if i not in (304, 305)]
        want = x[rest].astype(np.float64).mean(axis=0).astype(np.float32)
        assert np.array_equal(y[304], want), name
        keep = [i for i in range(x.shape[0]) if i != 304]
        assert np.array_equal(a.tensors[name].byte_view()[keep], b.tensors[name].byte_view()[keep]), name


def test_cli_refuses_a_trained_slot(reserved, tmp_path):
    """A base token (id 100) is not a reserved slot: exit 5 naming it, nothing written."""
    run = run_cli(["rename-tokens", str(reserved), "100=<x>", "--out", str(tmp_path / "o")])
    assert run.rc == 5 and "100" in run.stderr and "reserved" in run.stderr
    assert not (tmp_path / "o").exists()


def test_cli_refuses_a_folder_without_tokenizer(tmp_path):
    """A checkpoint with no tokenizer files: exit 5 saying so (not "id N is not a token"), nothing written."""
    bare = paths.SAMPLES / "pf_llama_tied_fp32"
    assert not any(p.name.startswith("tokenizer") or p.suffix == ".model" for p in bare.iterdir())
    run = run_cli(["rename-tokens", str(bare), "3=<x>", "--out", str(tmp_path / "o")])
    assert run.rc == 5 and "no tokenizer files" in run.stderr, run.stderr
    assert not (tmp_path / "o").exists()


def test_verify_explains_renames(reserved, tmp_path):
    """``verify`` of rename-tokens outputs: the renamed slots (reserved strings in the input, the new ones
    in the output, as the report says) and the trained-mean rows are explained (exit 0); the same output
    whose report claims the slot held another string is not (exit 7), nor one whose row 304 was changed
    to another value than the mean."""
    kept, mean = tmp_path / "kept", tmp_path / "mean"
    for out, extra in ((kept, []), (mean, ["--init", "trained-mean"])):
        run = run_cli(
            ["rename-tokens", str(reserved), "304=<think_x>", "--special", "--out", str(out), *extra]
        )
        assert run.rc == 0, run.stderr
        run = run_cli(["verify", str(reserved), str(out)])
        assert run.rc == 0, run.stdout
    forged = shutil.copytree(kept, tmp_path / "forged")
    p = forged / "tietool-report.json"
    rep = json.loads(p.read_text())
    rep["rename_tokens"]["tokens"][0]["old"] = "hello"
    p.write_text(json.dumps(rep))
    run = run_cli(["verify", str(reserved), str(forged)])
    assert run.rc == 7 and "<think_x>" in run.stdout, run.stdout
    tampered = shutil.copytree(mean, tmp_path / "tampered")
    st = next(tampered.glob("*.safetensors"))
    from support.hostile.history import copy_row

    copy_row(st, NAMES[0], 10, 304)
    run = run_cli(["verify", str(reserved), str(tampered)])
    assert run.rc == 7 and "unverifiable" in run.stdout, run.stdout


@pytest.fixture
def synced(reserved, tmp_path) -> dict[str, Path]:
    """Two ``--set-special`` outputs: the sample with reserved slots (plus a generation_config.json naming
    bos/eos/pad 300/302/300, as transformers writes one) with 304 renamed ``<|pad|>`` and 305 ``<|end|>``,
    made the pad and eos tokens; e01 (ERNIE 3.0, PaddleNLP) with ``[unused1]`` renamed ``<pad_x>``, made
    the pad token."""
    (reserved / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 300, "eos_token_id": 302, "pad_token_id": 300}, indent=2) + "\n"
    )
    hf = tmp_path / "hf"
    argv = ["rename-tokens", str(reserved), "304=<|pad|>", "305=<|end|>", "--special"]
    run = run_cli([*argv, "--set-special", "pad=<|pad|>", "--set-special", "eos=<|end|>", "--out", str(hf)])
    assert run.rc == 0, run.stderr
    e01 = shutil.copytree(E01, tmp_path / "e01")
    unused1 = {s: i for i, s in vocabulary(e01).items()}["[unused1]"]
    pn = tmp_path / "pnlp"
    argv = ["rename-tokens", str(e01), f"{unused1}=<pad_x>", "--special", "--set-special", "pad=<pad_x>"]
    run = run_cli([*argv, "--out", str(pn)])
    assert run.rc == 0, run.stderr
    return {"hf_in": reserved, "hf": hf, "e01_in": e01, "e01": pn}


def test_set_special_in_every_file(synced, tmp_path):
    """The ids in config.json and generation_config.json, the strings in tokenizer_config.json and
    special_tokens_map.json; transformers 5.3 and PaddleFormers 1.2 ``AutoTokenizer`` of the outputs they
    read give ``pad_token``/``pad_token_id`` (and ``eos``) as set, the other special tokens as before
    (neither reads e01's ErnieTokenizer folder: :func:`test_set_special_paddlenlp`); verify explains
    both."""
    hf = synced["hf"]
    cfg, gen = (json.loads((hf / n).read_text()) for n in ("config.json", "generation_config.json"))
    assert (cfg["pad_token_id"], cfg["eos_token_id"], cfg["bos_token_id"]) == (304, 305, 300)
    assert (gen["pad_token_id"], gen["eos_token_id"], gen["bos_token_id"]) == (304, 305, 300)
    jobs = [{"folder": str(synced[k]), "strings": [], "corpus": []} for k in ("hf_in", "hf", "e01_in", "e01")]
    before, got, e_before, _ = ts.tokenizer_loads(jobs, tmp_path / "loads")
    for lib in ("hf", "pf"):
        assert got[lib]["specials"]["pad"] == ["<|pad|>", 304], (lib, got[lib])
        assert got[lib]["specials"]["eos"] == ["<|end|>", 305], (lib, got[lib])
        assert got[lib]["specials"]["bos"] == before[lib]["specials"]["bos"]
    # neither reads e01's ErnieTokenizer folder (both fail on the input): PaddleNLP 2.8.1 is its loader
    assert not e_before["hf"].get("ok") and not e_before["pf"].get("ok")
    for k in ("hf", "e01"):
        run = run_cli(["verify", str(synced[f"{k}_in"]), str(synced[k])])
        assert run.rc == 0, run.stdout


@pytest.mark.pnlp
def test_set_special_paddlenlp(synced, tmp_path):
    """PaddleNLP 2.8.1 ``AutoTokenizer`` of the e01 output: ``pad_token`` ``<pad_x>`` at the slot's id, and
    the text ``<pad_x>`` encodes as that id."""
    pnlp_support.require()
    unused1 = {s: i for i, s in vocabulary(synced["e01_in"]).items()}["[unused1]"]
    (r,) = pnlp_support.run_jobs(
        [{"op": "encode", "dir": str(synced["e01"]), "texts": ["<pad_x>"]}], tmp_path
    )
    assert r["ok"], r
    assert r["specials"]["pad"] == ["<pad_x>", unused1] and r["ids"] == [[unused1]]


def test_set_special_refusals(reserved, tmp_path):
    """A token the tokenizer lacks, a name outside pad/bos/eos: exit 2, nothing written."""
    out = tmp_path / "o"
    run = run_cli(["rename-tokens", str(reserved), "--set-special", "pad=<|nope|>", "--out", str(out)])
    assert run.rc == 2 and "<|nope|>" in run.stderr and not out.exists()
    run = run_cli(["rename-tokens", str(reserved), "--set-special", "unk=<unk>", "--out", str(out)])
    assert run.rc == 2 and "pad, bos, eos" in run.stderr and not out.exists()


def test_set_special_refuses_a_template_bos_and_an_eos_list(tmp_path):
    """A bos that tokenizer.json's TemplateProcessing inserts by its string (sp_bpe_with_json: ``<s>``) is
    refused, naming the post-processor; an ``eos_token_id`` list in config.json is refused, naming it."""
    from tietool.surgery.io.special_tokens import special_config_sets, special_files

    folder, ids = _with_slots(TOK / "sp_bpe_with_json", tmp_path / "sp")
    with pytest.raises(RefusedError, match="post_processor"):
        special_files(folder, {"bos": (SLOTS[0], ids[0])}, {})
    assert special_files(folder, {"pad": (SLOTS[0], ids[0])}, {})  # pad: no template involved
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [1, 2], "pad_token_id": 0}))
    with pytest.raises(RefusedError, match="list"):
        special_config_sets(folder, {"eos": (SLOTS[0], ids[0])}, None)
    assert special_config_sets(folder, {"pad": (SLOTS[0], ids[0])}, None) == [
        ("config.json", "pad_token_id", ids[0])
    ]


def test_cli_subtoken_rows(reserved, tmp_path):
    """``--init subtokens``: each renamed row is the float64 mean of the input's rows of the ids its new
    string split into before (the split ``tokenizers`` gives the input, independently), as float32; every
    other row bit-identical; verify explains it (exit 0), and a report whose source ids were forged is
    unverifiable (exit 7)."""
    import tokenizers

    out = tmp_path / "out"
    run = run_cli(
        ["rename-tokens", str(reserved), "304=helloworld", "305=<x_y>", "--init", "subtokens"]
        + ["--out", str(out), "-q"]
    )
    assert run.rc == 0, run.stderr
    tok = tokenizers.Tokenizer.from_file(str(reserved / "tokenizer.json"))
    split = {i: tok.encode(s, add_special_tokens=False).ids for i, s in ((304, "helloworld"), (305, "<x_y>"))}
    rep = json.loads((out / "tietool-report.json").read_text())
    assert {t["id"]: t["source_ids"] for t in rep["rename_tokens"]["tokens"]} == split
    a, b = casecheck.read_checkpoint(reserved), casecheck.read_checkpoint(out)
    for name in NAMES:
        x, y = a.decode(a.tensors[name]).astype(np.float32), b.decode(b.tensors[name]).astype(np.float32)
        for i, src in split.items():
            assert np.array_equal(y[i], x[src].astype(np.float64).mean(axis=0).astype(np.float32)), (name, i)
        keep = [i for i in range(x.shape[0]) if i not in split]
        assert np.array_equal(a.tensors[name].byte_view()[keep], b.tensors[name].byte_view()[keep]), name
    assert run_cli(["verify", str(reserved), str(out)]).rc == 0
    forged = shutil.copytree(out, tmp_path / "forged")
    rep["rename_tokens"]["tokens"][0]["source_ids"] = [1, 2]
    (forged / "tietool-report.json").write_text(json.dumps(rep))
    run = run_cli(["verify", str(reserved), str(forged)])
    assert run.rc == 7 and "unverifiable" in run.stdout, run.stdout


def test_cli_refuses_one_string_for_two_ids(reserved, tmp_path):
    """``rename-tokens CKPT 304=<a> 305=<a>``: two slots given the same new string is exit 2, nothing written
    (before: exit 0, tokenizer.json held two added tokens '<a>' and ``tokenizers`` then had no token at
    id 305: ``id_to_token(305)`` None, the vocabulary one token short; verify said exit 0)."""
    snap = casecheck.snapshot_tree(reserved)
    run = run_cli(["rename-tokens", str(reserved), "304=<a>", "305=<a>", "--out", str(tmp_path / "o")])
    assert run.rc == 2 and "'<a>'" in run.stderr and "twice" in run.stderr, run.stderr
    assert not (tmp_path / "o").exists()
    assert casecheck.snapshot_tree(reserved) == snap


def test_cli_refuses_a_lone_surrogate(reserved, tmp_path):
    """A new string with a lone surrogate (a non-UTF-8 byte in an argument) is exit 2 naming it, as
    add-tokens refuses it (before: exit 70, ``UnicodeEncodeError: surrogates not allowed``)."""
    run = run_cli(["rename-tokens", str(reserved), "304=<a\udcff>", "--out", str(tmp_path / "o")])
    assert run.rc == 2 and "surrogate" in run.stderr, run.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("new", ["<a>\nb", "<a> ", "<a>\r"])
def test_cli_refuses_a_vocab_txt_line_break(new, tmp_path):
    """e01 (ERNIE 3, WordPiece vocab.txt): renaming [unused2] (id 6) to a string with a line break or
    trailing whitespace is exit 5 naming vocab.txt, nothing written (before: exit 0, the line break split
    line 6 in two, vocab.txt 24 -> 25 lines, every later id moved; verify then found 23 differences)."""
    e01 = Path(shutil.copytree(E01, tmp_path / "e01"))
    assert vocabulary(e01)[6] == "[unused2]"
    snap = casecheck.snapshot_tree(e01)
    run = run_cli(["rename-tokens", str(e01), f"6={new}", "--special", "--out", str(tmp_path / "o")])
    assert run.rc == 5 and "vocab.txt" in run.stderr, run.stderr
    assert not (tmp_path / "o").exists()
    assert casecheck.snapshot_tree(e01) == snap
