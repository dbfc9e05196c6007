import ast
import functools
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrace
from jaxrace import jit as jit_module
from jaxrace.agents import NetworkConfig, TrainConfig, runner
from jaxrace.jit import CPU_COMPILER_OPTIONS, DEFAULTS_ENV, compiler_options, jit


@pytest.fixture
def fresh_options(monkeypatch):
    """`compiler_options` decided again in the test (on a CPU, not turned off), and again after it."""
    if jax.default_backend() != "cpu":
        pytest.skip("the options are XLA:CPU's")
    monkeypatch.delenv(DEFAULTS_ENV, raising=False)
    compiler_options.cache_clear()
    yield
    compiler_options.cache_clear()


def test_the_options_apply_on_a_cpu_where_xla_knows_them(fresh_options):
    assert compiler_options() == CPU_COMPILER_OPTIONS


@pytest.mark.parametrize(("value", "defaults"), [("1", True), ("true", True), ("0", False), ("false", False)])
def test_xla_defaults_when_the_user_asks(fresh_options, monkeypatch, value, defaults):
    monkeypatch.setenv(DEFAULTS_ENV, value)
    assert compiler_options() == (None if defaults else CPU_COMPILER_OPTIONS)


def test_an_option_this_xla_does_not_know_is_left_out_with_a_warning(fresh_options, monkeypatch):
    monkeypatch.setattr(jit_module, "CPU_COMPILER_OPTIONS", {**CPU_COMPILER_OPTIONS, "xla_no_such_option": 1})
    with pytest.warns(UserWarning, match=r"option\(s\) xla_no_such_option;.*without them \(with "):
        assert compiler_options() == CPU_COMPILER_OPTIONS


def test_a_value_this_xla_cannot_read_is_left_out_too(fresh_options, monkeypatch):
    monkeypatch.setattr(jit_module, "CPU_COMPILER_OPTIONS",
                        {"xla_backend_optimization_level": 1, "xla_cpu_experimental_ynn_fusion_type": "NO_SUCH_TYPE"})
    with pytest.warns(UserWarning, match="xla_cpu_experimental_ynn_fusion_type"):
        assert compiler_options() == {"xla_backend_optimization_level": 1}


def test_with_no_option_known_programs_compile_with_xla_defaults(fresh_options, monkeypatch):
    monkeypatch.setattr(jit_module, "CPU_COMPILER_OPTIONS", {"xla_no_such_option": 1, "xla_nor_this_one": 2})
    with pytest.warns(UserWarning, match=r"xla_no_such_option, xla_nor_this_one;.*\(XLA's defaults\)"):
        assert compiler_options() is None


def test_a_program_compiles_with_the_options_of_its_first_use(monkeypatch):
    """The options reach XLA's compile (an unknown one is refused there), and are read when the program
    is first used, not when it is defined (a module's programs are defined before JAX's backend starts)."""
    calls = []

    def options():
        calls.append(1)
        return {"xla_no_such_option": 1}

    monkeypatch.setattr(jit_module, "compiler_options", options)
    doubled = jit(lambda x: 2 * x)
    assert not calls
    with pytest.raises(jax.errors.JaxRuntimeError, match="No such compile option: 'xla_no_such_option'"):
        doubled(jnp.float32(1))
    assert len(calls) == 1


def test_a_program_that_renders_compiles_with_the_render_options_only(monkeypatch):
    """XLA:CPU runs the renderer slower with the older emitters and LLVM level 1: `renders` (always, or per
    call) keeps all but `RENDER_OPTIONS` off."""
    monkeypatch.setattr(jit_module, "compiler_options", lambda: {"xla_no_such_option": 1, "xla_render_option": 2})
    monkeypatch.setattr(jit_module, "RENDER_OPTIONS", ())
    assert jit_module.render_compiler_options() is None
    assert jit(jnp.negative, renders=True)(jnp.float32(2)) == -2.0  # no option reached XLA

    @functools.partial(jit, static_argnums=(0,), renders=lambda pixels, x: pixels)
    def program(pixels: bool, x):
        return -x

    assert program(True, jnp.float32(2)) == -2.0
    with pytest.raises(jax.errors.JaxRuntimeError, match="xla_no_such_option"):
        program(False, jnp.float32(2))
    with pytest.raises(jax.errors.JaxRuntimeError, match="xla_no_such_option"):
        program.lower(False, jnp.float32(2)).compile()
    program.lower(True, jnp.float32(2)).compile()

    monkeypatch.setattr(jit_module, "RENDER_OPTIONS", ("xla_render_option",))
    assert jit_module.render_compiler_options() == {"xla_render_option": 2}
    with pytest.raises(jax.errors.JaxRuntimeError, match="No such compile option: 'xla_render_option'"):
        jit(jnp.negative, renders=True)(jnp.float32(2))


