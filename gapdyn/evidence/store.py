"""A resumable columnar result store for sweeps: one parquet file per completed cell.

Layout under ``<store>/<name>/``::

    cells/<cell_key>.parquet   one file per completed cell (written to a temp file, then os.replace)
    results.parquet            the consolidation of all cells, in the sweep's cell order (atomic too; not
                               rewritten when it already holds the same bytes: a finished store is only read)

Every file is written by :mod:`gapdyn.io` (temporary, fsync, ``os.replace``, fsync of the folder), never
through a symlink below the store's root (:class:`gapdyn.io.OutputPathError`); a failing write (full disk)
is a :class:`gapdyn.io.WriteError` naming the file and leaves the cells already committed as they were.

A cell's key is a stable hash of its configuration (:func:`cell_key`): the experiment name, the
cell function's qualified name and the cell's parameters, serialised as canonical JSON (sorted
keys, ``repr`` of floats), so the same configuration gives the same key in every process and on
every machine. Note that ``1`` and ``1.0`` are different parameters (different keys).

Each cell file carries its key and configuration in the parquet schema metadata, and a sidecar
``cells/<cell_key>.sha256`` holds the sha256 of the parquet file's bytes. The digest is checked
before the bytes are parsed; a file whose digest, key or parquet structure does not check out
counts as missing and is recomputed (with a :class:`RuntimeWarning`), so a flipped bit is never
reused as a different number. The sidecar is replaced before the cell file, so a reader sees
either no cell or a cell with its digest.

Several writers (processes, machines on a shared disk) may fill one store at once: each writes
its temporaries as ``<file>.tmp-<host>-<pid>-<random>`` and opening a store removes only the
temporaries of dead writers on this host, or ones older than :data:`STALE_TMP_SECONDS`. Cells are
deterministic functions of their parameters, so concurrent writers write identical bytes and the
store ends up the same as after one writer.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gapdyn.io import HOST as _HOST, TMP_RE as _TMP_RE, atomic_write_bytes, make_folder

__all__ = [
    "CELL_KEY_COLUMN",
    "canonical_cell",
    "function_name",
    "cell_key",
    "CellStore",
]

CELL_KEY_COLUMN = "cell_key"
_META_KEY = b"gapdyn.cell_key"
_META_CONFIG = b"gapdyn.cell_config"
STALE_TMP_SECONDS = 3600.0  # a temporary lives for one write; one this old belongs to no live writer


def _plain(value: Any, where: str) -> Any:
    """Convert numpy scalars/arrays and tuples to JSON-native values; ValueError otherwise."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return None if value is None else bool(value)
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"cell parameter {where} must be finite, got {value!r}")
        return v
    if isinstance(value, np.ndarray):
        return [_plain(v, where) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"cell parameter {where} must have string keys")
        return {k: _plain(v, f"{where}.{k}") for k, v in value.items()}
    raise ValueError(
        f"cell parameter {where} must be JSON-serialisable (None, bool, int, float, str, list, dict), "
        f"got {type(value).__name__}"
    )


def canonical_cell(cell: Any) -> dict:
    """A cell as a dict of JSON-native values (ValueError for non-dicts or unserialisable values)."""
    if not isinstance(cell, dict):
        raise ValueError(f"each cell must be a dict of keyword arguments, got {type(cell).__name__}")
    for k in cell:
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"cell keys must be identifier strings (keyword arguments), got {k!r}")
        if k == CELL_KEY_COLUMN:
            raise ValueError(f"{CELL_KEY_COLUMN!r} is reserved and cannot be a cell parameter")
    return {k: _plain(v, k) for k, v in cell.items()}


def function_name(fn: Callable) -> str:
    """``module.qualname`` of a module-level function (ValueError for lambdas and local functions)."""
    if not callable(fn):
        raise ValueError(f"cell_fn must be callable, got {type(fn).__name__}")
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qual or "<lambda>" in qual or "<locals>" in qual:
        raise ValueError(
            f"cell_fn must be a module-level function (its qualified name keys the results), got {fn!r}"
        )
    return f"{module}.{qual}"


def _config_json(name: str, fn_name: str, cell: dict) -> str:
    return json.dumps({"name": name, "fn": fn_name, "cell": cell}, sort_keys=True, separators=(",", ":"))


def cell_key(name: str, fn_name: str, cell: dict) -> str:
    """sha256 (first 20 hex digits) of the canonical JSON of (name, cell_fn name, cell params)."""
    return hashlib.sha256(_config_json(name, fn_name, canonical_cell(cell)).encode()).hexdigest()[:20]


def _column_value(v: Any) -> Any:
    """Scalars go into columns as they are; lists/dicts as their canonical JSON string."""
    return json.dumps(v, sort_keys=True, separators=(",", ":")) if isinstance(v, (list, dict)) else v


def tidy_rows(rows: Any, cell: dict, key: str) -> pa.Table:
    """A cell function's output (DataFrame or list of dicts) + the cell params + ``cell_key`` as a table.

    Params are added as columns unless the function already returned a column of that name.
    """
    if isinstance(rows, pd.DataFrame):
        df = rows.reset_index(drop=True).copy()
    elif isinstance(rows, (list, tuple)) and all(isinstance(r, dict) for r in rows):
        df = pd.DataFrame(list(rows))
    else:
        raise ValueError(f"cell_fn must return a pandas DataFrame or a list of dicts, got {type(rows).__name__}")
    df.columns = [str(c) for c in df.columns]
    for k, v in cell.items():
        if k not in df.columns:
            df[k] = pd.Series([_column_value(v)] * len(df), dtype=object if v is None else None)
    df[CELL_KEY_COLUMN] = pd.Series([key] * len(df), dtype=object)
    return pa.Table.from_pandas(df, preserve_index=False)


