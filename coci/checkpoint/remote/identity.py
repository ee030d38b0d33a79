"""Which run a remote prefix belongs to: one prefix, one run.

Two runs on one prefix would restore each other's states and delete each other's checkpoints, and
the run directory's lock covers the local disk only. So the prefix names its owner:

```text
run.json                 the owner: {"run_id", "run_dir", "host", "created", "adopted"}
step_<n>/run.json        the run that wrote that checkpoint (uploaded before its data)
```

and the run directory keeps the run's id in ``run_id.json``. ``claim`` (at ``Session()``, rank
0) creates the owner record on first use with a create-only put (S3 ``If-None-Match: *``, an
exclusive link on a directory), so of two runs racing for a fresh prefix exactly one wins. Then:

* this run's own id, or the same run directory path with no id (the run restarted on a fresh disk
  after losing its node): the run goes on;
* any other run: [``coci.errors.ConfigError``][coci.ConfigError] naming the prefix and its owner, unless the
  session was built with ``remote_owner="adopt"``: the run then takes the prefix over (the owner
  record names it, and the runs it adopted), may restore the previous owner's checkpoints, and
  never deletes them (retention deletes only checkpoints whose ``step_<n>/run.json`` names this
  run). The previous owner is fenced: before each upload and each retention pass the tier checks
  that it still owns the prefix (``RunIdentity.check_owner``), and its next ``Session()`` on
  the prefix is refused.

Every record here is untrusted input: bounded reads, validated fields, and a record that does not
parse is a ConfigError naming it, never overwritten.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError

from coci import distributed, knobs
from coci.checkpoint import layout
from coci.checkpoint.remote.store import RemoteStore
from coci.distributed import DistributedContext
from coci.errors import ConfigError, CorruptCheckpointError
from coci.events import EventLog, read_run_file, write_run_file

__all__ = [
    "LOCAL_ID_FILENAME",
    "OWNER_KEY",
    "REMOTE_OWNER_MODES",
    "RemoteOwner",
    "RunIdentity",
    "StartClaim",
    "claim",
    "claim_for_job",
    "read_local_id",
    "step_owner",
]

#: The prefix's owner record, and each checkpoint's (``step_<n>/run.json``).
OWNER_KEY = "run.json"
#: The run's id in its run directory.
LOCAL_ID_FILENAME = "run_id.json"
#: ``Session(remote_owner=...)``: refuse a prefix another run owns, or take it over.
RemoteOwnerMode = Literal["refuse", "adopt"]
REMOTE_OWNER_MODES: tuple[str, ...] = get_args(RemoteOwnerMode)

logger = logging.getLogger(__name__)

_RECORD_MAX_BYTES = 64 << 10
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class RemoteOwner(BaseModel):
    """The owner record of a prefix (``run.json``) or of one checkpoint (``step_<n>/run.json``)."""

    run_id: str = Field(pattern=_RUN_ID.pattern)
    run_dir: str = Field(default="", max_length=4096)
    host: str = Field(default="", max_length=256)
    created: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    adopted: list[str] = Field(default_factory=list, max_length=1024)


@dataclass(frozen=True)
class RunIdentity:
    """This run on its prefix: its id and the ids whose checkpoints it may restore (its own and
    those of the runs it adopted)."""

    run_id: str
    readable: frozenset[str] = field(default_factory=frozenset)
    fresh: bool = False  # this process created the owner record: nothing on the prefix is this run's history

    def may_restore(self, owner: str | None) -> bool:
        """A checkpoint written by ``owner``; None (no ``step_<n>/run.json``: planted, or promoted
        before run ids existed) is no run's, so never restored under an identity."""
        return owner is not None and (owner == self.run_id or owner in self.readable)

    def check_owner(self, store: RemoteStore) -> None:
        """ConfigError when the prefix's owner record no longer names this run (taken over)."""
        owner = read_owner(store)
        if owner is None or owner.run_id != self.run_id:
            now = "no owner record" if owner is None else f"run {owner.run_id} ({owner.run_dir} on {owner.host})"
            raise ConfigError(f"remote {store.url} no longer belongs to run {self.run_id}: it names {now}; nothing written or deleted")

    def step_record(self) -> bytes:
        """What ``step_<n>/run.json`` holds for a checkpoint of this run."""
        return RemoteOwner(run_id=self.run_id, host=socket.gethostname(), created=time.time()).model_dump_json().encode()

    def claim_step(self, store: RemoteStore, step: int) -> None:
        """Before uploading ``step``: this run still owns the prefix and no other run's checkpoint
        has that step (never overwritten); then the step's record goes up, before its data."""
        self.check_owner(store)
        owner = step_owner(store, step)
        if owner is not None and owner != self.run_id:
            raise ConfigError(f"remote {store.url}/step_{step} belongs to run {owner}: not overwritten")
        store.put_bytes(f"{layout.step_dirname(step)}/{OWNER_KEY}", self.step_record())

    def own_steps(self, store: RemoteStore, steps: list[int]) -> list[int]:
        """Those of ``steps`` this run wrote (what its retention may delete)."""
        return [step for step in steps if step_owner(store, step) == self.run_id]


