"""``prune``: a model and its tokenizer cut to a keep-list of token ids, judged by the libraries.

Tokenizers (the real ones of ``tests/data/tokenizers`` and ``tests/data/pnlp_tokenizers``, and a WordPiece
``tokenizer.json`` that ``tokenizers`` builds from ``wordpiece/vocab.txt``): the keep-list is the ids the
old tokenizer gives some corpus lines, plus (computed here from the merges, independently of tietool) the
tokens BPE passes through to reach them, the byte tokens of a byte-level BPE and the special tokens. The
pruned tokenizer, loaded by ``tokenizers``, transformers' and PaddleFormers' ``AutoTokenizer`` and
PaddleNLP 2.8.1's, encodes those lines to the old ids renumbered (each library compared with itself).

The model (the shipped sample ``pf_llama_with_tokenizer``, PaddleFormers 1.2, untied, byte-level BPE):
the kept rows of the embedding and the head are the old rows bit for bit, every other tensor is
bit-identical, the config's ids are renumbered; PaddleFormers 1.2's logits of the pruned model on the
renumbered batch equal the old logits at the kept columns bit for bit. Bad keep-files are one-line errors
with README's exit codes, the input untouched. ``verify`` explains real prune outputs (exit 0) and names a
forged row, a forged ``id_map`` entry and a dropped token left in ``tokenizer.json`` (exit 7).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import casecheck, paths, pnlp_support, preload
from support import tokmodel_support as ts
from support.fixture_support import logits_mismatch
from support.paths import CASES_DIR, INPUT_IDS
from support.resize_support import run_cli

from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.io.tokenizer_prune import BYTE_SYMBOLS, prune_tokenizer_edit
from tietool.surgery.model.errors import RefusedError

REPO = paths.REPO
DATA = REPO / "tests" / "data"
TOK, PNLP_TOK = DATA / "tokenizers", DATA / "pnlp_tokenizers"
SAMPLE = REPO / "sample_checkpoints" / "pf_llama_with_tokenizer"
PF_LOGITS = DATA / "tools" / "pf_logits.py"
LINES = [ln for ln in (TOK / "corpus.txt").read_text(encoding="utf-8").splitlines() if ln.strip()][:12]
FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)
EMB, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _copy(src: Path, dst: Path, names=FILES) -> Path:
    dst.mkdir(parents=True)
    for n in names:
        if (src / n).is_file():
            shutil.copy2(src / n, dst / n)
    return dst


def _wordpiece_json(dst: Path) -> Path:
    """A WordPiece ``tokenizer.json`` (BertWordPieceTokenizer of ``wordpiece/vocab.txt``, lower-cased)."""
    from tokenizers import BertWordPieceTokenizer

    folder = _copy(TOK / "wordpiece", dst, ("tokenizer_config.json", "special_tokens_map.json"))
    tok = BertWordPieceTokenizer(str(TOK / "wordpiece" / "vocab.txt"), lowercase=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "BertTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def _json_encode(folder: Path, lines: list[str], special: bool = False) -> list[list[int]]:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [tok.encode(s, add_special_tokens=special).ids for s in lines]


def _vocab_txt_encode(folder: Path, lines: list[str]) -> list[list[int]]:
    from tokenizers import BertWordPieceTokenizer

    lower = json.loads((folder / "tokenizer_config.json").read_text()).get("do_lower_case", True)
    tok = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=lower)
    return [tok.encode(s, add_special_tokens=False).ids for s in lines]


def _closure(folder: Path, keep: set[int]) -> set[int]:
    """``keep`` plus every token BPE passes through to make a kept token (the merges' parts, recursively)
    and, for a byte-level BPE, its byte tokens: computed from ``tokenizer.json`` alone."""
    if not (folder / "tokenizer.json").is_file():
        return keep
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = tj["model"]
    if model["type"] != "BPE":
        return keep
    vocab = model["vocab"]
    parts: dict[int, list[int]] = {}
    for m in model["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        parts.setdefault(vocab[a + b], []).extend([vocab[a], vocab[b]])
    out, todo = set(keep), list(keep)
    while todo:
        for p in parts.get(todo.pop(), []):
            if p not in out:
                out.add(p)
                todo.append(p)
    if "ByteLevel" in json.dumps(tj["pre_tokenizer"]):
        out |= {i for t, i in vocab.items() if t in BYTE_SYMBOLS}
    return out


def _specials(folder: Path) -> set[int]:
    ids: set[int] = set()
    if (folder / "tokenizer.json").is_file():
        tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        ids |= {a["id"] for a in tj["added_tokens"]}
        vocab = tj["model"]["vocab"]
        if tj["model"].get("unk_token") in vocab:
            ids.add(vocab[tj["model"]["unk_token"]])
    if (folder / "vocab.txt").is_file():
        lines = (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()
        ids |= {i for i, t in enumerate(lines) if t.startswith("[") and t.endswith("]")}
    return ids


SOURCES = {
    "bytelevel_bpe": lambda d: _copy(TOK / "bytelevel_bpe", d),
    "sp_bpe_json_only": lambda d: _copy(TOK / "sp_bpe_with_json", d),
    "wordpiece_txt": lambda d: _copy(TOK / "wordpiece", d),
    "wordpiece_json": _wordpiece_json,
    "ernie_wordpiece": lambda d: _copy(PNLP_TOK / "ernie_wordpiece", d),
}
UNREAD = {
    ("ernie_wordpiece", "hf"),
    ("ernie_wordpiece", "pf"),
}  # no ErnieTokenizer vocab.txt reader (input fails too)
PNLP_READS = ("wordpiece_txt", "ernie_wordpiece")  # folders PaddleNLP 2.8.1's AutoTokenizer reads


@pytest.fixture(scope="module")
def pruned(tmp_path_factory) -> dict[str, dict]:
    """Per source: the input and pruned folders, the keep-list, and the HF / PaddleFormers encodings of
    :data:`LINES` in both."""
    root = tmp_path_factory.mktemp("prune")
    out: dict[str, dict] = {}
    for name, make in SOURCES.items():
        inp = make(root / name / "in")
        out[name] = {"input": inp}
    loads = ts.tokenizer_loads(
        [{"folder": str(x["input"]), "strings": LINES, "corpus": []} for x in out.values()], root / "hf-old"
    )
    for (_name, x), r in zip(out.items(), loads, strict=True):
        used = {i for lib in ("hf", "pf") if r[lib]["ok"] for enc in r[lib]["strings"] for i in enc}
        if (x["input"] / "tokenizer.json").is_file():
            used |= {i for enc in _json_encode(x["input"], LINES) for i in enc}
        if (
            x["input"] / "vocab.txt"
        ).is_file():  # what PaddleNLP's WordPiece gives too (greedy longest match)
            used |= {i for enc in _vocab_txt_encode(x["input"], LINES) for i in enc}
        keep = sorted(_closure(x["input"], used | _specials(x["input"])))
        outp = _copy(x["input"], x["input"].parent / "out")
        edit = prune_tokenizer_edit(outp, keep)
        assert edit is not None
        for n, blob in edit.files.items():
            (outp / n).write_bytes(blob)
        x.update(output=outp, keep=keep, old=r)
    new = ts.tokenizer_loads(
        [{"folder": str(x["output"]), "strings": LINES, "corpus": []} for x in out.values()], root / "hf-new"
    )
    for x, r in zip(out.values(), new, strict=True):
        x["new"] = r
    return out


def _mapped(keep: list[int], encs: list[list[int]]) -> list[list[int]]:
    new_id = {o: n for n, o in enumerate(keep)}
    return [[new_id[i] for i in enc] for enc in encs]


@pytest.mark.parametrize("name", [n for n in SOURCES if n not in ("wordpiece_txt", "ernie_wordpiece")])
def test_tokenizers_library_encodes_kept_text_to_the_renumbered_ids(pruned, name):
    x = pruned[name]
    old = _json_encode(x["input"], LINES)
    assert len(x["keep"]) < len(json.loads((x["input"] / "tokenizer.json").read_text())["model"]["vocab"])
    assert _json_encode(x["output"], LINES) == _mapped(x["keep"], old)
    # the post-processor's special tokens ([CLS]/[SEP] of WordPiece, <s> of the converted BPE) renumbered
    with_specials = _json_encode(x["input"], LINES, special=True)
    assert _json_encode(x["output"], LINES, special=True) == _mapped(x["keep"], with_specials)


@pytest.mark.parametrize("lib", ["hf", "pf"])
@pytest.mark.parametrize("name", list(SOURCES))
def test_auto_tokenizers_encode_kept_text_to_the_renumbered_ids(pruned, name, lib):
    """transformers 5.3 and PaddleFormers 1.2 ``AutoTokenizer``: each library's old encoding renumbered;
    ``len(tokenizer)`` is the kept count."""
    x = pruned[name]
    old, new = x["old"][lib], x["new"][lib]
    if (name, lib) in UNREAD:
        assert not old["ok"] and not new["ok"]
        return
    assert old["ok"] and new["ok"], (old.get("error"), new.get("error"))
    assert new["strings"] == _mapped(x["keep"], old["strings"])
    assert new["len"] == len(x["keep"])


@pytest.mark.pnlp
def test_paddlenlp_encodes_kept_text_to_the_renumbered_ids(pruned, tmp_path):
    pnlp_support.require()
    jobs = [
        {"op": "encode", "dir": str(pruned[n][k]), "texts": LINES}
        for n in PNLP_READS
        for k in ("input", "output")
    ]
    res = pnlp_support.run_jobs(jobs, tmp_path)
    assert all(r["ok"] for r in res), res
    for j, n in enumerate(PNLP_READS):
        old, new = res[2 * j], res[2 * j + 1]
        assert new["ids"] == _mapped(pruned[n]["keep"], old["ids"])
        assert new["len"] == len(pruned[n]["keep"])


def test_refusals_of_the_tokenizer_edit(tmp_path):
    """A byte-level BPE losing a byte token, a kept token merged from a dropped one, a SentencePiece model
    losing a control piece or a piece its BPE merges into a kept one, a tiktoken file: refused, naming
    them."""
    bl = _copy(TOK / "bytelevel_bpe", tmp_path / "bl")
    with pytest.raises(RefusedError, match="byte token"):
        prune_tokenizer_edit(bl, list(range(1, 304)))
    model = json.loads((bl / "tokenizer.json").read_text())["model"]
    vocab = model["vocab"]
    a, b = next(m for m in model["merges"] if vocab[m[0]] >= 256 or vocab[m[1]] >= 256)
    with pytest.raises(RefusedError, match="merged from") as e:
        prune_tokenizer_edit(bl, [*range(256), vocab[a + b], 300, 301, 302, 303])
    assert e.value.fix is not None and "add these ids" in e.value.fix
    sp = _copy(TOK / "sp_bpe", tmp_path / "sp", ("tokenizer.model", "tokenizer_config.json"))
    with pytest.raises(RefusedError, match=r"must stay would be dropped \(1 '<s>' \(a control piece\)\)"):
        prune_tokenizer_edit(sp, [0, 2, 3])
    import sentencepiece as spm

    proc = spm.SentencePieceProcessor(model_file=str(sp / "tokenizer.model"))
    pieces = {proc.id_to_piece(i): i for i in range(proc.get_piece_size())}
    long = next(
        i
        for p, i in pieces.items()
        if i > 2 and any(p[:k] in pieces and p[k:] in pieces for k in range(1, len(p)))
    )
    with pytest.raises(RefusedError, match="can be merged from") as e:
        prune_tokenizer_edit(sp, [0, 1, 2, long])
    assert e.value.fix is not None and "add these ids" in e.value.fix
    tt = _copy(TOK / "tiktoken", tmp_path / "tt", ("qwen.tiktoken", "tokenizer_config.json"))
    with pytest.raises(RefusedError, match="qwen.tiktoken"):
        prune_tokenizer_edit(tt, [0, 1, 2])


# ------------------------------------------------------------------------------------------------ the model


def _keep_for_sample() -> list[int]:
    """The sample's keep-list: the ids of :data:`LINES` and of the fixed logits batch, their BPE closure and
    byte tokens, the four added tokens (bos/pad 300, eos 302)."""
    used = {i for enc in _json_encode(SAMPLE, LINES) for i in enc} | set(np.load(INPUT_IDS).ravel().tolist())
    return sorted(_closure(SAMPLE, used | {300, 301, 302, 303}))


def _hashes(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


@pytest.fixture(scope="module")
def sample_pruned(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sample")
    keep = _keep_for_sample()
    (root / "keep.txt").write_text("".join(f"{i}\n" for i in keep))
    run = run_cli(
        ["prune", str(SAMPLE), "--keep-ids", str(root / "keep.txt"), "--out", str(root / "out"), "--json"]
    )
    assert run.rc == 0, run.stderr
    return {"out": root / "out", "keep": keep, "report": json.loads(run.stdout), "root": root}


def test_kept_rows_bit_for_bit_and_the_rest_untouched(sample_pruned):
    a, b = casecheck.read_checkpoint(SAMPLE), casecheck.read_checkpoint(sample_pruned["out"])
    keep = sample_pruned["keep"]
    for n in (EMB, HEAD):
        assert b.tensors[n].shape == (len(keep), a.tensors[n].shape[1])
        assert np.array_equal(b.tensors[n].byte_view(), a.tensors[n].byte_view()[keep])
    others = set(a.tensors) - {EMB, HEAD}
    assert others == set(b.tensors) - {EMB, HEAD}
    assert all(a.tensors[n].raw == b.tensors[n].raw for n in others)
    cfg = json.loads((sample_pruned["out"] / "config.json").read_text())
    new_id = {o: n for n, o in enumerate(keep)}
    assert cfg["vocab_size"] == len(keep)
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (
        new_id[300],
        new_id[302],
        new_id[300],
    )
    rep = sample_pruned["report"]["prune"]
    assert rep["id_map"] == {str(o): n for o, n in new_id.items()} and rep["rows_before"] == 320


@pytest.mark.slow
def test_pruned_model_logits_equal_the_old_at_the_kept_ids(sample_pruned):
    """PaddleFormers 1.2: the pruned model on the renumbered batch gives the old logits at the kept
    columns, bit for bit."""
    root, keep = sample_pruned["root"], sample_pruned["keep"]
    new_id = {o: n for n, o in enumerate(keep)}
    ids = np.load(INPUT_IDS)
    np.save(root / "new_ids.npy", np.vectorize(new_id.__getitem__)(ids).astype(np.int64))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    got = {}
    for tag, ck, batch in (("old", SAMPLE, INPUT_IDS), ("new", sample_pruned["out"], root / "new_ids.npy")):
        work = root / f"logits-{tag}"
        shutil.copytree(ck, work)
        cp = preload.run(
            [
                sys.executable,
                str(PF_LOGITS),
                str(work),
                "LlamaForCausalLM",
                str(batch),
                str(root / f"{tag}.npy"),
            ],
            libs=preload.PADDLEFORMERS,
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=900,
        )
        assert (root / f"{tag}.npy").is_file(), cp.stdout[-2000:] + cp.stderr[-2000:]
        got[tag] = np.load(root / f"{tag}.npy")
    assert got["new"].shape[-1] == len(keep)
    assert logits_mismatch(got["new"], got["old"][..., keep]) is None


def test_dry_run_writes_nothing(tmp_path):
    (tmp_path / "keep.json").write_text(json.dumps(_keep_for_sample()))
    run = run_cli(
        [
            "prune",
            str(SAMPLE),
            "--keep-ids",
            str(tmp_path / "keep.json"),
            "--out",
            str(tmp_path / "o"),
            "--dry-run",
        ]
    )
    assert run.rc == 0, run.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("content", "code", "says"),
    [
        ("[0, 1, 320]", 2, "outside the vocabulary"),
        ("[]", 2, "no token ids"),
        ("0\n1\nx\n", 2, "not a token id"),
        ("DROP_EOS", 5, "eos_token_id = 302"),
    ],
)
def test_bad_keep_files(tmp_path, content, code, says):
    """One-line error with README's exit code (2 usage, 5 refused); the input untouched."""
    ck = shutil.copytree(SAMPLE, tmp_path / "ck")
    before = _hashes(ck)
    if content == "DROP_EOS":
        content = json.dumps([i for i in _keep_for_sample() if i != 302])
    (tmp_path / "keep").write_text(content)
    run = run_cli(["prune", str(ck), "--keep-ids", str(tmp_path / "keep")])
    assert run.rc == code, (run.rc, run.stderr)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], run.stderr
    if code == 2:  # a bad keep-file is named first, as the fix is in it
        assert lines[0].startswith(f"tietool: error: {tmp_path / 'keep'}: "), lines[0]
    assert _hashes(ck) == before


