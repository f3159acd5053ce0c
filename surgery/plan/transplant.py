"""``transplant``: the model given a donor's tokenizer, every vocabulary tensor laid out in the donor's id
order (the planner :func:`plan_transplant`).

New id ``j`` is the donor's token ``s``. Where the old tokenizer has the same token string ``s`` (the same
entry of its vocabulary or added tokens), entry ``j`` of each vocabulary tensor is the old entry of that
id, bit for bit (mergekit-tokensurgeon's exact match: ``mergekit/scripts/tokensurgeon.py``,
``build_embedding_matrix``, github.com/arcee-ai/mergekit at a6e40288). Otherwise it is made by ``init``
(:class:`~surgery.model.enums.TransplantInit`): ``subword``, the mean of the old entries of the pieces the old
tokenizer splits the token's text into (mergekit's ``subword`` with ``SubwordMethod.MEAN``; the text as
:func:`_decoder` reads it; a text that splits into nothing gets zeros, as mergekit leaves it); ``mean``,
the mean of every old entry; ``zeros``; ``omp`` (mergekit's default method), the donor model's
embedding of the token approximated over the shared tokens' donor embeddings by orthogonal matching pursuit,
the coefficients applied to their old entries (:mod:`surgery.plan.transplant_omp`; needs ``donor_model``).

Each vocabulary tensor gets a :class:`~surgery.plan.transplant_rows.TransplantRows` recipe, moved by
:func:`~surgery.plan.resize.move_vocabulary` as ``prune`` moves them; the donor's tokenizer files replace the
old ones (an old tokenizer file the donor lacks is not carried); ``vocab_size`` follows
(:func:`~surgery.plan.resize.resize_config`); each token id ``config.json`` / ``generation_config.json``
names is the donor's id of the same role (``eos_token_id``: the donor's ``eos_token``), else of the same
string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

from ..inspect.detection import Detection
from ..io.configfile import get_dotted, read_config_file
from ..model.enums import TransplantInit
from ..model.errors import Opt, RefusedError, UsageError
from ..model.tokens import TokenEdit
from .plan import Plan, base_plan, refuse_unsettled_pair, refuse_unusable_head
from .resize import move_vocabulary, refuse_ambiguous_head, refuse_vocab_surface, resize_config
from .transplant_rows import MEAN, ZEROS, OmpRow, RowSource, TransplantRows

TOKENIZER_EXTRAS = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
)
"""Files of a tokenizer beside its vocabulary files that the donor's replace (when either side has one)."""


class TransplantSection(TypedDict):
    """The report's ``transplant`` section: per new id ``j``, ``tokens[j]`` (the donor's token) and
    ``made[j]``, how its entries were made, one string each (a report of 128k ids stays fast to write and
    read): ``"kept N"`` (the old entry of id ``N``, bit for bit), ``"subword I J ..."`` (the mean of the old
    entries of ids ``I J ...``; ``"subword"`` alone: zeros, the text split into nothing), ``"mean"`` (of
    every old entry), ``"zeros"`` or ``"omp"``; ``counts`` of each kind. With ``omp``, ``omp`` holds for the
    ``"omp"`` rows in id order, per table (``embedding``; ``head`` when the head has rows of its own), the
    old ids ``ids[n]`` and float32 coefficients ``coef[n]`` of the ``n``-th, the donor tensor read
    (``embedding_donor_tensor``...), ``k`` and ``donor_model``."""

    donor: str
    init: str
    rows_before: int
    rows_after: int
    counts: dict[str, int]
    tokens: list[str]
    made: list[str]


def made_text(r: RowSource) -> str:
    """``made[j]`` of the report for the :data:`RowSource` ``r`` (:class:`TransplantSection`)."""
    if isinstance(r, tuple):
        return " ".join(["subword", *map(str, r)])
    if isinstance(r, OmpRow):
        return "omp"
    return f"kept {r}" if r >= 0 else "mean" if r == MEAN else "zeros"


@dataclass
class _Layout:
    """The :class:`~surgery.plan.resize.VocabRows` of a transplant: every table laid out by ``rows``, the
    head ``head_name`` by ``head`` when given (omp's rows of its own)."""

    rows: tuple[RowSource, ...]
    head: tuple[RowSource, ...] | None = None
    head_name: str = ""

    def table(self, name: str, axis: int, new: int, old: int) -> TransplantRows:
        """``name`` with one entry per new id along ``axis``."""
        own = self.head is not None and name == self.head_name
        return TransplantRows(name, axis, self.head if own and self.head is not None else self.rows)

    def bias(self, name: str, new: int) -> TransplantRows:
        """The head bias with one entry per new id (last axis)."""
        return TransplantRows(name, -1, self.rows)


