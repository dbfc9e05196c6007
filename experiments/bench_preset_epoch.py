"""Seconds per training epoch of a design preset's trainer, by env count and runs per job.

Usage: python experiments/bench_preset_epoch.py [--preset standard] [--envs 16 32] [--runs 3]
       XLA_FLAGS=--xla_force_host_platform_device_count=2 python experiments/bench_preset_epoch.py --runs 4

Sizes a preset's budget: the loop's training job (`jaxrace design`) with the preset's
network, updates, batch and replay on its circuit with its AI field, the library rewards
in the bank, R runs vmapped in one job. Per (envs, runs): the first chunk's seconds
(compiling included), and seconds per epoch from two whole jobs after that (one of
`--chunks` chunks minus one of 1 chunk: `progress` reports lag one chunk behind the
work, so the intervals between them are not chunk times), without and with the job
checkpoint the loop saves after every chunk. Side by side in one process; writes
results/bench_preset_epoch.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import jax
from common import print_table, write_results

from jaxrace.agents import HParams, train_many
from jaxrace.agents.trainer import Trainer, make_learner
from jaxrace.design.config import LIBRARY_BASELINES, load_config
from jaxrace.design.loop import Envs, train_config
from jaxrace.rewards import RewardBank, compile_rewards, library_reward, propose


def timed_job(learner, bank, config, runs: int, chunk: int, chunks: int, saving: bool, reward_scale: float) -> float:
    """Wall seconds of a whole job of `chunks` chunks of `runs` runs (its end waits for the last save)."""
    trainer = Trainer(learner, bank, dataclasses.replace(config, epochs=chunk * chunks))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        state, _, _ = train_many(trainer, jax.random.key(0), [i % bank.num_rewards for i in range(runs)],
                                 hparams=HParams(reward_scale=reward_scale), chunk_epochs=chunk,
                                 checkpoint=f"{tmp}/job.ckpt" if saving else None)
        jax.block_until_ready(state)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="standard")
    parser.add_argument("--envs", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--runs", type=int, nargs="+", default=[3])
    parser.add_argument("--chunk", type=int, default=None, help="epochs per chunk (default: the preset's)")
    parser.add_argument("--chunks", type=int, default=3, help="chunks of the longer timed job")
    parser.add_argument("--averages", type=float, nargs="+", default=None, metavar="RATE",
                        help="policy averaging rates to compare (default: the preset's alone)")
    parser.add_argument("--tag", default="", help="results go to results/bench_preset_epoch-<tag>.json")
    parser.add_argument("--checkpoints", default="both", choices=["both", "none", "every"],
                        help="time jobs without the job checkpoint, with one after every chunk (as the loop), or both")
    parser.add_argument("--banks", nargs="+", default=["library"], choices=["library", "offline"],
                        help="the rewards: the two library rewards, or the offline proposer's programs for the "
                             "preset's task, one per run (as the loop's iterations train)")
    args = parser.parse_args()
    rows, table = [], []
    for envs in args.envs:
        c = load_config(args.preset, num_envs=envs)
        e = Envs.make(c)
        chunk = args.chunk or c.chunk_epochs
        for average in args.averages or [c.actor_average]:
            config = dataclasses.replace(train_config(c), warmup_epochs=min(c.warmup_epochs, chunk // 2),
                                         epochs=chunk, actor_average=average)
            measure(args, c, e, chunk, envs, config, average, rows, table)
    print(f"preset {args.preset}: per epoch = (a job of {args.chunks} chunks - a job of 1) / the epochs between; "
          f"{jax.device_count()} {jax.default_backend()} device(s), runs sharded over them when they divide the runs")
    print_table(["envs", "policy averaging", "runs per job", "rewards", "job checkpoint",
                 "first job of 1 chunk, compiling (s)", "ms per epoch", "env steps/s (all runs)"], table)
    print(write_results(__file__.replace(".py", f"-{args.tag}.py") if args.tag else __file__, rows))


def measure(args, c, e, chunk, envs, config, average, rows, table) -> None:
    """Timed jobs of every (runs, bank) and checkpoint setting for one TrainConfig."""
    learner = make_learner(config, e.train_env, e.train_params)
    for runs, kind in ((r, b) for r in args.runs for b in args.banks):
        if kind == "library":
            rewards = [library_reward(n) for n in LIBRARY_BASELINES]
        else:
            rewards = compile_rewards([p.source for p in propose(c.task, runs, jax.random.key(1))])
        bank = RewardBank.from_compiled(rewards)
        compiled = False
        for saving in {"both": (False, True), "none": (False,), "every": (True,)}[args.checkpoints]:
            setting = (learner, bank, config, runs, chunk)
            # compiles (the programs serve both checkpoint settings)
            first = None if compiled else timed_job(*setting, 1, saving, c.reward_scale)
            compiled = True
            # Reports lag a chunk behind the work, so time whole jobs: one of `chunks` chunks minus one
            # of 1 chunk leaves `chunks - 1` chunks, their checkpoints included.
            one = timed_job(*setting, 1, saving, c.reward_scale)
            many = timed_job(*setting, args.chunks, saving, c.reward_scale)
            per_epoch = (many - one) / ((args.chunks - 1) * chunk)
            steps = envs * c.rollout_steps
            table.append([envs, f"{average:g}" if average else "off", runs, kind,
                          "every chunk" if saving else "none", "" if first is None else f"{first:.1f}",
                          f"{1000 * per_epoch:.0f}", f"{runs * steps / per_epoch:,.0f}"])
            rows.append({"name": f"{args.preset}: {envs} envs, {runs} runs per job, {kind} rewards, "
                                 f"{'a checkpoint per chunk' if saving else 'no checkpoints'}, "
                                 f"policy averaging {average:g}: seconds per epoch",
                         "value": round(per_epoch, 4), "unit": "s",
                         "first_job_of_one_chunk_seconds": None if first is None else round(first, 2),
                         "chunk_epochs": chunk, "env_steps_per_epoch_per_run": steps,
                         "updates_per_epoch": c.updates_per_epoch, "batch_size": c.batch_size,
                         "hidden": c.hidden, "replay_size": c.replay_size, "track": c.track, "actor_average": average,
                         "actor_cvar": c.actor_cvar, "devices": jax.device_count(),
                         "runs_sharded": jax.device_count() > 1 and runs % jax.device_count() == 0})


if __name__ == "__main__":
    main()
