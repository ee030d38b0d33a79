"""The simulator's event loop, every level: a node loss restores from another node's copy.

[``coci.analysis.simulate.simulate``][coci.simulate] plays every plan here (``run_levels``): all trials
advance together, one failure per iteration, through restarts and the levels the job has (the
local tier, the peer copies when the plan has ``peer_seconds``, the remote tier when it has
``upload_seconds``); the job and its failure-free timeline are those of
``coci.analysis.simulated_job``, the failure draws common random numbers (one column per
iteration for every trial).

The peer level
--------------
The copied checkpoints (``plan.peer_steps``; None copies every checkpoint) are sent to the peer
after their local commit, one at a time, each taking ``peer_seconds`` and committing on the peer at
its end; each costs training ``peer_interference_seconds``, charged as extra stall at its snapshot
(as an upload's interference is). A copy in flight at a failure (of any class) is lost and not
retried, as an upload is. Each failure restores from the level its class leaves:

* a class that destroys nothing: the newest local commit (the notice rules of the module above);
* one that destroys the local tier only (one node lost): the newest commit on the peer level (or on
  the remote tier when that is newer), in ``peer_restart_seconds``;
* one that destroys the peer copies too (several nodes at once): the newest remote commit, in
  ``remote_restart_seconds``; the peer level then holds nothing newer than that checkpoint.

A job without a remote tier restores the last kind from the peer level too (planned so; noted by
the planner), a job with neither from the local tier (as without classes). A warning saves only the
first kind (a checkpoint taken on a notice is local). Failures during a restart roll back further
when their class destroys more. Approximation: the copies a lost node held for its neighbour are
taken to be restored with the restore (each node's own local files survive a single node loss, and
every node resumes from the restored checkpoint); a second node loss hitting that very neighbour
before its next copy commits is not played.

A level above the remote tier (``Plan.higher_steps``, ``Job.higher_levels``) is played the same way,
over any subset of the peer and remote levels below it: its transfers start at the local commit,
one at a time, its interference charged at the snapshot; a class that destroys the levels below it
(the remote tier too, or what the job has of the peer and remote levels) restores from its newest
commit (or a newer one above it), in its ``restart``, and leaves nothing newer on the levels below.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from coci import knobs
from coci.analysis.simulated_job import Job, Timeline
from coci.planning.failures import Failures
from coci.planning.levels import Level
from coci.planning.objective import CostModel, ExpectedFailures, RateFunction, build_cost_model
from coci.planning.records import Plan

__all__ = ["copied", "restore_levels", "run_levels"]

logger = logging.getLogger(__name__)

#: Where a failure restores from (``restore_levels``).
LOCAL, PEER, REMOTE = 0, 1, 2


def copied(plan: Plan | None, steps: np.ndarray, promote: np.ndarray | None, notes: list[str]) -> np.ndarray:
    """The copied steps: the plan's ``peer_steps`` where it chose them for these steps (and they
    hold every promoted one), else every checkpoint."""
    chosen = None if plan is None or plan.peer_steps is None else np.asarray(plan.peer_steps, dtype=np.int64)
    nested = chosen is not None and np.all(np.isin(chosen, steps)) and (promote is None or np.all(np.isin(promote, chosen)))
    if chosen is None or not nested:
        notes.append("every checkpoint copied to a peer")
        return steps
    return chosen


def restore_levels(failures: Failures, job: Job) -> np.ndarray:
    """Per class index (as [``Failures.sample_classes``][coci.Failures.sample_classes] returns it): the level a failure of that
    class restores from (``LOCAL``, ``PEER``, ``REMOTE``, or ``REMOTE + k`` for the ``k``-th level
    above the remote tier), given the levels the job has (module docstring): the lowest level the
    job has above the ones the class destroys (restore rank above its ``depth``), else the job's top
    level."""
    ranks = sorted({int(Level.LOCAL), *(record.rank for record in job.levels)})
    depth = np.asarray([c.depth for c in failures.failure_classes], dtype=np.int64)
    codes = np.full(depth.size, ranks[-1] - 1, dtype=np.int64)
    for rank in reversed(ranks):
        codes = np.where(depth < rank, rank - 1, codes)
    return codes


@dataclass(frozen=True)
class _Levels:
    """What a rollback needs: the timeline (the peer commits in it), the job, each class's restore
    level and the cumulative progress weight."""

    timeline: Timeline
    job: Job
    source: np.ndarray
    weight: Callable[[np.ndarray], np.ndarray]


@dataclass
class _PeerState:
    """Per-trial peer-level figures next to ``_Trials``."""

    back: np.ndarray  # index of the newest checkpoint committed on the peer level
    restores: np.ndarray
    higher: list[np.ndarray]  # per level above the remote tier: its newest committed checkpoint index


def run_levels(
    steps: np.ndarray,
    job: Job,
    failures: Failures,
    trials: int,
    seed: int,
    stop_range: tuple[float, float] | None,
    rate: RateFunction | None,
    promote: np.ndarray | None,
    copies: np.ndarray | None,
    higher: Sequence[np.ndarray] = (),
) -> dict[str, np.ndarray]:
    """The vectorised event loop: one failure per trial per iteration (module docstring); ``copies``
    None without a peer level; ``higher`` each level above the remote tier's steps."""
    timeline = Timeline.build(steps, job, promote, copies, higher)
    levels = _Levels(timeline, job, restore_levels(failures, job), _weight_function(rate, job))
    streams = np.random.SeedSequence(seed).spawn(4)  # the first three as before a fourth was added
    run_stream, restart_stream, stop_stream, warn_stream = (np.random.default_rng(s) for s in streams)
    notice = failures.warning_fits(job.stall_seconds + job.persist_seconds)
    stop_steps = _stop_steps(stop_range, job, trials, stop_stream)
    stop_x = stop_steps * job.step_seconds
    last_checkpoint = np.searchsorted(timeline.steps[1:], stop_steps, side="left")
    state = _Trials.start(trials)
    peers = _PeerState(np.zeros(trials, dtype=np.int64), np.zeros(trials), [np.zeros(trials, dtype=np.int64) for _ in higher])
    iterations = 0
    while state.active.any():
        iterations += 1
        if iterations > knobs.SIMULATE_MAX_FAILURES:
            logger.warning("%d trials did not finish within %d failures", int(state.active.sum()), knobs.SIMULATE_MAX_FAILURES)
            break
        index = np.flatnonzero(state.active)
        drawn, which = failures.sample_classes(run_stream, trials)  # a full column: common random numbers
        life, source = drawn[index], levels.source[which[index]]
        source = _restart_phase(state, peers, index, life, source, levels, failures, restart_stream)
        warned = failures.sample_warned(warn_stream, trials)[index] if notice else np.zeros(index.size, dtype=bool)
        _run_phase(state, peers, index, life, source, levels, stop_x, last_checkpoint, warned & (source == LOCAL))
    return {**_metrics(state, stop_x), "peer_restores": peers.restores}


