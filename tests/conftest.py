import os
from pathlib import Path

import pytest
from fake_llm_server import FakeServer

from jaxrace.envs.circuits import REAL_CIRCUITS  # noqa: F401 (the real circuits' facts, for tests)

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


@pytest.fixture(scope="session")
def loop_cache(tmp_path_factory):
    """JAXRACE_CACHE_DIR for every test that runs the loop in a subprocess: their compiled
    programs (and reward artifacts) are shared, as a user's reruns share them. Under
    pytest-xdist every worker uses the same one (JAX and the reward cache write atomically)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "loop-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("loop-cache")


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory):
    """A scripted OpenAI-compatible HTTP server on 127.0.0.1, shared by the session (see fake_llm_server)."""
    server = FakeServer(tmp_path_factory.mktemp("fake-openai"))
    yield server
    server.stop()
