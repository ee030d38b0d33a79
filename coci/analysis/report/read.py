"""Reading a run directory written by [``coci.Session``][coci.Session] into a ``ReportData``.

What it reads (every input is optional except the directory itself; what is missing is said in
``ReportData.notes``, never guessed silently):

* ``events.jsonl``: every checkpoint's snapshot, commit and persist times and bytes, persist errors,
  restores, and one ``plan`` event per (re-)plan. A ``stall`` event (``step``, ``seconds``) gives the
  stall of each checkpoint; where a run has none, the per-checkpoint stall is unknown and the total
  is estimated from the profile's median stall (marked as estimated). A ``plan`` event that carries
  ``steps`` lets the report mark every checkpoint as planned or not; otherwise only checkpoints
  inside the final plan's span are marked and earlier ones show "earlier plan" (None).
* ``plan.json``: the current [``coci.planning.records.Plan``][coci.Plan] (its inputs, fit, failure model,
  expected costs, fallbacks).
* ``profile.json``: the final [``coci.profiler.Profile``][coci.Profile] (clean step time, stall, persist,
  interference).
* ``checkpoints/``: the committed checkpoints on disk (manifests only; nothing is verified here,
  that is ``coci verify``).
* The loss trace: ``loss_curve.json`` (``{"steps": [...], "losses": [...]}``) when the run wrote
  one; else the profiler's trace saved inside the newest committed checkpoint (only those arrays are
  read, by offset, without the checksum pass); else none, and the loss figure shows the fit alone.

Restores and the work each failure lost: ``coci.analysis.report.restores``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from coci import knobs
from coci.analysis.report.restores import RestoreRow, Restores, event_step, finite_number, is_level_name, total_lost_seconds
from coci.checkpoint.checkpointer import load_entry
from coci.checkpoint.layout import SESSION_KEY, checkpoints_dir, committed_steps, has_root
from coci.checkpoint.peers import PEER_DIRNAME
from coci.checks import is_int
from coci.curves import loss_trace as _loss_trace
from coci.curves import run_loss_trace
from coci.errors import CociError, ConfigError, CorruptCheckpointError
from coci.events import (
    CHECKPOINT_REASONS,
    EVENT_NUMBER_MAX,
    EVENTS_FILENAME,
    STEP_MARK_FILENAME,
    read_events,
    read_run_file,
    read_step_mark,
)
from coci.planning.records import Plan
from coci.profiler import Profile

__all__ = ["CheckpointRow", "ObservedCosts", "PolicyRow", "ReportData", "read_run", "run_loss_trace"]

logger = logging.getLogger(__name__)

#: Most different problems with ``events.jsonl`` records the report lists (each with its count);
#: the rest are counted in one note, so a hostile log cannot grow the notes with its length.
_REPORT_MAX_EVENT_PROBLEMS: int = 100


PLAN_FILENAME = "plan.json"
PROFILE_FILENAME = "profile.json"


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
    upload_seconds: float | None = None  # its promotion to the remote tier (None: not promoted)
    remote_bytes: int | None = None
    in_remote: bool = False  # promoted and not yet removed by the remote tier's retention
    reason: str | None = None  # why it was taken (``coci.events.CHECKPOINT_REASONS``); None: not logged


class PreemptionRow(BaseModel):
    """One preemption notice (a ``preempted`` event) and the restart after it, if any (seconds)."""

    step: int
    signal: str | None = None
    notice_seconds: float | None = None
    grace_seconds: float | None = None
    estimate_seconds: float | None = None
    fits: bool | None = None
    within_grace: bool | None = None
    restart_seconds: float | None = None
    # its checkpoint in the remote tier within the grace (None: no remote tier, or not logged)
    promoted: bool | None = None
    promoted_seconds: float | None = None  # from the notice to the end of that upload


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
    step_work_seconds: float = 0.0
    planning_seconds: float = 0.0
    planner_thread_seconds: float = 0.0
    setup_seconds: float = 0.0
    close_wait_seconds: float = 0.0
    restore_seconds: float = 0.0
    startup_seconds: float | None = None
    processes: int = 0
    overhead_seconds: float | None = None
    overhead_percent: float | None = None
    failures: int = 0
    lost_steps: int = 0
    lost_seconds: float | None = None
    promotions: int = 0
    upload_seconds: float = 0.0
    remote_bytes: int = 0
    # peer copies (node-local run directories): this node's parts sent to the next node, the
    # copies it received for other nodes, those it holds now, and copies a restore refused
    peer_sent: int = 0
    peer_bytes: int = 0
    peer_seconds: float = 0.0
    peer_received: int = 0
    peer_held: int = 0
    peer_refused: int = 0
    # each level added above the remote tier (level4, ...): its copies, their bytes and seconds
    level_copies: dict[str, int] = Field(default_factory=dict)
    level_bytes: dict[str, int] = Field(default_factory=dict)
    level_seconds: dict[str, float] = Field(default_factory=dict)


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
    # what failures cost the run (restarts + lost work), in hours: wall-clock and progress-weighted, with 95% CIs when simulated
    failure_hours: float | None = None
    failure_hours_ci: list[float] | None = None
    progress_failure_hours: float | None = None
    progress_failure_hours_ci: list[float] | None = None
    source: str = "expected"
    fallbacks: list[str] = Field(default_factory=list)
    error: str | None = None


class ResumeChecks(BaseModel):
    """The resume self-check's events (``coci.resume_check``): ``restores`` whose redone steps
    were compared (``resume_check``), the ``steps`` checked, the ``mismatches`` among them, the
    restores found inexact (``resume_mismatch``, one per restore at most) and the first of those."""

    restores: int = 0
    steps: int = 0
    mismatches: int = 0
    inexact_restores: int = 0
    first: dict[str, Any] | None = None  # the first resume_mismatch: step, restored_step, logged, resumed, causes

    def add(self, event: dict[str, Any], kind: Any) -> None:
        if kind == "resume_check":
            self.restores += 1
            self.steps += int(event.get("checked") or 0)
            self.mismatches += int(event.get("mismatches") or 0)
        elif kind == "resume_mismatch":
            self.inexact_restores += 1
            if self.first is None:
                self.first = {key: event.get(key) for key in ("step", "restored_step", "logged", "resumed", "causes")}


class ReportData(BaseModel):
    """Everything the report shows, as one JSON-able record (``report.json``)."""

    run_dir: str
    created: float
    plan: Plan | None = None
    # the step the current plan took effect (its plan event): a plan made on the planner thread
    # from the observation at ``plan.inputs.start_step`` applies some steps later; None: not logged
    plan_applied_step: int | None = None
    profile: Profile | None = None
    replans: int = 0
    planning: bool = False  # the run's policy plans (auto, young, ...): no plan then means none was made yet
    checkpoints: list[CheckpointRow] = Field(default_factory=list)
    restores: list[RestoreRow] = Field(default_factory=list)
    preemptions: list[PreemptionRow] = Field(default_factory=list)
    observed: ObservedCosts = Field(default_factory=ObservedCosts)
    loss_steps: list[float] = Field(default_factory=list)
    losses: list[float] = Field(default_factory=list)
    loss_source: str = "none"
    resume_checks: ResumeChecks = Field(default_factory=ResumeChecks)
    warmup_skips: dict[int, str] = Field(default_factory=dict)  # step -> why (warmup_skip events)
    comparison: list[PolicyRow] = Field(default_factory=list)
    comparison_steps: dict[str, list[int]] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    initialized_from: str | None = None  # Session(init_from=): the run, step and keys this run started from


def read_run(run_dir: Path) -> ReportData:
    """The ``ReportData`` of the run directory ``run_dir``, without the policy comparison."""
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir {str(run_dir)!r} is not a directory")
    notes: list[str] = []
    if (run_dir / EVENTS_FILENAME).is_symlink():
        notes.append(f"{EVENTS_FILENAME} is a symbolic link; ignored (run files are read inside the run directory only)")
    plan = _read_model(run_dir / PLAN_FILENAME, Plan, notes)
    profile = _read_model(run_dir / PROFILE_FILENAME, Profile, notes)
    if profile is None:
        profile = _profile_from_checkpoint(run_dir, notes)
    step_seconds = _step_seconds(profile, plan)
    events = _EventDigest(step_seconds)
    for event in sane_events(read_events(run_dir, _event_log_name(run_dir, notes)), notes):  # streamed: the log is never held
        events.add(event)
    notes += events.job_changes
    on_disk = {step for step, _ in committed_steps(checkpoints_dir(run_dir))}
    if not events.count and plan is None and profile is None and not on_disk:
        raise ConfigError(
            f"run_dir {str(run_dir)!r} holds no coci run (no events.jsonl, plan.json, profile.json or checkpoints)"
        )
    rows, errors = events.rows.finish(on_disk)
    _mark_planned(rows, events.plans, plan, notes)
    restores = events.restores.rows
    mark = read_step_mark(run_dir / STEP_MARK_FILENAME)  # the step the newest process reached
    observed = _observed(rows, restores, events, profile, step_seconds, notes, None if mark is None else mark[1])
    promoted = [row for row in rows if row.upload_seconds is not None]
    observed = observed.model_copy(update={
        "promotions": len(promoted),
        "upload_seconds": sum(row.upload_seconds or 0.0 for row in promoted),
        "remote_bytes": sum(row.remote_bytes or 0 for row in promoted),
        **{key: type(getattr(observed, key))(value) for key, value in events.peers.items()},
        "peer_held": _peer_copies_held(run_dir),
        **{field: {name: copies[field] for name, copies in events.rows.levels.items()} for field in ("level_copies", "level_bytes", "level_seconds")},
    })
    loss_steps, losses, loss_source = _loss_trace(run_dir, notes)
    return ReportData(
        run_dir=str(run_dir),
        created=time.time(),
        plan=plan,
        plan_applied_step=_plan_applied_step(events.plans, plan),
        profile=profile,
        replans=events.replans,
        planning=events.planning,
        checkpoints=rows,
        restores=restores,
        preemptions=events.preemptions,
        observed=observed,
        loss_steps=[float(s) for s in loss_steps],
        losses=[float(v) for v in losses],
        loss_source=loss_source,
        resume_checks=events.resume_checks,
        warmup_skips=events.warmup_skips,
        errors=errors,
        notes=notes,
        initialized_from=events.initialized_from,
    )


_REPORT_MAX_JOB_CHANGES = 10
_RANK_LOG = re.compile(r"^events\.rank(\d{1,9})\.jsonl$")


def _event_log_name(run_dir: Path, notes: list[str]) -> str:
    """``events.jsonl``; in a node's own run directory without it (node-local directories: rank 0
    writes it on its node only), the log of the lowest rank there, with a note saying so."""
    if (run_dir / EVENTS_FILENAME).exists() or (run_dir / EVENTS_FILENAME).is_symlink():
        return EVENTS_FILENAME
    ranks = sorted(int(m.group(1)) for entry in run_dir.iterdir() if (m := _RANK_LOG.match(entry.name)) and entry.is_file())
    if not ranks:
        return EVENTS_FILENAME
    notes.append(
        f"no {EVENTS_FILENAME} here: this is another node's run directory; read rank {ranks[0]}'s log (that node's "
        "restores and failures); rank 0's directory holds the run's whole history"
    )
    return f"events.rank{ranks[0]}.jsonl"


#: Event fields whose value must be of one type (a list of steps, a process id used as a key...).
_EVENT_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "event": (str,),
    "message": (str,),
    "phase": (str,),
    "path": (str,),
    "signal": (str, type(None)),
    "pid": (int, str),
    "fits": (bool,),
    "planning": (bool,),
    "within_grace": (bool,),
    "promoted": (bool, type(None)),
    "steps": (list,),
}


def sane_events(records: Iterable[Any], notes: list[str]) -> Iterator[dict[str, Any]]:
    """The events the report can use, one at a time: a record that is not a JSON object is skipped;
    a field that is a number outside [0, EVENT_NUMBER_MAX] (negative, NaN, infinite, huge) or of
    the wrong type is dropped; each is logged and said once in ``notes`` (once exhausted), naming
    the field; at most ``_REPORT_MAX_EVENT_PROBLEMS`` different ones, then a count."""
    problems: dict[str, int] = {}
    others = 0
    for line, record in enumerate(records, start=1):
        found = [f"line {line}: not a JSON object; skipped"] if not isinstance(record, dict) else []
        bad = [key for key, value in record.items() if _bad_event_field(key, value)] if not found else []
        found += [f"{record.get('event', '?')}.{key} = {_short(record[key])} is not a valid value; ignored" for key in bad]
        for problem in found:
            if problem in problems or len(problems) < _REPORT_MAX_EVENT_PROBLEMS:
                problems[problem] = problems.get(problem, 0) + 1
                logger.warning("events.jsonl line %d: %s", line, problem)
            else:
                others += 1
        if not found or bad:
            yield {key: value for key, value in record.items() if key not in bad}
    for problem, count in problems.items():
        notes.append(f"events.jsonl: {problem}" + (f" ({count} records)" if count > 1 else ""))
    if others:
        notes.append(f"events.jsonl: {others} more invalid records or fields (_REPORT_MAX_EVENT_PROBLEMS); ignored")


class _EventDigest:
    """What the report takes from the event log, gathered one event at a time: the checkpoint
    rows, plan events, restores, preemptions, the furthest step reached and each process's ledger.
    What it keeps grows with the checkpoints, plans and processes, never with the log's length."""

    def __init__(self, step_seconds: float | None) -> None:
        self.count = self.replans = 0
        self.planning = False
        self.rows = _Rows()
        self.plans: list[dict[str, Any]] = []  # the plan events that name a step
        self.restores = Restores(step_seconds)
        self.preemptions: list[PreemptionRow] = []
        self.reached: int | None = None  # the furthest step a close, progress, stall, snapshot or step mark names
        self.ledger = _Ledger()
        self.resume_checks = ResumeChecks()
        self.warmup_skips: dict[int, str] = {}
        self.peers: dict[str, float] = {"peer_sent": 0, "peer_bytes": 0, "peer_seconds": 0.0, "peer_received": 0, "peer_refused": 0}
        self.initialized_from: str | None = None  # the last init_from event, described
        self.job_changes: list[str] = []  # each job_changed event, described (at most _REPORT_MAX_JOB_CHANGES)

    def add(self, event: dict[str, Any]) -> None:
        kind, step = event.get("event"), event_step(event)
        self.count += 1
        self.replans += kind == "plan"
        self.planning = self.planning or (kind == "session" and event.get("planning") is True)
        if kind == "plan" and step is not None:
            self.plans.append({"event": kind, "step": step, "steps": event.get("steps")})
        if kind in ("close", "progress", "stall", "snapshot_start", "reached") and step is not None:
            self.reached = step if self.reached is None else max(self.reached, step)
        self.rows.add(event, kind, step)
        self.restores.add(event, kind, step)
        self.ledger.add(event, kind)
        self.resume_checks.add(event, kind)
        if kind == "warmup_skip" and step is not None and len(self.warmup_skips) < knobs.PLAN_EVENT_MAX_STEPS:
            self.warmup_skips[step] = str(event.get("reason"))
        self._preemption(event, kind, step)
        self._peer(event, kind)
        if kind == "job_changed" and len(self.job_changes) < _REPORT_MAX_JOB_CHANGES:
            changes = event.get("changes")
            listed = "; ".join(str(c)[:200] for c in changes[:20]) if isinstance(changes, list) else "?"
            self.job_changes.append(f"another job configuration continued this run (a job_changed event): {listed}")
        if kind == "init_from":
            keys = event.get("keys")
            named = ", ".join(map(str, keys)) if isinstance(keys, list) else "?"
            self.initialized_from = f"{event.get('source')} step {event.get('from_step')} ({named})"

    def _peer(self, event: dict[str, Any], kind: Any) -> None:
        """The totals of the ``peer_send``, ``peer_receive`` and ``peer_skip`` events."""
        peers = self.peers
        if kind == "peer_send":
            peers["peer_sent"] += 1
            peers["peer_bytes"] += finite_number(event.get("bytes")) or 0
            peers["peer_seconds"] += finite_number(event.get("seconds")) or 0.0
        peers["peer_received"] += kind == "peer_receive"
        peers["peer_refused"] += kind == "peer_skip"

    def _preemption(self, event: dict[str, Any], kind: Any, step: int | None) -> None:
        """Each ``preempted`` event, with the ``restart_seconds`` of the restore that followed it."""
        rows = self.preemptions
        if kind == "preempted" and step is not None:
            fields = {k: event.get(k) for k in PreemptionRow.model_fields if k not in ("step", "restart_seconds")}
            rows.append(PreemptionRow(step=step, **fields))
        elif kind == "restore" and rows and rows[-1].restart_seconds is None:
            rows[-1].restart_seconds = event.get("restart_seconds")


