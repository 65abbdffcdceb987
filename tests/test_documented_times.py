"""benchmarks.documented_times: the CPU seconds it reports are the child's own (printed by the child), and its
table replaces only the marked block, rows never measured shown as such."""

from __future__ import annotations

import sys

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
