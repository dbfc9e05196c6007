"""Compilation in the loop: JAX's persistent cache, and a clock of the time spent compiling.

A rerun (or a resumed run) skips XLA compiles through the persistent cache. It lives in
`$JAXRACE_CACHE_DIR` (default `$XDG_CACHE_HOME/jaxrace/xla`, or `~/.cache/jaxrace/xla`),
and the reward artifacts the sandbox built in `rewards/` beside it;
`JAXRACE_CACHE_DIR=off` turns both off.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import jax
from jax import monitoring

# Tracing to a jaxpr, lowering to MLIR, and the backend's compile (or persistent-cache load).
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
BACKEND_COMPILE = COMPILE_EVENTS[2]


def cache_dir() -> Path | None:
    configured = os.environ.get("JAXRACE_CACHE_DIR")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxrace" / "xla"


def reward_cache_dir() -> Path | None:
    """Where the sandbox's reward artifacts are kept between runs (beside the XLA cache); None when off."""
    path = cache_dir()
    return None if path is None else path.parent / "rewards"


def enable_compile_cache() -> Path | None:
    """Points JAX's persistent cache at `cache_dir()` (every compiled program is kept); returns it.

    Small programs too: a run's host side (metrics, clips, videos) compiles some 470 of them,
    50-80 ms each on 2 cores, and loading them back makes a warm rerun of the tests' tiny loop
    quicker (`experiments/compare_commits.py --what loop`)."""
    path = cache_dir()
    if path is None:
        return None
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


class CompileClock:
    """Seconds spent compiling (trace, lower, XLA compile) while open, and the programs compiled.

    A context manager over JAX's monitoring events; `programs` lists the name of every
    jitted function that reached the backend, in order (a persistent-cache load counts).
    """

    def __init__(self):
        self.seconds = 0.0
        self.programs: list[str] = []
        self._lock = threading.Lock()

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event in COMPILE_EVENTS:
            with self._lock:
                self.seconds += duration
                if event == BACKEND_COMPILE:
                    self.programs.append(str(kwargs.get("fun_name", "?")))

    def __enter__(self) -> CompileClock:
        monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        monitoring.unregister_event_duration_listener(self._listen)
