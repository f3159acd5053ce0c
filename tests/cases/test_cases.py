"""Run every case of ``tests/data/cases`` (see its README) as one pytest test.

Each ``<case>/case.json`` lists tietool commands; they run in order as
``tietool ARGV`` runs (in process, :mod:`support.cli_runner`; cwd = project root, 120 s timeout)
on a writable copy of the case's ``ckpt/`` in the test's temporary folder,
with ``{ckpt}``, ``{out}`` and ``{prev_out}`` substituted. The exit status is
judged against ``expect`` and every check is evaluated by the independent
checker :mod:`support.casecheck`, on the message with the command's folders
written as their placeholders (so a word in a folder name never satisfies a
check). All failures of a case (across all its commands) are reported
together in one message that shows the command line, the exit code, the
output and the values each failing check saw.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import casecheck, cli_runner
from support.fixture_support import copy_checkpoint
from support.paths import BUG_CASES_DIR, REPO

TIMEOUT_S = 120
OUTPUT_LIMIT = 2000

# Cases from the second set of bug reports (c01..c11) that tietool does not pass yet: the vocabulary
# surface is issue 10. The reason names the check that fails today; strict=False, so a case that starts
# passing shows as XPASS instead of failing the run.
ISSUE_10 = "issue 10: vocabulary surface"
KNOWN_FAILING: dict[str, str] = {}


def _uses_pnlp(folder: Path) -> bool:
    """Whether a check of the case loads the output with PaddleNLP 2.8.1 (``encodes`` ``paddlenlp-2.8``)."""
    spec = json.loads((folder / "case.json").read_text(encoding="utf-8"))
    checks = [
        check
        for command in spec.get("commands", [])
        for key in ("checks", "checks_if_ok", "checks_if_refuse")
        for check in command.get(key, [])
    ]
    return any(isinstance(c.get("encodes"), list) and c["encodes"][:1] == ["paddlenlp-2.8"] for c in checks)


def _case_params() -> list:
    """One pytest param per case folder (id = folder name); the known failures are xfail; a case that needs
    PaddleNLP 2.8.1 is marked ``pnlp`` (skipped without ``PNLP_PYTHON``, failed under
    ``TIETOOL_REQUIRE_PNLP``, as every ``pnlp`` test)."""
    folders = sorted(p.parent for p in BUG_CASES_DIR.glob("*/case.json"))
    assert folders, f"no */case.json under {BUG_CASES_DIR}"
    return [
        pytest.param(
            folder,
            id=folder.name,
            marks=(
                [pytest.mark.xfail(strict=False, reason=f"{ISSUE_10}: {KNOWN_FAILING[folder.name]}")]
                if folder.name in KNOWN_FAILING
                else []
            )
            + ([pytest.mark.pnlp] if _uses_pnlp(folder) else []),
        )
        for folder in folders
    ]


def _substitute(argv: list[str], values: dict[str, str]) -> list[str]:
    """Replace every ``{placeholder}`` occurrence in each argument."""
    result = []
    for arg in argv:
        arg = str(arg)
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        result.append(arg)
    return result


def _placeholders(message: str, values: dict[str, Path]) -> str:
    """``message`` with every folder path written as its placeholder (longest path first, so ``{case}``
    never eats the start of ``{ckpt}``)."""
    for key, path in sorted(values.items(), key=lambda kv: len(str(kv[1])), reverse=True):
        message = message.replace(str(path), "{" + key + "}")
    return message


def run_tool(argv: list[str]) -> tuple[int | None, str, str]:
    """Run ``tietool ARGV`` (:func:`support.cli_runner.run_cli`: in process, as a ``python -m tietool``
    child with cwd = the project root would); return ``(returncode or None, stdout, stderr)``."""
    run = cli_runner.run_cli(argv, cwd=REPO, timeout=TIMEOUT_S)
    if run.rc is None:
        return None, run.stdout, run.stderr + f"\n[stopped after {TIMEOUT_S} s timeout]"
    return run.rc, run.stdout, run.stderr


def _truncate(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """Keep the head and the tail of a long output (tracebacks end at the tail)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


