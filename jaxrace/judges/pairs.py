"""Which pairs a judge sees: all of them, or actively, where the ranking is least certain (host-side).

Active selection is uncertainty sampling for a pairwise model: it scores comparing items
a and b by `p (1 - p)` with `p = sigmoid(s_a - s_b)` from the current Bradley-Terry fit,
the variance of the outcome, largest where the fit cannot yet tell the two apart. A round
takes the best few (ties broken at random), then the ranking is refitted.
`experiments/judge_agreement.py` compared this with weighting by the two strengths'
standard errors and with a penalty for pairs compared before: both needed more labels.
"""

from __future__ import annotations

import numpy as np


def pair_information(scores: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """f64[P]: `p (1 - p)` of comparing items a[i] and b[i]; scores f[K] are Bradley-Terry log-strengths."""
    scores = np.asarray(scores, np.float64)
    p = 1.0 / (1.0 + np.exp(-(scores[np.asarray(a, np.int64)] - scores[np.asarray(b, np.int64)])))
    return p * (1.0 - p)


def choose_active(items: np.ndarray, scores: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the k candidate comparisons (rows of items, i64[P, 2]) whose outcome is least certain.

    Ties in the score are broken at random, so equal pairs share the budget.
    """
    if k < 1 or len(items) == 0:
        return np.zeros((0,), np.int64)
    info = pair_information(scores, items[:, 0], items[:, 1])
    return np.lexsort((rng.random(len(items)), -info))[:k]

