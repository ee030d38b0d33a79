"""The report as text: the plain-text summary, the checkpoint and policy tables, JSON and HTML."""

from __future__ import annotations

import base64
import html
import json
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pydantic_core

from coci import knobs
from coci.analysis.report.figures import FIGURES
from coci.analysis.report.read import CheckpointRow, PolicyRow, ReportData
from coci.analysis.report.small_cut import small_cut_reason
from coci.planning.records import Plan
from coci.units import format_duration

#: How the report names a checkpoint the plan did not ask for, by its logged reason.
OFF_PLAN_REASONS = {"request": "session.checkpoint()", "close": "save_last", "preemption": "preemption notice"}

__all__ = [
    "checkpoint_frame",
    "comparison_frame",
    "display_checkpoints",
    "format_bytes",
    "format_seconds",
    "html_pieces",
    "json_pieces",
    "step_list",
    "summary",
    "to_html",
    "to_json",
]


# --- tables --------------------------------------------------------------------------------------


def checkpoint_frame(data: ReportData) -> pd.DataFrame:
    """One row per checkpoint: step, planned (True/False/None = earlier plan), stall, staging
    and persist seconds, bytes, committed, still on disk, error; its promotion to the remote tier
    (upload seconds, bytes, still there); why it was taken (``reason``)."""
    return _rows_frame(data.checkpoints)


def _rows_frame(checkpoints: list[CheckpointRow]) -> pd.DataFrame:
    rows = [row.model_dump() for row in checkpoints]
    dtypes = {"step": "int64", "planned": object, "stall_seconds": "float64", "staging_seconds": "float64",
              "persist_seconds": "float64", "bytes": "Int64", "committed": "bool", "on_disk": "bool", "error": object,
              "upload_seconds": "float64", "remote_bytes": "Int64", "in_remote": "bool", "reason": object}
    return pd.DataFrame({name: pd.Series([r[name] for r in rows], dtype=dtype) for name, dtype in dtypes.items()})


def comparison_frame(data: ReportData) -> pd.DataFrame:
    """One row per policy: checkpoints, first/last interval, expected overheads (s and %)."""
    return pd.DataFrame([row.model_dump() for row in data.comparison], columns=list(PolicyRow.model_fields))


def summary(data: ReportData, plans: dict[str, Plan]) -> str:
    """A readable plain-text summary (what ``coci report`` prints)."""
    obs, plan = data.observed, data.plan
    lines = [f"coci report: {data.run_dir}"]
    run = f"  run: {obs.steps} steps"
    if obs.step_seconds:
        source = f"median of the recent {data.profile.step_seconds_source} steps" if data.profile is not None else "the plan's"
        run += f", step {format_seconds(obs.step_seconds)} ({source})"
    if data.profile is not None and data.profile.state_bytes:
        run += f", state {format_bytes(data.profile.state_bytes)}"
    lines.append(run)
    if data.initialized_from is not None:
        lines.append(f"  started from: {data.initialized_from} (init_from)")
    lines += _plan_lines(data)
    lines += _why_lines(data)
    lines += _checkpoint_lines(data)
    lines += _restore_lines(data)
    lines += _resume_check_lines(data)
    lines += _cost_lines(data, plans)
    lines += _lost_work_lines(data, plans)
    lines += _preemption_lines(data)
    fallbacks = list(plan.fallbacks) if plan else []
    lines.append("fallbacks: " + ("none" if not fallbacks else ""))
    lines += [f"  - {f}" for f in fallbacks]
    if plan and plan.notes:
        lines.append("plan notes:")
        lines += [f"  - {n}" for n in plan.notes]
    if data.errors:
        lines.append("persist errors:")
        lines += [f"  - {e}" for e in data.errors]
    if data.notes:
        lines.append("report notes:")
        lines += [f"  - {n}" for n in data.notes]
    lines += _comparison_lines(data)
    return "\n".join(lines)


