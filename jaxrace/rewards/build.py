"""Stages 3 to 5 of the reward compiler. They run only inside the sandbox worker.

`build_artifact(source)` is the one function that runs every stage in order: parse and
policy (`jaxrace.rewards.policy`), execute the module in the curated namespace, trace
the entry point, export it (`jaxrace.rewards.artifact`), then validate the exported
artifact (the bytes the caller will run, loaded and checked the way the caller loads
them, without the vmap-folding wrapper that validation has no use for) on
synthetic transitions: finite everywhere (the extreme cases included), magnitude at
most `Limits.max_magnitude` on ordinary cases, identical across call counts and batch
sizes, temporary memory bounded at the training batch size, and a gradient w.r.t. the
weights that runs. A second, fresh execution of the source must trace to the same
computation (checked while XLA compiles validation's executable). Every failure is a
`RewardCompileError` naming the stage, the line where known, and the case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.extend.core import jaxpr_as_fun

from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.artifact import PLATFORMS, ArtifactError, RewardArtifact, load_call, make_call
from jaxrace.rewards.errors import PROGRAM_FILENAME, RewardCompileError
from jaxrace.rewards.namespace import program_namespace
from jaxrace.rewards.parse import ENTRY, parse_program
from jaxrace.rewards.policy import ACTION_FIELDS, RACEVIEW_FIELDS, ProgramInfo, check_policy, suggest
from jaxrace.rewards.synthetic import extreme_batch, synthetic_batch

MAX_COMPONENTS = 32
MAX_COMPONENT_NAME = 64


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a reward may cost, checked by validation.

    Attributes:
        train_batch: transitions per reward evaluation in training (the batch at which
            temporary memory is measured).
        max_temp_mib: temporary memory of one evaluation of `train_batch` transitions.
        max_magnitude: largest |total| or |component| allowed on ordinary transitions.
    """

    train_batch: int = 65_536
    max_temp_mib: float = 256.0
    max_magnitude: float = 1e6

    def __post_init__(self):
        if self.train_batch < 1 or self.max_temp_mib <= 0 or self.max_magnitude <= 0:
            raise ValueError(f"limits must be positive: {self}")


# ---------------------------------------------------------------------------- messages


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
        return f"a traced value was used as a Python bool or number in `{line}`: use jnp.where / jnp.maximum"
    if isinstance(exc, jax.errors.TracerIntegerConversionError | jax.errors.TracerArrayConversionError):
        return f"a traced value was converted to a Python or numpy number in `{line}`: keep it a jnp array"
    if isinstance(exc, AttributeError):
        for kind, fields in (("RaceView", RACEVIEW_FIELDS), ("Action", ACTION_FIELDS)):
            if f"'{kind}' object has no attribute" in text:
                field = text.rsplit("'", 2)[-2]
                return f"{kind} has no field '{field}'{suggest(field, fields)}"
        return text[:300]
    if isinstance(exc, KeyError):
        return f"KeyError {text[:100]}: a dict (params or components) has no such key"
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


def _describe(out) -> str:
    if isinstance(out, tuple | list):
        return f"a {type(out).__name__} of {len(out)} ({', '.join(type(o).__name__ for o in out)})"
    shape = getattr(out, "shape", None)
    return f"an array of shape {tuple(shape)}" if shape is not None else f"a {type(out).__name__}"


# ---------------------------------------------------------------------------- execute and trace


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


def _call(fn: Callable, info: ProgramInfo, prev, action, curr, weights) -> tuple:
    params = {k: weights[j] for j, k in enumerate(info.params)}
    out = fn(prev, action, curr, params) if info.takes_params else fn(prev, action, curr)
    if not (isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[1], dict)):
        raise RewardCompileError(
            "validate", "reward must return a pair (total, components): a float32 scalar and a dict of "
            f"named float32 scalars, e.g. `return total, {{\"progress\": p}}`; got {_describe(out)}")
    return out


def _one(batch, i):
    return jax.tree.map(lambda a: a[i], batch)


