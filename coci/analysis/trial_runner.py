"""What the simulator's event loop (:mod:`coci.analysis.simulate_levels`) keeps per trial, and the
per-trial metrics read off it (see :mod:`coci.analysis.simulate`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coci.analysis.simulated_job import Job, RateFunction
from coci.planning.objective import CostModel, ExpectedFailures, build_cost_model


def _weight_function(rate: RateFunction | None, job: Job) -> Callable[[np.ndarray], np.ndarray]:
    """``W(x)``: cumulative progress weight (s) at progress ``x`` (s), via :mod:`coci.planning.objective`."""
    if rate is None:
        return lambda x: np.asarray(x, dtype=float)
    model: CostModel = build_cost_model(
        total_steps=job.total_steps,
        step_seconds=job.step_seconds,
        checkpoint_seconds=job.stall_seconds + job.interference_seconds,
        persist_seconds=job.persist_seconds,
        restart_seconds=job.restart_seconds,
        failures=ExpectedFailures.constant(1.0),
        progress_rate=rate,
    )
    return lambda x: model.weight_until(x, 1.0)


@dataclass
class _Trials:
    """Per-trial accumulators of the event loop, one entry per trial."""

    wall: np.ndarray
    restart_paid: np.ndarray
    lost: np.ndarray
    lost_weighted: np.ndarray
    steps_lost: np.ndarray
    snapshots: np.ndarray
    failure_count: np.ndarray
    resume: np.ndarray  # index of the checkpoint each trial resumes from
    restarting: np.ndarray  # the trial failed and pays a restart before it runs again
    active: np.ndarray
    start_at: np.ndarray  # timeline wall time the trial runs on from (offset[resume], or a notice's)
    floor_x: np.ndarray  # progress of the trial's newest checkpoint taken on a notice (0: none)
    rollback_x: np.ndarray  # progress of the trial's latest rollback point
    remote_back: np.ndarray  # index of the newest checkpoint committed on the remote tier
    restart_cost: np.ndarray  # seconds the pending restart takes (local or remote restore)
    remote_restores: np.ndarray

    @classmethod
    def start(cls, trials: int) -> _Trials:
        def zeros() -> np.ndarray:
            return np.zeros(trials)

        return cls(
            wall=zeros(), restart_paid=zeros(), lost=zeros(), lost_weighted=zeros(), steps_lost=zeros(),
            snapshots=zeros(), failure_count=zeros(), resume=np.zeros(trials, dtype=np.int64),
            restarting=np.zeros(trials, dtype=bool), active=np.ones(trials, dtype=bool),
            start_at=zeros(), floor_x=zeros(), rollback_x=zeros(), remote_back=np.zeros(trials, dtype=np.int64),
            restart_cost=zeros(), remote_restores=zeros(),
        )


def _stop_steps(stop_range: tuple[float, float] | None, job: Job, trials: int, stream: np.random.Generator) -> np.ndarray:
    """The step each trial stops at: the horizon, or drawn uniformly from a fraction range of it."""
    if stop_range is None:
        return np.full(trials, job.total_steps, dtype=np.int64)
    fractions = stream.uniform(stop_range[0], stop_range[1], trials)
    return np.clip(np.rint(fractions * job.total_steps).astype(np.int64), 1, job.total_steps)


def _metrics(state: _Trials, stop_x: np.ndarray) -> dict[str, np.ndarray]:
    """Per-trial metrics; trials stopped by the failure cap (``unfinished``) give lower bounds."""
    run = stop_x.astype(float)
    overhead = state.wall - run
    checkpoint_paid = overhead - state.restart_paid - state.lost
    progress_overhead = checkpoint_paid + state.restart_paid + state.lost_weighted
    return {
        "wall_seconds": overhead,
        "wall_percent": 100.0 * overhead / run,
        "progress_seconds": progress_overhead,
        "progress_percent": 100.0 * progress_overhead / run,
        "checkpoint_seconds": checkpoint_paid,
        "restart_seconds": state.restart_paid,
        "lost_seconds": state.lost,
        "lost_progress_seconds": state.lost_weighted,
        "checkpoints": state.snapshots,
        "failures": state.failure_count,
        "steps_lost": state.steps_lost,
        "run_seconds": run,
        "remote_restores": state.remote_restores,
        "unfinished": state.active.astype(float),
    }
