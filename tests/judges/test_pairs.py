"""Active pair selection: exact scores, and where it spends labels."""

import numpy as np
import pytest

from jaxrace.judges.pairs import choose_active, pair_information


def test_pair_information_exact():
    info = pair_information(np.array([0.0, 0.0, 2.0]), np.array([0, 0, 1]), np.array([1, 2, 2]))
    p02 = 1 / (1 + np.exp(2.0))
    assert info == pytest.approx([0.25, p02 * (1 - p02), p02 * (1 - p02)])


def test_choose_active_prefers_close_pairs_and_breaks_ties_at_random():
    scores = np.array([0.0, 0.1, 3.0, -3.0])
    items = np.array([[0, 1], [0, 2], [0, 3], [2, 3], [1, 0]])
    picked = choose_active(items, scores, 2, np.random.default_rng(0))
    assert sorted(picked.tolist()) == [0, 4]  # the close pair, in either order
    firsts = {int(choose_active(items[[0, 4]], np.zeros(4), 1, np.random.default_rng(s))[0]) for s in range(20)}
    assert firsts == {0, 1}
    assert choose_active(items, scores, 0, np.random.default_rng(0)).size == 0
