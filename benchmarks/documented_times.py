"""``python -m benchmarks.documented_times [--only NAME ...] [--write]``: time the commands the README and
docs/quickstart.md state a time for, and rewrite their measured-times tables.

Each command runs as a child process from the repository root, in one shared temporary folder (the quickstart's
steps in order: ``inspect`` reads the probed run written before it). Per command: wall seconds, CPU seconds
(user + system of the waited-for child, ``resource.getrusage(RUSAGE_CHILDREN)``), the 1-minute load average
before, its maximum sampled every 2 s during, the core count and the date. CPU seconds change little with the
load; wall seconds do, which is why every row states its load.

Records are merged into ``benchmarks/documented_times.json`` (a row is replaced only when its command ran again);
``--write`` renders them into the README's and docs/quickstart.md's blocks between the ``measured-times`` markers,
and every inline ``measured-sum`` span there (a time said in a sentence: the summed CPU and wall seconds of the
commands it names, with their load). A command not measured yet is shown as such, never given a number.

Besides the commands, the set-up is timed: ``make venv`` in a fresh ``git clone`` of this checkout (row ``install``,
with pip's cache as it is; row ``install_empty_pip_cache`` with ``PIP_CACHE_DIR`` an empty folder, so every
package is fetched and unpacked again), and the figures paragraph's ``gapdyn reproduce --no-progress`` from an
empty working directory with numba's cache empty (row ``reproduce_quick_cold``: the kernels' first compile and the
tiny-Qwen warm-up included). A command's untimed preparation (the clone, the empty folders) runs before its clock
starts. ``--note`` adds a text to the rows measured in this run (e.g. what else loaded the machine).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NamedTuple

from gapdyn.cmdline import optional

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "documented_times.json"
GAPDYN = [sys.executable, "-m", "gapdyn.cli"]
"""The ``gapdyn`` command of this checkout (the console script's entry point, run from the repository root so the
checkout's code is the one timed even where the installed script points at another copy)."""



class Command(NamedTuple):
    """A timed command: as documented, its argv, where it is documented (README / quickstart), and its set-up.
    ``{tmp}`` in argv, before, cwd and env stands for the shared folder."""

    shown: str
    argv: list[str]
    where: str
    empty: tuple[str, ...] = ()
    """Folders made empty (removed if there) before the clock starts."""
    before: tuple[tuple[str, ...], ...] = ()
    """Commands run in order before the clock starts (untimed)."""
    cwd: str | None = None
    """Working directory (default: the repository root)."""
    env: tuple[tuple[str, str | None], ...] = ()
    """Environment changes: a value, or None to remove the variable."""
    checkout_on_path: bool = True
    """Put this checkout first on PYTHONPATH (the ``gapdyn`` commands); False for a fresh clone's own set-up."""


_CLONE = ("git", "clone", "--quiet", str(ROOT), "{tmp}/install-clone")
_NO_CACHES = (("NUMBA_CACHE_DIR", "{tmp}/numba-cache"), ("GAPDYN_WARM_CACHE", None), ("GAPDYN_STORE", None))

COMMANDS: dict[str, Command] = {
    "help": Command("gapdyn --help", [*GAPDYN, "--help"], "README"),
    "demo": Command("gapdyn demo --seeds 1",
                    [*GAPDYN, "demo", "--seeds", "1", "--no-progress", "--out", "{tmp}/demo"], "quickstart"),
    "trl_probe": Command("python examples/trl_grpo_probe.py --steps 20 --out runs/probe",
                         [sys.executable, "examples/trl_grpo_probe.py", "--steps", "20", "--out", "{tmp}/probe"],
                         "quickstart"),
    "inspect": Command("gapdyn inspect runs/probe", [*GAPDYN, "inspect", "{tmp}/probe", "--out", "{tmp}/inspect"],
                       "quickstart"),
    "reproduce_test": Command("gapdyn reproduce --mode test", [*GAPDYN, "reproduce", "--mode", "test", "--no-progress",
                                                               "--out", "{tmp}/reproduce-test"], "README"),
    "reproduce_quick": Command("gapdyn reproduce (= make reproduce after set-up)",
                               [*GAPDYN, "reproduce", "--no-progress", "--out", "{tmp}/reproduce"], "README"),
    "reproduce_quick_cold": Command(
        "gapdyn reproduce --no-progress (empty working directory, numba's cache empty)",
        [*GAPDYN, "reproduce", "--no-progress"], "README", empty=("{tmp}/cold", "{tmp}/numba-cache"),
        cwd="{tmp}/cold", env=_NO_CACHES),
    "testbed_run": Command("gapdyn train testbed --seed 0",
                           [*GAPDYN, "train", "testbed", "--seed", "0", "--out", "{tmp}/tb0"], "README"),
    "test_suite": Command("make test (python -m pytest -m \"not slow\", set-up done)",
                          [sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider"], "README"),
    "install": Command("make venv (fresh clone, pip's cache as it was)", ["make", "venv"], "README",
                       empty=("{tmp}/install-clone",), before=(_CLONE,), cwd="{tmp}/install-clone",
                       checkout_on_path=False),
    "install_empty_pip_cache": Command(
        "make venv (fresh clone, PIP_CACHE_DIR empty)", ["make", "venv"], "README",
        empty=("{tmp}/install-clone", "{tmp}/pip-cache"), before=(_CLONE,), cwd="{tmp}/install-clone",
        env=(("PIP_CACHE_DIR", "{tmp}/pip-cache"),), checkout_on_path=False),
}
"""name -> the command timed under that name."""
QUICKSTART = ("trl_probe", "inspect", "demo")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(argv: list[str], *, cwd=ROOT, env=None, sample_s: float = 2.0) -> dict:
    """Run ``argv`` to its end; wall and CPU seconds (the child's user + system), load before / max / after."""
    loads, done = [os.getloadavg()[0]], threading.Event()

    def sample():
        while not done.wait(sample_s):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    c0, w0 = _children_cpu(), time.perf_counter()
    sampler.start()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        done.set()
        sampler.join()
    return {"wall_s": round(time.perf_counter() - w0, 1), "cpu_s": round(_children_cpu() - c0, 1),
            "load_before": round(loads[0], 1), "load_max": round(max(loads), 1),
            "load_after": round(os.getloadavg()[0], 1), "exit": proc.returncode, "tail": proc.stdout[-2000:]}


def _row(name: str, rec: dict | None) -> str:
    shown = COMMANDS[name].shown
    if rec is None:
        return f"| `{shown}` | not measured yet | | | |"
    ok = "" if rec["exit"] in (0, 3) else f" (exit {rec['exit']})"
    note = f"; {rec['note']}" if rec.get("note") else ""
    return (f"| `{shown}` | {rec['wall_s']:g}{ok} | {rec['cpu_s']:g} | {rec['load_before']:g} / {rec['load_max']:g} | "
            f"{rec['cores']} cores, {rec['date']}{note} |")


def render(records: dict, names) -> str:
    """The markdown table of ``names`` (in that order) from ``records``."""
    lines = ["| command | wall s | CPU s | load before / max during | machine, date |", "|---|---|---|---|---|"]
    lines += [_row(n, records.get(n)) for n in names]
    lines.append("")
    lines.append("Measured by `python -m benchmarks.documented_times` (wall: elapsed; CPU: user + system of the "
                 "command; the load is the 1-minute load average: on a loaded machine the wall grows, the CPU "
                 "seconds much less).")
    return "\n".join(lines)


SUM = re.compile(r"(<!-- measured-sum: ([\w ]+) -->).*?(<!-- /measured-sum -->)", re.S)
"""An inline span whose text is the summed time of the named commands (``<!-- measured-sum: a b -->...<!--
/measured-sum -->``): a time stated in prose comes from the record, never typed."""


def render_sum(records: dict, names) -> str:
    """The summed CPU and wall seconds of ``names`` with the load range and the machine, or 'not measured yet'."""
    recs = [records.get(n) for n in names]
    if not recs or any(r is None for r in recs):
        return "not measured yet"
    cpu, wall = sum(r["cpu_s"] for r in recs), sum(r["wall_s"] for r in recs)
    lo, hi = min(r["load_before"] for r in recs), max(r["load_max"] for r in recs)
    load = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
    notes = "; ".join(dict.fromkeys(r["note"] for r in recs if r.get("note")))
    return (f"{round(cpu, 1):g} s of CPU, {round(wall):g} s wall at load {load} ({recs[0]['cores']} cores, "
            f"{min(r['date'] for r in recs)[:10]}{'; ' + notes if notes else ''})")


def fill_sums(text: str, records: dict) -> str:
    """``text`` with every measured-sum span re-rendered from ``records`` (unknown names: a KeyError)."""
    def one(m):
        names = m.group(2).split()
        unknown = [n for n in names if n not in COMMANDS]
        if unknown:
            raise KeyError(f"measured-sum names an unknown command {unknown[0]!r} (one of {', '.join(COMMANDS)})")
        return m.group(1) + render_sum(records, names) + m.group(3)

    return SUM.sub(one, text)


def replace_block(text: str, body: str, marker: str = "measured-times") -> str:
    """``text`` with the lines between ``<!-- marker... -->`` and ``<!-- /marker -->`` replaced by ``body``."""
    start = text.index(f"<!-- {marker}")
    start = text.index("\n", start) + 1
    end = text.index(f"<!-- /{marker} -->")
    return text[:start] + body.rstrip("\n") + "\n" + text[end:]


def write_docs(records: dict) -> list[Path]:
    readme, quick = ROOT / "README.md", ROOT / "docs" / "quickstart.md"
    targets = [(readme, [n for n in COMMANDS if COMMANDS[n].where == "README"] + list(QUICKSTART)), (quick, QUICKSTART)]
    written = []
    for path, names in targets:
        if path.is_file():
            path.write_text(fill_sums(replace_block(path.read_text(), render(records, names)), records))
            written.append(path)
    return written


def run_command(cmd: Command, tmp: str) -> dict:
    """Prepare ``cmd`` (its empty folders, its untimed commands) in the shared folder ``tmp``, then
    :func:`measure` it; a failing preparation is a CalledProcessError (nothing timed)."""
    fill = lambda x: x.replace("{tmp}", tmp)  # noqa: E731
    for d in map(fill, cmd.empty):
        shutil.rmtree(d, ignore_errors=True)
        Path(d).mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if cmd.checkout_on_path:  # the checkout's code
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    for key, value in cmd.env:
        if value is None:
            env.pop(key, None)
        else:
            env[key] = fill(value)
    cwd = fill(cmd.cwd) if cmd.cwd else ROOT
    for argv in cmd.before:
        subprocess.run([fill(x) for x in argv], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return measure([fill(x) for x in cmd.argv], cwd=cwd, env=env)


@dataclass
class DocumentedTimesConfig:
    """Time the documented commands (wall, CPU, load) into benchmarks/documented_times.json."""

    only: tuple[str, ...] | None = None
    """Time only these commands (in this order)."""
    write: bool = False
    """Rewrite the README and docs/quickstart.md tables."""
    render_only: bool = False
    """Time nothing; only --write from the record."""
    folder: Annotated[str | None, optional("DIR", "a temporary folder, removed")] = None
    """The shared folder the commands write into (kept: e.g. gapdyn_out, whose reproduce/ the gallery's --snapshot
    reads)."""
    note: Annotated[str | None, optional("TEXT")] = None
    """A note carried by the rows measured in this run (e.g. "a background study on both cores")."""


def main(argv: list[str] | None = None) -> int:
    from gapdyn.cmdline import parse

    a = parse(DocumentedTimesConfig, sys.argv[1:] if argv is None else argv,
              prog="python -m benchmarks.documented_times")
    unknown = [n for n in a.only or () if n not in COMMANDS]
    if unknown:
        raise SystemExit(f"python -m benchmarks.documented_times: --only: unknown command {unknown[0]!r} "
                         f"(one of {', '.join(COMMANDS)})")
    records = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    if not a.render_only:
        with (contextlib.nullcontext(str(Path(a.folder).resolve())) if a.folder
              else tempfile.TemporaryDirectory(prefix="documented_times_")) as tmp:
            for name in a.only or list(COMMANDS):
                rec = run_command(COMMANDS[name], tmp)
                rec.update(cores=os.cpu_count(), date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
                if a.note:
                    rec["note"] = a.note
                print(f"{name:16s} wall {rec['wall_s']:8.1f} s  cpu {rec['cpu_s']:8.1f} s  load "
                      f"{rec['load_before']}/{rec['load_max']}  exit {rec['exit']}", flush=True)
                records[name] = {k: v for k, v in rec.items() if k != "tail"}
                RECORD.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
                if rec["exit"] not in (0, 3):
                    print(rec["tail"], file=sys.stderr)
    if a.write:
        for path in write_docs(records):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
