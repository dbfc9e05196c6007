"""Every request and reply of a run, on disk; a recorded run replays offline (host-side).

The record is one JSON-lines file (`<run dir>/llm/record.jsonl`), appended and flushed
per reply, so a killed run loses at most the reply in flight. Each line holds the
request's key (`base.request_key`: a hash of model, messages and options), how many
times the same request came before (`n`), the role ("generator", "judge"), the stage,
the request and the reply. No API key is ever in it: requests carry none.

`RecordedChat(backend, record)` answers a request from the record when it holds it (so
resuming a run never pays twice and gets the same replies) and otherwise asks `backend`
and appends. With `backend=None` it is the **replay** backend: a request not in the
record raises `ReplayMiss` naming the stage and the first message that differs from
the nearest recorded request; there is never a silent live call.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

from jaxrace.llm.base import ChatBackend, LLMError, Reply, request_key, text_of


class ReplayMiss(LLMError):
    """The replay backend was asked something the record does not hold."""


class Record:
    """The record file: read on open, appended under a lock."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.entries: list[dict] = []
        self._lock = threading.Lock()
        if self.path.exists():
            lines = self.path.read_text(encoding="utf-8").splitlines()
            for i, line in enumerate(lines):
                try:
                    self.entries.append(json.loads(line))
                except ValueError:
                    if i != len(lines) - 1:
                        raise LLMError(f"{self.path}: line {i + 1} is not JSON; the record is damaged") from None
                    warnings.warn(f"{self.path}: dropped a half-written last line (a killed run)", stacklevel=2)
                    self.path.write_text("".join(x + "\n" for x in lines[:-1]), encoding="utf-8")
        self.index: dict[tuple[str, int], dict] = {(e["key"], e["n"]): e for e in self.entries}

    def models(self, role: str) -> list[str]:
        return sorted({e["model"] for e in self.entries if e["role"] == role})

    def append(self, entry: dict) -> None:
        line = json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.entries.append(entry)
            self.index[(entry["key"], entry["n"])] = entry


class RecordedChat:
    """A backend that records (or, with `backend=None`, only replays) through a `Record`.

    Args:
        backend: the live backend, or None to replay only.
        record: the `Record` to read and append to; `source` an extra, read-only record to
            replay from (another run's), whose replies are copied into `record` as used.
        role: which part of the loop asks ("generator", "judge"); part of each entry.
        model: the model for replay only (default: the one model `source` or `record`
            holds for `role`).
    """

    def __init__(self, backend: ChatBackend | None, record: Record, *, role: str = "generator",
                 source: Record | None = None, model: str | None = None):
        self.backend, self.record, self.source, self.role = backend, record, source, role
        self.stage = ""  # set by the caller per stage; recorded, not part of the key
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        if backend is not None:
            self.model = backend.model
        else:
            known = (source or record).models(role)
            if model is None and len(known) != 1:
                where = (source or record).path
                raise ReplayMiss(f"replay: {where} holds {'no' if not known else len(known)} models for the "
                                 f"{role} ({', '.join(known) or 'no requests'}); "
                                 + ("record a run first" if not known else "name one"))
            self.model = model or known[0]

    def chat(self, messages: Sequence[dict], **options) -> Reply:
        key = request_key(self.model, messages, options)
        with self._lock:
            n = self._seen.get(key, 0)
            self._seen[key] = n + 1
        entry = self.record.index.get((key, n))
        if entry is None and self.source is not None:
            entry = self.source.index.get((key, n))
            if entry is not None:
                self.record.append(entry | {"stage": self.stage or entry["stage"]})
        if entry is not None:
            return dataclasses.replace(Reply.from_dict(entry["reply"]), replayed=True)
        if self.backend is None:
            raise ReplayMiss(self._miss_message(messages, options))
        reply = self.backend.chat(messages, **options)  # failures are not recorded: a rerun asks again
        self.record.append({"key": key, "n": n, "role": self.role, "model": self.model, "stage": self.stage,
                            "request": {"messages": list(messages), "options": options}, "reply": reply.to_dict()})
        return reply

    def _miss_message(self, messages: Sequence[dict], options: dict) -> str:
        entries = [e for e in (self.source or self.record).entries if e["role"] == self.role]
        head = f"replay: no recorded reply for a request of stage {self.stage or '?'!r} ({self.role}, model " \
               f"{self.model!r})"
        if not entries:
            return head + "; the record holds no requests for it"
        same_stage = [e for e in entries if e["stage"] == self.stage] or entries

        def shared(e) -> int:
            old = e["request"]["messages"]
            return next((i for i, (a, b) in enumerate(zip(old, messages, strict=False)) if a != b),
                        min(len(old), len(messages)))

        nearest = max(same_stage, key=shared)
        old = nearest["request"]["messages"]
        i = shared(nearest)
        if i < min(len(old), len(messages)):
            a, b = text_of(old[i]["content"]), text_of(messages[i]["content"])
            j = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return (f"{head}. The nearest recorded request (stage {nearest['stage']!r}) first differs at message "
                    f"{i + 1} ({messages[i]['role']}), character {j + 1}: recorded {a[max(0, j - 30):j + 50]!r}, "
                    f"now {b[max(0, j - 30):j + 50]!r}")
        if len(old) != len(messages):
            return f"{head}. The nearest recorded request has {len(old)} messages, this one {len(messages)}"
        diff = sorted(k for k in set(options) | set(nearest["request"]["options"])
                      if options.get(k) != nearest["request"]["options"].get(k))
        if diff:
            return f"{head}. The nearest recorded request has the same messages but other options: {', '.join(diff)}"
        return f"{head}. The same request was recorded {nearest['n'] + 1} time(s) and is now asked once more"


def open_record(run_dir: str | Path) -> Record:
    """The record of a run directory (`llm/record.jsonl`)."""
    return Record(Path(run_dir) / "llm" / "record.jsonl")
