"""The tokenizer files of a folder cut to a keep-list of token ids, renumbered in their old order
(``prune``): :func:`prune_tokenizer_edit`.

Edited, each as the libraries read it (proven per format and loader by the facts of
:data:`surgery.io.tokenizer_loaders.PRUNE_FACTS` and ``tests/oracles/test_prune.py``: kept text encodes to
the remapped ids of the old encoding):

- ``tokenizer.json`` with a ``BPE`` model, and ``vocab.json`` + ``merges.txt``: the vocabulary renumbered,
  a merge kept only when both parts and their concatenation are kept (a merge whose result is dropped could
  never apply; one whose part is dropped neither), ``added_tokens`` and the post-processor's special ids
  renumbered. A byte-level BPE must keep its 256 byte tokens (every byte of any text maps to one: refused,
  naming them, unless kept; ``--keep-special`` keeps them), a ``byte_fallback`` BPE its ``<0xNN>`` tokens;
  a kept token that BPE merges from a dropped one is refused (the ids to add named);
- ``tokenizer.json`` with a ``Unigram`` model: the kept ``[piece, score]`` entries, ``unk_id`` renumbered;
- ``tokenizer.json`` with a ``WordPiece`` model, and ``vocab.txt`` (lines at the kept ids);
- SentencePiece ``*.model`` files (BPE and Unigram): :mod:`surgery.io.tokenizer_prune_sp`;
- ``tokenizer_config.json`` ``added_tokens_decoder``, ``added_tokens.json`` and the special-token lists.

Every pruned ``tokenizer.json``, ``vocab.json`` and SentencePiece model is then checked by its library:
each kept token's text and each keep-corpus line must encode to the old ids renumbered wherever the old
encoding used kept tokens only (:func:`surgery.io.tokenizer_prune_sp.refuse_changed_encoding`).

Refused, naming the file: a ``WordLevel`` ``tokenizer.json``, tiktoken files, a WORD / CHAR SentencePiece
model, and any format no loader is proven for.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..model.errors import CheckpointError, Opt, RefusedError
from ..model.tokens import TokenEdit
from .json_indent import dumps_indented
from .regular import JSON_LIMIT, parse_shared, read_bounded
from .tokenizer import sp_names, tiktoken_files
from .tokenizer_loaders import PrunedFormat, prune_apart, prune_proven
from .tokenizer_prune_sp import (
    json_encoders,
    prune_sp_model,
    refuse_changed_encoding,
    sp_alphabet_ids,
    sp_encoders,
    sp_parts,
)

CONFIG, ADDED_JSON, SPECIAL_MAP = "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json"
JSON_FORMATS = {
    "BPE": PrunedFormat.BPE_JSON,
    "Unigram": PrunedFormat.UNIGRAM_JSON,
    "WordPiece": PrunedFormat.WORDPIECE_JSON,
}
"""The ``tokenizer.json`` model types ``prune`` edits, by their :class:`PrunedFormat`."""

NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table (the 256 symbols of a byte-level BPE's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


BYTE_SYMBOLS = frozenset(_bytes_to_unicode().values())
_FALLBACK = re.compile(r"^<0x[0-9A-F]{2}>$")


def _load(path: Path) -> tuple[str, Any]:
    """A JSON tokenizer file's text and value, which the caller must not modify (it may be the one the
    detection parsed, :func:`~surgery.io.regular.parse_shared`: copy first, :func:`_writable`); a file the
    strict parser refuses (a repeated key) is parsed as ``json.loads`` does."""
    blob = read_bounded(path, JSON_LIMIT)
    text = blob.decode("utf-8")
    try:
        return text, parse_shared(blob, path)
    except CheckpointError:
        pass
    try:
        return text, json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path.name} is not valid JSON ({e})", path, "save the tokenizer again") from e


def _writable(tj: Any) -> Any:
    """A parsed ``tokenizer.json`` that :func:`_prune_tokenizer_json` may edit, leaving ``tj`` (maybe
    shared) as it was: the containers it assigns into copied (the top level and ``model``, the small
    post-processor whole), the rest shared."""
    if not isinstance(tj, dict):
        return tj
    out = dict(tj)
    if isinstance(out.get("model"), dict):
        out["model"] = dict(out["model"])
    if "post_processor" in out:
        out["post_processor"] = copy.deepcopy(out["post_processor"])
    return out


def _dump(original: str, data: Any) -> bytes:
    """``data`` as JSON with the original file's indent (none when compact), a final newline if it had."""
    m = re.search(r"\n( +)\S", original)
    text = dumps_indented(data, len(m.group(1))) if m else json.dumps(data, ensure_ascii=False)
    return (text + ("\n" if original.endswith("\n") else "")).encode("utf-8")


