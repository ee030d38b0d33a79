"""The interval plan report: where a run's checkpoints went, why, what they cost, and the alternatives.

profiler -> plan -> snapshot -> persist -> **report**. :func:`report` reads a run directory written
by :class:`coci.Session` and returns a :class:`Report`; nothing here writes unless asked
(:meth:`Report.write`, :meth:`Report.plot`).

What it reads (every input is optional except the directory itself; what is missing is said in
``Report.data.notes``, never guessed silently):

* ``events.jsonl``: every checkpoint's snapshot, commit and persist times and bytes, persist errors,
  restores, and one ``plan`` event per (re-)plan. A ``stall`` event (``step``, ``seconds``) gives the
  stall of each checkpoint; where a run has none, the per-checkpoint stall is unknown and the total
  is estimated from the profile's median stall (marked as estimated). A ``plan`` event that carries
  ``steps`` lets the report mark every checkpoint as planned or not; otherwise only checkpoints
  inside the final plan's span are marked and earlier ones show "earlier plan" (None).
* ``plan.json``: the current :class:`coci.planning.planner.Plan` (its inputs, fit, failure model, expected
  costs, fallbacks).
* ``profile.json``: the final :class:`profiler.Profile` (clean step time, stall, persist,
  interference).
* ``checkpoints/``: the committed checkpoints on disk (manifests only; nothing is verified here,
  that is ``coci verify``).
* The loss trace: ``loss_curve.json`` (``{"steps": [...], "losses": [...]}``) when the run wrote
  one; else the profiler's trace saved inside the newest committed checkpoint (only those arrays are
  read, by offset, without the checksum pass); else none, and the loss figure shows the fit alone.

The policy comparison re-plans every policy of :data:`coci.planning.planner.POLICIES` from step 0 with the
final plan's measured inputs, failure model and fit ("what each policy would have planned, knowing
what the run measured"). Its overheads are the planner's expected values, or Monte Carlo means with
95% confidence intervals when :mod:`coci.simulate` is installed.

Lost work: a restore that follows a segment of the event log with no ``close`` event is a failure.
The work lost is at least the steps between the last step that segment recorded and the step
restored (events are written at checkpoints and plans, not at every step, so this is a lower bound).
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from coci import knobs
from coci.analysis.simulate import simulate as simulate_plan
from coci.checkpoint import storage
from coci.checkpoint.tree import tensor_refs
from coci.errors import CociError, ConfigError
from coci.events import read_events
from coci.planning.planner import POLICIES, Plan
from coci.units import format_duration
from profiler import Profile

__all__ = ["CheckpointRow", "ObservedCosts", "PolicyRow", "Report", "ReportData", "RestoreRow", "report"]

logger = logging.getLogger(__name__)

PLAN_FILENAME = "plan.json"
PROFILE_FILENAME = "profile.json"
LOSS_CURVE_FILENAME = "loss_curve.json"
REPORT_JSON_FILENAME = "report.json"
REPORT_HTML_FILENAME = "report.html"
#: Figure file names written by :meth:`Report.plot`, in display order.
FIGURES: dict[str, str] = {
    "loss": "report_loss.png",
    "intervals": "report_intervals.png",
    "overhead": "report_overhead.png",
    "costs": "report_checkpoint_costs.png",
}
_SESSION_KEY = "__coci__"  # coci.session's key for its own state inside a checkpoint tree


# --- the data ----------------------------------------------------------------------------------


class CheckpointRow(BaseModel):
    """One checkpoint the run started. Seconds and bytes; None where the log does not say."""

    step: int
    planned: bool | None = None
    stall_seconds: float | None = None
    staging_seconds: float | None = None
    persist_seconds: float | None = None
    bytes: int | None = None
    committed: bool = False
    on_disk: bool = False
    error: str | None = None


class RestoreRow(BaseModel):
    """One restore: the step restored and, after a failure, the work lost (a lower bound)."""

    step: int
    seconds: float | None = None
    failure: bool = True
    reached_step: int | None = None
    lost_steps: int | None = None
    lost_seconds: float | None = None


class ObservedCosts(BaseModel):
    """What the run's checkpoints and failures actually cost (seconds)."""

    steps: int = 0
    step_seconds: float | None = None
    compute_seconds: float | None = None
    checkpoints: int = 0
    committed: int = 0
    failed: int = 0
    on_disk: int = 0
    stall_seconds: float | None = None
    stall_estimated: bool = False
    interference_seconds: float = 0.0
    overhead_seconds: float | None = None
    overhead_percent: float | None = None
    failures: int = 0
    lost_steps: int = 0
    lost_seconds: float | None = None


class PolicyRow(BaseModel):
    """Expected cost of one policy's plan over the whole run (seconds; percent of the run)."""

    policy: str
    chosen: bool = False
    checkpoints: int = 0
    first_interval_steps: int | None = None
    last_interval_steps: int | None = None
    wall_seconds: float | None = None
    wall_percent: float | None = None
    wall_ci_percent: list[float] | None = None
    progress_seconds: float | None = None
    progress_percent: float | None = None
    progress_ci_percent: list[float] | None = None
    lost_seconds: float | None = None
    source: str = "expected"
    fallbacks: list[str] = Field(default_factory=list)
    error: str | None = None


class ReportData(BaseModel):
    """Everything the report shows, as one JSON-able record (``report.json``)."""

    run_dir: str
    created: float
    plan: Plan | None = None
    profile: Profile | None = None
    replans: int = 0
    checkpoints: list[CheckpointRow] = Field(default_factory=list)
    restores: list[RestoreRow] = Field(default_factory=list)
    observed: ObservedCosts = Field(default_factory=ObservedCosts)
    loss_steps: list[float] = Field(default_factory=list)
    losses: list[float] = Field(default_factory=list)
    loss_source: str = "none"
    comparison: list[PolicyRow] = Field(default_factory=list)
    comparison_steps: dict[str, list[int]] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


