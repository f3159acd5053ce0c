"""How ``tietool COMMAND --help`` reads: metavars as users write them, and an Examples section.

:class:`Command` is every command's class: an argument shows as ``CKPT`` (not Typer's ``CKPT <str>`` or, in
the usage line, ``{CKPT}``), an option of fixed choices as ``[auto|vocab-hidden|hidden-vocab]`` (not
``<auto|...>``); every other option names its metavar in :mod:`cli.options` (``N``, ``DIR``, ``FILE``,
``SIZE``, ``NAME``). :data:`EXAMPLES` is each command's epilog: command lines that run as written from the
repository's root, on the checkpoints in ``sample_checkpoints/`` (``tests/cli/test_cli_options.py`` runs
them).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperOption


class _Argument(TyperArgument):
    """An argument shown by its metavar alone (``CKPT``, ``TOKEN...``), required or not."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        raw = self.display_name_raw
        more = "..." if self.nargs != 1 and not raw.endswith("...") else ""
        return raw + more if self.required else f"[{raw}{more}]"


class _Option(TyperOption):
    """An option whose value is one of fixed choices shown as ``[a|b|c]``, as Click and argparse users
    read it."""

    def display_type_rich(self, ctx: Any) -> str | None:
        shown = super().display_type_rich(ctx)
        if shown and shown.startswith("<") and shown.endswith(">"):
            return "[" + shown[1:-1] + "]"
        return shown