def _plan_lines(data: ReportData) -> list[str]:
    plan = data.plan
    if plan is None and data.planning:
        return [
            f"  plan: none made: the run ended after {data.observed.steps} steps, before its first plan arrived; "
            f"checkpoints until then are the warm-up's (auto: steps {', '.join(map(str, knobs.PLAN_WARMUP_CHECKPOINT_STEPS))})"
        ]
    if plan is None:
        return ["  plan: none recorded (the policy does not plan, e.g. EveryN / fixed steps)"]
    budget = "none" if plan.time_budget is None else f"{plan.time_budget:.0%}"
    mu = "" if plan.mu is None else f", mu {plan.mu:.3g}"
    lines = [
        f"  policy: {plan.policy} (objective {plan.objective}, time budget {budget}{mu}); "
        f"{data.replans} plan(s) made, horizon {plan.inputs.total_steps} steps",
        f"  failure model: {plan.inputs.failures.describe() if plan.inputs.failures else 'none'}; "
        f"restart {format_seconds(plan.inputs.restart_seconds)}",
        f"  costs planned with (as measured by step {plan.inputs.start_step}; the costs section has the run's): "
        f"stall {format_seconds(plan.inputs.stall_seconds)}, interference "
        f"{format_seconds(plan.inputs.interference_seconds)}, persist {format_seconds(plan.inputs.persist_seconds)}, "
        f"step {format_seconds(plan.inputs.step_seconds)}",
    ]
    fit = plan.fit
    if fit is None:
        lines.append("  fit: none (no loss curve used)")
    elif not fit.usable:
        lines.append(f"  fit: unusable ({fit.fallback})")
    else:
        params = ", ".join(_fit_param(k, v) for k, v in fit.params.items())
        holdout = "n/a" if fit.holdout_error is None else f"{fit.holdout_error:.3g}"
        lines.append(
            f"  fit: {fit.family} ({params}); holdout error {holdout}, window from step "
            f"{(fit.window_start or 0):.0f}, {fit.n_points} points"
        )
    return lines


def _fit_param(name: str, value: float) -> str:
    """A fitted parameter; the floor ``c`` is shown at 0 when negative, as the planner uses it
    (a positive loss: the fitted curve stops falling at 0)."""
    if name == "c" and value < 0:
        return "c=0 (floor at 0)"
    return f"{name}={value:.4g}"


def _why_lines(data: ReportData) -> list[str]:
    """Why this plan, in words: what a checkpoint costs, how often failures come, what that makes
    the time-optimal interval (Young), and what the progress objective changes."""
    plan = data.plan
    if plan is None:
        return []
    inputs = plan.inputs
    cost, step = inputs.checkpoint_seconds, inputs.step_seconds
    lines = ["why this plan:"]
    text = (
        f"  one checkpoint costs training {format_seconds(cost)} (stall {format_seconds(inputs.stall_seconds)} + "
        f"interference {format_seconds(inputs.interference_seconds)}); a step takes {format_seconds(step)}"
    )
    failures = inputs.failures
    if failures is not None and cost > 0 and step > 0:
        mtbf = failures.mean_seconds
        young = math.sqrt(2.0 * cost * mtbf)
        steps = young / step
        interval = "under one step" if steps < 1 else f"about {steps:.3g} steps"
        text += (
            f". With a job MTBF of {format_seconds(mtbf)}, the time-optimal interval (Young: sqrt(2 x cost x MTBF)) "
            f"is {format_seconds(young)}, {interval}"
        )
        if plan.steps and len(plan.steps) > 1:
            gaps = np.diff(np.asarray(plan.steps))
            text += f"; this plan's intervals run from {int(gaps.min())} to {int(gaps.max())} steps"
    lines.append(text + ".")
    if plan.objective == "progress":
        lines.append(
            "  objective 'progress': a lost step counts by how much the loss fell in it, so early steps (fast "
            "falling loss) are worth more and are checkpointed more densely, within a time budget of extra "
            "wall time. mu (or alpha) is the mixture weight between that progress weighting and plain wall "
            "time (0 = progress only); the fit's parameters describe the loss curve the weighting comes from."
        )
        trace = (np.asarray(data.loss_steps), np.asarray(data.losses)) if len(data.losses) > 2 else None
        reason = small_cut_reason(plan, trace)
        if reason is not None:
            lines.append(f"  {reason}")
    return lines


