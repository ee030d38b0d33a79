"""Monte Carlo replay of a training job under failures: what a checkpoint schedule really costs.

[``simulate``][coci.simulate] takes a [``coci.Plan``][coci.Plan] (or a checkpoint policy replayed online) and plays the
job ``trials`` times against a failure model, counting what fault tolerance really cost: it is the
ground truth the planner's first-order model (``coci.planning.objective``) is checked against, and what the
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

Failures are drawn from the failure model ([``coci.Failures.sample``][coci.Failures.sample]): a lifetime is drawn at
each (re)start, so a Weibull hazard restarts its clock at every restart. They strike at any moment:
during training, a stall, re-executed work, or a restart. A failure rolls the job back to its last
**committed** checkpoint (one whose persist had finished; a failure during a persist loses that
checkpoint), then the job restarts: ``R = restart_seconds`` of wall time (a failure during the
restart starts it over), then training resumes from the checkpoint's step, with no persist in
flight, and checkpoints again at the planned steps.

Warned failures ([``coci.Failures.warned``][coci.Failures.warned]): each failure is warned with the model's
``warned_fraction`` (an independent draw). When a checkpoint fits in the warning (``S + P <= W``)
a warned failure is a notice: the job checkpoints where it is (``S + P`` of wall time, training
stopped; counted as a checkpoint) and restarts (``R``) from there, losing no work; its later
unwarned failures roll back to that checkpoint or a newer committed one. The replay treats the
notice as a pause of the timeline (a persist in flight at the notice is taken to commit in it).
A warning the checkpoint does not fit makes the failure an unwarned one. Exploratory jobs (``termination``) stop each
trial early, at a uniformly drawn fraction of the run.

Failure classes and tiers
-------------------------
With a remote tier (the plan's ``upload_seconds``) and failure classes ([``coci.Failures.compose``][coci.Failures.compose])
the replay plays both tiers. The promoted checkpoints (``plan.promote_steps``; None promotes every
checkpoint) upload in the background after their local commit, one at a time, each taking
``upload_seconds`` and committing remotely at its end; each costs training
``upload_interference_seconds``, charged as extra stall at its snapshot. Each failure's class is
drawn with it ([``coci.Failures.sample_classes``][coci.Failures.sample_classes]). A failure of a class that destroys the local
tier (also during a restart) rolls back to the newest *remote* commit and restarts in
``remote_restart_seconds``; any other failure rolls back to the newest local commit as above. An
upload in flight at a failure (of any class: the uploading process dies) is lost and not retried,
and a checkpoint taken on a notice lives on the local tier only, so a warned failure of a class
that destroys the local tier strikes as an unwarned one (the planner plans for it so). Without a remote tier every
failure restores locally, as without classes. With a peer level (the plan's ``peer_seconds``) a
node loss restores from a peer's copy (``coci.analysis.simulate_levels``, the event loop of
every replay).

Metrics, per trial
------------------
* ``wall_seconds``: wall-clock time minus that of a failure-free run without checkpoints of the
  same length (``wall_percent``: the same as a percentage of that run). By construction
  ``wall_seconds = checkpoint_seconds + restart_seconds + lost_seconds``:
  ``checkpoint_seconds`` is the stall, persist wait and interference actually paid (including for
  checkpoints later lost), ``restart_seconds`` the restart time paid (including interrupted
  restarts), ``lost_seconds`` the progress re-executed (work since the last commit at each failure).
* ``progress_seconds``: the planner's progress metric (the single definition in
  ``coci.planning.objective``): checkpoint and restart seconds plus the lost work weighted by the progress
  weight ``w = v / v_bar`` of the *true* curve (``v_bar`` its mean over the whole run, step 0 to the
  horizon: the same normalisation as every plan, online re-plans included), i.e. ``W(failure) - W(rollback)``
  (``lost_progress_seconds``); ``progress_percent`` against the run.
* ``checkpoints`` (snapshots completed), ``failures`` (including during restarts), ``steps_lost``
  (completed steps rolled back), ``run_seconds`` (the failure-free, checkpoint-free run),
  ``remote_restores`` (failures that rolled back to the remote tier), ``peer_restores`` (to a
  peer's copy).

Each is aggregated into a mean, a standard deviation and a 95% confidence interval for the mean
(Student t). Trial ``i`` uses the ``i``-th lifetime of each draw for every schedule simulated with
the same seed (common random numbers), so differences between policies are sharper than the
separate intervals suggest; [``SimulationResult.compare``][coci.analysis.simulate.SimulationResult.compare] gives a paired interval.

Vectorisation: the trials advance together, one failure per iteration; every iteration is a few
numpy operations over the trials (searches in the precomputed clean timeline), so the cost grows
with the number of failures per trial, not with the number of steps. A trial still running after
``knobs.SIMULATE_MAX_FAILURES`` failures (a plan whose segments span many MTBFs) is stopped and
counted in ``unfinished``.

Online re-planning (``online=True``, or a policy object): the schedule is derived by replaying the
policy step by step as [``coci.Session``][coci.Session] drives it (``should_checkpoint(step)`` asked before any
re-plan at that step, so a re-plan never drops a checkpoint due now), with a profile holding the
job's costs and the loss trace seen so far (the profiler's own ``coci.profiler.loss_trace.LossTrace``),
so the planner sees only the past. When the policy observes, and which warm-up checkpoints are
skipped, is decided by the session's own ``coci.planning.cadence.Cadence``: once at warm-up
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
observation that left the policy without a plan (the same inputs, so the same outcome). With levels
above the local one the replay sends each checkpoint where the plan in effect sends it and each
observation carries every level's copy history (``LevelCosts.taken_steps``; ``last_step`` the
newest sent, committed or in flight: ``coci.analysis.online_replay``); the
trials then play those copies (``SimulationResult.promote_steps``, ``peer_steps``, ``higher_steps``).

Approximation: the schedule is derived once, along the failure-free progression, and every
trial replays it; a real run re-plans after each restore too (from the same curve prefix, so the
schedule differs only through the rollback point).

The true curve (``curve``): the progress weight of the metric. Per-step losses or ``(steps,
losses)`` give an empirical rate (``empirical_progress_rate``: no fitted law, so a plan is not
scored by its own model); a [``coci.planning.fit.CurveFit``][coci.CurveFit] or a callable ``v(steps)`` is used as given.
Without one, the plan's own fit is used, and without that both metrics coincide."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from coci import checks, knobs
from coci.analysis.online_replay import online_policy, online_run, online_schedule, online_trace
from coci.analysis.simulate_levels import copied, run_levels
from coci.analysis.simulated_job import Job, daly_expected_seconds, failure_model
from coci.analysis.simulation_results import METRICS, MetricSummary, SimulationResult, ratio_change
from coci.errors import ConfigError
from coci.planning.arguments import CurveLike, FailuresLike
from coci.planning.empirical import curve_pair, empirical_progress_rate
from coci.planning.failures import Failures, check_survivable
from coci.planning.fit import CurveFit, LossCurve
from coci.planning.levels import Level
from coci.planning.objective import RateFunction
from coci.planning.policy import CheckpointPolicy
from coci.planning.records import Plan, PlanInputs

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


def _true_rate(curve: CurveLike | None, plan: Plan | None) -> tuple[RateFunction | None, str, list[str]]:
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


def simulate(
    plan_or_policy: Plan | CheckpointPolicy,
    *,
    failures: FailuresLike | None = None,
    trials: int = 1000,
    seed: int = 0,
    termination: float | tuple[float, float] | None = None,
    curve: CurveLike | None = None,
    online: bool = False,
    job: Plan | PlanInputs | None = None,
    losses: LossCurve | None = None,
    plan_seconds: float | None = None,
) -> SimulationResult:
    """Monte Carlo replay of a job under failures; see the module docstring for the model.

    Args:
        plan_or_policy: a [``coci.Plan``][coci.Plan] (its steps and recorded inputs), or a checkpoint
            policy object (``should_checkpoint``/``observe``: ``coci.planning.online.make_policy``,
            ``EveryN``, ...) replayed online; a policy needs ``job``.
        failures: the failure model that strikes (default: the plan's). A duration or number of
            seconds means an exponential MTBF.
        trials: Monte Carlo trials (>= 1).
        seed: seed of every random draw (results are deterministic for a seed).
        termination: exploratory jobs: a fraction ``f`` of the run, or a range ``(low, high)`` from
            which each trial's stopping fraction is drawn uniformly; None runs to the end.
        curve: the true loss curve weighing lost work (see the module docstring); default the
            plan's fit.
        online: for a plan: re-derive its policy online (``online_schedule``) from the loss
            trace (``losses``, else ``curve`` when it is a trace) instead of using its steps.
        job: the job's inputs (a Plan or PlanInputs) when ``plan_or_policy`` is a policy object.
        losses: the loss trace an online policy sees (default: ``curve`` when it is a trace).
        plan_seconds: online: wall seconds charged per re-plan against the session's planning-time
            cap (default ``knobs.SIMULATE_PLAN_SECONDS``).
    """
    trials = checks.integer(trials, "trials", minimum=1)
    seed = checks.integer(seed, "seed", minimum=0)
    plan, inputs, policy_name = _target(plan_or_policy, job)
    model_failures = failure_model(failures, inputs)
    job_figures = Job.of(inputs)
    check_survivable(model_failures, max((level.rank for level in job_figures.levels), default=int(Level.LOCAL)))
    if inputs.start_step != 0:
        raise ConfigError(
            f"plan.inputs.start_step must be 0 (simulate whole runs; re-plan online instead), got {inputs.start_step}"
        )
    stop_range = _termination(termination, job_figures)
    rate, curve_text, notes = _true_rate(curve, plan)

    replans = 0
    if plan is not None and not online:
        steps, expected = np.asarray(plan.steps, dtype=np.int64), _expected_percentages(plan)
        sent = None
    else:
        trace = online_trace(losses if losses is not None else curve, plan, plan_or_policy, job_figures)
        policy = online_policy(plan) if plan is not None else plan_or_policy
        run = online_run(policy, job_figures, trace, plan_seconds=plan_seconds)
        steps, replans, sent = run.steps, run.observations, run.level_steps
        expected = {}
        notes.append(f"online: schedule re-derived by replaying the policy ({replans} observations, session cadence)")
    if steps.size and (steps[0] < 1 or steps[-1] > job_figures.total_steps or np.any(np.diff(steps) <= 0)):
        raise ConfigError("plan.steps must be strictly increasing within [1, total_steps]")

    if sent is None:
        promote = _promoted(plan, steps, job_figures, model_failures, notes)
        copies = copied(plan, steps, promote, notes) if job_figures.has_peer_level else None
        higher = _higher(plan, steps, copies if promote is None else promote, job_figures, notes)
    else:  # online: each level's copies as the replay sent them (every re-plan's subsets)
        promote = sent["remote"] if job_figures.has_remote_tier else _promoted(None, steps, job_figures, model_failures, notes)
        copies = sent.get("peer")
        higher = [sent[record.name] for record in job_figures.higher_levels]
    samples = run_levels(steps, job_figures, model_failures, trials, seed, stop_range, rate, promote, copies, higher)
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
        peer_steps=None if copies is None else [int(s) for s in copies],
        higher_steps={record.name: [int(s) for s in subset] for record, subset in zip(job_figures.higher_levels, higher)} or None,
        replans=replans,
        unfinished=unfinished,
        metrics={name: MetricSummary.of(samples[name]) for name in METRICS},
        samples={name: samples[name].tolist() for name in METRICS},
        expected=expected if stop_range is None else {},
        notes=notes,
    )


def _higher(plan: Plan | None, steps: np.ndarray, below: np.ndarray | None, job: Job, notes: list[str]) -> list[np.ndarray]:
    """Each level above the remote tier's steps: the plan's ``higher_steps`` where it chose them
    for these steps (each a subset of the level below's), else every checkpoint of the level below
    (``below``: the promoted, else the copied steps; None: every checkpoint)."""
    chosen: list[np.ndarray] = []
    below = steps if below is None else below
    for record in job.higher_levels:
        subset = None if plan is None or plan.higher_steps is None else plan.higher_steps.get(record.name)
        picked = None if subset is None else np.asarray(subset, dtype=np.int64)
        if picked is None or not np.all(np.isin(picked, below)):
            notes.append(f"every uploaded checkpoint sent to {record.name}")
            picked = below
        chosen.append(picked)
        below = picked
    return chosen


def _promoted(plan: Plan | None, steps: np.ndarray, job: Job, failures: Failures, notes: list[str]) -> np.ndarray | None:
    """The promoted steps (None without a remote tier): the plan's ``promote_steps`` where it
    chose them for these steps, else every checkpoint."""
    if not job.has_remote_tier:
        if failures.destroying("local") is not None and not job.higher_levels:
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