def _weight_function(rate: RateFunction | None, job: Job) -> Callable[[np.ndarray], np.ndarray]:
    """``W(x)``: cumulative progress weight (s) at progress ``x`` (s), via ``coci.planning.objective``."""
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


def _restart_phase(
    state: _Trials, peers: _PeerState, index: np.ndarray, life: np.ndarray, source: np.ndarray, levels: _Levels,
    failures: Failures, stream: np.random.Generator,
) -> np.ndarray:
    """Trials that are restarting pay the restart first; a lifetime shorter than it fails the
    restart, which starts over with a fresh lifetime, from further back when its class destroys
    more (``_roll_back``). ``life`` is left with what remains; returns the restore levels of the
    lifetimes the run phase goes on with."""
    again = state.restarting[index]
    source = source.copy()
    if not again.any():
        return source
    who = index[again]
    left, left_source = life[again], source[again]
    failing = left < state.restart_cost[who]
    while failing.any():
        hit = who[failing]
        state.wall[hit] += left[failing]
        state.restart_paid[hit] += left[failing]
        state.failure_count[hit] += 1
        for level in (PEER, REMOTE, *range(REMOTE + 1, REMOTE + 1 + len(peers.higher))):
            _roll_back(state, peers, hit[left_source[failing] == level], level, levels)
        drawn, which = failures.sample_classes(stream, len(state.active))
        left[failing], left_source[failing] = drawn[hit], levels.source[which[hit]]
        failing = left < state.restart_cost[who]
    state.wall[who] += state.restart_cost[who]
    state.restart_paid[who] += state.restart_cost[who]
    life[again] = left - state.restart_cost[who]
    source[again] = left_source
    return source


def _roll_back(state: _Trials, peers: _PeerState, hit: np.ndarray, level: int, levels: _Levels) -> None:
    """Trials that lost ``level`` while restarting: roll back further, to the newest commit that
    survived (never newer than the restore under way: every level's commits follow the local
    ones), and restore from there."""
    if hit.size == 0:
        return
    timeline, job = levels.timeline, levels.job
    back = _surviving(state, peers, hit, level)
    target = timeline.x[back]
    state.lost[hit] += state.rollback_x[hit] - target
    state.lost_weighted[hit] += levels.weight(state.rollback_x[hit]) - levels.weight(target)
    state.steps_lost[hit] += np.floor(state.rollback_x[hit] / job.step_seconds + 1e-9) - np.floor(target / job.step_seconds + 1e-9)
    state.resume[hit] = back
    state.rollback_x[hit] = target
    state.floor_x[hit] = 0.0
    state.start_at[hit] = timeline.offset[back]
    _restore_cost(state, peers, hit, level, job)


