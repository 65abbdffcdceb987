"""What the command line and the packages import before they work, and how they end when a signal lands while
they import.

- ``import gapdyn`` / ``import llm_probe`` load no submodule (PEP 562 lazy exports), and every exported name
  resolves to the object its module defines (checked against the module's own source, statically);
- ``gapdyn --help``, each subcommand's ``--help`` and each argument error import none of scipy, torch, numba,
  transformers, pandas, matplotlib (the import set is checked, never a time);
- SIGINT / SIGTERM delivered while a command imports its modules end it with exit 130 / 143 and one line on
  stderr. The signal is raised by an import hook at a named module's first import, so the moment is the same on
  every run (no sleeps).

All command lines run in one driver process that forks a child per case after importing what the ``gapdyn``
console script imports (gapdyn.cli), plus tyro and numpy, which every command loads and which load nothing heavy
(checked): each child's heavy imports are those of a real start.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("scipy", "torch", "numba", "transformers", "pandas", "matplotlib")
"""Packages that cost seconds to import on a loaded machine: no help text or argument error may load them."""

_DRIVER = r"""
import json, os, signal, sys
# Python turns SIGINT into KeyboardInterrupt only when the process starts with SIGINT at its default; a test run
# started in the background from a non-interactive shell (`nohup pytest ... &`) hands SIGINT down as ignored.
# Install Python's own handler, as an interactive start would, so the cases below see a real start's SIGINT.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.argv[0] = "gapdyn"
cases = json.loads(sys.argv[1])
from gapdyn.cli import main  # what the console script imports
parent_modules = sorted(sys.modules)
# Loaded once here rather than in every child (a child's set then lacks them, and nothing heavy they might pull
# in): the parser and numpy, which every command needs; the heavy set they bring in is reported and checked.
import numpy, tyro, tyro.conf  # noqa: E401
shared_heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))

results = []
for case in cases:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    mod_r, mod_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (out_r, err_r, mod_r, out_w, err_w):
            os.close(fd)
        hook = case.get("signal_at")
        if hook:
            class SignalAt:
                # raise the signal at the first import of one module (deterministic: no timer)
                def find_spec(self, name, path=None, target=None):
                    if name == hook["module"]:
                        sys.meta_path.remove(self)
                        signal.raise_signal(getattr(signal, hook["signal"]))
                    return None
            sys.meta_path.insert(0, SignalAt())
        try:
            rc = main(case["argv"])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            import traceback
            traceback.print_exc()
            rc = 99
        sys.stdout.flush(); sys.stderr.flush()
        os.write(mod_w, json.dumps(sorted(sys.modules)).encode())
        os._exit(int(rc or 0))
    for fd in (out_w, err_w, mod_w):
        os.close(fd)
    chunks = {out_r: b"", err_r: b"", mod_r: b""}
    import selectors
    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    while sel.get_map():
        for key, _ in sel.select():
            data = os.read(key.fd, 65536)
            if data:
                chunks[key.fd] += data
            else:
                sel.unregister(key.fd)
                os.close(key.fd)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    results.append({"argv": case["argv"], "rc": rc, "stdout": chunks[out_r].decode(errors="replace"),
                    "stderr": chunks[err_r].decode(errors="replace"),
                    "modules": json.loads(chunks[mod_r] or b"[]")})
print(json.dumps({"parent_modules": parent_modules, "shared_heavy": shared_heavy, "results": results}))
"""


def run_cases(cases: list[dict], tmp: Path) -> tuple[list[str], list[dict]]:
    """Run each case ({"argv": [...], "signal_at": {"module": M, "signal": "SIGINT"}?}) in a forked child of one
    driver process; returns (the driver's modules after importing gapdyn.cli, one result per case)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "GAPDYN_TORCH_THREADS": "1", "HOME": str(tmp), "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "100"}
    p = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(cases), json.dumps(HEAVY)], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["shared_heavy"] == [], out["shared_heavy"]  # what the driver loads before forking is light
    return out["parent_modules"], out["results"]


def heavy(modules) -> list[str]:
    return sorted({m.split(".")[0] for m in modules} & set(HEAVY))


