"""tietool against the real PaddleFormers 1.2 / PaddleNLP 2.8 checkpoints in ``tests/data/fixtures``.

For every case in ``fixtures/cases`` (described by ``fixtures/expected/<case>.json``):

* ``inspect --json`` finds what the libraries wrote: embedding, head, bias, layout, tie flag, head==embedding,
  parameter and byte totals, and the savings a dedup can give.
* ``tie`` / ``untie``: every tensor outside the embedding/head/bias group is bit-identical to the input (read
  with our own readers in ``fixture_support``); the input folder is unchanged (sha256 of every file);
  ``tie`` twice changes nothing; ``tie`` then ``untie`` gives back the original head bit for bit.
* PaddleNLP Llama (whose loader never re-ties a missing head): a forced tie keeps the head, written as the
  embedding in ``[hidden, vocab]`` layout, and the report says 0 bytes saved.
* PaddleFormers cases: the tie and untie outputs load in PaddleFormers 1.2 (``tests/data/tools/pf_logits.py``
  in a subprocess) with no missing/unexpected/newly-initialised warnings and give, bit for bit, the logits the
  input gives in the same run (the stored oracle logits are a loose cross-check: they are bit-exact only on
  the CPU that wrote them).

The tool runs as ``python -m tietool`` in a subprocess on a fresh copy of each input; each command runs once
per session (results are cached) and several tests judge it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from support import fixture_support as fs

README_CASES = [
    "pf_llama_tied_fp32",
    "pf_llama_untied_fp32",
    "pf_llama_tied_bf16",
    "pf_llama_tied_sharded",
    "pf_llama_untied_sharded",
    "pf_llama_untied_legacy_pdparams",
    "pf_qwen2_tied",
    "pf_gemma3_text",
    "pf_ernie4_5_untied",
    "pnlp_llama_untied",
    "pnlp_llama_tied",
    "pnlp_llama_untied_bf16",
    "pnlp_llama_untied_sharded",
    "pnlp_gpt",
    "pnlp_bert_mlm",
    "pnlp_t5",
]
CASE_NAMES = sorted(p.name for p in fs.CASES_DIR.iterdir() if p.is_dir())
INDEX = json.loads((fs.EXPECTED_DIR / "index.json").read_text())
LOAD_WARNINGS = ("Missing keys", "Unexpected keys", "newly initialized", "should be assigned")
LAYOUT = {"[vocab, hidden]": "vocab-hidden", "[hidden, vocab]": "hidden-vocab"}
PF_ALWAYS_TIED = {"Gemma3ForCausalLM"}  # PaddleFormers 1.2 classes whose loader ties the head unconditionally


class Case:
    """What ``expected/<name>.json`` says about one fixture, in the terms the tests need."""

    def __init__(self, name: str):
        self.name = name
        self.src = fs.CASES_DIR / name
        self.exp = json.loads((fs.EXPECTED_DIR / f"{name}.json").read_text())
        e, ie, oe = self.exp, self.exp["input_embedding"], self.exp["output_embedding"]
        self.cfg = e["config"]
        self.tensors = e["tensors"]
        self.embed = ie["name"]
        self.head = oe["name_in_model"]
        self.head_in_files = bool(oe["in_files"])
        self.layout = LAYOUT[oe["layout"]]
        heq = e["head_equals_embedding"]
        self.heq = "shared" if heq.startswith("same tensor name") else heq
        self.bias = oe["bias"]
        bias_group = next((set(g) for g in oe["bias_aliases_in_model"] if self.bias in g), set())
        self.bias_names = ({self.bias} | bias_group) if self.bias else set()
        embed_group = next((set(g) for g in ie["aliases_in_model"] if self.embed in g), {self.embed})
        self.embed_aliases = embed_group - {self.embed, self.head}
        # names whose bytes a tie/untie may legitimately change, drop or add
        self.group = {self.embed, self.head, "lm_head.weight"} | self.embed_aliases | self.bias_names
        self.verdict = INDEX[name]["dedup_verdict"]
        # the fixture's own load check says the loader re-ties a dropped head; tietool drops it only where
        # that fact is proven for the model type, loader and container (surgery.arch.PROOFS), else keeps it
        self.can_drop_head = self.verdict.startswith("can_drop_head") and tietool_drops_head(self.src)
        self.pf = name.startswith("pf_")
        self.pnlp_llama = name.startswith("pnlp_llama")
        self.model_class = self.cfg["architectures"][0]
        # PaddleFormers 1.2 Gemma3ForCausalLM._gen_aoa_config maps
        # "model.embed_tokens.weight -> lm_head.weight" unconditionally: the head is always loaded from the
        # embedding and a file lm_head.weight is ignored ("Unexpected keys"), whatever tie_word_embeddings
        # says. An untie cannot survive a load.
        self.pf_always_ties = self.pf and self.model_class in PF_ALWAYS_TIED
        # PaddleNLP GPT/BERT/T5: untie support depends on the model class; either outcome is accepted
        self.untie_either = (name.startswith("pnlp_") and not self.pnlp_llama) or self.pf_always_ties
        self.load_kwargs = e["loader"]["roundtrip"].get("from_pretrained_kwargs") or {}
        self.container = INDEX[name]["container"]  # "safetensors" | "pdparams"
        self.suffix = "." + self.container
        self.head_nbytes = self.tensors[self.head]["nbytes"] if self.head_in_files else 0

    def __repr__(self) -> str:
        return self.name


def tietool_drops_head(path: Path) -> bool:
    """Whether tietool's table lets a write drop this checkpoint's duplicate head (``Family.may_drop_head``:
    the loader re-ties and that is proven; test_loader_facts and the PaddleNLP tests hold the proofs)."""
    from tietool.surgery.inspect.detect import detect
    from tietool.surgery.io.checkpoint import Checkpoint

    return detect(Checkpoint.open(path), compare_values=False).family.may_drop_head


CASES = {n: Case(n) for n in CASE_NAMES}
DIFFERENT = [n for n, c in CASES.items() if c.heq == "different"]
EXACT = [n for n, c in CASES.items() if c.heq == "exact"]
PNLP_LLAMA = [n for n, c in CASES.items() if c.pnlp_llama]
FIDELITY = [
    (n, op)
    for n, c in CASES.items()
    if c.pf
    for op in (("tie", "untie") if c.heq in ("exact", "absent") else ("untie",))
]


# ------------------------------------------------------------------------------------------------ plumbing
class Bench:
    """Runs each tool command once per session, on a fresh copy of its input, and keeps the result."""

    def __init__(self, root: Path):
        self.root = root
        self._runs: dict[tuple, fs.ToolRun] = {}
        self._original: dict[str, dict[str, fs.RawTensor]] = {}

    def original(self, case: Case) -> dict[str, fs.RawTensor]:
        if case.name not in self._original:
            self._original[case.name] = fs.read_checkpoint(case.src)
        return self._original[case.name]

    def _run(
        self, key: tuple, src: Path, command: str, extra: list[str], with_out: bool = True
    ) -> fs.ToolRun:
        if key not in self._runs:
            work = self.root / "-".join(str(k) for k in key).replace("/", "_")
            self._runs[key] = fs.run_on_copy(src, work, command, extra, with_out)
        return self._runs[key]

    def inspect(self, c: Case) -> fs.ToolRun:
        return self._run((c.name, "inspect"), c.src, "inspect", ["--json"], with_out=False)

    def tie(self, c: Case) -> fs.ToolRun:
        return self._run((c.name, "tie"), c.src, "tie", [])

    def tie_keep_embedding(self, c: Case) -> fs.ToolRun:
        return self._run((c.name, "tie-keep-embedding"), c.src, "tie", ["--keep", "embedding"])

    def untie(self, c: Case) -> fs.ToolRun:
        return self._run((c.name, "untie"), c.src, "untie", [])

    def tied_output(self, c: Case) -> tuple[str, fs.ToolRun]:
        """The first tie output: plain `tie`, or `tie --keep embedding` where plain tie is refused."""
        if c.heq == "different":
            return "tie --keep embedding", self.tie_keep_embedding(c)
        return "tie", self.tie(c)

    def tie_again(self, c: Case) -> fs.ToolRun:
        label, first = self.tied_output(c)
        ok(first)
        return self._run((c.name, "tie-again"), first.out, "tie", [])

    def roundtrip(self, c: Case) -> fs.ToolRun:
        first = self.tie(c)
        ok(first)
        return self._run((c.name, "tie-untie"), first.out, "untie", ["--layout", c.layout])

    def all_runs(self) -> list[fs.ToolRun]:
        return list(self._runs.values())


@pytest.fixture(scope="session")
def bench(tmp_path_factory):
    b = Bench(tmp_path_factory.mktemp("tietool-fixtures"))
    yield b
    runs = b.all_runs()
    if runs:
        slowest = max(runs, key=lambda r: r.seconds)
        print(
            f"\n[test_fixtures] {len(runs)} tool runs, {sum(r.seconds for r in runs):.1f}s in total, "
            f"slowest {slowest.seconds:.1f}s: tietool {' '.join(slowest.argv[:1])}"
        )


def ok(run: fs.ToolRun) -> None:
    if run.rc != 0:
        pytest.fail(f"expected exit 0\n{run.describe()}", pytrace=False)


def same(a: fs.RawTensor, b: fs.RawTensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.data == b.data


def desc(t: fs.RawTensor | None) -> str:
    return "absent" if t is None else f"{t.dtype}{list(t.shape)} in {t.file}"


class Errors(list):
    """Collects every mismatch of one test so a failure shows all of them at once."""

    def eq(self, what: str, seen, want) -> None:
        if seen != want:
            self.append(f"{what}: expected {want!r}, seen {seen!r}")

    def true(self, what: str, cond: bool) -> None:
        if not cond:
            self.append(what)

    def check(self, header: str) -> None:
        if self:
            pytest.fail(header + "\n  - " + "\n  - ".join(self), pytrace=False)


def check_input_unchanged(errs: Errors, run: fs.ToolRun) -> None:
    if run.hashes_after != run.hashes_before:
        changed = sorted(
            k
            for k in set(run.hashes_before) | set(run.hashes_after)
            if run.hashes_before.get(k) != run.hashes_after.get(k)
        )
        errs.append(f"input folder changed: {changed}")


def check_outside_group_identical(errs: Errors, c: Case, before: dict, after: dict, label: str) -> None:
    """Every tensor outside the embedding/head/bias group keeps its name, dtype, shape and bytes."""
    names_in = set(before) - c.group
    names_out = set(after) - c.group
    for n in sorted(names_in - names_out):
        errs.append(f"{label}: tensor {n} is missing from the output")
    for n in sorted(names_out - names_in):
        errs.append(f"{label}: unexpected new tensor {n} in the output")
    for n in sorted(names_in & names_out):
        if not same(before[n], after[n]):
            errs.append(
                f"{label}: {n} changed: {desc(before[n])} -> {desc(after[n])}"
                + (
                    ""
                    if before[n].data != after[n].data or before[n].shape != after[n].shape
                    else " (dtype label only)"
                )
            )


def check_output_basics(errs: Errors, c: Case, run: fs.ToolRun) -> dict[str, fs.RawTensor]:
    """Exit 0, input unchanged, report present, same container format, index consistent. Returns tensors."""
    check_input_unchanged(errs, run)
    errs.true(f"{fs.REPORT_NAME} missing from output", (run.out / fs.REPORT_NAME).is_file())
    suffixes = {p.suffix for p in fs.weight_files(run.out)}
    errs.eq("weight file format of the output", suffixes, {c.suffix})
    errs.extend(f"index: {p}" for p in fs.index_problems(run.out))
    return fs.read_checkpoint(run.out)


def check_refused(errs: Errors, run: fs.ToolRun) -> None:
    errs.true("expected a non-zero exit (refusal)", run.rc != 0)
    errs.true("refusal printed a Python traceback", fs.TRACEBACK not in run.message)
    left = sorted(p.name for p in run.out.iterdir()) if run.out.exists() and run.out.is_dir() else []
    errs.true(f"refusal left files in --out: {left}", run.out_empty())
    check_input_unchanged(errs, run)


def saved_bytes(errs: Errors, run: fs.ToolRun) -> list:
    hits = fs.find_saved_bytes(run.report())
    if not hits:
        errs.append(
            f"{fs.REPORT_NAME} states no bytes saved (looked for bytes_saved, saved_bytes, "
            "savings.bytes, saved.bytes); "
            f"top-level keys: {sorted(run.report())}"
        )
    return [v for _, v in hits]


def effective_tie(cfg: dict, case: Case) -> object:
    """tie_word_embeddings of an output config (PaddleNLP GPT/BERT/T5 default to tied when it is absent)."""
    if "tie_word_embeddings" in cfg:
        return cfg["tie_word_embeddings"]
    return True if case.name.startswith("pnlp_") and not case.pnlp_llama else "(absent)"


# ------------------------------------------------------------------------------------------------ fixtures
def test_fixture_set_complete():
    """The fixtures are where the tests expect them (tests/data), with every case the README lists."""
    assert fs.CASES_DIR.is_dir(), f"fixtures not found at {fs.CASES_DIR}"
    assert sorted(README_CASES) == CASE_NAMES
    assert set(INDEX) == set(CASE_NAMES)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_fixture_integrity(name):
    """Each fixture file still has the sha256 recorded in expected/<case>.json, and our reader sees exactly
    the recorded tensors (so the bit-identity checks below compare against the real thing)."""
    c = CASES[name]
    errs = Errors()
    errs.eq("files in the case folder", sorted(fs.tree_hashes(c.src)), sorted(c.exp["format"]["file_sha256"]))
    errs.eq("file sha256", fs.tree_hashes(c.src), c.exp["format"]["file_sha256"])
    tensors = fs.read_checkpoint(c.src)
    errs.eq("tensor names", sorted(tensors), sorted(c.tensors))
    for n, t in tensors.items():
        want = c.tensors.get(n)
        if want:
            got = {
                "shape": list(t.shape),
                "dtype": t.dtype,
                "file": t.file,
                "nbytes": len(t.data),
                "sha256": hashlib.sha256(t.data).hexdigest(),
            }
            errs.eq(f"{n}", got, {k: want[k] for k in got})
    errs.check(f"{name}: fixture differs from expected/{name}.json")


# ------------------------------------------------------------------------------------------------ inspect
@pytest.mark.parametrize("name", CASE_NAMES)
def test_inspect_detection(bench, name):
    c = CASES[name]
    run = bench.inspect(c)
    ok(run)
    try:
        info = json.loads(run.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"inspect --json stdout is not one JSON object ({e})\n{run.describe()}")
    errs = Errors()
    check_input_unchanged(errs, run)
    e, ie, oe = c.exp, c.exp["input_embedding"], c.exp["output_embedding"]
    errs.eq("format", info.get("format"), c.container)
    errs.eq("sharded", info.get("sharded"), e["format"]["sharded"])
    errs.eq("files", sorted(info.get("files") or []), sorted(e["format"]["weight_files"]))
    errs.eq("model_type", info.get("model_type"), c.cfg["model_type"])
    errs.eq("total_parameters", info.get("total_parameters"), e["param_counts"]["total_numel_in_files"])
    errs.eq("total_bytes", info.get("total_bytes"), sum(t["nbytes"] for t in c.tensors.values()))

    emb = info.get("embedding") or {}
    errs.eq("embedding.name", emb.get("name"), c.embed)
    errs.eq("embedding.shape", emb.get("shape"), ie["shape"])
    errs.eq("embedding.dtype", emb.get("dtype"), c.tensors[c.embed]["dtype"])
    errs.eq("embedding.file", emb.get("file"), ie["file"])
    errs.eq(
        "embedding.aliases (other than the head)", set(emb.get("aliases") or []) - {c.head}, c.embed_aliases
    )

    head = info.get("head") or {}
    errs.eq("head.name", head.get("name"), c.head)
    errs.eq("head.present", head.get("present"), c.head_in_files)
    if c.head_in_files:
        errs.eq("head.shape", head.get("shape"), oe["shape"])
        errs.eq("head.layout", head.get("layout"), c.layout)
        errs.eq("head.dtype", head.get("dtype"), c.tensors[c.head]["dtype"])
        errs.eq("head.file", head.get("file"), oe["file"])
    else:
        errs.true(
            f"head.shape: expected null or {oe['shape']}, seen {head.get('shape')!r}",
            head.get("shape") in (None, oe["shape"]),
        )
        errs.true(
            f"head.layout: expected null or {c.layout!r}, seen {head.get('layout')!r}",
            head.get("layout") in (None, c.layout),
        )

    bias = info.get("head_bias")
    if c.bias:
        bias = bias or {}
        errs.eq("head_bias.name", bias.get("name"), c.bias)
        errs.eq("head_bias.aliases", set(bias.get("aliases") or []), c.bias_names - {c.bias})
        errs.eq("head_bias.shape", bias.get("shape"), c.tensors[c.bias]["shape"])
    else:
        errs.eq("head_bias", bias, None)

    tie = info.get("tie") or {}
    errs.eq("tie.config (effective flag)", tie.get("config"), c.cfg["tie_word_embeddings_effective"])
    errs.eq("tie.head_in_files", tie.get("head_in_files"), c.head_in_files)
    errs.eq("tie.values", tie.get("values"), c.heq)
    if c.heq == "exact":
        errs.eq("tie.max_abs_diff", tie.get("max_abs_diff"), 0.0)
        errs.eq("tie.differing_rows", tie.get("differing_rows"), 0)
    elif c.heq == "different":
        errs.true(
            f"tie.max_abs_diff: expected > 0, seen {tie.get('max_abs_diff')!r}",
            isinstance(tie.get("max_abs_diff"), (int, float)) and tie["max_abs_diff"] > 0,
        )
        errs.true(
            f"tie.differing_rows: expected > 0, seen {tie.get('differing_rows')!r}",
            isinstance(tie.get("differing_rows"), int) and tie["differing_rows"] > 0,
        )

    vocab = info.get("vocab") or {}
    errs.eq("vocab.config_vocab_size", vocab.get("config_vocab_size"), c.cfg["vocab_size"])
    errs.eq("vocab.embedding_rows", vocab.get("embedding_rows"), ie["shape"][0])
    errs.eq("vocab.tokenizer_size (fixtures ship no tokenizer)", vocab.get("tokenizer_size"), None)
    errs.check(f"{name}: `tietool inspect --json` disagrees with expected/{name}.json")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_inspect_savings(bench, name):
    """Savings = the head's size where the loader re-ties a dropped head; 0 where nothing may be dropped."""
    c = CASES[name]
    run = bench.inspect(c)
    ok(run)
    info = json.loads(run.stdout)
    sav, loader = info.get("savings") or {}, info.get("loader") or {}
    errs = Errors()
    head_numel = c.exp["param_counts"]["head_numel"]
    if c.can_drop_head:
        if c.bias:  # the bias alias (same parameter as the bias) may be deduplicated too
            bias_numel = int(np.prod(c.tensors[c.bias]["shape"]))
            bias_bytes = c.tensors[c.bias]["nbytes"]
            errs.true(
                f"savings.parameters: expected {head_numel} (or {head_numel + bias_numel} with the "
                f"bias alias), seen {sav.get('parameters')!r}",
                sav.get("parameters") in (head_numel, head_numel + bias_numel),
            )
            errs.true(
                f"savings.bytes: expected {c.head_nbytes} (or {c.head_nbytes + bias_bytes}), seen "
                f"{sav.get('bytes')!r}",
                sav.get("bytes") in (c.head_nbytes, c.head_nbytes + bias_bytes),
            )
        else:
            errs.eq("savings.parameters", sav.get("parameters"), head_numel)
            errs.eq("savings.bytes", sav.get("bytes"), c.head_nbytes)
        errs.true(
            f"savings.percent: expected in (0, 100), seen {sav.get('percent')!r}",
            isinstance(sav.get("percent"), (int, float)) and 0 < sav["percent"] < 100,
        )
        errs.eq("loader.reties_missing_head", loader.get("reties_missing_head"), True)
    if c.pnlp_llama:
        errs.eq("savings.parameters (PaddleNLP Llama never re-ties)", sav.get("parameters"), 0)
        errs.eq("savings.bytes (PaddleNLP Llama never re-ties)", sav.get("bytes"), 0)
        errs.eq("loader.reties_missing_head", loader.get("reties_missing_head"), False)
    if c.heq == "absent":
        errs.eq("savings.parameters (no head in files)", sav.get("parameters"), 0)
        errs.eq("savings.bytes (no head in files)", sav.get("bytes"), 0)
    errs.true("loader.name missing", bool(loader.get("name")))
    errs.check(f"{name}: savings/loader in `tietool inspect --json`")


