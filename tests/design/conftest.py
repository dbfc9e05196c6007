import os

import pytest


@pytest.fixture(scope="module")
def setup(tmp_path_factory, loop_cache):
    """(root, tiny config, env) for a module that runs the loop in subprocesses: its own
    directory, test_loop's tiny config, and the session's shared compile cache."""
    from design.test_loop import TINY

    root = tmp_path_factory.mktemp("design")
    config = root / "tiny.toml"
    config.write_text(TINY)
    env = {**os.environ, "JAXRACE_CACHE_DIR": str(loop_cache), "JAX_PLATFORMS": "cpu"}
    return root, config, env
