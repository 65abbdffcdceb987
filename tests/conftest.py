"""Shared pytest configuration: hypothesis profiles and common fixtures.

Profiles: ``ci`` (derandomized, fixed example budget; selected when CI is set) and ``dev``
(random, the default locally). Choose explicitly with HYPOTHESIS_PROFILE=ci|dev.
"""

from __future__ import annotations

import os

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


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator: tests never touch global random state."""
    return np.random.default_rng(12345)
