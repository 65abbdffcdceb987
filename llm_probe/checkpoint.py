"""Checkpoint and log files of a training run: what a resume reads, and how a kill can never corrupt it.

A checkpoint is one safetensors file: every tensor (weights, optimizer moments, torch RNG states, probe
sums) as a tensor, everything else (step, numpy RNG state, detector state, configuration, committed log
sizes) as JSON in the file's metadata. Nothing is unpickled, so a planted file cannot run code; a file
that is not a whole checkpoint of this format is a ValueError naming the file and what is wrong.
Writes are atomic, through the project's one writer (gapdyn.io): a temporary file in the same folder, fsync,
rename, fsync of the folder.

The JSONL logs are append-only between checkpoints (:class:`AppendLog`). Each checkpoint records the
committed size (bytes and rows) of every log after an fsync; a resume first cuts each log back to that
size by writing the kept prefix to a temporary file and renaming it over the log, so a kill at any moment
(during training or during the resume itself) leaves every log with each step exactly once.

A resume must continue the same run: the fields marked "trajectory" in :data:`RESUME_POLICY` have to equal
the checkpoint's, unless the caller forces it (``resume_force``).

Each checkpoint carries a digest, ``checkpoint.sha256`` beside it: sha256 of the safetensors file's bytes and
of its state as canonical JSON (sorted keys), sealed by a sha256 of the record itself. It is written last;
just before the checkpoint's rename, the same record goes to ``checkpoint.sha256.next``, so a kill between the
two renames leaves a new checkpoint that its pending digest still vouches for. :func:`read_checkpoint` refuses
a file that neither digest matches (a flipped bit, an edit) and one that has no digest at all (written before
digests existed), with a :class:`CheckpointError` naming the file; then, whatever the digest says, one whose
floating tensors (weights, optimizer moments, probe sums) hold a NaN or an infinity, naming the tensor.

One process writes a run folder at a time: :func:`lock_run_folder` holds an advisory ``flock`` on
``train.lock`` there (POSIX only), which the OS releases when the process ends, however it ends; the file is
removed while still locked when the run ends (a killed run leaves it, unlocked, for the next run to remove).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from dataclasses import MISSING, fields
from pathlib import Path

import torch

from gapdyn.io import atomic_write_bytes, commit_with

__all__ = ["CHECKPOINT_NAME", "LEGACY_NAME", "LOCK_NAME", "FORMAT", "DIGEST_FORMAT", "RESUME_POLICY", "CheckpointError",
           "RunFolderLockedError", "config_differences", "write_checkpoint", "read_checkpoint", "verify_checkpoint",
           "digest_path", "state_sha256", "remove_checkpoint", "lock_run_folder", "first_nonfinite",
           "first_nonfinite_tensor", "split_optimizer_state", "join_optimizer_state", "AppendLog"]

CHECKPOINT_NAME = "checkpoint.safetensors"
LEGACY_NAME = "checkpoint.pt"
LOCK_NAME = "train.lock"
FORMAT = "gapdyn-llm-checkpoint/1"
DIGEST_FORMAT = "gapdyn-llm-checkpoint-digest/1"


class CheckpointError(ValueError):
    """A checkpoint that must not be resumed: it fails its digest, has none, or contradicts its run's logs."""


class RunFolderLockedError(OSError):
    """Another process holds the run folder's lock (it is writing that folder)."""

# TrainConfig field -> "trajectory": must equal the checkpoint's on resume (it defines the run the metrics
# describe); "control": how the run is driven, may change between the legs of one run.
# A field missing here counts as "trajectory".
RESUME_POLICY: dict[str, str] = {
    "method": "trajectory",
    "seed": "trajectory",
    "prompts_per_step": "trajectory",
    "group_size": "trajectory",
    "num_iterations": "trajectory",
    "max_new_tokens": "trajectory",
    "temperature": "trajectory",
    "optimizer": "trajectory",
    "lr": "trajectory",
    "weight_decay": "trajectory",
    "max_grad_norm": "trajectory",
    "eps_low": "trajectory",
    "eps_high": "trajectory",
    "task": "trajectory",
    "init_from": "trajectory",
    "arch": "trajectory",
    "warmup_steps": "trajectory",
    "warmup_batch": "trajectory",
    "warmup_lr": "trajectory",
    "dtype": "trajectory",
    "truncate_prompts": "trajectory",  # changes the prompts the policy sees
    "probe_every": "trajectory",  # M sums over probed steps: another cadence is another M
    "probe_params": "trajectory",
    "probe_alignment": "trajectory",
    "probe_prompts": "trajectory",
    "probe_group_size": "trajectory",
    "headroom_every": "control",  # which probe steps log gap/headroom: no sum or training state depends on it
    "warn_forward_every": "control",  # which probe steps log the warn/* statistics at theta_{k+1}: likewise
    "collapse": "trajectory",  # the alert rule whose state the checkpoint carries
    "out_dir": "control",  # the same folder, however it is spelled
    "steps": "control",  # extend or shorten a run
    "checkpoint_every": "control",
    "resume": "control",
    "resume_force": "control",
    "stop_on_alert": "control",
    "max_faults": "control",
    "num_threads": "control",
    "device": "control",
    "progress": "control",
    "safe_step": "trajectory",  # rescales every update (llm_probe.safe_step)
    "safe_step_c": "trajectory",
    "safe_step_delta": "trajectory",
    "lr_warmup_steps": "trajectory",  # the lr of every early step
    "shuffle_rewards": "trajectory",  # the random-advantage control: other advantages, another run
}