@pytest.mark.pnlp
@pytest.mark.parametrize(("name", "family"), [("pnlp_llama_untied", "llama"), ("pnlp_bert_mlm", "bert")])
def test_paddlenlp_loads_the_pruned_model(tmp_path, name, family):
    """PaddleNLP 2.8.1 (pdparams; a ``[hidden, vocab]`` Llama head, a BERT decoder with its bias; no
    tokenizer files: pruned with a warning): the loaded embedding, head and bias are the old ones at the
    kept ids, and the logits on its fixed batch (every id below 48, all kept, renumbered to themselves)
    are the old logits at the kept columns, bit for bit."""
    pnlp_support.require()
    src = CASES_DIR / name
    keep = [*range(48), 60, 75, 89]
    (tmp_path / "keep").write_text(json.dumps(keep))
    run = run_cli(["prune", str(src), "--keep-ids", str(tmp_path / "keep"), "--out", str(tmp_path / "out")])
    assert run.rc == 0, run.stderr
    assert "no tokenizer files" in run.stderr + run.stdout
    jobs = [
        {"op": "load", "family": family, "dir": str(d), "npz": str(tmp_path / f"{t}.npz")}
        for t, d in (("old", src), ("new", tmp_path / "out"))
    ]
    res = pnlp_support.run_jobs(jobs, tmp_path / "pnlp")
    assert all(r["ok"] for r in res), res
    a, b = (np.load(j["npz"]) for j in jobs)
    assert np.array_equal(b["embedding"], a["embedding"][keep])
    axis = 1 if a["head"].shape[0] != a["embedding"].shape[0] else 0
    assert np.array_equal(b["head"], np.take(a["head"], keep, axis=axis))
    if "bias" in a:
        assert np.array_equal(b["bias"], a["bias"][..., keep])
    assert logits_mismatch(b["logits"], a["logits"][..., keep]) is None
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["vocab_size"] == len(keep)