class Command(TyperCommand):
    """A Typer command whose help shows metavars as users write them (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if type(p) is TyperArgument:
                p.__class__ = _Argument
            elif type(p) is TyperOption:
                p.__class__ = _Option


def _examples(*lines: str) -> str:
    """An epilog: ``Examples:`` and the command lines, kept as written (Click's ``\\b``: no rewrapping)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


S = "sample_checkpoints"
EXAMPLES = {
    "tietool": _examples(
        f"tietool inspect {S}/pf_llama_tied_fp32",
        f"tietool resize {S}/pf_llama_tied_fp32 --vocab 128 --out resized/",
        f"tietool verify {S}/pf_llama_tied_fp32 resized/",
        "tietool COMMAND --help    # each command's options and examples",
    ),
    "inspect": _examples(
        f"tietool inspect {S}/pf_llama_tied_fp32",
        f"tietool inspect {S}/pnlp_llama_untied --drift",
        f"tietool inspect {S}/pnlp_gpt {S}/pf_llama_with_tokenizer",
        f"tietool inspect {S}/pnlp_gpt --json",
    ),
    "tie": _examples(
        f"tietool untie {S}/pf_llama_tied_fp32 --out untied/",
        "tietool tie untied/ --out tied/",
        "tietool tie untied/ --dry-run",
    ),
    "untie": _examples(
        f"tietool untie {S}/pf_llama_tied_fp32 --out untied/",
        f"tietool untie {S}/pf_llama_tied_fp32 --dry-run --json",
    ),
    "resize": _examples(
        f"tietool resize {S}/pf_llama_tied_fp32 --vocab 128 --out resized/",
        f"tietool resize {S}/pnlp_gpt --pad-to-multiple-of 64 --out padded/",
        f"tietool resize {S}/pnlp_llama_untied --vocab 112 --init zeros --out zeros/",
        f"tietool resize {S}/pnlp_llama_untied --vocab 112 --seed 0 --out seeded/ --json",
    ),
    "add-tokens": _examples(
        f'tietool add-tokens {S}/pf_llama_with_tokenizer "<tool_call>" "</tool_call>" \\',
        "    --special --out chat/",
        f"tietool add-tokens {S}/pf_llama_with_tokenizer hello --init zeros --dry-run",
    ),
    "fix-untrained": _examples(
        f'tietool add-tokens {S}/pf_llama_with_tokenizer "<think>" --init zeros --out zeroed/',
        "tietool fix-untrained zeroed/ --out fixed/",
        "tietool fix-untrained zeroed/ --dry-run --json",
    ),
    "rename-tokens": _examples(
        f'tietool add-tokens {S}/pf_llama_with_tokenizer "<|reserved_special_token_0|>" --special \\',
        "    --out reserved/",
        'tietool rename-tokens reserved/ "304=<think>" --special --init trained-mean --out renamed/',
    ),
    "prune": _examples(
        "python -c 'import json; print(json.dumps(list(range(280)) + [300, 301, 302, 303]))' > keep.json",
        f"tietool prune {S}/pf_llama_with_tokenizer --keep-ids keep.json --out pruned/",
        f"tietool prune {S}/pf_llama_with_tokenizer --keep-ids keep.json --keep-special --dry-run --json",
        f"tietool prune {S}/pf_llama_with_tokenizer --keep-corpus domain.txt --out pruned/",
    ),
    "transplant": _examples(
        f"tietool transplant {S}/pf_llama_with_tokenizer --tokenizer donor_tokenizer/ --out transplanted/",
        f"tietool transplant {S}/pf_llama_with_tokenizer --tokenizer donor_tokenizer/ --init mean --dry-run",
        f"tietool transplant {S}/pf_llama_with_tokenizer --tokenizer donor/ --init omp --donor-model donor/ "
        "--k 8 --out omp/",
        f"tietool verify {S}/pf_llama_with_tokenizer transplanted/",
    ),
    "merge": _examples(
        f"tietool merge {S}/pf_llama_tp2 --out merged/     # model_state.tp00.pdparams, ...",
        f"tietool merge {S}/pf_qwen3_moe_ep2 --out experts/    # expert-parallel rank files",
        f"tietool merge {S}/pf_llama_trainer/checkpoint-2 --out trained/    # a Trainer save",
        f"tietool merge {S}/pf_llama_tp2 --out big/ --max-shard-size 5GB --dry-run",
    ),
    "verify": _examples(
        f"tietool untie {S}/pf_llama_tied_fp32 --out untied/",
        f"tietool verify {S}/pf_llama_tied_fp32 untied/",
        f"tietool verify {S}/pf_llama_tied_fp32 untied/ --json",
    ),
    "diff": _examples(
        f"tietool diff {S}/pf_llama_tied_fp32 {S}/pf_llama_tied_fp32",
        f"tietool resize {S}/pf_llama_tied_fp32 --vocab 128 --out resized/",
        f"tietool diff {S}/pf_llama_tied_fp32 resized/ --json",
        f"tietool diff {S}/pf_llama_tp2 {S}/pf_llama_tied_fp32 --no-values    # rank files, as merged",
    ),
    "convert": _examples(
        f"tietool convert {S}/pnlp_llama_untied --to paddleformers --out pf/",
        f"tietool convert {S}/pf_llama_tied_fp32 --to paddlenlp --out pnlp/",
    ),
}
"""Each command's ``--help`` epilog, on the folders of ``sample_checkpoints/`` (its rank files and Trainer
``checkpoint-N/`` included); :data:`GUIDES` puts the docs line before it."""

GUIDES = {
    "inspect": "docs/guides/tied.md",
    "tie": "docs/guides/tied.md",
    "untie": "docs/guides/tied.md",
    "resize": "docs/guides/vocabulary.md",
    "add-tokens": "docs/guides/vocabulary.md",
    "merge": "docs/guides/merge.md",
    "verify": "docs/guides/verify.md",
    "convert": "docs/guides/convert.md",
    "diff": "docs/guides/diff.md",
    "rename-tokens": "docs/guides/vocabulary.md",
    "fix-untrained": "docs/guides/vocabulary.md",
}
"""The docs page (the guide) each ``--help`` names; a command without one names the docs' index. The pages are
in the clone (``docs/``; ``mkdocs serve`` renders them), as tietool is installed from one."""
EXAMPLES = {
    name: f"Docs: {GUIDES.get(name, 'docs/index.md')}; every option: docs/cli.md\n\n{text}"
    for name, text in EXAMPLES.items()
}
