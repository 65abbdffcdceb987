"""The taxonomy experiment: contract, blocks, and the valley identity against a closed form written here."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import gapdyn
from bandits.experiments import EXPERIMENTS, load
from tests.conftest import EXPERIMENT_CONFIRMATION
from tests.experiment_views import discovery_only

tax = load("taxonomy")


@pytest.fixture(scope="module")
def test_run(experiment_runs):
    return discovery_only(experiment_runs["taxonomy"][1])


def test_registered_and_configs():
    assert EXPERIMENTS["taxonomy"] == "bandits.experiments.taxonomy"
    assert [tax.Config.test().mode, tax.Config.quick().mode, tax.Config.full().mode] == ["test", "quick", "full"]
    assert tax.Config.quick().instances == gapdyn.DISCOVERY_SEEDS and tax.Config.quick().confirmation == ()
    assert tax.Config.full().confirmation == gapdyn.CONFIRMATION_SEEDS


def test_claims_follow_the_contract(test_run):
    claims = test_run.claims
    assert {c.id for c in claims} == set(tax.CRITERIA)
    for c in claims:
        assert math.isfinite(c.interval[0]) and math.isfinite(c.interval[1]) and c.n >= 1
        assert c.criteria_hash == gapdyn.criteria_hash(tax.CRITERIA)
        assert c.criterion == tax.CRITERIA[c.id]
    ident = [c for c in claims if c.criterion.kind == "identity"]
    assert [c.id for c in ident] == ["taxonomy.valley_never_disagrees"]
    assert not ident[0].counts_as_evidence


def test_confirmation_uses_only_its_seeds(experiment_runs):
    res = experiment_runs["taxonomy"][1]  # the session's test-mode run, confirmation block on 1000, 1001
    by_block = res.results.groupby("block")["instance"].unique()
    assert sorted(by_block["discovery"]) == sorted(tax.Config.test().instances)
    assert sorted(by_block["confirmation"]) == sorted(EXPERIMENT_CONFIRMATION)
    assert {c.block for c in res.claims} == {"discovery", "confirmation"}
    assert {c.block for c in res.claims} == {"discovery", "confirmation"}


def test_run_cell_is_deterministic_and_seeded():
    cell = tax.cells(tax.Config.test())[0]
    a, b = tax.run_cell(**cell), tax.run_cell(**cell)
    assert a.equals(b)
    other = tax.run_cell(**{**cell, "instance": cell["instance"] + 1})
    assert not np.allclose(a["p_s"].to_numpy(), other["p_s"].to_numpy())


def test_valley_identity_against_a_closed_form():
    """Delta H / A = -(f(p_s) - E_p f(p)) with f(x) = x (log x + H), written out here: valley tokens have
    Delta H of the sign of A; the experiment's count of valley misses is 0 and its signs match."""
    rng = np.random.default_rng(5)
    z = rng.standard_normal((400, 9)) * np.exp(rng.uniform(-2, 2, (400, 1)))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    tok = np.array([rng.choice(9, p=row) for row in p])
    H = -(p * np.log(p)).sum(1)
    ps = p[np.arange(400), tok]
    f_s, f_all = ps * (np.log(ps) + H), p * (np.log(p) + H[:, None])
    dH = -(f_s - (p * f_all).sum(1))
    C = (p**2).sum(1)
    valley = ps < C
    assert valley.any() and (dH[valley] > 0).all()
    eff = gapdyn.token_step_effects(z, tok, 1.0, 1.0)
    big = np.abs(dH) > 1e-9
    assert (np.sign(dH[big]) == eff.entropy_sign[big]).all()
    table = tax.taxonomy_table(300, vocab=9, seed=2).assign(instance=0)
    assert tax.summary(table)["valley_mispredicted"] == 0
