"""The offline proposer behind the chat protocol (host-side; not an LLM).

`OfflineChat` answers the generation prompt (`prompts.generation_messages`) the way a
model would: prose that says it is not an LLM, and one fenced program, so the offline
path goes through the same extraction, compilation, repair and record as a real
model. It reads the task and the candidate's number from the prompt, and the best
programs from the feedback section: every other request (seed, from the `seed` option)
mutates one of them, the rest are fresh. A repair request gets a fresh program; any
other request gets a reply saying what it cannot do.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import numpy as np

from jaxrace.llm.base import Reply, text_of

MODEL = "jaxrace-offline-proposer"
NOT_AN_LLM = "(jaxrace offline proposer: this reply is composed from library terms at random; it is not an LLM.)"
_TASK = re.compile(r"^## The task\n(.*?)\n\n## ", re.S | re.M)
_WHICH = re.compile(r"Write candidate (\d+) of (\d+)\.")
_PARENT = re.compile(r"^### The (?:best program|second best): \S+\n```python\n(.*?)\n```", re.S | re.M)


class OfflineChat:
    """A chat backend that writes reward programs with `jaxrace.rewards.propose`."""

    model = MODEL

    def chat(self, messages: Sequence[dict], **options) -> Reply:
        from jaxrace.rewards.proposer import parse_proposal, propose

        t0 = time.perf_counter()

        first = text_of(messages[1]["content"]) if len(messages) > 1 else ""
        task = _TASK.search(first)
        if task is None:
            return self._reply(messages, t0, f"{NOT_AN_LLM} It only writes reward programs for jaxrace's generation "
                                         "prompt, and this request is not one.")
        which = _WHICH.search(first)
        index, m = (int(which.group(1)) - 1, int(which.group(2))) if which else (0, 1)
        seed = int(options.get("seed", 0)) & 0xFFFFFFFF
        repair = len(messages) > 2  # a repair conversation: start afresh
        parents = () if repair else tuple(p for p in (parse_proposal(s) for s in _PARENT.findall(first)) if p)
        parents = parents[(seed // 2) % len(parents):][:1] if parents and seed % 2 == 0 else ()
        key = np.asarray([len(messages), seed], np.uint32)
        proposal = propose(task.group(1), 1, key, parents, numbering=(index, m))[0]
        how = f"a mutation of {parents[0].structure} of {', '.join(parents[0].terms)}" if parents else "a fresh mix"
        return self._reply(messages, t0, f"{NOT_AN_LLM}\n\nCandidate {index + 1} of {m}, {how}:\n\n"
                                     f"```python\n{proposal.source}```\n")

    def _reply(self, messages, t0: float, text: str) -> Reply:
        prompt = sum(len(text_of(m["content"])) for m in messages) // 4 + 1
        return Reply(text=text, finish_reason="stop", model=MODEL, prompt_tokens=prompt,
                     completion_tokens=len(text) // 4 + 1, estimated=True,
                     seconds=round(time.perf_counter() - t0, 3))
