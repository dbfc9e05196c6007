"""N reward candidates trained in one vmapped job versus one after another.

Usage: python experiments/bench_train.py [--epochs 30]

Side by side in one run, on the oval (time trial, state observations):
1. N = 5 candidates (the two library rewards and three offline proposals), one job
   of 5 vmapped runs, versus 5 jobs of 1 run each in sequence; the same total samples
   and updates; wall time with compilation included. Sequential jobs in one process
   reuse one compilation (a fair baseline; separate processes would compile 5 times).
2. Per-run env steps/s and gradient updates/s at N = 1, 5 and 16 runs per job, after
   compilation.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from common import print_table, write_results

import jaxrace
from jaxrace.agents.trainer import TrainConfig, make_train, train_many
from jaxrace.rewards import RewardBank, compile_reward, library_reward, propose


def wall(fn):
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    env, params = jaxrace.make(track="oval", start="time_trial", time_limit=60.0)
    proposals = propose("drive fast laps cleanly", 14, jax.random.key(0))
    rewards = [library_reward("progress"), library_reward("gt_sophy")]
    rewards += [compile_reward(p.source, name=p.name) for p in proposals]
    bank = RewardBank.from_compiled(rewards)
    config = TrainConfig(num_envs=16, rollout_steps=8, updates_per_epoch=8, batch_size=128, epochs=args.epochs)
    key = jax.random.key(1)

    # 1. N = 5: one vmapped job vs five sequential jobs (fresh trainers: compile included).
    vmapped_s, _ = wall(lambda: train_many(make_train(config, env, params, bank), key, list(range(5)))[1])
    sequential = make_train(config, env, params, bank)
    seq_times = [wall(lambda i=i: train_many(sequential, jax.random.fold_in(key, i), [i])[1])[0] for i in range(5)]
    sequential_s = sum(seq_times)
    ratio = vmapped_s / sequential_s
    print(f"N=5: one vmapped job {vmapped_s:.1f} s, five sequential jobs {sequential_s:.1f} s "
          f"(first {seq_times[0]:.1f} s with compile, then {np.median(seq_times[1:]):.1f} s each): ratio {ratio:.2f}")
    rows = [
        {"name": "N=5 candidates, one vmapped job, wall incl. compile", "value": round(vmapped_s, 2), "unit": "s"},
        {"name": "N=5 candidates, 5 sequential jobs, wall incl. compile", "value": round(sequential_s, 2),
         "unit": "s"},
        {"name": "N=5 vmapped / sequential wall time", "value": round(ratio, 3), "unit": "x"},
    ]

    # 2. Throughput per run at N = 1, 5, 16 (compiled first, then timed).
    table = []
    steps_per_run = config.epochs * config.num_envs * config.rollout_steps
    updates_per_run = config.epochs * config.updates_per_epoch
    for n in (1, 5, 16):
        trainer = make_train(config, env, params, bank)
        compile_s, _ = wall(lambda t=trainer, n=n: train_many(t, key, list(range(n)))[1])  # compile + one job
        run_s, _ = wall(lambda t=trainer, n=n: train_many(t, jax.random.key(2), list(range(n)))[1])
        table.append([n, f"{steps_per_run / run_s:,.0f}", f"{n * steps_per_run / run_s:,.0f}",
                      f"{updates_per_run / run_s:,.1f}", f"{run_s:.1f} s", f"{compile_s - run_s:.1f} s"])
        print(f"N={n:2d}: {run_s:.1f} s per job; per run {steps_per_run / run_s:,.0f} env steps/s, "
              f"{updates_per_run / run_s:.1f} updates/s", flush=True)
        rows += [
            {"name": f"env steps/s per run, N={n}", "value": round(steps_per_run / run_s, 1), "unit": "steps/s"},
            {"name": f"env steps/s all runs, N={n}", "value": round(n * steps_per_run / run_s, 1), "unit": "steps/s"},
            {"name": f"gradient updates/s per run, N={n}", "value": round(updates_per_run / run_s, 2),
             "unit": "updates/s"},
            {"name": f"job wall time after compile, N={n}", "value": round(run_s, 2), "unit": "s"},
            {"name": f"compile time (approx.), N={n}", "value": round(compile_s - run_s, 2), "unit": "s"},
        ]
    print()
    print_table(["runs N", "env steps/s per run", "env steps/s, all runs", "updates/s per run", "job time",
                 "compile (approx.)"], table)
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