def config_differences(saved: dict, cfg) -> list[str]:
    """'field: saved -> now' for each "trajectory" field of the dataclass ``cfg`` that differs from ``saved``
    (a field absent from ``saved`` is compared with the value it had by default)."""
    out = []
    for f in fields(cfg):
        if RESUME_POLICY.get(f.name, "trajectory") != "trajectory":
            continue
        now = _plain(getattr(cfg, f.name))
        if f.name in saved:
            was = saved[f.name]
        else:
            was = _plain(f.default if f.default is not MISSING else f.default_factory())  # type: ignore[misc]
        if json.dumps(was, sort_keys=True) != json.dumps(now, sort_keys=True):
            out.append(f"{f.name}: {was!r} -> {now!r}")
    return out


def _plain(v):
    """A dataclass value as JSON data (nested dataclasses as dicts, tuples as lists)."""
    from dataclasses import asdict, is_dataclass

    if is_dataclass(v):
        v = asdict(v)
    return json.loads(json.dumps(v))


# ---- atomic files ----------------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_failed(path: Path, exc: BaseException, what: str = ""):
    """A :class:`gapdyn.io.WriteError` naming ``path`` for the exception of a failed write."""
    from gapdyn.io import WriteError

    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    return WriteError(exc.errno if isinstance(exc, OSError) else None,
                      " ".join(f"cannot write {what}{path}: {why}".split()), str(path))


# ---- the checkpoint file -----------------------------------------------------------------------------------


def split_optimizer_state(sd: dict) -> tuple[dict, dict]:
    """An optimizer state_dict as (tensors keyed 'optimizer/<param>/<name>', JSON rest)."""
    tensors, plain = {}, {}
    for pid, st in sd["state"].items():
        for name, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optimizer/{pid}/{name}"] = v
            else:
                plain.setdefault(str(pid), {})[name] = v
    return tensors, {"param_groups": sd["param_groups"], "state": plain}


def join_optimizer_state(tensors: dict, plain: dict) -> dict:
    """Inverse of :func:`split_optimizer_state` (JSON lists in the param groups become tuples again)."""
    state: dict[int, dict] = {}
    for pid, st in plain["state"].items():
        state.setdefault(int(pid), {}).update(st)
    for key, v in tensors.items():
        if key.startswith("optimizer/"):
            _, pid, name = key.split("/", 2)
            state.setdefault(int(pid), {})[name] = v
    groups = [{k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in g.items()}
              for g in plain["param_groups"]]
    return {"state": state, "param_groups": groups}


def write_checkpoint(path: Path, tensors: dict[str, torch.Tensor], state: dict) -> Path:
    """Atomically write ``tensors`` and the JSON ``state`` as one safetensors file, then its digest
    (:func:`digest_path`, module doc)."""
    from safetensors.torch import save_file

    path = Path(path)
    seen, out = set(), {}
    for k, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        storage = t.untyped_storage().data_ptr()
        if t.numel() and storage in seen:  # tied weights or views: safetensors refuses shared storage
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[k] = t
    record = b""

    def write(tmp: Path) -> None:  # a failure (full disk: SafetensorError, an OSError) leaves the committed checkpoint
        nonlocal record
        state_text = json.dumps(state)
        save_file(out, str(tmp), metadata={"format": FORMAT, "state": state_text})
        record = _digest_record(path.name, _sha256_file(tmp), state_sha256(json.loads(state_text)))
        _write_synced(_pending_path(path), record)  # a kill between the two renames: this vouches for the new file

    commit_with(path, write, what="checkpoint")
    atomic_write_bytes(digest_path(path), record)  # last: the checkpoint is committed
    _pending_path(path).unlink(missing_ok=True)
    return path


# ---- the digest beside the checkpoint ---------------------------------------------------------------------


def digest_path(path: Path) -> Path:
    """The digest file of the checkpoint ``path``: ``checkpoint.safetensors`` -> ``checkpoint.sha256``."""
    path = Path(path)
    return path.with_name(path.stem + ".sha256")


def _pending_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).stem + ".sha256.next")