def registered() -> dict[str, str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["gapdyn.commands"]


# --- the lazy packages --------------------------------------------------------------------------------------


@pytest.mark.parametrize("package", ["gapdyn", "llm_probe"])
def test_importing_the_package_loads_no_submodule_and_nothing_heavy(package):
    code = f"import sys, json, {package}; print(json.dumps(sorted(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    modules = json.loads(p.stdout)
    own = [m for m in modules if m.startswith(package + ".")]
    assert own == (["gapdyn._lazy"] if package == "gapdyn" else ["llm_probe.threads"]), own  # both stdlib only
    assert heavy(modules) == [] and "numpy" not in modules


def _top_level_names(path: Path) -> set[str]:
    """Names bound at the top level of a module's source (definitions, assignments, imports), read with ast."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize("package", ["gapdyn", "llm_probe"])
def test_the_export_table_is_all_and_each_name_is_defined_by_its_module(package):
    pkg = importlib.import_module(package)
    table = pkg._EXPORTS_BY_MODULE
    flat = [n for names in table.values() for n in names]
    assert len(flat) == len(set(flat)), "a name exported from two modules"
    assert set(flat) == set(pkg.__all__) and len(pkg.__all__) == len(set(pkg.__all__))
    for module, names in table.items():
        defined = _top_level_names(ROOT / package / (module.replace(".", "/") + ".py"))
        missing = sorted(set(names) - defined)
        assert not missing, (module, missing)
    assert set(pkg.__all__) <= set(dir(pkg))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pkg.no_such_name
    # the check can fail: a table naming a function its module does not define is caught
    assert "gradient_gap" not in _top_level_names(ROOT / "gapdyn" / "evidence" / "stats.py")


def test_every_gapdyn_name_is_its_modules_object():
    """The lazy attribute and the module's own attribute are the same object, for every exported name."""
    import gapdyn

    for name, module in gapdyn._EXPORTS.items():
        assert getattr(gapdyn, name) is getattr(importlib.import_module(f"gapdyn.{module}"), name), name
    assert isinstance(gapdyn.evidence.stats, types.ModuleType)
    assert gapdyn.evidence.coverage.__name__ == "gapdyn.evidence.coverage"
    # an exported name equal to a submodule's would be replaced by that module once it is imported
    pkg = ROOT / "gapdyn"
    children = {p.stem for p in pkg.glob("*.py")} | {p.parent.name for p in pkg.glob("*/__init__.py")}
    assert {"theory", "evidence", "cli"} <= children
    assert not children & set(gapdyn._EXPORTS), "a name shadowing a module"


@pytest.mark.parametrize("sub", ["theory", "evidence"])
def test_each_gapdyn_subpackage_lists_its_modules_and_loads_them_on_access(sub):
    """``dir(gapdyn.<sub>)`` lists every module of the folder; ``gapdyn.<sub>.<module>`` imports it on access."""
    code = (f"import sys, gapdyn; m = gapdyn.{sub}; print(sorted(k for k in sys.modules if k.startswith('gapdyn.'))); "
            f"print(sorted(m._SUBMODULES)); print(m.{'gap' if sub == 'theory' else 'stats'}.__name__)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded, listed, name = p.stdout.splitlines()
    assert loaded == str(sorted(["gapdyn._lazy", f"gapdyn.{sub}"]))  # the subpackage alone loads no module
    files = sorted(f.stem for f in (ROOT / "gapdyn" / sub).glob("*.py") if f.stem != "__init__")
    assert listed == str(files)
    assert name == f"gapdyn.{sub}.{'gap' if sub == 'theory' else 'stats'}"


def test_gapdyn_names_load_no_torch_and_no_sibling():
    code = ("import sys, gapdyn; [getattr(gapdyn, n) for n in gapdyn.__all__]; "
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'llm_probe', 'trl', 'bandits', 'paper_figs', 'numba', 'pandas', "
            "'matplotlib'))))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert p.stdout.strip() == ""


def test_llm_probe_function_named_as_its_module_stays_the_function():
    """``llm_probe.warmup`` / ``llm_probe.measure`` are the functions, also after their modules were imported by
    another module (the import system binds a submodule to its package)."""
    pytest.importorskip("torch")
    import llm_probe
    import llm_probe.trainer  # noqa: F401  (imports llm_probe.warmup as a submodule)
    from llm_probe.measure import measure
    from llm_probe.warmup import warmup

    assert llm_probe.warmup is warmup and llm_probe.measure is measure
    assert sys.modules["llm_probe.warmup"].warmup is warmup


# --- the command line: import sets ----------------------------------------------------------------------------

def _subcommands() -> dict[str, tuple[str, ...]]:
    """The second-level subcommands of the commands that have them, from their own tables."""
    from bandits.cli import SUBCOMMANDS as BANDIT
    from llm_probe.cli import SUBCOMMANDS as TRAIN

    return {"bandit": tuple(BANDIT), "train": tuple(TRAIN)}


def _near_miss(names, choices=None) -> tuple[str, str]:
    """(a name, a one-letter transposition of it that is no prefix of any choice and that did_you_mean answers
    with that name): a typo the command line must answer with "did you mean"."""
    from gapdyn.cmdline import did_you_mean

    choices = tuple(names if choices is None else choices)
    for word in names:
        for i in range(len(word) - 2, 0, -1):
            typo = word[:i] + word[i + 1] + word[i] + word[i + 2:]
            if (typo != word and not any(c.startswith(typo) for c in choices)
                    and did_you_mean(typo, choices) == f"did you mean {word!r}? "):
                return word, typo
    raise AssertionError(f"no near miss of {choices}")


def _near_miss_cases() -> list[tuple[list[str], str]]:
    """One near-miss name per group the command line resolves (argv, the name it must suggest)."""
    from bandits.experiments import EXPERIMENTS
    from llm_probe.config import LOSS_NAMES
    from paper_figs.cli import FIGURES

    subs = _subcommands()
    cases = []
    for prefix, names in ((), tuple(registered())), (["bandit"], subs["bandit"]), (["train"], subs["train"]), \
            (["bandit", "run"], tuple(EXPERIMENTS)), (["figs", "--only"], FIGURES), \
            (["train", "--method"], LOSS_NAMES), (["train", "testbed", "--method"], LOSS_NAMES):
        word, typo = _near_miss(names)
        cases.append(([*prefix, typo], word))
    return cases


HELP_CASES = [["--help"], *[[name, "--help"] for name in sorted(registered())],
              *[[cmd, sub, "--help"] for cmd, subs in _subcommands().items() for sub in subs]]
"""Every command's and every subcommand's --help (walked from the registries)."""
NEAR_MISS = _near_miss_cases()
ERROR_CASES = [["no-such-command"], ["bandit"], ["bandit", "frobnicate"], ["bandit", "run", "no_such_experiment"],
               ["bandit", "run", "threshold", "--jobs", "0"], ["bandit", "run", "threshold", "--mode", "huge"],
               ["figs", "--only", "fig99"], ["figs", "--jobs", "0"], ["train", "--lr", "-1"],
               ["train", "--steps", "many"], ["train", "--method", "gpro"], ["reproduce", "--mode", "huge"],
               ["claims", "--mode", "huge"], ["demo", "--arms", "1"],
               *[[name, "--no-such-option"] for name in sorted(registered())],
               *[[cmd, sub, "--no-such-option"] for cmd, subs in _subcommands().items() for sub in subs],
               *[argv for argv, _ in NEAR_MISS]]
"""Argument errors: a bad value, an unknown option of every command and subcommand, a near-miss name per group."""


LIGHT_CASES = [["bandit", "list"]]
"""Commands that only read text: they load nothing heavy either (the experiments' docstrings come from source)."""


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """One driver process for every help and argument-error case: (driver modules, argv tuple -> result)."""
    cases = [{"argv": a} for a in HELP_CASES + ERROR_CASES + LIGHT_CASES]
    parent, results = run_cases(cases, tmp_path_factory.mktemp("cli"))
    return parent, {tuple(r["argv"]): r for r in results}


def test_the_console_script_imports_nothing_heavy(cli_runs):
    parent, _ = cli_runs
    assert heavy(parent) == [] and "numpy" not in parent and "tyro" not in parent


@pytest.mark.parametrize("argv", HELP_CASES, ids=" ".join)
def test_help_imports_nothing_heavy(cli_runs, argv):
    r = cli_runs[1][tuple(argv)]
    assert r["rc"] == 0, r["stderr"][-2000:]
    assert "usage" in r["stdout"].lower()
    assert heavy(r["modules"]) == [], heavy(r["modules"])


def test_bandit_list_reads_the_docstrings_without_importing_the_experiments(cli_runs):
    """The listing equals the descriptions of the imported modules (the route it replaced), and loads none."""
    import textwrap

    from bandits.cli import _description
    from bandits.experiments import EXPERIMENTS, load

    r = cli_runs[1][("bandit", "list")]
    assert r["rc"] == 0 and heavy(r["modules"]) == [], (r["stderr"], heavy(r["modules"]))
    assert not [m for m in r["modules"] if m.startswith("bandits.experiments.")]
    width = 100  # the driver's COLUMNS
    expected = "".join(f"{name}\n" + textwrap.fill(_description(load(name).__doc__), width=width,
                                                   initial_indent="    ", subsequent_indent="    ") + "\n"
                       for name in EXPERIMENTS)
    assert r["stdout"] == expected


def test_top_level_help_imports_no_subcommand_package(cli_runs):
    r = cli_runs[1][("--help",)]
    assert not [m for m in r["modules"] if m.split(".")[0] in ("bandits", "llm_probe", "paper_figs")]
    assert all(name in r["stdout"] for name in registered())  # the summaries were read without importing


@pytest.mark.parametrize("argv", ERROR_CASES, ids=" ".join)
def test_argument_errors_are_one_line_and_import_nothing_heavy(cli_runs, argv):
    r = cli_runs[1][tuple(argv)]
    assert r["rc"] == 2, (r["rc"], r["stderr"][-2000:])
    assert len(r["stderr"].strip().splitlines()) == 1, r["stderr"]
    assert heavy(r["modules"]) == [], heavy(r["modules"])


@pytest.mark.parametrize("i", range(len(NEAR_MISS)), ids=[" ".join(a) for a, _ in NEAR_MISS])
def test_a_near_miss_name_is_answered_with_did_you_mean(cli_runs, i):
    argv, word = NEAR_MISS[i]
    r = cli_runs[1][tuple(argv)]
    assert r["rc"] == 2 and f"did you mean {word!r}" in r["stderr"], (r["rc"], r["stderr"][-2000:])


def test_the_torch_free_loss_names_are_the_registered_losses():
    """--method is checked against llm_probe.config.LOSS_NAMES before torch loads: the losses' own table, in order."""
    pytest.importorskip("torch")
    from llm_probe.config import LOSS_NAMES
    from llm_probe.losses import LOSSES

    assert LOSS_NAMES == tuple(LOSSES)


def test_the_walk_covers_every_command_and_subcommand():
    helped = {tuple(a[:-1]) for a in HELP_CASES if a[-1] == "--help"}
    assert {(name,) for name in registered()} <= helped
    assert {(cmd, sub) for cmd, subs in _subcommands().items() for sub in subs} <= helped
    assert {"bandit", "train"} <= set(_subcommands()) and "testbed" in _subcommands()["train"]


# --- the command line: signals while importing ----------------------------------------------------------------

SIGNAL_CASES = [  # argv, the module whose first import raises the signal, the command named in the line
    (["--help"], "tomllib", "gapdyn"),
    (["bandit", "list"], "importlib.metadata", "gapdyn bandit"),  # while the subcommands are looked up
    (["bandit", "list"], "bandits.cli", "gapdyn bandit"),
    (["bandit", "run", "threshold", "--mode", "test", "--out", "o"], "bandits.experiments.threshold",
     "gapdyn bandit"),
    (["demo", "--arms", "20"], "gapdyn.demo", "gapdyn demo"),
    (["figs", "--list"], "paper_figs.cli", "gapdyn figs"),
    (["figs", "--list"], "matplotlib", "gapdyn figs"),
    (["reproduce", "--help"], "paper_figs.reproduce", "gapdyn reproduce"),
    (["claims", "--help"], "paper_figs.report", "gapdyn claims"),
    (["train", "--steps", "1"], "llm_probe.cli", "gapdyn train"),
    (["train", "--steps", "1"], "torch", "gapdyn train"),
    (["inspect", "--help"], "llm_probe.inspect_run", "gapdyn inspect"),
    (["lr-finder", "--help"], "llm_probe.lr_finder", "gapdyn lr-finder"),
]


@pytest.fixture(scope="module")
def signal_runs(tmp_path_factory):
    cases = [{"argv": argv, "signal_at": {"module": module, "signal": sig}}
             for argv, module, _ in SIGNAL_CASES for sig in ("SIGINT", "SIGTERM")]
    _, results = run_cases(cases, tmp_path_factory.mktemp("signals"))
    return results


def test_every_subcommand_has_a_signal_case():
    assert {argv[0] for argv, _, _ in SIGNAL_CASES} >= set(registered())


@pytest.mark.parametrize("i", range(2 * len(SIGNAL_CASES)),
                         ids=[f"{' '.join(a)}@{m}-{s}" for a, m, _ in SIGNAL_CASES for s in ("SIGINT", "SIGTERM")])
def test_a_signal_while_importing_ends_with_one_line(signal_runs, i):
    argv, module, prog = SIGNAL_CASES[i // 2]
    name, code = (("SIGINT", 130), ("SIGTERM", 143))[i % 2]
    r = signal_runs[i]
    assert r["argv"] == argv
    lines = r["stderr"].strip().splitlines()
    assert r["rc"] == code, (r["rc"], r["stderr"][-3000:])
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: interrupted by {name}"), r["stderr"][-3000:]
    assert "Traceback" not in r["stderr"]
