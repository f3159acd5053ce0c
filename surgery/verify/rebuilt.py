"""``verify`` of the writes that rename or assemble tensors: ``convert`` and ``merge``.

Their output holds no tensor of the input under its own name and shape, so the comparison of
:mod:`surgery.verify.tensors` cannot explain them. Instead the output is rebuilt from the input as the
operation's contract says, headers only (:func:`rebuild`: the same planners ``convert`` and ``merge`` run:
the conventions' tables of :mod:`surgery.arch`, the rank files' rules, the flex ``.metadata``), and every
output tensor is checked against its source after the inverse of its transform (:func:`compare`):

* convert: a renamed tensor holds its source's bytes; a transposed one equals its source transposed; a part
  split from a fused projection equals those chunks of the fused tensor;
* merge of rank files: each tensor equals its slices joined on the family's axis (fused kinds part by part),
  a replicated tensor equals every rank's copy (all of them equal); expert-parallel files: the union of
  the experts, renumbered; flex: every global tensor assembled from the slices the ``.metadata`` places
  (and converted to the PaddleFormers layout when the report says so).

Beyond the tensors: config.json must be the one the convention (or the merge) writes, every safetensors
``__metadata__`` the one the target needs (``format``), every carried file byte-identical, and nothing else in
the output; the report's own table (renamed, transposed, split; each merged tensor's rule and axis) must be
the one the input gives, else the report is unverifiable. Each broken rule is one unexplained line naming the
tensor, key or file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..io import flex, store, stores
from ..io.checkpoint import REPORT_NAME, Checkpoint
from ..io.regular import load_json
from ..io.safetensors_io import Source
from ..io.vocabkeys import walk
from ..model.enums import Target
from ..model.errors import CheckpointError, Opt
from ..model.tensor import DTYPES, NP_TO_ST
from ..plan import convert as convert_plan
from ..plan import merge as merge_plan
from ..plan import merge_flex
from ..plan.merge_experts import plan_rank_merge
from ..plan.plan import OutTensor, Reshard
from ..plan.recipes import CopyOf, FusedPart, Joined, join, make, read_slice
from ..report import convert_report, history, merge_report
from .result import VerifyResult

BIG = 1 << 62  # a shard limit no output reaches: verify compares tensors by name, not by shard


@dataclass
class Rebuilt:
    """The output a ``convert`` or ``merge`` of the input must be (nothing written).

    Attributes:
        new: the tensors (recipes of the input's), config, carried files and safetensors metadata.
        source: the checkpoint the recipes read (the input; a flex merge's assembled view; None for rank
            files, whose slices name their files).
        what: the operation in words (``convert --to paddleformers``, ``merge of rank files``).
        table: the report's tables as the input gives them (``renamed``, ``transposed``, ``split``,
            ``tensors``), to check the output's report against.
    """

    new: Reshard
    source: Checkpoint | None
    what: str
    table: dict[str, Any] = field(default_factory=dict)


def read_report(folder: Path) -> dict[str, Any] | None:
    """``folder``'s ``tietool-report.json`` as a dict; None when it has none or it cannot be read."""
    try:
        rep = load_json(folder / REPORT_NAME, REPORT_NAME) if (folder / REPORT_NAME).is_file() else None
    except (CheckpointError, OSError):
        return None
    return rep if isinstance(rep, dict) else None


def one_step(a_path: Any, b_path: Any) -> dict[str, Any] | None:
    """The output's report when it records one ``convert`` or ``merge`` run whose input was ``a_path`` as
    it is (the output's chain is the input's own chain, then that run); else None (another operation, a
    local folder missing, a longer chain: :mod:`surgery.verify.tensors` compares them)."""
    if not (stores.is_local(a_path) and stores.is_local(b_path)):
        return None
    a, b = Path(str(a_path)), Path(str(b_path))
    rep = read_report(b)
    if rep is None or rep.get("operation") not in ("convert", "merge") or rep.get("dry_run"):
        return None
    chain = history(b)
    return rep if chain[:-1] == history(a) else None


