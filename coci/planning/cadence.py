"""When a planning policy observes the run, and when a warm-up checkpoint is skipped.

[``coci.Session``][coci.Session] and the simulator's online replay (``coci.analysis.simulate.online_schedule``)
both ask one ``Cadence``, so a replayed schedule follows the session's rules. The cadence
holds two counters (the step of the last observation and the planning seconds spent so far) and
decides from the step counts and clocks it is given; it never reads a clock itself.
"""

from __future__ import annotations

from collections.abc import Callable

from coci import knobs

#: Seconds of wall time the job has run so far; called only when a decision needs it.
ElapsedClock = Callable[[], float]


class Cadence:
    """Decides when a planning policy observes: once the profile has warmed up
    (``knobs.PLAN_WARMUP_STEPS``), after each commit, and ``knobs.OBSERVE_EVERY_STEPS`` steps after
    the last observation.

    Observing (a curve refit and a solve) takes CPU from the job, on the training thread or the
    planner thread, so after the first plan it is skipped while planning has taken more than
    ``knobs.PLANNING_TIME_FRACTION`` of the wall time.
    ``collective``: every process of a ``torch.distributed`` job observes at the same steps, so
    there is no observation after a commit (processes commit at different steps) and no
    planning-time cap (each process's clock differs).
    """

    def __init__(self, *, collective: bool = False, observe_every: int | None = None) -> None:
        self.collective = collective
        self._observe_every = observe_every
        self.observed_at = -1  # step of the last observation; -1: none since the process started
        self.planning_seconds = 0.0

    @property
    def observe_every(self) -> int:
        """Steps between two observations when no commit comes first (the knob, unless given)."""
        return knobs.OBSERVE_EVERY_STEPS if self._observe_every is None else self._observe_every

    def planning_affordable(self, elapsed: ElapsedClock) -> bool:
        """True while planning has cost at most ``knobs.PLANNING_TIME_FRACTION`` of the wall time."""
        return self.planning_seconds <= knobs.PLANNING_TIME_FRACTION * elapsed()

    def observe_after_commit(self, elapsed: ElapsedClock) -> bool:
        """Observe now that a checkpoint committed (single process, while planning is affordable)?"""
        return not self.collective and self.planning_affordable(elapsed)

    def observe_at_step(self, step: int, profiled_steps: int, warming_up: bool, elapsed: ElapsedClock) -> bool:
        """Observe at this step? Until the policy has planned (``warming_up``, or no observation
        yet), once the profiler has seen ``knobs.PLAN_WARMUP_STEPS`` steps; then every
        ``observe_every`` steps, while planning is affordable."""
        if self.observed_at < 0 or warming_up:
            return profiled_steps >= knobs.PLAN_WARMUP_STEPS
        due = step - self.observed_at >= self.observe_every
        return due and (self.collective or self.planning_affordable(elapsed))

    def record_observation(self, step: int, seconds: float) -> None:
        """Book an observation made at ``step`` that took ``seconds`` of planning."""
        self.observed_at = step
        self.planning_seconds += seconds

    def charge(self, seconds: float) -> None:
        """Book planning done on the planner thread (coci.planning.background) when its plan applies."""
        self.planning_seconds += seconds

    def restart(self) -> None:
        """After a restore: the policy observes again as soon as the profile has warmed up."""
        self.observed_at = -1

    @staticmethod
    def skip_warmup_checkpoint(
        *, warming_up: bool, persist_in_flight: bool, stalled_seconds: float, elapsed: ElapsedClock
    ) -> bool:
        """Skip a warm-up checkpoint (one due before the policy's first plan)?

        A warm-up checkpoint is a bet made before any cost is measured, so it is bounded: it never
        waits for the previous persist, and it is skipped while the stalls so far exceed
        ``knobs.PLAN_WARMUP_STALL_FRACTION`` of the wall time so far. The bet costs at most one
        stall plus that fraction of the warm-up.
        """
        if not warming_up:
            return False
        if persist_in_flight:
            return True
        return stalled_seconds > knobs.PLAN_WARMUP_STALL_FRACTION * elapsed()
