"""The job a run directory was last used by, so that a changed job beside an existing run is named.

A new job started with an existing run's directory (and remote prefix) continues that run: its
newest checkpoint is restored. That is what a restart wants, and a silent mistake when the job is
another one (another batch size, other model shapes, another world size). ``Session()`` describes
its job in ``<run_dir>/job.json`` (rank 0): the world size and nodes, each state entry's tensor
shapes (a digest per entry, DTensors by their global shape) and each batch size found in the state
(a data loader's ``batch_size``). When the file already holds another description, every
difference is logged as a warning and recorded in a ``job_changed`` event (the report lists it),
and the file is replaced. Nothing is refused: an elastic restart changes the world size on
purpose; a new job should use a new run directory and remote prefix instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from coci.checks import is_int
from coci.errors import ConfigError
from coci.events import EventLog, read_run_file, write_run_file

__all__ = ["JOB_FILENAME", "describe_job", "job_changes", "record_job"]

logger = logging.getLogger(__name__)

JOB_FILENAME = "job.json"
_JOB_MAX_BYTES = 1 << 20


def describe_job(state: Mapping[str, Any], world_size: int, nodes: int) -> dict[str, Any]:
    """The job's description (see the module docstring): JSON-ready, the same for the same job."""
    shapes = {key: _shapes_digest(value) for key, value in state.items()}
    batches = {key: int(value.batch_size) for key, value in state.items() if is_int(getattr(value, "batch_size", None))}
    return {
        "world_size": world_size,
        "nodes": nodes,
        "tensor_shapes": {key: digest for key, digest in shapes.items() if digest is not None},
        "batch_sizes": batches,
    }


def _shapes_digest(value: Any) -> str | None:
    """A digest of the names, global shapes and dtypes of an entry's tensors (a module's state dict,
    a tensor); None for an entry without any."""
    if isinstance(value, torch.nn.Module):
        tensors = {name: tensor for name, tensor in value.state_dict().items() if isinstance(tensor, torch.Tensor)}
    elif isinstance(value, torch.Tensor):
        tensors = {"": value}
    else:
        return None
    listed = sorted((name, list(tensor.shape), str(tensor.dtype)) for name, tensor in tensors.items())
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:16]


def job_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between two descriptions, one line per field (``"batch_size of state['loader'] 4 -> 8"``)."""
    changes = []
    for field in ("world_size", "nodes"):
        if before.get(field) != now.get(field):
            changes.append(f"{field} {before.get(field)} -> {now.get(field)}")
    for field, what in (("tensor_shapes", "tensor shapes"), ("batch_sizes", "batch_size")):
        old: dict[str, Any] = before[field] if isinstance(before.get(field), dict) else {}
        new: dict[str, Any] = now[field] if isinstance(now.get(field), dict) else {}
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                shown = "" if field == "tensor_shapes" else f" {old.get(key)} -> {new.get(key)}"
                changes.append(f"{what} of state[{key!r}]{shown}")
    return changes


def record_job(run_dir: Path, described: dict[str, Any], events: EventLog) -> list[str]:
    """Compare ``described`` with the run directory's ``job.json`` and replace it; the changes
    (warned about, a ``job_changed`` event) when the file held another job's description. A file
    that is not one (unreadable, not an object) is replaced, with a warning."""
    path = run_dir / JOB_FILENAME
    changes: list[str] = []
    try:
        before = json.loads(read_run_file(path, _JOB_MAX_BYTES))
    except FileNotFoundError:
        before = None
    except (OSError, ConfigError, ValueError, RecursionError) as exc:
        logger.warning("%s is unreadable (%s): replaced", path, exc)
        before = None
    if isinstance(before, dict):
        changes = job_changes(before, described)
    if changes:
        logger.warning(
            "coci: the run in %s was started by another job configuration (%s); it continues that run from its newest "
            "checkpoint. A new job should use a new run directory (and remote prefix)", run_dir, "; ".join(changes),
        )
        events.emit("job_changed", step=0, changes=changes)
    try:
        write_run_file(path, json.dumps(described, sort_keys=True))
    except (OSError, ConfigError) as exc:
        logger.warning("cannot record the job in %s: %s", path, exc)
    return changes
