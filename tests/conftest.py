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


# The longest modules, in seconds of one xdist worker's time on a 2-core CPU without AVX-512
# (an in-tree run, 2026-11-28). pytest-xdist hands out whole modules (`--dist loadfile`) in
# collection order (`--no-loadscope-reorder`; its default orders them by number of tests, which
# left the one-test, two-minute distributed loop to run alone at the end): the longest go first
# and the short ones fill in at the end. A module missing here keeps its place after them.
LONGEST_MODULES_S = {
    "agents/test_trainer.py": 285, "design/test_loop.py": 225, "envs/test_race.py": 180,
    "design/test_distributed_loop.py": 160, "agents/test_distributed.py": 145, "agents/test_recurrent.py": 105,
    "rewards/test_tuning.py": 75, "agents/test_networks.py": 70, "design/test_loop_vlm.py": 55,
    "agents/test_racing_gp.py": 50, "envs/test_pinned.py": 40, "envs/test_adapters.py": 35,
    "envs/test_render.py": 35, "rewards/test_compiler.py": 30, "envs/test_parallel.py": 20,
}


def pytest_collection_modifyitems(config, items):
    """Longest modules first (a stable sort: each module's tests stay together and in order)."""
    tests = os.path.dirname(__file__)
    items.sort(key=lambda item: -LONGEST_MODULES_S.get(os.path.relpath(item.path, tests).replace(os.sep, "/"), 0))


# XLA:CPU's older fusion emitters compile the loop's programs in about two thirds of the time
# (its race programs in half) and run them as fast (experiments/bench_loop_emitters.py). A tiny
# loop spends most of its time compiling, and what the loop tests check (stages, files, resuming,
# two processes) does not depend on how XLA emits a fusion, so their subprocesses use them.
LOOP_XLA_OPTION = "xla_cpu_use_fusion_emitters"


def _xla_knows(option: str) -> bool:
    """Whether this XLA accepts the compile option (an unknown flag in XLA_FLAGS aborts a process)."""
    import jax

    try:
        jax.jit(lambda: 0).lower().compile({option: False})
    except jax.errors.JaxRuntimeError as e:
        if "No such compile option" in str(e):
            return False
        raise
    return True


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
def loop_env(loop_cache):
    """The environment of a `jaxrace design` subprocess in the tests: the shared loop cache, the
    CPU, and XLA's older fusion emitters where this XLA has them (see LOOP_XLA_OPTION)."""
    env = {**os.environ, "JAXRACE_CACHE_DIR": str(loop_cache), "JAX_PLATFORMS": "cpu"}
    if _xla_knows(LOOP_XLA_OPTION):
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --{LOOP_XLA_OPTION}=false".strip()
    return env


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory):
    """A scripted OpenAI-compatible HTTP server on 127.0.0.1, shared by the session (see fake_llm_server)."""
    server = FakeServer(tmp_path_factory.mktemp("fake-openai"))
    yield server
    server.stop()
