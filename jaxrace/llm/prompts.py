"""The prompts: pure functions from data to chat messages (host-side, tested by exact text).

- `generation_messages(task, index, m, feedback)`: the role, the reward API
  (`jaxrace.rewards.api_text()`), the rules for pure JAX and the reply format, the task,
  and a request for a candidate unlike the others.
- `feedback_text(summary)`: what an iteration learned, from the run's data: the best
  programs with per-component statistics and race metrics, Bradley-Terry strengths with
  standard errors, TAC scores, the judges' rationales, a person's words, and the bottom
  of the ranking as the bad example.
- `repair_messages(messages, reply, error)`: the compile error's stage, line and message
  with the failing source, appended to the conversation.

Every prompt stays within `max_chars`: the feedback's least useful parts go first (the
second-best and the worst programs, then the rationales), and the API text is never
cut; if the fixed parts alone do not fit, that is an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxrace.llm.base import message

DEFAULT_MAX_CHARS = 24_000
CUT = "[... cut to fit the prompt size]"

SYSTEM = (
    "You are a reward engineer for reinforcement learning in car racing. You write reward functions as "
    "short Python programs for jaxrace, a JAX racing simulator. An agent (the ego car) is trained with "
    "each program's reward and raced against built-in AI cars; judges then compare the agents' races for "
    "the task. Write rewards that make the task's behaviour the easiest way to earn reward."
)

RULES = """\
How to answer:
- Write one complete program that follows the rules above. Put every weight you would want tuned in
  `PARAMS`: weights are tuned later from the judges' preferences.
