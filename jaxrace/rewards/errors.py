"""The one error a reward program's compilation raises."""

from __future__ import annotations

STAGES = ("parse", "policy", "execute", "trace", "validate")

# The file name compiled reward programs carry in tracebacks (to find the user's line).
PROGRAM_FILENAME = "<reward program>"


class RewardCompileError(Exception):
    """A reward program was rejected.

    Attributes:
        stage: one of parse, policy, execute, trace, validate.
        lineno: 1-based line of the program the problem is on, or None.
        message: short and precise, fit to send back to an LLM for repair.
    """

    def __init__(self, stage: str, message: str, lineno: int | None = None):
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        self.stage, self.message, self.lineno = stage, message, lineno
        where = f" (line {lineno})" if lineno else ""
        super().__init__(f"{stage} error{where}: {message}")

    def to_dict(self) -> dict:
        return {"stage": self.stage, "message": self.message, "lineno": self.lineno}
