"""The ``tietool`` Typer app. Each command maps options to a :mod:`surgery` call and renders the result.

``surgery`` (and numpy) are imported inside the commands, so ``tietool --help`` imports neither; nothing
here imports paddle.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="tietool",
    help="Inspect, tie, untie and resize the input embedding and LM head of PaddlePaddle LLM checkpoints "
    "(PaddleNLP / PaddleFormers folders: config.json + .pdparams or .safetensors).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Layout(str, Enum):
    auto = "auto"
    vocab_hidden = "vocab-hidden"
    hidden_vocab = "hidden-vocab"


class Keep(str, Enum):
    embedding = "embedding"
    head = "head"


class Init(str, Enum):
    mean = "mean"
    zeros = "zeros"
    normal = "normal"


class Loader(str, Enum):
    paddleformers = "paddleformers"
    paddlenlp_28 = "paddlenlp-2.8"
    paddlenlp_3 = "paddlenlp-3"
    hf = "hf"


# shared option aliases
CkptArg = Annotated[
    Path, typer.Argument(help="checkpoint folder (config.json + weights)", show_default=False)
]
OutOpt = Annotated[
    Path, typer.Option("--out", "-o", help="output folder (must not exist or be empty)", show_default=False)
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


def _run(fn):
    """Run a command body; map tietool errors to one line on stderr and their exit code."""
    from ..surgery.errors import TietoolError

    try:
        return fn()
    except TietoolError as e:
        if _debug():
            raise
        print(f"tietool: error: {e.one_line()}", file=sys.stderr)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(_interrupted()) from None
    except BrokenPipeError:
        # the reader went away (| head): end quietly here (Click would turn it into exit 1)
        _quiet_stdout()
        raise typer.Exit(0) from None
    except typer.Exit:
        raise
    except MemoryError:
        if _debug():
            raise
        print(
            "tietool: error: out of memory; nothing was written — free memory, or check the sizes asked for",
            file=sys.stderr,
        )
        raise typer.Exit(6) from None
    except Exception as e:  # noqa: BLE001 - last resort: never a bare traceback unless asked
        if _debug():
            raise
        print(
            f"tietool: internal error: {type(e).__name__}: {e} (set TIETOOL_DEBUG=1 for the traceback; "
            "please report it)",
            file=sys.stderr,
        )
        raise typer.Exit(70) from None


def _layout(layout: Layout | None) -> str | None:
    return None if layout in (None, Layout.auto) else layout.value


def _detect(c, layout: Layout | None, loader: Loader | None, embedding: str | None, head: str | None):
    """Detection for a write command: the options mapped, values compared."""
    from ..surgery.detect import detect
    from ..surgery.summary import check_found, check_names

    check_names(c, embedding, head)
    det = detect(
        c,
        layout=_layout(layout),
        loader=loader.value if loader else None,
        embedding_name=embedding,
        head_name=head,
        compare_values=True,
    )
    check_found(det)
    return det


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help="show Python tracebacks (also TIETOOL_DEBUG=1)")
    ] = False,
) -> None:
    if debug:
        os.environ["TIETOOL_DEBUG"] = "1"


@app.command()
def inspect(
    ckpt: CkptArg,
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

    def body():
        from ..surgery.summary import inspect_path
        from . import render

        info = inspect_path(
            ckpt,
            layout=_layout(layout),
            loader=loader.value if loader else None,
            embedding_name=embedding,
            head_name=head,
            compare_values=not no_values,
        )
        render.inspect(info, as_json=json_out)

    _run(body)


def _write_command(
    ckpt: Path,
    out: Path,
    make_plan,
    dry_run: bool,
    json_out: bool,
    link: bool,
    quiet: bool,
    keep_training_state: bool = False,
) -> None:
    from ..surgery import report as report_mod
    from ..surgery.checkpoint import Checkpoint
    from ..surgery.write import check_output_path, execute
    from . import render

    c = Checkpoint.open(ckpt)
    if not dry_run:
        check_output_path(c.path, out)
    plan = make_plan(c)
    if dry_run:
        rep = report_mod.build(plan, None, str(out), dry_run=True, keep_training_state=keep_training_state)
        render.report(rep, as_json=json_out)
        return
    with render.progress(quiet or json_out, plan.output_bytes) as advance:
        rep = execute(
            plan,
            out,
            link=link,
            progress=advance,
            report=lambda facts: report_mod.build(plan, facts, str(out)),
            keep_training_state=keep_training_state,
        )
    render.report(rep, as_json=json_out)


@app.command()
def tie(
    ckpt: CkptArg,
    out: OutOpt,
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
) -> None:
    """Drop the LM head (after checking it equals the embedding) and set tie_word_embeddings true."""

    def body():
        from ..surgery.plan import plan_tie

        _write_command(
            ckpt,
            out,
            lambda c: plan_tie(
                _detect(c, layout, loader, embedding, head),
                keep=keep.value if keep else None,
                drop_aliases=drop_aliases,
            ),
            dry_run,
            json_out,
            link,
            quiet,
        )

    _run(body)


@app.command()
def untie(
    ckpt: CkptArg,
    out: OutOpt,
    layout: Annotated[
        Layout,
        typer.Option(
            help="layout of a new head: auto = what the checkpoint's loader expects (PaddleNLP "
            "Llama/Qwen/ChatGLM: hidden-vocab; PaddleFormers and the rest: vocab-hidden)"
        ),
    ] = Layout.auto,
    loader: LoaderOpt = None,
    embedding: EmbOpt = None,
    head: HeadOpt = None,
    dry_run: DryOpt = False,
    json_out: JsonOpt = False,
    link: LinkOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Write the LM head as its own tensor, equal to the embedding, and set tie_word_embeddings false."""

    def body():
        from ..surgery.plan import plan_untie

        _write_command(
            ckpt,
            out,
            lambda c: plan_untie(_detect(c, layout, loader, embedding, head), layout=layout.value),
            dry_run,
            json_out,
            link,
            quiet,
        )

    _run(body)


