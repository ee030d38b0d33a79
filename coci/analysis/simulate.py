"""Monte Carlo replay of a training job under failures: what a checkpoint schedule really costs.

:func:`simulate` takes a :class:`coci.Plan` (or a checkpoint policy replayed online) and plays the
job ``trials`` times against a failure model, counting what fault tolerance really cost: it is the
ground truth the planner's first-order model (:mod:`coci.planning.objective`) is checked against, and what the
report and ``benchmarks/schedule_quality.py`` show with confidence intervals.

The job (one trial)
-------------------
Steps take ``t`` seconds each (the plan's ``step_seconds``); the run is ``N = total_steps`` steps.
After a planned step the job *snapshots*: training is blocked ``S = stall_seconds``; then the
checkpoint *persists* in the background for ``P = persist_seconds`` of wall time and **commits** at
its end. While a persist runs, steps are slower by the ratio ``r = P / (P - I)`` (``I`` =
``interference_seconds``, the extra wall time one persist costs: the profiler's
``P (1 - 1/r)``), so a checkpoint costs training ``C = S + I`` in all. At most one persist is in
flight: a snapshot due before the previous commit waits for it (the wait counts as stall).

Failures are drawn from the failure model (:meth:`coci.Failures.sample`): a lifetime is drawn at
each (re)start, so a Weibull hazard restarts its clock at every restart. They strike at any moment:
during training, a stall, re-executed work, or a restart. A failure rolls the job back to its last
**committed** checkpoint (one whose persist had finished; a failure during a persist loses that
checkpoint), then the job restarts: ``R = restart_seconds`` of wall time (a failure during the
restart starts it over), then training resumes from the checkpoint's step, with no persist in
flight, and checkpoints again at the planned steps.

Warned failures (:meth:`coci.Failures.warned`): each failure is warned with the model's
``warned_fraction`` (an independent draw). When a checkpoint fits in the warning (``S + P <= W``)
a warned failure is a notice: the job checkpoints where it is (``S + P`` of wall time, training
stopped; counted as a checkpoint) and restarts (``R``) from there, losing no work; its later
unwarned failures roll back to that checkpoint or a newer committed one. The replay treats the
notice as a pause of the timeline (a persist in flight at the notice is taken to commit in it).
A warning the checkpoint does not fit makes the failure an unwarned one. Exploratory jobs (``termination``) stop each
trial early, at a uniformly drawn fraction of the run.

Failure classes and tiers
-------------------------
With a remote tier (the plan's ``upload_seconds``) and failure classes (:meth:`coci.Failures.compose`)
the replay plays both tiers. The promoted checkpoints (``plan.promote_steps``; None promotes every
checkpoint) upload in the background after their local commit, one at a time, each taking
``upload_seconds`` and committing remotely at its end; each costs training
``upload_interference_seconds``, charged as extra stall at its snapshot. Each failure's class is
drawn with it (:meth:`coci.Failures.sample_classes`). A failure of a class that destroys the local
tier (also during a restart) rolls back to the newest *remote* commit and restarts in
``remote_restart_seconds``; any other failure rolls back to the newest local commit as above. An
upload in flight at a failure (of any class: the uploading process dies) is lost and not retried,
and a checkpoint taken on a notice lives on the local tier only, so a warned failure of a class
that destroys the local tier strikes as an unwarned one (the planner plans for it so). Without a remote tier every
failure restores locally, as without classes.

Metrics, per trial
------------------
* ``wall_seconds``: wall-clock time minus that of a failure-free run without checkpoints of the
  same length (``wall_percent``: the same as a percentage of that run). By construction
  ``wall_seconds = checkpoint_seconds + restart_seconds + lost_seconds``:
  ``checkpoint_seconds`` is the stall, persist wait and interference actually paid (including for
  checkpoints later lost), ``restart_seconds`` the restart time paid (including interrupted
  restarts), ``lost_seconds`` the progress re-executed (work since the last commit at each failure).
* ``progress_seconds``: the planner's progress metric (the single definition in
  :mod:`coci.planning.objective`): checkpoint and restart seconds plus the lost work weighted by the progress
  weight ``w = v / v_bar`` of the *true* curve (``v_bar`` its mean over the whole run, step 0 to the
  horizon: the same normalisation as every plan, online re-plans included), i.e. ``W(failure) - W(rollback)``
  (``lost_progress_seconds``); ``progress_percent`` against the run.
* ``checkpoints`` (snapshots completed), ``failures`` (including during restarts), ``steps_lost``
  (completed steps rolled back), ``run_seconds`` (the failure-free, checkpoint-free run),
  ``remote_restores`` (failures that rolled back to the remote tier).

Each is aggregated into a mean, a standard deviation and a 95% confidence interval for the mean
(Student t). Trial ``i`` uses the ``i``-th lifetime of each draw for every schedule simulated with
the same seed (common random numbers), so differences between policies are sharper than the
separate intervals suggest; :meth:`SimulationResult.compare` gives a paired interval.

Vectorisation: the trials advance together, one failure per iteration; every iteration is a few
numpy operations over the trials (searches in the precomputed clean timeline), so the cost grows
with the number of failures per trial, not with the number of steps. A trial still running after
``knobs.SIMULATE_MAX_FAILURES`` failures (a plan whose segments span many MTBFs) is stopped and
counted in ``unfinished``.

Online re-planning (``online=True``, or a policy object): the schedule is derived by replaying the
policy step by step as :class:`coci.Session` drives it (``should_checkpoint(step)`` asked before any
re-plan at that step, so a re-plan never drops a checkpoint due now), with a profile holding the
job's costs and the loss trace seen so far (the profiler's own :class:`coci.profiler.loss_trace.LossTrace`),
so the planner sees only the past. When the policy observes, and which warm-up checkpoints are
skipped, is decided by the session's own :class:`coci.planning.cadence.Cadence`: once at warm-up
(``knobs.PLAN_WARMUP_STEPS``), after **every** commit, and ``knobs.OBSERVE_EVERY_STEPS`` steps
after the last observation; after the first plan, each only while re-planning so far has cost at
most ``knobs.PLANNING_TIME_FRACTION`` of the job's wall time. As in the session, the profile has no
step time during the profiler's warm-up (``coci.profiler.knobs.WARMUP_STEPS``), so an observation then
plans nothing and is not charged. The replay does not time the planner (that would make schedules
machine-dependent): each observation is charged ``plan_seconds`` of wall time (default
``knobs.SIMULATE_PLAN_SECONDS``, 0.3 s: a refit and a solve on 2 busy cores), and the job's wall
time at step ``s`` is the failure-free ``s t + k (S + I) + planning`` (``k`` checkpoints taken so
far; the warm-up checkpoints' stall budget is measured against ``s t + k S + planning``). The
replay observes at most once per step, where the session may observe again right after a commit's
observation that left the policy without a plan (the same inputs, so the same outcome).

Approximation: the schedule is derived once, along the failure-free progression, and every
trial replays it; a real run re-plans after each restore too (from the same curve prefix, so the
schedule differs only through the rollback point).

The true curve (``curve``): the progress weight of the metric. Per-step losses or ``(steps,
losses)`` give an empirical rate (:func:`empirical_progress_rate`: no fitted law, so a plan is not
scored by its own model); a :class:`coci.planning.fit.CurveFit` or a callable ``v(steps)`` is used as given.
Without one, the plan's own fit is used, and without that both metrics coincide.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from scipy import stats

from coci import checks, knobs
from coci.errors import ConfigError
from coci.planning.cadence import Cadence, ElapsedClock
from coci.planning.empirical import curve_pair, empirical_progress_rate
from coci.planning.failures import Failures
from coci.planning.fit import CurveFit
from coci.planning.objective import CostModel, ExpectedFailures, build_cost_model
from coci.planning.online import make_policy
from coci.planning.policy import Observation
from coci.planning.records import Plan, PlanInputs
from coci.profiler import Estimate, Profile
from coci.profiler import knobs as profiler_knobs
from coci.profiler.loss_trace import LossTrace

__all__ = [
    "METRICS",
    "MetricSummary",
    "SimulationResult",
    "daly_expected_seconds",
    "empirical_progress_rate",
    "online_schedule",
    "ratio_change",
    "simulate",
]

logger = logging.getLogger(__name__)

RateFunction = Callable[[np.ndarray], np.ndarray]

#: Per-trial metrics, in the order :meth:`SimulationResult.to_frame` lists them.
METRICS: tuple[str, ...] = (
    "wall_seconds",
    "wall_percent",
    "progress_seconds",
    "progress_percent",
    "checkpoint_seconds",
    "restart_seconds",
    "lost_seconds",
    "lost_progress_seconds",
    "checkpoints",
    "failures",
    "steps_lost",
    "run_seconds",
    "remote_restores",
)


# --- results -------------------------------------------------------------------------------------


class MetricSummary(BaseModel):
    """Mean, standard deviation and 95% confidence interval (Student t) of one metric."""

    model_config = ConfigDict(frozen=True)

    mean: float
    std: float
    ci_low: float
    ci_high: float

    @classmethod
    def of(cls, values: np.ndarray) -> MetricSummary:
        values = np.asarray(values, dtype=float)
        mean = float(values.mean())
        if values.size < 2:
            return cls(mean=mean, std=0.0, ci_low=mean, ci_high=mean)
        std = float(values.std(ddof=1))
        half = float(stats.t.ppf(0.975, values.size - 1)) * std / math.sqrt(values.size)
        return cls(mean=mean, std=std, ci_low=mean - half, ci_high=mean + half)

    @property
    def half_width(self) -> float:
        return 0.5 * (self.ci_high - self.ci_low)


class SimulationResult(BaseModel):
    """What :func:`simulate` measured: per-metric summaries, per-trial values and the schedule.

    ``metrics`` maps each name of :data:`METRICS` to its :class:`MetricSummary`; ``samples`` holds
    the per-trial values (same order for every schedule simulated with the same seed); ``steps``
    the checkpoint steps simulated (the online schedule when ``online``; ``replans`` the policy's
    observations then); ``expected`` the plan's first-order expectation (empty for an online
    schedule or an early-terminated job); ``unfinished`` trials stopped by
    ``knobs.SIMULATE_MAX_FAILURES`` (their figures are lower bounds); ``notes`` what was assumed.
    """

    model_config = ConfigDict(frozen=True)

    policy: str
    online: bool
    trials: int
    seed: int
    termination: tuple[float, float] | None
    failures: Failures
    inputs: PlanInputs
    curve: str
    steps: list[int]
    promote_steps: list[int] | None = None
    replans: int = 0
    unfinished: int = 0
    metrics: dict[str, MetricSummary]
    samples: dict[str, list[float]] = Field(repr=False)
    expected: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    def mean(self, metric: str) -> float:
        return self.metrics[_metric_name(metric)].mean

    def values(self, metric: str) -> np.ndarray:
        """Per-trial values of one metric."""
        return np.asarray(self.samples[_metric_name(metric)], dtype=float)

    def to_frame(self) -> pd.DataFrame:
        """One row per metric: ``metric, mean, std, ci_low, ci_high`` (and ``expected`` if planned)."""
        rows = []
        for name in METRICS:
            summary = self.metrics[name]
            rows.append(
                {
                    "metric": name,
                    "mean": summary.mean,
                    "std": summary.std,
                    "ci_low": summary.ci_low,
                    "ci_high": summary.ci_high,
                    "expected": self.expected.get(name, math.nan),
                }
            )
        return pd.DataFrame(rows)

    def compare(self, baseline: SimulationResult, metric: str = "progress_seconds") -> MetricSummary:
        """Relative change of the mean of ``metric`` against ``baseline``: ``mean / base - 1``,
        with a paired 95% interval (delta method on the per-trial pairs; both results must come
        from the same seed and number of trials, i.e. the same failure draws)."""
        name = _metric_name(metric)
        if baseline.trials != self.trials or baseline.seed != self.seed:
            raise ConfigError("baseline must be simulated with the same trials and seed for a paired comparison")
        ours, theirs = self.values(name), baseline.values(name)
        return ratio_change(ours, theirs)


def ratio_change(values: np.ndarray, baseline: np.ndarray) -> MetricSummary:
    """``mean(values) / mean(baseline) - 1`` with a paired delta-method 95% interval."""
    a, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if mean_b == 0:
        return MetricSummary(mean=math.nan, std=math.nan, ci_low=math.nan, ci_high=math.nan)
    ratio = mean_a / mean_b
    if a.size < 2:
        return MetricSummary(mean=ratio - 1, std=0.0, ci_low=ratio - 1, ci_high=ratio - 1)
    residual = (a - ratio * b) / mean_b  # influence function of the ratio of means
    std = float(residual.std(ddof=1))
    half = float(stats.t.ppf(0.975, a.size - 1)) * std / math.sqrt(a.size)
    return MetricSummary(mean=ratio - 1, std=std, ci_low=ratio - 1 - half, ci_high=ratio - 1 + half)


def _metric_name(metric: str) -> str:
    if metric not in METRICS:
        raise ConfigError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
    return metric


# --- the job -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """The figures of one simulated job (seconds, steps)."""

    total_steps: int
    step_seconds: float
    stall_seconds: float
    persist_seconds: float
    interference_seconds: float
    restart_seconds: float
    upload_seconds: float | None = None
    upload_interference_seconds: float = 0.0
    remote_restart_seconds: float = 0.0

    @property
    def has_remote_tier(self) -> bool:
        return self.upload_seconds is not None

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
            upload_seconds=inputs.upload_seconds,
            upload_interference_seconds=float(inputs.upload_interference_seconds or 0.0),
            remote_restart_seconds=float(
                inputs.restart_seconds if inputs.remote_restart_seconds is None else inputs.remote_restart_seconds
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
    promoted; ``-inf`` for the start); ``promoted`` the indices promoted, in order.
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

    @classmethod
    def build(cls, steps: np.ndarray, job: Job, promote: np.ndarray | None = None) -> Timeline:
        promoted = np.zeros(steps.size, dtype=bool) if promote is None else np.isin(steps, promote)
        t, persist = job.step_seconds, job.persist_seconds
        stall = job.stall_seconds + job.upload_interference_seconds * promoted  # per checkpoint
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
        remote = _remote_commits(commit, np.concatenate([[False], promoted]), job.upload_seconds)
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
        )

    def newest_remote(self, at: np.ndarray, after: np.ndarray, floor: np.ndarray) -> np.ndarray:
        """Newest checkpoint on the remote tier at (timeline) wall time ``at``: uploaded in this life
        (index above ``after``, the checkpoint it resumed from) or ``floor`` (committed earlier)."""
        if self.promoted.size == 0:
            return floor
        done = np.searchsorted(self.remote_commit[self.promoted], at, side="right") - 1
        newest = np.where(done >= 0, self.promoted[np.maximum(done, 0)], 0)
        return np.where(newest > after, np.maximum(newest, floor), floor)

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


# --- the true curve --------------------------------------------------------------------------------


def _remote_commits(commit: np.ndarray, promoted: np.ndarray, upload: float | None) -> np.ndarray:
    """Remote commit time per checkpoint: uploads start at the local commit, one at a time
    (queued behind the previous one), and take ``upload`` seconds; ``inf`` where not promoted."""
    remote = np.full(commit.size, math.inf)
    remote[0] = -math.inf
    if upload is None:
        return remote
    previous = -math.inf
    for i in np.flatnonzero(promoted).tolist():
        previous = max(float(commit[i]), previous) + upload
        remote[i] = previous
    return remote


def _true_rate(curve: Any, plan: Plan | None) -> tuple[RateFunction | None, str, list[str]]:
    """The progress rate that weighs lost work, with a description and notes."""
    if curve is None:
        if plan is not None and plan.fit is not None and plan.fit.usable:
            return plan.fit.progress_rate, f"plan's fit ({plan.fit.family})", []
        return None, "none", ["no usable curve: the progress metric equals the wall-clock metric"]
    if isinstance(curve, CurveFit):
        if not curve.usable:
            return None, "unusable CurveFit", [f"curve unusable ({curve.fallback}): progress metric = wall-clock metric"]
        return curve.progress_rate, f"CurveFit ({curve.family})", []
    if callable(curve):
        return curve, "progress-rate callable", []
    s, y = curve_pair(curve, None)
    return empirical_progress_rate(s, y), f"empirical ({s.size} points)", []


# --- online replay -------------------------------------------------------------------------------


class _RevealedTrace:
    """A loss trace revealed as training goes: a point at step ``s`` is seen from step ``s`` on."""

    def __init__(self, losses: Any) -> None:
        steps, values = (np.zeros(0), np.zeros(0)) if losses is None else curve_pair(losses, None)
        keep = steps >= 1  # the profiler counts completed steps from 1
        steps, values = steps[keep], values[keep]
        order = np.argsort(steps, kind="stable")
        self._steps, self._values = steps[order], values[order]
        self._trace = LossTrace()
        self._fed = 0

    def curve(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The profiler's curve of the points seen by ``step``."""
        end = int(np.searchsorted(self._steps, step, side="right"))
        if end > self._fed:
            self._trace.extend(self._steps[self._fed : end], self._values[self._fed : end])
            self._fed = end
        return self._trace.curve()


