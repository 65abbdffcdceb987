"""Run an experiment's cells (serially, over local cores, or on a Ray cluster), resumably.

``run_sweep(cell_fn, cells, name=...)`` calls ``cell_fn(**cell)`` for every cell and returns one
tidy DataFrame: the rows each call returned, plus the cell's parameters as columns and a
``cell_key`` column (bsuite-style: an experiment = environment + sweep of plain-data cells with
explicit seeds + analysis).

With ``store`` set, every completed cell is written at once (atomically) to
``<store>/<name>/cells/<cell_key>.parquet`` (see :mod:`gapdyn.evidence.store`); a rerun after an
interruption loads the completed cells and computes only the missing ones, so the final result
is exactly the uninterrupted one: nothing lost, nothing duplicated. At the end the cells are
consolidated, in the order of ``cells``, into ``<store>/<name>/results.parquet``.

Backends: ``"serial"`` (in-process), ``"joblib"`` (loky processes over local cores, the default)
and ``"ray"`` (tasks on the Ray cluster at ``ray_address`` / ``$RAY_ADDRESS``, or on a local
instance started for the sweep and shut down after it). The driver writes the results as they
arrive, so workers on a remote cluster need no access to the store.

An interrupted sweep (KeyboardInterrupt, SIGTERM through :func:`gapdyn.cmdline.command`, a cell's
exception) keeps every cell committed so far and stops its workers before the exception goes on: the
loky processes of the joblib backend are killed, a Ray instance started for the sweep is shut down.
Called from a plain script (the main thread, no SIGTERM handler set), a joblib or Ray sweep handles SIGTERM
itself for the duration of the call: it stops its workers and every other child process
(:func:`gapdyn.cmdline.stop_children`), then the process dies of the signal as it would have without the
sweep (exit status 143 in a shell); the previous handler is restored when the call returns.

Example (doctest)::

    >>> from gapdyn.evidence.sweep import run_sweep, example_cell
    >>> df = run_sweep(example_cell, [{"seed": 0, "n": 2}, {"seed": 1, "n": 2}],
    ...                name="demo", backend="serial", progress=False)
    >>> list(df.columns), len(df)
    (['i', 'x', 'seed', 'n', 'cell_key'], 4)
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, Iterator, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from tqdm.auto import tqdm

from gapdyn._validate import check_seed

from .store import CELL_KEY_COLUMN, CellStore, _config_json, canonical_cell, cell_key, concat_tables, function_name
from .store import tidy_rows

__all__ = ["run_sweep", "sweep_keys", "example_cell", "BACKENDS"]

BACKENDS = ("serial", "joblib", "ray")


def example_cell(seed: int, n: int = 3, sleep: float = 0.0) -> pd.DataFrame:
    """A toy cell for docs and tests: ``n`` rows of standard normals from ``default_rng(seed)``."""
    if sleep:
        time.sleep(sleep)
    rng = np.random.default_rng(check_seed(seed, "seed"))
    return pd.DataFrame({"i": np.arange(n), "x": rng.standard_normal(n)})


def numba_threads_cell(seed: int) -> list[dict]:
    """A toy cell reporting the numba threads it runs with (checks that sweep workers use one)."""
    import numba

    return [{"threads": numba.get_num_threads()}]


def _indexed_call(cell_fn: Callable, i: int, cell: dict):
    """Run one cell; module-level so that it pickles by reference."""
    return i, cell_fn(**cell)


def _worker_call(cell_fn: Callable, i: int, cell: dict):
    """Worker side (joblib / Ray): one numba thread per worker, the workers already fill the cores."""
    import numba

    numba.set_num_threads(1)
    return _indexed_call(cell_fn, i, cell)


def sweep_keys(cell_fn: Callable, cells: list[dict], *, name: str) -> list[str]:
    """The stable keys of ``cells`` (same in every process): see :func:`gapdyn.evidence.store.cell_key`."""
    fn_name = function_name(cell_fn)
    return [cell_key(name, fn_name, canonical_cell(c)) for c in cells]


def _check_inputs(cell_fn, cells, name, backend, n_jobs):
    fn_name = function_name(cell_fn)
    if not isinstance(name, str) or not name or any(c in name for c in "/\\") or name.startswith("."):
        raise ValueError(f"name must be a non-empty string without path separators, got {name!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs == 0 or n_jobs < -1:
        raise ValueError(f"n_jobs must be a positive integer or -1 (all cores), got {n_jobs!r}")
    if not isinstance(cells, (list, tuple)):
        raise ValueError(f"cells must be a list of dicts, got {type(cells).__name__}")
    canon = [canonical_cell(c) for c in cells]
    keys = [cell_key(name, fn_name, c) for c in canon]
    if len(set(keys)) != len(keys):
        dup = next(c for c, k in zip(canon, keys) if keys.count(k) > 1)
        raise ValueError(f"cells must be distinct (their results would be indistinguishable), duplicated: {dup}")
    return fn_name, canon, keys


@contextlib.contextmanager
def _closing(results):
    try:
        yield
    finally:
        results.close()  # an interruption: the backend stops its workers now, not at garbage collection


@contextlib.contextmanager
def _sigterm_stops_workers():
    """While a sweep with workers runs in the main thread of a process with no SIGTERM handler: SIGTERM raises
    :class:`gapdyn.cmdline.Terminated` (the workers are stopped as for any interruption), then every child
    process is stopped and the process dies of SIGTERM, as it would have without the sweep. A handler already
    set (the CLI's :func:`gapdyn.cmdline.command`, the caller's own) is left alone; the previous one is
    restored on return."""
    from gapdyn.cmdline import Terminated, _raise_terminated, stop_children

    own = (threading.current_thread() is threading.main_thread()
           and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
    if own:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except Terminated:
        if not own:
            raise
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM during the clean-up ends the process
        stop_children()
        os.kill(os.getpid(), signal.SIGTERM)
        raise  # pragma: no cover - the default action has ended the process
    finally:
        if own:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _iter_serial(cell_fn, todo) -> Iterator[tuple[int, object]]:
    for i, cell in todo:
        yield _indexed_call(cell_fn, i, cell)


def _iter_joblib(cell_fn, todo, n_jobs) -> Iterator[tuple[int, object]]:
    import warnings

    from joblib import Parallel, delayed

    # an interrupted sweep ends with its own one-line message (how to resume); joblib's note that the tasks in flight
    # were cancelled is noise there (it appears or not depending on timing)
    warnings.filterwarnings("ignore", message=r"\d+ tasks which were still being processed by the workers have "
                            r"been cancelled", category=UserWarning)
    par = Parallel(n_jobs=n_jobs, backend="loky", return_as="generator_unordered")
    finished = False
    try:
        # each task returns (i, rows) so that unordered completion can be matched to its cell
        yield from par(delayed(_worker_call)(cell_fn, i, cell) for i, cell in todo)
        finished = True
    finally:
        if not finished:  # interrupted or failed: no worker may outlive the sweep (they idle for minutes)
            _kill_loky_workers()


def _kill_loky_workers() -> None:
    """Shut the reusable loky executor down, killing its worker processes at once."""
    try:
        from joblib.externals.loky import reusable_executor

        executor = reusable_executor._executor
        if executor is not None:
            executor.shutdown(wait=True, kill_workers=True)
    except Exception:  # pragma: no cover - joblib internals moved: the workers end when their idle timeout does
        pass


def _iter_ray(cell_fn, todo, n_jobs, address) -> Iterator[tuple[int, object]]:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("backend='ray' needs ray: pip install 'gapdyn[cluster]'") from exc
    started = False
    if not ray.is_initialized():
        kwargs = {"address": address or os.environ.get("RAY_ADDRESS") or None, "include_dashboard": False}
        if kwargs["address"] is None and n_jobs > 0:
            kwargs["num_cpus"] = n_jobs
        ray.init(log_to_driver=False, **kwargs)
        started = True
    try:
        remote = ray.remote(_worker_call)
        fn_ref = ray.put(cell_fn)
        pending = [remote.remote(fn_ref, i, cell) for i, cell in todo]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        if started:
            ray.shutdown()


def run_sweep(
    cell_fn: Callable,
    cells: list[dict],
    *,
    name: str,
    store: str | os.PathLike | None = None,
    backend: Literal["serial", "joblib", "ray"] = "joblib",
    n_jobs: int = -1,
    progress: bool = True,
    ray_address: str | None = None,
) -> pd.DataFrame:
    """Run ``cell_fn(**cell)`` for every cell; return all rows with the cell params as columns.

    Args:
      cell_fn: a module-level function returning a DataFrame or a list of dicts (its qualified
        name is part of each cell's key; lambdas and local functions are rejected).
      cells: distinct dicts of JSON-serialisable keyword arguments (seeds included).
      name: the sweep's name (a directory under ``store``; part of each key).
      store: directory for the resumable parquet store; None keeps everything in memory.
      backend: "serial", "joblib" (loky, local cores) or "ray".
      n_jobs: workers for joblib / CPUs for a local Ray instance; -1 = all cores.
      progress: show a tqdm bar.
      ray_address: a Ray cluster address (default ``$RAY_ADDRESS`` or a new local instance).

    Returns:
      The rows of every cell in the order of ``cells`` (rows within a cell in the order returned),
      with one column per cell parameter (lists/dicts as canonical JSON strings) and ``cell_key``.
      ``df.attrs`` holds ``n_computed``, ``n_loaded`` and ``store_dir``.
    """
    fn_name, canon, keys = _check_inputs(cell_fn, cells, name, backend, n_jobs)
    cs = CellStore(store, name) if store is not None else None
    tables: list[pa.Table | None] = [None] * len(canon)
    if cs is not None:
        for i, key in enumerate(keys):
            tables[i] = cs.load(key)
    n_loaded = sum(t is not None for t in tables)
    todo = [(i, canon[i]) for i, t in enumerate(tables) if t is None]

    if todo:
        workers = not (backend == "serial" or (backend == "joblib" and (n_jobs == 1 or len(todo) == 1)))
        if not workers:
            results = _iter_serial(cell_fn, todo)
        elif backend == "joblib":
            results = _iter_joblib(cell_fn, todo, n_jobs)
        else:
            results = _iter_ray(cell_fn, todo, n_jobs, ray_address)
        with _sigterm_stops_workers() if workers else contextlib.nullcontext(), _closing(results):
            with tqdm(total=len(canon), initial=n_loaded, desc=name, disable=not progress, leave=False) as bar:
                for i, rows in results:
                    table = tidy_rows(rows, canon[i], keys[i])
                    if cs is not None:
                        # save returns the table parsed from the bytes written: a resumed cell's round trip
                        table = cs.save(keys[i], _config_json(name, fn_name, canon[i]), table)
                    tables[i] = table
                    bar.update(1)

    full = cs.consolidate(tables) if cs is not None else concat_tables(tables)
    df = full.to_pandas() if full.num_columns else pd.DataFrame(columns=[CELL_KEY_COLUMN])
    df.attrs.update(n_computed=len(todo), n_loaded=n_loaded, store_dir=str(cs.dir) if cs else None)
    return df
