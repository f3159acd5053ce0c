"""``surgery/plan/transplant_omp.py``'s ``batch_omp`` (mergekit's ``batch_omp``, ``mergekit/tokensurgeon/
omp.py`` at a6e40288, in numpy) against orthogonal matching pursuit from its definition: at each step the
candidate of largest absolute inner product with the residual (chosen ones excluded), the coefficients the
float64 least-squares fit over the chosen candidates (normal equations). Past 256 atoms mergekit
re-orthogonalises its basis by a QR; the ids and coefficients stay those of the definition.
``omp_values``: the report's coefficients on float32 and bfloat16 tables, float64 products added in order,
rounded once."""

from __future__ import annotations

import numpy as np
import pytest

from tietool.surgery.model.tensor import bf16_bits_to_f32, f32_to_bf16_bits
from tietool.surgery.plan import transplant_omp as to
from tietool.surgery.plan import transplant_rows as tr


def _reference(target: np.ndarray, atoms: np.ndarray, k: int) -> tuple[list[int], np.ndarray]:
    t, A = target.astype(np.float64), atoms.astype(np.float64)
    chosen: list[int] = []
    res, coef = t, np.zeros(0)
    for _ in range(k):
        score = np.abs(A @ res)
        score[chosen] = -np.inf
        chosen.append(int(np.argmax(score)))
        S = A[chosen]
        coef = np.linalg.solve(S @ S.T, S @ t)  # the normal equations (well conditioned here)
        res = t - A[chosen].T @ coef
    return chosen, coef


@pytest.mark.parametrize(
    ("N", "D", "k", "B"), [(50, 16, 1, 3), (50, 16, 12, 3), (400, 64, 32, 3), (400, 512, 258, 1)]
)
def test_batch_omp_is_omp(N, D, k, B):
    rng = np.random.default_rng(N + k)
    points = (rng.standard_normal((N, D)) * 0.02).astype(np.float32)
    targets = (rng.standard_normal((B, D)) * 0.02).astype(np.float32)
    sel, coef = to.batch_omp(targets, points, k)
    assert sel.shape == coef.shape == (B, k) and coef.dtype == np.float32
    for b in range(B):
        ids, want = _reference(targets[b], points, k)
        assert sel[b].tolist() == ids
        assert np.allclose(coef[b], want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_batch_omp_refuses_more_atoms_than_candidates():
    with pytest.raises(ValueError, match="Cannot select 5 points from 4 candidates"):
        to.batch_omp(np.ones((1, 3), np.float32), np.eye(4, 3, dtype=np.float32), 5)


def test_omp_rows_map_to_old_ids_in_small_batches(monkeypatch):
    """Batches of one (a tiny work bound) give the rows one batch gives; ids are the old ids."""
    rng = np.random.default_rng(1)
    points = rng.standard_normal((20, 8)).astype(np.float32)
    targets = rng.standard_normal((5, 8)).astype(np.float32)
    old = list(range(100, 120))
    whole = to.omp_rows(points, targets, old, 4)
    monkeypatch.setattr(to, "WORK_BYTES", 1)
    assert to.omp_rows(points, targets, old, 4) == whole
    sel, coef = to.batch_omp(targets, points, 4)
    assert [r.ids for r in whole] == [tuple(100 + i for i in s) for s in sel.tolist()]
    assert [r.coef for r in whole] == [tuple(c) for c in coef.tolist()]


@pytest.mark.parametrize("bf16", [False, True])
def test_omp_values_add_float64_products_in_order(bf16):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((10, 6)).astype(np.float32)
    stored = f32_to_bf16_bits(x) if bf16 else x
    dec = bf16_bits_to_f32 if bf16 else (lambda a: a.astype(np.float32))
    rows = [tr.OmpRow((3, 1, 3), (0.5, -1.25, 2.0)), tr.OmpRow((7,), (0.1,))]
    got = tr.omp_values(stored, rows, dec)
    xs = dec(stored).astype(np.float64)
    want = [xs[3] * 0.5 + xs[1] * -1.25 + xs[3] * 2.0, xs[7] * 0.1]
    assert np.array_equal(got, np.asarray(want).astype(np.float32))
    out = tr.made_block(stored, (4, rows[0], rows[1]), dec, f32_to_bf16_bits if bf16 else (lambda a: a), None)
    assert np.array_equal(out[0], stored[4])
    want_stored = f32_to_bf16_bits(got) if bf16 else got
    assert np.array_equal(out[1:], want_stored)