class _OnlineReplay:
    """A policy driven step by step as :class:`coci.Session` drives it, on the failure-free run,
    observing on a :class:`Cadence`."""

    def __init__(self, policy: Any, job: Job, trace: _RevealedTrace, cadence: Cadence, plan_seconds: float) -> None:
        self.policy = policy
        self.job = job
        self.trace = trace
        self.cadence = cadence
        self.plan_seconds = plan_seconds
        self.commit_lag = max(1, math.ceil(job.window_progress / job.step_seconds - 1e-9))  # steps a persist spans
        self.taken: list[int] = []
        self.commit_step: int | None = None  # step at which the persist in flight commits
        self.observations = 0

    def run(self) -> tuple[np.ndarray, int]:
        """``(checkpoint steps, observations)`` of the whole run."""
        for step in range(1, self.job.total_steps + 1):
            self._advance(step)
        return np.asarray(self.taken, dtype=np.int64), self.observations

    def _advance(self, step: int) -> None:
        committed = self.commit_step is not None and step >= self.commit_step
        if committed:
            self.commit_step = None
        planned = self.policy.should_checkpoint(step)  # asked before any re-plan at this step, as the session does
        if self._observe_due(step, committed):
            self._observe(step)
        last = step == self.job.total_steps
        if not last and (planned or self.policy.should_checkpoint(step)) and not self._warmup_skipped(step):
            self.taken.append(step)
            self.commit_step = step + self.commit_lag

    def _wall_clock(self, step: int, per_checkpoint: float) -> ElapsedClock:
        """Failure-free wall time at ``step``: steps, ``per_checkpoint`` seconds per checkpoint taken,
        and the planning charged so far."""
        return lambda: step * self.job.step_seconds + len(self.taken) * per_checkpoint + self.cadence.planning_seconds

    def _observe_due(self, step: int, committed: bool) -> bool:
        elapsed = self._wall_clock(step, self.job.stall_seconds + self.job.interference_seconds)
        if committed and self.cadence.observe_after_commit(elapsed):
            return True
        return self.cadence.observe_at_step(step, step, _warming_up(self.policy), elapsed)

    def _warmup_skipped(self, step: int) -> bool:
        return Cadence.skip_warmup_checkpoint(
            warming_up=_warming_up(self.policy),
            persist_in_flight=self.commit_step is not None,
            stalled_seconds=len(self.taken) * self.job.stall_seconds,
            elapsed=self._wall_clock(step, self.job.stall_seconds),
        )

    def _observe(self, step: int) -> None:
        loss_steps, losses = self.trace.curve(step)
        observation = Observation(
            step=step,
            profile=_replay_profile(self.job, step),
            loss_steps=loss_steps,
            losses=losses,
            checkpoint_steps=tuple(self.taken),
        )
        self.policy.observe(observation)
        self.observations += 1
        timed = step > profiler_knobs.WARMUP_STEPS  # before, a planning policy has no step time and returns at once
        self.cadence.record_observation(step, self.plan_seconds if timed else 0.0)


