"""``resize --vocab N``: grow or trim every vocabulary tensor together, as PaddleFormers'
``resize_token_embeddings`` and HF ``mean_resizing`` do (the planner :func:`plan_resize`).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from .. import arch
from ..inspect.detection import Detection
from ..io.checkpoint import Checkpoint
from ..io.configfile import get_dotted
from ..io.tokenizer import SpecialTokenId
from ..io.vocabkeys import vocab_keys
from ..model.enums import EQUAL_STATES, HeadLayout, Init
from ..model.errors import AmbiguousLayoutError, CheckpointError, Opt, RefusedError, TietoolError, UsageError
from ..model.tokens import TokenEdit
from .kept_rows import KeptRows
from .merge_flex import FlexView
from .plan import (
    OutTensor,
    Plan,
    base_plan,
    drop_head,
    missing_embedding_refusal,
    out_dtype,
    refuse_unsettled_pair,
    refuse_unusable_head,
    unproven_note,
)
from .recipes import (
    CopyIfEqual,
    EditedBias,
    EditedTable,
    NewRows,
    Recipe,
    ResizedBias,
    ResizedTable,
    TokenRows,
)
from .transplant_rows import TransplantRows

INITS = tuple(i.value for i in Init)  # --init choices


MAX_VOCAB = 2**31 - 1


def _available_memory() -> int | None:
    """Bytes of memory available (Linux ``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def target_rows(vocab: int, pad_to_multiple_of: int | None) -> int:
    """``vocab`` rounded up to a multiple of ``pad_to_multiple_of`` (13, 8 → 16; 16, 8 → 16)."""
    if pad_to_multiple_of in (None, 1):
        return vocab
    return math.ceil(vocab / pad_to_multiple_of) * pad_to_multiple_of


def plan_resize(
    det: Detection,
    vocab: int,
    pad_to_multiple_of: int | None = None,
    init: Init | str = Init.MEAN,
    seed: int | None = None,
    force: bool = False,
) -> Plan:
    """Plan ``resize``: every tensor that carries the vocabulary gets ``target_rows(vocab, M)`` rows.

    Resized together, old rows kept bit-exact, trimming from the end: the input embedding and its aliases,
    the head (rows for ``[vocab, hidden]``, columns for ``[hidden, vocab]``), the head bias (``[V]`` or
    ``[1, V]``, new entries zero) and its aliases. A tied checkpoint stays tied: a head present and equal to
    the embedding is dropped where the config says tied and the loader re-ties a missing head (as ``tie``
    drops it: :func:`_drop_redundant_head`), else written equal to the new embedding; an untied head gets
    rows of its own by the same ``init``. Every vocabulary-size config key that counted the rows
    (:func:`resize_config`: ``vocab_size`` at any nesting, ``padded_vocab_size``, ``decoder_vocab_size``,
    ``model_config.json``) becomes the new row count. Unlike PaddleFormers' ``resize_token_embeddings``
    (which builds new rows by a Xavier-uniform draw and never resizes an untied head), an untied head is
    always resized; ``init="mean"`` is HF transformers' ``resize_token_embeddings(mean_resizing=True)``
    (:func:`surgery.plan.recipes.new_rows`).

    Raises:
        UsageError: vocab < 1 or beyond int32, pad_to_multiple_of < 1, unknown init, a negative seed, new
            rows that would not fit in the memory available.
        AmbiguousLayoutError: a square head and no ``--layout``.
        RefusedError: the result has fewer rows than the checkpoint and ``force`` is False (message says how
            many rows would go and whether they are padding rows or real tokens), the head is unusable, or
            part of the vocabulary surface cannot follow (:func:`refuse_vocab_surface`).
    """
    how = _resize_init(vocab, pad_to_multiple_of, init)
    refuse_unsettled_pair(det, "resize")
    refuse_unusable_head(det, "resize")
    refuse_ambiguous_head(det)
    V, N = det.vocab_rows, target_rows(vocab, pad_to_multiple_of)
    _refuse_target(det, N, how)
    refuse_vocab_surface(det, N)
    refuse_token_values(det, N)
    _refuse_unnumbered(det)
    plan = base_plan("resize", det)
    past = [str(i) for i in det.special_ids if i.id >= N]
    if N < V and not force:
        raise _trim_refusal(det, N, past)
    seed = resolve_seed(seed)
    plan.extra_report = _resize_report(det, vocab, N, how, seed, pad_to_multiple_of)
    plan.tokenizer = _trim_tokenizer(det, N)
    _refuse_cut_ids(det, N)
    if plan.tokenizer is not None:
        plan.extra_report["tokens_removed"] = [
            {"id": t.id, "content": t.content} for t in plan.tokenizer.removed
        ]
    _resize_notes(det, plan, N, past)
    if N != V:
        std = float(det.ckpt.config.get("initializer_range") or 0.02)
        move_vocabulary(det, plan, N, _Draws(how, seed, std))
    resize_config(det, plan, N)
    if N == V:
        plan.notes.append(f"the embedding already has {N} rows: no tensor changes")
    return plan


def _resize_init(vocab: int, pad_to_multiple_of: int | None, init: Init | str) -> Init:
    """Check the resize options that need no checkpoint; returns ``init`` as an :class:`Init`.

    Raises:
        UsageError: vocab < 1, pad_to_multiple_of < 1, unknown init.
    """
    if not isinstance(vocab, int) or vocab < 1:
        raise UsageError(
            f"{Opt('vocab_size')} must be a positive integer, got {vocab!r}",
            fix=f"e.g. {Opt('vocab_size', 32000)}",
        )
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise UsageError(
            f"{Opt('pad_to_multiple_of')} must be ≥ 1, got {pad_to_multiple_of}", fix="e.g. 64 or 128"
        )
    if init not in INITS:
        raise UsageError(f"unknown {Opt('init')} {init!r}", fix="use mean, zeros or normal")
    return Init(init)


def refuse_ambiguous_head(det: Detection) -> None:
    """Refuse a square head (vocab_size == hidden_size) with no ``--layout`` (AmbiguousLayoutError)."""
    if det.head.present and det.head.layout is HeadLayout.AMBIGUOUS:
        raise AmbiguousLayoutError(
            f"vocab_size == hidden_size == {det.vocab_rows}: whether {det.head.name} is [vocab, hidden] or "
            "[hidden, vocab] cannot be told from its square shape",
            det.ckpt.path,
            f"pass {Opt('layout', 'vocab-hidden')} or {Opt('layout', 'hidden-vocab')}",
        )


def _refuse_target(det: Detection, N: int, init: Init) -> None:
    """Refuse (UsageError) ``N`` rows beyond int32 token ids, or new rows of ``hidden`` values that would
    not fit in the memory available (per new value: float32 rows + stored copy for ``zeros``; + a float64
    draw for ``normal`` and ``mean``)."""
    V, H = det.vocab_rows, det.hidden
    if N > MAX_VOCAB:
        raise UsageError(
            f"{Opt('vocab_size', N)} is beyond any tokenizer (token ids are int32 in Paddle; at most "
            f"{MAX_VOCAB})",
            fix="check the number",
        )
    need = (N - V) * H * {Init.ZEROS: 8, Init.NORMAL: 16, Init.MEAN: 32}[init]
    avail = _available_memory()
    if N > V and avail is not None and need > avail:
        raise UsageError(
            f"{Opt('vocab_size', N)} adds {N - V} rows of {H}: about {need >> 20} MiB of new rows, more "
            f"than the {avail >> 20} MiB of memory available",
            fix="check the number, or free memory",
        )


def _trim_refusal(det: Detection, N: int, past: list[str]) -> RefusedError:
    """The refusal of trimming to ``N`` rows without ``--force``: how many rows go, and whether they are
    padding rows beyond the tokenizer, real tokens, or unknown (no tokenizer files); ``past``: special
    token ids that would point past the last row."""
    V, tok = det.vocab_rows, det.tokenizer
    if tok.size is None:
        what = "no tokenizer files in the checkpoint, so it is unknown whether they are real tokens"
    elif N >= tok.size:
        what = (
            f"they are padding rows beyond the tokenizer's {tok.size} tokens (highest id "
            f"{tok.size - 1}), which may still hold trained values"
        )
    else:
        real = min(V, tok.size) - N
        what = (
            f"{real} of them are real tokens of the tokenizer ({tok.size} tokens, highest id "
            f"{tok.size - 1}): trimming below {tok.size} breaks those tokens"
        )
    if past:
        what += f"; these token ids would point past the last row: {', '.join(past)}"
    return RefusedError(
        f"resize to {N} rows would trim {V - N} rows ({V} → {N}, rows {N}..{V - 1} removed): {what}",
        det.ckpt.path,
        f"pass {Opt('force', True)} to shrink anyway, or a {Opt('vocab_size')} of at least the current rows",
    )


def resolve_seed(seed: int | None) -> int:
    """``seed``, or a random one in [0, 2**31) when None (as uniform as ``SeedSequence().entropy % 2**31``,
    which it was).

    Raises:
        UsageError: a seed that is not a non-negative integer.
    """
    if seed is None:
        return secrets.randbits(31)
    if not isinstance(seed, int) or seed < 0:
        raise UsageError(
            f"{Opt('seed')} must be a non-negative integer, got {seed!r}", fix=f"e.g. {Opt('seed', 0)}"
        )
    return seed


def _resize_report(
    det: Detection, vocab: int, N: int, init: Init, seed: int, pad_to_multiple_of: int | None
) -> dict[str, Any]:
    """The report's ``resize`` fields: rows before/after/requested/added/removed, init, seed, padding,
    tokenizer size, and the head's rows where they differ from the embedding's."""
    V = det.vocab_rows
    rep = {
        "rows_before": V,
        "rows_after": N,
        "rows_requested": vocab,
        "rows_added": max(0, N - V),
        "rows_removed": max(0, V - N),
        "init": init.value,
        "seed": seed,
        "pad_to_multiple_of": pad_to_multiple_of,
        "tokenizer_size": det.tokenizer.size,
    }
    if det.head.rows is not None and det.head.rows != V and det.head.vocab is None:
        rep["head_rows_before"] = det.head.rows
        rep["head_rows_after"] = det.head.rows + N - V
    return rep


def _refuse_unnumbered(det: Detection) -> None:
    """Refuse a checkpoint whose tokenizer file names a token id no tokenizer numbers
    (:attr:`~surgery.model.tokens.TokenizerSet.beyond`: an added-token id of 10^9): how many rows its
    tokens need cannot be told, and every loader would size a table by that id.

    Raises:
        CheckpointError: naming the file, the id and the limit.
    """
    bad = det.tokenizer.files.beyond
    if bad:
        raise CheckpointError(
            f"{bad[0].name} {bad[0].note}: the rows its tokens need cannot be told",
            det.ckpt.path / bad[0].name,
            "save the tokenizer again with save_pretrained so its ids are contiguous",
        )


def _trim_tokenizer(det: Detection, N: int) -> TokenEdit | None:
    """The edit that keeps the tokenizer in step with a trim to ``N`` rows (``--force``): the added tokens at
    ids ≥ N removed from every tokenizer file (:func:`surgery.io.tokenizer_edit.remove_tokens_edit`), so the
    tokenizer never emits an id beyond the rows; None when the trim cuts no token the tokenizer has (no
    tokenizer files, or ``N`` at or above its length, or no trim).

    Raises:
        RefusedError: base-vocabulary tokens at ids ≥ N (a model file's own pieces cannot be removed), a
            token the tokenizer names as a special token (a loader would add it back past the rows), a
            tokenizer whose files cannot be edited here (the ``tokenizer`` extra missing, a format tietool
            cannot edit), or an edit that would still leave ids ≥ N: even with ``--force``.
    """
    size = det.tokenizer.size
    if size is None or N >= size or N >= det.vocab_rows:
        return None
    head = _forced_refusal(N)
    from ..io.tokenizer_edit import remove_tokens_edit  # tokenizer libraries, lazily

    try:
        edit = remove_tokens_edit(det.ckpt.path, N, _config_floor(det, N))
    except RefusedError as e:
        raise RefusedError(f"{head}: {e.message}", det.ckpt.path, e.fix) from e
    except TietoolError as e:
        raise RefusedError(
            f"{head}: the tokenizer defines {size} tokens (ids ≥ {N} would have no row) and its files cannot "
            f"be edited here: {e.message}",
            det.ckpt.path,
            e.fix or f"a {Opt('vocab_size')} of at least {size}",
        ) from e
    if edit.length_after > N:
        raise RefusedError(
            f"{head}: the tokenizer would still define {edit.length_after} tokens (ids ≥ {N} without a row)",
            det.ckpt.path,
            f"a {Opt('vocab_size')} of at least {edit.length_after}",
        )
    return edit


def _forced_refusal(N: int) -> str:
    """How a refusal of a trim to ``N`` rows that ``--force`` does not override begins."""
    return f"resize to {N} rows refused even with {Opt('force', True)}"


def _cut_ids(det: Detection, N: int) -> list[SpecialTokenId]:
    """The token ids the configuration files name that have a row now and would not after a trim to N."""
    return [s for s in det.special_ids if N <= s.id < det.vocab_rows]


def _config_floor(det: Detection, N: int) -> int:
    """The least number of rows that keeps every id :func:`_cut_ids` names (0: none)."""
    return max((s.id + 1 for s in _cut_ids(det, N)), default=0)


def _refuse_cut_ids(det: Detection, N: int) -> None:
    """Refuse, even with ``--force``, a trim that leaves a token id the configuration files name
    (``eos_token_id``, ``pad_token_id``, ``image_token_index``... of config.json and generation_config.json)
    past the last row when it had a row before: generation would wait for an id the model cannot produce,
    and an input holding it indexes past the embedding. Ids already past the rows are only warned about.

    Raises:
        RefusedError: naming the ids, with the least number of rows that keeps them (exit 5).
    """
    cut = _cut_ids(det, N)
    if cut:
        files = " / ".join(sorted({s.file for s in cut}))
        past = [s for s in det.special_ids if s.id >= det.vocab_rows]
        also = f"; already past the rows: {', '.join(map(str, past))}" if past else ""
        raise RefusedError(
            f"{_forced_refusal(N)}: "
            f"{', '.join(map(str, cut))} would point past the last row (ids 0..{N - 1}){also}",
            det.ckpt.path,
            f"keep at least {_config_floor(det, N)} rows, or set them to kept tokens in {files} first",
        )


def _resize_notes(det: Detection, plan: Plan, N: int, past: list[str]) -> None:
    """Notes and warnings of a resize: rows removed (``--force``), token ids left without a row."""
    V, tok = det.vocab_rows, det.tokenizer
    if N < V:
        rows = f"row {N}" if N == V - 1 else f"rows {N}..{V - 1}"
        plan.notes.append(f"{Opt('force', True)}: {rows} removed from every vocabulary tensor")
    if plan.tokenizer is not None:
        gone = ", ".join(f"{t.id} {t.content!r}" for t in plan.tokenizer.removed)
        plan.notes.append(f"added tokens removed from the tokenizer files (ids ≥ {N}): {gone}")
    elif tok.size is not None and N < tok.size:
        plan.warnings.append(f"the tokenizer defines {tok.size} tokens; ids ≥ {N} will have no row")
    if past:
        plan.warnings.append(
            f"token ids beyond the last row after the resize (ids 0..{N - 1}): {', '.join(past)}"
        )


def resize_config(det: Detection, plan: Plan, N: int) -> None:
    """Every vocabulary-size key (:func:`surgery.io.vocabkeys.vocab_keys`: any nesting, config.json and
    model_config.json) that counts the embedding's rows becomes ``N``; one that counts the head's rows (an
    embedding with reserved rows, ``head_rows != vocab_rows``) moves with the head. The language model's own
    ``vocab_size`` (top level, or the nested ``text_config`` one) is set whatever it held
    (:func:`_primary_vocab_size`), and a key equal to it (a stale copy, such as ``model_config.json``'s
    ``init_args``) follows it; a key of another value (a second vocabulary) stays.

    Where only the keys handled before exist (top-level / nested ``vocab_size``, ``padded_vocab_size``,
    model_config.json ``vocab_size`` / ``init_args.N.vocab_size``) the keys set are the same as before.
    """
    V, hrows, ckpt = det.vocab_rows, det.head.rows, det.ckpt
    primary = _primary_vocab_size(det, N)
    moves = {V: N}
    if hrows is not None and hrows != V and det.head.vocab is None:
        moves.setdefault(hrows, hrows + N - V)
    if det.config.vocab_size is not None:
        moves.setdefault(det.config.vocab_size, _config_rows(det, N))
    # the primary keys as the files spell them (a folder with only model_config.json keeps them in its args)
    spelled = {_spelled(ckpt, f, k) for f, k, _ in primary}
    config = ckpt.config if ckpt.config_file == "config.json" else None
    plan.config_set += primary
    for k in vocab_keys(ckpt.path, config):
        if (k.file, k.key) not in spelled and k.value in moves:
            plan.config_set.append((k.file, k.key, moves[k.value]))


def vocab_size_sets(det: Detection, N: int) -> dict[tuple[str, str], object]:
    """``{(file, dotted key): value}`` of the vocabulary-size keys a write that moves the rows to ``N``
    sets (:func:`resize_config`: ``resize``, ``prune``, ``transplant``, ``add-tokens`` growing), each as the
    folder stores it (a config.json key of a folder with only model_config.json under its model arguments,
    as :mod:`surgery.write.writer` writes it); ``verify`` expects exactly these values."""
    plan = base_plan("resize", det)
    resize_config(det, plan, N)
    return {_spelled(det.ckpt, f, k): v for f, k, v in plan.config_set}


def _spelled(ckpt: Checkpoint, file: str, key: str) -> tuple[str, str]:
    """``(file, key)`` of a config.json key as the folder stores it: in a folder with only model_config.json,
    under its model arguments (``init_args.0.vocab_size``), as :mod:`surgery.write.writer` sets it."""
    if file == "config.json" and ckpt.config_file != "config.json":
        return ckpt.config_file, f"{ckpt.config_prefix}.{key}".lstrip(".")
    return file, key


def _config_rows(det: Detection, N: int) -> int:
    """The config's vocab_size after a resize to ``N`` embedding rows: ``N``, or the head's new rows where
    the config counted the head's rows (an embedding with reserved rows)."""
    V, hrows = det.vocab_rows, det.head.rows
    offset_head = hrows is not None and hrows != V and det.config.vocab_size == hrows and not det.head.vocab
    return N - V + hrows if offset_head and hrows is not None else N


def _primary_vocab_size(det: Detection, N: int) -> list[tuple[str, str, object]]:
    """config.json ``vocab_size`` (when present, or created when the config names no key sizing the table)
    and the key that sizes the language model's table (``det.config.vocab_key``: ``text_config.vocab_size``,
    ``thinker_config.text_config.vocab_size``, ``padded_vocab_size``): ``N``, or the head's new rows where
    the config counted the head's rows (an embedding with reserved rows)."""
    cfg, cvs, key = det.ckpt.config, _config_rows(det, N), det.config.vocab_key
    out: list[tuple[str, str, object]] = []
    if "vocab_size" in cfg or key in (None, "vocab_size"):
        out.append(("config.json", "vocab_size", cvs))
    if key is not None and key != "vocab_size":
        out.append(("config.json", key, cvs))
    return out


def refuse_vocab_surface(det: Detection, N: int, op: str = "resize") -> None:
    """Refuse a resize (or ``op``, which moves the rows as resize does) that would leave part of the
    vocabulary surface behind: a missing embedding, a vocabulary-shaped tensor of no known role, an extra
    table of another vocabulary size, a head with reserved rows the new size cannot keep."""
    ckpt, V = det.ckpt, det.vocab_rows
    if not det.embedding.present:
        raise missing_embedding_refusal(
            det, op, f"restore it first (untie, or tie {Opt('keep', 'head')}), then {op}"
        )
    odd = [
        f"{n} {list(ckpt.tensors[n].shape)} {ckpt.logical_dtype(ckpt.tensors[n])}"
        for n in det.beyond.by_shape
    ]
    if odd:
        raise RefusedError(
            f"{op} refused: {', '.join(odd)} has an axis of the vocabulary's {V} entries but no known role "
            "or rule (not the embedding, head, bias, a known copy or a token-indexed table of the "
            "architecture table): resizing the rest would leave it at the old size",
            ckpt.path,
            f"if it is the embedding or head, pass {Opt('embedding')}/{Opt('head', 'NAME')}; otherwise "
            "remove or rename it first",
        )
    rows = (V, det.head.rows if det.head.vocab is None else V)

    def follows(n: str) -> bool:
        axis = det.vocab_axis(n)
        return axis is not None and ckpt.tensors[n].shape[axis] in rows

    other = [n for n in det.beyond.extra_tables if not follows(n)]
    if other:
        raise RefusedError(
            f"{op} refused: the extra vocabulary table(s) {', '.join(other)} have no axis of the "
            f"embedding's {V} rows (a vocabulary of their own), so it is unknown how they follow a resize",
            ckpt.path,
            "resize them with the tool of their model, or remove them first",
        )
    if det.head.rows is not None and det.head.vocab is None and det.head.rows + N - V < 1:
        raise RefusedError(
            f"resize to {N} rows would leave the head {det.head.name} with {det.head.rows + N - V} rows (it "
            "has "
            f"{V - det.head.rows} rows fewer than the embedding)",
            ckpt.path,
            f"pass a larger {Opt('vocab_size')}",
        )


class VocabRows(Protocol):
    """What :func:`move_vocabulary` asks for each vocabulary tensor: ``resize``'s :class:`_Draws`, or
    ``add-tokens``' rows of new tokens (:mod:`surgery.plan.add_tokens`)."""

    def table(self, name: str, axis: int, new: int, old: int) -> Recipe:
        """``name`` to ``new`` entries along ``axis`` (``old`` now), new entries from its own."""
        ...

    def bias(self, name: str, new: int) -> Recipe:
        """The head bias ``name`` to ``new`` entries."""
        ...


@dataclass
class _Draws:
    """Hands out the recipes of new rows, each with the next random stream of ``seed`` (child 0, 1, ... of
    ``SeedSequence(seed)``, in planning order), so a given seed gives the same bytes."""

    init: Init
    seed: int
    std: float
    streams: int = 0

    def rows(self, name: str, count: int, axis: int) -> NewRows | None:
        """``count`` new rows for ``name`` from its own entries along ``axis`` (None when ``count`` is 0;
        a stream is used either way)."""
        stream, self.streams = self.streams, self.streams + 1
        return NewRows(name, axis, count, self.init, self.seed, stream, self.std) if count > 0 else None

    def table(self, name: str, axis: int, new: int, old: int) -> ResizedTable:
        """``name`` to ``new`` entries along ``axis`` (``old`` now), new entries from its own."""
        return ResizedTable(name, axis, new, self.rows(name, max(0, new - old), axis))

    def bias(self, name: str, new: int) -> ResizedBias:
        """The head bias to ``new`` entries, new entries zero."""
        return ResizedBias(name, new)


def _new_shape(shape: tuple[int, ...], axis: int, new: int) -> tuple[int, ...]:
    s = list(shape)
    s[axis] = new
    return tuple(s)


def _put(plan: Plan, n: str, axis: int, new: int, recipe: Recipe, storage: object = None) -> None:
    """Replace ``n`` by ``recipe``: its shape with ``new`` entries along ``axis``, its (relabelled) dtype."""
    t = plan.ckpt.tensors[n]
    out = out_dtype(plan.ckpt, t, plan.relabel_u16)
    plan.replace[n] = OutTensor(n, out, _new_shape(t.shape, axis, new), recipe, t.file, storage=storage)


def move_vocabulary(det: Detection, plan: Plan, N: int, draws: VocabRows) -> None:
    """Every vocabulary tensor to ``N`` embedding rows (the head and its bias move by the same number of
    rows): the embedding and its aliases (one table), vocabulary aliases, the head, the bias, the
    token-indexed tables (when ``N`` differs from the rows), the extra tables. ``draws`` gives each its
    recipe, in that order (:class:`_Draws` for ``resize``; ``add-tokens`` gives the rows of new tokens)."""
    ckpt, V = det.ckpt, det.vocab_rows
    emb = draws.table(det.embedding.name, 0, N, V)
    for n in [det.embedding.name] + det.embedding.aliases:
        _put(plan, n, 0, N, emb, ckpt.tensors[n].storage)
    for n in det.embedding.vocab_aliases:
        _put(plan, n, 0, N, draws.table(n, 0, N, V), ckpt.tensors[n].storage)
    hrows = det.head.rows if det.head.rows is not None else V
    hnew = hrows + N - V
    head: Recipe | None = None
    if det.head.vocab is None:
        head = _resize_head(det, plan, hrows, hnew, emb, draws)
        _resize_bias(det, plan, hrows, draws.bias(det.bias.name, hnew) if det.bias else None)
    else:
        plan.notes.append(
            f"{det.head.name} is over another vocabulary (config.json {det.head.vocab} = {hrows}): kept as "
            "it is"
        )
    _resize_token_tables(det, plan, N)
    for n in det.beyond.extra_tables:
        axis = det.vocab_axis(n) or 0
        old = ckpt.tensors[n].shape[axis]
        new = N if old == V else hnew
        own = draws.table(n, axis, new, old)
        main = det.embedding.name if old == V and axis == 0 else det.head.name if head is not None else None
        main_recipe = emb if main == det.embedding.name else head
        if main is not None and main_recipe is not None:  # a copy of main stays a copy
            _put(plan, n, axis, new, CopyIfEqual(n, main, main_recipe, own))
        else:
            _put(plan, n, axis, new, own)


def _resize_token_tables(det: Detection, plan: Plan, N: int) -> None:
    """Every token-indexed table of the embedding's vocabulary to ``N`` rows by its rule
    (:data:`~surgery.arch.TOKEN_TABLES`): old rows kept, new rows repeating existing rows (ids of
    something else stay valid) or zero/False (a membership mask); tables keyed to another vocabulary are
    kept (their values checked by :func:`refuse_token_values`)."""
    for n, rule in det.beyond.token_tables.items():
        if rule.indexed_by != "vocab" or N == det.vocab_rows:
            continue
        recipe = TokenRows(n, N, cycle=rule.rule is arch.TokenRule.CYCLE_ROWS)
        _put(plan, n, 0, N, recipe, det.ckpt.tensors[n].storage)
        plan.notes.append(f"{n} ({rule.what}) to {N} rows: {rule.rule.value}")


def refuse_token_values(det: Detection, N: int) -> None:
    """Refuse a resize to ``N`` rows that the values of a token table contradict
    (:func:`_refuse_bound`, :func:`_refuse_trimmed_ids`), or a trim while an integer tensor of another
    vocabulary, whose values no rule explains, may hold token ids the trim removes.

    Raises:
        RefusedError: naming the tensor.
    """
    ckpt = det.ckpt
    for n, rule in det.beyond.token_tables.items():
        _refuse_bound(det, n, rule)
        if rule.rule is arch.TokenRule.KEEP_IDS and N < det.vocab_rows:
            _refuse_trimmed_ids(det, n, rule, N)
    unknown = [
        n
        for n in det.beyond.other_vocab
        if n not in det.beyond.token_tables and ckpt.logical_dtype(ckpt.tensors[n]) not in _FLOATS
    ]
    if N < det.vocab_rows and unknown:
        raise RefusedError(
            f"resize to {N} rows refused: {', '.join(unknown)} (integer, of another vocabulary) may hold "
            "token ids the trim removes, and no rule of the architecture table says what its values are",
            ckpt.path,
            "grow the vocabulary instead, or remove the tensor first",
        )


def _refuse_bound(det: Detection, n: str, rule: arch.TokenTable) -> None:
    """Refuse a token table whose values lie outside the bound its rule names (``n_routed_experts``): it is
    not the table the rule describes."""
    key, limit = _bound(det, rule)
    if limit is None:
        return
    a = np.asarray(det.ckpt.load(n))
    if a.size and (int(a.min()) < 0 or int(a.max()) >= limit):
        raise RefusedError(
            f"resize refused: {n} ({rule.what}) holds values {int(a.min())}..{int(a.max())}, outside "
            f"0..{limit - 1} (config {key} = {limit}): not the table its rule describes",
            det.ckpt.path,
            "check the checkpoint; remove the table or resize it with its model's own tools",
        )


def _refuse_trimmed_ids(det: Detection, n: str, rule: arch.TokenTable, N: int) -> None:
    """Refuse a trim to ``N`` rows while the token-id map ``n`` (target id = index + value) points at a
    removed row."""
    a = np.asarray(det.ckpt.load(n)).astype(np.int64)
    ids = np.arange(a.shape[0]) + a
    top = int(ids.max()) if ids.size else -1
    if top >= N:
        raise RefusedError(
            f"resize to {N} rows refused: {n} ({rule.what}) points at token ids up to {top}, which the "
            "trim removes",
            det.ckpt.path,
            f"pass a {Opt('vocab_size')} above {top}",
        )


_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _bound(det: Detection, rule: arch.TokenTable) -> tuple[str | None, int | None]:
    """The config key and value bounding a token table's values (the first of its rule's ``bound`` keys
    present in the language model's block or at the top), or ``(None, None)``."""
    for b in (det.ckpt.config if det.config.text_key is None else _text_block(det), det.ckpt.config):
        for key in rule.bound:
            v = b.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return key, v
    return None, None


def _text_block(det: Detection) -> dict[str, Any]:
    """The language model's config block (``det.config.text_key``, dotted), or the top level."""
    try:
        block = get_dotted(det.ckpt.config, det.config.text_key or "")
    except (KeyError, IndexError, TypeError):
        return det.ckpt.config
    return block if isinstance(block, dict) else det.ckpt.config


def _resize_head(
    det: Detection, plan: Plan, hrows: int, hnew: int, emb: Recipe, draws: VocabRows
) -> Recipe | None:
    """The head and its aliases from ``hrows`` to ``hnew`` vocabulary entries (rows of ``[vocab, hidden]``,
    columns of ``[hidden, vocab]``); returns its recipe (None: no head in the files).

    A head equal to the embedding stays equal (tied or not): it gets the embedding's new rows, so
    resize-then-untie and untie-then-resize give the same tensors; otherwise rows of its own.
    """
    h = det.head_info
    if h is None:
        return None
    axis = 1 if det.head.layout == HeadLayout.HIDDEN_VOCAB else 0
    tied_equal = det.comparison.values in EQUAL_STATES and h.dtype == det.emb_info.dtype
    recipe: Recipe
    if tied_equal and axis == 0:
        recipe = emb
    elif tied_equal and isinstance(emb, KeptRows | TransplantRows):  # its entries, as columns
        recipe = replace(emb, name=det.head.name, axis=axis)
    elif tied_equal:  # the embedding's new rows, as columns
        assert isinstance(emb, ResizedTable | EditedTable), "internal: the embedding is a table"
        recipe = replace(emb, name=det.head.name, axis=axis, new=hnew)
    else:
        recipe = draws.table(det.head.name, axis, hnew, hrows)
    if tied_equal and det.tie.tied and hrows == det.vocab_rows and _drop_redundant_head(det, plan):
        return recipe  # extra tables that copy the head still follow it
    storage = det.emb_info.storage if det.comparison.storage_shared else None
    for n in [det.head.name] + det.head.aliases:
        _put(plan, n, axis, hnew, recipe, storage or det.ckpt.tensors[n].storage)
    return recipe


def _drop_redundant_head(det: Detection, plan: Plan) -> bool:
    """Drop the redundant head of a tied checkpoint (config tied, head byte-equal to the embedding) where
    the loader re-ties a missing head, as ``tie`` would (:func:`drop_head`), with a note: the loader
    rebuilds it from the resized embedding. PaddleFormers 1.2 writes such a head although the config says
    tied. Never on a Trainer flex checkpoint (:class:`~surgery.plan.merge_flex.FlexView`, edited with its
    training state): the resume loads every stored name. Returns whether it was dropped (False: the
    loader needs the head, which is resized)."""
    if isinstance(det.ckpt, FlexView):
        plan.notes.append(
            f"{det.head.name} resized with {det.embedding.name}, not dropped: the PaddleFormers Trainer "
            "stores a tied model's head beside the embedding and the tied parameter's optimizer state under "
            "the head's name, and resumes them by name (tests/oracles/test_flex_tied_state.py)"
        )
        return False
    why = f"duplicate of {det.embedding.name} in a tied checkpoint (the {det.loader.name} loader re-ties it)"
    if not drop_head(det, plan, why):
        if det.family.reties and not det.family.trusted:
            unproven_note(det, plan, f"{det.head.name} is resized with the embedding, not dropped")
        return False
    plan.notes.append(
        f"{det.head.name} dropped instead of resized: {det.tie.source} is true and it equalled "
        f"{det.embedding.name}, so the {det.loader.name} loader rebuilds it from the resized embedding"
    )
    return True


def _resize_bias(det: Detection, plan: Plan, old: int, recipe: Recipe | None) -> None:
    """The head bias ``[V]`` / ``[1, V]`` (and its aliases, one array) by ``recipe`` (``resize``: to the
    head's new entries, new entries zero; None: no bias).

    Raises:
        RefusedError: the bias has another number of entries than the head's ``old`` rows.
    """
    ckpt = det.ckpt
    if det.bias is None or recipe is None:
        return
    bias = det.bias.name
    b = ckpt.tensors[bias]
    if not b.shape or b.shape[-1] != old:
        got = f"{b.shape[-1]} entries" if b.shape else "no axis (shape [])"
        raise RefusedError(
            f"the head bias {bias} has {got} but the head has {old} vocabulary rows",
            ckpt.path,
            "fix the bias first",
        )
    assert isinstance(recipe, ResizedBias | EditedBias | KeptRows | TransplantRows), "internal: a bias recipe"
    entries = (
        len(recipe.ids)
        if isinstance(recipe, KeptRows)
        else len(recipe.rows)
        if isinstance(recipe, TransplantRows)
        else recipe.new
    )
    for n in det.bias_names:
        t = ckpt.tensors[n]
        out = out_dtype(ckpt, t, plan.relabel_u16)
        plan.replace[n] = OutTensor(n, out, t.shape[:-1] + (entries,), recipe, t.file, storage=t.storage)


def plan_resize_to(
    det: Detection, vocab_size: int | None, pad_to_multiple_of: int | None, *args: Any
) -> Plan:
    """:func:`plan_resize` (``args``: its ``init``, ``seed``, ``force``); with no ``vocab_size``, the
    current rows rounded up to ``pad_to_multiple_of``.

    Raises:
        UsageError: neither ``vocab_size`` nor ``pad_to_multiple_of``; and as :func:`plan_resize`.
    """
    if vocab_size is None:
        if pad_to_multiple_of is None:
            raise UsageError(
                "resize needs the new number of rows",
                fix=f"give {Opt('vocab_size')}, or {Opt('pad_to_multiple_of')} alone to round the rows up",
            )
        vocab_size = det.vocab_rows
    return plan_resize(det, vocab_size, pad_to_multiple_of, *args)
