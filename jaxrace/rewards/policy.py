"""Stages 1 and 2 of the reward compiler: parse, and an allow-list over the syntax tree.

Nothing here executes the program. The checks reject what could reach the host
(imports, dunder access, reflection, callbacks, I/O), what cannot be traced (classes,
`try`, `while`), global mutation, and the mistakes LLMs make most (unknown names and
fields), each with the line and a message that says how to fix it.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import math

from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.errors import RewardCompileError
from jaxrace.rewards.namespace import available_names, program_namespace

MAX_SOURCE_CHARS = 50_000
MAX_PARAMS = 64
ENTRY = "reward"

RACEVIEW_FIELDS = tuple(f.name for f in dataclasses.fields(RaceView))
ACTION_FIELDS = tuple(f.name for f in dataclasses.fields(Action))

_ALLOWED_NODES = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.Expr, ast.If, ast.For, ast.Break, ast.Continue, ast.Pass, ast.Name, ast.Load, ast.Store, ast.Constant,
    ast.Attribute, ast.Subscript, ast.Slice, ast.Call, ast.keyword, ast.BinOp, ast.UnaryOp, ast.BoolOp,
    ast.Compare, ast.IfExp, ast.Dict, ast.List, ast.Tuple, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp,
    ast.GeneratorExp, ast.comprehension, ast.Lambda, ast.Starred, ast.JoinedStr, ast.FormattedValue,
    ast.NamedExpr, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context,
)
_NODE_ADVICE = {
    ast.Import: "imports are not allowed: jnp, jax (lax, nn) and math are already available",
    ast.ImportFrom: "imports are not allowed: jnp, jax (lax, nn) and math are already available",
    ast.While: "`while` loops are not allowed (they may never end): vectorise with jnp, or use a `for` loop "
               "over a fixed range",
    ast.Global: "`global` is not allowed: a reward must not change module state",
    ast.Nonlocal: "`nonlocal` is not allowed: a reward must not change outer state",
    ast.ClassDef: "classes are not allowed: use functions",
    ast.Try: "`try` is not allowed: a reward must not raise; use jnp.where to handle special cases",
    ast.Raise: "`raise` is not allowed: a reward must always return a value",
    ast.Assert: "`assert` is not allowed: it cannot check traced values",
    ast.With: "`with` is not allowed",
    ast.Delete: "`del` is not allowed",
    ast.Match: "`match` is not allowed: use jnp.where",
    ast.AsyncFunctionDef: "async functions are not allowed",
    ast.Await: "`await` is not allowed",
    ast.Yield: "generators (`yield`) are not allowed",
    ast.YieldFrom: "generators (`yield from`) are not allowed",
}
if hasattr(ast, "TryStar"):
    _NODE_ADVICE[ast.TryStar] = _NODE_ADVICE[ast.Try]

_HOST_NAMES = {
    "open": "file access", "exec": "dynamic code", "eval": "dynamic code", "compile": "dynamic code",
    "getattr": "reflection", "setattr": "reflection", "delattr": "reflection", "hasattr": "reflection",
    "globals": "reflection", "locals": "reflection", "vars": "reflection", "dir": "reflection",
    "type": "reflection", "object": "reflection", "super": "reflection", "__import__": "imports",
    "input": "host input", "print": "host output", "breakpoint": "the debugger", "help": "host access",
    "exit": "host access", "quit": "host access", "memoryview": "raw memory", "id": "reflection",
    "classmethod": "classes", "staticmethod": "classes", "property": "classes",
}
_HOST_ATTRIBUTES = {
    "format": "string formatting of objects", "format_map": "string formatting of objects",
    "pure_callback": "host callbacks", "io_callback": "host callbacks", "callback": "host callbacks",
    "host_callback": "host callbacks", "debug": "jax.debug (host callbacks)",
    "experimental": "jax.experimental", "device_put": "device transfers", "device_get": "device transfers",
    "block_until_ready": "host synchronisation", "tolist": "host values", "item": "host values",
    "tobytes": "host values", "tofile": "file access", "addressable_data": "raw buffers",
    "unsafe_buffer_pointer": "raw buffers", "mro": "reflection", "gi_frame": "reflection",
    "gi_code": "reflection", "f_globals": "reflection", "f_locals": "reflection", "f_back": "reflection",
    "f_builtins": "reflection", "tb_frame": "reflection", "cr_frame": "reflection", "ag_frame": "reflection",
}
_MISSING_NAME_ADVICE = {
    "np": "use jnp (jax.numpy) instead of np", "numpy": "use jnp (jax.numpy) instead of numpy",
    "torch": "use jnp (jax.numpy)", "random": "a reward must be deterministic: no randomness",
    "time": "a reward must not read the clock", "os": "no host access", "sys": "no host access",
    "params": "declare PARAMS = {...} at module level and take `params` as reward's 4th argument",
}
_MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "sort",
    "reverse", "add", "discard",
})


@dataclasses.dataclass(frozen=True)
class ProgramInfo:
    """What the policy stage learnt about a program without running it."""

    tree: ast.Module
    entry_args: tuple[str, ...]
    takes_params: bool
    params: dict[str, float]


def _error(stage: str, message: str, node: ast.AST | None = None) -> RewardCompileError:
    return RewardCompileError(stage, message, getattr(node, "lineno", None))


def suggest(word: str, options) -> str:
    """'; did you mean 'x'?' for the closest option, or ''."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def parse_program(source: str) -> ast.Module:
    """Stage 1: parse `source`; exactly one top-level `reward` function."""
    if not isinstance(source, str):
        raise RewardCompileError("parse", f"the program must be a str of Python source, not {type(source).__name__}")
    if len(source) > MAX_SOURCE_CHARS:
        raise RewardCompileError("parse", f"the program is {len(source)} characters; at most {MAX_SOURCE_CHARS}")
    try:
        tree = ast.parse(source, mode="exec")
    except SyntaxError as e:
        raise RewardCompileError("parse", f"syntax error: {e.msg}", e.lineno) from None
    entries = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ENTRY]
    if not entries:
        raise RewardCompileError(
            "parse", "no top-level `def reward(prev, action, curr)` found: the program must define it")
    if len(entries) > 1:
        lines = ", ".join(str(n.lineno) for n in entries)
        raise RewardCompileError("parse", f"`reward` is defined {len(entries)} times (lines {lines}); "
                                 "define it once", entries[1].lineno)
    return tree


