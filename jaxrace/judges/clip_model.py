"""A Bradley-Terry model of clips, not of drivers, for choosing which pairs to judge (host-side, numpy).

A judge compares two clips of the same moment, and a better driver can have the worse
15 s: the outcome belongs to the clips. So each clip c has its own strength
`u_c = m_owner(c) + e_c`, with `m ~ N(0, owner_spread^2)` per owner (candidate or
driver) and `e_c ~ N(0, spread^2)`; integrating the owners out, `u ~ N(0, S)` with
`S = spread^2 I + owner_spread^2 A A^T` (A: the clip-owner indicator). A judge labels
the first clip better with probability `lapse + (1 - 2 lapse) sigmoid(u_a - u_b)`: the
lapse rate absorbs outright mistakes (B-Pref's mistaken teacher), which a plain
Bradley-Terry likelihood reads as evidence. A tie counts half a win each way.

`fit_clips` gives the posterior mode of u and a Laplace covariance (the prior's
precision plus the labels' expected Fisher information). Clips never judged borrow
their owner's strength through the prior, so labels of one moment inform the pairs of
another, and labels within a moment inform each other by transitivity.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit


@dataclasses.dataclass(frozen=True)
class ClipModel:
    """Prior and noise of the clip model (log-strength units of Bradley-Terry)."""

    spread: float = 1.0  # s.d. of a clip's strength around its owner's: owners differ more than their clips
    owner_spread: float = 2.0  # s.d. of the owners' strengths
    lapse: float = 0.1  # chance a label is a mistake, whatever the clips (> 0 keeps every weight finite)

    def __post_init__(self):
        if not (self.spread > 0 and self.owner_spread > 0 and 0.0 < self.lapse < 0.5):
            raise ValueError(f"ClipModel needs spread > 0, owner_spread > 0 and lapse in (0, 0.5); got "
                             f"spread={self.spread}, owner_spread={self.owner_spread}, lapse={self.lapse}")


def label_outcomes(labels) -> tuple[np.ndarray, np.ndarray]:
    """(bool[G] kept, f64[G] outcome) of labels first|second|tie|skip: 1 first, 0 second, 0.5 tie; skips not kept."""
    value = {"first": 1.0, "second": 0.0, "tie": 0.5, "skip": np.nan}
    try:
        out = np.array([value[lab] for lab in labels], np.float64)
    except KeyError as err:
        raise ValueError(f"a label must be first, second, tie or skip, got {err.args[0]!r}") from None
    return ~np.isnan(out), np.nan_to_num(out)


def prior_covariance(owner: np.ndarray, model: ClipModel) -> np.ndarray:
    """f64[C, C]: the prior covariance of the clips' strengths; owner i64[C] is each clip's owner."""
    owner = np.asarray(owner, np.int64)
    same = (owner[:, None] == owner[None, :]).astype(np.float64)
    return model.spread ** 2 * np.eye(len(owner)) + model.owner_spread ** 2 * same


def pair_fisher(strength: np.ndarray, a: np.ndarray, b: np.ndarray, lapse: float) -> np.ndarray:
    """f64[P]: the expected Fisher information about u_a - u_b of one label of clips a[i] and b[i]."""
    s = expit(strength[a] - strength[b])
    p = lapse + (1.0 - 2.0 * lapse) * s
    return ((1.0 - 2.0 * lapse) * s * (1.0 - s)) ** 2 / (p * (1.0 - p))


def fit_clips(owner: np.ndarray, first: np.ndarray, second: np.ndarray, outcome: np.ndarray,
              model: ClipModel | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The clips' strengths from judged pairs.

    Args:
        owner: i64[C], each clip's owner (candidate or driver) index.
        first, second: i64[G], the clips judged, in the order shown.
        outcome: f64[G], 1 when the first won, 0 when the second did, 0.5 for a tie (no skips).
        model: the prior and the lapse rate (default `ClipModel()`).

    Returns:
        (strength f64[C], covariance f64[C, C]): the posterior mode and its Laplace covariance.
    """
    model = ClipModel() if model is None else model
    owner = np.asarray(owner, np.int64)
    a, b = np.asarray(first, np.int64), np.asarray(second, np.int64)
    y = np.asarray(outcome, np.float64)
    if not (a.shape == b.shape == y.shape):
        raise ValueError(f"first, second and outcome need one shape, got {a.shape}, {b.shape} and {y.shape}")
    c = len(owner)
    precision = np.linalg.inv(prior_covariance(owner, model))
    lapse = model.lapse

    def objective(u):
        s = expit(u[a] - u[b])
        p = lapse + (1.0 - 2.0 * lapse) * s
        dz = (y / p - (1.0 - y) / (1.0 - p)) * (1.0 - 2.0 * lapse) * s * (1.0 - s)
        grad = precision @ u - np.bincount(a, dz, c) + np.bincount(b, dz, c)
        return 0.5 * u @ precision @ u - np.sum(y * np.log(p) + (1.0 - y) * np.log1p(-p)), grad

    u = np.zeros(c)
    if len(a):
        u = minimize(objective, u, jac=True, method="L-BFGS-B", options={"ftol": 1e-12, "gtol": 1e-9}).x
    w = pair_fisher(u, a, b, lapse)
    info = precision.copy()
    np.add.at(info, (a, a), w)
    np.add.at(info, (b, b), w)
    np.add.at(info, (a, b), -w)
    np.add.at(info, (b, a), -w)
    return u, np.linalg.inv(info)