def _indent(text: str, prefix: str = "    | ") -> str:
    """Prefix every line, so the tool output stands out in the report."""
    return "\n".join(prefix + line for line in (text.rstrip("\n") or "(no output)").splitlines())


def _report_block(
    index: int, total: int, command: dict, argv: list[str], rc, stdout: str, stderr: str, failures: list[str]
) -> str:
    """Failure section of one command: command line, exit code, failing checks, output."""
    shown = " ".join(argv)
    lines = [
        f"--- command {index}/{total}: tietool {shown}",
        f"    expect: {command.get('expect', 'ok')}; exit code: "
        + ("none (timeout / did not start)" if rc is None else str(rc)),
    ]
    if command.get("note"):
        lines.append(f"    note: {command['note']}")
    lines.append("    failed:")
    lines.extend(f"      - {failure}" for failure in failures)
    message = (stdout or "") + (("\n" if stdout and stderr else "") + (stderr or ""))
    lines.append(f"    output (stdout+stderr, {len(message)} chars):")
    lines.append(_indent(_truncate(message)))
    return "\n".join(lines)


def test_known_failing_cases_exist():
    """Every xfail mark names a case that exists."""
    assert set(KNOWN_FAILING) <= {p.parent.name for p in BUG_CASES_DIR.glob("*/case.json")}


@pytest.mark.parametrize("case_dir", _case_params())
def test_case(case_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Run one case's commands in order and check every expectation."""
    spec = json.loads((case_dir / "case.json").read_text(encoding="utf-8"))
    # a folder named after nothing in the case (tmp_path would carry the test id, the case's name)
    work = tmp_path_factory.mktemp("case")
    ckpt = copy_checkpoint(case_dir / "ckpt", work / "ckpt")  # never run the tool on tests/data
    # second inputs (``ckpt_NAME/``, e.g. a stale copy ``verify`` compares with the first): ``{ckpt_NAME}``
    seconds = {
        p.name: copy_checkpoint(p, work / p.name) for p in sorted(case_dir.glob("ckpt_*")) if p.is_dir()
    }
    commands = spec.get("commands", [])
    original = casecheck.read_checkpoint(ckpt)
    reports: list[str] = []
    prev_out: Path | None = None
    for number, command in enumerate(commands, start=1):
        out = work / f"out{number:02d}"
        folders = {"ckpt": ckpt, **seconds, "out": out, "case": work}
        if prev_out is not None:
            folders["prev_out"] = prev_out
        values = {k: str(v) for k, v in folders.items() if k != "case"}
        argv = _substitute(command["argv"], values)
        input_dir = Path(argv[1]) if len(argv) > 1 else None
        uses_out = any("{out}" in str(a) for a in command["argv"])
        snapshot = casecheck.snapshot_tree(input_dir) if input_dir else None
        input_ckpt = casecheck.read_checkpoint(input_dir) if input_dir else None

        rc, stdout, stderr = run_tool(argv)

        ctx = casecheck.CheckContext(
            out=out if uses_out else None,
            input_dir=input_dir,
            original_dir=ckpt,
            message=_placeholders(stdout + "\n" + stderr, folders),
            input_snapshot=snapshot,
            input_ckpt=input_ckpt,
            original_ckpt=original,
        )
        failures = casecheck.evaluate_command(command, rc, ctx)
        if failures:
            reports.append(_report_block(number, len(commands), command, argv, rc, stdout, stderr, failures))
        prev_out = out
    if reports:
        header = (
            f"case {case_dir.name} ({spec.get('id')}, {spec.get('source')}): "
            f"{len(reports)} of {len(commands)} command(s) failed\n"
            f"summary: {spec.get('summary', '')}\n"
            f"expected: {spec.get('expected', '')}"
        )
        pytest.fail(header + "\n\n" + "\n\n".join(reports), pytrace=False)
