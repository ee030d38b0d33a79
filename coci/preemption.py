"""Preemption notices: checkpoint on SIGTERM within the grace period, then stop the loop.

Schedulers warn a job before they stop it: spot instances and Kubernetes send SIGTERM and SIGKILL
after a grace period (Kubernetes: 30 s by default), SLURM sends the signal chosen with
``--signal`` some seconds before the end, ``torchrun`` forwards the SIGTERM it receives to every
worker. ``Preemption`` turns such a notice into a committed checkpoint:

1. The handler (installed by [``coci.Session``][coci.Session], main thread only; one per signal, shared by
   every listening session) only records the notice and then calls a Python handler that was
   installed before it; it never does I/O, since it runs between two bytecodes of whatever the
   training loop was doing. With no session listening it re-raises the default action.
2. At the next ``session.step()`` the session checkpoints that step (after the persist in flight,
   if any; just that one when it is of this very step), waits for its commit, promotes it to the
   remote tier whatever a two-level plan promotes and waits for that upload within the grace
   left (the event's ``promoted``: False when it did not make it), writes a
   ``preempted`` event and raises [``Preempted``][coci.Preempted]. Under ``torch.distributed`` the ranks agree
   on notices at a bounded cadence (``agreement_interval``) on coci's gloo control group, so
   every rank checkpoints the same step even when only one rank got the signal.
3. [``Preempted``][coci.Preempted] is a ``SystemExit`` with status ``knobs.PREEMPTED_EXIT_CODE`` (143 =
   128 + SIGTERM, what a process killed by SIGTERM reports): left uncaught, the process exits
   without a traceback and with a non-zero status, so ``torchrun --max-restarts N``, SLURM
   ``--requeue`` or a Kubernetes ``restartPolicy: OnFailure`` restart it, and ``session.restore()``
   resumes at the committed step. ``except Exception`` in a training loop does not swallow it.

[``PreemptionConfig``][coci.PreemptionConfig] is the session's part that chooses the signals and the grace.

The grace budget: when the profile's stall + persist estimate exceeds the grace, the session logs
a warning at start, and the ``preempted`` event and the report say the checkpoint did not fit.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from coci import knobs
from coci.distributed import DistributedContext
from coci.errors import ConfigError
from coci.events import EventLog, open_run_file
from coci.profiler import Profile
from coci.units import parse_duration

__all__ = [
    "Notice",
    "Preempted",
    "Preemption",
    "PreemptionConfig",
    "agreement_interval",
    "grace_fits",
    "last_event_time",
]

logger = logging.getLogger(__name__)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Preempted(SystemExit):
    """A preemption notice stopped the training loop after a committed checkpoint.

    ``step`` is the committed step, ``path`` its directory, ``signal`` the signal received (None
    when another rank got it), ``notice_seconds`` the time from the notice to the commit and
    ``grace_seconds`` the grace it had. ``code`` (the exit status when left uncaught) is
    ``knobs.PREEMPTED_EXIT_CODE``: non-zero, so restarting schedulers restart the job.
    """

    def __init__(
        self, step: int, path: str | None, signum: int | None, notice_seconds: float, grace_seconds: float
    ) -> None:
        super().__init__(knobs.PREEMPTED_EXIT_CODE)
        self.step = step
        self.path = path
        self.signal = signum
        self.notice_seconds = notice_seconds
        self.grace_seconds = grace_seconds

    def __str__(self) -> str:
        name = signal.Signals(self.signal).name if self.signal is not None else "a notice on another rank"
        return (
            f"preempted by {name}: checkpoint of step {self.step} committed {self.notice_seconds:.3g} s "
            f"after the notice (grace {self.grace_seconds:.3g} s)"
        )


@dataclass(frozen=True)
class Notice:
    """A received preemption signal: which one and when (``time.monotonic()``)."""

    signum: int
    monotonic: float


def grace_fits(grace_seconds: float, stall_seconds: float | None, persist_seconds: float | None) -> bool | None:
    """Does a checkpoint (stall + persist) fit in the grace? None when either estimate is unknown."""
    if stall_seconds is None or persist_seconds is None:
        return None
    return stall_seconds + persist_seconds <= grace_seconds


def agreement_interval(step_seconds: float | None, grace_seconds: float) -> int:
    """Steps until the ranks next agree on notices: about every ``knobs.PREEMPTION_AGREE_SECONDS``
    (at most a tenth of the grace), never more often than every step. One tiny all-reduce on
    coci's gloo group per interval is its whole cost."""
    seconds = min(knobs.PREEMPTION_AGREE_SECONDS, 0.1 * grace_seconds)
    if step_seconds is None or not step_seconds > 0 or not math.isfinite(step_seconds):
        return 1
    return max(1, int(seconds / step_seconds))