def plan_transplant(
    det: Detection, donor: Path, init: TransplantInit, donor_model: Path | None = None, k: int = 64
) -> Plan:
    """Plan the model given the tokenizer of the folder ``donor`` (module docstring); ``donor_model`` and
    ``k`` for ``init`` omp (:func:`~surgery.plan.transplant_omp.plan_omp`).

    Raises:
        UsageError: ``donor`` is not a folder.
        RefusedError: the model or the donor has no tokenizer tietool reads (tokenizer.json, SentencePiece
            ``.model``, vocab.txt, vocab.json + merges.txt), the model's tokenizer names ids beyond its rows,
            an unsettled or unusable pair, a head of its own number of rows or over another vocabulary, a
            token-indexed table; for omp as :func:`~surgery.plan.transplant_omp.plan_omp`.
        UsageError: omp without ``donor_model``.
        CheckpointError: a tokenizer file that is not valid (JSON, protobuf).
    """
    from ..io.tokenizer_folder import scan_folder, splitter

    _refuse(det)
    scan = partial(scan_folder, native=False)  # both read, never edited
    old = _scan(scan, det.ckpt.path, "the model's")
    donor = Path(donor)
    if not donor.is_dir():
        raise UsageError(
            f"the donor tokenizer {donor} is not a folder", fix="pass the folder of tokenizer files"
        )
    new = _scan(scan, donor, "the donor")
    V = det.vocab_rows
    if old.length > V:
        raise RefusedError(
            f"transplant refused: the model's tokenizer has {old.length} tokens but the embedding {V} rows, "
            "so some of its tokens have no row to keep",
            det.ckpt.path,
            "resize the model to its tokenizer first (tietool resize)",
        )
    tokens = _donor_tokens(new)
    split = splitter(old) if init is TransplantInit.SUBWORD else None
    rows = _rows(tokens, old.ids(), _decoder(new), split, init)
    layout, omp = _layout(det, rows, tokens, init, donor_model, k)
    rows = list(layout.rows)
    N = len(rows)
    plan = base_plan("transplant", det)
    plan.tokenizer = _tokenizer_edit(det.ckpt.path, donor, old.length, N)
    _set_specials(det, plan, old.ids(), new)
    move_vocabulary(det, plan, N, layout)
    resize_config(det, plan, N)
    section = _section(str(donor), init, V, tokens, rows)
    plan.extra_report = dict(section) | ({"omp": omp} if omp is not None else {})
    counts = section["counts"]
    others = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n and kind != "kept")
    plan.notes.append(
        f"{N} donor tokens: {counts['kept']} kept their row (the same token string, bit for bit)"
        + (f", {others}" if others else "")
        + f"; {V} rows before"
    )
    if plan.tokenizer.dropped:
        plan.notes.append(f"not carried (the donor has no such file): {', '.join(plan.tokenizer.dropped)}")
    return plan


_KINDS = ("kept", "subword", "mean", "zeros", "omp")


def _section(
    donor: str, init: TransplantInit, V: int, tokens: list[str], rows: list[RowSource]
) -> TransplantSection:
    """The report's section (but omp's part) for ``rows`` made from a ``V``-row model."""
    made = [made_text(r) for r in rows]
    counts = {kind: sum(m.split(" ", 1)[0] == kind for m in made) for kind in _KINDS}
    return TransplantSection(
        donor=donor,
        init=init.value,
        rows_before=V,
        rows_after=len(rows),
        counts=counts,
        tokens=tokens,
        made=made,
    )


def _layout(
    det: Detection,
    rows: list[RowSource],
    tokens: list[str],
    init: TransplantInit,
    donor_model: Path | None,
    k: int,
) -> tuple[_Layout, dict[str, Any] | None]:
    """The tables' layout for ``rows`` (one per donor token of ``tokens``); for omp, the made rows computed
    from ``donor_model`` (the embedding's, and the head's when it has rows of its own) and the report's
    ``omp`` part."""
    if init is not TransplantInit.OMP:
        return _Layout(tuple(rows)), None
    from .transplant_omp import plan_omp

    if donor_model is None:
        raise UsageError(
            f"{Opt('init', init)} needs the donor's weights",
            fix=f"pass {Opt('donor_model')} DONOR_CHECKPOINT_DIR",
        )
    _same_vocabulary(Path(donor_model), tokens)
    omp = plan_omp(det, rows, len(tokens), donor_model, k)
    return _Layout(omp.embedding, omp.head, det.head.name), omp.section


