import os
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrace.agents.networks import (
    Actor,
    NetworkConfig,
    TwinCritic,
    action_distribution,
    actor_sequence,
    initial_carry,
    one_key_at_a_time,
)

PROPRIO, PRIVILEGED = 20, 150


def observations(batch=(), pixels=False, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    obs = {"proprio": jax.random.normal(k1, (*batch, PROPRIO)),
           "privileged": jax.random.normal(k2, (*batch, PRIVILEGED))}
    if pixels:
        obs["pixels"] = jax.random.randint(k3, (*batch, 64, 64, 3), 0, 256).astype(jnp.uint8)
    return obs


@pytest.mark.parametrize("actor_input, recurrent", [("state", True), ("state", False), ("pixels", True)])
def test_actor_and_critic_shapes(actor_input, recurrent):
    config = NetworkConfig(actor_input=actor_input, recurrent=recurrent, hidden=32, gru_size=16, num_quantiles=8,
                           cnn_channels=(8, 8))
    obs = observations((5,), pixels=actor_input == "pixels")
    actor = Actor(config)
    carry = initial_carry(config, (5,))
    params = jax.jit(actor.init)(jax.random.key(0), carry, obs, jnp.zeros(5, bool))
    new_carry, (mean, log_std) = jax.jit(actor.apply)(params, carry, obs, jnp.zeros(5, bool))
    assert new_carry.shape == (5, config.carry_size) and mean.shape == (5, 2) and log_std.shape == (5, 2)
    assert config.carry_size == (16 if recurrent else 0)
    assert np.all(np.asarray(log_std) >= -5.0) and np.all(np.asarray(log_std) <= 2.0)
    if not recurrent:
        np.testing.assert_array_equal(new_carry, carry)
    critic = TwinCritic(config)
    cparams = jax.jit(critic.init)(jax.random.key(1), obs, mean)
    q = jax.jit(critic.apply)(cparams, obs, mean)
    assert q.shape == (2, 5, 8)
    assert not np.allclose(q[0], q[1])  # two independently initialised critics


def test_asymmetric_critic_ignores_pixels_and_symmetric_reads_them():
    obs = observations((3,), pixels=True)
    other = dict(obs, pixels=255 - obs["pixels"])
    action = jnp.zeros((3, 2))
    for symmetric in (False, True):
        config = NetworkConfig(actor_input="pixels", symmetric=symmetric, hidden=16, num_quantiles=4,
                               cnn_channels=(4,))
        critic = TwinCritic(config)
        params = jax.jit(critic.init)(jax.random.key(0), obs, action)
        apply = jax.jit(critic.apply)
        same = np.allclose(apply(params, obs, action), apply(params, other, action))
        assert same != symmetric


def test_gru_reset_zeroes_the_carry():
    config = NetworkConfig(hidden=16, gru_size=8)
    actor = Actor(config)
    obs = observations((2,))
    params = actor.init(jax.random.key(0), initial_carry(config, (2,)), obs, jnp.zeros(2, bool))
    warm = jnp.ones((2, 8))
    reset_out = actor.apply(params, warm, obs, jnp.array([True, False]))
    fresh_out = actor.apply(params, initial_carry(config, (2,)), obs, jnp.zeros(2, bool))
    np.testing.assert_allclose(reset_out[1][0][0], fresh_out[1][0][0], rtol=1e-6)
    assert not np.allclose(reset_out[1][0][1], fresh_out[1][0][1])


def test_sequence_actor_equals_stepping_by_hand():
    config = NetworkConfig(hidden=16, gru_size=8)
    t, b = 6, 3
    obs = observations((t, b))
    reset = jnp.zeros((t, b), bool).at[3, 1].set(True)
    actor = Actor(config)
    params = actor.init(jax.random.key(0), initial_carry(config, (b,)), jax.tree.map(lambda x: x[0], obs), reset[0])
    carry, (carries, (means, _)) = actor_sequence(actor, params, initial_carry(config, (b,)), obs, reset)
    assert carries.shape == (t, b, 8)
    c = initial_carry(config, (b,))
    for i in range(t):
        c, (m, _) = actor.apply(params, c, jax.tree.map(lambda x, i=i: x[i], obs), reset[i])
        np.testing.assert_allclose(means[i], m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(carries[i], c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(carry, c, rtol=1e-5, atol=1e-6)


def test_the_carry_is_empty_without_a_gru():
    config = NetworkConfig(hidden=16, recurrent=False)
    assert config.carry_size == 0 and initial_carry(config, (3,)).shape == (3, 0)


def test_tanh_gaussian_log_prob_is_the_change_of_variables():
    mean, log_std = jnp.array([0.3, -0.5]), jnp.array([-0.2, 0.1])
    dist = action_distribution(mean, log_std)
    a, logp = dist.sample_and_log_prob(seed=jax.random.key(0))
    assert np.all(np.abs(np.asarray(a)) < 1)
    u = np.arctanh(np.asarray(a, np.float64))
    std = np.exp(np.asarray(log_std, np.float64))
    normal = -0.5 * ((u - np.asarray(mean)) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    want = np.sum(normal - np.log(1 - np.tanh(u) ** 2))
    np.testing.assert_allclose(logp, want, rtol=1e-4)


def test_one_key_at_a_time_draws_flax_orthogonal_values_under_nested_vmaps():
    orthogonal = nn.initializers.orthogonal()
    safe = one_key_at_a_time(orthogonal)
    keys = jax.random.split(jax.random.key(5), 6)
    expected = jax.vmap(lambda k: orthogonal(k, (48, 32)))(keys)
    np.testing.assert_array_equal(jax.jit(jax.vmap(lambda k: safe(k, (48, 32))))(keys), expected)
    nested = jax.jit(jax.vmap(jax.vmap(lambda k: safe(k, (48, 32)))))(keys.reshape(2, 3))
    np.testing.assert_array_equal(nested.reshape(6, 48, 32), expected)
    np.testing.assert_array_equal(safe(keys[4], (48, 32)), expected[4])
    assert nested.dtype == jnp.float32
    # The actor's GRU draws its recurrent kernels through it: orthogonal columns.
    config = NetworkConfig(hidden=16, gru_size=24)
    params = jax.vmap(lambda k: Actor(config).init(k, initial_carry(config, (1,)), observations((1,)),
                                                   jnp.zeros(1, bool)))(keys[:2])
    kernel = params["params"]["GRUCell_0"]["hn"]["kernel"]
    assert kernel.shape == (2, 24, 24)
    np.testing.assert_allclose(np.einsum("rij,rik->rjk", kernel, kernel), np.broadcast_to(np.eye(24), (2, 24, 24)),
                               atol=1e-5)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs 2 cores to pin")
def test_vmapped_orthogonal_initialisations_finish_on_two_cores():
    # jaxlib 0.10's batched CPU QR blocks a pool thread per call: with flax's initializer
    # this job hung in 5 of 6 tries (batched_qr_job.py 0 1 flax).
    two_cores = sorted(os.sched_getaffinity(0))[:2]
    job = Path(__file__).with_name("batched_qr_job.py")
    try:
        out = subprocess.run([sys.executable, str(job), *map(str, two_cores)], capture_output=True, text=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("8 vmapped orthogonal initialisations did not finish in 120 s on 2 cores: the batched "
                    "LAPACK QR deadlock is back")
    assert out.returncode == 0 and out.stdout.strip() == "finished", out.stdout + out.stderr