def _params_literal(node: ast.Assign) -> dict[str, float]:
    if not isinstance(node.value, ast.Dict):
        raise _error("policy", 'PARAMS must be a dict literal of numbers, e.g. PARAMS = {"w_progress": 1.0}', node)
    params = {}
    for k, v in zip(node.value.keys, node.value.values, strict=True):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)) or k.value.startswith("_"):
            raise _error("policy", "PARAMS keys must be strings that do not start with '_'", k or node)
        value = v.operand if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub) else v
        if not (isinstance(value, ast.Constant) and type(value.value) in (int, float)):
            raise _error("policy", f'PARAMS["{k.value}"] must be a number literal', v)
        number = float(-value.value if value is not v else value.value)
        if not math.isfinite(number):
            raise _error("policy", f'PARAMS["{k.value}"] must be finite', v)
        if k.value in params:
            raise _error("policy", f'PARAMS has "{k.value}" twice', k)
        params[k.value] = number
    if len(params) > MAX_PARAMS:
        raise _error("policy", f"PARAMS has {len(params)} entries; at most {MAX_PARAMS}", node)
    return params


def _bound_names(tree: ast.Module) -> set[str]:
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound


def _attribute_chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def _typed_args(fn: ast.FunctionDef) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Arguments known to hold a RaceView or an Action: the entry's by position, any by annotation."""
    typed = {}
    args = fn.args.args
    if fn.name == ENTRY and len(args) >= 3:
        typed[args[0].arg] = ("RaceView", RACEVIEW_FIELDS)
        typed[args[1].arg] = ("Action", ACTION_FIELDS)
        typed[args[2].arg] = ("RaceView", RACEVIEW_FIELDS)
    for a in args:
        if isinstance(a.annotation, ast.Name) and a.annotation.id in ("RaceView", "Action"):
            typed[a.arg] = (a.annotation.id, RACEVIEW_FIELDS if a.annotation.id == "RaceView" else ACTION_FIELDS)
    return typed


def _check_function(fn: ast.FunctionDef, module_names: set[str]) -> None:
    if fn.decorator_list:
        raise _error("policy", "decorators are not allowed", fn)
    local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    typed = {name: kind for name, kind in _typed_args(fn).items()
             if not any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
                        for n in ast.walk(fn))}
    shared = module_names - local
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in typed:
            kind, fields = typed[node.value.id]
            if node.attr not in fields:
                raise _error("policy", f"{kind} has no field '{node.attr}'{suggest(node.attr, fields)}", node)
        target = None
        if isinstance(node, ast.Subscript | ast.Attribute) and isinstance(node.ctx, ast.Store):
            target = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _MUTATING_METHODS):
            target = node.func.value
        if isinstance(target, ast.Name) and target.id in shared:
            raise _error("policy", f"`{target.id}` is module state and must not be changed inside a function; "
                         "build a new value in a local variable instead", node)