def _same_vocabulary(donor_model: Path, tokens: list[str]) -> None:
    """The donor model's own tokenizer names ``tokens`` (the donor tokenizer's) at the same ids: its rows are
    then in the donor's id order (mergekit reads the donor model's tokenizer and weights from one folder).

    Raises:
        RefusedError: the donor model has no tokenizer tietool reads, or another token at some id.
    """
    from ..io.tokenizer_folder import scan_folder

    fix = f"pass {Opt('tokenizer')} the donor model's own tokenizer (its folder)"
    try:
        own = _donor_tokens(scan_folder(donor_model, native=False))
    except RefusedError as e:
        raise RefusedError(
            f"transplant refused: the donor model's tokenizer cannot be read ({e.message}), so which row is "
            "which donor token cannot be told",
            donor_model,
            fix,
        ) from e
    diff = next((j for j, (a, b) in enumerate(zip(own, tokens, strict=False)) if a != b), None)
    if diff is not None or len(own) != len(tokens):
        j = diff if diff is not None else min(len(own), len(tokens))
        raise RefusedError(
            f"transplant refused: the donor model's tokenizer has {len(own)} tokens, the donor tokenizer "
            f"{len(tokens)}, and they differ from id {j}",
            donor_model,
            fix,
        )


def _scan(scan: Any, folder: Path, whose: str) -> Any:
    """``scan(folder)``, a refusal of it named as ``whose`` tokenizer (one line)."""
    try:
        return scan(folder)
    except RefusedError as e:
        raise RefusedError(
            f"transplant refused: {whose} tokenizer cannot be read ({e.message})",
            e.path or folder,
            "give a folder with tokenizer.json, a SentencePiece .model, vocab.txt or vocab.json + merges.txt",
        ) from e


def _refuse(det: Detection) -> None:
    """What transplant refuses before reading tokenizers: what prune refuses (an unsettled or unusable
    pair, a head of its own number of rows or over another vocabulary), and token-indexed tables."""
    refuse_unsettled_pair(det, "transplant")
    refuse_unusable_head(det, "transplant")
    refuse_ambiguous_head(det)
    refuse_vocab_surface(det, det.vocab_rows, "transplant")
    V = det.vocab_rows
    if det.head.present and (
        det.head.vocab is not None or (det.head.rows is not None and det.head.rows != V)
    ):
        raise RefusedError(
            f"transplant refused: the head {det.head.name} has {det.head.rows} vocabulary entries, the "
            f"embedding {V}: which head entry is which token cannot be told",
            det.ckpt.path,
            "resize the model so the two agree first",
        )
    tables = list(det.beyond.token_tables) + [
        n for n in det.beyond.other_vocab if n not in det.beyond.token_tables
    ]
    if tables:
        raise RefusedError(
            f"transplant refused: {tables[0]} is indexed by token id or of another vocabulary; tietool "
            "does not lay it out for another tokenizer",
            det.ckpt.path,
            "transplant with the model's own tools",
        )


def _donor_tokens(f: Any) -> list[str]:
    """The donor's token string of every id ``0..length-1`` (added tokens over the base vocabulary)."""
    by_id = {i: s for s, i in f.base.items()}
    by_id.update({i: t.content for i, t in f.added.items()})
    missing = [i for i in range(f.length) if i not in by_id]
    if missing:
        raise RefusedError(
            f"transplant refused: the donor tokenizer names no token at id {missing[0]}",
            f.root,
            "save the donor tokenizer again with save_pretrained so its ids are contiguous",
        )
    return [by_id[i] for i in range(f.length)]


