"""The caller's side of the reward sandbox: one worker process, started on first use.

`build_many(sources)` sends programs to the worker (`jaxrace.rewards.worker`), which
builds each in a fresh forked child with time, CPU, memory and file-size limits (one
child per CPU core at a time), and returns each exported artifact's bytes or the
`RewardCompileError` it failed with; `build_in_sandbox(source)` is the one-program case.
This process never executes the source.

The worker starts with a minimal environment (no API keys, no proxies; `HOME` and
`TMPDIR` point at its private directory) and confines itself as strongly as the kernel
allows; `isolation()` says how, and a warning names anything it could not do. Host-side
Python: no JAX runs here.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MEMORY_GIB = 6.0
STARTUP_TIMEOUT_S = 120.0
REPLY_MARGIN_S = 15.0  # the worker enforces the time limit; this only catches a worker that hangs
PARALLEL = max(1, os.cpu_count() or 1)  # builds at once (each a child with its own memory limit)
_ENV_KEPT = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT")
DIR_PREFIX = "jaxrace-reward-sandbox-"  # then the caller's pid, "-" and mkdtemp's random letters


def remove_stale_dirs() -> list[Path]:
    """Remove the private directories of workers whose caller has died; returns them.

    A caller killed with SIGKILL never runs its exit handler, and the confined worker
    cannot remove its own directory (it may write only inside it), so the next worker
    to start tidies up: this user's directories whose caller's pid no longer runs.
    """
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*-*"):
        pid = path.name[len(DIR_PREFIX):].split("-", 1)[0]
        try:
            if not pid.isdigit() or path.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:  # alive under another user, or gone meanwhile
            continue
    return removed


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # this jaxrace package
# The worker's settings (beside PATH, locale, HOME, TMPDIR and PYTHONPATH): one XLA thread, one
# BLAS thread and two malloc arenas. Programs run on a few transitions, the server must stay
# single-threaded to fork, and a small address-space footprint keeps the memory limit
# meaningful on many-core machines.
WORKER_ENV = dict(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
                  MALLOC_ARENA_MAX="2", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")


def worker_pythonpath(link_dir: str | Path) -> str:
    """The worker's PYTHONPATH: `link_dir` (a folder holding only a link to this jaxrace
    package), then the caller's absolute PYTHONPATH entries.

    The worker runs in its private directory, where `.` or any relative entry names
    nothing, so those are left out; and the worker may read every `sys.path` entry, so
    the checkout around a jaxrace that is not installed (`PYTHONPATH=.` from a clone) is
    not put there: the link gives the package alone.
    """
    entries = [str(link_dir)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    return os.pathsep.join(dict.fromkeys(entries))


class _Worker:
    def __init__(self):
        remove_stale_dirs()
        self.dir = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")
        self.stderr = tempfile.TemporaryFile()
        env = {k: os.environ[k] for k in _ENV_KEPT if k in os.environ}
        links = Path(self.dir, "import")
        links.mkdir()
        (links / "jaxrace").symlink_to(PACKAGE_DIR, target_is_directory=True)
        env["PYTHONPATH"] = worker_pythonpath(links)
        env.update(HOME=self.dir, TMPDIR=self.dir, **WORKER_ENV)
        self.proc = subprocess.Popen([sys.executable, "-m", "jaxrace.rewards.worker", self.dir, str(PARALLEL)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env,
                                     cwd=self.dir, close_fds=True)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.buffer = b""
        ready = self.read(time.monotonic() + STARTUP_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            self.proc.kill()
            self.proc.wait()
            why = self.stderr_tail() or f"exit code {self.proc.returncode}, nothing on stderr"
            self.close()
            raise RuntimeError(f"the reward sandbox did not start: {why}")
        self.isolation = tuple(ready["isolation"])
        for warning in ready["warnings"]:
            warnings.warn(f"reward sandbox: {warning}", RuntimeWarning, stacklevel=4)

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-800:]

    def read(self, deadline: float) -> dict | None:
        """The next message, or None on timeout or exit."""
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.selector.select(timeout=remaining):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.selector.close()
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_worker: _Worker | None = None
_lock = threading.Lock()


def shutdown() -> None:
    """Stop the worker (the next build starts a new one)."""
    global _worker
    if _worker is not None:
        _worker.close()
        _worker = None


atexit.register(shutdown)


def _started() -> _Worker:
    global _worker
    if _worker is not None and _worker.proc.poll() is not None:
        shutdown()
    if _worker is None:
        _worker = _Worker()
    return _worker


def isolation() -> tuple[str, ...]:
    """How the worker is confined on this machine (starts it if needed)."""
    with _lock:
        return _started().isolation


def worker_pid() -> int:
    """The worker's process id (starts it if needed)."""
    with _lock:
        return _started().proc.pid


def build_many(sources: list[str], *, limits: dict | None = None, timeout_s: float | None = None,
               memory_gib: float | None = None) -> list:
    """Build every program in the sandbox worker, up to `PARALLEL` at once.

    Args:
        sources: the reward programs.
        limits: fields of `jaxrace.rewards.build.Limits` to override.
        timeout_s: wall-clock and CPU-time limit per program (default 20 s).
        memory_gib: address-space limit of each child that builds one (default 6 GiB).

    Returns:
        One entry per source, in order: the artifact's bytes (`RewardArtifact.from_bytes`
        reads them), or the `RewardCompileError` it failed with (a failed stage, time
        out, or crash). One program's failure never affects another's result.
    """
    from jaxrace.rewards.errors import RewardCompileError

    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    memory_gib = DEFAULT_MEMORY_GIB if memory_gib is None else float(memory_gib)
    results: dict[int, object] = {}
    with _lock:
        worker = _started()
        try:
            for i, source in enumerate(sources):
                request = {"id": i, "source": source, "limits": limits or {}, "timeout_s": timeout_s,
                           "memory_bytes": int(memory_gib * (1 << 30))}
                worker.proc.stdin.write(json.dumps(request).encode() + b"\n")
            worker.proc.stdin.flush()
        except BrokenPipeError:
            shutdown()
            failed = RewardCompileError("execute", "the sandbox worker died before the programs were sent")
            return [failed] * len(sources)
        # Builds run PARALLEL at a time, each within timeout_s; the margin only catches a hung worker.
        rounds = -(-len(sources) // PARALLEL)
        deadline = time.monotonic() + rounds * timeout_s + REPLY_MARGIN_S
        while len(results) < len(sources):
            message = worker.read(deadline)
            if message is None or "fatal" in message:
                detail = message["fatal"] if message else f"no reply ({worker.stderr_tail()[-300:]})"
                shutdown()
                failed = RewardCompileError("execute", f"the sandbox worker failed: {detail}")
                return [results.get(i, failed) for i in range(len(sources))]
            if "error" in message:
                e = message["error"]
                results[message["id"]] = RewardCompileError(e["stage"] or "execute", e["message"], e.get("lineno"))
            else:
                results[message["id"]] = base64.b64decode(message["artifact"])
    return [results[i] for i in range(len(sources))]


def build_in_sandbox(source: str, *, limits: dict | None = None, timeout_s: float | None = None,
                     memory_gib: float | None = None) -> bytes:
    """Build one program in the sandbox worker (see `build_many`); raises its `RewardCompileError`."""
    from jaxrace.rewards.errors import RewardCompileError

    result = build_many([source], limits=limits, timeout_s=timeout_s, memory_gib=memory_gib)[0]
    if isinstance(result, RewardCompileError):
        raise result
    return result
