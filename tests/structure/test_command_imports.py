"""Each command imports only what it runs. ``tietool inspect`` (headers only, with values, ``--json``, a
``.pdparams`` checkpoint, a flex ``checkpoint-N/``) imports exactly the tietool modules listed here: no
planner, writer, report, conversion, merge, verify or tokenizer edit, and no library it does not need
(paddle, tokenizers, sentencepiece, transformers, torch, fsspec). ``tietool --help`` imports no numpy and
no rich.

Each command runs in a fresh interpreter (a child process) and its ``sys.modules`` is compared with an
explicit list: a module new on inspect's path is a decision (add it here, with what it costs), not an
accident. The start-up it guards: ``tietool inspect --no-values`` of bench's 6.5 GB checkpoint spent most
of its time importing planners it never ran (``bench/README.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import REPO

SAMPLES = REPO / "sample_checkpoints"

# the tietool modules `tietool inspect` of a local checkpoint imports (package-relative names)
INSPECT = {
    "cli",
    "cli.app",
    "cli.coercion",  # Typer's coercion without pydantic for plain values (start-up)
    "cli.errors",
    "cli.help",
    "cli.numbers",
    "cli.options",
    "cli.render",  # a package: its renderers per output, re-exported
    "cli.render.bars",
    "cli.render.common",
    "cli.render.inspection",
    "cli.render.reports",
    "cli.render.verification",
    "cli.vocab",  # the vocabulary commands' registration (their operations are imported when they run)
    "surgery",
    "surgery.arch",
    "surgery.arch.config_keys",
    "surgery.arch.conversions",
    "surgery.arch.families",
    "surgery.arch.parallel",
    "surgery.arch.rows",
    "surgery.inspect",
    "surgery.inspect.chunked",
    "surgery.inspect.compare",
    "surgery.inspect.convention",
    "surgery.inspect.detect",
    "surgery.inspect.detection",
    "surgery.inspect.finders",
    "surgery.inspect.findings",
    "surgery.inspect.linear_layout",
    "surgery.inspect.summary",
    "surgery.inspect.vocabularies",
    "surgery.io",
    "surgery.io.checkpoint",
    "surgery.io.configfile",
    "surgery.io.flex",
    "surgery.io.formats",
    "surgery.io.mistaken",
    "surgery.io.special_tokens",  # imported by ops for the vocabulary commands (no library behind it)
    "surgery.io.pdparams",
    "surgery.io.pdparams.allowlist",
    "surgery.io.pdparams.read",
    "surgery.io.pdparams.unpickle",
    "surgery.io.pdparams.write",
    "surgery.io.readback",
    "surgery.io.regular",
    "surgery.io.safetensors_io",
    "surgery.io.store",
    "surgery.io.stores",
    "surgery.io.surface",
    "surgery.io.tokenizer",
    "surgery.io.transient",
    "surgery.io.tree",
    "surgery.io.vocabkeys",
    "surgery.model",
    "surgery.model.enums",
    "surgery.model.errors",
    "surgery.model.extras",  # the install hints of the errors
    "surgery.model.lazy",  # numpy on first use: inspect --no-values never imports it
    "surgery.model.tensor",
    "surgery.model.tokens",
    "surgery.ops",
    "surgery.results",
    "surgery.run",  # ops' run and output policies (split out of ops; same imports as before)
    "surgery.write",
    "surgery.write.inplace",  # a killed in-place run is put right before an inspect
    "surgery.write.inplace_checks",
    "surgery.write.publish",
}
# a flex checkpoint's structure and coverage, and its merged view (the planners' view: plan_flex, flex_view),
# where its vocabulary is detected when it has a config.json
FLEX = {
    "surgery.io.flex_cover",
    "surgery.plan",
    "surgery.plan.flex_pieces",
    "surgery.plan.flex_vocabulary",
    "surgery.plan.kept_rows",
    "surgery.plan.merge",
    "surgery.plan.merge_flex",
    "surgery.plan.merge_tie",
    "surgery.plan.plan",
    "surgery.plan.recipes",
    "surgery.plan.transplant_rows",
    "surgery.plan.untrained_rows",
}
HELP = {
    "cli",
    "cli.app",
    "cli.coercion",
    "cli.errors",
    "cli.help",
    "cli.options",
    "cli.vocab",
    "surgery",
    "surgery.model",
    "surgery.model.enums",
    "surgery.model.errors",
    "surgery.results",
}
NEVER = {"paddle", "paddleformers", "paddlenlp", "tokenizers", "sentencepiece", "transformers", "torch"}
NEVER_LOCAL = {"fsspec", "upath", "s3fs", "huggingface_hub"}  # object storage: only for a URL
# Typer's pydantic adapters (cli.coercion) for every inspect; numpy when no value is read (headers only)
NOT_FOR_INSPECT = {"pydantic", "pydantic_core"}

CHILD = """
import contextlib, io, json, sys
sys.argv = ["tietool", *json.loads(sys.argv[1])]
from tietool.cli.app import main
code = 0
try:
    with contextlib.redirect_stdout(io.StringIO()):
        main()
