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


@pytest.mark.parametrize("package", ["gapdyn", "bandits"])
def test_core_packages_have_no_import_cycle(package):
    """The static import graph (every import, function-level ones included) of gapdyn and of bandits has no cycle;
    read as in tests/test_llm_trl_import_cycles.py, whose own test shows the finder catches a lazy cycle."""
    from pathlib import Path

    from tests.test_llm_trl_import_cycles import cycles, import_graph

    graph = import_graph(Path(__file__).resolve().parents[1] / package)
    if package == "gapdyn":  # the subpackages are read, relative imports included
        assert {"gapdyn.theory.directions", "gapdyn.evidence.coverage"} <= set(graph)
        assert "gapdyn.theory.gap" in graph["gapdyn.theory.directions"]
        assert "gapdyn.io" in graph["gapdyn.evidence.coverage"]
    assert not cycles(graph)


def test_public_api_names_exist():
    import gapdyn

    for name in gapdyn.__all__:
        assert hasattr(gapdyn, name), name
    for required in ("softmax_scores", "loglinear_scores", "success_rate", "log_odds", "gradient_gap",
                     "gap_alignment", "cumulative_alignment", "logodds_lower_bound", "expected_direction",
                     "sampled_direction", "sharp_step_threshold", "token_step_effects"):
        assert required in gapdyn.__all__


# --- llm_probe: a library and its studies (llm_probe.experiments) ------------------------------------------------

LLM_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1] / "llm_probe"
LLM_LIBRARY = sorted(p.stem for p in LLM_ROOT.glob("*.py") if p.stem not in ("cli", "__init__"))
"""The library modules: every module of llm_probe outside experiments/, except the command line (cli.py)."""


def _imported_names(path) -> set:
    """Absolute names of the modules a file imports, static (ast): relative imports resolved against its package."""
    import ast

    package = ".".join(path.relative_to(LLM_ROOT.parent).parent.parts)
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            parent = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(p for p in (parent, node.module) if p)
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "experiments" in node.value:
            names.add(node.value)  # importlib.import_module("...experiments...") and the like
    return names


def test_llm_probe_library_never_imports_its_experiments_statically():
    assert {"trainer", "callback", "gap_probe", "safe_step", "offline"} <= set(LLM_LIBRARY)
    for stem in (*LLM_LIBRARY, "__init__"):
        bad = sorted(n for n in _imported_names(LLM_ROOT / f"{stem}.py") if "experiments" in n)
        assert not bad, (stem, bad)


@pytest.mark.slow  # ~13 s: imports torch, transformers and trl in a fresh process
def test_llm_probe_library_never_imports_its_experiments_at_run_time():
    """Importing every library module (and the package) loads no module of llm_probe.experiments."""
    pytest.importorskip("torch")
    mods = ", ".join(f"llm_probe.{m}" for m in LLM_LIBRARY)
    code = (f"import sys, llm_probe, {mods}; llm_probe.GapProbeCallback, llm_probe.SafeStepCallback; "
            "print(','.join(sorted(m for m in sys.modules if m.startswith('llm_probe.experiments'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    # the same walk sees a study that imports one: the check can fail
    assert "llm_probe.experiments.early_warning" in _imported_names(LLM_ROOT / "experiments" / "ablation.py")


# --- one command-line stack: tyro (gapdyn/cmdline.py), no argparse ----------------------------------------------

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def _argparse_uses(source: str) -> list[int]:
    """Lines of ``source`` that import argparse or use an ``argparse.`` attribute (code only, via ast: a word in a
    string or a comment is not a use)."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "argparse":
            lines.append(node.lineno)
    return sorted(set(lines))


def test_no_python_file_uses_argparse():
    """Every command parser uses tyro through gapdyn.cmdline (CONTRIBUTING.md, README "Command line")."""
    assert _argparse_uses("import argparse\nx = 1\nargparse.ArgumentParser()") == [1, 3]  # the check can fail
    assert _argparse_uses("'''import argparse'''  # argparse.ArgumentParser") == []
    files = [p for d in REPO.iterdir() if d.name not in (".venv", ".git") and d.is_dir() for p in d.rglob("*.py")]
    files += list(REPO.glob("*.py"))
    assert len(files) > 100
    bad = {str(p.relative_to(REPO)): ln for p in files if (ln := _argparse_uses(p.read_text(encoding="utf-8")))}
    assert not bad, bad


def test_safe_step_callback_is_a_plain_module_level_class():
    """One class, defined at the top of llm_probe.safe_step_callback, reached by each documented import path."""
    pytest.importorskip("trl")
    import llm_probe
    import llm_probe.safe_step as safe_step
    from llm_probe.safe_step_callback import SafeStepCallback
    from transformers import TrainerCallback

    assert SafeStepCallback.__qualname__ == "SafeStepCallback"  # not built inside a function ("<locals>")
    assert SafeStepCallback.__module__ == "llm_probe.safe_step_callback" and issubclass(SafeStepCallback, TrainerCallback)
    assert llm_probe.SafeStepCallback is SafeStepCallback and safe_step.SafeStepCallback is SafeStepCallback