def rebuild(a_path: Any, rep: dict[str, Any]) -> Rebuilt:
    """The output the run ``rep`` records must have written from the input ``a_path``, planned again
    from the input's headers as ``convert`` / ``merge`` plan it (:func:`surgery.plan.convert.plan_convert`,
    :func:`surgery.plan.merge_experts.plan_rank_merge`, :func:`surgery.plan.merge_flex.plan_flex`).

    Raises:
        TietoolError: the input does not plan (the report then describes a run that cannot have happened).
        ValueError: ``rep["to"]`` is no convert target.
    """
    src = Path(str(a_path))
    if rep.get("operation") == "convert":
        to = Target(rep.get("to"))
        ck = Checkpoint.open(src)
        cp = convert_plan.check_dtypes(convert_plan.plan_convert(ck, to))
        table = convert_report(cp, to, "", None)
        new = convert_plan.output_plan(cp, BIG).reshard
        return Rebuilt(new, ck, f"convert {Opt('to', to.value)}", table)
    if flex.find(src) is not None:
        return _rebuild_flex(src, rep)
    mp = plan_rank_merge(src)
    return Rebuilt(
        merge_plan.output_plan(mp, BIG).reshard, None, "merge of rank files", merge_report(mp, "", {})
    )


def _rebuild_flex(src: Path, rep: dict[str, Any]) -> Rebuilt:
    """A flex merge: assembled and converted to the PaddleFormers layout, or (the report's
    ``to_paddleformers_layout`` false) written in the Paddle layout as the run held it."""
    fp = merge_flex.tie_checked(merge_flex.plan_flex(src))
    if rep.get("to_paddleformers_layout") is False:
        fp = merge_flex.keep_layout(fp)
        table = merge_flex.report(fp, "", {})
        return Rebuilt(merge_flex.output_plan(fp, BIG).reshard, None, "merge of a flex checkpoint", table)
    fp = merge_flex.as_exported(fp)  # a tied model's duplicate head left out, as the merge leaves it out
    view = merge_flex.flex_view(fp)
    cp = convert_plan.check_dtypes(convert_plan.plan_convert(view, Target.PADDLEFORMERS))
    new = replace(convert_plan.output_plan(cp, BIG).reshard, carry=fp.carry)
    table = merge_flex.with_conversion(
        merge_flex.report(fp, "", {}), convert_report(cp, Target.PADDLEFORMERS, "", None), ""
    )
    return Rebuilt(new, view, "merge of a flex checkpoint (to the PaddleFormers layout)", table)


# ------------------------------------------------------------------ the comparison


def compare(res: VerifyResult, rb: Rebuilt, B: Checkpoint, rep: dict[str, Any]) -> None:
    """Check the output ``B`` against the rebuilt one ``rb``, recording each tensor in ``res.derived`` and
    each broken rule in ``res.unexplained``: tensors (names, shapes, dtypes, bits), config.json, the
    safetensors ``__metadata__``, the carried and the other files, and the report's table."""
    want = {t.name: t for t in rb.new.tensors}
    for name, t in want.items():
        tb = B.tensors.get(name)
        if tb is None:
            res.unexplained.append(f"{name} is not in the output, and {rb.what} writes it ({_how(t)})")
            continue
        if tuple(tb.shape) != tuple(t.shape) or not _same_label(tb.dtype, t.dtype):
            res.unexplained.append(
                f"{name} is {tb.dtype} {list(tb.shape)} in the output, and {rb.what} writes {t.dtype} "
                f"{list(t.shape)} ({_how(t)})"
            )
            continue
        why = _differs(rb, t, B)
        res.derived.append({"name": name, "from": _how(t), "equal": not why})
        if why:
            res.unexplained.append(f"{name} is not {_how(t)}: {why}")
        else:
            res.identical += 1
    for name in sorted(set(B.tensors) - set(want)):
        res.unexplained.append(f"{name} is in the output, and {rb.what} writes no such tensor")
    _compare_config(res, rb, B)
    _compare_metadata(res, rb, B)
    _compare_files(res, rb, B)
    _compare_table(res, rb, rep)
    res.notes.append(
        f"the output is the input's {rb.what}: {len(want)} tensors checked against their sources "
        "(renamed, transposed, split or assembled as the input gives them)"
    )


