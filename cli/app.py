"""The ``tietool`` Typer app. Each command maps options to a :mod:`surgery` call and renders the result.

``surgery`` (and numpy) are imported inside the commands, so ``tietool --help`` imports neither; nothing
here imports paddle.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from ..surgery.model.enums import Init, Keep, Layout, Loader, Target
from ..surgery.model.errors import ExitCode, Opt, set_wording

app = typer.Typer(
    name="tietool",
    help="Inspect, tie, untie and resize the input embedding and LM head of PaddlePaddle LLM checkpoints "
    "(PaddleNLP / PaddleFormers folders: config.json + .pdparams or .safetensors); convert them between "
    "the PaddleNLP and PaddleFormers conventions; merge tensor-parallel rank files.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


# shared option aliases
# folder arguments are strings, not Paths: a URL (s3://bucket/prefix, hf://org/model) must keep its "//"
CkptArg = Annotated[
    str,
    typer.Argument(
        help="checkpoint folder (config.json + weights) or URL (s3://bucket/prefix, hf://org/model); "
        "default: the current folder",
        show_default=False,
        metavar="CKPT",
    ),
]
LocalCkptArg = Annotated[
    str,
    typer.Argument(
        help="checkpoint folder (local: convert and merge refuse URLs); default: the current folder",
        show_default=False,
        metavar="CKPT",
    ),
]
OutOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        "-o",
        help="output folder or URL (must not exist or be empty); without it, CKPT is rewritten in place "
        "(crash-safe, the old version kept as CKPT.tietool-backup-<time>)",
        show_default=False,
        metavar="DIR",
    ),
]
BackupOpt = Annotated[
    bool,
    typer.Option(
        "--backup/--no-backup",
        help="in place: keep the old version beside the checkpoint (it costs only the rewritten shards)",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="print the plan and the report; write nothing")]
LinkOpt = Annotated[
    bool, typer.Option("--link", help="hard-link untouched weight files instead of copying them")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")]
EmbOpt = Annotated[
    str | None,
    typer.Option(
        "--embedding", help="name of the input embedding tensor (for architectures tietool does not know)"
    ),
]
HeadOpt = Annotated[
    str | None,
    typer.Option("--head", help="name of the LM head tensor (for architectures tietool does not know)"),
]
LoaderOpt = Annotated[
    Loader | None,
    typer.Option(
        "--loader", help="the library that will load the output (default: told from the checkpoint)"
    ),
]


def _debug() -> bool:
    return os.environ.get("TIETOOL_DEBUG", "") not in ("", "0")


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
_FLAGS = {"vocab_size": "--vocab", "embedding": "--embedding", "head": "--head"}


def _cli_wording(o: Opt) -> str:
    """``Opt("keep", "head")`` → ``--keep head``; a flag → ``--force``; False → ``--no-backup``."""
    flag = _FLAGS.get(o.name, "--" + o.name.replace("_", "-"))
    if o.value is None or o.value is True:
        return flag
    if o.value is False:
        return "--no-" + flag[2:]
    return f"{flag} {getattr(o.value, 'value', o.value)}"


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


def _run(fn, as_json: bool = False):
    """Run a command body; map tietool errors to one line on stderr (and, with ``--json``, a JSON object on
    stdout) and their exit code."""
    from ..surgery.model.errors import TietoolError

    before = set_wording(_cli_wording)
    try:
        return fn()
    except TietoolError as e:
        if _debug():
            raise
        err = {"type": type(e).__name__, "message": e.message, "path": e.path, "fix": e.fix}
        raise _fail(e.exit_code, f"tietool: error: {e.one_line()}", as_json, err) from None
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


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"tietool {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help="show Python tracebacks (also TIETOOL_DEBUG=1)")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="print the version and exit"),
    ] = False,
) -> None:
    if debug:
        os.environ["TIETOOL_DEBUG"] = "1"


@app.command()
def inspect(
    ckpts: Annotated[
        list[str] | None,
        typer.Argument(
            help="checkpoint folder(s) or URL(s); default: the current folder. Several: a table row each "
            "(a JSON list)",
            show_default=False,
            metavar="CKPT",
        ),
    ] = None,
    json_out: JsonOpt = False,
    layout: Annotated[Layout | None, typer.Option(help="head layout, when vocab_size == hidden_size")] = None,
    loader: LoaderOpt = None,
    embedding: EmbOpt = None,
    head: HeadOpt = None,
    no_values: Annotated[
        bool,
        typer.Option(
            "--no-values",
            help="read headers only: do not read the embedding and head to compare their values "
            "(fast on cold or remote storage; 'tied by value' is then not known)",
        ),
    ] = False,
) -> None:
    """Show the embedding, head and bias, their layout, the tie state three ways, and what tying saves."""
    paths = ckpts or ["."]

    def one(p: str):
        from ..surgery import ops as operations

        return operations.inspect(
            p, layout=layout, loader=loader, embedding=embedding, head=head, compare_values=not no_values
        )

    def body():
        from . import render

        if len(paths) == 1:
            info = one(paths[0])
            render.inspect(finite(dict(info)) if json_out else info, as_json=json_out)
            return
        from .many import inspect_many

        code = inspect_many(paths, one, json_out)
        if code:
            raise typer.Exit(code)

    _run(body, json_out)


def _render_write(rep: dict, as_json: bool) -> None:
    """The report, and for an in-place run where the old version went and what earlier runs left."""
    from . import render

    render.report(finite(dict(rep)) if as_json else rep, as_json=as_json)
    _stale_notes(rep, as_json)
    ip = rep.get("in_place")
    if ip and ip.get("left_to_delete"):  # on stderr, with --json too
        _left_to_delete_warning(rep["input"], ip)
    if as_json or not ip:
        return
    render.recovered(ip.get("recovered") or {})
    if not ip.get("written"):
        print("in place: nothing written" + (" (dry run)" if rep.get("dry_run") else " (nothing to change)"))
    elif ip.get("backup"):
        q_in, q_bak = shlex.quote(rep["input"]), shlex.quote(ip["backup"])
        print(
            f"in place: {rep['input']} rewritten; the previous version is {ip['backup']} "
            f"(restore: rm -rf {q_in} && mv {q_bak} {q_in}; delete it when satisfied)"
        )
    else:
        print(f"in place: {rep['input']} rewritten (no backup kept)")
    if ip.get("written") and _inside(Path(rep["input"])):
        print("note: your shell is still inside the previous version's folder: run `cd .` to see the new one")


def _left_to_delete_warning(ckpt: str, ip: dict) -> None:
    """The one warning line of an in-place run without a backup whose old version could not be deleted
    completely: the name holds the new version (exit 0), what is left, and how to remove it."""
    left = shlex.quote(ip["left_to_delete"])
    print(
        f"tietool: warning: {ckpt} holds the new version, but the previous version could not be "
        f"deleted completely ({ip['delete_error']}); what is left is {ip['left_to_delete']} — "
        f"remove it with: chmod -R u+w {left} && rm -rf {left} (the next tietool run on it tries again)",
        file=sys.stderr,
    )


def _stale_notes(rep: dict, as_json: bool) -> None:
    """A note for each temporary folder of a killed run that the write removed (``removed_stale_temps``)."""
    for p in () if as_json else rep.get("removed_stale_temps", ()):
        print(f"note: removed {p}, the temporary folder of an interrupted run (its process is gone)")


def _inside(folder: Path) -> bool:
    """The current folder was ``folder`` (or inside it) before a swap: its path still names ``folder``."""
    here = Path(os.environ.get("PWD") or os.getcwd())
    return here == folder or folder in here.parents


def _progress(quiet: bool):
    """The progress-bar factory the operations take (None: no bar)."""
    from functools import partial

    from . import render

    return None if quiet else partial(render.progress, False)


@app.command()
def tie(
    ckpt: CkptArg = ".",
    out: OutOpt = None,
    keep: Annotated[
        Keep | None, typer.Option(help="when head and embedding differ: which values to keep")
    ] = None,
    drop_aliases: Annotated[
        bool,
        typer.Option(
            "--drop-aliases",
            help="also drop copies of the embedding under alias names (T5/BART encoder/decoder)",
        ),
    ] = False,
    layout: Annotated[Layout | None, typer.Option(help="head layout, when vocab_size == hidden_size")] = None,
    loader: LoaderOpt = None,
    embedding: EmbOpt = None,
    head: HeadOpt = None,
    dry_run: DryOpt = False,
    json_out: JsonOpt = False,
    link: LinkOpt = False,
    quiet: QuietOpt = False,
    backup: BackupOpt = True,
) -> None:
    """Drop the LM head (after checking it equals the embedding) and set tie_word_embeddings true."""

    def body():
        from ..surgery import ops as operations

        rep = operations.tie(
            ckpt,
            out,
            keep=keep,
            drop_aliases=drop_aliases,
            layout=layout,
            loader=loader,
            embedding=embedding,
            head=head,
            dry_run=dry_run,
            link=link,
            progress=_progress(quiet or json_out),
            backup=backup,
        )
        _render_write(rep, json_out)

    _run(body, json_out)


@app.command()
def untie(
    ckpt: CkptArg = ".",
    out: OutOpt = None,
    layout: Annotated[
        Layout,
        typer.Option(
            help="layout of a new head: auto = what the checkpoint's loader expects (PaddleNLP "
            "Llama/Qwen/ChatGLM: hidden-vocab; PaddleFormers and the rest: vocab-hidden)"
        ),
    ] = Layout.AUTO,
    loader: LoaderOpt = None,
    embedding: EmbOpt = None,
    head: HeadOpt = None,
    dry_run: DryOpt = False,
    json_out: JsonOpt = False,
    link: LinkOpt = False,
    quiet: QuietOpt = False,
    backup: BackupOpt = True,
) -> None:
    """Write the LM head as its own tensor, equal to the embedding, and set tie_word_embeddings false."""

    def body():
        from ..surgery import ops as operations

        rep = operations.untie(
            ckpt,
            out,
            layout=layout,
            loader=loader,
            embedding=embedding,
            head=head,
            dry_run=dry_run,
            link=link,
            progress=_progress(quiet or json_out),
            backup=backup,
        )
        _render_write(rep, json_out)

    _run(body, json_out)


@app.command()
def resize(
    ckpt: CkptArg = ".",
    out: OutOpt = None,
    vocab: Annotated[
        int | None,
        typer.Option(
            "--vocab",
            min=1,
            help="new number of rows (vocab_size); without it, --pad-to-multiple-of rounds up the rows",
            show_default=False,
            metavar="ROWS",
        ),
    ] = None,
    pad_to_multiple_of: Annotated[
        int | None,
        typer.Option(
            "--pad-to-multiple-of",
            min=1,
            help="round the row count up to a multiple of this (as HF resize_token_embeddings)",
            metavar="N",
        ),
    ] = None,
    init: Annotated[
        Init, typer.Option(help="new rows: mean (HF mean_resizing), zeros, or normal(initializer_range)")
    ] = Init.MEAN,
    seed: Annotated[int | None, typer.Option(help="random seed for new rows (same seed: same bytes)")] = None,
    force: Annotated[bool, typer.Option("--force", help="allow trimming rows")] = False,
    keep_training_state: Annotated[
        bool,
        typer.Option(
            "--keep-training-state",
            help="copy optimizer state, master weights, scheduler, trainer_state.json and rng state to the "
            "output (stale: they match the old vocabulary); by default they are left out",
        ),
    ] = False,
    layout: Annotated[Layout | None, typer.Option(help="head layout, when vocab_size == hidden_size")] = None,
    loader: LoaderOpt = None,
    embedding: EmbOpt = None,
    head: HeadOpt = None,
    dry_run: DryOpt = False,
    json_out: JsonOpt = False,
    link: LinkOpt = False,
    quiet: QuietOpt = False,
    backup: BackupOpt = True,
) -> None:
    """Grow or trim the vocabulary rows of the embedding, head and head bias together; update vocab_size."""

    def body():
        from ..surgery import ops as operations
        from ..surgery.model.errors import UsageError

        if vocab is None and pad_to_multiple_of is None:
            raise UsageError(
                "resize needs the new number of rows",
                fix="pass --vocab ROWS, or --pad-to-multiple-of N to round the current rows up",
            )
        rep = operations.resize(
            ckpt,
            vocab,
            out,
            pad_to_multiple_of=pad_to_multiple_of,
            init=init,
            seed=seed,
            force=force,
            keep_training_state=keep_training_state,
            layout=layout,
            loader=loader,
            embedding=embedding,
            head=head,
            dry_run=dry_run,
            link=link,
            progress=_progress(quiet or json_out),
            backup=backup,
        )
        _render_write(rep, json_out)

    _run(body, json_out)


@app.command()
def merge(
    ckpt: LocalCkptArg = ".",
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            "-o",
            help="output folder (required; must not exist or be empty)",
            show_default=False,
            metavar="DIR",
        ),
    ] = None,
    max_shard_size: Annotated[
        str,
        typer.Option(
            "--max-shard-size",
            help="largest weight file: bytes, or a size as save_pretrained takes it (10GB, 500MiB)",
            metavar="SIZE",
        ),
    ] = "10GB",
    dry_run: DryOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Merge tensor-parallel rank files (model_state.tp00.pdparams, ...; also _pp00 pipeline ranks) into one
    checkpoint."""

    def body():
        from ..surgery import ops as operations
        from ..surgery.model.errors import UsageError

        if out is None:
            raise UsageError("merge writes a new checkpoint", fix="pass --out DIR (a new folder)")
        rep = operations.merge(
            ckpt,
            out,
            max_shard_size=max_shard_size,
            dry_run=dry_run,
            progress=_progress(quiet or json_out),
        )
        _render_merge(rep, json_out)
        _stale_notes(rep, json_out)

    _run(body, json_out)