def _check_outputs(total, components: dict) -> tuple[str, ...]:
    """The types of one transition's (total, components), traced; returns the components' names in order.

    Python numbers count as scalars of their JAX dtype (a constant total or component is
    fine); only their type is looked at, so no array is made (the worker's warm-up traces
    before JAX's runtime may start)."""
    if isinstance(total, bool | int | float | complex):
        total = jax.ShapeDtypeStruct((), jnp.result_type(total))
    if not hasattr(total, "shape") or total.shape != ():
        raise RewardCompileError("validate", "the total reward must be a scalar per transition, got "
                                 f"{_describe(total)}; reduce it (e.g. jnp.sum) or index the value you mean")
    if not jnp.issubdtype(total.dtype, jnp.floating):
        raise RewardCompileError("validate", f"the total reward has dtype {total.dtype}; it must be float32: "
                                 "convert with .astype(jnp.float32)")
    names = tuple(components)  # the program's order (a pytree would sort the keys)
    if len(names) > MAX_COMPONENTS:
        raise RewardCompileError("validate", f"{len(names)} components; at most {MAX_COMPONENTS}")
    for k in names:
        if not isinstance(k, str) or not k.isprintable() or not 0 < len(k) <= MAX_COMPONENT_NAME:
            raise RewardCompileError("validate", f"component names must be printable strings of 1 to "
                                     f"{MAX_COMPONENT_NAME} characters, got {str(k)[:80]!r}")
        v = components[k]
        v = jax.ShapeDtypeStruct((), jnp.result_type(v)) if isinstance(v, bool | int | float | complex) else v
        numeric = hasattr(v, "dtype") and (jnp.issubdtype(v.dtype, jnp.number) or v.dtype == jnp.bool_)
        if not numeric or v.shape != ():
            raise RewardCompileError("validate", f"component '{k}' must be a numeric scalar, got {_describe(v)}")
    return names


# ---------------------------------------------------------------------------- trace and export


def forward_function(fn: Callable, info: ProgramInfo, names: list[str]) -> Callable:
    """The program over a flat batch: `(weights f32[B, P], *fields [B]) -> (f32[B], f32[B, C])`.

    Every trace checks the outputs' types. `names` is the components' order; where it is
    empty, the first trace fills it, and every trace must give the same names.
    """
    views, acts = len(RACEVIEW_FIELDS), len(ACTION_FIELDS)
    traced = [bool(names)]  # names known: given, or found by a trace (an empty dict is a valid answer)

    def one(weights, prev, action, curr):
        total, components = _call(fn, info, prev, action, curr, weights)
        found = _check_outputs(total, components)
        if not traced[0]:
            names.extend(found)
            traced[0] = True
        if list(found) != list(names):
            raise RewardCompileError("validate", f"the component names changed between traces ({list(names)} "
                                     f"then {list(components)}): build the dict the same way every time")
        values = [jnp.asarray(components[k]).astype(jnp.float32) for k in names]
        return jnp.asarray(total).astype(jnp.float32), (jnp.stack(values) if values else jnp.zeros((0,)))

    def forward(weights, *fields):
        prev = RaceView(**dict(zip(RACEVIEW_FIELDS, fields[:views], strict=True)))
        action = Action(**dict(zip(ACTION_FIELDS, fields[views:views + acts], strict=True)))
        curr = RaceView(**dict(zip(RACEVIEW_FIELDS, fields[views + acts:], strict=True)))
        return jax.vmap(one)(weights, prev, action, curr)

    return forward


@contextlib.contextmanager
def _quick_batch_checks():
    """While exporting, multiply a traced batch size by a constant 1 without an exception.

    jax 0.10's export checks that each input's batch size equals `b` by evaluating
    `b * 1`, and `shape_poly._evaluate_multiply` first tries `operator.index` on the
    traced size. That fails, and the failure's message walks every equation traced so
    far: quadratic in the inputs (57 of the forward, 59 of its VJP), a fifth of the
    export's time. The shortcut returns what the original returns in that case. It is
    undone on exit (a worker's child exports on one thread). Where jax's private names
    differ, jax's own path runs.
    """
    try:
        from jax._src.export import shape_poly
        from jax._src.interpreters import partial_eval

        original, tracer = shape_poly._evaluate_multiply, partial_eval.DynamicJaxprTracer
    except (ImportError, AttributeError):
        yield
        return

    def multiply(v1, v2):
        if isinstance(v1, tracer) and isinstance(v2, (int, np.integer)) and v2 == 1:
            return v1
        return original(v1, v2)

    shape_poly._evaluate_multiply = multiply
    try:
        yield
    finally:
        shape_poly._evaluate_multiply = original


@contextlib.contextmanager
def _exporting():
    """Tracing and lowering for export: the batch-check shortcut, and no source locations
    in the modules (`jax_traceback_in_locations_limit` 0), so the same program exports to
    the same bytes every time."""
    previous = jax.config.jax_traceback_in_locations_limit
    jax.config.update("jax_traceback_in_locations_limit", 0)
    try:
        with _quick_batch_checks():
            yield
    finally:
        jax.config.update("jax_traceback_in_locations_limit", previous)


