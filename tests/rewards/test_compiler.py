"""The reward compiler: stages, hostile programs, the mistakes LLMs make."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrace.rewards.build as build
import jaxrace.rewards.sandbox as sandbox
from jaxrace.rewards import CompiledReward, RewardCompileError, compile_reward, compile_rewards
from jaxrace.rewards.synthetic import action, synthetic_batch, view

GOOD = '''
"""Progress minus a slip penalty."""
PARAMS = {"w_progress": 1.0, "w_slip": 2.0}


def slip_penalty(v, w):
    return w * jnp.maximum(v.tyre_slip - 0.13, 0.0)


def reward(prev, action, curr, params):
    progress = curr.progress - prev.progress
    slip = slip_penalty(curr, params["w_slip"])
    total = params["w_progress"] * progress - slip
    return total, {"progress": progress, "slip": slip}
'''


def program(body: str, header: str = "") -> str:
    return header + "def reward(prev, action, curr):\n" + "".join(f"    {line}\n" for line in body.splitlines())


def test_a_good_program_compiles_with_names_params_and_hash():
    r = compile_reward(GOOD, name="good")
    assert isinstance(r, CompiledReward)
    assert r.name == "good" and r.component_names == ("progress", "slip")
    assert r.params == {"w_progress": 1.0, "w_slip": 2.0}
    assert r.source == GOOD and len(r.sha256) == 64
    prev, curr = view(progress=100.0), view(progress=104.0, tyre_slip=0.23)
    total, comps = r(prev, action(), curr)
    assert total.dtype == jnp.float32 and total.shape == ()
    np.testing.assert_allclose(total, 4.0 - 2.0 * 0.1, rtol=1e-5)
    np.testing.assert_allclose(comps["slip"], 0.2, rtol=1e-5)
    # PARAMS change the result without recompiling the source.
    total2, _ = r(prev, action(), curr, {"w_progress": 0.5})
    np.testing.assert_allclose(total2, 2.0 - 0.2, rtol=1e-5)
    with pytest.raises(KeyError, match="no PARAMS"):
        r(prev, action(), curr, {"w_nope": 1.0})


def test_compiled_reward_jits_and_vmaps_and_traces_once():
    r = compile_reward(GOOD, name="good")
    prev, act, curr, _ = synthetic_batch()
    traces = []

    def f(p, a, c):
        traces.append(1)
        return r(p, a, c)

    batched = jax.jit(jax.vmap(f))
    t1, _ = batched(prev, act, curr)
    t2, _ = batched(prev, act, curr)
    assert t1.shape == (prev.speed.shape[0],) and np.all(np.isfinite(t1))
    np.testing.assert_array_equal(t1, t2)
    assert len(traces) == 1


def test_a_4_argument_program_without_params_and_a_3_argument_one_both_work():
    r3 = compile_reward(program("return curr.speed, {}"))
    r4 = compile_reward("def reward(prev, action, curr, params):\n    return curr.speed * 2.0, {}\n")
    assert r3.params == {} and r4.params == {}
    assert float(r3(view(), action(), view(speed=10.0))[0]) == 10.0
    assert float(r4(view(), action(), view(speed=10.0))[0]) == 20.0


def test_integer_and_bool_components_become_float32():
    r = compile_reward(program('return curr.speed, {"rank": curr.rank, "off": curr.off_course}'))
    _, comps = r(view(), action(), view(rank=2, off_course=True))
    assert comps["rank"].dtype == jnp.float32 and float(comps["rank"]) == 2.0 and float(comps["off"]) == 1.0


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail the test if a program gets past the policy stage (to the sandbox or exec)."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the program was executed")

    monkeypatch.setattr(sandbox, "build_in_sandbox", forbidden)
    monkeypatch.setattr(build, "execute_program", forbidden)


HOSTILE_STATIC = {
    "import": ("import os\n" + program("return curr.speed, {}"), "parse|policy", "imports are not allowed"),
    "from import": ("from os import system\n" + program("return curr.speed, {}"), "policy", "imports"),
    "__import__": (program("os = __import__('os')\nreturn curr.speed, {}"), "policy", "'__'"),
    "dunder escape": (program("k = ().__class__.__bases__[0].__subclasses__()\nreturn curr.speed, {}"), "policy",
                      "'_'"),
    "getattr trick": (program("k = getattr(curr, '__cla' + 'ss__')\nreturn curr.speed, {}"), "policy",
                      "getattr"),
    "format attribute": (program("s = '{0.__class__}'.format(curr)\nreturn curr.speed, {}"), "policy", "format"),
    "format_map": (program("s = '{x.__class__}'.format_map({'x': curr})\nreturn curr.speed, {}"), "policy",
                   "format_map"),
    "f-string dunder": (program("s = f'{curr.__class__}'\nreturn curr.speed, {}"), "policy", "f-strings"),
    "pure_callback": (program("x = jax.pure_callback(lambda v: v, curr.speed, curr.speed)\nreturn x, {}"),
                      "policy", "host callbacks"),
    "jax.debug": (program("jax.debug.print('{}', curr.speed)\nreturn curr.speed, {}"), "policy", "debug"),
    "io_callback": (program("x = jax.experimental.io_callback(print, None)\nreturn curr.speed, {}"), "policy",
                    "jax.experimental"),
    "open": (program("open('/tmp/jaxrace_pwned', 'w')\nreturn curr.speed, {}"), "policy", "file access"),
    "eval": (program("x = eval('1 + 1')\nreturn curr.speed, {}"), "policy", "dynamic code"),
    "exec": (program("exec('x = 1')\nreturn curr.speed, {}"), "policy", "dynamic code"),
    "globals": (program("globals()['jnp'] = None\nreturn curr.speed, {}"), "policy", "reflection"),
    "vars": (program("d = vars(curr)\nreturn curr.speed, {}"), "policy", "reflection"),
    "type": (program("t = type(curr)\nreturn curr.speed, {}"), "policy", "reflection"),
    "print": (program("print(curr)\nreturn curr.speed, {}"), "policy", "host output"),
    "breakpoint": (program("breakpoint()\nreturn curr.speed, {}"), "policy", "debugger"),
    "while": (program("while True:\n    pass\nreturn curr.speed, {}"), "policy", "while"),
    "global": ("X = 1.0\n" + program("global X\nX = 2.0\nreturn curr.speed, {}"), "policy", "global"),
    "global mutation": ("CACHE = []\n" + program("CACHE.append(curr.speed)\nreturn curr.speed, {}"), "policy",
                        "must be constants"),
    "global item mutation": ('STATE = {"n": 0.0}\n' + program('STATE["n"] = curr.speed\nreturn curr.speed, {}'),
                             "policy", "must be constants"),
    "attribute assignment": (program("jnp.where = None\nreturn curr.speed, {}"), "policy", "attributes"),
    "class": ("class A:\n    pass\n" + program("return curr.speed, {}"), "policy", "classes"),
    "try": (program("try:\n    x = 1\nexcept Exception:\n    x = 2\nreturn curr.speed, {}"), "policy", "try"),
    "lax.while_loop": (program("x = lax.while_loop(lambda c: True, lambda c: c, 0.0)\nreturn x, {}"), "policy",
                       "not available"),
    "jnp.load": (program("x = jnp.load('/etc/passwd')\nreturn curr.speed, {}"), "policy", "not available"),
    "random": (program("x = random.random()\nreturn curr.speed, {}"), "policy", "deterministic"),
    "time": (program("x = time.time()\nreturn curr.speed, {}"), "policy", "clock"),
    "module-level call": ("open('/tmp/jaxrace_pwned', 'w')\n" + program("return curr.speed, {}"), "policy",
                          "file access"),
    "decorator": ("def d(f):\n    return f\n@d\n" + program("return curr.speed, {}"), "policy", "decorators"),
    "lambda default escape": (program("f = lambda x=curr: x.__dict__\nreturn curr.speed, {}"), "policy", "'_'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_STATIC))
def test_hostile_programs_are_rejected_before_anything_runs(case, nothing_runs, tmp_path):
    source, stages, fragment = HOSTILE_STATIC[case]
    with pytest.raises(RewardCompileError) as info:
        compile_reward(source)
    assert info.value.stage in stages.split("|"), info.value
    assert fragment in info.value.message, info.value
    assert info.value.lineno is not None
    assert not os.path.exists("/tmp/jaxrace_pwned")


def test_a_program_that_traces_for_ever_is_stopped_by_the_cpu_or_time_limit():
    # Each loop passes the policy (256 iterations); nested, they unroll 16.7 million steps.
    loops = "x = curr.speed\nfor i in range(256):\n    for j in range(256):\n        for k in range(256):\n" \
            "            x = x + 1.0\nreturn x, {}"
    with pytest.raises(RewardCompileError, match="SIGXCPU|timed out") as info:
        compile_reward(program(loops), timeout_s=2)
    assert info.value.stage == "trace"
    # The worker forks a fresh child per program, so the next program is unaffected.
    assert compile_reward(program("return curr.speed * 3.0, {}")).component_names == ()


def test_many_programs_compile_together_and_each_failure_stays_with_its_program():
    burn = "x = curr.speed\nfor i in range(256):\n    for j in range(256):\n        for k in range(256):\n" \
           "            x = x + 1.0\nreturn x, {}"
    sources = [GOOD, program("return curr.spd, {}"), program(burn), program("return 1.0 / curr.speed, {}"),
               program("return curr.speed * 2.0, {}")]
    results = compile_rewards(sources, names=[f"p{i}" for i in range(5)], timeout_s=3)
    assert [type(r).__name__ for r in results] == ["CompiledReward", "RewardCompileError", "RewardCompileError",
                                                   "RewardCompileError", "CompiledReward"]
    assert results[1].stage == "policy" and "did you mean 'speed'" in results[1].message
    assert results[2].stage == "trace" and re.search("SIGXCPU|timed out", results[2].message)
    assert results[3].stage == "validate" and "at rest" in results[3].message
    assert (results[0].name, results[4].name) == ("p0", "p4") and results[0].component_names == ("progress", "slip")
    assert float(results[4](view(), action(), view(speed=3.0))[0]) == 6.0
    with pytest.raises(ValueError, match="2 names"):
        compile_rewards([GOOD], names=["a", "b"])


def test_an_endless_module_level_computation_is_stopped_at_execute():
    src = "X = 10 ** 10 ** 10\n" + program("return curr.speed, {}")
    with pytest.raises(RewardCompileError, match="SIGXCPU|timed out") as info:
        compile_reward(src, timeout_s=2)
    assert info.value.stage == "execute"


def test_a_huge_allocation_fails_in_the_sandbox_not_the_caller():
    src = program("z = jnp.ones((20000, 20000)) * curr.speed\nreturn jnp.sort(z.ravel())[0], {}")
    with pytest.raises(RewardCompileError, match="memory") as info:
        compile_reward(src, memory_gib=4)
    assert info.value.stage == "validate"


def test_temporary_memory_is_bounded_at_the_training_batch_size():
    # 1024 floats sorted per transition: 16 MiB of temporaries for 4096 transitions.
    src = program("z = jnp.sort(jnp.arange(1024.0) * curr.speed)\nreturn z[0] + z[-1], {}")
    with pytest.raises(RewardCompileError, match="MiB of temporary memory for a batch of 4096") as info:
        compile_reward(src, train_batch=4096, max_temp_mib=8)
    assert info.value.stage == "validate"
    assert compile_reward(src, train_batch=4096, max_temp_mib=64).component_names == ()


def test_recursion_is_reported():
    src = "def f(x):\n    return f(x)\n\n" + program("return f(curr.speed), {}")
    with pytest.raises(RewardCompileError, match="recursion") as info:
        compile_reward(src)
    assert info.value.stage == "trace" and info.value.lineno == 2


LLM_MISTAKES = {
    "python if": (program("if curr.speed > 10:\n    return 1.0, {}\nreturn 0.0, {}"), "trace", 2,
                  "jnp.where"),
    "python max": (program("r = max(curr.speed, 10.0)\nreturn r, {}"), "trace", 2, "jnp.maximum"),
    "python and": (program("bad = curr.off_course and curr.wall_contact\nreturn jnp.where(bad, -1.0, 0.0), {}"),
                   "trace", 2, "a & b"),
    "unknown field": (program("return curr.spd, {}"), "policy", 2, "RaceView has no field 'spd'; did you mean "
                      "'speed'?"),
    "unknown action field": (program("return action.throttle, {}"), "policy", 2, "Action has no field 'throttle'"),
    "field in a helper": ("def f(v: RaceView):\n    return v.sped\n\n" + program("return f(curr), {}"), "policy",
                          2, "did you mean 'speed'?"),
    "numpy": (program("return np.abs(curr.speed), {}"), "policy", 2, "use jnp"),
    "no tuple": (program("return curr.speed"), "validate", None, "must return a pair"),
    "vector total": (program("return jnp.ones(3) * curr.speed, {}"), "validate", None, "scalar"),
    "int total": (program("return curr.rank, {}"), "validate", None, "float32"),
    "vector component": (program('return curr.speed, {"v": jnp.ones(2)}'), "validate", None, "component 'v'"),
    "text component": (program('return curr.speed, {"note": "fast"}'), "validate", None,
                       "component 'note' must be a numeric scalar, got a str"),
    "long component name": (program('return curr.speed, {"x" * 65: curr.speed}'), "validate", None,
                            "printable strings of 1 to 64 characters"),
    "division by lap time": (program("return 100.0 / curr.last_lap_time, {}"), "validate", None, "last_lap_time"),
    "log of zero": (program('return curr.speed, {"log_speed": jnp.log(curr.speed)}'), "validate", None,
                    "component 'log_speed'"),
    "params undeclared": ('PARAMS = {"w": 1.0}\n' + program("return curr.speed, {}"), "policy", 2,
                          "no `params` argument"),
    "params key": ('PARAMS = {"w_speed": 1.0}\ndef reward(prev, action, curr, params):\n'
                   '    return params["w_sped"] * curr.speed, {}\n', "policy", 3, "did you mean 'w_speed'"),
    "params not literal": ('PARAMS = dict(w=1.0)\ndef reward(prev, action, curr, params):\n    return curr.speed, {}\n',
                           "policy", 1, "dict literal"),
    "no entry": ("def rew(prev, action, curr):\n    return curr.speed, {}\n", "parse", None, "def reward"),
    "two entries": (program("return 1.0, {}") + program("return 2.0, {}"), "parse", 3, "defined 2 times"),
    "syntax": (program("return curr.speed, {"), "parse", 2, "syntax error"),
    "wrong arity": ("def reward(curr):\n    return curr.speed, {}\n", "policy", 1, "def reward(prev, action, curr)"),
    "bad jnp function": (program("return jnp.maximumm(curr.speed, 1.0), {}"), "policy", 2, "jnp.maximum"),
    "type error": (program("return curr.speed + 'a', {}"), "trace", 2, "TypeError"),
}


@pytest.mark.parametrize("case", sorted(LLM_MISTAKES))
def test_typical_llm_mistakes_get_messages_that_say_how_to_fix_them(case):
    source, stage, lineno, fragment = LLM_MISTAKES[case]
    with pytest.raises(RewardCompileError) as info:
        compile_reward(source)
    e = info.value
    assert (e.stage, e.lineno) == (stage, lineno), e
    assert fragment in e.message, e
    assert len(e.message) < 400 and str(e).startswith(f"{stage} error")


def test_python_numbers_as_total_or_components_compile_as_constants():
    """A constant total or component (a Python number, not a traced array) is a scalar of its dtype."""
    reward = compile_reward(program('return 1.5, {"bonus": 2, "flag": True, "speed": curr.speed}'))
    total, comps = reward(view(speed=30.0), action(), view(speed=31.0))
    assert reward.component_names == ("bonus", "flag", "speed")
    assert (float(total), float(comps["bonus"]), float(comps["flag"]), float(comps["speed"])) == (1.5, 2.0, 1.0, 31.0)
    with pytest.raises(RewardCompileError, match="float32"):
        compile_reward(program("return 1, {}"))


def test_a_non_finite_result_names_the_case():
    with pytest.raises(RewardCompileError, match="at rest") as info:
        compile_reward(program("return 1.0 / curr.speed, {}"))
    assert "jnp.maximum" in info.value.message


def test_one_bad_program_does_not_affect_another():
    good = compile_reward(GOOD, name="g1")
    with pytest.raises(RewardCompileError):
        compile_reward(program("return 1.0 / curr.speed, {}"))
    with pytest.raises(RewardCompileError):
        compile_reward("X = 10 ** 10 ** 10\n" + program("return curr.speed, {}"), timeout_s=2)
    again = compile_reward(GOOD, name="g2")
    t1, _ = good(view(progress=100.0), action(), view(progress=110.0))
    t2, _ = again(view(progress=100.0), action(), view(progress=110.0))
    assert float(t1) == float(t2) == 10.0


def test_programs_do_not_share_module_state():
    a = compile_reward("K = 1.0\n" + program("return K * curr.speed, {}"))
    b = compile_reward("K = 2.0\n" + program("return K * curr.speed, {}"))
    assert float(a(view(), action(), view(speed=3.0))[0]) == 3.0
    assert float(b(view(), action(), view(speed=3.0))[0]) == 6.0


def test_the_build_is_deterministic_the_worker_and_a_fresh_build_export_the_same_bytes():
    src = GOOD.replace("w_slip\": 2.0", "w_slip\": 3.0")
    in_worker = compile_reward(src, name="sandboxed").artifact
    here = build.build_artifact(src)  # trusted source: the test may execute it
    assert in_worker.exported == here.exported
    assert in_worker.component_names == here.component_names and in_worker.params == here.params


def test_a_build_after_the_workers_warm_up_imports_no_module():
    # The worker forks a child per program after `warm_up`: a module that a build imports
    # would be imported again, and paid for, in every child (scipy.linalg cost 0.1-0.3 s).
    code = ("import os, sys\nfrom jaxrace.rewards.build import build_artifact, warm_up\n"
            "from jaxrace.rewards.library import LIBRARY\nwarm_up()\nthreads = len(os.listdir('/proc/self/task'))\n"
            "before = set(sys.modules)\nbuild_artifact(LIBRARY['gt_sophy'])\n"
            "print(threads, sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **sandbox.WORKER_ENV})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1 []"  # one thread (the worker can fork), nothing imported


def test_non_string_source_is_rejected():
    with pytest.raises(RewardCompileError, match="str") as info:
        compile_reward(b"def reward(prev, action, curr): pass")
    assert info.value.stage == "parse"


def test_an_artifact_cache_on_disk_skips_the_sandbox_and_a_bad_entry_is_rebuilt(tmp_path, monkeypatch):
    from jaxrace.rewards import compiler, sandbox

    source = GOOD + "\n# cached\n"  # a program no other test builds
    built = []
    real_build = sandbox.build_many
    monkeypatch.setattr(sandbox, "build_many", lambda sources, **kw: built.append(len(sources)) or real_build(
        sources, **kw))
    (first,) = compile_rewards([source], names=["a"], cache_dir=tmp_path / "cache")
    (entry,) = (tmp_path / "cache").iterdir()
    assert built == [1] and entry.suffix == ".jaxreward"
    monkeypatch.setattr(compiler, "_CACHE", {})  # as a new process: only the disk remembers
    (again,) = compile_rewards([source], names=["b"], cache_dir=tmp_path / "cache")
    assert built == [1] and again.name == "b" and again.sha256 == first.sha256
    prev, act, curr, _ = synthetic_batch()
    np.testing.assert_array_equal(jax.vmap(again)(prev, act, curr)[0], jax.vmap(first)(prev, act, curr)[0])
    entry.write_bytes(b"not an artifact")  # damaged: ignored, built again, replaced
    monkeypatch.setattr(compiler, "_CACHE", {})
    (rebuilt,) = compile_rewards([source], names=["c"], cache_dir=tmp_path / "cache")
    assert built == [1, 1] and rebuilt.sha256 == first.sha256 and entry.read_bytes() != b"not an artifact"