def _warming_up(policy: Any) -> bool:
    return bool(getattr(policy, "warming_up", False))


def _replay_profile(job: Job, step: int) -> Profile:
    """The profile at ``step``: the job's costs as measured values (no step time during the
    profiler's warm-up, which times no step)."""
    timed_steps = step - profiler_knobs.WARMUP_STEPS
    return Profile(
        steps=step,
        step_seconds=Estimate(value=job.step_seconds, count=timed_steps) if timed_steps >= 1 else Estimate(),
        stall_seconds=Estimate(value=job.stall_seconds, count=1),
        persist_seconds=Estimate(value=job.persist_seconds, count=1),
        interference=Estimate(value=job.slowdown, count=1),
        restore_seconds=Estimate(value=job.restart_seconds, count=1),
    )


def online_schedule(
    policy: Any,
    job: Job | PlanInputs,
    losses: Any,
    *,
    observe_every: int | None = None,
    plan_seconds: float | None = None,
) -> tuple[np.ndarray, int]:
    """Checkpoint steps a policy takes when driven as :class:`coci.Session` drives it.

    ``losses``: per-step losses or ``(steps, losses)`` (the trace training reveals; a point at
    step ``s`` is seen from step ``s`` on). Returns ``(steps, observations)``. The policy observes on
    the session's :class:`~coci.planning.cadence.Cadence` (warm-up, after each commit and every
    ``observe_every`` steps, default ``knobs.OBSERVE_EVERY_STEPS``), each observation charged
    ``plan_seconds`` against the planning-time cap; see the module docstring. The profile carries
    the job's costs as measured values.
    """
    figures = job if isinstance(job, Job) else Job.of(job)
    every = checks.optional_integer(observe_every, "observe_every", minimum=1)
    charge = checks.number(knobs.SIMULATE_PLAN_SECONDS if plan_seconds is None else plan_seconds, "plan_seconds")
    replay = _OnlineReplay(policy, figures, _RevealedTrace(losses), Cadence(observe_every=every), charge)
    return replay.run()