def _surviving(state: _Trials, peers: _PeerState, hit: np.ndarray, level: int) -> np.ndarray:
    """The newest checkpoint index on ``level`` or a level above it (the levels nest)."""
    newest = state.remote_back[hit] if level == REMOTE else np.maximum(peers.back[hit], state.remote_back[hit])
    if level > REMOTE:
        newest = peers.higher[level - REMOTE - 1][hit]
    for above in range(max(level, REMOTE) - REMOTE, len(peers.higher)):
        newest = np.maximum(newest, peers.higher[above][hit])
    return newest


def _restore_cost(state: _Trials, peers: _PeerState, hit: np.ndarray, level: int, job: Job) -> None:
    """Trials restoring from ``level``: its restart cost and count; a remote restore leaves nothing
    newer on the peer level."""
    if level > REMOTE:  # the levels below lost: nothing newer on them than the restored checkpoint
        restored = _surviving(state, peers, hit, level)
        record = job.higher_levels[level - REMOTE - 1]
        state.restart_cost[hit] = 0.0 if record.restart is None else record.restart
        state.remote_back[hit] = np.minimum(state.remote_back[hit], restored)
        peers.back[hit] = np.minimum(peers.back[hit], restored)
        for below in range(level - REMOTE - 1):
            peers.higher[below][hit] = np.minimum(peers.higher[below][hit], restored)
    elif level == REMOTE:
        state.restart_cost[hit] = job.level_restart(Level.REMOTE)
        state.remote_restores[hit] += 1
        peers.back[hit] = np.minimum(peers.back[hit], state.remote_back[hit])
    else:
        state.restart_cost[hit] = job.level_restart(Level.PEER)
        peers.restores[hit] += 1


def _run_phase(
    state: _Trials, peers: _PeerState, index: np.ndarray, life: np.ndarray, source: np.ndarray, levels: _Levels,
    stop_x: np.ndarray, last_checkpoint: np.ndarray, warned: np.ndarray,
) -> None:
    """Run each trial from where it resumes: it finishes, or fails and rolls back to the newest
    checkpoint committed on the level its class leaves (``LOCAL``: the newest local commit); a
    warned failure checkpoints on its notice instead."""
    timeline, job = levels.timeline, levels.job
    j = state.resume[index]
    start = state.start_at[index]
    counted = np.searchsorted(timeline.snap_end[1:], start, side="right")
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
    peers.back[hit] = timeline.newest_peer(at_hit, j_hit, peers.back[hit])
    for index_above, backs in enumerate(peers.higher):
        backs[hit] = timeline.newest_higher(index_above, at_hit, j_hit, backs[hit])
    progress = timeline.progress_at(at_hit, j_hit)

    notice = warned[fail]
    noticed = hit[notice]
    state.wall[noticed] += job.stall_seconds + job.persist_seconds
    state.snapshots[noticed] += 1
    state.floor_x[noticed] = progress[notice]
    state.rollback_x[noticed] = progress[notice]
    state.start_at[noticed] = at_hit[notice]

    lose = ~notice
    hit, j_hit, at_hit, progress, level = hit[lose], j_hit[lose], at_hit[lose], progress[lose], source[fail][lose]
    committed = np.searchsorted(timeline.commit, at_hit, side="right") - 1
    local_back = np.maximum(committed, j_hit)
    back = np.where(level == REMOTE, state.remote_back[hit], np.where(level == PEER, _surviving(state, peers, hit, PEER), local_back))
    for above in range(REMOTE + 1, REMOTE + 1 + len(peers.higher)):
        back = np.where(level == above, _surviving(state, peers, hit, above), back)
    floor = np.where(level == LOCAL, state.floor_x[hit], 0.0)
    to_floor = floor > timeline.x[back]
    rollback = np.where(to_floor, floor, timeline.x[back])
    state.lost[hit] += progress - rollback
    state.lost_weighted[hit] += levels.weight(progress) - levels.weight(rollback)
    state.steps_lost[hit] += np.floor(progress / job.step_seconds + 1e-9) - np.floor(rollback / job.step_seconds + 1e-9)
    state.resume[hit] = back
    state.rollback_x[hit] = rollback
    state.floor_x[hit[level != LOCAL]] = 0.0
    for restored in (PEER, REMOTE, *range(REMOTE + 1, REMOTE + 1 + len(peers.higher))):
        _restore_cost(state, peers, hit[level == restored], restored, job)
    state.start_at[hit] = np.where(to_floor, timeline.wall_at(floor, back), timeline.offset[back])
