"""Memory of a design preset's training job, from XLA's own analysis, before anything is trained.

Usage: python experiments/train_memory.py [--preset paper] [--config FILE.toml] [--runs 2 10]

For R runs vmapped in one job (the loop trains N candidates x seeds in one job, the
final job the winner and the library rewards x seeds) with the preset's networks, envs,
batches and replay: the job state's bytes (replay buffers, networks, optimisers; from
`jax.eval_shape`, nothing is allocated), and the temporary memory of the two programs an
epoch runs on the device (`collect` and `learn`, the fused updates; compiled on this
backend, not run), from `Compiled.memory_analysis()`. The job needs about the state plus
the larger program's temporary memory. Sizes a preset for a device before a lease is spent
finding out; writes results/train_memory.json (JAXRACE_RESULTS_TAG=TAG: -TAG.json).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from common import print_table, write_results

from jaxrace.agents import HParams, make_train, runner
from jaxrace.design.config import load_config
from jaxrace.design.loop import Envs, train_config
from jaxrace.rewards import RewardBank, library_reward

GIB = 1 << 30


def nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def job_memory(trainer, runs: int) -> dict:
    """State, replay and the programs' temporary memory (GiB) of a job of `runs` runs."""
    learner = trainer.learner
    keys = jax.random.split(jax.random.key(0), runs)
    hparams = runner.per_run_hparams(HParams(), runs).replace(reward_params=None)
    state = jax.eval_shape(lambda k, h: jax.vmap(learner.init)(k, h), keys, hparams)
    _, collected = jax.eval_shape(jax.vmap(learner.collect), state)
    width = trainer.bank.params_matrix([{}]).shape[1]
    rewards = jax.eval_shape(jax.vmap(trainer.label), collected, jnp.zeros(runs, jnp.int32),
                             jnp.zeros((runs, width), jnp.float32))
    out = {"runs": runs, "state_gib": nbytes(state) / GIB, "replay_gib": nbytes(state.replay) / GIB}
    for name, lowered in (("collect", runner._collect.lower(learner, state)),
                          ("learn", runner._learn.lower(learner, state, hparams, collected, rewards))):
        started = time.perf_counter()
        analysis = lowered.compile().memory_analysis()
        out[f"{name}_compile_s"] = round(time.perf_counter() - started, 1)
        out[f"{name}_temp_gib"] = analysis.temp_size_in_bytes / GIB
    out["needed_gib"] = out["state_gib"] + max(out["collect_temp_gib"], out["learn_temp_gib"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--config", default=None, help="a TOML file of DesignConfig fields over the preset")
    parser.add_argument("--runs", type=int, nargs="+", default=None,
                        help="runs per job (default: the iterations' N x seeds and the final job's runs)")
    args = parser.parse_args()
    config = load_config(args.preset, args.config)
    envs = Envs.make(config)
    # The fused updates (a GPU's path; on CPU the pixel actor's loop calls one update at a time).
    trainer = make_train(train_config(config), envs.train_env, envs.train_params,
                         RewardBank.from_compiled([library_reward("progress")]))
    limit = runner.device_memory_limit(jax.devices()[0])
    limit = None if limit is None else limit / GIB
    rows, table = [], []
    final = (config.final_candidates + len(config.final_baselines)) * config.final_seeds
    for runs in args.runs or sorted({config.n * config.seeds, final}):
        m = job_memory(trainer, runs)
        table.append([runs, f"{m['replay_gib']:.1f}", f"{m['state_gib']:.1f}", f"{m['collect_temp_gib']:.2f}",
                      f"{m['learn_temp_gib']:.2f}", f"{m['needed_gib']:.1f}",
                      "-" if limit is None else ("yes" if m["needed_gib"] <= limit else "no"),
                      f"{m['learn_compile_s']:.0f}"])
        rows.append({"name": f"{config.preset}: {runs} runs per job, memory needed (state + largest temporary)",
                     "value": round(m["needed_gib"], 2), "unit": "GiB",
                     **{k: round(v, 3) if isinstance(v, float) else v for k, v in m.items()},
                     "device_limit_gib": None if limit is None else round(limit, 1)})
    rows.append({"name": "config", "value": config.to_dict(), "unit": "options"})
    print(f"preset {config.preset}" + (f", config {args.config}" if args.config else "")
          + f"; device {jax.devices()[0].device_kind}, " + ("no limit reported" if limit is None
                                                            else f"{limit:.1f} GiB usable"))
    print_table(["runs", "replay GiB", "state GiB", "collect temp GiB", "learn temp GiB", "needed GiB",
                 "fits the device", "learn compile s"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
