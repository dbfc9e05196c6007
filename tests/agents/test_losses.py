"""QR-SAC losses and n-step targets against slow, obvious references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrace.agents.losses import (
    critic_target,
    huber,
    lower_tail_mean,
    n_step_targets,
    policy_loss,
    quantile_huber_loss,
    quantile_midpoints,
    temperature_loss,
)


def test_quantile_midpoints():
    np.testing.assert_allclose(quantile_midpoints(4), [0.125, 0.375, 0.625, 0.875])
    assert quantile_midpoints(32).shape == (32,)


def slow_quantile_huber(pred, target, kappa):
    k = len(pred)
    total = 0.0
    for i in range(k):
        tau = (2 * (i + 1) - 1) / (2 * k)
        acc = 0.0
        for y in target:
            u = y - pred[i]
            h = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
            acc += abs(tau - (1.0 if u < 0 else 0.0)) * h / kappa
        total += acc / len(target)
    return total


@pytest.mark.parametrize("kappa", [1.0, 0.5])
def test_quantile_huber_loss_matches_a_slow_reference(kappa):
    rng = np.random.default_rng(0)
    for k, k2 in [(4, 4), (5, 3), (32, 32)]:
        pred = rng.normal(scale=2.0, size=k).astype(np.float32)
        target = rng.normal(scale=2.0, size=k2).astype(np.float32)
        got = quantile_huber_loss(jnp.asarray(pred), jnp.asarray(target), kappa)
        np.testing.assert_allclose(got, slow_quantile_huber(pred, target, kappa), rtol=1e-5)


def test_quantile_loss_is_minimised_by_the_targets_quantiles():
    # With many target samples, the minimiser of each quantile's loss is that quantile.
    target = jnp.asarray(np.random.default_rng(1).normal(size=4001), jnp.float32)
    grad = jax.grad(quantile_huber_loss)
    pred = jax.jit(lambda p: jax.lax.fori_loop(0, 3000, lambda _, p: p - 0.5 * grad(p, target, 0.05), p))(
        jnp.zeros(4))
    np.testing.assert_allclose(pred, np.quantile(np.asarray(target), [0.125, 0.375, 0.625, 0.875]), atol=0.05)


def test_huber():
    np.testing.assert_allclose(huber(jnp.array([-3.0, -0.5, 0.0, 0.5, 3.0]), 1.0), [2.5, 0.125, 0.0, 0.125, 2.5])


def test_critic_target_uses_the_critic_with_the_lower_mean_and_no_gradient():
    q1 = jnp.array([1.0, 2.0, 3.0])  # mean 2
    q2 = jnp.array([0.0, 1.0, 6.0])  # mean 7/3
    got = critic_target(q1, q2, jnp.float32(-1.0), jnp.float32(0.5), jnp.float32(0.9), jnp.float32(0.2))
    np.testing.assert_allclose(got, 0.5 + 0.9 * (np.array([1.0, 2.0, 3.0]) + 0.2), rtol=1e-6)
    got2 = critic_target(q2 + 1.0, q1, jnp.float32(0.0), jnp.float32(0.0), jnp.float32(1.0), jnp.float32(0.0))
    np.testing.assert_allclose(got2, q1)
    assert float(jax.grad(lambda q: critic_target(q, q2, 0.0, 0.0, 1.0, 0.1).sum())(q1).sum()) == 0.0
    # After a termination the discount is 0: the target is the reward alone.
    np.testing.assert_allclose(critic_target(q1, q2, 3.0, 1.5, 0.0, 0.2), 1.5)


def test_lower_tail_mean_is_the_cvar_of_the_quantiles_and_its_gradient_reaches_only_the_tail():
    q = jnp.array([5.0, -1.0, 3.0, 0.0])  # unsorted, as a critic's outputs may be
    assert float(lower_tail_mean(q, 1.0)) == pytest.approx(1.75)
    assert float(lower_tail_mean(q, 0.5)) == pytest.approx(-0.5)  # -1 and 0
    assert float(lower_tail_mean(q, 0.75)) == pytest.approx(2.0 / 3.0)
    assert float(lower_tail_mean(q, 0.1)) == pytest.approx(-1.0)  # inside the lowest quantile
    assert float(lower_tail_mean(q, 0.375)) == pytest.approx((-1.0 + 0.5 * 0.0) / 1.5)  # half of the second
    np.testing.assert_allclose(jax.grad(lower_tail_mean)(q, 0.5), [0.0, 0.5, 0.0, 0.5])
    # The risk-averse policy loss takes the lower tail of each critic, then the lower critic.
    q1, q2 = jnp.array([1.0, 3.0]), jnp.array([0.0, 2.0])
    # means 2 and 1 (critic 2 is lower); tails 1 and 0: still critic 2, value 0.
    assert float(policy_loss(q1, q2, jnp.float32(-2.0), jnp.float32(0.5), cvar=0.5)) == pytest.approx(-1.0 - 0.0)
    q3 = jnp.array([-4.0, 10.0])  # mean 3 > critic 1's 2, but its tail -4 is lower
    assert float(policy_loss(q1, q3, jnp.float32(0.0), jnp.float32(0.5))) == pytest.approx(-2.0)
    assert float(policy_loss(q1, q3, jnp.float32(0.0), jnp.float32(0.5), cvar=0.5)) == pytest.approx(4.0)


def test_policy_and_temperature_losses():
    q1, q2 = jnp.array([1.0, 3.0]), jnp.array([0.0, 2.0])
    assert float(policy_loss(q1, q2, jnp.float32(-2.0), jnp.float32(0.5))) == pytest.approx(-1.0 - 1.0)
    # The temperature rises (log_alpha's gradient is negative) when entropy is below target.
    g = jax.grad(temperature_loss)(jnp.float32(0.0), jnp.float32(1.0), jnp.float32(-2.0))
    assert float(g) == pytest.approx(1.0)
    g = jax.grad(temperature_loss)(jnp.float32(0.0), jnp.float32(3.0), jnp.float32(-2.0))
    assert float(g) < 0


def slow_n_step(rewards, terminated, truncated, n, gamma):
    t_len = len(rewards)
    out = []
    for t in range(t_len):
        ret, disc, last = 0.0, 1.0, t
        for i in range(n):
            j = t + i
            if j >= t_len:
                break
            ret += disc * rewards[j]
            disc *= gamma
            last = j
            if terminated[j] or truncated[j]:
                break
        out.append((ret, 0.0 if terminated[last] else disc, last))
    return out


@pytest.mark.parametrize("n", [1, 3, 7])
def test_n_step_targets_match_a_slow_reference_with_terminations_and_truncations(n):
    rng = np.random.default_rng(n)
    t_len = 30
    rewards = rng.normal(size=t_len).astype(np.float32)
    terminated = np.zeros(t_len, bool)
    truncated = np.zeros(t_len, bool)
    terminated[[5, 17]] = True
    truncated[[11, 24]] = True
    got = n_step_targets(jnp.asarray(rewards), jnp.asarray(terminated), jnp.asarray(truncated), n, 0.9)
    want = slow_n_step(rewards, terminated, truncated, n, 0.9)
    np.testing.assert_allclose(got[0], [w[0] for w in want], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], [w[1] for w in want], rtol=1e-6)
    np.testing.assert_array_equal(got[2], [w[2] for w in want])
    # Termination stops bootstrapping; truncation keeps it.
    assert float(got[1][5]) == 0.0 and float(got[1][11]) == pytest.approx(0.9)


def test_n_step_rejects_bad_n():
    with pytest.raises(ValueError, match="at least 1"):
        n_step_targets(jnp.zeros(3), jnp.zeros(3, bool), jnp.zeros(3, bool), 0, 0.9)


def test_quantile_loss_vmaps_over_a_batch():
    pred = jnp.asarray(np.random.default_rng(2).normal(size=(6, 8)), jnp.float32)
    target = jnp.asarray(np.random.default_rng(3).normal(size=(6, 8)), jnp.float32)
    batched = jax.vmap(quantile_huber_loss)(pred, target)
    for i in range(6):
        np.testing.assert_allclose(batched[i], quantile_huber_loss(pred[i], target[i]), rtol=1e-6)
