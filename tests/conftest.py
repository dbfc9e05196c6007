import os
import shutil
import sys
import tempfile

import pytest
from fake_llm_server import FakeServer

# Set by the first pytest process of a run; its xdist workers and every child process inherit it.
_TEST_CACHE = "JAXRACE_TEST_XLA_CACHE"


def pytest_configure(config):
    """One persistent XLA cache for the whole run, in a fresh temporary directory.

    Many tests build the same env or trainer anew and compile the same programs again (in
    other tests, the other xdist worker, or a child process): the second compile loads the
    first's executable. Every program is kept, small ones too. A fresh directory per run, so
    a run never reads programs an older checkout compiled. In-process jit caches are not
    touched, so the tests that count compiles count what they did before (a cache load still
    logs "Finished XLA compilation" and emits the backend-compile event).
    """
    if os.environ.get(_TEST_CACHE) or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    path = tempfile.mkdtemp(prefix="jaxrace-tests-xla-")
    os.environ.update({_TEST_CACHE: path, "JAX_COMPILATION_CACHE_DIR": path,
                       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                       "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
    config._jaxrace_test_cache = path
    if "jax" in sys.modules:  # imported before us: its config has read the environment already
        import jax

        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    path = getattr(config, "_jaxrace_test_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


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
