"""Reward programs and preference machinery.

`api_text()` is what an LLM is shown; `compile_reward(source)` checks a program and has
the sandbox worker export it to a JAX artifact, which is all this process runs
(`load_reward(path)` reads a saved one); `RewardBank` evaluates N of them as one
batched function; `library_reward` and `propose` supply programs without an LLM; `tac`
scores candidates against preferences; `bradley_terry` ranks agents from pairwise
outcomes.
"""

from jaxrace.rewards.api import NO_GAP, Action, RaceView, api_text
from jaxrace.rewards.bank import RewardBank
from jaxrace.rewards.bradley_terry import bradley_terry
from jaxrace.rewards.clips import Clip, cut_clip
from jaxrace.rewards.compiler import CompiledReward, compile_reward, load_reward
from jaxrace.rewards.errors import RewardCompileError
from jaxrace.rewards.library import LIBRARY, library_reward
from jaxrace.rewards.proposer import ProposedReward, propose
from jaxrace.rewards.tac import clip_returns, tac, tac_from_returns

__all__ = [
    "LIBRARY", "NO_GAP", "Action", "Clip", "CompiledReward", "ProposedReward", "RaceView", "RewardBank",
    "RewardCompileError", "api_text", "bradley_terry", "clip_returns", "compile_reward", "cut_clip",
    "library_reward", "load_reward", "propose", "tac", "tac_from_returns",
]
