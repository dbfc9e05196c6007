"""The XLA:CPU rewrites mean exactly what their numpy namesakes mean."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrace.envs.xla_cpu import any_last, materialised, smallest_k, sum_last


def test_sum_and_any_over_the_last_axis():
    x = jax.random.normal(jax.random.key(0), (5, 3, 4))
    np.testing.assert_allclose(sum_last(x), np.asarray(x).sum(-1), rtol=1e-6)
    b = x > 0.5
    np.testing.assert_array_equal(sum_last(b), np.asarray(b).sum(-1))
    assert sum_last(b).dtype == jnp.int32
    np.testing.assert_array_equal(any_last(b), np.asarray(b).any(-1))


@pytest.mark.parametrize("k", [1, 2, 5])
def test_smallest_k_matches_top_k_with_ties_and_infinities(k):
    rng = np.random.default_rng(0)
    values = rng.integers(0, 4, (200, 8)).astype(np.float32)  # many ties
    values[rng.random((200, 8)) < 0.3] = np.inf  # absent cars
    values[:5] = np.inf  # rows with nothing present at all
    expected = jax.lax.top_k(-jnp.asarray(values), k)[1]
    got = jax.jit(smallest_k, static_argnums=1)(jnp.asarray(values), k)
    assert got.dtype == jnp.int32 and got.shape == (200, k)
    np.testing.assert_array_equal(got, expected)


def test_materialised_is_the_identity_on_finite_values():
    x = jnp.asarray([0.0, -0.0, 1e-37, -3.5, 1e30, 16777215.0], jnp.float32)  # (XLA:CPU flushes subnormals)
    np.testing.assert_array_equal(jax.jit(materialised)(x), x)
