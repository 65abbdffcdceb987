"""`gapdyn claims` on claims files it cannot use: every malformed file is refused with exit 2 and one line naming
it (a file with no claims says so), and two claims files of the same run that disagree are refused with both paths
named, while an identical copy is read once."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gapdyn
from paper_figs import report

ROOT = Path(__file__).resolve().parents[1]


def _claims():
    crit = gapdyn.Criterion.above(0.0)
    c = gapdyn.Claim(id="dip_recovers", source="beyond the papers", statement="s", setting="t", statistic="share",
                     estimate=0.5, interval=(0.2, 0.8), n=15, criterion_text=crit.describe(), criterion=crit,
                     block="confirmation", form="existence", key=("Suk & Duan", "Theorem 2"))
    return [c, dataclasses.replace(c, id="sharpness", estimate=-0.5, interval=(-0.8, -0.2))]


def _valid_text() -> str:
    return gapdyn.claims_to_json(_claims())


def _no_criterion() -> str:
    rows = json.loads(_valid_text())
    del rows[1]["criterion"]
    return json.dumps(rows)


MALFORMED = {
    "no criterion": (_no_criterion, "has no criterion"),
    "truncated": (lambda: _valid_text()[:-40], "not valid JSON"),
    "empty object": (lambda: "{}", "JSON list of claims"),
    "null": (lambda: "null", "JSON list of claims"),
    "claims not a list": (lambda: '{"claims": 5}', "JSON list of claims"),
    "empty list": (lambda: "[]", "holds no claims"),
    "not utf-8": (lambda: "\udcff", "not a claims file"),
}


def _run(argv, capsys):
    rc = report.main(argv)
    return rc, capsys.readouterr()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    return path


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_claims_file_is_named_in_one_line_with_exit_2(case, tmp_path, capsys):
    make, what = MALFORMED[case]
    bad = _write(tmp_path / "threshold-full" / "claims.json", make())
    for argv in (["--runs", str(bad)], ["--runs", str(tmp_path)]):
        rc, cap = _run(argv + ["--out", str(tmp_path / "out")], capsys)
        lines = cap.err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, (case, cap.err)
        assert str(bad) in lines[0] and what in lines[0], lines[0]
        assert "Traceback" not in cap.err and not (tmp_path / "out").exists()


def test_a_reproduction_whose_claims_file_is_malformed_or_empty_is_named(tmp_path, capsys):
    for text, what in ((_no_criterion(), "has no criterion"), ("[]", "holds no claims")):
        f = _write(tmp_path / "repro" / "results" / "claims.json", text)
        rc, cap = _run(["--out", str(tmp_path / "repro")], capsys)
        assert rc == 2 and len(cap.err.strip().splitlines()) == 1 and what in cap.err, cap.err
        assert str(f.parent.parent) in cap.err or str(f) in cap.err


def test_the_gapdyn_command_gives_one_line_not_a_traceback(tmp_path):
    """End to end through the installed entry point: a record without a criterion (once a KeyError traceback)."""
    bad = _write(tmp_path / "threshold-full" / "claims.json", _no_criterion())
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GAPDYN_TORCH_THREADS="1")
    env.pop("GAPDYN_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", "gapdyn.cli", "claims", "--runs", str(bad), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert str(bad) in p.stderr and "has no criterion" in p.stderr


def test_two_claims_files_of_the_same_run_that_disagree_are_refused(tmp_path, capsys):
    first = _write(tmp_path / "verdicts" / "threshold-full" / "claims.json", _valid_text())
    changed = [_claims()[0], dataclasses.replace(_claims()[1], estimate=-0.4)]
    backup = _write(tmp_path / "verdicts" / "backup" / "threshold-full" / "claims.json",
                    gapdyn.claims_to_json(changed))
    rc, cap = _run(["--runs", str(tmp_path / "verdicts"), "--out", str(tmp_path / "out")], capsys)
    lines = cap.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and str(first) in lines[0] and str(backup) in lines[0], cap.err
    assert "disagree" in lines[0]
    # the same two files named one by one: refused the same way
    rc, cap = _run(["--runs", str(backup), str(first), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and str(first) in cap.err and str(backup) in cap.err


def test_an_identical_copy_of_a_run_is_read_once(tmp_path):
    _write(tmp_path / "verdicts" / "threshold-full" / "claims.json", _valid_text())
    _write(tmp_path / "verdicts" / "old" / "threshold-full" / "claims.json", _valid_text())
    claims = report.read_runs([tmp_path / "verdicts"])
    assert sorted(c.id for c in claims) == ["threshold.dip_recovers", "threshold.sharpness"]
    # the count the README shows: one holds, one does not hold (by hand from _claims), not doubled
    assert report.readme_headline(claims).startswith("1 claims hold, 1 do not hold, 0 are inconclusive")
    one = report.read_runs([tmp_path / "verdicts" / "threshold-full"])
    assert one == claims