def _call_dtypes() -> list:
    """The dtypes of a reward call's flat fields: prev's, the action's, curr's (`field_layout` order)."""
    from jaxrace.rewards.api import field_dtypes

    return [*field_dtypes(RaceView).values(), *field_dtypes(Action).values(), *field_dtypes(RaceView).values()]


def _specs(num_params: int, b) -> tuple[jax.ShapeDtypeStruct, list[jax.ShapeDtypeStruct]]:
    return jax.ShapeDtypeStruct((b, num_params), jnp.float32), [jax.ShapeDtypeStruct((b,), d) for d in _call_dtypes()]


@dataclasses.dataclass(frozen=True)
class ForwardTrace:
    """`jit(forward_function(...))` traced over a symbolic batch: `traced`; `names` are the
    components' names in the program's order."""

    names: tuple[str, ...]
    weight_spec: jax.ShapeDtypeStruct
    field_specs: tuple[jax.ShapeDtypeStruct, ...]
    traced: jax.stages.Traced

    @property
    def text(self) -> str:
        """The traced computation as text (no source locations in it)."""
        return str(self.traced.jaxpr)


def trace_forward(source: str, info: ProgramInfo, fn: Callable) -> ForwardTrace:
    """Stage 4: the forward function traced over a symbolic batch `b`, once; the outputs'
    types are checked on the way (one transition's total a float scalar, each component
    a numeric scalar with a short printable name).

    The export replays its jaxpr under `jax.vjp` rather than running the program
    again, and its text is what a second, fresh
    execution must reproduce (see `build_artifact`). Tracing starts no JAX runtime.
    """
    (b,) = export.symbolic_shape("b")
    weight_spec, field_specs = _specs(len(info.params), b)
    names: list[str] = []
    try:
        with _exporting():
            traced = jax.jit(forward_function(fn, info, names)).trace(weight_spec, *field_specs)
    except Exception as e:
        raise _fail("trace", e, source) from None
    return ForwardTrace(tuple(names), weight_spec, tuple(field_specs), traced)


def export_program(source: str, info: ProgramInfo, fn: Callable, forward: ForwardTrace | None = None
                   ) -> RewardArtifact:
    """Stage 5a: export the reward and its VJP w.r.t. the weights, as one function over a symbolic batch.

    `(weights, *fields, d_total, d_components) -> (total, components, d_weights)` (the
    artifact module's docstring): the VJP replays the forward's jaxpr, whose primal
    outputs are the forward's. One export lowers the program over the symbolic batch
    once, where a forward and a separate VJP lowered it twice (0.13 to 0.09 s a build).
    `forward` is `trace_forward(source, info, fn)`, traced here if not given.
    """
    forward = forward if forward is not None else trace_forward(source, info, fn)
    names = forward.names
    weight_spec, field_specs = forward.weight_spec, forward.field_specs
    b = weight_spec.shape[0]
    replay = jaxpr_as_fun(forward.traced.jaxpr)

    def reward_and_vjp(weights, *args):
        fields, cotangents = args[:-2], args[-2:]
        (total, components), pull = jax.vjp(lambda w: tuple(replay(w, *fields)), weights)
        return total, components, pull(cotangents)[0]

    spec = jax.ShapeDtypeStruct
    try:
        with _exporting():
            exported = export.export(jax.jit(reward_and_vjp), platforms=PLATFORMS)(
                weight_spec, *field_specs, spec((b,), jnp.float32), spec((b, len(names)), jnp.float32)).serialize()
    except Exception as e:
        raise _fail("trace", e, source) from None
    return RewardArtifact(source=source, sha256=hashlib.sha256(source.encode()).hexdigest(), component_names=names,
                          params=tuple(info.params.items()), exported=exported)


# ---------------------------------------------------------------------------- validate


@functools.cache
def validation_cases() -> tuple[RaceView, Action, RaceView, tuple[str, ...], int]:
    """(prev, action, curr, case names, how many are ordinary): the synthetic then the extreme cases.

    Numpy only, so the worker builds them once before it forks (`warm_up`).
    """
    ordinary, extreme = synthetic_batch(), extreme_batch()
    prev, action, curr = (jax.tree.map(lambda *xs: np.concatenate(xs), o, x)
                          for o, x in zip(ordinary[:3], extreme[:3], strict=True))
    return prev, action, curr, ordinary[3] + extreme[3], len(ordinary[3])


# Validation runs its executable twice and throws it away, so its compile time is what
# counts: LLVM's optimisations (level 0) and XLA:CPU's MLIR fusion emitters (the older
# emitters compile the same fusions 2-3x faster; experiments/bench_build_stages.py) cost
# more than they save at run time. Its module is small, so splitting it for parallel code
# generation (XLA's default) costs more than the threads save (one part: the compile 22%
# faster). Buffer assignment (what `memory_analysis` reports) happens before code generation
# and is the same either way (a test checks both).
VALIDATION_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
                               "xla_cpu_parallel_codegen_split_count": 1}


