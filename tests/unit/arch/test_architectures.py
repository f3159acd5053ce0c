"""The architecture tables' own consistency (``surgery/arch``): no model type in two rows, every key of the
tensor-parallel and conversion tables a known model type, every ``PADDLEFORMERS_LACKS`` key a family or a
model type, every loader key a :class:`Loader`, no empty list of names, every proof naming a test that
exists, and the tables agreeing on which suffix is the LM head (one :class:`TensorRole` vocabulary).

Each check is shown to fail: a row broken here with :func:`dataclasses.replace` (or a table with one entry
added) is refused, by the row itself when it is built (so a malformed row in the tables fails the import of
``surgery.arch``) or by :func:`surgery.arch.check_tables` (which the import runs on the real tables).
"""

from __future__ import annotations

import ast
import dataclasses
import shutil
import subprocess
import sys
from functools import cache

import pytest
from support import paths

from tietool.surgery import arch
from tietool.surgery.arch import FamilyRow, LoaderFacts, TableError, TPRule, TPSplit
from tietool.surgery.model.enums import Layout, Loader, TensorRole, TiedScale

ROOT = paths.REPO
LLAMA = next(r for r in arch.FAMILIES if r.family == "llama")
T5 = next(r for r in arch.FAMILIES if r.family == "t5")


def _loader_keys(row: FamilyRow) -> list[str]:
    """Every loader key of a family row (its loaders, tie defaults and per-model-type loaders)."""
    return [*row.loaders, *row.tie_default, *(k for t in row.model_loaders.values() for k in t)]


def test_the_tables_are_consistent():
    """The real tables pass every cross-table check (the import of surgery.arch runs the same)."""
    assert arch.check_tables() == []


def test_no_model_type_in_two_rows():
    mts = [mt for r in arch.FAMILIES for mt in r.model_types]
    assert len(mts) == len(set(mts))
    twin = dataclasses.replace(LLAMA, family="llama_twin", model_types=("qwen2",), model_loaders={})
    problems = arch.check_tables(families=(*arch.FAMILIES, twin))
    assert problems == ["model type 'qwen2' is in two rows: 'llama' and 'llama_twin'"]


def test_no_family_in_two_rows():
    again = dataclasses.replace(T5, model_types=("t5_again",))
    assert arch.check_tables(families=(*arch.FAMILIES, again)) == ["family 't5' has two rows"]


def test_tensor_parallel_and_conversion_keys_are_model_types():
    types = {mt for r in arch.FAMILIES for mt in r.model_types}
    assert set(arch.TENSOR_PARALLEL) <= types and set(arch.CONVERSIONS) <= types
    tp = {**arch.TENSOR_PARALLEL, "llamma": arch.TENSOR_PARALLEL["llama"]}
    assert arch.check_tables(tensor_parallel=tp) == [
        "TENSOR_PARALLEL key 'llamma' is not a model type of FAMILIES"
    ]
    conv = {**arch.CONVERSIONS, "ernie45": arch.CONVERSIONS["ernie4_5"]}
    assert arch.check_tables(conversions=conv) == [
        "CONVERSIONS key 'ernie45' is not a model type of FAMILIES"
    ]


def test_paddleformers_lacks_keys_are_families_or_model_types():
    known = {r.family for r in arch.FAMILIES} | {mt for r in arch.FAMILIES for mt in r.model_types}
    assert set(arch.PADDLEFORMERS_LACKS) <= known
    lacks = {**arch.PADDLEFORMERS_LACKS, "falconn": "Falcon"}
    assert arch.check_tables(lacks=lacks) == [
        "PADDLEFORMERS_LACKS key 'falconn' is neither a family nor a model type"
    ]


def test_every_loader_key_is_a_loader():
    loaders = {ld.value for ld in Loader}
    assert set(arch.LOADERS) == loaders and set(arch.PROVABLE_LOADERS) <= loaders
    for row in (*arch.FAMILIES, arch.FALLBACK):
        for key in _loader_keys(row):
            loader, _, container = key.partition("/")
            assert key == "*" or (loader in loaders and container in ("", *arch.CONTAINERS)), (
                row.family,
                key,
            )
    facts = LLAMA.loaders["paddleformers"]
    with pytest.raises(TableError, match="'paddleformerz' is not a loader key"):
        dataclasses.replace(LLAMA, loaders={**LLAMA.loaders, "paddleformerz": facts})
    with pytest.raises(TableError, match="'hf/gguf' is not a loader key"):
        dataclasses.replace(LLAMA, tie_default={"*": False, "hf/gguf": True})
    with pytest.raises(TableError, match="no entry for paddlenlp-2.8, paddlenlp-3, hf and no '\\*'"):
        dataclasses.replace(LLAMA, loaders={"paddleformers": facts})
    with pytest.raises(TableError, match="'mistrall' is not one of its model types"):
        dataclasses.replace(LLAMA, model_loaders={"mistrall": {"hf": facts}})