def _render_merge(rep: dict, as_json: bool) -> None:
    """The merge report: JSON, or one line per tensor (rule, axis, shape) and a summary."""
    if as_json:
        import json

        print(json.dumps(finite(dict(rep)), indent=2))
        return
    for t in rep["tensors"]:
        axis = "" if t["axis"] is None else f" on axis {t['axis']}"
        print(f"  {t['name']}: {t['rule']}{axis} -> {t['dtype']} {t['shape']}")
    for k, (before, after) in rep["config_changes"].items():
        print(f"config.json: {k} {before} -> {after}")
    for f in rep["left_out"]:
        print(f"left out: {f}")
    if rep["dry_run"]:
        print(
            f"dry run: would merge {len(rep['rank_files'])} rank files into {len(rep['tensors'])} tensors in "
            f"{', '.join(rep['weight_files'])}; nothing was written"
        )
        return
    print(
        f"merged {len(rep['rank_files'])} rank files ({rep['tensor_parallel']} tensor-parallel x "
        f"{rep['pipeline_parallel']} pipeline) into {rep['output']}: {len(rep['tensors'])} tensors in "
        f"{', '.join(rep['weight_files'])}"
    )


class _PlainUsage(TyperCommand):
    """A command whose usage line names required arguments as ``BEFORE``, not Typer's ``{BEFORE}``."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [
            p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in super().collect_usage_pieces(ctx)
        ]


@app.command(cls=_PlainUsage)
def verify(
    before: Annotated[str, typer.Argument(help="the input checkpoint", show_default=False, metavar="BEFORE")],
    after: Annotated[str, typer.Argument(help="the output checkpoint", show_default=False, metavar="AFTER")],
    logits: Annotated[
        bool,
        typer.Option(
            "--logits",
            help="also compare logits under PaddleFormers (exit 8 when they cannot be compared)",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Check that AFTER differs from BEFORE exactly as tie/untie/resize explain (exit 7 if not; 8 when
    --logits could not compare the logits)."""

    def body():
        from ..surgery import ops as operations
        from . import render

        res = operations.verify(before, after, logits=logits)
        render.verify(finite(res.as_dict()) if json_out else res.as_dict(), as_json=json_out)
        if res.exit_code == ExitCode.UNEXPLAINED:
            print(
                f"tietool: verify: {len(res.unexplained)} difference(s) that tie/untie/resize do not explain "
                f"between {before} and {after} (listed above)",
                file=sys.stderr,
            )
        if res.logits and res.logits.get("ok") is None:  # exit NOT_COMPARED (8) unless 7 already
            print(f"tietool: verify: {res.logits.get('error')}", file=sys.stderr)
        raise typer.Exit(res.exit_code)

    _run(body, json_out)


