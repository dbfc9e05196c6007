import jax.numpy as jnp
import numpy as np
import pytest

from jaxrace.rewards import bradley_terry


def numpy_mm(winners, losers, k, ties=None, prior=1.0, iters=20000):
    """The slow, obvious MM fit of the same regularised model (a reference of strength 1)."""
    w = np.zeros((k, k))
    ties = np.zeros(len(winners)) if ties is None else np.asarray(ties, float)
    for a, b, t in zip(winners, losers, ties, strict=True):
        w[a, b] += 1 - 0.5 * t
        w[b, a] += 0.5 * t
    p = np.ones(k)
    for _ in range(iters):
        new = np.empty(k)
        for i in range(k):
            denom = sum((w[i, j] + w[j, i]) / (p[i] + p[j]) for j in range(k) if j != i)
            new[i] = (w[i].sum() + prior) / (denom + 2 * prior / (p[i] + 1))
        if np.max(np.abs(np.log(new) - np.log(p))) < 1e-12:
            p = new
            break
        p = new
    s = np.log(p)
    return s - s.mean()


def test_matches_a_numpy_mm_reference_with_ties():
    rng = np.random.default_rng(0)
    k, g = 5, 60
    a = rng.integers(0, k, g)
    b = (a + rng.integers(1, k, g)) % k
    ties = rng.random(g) < 0.2
    scores, stderr = bradley_terry(a, b, k, ties=ties, prior=0.5)
    np.testing.assert_allclose(scores, numpy_mm(a, b, k, ties, prior=0.5), atol=2e-4)
    assert np.all(stderr > 0) and np.all(np.isfinite(stderr))
    assert abs(float(jnp.mean(scores))) < 1e-5


def test_a_transitive_tournament_recovers_the_order():
    k = 6
    a, b = np.array([(i, j) for i in range(k) for j in range(k) if i < j]).T  # lower index always wins
    scores, _ = bradley_terry(a, b, k)
    assert np.all(np.diff(np.asarray(scores)) < 0)
    assert np.all(np.isfinite(scores))  # item 0 is unbeaten, yet finite


def test_synthetic_strengths_are_recovered_within_error_bars():
    rng = np.random.default_rng(1)
    k, g = 6, 4000
    true = np.linspace(-1.2, 1.2, k)
    i = rng.integers(0, k, g)
    j = (i + rng.integers(1, k, g)) % k
    first_wins = rng.random(g) < 1 / (1 + np.exp(-(true[i] - true[j])))
    scores, stderr = bradley_terry(np.where(first_wins, i, j), np.where(first_wins, j, i), k, prior=0.1)
    z = (np.asarray(scores) - (true - true.mean())) / np.asarray(stderr)
    assert np.all(np.abs(z) < 4), z
    assert np.mean(np.abs(z) < 2) >= 0.6


def test_disconnected_and_uncompared_items_get_finite_scores():
    # Items {0, 1} and {2, 3} never meet; item 4 never plays.
    scores, stderr = bradley_terry(jnp.array([0, 0, 2]), jnp.array([1, 1, 3]), 5)
    assert np.all(np.isfinite(scores)) and np.all(np.isfinite(stderr))
    assert scores[0] > scores[1] and scores[2] > scores[3]
    assert stderr[4] > stderr[0]  # the unplayed item is the least certain


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="num_items"):
        bradley_terry(jnp.array([0]), jnp.array([1]), 0)
    with pytest.raises(ValueError, match="same length"):
        bradley_terry(jnp.array([0, 1]), jnp.array([1]), 2)
    with pytest.raises(ValueError, match="prior"):
        bradley_terry(jnp.array([0]), jnp.array([1]), 2, prior=0.0)


def test_fit_labels_turns_shown_order_and_labels_into_games():
    from jaxrace.rewards.bradley_terry import fit_labels

    got = fit_labels([0, 1, 2, 0], [1, 2, 0, 2], ["first", "second", "tie", "skip"], 3)
    want = bradley_terry(jnp.array([0, 2, 2]), jnp.array([1, 1, 0]), 3, jnp.array([False, False, True]))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    assert float(got[0][2]) > float(got[0][1])  # 2 beat 1 and tied 0; 1 lost to both
