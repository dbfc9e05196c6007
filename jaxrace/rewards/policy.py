"""Stage 2 of the reward compiler: an allow-list over the syntax tree (`jaxrace.rewards.parse` is stage 1).

Nothing here executes the program. The checks allow only: module level
made of a docstring, `PARAMS`, constants and function definitions; names from the
curated namespace or the program's own; attributes by allow-list (namespace members,
`RaceView`/`Action` fields, a few array and container methods); `for` loops with a
small static bound. Each refusal names the line and says how to fix it.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import math

from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.errors import RewardCompileError
from jaxrace.rewards.namespace import Module, available_names, program_namespace
from jaxrace.rewards.parse import ENTRY, annotation_nodes, strip_annotations

MAX_ATTRIBUTE_CHAIN = 6
MAX_PARAMS = 64
MAX_LOOP_ITERATIONS = 256

RACEVIEW_FIELDS = tuple(f.name for f in dataclasses.fields(RaceView))
ACTION_FIELDS = tuple(f.name for f in dataclasses.fields(Action))
# Array methods and properties, and the container methods programs use on their own lists and dicts.
ARRAY_ATTRIBUTES = (
    "astype", "shape", "ndim", "size", "dtype", "T", "at", "set", "add", "multiply", "divide", "get", "min", "max",
    "sum", "mean", "prod", "clip", "reshape", "ravel", "squeeze", "round", "all", "any", "argmax", "argmin",
    "cumsum", "std", "var",
)
CONTAINER_ATTRIBUTES = ("items", "keys", "values", "append", "extend", "update")
ALLOWED_ATTRIBUTES = frozenset(RACEVIEW_FIELDS + ACTION_FIELDS + ARRAY_ATTRIBUTES + CONTAINER_ATTRIBUTES)

_ALLOWED_NODES = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.Expr, ast.If, ast.For, ast.Break, ast.Continue, ast.Pass, ast.Name, ast.Load, ast.Store, ast.Constant,
    ast.Attribute, ast.Subscript, ast.Slice, ast.Call, ast.keyword, ast.BinOp, ast.UnaryOp, ast.BoolOp,
    ast.Compare, ast.IfExp, ast.Dict, ast.List, ast.Tuple, ast.ListComp, ast.DictComp, ast.GeneratorExp,
    ast.comprehension, ast.Lambda, ast.Starred, ast.NamedExpr, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
    ast.expr_context,
)
_IMPORT_ADVICE = "imports are not allowed: jnp (jax.numpy), jax (lax, nn) and math are already available"
_NODE_ADVICE = {
    ast.Import: _IMPORT_ADVICE,
    ast.ImportFrom: _IMPORT_ADVICE,
    ast.While: "`while` loops are not allowed (they may never end): vectorise with jnp, or use a `for` loop "
               "over a small fixed range",
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
    ast.Set: "sets are not allowed (their order changes from run to run): use a tuple",
    ast.SetComp: "set comprehensions are not allowed (their order changes from run to run): use a list",
    ast.JoinedStr: "f-strings are not allowed: a reward computes numbers, not text",
}
if hasattr(ast, "TryStar"):
    _NODE_ADVICE[ast.TryStar] = _NODE_ADVICE[ast.Try]

_HOST_NAMES = {
    "open": "file access", "exec": "dynamic code", "eval": "dynamic code", "compile": "dynamic code",
    "getattr": "reflection", "setattr": "reflection", "delattr": "reflection", "hasattr": "reflection",
    "globals": "reflection", "locals": "reflection", "vars": "reflection", "dir": "reflection",
    "type": "reflection", "object": "reflection", "super": "reflection", "isinstance": "reflection",
    "id": "reflection", "__import__": "imports", "input": "host input", "print": "host output",
    "breakpoint": "the debugger", "help": "host access", "exit": "host access", "quit": "host access",
    "memoryview": "raw memory", "classmethod": "classes", "staticmethod": "classes", "property": "classes",
    "str": "text of values", "repr": "text of values", "format": "text of values", "ascii": "text of values",
    "set": "sets (their order changes from run to run; use a tuple)", "frozenset": "sets",
}
_MISSING_NAME_ADVICE = {
    "np": "use jnp (jax.numpy) instead of np", "numpy": "use jnp (jax.numpy) instead of numpy",
    "torch": "use jnp (jax.numpy)", "random": "a reward must be deterministic: no randomness",
    "time": "a reward must not read the clock", "os": "no host access", "sys": "no host access",
    "params": "declare PARAMS = {...} at module level and take `params` as reward's 4th argument",
}
_MISSING_MEMBER_ADVICE = {
    "pure_callback": "host callbacks", "io_callback": "host callbacks", "callback": "host callbacks",
    "debug": "jax.debug makes host callbacks", "experimental": "jax.experimental is not available",
    "device_put": "device transfers", "device_get": "device transfers", "jit": "the reward is jitted for you",
    "while_loop": "unbounded loops; use a `for` loop over a small fixed range",
    "fori_loop": "loops that may run for ever; use a `for` loop over a small fixed range",
    "scan": "loops that may run for ever; use a `for` loop over a small fixed range",
    "load": "file access", "save": "file access", "fromfile": "file access",
}
_MUTATING_METHODS = frozenset({"append", "extend", "update", "insert", "pop", "remove", "clear", "setdefault"})
_CONSTANT_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


@dataclasses.dataclass(frozen=True)
class ProgramInfo:
    """What the policy stage learnt about a program without running it.

    `tree` is the program to execute: the parsed module with type annotations removed
    (they are documentation; evaluating them would run code).
    """

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


def _params_literal(node: ast.Assign) -> dict[str, float]:
    if not isinstance(node.value, ast.Dict):
        raise _error("policy", 'PARAMS must be a dict literal of numbers, e.g. PARAMS = {"w_progress": 1.0}', node)
    params = {}
    for k, v in zip(node.value.keys, node.value.values, strict=True):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)) or k.value.startswith("_"):
            raise _error("policy", "PARAMS keys must be strings that do not start with '_'", k or node)
        if len(k.value) > 64:
            raise _error("policy", "PARAMS keys must be at most 64 characters", k)
        value = v.operand if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub | ast.UAdd) else v
        if not (isinstance(value, ast.Constant) and type(value.value) in (int, float)):
            raise _error("policy", f'PARAMS["{k.value}"] must be a number literal', v)
        negative = isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub)
        number = float(-value.value if negative else value.value)
        if not math.isfinite(number) or abs(number) > 1e30:
            raise _error("policy", f'PARAMS["{k.value}"] must be a finite float32 number', v)
        if k.value in params:
            raise _error("policy", f'PARAMS has "{k.value}" twice', k)
        params[k.value] = number
    if len(params) > MAX_PARAMS:
        raise _error("policy", f"PARAMS has {len(params)} entries; at most {MAX_PARAMS}", node)
    return params


def _is_constant(node: ast.AST, constants: set[str]) -> bool:
    """A literal, a tuple of literals, or arithmetic on numbers and earlier module constants."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float | str | bool | type(None))
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, ast.Tuple):
        return all(_is_constant(e, constants) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub | ast.UAdd) and _is_constant(node.operand, constants)
    if isinstance(node, ast.BinOp):
        return (isinstance(node.op, _CONSTANT_OPERATORS) and _is_constant(node.left, constants)
                and _is_constant(node.right, constants))
    return False