_SOURCES = {"local": "local tier", "peer": "from a peer node's copy", "remote": "from the remote tier"}


def _restore_lines(data: ReportData) -> list[str]:
    """Each restore: the step it resumed from, why, its cost and the restart cost."""
    if not data.restores:
        return []
    lines = [f"restores: {len(data.restores)}"]
    for row in data.restores:
        why = "after a failure" if row.failure else "after a preemption" if row.preempted else "after a clean close"
        text = f"  step {row.step} ({why}"
        if row.lost_steps == 0 and not row.lost_exact:  # the failed process's last known step is the restored one or older
            text += ", lost steps unknown (no step of the failed process is known past the restored one)"
        elif row.lost_steps is not None:
            text += f", {'' if row.lost_exact else 'at least '}{row.lost_steps} steps lost"
        if row.node_tiers:  # node-local run directories: each node's source
            text += "; " + ", ".join(f"node {node} {_SOURCES[tier]}" for node, tier in row.node_tiers.items())
        else:
            text += f"; {_SOURCES.get(row.tier, f'from {row.tier}')}" if row.tier else ""
        text += f"): restore {format_seconds(row.seconds)}"
        if row.restart_seconds is not None:
            text += f", restart {format_seconds(row.restart_seconds)} (process start to first step)"
        lines.append(text)
    sources = Counter(
        tier for row in data.restores for tier in (row.node_tiers.values() if row.node_tiers else [row.tier]) if tier is not None
    )
    if sources:
        order = {tier: rank for rank, tier in enumerate(_SOURCES)}  # the built-in levels first, the added ones by name
        lines.append("  by source: " + ", ".join(f"{tier} {sources[tier]}" for tier in sorted(sources, key=lambda t: (order.get(t, 3), t))))
    return lines


def _resume_check_lines(data: ReportData) -> list[str]:
    """The resume self-check: the redone steps compared with the losses logged before each failure."""
    checks = data.resume_checks
    if not data.restores and not checks.restores and not checks.inexact_restores:
        return []
    if not checks.restores and not checks.inexact_restores:
        return ["resume self-check: no redone step had a logged loss to compare"]
    inexact = max(checks.inexact_restores, int(checks.mismatches > 0))
    line = f"resume self-check: {checks.steps} redone steps checked after {checks.restores} restore(s), {checks.mismatches} mismatch(es)"
    if not inexact:
        return [line + ": every resume checked was exact"]
    lines = [line + f": {inexact} resume(s) NOT exact"]
    first = checks.first
    if first is not None:
        lines.append(
            f"  first: step {first.get('step')} redone from the checkpoint of step {first.get('restored_step')}: "
            f"loss {first.get('resumed')}, logged before the failure {first.get('logged')}"
        )
        lines += [f"  - {cause}" for cause in first.get("causes") or [] if isinstance(cause, str)]
    return lines


