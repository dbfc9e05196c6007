import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrace.rewards import RewardBank, compile_reward, library_reward
from jaxrace.rewards.synthetic import synthetic_batch

SPEED = '''
PARAMS = {"w": 0.5, "offset": 1.0, "scale": 2.0}
def reward(prev, action, curr, params):
    s = params["scale"] * (params["w"] * curr.speed + params["offset"])
    return s, {"scaled": s}
'''


@pytest.fixture(scope="module")
def bank():
    rewards = [library_reward("progress"), library_reward("gt_sophy"), compile_reward(SPEED, name="speed")]
    return RewardBank.from_compiled(rewards)


def test_shapes_padding_and_names(bank):
    assert bank.num_rewards == 3 and bank.names == ("progress", "gt_sophy", "speed")
    assert bank.num_params == 10 and bank.num_components == 9  # gt_sophy's
    params = bank.default_params()
    assert params.shape == (3, 10) and params.dtype == jnp.float32
    np.testing.assert_array_equal(params[0], 0.0)
    np.testing.assert_array_equal(params[2], [0.5, 1.0, 2.0, 0, 0, 0, 0, 0, 0, 0])
    m = bank.params_matrix([{}, {"w_wall": 3.0}, {"offset": -1.0}])
    assert m[1, list(bank.param_names[1]).index("w_wall")] == 3.0 and m[2, 1] == -1.0
    with pytest.raises(KeyError, match="has no PARAMS"):
        bank.params_matrix([{}, {"w": 1.0}, {}])


def test_evaluate_all_and_evaluate_agree_with_each_reward_alone(bank):
    prev, act, curr, _ = synthetic_batch()
    totals, comps = jax.jit(jax.vmap(bank.evaluate_all))(prev, act, curr)
    b = prev.speed.shape[0]
    assert totals.shape == (b, 3) and comps.shape == (b, 3, 9)
    for i, r in enumerate(bank.rewards):
        alone_total, alone_comps = jax.vmap(r)(prev, act, curr)
        # Totals sum up to 9 terms that can cancel: compare to float32 rounding of the terms.
        np.testing.assert_allclose(totals[:, i], alone_total, rtol=1e-6, atol=1e-5)
        for j, name in enumerate(r.component_names):
            np.testing.assert_allclose(comps[:, i, j], alone_comps[name], rtol=1e-6)
        np.testing.assert_array_equal(comps[:, i, len(r.component_names):], 0.0)
        one = jax.jit(jax.vmap(bank.evaluate, in_axes=(None, 0, 0, 0)))(i, prev, act, curr)
        np.testing.assert_allclose(one[0], alone_total, rtol=1e-6, atol=1e-5)


def test_evaluate_vmaps_over_the_candidate_index_with_per_candidate_params(bank):
    prev, act, curr, _ = synthetic_batch()
    one = jax.tree.map(lambda x: x[0], (prev, act, curr))
    params = bank.default_params().at[2, 0].set(1.0)  # candidate 2's "w"
    totals, _ = jax.jit(jax.vmap(bank.evaluate, in_axes=(0, None, None, None, 0)))(
        jnp.arange(3), *one, params)
    all_totals, _ = bank.evaluate_all(*one, params)
    np.testing.assert_allclose(totals, all_totals, rtol=1e-6)
    assert float(totals[2]) == pytest.approx(2.0 * (float(one[2].speed) + 1.0))


def test_from_compiled_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        RewardBank.from_compiled([])
    with pytest.raises(TypeError, match="compile_reward"):
        RewardBank.from_compiled(["def reward(prev, action, curr): ..."])
