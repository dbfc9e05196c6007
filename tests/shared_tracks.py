"""The real circuits in ../shared/tracks, for tests. A plain module, not conftest: two
conftest.py files share one module name, so tests cannot import helpers from them."""

import os
from pathlib import Path

import pytest

SHARED_TRACKS = Path(__file__).resolve().parents[1].parent / "shared" / "tracks"


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