def _checkpoint_lines(data: ReportData) -> list[str]:
    obs, plan = data.observed, data.plan
    lines = [
        f"checkpoints: {obs.checkpoints} taken, {obs.committed} committed, {obs.failed} failed, "
        f"{obs.on_disk} on disk now"
    ]
    if obs.promotions:
        lines.append(
            f"remote tier: {obs.promotions} promoted, {format_bytes(obs.remote_bytes)} uploaded in "
            f"{format_seconds(obs.upload_seconds)} (in the background), "
            f"{sum(row.in_remote for row in data.checkpoints)} there now"
        )
    for name, copies in obs.level_copies.items():  # the levels added above the remote tier
        lines.append(f"{name}: {copies} copied, {format_bytes(obs.level_bytes.get(name, 0))} in "
                     f"{format_seconds(obs.level_seconds.get(name, 0.0))} (in the background)")
    if obs.peer_sent or obs.peer_received or obs.peer_held:
        rate = f", {format_bytes(int(obs.peer_bytes / obs.peer_seconds))}/s" if obs.peer_seconds > 0 else ""
        lines.append(
            f"peer copies: {obs.peer_sent} of this node's parts sent, {format_bytes(obs.peer_bytes)} in "
            f"{format_seconds(obs.peer_seconds)}{rate} (in the background); {obs.peer_received} received "
            f"for other nodes, {obs.peer_held} held now; {obs.peer_refused} refused on restore"
        )
    if data.warmup_skips:
        reasons = Counter(data.warmup_skips.values())
        why = ", ".join(f"{reason.replace('_', ' ')} {count}" for reason, count in sorted(reasons.items()))
        lines.append(f"  warm-up checkpoints skipped: {len(data.warmup_skips)} at steps {step_list(sorted(data.warmup_skips))} ({why})")
    if plan is not None:
        lines += _plan_against_taken_lines(data, plan)
    rows = data.checkpoints
    if rows:
        remote = any(row.upload_seconds is not None for row in rows)
        table = display_checkpoints(_rows_frame(rows if len(rows) <= 12 else [*rows[:6], *rows[-6:]]), remote=remote)
        if len(rows) > 12:
            lines.append(f"  (first and last 6 of {len(rows)} checkpoints)")
        lines += ["  " + line for line in table.to_string(index=False).splitlines()]
    return lines


def _plan_against_taken_lines(data: ReportData, plan: Plan) -> list[str]:
    """The current plan's steps beside the checkpoints taken since it took effect: a plan made on
    the planner thread from the observation at ``start_step`` applies some steps later
    (``plan_applied_step``), and the plan before it governs until then."""
    obs, made = data.observed, plan.inputs.start_step
    applied = data.plan_applied_step if data.plan_applied_step is not None and data.plan_applied_step > made else None
    first = made + 1 if applied is None else applied  # the first step this plan governs
    made_text = f"made at step {made}" + ("" if applied is None else f", in effect from step {applied}")
    reached = [s for s in plan.steps if first <= s <= obs.steps] if obs.steps else []
    taken_after = [r.step for r in data.checkpoints if r.step >= first]
    if not plan.steps:
        lines = [f"  current plan ({made_text}): no checkpoint left before step {plan.inputs.total_steps}"]
    else:
        lines = [
            f"  current plan ({made_text}): {step_list(plan.steps)}"
            + (f"; {len(reached)} within the {obs.steps} steps run" if obs.steps else "")
        ]
    if plan.steps or taken_after:
        since = f"after step {made}" if applied is None else f"from step {applied}"
        lines.append(f"  taken {since}: {step_list(taken_after)}")
    off_plan = {r.step: r.reason for r in data.checkpoints if r.step >= first and r.reason in OFF_PLAN_REASONS}
    missed = sorted(set(reached) - set(taken_after))
    extra = sorted(set(taken_after) - set(plan.steps) - set(off_plan))
    if missed or extra:
        lines.append(f"  planned but not taken: {step_list(missed)}; taken but not planned: {step_list(extra)}")
    if off_plan:
        lines.append("  also taken: " + ", ".join(f"{step} ({OFF_PLAN_REASONS[reason]})" for step, reason in sorted(off_plan.items())))
    return lines


