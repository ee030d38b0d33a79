"""The online profiler: measures a training job's step time, checkpoint costs and loss as it runs.

One ``Profiler`` per training job. The session calls ``step(loss)`` once per training step, at
its end, and reports every checkpoint phase; ``Profiler.profile`` turns what was seen into a
``Profile`` for the planner.

Step time
---------
A step's time is the interval between two consecutive ``step()`` calls on the injectable ``clock``
(the first ``step()`` of a process has no interval unless ``Profiler.mark`` started one). The
first ``warmup_steps`` steps of every process (restored ones included: a resumed process is cold too)
are excluded. Every other interval goes into exactly one bounded window (``_STEP_WINDOW``):

* **stall** if ``record_stall`` was called while it was open (the interval contains the snapshot
  stall, so its length is not a training step's);
* **persist-overlapped** if a persist was in flight at any moment while it was open: the flag is set by
  ``persist_started`` (for the open interval) and stays set for every interval that opens while the
  persist runs; ``persist_finished`` leaves the open interval overlapped, so the first ``step()`` after
  it closes the last overlapped interval;
* **clean** otherwise.

Time the caller reports as its own (``record_busy``: the session's per-step work, a snapshot, a
fence wait) is taken off the interval it falls in; a stall interval minus that time is also kept as
a *stall-adjusted* step. Estimates are medians with a MAD spread (``coci.profiler.stats``) of each
series cut back to its recent regime (``coci.profiler.stats.recent_regime``: a job that speeds up or
slows down is followed within ``knobs.DRIFT_SAMPLES`` steps). ``step_seconds`` comes from the clean
intervals while they are current, from the stall-adjusted ones once ``_STALE_CLEAN_STEPS`` timed
steps in a row were not clean (a job that checkpoints every step), and from the overlapped ones only
when nothing else was measured (``interference`` is then unknown); ``Profile.step_seconds_source``
says which. ``interference`` is the median overlapped step time over ``step_seconds``.

Threads
-------
``step``, ``mark`` and ``replay`` belong to the training thread. The checkpoint reports
(``record_stall``, ``persist_started``/``persist_finished``/``persist_aborted``, ``record_restore``,
``set_state_bytes``) may come from a background persist thread; they and ``profile``/``state_dict``
take a lock. ``step`` takes none (it is on the hot path, a few microseconds).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import knobs
from .added_levels import AddedLevelCosts, LevelTransfers
from .checks import integer, non_negative_number, optional_integer
from .loss_trace import LossTrace
from .probe import probe_bandwidth
from .profile import FLAT_LEVEL_FIELDS, Bandwidth, Estimate, LevelEstimates, Profile
from .stats import prior, ratio_estimate, recent_regime, robust_estimate

logger = logging.getLogger(__name__)

#: Recent step intervals kept per class (clean, persist-overlapped, stall) for median and spread.
_STEP_WINDOW: int = 1024

#: Recent samples kept per checkpoint cost (stall, persist, restore seconds and bytes).
_COST_WINDOW: int = 64

#: Clean step times are stale once this many timed steps in a row contained a stall or overlapped
#: a persist (a job that checkpoints every step): the step time then comes from the stall-adjusted
#: steps (each one's duration minus the stall inside it).
_STALE_CLEAN_STEPS: int = 8

#: Version of the dict returned by ``Profiler.state_dict``.
STATE_FORMAT = 1

_COST_SERIES = (
    "stall_seconds",
    "stall_bytes",
    "persist_seconds",
    "persist_bytes",
    "restore_seconds",
    "restore_bytes",
    "restart_seconds",
    "upload_seconds",
    "upload_bytes",
    "remote_restore_seconds",
    "peer_seconds",
    "peer_bytes",
    "peer_restore_seconds",
)
_STEP_SERIES = (
    "clean_step_seconds",
    "overlapped_step_seconds",
    "stall_step_seconds",
    "stall_adjusted_step_seconds",
    "upload_step_seconds",
    "peer_step_seconds",
)
#: Series added after STATE_FORMAT 1 was first written: absent in older checkpoints, loaded as empty.
_OPTIONAL_SERIES = frozenset(
    {"stall_adjusted_step_seconds", "restart_seconds", "upload_seconds", "upload_bytes", "remote_restore_seconds", "upload_step_seconds",
     "peer_seconds", "peer_bytes", "peer_restore_seconds", "peer_step_seconds"}
)


class _InFlight:
    """Background work of one kind (persists, uploads, peer copies): how many are in flight, and
    whether the open step interval overlapped one. Changed under the profiler's lock."""

    __slots__ = ("count", "overlapped")

    def __init__(self) -> None:
        self.count = 0
        self.overlapped = False

    def began(self) -> None:
        self.count += 1
        self.overlapped = True

    def ended(self) -> None:
        self.count = max(self.count - 1, 0)

    def open_interval(self) -> None:
        self.overlapped = self.count > 0