# --- reading a run -----------------------------------------------------------------------------


def report(
    run_dir: str | os.PathLike[str],
    *,
    compare: bool = True,
    simulate_trials: int | None = None,
    seed: int = 0,
) -> Report:
    """Read the run directory ``run_dir`` and build its :class:`Report`.

    Args:
        run_dir: a directory written by :class:`coci.Session`.
        compare: re-plan every policy with the run's measured inputs for the comparison.
        simulate_trials: Monte Carlo trials per policy when :mod:`coci.simulate` exists
            (default ``knobs.REPORT_SIMULATE_TRIALS``; 0 uses expected values only).
        seed: seed of the simulation.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ConfigError(f"run_dir {str(root)!r} is not a directory")
    notes: list[str] = []
    events = list(read_events(root))
    plan = _read_model(root / PLAN_FILENAME, Plan, notes)
    profile = _read_model(root / PROFILE_FILENAME, Profile, notes)
    if not events and plan is None and profile is None and not storage.committed_steps(storage.checkpoints_dir(root)):
        raise ConfigError(f"run_dir {str(root)!r} holds no coci run (no events.jsonl, plan.json, profile.json or checkpoints)")

    on_disk = {step for step, _ in storage.committed_steps(storage.checkpoints_dir(root))}
    rows, errors = _checkpoint_rows(events, on_disk)
    _mark_planned(rows, events, plan, notes)
    step_seconds = _step_seconds(profile, plan)
    restores = _restores(events, step_seconds)
    observed = _observed(rows, restores, events, profile, step_seconds, notes)
    loss_steps, losses, loss_source = _loss_trace(root, notes)
    data = ReportData(
        run_dir=str(root),
        created=time.time(),
        plan=plan,
        profile=profile,
        replans=sum(1 for e in events if e.get("event") == "plan"),
        checkpoints=rows,
        restores=restores,
        observed=observed,
        loss_steps=[float(s) for s in loss_steps],
        losses=[float(v) for v in losses],
        loss_source=loss_source,
        errors=errors,
        notes=notes,
    )
    result = Report(data)
    if compare:
        trials = knobs.REPORT_SIMULATE_TRIALS if simulate_trials is None else simulate_trials
        result.compare(trials=trials, seed=seed)
    return result


def _read_model(path: Path, model: type[BaseModel], notes: list[str]) -> Any:
    if not path.is_file():
        notes.append(f"{path.name} is missing")
        return None
    try:
        return model.model_validate_json(path.read_bytes())
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        notes.append(f"{path.name} is unreadable ({type(exc).__name__}); ignored")
        logger.warning("%s unreadable: %s", path, exc)
        return None


def _checkpoint_rows(events: Iterable[dict[str, Any]], on_disk: set[int]) -> tuple[list[CheckpointRow], list[str]]:
    """One row per checkpoint step; a retried step keeps its latest attempt's figures."""
    rows: dict[int, dict[str, Any]] = {}
    errors: list[str] = []
    for event in events:
        kind, step = event.get("event"), event.get("step")
        if not isinstance(step, int) or kind not in ("snapshot_start", "snapshot_end", "commit", "stall", "error"):
            continue
        row = rows.setdefault(step, {"step": step})
        if kind == "snapshot_start":
            row.update(bytes=event.get("bytes"), error=None)
        elif kind == "snapshot_end":
            row["staging_seconds"] = event.get("seconds")
        elif kind == "commit":
            row.update(committed=True, persist_seconds=event.get("seconds"), bytes=event.get("bytes", row.get("bytes")))
        elif kind == "stall":
            row["stall_seconds"] = event.get("seconds")
        else:
            message = str(event.get("message", "error"))
            row["error"] = message
            errors.append(f"step {step}: {event.get('phase', 'checkpoint')} failed: {message}")
    for step in on_disk:
        rows.setdefault(step, {"step": step, "committed": True})
    result = []
    for step in sorted(rows):
        row = rows[step]
        row["on_disk"] = step in on_disk
        result.append(CheckpointRow(**row))
    return result, errors


def _mark_planned(rows: list[CheckpointRow], events: list[dict[str, Any]], plan: Plan | None, notes: list[str]) -> None:
    """Set ``planned``: from plan events that carry steps, else from the final plan's span."""
    plan_events = [e for e in events if e.get("event") == "plan" and isinstance(e.get("step"), int)]
    governed: list[tuple[int, int, set[int]]] = []  # (from, to, steps) a plan was in force
    if plan_events and all(isinstance(e.get("steps"), list) for e in plan_events):
        for current, following in zip(plan_events, [*plan_events[1:], None]):
            end = following["step"] if following is not None else math.inf
            governed.append((current["step"], end, {int(s) for s in current["steps"]}))
    elif plan is not None:
        governed.append((plan.inputs.start_step, math.inf, set(plan.steps)))
        if rows and rows[0].step <= plan.inputs.start_step:
            notes.append(
                f"checkpoints up to step {plan.inputs.start_step} followed earlier plans (not recorded): "
                "shown as 'earlier plan'"
            )
    for row in rows:
        for start, end, steps in governed:
            if start < row.step <= end:  # a plan made at step s governs the steps after s
                row.planned = row.step in steps
        if plan is None and not governed:
            row.planned = None


