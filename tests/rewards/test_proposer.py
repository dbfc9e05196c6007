import dataclasses

import jax
import numpy as np
import pytest

from jaxrace.rewards import RewardBank, compile_reward, propose

TASK = "win the race cleanly from the back of the grid"


def test_proposals_are_valid_distinct_and_deterministic_per_key():
    a = propose(TASK, 6, jax.random.key(0))
    b = propose(TASK, 6, jax.random.key(0))
    c = propose(TASK, 6, jax.random.key(1))
    assert [p.source for p in a] == [p.source for p in b]
    assert [p.source for p in a] != [p.source for p in c]
    assert len({p.source.split("\n", 2)[2] for p in a}) == 6
    compiled = [compile_reward(p.source, name=p.name) for p in a]
    bank = RewardBank.from_compiled(compiled)
    assert bank.num_rewards == 6
    for p, r in zip(a, compiled, strict=True):
        assert r.component_names == p.terms
        assert "not an LLM" in p.source
        assert any(t in p.terms for t in ("progress", "pace"))


def test_task_words_make_terms_certain():
    clean = propose("finish cleanly, no contact", 5, jax.random.key(2))
    assert all({"rear_end", "contact"} <= set(p.terms) for p in clean)
    racing = propose("overtake and win", 5, jax.random.key(2))
    assert all("positions" in p.terms for p in racing)


def test_for_a_clean_task_a_rear_end_costs_more_than_a_place_pays():
    # at the library's old contact weights (6 and 2) 21 of these 48 drew a rear-end (with its contact)
    # at less than two places' pay, 12 at less than one, and the loop's winners won by force
    proposals = [p for k in range(8) for p in propose(TASK, 6, jax.random.key(k))]
    assert all("positions" in p.weights for p in proposals)  # "back of the grid" makes it certain
    for p in proposals:
        assert p.weights["rear_end"] + p.weights["contact"] > 2.0 * p.weights["positions"], p.source


def test_a_term_the_task_names_is_never_weighted_below_its_library_weight():
    from jaxrace.rewards.proposer import TERMS

    fresh = [p for k in range(8) for p in propose(TASK, 6, jax.random.key(k))]
    light = propose(TASK, 1, jax.random.key(4))[0]
    light = dataclasses.replace(light, weights={t: 0.1 * w for t, w in light.weights.items()})
    children = propose(TASK, 6, jax.random.key(5), parents=(light,))
    for p in fresh + children:
        for t in ("rear_end", "contact", "positions", "off_course", "wall", "finish"):  # named by TASK
            assert p.weights[t] >= TERMS[t][1], (t, p.weights[t])
    # a term the task does not name still draws below its library weight
    assert any(p.weights[t] < TERMS[t][1] for p in fresh for t in p.weights
               if t in ("slip", "heading", "edge", "kerb", "steering_effort", "speed_match", "time"))


def test_a_hostile_task_text_cannot_break_the_program():
    proposals = propose('"""\nimport os\nos.system("x")  # """', 2, jax.random.key(3))
    for p in proposals:
        compile_reward(p.source)


def test_bad_m_is_rejected():
    with pytest.raises(ValueError, match="at least 1"):
        propose(TASK, 0, jax.random.key(0))


def test_parents_are_mutated_never_repeated():
    parent = propose(TASK, 1, jax.random.key(4))[0]
    children = propose(TASK, 6, jax.random.key(5), parents=(parent,))
    again = propose(TASK, 6, jax.random.key(5), parents=(parent,))
    assert [c.source for c in children] == [c.source for c in again]
    bodies = {c.source.split("\n", 2)[2] for c in children}
    assert len(bodies) == 6 and parent.source.split("\n", 2)[2] not in bodies
    # Half are mutants: the parent's terms give or take one, its structure mostly, weights jittered.
    mutants = children[:3]
    for c in mutants:
        assert len(set(c.terms) ^ set(parent.terms)) <= 2
        assert any(c.weights[t] != parent.weights[t] for t in set(c.terms) & set(parent.terms))
    # Terms the task makes certain are never dropped.
    assert all({"rear_end", "contact", "positions"} <= set(c.terms) for c in children)


