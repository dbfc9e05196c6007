"""How well the built-in AI drives: laps of real circuits, and 8-car races.

Usage: python experiments/ai_driver.py [--races 16] [--tracks-dir ../shared/tracks]

1. Skill 1.0, alone, two laps of each real circuit: the flying (second) lap against the
   reference lap (target: within 5%, no course-out).
2. 8-car races from a grid on built-in circuits, 3 laps: skills drawn in [0.86, 1.0]
   with the faster cars further back, random aggression; overtakes and contacts per race.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import REAL_CIRCUITS, SHARED_TRACKS, print_table, write_results

import jaxrace
from jaxrace.envs import load_track_csv, stack_tracks
from jaxrace.envs.rollouts import ai_race, summarise


def real_circuit_laps(tracks_dir: Path):
    names = list(REAL_CIRCUITS)
    tracks = stack_tracks([load_track_csv(tracks_dir / f"{n}.csv", tracks_dir / f"{n}_raceline.csv") for n in names])
    env, params = jaxrace.make(track=tracks, start="time_trial", laps=2, skill=jnp.ones(1))
    steps = int(float(jnp.max(tracks.ref_lap_time)) * 2.3 / env.static.dt)
    axes = jax.tree.map(lambda _: None, params).replace(track_index=0)
    batched = params.replace(track_index=jnp.arange(len(names)))
    race = jax.jit(jax.vmap(ai_race, in_axes=(None, axes, None, None)), static_argnums=(0, 3))
    record = race(env, batched, jax.random.key(0), steps)
    rows, table = [], []
    for i, name in enumerate(names):
        s = summarise(jax.tree.map(lambda a, i=i: a[i], record), race_laps=2)
        ego = s.results[0]
        ref = float(tracks.ref_lap_time[i])
        flying = ego.lap_times[1] if len(ego.lap_times) > 1 else float("nan")
        rows.append({"name": f"AI flying lap / reference, {name}", "value": round(flying / ref, 4), "unit": "ratio",
                     "flying_lap_s": round(flying, 2), "reference_lap_s": round(ref, 2),
                     "course_outs": s.course_outs, "wall_hits": s.wall_hits})
        table.append([name, f"{ref:.1f} s", f"{flying:.1f} s", f"{100 * (flying / ref - 1):+.1f}%",
                      s.course_outs, s.wall_hits])
    print_table(["circuit", "reference lap", "AI flying lap (skill 1.0)", "slower by", "course-outs", "wall hits"],
                table)
    return rows


def races(track: str, num_races: int, laps: int = 3):
    env, params = jaxrace.make(track=track, num_opponents=7, laps=laps)
    c = env.static.num_cars

    def one(key):
        k_skill, k_aggr, k_race = jax.random.split(key, 3)
        skill = jnp.sort(jax.random.uniform(k_skill, (c,), minval=0.86, maxval=1.0))
        p = params.replace(skill=skill, aggression=jax.random.uniform(k_aggr, (c,)))
        return ai_race(env, p, k_race, steps)

    steps = int(float(params.tracks.ref_lap_time) * (laps + 1) * 1.35 / env.static.dt)
    record = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(1), num_races))
    summaries = [summarise(jax.tree.map(lambda a, i=i: a[i], record), laps) for i in range(num_races)]
    overtakes = np.array([s.overtakes for s in summaries])
    contacts = np.array([s.contacts for s in summaries])
    outs = np.array([s.course_outs for s in summaries])
    walls = np.array([s.wall_hits for s in summaries])
    finished = np.array([sum(r.finish_time is not None for r in s.results) for s in summaries])
    car_laps = c * laps
    return {
        "track": track, "overtakes": overtakes, "contacts": contacts, "course_outs": outs, "walls": walls,
        "finished": finished, "contacts_per_car_lap": contacts.mean() / car_laps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracks-dir", type=Path, default=SHARED_TRACKS)
    parser.add_argument("--races", type=int, default=16)
    args = parser.parse_args()
    rows = real_circuit_laps(args.tracks_dir)
    print()
    table = []
    for track in ("club", "gp"):
        r = races(track, args.races)
        spread = {k: f"{np.median(r[k]):.0f} ({r[k].min()}-{r[k].max()})" for k in ("overtakes", "contacts")}
        table.append([track, args.races, spread["overtakes"], spread["contacts"],
                      f"{r['contacts_per_car_lap']:.3f}", int(r["course_outs"].sum()), int(r["walls"].sum()),
                      f"{r['finished'].sum()}/{8 * args.races}"])
        rows += [
            {"name": f"8-car race overtakes per race (median), {track}", "value": float(np.median(r["overtakes"])),
             "unit": "count", "races": args.races, "laps": 3},
            {"name": f"8-car race car contacts per race (median), {track}", "value": float(np.median(r["contacts"])),
             "unit": "count", "races": args.races, "laps": 3},
            {"name": f"8-car race car contacts per car per lap, {track}", "value": round(r["contacts_per_car_lap"], 4),
             "unit": "count"},
            {"name": f"8-car race finishers, {track}", "value": int(r["finished"].sum()), "unit": "cars",
             "of": 8 * args.races},
        ]
    print_table(["circuit", "races", "overtakes / race", "contacts / race", "contacts / car / lap", "course-outs",
                 "wall hits", "finished"], table)
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
