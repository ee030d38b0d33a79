"""Planning off the training thread: a planning policy observes on a worker thread, on its own copy.

[``coci.Session``][coci.Session] hands an observation (a snapshot: the profile, the loss trace and the
checkpoint steps at one step) to ``BackgroundPlanner``, which runs ``observe`` (a curve
refit and a solve, 0.01-0.25 s of CPU) on a deep copy of the policy on one worker thread.
The session keeps following the current policy meanwhile, and swaps the copy in at the *apply
step* fixed at submission: ``observed step + apply_lag_steps(step seconds of the observation)``.
If the copy is not ready by then the training thread waits for it. A plan is a pure function of
its observation, and the apply step is a function of the observation too, so a run's checkpoint
steps depend on its observations only, never on how fast the worker ran. (The simulator's online
replay applies a plan at its observed step: the lag is ``knobs.PLAN_APPLY_SECONDS`` of training.)
Distributed sessions and user-supplied policies observe inline, as before.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from coci import knobs
from coci.planning.policy import Observation

#: Fewest steps between the observation a plan was made from and the step it applies at
#: (``knobs.PLAN_APPLY_SECONDS`` of training at the observed step time, when that is more).
_PLAN_APPLY_MIN_STEPS: int = 1



def apply_lag_steps(step_seconds: float | None) -> int:
    """Steps between an observation and the step its plan takes effect: ``knobs.PLAN_APPLY_SECONDS``
    of training at the observed step time, at least ``_PLAN_APPLY_MIN_STEPS``."""
    floor = max(int(_PLAN_APPLY_MIN_STEPS), 1)
    if step_seconds is None or not math.isfinite(step_seconds) or step_seconds <= 0:
        return floor
    return max(floor, math.ceil(knobs.PLAN_APPLY_SECONDS / step_seconds - 1e-9))


class BackgroundPlanner:
    """At most one observation in flight; its policy copy is taken at its apply step.

    The worker reports the CPU seconds it spent (``time.thread_time``): what planning took from the
    job's cores, charged to the planning-time cap when its plan is taken, and added up in
    ``drain_cpu_seconds`` for every observation, taken, dropped or failed (the session books
    them as overhead). The worker thread starts on the first submission.
    """

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future[tuple[Any, float]] | None = None
        self.apply_step: int | None = None  # the step the policy in flight takes effect; None: none in flight
        self._lock = threading.Lock()
        self._cpu_seconds = 0.0  # worker CPU seconds not drained yet (written by the worker, under the lock)

    @property
    def in_flight(self) -> bool:
        return self._future is not None

    def submit(self, policy: Any, observation: Observation) -> int:
        """Start ``policy``'s observe of ``observation`` on a copy; return the step it applies at."""
        if self._future is not None:
            raise RuntimeError("a plan is already in flight")  # the session observes only when none is
        step_seconds = observation.profile.step_seconds.value
        self.apply_step = int(observation.step) + apply_lag_steps(step_seconds)
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coci-planner")
            self._future = self._executor.submit(self._observe_copy, policy, observation)
        return self.apply_step

    def due(self, step: int) -> bool:
        """Is the policy in flight to be swapped in at ``step``?"""
        return self.apply_step is not None and step >= self.apply_step

    def take(self) -> tuple[Any, float]:
        """The observed policy copy and the worker's planning seconds (waits until it is ready).

        An exception raised by ``observe`` propagates here, as it would inline."""
        future = self._future
        if future is None:
            raise RuntimeError("no plan in flight")
        self._future = None
        self.apply_step = None
        return future.result()

    def discard(self) -> None:
        """Drop the observation in flight (after waiting for its worker): a restore or close."""
        future, self._future, self.apply_step = self._future, None, None
        if future is not None:
            future.exception()

    def drain_cpu_seconds(self) -> float:
        """The worker's CPU seconds since the last drain (every observation that finished)."""
        with self._lock:
            seconds, self._cpu_seconds = self._cpu_seconds, 0.0
        return seconds

    def close(self) -> None:
        self.discard()
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _observe_copy(self, policy: Any, observation: Observation) -> tuple[Any, float]:
        began = time.thread_time()
        try:
            observed = copy.deepcopy(policy)  # the training thread reads the original meanwhile, never writes it
            observed.observe(observation)
        finally:
            seconds = time.thread_time() - began
            with self._lock:
                self._cpu_seconds += seconds
        return observed, seconds
