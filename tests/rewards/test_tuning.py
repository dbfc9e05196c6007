"""Weight tuning from preferences: known answers, the exact posterior, invariances, one call for N."""

import math

import numpy as np
import pytest
from tuning_data import LINEAR, racing_clips

from jaxrace.rewards.tuning import (
    PriceBand,
    TuningConfig,
    band_arrays,
    fit_returns,
    pair_loglik,
    split_pairs,
    theta_bounds,
)

TRUE = np.array([1.0, 4.0, -2.0])


def synthetic_problem(pairs=3000, beta=2.0, seed=0, wrong=(1.0, 0.4, -2.0)):
    """Clips with 3 features, labels drawn from a Boltzmann judge of the TRUE weights; defaults `wrong`."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(2 * pairs, 3)).astype(np.float32)
    returns = features @ TRUE
    d = (returns[:pairs] - returns[pairs:]) / returns.std()
    labels = np.where(rng.uniform(size=pairs) < 1 / (1 + np.exp(-beta * d)), 1.0, -1.0).astype(np.float32)
    model = {"base": np.zeros((1, 2 * pairs), np.float32), "jacobian": features[None]}
    defaults = np.asarray([wrong], np.float32)
    return model, defaults, np.ones_like(defaults), np.arange(pairs), pairs + np.arange(pairs), labels


@pytest.mark.parametrize("method", ["grad", "mh", "soft-tac"])
def test_every_method_recovers_the_generating_weight_ratios(method):
    model, defaults, mask, first, second, labels = synthetic_problem()
    config = TuningConfig(method=method, beta=2.0, max_factor=math.inf)  # the answer is 10x a default
    out = fit_returns(model, defaults, mask, first, second, labels, config)
    w = defaults[0] * np.exp(out["theta"][0])
    ratios = w[1:] / w[0]
    np.testing.assert_allclose(ratios, TRUE[1:] / TRUE[0], rtol=0.15)
    acc_before, acc_after = out["before"][0][0], out["after"][0][0]
    assert acc_after > acc_before + 0.03 and acc_after > 0.75
    if method == "mh":
        assert 0.1 < out["acceptance"][0] < 0.9 and np.all(out["ess"][0] > 20) and np.all(out["rhat"][0] < 1.2)


@pytest.mark.parametrize("method", ["grad", "mh", "soft-tac"])
def test_a_tuned_weight_stays_within_max_factor_of_its_default(method):
    model, defaults, mask, first, second, labels = synthetic_problem()  # the answer is 10x the second default
    out = fit_returns(model, defaults, mask, first, second, labels, TuningConfig(method=method, beta=2.0))
    factor = np.exp(np.abs(out["theta"][0]))
    assert np.all(factor <= 3.0 * (1 + 1e-5)), factor
    # it moves as far as it may towards the answer: the second weight up, and the others down for the ratio
    w = defaults[0] * np.exp(out["theta"][0])
    assert w[1] / w[0] > 0.4 * 3.0 and factor[1] > 2.5, w
    unbounded = fit_returns(model, defaults, mask, first, second, labels,
                            TuningConfig(method=method, beta=2.0, max_factor=math.inf))
    assert np.max(np.exp(np.abs(unbounded["theta"][0]))) > 3.0
    with pytest.raises(ValueError, match="max_factor > 1"):
        TuningConfig(max_factor=1.0)


@pytest.mark.parametrize("method", ["grad", "mh"])
def test_limits_keep_a_weight_in_its_range_and_the_rest_still_fit(method):
    """The answer wants the second weight 10x up and the first down for the ratio; limits let the second
    rise 1.5x at most and the first never fall, so both end at their limit, and the third still moves."""
    model, defaults, mask, first, second, labels = synthetic_problem()
    config = TuningConfig(method=method, beta=2.0)
    names = [("a", "b", "c")]
    bounds = theta_bounds(defaults, names, config, [{"a": (1.0, 2.0), "b": (0.2, 0.6)}])
    np.testing.assert_allclose(bounds[0][0], [0.0, -math.log(2.0), -math.log(3.0)], rtol=1e-6)
    np.testing.assert_allclose(bounds[1][0], [math.log(2.0), math.log(1.5), math.log(3.0)], rtol=1e-6)
    out = fit_returns(model, defaults, mask, first, second, labels, config, bounds=bounds)
    w = defaults[0] * np.exp(out["theta"][0])
    assert 1.0 * (1 - 1e-5) <= w[0] <= 1.05 and 0.6 * 0.95 <= w[1] <= 0.6 * (1 + 1e-5), w
    assert w[2] != pytest.approx(-2.0, rel=1e-3)
    for bad, message in (({"d": (0.0, 1.0)}, "not among its PARAMS"), ({"a": (2.0, 3.0)}, "must hold its default"),
                         ({"c": (-3.0, 1.0)}, "keep its default's sign")):
        with pytest.raises(ValueError, match=message):
            theta_bounds(defaults, names, config, [bad])
    with pytest.raises(ValueError, match="1 candidates"):
        theta_bounds(defaults, names, config, [None, None])
    # a negative default: (least, most) in weight units, so -3 is 1.5x its size and -1 half of it;
    # 0 toward zero leaves that side open; a zero default moves linearly
    lower, upper = theta_bounds(np.array([[-2.0, 4.0, 0.0]], np.float32), names, config,
                                [{"a": (-3.0, -1.0), "b": (0.0, 5.0), "c": (-0.5, 0.25)}])
    np.testing.assert_allclose(lower[0], [math.log(0.5), -math.log(3.0), -0.5], rtol=1e-6)
    np.testing.assert_allclose(upper[0], [math.log(1.5), math.log(1.25), 0.25], rtol=1e-6)


@pytest.mark.parametrize("method", ["grad", "mh"])
def test_a_price_band_keeps_a_ratio_of_weights_where_the_fit_would_leave_it(method):
    """The answer wants b / a at 4 (the defaults have 0.4); a band holds b / 2a in [0.1, 0.5], so b / a ends
    at most 1.0 and close to it, where without the band it passes 1.0; c, outside the band, fits what the
    band leaves."""
    model, defaults, mask, first, second, labels = synthetic_problem()
    config = TuningConfig(method=method, beta=2.0, max_factor=math.inf)
    names = [("a", "b", "c")]
    band = PriceBand(numerator={"b": 1.0}, denominator={"a": 2.0}, least=0.1, most=0.5)
    assert band.ratio({"a": 1.0, "b": 0.4}) == pytest.approx(0.2)
    free = fit_returns(model, defaults, mask, first, second, labels, config)
    w = defaults[0] * np.exp(free["theta"][0])
    assert w[1] / w[0] > 2.0, w
    bands = band_arrays(defaults, names, [[band]])
    out = fit_returns(model, defaults, mask, first, second, labels, config, bands=bands)
    w = defaults[0] * np.exp(out["theta"][0])
    assert 0.8 < w[1] / w[0] <= 1.0 * (1 + 1e-4), w
    # c still fits: the best direction with b = a is (1, 1, c) nearest (1, 4, -2), where c = -0.8
    assert w[2] / w[0] == pytest.approx(-0.8, rel=0.2), w
    top, bottom, least, most = band_arrays(defaults, names, [[band]])
    np.testing.assert_array_equal(top[0, 0], [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(bottom[0, 0], [2.0, 0.0, 0.0])
    assert (least[0, 0], most[0, 0]) == (np.float32(0.1), np.float32(0.5))
    for bad, message in ((PriceBand({"d": 1.0}, {"a": 1.0}, 0.1, 0.5), "not among its PARAMS"),
                         (PriceBand({"b": 1.0}, {"a": 1.0}, 0.5, 1.0), "must hold the defaults' ratio 0.4"),
                         (PriceBand({"b": 1.0}, {"c": 1.0}, -1.0, 1.0), "denominator must be positive"),
                         (PriceBand({"b": 1.0}, {"a": 1.0}, 0.5, 0.1), "above most")):
        with pytest.raises(ValueError, match=message):
            band_arrays(defaults, names, [[bad]])
    with pytest.raises(ValueError, match="1 candidates"):
        band_arrays(defaults, names, [None, None])


def test_metropolis_hastings_moves_the_free_weights_when_one_is_pinned():
    """A weight whose limits pin it (least == most == default) stays put, and the chains still move and
    accept steps in the others (a pinned dimension that stepped would have every step rejected)."""
    model, defaults, mask, first, second, labels = synthetic_problem()
    config = TuningConfig(method="mh", beta=2.0)
    bounds = theta_bounds(defaults, [("a", "b", "c")], config, [{"a": (1.0, 1.0)}])
    out = fit_returns(model, defaults, mask, first, second, labels, config, bounds=bounds)
    assert out["theta"][0][0] == 0.0 and out["theta"][0][1] > 0.5  # b toward its 10x answer
    assert 0.1 < out["acceptance"][0] < 0.9


def exact_log_posterior(theta, fixed, feature, first, second, y, beta, prior):
    """The reference: numpy, one weight (w = exp(theta)) on `feature` beside an unweighted `fixed` term."""
    returns = fixed + np.exp(theta) * feature
    d = (returns[first] - returns[second]) / returns.std()
    logsig = lambda x: -np.logaddexp(0.0, -x)  # noqa: E731
    return np.sum(y * logsig(beta * d) + (1 - y) * logsig(-beta * d)) - 0.5 * (theta / prior) ** 2


def test_metropolis_hastings_samples_the_exact_posterior_of_one_weight():
    rng = np.random.default_rng(3)
    pairs = 25  # few preferences: a broad posterior
    fixed, feature = rng.normal(size=2 * pairs), rng.normal(size=2 * pairs)
    returns = fixed + 2.0 * feature
    labels = np.where(returns[:pairs] > returns[pairs:], 1.0, -1.0).astype(np.float32)
    labels[:3] = 0.0  # ties count half a win each
    first, second = np.arange(pairs), pairs + np.arange(pairs)
    model = {"base": fixed[None].astype(np.float32), "jacobian": feature[None, :, None].astype(np.float32)}
    config = TuningConfig(method="mh", beta=0.9, prior_scale=1.0, holdout=0.0, chains=16, steps=3000, burn_in=500,
                          step_size=0.8, max_factor=math.inf)
    out = fit_returns(model, np.ones((1, 1), np.float32), np.ones((1, 1), np.float32), first, second, labels,
                      config)
    samples = out["samples"][0].reshape(-1)
    grid = np.linspace(-4, 4, 801)
    y = (labels + 1) / 2
    logp = np.array([exact_log_posterior(t, fixed, feature, first, second, y, 0.9, 1.0) for t in grid])
    density = np.exp(logp - logp.max())
    density /= density.sum() * (grid[1] - grid[0])
    edges = np.linspace(-4, 4, 33)
    hist, _ = np.histogram(samples, bins=edges, density=True)
    centres = (edges[:-1] + edges[1:]) / 2
    expected = np.interp(centres, grid, density)
    total_variation = 0.5 * np.sum(np.abs(hist - expected)) * (edges[1] - edges[0])
    assert total_variation < 0.08, total_variation
    mean = np.sum(grid * density) * (grid[1] - grid[0])
    np.testing.assert_allclose(samples.mean(), mean, atol=0.08)


def test_a_constant_or_a_positive_factor_on_every_return_changes_nothing_and_skips_are_ignored():
    model, defaults, mask, first, second, labels = synthetic_problem(pairs=400)
    config = TuningConfig(method="grad", beta=2.0, holdout=0.0, grad_steps=100)
    base = fit_returns(model, defaults, mask, first, second, labels, config)
    shifted = fit_returns({"base": model["base"] + 7.5, "jacobian": model["jacobian"]}, defaults, mask, first,
                          second, labels, config)
    np.testing.assert_allclose(shifted["theta"], base["theta"], atol=1e-4)
    scaled = fit_returns({"base": model["base"] * 3.0, "jacobian": model["jacobian"] * 3.0}, defaults, mask,
                         first, second, labels, config)
    np.testing.assert_allclose(scaled["theta"], base["theta"], atol=1e-4)
    # skipped pairs (NaN) are the same as no pairs at all
    skipped = np.concatenate([labels, np.full(50, np.nan, np.float32)])
    more_first, more_second = np.concatenate([first, first[:50]]), np.concatenate([second, second[-50:]])
    with_skips = fit_returns(model, defaults, mask, more_first, more_second, skipped, config)
    np.testing.assert_allclose(with_skips["theta"], base["theta"], atol=1e-5)
    fit, held = split_pairs(skipped, 0.3, 0)
    assert fit[400:].sum() == held[400:].sum() == 0 and fit.sum() + held.sum() == 400
    # a tie is half a win each way
    d = np.linspace(-3, 3, 7)
    np.testing.assert_allclose(pair_loglik(d, 0.5, 0.9), 0.5 * (pair_loglik(d, 1.0, 0.9) + pair_loglik(d, 0.0, 0.9)),
                               rtol=1e-6)


@pytest.mark.parametrize("method", ["grad", "mh"])
def test_one_call_for_three_candidates_equals_three_calls(method):
    problems = [synthetic_problem(pairs=300, seed=s, wrong=w) for s, w in
                ((1, (1.0, 0.4, -2.0)), (2, (2.0, 1.0, -1.0)), (3, (0.5, 8.0, -4.0)))]
    first, second = problems[0][3], problems[0][4]
    labels = problems[0][5]
    model = {k: np.concatenate([p[0][k] for p in problems]) for k in ("base", "jacobian")}
    defaults = np.concatenate([p[1] for p in problems])
    mask = np.ones_like(defaults)
    mask[2, 2] = 0.0  # the third candidate declares two weights only
    config = TuningConfig(method=method, steps=100, burn_in=50, grad_steps=60, restarts=2)
    together = fit_returns(model, defaults, mask, first, second, labels, config, ids=[11, 22, 33])
    for n, i in enumerate((11, 22, 33)):
        alone = fit_returns({k: v[n:n + 1] for k, v in model.items()}, defaults[n:n + 1], mask[n:n + 1], first,
                            second, labels, config, ids=[i])
        # equal up to float rounding of the batched arithmetic (another random stream would differ by ~0.1)
        np.testing.assert_allclose(together["theta"][n], alone["theta"][0], atol=1e-4)
        np.testing.assert_allclose(together["after"][1][n], alone["after"][1][0], rtol=1e-4)
    assert together["theta"][2, 2] == 0.0  # an undeclared weight never moves


NONLINEAR = '''
PARAMS = {"target": 25.0, "w_off": 1.0}

def reward(prev, action, curr, params):
    off = curr.off_course.astype(jnp.float32)
    near = jnp.exp(-jnp.abs(curr.speed - params["target"]) / 10.0)
    return near - params["w_off"] * off, {"near": near}
'''


# NONLINEAR at a millionth of the scale: returns near 1e-5, where an absolute slack would call it linear.
TINY = NONLINEAR.replace("return near - ", "return 1e-6 * near - 1e-6 * ")


@pytest.fixture(scope="module")
def programs():
    from jaxrace.rewards import compile_rewards

    return compile_rewards([LINEAR, NONLINEAR, TINY], names=["linear", "nonlinear", "tiny"])


def test_the_linearity_check_is_relative_to_each_candidates_scale_of_returns(programs):
    import jax

    from jaxrace.rewards import RewardBank
    from jaxrace.rewards.tuning import linear_model

    linear, nonlinear, tiny = programs
    first, _, _ = racing_clips(pairs=20)
    _, holds = linear_model(RewardBank.from_compiled([linear, nonlinear, tiny]), first, jax.random.key(0))
    assert holds.tolist() == [True, False, False]


def test_the_jacobian_is_jacrevs_and_its_memory_grows_linearly_with_the_clips(programs):
    import jax
    import jax.numpy as jnp

    from jaxrace.rewards import RewardBank
    from jaxrace.rewards.tac import clip_returns
    from jaxrace.rewards.tuning import _returns_and_jacobian

    bank = RewardBank.from_compiled(list(programs))
    first, _, _ = racing_clips(pairs=12)
    defaults = bank.default_params()
    probes = jnp.stack([defaults * 1.5, defaults * 0.5])
    _, jacobian, _ = _returns_and_jacobian(bank, first, defaults, probes)
    for i in range(bank.num_rewards):
        want = jax.jacrev(lambda w, i=i: clip_returns(bank, first, defaults.at[i].set(w))[i])(defaults[i])
        np.testing.assert_allclose(jacobian[i], want, rtol=1e-5, atol=1e-6 * float(jnp.abs(want).max()))

    def temp_bytes(pairs):
        clips, _, _ = racing_clips(pairs=pairs, steps=50)
        compiled = _returns_and_jacobian.lower(bank, clips, defaults, probes).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    # jacrev's K reverse passes over K clips grew as K^2 (70 GB at 800 clips of 150 steps)
    assert temp_bytes(400) < 2.5 * temp_bytes(200)


def test_tune_finds_the_weight_an_llm_got_wrong_and_guards_the_rest(programs):
    from jaxrace.rewards import RewardBank
    from jaxrace.rewards.tuning import tune

    linear, nonlinear, _ = programs
    first, second, labels = racing_clips()
    free = TuningConfig(method="grad", beta=2.0, max_factor=math.inf)  # the answer is 20x the defaults' ratio
    result = tune(RewardBank.from_compiled([linear]), first, second, labels, free)
    one = result["linear"]
    assert one.returns == "linear" and one.tuned, one.reason
    assert one.params["w_off"] / one.params["w_speed"] == pytest.approx(20.0, rel=0.3)
    # by default each weight moves at most 3x in one tuning, so the ratio goes as far as 3 x 3
    bounded = tune(RewardBank.from_compiled([linear]), first, second, labels, TuningConfig(method="grad", beta=2.0))
    assert bounded["linear"].params["w_off"] / bounded["linear"].params["w_speed"] == pytest.approx(9.0, rel=1e-3)
    assert one.heldout_accuracy_after > one.heldout_accuracy_before + 0.05 and one.heldout_pairs == 45
    assert one.heldout_loglik_after > one.heldout_loglik_before
    np.testing.assert_allclose(result.params[0], [one.params["w_speed"], one.params["w_off"]], rtol=1e-6)

    # a program not linear in its weights: every step evaluates it on the clips; in one call with the other
    both = tune(RewardBank.from_compiled([linear, nonlinear]), first, second, labels,
                TuningConfig(method="grad", beta=2.0, grad_steps=150, restarts=2, max_factor=math.inf))
    assert (both["linear"].returns, both["nonlinear"].returns) == ("linear", "exact") and both.params.shape == (2, 2)
    assert both["linear"].params["w_off"] / both["linear"].params["w_speed"] == pytest.approx(20.0, rel=0.3)
    assert both["nonlinear"].tuned or "held-out" in both["nonlinear"].reason
    assert set(both["nonlinear"].params) == {"target", "w_off"}

    few = labels.copy()
    few[8:] = np.nan  # skips: 8 labelled pairs, 6 to fit on
    kept = tune(RewardBank.from_compiled([linear]), first, second, few, TuningConfig())["linear"]
    assert not kept.tuned and kept.params == {"w_speed": 1.0, "w_off": 1.0}
    assert kept.reason == "6 labelled pairs to fit on, fewer than the minimum 10"
    with pytest.raises(ValueError, match="method must be one of mh, grad, soft-tac"):
        TuningConfig(method="adam")


def test_the_command_tunes_programs_against_a_store(programs, tmp_path, capsys):
    import jax

    from jaxrace.cli import main
    from jaxrace.rewards.clips import Clip
    from jaxrace.rewards.preferences import PreferenceStore, save_clip_arrays

    first, second, labels = racing_clips(pairs=60, seed=4)
    both = jax.tree.map(lambda a, b: np.concatenate([a, b]), first, second)
    arrays = save_clip_arrays(tmp_path / "clips.npz", Clip(*both))
    with PreferenceStore(tmp_path / "preferences.sqlite") as store:
        ids = [store.add_clip(f"c{i}", iteration=1, candidate="a", seed=0, race=0, start=0, length=8, metrics={},
                              arrays=arrays, arrays_row=i) for i in range(120)]
        for p, label in enumerate(labels):
            store.add_preference(f"p{p}", iteration=1, first=ids[p], second=ids[60 + p],
                                 label="first" if label > 0 else "second", judge_kind="scripted", judge_id="s")
    (tmp_path / "linear.py").write_text(LINEAR)
    assert main(["reward", "tune", str(tmp_path / "preferences.sqlite"), str(tmp_path / "linear.py")]) == 0
    out = capsys.readouterr().out
    assert "60 labelled pairs; method grad" in out
    assert "linear: tuned (tuned on 42 pairs; held-out accuracy" in out and "returns linear" in out
    assert "PARAMS = {'w_speed': " in out
    assert main(["reward", "tune", str(tmp_path / "missing.sqlite"), str(tmp_path / "linear.py")]) == 2
    assert "no such store" in capsys.readouterr().err


def test_with_params_rewrites_only_the_params_literal():
    from jaxrace.rewards.tuning import with_params

    source = ('"""doc"""\nPARAMS = {"w_speed": 1.0,\n          "w_off": 1.0}  # weights\n\n'
              'def reward(prev, action, curr, params):\n    return 0.0, {}\n')
    assert with_params(source, {"w_off": 12.345678}) == (
        '"""doc"""\nPARAMS = {\n    \'w_speed\': 1.0,\n    \'w_off\': 12.3457,\n}  # weights\n\n'
        'def reward(prev, action, curr, params):\n    return 0.0, {}\n')
    with pytest.raises(ValueError, match="not \\['w_contact'\\]"):
        with_params(source, {"w_contact": 1.0})
    with pytest.raises(ValueError, match="no module-level PARAMS"):
        with_params("def reward(prev, action, curr):\n    return 0.0, {}\n", {})


def test_unique_clips_keeps_each_clip_once_and_says_where_every_pairs_clips_are():
    import jax

    from jaxrace.rewards.clips import unique_clips

    pool, _, _ = racing_clips(pairs=3, steps=4)  # clips a, b, c
    take = lambda rows: jax.tree.map(lambda x: x[np.asarray(rows)], pool)  # noqa: E731
    clips, first, second = unique_clips(take([0, 1, 0, 2]), take([1, 2, 2, 2]))
    assert first.tolist() == [0, 1, 0, 2] and second.tolist() == [1, 2, 2, 2] and first.dtype == np.int32
    assert clips.valid.shape == (3, 4)
    for got, want in zip(jax.tree.leaves(clips), jax.tree.leaves(take([0, 1, 2])), strict=True):
        np.testing.assert_array_equal(got, want)
    # order of first appearance; a clip whose arrays differ in one byte is another clip
    other = take([2, 0])
    other = other._replace(valid=other.valid.copy())
    other.valid[1, -1] = False
    clips, first, second = unique_clips(take([2, 0]), other)
    assert (first.tolist(), second.tolist(), clips.valid.shape[0]) == ([0, 1], [0, 2], 3)


def test_tuning_on_pairs_that_share_clips_evaluates_each_clip_once_and_still_finds_the_weight(programs):
    import jax

    from jaxrace.rewards import RewardBank
    from jaxrace.rewards.tuning import tune

    pool = jax.tree.map(lambda x, y: np.concatenate([x, y]), *racing_clips(pairs=20)[:2])
    # 40 clips, each judged in ~15 of 300 pairs, as a loop's store holds them
    rng = np.random.default_rng(1)
    a = rng.integers(0, 40, 300)
    b = (a + rng.integers(1, 40, 300)) % 40
    truth = pool.views.speed[:, 0] - 20.0 * pool.views.off_course[:, 1:].mean(axis=1)
    d = (truth[a] - truth[b]) / truth.std()
    labels = np.where(rng.uniform(size=300) < 1 / (1 + np.exp(-2.0 * d)), 1.0, -1.0).astype(np.float32)
    take = lambda rows: jax.tree.map(lambda x: x[rows], pool)  # noqa: E731
    result = tune(RewardBank.from_compiled([programs[0]]), take(a), take(b), labels,
                  TuningConfig(method="grad", beta=2.0, max_factor=math.inf))
    assert result.clips == len(set(a) | set(b)) == 40
    one = result["linear"]
    assert one.tuned, one.reason
    assert one.params["w_off"] / one.params["w_speed"] == pytest.approx(20.0, rel=0.3)
