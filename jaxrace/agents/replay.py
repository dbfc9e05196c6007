"""Replay of transitions (observations, actions, the run's rewards) and their sequences.

Rewards are computed once, when a rollout is labelled (`Trainer.label`); the RaceViews
they came from are not stored. The buffer is flashbax's trajectory buffer, sampled as
sequences of `TrainConfig.sequence_length` steps.
"""

from __future__ import annotations

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
