import os
from pathlib import Path

import pytest

SHARED_TRACKS = Path(__file__).resolve().parents[1].parent / "shared" / "tracks"

# Real circuits (../shared/tracks, not shipped): length (km) and the GT3 qualifying band (s).
REAL_CIRCUITS = {
    "Monza": (5.79, 104.7, 107.0),
    "Spa": (7.00, 133.7, 137.4),
    "Silverstone": (5.89, 116.6, 119.0),
    "BrandsHatch": (3.91, 82.5, 84.5),
}


def shared_track(name: str) -> tuple[Path, Path]:
    """Centre-line and race-line CSVs of a real circuit.

    The circuits are not shipped. In CI (CI=true) ../shared/tracks must be there and a
    missing file fails the test; elsewhere the test is skipped with the reason.
    """
    centre = SHARED_TRACKS / f"{name}.csv"
    if not centre.exists():
        message = f"{centre} not found (the real circuits live in ../shared/tracks)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return centre, SHARED_TRACKS / f"{name}_raceline.csv"
