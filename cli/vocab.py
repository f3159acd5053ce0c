"""The vocabulary commands beside ``add-tokens`` (``fix-untrained``, ``rename-tokens``, ``prune``,
``transplant``): their flags and their one :mod:`surgery` call each, registered on the app by
:func:`register` (the way :mod:`cli.app` registers its own commands, kept apart so that each file stays
small)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..surgery.model.errors import UsageError
from .errors import command
from .help import EXAMPLES, Command
from .options import (
    CkptArg,
    OutOpt,
    TokenCkptArg,
    edits,
)

if TYPE_CHECKING:
    from ..surgery.results import Report
    from ..surgery.run import WriteOptions

IdsOpt = Annotated[
    str | None,
    typer.Option(
        "--ids",
        help="only these rows (comma-separated ids; each must be untrained by the rule). Default: every "
        "untrained row",
        show_default=False,
        metavar="ID,...",
    ),
]
FixInitOpt = Annotated[
    str,
    typer.Option(
        "--init",
        help="the rows' new values: trained-mean (the mean of the trained rows, as unsloth sets them) or "
        "subtokens (the mean of the rows of the token's text as the tokenizer splits it without the token; "
        "the trained mean where that split is empty or untrained)",
        metavar="[trained-mean|subtokens]",
    ),
]


RenamesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="ID=TOKEN pairs: the reserved slot's id and its new string (e.g. 128002=<think>)",
        show_default=False,
        metavar="ID=TOKEN...",
    ),
]
RenameSpecialOpt = Annotated[
    bool, typer.Option("--special", help="the new tokens are special (never split; CONTROL pieces)")
]
SetSpecialOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set-special",
        help="make TOKEN the pad/bos/eos token in every file that names it (tokenizer files, config.json, "
        "generation_config.json); repeatable",
        show_default=False,
        metavar="NAME=TOKEN",
    ),
]
RenameInitOpt = Annotated[
    str,
    typer.Option(
        "--init",
        help="the slots' rows: keep (as they are), trained-mean (the mean of the trained rows) or subtokens "
        "(the mean of the rows the new string split into before)",
        metavar="[keep|trained-mean|subtokens]",
    ),
]


KeepIdsOpt = Annotated[
    Path | None,
    typer.Option(
        "--keep-ids",
        help="the token ids to keep: a file with one id a line, or a JSON list",
        show_default=False,
        metavar="FILE",
    ),
]
KeepCorpusOpt = Annotated[
    Path | None,
    typer.Option(
        "--keep-corpus",
        help="keep the tokens tokenizer.json gives this text file (with the tokens BPE merges into them), "
        "every special token and the byte tokens",
        show_default=False,
        metavar="TEXTFILE",
    ),
]
KeepSpecialOpt = Annotated[
    bool,
    typer.Option(
        "--keep-special",
        help="also keep every added/special token, every token id a config file names, and byte tokens",
    ),
]


DonorOpt = Annotated[
    Path,
    typer.Option(
        "--tokenizer",
        help="the donor tokenizer's folder (tokenizer.json, a SentencePiece .model, vocab.txt or "
        "vocab.json + merges.txt, with their config files)",
        show_default=False,
        metavar="DONOR_DIR",
    ),
]
TransplantInitOpt = Annotated[
    str,
    typer.Option(
        "--init",
        help="the rows of donor tokens the model lacks: subword (the mean of the rows the old tokenizer "
        "splits the token's text into), mean (of every row), zeros, or omp (mergekit-tokensurgeon's "
        "orthogonal matching pursuit over the shared tokens in the donor model; needs --donor-model)",
        metavar="[subword|mean|zeros|omp]",
    ),
]
DonorModelOpt = Annotated[
    Path | None,
    typer.Option(
        "--donor-model",
        help="with --init omp: the donor's checkpoint folder (its embedding, and its LM head for a model "
        "whose head has rows of its own, are read)",
        show_default=False,
        metavar="DIR",
    ),
]
OmpKOpt = Annotated[
    int | None,
    typer.Option(
        "--k",
        help="with --init omp: the shared tokens each new token is made of (mergekit's --k)  [default: 64]",
        show_default=False,
    ),
]


def parse_ids(text: str | None) -> list[int] | None:
    """``"264,265, 269"`` → ``[264, 265, 269]``; None stays None.

    Raises:
        UsageError: an entry that is not a non-negative integer.
    """
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in parts if not p.isdigit()]
    if bad or not parts:
        raise UsageError(f"--ids {text!r} is not a list of token ids", fix="e.g. --ids 264,265,269")
    return [int(p) for p in parts]


@edits()
def fix_untrained(
    ckpt: CkptArg = ".",
    out: OutOpt = None,
    ids: IdsOpt = None,
    init: FixInitOpt = "trained-mean",
    *,
    options: WriteOptions,
) -> Report:
    """Set the rows the model never trained (unsloth's rule: no value above 1e-16 in the embedding and
    the head) to the mean of the trained rows; every other byte unchanged."""
    from ..surgery import ops

    return ops.fix_untrained(
        ckpt,
        out,
        ids=parse_ids(ids),
        init=init,
        options=options,
    )


@edits()
def rename_tokens(
    ckpt: TokenCkptArg,
    renames: RenamesArg = None,
    special: RenameSpecialOpt = False,
    init: RenameInitOpt = "keep",
    set_special: SetSpecialOpt = None,
    out: OutOpt = None,
    *,
    options: WriteOptions,
) -> Report:
    """Give reserved or unused tokens (<|reserved_special_token_N|>, [unusedN], ...) new strings in every
    tokenizer file, by id: the model is not grown (rows kept, or --init trained-mean)."""
    from ..surgery import ops
    from ..surgery.io.special_tokens import parse_specials
    from ..surgery.io.tokenizer_rename import parse_renames

    specials = parse_specials(set_special or [])
    return ops.rename_tokens(
        ckpt,
        parse_renames(renames or []) if renames or not specials else {},
        out,
        special=special,
        init=init,
        set_special=specials,
        options=options,
    )


@edits()
def prune(
    ckpt: TokenCkptArg,
    keep_ids: KeepIdsOpt = None,
    keep_corpus: KeepCorpusOpt = None,
    keep_special: KeepSpecialOpt = False,
    out: OutOpt = None,
    *,
    options: WriteOptions,
) -> Report:
    """Cut the vocabulary to the token ids of a keep-list: every vocabulary tensor, the tokenizer files,
    vocab_size and the config's token ids renumbered together (the old -> new id map in the report)."""
    from ..surgery import ops
    from ..surgery.io.tokenizer_prune import read_keep_corpus, read_keep_file

    return ops.prune(
        ckpt,
        read_keep_file(keep_ids) if keep_ids is not None else None,
        out,
        corpus=read_keep_corpus(keep_corpus) if keep_corpus is not None else None,
        keep_special=keep_special,
        keep_source=keep_ids,
        options=options,
    )