# --- simulate ------------------------------------------------------------------------------------


def simulate(
    plan_or_policy: Plan | Any,
    *,
    failures: Failures | str | float | None = None,
    trials: int = 1000,
    seed: int = 0,
    termination: float | tuple[float, float] | None = None,
    curve: Any = None,
    online: bool = False,
    job: Plan | PlanInputs | None = None,
    losses: Any = None,
    plan_seconds: float | None = None,
) -> SimulationResult:
    """Monte Carlo replay of a job under failures; see the module docstring for the model.

    Args:
        plan_or_policy: a :class:`coci.Plan` (its steps and recorded inputs), or a checkpoint
            policy object (``should_checkpoint``/``observe``: :func:`coci.planning.online.make_policy`,
            ``EveryN``, ...) replayed online; a policy needs ``job``.
        failures: the failure model that strikes (default: the plan's). A duration or number of
            seconds means an exponential MTBF.
        trials: Monte Carlo trials (>= 1).
        seed: seed of every random draw (results are deterministic for a seed).
        termination: exploratory jobs: a fraction ``f`` of the run, or a range ``(low, high)`` from
            which each trial's stopping fraction is drawn uniformly; None runs to the end.
        curve: the true loss curve weighing lost work (see the module docstring); default the
            plan's fit.
        online: for a plan: re-derive its policy online (:func:`online_schedule`) from the loss
            trace (``losses``, else ``curve`` when it is a trace) instead of using its steps.
        job: the job's inputs (a Plan or PlanInputs) when ``plan_or_policy`` is a policy object.
        losses: the loss trace an online policy sees (default: ``curve`` when it is a trace).
        plan_seconds: online: wall seconds charged per re-plan against the session's planning-time
            cap (default ``knobs.SIMULATE_PLAN_SECONDS``).
    """
    trials = checks.integer(trials, "trials", minimum=1)
    seed = checks.integer(seed, "seed", minimum=0)
    plan, inputs, policy_name = _target(plan_or_policy, job)
    model_failures = _failures(failures, inputs)
    job_figures = Job.of(inputs)
    if inputs.start_step != 0:
        raise ConfigError(
            f"plan.inputs.start_step must be 0 (simulate whole runs; re-plan online instead), got {inputs.start_step}"
        )
    stop_range = _termination(termination, job_figures)
    rate, curve_text, notes = _true_rate(curve, plan)

    replans = 0
    if plan is not None and not online:
        steps, expected = np.asarray(plan.steps, dtype=np.int64), _expected_percentages(plan)
    else:
        trace = _online_trace(losses if losses is not None else curve, plan, plan_or_policy, job_figures)
        policy = _online_policy(plan) if plan is not None else plan_or_policy
        steps, replans = online_schedule(policy, job_figures, trace, plan_seconds=plan_seconds)
        expected = {}
        notes.append(f"online: schedule re-derived by replaying the policy ({replans} observations, session cadence)")
    if steps.size and (steps[0] < 1 or steps[-1] > job_figures.total_steps or np.any(np.diff(steps) <= 0)):
        raise ConfigError("plan.steps must be strictly increasing within [1, total_steps]")

    promote = _promoted(plan, steps, job_figures, model_failures, notes)
    samples = _run(steps, job_figures, model_failures, trials, seed, stop_range, rate, promote)
    unfinished = int(samples.pop("unfinished").sum())
    if unfinished:
        notes.append(
            f"{unfinished} of {trials} trials did not finish within {knobs.SIMULATE_MAX_FAILURES} failures "
            "(knobs.SIMULATE_MAX_FAILURES): their overheads are lower bounds"
        )
    return SimulationResult(
        policy=policy_name,
        online=plan is None or online,
        trials=trials,
        seed=seed,
        termination=stop_range,
        failures=model_failures,
        inputs=inputs,
        curve=curve_text,
        steps=[int(s) for s in steps],
        promote_steps=None if promote is None else [int(s) for s in promote],
        replans=replans,
        unfinished=unfinished,
        metrics={name: MetricSummary.of(samples[name]) for name in METRICS},
        samples={name: samples[name].tolist() for name in METRICS},
        expected=expected if stop_range is None else {},
        notes=notes,
    )


