"""No import cycle among llm_probe's modules (read statically: every ``import`` / ``from ... import`` in a module,
function-level ones included, so a lazy import that only hides a cycle counts as an edge). Scope: every module of
the package, ``llm_probe/experiments`` included."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "llm_probe"


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """{module: the package modules it imports}."""
    mods = {_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                target = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                cands = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                cands = [a.name for a in node.names]
            else:
                continue
            out |= {c for c in cands if c in mods and c != name}
        graph[name] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_lazy_import_cycle(tmp_path):
    pkg = tmp_path / "llm_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from .c import g\n")
    (pkg / "c.py").write_text("import llm_probe.a\n")
    (pkg / "d.py").write_text("from . import a\n")
    assert cycles(import_graph(pkg)) == [["llm_probe.a", "llm_probe.b", "llm_probe.c"]]


def test_llm_probe_has_no_import_cycle():
    graph = import_graph()
    assert {"llm_probe.callback", "llm_probe.safe_step", "llm_probe.sharding"} <= set(graph)
    assert {f"llm_probe.experiments.{m}" for m in ("ablation", "early_warning", "entropy", "pinned")} <= set(graph)
    assert graph["llm_probe.experiments.entropy"]  # the experiments' relative imports are read
    bad = cycles(graph)
    assert not bad, bad
