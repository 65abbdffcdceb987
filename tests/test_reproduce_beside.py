"""The tiny-Qwen demo run in a second process (``Sources.start_llm``, what `gapdyn reproduce` does on 2+ cores):
its failure reaches the caller as the in-process one does (that it writes what the in-process run writes:
tests/test_figs.py, against the tiny reproduction)."""

import pytest

pytest.importorskip("torch")

from paper_figs.data import Sources, SourceFailed  # noqa: E402


def test_a_failing_demo_beside_is_reported_as_in_this_process(tmp_path):
    (tmp_path / "llm").write_text("a file where the demo's folder should be")
    beside = Sources("test", store=tmp_path, llm_dir=tmp_path / "llm")
    beside.start_llm()
    with pytest.raises(SourceFailed, match="llm_probe.experiments.demo failed") as err:
        beside.llm()
    with pytest.raises(SourceFailed) as again:  # recorded once, raised again without rerunning
        beside.llm()
    assert str(again.value) == str(err.value)
    here = Sources("test", store=tmp_path, llm_dir=tmp_path / "llm")
    with pytest.raises(SourceFailed) as same:
        here.llm()
    assert str(same.value).split(":")[:2] == str(err.value).split(":")[:2]  # the same exception type