def _refuse_formats(root: Path) -> None:
    """Refuse tiktoken files: their pruning is not proven."""
    bad = tiktoken_files(root)
    if bad:
        raise RefusedError(
            f"prune refused: {bad[0]} is a tiktoken rank file, whose pruning tietool has not proven; nothing "
            "was written",
            root / bad[0],
            "prune with the tokenizer's own library",
        )


def refuse_unproven(path: Path, fmt: PrunedFormat) -> None:
    """Refuse a pruned format no loader is proven for (:func:`surgery.io.tokenizer_loaders.prune_proven`).

    Raises:
        RefusedError: naming the file and the format.
    """
    if not prune_proven(fmt):
        raise RefusedError(
            f"prune refused: {path.name} is {fmt.value}, whose pruning no loader is proven to read",
            path,
            "prune with the tokenizer's own library",
        )


def refuse_converted_sp(root: Path, name: str) -> None:
    """Refuse a SentencePiece model that transformers and PaddleFormers load by a conversion splitting text
    otherwise than sentencepiece (:func:`surgery.io.tokenizer_loaders.prune_apart`: a Unigram model read
    as BPE by ``LlamaTokenizer``), when they would load it: ``tokenizer_config.json`` beside it, no
    ``tokenizer.json``. Kept text would encode to ``<unk>`` pieces under them (the keep-list and the check
    follow sentencepiece's split).

    Raises:
        RefusedError: naming the model file, the loaders and the fix.
    """
    from .tokenizer_prune_sp import read_model, sp_format

    if (root / "tokenizer.json").is_file() or not (root / CONFIG).is_file():
        return
    path = root / name
    apart = prune_apart(sp_format(path, read_model(path)))
    if apart:
        who = " and ".join(str(x) for x in apart)
        raise RefusedError(
            f"prune refused: {who} read {name} through their own conversion, which splits text otherwise "
            "than sentencepiece (tietool's keep-list and check): kept text would encode to <unk> pieces "
            "under them; nothing was written",
            path,
            "prune with the tokenizer's own library, or drop tokenizer_config.json if only sentencepiece "
            "reads the model",
        )