def state_sha256(state: dict) -> str:
    """sha256 of the state as canonical JSON: sorted keys, no spaces."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _seal(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _digest_record(name: str, file_sha: str, state_sha: str) -> bytes:
    body = {"format": DIGEST_FORMAT, "file": name, "file_sha256": file_sha, "state_sha256": state_sha}
    return (json.dumps({**body, "record_sha256": _seal(body)}, sort_keys=True, indent=1) + "\n").encode()


def _write_synced(path: Path, data: bytes) -> None:
    """Write and fsync in place (no rename): a torn pending digest matches no file, so it is harmless."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _load_digest(path: Path) -> tuple[dict | None, str]:
    """(record, '') for a whole digest file; (None, why) when it is unreadable or fails its own seal."""
    try:
        rec = json.loads(path.read_bytes())
        body = {k: rec[k] for k in ("format", "file", "file_sha256", "state_sha256")}
        seal = rec["record_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"not a digest record ({type(exc).__name__})"
    if body["format"] != DIGEST_FORMAT:
        return None, f"format {body['format']!r}, expected {DIGEST_FORMAT!r}"
    if seal != _seal(body):
        return None, "its own sha256 does not match (the digest file itself was changed)"
    return body, ""


def verify_checkpoint(path: Path, state: dict) -> None:
    """Check ``path`` (and its parsed ``state``) against its digest, or the pending digest of an interrupted
    commit; a :class:`CheckpointError` naming the file that does not match, or the hint when there is none."""
    path = Path(path)
    sidecar, pending = digest_path(path), _pending_path(path)
    if not sidecar.exists() and not pending.exists():
        raise CheckpointError(f"checkpoint {path} has no digest {sidecar.name} (written by an older "
                              f"version): start a new run or delete {path.parent / path.stem}*")
    file_sha = _sha256_file(path)
    loaded = {p: _load_digest(p) for p in (sidecar, pending) if p.exists()}
    for p, (rec, _) in loaded.items():
        if rec is not None and rec["file_sha256"] == file_sha:
            if rec["state_sha256"] != state_sha256(state):
                raise CheckpointError(f"checkpoint {path}: its state does not match the state sha256 in {p}; "
                                      f"delete {path.parent / path.stem}* to start afresh")
            return
    if sidecar in loaded and loaded[sidecar][0] is None:
        raise CheckpointError(f"digest {sidecar} of checkpoint {path} is damaged ({loaded[sidecar][1]}); delete "
                              f"{path.parent / path.stem}* to start afresh")
    recorded = [rec["file_sha256"][:16] + "..." for rec, _ in loaded.values() if rec is not None]
    raise CheckpointError(f"checkpoint {path} does not match its digest {sidecar.name} (sha256 {file_sha[:16]}..., "
                          f"recorded {' or '.join(recorded) or 'none'}): the file changed after it was written (a "
                          f"flipped bit, an edit); delete {path.parent / path.stem}* to start afresh")


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint and its digests (the checkpoint first: a kill midway leaves no checkpoint)."""
    path = Path(path)
    for p in (path, digest_path(path), _pending_path(path)):
        p.unlink(missing_ok=True)


def first_nonfinite(obj, where: str = "") -> str | None:
    """'key.path = value' of the first float in the JSON data ``obj`` that is NaN or infinite, else None."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else f"{where or 'value'} = {obj!r}"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        key = f"{where}[{k}]" if not isinstance(k, str) else f"{where}.{k}" if where else k
        if bad := first_nonfinite(v, key):
            return bad
    return None


# ---- one writer per run folder -----------------------------------------------------------------------------


_LOCK_TRIES = 100  # opens of train.lock before giving up when every lock taken was on a file just unlinked


@contextlib.contextmanager
def lock_run_folder(folder: Path):
    """Hold an exclusive advisory lock, ``flock(LOCK_EX | LOCK_NB)`` on ``folder/train.lock``, for the block; a
    :class:`RunFolderLockedError` when another process (or another open of the file) holds it. The OS drops
    the lock when the process dies. No-op where ``fcntl`` is missing (not POSIX).

    The file is removed at the end, while still locked: an opener that locked the same file meanwhile finds,
    re-checking after its lock, that ``train.lock`` is gone or is another inode, and opens it afresh, so two
    processes never hold the lock of the path at once. A process killed while holding it leaves the file (no
    lock on it); the next run locks and removes it. A file system refusing the lock file (read-only, full)
    is a :class:`gapdyn.io.WriteError` naming it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield None
        return
    folder = Path(folder)
    path = folder / LOCK_NAME
    for _ in range(_LOCK_TRIES):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            raise _write_failed(path, exc, "the lock file ") from None
        f = os.fdopen(fd, "r+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = f.read().strip()
            f.close()
            who = f" (pid {pid})" if pid.isdigit() else ""
            raise RunFolderLockedError(f"run folder {folder} is being written by another process{who}: wait for it "
                                       f"to end or stop it (lock {path})") from None
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()  # the file was removed (or replaced) by its last holder before we locked it: open again
    else:
        raise RunFolderLockedError(f"run folder {folder}: {path} changed under each of {_LOCK_TRIES} locks taken; "
                                   f"another process keeps recreating it")
    try:
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield path
    finally:
        try:
            os.unlink(path)  # while locked (see above); a read-only folder keeps it
        except OSError:
            pass
        f.close()  # releases the lock


def read_checkpoint(path: Path, *, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors on CPU, JSON state) of a checkpoint; a ValueError naming the file when it is not one, a
    :class:`CheckpointError` when it does not match its digest (``verify``: check it, the default)."""
    from safetensors import safe_open

    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"checkpoint {path} is empty (a kill during a non-atomic copy?); delete it to start afresh")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors' own error type, or an OSError from the mapping
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"checkpoint {path} ({size} bytes) is not a readable safetensors file ({msg}): truncated, "
                         f"corrupted or not a checkpoint; delete it to start afresh") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path} is a safetensors file but not a training checkpoint "
                         f"(format {meta.get('format')!r}, expected {FORMAT!r})")
    try:
        state = json.loads(meta["state"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"checkpoint {path}: its state record is missing or not JSON ({exc})") from None
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path}: its state record is not a JSON object")
    if verify:
        verify_checkpoint(path, state)
    if bad := first_nonfinite_tensor(tensors):
        name, count, index, value = bad
        raise CheckpointError(f"checkpoint {path}: tensor {name} holds {count} non-finite value(s) ({value} at index "
                              f"{index}): the run cannot continue from it; resume from a copy of an earlier checkpoint "
                              f"or delete {path.parent / path.stem}* to start afresh")
    return tensors, state