def _bad_event_field(key: str, value: Any) -> bool:
    kinds = _EVENT_FIELD_TYPES.get(key)
    if kinds is not None and not isinstance(value, kinds) or (kinds == (int, str) and isinstance(value, bool)):
        return True
    if key == "steps":
        return not all(is_int(step) and 0 <= step <= EVENT_NUMBER_MAX for step in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return not 0 <= value <= EVENT_NUMBER_MAX  # compared as ints: a huge one never becomes a float
    if isinstance(value, float):
        return not (math.isfinite(value) and 0 <= value <= EVENT_NUMBER_MAX)
    return False


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, int) or abs(value) < 10**30 else f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 40 else text[:37] + "..."


def _read_model(path: Path, model: type[BaseModel], notes: list[str]) -> Any:
    try:
        text = read_run_file(path)
    except FileNotFoundError:
        notes.append(f"{path.name} is missing")
        return None
    except (ConfigError, OSError) as exc:  # a link, a directory, a FIFO, oversized, unreadable
        notes.append(f"{path.name} is unreadable ({exc}); ignored")
        logger.warning("%s unreadable: %s", path, exc)
        return None
    try:
        huge = _huge_integer(json.loads(text))
        if huge is not None:
            raise ValueError(f"{huge} is an integer beyond {EVENT_NUMBER_MAX:.0f}")
        return model.model_validate_json(text)
    except (ValueError, RecursionError) as exc:  # pydantic's ValidationError is a ValueError
        notes.append(f"{path.name} is unreadable ({type(exc).__name__}: {_first_line(exc)}); ignored")
        logger.warning("%s unreadable: %s", path, exc)
        return None


