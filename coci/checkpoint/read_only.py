"""``coci.load``: fill objects from a run's checkpoint without a ``Session``, read-only, at any world size.

The candidates are the run's committed steps, newest first (or the one step asked for). Each is
verified as ``Session.restore()`` verifies it (sizes, checksums, the record as untrusted input),
through the same readers (``coci.checkpoint.checkpointer.reader_for``), reading only the state
keys asked for; one that fails verification is passed over with a warning and named in the
result's ``skipped``. A verified checkpoint that does not fit the objects (an unknown key, a tensor
of another shape) is never passed over: that is the caller's mistake, a StateMismatchError naming it.

Nothing is written into the run (``coci.checkpoint.run_source``), no lock taken, no RNG stream
nor session counter touched. Without a process group a checkpoint of any world size loads as full
tensors; under ``torch.distributed`` with DTensor (FSDP2, tensor parallel) objects every rank calls
it and each loads its shards of its own mesh (collective; DCP reshards).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from coci import distributed
from coci.checkpoint import restore_checks
from coci.checkpoint.checkpointer import reader_for
from coci.checkpoint.dcp import DcpReader
from coci.checkpoint.local import LocalReader
from coci.checkpoint.records import LoadedCheckpoint
from coci.checkpoint.restore import RestoreResult, restore_value
from coci.checkpoint.run_source import RunSource, SourceLike, open_source, refuse_newer
from coci.checkpoint.sharded import ShardedState
from coci.checkpoint.stateful import validate_state
from coci.errors import CheckpointError, ConfigError, CorruptCheckpointError, StateError, StateMismatchError
from coci.events import EventLog

__all__ = ["DEFAULT_KEY", "as_state", "candidate_steps", "load", "load_from", "start_from"]

logger = logging.getLogger(__name__)

#: The state key a bare module stands for (``coci.load(run, model)``), and what ``coci export`` exports by default.
DEFAULT_KEY = "model"


def load(
    source: SourceLike, state: Mapping[str, Any] | torch.nn.Module, *, step: int | None = None, strict: bool = True
) -> RestoreResult:
    """Fill ``state`` from the newest committed checkpoint of ``source`` that verifies (or from ``step``).

    Args:
        source: a run directory, the list of a node-local run's directories (one per node), or a
            remote URL (``s3://bucket/prefix``, ``file:///path``, a scheme of
            ``coci.register_remote_scheme``).
        state: name -> object, any subset of the keys the checkpoint holds; a bare module stands
            for ``{"model": module}``. Modules, optimizers, tensors and objects with
            ``load_state_dict`` are filled in place, all or nothing.
        step: load this committed step, no other (ConfigError listing the committed steps when it is
            not one of them); None: the newest that verifies, passing over corrupt ones.
        strict: a key of ``state`` the checkpoint lacks is a StateMismatchError; False leaves it as
            it is (logged).

    Returns the ``coci.RestoreResult`` (``skipped``: the corrupt steps passed over). Raises
    CorruptCheckpointError when no candidate verifies, NewerCheckpointError for a run written by a
    newer coci, StateMismatchError naming a key or a tensor and both shapes that do not fit.
    """
    began = time.perf_counter()
    run = open_source(source)
    return load_from(run, as_state(state), step=step, strict=strict, began=began)


def as_state(state: Mapping[str, Any] | torch.nn.Module) -> dict[str, Any]:
    """``state`` checked as ``Session`` checks it; a bare module is ``{"model": module}``."""
    if isinstance(state, torch.nn.Module):
        return validate_state({DEFAULT_KEY: state})
    return validate_state(state)


def candidate_steps(run: RunSource, step: int | None) -> list[int]:
    """The steps to try, newest first: ``step`` alone when given (ConfigError when it is not committed)."""
    if not run.steps:
        raise CheckpointError(f"{run.label}: holds no committed checkpoint")
    if step is None:
        return list(run.steps)
    if step not in run.steps:
        shown = ", ".join(map(str, sorted(run.steps)[-10:]))
        raise ConfigError(f"step={step} is not a committed checkpoint of {run.label} (committed: {shown})")
    return [step]


def start_from(source: SourceLike, state: Mapping[str, Any], keys: tuple[str, ...], step: int | None, events: EventLog, at_step: int) -> RestoreResult:
    """A session's ``init_from``: fill the ``keys`` of ``state`` from ``source`` (its committed
    ``step``, None: the newest that verifies), read-only as ``load``; recorded as an ``init_from``
    event at the session's step ``at_step``. ConfigError for a key ``state`` lacks."""
    missing = sorted(set(keys) - set(state))
    if missing:
        raise ConfigError(f"init_keys {missing} are not keys of state ({sorted(state)})")
    began = time.perf_counter()
    run = open_source(source)
    result = load_from(run, {key: state[key] for key in keys}, step=step, strict=True)
    events.emit(
        "init_from", step=at_step, source=run.label, from_step=result.step, keys=list(keys), path=str(result.path),
        seconds=time.perf_counter() - began, bytes=result.nbytes, skipped=[str(p) for p in result.skipped],
    )
    logger.info("coci: started from %s step %d (%s)", run.label, result.step, ", ".join(keys))
    return result


