"""The curated namespace a reward program runs in (inside the sandbox worker only).

Every callable a program can reach is a plain Python wrapper made here, so the
attributes JAX's own objects carry (`.lower`, `.trace`, `.defjvp`, `.fun`,
`.clear_cache`, ...) do not exist for a program; dtypes are small `ScalarType` objects,
not JAX's scalar classes; modules are `Module` namespaces of wrappers. Every name is
on an allow-list below: what is not listed does not exist for the program. The policy
stage (`jaxrace.rewards.policy`) then allows attribute access only to these members,
`RaceView`/`Action` fields and a short list of array methods.
"""

from __future__ import annotations

import builtins
import math
import types

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.rewards.api import NO_GAP, Action, RaceView

JNP_FUNCTIONS = (
    "abs", "absolute", "add", "all", "amax", "amin", "any", "arccos", "arccosh", "arcsin", "arcsinh", "arctan",
    "arctan2", "arctanh", "argmax", "argmin", "arange", "array", "asarray", "average", "bitwise_and", "bitwise_not",
    "bitwise_or", "bitwise_xor", "cbrt", "ceil", "clip", "concatenate", "copysign", "cos", "cosh", "count_nonzero",
    "cross", "cumprod", "cumsum", "deg2rad", "degrees", "diff", "divide", "dot", "equal", "exp", "exp2",
    "expand_dims", "expm1", "fabs", "float_power", "floor", "floor_divide", "fmax", "fmin", "fmod", "full",
    "full_like", "greater", "greater_equal", "heaviside", "hypot", "inner", "interp", "invert", "isclose",
    "isfinite", "isinf", "isnan", "less", "less_equal", "linspace", "log", "log10", "log1p", "log2", "logaddexp",
    "logical_and", "logical_not", "logical_or", "logical_xor", "matmul", "max", "maximum", "mean", "median", "min",
    "minimum", "mod", "multiply", "nan_to_num", "negative", "not_equal", "ones", "ones_like", "outer", "polyval",
    "positive", "power", "prod", "rad2deg", "radians", "ravel", "reciprocal", "remainder", "reshape", "rint",
    "round", "select", "sign", "signbit", "sin", "sinc", "sinh", "sort", "sqrt", "square", "squeeze", "stack", "std",
    "subtract", "sum", "take", "tan", "tanh", "true_divide", "trunc", "var", "where", "zeros", "zeros_like",
)
JNP_CONSTANTS = {"pi": math.pi, "e": math.e, "inf": math.inf, "nan": math.nan, "euler_gamma": float(np.euler_gamma)}
DTYPES = ("float32", "float16", "bfloat16", "int32", "int16", "int8", "uint8", "uint32", "bool_")
LINALG_FUNCTIONS = ("norm",)
NN_FUNCTIONS = (
    "relu", "relu6", "sigmoid", "softplus", "soft_sign", "silu", "swish", "gelu", "elu", "selu", "celu",
    "leaky_relu", "hard_tanh", "hard_sigmoid", "log_sigmoid", "softmax", "log_softmax", "logsumexp", "one_hot",
)
# Elementwise maths and bounded control flow. No loops (fori_loop, scan, while_loop: a
# bound of 10**12 would run for ever), no collectives, no callbacks, no RNG.
LAX_FUNCTIONS = (
    "abs", "acos", "acosh", "add", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "clamp", "cond",
    "cos", "cosh", "div", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "integer_pow", "is_finite",
    "lgamma", "log", "log1p", "logistic", "max", "min", "mul", "neg", "pow", "reciprocal", "rem", "round", "rsqrt",
    "select", "sign", "sin", "sinh", "sqrt", "square", "stop_gradient", "sub", "switch", "tan", "tanh",
)
MATH_FUNCTIONS = (
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "copysign", "cos", "cosh", "degrees", "erf",
    "erfc", "exp", "expm1", "fabs", "floor", "fmod", "hypot", "isclose", "isfinite", "isinf", "isnan", "log",
    "log10", "log1p", "log2", "pow", "radians", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
)
MATH_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf, "nan": math.nan}
# No str/repr/format (a traced value's text tells validation from training), no set
# (its order changes with the hash seed), no type/getattr/isinstance (reflection).
BUILTINS = (
    "abs", "all", "any", "bool", "dict", "enumerate", "filter", "float", "int", "len", "list", "map", "max", "min",
    "pow", "range", "reversed", "round", "sorted", "sum", "tuple", "zip",
)
_MATH_TO_JNP = {"fabs": "abs", "acos": "arccos", "asin": "arcsin", "atan": "arctan", "atan2": "arctan2",
                "acosh": "arccosh", "asinh": "arcsinh", "atanh": "arctanh", "pow": "power", "isclose": "isclose"}


class Module(types.SimpleNamespace):
    """A namespace of wrappers that stands in for a module (`jnp`, `jax.lax`, `math`, ...)."""


class ScalarType:
    """`jnp.float32` and friends: callable as a converter, usable as a dtype (it has `.dtype`)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)

    def __call__(self, value):
        return jnp.asarray(value, self.dtype)

    def __repr__(self):
        return f"jnp.{self.dtype.name}"


def _wrap(name: str, fn):
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def _python_number_only(name: str, fn):
    jnp_name = _MATH_TO_JNP.get(name, name)

    def wrapper(*args):
        if any(isinstance(a, jax.Array) for a in args):
            raise TypeError(f"math.{name} works on Python numbers only; for arrays use jnp.{jnp_name}")
        return fn(*args)

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def _grad(fun, argnums=0):
    return _wrap("grad_of_" + getattr(fun, "__name__", "f"), jax.grad(fun, argnums=argnums))


def _vmap(fun, in_axes=0, out_axes=0):
    return _wrap("vmap_of_" + getattr(fun, "__name__", "f"), jax.vmap(fun, in_axes=in_axes, out_axes=out_axes))


def _module(source, names, **extra) -> Module:
    return Module(**{n: _wrap(n, getattr(source, n)) for n in names}, **extra)


def program_namespace() -> dict:
    """A fresh globals dict for executing one reward program."""
    jnp_module = _module(jnp, JNP_FUNCTIONS, **JNP_CONSTANTS, **{d: ScalarType(getattr(jnp, d)) for d in DTYPES},
                         linalg=_module(jnp.linalg, LINALG_FUNCTIONS))
    lax_module = _module(jax.lax, LAX_FUNCTIONS)
    jax_module = Module(numpy=jnp_module, lax=lax_module, nn=_module(jax.nn, NN_FUNCTIONS),
                        grad=_wrap("grad", _grad), vmap=_wrap("vmap", _vmap))
    math_module = Module(**{n: _python_number_only(n, getattr(math, n)) for n in MATH_FUNCTIONS}, **MATH_CONSTANTS)
    return {
        "__builtins__": {n: getattr(builtins, n) for n in BUILTINS},
        "__name__": "reward_program",
        "jnp": jnp_module,
        "jax": jax_module,
        "lax": lax_module,
        "math": math_module,
        "RaceView": RaceView,
        "Action": Action,
        "NO_GAP": NO_GAP,
    }


def available_names() -> frozenset[str]:
    """Every global name a program may read without defining it."""
    ns = program_namespace()
    return (frozenset(ns) | frozenset(ns["__builtins__"])) - {"__builtins__", "__name__"}
