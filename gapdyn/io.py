"""Output files of every command: atomic, never through a planted symlink, and one error naming the file.

A write goes to a temporary file in the target's folder (``<name>.tmp-<host>-<pid>-<random>``, created with
``O_EXCL | O_NOFOLLOW``), is fsynced, renamed over the target with ``os.replace`` and the folder is fsynced: a
reader sees the old file or the new one, never a part, and a failing write (a full disk, an I/O error, data the
format cannot hold) leaves the old file as it was and no temporary.

Errors (exit codes of the command line, README "Command line"):

- :class:`WriteError` (an ``OSError``): the write itself failed; the message names the file. Exit 1.
- :class:`OutputPathError` (a ``ValueError``): the target is a symlink (or a folder between ``root`` and
  it is), an existing folder, or its parent is not a folder; nothing is written. Exit 2.

A file that already holds exactly what would be written is left alone (no temporary, no rename): rerunning a
finished command rewrites nothing, so it also succeeds on a read-only copy. Output folders are made by
:func:`make_folder` (a read-only or full file system: :class:`WriteError` naming the folder; a file in the
way: :class:`OutputPathError`); :func:`output_folder` also removes the folders it made when the block fails,
so a refusal leaves no empty folder; :func:`check_writable_folder` tries a write before the work starts.

Standard library only at import time; pyarrow / pandas are imported by :func:`write_parquet` when called.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import socket
import uuid
from pathlib import Path
from typing import Any, Callable

__all__ = ["WriteError", "OutputPathError", "TMP_RE", "HOST", "temp_path", "check_output_path", "write_with", "commit_with",
           "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "write_parquet", "WRITE_FAILURE_ERRNOS",
           "make_folder", "output_folder", "check_writable_folder", "hold_lock"]

HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This host, as it appears in temporary names (a hash: no host name on disk)."""
TMP_RE = re.compile(r"\.tmp-([0-9a-f]{8})-(\d+)-[0-9a-f]+$")
"""Suffix of a temporary written by :func:`write_with`: (host, pid)."""
WRITE_FAILURE_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EIO, errno.EFBIG,
                                             errno.EROFS) if e is not None)
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
    the temporary is removed and the old ``path`` is unchanged. Refusals: :func:`check_output_path`. When
    ``path`` exists, ``write`` writes to a private temporary folder first, and identical bytes are not
    written again."""
    path = check_output_path(path, root=root)
    label = f"{what} {path}" if what else str(path)
    if path.is_file():  # written before: write aside first, and leave the file alone when it is the same
        data = _written_aside(path, write, label)
        if data is not None:
            return atomic_write_bytes(path, data, root=root, what=what)
    return _commit(path, write, label)


def commit_with(path: str | os.PathLike, write: Callable[[Path], Any], *, root: str | os.PathLike | None = None,
                what: str = "") -> Path:
    """:func:`write_with` without the comparison with the file already there: ``write(tmp)``, fsync, ``os.replace``,
    fsync of the folder, every time (for large files that are new by construction, such as a checkpoint; the
    writer may do more before the rename, e.g. record a digest of ``tmp``). Errors as :func:`write_with`."""
    path = check_output_path(path, root=root)
    return _commit(path, write, f"{what} {path}" if what else str(path))


def _commit(path: Path, write: Callable[[Path], Any], label: str) -> Path:
    """The atomic write itself (module doc): temporary, ``write``, fsync, ``os.replace``, fsync of the folder."""
    tmp = temp_path(path)
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


def _written_aside(path: Path, write: Callable[[Path], Any], label: str) -> bytes | None:
    """The bytes ``write`` produces, written in a private temporary folder (None when none can be made)."""
    import tempfile

    try:
        scratch_dir = tempfile.mkdtemp(prefix="gapdyn-write-")
    except OSError:
        return None
    scratch = Path(scratch_dir) / temp_path(path).name
    try:
        scratch.touch()
        write(scratch)
        return scratch.read_bytes()
    except Exception as exc:
        err = exc.errno if isinstance(exc, OSError) else None
        raise WriteError(err, f"cannot write {label}: {_reason(exc)}", str(path)) from exc
    finally:
        import shutil

        shutil.rmtree(scratch_dir, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, root: str | os.PathLike | None = None,
                       what: str = "") -> Path:
    """Write ``data`` to ``path`` atomically (:func:`write_with`); nothing when ``path`` already holds ``data``."""
    data = bytes(data)
    path = check_output_path(path, root=root)
    if _holds(path, lambda p: p.stat().st_size == len(data) and p.read_bytes() == data, root):
        return path

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()

    return _commit(path, write, f"{what} {path}" if what else str(path))


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
    errors (a column of mixed types, a full disk) become a :class:`WriteError` naming the file. Nothing is written
    when ``path`` already holds an equal table: values, schema and metadata, except pandas' ``attributes`` (a
    DataFrame's ``attrs``: how this call came by the rows, e.g. a sweep's cells computed vs loaded)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=index)
    except Exception as exc:
        raise WriteError(None, f"cannot write {path}: {_reason(exc)}", str(path)) from exc

    def same(p: Path) -> bool:
        old = pq.read_table(str(p))
        return old.equals(table) and _metadata_sans_attrs(old.schema) == _metadata_sans_attrs(table.schema)

    if _holds(path, same, root):
        return Path(path)

    def write(tmp: Path) -> None:
        pq.write_table(table, str(tmp))

    path = check_output_path(path, root=root)
    return _commit(path, write, f"{what} {path}" if what else str(path))


def _metadata_sans_attrs(schema) -> dict:
    """A schema's key-value metadata with pandas' ``attributes`` entry (``DataFrame.attrs``) left out."""
    meta = dict(schema.metadata or {})
    if b"pandas" in meta:
        pandas_meta = json.loads(meta[b"pandas"])
        pandas_meta.pop("attributes", None)
        meta[b"pandas"] = json.dumps(pandas_meta, sort_keys=True).encode()
    return meta


def _holds(path, same: Callable[[Path], bool], root) -> bool:
    """Whether ``path`` is a writable target (:func:`check_output_path`) that already holds the content
    ``same`` recognises; any error reading it means no (the write then goes ahead and reports its own)."""
    path = check_output_path(path, root=root)
    try:
        return path.is_file() and bool(same(path))
    except Exception:
        return False


def _first_existing(path: Path, what: str) -> Path | None:
    """The deepest existing one of ``path`` and its parents; an :class:`OutputPathError` when it is not a folder."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise OutputPathError(f"{what} must be a folder, but {p} is an existing file")
            return p
    return None


