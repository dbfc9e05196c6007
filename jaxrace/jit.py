"""`jit`: `jax.jit` with the compile options jaxrace's programs use on a CPU.

On a CPU much of a short job's time is XLA:CPU compiling, and two of its options cut that
by about a third for jaxrace's programs without making them run slower: its older fusion
emitters, which emit the same fusions faster than the MLIR ones, and LLVM optimisation level 1
instead of 2 (`experiments/bench_cpu_compile_options.py`; the README's reward-design section).
A third keeps XLA:CPU's own code for what it would hand to the YNNPACK library (dots, and
fusions of elementwise ops and reductions: `xla_cpu_experimental_ynn_fusion_type` empty). On
the trainer's updates YNNPACK's elementwise and reduction fusions, such as the quantile Huber
loss's gradient over [batch, 32, 32], ran several times slower than XLA's loops: without them a
training epoch of the `standard` preset took 40% less time and compiled 13% faster
(`experiments/bench_cpu_library_fusions.py`).
They are per-program compile options, not `XLA_FLAGS`, so they touch no program but
jaxrace's and need nothing set before JAX starts.

They apply where JAX's default backend is a CPU; an option this XLA does not know is left out,
with a warning (XLA would refuse the compile), and the others apply. With
`JAXRACE_XLA_DEFAULTS=1`, and on other backends, programs compile with XLA's defaults. The
options are part of the persistent compilation cache's key, so a cache filled either way is not
reused the other. Programs that render take only the last one (`render_compiler_options`), and calls
inside another trace (a user's `jit`) none (`jit`).
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

import jax
import jax.numpy as jnp

CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1,
                        "xla_cpu_experimental_ynn_fusion_type": ""}
DEFAULTS_ENV = "JAXRACE_XLA_DEFAULTS"


def _xla_knows(options: dict) -> bool:
    """Whether XLA compiles a program with these options (it refuses an unknown one, or a value it cannot
    read)."""
    try:
        jax.jit(jnp.negative, compiler_options=options).lower(jnp.float32(0)).compile()
    except jax.errors.JaxRuntimeError as e:
        if "No such compile option" not in str(e) and "While setting option" not in str(e):
            raise
        return False
    return True


@functools.cache
def compiler_options() -> dict | None:
    """The `CPU_COMPILER_OPTIONS` this XLA knows, where they apply (see the module's docstring), else
    None (XLA's defaults)."""
    if os.environ.get(DEFAULTS_ENV, "").strip().lower() not in ("", "0", "false", "no", "off") \
            or jax.default_backend() != "cpu":
        return None
    if _xla_knows(CPU_COMPILER_OPTIONS):  # one compile in the usual case
        return dict(CPU_COMPILER_OPTIONS)
    known = {name: value for name, value in CPU_COMPILER_OPTIONS.items() if _xla_knows({name: value})}
    unknown = sorted(set(CPU_COMPILER_OPTIONS) - set(known))
    warnings.warn(f"this XLA does not know jaxrace's CPU compile option(s) {', '.join(unknown)}; "
                  f"jaxrace's programs compile without them"
                  + (f" (with {known})" if known else " (XLA's defaults)"), stacklevel=2)
    return known or None


RENDER_OPTIONS = ("xla_cpu_experimental_ynn_fusion_type",)  # the options a program that renders takes too


def render_compiler_options() -> dict | None:
    """Of `compiler_options()`, those for a program that renders (`RENDER_OPTIONS`), else None.

    The older emitters with LLVM level 1 ran the clip renderer 2.2x slower, so it compiles without
    them. Without YNNPACK it renders as fast (a race's frames in 1.00 s against 0.96 s, within
    noise: `experiments/bench_cpu_library_fusions.py --tag render`), and a pixel actor's training
    job holds the critics' quantile Huber gradient, which YNNPACK's fusions made several times slower.
    """
    options = {k: v for k, v in (compiler_options() or {}).items() if k in RENDER_OPTIONS}
    return options or None


class _Jitted:
    """`jax.jit`s of `fun` made at their first use, when the backend (and so the options) is known: one
    with `compiler_options()` ("cpu"), one with `render_compiler_options()` for calls whose program
    renders ("renders"), and one without options for calls inside another trace ("nested": JAX takes
    compile options on top-level programs only; the caller's program has its own).

    Calls, `lower` and `trace` go to the one for their arguments; `_cache_size` and `clear_cache` to
    all; other attributes (`eval_shape`, ...) to the one with the options (the renderer's, for a
    program that always renders).
    """

    def __init__(self, fun, renders, jit_kwargs: dict):
        functools.update_wrapper(self, fun)
        self._fun, self._renders, self._jit_kwargs = fun, renders, jit_kwargs
        self._programs, self._lock = {}, threading.Lock()

    def _program(self, kind: str):
        jitted = self._programs.get(kind)
        if jitted is None:
            with self._lock:
                if kind not in self._programs:
                    options = {"cpu": compiler_options, "renders": render_compiler_options,
                               "nested": lambda: None}[kind]()
                    self._programs[kind] = jax.jit(self._fun, compiler_options=options, **self._jit_kwargs)
                jitted = self._programs[kind]
        return jitted

    def _apply(self, method: str, args, kwargs):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
            kind = "nested"
        else:
            renders = self._renders(*args, **kwargs) if callable(self._renders) else self._renders
            kind = "renders" if renders else "cpu"
        try:
            return getattr(self._program(kind), method)(*args, **kwargs)
        except ValueError as e:  # nested in a trace whose arguments reached none of ours (constants only)
            if kind == "nested" or "can only be passed to top-level" not in str(e):
                raise
            return getattr(self._program("nested"), method)(*args, **kwargs)

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
        return getattr(self._program("renders" if self._renders is True else "cpu"), name)


def jit(fun=None, /, *, renders=False, **jit_kwargs):
    """`jax.jit(fun, **jit_kwargs)` compiled with `compiler_options()`; also a decorator
    (`@jit`, or `functools.partial(jit, static_argnums=...)`).

    renders: True where the program renders, or a function of a call's arguments that says whether
    that call's does (an env made with `pixels=True`): those compile with `render_compiler_options()`
    only. XLA:CPU ran the renderer 2.2x slower with the older emitters and LLVM level 1 together
    (either one alone did not), and compiled it no faster.
    """
    if fun is None:
        return functools.partial(jit, renders=renders, **jit_kwargs)
    return _Jitted(fun, renders, jit_kwargs)