def last_event_time(events_path: Path, tail_bytes: int = 1 << 16) -> float | None:
    """Unix time of the last complete event in ``events_path`` (the end of the previous process
    in this run directory), read from the file's tail; None without one."""
    try:
        with open_run_file(events_path) as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - tail_bytes))
            lines = handle.read().splitlines()
    except (OSError, ConfigError):  # none, or a link or FIFO planted in its place
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line).get("time")
        except (ValueError, AttributeError, RecursionError):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def catchable_signals(signals: Iterable[Any]) -> tuple[signal.Signals, ...]:
    """``signals`` as signal numbers that can be caught; ConfigError naming ``preemption_signals``."""
    try:
        checked = tuple(signal.Signals(s) for s in signals)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"preemption_signals must be signal numbers such as signal.SIGTERM: {exc}") from None
    if signal.SIGKILL in checked or signal.SIGSTOP in checked:
        raise ConfigError("preemption_signals cannot include SIGKILL or SIGSTOP (they cannot be caught)")
    faults = [s.name for s in checked if s in _FAULT_SIGNALS]
    if faults:
        raise ConfigError(
            f"preemption_signals cannot include {', '.join(faults)}: a synchronous fault (a crash), not a notice; "
            "caught as one, the crashing instruction runs again and the process hangs"
        )
    return checked


#: Signals the kernel raises for a fault of the running code: never a preemption notice.
_FAULT_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGTRAP})


