"""Exported reward artifacts: what the caller runs instead of the source."""

import dataclasses
import io
import json
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jaxrace.rewards.sandbox as sandbox
from jaxrace.rewards import compile_reward
from jaxrace.rewards.artifact import ArtifactError, RewardArtifact
from jaxrace.rewards.compiler import CompiledReward, load_reward
from jaxrace.rewards.synthetic import action, synthetic_batch, view

# SOURCE below, compiled and saved by jaxrace at commit e6dddc0 (2026-11-26, the last change
# to RaceView and Action): what a run directory written then holds.
SAVED_ARTIFACT = Path(__file__).parent / "data" / "saved_at_e6dddc0.jaxreward"

SOURCE = '''
PARAMS = {"w_progress": 1.0, "w_slip": 2.0}


def reward(prev, action, curr, params):
    progress = curr.progress - prev.progress
    slip = jnp.maximum(curr.tyre_slip - 0.13, 0.0)
    total = params["w_progress"] * progress - params["w_slip"] * slip + 0.1 * action.throttle_brake
    return total, {"progress": progress, "slip": slip}
'''


def reference(prev, act, curr, w_progress=1.0, w_slip=2.0):
    progress = np.asarray(curr.progress, np.float32) - np.asarray(prev.progress, np.float32)
    slip = np.maximum(np.asarray(curr.tyre_slip, np.float32) - np.float32(0.13), 0)
    return w_progress * progress - w_slip * slip + np.float32(0.1) * np.asarray(act.throttle_brake), progress, slip


@pytest.fixture(scope="module")
def compiled():
    return compile_reward(SOURCE, name="artifact-test")


