"""Statistics for paired benchmark comparisons: pure functions, checked against known values.

- :func:`mcnemar_exact`: the exact McNemar test, a two-sided binomial test of the discordant
  pairs against p = 1/2 (what ``scipy.stats.binomtest(min(b, c), b + c).pvalue`` gives).
- :func:`sign_test_by_question`: that test with repeats, counting questions, not repeats: a
  question counts once, by the sign of (the candidate's share of right repeats - the
  baseline's), and ties are left out. Five repeats of one discordant question are one piece
  of evidence, not five.
- :func:`paired_bootstrap_ci`: a paired bootstrap interval of a mean delta that resamples
  *questions*, each one value (its repeats already folded into its mean), because repeats
  of one question are not independent evidence. Seeded: the same input gives the same
  interval.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from math import comb

import numpy as np


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact p-value for ``b`` pairs right->wrong and ``c`` wrong->right."""
    if b < 0 or c < 0:
        raise ValueError("counts must be >= 0")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(comb(n, i) for i in range(k + 1))  # exact integers; one division at the end
    return min(1.0, 2 * tail / 2**n)


@dataclass(frozen=True, slots=True)
class SignTest:
    """The exact sign test over questions (contract section 7)."""

    right_to_wrong: int  # questions whose candidate share of right repeats is the lower
    wrong_to_right: int  # questions whose candidate share is the higher
    ties: int  # questions whose shares are equal: left out of the test
    p_value: float


def sign_test_by_question(
    questions: Mapping[str, tuple[Iterable[bool], Iterable[bool]]],
) -> SignTest:
    """``questions`` maps a question to (its baseline repeats' correctness, its candidate's).

    Shares are compared as exact fractions, so 2 of 3 and 4 of 6 tie whatever the floats say.
    With one repeat on each side this is :func:`mcnemar_exact` on the discordant pairs.
    """
    worse = better = ties = 0
    for base, cand in questions.values():
        b, c = list(base), list(cand)
        if not b or not c:
            raise ValueError("a question needs at least one repeat on each side")
        diff = Fraction(sum(c), len(c)) - Fraction(sum(b), len(b))
        if diff < 0:
            worse += 1
        elif diff > 0:
            better += 1
        else:
            ties += 1
    return SignTest(worse, better, ties, mcnemar_exact(worse, better))


@dataclass(frozen=True, slots=True)
class Interval:
    low: float
    high: float
    level: float
    resamples: int
    seed: int

    @property
    def computed(self) -> bool:
        """False for the interval of no resamples (``--resamples 0``): its bounds are NaN."""
        return self.resamples > 0


def paired_bootstrap_ci(
    baseline: np.ndarray,
    candidate: np.ndarray,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Percentile interval of ``mean(candidate - baseline)`` over questions.

    The arrays hold one value per question and side (a question's mean over its repeats);
    each resample draws questions with replacement. ``resamples`` 0 asks for none: the
    bounds are NaN and :attr:`Interval.computed` is False.
    """
    d = np.asarray(candidate, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n_q = len(d)
    if n_q == 0:
        raise ValueError("no paired questions")
    if resamples == 0:  # asked for no interval (--resamples 0): one that excludes nothing
        return Interval(float("nan"), float("nan"), level, 0, seed)
    rng = np.random.default_rng(seed)
    deltas = np.empty(resamples, dtype=np.float64)
    chunk = max(1, 4_000_000 // n_q)  # bound the index matrix to ~32 MB
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        deltas[start : start + size] = d[rng.integers(0, n_q, size=(size, n_q))].mean(1)
    alpha = (1 - level) / 2
    low, high = np.quantile(deltas, [alpha, 1 - alpha])
    return Interval(float(low), float(high), level, resamples, seed)


def describe_deltas(values: list[float]) -> dict[str, float | int] | None:
    """Mean and median of paired differences (candidate - baseline), or None if none."""
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    return {"pairs": len(values), "mean": float(arr.mean()), "median": float(np.median(arr))}