def prune_tokenizer_edit(folder: Path, keep: Sequence[int], texts: Sequence[str] = ()) -> TokenEdit | None:
    """The edit of every tokenizer file of ``folder`` that keeps only the tokens at ``keep`` (old ids,
    ascending; new id = position in ``keep``); None when the folder has no tokenizer vocabulary. ``texts``
    (a keep-corpus's lines) must encode as before, renumbered, as every kept token's own text must.

    Raises:
        RefusedError: an unproven format (:func:`refuse_unproven`), a byte / byte-fallback token, a control
            piece or the unknown token dropped, a special token a file names dropped, kept text that would
            encode otherwise (:func:`surgery.io.tokenizer_prune_sp.refuse_changed_encoding`).
        CheckpointError: a file that is not valid JSON or not a SentencePiece model.
        TietoolError: ``tokenizers`` / ``sentencepiece`` missing (the ``tokenizer`` extra).
    """
    root = Path(folder)
    _refuse_formats(root)
    new_id = {old: new for new, old in enumerate(keep)}
    files: dict[str, bytes] = {}
    gone: set[str] = set()
    if (root / "tokenizer.json").is_file():
        text, shared = _load(root / "tokenizer.json")
        tj = _writable(shared)
        gone |= _prune_tokenizer_json(root / "tokenizer.json", tj, new_id)
        files["tokenizer.json"] = _dump(text, tj)
        pruned = files["tokenizer.json"].decode("utf-8")
        refuse_changed_encoding(root / "tokenizer.json", json_encoders(text, pruned), keep, texts)
    if (root / "vocab.txt").is_file():
        refuse_unproven(root / "vocab.txt", PrunedFormat.WORDPIECE_TXT)
        lines = (root / "vocab.txt").read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        gone |= {t for i, t in enumerate(lines) if i not in new_id}
        files["vocab.txt"] = "".join(lines[i] + "\n" for i in keep if i < len(lines)).encode("utf-8")
    if (root / "vocab.json").is_file() and (root / "merges.txt").is_file():
        gone |= _prune_vocab_json(root, new_id, files, texts)
    for name in sp_names(root):
        if (root / name).is_file():
            refuse_converted_sp(root, name)
            files[name], dropped = prune_sp_model(root / name, new_id)
            gone |= dropped
            old = (root / name).read_bytes()
            refuse_changed_encoding(root / name, sp_encoders(old, files[name]), keep, texts)
    if not files:
        return None
    for name in (CONFIG, ADDED_JSON, SPECIAL_MAP):
        if (root / name).is_file():
            text, shared = _load(root / name)
            data = copy.deepcopy(shared)  # small files, edited in place
            gone |= _prune_config(root / name, data, new_id)
            files[name] = _dump(text, data)
    refuse_named_dropped(root, gone)
    before = max(keep) + 1 if keep else 0
    return TokenEdit(length_before=before, length_after=len(keep), files=files)


def alphabet_ids(folder: Path) -> list[int]:
    """The ids of the tokens ``--keep-special`` keeps for the tokenizer's alphabet: the 256 byte symbols
    of a byte-level BPE (``tokenizer.json`` or ``vocab.json``), the ``<0xNN>`` tokens of a ``byte_fallback``
    model, the unknown, control and byte-fallback pieces of a SentencePiece model."""
    root = Path(folder)
    out: list[int] = []
    for name in sp_names(root):
        if (root / name).is_file():
            out += sp_alphabet_ids(root / name)
    if (root / "vocab.json").is_file():
        _, vocab = _load(root / "vocab.json")
        if isinstance(vocab, dict):
            out += [i for t, i in vocab.items() if t in BYTE_SYMBOLS and isinstance(i, int)]
    path = root / "tokenizer.json"
    if not path.is_file():
        return out
    _, tj = _load(path)
    model = tj.get("model") or {}
    vocab = model.get("vocab")
    fallback = bool(model.get("byte_fallback"))
    if isinstance(vocab, list):  # Unigram: [piece, score] at its id
        unk = model.get("unk_id")
        out += [i for i, e in enumerate(vocab) if (fallback and _FALLBACK.match(e[0])) or i == unk]
        return out
    if not isinstance(vocab, dict):
        return out
    byte_level = "ByteLevel" in json.dumps([tj.get("pre_tokenizer"), tj.get("decoder")])
    out += [i for t, i in vocab.items() if byte_level and t in BYTE_SYMBOLS]
    return out + [i for t, i in vocab.items() if fallback and _FALLBACK.match(t)]


def named_ids(folder: Path, rows: int) -> list[int]:
    """The ids of the tokens ``tokenizer_config.json`` / ``special_tokens_map.json`` name by string as the
    bos/eos/unk/sep/pad/cls/mask token (:data:`NAMED`), looked up in the tokenizer's vocabulary files
    (:func:`~surgery.io.tokenizer.token_strings`, ids ``0..rows-1``): PaddleNLP's tokenizer configs name
    base tokens (``"unk_token": "[UNK]"``) with no ``added_tokens_decoder`` to give their ids. A name no
    file gives an id is left out (a SentencePiece model's pieces are :func:`alphabet_ids`')."""
    from .tokenizer import token_strings

    root = Path(folder)
    names: set[str] = set()
    for name in (CONFIG, SPECIAL_MAP):
        if (root / name).is_file():
            _, data = _load(root / name)
            if isinstance(data, dict):
                names |= {t for t in (_content(data.get(k)) for k in NAMED) if isinstance(t, str)}
    if not names:
        return []
    by_id = token_strings(root, range(rows))
    return sorted(i for i, t in by_id.items() if t in names)


