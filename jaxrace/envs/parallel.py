"""Spread a batch of envs over devices: all GPUs, or all CPU cores.

XLA runs one program on one CPU core (parallelism inside an op is rare for the small
per-car arrays of a race). To use every core, start the process with
``XLA_FLAGS=--xla_force_host_platform_device_count=<cores>`` (before jax is imported)
so that each core is a device, and shard the env axis over them: the halves then run
concurrently. On a GPU host the same sharding splits the batch over the GPUs.

Example:
    sharding = env_sharding()
    keys = jax.device_put(jax.random.split(key, 4096), sharding)
    obs, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)), out_shardings=sharding)(keys, params)
    # jit(vmap(env.step)) on these inputs now runs sharded.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def host_device_flag(count: int | None = None) -> str:
    """The XLA flag that makes `count` CPU devices (default: one per core); set it before importing jax."""
    return f"--xla_force_host_platform_device_count={count or os.cpu_count() or 1}"


def env_sharding(devices=None) -> NamedSharding:
    """Shards the leading (env) axis of arrays over `devices` (default: all)."""
    devices = jax.devices() if devices is None else list(devices)
    return NamedSharding(Mesh(np.array(devices), ("env",)), PartitionSpec("env"))


def shard_envs(tree, sharding: NamedSharding | None = None):
    """Puts a pytree of [num_envs, ...] arrays on the devices, split along the env axis.

    Raises:
        ValueError: if num_envs is not a multiple of the number of devices.
    """
    sharding = sharding or env_sharding()
    count = sharding.mesh.size
    sizes = {np.shape(leaf)[0] for leaf in jax.tree.leaves(tree) if np.ndim(leaf) > 0}
    bad = sorted(n for n in sizes if n % count)
    if bad:
        raise ValueError(f"cannot split {bad[0]} envs over {count} devices: use a multiple of {count}")
    return jax.device_put(tree, sharding)
