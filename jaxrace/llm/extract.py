"""Reward programs out of LLM replies, and what makes two programs the same (host-side).

Replies come fenced (```python, ```py, bare ```, ~~~), with prose around them, with
several blocks (a helper shown first, the program after), with no fence at all, or cut
off by the length limit. `extract_program` finds the block that defines `reward` and
says why when there is none. `normalised` is the program's syntax tree without
docstrings, comments or layout, to drop duplicates.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import re

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S)
_OPEN_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)[^\n]*\n", re.M)
_DEFINES_REWARD = re.compile(r"^def\s+reward\s*\(", re.M)
_CODE_START = re.compile(r"^(import |from \w|PARAMS\b|def |@|[A-Za-z_][A-Za-z_0-9]*\s*=|#|\"\"\"|''')")
_LANGS = ("", "python", "py", "python3")


@dataclasses.dataclass(frozen=True)
class Extraction:
    """What was found: `source` (None when nothing usable) and, when None, `problem`."""

    source: str | None
    problem: str = ""
    truncated: bool = False


def extract_program(text: str, finish_reason: str = "stop") -> Extraction:
    """The reward program in an LLM reply.

    Takes the last fenced block that defines `reward` (Python or unlabelled fences
    first), else unfenced code from the first code-like line to the last line that
    keeps it parseable. A reply cut off by the length limit (`finish_reason == "length"`)
    or whose last fence never closes is refused as truncated: a program cut mid-way
    can parse and still be wrong.
    """
    if finish_reason == "length":
        return Extraction(None, "the reply was cut off by the length limit (finish_reason=length) before the "
                                "program ended", truncated=True)
    blocks = [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(text)]
    defining = [b for lang, b in blocks if _DEFINES_REWARD.search(b)]
    preferred = [b for lang, b in blocks if lang in _LANGS and _DEFINES_REWARD.search(b)]
    if preferred or defining:
        return Extraction((preferred or defining)[-1].strip("\n") + "\n")
    closed_end = max((m.end() for m in _FENCE.finditer(text)), default=0)
    dangling = _OPEN_FENCE.search(text, closed_end)
    if dangling and _DEFINES_REWARD.search(text, dangling.end()):
        return Extraction(None, "the program's code block never closes: the reply looks cut off", truncated=True)
    if blocks and not _DEFINES_REWARD.search(text):
        return Extraction(None, f"none of the reply's {len(blocks)} code block(s) defines `def reward(...)`")
    unfenced = _unfenced(text)
    if unfenced is not None:
        return Extraction(unfenced)
    if _DEFINES_REWARD.search(text):
        return Extraction(None, "the reply mentions `def reward(` but no part of it is a whole Python program")
    return Extraction(None, "the reply holds no program: no code block and no `def reward(...)`")


def _unfenced(text: str) -> str | None:
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if _DEFINES_REWARD.match(line)), None)
    if at is None:
        return None
    start = at
    while start > 0 and (not lines[start - 1].strip() or _CODE_START.match(lines[start - 1])
                         or lines[start - 1].startswith((" ", "\t", "}", "]", ")"))):
        start -= 1
    for end in range(len(lines), at, -1):
        chunk = "\n".join(lines[start:end]).strip("\n") + "\n"
        try:
            ast.parse(chunk)
        except SyntaxError:
            continue
        return chunk
    return None


def normalised(source: str) -> str:
    """sha256 of the program's syntax tree without docstrings (comments and layout never count).

    Two programs with equal digests compute the same reward; PARAMS values and names count.
    Unparseable source is hashed as text.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return hashlib.sha256(source.encode()).hexdigest()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()
