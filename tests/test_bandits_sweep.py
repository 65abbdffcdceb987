"""Tests of gapdyn.evidence.sweep / gapdyn.evidence.store: resumable, keyed, parallel sweeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from gapdyn.evidence.store import CellStore, canonical_cell, cell_key
from gapdyn.evidence.sweep import example_cell, run_sweep, sweep_keys

ROOT = Path(__file__).resolve().parents[1]


def _cells(n=12, rows=3):
    return [{"seed": s, "n": rows} for s in range(n)]


def _independent(cells):
    """The expected result built by hand (loop over cells, no sweep machinery)."""
    frames = []
    for c in cells:
        df = example_cell(**c)
        for k, v in c.items():
            df[k] = v
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def test_serial_matches_independent_loop(tmp_path):
    cells = _cells()
    df = run_sweep(example_cell, cells, name="s", store=tmp_path, backend="serial", progress=False)
    exp = _independent(cells)
    pd.testing.assert_frame_equal(df.drop(columns="cell_key"), exp, check_dtype=False)
    assert df["cell_key"].nunique() == len(cells)
    assert (tmp_path / "s" / "results.parquet").exists()
    assert len(list((tmp_path / "s" / "cells").glob("*.parquet"))) == len(cells)
    stored = pq.read_table(tmp_path / "s" / "results.parquet").to_pandas()
    pd.testing.assert_frame_equal(stored, df)


def test_joblib_equals_serial_and_rerun_computes_nothing(tmp_path):
    cells = _cells(10)
    ser = run_sweep(example_cell, cells, name="a", backend="serial", progress=False)
    par = run_sweep(example_cell, cells, name="a", store=tmp_path, backend="joblib", n_jobs=2, progress=False)
    pd.testing.assert_frame_equal(ser, par)
    again = run_sweep(example_cell, cells, name="a", store=tmp_path, backend="joblib", n_jobs=2, progress=False)
    assert again.attrs["n_computed"] == 0 and again.attrs["n_loaded"] == len(cells)
    pd.testing.assert_frame_equal(again, par)


def test_partial_store_only_missing_cells_computed(tmp_path):
    cells = _cells(9)
    run_sweep(example_cell, cells[::2], name="p", store=tmp_path, backend="serial", progress=False)
    full = run_sweep(example_cell, cells, name="p", store=tmp_path, backend="serial", progress=False)
    assert full.attrs["n_loaded"] == 5 and full.attrs["n_computed"] == 4
    pd.testing.assert_frame_equal(full, run_sweep(example_cell, cells, name="p", backend="serial", progress=False))


def test_corrupt_cell_file_is_recomputed(tmp_path):
    cells = _cells(4)
    ref = run_sweep(example_cell, cells, name="c", store=tmp_path, backend="serial", progress=False)
    key = sweep_keys(example_cell, cells, name="c")[2]
    path = tmp_path / "c" / "cells" / f"{key}.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated
    other = tmp_path / "c" / "cells" / f"{sweep_keys(example_cell, cells, name='c')[0]}.parquet"
    # a valid parquet file under the wrong name (metadata key mismatch) also counts as corrupt
    other.write_bytes((tmp_path / "c" / "cells" / f"{sweep_keys(example_cell, cells, name='c')[1]}.parquet").read_bytes())
    (tmp_path / "c" / "cells" / "junk.parquet.tmp-1234").write_bytes(b"partial")
    again = run_sweep(example_cell, cells, name="c", store=tmp_path, backend="serial", progress=False)
    assert again.attrs["n_computed"] == 2
    pd.testing.assert_frame_equal(again, ref)
    assert not list((tmp_path / "c" / "cells").glob("*.tmp-*"))


_KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    from gapdyn.evidence.sweep import run_sweep, example_cell
    cells = [{"seed": s, "n": 4, "sleep": 0.02} for s in range(60)]
    run_sweep(example_cell, cells, name="k", store=sys.argv[1], backend=sys.argv[2], n_jobs=2, progress=False)
    """
)