def _prune_tokenizer_json(path: Path, tj: dict[str, Any], new_id: dict[int, int]) -> set[str]:
    """Prune ``tokenizer.json`` in place; returns the dropped token strings."""
    model = tj.get("model") or {}
    kind = model.get("type")
    if kind not in JSON_FORMATS:
        raise RefusedError(
            f"prune refused: tokenizer.json has a {kind} model, whose pruning tietool has not proven "
            f"(it prunes {', '.join(JSON_FORMATS)})",
            path,
            "prune with the tokenizer's own library",
        )
    refuse_unproven(path, JSON_FORMATS[kind])
    if kind == "Unigram":
        gone = _prune_unigram(path, model, new_id)
    else:
        vocab: dict[str, int] = model["vocab"]
        gone = {t for t, i in vocab.items() if i not in new_id}
        _refuse_lost_alphabet(path, tj, model, gone)
        unk = model.get("unk_token")
        if unk is not None and unk in gone:
            raise RefusedError(f"prune refused: the unknown token {unk!r} is not kept", path, "keep its id")
        model["vocab"] = {t: new_id[i] for t, i in sorted(vocab.items(), key=lambda x: x[1]) if i in new_id}
        if kind == "BPE":
            model["merges"] = _merges_kept(path, model, vocab, new_id)
    added = tj.get("added_tokens") or []
    gone |= {a["content"] for a in added if a["id"] not in new_id}
    tj["added_tokens"] = [dict(a, id=new_id[a["id"]]) for a in added if a["id"] in new_id]
    _prune_post_processor(path, tj.get("post_processor"), new_id)
    return gone


def _prune_unigram(path: Path, model: dict[str, Any], new_id: dict[int, int]) -> set[str]:
    """A Unigram model's ``vocab`` (``[piece, score]`` at each id) cut to the kept ids, scores kept,
    ``unk_id`` renumbered; the unknown piece and a ``byte_fallback`` model's ``<0xNN>`` pieces must stay.
    Returns the dropped pieces."""
    vocab: list[Any] = model["vocab"]
    unk = model.get("unk_id")
    lost = [
        (i, e[0])
        for i, e in enumerate(vocab)
        if i not in new_id and (i == unk or (model.get("byte_fallback") and _FALLBACK.match(e[0])))
    ]
    if lost:
        shown = ", ".join(f"{i} {t!r}" for i, t in lost[:8])
        raise RefusedError(
            f"prune refused: {len(lost)} piece(s) of the Unigram model that must stay (the unknown piece, "
            f"byte-fallback pieces) would be dropped ({shown})",
            path,
            f"pass {Opt('keep_special', True)} (keeps them), or add their ids to the keep-list",
        )
    gone = {e[0] for i, e in enumerate(vocab) if i not in new_id}
    model["vocab"] = [vocab[i] for i in sorted(new_id) if i < len(vocab)]
    if unk is not None:
        model["unk_id"] = new_id[unk]
    return gone


