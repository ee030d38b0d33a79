"""What coci itself costs a training process, counted as it happens, and when the process started.

``OverheadLedger`` holds the wall seconds the session spent on the training thread, by kind:
per-step work (``session.step`` minus its checkpoint and planning), planning (re-plans on the
training thread), stalls (training blocked by a snapshot), restore, the final wait at ``close()``,
and the set-up (``Session(...)`` itself: the run-directory lock, the event log). The
session writes the totals into every ``progress``, ``stall``, ``restore`` and ``close`` event, so a
killed process leaves its last totals behind; the report sums the last totals of every process
(``pid``) and adds what is not spent on the training thread (interference of background persists).

The planner thread (``coci.planning.background``) is booked too (``planner_thread``): its CPU
seconds, measured in the thread, times the training thread's CPU contention (``CpuContention``),
less what the training thread already waited for that plan. The planner is Python and numpy on
small arrays, so it holds the GIL nearly all the time it runs: the training loop takes the GIL back
only at the 5 ms switch interval after each torch call, and loses about one second of progress per
planner CPU second; where cores are oversubscribed (other jobs, autogroup shares) that second costs
the training thread as long as one of its own CPU seconds does, ``1 + runqueue wait / run time``.

Start-up: ``process_age_seconds`` reads how long ago this process started (Linux
``/proc/self/stat`` start time against ``/proc/uptime``, both in 1/100 s; ``psutil`` where
``/proc`` is absent), so the session knows, without any import-time timestamp, the time from
process start to ``Session(...)`` (interpreter, imports including coci's own, data and model set-up)
and from process start to the first step after a restore (the restart cost). The import of coci
cannot be told apart from the rest of the start-up from inside the process; the start-up is
reported whole, and ``benchmarks/overhead_accounting.py`` measures the import from outside.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from coci.events import EventLog
from coci.profiler import Profiler

logger = logging.getLogger(__name__)


@dataclass
class OverheadLedger:
    """Seconds coci spent on the training thread of one process, by kind (see module docstring)."""

    step_work: float = 0.0
    planning: float = 0.0
    stall: float = 0.0
    restore: float = 0.0
    close_wait: float = 0.0
    planner_thread: float = 0.0
    setup: float = 0.0

    def total(self) -> float:
        return sum(asdict(self).values())

    def book_planner_thread(self, cpu_seconds: float, waited_seconds: float, contention: float) -> None:
        """Book planner-thread CPU seconds as the training time they cost (see module docstring):
        ``cpu_seconds * contention``, less ``waited_seconds`` the training thread already spent
        waiting for them (booked where it waited)."""
        self.planner_thread += max(cpu_seconds * contention - waited_seconds, 0.0)

    def as_event(self) -> dict[str, float]:
        """The totals as event fields (``overhead_<kind>``)."""
        return {f"overhead_{name}": round(value, 6) for name, value in asdict(self).items()}


class StallingCheckpoint(Protocol):
    """What ``OwnTime`` reads of the checkpoint in flight (``coci.checkpoint.checkpointer.PendingCheckpoint``)."""

    step: int
    nbytes: int

    def device_wait_seconds(self, *, block: bool) -> float | None: ...


class OwnTime:
    """A session's booking of its own time on the training thread: the ``ledger`` by kind, the
    stall of the checkpoint in flight (its copy, then the fence waits, then on a GPU the compute
    stream's wait), and the restart cost at the first step after a restore. The profiler gets the
    stalls and the busy intervals; ``events`` the ``stall`` and ``restart`` events.

    Every booked second lies inside one coci call on the training thread, booked once: a call's
    remainder (per-step work in ``step()``, the final wait in ``close()``) is its wall time less
    the planning and the checkpoint's stall booked apart inside it (``_remainder``)."""

    def __init__(self, profiler: Profiler, events: EventLog, clock: Callable[[], float]) -> None:
        self.ledger = OverheadLedger()
        self.stall_seconds = 0.0  # the checkpoint in flight's stall so far
        self.stalled_total = 0.0  # every stall of this process (the warm-up bet's budget)
        self.restored_at_age: float | None = None  # process age when restore() finished; None: no restart
        self._stalling: StallingCheckpoint | None = None
        self._profiler = profiler
        self._events = events
        self._clock = clock

    def event_fields(self) -> dict[str, Any]:
        """This process's overhead totals so far, for the ``progress``, ``stall`` and ``restore``
        events: a process killed before its first ``progress`` event still leaves the report what it spent."""
        return {"pid": os.getpid(), **self.ledger.as_event()}

    def booked_wait(self, seconds: float) -> float:
        """A snapshot wait inside the training step: off the profiler's step interval; returned."""
        now = self._clock()
        self._profiler.record_busy(now - seconds, now)
        return seconds

    def stall_wait(self, seconds: float) -> None:
        """A wait for the checkpoint in flight (its staging, the optimizer fence): part of its stall."""
        self.stall_seconds += self.booked_wait(seconds)

    def checkpoint_started(self, pending: StallingCheckpoint, began: float, planning_before: float) -> None:
        """``checkpoint()`` returned ``pending`` (called at ``began``): its stall so far is that
        call's time, less the planning a commit polled inside it booked apart."""
        self._stalling = pending
        self.stall_seconds = self._clock() - began - (self.ledger.planning - planning_before)

    def _remainder(self, entered: float, ended: float, planning_before: float, stalled: float) -> float:
        """The seconds of a call (``entered`` to ``ended``) not booked apart inside it: less the
        planning booked since ``planning_before`` and the ``stalled`` seconds of the checkpoint it
        started (``checkpoint()``'s own time, less the planning inside it)."""
        return max(ended - entered - (self.ledger.planning - planning_before) - stalled, 0.0)

    def account_step_work(self, entered: float, resumed: float, planning_before: float, checkpointed: bool) -> None:
        """Book this ``step()`` call's own time, minus its checkpoint and planning (booked apart), as
        per-step work; the profiler takes the whole call off the step interval it fell in."""
        ended = self._clock()
        self._profiler.record_busy(resumed, ended)
        stalled = self.stall_seconds if checkpointed else 0.0  # still just checkpoint()'s own time; fence waits come later
        self.ledger.step_work += self._remainder(entered, ended, planning_before, stalled)

    def account_close_wait(self, entered: float, planning_before: float, stalled: float) -> None:
        """Book this ``close()`` call's own time, minus the ``stalled`` seconds of its final
        checkpoint and the planning inside it (an observation after the last commit), as the final wait."""
        self.ledger.close_wait += self._remainder(entered, self._clock(), planning_before, stalled)

    def record_pending_stall(self, *, block: bool = False) -> None:
        """The stall of the checkpoint started at the previous step (its copy and the fence waits
        since): into the profile, the ledger and ``events.jsonl``. On a GPU the stall also holds the
        compute stream's wait at the fence, timed by events; while the GPU has not passed the fence
        the record waits for a later step (the host runs ahead), except where ``block`` (the next
        checkpoint, ``close()``) waits for that one event."""
        stalled = self._stalling
        if stalled is None:
            return
        device_wait = stalled.device_wait_seconds(block=block)
        if device_wait is None:
            return
        self.stall_seconds += device_wait
        self._profiler.record_stall(self.stall_seconds, stalled.nbytes)
        self.stalled_total += self.stall_seconds
        self.ledger.stall += self.stall_seconds
        self._events.emit("stall", step=stalled.step, seconds=self.stall_seconds, bytes=stalled.nbytes, **self.event_fields())
        self._stalling = None

    def record_restart(self, step: int) -> None:
        """The first ``step()`` after a restore: the restart cost is the process's age now, less
        this first step's own training time (the profile's step time), never less than the age
        when ``restore()`` finished. Kept in the profile (so across restarts) and in events."""
        restored_at, self.restored_at_age = self.restored_at_age, None
        age = process_age_seconds()
        if age is None or restored_at is None:
            return
        step_seconds = self._profiler.profile.step_seconds.value or 0.0
        restart = max(age - step_seconds, restored_at)
        self._profiler.record_restart(restart)
        self._events.emit("restart", step=step, seconds=restart, pid=os.getpid())


class CpuContention:
    """How long a CPU second of work takes the calling (training) thread in wall time, from its
    scheduler statistics since construction: ``1 + runqueue wait / run time`` (Linux
    ``/proc/self/task/<tid>/schedstat``; 1.0 where it is absent or nothing ran yet). Sleeps (I/O,
    a GIL or device wait) are not runqueue waits, so only a shortage of cores raises it."""

    def __init__(self) -> None:
        self._path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        self._start = self._read()

    def _read(self) -> tuple[int, int] | None:
        try:
            with open(self._path, encoding="ascii") as handle:
                run_ns, wait_ns = handle.read().split()[:2]
            return int(run_ns), int(wait_ns)
        except (OSError, ValueError):
            return None

    def factor(self) -> float:
        now = self._read()
        if now is None or self._start is None:
            return 1.0
        ran, waited = now[0] - self._start[0], now[1] - self._start[1]
        return 1.0 + waited / ran if ran > 0 and waited >= 0 else 1.0


def process_age_seconds() -> float | None:
    """Seconds since this process started, or None where the system does not say."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        return max(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)  # field 22: starttime
    except (OSError, ValueError, IndexError):
        pass
    try:
        import time

        import psutil  # type: ignore[import-untyped]

        return max(time.time() - psutil.Process().create_time(), 0.0)
    except Exception:  # psutil absent or refused: the start-up is then unknown
        logger.debug("process start time unknown", exc_info=True)
        return None