def _decoder(f: Any) -> Any:
    """``decode(id) -> text`` of a donor token as it reads inside a text: an added token is its content; a
    SentencePiece-style piece (a ``.model``, or tokenizer.json whose decoder is ``Metaspace`` or replaces
    ``▁``) its string with
    ``▁`` as a space (mergekit's ``unnormalize_token``: the word-start mark is a leading space, which
    ``decode([id])`` would strip), a byte piece ``<0xNN>`` decoded; any other token decoded by ``tokenizers``
    (tokenizer.json, vocab.txt, vocab.json)."""
    import json

    from ..io.tokenizer_folder import json_tokenizer

    sp_only = f.tokenizer_json is None and f.sp_model is not None
    if sp_only:
        sp = f.sp_proc
        decode = lambda i: sp.decode([i])  # noqa: E731
    else:
        tok = json_tokenizer(f)
        decode = lambda i: tok.decode([i], skip_special_tokens=False)  # noqa: E731
    dec = json.dumps(f.tj.get("decoder"), ensure_ascii=False)
    sp_style = sp_only or "Metaspace" in dec or "\u2581" in dec
    piece = {i: s for s, i in f.base.items()}

    def text(i: int) -> str:
        if i in f.added:
            return str(f.added[i].content)
        p = str(piece.get(i, ""))
        if sp_style and not _BYTE_PIECE.fullmatch(p):
            return p.replace("\u2581", " ")
        return str(decode(i))  # type: ignore[no-untyped-call]

    return text


_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _rows(
    tokens: list[str], old_ids: dict[str, int], decode: Any, split: Any, init: TransplantInit
) -> list[RowSource]:
    """Each new id's :data:`RowSource`: the old id of the same token string, else by ``init``."""
    rows: list[RowSource] = []
    for j, s in enumerate(tokens):
        if s in old_ids:
            rows.append(old_ids[s])
        elif split is not None:
            rows.append(tuple(split(decode(j))))
        else:
            rows.append(MEAN if init is TransplantInit.MEAN else ZEROS)
    return rows


def _tokenizer_edit(old: Path, donor: Path, before: int, after: int) -> TokenEdit:
    """The donor's tokenizer files written in place of the model's; the model's tokenizer files the donor
    lacks dropped."""
    from ..io.tokenizer import tokenizer_set

    def names(folder: Path) -> set[str]:
        found = {f.name for f in tokenizer_set(folder).files}
        return found | {n for n in TOKENIZER_EXTRAS if (folder / n).is_file()}

    give = names(donor)
    files = {n: (donor / n).read_bytes() for n in sorted(give)}
    return TokenEdit(
        length_before=before, length_after=after, files=files, dropped=tuple(sorted(names(old) - give))
    )


_ROLES = {"bos_token_id": "bos_token", "eos_token_id": "eos_token", "pad_token_id": "pad_token"}


def _role_id(f: Any, role: str) -> int | None:
    """The donor's id of its ``role`` token (``eos_token``...) as its tokenizer_config.json /
    special_tokens_map.json names it; None when neither does, or names a string it has no id for."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        v = (f.json_files.get(name) or {}).get(role)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            got = f.ids().get(v)
            return got if isinstance(got, int) else None
    return None


def _set_specials(det: Detection, plan: Plan, old_ids: dict[str, int], donor: Any) -> None:
    """Every token id config.json / generation_config.json names, set to the donor's id of the same role
    (a single id), else of the same token string; one with neither set to null (a list: left out), with a
    warning naming it."""
    old_tok = {i: s for s, i in old_ids.items()}
    new_ids = donor.ids()
    for file in ("config.json", "generation_config.json"):
        keys = {s.key for s in det.special_ids if s.file == file and s.key.endswith(("_id", "_ids"))}
        main = file == "config.json" or not keys
        data = det.ckpt.config if main else read_config_file(det.ckpt.path / file)
        for key in sorted(keys):
            v = get_dotted(data, key)
            role = None if isinstance(v, list) else _role_id(donor, _ROLES.get(key.rsplit(".", 1)[-1], ""))
            picks = [
                (i, role if role is not None else new_ids.get(old_tok.get(i, "\0"))) for i in _as_list(v)
            ]
            for i, got in picks:
                if got is None:
                    plan.warnings.append(
                        f"{file} {key} = {i} ({old_tok.get(i)!r}): the donor tokenizer has no token of its "
                        "role nor its string; set to null"
                    )
            got = [g for _, g in picks if g is not None]
            plan.config_set.append((file, key, got if isinstance(v, list) else got[0] if got else None))


def _as_list(v: Any) -> list[int]:
    """The token ids of a config value (one id or a list; other values name none)."""
    vals = v if isinstance(v, list) else [v]
    return [i for i in vals if isinstance(i, int) and not isinstance(i, bool)]