def _prune_vocab_json(
    root: Path, new_id: dict[int, int], files: dict[str, bytes], texts: Sequence[str]
) -> set[str]:
    """``vocab.json`` + ``merges.txt`` (a GPT-2 byte-level BPE) pruned into ``files`` as a ``tokenizer.json``
    BPE is: the byte tokens kept, a merge kept only with its parts and result, kept text checked by
    ``tokenizers`` with the pair. Returns the dropped tokens."""
    refuse_unproven(root / "vocab.json", PrunedFormat.GPT2_BPE)
    text, vocab, head, merges, merges_text = _read_gpt2(root)
    gone = {t for t, i in vocab.items() if i not in new_id}
    lost = sorted(t for t in gone if t in BYTE_SYMBOLS)
    if lost:
        shown = ", ".join(f"{vocab[t]} {t!r}" for t in lost[:8])
        raise RefusedError(
            f"prune refused: {len(lost)} byte token(s) of vocab.json would be dropped ({shown}): every byte "
            "of any text maps to one, so text that contains it would encode differently",
            root / "vocab.json",
            f"pass {Opt('keep_special', True)} (keeps every byte token), or add their ids to the keep-list",
        )
    model = {"vocab": vocab, "merges": merges}
    _refuse_unreachable(root / "vocab.json", model, vocab, new_id)
    pruned = {t: new_id[i] for t, i in sorted(vocab.items(), key=lambda x: x[1]) if i in new_id}
    kept = [m for m in merges if _merge_kept(m, {"vocab": pruned})]
    files["vocab.json"] = _dump(text, pruned)
    end = "\n" if merges_text.endswith("\n") else ""
    files["merges.txt"] = ("\n".join(head + kept) + end).encode("utf-8")
    encoders = _bpe_encoders(root, (vocab, merges), (pruned, kept))
    refuse_changed_encoding(root / "vocab.json", encoders, sorted(new_id), texts)
    return gone


def _bpe_encoders(root: Path, old: tuple[dict, list[str]], new: tuple[dict, list[str]]) -> Any:
    """:func:`~surgery.io.tokenizer_prune_sp.json_encoders` of two GPT-2 ``vocab.json`` + ``merges.txt``
    pairs (:func:`_gpt2_json`)."""
    return json_encoders(_gpt2_json(root, *old), _gpt2_json(root, *new))


def _gpt2_json(root: Path, vocab: dict, merges: list[str]) -> str:
    """A ``tokenizer.json`` text of ``tokenizers``' byte-level BPE of a GPT-2 vocabulary and merges
    (``add_prefix_space`` as ``tokenizer_config.json`` says), as transformers' ``GPT2Tokenizer`` splits."""
    from .tokenizer_folder import import_lib

    tk = import_lib("tokenizers")
    cfg = _load(root / CONFIG)[1] if (root / CONFIG).is_file() else {}
    prefix = bool(cfg.get("add_prefix_space", False)) if isinstance(cfg, dict) else False
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    t = tk.Tokenizer(tk.models.BPE(dict(vocab), pairs))
    t.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    t.decoder = tk.decoders.ByteLevel()
    return str(t.to_str())


def _read_gpt2(root: Path) -> tuple[str, dict, list[str], list[str], str]:
    """``vocab.json``'s text and dict, ``merges.txt``'s header lines, merges and text."""
    text, vocab = _load(root / "vocab.json")
    merges_text = read_bounded(root / "merges.txt", JSON_LIMIT).decode("utf-8")
    lines = merges_text.split("\n")
    head = [ln for ln in lines if ln.startswith("#")]
    return text, vocab, head, [ln for ln in lines if ln and not ln.startswith("#")], merges_text


def _parts(merge: Any) -> tuple[str, str]:
    a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
    return a, b


def _result(model: dict[str, Any], a: str, b: str) -> str:
    """The token a merge of ``a`` and ``b`` makes (``b``'s continuing-subword prefix dropped)."""
    p = model.get("continuing_subword_prefix") or ""
    return a + (b[len(p) :] if p and b.startswith(p) else b)


def _merge_kept(merge: Any, model: dict[str, Any]) -> bool:
    """Whether a merge (``"a b"`` or ``["a", "b"]``) keeps both parts and its result in ``model``'s
    (pruned) vocabulary."""
    a, b = _parts(merge)
    vocab = model["vocab"]
    return a in vocab and b in vocab and _result(model, a, b) in vocab