def test_keep_special_adds_the_byte_and_added_tokens(tmp_path):
    """``--keep-special`` on a keep-list of the merged tokens alone: the 256 byte tokens and the four added
    tokens are kept too (the same keep-list without it is refused for the byte tokens)."""
    keep = [i for i in _keep_for_sample() if 256 <= i < 300]
    (tmp_path / "keep").write_text(json.dumps(keep))
    bare = run_cli(["prune", str(SAMPLE), "--keep-ids", str(tmp_path / "keep"), "--dry-run"])
    assert bare.rc == 5, bare.stderr
    run = run_cli(
        ["prune", str(SAMPLE), "--keep-ids", str(tmp_path / "keep"), "--keep-special", "--dry-run", "--json"]
    )
    assert run.rc == 0, run.stderr
    id_map = json.loads(run.stdout)["prune"]["id_map"]
    assert sorted(map(int, id_map)) == sorted({*range(256), *keep, 300, 301, 302, 303})


def test_tied_model_stays_tied(tmp_path):
    """pf_llama_tied_fp32 (PaddleFormers 1.2, tied, the head stored too, no tokenizer files): the pruned
    embedding is the old one at the kept rows; a head still written equals it."""
    keep = [*range(40), 50, 90]
    (tmp_path / "keep").write_text(json.dumps(keep))
    run = run_cli(
        [
            "prune",
            str(CASES_DIR / "pf_llama_tied_fp32"),
            "--keep-ids",
            str(tmp_path / "keep"),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert run.rc == 0, run.stderr
    a, b = (
        casecheck.read_checkpoint(CASES_DIR / "pf_llama_tied_fp32"),
        casecheck.read_checkpoint(tmp_path / "o"),
    )
    assert np.array_equal(b.tensors[EMB].byte_view(), a.tensors[EMB].byte_view()[keep])
    if HEAD in b.tensors:
        assert b.tensors[HEAD].raw == b.tensors[EMB].raw


def test_keep_corpus(tmp_path):
    """``--keep-corpus``: the sample pruned to the tokens of some corpus lines (plus specials and bytes);
    ``tokenizers``, transformers 5.3 and PaddleFormers 1.2 encode those lines to the old ids renumbered.
    Neither a keep-list nor a corpus, or both: a usage error."""
    (tmp_path / "corpus.txt").write_text("\\n".join(LINES[:6]) + "\\n", encoding="utf-8")
    out = tmp_path / "o"
    run = run_cli(
        ["prune", str(SAMPLE), "--keep-corpus", str(tmp_path / "corpus.txt"), "--out", str(out), "--json"]
    )
    assert run.rc == 0, run.stderr
    keep = sorted(map(int, json.loads(run.stdout)["prune"]["id_map"]))
    assert {300, 301, 302, 303} <= set(keep) and len(keep) < 300
    assert _json_encode(out, LINES[:6]) == _mapped(keep, _json_encode(SAMPLE, LINES[:6]))
    loads = ts.tokenizer_loads(
        [{"folder": str(f), "strings": LINES[:6], "corpus": []} for f in (SAMPLE, out)], tmp_path / "hf"
    )
    for lib in ("hf", "pf"):
        old, new = loads[0][lib], loads[1][lib]
        assert old["ok"] and new["ok"], (old.get("error"), new.get("error"))
        assert new["strings"] == _mapped(keep, old["strings"])
    assert run_cli(["prune", str(SAMPLE), "--dry-run"]).rc == 2


# ------------------------------------------------------------------------------------------------ verify


def _verify(a: Path, b: Path) -> tuple[int, str]:
    run = run_cli(["verify", str(a), str(b)])
    return run.rc, run.stdout + run.stderr


def _flip(folder: Path, name: str, element: int) -> None:
    """Flip the lowest bit of element ``element`` (row-major) of tensor ``name`` in the safetensors file of
    ``folder`` that holds it, in place (the header untouched)."""
    for f in sorted(folder.glob("*.safetensors")):
        raw = bytearray(f.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        head = json.loads(raw[8 : 8 + n])
        if name in head:
            size = np.dtype({"F32": "f4", "BF16": "u2", "F16": "f2"}[head[name]["dtype"]]).itemsize
            raw[8 + n + head[name]["data_offsets"][0] + element * size] ^= 1
            f.write_bytes(bytes(raw))
            return
    raise AssertionError(f"{name} not found in {folder}")


def _forged(sample_pruned, tmp_path: Path) -> Path:
    out = tmp_path / "forged"
    shutil.copytree(sample_pruned["out"], out)
    return out


def test_verify_explains_the_sample_prune(sample_pruned):
    """``verify`` of the sample and its pruned output: exit 0, the embedding and the head checked entry by
    entry at the kept ids, the other ten tensors bit-identical."""
    run = run_cli(["verify", str(SAMPLE), str(sample_pruned["out"]), "--json"])
    assert run.rc == 0, run.stdout + run.stderr
    res = json.loads(run.stdout)
    assert {r["name"] for r in res["resized"]} == {EMB, HEAD}
    assert all(r["common_part_identical"] for r in res["resized"])
    assert res["identical_tensors"] == len(casecheck.read_checkpoint(SAMPLE).tensors) - 2


@pytest.mark.parametrize("name", ["pnlp_llama_untied", "pnlp_bert_mlm", "pf_llama_tied_fp32"])
def test_verify_explains_a_prune_of_pdparams_and_tied_cases(tmp_path, name):
    """PaddleNLP pdparams (a ``[hidden, vocab]`` Llama head; a BERT decoder bias and its tied decoder
    weight) and a tied PaddleFormers model: the prune output verifies (exit 0), every vocabulary tensor
    checked at the kept ids (BERT's bias among them), the tied copy dropped as equal to the embedding."""
    src = CASES_DIR / name
    keep = [*range(48), 60, 75, 89]
    (tmp_path / "keep").write_text(json.dumps(keep))
    assert (
        run_cli(["prune", str(src), "--keep-ids", str(tmp_path / "keep"), "--out", str(tmp_path / "o")]).rc
        == 0
    )
    run = run_cli(["verify", str(src), str(tmp_path / "o"), "--json"])
    assert run.rc == 0, run.stdout + run.stderr
    res = json.loads(run.stdout)
    cut = {r["name"]: r for r in res["resized"]}
    assert all(r["common_part_identical"] and r["shape_before"] != r["shape_after"] for r in cut.values())
    if name == "pnlp_bert_mlm":
        assert "cls.predictions.decoder_bias" in cut and res["dropped"][0]["equals_embedding"]
    if name == "pnlp_llama_untied":
        assert cut["lm_head.weight"]["shape_after"][1] == len(keep)


def test_verify_names_a_forged_row(sample_pruned, tmp_path):
    """One flipped bit in kept row 5 of the pruned embedding: exit 7, the row and its old id named."""
    out = _forged(sample_pruned, tmp_path)
    width = casecheck.read_checkpoint(SAMPLE).tensors[EMB].shape[1]
    _flip(out, EMB, 5 * width + 3)
    rc, said = _verify(SAMPLE, out)
    keep = sample_pruned["keep"]
    assert rc == 7 and f"{EMB}: row 5 is not the input's row {keep[5]}" in said, said


def test_verify_names_a_forged_id_map_entry(sample_pruned, tmp_path):
    """The report's id_map sends a dropped id (next to a kept one) to that kept one's new id: the rows at
    that new id contradict it, exit 7 naming the row."""
    out = _forged(sample_pruned, tmp_path)
    keep = sample_pruned["keep"]
    j = next(j for j in range(len(keep) - 1) if keep[j] + 1 < keep[j + 1])
    rep = json.loads((out / "tietool-report.json").read_text())
    id_map = rep["prune"]["id_map"]
    del id_map[str(keep[j])]
    id_map[str(keep[j] + 1)] = j
    (out / "tietool-report.json").write_text(json.dumps(rep))
    rc, said = _verify(SAMPLE, out)
    assert rc == 7 and f"row {j} is not the input's row {keep[j] + 1}" in said, said


def test_verify_names_a_dropped_token_left_in_tokenizer_json(sample_pruned, tmp_path):
    """A dropped token written back into the pruned tokenizer.json's vocabulary: exit 7, the token named."""
    out = _forged(sample_pruned, tmp_path)
    keep = set(sample_pruned["keep"])
    tj = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    old = json.loads((SAMPLE / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    tok = next(s for s, i in old.items() if i not in keep)
    tj["model"]["vocab"][tok] = len(keep)
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    rc, said = _verify(SAMPLE, out)
    assert rc == 7 and f"{tok!r} (id {len(keep)}) is a token the prune dropped" in said, said


def test_verify_of_a_prune_then_resize_chain(sample_pruned, tmp_path):
    """Prune then resize: the history keeps the prune's id_map, so verify of the original against the end
    explains the chain (exit 0), as each step on its own; a row of the end flipped is exit 7 naming it."""
    out = tmp_path / "grown"
    run = run_cli(
        [
            "resize",
            str(sample_pruned["out"]),
            "--vocab",
            str(len(sample_pruned["keep"]) + 4),
            "--out",
            str(out),
        ]
    )
    assert run.rc == 0, run.stderr
    rc, said = _verify(SAMPLE, out)
    assert rc == 0 and "pruned to the" in said, said
    assert _verify(sample_pruned["out"], out)[0] == 0
    from support.hostile.history import copy_row

    copy_row(out / Checkpoint.open(out).tensors[HEAD].file, HEAD, 1, 0)
    rc, said = _verify(SAMPLE, out)
    assert rc == 7 and HEAD in said, said


def test_verify_names_a_tokenizer_file_the_output_lost(sample_pruned, tmp_path):
    """The pruned output without its tokenizer.json: exit 7, the file named."""
    out = _forged(sample_pruned, tmp_path)
    (out / "tokenizer.json").unlink()
    rc, said = _verify(SAMPLE, out)
    assert rc == 7 and "tokenizer.json is only in the input" in said, said


@pytest.mark.parametrize("tok", ["sp_unigram", "sp_bpe", "gpt2_bpe"])
def test_keep_corpus_of_a_sentencepiece_or_gpt2_checkpoint_verifies(tmp_path, tok):
    """The sample's weights with a SentencePiece (Unigram, BPE) or GPT-2 ``vocab.json`` tokenizer:
    ``--keep-corpus`` prunes the model file with the rows; ``sentencepiece`` / transformers' GPT-2 split of
    the corpus lines is the old one renumbered; ``verify`` explains the output (exit 0) and names a dropped
    piece written back into the model file, or a dropped merge back into merges.txt (exit 7)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    for f in SAMPLE.iterdir():
        if f.name == "config.json" or ".safetensors" in f.name:
            shutil.copy2(f, ck / f.name)
    for f in (TOK / tok).iterdir():  # a Unigram model with a tokenizer_config.json is refused (transformers
        if tok != "sp_unigram" or f.name.endswith(".model"):  # and PaddleFormers split it apart): the
            shutil.copy2(f, ck / f.name)  # model file alone, as sentencepiece reads it
    (tmp_path / "corpus.txt").write_text("\n".join(LINES[:5]) + "\n", encoding="utf-8")
    out = tmp_path / "o"
    run = run_cli(
        ["prune", str(ck), "--keep-corpus", str(tmp_path / "corpus.txt"), "--out", str(out), "--json"]
    )
    assert run.rc == 0, run.stderr
    keep = sorted(map(int, json.loads(run.stdout)["prune"]["id_map"]))
    if tok.startswith("sp"):
        import sentencepiece as spm

        old, new = (spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model")) for d in (ck, out))
        assert new.get_piece_size() == len([i for i in keep if i < old.get_piece_size()])
        assert new.encode(LINES[:5]) == _mapped(keep, old.encode(LINES[:5]))
    else:
        from tokenizers import ByteLevelBPETokenizer

        old, new = (ByteLevelBPETokenizer(str(d / "vocab.json"), str(d / "merges.txt")) for d in (ck, out))
        assert [e.ids for e in new.encode_batch(LINES[:5])] == _mapped(
            keep, [e.ids for e in old.encode_batch(LINES[:5])]
        )
    assert _verify(ck, out)[0] == 0
    if tok.startswith("sp"):
        from sentencepiece import sentencepiece_model_pb2 as pb

        m = pb.ModelProto()
        m.ParseFromString((ck / "tokenizer.model").read_bytes())
        dropped = next(p for i, p in enumerate(m.pieces) if i not in set(keep))
        forged = pb.ModelProto()
        forged.ParseFromString((out / "tokenizer.model").read_bytes())
        forged.pieces.add().CopyFrom(dropped)
        (out / "tokenizer.model").write_bytes(forged.SerializeToString())
        rc, said = _verify(ck, out)
        assert rc == 7 and repr(dropped.piece) in said, said
    else:
        merges = (ck / "merges.txt").read_text(encoding="utf-8").splitlines()
        gone = next(m for m in merges[1:] if m not in (out / "merges.txt").read_text(encoding="utf-8"))
        with (out / "merges.txt").open("a", encoding="utf-8") as f:
            f.write(gone + "\n")
        rc, said = _verify(ck, out)
        assert rc == 7 and "merges.txt has" in said, said