class Profiler:
    """Measures step time, checkpoint stall, persist, interference, restore and the loss trace.

    ``clock`` returns seconds (monotonic; inject a fake one in tests). ``warmup_steps`` defaults to
    ``knobs.WARMUP_STEPS``; ``step_window`` / ``cost_window`` to ``_STEP_WINDOW`` /
    ``_COST_WINDOW``. Bad arguments raise ``ValueError`` naming the field.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        warmup_steps: int | None = None,
        *,
        step_window: int | None = None,
        cost_window: int | None = None,
        loss_trace: LossTrace | None = None,
    ) -> None:
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
        self._clock = clock
        self._warmup_steps = integer(knobs.WARMUP_STEPS if warmup_steps is None else warmup_steps, "warmup_steps")
        step_window = integer(_STEP_WINDOW if step_window is None else step_window, "step_window", positive=True)
        cost_window = integer(_COST_WINDOW if cost_window is None else cost_window, "cost_window", positive=True)
        self._lock = threading.Lock()
        self._clean: deque[float] = deque(maxlen=step_window)
        self._overlapped: deque[float] = deque(maxlen=step_window)
        self._stall_steps: deque[float] = deque(maxlen=step_window)
        self._stall_adjusted: deque[float] = deque(maxlen=step_window)  # stall steps minus their stall
        self._upload_steps: deque[float] = deque(maxlen=step_window)  # overlapped a promotion, not a persist
        self._peer_steps: deque[float] = deque(maxlen=step_window)  # overlapped a peer copy, neither of those
        self._since_clean = 0  # timed intervals since the last clean one (stale clean times)
        self._interval_stall_seconds = 0.0
        self._interval_busy = 0.0  # seconds of the open interval the caller spent outside training
        self._costs: dict[str, deque[float]] = {name: deque(maxlen=cost_window) for name in _COST_SERIES}
        self._added = AddedLevelCosts(cost_window)  # the levels a user added (level4, ...), by name
        self._trace = loss_trace if loss_trace is not None else LossTrace()
        self._steps = 0
        self._process_steps = 0
        self._last_time: float | None = None
        self._interval_stall = False
        self._persists = _InFlight()  # its ``overlapped``: the open interval overlaps a persist
        self._uploads = _InFlight()
        self._copies = _InFlight()  # peer copies
        self._state_bytes: int | None = None
        self._bandwidth: Bandwidth | None = None
        self._probe_thread: threading.Thread | None = None  # probe_in_background's
        self._startup_seconds: float | None = None

    # ------------------------------------------------------------------ per step (hot path)
    def step(self, loss: Any = None) -> None:
        """One training step completed; ``loss`` is a float, int, None or a one-element tensor.

        Closes the open step interval (classifying it as clean, persist-overlapped or stall) and opens
        the next. Never synchronises with a device (tensors are materialised in batches).
        """
        now = self._clock()
        self._steps += 1
        self._process_steps += 1
        last = self._last_time
        self._last_time = now
        if last is not None and self._process_steps > self._warmup_steps:
            self._classify(now - last, self._interval_stall, self._persists.overlapped)
        self._interval_stall = False
        self._interval_stall_seconds = 0.0
        self._interval_busy = 0.0
        self._open_interval()
        if loss is not None:
            self._trace.add(self._steps, loss)

    def mark(self) -> None:
        """Start timing the next step interval now, without completing a step.

        Call it right before the first step of a process (after ``restore``) so that step is timed
        too, or after a pause (evaluation, a blocking save) that should not count as a step.
        """
        self._last_time = self._clock()
        self._interval_stall = False
        self._interval_stall_seconds = 0.0
        self._interval_busy = 0.0
        self._open_interval()

    def _open_interval(self) -> None:
        """The next step interval overlaps whatever background work is in flight as it opens."""
        self._persists.open_interval()
        self._uploads.open_interval()
        self._copies.open_interval()

    def record_busy(self, start: float, end: float) -> None:
        """The caller was busy outside the training step from ``start`` to ``end`` (clock seconds:
        its own per-step bookkeeping, a snapshot, a fence wait). The part inside the open interval
        is taken off that interval's duration. Training thread only (no lock)."""
        opened = start if self._last_time is None else max(start, self._last_time)
        self._interval_busy += max(end - opened, 0.0)

    def replay(self, step_seconds: Any = None, losses: Any = None) -> None:
        """Bulk path: record ``n`` completed steps with known durations and/or losses.

        Equivalent to ``n`` ``step(loss)`` calls, each preceded by the clock advancing by
        ``step_seconds[i]`` (so all ``n`` steps are timed, the first one from the open interval),
        with no checkpoint event in between: the first interval keeps the open interval's
        stall/overlap flags, the others are overlapped only while a persist is in flight. Warm-up
        applies as for ``step``. The loss trace is fed through the same ``LossTrace`` path.
        Afterwards no interval is open (call ``mark``). Used to replay a recorded run and to test
        the memory bound over millions of steps without millions of Python calls.
        """
        durations = None if step_seconds is None else np.asarray(step_seconds, dtype=np.float64).reshape(-1)
        values = None if losses is None else np.asarray(losses, dtype=np.float64).reshape(-1)
        if durations is None and values is None:
            return
        if durations is not None and values is not None and durations.size != values.size:
            raise ValueError(
                f"step_seconds and losses must have the same length, got {durations.size} and {values.size}"
            )
        n = int(durations.size if durations is not None else values.size)  # type: ignore[union-attr]
        if n == 0:
            return
        first_step = self._steps + 1
        if durations is not None:
            self._replay_durations(durations)
        self._steps += n
        self._process_steps += n
        self._last_time = None
        self._interval_stall = False
        self._open_interval()
        if values is not None:
            self._trace.extend(np.arange(first_step, first_step + n, dtype=np.int64), values)

    def _replay_durations(self, durations: np.ndarray) -> None:
        # durations[i] closes process step self._process_steps + 1 + i; the warm-up ones are skipped.
        skip = max(self._warmup_steps - self._process_steps, 0)
        if skip == 0:
            self._classify(float(durations[0]), self._interval_stall, self._persists.overlapped)
        tail = durations[max(skip, 1) :]
        tail = tail[tail >= 0.0]
        target = self._overlapped if self._persists.count > 0 else self._clean
        if tail.size:
            target.extend(tail[-(target.maxlen or tail.size) :].tolist())
            self._since_clean = 0 if target is self._clean else self._since_clean + int(tail.size)

    def _classify(self, duration: float, stall: bool, overlapped: bool) -> None:
        if duration < 0.0:
            return
        self._since_clean += 1
        training = max(duration - self._interval_busy, 0.0)
        if stall:
            self._stall_steps.append(duration)
            # a caller that reports busy windows has the stall inside them; one that does not, not
            self._stall_adjusted.append(training if self._interval_busy > 0.0 else max(duration - self._interval_stall_seconds, 0.0))
        elif overlapped:
            self._overlapped.append(training)
        elif self._uploads.overlapped:
            self._upload_steps.append(training)
        elif self._copies.overlapped:
            self._peer_steps.append(training)
        else:
            self._clean.append(training)
            self._since_clean = 0

    # ------------------------------------------------------------------ checkpoint reports
    def record_stall(self, seconds: float, nbytes: int | None = None) -> None:
        """Training waited ``seconds`` for a snapshot of ``nbytes``; marks the open interval a stall step."""
        seconds = non_negative_number(seconds, "seconds")
        nbytes = optional_integer(nbytes, "nbytes")
        with self._lock:
            self._interval_stall = True
            self._interval_stall_seconds += seconds
            self._costs["stall_seconds"].append(seconds)
            if nbytes is not None:
                self._costs["stall_bytes"].append(float(nbytes))

    def persist_started(self) -> None:
        """A background persist began: the open interval and all that open before it ends overlap it."""
        with self._lock:
            self._persists.began()

    def persist_finished(self, seconds: float, nbytes: int | None = None) -> None:
        """The persist begun by ``persist_started`` committed after ``seconds``, writing ``nbytes``.

        The open interval stays persist-overlapped; the next ``step()`` closes it.
        """
        if self._persists.count == 0:
            logger.debug("persist_finished without persist_started; recording the sample anyway")
        self._finished(self._persists, "persist", seconds, nbytes)

    def persist_aborted(self) -> None:
        """The persist begun by ``persist_started`` failed: no sample, but it is no longer in flight."""
        with self._lock:
            self._persists.ended()

    def upload_started(self) -> None:
        """A promotion to the remote tier began: steps overlapping it (and no persist) are timed apart."""
        with self._lock:
            self._uploads.began()

    def upload_finished(self, seconds: float, nbytes: int | None = None) -> None:
        """The promotion begun by ``upload_started`` committed remotely after ``seconds`` (any thread)."""
        self._finished(self._uploads, "upload", seconds, nbytes)

    def upload_aborted(self) -> None:
        """The promotion begun by ``upload_started`` failed: no sample (any thread)."""
        with self._lock:
            self._uploads.ended()

    def peer_copy_started(self) -> None:
        """A copy of this node's checkpoint to a peer node began: steps overlapping it (and no
        persist or promotion) are timed apart."""
        with self._lock:
            self._copies.began()

    def peer_copy_finished(self, seconds: float, nbytes: int | None = None) -> None:
        """The copy begun by ``peer_copy_started`` committed on the peer after ``seconds`` (any thread)."""
        self._finished(self._copies, "peer", seconds, nbytes)

    def peer_copy_aborted(self) -> None:
        """The copy begun by ``peer_copy_started`` failed: no sample (any thread)."""
        with self._lock:
            self._copies.ended()

    def _finished(self, work: _InFlight, cost: str, seconds: float, nbytes: int | None) -> None:
        """``work`` of one kind ended after ``seconds`` with ``nbytes``: samples of ``<cost>_seconds`` and ``<cost>_bytes``."""
        seconds = non_negative_number(seconds, "seconds")
        nbytes = optional_integer(nbytes, "nbytes")
        with self._lock:
            work.ended()
            self._costs[f"{cost}_seconds"].append(seconds)
            if nbytes is not None:
                self._costs[f"{cost}_bytes"].append(float(nbytes))

    def record_peer_restore(self, seconds: float) -> None:
        """A restore that took this node's files from a peer's copy took ``seconds`` (fetch, verify, load)."""
        seconds = non_negative_number(seconds, "seconds")
        with self._lock:
            self._costs["peer_restore_seconds"].append(seconds)

    def record_remote_restore(self, seconds: float) -> None:
        """A restore from the remote tier (download, verification and load) took ``seconds``."""
        seconds = non_negative_number(seconds, "seconds")
        with self._lock:
            self._costs["remote_restore_seconds"].append(seconds)

    def level_listener(self, name: str) -> LevelTransfers:
        """The transfer listener of the added storage level ``name`` (``level4``, ...)."""
        return self._added.listener(name)

    def record_level_restore(self, name: str, seconds: float) -> None:
        """A restore from the level ``name`` (not the local one) took ``seconds`` (fetch, verify, load)."""
        if name in ("remote", "peer"):
            (self.record_remote_restore if name == "remote" else self.record_peer_restore)(seconds)
        else:
            self._added.record(name, "restore_seconds", non_negative_number(seconds, "seconds"))

    def record_restore(self, seconds: float, nbytes: int | None = None) -> None:
        """Restoring a checkpoint of ``nbytes`` took ``seconds``."""
        seconds = non_negative_number(seconds, "seconds")
        nbytes = optional_integer(nbytes, "nbytes")
        with self._lock:
            self._costs["restore_seconds"].append(seconds)
            if nbytes is not None:
                self._costs["restore_bytes"].append(float(nbytes))

    def record_restart(self, seconds: float) -> None:
        """A restart cost ``seconds`` of wall time: from the process's start to its first step after
        a restore (interpreter, imports, data and model set-up, restore). Kept across restarts."""
        seconds = non_negative_number(seconds, "seconds")
        with self._lock:
            self._costs["restart_seconds"].append(seconds)

    def set_startup_seconds(self, seconds: float) -> None:
        """This process took ``seconds`` from its start to the caller's set-up (interpreter, imports,
        data, model): with the restore estimate, the restart cost's prior until one is measured."""
        value = non_negative_number(seconds, "seconds")
        with self._lock:
            self._startup_seconds = value

    def set_state_bytes(self, nbytes: int) -> None:
        """Bytes of one checkpoint's state: with the probe, gives the priors before any checkpoint."""
        value = integer(nbytes, "nbytes")
        with self._lock:
            self._state_bytes = value

    def probe(
        self,
        directory: str | os.PathLike[str],
        nbytes: int | None = None,
        *,
        device: str | torch.device = "cpu",
        force: bool = False,
    ) -> Bandwidth:
        """One-time host-copy and write+fsync bandwidth probe (see ``coci.profiler.probe``).

        ``nbytes`` defaults to the state size; it also sets the state size when none was set. A second
        call returns the first result unless ``force``.
        """
        self.wait_for_probe()
        if self._bandwidth is not None and not force:
            return self._bandwidth
        if nbytes is None:
            if self._state_bytes is None:
                raise ValueError("nbytes must be given when set_state_bytes was not called")
            nbytes = self._state_bytes
        result = probe_bandwidth(directory, nbytes, device=device)
        with self._lock:
            self._bandwidth = result
            if self._state_bytes is None:
                self._state_bytes = int(nbytes)
        return result

    def probe_in_background(
        self,
        directory: str | os.PathLike[str],
        nbytes: int | None = None,
        *,
        device: str | torch.device = "cpu",
        on_done: Callable[[], None] | None = None,
    ) -> bool:
        """Start the one-time probe (``probe``) on a background thread, so that nobody waits
        for it unless they need its result: ``profile`` and ``probe`` wait for it to
        finish (the planner's first look at the profile comes ``PLAN_WARMUP_STEPS`` steps later).
        Its result never replaces a bandwidth known by then (restored or set). A probe that fails
        is logged and leaves the priors to the planner's assumptions until a checkpoint is measured.
        ``on_done`` runs on the probe's thread once its result is in. False (nothing started) when a
        bandwidth is known or a probe was already started."""
        with self._lock:
            if self._bandwidth is not None or self._probe_thread is not None:
                return False
            size = self._state_bytes if nbytes is None else integer(nbytes, "nbytes")
            if size is None:
                raise ValueError("nbytes must be given when set_state_bytes was not called")
            thread = threading.Thread(target=self._probe_now, args=(directory, size, device, on_done), name="coci-probe", daemon=True)
            self._probe_thread = thread
        thread.start()
        return True

    def _probe_now(self, directory: str | os.PathLike[str], nbytes: int, device: str | torch.device, on_done: Callable[[], None] | None) -> None:
        try:
            result = probe_bandwidth(directory, nbytes, device=device)
        except (OSError, RuntimeError) as exc:
            logger.warning("coci: the bandwidth probe failed (%s): cost priors are assumed until a checkpoint is measured", exc)
            return
        with self._lock:
            if self._bandwidth is None:
                self._bandwidth = result
        if on_done is not None:
            on_done()

    def wait_for_probe(self) -> None:
        """Wait for a background probe still running (never from the probe's own thread)."""
        thread = self._probe_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def set_bandwidth(self, bandwidth: Bandwidth) -> None:
        """Use a known bandwidth (e.g. from an earlier probe) instead of probing."""
        if not isinstance(bandwidth, Bandwidth):
            raise ValueError(f"bandwidth must be a profiler.Bandwidth, got {type(bandwidth).__name__}")
        with self._lock:
            self._bandwidth = bandwidth

    # ------------------------------------------------------------------ reading
    @property
    def steps(self) -> int:
        """Completed training steps (restored ones included)."""
        return self._steps

    @steps.setter
    def steps(self, value: int) -> None:
        self._steps = integer(value, "steps")

    @property
    def persist_in_flight(self) -> bool:
        """True between ``persist_started`` and ``persist_finished``/``persist_aborted``."""
        return self._persists.count > 0

    @property
    def loss_trace(self) -> LossTrace:
        """The underlying ``LossTrace`` (for sizes and the full-resolution recent window)."""
        return self._trace

    def loss_curve(self, max_points: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, losses)``: the smoothed, log-spaced loss series for the curve fitter."""
        return self._trace.curve(max_points)

    def recent_losses(self) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, losses)``: the most recent finite losses at full resolution."""
        return self._trace.recent()

    @property
    def profile(self) -> Profile:
        """The live [``Profile``][coci.profiler.profile.Profile] (O(window) to build: read it every few hundred steps, not every step).

        Never synchronises with a device: loss tensors still pending (at most
        ``knobs.LOSS_TENSOR_BATCH``) are counted in ``loss_points``/``dropped_losses`` once
        materialised. Waits for a background probe still running (``probe_in_background``).
        """
        self.wait_for_probe()
        with self._lock:
            step, source = self._step_estimate()
            overlapped = robust_estimate(recent_regime(list(self._overlapped)))
            uploading = robust_estimate(recent_regime(list(self._upload_steps)))
            copying = robust_estimate(recent_regime(list(self._peer_steps)))
            stall_steps = robust_estimate(list(self._stall_steps))
            stall_adjusted = robust_estimate(recent_regime(list(self._stall_adjusted)))
            costs = {name: robust_estimate(list(series)) for name, series in self._costs.items()}
            state_bytes = self._state_bytes
            bandwidth = self._bandwidth
            startup = self._startup_seconds
        copy_rate = None if bandwidth is None else bandwidth.copy_bytes_per_second
        write_rate = None if bandwidth is None else bandwidth.write_bytes_per_second
        # Before any restore: the write bandwidth as a (pessimistic) stand-in for reading.
        restore = _measured_or(costs["restore_seconds"], _divide(state_bytes, write_rate))
        return Profile(
            steps=self._steps,
            state_bytes=state_bytes,
            step_seconds=step,
            step_seconds_source=source,
            overlapped_step_seconds=overlapped,
            stall_step_seconds=stall_steps,
            stall_adjusted_step_seconds=stall_adjusted,
            stall_seconds=_measured_or(costs["stall_seconds"], _divide(state_bytes, copy_rate)),
            stall_bytes=_measured_or(costs["stall_bytes"], state_bytes),
            persist_seconds=_measured_or(costs["persist_seconds"], _divide(state_bytes, write_rate)),
            persist_bytes=_measured_or(costs["persist_bytes"], state_bytes),
            interference=ratio_estimate(overlapped, step) if source != "overlapped" else Estimate(),
            restore_seconds=restore,
            restore_bytes=_measured_or(costs["restore_bytes"], state_bytes),
            restart_seconds=_measured_or(costs["restart_seconds"], _restart_prior(startup, restore)),
            bandwidth=bandwidth,
            levels=_measured_levels(costs, {
                "remote": ratio_estimate(uploading, step) if source != "overlapped" else Estimate(),
                "peer": ratio_estimate(copying, step) if source != "overlapped" else Estimate(),
            }) + self._added.estimates(),
            loss_points=self._trace.points,
            dropped_losses=self._trace.dropped,
        )

    def _step_estimate(self) -> tuple[Estimate, str]:
        """The training step time and where it came from ("clean", "stall-adjusted", "overlapped").

        Clean steps while they are current; once ``_STALE_CLEAN_STEPS`` timed steps in a row
        held a stall or overlapped a persist (a job that checkpoints every step), the stall-adjusted
        steps since then; overlapped steps only when nothing else was measured. Each series is cut
        back to its recent regime first (``coci.profiler.stats.recent_regime``), so drift is followed.
        Called under the lock.
        """
        clean, adjusted = list(self._clean), list(self._stall_adjusted)
        if clean and (self._since_clean < _STALE_CLEAN_STEPS or not adjusted):
            return robust_estimate(recent_regime(clean)), "clean"
        if adjusted:
            since = adjusted[-min(self._since_clean, len(adjusted)) :] if clean else adjusted
            return robust_estimate(recent_regime(since)), "stall-adjusted"
        overlapped = robust_estimate(recent_regime(list(self._overlapped)))
        return overlapped, "overlapped" if overlapped.measured else "none"

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Every estimate's samples, the probe result and the loss trace (JSON-like values and numpy
        arrays only), so a resumed job does not re-profile from zero. Flushes pending losses."""
        trace = self._trace.state_dict()
        with self._lock:
            state: dict[str, Any] = {
                "format": STATE_FORMAT,
                "steps": int(self._steps),
                "state_bytes": self._state_bytes,
                "bandwidth": None if self._bandwidth is None else self._bandwidth.model_dump(mode="json"),
                "clean_step_seconds": np.asarray(self._clean, dtype=np.float64),
                "overlapped_step_seconds": np.asarray(self._overlapped, dtype=np.float64),
                "stall_step_seconds": np.asarray(self._stall_steps, dtype=np.float64),
                "stall_adjusted_step_seconds": np.asarray(self._stall_adjusted, dtype=np.float64),
                "upload_step_seconds": np.asarray(self._upload_steps, dtype=np.float64),
                "peer_step_seconds": np.asarray(self._peer_steps, dtype=np.float64),
                "steps_since_clean": int(self._since_clean),
            }
            for name, series in self._costs.items():
                state[name] = np.asarray(series, dtype=np.float64)
        state["loss_trace"] = trace
        added = self._added.state_dict()
        if added:  # only a session with added levels saves their samples (older readers never see the key)
            state["added_levels"] = added
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved. Warm-up starts again and no interval is open."""
        if not isinstance(state, dict):
            raise ValueError(f"profiler state must be a dict, got {type(state).__name__}")
        version = state.get("format")
        if version != STATE_FORMAT:
            raise ValueError(f"profiler state format must be {STATE_FORMAT}, got {version!r}")
        try:
            steps = integer(int(state["steps"]), "steps")
            state_bytes = optional_integer(state["state_bytes"], "state_bytes")
            bandwidth = None if state["bandwidth"] is None else Bandwidth.model_validate(state["bandwidth"])
            series = {
                name: _float_array(state[name] if name not in _OPTIONAL_SERIES else state.get(name, ()), name)
                for name in _STEP_SERIES + _COST_SERIES
            }
            since_clean = integer(int(state.get("steps_since_clean", 0)), "steps_since_clean")
            trace_state = state["loss_trace"]
        except KeyError as exc:
            raise ValueError(f"profiler state is missing the field {exc.args[0]!r}") from exc
        self._trace.load_state_dict(trace_state)
        self._added.load_state_dict(state.get("added_levels", {}))  # absent before levels could be added
        with self._lock:
            self._steps = steps
            self._process_steps = 0
            self._last_time = None
            self._interval_stall = False
            self._open_interval()
            self._state_bytes = state_bytes
            self._bandwidth = bandwidth
            self._since_clean = since_clean
            self._interval_stall_seconds = 0.0
            step_series = (self._clean, self._overlapped, self._stall_steps, self._stall_adjusted, self._upload_steps, self._peer_steps)
            for target, name in zip(step_series, _STEP_SERIES):
                target.clear()
                target.extend(series[name].tolist())
            for name in _COST_SERIES:
                self._costs[name].clear()
                self._costs[name].extend(series[name].tolist())