@app.command()
def resize(
    ckpt: CkptArg,
    out: OutOpt,
    vocab: Annotated[
        str, typer.Option("--vocab", help="new number of rows (vocab_size)", show_default=False)
    ],
    pad_to_multiple_of: Annotated[
        str | None,
        typer.Option("--pad-to-multiple-of", help="round the row count up to a multiple of this"),
    ] = None,
    init: Annotated[
        Init, typer.Option(help="new rows: mean (HF mean_resizing), zeros, or normal(initializer_range)")
    ] = Init.mean,
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
) -> None:
    """Grow or trim the vocabulary rows of the embedding, head and head bias together; update vocab_size."""

    def body():
        from ..surgery.errors import UsageError
        from ..surgery.plan import plan_resize

        def as_int(opt: str, v: str) -> int:
            try:
                n = int(v.strip())
            except ValueError:
                raise UsageError(f"{opt} must be an integer, got {v!r}", fix=f"e.g. {opt} 32000") from None
            if n < 1:
                raise UsageError(
                    f"{opt} must be ≥ 1, got {n}",
                    fix=f"e.g. {opt} 32000" if opt == "--vocab" else f"e.g. {opt} 64",
                )
            return n

        n = as_int("--vocab", vocab)
        m = None if pad_to_multiple_of is None else as_int("--pad-to-multiple-of", pad_to_multiple_of)
        _write_command(
            ckpt,
            out,
            lambda c: plan_resize(_detect(c, layout, loader, embedding, head), n, m, init.value, seed, force),
            dry_run,
            json_out,
            link,
            quiet,
            keep_training_state,
        )

    _run(body)


@app.command()
def verify(
    before: Annotated[Path, typer.Argument(help="the input checkpoint", show_default=False)],
    after: Annotated[Path, typer.Argument(help="the output checkpoint", show_default=False)],
    logits: Annotated[
        bool, typer.Option("--logits", help="also compare logits under PaddleFormers (if installed)")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Check that AFTER differs from BEFORE exactly as tie/untie/resize explain (exit 7 if not)."""

    def body():
        from ..surgery.verify import logits_check
        from ..surgery.verify import verify as run_verify
        from . import render

        res = run_verify(before, after)
        if logits:
            res.logits = logits_check(before, after)
            if res.logits.get("ok") is False:
                res.unexplained.append(f"logits differ: {res.logits}")
        render.verify(res.as_dict(), as_json=json_out)
        if not res.explained:
            print(
                f"tietool: verify: {len(res.unexplained)} difference(s) that tie/untie/resize do not explain "
                f"between {before} and {after} (listed above)",
                file=sys.stderr,
            )
            raise typer.Exit(7)

    _run(body)


_signal_received: int | None = None


def _interrupted() -> int:
    """Say so in one line; the exit code is 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM."""
    print("tietool: interrupted; nothing was written", file=sys.stderr)
    return 128 + (_signal_received or 2)


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
    except typer.Abort:
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
            ctx = getattr(e, "ctx", None)
            where = f" ({ctx.command_path} --help shows the options)" if ctx is not None else ""
            msg = " ".join(e.format_message().split())
            print(f"tietool: error: {msg}{where}", file=sys.stderr)
            code = e.exit_code
    try:
        sys.stdout.flush()  # what is still buffered goes now, while a closed pipe can still be handled
    except BrokenPipeError:
        _quiet_stdout()
    sys.exit(code if isinstance(code, int) else 0)


def _quiet_stdout() -> None:
    """The reader of our output went away (``| head``): not an error of ours. Point stdout at /dev/null so
    that the interpreter's final flush does not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