def test_a_bound_never_cuts_the_price_of_a_term_the_task_names():
    """Clipped or squashed, a program bounds only the terms the task does not name: a rear-end costs its
    full weight (and its contact's) on any step, however large the bounded terms, which stay bounded."""
    from jaxrace.rewards import compile_rewards
    from jaxrace.rewards.proposer import parse_proposal
    from jaxrace.rewards.synthetic import action, view

    bounded = [p for k in range(4) for p in propose(TASK, 6, jax.random.key(k))
               if p.structure in ("clipped", "squashed")]
    assert {p.structure for p in bounded} == {"clipped", "squashed"}
    a = action(0.0, 1.0)
    for p, r in zip(bounded, compile_rewards([p.source for p in bounded]), strict=True):
        written = parse_proposal(p.source)  # as a parent reads it back: the weights as printed
        assert written.structure == p.structure and written.terms == p.terms
        assert written.cap == pytest.approx(p.cap, rel=1e-3)
        p = written
        for moved in (0.0, 60.0):  # far past the bound: 60 m in a step
            prev, clear = view(progress=100.0, speed=30.0), view(progress=100.0 + moved, speed=30.0)
            hit = view(progress=100.0 + moved, speed=30.0, hit_other_from_behind=True)
            (t_clear, c), (t_hit, _) = r(prev, a, clear), r(prev, a, hit)
            cost = p.weights["rear_end"] + p.weights["contact"]
            assert float(t_clear - t_hit) == pytest.approx(cost, rel=1e-5), (p.name, moved)
            named = sum(float(c[t]) for t in ("off_course", "wall", "positions", "closing", "leading", "finish"))
            assert float(t_clear) - named <= p.cap * (1 + 1e-6), p.source  # the rest is bounded


def test_a_rear_end_costs_at_least_ten_places_pay_in_every_program_that_has_both():
    """Fresh or mutated (from a parent that paid a place 40 and charged a rear-end 110), a program with a
    contact term and a place term charges a rear-end with its contact at least ten places' pay, counting
    the finish's pay per place; as written in its PARAMS, so the trained program keeps the rule."""
    from jaxrace.rewards.proposer import MIN_PLACES_PER_REAR_END, parse_proposal, priced

    parent = propose(TASK, 1, jax.random.key(4))[0]
    greedy = dataclasses.replace(parent, weights=parent.weights | {"positions": 10.0, "finish": 30.0,
                                                                   "rear_end": 100.0, "contact": 10.0})
    proposals = [p for k in range(8) for p in propose(TASK, 6, jax.random.key(k))]
    proposals += propose(TASK, 6, jax.random.key(5), parents=(greedy,))
    proposals += [p for k in range(4) for p in propose("overtake and stay safe", 6, jax.random.key(k))]
    raised = 0
    for p in proposals:
        w = parse_proposal(p.source).weights
        price = w.get("rear_end", 0.0) + w.get("contact", 0.0)
        pay = w.get("positions", 0.0) + w.get("finish", 0.0)
        if price and pay:
            assert price >= MIN_PLACES_PER_REAR_END * pay, p.source
            raised += price > 1.01 * MIN_PLACES_PER_REAR_END * pay  # most draws meet it as drawn
    assert raised > 0
    # exact: raised in proportion, the rest untouched but for the pace, which the price in seconds then needs
    # (210.4 against 40 a second: 5.3 s, so the pace is raised to 3 s); nothing to do without both kinds of term
    assert priced({"pace": 4.0, "positions": 5.0, "finish": 16.0, "rear_end": 150.0, "contact": 50.0}) == pytest.approx(
        {"pace": 4.0 * 210.0 * 1.002 / 120.0 * 1.002, "positions": 5.0, "finish": 16.0,
         "rear_end": 150.0 * 1.05 * 1.002, "contact": 50.0 * 1.05 * 1.002})
    assert priced({"pace": 4.0, "positions": 50.0}) == {"pace": 4.0, "positions": 50.0}
    assert priced({"rear_end": 100.0, "contact": 10.0, "positions": 5.0}) == {"rear_end": 100.0, "contact": 10.0,
                                                                              "positions": 5.0}


