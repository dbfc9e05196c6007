import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from fake_llm_server import FakeServer

# Set by the first pytest process of a run; its xdist workers and every child process inherit it.
_TEST_CACHE = "JAXRACE_TEST_XLA_CACHE"


# Most tests compile small programs and run them briefly, so compiling is most of the suite's time.
# XLA:CPU's older fusion emitters and LLVM optimisation level 1 compile the tests' programs in about
# two thirds of the time and run them as fast (the small trainer's test 55 -> 36 s, the tiny learning
# test 37 -> 28 s; level 0 compiles faster still but trains 2x slower). Every process of a test run
# uses them: pytest's, its xdist workers and the loop's subprocesses. jaxrace's own programs carry
# their options (jaxrace.jit: the same two, where they do not render), which these flags do not change;
# the env's pins, of programs the tests jit themselves, are computed in children with the user's
# XLA_FLAGS (pins.default_compile_env).
TEST_XLA_OPTIONS = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=1")
DEFAULT_XLA_FLAGS = "JAXRACE_TEST_DEFAULT_XLA_FLAGS"  # the XLA_FLAGS the run started with


def _xla_accepts(flags: str) -> bool:
    """Whether a process with these XLA_FLAGS starts and compiles (an unknown flag aborts it)."""
    check = subprocess.run([sys.executable, "-c", "import jax; jax.jit(lambda x: x + 1)(1)"],
                           env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
                           capture_output=True, timeout=120)
    return check.returncode == 0


def _use_test_xla_options() -> None:
    """Sets XLA_FLAGS for the run's processes to the user's flags and every TEST_XLA_OPTIONS entry this XLA
    accepts; the first pytest process decides, its workers and children inherit it."""
    if DEFAULT_XLA_FLAGS in os.environ:
        return
    user = os.environ.get("XLA_FLAGS", "")
    os.environ[DEFAULT_XLA_FLAGS] = user
    flags = " ".join([user, *TEST_XLA_OPTIONS]).strip()
    if not _xla_accepts(flags):  # one check in the usual case; one per option where some is unknown
        flags = user
        for option in TEST_XLA_OPTIONS:
            if _xla_accepts(f"{flags} {option}".strip()):
                flags = f"{flags} {option}".strip()
    os.environ["XLA_FLAGS"] = flags


def pytest_configure(config):
    """The tests' compile options (TEST_XLA_OPTIONS), then one persistent XLA cache for the whole run,
    in a fresh temporary directory.

    Many tests build the same env or trainer anew and compile the same programs again (in
    other tests, the other xdist worker, or a child process): the second compile loads the
    first's executable. Every program is kept, small ones too. A fresh directory per run, so
    a run never reads programs an older checkout compiled. In-process jit caches are not
    touched, so the tests that count compiles count what they did before (a cache load still
    logs "Finished XLA compilation" and emits the backend-compile event).
    """
    _use_test_xla_options()
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
# (an in-tree run with TEST_XLA_OPTIONS, 2026-12-01). pytest-xdist hands out whole modules (`--dist loadfile`)
# in collection order (`--no-loadscope-reorder`; its default orders them by number of tests, which
# left the one-test, two-minute distributed loop to run alone at the end): the longest go first
# and the short ones fill in at the end. A module missing here keeps its place after them.
LONGEST_MODULES_S = {
    "agents/test_trainer.py": 440, "design/test_loop.py": 330, "agents/test_distributed.py": 285,
    "design/test_distributed_loop.py": 215, "envs/test_race.py": 180, "agents/test_networks.py": 115,
    "agents/test_recurrent.py": 115, "rewards/test_tuning.py": 105, "design/test_loop_vlm.py": 100,
    "envs/test_pinned.py": 80, "agents/test_racing_gp.py": 75, "envs/test_parallel.py": 45,
    "envs/test_adapters.py": 45, "envs/test_render.py": 40, "rewards/test_compiler.py": 35,
}


def pytest_collection_modifyitems(config, items):
    """Longest modules first (a stable sort: each module's tests stay together and in order)."""
    tests = os.path.dirname(__file__)
    items.sort(key=lambda item: -LONGEST_MODULES_S.get(os.path.relpath(item.path, tests).replace(os.sep, "/"), 0))


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
    """The environment of a `jaxrace design` subprocess in the tests: the shared loop cache and
    the CPU (and the tests' compile options, TEST_XLA_OPTIONS, as every process of the run)."""
    return {**os.environ, "JAXRACE_CACHE_DIR": str(loop_cache), "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory):
    """A scripted OpenAI-compatible HTTP server on 127.0.0.1, shared by the session (see fake_llm_server)."""
    server = FakeServer(tmp_path_factory.mktemp("fake-openai"))
    yield server
    server.stop()