def make_folder(path: str | os.PathLike, *, what: str = "output folder") -> Path:
    """``mkdir -p path``; an :class:`OutputPathError` naming ``what`` when ``path`` or a parent is an existing
    file, a :class:`WriteError` naming the folder when the file system refuses it (read-only, full, denied)."""
    path = Path(path)
    _first_existing(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise OutputPathError(f"{what} must be a folder, but {exc.filename or path} is not one") from None
    except OSError as exc:
        raise WriteError(exc.errno, f"cannot create {what} {path}: {_reason(exc)}", str(path)) from None
    return path


def check_writable_folder(path: str | os.PathLike, *, what: str = "output folder") -> Path:
    """Create and remove a temporary in the existing folder ``path``: a :class:`WriteError` naming the folder
    when that fails (a read-only file system, no permission, a full disk), before any work is done."""
    path = Path(path)
    tmp = temp_path(path / ".write-check")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
        os.close(fd)
    except OSError as exc:
        raise WriteError(exc.errno, f"cannot write in {what} {path}: {_reason(exc)}", str(path)) from None
    try:
        tmp.unlink()
    except OSError:
        pass
    return path


@contextlib.contextmanager
def hold_lock(path: str | os.PathLike, *, wait: bool = True):
    """An exclusive advisory lock, ``flock``, on the file ``path`` (created if missing) for the block; yields True
    while this process holds it. ``wait=False``: yields False at once when another process holds it. The OS releases
    the lock however the process ends. Where ``fcntl`` is missing (not POSIX) it yields True without locking."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield True
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:  # another process holds it
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def output_folder(path: str | os.PathLike, *, what: str = "output folder", writable: bool = True):
    """:func:`make_folder` (and :func:`check_writable_folder` when ``writable``) for the block; when the block
    raises, the folders this call created are removed again if they are still empty (deepest first), so a
    refused command leaves no empty output folder. Folders that existed before are never removed."""
    path = Path(path)
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        make_folder(path, what=what)
        if writable:
            check_writable_folder(path, what=what)
        yield path
    except BaseException:
        for p in made:
            try:
                p.rmdir()  # only an empty folder goes
            except OSError:
                break
        raise
