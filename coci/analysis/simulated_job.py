"""The simulated job (see ``coci.analysis.simulate``): its costs taken from a plan's inputs, its
failure-free timeline, and Daly's closed-form expected run time it is checked against."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coci import checks
from coci.errors import ConfigError
from coci.planning.failures import Failures, as_failures
from coci.planning.levels import HoldsLevels, Level, LevelCosts
from coci.planning.records import Plan, PlanInputs

__all__ = ["daly_expected_seconds", "failure_model"]


@dataclass(frozen=True)
class Job(HoldsLevels):
    """The figures of one simulated job (seconds, steps); ``levels`` the storage levels above the
    local one, each with its ``restart`` resolved (``LevelCosts.restart_seconds``)."""

    total_steps: int
    step_seconds: float
    stall_seconds: float
    persist_seconds: float
    interference_seconds: float
    restart_seconds: float
    levels: tuple[LevelCosts, ...] = ()

    def interference(self, level: Level) -> float:
        """The training seconds one transfer to ``level`` costs (0 without it)."""
        record = self.level(level)
        return 0.0 if record is None else record.interference

    def level_restart(self, level: Level) -> float:
        """The restart from ``level`` (0 without it)."""
        record = self.level(level)
        return 0.0 if record is None or record.restart is None else record.restart


    @classmethod
    def of(cls, inputs: PlanInputs) -> Job:
        checks.integer(inputs.total_steps, "plan.inputs.total_steps", minimum=1)
        for name in ("step_seconds", "stall_seconds", "persist_seconds"):
            checks.number(getattr(inputs, name), f"plan.inputs.{name}", positive=True)
        for name in ("interference_seconds", "restart_seconds"):
            checks.number(getattr(inputs, name), f"plan.inputs.{name}")
        if inputs.interference_seconds >= inputs.persist_seconds:
            raise ConfigError(
                "plan.inputs.interference_seconds must be below persist_seconds (a persist of P seconds "
                f"costs P (1 - 1/r) < P), got {inputs.interference_seconds!r} >= {inputs.persist_seconds!r}"
            )
        return cls(
            total_steps=int(inputs.total_steps),
            step_seconds=float(inputs.step_seconds),
            stall_seconds=float(inputs.stall_seconds),
            persist_seconds=float(inputs.persist_seconds),
            interference_seconds=float(inputs.interference_seconds),
            restart_seconds=float(inputs.restart_seconds),
            levels=tuple(
                record.model_copy(update={"restart": float(record.restart_seconds(inputs.restart_seconds))})
                for record in inputs.levels
            ),
        )

    @property
    def run_seconds(self) -> float:
        return self.total_steps * self.step_seconds

    @property
    def slowdown(self) -> float:
        """``r``: step time while a persist runs / clean step time."""
        return self.persist_seconds / (self.persist_seconds - self.interference_seconds)

    @property
    def window_progress(self) -> float:
        """Seconds of progress made during one persist (``P / r = P - I``)."""
        return self.persist_seconds - self.interference_seconds


@dataclass(frozen=True)
class Timeline:
    """The failure-free run of one schedule, as arrays indexed by checkpoint (0 = the run's start).

    ``x[i]`` progress (s) at checkpoint ``i``'s step; ``snap_end[i]`` wall time its snapshot
    completes, ``commit[i]`` when it commits (``-inf`` for index 0: the start is always "committed");
    ``offset[i]`` the virtual wall time at which a run resumed from checkpoint ``i`` starts (its
    first interval runs clean, after that it follows this timeline); ``first_end[i]`` the wall time
    that first interval ends (checkpoint ``i + 1``'s step, or the end). ``wall_knots`` /
    ``progress_knots`` map wall time to progress (piecewise linear; flat during stalls and waits).
    ``remote_commit[i]`` is when checkpoint ``i`` commits on the remote tier (``inf``: not
    promoted; ``-inf`` for the start); ``promoted`` the indices promoted, in order; ``peer_commit``
    and ``copied`` the same for the copies to a peer, ``higher_commit[k]`` and ``higher_sent[k]``
    for each level above the remote tier (``Job.higher_levels``), its transfers queued from the local
    commit as the others are.
    """

    steps: np.ndarray
    x: np.ndarray
    snap_end: np.ndarray
    commit: np.ndarray
    offset: np.ndarray
    first_end: np.ndarray
    wall_knots: np.ndarray
    progress_knots: np.ndarray
    remote_commit: np.ndarray
    promoted: np.ndarray
    peer_commit: np.ndarray
    copied: np.ndarray
    higher_commit: tuple[np.ndarray, ...] = ()
    higher_sent: tuple[np.ndarray, ...] = ()

    @classmethod
    def build(
        cls, steps: np.ndarray, job: Job, promote: np.ndarray | None = None, copies: np.ndarray | None = None,
        higher: Sequence[np.ndarray] = (),
    ) -> Timeline:
        promoted = np.zeros(steps.size, dtype=bool) if promote is None else np.isin(steps, promote)
        copied = np.zeros(steps.size, dtype=bool) if copies is None else np.isin(steps, copies)
        sent = [np.isin(steps, subset) for subset in higher]
        t, persist = job.step_seconds, job.persist_seconds
        stall = job.stall_seconds + job.interference(Level.REMOTE) * promoted + job.interference(Level.PEER) * copied
        for record, mask in zip(job.higher_levels, sent):
            stall = stall + record.interference * mask
        r, q = job.slowdown, job.window_progress
        horizon = job.run_seconds
        x = steps.astype(float) * t
        n = x.size
        bounds = np.concatenate([[0.0], x, [horizon]])  # progress at start, checkpoints, end
        gaps = np.diff(bounds)  # gaps[i]: progress from checkpoint i (0 = start) to the next bound
        # E[i]: wall time at the end of checkpoint i's step (before its stall), i = 1..n
        increments = stall[: n - 1] + persist + np.maximum(0.0, gaps[1:n] - q) if n else np.zeros(0)
        snap_step = np.concatenate([[0.0], x[:1], x[:1] + np.cumsum(increments)]) if n else np.zeros(1)
        snap_step = snap_step[: n + 1]
        if n:
            last_gap = gaps[n]
            tail = last_gap * r if last_gap < q else persist + last_gap - q
            end = snap_step[n] + stall[-1] + tail
        else:
            end = horizon
        snap_end = np.concatenate([[-math.inf], snap_step[1:] + stall])
        commit = np.concatenate([[-math.inf], snap_step[1:] + stall + persist])
        next_bound_wall = np.concatenate([snap_step[1:], [end]])  # wall at the next checkpoint's step / end
        offset = next_bound_wall - gaps  # resumed run: clean progress up to the next bound
        offset[0] = 0.0
        # wall -> progress knots of the failure-free run
        wall = [np.zeros(1)]
        progress = [np.zeros(1)]
        if n:
            window = np.minimum(gaps[1:], q)  # progress inside each persist window
            per = np.stack(
                [snap_step[1:], snap_step[1:] + stall, snap_step[1:] + stall + window * r], axis=1
            )
            prog = np.stack([x, x, x + window], axis=1)
            wall.append(per.reshape(-1))
            progress.append(prog.reshape(-1))
        wall.append(np.array([end]))
        progress.append(np.array([horizon]))
        remote = _remote_commits(commit, np.concatenate([[False], promoted]), job.level(Level.REMOTE))
        peer = _remote_commits(commit, np.concatenate([[False], copied]), job.level(Level.PEER))
        highs = tuple(_remote_commits(commit, np.concatenate([[False], mask]), record) for record, mask in zip(job.higher_levels, sent))
        return cls(
            steps=np.concatenate([[0], steps]).astype(np.int64),
            x=np.concatenate([[0.0], x]),
            snap_end=snap_end,
            commit=commit,
            offset=offset,
            first_end=next_bound_wall,
            wall_knots=np.concatenate(wall),
            progress_knots=np.concatenate(progress),
            remote_commit=remote,
            promoted=np.flatnonzero(np.isfinite(remote[1:])) + 1,
            peer_commit=peer,
            copied=np.flatnonzero(np.isfinite(peer[1:])) + 1,
            higher_commit=highs,
            higher_sent=tuple(np.flatnonzero(np.isfinite(high[1:])) + 1 for high in highs),
        )

    def newest_higher(self, index: int, at: np.ndarray, after: np.ndarray, floor: np.ndarray) -> np.ndarray:
        """``newest_remote`` on the ``index``-th level above the remote tier."""
        return _newest(self.higher_commit[index], self.higher_sent[index], at, after, floor)

    def newest_remote(self, at: np.ndarray, after: np.ndarray, floor: np.ndarray) -> np.ndarray:
        """Newest checkpoint on the remote tier at (timeline) wall time ``at``: uploaded in this life
        (index above ``after``, the checkpoint it resumed from) or ``floor`` (committed earlier)."""
        return _newest(self.remote_commit, self.promoted, at, after, floor)

    def newest_peer(self, at: np.ndarray, after: np.ndarray, floor: np.ndarray) -> np.ndarray:
        """``newest_remote`` on the peer level."""
        return _newest(self.peer_commit, self.copied, at, after, floor)

    def progress_at(self, wall: np.ndarray, resumed_from: np.ndarray) -> np.ndarray:
        """Progress reached at (timeline) wall time ``wall`` by a run resumed from checkpoint ``j``."""
        clean = self.x[resumed_from] + (wall - self.offset[resumed_from])
        return np.where(wall < self.first_end[resumed_from], clean, np.interp(wall, self.wall_knots, self.progress_knots))

    def wall_to_reach(self, progress: np.ndarray) -> np.ndarray:
        """First (timeline) wall time at which the failure-free run reaches ``progress``."""
        p = np.asarray(progress, dtype=float)
        knots_p, knots_w = self.progress_knots, self.wall_knots
        index = np.clip(np.searchsorted(knots_p, p, side="left"), 1, knots_p.size - 1)
        p0, p1 = knots_p[index - 1], knots_p[index]
        w0, w1 = knots_w[index - 1], knots_w[index]
        slope = np.where(p1 > p0, (w1 - w0) / np.where(p1 > p0, p1 - p0, 1.0), 0.0)
        return np.where(p <= 0, 0.0, w0 + (p - p0) * slope)

    def wall_at(self, progress: np.ndarray, resumed_from: np.ndarray) -> np.ndarray:
        """(Timeline) wall time at which a run resumed from checkpoint ``j`` reaches ``progress``."""
        return self.run_end(resumed_from, progress)

    def run_end(self, resumed_from: np.ndarray, stop: np.ndarray) -> np.ndarray:
        """Wall time at which a run resumed from checkpoint ``j`` reaches progress ``stop``."""
        next_x = np.append(self.x, math.inf)[resumed_from + 1]
        clean = self.offset[resumed_from] + (stop - self.x[resumed_from])
        return np.where(stop <= next_x, clean, self.wall_to_reach(stop))


def _newest(commits: np.ndarray, sent: np.ndarray, at: np.ndarray, after: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Newest of the checkpoints ``sent`` (indices, in order) whose ``commits`` time is at or before
    ``at``: where above ``after``, the larger of it and ``floor``; else ``floor``."""
    if sent.size == 0:
        return floor
    done = np.searchsorted(commits[sent], at, side="right") - 1
    newest = np.where(done >= 0, sent[np.maximum(done, 0)], 0)
    return np.where(newest > after, np.maximum(newest, floor), floor)


def _remote_commits(commit: np.ndarray, promoted: np.ndarray, level: LevelCosts | None) -> np.ndarray:
    """Commit time per checkpoint on ``level``: transfers start at the local commit, one at a time
    (queued behind the previous one), and take ``level.seconds``; ``inf`` where not sent."""
    remote = np.full(commit.size, math.inf)
    remote[0] = -math.inf
    if level is None or level.seconds is None:
        return remote
    upload = level.seconds
    previous = -math.inf
    for i in np.flatnonzero(promoted).tolist():
        previous = max(float(commit[i]), previous) + upload
        remote[i] = previous
    return remote


def failure_model(failures: Any, inputs: PlanInputs) -> Failures:
    if failures is None:
        if inputs.failures is None:
            raise ConfigError("failures is required: the plan records no failure model")
        return inputs.failures
    return as_failures(failures)


def daly_expected_seconds(plan: Plan, failures: Failures | None = None) -> float:
    """Expected wall-clock time of a plan's run under exponential failures, in closed form.

    Daly (2006): a segment of ``a`` seconds (work plus its checkpoint's stall) that must complete
    without a failure, restarting after ``R`` seconds (failures during restarts included) takes
    ``M e^(R/M) (e^(a/M) - 1)`` in expectation, ``M`` the MTBF; the run is the sum over its
    segments (the last one has no checkpoint). Exact for the simulator's model when the checkpoint
    commits when its stall ends (``persist_seconds`` -> 0, no interference). Raises
    [``ConfigError``][coci.ConfigError] for a non-exponential failure model.
    """
    model = failure_model(failures, plan.inputs)
    if not model.is_memoryless:
        raise ConfigError("failures must be exponential for Daly's closed form")
    job = Job.of(plan.inputs)
    mtbf = model.mean_seconds
    bounds = np.concatenate([[0], np.asarray(plan.steps, dtype=float), [job.total_steps]]) * job.step_seconds
    segments = np.diff(bounds)
    segments[:-1] += job.stall_seconds + job.interference_seconds
    return float(np.sum(mtbf * math.exp(job.restart_seconds / mtbf) * np.expm1(segments / mtbf)))
