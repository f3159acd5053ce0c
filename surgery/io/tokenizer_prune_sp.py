"""SentencePiece ``*.model`` files cut to a keep-list of token ids (``prune``), and the check that a pruned
tokenizer still encodes kept text as before (:func:`refuse_changed_encoding`).

A model file is edited through its protobuf (``sentencepiece_model_pb2.ModelProto``, as
:mod:`surgery.io.tokenizer_edit` appends pieces; unsloth's ``fix_sentencepiece_tokenizer`` edits pieces the
same way): the pieces at the kept ids stay, in their order, with their scores and types; ``trainer_spec``'s
``unk_id`` / ``bos_id`` / ``eos_id`` / ``pad_id`` and ``vocab_size`` are renumbered. The unknown piece,
the control pieces (``<s>``, ``</s>``) and the byte-fallback pieces ``<0x00>``..``<0xFF>`` must be kept
(refused, naming them; ``--keep-special`` keeps them): every byte of text the model lacks encodes to one.

Why the encoding of kept text does not change (each checked by the libraries in
``tests/oracles/test_prune_tokenizers.py``, and on every prune by :func:`refuse_changed_encoding`):
``Unigram`` picks the segmentation of highest score (Viterbi); the old best segmentation of kept text uses
kept pieces only, and removing pieces removes other candidates, never that one. ``BPE`` merges the adjacent
pair whose concatenation is the best-scoring piece; when every piece a kept piece can be merged from is
kept (:func:`sp_parts`), the merges applied to kept text are all still there, and the ones removed were
never chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..model.errors import CheckpointError, Opt, RefusedError
from .tokenizer_folder import import_lib
from .tokenizer_loaders import PrunedFormat

UNKNOWN, CONTROL, BYTE = 2, 3, 6  # sentencepiece_model.proto SentencePiece.Type
KEPT_TYPES = {UNKNOWN: "the unknown piece", CONTROL: "a control piece", BYTE: "a byte-fallback piece"}
MODEL_TYPES = {1: PrunedFormat.SP_UNIGRAM, 2: PrunedFormat.SP_BPE}  # TrainerSpec.ModelType UNIGRAM, BPE
SPEC_IDS = ("unk_id", "bos_id", "eos_id", "pad_id")


def read_model(path: Path) -> Any:
    """The ``ModelProto`` of a SentencePiece model file.

    Raises:
        CheckpointError: a file that is not a SentencePiece model.
        TietoolError: sentencepiece is missing (the ``tokenizer`` extra).
    """
    pb = import_lib("sentencepiece.sentencepiece_model_pb2")
    m = pb.ModelProto()
    try:
        m.ParseFromString(Path(path).read_bytes())
    except Exception as e:  # protobuf's DecodeError
        raise CheckpointError(f"{Path(path).name} is not a SentencePiece model ({e})", path) from e
    return m


def sp_format(path: Path, m: Any) -> PrunedFormat:
    """The model's :class:`PrunedFormat` (Unigram or BPE).

    Raises:
        RefusedError: a WORD or CHAR model, whose pruning is not proven.
    """
    kind = m.trainer_spec.model_type or 1
    if kind not in MODEL_TYPES:
        raise RefusedError(
            f"prune refused: {Path(path).name} is a SentencePiece model of type {kind} (WORD or CHAR), "
            "whose pruning tietool has not proven (it prunes Unigram and BPE models)",
            path,
            "prune with sentencepiece's own tools",
        )
    return MODEL_TYPES[kind]


def sp_alphabet_ids(path: Path) -> list[int]:
    """The ids of the pieces ``prune`` must keep: the unknown, control and byte-fallback pieces."""
    return [i for i, p in enumerate(read_model(path).pieces) if p.type in KEPT_TYPES]


def sp_parts(pieces: Sequence[str], keep: set[int]) -> dict[int, str]:
    """``{id: piece}`` of the pieces outside ``keep`` that SentencePiece BPE can merge into a kept piece:
    every ``a`` and ``b`` with ``a + b`` a kept piece and both pieces of the model (the closure: the parts
    of such a part too). A superset of the pieces BPE passes through."""
    ids = {p: i for i, p in enumerate(pieces)}
    missing: dict[int, str] = {}
    todo = [i for i in keep if i < len(pieces)]
    seen = set(todo)
    while todo:
        p = pieces[todo.pop()]
        for k in range(1, len(p)):
            a, b = ids.get(p[:k]), ids.get(p[k:])
            if a is None or b is None:
                continue
            for j in (a, b):
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
                    if j not in keep:
                        missing[j] = pieces[j]
    return missing


def prune_sp_model(path: Path, new_id: dict[int, int]) -> tuple[bytes, set[str]]:
    """The model file at ``path`` with only the pieces at ``new_id``'s keys (ascending), and the dropped
    pieces.

    Raises:
        RefusedError: a WORD / CHAR model; an unknown, control or byte-fallback piece dropped; a kept piece
            of a BPE model mergeable from a dropped one (the ids to add named); a Unigram model left with
            no normal piece (sentencepiece does not load it).
    """
    m = read_model(path)
    fmt = sp_format(path, m)
    pieces = [p.piece for p in m.pieces]
    lost = [(i, p) for i, p in enumerate(m.pieces) if i not in new_id and p.type in KEPT_TYPES]
    if lost:
        shown = ", ".join(f"{i} {p.piece!r} ({KEPT_TYPES[p.type]})" for i, p in lost[:8])
        raise RefusedError(
            f"prune refused: {len(lost)} piece(s) of {path.name} that must stay would be dropped ({shown})",
            path,
            f"pass {Opt('keep_special', True)} (keeps them), or add their ids to the keep-list",
        )
    if fmt is PrunedFormat.SP_BPE:
        missing = sp_parts(pieces, set(new_id))
        if missing:
            shown = ", ".join(f"{i} {t!r}" for i, t in sorted(missing.items())[:8])
            ids = ",".join(map(str, sorted(missing)[:64]))
            raise RefusedError(
                f"prune refused: kept pieces of the BPE model {path.name} can be merged from "
                f"{len(missing)} piece(s) the keep-list drops ({shown}): kept text could encode differently",
                path,
                f"add these ids to the keep-list: {ids}",
            )
    kept = [m.pieces[i] for i in sorted(new_id) if i < len(pieces)]
    gone = {p for i, p in enumerate(pieces) if i not in new_id}
    copies = [type(p)() for p in kept]
    for c, p in zip(copies, kept, strict=True):
        c.CopyFrom(p)
    del m.pieces[:]
    m.pieces.extend(copies)
    for key in SPEC_IDS:
        old = getattr(m.trainer_spec, key)
        if old >= 0:
            setattr(m.trainer_spec, key, new_id.get(old, -1))
    m.trainer_spec.vocab_size = len(copies)
    if fmt is PrunedFormat.SP_UNIGRAM and all(p.type in KEPT_TYPES for p in copies):
        raise RefusedError(  # sentencepiece refuses it on load: "INTERNAL: no pieces are loaded."
            f"prune refused: the keep-list leaves the Unigram model {path.name} only unknown, control and "
            "byte-fallback pieces, which sentencepiece cannot load (no pieces are loaded)",
            path,
            f"add the ids of the pieces your text uses to the keep-list (or prune with {Opt('corpus')})",
        )
    return m.SerializeToString(), gone


# ------------------------------------------------------------------ the encoding of kept text, checked

Encoder = Callable[[list[str]], list[list[int]]]


def sp_encoders(old: bytes, new: bytes) -> tuple[Encoder, Encoder, Callable[[int], str]]:
    """``(old encode, new encode, old decode of one id)`` of two SentencePiece model files."""
    spm = import_lib("sentencepiece")
    a, b = (spm.SentencePieceProcessor(model_proto=x) for x in (old, new))
    return (
        lambda xs: [list(e) for e in a.encode(xs)],
        lambda xs: [list(e) for e in b.encode(xs)],
        lambda i: a.decode([i]) if i < a.get_piece_size() else "",  # ids beyond the model: rows only
    )


def json_encoders(old: str, new: str) -> tuple[Encoder, Encoder, Callable[[int], str]]:
    """``(old encode, new encode, old decode of one id)`` of two ``tokenizer.json`` texts (``tokenizers``,
    without the post-processor's special tokens)."""
    tk = import_lib("tokenizers")
    a, b = tk.Tokenizer.from_str(old), tk.Tokenizer.from_str(new)

    def enc(t: Any) -> Encoder:
        return lambda xs: [e.ids for e in t.encode_batch(xs, add_special_tokens=False)]

    return enc(a), enc(b), lambda i: a.decode([i], skip_special_tokens=False)


def refuse_changed_encoding(
    path: Path,
    encoders: tuple[Encoder, Encoder, Callable[[int], str]],
    keep: Sequence[int],
    texts: Sequence[str] = (),
) -> None:
    """Refuse a pruned vocabulary file that encodes kept text otherwise than the old one renumbered: the
    ``texts`` (a keep-corpus's lines) and each kept token's own text, wherever the old encoding uses kept
    tokens only.

    Raises:
        RefusedError: naming the first text, the kept token it came from and both encodings.
    """
    old_enc, new_enc, decode = encoders
    new_id = {o: n for n, o in enumerate(keep)}
    items: list[tuple[str, int | None]] = [(s, None) for s in texts if s.strip()]
    items += [(decode(i), i) for i in keep]
    items = [(s, i) for s, i in items if s]
    strings = [s for s, _ in items]
    for (s, i), o, n in zip(items, old_enc(strings), new_enc(strings), strict=True):
        if any(x not in new_id for x in o):
            continue
        want = [new_id[x] for x in o]
        if n != want:
            who = f" (kept token {i})" if i is not None else ""
            raise RefusedError(
                f"prune refused: {path.name} would encode the kept text {s!r}{who} as {n[:12]}, not as the "
                f"old ids renumbered {want[:12]}: a piece it was made of is dropped",
                path,
                "keep the tokens that text is made of (add their ids to the keep-list), or prune with the "
                "tokenizer's own library",
            )
