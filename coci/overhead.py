"""What coci itself costs a training process, counted as it happens, and when the process started.

:class:`OverheadLedger` holds the wall seconds the session spent on the training thread, by kind:
per-step work (``session.step`` minus its checkpoint and planning), planning (re-plans on the
training thread), stalls (training blocked by a snapshot), restore, and the final wait at
``close()``. The session writes the totals into every ``progress`` and ``close`` event, so a killed
process leaves its last totals behind; the report sums the last totals of every process
(``pid``) and adds what is not spent on the training thread (interference of background persists).

Start-up: :func:`process_age_seconds` reads how long ago this process started (Linux
``/proc/self/stat`` start time against ``/proc/uptime``, both in 1/100 s; ``psutil`` where
``/proc`` is absent), so the session knows, without any import-time timestamp, the time from
process start to ``Session(...)`` (interpreter, imports including coci's own, data and model set-up)
and from process start to the first step after a restore (the restart cost). The import of coci
cannot be told apart from the rest of the start-up from inside the process; the start-up is
reported whole, and ``benchmarks/overhead_accounting.py`` measures the import from outside.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

logger = logging.getLogger(__name__)


@dataclass
class OverheadLedger:
    """Seconds coci spent on the training thread of one process, by kind (see module docstring)."""

    step_work: float = 0.0
    planning: float = 0.0
    stall: float = 0.0
    restore: float = 0.0
    close_wait: float = 0.0

    def total(self) -> float:
        return self.step_work + self.planning + self.stall + self.restore + self.close_wait

    def as_event(self) -> dict[str, float]:
        """The totals as event fields (``overhead_<kind>``)."""
        return {f"overhead_{name}": round(value, 6) for name, value in asdict(self).items()}


def process_age_seconds() -> float | None:
    """Seconds since this process started, or None where the system does not say."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        return max(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)  # field 22: starttime
    except (OSError, ValueError, IndexError):
        pass
    try:
        import time

        import psutil  # type: ignore[import-untyped]

        return max(time.time() - psutil.Process().create_time(), 0.0)
    except Exception:  # psutil absent or refused: the start-up is then unknown
        logger.debug("process start time unknown", exc_info=True)
        return None
