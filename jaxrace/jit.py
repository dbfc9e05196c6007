"""`jit`: `jax.jit` with the compile options jaxrace's programs use on a CPU.

On a CPU much of a short job's time is XLA:CPU compiling, and two of its options cut that
by about a third for jaxrace's programs without making them run slower: its older fusion
emitters, which emit the same fusions faster than the MLIR ones, and LLVM optimisation level 1
instead of 2 (`experiments/bench_cpu_compile_options.py`; the README's reward-design section).
They are per-program compile options, not `XLA_FLAGS`, so they touch no program but
jaxrace's and need nothing set before JAX starts.

They apply where JAX's default backend is a CPU and this XLA still knows both (checked
once; an XLA that does not would refuse the compile, so then a warning says so); elsewhere, and with
`JAXRACE_XLA_DEFAULTS=1`, programs compile with XLA's defaults. The options are part of
the persistent compilation cache's key, so a cache filled either way is not reused the other.
Programs that render, and calls inside another trace (a user's `jit`), compile without them (`jit`).
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

import jax
import jax.numpy as jnp

CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}
DEFAULTS_ENV = "JAXRACE_XLA_DEFAULTS"


@functools.cache
def compiler_options() -> dict | None:
    """`CPU_COMPILER_OPTIONS` where they apply (see the module's docstring), else None (XLA's defaults)."""
    if os.environ.get(DEFAULTS_ENV, "").strip().lower() not in ("", "0", "false", "no", "off") \
            or jax.default_backend() != "cpu":
        return None
    try:
        jax.jit(jnp.negative, compiler_options=CPU_COMPILER_OPTIONS).lower(jnp.float32(0)).compile()
    except jax.errors.JaxRuntimeError as e:
        if "No such compile option" not in str(e):
            raise
        warnings.warn(f"this XLA does not know one of jaxrace's CPU compile options {CPU_COMPILER_OPTIONS} "
                      f"({e}); jaxrace's programs compile with XLA's defaults (slower to compile)", stacklevel=2)
        return None
    return dict(CPU_COMPILER_OPTIONS)


class _Jitted:
    """`jax.jit`s of `fun` made at their first use, when the backend (and so the options) is known: one
    with `compiler_options()`, and one without for calls whose program renders and for calls inside
    another trace (JAX takes compile options on top-level programs only; the caller's program has its own).

    Calls, `lower` and `trace` go to the one for their arguments; `_cache_size` and `clear_cache` to
    both; other attributes (`eval_shape`, ...) to the one with the options (without, for a program
    that always renders).
    """

    def __init__(self, fun, renders, jit_kwargs: dict):
        functools.update_wrapper(self, fun)
        self._fun, self._renders, self._jit_kwargs = fun, renders, jit_kwargs
        self._programs, self._lock = {}, threading.Lock()

    def _program(self, plain: bool):
        jitted = self._programs.get(plain)
        if jitted is None:
            with self._lock:
                if plain not in self._programs:
                    options = None if plain else compiler_options()
                    self._programs[plain] = jax.jit(self._fun, compiler_options=options, **self._jit_kwargs)
                jitted = self._programs[plain]
        return jitted

    def _apply(self, method: str, args, kwargs):
        renders = self._renders(*args, **kwargs) if callable(self._renders) else self._renders
        plain = bool(renders) or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs)))
        try:
            return getattr(self._program(plain), method)(*args, **kwargs)
        except ValueError as e:  # nested in a trace whose arguments reached none of ours (constants only)
            if plain or "can only be passed to top-level" not in str(e):
                raise
            return getattr(self._program(True), method)(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._apply("__call__", args, kwargs)

    def lower(self, *args, **kwargs):
        return self._apply("lower", args, kwargs)

    def trace(self, *args, **kwargs):
        return self._apply("trace", args, kwargs)

    def _cache_size(self) -> int:
        return sum(p._cache_size() for p in self._programs.values())

    def clear_cache(self) -> None:
        for p in self._programs.values():
            p.clear_cache()

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_fun", "_renders", "_jit_kwargs", "_programs", "_lock"):
            raise AttributeError(name)
        return getattr(self._program(self._renders is True), name)


def jit(fun=None, /, *, renders=False, **jit_kwargs):
    """`jax.jit(fun, **jit_kwargs)` compiled with `compiler_options()`; also a decorator
    (`@jit`, or `functools.partial(jit, static_argnums=...)`).

    renders: True where the program renders, or a function of a call's arguments that says whether
    that call's does (an env made with `pixels=True`): those compile with XLA's defaults. XLA:CPU
    ran the renderer 2.2x slower with both options (either one alone did not), and compiled it no faster.
    """
    if fun is None:
        return functools.partial(jit, renders=renders, **jit_kwargs)
    return _Jitted(fun, renders, jit_kwargs)
