"""``verify``'s comparison of the files beside the weights: config files (only the keys the operation sets
may differ), safetensors ``__metadata__`` and every other carried file (byte for byte)."""

from __future__ import annotations

import json
from pathlib import Path

from .. import arch
from ..inspect.detection import Detection
from ..io import store
from ..io.checkpoint import Checkpoint
from ..io.configfile import read_config_file
from ..io.regular import load_json
from ..io.vocabkeys import walk
from ..model.errors import CheckpointError
from .result import VerifyResult
from .vocab import special_claims

ALLOWED_CONFIG_KEYS = ("tie_word_embeddings", *arch.VOCAB_SIZE_KEYS)


def _flatten(d) -> dict:
    """``{dotted key: value}`` of every leaf of a parsed config (:func:`surgery.io.vocabkeys.walk`)."""
    return dict(walk(d))


_CONFIG_FILES = ("config.json", "model_config.json", "generation_config.json")


def compare_configs(
    res: VerifyResult,
    A: Checkpoint,
    B: Checkpoint,
    da: Detection,
    db: Detection,
    chain: list[dict] | None = None,
    a_dir: Path | None = None,
) -> None:
    """Record every differing key of the config files in ``res.config``. Unexplained: a key outside
    ``ALLOWED_CONFIG_KEYS``; a vocabulary-size key the input did not have; a vocabulary-size key whose new
    value counts no vocabulary of the output (neither its embedding's nor its head's rows, nor the old value
    moved as the embedding moved). A key of config.json that a ``convert`` or ``merge`` run of the output's
    report ``chain`` (the runs since the input) changed from the input's value to the output's is
    explained (:func:`_converted`). ``a_dir``: the folder of the input's config files when they are not in
    ``A.path`` (a Trainer checkpoint's config.json found in the folder above it)."""
    chain = chain or []
    d = db.vocab_rows - da.vocab_rows
    counts = {db.vocab_rows, db.head.rows}
    set_ids = {f"{n}_token_id": i for n, (_, i) in special_claims(B, A).items()}
    for fname in _CONFIG_FILES:
        pa, pb = (a_dir or A.path) / fname, B.path / fname
        if not pa.exists() and not pb.exists():
            continue
        ca = _flatten(_read_cfg(pa)) if pa.exists() else {}
        cb = _flatten(_read_cfg(pb)) if pb.exists() else {}
        for k in sorted(set(ca) | set(cb)):
            before, after = ca.get(k, _ABSENT), cb.get(k, _ABSENT)
            if before == after:
                continue
            res.config.append({"file": fname, "key": k, "before": ca.get(k), "after": cb.get(k)})
            name = k.split(".")[-1]
            change = f"({_shown(before)} → {_shown(after)})"
            if fname == "config.json" and _converted(chain, k, ca, cb):
                continue
            if name in set_ids and after == set_ids[name]:
                continue  # a special token the output's own run set (rename-tokens set_special)
            if name not in ALLOWED_CONFIG_KEYS:
                res.unexplained.append(f"{fname}: {k} changed {change}")
            elif name != "tie_word_embeddings" and before is _ABSENT:
                res.unexplained.append(
                    f"{fname}: {k} added {change}; tie/untie/resize add no vocabulary size"
                )
            elif (
                name != "tie_word_embeddings"
                and after is not _ABSENT
                and after not in counts
                and (not isinstance(before, int) or after != before + d)
            ):
                res.unexplained.append(
                    f"{fname}: {k} changed {change}, which counts no vocabulary of the output "
                    f"(its embedding has {db.vocab_rows} rows)"
                )


_ABSENT = object()


def _shown(v: object) -> str:
    """A config value as JSON writes it (``null``, ``"silu"``), or ``absent``."""
    return "absent" if v is _ABSENT else json.dumps(v)