def _huge_integer(node: Any, where: str = "") -> str | None:
    """The dotted path of the first integer in a JSON document beyond ``EVENT_NUMBER_MAX`` (a step,
    byte or count no run reaches, which the report's float arithmetic would overflow on), else None."""
    if isinstance(node, int) and not isinstance(node, bool):
        return where or "the value" if abs(node) > EVENT_NUMBER_MAX else None
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        found = _huge_integer(child, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


class _Rows:
    """One row per checkpoint step, built event by event; a retried step keeps its latest attempt's figures."""

    _KINDS = ("snapshot_start", "snapshot_end", "commit", "stall", "error", "promoted", "remote_retention")

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.levels: dict[str, dict[str, Any]] = {}  # the added levels' copies (level4, ...), by name

    def add(self, event: dict[str, Any], kind: Any, step: int | None) -> None:
        if step is None or kind not in self._KINDS:
            return
        if kind in ("promoted", "remote_retention") and "level" in event:  # an added level's, not the remote tier's
            if kind == "promoted" and is_level_name(event["level"]) and len(self.levels) < 16:
                copies = self.levels.setdefault(event["level"], {"level_copies": 0, "level_bytes": 0, "level_seconds": 0.0})
                copies["level_copies"] += 1
                copies["level_bytes"] += int(finite_number(event.get("bytes")) or 0)
                copies["level_seconds"] += finite_number(event.get("seconds")) or 0.0
            return
        if kind == "remote_retention":
            for removed in event.get("removed", []):
                if removed in self.rows:
                    self.rows[removed]["in_remote"] = False
            return
        row = self.rows.setdefault(step, {"step": step})
        if kind == "snapshot_start":
            reason = event.get("reason")
            row.update(bytes=event.get("bytes"), error=None, reason=reason if reason in CHECKPOINT_REASONS else None)
        elif kind == "snapshot_end":
            row["staging_seconds"] = event.get("seconds")
        elif kind == "commit":
            row.update(committed=True, persist_seconds=event.get("seconds"), bytes=event.get("bytes", row.get("bytes")))
        elif kind == "stall":
            row["stall_seconds"] = event.get("seconds")
        elif kind == "promoted":
            row.update(upload_seconds=event.get("seconds"), remote_bytes=event.get("bytes"), in_remote=True)
        else:
            self._error(event, step, row)

    def _error(self, event: dict[str, Any], step: int, row: dict[str, Any]) -> None:
        if event.get("phase") in ("promote", "remote_list"):  # the local checkpoint is unaffected
            self.errors.append(f"step {step}: {event.get('phase')} failed: {event.get('message', 'error')}")
        else:
            message = str(event.get("message", "error"))
            row["error"] = message
            self.errors.append(f"step {step}: {event.get('phase', 'checkpoint')} failed: {message}")

    def finish(self, on_disk: set[int]) -> tuple[list[CheckpointRow], list[str]]:
        """The rows (those on disk that the log does not name added), by step, and the errors."""
        for step in on_disk:
            self.rows.setdefault(step, {"step": step, "committed": True})
        result = []
        for step in sorted(self.rows):
            row = self.rows[step]
            row["on_disk"] = step in on_disk
            result.append(CheckpointRow(**row))
        return result, self.errors


def _mark_planned(rows: list[CheckpointRow], events: list[dict[str, Any]], plan: Plan | None, notes: list[str]) -> None:
    """Set ``planned``: from plan events that carry steps, else from the final plan's span."""
    plan_events = [e for e in events if e.get("event") == "plan" and event_step(e) is not None]
    governed: list[tuple[int, float, set[int]]] = []  # (from, to, steps) a plan was in force
    if plan_events and all(isinstance(e.get("steps"), list) for e in plan_events):
        for current, following in zip(plan_events, [*plan_events[1:], None]):
            end: float = following["step"] if following is not None else math.inf
            governed.append((current["step"], end, {int(s) for s in current["steps"]}))
    elif plan is not None:
        governed.append((plan.inputs.start_step, math.inf, set(plan.steps)))
        if rows and rows[0].step <= plan.inputs.start_step:
            notes.append(
                f"checkpoints up to step {plan.inputs.start_step} followed earlier plans (not recorded): "
                "shown as 'earlier plan'"
            )
    for row in rows:
        # a plan event at step s: the plan before it governs up to s, the new one from s on; at s
        # itself the session asks both (the old plan before the swap, the new one after)
        ruling = [steps for start, end, steps in governed if start < row.step <= end or row.step == start]
        if ruling:
            row.planned = any(row.step in steps for steps in ruling)
        if plan is None and not governed:
            row.planned = None


def _plan_applied_step(events: list[dict[str, Any]], plan: Plan | None) -> int | None:
    """The step ``plan`` (plan.json's, the current one) took effect: the first of the trailing plan
    events that list its steps (a restore announces the plan it restored again); None without one."""
    if plan is None:
        return None
    steps = [int(s) for s in plan.steps][: knobs.PLAN_EVENT_MAX_STEPS]
    applied = None
    for event in reversed([e for e in events if e.get("event") == "plan" and event_step(e) is not None]):
        listed = event.get("steps")
        if not isinstance(listed, list) or [int(s) for s in listed] != steps:
            break
        applied = event_step(event)
    return applied


def _step_seconds(profile: Profile | None, plan: Plan | None) -> float | None:
    if profile is not None and profile.step_seconds.value:
        return float(profile.step_seconds.value)
    if plan is not None:
        return float(plan.inputs.step_seconds)
    return None


def _observed(
    rows: list[CheckpointRow],
    restores: list[RestoreRow],
    events: _EventDigest,
    profile: Profile | None,
    step_seconds: float | None,
    notes: list[str],
    mark_step: int | None = None,
) -> ObservedCosts:
    steps = max(profile.steps if profile is not None else 0, events.reached or 0, mark_step or 0)
    taken = [r for r in rows if r.bytes is not None or r.staging_seconds is not None or r.committed]
    stall, estimated = _stall_total(taken, profile, notes)
    interference = len(taken) * float(profile.interference_seconds) if profile is not None else 0.0
    compute = steps * step_seconds if step_seconds is not None and steps else None
    ledger = events.ledger.totals()
    overhead = (
        (stall or 0.0) + interference + ledger["step_work"] + ledger["planning"] + ledger["close_wait"]
        + ledger["planner_thread"] + ledger["setup"]
    )
    if stall is None and not ledger["processes"]:
        overhead = None
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
        step_work_seconds=ledger["step_work"],
        planning_seconds=ledger["planning"],
        planner_thread_seconds=ledger["planner_thread"],
        setup_seconds=ledger["setup"],
        close_wait_seconds=ledger["close_wait"],
        restore_seconds=ledger["restore"],
        startup_seconds=ledger["startup"],
        processes=int(ledger["processes"]),
        overhead_seconds=overhead,
        overhead_percent=None if overhead is None or not compute else 100.0 * overhead / compute,
        failures=len(failures),
        lost_steps=lost_steps,
        lost_seconds=total_lost_seconds(failures),
    )


