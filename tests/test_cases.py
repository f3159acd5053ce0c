"""Run every case of /work/shared/cases as one pytest test.

Each ``<case>/case.json`` lists tietool commands; they run in order as
``python -m cli ARGV`` subprocesses (cwd = project root, project root on
PYTHONPATH, 120 s timeout) with ``{ckpt}``, ``{out}`` and ``{prev_out}``
substituted. The exit status is judged against ``expect`` and every check is
evaluated by the independent checker :mod:`casecheck`. All failures of a case
(across all its commands) are reported together in one message that shows the
command line, the exit code, the output and the values each failing check saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import casecheck  # noqa: E402  (import after the sys.path tweak)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CASES_DIR = SHARED / "cases"
TIMEOUT_S = 120
OUTPUT_LIMIT = 2000


def _case_params() -> list:
    """One pytest param per case folder (id = folder name), or a skipped stub."""
    if not CASES_DIR.is_dir():
        reason = f"shared case folder {CASES_DIR} not found"
        return [pytest.param(None, id="no-cases", marks=pytest.mark.skip(reason=reason))]
    folders = sorted(p.parent for p in CASES_DIR.glob("*/case.json"))
    if not folders:
        reason = f"no */case.json under {CASES_DIR}"
        return [pytest.param(None, id="no-cases", marks=pytest.mark.skip(reason=reason))]
    return [pytest.param(folder, id=folder.name) for folder in folders]


def _substitute(argv: list[str], values: dict[str, str]) -> list[str]:
    """Replace every ``{placeholder}`` occurrence in each argument."""
    result = []
    for arg in argv:
        arg = str(arg)
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        result.append(arg)
    return result


def _tool_env() -> dict[str, str]:
    """The current environment with the project root prepended to PYTHONPATH."""
    env = dict(os.environ)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + old if old else "")
    return env


def run_tool(argv: list[str]) -> tuple[int | None, str, str]:
    """Run ``python -m cli ARGV``; return ``(returncode or None, stdout, stderr)``."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "cli", *argv],
            cwd=PROJECT_ROOT,
            env=_tool_env(),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:

        def text(data) -> str:
            if isinstance(data, bytes):
                return data.decode("utf-8", "replace")
            return data or ""

        return None, text(exc.stdout), text(exc.stderr) + f"\n[killed after {TIMEOUT_S} s timeout]"
    except OSError as exc:
        return None, "", f"[could not start the tool: {exc}]"
    return proc.returncode, proc.stdout, proc.stderr


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


@pytest.mark.parametrize("case_dir", _case_params())
def test_case(case_dir: Path, tmp_path: Path) -> None:
    """Run one case's commands in order and check every expectation."""
    spec = json.loads((case_dir / "case.json").read_text(encoding="utf-8"))
    ckpt = case_dir / "ckpt"
    commands = spec.get("commands", [])
    original = casecheck.read_checkpoint(ckpt)
    reports: list[str] = []
    prev_out: Path | None = None
    for number, command in enumerate(commands, start=1):
        out = tmp_path / f"out{number:02d}"
        values = {"ckpt": str(ckpt), "out": str(out)}
        if prev_out is not None:
            values["prev_out"] = str(prev_out)
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
            message=stdout + "\n" + stderr,
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
