"""When and how the final agents of a design run cause contacts: the start, a corner, a pass?

Usage: python experiments/contact_anatomy.py [--run-dir runs/design_clean_racing] [--tag TAG]

Reruns a finished run's final races exactly (the same fields and keys as its `final/race`
stage; the race counts are checked against `final/race/metrics.json`), then, for each
final agent, takes every onset of an at-fault contact (the ego car runs into the back of
another car) and records: the seconds since the start, the lap, the ego car's place
before it, its speed, how fast it was closing on the car ahead over the second before
(from `gap_ahead`), and its pedal (throttle_brake) over that second. Prints the onsets
by phase of the race and by closing speed, per agent, and by corner of the circuit (each
onset belongs to the next corner whose apex is at most 100 m behind it; a corner is a
minimum of the reference speed, 12% under the fastest of the 300 m before); writes
results/contact_anatomy.json (`--tag` adds a suffix).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import jax
import numpy as np
from common import print_table, write_results

from jaxrace.design.loop import Loop, centre_line, stage_key
from jaxrace.design.progress import Display
from jaxrace.design.report import INCIDENT_STYLE, svg_incident_map
from jaxrace.design.rundir import RunDir
from jaxrace.envs.rollouts import onset_steps

PHASES = ((0.0, 10.0, "first 10 s"), (10.0, 30.0, "10-30 s"), (30.0, 1e9, "after 30 s"))
LOOKBACK = 10  # agent steps (1 s at 10 Hz)
PAST_APEX = 100.0  # m: an onset this far past an apex still belongs to that corner (its exit)


def anatomy(view, actions: np.ndarray, dt: float) -> list[dict]:
    """Every at-fault onset of one race: `view` holds [T + 1] arrays, `actions` f32[T, 2]."""
    hits = np.asarray(view.hit_other_from_behind)
    out = []
    for t in onset_steps(hits):
        t0 = max(t - LOOKBACK, 0)
        gap = np.asarray(view.gap_ahead)
        closing = (gap[t0] - gap[t - 1]) / max((t - 1 - t0) * dt, dt) if t >= 2 else float("nan")
        pedal = actions[t0:t, 1] if t > 0 else actions[:1, 1]
        out.append({"time": float(np.asarray(view.time)[t]), "lap": int(np.asarray(view.laps)[t]),
                    "lap_fraction": float(np.asarray(view.lap_progress)[t]),
                    "rank_before": int(np.asarray(view.rank)[max(t - 1, 0)]),
                    "speed": float(np.asarray(view.speed)[t - 1 if t else 0]),
                    "closing_speed": float(closing), "mean_pedal": float(np.mean(pedal)),
                    "braked": bool(np.min(pedal) < -0.1)})
    return out


def run_events(ev, r: int, dt: float) -> list[dict]:
    """Every at-fault onset of run r's races in an `evaluate` result (states [R, races, T + 1])."""
    events = []
    for i in range(ev.actions.shape[1]):
        view = jax.tree.map(lambda x, i=i: np.asarray(x[r, i]), ev.states.view)
        events += [{"race": i, **e} for e in anatomy(view, np.asarray(ev.actions[r, i]), dt)]
    return events


def agent_row(candidate: str, seed: int, races: int, events: list[dict]) -> dict:
    """One agent's onsets by phase of the race, closing speed and pedal, and the onsets themselves."""
    row = {"candidate": candidate, "seed": seed, "races": races, "at_fault_onsets": len(events),
           **{f"onsets {label}": sum(lo <= x["time"] < hi for x in events) for lo, hi, label in PHASES},
           "median_closing_speed": None, "share_braked_in_last_second": None, "share_in_first_place_or_second": None}
    if events:
        row.update(median_closing_speed=float(np.nanmedian([x["closing_speed"] for x in events])),
                   share_braked_in_last_second=float(np.mean([x["braked"] for x in events])),
                   share_in_first_place_or_second=float(np.mean([x["rank_before"] <= 2 for x in events])))
    return {**row, "events": events}


def print_agent_rows(rows: list[dict]) -> None:
    def pct(x):
        return "-" if x is None else f"{x:.0%}"

    print_table(["agent", "at-fault onsets", *[p[2] for p in PHASES], "median closing speed before (m/s)",
                 "braked in the second before", "while 1st or 2nd"],
                [[r["candidate"], r["at_fault_onsets"], *[r[f"onsets {p[2]}"] for p in PHASES],
                  "-" if r["median_closing_speed"] is None else f"{r['median_closing_speed']:.1f}",
                  pct(r["share_braked_in_last_second"]), pct(r["share_in_first_place_or_second"])] for r in rows])


def corners(s: np.ndarray, ref_speed: np.ndarray, length: float, window: float = 150.0,
            min_drop: float = 0.12) -> list[dict]:
    """The circuit's corners in lap order, [{"name": "T1", "apex": m, "apex_kmh": km/h}]: the stations
    (s f32[N] m, ref_speed f32[N] m/s) where the reference speed is lowest within +-`window` m
    and at least `min_drop` under the fastest of the 2 x `window` m before."""
    n = len(s)
    w = max(1, int(window * n / length))
    apexes: list[int] = []
    for i in range(n):
        around = ref_speed[np.arange(i - w, i + w + 1) % n]
        if ref_speed[i] > around.min() or (apexes and i - apexes[-1] < w):
            continue
        if ref_speed[i] < (1.0 - min_drop) * ref_speed[np.arange(i - 2 * w, i + 1) % n].max():
            apexes.append(i)
    return [{"name": f"T{k + 1}", "apex": round(float(s[i]), 1), "apex_kmh": round(float(ref_speed[i]) * 3.6)}
            for k, i in enumerate(apexes)]


