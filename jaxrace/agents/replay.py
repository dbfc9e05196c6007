"""Replay of transitions (observations, actions, the run's rewards) and their sequences.

Rewards are computed once, when a rollout is labelled (`Trainer.label`); the RaceViews
they came from are not stored. The buffer is flashbax's trajectory buffer, sampled as
sequences of `TrainConfig.sequence_length` steps, uniformly or, with
`TrainConfig.penalty_replay`, with a share of each batch drawn from the sequences that
hold the lowest rewards (`make_sampler`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flashbax
import jax
import jax.numpy as jnp

from jaxrace.agents.config import TrainConfig


class Transition(NamedTuple):
    """One env step of one env, as stored in replay."""

    obs: dict
    action: jax.Array  # f32[2]
    reward: jax.Array  # f32: the run's reward (0 until the rollout is labelled)
    next_obs: dict  # the true next observation (the final one at an episode end), without pixels
    terminated: jax.Array
    truncated: jax.Array
    carry: jax.Array  # f32[G] the actor's GRU state before this step (G = 0 without a GRU)
    reset: jax.Array  # bool: the first step of an episode (the actor zeroes `carry`)


def make_replay(config: TrainConfig):
    """The flashbax trajectory buffer of a trainer: `config.num_envs` envs add, sequences are sampled."""
    n, seq_len = config.num_envs, config.sequence_length
    return flashbax.make_trajectory_buffer(
        add_batch_size=n, sample_batch_size=config.batch_size, sample_sequence_length=seq_len, period=1,
        min_length_time_axis=max(seq_len, config.rollout_steps),
        max_length_time_axis=max(config.replay_size // n, config.rollout_steps + seq_len))


PENALTY_POOL = 4  # uniform candidates drawn per penalty-ranked place in a batch


def make_sampler(config: TrainConfig, buffer=None):
    """`sample(replay, key) -> Transition [batch_size, sequence_length]` for a trainer's buffer.

    Without `config.penalty_replay`, flashbax's uniform sample, key for key. With a share
    p > 0, the first `round((1 - p) * batch_size)` sequences are uniform and the other k are
    the k with the lowest reward anywhere in them among `PENALTY_POOL * k` uniform candidates:
    a contact's or a course-out's large penalty is rare in replay, and this makes the
    updates see the states just before one about PENALTY_POOL times as often, whatever the
    reward program. The targets are unchanged (no importance weights: each sequence still
    regresses to its own n-step return); only where the networks spend their fit moves.
    Shapes are static (top-k over a fixed pool).
    """
    buffer = buffer if buffer is not None else make_replay(config)
    if not config.penalty_replay:
        return lambda replay, key: buffer.sample(replay, key).experience
    ranked = max(1, round(config.penalty_replay * config.batch_size))
    uniform = make_replay(dataclasses.replace(config, batch_size=config.batch_size - ranked)) \
        if ranked < config.batch_size else None
    pool = make_replay(dataclasses.replace(config, batch_size=PENALTY_POOL * ranked))

    def sample(replay, key):
        k_uniform, k_pool = jax.random.split(key)
        candidates = pool.sample(replay, k_pool).experience  # [PENALTY_POOL * ranked, S]
        _, worst = jax.lax.top_k(-jnp.min(candidates.reward, axis=1), ranked)
        picked = jax.tree.map(lambda x: x[worst], candidates)
        if uniform is None:
            return picked
        drawn = uniform.sample(replay, k_uniform).experience
        return jax.tree.map(lambda a, b: jnp.concatenate([a, b]), drawn, picked)

    return sample


def next_frames(seq: Transition, steps: jax.Array) -> jax.Array:
    """uint8[len(steps), H, W, 3]: the image after each step of a sequence [S].

    The image after a step is the next step's; after an episode end, whose final image
    is not rendered, it is the last image of the episode.
    """
    seq_len = seq.action.shape[0]
    ended = (seq.terminated | seq.truncated)[steps]
    following = jnp.minimum(steps + 1, seq_len - 1)
    frames = seq.obs["pixels"]
    return jnp.where(ended[:, None, None, None], frames[steps], frames[following])