@app.command()
def convert(
    ckpt: LocalCkptArg = ".",
    to: Annotated[
        Target,
        typer.Option(
            "--to",
            help="paddleformers: HF names, Linear [out, in], safetensors; paddlenlp: PaddleNLP 2.x names, "
            "Linear [in, out], head [hidden, vocab], .pdparams; safetensors/pdparams: the container only",
            show_default=False,
        ),
    ] = ...,  # type: ignore[assignment]
    out: Annotated[
        str, typer.Option("--out", "-o", help="output folder (must not exist or be empty)", metavar="DIR")
    ] = ...,  # type: ignore[assignment]
    max_shard_size: Annotated[
        str,
        typer.Option(
            "--max-shard-size",
            help="bytes per shard at most: 10GB = 10*10**9, 500MB, 2GiB or a number",
            metavar="SIZE",
        ),
    ] = "10GB",
    dry_run: DryOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Convert between PaddleNLP 2.x and PaddleFormers layouts, or change only the container."""

    def body():
        from ..surgery import ops as operations
        from . import render

        rep = operations.convert(
            ckpt,
            to,
            out,
            max_shard_size=max_shard_size,
            dry_run=dry_run,
            progress=_progress(quiet or json_out),
        )
        render.convert(finite(rep) if json_out else rep, as_json=json_out)
        _stale_notes(rep, json_out)

    _run(body, json_out)


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


def main() -> None:
    """Console-script entry point: usage errors become one line, like tietool's own errors; SIGTERM and
    SIGHUP unwind like Ctrl-C (the temporary output folder is removed)."""
    import signal

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, _on_signal)
    try:
        code = app(standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):  # KeyboardInterrupt: a signal while Typer builds the commands
        code = _interrupted()
    except BrokenPipeError:
        _quiet_stdout()
        code = 0
    except Exception as e:  # noqa: BLE001
        # Click's usage errors (Typer vendors Click): duck-typed, as their classes are not public Typer API
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")) or _debug():
            raise
        if type(e).__name__ == "NoArgsIsHelpError":
            print(e.format_message())
            code = 0
        else:
            msg = " ".join(e.format_message().replace("Value error, ", "").split()).rstrip(".")
            as_json = "--json" in sys.argv[1:]
            fix = _usage_fix(e)
            err = {"type": "UsageError", "path": None, "fix": fix.removeprefix(" — ") or None}
            code = _fail(e.exit_code, f"tietool: error: {msg}{fix}", as_json, err).exit_code
    if code == ExitCode.INTERRUPTED + 2 and not _announced:
        # Typer turns a KeyboardInterrupt while it parses the arguments (before any work) into a silent
        # Exit(130), even for SIGTERM: say so, with the signal's code
        code = _interrupted()
    try:
        sys.stdout.flush()  # what is still buffered goes now, while a closed pipe can still be handled
    except BrokenPipeError:
        _quiet_stdout()
    sys.exit(code if isinstance(code, int) else 0)


# a valid value to show for an option given a bad one
_EXAMPLES = {
    "--vocab": "--vocab 32000",
    "--pad-to-multiple-of": "--pad-to-multiple-of 64",
    "--seed": "--seed 0",
    "--to": "--to paddleformers",
}


def _usage_fix(e: Exception) -> str:
    """The `` — fix`` part of a Click usage error: a valid example of the option, or where the help is."""
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