def _step_seconds(profile: Profile | None, plan: Plan | None) -> float | None:
    if profile is not None and profile.step_seconds.value:
        return float(profile.step_seconds.value)
    if plan is not None:
        return float(plan.inputs.step_seconds)
    return None


def _restores(events: list[dict[str, Any]], step_seconds: float | None) -> list[RestoreRow]:
    """Each restore, and what the segment before it had reached (a failure unless it closed)."""
    rows: list[RestoreRow] = []
    reached: int | None = None
    closed = False
    for event in events:
        kind, step = event.get("event"), event.get("step")
        if kind == "restore" and isinstance(step, int):
            failure = reached is not None and not closed
            lost = max(reached - step, 0) if failure and reached is not None else None
            rows.append(
                RestoreRow(
                    step=step,
                    seconds=event.get("seconds"),
                    failure=failure,
                    reached_step=reached,
                    lost_steps=lost,
                    lost_seconds=None if lost is None or step_seconds is None else lost * step_seconds,
                )
            )
            reached, closed = step, False
            continue
        if isinstance(step, int) and kind not in ("retention", "restore_skip"):
            reached = step if reached is None else max(reached, step)
        if kind == "close":
            closed = True
    return rows


def _observed(
    rows: list[CheckpointRow],
    restores: list[RestoreRow],
    events: list[dict[str, Any]],
    profile: Profile | None,
    step_seconds: float | None,
    notes: list[str],
) -> ObservedCosts:
    steps = profile.steps if profile is not None else 0
    steps = max([steps, *(e["step"] for e in events if e.get("event") == "close" and isinstance(e.get("step"), int))])
    taken = [r for r in rows if r.bytes is not None or r.staging_seconds is not None or r.committed]
    stalls = [r.stall_seconds for r in taken if r.stall_seconds is not None]
    stall: float | None = float(sum(stalls)) if stalls else None
    estimated = False
    if len(stalls) < len(taken) and profile is not None and profile.stall_seconds.value is not None:
        missing = len(taken) - len(stalls)
        stall = (stall or 0.0) + missing * float(profile.stall_seconds.value)
        estimated = True
        notes.append(
            f"the event log records no stall for {missing} checkpoint(s): their stall is the profile's median "
            f"({profile.stall_seconds.value:.3g} s)"
        )
    interference = len(taken) * float(profile.interference_seconds) if profile is not None else 0.0
    compute = steps * step_seconds if step_seconds is not None and steps else None
    overhead = None if stall is None else stall + interference
    failures = [r for r in restores if r.failure]
    lost_steps = sum(r.lost_steps or 0 for r in failures)
    return ObservedCosts(
        steps=steps,
        step_seconds=step_seconds,
        compute_seconds=compute,
        checkpoints=len(taken),
        committed=sum(r.committed for r in taken),
        failed=sum(r.error is not None for r in taken),
        on_disk=sum(r.on_disk for r in rows),
        stall_seconds=stall,
        stall_estimated=estimated,
        interference_seconds=interference,
        overhead_seconds=overhead,
        overhead_percent=None if overhead is None or not compute else 100.0 * overhead / compute,
        failures=len(failures),
        lost_steps=lost_steps,
        lost_seconds=None if step_seconds is None else lost_steps * step_seconds,
    )