def step_owner(store: RemoteStore, step: int) -> str | None:
    """The run id in ``step_<n>/run.json``; None without one; ``"?"`` when it is unreadable (a
    checkpoint no run may claim: never restored under an identity, never deleted)."""
    key = f"{layout.step_dirname(step)}/{OWNER_KEY}"
    if not store.exists(key):
        return None
    try:
        return _parse(store.get_bytes(key, _RECORD_MAX_BYTES), key).run_id
    except Exception:
        return "?"


def read_owner(store: RemoteStore) -> RemoteOwner | None:
    """The prefix's owner record; None without one; ConfigError when it is not one coci wrote
    (oversized, not a plain object, fields out of range). A store that does not answer raises
    its own error (the claim is then tried again later, ``RemoteTier.owned``)."""
    if not store.exists(OWNER_KEY):
        return None
    where = f"{store.url}/{OWNER_KEY}"
    try:
        data = store.get_bytes(OWNER_KEY, _RECORD_MAX_BYTES)
    except CorruptCheckpointError as exc:
        raise ConfigError(f"{where} is not a coci owner record ({exc}); left as it is") from exc
    return _parse(data, where)


def _parse(data: bytes, where: str) -> RemoteOwner:
    try:
        return RemoteOwner.model_validate_json(data)
    except (ValidationError, ValueError) as exc:
        raise ConfigError(f"{where} is not a coci owner record ({type(exc).__name__}); left as it is") from exc


def read_local_id(run_dir: Path) -> str | None:
    """The run id kept in ``run_dir/run_id.json``; None without one; ConfigError naming the file
    when it is not one coci wrote (a link, oversized, not a run id)."""
    path = run_dir / LOCAL_ID_FILENAME
    try:
        data = read_run_file(path, max_bytes=_RECORD_MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path} is unreadable: {exc}") from exc
    try:
        run_id = json.loads(data)["run_id"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{path}: not a coci run id record ({type(exc).__name__})") from exc
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ConfigError(f"{path}: run_id {str(run_id)[:40]!r} is not a coci run id")
    return run_id


def _write_local_id(run_dir: Path, run_id: str) -> None:
    write_run_file(run_dir / LOCAL_ID_FILENAME, json.dumps({"run_id": run_id}))


def _record(run_id: str, run_dir: Path, adopted: list[str]) -> bytes:
    owner = RemoteOwner(run_id=run_id, run_dir=str(run_dir), host=socket.gethostname(), created=time.time(), adopted=adopted)
    return owner.model_dump_json().encode()


def claim(
    store: RemoteStore, run_dir: Path, mode: str, events: EventLog, known_id: str | None = None, level: str = "remote",
) -> RunIdentity:
    """This run's identity on ``store`` (see the module docstring); records a ``remote_owner``
    event; ConfigError when another run owns the prefix and ``mode`` is ``"refuse"``, naming the
    storage level ``level`` (``remote``, or an added level's name such as ``level4``). ``known_id``:
    the run id another node's directory keeps, when this one keeps none (node-local directories:
    the identity must not depend on which node is rank 0)."""
    if mode not in REMOTE_OWNER_MODES:
        raise ConfigError(f"remote_owner must be one of {', '.join(map(repr, REMOTE_OWNER_MODES))}, got {mode!r}")
    here = Path(os.path.abspath(run_dir))
    local = read_local_id(run_dir) or known_id
    owner = read_owner(store)
    if owner is None:
        run_id = local or uuid.uuid4().hex
        if store.put_bytes_if_absent(OWNER_KEY, _record(run_id, here, [])):
            return _settled(run_dir, RunIdentity(run_id, frozenset(), fresh=True), events, "claimed", store)
        owner = read_owner(store)  # another run created it between the two calls: it won
        if owner is None:  # the name is taken by what no read sees as an object: a link, a FIFO, a directory
            raise ConfigError(
                f"{store.url}/{OWNER_KEY} exists but is not a plain object coci can read (a link, a FIFO, a directory?); "
                "left as it is: no run may use this prefix until it is removed"
            )
    readable = frozenset(owner.adopted)
    if owner.run_id == local or (local is None and owner.run_dir == str(here)):
        action = "owned" if local is not None else "continued"  # the same run directory on a fresh disk
        return _settled(run_dir, RunIdentity(owner.run_id, readable), events, action, store)
    if mode != "adopt":
        raise ConfigError(_refusal(store, owner, local, here, level))
    run_id = local or uuid.uuid4().hex
    adopted = [*owner.adopted, owner.run_id]
    store.put_bytes(OWNER_KEY, _record(run_id, here, adopted))
    identity = RunIdentity(run_id, frozenset(adopted))
    return _settled(run_dir, identity, events, "adopted", store, previous=owner.run_id)


def _settled(run_dir: Path, identity: RunIdentity, events: EventLog, action: str, store: RemoteStore, **extra: Any) -> RunIdentity:
    _write_local_id(run_dir, identity.run_id)
    events.emit("remote_owner", step=0, action=action, run_id=identity.run_id, remote=store.url, **extra)
    return identity


def _refusal(store: RemoteStore, owner: RemoteOwner, local: str | None, here: Path, level: str) -> str:
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(owner.created))
    except (OverflowError, ValueError, OSError):  # a finite time no calendar holds
        since = f"time {owner.created:.6g}"
    this = f"run {local}" if local is not None else "a new run"
    taken = " (it took the prefix over from this run)" if local in owner.adopted else ""
    adopt = "Session(remote_owner='adopt')" if level == "remote" else f"owner='adopt' to {level} (coci.DirectoryLevel(path, owner='adopt'))"
    return (
        f"{level} {store.url} belongs to another run: run {owner.run_id}, run directory {owner.run_dir!r} on "
        f"{owner.host or '?'}, since {since}{taken}; this is {this} in {str(here)!r}. Two runs on one prefix would "
        f"restore and delete each other's checkpoints: give this run its own prefix, or pass "
        f"{adopt} to continue from that run's checkpoints (this run never deletes them)"
    )


