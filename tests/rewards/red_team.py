"""Attacks on the reward compiler, and a runner that tries them in a child process.

`python red_team.py DUMP_DIR NAME...` compiles each named attack in this (child)
process, then checks that the caller is unharmed: JAX's gradients and primitives
unchanged, a live array intact, nothing written to DUMP_DIR, its memory not grown by
the program's data; programs that compile must give finite, identical rewards across
batch sizes and calls. It prints one JSON line per attack. `test_red_team.py` runs it.
"""

from __future__ import annotations


def program(body: str, header: str = "", params: bool = False) -> str:
    signature = "def reward(prev, action, curr, params):\n" if params else "def reward(prev, action, curr):\n"
    return header + signature + "".join(f"    {line}\n" for line in body.splitlines())


HONEST = '''"""An honest program in the style LLMs write."""
VERSION = "2"  # a string constant at module level is allowed
MAX_SPEED: float = 80.0
WEIGHTS = (1.0, 0.5, 0.25)
PARAMS = {"w_progress": 1.0, "w_slip": 2.0}


def _penalty(value: float, threshold: float = 0.13) -> float:
    """Penalty beyond a threshold."""
    return jnp.maximum(value - threshold, 0.0)


def _speed_term(view: RaceView) -> jax.Array:
    scale = math.sqrt(2.0) / MAX_SPEED
    return jnp.clip(view.speed * scale, 0.0, 2.0)


def reward(prev: RaceView, action: Action, curr: RaceView, params: dict) -> tuple[jax.Array, dict[str, jax.Array]]:
    progress = curr.progress - prev.progress
    slip = params["w_slip"] * _penalty(curr.tyre_slip)
    terms = []
    for i in range(3):
        terms.append(WEIGHTS[i] * _speed_term(curr))
    smooth = sum(terms) / len(terms)
    total: jax.Array = params["w_progress"] * progress - slip + smooth
    return total, {"progress": progress, "slip": slip, "smooth": smooth}
'''

