"""The offline proposer: reward programs composed from library terms at random.

It is not an LLM. It picks terms (always one that pays for progress), their weights and
a structure from a key, leaning on words in the task ("cleanly" makes the collision
terms certain, "win" or "overtake" the passing terms, and so on; a term the task names
is never weighted below its library weight, so "cleanly" never draws a rear-end at a
third of the library's price, and a clipped or squashed program bounds only the terms
the task does not name, so the bound cannot cut that price either; a program that pays
for places and prices contacts charges at least ten places' pay for a rear-end, and every program
prices a rear-end at 1.5-3 s of its pay for progress), and writes each
candidate as a reward program with its weights in PARAMS. It lets the reward-design
loop run end to end with no network; the programs it writes go through the same
compiler as an LLM's.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import numpy as np

# name: (expression in prev/action/curr, default weight, task words that make it certain)
TERMS = {
    "progress": ("curr.progress - prev.progress", 1.0, ()),
    "pace": ("(curr.progress - prev.progress) / jnp.maximum(0.1 * curr.reference_speed, 0.5)", 4.0, ()),
    "speed_match": ("-jnp.abs(curr.speed - curr.reference_speed) / 10.0", 0.5,
                    ("fast", "quick", "lap time", "time trial", "pace")),
    "off_course": ("-curr.off_course.astype(f32) * (1.0 + 0.1 * curr.speed)", 2.0,
                   ("track limits", "on track", "clean", "stay")),
    "edge": ("-jnp.maximum(-curr.edge_margin, 0.0)", 0.5, ("track limits", "on track")),
    "kerb": ("-curr.on_kerb.astype(f32)", 0.2, ("kerb",)),
    "wall": ("-curr.wall_contact.astype(f32) * jnp.square(curr.speed / 10.0)", 1.0, ("wall", "clean", "safe")),
    "slip": ("-jnp.maximum(curr.tyre_slip - 0.13, 0.0)", 10.0, ("smooth", "tyre", "tire")),
    "heading": ("-jnp.abs(curr.heading_error)", 0.5, ("smooth",)),
    "steering_effort": ("-jnp.square(action.steering)", 0.2, ("smooth",)),
    "positions": ("(prev.rank - curr.rank).astype(f32)", 5.0,
                  ("win", "overtake", "pass", "position", "back of the grid", "race")),
    "closing": ("jnp.where((prev.rank == curr.rank) & (curr.gap_ahead < 50.0) & (prev.gap_ahead < 50.0), "
                "prev.gap_ahead - curr.gap_ahead, 0.0)", 0.2, ("win", "overtake", "pass", "chase")),
    "leading": ("(curr.rank == 1).astype(f32) * (curr.num_cars > 1).astype(f32)", 0.2, ("win", "lead")),
    # the library's contact weights: a rear-end costs far more than a place pays (issue 16's recipe)
    "rear_end": ("-curr.hit_other_from_behind.astype(f32)", 100.0, ("clean", "safe", "no contact", "collision")),
    "contact": ("-(curr.side_contact | curr.hit_from_behind | curr.hit_other_from_behind).astype(f32)", 10.0,
                ("clean", "safe", "no contact", "collision")),
    "lap_bonus": ("(curr.laps > prev.laps).astype(f32)", 20.0, ("lap",)),
    # a place at the finish pays as much as a place gained in the race (at 20 a place, the finish paid
    # 20-60 per place on top of the positions, a rear-end's price for two places)
    "finish": ("(curr.finished & ~prev.finished).astype(f32) * (curr.num_cars - curr.rank + 1).astype(f32)", 5.0,
               ("win", "finish")),
    "time": ("-jnp.ones_like(curr.speed)", 0.1, ()),
}
PROGRESS_TERMS = ("progress", "pace")
# A program that both prices contacts and pays for places charges at least this many places' pay
# (`positions` plus `finish`, which pays per place at the finish) for a rear-end with its contact:
# the library's gt_sophy charges 22 (110 against 5), and every agent the loop chose at 1-4 raced
# with 2.5 or more at-fault contacts per race (docs/headline_experiment.md, *A rear-end at ten
# places' pay*). Met by raising the contact terms, which have floors and no ceilings.
CONTACT_TERMS = ("rear_end", "contact")
PLACE_TERMS = ("positions", "finish")
MIN_PLACES_PER_REAR_END = 10.0
# ... and between these many seconds of its pay for progress at the reference speed: a program whose
# rear-end cost 2.8 s (7.1 s, 6.4 s) of it made a car clean and slow, 1.1 s fast and dirty, 1.6 s and
# 3.1 s fast with 1.4-1.7 contacts a race; gt_sophy's is 2.2 s (docs/headline_experiment.md). Met by
# raising the contact terms (too cheap) or the progress term (too dear), so the other rules still hold.
REAR_END_SECONDS = (1.5, 3.0)
# A progress term's pay for a second at the reference speed: `pace` pays 1 a step there (10 Hz), `progress`
# its weight a metre, at a nominal 50 m/s (the gp circuit's reference lap averages 55.6 m/s).
NOMINAL_REFERENCE_SPEED = 50.0
PAY_PER_SECOND = {"pace": 10.0, "progress": NOMINAL_REFERENCE_SPEED}
STRUCTURES = {
    "sum": "weighted sum",
    "gated": "weighted sum with progress paid only on the course",
    "clipped": "weighted sum with the terms the task does not name clipped to [-cap, cap]",
    "squashed": "weighted sum with the terms the task does not name squashed by cap * tanh(x / cap)",
}


@dataclasses.dataclass(frozen=True)
class ProposedReward:
    """One proposed candidate: a reward program and how it was composed."""

    name: str
    source: str
    terms: tuple[str, ...]
    structure: str
    weights: dict[str, float]
    cap: float  # the clip or squash bound (unused by "sum" and "gated")


def _rng(key: jax.Array) -> np.random.Generator:
    data = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return np.random.default_rng(np.asarray(data, np.uint32).ravel().tolist())


def _program(task: str, index: int, m: int, terms: list[str], structure: str, weights: dict[str, float],
             cap: float, title: str | None = None) -> str:
    """The program's source. A clipped or squashed sum bounds the terms the task does not name (a
    progress term always among them) and adds the task's terms after the bound, and the contact terms
    too where the program pays for places (the price rule is on their full weights): clipped to 5-30, a
    rear-end's 100 cost at most a few places' pay, and those programs won the search by force
    (docs/headline_experiment.md, *The bound leaves the task's terms whole*)."""
    task_line = " ".join(task.split())[:200].replace('"""', "'''")
    title = title or f"Offline proposal {index + 1} of {m} (jaxrace offline proposer, not an LLM)"
    lines = [
        f'"""{title}: {STRUCTURES[structure]}; terms: {", ".join(terms)}."""',
        f"# task: {task_line}",
        "",
        "PARAMS = {",
        *[f'    "w_{t}": {weights[t]:.4g},' for t in terms],
        *([f'    "cap": {cap:.4g},'] if structure in ("clipped", "squashed") else []),
        "}",
        "",
        "",
        "def reward(prev, action, curr, params):",
        "    f32 = jnp.float32",
    ]
    for t in terms:
        lines.append(f'    {t} = params["w_{t}"] * ({TERMS[t][0]})')
    if structure == "gated":  # progress counts only while on the course
        progress_term = next(t for t in terms if t in PROGRESS_TERMS)
        lines.append(f"    {progress_term} = {progress_term} * (1.0 - curr.off_course.astype(f32))")
    lines.append("    components = {" + ", ".join(f'"{t}": {t}' for t in terms) + "}")
    if structure in ("clipped", "squashed"):
        named = set(_certain_terms(task))
        if any(t in terms for t in PLACE_TERMS):  # the price rule holds for the contacts' full weights
            named |= set(CONTACT_TERMS)
        bounded = " + ".join(t for t in terms if t not in named or t in PROGRESS_TERMS)
        whole = " + ".join(t for t in terms if t in named and t not in PROGRESS_TERMS)
        bound = ('jnp.clip(bounded, -params["cap"], params["cap"])' if structure == "clipped"
                 else 'params["cap"] * jnp.tanh(bounded / params["cap"])')
        lines.append(f"    bounded = {bounded}")
        if whole:
            lines.append("    # the terms the task names (and contacts, where places pay), paid in full")
        lines.append(f"    total = {bound}" + (f" + ({whole})" if whole else ""))
    else:
        lines.append("    total = sum(components.values())")
    lines.append("    return total, components")
    return "\n".join(lines) + "\n"


def rear_end_seconds(weights: dict[str, float]) -> float | None:
    """What a rear-end with its contact costs in seconds of the program's pay for progress at the reference
    speed (`PAY_PER_SECOND`); None without a contact term or a progress term."""
    price = sum(weights.get(t, 0.0) for t in CONTACT_TERMS)
    drive = sum(PAY_PER_SECOND[t] * weights.get(t, 0.0) for t in PROGRESS_TERMS)
    return price / drive if price > 0.0 and drive > 0.0 else None


def priced(weights: dict[str, float], seconds: float | None = None) -> dict[str, float]:
    """`weights` with the contact terms raised in proportion, where needed, so that a rear-end with its
    contact costs at least MIN_PLACES_PER_REAR_END places' pay, then the contact terms (too cheap) or the
    progress term (too dear) raised so that it costs REAR_END_SECONDS of the pay for progress, or `seconds`
    of it exactly where given (within REAR_END_SECONDS); a rule is left out where the program lacks its
    kinds of term."""
    least, most = REAR_END_SECONDS
    if seconds is not None and not least <= seconds <= most:
        raise ValueError(f"a rear-end's price of {seconds:g} s is outside REAR_END_SECONDS {REAR_END_SECONDS}")
    weights = dict(weights)

    def scale(kinds: tuple[str, ...], factor: float) -> None:
        weights.update({t: w * factor for t, w in weights.items() if t in kinds})

    margin = 1.002  # the program prints 4 figures (each +-5e-4)
    price = sum(weights.get(t, 0.0) for t in CONTACT_TERMS)
    pay = sum(weights.get(t, 0.0) for t in PLACE_TERMS)
    if price > 0.0 and pay > 0.0 and price < MIN_PLACES_PER_REAR_END * pay:
        scale(CONTACT_TERMS, MIN_PLACES_PER_REAR_END * pay / price * margin)
    drawn = rear_end_seconds(weights)
    if drawn is None:
        return weights
    least, most = least * margin, most / margin  # a hair inside, so the printed program keeps the band
    if seconds is not None:
        least = most = min(max(seconds, least), most)
    if drawn < least:
        scale(CONTACT_TERMS, least / drawn)
    elif drawn > most:
        scale(PROGRESS_TERMS, drawn / most)
    return weights


def tuning_limits(proposal: ProposedReward, task: str) -> dict[str, tuple[float | None, float | None]]:
    """The ranges weight tuning keeps this program's weights in (`jaxrace.rewards.tuning.tune(limits=)`),
    so that tuning never moves it against the proposer's rules: a term the task names stays at or above
    its library weight (or its own, where a program from elsewhere has less), and where the program
    prices contacts and pays for places, the contact terms may rise but not fall and the place terms
    fall but not rise, so a rear-end costs at least as many places' pay as before (ten or more for
    every program `propose` writes)."""
    certain = _certain_terms(task)
    w = proposal.weights
    both = any(t in w for t in CONTACT_TERMS) and any(t in w for t in PLACE_TERMS)
    limits = {}
    for t, weight in w.items():
        least = weight if both and t in CONTACT_TERMS else min(TERMS[t][1], weight) if t in certain else None
        most = weight if both and t in PLACE_TERMS else None
        if least is not None or most is not None:
            limits[f"w_{t}"] = (least, most)
    return limits


def tuning_bands(proposal: ProposedReward) -> list:
    """The `PriceBand`s weight tuning keeps this program in (`jaxrace.rewards.tuning.tune(bands=)`): a
    rear-end with its contact costs REAR_END_SECONDS of the pay for progress, or no further from it than
    the program's own price (a program written elsewhere may start outside); empty without both terms."""
    from jaxrace.rewards.tuning import PriceBand

    seconds = rear_end_seconds(proposal.weights)
    if seconds is None:
        return []
    least, most = REAR_END_SECONDS
    return [PriceBand(numerator={f"w_{t}": 1.0 for t in CONTACT_TERMS if t in proposal.weights},
                      denominator={f"w_{t}": PAY_PER_SECOND[t] for t in PROGRESS_TERMS if t in proposal.weights},
                      least=min(least, seconds), most=max(most, seconds))]


def _certain_terms(task: str) -> list[str]:
    lowered = task.lower()
    return [t for t, (_, _, words) in TERMS.items() if any(w in lowered for w in words)]


def _fresh(rng: np.random.Generator, certain: list[str]) -> tuple[list[str], str, dict[str, float], float]:
    optional = [t for t in TERMS if t not in certain and t not in PROGRESS_TERMS]
    terms = [str(rng.choice(PROGRESS_TERMS))]
    extra = [t for t in certain if t not in PROGRESS_TERMS]
    k = int(rng.integers(1, min(5, len(optional)) + 1))
    extra += [str(t) for t in rng.choice(optional, size=k, replace=False)]
    terms += [t for t in TERMS if t in extra and t not in terms]  # a stable order
    structure = str(rng.choice(list(STRUCTURES)))
    # a term the task names is weighted at 1-3x its library weight, any other at 0.3-3x (then the
    # contact terms are raised where the price rule needs it)
    weights = {t: float(TERMS[t][1] * np.exp(rng.uniform(0.0 if t in certain else np.log(0.3), np.log(3.0))))
               for t in terms}
    cap = float(rng.uniform(5.0, 30.0))
    # a rear-end's price in seconds is drawn log-uniform within REAR_END_SECONDS: left to the weights'
    # draws, 11 of 14 fresh programs fell dearer than the band and were all raised to its ceiling
    seconds = float(np.exp(rng.uniform(*np.log(REAR_END_SECONDS))))
    return terms, structure, priced(weights, seconds), cap


def _mutant(rng: np.random.Generator, parent: ProposedReward,
            certain: list[str]) -> tuple[list[str], str, dict[str, float], float]:
    """The parent with its weights jittered (x e^N(0, 0.35); a term the task names not below its library
    weight), and now and then a term added or dropped."""
    terms = list(parent.terms)
    optional = [t for t in TERMS if t not in terms and t not in PROGRESS_TERMS]
    droppable = [t for t in terms if t not in certain and t not in PROGRESS_TERMS]
    if optional and rng.uniform() < 0.3:
        terms.append(str(rng.choice(optional)))
    if droppable and rng.uniform() < 0.3:
        terms.remove(str(rng.choice(droppable)))
    terms = [t for t in TERMS if t in terms]
    structure = str(rng.choice(list(STRUCTURES))) if rng.uniform() < 0.2 else parent.structure
    jittered = {t: float(parent.weights.get(t, TERMS[t][1]) * np.exp(rng.normal(0.0, 0.35))) for t in terms}
    weights = {t: max(w, TERMS[t][1]) if t in certain else w for t, w in jittered.items()}
    return terms, structure, priced(weights), float(np.clip(parent.cap * np.exp(rng.normal(0.0, 0.2)), 1.0, 100.0))


def propose(task: str, m: int, key: jax.Array, parents: tuple[ProposedReward, ...] = (), *,
            numbering: tuple[int, int] | None = None) -> list[ProposedReward]:
    """M different reward programs for `task`, deterministic per `key`.

    Args:
        task: the task in words; words in it make some terms certain.
        m: how many candidates (distinct programs, none equal to a parent).
        key: a JAX PRNG key (or its raw uint32 data).
        parents: earlier candidates that did well (the loop's feedback to this proposer):
            about half of the M are mutations of them (round robin), the rest fresh.
        numbering: (index of the first, total) for the docstrings, when these M are
            part of a larger set (default (0, m)).

    Returns:
        M `ProposedReward`s; compile each `.source` with `compile_reward`.
    """
    if m < 1:
        raise ValueError(f"m must be at least 1, got {m}")
    rng = _rng(key)
    certain = _certain_terms(task)
    mutants = (m + 1) // 2 if parents else 0
    proposals: list[ProposedReward] = []
    seen = {_body_digest(p.source) for p in parents}
    for attempt in range(50 * m):
        if len(proposals) == m:
            break
        if len(proposals) < mutants and attempt < 25 * m:
            terms, structure, weights, cap = _mutant(rng, parents[len(proposals) % len(parents)], certain)
        else:
            terms, structure, weights, cap = _fresh(rng, certain)
        index = len(proposals)
        first, total = numbering or (0, m)
        source = _program(task, first + index, total, terms, structure, weights, cap)
        digest = _body_digest(source)
        if digest in seen:
            continue
        seen.add(digest)
        proposals.append(ProposedReward(name=f"offline-{first + index + 1}", source=source, terms=tuple(terms),
                                        structure=structure, weights=weights, cap=cap))
    return proposals


# The library rewards in the proposer's terms, for a run that starts from one (`DesignConfig.start_reward`,
# Eureka's start from a human reward). gt_sophy's terms at its weights, but for its off-course penalty per
# metre driven off the course (1.5 x 0.1 x speed a step), which is the proposer's `off_course` at 1.5
# (1.5 + 0.15 x speed a step), the nearest term it has.
LIBRARY_FORMS = {
    "gt_sophy": {"progress": 1.0, "off_course": 1.5, "wall": 1.0, "slip": 10.0, "positions": 5.0, "closing": 0.2,
                 "rear_end": 100.0, "contact": 10.0},
    "progress": {"progress": 1.0},
}


def library_proposal(name: str, task: str) -> ProposedReward:
    """The library reward `name` written as the proposer writes programs (a plain sum of its terms at the
    library's weights), so that the proposer can mutate it and weight tuning can tune it."""
    if name not in LIBRARY_FORMS:
        raise ValueError(f"no library reward {name!r} in the proposer's terms; choose from {sorted(LIBRARY_FORMS)}")
    weights = LIBRARY_FORMS[name]
    terms = [t for t in TERMS if t in weights]
    title = f"The library's {name} in the offline proposer's terms (a start for reward design)"
    source = _program(task, 0, 1, terms, "sum", weights, 10.0, title=title)
    return ProposedReward(name=name, source=source, terms=tuple(terms), structure="sum", weights=dict(weights),
                          cap=10.0)


def _body_digest(source: str) -> str:
    """The program without its numbered docstring and task line."""
    return hashlib.sha256(source.split("\n", 2)[2].encode()).hexdigest()


def parse_proposal(source: str) -> ProposedReward | None:
    """The `ProposedReward` an offline program was written from, or None for any other program.

    Reads the PARAMS (`w_<term>` weights, `cap`) and the structure from the code, so a
    program that went through an LLM prompt and back still works as a parent.
    """
    import ast

    try:
        tree = ast.parse(source)
        params = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "PARAMS" for t in n.targets))
    except (SyntaxError, ValueError, StopIteration):
        return None
    if not isinstance(params, dict) or not all(isinstance(v, int | float) for v in params.values()):
        return None
    terms = [k[2:] for k in params if k.startswith("w_")]
    if not terms or any(t not in TERMS for t in terms) or set(params) - {f"w_{t}" for t in terms} - {"cap"}:
        return None
    if not any(t in PROGRESS_TERMS for t in terms):
        return None
    structure = ("clipped" if "jnp.clip(total" in source or "jnp.clip(bounded" in source
                 else "squashed" if "jnp.tanh(total" in source or "jnp.tanh(bounded" in source
                 else "gated" if "* (1.0 - curr.off_course.astype(f32))" in source else "sum")
    return ProposedReward(name="parent", source=source, terms=tuple(terms), structure=structure,
                          weights={t: float(params[f"w_{t}"]) for t in terms}, cap=float(params.get("cap", 10.0)))