def compare_metadata(
    res: VerifyResult, A: Checkpoint, B: Checkpoint, chain: list[dict] | None = None
) -> None:
    """safetensors ``__metadata__``: every entry of the output must be one of the input's (any shard), or a
    ``{dropped tensor: the embedding}`` entry that tie writes for a tensor the output no longer holds (or
    held, when a run of the ``chain`` wrote it, a ``tie`` or a run whose report lists the tensor as
    dropped, such as a resize of a tied checkpoint dropping its duplicate head, and a later untie kept
    it)."""
    before: dict[str, str] = {}
    for m in A.st_metadata.values():
        before.update(m or {})
    tied = any(r.get("operation") == "tie" for r in chain or [])
    lists = [r.get("dropped") for r in chain or []]
    dropped = {d.get("name") for ds in lists if isinstance(ds, list) for d in ds if isinstance(d, dict)}
    for f, m in B.st_metadata.items():
        for k, v in (m or {}).items():
            tie_entry = (
                k in A.tensors and (tied or k in dropped or k not in B.tensors) and v in B.tensors and k != v
            )
            if k == "format" and v in _formats(chain or []):
                continue  # a convert / merge of the chain writes the format its target needs
            if before.get(k) != v and not tie_entry:
                res.unexplained.append(
                    f"{f}: __metadata__ {json.dumps(k)}: {json.dumps(v)} is not the input's "
                    f"({_shown(before.get(k, _ABSENT))}) and no tie entry"
                )


def _read_cfg(p: Path) -> object:
    """A config file (strictly, types checked: :func:`surgery.io.configfile.read_config_file`) or
    ``generation_config.json`` (strictly: :func:`surgery.io.regular.load_json`)."""
    return load_json(p, p.name) if p.name == "generation_config.json" else read_config_file(p)


def same_bytes(pa: Path, pb: Path) -> bool:
    """Two carried files hold the same bytes (local: compared in blocks, :func:`filecmp.cmp`; both were
    checked to be regular, readable files when the checkpoints were opened)."""
    try:
        return store.same_bytes(pa, pb)
    except OSError as e:
        raise CheckpointError(
            f"cannot be read ({e.strerror})", e.filename or pa, "make it readable"
        ) from None


def compare_other_files(res: VerifyResult, A: Checkpoint, B: Checkpoint, skip: set[str]) -> None:
    """Files other than weights, configs and ``skip`` (the tokenizer files, compared token by token) must
    be in both and byte-identical; any other is unexplained."""
    for rel in sorted(set(A.other_files) | set(B.other_files)):
        if rel in _CONFIG_FILES or rel in skip:
            continue
        pa, pb = A.path / rel, B.path / rel
        if not pa.exists() or not pb.exists():
            res.unexplained.append(f"{rel} is only in {'the input' if pa.exists() else 'the output'}")
        elif not same_bytes(pa, pb):
            res.unexplained.append(f"{rel} differs")


# the safetensors __metadata__ format each convert target writes (surgery.plan.convert.st_metadata)
_TARGET_FORMATS = {"paddleformers": ("pt",), "paddlenlp": ("np",)}
_REWRITES = ("convert", "merge")


def _formats(chain: list[dict]) -> tuple[str, ...]:
    """The ``__metadata__`` formats the last ``convert`` / ``merge`` run of ``chain`` may have written
    (a container change keeps or proves the layout: ``pt`` or ``np``); none without such a run."""
    runs = [e for e in chain if e.get("operation") in _REWRITES]
    if not runs:
        return ()
    return _TARGET_FORMATS.get(str(runs[-1].get("to")), ("pt", "np"))


def _converted(chain: list[dict], key: str, ca: dict, cb: dict) -> bool:
    """The flattened config.json key ``key`` (``architectures.0``) differs between input and output as the
    ``config_changes`` of the ``convert`` / ``merge`` runs of ``chain`` say: its top-level key's first
    recorded ``before`` is the input's value, its last ``after`` the output's (``null``: dropped)."""
    top = key.split(".")[0]
    changes = [
        c
        for e in chain
        if e.get("operation") in _REWRITES and isinstance(e.get("config_changes"), list)
        for c in e["config_changes"]
        if isinstance(c, dict) and c.get("key") == top and c.get("file", "config.json") == "config.json"
    ]
    if not changes:
        return False
    first, last = changes[0].get("before"), changes[-1].get("after")
    now = {k: v for k, v in cb.items() if k == top or k.startswith(top + ".")}
    was = {k: v for k, v in ca.items() if k == top or k.startswith(top + ".")}
    # null in a change: the key absent, or holding null (``paddlenlp_version: null`` dropped or written)
    return _same(now, top, last) and _same(was, top, first)


def _same(flat: dict, top: str, value: object) -> bool:
    """The flattened ``top`` entries of a config are those of ``{top: value}`` (None: absent or null)."""
    return flat == _flat(top, value) or (value is None and flat == {top: None})


def _flat(top: str, value: object) -> dict:
    """``{dotted key: leaf}`` of ``{top: value}``, as :func:`_flatten` flattens a config (None: absent)."""
    return {} if value is None else _flatten({top: value})
