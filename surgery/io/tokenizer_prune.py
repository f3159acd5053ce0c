"""The tokenizer files of a folder cut to a keep-list of token ids, renumbered in their old order
(``prune``): :func:`prune_tokenizer_edit`.

Edited, each as the libraries read it (proven by ``tests/oracles/test_prune.py`` with ``tokenizers``,
transformers' and PaddleFormers' ``AutoTokenizer`` and PaddleNLP 2.8.1's tokenizers: kept text encodes to the
remapped ids of the old encoding):

- ``tokenizer.json`` with a ``BPE`` model: the vocabulary renumbered, a merge kept only when both parts and
  their concatenation are kept (a merge whose result is dropped could never apply; one whose part is dropped
  neither), ``added_tokens`` and the post-processor's special ids renumbered. A byte-level BPE must keep the
  byte tokens it has (every byte of any text maps to one), a ``byte_fallback`` BPE its ``<0xNN>`` tokens;
- ``tokenizer.json`` with a ``WordPiece`` model, and ``vocab.txt`` (lines at the kept ids);
- ``tokenizer_config.json`` ``added_tokens_decoder``, ``added_tokens.json`` and the special-token lists.

Refused, naming the file: SentencePiece models, ``vocab.json`` + ``merges.txt``, a ``Unigram`` or
``WordLevel`` ``tokenizer.json``, tiktoken files: their pruning is not proven here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..model.errors import CheckpointError, Opt, RefusedError, TietoolError
from ..model.extras import install_extra
from ..model.tokens import TokenEdit
from .regular import JSON_LIMIT, read_bounded
from .tokenizer import sp_names

CONFIG, ADDED_JSON, SPECIAL_MAP = "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json"
EDITED_MODELS = ("BPE", "WordPiece")
"""The ``tokenizer.json`` model types whose pruning is proven."""

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
    text = read_bounded(path, JSON_LIMIT).decode("utf-8")
    try:
        return text, json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path.name} is not valid JSON ({e})", path, "save the tokenizer again") from e


def _dump(original: str, data: Any) -> bytes:
    """``data`` as JSON with the original file's indent (none when compact), a final newline if it had."""
    m = re.search(r"\n( +)\S", original)
    text = json.dumps(data, indent=len(m.group(1)) if m else None, ensure_ascii=False)
    return (text + ("\n" if original.endswith("\n") else "")).encode("utf-8")


def _refuse_formats(root: Path) -> None:
    """Refuse the tokenizer files whose pruning is not proven (the module docstring)."""
    bad = [n for n in sp_names(root) if (root / n).is_file()]
    bad += [n for n in ("vocab.json", "merges.txt") if (root / n).is_file()]
    bad += sorted(p.name for p in root.glob("*.tiktoken"))
    if bad:
        raise RefusedError(
            f"prune refused: {bad[0]} is a tokenizer format whose pruning tietool has not proven "
            "(it prunes tokenizer.json BPE / WordPiece and vocab.txt); nothing was written",
            root / bad[0],
            "prune a checkpoint whose tokenizer is a tokenizer.json (save it with a fast tokenizer's "
            "save_pretrained), or prune with the tokenizer's own library",
        )


def prune_tokenizer_edit(folder: Path, keep: Sequence[int]) -> TokenEdit | None:
    """The edit of every tokenizer file of ``folder`` that keeps only the tokens at ``keep`` (old ids,
    ascending; new id = position in ``keep``); None when the folder has no tokenizer vocabulary.

    Raises:
        RefusedError: an unproven format (:func:`_refuse_formats`), a byte / byte-fallback token or the
            unknown token dropped, a special token a file names dropped.
        CheckpointError: a file that is not valid JSON.
    """
    root = Path(folder)
    _refuse_formats(root)
    new_id = {old: new for new, old in enumerate(keep)}
    files: dict[str, bytes] = {}
    gone: set[str] = set()
    if (root / "tokenizer.json").is_file():
        text, tj = _load(root / "tokenizer.json")
        gone |= _prune_tokenizer_json(root / "tokenizer.json", tj, new_id)
        files["tokenizer.json"] = _dump(text, tj)
    if (root / "vocab.txt").is_file():
        lines = (root / "vocab.txt").read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        gone |= {t for i, t in enumerate(lines) if i not in new_id}
        files["vocab.txt"] = "".join(lines[i] + "\n" for i in keep if i < len(lines)).encode("utf-8")
    if not files:
        return None
    for name in (CONFIG, ADDED_JSON, SPECIAL_MAP):
        if (root / name).is_file():
            text, data = _load(root / name)
            gone |= _prune_config(root / name, data, new_id)
            files[name] = _dump(text, data)
    refuse_named_dropped(root, gone)
    before = max(keep) + 1 if keep else 0
    return TokenEdit(length_before=before, length_after=len(keep), files=files)


