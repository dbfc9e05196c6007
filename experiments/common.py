"""Shared by the experiment scripts: where results go, and what machine made them."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

import jax

from jaxrace.envs.circuits import REAL_CIRCUITS  # noqa: F401 (re-exported to the scripts)

RESULTS = Path(__file__).resolve().parent / "results"
SHARED_TRACKS = Path(__file__).resolve().parents[2] / "shared" / "tracks"


def machine() -> str:
    """A short description of the machine, e.g. '2-core Intel Xeon ..., cpu backend'."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    devices = jax.devices()
    accel = "" if devices[0].platform == "cpu" else f", {len(devices)} x {devices[0].device_kind}"
    return f"{os.cpu_count()}-core {cpu}{accel}, jax {jax.__version__} on {jax.default_backend()}"


def write_results(script: str, rows: list[dict]) -> Path:
    """Writes experiments/results/<script>.json in the format DESIGN.md gives.

    With JAXRACE_RESULTS_TAG=TAG in the environment the file is <script>-TAG.json, so a
    run on another machine (a GPU, say) keeps the recorded CPU results beside it.
    """
    RESULTS.mkdir(exist_ok=True)
    tag = os.environ.get("JAXRACE_RESULTS_TAG", "")
    path = RESULTS / f"{Path(script).stem}{'-' + tag if tag else ''}.json"
    payload = {"machine": machine(), "date": datetime.date.today().isoformat(), "rows": rows}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def print_table(headers: list[str], rows: list[list]) -> None:
    """Prints a Markdown table (pasteable into the README)."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


def run_dirs(description: str, needs: tuple[str, ...] = ("config.json", "preferences.sqlite")) -> list[Path]:
    """The `jaxrace design` run directories named on the command line, each checked for the files in `needs`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", nargs="+", type=Path)
    runs = parser.parse_args().runs
    for run in runs:
        missing = [f for f in needs if not (run / f).is_file()]
        if missing:
            raise SystemExit(f"{run}: no {' or '.join(missing)}; pass jaxrace design run directories")
    return runs
