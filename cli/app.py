"""The ``tietool`` Typer app: nine commands, each flags → one :mod:`surgery` call → :mod:`cli.render`.

The flags are :mod:`cli.options`; :func:`cli.errors.command` turns a command's errors into one line and an
exit code; every line printed is :mod:`cli.render`'s. ``surgery.ops`` (and numpy) are imported inside the
commands, as is :mod:`cli.render` (and rich), so ``tietool --help`` imports none of them; nothing here
imports paddle.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from ..surgery.model.enums import Init, Layout
from ..surgery.model.errors import TietoolError, UsageError
from .errors import command, error_fields, run_app
from .help import EXAMPLES, Command
from .options import (
    AfterArg,
    BeforeArg,
    CkptArg,
    CkptsArg,
    ConvertOutOpt,
    ConvertShardOpt,
    DebugOpt,
    DiffAArg,
    DiffBArg,
    DiffNoValuesOpt,
    DriftOpt,
    DropAliasesOpt,
    DryOpt,
    EmbOpt,
    ForceOpt,
    HeadOpt,
    InitOpt,
    JsonOpt,
    KeepOpt,
    KeepPaddleLayoutOpt,
    LayoutOpt,
    LoaderOpt,
    LocalCkptArg,
    LogitsOpt,
    LogitsWithOpt,
    MergeOutOpt,
    MergeShardOpt,
    NewHeadLayoutOpt,
    NoValuesOpt,
    OutOpt,
    PadOpt,
    QuietOpt,
    SeedOpt,
    SpecialOpt,
    TokenCkptArg,
    TokenFileOpt,
    TokenInitOpt,
    TokenPadOpt,
    TokensArg,
    ToOpt,
    VerboseOpt,
    VocabOpt,
    edits,
    write_options,
)
from .vocab import register as register_vocab

if TYPE_CHECKING:
    from ..surgery.results import Report
    from ..surgery.run import WriteOptions

app = typer.Typer(
    name="tietool",
    help="Inspect, tie, untie and resize the input embedding and LM head of PaddlePaddle LLM checkpoints "
    "(PaddleNLP / PaddleFormers folders: config.json + .pdparams or .safetensors), add tokens to model and "
    "tokenizer together, rename tokens into reserved slots, prune the vocabulary to a keep-list, transplant "
    "a donor's tokenizer, fix untrained rows, verify what a write "
    "changed, diff any two checkpoints; convert between the PaddleNLP and PaddleFormers conventions; merge "
    "tensor- or expert-parallel rank files and PaddleFormers Trainer (flex) checkpoints.",
    epilog=EXAMPLES["tietool"],
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__
        from . import render

        render.version(__version__)
        raise typer.Exit(0)


@app.callback()
def _main(
    debug: DebugOpt = False,
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="print the version and exit"),
    ] = False,
) -> None:
    if debug:
        os.environ["TIETOOL_DEBUG"] = "1"


@app.command(cls=Command, epilog=EXAMPLES["inspect"])
@command
def inspect(
    ckpts: CkptsArg = None,
    json_out: JsonOpt = False,
    layout: LayoutOpt = None,
    loader: LoaderOpt = None,
    embedding: EmbOpt = None,
    head: HeadOpt = None,
    no_values: NoValuesOpt = False,
    drift: DriftOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Show the embedding, head and bias, their layout, the tie state three ways, and what tying saves."""
    from ..surgery import ops
    from . import render

    def one(p: str):
        return ops.inspect(
            p, layout=layout, loader=loader, embedding=embedding, head=head, compare_values=not no_values
        )

    paths = ckpts or ["."]
    if len(paths) == 1:
        info = one(paths[0])
        render.inspect(info, as_json=json_out, drift=drift, quiet=quiet)
        if info.exit_code:  # a flex checkpoint with a gap: the report, then one line and exit 3
            render.inspect_failed(info, quiet=quiet)
            raise typer.Exit(info.exit_code)
        return
    results, code = _each(paths, one)
    render.inspect_many(results, as_json=json_out, quiet=quiet)
    if code:
        raise typer.Exit(code)


def _each(paths: list[str], inspect_one) -> tuple[list[dict], int]:
    """``inspect_one`` of every folder, in order: its inspection, or for a folder it refused (a
    ``TietoolError``) ``{"path", "error", "exit_code"}``; and the exit code: 0, or the first failure's."""
    results: list[dict] = []
    code = 0
    for p in paths:
        try:
            info = inspect_one(p)
            code = code or int(info.get("exit_code", 0))
            results.append(dict(info))
        except TietoolError as e:
            code = code or int(e.exit_code)
            results.append({"path": str(p), "error": error_fields(e), "exit_code": int(e.exit_code)})
    return results, code


@app.command(cls=Command, epilog=EXAMPLES["tie"])
@command
@edits()
def tie(
    ckpt: CkptArg = ".",
    out: OutOpt = None,
    keep: KeepOpt = None,
    drop_aliases: DropAliasesOpt = False,
    *,
    options: WriteOptions,
) -> Report:
    """Drop the LM head (after checking it equals the embedding) and set tie_word_embeddings true."""
    from ..surgery import ops

    return ops.tie(ckpt, out, keep=keep, drop_aliases=drop_aliases, options=options)


@app.command(cls=Command, epilog=EXAMPLES["untie"])
@command
@edits(layout=(NewHeadLayoutOpt, Layout.AUTO))
def untie(ckpt: CkptArg = ".", out: OutOpt = None, *, options: WriteOptions) -> Report:
    """Write the LM head as its own tensor, equal to the embedding, and set tie_word_embeddings false."""
    from ..surgery import ops

    return ops.untie(ckpt, out, options=options)


