"""Where the tests find their data: ``tests/data`` inside the repository (see ``tests/data/README.md``).

Nothing here points outside the repository. The data is read-only input: copy a checkpoint to a temporary
folder before a tool or a loader touches it.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
DATA = TESTS / "data"

FIXTURES = DATA / "fixtures"  # real PaddleFormers / PaddleNLP checkpoints and library oracles
CASES_DIR = FIXTURES / "cases"  # fixtures/cases/<name>/: one checkpoint folder each
EXPECTED_DIR = FIXTURES / "expected"  # fixtures/expected/<name>.json: what each fixture holds
ORACLES_DIR = FIXTURES / "oracles"  # the libraries' resize outputs and stored logits
INPUT_IDS = ORACLES_DIR / "input_ids.npy"  # the fixed batch every logits comparison runs

BUG_CASES_DIR = DATA / "cases"  # cases/<case>/{case.json, ckpt/}: inputs from public bug reports

PF_LOGITS = DATA / "tools" / "pf_logits.py"  # PaddleFormers 1.2 logits of a folder (subprocess)
PF_LOGITS_KW = TESTS / "support" / "pf_logits_kw.py"  # the same, with from_pretrained keyword arguments
SAMPLES = REPO / "sample_checkpoints"  # the shipped sample checkpoints
FLEX = DATA / "flex"  # PaddleFormers Trainer flex checkpoints (see its README)
TOKENIZERS = DATA / "tokenizers"  # real tokenizers of every format (see its README)


def node_id(request) -> str:
    """The running test's node id as the proof tables record it (``tests/...py::test_x[param]``): without
    the ``@group`` suffix pytest-xdist's ``--dist loadgroup`` adds to a grouped test's id."""
    nid = str(request.node.nodeid)
    at = nid.rfind("@")
    return nid[:at] if at > nid.rfind("]") and at > nid.rfind("::") else nid
