"""Reward programs and preference machinery.

`api_text()` is what an LLM is shown; `compile_reward(source)` checks a program and has
the sandbox worker export it to a JAX artifact, which is all this process runs
(`load_reward(path)` reads a saved one); `RewardBank` evaluates N of them as one
batched function; `library_reward` and `propose` supply programs without an LLM; `tac`
scores candidates against preferences; `bradley_terry` ranks agents from pairwise
outcomes.

Only the API (`RaceView`, `Action`) is imported with the package: the env reads it
without pulling in the compiler. Everything else loads on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from jaxrace.rewards.api import NO_GAP, Action, RaceView, api_text

_SUBMODULE = {
    "RewardBank": "bank", "bradley_terry": "bradley_terry", "Clip": "clips", "cut_clip": "clips",
    "CompiledReward": "compiler", "compile_reward": "compiler", "compile_rewards": "compiler",
    "load_reward": "compiler",
    "RewardCompileError": "errors", "LIBRARY": "library", "library_reward": "library",
    "ProposedReward": "proposer", "propose": "proposer", "clip_returns": "tac", "tac": "tac",
    "tac_from_returns": "tac",
}

__all__ = [
    "LIBRARY", "NO_GAP", "Action", "Clip", "CompiledReward", "ProposedReward", "RaceView", "RewardBank",
    "RewardCompileError", "api_text", "bradley_terry", "clip_returns", "compile_reward", "compile_rewards",
    "cut_clip",
    "library_reward", "load_reward", "propose", "tac", "tac_from_returns",
]

if TYPE_CHECKING:
    from jaxrace.rewards.bank import RewardBank
    from jaxrace.rewards.bradley_terry import bradley_terry
    from jaxrace.rewards.clips import Clip, cut_clip
    from jaxrace.rewards.compiler import CompiledReward, compile_reward, compile_rewards, load_reward
    from jaxrace.rewards.errors import RewardCompileError
    from jaxrace.rewards.library import LIBRARY, library_reward
    from jaxrace.rewards.proposer import ProposedReward, propose
    from jaxrace.rewards.tac import clip_returns, tac, tac_from_returns


def __getattr__(name: str):
    if name not in _SUBMODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_SUBMODULE[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