@pytest.mark.parametrize("backend", ["serial", pytest.param("joblib", marks=pytest.mark.slow)])
def test_sigkill_then_resume_gives_uninterrupted_result(tmp_path, backend):
    rng = np.random.default_rng(7 if backend == "serial" else 8)
    cells = [{"seed": s, "n": 4, "sleep": 0.02} for s in range(60)]
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_SCRIPT, str(store), backend],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    target = int(rng.integers(3, 40))  # kill at a random point, after `target` cells are on disk
    cells_dir = store / "k" / "cells"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if cells_dir.exists() and len(list(cells_dir.glob("*.parquet"))) >= target:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the sweep finished before it could be killed: make it longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n_done = len(list(cells_dir.glob("*.parquet")))
    assert 0 < n_done < len(cells)
    assert not (store / "k" / "results.parquet").exists()

    resumed = run_sweep(example_cell, cells, name="k", store=store, backend="serial", progress=False)
    assert resumed.attrs["n_loaded"] == n_done and resumed.attrs["n_computed"] == len(cells) - n_done
    fresh = run_sweep(example_cell, cells, name="k", backend="serial", progress=False)
    pd.testing.assert_frame_equal(resumed, fresh)
    assert not resumed.duplicated().any()
    assert len(resumed) == 4 * len(cells)


def test_keys_stable_across_processes():
    cells = [{"seed": 3, "eta": 0.1, "method": "grpo", "Ts": [1, 2, 4]}]
    here = sweep_keys(example_cell, cells, name="x")
    code = (
        "from gapdyn.evidence.sweep import sweep_keys, example_cell;"
        "print(sweep_keys(example_cell, [{'Ts': [1, 2, 4], 'method': 'grpo', 'eta': 0.1, 'seed': 3}], name='x')[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "123"},
    )
    assert out.stdout.strip() == here[0]
    # numpy scalars and tuples canonicalise to the same key; a different value, name or fn does not
    assert cell_key("x", "gapdyn.evidence.sweep.example_cell", {"seed": np.int64(3), "eta": np.float64(0.1), "method": "grpo", "Ts": (1, 2, 4)}) == here[0]
    assert sweep_keys(example_cell, [{**cells[0], "eta": 0.2}], name="x") != here
    assert sweep_keys(example_cell, cells, name="y") != here
    assert sweep_keys(run_sweep, cells, name="x") != here


def test_list_params_become_json_columns():
    df = run_sweep(example_cell, [{"seed": 1, "n": 2}], name="j", backend="serial", progress=False)
    assert df["seed"].tolist() == [1, 1]
    out = run_sweep(_rows_fn, [{"a": [1, 2], "b": None}], name="j", backend="serial", progress=False)
    assert out["a"].tolist() == ["[1,2]"] and out["value"].tolist() == [3]


def _rows_fn(a, b):
    return [{"value": sum(a)}]


def _bad_return(seed):
    return 3


def _empty_fn(seed):
    return []


def test_empty_cell_and_empty_sweep(tmp_path):
    df = run_sweep(_empty_fn, [{"seed": 0}], name="e", store=tmp_path, backend="serial", progress=False)
    assert len(df) == 0
    df = run_sweep(example_cell, [], name="e2", store=tmp_path, backend="serial", progress=False)
    assert len(df) == 0 and "cell_key" in df.columns


BAD_INPUT = [
        ({"cell_fn": lambda seed: [], "cells": [{"seed": 0}]}, "module-level"),
        ({"cells": [{"seed": 0}, {"seed": 0}]}, "distinct"),
        ({"cells": [[0]]}, "dict"),
        ({"cells": [{"seed": object()}]}, "JSON"),
        ({"cells": [{"seed": float("nan")}]}, "finite"),
        ({"cells": [{"cell_key": 1}]}, "reserved"),
        ({"cells": {"seed": 0}}, "list"),
        ({"backend": "dask"}, "backend"),
        ({"n_jobs": 0}, "n_jobs"),
        ({"name": "a/b"}, "name"),
        ({"name": ""}, "name"),
        ({"cell_fn": _bad_return, "cells": [{"seed": 0}]}, "DataFrame"),
        ({"cell_fn": 3}, "callable"),
]