class StartClaim:
    """The claim ``Session()`` begins (rank 0), on a thread of its own: ``Session()`` waits for it
    at most ``knobs.REMOTE_START_SECONDS``. A tier that goes on without it takes its identity from
    it once it answers (``identity_or``), and never claims again while it is still waiting."""

    def __init__(self, attempt: Callable[[], RunIdentity]) -> None:
        self._attempt = attempt
        self._done = threading.Event()
        self._identity: RunIdentity | None = None
        self._error: Exception | None = None
        threading.Thread(target=self._run, name="coci-remote-claim", daemon=True).start()

    def _run(self) -> None:
        try:
            self._identity = self._attempt()
        except Exception as exc:  # whoever asks for the identity gets it
            self._error = exc
        finally:
            self._done.set()

    def wait(self, seconds: float) -> bool:
        """Whether the claim answered (an identity or an error) within ``seconds``."""
        return self._done.wait(seconds)

    def identity(self) -> RunIdentity:
        """The identity claimed; the claim's error; TimeoutError while the store has not answered."""
        if not self._done.is_set():
            raise TimeoutError(
                f"the owner record did not answer within knobs.REMOTE_START_SECONDS ({knobs.REMOTE_START_SECONDS:g} s) "
                "and is still awaited: local-only until it answers"
            )
        if self._error is not None:
            raise self._error
        assert self._identity is not None
        return self._identity

    def identity_or(self, again: Callable[[], RunIdentity]) -> RunIdentity:
        """``identity`` while the claim waits or when it succeeded; once it failed, ``again()``."""
        return again() if self._done.is_set() and self._error is not None else self.identity()


def claim_for_job(
    store: RemoteStore, run_dir: Path, mode: str, events: EventLog, context: DistributedContext | None, level: str = "remote",
) -> tuple[RunIdentity | None, StartClaim | None]:
    """``claim`` on rank 0, its verdict on every rank (collective under ``torch.distributed``):
    the same identity, or the same ConfigError, everywhere. No identity (logged, an ``error``
    event) when the store cannot be reached now or does not answer within
    ``knobs.REMOTE_START_SECONDS``: the tier then claims before it is used; on rank 0, with the
    claim still running in the background (``StartClaim``), returned beside the identity."""

    known = _other_nodes_id(run_dir, context)
    started: list[StartClaim] = []

    def attempt() -> tuple[RunIdentity | None, str | None]:
        started.append(StartClaim(lambda: claim(store, run_dir, mode, events, known, level)))
        try:
            started[0].wait(knobs.REMOTE_START_SECONDS)
            return started[0].identity(), None  # a TimeoutError while it is still waiting on the store
        except ConfigError as exc:
            return None, str(exc)
        except Exception as exc:  # an unreachable or silent store: the owner is unknown, claimed before the tier is used
            logger.warning("remote %s: owner record not read now (%s: %s); claimed before the remote tier is used", store.url, type(exc).__name__, exc)
            events.emit("error", step=0, phase="remote_owner", message=f"{type(exc).__name__}: {exc}")
            return None, None

    identity, problem = distributed.from_coordinator(attempt, context)
    if problem is not None:
        raise ConfigError(problem)
    if identity is not None and context is not None and context.node_local and context.is_node_leader and not context.is_coordinator:
        try:  # every node's directory keeps the run's id: any node may be rank 0 after a restart
            _write_local_id(run_dir, identity.run_id)
        except (OSError, ConfigError) as exc:
            logger.warning("cannot keep the run id in %s: %s", run_dir, exc)
    return identity, (started[0] if started else None)


def _other_nodes_id(run_dir: Path, context: DistributedContext | None) -> str | None:
    """The run id the node-local directories keep, the lowest node's first (collective): a
    restart whose nodes joined in another order, or whose rank 0's disk is new, keeps the run's
    identity. None in one shared directory (rank 0 reads it itself)."""
    if context is None or not context.node_local:
        return None
    mine = None
    if context.is_node_leader:
        try:
            mine = read_local_id(run_dir)
        except ConfigError:  # rank 0 names a damaged file of its own; another node's is not used
            mine = None
    return next((found for found in distributed.gather_objects(mine, context.control_group) if found), None)
