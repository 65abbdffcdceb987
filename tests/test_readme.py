"""README first screen: the answers to a user's questions, the two set-up commands, the TRL snippet, then the
findings; the snippet uses only calls and keywords that examples/trl_grpo_probe.py (run by tests/test_examples.py)
uses too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _sections() -> list[str]:
    return re.findall(r"^## (.+)$", README, flags=re.M)


def _calls(tree: ast.AST) -> set[tuple[str, str]]:
    """(called name, keyword) pairs, the name being the last part of the callee (f, obj.f)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            out |= {(name, kw.arg) for kw in node.keywords} | {(name, "")}
    return out


def test_first_screen_is_answers_quick_start_trl_probe_then_findings():
    assert _sections()[:4] == ["What gapdyn tells you about your run", "Quick start (fresh machine, CPU)",
                               "Probe your own TRL run", "What it found (measured here)"]
    answers = README.split("## What gapdyn tells you about your run\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in answers.splitlines() if line.startswith("| **")]
    assert len(rows) == 3 and all("`gapdyn inspect RUN`" in r for r in rows)  # each question names its command
    for marker in ("lr-number-table", "alarm-table"):  # the blocks the testbed's tables go into
        assert f"<!-- {marker} -->" in answers and f"<!-- /{marker} -->" in answers, marker
    found = README.split("## What it found (measured here)\n", 1)[1]
    prose = found.split("<!-- claims-table:", 1)[0].strip().splitlines()
    assert 1 <= len(prose) <= 6
    for link in ("docs/evidence.md", "docs/coverage.md", "docs/claims.md"):
        assert f"]({link})" in "\n".join(prose), link
    quick = README.split("## Quick start", 1)[1].split("## ", 1)[0]
    assert re.search(r"^make reproduce\b", quick, re.M) and re.search(r"^make test\b", quick, re.M)


def test_trl_snippet_uses_what_the_tested_example_uses():
    probe = README.split("## Probe your own TRL run", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", probe, flags=re.S)
    assert len(code.strip().splitlines()) <= 12
    example = ast.parse((ROOT / "examples" / "trl_grpo_probe.py").read_text())
    missing = _calls(ast.parse(code)) - _calls(example) - {("print", "")}
    assert not missing, f"README snippet calls what the example does not: {sorted(missing)}"
    imports = {(n.module, a.name) for n in ast.walk(ast.parse(code)) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert imports <= {(n.module, a.name) for n in ast.walk(example) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "docs/llm_probe.md" in probe and "examples/trl_grpo_probe.py" in probe
