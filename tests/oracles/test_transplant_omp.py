"""``transplant --init omp``: the sample ``pf_llama_with_tokenizer`` (untied, 304 tokens in 320 rows,
hidden 16) given the SentencePiece tokenizer ``sp_bpe`` (250 tokens, 97 shared) with a donor model of that
vocabulary: a real PaddleFormers checkpoint (``pf_llama_untied_sharded``: hidden 32, float32, two shards,
``[vocab, hidden]`` head) or a real PaddleNLP one (``pnlp_llama_untied_bf16``: hidden 16, bfloat16,
``[hidden, vocab]`` head), each resized to 250 rows (new rows drawn from normal(initializer_range)) and
given ``sp_bpe``'s files.

The oracle is orthogonal matching pursuit written here from its definition as mergekit's ``batch_omp``
(``mergekit/tokensurgeon/omp.py`` at a6e40288) computes it, independently of tietool's QR transcription: at
each of ``k`` steps the shared token whose donor row has the largest absolute inner product with the
residual (chosen ones excluded, the first of equals), then the coefficients the float64 least-squares fit
(``numpy.linalg.lstsq``) of the target over the chosen rows, the residual the target minus that fit; the
new row ``coef @ old_rows[chosen]`` of the old model's rows (mergekit's ``compute_new_embeddings``). The
embedding is approximated from the donor's embedding, the head from the donor's head (mergekit approximates
each table it rebuilds on its own). Shared tokens keep their rows bit for bit. ``verify`` explains each
output, recomputing the coefficients from the donor model, and names a forged coefficient and a forged row.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import casecheck, paths
from support.paths import CASES_DIR
from support.resize_support import run_cli

TOK = paths.REPO / "tests" / "data" / "tokenizers"
SAMPLE = paths.REPO / "sample_checkpoints" / "pf_llama_with_tokenizer"
EMB, HEAD = "model.embed_tokens.weight", "lm_head.weight"
DONORS = {"pf_sharded_h32": "pf_llama_untied_sharded", "pnlp_bf16_h16": "pnlp_llama_untied_bf16"}
K = 8


def _f32(ck, name: str, head_axis: int = 0) -> np.ndarray:
    """Tensor ``name`` of :func:`casecheck.read_checkpoint` ``ck`` as float32 ``[vocab, hidden]``."""
    t = ck.tensors[name]
    if t.label in ("bfloat16", "BF16", "U16", "uint16"):
        a = (np.frombuffer(t.raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        a = np.frombuffer(t.raw, dtype=np.float32)
    a = a.reshape(t.shape)
    return a.T if head_axis else a


def _reference_omp(target: np.ndarray, atoms: np.ndarray, k: int) -> tuple[list[int], np.ndarray]:
    """OMP from its definition (module docstring): ``(chosen rows of atoms, float64 coefficients)``."""
    t = target.astype(np.float64)
    A = atoms.astype(np.float64)
    chosen: list[int] = []
    res, coef = t, np.zeros(0)
    for _ in range(k):
        score = np.abs(A @ res)
        score[chosen] = -np.inf
        chosen.append(int(np.argmax(score)))
        coef = np.linalg.lstsq(A[chosen].T, t, rcond=None)[0]
        res = t - A[chosen].T @ coef
    return chosen, coef


def _donor(src: str, root: Path) -> Path:
    """``src`` resized to ``sp_bpe``'s 250 tokens, with its tokenizer files."""
    out = root / src
    run = run_cli(
        [
            "resize",
            str(CASES_DIR / src),
            "--vocab",
            "250",
            "--init",
            "normal",
            "--seed",
            "0",
            "--out",
            str(out),
        ]
    )
    assert run.rc == 0, run.stderr
    for f in (TOK / "sp_bpe").iterdir():
        shutil.copy2(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("omp")
    got = {}
    for tag, src in DONORS.items():
        donor, out = _donor(src, root), root / f"out-{tag}"
        run = run_cli(
            ["transplant", str(SAMPLE), "--tokenizer", str(TOK / "sp_bpe"), "--init", "omp"]
            + ["--donor-model", str(donor), "--k", str(K), "--out", str(out), "--json"]
        )
        assert run.rc == 0, run.stderr
        got[tag] = {"donor": donor, "out": out, "report": json.loads(run.stdout)}
    return got


def _donor_tables(donor: Path) -> dict[str, np.ndarray]:
    """The donor's embedding and head as ``[vocab, hidden]`` float32 (a PaddleNLP head is transposed)."""
    ck = casecheck.read_checkpoint(donor)
    emb = next(n for n in ck.tensors if n.endswith("embed_tokens.weight"))
    head = next(n for n in ck.tensors if n.endswith("lm_head.weight"))
    axis = 1 if ck.tensors[head].shape[0] != 250 else 0
    return {"embedding": _f32(ck, emb), "head": _f32(ck, head, axis)}


@pytest.mark.parametrize("tag", list(DONORS))
def test_omp_rows_are_mergekits_omp_of_the_donor(outputs, tag):
    """Each made row: the chosen shared tokens are the reference's, the coefficients its least squares
    (within 1e-4 of the largest), the row those coefficients on the old rows (float64, within 1e-6); the
    embedding from the donor's embedding, the head from the donor's head."""
    sec = outputs[tag]["report"]["transplant"]
    made = sec["made"]
    shared = [j for j, m in enumerate(made) if m.startswith("kept ")]
    old_id = {j: int(made[j].split()[1]) for j in shared}
    at = [j for j, m in enumerate(made) if m == "omp"]
    assert len(shared) == 97 and len(at) == 153 and sec["counts"]["omp"] == 153 and sec["omp"]["k"] == K
    donor = _donor_tables(outputs[tag]["donor"])
    a, b = casecheck.read_checkpoint(SAMPLE), casecheck.read_checkpoint(outputs[tag]["out"])
    for table, name in (("embedding", EMB), ("head", HEAD)):
        old, new = _f32(a, name), _f32(b, name)
        for n, j in enumerate(at):
            chosen, coef = _reference_omp(donor[table][j], donor[table][shared], K)
            assert sec["omp"][table]["ids"][n] == [old_id[shared[i]] for i in chosen], (table, j)
            got = np.array(sec["omp"][table]["coef"][n])
            assert np.allclose(got, coef, rtol=0, atol=1e-4 * np.abs(coef).max()), (table, j)
            want = coef @ old[[old_id[shared[i]] for i in chosen]].astype(np.float64)
            assert np.allclose(new[j], want, rtol=0, atol=1e-6 * max(1.0, np.abs(want).max())), (table, j)


@pytest.mark.parametrize("tag", list(DONORS))
def test_shared_rows_bit_exact_and_made_rows_as_the_report_says(outputs, tag):
    """Shared tokens keep their old rows bit for bit; each omp row is the report's coefficients on the
    old rows, float64 products added in order and rounded once, bit for bit; the other tensors untouched."""
    sec = outputs[tag]["report"]["transplant"]
    a, b = casecheck.read_checkpoint(SAMPLE), casecheck.read_checkpoint(outputs[tag]["out"])
    at = [j for j, m in enumerate(sec["made"]) if m == "omp"]
    for table, name in (("embedding", EMB), ("head", HEAD)):
        old, new = _f32(a, name), _f32(b, name)
        for j, m in enumerate(sec["made"]):
            if m.startswith("kept "):
                assert new[j].view(np.uint32).tolist() == old[int(m.split()[1])].view(np.uint32).tolist()
        for n, j in enumerate(at):
            ids, coef = sec["omp"][table]["ids"][n], sec["omp"][table]["coef"][n]
            s = old[ids[0]].astype(np.float64) * coef[0]
            for i, c in zip(ids[1:], coef[1:], strict=True):
                s = s + old[i].astype(np.float64) * c
            assert np.array_equal(new[j].view(np.uint32), s.astype(np.float32).view(np.uint32)), (table, j)
    others = set(a.tensors) - {EMB, HEAD}
    assert all(a.tensors[n].raw == b.tensors[n].raw for n in others)


@pytest.mark.parametrize("tag", list(DONORS))
def test_verify_explains_each_output(outputs, tag):
    run = run_cli(["verify", str(SAMPLE), str(outputs[tag]["out"])])
    assert run.rc == 0, run.stdout + run.stderr
    assert "omp head: 153 rows' ids and coefficients recomputed from the donor model" in run.stdout


def test_verify_names_a_forged_coefficient_and_a_forged_row(outputs, tmp_path):
    """A coefficient nudged in the report (the row rewritten to match it) contradicts the donor model; a
    bit flipped in an omp row contradicts the report: both exit 7."""
    src = outputs["pf_sharded_h32"]["out"]
    out = tmp_path / "forged"
    shutil.copytree(src, out)
    rep = json.loads((out / "tietool-report.json").read_text())
    coefs = rep["transplant"]["omp"]["embedding"]["coef"]
    n = next(n for n, c in enumerate(coefs) if abs(c[0]) > 1e-3)  # a donor row of zeros has zeros
    coefs[n][0] *= 1.01
    (out / "tietool-report.json").write_text(json.dumps(rep))
    run = run_cli(["verify", str(SAMPLE), str(out)])
    text = run.stdout + run.stderr
    j = [k for k, m in enumerate(rep["transplant"]["made"]) if m == "omp"][n]
    assert run.rc == 7 and f"omp embedding: the ids or coefficients of id {j} are not what batch_omp" in text
    assert f"{EMB}: entry {j} is not what the report says" in text
    out2 = tmp_path / "flipped"
    shutil.copytree(src, out2)
    _flip(out2, HEAD, j * 16 + 5)
    run = run_cli(["verify", str(SAMPLE), str(out2)])
    assert run.rc == 7 and f"{HEAD}: entry {j} is not what the report says" in run.stdout + run.stderr


def _flip(folder: Path, name: str, element: int) -> None:
    """Flip the lowest bit of float32 element ``element`` of tensor ``name`` in ``folder``'s safetensors."""
    for f in sorted(folder.glob("*.safetensors")):
        raw = bytearray(f.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        head = json.loads(raw[8 : 8 + n])
        if name in head:
            raw[8 + n + head[name]["data_offsets"][0] + element * 4] ^= 1
            f.write_bytes(bytes(raw))
            return
    raise AssertionError(f"{name} not found in {folder}")


def test_refusals_name_the_fix(outputs, tmp_path):
    """omp without --donor-model, --donor-model or --k without omp (exit 2); a donor model without a
    tokenizer, with another tokenizer, with fewer rows than its tokenizer has tokens, --k above the donor's
    hidden size (exit 5); nothing written."""
    before = casecheck.snapshot_tree(SAMPLE)
    o = str(tmp_path / "o")
    base = ["transplant", str(SAMPLE), "--tokenizer", str(TOK / "sp_bpe"), "--out", o]
    donor = str(outputs["pnlp_bf16_h16"]["donor"])
    run = run_cli([*base, "--init", "omp"])
    assert run.rc == 2 and "--init omp needs the donor's weights — pass --donor-model" in run.stderr
    run = run_cli([*base, "--donor-model", donor])
    assert run.rc == 2 and "read only by --init omp" in run.stderr
    bare = CASES_DIR / "pnlp_llama_untied_bf16"  # 100 rows, no tokenizer
    run = run_cli([*base, "--init", "omp", "--donor-model", str(bare)])
    assert run.rc == 5 and "the donor model's tokenizer cannot be read" in run.stderr
    other = tmp_path / "other"
    shutil.copytree(outputs["pnlp_bf16_h16"]["donor"], other)
    for f in (TOK / "sp_bpe").iterdir():
        (other / f.name).unlink()
    for f in (TOK / "gpt2_bpe").iterdir():
        shutil.copy2(f, other / f.name)
    run = run_cli([*base, "--init", "omp", "--donor-model", str(other)])
    assert run.rc == 5 and "the donor model's tokenizer has 301 tokens, the donor tokenizer 250" in run.stderr
    short = tmp_path / "short"
    shutil.copytree(bare, short)
    for f in (TOK / "sp_bpe").iterdir():
        shutil.copy2(f, short / f.name)
    run = run_cli([*base, "--init", "omp", "--donor-model", str(short)])
    assert run.rc == 5 and "has 100 rows but the donor tokenizer 250 tokens" in run.stderr
    run = run_cli([*base, "--init", "omp", "--donor-model", donor])  # k 64 > hidden 16
    assert run.rc == 5 and "--k 64 atoms from 97 shared tokens of donor hidden size 16" in run.stderr
    assert "pass --k 16 or less" in run.stderr
    assert not Path(o).exists() and casecheck.snapshot_tree(SAMPLE) == before


def test_tied_model_takes_the_embeddings_rows(outputs, tmp_path):
    """pf_llama_tied_fp32 (tied, its head stored too) resized to the sample's 320 rows with the sample's
    tokenizer: omp approximates the embedding only (mergekit rebuilds the tables the model has: its head
    is the embedding), the head written equals it, the model stays tied, verify explains it."""
    work = tmp_path / "tied"
    run = run_cli(
        ["resize", str(CASES_DIR / "pf_llama_tied_fp32"), "--vocab", "320", "--seed", "0", "--out", str(work)]
    )
    assert run.rc == 0, run.stderr
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(SAMPLE / f, work / f)
    (work / "tietool-report.json").unlink()
    out = tmp_path / "o"
    donor = outputs["pnlp_bf16_h16"]["donor"]
    run = run_cli(
        ["transplant", str(work), "--tokenizer", str(TOK / "sp_bpe"), "--init", "omp", "--donor-model"]
        + [str(donor), "--k", str(K), "--out", str(out), "--json"]
    )
    assert run.rc == 0, run.stderr
    omp = json.loads(run.stdout)["transplant"]["omp"]
    assert "head" not in omp and len(omp["embedding"]["ids"]) == 153
    b = casecheck.read_checkpoint(out)
    if HEAD in b.tensors:
        assert b.tensors[HEAD].raw == b.tensors[EMB].raw
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    run = run_cli(["verify", str(work), str(out)])
    assert run.rc == 0, run.stdout + run.stderr
