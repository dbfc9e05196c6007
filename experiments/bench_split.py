"""Training as one fused program or as split collect/label/learn programs: compile and run time.

Usage: python experiments/bench_split.py [--epochs 60] [--runs 3]

Side by side in one process, on the quick preset's training configuration (oval, state
observations, 16 envs x 8 steps and 8 updates per epoch): for each way, the first
`train_many` (compile included, and the seconds spent compiling from JAX's monitoring
events), the same job again (run time only), then a job with a new reward bank, which is
what every iteration of the loop does. Writes results/bench_split.json.
"""

from __future__ import annotations

import argparse
import time

import jax
from common import print_table, write_results

import jaxrace
from jaxrace.agents import TrainConfig, make_train, train_many
from jaxrace.agents.networks import NetworkConfig
from jaxrace.design.compilation import CompileClock
from jaxrace.rewards import RewardBank, library_reward


def timed(fn):
    with CompileClock() as clock:
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        return time.perf_counter() - t0, clock.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    env, params = jaxrace.make(track="oval", start="time_trial", laps=1000, time_limit=60.0)
    config = TrainConfig(network=NetworkConfig(recurrent=False, hidden=64), num_envs=16, rollout_steps=8,
                         updates_per_epoch=8, batch_size=128, replay_size=50_000, warmup_epochs=2,
                         epochs=args.epochs)
    banks = [RewardBank.from_compiled([library_reward("progress"), library_reward("gt_sophy")]),
             RewardBank.from_compiled([library_reward("gt_sophy"), library_reward("progress")])]
    indices = [i % 2 for i in range(args.runs)]
    steps = args.runs * args.epochs * config.num_envs * config.rollout_steps
    table, rows = [], []
    for fused in (True, False):
        way = "fused (one program)" if fused else "split (collect, label, learn)"
        trainer = make_train(config, env, params, banks[0])  # a new Learner: nothing compiled yet

        def job(t=trainer, f=fused):
            return train_many(t, jax.random.key(0), indices, chunk_epochs=args.epochs // 2, fused=f)[1]

        first, first_compile = timed(job)
        again, _ = timed(job)
        other = trainer.with_bank(banks[1])
        new_bank, new_compile = timed(lambda o=other, f=fused: train_many(
            o, jax.random.key(0), indices, chunk_epochs=args.epochs // 2, fused=f)[1])
        table.append([way, f"{first:.1f}", f"{first_compile:.1f}", f"{again:.2f}", f"{steps / again:,.0f}",
                      f"{new_bank:.1f}", f"{new_compile:.1f}"])
        rows += [{"name": f"{way}: first job, wall incl. compile", "value": round(first, 2), "unit": "s"},
                 {"name": f"{way}: first job, compiling", "value": round(first_compile, 2), "unit": "s"},
                 {"name": f"{way}: the same job again (run only)", "value": round(again, 3), "unit": "s"},
                 {"name": f"{way}: env steps/s, all runs", "value": round(steps / again, 1), "unit": "steps/s"},
                 {"name": f"{way}: job with a new bank, wall", "value": round(new_bank, 2), "unit": "s"},
                 {"name": f"{way}: job with a new bank, compiling", "value": round(new_compile, 2), "unit": "s"}]
    print(f"{args.runs} runs x {args.epochs} epochs ({steps:,} env steps, "
          f"{args.runs * args.epochs * config.updates_per_epoch:,} updates)")
    print_table(["programs", "first job (s)", "compiling (s)", "again (s)", "env steps/s", "new bank (s)",
                 "compiling (s)"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