# ------------------------------------------------------------------------------------------------ tie
@pytest.mark.parametrize("name", CASE_NAMES)
def test_tie(bench, name):
    """Plain `tie`: refused when the head differs; otherwise the head is dropped where the loader re-ties it,
    the embedding and every other tensor keep their bytes."""
    c = CASES[name]
    run = bench.tie(c)
    errs = Errors()
    if c.heq == "different":
        check_refused(errs, run)
        for word in (c.head, c.embed):
            errs.true(f"refusal message does not name {word}", word.lower() in run.message.lower())
        errs.check(f"{name}: head differs from the embedding, so plain tie must refuse\n{run.describe()}")
        return
    ok(run)
    before, after = bench.original(c), check_output_basics(errs, c, run)
    check_outside_group_identical(errs, c, before, after, "tie")
    errs.true(
        f"embedding {c.embed} not bit-identical to the input: {desc(after.get(c.embed))}",
        c.embed in after and same(after[c.embed], before[c.embed]),
    )
    for a in sorted(c.embed_aliases):
        errs.true(
            f"alias {a} kept but not equal to the embedding",
            a not in after or after[a].data == before[c.embed].data,
        )
    if c.can_drop_head or c.heq in ("absent", "shared"):
        errs.true(
            f"head {c.head} still in the output although the loader re-ties it",
            c.head == c.embed or c.head not in after,
        )
        errs.true("lm_head.weight in the output", c.head == "lm_head.weight" or "lm_head.weight" not in after)
    if c.bias:
        kept = [b for b in sorted(c.bias_names) if b in after]
        errs.true(f"bias values lost: none of {sorted(c.bias_names)} is in the output", bool(kept))
        for b in kept:
            errs.true(f"bias {b} changed", same(after[b], before[c.bias]))
    errs.eq("config tie_word_embeddings", effective_tie(fs.config_of(run.out), c), True)
    saved = saved_bytes(errs, run)
    if c.can_drop_head and saved:
        allowed = {c.head_nbytes}
        if c.bias:
            allowed.add(c.head_nbytes + c.tensors[c.bias]["nbytes"])
        errs.true(f"report bytes saved: expected {sorted(allowed)}, seen {saved}", set(saved) <= allowed)
    if c.heq == "absent" and saved:
        errs.eq("report bytes saved (nothing to drop)", set(saved), {0})
    errs.check(f"{name}: `tietool tie`\n{run.describe()}")


