"""gapdyn.evidence.collapse: run outcomes on constructed trajectories; the eta* scan + bisection on synthetic run_stats
functions with known collapse and dip sets."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gapdyn as g
from tests.strategies import island_min_J, island_sets

LO, HI = 1e-3, 10.0


@given(st.floats(1e-6, 1.0), st.floats(1.5, 1e4), st.floats(1.001, 1.5))
def test_grid_spacing_and_endpoints(lo, span, ratio):
    grid = g.eta_grid(lo, lo * span, max_ratio=ratio)
    assert grid[0] == lo and grid[-1] == lo * span
    assert np.all(grid[1:] / grid[:-1] <= ratio * (1 + 1e-12))
    assert np.all(np.diff(grid) > 0)


def test_one_island_step_function():
    c = 0.0377
    res = g.find_eta_star(island_min_J([(c, math.inf)]), LO, HI)
    assert res.status == "found" and res.n_islands == 1
    lo, hi = res.bracket
    assert lo < c <= hi and hi / lo - 1 <= 1e-3
    assert res.eta_star == hi and res.eta_safe == lo  # the reported threshold is a collapsed run, not a midpoint


@pytest.mark.parametrize("points", [1, 2, 9, 40])
def test_scan_is_one_vectorised_call_and_refinement_agrees_with_bisection(points):
    calls = []

    def run_stats(etas):
        calls.append(etas.size)
        return g.RunStats.constant(np.where(etas >= 0.05, 0.0, 1.0))

    res = g.find_eta_star(run_stats, LO, HI, refine_points=points, island_scan=False)
    assert calls[0] == g.eta_grid(LO, HI).size and all(n == points for n in calls[1:])
    assert res.n_evaluations == sum(calls)
    assert res.bracket[0] < 0.05 <= res.bracket[1] and res.bracket[1] / res.bracket[0] - 1 <= 1e-3


def test_narrow_islands_a_coarse_grid_steps_over_are_found():
    """Islands 1.5 % wide below a wide collapse region: a ~26 % grid sees only the wide region."""
    islands = [(0.0123, 0.0123 * 1.015), (0.051, 0.051 * 1.015), (0.29, 0.29 * 1.015), (2.0, math.inf)]
    f = island_min_J(islands)
    fine = g.find_eta_star(f, LO, HI)
    coarse = g.find_eta_star(f, LO, HI, max_ratio=1.26, rtol=1e-3, island_scan=False)
    rescanned = g.find_eta_star(f, LO, HI, max_ratio=1.26, rtol=1e-3)
    assert fine.n_islands == 4 and rescanned.n_islands == 4
    assert rescanned.eta_star == pytest.approx(fine.eta_star, rel=1e-3)  # the island scan covers the whole range
    assert fine.bracket[0] < 0.0123 <= fine.bracket[1]
    assert coarse.eta_star > 0.0123 * 1.015  # the coarse grid missed the first island
    for (a, b), (ra, rb) in zip(islands, fine.islands):
        assert a <= ra and rb < b


@given(island_sets())
def test_eta_star_is_the_start_of_the_first_island_and_islands_are_counted(islands):
    res = g.find_eta_star(island_min_J(islands), LO, HI)
    a = islands[0][0]
    assert res.status == "found"
    assert res.bracket[0] < a <= res.bracket[1] and res.bracket[1] / res.bracket[0] - 1 <= 1e-3
    assert res.n_islands == len(islands)


@given(island_sets())
def test_collapse_measure_per_decade_matches_the_islands(islands):
    res = g.find_eta_star(island_min_J(islands), LO, HI)
    for start, end, frac in res.collapse_per_decade:
        exact = sum(max(0.0, math.log(min(b, end)) - math.log(max(a, start))) for a, b in islands)
        exact /= math.log(end / start)
        # each island edge costs at most half a grid cell of log-eta
        tol = 2 * len(islands) * math.log(1.01) / math.log(end / start)
        assert frac == pytest.approx(exact, abs=tol)


@given(st.floats(1.01, 3.0), st.floats(0.002, 0.5))
def test_scaling_identity_is_reproduced_to_the_bisection_tolerance(c, start):
    base = [(start, start * 1.3), (start * 2, math.inf)]
    f = island_min_J(base)
    den = g.find_eta_star(f, LO, HI)
    num = g.find_eta_star(lambda e: f(e / c), LO, HI)
    check = g.check_eta_star_ratio(num, den, c)
    assert check.holds and check.missed_island is None
    assert check.ratio == pytest.approx(c, rel=2e-3)


def test_failed_identity_names_the_missed_island():
    c = 1.25
    base = [(0.02, 0.021), (0.1, math.inf)]
    den = g.find_eta_star(island_min_J(base), LO, HI)
    extra = (0.013, 0.0132)  # only the rescaled run collapses here
    num = g.find_eta_star(island_min_J([extra] + [(a * c, b * c) for a, b in base]), LO, HI)
    check = g.check_eta_star_ratio(num, den, c)
    assert not check.holds
    tag, (a, b) = check.missed_island
    assert tag == "num" and extra[0] <= a <= b < extra[1]
    assert "no counterpart" in check.message


def test_sensitivity_threshold_on_a_smooth_min_J():
    """min_J = exp(-(eta/eta0)^4): J < t first at eta0 (ln 1/t)^(1/4)."""
    eta0 = 0.2
    res = g.find_eta_star(lambda e: g.RunStats.constant(np.exp(-((e / eta0) ** 4))), LO, HI)
    assert res.eta_star == pytest.approx(eta0 * math.log(1e3) ** 0.25, rel=1e-3)
    assert res.eta_star_loose == pytest.approx(eta0 * math.log(1e2) ** 0.25, rel=1e-3)
    assert res.threshold == g.COLLAPSE_J and res.loose_threshold == g.SENSITIVITY_J


def test_censored_statuses():
    none = g.find_eta_star(lambda e: g.RunStats.constant(np.ones_like(e)), LO, HI)
    assert none.status == "none_in_range" and math.isnan(none.eta_star) and none.n_islands == 0
    assert none.dip_status == "none_in_range" and math.isnan(none.dip_recover_share)
    low = g.find_eta_star(lambda e: g.RunStats.constant(np.zeros_like(e)), LO, HI)
    assert low.status == "collapsed_at_lo" and low.eta_star == LO
    with pytest.raises(ValueError, match="num"):
        g.check_eta_star_ratio(none, low, 1.0)


def test_is_collapsed_uses_the_one_threshold():
    stats = g.RunStats.constant([0.0, 9.99e-4, 1e-3, 0.5])
    np.testing.assert_array_equal(g.is_collapsed(stats), [True, True, False, False])
    np.testing.assert_array_equal(g.is_collapsed(g.RunStats.constant([5e-3]), threshold=g.SENSITIVITY_J), [True])
    with pytest.raises(ValueError, match="dip from a collapse"):
        g.is_collapsed(np.array([0.0]))


def test_result_is_frozen_and_serialisable():
    import json

    res = g.find_eta_star(island_min_J([(0.05, math.inf)]), LO, HI)
    with pytest.raises(AttributeError):
        res.eta_star = 1.0
    with pytest.raises(ValueError):
        res.grid[0] = 1.0
    d = json.loads(json.dumps(res.to_dict()))
    assert d["eta_star"] == res.eta_star and d["n_islands"] == 1


def ok(e):
    return g.RunStats.constant(np.ones_like(e))


@pytest.mark.parametrize("kwargs, name", [
    (dict(eta_lo=0.0), "eta_lo"),
    (dict(eta_lo=-1.0), "eta_lo"),
    (dict(eta_lo=float("nan")), "eta_lo"),
    (dict(eta_hi=1e-4), "eta_hi"),
    (dict(eta_hi=float("inf")), "eta_hi"),
    (dict(max_ratio=1.0), "max_ratio"),
    (dict(rtol=0.0), "rtol"),
    (dict(rtol=0.02), "rtol"),
    (dict(max_iter=0), "max_iter"),
    (dict(refine_points=0), "refine_points"),
    (dict(threshold=0.1, loose_threshold=0.01), "threshold"),
    (dict(min_J=lambda e: g.RunStats.constant(np.ones(3))), "run_stats"),
    (dict(min_J=lambda e: g.RunStats.constant(np.full_like(e, np.nan))), "J must be finite"),
    (dict(min_J=lambda e: g.RunStats.constant(np.full_like(e, 2.0))), r"J must be success rates in \[0, 1\]"),
    (dict(min_J=lambda e: g.RunStats(np.full_like(e, -1.0), np.zeros_like(e), np.zeros_like(e))), "J_min must be"),
    (dict(min_J=lambda e: np.ones_like(e)), "dip from a collapse"),
    (dict(min_J=3.0), "run_stats"),
])
def test_bad_input_names_the_argument(kwargs, name):
    args = dict(min_J=ok, eta_lo=LO, eta_hi=HI) | kwargs
    with pytest.raises(ValueError, match=name):
        g.find_eta_star(args.pop("min_J"), args.pop("eta_lo"), args.pop("eta_hi"), **args)


def test_bisection_gives_up_after_max_iter():
    with pytest.raises(ValueError, match="max_iter"):
        g.find_eta_star(island_min_J([(0.05, math.inf)]), LO, HI, rtol=1e-12, max_iter=3, island_scan=False)
    with pytest.raises(ValueError, match="rtol"):  # an island scan at 1 + 1e-12 would be 10^13 runs
        g.find_eta_star(island_min_J([(0.05, math.inf)]), LO, HI, rtol=1e-12)


# --- run outcomes (Thm 2's J -> 0 over the last quarter; docs/evidence.md) ---------------------------------


def _traj(*segments):
    """A trajectory J_0..J_K from (value, length) segments."""
    return np.concatenate([np.full(n, v, dtype=float) for v, n in segments])


@pytest.mark.parametrize("J, expected", [
    (_traj((0.5, 1), (1e-5, 100)), "collapsed"),             # falls and stays: J -> 0
    (_traj((0.5, 2), (1e-7, 280), (1.0, 719)), "dipped"),      # the reviewed case: deep dip, recovers to 1
    (_traj((0.5, 70), (9.9e-4, 1), (0.5, 30)), "dipped"),      # a dip below 1e-3 then undecided level
    (_traj((0.2, 20), (0.995, 81)), "converged"),
    (_traj((0.2, 20), (0.995, 60), (0.98, 1), (0.995, 20)), "undecided"),  # one tail state below 0.99
    (_traj((0.4, 101)), "undecided"),
    (_traj((0.5, 75), (1e-4, 25), (2e-3, 1)), "dipped"),       # the final state rises above the level: not J -> 0
    (_traj((0.5, 76), (1e-4, 25)), "dipped"),                  # K = 100: tail is states 75..100; state 75 is 0.5
    (_traj((0.5, 75), (1e-4, 26)), "collapsed"),               # states 75..100 all below the level
    (_traj((0.5, 70), (0.0, 31)), "collapsed"),
])
def test_outcome_of_constructed_trajectories(J, expected):
    assert g.bandit_outcome(g.RunStats.from_trajectory(J))[()] == expected


def test_tail_is_the_last_quarter_of_the_states():
    assert [g.tail_start(K) for K in (1, 3, 4, 7, 8, 100, 1000)] == [1, 3, 3, 6, 6, 75, 750]
    with pytest.raises(ValueError, match="horizon"):
        g.tail_start(0)


@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=40))
def test_outcome_agrees_with_a_plain_loop(values):
    J = np.array(values)
    K = J.size - 1
    tail = [J[k] for k in range(K + 1) if 4 * (K - k) <= K]  # k >= K - K/4 (K // 4 rounds down)
    if all(x < 1e-3 for x in tail):
        want = "collapsed"
    elif any(x < 1e-3 for x in J):
        want = "dipped"
    elif all(x > 0.99 for x in tail):
        want = "converged"
    else:
        want = "undecided"
    assert g.bandit_outcome(g.RunStats.from_trajectory(J))[()] == want


def test_from_trajectory_is_vectorised_over_runs():
    J = np.stack([_traj((0.5, 1), (1e-5, 100)), _traj((0.2, 20), (0.995, 81)), _traj((0.5, 2), (0.0, 9), (1.0, 90))])
    out = g.bandit_outcome(g.RunStats.from_trajectory(J))
    assert list(out) == ["collapsed", "converged", "dipped"]
    np.testing.assert_array_equal(g.RunStats.from_trajectory(J.T, axis=0).J_tail_max,
                                  g.RunStats.from_trajectory(J).J_tail_max)


def test_run_stats_refuse_inconsistent_or_out_of_range_values():
    with pytest.raises(ValueError, match="J_min <= J_tail_min"):
        g.RunStats(np.array([0.5]), np.array([0.1]), np.array([0.6]))
    with pytest.raises(ValueError, match="share a shape"):
        g.RunStats(np.zeros(2), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="J_tail_max"):
        g.RunStats(np.zeros(1), np.zeros(1), np.array([1.5]))


def _dip_then(kind):
    """Runs that dip below 1e-3 for eta >= 0.02 and end collapsed only for eta >= 0.2 (terminal rule)."""

    def run_stats(etas):
        e = np.asarray(etas)
        J_min = np.where(e >= 0.02, 0.0, 0.5)
        tail = np.where(e >= 0.2, 0.0, np.where(e >= 0.02, 1.0 if kind == "recover" else 0.5, 0.5))
        return g.RunStats(J_min, tail, tail)

    return run_stats


@pytest.mark.parametrize("kind", ["recover", "stall"])
def test_eta_star_is_the_first_collapse_and_eta_dip_the_first_dip(kind):
    res = g.find_eta_star(_dip_then(kind), LO, HI)
    assert res.bracket[0] < 0.2 <= res.bracket[1] and res.bracket[1] / res.bracket[0] - 1 <= 1e-3
    assert res.bracket_dip[0] < 0.02 <= res.bracket_dip[1]
    grid = res.grid
    base = grid[res.base]  # the share is over the base grid, not the denser merged scan
    np.testing.assert_array_equal(base, g.eta_grid(LO, HI))
    want = np.mean(base[base >= 0.02] < 0.2)
    assert res.dip_recover_share == pytest.approx(want)
    assert set(res.outcomes[(grid >= 0.02) & (grid < 0.2)]) == {"dipped"}
    assert set(res.outcomes[grid >= 0.2]) == {"collapsed"}


def _fragmented(islands, dip_from):
    """Runs that dip for eta >= dip_from and end collapsed only on the islands [a, b) (the terminal rule's
    fragmented collapse set above the first dip)."""

    def run_stats(etas):
        e = np.asarray(etas, dtype=np.float64)
        on = np.zeros(e.shape, bool)
        for a, b in islands:
            on |= (e >= a) & (e < b)
        J_min = np.where((e >= dip_from) | on, 0.0, 0.5)  # a collapsed run has dipped
        tail = np.where(on, 0.0, np.where(e >= dip_from, 1.0, 0.5))
        return g.RunStats(J_min, tail, tail)

    return run_stats


def test_island_scan_finds_an_island_between_two_grid_points():
    grid = g.eta_grid(LO, HI)
    k = int(np.searchsorted(grid, 0.03))
    island = (grid[k] * 1.002, grid[k] * 1.006)  # 0.4 % wide, strictly inside one 1 % grid cell
    f = _fragmented([island, (0.2, math.inf)], dip_from=0.02)
    coarse = g.find_eta_star(f, LO, HI, island_scan=False)
    fine = g.find_eta_star(f, LO, HI)
    assert coarse.bracket[0] < 0.2 <= coarse.bracket[1]
    assert fine.bracket[0] < island[0] <= fine.bracket[1] and fine.bracket[1] / fine.bracket[0] - 1 <= 1e-3
    assert fine.n_evaluations > coarse.n_evaluations and np.all(np.diff(fine.grid) > 0)
    assert fine.n_islands == 2


@st.composite
def _fragmented_sets(draw):
    """Narrow islands (0.15 % to 2 % wide) above a dip at 0.01, then a collapse region from 0.5."""
    start, islands = 0.01 * draw(st.floats(1.05, 2.0)), []
    for _ in range(draw(st.integers(1, 8))):
        width = draw(st.floats(1.0015, 1.02))
        if start * width >= 0.45:
            break
        islands.append((start, start * width))
        start *= width * draw(st.floats(1.002, 1.5))
    return islands


@given(_fragmented_sets(), st.floats(1.01, 1.6))
def test_scaling_identity_holds_on_fragmented_collapse_sets(islands, c):
    """The estimator's own test: a run family scaled by c has eta* scaled by c, islands narrower than the
    1 % grid included (each island here is wider than the island scan's 0.1 % spacing)."""
    f = _fragmented(islands + [(0.5, math.inf)], dip_from=0.01)
    den = g.find_eta_star(f, LO, HI)
    num = g.find_eta_star(lambda e: f(e / c), LO, HI)
    check = g.check_eta_star_ratio(num, den, c)
    assert check.holds, check.message
    assert den.bracket[0] < islands[0][0] <= den.bracket[1] if islands else True


# --- what a scan certifies (eta_safe), the window threshold (eta_50), the grid's range ------------------------


def _comb(start, stop, period, duty):
    """Islands [a, a x period^duty) repeating every ``period`` (a ratio) from start to stop: a collapse set
    whose log-measure share is ``duty`` on [start, stop], in islands much narrower than a 1 % grid."""
    a, out = start, []
    while a < stop:
        out.append((a, min(a * period**duty, stop)))
        a *= period
    return out


def _on(islands, e):
    e = np.asarray(e, dtype=np.float64)
    on = np.zeros(e.shape, bool)
    for a, b in islands:
        on |= (e >= a) & (e < b)
    return on


def test_window_threshold_of_a_fragmented_set_is_its_closed_form_at_every_grid_offset():
    """Share 0.3 collapsed (islands ~0.07 % wide) on [0.02, 0.1), share 0.7 from 0.1 on, plus one island 0.036 %
    wide at 0.0123. The window share is 0.3 + 0.4 (x - c + w) / 2w across c = log 0.1 (w = log 1.05), so the
    smallest eta whose window is half collapsed is exactly 0.1; the first collapsed eta is the narrow island
    where the scan hits it and 0.02 where it does not."""
    comb = _comb(0.02, 0.1, 1.00237, 0.3) + _comb(0.1, 9.0, 1.00237, 0.7)
    narrow = (0.0123, 0.0123 * 1.00036)
    isl = [narrow] + comb
    f = lambda e: g.RunStats.constant(np.where(_on(isl, e), 0.0, 1.0))  # noqa: E731
    e50, stars = [], []
    for k in range(8):
        shift = 1.01 ** (k / 8)
        res = g.find_eta_star(f, LO * shift, HI * shift)
        assert res.eta_50_status == "found"
        e50.append(res.eta_50)
        stars.append(res.eta_star)
        assert _on(isl, [res.eta_star])[0]  # the first collapsed eta is a collapsed run
        assert res.eta_50_window == pytest.approx((res.eta_50 / 1.05, res.eta_50 * 1.05))
        inside = res.grid[(res.grid >= res.eta_50_window[0]) & (res.grid <= res.eta_50_window[1])]
        assert np.max(inside[1:] / inside[:-1]) <= 1.001 * (1 + 1e-9)  # the window was rescanned finely
    # islands 0.07 % wide sampled by 0.1 % cells: the window share is exact to about +-3 %, eta_50 to +-1.5 %
    assert np.allclose(e50, 0.1, rtol=1.5e-2)
    assert max(stars) / min(stars) > 1.5 and max(e50) / min(e50) < 1.02  # the first collapsed eta jumps
    assert all(s == pytest.approx(0.0123, rel=2e-3) or 0.02 <= s < 0.0201 for s in stars)


@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)), min_size=1, max_size=8),
       st.floats(1.01, 1.3), st.floats(0.05, 1.0))
