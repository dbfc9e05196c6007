"""Reference lap of the default GT3 car on four real circuits vs real GT3 qualifying laps.

Usage: python experiments/calibrate_reference_lap.py [--tracks-dir ../shared/tracks]

One set of car parameters (jaxrace.envs.CarParams defaults); the circuits' centre and
race lines come from the TUM racetrack database copy in ../shared/tracks. Target: within
8% of the band of real GT3 qualifying laps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import REAL_CIRCUITS, SHARED_TRACKS, print_table, write_results

from jaxrace.envs import load_track_csv, reference_lap_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracks-dir", type=Path, default=SHARED_TRACKS)
    args = parser.parse_args()
    rows, table = [], []
    for name, (_, (lo, hi)) in REAL_CIRCUITS.items():
        track = load_track_csv(args.tracks_dir / f"{name}.csv", args.tracks_dir / f"{name}_raceline.csv")
        lap = reference_lap_time(track)
        outside = 0.0 if lo <= lap <= hi else (lap - hi) / hi if lap > hi else (lap - lo) / lo
        top = float(track.ref_speed.max()) * 3.6
        rows.append({"name": f"{name} reference lap", "value": round(lap, 2), "unit": "s", "band_s": [lo, hi],
                     "outside_band_pct": round(100 * outside, 2), "length_km": round(float(track.length) / 1000, 3),
                     "top_speed_kmh": round(top, 1)})
        table.append([name, f"{float(track.length) / 1000:.2f} km", f"{lap:.1f} s", f"{lo:.1f}-{hi:.1f} s",
                      f"{100 * outside:+.1f}%", f"{top:.0f} km/h"])
    print_table(["circuit", "length", "reference lap", "real GT3 qualifying", "outside band", "top speed"], table)
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