- Keep each component within about [-10, 10] per step: a reward dominated by one huge term trains badly.
- Keep the program under 80 lines.
- Reply with the whole program in one ```python fenced block, then at most three sentences on why it
  fits the task."""


@dataclasses.dataclass(frozen=True)
class CandidateSummary:
    """One trained candidate as the feedback shows it (the loop fills it from the run directory).

    components: name -> {"min", "mean", "max", "share", "constant", "samples"} over its races.
    training: the reward per step and the progress (m per step) at evenly spaced epochs of its training.
    races: the loop's race summary (median_position, mean_positions_gained,
        at_fault_contacts_per_race, side_contacts_per_race, course_outs_per_race,
        wall_hits_per_race, finished, best_lap), empty when it failed.
    """

    name: str
    source: str
    strength: float
    stderr: float
    tac: float | None = None
    failed: bool = False
    races: dict = dataclasses.field(default_factory=dict)
    components: dict = dataclasses.field(default_factory=dict)
    rationales: tuple[str, ...] = ()
    training: dict = dataclasses.field(default_factory=dict)  # "reward", "progress": values sampled over epochs


@dataclasses.dataclass(frozen=True)
class IterationSummary:
    """An iteration's results, candidates best first."""

    iteration: int
    candidates: tuple[CandidateSummary, ...]
    reference_lap: float | None = None
    person: str = ""  # a person's free-text feedback


def generation_messages(task: str, index: int, m: int, feedback: str = "", *, api: str | None = None,
                        max_chars: int = DEFAULT_MAX_CHARS) -> list[dict]:
    """[system, user] asking for candidate `index` (0-based) of `m` for `task`.

    `api` defaults to `jaxrace.rewards.api_text()`; `feedback` (from `feedback_text`) is
    cut to fit `max_chars` over both messages.
    """
    if api is None:
        from jaxrace.rewards.api import api_text

        api = api_text()
    task = " ".join(task.split())
    head = f"## The task\n{task}\n\n## The reward API\n{api.rstrip()}\n\n{RULES}\n"
    ask = (f"\n## What to write\nWrite candidate {index + 1} of {m}. The candidates are written independently "
           "and then compared, so make this one a distinct idea: choose its own terms, weights and shaping "
           "rather than the most obvious reward.\n")
    if feedback:
        ask = ("\nImprove on the last iteration: keep what worked in the best program, fix what its statistics "
               "and races show, and avoid what the worst did." + ask)
    fixed = len(SYSTEM) + len(head) + len(ask)
    if fixed > max_chars:
        raise ValueError(f"the generation prompt needs {fixed} characters without feedback, more than "
                         f"max_chars={max_chars}; raise max_chars (the API text is never cut)")
    user = head
    if feedback:
        room = max_chars - fixed - len("\n## Feedback from the last iteration\n")
        user += "\n## Feedback from the last iteration\n" + _fit(feedback, room)
    return [message("system", SYSTEM), message("user", user + ask)]


def _fit(text: str, room: int) -> str:
    if len(text) <= room:
        return text
    return text[:max(0, room - len(CUT) - 1)] + "\n" + CUT if room > len(CUT) else ""


def _num(x: float | None, fmt: str = "+.2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _race_line(races: dict, reference_lap: float | None) -> str:
    if not races:
        return "no races (training failed)"
    lap = "no full lap"
    if races.get("best_lap") is not None:
        lap = f"best lap {races['best_lap']:.2f} s"
        if reference_lap:
            lap += f" ({100 * (races['best_lap'] / reference_lap - 1):+.1f}% against the {reference_lap:.2f} s " \
                   "reference lap)"
    return (f"median finishing position {races['median_position']:.1f}, {races['mean_positions_gained']:+.1f} "
            f"places gained on average, per race {races['at_fault_contacts_per_race']:.1f} at-fault contacts "
            f"(running into a car ahead), {races['side_contacts_per_race']:.1f} side contacts, "
            f"{races['course_outs_per_race']:.1f} course-outs, {races['wall_hits_per_race']:.1f} wall hits; "
            f"finished {100 * races['finished']:.0f}% of races; {lap}")


def _components(components: dict) -> str:
    lines = []
    for name, s in components.items():
        note = " CONSTANT: it never changes, so it teaches nothing" if s.get("constant") else \
            " DOMINATES the total" if s.get("share", 0.0) > 0.6 else ""
        samples = ", ".join(f"{v:.3g}" for v in s.get("samples", ())[:10])
        lines.append(f"  {name}: min {s['min']:.3g}, mean {s['mean']:.3g}, max {s['max']:.3g}, "
                     f"{100 * s.get('share', 0.0):.0f}% of the total's magnitude{';' if note else ''}{note}"
                     + (f"\n    values over the races: {samples}" if samples else ""))
    return "\n".join(lines)


def _program_section(title: str, c: CandidateSummary, reference_lap: float | None, *, stats: bool) -> str:
    parts = [f"### {title}: {c.name}", f"```python\n{c.source.rstrip()}\n```",
             f"Races: {_race_line(c.races, reference_lap)}."]
    if stats and c.training:
        parts.append("During training, at evenly spaced epochs:\n" + "\n".join(
            f"  {label}: {', '.join(f'{v:.3g}' for v in c.training[key])}"
            for key, label in (("reward", "its reward per step"), ("progress", "progress in m per step"))
            if c.training.get(key)))
    if stats and c.components:
        parts.append("Each component per step over its races:\n" + _components(c.components))
    return "\n".join(parts) + "\n"


def feedback_text(summary: IterationSummary, *, max_chars: int = DEFAULT_MAX_CHARS // 2) -> str:
    """What iteration `summary.iteration` learned, best first, within `max_chars`."""
    cands = summary.candidates
    if not cands:
        raise ValueError("feedback needs at least one candidate")
    ranking = [f"Iteration {summary.iteration}: {len(cands)} candidates were trained and raced against the "
               "built-in AI. Judges compared clips of their races; ranking by Bradley-Terry strength (higher is "
               "better, +- one standard error):"]
    for i, c in enumerate(cands):
        tac = "" if c.tac is None else f", TAC {c.tac:+.2f}"
        state = "FAILED in training (NaN or diverged)" if c.failed else _race_line(c.races, summary.reference_lap)
        ranking.append(f"{i + 1}. {c.name}: strength {_num(c.strength)} +- {_num(c.stderr, '.2f')}{tac}; {state}")
    sections: list[tuple[int, str]] = [(0, "\n".join(ranking) + "\n")]  # (how soon to drop: high first, text)
    best = cands[0]
    if all(c.failed for c in cands):
        ranking.append("Every candidate failed in training: each reward reached NaN or infinity, or made the "
                       "agent diverge. Keep rewards finite and bounded (clip, avoid division by small values).")
        sections[0] = (0, "\n".join(ranking) + "\n")
        sections.append((1, _program_section("The first failed program", best, summary.reference_lap, stats=True)))
    else:
        sections.append((1, _program_section("The best program", best, summary.reference_lap, stats=True)))
    if len(cands) > 2:
        sections.append((4, _program_section("The second best", cands[1], summary.reference_lap, stats=False)))
    if len(cands) > 1:
        sections.append((3, _program_section("The worst program (an example of what not to do)", cands[-1],
                                             summary.reference_lap, stats=False)))
    rationales = [f"- on {c.name}: {r}" for c in cands for r in c.rationales[:3]]
    if rationales:
        sections.append((2, "What the judges said:\n" + "\n".join(rationales[:8]) + "\n"))
    if summary.person.strip():
        sections.append((0, "A person watching the races wrote:\n" + summary.person.strip() + "\n"))
    while sum(len(t) + 1 for _, t in sections) > max_chars and any(p > 0 for p, _ in sections):
        worst = max(range(len(sections)), key=lambda i: (sections[i][0], i))
        sections.pop(worst)
    return _fit("\n".join(t for _, t in sections), max_chars)


def repair_messages(messages: Sequence[dict], reply: str, problem: str, source: str | None = None,
                    lineno: int | None = None, *, max_chars: int = DEFAULT_MAX_CHARS) -> list[dict]:
    """The conversation so far, the reply, and a request to fix `problem` (the failing source numbered)."""
    ask = [f"Your program was rejected: {problem}"]
    if source is not None:
        lines = source.splitlines()
        numbered = "\n".join(f"{'>' if i + 1 == lineno else ' '}{i + 1:3d}  {line}" for i, line in enumerate(lines))
        ask.append(f"The program, numbered{', the failing line marked with >' if lineno else ''}:\n"
                   f"```\n{numbered}\n```")
    ask.append("Fix it and reply with the whole corrected program in one ```python fenced block.")
    fixed = sum(len(str(m["content"])) for m in messages) + len("\n\n".join(ask))
    kept = _fit(reply, max(0, max_chars - fixed))
    return [*messages, message("assistant", kept), message("user", "\n\n".join(ask))]
