"""Numbers as people read them in ``tietool``'s output: counts with separators and their size in K/M/B/T,
percentages with at most two decimals, and which inits draw random rows (their seed is worth printing)."""

from __future__ import annotations


def count(n: int) -> str:
    """``494032768`` → ``"494,032,768 (494 M)"``: the exact count with thousands separators, and from a
    million on its size in K/M/B/T (three significant digits) beside it."""
    text = f"{n:,}"
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6)):
        if abs(n) >= scale:
            v = n / scale
            return text + f" ({v:.3g} {unit})" if abs(v) < 1000 else text + f" ({v:.0f} {unit})"
    return text


def percent(p: float) -> str:
    """A percentage with at most two decimals, trailing zeros dropped: ``27.548`` → ``27.55``, ``0.0`` →
    ``0``."""
    text = f"{p:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


# the inits whose rows are random draws (their seed reproduces them); zeros, subtokens and copy:TOKEN are not
RANDOM_INITS = frozenset({"mean", "trained-mean", "normal"})
