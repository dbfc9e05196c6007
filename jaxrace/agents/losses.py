"""QR-SAC losses and n-step targets as pure functions (GT Sophy's critic, as in nnabla-rl's QRSAC).

Shapes are for one transition; vmap over a batch. K is the number of quantiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def quantile_midpoints(num_quantiles: int) -> jax.Array:
    """f32[K]: tau_k = (2k - 1) / (2K), k = 1..K."""
    return (2.0 * jnp.arange(1, num_quantiles + 1, dtype=jnp.float32) - 1.0) / (2.0 * num_quantiles)


def huber(u: jax.Array, kappa: float = 1.0) -> jax.Array:
    """Elementwise Huber loss: u^2 / 2 inside [-kappa, kappa], kappa (|u| - kappa / 2) outside."""
    a = jnp.abs(u)
    return jnp.where(a <= kappa, 0.5 * u * u, kappa * (a - 0.5 * kappa))


def quantile_huber_loss(pred: jax.Array, target: jax.Array, kappa: float = 1.0) -> jax.Array:
    """The quantile regression loss of predicted quantiles against target samples.

    Args:
        pred: f32[K], the critic's quantiles at the midpoints tau_k.
        target: f32[K'], target quantile values (treated as samples; no gradient flows
            through them here, stop it at the caller).
        kappa: the Huber threshold.

    Returns:
        f32[]: sum over k of the mean over k' of |tau_k - 1{u < 0}| huber(u) / kappa,
        with u = target[k'] - pred[k].
    """
    taus = quantile_midpoints(pred.shape[-1])
    u = target[None, :] - pred[:, None]  # [K, K']
    weight = jnp.abs(taus[:, None] - (u < 0).astype(jnp.float32))
    return jnp.sum(jnp.mean(weight * huber(u, kappa) / kappa, axis=1))


def critic_target(next_quantiles_1: jax.Array, next_quantiles_2: jax.Array, next_log_prob: jax.Array,
                  reward: jax.Array, discount: jax.Array, alpha: jax.Array) -> jax.Array:
    """f32[K]: the QR-SAC target quantiles, without gradient.

    The target critic whose quantile mean is lower gives the next-state quantiles (a
    clipped double-Q for distributions), minus alpha log pi of the next action;
    `discount` is gamma^n for an n-step return, and 0 after a termination (a
    truncation bootstraps).
    """
    lower_first = jnp.mean(next_quantiles_1) <= jnp.mean(next_quantiles_2)
    next_q = jnp.where(lower_first, next_quantiles_1, next_quantiles_2)
    return jax.lax.stop_gradient(reward + discount * (next_q - alpha * next_log_prob))


def policy_loss(quantiles_1: jax.Array, quantiles_2: jax.Array, log_prob: jax.Array, alpha: jax.Array) -> jax.Array:
    """f32[]: alpha log pi(a|s) - min over the critics of the mean of quantiles, a ~ pi(s)."""
    q = jnp.minimum(jnp.mean(quantiles_1), jnp.mean(quantiles_2))
    return jax.lax.stop_gradient(alpha) * log_prob - q


def temperature_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: jax.Array) -> jax.Array:
    """f32[]: tunes alpha so that the policy's entropy tracks `target_entropy`."""
    return -log_alpha * jax.lax.stop_gradient(log_prob + target_entropy)


def n_step_targets(rewards: jax.Array, terminated: jax.Array, truncated: jax.Array, n: int,
                   gamma: float | jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """n-step returns for every start step of a window of T transitions.

    Step t's return sums gamma^i r_{t+i} for i < m, where m <= n stops at the end of
    the episode (a terminated or truncated step, included) or of the window. It
    bootstraps from the observation after step t + m - 1 with discount gamma^m, unless
    the episode terminated there (discount 0). Truncation by time limit bootstraps.

    Args:
        rewards: f32[T]; terminated, truncated: bool[T] (flags of each transition).
        n: static, at least 1.

    Returns:
        (returns f32[T], discount f32[T], bootstrap_step i32[T]): bootstrap from the
        next observation of transition `bootstrap_step`.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    t_len = rewards.shape[0]
    ends = terminated | truncated
    steps = jnp.arange(t_len)

    def one(t):
        returns, discount, alive, last = jnp.float32(0.0), jnp.float32(1.0), jnp.bool_(True), t
        for i in range(n):
            j = t + i
            inside = alive & (j < t_len)
            jc = jnp.minimum(j, t_len - 1)
            returns = returns + jnp.where(inside, discount * rewards[jc], 0.0)
            discount = jnp.where(inside, discount * gamma, discount)
            last = jnp.where(inside, jc, last)
            alive = inside & ~ends[jc]
        return returns, jnp.where(terminated[last], 0.0, discount), last

    return jax.vmap(one)(steps)