def test_the_render_options_are_jaxraces_own(fresh_options):
    assert set(jit_module.RENDER_OPTIONS) <= set(CPU_COMPILER_OPTIONS)
    assert jit_module.render_compiler_options() == {k: CPU_COMPILER_OPTIONS[k] for k in jit_module.RENDER_OPTIONS}


def test_a_program_called_inside_another_trace_takes_the_callers_options(monkeypatch):
    """JAX refuses compile options on a nested jit: inside jit, vmap, grad or make_jaxpr a program is
    traced into the caller's, with traced arguments or with constants only."""
    monkeypatch.setattr(jit_module, "compiler_options", lambda: dict(CPU_COMPILER_OPTIONS))
    cubed = jit(lambda x: x ** 3)
    assert cubed(jnp.float32(2)) == 8.0
    assert list(cubed._programs) == ["cpu"]  # top level: with the options
    assert float(jax.jit(lambda x: cubed(x) + 1)(jnp.float32(2))) == 9.0
    two = np.float32(2)  # no tracer among the arguments: JAX's refusal is the sign
    other = jit(lambda x: x ** 3)
    assert float(jax.jit(lambda x: x + other(two))(jnp.float32(1))) == 9.0
    assert set(other._programs) == {"cpu", "nested"}  # tried with the options, then without
    np.testing.assert_array_equal(jax.vmap(cubed)(jnp.arange(3.0)), [0.0, 1.0, 8.0])
    assert float(jax.grad(cubed)(jnp.float32(2))) == 12.0
    assert "integer_pow" in str(jax.make_jaxpr(cubed)(jnp.float32(2)))


def test_a_pixel_actors_training_programs_render():
    for actor_input, renders in (("pixels", True), ("state", False)):
        job = SimpleNamespace(config=TrainConfig(network=NetworkConfig(actor_input=actor_input)))
        assert runner._renders(job) is renders


def test_a_wrapped_program_is_jax_jit_with_its_arguments():
    @functools.partial(jit, static_argnums=(1,), donate_argnums=(0,))
    def scaled(x, times: int):
        """x * times."""
        return x * times

    assert scaled.__name__ == "scaled" and scaled.__doc__ == "x * times."
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(scaled(jnp.arange(4.0), 3), np.arange(4.0) * 3)
    scaled(jnp.arange(4.0), 3)
    assert scaled._cache_size() == 1  # compiled once for two calls
    scaled(x, 2)
    assert scaled._cache_size() == 2  # a new static argument is a new program
    scaled.clear_cache()
    assert scaled._cache_size() == 0
    assert x.is_deleted()  # donated
    assert "mul" in scaled.lower(jnp.arange(4.0), 5).as_text()
    assert jit()(jnp.negative)(jnp.float32(2)) == -2.0  # @jit() as well as @jit


def _is_jax_jit(node: ast.AST) -> bool:
    """`jax.jit`, or `from jax import jit`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "jit" and isinstance(node.value, ast.Name) and node.value.id == "jax"
    return isinstance(node, ast.ImportFrom) and node.module == "jax" and any(a.name == "jit" for a in node.names)


def test_every_program_jaxrace_compiles_goes_through_jaxrace_jit():
    """`jax.jit` appears in jaxrace's code only where a program needs other options: the sandbox's
    reward build (its validation compiles at level 0; its exports are not compiled there)."""
    root = Path(jaxrace.__file__).parent
    allowed = {"jit.py", "rewards/build.py"}
    found = [f"{path.relative_to(root)}:{node.lineno}" for path in sorted(root.rglob("*.py"))
             if str(path.relative_to(root)) not in allowed
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if _is_jax_jit(node)]
    assert not found, f"jax.jit outside jaxrace.jit: {found}"


def test_jaxraces_programs_keep_ynnpack_out_of_their_fusions(fresh_options):
    """Dots and fusions XLA:CPU would hand to YNNPACK stay XLA's own in jaxrace's programs (the trainer's
    updates ran 44% faster so: experiments/bench_cpu_library_fusions.py); a plain jax.jit is untouched."""
    def program(a, b):
        return jnp.sum(jnp.tanh(a @ b) ** 2, axis=1)

    a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    if "__ynn_fusion" not in jax.jit(program).lower(a, b).compile().as_text():
        pytest.skip("this XLA:CPU does not hand this program to YNNPACK by default")
    assert "__ynn_fusion" not in jit(program).lower(a, b).compile().as_text()
