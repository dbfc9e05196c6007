"""Cost of reward programs: compile time, bank evaluation next to an env step, TAC, training.

Usage: python experiments/bench_rewards.py [--envs 4096] [--steps 20] [--repeats 9]

Every reward runs as its exported artifact (what the caller runs since rewards stopped
executing in the training process) and, side by side in the same run, as the same
program's traced function called in-process (the way rewards ran before; built here
from trusted library and proposer source with `build.in_process_call`).

1. compile_reward per program (parse and policy here; execute, trace, export and
   validate in a forked sandbox child), over the two library rewards and 64 offline
   proposals; the first call also starts the worker and is reported on its own.
2. A jitted scan of vmapped env steps (state only, 7 opponents) with and without a
   bank of N = 1, 16, 64 proposed rewards evaluated on every transition
   (`evaluate_all`), timed in interleaved rounds; and the bank alone on as many
   transitions, as a fraction of the env step.
3. TAC of N = 64 rewards over P = 4096 pairs of 150-step clips: compile, then the
   median of repeated jitted calls.
4. A training job of 5 vmapped QR-SAC runs on the oval with a bank of 5 rewards:
   compile time and seconds per epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import print_table, write_results

import jaxrace
from jaxrace.agents import TrainConfig, make_train, train_many
from jaxrace.rewards import Action, Clip, CompiledReward, RaceView, RewardBank, compile_reward, propose, tac
from jaxrace.rewards.build import in_process_call
from jaxrace.rewards.library import LIBRARY

PATHS = ("exported", "in-process")

TASK = "win the race cleanly from the back of the grid"
LIBRARY_NAMES = tuple(LIBRARY)


def bench_compile(sources: dict[str, str]) -> tuple[float, list[float], dict]:
    first_s, times, compiled = None, [], {}
    for name, source in sources.items():
        t0 = time.perf_counter()
        compiled[name] = compile_reward(source, name=name)
        dt = time.perf_counter() - t0
        if first_s is None:
            first_s = dt
        else:
            times.append(dt)
    return first_s, times, compiled


def compile_rollout(bank: RewardBank | None, num_envs: int, steps: int):
    """(compile s, run(key) -> seconds): a jitted scan of env steps, plus the bank if given."""
    env, params = jaxrace.make(track="club", num_opponents=7, start="grid_back")
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    rewards = None if bank is None else jax.vmap(bank.evaluate_all)

    def rollout(key, state):
        def body(state, k):
            k_act, k_step = jax.random.split(k)
            u = jax.random.uniform(k_act, (num_envs, 2), minval=-1.0, maxval=1.0)
            action = u.at[:, 1].set(0.2 + 0.8 * u[:, 1] ** 2)
            obs, next_state, reward, *_, info = step(jax.random.split(k_step, num_envs), state, action, params)
            total = reward.sum()
            if rewards is not None:
                act = Action(steering=action[:, 0], throttle_brake=action[:, 1])
                total = total + rewards(state.view, act, info["view"])[0].sum()
            return next_state, total

        return jax.lax.scan(body, state, jax.random.split(key, steps))

    _, state = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(0), num_envs), params)
    t0 = time.perf_counter()
    compiled = jax.jit(rollout).lower(jax.random.key(1), state).compile()
    compile_s = time.perf_counter() - t0

    def run(key) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(key, state)[1])
        return (time.perf_counter() - t0) / steps

    return compile_s, run


def time_bank_alone(bank: RewardBank, clips: Clip, repeats: int) -> float:
    """Median seconds for `evaluate_all` over every transition of `clips`."""
    prev = jax.tree.map(lambda x: x[:, :-1], clips.views)
    curr = jax.tree.map(lambda x: x[:, 1:], clips.views)
    fn = jax.jit(lambda p, a, c: jax.vmap(jax.vmap(bank.evaluate_all))(p, a, c)[0].sum())
    jax.block_until_ready(fn(prev, clips.actions, curr))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(prev, clips.actions, curr))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def in_process_twin(reward: CompiledReward) -> CompiledReward:
    """The same reward, but calling the program's traced function in this process (the old path)."""
    return CompiledReward(name=reward.name, artifact=reward.artifact, call=in_process_call(reward.source))


