"""The simulator's event loop (see :mod:`coci.analysis.simulate`): all trials advance together, one
failure per iteration, through restarts and both tiers, and the per-trial metrics are read off."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coci import knobs
from coci.analysis.simulated_job import Job, RateFunction, Timeline
from coci.planning.failures import Failures
from coci.planning.objective import CostModel, ExpectedFailures, build_cost_model

logger = logging.getLogger(__name__)


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


def _run(
    steps: np.ndarray,
    job: Job,
    failures: Failures,
    trials: int,
    seed: int,
    stop_range: tuple[float, float] | None,
    rate: RateFunction | None,
    promote: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The vectorised event loop: one failure per trial per iteration."""
    timeline = Timeline.build(steps, job, promote)
    weight = _weight_function(rate, job)
    streams = np.random.SeedSequence(seed).spawn(4)  # the first three as before a fourth was added
    run_stream, restart_stream, stop_stream, warn_stream = (np.random.default_rng(s) for s in streams)
    notice = failures.warning_fits(job.stall_seconds + job.persist_seconds)
    stop_steps = _stop_steps(stop_range, job, trials, stop_stream)
    stop_x = stop_steps * job.step_seconds
    # checkpoints a trial takes: those before its stopping step
    last_checkpoint = np.searchsorted(timeline.steps[1:], stop_steps, side="left")
    state = _Trials.start(trials)
    tiers = _Tiers(timeline, job, failures.destroys_mask("local") & job.has_remote_tier, weight)
    iterations = 0
    while state.active.any():
        iterations += 1
        if iterations > knobs.SIMULATE_MAX_FAILURES:
            logger.warning("%d trials did not finish within %d failures", int(state.active.sum()), knobs.SIMULATE_MAX_FAILURES)
            break
        index = np.flatnonzero(state.active)
        drawn, which = failures.sample_classes(run_stream, trials)  # a full column: common random numbers
        life, node = drawn[index], tiers.destroys[which[index]]
        node = _restart_phase(state, index, life, node, tiers, failures, restart_stream)
        warned = failures.sample_warned(warn_stream, trials)[index] if notice else np.zeros(index.size, dtype=bool)
        _run_phase(state, index, life, node, tiers, stop_x, last_checkpoint, warned & ~node)
    return _metrics(state, stop_x)


def _stop_steps(stop_range: tuple[float, float] | None, job: Job, trials: int, stream: np.random.Generator) -> np.ndarray:
    """The step each trial stops at: the horizon, or drawn uniformly from a fraction range of it."""
    if stop_range is None:
        return np.full(trials, job.total_steps, dtype=np.int64)
    fractions = stream.uniform(stop_range[0], stop_range[1], trials)
    return np.clip(np.rint(fractions * job.total_steps).astype(np.int64), 1, job.total_steps)


@dataclass(frozen=True)
class _Tiers:
    """What a rollback needs: the timeline, the job, which failure classes destroy the local tier
    (all False without a remote tier) and the cumulative progress weight."""

    timeline: Timeline
    job: Job
    destroys: np.ndarray
    weight: Callable[[np.ndarray], np.ndarray]


def _restart_phase(
    state: _Trials, index: np.ndarray, life: np.ndarray, node: np.ndarray, tiers: _Tiers, failures: Failures,
    stream: np.random.Generator,
) -> np.ndarray:
    """Trials that are restarting pay the restart first; a lifetime shorter than it fails the
    restart, which starts over with a fresh lifetime (from the remote tier when that failure
    destroyed the local one). ``life`` is left with what remains; returns the class flags
    (destroys the local tier) of the lifetimes the run phase goes on with."""
    again = state.restarting[index]
    node = node.copy()
    if not again.any():
        return node
    who = index[again]
    left, left_node = life[again], node[again]
    failing = left < state.restart_cost[who]
    while failing.any():
        hit = who[failing]
        state.wall[hit] += left[failing]
        state.restart_paid[hit] += left[failing]
        state.failure_count[hit] += 1
        _to_remote(state, hit[left_node[failing]], tiers)
        drawn, which = failures.sample_classes(stream, len(state.active))
        left[failing], left_node[failing] = drawn[hit], tiers.destroys[which[hit]]
        failing = left < state.restart_cost[who]
    state.wall[who] += state.restart_cost[who]
    state.restart_paid[who] += state.restart_cost[who]
    life[again] = left - state.restart_cost[who]
    node[again] = left_node
    return node


