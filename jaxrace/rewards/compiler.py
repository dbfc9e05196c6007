"""Reward programs (Python source) compiled to pure JAX functions.

`compile_reward(source)` runs five stages and raises `RewardCompileError` at the first
that fails: parse and policy here (nothing runs), then execute, trace and validate in a
sandbox subprocess with a time and a memory limit (`jaxrace.rewards.sandbox`). Only a
program the sandbox accepted is executed in this process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import traceback
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.errors import PROGRAM_FILENAME, RewardCompileError
from jaxrace.rewards.namespace import program_namespace
from jaxrace.rewards.policy import ACTION_FIELDS, ENTRY, RACEVIEW_FIELDS, ProgramInfo, check_policy, parse_program
from jaxrace.rewards.policy import suggest as _suggest

MAX_COMPONENTS = 32


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledReward:
    """A reward program compiled to a pure JAX function.

    Call as `compiled(prev, action, curr, params=None) -> (total f32[], {name: f32[]})`
    on one transition (vmap it for a batch). `params` maps PARAMS names to (traced)
    values; missing names take their defaults. Hashable by identity, so it can be
    closed over by jitted code.
    """

    name: str
    source: str
    sha256: str
    component_names: tuple[str, ...]
    params: Mapping[str, float]  # PARAMS defaults, in declaration order
    fn: Callable = dataclasses.field(repr=False)  # the program's raw `reward`
    takes_params: bool = dataclasses.field(repr=False, default=False)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(self.params)

    def default_params(self) -> dict[str, jax.Array]:
        return {k: jnp.float32(v) for k, v in self.params.items()}

    def __call__(self, prev: RaceView, action: Action, curr: RaceView, params=None):
        if params is not None:
            unknown = set(params) - set(self.params)
            if unknown:
                raise KeyError(f"reward '{self.name}' has no PARAMS {sorted(unknown)}; it declares "
                               f"{list(self.params)}")
        merged = {**self.default_params(), **{k: jnp.asarray(v, jnp.float32) for k, v in (params or {}).items()}}
        total, components = _call(self.fn, self.takes_params, prev, action, curr, merged)
        total = jnp.asarray(total).astype(jnp.float32)
        components = {k: jnp.asarray(components[k]).astype(jnp.float32) for k in self.component_names}
        return total, components


def _call(fn, takes_params, prev, action, curr, params):
    out = fn(prev, action, curr, dict(params)) if takes_params else fn(prev, action, curr)
    if not (isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[1], dict)):
        raise RewardCompileError(
            "validate", "reward must return a pair (total, components): a float32 scalar and a dict of "
            f"named float32 scalars, e.g. `return total, {{\"progress\": p}}`; got {_describe(out)}")
    return out


def _describe(out) -> str:
    if isinstance(out, tuple | list):
        return f"a {type(out).__name__} of {len(out)} ({', '.join(type(o).__name__ for o in out)})"
    shape = getattr(out, "shape", None)
    return f"an array of shape {tuple(shape)}" if shape is not None else f"a {type(out).__name__}"


# ---------------------------------------------------------------------------- execute / trace / validate


def _program_line(exc: BaseException) -> int | None:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == PROGRAM_FILENAME]
    return frames[-1].lineno if frames else None


def _explain(exc: BaseException, source_line: str) -> str:
    """A short message for an exception raised by the program, with a fix where we know one."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    line = source_line.strip()
    if isinstance(exc, jax.errors.TracerBoolConversionError | jax.errors.ConcretizationTypeError):
        if any(f"{b}(" in line and f"jnp.{b}(" not in line and f".{b}(" not in line for b in ("max", "min")):
            return (f"Python max()/min() compares traced values in `{line}`: use jnp.maximum(a, b) / "
                    "jnp.minimum(a, b)")
        if line.startswith(("if ", "elif ")) or " if " in line:
            return f"Python `if` on a traced value in `{line}`: use jnp.where(condition, a, b)"
        if any(f" {op} " in f" {line} " for op in ("and", "or", "not")):
            return f"Python and/or/not on traced values in `{line}`: use a & b, a | b, ~a (or jnp.logical_*)"
        return f"a traced value was used as a Python bool in `{line}`: use jnp.where / jnp.maximum / a & b"
    if isinstance(exc, jax.errors.TracerIntegerConversionError | jax.errors.TracerArrayConversionError):
        return f"a traced value was converted to a Python or numpy number in `{line}`: keep it a jnp array"
    if isinstance(exc, AttributeError):
        for kind, fields in (("RaceView", RACEVIEW_FIELDS), ("Action", ACTION_FIELDS)):
            if f"'{kind}' object has no attribute" in text:
                field = text.rsplit("'", 2)[-2]
                return f"{kind} has no field '{field}'{_suggest(field, fields)}"
        return text
    if isinstance(exc, KeyError):
        return f"KeyError {text}: a dict (params or components) has no such key"
    if isinstance(exc, RecursionError):
        return "recursion too deep: write the reward without recursion"
    if isinstance(exc, MemoryError) or "RESOURCE_EXHAUSTED" in text or "Out of memory" in text:
        return "ran out of memory: a reward works on scalars and must not allocate large arrays"
    return f"{type(exc).__name__}: {text}"[:400]


