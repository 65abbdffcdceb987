"""A resumable columnar result store for sweeps: one parquet file per completed cell.

Layout under ``<store>/<name>/``::

    cells/<cell_key>.parquet   one file per completed cell (written to a temp file, then os.replace)
    results.parquet            the consolidation of all cells, in the sweep's cell order (atomic too)

A cell's key is a stable hash of its configuration (:func:`cell_key`): the experiment name, the
cell function's qualified name and the cell's parameters, serialised as canonical JSON (sorted
keys, ``repr`` of floats), so the same configuration gives the same key in every process and on
every machine. Note that ``1`` and ``1.0`` are different parameters (different keys).

Each cell file carries its key and configuration in the parquet schema metadata. A file that
cannot be read, or whose metadata does not match its name, counts as missing: the sweep recomputes
it (a write interrupted by a crash leaves only an orphan ``*.tmp-*`` file, which is ignored and
cleaned up).
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

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


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


class CellStore:
    """The on-disk store of one sweep: ``<root>/<name>/cells/*.parquet`` + ``results.parquet``."""

    def __init__(self, root: str | os.PathLike, name: str):
        if not isinstance(name, str) or not name or any(c in name for c in "/\\") or name.startswith("."):
            raise ValueError(f"name must be a non-empty string without path separators, got {name!r}")
        self.dir = Path(root) / name
        self.cells_dir = self.dir / "cells"
        self.cells_dir.mkdir(parents=True, exist_ok=True)
        for orphan in self.cells_dir.glob("*.tmp-*"):  # a write killed before its os.replace
            orphan.unlink(missing_ok=True)

    @property
    def results_path(self) -> Path:
        return self.dir / "results.parquet"

    def cell_path(self, key: str) -> Path:
        return self.cells_dir / f"{key}.parquet"

    def load(self, key: str) -> pa.Table | None:
        """The stored table of a cell, or None if absent; a corrupt/mismatched file is deleted."""
        path = self.cell_path(key)
        if not path.exists():
            return None
        try:
            table = pq.read_table(path)
            meta = table.schema.metadata or {}
            if meta.get(_META_KEY, b"").decode() != key:
                raise ValueError("cell key in metadata does not match the file name")
        except Exception:  # unreadable, truncated, or someone else's file: recompute
            path.unlink(missing_ok=True)
            return None
        return table.replace_schema_metadata({k: v for k, v in meta.items() if k not in (_META_KEY, _META_CONFIG)})

    def save(self, key: str, config: str, table: pa.Table) -> None:
        """Write one cell's table atomically, with its key and configuration in the metadata."""
        meta = dict(table.schema.metadata or {})
        meta.update({_META_KEY: key.encode(), _META_CONFIG: config.encode()})
        _atomic_write_table(table.replace_schema_metadata(meta), self.cell_path(key))

    def consolidate(self, tables: Iterable[pa.Table]) -> pa.Table:
        """Concatenate the given tables (in order) into ``results.parquet``, atomically."""
        table = concat_tables(list(tables))
        _atomic_write_table(table, self.results_path)
        return table


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
