"""The dependency direction of the house (CONTRIBUTING.md): the theory core and the simulators never import torch."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["gapdyn", "bandits"])
def test_core_packages_import_without_torch_or_llm_probe(package):
    code = (
        f"import sys, {package}; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'llm_probe', 'trl')); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_gapdyn_imports_no_sibling_package():
    code = "import sys, gapdyn; print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('bandits', 'llm_probe', 'paper_figs'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_api_names_exist():
    import gapdyn

    for name in gapdyn.__all__:
        assert hasattr(gapdyn, name), name
    for required in ("softmax_scores", "loglinear_scores", "success_rate", "log_odds", "gradient_gap",
                     "gap_alignment", "cumulative_alignment", "logodds_lower_bound", "expected_direction",
                     "sampled_direction", "sharp_step_threshold", "token_step_effects"):
        assert required in gapdyn.__all__
