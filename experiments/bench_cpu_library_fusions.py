"""XLA:CPU's YNNPACK fusions against XLA's own code for jaxrace's programs, side by side.

Usage: python experiments/bench_cpu_library_fusions.py [--rounds 2] [--preset standard] [--chunk 30] [--chunks 3]
                                                       [--settings NAME ...] [--tag TAG]

XLA:CPU (jaxlib 0.10) hands dots, and fusions of elementwise ops and reductions, to the
YNNPACK library (`xla_cpu_experimental_ynn_fusion_type`; an empty value hands it nothing).
Each setting below is a dict of per-program compile options for jaxrace's programs
(`jaxrace.jit.CPU_COMPILER_OPTIONS`, replaced in a fresh child process before anything
compiles), and each is measured in its own process, the order turning round from round to
round (this machine is shared and its speed drifts):

- the preset's training job (`train_many`, 3 runs vmapped, the preset's envs, updates,
  batch and replay, the two library rewards; as `bench_preset_epoch.py`): the first job of
  one chunk (compiling included) and milliseconds per epoch from two later jobs;
- one run's programs alone: its 16 updates (one epoch's) and its rollout (`collect`), each
  jitted with its state donated, medians of 9 calls;
- the preset's final races (3 runs, a random actor, the AI field; `evaluate`): first call
  and the median of 3 later ones;
- the clip renderer on one race's frames (`render_frames`, a program that renders, so it
  takes only the setting's `jaxrace.jit.RENDER_OPTIONS`): first call and the median of 3.

Prints medians over rounds and writes results/bench_cpu_library_fusions[-TAG].json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

from common import print_table, write_results

LEGACY_O1 = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
SETTINGS = {
    "older emitters, LLVM 1 (jaxrace's before)": LEGACY_O1,
    "older emitters, LLVM 1, no YNNPACK": {**LEGACY_O1, **NO_YNN},
    "XLA's defaults, no YNNPACK": NO_YNN,
    "XLA's defaults": {},
}


def child(preset: str, chunk: int, chunks: int) -> dict:
    """Every measure of one setting, in this process (its options already in place)."""
    import jax
    import numpy as np
    from bench_preset_epoch import timed_job

    from jaxrace.agents import HParams
    from jaxrace.agents.evaluation import evaluate
    from jaxrace.agents.trainer import Trainer, make_learner
    from jaxrace.design.config import LIBRARY_BASELINES, load_config
    from jaxrace.design.loop import Envs, train_config
    from jaxrace.envs.video import render_frames
    from jaxrace.jit import compiler_options, jit, render_compiler_options
    from jaxrace.rewards import RewardBank, library_reward

    c = load_config(preset)
    e = Envs.make(c)
    config = dataclasses.replace(train_config(c), warmup_epochs=min(c.warmup_epochs, chunk // 2), epochs=chunk)
    learner = make_learner(config, e.train_env, e.train_params)
    bank = RewardBank.from_compiled([library_reward(n) for n in LIBRARY_BASELINES])
    runs = 3
    job = (learner, bank, config, runs, chunk)
    first = timed_job(*job, 1, False, c.reward_scale)
    one = timed_job(*job, 1, False, c.reward_scale)
    many = timed_job(*job, chunks, False, c.reward_scale)
    per_epoch = (many - one) / ((chunks - 1) * chunk)

    # One run's programs alone, the state donated (no copy of the replay buffer per call).
    hp = HParams(reward_scale=c.reward_scale)
    state = jit(learner.init)(jax.random.key(0), hp)
    collect = jit(learner.collect, donate_argnums=0)
    store = jit(learner.store, donate_argnums=0)
    trainer = Trainer(learner, bank, config)
    label = jit(lambda col: trainer.label(col, 0, bank.default_params()[0]))
    for _ in range(8):  # a little replay to sample from
        state, col = collect(state)
        state = store(state, col, label(col))
    updates = jit(lambda s: jax.lax.scan(lambda s, _: learner.update(s, hp), s, None,
                                         length=config.updates_per_epoch), donate_argnums=0)

    def timed_calls(fn, state, calls=9):
        t0 = time.perf_counter()
        state = jax.block_until_ready(fn(state))[0]
        first_s, times = time.perf_counter() - t0, []
        for _ in range(calls):
            t0 = time.perf_counter()
            state = jax.block_until_ready(fn(state))[0]
            times.append(time.perf_counter() - t0)
        return state, first_s, statistics.median(times)

    state, updates_first, updates_s = timed_calls(updates, state)
    state, collect_first, collect_s = timed_calls(collect, state)

    actors = jit(jax.vmap(lambda k: learner.init(k, HParams()).policy_actor))(
        jax.random.split(jax.random.key(0), runs))
    fields = e.race_fields(jax.random.key(1), c.final_races)

    def races():
        t0 = time.perf_counter()
        jax.block_until_ready(evaluate(learner, actors, e.race_env, fields, jax.random.key(2), e.race_steps,
                                       num_races=c.final_races, params_per_race=True))
        return time.perf_counter() - t0

    races_first = races()
    races_later = statistics.median(races() for _ in range(3))

    # The clip renderer (a program that renders: `jaxrace.jit.render_compiler_options`), one race's frames.
    ev = evaluate(learner, actors, e.race_env, fields, jax.random.key(2), e.race_steps, num_races=c.final_races,
                  params_per_race=True)
    one_race = jax.tree.map(lambda x: np.asarray(x[0, 0]), ev.states)
    field0 = jax.tree.map(lambda x: x[0], fields)

    def render():
        t0 = time.perf_counter()
        jax.block_until_ready(render_frames(e.race_env, field0, one_race))
        return time.perf_counter() - t0

    render_first = render()
    render_later = statistics.median(render() for _ in range(3))
    return {"options": compiler_options(), "first_job_s": first, "epoch_ms": 1000 * per_epoch,
            "updates_first_s": updates_first, "updates_ms": 1000 * updates_s,
            "collect_first_s": collect_first, "collect_ms": 1000 * collect_s,
            "races_first_s": races_first, "races_later_s": races_later,
            "render_first_s": render_first, "render_later_s": render_later,
            "render_options": render_compiler_options(), "frames": int(one_race.time.shape[0]),
            "updates_per_epoch": config.updates_per_epoch, "batch": config.batch_size, "envs": config.num_envs,
            "races": c.final_races, "race_steps": e.race_steps}


def measure(name: str, args) -> dict:
    env = {**os.environ, "JAXRACE_CACHE_DIR": "off", "JAXRACE_BENCH_OPTIONS": json.dumps(SETTINGS[name])}
    env.pop("XLA_FLAGS", None)  # the options under test are per program; no global flags in any setting
    env.pop("JAXRACE_XLA_DEFAULTS", None)
    out = subprocess.run([sys.executable, __file__, "--child", args.preset, "--chunk", str(args.chunk),
                          "--chunks", str(args.chunks)], env=env, capture_output=True, text=True, check=False,
                         timeout=3600)
    if out.returncode:
        raise RuntimeError(f"{name}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", default="standard")
    parser.add_argument("--chunk", type=int, default=30, help="epochs per chunk of the timed training jobs")
    parser.add_argument("--chunks", type=int, default=3, help="chunks of the longer timed job")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--tag", default="", help="results go to results/bench_cpu_library_fusions-<tag>.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import jaxrace.jit

        jaxrace.jit.CPU_COMPILER_OPTIONS = json.loads(os.environ["JAXRACE_BENCH_OPTIONS"])
        print(json.dumps(child(args.child, args.chunk, args.chunks)))
        return
    names = args.settings
    got = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            m = measure(name, args)
            print(f"round {r + 1}, {name}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                         for k, v in m.items()), flush=True)
            got[name].append(m)
    first = got[names[0]][0]
    measures = [("epoch_ms", f"{args.preset}'s training job, 3 runs: ms per epoch", "ms"),
                ("first_job_s", f"its first job of one chunk ({args.chunk} epochs), compiling included (s)", "s"),
                ("updates_ms", f"one run's {first['updates_per_epoch']} updates of {first['batch']} (ms)", "ms"),
                ("collect_ms", f"one run's rollout, {first['envs']} envs x 8 steps (ms)", "ms"),
                ("updates_first_s", "the updates' first call, compiling included (s)", "s"),
                ("races_first_s", f"{first['races']} final races of 3 runs: first call (s)", "s"),
                ("races_later_s", "the same races again: median of 3 (s)", "s"),
                ("render_first_s", f"one race's {first['frames']} frames rendered: first call (s)", "s"),
                ("render_later_s", "the same frames again: median of 3 (s)", "s")]
    rows, table = [], []
    for key, label, unit in measures:
        med = {name: statistics.median(m[key] for m in got[name]) for name in names}
        base = med[names[0]]
        table.append([label, *(f"{med[n]:.1f}" + ("" if n == names[0] else f" ({100 * (med[n] - base) / base:+.0f}%)")
                               for n in names)])
        rows.append({"name": label, "value": base, "unit": unit, "setting": names[0], "rounds": args.rounds,
                     "medians": med, "samples": {n: [m[key] for m in got[n]] for n in names}})
    print_table(["measure (medians)", *names], table)
    print("options: " + "; ".join(f"{n}: {SETTINGS[n]}" for n in names))
    print(write_results(__file__.replace(".py", f"-{args.tag}.py") if args.tag else __file__, rows))


if __name__ == "__main__":
    main()