def load_from(run: RunSource, state: dict[str, Any], *, step: int | None, strict: bool, began: float | None = None) -> RestoreResult:
    """``load`` from an opened ``RunSource`` (``state`` already checked)."""
    began = time.perf_counter() if began is None else began
    candidates = candidate_steps(run, step)
    refuse_newer(run, candidates[0])
    sharded = ShardedState.detect(state)
    context = distributed.DistributedContext.detect() if sharded.keys else None
    try:
        return _first_loaded(run, state, candidates, sharded, context, strict, began)
    finally:
        if context is not None:  # every rank tried the same candidates: its groups are idle
            context.release()


def _first_loaded(
    run: RunSource, state: dict[str, Any], candidates: list[int], sharded: ShardedState,
    context: distributed.DistributedContext | None, strict: bool, began: float,
) -> RestoreResult:
    """The newest of ``candidates`` that loads into ``state``; CorruptCheckpointError when none does."""
    skipped: list[Path] = []
    problems: list[str] = []
    for candidate in candidates:
        loaded, problem = _try(run, candidate, state, sharded, context, strict)
        if loaded is not None:
            seconds = time.perf_counter() - began
            tier = "remote" if run.store is not None else "local"
            return RestoreResult(loaded.step, loaded.epoch, loaded.path, seconds, loaded.nbytes, tuple(skipped), tier)
        where = f"{run.label}/step_{candidate}"
        logger.warning("coci.load: passing over %s: %s", where, problem)
        skipped.append(Path(where))
        problems.append(problem)
    raise CorruptCheckpointError(f"{run.label}: none of the {len(candidates)} committed checkpoints verifies: " + " | ".join(problems))


def _try(
    run: RunSource,
    step: int,
    state: dict[str, Any],
    sharded: ShardedState,
    context: distributed.DistributedContext | None,
    strict: bool,
) -> tuple[LoadedCheckpoint | None, str]:
    """Load ``step`` into ``state``: (the checkpoint, '') or (None, why it does not verify).
    A verified checkpoint that does not fit ``state`` raises StateMismatchError (collective)."""
    problem: str | None = None
    loaded: LoadedCheckpoint | None = None
    mismatch: StateMismatchError | None = None
    try:
        with run.opened(step) as path:
            loaded, mismatch = _load_fitting(path, state, sharded, context, strict, run.label)
    except (KeyboardInterrupt, SystemExit):
        raise
    except StateMismatchError as exc:
        mismatch = exc
    except BaseException as exc:  # whatever a damaged checkpoint raises
        problem = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    problem = distributed.agree(problem or (str(mismatch) if mismatch is not None else None), context)
    if mismatch is not None:
        raise mismatch
    if problem is not None or loaded is None:
        return None, problem or "not loaded"
    return loaded, ""


def _load_fitting(
    path: Path,
    state: dict[str, Any],
    sharded: ShardedState,
    context: distributed.DistributedContext | None,
    strict: bool,
    label: str,
) -> tuple[LoadedCheckpoint | None, StateMismatchError | None]:
    """Verify and read the keys of ``state`` from ``path`` and apply them, all or nothing."""
    reader = reader_for(path)
    record = reader.read_record(path)
    keys = _keys_to_load(record.state_keys, state, strict, f"{label} step_{record.step}")
    targets = {key: value for key, value in sharded.load_targets().items() if key in keys} if sharded.keys else None
    try:
        if isinstance(reader, (DcpReader, LocalReader)):
            loaded = reader.load(path, record, context, targets, keys=frozenset(keys))
        else:  # a format of the user's own: its reader loads the whole checkpoint
            whole = reader.load(path, record, context, targets)
            loaded = LoadedCheckpoint(whole.step, whole.epoch, whole.state_keys, path, {k: whole.tree[k] for k in keys}, whole.nbytes)
    except StateError as exc:  # a sharded tensor of another shape (raised before any read)
        return None, StateMismatchError(f"{label} step_{record.step} does not fit the state: {exc}")
    try:
        restore_checks.check_restorable(state, loaded.tree, keys)
    except CorruptCheckpointError as exc:  # verified, so not damage: the objects are of another model
        return None, StateMismatchError(f"{label} step_{record.step} does not fit the state: {exc}")
    restore_checks.apply_all_or_nothing(state, keys, lambda key: restore_value(sharded, key, state[key], loaded.tree[key]))
    return loaded, None


def _keys_to_load(saved: list[str], state: Mapping[str, Any], strict: bool, where: str) -> list[str]:
    unknown = sorted(set(state) - set(saved))
    if unknown and strict:
        raise StateMismatchError(
            f"{where} holds no state key {', '.join(map(repr, unknown))} (it holds {', '.join(map(repr, saved))}); "
            "strict=False leaves those objects as they are"
        )
    if unknown:
        logger.warning("coci.load: %s holds no state key %s: left as it is", where, unknown)
    keys = sorted(set(state) & set(saved))
    if not keys:
        raise StateMismatchError(f"{where} holds none of the state keys {sorted(state)} (it holds {saved})")
    return keys
