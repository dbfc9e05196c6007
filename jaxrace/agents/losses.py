"""QR-SAC losses and n-step targets (GT Sophy's critic, as in nnabla-rl's QRSAC), and `make_losses`.

The pure functions' shapes are for one transition; vmap over a batch. K is the number
of quantiles. `make_losses(config, actor, critic)` returns the loss of a
batch of replayed sequences (in the style of brax's SAC `make_losses`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrace.agents.config import HParams, TrainConfig
from jaxrace.agents.networks import Actor, TwinCritic, actor_sequence, sample_action
from jaxrace.agents.replay import Transition, next_frames


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


def lower_tail_mean(quantiles: jax.Array, level: float) -> jax.Array:
    """f32[]: the CVaR of the return at `level` from K quantiles f32[K]: the mean of the lowest
    `level` share of the distribution, each quantile standing for 1/K of it (the one that straddles
    the level counts in part). `level` 1 is the plain mean (risk-neutral). `level` is static."""
    if level >= 1.0:
        return jnp.mean(quantiles)
    mass = level * quantiles.shape[-1]
    weights = jnp.clip(mass - jnp.arange(quantiles.shape[-1], dtype=jnp.float32), 0.0, 1.0) / mass
    return jnp.sum(jnp.sort(quantiles, axis=-1) * weights, axis=-1)


def policy_loss(quantiles_1: jax.Array, quantiles_2: jax.Array, log_prob: jax.Array, alpha: jax.Array,
                cvar: float = 1.0) -> jax.Array:
    """f32[]: alpha log pi(a|s) - min over the critics of the value of a ~ pi(s), the value being
    the mean of the lowest `cvar` share of its quantiles (1: all of them, the expected return)."""
    q = jnp.minimum(lower_tail_mean(quantiles_1, cvar), lower_tail_mean(quantiles_2, cvar))
    return jax.lax.stop_gradient(alpha) * log_prob - q


def action_change(mean: jax.Array, next_mean: jax.Array) -> jax.Array:
    """f32[...]: the squared distance between the evaluation actions (tanh of the means, f32[..., 2])
    at a state and at the state after it (the temporal smoothness term of CAPS)."""
    return jnp.sum(jnp.square(jnp.tanh(next_mean) - jnp.tanh(mean)), axis=-1)


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


class Losses(NamedTuple):
    """Mean losses over a batch of sequences."""

    critic: jax.Array
    actor: jax.Array
    alpha: jax.Array
    max_abs_reward: jax.Array  # of the sampled (unscaled) rewards


def make_losses(config: TrainConfig, actor: Actor, critic: TwinCritic) -> Callable:
    """The loss of a batch of replayed sequences.

    Args:
        config: the trainer's configuration (sequence layout, n-step, recurrence, pixels).
        actor, critic: the networks.

    Returns:
        `loss_fn(nets, target_params, batch, hparams, key) -> Losses`
        with `nets` = (actor_params, critic_params, log_alpha) and `batch` a Transition
        [B, sequence_length]. Every loss stops the gradients it must not send, so their
        sum trains each network on its own loss.
    """
    net = config.network
    pixels = net.actor_input == "pixels"
    burn, trained = config.burn_in_steps, config.trained_steps
    no_reset = jnp.zeros((), bool)

    def actor_step(actor_params, carry, obs, reset):
        return actor.apply(actor_params, carry, obs, reset)

    def actor_over_sequence(actor_params, seq: Transition):
        """The actor's outputs at the trained steps and its state after every step from the burn-in on.

        Returns (mean, log_std) f32[trained, 2] and carries f32[seq_len - burn, G], where
        carries[i] is the state after step burn + i (what the next action is drawn with).
        """
        if not net.recurrent:
            obs = jax.tree.map(lambda x: x[:trained], seq.obs)
            _, (mean, log_std) = jax.vmap(actor_step, in_axes=(None, 0, 0, 0))(
                actor_params, seq.carry[:trained], obs, seq.reset[:trained])
            return mean, log_std, seq.carry[burn:]  # empty states (G = 0)

        carry = seq.carry[0]
        if burn:
            # Burn-in: replay the stored state forward to the first trained step; no gradients.
            carry, _ = actor_sequence(actor, actor_params, carry, *jax.tree.map(lambda x: x[:burn],
                                                                                 (seq.obs, seq.reset)))
            carry = jax.lax.stop_gradient(carry)
        _, (carries, (mean, log_std)) = actor_sequence(actor, actor_params, carry,
                                                       *jax.tree.map(lambda x: x[burn:], (seq.obs, seq.reset)))
        return mean[:trained], log_std[:trained], carries

    def loss_fn(nets, target_params, batch: Transition, hparams: HParams, key) -> Losses:
        """Mean critic, actor and temperature losses over a batch of sequences [B, seq_len]."""
        actor_params, critic_params, log_alpha = nets
        alpha = jnp.exp(log_alpha)
        steps = burn + jnp.arange(trained)

        def one(seq, key):
            k_next, k_pi = jax.random.split(key)
            rewards = seq.reward
            returns, disc, last = n_step_targets(hparams.reward_scale * rewards, seq.terminated, seq.truncated,
                                                 config.n_step, hparams.discount)
            mean, log_std, carries = actor_over_sequence(actor_params, seq)
            obs = jax.tree.map(lambda x: x[steps], seq.obs)
            # Bootstrap from the next observation of each trained step's last n-step transition,
            # with the actor state after that transition.
            boot = last[steps]
            boot_obs = jax.tree.map(lambda x: x[boot], seq.next_obs)
            if pixels:
                boot_obs["pixels"] = next_frames(seq, boot)
            boot_carry = carries[boot - burn] if net.recurrent else carries[:trained]
            _, (next_mean, next_log_std) = jax.vmap(actor_step, in_axes=(None, 0, 0, None))(
                actor_params, boot_carry, boot_obs, no_reset)
            next_action, next_logp = jax.vmap(sample_action)(next_mean, next_log_std,
                                                             jax.random.split(k_next, trained))
            next_q = critic.apply(target_params, boot_obs, next_action)  # [2, trained, K]
            target = jax.vmap(critic_target, in_axes=(0, 0, 0, 0, 0, None))(
                next_q[0], next_q[1], next_logp, returns[steps], disc[steps], jax.lax.stop_gradient(alpha))
            q = critic.apply(critic_params, obs, seq.action[steps])
            critic_loss = jnp.mean(jax.vmap(quantile_huber_loss)(q[0], target)
                                   + jax.vmap(quantile_huber_loss)(q[1], target))
            action, logp = jax.vmap(sample_action)(mean, log_std, jax.random.split(k_pi, trained))
            q_pi = critic.apply(jax.lax.stop_gradient(critic_params), obs, action)  # trains the actor only
            actor_loss = jnp.mean(jax.vmap(functools.partial(policy_loss, cvar=config.actor_cvar),
                                           in_axes=(0, 0, 0, None))(q_pi[0], q_pi[1], logp, alpha))
            if config.action_smoothness:
                # The actor at each trained step's next observation, with its state after that step.
                next_obs = jax.tree.map(lambda x: x[steps], seq.next_obs)
                if pixels:
                    next_obs["pixels"] = next_frames(seq, steps)
                _, (after_mean, _) = jax.vmap(actor_step, in_axes=(None, 0, 0, None))(
                    actor_params, carries[:trained], next_obs, no_reset)
                actor_loss += config.action_smoothness * jnp.mean(action_change(mean, after_mean))
            alpha_loss = jnp.mean(jax.vmap(temperature_loss, in_axes=(None, 0, None))(
                log_alpha, logp, hparams.target_entropy))
            return critic_loss, actor_loss, alpha_loss, jnp.max(jnp.abs(rewards))

        b = batch.action.shape[0]
        critic_losses, actor_losses, alpha_losses, max_rewards = jax.vmap(one)(batch, jax.random.split(key, b))
        return Losses(critic=jnp.mean(critic_losses), actor=jnp.mean(actor_losses), alpha=jnp.mean(alpha_losses),
                      max_abs_reward=jnp.max(max_rewards))

    return loss_fn
