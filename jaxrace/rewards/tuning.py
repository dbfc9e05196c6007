"""Tuning reward weights from preferences: Metropolis-Hastings, gradient ascent and Soft-TAC.

Every candidate of a `RewardBank` keeps its terms; its `PARAMS` are fitted so that its
returns order the stored clip pairs as the judges did.

The objective. A clip's return is the mean reward per valid step (TAC's default). For
pair p, with d_p = (R_w(first) - R_w(second)) / s_w, where s_w is the standard deviation
of the returns over the clips fitted on (each distinct clip once, however many pairs hold it):

    log L(w) = sum_p  y_p log sigmoid(beta d_p) + (1 - y_p) log sigmoid(-beta d_p)

with y = 1 (first preferred), 0 (second), 1/2 (tie, half a win each); skips are left
out. Dividing by s_w fixes the scale: rewards that differ by a positive factor, or by a
constant, have the same likelihood, so beta (0.9, the self-alignment paper's) is per
standard deviation of the returns and weights cannot grow to sharpen it. Weights move in
log space, sign kept (w = w0 exp(theta)); a zero default moves linearly (w = theta).
The prior theta ~ N(0, prior_scale^2) keeps them near the program's defaults, and with
the likelihood blind to scale it is what fixes the common scale. A weight with a nonzero
default also stays within `max_factor` of it (|theta| <= log max_factor; 3, the proposer's
own range): with hundreds of pairs the prior alone let a place's pay grow 40-fold past a
rear-end's price for two points of held-out accuracy, and the agent trained on it collapsed.
`tune(limits=)` narrows a weight's range further, one side or both (the loop passes the offline
proposer's rules for its programs: a price the task names may rise, never fall), and `tune(bands=)`
keeps ratios of weighted sums in a band (`PriceBand`: a rear-end's price in seconds of the pay for
progress, which tuning otherwise moved from 2.9 to 1.6 s on one seed and from 7.0 to 6.4 on another).
A step that leaves a band has the weights the band names pulled back toward their defaults, which keep it.

Methods, all candidates (and chains or restarts) in one jitted call:
- "mh": random-walk Metropolis-Hastings on theta (TensorFlow Probability's kernel), many
  chains; the posterior mean of theta; acceptance rate, effective sample size and R-hat.
- "grad": Adam (optax) on the log posterior from several starts; the best start.
- "soft-tac": Adam on a relaxed TAC, sum_p sign(label_p) tanh(d_p / temperature), plus the
  log prior: Kendall's tau with its step softened.

Returns are exactly linear in the weights for most programs (weighted sums of terms);
then they are computed once with their Jacobian and every step after costs a matrix
product. Otherwise (checked numerically at random weights) every step evaluates the
programs on every clip (its gradient through the program's exported VJP). Either way a clip
judged in many pairs is evaluated once (`unique_clips`): a loop's store of whole-race clips
holds 2-3 pairs per clip.

Host-side orchestration (splits, guard rails, reporting) is plain Python around the
jitted fits.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.jit import jit
from jaxrace.rewards.bank import RewardBank
from jaxrace.rewards.clips import Clip, unique_clips
from jaxrace.rewards.tac import clip_returns

METHODS = ("mh", "grad", "soft-tac")


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """How to tune (see the module docstring)."""

    method: str = "grad"
    beta: float = 0.9
    prior_scale: float = 1.0  # of theta: a factor e per standard deviation in log space
    holdout: float = 0.3  # share of the pairs held out for the before/after figures (0: none)
    min_preferences: int = 10  # labelled pairs to fit on, or the defaults stay
    max_factor: float = 3.0  # a weight with a nonzero default stays within this factor of it (inf: no bound)
    max_change: float = 1000.0  # a weight moving by more than this factor counts as diverged
    seed: int = 0
    # Metropolis-Hastings
    chains: int = 8
    steps: int = 1000
    burn_in: int = 500  # isotropic steps of step_size, whose second half shapes the later steps
    step_size: float = 0.1
    # Adam (grad and soft-tac)
    learning_rate: float = 0.05
    grad_steps: int = 300
    restarts: int = 4
    temperature: float = 0.5  # soft-tac

    def __post_init__(self):
        problems = []
        if self.method not in METHODS:
            problems.append(f"method must be one of {', '.join(METHODS)} (got {self.method!r})")
        if not 0.0 <= self.holdout < 1.0:
            problems.append(f"holdout must be in [0, 1) (got {self.holdout})")
        for name in ("beta", "prior_scale", "step_size", "learning_rate", "temperature"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be positive (got {getattr(self, name)})")
        for name in ("chains", "steps", "grad_steps", "restarts"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.burn_in < 0 or self.min_preferences < 1 or not self.max_change > 1 or not self.max_factor > 1:
            problems.append("burn_in must be >= 0, min_preferences >= 1, max_change > 1 and max_factor > 1")
        if problems:
            raise ValueError("invalid tuning config: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class PriceBand:
    """least <= sum_i numerator[i] w_i / sum_j denominator[j] w_j <= most over one candidate's weights by
    name: what one weighted term costs in units of another (a rear-end in seconds of the pay for progress).
    The denominator must be positive at the defaults, and the defaults' ratio inside [least, most]."""

    numerator: dict[str, float]  # weight name -> coefficient
    denominator: dict[str, float]
    least: float
    most: float

    def ratio(self, weights: dict[str, float]) -> float:
        top = sum(c * weights[k] for k, c in self.numerator.items())
        return top / sum(c * weights[k] for k, c in self.denominator.items())

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CandidateTuning:
    """One candidate's outcome: its weights (tuned, or the defaults with the reason)."""

    name: str
    params: dict[str, float]
    defaults: dict[str, float]
    tuned: bool
    reason: str
    train_pairs: int
    heldout_pairs: int
    heldout_accuracy_before: float | None
    heldout_accuracy_after: float | None
    heldout_loglik_before: float | None  # mean per held-out pair
    heldout_loglik_after: float | None
    returns: str | None = None  # "linear" (precomputed with their Jacobian) or "exact" (the program every step)
    acceptance: float | None = None  # mh
    ess: dict[str, float | None] | None = None  # mh: effective sample size per weight, over all chains
    rhat: dict[str, float | None] | None = None  # mh: potential scale reduction per weight


