"""benchmarks.documented_times: the CPU seconds it reports are the child's own (printed by the child), and its
table replaces only the marked block, rows never measured shown as such."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks.documented_times import COMMANDS, measure, render, replace_block


def test_cpu_seconds_are_the_childs_own():
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint(time.process_time())"
    rec = measure([sys.executable, "-c", burn], sample_s=0.05)
    assert rec["exit"] == 0
    own = float(rec["tail"].strip().splitlines()[-1])  # the child's own CPU seconds at its end
    assert own - 0.15 <= rec["cpu_s"] <= own + 1.0  # + interpreter start-up and exit, rounded to 0.1
    assert rec["load_max"] >= rec["load_before"] >= 0


def test_table_block_is_replaced_between_the_markers_only():
    text = "a\n<!-- measured-times: generated -->\nold\nrows\n<!-- /measured-times -->\nb\n"
    rec = {"wall_s": 12.0, "cpu_s": 10.5, "load_before": 0.5, "load_max": 1.5, "exit": 0, "cores": 2,
           "date": "2026-12-02 05:00 UTC"}
    body = render({"demo": rec}, ["demo", "inspect"])
    out = replace_block(text, body)
    assert out.startswith("a\n<!-- measured-times: generated -->\n| command |") and out.endswith("<!-- /measured-times -->\nb\n")
    assert "old" not in out
    assert f"| `{COMMANDS['demo'][0]}` | 12 | 10.5 | 0.5 / 1.5 | 2 cores, 2026-12-02 05:00 UTC |" in out
    assert f"| `{COMMANDS['inspect'][0]}` | not measured yet |" in out
    assert replace_block(out, body) == out  # idempotent


def test_a_time_said_in_a_sentence_is_the_sum_of_its_measured_rows():
    from benchmarks.documented_times import fill_sums

    rec = {"demo": {"wall_s": 12.0, "cpu_s": 3.4, "load_before": 0.5, "load_max": 1.5, "exit": 0, "cores": 2,
                    "date": "2026-12-02 05:00 UTC"},
           "inspect": {"wall_s": 8.0, "cpu_s": 2.9, "load_before": 0.7, "load_max": 2.0, "exit": 0, "cores": 2,
                       "date": "2026-12-01 05:00 UTC"}}
    text = "a <!-- measured-sum: demo inspect -->old<!-- /measured-sum --> b"
    out = fill_sums(text, rec)
    assert out == ("a <!-- measured-sum: demo inspect -->6.3 s of CPU, 20 s wall at load 0.5-2 (2 cores, 2026-12-01)"
                   "<!-- /measured-sum --> b")
    assert fill_sums(out, rec) == out  # idempotent
    assert "not measured yet" in fill_sums(text, {"demo": rec["demo"]})  # a missing row: never a partial sum
    with pytest.raises(KeyError, match="unknown command 'nope'"):
        fill_sums("<!-- measured-sum: nope -->x<!-- /measured-sum -->", rec)


def test_every_measured_sum_in_the_docs_names_known_commands():
    from benchmarks.documented_times import COMMANDS, ROOT, SUM

    spans = [m.group(2).split() for p in (ROOT / "README.md", ROOT / "docs" / "quickstart.md")
             for m in SUM.finditer(p.read_text())]
    assert spans and all(n in COMMANDS for names in spans for n in names)


def test_a_commands_preparation_is_untimed_and_its_setting_applied(tmp_path, monkeypatch):
    """run_command: the empty folders are made (emptied when there), the untimed commands run before the clock
    (their CPU seconds are not the row's), the environment changes apply ({tmp} filled, None removes), the working
    directory is the command's, and the checkout is put on PYTHONPATH only when asked."""
    import os

    from benchmarks.documented_times import ROOT, Command, run_command

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "stale").write_text("x")
    monkeypatch.setenv("DT_REMOVED", "1")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    show = ("import os, json; print(json.dumps([os.getcwd(), sorted(os.listdir('.')), os.environ.get('DT_REMOVED'), "
            "os.environ.get('DT_SET'), os.environ.get('PYTHONPATH')]))")
    cmd = Command("x", [sys.executable, "-c", show], "README", empty=("{tmp}/work",),
                  before=((sys.executable, "-c", burn), (sys.executable, "-c", "open('{tmp}/work/made', 'w')")),
                  cwd="{tmp}/work", env=(("DT_REMOVED", None), ("DT_SET", "{tmp}/s")), checkout_on_path=False)
    rec = run_command(cmd, str(tmp_path))
    import json

    cwd, listed, removed, set_, path = json.loads(rec["tail"].strip().splitlines()[-1])
    assert rec["exit"] == 0 and rec["cpu_s"] < 0.4  # the 0.5 s burn before the clock is not counted
    assert Path(cwd) == tmp_path / "work" and listed == ["made"]  # emptied, then prepared
    assert removed is None and set_ == f"{tmp_path}/s" and path is None
    rec = run_command(cmd._replace(checkout_on_path=True, before=()), str(tmp_path))
    assert json.loads(rec["tail"].strip().splitlines()[-1])[-1].split(os.pathsep)[0] == str(ROOT)
