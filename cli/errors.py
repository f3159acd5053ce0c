"""How the command line fails: every exception becomes one line on stderr and an exit code (README's table).

- :func:`command` wraps a command's function: a :class:`~tietool.surgery.model.errors.TietoolError` becomes
  ``tietool: error: <one line>`` and its ``exit_code``; with ``--json`` also ``{"error": {...},
  "exit_code": N}`` on stdout. A MemoryError is exit 6, any other exception ``tietool: internal error``
  (exit 1), unless ``--debug`` / ``TIETOOL_DEBUG=1`` asks for the traceback. While a command runs, the
  library words an option the way the command line spells it (:func:`_cli_wording`: ``--keep head``).
- :func:`run_app` is the console script: Click's usage errors become tietool's one line (with an example
  of the option, :data:`_EXAMPLES`); SIGTERM and SIGHUP unwind like Ctrl-C (the temporary output folder is
  removed) and exit 128 + the signal; a closed pipe (``| head``) ends quietly with 0.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from ..surgery.model.errors import ExitCode, Opt, TietoolError, set_wording


def _debug() -> bool:
    return os.environ.get("TIETOOL_DEBUG", "") not in ("", "0")


def finite(doc):
    """``doc`` with every non-finite float (an inf or NaN max |difference|) as the string ``"inf"``,
    ``"-inf"`` or ``"nan"``: strict JSON has no such numbers, and ``json.dumps`` would write ``Infinity``,
    which JSON parsers refuse."""
    import math

    if isinstance(doc, float) and not math.isfinite(doc):
        return "nan" if math.isnan(doc) else ("inf" if doc > 0 else "-inf")
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [finite(v) for v in doc]
    return doc


def error_fields(e: TietoolError) -> dict:
    """The ``error`` object of ``--json`` output for a tietool error: type, message, path, fix."""
    return {"type": type(e).__name__, "message": e.message, "path": e.path, "fix": e.fix}


def _fail(code: int, line: str, as_json: bool, error: dict | None = None) -> typer.Exit:
    """Say ``line`` on stderr (one line); with ``--json`` also print ``{"error": {...}, "exit_code": N}`` on
    stdout, so that ``tietool ... --json | python -m json.tool`` reads an object. Returns the Exit."""
    print(line, file=sys.stderr)
    if as_json:
        import json

        body = {"message": line.removeprefix("tietool: ").removeprefix("error: "), **(error or {})}
        print(json.dumps(finite({"error": body, "exit_code": int(code)}), indent=2))
    return typer.Exit(code)


# the command-line spelling of an operation's option, where it is not "--" + the name with dashes
_FLAGS = {"vocab_size": "--vocab", "embedding": "--embedding", "head": "--head", "corpus": "--keep-corpus"}


def _cli_wording(o: Opt) -> str:
    """``Opt("keep", "head")`` → ``--keep head``; a flag → ``--force``; False → ``--no-backup``."""
    flag = _FLAGS.get(o.name, "--" + o.name.replace("_", "-"))
    if o.value is None or o.value is True:
        return flag
    if o.value is False:
        return "--no-" + flag[2:]
    return f"{flag} {getattr(o.value, 'value', o.value)}"


def _run(fn: Callable[[], Any], as_json: bool = False) -> Any:
    """Run a command body; map tietool errors to one line on stderr (and, with ``--json``, a JSON object on
    stdout) and their exit code."""
    before = set_wording(_cli_wording)
    try:
        return fn()
    except TietoolError as e:
        if _debug():
            raise
        raise _fail(e.exit_code, f"tietool: error: {e.one_line()}", as_json, error_fields(e)) from None
    except KeyboardInterrupt as e:
        raise typer.Exit(_interrupted(getattr(e, "state", None))) from None
    except BrokenPipeError:
        # the reader went away (| head): end quietly here (Click would turn it into exit 1)
        _quiet_stdout()
        raise typer.Exit(0) from None
    except typer.Exit:
        raise
    except MemoryError:
        if _debug():
            raise
        line = (
            "tietool: error: out of memory; nothing was written — free memory, or check the sizes asked for"
        )
        raise _fail(ExitCode.OUTPUT, line, as_json, {"type": "MemoryError"}) from None
    except Exception as e:  # noqa: BLE001 - last resort: never a bare traceback unless asked
        if _debug():
            raise
        line = (
            f"tietool: internal error: {type(e).__name__}: {e} (set TIETOOL_DEBUG=1 for the traceback; "
            "please report it)"
        )
        raise _fail(ExitCode.INTERNAL, line, as_json, {"type": type(e).__name__}) from None
    finally:
        set_wording(before)  # a Python caller of the app (CliRunner) gets its own wording back


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A Typer command function run under :func:`_run`: its errors become one line and an exit code (with
    its ``json_out`` argument, also a JSON error object on stdout). The signature, name and docstring are
    the function's own (``functools.wraps``), so Typer builds the same options and ``--help`` from it."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _run(functools.partial(fn, *args, **kwargs), bool(kwargs.get("json_out", False)))

    return run


_signal_received: int | None = None
_announced = False  # the "interrupted" line was printed


def _interrupted(state: str | None = None) -> int:
    """Say so in one line (an in-place run's ``state``: what the checkpoint's name holds now); the exit
    code is 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM."""
    global _announced
    _announced = True
    print(f"tietool: interrupted; {state or 'nothing was written'}", file=sys.stderr)
    return ExitCode.INTERRUPTED + (_signal_received or 2)


def _on_signal(signum, _frame):
    # unwinds like Ctrl-C, so the temporary output folder is removed; the exit code says which signal
    global _signal_received
    _signal_received = signum
    raise KeyboardInterrupt


def _ignore_signals() -> None:
    """Ignore Ctrl-C, SIGTERM and SIGHUP from here to the exit. Without it, a Ctrl-C that
    came after an in-place run had printed its whole report ended the process by the signal (exit -2, no
    "interrupted" line) while the name held the new version, complete."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)