def _cost_lines(data: ReportData, plans: dict[str, Plan]) -> list[str]:
    obs, profile = data.observed, data.profile
    lines = ["costs:"]
    rows = [r for r in data.checkpoints if r.persist_seconds is not None]
    if obs.stall_seconds is not None:
        tag = " (partly estimated)" if obs.stall_estimated else ""
        per = obs.stall_seconds / obs.checkpoints if obs.checkpoints else 0.0
        lines.append(f"  stall: {format_seconds(obs.stall_seconds)} in all{tag}, {format_seconds(per)} per checkpoint")
    if rows:
        persist = np.array([r.persist_seconds for r in rows], dtype=float)
        lines.append(
            f"  persist (background): median {format_seconds(float(np.median(persist)))}, max "
            f"{format_seconds(float(persist.max()))} per checkpoint"
        )
    if profile is not None and profile.interference.value is not None:
        lines.append(_interference_line(profile.interference.value, profile.interference_seconds))
    if obs.processes:
        lines.append(
            f"  coci's own time on the training thread: per-step work {format_seconds(obs.step_work_seconds)}, "
            f"planning {format_seconds(obs.planning_seconds)}, final wait {format_seconds(obs.close_wait_seconds)}"
            f", restore {format_seconds(obs.restore_seconds)} ({obs.processes} process(es))"
        )
        lines.append(
            f"  planner thread (its CPU time x the training thread's CPU contention, less waits already counted): "
            f"{format_seconds(obs.planner_thread_seconds)}; Session(...) set-up {format_seconds(obs.setup_seconds)}"
        )
    if obs.startup_seconds is not None:
        lines.append(
            f"  start-up (process start to Session, all processes): {format_seconds(obs.startup_seconds)}; it holds "
            "`import coci` with your own imports and set-up, and is not counted below"
        )
    if obs.overhead_percent is not None:
        line = (
            f"  coci overhead (stalls + interference + per-step work + planning + planner thread + final wait + set-up): "
            f"{format_seconds(obs.overhead_seconds or 0.0)} = {obs.overhead_percent:.2f}% of "
            f"{format_seconds(obs.compute_seconds or 0.0)} of compute (steps x that recent median step)"
        )
        reference, where = _expectation(data, plans)
        if reference is not None and reference.expected.get("run_seconds"):
            expected = reference.expected
            share = 100.0 * expected.get("checkpoint_seconds", 0.0) / expected["run_seconds"]
            line += (
                f"; {where} expects its checkpoints to cost {share:.2f}% of the run, and "
                f"{100 * expected.get('wall_fraction', 0):.2f}% with the work the failures it assumes lose and their restarts"
            )
        lines.append(line)
    return lines


def _interference_line(ratio: float, seconds: float) -> str:
    """How much longer the median step during a persist took than the others', and what that costs."""
    if ratio > 1.0:
        measured = f"the median step during a persist took {ratio:.3g}x the others' (+{100 * (ratio - 1):.3g}%)"
    else:
        measured = f"none (the median step during a persist took {ratio:.3g}x the others')"
    return f"  interference: {measured} = {format_seconds(seconds)} per checkpoint"


def _expectation(data: ReportData, plans: dict[str, Plan]) -> tuple[Plan | None, str]:
    """The plan expectations are read from: the run's policy planned over the whole run with the
    final measurements (comparison), else the current plan (which covers only its own span)."""
    plan = data.plan
    if plan is not None and plan.policy in plans:
        return plans[plan.policy], f"{plan.policy} planned over the whole run"
    if plan is not None:
        return plan, f"the current plan (steps {plan.inputs.start_step}-{plan.inputs.total_steps})"
    return None, ""


def _lost_work_lines(data: ReportData, plans: dict[str, Plan]) -> list[str]:
    obs = data.observed
    lines = ["lost work:"]
    reference, where = _expectation(data, plans)
    if reference is not None and reference.expected.get("failures"):
        expected = reference.expected
        per_failure = expected.get("lost_seconds", 0.0) / expected["failures"]
        lines.append(
            f"  expected ({where}): {expected['failures']:.3g} failures, "
            f"{format_seconds(expected.get('lost_seconds', 0.0))} lost = {format_seconds(per_failure)} per failure"
        )
    if obs.failures:
        per = (obs.lost_seconds or 0.0) / obs.failures
        exact = all(row.lost_exact for row in data.restores if row.failure)
        bound = "" if exact else "at least "
        how = "up to the step each killed process reached" if exact else "up to the last logged event before a failure"
        lines.append(
            f"  observed: {obs.failures} failure(s), {bound}{obs.lost_steps} steps "
            f"({format_seconds(obs.lost_seconds or 0.0)}) lost = {bound}{format_seconds(per)} per failure (counted {how})"
        )
    else:
        restarts = len(data.restores)
        lines.append(f"  observed: no failures ({restarts} restore(s) after a clean close)" if restarts else "  observed: no failures")
    if reference is not None and obs.failures:
        span = max(int(reference.inputs.total_steps) - int(reference.inputs.start_step), 1)
        share = min(obs.steps / span, 1.0) if obs.steps else 1.0  # the part of the planned run done so far
        flag = failure_count_flag(obs.failures, float(reference.expected.get("failures") or 0.0) * share)
        if flag is not None:
            lines.append(f"  {flag}")
    return lines