@dataclasses.dataclass(frozen=True)
class TuningResult:
    candidates: tuple[CandidateTuning, ...]
    params: np.ndarray  # f32[N, P]: the bank's params matrix with the tuned weights
    method: str
    fit_seconds: float  # the jitted fit, compile included
    clips: int = 0  # distinct clips the programs were evaluated on (a clip judged in many pairs counts once)

    def __getitem__(self, name: str) -> CandidateTuning:
        return next(c for c in self.candidates if c.name == name)


# -- the objective (pure functions of one candidate) ----------------------------------------------------


def weights_from_theta(theta: jax.Array, defaults: jax.Array) -> jax.Array:
    """w = w0 exp(theta) where w0 != 0 (sign kept), else w = theta."""
    return jnp.where(defaults != 0, defaults * jnp.exp(theta), theta)


def theta_from_weights(weights: jax.Array, defaults: jax.Array) -> jax.Array:
    """The inverse of `weights_from_theta` (weights must keep their defaults' signs)."""
    ratio = jnp.where(defaults != 0, weights / jnp.where(defaults != 0, defaults, 1.0), 1.0)
    return jnp.where(defaults != 0, jnp.log(ratio), weights)


def normalised_differences(returns: jax.Array, first: jax.Array, second: jax.Array, fit_mask: jax.Array) -> jax.Array:
    """f32[P]: (R[first] - R[second]) / std of R over the clips of the pairs in `fit_mask` (returns f32[K])."""
    used = jnp.zeros(returns.shape, jnp.float32).at[first].max(fit_mask).at[second].max(fit_mask)
    count = jnp.maximum(jnp.sum(used), 1.0)
    mean = jnp.sum(returns * used) / count
    std = jnp.sqrt(jnp.sum(used * (returns - mean) ** 2) / count)
    return (returns[first] - returns[second]) / (std + 1e-8)


def pair_loglik(d: jax.Array, y: jax.Array, beta: float) -> jax.Array:
    """f32[P]: log-likelihood of each label y in {1, 0, 1/2} under Boltzmann-rational choice."""
    return y * jax.nn.log_sigmoid(beta * d) + (1.0 - y) * jax.nn.log_sigmoid(-beta * d)


def theta_limit(defaults: jax.Array, config: TuningConfig) -> jax.Array:
    """f32[W]: the bound on |theta| per weight: log max_factor where the default is nonzero, else inf."""
    return jnp.where(defaults != 0, jnp.float32(math.log(config.max_factor)), jnp.inf)


