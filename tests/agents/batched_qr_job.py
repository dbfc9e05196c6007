"""Run by test_networks in a fresh process: pinned to the 2 cores given (before JAX sizes
its thread pool from them), 8 vmapped orthogonal initialisations in one program, 50 times.
It prints "finished" unless it hangs.

`python batched_qr_job.py CORE CORE flax` uses flax's initializer as it is, which hangs on
jaxlib 0.10's CPU LAPACK kernels (two batched QRs at once block XLA's 2-thread pool).
"""

import os
import sys

os.sched_setaffinity(0, {int(c) for c in sys.argv[1:3]})

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402

from jaxrace.agents.networks import one_key_at_a_time  # noqa: E402

orthogonal = nn.initializers.orthogonal()
init = orthogonal if sys.argv[3:] == ["flax"] else one_key_at_a_time(orthogonal)


@jax.jit
def draw(key):
    return [jax.vmap(lambda k: init(k, (256, 256)))(jax.random.split(layer, 2)) for layer in jax.random.split(key, 8)]


for seed in range(50):
    jax.block_until_ready(draw(jax.random.key(seed)))
print("finished")
