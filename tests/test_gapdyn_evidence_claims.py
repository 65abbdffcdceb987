"""gapdyn.evidence.claims: verdicts by rule, JSON round trip, criteria hash, replication, Holm re-decision."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gapdyn as g
from gapdyn import Criterion as C
from tests.strategies import finite_intervals

VERDICT_TABLE = [
    # (lo, hi, criterion, verdict)
    ((0.1, 0.4), C.above(0), "holds"),
    ((-0.1, 0.4), C.above(0), "inconclusive"),
    ((-0.3, 0.0), C.above(0), "does not hold"),
    ((0.0, 0.0), C.above(0), "does not hold"),
    ((-0.3, -0.1), C.below(0), "holds"),
    ((-0.3, 0.2), C.below(0), "inconclusive"),
    ((0.0, 0.2), C.below(0), "does not hold"),
    ((0.45, 0.55), C.inside(0.4, 0.6), "holds"),
    ((0.4, 0.6), C.inside(0.4, 0.6), "holds"),
    ((0.3, 0.5), C.inside(0.4, 0.6), "inconclusive"),
    ((0.1, 2.0), C.inside(0.4, 0.6), "inconclusive"),
    ((0.7, 0.9), C.inside(0.4, 0.6), "does not hold"),
    ((0.1, 0.3), C.inside(0.4, 0.6), "does not hold"),
    ((0.9, 1.1), C.contains(1.0), "holds"),
    ((1.1, 1.3), C.contains(1.0), "does not hold"),
    ((0.99, 1.01), C.contains(1.0, tol=0.05), "holds"),
    ((0.0, 5.0), C.contains(1.0, tol=0.05), "inconclusive"),
]


@pytest.mark.parametrize("interval, criterion, verdict", VERDICT_TABLE)
def test_verdict_table(interval, criterion, verdict):
    estimate = sum(interval) / 2
    assert g.decide_verdict(estimate, *interval, criterion) == verdict


@given(finite_intervals, st.floats(-10, 10))
def test_above_and_below_are_mirror_images(interval, x):
    lo, hi = interval
    assert g.decide_verdict(lo, lo, hi, C.above(x)) == g.decide_verdict(-lo, -hi, -lo, C.below(-x))


@given(finite_intervals, st.floats(-10, 10))
def test_a_straddling_interval_is_never_a_verdict(interval, x):
    lo, hi = interval
    if lo < x < hi:
        for crit in (C.above(x), C.below(x)):
            assert g.decide_verdict(x, lo, hi, crit) == "inconclusive"


def test_identity_rows_are_shown_not_counted_and_a_broken_identity_shows():
    assert g.decide_verdict(1.2500001, 1.2500001, 1.2500001, C.identity(1.25, tol=1e-3)) == "identity"
    assert g.decide_verdict(1.3, 1.3, 1.3, C.identity(1.25, tol=1e-3)) == "does not hold"
    c = claim(estimate=1.25, interval=(1.25, 1.25), criterion=C.identity(1.25, tol=1e-6), form=None)
    assert c.verdict == "identity" and c.form == "identity" and not c.counts_as_evidence
    d = claim(id="d", form="derived")
    assert d.verdict == "holds" and not d.counts_as_evidence
    assert g.count_verdicts([c, d, claim()]) == {"holds": 1, "does not hold": 0, "inconclusive": 0, "identity": 1,
                                                 "derived": 1}


def test_tests_need_the_adjusted_p_value_below_alpha():
    crit = C.above(0, alpha=0.05)
    assert g.decide_verdict(0.3, 0.1, 0.5, crit, p_adjusted=0.01) == "holds"
    assert g.decide_verdict(0.3, 0.1, 0.5, crit, p_adjusted=0.2) == "inconclusive"
    assert g.decide_verdict(-0.3, -0.5, -0.1, crit, p_adjusted=0.01) == "does not hold"
    with pytest.raises(ValueError, match="p_adjusted"):
        g.decide_verdict(0.3, 0.1, 0.5, crit)


@pytest.mark.parametrize("below", [C.below(0, alpha=0.05), C.inside(-1, 0, alpha=0.05)])
def test_a_test_that_is_not_significant_is_inconclusive_unless_its_interval_refutes(below):
    """docs/evidence.md section 5: a non-significant test is inconclusive, never "does not hold" on that account;
    "does not hold" needs the whole interval on the wrong side, significant or not (the interval rule alone)."""
    for p in (0.06, 0.5, 1.0):
        assert g.decide_verdict(-0.3, -0.5, -0.1, below, p_adjusted=p) == "inconclusive"  # satisfies, not significant
        assert g.decide_verdict(0.0, -0.5, 0.5, below, p_adjusted=p) == "inconclusive"  # straddles
        assert g.decide_verdict(2.0, 1.5, 2.5, below, p_adjusted=p) == "does not hold"  # refuted by the interval
        no_test = dataclasses.replace(below, alpha=None)
        assert g.decide_verdict(2.0, 1.5, 2.5, no_test) == "does not hold"
    text = (Path(__file__).resolve().parents[1] / "docs" / "evidence.md").read_text()
    assert "A test that\nis not significant is **inconclusive**" in text


def claim(**kw):
    base = dict(id="thm2.collapse", source="Suk & Duan (arXiv 2510.08539), Thm 2",
                statement="above eta* J collapses", setting="softmax K=100, G=8, horizon 200",
                statistic="collapse rate above eta*", estimate=0.3, interval=(0.1, 0.5), n=20,
                criterion_text="collapse rate interval above 0", criterion=C.above(0.0), form="existence")
    return g.Claim(**(base | kw))


def test_verdict_is_computed_never_passed():
    assert claim().verdict == "holds"
    with pytest.raises(TypeError):
        claim(verdict="holds")
    with pytest.raises(dataclasses.FrozenInstanceError):
        claim().verdict = "does not hold"


@given(finite_intervals, st.sampled_from(["discovery", "confirmation"]),
       st.one_of(st.none(), st.floats(0, 1)), st.integers(1, 10_000))
def test_claims_round_trip_through_json(interval, block, p, n):
    c = claim(estimate=interval[0], interval=interval, block=block, p_value=p, n=n,
              criterion=C.inside(-1, 1), criteria_hash="abc")
    back = g.claims_from_json(g.claims_to_json([c]))
    assert back == [c] and back[0].verdict == c.verdict


def test_a_tampered_verdict_is_rejected():
    data = json.loads(g.claims_to_json([claim()]))
    data[0]["verdict"] = "does not hold"
    with pytest.raises(ValueError, match="stored verdict"):
        g.claims_from_json(json.dumps(data))


def test_criteria_hash_is_order_free_and_sees_every_change():
    a = {"x": C.above(0), "y": C.inside(0.4, 0.6)}
    b = {"y": C.inside(0.4, 0.6), "x": C.above(0)}
    assert g.criteria_hash(a) == g.criteria_hash(b)
    assert g.criteria_hash(a) != g.criteria_hash({"x": C.above(0), "y": C.inside(0.4, 0.61)})
    assert g.criteria_hash(a) != g.criteria_hash({"x": C.above(0, alpha=0.05), "y": C.inside(0.4, 0.6)})


def test_replication_shows_confirmation_and_flags_disagreement():
    disc = [claim(id="a"), claim(id="b"), claim(id="c")]
    conf = [claim(id="a", block="confirmation"),
            claim(id="b", block="confirmation", interval=(-0.1, 0.2)),
            claim(id="d", block="confirmation")]
    t = g.replication_table(disc, conf).set_index("id")
    assert t.loc["a", "verdict"] == "holds" and t.loc["a", "agree"] and t.loc["a", "flag"] == ""
    assert t.loc["b", "verdict"] == "inconclusive" and t.loc["b", "flag"] == "disagree"
    assert t.loc["c", "verdict"] == "" and t.loc["c", "flag"] == "no confirmation"
    assert t.loc["d", "flag"] == "no discovery"
    with pytest.raises(ValueError, match="block"):
        g.replication_table(conf, conf)


def test_holm_over_claims_redecides_verdicts():
    crit = C.above(0, alpha=0.05)
    cs = [claim(id=str(i), p_value=p, criterion=crit, p_adjusted=p) for i, p in enumerate([0.01, 0.03, 0.2])]
    adjusted = g.holm_adjust_claims(cs)
    assert [c.p_adjusted for c in adjusted] == pytest.approx([0.03, 0.06, 0.2])
    assert [c.verdict for c in adjusted] == ["holds", "inconclusive", "inconclusive"]


def test_tables_render_every_claim():
    cs = [claim(id="a", criterion_text="a | b"), claim(id="b", interval=(-1, 1))]
    df = g.claims_table(cs)
    assert list(df["verdict"]) == ["holds", "inconclusive"]
    assert list(df["criterion"]) == ["a | b", "collapse rate interval above 0"]
    md = g.claims_markdown(cs).splitlines()
    assert len(md) == 4 and "a \\| b" in md[2]


@pytest.mark.parametrize("kw, name", [
    (dict(id=""), "id"),
    (dict(block="pilot"), "block"),
    (dict(n=0), "n"),
    (dict(interval=(0.0, float("nan"))), "interval"),
    (dict(interval=(0.5, 0.1)), "lo <= hi"),
    (dict(p_value=1.5), "p_value"),
    (dict(p_value=0.2, p_adjusted=0.1), "p_adjusted"),
    (dict(criterion="above 0"), "criterion"),
    (dict(form="theorem"), "form"),
    (dict(form=None), "form"),
    (dict(form="identity"), "identity"),
    (dict(primary=True), "primary"),
    (dict(criterion=C.equivalence(-1, 1)), "90 %"),
    (dict(measured=False), "say why"),
    (dict(n_planned=0), "n_planned"),
])
def test_bad_claims_name_the_argument(kw, name):
    with pytest.raises(ValueError, match=name):
        claim(**kw)


@pytest.mark.parametrize("make, name", [
    (lambda: C("greater", value=0), "kind"),
    (lambda: C("above"), "value"),
    (lambda: C.inside(0.6, 0.4), "hi"),
    (lambda: C.above(0, alpha=1.5), "alpha"),
    (lambda: C.contains(1.0, tol=-1), "tol"),
    (lambda: C.above(float("inf")), "value"),
])
def test_bad_criteria_name_the_argument(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_criterion_text_is_literal():
    assert C.inside(0.4, 0.6).describe() == "interval inside [0.4, 0.6]"
    assert C.above(0, alpha=0.05).describe() == "interval above 0; Holm-adjusted p < 0.05"


def test_claim_from_an_estimate_takes_interval_and_n():
    est = g.wilson_interval(12, 20)
    fields = dict(id="x", source="beyond the papers", statement="s", setting="k", statistic="collapse rate",
                  criterion_text="interval above 0.5", criterion=C.above(0.5), form="existence")
    c = g.Claim.from_estimate(est, **fields)
    assert c.interval == (est.lo, est.hi) and c.n == 20 and c.estimate == 0.6 and c.verdict == "inconclusive"
    with pytest.raises(ValueError, match="estimate"):
        g.Claim.from_estimate(est, n=3, **fields)


def test_an_unmeasured_claim_is_inconclusive_whatever_its_criterion():
    """measured=False (or a gapdyn.evidence.stats.NotMeasured) gives "inconclusive", identities included, with its reason;
    the same numbers measured give the criterion's verdict."""
    from gapdyn import Claim, Criterion, Estimate
    from gapdyn.evidence.stats import not_measured

    base = dict(id="x", source="beyond the papers", statement="s", setting="t", statistic="u",
                criterion_text="c", reason="too few instances for a valid interval")
    for crit, est, iv, measured_verdict in (
        (Criterion.identity(0.0, tol=1e-9), 0.5, (0.0, 1.0), "does not hold"),
        (Criterion.above(0.0), -1.0, (-2.0, -0.5), "does not hold"),
        (Criterion.above(0.0), 1.0, (0.5, 2.0), "holds"),
    ):
        form = None if crit.kind == "identity" else "bound"
        assert Claim(**base, estimate=est, interval=iv, n=1, criterion=crit, form=form).verdict == measured_verdict
        c = Claim(**base, estimate=est, interval=iv, n=1, criterion=crit, measured=False, form=form)
        assert c.verdict == "inconclusive" and c.why == "not measured: too few instances for a valid interval"
        row = g.claims_table([c]).iloc[0]
        assert np.isnan(row["estimate"]) and np.isnan(row["lo"]) and "not measured" in row["why"]
        kw = {k: v for k, v in base.items() if k != "reason"}
        nodata = Claim.from_estimate(not_measured(iv[0], iv[1], estimate=est), criterion=crit, form=form, **kw)
        assert nodata.verdict == "inconclusive" and not nodata.measured
        assert Claim.from_dict(nodata.to_dict()) == nodata
        plain = Claim.from_estimate(Estimate(est, iv[0], iv[1], 1, 0.95, "no data"), criterion=crit, form=form, **kw)
        assert plain.measured and plain.verdict == measured_verdict  # a method string decides nothing
    why = Claim.from_estimate(not_measured(0.0, 1.0, "two instances"), criterion=Criterion.above(0.0), form="bound",
                              **{k: v for k, v in base.items() if k != "reason"})
    assert why.reason == "two instances" and why.why == "not measured: two instances"


