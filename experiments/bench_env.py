"""Throughput of the race env, state-only and with pixels, next to Gymnasium's CarRacing-v3.

Usage: python experiments/bench_env.py [--mode state|pixels|all] [--steps 50] [--repeats 3]

For each batch size (parallel envs) and opponent count: a jitted `lax.scan` of vmapped
`env.step` (auto-reset included) with random actions. Compile time is lower+compile of
that program; steps/s is the median over repeats of env steps per wall second.
Agent-steps/s counts every simulated car (the AI opponents are agents too).

Each configuration runs twice, side by side: on one device (XLA runs the program on one
core) and with the env batch sharded over one device per core
(`jaxrace.envs.parallel`), which is how to use a whole CPU.

Pixels mode: the same with `pixels=True` (64x64 chase camera, 7 opponents), the image of
every step kept in the scan carry (so none is optimised away), at 1, 256, 1024 and
4096 envs; interleaved with them in the same run, Gymnasium's CarRacing-v3 (96x96
pixels, random actions): one env, and a 2-worker AsyncVectorEnv, sampled before the
first configuration and after each one (the median of those samples is the baseline).
"""

from __future__ import annotations

import argparse
import os
import time

if "XLA_FLAGS" not in os.environ:  # one CPU device per core; must precede importing jax
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from common import print_table, write_results  # noqa: E402

import jaxrace  # noqa: E402
from jaxrace.envs.parallel import env_sharding  # noqa: E402


def bench(num_envs: int, num_opponents: int, steps: int, repeats: int, devices: list, pixels: bool = False) -> dict:
    start = "grid_back" if num_opponents else "time_trial"
    env, params = jaxrace.make(track="club", num_opponents=num_opponents, start=start, pixels=pixels)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    sharding = env_sharding(devices)

    def rollout(keys, state):
        def body(carry, t):
            state, _ = carry
            k = jax.vmap(lambda key: jax.random.fold_in(key, t))(keys)  # each env keeps its own key stream
            k_act, k_step = jax.vmap(jax.random.split, out_axes=1)(k)
            action = jax.vmap(lambda key: jax.random.uniform(key, (2,), minval=-1.0, maxval=1.0))(k_act)
            action = action.at[:, 1].set(0.2 + 0.8 * action[:, 1] ** 2)  # mostly throttle: cars get moving
            obs, state, reward, *_ = step(k_step, state, action, params)
            # Pixels stay in the carry: every step's image is computed and written, as for a learner.
            return (state, obs["pixels"] if pixels else reward), reward.sum()

        first = jnp.zeros((num_envs, *env.static.image_size, 3), jnp.uint8) if pixels else jnp.zeros(num_envs)
        (state, last), totals = jax.lax.scan(body, (state, first), jnp.arange(steps))
        return state, (totals, last)  # returning the last images keeps their computation alive

    keys = jax.device_put(jax.random.split(jax.random.key(0), num_envs), sharding)
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)), out_shardings=sharding)
    _, state = reset(keys, params)
    t0 = time.perf_counter()
    compiled = jax.jit(rollout).lower(keys, state).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        keys_r = jax.device_put(jax.random.split(jax.random.key(2 + r), num_envs), sharding)
        t0 = time.perf_counter()
        state, total = compiled(keys_r, state)
        jax.block_until_ready(total)
        times.append(time.perf_counter() - t0)
    sps = num_envs * steps / float(np.median(times))
    return {"envs": num_envs, "opponents": num_opponents, "devices": len(devices), "compile_s": compile_s,
            "steps_per_s": sps, "agent_steps_per_s": sps * (1 + num_opponents), "pixels": pixels}


