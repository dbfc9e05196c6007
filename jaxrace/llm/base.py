"""What every chat backend shares: messages, `Reply`, errors, the request key, a budget.

A backend is anything with a `model` string and `chat(messages, **options) -> Reply`.
Messages are OpenAI chat messages (`{"role": ..., "content": str | [parts]}`); options
are the chat-completions options (`temperature`, `max_tokens`, `seed`,
`response_format`, ...). Host-side Python: no JAX here.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class LLMError(RuntimeError):
    """A chat request failed for good (after any retries); the message names the endpoint and model."""

    def __init__(self, message: str, *, status: int | None = None, retries: int = 0):
        super().__init__(message)
        self.status, self.retries = status, retries


class BudgetExhausted(LLMError):
    """The run's token or call budget is spent; no request was sent."""


@dataclasses.dataclass(frozen=True)
class Reply:
    """One chat reply.

    finish_reason: "stop", "length" (cut off by max_tokens), ... as the server says.
    prompt_tokens, completion_tokens: as the server counts them (estimated from the text,
        4 characters a token, when it does not say; `estimated` is then True).
    seconds: wall time of the call, retries included; retries: how many were needed.
    """

    text: str
    finish_reason: str = "stop"
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False
    seconds: float = 0.0
    retries: int = 0
    replayed: bool = False

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "replayed"}

    @classmethod
    def from_dict(cls, data: dict) -> Reply:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class ChatBackend(Protocol):
    model: str

    def chat(self, messages: Sequence[dict], **options) -> Reply: ...


def message(role: str, text: str, images: Sequence[bytes | str | Path] = ()) -> dict:
    """A chat message; with `images` (PNG or JPEG bytes, or paths) the content is parts with data URLs."""
    if role not in ("system", "user", "assistant"):
        raise ValueError(f"role must be system, user or assistant, got {role!r}")
    if not images:
        return {"role": role, "content": text}
    return {"role": role, "content": [{"type": "text", "text": text}, *(image_part(i) for i in images)]}


def image_part(image: bytes | str | Path) -> dict:
    """An `image_url` content part holding the image as a base64 data URL (PNG or JPEG only)."""
    data = Path(image).read_bytes() if isinstance(image, str | Path) else bytes(image)
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        mime = "image/png"
    elif data.startswith(b"\xff\xd8\xff"):
        mime = "image/jpeg"
    else:
        where = f" ({image})" if isinstance(image, str | Path) else ""
        raise ValueError(f"an image must be PNG or JPEG{where}; got bytes starting {data[:8]!r}")
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}}


def text_of(content) -> str:
    """The text of a message's content (parts joined; images shown as [image])."""
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") if p.get("type") == "text" else "[image]" for p in content)


def request_key(model: str, messages: Sequence[dict], options: dict) -> str:
    """sha256 of the canonical JSON of (model, messages, options): what a recorded reply is filed under."""
    blob = json.dumps({"model": model, "messages": list(messages), "options": options}, sort_keys=True,
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class Budget:
    """A run's allowance of tokens and calls (None: unlimited), shared by threads."""

    def __init__(self, max_tokens: int | None = None, max_calls: int | None = None):
        self.max_tokens, self.max_calls = max_tokens, max_calls
        self.tokens = self.calls = 0
        self._lock = threading.Lock()

    def start_call(self) -> None:
        """Counts a call about to start; raises `BudgetExhausted` (and counts nothing) when none may."""
        with self._lock:
            if self.max_calls is not None and self.calls >= self.max_calls:
                raise BudgetExhausted(f"the call budget ({self.max_calls} calls) is spent; no further requests "
                                      "are sent")
            if self.max_tokens is not None and self.tokens >= self.max_tokens:
                raise BudgetExhausted(f"the token budget ({self.max_tokens} tokens) is spent ({self.tokens} used); "
                                      "no further requests are sent")
            self.calls += 1

    def charge(self, reply: Reply) -> None:
        with self._lock:
            self.tokens += reply.tokens


class BudgetedChat:
    """A backend that refuses to start a call once `budget` is spent (raises `BudgetExhausted`)."""

    def __init__(self, inner: ChatBackend, budget: Budget):
        self.inner, self.budget = inner, budget
        self.model = inner.model

    @property
    def stage(self) -> str:
        return getattr(self.inner, "stage", "")

    @stage.setter
    def stage(self, value: str) -> None:
        self.inner.stage = value

    def chat(self, messages: Sequence[dict], **options) -> Reply:
        self.budget.start_call()
        reply = self.inner.chat(messages, **options)
        self.budget.charge(reply)
        return reply