# name -> (source, expected): "refused:<stage>:<fragment>" or "harmless".
ATTACKS = {
    "relu defjvp at module level": (
        "X = jax.nn.relu.defjvp(lambda p, t: (jax.nn.relu.fun(p[0]), t[0] * 0.0))\n" + program("return curr.speed, {}"),
        "refused:policy:"),
    "relu defjvp inside the reward": (
        program("jax.nn.relu.defjvp(lambda p, t: (p[0], t[0] * 0.0))\nreturn curr.speed, {}"),
        "refused:policy:relu.defjvp` is not allowed"),
    "def_impl through .trace": (
        program("jnp.sin.trace(1.0).jaxpr.eqns[0].primitive.def_impl(lambda x: 42.0)\nreturn curr.speed, {}"),
        "refused:policy:"),
    "live arrays through .device": (
        program("n = len(jnp.zeros(()).device.client.live_arrays())\nreturn curr.speed + n, {}"),
        "refused:policy:`.device` is not allowed"),
    "xla_dump_to through .lower().compile()": (
        program('c = jnp.cos.lower(1.0).compile(compiler_options={"xla_dump_to": "DUMP"})\nreturn curr.speed, {}'),
        "refused:policy:`jnp.cos.lower` is not allowed"),
    "am I the caller, then parseFile": (
        program("alive = len(jnp.zeros(()).device.client.live_arrays()) > 0\n"
                "m = jax.extend.mlir.parseFile('/nonexistent') if alive else 0\nreturn curr.speed, {}"),
        "refused:policy:"),
    "state through a module-level list": (
        "CACHE = []\n" + program("seen = CACHE\nseen.append(1.0)\nreturn curr.speed * len(seen), {}"),
        "refused:policy:must be constants"),
    "state through a tuple alias": (
        "STATE = (0.0,)\n" + program("seen = STATE\nseen.append(1.0)\nreturn curr.speed * len(seen), {}"),
        "refused:trace:"),
    "mutable default argument": (
        "def count(x, acc=[]):\n    acc.append(x)\n    return len(acc)\n\n"
        + program("return curr.speed * count(1.0), {}"),
        "refused:policy:default argument values must be constants"),
    "function attribute as state": (
        program("reward.calls = 1\nreturn curr.speed, {}"), "refused:policy:assigning to attributes"),
    "validation batch seen through str": (
        program('bad = "[64]" in str(curr.speed)\nreturn jnp.where(bad, 1.0, jnp.nan) * curr.speed, {}'),
        "refused:policy:`str` is not allowed"),
    "tracing seen through str of params": (
        'PARAMS = {"w": 1.0}\n' + program('t = "Trace" in str(params["w"])\nreturn curr.speed * params["w"], {}',
                                           params=True),
        "refused:policy:`str` is not allowed"),
    "text of a value through repr": (program('r = repr(curr.speed)\nreturn curr.speed, {}'), "refused:policy:repr"),
    "text of a value through %": (program('r = "%s" % curr.speed\nreturn curr.speed, {}'), "refused:policy:%"),
    "text of a value through an f-string": (program("r = f'{curr.speed}'\nreturn curr.speed, {}"),
                                            "refused:policy:f-strings"),
    "component names from a set's order": (
        program('names = {"a", "b", "c"}\nreturn curr.speed, {k: curr.speed for k in names}'),
        "refused:policy:sets are not allowed"),
    "set() builtin": (program('names = list(set(("a", "b")))\nreturn curr.speed, {names[0]: curr.speed}'),
                      "refused:policy:sets"),
    "30000 minus signs": ("def reward(prev, action, curr):\n    return " + "-" * 30000 + "curr.speed, {}\n",
                          "refused:parse:operators in a row"),
    "16000 subscripts": (program("x = curr.speed" + "[0]" * 16000 + "\nreturn x, {}"), "refused:parse:"),
    "a lone surrogate": ("# \ud800\n" + program("return curr.speed, {}"), "refused:parse:not valid UTF-8"),
    "three long .real chains": (
        program("\n".join(f"x{i} = curr.speed" + ".real" * 3000 for i in range(3)) + "\nreturn curr.speed, {}"),
        "refused:parse:attribute chain longer than"),
    "a chain of ten attributes": (program("x = curr.speed" + ".real" * 10 + "\nreturn x, {}"),
                                  "refused:policy:an attribute chain of 11"),
    "a loop of 10**12 iterations": (
        program("x = curr.speed\nfor i in range(10 ** 12):\n    x = x + 1.0\nreturn x, {}"),
        "refused:policy:iterations"),
    "a 384 MiB module-level constant": ('X = "a" * 402653184\n' + program("return curr.speed, {}"), "harmless"),
    "dtype object escape": (program("t = jnp.float32.dtype.type\nreturn curr.speed, {}"),
                            "refused:policy:`.type` is not allowed"),
    "index helper apply": (program("x = curr.speed.at[()].apply(jnp.sin)\nreturn x, {}"),
                           "refused:policy:`.apply` is not allowed"),
    "dataclass replace": (program("v = curr.replace(speed=1.0)\nreturn v.speed, {}"),
                          "refused:policy:RaceView has no field 'replace'"),
    "a grad wrapper's attributes": (program("g = jax.grad(jnp.sin).lower\nreturn curr.speed, {}"),
                                    "refused:policy:`.lower` is not allowed"),
    "a namespace module through an alias": (program("m = jnp\nf = m.load\nreturn curr.speed, {}"),
                                            "refused:policy:`.load` is not allowed"),
    "a builtin class's methods": (program("d = dict.fromkeys(('a',), 1.0)\nreturn curr.speed, {}"),
                                  "refused:policy:`.fromkeys` is not allowed"),
    "jax.devices": (program("d = jax.devices()\nreturn curr.speed, {}"), "refused:policy:not available"),
    "the environment": (program("k = os.environ\nreturn curr.speed, {}"), "refused:policy:not defined"),
    "import numpy": ("import numpy\n" + program("return curr.speed, {}"), "refused:policy:use jnp"),
    "math.sqrt on a traced value": (program("return math.sqrt(curr.speed), {}"),
                                    "refused:trace:use jnp.sqrt"),
    "arcsin beyond its domain": (program("return jnp.arcsin(curr.lateral_accel / 25.0), {}"),
                                 "refused:validate:lateral_accel 60"),
    "sqrt of reference speed minus 20": (program("return jnp.sqrt(curr.reference_speed - 20.0), {}"),
                                         "refused:validate:reference speed near zero"),
    "log of edge margin plus 7": (program("return jnp.log(curr.edge_margin + 7.0), {}"),
                                  "refused:validate:far off course"),
    "exp of speed": (program("return jnp.exp(curr.speed) * 1e-30, {}"), "refused:validate:speed 150"),
    "float16 arithmetic": (program("return (curr.progress.astype(jnp.float16) * 2.0).astype(jnp.float32) * 0.001, {}"),
                           "refused:validate:many laps"),
    "a huge reward": (program("return curr.speed * 1e7, {}"), "refused:validate:at most 1e+06"),
    "a long component name": (program('return curr.speed, {"x" * 100: curr.speed}'),
                              "refused:validate:component names"),
    "an honest program with helpers, hints and loops": (HONEST, "harmless"),
    "a closure that collects terms": (
        program("acc = []\nfor i in range(3):\n    acc.append(curr.speed * i)\nreturn sum(acc), "
                '{"n": len(acc) * 1.0}'), "harmless"),
}


