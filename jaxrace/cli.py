"""The `jaxrace` command (host-side).

`jaxrace` with no arguments runs the main job on embedded defaults: the reward-design
loop (`jaxrace design`) with the offline proposer, the scripted judge and the quick
preset, in a new folder under runs/. `jaxrace race` is a race of the built-in AI.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def _race(args) -> int:
    import jaxrace
    from jaxrace.envs.rollouts import ai_race, format_summary, summarise

    if args.steps is not None and args.steps < 1:
        raise SystemExit("error: --steps must be at least 1")
    env, params = jaxrace.make(track=args.track, num_opponents=args.opponents, laps=args.laps, start=args.start)
    c = env.static.num_cars
    key = jax.random.key(args.seed)
    k_skill, k_aggr, k_race = jax.random.split(key, 3)
    # A field with a spread of skills, the faster cars further back, so there is racing.
    skill = jnp.sort(jax.random.uniform(k_skill, (c,), minval=0.88, maxval=1.0))
    skill = skill.at[0].set(args.ego_skill)
    params = params.replace(skill=skill, aggression=jax.random.uniform(k_aggr, (c,)))
    steps = args.steps or int(float(params.tracks.ref_lap_time) * (args.laps + 1) * 1.3 / env.static.dt)
    print(f"jaxrace: {c} cars, {args.laps} lap(s) of '{args.track}' "
          f"({float(params.tracks.length) / 1000:.2f} km, reference lap {float(params.tracks.ref_lap_time):.2f} s), "
          f"start '{args.start}', {steps} steps of {env.static.dt:.1f} s on {jax.default_backend()}")
    t0 = time.perf_counter()
    record = jax.jit(ai_race, static_argnums=(0, 3))(env, params, k_race, steps)
    jax.block_until_ready(record)
    wall = time.perf_counter() - t0
    print(format_summary(summarise(record, args.laps), np.asarray(skill)))
    print(f"simulated {steps * env.static.dt:.0f} s of racing in {wall:.1f} s (compile included)")
    return 0


def _reward(args) -> int:
    from pathlib import Path

    from jaxrace.rewards import RewardCompileError, api_text, compile_reward, propose

    if args.reward_command == "api":
        print(api_text())
        return 0
    if args.reward_command == "propose":
        if args.m < 1:
            raise SystemExit("error: -m must be at least 1")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for p in propose(args.task, args.m, jax.random.key(args.seed)):
            (out / f"{p.name}.py").write_text(p.source)
            print(f"{out / (p.name + '.py')}: {p.structure}, terms {', '.join(p.terms)}")
        return 0
    status = 0
    for path in args.files:
        try:
            r = compile_reward(Path(path).read_text(encoding="utf-8"), name=Path(path).stem)
        except (OSError, UnicodeDecodeError) as err:
            print(f"{path}: cannot read: {err}", file=sys.stderr)
            status = 1
        except RewardCompileError as err:
            print(f"{path}:{err.lineno or 0}: {err}", file=sys.stderr)
            status = 1
        else:
            saved = ""
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                saved = f", artifact {r.save(Path(args.out) / (Path(path).stem + '.jaxreward'))}"
            print(f"{path}: ok, components {list(r.component_names)}, PARAMS {dict(r.params)}, "
                  f"sha256 {r.sha256[:12]}{saved}")
    return status


def _design(args) -> int:
    from pathlib import Path

    from jaxrace.design import ConfigMismatch, load_config, run_design

    try:
        config = load_config(args.preset or "quick", args.config, task=args.task, llm=args.llm, judge=args.judge,
                             iterations=args.iterations, m=args.m, n=args.n, track=args.track, seed=args.seed)
    except ValueError as err:
        print(f"jaxrace design: error: {err}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{config.preset}"
    if not args.quiet:
        print(f"jaxrace design: {config.task!r}, preset {config.preset}, {config.iterations} iterations of "
              f"M={config.m}, N={config.n} on '{config.track}', LLM {config.llm}, judge {config.judge}; "
              f"run directory {run_dir}")
    try:
        report = run_design(config, run_dir, quiet=args.quiet)
    except ConfigMismatch as err:
        print(f"jaxrace design: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0


def _report(args) -> int:
    from pathlib import Path

    from jaxrace.design import RunDir, write_report

    if not (Path(args.run_dir) / "config.json").exists():
        print(f"jaxrace report: error: {args.run_dir} is not a run directory (no config.json)", file=sys.stderr)
        return 2
    print(write_report(RunDir(args.run_dir)))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jaxrace", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    race = sub.add_parser("race", help="a race of the built-in AI; prints lap times and positions")
    race.add_argument("--track", default="club", help="built-in name, 'procedural:SEED' or a centre-line CSV")
    race.add_argument("--opponents", type=int, default=7)
    race.add_argument("--laps", type=int, default=2)
    race.add_argument("--start", default="grid_back", choices=("grid_back", "random", "time_trial"))
    race.add_argument("--seed", type=int, default=0)
    race.add_argument("--ego-skill", type=float, default=1.0, help="the AI skill driving the ego car")
    race.add_argument("--steps", type=int, default=None, help="agent steps to simulate (default: enough)")
    reward = sub.add_parser("reward", help="reward programs: show the API, check programs, propose offline")
    reward_sub = reward.add_subparsers(dest="reward_command", required=True)
    reward_sub.add_parser("api", help="print the API text an LLM is shown")
    check = reward_sub.add_parser("check", help="compile reward programs (sandboxed) and report")
    check.add_argument("files", nargs="+", help="Python source files, each defining reward(prev, action, curr)")
    check.add_argument("--out", default=None, help="write each compiled artifact to DIR/NAME.jaxreward")
    prop = reward_sub.add_parser("propose", help="write M programs from the offline proposer (not an LLM)")
    prop.add_argument("--task", default="win the race cleanly from the back of the grid")
    prop.add_argument("-m", type=int, default=8)
    prop.add_argument("--seed", type=int, default=0)
    prop.add_argument("--out", default="proposals")
    design = sub.add_parser("design", help="the reward-design loop (the main job)")
    design.add_argument("--task", default=None, help="the task in words (default: the preset's)")
    design.add_argument("--preset", default=None, choices=("quick", "standard", "paper"))
    design.add_argument("--config", default=None, help="a TOML file of DesignConfig fields (top-level keys)")
    design.add_argument("--llm", default=None, choices=("offline",), help="who writes the programs")
    design.add_argument("--judge", default=None, choices=("scripted",))
    design.add_argument("--run-dir", default=None, help="the run directory; an existing one is resumed")
    design.add_argument("--iterations", type=int, default=None, help="K")
    design.add_argument("-m", type=int, default=None, help="programs generated per iteration")
    design.add_argument("-n", type=int, default=None, help="programs trained per iteration")
    design.add_argument("--track", default=None, help="a built-in circuit")
    design.add_argument("--seed", type=int, default=None)
    design.add_argument("--quiet", action="store_true", help="no progress display")
    report = sub.add_parser("report", help="rebuild report.html of a run directory")
    report.add_argument("run_dir")
    args = parser.parse_args(argv)
    if args.command == "reward":
        return _reward(args)
    if args.command is None:  # the main job on embedded defaults
        args = parser.parse_args(["design", *(argv or [])])
    if args.command == "design":
        return _design(args)
    if args.command == "report":
        return _report(args)
    if args.start == "time_trial":
        args.opponents = 0
    try:
        return _race(args)
    except (ValueError, KeyError) as err:
        print(f"jaxrace: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
