"""The curated namespace a reward program runs in: `jnp`, a subset of `jax`, `math`.

Every name a program can reach is listed here; nothing in it touches the host (files,
clock, randomness, callbacks). The compiler's policy stage rejects everything else
before any code runs, and this namespace is the second line: what is not here does not
exist for the program.
"""

from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp

from jaxrace.rewards.api import NO_GAP, Action, RaceView

# jax.numpy functions that read or write files or reach the host.
_JNP_EXCLUDED = frozenset({
    "load", "save", "savez", "fromfile", "frombuffer", "from_dlpack", "fromiter", "fromfunction",
    "genfromtxt", "loadtxt", "set_printoptions", "get_printoptions", "printoptions", "show_config",
    "fft",
})
# jax.lax: elementwise maths, bounded control flow and shape utilities. No while_loop
# (unbounded), no collectives, no callbacks, no RNG.
_LAX_ALLOWED = (
    "abs", "acos", "acosh", "add", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "clamp", "cond",
    "cos", "cosh", "cummax", "cummin", "cumprod", "cumsum", "div", "erf", "erf_inv", "erfc", "exp", "exp2",
    "expm1", "floor", "fori_loop", "integer_pow", "is_finite", "lgamma", "log", "log1p", "logistic", "max",
    "min", "mul", "neg", "pow", "reciprocal", "rem", "round", "rsqrt", "scan", "select", "sign", "sin", "sinh",
    "sqrt", "square", "stop_gradient", "sub", "switch", "tan", "tanh",
)
_BUILTINS = (
    "abs", "all", "any", "bool", "dict", "enumerate", "filter", "float", "int", "isinstance", "len", "list",
    "map", "max", "min", "pow", "range", "reversed", "round", "sorted", "str", "sum", "tuple", "zip",
)


def _public(module, allowed=None, excluded=frozenset()) -> types.SimpleNamespace:
    names = allowed if allowed is not None else [n for n in dir(module) if not n.startswith("_")]
    return types.SimpleNamespace(**{
        n: getattr(module, n) for n in names
        if n not in excluded and not isinstance(getattr(module, n), types.ModuleType)
    })


def program_namespace() -> dict:
    """A fresh globals dict for executing one reward program."""
    import builtins

    jnp_ns = _public(jnp, excluded=_JNP_EXCLUDED)
    jnp_ns.linalg = _public(jnp.linalg, allowed=("norm",))
    lax_ns = _public(jax.lax, allowed=_LAX_ALLOWED)
    jax_ns = types.SimpleNamespace(
        numpy=jnp_ns, lax=lax_ns, nn=_public(jax.nn, excluded=frozenset({"initializers"})), Array=jax.Array,
        grad=jax.grad, vmap=jax.vmap,
    )
    return {
        "__builtins__": {n: getattr(builtins, n) for n in _BUILTINS},
        "__name__": "reward_program",
        "jnp": jnp_ns,
        "jax": jax_ns,
        "lax": lax_ns,
        "math": _public(math),
        "RaceView": RaceView,
        "Action": Action,
        "NO_GAP": NO_GAP,
    }


def available_names() -> frozenset[str]:
    """Every global name a program may read without defining it."""
    ns = program_namespace()
    return (frozenset(ns) | frozenset(ns["__builtins__"])) - {"__builtins__", "__name__"}
