"""The clip model (owner strengths plus clip deviations, labels with a lapse rate) and the choice it drives."""

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit

from jaxrace.judges.clip_model import ClipModel, fit_clips, label_outcomes, pair_fisher, prior_covariance
from jaxrace.judges.pairs import choose_informative

OWNER = np.array([0, 0, 1, 1, 2, 2, 3, 3])  # four owners, each with a clip at two moments (clip 2i: moment 0)
POOL = np.array([(a, b) for a in range(8) for b in range(a + 1, 8) if a % 2 == b % 2])  # pairs within a moment


def joint_reference(owner, first, second, outcome, model):
    """A slow, obvious fit over clip strengths u and owner strengths m together (not integrated out)."""
    c, k = len(owner), owner.max() + 1

    def loss(x):
        u, m = x[:c], x[c:]
        p = model.lapse + (1 - 2 * model.lapse) * expit(u[first] - u[second])
        prior = 0.5 * np.sum((u - m[owner]) ** 2) / model.spread ** 2 + 0.5 * np.sum(m ** 2) / model.owner_spread ** 2
        return prior - np.sum(outcome * np.log(p) + (1 - outcome) * np.log(1 - p))

    x = minimize(loss, np.zeros(c + k), method="BFGS", options={"gtol": 1e-10}).x
    u = x[:c]
    s = expit(u[first] - u[second])
    p = model.lapse + (1 - 2 * model.lapse) * s
    w = ((1 - 2 * model.lapse) * s * (1 - s)) ** 2 / (p * (1 - p))
    h = np.zeros((c + k, c + k))  # the joint precision: prior of (u, m) plus the labels' Fisher information
    for i in range(c):
        h[i, i] += 1 / model.spread ** 2
        h[c + owner[i], c + owner[i]] += 1 / model.spread ** 2
        h[i, c + owner[i]] -= 1 / model.spread ** 2
        h[c + owner[i], i] -= 1 / model.spread ** 2
    h[c:, c:] += np.eye(k) / model.owner_spread ** 2
    for a, b, wi in zip(first, second, w, strict=True):
        h[a, a] += wi
        h[b, b] += wi
        h[a, b] -= wi
        h[b, a] -= wi
    return u, np.linalg.inv(h)[:c, :c]


def test_fit_matches_the_joint_fit_of_clips_and_owners():
    first, second = np.array([0, 2, 4, 1, 3, 0]), np.array([2, 4, 6, 3, 5, 4])
    outcome = np.array([1.0, 1.0, 0.0, 0.5, 1.0, 0.0])
    model = ClipModel(spread=1.5, owner_spread=2.5, lapse=0.1)
    u, cov = fit_clips(OWNER, first, second, outcome, model)
    u_ref, cov_ref = joint_reference(OWNER, first, second, outcome, model)
    assert u == pytest.approx(u_ref, abs=1e-4)
    assert cov == pytest.approx(cov_ref, abs=1e-4)
    assert u.dtype == cov.dtype == np.float64 and cov.shape == (8, 8)


@pytest.mark.parametrize("lapse", [0.01, 0.1, 0.3])
def test_pair_fisher_is_the_expected_squared_score_of_one_label(lapse):
    strength = np.array([1.3, -0.4, 0.0])
    a, b = np.array([0, 1, 2]), np.array([1, 2, 2])
    z = strength[a] - strength[b]
    h = 1e-6

    def p(x):
        return lapse + (1 - 2 * lapse) / (1 + np.exp(-x))

    dp = (p(z + h) - p(z - h)) / (2 * h)  # by finite differences, then summed over the two outcomes
    expected = p(z) * (dp / p(z)) ** 2 + (1 - p(z)) * (dp / (1 - p(z))) ** 2
    assert pair_fisher(strength, a, b, lapse) == pytest.approx(expected, rel=1e-5)
    assert pair_fisher(strength, a, b, lapse)[0] < pair_fisher(strength, a, b, 0.0001)[0]  # a lapse weighs less


def test_no_labels_give_zero_strengths_and_the_prior():
    u, cov = fit_clips(OWNER, np.zeros(0, int), np.zeros(0, int), np.zeros(0))
    assert np.all(u == 0)
    assert cov == pytest.approx(prior_covariance(OWNER, ClipModel()))
    assert prior_covariance(OWNER, ClipModel())[0, 1] == pytest.approx(4.0)  # same owner: the owner's variance