def bench_training(banks: dict[str, RewardBank], epochs: int, repeats: int) -> dict[str, tuple[float, float]]:
    """{path: (compile s, median s per epoch)} for 5 vmapped runs, timed in interleaved rounds."""
    env, params = jaxrace.make(track="oval", start="time_trial", laps=1000, time_limit=60.0)
    config = TrainConfig(num_envs=16, rollout_steps=8, updates_per_epoch=8, batch_size=128, epochs=epochs)
    trainers, compile_s = {}, {}
    for path, bank in banks.items():
        trainers[path] = make_train(config, env, params, bank)
        t0 = time.perf_counter()
        jax.block_until_ready(train_many(trainers[path], jax.random.key(0), list(range(5)))[1])
        compile_s[path] = time.perf_counter() - t0
    times = {path: [] for path in banks}
    for r in range(repeats):
        for path, trainer in trainers.items():
            t0 = time.perf_counter()
            jax.block_until_ready(train_many(trainer, jax.random.key(r + 1), list(range(5)))[1])
            times[path].append((time.perf_counter() - t0) / epochs)
    return {p: (compile_s[p] - statistics.median(times[p]) * epochs, statistics.median(times[p])) for p in banks}


def random_clips(key, p: int, t: int) -> Clip:
    keys = iter(jax.random.split(key, 64))
    fields = {}
    for f in dataclasses.fields(RaceView):
        k = next(keys)
        if f.name in ("rank", "start_rank", "num_cars", "laps"):
            fields[f.name] = jax.random.randint(k, (p, t + 1), 1, 9)
        elif f.name in ("off_course", "on_kerb", "wall_contact", "hit_from_behind", "hit_other_from_behind",
                        "side_contact", "finished"):
            fields[f.name] = jax.random.bernoulli(k, 0.1, (p, t + 1))
        else:
            fields[f.name] = jax.random.uniform(k, (p, t + 1), minval=0.0, maxval=60.0)
    fields["progress"] = jnp.cumsum(fields["speed"] * 0.1, axis=1)
    actions = Action(steering=jax.random.uniform(next(keys), (p, t), minval=-1, maxval=1),
                     throttle_brake=jax.random.uniform(next(keys), (p, t), minval=-1, maxval=1))
    return Clip(views=RaceView(**fields), actions=actions, valid=jnp.ones((p, t), bool))


