"""The Trajectory Alignment Coefficient: how well each candidate reward orders clips the
way the judges did (Kendall's tau between reward returns and preference labels).

Pairs and labels: pair p compares clip `first[p]` with clip `second[p]`; label +1 means
the first was preferred, -1 the second, 0 a judged tie, NaN not labelled (ignored).

Tie rules: a candidate ties a pair when its two returns differ by at most
`atol + rtol * max(|R1|, |R2|)`. A pair counts as concordant when the candidate and the
label agree on a strict order, discordant when they disagree, and neither when either
side ties. With n labelled pairs, C concordant and D discordant:
- tau-a = (C - D) / n: every labelled pair counts, so ties of either kind pull it to 0;
- tau-b = (C - D) / sqrt((n - ties of the reward) (n - ties of the labels)), the
  tie-corrected form (scipy's `kendalltau` default); 0 when either factor is 0.
Both are in [-1, 1]; 1 means the reward ranks every labelled pair as the judges did.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrace.jit import jit
from jaxrace.rewards.bank import RewardBank
from jaxrace.rewards.clips import Clip

VARIANTS = ("a", "b")
RETURN_MODES = ("mean", "sum", "discounted")


def tac_from_returns(returns_first: jax.Array, returns_second: jax.Array, labels: jax.Array, variant: str = "a",
                     *, atol: float = 1e-6, rtol: float = 1e-6) -> jax.Array:
    """Kendall's tau between N candidates' returns and P labels.

    Args:
        returns_first, returns_second: f32[N, P], each candidate's return of each pair's clips.
        labels: f32[P] in {+1, -1, 0} (NaN: not labelled, ignored).
        variant: "a" or "b" (see the module docstring).

    Returns:
        f32[N], tau per candidate.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    returns_first = jnp.asarray(returns_first, jnp.float32)
    returns_second = jnp.asarray(returns_second, jnp.float32)
    labels = jnp.asarray(labels, jnp.float32)
    shapes_ok = returns_first.ndim == 2 and returns_second.shape == returns_first.shape
    if not shapes_ok or labels.shape != returns_first.shape[1:]:
        raise ValueError(f"returns must be [N, P] and labels [P]; got {returns_first.shape}, "
                         f"{returns_second.shape} and {labels.shape}")
    labelled = ~jnp.isnan(labels)
    label_sign = jnp.sign(jnp.where(labelled, labels, 0.0))
    diff = returns_first - returns_second
    scale = jnp.maximum(jnp.abs(returns_first), jnp.abs(returns_second))
    reward_sign = jnp.where(jnp.abs(diff) <= atol + rtol * scale, 0.0, jnp.sign(diff))
    agreement = reward_sign * label_sign[None, :]  # +1 concordant, -1 discordant, 0 a tie either side
    net = jnp.sum(jnp.where(labelled[None, :], agreement, 0.0), axis=1)
    n = jnp.sum(labelled).astype(jnp.float32)
    if variant == "a":
        denominator = jnp.broadcast_to(n, net.shape)
    else:
        reward_ties = jnp.sum(labelled[None, :] & (reward_sign == 0), axis=1)
        label_ties = jnp.sum(labelled & (label_sign == 0))
        denominator = jnp.sqrt((n - reward_ties) * (n - label_ties))
    return jnp.where(denominator > 0, net / jnp.maximum(denominator, 1e-12), 0.0)


def clip_returns(bank: RewardBank, clips: Clip, params: jax.Array | None = None, *, mode: str = "mean",
                 discount: float = 0.99) -> jax.Array:
    """f32[N, P]: every candidate's return of every clip.

    Args:
        clips: a Clip with leading axis P (views [P, T + 1], actions [P, T], valid [P, T]).
        params: f32[N, W] candidate weights (None: the defaults), or f32[P, N, W]: weights per clip
            (a gradient w.r.t. them is every clip's own gradient, in one reverse pass).
        mode: "mean" reward per valid step (the default: clips that end early are not
            favoured or penalised for their length), "sum", or "discounted" (sum of
            discount^t r_t over valid steps).
    """
    if mode not in RETURN_MODES:
        raise ValueError(f"mode must be one of {RETURN_MODES}, got {mode!r}")
    params = bank.default_params() if params is None else params
    prev = jax.tree.map(lambda x: x[:, :-1], clips.views)
    curr = jax.tree.map(lambda x: x[:, 1:], clips.views)
    over_steps = jax.vmap(lambda p, a, c, w: bank.evaluate_all(p, a, c, w)[0], in_axes=(0, 0, 0, None))
    per_step = jax.vmap(over_steps, in_axes=(0, 0, 0, 0 if params.ndim == 3 else None))
    rewards = per_step(prev, clips.actions, curr, params)  # [P, T, N]
    valid = clips.valid.astype(jnp.float32)
    if mode == "discounted":
        valid = valid * discount ** jnp.arange(valid.shape[-1], dtype=jnp.float32)
    total = jnp.einsum("ptn,pt->np", jnp.where(valid[..., None] > 0, rewards, 0.0), valid)
    if mode == "mean":
        total = total / jnp.maximum(jnp.sum(clips.valid, axis=-1), 1)[None, :]
    return total


@functools.partial(jit, static_argnames=("bank", "variant", "mode", "discount"))
def tac(bank: RewardBank, clips_first: Clip, clips_second: Clip, labels: jax.Array, params: jax.Array | None = None,
        *, variant: str = "a", mode: str = "mean", discount: float = 0.99) -> jax.Array:
    """f32[N]: the TAC of every candidate in `bank` against P labelled clip pairs, in one jitted call.

    Args:
        clips_first, clips_second: Clips with leading axis P.
        labels: f32[P] in {+1, -1, 0} (NaN ignored).
        params: f32[N, W] candidate weights (None: the defaults), or f32[P, N, W]: weights per clip
            (a gradient w.r.t. them is every clip's own gradient, in one reverse pass).
    """
    returns_first = clip_returns(bank, clips_first, params, mode=mode, discount=discount)
    returns_second = clip_returns(bank, clips_second, params, mode=mode, discount=discount)
    return tac_from_returns(returns_first, returns_second, labels, variant)
