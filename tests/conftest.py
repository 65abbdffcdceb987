"""Shared pytest configuration: hypothesis profiles and common fixtures.

Profiles: ``ci`` (derandomized, fixed example budget; selected when CI is set) and ``dev``
(random, the default locally). Choose explicitly with HYPOTHESIS_PROFILE=ci|dev.
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
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


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