def test_no_empty_name_lists():
    for row in arch.FAMILIES:
        assert row.model_types and row.embedding and row.head, row.family
    assert arch.FALLBACK.embedding and arch.FALLBACK.head
    for rules in arch.TENSOR_PARALLEL.values():
        assert rules and all(rule.shape for rule in rules.values())
    for conv in arch.CONVERSIONS.values():
        assert conv.linear and conv.plain and conv.head
    with pytest.raises(TableError, match="family 'llama' LM head names: an empty list of names"):
        dataclasses.replace(LLAMA, head=())
    with pytest.raises(TableError, match="family 't5' input embedding names: an empty list of names"):
        dataclasses.replace(T5, embedding=())
    with pytest.raises(TableError, match="every name a non-empty string"):
        dataclasses.replace(T5, aliases=("",))
    with pytest.raises(TableError, match="a tuple of names, not list"):
        dataclasses.replace(T5, bias=["lm_head.bias"])
    nameless = dataclasses.replace(T5, family="t5_nameless", model_types=())
    assert arch.check_tables(families=(*arch.FAMILIES, nameless)) == [
        "family 't5_nameless' lists no model types"
    ]
    assert arch.check_tables(tensor_parallel={**arch.TENSOR_PARALLEL, "phi3": {}}) == [
        "TENSOR_PARALLEL['phi3'] is empty"
    ]


@cache
def _test_functions(path: str) -> frozenset[str]:
    """The names of the test functions defined in ``path`` (relative to the repository)."""
    file = ROOT / path
    if not file.is_file():
        return frozenset()
    tree = ast.parse(file.read_text())
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


def _missing_tests(proofs: dict[arch.ProofKey, str]) -> list[str]:
    """The node ids of ``proofs`` whose file or test function does not exist."""
    out = []
    for node in proofs.values():
        path, _, test = node.partition("::")
        if not path.startswith("tests/") or test.split("[")[0] not in _test_functions(path):
            out.append(node)
    return out


def test_every_proof_names_a_test_that_exists():
    assert arch.PROOFS and _missing_tests(dict(arch.PROOFS)) == []
    key = arch.ProofKey("llama", "paddleformers", "safetensors")
    assert _missing_tests({key: "tests/oracles/test_families.py::test_loader_factz[llama-safetensors]"}) != []
    assert _missing_tests({key: "tests/test_familie.py::test_loader_facts[llama-safetensors]"}) != []
    stray = {**arch.PROOFS, arch.ProofKey("llama", "paddleformers", "gguf"): arch.PROOFS[key]}
    assert arch.check_tables(proofs=stray) == [
        "PROOFS key ('llama', 'paddleformers', 'gguf') names an unknown model type, loader or container"
    ]


def test_the_tables_agree_on_the_lm_head():
    """The suffix TENSOR_PARALLEL and CONVERSIONS call the LM head (or the input embedding) is one the
    family row gives that role: one vocabulary of roles across the tables."""
    for mt, rules in arch.TENSOR_PARALLEL.items():
        row = arch.family_row(mt)
        assert row is not None
        heads = [s for s, r in rules.items() if r.role is TensorRole.LM_HEAD]
        assert heads and all(s in row.names(TensorRole.LM_HEAD) for s in heads), mt
    for mt, conv in arch.CONVERSIONS.items():
        row = arch.family_row(mt)
        assert row is not None and conv.head in row.head and conv.embedding in row.embedding, mt
        assert conv.roles[conv.head] is TensorRole.LM_HEAD
    swapped = {
        **arch.TENSOR_PARALLEL,
        "phi3": {
            **arch.TENSOR_PARALLEL["phi3"],
            "embed_tokens.weight": TPRule(TPSplit.HEAD, ("V", "H"), TensorRole.LM_HEAD),
        },
    }
    assert arch.check_tables(tensor_parallel=swapped) == [
        "TENSOR_PARALLEL['phi3']['embed_tokens.weight'] is LM head but family 'llama' says input embedding"
    ]
    wrong = dataclasses.replace(arch.CONVERSIONS["qwen2"], head="output.weight")
    assert (
        arch.check_tables(conversions={**arch.CONVERSIONS, "qwen2": wrong}) == []
    )  # output.weight: a llama head
    wrong = dataclasses.replace(arch.CONVERSIONS["qwen2"], head="lm_head.decoder_weight")
    assert arch.check_tables(conversions={**arch.CONVERSIONS, "qwen2": wrong}) == [
        "CONVERSIONS['qwen2']['lm_head.decoder_weight'] is LM head but family 'llama' says nothing"
    ]