def _constant_int(node: ast.AST, int_constants: dict[str, int]) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant_int(node.operand, int_constants)
        return None if inner is None else -inner
    if isinstance(node, ast.Name):
        return int_constants.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.FloorDiv | ast.Pow):
        left, right = _constant_int(node.left, int_constants), _constant_int(node.right, int_constants)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Pow):
            if right < 0:
                return None
            return left ** right if abs(left) < 2 or right * math.log2(abs(left)) < 62 else 1 << 62
        if isinstance(node.op, ast.FloorDiv):
            return None if right == 0 else left // right
        ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}
        return max(min(ops[type(node.op)](left, right), 1 << 62), -(1 << 62))
    return None


def _check_loop(node: ast.AST, iterable: ast.AST, int_constants: dict[str, int]) -> None:
    """`range(...)` needs small constant bounds; other iterables are data that already exists."""
    if not (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "range"):
        return
    bounds = [_constant_int(a, int_constants) for a in iterable.args]
    if iterable.keywords or not 1 <= len(bounds) <= 3 or None in bounds:
        raise _error("policy", "a loop over range() needs constant integer bounds, e.g. `for i in range(4)`", node)
    if len(bounds) == 3 and bounds[2] == 0:
        raise _error("policy", "range() step must not be zero", node)
    count = len(range(*bounds))
    if count > MAX_LOOP_ITERATIONS:
        raise _error("policy", f"a loop of {count} iterations; at most {MAX_LOOP_ITERATIONS} (a reward is "
                     "unrolled when traced): vectorise with jnp instead", node)


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