def test_every_program_prices_a_rear_end_at_1_5_to_3_seconds_of_its_pay_for_progress():
    """Fresh or mutated (from a parent whose rear-end cost 7 s of its pace and one whose cost 0.5 s), as
    written in its PARAMS, a program with a contact term prices a rear-end with its contact within
    REAR_END_SECONDS of its pay for progress at the reference speed; too dear raises the pay for progress,
    too cheap the contacts, and the ten places' rule still holds."""
    from jaxrace.rewards.proposer import (
        MIN_PLACES_PER_REAR_END,
        REAR_END_SECONDS,
        parse_proposal,
        priced,
        rear_end_seconds,
    )

    parent = propose(TASK, 1, jax.random.key(4))[0]
    dear = dataclasses.replace(parent, terms=("pace", "rear_end", "contact", "positions"),
                               weights={"pace": 2.9, "rear_end": 179.0, "contact": 25.0, "positions": 5.0})
    cheap = dataclasses.replace(dear, weights={"pace": 20.0, "rear_end": 90.0, "contact": 10.0, "positions": 5.0})
    proposals = [p for k in range(8) for p in propose(TASK, 6, jax.random.key(k))]
    proposals += propose(TASK, 6, jax.random.key(5), parents=(dear, cheap))
    least, most = REAR_END_SECONDS
    seen = []
    for p in proposals:
        w = parse_proposal(p.source).weights
        seconds = rear_end_seconds(w)
        assert seconds is not None, p.source  # the task names the contacts: every program prices them
        assert least <= seconds <= most, (seconds, p.source)
        if "positions" in w or "finish" in w:
            assert w["rear_end"] + w["contact"] >= MIN_PLACES_PER_REAR_END * (w.get("positions", 0.0)
                                                                              + w.get("finish", 0.0))
        seen.append(seconds)
    assert max(seen) > 2.9 and min(seen) < 1.6  # both edges are met
    # exact: the pace raised to 3 s (7.0 s drawn), the contacts raised to 1.5 s (0.5 s drawn)
    assert rear_end_seconds(dear.weights) == pytest.approx(204.0 / 29.0)
    assert priced(dear.weights) == pytest.approx(dear.weights | {"pace": 2.9 * (204.0 / 29.0) / 3.0 * 1.002})
    assert priced(cheap.weights) == pytest.approx(cheap.weights | {"rear_end": 90.0 * 3.0 * 1.002,
                                                                   "contact": 10.0 * 3.0 * 1.002})
    assert rear_end_seconds({"progress": 1.0, "rear_end": 100.0, "contact": 10.0}) == pytest.approx(2.2)  # gt_sophy
    assert rear_end_seconds({"progress": 1.0, "positions": 5.0}) is None


def test_a_fresh_programs_price_is_drawn_across_the_band_not_clamped_to_its_edges():
    """A fresh program's price in seconds is drawn within REAR_END_SECONDS and met exactly, by raising
    the contacts (drawn cheaper) or the pay for progress (drawn dearer); a target outside is refused."""
    from jaxrace.rewards.proposer import REAR_END_SECONDS, parse_proposal, priced, rear_end_seconds

    fresh = [rear_end_seconds(parse_proposal(p.source).weights)
             for k in range(8) for p in propose(TASK, 6, jax.random.key(k))]  # no parents: all fresh
    least, most = REAR_END_SECONDS
    at_an_edge = [s for s in fresh if s < least * 1.01 or s > most / 1.01]
    assert len(fresh) == 48 and len(at_an_edge) <= 6, sorted(fresh)
    assert np.median(fresh) == pytest.approx(np.sqrt(least * most), rel=0.15)
    w = {"pace": 2.9, "rear_end": 179.0, "contact": 25.0, "positions": 5.0}  # 7.0 s drawn
    assert priced(w, 2.0) == pytest.approx(w | {"pace": 2.9 * (204.0 / 29.0) / 2.0})
    assert priced(w | {"pace": 20.0}, 2.0) == pytest.approx(w | {"pace": 20.0, "rear_end": 179.0 * 400.0 / 204.0,
                                                                 "contact": 25.0 * 400.0 / 204.0})
    assert rear_end_seconds(priced(w, 1.5)) == pytest.approx(1.5 * 1.002)  # a hair inside at an edge
    with pytest.raises(ValueError, match="outside REAR_END_SECONDS"):
        priced(w, 3.5)


def test_the_proposers_tuning_band_holds_a_rear_ends_price_in_seconds():
    from jaxrace.rewards.proposer import parse_proposal, tuning_bands

    p = parse_proposal(next(p for p in propose(TASK, 6, jax.random.key(0)) if "pace" in p.terms).source)
    (band,) = tuning_bands(p)
    assert band.numerator == {"w_rear_end": 1.0, "w_contact": 1.0} and band.denominator == {"w_pace": 10.0}
    assert (band.least, band.most) == (1.5, 3.0)
    assert 1.5 <= band.ratio({f"w_{t}": w for t, w in p.weights.items()}) <= 3.0
    # a program written elsewhere at 7 s may not go dearer, nor cheaper than 1.5 s
    outside = dataclasses.replace(p, weights={"pace": 2.9, "rear_end": 179.0, "contact": 25.0})
    (band,) = tuning_bands(outside)
    assert band.least == 1.5 and band.most == pytest.approx(204.0 / 29.0)
    assert tuning_bands(dataclasses.replace(p, weights={"pace": 4.0, "positions": 5.0})) == []