def test_values_match_a_numpy_reference_on_a_batch_without_vmap(compiled):
    prev, act, curr, names = synthetic_batch()
    total, comps = compiled(prev, act, curr)  # fields with a leading batch axis: no vmap needed
    want, progress, slip = reference(prev, act, curr)
    assert total.shape == prev.progress.shape == (len(names),) and total.dtype == jnp.float32
    np.testing.assert_allclose(total, want, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(comps["progress"], progress, rtol=1e-6)
    np.testing.assert_allclose(comps["slip"], slip, rtol=1e-6)


def test_nested_vmap_over_candidates_and_transitions_equals_one_call_each(compiled):
    prev, act, curr, names = synthetic_batch()
    weights = jnp.asarray([[1.0, 2.0], [0.5, 0.0], [2.0, 10.0]], jnp.float32)
    nested = jax.jit(jax.vmap(jax.vmap(compiled.apply, in_axes=(None, 0, 0, 0)), in_axes=(0, None, None, None)))
    totals, comps = nested(weights, prev, act, curr)
    assert totals.shape == (3, len(names)) and comps.shape == (3, len(names), 2)
    for i, (wp, ws) in enumerate(np.asarray(weights)):
        np.testing.assert_allclose(totals[i], reference(prev, act, curr, wp, ws)[0], rtol=1e-5, atol=1e-4)


def test_gradient_wrt_weights_is_exact_and_vmaps_over_candidates(compiled):
    prev, act, curr, _ = synthetic_batch()
    _, progress, slip = reference(prev, act, curr)

    def mean_return(w):
        return compiled.apply(w, prev, act, curr)[0].mean()

    grad = jax.jit(jax.grad(mean_return))(jnp.asarray([1.0, 2.0]))
    np.testing.assert_allclose(grad, [progress.mean(), -slip.mean()], rtol=1e-5)
    grads = jax.vmap(jax.grad(mean_return))(jnp.ones((4, 2)))
    np.testing.assert_allclose(grads, np.tile([progress.mean(), -slip.mean()], (4, 1)), rtol=1e-5)
    # Through the dict interface too (weight tuning will use it).
    g = jax.grad(lambda w: compiled(view(progress=100.0), action(), view(progress=104.0), {"w_progress": w})[0])(3.0)
    assert float(g) == pytest.approx(4.0)


def test_save_and_load_give_the_same_reward_without_the_sandbox(compiled, tmp_path, monkeypatch):
    path = compiled.save(tmp_path / "reward.jaxreward")
    monkeypatch.setattr(sandbox, "build_in_sandbox", lambda *a, **k: pytest.fail("the sandbox was used"))
    loaded = load_reward(path)
    assert loaded.name == "reward" and loaded.component_names == ("progress", "slip")
    assert loaded.params == {"w_progress": 1.0, "w_slip": 2.0} and loaded.sha256 == compiled.sha256
    assert loaded.source == SOURCE  # kept as a record; never executed
    prev, act, curr, _ = synthetic_batch()
    np.testing.assert_array_equal(jax.jit(loaded.apply)(jnp.ones(2), prev, act, curr)[0],
                                  jax.jit(compiled.apply)(jnp.ones(2), prev, act, curr)[0])


def test_an_artifact_saved_by_an_earlier_jaxrace_loads_and_agrees_with_todays_build(compiled):
    """Run directories store artifacts: one saved at an earlier commit must load without the
    sandbox and give today's build's values (nested vmap over candidates) and gradients."""
    old = load_reward(SAVED_ARTIFACT)
    assert old.artifact.version == 1 and compiled.artifact.version == 2  # a separate forward and VJP, then one
    assert RewardArtifact.from_bytes(old.artifact.to_bytes()).weights_vjp == old.artifact.weights_vjp  # saved as read
    assert old.sha256 == compiled.sha256 and old.component_names == compiled.component_names
    assert old.params == compiled.params
    prev, act, curr, _ = synthetic_batch()
    weights = jnp.asarray([[1.0, 2.0], [0.5, 0.0], [2.0, 10.0]], jnp.float32)
    results = []
    for reward in (old, compiled):
        values = jax.jit(jax.vmap(reward.apply, in_axes=(0, None, None, None)))(weights, prev, act, curr)
        grads = jax.jit(jax.vmap(jax.grad(lambda w, r=reward: r.apply(w, prev, act, curr)[0].mean())))(weights)
        results.append((values, grads))
    (old_values, old_grads), (values, grads) = results
    np.testing.assert_allclose(old_values[0], values[0], rtol=1e-6)  # a later jax may lower differently
    np.testing.assert_allclose(old_values[1], values[1], rtol=1e-6)
    np.testing.assert_allclose(old_grads, grads, rtol=1e-6)
    assert np.abs(np.asarray(grads)).max() > 0


def test_the_call_validation_uses_gives_the_callers_values_and_gradients(compiled):
    """The sandbox validates through `load_call(vmappable=False)` (no batching rule to
    trace): it must agree bit for bit with the caller's vmappable call."""
    from jaxrace.rewards.artifact import load_call

    prev, act, curr, _ = synthetic_batch()
    w = jnp.asarray([0.7, 3.0], jnp.float32)
    outs = []
    for call in (load_call(compiled.artifact), load_call(compiled.artifact, vmappable=False)):
        grad = jax.grad(lambda w, call=call: call(w, prev, act, curr)[0].sum())
        outs.append(jax.jit(lambda w, call=call, grad=grad: (call(w, prev, act, curr), grad(w)))(w))
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1]), strict=True):
        np.testing.assert_array_equal(a, b)


def _rezip(data: bytes, **replace) -> bytes:
    members = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for name in z.namelist():
            members[name] = z.read(name)
    members.update(replace)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, content in members.items():
            z.writestr(name, content)
    return out.getvalue()