@dataclass(frozen=True)
class PreemptionConfig:
    """What counts as a preemption notice, and how long the scheduler waits before the kill."""

    signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)
    """Signals that count as a notice (the next ``step()`` checkpoints and raises ``coci.Preempted``); ``()`` turns it off."""

    grace: float = 30.0
    """Seconds from the notice to the kill (a duration such as ``"30s"`` is accepted)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "signals", catchable_signals(self.signals))
        object.__setattr__(self, "grace", parse_duration(self.grace, field="grace", positive=True))


class Preemption:
    """The notice handler and the agreement cadence of one session.

    ``signals``: the signals that count as a notice (an empty tuple turns the feature off);
    ``grace``: seconds between the notice and the kill (a duration such as ``"30s"``).
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM,), grace: str | float = "30s") -> None:
        self.signals = catchable_signals(signals)
        self.grace_seconds = parse_duration(grace, field="grace", positive=True)
        self.notice: Notice | None = None
        self._installed = False
        self._next_agreement = 1
        self._last_agreement: tuple[int, float] | None = None
        #: Under torch.distributed: the collective of ``due`` (see ``agree_on_notice``).
        self.agree: Callable[[int, int], tuple[int, int]] | None = None
        self.agreed_signum: int | None = None  # the signal of the notice the ranks agreed on (any rank's)
        #: Unix time of the last event of the previous process in this run directory, if any.
        self.previous_end: float | None = None

    # -- the handler ---------------------------------------------------------------------------

    def check_grace(self, profile: Profile) -> None:
        """While the handler is installed: warn when ``profile``'s estimates exceed the grace (``warn_if_grace_too_short``)."""
        if self.installed:
            warn_if_grace_too_short(self, profile)

    def install(self) -> bool:
        """Listen for each signal; False (and a warning) outside the main thread, where Python
        cannot install signal handlers."""
        if not self.signals:
            return False
        if threading.current_thread() is not threading.main_thread():
            logger.warning("coci: preemption signals not handled: the Session was built outside the main thread")
            return False
        for signum in self.signals:
            _Dispatcher.for_signal(signum).listeners.add(self)
        self._installed = True
        return True

    @property
    def installed(self) -> bool:
        """True while the signals are listened for."""
        return self._installed

    def uninstall(self) -> None:
        """Stop listening; the last listener puts back the handler found before (main thread only)."""
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._installed = False
        for signum in self.signals:
            dispatcher = _DISPATCHERS.get(signum)
            if dispatcher is not None:
                dispatcher.listeners.discard(self)
                dispatcher.release_if_idle()

    def record(self, signum: int) -> None:
        """Remember the first notice (called from the signal handler: no I/O, no locks)."""
        if self.notice is None:
            self.notice = Notice(signum, time.monotonic())

    # -- at each step ----------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Stop at this step? One process: when a notice arrived. Under ``torch.distributed``
        (collective, at agreement steps only, the same on every rank): when any rank has one.
        ``agree(local notice, proposed interval)`` returns (any notice, the interval every rank
        uses next)."""
        if self.agree is None:
            return self.notice is not None
        if step < self._next_agreement:
            return False
        measured = self._measured_step_seconds(step)
        signum, interval = self.agree(self.signum or 0, agreement_interval(measured, self.grace_seconds))
        self._next_agreement = step + max(1, interval)
        self.agreed_signum = signum or None
        return signum > 0

    def _measured_step_seconds(self, step: int) -> float | None:
        now = time.monotonic()
        last, self._last_agreement = self._last_agreement, (step, now)
        if last is None or step <= last[0]:
            return None
        return (now - last[1]) / (step - last[0])

    def restart_seconds(self, load_seconds: float) -> float:
        """Downtime of the restart (the report's figure): from the previous process's last event (its ``preempted`` event
        after a notice) to the end of this restore; the load time alone without a previous event."""
        if self.previous_end is None:
            return load_seconds
        return max(load_seconds, time.time() - self.previous_end)

    @property
    def signum(self) -> int | None:
        """The signal of this process's notice (None: none, or the notice came from another rank)."""
        return None if self.notice is None else self.notice.signum

    def seconds_since_notice(self) -> float:
        """Seconds since this process's notice (0 when the notice came from another rank)."""
        return 0.0 if self.notice is None else time.monotonic() - self.notice.monotonic


class _Dispatcher:
    """The one handler coci installs for a signal, shared by every listening session.

    It records the notice in each live ``Preemption`` (weakly held: a session dropped without
    ``close()`` stops listening), then calls the Python handler that was installed before it, if
    any. With no live listener it acts as the handler before it would: the default action (for
    SIGTERM: the process ends) is re-raised, so a forgotten session never swallows a SIGTERM.
    """

    def __init__(self, signum: int, previous: Handler) -> None:
        self.signum = signum
        self.previous = previous
        self.listeners: weakref.WeakSet[Preemption] = weakref.WeakSet()

    @classmethod
    def for_signal(cls, signum: int) -> _Dispatcher:
        """The dispatcher installed for ``signum``, installing one when another handler is in place."""
        current = _DISPATCHERS.get(signum)
        if current is not None and _installed(signum, current):
            return current
        dispatcher = cls(signum, signal.getsignal(signum))
        signal.signal(signum, dispatcher)
        _DISPATCHERS[signum] = dispatcher
        return dispatcher

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        listeners = list(self.listeners)
        for listener in listeners:
            listener.record(signum)
        if callable(self.previous):
            self.previous(signum, frame)
        elif not listeners and self.previous in (signal.SIG_DFL, None):
            self.release_if_idle()
            os.kill(os.getpid(), signum)  # nobody listens: the default action, as if coci were absent

    def release_if_idle(self) -> None:
        """Put back the previous handler once no session listens (when this one is still installed)."""
        if len(self.listeners) == 0 and _installed(self.signum, self):
            signal.signal(self.signum, self.previous if self.previous is not None else signal.SIG_DFL)
            _DISPATCHERS.pop(self.signum, None)


def _installed(signum: int, handler: object) -> bool:
    """Is ``handler`` the handler of ``signum`` now?"""
    return signal.getsignal(signum) is handler


#: The dispatcher coci installed per signal number (main thread only).
_DISPATCHERS: dict[int, _Dispatcher] = {}


def agree_on_notice(context: DistributedContext) -> Callable[[int, int], tuple[int, int]]:
    """The collective of ``Preemption.due`` on coci's gloo control group: one all-reduce
    (MAX) of ``[signal number or 0, -interval]``: any rank's notice counts (with its signal, so a
    rank without one records it too), the shortest interval wins."""
    import torch
    import torch.distributed as dist

    def agree(signum: int, interval: int) -> tuple[int, int]:
        values = torch.tensor([int(signum), -int(interval)], dtype=torch.int64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=context.control_group)
        return int(values[0]), int(-values[1])

    return agree


def record_stop(
    events: EventLog, preemption: Preemption, step: int, path: str | None, profile: Profile, seconds: float, promoted: bool | None
) -> Preempted:
    """Write the ``preempted`` event of a stop at ``step`` whose checkpoint committed at ``path``
    ``seconds`` after the notice (``promoted``: whether it reached the remote tier within the grace;
    None without one), and
    return the [``Preempted``][coci.Preempted] to raise (the session runs the sequence: checkpoint, wait,
    promote, this, close)."""
    signum = preemption.signum
    agreed = signum if signum is not None else preemption.agreed_signum  # another rank's notice: its signal
    estimate = _estimate(profile.stall_seconds.value, profile.persist_seconds.value)
    fits = grace_fits(preemption.grace_seconds, profile.stall_seconds.value, profile.persist_seconds.value)
    events.emit(
        "preempted",
        step=step,
        signal=signal.Signals(agreed).name if agreed is not None else None,
        notice_here=signum is not None,
        notice_seconds=seconds,
        grace_seconds=preemption.grace_seconds,
        estimate_seconds=estimate,
        fits=fits,
        within_grace=seconds <= preemption.grace_seconds,
        path=path,
        promoted=promoted,
        promoted_seconds=preemption.seconds_since_notice() if promoted else None,
    )
    if promoted is False:
        logger.warning("coci: the preemption checkpoint of step %d was not in the remote tier within the grace", step)
    if seconds > preemption.grace_seconds:
        logger.warning("coci: the preemption checkpoint took %.3g s, longer than the %.3g s grace", seconds, preemption.grace_seconds)
    return Preempted(step, path, signum, seconds, preemption.grace_seconds)


def _estimate(stall: float | None, persist: float | None) -> float | None:
    return None if stall is None or persist is None else stall + persist


def warn_if_grace_too_short(preemption: Preemption, profile: Profile) -> bool | None:
    """Log a warning when the profile's stall + persist estimate exceeds the grace; the verdict."""
    stall, persist = profile.stall_seconds.value, profile.persist_seconds.value
    fits = grace_fits(preemption.grace_seconds, stall, persist)
    if fits is False and stall is not None and persist is not None:  # False: both estimates are known
        logger.warning(
            "coci: a checkpoint is estimated to take %.3g s (stall %.3g s + persist %.3g s), more than the "
            "%.3g s preemption grace: a checkpoint taken on a notice may not commit before the kill",
            stall + persist, stall, persist, preemption.grace_seconds,
        )
    return fits


def start(
    profile: Profile, context: DistributedContext | None, signals: Iterable[int], grace: str | float, previous_end: float | None
) -> Preemption:
    """Build and install a session's ``Preemption``, warn when the grace looks too short for
    ``profile``'s estimates, and under ``torch.distributed`` (``context``) wire the agreement on
    coci's gloo group."""
    preemption = Preemption(signals, grace)
    preemption.previous_end = previous_end
    if preemption.install():
        warn_if_grace_too_short(preemption, profile)
    if context is not None:
        preemption.agree = agree_on_notice(context)
        warn_if_restarts_share_the_store(os.environ)
    return preemption


def warn_if_restarts_share_the_store(environ: Any) -> bool:
    """Under ``torchrun --max-restarts N`` (N > 0), warn unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``:
    restarted workers otherwise share the agent's rendezvous store with the previous attempt and
    read its stale gloo addresses, so ``init_process_group`` fails after a restart
    (pytorch/pytorch#135712, seen with torch 2.13). True when it warned."""
    try:
        restarts = int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    except ValueError:
        return False
    if restarts <= 0 or environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1":
        return False
    logger.warning(
        "coci: torchrun --max-restarts %d: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun, or restarted "
        "workers may fail to connect (stale addresses in the shared rendezvous store)", restarts,
    )
    return True