def _loss_trace(root: Path, notes: list[str]) -> tuple[np.ndarray, np.ndarray, str]:
    """``(steps, losses, source)`` from loss_curve.json, else the newest checkpoint's profiler."""
    path = root / LOSS_CURVE_FILENAME
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
            steps = np.asarray(raw["steps"], dtype=float)
            losses = np.asarray(raw["losses"], dtype=float)
            if steps.shape == losses.shape and steps.ndim == 1:
                return steps, losses, LOSS_CURVE_FILENAME
            notes.append(f"{LOSS_CURVE_FILENAME}: steps and losses differ in shape; ignored")
        except (ValueError, KeyError, TypeError) as exc:
            notes.append(f"{LOSS_CURVE_FILENAME} unreadable ({type(exc).__name__}); ignored")
    for step, checkpoint in reversed(storage.committed_steps(storage.checkpoints_dir(root))):
        try:
            found = _trace_from_checkpoint(checkpoint)
        except (CociError, OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("no loss trace from %s: %s", checkpoint, exc)
            continue
        if found is not None and found[0].size:
            return found[0], found[1], f"profiler trace in checkpoint step_{step}"
    notes.append("no loss trace found (no loss_curve.json; no checkpoint holds a profiler trace)")
    return np.empty(0), np.empty(0), "none"


def _trace_from_checkpoint(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """Read only the loss-trace arrays of a checkpoint's profiler state (by offset)."""
    from coci.checkpoint.tree import unflatten
    from profiler.loss_trace import LossTrace

    manifest = storage.read_manifest(path)
    skeleton = manifest.skeleton
    sub = skeleton.get(_SESSION_KEY, {}).get("profiler", {}).get("loss_trace") if isinstance(skeleton, dict) else None
    if not isinstance(sub, dict):
        return None
    import torch

    tensors: list[Any] = [None] * len(manifest.tensors)
    with open(path / manifest.files[0].name, "rb") as handle:
        for index in _int_refs(sub):
            entry = manifest.tensors[index]
            handle.seek(entry.offset)
            raw = handle.read(entry.nbytes)
            if len(raw) != entry.nbytes:
                raise ValueError(f"{path}: loss trace array {index} is truncated")
            array = np.frombuffer(raw, dtype=np.dtype(entry.dtype)).reshape(entry.shape).copy()
            tensors[index] = torch.from_numpy(array)
    trace = LossTrace()
    trace.load_state_dict(unflatten(sub, tensors))
    return trace.curve()


# --- the policy comparison ---------------------------------------------------------------------


def _int_refs(skeleton: Any) -> list[int]:
    return [ref for ref in tensor_refs(skeleton) if isinstance(ref, int)]


def compare_policies(
    reference: Plan,
    *,
    policies: Iterable[str] = POLICIES,
    trials: int = 0,
    seed: int = 0,
) -> tuple[list[PolicyRow], dict[str, Plan]]:
    """Plan every policy over the whole run from ``reference``'s inputs and fit; score each.

    Rows carry the expected overhead from the planner, replaced by Monte Carlo mean and 95% CI
    when ``trials > 0``.
    """
    from coci.planning.planner import plan as make_plan

    inputs = reference.inputs
    curve = reference.fit if reference.fit is not None and reference.fit.usable else None
    simulate = simulate_plan if trials > 0 else None
    rows: list[PolicyRow] = []
    plans: dict[str, Plan] = {}
    for name in policies:
        try:
            planned = make_plan(
                name,
                failures=inputs.failures,
                total_steps=inputs.total_steps,
                step_seconds=inputs.step_seconds,
                stall_seconds=inputs.stall_seconds,
                persist_seconds=inputs.persist_seconds,
                restart_seconds=inputs.restart_seconds,
                interference_seconds=inputs.interference_seconds,
                curve=curve,
                objective="progress" if name != reference.policy else _requested_objective(reference),
                time_budget=reference.time_budget,
                max_overhead=inputs.max_overhead,
            )
        except (CociError, ValueError) as exc:
            rows.append(PolicyRow(policy=name, chosen=name == reference.policy, error=str(exc)))
            continue
        plans[name] = planned
        row = _expected_row(planned, chosen=name == reference.policy)
        if simulate is not None and inputs.failures is not None:
            _simulated_into(row, simulate, planned, inputs.failures, trials, seed)
        rows.append(row)
    return rows, plans


def _requested_objective(reference: Plan) -> str:
    # A plan records the objective it ended up optimising; "time" may be a fallback of "progress".
    fell_back = any("time objective" in f for f in reference.fallbacks)
    return "progress" if fell_back else reference.objective


def _expected_row(planned: Plan, *, chosen: bool) -> PolicyRow:
    expected = planned.expected
    run = expected.get("run_seconds") or planned.inputs.total_steps * planned.inputs.step_seconds
    intervals = planned.intervals

    def percent(key: str) -> float | None:
        value = expected.get(key)
        return None if value is None or not run else 100.0 * value / run

    return PolicyRow(
        policy=planned.policy,
        chosen=chosen,
        checkpoints=len(planned.steps),
        first_interval_steps=intervals[0] if intervals else None,
        last_interval_steps=intervals[-1] if intervals else None,
        wall_seconds=expected.get("wall_seconds"),
        wall_percent=percent("wall_seconds"),
        progress_seconds=expected.get("progress_seconds"),
        progress_percent=percent("progress_seconds"),
        lost_seconds=expected.get("lost_seconds"),
        fallbacks=list(planned.fallbacks),
    )


def _simulated_into(row: PolicyRow, simulate: Any, planned: Plan, failures: Any, trials: int, seed: int) -> None:
    """Replace the row's expected figures with the simulated means and 95% CIs of
    :func:`coci.analysis.simulate.simulate` (its ``metrics``: ``wall_*`` / ``progress_*`` summaries)."""
    try:
        result = simulate(planned, failures=failures, trials=trials, seed=seed)
    except (CociError, ValueError) as exc:
        row.error = f"simulation failed: {exc}"
        return
    metrics = result.metrics
    for metric in ("wall", "progress"):
        seconds, percent = metrics[f"{metric}_seconds"], metrics[f"{metric}_percent"]
        setattr(row, f"{metric}_seconds", seconds.mean)
        setattr(row, f"{metric}_percent", percent.mean)
        setattr(row, f"{metric}_ci_percent", [percent.ci_low, percent.ci_high])
    row.lost_seconds = metrics["lost_seconds"].mean
    row.source = f"simulated, {trials} trials, mean [95% CI]"


# --- the report --------------------------------------------------------------------------------


class Report:
    """A run's plan report: :meth:`summary`, :meth:`to_frame`, :meth:`plot`, :meth:`to_html`,
    :meth:`to_json`, :meth:`write`. ``data`` is the underlying :class:`ReportData`."""

    def __init__(self, data: ReportData) -> None:
        self.data = data
        self._plans: dict[str, Plan] = {}
        self._figures: dict[str, bytes] | None = None

    def compare(self, *, trials: int = 0, seed: int = 0) -> list[PolicyRow]:
        """(Re)compute the policy comparison; needs the run's plan."""
        plan = self.data.plan
        if plan is None:
            self.data.comparison = []
            return []
        rows, plans = compare_policies(plan, trials=trials, seed=seed)
        self._plans = plans
        self._figures = None
        self.data.comparison = rows
        self.data.comparison_steps = {name: list(p.steps) for name, p in plans.items()}
        return rows

    # -- tables -------------------------------------------------------------------------------

    def to_frame(self) -> pd.DataFrame:
        """One row per checkpoint: step, planned (True/False/None = earlier plan), stall, staging
        and persist seconds, bytes, committed, still on disk, error."""
        rows = [row.model_dump() for row in self.data.checkpoints]
        dtypes = {"step": "int64", "planned": object, "stall_seconds": "float64", "staging_seconds": "float64",
                  "persist_seconds": "float64", "bytes": "Int64", "committed": "bool", "on_disk": "bool", "error": object}
        return pd.DataFrame({name: pd.Series([r[name] for r in rows], dtype=dtype) for name, dtype in dtypes.items()})

    def comparison_frame(self) -> pd.DataFrame:
        """One row per policy: checkpoints, first/last interval, expected overheads (s and %)."""
        return pd.DataFrame([row.model_dump() for row in self.data.comparison], columns=list(PolicyRow.model_fields))

    # -- text ---------------------------------------------------------------------------------

    def summary(self) -> str:
        """A readable plain-text summary (what ``coci report`` prints)."""
        d, obs, plan = self.data, self.data.observed, self.data.plan
        lines = [f"coci report: {d.run_dir}"]
        run = f"  run: {obs.steps} steps"
        if obs.step_seconds:
            run += f", clean step {_seconds(obs.step_seconds)}"
        if d.profile is not None and d.profile.state_bytes:
            run += f", state {_bytes(d.profile.state_bytes)}"
        lines.append(run)
        lines += self._plan_lines()
        lines += self._checkpoint_lines()
        lines += self._cost_lines()
        lines += self._lost_work_lines()
        fallbacks = list(plan.fallbacks) if plan else []
        lines.append("fallbacks: " + ("none" if not fallbacks else ""))
        lines += [f"  - {f}" for f in fallbacks]
        if plan and plan.notes:
            lines.append("plan notes:")
            lines += [f"  - {n}" for n in plan.notes]
        if d.errors:
            lines.append("persist errors:")
            lines += [f"  - {e}" for e in d.errors]
        if d.notes:
            lines.append("report notes:")
            lines += [f"  - {n}" for n in d.notes]
        lines += self._comparison_lines()
        return "\n".join(lines)

    def _plan_lines(self) -> list[str]:
        plan = self.data.plan
        if plan is None:
            return ["  plan: none recorded (the policy does not plan, e.g. EveryN / fixed steps)"]
        budget = "none" if plan.time_budget is None else f"{plan.time_budget:.0%}"
        mu = "" if plan.mu is None else f", mu {plan.mu:.3g}"
        lines = [
            f"  policy: {plan.policy} (objective {plan.objective}, time budget {budget}{mu}); "
            f"{self.data.replans} plan(s) made, horizon {plan.inputs.total_steps} steps",
            f"  failure model: {plan.inputs.failures.describe() if plan.inputs.failures else 'none'}; "
            f"restart {_seconds(plan.inputs.restart_seconds)}",
            f"  costs planned with: stall {_seconds(plan.inputs.stall_seconds)}, interference "
            f"{_seconds(plan.inputs.interference_seconds)}, persist {_seconds(plan.inputs.persist_seconds)}, "
            f"step {_seconds(plan.inputs.step_seconds)}",
        ]
        fit = plan.fit
        if fit is None:
            lines.append("  fit: none (no loss curve used)")
        elif not fit.usable:
            lines.append(f"  fit: unusable ({fit.fallback})")
        else:
            params = ", ".join(f"{k}={v:.4g}" for k, v in fit.params.items())
            holdout = "n/a" if fit.holdout_error is None else f"{fit.holdout_error:.3g}"
            lines.append(
                f"  fit: {fit.family} ({params}); holdout error {holdout}, window from step "
                f"{(fit.window_start or 0):.0f}, {fit.n_points} points"
            )
        return lines

    def _checkpoint_lines(self) -> list[str]:
        d, obs, plan = self.data, self.data.observed, self.data.plan
        lines = [
            f"checkpoints: {obs.checkpoints} taken, {obs.committed} committed, {obs.failed} failed, "
            f"{obs.on_disk} on disk now"
        ]
        if plan is not None:
            start = plan.inputs.start_step
            reached = [s for s in plan.steps if s <= obs.steps] if obs.steps else []
            taken_after = [r.step for r in d.checkpoints if r.step > start]
            if not plan.steps:
                lines.append(f"  current plan (made at step {start}): no checkpoint left before step {plan.inputs.total_steps}")
            else:
                lines.append(
                    f"  current plan (made at step {start}): {_step_list(plan.steps)}"
                    + (f"; {len(reached)} within the {obs.steps} steps run" if obs.steps else "")
                )
            if plan.steps or taken_after:
                lines.append(f"  taken after step {start}: {_step_list(taken_after)}")
            missed = sorted(set(reached) - set(taken_after))
            extra = sorted(set(taken_after) - set(plan.steps))
            if missed or extra:
                lines.append(f"  planned but not taken: {_step_list(missed)}; taken but not planned: {_step_list(extra)}")
        frame = self.to_frame()
        if not frame.empty:
            table = _display_checkpoints(frame)
            if len(table) > 12:
                table = pd.concat([table.head(6), table.tail(6)])
                lines.append(f"  (first and last 6 of {len(frame)} checkpoints)")
            lines += ["  " + line for line in table.to_string(index=False).splitlines()]
        return lines

    def _cost_lines(self) -> list[str]:
        obs, profile = self.data.observed, self.data.profile
        lines = ["costs:"]
        rows = [r for r in self.data.checkpoints if r.persist_seconds is not None]
        if obs.stall_seconds is not None:
            tag = " (partly estimated)" if obs.stall_estimated else ""
            per = obs.stall_seconds / obs.checkpoints if obs.checkpoints else 0.0
            lines.append(f"  stall: {_seconds(obs.stall_seconds)} in all{tag}, {_seconds(per)} per checkpoint")
        if rows:
            persist = np.array([r.persist_seconds for r in rows], dtype=float)
            lines.append(
                f"  persist (background): median {_seconds(float(np.median(persist)))}, max "
                f"{_seconds(float(persist.max()))} per checkpoint"
            )
        if profile is not None and profile.interference.value is not None:
            lines.append(
                f"  interference: steps {profile.interference.value:.3g}x slower during a persist = "
                f"{_seconds(profile.interference_seconds)} per checkpoint"
            )
        if obs.overhead_percent is not None:
            line = (
                f"  checkpoint overhead: {_seconds(obs.overhead_seconds or 0.0)} = {obs.overhead_percent:.2f}% of "
                f"{_seconds(obs.compute_seconds or 0.0)} of compute"
            )
            reference, where = self._expectation()
            if reference is not None and reference.expected.get("run_seconds"):
                expected = reference.expected
                share = 100.0 * expected.get("checkpoint_seconds", 0.0) / expected["run_seconds"]
                line += f"; {where} expects {share:.2f}% (with failures {100 * expected.get('wall_fraction', 0):.2f}%)"
            lines.append(line)
        return lines

    def _expectation(self) -> tuple[Plan | None, str]:
        """The plan expectations are read from: the run's policy planned over the whole run with the
        final measurements (comparison), else the current plan (which covers only its own span)."""
        plan = self.data.plan
        if plan is not None and plan.policy in self._plans:
            return self._plans[plan.policy], f"{plan.policy} planned over the whole run"
        if plan is not None:
            return plan, f"the current plan (steps {plan.inputs.start_step}-{plan.inputs.total_steps})"
        return None, ""

    def _lost_work_lines(self) -> list[str]:
        obs = self.data.observed
        lines = ["lost work:"]
        reference, where = self._expectation()
        if reference is not None and reference.expected.get("failures"):
            expected = reference.expected
            per_failure = expected.get("lost_seconds", 0.0) / expected["failures"]
            lines.append(
                f"  expected ({where}): {expected['failures']:.3g} failures, "
                f"{_seconds(expected.get('lost_seconds', 0.0))} lost = {_seconds(per_failure)} per failure"
            )
        if obs.failures:
            per = (obs.lost_seconds or 0.0) / obs.failures
            lines.append(
                f"  observed: {obs.failures} failure(s), at least {obs.lost_steps} steps "
                f"({_seconds(obs.lost_seconds or 0.0)}) lost = at least {_seconds(per)} per failure "
                "(counted up to the last logged event before each failure)"
            )
        else:
            restarts = len(self.data.restores)
            lines.append(f"  observed: no failures ({restarts} restore(s) after a clean close)" if restarts else "  observed: no failures")
        return lines

    def _comparison_lines(self) -> list[str]:
        rows = self.data.comparison
        if not rows:
            return []
        source = rows[0].source if all(r.source == rows[0].source for r in rows) else "mixed"
        lines = [f"policies over the whole run with the measured inputs ({source}; % of the failure-free run time):"]
        table = pd.DataFrame(
            {
                "policy": [r.policy + (" *" if r.chosen else "") for r in rows],
                "checkpoints": [r.checkpoints for r in rows],
                "first/last interval": [
                    "-" if r.first_interval_steps is None else f"{r.first_interval_steps}/{r.last_interval_steps}"
                    for r in rows
                ],
                "wall %": [_percent(r.wall_percent, r.wall_ci_percent) for r in rows],
                "progress %": [_percent(r.progress_percent, r.progress_ci_percent) for r in rows],
                "note": [r.error or ("; ".join(r.fallbacks)[:60] if r.fallbacks else "") for r in rows],
            }
        )
        lines += ["  " + line for line in table.to_string(index=False).splitlines()]
        lines.append("  (* = this run's policy; wall: wall-clock overhead; progress: progress-weighted overhead)")
        return lines

    # -- figures ------------------------------------------------------------------------------

    def figures(self) -> dict[str, bytes]:
        """PNG bytes of each figure, keyed as in :data:`FIGURES` (rendered once, then cached)."""
        if self._figures is not None:
            return dict(self._figures)
        # The Agg canvas on a pyplot-free Figure: no global backend switch, no display needed, and a
        # notebook's inline backend is left alone.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        builders = {
            "loss": self._plot_loss,
            "intervals": self._plot_intervals,
            "overhead": self._plot_overhead,
            "costs": self._plot_costs,
        }
        result = {}
        for name, build in builders.items():
            figure = Figure(figsize=knobs.REPORT_FIGURE_SIZE, layout="constrained")
            FigureCanvasAgg(figure)
            build(figure)
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=knobs.REPORT_FIGURE_DPI)
            result[name] = buffer.getvalue()
        self._figures = result
        return dict(result)

    def plot(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write the figures as PNG files into ``directory``; return their paths."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, png in self.figures().items():
            path = target / FIGURES[name]
            path.write_bytes(png)
            paths.append(path)
        return paths

    def _plot_loss(self, figure: Any) -> None:
        ax = figure.add_subplot()
        d, plan = self.data, self.data.plan
        steps, losses = np.asarray(d.loss_steps), np.asarray(d.losses)
        if steps.size:
            ax.plot(steps, losses, ".", ms=3, color="0.55", label=f"loss ({d.loss_source})")
        fit = plan.fit if plan is not None else None
        last = max(float(steps.max()) if steps.size else 0.0, float(d.observed.steps))
        if fit is not None and fit.usable:
            start = max(float(fit.window_start or 1.0), 1.0)
            seen = np.linspace(start, max(last, start + 1), 200)
            ax.plot(seen, fit.loss(seen), "-", color="C0", lw=2, label=f"fit: {fit.family}")
            horizon = float(plan.inputs.total_steps) if plan is not None else last
            if horizon > last:
                ahead = np.linspace(last, horizon, 200)
                ax.plot(ahead, fit.loss(ahead), "--", color="C0", lw=1.5, label="fit, extrapolated")
        committed = [r.step for r in d.checkpoints if r.committed]
        other = [r.step for r in d.checkpoints if not r.committed]
        for index, step in enumerate(committed):
            ax.axvline(step, color="C2", lw=0.8, alpha=0.6, label="checkpoint committed" if index == 0 else None)
        for index, step in enumerate(other):
            ax.axvline(step, color="C3", lw=1.0, ls=":", label="checkpoint not committed" if index == 0 else None)
        for index, restore in enumerate(r for r in d.restores if r.failure):
            ax.axvline(restore.step, color="C3", lw=1.6, ls="--",
                       label="failure: resumed from this checkpoint" if index == 0 else None)
        if plan is not None:
            future = [s for s in plan.steps if s > d.observed.steps]
            if future:
                ax.plot(future, np.zeros(len(future)), "|", color="C1", ms=12, transform=ax.get_xaxis_transform(),
                        label="planned, not reached")
        if not steps.size and (fit is None or not fit.usable):
            ax.text(0.5, 0.5, "no loss trace or usable fit recorded", ha="center", va="center", transform=ax.transAxes)
        shown = losses[np.isfinite(losses)] if losses.size else np.empty(0)
        if shown.size and shown.min() > 0 and shown.max() / shown.min() > 20:
            ax.set_yscale("log")  # a loss falling by decades stays readable at the plateau
        ax.set_xlabel("training step (completed steps)")
        ax.set_ylabel("training loss (units of the job's loss)" + (", log scale" if ax.get_yscale() == "log" else ""))
        ax.set_title("Loss curve, fitted convergence law and checkpoints")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper right")

    def _plot_intervals(self, figure: Any) -> None:
        ax = figure.add_subplot()
        d = self.data
        step_seconds = d.observed.step_seconds or (d.plan.inputs.step_seconds if d.plan else None)
        chosen = d.plan.policy if d.plan is not None else None
        styles = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)))  # Young and Daly often coincide: tell them apart
        for index, (name, steps) in enumerate(d.comparison_steps.items()):
            if not steps:
                continue
            x = np.asarray(steps)
            y = np.diff(np.concatenate([[0], x]))
            bold = name == chosen
            ax.step(x, y, where="pre", lw=2.6 if bold else 1.5, color=f"C{index}", ls="-" if bold else styles[index % len(styles)],
                    label=f"{name} (this run's policy)" if bold else name, zorder=3 if bold else 2)
        taken = np.asarray([r.step for r in d.checkpoints if r.bytes is not None or r.committed])
        if taken.size:
            ax.plot(taken, np.diff(np.concatenate([[0], taken])), "ko", ms=4, label="taken in this run", zorder=4)
        if not d.comparison_steps and not taken.size:
            ax.text(0.5, 0.5, "no plan or checkpoints recorded", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.set_yscale("log")
        ax.set_xlabel("checkpoint step (completed steps)")
        ax.set_ylabel("interval since previous checkpoint (steps)")
        if step_seconds:
            secondary = ax.secondary_yaxis("right", functions=(lambda s: s * step_seconds, lambda t: t / step_seconds))
            secondary.set_ylabel("interval (seconds of training)")
        ax.set_title("Checkpoint intervals: each policy planned over the whole run")
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)

    def _plot_overhead(self, figure: Any) -> None:
        ax = figure.add_subplot()
        rows = [r for r in self.data.comparison if r.wall_percent is not None]
        if not rows:
            ax.text(0.5, 0.5, "no policy comparison (no plan recorded)", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel("expected overhead (% of failure-free run time)")
            return
        y = np.arange(len(rows))
        height = 0.38
        for offset, metric, label, color in ((-height / 2, "wall", "wall-clock", "C0"), (height / 2, "progress", "progress-weighted", "C1")):
            values = np.array([getattr(r, f"{metric}_percent") or 0.0 for r in rows])
            cis = [getattr(r, f"{metric}_ci_percent") for r in rows]
            error = None
            if all(ci is not None for ci in cis):
                error = np.array([[v - ci[0], ci[1] - v] for v, ci in zip(values, cis)]).T.clip(min=0)
            bars = ax.barh(y + offset, values, height, xerr=error, capsize=3, color=color, label=label)
            ax.bar_label(bars, fmt="%.3g%%", label_type="center", color="white", fontsize=8, fontweight="bold")
        ax.set_yticks(y, [r.policy + (" (this run)" if r.chosen else "") for r in rows])
        ax.invert_yaxis()
        source = rows[0].source
        ax.set_xlabel(f"overhead, % of the failure-free run time ({source})")
        ax.set_ylabel("policy")
        ax.set_title(("Simulated" if "simulated" in source else "Expected") + " fault-tolerance overhead per policy")
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize=8)

    def _plot_costs(self, figure: Any) -> None:
        ax = figure.add_subplot()
        rows = [r for r in self.data.checkpoints if r.persist_seconds is not None or r.stall_seconds is not None]
        if not rows:
            ax.text(0.5, 0.5, "no checkpoint costs recorded", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel("checkpoint step (completed steps)")
            return
        values = [v for r in rows for v in (r.stall_seconds, r.persist_seconds, r.staging_seconds) if v is not None]
        if self.data.profile is not None and self.data.profile.stall_seconds.value:
            values.append(float(self.data.profile.stall_seconds.value))
        scale, unit = (1e3, "ms") if max(values) < 1.0 else (1.0, "s")
        for attr, label, marker, color in (
            ("stall_seconds", "stall (training blocked)", "o", "C3"),
            ("staging_seconds", "host copy (background)", "^", "C0"),
            ("persist_seconds", "persist: write + commit (background)", "s", "C1"),
        ):
            points = [(r.step, getattr(r, attr) * scale) for r in rows if getattr(r, attr) is not None]
            if points:
                x, v = zip(*points)
                ax.plot(x, v, marker, ls="-", lw=0.8, ms=4, color=color, label=label)
        profile = self.data.profile
        if not any(r.stall_seconds is not None for r in rows) and profile is not None and profile.stall_seconds.value:
            ax.axhline(profile.stall_seconds.value * scale, color="C3", ls="--", lw=1.2,
                       label="stall (training blocked), profile median")
        ax.set_xlabel("checkpoint step (completed steps)")
        ax.set_ylabel(f"time per checkpoint ({unit})")
        positive = [v * scale for v in values if v > 0]
        if positive and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
        ax.set_title("What each checkpoint cost")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)

    # -- serialisation ------------------------------------------------------------------------

    def to_json(self) -> str:
        """The report as JSON (:class:`ReportData` plus the figure file names)."""
        payload = json.loads(self.data.model_dump_json())
        payload["figures"] = dict(FIGURES)
        payload["summary"] = self.summary()
        return json.dumps(payload, indent=2, allow_nan=False)

    def to_html(self, figures: dict[str, bytes] | None = None) -> str:
        """A self-contained HTML page: summary, tables and every figure embedded as base64 PNG."""
        figures = self.figures() if figures is None else figures
        images = "\n".join(
            f'<figure><img alt="{html.escape(name)} figure" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode("ascii")}"/><figcaption>{html.escape(FIGURES[name])}</figcaption></figure>'
            for name, png in figures.items()
        )
        checkpoints = _display_checkpoints(self.to_frame()).to_html(index=False, border=0, na_rep="-")
        comparison = self.comparison_frame()
        comparison_html = (
            comparison.drop(columns=["fallbacks"]).to_html(index=False, border=0, na_rep="-", float_format=lambda v: f"{v:.4g}")
            if not comparison.empty else "<p>No plan was recorded, so no comparison.</p>"
        )
        title = f"coci report: {html.escape(self.data.run_dir)}"
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
            f"<title>{title}</title><style>{_CSS}</style></head><body>\n"
            f"<h1>{title}</h1>\n<h2>Summary</h2>\n<pre>{html.escape(self.summary())}</pre>\n"
            f"<h2>Figures</h2>\n{images}\n"
            f"<h2>Checkpoints</h2>\n{checkpoints}\n"
            f"<h2>Policies over the whole run</h2>\n{comparison_html}\n"
            "</body></html>\n"
        )

    def write(self, run_dir: str | os.PathLike[str] | None = None) -> dict[str, Path]:
        """Write ``report.json``, ``report.html`` and the PNG figures into ``run_dir`` (default: the
        run's own directory); return the paths by name."""
        target = Path(self.data.run_dir if run_dir is None else run_dir)
        target.mkdir(parents=True, exist_ok=True)
        figures = self.figures()
        paths: dict[str, Path] = {}
        for name, png in figures.items():
            paths[name] = target / FIGURES[name]
            paths[name].write_bytes(png)
        paths["json"] = target / REPORT_JSON_FILENAME
        paths["json"].write_text(self.to_json(), encoding="utf-8")
        paths["html"] = target / REPORT_HTML_FILENAME
        paths["html"].write_text(self.to_html(figures), encoding="utf-8")
        return paths

    def _repr_html_(self) -> str:  # Jupyter
        return self.to_html()

    def __repr__(self) -> str:
        return self.summary()


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}"
    "table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
    "img{max-width:100%;height:auto}figure{margin:1em 0}figcaption{font-size:11px;color:#666}"
)


