"""The restores in a run's event log, each with the work it lost.

Lost work: a restore that follows a segment of the event log with no ``close`` event is a failure.
The work lost is the steps between the step that segment's process reached and the step restored:
exact where it left its step mark (``step.mark``, which the next process records as a ``reached``
event), else a lower bound from its last event (events come at checkpoints and every few seconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from coci.checkpoint.storage_level import ADDED_NAME
from coci.checks import is_int

__all__ = ["RestoreRow", "Restores", "event_step", "finite_number", "is_level_name", "total_lost_seconds"]

#: Fewest steps a failed process's own timed events must span for the report to time its lost
#: steps at that process's pace (wall seconds per step) rather than the run's final step time
_REPORT_PACE_MIN_STEPS: int = 5


class RestoreRow(BaseModel):
    """One restore: the step restored and, after a failure, the work lost: exact when the killed
    process left its step mark (``lost_exact``), else a lower bound (its last event).
    ``restart_seconds``: that process's start to its first step after the restore."""

    step: int
    seconds: float | None = None
    restart_seconds: float | None = None
    failure: bool = True
    reached_step: int | None = None
    lost_steps: int | None = None
    lost_seconds: float | None = None
    lost_exact: bool = False
    tier: str | None = None  # where it came from: "local", "peer" (a peer node's copy), "remote"; None: not logged
    node_tiers: dict[int, str] | None = None  # node-local run directories: where each node's part came from
    preempted: bool = False  # the process before it stopped on a preemption notice


def event_step(event: dict[str, Any]) -> int | None:
    """The event's ``step`` when it is an integer, else None."""
    step: Any = event.get("step")
    return int(step) if is_int(step) else None


class _Pace:
    """Wall seconds per step of one process's training, from its own timed events written on the
    training thread at the step they name (``restore``, ``progress``, ``snapshot_start``): the pace at
    which a failed process did the work it lost, where the profile's step time is the run's final
    one. A process whose events span too few steps (killed before its first checkpoint) is timed
    from its restore to the start of the next process (``session`` time less its start-up), at the
    step it reached: an upper bound, which holds the time the restart took to begin."""

    def __init__(self) -> None:
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None
        self.end: tuple[float, int] | None = None  # (the next process's start, the step this one reached)

    def add(self, event: dict[str, Any], step: int) -> None:
        when = finite_number(event.get("time"))
        if when is not None:
            self.first = self.first or (when, step)
            self.last = (when, step)

    def seconds_per_step(self) -> float | None:
        """None when neither the events nor the span to the next start cover
        ``_REPORT_PACE_MIN_STEPS`` steps with time."""
        return _per_step(self.first, self.last) or _per_step(self.first, self.end)


def _per_step(first: tuple[float, int] | None, last: tuple[float, int] | None) -> float | None:
    """Wall seconds per step between two (time, step) points at least ``_REPORT_PACE_MIN_STEPS`` apart."""
    if first is None or last is None or last[1] - first[1] < _REPORT_PACE_MIN_STEPS:
        return None
    pace = (last[0] - first[0]) / (last[1] - first[1])
    return pace if math.isfinite(pace) and pace > 0 else None


def _restores(events: Iterable[dict[str, Any]], step_seconds: float | None) -> list[RestoreRow]:
    """The restores of ``events`` (see ``Restores``)."""
    restores = Restores(step_seconds)
    for event in events:
        restores.add(event, event.get("event"), event_step(event))
    return restores.rows


class Restores:
    """Each restore, and what the segment before it had reached (a failure unless it closed),
    built event by event. The lost steps are timed at the failed process's own pace
    (``_Pace``) where its events show one, else at ``step_seconds``."""

    def __init__(self, step_seconds: float | None) -> None:
        self.step_seconds = step_seconds
        self.rows: list[RestoreRow] = []
        self.reached: int | None = None
        self.closed = self.marked = self.preempted = False
        self.pace = _Pace()  # this process's
        self.previous_pace: _Pace | None = None  # the one before its `session` event

    def add(self, event: dict[str, Any], kind: Any, step: int | None) -> None:
        if kind == "session":
            started = _process_start(event)
            if started is not None and self.reached is not None:  # the step mark's `reached` came first
                self.pace.end = (started, self.reached)
            self.pace, self.previous_pace = _Pace(), self.pace
        if kind in ("progress", "snapshot_start") and step is not None:
            self.pace.add(event, step)
        if kind == "preempted":
            self.preempted = True
        if kind == "reached" and step is not None:  # the step mark the previous process left (a
            # mirrored one, exact false, is the step it had when last mirrored: a lower bound)
            self.marked = (self.reached is None or step >= self.reached) and event.get("exact") is not False
        if kind == "restart" and self.rows and self.rows[-1].restart_seconds is None:
            self.rows[-1].restart_seconds = finite_number(event.get("seconds"))
            return
        if kind == "restore" and step is not None:
            self._restore(event, step)
            return
        if step is not None and kind not in ("retention", "restore_skip"):
            self.reached = step if self.reached is None else max(self.reached, step)
        if kind == "close":
            self.closed = True

    def _restore(self, event: dict[str, Any], step: int) -> None:
        reached = self.reached
        failure = reached is not None and not self.closed
        lost = max(reached - step, 0) if failure and reached is not None else None
        per_step = (self.previous_pace or self.pace).seconds_per_step() or self.step_seconds
        self.rows.append(
            RestoreRow(
                step=step,
                seconds=event.get("seconds"),
                failure=failure,
                reached_step=reached,
                lost_steps=lost,
                lost_seconds=None if lost is None or per_step is None else lost * per_step,
                lost_exact=failure and self.marked,
                tier=event.get("tier") if is_level_name(event.get("tier")) else None,
                node_tiers=_node_tiers(event.get("node_tiers")),
                preempted=self.preempted,
            )
        )
        self.reached, self.closed, self.marked, self.preempted = step, False, False, False
        self.pace, self.previous_pace = _Pace(), None
        self.pace.add(event, step)  # this process trains on from here


_TIERS = ("local", "peer", "remote")


def is_level_name(value: Any) -> bool:
    """Whether ``value`` (read from an untrusted log) names a storage level: local, peer, remote or ``level<k>``."""
    return isinstance(value, str) and (value in _TIERS or ADDED_NAME.match(value) is not None)
_MAX_NODES = 1 << 16


def _node_tiers(value: Any) -> dict[int, str] | None:
    """A ``restore`` event's ``node_tiers`` (node index as a string -> tier) as read from an
    untrusted log: None unless every entry is a node index and a known tier."""
    if not isinstance(value, dict) or not value or len(value) > _MAX_NODES:
        return None
    tiers: dict[int, str] = {}
    for node, tier in value.items():
        if not (isinstance(node, str) and node.isdigit() and len(node) <= 6 and tier in _TIERS):
            return None
        tiers[int(node)] = tier
    return dict(sorted(tiers.items()))


def _process_start(session: dict[str, Any]) -> float | None:
    """When a process started: its ``session`` event's time less its start-up (None if unknown)."""
    when, startup = finite_number(session.get("time")), finite_number(session.get("startup_seconds"))
    return None if when is None or startup is None else when - startup


def total_lost_seconds(failures: list[RestoreRow]) -> float | None:
    """The failures' lost seconds, each timed in ``_restores``; None when one that lost steps
    has no time (no pace of its own and no step time)."""
    timed = [r.lost_seconds for r in failures if r.lost_steps]
    return None if None in timed else sum(seconds or 0.0 for seconds in timed)


def finite_number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None