def add_corners(rows: list[dict], turns: list[dict], length: float) -> None:
    """Adds to each agent row "corners": per corner of `turns`, its apex, the onsets there and how
    many came before the apex (braking in)."""
    apex = np.array([c["apex"] for c in turns])
    for row in rows:
        where: dict[str, list[float]] = {c["name"]: [] for c in turns}
        for e in row["events"] if turns else ():
            ahead = (apex - e["lap_fraction"] * length + PAST_APEX) % length  # m to each apex, + PAST_APEX
            k = int(np.argmin(ahead))
            where[turns[k]["name"]].append(float(ahead[k]) - PAST_APEX)
        row["corners"] = [{**c, "onsets": len(where[c["name"]]),
                           "before_apex": sum(x > 0 for x in where[c["name"]])} for c in turns]


def print_corner_rows(rows: list[dict]) -> None:
    if not rows or not rows[0]["corners"]:
        return
    print_table(["agent", *[f"{c['name']} ({c['apex']:.0f} m, {c['apex_kmh']} km/h)" for c in rows[0]["corners"]]],
                [[r["candidate"], *[f"{c['onsets']} ({c['before_apex']} in)" for c in r["corners"]]] for r in rows])
    print("(at-fault onsets at each corner; in brackets those before its apex, braking in)")


def track_corners(tracks) -> tuple[list[dict], float]:
    """(corners, length m) of the first track of `tracks` (a Track, or stacked Tracks)."""
    s = np.asarray(tracks.s).reshape(-1, np.shape(tracks.s)[-1])[0]
    speed = np.asarray(tracks.ref_speed).reshape(-1, np.shape(tracks.ref_speed)[-1])[0]
    length = float(np.ravel(tracks.length)[0])
    return corners(s, speed, length), length


def draw(path: str, names: list[str], metrics, track: dict, size: int = 300) -> None:
    """The report's incident maps of each agent side by side, each titled, in one SVG file."""
    parts, height = [], 0
    for k, (name, races) in enumerate(zip(names, metrics, strict=True)):
        found = [i for m in races for i in m.incidents]
        counts = ", ".join(f"{sum(i['kind'] == kind for i in found)} {label}s"
                           for kind, (_, label) in INCIDENT_STYLE.items())
        drawn = svg_incident_map(track["xy"], track["width"], found, size=size)
        height = max(height, int(re.search(r'height="(\d+)"', drawn).group(1)))
        parts.append(f'<g transform="translate({k * (size + 20)},0)"><text x="4" y="14" font-size="13" '
                     f'font-weight="bold">{name}</text><text x="4" y="30" font-size="11">{counts}</text>'
                     f'<g transform="translate(0,36)">{drawn}</g></g>')
    legend = " ".join(f'<tspan fill="{color}">&#9679; {label}</tspan>' for color, label in INCIDENT_STYLE.values())
    width = len(names) * (size + 20)
    Path(path).write_text(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 60}" '
                          f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>{"".join(parts)}'
                          f'<text x="4" y="{height + 52}" font-size="11">{legend} (o: the start line)</text></svg>\n')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", default="runs/design_clean_racing")
    ap.add_argument("--tag", default="")
    ap.add_argument("--svg", default=None, help="also draw every agent's incidents on the circuit, as the report "
                    "does, into this SVG file")
    args = ap.parse_args()

    from jaxrace.agents.evaluation import evaluate

    run = RunDir(args.run_dir)
    config = run.config()
    loop = Loop(config, run, Display(quiet=True))
    e = loop.envs
    names, folder = loop._runs("final")
    trainer = loop._trainer("final", loop._bank(folder, names))
    stored = run.read_json("final/race/metrics.json")
    runs = stored["runs"]
    actors = loop._actors("final", trainer, len(runs))
    k_field, k_race = jax.random.split(stage_key(config, "final/race"))
    ev = evaluate(trainer, actors, e.race_env, e.race_fields(k_field, config.final_races), k_race, e.race_steps,
                  num_races=config.final_races, params_per_race=True)
    for r in range(len(runs)):
        again = [m.collisions_at_fault for m in ev.metrics[r]]
        before = [m["collisions_at_fault"] for m in stored["races"][r]]
        if again != before:
            raise SystemExit(f"run {runs[r]['candidate']}: the rerun's at-fault counts {again} differ from the "
                             f"stored {before}: the races were not reproduced")
    dt = float(e.race_env.static.dt)
    rows = [agent_row(info["candidate"], info["seed"], config.final_races, run_events(ev, r, dt))
            for r, info in enumerate(runs)]
    print(f"{args.run_dir}: {config.final_races} races from P{config.opponents + 1}, AI skill {config.ai_skill}")
    print_agent_rows(rows)
    add_corners(rows, *track_corners(e.race_params.tracks))
    print_corner_rows(rows)
    if args.svg:
        draw(args.svg, [info["candidate"] for info in runs], ev.metrics, centre_line(e.race_params))
        print(f"wrote {args.svg}")
    path = write_results(__file__ if not args.tag else f"{Path(__file__).stem}-{args.tag}", rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
