"""Spread a batch of envs over devices: all GPUs, or all CPU cores.

XLA runs one program on one CPU core (parallelism inside an op is rare for the small
per-car arrays of a race). To use every core, make each core a device before JAX runs
anything (``use_cpu_devices(cpu_devices("auto"))``, as `jaxrace design` does, or
``XLA_FLAGS=--xla_force_host_platform_device_count=<cores>``) and shard the env axis
over them: the halves then run concurrently. On a GPU host the same sharding splits the batch over the GPUs.

Example:
    sharding = env_sharding()
    keys = jax.device_put(jax.random.split(key, 4096), sharding)
    obs, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)), out_shardings=sharding)(keys, params)
    # jit(vmap(env.step)) on these inputs now runs sharded.
"""

from __future__ import annotations

import os
import re
import warnings

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def host_device_flag(count: int | None = None) -> str:
    """The XLA flag that makes `count` CPU devices (default: one per core); set it before importing jax."""
    return f"--xla_force_host_platform_device_count={count or os.cpu_count() or 1}"


def cpu_devices(requested: str | int) -> int:
    """The CPU device count `--cpu-devices` asks for: a whole number >= 1, or 'auto' for one per
    core this process may run on (its CPU affinity, as `taskset` sets it)."""
    if str(requested) == "auto":
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # (macOS has no affinity)
            return os.cpu_count() or 1
    try:
        count = int(requested)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or str(count) != str(requested).strip():
        raise ValueError(f"CPU devices must be 'auto' or a whole number >= 1, got {requested!r}")
    return count


def use_cpu_devices(count: int, warn: bool = True) -> int:
    """Gives JAX `count` CPU devices, so that jobs sharded over them (a trainer's runs, an env batch)
    run on `count` cores at once: on 2 cores a job of 4 runs trains an epoch 1.4x faster split over
    two devices than whole on one (experiments/bench_preset_epoch.py). It acts before JAX runs
    anything; once JAX has started, its devices stay as they are (a warning says so when `count`
    differs, unless `warn` is False). A device count the user set in XLA_FLAGS wins. GPUs are unaffected.

    Returns:
        The CPU device count in effect.
    """
    flag = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    if flag:
        return int(flag.group(1))
    try:
        jax.config.update("jax_num_cpu_devices", int(count))
    except RuntimeError:  # JAX has started (e.g. `jaxrace.cli.main` called from a running program)
        have = len(jax.devices("cpu"))
        if warn and have != count:
            warnings.warn(f"JAX has already started with {have} CPU device(s); asked for {count}: "
                          "set it before JAX runs anything", stacklevel=2)
        return have
    return int(count)


def env_sharding(devices=None, axis_name: str = "env") -> NamedSharding:
    """Shards the leading axis of arrays (envs, or a trainer's runs) over `devices` (default: all)."""
    devices = jax.devices() if devices is None else list(devices)
    return NamedSharding(Mesh(np.array(devices), (axis_name,)), PartitionSpec(axis_name))


def shard_envs(tree, sharding: NamedSharding | None = None, *, strict: bool = True):
    """Puts a pytree of [N, ...] arrays on the devices, split along the leading axis.

    Args:
        tree: arrays with a leading env (or run) axis N; scalars are replicated.
        sharding: from `env_sharding` (default: all devices).
        strict: when the devices do not divide N, raise (True) or leave the tree where
            it is (False: the trainer's run axis, which may be any size).

    Raises:
        ValueError: if strict and N is not a multiple of the number of devices.
    """
    sharding = sharding or env_sharding()
    count = sharding.mesh.size
    sizes = {np.shape(leaf)[0] for leaf in jax.tree.leaves(tree) if np.ndim(leaf) > 0}
    bad = sorted(n for n in sizes if n % count)
    if bad and strict:
        name = sharding.mesh.axis_names[0]
        raise ValueError(f"cannot split {bad[0]} {name}s over {count} devices: use a multiple of {count}")
    if bad or count == 1:
        return tree
    if not sharding.is_fully_addressable:
        return jax.tree.map(lambda x: _global_array(x, sharding), tree)
    return jax.device_put(tree, sharding)


def _global_array(x, sharding: NamedSharding) -> jax.Array:
    """`x` (the same whole value in every process) as an array spanning the processes' devices."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.device_put(x, sharding)
    if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        data = np.asarray(jax.random.key_data(x))
        spec = sharding if np.ndim(x) else sharding.update(spec=PartitionSpec())
        return jax.random.wrap_key_data(jax.make_array_from_callback(data.shape, spec, lambda i: data[i]), impl=impl)
    data = np.asarray(x)
    spec = sharding if data.ndim else sharding.update(spec=PartitionSpec())
    return jax.make_array_from_callback(data.shape, spec, lambda i: data[i])