def test_window_threshold_agrees_with_a_dense_evaluation_of_the_window_share(cells, half, level):
    """collapsed_window_eta against the window share evaluated on a dense log grid from the cell picture."""
    grid = g.eta_grid(0.01, 100.0, max_ratio=1.02)
    col = np.zeros(grid.size, bool)
    for u, v in cells:
        i, j = sorted((int(u * (grid.size - 1)), int(v * (grid.size - 1))))
        col[i:j + 1] = True
    status, eta = g.collapsed_window_eta(grid, col, half_width=half, level=level)
    logs = np.log(grid)
    edges = np.concatenate([[logs[0]], (logs[1:] + logs[:-1]) / 2, [logs[-1]]])
    w = math.log(half)
    xs = np.linspace(logs[0] + w, logs[-1] - w, 20001)
    fine = np.linspace(logs[0], logs[-1], 400001)
    mark = col[np.clip(np.searchsorted(edges, fine, side="right") - 1, 0, grid.size - 1)].astype(float)
    cum = np.concatenate([[0.0], np.cumsum((mark[1:] + mark[:-1]) / 2 * np.diff(fine))])
    share = (np.interp(xs + w, fine, cum) - np.interp(xs - w, fine, cum)) / (2 * w)
    hit = np.flatnonzero(share >= level - 1e-9)
    if status == "none_in_range":
        assert share.max() < level + 1e-3
        return
    assert hit.size
    step = xs[1] - xs[0]
    assert abs(math.log(eta) - xs[hit[0]]) <= 2 * step + 1e-3 / max(1e-9, 1 / (2 * w))


