"""Planning online: ``make_policy`` builds the ``PlanningPolicy`` that [``coci.Session``][coci.Session]
drives; it plans after warm-up from the live profile and re-plans only when the measured costs or
the fit move by more than a threshold.

Open-ended runs (``total_steps=None`` in the session) are planned over
``max(knobs.PLAN_DEFAULT_HORIZON_STEPS, 2 * current step)`` steps and re-planned over a doubled
horizon once the run passes ``knobs.PLAN_HORIZON_EXTEND_AT`` of it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from coci import knobs
from coci.errors import ConfigError
from coci.planning.baselines import CheckFreqAdaptation
from coci.planning.config import PlanConfig
from coci.planning.empirical import EmpiricalCurve, forecast_curve
from coci.planning.fit import CurveFit, fit_curve
from coci.planning.levels import Level, LevelCosts
from coci.planning.planner import plan
from coci.planning.policy import Observation
from coci.planning.prior import CorrectedRate, PriorCurve, PriorLike, WarmStart, load_prior
from coci.planning.progress import run_mean_rate
from coci.planning.records import PRIOR_PROGRESS_RATE, Plan, ProgressCurve
from coci.planning.three_levels import measured_levels, survivable_failures

__all__ = ["PlanningPolicy", "make_policy"]

logger = logging.getLogger(__name__)

#: A planning policy re-plans when a measured cost (step time, C, P, each level's transfer seconds)
#: moved by more than this fraction since the last plan ...
_PLAN_REPLAN_COST_CHANGE: float = 0.25

#: ... or when the planned checkpoint density sqrt(w_alpha) over the remaining steps (old fit
#: against new, on a coarse grid) moved by more than this fraction, or the fit's family or
#: usability changed.
_PLAN_REPLAN_FIT_CHANGE: float = 0.25

#: Floor (seconds) applied to measured stall / persist times that read as 0 (coarse clocks).
_PLAN_MIN_COST_SECONDS: float = 1e-6

#: Stall assumed, in step times, before any stall has been measured or probed (recorded as a
#: fallback in the plan); the first checkpoint then measures it.
_PLAN_ASSUMED_STALL_STEPS: float = 1.0

#: Persist time assumed, in step times, before any persist has been measured or probed.
_PLAN_ASSUMED_PERSIST_STEPS: float = 10.0


def _cadence_tail(steps: frozenset[int]) -> tuple[int, int]:
    """The last warm-up step and the last interval of the warm-up steps (0: no warm-up cadence)."""
    ordered = sorted(steps)
    if not ordered:
        return 0, 0
    return ordered[-1], ordered[-1] - ordered[-2] if len(ordered) > 1 else ordered[-1]


def make_policy(config: PlanConfig | str = "auto", *, prior: PriorLike | None = None, **choices: Any) -> PlanningPolicy:
    """The [``coci.planning.policy.CheckpointPolicy``][coci.CheckpointPolicy] the session uses: a ``PlanningPolicy``
    for ``config``, or for a policy name and the other [``PlanConfig``][coci.PlanConfig] fields as keywords;
    ``prior``: an earlier run's curve to warm-start from (``PlanningPolicy.use_prior``)."""
    policy = PlanningPolicy(config, **choices)
    if prior is not None:
        policy.use_prior(prior)
    return policy