class _Ledger:
    """coci's own time on the training thread, summed over processes: each process's (``pid``)
    last totals (``progress``, ``close``, and the ``stall`` and ``restore`` events carry them, so a
    killed process leaves the newest of those), and the start-up (process start to ``Session``) of
    every process that recorded one. Built event by event; keeps one event per process."""

    _KINDS = ("step_work", "planning", "stall", "restore", "close_wait", "planner_thread", "setup")

    def __init__(self) -> None:
        self.last: dict[Any, dict[str, Any]] = {}
        self.startup: float | None = None

    def add(self, event: dict[str, Any], kind: Any) -> None:
        if kind == "session" and (seconds := finite_number(event.get("startup_seconds"))) is not None:
            self.startup = (self.startup or 0.0) + seconds
        elif kind in ("progress", "close", "stall", "restore") and "overhead_step_work" in event:
            self.last[event.get("pid")] = {f"overhead_{k}": event.get(f"overhead_{k}") for k in self._KINDS}

    def totals(self) -> dict[str, Any]:
        totals: dict[str, Any] = {kind: sum(finite_number(e.get(f"overhead_{kind}")) or 0.0 for e in self.last.values()) for kind in self._KINDS}
        totals["processes"] = len(self.last)
        totals["startup"] = self.startup
        return totals