def test_a_forward_call_compiles_without_the_vjps_work():
    """The artifact exports the reward and its VJP as one function; a forward call passes
    zero cotangents, and XLA must drop the VJP: the compiled forward does exactly the
    in-process program's arithmetic, and the gradient's is more. (Trusted library source,
    exported in this process.)"""
    from jaxrace.rewards import build
    from jaxrace.rewards.artifact import load_call
    from jaxrace.rewards.library import LIBRARY

    source = LIBRARY["gt_sophy"]
    info = build.check_policy(build.parse_program(source))
    artifact = build.export_program(source, info, build.execute_program(source, info))
    prev, act, curr = build.tiled_validation_cases(4096)
    weights = np.asarray([v for _, v in artifact.params], np.float32)

    def flops(f):  # the transitions as arguments: closed over, XLA folds them into the module (see the README)
        return jax.jit(f).lower(weights, prev, act, curr).compile().cost_analysis()["flops"]

    exported, in_process = load_call(artifact), build.in_process_call(source)
    forward = flops(exported)
    assert forward == flops(in_process) > 0
    assert flops(jax.grad(lambda w, *t: exported(w, *t)[0].sum())) > 1.3 * forward


def test_corrupt_or_foreign_artifacts_are_refused_with_a_reason(compiled):
    data = compiled.artifact.to_bytes()
    with pytest.raises(ArtifactError, match="not a reward artifact"):
        RewardArtifact.from_bytes(b"PK\x03\x04 nonsense")
    header = json.loads(zipfile.ZipFile(io.BytesIO(data)).read("header.json"))
    header["layout"]["RaceView"] = header["layout"]["RaceView"][:-1]
    with pytest.raises(ArtifactError, match="different RaceView"):
        RewardArtifact.from_bytes(_rezip(data, **{"header.json": json.dumps(header)}))
    with pytest.raises(ArtifactError, match="do not load"):
        CompiledReward.from_artifact(_rezip(data, **{"reward.jaxexport": b"\x00" * 64}))
    header = json.loads(zipfile.ZipFile(io.BytesIO(data)).read("header.json"))
    header["version"] = 1  # a version-1 header over a version-2 zip: its two functions are missing
    with pytest.raises(ArtifactError, match="not a reward artifact: .*forward.jaxexport"):
        RewardArtifact.from_bytes(_rezip(data, **{"header.json": json.dumps(header)}))


def test_an_artifact_with_a_foreign_custom_call_is_refused_by_the_caller(compiled):
    """Defence in depth: an artifact forged outside the worker may only hold plain StableHLO.

    (JAX refuses to serialize host callbacks at all; LAPACK's eigh stands in for any
    custom call a forger could embed.)
    """
    (b,) = export.symbolic_shape("b")

    def with_custom_call(weights, *args):
        fields = args[:-2]
        m = jnp.stack([fields[0], fields[0] + 1.0], axis=-1)[..., None] * jnp.eye(2)
        total = jnp.linalg.eigh(m)[0][..., 0]
        return total, jnp.zeros(fields[0].shape + (2,), jnp.float32), jnp.zeros_like(weights)

    art = compiled.artifact
    specs = [jax.ShapeDtypeStruct((b, 2), jnp.float32)] + [
        jax.ShapeDtypeStruct((b,), np.dtype(d)) for _, d in art.layout["RaceView"] + art.layout["Action"]
        + art.layout["RaceView"]] + [jax.ShapeDtypeStruct((b,), jnp.float32), jax.ShapeDtypeStruct((b, 2), jnp.float32)]
    forged = export.export(jax.jit(with_custom_call), platforms=("cpu",))(*specs).serialize()
    bad = RewardArtifact(source=art.source, sha256=art.sha256, component_names=art.component_names,
                         params=art.params, exported=forged)
    with pytest.raises(ArtifactError, match="not a pure reward: it calls"):
        CompiledReward.from_artifact(bad)