def _merges_kept(
    path: Path, model: dict[str, Any], vocab: dict[str, int], new_id: dict[int, int]
) -> list[Any]:
    """The merges of a BPE ``model`` whose parts and result are kept (``vocab`` the old one, ``new_id`` the
    kept ids), in order (:func:`_merge_kept` of each), in one pass over the merges that also sees a kept
    token made from a dropped part, then refused by :func:`_refuse_unreachable` (naming them all)."""
    p = model.get("continuing_subword_prefix") or ""
    out, broken = [], False
    for m in model.get("merges") or []:  # 280,000 merges for Llama-3: _parts and _result inlined
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if vocab.get(a + (b[len(p) :] if p and b.startswith(p) else b)) not in new_id:
            continue  # a dropped (or unknown) result: the merge goes, its parts need not stay
        i, j = vocab.get(a), vocab.get(b)
        if i in new_id and j in new_id:
            out.append(m)
        elif (i is not None and i not in new_id) or (j is not None and j not in new_id):
            broken = True
    if broken:
        _refuse_unreachable(path, model, vocab, new_id)
    return out


def _merge_parts(model: dict[str, Any], vocab: dict[str, int], keep: set[int]) -> dict[int, str]:
    """``{id: token}`` of the tokens outside ``keep`` that BPE merges into a kept token (the closure: the
    parts of such a part too)."""
    made: dict[int, list[tuple[str, str]]] = {}
    p = model.get("continuing_subword_prefix") or ""
    for m in model.get("merges") or []:  # _parts and _result inlined: 280,000 merges for Llama-3
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        r = vocab.get(a + (b[len(p) :] if p and b.startswith(p) else b))
        if r is not None:
            made.setdefault(r, []).append((a, b))
    missing: dict[int, str] = {}
    todo = [i for i in keep if i in made]
    while todo:
        for a, b in made.get(todo.pop(), []):
            for t in (a, b):
                i = vocab.get(t)
                if i is not None and i not in keep and i not in missing:
                    missing[i] = t
                    todo.append(i)
    return missing


def corpus_ids(folder: Path, text: str) -> list[int]:
    """The ids the folder's tokenizer gives the lines of ``text`` (``add_special_tokens=False``):
    ``tokenizer.json`` read by ``tokenizers``, SentencePiece models by ``sentencepiece``; with the tokens
    BPE merges into them (:func:`_merge_parts`, :func:`surgery.io.tokenizer_prune_sp.sp_parts`), sorted.

    Raises:
        RefusedError: the folder has neither ``tokenizer.json`` nor a SentencePiece model, or has a
            tiktoken rank file (:func:`surgery.io.tokenizer.tiktoken_files`).
        TietoolError: ``tokenizers`` / ``sentencepiece`` missing (the ``tokenizer`` extra).
    """
    from .tokenizer_folder import import_lib
    from .tokenizer_prune_sp import read_model, sp_format

    root = Path(folder)
    _refuse_formats(root)
    path = root / "tokenizer.json"
    sps = [root / n for n in sp_names(root) if (root / n).is_file()]
    gpt2 = (root / "vocab.json").is_file() and (root / "merges.txt").is_file()
    if not path.is_file() and not sps and not gpt2:
        raise RefusedError(
            "prune refused: a keep-corpus is tokenized by tokenizer.json, vocab.json + merges.txt or a "
            "SentencePiece model, which the folder does not have",
            root,
            "tokenize the corpus with the model's tokenizer and pass the ids as a keep-list",
        )
    lines = [ln for ln in text.splitlines() if ln.strip()]
    ids: set[int] = set()
    closures = []
    jsons = [(path.read_text(encoding="utf-8"), _load(path)[1].get("model") or {})] if path.is_file() else []
    if gpt2:
        _, vocab, _, merges, _ = _read_gpt2(root)
        jsons.append((_gpt2_json(root, vocab, merges), {"type": "BPE", "vocab": vocab, "merges": merges}))
    for tj_text, model in jsons:
        tok = import_lib("tokenizers").Tokenizer.from_str(tj_text)
        ids |= {i for e in tok.encode_batch(lines, add_special_tokens=False) for i in e.ids}
        if model.get("type") == "BPE":
            closures.append(lambda keep, m=model: set(_merge_parts(m, m["vocab"], keep)))
    for p in sps:
        m = read_model(p)
        sp = import_lib("sentencepiece").SentencePieceProcessor(model_proto=p.read_bytes())
        ids |= {i for e in sp.encode(lines) for i in e}
        if sp_format(p, m) is PrunedFormat.SP_BPE:
            pieces = [x.piece for x in m.pieces]
            closures.append(lambda keep, ps=pieces: set(sp_parts(ps, keep)))
    grown = True
    while grown:
        more = set().union(*(c(ids) for c in closures)) - ids if closures else set()
        grown = bool(more)
        ids |= more
    return sorted(ids)


