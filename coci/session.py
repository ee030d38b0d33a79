"""``coci.Session``: the one object a training loop talks to.

Each ``session.step(loss)`` feeds the profiler,
lets the policy re-plan now and then, and, at a planned step, starts a two-phase checkpoint. A step
pre-hook on every optimizer in ``state`` is the fence: weights never change while their snapshot
is being copied, so a snapshot never holds the next step's weights. ``restore()`` loads the newest committed checkpoint that
verifies, skipping corrupt ones, and restores RNG state last. A persist that fails in the
background is recorded in ``events.jsonl`` and raised as [``coci.PersistError``][coci.PersistError] at the next
``step()`` or ``close()``; the session stays usable, so a caller that catches it trains on and the
next planned checkpoint is attempted again (``on_error="log"`` only logs). After a restore, the
losses of the redone steps are compared bitwise with those logged before the failure
(``coci.resume_check``; ``on_mismatch``).

What is copied in the background: tensors the fence protects (parameters of the optimizers in
``state`` and those optimizers' state). Everything else (buffers such as BatchNorm statistics,
scheduler and loader state, RNG, plain values) is captured synchronously inside ``step()``, because
the next forward pass may change it before any optimizer step.

Under ``torch.distributed`` (``torchrun`` + DDP, or FSDP2 / DTensor state, which goes through
``coci.checkpoint.sharded.ShardedState``) the session consults a
``coci.distributed.DistributedContext`` (coci's own gloo groups): the profile is aggregated
and the plan broadcast at observe time, the persist goes through DCP on every rank, and restore
loads the checkpoint rank 0 picked. Those places are marked "distributed" below; without a
process group the context is None and nothing changes.
"""

from __future__ import annotations

import json
import logging
import os
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Unpack

import torch

from coci import distributed, knobs, preemption, safe_files
from coci.checkpoint import rng_state
from coci.checkpoint.checkpointer import Checkpointer, PendingCheckpoint, PersistResult, writer_for
from coci.checkpoint.job import describe_job, record_job
from coci.checkpoint.layout import RNG_KEY, SESSION_KEY, checkpoints_dir
from coci.checkpoint.nodes import check_replicas_within_nodes, node_tiers
from coci.checkpoint.peers import PeerCopying
from coci.checkpoint.read_only import start_from
from coci.checkpoint.remote.history import history_offset
from coci.checkpoint.remote.promotion import Promotion
from coci.checkpoint.restore import Found, Restorer, RestoreResult, apply_checkpoint
from coci.checkpoint.retention import final_checkpoint_wanted
from coci.checkpoint.run_lock import lock_for_job
from coci.checkpoint.sharded import ShardedState, fenced_ptrs, state_tensor_bytes
from coci.checkpoint.stateful import state_epoch, validate_state
from coci.checkpoint.storage_level import LevelHistories, StorageLevel, open_added_levels
from coci.config import SessionConfig, SessionOptions, build_config, session_policy
from coci.errors import ConfigError, PersistError, StateError
from coci.events import CHECKPOINT_REASONS, CheckpointReason, EventLog, RunFiles, open_step_mark
from coci.overhead import CpuContention, OwnTime, process_age_seconds
from coci.planning.arguments import PlansAhead, SavesPolicyState, warming_up
from coci.planning.background import BackgroundPlanner
from coci.planning.cadence import Cadence
from coci.planning.online import PlanningPolicy
from coci.planning.policy import Observation, sent_levels
from coci.planning.records import Plan
from coci.preemption import Preempted
from coci.profiler import Profile, Profiler
from coci.resume_check import ResumeChecking

logger = logging.getLogger(__name__)

#: The session writes a ``progress`` event (just the step) at most this often, so the report can
#: tell how far a killed process got (the work a failure lost) to within this many seconds.
_PROGRESS_EVENT_SECONDS: float = 10.0