def compile_for_validation(lowered: jax.stages.Lowered) -> jax.stages.Compiled:
    """`lowered.compile(VALIDATION_COMPILER_OPTIONS)`, or with XLA's defaults where this
    XLA no longer knows one of the options (XLA refuses the whole compile otherwise)."""
    try:
        return lowered.compile(VALIDATION_COMPILER_OPTIONS)
    except jax.errors.JaxRuntimeError as e:
        if "No such compile option" not in str(e):
            raise
        return lowered.compile()


def _tile(batch, size: int):
    return jax.tree.map(lambda x: np.resize(np.asarray(x), (size,) + x.shape[1:]), batch)


@functools.cache
def tiled_validation_cases(size: int) -> tuple[RaceView, Action, RaceView]:
    """(prev, action, curr): `validation_cases()` repeated to `size` transitions (numpy, [size]).

    Built once in the worker before it forks (`warm_up`, at the default training batch).
    """
    return tuple(_tile(x, size) for x in validation_cases()[:3])


def validation_function(call: Callable) -> Callable:
    """`(weights, tiled, one) -> (call on tiled, call on one, d sum(total on one) / d weights)`.

    The batch-1 outputs come out of the gradient's own forward pass, so the exported
    forward is lowered twice (two batch sizes), not three times.
    """
    def one_with_gradient(w, one):
        out = call(w, *one)
        return out[0].sum(), out

    def both(w, tiled, one):
        (_, one_out), gradient = jax.value_and_grad(one_with_gradient, has_aux=True)(w, one)
        return call(w, *tiled), one_out, gradient

    return both


def validate_artifact(artifact: RewardArtifact, limits: Limits,
                      while_compiling: Callable[[], None] = lambda: None) -> None:
    """Stage 5b: run the exported artifact as the caller will, unvmapped (see the module docstring).

    One executable (one XLA compile: most of a program's build time) holds two
    computations: the forward at the training batch size (the synthetic cases tiled to
    fill it), and one transition with the gradient w.r.t. the weights (the batch size
    must not change a value). It runs twice (calls must agree) and its temporary memory
    is measured (the batch-1 part adds next to nothing).

    XLA compiles on a thread of its own while `while_compiling()` runs here (the compile
    releases the GIL): `build_artifact` checks determinism meanwhile. What it raises is
    raised once the compile is done.
    """
    try:
        call = load_call(artifact, vmappable=False)
    except ArtifactError as e:
        raise RewardCompileError("validate", str(e)) from None
    prev, action, curr, cases, num_ordinary = validation_cases()
    num_cases = len(cases)
    size = max(limits.train_batch, num_cases)
    weights = np.asarray([v for _, v in artifact.params], np.float32)
    names = artifact.component_names

    both = validation_function(call)
    try:
        tiled = list(tiled_validation_cases(size))
        one = [_one(x, slice(0, 1)) for x in (prev, action, curr)]
        lowered = jax.jit(both).lower(weights, tiled, one)
        with ThreadPoolExecutor(1, thread_name_prefix="validation-compile") as pool:
            compiling = pool.submit(compile_for_validation, lowered)
            while_compiling()
            big = compiling.result()
        (total, components), (one_total, one_components), _ = jax.device_get(big(weights, tiled, one))
        total, components = total[:num_cases], components[:num_cases]
        repeat = [np.asarray(x)[:num_cases] for x in big(weights, tiled, one)[0]]
    except RewardCompileError:
        raise
    except Exception as e:
        raise RewardCompileError("validate", f"the exported reward failed to run: {type(e).__name__}: "
                                 f"{str(e)[:200]}") from None

    for values, what in [(total, "the reward")] + [(components[:, j], f"component '{k}'") for j, k in
                                                   enumerate(names)]:
        bad = ~np.isfinite(values)
        if bad.any():
            i = int(np.argmax(bad))
            culprits = [k for j, k in enumerate(names) if not np.isfinite(components[i, j])]
            which = f" (component{'s' if len(culprits) > 1 else ''} {', '.join(culprits)})" if culprits and \
                what == "the reward" else ""
            raise RewardCompileError(
                "validate", f"{what} is {values[i]} for the case '{cases[i]}'{which}: it must be finite for every "
                "input; guard divisions, e.g. x / jnp.maximum(d, 1e-3), logs, e.g. jnp.log(jnp.maximum(x, 1e-6)), "
                "and arcsin/sqrt arguments with jnp.clip")
    both = np.concatenate([total[:num_ordinary, None], components[:num_ordinary]], axis=1)
    large = np.abs(both) > limits.max_magnitude
    if large.any():
        i, j = np.unravel_index(int(np.argmax(large)), large.shape)
        what = "the reward" if j == 0 else f"component '{names[j - 1]}'"
        raise RewardCompileError("validate", f"{what} is {both[i, j]:.3g} for the case '{cases[i]}'; at most "
                                 f"{limits.max_magnitude:g} in magnitude on ordinary transitions: scale it down")
    if not (np.array_equal(repeat[0], total) and np.array_equal(repeat[1], components)):
        raise RewardCompileError("validate", "the reward is not deterministic: two calls on the same input differ")
    if not (np.allclose(one_total, total[:1], rtol=1e-6, atol=1e-6)
            and np.allclose(one_components, components[:1], rtol=1e-6, atol=1e-6)):
        raise RewardCompileError("validate", "the reward depends on the batch size (a batch of 1 gives other "
                                 "values than a larger one)")
    stats = big.memory_analysis()
    temp_mib = getattr(stats, "temp_size_in_bytes", 0) / (1 << 20) if stats is not None else 0.0
    if temp_mib > limits.max_temp_mib:
        raise RewardCompileError("validate", f"the reward needs {temp_mib:.0f} MiB of temporary memory for a batch "
                                 f"of {size} transitions; at most {limits.max_temp_mib:g} MiB: a reward works on "
                                 "scalars and must not build large arrays")