def _measured_or(measured: Estimate, fallback: float | int | None) -> Estimate:
    return measured if measured.measured else prior(None if fallback is None else float(fallback))


def _restart_prior(startup: float | None, restore: Estimate) -> float | None:
    """No restart measured yet: this process's start-up plus a restore."""
    return None if startup is None else startup + (restore.value or 0.0)


def _divide(nbytes: int | None, rate: float | None) -> float | None:
    if nbytes is None or rate is None or rate <= 0.0:
        return None
    return nbytes / rate


def _float_array(value: Any, field: str) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"profiler state field {field!r} holds NaN or infinite samples")
    return array


def _measured_levels(costs: dict[str, Estimate], interference: dict[str, Estimate]) -> tuple[LevelEstimates, ...]:
    """The levels above the local one that measured something, from the cost series named as
    ``FLAT_LEVEL_FIELDS`` names them (the state dict's series keep those names)."""
    levels = []
    for name, fields in FLAT_LEVEL_FIELDS.items():
        level = LevelEstimates(
            name=name, seconds=costs[fields["seconds"]], bytes=costs[fields["bytes"]],
            interference=interference[name], restore_seconds=costs[fields["restore_seconds"]],
        )
        if any(estimate.count > 0 or estimate.known for estimate in (level.seconds, level.bytes, level.interference, level.restore_seconds)):
            levels.append(level)
    return tuple(levels)