def theta_bounds(defaults: np.ndarray, names: list[tuple[str, ...]], config: TuningConfig,
                 limits=None) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) f32[N, W] on theta: +-log max_factor (inf where the default is 0), narrowed by `limits`.

    `limits[n]` maps a weight of candidate n to (least, most) in weight units (None: no limit that
    side; 0 for a nonzero default: the weight may shrink toward 0), never of the opposite sign, with
    the default between them (the search starts there); theta never leaves the narrower range.
    """
    upper = np.asarray(theta_limit(jnp.asarray(defaults), config), np.float64)
    lower = -upper
    if limits is not None:
        if len(limits) != len(names):
            raise ValueError(f"limits has {len(limits)} entries for a bank of {len(names)} candidates")
        for n, own in enumerate(limits):
            for name, (least, most) in (own or {}).items():
                if name not in names[n]:
                    raise ValueError(f"limits for candidate {n} name {name!r}, not among its PARAMS {list(names[n])}")
                i = names[n].index(name)
                w0 = float(defaults[n, i])
                least = -math.inf if least is None else float(least)
                most = math.inf if most is None else float(most)
                slack = 1e-6 * abs(w0)  # the bank holds float32 defaults
                if not least - slack <= w0 <= most + slack:
                    raise ValueError(f"limits for {name!r} ({least:g}, {most:g}) must hold its default {w0:g}")
                if w0 == 0.0:
                    lo, hi = least, most
                else:
                    if any(b * w0 < 0.0 for b in (least, most) if math.isfinite(b)):
                        raise ValueError(f"limits for {name!r} ({least:g}, {most:g}) must keep its default's sign")
                    # theta = log(w / w0): an infinite limit leaves that side open, and so does 0 (w -> 0)
                    lo, hi = sorted(math.log(b / w0) if math.isfinite(b) and b != 0.0
                                    else -math.inf if b == 0.0 else math.copysign(math.inf, b * w0)
                                    for b in (least, most))
                lower[n, i], upper[n, i] = max(lower[n, i], min(lo, 0.0)), min(upper[n, i], max(hi, 0.0))
    return lower.astype(np.float32), upper.astype(np.float32)


def band_arrays(defaults: np.ndarray, names: list[tuple[str, ...]], bands=None) -> tuple[np.ndarray, ...]:
    """(numerator, denominator) f32[N, B, W] and (least, most) f32[N, B] of every candidate's `PriceBand`s,
    padded with bands that always hold (B >= 1); `bands[n]` is None or a list of PriceBand for candidate n."""
    n, w = defaults.shape
    bands = [None] * n if bands is None else list(bands)
    if len(bands) != n:
        raise ValueError(f"bands has {len(bands)} entries for a bank of {n} candidates")
    b = max([len(own or ()) for own in bands] + [1])
    top, bottom = np.zeros((n, b, w), np.float64), np.zeros((n, b, w), np.float64)
    least, most = np.zeros((n, b), np.float64), np.zeros((n, b), np.float64)
    for i, own in enumerate(bands):
        for j, band in enumerate(own or ()):
            for side, array in ((band.numerator, top), (band.denominator, bottom)):
                for name, coefficient in side.items():
                    if name not in names[i]:
                        raise ValueError(f"band for candidate {i} names {name!r}, "
                                         f"not among its PARAMS {list(names[i])}")
                    array[i, j, names[i].index(name)] = coefficient
            at = dict(zip(names[i], defaults[i].tolist(), strict=False))
            if not bottom[i, j] @ defaults[i] > 0:
                raise ValueError(f"band {band.numerator} / {band.denominator}: the denominator must be positive at "
                                 f"the defaults (got {bottom[i, j] @ defaults[i]:g})")
            if not band.least <= band.most:
                raise ValueError(f"band least {band.least:g} is above most {band.most:g}")
            ratio = band.ratio(at)
            if not band.least * (1 - 1e-4) <= ratio <= band.most * (1 + 1e-4):
                raise ValueError(f"band {band.numerator} / {band.denominator} in [{band.least:g}, {band.most:g}] "
                                 f"must hold the defaults' ratio {ratio:g}")
            least[i, j], most[i, j] = band.least, band.most
    return tuple(x.astype(np.float32) for x in (top, bottom, least, most))


def in_bands(theta: jax.Array, defaults: jax.Array, mask: jax.Array, bands) -> jax.Array:
    """Whether theta (f32[W], one candidate) keeps every band (f32[B, W] twice, f32[B] twice); bool[]."""
    top, bottom, least, most = bands
    w = weights_from_theta(theta, defaults) * mask
    a, b = top @ w, bottom @ w
    slack = 1e-5 * (jnp.abs(a) + jnp.abs(b))  # the defaults sit on an edge to rounding
    return jnp.all((a - least * b >= -slack) & (most * b - a >= -slack))


def into_bands(theta: jax.Array, defaults: jax.Array, mask: jax.Array, bands, iterations: int = 30) -> jax.Array:
    """theta where it keeps the bands, else theta with the weights the bands name moved toward their defaults
    (theta_i -> alpha theta_i, the largest alpha in [0, 1] that keeps them, by bisection; at alpha = 0 the
    defaults' ratios hold) and the others left where they are; inside the box bounds too (they hold 0)."""
    top, bottom, _, _ = bands
    named = jnp.any((top != 0) | (bottom != 0), axis=0)  # [W]
    toward = lambda alpha: jnp.where(named, alpha * theta, theta)  # noqa: E731
    inside = lambda alpha: in_bands(toward(alpha), defaults, mask, bands)  # noqa: E731

    def halve(_, interval):
        lo, hi = interval
        mid = 0.5 * (lo + hi)
        ok = inside(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, iterations, halve, (jnp.zeros((), theta.dtype), jnp.ones((), theta.dtype)))
    return jnp.where(inside(1.0), theta, toward(lo))


def _objective(theta, returns_of, defaults, mask, data, config: TuningConfig, kind: str):
    """Log prior plus the fit term over the pairs in data['fit'] (one candidate)."""
    returns = returns_of(weights_from_theta(theta, defaults) * mask)
    d = normalised_differences(returns, data["first"], data["second"], data["fit"])
    if kind == "soft-tac":
        sign = 2.0 * data["y"] - 1.0  # +1, -1, 0 for a tie
        fit = jnp.sum(data["fit"] * sign * jnp.tanh(d / config.temperature))
    else:
        fit = jnp.sum(data["fit"] * pair_loglik(d, data["y"], config.beta))
    prior = -0.5 * jnp.sum(mask * (theta / config.prior_scale) ** 2)
    return fit + prior


def heldout_figures(returns: jax.Array, data: dict, beta: float) -> tuple[jax.Array, jax.Array]:
    """(accuracy on strict held-out labels, mean log-likelihood per held-out pair); NaN when none."""
    d = normalised_differences(returns, data["first"], data["second"], data["fit"])
    held = data["held"]
    strict = held * (data["y"] != 0.5)
    right = jnp.where(d == 0, 0.5, (d > 0) == (data["y"] == 1.0))
    accuracy = jnp.sum(strict * right) / jnp.sum(strict)
    loglik = jnp.sum(held * pair_loglik(d, data["y"], beta)) / jnp.sum(held)
    return accuracy, loglik


# -- the fits: one candidate each, vmapped over the bank ----------------------------------------------


def _fit_adam(key, returns_of, defaults, mask, data, config: TuningConfig, kind: str, lower, upper, bands):
    import optax

    starts = jax.random.normal(key, (config.restarts, defaults.shape[0])) * 0.5 * config.prior_scale
    starts = jnp.clip(starts.at[0].set(0.0) * mask, lower, upper)  # the first start is the defaults
    project = lambda theta: into_bands(jnp.clip(theta, lower, upper), defaults, mask, bands)  # noqa: E731
    starts = jax.vmap(project)(starts)
    loss = lambda theta: -_objective(theta, returns_of, defaults, mask, data, config, kind)  # noqa: E731
    optimiser = optax.adam(config.learning_rate)
    value_and_grad = jax.value_and_grad(loss)

    def one(theta):
        def step(carry, _):
            theta, opt = carry
            value, grad = value_and_grad(theta)
            updates, opt = optimiser.update(grad * mask, opt)
            return (project(optax.apply_updates(theta, updates)), opt), value  # projected

        (theta, _), values = jax.lax.scan(step, (theta, optimiser.init(theta)), None, length=config.grad_steps)
        return theta, loss(theta), values

    thetas, finals, curves = jax.vmap(one)(starts)
    best = jnp.argmin(jnp.where(jnp.isfinite(finals), finals, jnp.inf))
    return {"theta": thetas[best], "curve": curves[best]}


def _fit_mh(key, returns_of, defaults, mask, data, config: TuningConfig, lower, upper, bands):
    """Random-walk Metropolis in two phases: burn-in with isotropic steps, then steps shaped by the burn-in's
    covariance (2.38^2 / d of it, Haario et al.'s adaptive Metropolis, frozen), which mixes along the
    correlated directions (the common scale, fixed by the prior alone) as fast as across them."""
    from tensorflow_probability.substrates import jax as tfp

    def target(theta):  # theta [chains, W] -> [chains]; -inf outside the bounds, so those steps are rejected
        inside = jnp.all((theta >= lower) & (theta <= upper), axis=-1)
        inside &= jax.vmap(lambda t: in_bands(t, defaults, mask, bands))(theta)
        value = jax.vmap(lambda t: _objective(t, returns_of, defaults, mask, data, config, "mh"))(theta)
        return jnp.where(inside, value, -jnp.inf)

    def shaped(chol):
        def new_state(parts, seed):
            (state,) = parts
            noise = jax.random.normal(seed, state.shape, state.dtype)
            return [state + noise @ chol.T]

        return new_state

    k_start, k_burn, k_chain = jax.random.split(key, 3)
    free = mask * (upper > lower)  # a weight pinned by its limits (lower == upper == 0) never steps
    start = jax.random.normal(k_start, (config.chains, defaults.shape[0])) * 0.5 * config.prior_scale * free
    start = jnp.clip(start, 0.9 * lower, 0.9 * upper)  # (lower <= 0 <= upper)
    start = jax.vmap(lambda t: into_bands(t, defaults, mask, bands))(start)
    dims = jnp.maximum(jnp.sum(free), 1.0)
    isotropic = jnp.diag(config.step_size * free)
    burn_in = max(config.burn_in, 2)
    warm = tfp.mcmc.sample_chain(burn_in, start, kernel=tfp.mcmc.RandomWalkMetropolis(
        target, new_state_fn=shaped(isotropic)), trace_fn=None, seed=k_burn)  # [burn_in, chains, W]
    half = warm[burn_in // 2:].reshape(-1, defaults.shape[0])
    cov = jnp.cov(half, rowvar=False).reshape(defaults.shape[0], defaults.shape[0])
    cov = (2.38 ** 2 / dims) * cov * jnp.outer(free, free) + 1e-6 * jnp.diag(free)
    chol = jnp.where(jnp.all(jnp.isfinite(cov)), jnp.linalg.cholesky(cov + (1.0 - free) * jnp.eye(free.shape[0])),
                     isotropic) * free[:, None]
    samples, accepted = tfp.mcmc.sample_chain(
        config.steps, warm[-1], kernel=tfp.mcmc.RandomWalkMetropolis(target, new_state_fn=shaped(chol)),
        trace_fn=lambda _, results: results.is_accepted, seed=k_chain)  # [steps, chains, W]
    ess = tfp.mcmc.effective_sample_size(samples, cross_chain_dims=1)
    rhat = tfp.mcmc.potential_scale_reduction(samples, independent_chain_ndims=1)
    return {"theta": jnp.mean(samples, axis=(0, 1)), "acceptance": jnp.mean(accepted), "ess": ess, "rhat": rhat,
            "samples": samples}


def _returns_linear(model, w):
    return model["base"] + model["jacobian"] @ w


@functools.partial(jit, static_argnames=("config", "exact", "bank"))
def _fit_all(keys, defaults, mask, lower, upper, bands, model, data, config: TuningConfig,
             exact: tuple[int, ...] = (), bank: RewardBank | None = None, clips: Clip | None = None):
    """Every candidate in one call: those linear in their weights vmapped over `model` ([N, ...]); those in
    `exact` (static indices into `bank`) each evaluating its own program on `clips` at every step."""

    def one(key, w0, m, lo, hi, band, returns_of):
        if config.method == "mh":
            out = _fit_mh(key, returns_of, w0, m, data, config, lo, hi, band)
            out["theta"] = into_bands(out["theta"], w0, m, band)  # the chains' mean of a band's inside may not be
        else:
            out = _fit_adam(key, returns_of, w0, m, data, config, config.method, lo, hi, band)
        before = heldout_figures(returns_of(w0), data, config.beta)
        after = heldout_figures(returns_of(weights_from_theta(out["theta"], w0) * m), data, config.beta)
        return out | {"before": before, "after": after}

    n = defaults.shape[0]
    linear = [i for i in range(n) if i not in exact]
    results = {}
    if linear:
        idx = jnp.asarray(linear)
        batched = jax.vmap(lambda k, w0, m, lo, hi, band, part: one(k, w0, m, lo, hi, band,
                                                                    functools.partial(_returns_linear, part)))(
            keys[idx], defaults[idx], mask[idx], lower[idx], upper[idx], tuple(b[idx] for b in bands),
            jax.tree.map(lambda x: x[idx], model))
        results |= {i: jax.tree.map(lambda x, j=j: x[j], batched) for j, i in enumerate(linear)}
    for i in exact:
        own = RewardBank.from_compiled([bank.rewards[i]])
        width = len(bank.rewards[i].params)
        returns_of = lambda w, own=own, width=width: clip_returns(own, clips, w[None, :width])[0]  # noqa: E731
        results[i] = one(keys[i], defaults[i], mask[i], lower[i], upper[i], tuple(b[i] for b in bands), returns_of)
    return jax.tree.map(lambda *xs: jnp.stack(xs), *[results[i] for i in range(n)])


# -- host-side: data, the linear check, guard rails ---------------------------------------------------


def split_pairs(labels: np.ndarray, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit mask, held-out mask) over pairs, f32[P] each; skips (NaN) in neither."""
    labels = np.asarray(labels, np.float32)
    labelled = np.flatnonzero(~np.isnan(labels))
    order = np.random.default_rng(seed).permutation(labelled)
    held_n = int(round(holdout * len(order))) if len(order) >= 2 else 0
    fit, held = np.zeros(len(labels), np.float32), np.zeros(len(labels), np.float32)
    held[order[:held_n]] = 1.0
    fit[order[held_n:]] = 1.0
    return fit, held


def linear_model(bank: RewardBank, clips: Clip, key: jax.Array, rtol: float = 1e-3) -> tuple[dict, np.ndarray]:
    """({"base": f32[N, K], "jacobian": f32[N, K, P]}, bool[N]): the affine model of every candidate's
    returns in its weights at the defaults, and whether it holds (checked at two random weight settings).
    """
    defaults = bank.default_params()
    n, w = defaults.shape
    noise = jax.random.normal(key, (2, n, w))
    probes = jnp.where(defaults != 0, defaults * jnp.exp(noise), noise)
    base, jacobian, at_probes = _returns_and_jacobian(bank, clips, defaults, probes)
    predicted = base[None] + jnp.einsum("nkw,snw->snk", jacobian, probes - defaults[None])
    # Relative to each candidate's own scale of returns (returns of 1e-3 must not pass on an absolute slack).
    scale = jnp.max(jnp.abs(at_probes), axis=(0, 2), keepdims=True) + 1e-30
    holds = np.asarray(jnp.all(jnp.abs(at_probes - predicted) <= rtol * scale, axis=(0, 2)))
    return {"base": base - jnp.einsum("nkw,nw->nk", jacobian, defaults), "jacobian": jacobian}, holds


@functools.partial(jit, static_argnames=("bank",))
def _returns_and_jacobian(bank: RewardBank, clips: Clip, defaults, probes):
    # The clips are an argument, never a closed-over constant: XLA folds constants into the exported
    # programs and then fails to refine their symbolic batch ("Failed to converge StablehloRefineShapes").
    # Clip k's return depends on clip k alone, so the Jacobian's rows are the gradients of the summed
    # returns w.r.t. one copy of the weights per clip: one reverse pass, memory linear in the clips.
    # (jacrev would run K reverse passes over all K clips at once: 70 GB at 800 clips of 15 s.)
    k = jax.tree.leaves(clips.valid)[0].shape[0]

    def summed(per_clip, i):  # f32[K, W] -> f32[]
        params = jnp.broadcast_to(defaults, (k, *defaults.shape)).at[:, i].set(per_clip)
        return jnp.sum(clip_returns(bank, clips, params)[i])

    base = clip_returns(bank, clips, defaults)
    jacobian = jnp.stack([jax.grad(summed)(jnp.broadcast_to(defaults[i], (k, defaults.shape[1])), i)
                          for i in range(bank.num_rewards)])  # [N, K, W]
    at_probes = jax.vmap(lambda params: clip_returns(bank, clips, params))(probes)
    return base, jacobian, at_probes


def fit_returns(model: dict | None, defaults, mask, first, second, labels, config: TuningConfig, *,
                exact=(), bank: RewardBank | None = None, clips: Clip | None = None, ids=None,
                bounds: tuple | None = None, bands: tuple | None = None) -> dict:
    """The jitted fit of every candidate, on returns of K clips and pairs of them (numpy results).

    Args:
        model: {"base": f32[N, K], "jacobian": f32[N, K, W]}: returns = base + jacobian @ w for the
            candidates not in `exact`.
        exact: indices of candidates whose returns are not affine in their weights: each step evaluates
            `bank.rewards[i]` on `clips` (leading axis K).
        defaults, mask: f32[N, W]: the weights' defaults, 1 where a candidate declares the weight.
        first, second: i32[P] clip indices of each pair; labels: f32[P] (+1, -1, 0, NaN skip).
        ids: i32[N] names the candidates' random streams (default 0..N-1), so a candidate draws the
            same numbers whichever bank it is tuned in.
        bounds: (lower, upper) f32[N, W] on theta (`theta_bounds`; default +-log max_factor).
        bands: (numerator, denominator, least, most) from `band_arrays` (default: none).

    Returns:
        {"theta": [N, W], "before"/"after": (held-out accuracy [N], log-likelihood [N]), "fit"/"held":
        the pair masks, and per method "curve" [N, steps] (Adam: the loss) or "samples" [N, S, C, W],
        "acceptance" [N], "ess" and "rhat" [N, W] (mh)}.
    """
    labels = np.asarray(labels, np.float32)
    exact = tuple(int(i) for i in exact)
    fit, held = split_pairs(labels, config.holdout, config.seed)
    data = {"first": jnp.asarray(first), "second": jnp.asarray(second),
            "y": jnp.asarray(np.where(np.isnan(labels), 0.5, (labels + 1.0) / 2.0), jnp.float32),
            "fit": jnp.asarray(fit), "held": jnp.asarray(held)}
    defaults = jnp.asarray(defaults, jnp.float32)
    ids = np.arange(defaults.shape[0]) if ids is None else np.asarray(ids)
    base = jax.random.fold_in(jax.random.key(config.seed), 2)
    keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(ids, jnp.uint32))
    if bounds is None:
        limit = theta_limit(defaults, config)
        bounds = (-limit, limit)
    lower, upper = (jnp.asarray(b, jnp.float32) for b in bounds)
    if bands is None:
        bands = band_arrays(np.asarray(defaults), [()] * defaults.shape[0])
    bands = tuple(jnp.asarray(b, jnp.float32) for b in bands)
    out = _fit_all(keys, defaults, jnp.asarray(mask, jnp.float32), lower, upper, bands, model, data, config,
                   exact=exact, bank=bank if exact else None, clips=clips if exact else None)
    return jax.device_get(out) | {"fit": fit, "held": held}


def tune(bank: RewardBank, first: Clip, second: Clip, labels, config: TuningConfig = TuningConfig(),
         limits=None, bands=None) -> TuningResult:
    """Tunes every candidate's PARAMS against labelled pairs (first[p] vs second[p]).

    Args:
        first, second: Clips with leading axis P (numpy or jax).
        labels: f32[P]: +1 first preferred, -1 second, 0 tie, NaN skip.
        limits: None, or per candidate None or {weight name: (least, most)}: ranges its weights keep
            besides `max_factor` (for example a price the task names that may rise but never fall).
        bands: None, or per candidate None or a list of `PriceBand`: ratios of its weights kept in a band.
    """
    labels = np.asarray(labels, np.float32)
    if labels.ndim != 1 or first.valid.shape[0] != labels.shape[0] or second.valid.shape[0] != labels.shape[0]:
        raise ValueError(f"labels must be [P] with P clips on each side; got labels {labels.shape}, "
                         f"first {first.valid.shape}, second {second.valid.shape}")
    defaults = np.asarray(bank.default_params())
    names = bank.param_names
    mask = np.zeros_like(defaults)
    for n, own in enumerate(names):
        mask[n, :len(own)] = 1.0
    bounds = theta_bounds(defaults, names, config, limits)
    band = band_arrays(defaults, names, bands)
    fit, held = split_pairs(labels, config.holdout, config.seed)
    clips, first_index, second_index = unique_clips(first, second)
    t0 = time.perf_counter()
    result = None
    holds = np.zeros(bank.num_rewards, bool)
    if bank.num_params > 0 and fit.sum() >= config.min_preferences:
        affine, holds = linear_model(bank, clips, jax.random.fold_in(jax.random.key(config.seed), 1))
        ids = [zlib.crc32(r.name.encode()) & 0x7FFFFFFF for r in bank.rewards]
        result = fit_returns(affine, defaults, mask, first_index, second_index, labels, config,
                             exact=np.flatnonzero(~holds), bank=bank, clips=clips, ids=ids, bounds=bounds, bands=band)
    seconds = time.perf_counter() - t0

    out, matrix = [], defaults.copy()
    for n, reward in enumerate(bank.rewards):
        own = names[n]
        default_params = {k: float(v) for k, v in reward.params.items()}
        common = {"name": reward.name, "defaults": default_params, "train_pairs": int(fit.sum()),
                  "heldout_pairs": int(held.sum())}
        if result is None or not own:
            reason = (f"{reward.name} declares no PARAMS" if not own else
                      f"{int(fit.sum())} labelled pairs to fit on, fewer than the minimum {config.min_preferences}")
            out.append(CandidateTuning(params=default_params, tuned=False, reason=reason,
                                       heldout_accuracy_before=None, heldout_accuracy_after=None,
                                       heldout_loglik_before=None, heldout_loglik_after=None, **common))
            continue
        theta = np.asarray(result["theta"][n][:len(own)], np.float64)
        weights = np.asarray(weights_from_theta(theta, defaults[n, :len(own)]), np.float64)
        acc_b, ll_b = (_finite_or_none(x[n]) for x in result["before"])
        acc_a, ll_a = (_finite_or_none(x[n]) for x in result["after"])
        mh = {"returns": "linear" if holds[n] else "exact"}
        if config.method == "mh":
            mh |= {"acceptance": float(result["acceptance"][n]),  # (a weight pinned by its limits: None)
                  "ess": {k: _finite_or_none(v) for k, v in zip(own, result["ess"][n], strict=False)},
                  "rhat": {k: _finite_or_none(v) for k, v in zip(own, result["rhat"][n], strict=False)}}
        if not np.all(np.isfinite(theta)) or not np.all(np.isfinite(weights)):
            tuned, reason = False, "diverged: a weight is not finite"
        elif np.max(np.abs(theta[defaults[n, :len(own)] != 0]), initial=0.0) > math.log(config.max_change):
            moved = np.where(defaults[n, :len(own)] != 0, np.abs(theta[:len(own)]), -np.inf)
            worst = own[int(np.argmax(moved))]
            tuned, reason = False, f"diverged: {worst} moved by more than {config.max_change:g}x"
        elif ll_a is not None and ll_b is not None and ll_a < ll_b:
            tuned, reason = False, f"held-out log-likelihood fell ({ll_b:.3f} -> {ll_a:.3f} per pair)"
        else:
            tuned, reason = True, (f"tuned on {int(fit.sum())} pairs" +
                                   (f"; held-out accuracy {acc_b:.2f} -> {acc_a:.2f}" if acc_a is not None else ""))
        params = {k: float(v) for k, v in zip(own, weights, strict=True)} if tuned else default_params
        if tuned:
            matrix[n, :len(own)] = weights
        out.append(CandidateTuning(params=params, tuned=tuned, reason=reason, heldout_accuracy_before=acc_b,
                                   heldout_accuracy_after=acc_a, heldout_loglik_before=ll_b,
                                   heldout_loglik_after=ll_a, **mh, **common))
    return TuningResult(candidates=tuple(out), params=matrix.astype(np.float32), method=config.method,
                        fit_seconds=seconds, clips=int(clips.valid.shape[0]))


def _finite_or_none(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def with_params(source: str, params: dict[str, float]) -> str:
    """The program `source` with its module-level `PARAMS = {...}` replaced by `params` (host-side text).

    Raises ValueError when the program has no such assignment or `params` names a weight it lacks.
    """
    import ast

    tree = ast.parse(source)
    node = next((n for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
                 and any(isinstance(t, ast.Name) and t.id == "PARAMS"
                         for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))), None)
    if node is None or not isinstance(node.value, ast.Dict):
        raise ValueError("the program has no module-level PARAMS = {...} to rewrite")
    declared = [ast.literal_eval(k) for k in node.value.keys]
    unknown = set(params) - set(declared)
    if unknown:
        raise ValueError(f"PARAMS declares {declared}, not {sorted(unknown)}")
    values = [float(f"{float(params.get(name, ast.literal_eval(v))):.6g}")  # 6 digits, always a float
              for name, v in zip(declared, node.value.values, strict=True)]
    body = "".join(f"    {name!r}: {value!r},\n" for name, value in zip(declared, values, strict=True))
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:node.lineno - 1]) + node.col_offset
    end = sum(len(line) for line in lines[:node.end_lineno - 1]) + node.end_col_offset
    return source[:start] + "PARAMS = {\n" + body + "}" + source[end:]