#: A failure count whose chance under the failure model is below this is flagged by the report.
_FAILURES_FLAG_CHANCE: float = 0.01


def failure_count_flag(observed: int, expected: float) -> str | None:
    """A warning line when ``observed`` failures are far more than the failure model's ``expected``
    count for the steps run (a Poisson chance of at least that many below ``_FAILURES_FLAG_CHANCE``),
    else None: the plan was made for a machine that fails less often than this one."""
    if observed <= 0 or not math.isfinite(expected) or expected < 0:
        return None
    term = math.exp(-expected)
    below = 0.0
    for count in range(observed):  # P(N < observed)
        below += term
        term *= expected / (count + 1)
    chance = max(1.0 - below, 0.0)
    if chance >= _FAILURES_FLAG_CHANCE:
        return None
    return (
        f"FAILURES ABOVE THE MODEL: {observed} observed against {expected:.3g} expected for the steps run "
        f"(chance {chance:.2g} under it); the plan assumed fewer failures than this machine has: set mtbf= "
        "(or failures=) from what you see"
    )


def _preemption_lines(data: ReportData) -> list[str]:
    """One line per preemption notice: the step committed, how long it took against the grace."""
    if not data.preemptions:
        return []
    lines = ["preemptions:"]
    for row in data.preemptions:
        line = (
            f"  - step {row.step} ({row.signal or 'notice on another rank'}): committed "
            f"{format_seconds(row.notice_seconds)} after the notice, grace {format_seconds(row.grace_seconds)}"
        )
        if row.fits is False:
            line += f"; the checkpoint estimate {format_seconds(row.estimate_seconds)} does NOT fit the grace"
        if row.within_grace is False:
            line += "; took longer than the grace"
        if row.promoted:
            line += f"; in the remote tier {format_seconds(row.promoted_seconds)} after the notice"
        elif row.promoted is False:
            line += "; NOT in the remote tier within the grace (a lost node resumes from an older promoted step)"
        if row.restart_seconds is not None:
            line += f"; restarted {format_seconds(row.restart_seconds)} later"
        lines.append(line)
    return lines


def _comparison_lines(data: ReportData) -> list[str]:
    rows = data.comparison
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
    lines += _failure_hours_lines(rows)
    return lines


def _failure_hours_lines(rows: list[PolicyRow]) -> list[str]:
    """What failures cost the run in hours (restarts and lost work) under ``auto`` and under Young,
    wall-clock and progress-weighted, with the 95% intervals where simulated."""
    by_name = {row.policy: row for row in rows if row.failure_hours is not None}
    if "auto" not in by_name or "young" not in by_name:
        return []

    def hours(row: PolicyRow) -> str:
        wall = _hours_text(row.failure_hours, row.failure_hours_ci)
        return f"{wall} of wall time, {_hours_text(row.progress_failure_hours, row.progress_failure_hours_ci)} progress-weighted"

    auto, young = by_name["auto"], by_name["young"]
    saved = (young.progress_failure_hours or 0.0) - (auto.progress_failure_hours or 0.0)
    return [
        "  hours lost to failures (restarts + lost work) over the run:",
        f"    auto:  {hours(auto)}",
        f"    young: {hours(young)}",
        f"    auto saves {saved:.3g} h progress-weighted against young",
    ]


