"""gapdyn.evidence.planner.confirmation_size, the one confirmation-sizing rule: against the rules written out with
plain loops, and every committed plan re-derived from its committed inputs (docs/evidence.md, §8)."""

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from gapdyn.evidence.planner import allocate, confirmation_size

VERDICTS = Path(__file__).resolve().parents[1] / "docs" / "verdicts"
BANDIT_STUDIES = ("threshold", "length", "success_rate", "stagnation", "stagnation_noisy", "taxonomy", "logistic",
                  "methods")

planned_n = st.one_of(st.none(), st.integers(0, 600), st.just(math.inf))


@settings(max_examples=100, deadline=None)
@given(st.lists(planned_n, max_size=6), st.integers(1, 80), st.integers(1, 80))
def test_seed_budget_is_the_clipped_largest_want(planned, n_min, n_max):
    """n = min(max(largest plan, floor), n_max), floor = min(n_min, n_max); None asks the floor, inf the budget."""
    floor = min(n_min, n_max)
    wants = [floor if p is None else n_max if p == math.inf else max(p, floor) for p in planned]
    expect = floor
    for w in wants:
        expect = max(expect, w)
    expect = min(expect, n_max)
    assert confirmation_size(dict(enumerate(planned)), n_min=n_min, n_max=n_max) == expect


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from("abc"), st.tuples(st.integers(1, 300), st.floats(0.5, 50.0)), min_size=1),
       st.integers(1, 40), st.floats(-10.0, 5000.0))
def test_cost_budget_gives_each_key_its_want_or_an_equal_share(plan, n_min, budget):
    """All wants when they fit; else, cheapest total first, each key min(want, (left / keys left) // cost)."""
    planned = {k: p for k, (p, _) in plan.items()}
    cost = {k: c for k, (_, c) in plan.items()}
    want = {k: max(p, n_min) for k, p in planned.items()}
    got = confirmation_size(planned, n_min=n_min, cost=cost, budget=budget)
    left = max(budget, 0.0)
    if sum(want[k] * cost[k] for k in want) <= left:
        assert got == want
        return
    order = sorted(want, key=lambda k: want[k] * cost[k])
    for i, k in enumerate(order):
        n = 0
        while n < want[k] and (n + 1) * cost[k] <= left / (len(order) - i):
            n += 1
        assert got[k] == n, k
        left -= n * cost[k]
    assert sum(got[k] * cost[k] for k in got) <= max(budget, 0.0) + 1e-9


def test_inputs_are_checked():
    for kwargs in ({"n_min": 1}, {"n_min": 1, "n_max": 5, "cost": {"a": 1.0}, "budget": 3.0},
                   {"n_min": 1, "cost": {"a": 1.0}}, {"n_min": 0, "n_max": 5}):
        with pytest.raises(ValueError):
            confirmation_size({"a": 3}, **kwargs)
    for bad in (2.5, -1, True, "3"):
        with pytest.raises(ValueError, match="planned"):
            confirmation_size({"a": bad}, n_min=1, n_max=5)
    with pytest.raises(ValueError, match="cost"):
        allocate({"a": 1}, {"a": 0.0}, 10)


@pytest.mark.parametrize("name", BANDIT_STUDIES)
def test_committed_bandit_plans_rederive(name):
    """The runner's plan from the committed discovery claims (floor 40, budget the full config's confirmation
    seeds) is the pooled rule written out, and the confirmation block size the claims record where they do."""
    from gapdyn.evidence.claims import claims_from_json
    from gapdyn.evidence.experiment import registry
    from gapdyn.evidence.runner import CONFIRMATION_MIN, plan_confirmation

    budget = len(tuple(registry()[name].load().config.full().confirmation))
    claims = claims_from_json((VERDICTS / f"{name}-full" / "claims.json").read_text())
    disc = [c for c in claims if c.block == "discovery"]
    plan = plan_confirmation(disc, n_max=budget)
    counted = [c for c in disc if c.counts_as_evidence and c.n_planned is not None]
    pool = [c for c in counted if c.primary] or counted
    floor = min(CONFIRMATION_MIN, budget)
    assert plan.n == min(max([int(c.n_planned) for c in pool] + [floor]), budget)
    recorded = {int(m) for c in claims if c.block == "confirmation"
                for m in re.findall(r"(\d+) instances \(confirmation\)", c.setting)}
    assert recorded <= {plan.n}


@pytest.mark.parametrize("folder", ["llm-ablation-full", "llm-wide-full"])
def test_committed_ablation_plans_rederive(folder):
    """plan_seeds on the committed runs.csv's pilot seeds gives the committed plan.json (pilot_seeds aside)."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("torch")
    from llm_probe.experiments.ablation import plan_seeds

    plan = json.loads((VERDICTS / folder / "plan.json").read_text())
    runs = pd.read_csv(VERDICTS / folder / "runs.csv")
    got = plan_seeds(runs[runs.seed.isin(plan["pilot_seeds"])], n_min=plan["n_min"], n_max=plan["n_max"])
    want = {k: v for k, v in plan.items() if k != "pilot_seeds"}
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def test_committed_safe_step_plan_rederives():
    """The safe step study's confirmation seeds per lr from what its committed plan.json records (the measured CPU
    seconds included): the recorded ``used``, in the recorded order."""
    pytest.importorskip("torch")
    from llm_probe.experiments.safe_step_experiment import plan_used

    plan = json.loads((VERDICTS / "safe_step-full" / "plan.json").read_text())
    assert json.dumps(plan_used(plan)) == json.dumps(plan["used"])