@pytest.mark.parametrize("name", DIFFERENT)
def test_tie_keep_embedding(bench, name):
    """`tie --keep embedding` on a head that differs: the embedding keeps its bytes; the head is dropped where
    the loader re-ties it (PaddleFormers with the flag set), kept as the embedding where it does not."""
    c = CASES[name]
    run = bench.tie_keep_embedding(c)
    ok(run)
    errs = Errors()
    before, after = bench.original(c), check_output_basics(errs, c, run)
    check_outside_group_identical(errs, c, before, after, "tie --keep embedding")
    errs.true(
        f"embedding {c.embed} not bit-identical to the input: {desc(after.get(c.embed))}",
        c.embed in after and same(after[c.embed], before[c.embed]),
    )
    if c.pf:
        errs.true(
            f"{c.head} still in the output (PaddleFormers re-ties a missing head of a tied config)",
            c.head not in after,
        )
        errs.eq("config tie_word_embeddings", fs.config_of(run.out).get("tie_word_embeddings"), True)
        saved = saved_bytes(errs, run)
        if saved:
            errs.eq("report bytes saved", set(saved), {c.head_nbytes})
    errs.check(f"{name}: `tietool tie --keep embedding`\n{run.describe()}")


@pytest.mark.parametrize("name", PNLP_LLAMA)
def test_pnlp_llama_tie_keeps_head(bench, name):
    """PaddleNLP Llama never re-ties a missing head (it loads a random one), so a forced tie must keep
    lm_head.weight, written as the embedding in [hidden, vocab] layout, and report 0 bytes saved."""
    c = CASES[name]
    run = bench.tie_keep_embedding(c)
    ok(run)
    errs = Errors()
    before, after = bench.original(c), check_output_basics(errs, c, run)
    emb = before[c.embed]
    head = after.get(c.head)
    errs.true(f"{c.head} dropped, but PaddleNLP Llama would load a random head", head is not None)
    if head is not None:
        errs.eq(f"{c.head} shape ([hidden, vocab])", list(head.shape), [emb.shape[1], emb.shape[0]])
        errs.eq(f"{c.head} dtype", head.dtype, emb.dtype)
        errs.true(f"{c.head} is not the embedding transposed (bytes)", head.data == emb.transposed_bytes())
    saved = saved_bytes(errs, run)
    if saved:
        errs.eq("report bytes saved", set(saved), {0})
    errs.check(f"{name}: `tietool tie --keep embedding`\n{run.describe()}")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_tie_is_idempotent(bench, name):
    """`tie` on a tie output succeeds and changes no tensor (names, dtypes, shapes, bytes)."""
    c = CASES[name]
    label, first = bench.tied_output(c)
    if first.rc != 0:
        pytest.fail(f"no first tie output to re-tie ({label} failed)\n{first.describe()}")
    run = bench.tie_again(c)
    ok(run)
    errs = Errors()
    check_input_unchanged(errs, run)
    a, b = fs.read_checkpoint(first.out), fs.read_checkpoint(run.out)
    errs.eq("tensor names", sorted(b), sorted(a))
    for n in sorted(set(a) & set(b)):
        errs.true(f"{n} changed: {desc(a[n])} -> {desc(b[n])}", same(a[n], b[n]))
    errs.extend(f"index: {p}" for p in fs.index_problems(run.out))
    errs.check(f"{name}: second tie (on the output of `{label}`)\n{run.describe()}")