def _table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _atomic_write_bytes(data: bytes, path: Path, root: Path | None = None) -> None:
    """Write ``data`` to a per-writer temporary, fsync it, then ``os.replace`` it onto ``path``
    (:func:`gapdyn.io.atomic_write_bytes`; no symlink between ``root`` and ``path``)."""
    atomic_write_bytes(path, data, root=root)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _is_stale_tmp(path: Path, now: float) -> bool:
    """A temporary no live writer owns: a dead pid on this host, an unknown name, or an old file."""
    try:
        age = now - path.stat().st_mtime
    except FileNotFoundError:
        return False
    if age > STALE_TMP_SECONDS:
        return True
    m = _TMP_RE.search(path.name)
    if m is None:  # not written by this module's writers (e.g. a foreign or legacy leftover)
        return True
    host, pid = m.group(1), int(m.group(2))
    return host == _HOST and pid != os.getpid() and not _pid_alive(pid)


class CellStore:
    """The on-disk store of one sweep: ``<root>/<name>/cells/*.parquet`` + ``results.parquet``."""

    def __init__(self, root: str | os.PathLike, name: str):
        if not isinstance(name, str) or not name or any(c in name for c in "/\\") or name.startswith("."):
            raise ValueError(f"name must be a non-empty string without path separators, got {name!r}")
        self.root = Path(root)
        self.dir = self.root / name
        self.cells_dir = self.dir / "cells"
        make_folder(self.cells_dir, what="result store folder")  # read-only, full: WriteError naming it
        now = time.time()
        for tmp in [*self.cells_dir.glob("*.tmp-*"), *self.dir.glob("*.tmp-*")]:
            if _is_stale_tmp(tmp, now):  # a write killed before its os.replace
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:  # a read-only store: the leftover stays, and is never read as a cell
                    pass

    @property
    def results_path(self) -> Path:
        return self.dir / "results.parquet"

    def cell_path(self, key: str) -> Path:
        return self.cells_dir / f"{key}.parquet"

    def digest_path(self, key: str) -> Path:
        return self.cells_dir / f"{key}.sha256"

    def load(self, key: str) -> pa.Table | None:
        """The stored table of a cell, or None if absent or corrupt (then with a RuntimeWarning).

        Corrupt: the sha256 of the file's bytes differs from its sidecar (or the sidecar is
        missing), the parquet cannot be parsed, or the key in its metadata is not ``key``. The
        file is left in place; recomputing the cell overwrites it.
        """
        path = self.cell_path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            digest = self.digest_path(key).read_bytes()
        except FileNotFoundError:
            digest = None
        if digest != _digest_line(data):  # byte-exact: no whitespace tolerance
            warnings.warn(f"cell {key}: checksum mismatch in {path}; recomputing the cell", RuntimeWarning, 2)
            return None
        try:
            table = _read_cell(data, key)
        except Exception as exc:  # a valid digest of an invalid file (written by someone else)
            warnings.warn(f"cell {key}: unreadable ({exc}); recomputing the cell", RuntimeWarning, 2)
            return None
        return table

    def save(self, key: str, config: str, table: pa.Table) -> pa.Table:
        """Write one cell's table atomically (digest first, then the file); return it as stored.

        The returned table is parsed from the bytes written, exactly as :meth:`load` returns it.
        """
        meta = dict(table.schema.metadata or {})
        meta.update({_META_KEY: key.encode(), _META_CONFIG: config.encode()})
        data = _table_bytes(table.replace_schema_metadata(meta))
        _atomic_write_bytes(_digest_line(data), self.digest_path(key), self.root)
        _atomic_write_bytes(data, self.cell_path(key), self.root)
        return _read_cell(data, key)

    def consolidate(self, tables: Iterable[pa.Table]) -> pa.Table:
        """Concatenate the given tables (in order) into ``results.parquet``, atomically; a finished store whose
        ``results.parquet`` already holds these bytes is not rewritten (it may be read-only)."""
        table = concat_tables(list(tables))
        _atomic_write_bytes(_table_bytes(table), self.results_path, self.root)
        return table


def _digest_line(data: bytes) -> bytes:
    return hashlib.sha256(data).hexdigest().encode("ascii") + b"\n"


def _read_cell(data: bytes, key: str) -> pa.Table:
    """Parse a cell file's bytes; ValueError if its metadata names another cell."""
    table = pq.read_table(pa.BufferReader(data))
    meta = table.schema.metadata or {}
    if meta.get(_META_KEY, b"").decode() != key:
        raise ValueError("cell key in metadata does not match the file name")
    return table.replace_schema_metadata({k: v for k, v in meta.items() if k not in (_META_KEY, _META_CONFIG)})


def concat_tables(tables: list[pa.Table]) -> pa.Table:
    """Concatenate tables whose schemas may differ (missing columns become null, types promoted)."""
    if not tables:
        return pa.table({})
    tables = [t.replace_schema_metadata(None) for t in tables]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        df = pd.concat([t.to_pandas() for t in tables], ignore_index=True)
        return pa.Table.from_pandas(df, preserve_index=False)