def _promoted(plan: Plan | None, steps: np.ndarray, job: Job, failures: Failures, notes: list[str]) -> np.ndarray | None:
    """The promoted steps (None without a remote tier): the plan's ``promote_steps`` where it
    chose them for these steps, else every checkpoint."""
    if not job.has_remote_tier:
        if failures.destroying("local") is not None:
            notes.append("failure classes destroy the local tier but the job has no remote tier: every failure restores locally")
        return None
    chosen = None if plan is None or plan.promote_steps is None else np.asarray(plan.promote_steps, dtype=np.int64)
    if chosen is None or not np.all(np.isin(chosen, steps)):
        notes.append("every checkpoint promoted to the remote tier")
        return steps
    return chosen


def _expected_percentages(plan: Plan) -> dict[str, float]:
    """The plan's expected figures, with the wall and progress overheads as percentages of the run."""
    expected = {k: float(v) for k, v in plan.expected.items()}
    if "wall_seconds" in expected and expected.get("run_seconds"):
        expected["wall_percent"] = 100.0 * expected["wall_seconds"] / expected["run_seconds"]
        expected["progress_percent"] = 100.0 * expected.get("progress_seconds", math.nan) / expected["run_seconds"]
    return expected


def _online_trace(trace: Any, plan: Plan | None, target: Any, job: Job) -> Any:
    """The loss trace an online replay reveals: a trace as given, a usable fit's curve over the
    run, or None where the policy does not need one."""
    if not (trace is None or isinstance(trace, CurveFit) or callable(trace)):
        return trace
    if isinstance(trace, CurveFit) and trace.usable:
        steps = np.arange(1, job.total_steps + 1)
        return steps, trace.loss(steps)
    if _needs_trace(plan, target):
        raise ConfigError("losses: online replay needs the loss trace (per-step losses or (steps, losses))")
    return None


