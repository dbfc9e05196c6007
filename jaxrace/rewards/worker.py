"""The reward sandbox worker: a fork server that builds each program in a fresh child.

Started by `jaxrace.rewards.sandbox` as `python -m jaxrace.rewards.worker DIR` with a
minimal environment. It confines itself (network namespace, then Landlock with `DIR`
as the only writable place; see `jaxrace.rewards.isolation`), imports JAX without
starting its runtime (so it stays single-threaded and can fork safely), and answers one
JSON request per line on stdin:

    {"source": str, "limits": {...}, "timeout_s": float, "memory_bytes": int}

For each it forks a child that sets its resource limits, builds the artifact
(`jaxrace.rewards.build.build_artifact`) and exits. A program can therefore never see
or change what another program left behind. The server replies on stdout:

    {"artifact": base64} | {"error": {"stage", "message", "lineno"}}

and reports a child killed by a signal, or still running after `timeout_s`, as an
error of the stage it had reached. Host-side Python; no JAX runs in the server itself.
"""

from __future__ import annotations

import base64
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


def _run(request: dict, workdir: str) -> dict:
    """Fork a child for one request; collect its reply, or say how it died."""
    if _threads() != 1:
        return {"fatal": "the sandbox worker has started threads and can no longer fork safely"}
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(request, write_fd, workdir)
    os.close(write_fd)
    deadline = time.monotonic() + float(request["timeout_s"])
    stage, reply, buffer, timed_out = "parse", None, b"", False
    with selectors.DefaultSelector() as selector:
        selector.register(read_fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(timeout=remaining):
                timed_out = True
                break
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if "stage" in message and len(message) == 1:
                    stage = message["stage"]
                else:
                    reply = message
    os.close(read_fd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if reply is not None:
        if "error" in reply and not reply["error"].get("stage"):
            reply["error"]["stage"] = stage
        return reply
    if timed_out:
        return {"error": {"stage": stage, "lineno": None, "message":
                          f"timed out after {request['timeout_s']:g} s (an unbounded loop, a huge computation or "
                          "deep recursion?); a reward must be quick to trace"}}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        why = {"SIGXCPU": f"used more than {math.ceil(request['timeout_s'])} s of CPU time",
               "SIGKILL": "was killed (out of memory or CPU time?)",
               "SIGSEGV": "crashed (a segmentation fault)",
               "SIGABRT": "aborted (most likely out of its "
                          f"{request['memory_bytes'] / (1 << 30):g} GiB of memory)"}.get(name, "crashed")
        message = f"the program {why}: the sandbox process was killed by {name}; a reward works on scalars"
    else:
        message = f"the sandbox process exited with code {os.WEXITSTATUS(status)} without a result"
    return {"error": {"stage": stage, "lineno": None, "message": message}}


def serve(workdir: str) -> None:
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
    for line in sys.stdin:
        request = json.loads(line)
        result = _run(request, workdir)
        send(result)
        if "fatal" in result:
            return


if __name__ == "__main__":
    serve(sys.argv[1])
