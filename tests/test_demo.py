"""``gapdyn demo``'s critical step: ascent_run_stats for many etas at once equals one eta at a time, and the
demo's eta* (find_eta_star on a 5 % grid, no island rescan, then its refinement) lies in the bracket of the first
collapsing eta of the same grid run directly; ``--islands`` adds the rescan and finds a collapsing eta no later
(up to the refinement's 0.1 %)."""

from __future__ import annotations

import numpy as np

import gapdyn
from gapdyn.demo import DemoConfig, ascent_run_stats, critical_eta


def _instance(seed=1, arms=20, dim=4, correct=3):
    rng = np.random.default_rng(seed)
    phi = rng.normal(size=(arms, dim))
    r = np.zeros(arms)
    r[rng.choice(arms, correct, replace=False)] = 1.0
    return phi, r


def test_run_stats_of_many_etas_equal_one_eta_at_a_time():
    phi, r = _instance()
    etas = np.array([3.0, 300.0, 800.0, 2000.0])
    together = ascent_run_stats(phi, r, etas, steps=60)
    for i, eta in enumerate(etas):
        alone = ascent_run_stats(phi, r, [eta], steps=60)
        for name in ("J_min", "J_tail_min", "J_tail_max"):
            assert np.allclose(getattr(together, name)[i], getattr(alone, name)[0], rtol=1e-12, atol=0), name


def test_demo_eta_star_is_in_the_first_collapsing_bracket_of_its_grid():
    phi, r = _instance()
    lo, hi = 300.0, 1e3  # this instance's eta* is near 770
    star = critical_eta(phi, r, lo=lo, hi=hi)
    grid = gapdyn.eta_grid(lo, hi, max_ratio=1.05)
    collapsed = gapdyn.is_collapsed(ascent_run_stats(phi, r, grid))  # every grid eta at once: equal to a loop (above)
    assert collapsed.any(), "no collapse on the grid: the check would be vacuous"
    i = int(np.argmax(collapsed))
    assert i > 0 and grid[i - 1] < star <= grid[i] * (1 + 1e-12)
    assert gapdyn.is_collapsed(ascent_run_stats(phi, r, [star]))[0]
    with_islands = critical_eta(phi, r, lo=500.0, hi=hi, islands=True)
    assert gapdyn.is_collapsed(ascent_run_stats(phi, r, [with_islands]))[0]
    assert with_islands <= star * (1 + 2e-3)


def test_islands_is_a_switch_of_the_demo():
    from gapdyn.cmdline import parse

    assert parse(DemoConfig, [], prog="gapdyn demo").islands is False
    assert parse(DemoConfig, ["--islands"], prog="gapdyn demo").islands is True