def _target(target: Any, job: Plan | PlanInputs | None) -> tuple[Plan | None, PlanInputs, str]:
    if isinstance(target, Plan):
        return target, target.inputs, target.policy
    if not (callable(getattr(target, "should_checkpoint", None)) and callable(getattr(target, "observe", None))):
        raise ConfigError(f"plan_or_policy must be a coci.Plan or a checkpoint policy, got {type(target).__name__}")
    if job is None:
        raise ConfigError("job is required (a Plan or PlanInputs with the job's costs) when simulating a policy object")
    inputs = job.inputs if isinstance(job, Plan) else job
    if not isinstance(inputs, PlanInputs):
        raise ConfigError(f"job must be a coci.Plan or PlanInputs, got {type(job).__name__}")
    name = getattr(target, "policy", None)
    return None, inputs, name if isinstance(name, str) else type(target).__name__


def _failures(failures: Any, inputs: PlanInputs) -> Failures:
    if failures is None:
        if inputs.failures is None:
            raise ConfigError("failures is required: the plan records no failure model")
        return inputs.failures
    if isinstance(failures, Failures):
        return failures
    if isinstance(failures, str) or checks.is_number(failures):
        return Failures.exponential(mtbf=failures)
    raise ConfigError(f"failures must be a coci.Failures or an MTBF such as '8h', got {failures!r}")


