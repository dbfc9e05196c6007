"""JAX's persistent compilation cache for the loop: a rerun (or a resumed run) skips XLA compiles.

The cache lives in `$JAXRACE_CACHE_DIR` (default `$XDG_CACHE_HOME/jaxrace/xla`, or
`~/.cache/jaxrace/xla`); `JAXRACE_CACHE_DIR=off` turns it off.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax


def cache_dir() -> Path | None:
    configured = os.environ.get("JAXRACE_CACHE_DIR")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxrace" / "xla"


def enable_compile_cache() -> Path | None:
    """Points JAX's persistent cache at `cache_dir()` (compiles over a second are kept); returns it."""
    path = cache_dir()
    if path is None:
        return None
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