def bench_tac(bank: RewardBank, pairs: int, length: int, repeats: int) -> tuple[float, float]:
    first, second = random_clips(jax.random.key(0), pairs, length), random_clips(jax.random.key(1), pairs, length)
    labels = jnp.sign(jax.random.normal(jax.random.key(2), (pairs,)))
    fn = jax.jit(lambda a, b, lab: tac(bank, a, b, lab, variant="b"))
    t0 = time.perf_counter()
    compiled = fn.lower(first, second, labels).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(first, second, labels))
        times.append(time.perf_counter() - t0)
    return compile_s, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--train-epochs", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=4096)
    parser.add_argument("--clip-steps", type=int, default=150)
    args = parser.parse_args()
    rows = []

    proposals = propose(TASK, 64, jax.random.key(0))
    sources = {**LIBRARY, **{p.name: p.source for p in proposals}}
    first_s, times, compiled = bench_compile(sources)
    print(f"compile_reward: first call {first_s:.2f} s (starts the sandbox worker); then median "
          f"{statistics.median(times):.3f} s, max {max(times):.3f} s over {len(times)} programs", flush=True)
    rows += [
        {"name": "compile_reward, first call (sandbox worker start included)", "value": round(first_s, 3),
         "unit": "s"},
        {"name": f"compile_reward, median over {len(times)} programs", "value": round(statistics.median(times), 3),
         "unit": "s"},
        {"name": f"compile_reward, max over {len(times)} programs", "value": round(max(times), 3), "unit": "s"},
    ]

    write_results(__file__, rows)  # after every part: a run stopped by a time limit keeps what it measured
    twins = {name: in_process_twin(r) for name, r in compiled.items()}
    kinds = {"exported": compiled, "in-process": twins}

    # Compile every variant first, then time them in interleaved rounds (the machine is noisy).
    sizes = (1, 16, 64)
    banks = {(path, n): RewardBank.from_compiled([kinds[path][p.name] for p in proposals[:n]])
             for path in PATHS for n in sizes}
    variants = {None: compile_rollout(None, args.envs, args.steps)}
    for key, bank in banks.items():
        variants[key] = compile_rollout(bank, args.envs, args.steps)
        print(f"compiled env step + bank of {key[1]} ({key[0]}) in {variants[key][0]:.1f} s", flush=True)
    timings = {key: [] for key in variants}
    for r in range(args.repeats):
        for key, (_, run) in variants.items():
            timings[key].append(run(jax.random.key(10 + r)))
    base = statistics.median(timings[None])
    transitions = random_clips(jax.random.key(5), args.envs, args.steps)  # envs x steps transitions
    table = [["0 (env step only)", "-", f"{base * 1e3:.2f} ms", "-", "-", f"{variants[None][0]:.1f} s"]]
    rows += [{"name": f"env step, {args.envs} envs x 8 cars", "value": round(base * 1e3, 3), "unit": "ms"},
             {"name": "compile time, env step", "value": round(variants[None][0], 2), "unit": "s"}]
    for n in sizes:
        for path in PATHS:
            fused = statistics.median(timings[(path, n)])
            alone = time_bank_alone(banks[(path, n)], transitions, args.repeats) / args.steps
            table.append([n, path, f"{fused * 1e3:.2f} ms", f"{fused / base - 1:+.1%}", f"{alone / base:.1%}",
                          f"{variants[(path, n)][0]:.1f} s"])
            rows += [
                {"name": f"env step + bank of {n} (fused), {args.envs} envs", "path": path,
                 "value": round(fused * 1e3, 3), "unit": "ms"},
                {"name": f"bank of {n} alone, {args.envs} transitions", "path": path, "value": round(alone * 1e3, 3),
                 "unit": "ms"},
                {"name": f"bank of {n} alone, relative to an env step", "path": path,
                 "value": round(100 * alone / base, 2), "unit": "%"},
                {"name": f"compile time, env step + bank of {n}", "path": path,
                 "value": round(variants[(path, n)][0], 2), "unit": "s"},
            ]
        exported, baseline = (statistics.median(timings[(p, n)]) for p in PATHS)
        rows.append({"name": f"env step + bank of {n} (fused): exported / in-process", "value":
                     round(exported / baseline, 3), "unit": "x"})
    write_results(__file__, rows)
    print()
    print_table(["reward candidates N", "reward path", f"env step + bank ({args.envs} envs, 8 cars)",
                 "fused: added", "bank alone / env step", "compile"], table)

    table = []
    for path in PATHS:
        bank64 = RewardBank.from_compiled([kinds[path][p.name] for p in proposals])
        compile_s, t = bench_tac(bank64, args.pairs, args.clip_steps, args.repeats)
        table.append([path, f"{t:.3f} s", f"{compile_s:.1f} s"])
        rows += [
            {"name": f"TAC, 64 rewards x {args.pairs} pairs x {args.clip_steps} steps", "path": path,
             "value": round(t, 4), "unit": "s"},
            {"name": "TAC compile time", "path": path, "value": round(compile_s, 2), "unit": "s"},
        ]
    write_results(__file__, rows)
    print()
    print_table([f"TAC, N=64, P={args.pairs} x {args.clip_steps} steps", "per call", "compile"], table)

    five = [LIBRARY_NAMES[0], LIBRARY_NAMES[1]] + [p.name for p in proposals[:3]]
    training = bench_training({path: RewardBank.from_compiled([kinds[path][k] for k in five]) for path in PATHS},
                              args.train_epochs, max(3, args.repeats // 3))
    table = []
    for path, (compile_s, per_epoch) in training.items():
        table.append([path, f"{per_epoch * 1e3:.1f} ms", f"{compile_s:.1f} s"])
        rows += [{"name": "training, 5 vmapped runs, seconds per epoch", "path": path,
                  "value": round(per_epoch, 4), "unit": "s"},
                 {"name": "training, 5 vmapped runs, compile time", "path": path, "value": round(compile_s, 2),
                  "unit": "s"}]
    rows.append({"name": "training epoch: exported / in-process", "value":
                 round(training["exported"][1] / training["in-process"][1], 3), "unit": "x"})
    print()
    print_table(["training, 5 vmapped runs (oval)", "per epoch", "compile"], table)
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