# ------------------------------------------------------------------------------------------------ untie
@pytest.mark.parametrize("name", CASE_NAMES)
def test_untie(bench, name):
    """`untie`: the head is in the files (the existing head unchanged, or the embedding copied in the model's
    layout), the flag is false, and every other tensor keeps its bytes."""
    c = CASES[name]
    run = bench.untie(c)
    if c.untie_either and run.rc != 0:
        errs = Errors()
        check_refused(errs, run)
        errs.check(f"{name}: untie refused, but not cleanly\n{run.describe()}")
        pytest.skip(f"untie refused for {c.model_class} (accepted): {run.message.strip()[-300:]}")
    ok(run)
    errs = Errors()
    before, after = bench.original(c), check_output_basics(errs, c, run)
    check_outside_group_identical(errs, c, before, after, "untie")
    emb = before[c.embed]
    errs.true(
        f"embedding {c.embed} not bit-identical to the input: {desc(after.get(c.embed))}",
        c.embed in after and same(after[c.embed], emb),
    )
    errs.eq("config tie_word_embeddings", fs.config_of(run.out).get("tie_word_embeddings"), False)
    if c.heq == "shared":  # PaddleNLP T5: untied logits = decoder_out @ lm_head.weight, no d_model**-0.5
        head = after.get("lm_head.weight")
        d_model = fs.config_of(c.src)["d_model"]
        errs.true("lm_head.weight missing from the untied T5", head is not None)
        if head is not None:
            errs.eq(
                "lm_head.weight shape (nn.Linear(d_model, vocab))", list(head.shape), [d_model, emb.shape[0]]
            )
            if list(head.shape) == [d_model, emb.shape[0]]:
                want = emb.decoded().T * np.float32(d_model**-0.5)
                errs.true(
                    "lm_head.weight != shared.T * d_model**-0.5 (tied T5 rescales the decoder output "
                    "by d_model**-0.5, untied T5 does not)",
                    np.allclose(head.decoded(), want, rtol=1e-6, atol=0),
                )
    else:
        head = after.get(c.head)
        errs.true(f"head {c.head} missing from the untie output", head is not None)
        if head is not None and c.heq == "different":
            errs.true(
                f"existing head {c.head} changed: {desc(before[c.head])} -> {desc(head)}",
                same(head, before[c.head]),
            )
        elif head is not None:
            want = emb.data if c.layout == "vocab-hidden" else emb.transposed_bytes()
            shape = list(emb.shape) if c.layout == "vocab-hidden" else [emb.shape[1], emb.shape[0]]
            errs.eq(f"{c.head} shape ({c.layout})", list(head.shape), shape)
            errs.eq(f"{c.head} dtype", head.dtype, emb.dtype)
            errs.true(f"{c.head} bytes are not the embedding's ({c.layout})", head.data == want)
    if c.bias:
        kept = [b for b in sorted(c.bias_names) if b in after]
        errs.true(f"bias values lost: none of {sorted(c.bias_names)} is in the output", bool(kept))
        for b in kept:
            errs.true(f"bias {b} changed", same(after[b], before[c.bias]))
    errs.check(f"{name}: `tietool untie`\n{run.describe()}")