def test_a_moment_judged_in_full_is_ordered_and_informs_the_owners_other_clips():
    order = [6, 0, 4, 2]  # at moment 0, owner 3 beats owner 0 beats owner 2 beats owner 1
    first = np.array([order[i] for i in range(4) for j in range(i + 1, 4)])
    second = np.array([order[j] for i in range(4) for j in range(i + 1, 4)])
    u, _ = fit_clips(OWNER, first, second, np.ones(len(first)))
    assert np.argsort(-u[[0, 2, 4, 6]]).tolist() == [3, 0, 2, 1]
    assert np.argsort(-u[[1, 3, 5, 7]]).tolist() == [3, 0, 2, 1]  # moment 1 never judged: from the owners


def test_bad_input_is_refused_with_a_message():
    with pytest.raises(ValueError, match="'better'"):
        label_outcomes(["first", "better"])
    with pytest.raises(ValueError, match="lapse"):
        ClipModel(lapse=0.5)
    with pytest.raises(ValueError, match="lapse in \\(0, 0.5\\)"):
        ClipModel(lapse=0.0)
    with pytest.raises(ValueError, match="one shape"):
        fit_clips(OWNER, np.array([0]), np.array([2, 4]), np.array([1.0]))
    with pytest.raises(ValueError, match="2 judged pairs but 1 labels"):
        choose_informative(POOL, OWNER, POOL[:2], ["first"], 1, np.random.default_rng(0))
    kept, outcome = label_outcomes(["first", "second", "tie", "skip"])
    assert kept.tolist() == [True, True, True, False] and outcome[:3].tolist() == [1.0, 0.0, 0.5]


def test_the_greedy_batch_equals_refitting_the_covariance_after_each_pick():
    judged, labels = POOL[[0, 7]], ["first", "second"]
    left = np.delete(POOL, [0, 7], axis=0)
    picked = choose_informative(left, OWNER, judged, labels, 3, np.random.default_rng(0))
    kept, outcome = label_outcomes(labels)
    u, cov = fit_clips(OWNER, judged[:, 0], judged[:, 1], outcome)
    s = expit(u[left[:, 0]] - u[left[:, 1]])
    p = 0.1 + 0.8 * s
    w = (0.8 * s * (1 - s)) ** 2 / (p * (1 - p))
    info = np.linalg.inv(cov)
    for pick in picked:  # each pick is the best by information with the earlier picks' information added in full
        cov = np.linalg.inv(info)
        gain = np.log1p(w * (cov[left[:, 0], left[:, 0]] + cov[left[:, 1], left[:, 1]]
                             - 2 * cov[left[:, 0], left[:, 1]]))
        gain[[q for q in picked if q != pick and list(picked).index(q) < list(picked).index(pick)]] = -np.inf
        assert pick == int(np.argmax(gain))
        e = np.zeros(8)
        e[left[pick, 0]], e[left[pick, 1]] = 1.0, -1.0
        info = info + w[pick] * np.outer(e, e)
    assert len(set(picked.tolist())) == 3


def test_the_prior_alone_spreads_the_first_round_and_a_settled_pair_waits():
    first_round = choose_informative(POOL, OWNER, POOL[:0], [], 4, np.random.default_rng(0))
    clips = POOL[first_round].ravel()
    assert len(set(clips.tolist())) == 8  # four pairs, every clip once
    # clip 0 beat clips 2 and 4, clip 6 lost to both: whether 0 beats 6 is settled, so it is not picked first
    judged = np.array([[0, 2], [0, 4], [2, 6], [4, 6]])
    left = np.array([[0, 6], [2, 4]])
    assert choose_informative(left, OWNER, judged, ["first"] * 4, 1, np.random.default_rng(0)).tolist() == [1]
    assert choose_informative(left, OWNER, judged, ["first"] * 4, 5, np.random.default_rng(0)).tolist() == [1, 0]
    assert choose_informative(left, OWNER, judged, ["first"] * 4, 0, np.random.default_rng(0)).size == 0