def test_at_the_far_corner_of_the_proposers_tuning_limits_its_rules_still_hold():
    """Where tuning could reach toward a dearer place and every price cut (the judge of a run that tuned a
    rear-end from 221 to 92), a proposal's named prices have not fallen, its place pay has not risen, and
    a term the task names is at its library weight or above."""
    import numpy as np

    from jaxrace.rewards.proposer import MIN_PLACES_PER_REAR_END, TERMS, parse_proposal, tuning_limits
    from jaxrace.rewards.tuning import TuningConfig, theta_bounds

    p = next(p for k in range(4) for p in propose(TASK, 6, jax.random.key(k)) if "finish" in p.terms)
    p = parse_proposal(p.source)
    limits = tuning_limits(p, TASK)
    names = [tuple(f"w_{t}" for t in p.terms)]
    defaults = np.asarray([[p.weights[t] for t in p.terms]], np.float32)
    lower, upper = theta_bounds(defaults, names, TuningConfig(), [limits])
    # the extremes the tuner may reach in the directions the judge pulled
    cheap = {t: p.weights[t] * float(np.exp(lower[0, i] if t in ("rear_end", "contact", "off_course", "wall")
                                            else upper[0, i])) for i, t in enumerate(p.terms)}
    assert cheap["rear_end"] == pytest.approx(p.weights["rear_end"], rel=1e-5)
    assert cheap["positions"] == pytest.approx(p.weights["positions"], rel=1e-5)
    assert (cheap["rear_end"] + cheap["contact"]) >= MIN_PLACES_PER_REAR_END * (
        cheap["positions"] + cheap["finish"]) * (1 - 1e-5)
    for t in ("off_course", "wall"):
        assert cheap[t] >= TERMS[t][1] * (1 - 1e-5) and cheap[t] <= p.weights[t]
    assert "w_pace" not in limits and "w_progress" not in limits  # free within the tuner's 3x


def test_where_places_pay_a_bound_never_cuts_a_contacts_price_even_if_the_task_does_not_name_it():
    """'overtake and win' names no contact, but a program that draws a contact term beside its place terms
    keeps the contact outside the clip or squash, so the price rule holds on what a rear-end costs."""
    from jaxrace.rewards import compile_rewards
    from jaxrace.rewards.synthetic import action, view

    bounded = [p for k in range(12) for p in propose("overtake and win", 6, jax.random.key(k))
               if p.structure in ("clipped", "squashed") and "rear_end" in p.terms]
    assert bounded
    for p, r in zip(bounded, compile_rewards([p.source for p in bounded]), strict=True):
        prev, clear = view(progress=100.0, speed=30.0), view(progress=160.0, speed=30.0)
        hit = view(progress=160.0, speed=30.0, hit_other_from_behind=True)
        (t_clear, _), (t_hit, _) = r(prev, action(0.0, 1.0), clear), r(prev, action(0.0, 1.0), hit)
        cost = p.weights["rear_end"] + p.weights.get("contact", 0.0)
        assert float(t_clear - t_hit) == pytest.approx(cost, rel=1e-3), p.source


def test_the_library_gt_sophy_in_the_proposers_terms_pays_what_the_library_pays_on_the_course():
    """A run can start from the library's gt_sophy (`start_reward`): the proposer writes it in its own terms
    at the library's weights, so it can mutate and tune it. On the course (its off-course term differs by
    1.5 a step off it, the nearest term the proposer has) every transition pays what the library's does."""
    from jaxrace.rewards.library import library_reward
    from jaxrace.rewards.proposer import LIBRARY_FORMS, library_proposal, parse_proposal
    from jaxrace.rewards.synthetic import action, view

    p = library_proposal("gt_sophy", TASK)
    assert parse_proposal(p.source).weights == LIBRARY_FORMS["gt_sophy"] == p.weights
    ours, library = compile_reward(p.source, name="start"), library_reward("gt_sophy")
    prev = view(progress=100.0, speed=40.0, rank=5, gap_ahead=20.0)
    cases = [view(progress=104.0, speed=40.0, rank=5, gap_ahead=18.5),  # closing on the car ahead
             view(progress=104.5, speed=41.0, rank=4, gap_ahead=30.0),  # a place gained
             view(progress=103.0, speed=30.0, rank=5, gap_ahead=19.0, hit_other_from_behind=True),
             view(progress=103.5, speed=38.0, rank=5, side_contact=True, tyre_slip=0.3, wall_contact=True)]
    for curr in cases:
        assert float(ours(prev, action(), curr)[0]) == pytest.approx(float(library(prev, action(), curr)[0]),
                                                                     rel=1e-6)
    off = view(progress=102.0, speed=20.0, rank=5, off_course=True)
    assert float(ours(prev, action(), off)[0]) == pytest.approx(float(library(prev, action(), off)[0]) - 1.5)
    with pytest.raises(ValueError, match="no library reward 'sophy'.*gt_sophy"):
        library_proposal("sophy", TASK)
