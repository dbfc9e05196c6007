"""M compiled reward programs from a chat backend: sample, extract, compile, repair, refill (host-side).

`generate` works in rounds. Each round asks for as many new samples as are still
missing (one request each: servers ignore `n`), concurrently up to `concurrency`, plus
the repairs of the last round's failures; extracts the programs; compiles them all at
once in the sandbox (`jaxrace.rewards.compile_rewards`); sends each failure back with
its error for up to `repairs` repairs; drops duplicates (the same syntax tree as an
accepted or excluded program); and refills until M compile or `max_samples` samples
have been started. Every attempt is recorded (sample, repair number, stage, error,
source, tokens, seconds), so the run directory says what happened to each sample.
One failing reply never stops the others; a spent budget stops cleanly with what there is.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from jaxrace.llm.base import BudgetExhausted, ChatBackend, LLMError, Reply
from jaxrace.llm.extract import extract_program, normalised
from jaxrace.llm.prompts import DEFAULT_MAX_CHARS, generation_messages, repair_messages
from jaxrace.llm.record import ReplayMiss


@dataclasses.dataclass(frozen=True)
class Program:
    """One accepted program: which sample it came from, after how many repairs, and its compilation."""

    sample: int
    repairs: int
    source: str
    compiled: object  # jaxrace.rewards.CompiledReward


@dataclasses.dataclass
class Generation:
    """What `generate` returns: the programs (sample order), every attempt, and why it stopped early."""

    programs: list[Program]
    attempts: list[dict]
    stopped: str | None = None  # None when M programs compiled

    @property
    def tokens(self) -> int:
        return sum(a["prompt_tokens"] + a["completion_tokens"] for a in self.attempts)


@dataclasses.dataclass
class _Chain:
    sample: int
    messages: list[dict]
    repairs: int = 0


def generate(chat: ChatBackend, task: str, m: int, feedback: str = "", *, repairs: int = 2,
             max_samples: int | None = None, concurrency: int = 4, seed: int = 0, temperature: float = 0.8,
             max_tokens: int = 2048, max_prompt_chars: int = DEFAULT_MAX_CHARS, exclude: Sequence[str] = (),
             compile_fn: Callable | None = None, on_program: Callable[[Program], None] | None = None) -> Generation:
    """Up to M programs for `task` that compile, and the record of every attempt.

    Args:
        chat: any backend (`OpenAIChat`, `OfflineChat`, `RecordedChat`, `BudgetedChat`).
        feedback: `prompts.feedback_text` of the last iteration ("" for the first).
        repairs: repairs per sample before it is given up.
        max_samples: samples started at most (default 3 * m).
        seed: sample i is asked with option `seed = seed + i` (and is a distinct request).
        exclude: sources that count as taken already (the carried best): equal programs are duplicates.
        compile_fn: `compile_rewards`-like (sources -> CompiledReward | RewardCompileError per source).
        on_program: called with each accepted program (progress display).

    Returns:
        `Generation`; `stopped` says why fewer than M came back (budget, samples, or the
        endpoint failing every request of a round).
    """
    if m < 1 or repairs < 0 or concurrency < 1:
        raise ValueError(f"need m >= 1, repairs >= 0, concurrency >= 1 (got {m}, {repairs}, {concurrency})")
    if compile_fn is None:
        from jaxrace.rewards.compiler import compile_rewards as compile_fn
    max_samples = 3 * m if max_samples is None else max_samples
    options = {"temperature": temperature, "max_tokens": max_tokens}
    seen = {normalised(s) for s in exclude}
    programs: list[Program] = []
    attempts: list[dict] = []
    chains: list[_Chain] = []
    started, stopped = 0, None
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="jaxrace-llm") as pool:
        while True:
            while stopped is None and len(programs) + len(chains) < m and started < max_samples:
                chains.append(_Chain(started, generation_messages(task, started, max(m, started + 1), feedback,
                                                                  max_chars=max_prompt_chars)))
                started += 1
            if not chains:
                break
            chains.sort(key=lambda ch: ch.sample)
            results = list(pool.map(lambda ch: _ask(chat, ch, {**options, "seed": seed + ch.sample}), chains))
            todo: list[tuple[_Chain, Reply, dict, str]] = []
            retry: list[_Chain] = []
            failures = 0
            for chain, (reply, error, seconds) in zip(chains, results, strict=True):
                record = {"sample": chain.sample, "repair": chain.repairs, "seconds": round(seconds, 3),
                          "prompt_tokens": reply.prompt_tokens if reply else 0,
                          "completion_tokens": reply.completion_tokens if reply else 0,
                          "finish_reason": reply.finish_reason if reply else None,
                          "tokens_estimated": bool(reply and reply.estimated)}
                if error is not None:
                    failures += 1
                    budget = isinstance(error, BudgetExhausted)
                    attempts.append({**record, "stage": "budget" if budget else "reply", "error": str(error),
                                     "source": None})
                    if budget:
                        stopped = str(error)
                    continue
                found = extract_program(reply.text, reply.finish_reason)
                if found.source is None:
                    attempts.append({**record, "stage": "truncated" if found.truncated else "extract",
                                     "error": found.problem, "source": None, "reply": reply.text[:2000]})
                    _repair(chain, reply.text, found.problem, None, None, repairs, retry, max_prompt_chars)
                    continue
                todo.append((chain, reply, record, found.source))
            if failures and failures == len(chains) and not todo:
                stopped = stopped or f"every request of a round failed: {attempts[-1]['error']}"
            if todo:
                compiled = compile_fn([source for _, _, _, source in todo])
                for (chain, reply, record, source), result in zip(todo, compiled, strict=True):
                    if not hasattr(result, "component_names"):  # a RewardCompileError
                        attempts.append({**record, "stage": result.stage, "line": result.lineno,
                                         "error": str(result), "source": source})
                        _repair(chain, reply.text, str(result), source, result.lineno, repairs, retry,
                                max_prompt_chars)
                        continue
                    digest = normalised(source)
                    if digest in seen:
                        attempts.append({**record, "stage": "duplicate", "source": source,
                                         "error": "the same program as an earlier one (syntax tree)"})
                        continue
                    seen.add(digest)
                    attempts.append({**record, "stage": "ok", "error": None, "source": source})
                    program = Program(chain.sample, chain.repairs, source, result)
                    programs.append(program)
                    if on_program is not None:
                        on_program(program)
            chains = [] if stopped else retry
    if stopped is None and len(programs) < m:
        stopped = f"{started} samples (max_samples) gave {len(programs)} of {m} programs"
    programs.sort(key=lambda p: p.sample)
    return Generation(programs=programs, attempts=attempts, stopped=stopped)


def _ask(chat: ChatBackend, chain: _Chain, options: dict) -> tuple[Reply | None, LLMError | None, float]:
    t0 = time.perf_counter()
    try:
        reply = chat.chat(chain.messages, **options)
        return reply, None, reply.seconds  # a replayed reply keeps its recorded time
    except ReplayMiss:
        raise  # the record does not match this run: not a failed sample
    except LLMError as e:
        return None, e, time.perf_counter() - t0


def _repair(chain: _Chain, reply: str, problem: str, source: str | None, lineno: int | None, repairs: int,
            retry: list[_Chain], max_chars: int) -> None:
    if chain.repairs < repairs:
        base = chain.messages[:2]  # the generation prompt; earlier repairs are dropped to keep it short
        retry.append(_Chain(chain.sample, repair_messages(base, reply, problem, source, lineno, max_chars=max_chars),
                            chain.repairs + 1))
