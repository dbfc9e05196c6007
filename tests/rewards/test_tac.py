"""TAC against scipy's Kendall tau and a slow, obvious reference."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import kendalltau

from jaxrace.rewards import Clip, RewardBank, compile_reward, cut_clip, library_reward, tac, tac_from_returns
from jaxrace.rewards.synthetic import synthetic_batch


def slow_tau(r1, r2, labels, variant):
    c = d = n = reward_ties = label_ties = 0
    for a, b, label in zip(r1, r2, labels, strict=True):
        if np.isnan(label):
            continue
        n += 1
        s = np.sign(a - b) if abs(a - b) > 1e-6 + 1e-6 * max(abs(a), abs(b)) else 0.0
        reward_ties += s == 0
        label_ties += label == 0
        c += s * label > 0
        d += s * label < 0
    if variant == "a":
        return (c - d) / n if n else 0.0
    denom = np.sqrt((n - reward_ties) * (n - label_ties))
    return (c - d) / denom if denom else 0.0


@pytest.mark.parametrize("variant", ["a", "b"])
def test_tac_from_returns_matches_a_slow_reference_with_ties(variant):
    rng = np.random.default_rng(0)
    n, p = 7, 300
    r1 = np.round(rng.normal(size=(n, p)), 1).astype(np.float32)  # rounding makes reward ties
    r2 = np.round(rng.normal(size=(n, p)), 1).astype(np.float32)
    labels = rng.choice([-1.0, 0.0, 1.0, np.nan], size=p, p=[0.4, 0.15, 0.4, 0.05]).astype(np.float32)
    got = tac_from_returns(r1, r2, labels, variant)
    assert got.shape == (n,) and got.dtype == jnp.float32
    want = [slow_tau(r1[i], r2[i], labels, variant) for i in range(n)]
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_tau_b_over_all_item_pairs_equals_scipy_kendalltau():
    rng = np.random.default_rng(1)
    k = 25
    truth = np.round(rng.normal(size=k), 1)  # ties in the labels
    scores = np.stack([np.round(truth + rng.normal(scale=s, size=k), 1) for s in (0.1, 0.5, 2.0)])
    pairs = list(itertools.combinations(range(k), 2))
    i, j = np.array(pairs).T
    labels = np.sign(truth[i] - truth[j]).astype(np.float32)
    got = tac_from_returns(scores[:, i], scores[:, j], labels, "b")
    want = [kendalltau(s, truth).statistic for s in scores]
    np.testing.assert_allclose(got, want, atol=1e-5)
    # tau-a over the same pairs: (C - D) / number of pairs.
    got_a = tac_from_returns(scores[:, i], scores[:, j], labels, "a")
    c_minus_d = [np.sum(np.sign(s[i] - s[j]) * labels) for s in scores]
    np.testing.assert_allclose(got_a, np.array(c_minus_d) / len(pairs), atol=1e-6)


def test_tac_edge_cases_and_bad_input():
    ones = jnp.ones((2, 3))
    assert np.all(tac_from_returns(ones, ones, jnp.array([1.0, -1.0, 0.0]), "b") == 0.0)  # reward ties only
    assert np.all(tac_from_returns(ones * 2, ones, jnp.full(3, jnp.nan), "a") == 0.0)  # nothing labelled
    np.testing.assert_allclose(tac_from_returns(ones * 2, ones, jnp.array([1.0, 1.0, -1.0]), "a"), 1 / 3)
    with pytest.raises(ValueError, match="variant"):
        tac_from_returns(ones, ones, jnp.ones(3), "c")
    with pytest.raises(ValueError, match=r"\[N, P\]"):
        tac_from_returns(ones, ones, jnp.ones(4))


def make_clips(p, t, key):
    """P clips of T steps built from random synthetic transitions (progress accumulates)."""
    prev, act, curr, _ = synthetic_batch()
    b = prev.speed.shape[0]
    idx = jax.random.randint(key, (p, t + 1), 0, b)
    views = jax.tree.map(lambda x: x[idx], curr)
    step = jax.random.uniform(jax.random.fold_in(key, 1), (p, t + 1), minval=0.0, maxval=6.0)
    views = views.replace(progress=jnp.cumsum(step, axis=1))
    actions = jax.tree.map(lambda x: x[idx[:, :t]], act)
    return Clip(views=views, actions=actions, valid=jnp.ones((p, t), bool))


def test_tac_over_a_bank_agrees_with_returns_computed_reward_by_reward():
    bank = RewardBank.from_compiled([library_reward("progress"), library_reward("gt_sophy")])
    p, t = 40, 12
    first, second = make_clips(p, t, jax.random.key(0)), make_clips(p, t, jax.random.key(1))
    second = second._replace(valid=second.valid.at[:5, 8:].set(False))  # five clips end early
    labels = jnp.sign(jax.random.normal(jax.random.key(2), (p,)))
    for mode in ("mean", "sum", "discounted"):
        got = tac(bank, first, second, labels, mode=mode, variant="b")
        returns = []
        for clips in (first, second):
            per = []
            for r in bank.rewards:
                rew = jax.vmap(jax.vmap(lambda a, b_, c, r=r: r(a, b_, c)[0]))(
                    jax.tree.map(lambda x: x[:, :-1], clips.views), clips.actions,
                    jax.tree.map(lambda x: x[:, 1:], clips.views))
                w = clips.valid * (0.99 ** jnp.arange(t) if mode == "discounted" else 1.0)
                ret = jnp.sum(rew * w, axis=1)
                per.append(ret / jnp.sum(clips.valid, axis=1) if mode == "mean" else ret)
            returns.append(jnp.stack(per))
        np.testing.assert_allclose(got, tac_from_returns(*returns, labels, "b"), atol=1e-6)


def test_a_reward_that_agrees_with_the_labels_scores_one():
    speedy = compile_reward("def reward(prev, action, curr):\n    return curr.speed, {}\n", name="speed")
    slowly = compile_reward("def reward(prev, action, curr):\n    return -curr.speed, {}\n", name="slow")
    bank = RewardBank.from_compiled([speedy, slowly])
    first, second = make_clips(30, 6, jax.random.key(3)), make_clips(30, 6, jax.random.key(4))
    mean_speed = lambda c: jnp.mean(c.views.speed[:, 1:], axis=1)  # noqa: E731
    labels = jnp.sign(mean_speed(first) - mean_speed(second))  # judges prefer the faster clip
    np.testing.assert_allclose(tac(bank, first, second, labels), [1.0, -1.0], atol=1e-6)


def test_cut_clip_marks_steps_after_the_episode_ended_invalid():
    s = 10
    views = jax.tree.map(lambda x: x[: s + 1], synthetic_batch()[2])
    actions = jax.tree.map(lambda x: x[:s], synthetic_batch()[1])
    done = jnp.zeros(s, bool).at[5].set(True)
    clip = cut_clip(views, actions, done, jnp.int32(3), 4)
    np.testing.assert_array_equal(clip.valid, [True, True, True, False])
    np.testing.assert_array_equal(clip.views.progress, views.progress[3:8])
    late = cut_clip(views, actions, done, jnp.int32(9), 4)  # clamped to end inside the trajectory
    np.testing.assert_array_equal(late.views.progress, views.progress[6:11])
    with pytest.raises(ValueError, match="does not fit"):
        cut_clip(views, actions, done, jnp.int32(0), 11)
