"""Replay sampling: uniform, and penalty-enriched (`TrainConfig.penalty_replay`)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrace.agents import TrainConfig
from jaxrace.agents.replay import PENALTY_POOL, Transition, make_replay, make_sampler

CONFIG = TrainConfig(num_envs=4, rollout_steps=8, batch_size=16, replay_size=400, n_step=3)
PENALTY = -100.0


def filled_replay(config: TrainConfig, steps: int = 100):
    """A buffer of 4 envs x `steps` steps whose rewards are 0 but at a few steps, PENALTY."""
    one = Transition(obs={"x": jnp.zeros(2)}, action=jnp.zeros(2), reward=jnp.float32(0.0),
                     next_obs={"x": jnp.zeros(2)}, terminated=jnp.bool_(False), truncated=jnp.bool_(False),
                     carry=jnp.zeros(0), reset=jnp.bool_(False))
    buffer = make_replay(config)
    index = jnp.arange(4 * steps, dtype=jnp.float32).reshape(4, steps)
    reward = jnp.where(jnp.arange(4 * steps).reshape(4, steps) % 53 == 7, PENALTY, 0.0)
    traj = Transition(obs={"x": jnp.stack([index, -index], -1)}, action=jnp.zeros((4, steps, 2)), reward=reward,
                      next_obs={"x": jnp.zeros((4, steps, 2))}, terminated=jnp.zeros((4, steps), bool),
                      truncated=jnp.zeros((4, steps), bool), carry=jnp.zeros((4, steps, 0)),
                      reset=jnp.zeros((4, steps), bool))
    return buffer.add(buffer.init(one), traj)


def test_uniform_replay_is_flashbaxs_sample_key_for_key():
    """penalty_replay = 0 (the default) samples as the trainer always did, so old runs repeat."""
    replay, key = filled_replay(CONFIG), jax.random.key(3)
    ours = make_sampler(CONFIG)(replay, key)
    theirs = make_replay(CONFIG).sample(replay, key).experience
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_penalty_replay_fills_its_share_with_the_lowest_reward_sequences_of_a_uniform_pool():
    """A quarter of 16: the last 4 sequences are the 4 with the lowest reward among 16 uniform
    candidates, the first 12 a uniform sample; shapes and dtypes are the uniform sampler's."""
    config = dataclasses.replace(CONFIG, penalty_replay=0.25)
    replay, key = filled_replay(config), jax.random.key(5)
    batch = jax.jit(make_sampler(config))(replay, key)
    plain = make_sampler(CONFIG)(replay, key)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), batch) == jax.tree.map(lambda x: (x.shape, x.dtype), plain)
    assert batch.reward.shape == (16, config.sequence_length)
    k_uniform, k_pool = jax.random.split(key)
    uniform = make_replay(dataclasses.replace(CONFIG, batch_size=12)).sample(replay, k_uniform).experience
    pool = make_replay(dataclasses.replace(CONFIG, batch_size=PENALTY_POOL * 4)).sample(replay, k_pool).experience
    np.testing.assert_array_equal(batch.obs["x"][:12], uniform.obs["x"])
    lowest = np.sort(np.min(np.asarray(pool.reward), axis=1))[:4]
    np.testing.assert_array_equal(np.sort(np.min(np.asarray(batch.reward[12:]), axis=1)), lowest)
    # every picked sequence is one of the pool's (its observations travel with its rewards)
    pool_rows = {tuple(np.asarray(r).ravel()) for r in pool.obs["x"]}
    assert all(tuple(np.asarray(r).ravel()) in pool_rows for r in batch.obs["x"][12:])


def test_penalty_replay_samples_the_penalised_sequences_more_often():
    """Over 40 keys, sequences holding a penalty (1 step in 53) fill the enriched batches at
    least 1.8x as often as uniform ones (exact counts under these keys)."""
    config = dataclasses.replace(CONFIG, penalty_replay=0.25)
    replay = filled_replay(config)
    keys = jax.random.split(jax.random.key(11), 40)
    counts = []
    for sampler in (make_sampler(CONFIG), make_sampler(config)):
        batches = jax.jit(jax.vmap(sampler, in_axes=(None, 0)))(replay, keys)
        counts.append(int(np.sum(np.min(np.asarray(batches.reward), axis=-1) == PENALTY)))
    uniform, enriched = counts
    assert uniform > 0
    assert enriched >= 1.8 * uniform, (uniform, enriched)


def test_a_whole_batch_of_ranked_sequences_and_bad_shares():
    """penalty_replay = 1: every sequence is ranked; a share outside [0, 1] is refused."""
    config = dataclasses.replace(CONFIG, penalty_replay=1.0)
    batch = make_sampler(config)(filled_replay(config), jax.random.key(0))
    assert batch.reward.shape == (16, config.sequence_length)
    for share in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"penalty_replay must be in \[0, 1\]"):
            TrainConfig(penalty_replay=share)