def _fail(stage: str, exc: BaseException, source: str) -> RewardCompileError:
    if isinstance(exc, RewardCompileError):
        return exc
    lineno = _program_line(exc)
    lines = source.splitlines()
    source_line = lines[lineno - 1] if lineno and lineno <= len(lines) else ""
    return RewardCompileError(stage, _explain(exc, source_line), lineno)


def execute_program(source: str, info: ProgramInfo) -> Callable:
    """Stage 3: run the module in a fresh curated namespace; returns its `reward`."""
    namespace = program_namespace()
    try:
        exec(compile(info.tree, PROGRAM_FILENAME, "exec"), namespace)  # noqa: S102 (checked by the policy)
    except Exception as e:
        raise _fail("execute", e, source) from None
    fn = namespace.get(ENTRY)
    if not callable(fn):
        raise RewardCompileError("execute", "`reward` is not a function after running the program")
    return fn


def _example(batch, i):
    return jax.tree.map(lambda a: a[i], batch)


def trace_and_validate(source: str, info: ProgramInfo, fn: Callable) -> tuple[str, ...]:
    """Stages 4 and 5 on the synthetic batch; returns the component names."""
    from jaxrace.rewards.synthetic import synthetic_batch

    prev, action, curr, cases = synthetic_batch()
    params = {k: jnp.float32(v) for k, v in info.params.items()}
    call = lambda p, a, c, w: _call(fn, info.takes_params, p, a, c, w)  # noqa: E731
    order = []

    def traced(p, a, c, w):  # records the components' declaration order (pytrees sort dict keys)
        out = call(p, a, c, w)
        order.extend(out[1])
        return out

    try:
        total, components = jax.eval_shape(traced, _example(prev, 0), _example(action, 0), _example(curr, 0),
                                           params)
    except Exception as e:
        raise _fail("trace", e, source) from None
    if not hasattr(total, "shape") or total.shape != ():
        raise RewardCompileError("validate", "the total reward must be a scalar per transition, got "
                                 f"{_describe(total)}; reduce it (e.g. jnp.sum) or index the value you mean")
    if not jnp.issubdtype(total.dtype, jnp.floating):
        raise RewardCompileError("validate", f"the total reward has dtype {total.dtype}; it must be float32: "
                                 "convert with .astype(jnp.float32)")
    if len(components) > MAX_COMPONENTS:
        raise RewardCompileError("validate", f"{len(components)} components; at most {MAX_COMPONENTS}")
    for k, v in components.items():
        if not isinstance(k, str):
            raise RewardCompileError("validate", f"component keys must be strings, got {k!r}")
        numeric = hasattr(v, "dtype") and (jnp.issubdtype(v.dtype, jnp.number) or v.dtype == jnp.bool_)
        if not numeric or v.shape != ():
            raise RewardCompileError("validate", f"component '{k}' must be a numeric scalar, got {_describe(v)}")
    names = tuple(order)

    batched = jax.jit(jax.vmap(call, in_axes=(0, 0, 0, None)))
    try:
        first = jax.device_get(batched(prev, action, curr, params))
        second = jax.device_get(batched(prev, action, curr, params))
    except Exception as e:
        raise _fail("trace", e, source) from None
    totals = np.asarray(first[0], np.float32)
    bad = ~np.isfinite(totals)
    if bad.any():
        i = int(np.argmax(bad))
        culprits = [k for k in names if not np.isfinite(np.asarray(first[1][k], np.float32)[i])]
        which = f" (component{'s' if len(culprits) > 1 else ''} {', '.join(culprits)})" if culprits else ""
        raise RewardCompileError(
            "validate", f"the reward is {totals[i]} for the case '{cases[i]}'{which}: it must be finite for "
            "every input; guard divisions, e.g. x / jnp.maximum(d, 1e-3), and logs, e.g. jnp.log(jnp.maximum(x, "
            "1e-6))")
    for k in names:
        if not np.isfinite(np.asarray(first[1][k], np.float32)).all():
            i = int(np.argmax(~np.isfinite(np.asarray(first[1][k], np.float32))))
            raise RewardCompileError("validate", f"component '{k}' is not finite for the case '{cases[i]}'; "
                                     "guard divisions, e.g. x / jnp.maximum(d, 1e-3)")
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), first, second)
    if not all(jax.tree.leaves(same)):
        raise RewardCompileError("validate", "the reward is not deterministic: two runs on the same input differ")
    return names