@pytest.mark.parametrize("name", EXACT)
def test_tie_then_untie_restores_head(bench, name):
    """Where the original head equals the embedding: tie, then untie --layout <original layout>, gives back
    the original head bit for bit, and every other tensor as in the original."""
    c = CASES[name]
    run = bench.roundtrip(c)
    if c.untie_either and run.rc != 0:
        errs = Errors()
        check_refused(errs, run)
        errs.check(f"{name}: untie refused, but not cleanly\n{run.describe()}")
        pytest.skip(f"untie refused for {c.model_class} (accepted): {run.message.strip()[-300:]}")
    ok(run)
    errs = Errors()
    check_input_unchanged(errs, run)
    orig, after = bench.original(c), fs.read_checkpoint(run.out)
    check_outside_group_identical(errs, c, orig, after, "tie+untie vs original")
    errs.true(
        f"{c.head} not restored bit for bit: original {desc(orig[c.head])}, now {desc(after.get(c.head))}",
        c.head in after and same(after[c.head], orig[c.head]),
    )
    errs.true(
        f"{c.embed} not bit-identical to the original",
        c.embed in after and same(after[c.embed], orig[c.embed]),
    )
    errs.eq("config tie_word_embeddings", fs.config_of(run.out).get("tie_word_embeddings"), False)
    errs.extend(f"index: {p}" for p in fs.index_problems(run.out))
    errs.check(f"{name}: tie then `untie --layout {c.layout}`\n{run.describe()}")