@app.command(cls=Command, epilog=EXAMPLES["resize"])
@command
@edits(keep_training_state=True)
def resize(
    ckpt: CkptArg = ".",
    out: OutOpt = None,
    vocab: VocabOpt = None,
    pad_to_multiple_of: PadOpt = None,
    init: InitOpt = Init.MEAN,
    seed: SeedOpt = None,
    force: ForceOpt = False,
    *,
    options: WriteOptions,
) -> Report:
    """Grow or trim the vocabulary rows of the embedding, head and head bias together; update vocab_size."""
    from ..surgery import ops

    if vocab is None and pad_to_multiple_of is None:
        raise UsageError(
            "resize needs the new number of rows",
            fix="pass --vocab ROWS, or --pad-to-multiple-of N to round the current rows up",
        )
    return ops.resize(
        ckpt,
        vocab,
        out,
        pad_to_multiple_of=pad_to_multiple_of,
        init=init,
        seed=seed,
        force=force,
        options=options,
    )


@app.command("add-tokens", cls=Command, epilog=EXAMPLES["add-tokens"])
@command
@edits(keep_training_state=True)
def add_tokens(
    ckpt: TokenCkptArg,
    tokens: TokensArg = None,
    special: SpecialOpt = False,
    file: TokenFileOpt = None,
    init: TokenInitOpt = "subtokens",
    pad_to_multiple_of: TokenPadOpt = None,
    seed: SeedOpt = None,
    out: OutOpt = None,
    *,
    options: WriteOptions,
) -> Report:
    """Add tokens to the tokenizer files and give them rows (slack rows first, then every vocabulary tensor
    grown together)."""
    from ..surgery import ops

    strings = list(tokens or []) + _token_file(file)
    if not strings:
        raise UsageError("add-tokens needs at least one token", fix="give TOKEN... or --file TOKENS.txt")
    return ops.add_tokens(
        ckpt,
        strings,
        out,
        special=special,
        init=init,
        pad_to_multiple_of=pad_to_multiple_of,
        seed=seed,
        options=options,
    )


def _token_file(file: str | None) -> list[str]:
    """The tokens of ``--file``: one a line (``\\n`` or ``\\r\\n``; other characters, spaces included, are
    part of the token), UTF-8 (a byte-order mark skipped), empty lines skipped.

    Raises:
        UsageError: the file cannot be read or is not UTF-8.
    """
    if file is None:
        return []
    try:
        with open(file, encoding="utf-8-sig", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8"
        raise UsageError(
            f"--file cannot be read ({why})", file, "give a UTF-8 text file, one token a line"
        ) from None
    lines = (line[:-1] if line.endswith("\r") else line for line in text.split("\n"))
    return [line for line in lines if line]


@app.command(cls=Command, epilog=EXAMPLES["merge"])
@command
def merge(
    ckpt: LocalCkptArg = ".",
    out: MergeOutOpt = ...,  # type: ignore[assignment]
    max_shard_size: MergeShardOpt = "10GB",
    keep_paddle_layout: KeepPaddleLayoutOpt = False,
    dry_run: DryOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Merge tensor-parallel rank files (model_state.tp00.pdparams, ...; also _pp00 pipeline ranks) into one
    checkpoint, or a flex checkpoint (a Trainer checkpoint-N/ with model_state/*.distcp) into PaddleFormers
    safetensors."""
    from ..surgery import ops
    from . import render

    rep = ops.merge(
        ckpt,
        out,
        max_shard_size=max_shard_size,
        keep_paddle_layout=keep_paddle_layout,
        options=write_options(json_out, quiet, dry_run=dry_run),
    )
    render.merge(rep, json_out, quiet=quiet, verbose=verbose)


@app.command(cls=Command, epilog=EXAMPLES["verify"])
@command
def verify(
    before: BeforeArg,
    after: AfterArg,
    logits: LogitsOpt = False,
    logits_with: LogitsWithOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Check that AFTER differs from BEFORE exactly as tie/untie/resize explain (exit 7 if not; 8 when
    --logits could not compare the logits)."""
    from ..surgery import ops
    from . import render

    res = ops.verify(before, after, logits=logits, logits_with=logits_with.value if logits_with else None)
    render.verify(res, before, after, as_json=json_out, quiet=quiet)
    raise typer.Exit(res.exit_code)


@app.command(cls=Command, epilog=EXAMPLES["diff"])
@command
def diff(
    a: DiffAArg,
    b: DiffBArg,
    json_out: JsonOpt = False,
    no_values: DiffNoValuesOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Show what differs between checkpoints A and B: tensors (max |Δ|, relative norm, token rows),
    config keys, tokens, files. Exit 0 when identical, 1 when they differ."""
    from ..surgery import ops
    from . import render_diff

    res = ops.diff(a, b, values=not no_values)
    render_diff.diff(res.as_dict(), as_json=json_out, quiet=quiet)
    raise typer.Exit(res.exit_code)


@app.command(cls=Command, epilog=EXAMPLES["convert"])
@command
def convert(
    ckpt: LocalCkptArg = ".",
    to: ToOpt = ...,  # type: ignore[assignment]
    out: ConvertOutOpt = ...,  # type: ignore[assignment]
    max_shard_size: ConvertShardOpt = "10GB",
    dry_run: DryOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Convert between PaddleNLP 2.x and PaddleFormers layouts, or change only the container."""
    from ..surgery import ops
    from . import render

    rep = ops.convert(
        ckpt, to, out, max_shard_size=max_shard_size, options=write_options(json_out, quiet, dry_run=dry_run)
    )
    render.convert(rep, json_out, quiet=quiet)


register_vocab(app)


def main() -> None:
    """Console-script entry point (``tietool``, ``python -m tietool``): :func:`cli.errors.run_app`."""
    run_app(app)