def test_an_artifact_whose_module_is_corrupt_or_uses_a_forbidden_op_is_refused(compiled, monkeypatch):
    """The caller walks every op of the exported module: a module MLIR cannot read fails
    on load, an op on the forbidden list (here a real StableHLO module asking for the
    replica id and a token) is named, and so is an op of a dialect not on the allow-list."""
    from jaxlib.mlir.dialects import stablehlo

    import jaxrace.rewards.artifact as artifact_module

    art = compiled.artifact
    forward = export.deserialize(art.exported)
    corrupt = dataclasses.replace(forward, mlir_module_serialized=b"ML\xefR not a module").serialize()
    with pytest.raises(ArtifactError, match="exported reward does not load: ValueError"):
        CompiledReward.from_artifact(dataclasses.replace(art, exported=corrupt))
    ops = {name for name, _ in artifact_module._module_ops(forward, "exported reward")}
    assert {"func.func", "stablehlo.subtract", "stablehlo.maximum"} <= ops and not ops & artifact_module.FORBIDDEN_OPS
    forged = stablehlo.serialize_portable_artifact_str(
        "func.func public @main(%arg0: tensor<f32>) -> tensor<f32> {\n"
        "  %0 = stablehlo.replica_id : tensor<ui32>\n  %1 = stablehlo.after_all : !stablehlo.token\n"
        "  return %arg0 : tensor<f32>\n}", stablehlo.get_current_version())
    with pytest.raises(ArtifactError, match=r"exported reward is not a pure reward: it uses "
                                            r"\['stablehlo.after_all', 'stablehlo.replica_id'\]"):
        artifact_module._check_exported(dataclasses.replace(forward, mlir_module_serialized=forged), "exported "
                                        "reward", 3)
    monkeypatch.setattr(artifact_module, "ALLOWED_DIALECTS", frozenset({"builtin", "func"}))
    with pytest.raises(ArtifactError, match=r"exported reward is not a pure reward: it uses \[.*'stablehlo.subtract'"):
        CompiledReward.from_artifact(art)


def test_the_export_shortcut_gives_the_same_bytes_and_is_undone(monkeypatch):
    """`build._quick_batch_checks` skips a costly exception inside jax's export; the
    exported modules must be byte for byte those of jax's own path, and jax must be
    left as it was. (Trusted library source, so exporting in this process is fine.)"""
    import contextlib

    from jax._src.export import shape_poly

    from jaxrace.rewards import build
    from jaxrace.rewards.library import LIBRARY

    source = LIBRARY["gt_sophy"]
    info = build.check_policy(build.parse_program(source))
    fn = build.execute_program(source, info)
    original = shape_poly._evaluate_multiply
    calls = []

    def counting(v1, v2):
        calls.append(type(v1).__name__)
        return original(v1, v2)

    monkeypatch.setattr(shape_poly, "_evaluate_multiply", counting)
    quick = build.export_program(source, info, fn)
    assert shape_poly._evaluate_multiply is counting  # restored on exit
    shortcut_missed = len(calls)
    calls.clear()
    monkeypatch.setattr(build, "_quick_batch_checks", contextlib.nullcontext)
    plain = build.export_program(source, info, fn)
    assert quick.exported == plain.exported
    # jax's path evaluates b * 1 with a traced b for every one of the 59 inputs; the shortcut takes them
    assert calls.count("DynamicJaxprTracer") >= 59
    assert shortcut_missed <= len(calls) - 59


def test_the_export_shortcut_steps_aside_where_jax_lacks_its_private_names(monkeypatch):
    from jax._src.export import shape_poly

    from jaxrace.rewards import build

    monkeypatch.delattr(shape_poly, "_evaluate_multiply")
    with build._quick_batch_checks():
        assert not hasattr(shape_poly, "_evaluate_multiply")
    assert not hasattr(shape_poly, "_evaluate_multiply")


