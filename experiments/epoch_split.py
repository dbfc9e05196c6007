"""Where a training epoch's time goes: each program of a design preset's job, compiled and timed apart.

Usage: python experiments/epoch_split.py [--preset paper] [--config FILE.toml] [--runs 2] [--epochs 5]
                                         [--variants preset feedforward]

For R runs vmapped in one job with the preset's networks, envs, batches and replay (the
library `progress` reward in the bank): the compile seconds of `init`, `collect`, `label`
and the fused `learn` (the GPU's path: `updates_per_epoch` updates in one scan; with
`--host-updates` the CPU's, each update its own call, timed together), then the
median seconds of each over `--epochs` epochs, each waited for on its own. A variant
`feedforward` is the same preset without the actor's GRU, for the recurrent network's
share, and `sequential` the preset with `TrainConfig(sequential_runs=True)` (each program
loops over the runs instead of vmapping them: plain convolutions, not grouped ones). Writes
results/epoch_split.json (JAXRACE_RESULTS_TAG=TAG: -TAG.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
from common import print_table, write_results

from jaxrace.agents import HParams, make_train, runner
from jaxrace.design.config import load_config
from jaxrace.design.loop import Envs, train_config
from jaxrace.rewards import RewardBank, library_reward


def timed(fn, *args):
    started = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - started


def measure(trainer, runs: int, epochs: int) -> dict:
    """Compile seconds (first call) and median run seconds of each program of an epoch."""
    learner = trainer.learner
    keys = jax.random.split(jax.random.key(0), runs)
    hparams = runner.per_run_hparams(HParams(), runs)
    reward_params = runner._reward_params(trainer, hparams, jnp.zeros(runs, jnp.int32))
    hparams = hparams.replace(reward_params=None)
    index = jnp.zeros(runs, jnp.int32)
    out = {}
    state, out["init_first_s"] = timed(runner._init_runs, learner, keys, hparams)
    state = runner.committed(state)  # as train_many does: an uncommitted state compiles each program again
    seconds = {"collect": [], "label": [], "learn": []}
    for epoch in range(epochs + 1):
        (state, collected), c = timed(runner._collect, learner, state)
        rewards, lab = timed(runner._label, trainer, collected, index, reward_params)
        if learner.config.host_updates:
            (state, _), lrn = timed(lambda *a: runner._host_learn(*a, epoch=learner.config.warmup_epochs),
                                    learner, state, hparams, collected, rewards)
        else:
            (state, _), lrn = timed(runner._learn, learner, state, hparams, collected, rewards)
        for name, s in (("collect", c), ("label", lab), ("learn", lrn)):
            if epoch == 0:
                out[f"{name}_first_s"] = s
            else:
                seconds[name].append(s)
    for name, s in seconds.items():
        out[f"{name}_s"] = statistics.median(s)
        out[f"{name}_max_s"] = max(s)
    out["epoch_s"] = sum(out[f"{name}_s"] for name in seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--config", default=None, help="a TOML file of DesignConfig fields over the preset")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs after the first (compiling) one")
    parser.add_argument("--host-updates", action="store_true",
                        help="learn as the CPU's pixel actor does: each update its own call (TrainConfig.host_updates)")
    parser.add_argument("--variants", nargs="+", default=["preset", "feedforward"],
                        choices=["preset", "feedforward", "sequential"])
    args = parser.parse_args()
    c = load_config(args.preset, args.config)
    envs = Envs.make(c)
    bank = RewardBank.from_compiled([library_reward("progress")])
    rows, table = [], []
    for variant in args.variants:
        config = train_config(c, host_updates=args.host_updates)
        if variant == "feedforward":
            config = dataclasses.replace(config, network=dataclasses.replace(config.network, recurrent=False))
        elif variant == "sequential":
            config = dataclasses.replace(config, sequential_runs=True)
        m = measure(make_train(config, envs.train_env, envs.train_params, bank), args.runs, args.epochs)
        updates = c.updates_per_epoch
        table.append([variant, args.runs, f"{m['init_first_s']:.1f}", f"{m['collect_first_s']:.1f}",
                      f"{m['learn_first_s']:.1f}", f"{1000 * m['collect_s']:.0f}", f"{1000 * m['label_s']:.0f}",
                      f"{1000 * m['learn_s']:.0f}", f"{1000 * m['learn_s'] / updates:.1f}",
                      f"{1000 * m['epoch_s']:.0f}"])
        rows.append({"name": f"{c.preset} ({variant}): {args.runs} runs per job, seconds per epoch",
                     "value": round(m["epoch_s"], 4), "unit": "s", "variant": variant, "runs": args.runs,
                     "num_envs": c.num_envs, "rollout_steps": c.rollout_steps, "updates_per_epoch": updates,
                     "batch_size": c.batch_size, "hidden": c.hidden, "recurrent": config.network.recurrent,
                     **{k: round(v, 4) for k, v in m.items()}})
        write_results(__file__, rows)  # after each variant: a run cut short keeps what it measured
        print(variant, m, flush=True)
    print(f"{c.preset}: {c.num_envs} envs x {c.rollout_steps} steps and {c.updates_per_epoch} updates of "
          f"{c.batch_size} per epoch; first calls include compiling; medians of {args.epochs} epochs")
    print_table(["network", "runs", "init first (s)", "collect first (s)", "learn first (s)", "collect (ms)",
                 "label (ms)", "learn (ms)", "per update (ms)", "epoch (ms)"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
