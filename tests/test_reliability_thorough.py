"""The property tests under the random ``thorough`` hypothesis profile (tests/conftest.py), one file at a time in a
subprocess: HYPOTHESIS_THOROUGH_EXAMPLES examples a property (default 2000; a property's own budget scaled by the
same factor; a property without its own budget runs exactly that many), not derandomized, only the hypothesis tests of
the file. Slow (hours on 2 cores at the default):

    .venv/bin/pytest tests/test_reliability_thorough.py -m slow            # every property-test file
    HYPOTHESIS_THOROUGH_EXAMPLES=300 .venv/bin/pytest tests/test_reliability_thorough.py -m slow -k sequence

The default suite runs the same properties under ``ci`` (derandomized) or ``dev`` (random, 60 examples)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PROPERTY_FILES = sorted(p.name for p in TESTS.glob("test_*.py")
                        if p.name != Path(__file__).name and re.search(r"^@given\(", p.read_text(), re.M))


def test_the_property_files_are_found():
    assert "test_bandits_sequence.py" in PROPERTY_FILES and len(PROPERTY_FILES) >= 10, PROPERTY_FILES


@pytest.mark.slow
@pytest.mark.parametrize("name", PROPERTY_FILES)
def test_property_file_under_the_thorough_profile(name):
    env = {**os.environ, "HYPOTHESIS_PROFILE": "thorough", "GAPDYN_PROPERTY_TESTS_ONLY": "1", "OMP_NUM_THREADS": "1"}
    env.pop("CI", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", str(TESTS / name), "-m", "slow or not slow",
                        "-p", "no:cacheprovider"], cwd=TESTS.parent, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_the_thorough_budget_scales_only_a_property_s_own_settings():
    """A property without its own ``@settings`` carries the loaded profile itself and keeps its budget (scaling it
    again gave examples^2 / 60: 66 667 examples a property at 2000); an own budget n becomes n * examples / 60."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tests.conftest import thorough_settings

    @given(st.integers())
    def plain(x):
        pass

    @settings(max_examples=40)
    @given(st.integers())
    def own(x):
        pass

    default = settings.default
    assert plain._hypothesis_internal_use_settings is default
    assert thorough_settings(plain._hypothesis_internal_use_settings, default, examples=2000) is None
    scaled = thorough_settings(own._hypothesis_internal_use_settings, default, examples=2000)
    assert scaled.max_examples == round(40 * 2000 / 60) and scaled.derandomize is False
    assert thorough_settings(own._hypothesis_internal_use_settings, default, examples=30).max_examples == 40
