"""The reward sandbox worker: a fork server that builds each program in a fresh child.

Started by `jaxrace.rewards.sandbox` as `python -m jaxrace.rewards.worker DIR N` with a
minimal environment. It confines itself (network namespace, then Landlock with `DIR`
as the only writable place; see `jaxrace.rewards.isolation`), imports JAX without
starting its runtime (so it stays single-threaded and can fork safely), and answers one
JSON request per line on stdin:

    {"id": int, "source": str, "limits": {...}, "timeout_s": float, "memory_bytes": int}

For each it forks a child (at most N at once) that sets its resource limits, builds the
artifact (`jaxrace.rewards.build.build_artifact`) and exits. A program can therefore
never see or change what another program left behind. The server replies on stdout,
in the order builds finish:

    {"id", "artifact": base64} | {"id", "error": {"stage", "message", "lineno"}}

and reports a child killed by a signal, or still running after `timeout_s`, as an
error of the stage it had reached. Host-side Python; no JAX runs in the server itself.
"""

from __future__ import annotations

import base64
import collections
import gc
import json
import math
import os
import selectors
import signal
import sys
import time

FILE_BYTES = 64 << 20


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def _child(request: dict, out_fd: int, workdir: str) -> None:
    """In the forked child: limits, then build; writes JSON lines to `out_fd`. Never returns."""
    code = 0
    try:
        from jaxrace.rewards.isolation import apply_resource_limits

        os.chdir(workdir)
        apply_resource_limits(int(request["memory_bytes"]), max(1, math.ceil(request["timeout_s"])), FILE_BYTES)
        out = os.fdopen(out_fd, "w", buffering=1)

        def send(message):
            out.write(json.dumps(message) + "\n")
            out.flush()

        from jaxrace.rewards.build import Limits, build_artifact
        from jaxrace.rewards.errors import RewardCompileError

        try:
            artifact = build_artifact(request["source"], Limits(**request.get("limits", {})),
                                      report=lambda stage: send({"stage": stage}))
            send({"artifact": base64.b64encode(artifact.to_bytes()).decode()})
        except RewardCompileError as e:
            send({"error": e.to_dict()})
        except MemoryError:
            send({"error": {"stage": "", "message": "ran out of memory: a reward works on scalars and must not "
                            "allocate large arrays", "lineno": None}})
        except BaseException as e:  # noqa: BLE001 (a report, whatever the program did)
            send({"error": {"stage": "", "message": f"{type(e).__name__}: {e}"[:400], "lineno": None}})
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        os._exit(code)


class _Child:
    """One forked build: its pipe, deadline, the stage it reached and its reply."""

    def __init__(self, request: dict, workdir: str):
        self.request = request
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_fd)
            _child(request, write_fd, workdir)
        os.close(write_fd)
        self.fd = read_fd
        self.deadline = time.monotonic() + float(request["timeout_s"])
        self.stage, self.reply, self.buffer = "parse", None, b""

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            message = json.loads(line)
            if "stage" in message and len(message) == 1:
                self.stage = message["stage"]
            else:
                self.reply = message

    def finish(self, timed_out: bool) -> dict:
        """Reap the child; its reply, or what happened to it."""
        os.close(self.fd)
        if timed_out:
            os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        reply = self.reply if self.reply is not None else {"error": {"stage": self.stage, "lineno": None,
                                                                      "message": self._death(status, timed_out)}}
        if "error" in reply and not reply["error"].get("stage"):
            reply["error"]["stage"] = self.stage
        return {**reply, "id": self.request.get("id")}

    def _death(self, status: int, timed_out: bool) -> str:
        request = self.request
        if timed_out:
            return (f"timed out after {request['timeout_s']:g} s (an unbounded loop, a huge computation or deep "
                    "recursion?); a reward must be quick to trace")
        if not os.WIFSIGNALED(status):
            return f"the sandbox process exited with code {os.WEXITSTATUS(status)} without a result"
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        why = {"SIGXCPU": f"used more than {math.ceil(request['timeout_s'])} s of CPU time",
               "SIGKILL": "was killed (out of memory or CPU time?)",
               "SIGSEGV": "crashed (a segmentation fault)",
               "SIGABRT": "aborted (most likely out of its "
                          f"{request['memory_bytes'] / (1 << 30):g} GiB of memory)"}.get(name, "crashed")
        return f"the program {why}: the sandbox process was killed by {name}; a reward works on scalars"


def _serve_requests(workdir: str, max_children: int, send) -> None:
    """Requests from stdin, each built in its own child, at most `max_children` at once.

    Replies carry the request's "id" and come in the order builds finish. When stdin
    closes, running builds are killed and the server returns.
    """
    stdin_fd = sys.stdin.fileno()
    selector = selectors.DefaultSelector()
    selector.register(stdin_fd, selectors.EVENT_READ)
    queue, running, pending = collections.deque(), {}, b""
    while True:
        while queue and len(running) < max_children:
            if _threads() != 1:
                send({"fatal": "the sandbox worker has started threads and can no longer fork safely"})
                return
            child = _Child(queue.popleft(), workdir)
            running[child.fd] = child
            selector.register(child.fd, selectors.EVENT_READ)
        timeout = max(0.0, min(c.deadline for c in running.values()) - time.monotonic()) if running else None
        for key, _ in selector.select(timeout):
            if key.fd == stdin_fd:
                chunk = os.read(stdin_fd, 1 << 20)
                if not chunk:  # the caller is gone: stop everything
                    for child in running.values():
                        child.finish(timed_out=True)
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    queue.append(json.loads(line))
                continue
            child = running[key.fd]
            chunk = os.read(key.fd, 1 << 16)
            if chunk:
                child.feed(chunk)
            else:
                selector.unregister(key.fd)
                send(running.pop(key.fd).finish(timed_out=False))
        now = time.monotonic()
        for fd in [fd for fd, c in running.items() if c.deadline <= now]:
            selector.unregister(fd)
            send(running.pop(fd).finish(timed_out=True))


def serve(workdir: str, max_children: int = 1) -> None:
    """Isolate, import JAX (tracing only), report readiness and isolation, then serve requests."""
    from jaxrace.rewards import isolation

    warnings, levels = [], ["separate process per program", "resource limits"]
    why = isolation.apply_network_namespace()
    if why is None:
        levels.append("network namespace")
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed to stdout cannot corrupt the replies

    def send(message):
        reply.write(json.dumps(message) + "\n")
        reply.flush()

    from jaxrace.rewards.build import warm_up

    warm_up()  # imports everything before Landlock and warms JAX's tracing caches; starts no threads
    abi, landlock_why = isolation.apply_landlock(workdir)
    if landlock_why is None:
        levels.append(f"Landlock ABI {abi} (read-only system files, write only {workdir}"
                      + (", no TCP" if abi >= 4 else "") + (", no signals or abstract sockets out" if abi >= 6 else "")
                      + ")")
    else:
        warnings.append(f"no filesystem sandbox: {landlock_why}; reward programs can read the user's files "
                        "(they still cannot import, open files or call the host: the policy forbids it)")
    if why is not None and not (landlock_why is None and abi >= 4):
        warnings.append(f"no network isolation: {why}")
    send({"ready": True, "isolation": levels, "warnings": warnings, "threads": _threads()})
    # Every object alive now (JAX's modules and tracing caches) moves to the collector's permanent
    # generation: the forked children's collections no longer walk it (a build ~12% faster,
    # experiments/bench_build_stages.py) nor touch its pages (copy-on-write stays shared).
    gc.freeze()
    _serve_requests(workdir, max_children, send)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