@given(island_sets(min_width=1.0015, min_gap=1.0015))
def test_eta_safe_is_below_every_island_wider_than_the_fine_spacing(islands):
    """Every island here is wider than the 0.1 % island scan, so none is stepped over once the base grid has
    seen a collapse (the wide region from 9.5): no scanned eta below eta_safe collapses, eta_safe lies just
    below the first island and its resolution is the fine spacing."""
    res = g.find_eta_star(island_min_J([i for i in islands if i[1] < 9.0] + [(9.5, math.inf)]), LO, HI)
    assert res.status == "found"
    assert res.eta_safe < islands[0][0] <= res.eta_star
    below = res.grid < res.eta_safe
    assert not np.any(res.outcomes[below] == "collapsed")
    assert res.safe_resolution <= 1.001 * (1 + 1e-9)


def test_island_scan_reaches_below_the_first_dip_of_the_base_grid():
    """An island (0.4 % wide, inside one 1 % cell) below the first base-grid dip: the scan from the grid point
    before the first dip misses it; the scan of the whole range below the first collapse finds it."""
    grid = g.eta_grid(LO, HI)
    k = int(np.searchsorted(grid, 0.005))
    island = (grid[k] * 1.002, grid[k] * 1.006)
    f = _fragmented([island, (0.2, math.inf)], dip_from=0.05)
    res = g.find_eta_star(f, LO, HI)
    assert res.bracket[0] < island[0] <= res.bracket[1] == res.eta_star
    assert res.safe_resolution <= 1.001 * (1 + 1e-9)


