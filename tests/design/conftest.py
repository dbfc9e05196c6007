import pytest


@pytest.fixture(scope="module")
def setup(tmp_path_factory, loop_env):
    """(root, tiny config, env) for a module that runs the loop in subprocesses: its own
    directory, test_loop's tiny config, and the loop tests' environment (conftest's loop_env)."""
    from design.test_loop import TINY

    root = tmp_path_factory.mktemp("design")
    config = root / "tiny.toml"
    config.write_text(TINY)
    return root, config, loop_env