def _termination(termination: Any, job: Job) -> tuple[float, float] | None:
    if termination is None:
        return None
    if checks.is_number(termination):
        low = high = float(termination)
    elif isinstance(termination, Sequence) and len(termination) == 2:
        low, high = (float(v) for v in termination)
    else:
        raise ConfigError(f"termination must be a fraction or a (low, high) range, got {termination!r}")
    if not (0 < low <= high <= 1):
        raise ConfigError(f"termination must satisfy 0 < low <= high <= 1, got {termination!r}")
    if low * job.total_steps < 1:
        raise ConfigError(
            f"termination: a trial stopped at {low:g} of {job.total_steps} steps runs less than one step"
        )
    return (low, high)


def _needs_trace(plan: Plan | None, target: Any) -> bool:
    name = plan.policy if plan is not None else getattr(target, "policy", None)
    objective = plan.objective if plan is not None else getattr(target, "objective", None)
    return name == "coci" or (name == "auto" and objective == "progress")


def _online_policy(plan: Plan) -> Any:
    fell_back = any("time objective" in f for f in plan.fallbacks)
    objective = "progress" if fell_back else plan.objective
    inputs = plan.inputs
    return make_policy(
        plan.policy,
        failures=inputs.failures,
        total_steps=inputs.total_steps,
        restart_seconds=inputs.restart_seconds,
        objective=objective,
        time_budget=plan.time_budget,
        max_overhead=inputs.max_overhead,
    )


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
        "unfinished": state.active.astype(float),
    }


