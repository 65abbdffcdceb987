"""Checkpoint and log files of a training run: what a resume reads, and how a kill can never corrupt it.

A checkpoint is one safetensors file: every tensor (weights, optimizer moments, torch RNG states, probe
sums) as a tensor, everything else (step, numpy RNG state, detector state, configuration, committed log
sizes) as JSON in the file's metadata. Nothing is unpickled, so a planted file cannot run code; a file
that is not a whole checkpoint of this format is a ValueError naming the file and what is wrong.
Writes are atomic: a temporary file in the same folder, fsync, rename, fsync of the folder.

The JSONL logs are append-only between checkpoints (:class:`AppendLog`). Each checkpoint records the
committed size (bytes and rows) of every log after an fsync; a resume first cuts each log back to that
size by writing the kept prefix to a temporary file and renaming it over the log, so a kill at any moment
(during training or during the resume itself) leaves every log with each step exactly once.

A resume must continue the same run: the fields marked "trajectory" in :data:`RESUME_POLICY` have to equal
the checkpoint's, unless the caller forces it (``resume_force``).
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, fields
from pathlib import Path

import torch

__all__ = ["CHECKPOINT_NAME", "LEGACY_NAME", "FORMAT", "RESUME_POLICY", "config_differences", "write_checkpoint",
           "read_checkpoint", "commit_file", "split_optimizer_state", "join_optimizer_state", "AppendLog", "atomic_write_bytes",
           "atomic_write_text"]

CHECKPOINT_NAME = "checkpoint.safetensors"
LEGACY_NAME = "checkpoint.pt"
FORMAT = "gapdyn-llm-checkpoint/1"

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
    "collapse": "trajectory",  # the alert rule whose state the checkpoint carries
    "out_dir": "control",  # the same folder, however it is spelled
    "steps": "control",  # extend or shorten a run
    "checkpoint_every": "control",
    "resume": "control",
    "resume_force": "control",
    "stop_on_collapse": "control",
    "max_faults": "control",
    "num_threads": "control",
    "device": "control",
    "progress": "control",
    "safe_step": "trajectory",  # rescales every update (llm_probe.safe_step)
    "safe_step_c": "trajectory",
    "safe_step_delta": "trajectory",
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


def commit_file(tmp: Path, path: Path) -> None:
    """fsync ``tmp``, rename it to ``path``, fsync the folder (the rename itself survives a crash)."""
    _fsync_path(tmp)
    os.replace(tmp, path)
    try:
        _fsync_path(path.parent)
    except OSError:  # folders cannot be opened for fsync on some platforms
        pass


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    commit_file(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


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
    """Atomically write ``tensors`` and the JSON ``state`` as one safetensors file."""
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
    tmp = path.with_name(path.name + ".tmp")
    save_file(out, str(tmp), metadata={"format": FORMAT, "state": json.dumps(state)})
    commit_file(tmp, path)
    return path


def read_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors on CPU, JSON state) of a checkpoint; a ValueError naming the file when it is not one."""
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
    return tensors, state


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
        with open(self.path, "ab") as f:
            f.write(data)
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
