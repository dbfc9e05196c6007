"""Throughput of the state-only race env: steps per second and compile time.

Usage: python experiments/bench_env.py [--steps 50] [--repeats 3]

For each batch size (parallel envs) and opponent count: a jitted `lax.scan` of vmapped
`env.step` (auto-reset included) with random actions. Compile time is lower+compile of
that program; steps/s is the median over repeats of env steps per wall second.
Agent-steps/s counts every simulated car (the AI opponents are agents too).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from common import print_table, write_results

import jaxrace


def bench(num_envs: int, num_opponents: int, steps: int, repeats: int) -> dict:
    start = "grid_back" if num_opponents else "time_trial"
    env, params = jaxrace.make(track="club", num_opponents=num_opponents, start=start)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def rollout(key, state):
        def body(state, k):
            k_act, k_step = jax.random.split(k)
            action = jax.random.uniform(k_act, (num_envs, 2), minval=-1.0, maxval=1.0)
            action = action.at[:, 1].set(0.2 + 0.8 * action[:, 1] ** 2)  # mostly throttle: cars get moving
            _, state, reward, *_ = step(jax.random.split(k_step, num_envs), state, action, params)
            return state, reward.sum()

        return jax.lax.scan(body, state, jax.random.split(key, steps))

    _, state = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(0), num_envs), params)
    t0 = time.perf_counter()
    compiled = jax.jit(rollout).lower(jax.random.key(1), state).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        state, total = compiled(jax.random.key(2 + r), state)
        jax.block_until_ready(total)
        times.append(time.perf_counter() - t0)
    sps = num_envs * steps / float(np.median(times))
    return {"envs": num_envs, "opponents": num_opponents, "compile_s": compile_s, "steps_per_s": sps,
            "agent_steps_per_s": sps * (1 + num_opponents)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="agent steps per timed call (x envs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 256, 4096])
    parser.add_argument("--opponents", type=int, nargs="+", default=[0, 7])
    args = parser.parse_args()
    results = []
    for opponents in args.opponents:
        for envs in args.envs:
            steps = args.steps * (8 if envs == 1 else 1)  # enough work to time a single env
            results.append(bench(envs, opponents, steps, args.repeats))
            r = results[-1]
            print(f"envs={envs:5d} opponents={opponents}: compile {r['compile_s']:.1f} s, "
                  f"{r['steps_per_s']:,.0f} env steps/s, {r['agent_steps_per_s']:,.0f} agent-steps/s", flush=True)
    print()
    print_table(["parallel envs", "opponents", "env steps/s", "agent-steps/s (all cars)", "compile"],
                [[r["envs"], r["opponents"], f"{r['steps_per_s']:,.0f}", f"{r['agent_steps_per_s']:,.0f}",
                  f"{r['compile_s']:.1f} s"] for r in results])
    rows = []
    for r in results:
        tag = f"{r['envs']} envs, {r['opponents']} opponents"
        rows += [
            {"name": f"env steps/s, {tag}", "value": round(r["steps_per_s"]), "unit": "steps/s"},
            {"name": f"agent-steps/s, {tag}", "value": round(r["agent_steps_per_s"]), "unit": "steps/s"},
            {"name": f"compile time, {tag}", "value": round(r["compile_s"], 2), "unit": "s"},
        ]
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
