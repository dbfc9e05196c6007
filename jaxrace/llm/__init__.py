"""The LLM layer: chat backends, record and replay, prompts, generation with repair (host-side).

Backends share one protocol, `chat(messages, **options) -> Reply`:
`OpenAIChat` (any OpenAI-compatible endpoint, through the `openai` SDK), `OfflineChat`
(the offline proposer; not an LLM), and `RecordedChat`, which records every request and
reply of a run and, without a live backend, replays them. `open_chat` builds the one a
run asks for. `generate` turns a backend into M compiled reward programs. No JAX here.
"""

from __future__ import annotations

from pathlib import Path

from jaxrace.llm.base import (
    Budget,
    BudgetedChat,
    BudgetExhausted,
    ChatBackend,
    LLMError,
    Reply,
    image_part,
    message,
    request_key,
)
from jaxrace.llm.extract import Extraction, extract_program, normalised
from jaxrace.llm.generate import Generation, Program, generate
from jaxrace.llm.offline import OfflineChat
from jaxrace.llm.record import Record, RecordedChat, ReplayMiss

BACKENDS = ("offline", "openai", "replay")

__all__ = [
    "BACKENDS", "Budget", "BudgetExhausted", "BudgetedChat", "ChatBackend", "Extraction", "Generation", "LLMError",
    "OfflineChat", "Program", "Record", "RecordedChat", "ReplayMiss", "Reply", "extract_program", "generate",
    "image_part", "message", "normalised", "open_chat", "request_key",
]


def open_chat(kind: str, record: str | Path | Record, *, base_url: str | None = None, model: str | None = None,
              replay_from: str | Path | None = None, role: str = "generator", budget: Budget | None = None,
              **openai_options) -> RecordedChat | BudgetedChat:
    """The backend a run asks for, recording to the JSON-lines file `record` (a path or an open `Record`).

    kind: "offline", "openai" (`base_url`/`model` or the environment; `openai_options`
    go to `OpenAIChat`) or "replay" (from `replay_from`, a record file or a run directory;
    default `record` itself). A `budget` wraps the result.
    """
    if kind not in BACKENDS:
        raise ValueError(f"unknown LLM backend {kind!r}; choose from {', '.join(BACKENDS)}")
    own = record if isinstance(record, Record) else Record(record)
    if kind == "replay":
        source = None
        if replay_from is not None:
            path = Path(replay_from)
            path = path / "llm" / "record.jsonl" if path.is_dir() else path
            if not path.exists():
                raise ReplayMiss(f"replay: no record at {path}")
            source = Record(path)
        chat = RecordedChat(None, own, role=role, source=source)
    elif kind == "openai":
        from jaxrace.llm.openai_chat import OpenAIChat

        chat = RecordedChat(OpenAIChat(base_url, model, **openai_options), own, role=role)
    else:
        chat = RecordedChat(OfflineChat(), own, role=role)
    return BudgetedChat(chat, budget) if budget is not None else chat
