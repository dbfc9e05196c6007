"""N reward candidates trained in one vmapped job versus one after another.

Usage: python experiments/bench_train.py [--epochs 30] [--parts 1 2 3] [--runs 1 5 16]

Side by side in one run, on the oval (time trial, state observations):
1. N = 5 candidates (the two library rewards and three offline proposals), one job
   of 5 vmapped runs, versus 5 jobs of 1 run each in sequence; the same total samples
   and updates; wall time with compilation included. The sequential jobs run twice:
   as separate processes (each compiles, as separate training jobs do) and in one
   process that compiles once (the strongest sequential baseline).
2. Per-run env steps/s and gradient updates/s at N = 1, 5 and 16 runs per job (`--runs`),
   after compilation, and each job's time against N = 1's.
3. The peer baseline on the same task (oval time trial, progress reward, 16 envs, the
   same env-step budget): one QR-SAC run against brax's PPO through the brax adapter.
   Wall time with compile, env steps/s, updates/s, and the deterministic policy's
   progress per step over a 60 s time trial afterwards.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
from common import print_table, write_results

import jaxrace
from jaxrace.agents import TrainConfig, make_train, train_many
from jaxrace.envs.rollouts import trajectory
from jaxrace.rewards import RewardBank, compile_reward, library_reward, propose


def wall(fn):
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t0, out


def setup(epochs: int):
    # Many laps: episodes end at the 60 s time limit (bootstrapped), not at a finish line.
    env, params = jaxrace.make(track="oval", start="time_trial", laps=1000, time_limit=60.0)
    proposals = propose("drive fast laps cleanly", 14, jax.random.key(0))
    rewards = [library_reward("progress"), library_reward("gt_sophy")]
    rewards += [compile_reward(p.source, name=p.name) for p in proposals]
    bank = RewardBank.from_compiled(rewards)
    config = TrainConfig(num_envs=16, rollout_steps=8, updates_per_epoch=8, batch_size=128, epochs=epochs)
    return env, params, bank, config


def job(rewards: list[int], epochs: int) -> None:
    """A child process: one training job from scratch; prints its wall time (compile included)."""
    env, params, bank, config = setup(epochs)
    seconds, _ = wall(lambda: train_many(make_train(config, env, params, bank), jax.random.key(1), rewards)[1])
    print(f"JOB_SECONDS {seconds}")


def job_in_new_process(rewards: list[int], epochs: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--job", ",".join(map(str, rewards)), "--epochs", str(epochs)],
                         capture_output=True, text=True, check=True).stdout
    return float(next(line for line in out.splitlines() if line.startswith("JOB_SECONDS")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--peer-steps", type=int, default=200_000, help="env steps of part 3, per algorithm")
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 5, 16], help="runs per job in part 2")
    parser.add_argument("--job", default=None, help=argparse.SUPPRESS)  # internal: run one job and exit
    args = parser.parse_args()
    if args.job is not None:
        return job([int(i) for i in args.job.split(",")], args.epochs)
    env, params, bank, config = setup(args.epochs)
    key = jax.random.key(1)
    rows = []
    if 1 in args.parts:
        rows += one_job_against_five(args.epochs, env, params, bank, config, key)
    if 2 in args.parts:
        rows += throughput_by_runs(args.runs, env, params, bank, config, key)
    if 3 in args.parts:
        rows += peer_baseline(env, params, bank, args.peer_steps)
    print(f"wrote {write_results(__file__, rows)}")


def one_job_against_five(epochs: int, env, params, bank, config, key) -> list[dict]:
    # 1. N = 5: one vmapped job vs five sequential jobs, each a fresh process (compile
    #    included, as a user would run them), and vs five jobs in one process that share
    #    one compilation.
    vmapped_s = job_in_new_process(list(range(5)), epochs)
    separate = [job_in_new_process([i], epochs) for i in range(5)]
    sequential = make_train(config, env, params, bank)
    shared = [wall(lambda i=i: train_many(sequential, jax.random.fold_in(key, i), [i])[1])[0] for i in range(5)]
    rows = [{"name": "N=5 candidates, one vmapped job, wall incl. compile", "value": round(vmapped_s, 2), "unit": "s"}]
    table = [["one vmapped job (5 runs)", f"{vmapped_s:.1f} s", "1.00"]]
    for name, times in (("5 sequential jobs, separate processes", separate),
                        ("5 sequential jobs, one process (one compile)", shared)):
        total = sum(times)
        table.append([name, f"{total:.1f} s", f"{vmapped_s / total:.2f}"])
        rows += [{"name": f"N=5 candidates, {name}, wall incl. compile", "value": round(total, 2), "unit": "s"},
                 {"name": f"N=5 vmapped / {name}", "value": round(vmapped_s / total, 3), "unit": "x"}]
    print_table(["N=5 candidates, same samples each", "wall incl. compile", "vmapped / this"], table)
    return rows


def throughput_by_runs(runs: list[int], env, params, bank, config, key) -> list[dict]:
    # 2. Throughput per run at N = 1, 5, 16 (compiled first, then timed).
    rows, table, job_s = [], [], {}
    steps_per_run = config.epochs * config.num_envs * config.rollout_steps
    updates_per_run = config.epochs * config.updates_per_epoch
    for n in runs:
        trainer = make_train(config, env, params, bank)
        rewards = [i % bank.num_rewards for i in range(n)]
        compile_s, _ = wall(lambda t=trainer, r=rewards: train_many(t, key, r)[1])  # compile + one job
        run_s, _ = wall(lambda t=trainer, r=rewards: train_many(t, jax.random.key(2), r)[1])
        job_s[n] = run_s
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
    if runs[0] in job_s:
        for n, row in zip(runs, table, strict=True):
            row.insert(5, f"{job_s[n] / job_s[runs[0]]:.2f}")
            rows.append({"name": f"job wall time after compile, N={n} / N={runs[0]}",
                         "value": round(job_s[n] / job_s[runs[0]], 3), "unit": "x"})
    print()
    print_table(["runs N", "env steps/s per run", "env steps/s, all runs", "updates/s per run", "job time",
                 f"job time / N={runs[0]}'s", "compile (approx.)"], table)
    return rows


def deterministic_progress(env, params, policy, steps: int = 600) -> float:
    """m/step of a deterministic `policy(obs) -> action` over one time trial."""
    states = jax.jit(lambda k: trajectory(env, params, k, steps, policy=policy))(jax.random.key(9))
    return float(states.cars.progress[-1, 0] - states.cars.progress[0, 0]) / steps


def peer_baseline(env, params, bank, env_steps: int) -> list[dict]:
    """QR-SAC (one run) and brax PPO on the same task and env-step budget."""
    from brax.training.agents.ppo import networks as ppo_networks  # part 3 alone needs brax
    from brax.training.agents.ppo import train as ppo

    from jaxrace.envs.adapters.brax_env import BraxRaceEnv, brax_training_compat

    sac_config = TrainConfig(num_envs=16, rollout_steps=8, updates_per_epoch=8, batch_size=128,
                             epochs=env_steps // 128)
    sac = make_train(sac_config, env, params, bank)
    sac_s, (state, _, _) = wall(lambda: train_many(sac, jax.random.key(3), [0]))
    actor = jax.tree.map(lambda x: x[0], state.actor)
    carry0 = sac.initial_carry()
    sac_progress = deterministic_progress(env, params, lambda obs: sac.policy(actor, carry0, obs)[1])
    sac_steps = sac_config.epochs * 128
    sac_updates = sac_config.epochs * sac_config.updates_per_epoch

    network_factory = functools.partial(ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=(256, 256),
                                        value_hidden_layer_sizes=(256, 256))
    # 16 envs x 10-step unrolls x 4 minibatches = 640 env steps per training step, 16 updates each.
    ppo_kwargs = dict(num_envs=16, batch_size=16, num_minibatches=4, unroll_length=10, num_updates_per_batch=4,
                      episode_length=600, discounting=0.99, learning_rate=3e-4, entropy_cost=1e-3,
                      normalize_observations=True, num_evals=1, run_evals=False, num_eval_envs=1,
                      network_factory=network_factory, seed=3)
    with brax_training_compat():
        ppo_s, (make_policy, ppo_params, _) = wall(
            lambda: ppo.train(BraxRaceEnv(env, params), num_timesteps=env_steps, **ppo_kwargs))
    ppo_policy = make_policy(ppo_params, deterministic=True)
    ppo_progress = deterministic_progress(
        env, params, lambda obs: ppo_policy(jnp.concatenate([obs["proprio"], obs["privileged"]]),
                                            jax.random.key(0))[0])
    ppo_training_steps = env_steps // 640
    ppo_steps, ppo_updates = ppo_training_steps * 640, ppo_training_steps * 16

    table = [["QR-SAC (jaxrace), 1 run", f"{sac_steps:,}", f"{sac_s:.1f} s", f"{sac_steps / sac_s:,.0f}",
              f"{sac_updates / sac_s:,.1f}", f"{sac_progress:.2f}"],
             ["PPO (brax 0.14, adapter)", f"{ppo_steps:,}", f"{ppo_s:.1f} s", f"{ppo_steps / ppo_s:,.0f}",
              f"{ppo_updates / ppo_s:,.1f}", f"{ppo_progress:.2f}"]]
    print()
    print_table(["algorithm", "env steps", "wall incl. compile", "env steps/s", "updates/s",
                 "deterministic progress (m/step)"], table)
    rows = []
    for name, steps, secs, updates, progress in (("QR-SAC 1 run", sac_steps, sac_s, sac_updates, sac_progress),
                                                 ("brax PPO", ppo_steps, ppo_s, ppo_updates, ppo_progress)):
        rows += [
            {"name": f"peer, {name}: wall incl. compile ({steps} env steps)", "value": round(secs, 2), "unit": "s"},
            {"name": f"peer, {name}: env steps/s", "value": round(steps / secs, 1), "unit": "steps/s"},
            {"name": f"peer, {name}: gradient updates/s", "value": round(updates / secs, 2), "unit": "updates/s"},
            {"name": f"peer, {name}: deterministic progress", "value": round(progress, 3), "unit": "m/step"},
        ]
    return rows


if __name__ == "__main__":
    main()
