"""A compiled reward as data: exported StableHLO that the caller runs without its source.

The sandbox worker traces a program and exports one function with `jax.export`, over a
symbolic batch `b` of transitions (every `RaceView` and `Action` field is an array of
shape [b], in field order): the reward and its VJP w.r.t. the weights,

    reward(weights f32[b, P], *prev, *action, *curr, d_total f32[b], d_components f32[b, C])
        -> (total f32[b], components f32[b, C], d_weights f32[b, P])

A forward call passes zero cotangents and uses the first two outputs; XLA inlines the
exported call and removes the unused VJP (the compiled forward is the same program as a
forward-only export's: same operations, same values). One export instead of a forward
and a separate VJP costs one lowering over the symbolic batch instead of two.
Version 1 artifacts (before 2026-12-02) hold the two functions separately,

    forward(weights, *prev, *action, *curr) -> (total, components)
    weights_vjp(weights, *prev, *action, *curr, d_total, d_components) -> d_weights

and still load (run directories keep artifacts).

`RewardArtifact.to_bytes()` stores them in a zip with a JSON header (component names,
PARAMS, the field layout, versions) and the source, kept as a record only: loading
never executes it. `load_call(artifact)` returns a function that works under `jit`,
`vmap` (any number of nested axes are folded into the symbolic batch through
`jax.custom_batching.custom_vmap`) and `grad` w.r.t. the weights (a `custom_vjp` whose
backward pass is the exported VJP). The transition is data: its cotangent is zero.
"""

from __future__ import annotations

import dataclasses
import io
import json
import threading
import zipfile
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.custom_batching import custom_vmap

from jaxrace.rewards.api import Action, RaceView, field_dtypes

FORMAT = "jaxrace-reward-artifact"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
MAX_ARTIFACT_BYTES = 8 << 20
# custom_calls an exported reward may contain: shape checks of the symbolic batch only.
ALLOWED_CUSTOM_CALLS = frozenset({"shape_assertion"})


class ArtifactError(ValueError):
    """A reward artifact is malformed, from another API version, or not safe to run."""


def field_layout() -> dict[str, list[list[str]]]:
    """{"RaceView": [[field, dtype], ...], "Action": [...]}: the input order of an export."""
    return {"RaceView": [[k, np.dtype(v).name] for k, v in field_dtypes(RaceView).items()],
            "Action": [[k, np.dtype(v).name] for k, v in field_dtypes(Action).items()]}


@dataclasses.dataclass(frozen=True, eq=False)
class RewardArtifact:
    """A reward program exported by the sandbox worker (see the module docstring)."""

    source: str
    sha256: str
    component_names: tuple[str, ...]
    params: tuple[tuple[str, float], ...]
    # Version 2: the exported `reward` (the module docstring). Version 1: its `forward`.
    exported: bytes = dataclasses.field(repr=False)
    layout: dict = dataclasses.field(repr=False, default_factory=field_layout)
    jax_version: str = jax.__version__
    version: int = FORMAT_VERSION
    weights_vjp: bytes | None = dataclasses.field(repr=False, default=None)  # version 1 only

    def __post_init__(self):
        if self.version not in READABLE_VERSIONS or (self.version == 1) != (self.weights_vjp is not None):
            raise ArtifactError(f"a version {self.version!r} artifact "
                                + ("holds a separate weights VJP" if self.version == 1 else "has no separate "
                                   "weights VJP") + f"; this jaxrace reads versions {READABLE_VERSIONS}")

    def header(self) -> dict:
        return {"format": FORMAT, "version": self.version, "sha256": self.sha256,
                "component_names": list(self.component_names), "params": [list(p) for p in self.params],
                "layout": self.layout, "jax_version": self.jax_version}

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("header.json", json.dumps(self.header(), indent=1))
            if self.version == 1:  # saved again as it was read
                z.writestr("forward.jaxexport", self.exported)
                z.writestr("weights_vjp.jaxexport", self.weights_vjp)
            else:
                z.writestr("reward.jaxexport", self.exported)
            z.writestr("source.py", self.source)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> RewardArtifact:
        """Parse and check an artifact; raises `ArtifactError` saying what is wrong."""
        if len(data) > MAX_ARTIFACT_BYTES:
            raise ArtifactError(f"reward artifact is {len(data)} bytes; at most {MAX_ARTIFACT_BYTES}")
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                sizes = sum(i.file_size for i in z.infolist())
                if sizes > 4 * MAX_ARTIFACT_BYTES:
                    raise ArtifactError(f"reward artifact unpacks to {sizes} bytes")
                header = json.loads(z.read("header.json"))
                version = header.get("version")  # a header that is not an object: AttributeError, below
                if header.get("format") != FORMAT or type(version) is not int or version not in READABLE_VERSIONS:
                    raise ArtifactError(f"unsupported artifact format {header.get('format')!r} version "
                                        f"{version!r}; this jaxrace reads {FORMAT} versions {READABLE_VERSIONS}")
                if version == 1:
                    exported, vjp = z.read("forward.jaxexport"), z.read("weights_vjp.jaxexport")
                else:
                    exported, vjp = z.read("reward.jaxexport"), None
                source = z.read("source.py").decode()
        except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise ArtifactError(f"not a reward artifact: {e}") from None
        if header["layout"] != field_layout():
            raise ArtifactError("the artifact was built for a different RaceView/Action; compile its source again")
        return cls(source=source, sha256=header["sha256"], component_names=tuple(header["component_names"]),
                   params=tuple((k, float(v)) for k, v in header["params"]), exported=exported,
                   layout=header["layout"], jax_version=header["jax_version"], version=version, weights_vjp=vjp)