# --- theory --------------------------------------------------------------------------------------


def daly_expected_seconds(plan: Plan, failures: Failures | None = None) -> float:
    """Expected wall-clock time of a plan's run under exponential failures, in closed form.

    Daly (2006): a segment of ``a`` seconds (work plus its checkpoint's stall) that must complete
    without a failure, restarting after ``R`` seconds (failures during restarts included) takes
    ``M e^(R/M) (e^(a/M) - 1)`` in expectation, ``M`` the MTBF; the run is the sum over its
    segments (the last one has no checkpoint). Exact for the simulator's model when the checkpoint
    commits when its stall ends (``persist_seconds`` -> 0, no interference). Raises
    :class:`ConfigError` for a non-exponential failure model.
    """
    model = _failures(failures, plan.inputs)
    if not model.is_memoryless:
        raise ConfigError("failures must be exponential for Daly's closed form")
    job = Job.of(plan.inputs)
    mtbf = model.mean_seconds
    bounds = np.concatenate([[0], np.asarray(plan.steps, dtype=float), [job.total_steps]]) * job.step_seconds
    segments = np.diff(bounds)
    segments[:-1] += job.stall_seconds + job.interference_seconds
    return float(np.sum(mtbf * math.exp(job.restart_seconds / mtbf) * np.expm1(segments / mtbf)))