# ------------------------------------------------------------------------------------------------ fidelity
STORED_ATOL = 1e-4  # stored oracle logits vs this CPU's: another CPU type gives up to ~3e-6 away


@pytest.fixture(scope="session")
def fidelity_logits(bench, live_logits, request) -> dict:
    """PaddleFormers logits of every selected tie/untie output, and of its input (once per case), computed in
    this run two subprocesses at a time; (name, op) -> (output future, input future)."""
    selected = sorted(
        {
            (it.callspec.params["name"], it.callspec.params["op"])
            for it in request.session.items
            if it.originalname == "test_pf_fidelity" and hasattr(it, "callspec")
        }
    )
    for name, _ in selected:  # the inputs first: every comparison needs one
        c = CASES[name]
        live_logits.reference(c.src, c.model_class, c.load_kwargs)
    futures = {}
    for name, op in selected:
        c = CASES[name]
        run = bench.tie(c) if op == "tie" else bench.untie(c)
        if run.rc == 0:
            futures[(name, op)] = (
                live_logits.submit(run.out, c.model_class, c.load_kwargs),
                live_logits.reference(c.src, c.model_class, c.load_kwargs),
            )
    return futures


@pytest.mark.slow
@pytest.mark.parametrize("name,op", FIDELITY, ids=[f"{n}-{op}" for n, op in FIDELITY])
def test_pf_fidelity(bench, fidelity_logits, name, op):
    """The tie/untie output loads in PaddleFormers 1.2 with no missing/unexpected/newly-initialised warning
    and gives, on oracles/input_ids.npy, bit for bit the logits its input gives in the same run (same
    subprocess setup, same from_pretrained keyword arguments); the stored oracle
    (oracles/<case>.logits_before.npy, bit-exact only on the CPU that wrote it) agrees within 1e-4.

    pf_llama_untied_legacy_pdparams loads only with load_checkpoint_format="legacy", convert_from_hf=False
    (taken from expected/<case>.json); it goes through tests/support/pf_logits_kw.py, which runs the
    unchanged oracle with those keyword arguments. That loader re-initialises a missing head silently, so the
    logits are the check.
    """
    c = CASES[name]
    run = bench.tie(c) if op == "tie" else bench.untie(c)
    if op == "untie" and c.untie_either and run.rc != 0:
        pytest.skip(f"untie refused for {c.model_class} (accepted; see test_untie)")
    ok(run)
    got_future, want_future = fidelity_logits[(name, op)]
    ref = want_future.result()
    assert ref.get("ok"), f"PaddleFormers could not load the input {name} (the reference): {ref}"
    res = got_future.result()
    assert res.get("ok"), f"PaddleFormers could not load the {op} output of {name}: {res}"
    for pat in LOAD_WARNINGS:
        bad = [w for w in res.get("warnings", []) if pat in w]
        why = (
            (
                " (PaddleFormers 1.2 always loads this model's head from the embedding, so an untied head is "
                "silently discarded: untie should refuse)"
            )
            if op == "untie" and c.pf_always_ties
            else ""
        )
        assert not bad, f"PaddleFormers warned {pat!r} loading the {op} output of {name}{why}: {bad}"
    got, want = res["logits"], ref["logits"]
    diff = fs.logits_mismatch(got, want)
    assert diff is None, f"{op} output of {name}: logits differ from the input's (same run): {diff}"
    stored = np.load(fs.ORACLES_DIR / f"{name}.logits_before.npy")
    diff = fs.logits_mismatch(got, stored, atol=STORED_ATOL)
    assert diff is None, f"{op} output of {name}: logits differ from the stored oracle: {diff}"