def test_the_unoptimised_validation_compile_measures_the_memory_and_values_of_an_optimised_one():
    """Validation compiles at LLVM level 0 with XLA:CPU's older fusion emitters, in one
    part (`build.VALIDATION_COMPILER_OPTIONS`): its
    temporary memory (the limit's measure) must be the optimised program's, and its values
    the same to float32 rounding. (Trusted library source, exported in this process.)"""
    from jaxrace.rewards import build
    from jaxrace.rewards.artifact import load_call
    from jaxrace.rewards.library import LIBRARY

    source = LIBRARY["gt_sophy"]
    info = build.check_policy(build.parse_program(source))
    fn = build.execute_program(source, info)
    artifact = build.export_program(source, info, fn)
    prev, act, curr, _, _ = build.validation_cases()
    weights = np.asarray([v for _, v in artifact.params], np.float32)
    tiled = [build._tile(x, 4096) for x in (prev, act, curr)]
    one = [build._one(x, slice(0, 1)) for x in (prev, act, curr)]
    both = build.validation_function(load_call(artifact))
    results = []
    for compile_ in (jax.stages.Lowered.compile, build.compile_for_validation):
        compiled = compile_(jax.jit(both).lower(weights, tiled, one))
        results.append((compiled.memory_analysis().temp_size_in_bytes, jax.device_get(compiled(weights, tiled, one))))
    (optimised_temp, optimised), (validation_temp, validation) = results
    assert validation_temp == optimised_temp > 0
    for a, b in zip(jax.tree.leaves(optimised), jax.tree.leaves(validation), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_validation_compiles_with_xlas_defaults_where_an_option_is_unknown(monkeypatch):
    """A later XLA may drop one of `VALIDATION_COMPILER_OPTIONS`: XLA refuses a compile
    with an unknown option outright, which would refuse every program."""
    from jaxrace.rewards import build

    lowered = jax.jit(lambda x: x * 2.0).lower(np.float32(1.5))
    monkeypatch.setattr(build, "VALIDATION_COMPILER_OPTIONS", {"xla_no_such_option_anywhere": True})
    with pytest.raises(jax.errors.JaxRuntimeError, match="No such compile option"):
        lowered.compile(build.VALIDATION_COMPILER_OPTIONS)
    assert float(build.compile_for_validation(lowered)(np.float32(1.5))) == 3.0


def test_a_build_runs_the_program_once_for_the_export_of_the_reward_and_its_vjp():
    """One trace (`build.trace_forward`) gives the component names and the jaxpr that the
    export replays under the VJP: exporting must not run the program again. (Trusted library source,
    in this process.)"""
    from jaxrace.rewards import build
    from jaxrace.rewards.library import LIBRARY

    source = LIBRARY["gt_sophy"]
    info = build.check_policy(build.parse_program(source))
    program = build.execute_program(source, info)
    calls = []

    def counted(*args):
        calls.append(1)
        return program(*args)

    forward = build.trace_forward(source, info, counted)
    assert calls == [1]  # vmap traces the program once, for the names and the computation
    assert forward.names == ("progress", "off_course", "wall", "slip", "passing", "collision", "rear_end",
                             "near_miss", "push")  # the program's order, not sorted
    artifact = build.export_program(source, info, counted, forward)
    assert calls == [1]
    assert artifact.exported == build.export_program(source, info, program).exported
    assert artifact.component_names == forward.names
    again = build.trace_forward(source, info, build.execute_program(source, info))
    assert again.text == forward.text and again.names == forward.names and "f32[b,10]" in forward.text


def test_every_trace_of_the_forward_checks_its_outputs_and_keeps_the_first_traces_names():
    """No components is an answer too: a later trace that adds one (or returns text) is refused.
    (A stateful Python function stands in for what the policy keeps programs from doing.)"""
    from jaxrace.rewards import build
    from jaxrace.rewards.errors import RewardCompileError

    info = build.check_policy(build.parse_program("def reward(prev, action, curr):\n    return curr.speed, {}\n"))
    answers = iter([{}, {"extra": 1.0}, {}])

    def changing(prev, action, curr):
        return curr.speed, next(answers)

    names: list[str] = []
    forward = build.forward_function(changing, info, names)
    prev, act, curr, _, _ = build.validation_cases()
    fields = [*jax.tree.leaves(prev), *jax.tree.leaves(act), *jax.tree.leaves(curr)]
    weights = np.zeros((len(fields[0]), 0), np.float32)
    jax.make_jaxpr(lambda *a: forward(*a))(weights, *fields)  # a new function each time: no trace cache
    assert names == []
    with pytest.raises(RewardCompileError, match=r"component names changed between traces \(\[\] then \['extra'\]\)"):
        jax.make_jaxpr(lambda *a: forward(*a))(weights, *fields)
    with pytest.raises(RewardCompileError, match="the total reward must be a scalar"):
        build.forward_function(lambda p, a, c: ("fast", {}), info, ["x"])(np.zeros((1, 0), np.float32),
                                                                          *[f[:1] for f in fields])


def test_exported_functions_whose_inputs_do_not_match_the_header_are_refused(compiled):
    """A forged artifact whose weights input disagrees with its PARAMS, or whose header's
    version is not the integer this jaxrace reads, fails on load with a reason, not at the first call."""
    (b,) = export.symbolic_shape("b")
    art = compiled.artifact
    dtypes = [np.dtype(d) for _, d in art.layout["RaceView"] + art.layout["Action"] + art.layout["RaceView"]]

    def three_weights(weights, *args):
        return args[0] * weights[:, 0], jnp.zeros(args[0].shape + (2,), jnp.float32), jnp.zeros_like(weights)

    specs = [jax.ShapeDtypeStruct((b, 3), jnp.float32)] + [jax.ShapeDtypeStruct((b,), d) for d in dtypes] + [
        jax.ShapeDtypeStruct((b,), jnp.float32), jax.ShapeDtypeStruct((b, 2), jnp.float32)]
    forged = export.export(jax.jit(three_weights), platforms=("cpu",))(*specs).serialize()
    with pytest.raises(ArtifactError, match=r"exported reward takes 59 inputs .*\('b', '3'\).* of a reward with 2 "
                                            r"PARAMS"):
        CompiledReward.from_artifact(dataclasses.replace(art, exported=forged))
    header = json.loads(zipfile.ZipFile(io.BytesIO(art.to_bytes())).read("header.json"))
    for version in (True, "2", 0, 3):
        header["version"] = version
        with pytest.raises(ArtifactError, match="unsupported artifact format"):
            RewardArtifact.from_bytes(_rezip(art.to_bytes(), **{"header.json": json.dumps(header)}))


FIELDS_SOURCE = '''
PARAMS = {"w": 1.0}


def reward(prev, action, curr, params):
    parts = {
        "prev_rank": prev.rank * 1.0, "curr_laps": curr.laps * 1.0, "prev_num_cars": prev.num_cars * 1.0,
        "prev_on_kerb": jnp.where(prev.on_kerb, 1.0, 0.0), "curr_finished": jnp.where(curr.finished, 1.0, 0.0),
        "curr_wall_contact": jnp.where(curr.wall_contact, 1.0, 0.0), "steering": action.steering,
        "curr_speed": curr.speed,
    }
    return params["w"] * parts["curr_speed"], parts
'''


def test_int_bool_and_float_fields_of_prev_action_and_curr_reach_the_program_in_place():
    """The export takes 56 field inputs in layout order; every one must arrive as itself."""
    reward = compile_reward(FIELDS_SOURCE, name="fields")
    prev, act, curr, _ = synthetic_batch()
    _, comps = jax.jit(reward)(prev, act, curr)
    expected = {"prev_rank": prev.rank, "curr_laps": curr.laps, "prev_num_cars": prev.num_cars,
                "prev_on_kerb": prev.on_kerb, "curr_finished": curr.finished, "curr_wall_contact": curr.wall_contact,
                "steering": act.steering, "curr_speed": curr.speed}
    assert reward.component_names == tuple(expected)
    for name, values in expected.items():
        np.testing.assert_array_equal(comps[name], np.asarray(values, np.float32), err_msg=name)
