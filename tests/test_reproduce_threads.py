"""`gapdyn reproduce` runs its serial stages with one BLAS thread, and that does not change a result."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import paper_figs.data
import paper_figs.reproduce as reproduce_mod
from bandits.experiments import stagnation
from paper_figs.data import NotAvailable


def _blas_threads() -> set[int]:
    return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


def test_stages_run_with_one_blas_thread(monkeypatch, tmp_path):
    if not _blas_threads():
        pytest.skip("no BLAS library loaded through threadpoolctl")
    seen: list[set[int]] = []

    class FakeSources:  # every stage records the BLAS thread count it runs under, then reports "not available"
        def __init__(self, *args, **kwargs):
            pass

        def claims(self, name):
            seen.append(_blas_threads())
            raise NotAvailable(f"{name}: recorded only")

    def fake_figures(sources, names, **kwargs):
        seen.append(_blas_threads())
        return {n: "not available yet: recorded only" for n in names}

    monkeypatch.setattr(paper_figs.data, "Sources", FakeSources)  # reproduce() imports it when it runs
    monkeypatch.setattr(reproduce_mod, "make_figures", fake_figures)
    with threadpool_limits(limits=2, user_api="blas"):  # the caller's setting: 2 threads
        reproduce_mod.reproduce(out_dir=tmp_path / "out", store=tmp_path / "store", progress=False, log=lambda s: None,
                                llm_beside=False)  # the stages of this process
        after = _blas_threads()
    assert len(seen) == len(reproduce_mod.FIGURES) + 1 + sum(map(reproduce_mod._runs_here,
                                                                 reproduce_mod._experiment_names()))
    assert all(s == {1} for s in seen), seen
    assert after == {2}  # restored on the way out


@pytest.mark.parametrize("setting", ["interference", "unreachable"])  # d = 16 and 2: fast under 2 threads too
def test_j_star_does_not_depend_on_blas_threads(setting):
    b = stagnation.shared_bandit(setting, 0, 3)
    with threadpool_limits(limits=1, user_api="blas"):
        one = stagnation.best_attainable(b, starts=1, seed=0)
    with threadpool_limits(limits=2, user_api="blas"):
        two = stagnation.best_attainable(b, starts=1, seed=0)
    assert np.isclose(one, two, rtol=0, atol=1e-9)


def test_bandit_run_runs_its_experiment_with_one_blas_thread(monkeypatch, tmp_path, capsys):
    """`gapdyn bandit run` runs the experiment under one BLAS thread and restores the caller's setting."""
    if not _blas_threads():
        pytest.skip("no BLAS library loaded through threadpoolctl")
    from bandits import cli
    from bandits.experiments import load

    mod = load("taxonomy")
    seen = []
    real = mod.run

    def recording_run(config, **kw):
        seen.append(_blas_threads())
        return real(config, **kw)

    monkeypatch.setattr(mod, "run", recording_run)
    with threadpool_limits(limits=2, user_api="blas"):
        rc = cli.main(["run", "taxonomy", "--mode", "test", "--out", str(tmp_path), "--no-progress"])
        after = _blas_threads()
    assert rc == 0 and seen == [{1}] and after == {2}
