"""``verify`` of the ``omp`` rows of a ``transplant`` output (:mod:`surgery.plan.transplant_omp`).

The report's ``transplant.omp`` gives, per ``"omp"`` row in id order and per table (``embedding``, and
``head`` when the model's head has rows of its own), the old ids and float32 coefficients. Checked here:

* each row's entries are ``sum(coef[p] * old_entry[ids[p]])`` added in float64 in that order and rounded
  once, bit for bit (:func:`omp_entry`, used by :func:`surgery.verify.transplant.expected_entries`);
* the ids and coefficients are what mergekit's ``batch_omp`` gives for the donor model the report names:
  recomputed from that checkpoint (the shared tokens are the report's ``kept`` rows, in id order), the same
  ids and coefficients within :data:`RTOL` / :data:`ATOL` (float32 arithmetic of another BLAS may round
  differently). A donor model that cannot be read is named as unverifiable. This costs what the
  transplant's pursuit cost (measured: 87 ms a token for 30,000 shared tokens of hidden 1,024, k 64, one
  core).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..model.errors import Opt, TietoolError
from .result import VerifyResult

RTOL = 1e-3
ATOL = 1e-5
"""How far a recomputed coefficient may be from the report's (relative to the row's largest one)."""
TABLES = ("embedding", "head")


def omp_entry(x: np.ndarray, ids: list[int], coef: list[float]) -> np.ndarray:
    """``sum(coef[p] * x[ids[p]])`` (float32) over the decoded float32 entries ``x`` ``[V, ...]``: float64
    products added in order from the first, rounded once."""
    s = x[ids[0]].astype(np.float64) * float(coef[0])
    for i, c in zip(ids[1:], coef[1:], strict=True):
        s += x[i].astype(np.float64) * float(c)
    return s.astype(np.float32)


def _pairs(part: Any, n: int, rows_a: int) -> list[tuple[list[int], list[float]]] | str:
    """``part`` (``{"ids", "coef"}``) as ``n`` (ids, coef) pairs, or why it is not."""
    ids, coef = (part.get("ids"), part.get("coef")) if isinstance(part, dict) else (None, None)
    if not isinstance(ids, list) or not isinstance(coef, list) or len(ids) != n or len(coef) != n:
        return f"does not list ids and coef for its {n} omp rows"
    out = []
    for i, c in zip(ids, coef, strict=True):
        ok = isinstance(i, list) and isinstance(c, list) and len(i) == len(c) > 0
        ok = ok and all(type(v) is int and 0 <= v < rows_a for v in i)
        if not ok or not all(isinstance(v, float | int) and np.isfinite(v) for v in c):
            return f"has an omp row {i!r} that is not ids of the input's {rows_a} rows, a coefficient each"
        out.append((i, [float(v) for v in c]))
    return out


def omp_claims(res: VerifyResult, sec: dict[str, Any], rows: list[dict], rows_a: int) -> bool:
    """Attach to each ``"omp"`` row of ``rows`` its ``omp`` ``{table: (ids, coef)}`` from the report's
    ``transplant.omp``; False (named unverifiable) when the report does not give them."""
    at = [j for j, r in enumerate(rows) if r["made"] == "omp"]
    if not at:
        return True
    omp = sec.get("omp")
    why = "" if isinstance(omp, dict) and isinstance(omp.get("embedding"), dict) else "has no omp section"
    parts: dict[str, Any] = {}
    for t in TABLES:
        if why or (t == "head" and "head" not in omp):  # type: ignore[operator]
            continue
        got = _pairs(omp[t], len(at), rows_a)  # type: ignore[index]
        why = got if isinstance(got, str) else why
        parts[t] = got
    if why:
        res.unexplained.append(f"tietool-report.json's transplant {why}; the report is unverifiable")
        return False
    for n, j in enumerate(at):
        rows[j]["omp"] = {t: p[n] for t, p in parts.items()}
    return True


def check_coefficients(res: VerifyResult, sec: dict[str, Any], rows: list[dict]) -> None:
    """The report's omp ids and coefficients against :func:`~surgery.plan.transplant_omp.batch_omp`
    recomputed from the donor model it names (module docstring)."""
    from ..plan.transplant_omp import batch_omp, donor_rows, open_donor

    at = [j for j, r in enumerate(rows) if r["made"] == "omp"]
    if not at:
        return
    omp = sec["omp"]
    shared = [j for j, r in enumerate(rows) if r["made"] == "kept"]
    try:
        k = int(omp.get("k"))
        ckpt, tables = open_donor(Path(str(omp.get("donor_model"))), len(rows), "head" in omp)
        for t in [t for t in TABLES if t in omp]:
            points = donor_rows(ckpt, tables, t == "head", shared)
            _compare(
                res, t, rows, at, batch_omp(donor_rows(ckpt, tables, t == "head", at), points, k), shared
            )
    except (TietoolError, OSError, ValueError, TypeError) as e:
        res.unexplained.append(
            f"the omp coefficients cannot be recomputed from the donor model {omp.get('donor_model')!r} "
            f"({e}); verify where the transplant's {Opt('donor_model')} is readable"
        )


def _compare(
    res: VerifyResult,
    t: str,
    rows: list[dict],
    at: list[int],
    got: tuple[np.ndarray, np.ndarray],
    shared: list[int],
) -> None:
    """The report's ``t`` ids and coefficients of the omp rows ``at`` against the recomputed ``got``
    (indices into the shared tokens ``shared``, coefficients)."""
    sel, coef = got
    old = [rows[j]["old_id"] for j in shared]
    bad = []
    for n, j in enumerate(at):
        ids, c = rows[j]["omp"][t]
        want_ids = [old[i] for i in sel[n]]
        scale = max(1e-30, float(np.abs(coef[n]).max()))
        if ids != want_ids or not np.allclose(c, coef[n], rtol=RTOL, atol=ATOL * scale):
            bad.append(j)
    if bad:
        res.unexplained.append(
            f"omp {t}: the ids or coefficients of id {bad[0]} are not what batch_omp gives for the donor "
            "model" + (f", nor are {len(bad) - 1} more" if len(bad) > 1 else "")
        )
    else:
        res.notes.append(f"omp {t}: {len(at)} rows' ids and coefficients recomputed from the donor model")