def test_reconverge_share_counts_the_base_grid_only():
    """Collapse on [0.05, 0.06) and [0.3, 1); converged elsewhere. The share of base-grid etas above eta_star that
    converge, however densely the fine scans sampled around eta_star."""
    isl = [(0.05, 0.06), (0.3, 1.0)]
    res = g.find_eta_star(island_min_J(isl), LO, HI)
    base = g.eta_grid(LO, HI)
    above = base[base > res.eta_star]
    assert res.reconverge_share == pytest.approx(np.mean(~_on(isl, above)))
    assert res.grid.size > base.size  # the merged scan is denser than the base grid


@pytest.mark.parametrize("lo, hi", [(1e-200, 1e200), (5e-324, 1.7976931348623157e308), (1e-3, 10.0)])
def test_eta_grid_spans_any_positive_bracket(lo, hi):
    grid = g.eta_grid(lo, hi)
    assert grid[0] == lo and grid[-1] == hi and np.all(np.isfinite(grid)) and np.all(np.diff(grid) > 0)
    normal = grid[:-1] >= np.finfo(float).tiny
    assert np.all(grid[1:][normal] / grid[:-1][normal] <= 1.01 * (1 + 1e-12))
    n = math.ceil((math.log10(hi) - math.log10(lo)) / math.log10(1.01) * (1 - 1e-12)) + 1
    assert grid.size <= n and (lo < 1e-300 or grid.size == n)
    with pytest.raises(ValueError, match="max_ratio"):
        g.eta_grid(1e-200, 1e200, max_ratio=1 + 1e-9)


@given(st.lists(st.sampled_from([0.0, 5e-4, 0.5, 1.0]), min_size=1, max_size=30))
def test_excursion_lengths_agree_with_a_loop(values):
    longest = final = run = 0
    for v in values:
        run = run + 1 if v < 1e-3 else 0
        longest = max(longest, run)
    final = run
    got = g.excursion_lengths(np.array([values, values]))
    assert got[0].tolist() == [longest] * 2 and got[1].tolist() == [final] * 2
