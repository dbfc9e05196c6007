import os

import pytest
from fake_llm_server import FakeServer


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
