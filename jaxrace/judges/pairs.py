"""Which pairs a judge sees: all of them, or actively, where a label tells the most (host-side).

`choose_informative` (the loop's active selection) models the clips, not only their
owners (`jaxrace.judges.clip_model`): a judge compares two clips of one moment, and a
better driver can have the worse clip. A comparison of clips a and b is worth
`log(1 + I_ab Var(u_a - u_b))` under the model's Laplace posterior (the expected drop of
the posterior's log-volume, I_ab the label's Fisher information); picks are greedy, each
pick's information added (a rank-one update) before the next, so a batch spreads over
moments and owners. It needs no labels to start: the prior alone picks the first round.

`choose_active` is plain uncertainty sampling on the owners' Bradley-Terry fit, largest
`p (1 - p)`. `experiments/judge_agreement.py` compares them and other rules: with 10%
mistaken labels, the clip model's choice reaches random selection's ranking accuracy
with fewer labels than the owner-level rules.
"""

from __future__ import annotations

import numpy as np

from jaxrace.judges.clip_model import ClipModel, fit_clips, label_outcomes, pair_fisher


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



def choose_informative(pairs: np.ndarray, owner: np.ndarray, judged: np.ndarray, labels, k: int,
                       rng: np.random.Generator, model: ClipModel | None = None) -> np.ndarray:
    """Indices of the k candidate comparisons (rows of pairs) that tell the most about the clips' strengths.

    Args:
        pairs: i64[P, 2], the clips (indices into owner) of each comparison not judged yet.
        owner: i64[C], each clip's owner (candidate or driver).
        judged: i64[G, 2], the clips of the comparisons judged so far, in the order shown.
        labels: their G labels, first|second|tie|skip.
        k: how many to pick (fewer when fewer are left).
        rng: breaks ties in the score.
        model: the clip model's prior and lapse rate (default `ClipModel()`).

    Returns:
        i64[min(k, P)], distinct indices into pairs, in the order picked.
    """
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    judged = np.asarray(judged, np.int64).reshape(-1, 2)
    if k < 1 or len(pairs) == 0:
        return np.zeros((0,), np.int64)
    model = ClipModel() if model is None else model
    kept, outcome = label_outcomes(labels)
    if len(kept) != len(judged):
        raise ValueError(f"{len(judged)} judged pairs but {len(kept)} labels")
    strength, cov = fit_clips(owner, judged[kept, 0], judged[kept, 1], outcome[kept], model)
    a, b = pairs[:, 0], pairs[:, 1]
    return greedy_information(cov, a, b, pair_fisher(strength, a, b, model.lapse), k, rng)


def greedy_information(cov: np.ndarray, a: np.ndarray, b: np.ndarray, weight: np.ndarray, k: int,
                       rng: np.random.Generator) -> np.ndarray:
    """Indices of k comparisons of items a[i] and b[i] (i64[P]), greedily by `log(1 + weight Var(x_a - x_b))`.

    cov f64[M, M] is the posterior covariance of the items' strengths and weight f64[P] each
    comparison's Fisher information; each pick's information is added to the posterior (a
    rank-one update) before the next. Ties are broken at random.
    """
    cov = np.array(cov, np.float64)
    taken = np.zeros(len(a), bool)
    tie_break = 1e-9 * rng.random(len(a))
    picked = []
    for _ in range(min(k, len(a))):
        gain = np.log1p(weight * (cov[a, a] + cov[b, b] - 2.0 * cov[a, b])) + tie_break
        best = int(np.argmax(np.where(taken, -np.inf, gain)))
        picked.append(best)
        taken[best] = True
        cu = cov[:, a[best]] - cov[:, b[best]]
        cov = cov - np.outer(cu, cu) * weight[best] / (1.0 + weight[best] * (cu[a[best]] - cu[b[best]]))
    return np.asarray(picked, np.int64)