def _to_remote(state: _Trials, hit: np.ndarray, tiers: _Tiers) -> None:
    """Trials whose local tier was just destroyed while restarting: roll back further, to the
    newest remote commit, and restore from there."""
    if hit.size == 0:
        return
    timeline, job = tiers.timeline, tiers.job
    back = state.remote_back[hit]
    target = timeline.x[back]
    state.lost[hit] += state.rollback_x[hit] - target
    state.lost_weighted[hit] += tiers.weight(state.rollback_x[hit]) - tiers.weight(target)
    state.steps_lost[hit] += np.floor(state.rollback_x[hit] / job.step_seconds + 1e-9) - np.floor(target / job.step_seconds + 1e-9)
    state.remote_restores[hit] += 1
    state.resume[hit] = back
    state.rollback_x[hit] = target
    state.floor_x[hit] = 0.0
    state.start_at[hit] = timeline.offset[back]
    state.restart_cost[hit] = job.remote_restart_seconds


def _run_phase(
    state: _Trials,
    index: np.ndarray,
    life: np.ndarray,
    node: np.ndarray,
    tiers: _Tiers,
    stop_x: np.ndarray,
    last_checkpoint: np.ndarray,
    warned: np.ndarray,
) -> None:
    """Run each trial from where it resumes: it finishes, or fails and rolls back to the newest
    checkpoint committed before the failure (on the remote tier when the failure's class destroys
    the local one); a warned failure checkpoints on its notice instead."""
    timeline, job = tiers.timeline, tiers.job
    j = state.resume[index]
    start = state.start_at[index]
    counted = np.searchsorted(timeline.snap_end[1:], start, side="right")  # snapshots already counted
    end = timeline.run_end(j, stop_x[index])
    at = start + life
    done = at >= end
    finished = index[done]
    state.wall[finished] += (end - start)[done]
    state.snapshots[finished] += last_checkpoint[finished] - counted[done]
    state.active[finished] = False

    fail = ~done
    hit, j_hit, at_hit = index[fail], j[fail], at[fail]
    state.wall[hit] += life[fail]
    state.failure_count[hit] += 1
    state.snapshots[hit] += np.searchsorted(timeline.snap_end[1:], at_hit, side="right") - counted[fail]
    state.restarting[hit] = True
    state.restart_cost[hit] = job.restart_seconds
    state.remote_back[hit] = timeline.newest_remote(at_hit, j_hit, state.remote_back[hit])
    progress = timeline.progress_at(at_hit, j_hit)

    notice = warned[fail]  # checkpoint where it is, lose nothing, go on from here after the restart
    noticed = hit[notice]
    state.wall[noticed] += job.stall_seconds + job.persist_seconds
    state.snapshots[noticed] += 1
    state.floor_x[noticed] = progress[notice]
    state.rollback_x[noticed] = progress[notice]
    state.start_at[noticed] = at_hit[notice]

    lose = ~notice
    hit, j_hit, at_hit, progress, remote = hit[lose], j_hit[lose], at_hit[lose], progress[lose], node[fail][lose]
    committed = np.searchsorted(timeline.commit, at_hit, side="right") - 1
    back = np.where(remote, state.remote_back[hit], np.maximum(committed, j_hit))
    floor = np.where(remote, 0.0, state.floor_x[hit])
    to_floor = floor > timeline.x[back]
    rollback = np.where(to_floor, floor, timeline.x[back])
    state.lost[hit] += progress - rollback
    state.lost_weighted[hit] += tiers.weight(progress) - tiers.weight(rollback)
    state.steps_lost[hit] += np.floor(progress / job.step_seconds + 1e-9) - np.floor(rollback / job.step_seconds + 1e-9)
    state.resume[hit] = back
    state.rollback_x[hit] = rollback
    state.floor_x[hit[remote]] = 0.0
    state.restart_cost[hit[remote]] = job.remote_restart_seconds
    state.remote_restores[hit[remote]] += 1
    state.start_at[hit] = np.where(to_floor, timeline.wall_at(floor, back), timeline.offset[back])


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
        "peer_restores": np.zeros_like(run),
        "unfinished": state.active.astype(float),
    }