def _profile_from_checkpoint(root: Path, notes: list[str]) -> Profile | None:
    """The profile a run that never closed (killed, not restarted) had at its newest checkpoint."""
    from coci.profiler import Profiler

    for step, checkpoint in reversed(committed_steps(checkpoints_dir(root))):
        try:
            state = load_entry(checkpoint, (SESSION_KEY, "profiler"))
            if not isinstance(state, dict):
                continue
            profiler = Profiler()
            profiler.load_state_dict(state)
        except (CociError, OSError, ValueError, KeyError, TypeError, ArithmeticError) as exc:  # a hostile manifest
            logger.warning("no profile from %s: %s", checkpoint, exc)
            continue
        notes.append(f"the run did not close: its profile is the one saved in checkpoint step_{step}")
        return profiler.profile
    return None


def _stall_total(taken: list[CheckpointRow], profile: Profile | None, notes: list[str]) -> tuple[float | None, bool]:
    """Total stall of the checkpoints taken, and whether the profile's median stood in for some."""
    stalls = [r.stall_seconds for r in taken if r.stall_seconds is not None]
    stall: float | None = float(sum(stalls)) if stalls else None
    if len(stalls) == len(taken) or profile is None or profile.stall_seconds.value is None:
        return stall, False
    missing = len(taken) - len(stalls)
    notes.append(
        f"the event log records no stall for {missing} checkpoint(s): their stall is the profile's median "
        f"({profile.stall_seconds.value:.3g} s)"
    )
    return (stall or 0.0) + missing * float(profile.stall_seconds.value), True


def _peer_copies_held(run_dir: Path) -> int:
    """Committed peer copies under ``run_dir/peer/node<K>/`` (no link followed)."""
    root = run_dir / PEER_DIRNAME
    try:
        nodes = [entry for entry in root.iterdir() if entry.is_dir() and not entry.is_symlink()] if has_root(root) else []
        return sum(len(committed_steps(entry)) for entry in nodes)
    except (OSError, CorruptCheckpointError):
        return 0