def _hours_text(value: float | None, ci: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g} h" + ("" if ci is None else f" [{ci[0]:.3g}, {ci[1]:.3g}]")


# --- JSON and HTML -------------------------------------------------------------------------------


#: Items of a list field (checkpoint rows, restores, loss points) serialised per piece of
#: ``json_pieces``: what writing ``report.json`` holds at once, whatever the number of checkpoints.
_JSON_ITEMS_PER_PIECE: int = 200


def to_json(data: ReportData, summary_text: str) -> str:
    """The report as JSON (``ReportData`` plus the figure file names and the summary)."""
    return "".join(json_pieces(data, summary_text))


def json_pieces(data: ReportData, summary_text: str) -> Iterator[str]:
    """``to_json``'s text in pieces, each at most ``_JSON_ITEMS_PER_PIECE`` items of a list: writing
    them one by one (``Report.write``) holds one piece, never the whole report, so a run of 100,000
    checkpoints is written in the memory of 200. Infinite and NaN numbers are ``null``, as in
    ``ReportData.model_dump_json``; one list item (a checkpoint row) per line."""
    fields: dict[str, Any] = {name: getattr(data, name) for name in ReportData.model_fields}
    fields.update(figures=dict(FIGURES), summary=summary_text)
    yield "{"
    for index, (name, value) in enumerate(fields.items()):
        yield ("," if index else "") + f"\n  {json.dumps(name)}: "
        if isinstance(value, list) and value:
            yield from _json_list_pieces(value)
        else:
            yield _json_text(value, indent=2).replace("\n", "\n  ")  # JSON strings hold no raw newline
    yield "\n}\n"


def _json_list_pieces(items: list[Any]) -> Iterator[str]:
    yield "["
    for start in range(0, len(items), _JSON_ITEMS_PER_PIECE):
        batch = items[start:start + _JSON_ITEMS_PER_PIECE]
        yield ("," if start else "") + ",".join("\n    " + _json_text(item) for item in batch)
    yield "\n  ]"


def _json_text(value: Any, indent: int | None = None) -> str:
    return pydantic_core.to_json(value, indent=indent, inf_nan_mode="null").decode("utf-8")


#: Checkpoint rows rendered per piece of ``html_pieces`` (see ``_JSON_ITEMS_PER_PIECE``).
_HTML_ROWS_PER_PIECE: int = 200


def to_html(data: ReportData, summary_text: str, figures: dict[str, bytes]) -> str:
    """A self-contained HTML page: summary, tables and every figure embedded as base64 PNG."""
    return "".join(html_pieces(data, summary_text, figures))


def html_pieces(data: ReportData, summary_text: str, figures: dict[str, bytes]) -> Iterator[str]:
    """``to_html``'s page in pieces: the checkpoint table at most ``_HTML_ROWS_PER_PIECE`` rows a
    piece, so writing them one by one (``Report.write``) never holds the whole table."""
    images = "\n".join(
        f'<figure><img alt="{html.escape(name)} figure" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"/><figcaption>{html.escape(FIGURES[name])}</figcaption></figure>'
        for name, png in figures.items()
    )
    title = f"coci report: {html.escape(data.run_dir)}"
    yield (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
        f"<title>{title}</title><style>{_CSS}</style></head><body>\n"
        f"<h1>{title}</h1>\n<h2>Summary</h2>\n<pre>{html.escape(summary_text)}</pre>\n"
        f"<h2>Figures</h2>\n{images}\n"
        "<h2>Checkpoints</h2>\n"
    )
    yield from _checkpoint_table_pieces(data.checkpoints)
    comparison = comparison_frame(data)
    comparison_html = (
        comparison.drop(columns=["fallbacks"]).to_html(index=False, border=0, na_rep="-", float_format=lambda v: f"{v:.4g}")
        if not comparison.empty else "<p>No plan was recorded, so no comparison.</p>"
    )
    yield f"\n<h2>Policies over the whole run</h2>\n{comparison_html}\n</body></html>\n"