class Session:
    """Checkpoint a training loop when the plan says, and resume it exactly.

    Args:
        run_dir: directory for ``checkpoints/``, ``events.jsonl``, ``plan.json`` and the report.
        state: name -> object with ``state_dict``/``load_state_dict``, tensor or plain value. An
            Accelerate-wrapped optimizer or scheduler (``accelerator.prepare``'s) stands for the
            torch object it wraps, which is fenced, saved and restored.
        config: every choice of the session, a ``coci.SessionConfig`` (its parts document
            each field): the plan, retention, the remote tier, preemption, I/O.
        options: instead of ``config``, its fields as keywords (``policy="auto"``, ``mtbf="8h"``,
            ``keep_last=2``, ``remote=...``; ``coci.config.OPTIONS`` names each one's part and
            field in the config); one passed next to ``config`` is a ConfigError naming it.

    A persist that fails in the background raises at the next ``step``/``close`` (``on_error``);
    a preemption notice makes the next ``step()`` checkpoint, wait for the commit and raise
    [``coci.Preempted``][coci.Preempted] (``coci.preemption``); the remote tier receives the committed
    checkpoints the plan promotes and ``restore()`` falls back to it
    (``coci.checkpoint.remote``); a remote prefix belongs to one run
    (``coci.checkpoint.remote.identity``); on node-local run directories each node commits,
    uploads and restores its own ranks' files (``coci.checkpoint.nodes``).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        state: Mapping[str, Any],
        *,
        config: SessionConfig | None = None,
        **options: Unpack[SessionOptions],
    ) -> None:
        constructed = time.perf_counter()  # the construction is coci's time too (the ledger's setup)
        if not isinstance(run_dir, (str, os.PathLike)) or not str(run_dir):
            raise ConfigError(f"run_dir must be a path to a directory, got {run_dir!r}")
        self.state = validate_state(state)
        self._sharded = ShardedState.detect(self.state)  # FSDP2 / DTensor state: through DCP's state_dict API
        self.config = build_config("Session", config, options)
        self._save_last = self.config.retention.save_last
        self.run_dir = Path(run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            safe_files.check_writable(self.run_dir)
        except OSError as exc:
            raise ConfigError(f"run_dir {str(self.run_dir)!r} is not a writable directory: {exc}") from exc
        self._clock = self.config.clock or time.perf_counter
        self.events = EventLog(self.run_dir)
        self.policy = session_policy(self.config)
        self._profiler = Profiler(clock=self._clock)
        # distributed: coci's gloo groups (collective), per-rank event logs
        detected = distributed.DistributedContext.detect()
        self._dist = None if detected is None else distributed.with_run_dir_layout(detected, self.run_dir, self.config.io.run_dir_layout)
        if self._dist is not None:  # a mesh whose replicas span node-local directories could never be restored
            check_replicas_within_nodes(self._sharded.dtensors(), self._dist)
        self._lock = lock_for_job(self.run_dir, self._dist)  # one session per run directory
        try:
            self._start(constructed)
        except BaseException:  # a refused remote prefix, a full disk: nothing left held, so a retry gets in
            self._abandon_start()
            raise

    def _start(self, constructed: float) -> None:
        """The rest of ``Session()``, under the run directory's lock (released when it raises)."""
        if self._dist is not None and not self._dist.is_coordinator:
            self.events.path = self.run_dir / f"events.rank{self._dist.rank}.jsonl"
        # the previous process's last event, read before this one writes any (the step mark's `reached` included)
        previous_end = preemption.last_event_time(self.events.path)
        events_start = history_offset(self.events.path)  # where this process's events begin: before its first event
        # the resume self-check (coci.resume_check): the losses the trace materialises, logged per rank
        rank, world_size = (None, 1) if self._dist is None else (self._dist.rank, self._dist.world_size)
        self._resume = ResumeChecking.open(self.run_dir, rank, world_size, self.state, on_mismatch=self.config.io.on_mismatch, events=self.events)
        self._profiler.loss_trace.listen(self._resume.materialised)
        if self._dist is not None:
            nodes_seen = [list(ranks) for ranks in self._dist.nodes or ()]
            layout = "node-local" if self._dist.node_local else "shared"
            self.events.emit("run_dir_layout", step=0, layout=layout, setting=self.config.io.run_dir_layout, nodes=nodes_seen, node=self._dist.node)
        # each run directory's leader (every node's, on node-local directories): the report on any node's directory counts lost steps exactly
        self._mark = open_step_mark(self.run_dir, self.events) if self._dist is None or self._dist.is_node_leader else None
        if self._dist is None or self._dist.is_coordinator:  # another job beside an existing run is named (job.json)
            world, nodes = (1, 1) if self._dist is None else (self._dist.world_size, len(self._dist.nodes or ()) or 1)
            record_job(self.run_dir, describe_job(self.state, world, nodes), self.events)
        writer = (self.config.io.writer or writer_for)(checkpoints_dir(self.run_dir), self._dist)
        self._checkpointer = Checkpointer(writer, self.events, self.config.retention.local_policy(), self._clock, self.config.io.persist_mode())
        self._remote = self._open_remote(events_start)  # collective
        self._peers = PeerCopying.start(
            self.run_dir, self._dist, self.config.retention.peer_copies, self.events, self._profiler,
            host=self.config.io.peer_host, keep_last=self.config.retention.peer_keep_last,
        )
        self._added = open_added_levels(self.config.remote.levels, self.run_dir, self.events, self._dist, self._profiler.level_listener)
        #: The storage levels, local first, the added ones last, each driven through ``StorageLevel`` (its docstring says the call order).
        self._levels: tuple[StorageLevel, ...] = tuple(level for level in (self._checkpointer, self._remote, self._peers, *self._added) if level is not None)
        self._failed_close = False  # close() reached through an exception (__exit__)
        self._steps = 0
        self._checkpoint_steps: list[int] = []
        self._histories = LevelHistories()  # each level's copies across the run's processes (the observation's)
        self._error: BaseException | None = None
        self._run_files = RunFiles(self.run_dir, self.events, self._dist is None or self._dist.is_coordinator)
        self._time = OwnTime(self._profiler, self.events, self._clock)  # coci's own seconds on the training thread (the report's total)
        self._cadence = Cadence(collective=self._dist is not None)  # when the policy observes
        self._planner = BackgroundPlanner()  # coci's planning policies observe off the training thread
        self._closed = False
        self._started = self._clock()
        self._progress_at = self._started
        self._contention = CpuContention()  # on the training thread: what a planner CPU second costs it
        #: What ``restore()`` loaded from ``init_from`` (a run without checkpoints of its own); None otherwise.
        self.initialized: RestoreResult | None = None
        self._hooks = [opt.register_step_pre_hook(self._fence_hook) for opt in self._optimizers()]
        self._run_files.write_plan(self.plan, self._steps)  # a plan known up front (a precomputed coci.Plan) is recorded from step 0
        state_bytes = state_tensor_bytes(self.state)
        self._profiler.set_state_bytes(state_bytes)
        self._probe_due = True  # the bandwidth probe starts at the first step(), off the training thread
        self._preemption = preemption.start(self._profiler.profile, self._dist, self.config.preemption.signals, self.config.preemption.grace, previous_end)
        startup = process_age_seconds()
        if startup is not None:
            self._profiler.set_startup_seconds(startup)  # the restart cost's prior
        self._time.ledger.setup = time.perf_counter() - constructed
        self.events.emit("session", step=0, pid=os.getpid(), startup_seconds=startup, planning=isinstance(self.policy, PlansAhead))
        self._profiler.mark()

    def _abandon_start(self) -> None:
        """Undo what a failed ``Session()`` had started: the persist helper, the added levels, the
        signal handlers, the fence hooks, the event log, and last the run directory's lock."""
        try:
            checkpointer = getattr(self, "_checkpointer", None)
            if checkpointer is not None:
                checkpointer.close()
            for level in getattr(self, "_added", ()):  # an added level is opened again by the retry
                level.close(0, True)
            notice = getattr(self, "_preemption", None)
            if notice is not None:
                notice.uninstall()
            for hook in getattr(self, "_hooks", ()):
                hook.remove()
            self.events.close()
        except Exception:  # the start's own error is the one to see
            logger.exception("while undoing a failed Session() start")
        finally:
            if self._lock is not None:
                self._lock.release()

    # -- public API ------------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Training steps completed (including those before a restore)."""
        return self._steps

    @property
    def profile(self) -> Profile:
        """The live [``coci.Profile``][coci.Profile]."""
        return self._profiler.profile

    @property
    def plan(self) -> Plan | None:
        """The policy's current [``coci.Plan``][coci.Plan] (None for policies that do not plan)."""
        plan = self.policy.plan if isinstance(self.policy, PlansAhead) else None
        return plan if isinstance(plan, Plan) else None

    @property
    def checkpoint_steps(self) -> tuple[int, ...]:
        """Steps at which this run (across restarts) started a checkpoint."""
        return tuple(self._checkpoint_steps)

    def step(self, loss: Any = None) -> PendingCheckpoint | None:
        """Record one finished training step; start a checkpoint if the policy says so.

        ``loss`` may be a tensor on any device, a float, or None; it is never synchronised here.
        Returns the pending checkpoint when one starts. After a preemption notice it checkpoints
        this step, waits for the commit and raises [``coci.Preempted``][coci.Preempted] (a ``SystemExit``).
        """
        self._check_open()
        if isinstance(loss, torch.Tensor) and loss.is_meta:  # a device check, never a sync
            raise StateError("session.step(loss): the loss is on the meta device and holds no value")
        entered = self._clock()
        planning_before = self._time.ledger.planning
        if self._time.restored_at_age is not None:
            self._time.record_restart(self._steps)
        self._time.record_pending_stall()
        self._profiler.record_busy(entered, self._clock())
        self._profiler.step(loss)
        resumed = self._clock()
        self._steps += 1
        if self._mark is not None:
            self._mark.set(self._steps)
        now = self._clock()
        if now - self._progress_at >= _PROGRESS_EVENT_SECONDS:  # bounds what a crash loses
            self._progress_at = now
            self.events.emit("progress", step=self._steps, **self._time.event_fields())
        due = self.policy.should_checkpoint(self._steps)  # asked before any re-plan made at this step
        self._poll_persist()
        if self._planner.due(self._steps):
            self._apply_background_plan()
        if self._should_observe():
            self._observe()
        pending = None
        if due or self.policy.should_checkpoint(self._steps):
            if self._warmup_skipped():
                self._record_warmup_skip()
            else:
                pending = self._planned_checkpoint()
        self._time.account_step_work(entered, resumed, planning_before, pending is not None)
        if self._probe_due:
            self._start_probe()
        if self._preemption.due(self._steps):  # distributed: collective at agreed steps
            raise self._stop_for_preemption()
        self._raise_error()  # last, so a caller that catches it has a consistent session
        return pending

    def _planned_checkpoint(self) -> PendingCheckpoint | None:
        """The plan's checkpoint of this step; one that cannot start (the previous persist never
        ended, the staging arena not allocated: PersistError, OSError) is recorded (an ``error``
        event, ``phase: "snapshot"``) and raised at the end of this ``step()`` per ``on_error``."""
        try:
            return self.checkpoint(reason="policy")
        except (PersistError, OSError) as exc:
            logger.error("checkpoint at step %d not taken: %s: %s", self._steps, type(exc).__name__, exc)
            self.events.emit("error", step=self._steps, phase="snapshot", message=f"{type(exc).__name__}: {exc}")
            if self.config.io.on_error == "raise":
                self._error = exc
            return None

    def _stop_for_preemption(self) -> Preempted:
        """Checkpoint this step (unless a checkpoint of it is already under way), wait for the commit,
        record the ``preempted`` event and close: the [``coci.Preempted``][coci.Preempted] to raise. A failed
        persist raises [``coci.PersistError``][coci.PersistError] instead."""
        step = self._steps
        taken = self.checkpoint_steps
        if not taken or taken[-1] != step:
            self.checkpoint(reason="preemption")
        result = self.wait()
        path = str(result.path) if result is not None else None
        seconds = self._preemption.seconds_since_notice()
        left = self._preemption.grace_seconds - seconds
        if result is not None and self._remote is not None and self._remote.uploads:
            self._promote_always(step)  # every level; the remote one's upload is waited for below
        promoted = None if result is None or self._remote is None else self._remote.promote_within(step, left)
        stopped = preemption.record_stop(self.events, self._preemption, step, path, self.profile, seconds, promoted)
        self.close()
        return stopped

    def mark_reached(self, step: int) -> None:
        """Say that the work of ``step`` is done before ``step()`` is called for it (an integration
        that calls ``step()`` late, as the Hugging Face callback does at the next step's start so a
        checkpoint holds the logging and evaluation after the optimizer step). Only the step mark
        moves, the record of how far a failed process got: the report counts that step as lost if
        the process dies before its ``step()``. No-op for a step not ahead of ``steps``."""
        if self._mark is not None and step > self._steps:
            self._mark.set(int(step))

    def checkpoint(self, *, reason: CheckpointReason = "request") -> PendingCheckpoint:
        """Start a checkpoint of the current state now (also used by ``step``). ``reason`` is
        recorded with it in ``events.jsonl`` and shown by the report: ``"request"`` (a call of
        yours), ``"policy"`` (the plan's, from ``step``), ``"close"`` (``save_last``, or the
        Lightning callback's last step), ``"preemption"`` (a notice); a checkpoint the plan did not
        ask for is listed apart from the plan's own."""
        self._check_open()
        if reason not in CHECKPOINT_REASONS:
            raise ConfigError(f"checkpoint(reason=...) must be one of {', '.join(CHECKPOINT_REASONS)}, got {reason!r}")
        self._time.record_pending_stall(block=True)  # the previous one's GPU wait, before its figures are replaced
        began = self._clock()
        planning_before = self._time.ledger.planning  # a commit polled below may re-plan: booked apart
        previous = self._checkpointer.pending
        if previous is not None:  # at most one persist in flight; never drop its outcome
            previous.wait()  # PersistError when it never ends (coci.knobs.PERSIST_DEADLINE_SECONDS)
            self._poll_persist()
        tree = self._collect_tree()
        pending = self._checkpointer.start(
            self._steps, tree, fenced_ptrs(self._optimizers()), epoch=state_epoch(self.state), state_keys=sorted(self.state), reason=reason
        )
        self._checkpoint_steps.append(self._steps)
        self._profiler.set_state_bytes(pending.nbytes)  # what a checkpoint holds (optimizer state appears at its first step)
        self._profiler.persist_started()
        self._time.checkpoint_started(pending, began, planning_before)
        return pending

    def wait_snapshot(self) -> None:
        """Block until the in-flight snapshot is copied (call before changing state outside an
        optimizer step)."""
        self._time.stall_wait(self._checkpointer.wait_staging())

    def wait(self) -> PersistResult | None:
        """Block until the in-flight checkpoint is committed (or failed); surface a failure."""
        pending = self._checkpointer.pending
        if pending is not None:
            pending.wait()  # PersistError when it never ends (coci.knobs.PERSIST_DEADLINE_SECONDS)
        self._poll_persist()
        self._raise_error()
        return None if pending is None or pending.upload_completion.exception() else pending.upload_completion.result()

    def restore(self, *, strict: bool = True) -> RestoreResult | None:
        """Load the newest committed checkpoint that verifies; None on a fresh run.

        Corrupt checkpoints are skipped with a ``restore_skip`` event and a warning. ``strict``
        refuses a checkpoint whose state keys differ from ``state`` (the error lists both sides),
        and one that an object of ``state`` refuses as another configuration's (a
        [``coci.ResumableLoader``][coci.ResumableLoader] of another seed or dataset length: StateMismatchError);
        ``strict=False`` loads the keys both have, and skips a checkpoint an object refuses
        (``restore_skip`` with ``reason="state_mismatch"``) for the newest older one it accepts;
        when none is accepted it raises StateMismatchError. A remote checkpoint that failed for its
        own fault is recorded in the run directory and not downloaded again while it stays
        unchanged; once the remote does not answer, the rest of the restore keeps to the local tier
        (``coci.checkpoint.remote.refused``). Under ``torch.distributed`` every rank loads the
        checkpoint rank 0 picked, and the ranks skip a checkpoint together (collective).
        """
        self._check_open()
        self._planner.discard()  # a plan of the run before the restore never applies
        if self._remote is not None:  # a fresh run directory: the history of the run from the remote
            self._remote.merge_history(self._steps)
        found = Restorer(
            run_dir=self.run_dir,
            apply=lambda loaded: apply_checkpoint(loaded, strict, self.state, self._sharded, self._stateful_policy(), self._apply_own_entry),
            sharded=self._sharded,
            strict=strict,
            dist=self._dist,
            remote=None if self._remote is None else self._remote.tier,
            peers=None if self._peers is None else self._peers.copies,
            added=self._added,
            events=self.events,
            clock=self._clock,
            step=self._steps,
        ).run()
        if found is None and self.config.init_from is not None:
            self.start_from_init()
        return None if found is None else self._restored(found)

    def start_from_init(self) -> RestoreResult:
        """Fill ``init_keys`` from ``init_from`` now (read-only on that run, as ``coci.load``), recorded
        as an ``init_from`` event; ``restore()`` calls it on a run without checkpoints of its own.
        ConfigError without ``init_from``. Collective under ``torch.distributed`` when the keys
        hold sharded state."""
        config = self.config
        if config.init_from is None:
            raise ConfigError("start_from_init() needs Session(init_from=...): the run to start from")
        self.initialized = start_from(config.init_from, self.state, config.init_keys, config.init_step, self.events, self._steps)
        return self.initialized

    def _restored(self, found: Found) -> RestoreResult:
        """Book a restore that loaded ``found`` (profile, retention, events)."""
        loaded, path, tier = found.loaded, found.path, found.tier
        seconds = self._clock() - found.began
        restart = self._preemption.restart_seconds(seconds)  # from the previous process's last event
        self._time.ledger.restore += seconds
        self._time.restored_at_age = process_age_seconds()
        self._profiler.record_restore(seconds, loaded.nbytes)
        self._histories.restored(loaded.step, tier)
        for level in self._levels:  # retention keeps it until a newer one commits; the remote may promote it
            level.restored(loaded.step, path, tier)
        if tier != "local":
            self._profiler.record_level_restore(tier, seconds)
        self.events.emit(
            "restore", step=loaded.step, seconds=seconds, restart_seconds=restart, bytes=loaded.nbytes, path=str(path), tier=tier,
            **node_tiers(self._dist, tier), **self._time.event_fields(),
        )
        self._resume.restored(loaded.step, self._steps)
        self._cadence.restart()
        self._profiler.mark()
        return RestoreResult(loaded.step, loaded.epoch, path, seconds, loaded.nbytes, found.skipped, tier)

    def _open_remote(self, history_from: int) -> Promotion | None:
        """The remote tier (None without one), its prefix claimed for this run or refused with a
        ConfigError (collective); rank 0 mirrors the history from ``history_from``."""
        remote = self.config.remote
        if remote.store is None:
            return None
        session = weakref.ref(self)  # the mirror thread never keeps a dropped session alive

        def steps() -> int | None:
            alive = session()
            return None if alive is None else getattr(alive, "_steps", 0)  # 0 until __init__ sets it

        return Promotion.open(
            remote.store, remote.storage_options, retention=self.config.retention.remote_tier_policy(), owner=remote.owner,
            run_dir=self.run_dir, events=self.events, listener=self._profiler, dist=self._dist, steps=steps,
            history_from=history_from, close_timeout=remote.close_timeout,
        )

    def close(self) -> None:
        """Checkpoint the final state when ``save_last`` says so, wait for the last persist, write
        ``profile.json``, ``plan.json`` and ``loss_curve.json`` (the smoothed trace the report
        plots), release the fence hooks and, under ``torch.distributed``, coci's own process groups
        (the job's groups stay the job's to destroy), even when closing fails."""
        try:
            self._close()
        finally:  # after this rank's last collective: coci's gloo threads end here, never while Python finalizes
            if self._dist is not None:
                self._dist.release()

    def _close(self) -> None:
        if self._closed:
            return
        entered = self._clock()  # the last persist and the run files (a final checkpoint: a stall)
        planning_before = self._time.ledger.planning  # an observation after the last commit: booked apart
        final = self._final_wanted()
        stalled = 0.0  # a final checkpoint's own time (its stall), before its record adds a GPU's device wait
        if final and self._steps not in self._checkpoint_steps:  # save_last, and no checkpoint of the final step yet
            self.checkpoint(reason="close")
            stalled = self._time.stall_seconds
        if final:  # copied and promoted whatever the plan says, once committed
            self._promote_always(self._steps)
        self._time.record_pending_stall(block=True)  # the last checkpoint's stall has no next step to record it
        self._closed = True
        try:
            closing = self._clock()
            self._planner.close()  # an observation still in flight is dropped: the run ends first
            dropped = self._planner.drain_cpu_seconds()  # its wait is in the final wait
            self._time.ledger.book_planner_thread(dropped, self._clock() - closing, self._contention.factor())
            local, *upper = self._levels
            stuck = local.close(self._steps, self._failed_close)
            if stuck is not None and self._error is None:
                self._error = stuck
            self._poll_persist()  # the last commit, promoted
            for level in upper:  # the last promotion and copy finish before the run ends, each bounded
                if final:
                    level.promote_always(self._steps, self.plan)
                level.close(self._steps, self._failed_close)
        finally:
            for hook in self._hooks:
                hook.remove()
            self._hooks = []
            self._preemption.uninstall()
        self._profiler.loss_trace.flush()  # the last losses reach the log and the check (one host copy)
        self._resume.close(self._steps)
        if self._run_files.writes:  # distributed: rank 0 writes run files
            self._run_files.write("profile.json", self._profiler.profile.model_dump_json(indent=2), self._steps)
            loss_steps, losses = self._profiler.loss_curve()
            self._run_files.write("loss_curve.json", json.dumps({"steps": loss_steps.tolist(), "losses": losses.tolist()}), self._steps)
        self._run_files.write_plan(self.plan, self._steps)
        self._time.account_close_wait(entered, planning_before, stalled)
        self.events.emit(
            "close", step=self._steps, checkpoints=len(self._checkpoint_steps), pid=os.getpid(), **self._time.ledger.as_event()
        )
        if self._remote is not None:  # the close event included: this process closed (within the remote limit)
            self._remote.close_history()
        self.events.close()
        if self._mark is not None:
            self._mark.close()
            self._mark = None
        if self._lock is not None:  # last write done: the run directory is free (a failed close frees it at exit)
            self._lock.release()
        self._raise_error()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        self._save_last = False  # the state may be mid-step: never a final checkpoint of it
        self._failed_close = True  # the other ranks may be gone: no collective on the way out
        try:
            self.close()
        except Exception:  # never mask the exception that is already propagating
            logger.exception("error while closing the session after a failure")

    # -- internals -------------------------------------------------------------------------------

    def _final_wanted(self) -> bool:
        """``save_last`` asked for the final state (or the run reached ``total_steps``)."""
        reached = self.config.total_steps is not None and self._steps >= self.config.total_steps
        return self._steps > 0 and final_checkpoint_wanted(self._save_last, reached)

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this Session is closed")

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise PersistError(f"background checkpoint failed: {type(error).__name__}: {error}") from error
        mismatch = self._resume.take_error()  # on_mismatch="raise"
        if mismatch is not None:
            raise mismatch
        run_file_error = self._run_files.take_error()
        if run_file_error is not None:
            raise run_file_error
        refused = self.events.take_failure()  # a full disk: the log dropped lines (once per streak)
        if refused is not None:
            raise PersistError(f"cannot write the event log {self.events.path}: {refused}; events are lost until it can") from refused

    def _fence_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._checkpointer.pending is not None:
            self._time.stall_wait(self._checkpointer.fence())

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [value for value in self.state.values() if isinstance(value, torch.optim.Optimizer)]

    def _collect_tree(self) -> dict[str, Any]:
        tree = self._sharded.state_tree(self.state)
        own: dict[str, Any] = {
            "steps": self._steps,
            "checkpoint_steps": list(self._checkpoint_steps) + [self._steps],
            "profiler": self._profiler.state_dict(),
            **self._histories.entry(self._levels, self._steps, self.plan),
            **({"policy": self.policy.state_dict()} if isinstance(self.policy, SavesPolicyState) else {}),
        }
        tree[SESSION_KEY] = own
        tree[RNG_KEY] = rng_state.capture()
        return tree

    def _stateful_policy(self) -> SavesPolicyState | None:
        """The policy, when it saves its state in every checkpoint (restored with it)."""
        return self.policy if isinstance(self.policy, SavesPolicyState) else None

    def _apply_own_entry(self, own: Mapping[str, Any]) -> None:
        """The session's own saved entry, applied by a restore (``apply_checkpoint``)."""
        self._steps = int(own["steps"])
        self._checkpoint_steps = [int(s) for s in own["checkpoint_steps"]]
        self._profiler.load_state_dict(own["profiler"])
        self._histories.load(own.get("level_steps"))

    def _poll_persist(self) -> None:
        pending = self._checkpointer.pending
        if pending is None or not pending.done() or getattr(pending, "_polled", False):
            return
        pending._polled = True  # type: ignore[attr-defined]
        error = pending.upload_completion.exception()
        if error is not None:
            self._profiler.persist_aborted()
            if self.config.io.on_error == "raise":
                self._error = error
            return
        result = pending.upload_completion.result()
        self._profiler.persist_finished(result.persist_seconds, result.nbytes)
        self.events.emit(
            "persist_end", step=result.step, seconds=result.persist_seconds, staging_seconds=result.staging_seconds, bytes=result.nbytes
        )
        self._committed(result.step, result.path)
        if self._cadence.observe_after_commit(self._elapsed):  # distributed: ranks commit at different
            self._observe()  # steps, so they observe at the (collective) step cadence only

    def _committed(self, step: int, path: Path) -> None:
        """A committed checkpoint: to each level the plan sends it to, or that it must reach (``_promote_always``)."""
        plan = self.plan
        for level in self._levels:
            level.promote(step, path, plan)

    def _promote_always(self, step: int) -> None:
        """Checkpoint ``step`` goes to every level whatever the plan says (a preemption's, the final one)."""
        for level in self._levels:
            level.promote_always(step, self.plan)

    def _warmup_skipped(self) -> bool:
        """Skip this due checkpoint? Only a planning policy's warm-up checkpoint (before its first
        plan) is ever skipped: see ``Cadence.skip_warmup_checkpoint``.

        Under ``torch.distributed`` the inputs (a persist still in flight, this rank's stalls) differ
        between ranks, so the ranks agree: all skip when any would (collective on the control group,
        at a step every rank finds due, since the policy's state is the same on every rank).
        """
        warming = warming_up(self.policy)
        pending = self._checkpointer.pending
        skip = Cadence.skip_warmup_checkpoint(
            warming_up=warming,
            persist_in_flight=pending is not None and not pending.done(),
            stalled_seconds=self._time.stalled_total,
            elapsed=self._elapsed,
        )
        if self._dist is None or not warming:
            return skip
        return distributed.agree("skip" if skip else None, self._dist) is not None

    def _record_warmup_skip(self) -> None:
        """A skipped warm-up checkpoint: a ``warmup_skip`` event (the report counts them) naming why."""
        pending = self._checkpointer.pending
        reason = "persist_in_flight" if pending is not None and not pending.done() else "stall_budget"
        logger.info("warm-up checkpoint at step %d skipped (%s)", self._steps, reason.replace("_", " "))
        self.events.emit("warmup_skip", step=self._steps, reason=reason, stalled_seconds=self._time.stalled_total, elapsed_seconds=self._elapsed())

    def _start_probe(self) -> None:
        """The one-time bandwidth probe (the cost priors before any checkpoint), on a background
        thread from the first ``step()``: not inside ``Session(...)``, and not at all when
        ``restore()`` brought the measured bandwidth back. The grace check is repeated with it."""
        self._probe_due = False
        notice, profiler = self._preemption, self._profiler
        profiler.probe_in_background(self.run_dir, on_done=lambda: notice.check_grace(profiler.profile))

    def _should_observe(self) -> bool:
        return self._cadence.observe_at_step(self._steps, self._profiler.steps, warming_up(self.policy), self._elapsed)

    def _elapsed(self) -> float:
        """Wall seconds since this session started (the cadence's clock)."""
        return self._clock() - self._started

    def _observe(self) -> None:
        if self._planner.in_flight:  # one plan at a time; the next observation comes after it applies
            return
        began = self._clock()
        try:
            self._observe_now()
        finally:
            seconds = self._clock() - began
            self._time.ledger.planning += seconds
            self._cadence.record_observation(self._steps, seconds)

    def _observe_now(self) -> None:
        loss_steps, losses = self._profiler.loss_curve()
        observation = Observation(
            step=self._steps,
            profile=self._profiler.profile,
            loss_steps=loss_steps,
            losses=losses,
            checkpoint_steps=tuple(self._checkpoint_steps),
            levels=sent_levels(self._histories.of(self._levels), whole_run=self._histories.known),
        )
        if self._dist is None and knobs.PLAN_IN_BACKGROUND and isinstance(self.policy, PlanningPolicy):
            self._planner.submit(self.policy, observation)  # applies at a step fixed by the observation
        elif self._dist is None:
            self.policy.observe(observation)
        else:  # distributed: slowest rank's costs; rank 0 plans, every rank gets its plan
            distributed.observe_policy(self.policy, observation, self._dist)
        self._run_files.write_plan(self.plan, self._steps)
        self._profiler.mark()  # planning time is coci's, not the training step's

    def _apply_background_plan(self) -> None:
        """Swap in the policy the planner thread observed (waiting for it if need be): its apply step."""
        began = self._clock()
        self.policy, worker_seconds = self._planner.take()
        if isinstance(self.policy, PlanningPolicy):  # its steps passed since the observation are not lost
            self.policy.take_effect(self._steps, self._checkpoint_steps)
        waited = self._clock() - began  # inside step(): booked as per-step work
        self._cadence.charge(worker_seconds + waited)
        self._time.ledger.book_planner_thread(self._planner.drain_cpu_seconds(), waited, self._contention.factor())
        self._run_files.write_plan(self.plan, self._steps)
        self._profiler.mark()  # a wait for the planner is coci's time, not the training step's