class PlanningPolicy:
    """Plans online from the live profile (see ``make_policy``).

    Before its first plan (warm-up) only ``auto`` with the progress objective checkpoints, at
    ``knobs.PLAN_WARMUP_CHECKPOINT_STEPS`` and then every last interval of those (8 steps after 16:
    24, 32, ...) until the first plan is in effect, so a slow first plan leaves no gap
    (``warming_up``: the session skips one that would wait for a persist in flight); the other
    policies wait. A plan made on the planner thread takes effect some steps after its observation
    (``take_effect``): its steps already passed by then are not silently lost. Each ``observe`` reads the
    profile (step time, stall, persist, interference, restore) and the loss trace; it re-plans
    from the current step when there is no plan yet, when a cost (``_basis_of``: every measured
    level's transfer seconds among them, a level's first measurement too) moved by more than
    ``_PLAN_REPLAN_COST_CHANGE``, when the fitted progress weight moved by more than
    ``_PLAN_REPLAN_FIT_CHANGE`` (the relative change of the planned checkpoint density
    ``sqrt(w_alpha)`` on the remaining steps, old fit against new; or the fit's family changed),
    when an open-ended horizon needs extending, or (``checkfreq``) when its interval grew
    (``CheckFreqAdaptation``). A level added above the remote tier is planned once measured
    (``coci.planning.three_levels.measured_levels``); until then a failure class that destroys the
    remote tier is planned as if the remote tier survived it, with a fallback in the plan
    (``coci.planning.three_levels.survivable_failures``). ``should_checkpoint`` is a set lookup. ``state_dict`` keeps
    CheckFreq's grown interval and the current plan.

    The failure clock of a restarting hazard is taken to have (re)started
    ``knobs.PLAN_WARMUP_STEPS`` steps before this object's first observation (an approximation:
    the policy does not see the restore itself).
    """

    def __init__(self, config: PlanConfig | str = "auto", **choices: Any) -> None:
        if isinstance(config, PlanConfig):
            if choices:
                raise ConfigError(f"pass either a PlanConfig or its fields, not both (got {sorted(choices)})")
            self.config = config
        else:
            self.config = PlanConfig(policy=config, **choices)
        self.plan: Plan | None = None
        self.replans = 0
        self._steps: frozenset[int] = self._warmup_steps()
        self._warm_last, self._warm_every = _cadence_tail(self._steps)
        self._in_effect = True  # the current plan has taken effect (take_effect); False from a new plan until then
        self._basis: dict[str, float] | None = None
        self._fit: ProgressCurve | None = None
        self._fit_family: str | None = None
        self._origin: int | None = None
        self._horizon: int | None = None
        self._checkfreq = CheckFreqAdaptation(self.config.max_overhead) if self.policy == "checkfreq" else None
        self._prior: PriorCurve | None = None
        self._warm: WarmStart | None = None
        self._prior_notes: list[str] = []
        self._fitted: tuple[np.ndarray, np.ndarray, ProgressCurve] | None = None  # the last trace fitted and its curve
        self._warm_fitted: tuple[np.ndarray, np.ndarray, ProgressCurve] | None = None  # the same, warm-started

    def use_prior(self, source: PriorLike) -> None:
        """Warm start: plan from step 0 with an earlier run's curve (see ``coci.planning.prior``;
        ``source`` as ``coci.planning.prior.load_prior`` takes it, or a
        ``PriorCurve``). A prior that cannot be used (unreadable, too
        short, not falling; a policy other than ``auto`` with the progress objective) is recorded in
        every plan's ``fallbacks`` and the run plans cold."""
        if not self._weights_progress:
            self._prior_notes.append(f"prior ignored: policy {self.policy!r} ({self.objective}) does not weigh progress")
            return
        try:
            self._prior = source if isinstance(source, PriorCurve) else load_prior(source)
        except ConfigError as exc:
            self._drop_prior(str(exc))
        except (ValueError, TypeError, ArithmeticError, RecursionError, OSError) as exc:  # whatever else the source holds
            self._drop_prior(f"prior: unreadable ({type(exc).__name__}: {exc})")

    def _drop_prior(self, reason: str) -> None:
        logger.warning("warm start refused, planning cold: %s", reason)
        self._prior, self._warm = None, None
        self._prior_notes.append(f"{reason}: planned without it (cold start)")

    @property
    def policy(self) -> str:
        """The policy name."""
        return self.config.policy

    @property
    def objective(self) -> str:
        """The objective asked for (``auto``)."""
        return self.config.objective

    @property
    def curve(self) -> ProgressCurve | None:
        """The progress curve the current plan weighs (for ``auto``: the trace so far and its
        forecast, ``coci.planning.empirical.forecast_curve``; None before a curve is known)."""
        return self._fit

    @property
    def total_steps(self) -> int | None:
        """The planning horizon (None: open-ended)."""
        return self.config.total_steps

    # -- CheckpointPolicy ----------------------------------------------------------------------

    def should_checkpoint(self, step: int) -> bool:
        if step in self._steps:
            return True
        return self.plan is None and self._warm_every > 0 and step > self._warm_last and (step - self._warm_last) % self._warm_every == 0 and (
            self.total_steps is None or step < self.total_steps
        )

    def take_effect(self, step: int, taken: tuple[int, ...] | list[int]) -> None:
        """The current plan, made from the observation at ``plan.inputs.start_step``, takes effect at
        ``step`` (the planner thread's apply step) after the checkpoints ``taken``. Planned steps
        between the two have passed: when no checkpoint was taken since the first of them, it moves
        to ``step`` (promoted or copied if any of them was), else they are dropped; either way the
        plan's notes say so. The planner itself stays a function of the observation."""
        plan = self.plan
        if plan is None or self._in_effect:
            return
        self._in_effect = True
        start = int(plan.inputs.start_step)
        passed = [s for s in plan.steps if start < s < step]
        if not passed:
            return
        since = [t for t in taken if t >= passed[0]]
        moved = not since
        keep = [s for s in plan.steps if not start < s < step]
        update: dict[str, Any] = {"steps": sorted({*keep, step}) if moved else keep}
        for field in ("promote_steps", "peer_steps"):
            chosen = getattr(plan, field)
            if chosen is not None:
                kept = [s for s in chosen if not start < s < step]
                update[field] = sorted({*kept, step}) if moved and any(s in passed for s in chosen) else kept
        what = f"moved to step {step}" if moved else f"dropped (checkpoint taken at step {since[-1]})"
        note = f"planned at step {start}, in effect from step {step}: planned step(s) {passed} had passed; {what}"
        update["notes"] = [*plan.notes, note]
        self.plan = plan.model_copy(update=update)
        self._steps = frozenset(self.plan.steps)
        logger.info("%s", note)

    @property
    def warming_up(self) -> bool:
        """True before the first plan: a due checkpoint is then a warm-up one
        (``knobs.PLAN_WARMUP_CHECKPOINT_STEPS``), which the session skips rather than wait for a
        persist still in flight (costs are not known yet, so the gap may be shorter than a persist)."""
        return self.plan is None

    def observe(self, observation: Observation) -> None:
        profile = observation.profile
        step_seconds = profile.step_seconds.value
        if step_seconds is None or not step_seconds > 0 or not math.isfinite(step_seconds):
            return
        now = int(observation.step)
        if self._origin is None:
            self._origin = max(0, now - knobs.PLAN_WARMUP_STEPS)
        horizon = self._horizon_for(now)
        if horizon is None:
            return
        fallbacks: list[str] = []
        stall, persist, interference, restart = self._costs(profile, step_seconds, fallbacks)
        cost = stall + interference
        levels = measured_levels(observation, restart, fallbacks)
        failures = survivable_failures(self.config.failures, observation, levels, fallbacks)
        basis = self._basis_of(step_seconds, cost, persist, levels)
        taken = self._taken_by(observation, now)
        last_checkpoint = max((s for s in taken if s <= now), default=0)
        grew = self._checkfreq is not None and self._checkfreq.observe(observation.checkpoint_steps, cost, step_seconds)
        curve = self._curve(observation, fallbacks)
        reasons = self._moved(basis, curve, now, horizon, grew)
        if not reasons:
            return
        try:
            new_plan = plan(
                config=self.config.replace(total_steps=horizon, restart_seconds=restart, failures=failures), curve=curve,
                step_seconds=step_seconds, stall_seconds=stall, persist_seconds=persist,
                interference_seconds=interference, start_step=now, last_checkpoint_step=last_checkpoint,
                failure_origin_step=min(self._origin, now), taken_steps=taken, levels=levels,
            )
        except ConfigError as exc:  # a measured figure out of range: keep the current plan
            logger.warning("re-planning at step %d failed, keeping the current plan: %s", now, exc)
            return
        if self._checkfreq is not None:
            new_plan = self._checkfreq.plan(new_plan, last_checkpoint)
        fallbacks.extend(self._prior_notes)
        if fallbacks or self.total_steps is None:
            if self.total_steps is None:
                fallbacks.append(f"total_steps unknown: planned over a horizon of {horizon} steps")
            new_plan = new_plan.model_copy(update={"fallbacks": [*new_plan.fallbacks, *fallbacks]})
        self._install(new_plan, basis, curve, horizon)
        logger.info("planned at step %d (%s): %d checkpoints", now, ", ".join(reasons), len(new_plan.steps))

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        checkfreq = CheckFreqAdaptation(None) if self._checkfreq is None else self._checkfreq
        return {
            "policy": self.policy,
            **checkfreq.state_dict(),
            "horizon": self._horizon,
            "plan": None if self.plan is None else self.plan.model_dump_json(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("policy") != self.policy:
            logger.warning("policy state for %r ignored by policy %r", state.get("policy"), self.policy)
            return
        if self._checkfreq is not None:
            self._checkfreq.load_state_dict(state)
        self._horizon = state.get("horizon")
        raw = state.get("plan")
        if raw:
            self.plan = Plan.model_validate_json(raw)
            self._steps = frozenset(self.plan.steps)
        self._basis = None  # re-plan at the first observation of the resumed run

    # -- internals -----------------------------------------------------------------------------

    def _taken_by(self, observation: Observation, now: int) -> tuple[int, ...]:
        """The checkpoints taken by step ``now``: the observed ones, and ``now`` itself when the
        current plan has it due (the session asks before observing and takes it after), so a re-plan
        at a planned step neither repeats it at the next step nor counts its interval from before."""
        taken = tuple(int(s) for s in observation.checkpoint_steps)
        if self.plan is not None and now in self._steps and now not in taken:
            return (*taken, now)
        return taken


    @property
    def _weights_progress(self) -> bool:
        return self.policy == "auto" and self.objective == "progress"

    def _warmup_steps(self) -> frozenset[int]:
        """Checkpoints before the first plan (see ``knobs.PLAN_WARMUP_CHECKPOINT_STEPS``)."""
        if not self._weights_progress:
            return frozenset()
        end = self.total_steps if self.total_steps is not None else math.inf
        return frozenset(int(s) for s in knobs.PLAN_WARMUP_CHECKPOINT_STEPS if 1 <= s < end)

    def _horizon_for(self, now: int) -> int | None:
        if self.total_steps is not None:
            return self.total_steps if now < self.total_steps else None
        horizon = self._horizon or knobs.PLAN_DEFAULT_HORIZON_STEPS
        if now >= knobs.PLAN_HORIZON_EXTEND_AT * horizon:
            horizon = max(2 * horizon, 2 * now)
        return max(horizon, now + 1)

    def _costs(self, profile: Any, step_seconds: float, fallbacks: list[str]) -> tuple[float, float, float, float]:
        floor = _PLAN_MIN_COST_SECONDS
        stall = profile.stall_seconds.value
        if stall is None:
            stall = _PLAN_ASSUMED_STALL_STEPS * step_seconds
            fallbacks.append(f"stall not measured yet: assumed {stall:.3g} s")
        persist = profile.persist_seconds.value
        if persist is None:
            persist = _PLAN_ASSUMED_PERSIST_STEPS * step_seconds
            fallbacks.append(f"persist not measured yet: assumed {persist:.3g} s")
        interference = float(getattr(profile, "interference_seconds", 0.0) or 0.0)
        restart = self.config.restart_seconds
        if restart is None:  # the restart cost (measured, else start-up + restore) beats a bare restore
            measured = getattr(profile, "restart_seconds", None)
            restart = measured.value if measured is not None and measured.known else profile.restore_seconds.value
            if restart is None:
                restart = 0.0
                fallbacks.append("restart_seconds unknown: assumed 0 (changes expected costs, not the plan)")
        return max(float(stall), floor), max(float(persist), floor), max(interference, 0.0), max(float(restart), 0.0)

    def _curve(self, observation: Observation, fallbacks: list[str]) -> ProgressCurve | None:
        """The curve of the loss trace so far (``_fit_of``), or (``auto``) the prior while the
        trace is too short.

        A trace with fewer than ``knobs.FIT_MIN_POINTS`` points (but at least one) gets
        ``PRIOR_PROGRESS_RATE`` for ``auto``; a longer one, for ``auto``'s progress objective, the
        trace itself and its forecast (``coci.planning.empirical.forecast_curve``), else its fit,
        which ``plan`` turns into the time-optimal plan when the fitter finds it unusable (flat,
        rising). Even a curve of the first
        few dozen steps is used: measured on GPT-2 and synthetic curves, waiting for the trace to
        cover 1% of the horizon lost more (the steepest, most valuable stretch passes meanwhile)
        than the extrapolation error cost."""
        needs = self.policy == "coci" or self._weights_progress
        warm = self._warm_rate(observation, fallbacks)
        points = int(np.count_nonzero(np.isfinite(np.asarray(observation.losses, dtype=float))))
        if warm is not None:
            return self._warm_forecast(observation, warm) if points >= knobs.FIT_MIN_POINTS else warm
        if not needs or points == 0:
            return None
        if self._weights_progress and points < knobs.FIT_MIN_POINTS:
            fallbacks.append(
                f"loss trace has {points} point(s), fewer than {knobs.FIT_MIN_POINTS} to fit: planned with "
                f"the prior progress rate {PRIOR_PROGRESS_RATE.description}"
            )
            return PRIOR_PROGRESS_RATE
        if points < 2:
            return None
        return self._fit_of(np.asarray(observation.loss_steps, dtype=float), np.asarray(observation.losses, dtype=float))

    def _fit_of(self, steps: np.ndarray, losses: np.ndarray) -> ProgressCurve:
        """The curve of the trace so far: for ``auto``'s progress objective the trace itself, then its
        forecast (``coci.planning.empirical.forecast_curve``: the past as observed, the future
        blended from extensions by held-out error; also where no law fits it); otherwise (or when the
        smoothed trace does not fall) ``fit_curve(steps, losses)``. Reused when the trace equals the one fitted last: both are
        deterministic, so a trace that has not changed since (losses logged less often than the
        policy observes: evaluation curves, sparse logging) gives the same curve without refitting."""
        last = self._fitted
        if last is not None and np.array_equal(last[0], steps) and np.array_equal(last[1], losses):
            return last[2]
        fit = fit_curve(steps, losses)
        curve: ProgressCurve = fit
        if self._weights_progress:  # even where no law fits: a falling trace is its own evidence
            try:
                curve = forecast_curve(steps, losses, fit)
            except ConfigError:  # the smoothed trace does not fall: the law alone
                curve = fit
        self._fitted = (steps.copy(), losses.copy(), curve)
        return curve

    def _warm_forecast(self, observation: Observation, warm: CorrectedRate) -> ProgressCurve:
        """Warm-started, a trace long enough to fit: the trace, then its forecast with the prior as one
        more extension (``forecast_curve(..., prior=)``, weighed by the same backtest as the trace's own
        extensions); the corrected prior alone when the trace does not fall (nothing to forecast from)."""
        steps = np.asarray(observation.loss_steps, dtype=float)
        losses = np.asarray(observation.losses, dtype=float)
        last = self._warm_fitted  # reused while the trace is unchanged, as ``_fit_of``
        if last is not None and np.array_equal(last[0], steps) and np.array_equal(last[1], losses):
            return last[2]
        curve: ProgressCurve
        try:
            curve = forecast_curve(steps, losses, fit_curve(steps, losses), prior=warm.warm)
        except ConfigError:
            curve = warm
        self._warm_fitted = (steps.copy(), losses.copy(), curve)
        return curve

    def _warm_rate(self, observation: Observation, fallbacks: list[str]) -> CorrectedRate | None:
        """The warm start's progress rate, corrected by this run's losses so far (None: no prior)."""
        if self._prior is None:
            return None
        horizon = self.total_steps or int(self._prior.total_steps)
        if self._warm is None or self._warm.total_steps != horizon:
            try:
                self._warm = WarmStart(self._prior, horizon)
            except ConfigError as exc:
                self._drop_prior(str(exc))
                return None
            if self.total_steps is None:
                fallbacks.append("total_steps unknown: the prior is used at its own length, not rescaled")
        try:
            return self._warm.rate(observation.loss_steps, observation.losses)
        except ConfigError as exc:
            self._drop_prior(str(exc))
            return None

    @staticmethod
    def _family(curve: ProgressCurve | None) -> str | None:
        if curve is None:
            return None
        if isinstance(curve, CorrectedRate):
            return "warm start"
        if isinstance(curve, EmpiricalCurve):
            return "trace and forecast" if curve.prior is None else "trace and forecast, warm start"
        return curve.family if isinstance(curve, CurveFit) else "prior"

    @staticmethod
    def _probe(curve: ProgressCurve | None, now: int, horizon: int) -> np.ndarray | None:
        """The curve's progress weight (whole-run normalisation, as planned) at 17 remaining steps."""
        if curve is None or (isinstance(curve, CurveFit) and not curve.usable):
            return None
        fit = curve if isinstance(curve, CurveFit) else None
        rate = curve.progress_rate if isinstance(curve, CurveFit) else curve
        rates = rate(np.linspace(now, horizon, 17))
        mean, _ = run_mean_rate(fit, rate, horizon, [])
        if mean is None or not np.all(np.isfinite(rates)):
            return None
        return rates / mean

    @staticmethod
    def _basis_of(step_seconds: float, cost: float, persist: float, levels: tuple[LevelCosts, ...]) -> dict[str, float]:
        """The measured costs a plan is made from, by name: step time, checkpoint cost, persist, the
        remote tier's and the peer copies' transfer seconds (0 while not measured) and each measured
        level above the remote tier's (``level4 copy``; absent while not measured)."""
        transfer = {record.level: record.transfer_seconds for record in levels}
        basis = {"step time": step_seconds, "checkpoint cost": cost, "persist": persist,
                 "upload": transfer.get(Level.REMOTE, 0.0), "peer copy": transfer.get(Level.PEER, 0.0)}
        basis.update({f"{record.name} copy": record.transfer_seconds for record in levels if record.rank > int(Level.REMOTE)})
        return basis

    def _moved(
        self, basis: dict[str, float], fit: ProgressCurve | None, now: int, horizon: int, grew: bool
    ) -> list[str]:
        """Why the current plan is out of date (empty: keep it)."""
        if self.plan is None or self._basis is None:
            return ["first plan"]
        reasons = []
        if horizon != self._horizon:
            reasons.append(f"horizon {horizon}")
        if grew and self._checkfreq is not None:
            reasons.append(f"checkfreq interval grew to {self._checkfreq.interval}")
        if self.policy != "checkfreq":
            for name in [*basis, *(name for name in self._basis if name not in basis)]:
                new, old = basis.get(name, 0.0), self._basis.get(name, 0.0)
                if abs(new - old) > _PLAN_REPLAN_COST_CHANGE * max(abs(old), 1e-12):
                    reasons.append(f"{name} {old:.3g} -> {new:.3g} s")
            reasons.extend(self._fit_moved(fit, now, horizon))
        return reasons

    def _fit_moved(self, fit: ProgressCurve | None, now: int, horizon: int) -> list[str]:
        """Why the new fit calls for a re-plan: another family or usability, or a planned checkpoint
        density ``sqrt(w_alpha)`` (the mixture of the current plan) moved by more than the threshold."""
        family = self._family(fit)
        if family != self._fit_family:
            return [f"fit {self._fit_family} -> {family}"]
        probe = self._probe(fit, now, horizon)
        planned = self._probe(self._fit, now, horizon)  # the planned fit, on the same steps
        if (probe is None) != (planned is None):
            return ["fit usability changed"]
        if probe is None or planned is None:
            return []
        mu = None if self.plan is None else self.plan.mu
        alpha = 1.0 if mu is None else 1.0 / (1.0 + mu)
        new_density = np.sqrt(alpha * probe + 1.0 - alpha)
        old_density = np.sqrt(alpha * planned + 1.0 - alpha)
        change = float(np.max(np.abs(new_density - old_density) / np.maximum(old_density, 1e-12)))
        return [f"progress weight moved by {change:.0%}"] if change > _PLAN_REPLAN_FIT_CHANGE else []

    def _install(self, new_plan: Plan, basis: dict[str, float], fit: ProgressCurve | None, horizon: int) -> None:
        self.plan = new_plan
        self._in_effect = False
        self._steps = frozenset(new_plan.steps)
        self._basis = basis
        self._fit_family = self._family(fit)
        self._fit = fit
        self._horizon = horizon
        self.replans += 1
