"""The one experiment protocol (gapdyn.evidence.experiment): every registered study passes the same contract."""

import json

import pytest

import gapdyn
from gapdyn.cmdline import MODES
from gapdyn.evidence.experiment import Experiment, claim_specs, registry

REGISTERED = sorted(registry())
CHEAP = {"taxonomy", "logistic", "methods"}  # test mode in seconds; the others run under `slow`
STUDIES = {"llm_ablation", "llm_safe_step"}  # the tiny-Qwen studies (llm_probe.experiments)


def test_registry_lists_every_bandit_experiment():
    from bandits.experiments import EXPERIMENTS

    assert set(EXPERIMENTS) <= set(REGISTERED)
    assert STUDIES <= set(REGISTERED)


@pytest.mark.parametrize("name", REGISTERED)
def test_static_contract(name):
    exp = registry()[name].load()
    assert isinstance(exp, Experiment) and exp.name == name
    with pytest.raises(TypeError):
        exp.claims["x"] = None  # frozen at import
    assert exp.criteria_hash == gapdyn.criteria_hash({k: v.criterion for k, v in exp.claims.items()})
    for mode in exp.modes:
        cfg = exp.configure(mode)
        assert cfg.mode == mode and mode in MODES
    cfg = exp.configure("test")
    cells = exp.cells(cfg, tuple(getattr(cfg, "instances", ())))
    assert cells and all(isinstance(c, dict) for c in cells)
    assert len({json.dumps(c, sort_keys=True) for c in cells}) == len(cells)  # JSON-serialisable, distinct
    with pytest.raises(ValueError, match="mode"):
        exp.configure("fast")


def _check_claims(exp, claims):
    assert claims
    for c in claims:
        spec = exp.spec(c.id.split("@")[0])  # a claim made per setting is "<claim id>@<setting>"
        assert (c.source, c.statement, c.form, c.criterion) == (spec.source, spec.statement, spec.form,
                                                                  spec.criterion)
        # the criterion's own text, or what is measured followed by it
        assert c.criterion_text == spec.criterion_text or c.criterion_text.endswith(": " + spec.criterion_text)
        assert c.criteria_hash == exp.criteria_hash
        assert c.primary == spec.primary


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in CHEAP else pytest.mark.slow)
                                  for n in REGISTERED])
def test_a_run_makes_only_declared_claims_judged_by_their_frozen_specs(name, tmp_path, monkeypatch):
    from bandits.experiments._common import run_experiment

    if name in STUDIES:
        monkeypatch.chdir(tmp_path)  # their runs and warm model go under ./gapdyn_out
    exp = registry()[name].load()
    res = run_experiment(exp, exp.configure("test"), backend="serial", progress=False)
    _check_claims(exp, res.claims)
    if name in STUDIES:  # deterministic given the cell: a second run reads the finished folders back
        again = run_experiment(exp, exp.configure("test"), backend="serial", progress=False)
        assert [c.to_dict() for c in again.claims] == [c.to_dict() for c in res.claims]


def test_claim_specs_refuse_tables_that_disagree():
    crit = gapdyn.Criterion.above(0.0)
    with pytest.raises(ValueError, match="same claims"):
        claim_specs({"a": ("s", "x")}, {"a": crit, "b": crit}, {"a": "law"})
    with pytest.raises(ValueError, match="primary"):
        claim_specs({"a": ("s", "x")}, {"a": crit}, {"a": "comparison"}, primary=["b"])
    specs = claim_specs({"a": ("s", "x")}, {"a": crit}, {"a": "comparison"}, primary=["a"])
    assert specs["a"].primary and specs["a"].criterion_text == crit.describe()
