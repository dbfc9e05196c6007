"""Small rewrites that make XLA:CPU emit fast code for the env's many tiny arrays.

The env works on arrays like f32[envs, cars] and f32[envs, cars, k] with k of 2 to 8.
Each function here means exactly what its numpy namesake means; only the code XLA emits
differs (measured with `experiments/bench_env.py` and a per-fusion profile):

- a reduction over a short trailing axis becomes a custom reduce kernel call per use;
  unrolled into adds it fuses with its neighbours;
- every consumer of a long elementwise chain gets its own copy of the chain: a fusion
  boundary, forced with `materialised`, computes it once;
- `lax.top_k` over a short row is a sort kernel call per row; `smallest_k` is a few
  passes of compare-and-select that fuse.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp


def sum_last(x: jax.Array) -> jax.Array:
    """x.sum(-1) for a short, static last axis, as a chain of adds (bool counts as int32)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int32)
    return functools.reduce(operator.add, [x[..., j] for j in range(x.shape[-1])])


def any_last(x: jax.Array) -> jax.Array:
    """x.any(-1) for a short, static last axis, as a chain of ors."""
    return functools.reduce(operator.or_, [x[..., j] for j in range(x.shape[-1])])


def materialised(x: jax.Array) -> jax.Array:
    """`x` unchanged (float, finite), but computed once however many fusions read it.

    XLA does not duplicate an expensive producer (a float divide) into several
    consumers, so dividing by an exact 1.0 puts a fusion boundary here. Infinities and
    NaN become NaN (0 * inf); use it on values that are finite.
    """
    return x / (1.0 + 0.0 * x)


def smallest_k(values: jax.Array, k: int) -> jax.Array:
    """i32[..., k]: indices of the k smallest entries of the last axis, in increasing order.

    Same result as `lax.top_k(-values, k)[1]` (ties go to the lower index), but as k
    passes of compare-and-select over the (short, static) last axis instead of a sort
    kernel call per row.
    """
    n = values.shape[-1]
    cols = [values[..., j] for j in range(n)]
    taken = [jnp.zeros(values.shape[:-1], bool) for _ in range(n)]
    picked = []
    for _ in range(k):
        best_v = jnp.full(values.shape[:-1], jnp.inf, values.dtype)
        best_i = jnp.full(values.shape[:-1], n, jnp.int32)
        for j in range(n):
            better = ~taken[j] & ((cols[j] < best_v) | (best_i == n))
            best_v = jnp.where(better, cols[j], best_v)
            best_i = jnp.where(better, j, best_i)
        taken = [t | (best_i == j) for j, t in enumerate(taken)]
        picked.append(best_i)
    return jnp.stack(picked, axis=-1)
