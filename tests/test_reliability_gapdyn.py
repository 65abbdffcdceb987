"""Fuzz: malformed input at every public entry point of gapdyn gives a clear ValueError (never a
crash deep inside, a hang, or a silent NaN). Valid inputs give finite outputs."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import gapdyn as g

RNG = np.random.default_rng(0)
K, D = 6, 3
PHI = RNG.normal(size=(K, D))
TH = RNG.normal(size=D)
Z = RNG.normal(size=K)
P = g.softmax(Z)
R = np.array([1.0, 0, 0, 1, 0, 0])
S = g.softmax_scores(Z)
GAP = g.gradient_gap(P, R, S)


def STEP_RUNS(e):
    return g.RunStats.constant(np.where(e > 0.1, 0.0, 1.0))


ETA_STAR = g.find_eta_star(STEP_RUNS, 1e-3, 1.0)
CLAIM = g.Claim(id="c", source="beyond the papers", statement="s", setting="k", statistic="x", estimate=0.3,
                interval=(0.1, 0.5), n=10, criterion_text="interval above 0", criterion=g.Criterion.above(0.0),
                form="existence")

# name -> (callable, valid positional args, valid keyword args)
ENTRY_POINTS = {
    "softmax": (g.softmax, (Z,), {}),
    "log_softmax": (g.log_softmax, (Z,), {}),
    "softmax_scores": (g.softmax_scores, (Z,), {}),
    "loglinear_logits": (g.loglinear_logits, (PHI, TH), {}),
    "loglinear_probs": (g.loglinear_probs, (PHI, TH), {}),
    "loglinear_scores": (g.loglinear_scores, (PHI, TH), {}),
    "success_rate": (g.success_rate, (P, R), {}),
    "failure_rate": (g.failure_rate, (P, R), {}),
    "log_odds": (g.log_odds, (P, R), {}),
    "log_odds_from_logits": (g.log_odds_from_logits, (Z, R), {}),
    "conditional_scores": (g.conditional_scores, (P, R, S), {}),
    "gradient_gap": (g.gradient_gap, (P, R, S), {}),
    "gradient_gap_from_logits": (g.gradient_gap_from_logits, (Z, R), {}),
    "success_gradient": (g.success_gradient, (P, R, S), {}),
    "logodds_hessian": (g.logodds_hessian, (P, R, S), {}),
    "logodds_hessian_from_logits": (g.logodds_hessian_from_logits, (Z, R), {}),
    "gap_alignment": (g.gap_alignment, (GAP, GAP), {}),
    "gap_cosine": (g.gap_cosine, (GAP, GAP), {}),
    "cumulative_alignment": (g.cumulative_alignment, (np.ones(4), np.ones(4)), {}),
    "logodds_lower_bound": (g.logodds_lower_bound, (0.3, 2.0), {}),
    "expected_direction": (g.expected_direction, ("grpo", P, R, S), {"group_size": 4}),
    "sampled_direction": (g.sampled_direction, ("grpo", P, R, S), {"group_size": 4, "rng": np.random.default_rng(1)}),
    "sample_group": (g.sample_group, (P, 4, np.random.default_rng(1)), {}),
    "group_advantages": (g.group_advantages, ("grpo", np.array([1.0, 0, 1, 0])), {}),
    "expected_scalar": (g.expected_scalar, ("grpo", 0.3, 8), {}),
    "c_G": (g.c_G, (0.3, 8), {}),
    "local_step_threshold": (g.local_step_threshold, (1.0, GAP, -np.eye(K)), {}),
    "theorem1_step_bound": (g.theorem1_step_bound, (1.0,), {"L_o": 1.0, "G_o": 1.0}),
    "loglinear_bound_constants": (g.loglinear_bound_constants, (PHI,), {}),
    "predicted_critical_step": (g.predicted_critical_step, (1.0, 4.0, 0.3), {}),
    "stagnation_ceiling": (g.stagnation_ceiling, (0.1, 4.0, 0.5), {}),
    "loglog_slope": (g.loglog_slope, (np.array([1.0, 2, 4]), np.array([1.0, 0.5, 0.3])), {}),
    "fit_logistic_accuracy": (g.fit_logistic_accuracy, (np.linspace(0, 5, 10), np.linspace(0.1, 0.9, 10)), {}),
    "token_step_effects": (g.token_step_effects, (Z, 1, 1.0, 0.1), {}),
    "exact_token_step": (g.exact_token_step, (Z, 1, 1.0, 0.1), {}),
    "sharp_step_threshold": (g.sharp_step_threshold, (g.loglinear_logodds_fn(PHI, R), TH, np.ones(D)), {}),
    "loglinear_logodds_fn": (g.loglinear_logodds_fn, (PHI, R), {}),
    "tabular_logodds_fn": (g.tabular_logodds_fn, (R,), {}),
    "logodds_gradient": (g.logodds_gradient, (P, R, S), {}),
    "get_method": (g.get_method, ("wapo",), {}),
    "collision_probability": (g.collision_probability, (P,), {}),
    "token_entropy": (g.token_entropy, (np.log(P),), {}),
    "token_bin_index": (g.token_bin_index, (P[:2], np.full(2, 0.3), np.array([1.0, -1.0])), {}),
    # the safe step rule (gapdyn.theory.safe_step)
    "safe_step_estimates": (g.safe_step_estimates, (Z, R, np.array([0, 0, 0, 1, 1, 1])), {}),
    "safe_step_multiplier": (g.safe_step_multiplier, (Z, R, np.array([0, 0, 0, 1, 1, 1])), {"c": 1.0, "delta": 2.0}),
    "safe_step_size": (g.safe_step_size, (0.5, 1.0, 2.0, 1.0), {"c": 1.0, "delta": 2.0}),
    "safe_step_headroom": (g.safe_step_headroom, (0.5, 1.0, 2.0), {"c": 1.0, "delta": 2.0}),
    # evidence layer (gapdyn.evidence.stats, gapdyn.evidence.collapse, gapdyn.evidence.claims)
    "wilson_interval": (g.wilson_interval, (3, 10), {}),
    "newcombe_difference": (g.newcombe_difference, (3, 10, 1, 12), {}),
    "fieller_paired_ratio": (g.fieller_paired_ratio, ([10.0, 12.0, 9.0, 14.0, 11.0], [40.0, 52.0, 47.0, 55.0, 43.0]),
                             {}),
    "clopper_pearson_interval": (g.clopper_pearson_interval, (3, 10), {}),
    "cluster_bootstrap": (g.cluster_bootstrap, (np.mean, np.arange(6.0)), {"rng": np.random.default_rng(1)}),
    "bootstrap_slope": (g.bootstrap_slope, (np.arange(6.0), Z), {"rng": np.random.default_rng(1)}),
    "bootstrap_ratio": (g.bootstrap_ratio, (Z + 5, np.arange(6.0) + 1), {"rng": np.random.default_rng(1)}),
    "paired_bootstrap_difference": (g.paired_bootstrap_difference, (Z, np.zeros(K)), {"rng": np.random.default_rng(1)}),
    "fisher_exact_test": (g.fisher_exact_test, (np.array([[3, 1], [1, 3]]),), {}),
    "mcnemar_exact": (g.mcnemar_exact, (R, R[::-1]), {}),
    "wilcoxon_signed_rank": (g.wilcoxon_signed_rank, (Z, np.zeros(K)), {}),
    "holm_adjust": (g.holm_adjust, (np.array([0.01, 0.2, 0.04]),), {}),
    "roc_auc": (g.roc_auc, (Z[:3] + 1, Z[3:]), {}),
    "eta_grid": (g.eta_grid, (1e-3, 1.0), {}),
    "is_collapsed": (g.is_collapsed, (g.RunStats.constant(np.array([0.0, 0.5])),), {}),
    "find_eta_star": (g.find_eta_star, (STEP_RUNS, 1e-3, 1.0), {}),
    "collapsed_window_eta": (g.collapsed_window_eta, (np.geomspace(1.0, 2.0, 30), np.arange(30) > 12), {}),
    "excursion_lengths": (g.excursion_lengths, (np.array([0.5, 0.0, 0.0, 1.0]),), {}),
    "has_dipped": (g.has_dipped, (g.RunStats.constant(np.array([0.0, 0.5])),), {}),
    "bandit_outcome": (g.bandit_outcome, (g.RunStats.from_trajectory(np.array([0.5, 0.0, 1.0, 1.0])),), {}),
    "tail_start": (g.tail_start, (100,), {}),
    "inverse_cdf_draw": (g.inverse_cdf_draw, (P, np.array([0.1, 0.5, 0.99])), {}),
    "check_eta_star_ratio": (g.check_eta_star_ratio, (ETA_STAR, ETA_STAR, 1.0), {}),
    "decide_verdict": (g.decide_verdict, (0.3, 0.1, 0.5, g.Criterion.above(0.0)), {}),
    "criteria_hash": (g.criteria_hash, ({"a": g.Criterion.above(0.0)},), {}),
    "claims_to_json": (g.claims_to_json, ([CLAIM],), {}),
    "claims_from_json": (g.claims_from_json, (g.claims_to_json([CLAIM]),), {}),
    "claims_table": (g.claims_table, ([CLAIM],), {}),
    "claims_markdown": (g.claims_markdown, ([CLAIM],), {}),
    "markdown_table": (g.markdown_table, (g.claims_table([CLAIM]),), {}),
    "count_verdicts": (g.count_verdicts, ([CLAIM],), {}),
    "holm_adjust_claims": (g.holm_adjust_claims, ([CLAIM],), {}),
    "replication_table": (g.replication_table, ([CLAIM], []), {}),
}

# array-API helpers that run inside training loops: they check types, not values (documented in
# gapdyn/theory/taxonomy.py), so NaN and inf propagate instead of raising.
HOT_PATH = {"collision_probability", "token_entropy", "token_bin_index"}

MALFORMED = {
    "nan": lambda a: np.full_like(np.asarray(a, dtype=float), np.nan),
    "inf": lambda a: np.full_like(np.asarray(a, dtype=float), np.inf),
    "wrong_shape": lambda a: np.ones(np.asarray(a).shape + (7,)),
    "empty": lambda a: np.array([]),
    "string": lambda a: "not an array",
    "none": lambda a: None,
    "object": lambda a: np.array([{}, {}], dtype=object),
}


def _finite(out):
    if isinstance(out, tuple):
        return all(_finite(o) for o in out)
    if callable(out) or isinstance(out, np.random.Generator):
        return True
    arr = np.asarray(out)
    return not np.issubdtype(arr.dtype, np.number) or np.all(np.isfinite(arr) | np.isinf(arr) & (arr > 0))


def test_every_public_function_is_covered():
    functions = {n for n in g.__all__ if callable(getattr(g, n)) and n[0].islower()}
    assert functions <= set(ENTRY_POINTS), sorted(functions - set(ENTRY_POINTS))


def test_valid_call_is_finite():
    from tests.tables import check_table

    def row(fn, args, kwargs):
        assert _finite(fn(*args, **kwargs)), "non-finite output for a valid call"

    check_table(sorted(ENTRY_POINTS.items()), row)


CASES = [
    (name, i, kind)
    for name, (fn, args, kwargs) in sorted(ENTRY_POINTS.items())
    for i, a in enumerate(args)
    if isinstance(a, (np.ndarray, float, int)) and not isinstance(a, bool)
    for kind in MALFORMED
]


def _malformed_row(name, position, kind):
    fn, args, kwargs = ENTRY_POINTS[name]
    bad = list(args)
    bad[position] = MALFORMED[kind](args[position])
    if name in HOT_PATH and kind in ("nan", "inf", "wrong_shape", "empty"):
        try:  # documented: values propagate unchecked; only a ValueError may be raised
            fn(*bad, **kwargs)
        except ValueError:
            pass
        return
    try:
        out = fn(*bad, **kwargs)
    except ValueError as exc:
        assert str(exc)  # a message, naming the argument where the boundary checks it
        return
    # documented graceful handling: the result is still finite (e.g. a broadcastable extra axis)
    assert _finite(out), f"{name}: silent non-finite output for {kind} argument {position}"


def test_malformed_argument_raises_value_error_or_is_finite():
    """Every public function x every array/number argument x MALFORMED: one item, every failing case listed."""
    from tests.tables import check_table

    n = check_table(((f"{name}[{pos}]-{kind}", case) for case in CASES for name, pos, kind in [case]), _malformed_row)
    assert n == len(CASES) > 400


@settings(max_examples=100)
@given(st.sampled_from(g.METHOD_NAMES), st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=64))
def test_advantages_finite_on_any_group(method, rewards):
    A = g.group_advantages(method, np.array(rewards))
    assert np.all(np.isfinite(A))


def test_large_vocabulary_and_long_arrays_are_finite():
    rng = np.random.default_rng(0)
    z = rng.normal(size=100_000) * 30
    eff = g.token_step_effects(z, 5, -1.0, 0.5)
    assert np.isfinite(eff.dH) and np.all(np.isfinite(eff.dp))
    r = np.zeros(100_000)
    r[:3] = 1.0
    assert np.isfinite(g.log_odds_from_logits(z, r))
    assert np.all(np.isfinite(g.cumulative_alignment(np.full(10_000, 1e-3), rng.normal(size=10_000))))


# ---- numerics at the edges (each fixed at its root; compared with an independent route) ---------


def _mp_gap(p, r, s):
    """g+ - g- in 60-digit arithmetic, taking the float64 inputs as exact."""
    import mpmath as mp

    mp.mp.dps = 60
    pp = [mp.mpf(float(x)) for x in p]
    J = sum(x for x, y in zip(pp, r) if y == 1)
    Jb = sum(x for x, y in zip(pp, r) if y == 0)
    out = []
    for j in range(s.shape[1]):
        gp = sum(pp[k] * mp.mpf(float(s[k, j])) for k in range(len(pp)) if r[k] == 1) / J
        gm = sum(pp[k] * mp.mpf(float(s[k, j])) for k in range(len(pp)) if r[k] == 0) / Jb
        out.append(float(gp - gm))
    return np.array(out)


def test_numerical_edges_table():
    from tests.tables import check_table, raises_value_error

    rng = np.random.default_rng(5)
    rows = []
    # gradient_gap at subnormal success mass (weights are normalised before they meet the scores)
    for tiny in (1e-310, 3e-318, 2e-322):
        p = np.array([tiny, 2 * tiny, 0.25, 0.75 - 3 * tiny])
        r = np.array([1.0, 1, 0, 0])
        s = rng.uniform(0.1, 0.9, size=(4, 3))

        def gap_row(p=p, r=r, s=s):
            np.testing.assert_allclose(g.gradient_gap(p, r, s), _mp_gap(p, r, s), rtol=1e-12)

        rows.append((f"gradient_gap subnormal {tiny:g}", (gap_row,)))
    # gap_cosine of tiny and huge vectors = cosine of the unscaled pair
    u, v = rng.normal(size=5), rng.normal(size=5)
    ref = float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))
    for a, b in ((1e-200, 1e-200), (1e-170, 1e-170), (1e200, 1e200), (1e300, 1e-300), (5e-324, 1.0)):
        def cos_row(a=a, b=b):
            wa = a * u if a > 1e-320 else np.where(np.arange(5) == 0, a, 0.0)
            ra = ref if a > 1e-320 else float(v[0] / np.linalg.norm(v)) * np.sign(wa[0])
            np.testing.assert_allclose(g.gap_cosine(wa, b * v), ra, rtol=1e-12)

        rows.append((f"gap_cosine scale {a:g} x {b:g}", (cos_row,)))
    # token_entropy: p = 0 entries (log-prob -inf) contribute 0, in numpy and torch
    lp = np.array([np.log(0.5), np.log(0.25), np.log(0.25), -np.inf])
    rows.append(("token_entropy -inf numpy", (lambda: np.testing.assert_allclose(g.token_entropy(lp), 1.5 * np.log(2), rtol=1e-15),)))

    def torch_entropy():
        try:
            import torch
        except ImportError:  # torch is optional for gapdyn: the numpy row still runs
            return
        out = g.token_entropy(torch.tensor(lp))
        assert abs(float(out) - 1.5 * np.log(2)) < 1e-14

    rows.append(("token_entropy -inf torch", (torch_entropy,)))
    # sharp_step_threshold: rtol and points_per_decade validated; a huge eta range and a tiny rtol end
    fn = g.tabular_logodds_fn(np.array([1.0, 0, 0]))
    th, w = np.zeros(3), np.array([1.0, -1.0, 0.0])
    for kw, match in (({"rtol": 0.0}, "rtol"), ({"rtol": -1e-9}, "rtol"), ({"rtol": float("nan")}, "rtol"),
                      ({"rtol": 1.0}, "rtol"), ({"points_per_decade": 0}, "points_per_decade"),
                      ({"points_per_decade": 2.5}, "points_per_decade"), ({"points_per_decade": None}, "points_per_decade"),
                      ({"points_per_decade": 10**9}, "points_per_decade")):
        rows.append((f"sharp_step_threshold {kw}", (lambda kw=kw, m=match: raises_value_error(
            lambda: g.sharp_step_threshold(fn, th, w, **kw), m),)))

    def wide_range():
        out = g.sharp_step_threshold(lambda t: float(t[0]), np.zeros(1), np.ones(1), eta_min=1e-300, eta_max=1e300)
        assert out == float("inf")  # rises for every step of the 600 decades
        crossing = g.sharp_step_threshold(lambda t: -(t[0] - 1.0) ** 2, np.zeros(1), np.ones(1), rtol=1e-300)
        assert abs(crossing - 2.0) <= 4e-16

    rows.append(("sharp_step_threshold eta 1e-300..1e300, rtol 1e-300", (wide_range,)))
    # J slightly above 1 from accepted rounding: renormalised; beyond the tolerance: ValueError
    p_hi = np.array([0.5 + 4e-9, 0.5 - 1e-12, 1e-12])
    r_hi = np.array([1.0, 1, 0])

    def j_rounding():
        assert g.success_rate(p_hi, r_hi) <= 1.0
        assert g.success_rate(np.array([0.6 + 1e-8, 0.4]), np.array([1.0, 1])) == 1.0
        d = g.expected_direction("grpo", p_hi, r_hi, np.eye(3), group_size=4)
        assert np.all(np.isfinite(d))
        raises_value_error(lambda: g.success_rate(np.array([0.6 + 1e-6, 0.4]), np.array([1.0, 0])), "sum to 1")

    rows.append(("J above 1 within / beyond tolerance", (j_rounding,)))
    # method options: TypeError-prone or NaN values are a ValueError naming the option
    for method, opt in (("grpo", "eps"), ("w_reinforce", "lam")):
        for bad in (None, "x", float("nan"), float("inf"), -1.0, True, 1j, [0.1]):
            for call in ("group_advantages", "expected_scalar"):
                def opt_row(method=method, opt=opt, bad=bad, call=call):
                    if call == "group_advantages":
                        f = lambda: g.group_advantages(method, np.array([1.0, 0, 1, 0]), **{opt: bad})  # noqa: E731
                    else:
                        f = lambda: g.expected_scalar(method, 0.3, 4, **{opt: bad})  # noqa: E731
                    raises_value_error(f, opt)

                rows.append((f"{call}({method}, {opt}={bad!r})", (opt_row,)))
    for bad in (None, "x", float("nan"), -1.0, [0.1]):
        rows.append((f"c_G(eps={bad!r})", (lambda b=bad: raises_value_error(lambda: g.c_G(0.3, 4, eps=b), "eps"),)))
    for bad in (None, [1], "sample", 1.0):
        rows.append((f"c_G(std={bad!r})", (lambda b=bad: raises_value_error(lambda: g.c_G(0.3, 4, std=b), "std"),)))
        rows.append((f"group_advantages(std={bad!r})", (lambda b=bad: raises_value_error(
            lambda: g.group_advantages("grpo", np.array([1.0, 0, 1, 0]), std=b), "std"),)))
    for bad in (None, "x", float("nan"), [1.0], 1):
        for opt, call in (("T_ref", lambda b: g.predicted_critical_step(1.0, 4.0, 0.3, T_ref=b)),
                          ("length_normalized", lambda b: g.predicted_critical_step(1.0, 4.0, 0.3, length_normalized=b)),
                          ("return_group", lambda b: g.sampled_direction("grpo", P, R, S, group_size=4,
                                                                       rng=np.random.default_rng(0), return_group=b))):
            if not (opt == "T_ref" and bad == 1):  # T_ref = 1 is valid
                rows.append((f"{opt}={bad!r}", (lambda c=call, b=bad, o=opt: raises_value_error(lambda: c(b), o),)))
    check_table(rows, lambda f: f())