def check_policy(tree: ast.Module) -> ProgramInfo:
    """Stage 2: the allow-list. Returns the entry's arguments and the PARAMS defaults."""
    for node in ast.walk(tree):
        advice = _NODE_ADVICE.get(type(node))
        if advice is not None:
            raise _error("policy", advice, node)
        if not isinstance(node, _ALLOWED_NODES):
            raise _error("policy", f"`{type(node).__name__}` syntax is not allowed in a reward program", node)

    available = available_names()
    bound = _bound_names(tree)
    namespace = program_namespace()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id.startswith("_"):
                raise _error("policy", f"names starting with '_' are not allowed (`{node.id}`)", node)
            if node.id in _HOST_NAMES and node.id not in bound:
                raise _error("policy", f"`{node.id}` is not allowed in a reward program ({_HOST_NAMES[node.id]})",
                             node)
            if isinstance(node.ctx, ast.Load) and node.id not in available and node.id not in bound:
                advice = _MISSING_NAME_ADVICE.get(node.id, "only jnp, jax, lax, math and your own names exist")
                raise _error("policy", f"name '{node.id}' is not defined: {advice}", node)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise _error("policy", f"attributes starting with '_' are not allowed (`.{node.attr}`)", node)
            if node.attr in _HOST_ATTRIBUTES:
                raise _error("policy", f"`.{node.attr}` is not allowed in a reward program "
                             f"({_HOST_ATTRIBUTES[node.attr]})", node)
            if isinstance(node.ctx, ast.Store):
                raise _error("policy", "assigning to attributes is not allowed", node)
            chain = _attribute_chain(node)
            if chain and chain[0] in ("jnp", "jax", "lax", "math") and chain[0] not in bound:
                obj, path = namespace[chain[0]], chain[0]
                for attr in chain[1]:
                    if not hasattr(obj, attr):
                        options = [n for n in vars(obj) if not n.startswith("_")] if hasattr(obj, "__dict__") else []
                        raise _error("policy", f"`{path}.{attr}` is not available to reward programs"
                                     f"{suggest(attr, options)}", node)
                    obj, path = getattr(obj, attr), f"{path}.{attr}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            raise _error("policy", "bytes literals are not allowed", node)

    module_names = set()
    params, params_node = {}, None
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring
        if isinstance(node, ast.FunctionDef):
            module_names.add(node.name)
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if len(names) != len(targets):
                raise _error("policy", "module-level assignments must be to plain names", node)
            module_names.update(names)
            if "PARAMS" in names:
                if params_node is not None:
                    raise _error("policy", "PARAMS is assigned twice; declare it once", node)
                if not isinstance(node, ast.Assign) or len(names) != 1:
                    raise _error("policy", 'declare PARAMS as PARAMS = {"name": number, ...}', node)
                params, params_node = _params_literal(node), node
            continue
        raise _error("policy", "only functions, constants, PARAMS and a docstring are allowed at module level",
                     node)

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            _check_function(node, module_names)

    entry = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ENTRY)
    a = entry.args
    if len(a.args) == 4:  # every params["name"] in the entry must be declared
        for node in ast.walk(entry):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id == a.args[3].arg and isinstance(node.slice, ast.Constant)
                    and node.slice.value not in params):
                declared = ", ".join(params) or "nothing"
                raise _error("policy", f"params[{node.slice.value!r}] is not declared in PARAMS (it declares "
                             f"{declared}){suggest(str(node.slice.value), params)}", node)
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or len(a.args) not in (3, 4):
        raise _error("policy", "the entry point must be `def reward(prev, action, curr)` or, with PARAMS, "
                     "`def reward(prev, action, curr, params)`", entry)
    takes_params = len(a.args) == 4
    if params_node is not None and not takes_params:
        raise _error("policy", "PARAMS is declared but reward() has no `params` argument: write "
                     "`def reward(prev, action, curr, params)` and read weights as params[\"name\"]", entry)
    return ProgramInfo(tree=tree, entry_args=tuple(x.arg for x in a.args), takes_params=takes_params,
                       params=params)