# The dialects a deserialized reward module is made of; an op of any other is refused.
ALLOWED_DIALECTS = frozenset({"builtin", "func", "stablehlo", "chlo"})
# Ops of those a reward has no use for and a forged artifact could use to reach outside its
# computation: host transfers, collectives and tokens (custom calls are checked by target).
FORBIDDEN_OPS = frozenset(f"stablehlo.{op}" for op in (
    "infeed", "outfeed", "send", "recv", "all_gather", "all_reduce", "all_to_all", "collective_permute",
    "collective_broadcast", "reduce_scatter", "partition_id", "replica_id", "after_all", "create_token"))
# Modules deserialized into one context before it is replaced: a context keeps every type
# and attribute it has seen, and a long run loads many rewards.
MODULES_PER_CONTEXT = 64
_contexts = threading.local()


def _module_ops(exported: export.Exported, what: str) -> list[tuple[str, str | None]]:
    """(op name, custom-call target or None) for every op of the exported module.

    The portable artifact is deserialized to StableHLO in an MLIR context of this thread
    and walked: ~6 ms a module, against ~33 ms for `Exported.mlir_module()` (a fresh
    context, then the whole module printed as text and searched). A module MLIR cannot
    read raises `ArtifactError` naming `what`.
    """
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    uses = getattr(_contexts, "uses", MODULES_PER_CONTEXT)
    if uses >= MODULES_PER_CONTEXT:
        _contexts.context, uses = jax_mlir.make_ir_context(), 0
    _contexts.uses = uses + 1
    try:
        module = stablehlo.deserialize_portable_artifact(_contexts.context, exported.mlir_module_serialized)
    except Exception as e:  # noqa: BLE001 (MLIR raises ValueError or MLIRError for a module it cannot read)
        raise ArtifactError(f"the artifact's {what} does not load: {type(e).__name__}: {str(e)[:200]}") from None
    ops = []

    def visit(op):
        target = None
        if op.name == "stablehlo.custom_call":
            attributes = op.attributes
            target = ir.StringAttr(attributes["call_target_name"]).value if "call_target_name" in attributes \
                else "<unnamed>"
        ops.append((op.name, target))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return ops


def _check_exported(exported: export.Exported, what: str, num_outputs: int) -> None:
    """Refuse what a reward has no need of: effects, devices, custom calls, I/O ops, unchecked shapes."""
    problems = []
    if exported.ordered_effects or exported.unordered_effects:
        problems.append("it has side effects")
    if exported.nr_devices != 1:
        problems.append(f"it needs {exported.nr_devices} devices")
    if exported.disabled_safety_checks:
        problems.append("it disables safety checks")
    if len(exported.out_avals) != num_outputs:
        problems.append(f"it has {len(exported.out_avals)} outputs")
    ops = _module_ops(exported, what)
    targets = {t for _, t in ops if t is not None}
    if targets - ALLOWED_CUSTOM_CALLS:
        problems.append(f"it calls {sorted(targets - ALLOWED_CUSTOM_CALLS)}")
    names = {name for name, _ in ops}
    foreign = {name for name in names if name.split(".", 1)[0] not in ALLOWED_DIALECTS}
    if names & FORBIDDEN_OPS or foreign:
        problems.append(f"it uses {sorted(names & FORBIDDEN_OPS | foreign)}")
    if problems:
        raise ArtifactError(f"the artifact's {what} is not a pure reward: {'; '.join(problems)}")


def _check_inputs(exported: export.Exported, what: str, expected: list[tuple[tuple, np.dtype]]) -> None:
    """The exported function takes `expected` ((shape, dtype), ...; "b" the symbolic batch)."""
    found = [(tuple(map(str, a.shape)), np.dtype(a.dtype).name) for a in exported.in_avals]
    want = [(tuple(map(str, shape)), np.dtype(d).name) for shape, d in expected]
    if found != want:
        raise ArtifactError(f"the artifact's {what} takes {len(found)} inputs {found[:3]}..., not the "
                            f"{len(want)} inputs {want[:3]}... of a reward with {want[0][0][1]} PARAMS")


