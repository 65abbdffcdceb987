"""The experiment contract (bandits/experiments/__init__.py, docs/evidence.md) over every registered experiment in
test mode: run() returns an ExperimentResult whose claims per block are exactly CRITERIA's ids, with verdicts in
gapdyn.VERDICTS, finite intervals, the stamped criteria hash, blocks on disjoint seeds; run_cell is
deterministic; the sweep store gives back the same rows. Machinery only: no claim is required to hold."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import gapdyn
from bandits.experiments import EXPERIMENTS, load
from bandits.experiments._common import ExperimentResult
from tests.conftest import EXPERIMENT_CONFIRMATION, experiment_test_config

NOT_YET_CONVERTED: tuple[str, ...] = ()
"""Experiments still on the legacy verdict table (being converted by other contributors); remove a name here
as soon as its module has CRITERIA, Config.test() and the (config, instances) / block signatures."""
CONVERTED = tuple(n for n in EXPERIMENTS if n not in NOT_YET_CONVERTED)


@pytest.fixture(scope="module")
def test_runs(experiment_runs):
    return {name: experiment_runs[name] for name in CONVERTED}


@pytest.mark.parametrize("name", CONVERTED)
def test_contract(name, test_runs):
    mod, res = test_runs[name]
    assert isinstance(res, ExperimentResult) and res.name == mod.NAME == name and res.mode == "test"
    assert mod.Config.quick().mode == "quick" and mod.Config.full().mode == "full"
    conf = tuple(mod.Config.full().confirmation)  # 1000-1019, or from 1000 on where a claim's interval needs more
    assert mod.Config.quick().confirmation == () and conf[:20] == gapdyn.CONFIRMATION_SEEDS
    assert conf == tuple(range(1000, 1000 + len(conf)))
    assert set(mod.Config.full().instances).isdisjoint(mod.Config.full().confirmation)
    assert all(isinstance(c, gapdyn.Criterion) for c in mod.CRITERIA.values())
    cells = mod.cells(mod.Config.test(), mod.Config.test().instances)
    assert cells and all(isinstance(c, dict) for c in cells)
    json.dumps(cells)  # plain data
    h = gapdyn.criteria_hash(mod.CRITERIA)
    assert res.criteria_hash == h
    for block in gapdyn.BLOCKS:
        claims = res.block(block)
        assert sorted(c.id for c in claims) == sorted(mod.CRITERIA), block
        for c in claims:
            assert c.verdict in gapdyn.VERDICTS and c.criteria_hash == h
            assert c.criterion == mod.CRITERIA[c.id]
            assert all(math.isfinite(v) for v in (c.estimate, *c.interval)) and c.interval[0] <= c.interval[1]
            assert c.n >= 1
            if not c.measured:  # nothing to judge: inconclusive whatever the criterion
                assert c.verdict == "inconclusive"
            elif c.criterion.kind == "identity":  # shown, never counted: identity or a visible failure
                assert c.verdict in ("identity", "does not hold")
            else:
                assert c.verdict != "identity"
    assert len(res.replication) == len(mod.CRITERIA)
    assert isinstance(res.verdict, pd.DataFrame) and set(res.verdict["block"]) == {"confirmation"}


@pytest.mark.parametrize("name", CONVERTED)
def test_blocks_use_only_their_seeds(name, test_runs):
    mod, res = test_runs[name]
    seeds = res.results.groupby("block")["instance"].unique()
    assert set(seeds["discovery"]) == set(mod.Config.test().instances)
    assert set(seeds["confirmation"]) == set(EXPERIMENT_CONFIRMATION)


@pytest.mark.parametrize("name", ["taxonomy", "logistic"])  # the two cheapest: the runner is the same for all
def test_the_discovery_block_is_the_run_without_a_confirmation_block(name, test_runs):
    """The shared run's discovery block (tests/experiment_views.discovery_only, read by the experiments' own
    tests) has the rows and claims of ``run(Config.test())`` without a confirmation block."""
    import dataclasses

    from tests.experiment_views import discovery_only

    mod, res = test_runs[name]
    plain = mod.run(mod.Config.test(), backend="serial", progress=False)
    view = discovery_only(res)
    pd.testing.assert_frame_equal(view.results, plain.results.reset_index(drop=True), check_exact=True)
    assert [dataclasses.asdict(c) for c in view.claims] == [dataclasses.asdict(c) for c in plain.claims]
    assert view.plan is None and plain.plan is None and len(view.results) < len(res.results)


@pytest.mark.parametrize("name", CONVERTED)
def test_analysis_of_a_block_reads_only_that_block(name, test_runs):
    mod, res = test_runs[name]
    cfg = experiment_test_config(mod)
    rows = res.results[res.results["block"] == "confirmation"].drop(columns="block")
    again = mod.analyse(rows, cfg, block="confirmation")
    stored = {c.id: c for c in res.block("confirmation")}
    for c in again:  # Holm adjustment and the hash are added by the runner; the measurement is the same
        assert (c.estimate, c.interval, c.n) == (stored[c.id].estimate, stored[c.id].interval, stored[c.id].n), c.id


@pytest.mark.parametrize("name", CONVERTED)
def test_run_cell_is_deterministic(name):
    mod = load(name)
    cfg = mod.Config.test()
    for cell in mod.cells(cfg, cfg.instances)[:2]:
        pd.testing.assert_frame_equal(mod.run_cell(**cell), mod.run_cell(**cell))


def test_run_goes_through_the_store(tmp_path):
    mod = load("methods")
    cfg = mod.Config.test()
    a = mod.run(cfg, store=tmp_path, backend="serial", progress=False)
    b = mod.run(cfg, store=tmp_path, backend="serial", progress=False)  # loaded from the store
    np.testing.assert_array_equal(a.results["J_final"].to_numpy(), b.results["J_final"].to_numpy())
    assert [c.to_dict() for c in a.claims] == [c.to_dict() for c in b.claims]


@pytest.mark.slow
@pytest.mark.parametrize("name", CONVERTED)
def test_quick_mode_runs(name, tmp_path):
    mod = load(name)
    res = mod.run(mod.Config.quick(), store=tmp_path, backend="joblib", n_jobs=2, progress=False)
    assert sorted(c.id for c in res.claims) == sorted(mod.CRITERIA)


def test_confirmation_block_is_sized_by_the_planned_n_of_the_primaries_within_the_budget():
    from dataclasses import replace

    from bandits.experiments._common import plan_confirmation

    base = gapdyn.Claim.from_estimate(gapdyn.Estimate(0.1, 0.0, 0.2, 20, 0.95, "t"), id="a", source="s",
                                      statement="x", setting="y", statistic="z", criterion_text="above 0",
                                      criterion=gapdyn.Criterion.above(0.0), block="discovery", form="comparison")
    explor = replace(base, id="b", n_planned=500)
    assert plan_confirmation([replace(base, n_planned=60, primary=True), explor], n_max=100).n == 60
    assert plan_confirmation([replace(base, n_planned=10, primary=True), explor], n_max=100).n == 40  # floor
    over = plan_confirmation([replace(base, n_planned=900, primary=True)], n_max=100)
    assert over.n == 100 and over.planned == 900 and "budget" in over.note
    assert plan_confirmation([explor], n_max=100).n == 100  # no primary: every counted claim
    assert plan_confirmation([replace(base, n_planned=70, form="derived")], n_max=100).n == 40  # derived: not counted
    assert plan_confirmation([], n_max=30).n == 30  # a budget below the floor wins
