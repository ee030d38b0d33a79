"""One-time bandwidth micro-probe: host-copy and write+fsync speed, for cost priors before any checkpoint.

Before the first checkpoint nothing has been measured, yet the planner needs a stall and a persist
time. This probe times, once, (1) a ``copy_`` into a preallocated host tensor, the operation the
snapshot performs, and (2) writing and ``fsync``-ing a small file in the run directory, what the
persist performs. ``state_bytes / bandwidth`` then gives priors (``count == 0``) that measured values
replace as checkpoints happen.
A session runs it on a background thread from its first ``step()``
(``coci.profiler.Profiler.probe_in_background``), not inside ``Session(...)``.

The probe measures physical time with ``time.perf_counter``, not the profiler's injectable clock
(a fake clock would make every bandwidth infinite). Buffers are clamped to
``[_PROBE_MIN_BYTES, _PROBE_COPY_MAX_BYTES]`` / ``_PROBE_WRITE_MAX_BYTES``, so the probe
takes milliseconds; small writes are dominated by fsync latency, which makes the write prior
pessimistic rather than optimistic.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

import torch

from .checks import integer
from .profile import Bandwidth

logger = logging.getLogger(__name__)

#: Smallest buffer the probe copies and writes (below it, call overhead dominates the timing).
_PROBE_MIN_BYTES: int = 1 << 20

#: Largest buffer the host-copy probe allocates (twice: source and destination).
_PROBE_COPY_MAX_BYTES: int = 64 << 20

#: Largest file the write probe writes and fsyncs.
_PROBE_WRITE_MAX_BYTES: int = 16 << 20

#: Timed repetitions of the host copy (the fastest one is kept; the first untimed copy faults the
#: pages in).
_PROBE_COPY_REPEATS: int = 3


def probe_bandwidth(directory: str | os.PathLike[str], nbytes: int, *, device: str | torch.device = "cpu") -> Bandwidth:
    """Measure host-copy and write+fsync bandwidth for a state of ``nbytes`` bytes.

    ``device`` is where the source of the copy lives (the state's device); the destination is pinned
    host memory when the source is on CUDA. ``directory`` is created if missing; the probe file is
    removed afterwards.
    """
    nbytes = integer(nbytes, "nbytes")
    copy_bytes = min(max(nbytes, _PROBE_MIN_BYTES), _PROBE_COPY_MAX_BYTES)
    write_bytes = min(max(nbytes, _PROBE_MIN_BYTES), _PROBE_WRITE_MAX_BYTES)
    copy_seconds = _time_copy(copy_bytes, torch.device(device))
    write_seconds = _time_write(Path(directory), write_bytes)
    result = Bandwidth(
        copy_bytes_per_second=copy_bytes / max(copy_seconds, 1e-9),
        write_bytes_per_second=write_bytes / max(write_seconds, 1e-9),
        copy_bytes=copy_bytes,
        write_bytes=write_bytes,
    )
    logger.info(
        "probe: host copy %.0f MB/s (%d bytes), write+fsync %.0f MB/s (%d bytes)",
        result.copy_bytes_per_second / 1e6,
        copy_bytes,
        result.write_bytes_per_second / 1e6,
        write_bytes,
    )
    return result


def _time_copy(nbytes: int, device: torch.device) -> float:
    """Fastest of ``_PROBE_COPY_REPEATS`` copies of ``nbytes`` into a preallocated host buffer."""
    source = torch.ones(nbytes, dtype=torch.uint8, device=device)
    destination = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    destination.copy_(source)  # fault the pages in, untimed
    best = float("inf")
    for _ in range(max(_PROBE_COPY_REPEATS, 1)):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        destination.copy_(source)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def _time_write(directory: Path, nbytes: int) -> float:
    """Seconds to write ``nbytes`` to a new file in ``directory`` and fsync it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".profiler-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    payload = os.urandom(min(nbytes, 1 << 20))
    try:
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)  # a fresh file, never a planted one
        try:
            remaining = nbytes
            while remaining > 0:
                chunk = payload[: min(remaining, len(payload))]
                remaining -= os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        return time.perf_counter() - start
    finally:
        path.unlink(missing_ok=True)
