"""The pixel encoder's gradient over R runs with their own weights: vmapped, looped, patches.

Usage: python experiments/bench_run_conv.py [--runs 1 2 4] [--frames 256] [--rounds 5]

train_many vmaps every run's update, so the actor's CNN is vmapped over R kernels, and
XLA batches a convolution over its kernel as one grouped convolution (feature_group_count
R). Per R, four ways, the actor's encoder (the paper preset's: 64x64 frames, channels
32-64-64, 256 units), value and gradient of a sum over `--frames` frames per run:
`vmapped` (what train_many does by default), `lax.map` (the runs one after another in one
program: `TrainConfig(sequential_runs=True)`), `patches` (each layer as image patches
times the kernel, which vmap batches as a matrix product; same values, tested here), and
`one run at a time` (the unvmapped program called R times: the reference). Medians over
interleaved rounds; compile seconds apart.
Writes results/bench_run_conv.json (JAXRACE_RESULTS_TAG=TAG: -TAG.json).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import print_table, write_results

from jaxrace.agents.networks import Encoder, NetworkConfig


def patch_conv(x, kernel, bias, strides):
    """nn.Conv's layer (SAME padding) as image patches times the kernel: x f32[N, H, W, C]."""
    patches = jax.lax.conv_general_dilated_patches(x, kernel.shape[:2], strides, "SAME",
                                                   dimension_numbers=("NHWC", "OIHW", "NHWC"),
                                                   precision=jax.lax.Precision.HIGHEST)
    return patches @ jnp.transpose(kernel, (2, 0, 1, 3)).reshape(-1, kernel.shape[-1]) + bias  # features (C, kh, kw)


def patch_encoder(params, obs):
    """Encoder.apply with every convolution as `patch_conv`."""
    p = params["params"]
    x = obs["pixels"].astype(jnp.float32) / 255.0
    for i in range(len([k for k in p if k.startswith("Conv_")])):
        x = jax.nn.relu(patch_conv(x, p[f"Conv_{i}"]["kernel"], p[f"Conv_{i}"]["bias"], (2, 2)))
    x = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
    x = jnp.concatenate([obs["proprio"], x], axis=-1)
    return jax.nn.relu(x @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"])


def programs(runs: int, frames: int, hidden: int):
    """{way: (jitted fn, args, calls per round)} for one R."""
    keys = jax.random.split(jax.random.key(0), 3)
    obs = {"pixels": jax.random.randint(keys[0], (runs, frames, 64, 64, 3), 0, 256).astype(jnp.uint8),
           "proprio": jax.random.normal(keys[1], (runs, frames, 20))}
    encoder = Encoder(NetworkConfig(actor_input="pixels", hidden=hidden))
    params = jax.vmap(lambda k: encoder.init(k, jax.tree.map(lambda x: x[0, :1], obs)))(jax.random.split(keys[2], runs))
    grad = jax.value_and_grad(lambda p, o: jnp.sum(encoder.apply(p, o) ** 2))
    patches = jax.value_and_grad(lambda p, o: jnp.sum(patch_encoder(p, o) ** 2))
    first = jax.tree.map(lambda x: x[0], (params, obs))
    np.testing.assert_allclose(patches(*first)[0], grad(*first)[0], rtol=1e-4)  # the same layers
    return {"vmapped": (jax.jit(jax.vmap(grad)), (params, obs), 1),
            "lax.map": (jax.jit(lambda p, o: jax.lax.map(lambda a: grad(*a), (p, o))), (params, obs), 1),
            "unrolled": (jax.jit(lambda p, o: jax.lax.scan(lambda c, a: (c, grad(*a)), None, (p, o),
                                                          unroll=True)[1]), (params, obs), 1),
            "patches": (jax.jit(jax.vmap(patches)), (params, obs), 1),
            "one run at a time": (jax.jit(grad), first, runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--frames", type=int, default=256, help="frames per run")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows, table = [], []
    for runs in args.runs:
        ways = programs(runs, args.frames, args.hidden)
        compile_s, seconds = {}, {w: [] for w in ways}
        for way, (fn, fargs, _) in ways.items():
            started = time.perf_counter()
            jax.block_until_ready(fn(*fargs))
            compile_s[way] = time.perf_counter() - started
        for r in range(args.rounds):
            order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]  # rotate: no way always goes first
            for way in order:
                fn, fargs, calls = ways[way]
                started = time.perf_counter()
                for _ in range(calls):
                    jax.block_until_ready(fn(*fargs))
                seconds[way].append(time.perf_counter() - started)
        base = statistics.median(seconds["one run at a time"])
        for way in ways:
            median = statistics.median(seconds[way])
            table.append([runs, way, f"{compile_s[way]:.1f}", f"{1000 * median:.1f}", f"{median / base:.2f}"])
            rows.append({"name": f"encoder value and gradient, {runs} runs x {args.frames} frames, {way}",
                         "value": round(median, 5), "unit": "s", "compile_and_first_call_s": round(compile_s[way], 2),
                         "runs": runs, "frames_per_run": args.frames, "hidden": args.hidden,
                         "rounds": args.rounds, "vs_one_run_at_a_time": round(median / base, 3)})
        write_results(__file__, rows)  # after each R: a run cut short keeps what it measured
    print(f"encoder value and gradient over {args.frames} frames per run; medians of {args.rounds} rounds")
    print_table(["runs", "way", "first call, compiling (s)", "ms per call", "vs one run at a time"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