def alphabet_ids(folder: Path) -> list[int]:
    """The ids of ``tokenizer.json``'s byte tokens: the 256 byte symbols of a byte-level BPE, the
    ``<0xNN>`` tokens of a ``byte_fallback`` BPE (empty for other tokenizers)."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return []
    _, tj = _load(path)
    model = tj.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        return []
    byte_level = "ByteLevel" in json.dumps([tj.get("pre_tokenizer"), tj.get("decoder")])
    out = [i for t, i in vocab.items() if byte_level and t in BYTE_SYMBOLS]
    return out + [i for t, i in vocab.items() if model.get("byte_fallback") and _FALLBACK.match(t)]


def _prune_tokenizer_json(path: Path, tj: dict[str, Any], new_id: dict[int, int]) -> set[str]:
    """Prune ``tokenizer.json`` in place; returns the dropped token strings."""
    model = tj.get("model") or {}
    kind = model.get("type")
    if kind not in EDITED_MODELS:
        raise RefusedError(
            f"prune refused: tokenizer.json has a {kind} model, whose pruning tietool has not proven "
            f"(it prunes {' and '.join(EDITED_MODELS)})",
            path,
            "prune with the tokenizer's own library",
        )
    vocab: dict[str, int] = model["vocab"]
    gone = {t for t, i in vocab.items() if i not in new_id}
    _refuse_lost_alphabet(path, tj, model, gone)
    unk = model.get("unk_token")
    if unk is not None and unk in gone:
        raise RefusedError(f"prune refused: the unknown token {unk!r} is not kept", path, "keep its id")
    model["vocab"] = {t: new_id[i] for t, i in sorted(vocab.items(), key=lambda x: x[1]) if i in new_id}
    if kind == "BPE":
        _refuse_unreachable(path, model, vocab, new_id)
        model["merges"] = [m for m in model.get("merges") or [] if _merge_kept(m, model)]
    added = tj.get("added_tokens") or []
    gone |= {a["content"] for a in added if a["id"] not in new_id}
    tj["added_tokens"] = [dict(a, id=new_id[a["id"]]) for a in added if a["id"] in new_id]
    _prune_post_processor(path, tj.get("post_processor"), new_id)
    return gone


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


def _merge_parts(model: dict[str, Any], vocab: dict[str, int], keep: set[int]) -> dict[int, str]:
    """``{id: token}`` of the tokens outside ``keep`` that BPE merges into a kept token (the closure: the
    parts of such a part too)."""
    made: dict[int, list[tuple[str, str]]] = {}
    for m in model.get("merges") or []:
        a, b = _parts(m)
        r = vocab.get(_result(model, a, b))
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
    """The ids ``tokenizer.json`` (read by the ``tokenizers`` library) gives the lines of ``text``
    (``add_special_tokens=False``), with the tokens BPE merges into them (:func:`_merge_parts`), sorted.

    Raises:
        RefusedError: the folder has no ``tokenizer.json``.
        TietoolError: the ``tokenizers`` library is missing (the ``tokenizer`` extra).
    """
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise RefusedError(
            "prune refused: a keep-corpus is tokenized by tokenizer.json, which the folder does not have",
            Path(folder),
            "tokenize the corpus with the model's tokenizer and pass the ids as a keep-list",
        )
    import importlib

    try:
        tokenizers = importlib.import_module("tokenizers")
    except ImportError as e:
        raise TietoolError(
            "a keep-corpus is tokenized with the tokenizers library (the tokenizer extra)",
            None,
            install_extra("tokenizer"),
        ) from e
    tok = tokenizers.Tokenizer.from_file(str(path))
    ids = {
        i
        for line in text.splitlines()
        if line.strip()
        for i in tok.encode(line, add_special_tokens=False).ids
    }
    _, tj = _load(path)
    model = tj.get("model") or {}
    if model.get("type") == "BPE":
        ids |= set(_merge_parts(model, model["vocab"], ids))
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
        UsageError: a missing or unreadable file, an entry that is not a non-negative integer, no ids.
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
        UsageError: a missing, unreadable or non-UTF-8 file.
    """
    from ..model.errors import UsageError

    try:
        return read_bounded(Path(path), JSON_LIMIT).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the keep-corpus {path} ({e})", path, "pass a UTF-8 text file") from e