def _checkpoint_table_pieces(rows: list[CheckpointRow]) -> Iterator[str]:
    """The checkpoint table (``display_checkpoints``' columns) as HTML, one piece per block of rows."""
    if not rows:
        yield "<p>No checkpoint was taken.</p>"
        return
    remote = any(row.upload_seconds is not None for row in rows)
    for start in range(0, len(rows), _HTML_ROWS_PER_PIECE):
        table = display_checkpoints(_rows_frame(rows[start:start + _HTML_ROWS_PER_PIECE]), remote=remote)
        head = "".join(f"<th>{html.escape(str(name))}</th>" for name in table.columns)
        opening = f'<table class="dataframe">\n<thead><tr style="text-align: right;">{head}</tr></thead>\n<tbody>\n'
        yield (opening if not start else "") + "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(value))}</td>" for value in values) + "</tr>\n"
            for values in table.itertuples(index=False, name=None)
        )
    yield "</tbody>\n</table>"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}"
    "table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
    "img{max-width:100%;height:auto}figure{margin:1em 0}figcaption{font-size:11px;color:#666}"
)


def display_checkpoints(frame: pd.DataFrame, remote: bool | None = None) -> pd.DataFrame:
    """The checkpoint table with readable units (ms, kB) for text and HTML; with the remote tier's
    columns when ``remote`` (default: when a row of ``frame`` was promoted)."""
    if remote is None:
        remote = bool(frame["upload_seconds"].notna().any()) if not frame.empty else False
    if frame.empty:
        return frame
    planned = [_planned_label(v, reason) for v, reason in zip(frame["planned"], frame["reason"])]
    return pd.DataFrame(
        {
            "step": frame["step"],
            "planned": planned,
            "stall ms": frame["stall_seconds"].map(_ms),
            "copy ms": frame["staging_seconds"].map(_ms),
            "persist ms": frame["persist_seconds"].map(_ms),
            "bytes": frame["bytes"].map(lambda v: "-" if v is None or pd.isna(v) else format_bytes(int(v))),
            "committed": frame["committed"].map(lambda v: "yes" if v else "NO"),
            "on disk": frame["on_disk"].map(lambda v: "yes" if v else "-"),
        }
    ) if not remote else _with_remote_columns(frame)


def _planned_label(planned: Any, reason: Any) -> str:
    """The checkpoint table's "planned" cell: yes, why it was taken apart from the plan, no, or
    "earlier plan" (no record of the plan that governed it)."""
    if planned is True:
        return "yes"
    if reason in OFF_PLAN_REASONS:
        return OFF_PLAN_REASONS[reason]
    unknown = planned is None or planned is pd.NA or (isinstance(planned, float) and math.isnan(planned))
    return "earlier plan" if unknown else ("yes" if planned else "no")


def _with_remote_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The checkpoint table of a run with a remote tier: where each checkpoint lives, its upload."""
    table = display_checkpoints(frame, remote=False)
    where = [("local+remote" if local and remote else "local" if local else "remote" if remote else "-")
             for local, remote in zip(frame["on_disk"], frame["in_remote"])]
    return table.drop(columns=["on disk"]).assign(**{"upload ms": frame["upload_seconds"].map(_ms), "where": where})


def _ms(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{1e3 * float(value):.3g}"


def format_seconds(value: float | None) -> str:
    """Seconds for people: ms below one second, a duration beside minutes and more; "-" if unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) < 1.0:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s" if value < 60 else f"{value:.4g} s ({format_duration(value)})"


def format_bytes(value: int) -> str:
    """Bytes in decimal units (B, kB, MB, GB) at three significant digits."""
    size = float(value) if value < 2**1000 else math.inf  # a hostile profile.json's huge integer
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.3g} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1000
    return f"{value} B"


def step_list(steps: list[int], limit: int = 12) -> str:
    """Steps as a comma-separated list; beyond ``limit`` of them, the first and last few."""
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
