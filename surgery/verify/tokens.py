"""``verify``'s reading of the tokenizers: every token of the input keeps its id unless the output's report
chain removed it, the output's new tokens are the ones the chain added, tokenizer files differ only in the
tokens they list."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..inspect.detection import Detection
from ..io.checkpoint import REPORT_NAME, Checkpoint
from ..io.regular import load_json
from ..io.tokenizer import vocabulary
from ..model.errors import CheckpointError
from ..model.tokens import TokenizerSet
from ..plan.add_tokens import not_resettable
from ..report import chain_since, token_claims
from .files import same_bytes
from .result import VerifyResult
from .vocab import rename_claims, special_claims

# ------------------------------------------------------------------ tokenizer files

# keys of a tokenizer file that list tokens (add-tokens and a resize trim change them); every other key
# must keep its value
_TOKEN_KEYS = {
    "tokenizer.json": ("added_tokens",),
    "tokenizer_config.json": ("added_tokens_decoder", "additional_special_tokens", "extra_special_tokens"),
    "special_tokens_map.json": ("additional_special_tokens",),
}
_TRIM_KEYS = {"tokenizer.json": ("model.vocab", "model.merges")}  # a trim below the base vocabulary
_ADDED_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_LINES = 20  # tokens named one line each; the rest counted


def _reset_tokens(path: Path) -> dict[int, str]:
    """``{id: content}`` of the existing tokens whose all-zero rows the output's own ``add-tokens`` run reset
    (``add_tokens.tokens`` entries with ``"rows_reset": true``); ``{}`` without a readable report."""
    try:
        rep = load_json(path / REPORT_NAME, REPORT_NAME) if (path / REPORT_NAME).is_file() else None
    except (CheckpointError, OSError):
        rep = None
    sec = rep.get("add_tokens") if isinstance(rep, dict) else None
    tokens = sec.get("tokens") if isinstance(sec, dict) else None
    return {
        t["id"]: t["content"]
        for t in (tokens if isinstance(tokens, list) else [])
        if isinstance(t, dict)
        and t.get("rows_reset") is True
        and isinstance(t.get("id"), int)
        and isinstance(t.get("content"), str)
    }


@dataclass(frozen=True)
class Tokenizers:
    """What verify reads of both folders' tokenizers: the file sets, the vocabularies (``{id: token}``),
    the tokens the output's report chain says were added (``{id: content}``), the input's tokens it says
    were removed that the files bear out (``{id: content}``: absent from the output, an added token of the
    input, removed by a trim of the chain's rows), and the ones they contradict (``{id: why}``); the
    existing tokens whose all-zero rows the output's add-tokens run says it reset that the input bears out
    (``reset``, ``{id: content}``), and the ones it contradicts (``reset_doubted``, ``{id: line}``)."""

    sets: tuple[TokenizerSet, TokenizerSet]
    vocab: tuple[dict[int, str], dict[int, str]]
    added: dict[int, str]
    removed: dict[int, str]
    doubted: dict[int, str] = field(default_factory=dict)
    reset: dict[int, str] = field(default_factory=dict)
    reset_doubted: dict[int, str] = field(default_factory=dict)
    renamed: dict[int, tuple[str, str]] = field(default_factory=dict)  # rename-tokens: id → (old, new)

    @classmethod
    def read(cls, da: Detection, db: Detection) -> Tokenizers:
        """From the detections' tokenizer sets (:func:`surgery.io.tokenizer.tokenizer_set`, read once) and
        the output's report chain (:func:`surgery.report.token_claims`), checked against the files."""
        A, B = da.ckpt, db.ckpt
        claims = token_claims(B.path, A.path)
        sets = (da.tokenizer.files, db.tokenizer.files)
        va, vb = vocabulary(A.path), vocabulary(B.path)
        own = {(t.id, t.content) for t in sets[0].added}
        removed: dict[int, str] = {}
        doubted: dict[int, str] = {}
        for i, r in claims.removed.items():
            if va.get(i) != r.content or i in vb:
                continue  # explains nothing: the input lacks it, or the output still has the id
            base = "" if (i, r.content) in own else _BASE_KEPT
            why = r.doubt or _rows_doubt(claims.rows, db.vocab_rows) or base
            if why:
                doubted[i] = f"{r.source} says it was removed, which the files contradict: {why}"
            else:
                removed[i] = r.content
        reset, reset_doubted = _checked_resets(da, _reset_tokens(B.path), va, vb, claims.added)
        return cls(sets, (va, vb), claims.added, removed, doubted, reset, reset_doubted)

    def new_rows(self) -> frozenset[int]:
        """Ids the report added that the input's tokenizer does not have and the output's has with that
        content, and ids of existing tokens whose all-zero rows add-tokens reset (``rows_reset``, the same
        content in both): the rows add-tokens may set."""
        va, vb = self.vocab
        new = {i for i, c in self.added.items() if i not in va and vb.get(i) == c}
        return frozenset(new | set(self.reset))


def _checked_resets(
    da: Detection, claimed: dict[int, str], va: dict[int, str], vb: dict[int, str], added: dict[int, str]
) -> tuple[dict[int, str], dict[int, str]]:
    """The ``rows_reset`` claims (``{id: content}``) split into those the files bear out and ``{id: line}``
    of those they contradict. A claim holds when the token has that id in both folders and add-tokens' own
    rule (:func:`surgery.plan.add_tokens.not_resettable`) resets its rows in the input: all zero in the
    embedding and in a head stored apart. A claim for an id the chain added (new in the output) or beyond
    the input's rows explains nothing the files do not already: it is left out, not doubted."""
    rows = da.vocab_rows
    asked = {i: c for i, c in claimed.items() if not (i in added and i not in va) and 0 <= i < rows}
    why = {i: f"the input's id {i} is {va.get(i)!r}" for i, c in asked.items() if va.get(i) != c}
    why |= {i: f"the output's id {i} is {vb.get(i)!r}" for i, c in asked.items() if vb.get(i) != c}
    rest = sorted(set(asked) - set(why))
    if rest and da.embedding.name not in da.ckpt.tensors:
        why |= dict.fromkeys(rest, "the input has no embedding tensor to read the rows in")
    elif rest:
        why |= not_resettable(da, rest)
    doubted = {
        i: f"token {asked[i]!r} (id {i}): tietool-report.json says add-tokens reset its all-zero rows "
        f"(rows_reset), which the files contradict: {w}; tietool-report.json is unverifiable"
        for i, w in sorted(why.items())
    }
    return {i: c for i, c in asked.items() if i not in why}, doubted


_BASE_KEPT = "it is in the input's base vocabulary, which tietool never removes (only added tokens)"


def _rows_doubt(claimed: object, rows: int) -> str:
    """Why a report chain that ends with ``claimed`` rows cannot describe an output of ``rows`` ("" when
    it can)."""
    if claimed == rows:
        return ""
    return f"the report's runs end with {claimed!r} rows, the output's embedding has {rows}"


def tokenizer_names(A: Checkpoint, B: Checkpoint, sets: tuple[TokenizerSet, TokenizerSet]) -> set[str]:
    """The files compared token by token instead of byte by byte: every file of either tokenizer set, and
    the added-token files present in either folder."""
    names = {f.name for s in sets for f in s.files}
    return names | {n for n in _ADDED_FILES if n in A.other_files or n in B.other_files}


def _token_changes(
    va: dict[int, str],
    vb: dict[int, str],
    added: dict[int, str],
    removed: dict[int, str],
    doubted: dict[int, str] | None = None,
) -> list[str]:
    """Every token of the input keeps its id in the output unless the report removed it; every id only the
    output has is a token the report added, with that content. One line per broken token (a few named); a
    token the report says was removed against the files (``doubted``, ``{id: why}``) names why and calls
    the report unverifiable."""
    where_b = {s: i for i, s in vb.items()}
    out: list[str] = []
    for i, s in va.items():
        t = vb.get(i)
        if t == s:
            continue
        if t is None and removed.get(i) == s:
            continue
        j = where_b.get(s)
        now = f"is id {j} in the output" if j is not None else "is not in the output's tokenizer"
        got = f" (id {i} is {t!r} there)" if t is not None else ""
        why = (doubted or {}).get(i)
        tail = f": {why}; tietool-report.json is unverifiable" if why else ""
        out.append(
            f"token {s!r} (id {i}) {now}{got}"
            + ("" if i not in removed else ", not as reported removed")
            + tail
        )
    for i in sorted(set(vb) - set(va)):
        if added.get(i) != vb[i]:
            why = (
                f"the report adds {added[i]!r} at id {i}"
                if i in added
                else "tietool-report.json does not list it"
            )
            out.append(f"token {vb[i]!r} (id {i}) is only in the output: {why}")
    if len(out) > _LINES:
        out[_LINES:] = [f"and {len(out) - _LINES} more token(s) changed"]
    return out


def _json_rest(path: Path, drop: tuple[str, ...]) -> object:
    """A JSON tokenizer file without the (dotted) keys ``drop``; None when it cannot be read."""
    try:
        data = load_json(path, path.name)
    except (CheckpointError, OSError):
        return None
    if isinstance(data, dict):
        data = dict(data)
        for k in drop:
            head, _, tail = k.partition(".")
            if tail and isinstance(data.get(head), dict):
                data[head] = {x: v for x, v in data[head].items() if x != tail}
            elif not tail:
                data.pop(k, None)
    return data


def _without_empty_lists(path: Path, keys: tuple[str, ...]) -> object:
    """A JSON tokenizer file with the token-listing ``keys`` whose value is empty (``{}``, ``[]``) left
    out: an empty list of added tokens lists what an absent one does, none (tokenizers read either as no
    added token: HF ``PreTrainedTokenizerBase.from_pretrained``, PaddleNLP 2.8.1's ``added_tokens.json``);
    None when the file cannot be read."""
    try:
        data = load_json(path, path.name)
    except (CheckpointError, OSError):
        return None
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if not (k in keys and v in ({}, []))}
    return data


