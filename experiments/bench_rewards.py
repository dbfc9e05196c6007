"""Cost of reward programs: compile time, bank evaluation next to an env step, TAC.

Usage: python experiments/bench_rewards.py [--envs 4096] [--steps 20] [--repeats 3]

1. compile_reward per program (sandboxed: execute, trace and validate in the worker
   subprocess), over the two library rewards and 64 offline proposals; the first call
   also starts the worker and is reported on its own.
2. A jitted scan of vmapped env steps (state only, 7 opponents) with and without a
   bank of N = 1, 16, 64 proposed rewards evaluated on every transition
   (`evaluate_all`), timed in interleaved rounds; and the bank alone on as many
   transitions, as a fraction of the env step (the cleaner figure: fusing the bank
   into the step also changes how XLA schedules the step).
3. TAC of N = 64 rewards over P = 4096 pairs of 150-step clips: compile, then the
   median of repeated jitted calls.
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
from jaxrace.rewards import Action, Clip, RaceView, RewardBank, compile_reward, propose, tac
from jaxrace.rewards.library import LIBRARY

TASK = "win the race cleanly from the back of the grid"


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
    parser.add_argument("--repeats", type=int, default=5)
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

    # Compile every variant first, then time them in interleaved rounds (the machine is noisy).
    sizes = (0, 1, 16, 64)
    banks = {n: RewardBank.from_compiled([compiled[p.name] for p in proposals[:n]]) if n else None for n in sizes}
    variants = {n: compile_rollout(banks[n], args.envs, args.steps) for n in sizes}
    timings = {n: [] for n in sizes}
    for r in range(args.repeats):
        for n in sizes:
            timings[n].append(variants[n][1](jax.random.key(10 + r)))
    base = statistics.median(timings[0])
    transitions = random_clips(jax.random.key(5), args.envs, args.steps)  # envs x steps transitions
    table = [["0 (env step only)", f"{base * 1e3:.2f} ms", "-", "-", f"{variants[0][0]:.1f} s"]]
    rows += [{"name": f"env step, {args.envs} envs x 8 cars", "value": round(base * 1e3, 3), "unit": "ms"},
             {"name": "compile time, env step", "value": round(variants[0][0], 2), "unit": "s"}]
    for n in sizes[1:]:
        fused = statistics.median(timings[n])
        alone = time_bank_alone(banks[n], transitions, args.repeats) / args.steps
        table.append([n, f"{fused * 1e3:.2f} ms", f"{fused / base - 1:+.1%}", f"{alone / base:.1%}",
                      f"{variants[n][0]:.1f} s"])
        rows += [
            {"name": f"env step + bank of {n} (fused), {args.envs} envs", "value": round(fused * 1e3, 3), "unit": "ms"},
            {"name": f"bank of {n} alone, {args.envs} transitions", "value": round(alone * 1e3, 3), "unit": "ms"},
            {"name": f"bank of {n} alone, relative to an env step", "value": round(100 * alone / base, 2),
             "unit": "%"},
            {"name": f"compile time, env step + bank of {n}", "value": round(variants[n][0], 2), "unit": "s"},
        ]
    print()
    print_table(["reward candidates N", f"env step + bank ({args.envs} envs, 8 cars)", "fused: added",
                 "bank alone / env step", "compile"], table)

    bank64 = RewardBank.from_compiled([compiled[p.name] for p in proposals])
    compile_s, t = bench_tac(bank64, args.pairs, args.clip_steps, args.repeats)
    print(f"\nTAC, N=64 rewards, P={args.pairs} pairs of {args.clip_steps}-step clips: {t:.3f} s "
          f"(compile {compile_s:.1f} s)")
    rows += [
        {"name": f"TAC, 64 rewards x {args.pairs} pairs x {args.clip_steps} steps", "value": round(t, 4),
         "unit": "s"},
        {"name": "TAC compile time", "value": round(compile_s, 2), "unit": "s"},
    ]
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
