"""The built-in AI in issue 16's race: from P8 of 8 against the AI at skill 0.9.

Usage: python experiments/ai_from_the_back.py [--races 20] [--tracks-dir ../shared/tracks]

What a scripted driver that overtakes achieves in the exact races `train_reference.py`
judges a trained agent by (the same circuits, 3 laps, the same 20 fields per seed: every
AI car at skill 0.9 with its own aggression), with the AI driving the ego car too at a
given skill and aggression. It is a bar for issue 16's targets (median finish 3rd or
better, at most 2 at-fault contacts and 1 course-out per race): whether a driver as
clean as the field can reach them from the back, and what passing costs in contacts.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import SHARED_TRACKS, print_table, write_results
from train_reference import RACE_LAPS, SKILL, load_track, setup

import jaxrace
from jaxrace.envs import race_fields, reference_lap_time
from jaxrace.envs.rollouts import ai_race, count_onsets, summarise

EGO_SKILLS = (0.95, 1.0)
EGO_AGGRESSIONS = (0.0, 0.5, 1.0)
SEEDS = (1, 2, 3)


def fields_of_seed(race_params, seed: int, races: int):
    """The fields of `train_reference.py --seed SEED`'s final races (its sixth key)."""
    k_fields = jax.random.split(jax.random.key(seed), 6)[5]
    return race_fields(race_params, k_fields, races, skill_spread=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracks-dir", type=Path, default=SHARED_TRACKS)
    parser.add_argument("--races", type=int, default=20, help="races per seed's fields")
    args = parser.parse_args()
    rows, table = [], []
    for spec in ("gp", str(args.tracks_dir / "BrandsHatch.csv")):
        track, name = load_track(spec)
        env, params = jaxrace.make(track=track, start="grid_back", laps=RACE_LAPS)
        params = setup(env, params, SKILL, 20.0)  # train_reference's defaults
        steps = math.ceil(RACE_LAPS * float(reference_lap_time(track)) / SKILL * 1.3 / 0.1)
        fields = jax.tree.map(lambda *x: jnp.concatenate(x), *[fields_of_seed(params, s, args.races) for s in SEEDS])
        races = len(SEEDS) * args.races
        run = jax.jit(jax.vmap(lambda p, k, env=env, steps=steps: ai_race(env, p, k, steps)))
        keys = jax.random.split(jax.random.key(0), races)
        for skill in EGO_SKILLS:
            for aggression in EGO_AGGRESSIONS:
                ego = fields.replace(skill=fields.skill.at[:, 0].set(skill),
                                     aggression=fields.aggression.at[:, 0].set(aggression))
                record = jax.tree.map(np.asarray, run(ego, keys))
                positions, fault, outs = [], [], []
                for i in range(races):
                    one = jax.tree.map(lambda a, i=i: a[i], record)
                    positions.append(next(r.position for r in summarise(one, RACE_LAPS).results if r.car == 0))
                    fault.append(count_onsets(one.hit_other_from_behind[:, 0]))
                    outs.append(count_onsets(one.off_course[:, 0]))
                per_seed = [float(np.median(positions[j * args.races:(j + 1) * args.races]))
                            for j in range(len(SEEDS))]
                table.append([name, skill, aggression, f"{np.median(positions):.1f}",
                              " / ".join(f"{m:.0f}" for m in per_seed), f"{np.mean(positions):.2f}",
                              f"{np.mean(fault):.2f}", f"{np.mean(outs):.2f}",
                              f"{np.mean(np.array(positions) <= 3):.0%}"])
                rows.append({"name": f"AI ego from P8, {name}, skill {skill}, aggression {aggression}",
                             "value": float(np.median(positions)), "unit": "position (median)",
                             "median_by_seed": per_seed, "mean_position": round(float(np.mean(positions)), 2),
                             "at_fault_per_race": round(float(np.mean(fault)), 2),
                             "course_outs_per_race": round(float(np.mean(outs)), 2), "races": races,
                             "field_skill": SKILL, "laps": RACE_LAPS})
    print_table(["circuit", "ego skill", "ego aggression", "median finish", "median by seed 1/2/3",
                 "mean finish", "at-fault contacts / race", "course-outs / race", "3rd or better"], table)
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