except SystemExit as e:
    code = e.code
mods = sorted(m.removeprefix("tietool.") for m in sys.modules if m.startswith("tietool."))
print(json.dumps({"code": code, "tietool": mods, "top": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _imports(*args: str) -> tuple[int, set[str], set[str]]:
    """The exit code of ``tietool ARGS`` run in a fresh interpreter, the tietool modules it imported and the
    top-level names of every module it imported."""
    r = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(list(args))], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    return out["code"], set(out["tietool"]), set(out["top"])


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "--no-values", str(SAMPLES / "pf_llama_tied_fp32")],
        ["inspect", str(SAMPLES / "pf_llama_tied_fp32")],
        ["inspect", "--json", str(SAMPLES / "pf_llama_with_tokenizer")],
        ["inspect", str(SAMPLES / "pnlp_llama_untied")],
    ],
    ids=["no-values", "values", "json-tokenizer", "pdparams"],
)
def test_inspect_imports_only_what_it_runs(args):
    code, mods, top = _imports(*args)
    assert code == 0
    assert mods == INSPECT, f"new: {sorted(mods - INSPECT)}; gone: {sorted(INSPECT - mods)}"
    never = NEVER | NEVER_LOCAL | NOT_FOR_INSPECT | ({"numpy"} if "--no-values" in args else set())
    assert not top & never, sorted(top & never)


def test_inspect_of_a_flex_checkpoint_adds_its_coverage_and_merged_view_only():
    code, mods, top = _imports("inspect", str(SAMPLES / "pf_llama_trainer" / "checkpoint-2"))
    assert code == 0
    want = INSPECT | FLEX
    assert mods == want, f"new: {sorted(mods - want)}; gone: {sorted(want - mods)}"
    # its tokenizer.model is read by sentencepiece, as in the inspection of any folder that holds one
    # (surgery/io/tokenizer.py)
    assert not top & ((NEVER - {"sentencepiece"}) | NEVER_LOCAL)


def test_help_imports_no_library_beyond_the_vocabulary():
    code, mods, top = _imports("--help")
    assert code == 0
    assert mods == HELP, f"new: {sorted(mods - HELP)}; gone: {sorted(HELP - mods)}"
    assert not top & ({"numpy", "rich"} | NEVER | NEVER_LOCAL | NOT_FOR_INSPECT)


def test_the_allow_list_is_not_vacuous():
    """The child sees what a command imports: ``tie --dry-run`` runs a planner and the report, which
    ``inspect`` never imports."""
    code, mods, _ = _imports("tie", "--dry-run", str(SAMPLES / "pf_llama_tied_fp32"))
    assert code == 0
    assert {"surgery.plan.tie", "surgery.report"} <= mods - INSPECT
