"""Output files of every command: atomic, never through a planted symlink, and one error naming the file.

A write goes to a temporary file in the target's folder (``<name>.tmp-<host>-<pid>-<random>``, created with
``O_EXCL | O_NOFOLLOW``), is fsynced, renamed over the target with ``os.replace`` and the folder is fsynced: a
reader sees the old file or the new one, never a part, and a failing write (a full disk, an I/O error, data the
format cannot hold) leaves the old file as it was and no temporary.

Errors (exit codes of the command line, README "Command line"):

- :class:`WriteError` (an ``OSError``): the write itself failed; the message names the file. Exit 1.
- :class:`OutputPathError` (a ``ValueError``): the target is a symlink (or a folder between ``root`` and
  it is), an existing folder, or its parent is not a folder; nothing is written. Exit 2.

Standard library only at import time; pyarrow / pandas are imported by :func:`write_parquet` when called.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import uuid
from pathlib import Path
from typing import Any, Callable

__all__ = ["WriteError", "OutputPathError", "TMP_RE", "HOST", "temp_path", "check_output_path", "write_with",
           "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "write_parquet", "WRITE_FAILURE_ERRNOS"]

HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This host, as it appears in temporary names (a hash: no host name on disk)."""
TMP_RE = re.compile(r"\.tmp-([0-9a-f]{8})-(\d+)-[0-9a-f]+$")
"""Suffix of a temporary written by :func:`write_with`: (host, pid)."""
WRITE_FAILURE_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EIO, errno.EFBIG)
                                 if e is not None)
"""errno values of an OSError that mean the write failed on a valid path (exit 1, not a bad setting)."""


class WriteError(OSError):
    """Writing a file failed (full disk, I/O error, data the format refuses); the message names the file.
    ``WriteError(errno or None, message, filename)``; ``str()`` is the message."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class OutputPathError(ValueError):
    """An output path that must not be written: a symlink, an existing folder, a parent that is no folder."""


def temp_path(path: str | os.PathLike) -> Path:
    """A fresh temporary name beside ``path``: ``<name>.tmp-<host>-<pid>-<12 hex>``."""
    path = Path(path)
    return path.with_name(f"{path.name}.tmp-{HOST}-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def check_output_path(path: str | os.PathLike, *, root: str | os.PathLike | None = None) -> Path:
    """``path`` when it may be written: not a symlink, not a folder, its parent a folder (or absent), and no
    folder strictly below ``root`` on the way to it a symlink (``root`` itself is the user's choice); an
    :class:`OutputPathError` naming the path otherwise."""
    path = Path(path)
    if path.is_symlink():
        raise OutputPathError(f"refusing to write {path}: it is a symbolic link (to {os.readlink(path)!r}) that "
                              f"this command did not create; remove it")
    if path.is_dir():
        raise OutputPathError(f"cannot write {path}: it is an existing folder")
    if path.parent.exists() and not path.parent.is_dir():
        raise OutputPathError(f"cannot write {path}: {path.parent} is not a folder")
    if root is not None:
        root = Path(root)
        try:
            rel = path.parent.relative_to(root)
        except ValueError:
            rel = None
        if rel is not None:
            d = root
            for part in rel.parts:
                d = d / part
                if d.is_symlink():
                    raise OutputPathError(f"refusing to write {path}: the folder {d} is a symbolic link (to "
                                          f"{os.readlink(d)!r}) that this command did not create; remove it")
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # folders cannot be opened on some platforms
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def write_with(path: str | os.PathLike, write: Callable[[Path], Any], *, root: str | os.PathLike | None = None,
               what: str = "") -> Path:
    """Atomically create ``path`` from ``write(tmp)``, a function that writes the whole file at ``tmp`` (a path
    already created, empty, in the same folder): fsync, ``os.replace``, fsync of the folder. Any exception of
    the writer or of the file system becomes a :class:`WriteError` naming ``path`` (``what`` says what it is);
    the temporary is removed and the old ``path`` is unchanged. Refusals: :func:`check_output_path`."""
    path = check_output_path(path, root=root)
    tmp = temp_path(path)
    label = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
        os.close(fd)
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except Exception as exc:  # OSError, safetensors' SafetensorError, pyarrow's errors, JSON's TypeError ...
        err = exc.errno if isinstance(exc, OSError) else None
        raise WriteError(err, f"cannot write {label}: {_reason(exc)}", str(path)) from exc
    finally:
        try:
            tmp.unlink()
        except OSError:  # gone after the rename, or never created
            pass
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, root: str | os.PathLike | None = None,
                       what: str = "") -> Path:
    """Write ``data`` to ``path`` atomically (:func:`write_with`)."""
    data = bytes(data)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()

    return write_with(path, write, root=root, what=what)


def atomic_write_text(path: str | os.PathLike, text: str, *, root: str | os.PathLike | None = None,
                      what: str = "") -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically."""
    try:
        data = text.encode("utf-8")
    except (AttributeError, UnicodeEncodeError) as exc:
        raise WriteError(None, f"cannot write {path}: {_reason(exc)}", str(path)) from exc
    return atomic_write_bytes(path, data, root=root, what=what)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, root: str | os.PathLike | None = None, what: str = "",
                      **dumps) -> Path:
    """``json.dumps(obj, **dumps)`` + newline to ``path`` atomically; an object JSON cannot hold (a set, a
    circular list, NaN with ``allow_nan=False``) is a :class:`WriteError` naming the file, nothing written."""
    try:
        text = json.dumps(obj, **dumps) + "\n"
    except (TypeError, ValueError, RecursionError) as exc:
        raise WriteError(None, f"cannot write {path}: {_reason(exc)}", str(path)) from exc
    return atomic_write_text(path, text, root=root, what=what)


def write_parquet(path: str | os.PathLike, data, *, root: str | os.PathLike | None = None, what: str = "",
                  index: bool | None = False) -> Path:
    """A pandas DataFrame (``index`` as in ``to_parquet``) or a pyarrow Table to ``path`` atomically; pyarrow's
    errors (a column of mixed types, a full disk) become a :class:`WriteError` naming the file."""

    def write(tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=index)
        pq.write_table(table, str(tmp))

    return write_with(path, write, root=root, what=what)
