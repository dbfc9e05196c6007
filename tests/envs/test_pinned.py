"""Pins: a short race rollout (state and pixels) gives bit-identical results across refactors.

The rollouts run in a child with XLA's default compile options, as a user's process compiles
them (the suite's own options give other bits; tests/pins.py).

The digests were recorded before the env was split into modules. A change that moves
code must leave them as they are; a change that means to alter the dynamics, or a JAX
upgrade that changes float rounding, re-pins them on purpose:
`PYTHONPATH=tests .venv/bin/python tests/envs/test_pinned.py` prints the current digests (the training
chunk's pin is in tests/agents/test_trainer.py). Pins are kept per class of CPU (`pins.cpu_class`).
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from pins import cpu_class, digest, digests_in_child, pin

import jaxrace
from jaxrace.envs import per_env_params

# The AVX-512 pins were recorded on a726904 (random starts: before off-track starts), the AVX2
# ones on 3736eb2 (a 2-core AMD EPYC without AVX-512; the code the AVX-512 pins still held on).
ROLLOUT_DIGEST = {"avx512": "cc41659be2f2acc59ababc62", "avx2": "25e50e2a6f7dfbab61074d72"}
PIXELS_DIGEST = {"avx512": "7330ac395ff6536b2253ec5a", "avx2": "8aced5b11b18789bb9f4c194"}
RANDOM_STARTS_DIGEST = {"avx512": "608122b3b97074541f8ea482", "avx512vbmi": "ac4fd2ae01cce5ca54dafea2",
                        "zen5": "608122b3b97074541f8ea482", "avx2": "99ed9425ba339dfa14558afc"}


def scripted_rollout(env, params, reset_key: int, step_key: int, steps: int, steer: float, freq: float,
                     throttle: float, params_axis):
    """`steps` steps of envs with scripted sinusoidal steering, auto-reset included; params shared
    (`params_axis=None`) or one per env (0). EnvState.off_since_start and RaceView.lane_gap_ahead
    came after the pins were recorded and are left out."""
    num_envs = 4 if params_axis is None else params.laps.shape[0]
    step = jax.vmap(env.step, in_axes=(0, 0, 0, params_axis))
    # Resets are jitted: eager, each op compiles alone (13-17 s a test). The pins were recorded with
    # eager resets; the digests are the same (checked on the AVX2 class).
    _, state = jax.jit(jax.vmap(env.reset, in_axes=(0, params_axis)))(
        jax.random.split(jax.random.key(reset_key), num_envs), params)

    def body(state, i):
        t = i.astype(jnp.float32)
        action = jnp.stack([steer * jnp.sin(freq * t + jnp.arange(float(num_envs))), jnp.full((num_envs,), throttle)],
                           axis=-1)
        obs, state, reward, terminated, truncated, info = step(
            jax.random.split(jax.random.fold_in(jax.random.key(step_key), i), num_envs), state, action, params)
        return state, (obs, reward, terminated, truncated, info["view"].replace(lane_gap_ahead=None))

    state, outs = jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(steps)))(state)
    return state.replace(off_since_start=None, view=state.view.replace(lane_gap_ahead=None)), outs


def rollout_outputs():
    """40 steps of 4 envs, 3 AI opponents, scripted ego actions, auto-reset included."""
    env, params = jaxrace.make(track="club", num_opponents=3, start="grid_back", time_limit=2.5)
    return scripted_rollout(env, params, 3, 4, 40, steer=0.3, freq=0.2, throttle=0.9, params_axis=None)


def random_start_outputs():
    """30 steps of 8 envs from random starts: spread, packs, corner and grid starts, course-outs ending
    episodes 0.6 m beyond the edge, auto-reset included (none start off the track)."""
    env, params = jaxrace.make(track="club", num_opponents=3, start="random", time_limit=2.0,
                               terminate_on_course_out=True, course_out_margin=0.6)
    params = per_env_params(params, 8, random_start_gap=[0.0] * 2 + [25.0] * 6, grid_start_prob=[0.0, 0.5] * 4,
                            corner_start_prob=[0.0] * 4 + [1.0] * 4)
    return scripted_rollout(env, params, 6, 7, 30, steer=0.9, freq=0.3, throttle=1.0, params_axis=0)


def pixel_outputs():
    env, params = jaxrace.make(track="club", num_opponents=3, start="grid_back", pixels=True, image_size=(24, 32))
    obs, state = jax.jit(env.reset)(jax.random.key(5), params)
    frames = [obs["pixels"]]
    step = jax.jit(env.step)
    for i in range(3):
        obs, state, *_ = step(jax.random.key(i), state, jnp.array([0.1, 1.0]), params)
        frames.append(obs["pixels"])
    return jnp.stack(frames)


@pytest.fixture(scope="module")
def digests():
    """This module's digests, computed by its main in a child with XLA's default compile options."""
    return digests_in_child(Path(__file__))


def test_a_short_rollout_is_bit_identical_to_the_pinned_one(digests):
    want = pin(ROLLOUT_DIGEST, "rollout")
    got = digests["ROLLOUT_DIGEST"]
    assert got == want, f"rollout digest {got} != pinned {want} (see the module docstring)"


def test_random_starts_and_course_outs_are_bit_identical_to_the_pinned_ones(digests):
    want = pin(RANDOM_STARTS_DIGEST, "random starts")
    got = digests["RANDOM_STARTS_DIGEST"]
    assert got == want, f"random starts digest {got} != pinned {want}"


def test_rendered_frames_are_bit_identical_to_the_pinned_ones(digests):
    want = pin(PIXELS_DIGEST, "pixels")
    got = digests["PIXELS_DIGEST"]
    assert got == want, f"pixels digest {got} != pinned {want} (see the module docstring)"


if __name__ == "__main__":
    print(f"CPU class: {cpu_class()}")
    print(f'ROLLOUT_DIGEST = "{digest(rollout_outputs())}"')
    print(f'PIXELS_DIGEST = "{digest(pixel_outputs())}"')
    print(f'RANDOM_STARTS_DIGEST = "{digest(random_start_outputs())}"')