def _display_checkpoints(frame: pd.DataFrame) -> pd.DataFrame:
    """The checkpoint table with readable units (ms, kB) for text and HTML."""
    if frame.empty:
        return frame
    planned = frame["planned"].map(lambda v: "earlier plan" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else ("yes" if v else "no"))
    return pd.DataFrame(
        {
            "step": frame["step"],
            "planned": planned,
            "stall ms": frame["stall_seconds"].map(_ms),
            "copy ms": frame["staging_seconds"].map(_ms),
            "persist ms": frame["persist_seconds"].map(_ms),
            "bytes": frame["bytes"].map(lambda v: "-" if v is None or pd.isna(v) else _bytes(int(v))),
            "committed": frame["committed"].map(lambda v: "yes" if v else "NO"),
            "on disk": frame["on_disk"].map(lambda v: "yes" if v else "-"),
        }
    )


def _ms(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{1e3 * float(value):.3g}"


def _seconds(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) < 1.0:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s" if value < 60 else f"{value:.4g} s ({format_duration(value)})"


def _bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.3g} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1000
    return f"{value} B"


def _step_list(steps: list[int], limit: int = 12) -> str:
    if not steps:
        return "none"
    if len(steps) <= limit:
        return ", ".join(map(str, steps))
    head = ", ".join(map(str, steps[: limit // 2]))
    tail = ", ".join(map(str, steps[-limit // 2 :]))
    return f"{head}, ... {tail} ({len(steps)} steps)"


def _percent(value: float | None, ci: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if ci is None else f"{value:.3g} [{ci[0]:.3g}, {ci[1]:.3g}]"