def _refuse_unreachable(
    path: Path, model: dict[str, Any], vocab: dict[str, int], new_id: dict[int, int]
) -> None:
    """Refuse a kept token that a merge makes from a dropped part: BPE would no longer reach it, so kept
    text could encode differently. When every merge whose result is kept keeps both parts, every merge the
    old encoding of kept text applied is kept, and BPE (the lowest-ranked merge available first) applies
    the same ones in the same order (tests/oracles/test_prune.py)."""
    missing = _merge_parts(model, vocab, set(new_id))
    if missing:
        shown = ", ".join(f"{i} {t!r}" for i, t in sorted(missing.items())[:8])
        raise RefusedError(
            f"prune refused: kept tokens are merged from {len(missing)} token(s) the keep-list drops "
            f"({shown}): BPE could no longer reach them, and kept text would encode differently",
            path,
            f"add these ids to the keep-list: {_listed(sorted(missing))}",
        )


def _listed(ids: list[int], limit: int = 64) -> str:
    more = f", … ({len(ids)} in all)" if len(ids) > limit else ""
    return ",".join(map(str, ids[:limit])) + more


def _refuse_lost_alphabet(path: Path, tj: dict[str, Any], model: dict[str, Any], gone: set[str]) -> None:
    """Refuse dropping a byte-level BPE's byte token or a ``byte_fallback`` BPE's ``<0xNN>`` token: text
    with that byte would no longer encode as before."""
    byte_level = "ByteLevel" in json.dumps([tj.get("pre_tokenizer"), tj.get("decoder")])
    lost = sorted(t for t in gone if byte_level and t in BYTE_SYMBOLS)
    if model.get("byte_fallback"):
        lost += sorted(t for t in gone if _FALLBACK.match(t))
    if lost:
        vocab = model["vocab"]
        shown = ", ".join(f"{vocab[t]} {t!r}" for t in lost[:8])
        raise RefusedError(
            f"prune refused: {len(lost)} byte token(s) of the tokenizer would be dropped ({shown}): every "
            "byte of any text maps to one, so text that contains it would encode differently",
            path,
            f"pass {Opt('keep_special', True)} (keeps every byte token), or add their ids to the keep-list",
        )


def _prune_post_processor(path: Path, pp: Any, new_id: dict[int, int]) -> None:
    """Renumber the ids of a post-processor's special tokens (TemplateProcessing ``special_tokens``,
    BertProcessing / RobertaProcessing ``sep`` / ``cls``, nested in a Sequence); refuse one not kept."""
    if not isinstance(pp, dict):
        return
    for sub in pp.get("processors") or []:
        _prune_post_processor(path, sub, new_id)
    for key in ("sep", "cls"):
        if isinstance(pp.get(key), list) and len(pp[key]) == 2:
            pp[key] = [pp[key][0], _kept(path, pp[key][1], pp[key][0], new_id)]
    for name, spec in (pp.get("special_tokens") or {}).items():
        spec["ids"] = [_kept(path, i, name, new_id) for i in spec.get("ids") or []]


def _kept(path: Path, old: int, what: str, new_id: dict[int, int]) -> int:
    if old not in new_id:
        raise RefusedError(
            f"prune refused: {path.name} inserts the special token {what!r} (id {old}), which is not kept",
            path,
            f"keep id {old} (or pass {Opt('keep_special', True)})",
        )
    return new_id[old]


