"""jaxrace's CPU compile options (`jaxrace.jit`) against XLA's defaults, side by side.

Usage: python experiments/bench_cpu_compile_options.py [--rounds 2] [--preset quick] [--race-preset standard]

Each measurement runs in a fresh process, once with jaxrace's options and once with
`JAXRACE_XLA_DEFAULTS=1`, the order alternating from round to round (this machine is
shared and its speed drifts):

- the main job: `jaxrace design --preset quick` with a fresh compilation cache
  (`bench_design.run`): the whole command, its stages' seconds compiling, and the other
  seconds of its training and race stages (the programs running);
- run-bound programs of the `--race-preset`: its evaluation races (every final race of
  3 runs, a random actor, the AI field; `jaxrace.agents.evaluation.evaluate`) and the
  clip renderer (`jaxrace.envs.video.render_frames`, one race's frames): the first call
  (compiling included) and the median of 3 later calls.

Prints medians over rounds and writes results/bench_cpu_compile_options.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import print_table, write_results

SETTINGS = {"jaxrace's options": {}, "XLA's defaults": {"JAXRACE_XLA_DEFAULTS": "1"}}


def child_programs(preset: str) -> dict:
    """Seconds of the evaluation races and the renderer in this process (compiling, then running)."""
    import jax
    import numpy as np

    from jaxrace.agents import HParams
    from jaxrace.agents.evaluation import evaluate
    from jaxrace.agents.trainer import make_learner
    from jaxrace.design.config import load_config
    from jaxrace.design.loop import Envs, train_config
    from jaxrace.envs.video import render_frames
    from jaxrace.jit import compiler_options

    c = load_config(preset)
    e = Envs.make(c)
    learner = make_learner(train_config(c), e.train_env, e.train_params)
    runs = 3
    # Only the actor is kept: XLA drops the replay and the rest of the state from this program.
    actors = jax.jit(jax.vmap(lambda k: learner.init(k, HParams()).policy_actor))(
        jax.random.split(jax.random.key(0), runs))
    fields = e.race_fields(jax.random.key(1), c.final_races)

    def races():
        return evaluate(learner, actors, e.race_env, fields, jax.random.key(2), e.race_steps,
                        num_races=c.final_races, params_per_race=True)

    def timed(fn):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        return out, time.perf_counter() - t0

    ev, races_first = timed(races)
    races_later = statistics.median(timed(races)[1] for _ in range(3))
    one_race = jax.tree.map(lambda x: np.asarray(x[0, 0]), ev.states)
    field0 = jax.tree.map(lambda x: x[0], fields)
    _, render_first = timed(lambda: render_frames(e.race_env, field0, one_race))
    render_later = statistics.median(timed(lambda: render_frames(e.race_env, field0, one_race))[1] for _ in range(3))
    return {"options": compiler_options(), "races": c.final_races, "race_steps": e.race_steps,
            "frames": int(one_race.time.shape[0]),
            "races_first_s": races_first, "races_later_s": races_later,
            "render_first_s": render_first, "render_later_s": render_later}


def main_job(preset: str, extra_env: dict) -> dict:
    from bench_design import run

    saved = dict(os.environ)
    os.environ.update(extra_env)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            stages, wall, _ = run(preset, None, Path(tmp) / "run", Path(tmp) / "cache")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    compiling = sum(s["compile_seconds"] for s in stages.values())
    running = {kind: sum(s["seconds"] - s["compile_seconds"] for name, s in stages.items() if name.endswith(kind))
               for kind in ("/train", "/race")}
    return {"wall_s": wall, "compile_s": compiling, "train_running_s": running["/train"],
            "race_running_s": running["/race"]}


def programs(preset: str, extra_env: dict) -> dict:
    env = {**os.environ, **extra_env, "JAXRACE_CACHE_DIR": "off"}
    out = subprocess.run([sys.executable, __file__, "--child", preset], env=env, capture_output=True, text=True,
                         check=False, timeout=3600)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", default="quick", help="the main job's preset")
    parser.add_argument("--race-preset", default="standard", help="the preset whose races and renderer are timed")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_programs(args.child)))
        return
    os.environ.pop("XLA_FLAGS", None)  # the options under test are per program; no global flags either way
    names = list(SETTINGS)
    got = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            m = {**main_job(args.preset, SETTINGS[name]), **programs(args.race_preset, SETTINGS[name])}
            print(f"round {r + 1}, {name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                         for k, v in m.items()), flush=True)
            got[name].append(m)
    measures = [("wall_s", f"main job ({args.preset}, fresh cache): whole command (s)"),
                ("compile_s", "of it, the stages' seconds compiling"),
                ("train_running_s", "of it, training stages' other seconds"),
                ("race_running_s", "of it, race stages' other seconds"),
                ("races_first_s", f"{args.race_preset}'s final races (3 runs): first call (s)"),
                ("races_later_s", "the same races again: median of 3 (s)"),
                ("render_first_s", "one race's frames rendered: first call (s)"),
                ("render_later_s", "the same frames again: median of 3 (s)")]
    rows, table = [], []
    for key, label in measures:
        med = {name: statistics.median(m[key] for m in got[name]) for name in names}
        a, b = med[names[0]], med[names[1]]
        table.append([label, f"{a:.2f}", f"{b:.2f}", f"{100 * (a - b) / b:+.1f}%"])
        rows.append({"name": label, "value": a, "unit": "s", "xla_defaults": b, "rounds": args.rounds,
                     "samples": {name: [m[key] for m in got[name]] for name in names}})
    print_table(["measure (medians)", *names, "change"], table)
    first = got[names[0]][0]
    print(f"options: {first['options']}; {first['races']} races of {first['race_steps']} steps, "
          f"{first['frames']} frames rendered")
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
