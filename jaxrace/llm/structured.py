"""JSON answers: the server's structured output where it has it, else JSON pulled from text (host-side).

`chat_json(chat, messages, schema)` asks with `response_format` (a JSON schema); a
server that refuses the option (HTTP 400/404/415/422/501) is asked again without it.
Either way the answer is extracted from the text (a bare object, a ```json fence, or
the first balanced {...}), checked against the schema (`schema_problems`: the subset
of JSON Schema used here: type, properties, required, enum, items, minimum, maximum,
additionalProperties false), and on failure the model is asked once more with the
problems named. A second failure raises `LLMError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from jaxrace.llm.base import ChatBackend, LLMError, Reply, message

UNSUPPORTED_STATUS = (400, 404, 415, 422, 501)
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}


def schema_problems(value, schema: dict, path: str = "$") -> list[str]:
    """What is wrong with `value` under `schema` (empty when it conforms)."""
    want = schema.get("type")
    if want is not None:
        types = _TYPES[want]
        if not isinstance(value, types) or (want in ("integer", "number") and isinstance(value, bool)):
            return [f"{path} must be {want}, got {type(value).__name__} {json.dumps(value)[:40]}"]
    problems = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path} must be one of {schema['enum']}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{path} must be at least {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{path} must be at most {schema['maximum']}, got {value}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        problems += [f"{path} lacks required key {k!r}" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            problems += [f"{path} has unexpected key {k!r}" for k in value if k not in props]
        for k, sub in props.items():
            if k in value:
                problems += schema_problems(value[k], sub, f"{path}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += schema_problems(item, schema["items"], f"{path}[{i}]")
    return problems


def extract_json(text: str):
    """The JSON object in a reply: the whole text, a ```json fence, or the first balanced {...}."""
    text = text.strip()
    candidates = [text, *(m.group(1) for m in re.finditer(r"```(?:json)?[^\n]*\n(.*?)```", text, re.S))]
    start = text.find("{")
    while start != -1:
        depth, in_str, escape = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_str:
                if escape:
                    escape = False
                elif ch == "\\":
                    escape = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    candidates.append(text[start:i + 1])
                    break
        start = text.find("{", start + 1) if len(candidates) < 8 else -1
    for c in candidates:
        try:
            return json.loads(c)
        except ValueError:
            continue
    raise ValueError("no JSON object in the reply")


def chat_json(chat: ChatBackend, messages: Sequence[dict], schema: dict, *, name: str = "answer",
              use_response_format: bool = True, **options) -> tuple[dict, Reply]:
    """(the answer, checked against `schema`; the last reply). Raises `LLMError` after one retry."""
    messages = list(messages)
    instruction = f"\n\nReply with only a JSON object that matches this JSON schema:\n{json.dumps(schema)}"
    last = messages[-1]
    if isinstance(last["content"], str):
        messages[-1] = {**last, "content": last["content"] + instruction}
    else:
        messages[-1] = {**last, "content": [*last["content"], {"type": "text", "text": instruction.strip()}]}
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    reply = None
    for attempt in range(2):
        if use_response_format:
            try:
                reply = chat.chat(messages, response_format=fmt, **options)
            except LLMError as e:
                if e.status not in UNSUPPORTED_STATUS:
                    raise
                use_response_format = False  # the server does not do structured output: ask in words only
        if not use_response_format:
            reply = chat.chat(messages, **options)
        try:
            value = extract_json(reply.text)
            problems = schema_problems(value, schema)
        except ValueError as e:
            problems = [str(e)]
        if not problems:
            return value, reply
        if attempt == 0:
            messages = [*messages, message("assistant", reply.text),
                        message("user", "That reply is not valid: " + "; ".join(problems[:5]) + instruction)]
    raise LLMError(f"no valid JSON answer after 2 tries ({chat.model}): {'; '.join(problems[:5])}; last reply "
                   f"{reply.text[:200]!r}")
