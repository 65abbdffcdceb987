"""Theory-core edges with no silent wrong answers: sharp threshold over extreme brackets and non-finite Phi,
the one inverse-CDF sampler, finite first-order taxonomy at extreme steps, unsigned 64-bit seeds.

Each expected value comes from an independent route: a closed form or Brent's method on the scalar
log-odds, a per-row numpy.searchsorted loop, 60-digit mpmath, Python ints."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from scipy.optimize import brentq

import gapdyn as g
from bandits.envs import make_bandit, place_theta
from bandits.reference import sample_arms
from gapdyn._validate import check_seed
from gapdyn.theory.sampling import inverse_cdf_draw
from tests.strategies import categorical_draw_inputs, loglinear_policies
from tests.tables import check_table, raises_value_error

TOP = 1.0 - 2.0**-53  # the largest uniform numpy draws

# --- sharp_step_threshold -------------------------------------------------------------------------

# 1-D log-linear policy: correct arm phi = 2, incorrect phi = 1 and 4; Phi(t) = t - log(1 + e^{3t}).
# Along w = -1 from t = 0, Phi(-e) = Phi(0) at u = e^{-e}: u^2 / (u + u^4) = 1/2, u^3 - 2u + 1 = 0,
# u = (sqrt 5 - 1) / 2, so the sharp threshold is log of the golden ratio (0.4812...).
GOLDEN_PHI = g.loglinear_logodds_fn(np.array([[2.0], [1.0], [4.0]]), np.array([1.0, 0.0, 0.0]))
GOLDEN_ETA = float(np.log((1.0 + np.sqrt(5.0)) / 2.0))


def _scalar_phi(t):
    return t - np.log1p(np.exp(3.0 * t))


@pytest.mark.parametrize("bracket", [{}, {"eta_min": 1e-300, "eta_max": 1e300}, {"eta_min": 1e-300, "eta_max": 1.0}])
def test_sharp_threshold_extreme_bracket_equals_the_closed_form(bracket):
    eta = g.sharp_step_threshold(GOLDEN_PHI, np.zeros(1), -np.ones(1), rtol=1e-13, **bracket)
    assert abs(eta - GOLDEN_ETA) <= 1e-12 * GOLDEN_ETA, eta


@pytest.mark.parametrize("t0", [0.3, 1e-3])
def test_sharp_threshold_extreme_bracket_equals_brent_on_the_scalar_phi(t0):
    # theta != 0: steps below ulp(t0) leave theta unchanged, so the bottom of the bracket decides nothing
    h = lambda e: _scalar_phi(t0 - e) - _scalar_phi(t0)  # noqa: E731
    exact = brentq(h, 1e-6, 10.0, xtol=1e-15, rtol=1e-15)
    for kw in ({}, {"eta_min": 1e-300, "eta_max": 1e300}):
        eta = g.sharp_step_threshold(GOLDEN_PHI, np.array([t0]), -np.ones(1), rtol=1e-13, **kw)
        assert abs(eta - exact) <= 1e-11 * exact, (kw, eta, exact)


@settings(max_examples=6)
@given(loglinear_policies(min_k=3, max_k=40, max_d=4))
def test_sharp_threshold_does_not_depend_on_how_far_the_bracket_reaches(policy):
    phi, th, r = policy
    gap = g.gradient_gap_from_logits(phi @ th, r, phi)
    if np.linalg.norm(gap) < 1e-4:
        return
    w = gap / np.linalg.norm(gap)
    f = g.loglinear_logodds_fn(phi, r)
    narrow = g.sharp_step_threshold(f, th, w, eta_min=1e-6, eta_max=1e4, rtol=1e-10)
    wide = g.sharp_step_threshold(f, th, w, eta_min=1e-300, eta_max=1e4, rtol=1e-10)
    if np.isfinite(narrow):
        assert abs(wide - narrow) <= 1e-9 * narrow, (wide, narrow)
    else:
        assert wide == narrow


def test_sharp_threshold_bisects_in_log_eta_below_1e_minus_290():
    # a crossing at 2e-295 with one point a decade from 1e-300: the geometric midpoint sqrt(lo * hi)
    # underflows to 0 there; in log eta the bisection still reaches rtol
    c = 2e-295
    fn = lambda t: 1.0 if 0.0 < t[0] < c else 0.0  # noqa: E731
    eta = g.sharp_step_threshold(fn, np.zeros(1), np.ones(1), eta_min=1e-300, eta_max=1.0, points_per_decade=1, rtol=1e-12)
    assert abs(eta - c) <= 1e-12 * c, eta


def test_sharp_threshold_refuses_non_finite_phi():
    rows = []
    for bad in (float("nan"), float("inf"), -float("inf")):
        late = lambda t, b=bad: float(t[0]) if t[0] < 0.5 else b  # noqa: E731
        rows.append((f"Phi = {bad} beyond eta 0.5", (lambda fn=late: g.sharp_step_threshold(fn, np.zeros(1), np.ones(1)),
                                                     r"non-finite value -?(nan|inf) at eta = 0\.5[0-9]*$")))
        rows.append((f"Phi(theta) = {bad}", (lambda b=bad: g.sharp_step_threshold(lambda t: b, np.zeros(1), np.ones(1)),
                                             r"non-finite value -?(nan|inf) at eta = 0\.0$")))
    rows.append(("Phi returns an array", (lambda: g.sharp_step_threshold(lambda t: t, np.zeros(2), np.ones(2)), "real scalar")))
    rows.append(("theta + eta w overflows", (lambda: g.sharp_step_threshold(
        lambda t: float(np.tanh(t[0])), np.zeros(1), np.full(1, 1e10), eta_max=1e300), "overflows at eta")))
    rows.append(("tabular Phi NaN", (lambda: g.sharp_step_threshold(
        lambda t: float(np.log(np.exp(t[0])) - np.log(np.exp(-t[0]))), np.zeros(1), np.ones(1), eta_max=1e300),
        "non-finite")))
    def row(fn, pattern):
        with pytest.raises(ValueError, match=pattern), np.errstate(all="ignore"):
            fn()

    check_table(rows, row)


def test_sharp_threshold_zero_when_phi_never_moves_beyond_rounding():
    assert g.sharp_step_threshold(lambda t: 1.0, np.zeros(1), np.ones(1), eta_min=1e-300, eta_max=1e300) == 0.0
    # Phi rises by 1e-20 only (below rounding of Phi = 1), then falls: a descent at resolvable scale
    assert g.sharp_step_threshold(lambda t: 1.0 - float(t[0]) ** 2, np.zeros(1), np.ones(1), eta_min=1e-300) == 0.0


# --- inverse_cdf_draw, sample_group, sample_arms ----------------------------------------------------


def _loop_draw(probs, u):
    """The plain route: per row, searchsorted on the cumsum, capped at the last positive-mass arm."""
    p2, u2 = probs.reshape(-1, probs.shape[-1]), u.reshape(-1, u.shape[-1])
    out = np.empty(u2.shape, dtype=np.int64)
    for i in range(p2.shape[0]):
        cdf = np.cumsum(p2[i])
        last = np.flatnonzero(p2[i] > 0)[-1]
        out[i] = np.minimum(np.searchsorted(cdf, u2[i] * cdf[-1], side="right"), last)
    return out.reshape(u.shape)


@settings(max_examples=80)
@given(categorical_draw_inputs())
def test_inverse_cdf_draw_equals_the_per_row_loop_and_skips_zero_mass(case):
    probs, u = case
    idx = inverse_cdf_draw(probs, u)
    assert idx.dtype == np.int64 and idx.shape == u.shape
    np.testing.assert_array_equal(idx, _loop_draw(probs, u))
    assert np.all(np.take_along_axis(probs, idx, axis=-1) > 0)
    np.testing.assert_array_equal(sample_arms(probs, u), idx)
    # leading axes: a [2, R, K] batch is the same rows
    np.testing.assert_array_equal(inverse_cdf_draw(np.stack([probs, probs]), np.stack([u, u])), np.stack([idx, idx]))


class _TopGenerator(np.random.Generator):
    """A Generator whose uniforms are all 1 - 2^-53 (the top of numpy's range)."""

    def random(self, size=None, dtype=np.float64, out=None):
        return np.full(size, TOP)


def test_zero_probability_arms_are_never_drawn_at_the_edges():
    rows = []
    for probs in ([0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.1, 0.2, 0.7, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0],
                  [0.1] * 10 + [0.0], [0.3, 0.0, 0.7], [1e-300, 0.0, 0.0]):
        for u in (0.0, TOP, 1.0, float(np.cumsum(probs)[0] / np.sum(probs))):
            rows.append((f"{probs} u={u!r}", (np.array(probs), u)))

    def row(p, u):
        for lead in ((), (3,), (2, 2)):  # the old offset trick failed from the second row on
            P = np.broadcast_to(p, lead + p.shape)
            idx = inverse_cdf_draw(P, np.full(lead + (4,), u))
            assert np.all(p[idx] > 0), idx
            np.testing.assert_array_equal(idx, _loop_draw(P, np.full(lead + (4,), u)))

    check_table(rows, row)
    p = np.array([[0.5, 0.5, 0.0]] * 3)
    idx = g.sample_group(p, 4, _TopGenerator(np.random.PCG64(0)))
    assert np.all(idx == 1), idx


def test_sample_group_is_the_inverse_cdf_draw_of_its_stream():
    rng = np.random.default_rng(11)
    z = rng.normal(size=(4, 3, 7)) * 3
    p = g.softmax(z)
    p[..., 2] = 0.0
    p /= p.sum(-1, keepdims=True)
    idx = g.sample_group(p, 5, np.random.default_rng(7))
    u = np.random.default_rng(7).random((4, 3, 5))
    np.testing.assert_array_equal(idx, _loop_draw(p, u))
    # and its frequencies follow pi (loose: 4 sigma of 20 000 draws)
    big = g.sample_group(p[0, 0], 20_000, np.random.default_rng(3))
    freq = np.bincount(big, minlength=7) / big.size
    assert np.all(np.abs(freq - p[0, 0]) <= 4 * np.sqrt(p[0, 0] * (1 - p[0, 0]) / big.size) + 1e-12)


def test_inverse_cdf_draw_validates_its_input():
    ok_p, ok_u = np.array([[0.5, 0.5]]), np.array([[0.2]])
    rows = [
        ("negative mass", (lambda: inverse_cdf_draw([[0.5, -0.1]], ok_u), "probs")),
        ("zero row", (lambda: inverse_cdf_draw([[0.0, 0.0]], ok_u), "probs")),
        ("NaN mass", (lambda: inverse_cdf_draw([[np.nan, 1.0]], ok_u), "probs")),
        ("overflowing total", (lambda: inverse_cdf_draw([[1e308, 1e308]], ok_u), "probs")),
        ("u above 1", (lambda: inverse_cdf_draw(ok_p, [[1.5]]), "u")),
        ("u below 0", (lambda: inverse_cdf_draw(ok_p, [[-1e-300]]), "u")),
        ("u NaN", (lambda: inverse_cdf_draw(ok_p, [[np.nan]]), "u")),
        ("row mismatch", (lambda: inverse_cdf_draw(ok_p, [[0.1], [0.2]]), "u")),
        ("u scalar", (lambda: inverse_cdf_draw(ok_p, 0.3), "u")),
        ("probs text", (lambda: inverse_cdf_draw("x", ok_u), "probs")),
        ("empty probs", (lambda: inverse_cdf_draw(np.zeros((1, 0)), ok_u), "probs")),
    ]
    check_table(rows, lambda fn, match: raises_value_error(fn, match))


# --- token_step_effects at extreme steps ------------------------------------------------------------


def _mp_first_order(z, s, a):
    """The module's formulas in 60 digits; also the magnitudes that bound the rounding of a stable sum."""
    with mp.workdps(60):
        zz = [mp.mpf(float(x)) for x in z]
        m = max(zz)
        lse = m + mp.log(mp.fsum(mp.exp(x - m) for x in zz))
        logp = [x - lse for x in zz]
        p = [mp.exp(v) for v in logp]
        C = mp.fsum(q * q for q in p)
        H = -mp.fsum(q * v for q, v in zip(p, logp))
        A = mp.mpf(a)
        dlogp = [A * ((1 if j == s else 0) - p[j] - p[s] + C) for j in range(len(p))]
        dH = -A * (p[s] * (logp[s] + H) - mp.fsum(q * q * (v + H) for q, v in zip(p, logp)))
        q_s = mp.fsum(p[k] for k in range(len(p)) if k != s)
        S2 = mp.fsum(p[k] ** 2 for k in range(len(p)) if k != s)
        scale_H = abs(A) * (p[s] * q_s * abs(logp[s] + H) + mp.fsum(p[k] ** 2 * abs(logp[k] + H) for k in range(len(p)) if k != s))
        scale_l = [abs(A) * (q_s**2 + S2 if j == s else p[j] + p[s] * q_s + S2) for j in range(len(p))]
        return [float(x) for x in dlogp], float(dH), float(scale_H), [float(x) for x in scale_l]


TAXONOMY_LOGITS = [
    np.array([0.3, -1.2, 2.0]),
    np.array([50.0, 0.0, 0.0]),  # p_s = 1 - 4e-22 rounds to 1: 1 - p_s and p_s - C cancel
    np.array([40.0, -3.0, 2.0, 7.5]),
    np.array([-20.0, 15.0, 0.0, 1.0, 30.0]),
    np.array([5.0, 5.0, -700.0]),
]


def test_first_order_effects_match_60_digits_at_extreme_steps():
    rows = []
    for z in TAXONOMY_LOGITS:
        for s in range(z.size):
            for A, eta, w in ((1.0, 0.1, 1.0), (1.0, 1e300, 1.0), (-3.0, 1e-300, 0.5), (1e200, 1e-300, 1e200)):
                rows.append((f"z={z.tolist()} s={s} A={A} eta={eta} w={w}", (z, s, A, eta, w)))

    def row(z, s, A, eta, w):
        e = g.token_step_effects(z, s, A, eta, weight=w)
        a = float(mp.mpf(eta) * mp.mpf(A) * mp.mpf(w))
        dlogp, dH, scale_H, scale_l = _mp_first_order(z, s, a)
        assert np.isfinite(e.dH) and np.all(np.isfinite(e.dlogp)), (e.dH, e.dlogp)
        assert abs(float(e.dH) - dH) <= 1e-12 * scale_H + 1e-300, (float(e.dH), dH, scale_H)
        assert np.all(np.abs(e.dlogp - dlogp) <= 1e-12 * np.array(scale_l) + 1e-300), (e.dlogp, dlogp)

    check_table(rows, row)


def test_first_order_effects_depend_on_a_only():
    z = np.array([0.3, -1.2, 2.0, 40.0])
    ref = g.token_step_effects(z, 1, 1.0, 1e100)
    for A, eta, w in ((1e200, 1e-300, 1e200), (1e10, 1e80, 1e10), (-1e250, 1e-150, -1.0)):
        e = g.token_step_effects(z, 1, A, eta, weight=w)  # eta * A or A * w alone overflows or underflows
        for x, y in zip(e[:4], ref[:4]):
            np.testing.assert_allclose(x, y, rtol=1e-15)


def test_first_order_effects_refuse_an_overflowing_step():
    rows = [(f"A={A} eta={eta} w={w}", (A, eta, w)) for A, eta, w in ((1e10, 1e300, 1.0), (-1e10, 1e300, 1.0),
                                                                       (1.0, 1e300, 1e9), (1e200, 1e200, 1e-10))]
    check_table(rows, lambda A, eta, w: raises_value_error(
        lambda: g.token_step_effects(np.zeros(3), 0, A, eta, weight=w), "eta * A"))
    with pytest.raises(ValueError, match=r"eta \* A"):
        g.exact_token_step(np.zeros(3), 0, 1e10, 1e300)


def test_first_order_effects_finite_when_logits_span_more_than_the_float_range():
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow or NaN on the way either
        e = g.token_step_effects(np.array([1e308, -1e308, 0.0]), 1, 1.0, 0.1)
    # p = (1, 0, 0): H = 0, dH = 0; dlogp = a (1[j = s] - p_j - p_s + C) = 0.1 (0, 2, 1) exactly
    np.testing.assert_array_equal(e.dlogp, [0.0, 0.2, 0.1])
    assert e.dH == 0.0


# --- seeds ------------------------------------------------------------------------------------------


def test_check_seed_accepts_unsigned_64_bit_integers_only():
    good = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, np.uint64(2**64 - 1), np.int64(5), np.uint8(3)]
    rows = [(f"good {v!r}", (v, None)) for v in good]
    rows += [(f"bad {v!r}", (v, "my_seed")) for v in (-1, 2**64, 2**100, True, np.bool_(False), 1.0, 2.5, "3", None,
                                                       np.array([1]), np.int64(-1))]

    def row(value, match):
        if match is None:
            out = check_seed(value, "my_seed")
            assert type(out) is int and out == int(value) and out >= 0
        else:
            raises_value_error(lambda: check_seed(value, "my_seed"), match)

    check_table(rows, row)


def test_seeds_at_2_63_and_above_stay_positive_in_bandits_and_the_demo():
    from gapdyn.evidence.sweep import example_cell
    from gapdyn.demo import DemoConfig

    b = make_bandit(n_contexts=1, n_arms=3, dim=2, n_correct=1, seed=2**63)
    assert b.seed == 2**63
    np.testing.assert_array_equal(b.features, np.random.default_rng(2**63).normal(size=(1, 3, 2)))
    place_theta(b, 0.3, seed=2**64 - 1)
    np.testing.assert_array_equal(example_cell(2**63)["x"], np.random.default_rng(2**63).standard_normal(3))
    assert DemoConfig(seed=2**64 - 2, seeds=2).seed == 2**64 - 2
    for fn, match in ((lambda: make_bandit(seed=2**64), "seed"), (lambda: make_bandit(seed=-1), "seed"),
                      (lambda: place_theta(b, 0.3, seed=True), "seed"), (lambda: example_cell(-3), "seed"),
                      (lambda: DemoConfig(seed=2**64), "--seed"), (lambda: DemoConfig(seed=2**64 - 1, seeds=2), "--seeds")):
        raises_value_error(fn, match)