def _same_label(a: str, b: str) -> bool:
    """Two dtype labels name the same storage (``float32`` of a ``.pdparams`` is ``F32``; bf16 bits
    labelled ``U16`` are ``BF16``'s)."""
    x, y = (DTYPES.get(v) or DTYPES.get(NP_TO_ST.get(v, ""), None) for v in (a, b))
    return a == b or (x is not None and x == y) or {a, b} <= {"U16", "BF16", "uint16"}


def _how(t: OutTensor) -> str:
    """The transform of one rebuilt tensor in words (``llama.x transposed``, ``chunks 0-1 of 3 of ...``)."""
    r = t.recipe
    if isinstance(r, CopyOf):
        return (
            f"{r.name}" + (" transposed" if r.transpose else "") + ("" if r.name != t.name else " as stored")
        )
    if isinstance(r, FusedPart):
        return f"chunks {list(r.chunks)} of the {r.count} along axis {r.axis} of {r.name}" + (
            ", transposed" if r.transpose else ""
        )
    if isinstance(r, Joined):
        if r.axis is None:
            return f"replicated in {len(r.slices)} rank file(s)"
        return f"{len(r.slices)} rank slices joined on axis {r.axis} ({r.rule.value})"
    return "assembled from the slices the .metadata places"


def _differs(rb: Rebuilt, t: OutTensor, B: Checkpoint) -> str:
    """Why the output's ``t.name`` is not its source after the transform ("" when it is, bit for bit)."""
    got = np.ascontiguousarray(B.load(t.name))
    r = t.recipe
    if isinstance(r, Joined) and r.axis is None:  # replicated: every rank's copy, all equal
        for s in r.slices:
            why = _bits_differ(np.ascontiguousarray(read_slice(s)), got)
            if why:
                return f"{s.info.file}'s copy differs: {why}"
        return ""
    return _bits_differ(expected(rb, t), got)


def expected(rb: Rebuilt, t: OutTensor) -> np.ndarray:
    """The tensor the transform makes of its source, in the stored dtype (bf16 as ``uint16`` bits): the
    inverse checks of a copy, a transpose, a fused part and a join are computed here from the source's
    stored array; other recipes (flex assembly) by :func:`surgery.plan.recipes.make`."""
    r, S = t.recipe, rb.source
    if isinstance(r, CopyOf) and r.scale is None and S is not None:
        a = np.asarray(S.load(r.name))
        return np.ascontiguousarray(a.T if r.transpose else a)
    if isinstance(r, FusedPart) and S is not None:
        a = np.asarray(S.load(r.name))
        axis = r.axis % a.ndim
        size = a.shape[axis] // r.count
        picked = [np.take(a, np.arange(c * size, (c + 1) * size), axis=axis) for c in r.chunks]
        part = np.concatenate(picked, axis=axis)
        return np.ascontiguousarray(part.T if r.transpose else part)
    if isinstance(r, Joined) and r.axis is not None:
        return join([np.ascontiguousarray(read_slice(s)) for s in r.slices], r.rule, r.axis, r.parts)
    return flat_bytes(make(r, S, {}))


def flat_bytes(d: Any) -> np.ndarray:
    """A recipe's data (:func:`surgery.plan.recipes.make`) as an array: an array as it is, a
    :class:`Source` of byte ranges read into a flat ``uint8`` array."""
    if isinstance(d, np.ndarray):
        return np.ascontiguousarray(d)
    return np.frombuffer(_source_bytes(d), dtype=np.uint8)


def _source_bytes(s: Source) -> bytes:
    if s.parts is not None:
        return b"".join(_source_bytes(p) for p in s.parts)
    if s.array is not None:
        return np.ascontiguousarray(s.array).tobytes()
    assert s.path is not None
    with open(s.path, "rb") as f:
        f.seek(s.offset)
        return f.read(s.nbytes)


def _bits_differ(want: np.ndarray, got: np.ndarray) -> str:
    """Why two stored arrays differ ("" when their bytes are equal): the elements that differ."""
    a, b = want.reshape(-1).view(np.uint8), got.reshape(-1).view(np.uint8)
    if a.size != b.size:
        return f"{b.size} bytes where the transform gives {a.size}"
    if np.array_equal(a, b):
        return ""
    item = max(1, got.dtype.itemsize if want.dtype == np.uint8 else want.dtype.itemsize)
    bad = np.flatnonzero((a != b).reshape(-1, item).any(axis=1)) if a.size % item == 0 else np.array([0])
    first = ", ".join(map(str, bad[:5].tolist()))
    return f"{bad.size} element(s) differ (flat index {first}{', ...' if bad.size > 5 else ''})"