def first_nonfinite_tensor(tensors: dict[str, torch.Tensor]) -> tuple[str, int, tuple, float] | None:
    """(name, count, index of the first, its value) of the first floating tensor holding a NaN or an infinity,
    else None. A checkpoint is checked whatever its digest says: a digest vouches for bytes, not for values."""
    for name, t in tensors.items():
        if not (t.is_floating_point() or t.is_complex()) or not t.numel():
            continue
        ok = torch.isfinite(t)
        if not bool(ok.all()):
            bad = (~ok).nonzero()
            first = tuple(int(i) for i in bad[0])
            return name, int(bad.shape[0]), first, t[first].item()
    return None


# ---- append-only logs ------------------------------------------------------------------------------------------


class AppendLog:
    """A JSONL file written only by appending; :meth:`commit` makes the rows so far durable and returns their
    size, :meth:`rollback` cuts the file back to a committed size atomically."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.bytes = 0
        self.rows = 0

    def reset(self) -> None:
        """A fresh run: no file, nothing committed."""
        self.path.unlink(missing_ok=True)
        self.bytes = self.rows = 0

    def append(self, rows: list[dict]) -> None:
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        if not data:
            return
        try:
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError as exc:  # a torn row is cut by the next resume (rollback)
            raise _write_failed(self.path, exc) from exc
        self.bytes += len(data)
        self.rows += len(rows)

    def commit(self) -> dict:
        """fsync the file; the {"bytes", "rows"} a checkpoint records."""
        if self.path.exists():
            _fsync_path(self.path)
        return {"bytes": self.bytes, "rows": self.rows}

    def rollback(self, committed: dict, checkpoint: Path) -> None:
        """Cut the file back to the ``committed`` size (rows written after that checkpoint go); a ValueError
        when the file holds less than the checkpoint committed, or the kept part is not whole rows."""
        n, rows = int(committed["bytes"]), int(committed["rows"])
        have = self.path.stat().st_size if self.path.exists() else 0
        if have < n:
            raise ValueError(f"{self.path} holds {have} bytes but checkpoint {checkpoint} committed {n} bytes "
                             f"({rows} rows): the log was cut or replaced; restore it or start afresh")
        kept = b""
        if n:
            with open(self.path, "rb") as f:
                kept = f.read(n)
        lines = kept.decode(errors="replace").split("\n")
        if (n and not kept.endswith(b"\n")) or len(lines) - 1 != rows or not _all_json(lines[:-1]):
            raise ValueError(f"{self.path}: its first {n} bytes are not the {rows} rows checkpoint {checkpoint} "
                             f"committed: the log was edited or replaced; restore it or start afresh")
        if have > n:
            atomic_write_bytes(self.path, kept)
        self.bytes, self.rows = n, rows


def _all_json(lines: list[str]) -> bool:
    try:
        for ln in lines:
            json.loads(ln)
    except json.JSONDecodeError:
        return False
    return True