def in_process_call(source: str) -> Callable:
    """The program's traced function called directly, as `artifact.load_call` would call the export.

    This executes the source in *this* process: for trusted source only (the benchmark
    baseline that the exported path is measured against). No gradients. Its trace patches
    jax while it runs (`_exporting`): call it from one thread.
    """
    info = check_policy(parse_program(source))
    fn = execute_program(source, info)
    names = trace_forward(source, info, fn).names

    def no_vjp(*args):
        raise NotImplementedError("the in-process baseline has no gradients")

    return make_call(forward_function(fn, info, list(names)), no_vjp, len(info.params), _call_dtypes())


# ---------------------------------------------------------------------------- all stages


def warm_up() -> None:
    """Trace a library reward end to end without lowering it, and build the validation cases
    (tiled to the default training batch).

    The sandbox worker calls this before it forks, so that every child starts with
    JAX's tracing caches warm. It starts no runtime threads (exporting would).
    """
    # Every module a build imports is imported here, once, rather than in each forked child:
    # lowering an exported call initialises JAX's LAPACK kernels, which imports scipy.linalg,
    # and the first MLIR context and export load the MHLO and builtin dialects' modules (a
    # test checks that a build imports nothing after this).
    import scipy.linalg  # noqa: F401

    try:
        import jaxlib.mlir.dialects.builtin  # noqa: F401
        import jaxlib.mlir.dialects.mhlo  # noqa: F401
        import jaxlib.mlir.dialects.stablehlo  # noqa: F401
    except ImportError:  # a jaxlib without them does not load them either
        pass

    from jaxrace.rewards.library import LIBRARY

    source = LIBRARY["gt_sophy"]
    info = check_policy(parse_program(source))
    fn = execute_program(source, info)
    _ = trace_forward(source, info, fn).text  # the printer, warm too
    tiled_validation_cases(max(Limits().train_batch, len(validation_cases()[3])))


def build_artifact(source: str, limits: Limits = Limits(), report: Callable[[str], None] = lambda stage: None
                   ) -> RewardArtifact:
    """Stages 1 to 5: parse, policy, execute, trace, export and validate.

    `report(stage)` is called as each stage starts (the worker forwards it, so a
    time-out names the stage). Raises `RewardCompileError`.
    """
    report("parse")
    info = check_policy(parse_program(source))
    report("execute")
    fn = execute_program(source, info)
    report("trace")
    forward = trace_forward(source, info, fn)
    artifact = export_program(source, info, fn, forward)

    def check_determinism():  # on this thread while XLA compiles validation's executable on another
        report("execute")
        fn_again = execute_program(source, info)
        report("trace")
        again = trace_forward(source, info, fn_again)
        if again.names != forward.names or again.text != forward.text:
            raise RewardCompileError("validate", "the reward is not deterministic: two fresh executions of the "
                                     "program trace to different computations (does it keep state or depend on "
                                     "order?)")
        report("validate")

    report("validate")
    validate_artifact(artifact, limits, while_compiling=check_determinism)
    return artifact