def check_program(source: str) -> dict:
    """Stages 1 to 5 in this process; returns {"components": [...], "params": {...}}.

    The sandbox worker calls this; `compile_reward` calls it through the sandbox.
    """
    info = check_policy(parse_program(source))
    fn = execute_program(source, info)
    names = trace_and_validate(source, info, fn)
    return {"components": list(names), "params": info.params}


# ---------------------------------------------------------------------------- entry point

_CACHE: dict[tuple[str, str], CompiledReward] = {}
_CACHE_LOCK = threading.Lock()


def compile_reward(source: str, *, name: str | None = None, sandbox: bool = True,
                   timeout_s: float | None = None, memory_gib: float | None = None) -> CompiledReward:
    """Compile a reward program (Python source) to a `CompiledReward`.

    Args:
        source: the program; it defines `reward(prev, action, curr[, params])` and
            optionally `PARAMS = {...}` (see `jaxrace.rewards.api_text()`).
        name: a label for reports (default: "reward-<first 8 of the sha256>").
        sandbox: run execute/trace/validate in a subprocess with limits first (the
            default). False runs them in this process: only for trusted source.
        timeout_s, memory_gib: the sandbox's limits (defaults in `jaxrace.rewards.sandbox`).

    Raises:
        RewardCompileError: with `.stage`, `.lineno` and a message fit for an LLM.
    """
    digest = hashlib.sha256(source.encode() if isinstance(source, str) else b"").hexdigest()
    name = name or f"reward-{digest[:8]}"
    with _CACHE_LOCK:
        cached = _CACHE.get((digest, name))
    if cached is not None:
        return cached
    info = check_policy(parse_program(source))
    if sandbox:
        from jaxrace.rewards.sandbox import check_in_sandbox

        report = check_in_sandbox(source, timeout_s=timeout_s, memory_gib=memory_gib)
        components = tuple(report["components"])
    else:
        components = trace_and_validate(source, info, execute_program(source, info))
    fn = execute_program(source, info)
    compiled = CompiledReward(name=name, source=source, sha256=digest, component_names=components,
                              params=dict(info.params), fn=fn, takes_params=info.takes_params)
    with _CACHE_LOCK:
        _CACHE[(digest, name)] = compiled
    return compiled