def _prune_config(path: Path, data: Any, new_id: dict[int, int]) -> set[str]:
    """Prune ``tokenizer_config.json`` (``added_tokens_decoder``), ``added_tokens.json`` or
    ``special_tokens_map.json`` in place; returns the dropped strings. The named special tokens
    (``eos_token``...) must be kept."""
    if not isinstance(data, dict):
        return set()
    gone: set[str] = set()
    if path.name == ADDED_JSON:
        gone = {t for t, i in data.items() if i not in new_id}
        kept = {t: new_id[i] for t, i in data.items() if i in new_id}
        data.clear()
        data.update(kept)
        return gone
    dec = data.get("added_tokens_decoder")
    if isinstance(dec, dict):
        gone = {v.get("content") for k, v in dec.items() if int(k) not in new_id}
        data["added_tokens_decoder"] = {str(new_id[int(k)]): v for k, v in dec.items() if int(k) in new_id}
    for key in ("additional_special_tokens", "extra_special_tokens"):
        if isinstance(data.get(key), list):
            data[key] = [t for t in data[key] if _content(t) not in gone]
    return gone


def _content(t: Any) -> Any:
    return t.get("content") if isinstance(t, dict) else t


def refuse_named_dropped(folder: Path, dropped: set[str]) -> None:
    """Refuse dropping a token that ``tokenizer_config.json`` / ``special_tokens_map.json`` name as the
    bos/eos/unk/sep/pad/cls/mask token (a loader would add it back at a new id).

    Raises:
        RefusedError: naming the file, the key and the token.
    """
    for name in (CONFIG, SPECIAL_MAP):
        if not (Path(folder) / name).is_file():
            continue
        _, data = _load(Path(folder) / name)
        for key in NAMED:
            tok = _content(data.get(key)) if isinstance(data, dict) else None
            if isinstance(tok, str) and tok in dropped:
                raise RefusedError(
                    f"prune refused: {name} {key} = {tok!r} is not kept",
                    Path(folder) / name,
                    f"keep its id (or pass {Opt('keep_special', True)})",
                )


def read_keep_file(path: Path) -> list[int]:
    """The token ids of a keep-file: a JSON list of integers, or one integer a line (blank lines and ``#``
    comments skipped).

    Raises:
        CheckpointError: a missing file (exit 3, as any missing input;
            :func:`surgery.io.regular.read_bounded`).
        UsageError: an unreadable file, an entry that is not a non-negative integer, no ids.
    """
    from ..model.errors import UsageError

    path = Path(path)
    try:
        text = read_bounded(path, JSON_LIMIT).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the keep-file {path} ({e})", path, "pass a file of token ids") from e
    if text.lstrip().startswith("["):
        try:
            items: list[Any] = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"the keep-file {path} is not a JSON list ({e})", path, "e.g. [0, 1, 2]") from e
    else:
        items = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
        items = [int(x) if x.isdigit() else x for x in items if x]
    bad = [x for x in items if isinstance(x, bool) or not isinstance(x, int) or x < 0]
    if bad:
        raise UsageError(
            f"the keep-file {path} holds {bad[0]!r}, not a token id", path, "one non-negative integer a line"
        )
    if not items:
        raise UsageError(f"the keep-file {path} lists no token ids: nothing would remain", path, "list ids")
    return items


def read_keep_corpus(path: Path) -> str:
    """The text of a keep-corpus file (UTF-8).

    Raises:
        UsageError: a missing, unreadable or non-UTF-8 file; one with no text (blank lines only).
    """
    from ..model.errors import UsageError

    try:
        text = read_bounded(Path(path), JSON_LIMIT).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the keep-corpus {path} ({e})", path, "pass a UTF-8 text file") from e
    if not text.strip():
        raise UsageError(
            f"the keep-corpus {path} has no text: nothing would be kept",
            path,
            "pass the text to keep, a line each",
        )
    return text
