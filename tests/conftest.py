"""Shared pytest configuration: hypothesis profiles and common fixtures.

Profiles: ``ci`` (derandomized, fixed example budget; selected when CI is set), ``dev`` (random, the
default locally) and ``thorough`` (random, HYPOTHESIS_THOROUGH_EXAMPLES examples a property, default 2000;
a test's own ``@settings(max_examples=n)`` is scaled by the same factor over the 60 of the other profiles).
Choose explicitly with HYPOTHESIS_PROFILE=ci|dev|thorough; ``tests/test_reliability_thorough.py`` (slow) runs
each property-test file under ``thorough`` in a subprocess.
"""

from __future__ import annotations

import os
import sys

# Read by OpenMP once, when torch is first imported (llm_probe/threads.py): set before any test module imports it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One warm-model cache per test session (llm_probe.warmup): shared by the tests and their subprocesses, never
# the checkout's ./gapdyn_out/warm (a cache left by an earlier session or older code is not reused).
if "GAPDYN_WARM_CACHE" not in os.environ:
    import tempfile

    os.environ["GAPDYN_WARM_CACHE"] = tempfile.mkdtemp(prefix="gapdyn-warm-")

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE_EXAMPLES = 60
THOROUGH_EXAMPLES = int(os.environ.get("HYPOTHESIS_THOROUGH_EXAMPLES", "2000"))
settings.register_profile(
    "thorough",
    max_examples=THOROUGH_EXAMPLES,
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def thorough_settings(own, default, examples: int = THOROUGH_EXAMPLES):
    """The settings a property runs under ``thorough``: its own ``@settings(max_examples=n)`` budget scaled to
    max(n, n * examples / 60), not derandomized; None where it has no own budget (``own is default``: hypothesis
    gives such a test the loaded profile itself, whose budget is already ``examples``; scaling it again ran
    examples^2 / 60 examples, 66 667 at 2000)."""
    if own is None or own is default:
        return None
    n = max(own.max_examples, round(own.max_examples * examples / BASE_EXAMPLES))
    return settings(own, max_examples=n, derandomize=False)


def pytest_collection_modifyitems(config, items):
    """Under ``thorough``, a property's own ``@settings(max_examples=n)`` grows by THOROUGH_EXAMPLES / 60 too
    (:func:`thorough_settings`); with GAPDYN_PROPERTY_TESTS_ONLY=1 only the hypothesis tests run (the others
    deselected)."""
    if PROFILE != "thorough":
        return
    if os.environ.get("GAPDYN_PROPERTY_TESTS_ONLY") == "1":
        keep = [it for it in items if hasattr(getattr(it, "obj", None), "_hypothesis_internal_use_settings")]
        config.hook.pytest_deselected(items=[it for it in items if it not in keep])
        items[:] = keep
    for item in items:
        fn = getattr(item, "obj", None)
        if getattr(fn, "_gapdyn_thorough", False):
            continue
        scaled = thorough_settings(getattr(fn, "_hypothesis_internal_use_settings", None), settings.default)
        if scaled is not None:
            fn._hypothesis_internal_use_settings = scaled
            fn._gapdyn_thorough = True


@pytest.fixture(scope="session", autouse=True)
def torch_threads():
    """The project's torch thread count (1 unless GAPDYN_TORCH_THREADS) for every test, when the collected
    tests use torch (no torch import otherwise)."""
    if "torch" in sys.modules:
        from llm_probe.threads import configure_threads

        configure_threads()


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator: tests never touch global random state."""
    return np.random.default_rng(12345)


EXPERIMENT_CONFIRMATION = (1000, 1001)
"""Confirmation seeds of the experiments' test-mode runs in the suite."""


def experiment_test_config(mod):
    """``mod.Config.test()`` with the confirmation block :data:`EXPERIMENT_CONFIRMATION`."""
    import dataclasses

    return dataclasses.replace(mod.Config.test(), confirmation=EXPERIMENT_CONFIRMATION)


@pytest.fixture(scope="session")
def experiment_runs():
    """name -> (module, ExperimentResult) of every registered bandit experiment in test mode, run once per
    session and shared by the contract tests and the experiments' own tests."""
    from bandits.experiments import EXPERIMENTS, load

    out = {}
    for name in EXPERIMENTS:
        mod = load(name)
        out[name] = (mod, mod.run(experiment_test_config(mod), backend="serial", progress=False))
    return out


@pytest.fixture
def mean_interval_valid_from_40(monkeypatch):
    """A constructed coverage table in which the studentized cluster-mean interval is valid from n = 40 (the
    committed table, with the harder DGPs, finds it valid at no tabulated n): for tests of the machinery that
    computes a mean claim where its interval is valid."""
    import pandas as pd

    from gapdyn.evidence import coverage

    table = pd.DataFrame([dict(method="studentized_cluster_mean", kind="mean", dgp="d", n=n, nominal=0.95,
                               coverage=0.95 if n >= 40 else 0.90) for n in (10, 20, 40, 60, 100, 200)])
    monkeypatch.setattr(coverage, "frozen_table", lambda: table)
    return table