def _check_fields(fn: ast.FunctionDef, nodes: list[ast.AST]) -> None:
    """RaceView/Action fields read from arguments known to hold one exist (`nodes`: `fn`'s, from ast.walk)."""
    stored = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    typed = {name: kind for name, kind in _typed_args(fn).items() if name not in stored}
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in typed:
            kind, fields = typed[node.value.id]
            if node.attr not in fields:
                raise _error("policy", f"{kind} has no field '{node.attr}'{suggest(node.attr, fields)}", node)


def _check_function(fn: ast.FunctionDef | ast.Lambda, nodes: list[ast.AST], module_names: set[str],
                    constants: set[str]) -> None:
    """No decorators, constant defaults, and no module state changed (`nodes`: `fn`'s, from ast.walk)."""
    if isinstance(fn, ast.FunctionDef) and fn.decorator_list:
        raise _error("policy", "decorators are not allowed", fn)
    for default in fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None]:
        if not _is_constant(default, constants):
            raise _error("policy", "default argument values must be constants (numbers, strings, tuples): a "
                         "list or dict default would keep state between calls", default)
    if isinstance(fn, ast.Lambda):
        return
    local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    local |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    shared = module_names - local
    for node in nodes:
        target = None
        if isinstance(node, ast.Subscript | ast.Attribute) and isinstance(node.ctx, ast.Store):
            target = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _MUTATING_METHODS):
            target = node.func.value
        if isinstance(target, ast.Name) and target.id in shared:
            raise _error("policy", f"`{target.id}` is module state and must not be changed inside a function; "
                         "build a new value in a local variable instead", node)


def _check_attribute(node: ast.Attribute, namespace: dict, bound: set[str], available: frozenset[str]) -> None:
    chain, root = [], node
    while isinstance(root, ast.Attribute):
        chain.append(root.attr)
        root = root.value
    chain.reverse()
    if len(chain) > MAX_ATTRIBUTE_CHAIN:
        raise _error("policy", f"an attribute chain of {len(chain)} (`.{'.'.join(chain[:3])}...`); at most "
                     f"{MAX_ATTRIBUTE_CHAIN}", node)
    if isinstance(root, ast.Name) and root.id not in available and root.id not in bound:
        return  # the unknown name itself is reported
    obj, path = None, None
    if isinstance(root, ast.Name) and root.id in ("jnp", "jax", "lax", "math") and root.id not in bound:
        obj, path = namespace[root.id], root.id
    for attr in chain:
        if attr.startswith("_"):
            raise _error("policy", f"attributes starting with '_' are not allowed (`.{attr}`)", node)
        if isinstance(obj, Module):
            if not hasattr(obj, attr):
                why = f" ({_MISSING_MEMBER_ADVICE[attr]})" if attr in _MISSING_MEMBER_ADVICE else ""
                raise _error("policy", f"`{path}.{attr}` is not available to reward programs{why}"
                             f"{suggest(attr, vars(obj))}", node)
            obj, path = getattr(obj, attr), f"{path}.{attr}"
            continue
        if attr not in ALLOWED_ATTRIBUTES:
            where = f"`{path}.{attr}`" if path else f"`.{attr}`"
            raise _error("policy", f"{where} is not allowed: a reward may read RaceView and Action fields, call "
                         "jnp/jax/lax/math functions, and use the array methods "
                         f"{', '.join(ARRAY_ATTRIBUTES[:8])}, ...{suggest(attr, ALLOWED_ATTRIBUTES)}", node)
        obj, path = None, None


