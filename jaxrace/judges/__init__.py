"""Judges compare two clips for the task: scripted (race facts, B-Pref noise) and VLM (frames, any OpenAI-compatible
vision model); agreement between judges on shared pairs.

Host-side Python. Every judge has `kind`, `id` and `judge(pair) -> Verdict`.
"""

from jaxrace.judges.agreement import Agreement, agreements, cohen_kappa
from jaxrace.judges.base import ClipFacts, Judge, Pair, Verdict, clip_facts, step_facts
from jaxrace.judges.scripted import ScriptedJudge, TaskScoring
from jaxrace.judges.vlm import VLMJudge

__all__ = ["Agreement", "ClipFacts", "Judge", "Pair", "ScriptedJudge", "TaskScoring", "VLMJudge", "Verdict",
           "agreements", "clip_facts", "cohen_kappa", "step_facts"]