def test_a_tensor_parallel_rule_states_its_role_by_its_split():
    assert TPRule(TPSplit.VOCAB, ("V", "H"), TensorRole.INPUT_EMBEDDING).role is TensorRole.INPUT_EMBEDDING
    with pytest.raises(TableError, match="role TensorRole.LM_HEAD with split column"):
        TPRule(TPSplit.COLUMN, ("H", "V"), TensorRole.LM_HEAD)
    with pytest.raises(TableError, match="role None with split head"):
        TPRule(TPSplit.HEAD, ("V", "H"))
    bad = {**arch.TENSOR_PARALLEL["llama"], "mlp.gate_proj.weight": TPRule(TPSplit.COLUMN, ("H", "J"))}
    assert arch.check_tables(tensor_parallel={**arch.TENSOR_PARALLEL, "llama": bad}) == [
        "TENSOR_PARALLEL['llama']['mlp.gate_proj.weight']: size 'J'"
    ]


def test_malformed_rows_are_refused_when_built():
    with pytest.raises(TableError, match="layout"):
        LoaderFacts("vocab-hidden", reties=True)  # a string, not a Layout
    with pytest.raises(TableError, match="is not a bool"):
        LoaderFacts(Layout.VOCAB_HIDDEN, reties=1)
    with pytest.raises(TableError, match="tied_scale"):
        dataclasses.replace(T5, tied_scale="d_model ** -0.5")
    conv = arch.CONVERSIONS["llama"]
    with pytest.raises(TableError, match="embedding 'embed_tokens.weight' not among plain"):
        dataclasses.replace(conv, plain=("norm.weight",))
    with pytest.raises(TableError, match="listed as a body Linear"):
        dataclasses.replace(conv, head="self_attn.q_proj.weight")
    with pytest.raises(TableError, match="paddlenlp_lacks not among plain"):
        dataclasses.replace(conv, paddlenlp_lacks=("self_attn.q_proj.weight",))


def test_a_malformed_row_fails_the_import(tmp_path):
    """A row broken in the package's own source fails ``import surgery.arch`` (rows are frozen records checked
    when built), naming the row: a copy of ``surgery/model`` and ``surgery/arch`` with Bloom's head names
    emptied, imported in a subprocess."""
    pkg = tmp_path / "archcopy"
    for sub in ("model", "arch"):
        shutil.copytree(
            ROOT / "surgery" / sub, pkg / "surgery" / sub, ignore=shutil.ignore_patterns("__pycache__")
        )
    (pkg / "__init__.py").write_text("")
    (pkg / "surgery" / "__init__.py").write_text("")
    families = pkg / "surgery" / "arch" / "families.py"
    text = families.read_text()
    row = text.index('family="bloom"')
    head = text.index('head=("lm_head.weight",),', row)
    families.write_text(text[:head] + "head=()," + text[head + len('head=("lm_head.weight",),') :])
    code = "import archcopy.surgery.arch"
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == (
        "archcopy.surgery.arch.rows.TableError: family 'bloom' LM head names: an empty list of names"
    )


def test_lookup_reads_the_one_vocabulary():
    """A resolved family carries the table's values, not strings to test: T5's tied scale, ChatGLM2's head
    inside the model module; no other family has either."""
    assert arch.lookup("t5", "paddlenlp-2.8").tied_scale is TiedScale.RSQRT_D_MODEL
    assert arch.lookup("t5", "hf").scales_tied_logits
    assert arch.lookup("chatglm_v2", "hf").head_under_model
    others = [r for r in arch.FAMILIES if r.family not in ("t5", "chatglm_v2")]
    assert all(r.tied_scale is TiedScale.NONE and not r.head_under_model for r in others)
    assert LLAMA.role_of("model.embed_tokens.weight") is TensorRole.INPUT_EMBEDDING
    assert LLAMA.role_of("lm_head.bias") is TensorRole.HEAD_BIAS
    assert T5.role_of("decoder.embed_tokens.weight") is TensorRole.EMBEDDING_ALIAS
    assert LLAMA.role_of("model.norm.weight") is None