_COMMANDS: dict[int, Any] = {}


def _command(app: typer.Typer) -> Any:
    """``app``'s Click command, built once per process (``typer.main.get_command``, which ``app()`` calls
    anew on every run: ~10 ms of start-up that an in-process caller, the test suite's runner, paid per
    run). ``app()`` adds only Typer's pretty exception hook around it, which tietool disables
    (``pretty_exceptions_enable=False``)."""
    key = id(app)
    if key not in _COMMANDS:
        _COMMANDS[key] = typer.main.get_command(app)
    return _COMMANDS[key]


def run_app(app: typer.Typer) -> None:
    """Run ``app`` as the console script (:func:`cli.app.main`): usage errors become one line, like
    tietool's own errors; SIGTERM and SIGHUP unwind like Ctrl-C (the temporary output folder is removed).
    Ends the process with the exit code."""
    import signal

    from .coercion import install

    install()  # Typer's coercion without pydantic where it is not needed (start-up)
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, _on_signal)
    try:
        # named tietool under `python -m tietool` too: shell completion keys on the name (_TIETOOL_COMPLETE)
        code = _command(app)(standalone_mode=False, prog_name="tietool")
    except (typer.Abort, KeyboardInterrupt):  # KeyboardInterrupt: a signal while Typer builds the commands
        code = _interrupted()
    except BrokenPipeError:
        _quiet_stdout()
        code = 0
    except Exception as e:  # noqa: BLE001
        # Click's usage errors (Typer vendors Click): duck-typed, as their classes are not public Typer API
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")) or _debug():
            raise
        code = _usage_error(e)
    _ignore_signals()  # the work is done and said: a signal now would only kill the exit (rc -2, no line)
    if code == ExitCode.INTERRUPTED + 2 and not _announced:
        # Typer turns a KeyboardInterrupt while it parses the arguments (before any work) into a silent
        # Exit(130), even for SIGTERM: say so, with the signal's code
        code = _interrupted()
    try:
        sys.stdout.flush()  # what is still buffered goes now, while a closed pipe can still be handled
    except BrokenPipeError:
        _quiet_stdout()
    sys.exit(code if isinstance(code, int) else 0)


def _usage_error(e: Any) -> int:
    """A Click usage error in tietool's one line (``tietool: error: ... — fix``; with ``--json`` also the
    error object), or the help of ``tietool`` run with no arguments (exit 0). Returns the exit code."""
    if type(e).__name__ == "NoArgsIsHelpError":
        print(e.format_message())
        return 0
    msg = " ".join(e.format_message().replace("Value error, ", "").split()).rstrip(".")
    as_json = "--json" in sys.argv[1:]
    fix = _usage_fix(e)
    err = {"type": "UsageError", "path": None, "fix": fix.removeprefix(" — ") or None}
    return _fail(e.exit_code, f"tietool: error: {msg}{fix}", as_json, err).exit_code


# a valid value to show for an option given a bad one
_EXAMPLES = {
    "--vocab": "--vocab 32000",
    "--pad-to-multiple-of": "--pad-to-multiple-of 64",
    "--seed": "--seed 0",
    "--to": "--to paddleformers",
    "--out": "--out DIR (a new folder)",
}


def _usage_fix(e: Exception) -> str:
    """The `` — fix`` part of a Click usage error: a valid example of the option, or where the help is; for
    an "option" that is a negative number (Click reads any argument starting with ``-`` as one: a token
    ``-1`` of ``add-tokens``, a pair ``-1=<x>`` of ``rename-tokens``), how to pass it, and for such a pair
    that token ids count from 0."""
    name = getattr(e, "option_name", None)
    if type(e).__name__ == "NoSuchOption" and isinstance(name, str) and name[1:2].isdigit():
        pair = any(a.startswith(name + "=") for a in sys.argv[1:])
        ids = "token ids count from 0 (e.g. 128002=<think>); " if pair else ""
        return (
            f" — an argument starting with '-' is read as an option: {ids}put -- before an argument that "
            "must start with '-'"
        )
    param = getattr(e, "param", None)
    example = next((_EXAMPLES[o] for o in getattr(param, "opts", ()) if o in _EXAMPLES), None)
    if example:
        return f" — e.g. {example}"
    ctx = getattr(e, "ctx", None)
    return f" — {ctx.command_path} --help shows the options" if ctx is not None else ""


def _quiet_stdout() -> None:
    """The reader of our output went away (``| head``): not an error of ours. Point stdout at /dev/null so
    that the interpreter's final flush does not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
