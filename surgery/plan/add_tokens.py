"""``add-tokens``: the model's half of adding tokens to a tokenizer (the planner :func:`plan_add_tokens`).

The tokenizer's half is a :class:`~surgery.model.tokens.TokenEdit` (:mod:`surgery.io.tokenizer_edit`): the
ids the new strings get (contiguous from the tokenizer's length) and the new bytes of its files. Here the
rows of those ids are planned: slack rows first (rows beyond the tokenizer), then growth of every
vocabulary tensor as ``resize`` moves it (:func:`surgery.plan.resize.move_vocabulary`), and the config keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..inspect import chunked
from ..inspect.detection import Detection
from ..io.configfile import get_dotted
from ..model.enums import HeadLayout, Init, TokenInit
from ..model.errors import Opt, RefusedError, TietoolError, UsageError
from ..model.tokens import NewToken, TokenEdit
from .plan import Plan, base_plan, refuse_unsettled_pair, refuse_unusable_head
from .recipes import EditedBias, EditedTable, NewRows, TokenInitRows, TokenSpec
from .resize import (
    MAX_VOCAB,
    move_vocabulary,
    refuse_ambiguous_head,
    refuse_token_values,
    refuse_vocab_surface,
    resize_config,
    resolve_seed,
    target_rows,
)

TOKEN_INITS = tuple(i.value for i in TokenInit if i is not TokenInit.COPY) + ("copy:TOKEN",)  # choices
PAD_INIT = Init.MEAN
"""The init of padding rows (beyond the last new token) that growth to a multiple creates: ``resize``'s
default, HF ``mean_resizing`` over the table's old rows (what resize's ``mean`` init gives them)."""

TP_DEGREE_KEYS = ("tensor_parallel_degree", "tensor_model_parallel_size")
"""config keys recording the tensor-parallel degree the vocabulary is split by (its rows a multiple)."""


@dataclass(frozen=True)
class InitChoice:
    """An ``--init`` of ``add-tokens``: its kind, and for ``copy:TOKEN`` the token (its id resolved by the
    caller from the tokenizer: ``copy_id``)."""

    kind: TokenInit
    token: str | None = None


def parse_init(init: TokenInit | InitChoice | str) -> InitChoice:
    """``"subtokens"`` → ``InitChoice(SUBTOKENS)``; ``"copy:<s>"`` → ``InitChoice(COPY, "<s>")``.

    Raises:
        UsageError: an unknown init, or ``copy:`` without a token.
    """
    if isinstance(init, InitChoice):
        return init
    text = str(init)
    if text.startswith("copy:"):
        if not text[5:]:
            raise UsageError(f"{Opt('init', text)} names no token", fix=f"e.g. {Opt('init', 'copy:<unk>')}")
        return InitChoice(TokenInit.COPY, text[5:])
    if text not in TOKEN_INITS:
        raise UsageError(f"unknown {Opt('init')} {text!r}", fix=f"use one of {', '.join(TOKEN_INITS)}")
    return InitChoice(TokenInit(text))


def _checked_options(
    init: TokenInit | InitChoice | str, pad_to_multiple_of: int | None, copy_id: int | None
) -> InitChoice:
    """:func:`plan_add_tokens`' ``init`` parsed, with ``pad_to_multiple_of`` and ``copy_id`` checked.

    Raises:
        UsageError: a bad ``init``, ``pad_to_multiple_of`` < 1, ``copy`` without ``copy_id``.
    """
    choice = parse_init(init)
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise UsageError(f"{Opt('pad_to_multiple_of')} must be ≥ 1, got {pad_to_multiple_of}", fix="e.g. 64")
    if choice.kind is TokenInit.COPY and copy_id is None:
        raise UsageError(f"{Opt('init', 'copy:' + str(choice.token))}: the token's id is unknown")
    return choice


def plan_add_tokens(
    det: Detection,
    edit: TokenEdit,
    init: TokenInit | InitChoice | str = TokenInit.SUBTOKENS,
    pad_to_multiple_of: int | None = None,
    seed: int | None = None,
    copy_id: int | None = None,
) -> Plan:
    """Plan the rows of the tokens ``edit`` adds (ids ``edit.length_before..edit.length_after-1``).

    With R embedding rows: new ids below R take those slack rows (their values are replaced by the init);
    ids from R on grow every vocabulary tensor (embedding and aliases, the head in either layout, its bias,
    extra and token-indexed tables: :func:`~surgery.plan.resize.move_vocabulary`, the same machinery and
    order as ``resize``) to N = ``length_after`` rounded up to a multiple of ``pad_to_multiple_of`` and of
    the tensor-parallel degree the config records (:func:`tp_degree`; their lcm), and every vocabulary-size
    config key with them. Never fewer rows than R. Padding rows beyond the last token get :data:`PAD_INIT`.

    Rows (``init``, :func:`surgery.plan.recipes.token_rows`; in float32, rounded to the stored dtype, bf16
    bits included): ``subtokens`` the mean of the rows of the ids the tokenizer before the edit splits the
    string into (head rows likewise, in either layout; a head bias the mean of those entries); ``mean`` HF
    ``mean_resizing``; ``trained-mean`` the same over the rows of trained tokens only
    (:func:`surgery.plan.recipes.trained_index`: ids below ``length_before``, less the rows whose largest
    value is ≤ 1e-16, unsloth's ``mean_of_trained_tokens`` rule, and rows bit-identical to another); ``copy``
    the row of ``copy_id``; ``zeros``. A token that the tokenizer splits into nothing gets ``mean``. Extra
    tables equal to the embedding stay equal. Rows of ids below ``length_before`` and every tensor not
    listed stay bit-identical.

    Raises:
        UsageError: a bad ``init``, ``pad_to_multiple_of`` < 1, a negative seed, ``copy`` without
            ``copy_id``.
        RefusedError: the tokenizer already has more tokens than rows, a head with another number of rows
            than the embedding, or what ``resize`` refuses of the vocabulary surface.
        AmbiguousLayoutError: a square head and no ``--layout``.
        TietoolError: an edit whose new ids are not contiguous from ``length_before`` (a bug).
    """
    choice = _checked_options(init, pad_to_multiple_of, copy_id)
    _refuse(det, edit)
    R, added = det.vocab_rows, edit.added
    multiple = math.lcm(pad_to_multiple_of or 1, tp_degree(det))
    N = _target(det, edit.length_after, multiple)
    refuse_vocab_surface(det, N, "add-tokens")
    refuse_token_values(det, N)
    seed = resolve_seed(seed)
    specs = tuple(_spec(t, choice.kind, copy_id) for t in added)
    plan = base_plan("add-tokens", det)
    plan.tokenizer = edit
    reset = untrained_existing(det, edit)
    reset_specs = {i: _spec(NewToken(c, i, False, True), choice.kind, copy_id) for i, c in reset.items()}
    if added or reset:
        start = min([*reset, edit.length_before])
        row_specs = _row_specs(edit, specs, reset_specs, start)
        std = float(det.ckpt.config.get("initializer_range") or 0.02)
        move_vocabulary(det, plan, N, _TokenRows(start, row_specs, seed, std, edit.length_before))
    if N != R:
        resize_config(det, plan, N)
    plan.extra_report = _report(det, edit, specs, choice, seed, N, multiple, reset_specs)
    _notes(plan, edit, N, reset)
    return plan


def untrained_existing(det: Detection, edit: TokenEdit) -> dict[int, str]:
    """``{id: token}`` of the tokens asked for that already exist with untrained rows, which add-tokens
    gives rows as it gives a new token: the ids :func:`not_resettable` finds nothing against."""
    existing = {t.id: t.content for t in edit.tokens if t.existed}
    refused = not_resettable(det, sorted(existing))
    return {i: c for i, c in existing.items() if i not in refused}


def not_resettable(det: Detection, ids: list[int]) -> dict[int, str]:
    """``{id: why}`` of the ids among ``ids`` whose rows add-tokens does not reset; the others are reset.
    The rule: a row is reset when it is all zero in the embedding (:func:`surgery.inspect.chunked.zero_rows`;
    Llama-3 base ships its chat tokens so: axolotl#1666) and in a head stored apart in the
    ``[vocab, hidden]`` layout. A ``[hidden, vocab]`` head stored apart is not read column by column: no id
    is reset then (the warning still names them). Ids beyond the embedding's rows are never reset. ``verify``
    checks a report's ``rows_reset`` claims with the same rule."""
    emb, head = det.embedding.name, det.head
    zero = chunked.zero_rows(det.ckpt, emb, ids)
    out = {i: f"its row of {emb} in the input is not all zero" for i in ids if i not in zero}
    rows = det.ckpt.tensors[emb].shape[0]
    out |= {i: f"the input's {emb} has only {rows} rows" for i in ids if not 0 <= i < rows}
    if zero and head.present and head.name != emb and head.name not in det.embedding.aliases:
        if head.layout is not HeadLayout.VOCAB_HIDDEN:
            why = f"the input's head {head.name} is stored apart as [hidden, vocab]: add-tokens resets no row"
            return out | dict.fromkeys(zero, why)
        kept = set(chunked.zero_rows(det.ckpt, head.name, zero))
        out |= {i: f"its row of {head.name} in the input is not all zero" for i in zero if i not in kept}
    return out


def _row_specs(
    edit: TokenEdit, specs: tuple[TokenSpec, ...], reset: dict[int, TokenSpec], start: int
) -> tuple[TokenSpec, ...]:
    """The recipe of every row from ``start`` to the tokenizer's new length: a reset token's row as a new
    token's (``reset``: no subtokens, so ``subtokens`` gives ``mean``), an existing row between them a copy
    of itself (bit-identical: decoded and stored back exactly), then the new tokens' (``specs``)."""
    by_id = dict(zip((t.id for t in edit.added), specs, strict=True))
    out = []
    for i in range(start, edit.length_after):
        if i in reset:
            out.append(reset[i])
        elif i < edit.length_before:
            out.append(TokenSpec(TokenInit.COPY, (i,)))
        else:
            out.append(by_id[i])
    return tuple(out)


def tp_degree(det: Detection) -> int:
    """The tensor-parallel degree the config records (:data:`TP_DEGREE_KEYS`, top level or the language
    model's block), 1 when none: the vocabulary rows must stay a multiple of it."""
    blocks = [det.ckpt.config]
    if det.config.text_key:
        try:
            block = get_dotted(det.ckpt.config, det.config.text_key)
        except (KeyError, IndexError, TypeError):
            block = None
        if isinstance(block, dict):
            blocks.append(block)
    values = [b.get(k) for b in blocks for k in TP_DEGREE_KEYS]
    degrees = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return max([1, *(d for d in degrees if d > 0)])


def _target(det: Detection, length: int, multiple: int) -> int:
    """The rows after the edit: the current rows while the tokenizer's new ``length`` fits in them, else
    ``length`` rounded up to ``multiple``.

    Raises:
        UsageError: more rows than int32 token ids can name.
    """
    R = det.vocab_rows
    N = max(R, target_rows(length, multiple)) if length > R else R
    if N > MAX_VOCAB:
        raise UsageError(
            f"{N} rows are beyond any tokenizer (token ids are int32 in Paddle; at most {MAX_VOCAB})",
            fix=f"a smaller {Opt('pad_to_multiple_of')}",
        )
    return N


def _refuse_disagreeing(det: Detection) -> None:
    """Refuse a folder whose tokenizer files disagree (:func:`surgery.io.tokenizer.tokenizer_set`, what
    ``inspect`` reports as problems): loaders then read different tokenizers, so no id is the new token's
    under all of them. ``tokenizer.json`` with ``<tool_call>`` (id 250) that tokenizer_config.json and
    tokenizer.model lack, plus ``<a>``: transformers 5.3 loaded ``<a>`` as id 250, PaddleFormers 1.2 as 251.

    Raises:
        RefusedError: naming the first disagreement.
    """
    found = det.tokenizer.files.disagreements
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise RefusedError(
            f"the tokenizer files disagree: {found[0]}{more}; loaders would give new tokens different ids",
            det.ckpt.path,
            "save the tokenizer again with save_pretrained (or delete the stale file), then add the tokens",
        )


def _refuse_rows(det: Detection, edit: TokenEdit) -> None:
    """Refuse an edit the rows cannot take: a tokenizer with more tokens than rows, a head with another
    number of rows than the embedding (which row a new id is would be unknown); TietoolError for new ids
    that are not contiguous from ``length_before`` (a broken edit)."""
    R, ckpt = det.vocab_rows, det.ckpt
    ids = [t.id for t in edit.added]
    if ids != list(range(edit.length_before, edit.length_before + len(ids))) or edit.length_after != (
        edit.length_before + len(ids)
    ):
        raise TietoolError(f"internal: the new token ids {ids} are not contiguous from {edit.length_before}")
    if edit.length_before > R:
        raise RefusedError(
            f"the tokenizer already has {edit.length_before} tokens but {det.embedding.name} has {R} rows: "
            f"ids {R}..{edit.length_before - 1} have no row",
            ckpt.path,
            f"grow the rows first ({Opt('vocab_size', edit.length_before)} with resize), then add tokens",
        )
    hrows = det.head.rows
    if det.head.vocab is None and hrows is not None and hrows != R:
        raise RefusedError(
            f"{det.head.name} has {hrows} vocabulary rows but {det.embedding.name} has {R}: which head row "
            "a new token id is cannot be told",
            ckpt.path,
            "resize the two to the same rows first",
        )


def _spec(t: NewToken, kind: TokenInit, copy_id: int | None) -> TokenSpec:
    """The row recipe of one added token: ``kind`` with its ids; ``subtokens`` of a string that splits
    into nothing falls back to ``mean``."""
    if kind is TokenInit.SUBTOKENS:
        return TokenSpec(kind, tuple(t.subtoken_ids)) if t.subtoken_ids else TokenSpec(TokenInit.MEAN)
    if kind is TokenInit.COPY:
        assert copy_id is not None
        return TokenSpec(kind, (copy_id,))
    return TokenSpec(kind)


@dataclass
class _TokenRows:
    """The :class:`~surgery.plan.resize.VocabRows` of ``add-tokens``: each table keeps its entries below
    ``start``, gets the token rows (``specs``) from its own entries, keeps its later old entries, and pads
    with :data:`PAD_INIT` rows; a random stream of ``seed`` per recipe, in planning order."""

    start: int
    specs: tuple[TokenSpec, ...]
    seed: int
    std: float
    trained: int  # entries 0..trained-1 are the tokenizer's tokens before the edit (trained-mean's pool)
    streams: int = 0

    def _stream(self) -> int:
        stream, self.streams = self.streams, self.streams + 1
        return stream

    def table(self, name: str, axis: int, new: int, old: int) -> EditedTable:
        tokens = TokenInitRows(name, axis, self.specs, self.trained, self.seed, self._stream())
        pad = new - max(old, self.start + len(self.specs))
        tail = NewRows(name, axis, pad, PAD_INIT, self.seed, self._stream(), self.std) if pad > 0 else None
        return EditedTable(name, axis, new, self.start, tokens, tail)

    def bias(self, name: str, new: int) -> EditedBias:
        return EditedBias(name, new, self.start, self.specs)


def _report(
    det: Detection,
    edit: TokenEdit,
    specs: tuple[TokenSpec, ...],
    choice: InitChoice,
    seed: int,
    N: int,
    multiple: int,
    reset: dict[int, TokenSpec],
) -> dict[str, Any]:
    """The report's ``add_tokens`` fields: the tokens (content, id, special, existed, rows_reset, init,
    source ids, seed), rows before/after, slack rows used, the multiple, the tokenizer files edited."""
    R = det.vocab_rows
    by_id = {**dict(zip((t.id for t in edit.added), specs, strict=True)), **reset}
    tokens = []
    for t in edit.tokens:
        spec = by_id.get(t.id) if (not t.existed or t.id in reset) else None
        tokens.append(
            {
                "content": t.content,
                "id": t.id,
                "special": t.special,
                "existed": t.existed,
                "rows_reset": t.id in reset,
                "init": None if spec is None else spec.kind.value,
                "source_ids": None if spec is None else list(spec.ids),
                "seed": None if spec is None else seed,
            }
        )
    return {
        "tokens": tokens,
        "init": choice.kind.value if choice.token is None else f"copy:{choice.token}",
        "seed": seed,
        "tokenizer_length_before": edit.length_before,
        "tokenizer_length_after": edit.length_after,
        "rows_before": R,
        "rows_after": N,
        "rows_added": N - R,
        "slack_rows_before": R - edit.length_before,
        "slack_used": max(0, min(R, edit.length_after) - edit.length_before),
        "pad_to_multiple_of": multiple if multiple > 1 else None,
        "padding_rows": max(0, N - max(R, edit.length_after)),
        "padding_init": PAD_INIT.value,
        "files_edited": sorted(edit.files),
    }


def _refuse(det: Detection, edit: TokenEdit) -> None:
    """What add-tokens refuses before planning rows: an unsettled embedding/head pair, an unusable or
    ambiguous head, a head whose rows differ from the embedding's, a tokenizer longer than the rows."""
    refuse_unsettled_pair(det, "add-tokens")
    refuse_unusable_head(det, "add-tokens")
    refuse_ambiguous_head(det)
    _refuse_disagreeing(det)
    _refuse_rows(det, edit)


def _notes(plan: Plan, edit: TokenEdit, N: int, reset: dict[int, str]) -> None:
    """Notes of an add-tokens plan: tokens already present, rows taken, rows grown; the tokenizer edit's
    warnings (printed on the terminal)."""
    R = plan.det.vocab_rows
    had = [f"{t.content!r} (id {t.id})" for t in edit.tokens if t.existed]
    if had:
        plan.notes.append(f"already in the tokenizer, not added: {', '.join(had)}")
    plan.warnings.extend(edit.warnings)
    _zero_rows_of_existing(plan, edit, reset)
    _base_marked_special(plan, edit)
    if not edit.added:
        if not reset:
            plan.notes.append("no new token: no row changes")
        return
    used = max(0, min(R, edit.length_after) - edit.length_before)
    if used:
        plan.notes.append(f"{used} slack row(s) {edit.length_before}..{edit.length_before + used - 1} taken")
    if N > R:
        plan.notes.append(f"every vocabulary tensor grows {R} → {N} rows")


def _base_marked_special(plan: Plan, edit: TokenEdit) -> None:
    """A warning for each token of the base vocabulary (not an added token of the input's tokenizer) that
    the edit marks special: a special token is matched in text before the model splits it, so words that
    contain it tokenize differently from then on (``the`` special in WordPiece: ``there`` becomes ``the``
    ``r`` ``##e``), as with HF ``add_special_tokens`` of an existing word."""
    ts = plan.det.tokenizer.files
    special_before = {a.id for a in ts.added if a.special}
    added_before = {a.id for a in ts.added}
    base = [t for t in edit.tokens if t.existed and t.special and t.id not in added_before]
    marked = [f"{t.content!r} (id {t.id})" for t in base if t.id not in special_before]
    if marked:
        plan.warnings.append(
            f"marked special, though part of the base vocabulary: {', '.join(marked)}; text that contains "
            "them is split around them from now on (ordinary words may tokenize differently)"
        )


def _zero_rows_of_existing(plan: Plan, edit: TokenEdit, reset: dict[int, str]) -> None:
    """A warning naming the tokens asked for that already exist with all-zero embedding rows
    (:func:`surgery.inspect.chunked.zero_rows`; Llama-3 base ships its chat tokens so: the reported cause of
    NaN losses and of chat templates never learned): those in ``reset`` got rows by the init, as new tokens
    do; the others (a ``[hidden, vocab]`` head stored apart, or a trained head row) kept theirs."""
    det = plan.det
    name = det.embedding.name
    existing = {t.id: t.content for t in edit.tokens if t.existed}
    zero = chunked.zero_rows(det.ckpt, name, sorted(existing))
    given = [i for i in zero if i in reset]
    kept = [i for i in zero if i not in reset]
    if given:
        shown = ", ".join(f"{existing[i]!r} (id {i})" for i in given)
        plan.warnings.append(
            f"existing token(s) whose rows of {name} were all zero (untrained, as a base model ships them): "
            f"{shown}; they get rows by the init as new tokens do (their rows were the reported cause of NaN "
            "losses and of chat templates that are never learned)"
        )
    if kept:
        shown = ", ".join(f"{existing[i]!r} (id {i})" for i in kept)
        plan.warnings.append(
            f"existing token(s) whose rows of {name} are all zero (untrained): {shown}; their head rows are "
            "not all zero (or the head is [hidden, vocab]), so add-tokens keeps them: a fine-tune that uses "
            "them must train the embedding rows"
        )


def tokenizer_edit() -> Any:
    """:mod:`surgery.io.tokenizer_edit`, imported on first use (it imports the ``tokenizer`` extra's
    libraries lazily itself)."""
    from ..io import tokenizer_edit as edit

    return edit


def copy_token_id(folder: Path, choice: InitChoice, edit_of: Callable[..., TokenEdit]) -> int | None:
    """The id of the ``copy:TOKEN`` token (None for another init), asked of the tokenizer by ``edit_of``
    (:func:`surgery.io.tokenizer_edit.add_tokens_edit`: the string as a token to add).

    Raises:
        UsageError: the tokenizer does not have the string as one token.
    """
    if choice.kind is not TokenInit.COPY or choice.token is None:
        return None
    flag = Opt("init", "copy:" + choice.token)
    fix = "name a token the tokenizer has, or use the subtokens init"
    try:
        edit = edit_of(folder, [choice.token])
        (t,) = edit.tokens
    except RefusedError as e:  # a string add-tokens refuses (the folder itself was read by the plan already)
        why = f"{choice.token!r} is not one token of the tokenizer ({e.message})"
        raise UsageError(f"{flag}: {why}", folder, fix) from None
    if t.existed:
        return t.id
    if len(t.subtoken_ids) == 1:  # the text is one token though not its spelling (SentencePiece's '▁the')
        return t.subtoken_ids[0]
    why = f"{choice.token!r} is not one token of the tokenizer (it splits into ids {list(t.subtoken_ids)})"
    raise UsageError(f"{flag}: {why}", folder, fix)