def _batched_call(exported: export.Exported) -> Callable:
    """`exported.call` over inputs with one leading batch axis, made vmappable by folding axes."""

    @custom_vmap
    def call(*args):
        return exported.call(*args)

    @call.def_vmap
    def fold(axis_size, in_batched, *args):
        inner = args[0].shape[1] if in_batched[0] else args[0].shape[0]
        flat = [(a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)).reshape((axis_size * inner,) + a.shape[
            2 if b else 1:]) for a, b in zip(args, in_batched, strict=True)]
        out = call(*flat)
        out = jax.tree.map(lambda o: o.reshape((axis_size, inner) + o.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return call


def load_call(artifact: RewardArtifact, vmappable: bool = True) -> Callable:
    """The artifact as `f(weights f32[..., P], prev, action, curr) -> (total f32[...], comps f32[..., C])`.

    `prev`, `action`, `curr` are a `RaceView`, an `Action` and a `RaceView` whose fields
    share leading axes [...] (none for one transition); `weights` broadcasts against them.
    With `vmappable=False` the exported functions are called without the batching rule
    that folds vmapped axes (same values, ~25 ms less to trace and lower; the sandbox's
    validation, which never vmaps, uses it). Raises `ArtifactError` if the exported
    functions do not load or are not pure.
    """
    try:
        functions = [export.deserialize(artifact.exported)]
        if artifact.version == 1:
            functions.append(export.deserialize(artifact.weights_vjp))
    except Exception as e:  # noqa: BLE001 (a corrupt artifact can fail anywhere in the flatbuffer)
        raise ArtifactError(f"the artifact's exported functions do not load: {type(e).__name__}: {e}") from None
    view_dtypes = [np.dtype(d) for _, d in artifact.layout["RaceView"]]
    action_dtypes = [np.dtype(d) for _, d in artifact.layout["Action"]]
    dtypes = view_dtypes + action_dtypes + view_dtypes
    num_components = len(artifact.component_names)
    inputs = [(("b", len(artifact.params)), np.float32)] + [(("b",), d) for d in dtypes]
    cotangents = [(("b",), np.float32), (("b", num_components), np.float32)]
    wrap = _batched_call if vmappable else (lambda exported: exported.call)
    if artifact.version == 1:
        forward, vjp = functions
        _check_exported(forward, "forward function", 2)
        _check_exported(vjp, "weights VJP", 1)
        _check_inputs(forward, "forward function", inputs)
        _check_inputs(vjp, "weights VJP", inputs + cotangents)
        return make_call(wrap(forward), wrap(vjp), len(artifact.params), dtypes)
    (reward,) = functions
    _check_exported(reward, "exported reward", 3)
    _check_inputs(reward, "exported reward", inputs + cotangents)
    both = wrap(reward)

    def forward(weights, *fields):  # zero cotangents: XLA drops the VJP's outputs and their work
        size = weights.shape[0]
        return both(weights, *fields, jnp.zeros((size,), jnp.float32),
                    jnp.zeros((size, num_components), jnp.float32))[:2]

    def weights_vjp(*args):
        return both(*args)[2]

    return make_call(forward, weights_vjp, len(artifact.params), dtypes)


def make_call(forward: Callable, weights_vjp: Callable, num_params: int, dtypes: list) -> Callable:
    """A reward call over any leading axes from `forward`/`weights_vjp` over one flat batch.

    `forward(weights f32[B, P], *fields [B]) -> (f32[B], f32[B, C])` and
    `weights_vjp(weights, *fields, d_total, d_components) -> f32[B, P]`, with the fields in
    `field_layout()` order and `dtypes` their dtypes. Gradients flow to the weights only.
    """

    @jax.custom_vjp
    def run(weights, fields):
        return forward(weights, *fields)

    def run_forward(weights, fields):
        return forward(weights, *fields), (weights, fields)

    def run_backward(residuals, cotangents):
        weights, fields = residuals
        return weights_vjp(weights, *fields, *cotangents), jax.tree.map(jnp.zeros_like, fields)

    run.defvjp(run_forward, run_backward)

    def call(weights, prev: RaceView, action: Action, curr: RaceView):
        leaves = [*jax.tree.leaves(prev), *jax.tree.leaves(action), *jax.tree.leaves(curr)]
        if len(leaves) != len(dtypes):
            raise TypeError("prev, action and curr must be a RaceView, an Action and a RaceView")
        batch_shape = jnp.shape(leaves[0])
        size = int(np.prod(batch_shape, dtype=np.int64))
        fields = tuple(jnp.broadcast_to(jnp.asarray(x).astype(d), batch_shape).reshape((size,))
                       for x, d in zip(leaves, dtypes, strict=True))
        weights = jnp.asarray(weights, jnp.float32)
        if weights.shape[-1:] != (num_params,):
            raise ValueError(f"weights must end in {num_params} (the PARAMS), got shape {weights.shape}")
        weights = jnp.broadcast_to(weights, batch_shape + (num_params,)).reshape((size, num_params))
        total, components = run(weights, fields)
        return total.reshape(batch_shape), components.reshape(batch_shape + components.shape[-1:])

    return call
