"""Stage 1 of the reward compiler: caps on the text, then parse.

Nothing here executes the program. Size, character, bracket-nesting, operator-run and
attribute-chain caps are checked on the token stream (iterative) before the recursive
parser sees the source; a parser that still gives up is reported as a
`RewardCompileError`, and so is a syntax tree nested too deep for the stages after it.
"""

from __future__ import annotations

import ast
import io
import tokenize

from jaxrace.rewards.errors import RewardCompileError

MAX_SOURCE_CHARS = 50_000
MAX_LINES = 2_000
MAX_BRACKET_DEPTH = 40
MAX_OPERATOR_RUN = 40
MAX_DOTS_IN_A_ROW = 24
MAX_TREE_DEPTH = 80
ENTRY = "reward"


def _check_text(source: str) -> None:
    """Caps a recursive parser cannot be trusted with: size, characters, nesting, operator runs."""
    if len(source) > MAX_SOURCE_CHARS:
        raise RewardCompileError("parse", f"the program is {len(source)} characters; at most {MAX_SOURCE_CHARS}")
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as e:
        line = source.count("\n", 0, e.start) + 1
        raise RewardCompileError("parse", f"the program contains a character that is not valid UTF-8 "
                                 f"({source[e.start]!a})", line) from None
    if "\x00" in source:
        raise RewardCompileError("parse", "the program contains a NUL character", source.count("\n", 0,
                                 source.index("\x00")) + 1)
    if source.count("\n") > MAX_LINES:
        raise RewardCompileError("parse", f"the program has more than {MAX_LINES} lines")
    depth = run = dots = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.OP and token.string == ".":
                dots += 1
                if dots > MAX_DOTS_IN_A_ROW:
                    raise RewardCompileError("parse", f"an attribute chain longer than {MAX_DOTS_IN_A_ROW}",
                                             token.start[0])
            elif token.type != tokenize.NAME:
                dots = 0
            if token.type == tokenize.OP and token.string in "([{":
                depth += 1
                if depth > MAX_BRACKET_DEPTH:
                    raise RewardCompileError("parse", f"brackets nested more than {MAX_BRACKET_DEPTH} deep",
                                             token.start[0])
            elif token.type == tokenize.OP and token.string in ")]}":
                depth -= 1
            unary = token.type == tokenize.OP and token.string in ("-", "+", "~", "*", "**")
            run = run + 1 if unary or (token.type == tokenize.NAME and token.string == "not") else 0
            if run > MAX_OPERATOR_RUN:
                raise RewardCompileError("parse", f"more than {MAX_OPERATOR_RUN} operators in a row", token.start[0])
    except (tokenize.TokenError, SyntaxError):
        pass  # ast.parse below reports the syntax error with its line


def _tree_depth_ok(tree: ast.AST) -> ast.AST | None:
    """The first node deeper than MAX_TREE_DEPTH, or None (iterative: no recursion)."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            return node
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return None


def parse_program(source: str) -> ast.Module:
    """Stage 1: caps, then parse `source`; exactly one top-level `reward` function."""
    if not isinstance(source, str):
        raise RewardCompileError("parse", f"the program must be a str of Python source, not {type(source).__name__}")
    _check_text(source)
    try:
        tree = ast.parse(source, mode="exec")
    except SyntaxError as e:
        raise RewardCompileError("parse", f"syntax error: {e.msg}", e.lineno) from None
    except (RecursionError, MemoryError, ValueError) as e:
        raise RewardCompileError("parse", f"the program is too deeply nested to parse ({type(e).__name__})") from None
    deep = _tree_depth_ok(tree)
    if deep is not None:
        raise RewardCompileError("parse", f"expressions nested more than {MAX_TREE_DEPTH} deep: split them with "
                                 "local variables", getattr(deep, "lineno", None))
    entries = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ENTRY]
    if not entries:
        raise RewardCompileError(
            "parse", "no top-level `def reward(prev, action, curr)` found: the program must define it")
    if len(entries) > 1:
        lines = ", ".join(str(n.lineno) for n in entries)
        raise RewardCompileError("parse", f"`reward` is defined {len(entries)} times (lines {lines}); "
                                 "define it once", entries[1].lineno)
    return tree


def strip_annotations(tree: ast.Module) -> ast.Module:
    """`tree` without type annotations (`x: T = v` becomes `x = v`): a copy, or `tree`
    itself where it has none."""
    if not any(isinstance(n, ast.AnnAssign) or (isinstance(n, ast.arg) and n.annotation is not None)
               or (isinstance(n, ast.FunctionDef) and n.returns is not None) for n in ast.walk(tree)):
        return tree

    class Strip(ast.NodeTransformer):
        def visit_arg(self, node):
            node.annotation = None
            return node

        def visit_FunctionDef(self, node):
            node.returns = None
            self.generic_visit(node)
            return node

        def visit_AnnAssign(self, node):
            if node.value is None:
                return None
            return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)

    import copy

    stripped = Strip().visit(copy.deepcopy(tree))
    return ast.fix_missing_locations(stripped)


def annotation_nodes(tree: ast.Module) -> set[int]:
    """ids of every node inside a type annotation (not checked: annotations never run)."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}