def test_equivalence_is_decided_on_a_90_percent_interval():
    crit = C.equivalence(-1.25, -0.75)
    kw = dict(criterion=crit, form="law", confidence=0.90)
    assert claim(estimate=-1.0, interval=(-1.1, -0.9), **kw).verdict == "holds"
    assert claim(estimate=-0.6, interval=(-0.7, -0.5), **kw).verdict == "does not hold"
    straddle = claim(estimate=-0.8, interval=(-0.9, -0.7), n_planned=60, **kw)
    assert straddle.verdict == "inconclusive"
    assert straddle.why == "interval straddles the criterion (n planned 60, used 20)"
    assert "90 % interval inside the band [-1.25, -0.75]" in crit.describe()


def test_holm_runs_over_the_primaries_only():
    crit = C.above(0, alpha=0.05)
    prim = [claim(id=f"p{i}", p_value=p, p_adjusted=p, criterion=crit, form="comparison", primary=True)
            for i, p in enumerate([0.01, 0.03])]
    expl = claim(id="e", p_value=0.04, p_adjusted=0.04, criterion=crit, form="comparison")
    out = g.holm_adjust_claims(prim + [expl])
    assert [c.p_adjusted for c in out] == pytest.approx([0.02, 0.03, 0.04])
    assert [c.verdict for c in out] == ["holds", "holds", "holds"]
    # the same three as one family: the third test would be adjusted too
    fam = g.holm_adjust_claims([claim(id=str(i), p_value=p, p_adjusted=p, criterion=crit)
                                for i, p in enumerate([0.01, 0.03, 0.04])])
    assert [c.p_adjusted for c in fam] == pytest.approx([0.03, 0.06, 0.06])
    assert "not significant" in fam[1].why


def test_claim_spec_freezes_form_and_criterion_text():
    spec = g.ClaimSpec("Suk & Duan (arXiv 2510.08539), Thm 1", "J(K) >= sigmoid(logit J0 + M/2)", "bound",
                       C.below(0.05))
    assert spec.criterion_text == "interval below 0.05"
    with pytest.raises(ValueError, match="form"):
        g.ClaimSpec("s", "t", "theorem", C.below(0.05))
    with pytest.raises(ValueError, match="primary"):
        g.ClaimSpec("s", "t", "law", C.below(0.05), primary=True)
