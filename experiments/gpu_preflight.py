"""Before a lease's long job: does this machine's jax build, load and run a reward?

Builds the library's `gt_sophy` in the sandbox worker, then calls the artifact under jit,
vmap (two axes) and grad w.r.t. the weights on the synthetic batch. Exits non-zero with
the traceback if any step fails, so a lease script can fall back to a job that needs no
reward builds. Prints the sandbox level the worker got.
"""
import sys
import time

import jax
import jax.numpy as jnp

from jaxrace.rewards import library, synthetic
from jaxrace.rewards.compiler import compile_reward


def main() -> int:
    print("jax", jax.__version__, jax.devices(), flush=True)
    t = time.perf_counter()
    reward = compile_reward(library.LIBRARY["gt_sophy"], name="gt_sophy")
    print(f"built gt_sophy in {time.perf_counter() - t:.1f} s: {len(reward.component_names)} components", flush=True)
    prev, action, curr, _ = synthetic.synthetic_batch()
    w = reward.weights()
    total, _ = jax.jit(reward.apply)(w, prev, action, curr)
    pair = jax.tree.map(lambda x: jnp.stack([x, x]), (prev, action, curr))
    nested = jax.vmap(jax.vmap(reward.apply, in_axes=(None, 0, 0, 0)), in_axes=(0, None, None, None))
    both, _ = jax.jit(nested)(jnp.stack([w, 2 * w]), *pair)
    grad = jax.grad(lambda w: reward.apply(w, prev, action, curr)[0].sum())(w)
    ok = bool(jnp.all(jnp.isfinite(total))) and both.shape == (2, 2) + total.shape \
        and bool(jnp.allclose(both[0, 0], total)) and bool(jnp.all(jnp.isfinite(grad)))
    print("jit", total.shape, "vmap", both.shape, "grad", grad.shape, "ok" if ok else "WRONG", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
