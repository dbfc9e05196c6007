"""The sandbox worker's confinement: what a process under it can and cannot touch."""

import json
import os
import socket
import subprocess
import sys

import pytest

import jaxrace.rewards.sandbox as sandbox
from jaxrace.rewards import isolation

PROBE = r"""
import json, os, socket, sys
from jaxrace.rewards import isolation
secret, writable, outside, port = sys.argv[1:5]
netns = isolation.apply_network_namespace()
abi, why = isolation.apply_landlock(writable)
result = {"netns": netns, "landlock": why, "abi": abi}
try:
    open(secret).read(); result["read_secret"] = True
except OSError:
    result["read_secret"] = False
try:
    open(os.path.join(outside, "pwned"), "w").write("x"); result["wrote_outside"] = True
except OSError:
    result["wrote_outside"] = False
try:
    open(os.path.join(writable, "ok"), "w").write("x"); result["wrote_private"] = True
except OSError:
    result["wrote_private"] = False
try:
    s = socket.create_connection(("127.0.0.1", int(port)), timeout=2); s.close(); result["connected"] = True
except OSError:
    result["connected"] = False
import jax, jax.numpy as jnp
result["jax_works"] = float(jax.jit(lambda x: jnp.sin(x) * 2)(0.5)) > 0
print(json.dumps(result))
"""


@pytest.mark.skipif(isolation.landlock_abi() < 1, reason="this kernel has no Landlock: the worker warns instead")
def test_a_confined_process_cannot_read_user_files_write_outside_or_connect(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's data")
    writable, outside = tmp_path / "private", tmp_path / "outside"
    writable.mkdir()
    outside.mkdir()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        proc = subprocess.run([sys.executable, "-c", PROBE, str(secret), str(writable), str(outside), str(port)],
                              capture_output=True, text=True, timeout=120, env={**os.environ,
                                                                                "OPENBLAS_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["landlock"] is None, result
    assert not result["read_secret"] and not result["wrote_outside"] and not result["connected"], result
    assert result["wrote_private"] and result["jax_works"], result
    assert not (outside / "pwned").exists()


def test_the_worker_reports_its_isolation_and_holds_no_secrets_from_the_environment(monkeypatch):
    sandbox.shutdown()
    monkeypatch.setenv("JAXRACE_LLM_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-do-not-leak-either")
    try:
        levels = sandbox.isolation()
        assert "separate process per program" in levels and "resource limits" in levels
        if isolation.landlock_abi() >= 1:
            assert any(level.startswith("Landlock ABI") for level in levels), levels
        environ = dict(v.split(b"=", 1) for v in open(f"/proc/{sandbox.worker_pid()}/environ", "rb").read()
                       .split(b"\0") if b"=" in v)
        assert not any(b"sk-do-not-leak" in v for v in environ.values()) and b"OPENAI_API_KEY" not in environ
        assert b"jaxrace-reward-sandbox-" in environ[b"HOME"] and environ[b"HOME"] == environ[b"TMPDIR"]
    finally:
        sandbox.shutdown()


KILLED_CALLER = """
import os, sys, time
import jaxrace
import jaxrace.rewards.sandbox as sandbox
sandbox.isolation()
environ = open(f"/proc/{sandbox.worker_pid()}/environ", "rb").read().split(bytes(1))
print(next(v for v in environ if v.startswith(b"HOME=")).decode()[5:], flush=True)
time.sleep(120)
"""


def test_a_killed_callers_private_directory_is_removed_when_the_next_worker_starts():
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CALLER], stdout=subprocess.PIPE, text=True)
    try:
        private = proc.stdout.readline().strip()
    finally:
        proc.kill()  # SIGKILL: no exit handler runs
        proc.wait(timeout=30)
    assert os.path.basename(private).startswith(f"{sandbox.DIR_PREFIX}{proc.pid}-") and os.path.isdir(private)
    alive = sandbox.tempfile.mkdtemp(prefix=f"{sandbox.DIR_PREFIX}{os.getpid()}-")  # a live caller's: kept
    sandbox.shutdown()
    try:
        sandbox.isolation()
        assert not os.path.exists(private)
        assert os.path.isdir(alive)
    finally:
        sandbox.shutdown()
        os.rmdir(alive)


def test_the_worker_finds_jaxrace_through_a_link_and_gets_no_relative_or_checkout_paths(monkeypatch, tmp_path):
    # The worker runs in its private directory and may read every sys.path entry: a caller
    # started with PYTHONPATH=. from a checkout must give it the package, not the checkout.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", "rel/lib", "", "/abs/x"]))
    assert sandbox.worker_pythonpath("/private/import").split(os.pathsep) == ["/private/import", "/abs/x"]
    sandbox.shutdown()
    try:
        sandbox.isolation()
        environ = dict(v.split(b"=", 1) for v in open(f"/proc/{sandbox.worker_pid()}/environ", "rb").read()
                       .split(b"\0") if b"=" in v)
        entries = environ[b"PYTHONPATH"].decode().split(os.pathsep)
        assert entries == [os.path.join(environ[b"HOME"].decode(), "import"), "/abs/x"]
        assert os.path.realpath(os.path.join(entries[0], "jaxrace")) == str(sandbox.PACKAGE_DIR)
        checkout = str(sandbox.PACKAGE_DIR.parent)
        assert not any(os.path.realpath(p) == checkout for p in entries)
    finally:
        sandbox.shutdown()


def test_a_worker_that_fails_to_start_says_why(monkeypatch, tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: planted for the test' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(sandbox.sys, "executable", str(broken))
    with pytest.raises(RuntimeError, match="did not start: ModuleNotFoundError: planted for the test"):
        sandbox._Worker()
