"""Views of the session's shared experiment runs (tests/conftest.py ``experiment_runs``)."""

from __future__ import annotations

import dataclasses


def discovery_only(res):
    """The discovery block of an ExperimentResult as the result of a run without a confirmation block: its rows
    and claims are those of ``mod.run(mod.Config.test())`` (the blocks are analysed apart, Holm within a block;
    checked for every experiment in tests/test_bandits_experiments.py), so the experiments' own tests read it
    instead of running the test configuration a second time."""
    rows = res.results[res.results["block"] == "discovery"].reset_index(drop=True)
    return dataclasses.replace(res, results=rows, claims=tuple(res.block("discovery")), plan=None)
