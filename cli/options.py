"""The command line's arguments and options, as ``Annotated`` aliases: one per flag, its help text beside it.

A flag shared by several commands (``--out``, ``--json``, ``--loader``, ...) is one alias here, so its
spelling and help are the same everywhere; a command's own flags are here too, so that :mod:`cli.app` is only
the commands. Folder arguments are strings, not Paths: a URL (``s3://bucket/prefix``, ``hf://org/model``)
must keep its ``//``. Typer reads the help text; nothing here imports :mod:`surgery` beyond the option enums.

The flags every editing command shares are one parameter set, :func:`edits`: it adds them to a command and
builds from them the library's one :class:`~surgery.run.WriteOptions` (:func:`write_options`, which imports
the library when a command runs).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..surgery.model.enums import Init, Keep, Layout, Loader, StrEnum, Target

if TYPE_CHECKING:
    from ..surgery.run import WriteOptions

# ---------------------------------------------------------------- arguments
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
CkptsArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="checkpoint folder(s) or URL(s); default: the current folder. Several: a table row each "
        "(a JSON list)",
        show_default=False,
        metavar="CKPT",
    ),
]
BeforeArg = Annotated[str, typer.Argument(help="the input checkpoint", show_default=False, metavar="BEFORE")]
AfterArg = Annotated[str, typer.Argument(help="the output checkpoint", show_default=False, metavar="AFTER")]

# ---------------------------------------------------------------- shared options
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
QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="print only the result line (notes and warnings on stderr); no progress bar; --json wins",
    ),
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="one line per merged tensor (rule, axis, shape) instead of the table"
    ),
]
EmbOpt = Annotated[
    str | None,
    typer.Option(
        "--embedding",
        help="name of the input embedding tensor (for architectures tietool does not know)",
        metavar="NAME",
    ),
]
HeadOpt = Annotated[
    str | None,
    typer.Option(
        "--head", help="name of the LM head tensor (for architectures tietool does not know)", metavar="NAME"
    ),
]
LoaderOpt = Annotated[
    Loader | None,
    typer.Option(
        "--loader", help="the library that will load the output (default: told from the checkpoint)"
    ),
]
LayoutOpt = Annotated[Layout | None, typer.Option(help="head layout, when vocab_size == hidden_size")]

# ---------------------------------------------------------------- the app's own
DebugOpt = Annotated[bool, typer.Option("--debug", help="show Python tracebacks (also TIETOOL_DEBUG=1)")]

# ---------------------------------------------------------------- inspect
NoValuesOpt = Annotated[
    bool,
    typer.Option(
        "--no-values",
        help="read headers only: do not read the embedding and head to compare their values "
        "(fast on cold or remote storage; 'tied by value' is then not known)",
    ),
]

DriftOpt = Annotated[
    bool,
    typer.Option(
        "--drift",
        help="show how the head differs from the embedding (rows, |Δ|, histogram) also when the config says "
        "untied (a head of its own); shown anyway when the config says tied",
    ),
]

# ---------------------------------------------------------------- tie
KeepOpt = Annotated[Keep | None, typer.Option(help="when head and embedding differ: which values to keep")]
DropAliasesOpt = Annotated[
    bool,
    typer.Option(
        "--drop-aliases",
        help="also drop copies of the embedding under alias names (T5/BART encoder/decoder)",
    ),
]

# ---------------------------------------------------------------- untie
NewHeadLayoutOpt = Annotated[
    Layout,
    typer.Option(
        help="layout of a new head: auto = what the checkpoint's loader expects (PaddleNLP "
        "Llama/Qwen/ChatGLM: hidden-vocab; PaddleFormers and the rest: vocab-hidden)"
    ),
]

# ---------------------------------------------------------------- resize
VocabOpt = Annotated[
    int | None,
    typer.Option(
        "--vocab",
        min=1,
        help="new number of rows (vocab_size); without it, --pad-to-multiple-of rounds up the rows",
        show_default=False,
        metavar="ROWS",
    ),
]
PadOpt = Annotated[
    int | None,
    typer.Option(
        "--pad-to-multiple-of",
        min=1,
        help="round the row count up to a multiple of this (as HF resize_token_embeddings)",
        metavar="N",
    ),
]
InitOpt = Annotated[
    Init, typer.Option(help="new rows: mean (HF mean_resizing), zeros, or normal(initializer_range)")
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        help="random seed for new rows drawn at random (same seed: same bytes); none: a random one, reported",
        metavar="N",
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="allow trimming rows")]
KeepTrainingStateOpt = Annotated[
    bool,
    typer.Option(
        "--keep-training-state",
        help="keep the training state in the output: optimizer.pdopt resized with the vocabulary (moments "
        "and master weights: new rows 0 / the new weight rows), scheduler, trainer_state.json and rng state "
        "copied; optimizer files of other formats are refused by name. By default they are left out",
    ),
]

# ---------------------------------------------------------------- add-tokens
TokenCkptArg = Annotated[
    str,
    typer.Argument(
        help="checkpoint folder with its tokenizer files (required: '.' for the current folder)",
        show_default=False,
        metavar="CKPT",
    ),
]
TokensArg = Annotated[
    list[str] | None,
    typer.Argument(help="the strings to add, in id order", show_default=False, metavar="TOKEN..."),
]
SpecialOpt = Annotated[
    bool, typer.Option("--special", help="add them as special tokens (never split; CONTROL pieces)")
]
TokenFileOpt = Annotated[
    str | None,
    typer.Option(
        "--file",
        help="more tokens, one a line (UTF-8; empty lines skipped)",
        show_default=False,
        metavar="FILE",
    ),
]
TokenInitOpt = Annotated[
    str,
    typer.Option(
        "--init",
        help="rows of new tokens: subtokens (mean of the rows the string splits into now), mean (HF "
        "mean_resizing), trained-mean (mean over trained rows: unsloth), zeros, or copy:TOKEN",
        metavar="[subtokens|mean|trained-mean|zeros|copy:TOKEN]",
    ),
]
TokenPadOpt = Annotated[
    int | None,
    typer.Option(
        "--pad-to-multiple-of",
        min=1,
        help="when the rows run out, grow them to a multiple of this (and of the config's tensor-parallel "
        "degree)",
        metavar="N",
    ),
]

# ---------------------------------------------------------------- merge
MergeOutOpt = Annotated[
    str,
    typer.Option(
        "--out", "-o", help="output folder (must not exist or be empty)", show_default=False, metavar="DIR"
    ),
]
MergeShardOpt = Annotated[
    str,
    typer.Option(
        "--max-shard-size",
        help="largest weight file: bytes, or a size as save_pretrained takes it (10GB, 500MiB)",
        metavar="SIZE",
    ),
]

KeepPaddleLayoutOpt = Annotated[
    bool,
    typer.Option(
        "--keep-paddle-layout",
        help="flex checkpoint: write the tensors in the Paddle layout the training run held (Linear "
        "[in, out], fused projections), unconverted; it then loads only with from_pretrained(out, "
        'load_checkpoint_format="legacy", convert_from_hf=False). Without it, a model type tietool cannot '
        "convert is refused",
    ),
]

# ---------------------------------------------------------------- verify
LogitsOpt = Annotated[
    bool,
    typer.Option(
        "--logits",
        help=(
            "also compare logits under PaddleFormers (PaddleNLP inputs under $PNLP_PYTHON; "
            "exit 8 when they cannot be compared)"
        ),
    ),
]


class LogitsLibrary(StrEnum):
    """The libraries ``verify --logits-with`` runs an output in (``surgery.verify.logits.LIBRARIES``)."""

    PADDLEFORMERS = "paddleformers"
    PADDLENLP = "paddlenlp"
    HF = "hf"


LogitsWithOpt = Annotated[
    LogitsLibrary | None,
    typer.Option(
        "--logits-with",
        help=(
            "compare logits with the output run in this library (hf: HF transformers under $HF_PYTHON, "
            "for an HF-layout safetensors output); implies --logits"
        ),
        show_default=False,
    ),
]

# ---------------------------------------------------------------- convert
ToOpt = Annotated[
    Target,
    typer.Option(
        "--to",
        help="paddleformers: HF names, Linear [out, in], safetensors; paddlenlp: PaddleNLP 2.x names, "
        "Linear [in, out], head [hidden, vocab], .pdparams; safetensors/pdparams: the container only",
        show_default=False,
    ),
]
ConvertOutOpt = Annotated[
    str, typer.Option("--out", "-o", help="output folder (must not exist or be empty)", metavar="DIR")
]
ConvertShardOpt = Annotated[
    str,
    typer.Option(
        "--max-shard-size",
        help="bytes per shard at most: 10GB = 10*10**9, 500MB, 2GiB or a number",
        metavar="SIZE",
    ),
]

# ---------------------------------------------------------------- diff
DiffAArg = Annotated[
    str,
    typer.Argument(
        help="the first checkpoint (folder, URL, rank files or flex)", show_default=False, metavar="A"
    ),
]
DiffBArg = Annotated[
    str, typer.Argument(help="the second checkpoint, compared with A", show_default=False, metavar="B")
]
DiffNoValuesOpt = Annotated[
    bool,
    typer.Option(
        "--no-values",
        help="read headers only: names, dtypes, shapes and byte ranges (fast on cold or remote storage; "
        "changed values and renames are then not found)",
    ),
]


# ---------------------------------------------------------------- the options every edit shares
def write_options(json_out: bool, quiet: bool, **fields: Any) -> WriteOptions:
    """The :class:`~surgery.run.WriteOptions` of a writing command: its common ``fields`` (``dry_run``,
    ``link``, ``layout``, ...) and the progress bar (none with ``--json`` or ``--quiet``). The library and
    :mod:`cli.render` are imported here, when a command runs, not at ``--help``."""
    from ..surgery.run import WriteOptions
    from . import render

    return WriteOptions(progress=render.progress_bar(quiet or json_out), **fields)


EDIT_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("loader", LoaderOpt, None),
    ("embedding", EmbOpt, None),
    ("head", HeadOpt, None),
    ("dry_run", DryOpt, False),
    ("json_out", JsonOpt, False),
    ("link", LinkOpt, False),
    ("quiet", QuietOpt, False),
    ("backup", BackupOpt, True),
)
"""The flags of every command that edits a checkpoint (``tie`` ... ``transplant``), after its ``--layout``,
in the order ``--help`` lists them: (parameter name, ``Annotated`` alias, default)."""


def edits(
    layout: tuple[Any, Any] = (LayoutOpt, None), keep_training_state: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command that edits a checkpoint, given its own arguments and flags and an ``options`` keyword: the
    Typer command with, after them, ``--keep-training-state`` (when asked), ``--layout`` (``layout``: its
    alias and default) and :data:`EDIT_OPTIONS`. Run, it hands the command the
    :class:`~surgery.run.WriteOptions` built from those flags (:func:`write_options`) and prints the report
    it returns (``render.written``, with ``--json`` and ``--quiet``).

    The command's own parameters keep their order, names and help; Typer reads the signature this sets.
    """
    shared = [("layout", *layout), *EDIT_OPTIONS]
    if keep_training_state:
        shared.insert(0, ("keep_training_state", KeepTrainingStateOpt, False))

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn).parameters.values() if p.name != "options"]
        params = [p.replace(annotation=_resolved(p.annotation, fn)) for p in own] + [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=alias, default=default)
            for name, alias, default in shared
        ]

        @functools.wraps(fn)
        def run(**kwargs: Any) -> None:
            from . import render

            common = {name: kwargs.pop(name) for name, _, _ in shared}
            json_out, quiet = common.pop("json_out"), common.pop("quiet")
            rep = fn(**kwargs, options=write_options(json_out, quiet, **common))
            render.written(rep, json_out, quiet=quiet)

        run.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap


def _resolved(annotation: Any, fn: Callable[..., Any]) -> Any:
    """A parameter's annotation as an object (``from __future__ import annotations`` leaves it a string, which
    Typer would not read once the signature is set), evaluated in ``fn``'s module as
    ``inspect.signature(fn, eval_str=True)`` evaluates it (which would fail on the ``options`` annotation, a
    name imported for type checking only)."""
    return eval(annotation, fn.__globals__) if isinstance(annotation, str) else annotation