def _invariants(dump_dir: str, marker, rss_before: int) -> list[str]:
    import math
    import os

    import jax
    import numpy as np

    problems = []
    if float(jax.grad(jax.nn.relu)(1.0)) != 1.0 or float(jax.grad(jax.nn.relu)(-1.0)) != 0.0:
        problems.append("jax.nn.relu's gradient changed")
    if not math.isclose(float(jax.lax.sin(0.5)), math.sin(0.5), rel_tol=1e-6):
        problems.append("jax.lax.sin changed")
    if marker.is_deleted() or not np.array_equal(np.asarray(marker), np.arange(5.0)):
        problems.append("an array of the caller was touched")
    if os.listdir(dump_dir):
        problems.append(f"files were written: {os.listdir(dump_dir)}")
    grown = _rss() - rss_before
    if grown > 200 << 20:
        problems.append(f"the caller's memory grew by {grown >> 20} MiB")
    return problems


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _check_compiled(compiled) -> list[str]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrace.rewards.synthetic import synthetic_batch

    prev, action, curr, _ = synthetic_batch()
    full = jax.jit(jax.vmap(compiled))(prev, action, curr)[0]
    again = jax.jit(jax.vmap(compiled))(prev, action, curr)[0]
    one = compiled(*(jax.tree.map(lambda x: x[:1], b) for b in (prev, action, curr)))[0]
    problems = []
    if not bool(jnp.all(jnp.isfinite(full))):
        problems.append("non-finite rewards in the caller")
    if not np.array_equal(full, again):
        problems.append("rewards differ between calls")
    if not np.allclose(one, full[:1], rtol=1e-6):
        problems.append("rewards differ between batch sizes")
    return problems


def run(dump_dir: str, names: list[str]) -> None:
    import json
    import sys
    import time

    import jax.numpy as jnp

    from jaxrace.rewards import RewardCompileError, compile_reward

    marker = jnp.arange(5.0)
    compile_reward(program("return curr.speed, {}"))  # start the worker before measuring memory
    for name in names:
        print(json.dumps({"start": name}), flush=True)
        source = ATTACKS[name][0].replace("DUMP", dump_dir)
        rss_before = _rss()
        t = time.perf_counter()
        result = {"name": name}
        try:
            compiled = compile_reward(source, name="attack")
            result.update(outcome="compiled", problems=_check_compiled(compiled))
        except RewardCompileError as e:
            result.update(outcome="refused", stage=e.stage, message=e.message, problems=[])
        except BaseException as e:  # noqa: BLE001 (the attack made compile_reward raise something else)
            result.update(outcome="escaped", message=f"{type(e).__name__}: {e}"[:300], problems=[])
        result["seconds"] = round(time.perf_counter() - t, 3)
        result["problems"] += _invariants(dump_dir, marker, rss_before)
        print(json.dumps(result), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    import sys

    run(sys.argv[1], sys.argv[2:])
