"""Table-driven checks: one test item runs every row and reports every failing row at once.

``check_table(rows, check)`` calls ``check(*row)`` for each ``(row_id, row)`` and collects the
failures (assertion or exception) with their row id, so a table of hundreds of cases is one
collected test whose failure message still names each failing case.
"""

from __future__ import annotations

import traceback
from typing import Any, Callable, Iterable

import pytest


def check_table(rows: Iterable[tuple[str, Any]], check: Callable[..., None], *, star: bool = True) -> int:
    """Run ``check`` on every row; fail once, listing every failing row id and its error."""
    failures, n = [], 0
    for row_id, row in rows:
        n += 1
        try:
            check(*row) if star else check(row)
        except (Exception, pytest.fail.Exception) as exc:  # noqa: BLE001 - collected and reported below
            frames = traceback.extract_tb(exc.__traceback__)
            ours = [f for f in frames if "/tests/" in f.filename.replace("\\", "/")] or frames
            failures.append(f"{row_id}: {type(exc).__name__}: {exc} ({ours[-1].filename.rsplit('/', 1)[-1]}:{ours[-1].lineno})")
    assert n > 0, "empty table"
    if failures:
        pytest.fail(f"{len(failures)} of {n} rows failed:\n" + "\n".join(failures), pytrace=False)
    return n


def raises_value_error(fn: Callable[[], Any], match: str | None = None) -> None:
    """Assert that ``fn()`` raises a ValueError (whose message contains ``match``, if given)."""
    try:
        fn()
    except ValueError as exc:
        if match is not None and match.lower() not in str(exc).lower():
            raise AssertionError(f"ValueError without {match!r}: {exc}") from None
        return
    raise AssertionError("no ValueError raised")