def _emptied_trace(pa: Path, pb: Path, rel: str) -> bool:
    """The output's tokenizer file ``rel`` differs from the input's only by the empty token lists an
    ``add-tokens`` run leaves when a later trim removed every token it added: an ``added_tokens.json`` of
    ``{}`` the input lacks, an ``added_tokens_decoder`` (``additional_special_tokens``) of ``{}`` (``[]``)
    the input has not."""
    if rel == "added_tokens.json" and not pa.exists():
        return _without_empty_lists(pb, ()) == {}
    keys = _TOKEN_KEYS.get(rel, ())
    if not keys or not pa.exists():
        return False
    a = _without_empty_lists(pa, keys)
    return a is not None and a == _without_empty_lists(pb, keys)


def _file_changes(
    A: Checkpoint,
    B: Checkpoint,
    names: set[str],
    explained: bool,
    trim: bool,
    more: tuple[str, ...] = (),
    emptied: bool = False,
) -> list[str]:
    """Tokenizer files only in one folder, and files that differ: without a reported token change any
    difference; with one, a difference outside the keys that list tokens (:data:`_TOKEN_KEYS`). With
    ``emptied`` (an ``add-tokens`` run in the chain since the input), the empty token lists it leaves
    when a later trim removed its tokens (:func:`_emptied_trace`) are no difference."""
    out: list[str] = []
    for rel in sorted(names):
        pa, pb = A.path / rel, B.path / rel
        if emptied and pb.exists() and _emptied_trace(pa, pb, rel):
            continue
        if not pa.exists() or not pb.exists():
            # added_tokens.json is created by add-tokens where added tokens live outside the model file
            # (tokenizer_edit: PaddleNLP 2.8.1 reads them only there); its tokens are compared above
            if not (rel == "added_tokens.json" and pb.exists() and explained and not trim):
                out.append(f"{rel} is only in {'the input' if pa.exists() else 'the output'}")
            continue
        if same_bytes(pa, pb):
            continue
        if not explained:
            out.append(f"{rel} differs and tietool-report.json lists no token added or removed")
        elif rel in _TOKEN_KEYS:
            drop = _TOKEN_KEYS[rel] + (_TRIM_KEYS.get(rel, ()) if trim else ()) + more
            if _json_rest(pa, drop) != _json_rest(pb, drop):
                out.append(f"{rel} differs beyond the tokens it lists ({', '.join(drop)})")
    return out


