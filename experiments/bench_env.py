"""Throughput of the state-only race env: steps per second and compile time.

Usage: python experiments/bench_env.py [--steps 50] [--repeats 3]

For each batch size (parallel envs) and opponent count: a jitted `lax.scan` of vmapped
`env.step` (auto-reset included) with random actions. Compile time is lower+compile of
that program; steps/s is the median over repeats of env steps per wall second.
Agent-steps/s counts every simulated car (the AI opponents are agents too).

Each configuration runs twice, side by side: on one device (XLA runs the program on one
core) and with the env batch sharded over one device per core
(`jaxrace.envs.parallel`), which is how to use a whole CPU.
"""

from __future__ import annotations

import argparse
import os
import time

if "XLA_FLAGS" not in os.environ:  # one CPU device per core; must precede importing jax
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from common import print_table, write_results  # noqa: E402

import jaxrace  # noqa: E402
from jaxrace.envs.parallel import env_sharding  # noqa: E402


def bench(num_envs: int, num_opponents: int, steps: int, repeats: int, devices: list) -> dict:
    start = "grid_back" if num_opponents else "time_trial"
    env, params = jaxrace.make(track="club", num_opponents=num_opponents, start=start)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    sharding = env_sharding(devices)

    def rollout(keys, state):
        def body(state, t):
            k = jax.vmap(lambda key: jax.random.fold_in(key, t))(keys)  # each env keeps its own key stream
            k_act, k_step = jax.vmap(jax.random.split, out_axes=1)(k)
            action = jax.vmap(lambda key: jax.random.uniform(key, (2,), minval=-1.0, maxval=1.0))(k_act)
            action = action.at[:, 1].set(0.2 + 0.8 * action[:, 1] ** 2)  # mostly throttle: cars get moving
            _, state, reward, *_ = step(k_step, state, action, params)
            return state, reward.sum()

        return jax.lax.scan(body, state, jax.numpy.arange(steps))

    keys = jax.device_put(jax.random.split(jax.random.key(0), num_envs), sharding)
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)), out_shardings=sharding)
    _, state = reset(keys, params)
    t0 = time.perf_counter()
    compiled = jax.jit(rollout).lower(keys, state).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        keys_r = jax.device_put(jax.random.split(jax.random.key(2 + r), num_envs), sharding)
        t0 = time.perf_counter()
        state, total = compiled(keys_r, state)
        jax.block_until_ready(total)
        times.append(time.perf_counter() - t0)
    sps = num_envs * steps / float(np.median(times))
    return {"envs": num_envs, "opponents": num_opponents, "devices": len(devices), "compile_s": compile_s,
            "steps_per_s": sps, "agent_steps_per_s": sps * (1 + num_opponents)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="agent steps per timed call (x envs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 256, 4096])
    parser.add_argument("--opponents", type=int, nargs="+", default=[0, 7])
    args = parser.parse_args()
    results = []
    all_devices = jax.devices()
    for opponents in args.opponents:
        for envs in args.envs:
            steps = args.steps * (8 if envs == 1 else 1)  # enough work to time a single env
            layouts = [all_devices[:1]] + ([all_devices] if len(all_devices) > 1 and envs % len(all_devices) == 0
                                           else [])
            for devices in layouts:
                results.append(bench(envs, opponents, steps, args.repeats, devices))
                r = results[-1]
                print(f"envs={envs:5d} opponents={opponents} devices={len(devices)}: compile {r['compile_s']:.1f} s, "
                      f"{r['steps_per_s']:,.0f} env steps/s, {r['agent_steps_per_s']:,.0f} agent-steps/s",
                      flush=True)
    print()
    print_table(["parallel envs", "opponents", "devices", "env steps/s", "agent-steps/s (all cars)", "compile"],
                [[r["envs"], r["opponents"], r["devices"], f"{r['steps_per_s']:,.0f}",
                  f"{r['agent_steps_per_s']:,.0f}", f"{r['compile_s']:.1f} s"] for r in results])
    rows = []
    for r in results:
        tag = f"{r['envs']} envs, {r['opponents']} opponents, {r['devices']} device(s)"
        rows += [
            {"name": f"env steps/s, {tag}", "value": round(r["steps_per_s"]), "unit": "steps/s"},
            {"name": f"agent-steps/s, {tag}", "value": round(r["agent_steps_per_s"]), "unit": "steps/s"},
            {"name": f"compile time, {tag}", "value": round(r["compile_s"], 2), "unit": "s"},
        ]
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