def check_policy(tree: ast.Module) -> ProgramInfo:
    """Stage 2: the allow-list. Returns the entry's arguments, the PARAMS defaults, the tree to run."""
    nodes = list(ast.walk(tree))  # the passes over the whole tree read this one walk (in its order)
    annotations = annotation_nodes(tree)
    for node in nodes:
        if id(node) in annotations:
            continue
        advice = _NODE_ADVICE.get(type(node))
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m.split(".")[0] == "numpy" for m in modules):
                advice = "`import numpy` is not allowed: use jnp (jax.numpy), already imported"
        if advice is not None:
            raise _error("policy", advice, node)
        if not isinstance(node, _ALLOWED_NODES):
            raise _error("policy", f"`{type(node).__name__}` syntax is not allowed in a reward program", node)

    function_nodes = {id(n): list(ast.walk(n)) for n in nodes if isinstance(n, ast.FunctionDef)}
    for node in nodes:
        if isinstance(node, ast.FunctionDef):
            _check_fields(node, function_nodes[id(node)])

    available = available_names()
    bound = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {n.name for n in nodes if isinstance(n, ast.FunctionDef)}
    bound |= {n.arg for n in nodes if isinstance(n, ast.arg)}
    namespace = program_namespace()
    chained = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}
    # Left to right, inner chains first, so the first attribute a reader meets is the one reported.
    order = lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0), getattr(n, "end_lineno", 0),  # noqa: E731
                       getattr(n, "end_col_offset", 0))
    for node in sorted(nodes, key=order):
        if id(node) in annotations:
            continue
        if isinstance(node, ast.Name | ast.FunctionDef | ast.arg):
            name = node.id if isinstance(node, ast.Name) else node.name if isinstance(node, ast.FunctionDef) \
                else node.arg
            if name.startswith("__"):
                raise _error("policy", f"names starting with '__' are not allowed (`{name}`)", node)
        if isinstance(node, ast.Name):
            if node.id in _HOST_NAMES and node.id not in bound:
                raise _error("policy", f"`{node.id}` is not allowed in a reward program ({_HOST_NAMES[node.id]})",
                             node)
            if isinstance(node.ctx, ast.Load) and node.id not in available and node.id not in bound:
                advice = _MISSING_NAME_ADVICE.get(node.id, "only jnp, jax, lax, math and your own names exist")
                raise _error("policy", f"name '{node.id}' is not defined: {advice}", node)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Store):
                raise _error("policy", "assigning to attributes is not allowed", node)
            if id(node) not in chained:  # check each chain once, from its outermost attribute
                _check_attribute(node, namespace, bound, available)
        elif isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            raise _error("policy", "bytes literals are not allowed", node)
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant)
              and isinstance(node.left.value, str)):
            raise _error("policy", "string formatting with % is not allowed: a reward computes numbers", node)

    module_names, constants, int_constants = set(), set(), {}
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
            if len(names) != len(targets) or node.value is None:
                raise _error("policy", "module-level assignments must give plain names a value", node)
            module_names.update(names)
            if "PARAMS" in names:
                if params_node is not None:
                    raise _error("policy", "PARAMS is assigned twice; declare it once", node)
                if not isinstance(node, ast.Assign) or len(names) != 1:
                    raise _error("policy", 'declare PARAMS as PARAMS = {"name": number, ...}', node)
                params, params_node = _params_literal(node), node
                continue
            if not _is_constant(node.value, constants):
                raise _error("policy", "module-level values must be constants (numbers, strings, tuples of them, "
                             "arithmetic on those): no calls, lists, dicts or attribute access; compute inside "
                             "a function", node)
            constants.update(names)
            value = _constant_int(node.value, int_constants)
            if value is not None:
                int_constants.update(dict.fromkeys(names, value))
            continue
        raise _error("policy", "only functions, constants, PARAMS and a docstring are allowed at module level",
                     node)

    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.Lambda):
            _check_function(node, function_nodes.get(id(node), []), module_names, constants)
        elif isinstance(node, ast.For):
            _check_loop(node, node.iter, int_constants)
        elif isinstance(node, ast.comprehension):
            _check_loop(node.iter, node.iter, int_constants)

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
    return ProgramInfo(tree=strip_annotations(tree), entry_args=tuple(x.arg for x in a.args),
                       takes_params=takes_params, params=params)
