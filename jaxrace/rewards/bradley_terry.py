"""Bradley-Terry ranking from pairwise outcomes, regularised so every score is finite.

Model: P(i beats j) = p_i / (p_i + p_j), scores s_i = log p_i. The prior adds `prior`
pseudo-wins and `prior` pseudo-losses for every item against a virtual reference item of
strength 1, so an unbeaten item, an item never compared, or a comparison graph in
several pieces still gets a finite score (pulled towards the reference). Fitted by
Hunter's (2004) MM iteration; standard errors from the inverse Hessian of the penalised
negative log-likelihood, for the scores after centring to mean zero.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrace.jit import jit


def win_matrix(winners: jax.Array, losers: jax.Array, num_items: int, ties: jax.Array | None = None) -> jax.Array:
    """f32[K, K]: W[i, j] = wins of i over j, a tie counting half a win to each side."""
    winners = jnp.asarray(winners, jnp.int32)
    losers = jnp.asarray(losers, jnp.int32)
    tie = jnp.zeros(winners.shape, jnp.float32) if ties is None else jnp.asarray(ties, jnp.float32)
    w = jnp.zeros((num_items, num_items), jnp.float32)
    w = w.at[winners, losers].add(1.0 - 0.5 * tie)
    return w.at[losers, winners].add(0.5 * tie)


def fit_labels(first, second, labels, num_items: int) -> tuple[jax.Array, jax.Array]:
    """`bradley_terry` of judged pairs: item indices shown first and second, labels first|second|tie|skip.

    Skips are left out; a tie counts half a win each way.
    """
    kept = [(a, b, lab) for a, b, lab in zip(first, second, labels, strict=True) if lab != "skip"]
    winners = [b if lab == "second" else a for a, b, lab in kept]
    losers = [a if lab == "second" else b for a, b, lab in kept]
    return bradley_terry(jnp.asarray(winners, jnp.int32), jnp.asarray(losers, jnp.int32), num_items,
                         jnp.asarray([lab == "tie" for _, _, lab in kept], bool))


def rank_named(first: list[str], second: list[str], labels: list[str]) -> list[dict]:
    """`fit_labels` of judged pairs of named items (host-side): one row per item, strongest first, with
    its log-strength, standard error, games (skips left out) and wins (a tie counts half)."""
    names = sorted(set(first) | set(second))
    if not names:
        return []
    index = {n: i for i, n in enumerate(names)}
    scores, stderr = fit_labels([index[a] for a in first], [index[b] for b in second], labels, len(names))
    games = {n: 0 for n in names}
    wins = {n: 0.0 for n in names}
    for a, b, lab in zip(first, second, labels, strict=True):
        if lab == "skip":
            continue
        games[a] += 1
        games[b] += 1
        if lab == "tie":
            wins[a] += 0.5
            wins[b] += 0.5
        else:
            wins[a if lab == "first" else b] += 1.0
    rows = [{"name": n, "score": float(scores[i]), "stderr": float(stderr[i]), "games": games[n], "wins": wins[n]}
            for n, i in index.items()]
    return sorted(rows, key=lambda r: -r["score"])


def bradley_terry(winners: jax.Array, losers: jax.Array, num_items: int, ties: jax.Array | None = None,
                  prior: float = 1.0, *, max_iter: int = 1000, tol: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """Scores and standard errors of K items from G pairwise outcomes.

    Args:
        winners, losers: i32[G] item indices in [0, K) (for a tie, either order).
        num_items: K (static).
        ties: bool[G] or None; a tie counts as half a win for each side.
        prior: pseudo-wins (and pseudo-losses) of every item against a reference of
            strength 1; must be > 0 for scores to exist without full connectivity.
        max_iter, tol: MM iterations stop when no log-strength moves by more than tol.

    Returns:
        (scores f32[K], stderr f32[K]): log-strengths with mean zero, and their
        standard errors.
    """
    if not isinstance(num_items, int) or num_items < 1:
        raise ValueError(f"num_items must be a positive int, got {num_items!r}")
    if jnp.shape(winners) != jnp.shape(losers) or jnp.ndim(winners) != 1:
        raise ValueError(f"winners and losers must be 1-D and the same length, got {jnp.shape(winners)} "
                         f"and {jnp.shape(losers)}")
    if ties is not None and jnp.shape(ties) != jnp.shape(winners):
        raise ValueError(f"ties must match winners' shape {jnp.shape(winners)}, got {jnp.shape(ties)}")
    if isinstance(prior, int | float) and not prior > 0:
        raise ValueError(f"prior must be > 0 (pseudo-counts keep the scores finite), got {prior}")
    return _fit(winners, losers, num_items, ties, prior, max_iter, tol)


@functools.partial(jit, static_argnames=("num_items", "max_iter"))
def _fit(winners, losers, num_items, ties, prior, max_iter, tol):
    w = win_matrix(winners, losers, num_items, ties)
    games = w + w.T
    wins = jnp.sum(w, axis=1) + prior

    def update(p):
        denom = jnp.sum(games / (p[:, None] + p[None, :]), axis=1) + 2.0 * prior / (p + 1.0)
        return wins / denom  # the reference's strength stays 1: it pins the scale

    def cond(carry):
        i, _, delta = carry
        return (i < max_iter) & (delta > tol)

    def body(carry):
        i, p, _ = carry
        p_new = update(p)
        return i + 1, p_new, jnp.max(jnp.abs(jnp.log(p_new) - jnp.log(p)))

    _, p, _ = jax.lax.while_loop(cond, body, (0, jnp.ones((num_items,), jnp.float32), jnp.inf))
    return jnp.log(p) - jnp.mean(jnp.log(p)), _stderr(jnp.log(p), games, prior)


def _stderr(theta: jax.Array, games: jax.Array, prior: float) -> jax.Array:
    sigma = jax.nn.sigmoid(theta[:, None] - theta[None, :])
    info = games * sigma * (1.0 - sigma)
    sigma_ref = jax.nn.sigmoid(theta)
    hessian = jnp.diag(jnp.sum(info, axis=1) + 2.0 * prior * sigma_ref * (1.0 - sigma_ref)) - info
    k = theta.shape[0]
    centre = jnp.eye(k) - 1.0 / k
    cov = centre @ jnp.linalg.inv(hessian) @ centre.T
    return jnp.sqrt(jnp.maximum(jnp.diag(cov), 0.0))
