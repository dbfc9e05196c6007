"""Stages 3-5 of the reward compiler in a subprocess with a time and a memory limit.

One worker process (started on first use, reused, restarted after a failure) runs the
program's module code, traces it and runs it jitted and vmapped on the synthetic batch.
An infinite loop, a runaway recursion in C, or a 100 GB allocation then kills or stalls
the worker, not the caller: the caller gets a `RewardCompileError` naming the stage.

Limits: wall-clock `timeout_s` per program (after the worker is up) and `memory_gib` of
address space (RLIMIT_AS; Linux enforces it, macOS does not). The worker runs JAX on the
CPU only, so it never takes a GPU from the caller.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_GIB = 6.0
STARTUP_TIMEOUT_S = 120.0


class _Worker:
    def __init__(self, memory_gib: float):
        self.memory_gib = memory_gib
        self.stderr = tempfile.TemporaryFile()
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        # One CPU thread for XLA and two malloc arenas: validation runs on 64 transitions,
        # and a small address-space footprint keeps the memory limit meaningful on
        # machines with many cores (each thread's arena reserves address space).
        env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", MALLOC_ARENA_MAX="2",
                   XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
        # The worker sets its own memory limit first thing (a preexec_fn would fork a
        # multithreaded JAX process).
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jaxrace.rewards.sandbox", str(memory_gib)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.stderr, env=env, close_fds=True)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.buffer = b""
        message, _ = self.read(time.monotonic() + STARTUP_TIMEOUT_S, "execute")
        if message is None or not message.get("ready"):
            self.close()
            raise RuntimeError(f"the reward sandbox did not start: {self.stderr_tail()}")

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-800:]

    def read(self, deadline: float, stage: str) -> tuple[dict | None, str]:
        """The next message, or None on timeout or exit; also the last stage reported."""
        while True:
            if b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if "stage" in message and len(message) == 1:
                    stage = message["stage"]
                    continue
                return message, stage
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.selector.select(timeout=remaining):
                return None, stage
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None, stage
            self.buffer += chunk

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.selector.close()
        self.stderr.close()


_worker: _Worker | None = None
_lock = threading.Lock()


def _shutdown():
    global _worker
    if _worker is not None:
        _worker.close()
        _worker = None


atexit.register(_shutdown)


def check_in_sandbox(source: str, *, timeout_s: float | None = None, memory_gib: float | None = None) -> dict:
    """Run stages 1-5 on `source` in the sandbox worker.

    Returns:
        {"components": [names], "params": {name: default}}.

    Raises:
        RewardCompileError: the program failed a stage, ran past `timeout_s`, or killed
            the worker (for example by exhausting `memory_gib`).
    """
    from jaxrace.rewards.errors import RewardCompileError

    global _worker
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    memory_gib = DEFAULT_MEMORY_GIB if memory_gib is None else memory_gib
    with _lock:
        if _worker is not None and (_worker.proc.poll() is not None or _worker.memory_gib != memory_gib):
            _shutdown()
        if _worker is None:
            _worker = _Worker(memory_gib)
        worker = _worker
        worker.proc.stdin.write(json.dumps({"source": source}).encode() + b"\n")
        worker.proc.stdin.flush()
        message, stage = worker.read(time.monotonic() + timeout_s, "execute")
        if message is None:
            alive = worker.proc.poll() is None
            _shutdown()
            if alive:
                raise RewardCompileError(stage, f"timed out after {timeout_s:g} s (an unbounded loop, a huge "
                                         "computation or deep recursion?); a reward must be quick to trace")
            raise RewardCompileError(stage, "the program crashed the sandbox process (exit code "
                                     f"{worker.proc.returncode}), most likely by exceeding the "
                                     f"{memory_gib:g} GiB memory limit; a reward works on scalars")
    if "error" in message:
        e = message["error"]
        raise RewardCompileError(e["stage"], e["message"], e.get("lineno"))
    return message


def _limit_memory(memory_gib: float) -> None:
    try:
        import resource

        limit = int(memory_gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass  # not enforceable on this platform; the time limit still holds


def _serve(memory_gib: float) -> None:
    """The worker's loop: one JSON request per line on stdin, replies on the original stdout."""
    _limit_memory(memory_gib)
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed to stdout cannot corrupt the replies

    def send(message):
        reply.write(json.dumps(message) + "\n")
        reply.flush()

    from jaxrace.rewards.compiler import execute_program, trace_and_validate
    from jaxrace.rewards.errors import RewardCompileError
    from jaxrace.rewards.policy import check_policy, parse_program
    from jaxrace.rewards.synthetic import synthetic_batch

    synthetic_batch()  # warm up JAX before reporting ready, so timeouts measure the program only
    send({"ready": True})
    for line in sys.stdin:
        source = json.loads(line)["source"]
        stage = "parse"
        try:
            info = check_policy(parse_program(source))
            stage = "execute"
            send({"stage": stage})
            fn = execute_program(source, info)
            stage = "trace"
            send({"stage": stage})
            names = trace_and_validate(source, info, fn)
            send({"components": list(names), "params": info.params})
        except RewardCompileError as e:
            send({"error": e.to_dict()})
        except BaseException as e:  # noqa: BLE001 (a report, whatever the program did)
            send({"error": {"stage": stage, "message": f"{type(e).__name__}: {e}"[:400], "lineno": None}})


if __name__ == "__main__":
    _serve(float(sys.argv[1]))