def bench_car_racing(steps: int, workers: int) -> float:
    """Steps/s of Gymnasium's CarRacing-v3 with random actions (workers = 0: one plain env)."""
    import gymnasium as gym

    if workers == 0:
        env = gym.make("CarRacing-v3")
        env.reset(seed=0)
        t0 = time.perf_counter()
        for _ in range(steps):
            *_, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        rate = steps / (time.perf_counter() - t0)
        env.close()
        return rate
    envs = gym.vector.AsyncVectorEnv([lambda: gym.make("CarRacing-v3")] * workers)
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())  # workers up
    t0 = time.perf_counter()
    for _ in range(steps // workers):
        envs.step(envs.action_space.sample())
    rate = (steps // workers) * workers / (time.perf_counter() - t0)
    envs.close()
    return rate


def car_racing_missing() -> str | None:
    """Why Gymnasium's CarRacing-v3 cannot run here (it needs the `bench` extra: box2d), or None."""
    try:
        import gymnasium as gym

        gym.make("CarRacing-v3").close()
    except Exception as err:  # noqa: BLE001 (ImportError, or gymnasium's DependencyNotInstalled)
        return f"{type(err).__name__}: {err}"
    return None


def pixel_main(args, all_devices) -> list[dict]:
    results = []
    missing = car_racing_missing()
    if missing:
        print(f"CarRacing-v3 skipped ({missing}); for the side-by-side figures: .venv/bin/pip install -e '.[bench]'")
    # CarRacing is sampled before the first configuration and after each one, so its
    # median spans the same stretch of time on this shared machine as jaxrace's figures.
    samples = {} if missing else {w: [bench_car_racing(args.car_racing_steps, w)] for w in (0, 2)}
    for envs in args.pixel_envs:
        steps = args.steps * (4 if envs == 1 else 1) // (2 if envs >= 1024 else 1)
        layouts = [all_devices[:1]] + ([all_devices] if len(all_devices) > 1 and envs % len(all_devices) == 0 else [])
        for devices in layouts:
            r = bench(envs, 7, steps, args.repeats, devices, pixels=True)
            results.append(r)
            print(f"pixels envs={envs:5d} devices={len(devices)}: compile {r['compile_s']:.1f} s, "
                  f"{r['steps_per_s']:,.0f} pixel steps/s", flush=True)
            for w in samples:
                samples[w].append(bench_car_racing(args.car_racing_steps, w))
    car_racing = {w: float(np.median(v)) for w, v in samples.items()}
    best_cr = max(car_racing.values()) if car_racing else None
    ratio = (lambda x: "-") if best_cr is None else (lambda x: f"{x / best_cr:,.1f}")  # noqa: E731
    table, rows = [], []
    if car_racing:
        print(f"CarRacing-v3: {car_racing[0]:,.0f} steps/s (1 env), {car_racing[2]:,.0f} steps/s (2-worker vector "
              "env)")
        table += [["CarRacing-v3 (96x96)", 1, "-", f"{car_racing[0]:,.0f}", ratio(car_racing[0]), "-"],
                  ["CarRacing-v3 (96x96), AsyncVectorEnv", 2, "2 workers", f"{car_racing[2]:,.0f}",
                   ratio(car_racing[2]), "-"]]
        rows += [{"name": "CarRacing-v3 steps/s, 1 env", "value": round(car_racing[0], 1), "unit": "steps/s"},
                 {"name": "CarRacing-v3 steps/s, 2-worker AsyncVectorEnv", "value": round(car_racing[2], 1),
                  "unit": "steps/s"}]
    print()
    table += [["jaxrace 64x64 chase, 7 opponents", r["envs"], r["devices"], f"{r['steps_per_s']:,.0f}",
               ratio(r["steps_per_s"]), f"{r['compile_s']:.1f} s"] for r in results]
    print_table(["env", "parallel envs", "devices", "pixel steps/s", "x CarRacing-v3 (best)", "compile"], table)
    for r in results:
        tag = f"{r['envs']} envs, 7 opponents, {r['devices']} device(s)"
        rows += [
            {"name": f"pixel steps/s (64x64 chase), {tag}", "value": round(r["steps_per_s"]), "unit": "steps/s"},
            {"name": f"pixel compile time, {tag}", "value": round(r["compile_s"], 2), "unit": "s"},
        ]
        if best_cr is not None:
            rows.append({"name": f"pixel steps/s over best CarRacing-v3, {tag}",
                         "value": round(r["steps_per_s"] / best_cr, 1), "unit": "x"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="agent steps per timed call (x envs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 256, 4096])
    parser.add_argument("--opponents", type=int, nargs="+", default=[0, 7])
    parser.add_argument("--mode", choices=("state", "pixels", "all"), default="all")
    parser.add_argument("--pixel-envs", type=int, nargs="+", default=[1, 256, 1024, 4096])
    parser.add_argument("--car-racing-steps", type=int, default=300)
    args = parser.parse_args()
    results = []
    all_devices = jax.devices()
    pixel_rows = pixel_main(args, all_devices) if args.mode in ("pixels", "all") else []
    if args.mode == "pixels":
        print(f"wrote {write_results(__file__.replace('bench_env', 'bench_env_pixels'), pixel_rows)}")
        return
    for opponents in args.opponents:
        for envs in args.envs:
            steps = args.steps * (8 if envs == 1 else 1)  # enough work to time a single env
            layouts = [all_devices[:1]] + ([all_devices] if len(all_devices) > 1 and envs % len(all_devices) == 0
                                           else [])
            for devices in layouts:
                results.append(bench(envs, opponents, steps, args.repeats, devices))
                r = results[-1]
                print(f"envs={envs:5d} opponents={opponents} devices={len(devices)}: compile {r['compile_s']:.1f} s, "
                      f"{r['steps_per_s']:,.0f} env steps/s, {r['agent_steps_per_s']:,.0f} agent-steps/s",
                      flush=True)
    print()
    print_table(["parallel envs", "opponents", "devices", "env steps/s", "agent-steps/s (all cars)", "compile"],
                [[r["envs"], r["opponents"], r["devices"], f"{r['steps_per_s']:,.0f}",
                  f"{r['agent_steps_per_s']:,.0f}", f"{r['compile_s']:.1f} s"] for r in results])
    rows = []
    for r in results:
        tag = f"{r['envs']} envs, {r['opponents']} opponents, {r['devices']} device(s)"
        rows += [
            {"name": f"env steps/s, {tag}", "value": round(r["steps_per_s"]), "unit": "steps/s"},
            {"name": f"agent-steps/s, {tag}", "value": round(r["agent_steps_per_s"]), "unit": "steps/s"},
            {"name": f"compile time, {tag}", "value": round(r["compile_s"], 2), "unit": "s"},
        ]
    if pixel_rows:
        print(f"wrote {write_results(__file__.replace('bench_env', 'bench_env_pixels'), pixel_rows)}")
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