def test_bad_input():
    import re

    from tests.tables import check_table

    def row(kwargs, match):
        args = {"cell_fn": example_cell, "cells": [{"seed": 0}], "name": "bad", "backend": "serial", "progress": False}
        args.update(kwargs)
        with pytest.raises(ValueError) as info:
            run_sweep(**args)
        assert re.search(match, str(info.value)), f"ValueError without {match!r}: {info.value}"

    assert check_table(((f"{sorted(kw)}: {m}", (kw, m)) for kw, m in BAD_INPUT), row) == 13


def test_canonical_cell_rejects_non_identifier_keys():
    with pytest.raises(ValueError, match="identifier"):
        canonical_cell({"a b": 1})
    with pytest.raises(ValueError, match="name"):
        CellStore("/tmp", "../x")


@pytest.mark.slow  # a local ray cluster starts in ~10-30 s; the joblib and serial backends stay in the default suite
def test_ray_backend_matches_serial(tmp_path):
    ray = pytest.importorskip("ray", reason="backend='ray' needs ray (pip install 'gapdyn[cluster]')")
    cells = _cells(6)
    ref = run_sweep(example_cell, cells, name="r", backend="serial", progress=False)
    out = run_sweep(example_cell, cells, name="r", store=tmp_path, backend="ray", n_jobs=2, progress=False)
    pd.testing.assert_frame_equal(out, ref)
    assert not ray.is_initialized()  # the sweep shut down the local instance it started
    again = run_sweep(example_cell, cells, name="r", store=tmp_path, backend="serial", progress=False)
    assert again.attrs["n_computed"] == 0
    pd.testing.assert_frame_equal(again, ref)


def test_package_reexports_resolve_lazily():
    import subprocess as sp

    code = (
        "import sys, bandits; assert 'bandits.sequence' not in sys.modules and 'torch' not in sys.modules;"
        "missing = [n for n in bandits.__all__ if getattr(bandits, n, None) is None]; print(missing);"
        "assert 'torch' not in sys.modules"
    )
    out = sp.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                 env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    import bandits

    assert bandits.simulate_sequence.__module__ == "bandits.sequence"
    with pytest.raises(AttributeError):
        bandits.no_such_name


# ---- integrity and concurrency of the store ------------------------------------------------------


def _store_bytes(store: Path, name: str) -> dict[str, bytes]:
    """Every file of a store (cells, digests, results) by its name; temporaries would show up too."""
    root = store / name
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _flip_bits_and_load(tmp_path, every_bit: bool):
    """Flip bits of a cell file (one per byte, or every bit) and every bit of its digest: load refuses each."""
    import warnings

    cells = _cells(3)
    run_sweep(example_cell, cells, name="f", store=tmp_path, backend="serial", progress=False)
    reference = _store_bytes(tmp_path, "f")
    cs = CellStore(tmp_path, "f")
    key = sweep_keys(example_cell, cells, name="f")[1]
    failures, n = [], 0
    for path, all_bits in ((cs.cell_path(key), every_bit), (cs.digest_path(key), True)):
        good = path.read_bytes()
        bits = range(8 * len(good)) if all_bits else (8 * i + i % 8 for i in range(len(good)))
        for bit in bits:
            flipped = bytearray(good)
            flipped[bit // 8] ^= 1 << (bit % 8)
            path.write_bytes(bytes(flipped))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loaded = cs.load(key)
            n += 1
            if loaded is not None or not any(issubclass(w.category, RuntimeWarning) for w in caught):
                failures.append((path.name, bit))
        path.write_bytes(good)
    assert n > 4000 and failures == []
    # one flip, then the sweep: recomputed with a warning, and the store is byte-identical again
    data = bytearray(cs.cell_path(key).read_bytes())
    data[len(data) // 3] ^= 0x10
    cs.cell_path(key).write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="checksum"):
        again = run_sweep(example_cell, cells, name="f", store=tmp_path, backend="serial", progress=False)
    assert again.attrs["n_computed"] == 1
    assert _store_bytes(tmp_path, "f") == reference


def test_single_bit_flips_are_detected_and_recomputed(tmp_path):
    """One flipped bit in every byte of a cell file (bit position rotating) and every bit of its digest."""
    _flip_bits_and_load(tmp_path, every_bit=False)


@pytest.mark.slow
def test_every_single_bit_flip_is_detected_and_recomputed(tmp_path):
    _flip_bits_and_load(tmp_path, every_bit=True)


def test_live_temporaries_survive_opening_the_store(tmp_path):
    from gapdyn.evidence import store as st

    cs = CellStore(tmp_path, "t")
    live = cs.cells_dir / f"a.parquet.tmp-{st._HOST}-{os.getpid()}-abc"  # this (live) writer's
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = cs.cells_dir / f"b.parquet.tmp-{st._HOST}-{int(dead.stdout)}-abc"  # a finished process's
    other_host = cs.cells_dir / f"c.parquet.tmp-00000000-{int(dead.stdout)}-abc"  # a writer elsewhere
    old = cs.cells_dir / f"d.parquet.tmp-00000000-1-abc"
    for p in (live, gone, other_host, old):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 2 * st.STALE_TMP_SECONDS,) * 2)
    CellStore(tmp_path, "t")
    assert sorted(p.name[0] for p in cs.cells_dir.glob("*.tmp-*")) == ["a", "c"]


