"""What the stored preferences say about at-fault contacts: the evidence weight tuning fits.

Usage: python experiments/preference_contacts.py RUN_DIR [RUN_DIR ...]

Reads each run directory's preference store and, per source of pairs (the bootstrap clips of the
AI field, then each iteration's evaluation races), counts the decided pairs (ties and skips left
out) whose preferred clip had more at-fault contacts than the other, fewer, or as many, and how
many of the preferred clips with more contacts also drove further. It asks why tuning lowers a
rear-end's price: where the preferred clip has more contacts as often as not, and drove further
too, a linear fit of the returns can explain the labels by the pay for progress and leave the
contacts cheap. Host-side only, no training. Writes results/preference_contacts.json.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections import Counter
from pathlib import Path

from common import print_table, run_dirs, write_results


def counts(store: Path) -> dict[str, Counter]:
    """{source: Counter of pairs, more, fewer, same, more_and_further} over the decided pairs."""
    out: dict[str, Counter] = {}
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
        clips = {i: json.loads(m) for i, m in db.execute("SELECT id, metrics FROM clips")}
        pairs = db.execute("SELECT iteration, first, second, label FROM preferences "
                           "WHERE label IN ('first', 'second') ORDER BY iteration, id")
        for iteration, first, second, label in pairs:
            won, lost = (clips[first], clips[second]) if label == "first" else (clips[second], clips[first])
            c = out.setdefault("bootstrap" if iteration == 0 else f"iter{iteration}", Counter())
            more = won["at_fault_contacts"] - lost["at_fault_contacts"]
            c["pairs"] += 1
            c["more" if more > 0 else "fewer" if more < 0 else "same"] += 1
            c["more_and_further"] += more > 0 and won["progress"] > lost["progress"]
    return out


def main() -> None:
    rows, table = [], []
    for run in run_dirs(__doc__.splitlines()[0], needs=("preferences.sqlite",)):
        for source, c in counts(run / "preferences.sqlite").items():
            rows.append({"name": f"{run.name}: {source}: decided pairs whose preferred clip had more at-fault "
                                 "contacts", "value": c["more"], "unit": "pairs", "pairs": c["pairs"],
                         "fewer": c["fewer"], "same": c["same"], "more_and_further": c["more_and_further"]})
            table.append([run.name, source, c["pairs"], c["more"], c["fewer"], c["same"], c["more_and_further"]])
    print_table(["run", "pairs from", "decided pairs", "preferred had more contacts", "fewer", "as many",
                 "more contacts and further"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