@edits()
def transplant(
    ckpt: TokenCkptArg,
    tokenizer: DonorOpt,
    init: TransplantInitOpt = "subword",
    donor_model: DonorModelOpt = None,
    k: OmpKOpt = None,
    out: OutOpt = None,
    *,
    options: WriteOptions,
) -> Report:
    """Give the model a donor's tokenizer: every vocabulary tensor laid out in the donor's ids, a token
    both tokenizers have keeping its row bit for bit, the others initialised (--init); tokenizer files,
    vocab_size and the config's token ids set from the donor (how each row was made in the report)."""
    from ..surgery import ops

    return ops.transplant(
        ckpt,
        tokenizer,
        out,
        init=init,
        donor_model=donor_model,
        k=k,
        options=options,
    )


COMMANDS = (
    ("fix-untrained", fix_untrained),
    ("rename-tokens", rename_tokens),
    ("prune", prune),
    ("transplant", transplant),
)
"""The vocabulary commands: (name on the command line, function), in the order ``--help`` lists them."""


def register(app: typer.Typer) -> None:
    """Add the vocabulary commands (:data:`COMMANDS`, each a :func:`cli.options.edits` command) to ``app``,
    each wrapped by :func:`cli.errors.command` (exit codes, one-line errors)."""
    for name, fn in COMMANDS:
        app.command(name, cls=Command, epilog=EXAMPLES[name])(command(fn))
