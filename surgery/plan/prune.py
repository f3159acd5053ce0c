"""``prune``: a model cut to a keep-list of token ids, every vocabulary tensor and tokenizer file renumbered
together (the planner :func:`plan_prune`).

The kept ids keep their order: new id ``j`` is the ``j``-th kept old id. Each vocabulary tensor gets a
:class:`~surgery.plan.kept_rows.KeptRows` recipe (its kept entries, byte for byte), moved by
:func:`~surgery.plan.resize.move_vocabulary` as ``resize`` moves them; the tokenizer files are edited by
:func:`~surgery.io.tokenizer_prune.prune_tokenizer_edit`; ``vocab_size`` by
:func:`~surgery.plan.resize.resize_config`; every token id a configuration file names is renumbered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import arch
from ..inspect.detect import Detection
from ..io.configfile import get_dotted, read_config_file
from ..io.tokenizer import token_strings
from ..model.errors import Opt, RefusedError, UsageError
from .kept_rows import KeptRows
from .plan import OutTensor, Plan, base_plan, out_dtype, refuse_unsettled_pair, refuse_unusable_head
from .resize import move_vocabulary, refuse_ambiguous_head, refuse_vocab_surface, resize_config


@dataclass
class _Keep:
    """The :class:`~surgery.plan.resize.VocabRows` of a prune: every table keeps the entries ``ids``."""

    ids: tuple[int, ...]

    def table(self, name: str, axis: int, new: int, old: int) -> KeptRows:
        """``name`` with its entries ``ids`` along ``axis``."""
        return KeptRows(name, axis, self.ids)

    def bias(self, name: str, new: int) -> KeptRows:
        """The head bias with its entries ``ids`` (last axis)."""
        return KeptRows(name, -1, self.ids)


def plan_prune(
    det: Detection,
    keep: Sequence[int],
    keep_special: bool = False,
    texts: Sequence[str] = (),
    keep_source: Path | None = None,
) -> Plan:
    """Plan the model cut to the token ids ``keep`` (plus, with ``keep_special``, every added token, every
    token a configuration file names, and the byte tokens of a byte-level / byte-fallback BPE, the unknown,
    control and byte-fallback pieces of a SentencePiece model). ``texts`` (a keep-corpus's lines) must
    encode as before, renumbered.

    Raises:
        UsageError: an empty keep-list, an id outside ``0..vocab_rows-1``.
        RefusedError: an unsettled or unusable pair, a head with rows of its own number or over another
            vocabulary, a token table no rule renumbers, a special id not kept, an unproven tokenizer format
            (:func:`~surgery.io.tokenizer_prune.prune_tokenizer_edit`).
    """
    V = det.vocab_rows
    ids = _checked(det, keep, keep_source)
    if keep_special:
        ids = sorted(set(ids) | set(_special_ids(det)))
    _refuse(det)
    from ..io.tokenizer_prune import prune_tokenizer_edit  # tokenizer files, lazily

    plan = base_plan("prune", det)
    plan.tokenizer = prune_tokenizer_edit(det.ckpt.path, ids, texts)
    if plan.tokenizer is None:
        plan.warnings.append(
            "the checkpoint has no tokenizer files: the ids are renumbered (the report's id_map), prune the "
            "tokenizer to the same ids before using the model"
        )
    new_id = {old: new for new, old in enumerate(ids)}
    _renumber_specials(det, plan, new_id)
    N = len(ids)
    move_vocabulary(det, plan, N, _Keep(tuple(ids)))
    _token_tables(det, plan, tuple(ids))
    resize_config(det, plan, N)
    plan.extra_report = {
        "rows_before": V,
        "rows_after": N,
        "rows_removed": V - N,
        "keep_special": keep_special,
        "id_map": {str(o): n for o, n in new_id.items()},
    }
    plan.notes.append(f"{N} of {V} tokens kept (ids renumbered in their old order), {V - N} removed")
    twice = len(keep) - len(set(keep))
    if twice:
        first = next(i for i, n in Counter(keep).items() if n > 1)
        plan.notes.append(f"the keep-list names {twice} id(s) more than once (e.g. {first}): each kept once")
    return plan


def _checked(det: Detection, keep: Sequence[int], source: Path | None = None) -> list[int]:
    """``keep`` sorted and unique; refuse an empty list or an id outside the rows (UsageError, naming
    ``source``, the keep-file, when given)."""
    V = det.vocab_rows
    if not keep:
        raise UsageError(
            "the keep-list is empty: nothing would remain", fix=f"list the ids to keep ({Opt('keep_ids')})"
        )
    bad = [i for i in keep if not 0 <= i < V]
    if bad:
        raise UsageError(
            f"the keep-list names id {bad[0]}, outside the vocabulary's {V} rows (ids 0..{V - 1})",
            source,
            fix="list ids of the model's vocabulary",
        )
    return sorted(set(keep))


def _special_ids(det: Detection) -> list[int]:
    """The ids ``keep_special`` adds: every token id a configuration file names, every added token, and
    the byte tokens of a byte-level / byte-fallback BPE (:func:`~surgery.io.tokenizer_prune.alphabet_ids`),
    the tokens the tokenizer config names by string (:func:`~surgery.io.tokenizer_prune.named_ids`)."""
    from ..io.tokenizer_prune import alphabet_ids, named_ids

    out = [s.id for s in det.special_ids if 0 <= s.id < det.vocab_rows]
    out += [t.id for t in det.tokenizer.files.added if 0 <= t.id < det.vocab_rows]
    out += named_ids(det.ckpt.path, det.vocab_rows)
    return out + alphabet_ids(det.ckpt.path)


def _refuse(det: Detection) -> None:
    """What prune refuses before planning: what resize refuses, a head with rows of its own number (the
    ids would mean other rows) or over another vocabulary, integer tables of another vocabulary."""
    refuse_unsettled_pair(det, "prune")
    refuse_unusable_head(det, "prune")
    refuse_ambiguous_head(det)
    refuse_vocab_surface(det, det.vocab_rows, "prune")
    V = det.vocab_rows
    if det.head.present and (
        det.head.vocab is not None or (det.head.rows is not None and det.head.rows != V)
    ):
        raise RefusedError(
            f"prune refused: the head {det.head.name} has {det.head.rows} vocabulary entries, the embedding "
            f"{V}: which head entry is which token cannot be told",
            det.ckpt.path,
            "resize the model so the two agree first",
        )
    other = [n for n in det.beyond.other_vocab if n not in det.beyond.token_tables]
    if other:
        raise RefusedError(
            f"prune refused: {', '.join(other)} is of another vocabulary and may hold token ids, which no "
            "rule renumbers",
            det.ckpt.path,
            "remove the tensor first, or prune with the model's own tools",
        )


def _token_tables(det: Detection, plan: Plan, ids: tuple[int, ...]) -> None:
    """Every token-indexed table keeps the rows of the kept tokens where its rule allows it (its values
    ids of something else, or a membership mask); a table that maps token ids (``KEEP_IDS``) or is keyed to
    another vocabulary is refused: its values would need renumbering."""
    for n, rule in det.beyond.token_tables.items():
        if rule.indexed_by != "vocab" or rule.rule is arch.TokenRule.KEEP_IDS:
            raise RefusedError(
                f"prune refused: {n} ({rule.what}) holds token ids or is keyed to another vocabulary; "
                "tietool does not renumber its values",
                det.ckpt.path,
                "prune with the model's own tools",
            )
        t = det.ckpt.tensors[n]
        shape = (len(ids),) + tuple(t.shape[1:])
        out = out_dtype(det.ckpt, t, plan.relabel_u16)
        plan.replace[n] = OutTensor(n, out, shape, KeptRows(n, 0, ids), t.file, storage=t.storage)
        plan.notes.append(f"{n} ({rule.what}): the kept tokens' rows")


def _renumber_specials(det: Detection, plan: Plan, new_id: dict[int, int]) -> None:
    """Every token id config.json / generation_config.json names (``eos_token_id``, lists too) renumbered;
    one not kept refused, naming it."""
    for s in det.special_ids:
        if s.file not in ("config.json", "generation_config.json") or not s.key.endswith(("_id", "_ids")):
            continue
        if s.id not in new_id:
            names = token_strings(det.ckpt.path, [s.id]) if s.id < det.vocab_rows else {}
            tok = f" ({names[s.id]!r})" if names.get(s.id) is not None else ""
            raise RefusedError(
                f"prune refused: {s}{tok} is not kept",
                det.ckpt.path / s.file,
                f"add {s.id} to the keep-list, or pass {Opt('keep_special', True)}",
            )
    for file in ("config.json", "generation_config.json"):
        keys = {s.key for s in det.special_ids if s.file == file and s.key.endswith(("_id", "_ids"))}
        if not keys:
            continue
        data = det.ckpt.config if file == "config.json" else read_config_file(det.ckpt.path / file)
        for key in sorted(keys):
            plan.config_set.append((file, key, _mapped(get_dotted(data, key), new_id)))


def _mapped(v: Any, new_id: dict[int, int]) -> Any:
    if isinstance(v, list):
        return [_mapped(x, new_id) for x in v]
    return new_id.get(v, v) if isinstance(v, int) and not isinstance(v, bool) else v
