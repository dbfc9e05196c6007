import os
import subprocess
import sys
import textwrap

import jax
import pytest

from jaxrace.envs.parallel import cpu_devices, env_sharding, host_device_flag, shard_envs, use_cpu_devices

# Run in a fresh interpreter: the number of CPU devices is fixed when jax starts.
SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    import jaxrace
    from jaxrace.envs.parallel import env_sharding, shard_envs
    assert len(jax.devices()) == 2, jax.devices()
    env, params = jaxrace.make(track="oval", num_opponents=3, start="random")
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def rollout(keys, state):
        def body(state, t):
            k = jax.vmap(lambda kk: jax.random.fold_in(kk, t))(keys)
            a = jax.vmap(lambda kk: jax.random.uniform(kk, (2,), minval=-1, maxval=1))(k)
            _, state, r, *_ = step(k, state, a, params)
            return state, r
        return jax.lax.scan(body, state, jnp.arange(30))

    keys = jax.random.split(jax.random.key(0), 8)
    reset = jax.vmap(env.reset, in_axes=(0, None))
    _, state = jax.jit(reset)(keys, params)
    plain_state, plain_r = jax.jit(rollout)(keys, state)
    sharded_keys, sharded_state = shard_envs((keys, state))
    assert sharded_state.time.sharding.num_devices == 2
    out_state, out_r = jax.jit(rollout)(sharded_keys, sharded_state)
    assert len(out_r.sharding.device_set) == 2
    np.testing.assert_allclose(np.asarray(out_r), np.asarray(plain_r), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out_state.cars.progress), np.asarray(plain_state.cars.progress),
                               rtol=1e-5, atol=1e-4)
    try:
        shard_envs(jax.random.split(jax.random.key(0), 3))
    except ValueError as err:
        assert "cannot split 3 envs over 2 devices" in str(err)
    else:
        raise AssertionError("an odd batch was accepted")
    print("ok")
""")


def test_sharded_rollout_on_two_cpu_devices_equals_the_unsharded_one():
    env = {**os.environ, "XLA_FLAGS": host_device_flag(2), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_single_device_sharding_and_flag():
    assert host_device_flag(3) == "--xla_force_host_platform_device_count=3"
    tree = shard_envs({"a": jax.numpy.zeros((4, 2))}, env_sharding(jax.devices()[:1]))
    assert tree["a"].shape == (4, 2)
    with pytest.raises(ValueError, match="cannot split"):
        shard_envs({"a": jax.numpy.zeros((3,))}, env_sharding([jax.devices()[0]] * 2))


def test_cpu_devices_reads_auto_as_the_affinity_and_refuses_what_is_not_a_count():
    assert cpu_devices("auto") == len(os.sched_getaffinity(0))
    assert cpu_devices("3") == 3 and cpu_devices(2) == 2
    for bad in ("0", "-1", "two", "2.5", ""):
        with pytest.raises(ValueError, match=f"'auto' or a whole number >= 1, got {bad!r}"):
            cpu_devices(bad)


DEVICES = "from jaxrace.envs.parallel import use_cpu_devices; import jax; print(use_cpu_devices(2), jax.device_count())"


@pytest.mark.parametrize("flags, expected", [("", "2 2"), (host_device_flag(3), "3 3")])
def test_use_cpu_devices_before_jax_starts_and_an_xla_flag_wins(flags, expected):
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", DEVICES], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == expected.split()


def test_use_cpu_devices_after_jax_started_keeps_them_and_warns_when_they_differ():
    have = len(jax.devices("cpu"))  # jax has started in this process
    with pytest.warns(UserWarning, match=f"already started with {have} CPU device"):
        assert use_cpu_devices(have + 1) == have
    assert use_cpu_devices(have + 1, warn=False) == have and jax.device_count() == have
