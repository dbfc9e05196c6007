"""Judges compare two clips for the task: scripted (from race facts, with B-Pref noise) for now.

Host-side Python. Every judge has `kind`, `id` and `judge(pair) -> Verdict`.
"""

from jaxrace.judges.base import ClipFacts, Judge, Pair, Verdict, clip_facts, step_facts
from jaxrace.judges.scripted import ScriptedJudge, TaskScoring

__all__ = ["ClipFacts", "Judge", "Pair", "ScriptedJudge", "TaskScoring", "Verdict", "clip_facts", "step_facts"]