_WRITER_SCRIPT = textwrap.dedent(
    """
    import sys
    from gapdyn.evidence.sweep import run_sweep, example_cell
    cells = [{"seed": s, "n": 4, "sleep": float(sys.argv[3])} for s in range(40)]
    if sys.argv[2] == "reversed":
        cells = cells[::-1]
    run_sweep(example_cell, cells, name="w", store=sys.argv[1], backend="serial", progress=False)
    """
)


def _writer(store, order, sleep=0.03):
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER_SCRIPT, str(store), order, str(sleep)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="module")
def single_writer(tmp_path_factory):
    """(store, every file's bytes) of one uninterrupted writer: the reference of the concurrency tests."""
    ref_store = tmp_path_factory.mktemp("single")
    assert _writer(ref_store, "forward").wait(timeout=300) == 0
    return ref_store, _store_bytes(ref_store, "w")


def _sorted_results(store):
    df = pd.read_parquet(store / "w" / "results.parquet")
    return df.sort_values(["cell_key", "i"]).reset_index(drop=True)


def test_two_writers_into_one_store_match_a_single_writer(tmp_path, single_writer):
    ref_store, reference = single_writer
    shared = tmp_path / "shared"
    procs = [_writer(shared, "forward"), _writer(shared, "reversed")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    got = _store_bytes(shared, "w")
    cell_files = {k: v for k, v in reference.items() if k.startswith("cells")}
    assert {k: v for k, v in got.items() if k.startswith("cells")} == cell_files  # no temporaries left
    pd.testing.assert_frame_equal(_sorted_results(shared), _sorted_results(ref_store))


@pytest.mark.parametrize("writers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_sigkill_of_writers_then_resume_is_byte_identical(tmp_path, writers, single_writer):
    """SIGKILL every writer at a random moment (with two writers, at two moments); resume; compare bytes."""
    rng = np.random.default_rng(11 + writers)
    reference = single_writer[1]
    shared = tmp_path / "shared"
    procs = [_writer(shared, order) for order in ("forward", "reversed")[:writers]]
    targets = sorted(rng.choice(np.arange(2, 30), size=writers, replace=False))
    cells_dir = shared / "w" / "cells"
    for proc, target in zip(procs, targets):  # kill after a random number of cells is on disk
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if cells_dir.exists() and len(list(cells_dir.glob("*.parquet"))) >= target:
                break
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (shared / "w" / "results.parquet").exists(), "a writer finished before it was killed"
    assert _writer(shared, "forward").wait(timeout=300) == 0
    got = _store_bytes(shared, "w")
    assert {k for k in got if ".tmp-" in k} == set()  # the dead writers' temporaries were removed
    assert got == reference