def renamed_slots(tok: Tokenizers, B: Checkpoint, A: Checkpoint | None = None) -> Tokenizers:
    """``tok`` with the renames of the ``rename-tokens`` run that made ``B`` from ``A`` that the files bear
    out (:func:`surgery.verify.vocab.rename_claims`): those ids compared with their old strings (explained),
    and listed in ``renamed``; a claim the files contradict is left to the token comparison."""
    va, vb = tok.vocab
    renamed = rename_claims(B, va, vb, A)
    if not renamed:
        return tok
    seen = {**vb, **{i: o for i, (o, _) in renamed.items()}}
    return replace(tok, vocab=(va, seen), renamed=renamed)


def compare_tokenizers(
    res: VerifyResult, A: Checkpoint, B: Checkpoint, tok: Tokenizers, rows: tuple[int, int]
) -> None:
    """The tokenizer files of each folder agree with each other; every token of the input keeps its id
    in the output; the output's new tokens are the ones its ``tietool-report.json`` lists; len(tokenizer)
    of the output is at most its embedding's rows; tokenizer files differ only in the tokens they list.
    Each broken rule is unexplained (exit 7), naming the token or file. A problem the input already has
    (the same disagreement, a tokenizer longer than the rows by as much or more) is not a difference the
    operation made: it is a note."""
    (sa, sb), (va, vb), added, removed = tok.sets, tok.vocab, tok.added, tok.removed
    changes = _token_changes(va, vb, added, removed, tok.doubted)
    res.tokenizer = {
        "before": {"length": sa.length, "files": [f.name for f in sa.files], "agree": not sa.disagreements},
        "after": {"length": sb.length, "files": [f.name for f in sb.files], "agree": not sb.disagreements},
        "added": [{"content": c, "id": i} for i, c in sorted(added.items()) if vb.get(i) == c],
        "removed": [{"content": c, "id": i} for i, c in sorted(removed.items()) if i not in vb],
        "changes": changes,
    }
    res.notes += [f"the input's tokenizer files disagree: {d}" for d in sa.disagreements]
    for d in sb.disagreements:
        (res.notes if d in sa.disagreements else res.unexplained).append(
            f"the output's tokenizer files disagree: {d}"
            + (" (as the input's do)" if d in sa.disagreements else "")
        )
    res.unexplained += changes + list(tok.reset_doubted.values())
    _rows_for_tokens(res, (sa.length, sb.length), rows)
    names = tokenizer_names(A, B, tok.sets)
    specials = special_claims(B, A)
    explained = bool(added or removed or tok.renamed or specials) and not changes
    if tok.renamed:
        res.tokenizer["renamed"] = [
            {"id": i, "old": o, "new": n} for i, (o, n) in sorted(tok.renamed.items())
        ]
    more = tuple(f"{n}_token" for n in specials) + (("padding",) if "pad" in specials else ())
    emptied = any(r.get("operation") == "add-tokens" for r in chain_since(B.path, A.path))
    res.unexplained += _file_changes(A, B, names, explained, bool(removed or tok.renamed), more, emptied)


def _rows_for_tokens(
    res: VerifyResult, lengths: tuple[int | None, int | None], rows: tuple[int, int]
) -> None:
    """len(tokenizer) <= rows in the output: unexplained when the output lacks rows for its tokens, a note
    when the input lacked as many or more (the operation did not make it worse)."""
    (la, lb), (ra, rb) = lengths, rows
    if lb is None or lb <= rb:
        return
    line = f"the output's tokenizer has {lb} tokens but its embedding only {rb} rows: ids {rb}..{lb - 1} "
    line += "have no row"
    if la is not None and la - ra >= lb - rb:
        res.notes.append(f"{line} (the input's has {la} tokens for {ra} rows)")
    else:
        res.unexplained.append(line)