def _compare_config(res: VerifyResult, rb: Rebuilt, B: Checkpoint) -> None:
    """config.json is the one the operation writes: each key that differs from it is unexplained."""
    want, got = dict(walk(rb.new.config)), dict(walk(B.config))
    for k in sorted(set(want) | set(got)):
        if want.get(k, _ABSENT) != got.get(k, _ABSENT):
            res.unexplained.append(
                f"config.json: {k} is {_shown(got.get(k, _ABSENT))}, and {rb.what} writes "
                f"{_shown(want.get(k, _ABSENT))}"
            )


_ABSENT = object()


def _shown(v: object) -> str:
    return "absent" if v is _ABSENT else json.dumps(v)


def _compare_metadata(res: VerifyResult, rb: Rebuilt, B: Checkpoint) -> None:
    """Each safetensors file's ``__metadata__`` is the one the target needs (:func:`st_metadata`: ``format``
    ``pt`` for the PaddleFormers/HF layout, ``np`` for the Paddle layout), or none where none is written."""
    if not B.fmt.has_metadata:
        return
    want = rb.new.st_metadata or {}
    for f, m in B.st_metadata.items():
        if (m or {}) != want:
            res.unexplained.append(
                f"{f}: __metadata__ {json.dumps(m or {})}, and {rb.what} writes {json.dumps(want)}"
            )


def _compare_files(res: VerifyResult, rb: Rebuilt, B: Checkpoint) -> None:
    """Every carried file is in the output byte for byte; the output holds no other file beside its
    weights, index, config.json and report."""
    carried = {rel: p for p, rel in rb.new.carry}
    for rel, p in sorted(carried.items()):
        q = B.path / rel
        if not q.is_file():
            res.unexplained.append(f"{rel} is not in the output, and {rb.what} carries it")
        elif not store.same_bytes(p, q):
            res.unexplained.append(f"{rel} differs from the input's, and {rb.what} carries it unchanged")
    for rel in sorted(set(B.other_files) - set(carried) - {"config.json", REPORT_NAME}):
        res.unexplained.append(f"{rel} is in the output, and {rb.what} writes no such file")


_TABLE_KEYS = {
    "renamed": ("from", "to"),
    "transposed": ("name", "from"),
    "split": ("from", "to"),
    "tensors": ("name", "rule", "axis", "shape"),
}


def _compare_table(res: VerifyResult, rb: Rebuilt, rep: dict[str, Any]) -> None:
    """The report's tables (``renamed``, ``transposed``, ``split``; a merge's ``tensors``) are the ones the
    input gives: a report that says otherwise describes another run (unverifiable)."""
    for sec in (rep, rep.get("converted") or {}):
        want_sec = rb.table if sec is rep else rb.table.get("converted") or {}
        for key, fields in _TABLE_KEYS.items():
            if key not in sec or key not in want_sec:
                continue
            got, want = _rows(sec[key], fields), _rows(want_sec[key], fields)
            if got != want:
                extra = sorted(got - want, key=str)[:3]
                missing = sorted(want - got, key=str)[:3]
                res.unexplained.append(
                    f"tietool-report.json: its {key!r} table is not the one the input gives ({rb.what}): "
                    f"{len(got - want)} entries it lists wrongly {extra}, {len(want - got)} it lacks "
                    f"{missing}; the report is unverifiable"
                )


def _rows(rows: Any, fields: tuple[str, ...]) -> set[str]:
    """A report table as a set of canonical JSON rows of ``fields``."""
    if not isinstance(rows, list):
        return {json.dumps(rows)}
    return {json.dumps([r.get(f) for f in fields] if isinstance(r, dict) else r) for r in rows}


def refused(res: VerifyResult, rep: dict[str, Any], a_path: Any, e: Exception) -> None:
    """The output's report records a run the input cannot have made: unexplained."""
    res.unexplained.append(
        f"tietool-report.json records a {rep.get('operation')} of {rep.get('input')}; {a_path} cannot be its "
        f"input (a {rep.get('operation')} of it is refused: {e}); the report is unverifiable"
    )
